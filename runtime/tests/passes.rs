//! Every graph pass keeps the graph's values: random programs, run by the reference executor
//! before and after each pass (alone, and as the whole pipeline), give the same outputs.
//! proptest shrinks a failing program to a few instructions.
//!
//! The programs are drawn from what the passes look for: matrix products read transposed
//! (`TransposeProducts`), gathers of elementwise expressions with broadcast operands
//! (`GatherFirst`), constants, `x^2`, `x * 1`, `-(-x)` (`Simplify`), and repeated
//! expressions (`Cse`). Every value is an `n x n` matrix, so any instruction can read any
//! earlier value.

use kiln_ir::pipeline::{Constants, Fusion, Pass, PlanOptions, Rewrite};
use kiln_ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceOp, Scalar, Shape, UnaryOp, View, passes};
use kiln_runtime::{Buffer, Device, reference};
use proptest::prelude::*;

/// One instruction; operands index the values so far (modulo their count), so any list of
/// instructions is a valid program and shrinking keeps it valid.
#[derive(Clone, Debug)]
enum Instr {
    Unary(UnaryOp, usize),
    Binary(BinaryOp, usize, usize),
    /// A constant: full `n x n`, or broadcast from `n x 1` / `1 x n`.
    Constant(f64, u8),
    /// `x op c` with a constant operand (the identities `Simplify` applies).
    WithConstant(BinaryOp, usize, f64),
    Transpose(usize),
    /// `a @ b`, read transposed when the flag is set.
    MatMul(usize, usize, bool),
    /// A row reduction broadcast back to `n x n` (softmax's shape).
    RowReduce(ReduceOp, usize),
    /// `gather(x, index, axis = 1)` with the program's index input.
    Gather(usize),
    /// The same op on the same operands as an earlier instruction.
    Repeat(usize),
    /// `aᵀ @ b` in the other float type, cast back (the casts of views `CastsBeforeViews`
    /// moves).
    CastProduct(usize, usize),
}

const UNARY: [UnaryOp; 8] = [
    UnaryOp::Neg,
    UnaryOp::Abs,
    UnaryOp::Exp,
    UnaryOp::Tanh,
    UnaryOp::Sigmoid,
    UnaryOp::Relu,
    UnaryOp::Recip,
    UnaryOp::Floor,
];
const BINARY: [BinaryOp; 6] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Maximum,
    BinaryOp::Minimum,
];
const CONSTANTS: [f64; 6] = [0.0, 1.0, -1.0, 2.0, 0.5, -3.25];

fn instr() -> impl Strategy<Value = Instr> {
    let ix = 0usize..64;
    let constant = proptest::sample::select(CONSTANTS.to_vec());
    prop_oneof![
        (proptest::sample::select(UNARY.to_vec()), ix.clone())
            .prop_map(|(o, a)| Instr::Unary(o, a)),
        (proptest::sample::select(BINARY.to_vec()), ix.clone(), ix.clone())
            .prop_map(|(o, a, b)| Instr::Binary(o, a, b)),
        (constant.clone(), 0u8..3).prop_map(|(c, k)| Instr::Constant(c, k)),
        (
            proptest::sample::select(vec![
                BinaryOp::Mul,
                BinaryOp::Div,
                BinaryOp::Sub,
                BinaryOp::Pow
            ]),
            ix.clone(),
            constant
        )
            .prop_map(|(o, a, c)| Instr::WithConstant(o, a, c)),
        ix.clone().prop_map(Instr::Transpose),
        (ix.clone(), ix.clone(), any::<bool>()).prop_map(|(a, b, t)| Instr::MatMul(a, b, t)),
        (proptest::sample::select(vec![ReduceOp::Sum, ReduceOp::Max]), ix.clone())
            .prop_map(|(o, a)| Instr::RowReduce(o, a)),
        ix.clone().prop_map(Instr::Gather),
        ix.clone().prop_map(Instr::Repeat),
        (ix.clone(), ix).prop_map(|(a, b)| Instr::CastProduct(a, b)),
    ]
}

/// A program: its size, dtype, instructions and which values are outputs (besides the last).
#[derive(Clone, Debug)]
struct Program {
    n: usize,
    dtype: DType,
    instrs: Vec<Instr>,
    outputs: Vec<usize>,
    seed: u64,
}

