//! Fused attention on the CPU, flash-attention style: queries in tiles of `ROWS` against
//! keys in tiles of `COLS`, with a running maximum and sum per query (an online softmax),
//! so that memory stays `O(tile²)` per thread instead of `O(L·S)`. The backward pass
//! recomputes the scores tile by tile: one pass for each query's log-sum-exp and
//! `D = dout·out`, then the gradients: per batch entry (`dq`, `dk`, `dv` together) when
//! there are as many entries as threads, else one pass over query tiles for `dq` and one
//! over key tiles for `dk` and `dv` (so no two threads write the same gradient row). When
//! every query's keys fit one tile, the softmax of a row is exact in one go and a single
//! pass does it all.

use std::ops::{Add, AddAssign, Div, Mul, MulAssign, Sub};

use rayon::prelude::*;

const ROWS: usize = 32;
const COLS: usize = 64;

/// The float types the kernels run in.
pub(crate) trait Real:
    Copy
    + Send
    + Sync
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + AddAssign
    + MulAssign
    + 'static
{
    const ZERO: Self;
    const NEG_INF: Self;
    fn exp(self) -> Self;
    /// `exp` as straight-line arithmetic, so loops over it vectorize (f32: Cephes' `expf`
    /// polynomial, within 2 ulp; f64: the library's).
    fn exp_fast(self) -> Self;
    fn ln(self) -> Self;
    fn of(v: f64) -> Self;
}

macro_rules! real {
    ($t:ty, $fast:expr) => {
        impl Real for $t {
            const ZERO: $t = 0.0;
            const NEG_INF: $t = <$t>::NEG_INFINITY;
            fn exp(self) -> $t {
                <$t>::exp(self)
            }
            #[inline(always)]
            fn exp_fast(self) -> $t {
                $fast(self)
            }
            fn ln(self) -> $t {
                <$t>::ln(self)
            }
            fn of(v: f64) -> $t {
                v as $t
            }
        }
    };
}
real!(f32, exp_f32);
real!(f64, f64::exp);

/// `e^x` for f32 by range reduction `x = n·ln2 + r` and a degree-6 polynomial in `r`.
/// Inputs below -87.3 (including -∞) give about 1e-38, not 0: every caller multiplies
/// such a value into a zero sum or weighs it against a far larger one.
#[inline(always)]
fn exp_f32(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.3, 88.7);
    // Round to nearest with the 1.5·2²³ trick (no `round` call, which is a library call
    // without SSE4.1).
    const MAGIC: f32 = 12_582_912.0;
    let n = (x * std::f32::consts::LOG2_E + MAGIC) - MAGIC;
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// The sizes of one attention problem: `q [n, l, e]`, `k [n, s, e]`, `v [n, s, ev]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub(crate) n: usize,
    pub(crate) l: usize,
    pub(crate) e: usize,
    pub(crate) s: usize,
    pub(crate) ev: usize,
    pub(crate) causal: bool,
    pub(crate) scale: f64,
}

impl Dims {
    /// The keys query `row` sees: `0..end`.
    fn keys_of(&self, row: usize) -> usize {
        if self.causal { (row + 1).min(self.s) } else { self.s }
    }
}

/// Rows `c0..c1` of `x` (`width` columns) transposed into `out[col * COLS + row]`.
#[inline(always)]
fn transpose_tile<T: Real>(x: &[T], width: usize, c0: usize, c1: usize, out: &mut [T]) {
    for (cc, row) in x[c0 * width..c1 * width].chunks_exact(width).enumerate() {
        for (f, &v) in row.iter().enumerate() {
            out[f * COLS + cc] = v;
        }
    }
}

