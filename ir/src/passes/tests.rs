//! The graph passes, on small graphs.
use super::*;
use crate::pipeline::{Fusion, Planner};
use crate::{BinaryOp, DType, Scalar, Shape, UnaryOp, View};

#[test]
fn merges_chains_and_keeps_outputs_and_inputs() {
    let mut g = Graph::new();
    let x = g.input(Shape::from([4]), DType::F32);
    let y = g.input(Shape::from([4]), DType::F32);
    let c1 = g.leaf(Op::Full(Scalar::F64(2.0)), Shape::from([4]), DType::F32).unwrap();
    let c2 = g.leaf(Op::Full(Scalar::F64(2.0)), Shape::from([4]), DType::F32).unwrap();
    let a = g.push(Op::Binary(BinaryOp::Mul), &[x, c1]).unwrap();
    let b = g.push(Op::Binary(BinaryOp::Mul), &[x, c2]).unwrap();
    let ta = g.push(Op::Unary(UnaryOp::Tanh), &[a]).unwrap();
    let tb = g.push(Op::Unary(UnaryOp::Tanh), &[b]).unwrap();
    let other = g.push(Op::Binary(BinaryOp::Mul), &[y, c1]).unwrap();
    g.mark_output(ta);
    g.mark_output(tb);
    g.mark_output(other);
    let rw = cse(&g, Constants::Fold);
    let (m, outs) = (rw.graph, [rw.map[&ta], rw.map[&tb], rw.map[&other]]);
    // x, y, 2.0, x*2, tanh, y*2
    assert_eq!(m.len(), 6);
    assert_eq!(outs[0], outs[1]);
    assert_ne!(outs[0], outs[2]);
    assert_eq!(m.inputs().len(), 2);
    m.verify().unwrap();
}

#[test]
fn reshape_adjoints_and_views_of_reshapes_become_plain_views() {
    use crate::View;
    let mut g = Graph::new();
    let x = g.input(Shape::from([2, 6]), DType::F32);
    // The gradient of a reshape [3, 4] -> [2, 6]: an unview that reads x in order.
    let back = g
        .push(
            Op::Unview { view: View::contiguous(Shape::from([2, 6])), shape: Shape::from([3, 4]) },
            &[x],
        )
        .unwrap();
    // A transpose of a reshape of x reads x's buffer directly.
    let r = g.push(Op::View(View::contiguous(Shape::from([4, 3]))), &[x]).unwrap();
    let t = g.push(Op::View(View::from_parts(Shape::from([3, 4]), vec![1, 3], 0)), &[r]).unwrap();
    // A slice's adjoint is a real scatter into zeros, and stays.
    let pad = g
        .push(
            Op::Unview {
                view: View::from_parts(Shape::from([2, 6]), vec![8, 1], 1),
                shape: Shape::from([2, 8]),
            },
            &[x],
        )
        .unwrap();
    for o in [back, t, pad] {
        g.mark_output(o);
    }
    let Rewrite { graph: s, map } = simplify(&g);
    s.verify().unwrap();
    assert!(matches!(s.node(map[&back]).op, Op::View(_)), "{}", s.to_dot());
    assert_eq!(s.args(map[&t]), &[map[&x]]);
    assert!(matches!(s.node(map[&pad]).op, Op::Unview { .. }));
}

#[test]
fn exact_identities_simplify() {
    let mut g = Graph::new();
    let x = g.input(Shape::from([4]), DType::F32);
    let one = g.leaf(Op::Full(Scalar::F64(1.0)), Shape::from([]), DType::F32).unwrap();
    let ones = g
        .push(Op::View(crate::View::contiguous(Shape::from([])).expand(&Shape::from([4]))), &[one])
        .unwrap();
    let zero = g.leaf(Op::Full(Scalar::F64(0.0)), Shape::from([4]), DType::F32).unwrap();
    let a = g.push(Op::Binary(BinaryOp::Mul), &[x, ones]).unwrap();
    let b = g.push(Op::Binary(BinaryOp::Sub), &[a, zero]).unwrap();
    let n1 = g.push(Op::Unary(UnaryOp::Neg), &[b]).unwrap();
    let n2 = g.push(Op::Unary(UnaryOp::Neg), &[n1]).unwrap();
    let c = g.push(Op::Binary(BinaryOp::Add), &[n2, zero]).unwrap();
    g.mark_output(c);
    let Rewrite { graph: s, map } = simplify(&g);
    let outs = [map[&c]];
    // x, 0, and x + 0 (kept: -0 + 0 is +0).
    assert_eq!(s.len(), 3, "{}", s.to_dot());
    assert_eq!(s.args(outs[0]).len(), 2);
    s.verify().unwrap();
    // An output that simplifies to an input is the input itself.
    let mut g = Graph::new();
    let x = g.input(Shape::from([2]), DType::F64);
    let n1 = g.push(Op::Unary(UnaryOp::Neg), &[x]).unwrap();
    let n2 = g.push(Op::Unary(UnaryOp::Neg), &[n1]).unwrap();
    g.mark_output(n2);
    let Rewrite { graph: s, map } = simplify(&g);
    assert_eq!(vec![map[&n2]], s.inputs().to_vec());
}

