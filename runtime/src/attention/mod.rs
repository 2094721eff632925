//! Fused attention on the CPU, flash-attention style: queries in tiles of `QT` against
//! keys in tiles of `KT`, with a running maximum and sum per query (an online softmax),
//! so that memory stays `O(tile²)` per thread instead of `O(L·S)`. Each step of a tile is
//! a few small matrix products (single-threaded `gemm` calls: threads split the tiles)
//! and row-wise softmax arithmetic in between.
//!
//! The backward pass recomputes the scores block by block: one pass for each query's
//! log-sum-exp and `D = dout·out`, then the gradients: per batch entry (`dq`, `dk`, `dv`
//! together) when there are as many entries as threads, else one pass over query tiles for
//! `dq` and one over key tiles for `dk` and `dv` (so no two threads write the same
//! gradient row). When every query's keys fit one tile, a row's softmax is exact in one go:
//! no statistics pass, and query tiles run in parallel with partial `dk`/`dv` summed after.

use std::ops::{Add, AddAssign, Div, Mul, MulAssign, Sub};

use gemm::{Parallelism, gemm};

/// Query rows per tile.
const QT: usize = 64;
/// Keys per tile (the row stride of the score scratch).
const KT: usize = 64;

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
    const ONE: Self;
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
            const ONE: $t = 1.0;
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
    let t = x * std::f32::consts::LOG2_E + MAGIC;
    let n = t - MAGIC;
    // n as an integer, read from the low bits of `t` (exact for |n| < 2²²; a float-to-int
    // cast would saturate lane by lane and keep the loop from vectorizing).
    let ni = t.to_bits().wrapping_sub(MAGIC.to_bits());
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    y * f32::from_bits(ni.wrapping_add(127) << 23)
}

/// The sizes of one attention problem: `q [n, l, e]`, `k [n, s, e]`, `v [n, s, ev]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub(crate) n: usize,
    pub(crate) l: usize,
    pub(crate) e: usize,
    pub(crate) s: usize,
    pub(crate) ev: usize,
    pub(crate) mask: kiln_ir::AttentionMask,
    pub(crate) scale: f64,
}

impl Dims {
    /// The keys query `row` may see: `0..end` (a given mask hides some of them).
    fn keys_of(&self, row: usize) -> usize {
        self.mask.keys_of(row, self.l, self.s)
    }
}

/// One block of the problem: query rows `r0..r1` against keys `c0..c1` of batch entry `b`.
#[derive(Clone, Copy, Debug)]
struct Tile {
    b: usize,
    r0: usize,
    r1: usize,
    c0: usize,
    c1: usize,
}

impl Tile {
    fn rows(&self) -> usize {
        self.r1 - self.r0
    }

    fn width(&self) -> usize {
        self.c1 - self.c0
    }

    /// How many of the tile's keys query row `r0 + i` sees (the first ones).
    fn visible(&self, d: &Dims, i: usize) -> usize {
        d.keys_of(self.r0 + i).saturating_sub(self.c0).min(self.width())
    }
}

/// A matrix held in a slice with a row and a column stride.
#[derive(Clone, Copy)]
struct Mat<'a, T> {
    data: &'a [T],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

impl<'a, T> Mat<'a, T> {
    /// A `rows × cols` row-major block whose rows are `stride` apart.
    fn block(data: &'a [T], rows: usize, cols: usize, stride: usize) -> Self {
        Mat { data, rows, cols, rs: stride, cs: 1 }
    }

    fn t(self) -> Self {
        Mat { rows: self.cols, cols: self.rows, rs: self.cs, cs: self.rs, ..self }
    }

    /// Whether every element lies inside the slice.
    fn fits(&self) -> bool {
        self.rows == 0
            || self.cols == 0
            || (self.rows - 1) * self.rs + (self.cols - 1) * self.cs < self.data.len()
    }
}

/// One operand, `[n, rows, cols]`: element `[b, r, c]` of batch entry `b` at
/// `bases[b] + r·rs + c·cs` (a dense buffer, or a view of one: the heads of a projection
/// are strided rows of it).
#[derive(Clone)]
pub(crate) struct Operand<'a, T> {
    data: &'a [T],
    bases: Vec<usize>,
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

