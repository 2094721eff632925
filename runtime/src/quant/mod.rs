//! GGML's tensor types: their ids, names and block layouts (as GGUF files store them), and
//! dequantization of the block formats kiln reads to `f32`, quantization to a few of them, and
//! dot products that read the blocks where they lie.
//!
//! A quantized tensor is a sequence of blocks, each holding `block_len` values of one row in
//! `block_bytes` bytes (a row's length is a multiple of the block length). The layouts here
//! are GGML's (`ggml-common.h`), byte for byte, so a GGUF tensor's bytes are read as they lie
//! in the file; dequantization computes in `f32` in the order GGML's reference does (no fused
//! multiply-adds), so its values are bit-exact.

mod channel;
mod cuda;
mod dot;
mod gemm;
mod int8;
mod quantize;

pub use channel::{
    dot_rows_i8, dot_rows_i8_int8, dot_rows_i8_int8_on, dot_rows_i8_on, quantize_rows_i8,
};
pub use cuda::block_source;
pub use dot::{DotPath, dot_rows, dot_rows_on, host_path};
pub use gemm::{
    GEMM_GROUP, GemmPath, GemmWeights, gemm_available, gemm_int8, gemm_int8_on, pack_gemm,
    pack_gemm_on, packed_group_bytes, unpack_gemm,
};
use half::{bf16, f16};
#[cfg(target_arch = "x86_64")]
pub(crate) use int8::avx2::hsum;
pub use int8::{activation_type, dot_rows_int8, dot_rows_int8_on};
pub use quantize::{quantize, quantized};
use rayon::prelude::*;

/// One of GGML's tensor types, by its id in a GGUF file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GgmlType(pub u32);

/// Every type GGML defines: id, name, values per block, bytes per block.
const TYPES: &[(u32, &str, usize, usize)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 40),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
    (40, "NVFP4", 64, 36),
    (41, "Q1_0", 128, 18),
];

/// The types [`dequantize`] reads, each with its reader (whole blocks in, values out).
const READERS: &[(GgmlType, Reader)] = &[
    (GgmlType::F32, |b, o| each(GgmlType::F32, b, o, |b, o| o[0] = f32::from_le_bytes(le(b)))),
    (GgmlType::F16, |b, o| each(GgmlType::F16, b, o, |b, o| o[0] = half_at(b, 0))),
    (GgmlType::BF16, |b, o| each(GgmlType::BF16, b, o, |b, o| o[0] = bf16_at(b))),
    (GgmlType::Q8_0, |b, o| each(GgmlType::Q8_0, b, o, q8_0)),
    (GgmlType::Q4_0, |b, o| each(GgmlType::Q4_0, b, o, q4_0)),
    (GgmlType::Q4_1, |b, o| each(GgmlType::Q4_1, b, o, q4_1)),
    (GgmlType::Q5_0, |b, o| each(GgmlType::Q5_0, b, o, q5_0)),
    (GgmlType::Q5_1, |b, o| each(GgmlType::Q5_1, b, o, q5_1)),
    (GgmlType::Q2_K, |b, o| each(GgmlType::Q2_K, b, o, q2_k)),
    (GgmlType::Q3_K, |b, o| each(GgmlType::Q3_K, b, o, q3_k)),
    (GgmlType::Q4_K, |b, o| each(GgmlType::Q4_K, b, o, q4_k)),
    (GgmlType::Q5_K, |b, o| each(GgmlType::Q5_K, b, o, q5_k)),
    (GgmlType::Q6_K, |b, o| each(GgmlType::Q6_K, b, o, q6_k)),
    (GgmlType::Q8_K, |b, o| each(GgmlType::Q8_K, b, o, q8_k)),
];

type Reader = fn(&[u8], &mut [f32]);

/// The values a thread dequantizes at a time (whole blocks of every type).
const RUN: usize = 1 << 16;

/// The reader of `kind`'s blocks (whole blocks in, values out; the caller checks sizes).
fn reader(kind: GgmlType) -> Option<Reader> {
    READERS.iter().find(|r| r.0 == kind).map(|r| r.1)
}

/// The types [`dequantize`] reads.
pub fn dequantized() -> impl Iterator<Item = GgmlType> {
    READERS.iter().map(|r| r.0)
}

