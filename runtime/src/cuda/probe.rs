//! Probing for NVIDIA GPUs through the CUDA driver, loaded at run time: kiln builds and runs
//! everywhere, and without a driver these report no device instead of failing.

use std::sync::LazyLock;

/// What the probe found, once per process.
struct Probe {
    /// Devices the driver reports (0 without a driver).
    count: usize,
    /// Why there are none, when there are none.
    why_none: Option<String>,
}

static PROBE: LazyLock<Probe> = LazyLock::new(|| {
    // SAFETY: this only looks the library up with `dlopen`; nothing in it is called. cudarc's
    // other entry points panic when the library is missing, so this check comes first.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Probe {
            count: 0,
            why_none: Some(
                "no CUDA driver was found (libcuda.so could not be loaded; it comes with the NVIDIA driver)"
                    .into(),
            ),
        };
    }
    match cudarc::driver::CudaContext::device_count() {
        Ok(n) if n > 0 => Probe { count: usize::try_from(n).unwrap_or(0), why_none: None },
        Ok(_) => Probe { count: 0, why_none: Some("the CUDA driver reports no devices".into()) },
        Err(e) => {
            Probe { count: 0, why_none: Some(format!("the CUDA driver failed to initialize: {e}")) }
        }
    }
});

/// The number of CUDA devices (0 without a driver); never fails.
pub fn device_count() -> usize {
    PROBE.count
}

/// Why [`device_count`] is 0, or `None` when there are devices.
pub fn unavailable_reason() -> Option<&'static str> {
    PROBE.why_none.as_deref()
}
