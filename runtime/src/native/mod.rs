//! Native CPU loops for ops that do not fuse into kernels: `gather`, `scatter` and
//! `scatter_add`, `assign` (an in-place write through a view), `cumsum`, `argmax` and
//! `argmin`, random fills, `unview` (the gradient of a slice), and matrix products of dtypes
//! the device's library does not take.
//! They read the buffers in their own element types, where the reference executor converts
//! whole tensors to f64 first (a 4096-row cross-entropy gathered its 4096 logits in 79 ms
//! that way, and an argmax over 4096x4096 took 234 ms). Their semantics are the reference
//! executor's, which the tests compare them with.

use std::mem::MaybeUninit;

use kiln_ir::{
    DType, Element, Graph, NodeId, Op, RandomDist, ReduceOp, Scalar, Shape, View, random,
};

use crate::buffer::with_element_type;
use crate::{Buffer, RunError, RuntimeError};

mod index;
mod strided;

pub(crate) use index::{Base, scatter_into};
use index::{gather, scatter};

/// The op's value when it has a native loop; `None` sends it to the reference executor.
pub(crate) fn eval(
    graph: &Graph,
    id: NodeId,
    args: &[&Buffer],
) -> Option<Result<Buffer, RunError>> {
    let node = graph.node(id);
    let at =
        |error: RuntimeError| RunError { error, op: Some(node.op.name()), origin: node.origin };
    let ids = graph.args(id);
    let shape_of = |i: usize| &graph.node(ids[i]).shape;
    match &node.op {
        Op::Check(c) => Some(check(*c, args[0], args[1]).map_err(at)),
        Op::Gather { axis } => {
            Some(gather(args[0], shape_of(0), args[1], shape_of(1), *axis).map_err(at))
        }
        Op::Scatter { axis, accumulate } => Some(
            scatter(
                Base::Buffer(args[0]),
                shape_of(0),
                args[1],
                shape_of(1),
                args[2],
                shape_of(2),
                *axis,
                *accumulate,
            )
            .map_err(at),
        ),
        Op::Assign(view) => Some(assign(args[0], view, args[1]).map_err(at)),
        Op::CumSum { axis } => Some(cumsum(args[0], &node.shape, *axis).map_err(at)),
        Op::Attention { .. } | Op::AttentionGrad { .. } => {
            let views: Vec<View> =
                (0..args.len()).map(|i| View::contiguous(shape_of(i).clone())).collect();
            Some(attention(args, &views, &node.op).map_err(at))
        }
        Op::Collective(c) => {
            let len = crate::collective::result_len(c, args[0].len());
            Some(crate::collective::eval(c, args[0], len).map_err(at))
        }
        // A user's op on dense inputs (a GPU plan's, on host copies; the CPU planner reads
        // views into it as a library step).
        Op::Custom(c) => {
            let views: Vec<View> =
                (0..args.len()).map(|i| View::contiguous(shape_of(i).clone())).collect();
            let inputs: Vec<_> = args.iter().copied().zip(&views).collect();
            Some(crate::custom::run_cpu(c, &inputs, false).map_err(at))
        }
        Op::ArgSort { axis, descending } => {
            Some(argsort(args[0], &node.shape, *axis, *descending).map_err(at))
        }
        Op::Reduce { op: op @ (ReduceOp::ArgMax | ReduceOp::ArgMin), axes } if axes.len() == 1 => {
            Some(arg_extreme(*op, args[0], shape_of(0), axes[0]).map_err(at))
        }
        // A product the device's library does not take (on a GPU: integers), over dense
        // host copies.
        Op::MatMul => {
            let (va, vb) =
                (View::contiguous(shape_of(0).clone()), View::contiguous(shape_of(1).clone()));
            Some(crate::matmul::matmul(args[0], &va, args[1], &vb).map_err(at))
        }
        Op::Random { dist, key } if node.dtype != DType::Bool => {
            Some(random_fill(*dist, *key, node.dtype, node.shape.numel()).map_err(at))
        }
        Op::Unview { view, shape } if node.dtype != DType::Bool => {
            Some(unview(args[0], view, shape.numel()).map_err(at))
        }
        _ => None,
    }
}