/// `scores[cc] = scale · q_row · k[c0 + cc]` for every key of a tile whose keys are
/// transposed in `kt` (`[e][COLS]`). The whole tile width is computed, with fixed-size
/// rows, so the compiler keeps the row of accumulators in registers; columns past the
/// tile's keys (or a row's causal limit) are computed from unused data and never read.
#[inline(always)]
fn scores<T: Real>(q_row: &[T], kt: &[T], scale: T, out: &mut [T]) {
    let out: &mut [T; COLS] = (&mut out[..COLS]).try_into().expect("a tile row");
    *out = [T::ZERO; COLS];
    for (f, &qv) in q_row.iter().enumerate() {
        let qv = qv * scale;
        let krow: &[T; COLS] = kt[f * COLS..(f + 1) * COLS].try_into().expect("a tile row");
        for (s, &kv) in out.iter_mut().zip(krow) {
            *s += qv * kv;
        }
    }
}

#[inline(always)]
fn forward_tile<T: Real>(
    q: &[T],
    k: &[T],
    v: &[T],
    d: &Dims,
    b: usize,
    r0: usize,
    r1: usize,
) -> (Vec<T>, Vec<T>) {
    let (e, ev) = (d.e, d.ev);
    let scale = T::of(d.scale);
    let (q, k, v) = (&q[b * d.l * e..], &k[b * d.s * e..], &v[b * d.s * ev..]);
    let rows = r1 - r0;
    let mut m = vec![T::NEG_INF; rows];
    let mut sum = vec![T::ZERO; rows];
    let mut acc = vec![T::ZERO; rows * ev];
    let mut kt = vec![T::ZERO; e * COLS];
    let mut srow = vec![T::ZERO; COLS];
    let key_end = d.keys_of(r1 - 1);
    for c0 in (0..key_end).step_by(COLS) {
        let c1 = (c0 + COLS).min(key_end);
        transpose_tile(k, e, c0, c1, &mut kt);
        for r in r0..r1 {
            let end = d.keys_of(r).min(c1);
            if end <= c0 {
                continue;
            }
            let w = end - c0;
            let i = r - r0;
            scores(&q[r * e..(r + 1) * e], &kt, scale, &mut srow);
            let tile_max =
                srow[..w].iter().copied().fold(T::NEG_INF, |a, b| if b > a { b } else { a });
            let m_new = if tile_max > m[i] { tile_max } else { m[i] };
            let correction = (m[i] - m_new).exp();
            sum[i] *= correction;
            let out = &mut acc[i * ev..(i + 1) * ev];
            out.iter_mut().for_each(|o| *o *= correction);
            srow[..w].iter_mut().for_each(|x| *x = (*x - m_new).exp_fast());
            for (cc, &p) in srow[..w].iter().enumerate() {
                sum[i] += p;
                for (o, &vv) in out.iter_mut().zip(&v[(c0 + cc) * ev..(c0 + cc + 1) * ev]) {
                    *o += p * vv;
                }
            }
            m[i] = m_new;
        }
    }
    let mut lse = vec![T::ZERO; rows];
    for i in 0..rows {
        acc[i * ev..(i + 1) * ev].iter_mut().for_each(|o| *o = *o / sum[i]);
        lse[i] = m[i] + sum[i].ln();
    }
    (acc, lse)
}