impl GgmlType {
    /// 32-bit floats.
    pub const F32: GgmlType = GgmlType(0);
    /// IEEE half floats.
    pub const F16: GgmlType = GgmlType(1);
    /// Blocks of 32 4-bit values with one `f16` scale: `d * (q - 8)`.
    pub const Q4_0: GgmlType = GgmlType(2);
    /// Blocks of 32 4-bit values with an `f16` scale and minimum: `d * q + m`.
    pub const Q4_1: GgmlType = GgmlType(3);
    /// Blocks of 32 5-bit values with one `f16` scale: `d * (q - 16)`.
    pub const Q5_0: GgmlType = GgmlType(6);
    /// Blocks of 32 5-bit values with an `f16` scale and minimum: `d * q + m`.
    pub const Q5_1: GgmlType = GgmlType(7);
    /// Blocks of 32 `i8` values with one `f16` scale: `d * q`.
    pub const Q8_0: GgmlType = GgmlType(8);
    /// Super-blocks of 256 2-bit values in 16 sub-blocks, each with a 4-bit scale and min.
    pub const Q2_K: GgmlType = GgmlType(10);
    /// Super-blocks of 256 3-bit values in 16 sub-blocks, each with a 6-bit scale.
    pub const Q3_K: GgmlType = GgmlType(11);
    /// Super-blocks of 256 4-bit values in 8 sub-blocks, each with a 6-bit scale and min.
    pub const Q4_K: GgmlType = GgmlType(12);
    /// Super-blocks of 256 5-bit values in 8 sub-blocks, each with a 6-bit scale and min.
    pub const Q5_K: GgmlType = GgmlType(13);
    /// Super-blocks of 256 6-bit values in 16 sub-blocks, each with an `i8` scale.
    pub const Q6_K: GgmlType = GgmlType(14);
    /// Super-blocks of 256 `i8` values with an `f32` scale and the sums of each 16 values
    /// (activations for the K-quants' integer products; no file stores it).
    pub const Q8_K: GgmlType = GgmlType(15);
    /// 8-bit integers.
    pub const I8: GgmlType = GgmlType(24);
    /// 32-bit integers.
    pub const I32: GgmlType = GgmlType(26);
    /// 64-bit integers.
    pub const I64: GgmlType = GgmlType(27);
    /// 64-bit floats.
    pub const F64: GgmlType = GgmlType(28);
    /// Brain floats.
    pub const BF16: GgmlType = GgmlType(30);

    fn entry(self) -> Option<&'static (u32, &'static str, usize, usize)> {
        TYPES.iter().find(|t| t.0 == self.0)
    }

    /// Whether GGML defines this id.
    pub fn is_known(self) -> bool {
        self.entry().is_some()
    }

    /// GGML's name for the type (`Q4_K`), or `type 77` for an id GGML does not define.
    pub fn name(self) -> String {
        self.entry().map_or_else(|| format!("type {}", self.0), |t| t.1.to_string())
    }

    /// The type GGML calls `name` (`Q4_K`, as [`GgmlType::name`] writes it).
    pub fn from_name(name: &str) -> Option<GgmlType> {
        TYPES.iter().find(|t| t.1 == name).map(|t| GgmlType(t.0))
    }

    /// Values per block and bytes per block; `None` for an id GGML does not define.
    pub fn block(self) -> Option<(usize, usize)> {
        self.entry().map(|t| (t.2, t.3))
    }

    /// The bytes of `values` values stored as this type; `None` when the type is unknown,
    /// `values` is not a whole number of blocks, or the size overflows.
    pub fn bytes_of(self, values: usize) -> Option<usize> {
        let (len, bytes) = self.block()?;
        if !values.is_multiple_of(len) {
            return None;
        }
        (values / len).checked_mul(bytes)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// Why [`dequantize`] could not read a tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DequantizeError {
    /// A type kiln does not dequantize (GGML's name for it).
    Unsupported(GgmlType),
    /// The bytes are not the size the values need in this type.
    Size {
        /// The tensor's type.
        kind: GgmlType,
        /// The values asked for.
        values: usize,
        /// The bytes given.
        bytes: usize,
    },
}

impl std::fmt::Display for DequantizeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DequantizeError::Unsupported(kind) => {
                let read: Vec<String> = dequantized().map(|t| t.name()).collect();
                write!(f, "{kind} is not a type kiln reads (it reads {})", read.join(", "))
            }
            DequantizeError::Size { kind, values, bytes } => {
                write!(f, "{values} values of {kind} do not fit in {bytes} bytes")
            }
        }
    }
}

