//! The CUDA C of the ops that read quantized weights on a GPU, in kiln's launch convention
//! for user-defined ops (`kiln::ops::OpaqueBuilder::cuda`):
//!
//! - products `x Wᵀ` for a decode step: a warp per output element, its lanes striding over
//!   the row (GGML blocks read through the format's `k_gq`, `kiln_runtime::quant::
//!   block_source`; or `i8` values), then adding their sums with `__shfl_xor_sync`. The row
//!   length `k` is part of the source (the convention passes only the output's sizes), so a
//!   model compiles one per distinct input width;
//! - the dequantization of whole blocks to f32 (a prefill's weight, a gradient's), a thread
//!   per value.
//!
//! Each output element's sum is taken in f32 in the lanes' order, not the CPU's; `KILN_CHECK`
//! compares the two within the products' tolerance.

use kiln_runtime::quant::{GgmlType, block_source};

/// Adds the lanes of a warp into every lane.
const WARP_SUM: &str = "__device__ __forceinline__ float k_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
";

/// `out[m, r] = Σ_j value_j(row r) · x[m, j]` over `k` values a row, a warp per element;
/// `load` is the value `j` of the row at `w_row` (a C expression), `finish` the element from
/// `acc` (a C expression).
fn warp_product(
    entry: &str,
    params: &str,
    k: usize,
    row: &str,
    load: &str,
    finish: &str,
) -> String {
    format!(
        "{WARP_SUM}extern \"C\" __global__ void {entry}(float* out, const float* x, {params}, long long n, long long inner) {{
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < 32 * n;
       i += (long long)gridDim.x * blockDim.x) {{
    long long e = i >> 5, m = e / inner, r = e % inner;
    int lane = (int)(i & 31);
    {row}
    const float* xs = x + m * {k}LL;
    float acc = 0.0f;
    for (int j = lane; j < {k}; j += 32) acc += ({load}) * xs[j];
    acc = k_warp_sum(acc);
    if (lane == 0) out[e] = {finish};
  }}
}}
"
    )
}

/// The product of f32 `x` `[.., k]` with `kind` blocks (u8 `[out, bytes of k values]`):
/// `kiln_gq_matmul(out, x, w, n, inner)`. `None` for a type without a CUDA reader or a `k`
/// that is not whole blocks.
pub(crate) fn blocks_product(kind: GgmlType, k: usize) -> Option<String> {
    let row_bytes = kind.bytes_of(k)?;
    let product = warp_product(
        "kiln_gq_matmul",
        "const unsigned char* w",
        k,
        &format!("const unsigned char* w_row = w + r * {row_bytes}LL;"),
        "k_gq(w_row + (j / K_GQ_VALUES) * K_GQ_BYTES, j % K_GQ_VALUES)",
        "acc",
    );
    Some(block_source(kind)? + &product)
}

/// The values of `kind` blocks (u8 `[rows, row bytes]`) as f32 `[rows, inner]`, a thread a
/// value: `kiln_gq_dequantize(out, w, n, inner)`.
pub(crate) fn blocks_dequantize(kind: GgmlType) -> Option<String> {
    Some(
        block_source(kind)?
            + "extern \"C\" __global__ void kiln_gq_dequantize(float* out, const unsigned char* w, long long n, long long inner) {
  long long row_bytes = inner / K_GQ_VALUES * K_GQ_BYTES;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    long long r = i / inner, j = i % inner;
    out[i] = k_gq(w + r * row_bytes + (j / K_GQ_VALUES) * K_GQ_BYTES, (int)(j % K_GQ_VALUES));
  }
}
",
    )
}

