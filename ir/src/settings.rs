//! Every `KILN_*` environment variable the library reads, in one place: its name, what it
//! does, and the functions that read it. (Test and benchmark switches such as
//! `KILN_REQUIRE_GPU` belong to the test harness, not the library; see TESTING.md.)
//!
//! A new setting is a new variant: [`Setting::name`] and [`Setting::doc`] are exhaustive
//! matches, and a test checks that no library source names a `KILN_` variable elsewhere.
//!
//! ```
//! use kiln_ir::settings::Setting;
//! assert_eq!(Setting::Check.name(), "KILN_CHECK");
//! // Unset (or empty, or `0`): off.
//! assert!(!Setting::Disasm.on() || std::env::var_os("KILN_DISASM").is_some());
//! ```

use std::path::PathBuf;

/// A `KILN_*` environment variable the library reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setting {
    /// `KILN_CHECK`: compare every kernel with the reference executor.
    Check,
    /// `KILN_DEBUG`: step lines, kernel sources and planning stages on standard error.
    Debug,
    /// `KILN_DISASM`: each compiled CPU kernel's machine code on standard error.
    Disasm,
    /// `KILN_KERNEL_CACHE`: the kernel caches' bounds.
    KernelCache,
    /// `KILN_CUDA_CACHE`: a directory for compiled CUDA kernels.
    CudaCache,
    /// `KILN_NO_BF16_DOT`: bf16 products widen to f32 instead of using AVX512-BF16 dot
    /// products.
    NoBf16Dot,
    /// `KILN_CUDA_ROW_THREADS`: most threads per block of a GPU row group's kernel.
    CudaRowThreads,
    /// `KILN_CUDA_ROW_BLOCKS`: most blocks per multiprocessor of a GPU row group's launch.
    CudaRowBlocks,
    /// `KILN_CUDA_ROW_CACHE`: registers per thread a GPU row group may keep rows in.
    CudaRowCache,
    /// `KILN_CUDA_GRAPHS`: whether `compile()`d plans on a GPU replay as CUDA graphs.
    CudaGraphs,
    /// `KILN_SIZES`: when kernels are compiled size-generic.
    Sizes,
}

impl Setting {
    /// Every setting, in the order the documentation lists them.
    pub const ALL: [Setting; 11] = [
        Setting::Check,
        Setting::Debug,
        Setting::Disasm,
        Setting::KernelCache,
        Setting::CudaCache,
        Setting::NoBf16Dot,
        Setting::CudaRowThreads,
        Setting::CudaRowBlocks,
        Setting::CudaRowCache,
        Setting::CudaGraphs,
        Setting::Sizes,
    ];

    /// The environment variable.
    pub fn name(self) -> &'static str {
        match self {
            Setting::Check => "KILN_CHECK",
            Setting::Debug => "KILN_DEBUG",
            Setting::Disasm => "KILN_DISASM",
            Setting::KernelCache => "KILN_KERNEL_CACHE",
            Setting::CudaCache => "KILN_CUDA_CACHE",
            Setting::NoBf16Dot => "KILN_NO_BF16_DOT",
            Setting::CudaRowThreads => "KILN_CUDA_ROW_THREADS",
            Setting::CudaRowBlocks => "KILN_CUDA_ROW_BLOCKS",
            Setting::CudaRowCache => "KILN_CUDA_ROW_CACHE",
            Setting::CudaGraphs => "KILN_CUDA_GRAPHS",
            Setting::Sizes => "KILN_SIZES",
        }
    }

    /// What it does and what it takes.
    pub fn doc(self) -> &'static str {
        match self {
            Setting::Check => {
                "1: every kernel's result is compared with the reference executor's (the \
                 correctness oracle; slow)"
            }
            Setting::Debug => {
                "1: a line per executed step; 2: also each new kernel's source; `passes`: \
                 each planning stage's graph (combines: `1,passes`)"
            }
            Setting::Disasm => "1: each compiled CPU kernel's machine code",
            Setting::KernelCache => {
                "N or N,BYTES (e.g. 4096,256M): entries and bytes of code each kernel cache \
                 keeps (least recently used evicted)"
            }
            Setting::CudaCache => {
                "a directory: compiled CUDA kernels are kept there across processes, keyed by \
                 the NVRTC version and architecture"
            }
            Setting::NoBf16Dot => {
                "1: bf16 matrix products widen to f32 for `gemm` instead of using AVX512-BF16 \
                 dot products"
            }
            Setting::CudaRowThreads => {
                "N (32 to 1024, default 512): most threads per block of a GPU row group's kernel"
            }
            Setting::CudaRowBlocks => {
                "N (default 32): most blocks per multiprocessor of a GPU row group's launch"
            }
            Setting::CudaRowCache => {
                "N (default 32, 0 for none): registers per thread a GPU row group's kernel may \
                 keep the rows its members share in"
            }
            Setting::CudaGraphs => {
                "0: `compile()`d plans on a GPU launch their kernels one by one instead of \
                 replaying a captured CUDA graph (on by default)"
            }
            Setting::Sizes => {
                "`auto` (default): a kernel (CPU or CUDA) is compiled for its sizes, and once more, \
                 size-generic, when the same kernel comes back with other sizes (that one then \
                 serves every size); `specialize`: every kernel for its sizes; `generic`: \
                 every kernel size-generic (to test the generic code)"
            }
        }
    }

    /// Whether the switch is on: set, not empty and not `0`.
    pub fn on(self) -> bool {
        std::env::var(self.name()).is_ok_and(|v| !v.is_empty() && v != "0")
    }

    /// The value as text, when set (and valid Unicode).
    pub fn text(self) -> Option<String> {
        std::env::var(self.name()).ok()
    }

    /// The value as a path, when set.
    pub fn path(self) -> Option<PathBuf> {
        std::env::var_os(self.name()).map(PathBuf::from)
    }

    /// The value parsed as a number, when set and well formed.
    pub fn number<T: std::str::FromStr>(self) -> Option<T> {
        self.text().and_then(|v| v.trim().parse().ok())
    }
}

#[cfg(test)]
mod tests {
    use super::Setting;

    /// The library names `KILN_` variables only here: every other read goes through
    /// [`Setting`], so this module's list is the whole list.
    #[test]
    fn no_library_source_names_a_setting_elsewhere() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut stack: Vec<std::path::PathBuf> =
            ["src", "ir/src", "codegen/src", "runtime/src"].iter().map(|d| root.join(d)).collect();
        let mut offenders = Vec::new();
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
                // Unit-test files read the harness's switches (`KILN_PTXAS`, ...).
                let harness = ["settings.rs", "testing.rs", "tests.rs"].contains(&name)
                    || path.components().any(|c| c.as_os_str() == "tests");
                if !name.ends_with(".rs") || harness {
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                if text.contains("env::var(\"KILN_") || text.contains("env::var_os(\"KILN_") {
                    offenders.push(path.display().to_string());
                }
            }
        }
        assert!(offenders.is_empty(), "read through kiln_ir::settings::Setting: {offenders:?}");
        for s in Setting::ALL {
            assert!(s.name().starts_with("KILN_") && !s.doc().is_empty());
        }
    }
}
