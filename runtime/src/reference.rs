//! The reference executor: runs a graph one op at a time with plain loops.
//!
//! It is the oracle that every fused and generated kernel is tested against, so it is written
//! to be obviously correct rather than fast:
//!
//! - Floating-point values are computed in f64 and rounded to the node's dtype after every
//!   op. For `+ - * /` and `sqrt` this gives exactly the IEEE result of the narrow type (f64
//!   has more than twice the precision of f32, so the double rounding is harmless); for the
//!   transcendental functions it is the correctly rounded value of an f64 approximation,
//!   more accurate than what any fast kernel computes.
//! - Integers are computed in i64 with wrapping arithmetic and wrapped to the node's width.
//! - Every scalar op is the one definition in `kiln_ir::semantics`, which constant folding,
//!   the kernel interpreter and the CPU code generator's helper calls share.
//! - Booleans are booleans.
//!
//! Intermediate values are freed after their last use.

use kiln_ir::{
    BinaryOp, DType, Graph, NodeId, Op, RandomDist, ReduceOp, Scalar, Shape, UnaryOp,
    bf16_from_f64, f16_from_f64, random,
};

use crate::{Buffer, RunError, RuntimeError};
use kiln_ir::semantics;

/// The values of one node, in the domain its dtype computes in.
#[derive(Clone, Debug)]
enum Values {
    F(Vec<f64>),
    I(Vec<i64>),
    B(Vec<bool>),
}

/// Runs `graph` with `inputs` bound to its `Input` nodes (in [`Graph::inputs`] order) and
/// returns one buffer per output (in [`Graph::outputs`] order).
///
/// # Errors
/// A [`RunError`] naming the node that failed: out of memory, or an input buffer that does not
/// match its node.
pub fn run(graph: &Graph, inputs: &[Buffer]) -> Result<Vec<Buffer>, RunError> {
    if inputs.len() != graph.inputs().len() {
        return Err(RuntimeError::Binding {
            index: inputs.len().min(graph.inputs().len()),
            expected: format!("{} inputs", graph.inputs().len()),
            got: format!("{} buffers", inputs.len()),
        }
        .into());
    }
    let order = graph.topo_order();
    let bound = order.iter().map(|n| n.index() + 1).max().unwrap_or(0);
    let mut remaining = vec![0usize; bound];
    for &id in &order {
        remaining[id.index()] = graph.uses(id);
    }
    for &o in graph.outputs() {
        remaining[o.index()] += 1;
    }
    let mut input_of = vec![None; bound];
    for (i, &id) in graph.inputs().iter().enumerate() {
        input_of[id.index()] = Some(i);
    }

    let mut values: Vec<Option<Values>> = vec![None; bound];
    let mut results: Vec<Option<Buffer>> = vec![None; bound];
    for &id in &order {
        let node = graph.node(id);
        let at =
            |error: RuntimeError| RunError { error, op: Some(node.op.name()), origin: node.origin };
        let args = graph.args(id);
        let computed: Values = match &node.op {
            Op::Input => {
                let index =
                    input_of[id.index()].expect("every Input node is listed in graph.inputs()");
                let buf = &inputs[index];
                if buf.dtype() != node.dtype || buf.len() != node.shape.numel() {
                    return Err(at(RuntimeError::Binding {
                        index,
                        expected: format!("{} {}", node.shape, node.dtype),
                        got: format!("{} elements of {}", buf.len(), buf.dtype()),
                    }));
                }
                load(buf)
            }
            op => {
                reserve(node.shape.numel()).map_err(at)?;
                let arg_values: Vec<&Values> = args
                    .iter()
                    .map(|a| values[a.index()].as_ref().expect("inputs are computed first"))
                    .collect();
                let arg_shapes: Vec<&Shape> = args.iter().map(|&a| &graph.node(a).shape).collect();
                let arg_dtypes: Vec<DType> = args.iter().map(|&a| graph.node(a).dtype).collect();
                eval(op, &node.shape, node.dtype, &arg_values, &arg_shapes, &arg_dtypes)
                    .map_err(at)?
            }
        };
        let computed = round(computed, node.dtype);
        if graph.outputs().contains(&id) {
            results[id.index()] = Some(store(&computed, node.dtype).map_err(at)?);
        }
        values[id.index()] = Some(computed);
        for a in args {
            release(&mut remaining, &mut values, a);
        }
        if remaining[id.index()] == 0 {
            values[id.index()] = None;
        }
    }
    Ok(graph
        .outputs()
        .iter()
        .map(|o| results[o.index()].clone().expect("outputs are stored when computed"))
        .collect())
}

