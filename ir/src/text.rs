//! The printed form of a [`Graph`] read back: `Graph::parse(&text)` rebuilds what
//! `graph.to_string()` printed, so pass tests can be written as text (`ir/tests/passes/`).
//!
//! One node a line, in topological order: `%N = op(%a, %b) : [shape] dtype`, with
//! `  (output)` after an output; `#` starts a comment line. Every op whose printed form says
//! all it is parses: leaves `input` and `full(v)`, the unary and binary functions, `where`,
//! `cast(d)`, reductions (`sum[1]`), `view(strides [..], offset n)`, `unview(..)`,
//! `assign(..)`, `gather[axis]`, `scatter[axis]`, `scatter_add[axis]`, `cumsum[axis]` and
//! `matmul`. Random leaves, attention, sorting, checks and collectives do not (their text
//! leaves parameters out), and are an error naming the line.
//!
//! ```
//! use kiln_ir::Graph;
//! let text = "%0 = input : [2, 3] f32\n%1 = exp(%0) : [2, 3] f32\n%2 = sum[1](%1) : [2, 1] f32  (output)\n";
//! let g = Graph::parse(text)?;
//! assert_eq!(g.to_string(), text);
//! # Ok::<(), kiln_ir::IrError>(())
//! ```

use rustc_hash::FxHashMap as HashMap;

use crate::{BinaryOp, DType, Graph, IrError, NodeId, Op, ReduceOp, Scalar, Shape, UnaryOp, View};

impl Graph {
    /// The graph that `text` (a graph's printed form, see the [module docs](crate::text))
    /// describes; its `Display` prints `text` back.
    ///
    /// # Errors
    /// [`IrError::InvalidGraph`] naming the line that does not parse, or whose op does not
    /// accept its inputs.
    pub fn parse(text: &str) -> Result<Graph, IrError> {
        let mut g = Graph::new();
        let mut names: HashMap<String, NodeId> = HashMap::default();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why: &str| IrError::InvalidGraph(format!("line {}: {why}: {line}", i + 1));
            let (name, rest) = line.split_once(" = ").ok_or_else(|| bad("no ` = `"))?;
            let (rest, output) = match rest.strip_suffix("(output)") {
                Some(r) => (r.trim_end(), true),
                None => (rest, false),
            };
            let (op_text, ty) = rest.rsplit_once(" : ").ok_or_else(|| bad("no ` : type`"))?;
            let (shape_text, dtype_text) = ty.rsplit_once(' ').ok_or_else(|| bad("no dtype"))?;
            let shape = parse_shape(shape_text).ok_or_else(|| bad("a bad shape"))?;
            let dtype = DType::ALL
                .into_iter()
                .find(|d| d.name() == dtype_text)
                .ok_or_else(|| bad("an unknown dtype"))?;
            // `op(%a, %b)`: the arguments are the last parenthesised group of `%` names.
            let (head, args) = match op_text.rfind("(%") {
                Some(at) if op_text.ends_with(')') => {
                    let list = &op_text[at + 1..op_text.len() - 1];
                    let args: Result<Vec<NodeId>, IrError> = list
                        .split(", ")
                        .map(|a| names.get(a).copied().ok_or_else(|| bad("an unknown argument")))
                        .collect();
                    (&op_text[..at], args?)
                }
                _ => (op_text, Vec::new()),
            };
            let arg_shape = |k: usize| args.get(k).map(|&a| g.node(a).shape.clone());
            let op = parse_op(head, dtype, &shape, &arg_shape).ok_or_else(|| bad("an op"))?;
            let id = match op {
                Op::Input => g.input(shape.clone(), dtype),
                op if op.is_leaf() => g.leaf(op, shape.clone(), dtype)?,
                op => g.push(op, &args)?,
            };
            if g.node(id).shape != shape || g.node(id).dtype != dtype {
                return Err(bad("a type its inputs do not give"));
            }
            if output {
                g.mark_output(id);
            }
            names.insert(name.to_string(), id);
        }
        Ok(g)
    }
}

/// `[2, 3]` (or `[]`).
fn parse_shape(text: &str) -> Option<Shape> {
    let inner = text.strip_prefix('[')?.strip_suffix(']')?;
    if inner.trim().is_empty() {
        return Some(Shape::from(()));
    }
    let dims: Option<Vec<usize>> = inner.split(", ").map(|d| d.parse().ok()).collect();
    Some(Shape::new(dims?))
}

/// `strides [4, 1], offset 0`.
fn parse_strides(text: &str) -> Option<(Vec<isize>, usize)> {
    let (strides, offset) = text.strip_prefix("strides [")?.split_once("], offset ")?;
    let strides: Option<Vec<isize>> = if strides.is_empty() {
        Some(Vec::new())
    } else {
        strides.split(", ").map(|s| s.parse().ok()).collect()
    };
    Some((strides?, offset.parse().ok()?))
}

