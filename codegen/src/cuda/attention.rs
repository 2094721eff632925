//! The CUDA C of fused attention (`Op::Attention`) and its gradients (`Op::AttentionGrad`)
//! for dense operands `q [n, l, e]`, `k [n, s, e]`, `v [n, s, ev]` of any float dtype. One
//! warp per query row (forward, row statistics and `dq`) or per key row (`dk`, `dv`): each
//! lane holds every 32nd feature of its row in registers, a dot product is the lanes' sum
//! (butterfly shuffles), and the warp walks the other side's rows with an online softmax, so
//! no `l × s` matrix exists and a warp's loads of a row are one coalesced read. 16-bit
//! operands are widened on load and the results rounded once, as on the CPU; arithmetic is
//! in `float` (`double` for `f64`). Sizes are constants in the source, as in the other
//! library kernels. A given mask (a dense `[n, l, s]` of bytes) is read per score: a hidden
//! key is skipped, and a query that sees no key gives zeros.

use std::fmt::Write as _;

use kiln_ir::{AttentionMask, DType};

use super::library::{LibraryKernel, finish};
use super::{compute_type, load, storage_type, store};

/// The sizes and options of one attention op.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionShape {
    /// Batch entries.
    pub n: usize,
    /// Queries per entry.
    pub l: usize,
    /// Features of a query or key.
    pub e: usize,
    /// Keys per entry.
    pub s: usize,
    /// Features of a value.
    pub ev: usize,
    /// Which keys each query sees.
    pub mask: AttentionMask,
    /// The score scale.
    pub scale: f64,
}

/// Threads per row: one warp.
pub const THREADS_PER_ROW: usize = 32;

/// The dtype of the gradients' row statistics (`stats`): the arithmetic's.
pub fn stats_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 { DType::F64 } else { DType::F32 }
}

/// Entry points, in launch order, each over `n` rows with [`THREADS_PER_ROW`] threads per
/// row. Forward: `ENTRY0(q, k, v, out, n)` over `n·l` query rows. Gradients: `ENTRY0(q, k,
/// v, dout, stats, packed, n)` over `n·l` query rows writes each query's log-sum-exp and
/// `D = Σ p·(dout·v)` into `stats` (`2·n·l` values of [`stats_dtype`]) and its `dq` into
/// `packed`; `ENTRY1(q, k, v, dout, stats, packed, n)` over `n·s` key rows writes `dk` and
/// `dv`. With [`AttentionMask::Given`] every entry point takes the mask (`const unsigned
/// char*`, `[n, l, s]`) after `n`.
///
/// # Panics
/// For a dtype that is not a float (the runtime sends only floats).
pub fn attention(dtype: DType, d: &AttentionShape, grad: bool) -> LibraryKernel {
    assert!(dtype.is_float(), "attention kernels take floats, got {dtype}");
    let f64s = dtype == DType::F64;
    let c = Ctx {
        t: storage_type(dtype),
        c: compute_type(dtype),
        stats: compute_type(stats_dtype(dtype)),
        exp: if f64s { "exp" } else { "expf" },
        log: if f64s { "log" } else { "logf" },
        inf: if f64s { "k_infd()" } else { "k_inff()" },
        dtype,
        d: *d,
        scale: format!("({}){:e}", compute_type(dtype), d.scale),
    };
    let mut src = helpers(&c);
    if grad {
        stats_and_dq(&mut src, &c);
        dk_dv(&mut src, &c);
        finish("attention_grad", src, 2)
    } else {
        forward(&mut src, &c);
        finish("attention", src, 1)
    }
}

/// What the entry points' sources share.
struct Ctx {
    /// Storage and compute types, and the statistics' type.
    t: &'static str,
    c: &'static str,
    stats: &'static str,
    exp: &'static str,
    log: &'static str,
    /// Infinity in the compute type (the prelude's).
    inf: &'static str,
    dtype: DType,
    d: AttentionShape,
    /// The score scale as a literal of the compute type.
    scale: String,
}