/// Checks that a node's values fit in memory before computing them: the loops below collect
/// into ordinary vectors, whose allocation failure would abort the process rather than
/// return an error.
fn reserve(n: usize) -> Result<(), RuntimeError> {
    let bytes = n.saturating_mul(std::mem::size_of::<f64>());
    let mut probe: Vec<f64> = Vec::new();
    probe
        .try_reserve_exact(n)
        .map_err(|_| RuntimeError::OutOfMemory { device: crate::Device::Cpu, bytes })
}

/// Computes one node from its inputs' buffers (in argument order): the executor uses this
/// for the ops it does not fuse.
///
/// # Errors
/// A [`RunError`] naming the node: out of memory, or an index out of range.
pub fn eval_node(graph: &Graph, id: NodeId, args: &[&Buffer]) -> Result<Buffer, RunError> {
    let node = graph.node(id);
    let at =
        |error: RuntimeError| RunError { error, op: Some(node.op.name()), origin: node.origin };
    reserve(node.shape.numel()).map_err(at)?;
    let values: Vec<Values> = args.iter().map(|b| load(b)).collect();
    let refs: Vec<&Values> = values.iter().collect();
    let ids = graph.args(id);
    let shapes: Vec<&Shape> = ids.iter().map(|&a| &graph.node(a).shape).collect();
    let dtypes: Vec<DType> = ids.iter().map(|&a| graph.node(a).dtype).collect();
    let computed = eval(&node.op, &node.shape, node.dtype, &refs, &shapes, &dtypes).map_err(at)?;
    store(&round(computed, node.dtype), node.dtype).map_err(at)
}

fn release(remaining: &mut [usize], values: &mut [Option<Values>], id: NodeId) {
    let r = &mut remaining[id.index()];
    *r -= 1;
    if *r == 0 {
        values[id.index()] = None;
    }
}

fn load(buf: &Buffer) -> Values {
    let all = kiln_ir::View::contiguous(Shape::from([buf.len()]));
    match buf.dtype().category() {
        kiln_ir::Category::Float => Values::F(buf.gather::<f64>(&all)),
        kiln_ir::Category::Int => Values::I(buf.gather::<i64>(&all)),
        kiln_ir::Category::Bool => Values::B(buf.gather::<bool>(&all)),
    }
}

fn store(values: &Values, dtype: DType) -> Result<Buffer, RuntimeError> {
    match (values, dtype) {
        (Values::F(v), DType::F32) => Buffer::from_iter(v.len(), v.iter().map(|&x| x as f32)),
        (Values::F(v), DType::F64) => Buffer::from_slice(v),
        (Values::F(v), DType::F16) => {
            Buffer::from_iter(v.len(), v.iter().map(|&x| f16_from_f64(x)))
        }
        (Values::F(v), DType::BF16) => {
            Buffer::from_iter(v.len(), v.iter().map(|&x| bf16_from_f64(x)))
        }
        (Values::I(v), DType::I64) => Buffer::from_slice(v),
        (Values::I(v), DType::I32) => Buffer::from_iter(v.len(), v.iter().map(|&x| x as i32)),
        (Values::I(v), DType::I8) => Buffer::from_iter(v.len(), v.iter().map(|&x| x as i8)),
        (Values::I(v), DType::U8) => Buffer::from_iter(v.len(), v.iter().map(|&x| x as u8)),
        (Values::B(v), DType::Bool) => Buffer::from_slice(v),
        (v, d) => unreachable!("values in the wrong domain for {d}: {v:?}"),
    }
}

