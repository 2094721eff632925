//! The partition and lowering rules, on small graphs.

use super::*;
use crate::pipeline::Constants;
use crate::target::OpCosts;
use crate::target::Target;
use crate::{BinaryOp, DType, Shape, UnaryOp};

const CPU: Target = crate::target::testing::CPU;
/// A GPU-like target: every elementwise op is cheap, reductions recompute.
const GPU: Target = Target {
    name: "test-gpu",
    costs: OpCosts { transcendental: 2, division: 2, arithmetic: 2 },
    gemm_dtypes: &[DType::F32, DType::F64, DType::F16, DType::BF16],
    library_reads_views: true,
    reductions_store_inputs: false,
    fused_logsumexp: false,
    writes_in_place: false,
    custom_ops_read_views: false,
};

/// The steps of `graph` partitioned and lowered.
struct Steps {
    steps: Vec<Step>,
}

impl std::fmt::Debug for Steps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.steps.fmt(f)
    }
}

fn partition_for(graph: &Graph, fusion: Fusion, target: Target) -> Steps {
    let options = PlanOptions { fusion, constants: Constants::Fold, target };
    Steps { steps: lower(graph, &partition(graph, &options), &options) }
}

fn steps(graph: &Graph, fusion: Fusion) -> Steps {
    partition_for(graph, fusion, CPU)
}

fn chain() -> (Graph, NodeId) {
    let mut g = Graph::new();
    let x = g.input(Shape::from([4, 3]), DType::F32);
    let row = g.input(Shape::from([3]), DType::F32);
    let rv = g
        .push(Op::View(View::contiguous(Shape::from([3])).expand(&Shape::from([4, 3]))), &[row])
        .unwrap();
    let half = g.leaf(Op::Full(Scalar::F64(0.5)), Shape::from([]), DType::F32).unwrap();
    let hv = g
        .push(Op::View(View::contiguous(Shape::from([])).expand(&Shape::from([4, 3]))), &[half])
        .unwrap();
    let a = g.push(Op::Binary(BinaryOp::Mul), &[x, hv]).unwrap();
    let b = g.push(Op::Binary(BinaryOp::Add), &[a, rv]).unwrap();
    let c = g.push(Op::Unary(UnaryOp::Relu), &[b]).unwrap();
    g.mark_output(c);
    (g, c)
}

#[test]
fn an_elementwise_chain_is_one_kernel() {
    let (g, c) = chain();
    let plan = steps(&g, Fusion::Fused);
    assert_eq!(plan.steps.len(), 1);
    let Step::Kernel(k) = &plan.steps[0] else { panic!("a kernel") };
    assert_eq!(k.outputs, vec![c]);
    assert_eq!(k.kernel.inputs.len(), 2);
    assert_eq!(k.kernel.params, 1);
    assert_eq!(k.params, vec![Scalar::F64(0.5)]);
    assert_eq!(k.kernel.op_count(), 3);
    assert_eq!(k.cut, Cut::Output);
}

/// Row softmax: `exp(x - max) / sum(exp(x - max))` over `[rows, cols]`.
fn softmax(rows: usize, cols: usize) -> Graph {
    let mut g = Graph::new();
    let (full, row) = (Shape::from([rows, cols]), Shape::from([rows, 1]));
    let x = g.input(full.clone(), DType::F32);
    let red = |g: &mut Graph, op, v| {
        let r = g.push(Op::Reduce { op, axes: vec![1] }, &[v]).unwrap();
        g.push(Op::View(View::contiguous(row.clone()).expand(&full)), &[r]).unwrap()
    };
    let m = red(&mut g, crate::ReduceOp::Max, x);
    let d = g.push(Op::Binary(BinaryOp::Sub), &[x, m]).unwrap();
    let e = g.push(Op::Unary(UnaryOp::Exp), &[d]).unwrap();
    let s = red(&mut g, crate::ReduceOp::Sum, e);
    let y = g.push(Op::Binary(BinaryOp::Div), &[e, s]).unwrap();
    g.mark_output(y);
    g
}

