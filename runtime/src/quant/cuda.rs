//! The block formats' values in CUDA C, beside their CPU readers in `mod.rs`: for each type
//! a projection keeps, a device function `float k_gq(const unsigned char* b, int v)` giving
//! value `v` of the block at `b`, in the same `f32` operations in the same order as the CPU
//! reader (kiln compiles CUDA without contraction, so the values are bit-identical), and the
//! block's size as `K_GQ_VALUES` and `K_GQ_BYTES`. Kernels that read blocks (kiln-models'
//! dequantizing matrix-vector products and dequantizations) put it before their own source.
//!
//! Fields are read a byte at a time (a block's 16-bit and 32-bit fields are not aligned to
//! their size in every type), and a block is read only at the offsets its layout names.

use super::GgmlType;

/// Reads little-endian halves (`k_h2f` is kiln's CUDA prelude's f16 conversion).
const HALF: &str = "__device__ __forceinline__ float k_gq_half(const unsigned char* b, int at) {
  return k_h2f((unsigned short)(b[at] | (b[at + 1] << 8)));
}
";

/// Q4_K's and Q5_K's packed 6-bit scales and minimums (`get_scale_min_k4`).
const SCALE_MIN_K4: &str = "__device__ __forceinline__ void k_gq_scale_min(int j, const unsigned char* s, int* sc, int* m) {
  if (j < 4) { *sc = s[j] & 63; *m = s[j + 4] & 63; }
  else { *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4); *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4); }
}
";

/// Each type's `k_gq` body (after [`HALF`], and [`SCALE_MIN_K4`] for the K types that use
/// it), as the CPU readers in `mod.rs` compute them.
fn body(kind: GgmlType) -> Option<&'static str> {
    Some(match kind {
        GgmlType::Q8_0 => "return k_gq_half(b, 0) * (float)(signed char)b[2 + v];",
        GgmlType::Q4_0 => {
            "int q = v < 16 ? (b[2 + v] & 15) : (b[2 + v - 16] >> 4);
  return k_gq_half(b, 0) * (float)(q - 8);"
        }
        GgmlType::Q4_1 => {
            "int q = v < 16 ? (b[4 + v] & 15) : (b[4 + v - 16] >> 4);
  return k_gq_half(b, 0) * (float)q + k_gq_half(b, 2);"
        }
        GgmlType::Q5_0 => {
            "int q = (v < 16 ? (b[6 + v] & 15) : (b[6 + v - 16] >> 4)) | (((b[2 + v / 8] >> (v % 8)) & 1) << 4);
  return k_gq_half(b, 0) * (float)(q - 16);"
        }
        GgmlType::Q5_1 => {
            "int q = (v < 16 ? (b[8 + v] & 15) : (b[8 + v - 16] >> 4)) | (((b[4 + v / 8] >> (v % 8)) & 1) << 4);
  return k_gq_half(b, 0) * (float)q + k_gq_half(b, 2);"
        }
        GgmlType::Q2_K => {
            "int c = v / 128, s = (v % 128) / 32, l = v % 32;
  int q = (b[16 + 32 * c + l] >> (2 * s)) & 3;
  int scale = b[v / 16];
  float dl = k_gq_half(b, 80) * (float)(scale & 15), ml = k_gq_half(b, 82) * (float)(scale >> 4);
  return dl * (float)q - ml;"
        }
        GgmlType::Q3_K => {
            "int c = v / 128, s = (v % 128) / 32, l = v % 32;
  int low = (b[32 + 32 * c + l] >> (2 * s)) & 3;
  int high = (b[l] >> (v / 32)) & 1;
  int q = low - ((high ^ 1) << 2);
  const unsigned char* scales = b + 96;
  int i = v / 16;
  int nibble = i < 8 ? (scales[i] & 15) : (scales[i - 8] >> 4);
  int pair = (scales[8 + i % 4] >> (2 * (i / 4))) & 3;
  int scale = (nibble | (pair << 4)) - 32;
  return k_gq_half(b, 108) * (float)scale * (float)q;"
        }
        GgmlType::Q4_K => {
            "int run = v / 64, high = (v % 64) / 32, l = v % 32;
  int sc, m;
  k_gq_scale_min(2 * run + high, b + 4, &sc, &m);
  int byte = b[16 + 32 * run + l];
  int q = high ? (byte >> 4) : (byte & 15);
  return k_gq_half(b, 0) * (float)sc * (float)q - k_gq_half(b, 2) * (float)m;"
        }
        GgmlType::Q5_K => {
            "int j = v / 32, l = v % 32;
  int sc, m;
  k_gq_scale_min(j, b + 4, &sc, &m);
  int byte = b[48 + 32 * (j / 2) + l];
  int q = ((j % 2 == 0) ? (byte & 15) : (byte >> 4)) | (((b[16 + l] >> j) & 1) << 4);
  return k_gq_half(b, 0) * (float)sc * (float)q - k_gq_half(b, 2) * (float)m;"
        }
        GgmlType::Q6_K => {
            "int half = v / 128, k = (v % 128) / 32, l = v % 32;
  const unsigned char* ql = b + 64 * half;
  int h = b[128 + 32 * half + l];
  int low = (k % 2 == 0 ? ql[l] : ql[l + 32]);
  int q = (k < 2 ? (low & 15) : (low >> 4)) | (((h >> (2 * k)) & 3) << 4);
  float scale = k_gq_half(b, 208) * (float)(signed char)b[192 + 8 * half + l / 16 + 2 * k];
  return scale * (float)(q - 32);"
        }
        _ => return None,
    })
}

/// The CUDA C reading `kind`'s blocks (`k_gq`, `K_GQ_VALUES`, `K_GQ_BYTES`), for the
/// types with a CPU reader that a projection keeps (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and the K
/// types but Q8_K); `None` for others.
pub fn block_source(kind: GgmlType) -> Option<String> {
    let body = body(kind)?;
    let (values, bytes) = kind.block()?;
    Some(format!(
        "#define K_GQ_VALUES {values}\n#define K_GQ_BYTES {bytes}\n{HALF}{SCALE_MIN_K4}\
         __device__ __forceinline__ float k_gq(const unsigned char* b, int v) {{\n  {body}\n}}\n"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kept_type_but_q8_k_has_a_source_of_its_block_size() {
        for kind in super::super::dequantized() {
            let source = block_source(kind);
            let has = matches!(kind.block(), Some((32 | 256, _))) && kind != GgmlType::Q8_K;
            assert_eq!(source.is_some(), has, "{kind}");
            if let (Some(source), Some((values, bytes))) = (source, kind.block()) {
                assert!(source.contains(&format!("K_GQ_VALUES {values}\n")), "{kind}");
                assert!(source.contains(&format!("K_GQ_BYTES {bytes}\n")), "{kind}");
            }
        }
    }
}
