//! The CUDA C of fused attention (`Op::Attention`) and its gradients (`Op::AttentionGrad`)
//! for dense `f32`/`f64` operands `q [n, l, e]`, `k [n, s, e]`, `v [n, s, ev]`. One thread
//! per query row (forward, row statistics, `dq`) or per key row (`dk`, `dv`), each walking
//! the other side's rows with an online softmax and accumulating in registers, so no
//! `l × s` matrix exists. Sizes are constants in the source, as in the other library
//! kernels.

use std::fmt::Write as _;

use kiln_ir::DType;

use super::library::{LibraryKernel, finish};

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
    /// Keys after the query are masked.
    pub causal: bool,
    /// The score scale.
    pub scale: f64,
}

/// Entry points, in launch order. Forward: `ENTRY0(q, k, v, out, n)` over `n·l` rows.
/// Gradients: `ENTRY0(q, k, v, dout, stats, n)` writes each query's log-sum-exp and
/// `D = Σ p·(dout·v)` into `stats` (`2·n·l` accumulators); `ENTRY1(q, k, v, dout, stats,
/// packed, n)` writes `dq` over `n·l` rows; `ENTRY2(q, k, v, dout, stats, packed, n)` writes
/// `dk` and `dv` over `n·s` rows.
///
/// # Panics
/// For a dtype other than `f32` or `f64` (the runtime sends only those).
pub fn attention(dtype: DType, d: &AttentionShape, grad: bool) -> LibraryKernel {
    let (t, exp, log) = match dtype {
        DType::F32 => ("float", "expf", "logf"),
        DType::F64 => ("double", "exp", "log"),
        other => panic!("attention kernels take f32 or f64, got {other}"),
    };
    let AttentionShape { l, e, s, ev, causal, scale, .. } = *d;
    let mut src = String::new();
    // The keys row `i` sees, and the score of query row `qi` against key row `kj`.
    let _ = writeln!(
        src,
        "__device__ __forceinline__ long long keys_of(long long i) {{ return {}; }}",
        if causal { format!("(i + 1 < {s}LL ? i + 1 : {s}LL)") } else { format!("{s}LL") }
    );
    let _ = writeln!(
        src,
        "__device__ __forceinline__ {t} score(const {t}* qi, const {t}* kj) {{ {t} acc = 0; for (int c = 0; c < {e}; c++) acc += qi[c] * kj[c]; return acc * ({t}){scale:e}; }}"
    );
    let _ = writeln!(
        src,
        "__device__ __forceinline__ {t} dot_v(const {t}* g, const {t}* vj) {{ {t} acc = 0; for (int c = 0; c < {ev}; c++) acc += g[c] * vj[c]; return acc; }}"
    );
    let rows = "  for (long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x; row < n; row += (long long)gridDim.x * blockDim.x) {\n    long long b = row / {L}LL, i = row % {L}LL;\n".replace("{L}", &l.to_string());
    let pointers = format!(
        "    const {t}* qi = q + row * {e}LL; const {t}* kb = k + b * {}LL; const {t}* vb = v + b * {}LL;\n",
        s * e,
        s * ev
    );
    if !grad {
        return forward(src, &Ctx { t, exp, l, e, s, ev, rows, pointers });
    }
    gradients(src, &Ctx { t, exp, l, e, s, ev, rows, pointers }, log, causal, scale)
}

/// What the entry points' sources share.
struct Ctx<'a> {
    t: &'a str,
    exp: &'a str,
    l: usize,
    e: usize,
    s: usize,
    ev: usize,
    /// Opens the grid-stride loop over query rows, with `b` and `i`.
    rows: String,
    /// The query row and the entry's keys and values.
    pointers: String,
}

/// The forward entry point.
fn forward(mut src: String, c: &Ctx<'_>) -> LibraryKernel {
    let Ctx { t, exp, e, ev, .. } = *c;
    let _ = writeln!(
        src,
        "extern \"C\" __global__ void ENTRY0(const {t}* __restrict__ q, const {t}* __restrict__ k, const {t}* __restrict__ v, {t}* __restrict__ out, long long n) {{"
    );
    src.push_str(&c.rows);
    src.push_str(&c.pointers);
    let _ = writeln!(src, "    {t} acc[{ev}]; for (int c = 0; c < {ev}; c++) acc[c] = 0;");
    // The running maximum starts at the first score (every row with keys has one).
    let _ = writeln!(src, "    {t} m = keys_of(i) > 0 ? score(qi, kb) : ({t})0, sum = 0;");
    let _ = writeln!(src, "    for (long long j = 0; j < keys_of(i); j++) {{");
    let _ = writeln!(src, "      {t} sc = score(qi, kb + j * {e}LL);");
    let _ =
        writeln!(src, "      {t} mn = sc > m ? sc : m, corr = {exp}(m - mn), p = {exp}(sc - mn);");
    let _ = writeln!(src, "      sum = sum * corr + p; m = mn;");
    let _ = writeln!(
        src,
        "      for (int c = 0; c < {ev}; c++) acc[c] = acc[c] * corr + p * vb[j * {ev}LL + c];"
    );
    src.push_str("    }\n");
    let _ =
        writeln!(src, "    for (int c = 0; c < {ev}; c++) out[row * {ev}LL + c] = acc[c] / sum;");
    src.push_str("  }\n}\n");
    finish("attention", src, 1)
}

