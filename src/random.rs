//! The random generator: a seed and a counter of random calls, one per thread.
//!
//! Every random op draws a fresh 64-bit key when it is recorded; its values are then a pure
//! function of the key and the element index (see `kiln_ir::random`). So a program seeded
//! with [`manual_seed`] records the same keys and gets the same numbers, however and
//! whenever its graph is computed. Each thread has its own generator (as Rust's
//! `thread_rng`), so a thread's numbers never depend on what other threads draw meanwhile;
//! a new thread starts from the default seed.

use std::cell::Cell;

use kiln_ir::random::mix64;

/// PyTorch's default seed, so that an unseeded program is deterministic too.
const DEFAULT_SEED: u64 = 67_280_421_310_721;

thread_local! {
    static GENERATOR: Cell<(u64, u64)> = const { Cell::new((DEFAULT_SEED, 0)) };
}

/// Seeds this thread's random generator: every random tensor the thread makes afterwards
/// (`rand`, `randn`, `randint`, `randperm`, the `_like` forms, dropout) follows
/// deterministically from `seed` and the order of the calls.
///
/// ```
/// use kiln::prelude::*;
/// kiln::manual_seed(42);
/// let a = Tensor::rand([3]).to_vec::<f32>();
/// kiln::manual_seed(42);
/// let b = Tensor::rand([3]).to_vec::<f32>();
/// assert_eq!(a, b);
/// ```
pub fn manual_seed(seed: u64) {
    GENERATOR.with(|g| g.set((seed, 0)));
}

/// Where this thread's generator stands: its seed and how many random ops it has keyed
/// since. Saving it and restoring it with [`set_rng_state`] replays the same random
/// numbers, as PyTorch's `get_rng_state`/`set_rng_state`; checkpoints carry it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RngState {
    /// The seed given to [`manual_seed`] (or the default seed).
    pub seed: u64,
    /// Random ops keyed since seeding.
    pub count: u64,
}

/// This thread's generator state.
///
/// ```
/// use kiln::prelude::*;
/// kiln::manual_seed(7);
/// let _ = Tensor::rand([2]);
/// let state = kiln::get_rng_state();
/// let a = Tensor::rand([3]).to_vec::<f32>();
/// kiln::set_rng_state(state);
/// assert_eq!(Tensor::rand([3]).to_vec::<f32>(), a);
/// ```
pub fn get_rng_state() -> RngState {
    let (seed, count) = GENERATOR.with(Cell::get);
    RngState { seed, count }
}

/// Restores this thread's generator to `state` (from [`get_rng_state`]).
pub fn set_rng_state(state: RngState) {
    GENERATOR.with(|g| g.set((state.seed, state.count)));
}

/// The key of the next random op.
pub(crate) fn next_key() -> u64 {
    GENERATOR.with(|g| {
        let (seed, count) = g.get();
        g.set((seed, count + 1));
        mix64(seed ^ mix64(count + 1))
    })
}

/// Fisher–Yates over the counter-based generator, keyed by `(seed, epoch)`: the same order
/// on every machine.
pub(crate) fn shuffle(order: &mut [usize], seed: u64, epoch: u64) {
    let key = mix64(seed ^ mix64(epoch));
    for i in (1..order.len()).rev() {
        let j = kiln_ir::random::int(key, i as u64, 0, i as i64 + 1) as usize;
        order.swap(i, j);
    }
}
