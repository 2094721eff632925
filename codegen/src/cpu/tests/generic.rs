//! Size-generic kernels: compiled from a kernel at one size with the numbers that differ at
//! a second size read at run time, they compute the kernels of their form at other sizes
//! exactly as the interpreter does.

use kiln_ir::kernel::{Kernel, interpret};
use kiln_ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceOp, Scalar, Shape, UnaryOp, View};

use super::{run_compiled, values};
use crate::cpu::{compile_generic, form};
use crate::generic::{dynamic_marks, numbers, serves};

/// The one kernel of the graph `build` makes for size `n`, with its parameters and the
/// number of elements of each input.
fn kernel_at(n: usize, build: &dyn Fn(&mut Graph, usize) -> NodeId) -> (Kernel, Vec<Scalar>) {
    let mut g = Graph::new();
    let out = build(&mut g, n);
    g.mark_output(out);
    let plan = crate::plan_steps(&g);
    let [kiln_ir::fuse::Step::Kernel(k)] = plan.as_slice() else {
        panic!("one kernel at n = {n}: {plan:?}")
    };
    (k.kernel.clone(), k.params.clone())
}

fn input_len(kernel: &Kernel, i: usize) -> usize {
    let view = &kernel.inputs[i].view;
    view.offsets().max().map_or(1, |m| m + 1)
}

fn unary(g: &mut Graph, op: UnaryOp, x: NodeId) -> NodeId {
    g.push(Op::Unary(op), &[x]).expect("unary")
}

fn binary(g: &mut Graph, op: BinaryOp, a: NodeId, b: NodeId) -> NodeId {
    g.push(Op::Binary(op), &[a, b]).expect("binary")
}

fn view(g: &mut Graph, v: View, x: NodeId) -> NodeId {
    g.push(Op::View(v), &[x]).expect("view")
}

fn reduce(g: &mut Graph, op: ReduceOp, axes: Vec<usize>, x: NodeId) -> NodeId {
    g.push(Op::Reduce { op, axes }, &[x]).expect("reduce")
}

type Build = Box<dyn Fn(&mut Graph, usize) -> NodeId>;

/// Kernels whose sizes follow `n`: broadcasts, a transposed read, an offset view, row,
/// column, middle-axis and log-sum-exp reductions, long rows that stage their exponentials,
/// integers, f64 and bf16.
fn cases() -> Vec<(&'static str, Build)> {
    vec![
        (
            "broadcast bias and exp",
            Box::new(|g: &mut Graph, n: usize| {
                let x = g.input(Shape::from([n, 37]), DType::F32);
                let b = g.input(Shape::from([37]), DType::F32);
                let bb =
                    view(g, View::contiguous(Shape::from([37])).expand(&Shape::from([n, 37])), b);
                let e = unary(g, UnaryOp::Exp, x);
                let m = binary(g, BinaryOp::Mul, x, bb);
                binary(g, BinaryOp::Add, m, e)
            }),
        ),
        (
            "transposed read",
            Box::new(|g: &mut Graph, n: usize| {
                let x = g.input(Shape::from([37, n]), DType::F32);
                let y = g.input(Shape::from([n, 37]), DType::F32);
                let t = view(g, View::contiguous(Shape::from([37, n])).permute(&[1, 0]), x);
                binary(g, BinaryOp::Sub, t, y)
            }),
        ),
        (
            "offset rows",
            Box::new(|g: &mut Graph, n: usize| {
                let x = g.input(Shape::from([n + 5, 9]), DType::F64);
                let v = View::contiguous(Shape::from([n + 5, 9])).narrow(0, 2, n);
                let s = view(g, v, x);
                unary(g, UnaryOp::Tanh, s)
            }),
        ),
        (
            "integer rows",
            Box::new(|g: &mut Graph, n: usize| {
                let x = g.input(Shape::from([n, 6]), DType::I64);
                let y = g.input(Shape::from([6]), DType::I64);
                let yb =
                    view(g, View::contiguous(Shape::from([6])).expand(&Shape::from([n, 6])), y);
                binary(g, BinaryOp::Maximum, x, yb)
            }),
        ),
        (
            "bf16 rows",
            Box::new(|g: &mut Graph, n: usize| {
                let x = g.input(Shape::from([n, 11]), DType::BF16);
                let s = unary(g, UnaryOp::Sigmoid, x);
                binary(g, BinaryOp::Mul, s, x)
            }),
        ),
        (
            "row sums of long rows",
            Box::new(|g: &mut Graph, n: usize| {
                let x = g.input(Shape::from([n, 70]), DType::F32);
                let e = unary(g, UnaryOp::Exp, x);
                reduce(g, ReduceOp::Sum, vec![1], e)
            }),
        ),
        (
            "row maxima over rows of n",
            Box::new(|g: &mut Graph, n: usize| {
                let x = g.input(Shape::from([13, n]), DType::F32);
                reduce(g, ReduceOp::Max, vec![1], x)
            }),
        ),
        (
            "column sums",
            Box::new(|g: &mut Graph, n: usize| {
                let x = g.input(Shape::from([n, 40]), DType::F32);
                reduce(g, ReduceOp::Sum, vec![0], x)
            }),
        ),
        (
            "column sums over n columns",
            Box::new(|g: &mut Graph, n: usize| {
                let x = g.input(Shape::from([30, n]), DType::F32);
                reduce(g, ReduceOp::Sum, vec![0], x)
            }),
        ),
        (
            "middle axis",
            Box::new(|g: &mut Graph, n: usize| {
                let x = g.input(Shape::from([3, n, 9]), DType::F64);
                reduce(g, ReduceOp::Sum, vec![1], x)
            }),
        ),
        (
            "log-sum-exp rows",
            Box::new(|g: &mut Graph, n: usize| {
                let x = g.input(Shape::from([n, 19]), DType::F32);
                reduce(g, ReduceOp::LogSumExp, vec![1], x)
            }),
        ),
    ]
}