#[test]
fn exact_integer_powers_become_products() {
    let pow_of = |e: f64| {
        let mut g = Graph::new();
        let x = g.input(Shape::from([3]), DType::F32);
        let c = g.leaf(Op::Full(Scalar::F64(e)), Shape::from([3]), DType::F32).unwrap();
        let p = g.push(Op::Binary(BinaryOp::Pow), &[x, c]).unwrap();
        g.mark_output(p);
        let Rewrite { graph: s, map } = simplify(&g);
        s.verify().unwrap();
        (s.node(map[&p]).op.clone(), s.len())
    };
    assert_eq!(pow_of(2.0), (Op::Binary(BinaryOp::Mul), 2));
    assert_eq!(pow_of(-1.0), (Op::Unary(UnaryOp::Recip), 2));
    assert_eq!(pow_of(1.0), (Op::Input, 1));
    // Others are not exact as products (x^3 would round twice), so they stay.
    assert_eq!(pow_of(3.0), (Op::Binary(BinaryOp::Pow), 3));
    assert_eq!(pow_of(0.5), (Op::Binary(BinaryOp::Pow), 3));
}

#[test]
fn transposed_products_swap_their_operands() {
    // (xᵀ g)ᵀ, as autograd makes it for the weight of x @ wᵀ, becomes gᵀ x: the transpose
    // of the view xᵀ is x itself, and the product is read in place.
    let mut g = Graph::new();
    let x = g.input(Shape::from([5, 3]), DType::F32);
    let grad = g.input(Shape::from([5, 4]), DType::F32);
    let xt =
        g.push(Op::View(View::contiguous(Shape::from([5, 3])).permute(&[1, 0])), &[x]).unwrap();
    let p = g.push(Op::MatMul, &[xt, grad]).unwrap();
    let back =
        g.push(Op::View(View::contiguous(Shape::from([3, 4])).permute(&[1, 0])), &[p]).unwrap();
    g.mark_output(back);
    let Rewrite { graph: out, map } = transpose_products(&g).expect("a product to rewrite");
    let o = map[&back];
    assert!(matches!(out.node(o).op, Op::MatMul));
    assert_eq!(out.node(o).shape, Shape::from([4, 3]));
    let args = out.args(o);
    assert!(matches!(out.node(args[0]).op, Op::View(_)), "gᵀ");
    assert_eq!(args[1], map[&x], "(xᵀ)ᵀ is x");
    assert!(!map.contains_key(&p), "the old product is gone");
    assert_eq!(out.inputs(), &[map[&x], map[&grad]]);
    // A product with another consumer stays.
    let mut g2 = g.clone();
    let e = g2.push(Op::Unary(UnaryOp::Exp), &[p]).unwrap();
    g2.mark_output(e);
    assert!(transpose_products(&g2).is_none());
}

#[test]
fn constants_fold_as_the_reference_computes_them() {
    // exp(2 * 0.5) + x: the constant subexpression becomes one fill of e (rounded to f32).
    let mut g = Graph::new();
    let x = g.input(Shape::from([3]), DType::F32);
    let two = g.leaf(Op::Full(Scalar::F64(2.0)), Shape::from([3]), DType::F32).unwrap();
    let half = g.leaf(Op::Full(Scalar::F64(0.5)), Shape::from([3]), DType::F32).unwrap();
    let m = g.push(Op::Binary(BinaryOp::Mul), &[two, half]).unwrap();
    let e = g.push(Op::Unary(UnaryOp::Exp), &[m]).unwrap();
    let y = g.push(Op::Binary(BinaryOp::Add), &[e, x]).unwrap();
    g.mark_output(y);
    let Rewrite { graph: out, map } = simplify(&g);
    assert_eq!(out.len(), 3, "x, the folded fill, the add");
    let args = out.args(map[&y]);
    let Op::Full(v) = out.node(args[0]).op else { panic!("a fill") };
    assert_eq!(v.to_f64(), f64::from(1f64.exp() as f32));
    // Integer ops are left to the executor (wrapping semantics).
    let mut g = Graph::new();
    let a = g.leaf(Op::Full(Scalar::I64(i64::MAX)), Shape::from([1]), DType::I64).unwrap();
    let b = g.push(Op::Binary(BinaryOp::Add), &[a, a]).unwrap();
    g.mark_output(b);
    assert_eq!(simplify(&g).graph.len(), 2);
}