/// Rounds floats to the precision of `dtype` and wraps integers to its width.
fn round(values: Values, dtype: DType) -> Values {
    match values {
        Values::F(mut v) => {
            if dtype != DType::F64 {
                v.iter_mut().for_each(|x| *x = semantics::round(dtype, *x));
            }
            Values::F(v)
        }
        Values::I(mut v) => {
            v.iter_mut().for_each(|x| *x = semantics::wrap(dtype, *x));
            Values::I(v)
        }
        b => b,
    }
}

/// One op over f64 values. A collective is communication, not arithmetic: it runs on the
/// group's engine, whichever executor asks.
fn eval(
    op: &Op,
    shape: &Shape,
    dtype: DType,
    args: &[&Values],
    shapes: &[&Shape],
    dtypes: &[DType],
) -> Result<Values, RuntimeError> {
    let n = shape.numel();
    Ok(match op {
        Op::Input => unreachable!("inputs are bound, not evaluated"),
        Op::Full(s) => fill(dtype, n, *s),
        Op::Random { dist, key } => random_fill(*dist, *key, dtype, n),
        Op::Unary(u) => unary(*u, args[0]),
        Op::Binary(b) => binary(*b, args[0], args[1]),
        Op::Where => {
            let Values::B(c) = args[0] else { unreachable!("where's condition is bool") };
            match (args[1], args[2]) {
                (Values::F(a), Values::F(b)) => Values::F(select(c, a, b)),
                (Values::I(a), Values::I(b)) => Values::I(select(c, a, b)),
                (Values::B(a), Values::B(b)) => Values::B(select(c, a, b)),
                _ => unreachable!("where's branches share a dtype"),
            }
        }
        Op::Cast(to) => cast(args[0], *to),
        Op::Reduce { op, axes } => reduce(*op, axes, args[0], shapes[0], shape),
        Op::View(view) => match args[0] {
            Values::F(v) => Values::F(view.offsets().map(|o| v[o]).collect()),
            Values::I(v) => Values::I(view.offsets().map(|o| v[o]).collect()),
            Values::B(v) => Values::B(view.offsets().map(|o| v[o]).collect()),
        },
        Op::Unview { view, .. } => unview(view, args[0], n),
        Op::Assign(view) => {
            let mut out = args[0].clone();
            match (&mut out, args[1]) {
                (Values::F(o), Values::F(v)) => view.offsets().zip(v).for_each(|(p, &x)| o[p] = x),
                (Values::I(o), Values::I(v)) => view.offsets().zip(v).for_each(|(p, &x)| o[p] = x),
                (Values::B(o), Values::B(v)) => view.offsets().zip(v).for_each(|(p, &x)| o[p] = x),
                _ => unreachable!("assign's inputs share a dtype"),
            }
            out
        }
        Op::Gather { axis } => {
            let Values::I(index) = args[1] else { unreachable!("gather's index is i64") };
            let targets = index_targets("gather", *axis, shapes[0], shapes[1], index)?;
            match args[0] {
                Values::F(x) => Values::F(targets.iter().map(|&t| x[t]).collect()),
                Values::I(x) => Values::I(targets.iter().map(|&t| x[t]).collect()),
                Values::B(x) => Values::B(targets.iter().map(|&t| x[t]).collect()),
            }
        }
        Op::Scatter { axis, accumulate } => {
            let name = if *accumulate { "scatter_add" } else { "scatter" };
            let Values::I(index) = args[1] else { unreachable!("scatter's index is i64") };
            let targets = index_targets(name, *axis, shapes[0], shapes[1], index)?;
            // src may be larger than the index: read it at the index's positions.
            let src_view = src_positions(shapes[1], shapes[2]);
            let mut out = args[0].clone();
            match (&mut out, args[2]) {
                (Values::F(o), Values::F(s)) => {
                    for (&t, p) in targets.iter().zip(src_view.offsets()) {
                        o[t] = if *accumulate { o[t] + s[p] } else { s[p] };
                    }
                }
                (Values::I(o), Values::I(s)) => {
                    for (&t, p) in targets.iter().zip(src_view.offsets()) {
                        o[t] = if *accumulate { o[t].wrapping_add(s[p]) } else { s[p] };
                    }
                }
                (Values::B(o), Values::B(s)) => {
                    for (&t, p) in targets.iter().zip(src_view.offsets()) {
                        o[t] = s[p];
                    }
                }
                _ => unreachable!("scatter's tensor and src share a dtype"),
            }
            out
        }
        Op::CumSum { axis } => {
            let stride = shape.contiguous_strides()[*axis] as usize;
            let len = shape.dims()[*axis];
            let mut out = args[0].clone();
            // Walk each line along the axis from its first element.
            for start in (0..n).filter(|i| (i / stride).is_multiple_of(len.max(1))) {
                for k in 1..len {
                    let (prev, cur) = (start + (k - 1) * stride, start + k * stride);
                    match &mut out {
                        Values::F(v) => v[cur] += v[prev],
                        Values::I(v) => v[cur] = v[cur].wrapping_add(v[prev]),
                        Values::B(_) => unreachable!("cumsum rejects bools"),
                    }
                }
            }
            out
        }
        Op::MatMul => matmul(args[0], args[1], shapes[0], shapes[1], dtypes[0]),
        Op::Attention { mask, scale } | Op::AttentionGrad { mask, scale } => {
            let grad = matches!(op, Op::AttentionGrad { .. });
            Values::F(attention(args, shapes, *mask, f64::from_bits(*scale), grad))
        }
        Op::ArgSort { axis, descending } => argsort(args[0], shape, *axis, *descending),
        Op::Collective(c) => load(&crate::collective::eval(c, &store(args[0], dtypes[0])?, n)?),
        Op::Check(c) => checked(*c, args)?,
        // A user's op: its CPU implementation, over buffers of the inputs' own dtypes.
        Op::Custom(c) => {
            let buffers = args
                .iter()
                .zip(dtypes)
                .map(|(v, &d)| store(v, d))
                .collect::<Result<Vec<_>, _>>()?;
            let views: Vec<kiln_ir::View> =
                shapes.iter().map(|&s| kiln_ir::View::contiguous(s.clone())).collect();
            let inputs: Vec<_> = buffers.iter().zip(&views).collect();
            load(&crate::custom::run_cpu(c, &inputs, false)?)
        }
    })
}