/// The op printed as `head` (its arguments removed), for a node of `dtype` and `shape`
/// whose `k`-th argument has shape `arg_shape(k)`.
fn parse_op(
    head: &str,
    dtype: DType,
    shape: &Shape,
    arg_shape: &dyn Fn(usize) -> Option<Shape>,
) -> Option<Op> {
    let inside = |prefix: &str| head.strip_prefix(prefix)?.strip_suffix(')');
    let axis = |name: &str| -> Option<usize> {
        head.strip_prefix(name)?.strip_prefix('[')?.strip_suffix(']')?.parse().ok()
    };
    if head == "input" {
        return Some(Op::Input);
    }
    if let Some(v) = inside("full(") {
        let value = if dtype.is_float() {
            Scalar::F64(v.parse().ok()?)
        } else if dtype == DType::Bool {
            Scalar::Bool(v.parse().ok()?)
        } else {
            Scalar::I64(v.parse().ok()?)
        };
        return Some(Op::Full(value));
    }
    if let Some(d) = inside("cast(") {
        return DType::ALL.into_iter().find(|t| t.name() == d).map(Op::Cast);
    }
    if let Some(s) = inside("view(") {
        let (strides, offset) = parse_strides(s)?;
        return Some(Op::View(View::from_parts(shape.clone(), strides, offset)));
    }
    if let Some(s) = inside("unview(") {
        let (strides, offset) = parse_strides(s)?;
        let view = View::from_parts(arg_shape(0)?, strides, offset);
        return Some(Op::Unview { view, shape: shape.clone() });
    }
    if let Some(s) = inside("assign(") {
        let (strides, offset) = parse_strides(s)?;
        return Some(Op::Assign(View::from_parts(arg_shape(1)?, strides, offset)));
    }
    if let Some(axis) = axis("gather") {
        return Some(Op::Gather { axis });
    }
    if let Some(axis) = axis("scatter_add") {
        return Some(Op::Scatter { axis, accumulate: true });
    }
    if let Some(axis) = axis("scatter") {
        return Some(Op::Scatter { axis, accumulate: false });
    }
    if let Some(axis) = axis("cumsum") {
        return Some(Op::CumSum { axis });
    }
    match head {
        "where" => return Some(Op::Where),
        "matmul" => return Some(Op::MatMul),
        _ => {}
    }
    if let Some(op) = UnaryOp::ALL.into_iter().find(|o| o.name() == head) {
        return Some(Op::Unary(op));
    }
    if let Some(op) = BinaryOp::ALL.into_iter().find(|o| o.name() == head) {
        return Some(Op::Binary(op));
    }
    let (name, axes) = head.split_once('[')?;
    let op = ReduceOp::ALL.into_iter().find(|o| o.name() == name)?;
    let axes = axes.strip_suffix(']')?;
    let axes: Option<Vec<usize>> = if axes.is_empty() {
        Some(Vec::new())
    } else {
        axes.split(", ").map(|a| a.parse().ok()).collect()
    };
    Some(Op::Reduce { op, axes: axes? })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_printed_graph_parses_back_to_itself() {
        let mut g = Graph::new();
        let s = Shape::from([3, 4]);
        let x = g.input(s.clone(), DType::F32);
        let idx = g.input(Shape::from([3, 1]), DType::I64);
        let two = g.leaf(Op::Full(Scalar::F64(2.5)), Shape::from(()), DType::F32).unwrap();
        let two = g.push(Op::View(View::contiguous(Shape::from(())).expand(&s)), &[two]).unwrap();
        let y = g.push(Op::Binary(BinaryOp::Mul), &[x, two]).unwrap();
        let t = g.push(Op::View(View::contiguous(s.clone()).permute(&[1, 0])), &[y]).unwrap();
        let e = g.push(Op::Unary(UnaryOp::Tan), &[t]).unwrap();
        let r = g.push(Op::Reduce { op: ReduceOp::Max, axes: vec![0] }, &[e]).unwrap();
        let gathered = g.push(Op::Gather { axis: 1 }, &[y, idx]).unwrap();
        let c = g.push(Op::Cast(DType::F64), &[gathered]).unwrap();
        let sc = g.push(Op::Scatter { axis: 1, accumulate: true }, &[y, idx, gathered]).unwrap();
        for o in [r, c, sc] {
            g.mark_output(o);
        }
        let text = g.to_string();
        let parsed = Graph::parse(&text).unwrap();
        assert_eq!(parsed.to_string(), text);
        let err = Graph::parse("%0 = input : [2] f32\n%1 = frobnicate(%0) : [2] f32\n");
        assert!(matches!(err, Err(IrError::InvalidGraph(m)) if m.starts_with("line 2")));
    }
}