/// The three gradient entry points.
fn gradients(mut src: String, c: &Ctx<'_>, log: &str, causal: bool, scale: f64) -> LibraryKernel {
    let Ctx { t, exp, l, e, s, ev, .. } = *c;
    let (rows, pointers) = (&c.rows, &c.pointers);
    let per = l * e + s * e + s * ev;
    let args = format!(
        "const {t}* __restrict__ q, const {t}* __restrict__ k, const {t}* __restrict__ v, const {t}* __restrict__ dout, {t}* __restrict__ stats"
    );
    // Row statistics: the log-sum-exp, then D = Σ_j p_ij (dout_i · v_j).
    let _ = writeln!(src, "extern \"C\" __global__ void ENTRY0({args}, long long n) {{");
    src.push_str(rows);
    src.push_str(pointers);
    let _ = writeln!(src, "    const {t}* gi = dout + row * {ev}LL;");
    let _ = writeln!(src, "    {t} m = keys_of(i) > 0 ? score(qi, kb) : ({t})0, sum = 0;");
    let _ = writeln!(
        src,
        "    for (long long j = 0; j < keys_of(i); j++) {{ {t} sc = score(qi, kb + j * {e}LL); {t} mn = sc > m ? sc : m; sum = sum * {exp}(m - mn) + {exp}(sc - mn); m = mn; }}"
    );
    let _ = writeln!(src, "    {t} lse = m + {log}(sum), dd = 0;");
    let _ = writeln!(
        src,
        "    for (long long j = 0; j < keys_of(i); j++) dd += {exp}(score(qi, kb + j * {e}LL) - lse) * dot_v(gi, vb + j * {ev}LL);"
    );
    src.push_str("    stats[2 * row] = lse; stats[2 * row + 1] = dd;\n  }\n}\n");
    // dq_i = scale Σ_j p_ij (dp_ij - D_i) k_j.
    let _ = writeln!(
        src,
        "extern \"C\" __global__ void ENTRY1({args}, {t}* __restrict__ packed, long long n) {{"
    );
    src.push_str(rows);
    src.push_str(pointers);
    let _ = writeln!(
        src,
        "    const {t}* gi = dout + row * {ev}LL; {t} lse = stats[2 * row], dd = stats[2 * row + 1];"
    );
    let _ = writeln!(src, "    {t} acc[{e}]; for (int c = 0; c < {e}; c++) acc[c] = 0;");
    let _ = writeln!(src, "    for (long long j = 0; j < keys_of(i); j++) {{");
    let _ = writeln!(
        src,
        "      {t} p = {exp}(score(qi, kb + j * {e}LL) - lse), ds = p * (dot_v(gi, vb + j * {ev}LL) - dd) * ({t}){scale:e};"
    );
    let _ = writeln!(src, "      for (int c = 0; c < {e}; c++) acc[c] += ds * kb[j * {e}LL + c];");
    src.push_str("    }\n");
    let _ = writeln!(
        src,
        "    for (int c = 0; c < {e}; c++) packed[b * {per}LL + i * {e}LL + c] = acc[c];"
    );
    src.push_str("  }\n}\n");
    // dk_j = scale Σ_i p_ij (dp_ij - D_i) q_i and dv_j = Σ_i p_ij dout_i, one thread per key.
    let _ = writeln!(
        src,
        "extern \"C\" __global__ void ENTRY2({args}, {t}* __restrict__ packed, long long n) {{"
    );
    let _ = writeln!(
        src,
        "  for (long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x; row < n; row += (long long)gridDim.x * blockDim.x) {{\n    long long b = row / {s}LL, j = row % {s}LL;"
    );
    let _ = writeln!(src, "    const {t}* kj = k + row * {e}LL; const {t}* vj = v + row * {ev}LL;");
    let _ = writeln!(
        src,
        "    {t} dk[{e}], dv[{ev}]; for (int c = 0; c < {e}; c++) dk[c] = 0; for (int c = 0; c < {ev}; c++) dv[c] = 0;"
    );
    let first = if causal { "j" } else { "0" };
    let _ = writeln!(src, "    for (long long i = {first}; i < {l}LL; i++) {{");
    let _ = writeln!(src, "      if (j >= keys_of(i)) continue;");
    let _ = writeln!(
        src,
        "      long long qrow = b * {l}LL + i; const {t}* qi = q + qrow * {e}LL; const {t}* gi = dout + qrow * {ev}LL;"
    );
    let _ = writeln!(
        src,
        "      {t} p = {exp}(score(qi, kj) - stats[2 * qrow]), ds = p * (dot_v(gi, vj) - stats[2 * qrow + 1]) * ({t}){scale:e};"
    );
    let _ = writeln!(src, "      for (int c = 0; c < {e}; c++) dk[c] += ds * qi[c];");
    let _ = writeln!(src, "      for (int c = 0; c < {ev}; c++) dv[c] += p * gi[c];");
    src.push_str("    }\n");
    let _ = writeln!(
        src,
        "    for (int c = 0; c < {e}; c++) packed[b * {per}LL + {}LL + j * {e}LL + c] = dk[c];",
        l * e
    );
    let _ = writeln!(
        src,
        "    for (int c = 0; c < {ev}; c++) packed[b * {per}LL + {}LL + j * {ev}LL + c] = dv[c];",
        l * e + s * e
    );
    src.push_str("  }\n}\n");
    finish("attention_grad", src, 3)
}
