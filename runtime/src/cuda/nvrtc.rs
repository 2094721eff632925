//! Compiling CUDA C with NVRTC and loading the result.
//!
//! For a device whose architecture NVRTC knows, kiln compiles for the real architecture
//! (`sm_90`): NVRTC then gives a cubin (machine code for that device) as well as PTX. The
//! cubin is loaded first: it needs no JIT in the driver and loads even when NVRTC is newer
//! than the driver (whose PTX JIT rejects a newer PTX version). The PTX is the fallback.
//! For a device newer than NVRTC knows, kiln compiles PTX for the newest architecture NVRTC
//! supports below it, and the driver compiles that PTX for the device.
//!
//! With `KILN_CUDA_CACHE=DIR`, both are kept on disk, keyed by the kernel, the target, the
//! NVRTC version and the options, next to the source they came from.

use std::ffi::{CString, c_char, c_int};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use cudarc::driver::CudaModule;
use cudarc::nvrtc::{Ptx, result, sys};

use super::Gpu;
use crate::RuntimeError;

/// Why kernels cannot be compiled without NVRTC, and how to get it.
const NVRTC_MISSING: &str = "NVRTC (libnvrtc.so) was not found: it compiles kiln's CUDA kernels; \
                             install the CUDA toolkit or the nvidia-cuda-nvrtc wheel and put its \
                             lib directory on LD_LIBRARY_PATH";

/// NVRTC's version, when NVRTC is present.
fn version() -> Option<(c_int, c_int)> {
    static VERSION: OnceLock<Option<(c_int, c_int)>> = OnceLock::new();
    *VERSION.get_or_init(|| {
        // SAFETY: only looks the library up; cudarc's NVRTC calls panic when it is missing.
        if !unsafe { sys::is_culib_present() } {
            return None;
        }
        let (mut major, mut minor) = (0, 0);
        // SAFETY: NVRTC is present; writes two ints.
        let ok = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
        (ok == sys::nvrtcResult::NVRTC_SUCCESS).then_some((major, minor))
    })
}

/// The architectures NVRTC compiles for (`[75, 80, 86, 89, 90, 100, 120]` for 13.0), sorted.
fn supported_architectures() -> &'static [c_int] {
    static ARCHS: OnceLock<Vec<c_int>> = OnceLock::new();
    ARCHS.get_or_init(|| {
        let mut n: c_int = 0;
        // SAFETY: called once NVRTC is present (see `compile`); writes one int.
        if unsafe { sys::nvrtcGetNumSupportedArchs(&mut n) } != sys::nvrtcResult::NVRTC_SUCCESS {
            return Vec::new();
        }
        let mut archs = vec![0 as c_int; usize::try_from(n).unwrap_or(0)];
        // SAFETY: `archs` holds the `n` ints NVRTC writes.
        if unsafe { sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) }
            != sys::nvrtcResult::NVRTC_SUCCESS
        {
            return Vec::new();
        }
        archs.sort_unstable();
        archs
    })
}

/// What to compile for a device of compute capability `major.minor`, given the
/// architectures NVRTC supports: the device's own `sm_XY` when supported, else `compute_XY`
/// of the newest supported one below it; `None` when NVRTC knows nothing old enough.
pub(crate) fn target_for(arch: (i32, i32), supported: &[c_int]) -> Option<String> {
    let own = arch.0 * 10 + arch.1;
    if supported.is_empty() || supported.contains(&own) {
        // An NVRTC that cannot list its architectures is asked for the device's own.
        return Some(format!("sm_{own}"));
    }
    supported.iter().rev().find(|&&a| a <= own).map(|a| format!("compute_{a}"))
}

/// A compiled program: PTX, and a cubin when it was compiled for a real architecture.
struct Compiled {
    ptx: String,
    cubin: Option<Vec<u8>>,
}

