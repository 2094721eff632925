//! `gather`, `scatter` and `scatter_add`: element by element through the flat offsets the
//! index selects, or row by row when the index picks whole rows (an embedding's lookup and
//! its gradient: the index is one value along every dimension after the axis).

use kiln_ir::{Element, Graph, NodeId, Op, Scalar, Shape, View};

use super::{edited, edited_copy, edited_fill, for_each_offset};
use crate::buffer::with_element_type;
use crate::reference;
use crate::{Buffer, RunError, RuntimeError};

/// `x` (dense, of shape `x_shape`) gathered along `axis` at the index's positions: whole
/// rows copied when the index picks rows, else element by element.
pub(super) fn gather(
    x: &Buffer,
    x_shape: &Shape,
    index: &Buffer,
    index_shape: &Shape,
    axis: usize,
) -> Result<Buffer, RuntimeError> {
    let values = index_values(index);
    if let Some(rows) = index_rows("gather", axis, x_shape, index_shape, &values) {
        let Rows { starts, len } = rows?;
        return with_element_type!(x.dtype(), T => {
            let x = x.as_slice::<T>().expect("the buffer's own element type");
            edited(starts.len() * len, |start, chunk| {
                // The chunk's piece of each row it meets, copied whole.
                let mut p = start;
                let end = start + chunk.len();
                while p < end {
                    let (r, off) = (p / len, p % len);
                    let n = (len - off).min(end - p);
                    let src = &x[starts[r] + off..][..n];
                    for (slot, &v) in chunk[p - start..][..n].iter_mut().zip(src) {
                        slot.write(v);
                    }
                    p += n;
                }
            }, |_| {})
        });
    }
    let targets = index_targets("gather", axis, x_shape, index_shape, &values)?;
    with_element_type!(x.dtype(), T => {
        let x = x.as_slice::<T>().expect("the buffer's own element type");
        Buffer::from_iter(targets.len(), targets.iter().map(|&t| x[t]))
    })
}

/// Scatter node `id` (a `Scatter` op) into `base`, which stands for its first argument: a
/// buffer of its own ([`Base::Own`], written in place) or one value everywhere
/// ([`Base::Fill`]: the plan does not materialize a constant base, so the result is filled,
/// not copied). `args` are the index and the source.
pub(crate) fn scatter_into(
    graph: &Graph,
    id: NodeId,
    base: Base<'_>,
    args: &[&Buffer],
) -> Result<Buffer, RunError> {
    let node = graph.node(id);
    let at =
        |error: RuntimeError| RunError { error, op: Some(node.op.name()), origin: node.origin };
    let Op::Scatter { axis, accumulate } = node.op else {
        unreachable!("only scatters are planned in place or onto a fill")
    };
    let ids = graph.args(id);
    let shape_of = |i: usize| &graph.node(ids[i]).shape;
    scatter(base, shape_of(0), args[0], shape_of(1), args[1], shape_of(2), axis, accumulate)
        .map_err(at)
}

/// What a scatter writes into: a copy of a buffer, one value everywhere, or a buffer of its
/// own, in place.
pub(crate) enum Base<'a> {
    Buffer(&'a Buffer),
    Fill(Scalar, kiln_ir::DType),
    /// A host buffer nothing else holds ([`Buffer::is_unique_on_host`]).
    Own(Buffer),
}

impl Base<'_> {
    fn dtype(&self) -> kiln_ir::DType {
        match self {
            Base::Buffer(b) => b.dtype(),
            Base::Own(b) => b.dtype(),
            Base::Fill(_, dtype) => *dtype,
        }
    }

    /// A buffer of the base's values (a copy, the fill over `shape`, or the base itself)
    /// with `edit` applied.
    fn edited<T: Element>(
        self,
        shape: &Shape,
        edit: impl FnOnce(&mut [T]),
    ) -> Result<Buffer, RuntimeError> {
        match self {
            Base::Buffer(b) => {
                edited_copy(b.as_slice::<T>().expect("the buffer's own element type"), edit)
            }
            Base::Fill(v, _) => edited_fill(shape.numel(), T::from_scalar(v), edit),
            Base::Own(mut b) => {
                edit(b.unique_slice_mut::<T>().expect("an own base is a unique host buffer"));
                Ok(b)
            }
        }
    }
}

