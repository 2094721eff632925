//! Choosing how graphs run: fused (the default), unfused, or on the reference executor.

use std::cell::Cell;

pub use kiln_runtime::exec::Execution;

thread_local! {
    static MODE: Cell<Execution> = const { Cell::new(Execution::Fused) };
    static CHECK: Cell<Option<f64>> = const { Cell::new(None) };
}

/// Whether `KILN_CHECK` is set in the environment (read once).
fn check_from_env() -> bool {
    static ENV: std::sync::LazyLock<bool> =
        std::sync::LazyLock::new(|| kiln_ir::settings::Setting::Check.on());
    *ENV
}

/// The options of a plan made now on this thread for `device` (`None` for the reference
/// executor).
pub(crate) fn plan_options(
    constants: kiln_ir::pipeline::Constants,
    device: kiln_runtime::Device,
) -> Option<kiln_ir::pipeline::PlanOptions> {
    execution().plan_options(constants, device)
}

/// The check tolerance scale in force on this thread, if checking is on.
pub(crate) fn check_scale() -> Option<f64> {
    CHECK.with(Cell::get).or_else(|| check_from_env().then_some(1.0))
}

/// Runs `f` with the correctness oracle on, as `KILN_CHECK=1` turns it on for the whole
/// process: each fused kernel's result is compared with the reference executor's evaluation
/// of the same ops on the same input buffers (with tolerances for the least precise float
/// the kernel computes with), so a difference belongs to that kernel alone and not to
/// rounding carried from earlier steps; the first kernel that differs fails the realization
/// with [`crate::RuntimeError::CheckFailed`], naming the kernel, its ops, the source lines
/// that recorded them, and its text. An output that passes a jump (a float cast to an
/// integer or `bool`, a comparison, `floor`, `ceil`, `round`) of a transcendental's result
/// is not compared: a one-ULP difference there is a legitimate jump, not a bug.
///
/// ```
/// use kiln::prelude::*;
/// let x = Tensor::randn([64]);
/// let y = kiln::with_check(|| ((&x * 2.0).exp() + 1.0).log().to_vec::<f32>());
/// assert_eq!(y.len(), 64);
/// ```
pub fn with_check<T>(f: impl FnOnce() -> T) -> T {
    with_check_scale(1.0, f)
}

/// [`with_check`] with the tolerances multiplied by `scale` (0 demands exact agreement).
pub fn with_check_scale<T>(scale: f64, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<f64>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CHECK.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(CHECK.with(|c| c.replace(Some(scale))));
    f()
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