/// Compiles `source` with `options`; NVRTC's log is the error.
fn compile_now(name: &str, source: &str, options: &[String]) -> Result<Compiled, String> {
    let src = CString::new(source).map_err(|e| format!("the source holds a NUL byte: {e}"))?;
    let file = CString::new(format!("{name}.cu")).map_err(|e| e.to_string())?;
    let prog = result::create_program(&src, Some(&file)).map_err(|e| format!("{e:?}"))?;
    // SAFETY: `prog` is a live program until `destroy_program` below; the options are
    // C strings NVRTC reads during the call.
    let outcome = unsafe {
        match result::compile_program(prog, options) {
            Ok(()) => {
                let ptx = result::get_ptx(prog).map_err(|e| format!("{e:?}"));
                ptx.map(|ptx| {
                    let bytes: Vec<u8> =
                        ptx.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
                    Compiled {
                        ptx: String::from_utf8_lossy(&bytes).into_owned(),
                        cubin: cubin_of(prog),
                    }
                })
            }
            Err(e) => {
                let log = result::get_program_log(prog)
                    .map(|l| {
                        let bytes: Vec<u8> =
                            l.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
                        String::from_utf8_lossy(&bytes).into_owned()
                    })
                    .unwrap_or_default();
                Err(format!("{e:?}: {log}"))
            }
        }
    };
    // SAFETY: `prog` was created above and is not used after this.
    let _ = unsafe { result::destroy_program(prog) };
    outcome
}