/// The keys a query sees, the warp sum, and per side (`_e` for query/key features, `_v` for
/// value features): a row into registers, a register row's dot product with a stored row,
/// and with another register row.
fn helpers(c: &Ctx) -> String {
    let Ctx { t, c: ct, .. } = *c;
    let AttentionShape { l, s, e, ev, mask, .. } = c.d;
    let mut src = String::new();
    // The formulas of `AttentionMask::keys_of` and `first_query`.
    let (keys, first) = match mask {
        AttentionMask::None | AttentionMask::Given => (format!("{s}LL"), "0".to_string()),
        AttentionMask::Causal => {
            (format!("i + 1 < {s}LL ? i + 1 : {s}LL"), format!("j < {l}LL ? j : {l}LL"))
        }
        AttentionMask::CausalLowerRight => (
            format!(
                "i + {}LL < 0 ? 0 : (i + {}LL < {s}LL ? i + {}LL : {s}LL)",
                1 + s as i64 - l as i64,
                1 + s as i64 - l as i64,
                1 + s as i64 - l as i64
            ),
            format!(
                "j + {}LL < 0 ? 0 : (j + {}LL < {l}LL ? j + {}LL : {l}LL)",
                l as i64 - s as i64,
                l as i64 - s as i64,
                l as i64 - s as i64
            ),
        ),
    };
    let _ = writeln!(
        src,
        "__device__ __forceinline__ long long keys_of(long long i) {{ return {keys}; }}"
    );
    let _ = writeln!(
        src,
        "__device__ __forceinline__ long long first_query(long long j) {{ return {first}; }}"
    );
    let sees = match mask {
        AttentionMask::Given => format!("mask[(b * {l}LL + i) * {s}LL + j] != 0"),
        _ => "true".to_string(),
    };
    let _ = writeln!(
        src,
        "__device__ __forceinline__ bool k_sees(const unsigned char* mask, long long b, long long i, long long j) {{ return {sees}; }}"
    );
    let _ = writeln!(
        src,
        "__device__ __forceinline__ {ct} k_wsum({ct} x) {{ for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o); return x; }}"
    );
    for (side, len) in [("e", e), ("v", ev)] {
        let chunks = len.div_ceil(THREADS_PER_ROW).max(1);
        let at = load(c.dtype, "p[c]");
        let _ = writeln!(src, "#define K_CHUNKS_{side} {chunks}");
        let _ = writeln!(
            src,
            "__device__ __forceinline__ void k_row_{side}({ct}* r, const {t}* p, int lane) {{ for (int u = 0; u < {chunks}; u++) {{ int c = lane + 32 * u; r[u] = c < {len} ? ({ct}){at} : ({ct})0; }} }}"
        );
        let _ = writeln!(
            src,
            "__device__ __forceinline__ {ct} k_dot_{side}(const {ct}* r, const {t}* p, int lane) {{ {ct} acc = 0; for (int u = 0; u < {chunks}; u++) {{ int c = lane + 32 * u; if (c < {len}) acc += r[u] * ({ct}){at}; }} return k_wsum(acc); }}"
        );
        let _ = writeln!(
            src,
            "__device__ __forceinline__ {ct} k_dot2_{side}(const {ct}* a, const {ct}* b) {{ {ct} acc = 0; for (int u = 0; u < {chunks}; u++) acc += a[u] * b[u]; return k_wsum(acc); }}"
        );
    }
    src
}

/// Opens the warp-per-row loop over `n` rows (`row`, with `lane`).
const ROWS: &str = "  const int lane = threadIdx.x & 31;\n  for (long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; row < n; row += ((long long)gridDim.x * blockDim.x) >> 5) {\n";

/// Opens the warp-per-row loop over query rows: `row`, `lane`, the batch entry `b`, the
/// query `i`, the keys it sees, and the entry's keys `kb` and values `vb`.
fn open_query_rows(src: &mut String, c: &Ctx) {
    let AttentionShape { l, e, s, ev, .. } = c.d;
    let t = c.t;
    src.push_str(ROWS);
    let _ = writeln!(
        src,
        "    long long b = row / {l}LL, i = row % {l}LL, keys = keys_of(i);\n    const {t}* kb = k + b * {}LL; const {t}* vb = v + b * {}LL;",
        s * e,
        s * ev
    );
}

/// Declares an online softmax's running maximum `m`, which starts at the row's first score
/// (every row with keys has one; with a given mask, whose first key may be hidden, at
/// `-inf`), and its running sum.
fn start_online_softmax(src: &mut String, c: &Ctx) {
    let (ct, scale) = (c.c, &c.scale);
    let first = match c.d.mask {
        AttentionMask::Given => format!("-{}", c.inf),
        _ => format!("keys > 0 ? k_dot_e(qr, kb, lane) * {scale} : ({ct})0"),
    };
    let _ = writeln!(src, "    {ct} m = {first}, sum = 0;");
}