/// A buffer of `len` elements `value` with `edit` applied.
fn edited_fill<T: Element>(
    len: usize,
    value: T,
    edit: impl FnOnce(&mut [T]),
) -> Result<Buffer, RuntimeError> {
    edited(len, |_, chunk| chunk.fill(MaybeUninit::new(value)), edit)
}

/// A buffer holding `base` with `edit` applied. (A `Vec` copy and then a buffer of it cost
/// two copies and a fresh allocation of the whole tensor: the gradient of a 4096-row
/// cross-entropy, a scatter into 64 MiB of zeros, took 37 ms that way.)
fn edited_copy<T: Element>(
    base: &[T],
    edit: impl FnOnce(&mut [T]),
) -> Result<Buffer, RuntimeError> {
    edited(
        base.len(),
        |start, chunk| {
            let src = &base[start..start + chunk.len()];
            // SAFETY: `chunk` and `src` have the same length and do not overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    src.as_ptr(),
                    chunk.as_mut_ptr().cast::<T>(),
                    src.len(),
                );
            }
        },
        edit,
    )
}

/// Elements per thread task of [`edited`]'s initial writes.
const CHUNK: usize = 1 << 16;

/// A buffer of `len` elements from kiln's caching allocator, written first by `init`
/// (called with each chunk's first position and its memory, on all threads), then changed
/// by `edit`.
fn edited<T: Element>(
    len: usize,
    init: impl Fn(usize, &mut [MaybeUninit<T>]) + Sync,
    edit: impl FnOnce(&mut [T]),
) -> Result<Buffer, RuntimeError> {
    /// The buffer's memory shared by the threads, each initializing its own chunk.
    struct Shared<T>(*mut MaybeUninit<T>);
    // SAFETY: the threads write disjoint chunks.
    unsafe impl<T> Sync for Shared<T> {}
    // SAFETY: `init` writes every chunk (together, every element) before `edit` sees the
    // elements as initialized.
    let filled = unsafe {
        Buffer::from_raw_fill(T::DTYPE, len, |ptr| {
            let out = Shared(ptr.cast::<MaybeUninit<T>>());
            crate::team::for_each(len.div_ceil(CHUNK), &|i| {
                let out = &out;
                let start = i * CHUNK;
                init(
                    start,
                    std::slice::from_raw_parts_mut(out.0.add(start), CHUNK.min(len - start)),
                );
            });
            if len > 0 {
                edit(std::slice::from_raw_parts_mut(out.0.cast::<T>(), len));
            }
            Ok::<(), std::convert::Infallible>(())
        })
    }?;
    Ok(filled.unwrap_or_else(|never| match never {}))
}

/// A buffer of `x`'s values each mapped by `f`, on all threads, each element written once.
pub(crate) fn mapped<S: Copy + Sync, T: Element>(
    x: &[S],
    f: impl Fn(S) -> T + Sync,
) -> Result<Buffer, RuntimeError> {
    edited(
        x.len(),
        |start, chunk: &mut [MaybeUninit<T>]| {
            for (out, &v) in chunk.iter_mut().zip(&x[start..]) {
                out.write(f(v));
            }
        },
        |_| {},
    )
}

/// A buffer of `x`'s values converted element for element by `convert`, which is handed
/// matching chunks of `x` and of the buffer, on all threads.
pub(crate) fn converted<S: Sync, T: Element>(
    x: &[S],
    convert: impl Fn(&[S], &mut [T]) + Sync,
) -> Result<Buffer, RuntimeError> {
    edited(
        x.len(),
        |start, chunk: &mut [MaybeUninit<T>]| {
            // SAFETY: all-zero bytes are a value of every element type (a memset, where a
            // fill with a generic zero compiled to a scalar loop).
            unsafe { std::ptr::write_bytes(chunk.as_mut_ptr(), 0, chunk.len()) };
            // SAFETY: every element was just written.
            let chunk = unsafe { &mut *(chunk as *mut [MaybeUninit<T>] as *mut [T]) };
            convert(&x[start..start + chunk.len()], chunk);
        },
        |_| {},
    )
}