/// The adjoint of a view: `x` added into zeros of `n` elements where `view` reads them.
fn unview(view: &kiln_ir::View, x: &Values, n: usize) -> Values {
    match x {
        Values::F(v) => {
            let mut out = vec![0.0; n];
            view.offsets().zip(v).for_each(|(o, &x)| out[o] += x);
            Values::F(out)
        }
        Values::I(v) => {
            let mut out = vec![0i64; n];
            view.offsets().zip(v).for_each(|(o, &x)| out[o] = out[o].wrapping_add(x));
            Values::I(out)
        }
        Values::B(v) => {
            let mut out = vec![false; n];
            view.offsets().zip(v).for_each(|(o, &x)| out[o] |= x);
            Values::B(out)
        }
    }
}

/// An [`Op::Check`]'s value: its first argument, once every result in the second is true.
fn checked(check: kiln_ir::Check, args: &[&Values]) -> Result<Values, RuntimeError> {
    let Values::B(ok) = args[1] else { unreachable!("a check's results are bool") };
    failed_check(check, ok)?;
    Ok(args[0].clone())
}

/// The error of an [`Op::Check`] whose results `ok` (one per row) are not all true.
pub(crate) fn failed_check(check: kiln_ir::Check, ok: &[bool]) -> Result<(), RuntimeError> {
    match ok.iter().position(|&v| !v) {
        Some(row) => Err(RuntimeError::Check { op: check.op(), detail: check.failure(row) }),
        None => Ok(()),
    }
}