/// The product of f32 `x` `[.., k]` with per-channel int8 rows (`i8` `[out, k]`, f32 scales
/// `[out]`): `kiln_i8_matmul(out, x, w, scales, n, inner)`, each sum scaled once as on the
/// CPU.
pub(crate) fn i8_product(k: usize) -> String {
    warp_product(
        "kiln_i8_matmul",
        "const signed char* w, const float* scales",
        k,
        &format!("const signed char* w_row = w + r * {k}LL;"),
        "(float)w_row[j]",
        "scales[r] * acc",
    )
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use kiln::{DType, Device, Tensor};

    use crate::gguf::Gguf;
    use crate::quantize::QuantKind;
    use crate::quantized::{Activations, Quantized, dequantize_with, keeps, matmul_t};

    /// The emulated device in CI (`emulator/run-tests`), a GPU where there is one.
    fn gpu_or_skip(test: &str) -> Option<Device> {
        if kiln::cuda::is_available() {
            return Some(Device::Cuda(0));
        }
        let why = kiln::cuda::unavailable_reason().unwrap_or("kiln::cuda::device_count() is 0");
        kiln_ir::testing::skip(
            test,
            &format!("there is no CUDA device ({why})"),
            &["KILN_REQUIRE_GPU"],
        );
        None
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        t.to_vec::<f32>().iter().map(|v| v.to_bits()).collect()
    }

    /// The largest difference relative to the largest magnitude of `want` (at least 1).
    fn relative(got: &Tensor, want: &Tensor) -> f64 {
        let (g, w) = (got.to_vec::<f64>(), want.to_vec::<f64>());
        let scale = w.iter().fold(1f64, |m, v| m.max(v.abs()));
        g.iter().zip(&w).fold(0f64, |m, (a, b)| m.max((a - b).abs())) / scale
    }

    #[test]
    fn every_block_type_dequantizes_and_multiplies_on_cuda_as_on_the_cpu() {
        let test = "every_block_type_dequantizes_and_multiplies_on_cuda_as_on_the_cpu";
        let Some(gpu) = gpu_or_skip(test) else { return };
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf/blocks.gguf");
        let file = Gguf::open(path).expect("the blocks fixture");
        let mut kinds = std::collections::BTreeSet::new();
        for info in file.tensors() {
            let name = &info.name;
            let &[rows, cols] = info.shape.as_slice() else { continue };
            if !keeps(info.kind) {
                continue;
            }
            kinds.insert(info.kind.name());
            let bytes = file.bytes(name).expect("its bytes");
            let blocks = Tensor::from_vec(bytes.to_vec(), [rows, bytes.len() / rows]);
            // The values, bit for bit.
            let want = dequantize_with(info.kind, &blocks).expect("on the CPU");
            let got = dequantize_with(info.kind, &blocks.to(gpu)).expect("on the GPU");
            assert_eq!(got.device(), gpu);
            assert_eq!(bits(&got), bits(&want), "{name}: dequantized");
            // A decode step's product (the blocks read in place, a warp per output), and
            // under KILN_CHECK against the CPU's.
            let q = Quantized {
                kind: QuantKind::Blocks(info.kind),
                activations: Activations::F32,
                scales: None,
            };
            let x = Tensor::randn([3, cols]);
            let want = matmul_t(&x, &q, &blocks).expect("on the CPU");
            let (x, blocks) = (x.to(gpu), blocks.to(gpu));
            let got = kiln::with_check(|| matmul_t(&x, &q, &blocks).expect("on the GPU").cpu());
            assert!(relative(&got, &want) < 1e-5, "{name}: product");
        }
        let want: Vec<String> = crate::quantized::KINDS.iter().map(|k| k.name()).collect();
        assert_eq!(kinds.into_iter().collect::<Vec<_>>().len(), want.len(), "every kind, tested");
    }

    /// Every kernel here through NVRTC as kiln compiles it (`KILN_REQUIRE_NVRTC` makes a
    /// missing NVRTC a failure; CI installs it), no device needed.
    #[test]
    fn every_kernel_compiles_with_nvrtc() {
        let test = "every_kernel_compiles_with_nvrtc";
        if let Err(e) = kiln::cuda::compile_source("probe", "", "sm_90") {
            let why = format!("NVRTC cannot be used ({e})");
            kiln_ir::testing::skip(test, &why, &["KILN_REQUIRE_NVRTC"]);
            return;
        }
        let mut sources = vec![("i8 product".to_string(), super::i8_product(203))];
        for &kind in crate::quantized::KINDS {
            let product = super::blocks_product(kind, 512).expect("a kept kind");
            let dequantize = super::blocks_dequantize(kind).expect("a kept kind");
            sources.extend([
                (format!("{kind} product"), product),
                (format!("{kind} dequantize"), dequantize),
            ]);
        }
        for (what, source) in sources {
            let ptx = kiln::cuda::compile_source("quantized", &source, "sm_90");
            let ptx = ptx.unwrap_or_else(|e| panic!("{what}: {e}\n{source}"));
            assert!(ptx.contains(".entry"), "{what}");
        }
    }

    #[test]
    fn int8_rows_multiply_on_cuda_as_on_the_cpu() {
        let Some(gpu) = gpu_or_skip("int8_rows_multiply_on_cuda_as_on_the_cpu") else { return };
        // Rows not a multiple of a warp's width; every i8 value, -128 included.
        let (out, k) = (37, 203);
        let values: Vec<i8> = (0..out * k).map(|i| (i * 97 % 256) as u8 as i8).collect();
        let rows = Tensor::from_vec(values, [out, k]);
        let scales = Tensor::rand([out]).to_dtype(DType::F32) * 0.01 + 0.001;
        let q = Quantized {
            kind: QuantKind::Int8,
            activations: Activations::Int8,
            scales: Some(scales.clone()),
        };
        for m in [1, 4] {
            let x = Tensor::randn([m, k]);
            let cpu = Quantized { activations: Activations::F32, ..q.clone() };
            let want = matmul_t(&x, &cpu, &rows).expect("on the CPU");
            // Int8 activations take the float product on a GPU.
            let q = Quantized { scales: Some(scales.to(gpu)), ..q.clone() };
            let (x, rows) = (x.to(gpu), rows.to(gpu));
            let got = kiln::with_check(|| matmul_t(&x, &q, &rows).expect("on the GPU").cpu());
            assert!(relative(&got, &want) < 1e-5, "{m} rows");
        }
    }
}