/// A copy of `base` with `src` written (or, with `accumulate`, added) at the positions the
/// index selects. Sums are formed as the reference executor forms them: floats in f64 from
/// the base value, rounded once; integers wrapping.
#[allow(clippy::too_many_arguments, reason = "an op's three operands and their shapes")]
pub(super) fn scatter(
    base: Base<'_>,
    base_shape: &Shape,
    index: &Buffer,
    index_shape: &Shape,
    src: &Buffer,
    src_shape: &Shape,
    axis: usize,
    accumulate: bool,
) -> Result<Buffer, RuntimeError> {
    let name = if accumulate { "scatter_add" } else { "scatter" };
    let values = index_values(index);
    if src_shape == index_shape
        && let Some(rows) = index_rows(name, axis, base_shape, index_shape, &values)
    {
        return scatter_rows(base, base_shape, &rows?, src, accumulate);
    }
    let targets = index_targets(name, axis, base_shape, index_shape, &values)?;
    let mut positions = Vec::with_capacity(targets.len());
    for_each_offset(&reference::src_positions(index_shape, src_shape), |_, p| positions.push(p));
    with_element_type!(base.dtype(), T => {
        let src = src.as_slice::<T>().expect("scatter's src has the base's dtype");
        let edit = |out: &mut [T]| {
        let pairs = targets.iter().zip(positions.iter().copied());
        match T::DTYPE.category() {
            kiln_ir::Category::Float if accumulate && targets.len() >= out.len() / 4 => {
                // Every float dtype converts to f64 and back exactly, so untouched elements
                // keep their values and touched ones are rounded once.
                let mut sums: Vec<f64> = out.iter().map(|v| v.to_scalar().to_f64()).collect();
                for (&t, p) in pairs {
                    sums[t] += src[p].to_scalar().to_f64();
                }
                for (slot, v) in out.iter_mut().zip(sums) {
                    *slot = T::from_scalar(Scalar::F64(v));
                }
            }
            kiln_ir::Category::Float if accumulate => {
                // Few writes into a large base (a gather's gradient: 4,096 picks from 16M
                // logits): the same f64 sums, kept for the touched elements only. A dense f64
                // copy of the base made that scatter take 64 ms instead of 3.
                let mut sums: rustc_hash::FxHashMap<usize, f64> = Default::default();
                sums.reserve(targets.len());
                for (&t, p) in pairs {
                    *sums.entry(t).or_insert_with(|| out[t].to_scalar().to_f64()) +=
                        src[p].to_scalar().to_f64();
                }
                for (t, v) in sums {
                    out[t] = T::from_scalar(Scalar::F64(v));
                }
            }
            kiln_ir::Category::Int if accumulate => {
                for (&t, p) in pairs {
                    let sum = out[t].to_scalar().to_i64().wrapping_add(src[p].to_scalar().to_i64());
                    out[t] = T::from_scalar(Scalar::I64(sum));
                }
            }
            _ => {
                for (&t, p) in pairs {
                    out[t] = src[p];
                }
            }
        }
        };
        base.edited(base_shape, edit)
    })
}

/// For each position of `index` (row-major), the flat offset in a dense tensor of shape `x`
/// it selects: the position with coordinate `axis` replaced by the index value (what
/// `reference::index_targets` computes, with an odometer instead of per-element division).
fn index_targets(
    op: &'static str,
    axis: usize,
    x: &Shape,
    index: &Shape,
    values: &[i64],
) -> Result<Vec<usize>, RuntimeError> {
    let size = x.dims()[axis];
    let mut strides = x.contiguous_strides();
    let axis_stride = strides[axis] as usize;
    strides[axis] = 0;
    let mut out = Vec::with_capacity(values.len());
    let mut bad = None;
    for_each_offset(&View::from_parts(index.clone(), strides, 0), |i, base| {
        let v = values[i];
        if v < 0 || v as usize >= size {
            bad.get_or_insert(v);
            out.push(0);
        } else {
            out.push(base + v as usize * axis_stride);
        }
    });
    match bad {
        Some(index) => Err(RuntimeError::IndexOutOfRange { op, index, axis, size }),
        None => Ok(out),
    }
}