impl<'a, T: Copy> Operand<'a, T> {
    /// A dense `[n, rows, cols]` operand.
    pub(crate) fn dense(data: &'a [T], n: usize, rows: usize, cols: usize) -> Self {
        let bases = (0..n).map(|b| b * rows * cols).collect();
        Operand { data, bases, rows, cols, rs: cols, cs: 1 }
    }

    /// `data` read through `view` (rank 3 or more: leading batch dimensions, then rows and
    /// columns); `None` for a negative stride or a view that reaches past `data`.
    pub(crate) fn of_view(data: &'a [T], view: &kiln_ir::View) -> Option<Self> {
        let (dims, strides) = (view.shape().dims(), view.strides());
        let r = dims.len();
        if r < 3 || strides.iter().any(|&s| s < 0) || view.span() > data.len() {
            return None;
        }
        let mut bases = vec![view.offset()];
        for (&d, &st) in dims[..r - 2].iter().zip(&strides[..r - 2]) {
            bases = bases.iter().flat_map(|&b| (0..d).map(move |i| b + i * st as usize)).collect();
        }
        let (rows, cols) = (dims[r - 2], dims[r - 1]);
        Some(Operand {
            data,
            bases,
            rows,
            cols,
            rs: strides[r - 2] as usize,
            cs: strides[r - 1] as usize,
        })
    }

    /// Rows `r0..r1` of batch entry `b`.
    fn rows(&self, b: usize, r0: usize, r1: usize) -> Mat<'a, T> {
        let start = self.bases[b] + r0 * self.rs;
        let data = self.data.get(start..).unwrap_or(&[]);
        Mat { data, rows: r1 - r0, cols: self.cols, rs: self.rs, cs: self.cs }
    }

    /// Element `[b, r, c]`.
    fn at(&self, b: usize, r: usize, c: usize) -> T {
        self.data[self.bases[b] + r * self.rs + c * self.cs]
    }

    /// Batch entry `b` alone, as an operand of one entry.
    pub(crate) fn entry(&self, b: usize) -> Self {
        Operand { data: self.data, bases: vec![self.bases[b]], ..*self }
    }

    /// Batch entry `b`'s elements in row-major order, through `f`, appended to `out`.
    pub(crate) fn gather_entry<U>(&self, b: usize, f: impl Fn(T) -> U, out: &mut Vec<U>) {
        self.gather_rows(b, self.rows, f, out);
    }

    /// The first `rows` rows of batch entry `b`, as [`Operand::gather_entry`].
    pub(crate) fn gather_rows<U>(
        &self,
        b: usize,
        rows: usize,
        f: impl Fn(T) -> U,
        out: &mut Vec<U>,
    ) {
        for r in 0..rows.min(self.rows) {
            if self.cs == 1 {
                let at = self.bases[b] + r * self.rs;
                out.extend(self.data[at..at + self.cols].iter().map(|&x| f(x)));
            } else {
                out.extend((0..self.cols).map(|c| f(self.at(b, r, c))));
            }
        }
    }
}

/// `dst = alpha·a·b`, or `dst += alpha·a·b` when `acc`, for a row-major `dst` whose rows
/// are `dst_rs` apart.
fn mm<T: Real>(dst: &mut [T], dst_rs: usize, a: Mat<'_, T>, b: Mat<'_, T>, alpha: T, acc: bool) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        b.rows == k && a.fits() && b.fits() && (m - 1) * dst_rs + n <= dst.len(),
        "attention block out of bounds"
    );
    if k == 0 {
        if !acc {
            dst.chunks_mut(dst_rs).take(m).for_each(|row| row[..n].fill(T::ZERO));
        }
        return;
    }
    // SAFETY: every element of the three matrices lies inside its slice (checked above),
    // and `dst`, borrowed mutably, overlaps neither operand. `T` is f32 or f64.
    unsafe {
        gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_rs as isize,
            acc,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            T::ONE,
            alpha,
            false,
            false,
            false,
            Parallelism::None,
        );
    }
}