/// A copy of `base` with `values` written at the positions `view` selects.
fn assign(base: &Buffer, view: &View, values: &Buffer) -> Result<Buffer, RuntimeError> {
    assign_from(base, view, values, &View::contiguous(view.shape().clone()))
}

/// [`assign`] of `values` read through `src` (a view of `view`'s shape).
pub(crate) fn assign_from(
    base: &Buffer,
    view: &View,
    values: &Buffer,
    src: &View,
) -> Result<Buffer, RuntimeError> {
    with_element_type!(base.dtype(), T => {
        let base = base.as_slice::<T>().expect("the buffer's own element type");
        let values = values.as_slice::<T>().expect("assign's values have the base's dtype");
        edited_copy(base, |out| strided::write_viewed(out, values, src, view, Overlaps::Distinct))
    })
}

/// [`assign_from`] into `base` itself, when no other handle shares it; `false` (and `base`
/// untouched) otherwise.
pub(crate) fn assign_in_place(base: &mut Buffer, view: &View, values: &Buffer, src: &View) -> bool {
    with_element_type!(base.dtype(), T => {
        let (Some(out), Some(values)) = (base.unique_slice_mut::<T>(), values.as_slice::<T>())
        else {
            return false;
        };
        strided::write_viewed(out, values, src, view, Overlaps::Distinct);
        true
    })
}

/// Running sums along `axis`: floats accumulated in f64 and each rounded once, integers
/// wrapping, as the reference executor computes them.
fn cumsum(x: &Buffer, shape: &Shape, axis: usize) -> Result<Buffer, RuntimeError> {
    let dims = shape.dims();
    let len = dims[axis];
    let inner: usize = dims[axis + 1..].iter().product();
    let outer: usize = dims[..axis].iter().product();
    with_element_type!(x.dtype(), T => {
        let x = x.as_slice::<T>().expect("the buffer's own element type");
        let float = T::DTYPE.category() == kiln_ir::Category::Float;
        edited_copy(x, |out| {
        for o in 0..outer {
            for i in 0..inner {
                let first = o * len * inner + i;
                let (mut f, mut n) = (0.0f64, 0i64);
                for k in 0..len {
                    let at = first + k * inner;
                    let v = x[at].to_scalar();
                    out[at] = if float {
                        f += v.to_f64();
                        T::from_scalar(Scalar::F64(f))
                    } else {
                        n = n.wrapping_add(v.to_i64());
                        T::from_scalar(Scalar::I64(n))
                    };
                }
            }
        }
        })
    })
}

