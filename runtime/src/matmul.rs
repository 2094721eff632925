//! Matrix products through the `gemm` crate (multi-threaded, AVX-512 kernels picked at run
//! time) for `f32`, `f64` and `f16`. Operands are read through views: a transposed or
//! sliced operand is passed as strides, never copied.

use gemm::{Parallelism, gemm};
use half::f16;
use kiln_ir::{DType, Element, View};

use crate::{Buffer, RuntimeError};

/// `a @ b` for operands viewed as `[.., m, k]` and `[.., k, n]` with equal batch
/// dimensions (any strides, broadcast batches included); the result is dense row-major.
///
/// # Panics
/// If the dtype is not `f32`, `f64` or `f16` (the planner sends only those here).
pub(crate) fn matmul(a: &Buffer, va: &View, b: &Buffer, vb: &View) -> Result<Buffer, RuntimeError> {
    match a.dtype() {
        DType::F32 => batched::<f32>(a, va, b, vb, 0.0, 1.0),
        DType::F64 => batched::<f64>(a, va, b, vb, 0.0, 1.0),
        DType::F16 => batched::<f16>(a, va, b, vb, f16::ZERO, f16::ONE),
        other => unreachable!("matmul of {other} runs on the reference executor"),
    }
}

fn batched<T: Element>(
    a: &Buffer,
    va: &View,
    b: &Buffer,
    vb: &View,
    zero: T,
    one: T,
) -> Result<Buffer, RuntimeError> {
    let r = va.shape().rank();
    let (m, k, n) = (va.shape().dims()[r - 2], va.shape().dims()[r - 1], vb.shape().dims()[r - 1]);
    let batch_shape = kiln_ir::Shape::from(&va.shape().dims()[..r - 2]);
    let batch = batch_shape.numel();
    // Each operand's batch offsets: a view over the batch dimensions with its strides.
    let batch_offsets = |v: &View| -> Vec<usize> {
        kiln_ir::View::from_parts(batch_shape.clone(), v.strides()[..r - 2].to_vec(), v.offset())
            .offsets()
            .collect()
    };
    let (offs_a, offs_b) = (batch_offsets(va), batch_offsets(vb));
    let (sa, sb) = (va.strides(), vb.strides());
    let a = a.as_slice::<T>().expect("matmul operands have the node's dtype");
    let b = b.as_slice::<T>().expect("matmul operands have the node's dtype");
    let threads = if m * n * k >= 1 << 18 { rayon::current_num_threads() } else { 1 };
    let parallelism = if threads > 1 { Parallelism::Rayon(threads) } else { Parallelism::None };
    // SAFETY: the closure writes all `batch * m * n` output elements: each product fills its
    // whole dense `m x n` block (with `k == 0` the blocks are zero-filled). The operands are
    // read at `offset + i * row_stride + j * col_stride` for in-range `i, j`, which the views
    // (checked against their buffers when the graph was built) keep inside the slices.
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
                    a.as_ptr().add(offs_a[p]),
                    sa[r - 1],
                    sa[r - 2],
                    b.as_ptr().add(offs_b[p]),
                    sb[r - 1],
                    sb[r - 2],
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