/// The arguments after `n`: the given mask.
fn mask_arg(c: &Ctx) -> &'static str {
    match c.d.mask {
        AttentionMask::Given => ", const unsigned char* __restrict__ mask",
        _ => "",
    }
}

/// Opens a loop over the keys `j` query `i` of entry `b` sees.
fn key_loop(src: &mut String, then: &str) {
    let _ = write!(
        src,
        "    for (long long j = 0; j < keys; j++) {{ if (!k_sees(mask, b, i, j)) continue; {then}"
    );
}

/// Stores register row `r` (side `side`, `len` features) at `base + c`.
fn store_row(src: &mut String, c: &Ctx, side: &str, len: usize, r: &str, base: &str) {
    let v = store(c.dtype, &format!("{r}[u]"));
    let _ = writeln!(
        src,
        "    for (int u = 0; u < K_CHUNKS_{side}; u++) {{ int c = lane + 32 * u; if (c < {len}) {base} + c] = {v}; }}"
    );
}

/// The kernel's opening line and, without a given mask, a null `mask` for `k_sees`.
fn open_kernel(src: &mut String, c: &Ctx, entry: usize, args: &str) {
    let _ = writeln!(
        src,
        "extern \"C\" __global__ void ENTRY{entry}({args}, long long n{}) {{",
        mask_arg(c)
    );
    if c.d.mask != AttentionMask::Given {
        src.push_str("  const unsigned char* mask = 0;\n");
    }
}

/// The forward entry point: an online softmax over the row's keys.
fn forward(src: &mut String, c: &Ctx) {
    let Ctx { t, c: ct, exp, .. } = *c;
    let AttentionShape { e, ev, .. } = c.d;
    let scale = &c.scale;
    open_kernel(
        src,
        c,
        0,
        &format!(
            "const {t}* __restrict__ q, const {t}* __restrict__ k, const {t}* __restrict__ v, {t}* __restrict__ out"
        ),
    );
    open_query_rows(src, c);
    let _ = writeln!(
        src,
        "    {ct} qr[K_CHUNKS_e], acc[K_CHUNKS_v]; k_row_e(qr, q + row * {e}LL, lane);\n    for (int u = 0; u < K_CHUNKS_v; u++) acc[u] = 0;"
    );
    start_online_softmax(src, c);
    key_loop(src, "\n");
    let _ = writeln!(src, "      {ct} sc = k_dot_e(qr, kb + j * {e}LL, lane) * {scale};");
    let _ =
        writeln!(src, "      {ct} mn = sc > m ? sc : m, corr = {exp}(m - mn), p = {exp}(sc - mn);");
    let _ = writeln!(src, "      sum = sum * corr + p; m = mn;");
    let at = load(c.dtype, &format!("vb[j * {ev}LL + c]"));
    let _ = writeln!(
        src,
        "      for (int u = 0; u < K_CHUNKS_v; u++) {{ int c = lane + 32 * u; if (c < {ev}) acc[u] = acc[u] * corr + p * ({ct}){at}; }}"
    );
    // A query that sees no key gives zeros (PyTorch's safe softmax).
    src.push_str(
        "    }\n    for (int u = 0; u < K_CHUNKS_v; u++) acc[u] = sum > 0 ? acc[u] / sum : 0;\n",
    );
    store_row(src, c, "v", ev, "acc", &format!("out[row * {ev}LL"));
    src.push_str("  }\n}\n");
}

/// The arguments of both gradient entry points, before `n`.
fn grad_args(c: &Ctx) -> String {
    let Ctx { t, stats, .. } = *c;
    format!(
        "const {t}* __restrict__ q, const {t}* __restrict__ k, const {t}* __restrict__ v, const {t}* __restrict__ dout, {stats}* __restrict__ stats, {t}* __restrict__ packed"
    )
}