#[test]
fn softmax_takes_three_passes_on_either_target() {
    let g = softmax(5, 7);
    // Reads and writes of input-sized arrays (broadcast row values, stride 0, are not).
    let traffic = |plan: &Steps| -> usize {
        plan.steps
            .iter()
            .map(|s| match s {
                Step::Kernel(k) => {
                    let full = |v: &View| !v.strides().contains(&0);
                    k.kernel.inputs.iter().filter(|i| full(&i.view)).count()
                        + k.kernel.output_lens().iter().filter(|&&n| n == 35).count()
                }
                _ => 0,
            })
            .sum()
    };
    let cpu = partition_for(&g, Fusion::Fused, CPU);
    let gpu = partition_for(&g, Fusion::Fused, GPU);
    // CPU: the max reads x; one pass reads x and writes exp(x - max) while summing it;
    // the division reads it back and writes y. The exponential is computed once.
    assert_eq!(cpu.steps.len(), 3, "{cpu:?}");
    assert_eq!(traffic(&cpu), 5, "{cpu:?}");
    let Step::Kernel(sum) = &cpu.steps[1] else { panic!("a kernel") };
    assert_eq!(sum.kernel.outputs.len(), 2, "the sum also writes the exponential");
    assert_eq!(sum.kernel.output_lens(), vec![5, 35]);
    let exps = |p: &Steps| {
        p.steps
            .iter()
            .filter_map(|s| match s {
                Step::Kernel(k) => Some(k),
                _ => None,
            })
            .flat_map(|k| &k.kernel.exprs)
            .filter(|e| e.kind == crate::kernel::ExprKind::Unary(UnaryOp::Exp, e_arg(e)))
            .count()
    };
    assert_eq!(exps(&cpu), 1);
    // GPU: the max, the sum and the division each read x, recomputing the exponential.
    assert_eq!(gpu.steps.len(), 3, "{gpu:?}");
    assert_eq!(traffic(&gpu), 4, "{gpu:?}");
    assert_eq!(exps(&gpu), 2);
    assert_eq!(steps(&g, Fusion::Fused).steps.len(), cpu.steps.len());
}

/// The argument of a unary expression (for matching on the op alone).
fn e_arg(e: &crate::kernel::Expr) -> usize {
    match e.kind {
        crate::kernel::ExprKind::Unary(_, a) => a,
        _ => usize::MAX,
    }
}

#[test]
fn fusion_off_gives_one_kernel_per_op() {
    let (g, _) = chain();
    let plan = steps(&g, Fusion::Unfused);
    assert_eq!(plan.steps.len(), 3);
    assert!(plan.steps.iter().all(|s| matches!(s, Step::Kernel(k) if k.kernel.op_count() == 1)));
}

#[test]
fn long_chains_are_cut_by_size() {
    let mut g = Graph::new();
    let mut x = g.input(Shape::from([8]), DType::F32);
    for _ in 0..1000 {
        x = g.push(Op::Unary(UnaryOp::Neg), &[x]).unwrap();
    }
    g.mark_output(x);
    let plan = steps(&g, Fusion::Fused);
    assert!(
        plan.steps
            .iter()
            .all(|s| matches!(s, Step::Kernel(k) if k.kernel.op_count() <= MAX_KERNEL_OPS))
    );
    assert_eq!(plan.steps.len(), 1000usize.div_ceil(MAX_KERNEL_OPS));
}

#[test]
fn shared_values_and_reductions_cut() {
    let mut g = Graph::new();
    let x = g.input(Shape::from([2, 3]), DType::F64);
    let e = g.push(Op::Unary(UnaryOp::Exp), &[x]).unwrap();
    let s = g.push(Op::Reduce { op: crate::ReduceOp::Sum, axes: vec![1] }, &[e]).unwrap();
    let v = g
        .push(Op::View(View::contiguous(Shape::from([2, 1])).expand(&Shape::from([2, 3]))), &[s])
        .unwrap();
    let d = g.push(Op::Binary(BinaryOp::Div), &[e, v]).unwrap();
    g.mark_output(d);
    let plan = steps(&g, Fusion::Fused);
    // exp is shared by the sum and the division and too costly to compute twice: it is
    // stored, by the sum's kernel (which computes it, sums it and writes it); the
    // division reads both.
    assert_eq!(plan.steps.len(), 2);
    let Step::Kernel(k1) = &plan.steps[0] else { panic!("a reduction kernel") };
    assert_eq!(k1.kernel.reduce.map(|r| r.kept), Some(1));
    assert_eq!(k1.outputs, vec![s, e]);
    assert_eq!(k1.inputs, vec![x]);
    let Step::Kernel(k2) = &plan.steps[1] else { panic!("a kernel last") };
    assert_eq!(k2.inputs, vec![e, s]);
    assert_eq!(k2.kernel.inputs[1].view.strides(), &[1, 0]);
    // Without the merge (a GPU plan recomputes instead), exp would be its own kernel.
    let gpu = partition_for(&g, Fusion::Fused, GPU);
    assert!(gpu.steps.iter().all(|st| matches!(st, Step::Kernel(k) if k.outputs.len() == 1)));
}

