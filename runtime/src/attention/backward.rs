//! The backward pass of fused attention: it recomputes the scores block by block, one pass
//! for each query's log-sum-exp and `D = dout·out`, then the gradients (see the parent
//! module's overview).

use super::*;

/// The backward's row step over one block: scores `s` become the probabilities `p`, and
/// `dp = dout·vᵀ` becomes `ds = p·(dp - D)` (both 0 past a row's visible keys). `stats` holds
/// each row's log-sum-exp and `D`; without it the block holds all of a row's keys, so its
/// softmax is computed here and `D = Σ p·dp`.
#[inline(always)]
fn grad_rows<T: Real>(s: &mut [T], dp: &mut [T], t: &Tile, d: &Dims, stats: Option<(&[T], &[T])>) {
    let w = t.width();
    let hidden = d.mask == kiln_ir::AttentionMask::Given;
    for (i, (srow, dprow)) in s.chunks_mut(KT).zip(dp.chunks_mut(KT)).take(t.rows()).enumerate() {
        let (p, g, n) = (&mut srow[..w], &mut dprow[..w], t.visible(d, i));
        // A query that sees no key (its log-sum-exp or maximum is -inf) has no gradient.
        let dd = match stats {
            Some((lse, dd)) if lse[i] > T::NEG_INF => {
                exp_shifted(&mut p[..n], lse[i], hidden);
                dd[i]
            }
            None if n > 0 && row_max(&p[..n]) > T::NEG_INF => {
                let m = row_max(&p[..n]);
                exp_shifted(&mut p[..n], m, hidden);
                let sum = total(&p[..n]);
                p[..n].iter_mut().for_each(|x| *x = *x / sum);
                dot(&p[..n], &g[..n])
            }
            _ => {
                p[..n].fill(T::ZERO);
                T::ZERO
            }
        };
        p[n..].fill(T::ZERO);
        g[..n].iter_mut().zip(&p[..n]).for_each(|(x, &pp)| *x = pp * (*x - dd));
        g[n..].fill(T::ZERO);
    }
}

dispatch!(grad_rows_fast, grad_rows, (s: &mut [T], dp: &mut [T], t: &Tile, d: &Dims, stats: Option<(&[T], &[T])>));

/// [`backward`] of a single batch entry (`d.n == 1`) on the calling thread.
pub(crate) fn backward_entry<T: Real>(x: &Inputs<'_, T>, d: &Dims, out: &mut [T]) {
    let mut g = Grad { x, d, lse: Vec::new(), dd: Vec::new() };
    if d.s > KT {
        (g.lse, g.dd) = row_statistics(x, d, &query_tiles(d), false);
    }
    g.entry(0, out);
}

/// The gradients of [`forward`] for `dout` into `out` (zeroed), packed per batch entry as
/// `[dq | dk | dv]`.
pub(crate) fn backward<T: Real>(x: &Inputs<'_, T>, d: &Dims, out: &mut [T]) {
    let (e, ev, l, s) = (d.e, d.ev, d.l, d.s);
    let per = l * e + s * e + s * ev;
    let tiles = query_tiles(d);
    let mut g = Grad { x, d, lse: Vec::new(), dd: Vec::new() };
    if s > KT {
        (g.lse, g.dd) = row_statistics(x, d, &tiles, true);
    }
    if d.n >= crate::team::threads() {
        // Enough batch entries to keep every thread busy: one pass per entry computes dq,
        // dk and dv together, without recomputing the scores for dq.
        let entries = out.chunks_mut(per.max(1)).collect();
        crate::team::for_each_part(entries, &|b, packed| g.entry(b, packed));
        return;
    }
    if s <= KT {
        // Every row's keys fit one tile: query tiles in parallel, each with its own `dk`
        // and `dv` of the entry's keys, summed after.
        let parts: Vec<(Vec<T>, Vec<T>, Vec<T>)> = crate::team::map(tiles.len(), &|i| {
            let (b, r0, r1) = tiles[i];
            g.query_tile(Tile { b, r0, r1, c0: 0, c1: s })
        });
        for (&(b, r0, _), (dq, dk, dv)) in tiles.iter().zip(&parts) {
            let at = b * per + r0 * e;
            out[at..at + dq.len()].copy_from_slice(dq);
            let at = b * per + l * e;
            out[at..at + dk.len()].iter_mut().zip(dk).for_each(|(o, &x)| *o += x);
            let at = b * per + l * e + s * e;
            out[at..at + dv.len()].iter_mut().zip(dv).for_each(|(o, &x)| *o += x);
        }
        return;
    }
    let dq_parts: Vec<Vec<T>> = crate::team::map(tiles.len(), &|i| g.dq_tile(tiles[i]));
    let key_tiles: Vec<(usize, usize, usize)> = (0..d.n)
        .flat_map(|b| (0..s).step_by(KT).map(move |c0| (b, c0, (c0 + KT).min(s))))
        .collect();
    let dkv_parts: Vec<(Vec<T>, Vec<T>)> =
        crate::team::map(key_tiles.len(), &|i| g.dkv_tile(key_tiles[i]));
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
}