/// Per query row: the log-sum-exp, `D = Σ_j p_ij (dout_i · v_j)`, then
/// `dq_i = scale Σ_j p_ij (dout_i · v_j - D_i) k_j`. A query that sees no key keeps a
/// log-sum-exp of `-inf` and no gradient.
fn stats_and_dq(src: &mut String, c: &Ctx) {
    let Ctx { c: ct, exp, log, .. } = *c;
    let AttentionShape { l, e, s, ev, .. } = c.d;
    let scale = &c.scale;
    let per = l * e + s * e + s * ev;
    open_kernel(src, c, 0, &grad_args(c));
    open_query_rows(src, c);
    let _ = writeln!(
        src,
        "    {ct} qr[K_CHUNKS_e], gr[K_CHUNKS_v], acc[K_CHUNKS_e]; k_row_e(qr, q + row * {e}LL, lane); k_row_v(gr, dout + row * {ev}LL, lane);"
    );
    start_online_softmax(src, c);
    key_loop(src, "");
    let _ = writeln!(
        src,
        "{ct} sc = k_dot_e(qr, kb + j * {e}LL, lane) * {scale}; {ct} mn = sc > m ? sc : m; sum = sum * {exp}(m - mn) + {exp}(sc - mn); m = mn; }}"
    );
    let _ = writeln!(src, "    {ct} lse = sum > 0 ? m + {log}(sum) : -{}, dd = 0;", c.inf);
    key_loop(src, "");
    let _ = writeln!(
        src,
        "dd += {exp}(k_dot_e(qr, kb + j * {e}LL, lane) * {scale} - lse) * k_dot_v(gr, vb + j * {ev}LL, lane); }}"
    );
    src.push_str("    if (lane == 0) { stats[2 * row] = lse; stats[2 * row + 1] = dd; }\n");
    src.push_str("    for (int u = 0; u < K_CHUNKS_e; u++) acc[u] = 0;\n");
    key_loop(src, "\n");
    let _ = writeln!(
        src,
        "      {ct} p = {exp}(k_dot_e(qr, kb + j * {e}LL, lane) * {scale} - lse), ds = p * (k_dot_v(gr, vb + j * {ev}LL, lane) - dd) * {scale};"
    );
    let at = load(c.dtype, &format!("kb[j * {e}LL + c]"));
    let _ = writeln!(
        src,
        "      for (int u = 0; u < K_CHUNKS_e; u++) {{ int c = lane + 32 * u; if (c < {e}) acc[u] += ds * ({ct}){at}; }}"
    );
    src.push_str("    }\n");
    store_row(src, c, "e", e, "acc", &format!("packed[b * {per}LL + i * {e}LL"));
    src.push_str("  }\n}\n");
}

/// Per key row: `dk_j = scale Σ_i p_ij (dp_ij - D_i) q_i` and `dv_j = Σ_i p_ij dout_i`.
fn dk_dv(src: &mut String, c: &Ctx) {
    let Ctx { c: ct, exp, .. } = *c;
    let AttentionShape { l, e, s, ev, .. } = c.d;
    let scale = &c.scale;
    let per = l * e + s * e + s * ev;
    open_kernel(src, c, 1, &grad_args(c));
    src.push_str(ROWS);
    let _ = writeln!(src, "    long long b = row / {s}LL, j = row % {s}LL;");
    let _ = writeln!(
        src,
        "    {ct} kr[K_CHUNKS_e], vr[K_CHUNKS_v], dk[K_CHUNKS_e], dv[K_CHUNKS_v], ql[K_CHUNKS_e], gl[K_CHUNKS_v];\n    k_row_e(kr, k + row * {e}LL, lane); k_row_v(vr, v + row * {ev}LL, lane);\n    for (int u = 0; u < K_CHUNKS_e; u++) dk[u] = 0;\n    for (int u = 0; u < K_CHUNKS_v; u++) dv[u] = 0;"
    );
    // A causal key is seen by the queries from `first_query(j)` on.
    let _ = writeln!(src, "    for (long long i = first_query(j); i < {l}LL; i++) {{");
    src.push_str("      if (j >= keys_of(i) || !k_sees(mask, b, i, j)) continue;\n");
    let _ = writeln!(
        src,
        "      long long qrow = b * {l}LL + i; k_row_e(ql, q + qrow * {e}LL, lane); k_row_v(gl, dout + qrow * {ev}LL, lane);"
    );
    let _ = writeln!(
        src,
        "      {ct} p = {exp}(k_dot2_e(kr, ql) * {scale} - stats[2 * qrow]), ds = p * (k_dot2_v(vr, gl) - stats[2 * qrow + 1]) * {scale};"
    );
    src.push_str("      for (int u = 0; u < K_CHUNKS_e; u++) dk[u] += ds * ql[u];\n");
    src.push_str("      for (int u = 0; u < K_CHUNKS_v; u++) dv[u] += p * gl[u];\n    }\n");
    store_row(src, c, "e", e, "dk", &format!("packed[b * {per}LL + {}LL + j * {e}LL", l * e));
    store_row(
        src,
        c,
        "v",
        ev,
        "dv",
        &format!("packed[b * {per}LL + {}LL + j * {ev}LL", l * e + s * e),
    );
    src.push_str("  }\n}\n");
}