/// Fused attention (`Op::Attention`) or its packed gradients (`Op::AttentionGrad`), each
/// operand read through its view of its buffer (`[.., rows, cols]`: a head split of a
/// projection is strided rows, not a copy).
pub(crate) fn attention(args: &[&Buffer], views: &[View], op: &Op) -> Result<Buffer, RuntimeError> {
    use crate::attention::{Dims, Inputs, Operand, backward, forward};
    let (Op::Attention { mask, scale } | Op::AttentionGrad { mask, scale }) = *op else {
        unreachable!("attention evaluates the attention ops")
    };
    let kiln_ir::AttentionDims { n, l, e, s, ev } =
        kiln_ir::AttentionDims::of(views[0].shape(), views[1].shape(), views[2].shape());
    let d = Dims { n, l, e, s, ev, mask, scale: f64::from_bits(scale) };
    let grad = matches!(op, Op::AttentionGrad { .. });
    let len = if grad { n * (l * e + s * e + s * ev) } else { n * l * ev };
    fn operand<'a, T: Element>(
        args: &[&'a Buffer],
        views: &[View],
        i: usize,
    ) -> Result<Operand<'a, T>, RuntimeError> {
        let data = args[i].as_slice::<T>().expect("attention's operands share a dtype");
        Operand::of_view(data, &views[i]).ok_or_else(|| {
            RuntimeError::Graph(kiln_ir::IrError::InvalidGraph(format!(
                "attention reads operands through views of rank 3 or more with \
                 non-negative strides inside their buffers, not {:?} of {} elements",
                views[i],
                data.len()
            )))
        })
    }
    /// The output gradient after q, k, v; a given mask last.
    fn inputs<'a, T: Element>(
        args: &[&'a Buffer],
        views: &[View],
        grad: bool,
        mask: kiln_ir::AttentionMask,
    ) -> Result<Inputs<'a, T>, RuntimeError> {
        let dout = if grad { Some(operand(args, views, 3)?) } else { None };
        let mask = match mask {
            kiln_ir::AttentionMask::Given => Some(operand(args, views, args.len() - 1)?),
            _ => None,
        };
        let (q, k, v) =
            (operand(args, views, 0)?, operand(args, views, 1)?, operand(args, views, 2)?);
        Ok(Inputs { q, k, v, dout, mask })
    }
    fn compute<T: crate::attention::Real>(x: &Inputs<'_, T>, d: &Dims, grad: bool, out: &mut [T]) {
        if grad {
            backward(x, d, out);
        } else {
            forward(x, d, out);
        }
    }
    match args[0].dtype() {
        DType::F32 => {
            let x = inputs::<f32>(args, views, grad, mask)?;
            Buffer::zeroed_with(len, |out| compute(&x, &d, grad, out))
        }
        DType::F64 => {
            let x = inputs::<f64>(args, views, grad, mask)?;
            Buffer::zeroed_with(len, |out| compute(&x, &d, grad, out))
        }
        DType::BF16 => attention_16(&inputs::<half::bf16>(args, views, grad, mask)?, &d, grad, len),
        DType::F16 => attention_16(&inputs::<half::f16>(args, views, grad, mask)?, &d, grad, len),
        dtype => Err(RuntimeError::Graph(kiln_ir::IrError::dtype(
            "attention",
            format!("takes float operands, got {dtype}"),
        ))),
    }
}

/// Attention (or its packed gradients) over 16-bit operands, in f32. With enough batch
/// entries to keep every thread busy, one entry per task: the entry's operands widened on
/// its thread into scratch that stays in cache, computed, and its results rounded once;
/// otherwise the operands are widened whole first.
fn attention_16<H: crate::matmul::Half>(
    x: &crate::attention::Inputs<'_, H>,
    d: &crate::attention::Dims,
    grad: bool,
    len: usize,
) -> Result<Buffer, RuntimeError> {
    use crate::attention::{Dims, backward, backward_entry, forward, forward_entry};
    let operands = || [Some(&x.q), Some(&x.k), Some(&x.v), x.dout.as_ref()].into_iter().flatten();
    // The operands' entries `entries`, widened to dense f32.
    let widened = |entries: std::ops::Range<usize>| -> Vec<Vec<f32>> {
        operands()
            .map(|o| {
                let mut w = Vec::new();
                entries.clone().for_each(|b| o.gather_entry(b, |h: H| h.widen(), &mut w));
                w
            })
            .collect()
    };
    if d.n < crate::team::threads() || len == 0 {
        let wide = widened(0..d.n);
        let mut acc = vec![0.0f32; len];
        if grad {
            backward(&dense_inputs(&wide, d.n, d, grad, x.mask.clone()), d, &mut acc);
        } else {
            forward(&dense_inputs(&wide, d.n, d, grad, x.mask.clone()), d, &mut acc);
        }
        return crate::matmul::narrow_half(&acc, H::DTYPE);
    }
    let per = len / d.n;
    Buffer::zeroed_with(len, |out: &mut [H]| {
        crate::team::for_each_part(out.chunks_mut(per).collect(), &|b, part| {
            let mut acc = vec![0.0f32; per];
            let mask = x.mask.as_ref().map(|m| m.entry(b));
            if grad {
                let one = Dims { n: 1, ..*d };
                let wide = widened(b..b + 1);
                backward_entry(&dense_inputs(&wide, 1, &one, grad, mask), &one, &mut acc);
            } else {
                // Only the keys and values some query sees are widened: a decode step over
                // a static cache reads its filled slots, not the whole cache.
                let one = Dims { n: 1, s: x.keys_seen(b, d), ..*d };
                let wide: Vec<Vec<f32>> = [(&x.q, d.l), (&x.k, one.s), (&x.v, one.s)]
                    .into_iter()
                    .map(|(o, rows)| {
                        let mut w = Vec::new();
                        o.gather_rows(b, rows, |h: H| h.widen(), &mut w);
                        w
                    })
                    .collect();
                forward_entry(&dense_inputs(&wide, 1, &one, grad, mask), &one, &mut acc);
            }
            for (o, &a) in part.iter_mut().zip(&acc) {
                *o = H::narrow(a);
            }
        });
    })
}