#[test]
fn gathers_move_below_elementwise_ops() {
    use crate::fuse::Step;
    // gather((x - m) - l, i) with m, l broadcast along the gathered axis: cross-entropy.
    let mut g = Graph::new();
    let (full, row) = (Shape::from([4, 5]), Shape::from([4, 1]));
    let x = g.input(full.clone(), DType::F32);
    let m = g.input(row.clone(), DType::F32);
    let l = g.input(row.clone(), DType::F32);
    let i = g.input(Shape::from([4, 1]), DType::I64);
    let mb = g.push(Op::View(View::contiguous(row.clone()).expand(&full)), &[m]).unwrap();
    let lb = g.push(Op::View(View::contiguous(row.clone()).expand(&full)), &[l]).unwrap();
    let d = g.push(Op::Binary(BinaryOp::Sub), &[x, mb]).unwrap();
    let e = g.push(Op::Binary(BinaryOp::Sub), &[d, lb]).unwrap();
    let picked = g.push(Op::Gather { axis: 1 }, &[e, i]).unwrap();
    g.mark_output(picked);
    let options = PlanOptions {
        fusion: Fusion::Fused,
        constants: Constants::Fold,
        target: crate::target::testing::CPU,
    };
    let plan = Planner::default().plan(&g, options);
    let opt = &plan.graph;
    opt.verify().unwrap();
    assert_eq!(opt.node(plan.outputs[0]).shape, Shape::from([4, 1]));
    // One gather, of x itself; nothing of the full shape is computed any more.
    let gathers: Vec<_> = plan
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Node(n) => Some(*n),
            _ => None,
        })
        .collect();
    assert_eq!(gathers.len(), 1);
    assert_eq!(opt.args(gathers[0])[0], opt.inputs()[0]);
    assert!(plan.steps.iter().all(|s| match s {
        Step::Kernel(k) => k.kernel.shape.numel() == 4,
        _ => true,
    }));
    // An expression of full operands read elsewhere too keeps its gather.
    let mut g2 = Graph::new();
    let a = g2.input(full.clone(), DType::F32);
    let b = g2.input(full.clone(), DType::F32);
    let i2 = g2.input(Shape::from([4, 1]), DType::I64);
    let s = g2.push(Op::Binary(BinaryOp::Add), &[a, b]).unwrap();
    let p = g2.push(Op::Gather { axis: 1 }, &[s, i2]).unwrap();
    g2.mark_output(p);
    g2.mark_output(s);
    assert!(gather_first(&g2).is_none());
    // With only broadcast operands nothing would check the index: left alone.
    let mut g3 = Graph::new();
    let m3 = g3.input(row.clone(), DType::F32);
    let i3 = g3.input(Shape::from([4, 1]), DType::I64);
    let mb3 = g3.push(Op::View(View::contiguous(row.clone()).expand(&full)), &[m3]).unwrap();
    let n3 = g3.push(Op::Unary(UnaryOp::Neg), &[mb3]).unwrap();
    let p3 = g3.push(Op::Gather { axis: 1 }, &[n3, i3]).unwrap();
    g3.mark_output(p3);
    assert!(gather_first(&g3).is_none());
}