impl std::error::Error for DequantizeError {}

/// Writes the values that `bytes`, stored as `kind`, hold into `out` (its length is the
/// number of values).
///
/// # Errors
/// [`DequantizeError::Unsupported`] for a type outside [`dequantized`];
/// [`DequantizeError::Size`] when `bytes` is not exactly the size of `out.len()` values.
pub fn dequantize(kind: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), DequantizeError> {
    let Some(read) = reader(kind) else {
        return Err(DequantizeError::Unsupported(kind));
    };
    if kind.bytes_of(out.len()) != Some(bytes.len()) {
        return Err(DequantizeError::Size { kind, values: out.len(), bytes: bytes.len() });
    }
    // Large tensors are read in runs of whole blocks on every core (a load dequantizes
    // billions of values).
    let (values, size) = kind.block().expect("a type with a reader is known");
    let blocks_per_run = RUN / values;
    if out.len() <= RUN {
        read(bytes, out);
        return Ok(());
    }
    bytes
        .par_chunks(blocks_per_run * size)
        .zip(out.par_chunks_mut(blocks_per_run * values))
        .for_each(|(b, o)| read(b, o));
    Ok(())
}

/// Runs `block` over each of `kind`'s blocks: `bytes` and `out` hold whole blocks (the
/// caller checked), so both chunkings end together.
fn each(kind: GgmlType, bytes: &[u8], out: &mut [f32], block: impl Fn(&[u8], &mut [f32])) {
    let (values, size) = kind.block().expect("a type with a reader is known");
    for (b, o) in bytes.chunks_exact(size).zip(out.chunks_exact_mut(values)) {
        block(b, o);
    }
}

/// The first `N` bytes of `b` as an array (the caller's block holds at least `N`).
fn le<const N: usize>(b: &[u8]) -> [u8; N] {
    b[..N].try_into().expect("a block holds its fields")
}

fn bf16_at(b: &[u8]) -> f32 {
    bf16::from_le_bytes([b[0], b[1]]).to_f32()
}

fn half_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// `d: f16, qs: [i8; 32]`.
fn q8_0(b: &[u8], out: &mut [f32]) {
    let d = half_at(b, 0);
    for (o, &q) in out.iter_mut().zip(&b[2..34]) {
        *o = f32::from(q as i8) * d;
    }
}

/// `d: f16, qs: [u8; 16]`: value `i` is the low nibble of `qs[i]`, value `i + 16` its high
/// nibble, each less 8.
fn q4_0(b: &[u8], out: &mut [f32]) {
    let d = half_at(b, 0);
    let (low, high) = out.split_at_mut(16);
    for ((l, h), &q) in low.iter_mut().zip(high).zip(&b[2..18]) {
        *l = d * f32::from((q & 0x0f) as i8 - 8);
        *h = d * f32::from((q >> 4) as i8 - 8);
    }
}

/// `d: f16, m: f16, qs: [u8; 16]`: nibbles as in Q4_0, `d * q + m`.
fn q4_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (half_at(b, 0), half_at(b, 2));
    let (low, high) = out.split_at_mut(16);
    for ((l, h), &q) in low.iter_mut().zip(high).zip(&b[4..20]) {
        *l = d * f32::from(q & 0x0f) + m;
        *h = d * f32::from(q >> 4) + m;
    }
}

/// Value `j` of a 5-bit block: its nibble (low nibbles of `qs` first, then high ones) and
/// bit `j` of `qh` as the fifth bit.
fn five_bits(qs: &[u8], qh: u32, j: usize) -> u8 {
    let nibble = if j < 16 { qs[j] & 0x0f } else { qs[j - 16] >> 4 };
    nibble | ((((qh >> j) & 1) as u8) << 4)
}

/// `d: f16, qh: u32, qs: [u8; 16]`: `d * (q - 16)`.
fn q5_0(b: &[u8], out: &mut [f32]) {
    let d = half_at(b, 0);
    let qh = u32::from_le_bytes(le(&b[2..6]));
    for (j, o) in out.iter_mut().enumerate() {
        *o = d * f32::from(five_bits(&b[6..22], qh, j) as i8 - 16);
    }
}