/// Each query's log-sum-exp and `D = dout·out`, from the forward pass recomputed, tiles on
/// the team (`parallel`) or on the calling thread.
fn row_statistics<T: Real>(
    x: &Inputs<'_, T>,
    d: &Dims,
    tiles: &[(usize, usize, usize)],
    parallel: bool,
) -> (Vec<T>, Vec<T>) {
    let (l, ev) = (d.l, d.ev);
    let dout = x.dout();
    let tile_stats = |i: usize| {
        let (b, r0, r1) = tiles[i];
        let mut out = vec![T::ZERO; (r1 - r0) * ev];
        let lse = forward_tile(x, d, (b, r0, r1), &mut out);
        let mut row = Vec::with_capacity(ev);
        let dd = (r0..r1)
            .map(|r| {
                let g = dout.rows(b, r, r + 1);
                let g = if g.cs == 1 {
                    &g.data[..ev]
                } else {
                    row.clear();
                    row.extend((0..ev).map(|c| dout.at(b, r, c)));
                    &row[..]
                };
                dot(g, &out[(r - r0) * ev..])
            })
            .collect();
        (lse, dd)
    };
    let stats: Vec<(Vec<T>, Vec<T>)> = if parallel {
        crate::team::map(tiles.len(), &tile_stats)
    } else {
        (0..tiles.len()).map(tile_stats).collect()
    };
    let mut lse = vec![T::ZERO; d.n * l];
    let mut dd = vec![T::ZERO; d.n * l];
    for (&(b, r0, r1), (t_lse, t_dd)) in tiles.iter().zip(stats) {
        lse[b * l + r0..b * l + r1].copy_from_slice(&t_lse);
        dd[b * l + r0..b * l + r1].copy_from_slice(&t_dd);
    }
    (lse, dd)
}

/// What the gradient passes share: the inputs and, when rows span several key tiles, each
/// row's log-sum-exp and `D` (empty otherwise).
struct Grad<'a, T> {
    x: &'a Inputs<'a, T>,
    d: &'a Dims,
    lse: Vec<T>,
    dd: Vec<T>,
}

/// Where one block's gradients go: rows of the block's queries (`dq`) and keys (`dk`,
/// `dv`); a pass that does not want one leaves it out.
struct Outputs<'a, T> {
    dq: Option<&'a mut [T]>,
    dk: Option<&'a mut [T]>,
    dv: Option<&'a mut [T]>,
}