/// `x` folded with `f` in eight independent lanes (so that the loop vectorizes), then the
/// lanes and the remainder folded in turn.
#[inline(always)]
fn fold_lanes<T: Real>(x: &[T], init: T, f: impl Fn(T, T) -> T + Copy) -> T {
    let mut lanes = [init; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for (a, &v) in lanes.iter_mut().zip(c) {
            *a = f(*a, v);
        }
    }
    chunks.remainder().iter().fold(lanes.iter().fold(init, |a, &b| f(a, b)), |a, &b| f(a, b))
}

#[inline(always)]
fn row_max<T: Real>(x: &[T]) -> T {
    fold_lanes(x, T::NEG_INF, |a, b| if b > a { b } else { a })
}

#[inline(always)]
fn total<T: Real>(x: &[T]) -> T {
    fold_lanes(x, T::ZERO, |a, b| a + b)
}

/// `Σ x·y` over `x`'s length, in eight independent lanes.
#[inline(always)]
fn dot<T: Real>(x: &[T], y: &[T]) -> T {
    let y = &y[..x.len()];
    let mut lanes = [T::ZERO; 8];
    let (mut cx, mut cy) = (x.chunks_exact(8), y.chunks_exact(8));
    for (a, b) in (&mut cx).zip(&mut cy) {
        for ((l, &u), &v) in lanes.iter_mut().zip(a).zip(b) {
            *l += u * v;
        }
    }
    let rest = cx.remainder().iter().zip(cy.remainder()).fold(T::ZERO, |a, (&u, &v)| a + u * v);
    lanes.iter().fold(rest, |a, &b| a + b)
}

/// `exp(x - m)` for every `x` of `row`: with `hidden`, 0 exactly for a hidden key's score
/// (`-inf`), which the fast `exp` would make about 1e-38.
#[inline(always)]
fn exp_shifted<T: Real>(row: &mut [T], m: T, hidden: bool) {
    if hidden {
        row.iter_mut().for_each(|x| {
            *x = if *x == T::NEG_INF { T::ZERO } else { (*x - m).exp_fast() };
        });
    } else {
        row.iter_mut().for_each(|x| *x = (*x - m).exp_fast());
    }
}

/// The forward's online-softmax step over one tile of scores (rows `KT` apart): each row
/// becomes `exp(s - m_new)` (0 past its visible keys and at hidden ones), and its running
/// sum and output row are rescaled to the new maximum.
#[inline(always)]
fn online_rows<T: Real>(
    s: &mut [T],
    t: &Tile,
    d: &Dims,
    m: &mut [T],
    sum: &mut [T],
    acc: &mut [T],
) {
    let (w, ev) = (t.width(), d.ev);
    let hidden = d.mask == kiln_ir::AttentionMask::Given;
    for (i, row) in s.chunks_mut(KT).take(t.rows()).enumerate() {
        let (row, n) = (&mut row[..w], t.visible(d, i));
        row[n..].fill(T::ZERO);
        let tile_max = row_max(&row[..n]);
        let m_new = if tile_max > m[i] { tile_max } else { m[i] };
        if n == 0 || m_new == T::NEG_INF {
            // No key seen yet (all hidden so far): nothing to add or rescale.
            row[..n].fill(T::ZERO);
            continue;
        }
        // exp(-inf) = 0 before the first visible key.
        let correction = (m[i] - m_new).exp();
        exp_shifted(&mut row[..n], m_new, hidden);
        sum[i] = sum[i] * correction + total(&row[..n]);
        acc[i * ev..(i + 1) * ev].iter_mut().for_each(|o| *o *= correction);
        m[i] = m_new;
    }
}

/// The widest vector instructions the CPU has that the row functions are compiled for.
#[derive(Clone, Copy, PartialEq)]
enum Simd {
    Avx512,
    Avx2,
    Baseline,
}