/// `d: f16, m: f16, qh: u32, qs: [u8; 16]`: `d * q + m`.
fn q5_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (half_at(b, 0), half_at(b, 2));
    let qh = u32::from_le_bytes(le(&b[4..8]));
    for (j, o) in out.iter_mut().enumerate() {
        *o = d * f32::from(five_bits(&b[8..24], qh, j)) + m;
    }
}

/// `scales: [u8; 16], qs: [u8; 64], d: f16, dmin: f16`: value `v` takes bits `2s..2s+2` of
/// `qs[32c + l]` (`v = 128c + 32s + l`); sub-block `v / 16` is
/// `d * (scale & 15) * q - dmin * (scale >> 4)`.
fn q2_k(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (half_at(b, 80), half_at(b, 82));
    for (v, o) in out.iter_mut().enumerate() {
        let (c, s, l) = (v / 128, (v % 128) / 32, v % 32);
        let q = (b[16 + 32 * c + l] >> (2 * s)) & 3;
        let scale = b[v / 16];
        let (dl, ml) = (d * f32::from(scale & 0x0f), dmin * f32::from(scale >> 4));
        *o = dl * f32::from(q) - ml;
    }
}

/// `hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d: f16`: two low bits as in Q2_K, less
/// 4 when bit `v / 32` of `hmask[v % 32]` is clear; 16 signed 6-bit scales (low nibbles in
/// bytes 0-7, high pairs in bytes 8-11), less 32.
fn q3_k(b: &[u8], out: &mut [f32]) {
    let d = half_at(b, 108);
    let scales = &b[96..108];
    for (v, o) in out.iter_mut().enumerate() {
        let (c, s, l) = (v / 128, (v % 128) / 32, v % 32);
        let low = (b[32 + 32 * c + l] >> (2 * s)) & 3;
        let high = (b[l] >> (v / 32)) & 1;
        let q = low as i8 - (((high ^ 1) << 2) as i8);
        let i = v / 16;
        let nibble = if i < 8 { scales[i] & 0x0f } else { scales[i - 8] >> 4 };
        let pair = (scales[8 + i % 4] >> (2 * (i / 4))) & 3;
        let scale = (nibble | (pair << 4)) as i8 - 32;
        *o = d * f32::from(scale) * f32::from(q);
    }
}

/// `d: f32, qs: [i8; 256], bsums: [i16; 16]` (the sums are not values).
fn q8_k(b: &[u8], out: &mut [f32]) {
    let d = f32::from_le_bytes(le(b));
    for (o, &q) in out.iter_mut().zip(&b[4..260]) {
        *o = d * f32::from(q as i8);
    }
}

/// Sub-block `j`'s 6-bit scale and min from Q4_K's 12 packed bytes (`get_scale_min_k4`).
fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    }
}

/// `d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128]`: four runs of 64 values, each the
/// low then the high nibbles of 32 bytes; sub-block `j` is `d * scale_j * q - dmin * min_j`.
fn q4_k(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (half_at(b, 0), half_at(b, 2));
    let scales = &b[4..16];
    for (run, (qs, y)) in b[16..144].chunks_exact(32).zip(out.chunks_exact_mut(64)).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * run, scales);
        let (sc2, m2) = scale_min_k4(2 * run + 1, scales);
        let (d1, min1) = (d * f32::from(sc1), dmin * f32::from(m1));
        let (d2, min2) = (d * f32::from(sc2), dmin * f32::from(m2));
        let (low, high) = y.split_at_mut(32);
        for ((l, h), &q) in low.iter_mut().zip(high).zip(qs) {
            *l = d1 * f32::from(q & 0x0f) - min1;
            *h = d2 * f32::from(q >> 4) - min2;
        }
    }
}

/// `d: f16, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128]`: Q4_K's nibbles
/// (runs of 64: low then high nibbles of 32 bytes) with bit `v / 32` of `qh[v % 32]` as the
/// fifth bit.
fn q5_k(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (half_at(b, 0), half_at(b, 2));
    let scales = &b[4..16];
    for (j, y) in out.chunks_exact_mut(32).enumerate() {
        let (sc, m) = scale_min_k4(j, scales);
        let (d1, min1) = (d * f32::from(sc), dmin * f32::from(m));
        let qs = &b[48 + 32 * (j / 2)..48 + 32 * (j / 2) + 32];
        for (l, o) in y.iter_mut().enumerate() {
            let nibble = if j % 2 == 0 { qs[l] & 0x0f } else { qs[l] >> 4 };
            let q = nibble | (((b[16 + l] >> j) & 1) << 4);
            *o = d1 * f32::from(q) - min1;
        }
    }
}

