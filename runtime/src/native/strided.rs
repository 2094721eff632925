//! Writes through one view of values read through another: a slice's gradient (`Unview`)
//! or an `Assign` whose values are a view of a stored buffer (attention's gradients
//! transposed back into a projection's layout), without a dense copy of the values first.

use kiln_ir::{Element, View};

use super::{Overlaps, write_through};

/// Elements below which the copy runs on the calling thread.
const PARALLEL: usize = 1 << 15;

/// `x` read through `src` written (or added, per `overlaps`) at the positions `dst` reads in
/// `out`; `src` and `dst` have one shape.
pub(super) fn write_viewed<T: Element>(
    out: &mut [T],
    x: &[T],
    src: &View,
    dst: &View,
    overlaps: Overlaps,
) {
    if src.is_dense_over(x.len()) {
        return write_through(out, x, dst, overlaps);
    }
    let forward = |v: &View| v.strides().iter().all(|&s| s >= 0);
    let fits = src.span() <= x.len() && dst.span() <= out.len();
    if matches!(overlaps, Overlaps::Distinct)
        && forward(src)
        && forward(dst)
        && fits
        && dst.is_non_overlapping()
    {
        return copy_between(out, dst, x, src);
    }
    let dense: Vec<T> = src.offsets().map(|o| x[o]).collect();
    write_through(out, &dense, dst, overlaps);
}

/// `out` through `dst` gets `x` through `src`, a row of the innermost dimension at a time,
/// rows in parallel when there are many elements. The caller checks that both views have
/// non-negative strides and fit their buffers, and that `dst` writes each position once.
fn copy_between<T: Element>(out: &mut [T], dst: &View, x: &[T], src: &View) {
    let dims = dst.shape().dims();
    let numel = dst.shape().numel();
    if numel == 0 {
        return;
    }
    let r = dims.len();
    if r == 0 {
        out[dst.offset()] = x[src.offset()];
        return;
    }
    let len = dims[r - 1];
    let (ds, ss) = (dst.strides()[r - 1] as usize, src.strides()[r - 1] as usize);
    let rows = numel / len;
    /// `out`'s memory, shared by the threads.
    struct Out<T>(*mut T);
    // SAFETY: `dst` writes each position once, so the threads' rows never meet.
    unsafe impl<T> Sync for Out<T> {}
    let o = Out(out.as_mut_ptr());
    let copy_rows = |first: usize, last: usize| {
        let o = &o;
        for row in first..last {
            // The row's first element in each view: the row's index over the outer dims.
            let (mut rest, mut at_dst, mut at_src) = (row, dst.offset(), src.offset());
            for d in (0..r - 1).rev() {
                let i = rest % dims[d];
                rest /= dims[d];
                at_dst += i * dst.strides()[d] as usize;
                at_src += i * src.strides()[d] as usize;
            }
            // SAFETY: every position of both views lies inside its buffer (checked by the
            // caller), and no other row writes this row's positions of `out`.
            unsafe {
                if ds == 1 && ss == 1 {
                    std::ptr::copy_nonoverlapping(x.as_ptr().add(at_src), o.0.add(at_dst), len);
                } else {
                    for j in 0..len {
                        *o.0.add(at_dst + j * ds) = x[at_src + j * ss];
                    }
                }
            }
        }
    };
    if numel < PARALLEL {
        return copy_rows(0, rows);
    }
    let per = (PARALLEL / len).max(1);
    crate::team::for_each(rows.div_ceil(per), &|c| copy_rows(c * per, ((c + 1) * per).min(rows)));
}

#[cfg(test)]
mod tests {
    use kiln_ir::{Shape, View};

    use super::{Overlaps, write_viewed};

    /// `x` through `src` written through `dst` into zeros, one element at a time.
    fn reference(len: usize, x: &[f32], src: &View, dst: &View, sum: bool) -> Vec<f32> {
        let mut out = vec![0.0; len];
        for (s, d) in src.offsets().zip(dst.offsets()) {
            out[d] = if sum { out[d] + x[s] } else { x[s] };
        }
        out
    }

    #[test]
    fn values_read_through_one_view_land_where_the_other_writes() {
        // Small and large (parallel) shapes; heads transposed back, a transposed inner
        // dimension (strides other than 1 on both sides), and an overlapping destination.
        for (b, t, h, e) in [(2, 3, 2, 5), (4, 64, 4, 32)] {
            let c = h * e;
            let packed: Vec<f32> = (0..b * h * t * e * 3).map(|i| i as f32 * 0.5).collect();
            let heads = View::contiguous(Shape::from([b * h, 3 * t * e]))
                .narrow(1, t * e, t * e)
                .reshape(&Shape::from([b, h, t, e]))
                .unwrap()
                .permute(&[0, 2, 1, 3]);
            let into = View::contiguous(Shape::from([b, t, 3 * c]))
                .narrow(2, c, c)
                .reshape(&Shape::from([b, t, h, e]))
                .unwrap();
            let len = b * t * 3 * c;
            let mut out = vec![0.0; len];
            write_viewed(&mut out, &packed, &heads, &into, Overlaps::Distinct);
            assert_eq!(out, reference(len, &packed, &heads, &into, false));
            let flipped = into.permute(&[0, 1, 3, 2]);
            let source = heads.permute(&[0, 1, 3, 2]);
            let mut out = vec![0.0; len];
            write_viewed(&mut out, &packed, &source, &flipped, Overlaps::Distinct);
            assert_eq!(out, reference(len, &packed, &source, &flipped, false));
        }
        // Two source rows added into one destination row.
        let x: Vec<f32> = (0..24).map(|i| i as f32).collect();
        let src = View::contiguous(Shape::from([4, 6])).permute(&[1, 0]);
        let dst = View::from_parts(Shape::from([6, 4]), vec![0, 1], 0);
        let mut out = vec![0.0; 4];
        write_viewed(&mut out, &x, &src, &dst, Overlaps::SumFloat);
        assert_eq!(out, reference(4, &x, &src, &dst, true));
    }
}
