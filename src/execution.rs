//! Choosing how graphs run: fused (the default), unfused, or on the reference executor.

use std::cell::Cell;

pub use kiln_runtime::exec::Execution;

thread_local! {
    static MODE: Cell<Execution> = const { Cell::new(Execution::Fused) };
}

/// How realizations on this thread run.
pub fn execution() -> Execution {
    MODE.with(Cell::get)
}

/// Runs `f` with realizations on this thread executed in `mode`, then restores the previous
/// mode (also on panic).
///
/// ```
/// use kiln::prelude::*;
/// use kiln::Execution;
/// let x = Tensor::randn([1000]);
/// let y = (x.exp() * 2.0 + 1.0).tanh();
/// let fused = y.to_vec::<f32>();
/// let reference = kiln::with_execution(Execution::Reference, || (x.exp() * 2.0 + 1.0).tanh().to_vec::<f32>());
/// // Generated code evaluates exp and tanh with polynomials a few ULP from the reference's.
/// assert!(fused.iter().zip(&reference).all(|(a, b)| (a - b).abs() <= 1e-6 * b.abs().max(1.0)));
/// ```
pub fn with_execution<T>(mode: Execution, f: impl FnOnce() -> T) -> T {
    struct Restore(Execution);
    impl Drop for Restore {
        fn drop(&mut self) {
            MODE.with(|m| m.set(self.0));
        }
    }
    let _restore = Restore(MODE.with(|m| m.replace(mode)));
    f()
}

/// Runs `f` with fusion on or off: off runs one generated kernel per op, the unfused
/// baseline that the profiler compares against.
pub fn with_fusion<T>(fuse: bool, f: impl FnOnce() -> T) -> T {
    with_execution(if fuse { Execution::Fused } else { Execution::Unfused }, f)
}