/// The stable argsort of every line of `x` along `axis` (NaN last, -0 equal to +0).
fn argsort(x: &Values, shape: &Shape, axis: usize, descending: bool) -> Values {
    let n = shape.numel();
    let stride = shape.contiguous_strides()[axis] as usize;
    let len = shape.dims()[axis];
    use std::cmp::Ordering::Equal;
    let mut out = vec![0i64; n];
    let key = |i: usize| match x {
        Values::F(v) => (v[i].is_nan(), v[i], 0),
        Values::I(v) => (false, 0.0, v[i]),
        Values::B(v) => (false, 0.0, i64::from(v[i])),
    };
    for start in (0..n).filter(|i| (i / stride).is_multiple_of(len.max(1))) {
        let mut order: Vec<usize> = (0..len).collect();
        // `sort_by` is stable: equal keys keep their positions' order.
        order.sort_by(|&a, &b| {
            let (a, b) = (key(start + a * stride), key(start + b * stride));
            // NaN above everything; -0 and +0 equal.
            let o = match (a.0, b.0) {
                (false, false) => a.1.partial_cmp(&b.1).unwrap_or(Equal).then(a.2.cmp(&b.2)),
                (x, y) => x.cmp(&y),
            };
            if descending { o.reverse() } else { o }
        });
        for (k, &i) in order.iter().enumerate() {
            out[start + k * stride] = i as i64;
        }
    }
    Values::I(out)
}

/// Attention by its definition, with the whole score matrix: the output, or (with `grad`)
/// the packed `[dq | dk | dv]` per batch entry for the output gradient `f(3)`. A query
/// that sees no key gives zeros (PyTorch's safe softmax), and passes no gradient.
fn attention(
    args: &[&Values],
    shapes: &[&Shape],
    mask: kiln_ir::AttentionMask,
    scale: f64,
    grad: bool,
) -> Vec<f64> {
    let f = |i: usize| match args[i] {
        Values::F(v) => v.as_slice(),
        _ => unreachable!("attention takes floats"),
    };
    let kiln_ir::AttentionDims { n, l, e, s, ev } =
        kiln_ir::AttentionDims::of(shapes[0], shapes[1], shapes[2]);
    let (q, k, v) = (f(0), f(1), f(2));
    let per = if grad { l * e + s * e + s * ev } else { l * ev };
    let mut out = vec![0.0; n * per];
    for b in 0..n {
        let qi = |i: usize, c: usize| q[(b * l + i) * e + c];
        let kj = |j: usize, c: usize| k[(b * s + j) * e + c];
        let vj = |j: usize, c: usize| v[(b * s + j) * ev + c];
        let o = &mut out[b * per..(b + 1) * per];
        for i in 0..l {
            let keys = mask.keys_of(i, l, s);
            let sees = |j: usize| match (mask, args.last()) {
                (kiln_ir::AttentionMask::Given, Some(Values::B(m))) => m[(b * l + i) * s + j],
                _ => true,
            };
            let sc: Vec<f64> = (0..keys)
                .map(|j| match sees(j) {
                    true => (0..e).map(|c| qi(i, c) * kj(j, c)).sum::<f64>() * scale,
                    false => f64::NEG_INFINITY,
                })
                .collect();
            let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = sc.iter().map(|x| (x - m).exp()).sum();
            let p: Vec<f64> = match m {
                f64::NEG_INFINITY => vec![0.0; keys],
                _ => sc.iter().map(|x| (x - m).exp() / z).collect(),
            };
            if !grad {
                for c in 0..ev {
                    o[i * ev + c] = (0..keys).map(|j| p[j] * vj(j, c)).sum();
                }
                continue;
            }
            let dout = |c: usize| f(3)[(b * l + i) * ev + c];
            let dp: Vec<f64> =
                (0..keys).map(|j| (0..ev).map(|c| dout(c) * vj(j, c)).sum()).collect();
            let d: f64 = (0..keys).map(|j| p[j] * dp[j]).sum();
            for j in 0..keys {
                let ds = p[j] * (dp[j] - d) * scale;
                for c in 0..e {
                    o[i * e + c] += ds * kj(j, c);
                    o[l * e + j * e + c] += ds * qi(i, c);
                }
                for c in 0..ev {
                    o[l * e + s * e + j * ev + c] += p[j] * dout(c);
                }
            }
        }
    }
    out
}

