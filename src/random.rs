//! The global random generator: a seed and a counter of random calls.
//!
//! Every random op draws a fresh 64-bit key when it is recorded; its values are then a pure
//! function of the key and the element index (see `kiln_ir::random`). So a program seeded
//! with [`manual_seed`] records the same keys and gets the same numbers, however and
//! whenever its graph is computed.

use std::sync::{Mutex, PoisonError};

use kiln_ir::random::mix64;

/// PyTorch's default seed, so that an unseeded program is deterministic too.
const DEFAULT_SEED: u64 = 67_280_421_310_721;

static GENERATOR: Mutex<(u64, u64)> = Mutex::new((DEFAULT_SEED, 0));

/// Seeds the random generator: every random tensor made afterwards (`rand`, `randn`,
/// `randint`, `randperm`, the `_like` forms) follows deterministically from `seed` and the
/// order of the calls.
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
    *GENERATOR.lock().unwrap_or_else(PoisonError::into_inner) = (seed, 0);
}

/// The key of the next random op.
pub(crate) fn next_key() -> u64 {
    let mut g = GENERATOR.lock().unwrap_or_else(PoisonError::into_inner);
    g.1 += 1;
    mix64(g.0 ^ mix64(g.1))
}
