//! The CPU back end: a [`Kernel`](kiln_ir::kernel::Kernel) lowered to Cranelift IR and compiled to machine code.
//!
//! The generated function has the signature
//! `extern "C" fn(bufs: *const *mut u8, params: *const u64, start: u64, end: u64)` and computes
//! the flat output positions `start..end` of the kernel's domain, so the runtime can split a
//! kernel across threads. `bufs` holds the input pointers, then the output pointers.
//!
//! The domain is first *coalesced*: dimensions of size 1 are dropped and neighbours that every
//! input walks contiguously are merged, so that a dense tensor is one long row. Each row
//! computes its inputs' base addresses once (a division per row, not per element), then runs
//! an inner loop: four `f32` (or two `f64`) lanes at a time when every value of the kernel is
//! of one float type and every input is contiguous or broadcast along the row, followed by a
//! scalar tail (and the scalar loop alone otherwise).
//!
//! Values compute in registers of their dtype's width: `f32` and `f64` as such, `f16` and
//! `bf16` as `f32` rounded back after every op (so results equal the reference executor's;
//! they share f32x4 vectors with `f32` values, converted and rounded by integer vector
//! operations in `half.rs`),
//! integers as `i64` wrapped to their width after every op, bools as `i8`. `exp`, `log`,
//! `tanh`, `sigmoid`, `erf`, `sin`, `cos` and `pow` are inline vector polynomials with tested
//! error bounds (`math.rs`), and a scalar tail computes them as one lane of the same
//! polynomials; only `sin`/`cos` beyond `2^23` and `pow`'s IEEE special cases send their lanes
//! to the f64 functions of [`kiln_ir::semantics`] (`helpers.rs`), on a cold path. On hosts
//! with AVX2 and FMA, `exp`, `tanh` and `sigmoid` of long f32 rows are staged instead: a
//! block at a time, by the same polynomials compiled for 8 or 16 lanes (`staging.rs`,
//! `wide.rs`), bit for bit the inline values.
//!
//! The modules follow the pipeline of one compile: `jit` (the driver: a JIT module per
//! kernel, the host ISA detected once), `strategy` (which loop a kernel gets),
//! `translate` (the function being built and the lowering of each op), then the loops:
//! `elementwise`, `rows` (row reductions), `logsumexp` (one-pass log-sum-exp rows) and
//! `columns` (reductions across outputs).

mod columns;
mod elementwise;
mod generic;
mod half;
mod helpers;
mod jit;
mod logsumexp;
mod math;
mod rows;
mod sizes;
mod staging;
mod strategy;
mod translate;
mod wide;

pub use generic::form;
pub use jit::{
    CpuFeatures, CpuKernel, TARGET, clif_generic, clif_with, compile, compile_generic, param_slots,
};
pub use strategy::{COLUMN_BLOCK, STRIP_ROWS};
pub use wide::prefetch;

#[cfg(test)]
mod tests;
