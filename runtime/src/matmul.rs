//! Matrix products through the `gemm` crate (multi-threaded, AVX-512 kernels picked at run
//! time), for `f32`, `f64` and `f16`; other dtypes run on the reference executor.

use gemm::{Parallelism, gemm};
use half::f16;
use kiln_ir::{DType, Element, Shape};

use crate::{Buffer, RuntimeError};

/// `a @ b` for batched row-major operands `[.., m, k]` and `[.., k, n]` with equal batch
/// dimensions, or `None` when the dtype has no `gemm` kernel.
pub(crate) fn matmul(
    a: &Buffer,
    b: &Buffer,
    sa: &Shape,
    sb: &Shape,
) -> Option<Result<Buffer, RuntimeError>> {
    match a.dtype() {
        DType::F32 => Some(batched::<f32>(a, b, sa, sb, 0.0, 1.0)),
        DType::F64 => Some(batched::<f64>(a, b, sa, sb, 0.0, 1.0)),
        DType::F16 => Some(batched::<f16>(a, b, sa, sb, f16::ZERO, f16::ONE)),
        _ => None,
    }
}

fn batched<T: Element>(
    a: &Buffer,
    b: &Buffer,
    sa: &Shape,
    sb: &Shape,
    zero: T,
    one: T,
) -> Result<Buffer, RuntimeError> {
    let r = sa.rank();
    let (m, k, n) = (sa.dims()[r - 2], sa.dims()[r - 1], sb.dims()[r - 1]);
    let batch: usize = sa.dims()[..r - 2].iter().product();
    let a = a.as_slice::<T>().expect("matmul operands have the node's dtype");
    let b = b.as_slice::<T>().expect("matmul operands have the node's dtype");
    let threads = if m * n * k >= 1 << 18 { rayon::current_num_threads() } else { 1 };
    let parallelism = if threads > 1 { Parallelism::Rayon(threads) } else { Parallelism::None };
    // SAFETY: the closure writes all `batch * m * n` elements: each product fills its whole
    // `m x n` block (with `k == 0` the blocks are zero-filled instead), and the operand
    // slices hold `batch * m * k` and `batch * k * n` elements, which the row-major strides
    // below stay inside.
    let filled = unsafe {
        Buffer::from_raw_fill(T::DTYPE, batch * m * n, |out| {
            let out = out.cast::<T>();
            for p in 0..batch {
                let dst = out.add(p * m * n);
                if k == 0 {
                    for i in 0..m * n {
                        dst.add(i).write(zero);
                    }
                    continue;
                }
                gemm(
                    m,
                    n,
                    k,
                    dst,
                    1,
                    n as isize,
                    false,
                    a.as_ptr().add(p * m * k),
                    1,
                    k as isize,
                    b.as_ptr().add(p * k * n),
                    1,
                    n as isize,
                    zero,
                    one,
                    false,
                    false,
                    false,
                    parallelism,
                );
            }
            Ok::<(), RuntimeError>(())
        })
    };
    filled?
}