/// `ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16`: two halves of 128 values; in
/// each, value `l + 32k` takes 4 low bits from `ql` and 2 high bits from `qh[l]`, less 32,
/// times `d * scales[(l + 32k) / 16]`.
fn q6_k(b: &[u8], out: &mut [f32]) {
    let d = half_at(b, 208);
    for (half, y) in out.chunks_exact_mut(128).enumerate() {
        let ql = &b[64 * half..64 * half + 64];
        let qh = &b[128 + 32 * half..128 + 32 * half + 32];
        let sc = &b[192 + 8 * half..192 + 8 * half + 8];
        for l in 0..32 {
            let h = qh[l];
            let q = [
                (ql[l] & 0x0f) | ((h & 3) << 4),
                (ql[l + 32] & 0x0f) | (((h >> 2) & 3) << 4),
                (ql[l] >> 4) | (((h >> 4) & 3) << 4),
                (ql[l + 32] >> 4) | (((h >> 6) & 3) << 4),
            ];
            for (k, &q) in q.iter().enumerate() {
                let scale = d * f32::from(sc[l / 16 + 2 * k] as i8);
                y[l + 32 * k] = scale * f32::from(q as i8 - 32);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_has_one_entry_and_whole_blocks() {
        for (i, t) in TYPES.iter().enumerate() {
            assert!(TYPES[i + 1..].iter().all(|u| u.0 != t.0 && u.1 != t.1), "{t:?}");
        }
        assert_eq!(GgmlType::Q4_K.bytes_of(512), Some(288));
        assert_eq!(GgmlType::Q4_K.bytes_of(100), None);
        assert_eq!(GgmlType(77).name(), "type 77");
        assert_eq!(GgmlType(usize::MAX as u32).bytes_of(1), None);
        assert_eq!(GgmlType::F32.bytes_of(usize::MAX), None);
    }

    #[test]
    fn wrong_sizes_and_unread_types_are_errors() {
        let mut out = [0.0; 32];
        assert_eq!(
            dequantize(GgmlType::Q8_0, &[0; 33], &mut out),
            Err(DequantizeError::Size { kind: GgmlType::Q8_0, values: 32, bytes: 33 })
        );
        let err = dequantize(GgmlType(16), &[0; 66], &mut out).unwrap_err();
        assert_eq!(
            err.to_string(),
            "IQ2_XXS is not a type kiln reads (it reads F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K)"
        );
    }

    #[test]
    fn runs_on_many_cores_give_the_blocks_values() {
        // 600 Q4_K blocks (153,600 values: three runs), pseudo-random bytes, scales 0x3000.
        let mut state = 7u32;
        let mut bytes: Vec<u8> = (0..600 * 144)
            .map(|_| {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (state >> 24) as u8
            })
            .collect();
        for block in bytes.chunks_exact_mut(144) {
            block[..4].copy_from_slice(&[0, 0x30, 0, 0x30]);
        }
        let mut out = vec![0.0; 600 * 256];
        dequantize(GgmlType::Q4_K, &bytes, &mut out).unwrap();
        let mut want = vec![0.0; 256];
        for (b, got) in bytes.chunks_exact(144).zip(out.chunks_exact(256)) {
            q4_k(b, &mut want);
            assert_eq!(got, &want[..]);
        }
    }

    #[test]
    fn q8_0_and_q4_0_follow_their_definitions() {
        // d = 0.5 (f16 0x3800).
        let mut q8 = vec![0x00, 0x38];
        q8.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let mut out = [0.0; 32];
        dequantize(GgmlType::Q8_0, &q8, &mut out).unwrap();
        assert_eq!(out.to_vec(), (0..32).map(|i| (i - 16) as f32 * 0.5).collect::<Vec<_>>());
        let mut q4 = vec![0x00, 0x38];
        q4.extend((0..16).map(|i| i as u8 | ((15 - i as u8) << 4)));
        dequantize(GgmlType::Q4_0, &q4, &mut out).unwrap();
        let want: Vec<f32> =
            (0..16).chain((0..16).map(|i| 15 - i)).map(|q| (q - 8) as f32 * 0.5).collect();
        assert_eq!(out.to_vec(), want);
    }
}