fn program() -> impl Strategy<Value = Program> {
    (
        1usize..6,
        proptest::sample::select(vec![DType::F32, DType::F64]),
        proptest::collection::vec(instr(), 1..24),
        proptest::collection::vec(0usize..64, 0..3),
        any::<u64>(),
    )
        .prop_map(|(n, dtype, instrs, outputs, seed)| Program {
            n,
            dtype,
            instrs,
            outputs,
            seed,
        })
}

/// The graph of a program: inputs `x` (`n x n`, the dtype) and `index` (`n x n`, i64).
fn build(p: &Program) -> Graph {
    let n = p.n;
    let square = Shape::new(vec![n, n]);
    let mut g = Graph::new();
    let x = g.input(square.clone(), p.dtype);
    let index = g.input(square.clone(), DType::I64);
    let mut values: Vec<NodeId> = vec![x];
    // (op, operands) of each instruction's own node, for `Repeat`.
    let mut made: Vec<(Op, Vec<NodeId>)> = Vec::new();
    let push = |g: &mut Graph, op: Op, args: &[NodeId]| g.push(op, args).expect("a valid program");
    let transpose = |g: &mut Graph, a: NodeId| {
        let view = View::contiguous(square.clone()).permute(&[1, 0]);
        push(g, Op::View(view), &[a])
    };
    let constant = |g: &mut Graph, c: f64, kind: u8| {
        let shape = match kind {
            0 => vec![n, n],
            1 => vec![n, 1],
            _ => vec![1, n],
        };
        let shape = Shape::new(shape);
        let full = g.leaf(Op::Full(Scalar::F64(c)), shape.clone(), p.dtype).expect("a constant");
        if kind == 0 {
            return full;
        }
        let view = View::contiguous(shape).expand(&square);
        push(g, Op::View(view), &[full])
    };
    for instr in &p.instrs {
        let at = |i: usize| values[i % values.len()];
        let node = match *instr {
            Instr::Unary(op, a) => {
                let a = at(a);
                made.push((Op::Unary(op), vec![a]));
                push(&mut g, Op::Unary(op), &[a])
            }
            Instr::Binary(op, a, b) => {
                let (a, b) = (at(a), at(b));
                made.push((Op::Binary(op), vec![a, b]));
                push(&mut g, Op::Binary(op), &[a, b])
            }
            Instr::Constant(c, kind) => constant(&mut g, c, kind),
            Instr::WithConstant(op, a, c) => {
                let a = at(a);
                let c = constant(&mut g, c, 0);
                made.push((Op::Binary(op), vec![a, c]));
                push(&mut g, Op::Binary(op), &[a, c])
            }
            Instr::Transpose(a) => transpose(&mut g, at(a)),
            Instr::MatMul(a, b, t) => {
                let (a, b) = (at(a), at(b));
                made.push((Op::MatMul, vec![a, b]));
                let product = push(&mut g, Op::MatMul, &[a, b]);
                if t { transpose(&mut g, product) } else { product }
            }
            Instr::RowReduce(op, a) => {
                let reduce = Op::Reduce { op, axes: vec![1] };
                let r = push(&mut g, reduce, &[at(a)]);
                let view = View::contiguous(Shape::new(vec![n, 1])).expand(&square);
                push(&mut g, Op::View(view), &[r])
            }
            Instr::Gather(a) => {
                let a = at(a);
                made.push((Op::Gather { axis: 1 }, vec![a, index]));
                push(&mut g, Op::Gather { axis: 1 }, &[a, index])
            }
            Instr::Repeat(i) => match made.get(i % made.len().max(1)) {
                Some((op, args)) => push(&mut g, op.clone(), args),
                None => x,
            },
            Instr::CastProduct(a, b) => {
                let other = if p.dtype == DType::F32 { DType::F64 } else { DType::F32 };
                let at_ = transpose(&mut g, at(a));
                let wide_a = push(&mut g, Op::Cast(other), &[at_]);
                let wide_b = push(&mut g, Op::Cast(other), &[at(b)]);
                let product = push(&mut g, Op::MatMul, &[wide_a, wide_b]);
                push(&mut g, Op::Cast(p.dtype), &[product])
            }
        };
        values.push(node);
    }
    let last = *values.last().expect("at least the input");
    let mut outputs = vec![last];
    outputs.extend(p.outputs.iter().map(|&i| values[i % values.len()]));
    for o in outputs {
        g.mark_output(o);
    }
    g
}