fn simd() -> Simd {
    #[cfg(target_arch = "x86_64")]
    {
        static LEVEL: std::sync::OnceLock<Simd> = std::sync::OnceLock::new();
        *LEVEL.get_or_init(|| {
            if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("fma") {
                Simd::Avx512
            } else if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
            {
                Simd::Avx2
            } else {
                Simd::Baseline
            }
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Simd::Baseline
    }
}

/// Defines `$fast`, which runs `$name` compiled for AVX-512 or AVX2 (with FMA) when the
/// CPU has them, else for the baseline: its body, marked `#[inline(always)]`, is inlined
/// into a function with those features.
macro_rules! dispatch {
    ($fast:ident, $name:path, ($($arg:ident: $ty:ty),*)) => {
        fn $fast<T: Real>($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx2,fma")]
                unsafe fn avx512<T: Real>($($arg: $ty),*) {
                    $name($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2<T: Real>($($arg: $ty),*) {
                    $name($($arg),*)
                }
                match simd() {
                    // SAFETY: the CPU has AVX-512F, AVX2 and FMA.
                    Simd::Avx512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: the CPU has AVX2 and FMA.
                    Simd::Avx2 => return unsafe { avx2($($arg),*) },
                    Simd::Baseline => {}
                }
            }
            $name($($arg),*)
        }
    };
}

dispatch!(online_rows_fast, online_rows, (s: &mut [T], t: &Tile, d: &Dims, m: &mut [T], sum: &mut [T], acc: &mut [T]));

/// Query tiles of every batch entry: `(b, r0, r1)`.
fn query_tiles(d: &Dims) -> Vec<(usize, usize, usize)> {
    (0..d.n).flat_map(|b| (0..d.l).step_by(QT).map(move |r0| (b, r0, (r0 + QT).min(d.l)))).collect()
}

/// The output rows `r0..r1` of entry `b` into `acc` (zeroed), and each row's log-sum-exp.
fn forward_tile<T: Real>(
    x: &Inputs<'_, T>,
    d: &Dims,
    (b, r0, r1): (usize, usize, usize),
    acc: &mut [T],
) -> Vec<T> {
    let ev = d.ev;
    let rows = r1 - r0;
    let mut m = vec![T::NEG_INF; rows];
    let mut sum = vec![T::ZERO; rows];
    let mut s = vec![T::ZERO; rows * KT];
    let q_rows = x.q.rows(b, r0, r1);
    // Keys after the last one a query of the tile sees are not read.
    let key_end = d.keys_of(r1 - 1).min(x.keys_seen_by(b, r0..r1, d));
    for c0 in (0..key_end).step_by(KT) {
        let t = Tile { b, r0, r1, c0, c1: (c0 + KT).min(key_end) };
        if x.mask.as_ref().is_some_and(|mask| mask.hides_tile(&t)) {
            // Keys no query of the tile sees (a static cache's empty slots): not read.
            continue;
        }
        mm(&mut s, KT, q_rows, x.k.rows(b, t.c0, t.c1).t(), T::of(d.scale), false);
        x.hide(&mut s, &t);
        online_rows_fast(&mut s, &t, d, &mut m, &mut sum, acc);
        let p = Mat::block(&s, rows, t.width(), KT);
        mm(acc, ev, p, x.v.rows(b, t.c0, t.c1), T::ONE, true);
    }
    let mut lse = vec![T::ZERO; rows];
    for i in 0..rows {
        // A query that sees no key gives zeros (PyTorch's safe softmax), not 0/0.
        let row = &mut acc[i * ev..(i + 1) * ev];
        if sum[i] > T::ZERO {
            row.iter_mut().for_each(|o| *o = *o / sum[i]);
            lse[i] = m[i] + sum[i].ln();
        } else {
            row.fill(T::ZERO);
            lse[i] = T::NEG_INF;
        }
    }
    lse
}

impl Operand<'_, bool> {
    /// Whether the mask hides every key of tile `t` from every query of it.
    fn hides_tile(&self, t: &Tile) -> bool {
        // Rows 0 apart are one row: check it once.
        let rows = if self.rs == 0 { t.r0..t.r0 + 1 } else { t.r0..t.r1 };
        rows.into_iter().all(|r| (t.c0..t.c1).all(|c| !self.at(t.b, r, c)))
    }
}

/// The operands: `q`, `k`, `v`, (for the gradients) `dout`, and a given mask.
pub(crate) struct Inputs<'a, T> {
    pub(crate) q: Operand<'a, T>,
    pub(crate) k: Operand<'a, T>,
    pub(crate) v: Operand<'a, T>,
    pub(crate) dout: Option<Operand<'a, T>>,
    pub(crate) mask: Option<Operand<'a, bool>>,
}

impl<T> Inputs<'_, T> {
    /// How many leading keys of entry `b` any of its queries may see (those after them need
    /// not be read: a static cache's empty slots). A causal triangle from the lower-right
    /// corner depends on the number of keys, so it keeps them all.
    pub(crate) fn keys_seen(&self, b: usize, d: &Dims) -> usize {
        self.keys_seen_by(b, 0..d.l, d)
    }

    /// [`Inputs::keys_seen`] for the queries `rows` of entry `b`.
    fn keys_seen_by(&self, b: usize, rows: std::ops::Range<usize>, d: &Dims) -> usize {
        use kiln_ir::AttentionMask;
        match (d.mask, &self.mask) {
            (AttentionMask::Given, Some(m)) => {
                // Rows 0 apart are one row: look at it once.
                let rows = if m.rs == 0 { rows.start..rows.end.min(rows.start + 1) } else { rows };
                rows.filter_map(|r| (0..d.s).rev().find(|&c| m.at(b, r, c)))
                    .max()
                    .map_or(0, |c| c + 1)
            }
            (AttentionMask::Causal, _) if rows.end > 0 => d.keys_of(rows.end - 1),
            _ => d.s,
        }
    }
}