/// For each position of `index` (row-major), the flat offset in a dense tensor of shape `x`
/// that it selects: the position itself with coordinate `axis` replaced by the index value.
pub(crate) fn index_targets(
    op: &'static str,
    axis: usize,
    x: &Shape,
    index: &Shape,
    values: &[i64],
) -> Result<Vec<usize>, RuntimeError> {
    let size = x.dims()[axis];
    let x_strides = x.contiguous_strides();
    // The offset in x of each index position with its axis coordinate set to 0.
    let mut strides = x_strides.clone();
    strides[axis] = 0;
    let base = kiln_ir::View::from_parts(index.clone(), strides, 0);
    base.offsets()
        .zip(values)
        .map(|(b, &i)| {
            if i < 0 || i as usize >= size {
                return Err(RuntimeError::IndexOutOfRange { op, index: i, axis, size });
            }
            Ok(b + i as usize * x_strides[axis] as usize)
        })
        .collect()
}

/// The positions of a dense `src` read at each position of `index` (same rank, no larger).
pub(crate) fn src_positions(index: &Shape, src: &Shape) -> kiln_ir::View {
    kiln_ir::View::from_parts(index.clone(), src.contiguous_strides(), 0)
}

fn fill(dtype: DType, n: usize, s: Scalar) -> Values {
    match dtype.category() {
        kiln_ir::Category::Float => Values::F(vec![s.to_f64(); n]),
        kiln_ir::Category::Int => Values::I(vec![s.to_i64(); n]),
        kiln_ir::Category::Bool => Values::B(vec![s.to_bool(); n]),
    }
}

fn select<T: Copy>(c: &[bool], a: &[T], b: &[T]) -> Vec<T> {
    c.iter().zip(a.iter().zip(b)).map(|(&c, (&a, &b))| if c { a } else { b }).collect()
}

/// A random fill's values: a pure function of its key and each element's index.
fn random_fill(dist: RandomDist, key: u64, dtype: DType, n: usize) -> Values {
    match dist {
        RandomDist::Uniform => {
            let bits = dtype.mantissa_bits().unwrap_or(53);
            Values::F((0..n as u64).map(|i| random::uniform(key, i, bits)).collect())
        }
        RandomDist::Normal => Values::F((0..n as u64).map(|i| random::normal(key, i)).collect()),
        RandomDist::Int { low, high } => {
            Values::I((0..n as u64).map(|i| random::int(key, i, low, high)).collect())
        }
    }
}

fn unary(op: UnaryOp, x: &Values) -> Values {
    match x {
        Values::F(v) => Values::F(v.iter().map(|&x| semantics::unary(op, x)).collect()),
        Values::I(v) => Values::I(v.iter().map(|&x| semantics::unary_int(op, x)).collect()),
        Values::B(v) => match op {
            UnaryOp::Not => Values::B(v.iter().map(|&x| !x).collect()),
            other => unreachable!("{} does not take bool", other.name()),
        },
    }
}