/// The inputs: `x` from a small generator (values in [-2, 2)), `index` in `0..n`.
fn inputs(p: &Program) -> Vec<Buffer> {
    let mut state = p.seed | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let len = p.n * p.n;
    let xs: Vec<f64> = (0..len).map(|_| (next() % 4096) as f64 / 1024.0 - 2.0).collect();
    let x = match p.dtype {
        DType::F32 => Buffer::from_slice(&xs.iter().map(|&v| v as f32).collect::<Vec<_>>()),
        _ => Buffer::from_slice(&xs),
    };
    let index: Vec<i64> = (0..len).map(|_| (next() % p.n as u64) as i64).collect();
    vec![x.expect("x"), Buffer::from_slice(&index).expect("index")]
}

fn values(b: &Buffer) -> Vec<f64> {
    (0..b.len()).map(|i| b.get(i).to_f64()).collect()
}

/// The outputs of `graph`, and of `rewrite.graph` in the same order, agree.
fn check_rewrite(
    graph: &Graph,
    rewrite: &Rewrite,
    bound: &[Buffer],
    what: &str,
) -> Result<(), TestCaseError> {
    rewrite
        .graph
        .verify()
        .map_err(|e| TestCaseError::fail(format!("{what}: invalid graph: {e}")))?;
    prop_assert_eq!(rewrite.graph.inputs().len(), graph.inputs().len(), "{}: inputs", what);
    let before = reference::run(graph, bound).expect("the reference runs the program");
    let after = reference::run(&rewrite.graph, bound).expect("the reference runs the rewrite");
    for (k, out) in graph.outputs().iter().enumerate() {
        let new = rewrite.map.get(out).copied();
        prop_assert!(new.is_some(), "{}: output {} was dropped", what, k);
        let position = rewrite.graph.outputs().iter().position(|&o| Some(o) == new);
        prop_assert!(position.is_some(), "{}: output {} is no output of the rewrite", what, k);
        let (want, got) = (values(&before[k]), values(&after[position.unwrap_or(0)]));
        prop_assert_eq!(want.len(), got.len(), "{}: output {} length", what, k);
        for (i, (w, g)) in want.iter().zip(&got).enumerate() {
            let same = w == g
                || (w.is_nan() && g.is_nan())
                || (w - g).abs() <= 1e-12 * w.abs().max(g.abs());
            prop_assert!(same, "{}: output {} element {}: {} before, {} after", what, k, i, w, g);
        }
    }
    Ok(())
}

const PASSES: [&dyn Pass; 5] = [
    &passes::TransposeProducts,
    &passes::GatherFirst,
    &passes::CastsBeforeViews,
    &passes::Simplify,
    &passes::Cse,
];

fn options(constants: Constants) -> PlanOptions {
    PlanOptions { fusion: Fusion::Fused, constants, target: Device::Cpu.target() }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn each_pass_keeps_the_values(p in program()) {
        let graph = build(&p);
        let bound = inputs(&p);
        for constants in [Constants::Fold, Constants::Rebindable] {
            let options = options(constants);
            for pass in PASSES {
                if let Some(rewrite) = pass.run(&graph, &options) {
                    check_rewrite(&graph, &rewrite, &bound, &format!("{} ({constants:?})", pass.name()))?;
                }
            }
            let all = kiln_ir::pipeline::Pipeline::default().run(&graph, &options, &mut |_, _| {});
            check_rewrite(&graph, &all, &bound, &format!("the pipeline ({constants:?})"))?;
        }
    }
}

/// The generator reaches every pass: over a fixed sample of programs each pass rewrites
/// some, so the property above is not vacuous for any of them.
#[test]
fn every_pass_fires_on_some_programs() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = program();
    let mut fired = [0usize; PASSES.len()];
    let options = options(Constants::Fold);
    for _ in 0..400 {
        let p = strategy.new_tree(&mut runner).expect("a program").current();
        let graph = build(&p);
        for (k, pass) in PASSES.iter().enumerate() {
            fired[k] += usize::from(pass.run(&graph, &options).is_some());
        }
    }
    for (k, pass) in PASSES.iter().enumerate() {
        assert!(fired[k] >= 10, "{} rewrote only {} of 400 programs", pass.name(), fired[k]);
    }
}