#[test]
fn cheap_shared_values_are_recomputed_into_reductions() {
    let mut g = Graph::new();
    let x = g.input(Shape::from([2, 3]), DType::F64);
    let two = g.leaf(Op::Full(Scalar::F64(2.0)), Shape::from([2, 3]), DType::F64).unwrap();
    let d = g.push(Op::Binary(BinaryOp::Mul), &[x, two]).unwrap();
    let s = g.push(Op::Reduce { op: crate::ReduceOp::Sum, axes: vec![1] }, &[d]).unwrap();
    let v = g
        .push(Op::View(View::contiguous(Shape::from([2, 1])).expand(&Shape::from([2, 3]))), &[s])
        .unwrap();
    let q = g.push(Op::Binary(BinaryOp::Sub), &[d, v]).unwrap();
    g.mark_output(q);
    let plan = steps(&g, Fusion::Fused);
    // x * 2 is computed inside the sum and again inside the subtraction.
    assert_eq!(plan.steps.len(), 2);
    let Step::Kernel(k0) = &plan.steps[0] else { panic!("a reduction kernel first") };
    assert_eq!(k0.kernel.op_count(), 1);
    let Step::Kernel(k1) = &plan.steps[1] else { panic!("a kernel last") };
    assert_eq!(k1.inputs, vec![x, s]);
    // Unfused, every op is stored.
    assert_eq!(steps(&g, Fusion::Unfused).steps.len(), 3);
}

fn unary(g: &mut Graph, op: UnaryOp, x: NodeId) -> NodeId {
    g.push(Op::Unary(op), &[x]).unwrap()
}

#[test]
fn kept_results_are_written_by_the_kernel_that_consumes_them() {
    // a = exp(x) and b = a + 1 are kept (live handles), c = relu(b) is asked for: one
    // kernel computes all three and writes them.
    let mut g = Graph::new();
    let x = g.input(Shape::from([4, 3]), DType::F32);
    let a = unary(&mut g, UnaryOp::Exp, x);
    let one = g.leaf(Op::Full(Scalar::F64(1.0)), Shape::from([4, 3]), DType::F32).unwrap();
    let b = g.push(Op::Binary(BinaryOp::Add), &[a, one]).unwrap();
    let c = unary(&mut g, UnaryOp::Relu, b);
    for n in [a, b, c] {
        g.mark_output(n);
    }
    let plan = steps(&g, Fusion::Fused);
    assert_eq!(plan.steps.len(), 1);
    let Step::Kernel(k) = &plan.steps[0] else { panic!("a kernel") };
    assert_eq!(k.outputs, vec![c, a, b]);
    assert_eq!(k.kernel.outputs.len(), 3);
    assert_eq!(k.inputs, vec![x]);
    // Unfused, each is its own kernel.
    assert_eq!(steps(&g, Fusion::Unfused).steps.len(), 3);
}