#[test]
fn one_generic_kernel_computes_every_size_of_its_form() {
    for (name, build) in cases() {
        let (first, _) = kernel_at(64, &*build);
        let (second, _) = kernel_at(48, &*build);
        assert_eq!(form(&first), form(&second), "{name}");
        let marks = dynamic_marks(&numbers(&first), &numbers(&second), &[]);
        assert!(marks.contains(&true), "{name}: some number follows n");
        let generic = compile_generic(&first, &marks).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(generic.is_generic());
        for n in [64, 48, 17, 7, 300] {
            let (kernel, params) = kernel_at(n, &*build);
            assert_eq!(form(&kernel), form(&first), "{name} at {n}");
            assert!(serves(&marks, &numbers(&first), &numbers(&kernel)), "{name} at {n}");
            let inputs: Vec<Vec<f64>> = (0..kernel.inputs.len())
                .map(|i| values(input_len(&kernel, i), kernel.inputs[i].dtype, 7 + i as u64))
                .collect();
            let want = interpret(&kernel, &inputs, &params);
            for chunk in [3, 1 << 20] {
                let got = run_compiled(&generic, &kernel, &inputs, &params, chunk);
                for (g, w) in got.iter().zip(&want) {
                    assert_eq!(g.len(), w.len(), "{name} at {n}");
                    for (i, (a, b)) in g.iter().zip(w).enumerate() {
                        let tol = if kernel.inputs[0].dtype == DType::BF16 { 1e-2 } else { 1e-5 };
                        assert!(
                            a == b || (a - b).abs() <= tol * b.abs().max(1.0),
                            "{name} at n = {n}, element {i}: {a} vs {b}\n{kernel}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn sizes_of_one_and_zero_and_long_rows_are_other_forms() {
    // A broadcast along a dimension of 1 drops out of the walk.
    let add = |g: &mut Graph, n: usize| {
        let x = g.input(Shape::from([1, 37]), DType::F32);
        let y = g.input(Shape::from([n, 37]), DType::F32);
        let xb = view(g, View::contiguous(Shape::from([1, 37])).expand(&Shape::from([n, 37])), x);
        binary(g, BinaryOp::Add, xb, y)
    };
    let form_at = |n| form(&kernel_at(n, &add).0);
    assert_eq!(form_at(9), form_at(10));
    assert_ne!(form_at(1), form_at(9));
    // An empty dimension's neighbours have stride 0 in a contiguous layout.
    let transposed = |g: &mut Graph, n: usize| {
        let x = g.input(Shape::from([37, n]), DType::F32);
        let t = view(g, View::contiguous(Shape::from([37, n])).permute(&[1, 0]), x);
        unary(g, UnaryOp::Neg, t)
    };
    let form_at = |n| form(&kernel_at(n, &transposed).0);
    assert_ne!(form_at(0), form_at(9));
    // Rows long enough for the batch functions take other code.
    let exp = |g: &mut Graph, n: usize| {
        let x = g.input(Shape::from([3, n]), DType::F32);
        let y = g.input(Shape::from([3, 1]), DType::F32);
        let yb = view(g, View::contiguous(Shape::from([3, 1])).expand(&Shape::from([3, n])), y);
        let s = binary(g, BinaryOp::Sub, x, yb);
        unary(g, UnaryOp::Exp, s)
    };
    let form_at = |n| form(&kernel_at(n, &exp).0);
    assert_eq!(form_at(9), form_at(10));
    assert_ne!(form_at(9), form_at(100));
}