fn binary(op: BinaryOp, a: &Values, b: &Values) -> Values {
    use semantics::compare;
    let zip = |f: &dyn Fn(usize) -> bool, n: usize| Values::B((0..n).map(f).collect());
    match (a, b) {
        (Values::F(a), Values::F(b)) if op.is_comparison() => {
            zip(&|i| compare(op, a[i], b[i]), a.len())
        }
        (Values::I(a), Values::I(b)) if op.is_comparison() => {
            zip(&|i| compare(op, a[i], b[i]), a.len())
        }
        (Values::B(a), Values::B(b)) if op.is_comparison() => {
            zip(&|i| compare(op, a[i], b[i]), a.len())
        }
        (Values::F(a), Values::F(b)) => {
            Values::F(a.iter().zip(b).map(|(&x, &y)| semantics::binary(op, x, y)).collect())
        }
        (Values::I(a), Values::I(b)) => {
            Values::I(a.iter().zip(b).map(|(&x, &y)| semantics::binary_int(op, x, y)).collect())
        }
        (Values::B(a), Values::B(b)) => {
            Values::B(a.iter().zip(b).map(|(&x, &y)| semantics::binary_bool(op, x, y)).collect())
        }
        _ => unreachable!("binary inputs share a dtype"),
    }
}

fn cast(x: &Values, to: DType) -> Values {
    use kiln_ir::Category as C;
    match (x, to.category()) {
        (Values::F(v), C::Float) => Values::F(v.clone()),
        (Values::F(v), C::Int) => Values::I(v.iter().map(|&x| x as i64).collect()),
        (Values::F(v), C::Bool) => Values::B(v.iter().map(|&x| x != 0.0).collect()),
        (Values::I(v), C::Float) => Values::F(v.iter().map(|&x| x as f64).collect()),
        (Values::I(v), C::Int) => Values::I(v.clone()),
        (Values::I(v), C::Bool) => Values::B(v.iter().map(|&x| x != 0).collect()),
        (Values::B(v), C::Float) => Values::F(v.iter().map(|&x| f64::from(u8::from(x))).collect()),
        (Values::B(v), C::Int) => Values::I(v.iter().map(|&x| i64::from(x)).collect()),
        (Values::B(v), C::Bool) => Values::B(v.clone()),
    }
}

/// The flat index in the reduced (keepdim) output of each input element.
fn reduced_index(in_shape: &Shape, out_shape: &Shape) -> impl Iterator<Item = usize> {
    let out_strides = out_shape.contiguous_strides();
    let strides: Vec<isize> = in_shape
        .dims()
        .iter()
        .zip(out_shape.dims())
        .zip(&out_strides)
        .map(|((&i, &o), &s)| if i == o { s } else { 0 })
        .collect();
    let view = kiln_ir::View::from_parts(in_shape.clone(), strides, 0);
    view.offsets().collect::<Vec<_>>().into_iter()
}