impl<T: Real> Inputs<'_, T> {
    fn dout(&self) -> &Operand<'_, T> {
        self.dout.as_ref().expect("the gradients read the output gradient")
    }

    /// Sets the scores (rows `KT` apart) of tile `t`'s keys that the given mask hides to
    /// `-inf`.
    fn hide(&self, s: &mut [T], t: &Tile) {
        let Some(mask) = &self.mask else { return };
        if mask.rs == 0 {
            // One mask row for every query (a padding mask broadcast over them): its
            // hidden keys found once, usually none.
            let hidden: Vec<usize> =
                (0..t.width()).filter(|&c| !mask.at(t.b, 0, t.c0 + c)).collect();
            if !hidden.is_empty() {
                for row in s.chunks_mut(KT).take(t.rows()) {
                    hidden.iter().for_each(|&c| row[c] = T::NEG_INF);
                }
            }
            return;
        }
        for (i, row) in s.chunks_mut(KT).take(t.rows()).enumerate() {
            for (c, x) in row[..t.width()].iter_mut().enumerate() {
                if !mask.at(t.b, t.r0 + i, t.c0 + c) {
                    *x = T::NEG_INF;
                }
            }
        }
    }
}

/// `softmax(q·kᵀ·scale)·v` into `out` (`[n, l, ev]`).
pub(crate) fn forward<T: Real>(x: &Inputs<'_, T>, d: &Dims, out: &mut [T]) {
    let tiles = query_tiles(d);
    crate::team::for_each_part(split_rows(out, &tiles, d.ev), &|i, rows| {
        forward_tile(x, d, tiles[i], rows);
    });
}

/// [`forward`] of a single batch entry (`d.n == 1`) on the calling thread.
pub(crate) fn forward_entry<T: Real>(x: &Inputs<'_, T>, d: &Dims, out: &mut [T]) {
    let tiles = query_tiles(d);
    for (&tile, rows) in tiles.iter().zip(split_rows(out, &tiles, d.ev)) {
        forward_tile(x, d, tile, rows);
    }
}

/// The rows of each query tile in a `[n, l, width]` slice (tiles in order, covering it).
fn split_rows<'a, T>(
    mut x: &'a mut [T],
    tiles: &[(usize, usize, usize)],
    width: usize,
) -> Vec<&'a mut [T]> {
    let mut parts = Vec::with_capacity(tiles.len());
    for &(_, r0, r1) in tiles {
        let (part, rest) = std::mem::take(&mut x).split_at_mut((r1 - r0) * width);
        parts.push(part);
        x = rest;
    }
    debug_assert!(x.is_empty(), "the tiles cover every row");
    parts
}

mod backward;

pub(crate) use backward::{backward, backward_entry};

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