/// An index buffer's values as i64, borrowed when they are i64 already (a copy of a large
/// index costs more in fresh pages than the gather itself).
fn index_values(index: &Buffer) -> std::borrow::Cow<'_, [i64]> {
    match index.as_slice::<i64>() {
        Some(values) => values.into(),
        None => index.gather::<i64>(&View::contiguous(Shape::from([index.len()]))).into(),
    }
}

/// Whole rows an index selects: `starts[r]` is the offset in the indexed tensor of the row
/// that index row `r` (`len` positions, one value) picks.
struct Rows {
    starts: Vec<usize>,
    len: usize,
}

/// The rows of an index that is one value along every dimension after `axis`, those
/// dimensions being whole in `x`; `None` for any other index (or rows too short to gain).
fn index_rows(
    op: &'static str,
    axis: usize,
    x: &Shape,
    index: &Shape,
    values: &[i64],
) -> Option<Result<Rows, RuntimeError>> {
    let (xd, id) = (x.dims(), index.dims());
    let len: usize = id[axis + 1..].iter().product();
    if xd[axis + 1..] != id[axis + 1..] || len < 8 || values.is_empty() {
        return None;
    }
    if values.chunks_exact(len).any(|row| row.iter().any(|&v| v != row[0])) {
        return None;
    }
    // The same selection over the leading dimensions: each offset counts rows of `x`.
    let firsts: Vec<i64> = values.iter().step_by(len).copied().collect();
    let (x_rows, index_rows) = (Shape::new(xd[..=axis].to_vec()), Shape::new(id[..=axis].to_vec()));
    Some(
        index_targets(op, axis, &x_rows, &index_rows, &firsts)
            .map(|t| Rows { starts: t.into_iter().map(|r| r * len).collect(), len }),
    )
}

/// [`scatter`] of whole rows of a dense `src` (row `r` of `src` goes to `rows.starts[r]`),
/// in index order: sums of floats in f64 from the base value and rounded once, integers
/// wrapping, plain writes with the last one kept, as the element-wise path forms them.
fn scatter_rows(
    base: Base<'_>,
    base_shape: &Shape,
    rows: &Rows,
    src: &Buffer,
    accumulate: bool,
) -> Result<Buffer, RuntimeError> {
    let Rows { starts, len } = rows;
    let len = *len;
    with_element_type!(base.dtype(), T => {
        let src = src.as_slice::<T>().expect("scatter's src has the base's dtype");
        let edit = |out: &mut [T]| {
            let pairs = starts.iter().zip(src.chunks_exact(len));
            match T::DTYPE.category() {
                kiln_ir::Category::Float if accumulate => {
                    let mut sums: Vec<f64> = out.iter().map(|v| v.to_scalar().to_f64()).collect();
                    for (&t, row) in pairs {
                        for (s, v) in sums[t..t + len].iter_mut().zip(row) {
                            *s += v.to_scalar().to_f64();
                        }
                    }
                    for (slot, v) in out.iter_mut().zip(sums) {
                        *slot = T::from_scalar(Scalar::F64(v));
                    }
                }
                kiln_ir::Category::Int if accumulate => {
                    for (&t, row) in pairs {
                        for (o, v) in out[t..t + len].iter_mut().zip(row) {
                            let sum = o.to_scalar().to_i64().wrapping_add(v.to_scalar().to_i64());
                            *o = T::from_scalar(Scalar::I64(sum));
                        }
                    }
                }
                _ => {
                    for (&t, row) in pairs {
                        out[t..t + len].copy_from_slice(row);
                    }
                }
            }
        };
        base.edited(base_shape, edit)
    })
}
