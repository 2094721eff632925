//! Test support shared by the workspace's tests: the one way a test skips.

use std::io::Write;

/// Skips a test visibly, or fails it where the run requires what is missing.
///
/// Writes `skipped TEST: WHY` straight to the process's standard error, past the test
/// harness's capture, so the skip shows in the output of a run that passes. When every
/// variable in `required_by` is set to `1` (CI sets the `KILN_REQUIRE_*` variables for what
/// it provides: `KILN_REQUIRE_NVRTC`, `KILN_REQUIRE_PTXAS`, `KILN_REQUIRE_NCCL`, and
/// `KILN_REQUIRE_GPU` on the emulated device), it panics with the same words instead: a run
/// that was meant to check something must not pass by skipping it. An empty `required_by`
/// never fails (a case that does not apply here, such as a world size that does not divide
/// the data).
///
/// # Panics
/// As said, when every variable in `required_by` is `1`.
#[doc(hidden)]
#[track_caller]
pub fn skip(test: &str, why: &str, required_by: &[&str]) {
    let required = !required_by.is_empty()
        && required_by.iter().all(|v| std::env::var(v).is_ok_and(|v| v == "1"));
    assert!(!required, "{test}: {} but {why}", required_by.join("=1 and ") + "=1");
    let _ = writeln!(std::io::stderr(), "skipped {test}: {why}");
}

/// The numbers tests draw their inputs from: a linear congruential generator (Numerical
/// Recipes' constants) from `seed`, the same stream on every host and run.
fn lcg(seed: u32) -> impl Iterator<Item = u32> {
    std::iter::successors(Some(seed), |s| {
        Some(s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223))
    })
    .skip(1)
}

/// `n` values in `[-0.5, 0.5)` from `seed` ([`lcg`]'s top 24 bits).
#[doc(hidden)]
pub fn uniform(n: usize, seed: u32) -> Vec<f32> {
    lcg(seed).take(n).map(|s| (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5).collect()
}

/// `n` bytes from `seed` ([`lcg`]'s top 8 bits).
#[doc(hidden)]
pub fn bytes(n: usize, seed: u32) -> Vec<u8> {
    lcg(seed).take(n).map(|s| (s >> 24) as u8).collect()
}