#[test]
fn logsumexp_expands_where_the_target_has_no_one_pass_kernel() {
    use crate::ReduceOp;
    use crate::kernel::interpret;
    use crate::pipeline::PlanOptions;
    use crate::target::testing::CPU;
    let lse = Op::Reduce { op: ReduceOp::LogSumExp, axes: vec![1] };
    let graph = |dtype| {
        let mut g = Graph::new();
        let x = g.input(Shape::from([3, 5]), dtype);
        let y = g.push(lse.clone(), &[x]).unwrap();
        g.mark_output(y);
        (g, y)
    };
    let options = |fused_logsumexp| PlanOptions {
        fusion: Fusion::Fused,
        constants: Constants::Fold,
        target: crate::target::Target { fused_logsumexp, ..CPU },
    };
    // Kept on a target that fuses it (in f32), expanded elsewhere or in another dtype.
    let (g, _) = graph(DType::F32);
    assert!(expand_logsumexp(&g, &options(true)).is_none());
    for (dtype, fused) in [(DType::F32, false), (DType::F64, true), (DType::F16, true)] {
        let (g, y) = graph(dtype);
        let rw = expand_logsumexp(&g, &options(fused)).expect("expanded");
        rw.graph.verify().unwrap();
        let ops: Vec<String> =
            rw.graph.topo_order().iter().map(|&n| rw.graph.node(n).op.name().to_string()).collect();
        assert!(!ops.iter().any(|o| o == "logsumexp"), "{ops:?}");
        assert_eq!(rw.graph.node(rw.map[&y]).shape, Shape::from([3, 1]));
    }
    // The expansion computes the same values (to f32 rounding): plan both and interpret the
    // kernels.
    let values: Vec<f64> = (0..15)
        .map(|i| if i == 7 { f64::NEG_INFINITY } else { (i as f64 * 1.7).sin() * 40.0 })
        .collect();
    let run = |fused| {
        let (g, _) = graph(DType::F32);
        let plan = Planner::default().plan(&g, options(fused));
        let mut bufs: std::collections::HashMap<crate::NodeId, Vec<f64>> =
            [(plan.graph.inputs()[0], values.clone())].into();
        for step in &plan.steps {
            let crate::fuse::Step::Kernel(k) = step else { panic!("kernels only") };
            let ins: Vec<Vec<f64>> = k.inputs.iter().map(|n| bufs[n].clone()).collect();
            let outs = interpret(&k.kernel, &ins, &k.params);
            for (n, v) in k.outputs.iter().zip(outs) {
                bufs.insert(*n, v);
            }
        }
        bufs[&plan.outputs[0]].clone()
    };
    let (one_pass, expanded) = (run(true), run(false));
    assert_eq!(one_pass.len(), 3);
    for (a, b) in one_pass.iter().zip(&expanded) {
        assert!((a - b).abs() < 1e-5 * a.abs().max(1.0), "{one_pass:?} vs {expanded:?}");
    }
}

#[test]
fn casts_of_views_that_feed_attention_become_views_of_one_cast() {
    use crate::View;
    // q, k, v: the heads of one [2, 5, 3·8] projection, each cast to bf16 for attention.
    let mut g = Graph::new();
    let x = g.input(Shape::from([2, 5, 24]), DType::F32);
    let one = g.leaf(Op::Full(Scalar::F64(1.0)), Shape::from([2, 5, 24]), DType::F32).unwrap();
    let proj = g.push(Op::Binary(BinaryOp::Add), &[x, one]).unwrap();
    let head = |g: &mut Graph, i: usize| {
        let v = View::contiguous(Shape::from([2, 5, 24]))
            .narrow(2, 8 * i, 8)
            .reshape(&Shape::from([2, 5, 2, 4]))
            .unwrap()
            .permute(&[0, 2, 1, 3]);
        let view = g.push(Op::View(v), &[proj]).unwrap();
        g.push(Op::Cast(DType::BF16), &[view]).unwrap()
    };
    let (q, k, v) = (head(&mut g, 0), head(&mut g, 1), head(&mut g, 2));
    let y = g
        .push(
            Op::Attention { mask: crate::AttentionMask::Causal, scale: 0.5f64.to_bits() },
            &[q, k, v],
        )
        .unwrap();
    // A cast of a view that an elementwise op reads stays: it fuses there.
    let slice = g.push(Op::View(View::contiguous(Shape::from([2, 5, 24]))), &[x]).unwrap();
    let c = g.push(Op::Cast(DType::F64), &[slice]).unwrap();
    let e = g.push(Op::Unary(UnaryOp::Exp), &[c]).unwrap();
    g.mark_output(y);
    g.mark_output(e);
    let rw = casts_before_views(&g).expect("the heads' casts move");
    rw.graph.verify().unwrap();
    let ops: Vec<String> =
        rw.graph.topo_order().iter().map(|&n| rw.graph.node(n).op.name().to_string()).collect();
    assert_eq!(ops.iter().filter(|o| *o == "cast").count(), 2, "{ops:?}");
    // Attention reads three views of one bf16 cast of the projection.
    let y = rw.map[&y];
    let heads = rw.graph.args(y);
    assert!(heads.iter().all(|&h| matches!(rw.graph.node(h).op, Op::View(_))), "{ops:?}");
    let bases: Vec<NodeId> = heads.iter().map(|&h| rw.graph.args(h)[0]).collect();
    assert!(bases.iter().all(|&b| b == bases[0]));
    assert_eq!(rw.graph.node(bases[0]).op, Op::Cast(DType::BF16));
    assert_eq!(rw.graph.node(bases[0]).shape, Shape::from([2, 5, 24]));
    // One head alone reads a third of the projection: casting all of it would cost more.
    let mut g = Graph::new();
    let x = g.input(Shape::from([2, 5, 24]), DType::F32);
    let v = View::contiguous(Shape::from([2, 5, 24])).narrow(2, 0, 8);
    let view = g.push(Op::View(v), &[x]).unwrap();
    let c = g.push(Op::Cast(DType::BF16), &[view]).unwrap();
    let w = g.input(Shape::from([2, 8, 3]), DType::BF16);
    let m = g.push(Op::MatMul, &[c, w]).unwrap();
    g.mark_output(m);
    assert!(casts_before_views(&g).is_none());
}

