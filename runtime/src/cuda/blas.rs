//! Matrix products on a GPU through cuBLAS (`cublasGemmStridedBatchedEx`): `f32` (in full
//! `f32` precision, no TF32), `f64`, and `f16` and `bf16` accumulated in `f32`. Transposed operands are
//! passed as transpose flags and batches as strides, never copied. Operand layouts that one
//! leading dimension and one batch stride cannot describe (a broadcast row, say) return
//! `None`, and the caller computes the product on the host.

use std::ffi::c_void;
use std::sync::{Mutex, PoisonError};

use cudarc::cublas::{result, sys};
use kiln_ir::{DType, Shape, View};

use super::Gpu;
use crate::{Buffer, RuntimeError};

/// A cuBLAS handle bound to the device's stream. cuBLAS handles must not be used by two
/// threads at once, hence the lock.
pub(crate) struct Handle(Mutex<sys::cublasHandle_t>);

// SAFETY: the handle is only used under its lock, from any thread, with the device's context
// bound first.
unsafe impl Send for Handle {}
// SAFETY: as above.
unsafe impl Sync for Handle {}

impl Gpu {
    fn blas(&self) -> Result<&Handle, RuntimeError> {
        let made = self.blas.get_or_init(|| {
            // SAFETY: only looks the library up; cudarc's cuBLAS calls panic when it is missing.
            if !unsafe { sys::is_culib_present() } {
                return Err("cuBLAS (libcublas.so) was not found: it ships with the CUDA toolkit \
                            and the nvidia-cublas wheel; put its lib directory on \
                            LD_LIBRARY_PATH"
                    .to_string());
            }
            self.bind().map_err(|e| e.to_string())?;
            let handle = result::create_handle().map_err(|e| format!("{e:?}"))?;
            // SAFETY: a fresh handle and the device's live stream.
            unsafe { result::set_stream(handle, self.stream.cu_stream() as _) }
                .map_err(|e| format!("{e:?}"))?;
            Ok(Handle(Mutex::new(handle)))
        });
        made.as_ref().map_err(|reason| RuntimeError::BackendUnavailable {
            device: self.device(),
            reason: reason.clone(),
        })
    }
}

/// How cuBLAS (column-major) sees one row-major operand `X` (`rows x cols`, strides `rs`,
/// `cs`): the memory holds `Xᵀ` column-major with leading dimension `ld` (`transpose` false),
/// or `X` column-major (`transpose` true, so the product asks for its transpose).
fn layout(rows: usize, cols: usize, rs: isize, cs: isize) -> Option<(bool, usize)> {
    let (rs, cs) = (usize::try_from(rs).ok()?, usize::try_from(cs).ok()?);
    if (cols == 1 || cs == 1) && (rows == 1 || rs >= cols.max(1)) {
        return Some((false, if rows == 1 { cols.max(1) } else { rs }));
    }
    if (rows == 1 || rs == 1) && (cols == 1 || cs >= rows.max(1)) {
        return Some((true, if cols == 1 { rows.max(1) } else { cs }));
    }
    None
}

/// The offsets of an operand's matrices: the first and a constant step between consecutive
/// batches, if they form one.
fn batch_stride(view: &View, batch: &Shape) -> Option<(usize, i64)> {
    let r = view.shape().rank();
    let offsets: Vec<usize> =
        View::from_parts(batch.clone(), view.strides()[..r - 2].to_vec(), view.offset())
            .offsets()
            .collect();
    let first = *offsets.first()?;
    let step = offsets.get(1).map_or(0, |&o| o as i64 - first as i64);
    offsets
        .iter()
        .enumerate()
        .all(|(i, &o)| o as i64 == first as i64 + i as i64 * step)
        .then_some((first, step))
}