/// Dense f32 operands of `n` batch entries held in `wide`: q, k, v and, for the gradients,
/// dout; and the given mask.
fn dense_inputs<'a>(
    wide: &'a [Vec<f32>],
    n: usize,
    d: &crate::attention::Dims,
    grad: bool,
    mask: Option<crate::attention::Operand<'a, bool>>,
) -> crate::attention::Inputs<'a, f32> {
    use crate::attention::Operand;
    let dense = |i: usize, rows: usize, cols: usize| Operand::dense(&wide[i], n, rows, cols);
    crate::attention::Inputs {
        q: dense(0, d.l, d.e),
        k: dense(1, d.s, d.e),
        v: dense(2, d.s, d.ev),
        dout: grad.then(|| dense(3, d.l, d.ev)),
        mask,
    }
}

/// The stable argsort of every line along `axis`: NaN above every number, -0 equal to +0.
fn argsort(
    x: &Buffer,
    shape: &Shape,
    axis: usize,
    descending: bool,
) -> Result<Buffer, RuntimeError> {
    use std::cmp::Ordering;
    let dims = shape.dims();
    let len = dims[axis];
    let inner: usize = dims[axis + 1..].iter().product();
    let outer: usize = dims[..axis].iter().product();
    let order = |a: &(bool, f64, i64), b: &(bool, f64, i64)| -> Ordering {
        let o = match (a.0, b.0) {
            (false, false) => a.1.partial_cmp(&b.1).unwrap_or(Ordering::Equal).then(a.2.cmp(&b.2)),
            (x, y) => x.cmp(&y),
        };
        if descending { o.reverse() } else { o }
    };
    let mut out = vec![0i64; outer * len * inner];
    if len > 0 && inner > 0 {
        with_element_type!(x.dtype(), T => {
            let x = x.as_slice::<T>().expect("the buffer's own element type");
            // One block of `len * inner` outputs per outer index; lines inside it are strided.
            let block = |(o, out): (usize, &mut [i64])| {
                let mut keys = Vec::with_capacity(len);
                let mut idx: Vec<usize> = Vec::with_capacity(len);
                for i in 0..inner {
                    let first = o * len * inner + i;
                    keys.clear();
                    keys.extend((0..len).map(|k| key(x[first + k * inner].to_scalar())));
                    idx.clear();
                    idx.extend(0..len);
                    // Stable, so equal elements keep their order.
                    idx.sort_by(|&a, &b| order(&keys[a], &keys[b]));
                    for (k, &j) in idx.iter().enumerate() {
                        out[k * inner + i] = j as i64;
                    }
                }
            };
            if outer * len * inner >= 1 << 14 && outer > 1 {
                crate::team::for_each_part(out.chunks_mut(len * inner).collect(), &|o, c| block((o, c)));
            } else {
                out.chunks_mut(len * inner).enumerate().for_each(block);
            }
        });
    }
    Buffer::from_slice(&out)
}

/// The comparison key of an element: NaN first, then the value (floats as f64, the others
/// as i64), as the reference executor orders them.
fn key(v: Scalar) -> (bool, f64, i64) {
    match v {
        Scalar::F64(f) => (f.is_nan(), f, 0),
        Scalar::I64(i) => (false, 0.0, i),
        Scalar::Bool(b) => (false, 0.0, i64::from(b)),
    }
}