/// The cubin of a compiled program, if NVRTC made one (it does for a real architecture).
///
/// # Safety
/// `prog` must be a successfully compiled, live program.
unsafe fn cubin_of(prog: sys::nvrtcProgram) -> Option<Vec<u8>> {
    let mut size = 0usize;
    // SAFETY: `prog` is live (the caller's contract); writes one usize.
    if unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) } != sys::nvrtcResult::NVRTC_SUCCESS
        || size == 0
    {
        return None;
    }
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` holds the `size` bytes NVRTC writes.
    let ok = unsafe { sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast::<c_char>()) };
    (ok == sys::nvrtcResult::NVRTC_SUCCESS).then_some(cubin)
}

/// A stable 64-bit hash (FNV-1a), for disk-cache file names.
fn fnv(text: &str) -> u64 {
    text.bytes()
        .fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// `source` compiled for `gpu` and loaded as a module: from the disk cache when it holds
/// this exact compile, else compiled now (and stored there).
/// A user-defined op's CUDA C (`source`, without kiln's prelude) compiled with NVRTC for
/// `arch` (`sm_90`) with the prelude and options kiln runs it with, no device needed: its
/// PTX, or NVRTC's log. For tests of an op's source on machines with NVRTC and no GPU.
///
/// # Errors
/// [`RuntimeError::Custom`] with NVRTC's log; [`RuntimeError::BackendUnavailable`] without
/// NVRTC.
pub fn compile_user_source(
    op: &'static str,
    source: &str,
    arch: &str,
) -> Result<String, RuntimeError> {
    let Some((major, minor)) = version() else {
        return Err(RuntimeError::BackendUnavailable {
            device: crate::Device::Cuda(0),
            reason: NVRTC_MISSING.into(),
        });
    };
    let options = kiln_codegen::cuda::nvrtc_options(arch, (major, minor) >= (12, 4));
    let source = kiln_codegen::cuda::with_prelude(source);
    compile_now(op, &source, &options).map(|compiled| compiled.ptx).map_err(|log| {
        RuntimeError::Custom { op, detail: format!("NVRTC rejected its CUDA source: {log}") }
    })
}

pub(crate) fn load(gpu: &Gpu, name: &str, source: &str) -> Result<Arc<CudaModule>, RuntimeError> {
    load_blaming(gpu, name, source, "a bug in kiln")
}

/// [`load`], with `blame` saying whose source failed to compile.
pub(crate) fn load_blaming(
    gpu: &Gpu,
    name: &str,
    source: &str,
    blame: &str,
) -> Result<Arc<CudaModule>, RuntimeError> {
    let Some((major, minor)) = version() else {
        return Err(RuntimeError::BackendUnavailable {
            device: gpu.device(),
            reason: NVRTC_MISSING.into(),
        });
    };
    let target = target_for(gpu.arch, supported_architectures()).ok_or_else(|| {
        gpu.error(
            "choosing an architecture to compile for",
            format!(
                "NVRTC {major}.{minor} supports none at or below the device's sm_{}{} ({:?})",
                gpu.arch.0,
                gpu.arch.1,
                supported_architectures()
            ),
        )
    })?;
    let options = kiln_codegen::cuda::nvrtc_options(&target, (major, minor) >= (12, 4));
    let key =
        format!("{name}_{target}_{:016x}", fnv(&format!("nvrtc {major}.{minor} {options:?}")));
    let compiled = cached(&key, source).map_or_else(
        || {
            let compiled = compile_now(name, source, &options).map_err(|log| {
                gpu.error(&format!("compiling kernel {name} with NVRTC ({blame})"), log)
            })?;
            store(&key, source, &compiled);
            Ok::<_, RuntimeError>(compiled)
        },
        Ok,
    )?;
    gpu.bind()?;
    // The cubin first; the PTX when the driver refuses it (said once per process, with the
    // driver's reason: the PTX is compiled again by the driver, at every load).
    if let Some(cubin) = compiled.cubin {
        match gpu.ctx.load_module(Ptx::from_binary(cubin)) {
            Ok(module) => return Ok(module),
            Err(e) => {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    eprintln!(
                        "kiln: warning: the driver refused the cubin of kernel {name} for \
                         {target} ({e:?}); kernels load from their PTX instead (the driver \
                         compiles it at each load)"
                    );
                });
            }
        }
    }
    gpu.ctx
        .load_module(Ptx::from_src(compiled.ptx))
        .map_err(|e| gpu.error("loading a compiled kernel", e))
}

/// The disk cache's directory, when `KILN_CUDA_CACHE` names one.
fn cache_dir() -> Option<PathBuf> {
    kiln_ir::settings::Setting::CudaCache.path()
}

/// A compile from the disk cache: only when the stored source is `source` itself.
fn cached(key: &str, source: &str) -> Option<Compiled> {
    let dir = cache_dir()?;
    let stored = std::fs::read_to_string(dir.join(format!("{key}.cu"))).ok()?;
    if stored != source {
        return None;
    }
    let ptx = std::fs::read_to_string(dir.join(format!("{key}.ptx"))).ok()?;
    let cubin = std::fs::read(dir.join(format!("{key}.cubin"))).ok();
    Some(Compiled { ptx, cubin })
}

/// Stores a compile in the disk cache. The cache is an optimization: failing to write it
/// is not an error.
fn store(key: &str, source: &str, compiled: &Compiled) {
    let Some(dir) = cache_dir() else { return };
    let _ = std::fs::create_dir_all(&dir);
    if let Some(cubin) = &compiled.cubin {
        let _ = std::fs::write(dir.join(format!("{key}.cubin")), cubin);
    }
    // The source last: a reader trusts the other files only once it matches.
    let _ = std::fs::write(dir.join(format!("{key}.ptx")), &compiled.ptx)
        .and_then(|()| std::fs::write(dir.join(format!("{key}.cu")), source));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_is_the_device_or_the_newest_older_architecture() {
        let nvrtc13 = [75, 80, 86, 87, 89, 90, 100, 103, 110, 120, 121];
        assert_eq!(target_for((9, 0), &nvrtc13).as_deref(), Some("sm_90"));
        assert_eq!(target_for((12, 0), &nvrtc13).as_deref(), Some("sm_120"));
        // A device newer than NVRTC knows: PTX for the newest architecture below it.
        assert_eq!(target_for((13, 0), &nvrtc13).as_deref(), Some("compute_121"));
        assert_eq!(target_for((8, 8), &nvrtc13).as_deref(), Some("compute_87"));
        // Older than anything NVRTC supports: nothing to compile for.
        assert_eq!(target_for((7, 0), &nvrtc13), None);
        // An NVRTC that lists nothing is asked for the device's own.
        assert_eq!(target_for((9, 0), &[]).as_deref(), Some("sm_90"));
    }
}