#[test]
fn kept_results_read_by_reductions_or_views_stay_stored_and_several_kernels_share_one() {
    let mut g = Graph::new();
    let x = g.input(Shape::from([4, 3]), DType::F32);
    let a = unary(&mut g, UnaryOp::Exp, x);
    g.mark_output(a);
    // Read by a reduction: the reduction kernel reads it back.
    let s = g.push(Op::Reduce { op: crate::ReduceOp::Sum, axes: vec![1] }, &[a]).unwrap();
    g.mark_output(s);
    let plan = steps(&g, Fusion::Fused);
    assert_eq!(plan.steps.len(), 2);
    // Read through a view (a transpose) and by two kernels that are both kept.
    let mut g = Graph::new();
    let x = g.input(Shape::from([3, 3]), DType::F32);
    let a = unary(&mut g, UnaryOp::Exp, x);
    let t = g.push(Op::View(View::contiguous(Shape::from([3, 3])).permute(&[1, 0])), &[a]);
    let t = t.unwrap();
    let y = unary(&mut g, UnaryOp::Neg, t);
    g.mark_output(a);
    g.mark_output(y);
    assert_eq!(steps(&g, Fusion::Fused).steps.len(), 2);
    let mut g = Graph::new();
    let x = g.input(Shape::from([3, 3]), DType::F32);
    let a = unary(&mut g, UnaryOp::Exp, x);
    let p = unary(&mut g, UnaryOp::Neg, a);
    let q = unary(&mut g, UnaryOp::Sqrt, a);
    for n in [a, p, q] {
        g.mark_output(n);
    }
    // Read by two kernels: the first writes it beside its own result, the second reads it.
    let plan = steps(&g, Fusion::Fused);
    assert_eq!(plan.steps.len(), 2);
    let Step::Kernel(first) = &plan.steps[0] else { panic!("a kernel") };
    let Step::Kernel(second) = &plan.steps[1] else { panic!("a kernel") };
    assert_eq!((first.outputs.len(), first.inputs.clone()), (2, vec![x]));
    assert!(first.outputs.contains(&a), "{:?}", first.outputs);
    assert_eq!((second.outputs.len(), second.inputs.clone()), (1, vec![a]));
}

#[test]
fn a_collective_runs_as_soon_as_its_input_is_ready() {
    use crate::{Collective, CollectiveKind, CollectiveReduce};
    // A backward-like graph: `g` is ready early, its all-reduce is recorded last (as a
    // gradient hook records it), and a chain of products runs in between.
    let mut g = Graph::new();
    let x = g.input(Shape::from([8, 8]), DType::F32);
    let grad = g.push(Op::Unary(UnaryOp::Exp), &[x]).unwrap();
    let scaled = g.push(Op::Binary(BinaryOp::Mul), &[grad, grad]).unwrap();
    let mut h = x;
    for _ in 0..3 {
        h = g.push(Op::MatMul, &[h, x]).unwrap();
    }
    let c =
        Collective { kind: CollectiveKind::AllReduce(CollectiveReduce::Mean), group: 0, world: 2 };
    let reduced = g.push(Op::Collective(c), &[scaled]).unwrap();
    let out = g.push(Op::Binary(BinaryOp::Add), &[reduced, h]).unwrap();
    g.mark_output(out);
    for fusion in [Fusion::Fused, Fusion::Unfused] {
        let plan = steps(&g, fusion);
        let at = |n: NodeId| {
            plan.steps
                .iter()
                .position(|s| s.writes().contains(&n))
                .unwrap_or_else(|| panic!("{n:?} has no step in {plan:?}"))
        };
        let first_product = plan.steps.iter().position(|s| matches!(s, Step::Library { .. }));
        // Before every product: the executor hands it to the engine and runs them meanwhile.
        assert!(at(reduced) < first_product.unwrap(), "{fusion:?}: {plan:?}");
        assert!(at(scaled) < at(reduced) && at(reduced) < at(out), "{fusion:?}: {plan:?}");
    }
}

#[test]
fn a_residual_stream_is_stored_before_its_rereads_cost_more() {
    // h = x, then h = h + a_i for twelve layer outputs a_i (stored: inputs here), each h also
    // reduced (a norm's sum of squares). Recomputing h in every reduction would read every
    // earlier a_i again; stored every few additions, no kernel reads more than four buffers.
    for target in [CPU, GPU] {
        let mut g = Graph::new();
        let shape = Shape::from([8, 16]);
        let mut h = g.input(shape.clone(), DType::F32);
        let mut sums = Vec::new();
        for _ in 0..12 {
            let a = g.input(shape.clone(), DType::F32);
            h = g.push(Op::Binary(BinaryOp::Add), &[h, a]).unwrap();
            let sq = g.push(Op::Binary(BinaryOp::Mul), &[h, h]).unwrap();
            sums.push(
                g.push(Op::Reduce { op: crate::ReduceOp::Sum, axes: vec![1] }, &[sq]).unwrap(),
            );
        }
        g.mark_output(h);
        for s in sums {
            g.mark_output(s);
        }
        let plan = partition_for(&g, Fusion::Fused, target);
        let widest = plan
            .steps
            .iter()
            .filter_map(|s| if let Step::Kernel(k) = s { Some(k.inputs.len()) } else { None })
            .max();
        assert!(widest.is_some_and(|w| w <= 4), "{}: {plan:?}", target.name);
    }
}