impl<T: Real> Grad<'_, T> {
    /// Adds one block's share of the gradients to `out`, with `s` and `dp` as scratch
    /// (`QT × KT` each).
    fn block(&self, t: &Tile, s: &mut [T], dp: &mut [T], out: Outputs<'_, T>) {
        let d = self.d;
        let (l, e, ev) = (d.l, d.e, d.ev);
        let (rows, w) = (t.rows(), t.width());
        let b = t.b;
        let q_rows = self.x.q.rows(b, t.r0, t.r1);
        let g_rows = self.x.dout().rows(b, t.r0, t.r1);
        let keys = self.x.k.rows(b, t.c0, t.c1);
        let values = self.x.v.rows(b, t.c0, t.c1);
        let scale = T::of(d.scale);
        mm(s, KT, q_rows, keys.t(), scale, false);
        self.x.hide(s, t);
        mm(dp, KT, g_rows, values.t(), T::ONE, false);
        let stats = (!self.lse.is_empty()).then(|| {
            let at = b * l + t.r0;
            (&self.lse[at..at + rows], &self.dd[at..at + rows])
        });
        grad_rows_fast(s, dp, t, d, stats);
        let (p, ds) = (Mat::block(s, rows, w, KT), Mat::block(dp, rows, w, KT));
        if let Some(dv) = out.dv {
            mm(dv, ev, p.t(), g_rows, T::ONE, true);
        }
        if let Some(dk) = out.dk {
            mm(dk, e, ds.t(), q_rows, scale, true);
        }
        if let Some(dq) = out.dq {
            mm(dq, e, ds, keys, scale, true);
        }
    }

    /// A query tile whose rows see only the tile's keys (all of the entry's): its `dq`
    /// rows and its share of the entry's `dk` and `dv`.
    fn query_tile(&self, t: Tile) -> (Vec<T>, Vec<T>, Vec<T>) {
        let (e, ev, s) = (self.d.e, self.d.ev, self.d.s);
        let mut dq = vec![T::ZERO; t.rows() * e];
        let (mut dk, mut dv) = (vec![T::ZERO; s * e], vec![T::ZERO; s * ev]);
        let (mut sc, mut dp) = (vec![T::ZERO; QT * KT], vec![T::ZERO; QT * KT]);
        let out = Outputs { dq: Some(&mut dq), dk: Some(&mut dk), dv: Some(&mut dv) };
        self.block(&t, &mut sc, &mut dp, out);
        (dq, dk, dv)
    }

    /// `dq` of query rows `r0..r1` of entry `b`, over every key tile they see.
    fn dq_tile(&self, (b, r0, r1): (usize, usize, usize)) -> Vec<T> {
        let e = self.d.e;
        let mut dq = vec![T::ZERO; (r1 - r0) * e];
        let (mut s, mut dp) = (vec![T::ZERO; QT * KT], vec![T::ZERO; QT * KT]);
        let key_end = self.d.keys_of(r1 - 1);
        for c0 in (0..key_end).step_by(KT) {
            let t = Tile { b, r0, r1, c0, c1: (c0 + KT).min(key_end) };
            self.block(&t, &mut s, &mut dp, Outputs { dq: Some(&mut dq), dk: None, dv: None });
        }
        dq
    }

    /// `dk` and `dv` of keys `c0..c1` of entry `b`, over every query tile that sees them.
    fn dkv_tile(&self, (b, c0, c1): (usize, usize, usize)) -> (Vec<T>, Vec<T>) {
        let (e, ev) = (self.d.e, self.d.ev);
        let (mut dk, mut dv) = (vec![T::ZERO; (c1 - c0) * e], vec![T::ZERO; (c1 - c0) * ev]);
        let (mut s, mut dp) = (vec![T::ZERO; QT * KT], vec![T::ZERO; QT * KT]);
        for r0 in (self.first_row(c0)..self.d.l).step_by(QT) {
            let t = Tile { b, r0, r1: (r0 + QT).min(self.d.l), c0, c1 };
            let out = Outputs { dq: None, dk: Some(&mut dk), dv: Some(&mut dv) };
            self.block(&t, &mut s, &mut dp, out);
        }
        (dk, dv)
    }

    /// The packed `[dq | dk | dv]` of batch entry `b`, key tile by key tile.
    fn entry(&self, b: usize, packed: &mut [T]) {
        let (l, e, ev, s) = (self.d.l, self.d.e, self.d.ev, self.d.s);
        let (dq, rest) = packed.split_at_mut(l * e);
        let (dk, dv) = rest.split_at_mut(s * e);
        let (mut sc, mut dp) = (vec![T::ZERO; QT * KT], vec![T::ZERO; QT * KT]);
        for c0 in (0..s).step_by(KT) {
            let c1 = (c0 + KT).min(s);
            for r0 in (self.first_row(c0)..l).step_by(QT) {
                let r1 = (r0 + QT).min(l);
                let out = Outputs {
                    dq: Some(&mut dq[r0 * e..r1 * e]),
                    dk: Some(&mut dk[c0 * e..c1 * e]),
                    dv: Some(&mut dv[c0 * ev..c1 * ev]),
                };
                self.block(&Tile { b, r0, r1, c0, c1 }, &mut sc, &mut dp, out);
            }
        }
    }

    /// The first query row that may see key `c0` (causal rows before it see none).
    fn first_row(&self, c0: usize) -> usize {
        self.d.mask.first_query(c0, self.d.l, self.d.s)
    }
}