/// The index along `axis` of each line's largest (`ArgMax`) or smallest element: the first
/// of equal ones, and the first NaN if there is one.
fn arg_extreme(
    op: ReduceOp,
    x: &Buffer,
    shape: &Shape,
    axis: usize,
) -> Result<Buffer, RuntimeError> {
    let dims = shape.dims();
    let len = dims[axis];
    let inner: usize = dims[axis + 1..].iter().product();
    let outer: usize = dims[..axis].iter().product();
    let better = |new: (bool, f64, i64), best: (bool, f64, i64)| -> bool {
        if best.0 {
            return false;
        }
        if new.0 {
            return true;
        }
        match op {
            ReduceOp::ArgMax => new.1 > best.1 || new.2 > best.2,
            _ => new.1 < best.1 || new.2 < best.2,
        }
    };
    let mut out = vec![0i64; outer * inner];
    if len > 0 && inner > 0 {
        with_element_type!(x.dtype(), T => {
            let x = x.as_slice::<T>().expect("the buffer's own element type");
            let line = |o: usize, i: usize| -> i64 {
                let first = o * len * inner + i;
                let mut best = (0, key(x[first].to_scalar()));
                for k in 1..len {
                    let cand = key(x[first + k * inner].to_scalar());
                    if better(cand, best.1) {
                        best = (k, cand);
                    }
                }
                best.0 as i64
            };
            let rows = |(o, row): (usize, &mut [i64])| {
                for (i, slot) in row.iter_mut().enumerate() {
                    *slot = line(o, i);
                }
            };
            if outer * inner * len >= 1 << 16 && outer > 1 {
                crate::team::for_each_part(out.chunks_mut(inner).collect(), &|o, r| rows((o, r)));
            } else {
                out.chunks_mut(inner).enumerate().for_each(rows);
            }
        });
    }
    Buffer::from_slice(&out)
}

/// A random fill in parallel chunks: each element a pure function of the key and its index,
/// converted to the dtype as the reference executor converts it.
fn random_fill(dist: RandomDist, key: u64, dtype: DType, n: usize) -> Result<Buffer, RuntimeError> {
    let bits = dtype.mantissa_bits().unwrap_or(53);
    let value = move |i: u64| match dist {
        RandomDist::Uniform => Scalar::F64(random::uniform(key, i, bits)),
        RandomDist::Normal => Scalar::F64(random::normal(key, i)),
        RandomDist::Int { low, high } => Scalar::I64(random::int(key, i, low, high)),
    };
    with_element_type!(dtype, T => edited::<T>(
        n,
        |start, chunk| {
            for (j, slot) in chunk.iter_mut().enumerate() {
                slot.write(T::from_scalar(value((start + j) as u64)));
            }
        },
        |_| {},
    ))
}

/// The adjoint of a view: zeros, with each input element added at the position the view
/// reads it from. Where the view reads a position once (a permute, a slice) the values are
/// copied; where it reads one several times (a broadcast) their sum is taken in f64 (i64 for
/// integers) and rounded once, as the reference executor does.
fn unview(x: &Buffer, view: &View, len: usize) -> Result<Buffer, RuntimeError> {
    unview_from(x, &View::contiguous(view.shape().clone()), view, len)
}

/// [`unview`] of `x` read through `src` (a view of `view`'s shape).
pub(crate) fn unview_from(
    x: &Buffer,
    src: &View,
    view: &View,
    len: usize,
) -> Result<Buffer, RuntimeError> {
    let overlaps = match (view.is_non_overlapping(), x.dtype().is_float()) {
        (true, _) => Overlaps::Distinct,
        (false, true) => Overlaps::SumFloat,
        (false, false) => Overlaps::SumInt,
    };
    with_element_type!(x.dtype(), T => {
        let x = x.as_slice::<T>().expect("the buffer's own element type");
        let zero = T::from_scalar(Scalar::I64(0));
        edited::<T>(
            len,
            |_, chunk| chunk.iter_mut().for_each(|slot| { slot.write(zero); }),
            |out| strided::write_viewed(out, x, src, view, overlaps),
        )
    })
}

/// How [`write_through`] treats positions that a view reads more than once.
#[derive(Clone, Copy)]
enum Overlaps {
    /// Every position is read at most once: values are written.
    Distinct,
    /// Float values are summed in f64 and rounded once.
    SumFloat,
    /// Integer values are summed wrapping in i64.
    SumInt,
}