/// Whether the CPU runs the AVX2 + FMA copies of the tile functions.
fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Defines `$fast`, which runs `$name` compiled for AVX2 and FMA (its body, marked
/// `#[inline(always)]`, is inlined into a function with those features) when the CPU has
/// them, else for the baseline.
macro_rules! dispatch {
    ($fast:ident, $name:path, ($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        fn $fast<T: Real>($($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2<T: Real>($($arg: $ty),*) -> $ret {
                    $name($($arg),*)
                }
                if has_avx2() {
                    // SAFETY: the CPU has AVX2 and FMA.
                    return unsafe { avx2($($arg),*) };
                }
            }
            $name($($arg),*)
        }
    };
}

dispatch!(forward_tile_fast, forward_tile, (q: &[T], k: &[T], v: &[T], d: &Dims, b: usize, r0: usize, r1: usize) -> (Vec<T>, Vec<T>));
dispatch!(short_entry_fast, short_entry, (q: &[T], k: &[T], v: &[T], dout: &[T], d: &Dims, b: usize, packed: &mut [T]) -> ());
dispatch!(dq_tile_fast, Grad::dq_tile, (g: &Grad<'_, T>, b: usize, r0: usize, r1: usize) -> Vec<T>);
dispatch!(entry_fast, Grad::entry, (g: &Grad<'_, T>, b: usize, packed: &mut [T]) -> ());
dispatch!(dkv_tile_fast, Grad::dkv_tile, (g: &Grad<'_, T>, b: usize, c0: usize, c1: usize) -> (Vec<T>, Vec<T>));

/// Query tiles of every batch entry: `(b, r0, r1)`.
fn query_tiles(d: &Dims) -> Vec<(usize, usize, usize)> {
    (0..d.n)
        .flat_map(|b| (0..d.l).step_by(ROWS).map(move |r0| (b, r0, (r0 + ROWS).min(d.l))))
        .collect()
}

/// `softmax(q·kᵀ·scale)·v` as `[n, l, ev]`.
pub(crate) fn forward<T: Real>(q: &[T], k: &[T], v: &[T], d: &Dims) -> Vec<T> {
    let tiles = query_tiles(d);
    let parts: Vec<Vec<T>> =
        tiles.par_iter().map(|&(b, r0, r1)| forward_tile_fast(q, k, v, d, b, r0, r1).0).collect();
    parts.concat()
}

/// The gradients of [`forward`] for `dout`, packed per batch entry as `[dq | dk | dv]`.
pub(crate) fn backward<T: Real>(q: &[T], k: &[T], v: &[T], dout: &[T], d: &Dims) -> Vec<T> {
    let (e, ev, l, s) = (d.e, d.ev, d.l, d.s);
    if s <= COLS {
        return backward_short(q, k, v, dout, d);
    }
    let tiles = query_tiles(d);
    let (lse, dd) = row_statistics(q, k, v, dout, d, &tiles);
    let g = Grad { q, k, v, dout, d, lse, dd, scale: T::of(d.scale) };
    let per = l * e + s * e + s * ev;
    if d.n >= rayon::current_num_threads() {
        // Enough batch entries to keep every thread busy: one pass per entry over its key
        // tiles computes dq, dk and dv together, without recomputing the scores for dq.
        let mut out = vec![T::ZERO; d.n * per];
        out.par_chunks_mut(per.max(1))
            .enumerate()
            .for_each(|(b, packed)| entry_fast(&g, b, packed));
        return out;
    }
    let dq_parts: Vec<Vec<T>> =
        tiles.par_iter().map(|&(b, r0, r1)| dq_tile_fast(&g, b, r0, r1)).collect();
    let key_tiles: Vec<(usize, usize, usize)> = (0..d.n)
        .flat_map(|b| (0..s).step_by(COLS).map(move |c0| (b, c0, (c0 + COLS).min(s))))
        .collect();
    let dkv_parts: Vec<(Vec<T>, Vec<T>)> =
        key_tiles.par_iter().map(|&(b, c0, c1)| dkv_tile_fast(&g, b, c0, c1)).collect();
    let mut out = vec![T::ZERO; d.n * per];
    for (&(b, r0, _), dq) in tiles.iter().zip(&dq_parts) {
        let at = b * per + r0 * e;
        out[at..at + dq.len()].copy_from_slice(dq);
    }
    for (&(b, c0, _), (dk, dv)) in key_tiles.iter().zip(&dkv_parts) {
        let at = b * per + l * e + c0 * e;
        out[at..at + dk.len()].copy_from_slice(dk);
        let at = b * per + l * e + s * e + c0 * ev;
        out[at..at + dv.len()].copy_from_slice(dv);
    }
    out
}

/// [`backward`] when every query's keys fit one tile: each row's softmax is then exact in
/// one go, so one pass per batch entry computes `dq`, `dk` and `dv` without the passes that
/// recompute the forward.
fn backward_short<T: Real>(q: &[T], k: &[T], v: &[T], dout: &[T], d: &Dims) -> Vec<T> {
    let per = d.l * d.e + d.s * d.e + d.s * d.ev;
    let mut out = vec![T::ZERO; d.n * per];
    out.par_chunks_mut(per.max(1))
        .enumerate()
        .for_each(|(b, packed)| short_entry_fast(q, k, v, dout, d, b, packed));
    out
}

/// The packed gradients of batch entry `b` when its keys fit one tile.
#[inline(always)]
fn short_entry<T: Real>(
    q: &[T],
    k: &[T],
    v: &[T],
    dout: &[T],
    d: &Dims,
    b: usize,
    packed: &mut [T],
) {
    let (l, e, s, ev) = (d.l, d.e, d.s, d.ev);
    let scale = T::of(d.scale);
    let (qb, kb, vb, gb) =
        (&q[b * l * e..], &k[b * s * e..], &v[b * s * ev..], &dout[b * l * ev..]);
    let (mut kt, mut vt) = (vec![T::ZERO; e * COLS], vec![T::ZERO; ev * COLS]);
    transpose_tile(kb, e, 0, s, &mut kt);
    transpose_tile(vb, ev, 0, s, &mut vt);
    let (dq, rest) = packed.split_at_mut(l * e);
    let (dk, dv) = rest.split_at_mut(s * e);
    let (mut p, mut ds) = (vec![T::ZERO; COLS], vec![T::ZERO; COLS]);
    for r in 0..l {
        let w = d.keys_of(r);
        if w == 0 {
            continue;
        }
        let (qrow, grow) = (&qb[r * e..(r + 1) * e], &gb[r * ev..(r + 1) * ev]);
        scores(qrow, &kt, scale, &mut p);
        let m = p[..w].iter().copied().fold(T::NEG_INF, |a, x| if x > a { x } else { a });
        p[..w].iter_mut().for_each(|x| *x = (*x - m).exp_fast());
        let total = p[..w].iter().fold(T::ZERO, |a, &x| a + x);
        p[..w].iter_mut().for_each(|x| *x = *x / total);
        ds[..w].iter_mut().for_each(|x| *x = T::ZERO);
        for (f, &g) in grow.iter().enumerate() {
            for (x, &vv) in ds[..w].iter_mut().zip(&vt[f * COLS..f * COLS + w]) {
                *x += g * vv;
            }
        }
        let dd = p[..w].iter().zip(&ds[..w]).fold(T::ZERO, |a, (&pp, &x)| a + pp * x);
        for (x, &pp) in ds[..w].iter_mut().zip(&p[..w]) {
            *x = pp * (*x - dd) * scale;
        }
        let dq_row = &mut dq[r * e..(r + 1) * e];
        for cc in 0..w {
            let (pp, x) = (p[cc], ds[cc]);
            for (o, &kv) in dq_row.iter_mut().zip(&kb[cc * e..(cc + 1) * e]) {
                *o += x * kv;
            }
            for (o, &qv) in dk[cc * e..(cc + 1) * e].iter_mut().zip(qrow) {
                *o += x * qv;
            }
            for (o, &g) in dv[cc * ev..(cc + 1) * ev].iter_mut().zip(grow) {
                *o += pp * g;
            }
        }
    }
}

/// Each query's log-sum-exp and `D = dout·out`, from the forward pass recomputed.
fn row_statistics<T: Real>(
    q: &[T],
    k: &[T],
    v: &[T],
    dout: &[T],
    d: &Dims,
    tiles: &[(usize, usize, usize)],
) -> (Vec<T>, Vec<T>) {
    let (l, ev) = (d.l, d.ev);
    let stats: Vec<(Vec<T>, Vec<T>)> = tiles
        .par_iter()
        .map(|&(b, r0, r1)| {
            let (out, lse) = forward_tile_fast(q, k, v, d, b, r0, r1);
            let dd = (r0..r1)
                .map(|r| {
                    let row = &dout[(b * l + r) * ev..(b * l + r + 1) * ev];
                    row.iter().zip(&out[(r - r0) * ev..]).fold(T::ZERO, |a, (&x, &y)| a + x * y)
                })
                .collect();
            (lse, dd)
        })
        .collect();
    let mut lse = vec![T::ZERO; d.n * l];
    let mut dd = vec![T::ZERO; d.n * l];
    for (&(b, r0, r1), (t_lse, t_dd)) in tiles.iter().zip(stats) {
        lse[b * l + r0..b * l + r1].copy_from_slice(&t_lse);
        dd[b * l + r0..b * l + r1].copy_from_slice(&t_dd);
    }
    (lse, dd)
}

/// What the gradient passes share.
struct Grad<'a, T> {
    q: &'a [T],
    k: &'a [T],
    v: &'a [T],
    dout: &'a [T],
    d: &'a Dims,
    lse: Vec<T>,
    dd: Vec<T>,
    scale: T,
}

impl<T: Real> Grad<'_, T> {
    /// For query row `r` of entry `b` and the first `w` keys of a tile (transposed in `kt`
    /// and `vt`): `p = exp(s - lse)` and `ds = p·(dout·v - D)`.
    #[allow(clippy::too_many_arguments, reason = "the row, the tile and two scratch rows")]
    #[inline(always)]
    fn terms(&self, b: usize, r: usize, w: usize, kt: &[T], vt: &[T], p: &mut [T], ds: &mut [T]) {
        let (l, e, ev) = (self.d.l, self.d.e, self.d.ev);
        scores(&self.q[(b * l + r) * e..(b * l + r + 1) * e], kt, self.scale, p);
        let lse = self.lse[b * l + r];
        p[..w].iter_mut().for_each(|x| *x = (*x - lse).exp_fast());
        ds[..w].iter_mut().for_each(|x| *x = T::ZERO);
        for (f, &g) in self.dout[(b * l + r) * ev..(b * l + r + 1) * ev].iter().enumerate() {
            for (x, &vv) in ds[..w].iter_mut().zip(&vt[f * COLS..f * COLS + w]) {
                *x += g * vv;
            }
        }
        let dd = self.dd[b * l + r];
        for (x, &pp) in ds[..w].iter_mut().zip(&p[..w]) {
            *x = pp * (*x - dd);
        }
    }

    /// `dq` of query rows `r0..r1` of entry `b`: `scale · Σ_j ds_ij k_j`.
    #[inline(always)]
    fn dq_tile(&self, b: usize, r0: usize, r1: usize) -> Vec<T> {
        let (e, ev, s) = (self.d.e, self.d.ev, self.d.s);
        let (kb, vb) = (&self.k[b * s * e..], &self.v[b * s * ev..]);
        let mut dq = vec![T::ZERO; (r1 - r0) * e];
        let (mut kt, mut vt) = (vec![T::ZERO; e * COLS], vec![T::ZERO; ev * COLS]);
        let (mut p, mut ds) = (vec![T::ZERO; COLS], vec![T::ZERO; COLS]);
        let key_end = self.d.keys_of(r1 - 1);
        for c0 in (0..key_end).step_by(COLS) {
            let c1 = (c0 + COLS).min(key_end);
            transpose_tile(kb, e, c0, c1, &mut kt);
            transpose_tile(vb, ev, c0, c1, &mut vt);
            for r in r0..r1 {
                let end = self.d.keys_of(r).min(c1);
                if end <= c0 {
                    continue;
                }
                let w = end - c0;
                self.terms(b, r, w, &kt, &vt, &mut p, &mut ds);
                let out = &mut dq[(r - r0) * e..(r - r0 + 1) * e];
                for (cc, &x) in ds[..w].iter().enumerate() {
                    let x = x * self.scale;
                    for (o, &kv) in out.iter_mut().zip(&kb[(c0 + cc) * e..(c0 + cc + 1) * e]) {
                        *o += x * kv;
                    }
                }
            }
        }
        dq
    }

    /// The packed `[dq | dk | dv]` of batch entry `b`, key tile by key tile: each tile's
    /// `dk` and `dv` rows and every query's share of `dq`.
    #[inline(always)]
    fn entry(&self, b: usize, packed: &mut [T]) {
        let (l, e, ev, s) = (self.d.l, self.d.e, self.d.ev, self.d.s);
        let (dq, rest) = packed.split_at_mut(l * e);
        let (dk, dv) = rest.split_at_mut(s * e);
        let mut scratch = Scratch::new(e, ev);
        for c0 in (0..s).step_by(COLS) {
            let c1 = (c0 + COLS).min(s);
            let (dk, dv) = (&mut dk[c0 * e..c1 * e], &mut dv[c0 * ev..c1 * ev]);
            self.key_tile(b, c0, c1, &mut scratch, dk, dv, Some(&mut *dq));
        }
    }

    /// `dk` and `dv` of keys `c0..c1` of entry `b`: `scale · Σ_i ds_ij q_i` and
    /// `Σ_i p_ij dout_i`.
    #[inline(always)]
    fn dkv_tile(&self, b: usize, c0: usize, c1: usize) -> (Vec<T>, Vec<T>) {
        let (e, ev) = (self.d.e, self.d.ev);
        let (mut dk, mut dv) = (vec![T::ZERO; (c1 - c0) * e], vec![T::ZERO; (c1 - c0) * ev]);
        self.key_tile(b, c0, c1, &mut Scratch::new(e, ev), &mut dk, &mut dv, None);
        (dk, dv)
    }

    /// Adds the contributions of every query row that sees keys `c0..c1` of entry `b` to
    /// those keys' `dk` and `dv` rows and, when given, to the entry's `dq`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments, reason = "the tile, its scratch and three outputs")]
    fn key_tile(
        &self,
        b: usize,
        c0: usize,
        c1: usize,
        scratch: &mut Scratch<T>,
        dk: &mut [T],
        dv: &mut [T],
        mut dq: Option<&mut [T]>,
    ) {
        let (l, e, ev, s) = (self.d.l, self.d.e, self.d.ev, self.d.s);
        let (kb, vb) = (&self.k[b * s * e..], &self.v[b * s * ev..]);
        let Scratch { kt, vt, p, ds } = scratch;
        transpose_tile(kb, e, c0, c1, kt);
        transpose_tile(vb, ev, c0, c1, vt);
        // Causal: rows before c0 see none of these keys.
        let first_row = if self.d.causal { c0 } else { 0 };
        for r in first_row..l {
            let end = self.d.keys_of(r).min(c1);
            if end <= c0 {
                continue;
            }
            let w = end - c0;
            self.terms(b, r, w, kt, vt, p, ds);
            let qrow = &self.q[(b * l + r) * e..(b * l + r + 1) * e];
            let drow = &self.dout[(b * l + r) * ev..(b * l + r + 1) * ev];
            for cc in 0..w {
                let (pp, x) = (p[cc], ds[cc] * self.scale);
                for (o, &g) in dv[cc * ev..(cc + 1) * ev].iter_mut().zip(drow) {
                    *o += pp * g;
                }
                for (o, &qv) in dk[cc * e..(cc + 1) * e].iter_mut().zip(qrow) {
                    *o += x * qv;
                }
                if let Some(dq) = dq.as_deref_mut() {
                    let key = &kb[(c0 + cc) * e..(c0 + cc + 1) * e];
                    for (o, &kv) in dq[r * e..(r + 1) * e].iter_mut().zip(key) {
                        *o += x * kv;
                    }
                }
            }
        }
    }
}

/// The per-thread rows a key tile's gradient pass works in.
struct Scratch<T> {
    kt: Vec<T>,
    vt: Vec<T>,
    p: Vec<T>,
    ds: Vec<T>,
}

impl<T: Real> Scratch<T> {
    fn new(e: usize, ev: usize) -> Scratch<T> {
        Scratch {
            kt: vec![T::ZERO; e * COLS],
            vt: vec![T::ZERO; ev * COLS],
            p: vec![T::ZERO; COLS],
            ds: vec![T::ZERO; COLS],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::exp_f32;

    #[test]
    fn the_fast_exp_is_within_two_ulp() {
        let mut worst = 0u32;
        for i in -87_000..88_000 {
            let x = i as f32 * 1e-3 + 3.7e-4;
            let (got, want) = (exp_f32(x), (f64::from(x)).exp() as f32);
            worst = worst.max(got.to_bits().abs_diff(want.to_bits()));
        }
        assert!(worst <= 2, "{worst} ulp");
        assert!(exp_f32(f32::NEG_INFINITY) < 1e-37);
        assert_eq!(exp_f32(0.0), 1.0);
    }
}