fn reduce(op: ReduceOp, axes: &[usize], x: &Values, in_shape: &Shape, out_shape: &Shape) -> Values {
    let n = out_shape.numel();
    match op {
        ReduceOp::ArgMax | ReduceOp::ArgMin => {
            let axis = axes[0];
            let axis_stride = in_shape.contiguous_strides()[axis] as usize;
            let axis_len = in_shape.dims()[axis];
            let key = |v: &Values, i: usize| -> (bool, f64, i64) {
                match v {
                    Values::F(v) => (v[i].is_nan(), v[i], 0),
                    Values::I(v) => (false, 0.0, v[i]),
                    Values::B(v) => (false, 0.0, i64::from(v[i])),
                }
            };
            let better = |new: (bool, f64, i64), best: (bool, f64, i64)| -> bool {
                if best.0 {
                    return false; // a NaN already won
                }
                if new.0 {
                    return true;
                }
                match op {
                    ReduceOp::ArgMax => new.1 > best.1 || new.2 > best.2,
                    _ => new.1 < best.1 || new.2 < best.2,
                }
            };
            let mut out = vec![0i64; n];
            for (flat_out, first) in
                reduced_index(in_shape, out_shape).enumerate().filter_map(|(flat_in, o)| {
                    // The element with index 0 along the axis starts each scan.
                    (flat_in / axis_stride).is_multiple_of(axis_len).then_some((o, flat_in))
                })
            {
                let mut best = (0usize, key(x, first));
                for k in 1..axis_len {
                    let cand = key(x, first + k * axis_stride);
                    if better(cand, best.1) {
                        best = (k, cand);
                    }
                }
                out[flat_out] = best.0 as i64;
            }
            Values::I(out)
        }
        ReduceOp::LogSumExp => {
            let Values::F(v) = x else { unreachable!("logsumexp takes floats") };
            let mut groups = vec![Vec::new(); n];
            for (o, &val) in reduced_index(in_shape, out_shape).zip(v) {
                groups[o].push(val);
            }
            Values::F(
                groups.iter().map(|g| kiln_ir::semantics::logsumexp(g.iter().copied())).collect(),
            )
        }
        _ => {
            let index: Vec<usize> = reduced_index(in_shape, out_shape).collect();
            match x {
                Values::F(v) => {
                    let (init, f): (f64, fn(f64, f64) -> f64) = match op {
                        ReduceOp::Sum => (0.0, |a, b| a + b),
                        ReduceOp::Prod => (1.0, |a, b| a * b),
                        ReduceOp::Max => (f64::NEG_INFINITY, |a, b| {
                            if a.is_nan() || b.is_nan() { f64::NAN } else { a.max(b) }
                        }),
                        _ => (f64::INFINITY, |a, b| {
                            if a.is_nan() || b.is_nan() { f64::NAN } else { a.min(b) }
                        }),
                    };
                    let mut out = vec![init; n];
                    for (&o, &val) in index.iter().zip(v) {
                        out[o] = f(out[o], val);
                    }
                    Values::F(out)
                }
                Values::I(v) => {
                    let (init, f): (i64, fn(i64, i64) -> i64) = match op {
                        ReduceOp::Sum => (0, i64::wrapping_add),
                        ReduceOp::Prod => (1, i64::wrapping_mul),
                        ReduceOp::Max => (i64::MIN, i64::max),
                        _ => (i64::MAX, i64::min),
                    };
                    let mut out = vec![init; n];
                    for (&o, &val) in index.iter().zip(v) {
                        out[o] = f(out[o], val);
                    }
                    Values::I(out)
                }
                Values::B(v) => {
                    let is_max = op == ReduceOp::Max;
                    let mut out = vec![!is_max; n];
                    for (&o, &val) in index.iter().zip(v) {
                        out[o] = if is_max { out[o] || val } else { out[o] && val };
                    }
                    Values::B(out)
                }
            }
        }
    }
}

fn matmul(a: &Values, b: &Values, sa: &Shape, sb: &Shape, dtype: DType) -> Values {
    let r = sa.rank();
    let (m, k, n) = (sa.dims()[r - 2], sa.dims()[r - 1], sb.dims()[r - 1]);
    let batch: usize = sa.dims()[..r - 2].iter().product();
    match (a, b) {
        (Values::F(a), Values::F(b)) => {
            let mut out = vec![0.0; batch * m * n];
            for p in 0..batch {
                for i in 0..m {
                    for j in 0..n {
                        let mut acc = 0.0;
                        for l in 0..k {
                            acc += a[p * m * k + i * k + l] * b[p * k * n + l * n + j];
                        }
                        out[p * m * n + i * n + j] = acc;
                    }
                }
            }
            Values::F(out)
        }
        (Values::I(a), Values::I(b)) => {
            let mut out = vec![0i64; batch * m * n];
            for p in 0..batch {
                for i in 0..m {
                    for j in 0..n {
                        let mut acc = 0i64;
                        for l in 0..k {
                            acc = acc.wrapping_add(
                                a[p * m * k + i * k + l].wrapping_mul(b[p * k * n + l * n + j]),
                            );
                        }
                        out[p * m * n + i * n + j] = acc;
                    }
                }
            }
            Values::I(out)
        }
        _ => unreachable!("matmul of {dtype} is rejected at inference"),
    }
}