/// Writes (or adds, per `overlaps`) `x`'s elements at the positions `view` reads them from.
/// When each index of one of the view's dimensions covers its own range of `out` (the
/// samples of a batch, wherever the view puts them: a convolution's columns hold the batch
/// beside the pixels), those ranges run in parallel.
fn write_through<T: Element>(out: &mut [T], x: &[T], view: &View, overlaps: Overlaps) {
    let (dims, strides) = (view.shape().dims(), view.strides());
    let whole = Rows { x, block: x.len().max(1), stride: 0, start: 0 };
    if x.len() < 1 << 15 || strides.iter().any(|&s| s < 0) {
        return scatter_serial(out, whole, view, overlaps);
    }
    // A dimension (not the innermost, whose rows the scatter walks) whose every index
    // writes a range of `out` that no other index reaches.
    let span: isize = dims.iter().zip(strides).map(|(&d, &s)| (d as isize - 1).max(0) * s).sum();
    let split = (0..dims.len().saturating_sub(1)).find(|&d| {
        let (n, s) = (dims[d] as isize, strides[d]);
        n > 1 && s > 0 && span - (n - 1) * s < s
    });
    let Some(d) = split else {
        return scatter_serial(out, whole, view, overlaps);
    };
    let (n, s) = (dims[d], strides[d] as usize);
    let mut sub_dims = dims.to_vec();
    let mut sub_strides = strides.to_vec();
    sub_dims.remove(d);
    sub_strides.remove(d);
    let sub = View::from_parts(Shape::new(sub_dims), sub_strides, 0);
    // `x` is in the view's order: the elements with index `i` along `d` are blocks of
    // `inner` consecutive elements, `n · inner` apart.
    let inner: usize = dims[d + 1..].iter().product();
    let outs = out[view.offset()..].chunks_mut(s).take(n).collect();
    crate::team::for_each_part(outs, &|i, o| {
        let part = Rows { x, block: inner, stride: n * inner, start: i * inner };
        scatter_serial(o, part, &sub, overlaps);
    });
}

/// Part of a row-major buffer `x`: its element `j` is at
/// `start + (j / block) * stride + j % block`. Rows of the scattered view never cross a block.
#[derive(Clone, Copy)]
struct Rows<'a, T> {
    x: &'a [T],
    block: usize,
    stride: usize,
    start: usize,
}

/// Runs `f` on `len` zeroed f64 sums: a buffer the thread keeps between calls when it is
/// at most 8 MiB (a col2im's per-image sums, fresh from the system on every call, spent more
/// time in page faults than in the additions).
fn with_sums(len: usize, f: impl FnOnce(&mut [f64])) {
    const KEPT: usize = 1 << 20;
    thread_local! {
        static SUMS: std::cell::RefCell<Vec<f64>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    if len > KEPT {
        return f(&mut vec![0.0; len]);
    }
    SUMS.with_borrow_mut(|sums| {
        sums.clear();
        sums.resize(len, 0.0);
        f(sums);
    });
}

impl<'a, T: Copy> Rows<'a, T> {
    /// The rows from element 0 on, each call the next `len` elements: what [`Rows::row`]
    /// gives for consecutive rows, without its division per row.
    fn in_order(self) -> impl FnMut(usize) -> &'a [T] {
        let (mut at, mut into) = (self.start, 0);
        move |len| {
            if into == self.block {
                at += self.stride - self.block;
                into = 0;
            }
            let row = &self.x[at..at + len];
            at += len;
            into += len;
            row
        }
    }

    fn at(&self, j: usize) -> usize {
        self.start + (j / self.block) * self.stride + j % self.block
    }

    /// Elements `j..j + len`, inside one block.
    fn row(&self, j: usize, len: usize) -> &'a [T] {
        let p = self.at(j);
        &self.x[p..p + len]
    }

    fn get(&self, j: usize) -> T {
        self.x[self.at(j)]
    }
}