#[test]
fn log_softmax_subtracts_the_maximum_and_the_log_of_the_sum_apart() {
    use crate::ReduceOp;
    use crate::kernel::interpret;
    use crate::pipeline::PlanOptions;
    use crate::target::testing::CPU;
    let graph = |dtype| {
        let mut g = Graph::new();
        let x = g.input(Shape::from([2, 4]), dtype);
        let lse = g.push(Op::Reduce { op: ReduceOp::LogSumExp, axes: vec![1] }, &[x]).unwrap();
        let wide = View::contiguous(Shape::from([2, 1])).expand(&Shape::from([2, 4]));
        let e = g.push(Op::View(wide), &[lse]).unwrap();
        let y = g.push(Op::Binary(BinaryOp::Sub), &[x, e]).unwrap();
        g.mark_output(y);
        g
    };
    let options = |fused_logsumexp, fusion| PlanOptions {
        fusion,
        constants: Constants::Fold,
        target: crate::target::Target { fused_logsumexp, ..CPU },
    };
    for dtype in [DType::F64, DType::F16, DType::BF16] {
        assert!(precise_log_softmax(&graph(dtype), &options(true, Fusion::Fused)).is_none());
    }
    let ops = |g: &Graph| -> Vec<String> {
        g.topo_order()
            .iter()
            .map(|&n| format!("{} {}", g.node(n).op.name(), g.node(n).dtype))
            .collect()
    };
    // One pass: the log-sum-exp of the widened logits, split in two f32 halves; elsewhere the
    // maximum and a sum of exponentials.
    let one_pass = precise_log_softmax(&graph(DType::F32), &options(true, Fusion::Fused)).unwrap();
    assert!(
        ops(&one_pass.graph).contains(&"logsumexp f64".to_string()),
        "{:?}",
        ops(&one_pass.graph)
    );
    for (fused, fusion) in [(false, Fusion::Fused), (true, Fusion::Unfused)] {
        let rw = precise_log_softmax(&graph(DType::F32), &options(fused, fusion)).unwrap();
        let names = ops(&rw.graph);
        assert!(!names.iter().any(|o| o.starts_with("logsumexp")), "{names:?}");
        assert!(names.contains(&"max f32".to_string()), "{names:?}");
    }
    // Logits of 1000 give log(1/4) to f32 precision (x - logsumexp(x) rounded at 1000 did not).
    let values: Vec<f64> =
        [1000.0, 1000.0, 1000.0, 1000.0, 3.0, f64::NEG_INFINITY, 1.0, 2.0].to_vec();
    for (fused, fusion) in [(true, Fusion::Fused), (false, Fusion::Fused), (true, Fusion::Unfused)]
    {
        let plan = Planner::default().plan(&graph(DType::F32), options(fused, fusion));
        let mut bufs: std::collections::HashMap<crate::NodeId, Vec<f64>> =
            [(plan.graph.inputs()[0], values.clone())].into();
        for step in &plan.steps {
            let crate::fuse::Step::Kernel(k) = step else { panic!("kernels only") };
            let ins: Vec<Vec<f64>> = k.inputs.iter().map(|n| bufs[n].clone()).collect();
            for (n, v) in k.outputs.iter().zip(interpret(&k.kernel, &ins, &k.params)) {
                bufs.insert(*n, v);
            }
        }
        let got = &bufs[&plan.outputs[0]];
        let lse = 3f64 + (1.0 + (-2f64).exp() + (-1f64).exp()).ln();
        let want = [-(4f64.ln()), -(4f64.ln()), -(4f64.ln()), -(4f64.ln())].into_iter().chain([
            3.0 - lse,
            f64::NEG_INFINITY,
            1.0 - lse,
            2.0 - lse,
        ]);
        for (g, w) in got.iter().zip(want) {
            assert!(g == &w || (g - w).abs() < 2e-7 * w.abs().max(1.0), "{got:?}");
        }
    }
}
