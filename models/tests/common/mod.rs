//! Helpers shared by kiln-models' integration tests.

/// The first CUDA device (the emulated one in CI's `emulator/run-tests`, a GPU where there is
/// one), or `None` after a visible skip of `test` (a failure under `KILN_REQUIRE_GPU=1`).
pub(crate) fn cuda_or_skip(test: &str) -> Option<kiln::Device> {
    if kiln::cuda::is_available() {
        return Some(kiln::Device::Cuda(0));
    }
    let why = kiln::cuda::unavailable_reason().unwrap_or("kiln::cuda::device_count() is 0");
    kiln_ir::testing::skip(
        test,
        &format!("there is no CUDA device ({why})"),
        &["KILN_REQUIRE_GPU"],
    );
    None
}