fn scatter_serial<T: Element>(out: &mut [T], x: Rows<'_, T>, view: &View, overlaps: Overlaps) {
    let (dims, strides) = (view.shape().dims(), view.strides());
    match overlaps {
        // Rows of consecutive elements (a `cat`'s pieces, a slice's rows) copy whole.
        Overlaps::Distinct if strides.last() == Some(&1) => {
            let (&inner, outer) = dims.split_last().expect("a view with a stride has a dim");
            let starts = View::from_parts(
                Shape::new(outer.to_vec()),
                strides[..outer.len()].to_vec(),
                view.offset(),
            );
            for_each_offset(&starts, |r, p| {
                out[p..p + inner].copy_from_slice(x.row(r * inner, inner));
            });
        }
        Overlaps::Distinct => for_each_offset(view, |i, p| out[p] = x.get(i)),
        Overlaps::SumFloat => with_sums(out.len(), |sums| {
            let mut rows = x.in_order();
            for_each_row(view, |_, p, len, step| add_row(sums, p, rows(len), step));
            for (slot, &s) in out.iter_mut().zip(sums.iter()) {
                *slot = T::from_scalar(Scalar::F64(s));
            }
        }),
        Overlaps::SumInt => {
            let mut sums = vec![0i64; out.len()];
            for_each_offset(view, |i, p| {
                sums[p] = sums[p].wrapping_add(x.get(i).to_scalar().to_i64());
            });
            for (slot, s) in out.iter_mut().zip(sums) {
                *slot = T::from_scalar(Scalar::I64(s));
            }
        }
    }
}

/// Calls `f(i, offset)` for each element `i` of `view` in order (what `View::offsets` does
/// element by element, several times slower on the many-dimensional views of convolution
/// windows).
fn for_each_offset(view: &View, mut f: impl FnMut(usize, usize)) {
    for_each_row(view, |i, base, inner, step| {
        let mut p = base;
        for k in 0..inner {
            f(i + k, p as usize);
            p += step;
        }
    });
}

/// Calls `f(i, offset, len, step)` for each row of `view`'s innermost dimension in order:
/// the row's elements are `i..i + len`, read at `offset + k * step`. An odometer walks the
/// outer dimensions, so the callers' inner loops see whole rows (and vectorize).
fn for_each_row(view: &View, mut f: impl FnMut(usize, isize, usize, isize)) {
    let dims = view.shape().dims();
    let strides = view.strides();
    let numel = view.shape().numel();
    if numel == 0 {
        return;
    }
    let Some((&inner, outer_dims)) = dims.split_last() else {
        f(0, view.offset() as isize, 1, 0);
        return;
    };
    let step = strides[dims.len() - 1];
    let mut index = vec![0usize; outer_dims.len()];
    let mut base = view.offset() as isize;
    let mut i = 0;
    loop {
        f(i, base, inner, step);
        i += inner;
        if i >= numel {
            return;
        }
        // Advance the odometer over the outer dimensions.
        let mut d = outer_dims.len();
        loop {
            d -= 1;
            index[d] += 1;
            base += strides[d];
            if index[d] < outer_dims[d] {
                break;
            }
            base -= strides[d] * outer_dims[d] as isize;
            index[d] = 0;
        }
    }
}

/// `sums[p + k * step] += x[k]` in f64 for each `k`: rows with a positive step as a zip
/// the compiler vectorizes (a plain one for the contiguous windows of a stride-1
/// convolution), the others element by element.
fn add_row<T: Element>(sums: &mut [f64], p: isize, x: &[T], step: isize) {
    let add = |(s, v): (&mut f64, &T)| *s += v.to_scalar().to_f64();
    match step {
        1 => sums[p as usize..][..x.len()].iter_mut().zip(x).for_each(add),
        s if s > 1 => sums[p as usize..].iter_mut().step_by(s as usize).zip(x).for_each(add),
        _ => {
            for (k, v) in x.iter().enumerate() {
                sums[(p + k as isize * step) as usize] += v.to_scalar().to_f64();
            }
        }
    }
}

/// An [`Op::Check`]: `x` copied when every element of `ok` is true.
fn check(c: kiln_ir::Check, x: &Buffer, ok: &Buffer) -> Result<Buffer, RuntimeError> {
    let rows = ok.gather::<bool>(&View::contiguous(Shape::from([ok.len()])));
    crate::reference::failed_check(c, &rows)?;
    let all = View::contiguous(Shape::from([x.len()]));
    with_element_type!(x.dtype(), T => Buffer::from_slice(&x.gather::<T>(&all)))
}