/// `a @ b` on `gpu` for device buffers viewed as `[.., m, k]` and `[.., k, n]`; `None` when the
/// dtype or the layouts are not ones cuBLAS takes directly.
pub(crate) fn matmul(
    gpu: &'static Gpu,
    a: &Buffer,
    va: &View,
    b: &Buffer,
    vb: &View,
) -> Result<Option<Buffer>, RuntimeError> {
    let dtype = a.dtype();
    let (data, compute) = match dtype {
        DType::F32 => (sys::cudaDataType::CUDA_R_32F, sys::cublasComputeType_t::CUBLAS_COMPUTE_32F),
        DType::F64 => (sys::cudaDataType::CUDA_R_64F, sys::cublasComputeType_t::CUBLAS_COMPUTE_64F),
        DType::F16 => (sys::cudaDataType::CUDA_R_16F, sys::cublasComputeType_t::CUBLAS_COMPUTE_32F),
        DType::BF16 => {
            (sys::cudaDataType::CUDA_R_16BF, sys::cublasComputeType_t::CUBLAS_COMPUTE_32F)
        }
        _ => return Ok(None),
    };
    let r = va.shape().rank();
    let (m, k, n) = (va.shape().dims()[r - 2], va.shape().dims()[r - 1], vb.shape().dims()[r - 1]);
    let batch = Shape::from(&va.shape().dims()[..r - 2]);
    let count = batch.numel();
    if count * m * n == 0 {
        return Ok(Some(Buffer::on_gpu(gpu, dtype, 0)?));
    }
    // Every layout check before the output is allocated: a declined product allocates
    // nothing on the device.
    let (sa, sb) = (va.strides(), vb.strides());
    let (Some((ta, lda)), Some((tb, ldb)), Some((oa, stride_a)), Some((ob, stride_b))) = (
        layout(m, k, sa[r - 2], sa[r - 1]),
        layout(k, n, sb[r - 2], sb[r - 1]),
        batch_stride(va, &batch),
        batch_stride(vb, &batch),
    ) else {
        return Ok(None);
    };
    let int = |v: usize| i32::try_from(v).ok();
    let (Some(mi), Some(ni), Some(ki), Some(lda), Some(ldb), Some(batches)) =
        (int(m), int(n), int(k), int(lda), int(ldb), int(count))
    else {
        return Ok(None);
    };
    if k == 0 {
        // An empty sum: cuBLAS would leave the output unwritten.
        return Ok(None);
    }
    let out = Buffer::on_gpu(gpu, dtype, count * m * n)?;
    let size = dtype.size_in_bytes() as u64;
    let pa = a.device_ptr(gpu)? + oa as u64 * size;
    let pb = b.device_ptr(gpu)? + ob as u64 * size;
    let pc = out.device_ptr(gpu)?;
    let op = |t: bool| {
        if t { sys::cublasOperation_t::CUBLAS_OP_T } else { sys::cublasOperation_t::CUBLAS_OP_N }
    };
    // Row-major C = A B is column-major Cᵀ = Bᵀ Aᵀ: B comes first.
    let (one32, zero32, one64, zero64) = (1.0f32, 0.0f32, 1.0f64, 0.0f64);
    let (alpha, beta): (*const c_void, *const c_void) = if dtype == DType::F64 {
        ((&raw const one64).cast(), (&raw const zero64).cast())
    } else {
        ((&raw const one32).cast(), (&raw const zero32).cast())
    };
    if super::graph::replaying(gpu) {
        // The graph's nodes hold this call, with these pointers.
        return Ok(Some(out));
    }
    let handle = gpu.blas()?;
    gpu.bind()?;
    let h = handle.0.lock().unwrap_or_else(PoisonError::into_inner);
    // A capture queues on a stream of its own (see `graph.rs`): the handle follows it for
    // this call, under its lock.
    let stream = super::graph::stream(gpu);
    let redirected = !std::sync::Arc::ptr_eq(&stream, &gpu.stream);
    let set = |s: &cudarc::driver::CudaStream| {
        // SAFETY: the handle, locked, and a live stream of its device.
        unsafe { result::set_stream(*h, s.cu_stream() as _) }
            .map_err(|e| gpu.error("setting cuBLAS's stream", format!("{e:?}")))
    };
    if redirected {
        set(&stream)?;
    }
    // SAFETY: the pointers address device buffers holding every element the layouts and
    // batch strides reach (the graph checked the views against their buffers); the output
    // holds `count * m * n` elements written densely (ldc = n, stride m * n); alpha and beta
    // live until the call returns (cuBLAS reads host scalars before returning).
    let ran = unsafe {
        result::gemm_strided_batched_ex(
            *h,
            op(tb),
            op(ta),
            ni,
            mi,
            ki,
            alpha,
            pb as *const c_void,
            data,
            ldb,
            stride_b,
            pa as *const c_void,
            data,
            lda,
            stride_a,
            beta,
            pc as *mut c_void,
            data,
            ni,
            (m * n) as i64,
            batches,
            compute,
            sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| gpu.error("running a matrix product in cuBLAS", format!("{e:?}")));
    if redirected {
        set(&gpu.stream)?;
    }
    ran?;
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::{batch_stride, layout};
    use kiln_ir::{Shape, View};

    #[test]
    fn operand_layouts_map_to_leading_dimensions() {
        // Row-major 3x4: as column-major, its transpose with ld 4.
        assert_eq!(layout(3, 4, 4, 1), Some((false, 4)));
        // A transposed 3x4 (strides 1, 3): column-major itself, ld 3.
        assert_eq!(layout(3, 4, 1, 3), Some((true, 3)));
        // A slice of a wider matrix keeps its row stride as ld.
        assert_eq!(layout(3, 4, 10, 1), Some((false, 10)));
        // Vectors: any stride of a size-1 dimension is irrelevant.
        assert_eq!(layout(1, 4, 0, 1), Some((false, 4)));
        assert_eq!(layout(4, 1, 1, 7), Some((false, 1)));
        // A broadcast row (stride 0) and a strided column cannot be described.
        assert_eq!(layout(3, 4, 0, 1), None);
        assert_eq!(layout(3, 4, 8, 2), None);
    }

    #[test]
    fn batch_strides_must_be_uniform() {
        let v = View::contiguous(Shape::from([2, 3, 4, 5]));
        assert_eq!(batch_stride(&v, &Shape::from([2, 3])), Some((0, 20)));
        let broadcast = View::contiguous(Shape::from([1, 4, 5])).expand(&Shape::from([3, 4, 5]));
        assert_eq!(batch_stride(&broadcast, &Shape::from([3])), Some((0, 0)));
        // A permuted batch whose offsets are not one progression.
        let p = View::contiguous(Shape::from([2, 3, 4, 5])).permute(&[1, 0, 2, 3]);
        assert_eq!(batch_stride(&p, &Shape::from([3, 2])), None);
    }
}
