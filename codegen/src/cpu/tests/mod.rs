//! Generated kernels against the kernel interpreter, on odd sizes, broadcasts, permuted and
//! offset views, and every dtype.

use half::{bf16, f16};
use kiln_ir::fuse::Step;
use kiln_ir::kernel::{Kernel, interpret};
use kiln_ir::{BinaryOp, DType, Graph, Op, ReduceOp, Scalar, Shape, UnaryOp, View};

use super::compile;

fn to_bytes(values: &[f64], dtype: DType) -> Vec<u8> {
    let mut out = Vec::new();
    for &v in values {
        match dtype {
            DType::F32 => out.extend((v as f32).to_ne_bytes()),
            DType::F64 => out.extend(v.to_ne_bytes()),
            DType::F16 => out.extend(kiln_ir::f16_from_f64(v).to_ne_bytes()),
            DType::BF16 => out.extend(kiln_ir::bf16_from_f64(v).to_ne_bytes()),
            DType::I64 => out.extend((v as i64).to_ne_bytes()),
            DType::I32 => out.extend((v as i32).to_ne_bytes()),
            DType::I8 => out.push(v as i8 as u8),
            DType::U8 => out.push(v as u8),
            DType::Bool => out.push(u8::from(v != 0.0)),
        }
    }
    out
}

fn from_bytes(bytes: &[u8], dtype: DType) -> Vec<f64> {
    let n = dtype.size_in_bytes();
    bytes
        .chunks_exact(n)
        .map(|c| match dtype {
            DType::F32 => f64::from(f32::from_ne_bytes(c.try_into().unwrap())),
            DType::F64 => f64::from_ne_bytes(c.try_into().unwrap()),
            DType::F16 => f16::from_ne_bytes(c.try_into().unwrap()).to_f64(),
            DType::BF16 => bf16::from_ne_bytes(c.try_into().unwrap()).to_f64(),
            DType::I64 => i64::from_ne_bytes(c.try_into().unwrap()) as f64,
            DType::I32 => f64::from(i32::from_ne_bytes(c.try_into().unwrap())),
            DType::I8 => f64::from(c[0] as i8),
            DType::U8 | DType::Bool => f64::from(c[0]),
        })
        .collect()
}

/// Runs the compiled kernel over `start..end` pieces of `chunk` positions.
fn run(kernel: &Kernel, inputs: &[Vec<f64>], params: &[Scalar], chunk: usize) -> Vec<Vec<f64>> {
    let compiled = compile(kernel).unwrap_or_else(|e| panic!("{e}\n{kernel}"));
    run_compiled(&compiled, kernel, inputs, params, chunk)
}

/// Runs `compiled` (compiled for `kernel`, or size-generic for its form) on `kernel`'s sizes.
fn run_compiled(
    compiled: &super::CpuKernel,
    kernel: &Kernel,
    inputs: &[Vec<f64>],
    params: &[Scalar],
    chunk: usize,
) -> Vec<Vec<f64>> {
    let mut in_bytes: Vec<Vec<u8>> =
        inputs.iter().zip(&kernel.inputs).map(|(v, i)| to_bytes(v, i.dtype)).collect();
    let n = kernel.output_len();
    let mut out_bytes: Vec<Vec<u8>> = kernel
        .outputs
        .iter()
        .map(|&o| vec![0u8; n * kernel.exprs[o].dtype.size_in_bytes()])
        .collect();
    let mut ptrs: Vec<*mut u8> = in_bytes.iter_mut().map(|b| b.as_mut_ptr()).collect();
    ptrs.extend(out_bytes.iter_mut().map(|b| b.as_mut_ptr()));
    let p: Vec<u64> = compiled.slots(kernel, params);
    // At least one call, so that an empty domain runs the kernel over `0..0` (which must
    // touch no memory) instead of skipping it.
    let mut start = 0;
    loop {
        let end = (start + chunk).min(n);
        // SAFETY: every buffer holds the elements the kernel's views reach, and the output
        // buffers hold n elements of their dtype.
        unsafe { compiled.call(ptrs.as_ptr(), p.as_ptr(), start as u64, end as u64) };
        start = end;
        if start >= n {
            break;
        }
    }
    out_bytes
        .iter()
        .zip(&kernel.outputs)
        .map(|(b, &o)| from_bytes(b, kernel.exprs[o].dtype))
        .collect()
}

fn check(kernel: &Kernel, inputs: &[Vec<f64>], params: &[Scalar]) {
    let want = interpret(kernel, inputs, params);
    // A 16-bit transcendental is the f32 polynomial's value rounded (as PyTorch's), the
    // interpreter's the f64 function's: one unit in the last place apart near a rounding
    // midpoint, and later ops carry that (a few units after a division).
    let rounded = |dtype| {
        kernel.exprs.iter().any(|e| {
            matches!(e.kind, kiln_ir::kernel::ExprKind::Unary(op, _) if op.is_transcendental())
                && e.dtype == dtype
        })
    };
    let rel = match (rounded(DType::BF16), rounded(DType::F16)) {
        (true, _) => 2f64.powi(-6),
        (false, true) => 2f64.powi(-8),
        (false, false) => 1e-6,
    };
    // Specialised, and size-generic with every size read at run time.
    let generic_kernel = super::compile_generic(kernel, &crate::generic::generic_marks(kernel))
        .unwrap_or_else(|e| panic!("{e}\n{kernel}"));
    for (chunk, generic) in
        [(1, false), (3, false), (7, false), (1 << 20, false), (3, true), (1 << 20, true)]
    {
        let got = if generic {
            run_compiled(&generic_kernel, kernel, inputs, params, chunk)
        } else {
            run(kernel, inputs, params, chunk)
        };
        assert_eq!(got.len(), want.len(), "outputs (chunk {chunk})\n{kernel}");
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.len(), w.len(), "elements (chunk {chunk})\n{kernel}");
            for (i, (a, b)) in g.iter().zip(w).enumerate() {
                let ok =
                    (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= rel * b.abs().max(1.0);
                assert!(ok, "element {i}: got {a}, want {b} (chunk {chunk})\n{kernel}");
            }
        }
    }
}

fn values(n: usize, dtype: DType, seed: u64) -> Vec<f64> {
    (0..n as u64)
        .map(|i| {
            let u = kiln_ir::random::uniform(seed, i, 53);
            match dtype {
                DType::Bool => (u < 0.5) as u8 as f64,
                DType::U8 => (u * 200.0).floor(),
                DType::I8 => (u * 250.0 - 125.0).floor(),
                d if d.is_float() => u * 6.0 - 3.0,
                _ => (u * 60.0 - 30.0).floor(),
            }
        })
        .collect()
}

/// The single kernel of a graph built by `f` over one input of `shape` and `dtype`.
fn kernel_of(
    shape: &[usize],
    dtype: DType,
    f: impl Fn(&mut Graph, kiln_ir::NodeId) -> kiln_ir::NodeId,
) -> (Kernel, Vec<Scalar>) {
    let mut g = Graph::new();
    let x = g.input(Shape::from(shape), dtype);
    let y = f(&mut g, x);
    g.mark_output(y);
    let plan = crate::plan_steps(&g);
    match plan.as_slice() {
        [Step::Kernel(k)] => (k.kernel.clone(), k.params.clone()),
        other => panic!("expected one kernel, got {other:?}"),
    }
}

fn scalar(g: &mut Graph, v: f64, dtype: DType, shape: &[usize]) -> kiln_ir::NodeId {
    let c = g.leaf(Op::Full(Scalar::F64(v)), Shape::from(()), dtype).unwrap();
    g.push(Op::View(View::contiguous(Shape::from(())).expand(&Shape::from(shape))), &[c]).unwrap()
}

mod generic;

#[test]
fn elementwise_chains_on_every_dtype_and_size() {
    for dtype in DType::ALL {
        for n in [1usize, 3, 4, 17, 1023] {
            let (k, params) = kernel_of(&[n], dtype, |g, x| match dtype {
                DType::Bool => {
                    let y = g.push(Op::Unary(UnaryOp::Not), &[x]).unwrap();
                    g.push(Op::Binary(BinaryOp::Or), &[y, x]).unwrap()
                }
                d if d.is_float() => {
                    let c = scalar(g, 1.5, d, &[n]);
                    let a = g.push(Op::Binary(BinaryOp::Mul), &[x, c]).unwrap();
                    let t = g.push(Op::Unary(UnaryOp::Tanh), &[a]).unwrap();
                    let r = g.push(Op::Unary(UnaryOp::Relu), &[x]).unwrap();
                    let s = g.push(Op::Binary(BinaryOp::Add), &[t, r]).unwrap();
                    g.push(Op::Binary(BinaryOp::Div), &[s, c]).unwrap()
                }
                d => {
                    let c = scalar(g, 7.0, d, &[n]);
                    let a = g.push(Op::Binary(BinaryOp::Mul), &[x, c]).unwrap();
                    let r = g.push(Op::Unary(UnaryOp::Neg), &[a]).unwrap();
                    g.push(Op::Binary(BinaryOp::Maximum), &[r, x]).unwrap()
                }
            });
            check(&k, &[values(n, dtype, n as u64)], &params);
        }
    }
}

#[test]
fn vector_kernels_handle_broadcast_permuted_and_offset_views() {
    for dtype in [DType::F32, DType::F64] {
        // x: [5, 7] read transposed from a [7, 5] buffer; row: [7] broadcast; an offset slice.
        let mut g = Graph::new();
        let xt = g.input(Shape::from([7, 5]), dtype);
        let row = g.input(Shape::from([9]), dtype);
        let x = g
            .push(Op::View(View::contiguous(Shape::from([7, 5])).permute(&[1, 0])), &[xt])
            .unwrap();
        let r = g
            .push(
                Op::View(
                    View::contiguous(Shape::from([9])).narrow(0, 2, 7).expand(&Shape::from([5, 7])),
                ),
                &[row],
            )
            .unwrap();
        let s = g.push(Op::Binary(BinaryOp::Sub), &[x, r]).unwrap();
        let lt = g.push(Op::Binary(BinaryOp::Lt), &[x, r]).unwrap();
        let w = g.push(Op::Where, &[lt, s, x]).unwrap();
        g.mark_output(w);
        let plan = crate::plan_steps(&g);
        let [Step::Kernel(k)] = plan.as_slice() else { panic!("one kernel") };
        check(&k.kernel, &[values(35, dtype, 1), values(9, dtype, 2)], &k.params);
        // A contiguous one vectorizes.
        let (k2, p2) = kernel_of(&[4, 33], dtype, |g, x| {
            let a = g.push(Op::Unary(UnaryOp::Sqrt), &[x]).unwrap();
            let c = scalar(g, 0.5, dtype, &[4, 33]);
            g.push(Op::Binary(BinaryOp::Minimum), &[a, c]).unwrap()
        });
        assert!(compile(&k2).unwrap().vectorized(), "{k2}");
        check(&k2, &[values(132, dtype, 3)], &p2);
    }
}

#[test]
fn casts_between_all_dtypes() {
    for from in DType::ALL {
        for to in DType::ALL {
            let (k, p) = kernel_of(&[13], from, |g, x| g.push(Op::Cast(to), &[x]).unwrap());
            check(&k, &[values(13, from, 5)], &p);
        }
    }
}

#[test]
fn empty_and_scalar_domains() {
    let (k, p) = kernel_of(&[], DType::F32, |g, x| g.push(Op::Unary(UnaryOp::Exp), &[x]).unwrap());
    check(&k, &[vec![0.5]], &p);
    let (k, p) =
        kernel_of(&[0, 3], DType::F32, |g, x| g.push(Op::Unary(UnaryOp::Exp), &[x]).unwrap());
    check(&k, &[vec![]], &p);
    // Outputs over an empty reduced dimension: each is the identity (a sum of nothing; max
    // and min have none and are refused when recorded).
    let reduce = |op| Op::Reduce { op, axes: vec![1] };
    for op in [ReduceOp::Sum, ReduceOp::Prod] {
        let (k, p) = kernel_of(&[3, 0], DType::F32, |g, x| g.push(reduce(op), &[x]).unwrap());
        check(&k, &[vec![]], &p);
        let want = if op == ReduceOp::Sum { 0.0 } else { 1.0 };
        assert_eq!(run(&k, &[vec![]], &p, 1), vec![vec![want; 3]]);
    }
}

/// The distance in units in the last place between two finite f32 values of one sign.
fn ulps(a: f32, b: f32) -> u32 {
    if a == b {
        return 0;
    }
    let (x, y) = (a.to_bits() as i32, b.to_bits() as i32);
    if (x < 0) != (y < 0) {
        return u32::MAX;
    }
    x.abs_diff(y)
}

/// The largest ULP error of the vectorized `op` against f64 over `inputs`, checking that the
/// kernel is vectorized.
fn max_ulp(op: UnaryOp, inputs: &[f64], reference: fn(f64) -> f64) -> (u32, f64) {
    let n = inputs.len();
    let (k, p) = kernel_of(&[n], DType::F32, |g, x| g.push(Op::Unary(op), &[x]).unwrap());
    assert!(compile(&k).unwrap().vectorized(), "{} should vectorize", op.name());
    let got = run(&k, &[inputs.to_vec()], &p, 1 << 20).remove(0);
    let mut worst = (0, 0.0);
    for (&x, &g) in inputs.iter().zip(&got) {
        let want = reference(f64::from(x as f32)) as f32;
        let u = ulps(g as f32, want);
        if u > worst.0 {
            worst = (u, x);
        }
    }
    worst
}

fn sweep(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    (0..n).map(|i| f64::from((lo + (hi - lo) * i as f64 / (n - 1) as f64) as f32)).collect()
}

#[test]
fn vector_sin_cos_error_bounds() {
    // Dense near zero, across the first periods, over every binade up to the vector path's
    // limit and past it (where lanes go to the scalar functions), and the inputs closest to
    // multiples of π/2 that f32 has below 2^23 (the hardest cases for the reduction).
    let mut v = sweep(-10.0, 10.0, 400_003);
    v.extend((0..4000).map(|i| 2f64.powf(-140.0 + 170.0 * f64::from(i) / 4000.0)));
    v.extend((0..4000).map(|i| -(2f64.powf(-20.0 + 50.0 * f64::from(i) / 4000.0))));
    v.extend([16_367_173.0, 13_176_794.0, 8_388_607.0, 8_388_609.0, 1e30, -3e38]);
    for k in [1.0f64, 3.0, 71.0, 355.0, 6_588_397.0, 5_340_353.0] {
        let t = (k * std::f64::consts::FRAC_PI_2) as f32;
        for d in -3..=3i32 {
            v.push(f64::from(f32::from_bits((t.to_bits() as i32 + d) as u32)));
        }
    }
    let sin = max_ulp(UnaryOp::Sin, &v, f64::sin);
    assert!(sin.0 <= 2, "sin: {} ulp at {}", sin.0, sin.1);
    let cos = max_ulp(UnaryOp::Cos, &v, f64::cos);
    assert!(cos.0 <= 2, "cos: {} ulp at {}", cos.0, cos.1);
    for op in [UnaryOp::Sin, UnaryOp::Cos] {
        let (k, p) = kernel_of(&[7], DType::F32, |g, x| g.push(Op::Unary(op), &[x]).unwrap());
        let specials = vec![f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0, 1e-45, 3e38];
        let got = run(&k, std::slice::from_ref(&specials), &p, 1 << 20).remove(0);
        assert!(got[0].is_nan() && got[1].is_nan() && got[2].is_nan(), "{op:?}: {got:?}");
        let f = if op == UnaryOp::Sin { f64::sin } else { f64::cos };
        for i in 3..7 {
            let want = f(f64::from(specials[i] as f32)) as f32;
            assert_eq!(got[i] as f32, want, "{op:?}({})", specials[i]);
            assert_eq!((got[i] as f32).is_sign_negative(), want.is_sign_negative());
        }
    }
}

#[test]
fn vector_exp_tanh_sigmoid_error_bounds() {
    let exp = max_ulp(UnaryOp::Exp, &sweep(-86.9, 88.7, 400_003), f64::exp);
    assert!(exp.0 <= 2, "exp: {} ulp at {}", exp.0, exp.1);
    let mut t = sweep(-12.0, 12.0, 400_003);
    t.extend((0..200).map(|i| 10f64.powf(-30.0 + i as f64 * 0.15)));
    let tanh = max_ulp(UnaryOp::Tanh, &t, f64::tanh);
    assert!(tanh.0 <= 3, "tanh: {} ulp at {}", tanh.0, tanh.1);
    let sig = max_ulp(UnaryOp::Sigmoid, &sweep(-85.0, 40.0, 400_003), |x| 1.0 / (1.0 + (-x).exp()));
    assert!(sig.0 <= 4, "sigmoid: {} ulp at {}", sig.0, sig.1);
    let mut e = sweep(-12.0, 12.0, 400_003);
    e.extend((0..200).map(|i| 10f64.powf(-30.0 + i as f64 * 0.15)));
    let erf = max_ulp(UnaryOp::Erf, &e, kiln_ir::semantics::erf);
    assert!(erf.0 <= 2, "erf: {} ulp at {}", erf.0, erf.1);
    // log over every binade, subnormals included, and densely around 1.
    let mut l: Vec<f64> =
        (0..400_000).map(|i| 2f64.powf(-149.0 + 277.0 * f64::from(i) / 400_000.0)).collect();
    l.extend(sweep(0.5, 2.0, 200_003));
    l.retain(|&v| (v as f32) > 0.0 && (v as f32).is_finite());
    let log = max_ulp(UnaryOp::Log, &l, f64::ln);
    assert!(log.0 <= 1, "log: {} ulp at {}", log.0, log.1);
    let (k, p) = kernel_of(&[6], DType::F32, |g, x| g.push(Op::Unary(UnaryOp::Log), &[x]).unwrap());
    let got = run(&k, &[vec![f64::NAN, f64::INFINITY, 0.0, -0.0, -1.0, 1.0]], &p, 1 << 20);
    let got = &got[0];
    assert!(got[0].is_nan() && got[1] == f64::INFINITY && got[2] == f64::NEG_INFINITY);
    assert!(got[3] == f64::NEG_INFINITY && got[4].is_nan() && got[5] == 0.0, "{got:?}");
    let (k, p) = kernel_of(&[5], DType::F32, |g, x| g.push(Op::Unary(UnaryOp::Erf), &[x]).unwrap());
    let got = run(&k, &[vec![f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, 30.0]], &p, 1 << 20);
    let got = &got[0];
    assert!(got[0].is_nan() && got[1] == 1.0 && got[2] == -1.0 && got[3] == 0.0 && got[4] == 1.0);
    // Special values.
    let specials = vec![f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0, 89.0, -200.0];
    let (k, p) = kernel_of(&[specials.len()], DType::F32, |g, x| {
        g.push(Op::Unary(UnaryOp::Exp), &[x]).unwrap()
    });
    let e = run(&k, std::slice::from_ref(&specials), &p, 1 << 20).remove(0);
    assert!(
        e[0].is_nan()
            && e[1] == f64::INFINITY
            && e[3] == 1.0
            && e[4] == 1.0
            && e[5] == f64::INFINITY
    );
    // Below the normal range the result is 0: exactly 0 for -inf (masked softmax scores),
    // in the vector lanes and in the scalar tail alike.
    assert!(e[2] == 0.0 && e[6] == 0.0, "{e:?}");
    let (k, p) = kernel_of(&[specials.len()], DType::F32, |g, x| {
        g.push(Op::Unary(UnaryOp::Tanh), &[x]).unwrap()
    });
    let t = run(&k, std::slice::from_ref(&specials), &p, 1 << 20).remove(0);
    assert!(
        t[0].is_nan() && t[1] == 1.0 && t[2] == -1.0 && t[3] == 0.0 && t[5] == 1.0 && t[6] == -1.0
    );
    let (k, p) = kernel_of(&[specials.len()], DType::F32, |g, x| {
        g.push(Op::Unary(UnaryOp::Sigmoid), &[x]).unwrap()
    });
    let s = run(&k, &[specials], &p, 1 << 20).remove(0);
    assert!(s[0].is_nan() && s[1] == 1.0 && s[2] < 1e-37 && s[3] == 0.5);
}

#[test]
fn reduction_kernels_over_any_axes() {
    use kiln_ir::ReduceOp;
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::I32] {
        for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min] {
            for axes in [vec![0], vec![1], vec![2], vec![0, 2], vec![0, 1, 2]] {
                let shape = [3usize, 5, 9];
                let mut g = Graph::new();
                let x = g.input(Shape::from(shape), dtype);
                // An elementwise prologue: x * 0.5 (floats) or x + 1 (integers).
                let c = scalar(&mut g, if dtype.is_float() { 0.5 } else { 1.0 }, dtype, &shape);
                let p = g
                    .push(
                        Op::Binary(if dtype.is_float() { BinaryOp::Mul } else { BinaryOp::Add }),
                        &[x, c],
                    )
                    .unwrap();
                let r = g.push(Op::Reduce { op, axes: axes.clone() }, &[p]).unwrap();
                g.mark_output(r);
                let plan = crate::plan_steps(&g);
                let [Step::Kernel(k)] = plan.as_slice() else { panic!("one reduction kernel") };
                let data: Vec<f64> = values(135, dtype, 9)
                    .iter()
                    .map(|v| if dtype.is_float() { v / 2.0 } else { v % 4.0 })
                    .collect();
                let want = interpret(&k.kernel, std::slice::from_ref(&data), &k.params);
                let generic =
                    super::compile_generic(&k.kernel, &crate::generic::generic_marks(&k.kernel))
                        .expect("compiles");
                let got = run(&k.kernel, std::slice::from_ref(&data), &k.params, 2);
                let got_generic = run_compiled(&generic, &k.kernel, &[data], &k.params, 2);
                for (a, b) in got[0].iter().chain(&got_generic[0]).zip(want[0].iter().cycle()) {
                    // Products rounded from f64 in another order may differ in the last place.
                    let tol = match dtype {
                        DType::F16 => 2e-3,
                        DType::BF16 => 8e-3,
                        _ => 1e-6,
                    };
                    assert!(
                        (a - b).abs() <= tol * b.abs().max(1.0),
                        "{op:?} {dtype} {axes:?}: {a} vs {b}\n{}",
                        k.kernel
                    );
                }
            }
        }
    }
}

#[test]
fn vector_pow_error_bound_and_special_cases() {
    let mut xs = Vec::new();
    let mut ys = Vec::new();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng >> 11) as f64 / (1u64 << 53) as f64
    };
    // Positive bases over every binade with exponents whose results stay in range or leave
    // it; negative bases with integral exponents; bases near 1 with large exponents.
    for _ in 0..200_000 {
        let b = 2f64.powf(-149.0 + 276.0 * next());
        let e = (next() - 0.5) * 8.0;
        xs.push(b);
        ys.push(e);
        xs.push(-(0.25 + 8.0 * next()));
        ys.push((next() * 40.0 - 20.0).round());
        xs.push(1.0 + (next() - 0.5) * 1e-3);
        ys.push((next() - 0.5) * 1e5);
    }
    let specials =
        [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, f64::INFINITY, f64::NEG_INFINITY, f64::NAN];
    for &a in &specials {
        for &b in &specials {
            xs.push(a);
            ys.push(b);
        }
        xs.push(a);
        ys.push(3.0);
        xs.push(-3.0);
        ys.push(a);
    }
    let n = xs.len();
    let mut g = Graph::new();
    let x = g.input(Shape::from([n]), DType::F32);
    let y = g.input(Shape::from([n]), DType::F32);
    let p = g.push(Op::Binary(BinaryOp::Pow), &[x, y]).unwrap();
    g.mark_output(p);
    let plan = crate::plan_steps(&g);
    let [Step::Kernel(k)] = plan.as_slice() else { panic!("one kernel") };
    assert!(compile(&k.kernel).unwrap().vectorized(), "pow should vectorize");
    let got = run(&k.kernel, &[xs.clone(), ys.clone()], &k.params, 1 << 20).remove(0);
    let mut worst = (0, 0.0, 0.0);
    for ((&a, &b), &r) in xs.iter().zip(&ys).zip(&got) {
        let want = (f64::from(a as f32)).powf(f64::from(b as f32)) as f32;
        let r = r as f32;
        if want.is_nan() || r.is_nan() {
            assert!(want.is_nan() && r.is_nan(), "pow({a}, {b}) = {r}, want {want}");
            continue;
        }
        assert_eq!(r.is_sign_negative(), want.is_sign_negative(), "pow({a}, {b}) = {r}");
        let u = ulps(r, want);
        if u > worst.0 {
            worst = (u, a, b);
        }
    }
    assert!(worst.0 <= 1, "pow: {} ulp at ({}, {})", worst.0, worst.1, worst.2);
}

#[test]
fn reductions_vectorized_across_outputs() {
    use kiln_ir::ReduceOp;
    // Sums over rows: more outputs than a block (600 = 256 + 256 + 88), odd row runs (a
    // middle axis of [4, 7, 13]), a transposed input (the kept axis is then strided, so the
    // row path runs instead), an input broadcast across the outputs, and NaN.
    for dtype in [DType::F32, DType::F64, DType::BF16] {
        for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min] {
            for (shape, axes) in [
                (vec![3usize, 600], vec![0usize]),
                (vec![4, 7, 13], vec![1]),
                (vec![5, 2, 9], vec![0, 1]),
                (vec![1, 9], vec![0]),
            ] {
                let n: usize = shape.iter().product();
                let mut g = Graph::new();
                let x = g.input(Shape::from(shape.clone()), dtype);
                let col_shape: Vec<usize> = shape
                    .iter()
                    .enumerate()
                    .map(|(d, &s)| if axes.contains(&d) { s } else { 1 })
                    .collect();
                let col = g.input(Shape::from(col_shape.clone()), dtype);
                let colv = g
                    .push(
                        Op::View(
                            View::contiguous(Shape::from(col_shape.clone()))
                                .expand(&Shape::from(shape.clone())),
                        ),
                        &[col],
                    )
                    .unwrap();
                let p = g.push(Op::Binary(BinaryOp::Mul), &[x, colv]).unwrap();
                let r = g.push(Op::Reduce { op, axes: axes.clone() }, &[p]).unwrap();
                g.mark_output(r);
                let plan = crate::plan_steps(&g);
                let [Step::Kernel(k)] = plan.as_slice() else { panic!("one kernel") };
                let compiled = compile(&k.kernel).unwrap();
                assert!(compiled.vectorized(), "{op:?} {shape:?} {axes:?}\n{}", k.kernel);
                let mut data: Vec<f64> =
                    values(n, dtype, 3).iter().map(|v| 1.0 + v / 64.0).collect();
                if op == ReduceOp::Max {
                    data[n / 2] = f64::NAN;
                }
                let cols = values(col_shape.iter().product(), dtype, 4)
                    .iter()
                    .map(|v| 1.0 + v / 64.0)
                    .collect();
                check(&k.kernel, &[data, cols], &k.params);
            }
        }
    }
}

#[test]
fn transposed_reads_walk_in_strips() {
    // y = xᵀ * 2 + row over [37, 203] (rows longer than a strip, and not a multiple of it),
    // with x read transposed out of an offset slice of a larger buffer, and a 3-D case whose
    // middle dimension is the transposed one; every chunking of the range, dtypes of both
    // widths.
    for dtype in [DType::F32, DType::F64, DType::I32] {
        let mut g = Graph::new();
        let buf = g.input(Shape::from([205, 37]), dtype);
        let row = g.input(Shape::from([203]), dtype);
        let x = g
            .push(
                Op::View(
                    View::contiguous(Shape::from([205, 37])).narrow(0, 2, 203).permute(&[1, 0]),
                ),
                &[buf],
            )
            .unwrap();
        let r = g
            .push(
                Op::View(View::contiguous(Shape::from([203])).expand(&Shape::from([37, 203]))),
                &[row],
            )
            .unwrap();
        let two = scalar(&mut g, 2.0, dtype, &[37, 203]);
        let m = g.push(Op::Binary(BinaryOp::Mul), &[x, two]).unwrap();
        let y = g.push(Op::Binary(BinaryOp::Add), &[m, r]).unwrap();
        g.mark_output(y);
        let plan = crate::plan_steps(&g);
        let [Step::Kernel(k)] = plan.as_slice() else { panic!("one kernel") };
        assert!(
            super::strategy::strip_width(&k.kernel, &crate::walk::coalesce(&k.kernel, 0..2))
                .is_some()
        );
        check(&k.kernel, &[values(205 * 37, dtype, 5), values(203, dtype, 6)], &k.params);

        let (k3, p3) = kernel_of(&[3, 70, 90], dtype, |g, x| {
            let t = g
                .push(
                    Op::View(View::contiguous(Shape::from([3, 70, 90])).permute(&[0, 2, 1])),
                    &[x],
                )
                .unwrap();
            g.push(Op::Unary(UnaryOp::Neg), &[t]).unwrap()
        });
        assert!(
            super::strategy::strip_width(&k3, &crate::walk::coalesce(&k3, 0..3)).is_some(),
            "{k3}"
        );
        check(&k3, &[values(3 * 70 * 90, dtype, 7)], &p3);
    }
}

/// The multiply-high division that row addressing uses is exact for every divisor kind
/// (powers of two aside: those are shifts) over the whole index range it is used on.
#[test]
fn division_by_a_constant_is_exact_below_2_pow_48() {
    let limit = 1u64 << 48;
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut divisors: Vec<u64> = (2..2000).filter(|d: &u64| !d.is_power_of_two()).collect();
    divisors.extend([3 * 3 * 16 * 16, 18_496, 1_000_003, (1 << 31) - 1, (1 << 40) + 7, limit - 1]);
    divisors.extend((0..200).map(|_| next() % limit).filter(|d| *d > 2 && !d.is_power_of_two()));
    for d in divisors {
        let (m, k) = super::sizes::div_magic(d);
        let mut xs = vec![
            0,
            1,
            d - 1,
            d,
            d + 1,
            limit - 1,
            limit - 1 - (limit - 1) % d,
            (limit - 1) / d * d - 1,
        ];
        xs.extend((0..200).map(|_| next() % limit));
        for x in xs {
            let q = ((u128::from(x) * u128::from(m)) >> k) as u64;
            assert_eq!(q, x / d, "{x} / {d}");
        }
    }
}

/// The same values laid out as one long row (staged: computed a block at a time by the wide
/// batch functions on hosts that have them) and as rows of 8 (inline polynomials).
fn staged_and_inline(op: UnaryOp, inputs: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let n = inputs.len();
    assert_eq!(n % 8, 0);
    let f = |g: &mut Graph, x| {
        let y = g.push(Op::Unary(op), &[x]).unwrap();
        g.push(Op::Binary(BinaryOp::Mul), &[y, x]).unwrap()
    };
    let (long, p) = kernel_of(&[n], DType::F32, f);
    let (short, q) = kernel_of(&[n / 8, 8], DType::F32, f);
    (
        run(&long, &[inputs.to_vec()], &p, 1 << 20).remove(0),
        run(&short, &[inputs.to_vec()], &q, 1 << 20).remove(0),
    )
}

#[test]
fn staged_transcendentals_equal_the_inline_polynomials_bit_for_bit() {
    let mut v = sweep(-100.0, 100.0, 200_000);
    v.extend([0.0, -0.0, 1e-30, -1e-30, 88.72, 88.74, -87.5, -88.5]);
    v.extend([f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 0.625, -0.625, 10.0, -10.0, 20.0]);
    for op in [UnaryOp::Exp, UnaryOp::Tanh, UnaryOp::Sigmoid] {
        let (staged, inline) = staged_and_inline(op, &v);
        for (i, (a, b)) in staged.iter().zip(&inline).enumerate() {
            let same = (a.is_nan() && b.is_nan()) || (*a as f32).to_bits() == (*b as f32).to_bits();
            assert!(same, "{}({}): staged {a}, inline {b}", op.name(), v[i]);
        }
        // Pieces of 1, 3 and 7 positions start blocks anywhere in the row.
        let (k, p) = kernel_of(&[5000], DType::F32, |g, x| g.push(Op::Unary(op), &[x]).unwrap());
        check(&k, &[values(5000, DType::F32, 5)], &p);
    }
}

#[test]
fn staged_row_reductions_match_the_reference() {
    // Rows of 1,000 (a block and a part, an odd vector at the end, a scalar tail) and of
    // 4,099: a sum and a max of exp(x - 1). (A softmax's kernel, which also stores exp(x - m),
    // is checked in the crate's tests.)
    for len in [1000usize, 4099] {
        let shape = [3, len];
        for op in [ReduceOp::Sum, ReduceOp::Max] {
            let (k, p) = kernel_of(&shape, DType::F32, |g, x| {
                let one = scalar(g, 1.0, DType::F32, &shape);
                let d = g.push(Op::Binary(BinaryOp::Sub), &[x, one]).unwrap();
                let e = g.push(Op::Unary(UnaryOp::Exp), &[d]).unwrap();
                g.push(Op::Reduce { op, axes: vec![1] }, &[e]).unwrap()
            });
            check(&k, &[values(3 * len, DType::F32, 11)], &p);
        }
    }
}

/// Whether a kernel's CLIF calls the function of signature `(i64, f32, i64, i64) -> f64`
/// (`kiln_exp_sum_f32s`; the text names functions by number).
fn calls_exp_sum_rows(clif: &str) -> bool {
    let decl = |line: &str, suffix: &str| {
        let (name, rest) = line.trim().split_once(" = ")?;
        rest.ends_with(suffix).then(|| name.to_string())
    };
    let Some(sig) = clif.lines().find_map(|l| decl(l, "(i64, f32, i64, i64) -> f64 system_v"))
    else {
        return false;
    };
    let sig = format!(" {sig}");
    clif.lines().filter_map(|l| decl(l, &sig)).any(|f| clif.contains(&format!("call {f}(")))
}

/// Row sums of `exp(x - s)` go to the wide row function whole (on hosts with wide vectors):
/// no shift, a constant, a per-row input broadcast along the row, and several rows per
/// output (a sliced input); each against the interpreter, on rows with a scalar tail.
#[test]
fn exponential_row_sums_run_as_one_call_per_row() {
    let wide = super::wide::lanes().is_some();
    let uses_row_function = |k: &Kernel| calls_exp_sum_rows(compile(k).unwrap().clif());
    for len in [64usize, 1000, 4099] {
        let shape = [3, len];
        let sum = |g: &mut Graph, e| g.push(Op::Reduce { op: ReduceOp::Sum, axes: vec![1] }, &[e]);
        let (plain, p) = kernel_of(&shape, DType::F32, |g, x| {
            let e = g.push(Op::Unary(UnaryOp::Exp), &[x]).unwrap();
            sum(g, e).unwrap()
        });
        check(&plain, &[values(3 * len, DType::F32, 21)], &p);
        assert_eq!(uses_row_function(&plain), wide, "{plain}");

        // x - m[row], m a second input.
        let mut g = Graph::new();
        let x = g.input(Shape::from(shape), DType::F32);
        let m = g.input(Shape::from([3, 1]), DType::F32);
        let mv = View::contiguous(Shape::from([3, 1])).expand(&Shape::from(shape));
        let m = g.push(Op::View(mv), &[m]).unwrap();
        let d = g.push(Op::Binary(BinaryOp::Sub), &[x, m]).unwrap();
        let e = g.push(Op::Unary(UnaryOp::Exp), &[d]).unwrap();
        let s = sum(&mut g, e).unwrap();
        g.mark_output(s);
        let steps = crate::plan_steps(&g);
        let [Step::Kernel(k)] = steps.as_slice() else { panic!("one kernel: {steps:?}") };
        check(&k.kernel, &[values(3 * len, DType::F32, 22), vec![0.5, -1.0, 2.0]], &k.params);
        assert_eq!(uses_row_function(&k.kernel), wide, "{}", k.kernel);
    }
    // Three rows of 700 per output, out of rows of 800: the sums add row by row.
    let (k, p) = kernel_of(&[2, 3, 800], DType::F32, |g, x| {
        let v = View::contiguous(Shape::from([2, 3, 800])).narrow(2, 50, 700);
        let x = g.push(Op::View(v), &[x]).unwrap();
        let e = g.push(Op::Unary(UnaryOp::Exp), &[x]).unwrap();
        g.push(Op::Reduce { op: ReduceOp::Sum, axes: vec![1, 2] }, &[e]).unwrap()
    });
    check(&k, &[values(2 * 3 * 800, DType::F32, 23)], &p);
    assert_eq!(uses_row_function(&k), wide, "{k}");
    // Strided rows keep the vector loop.
    let (k, p) = kernel_of(&[200, 3], DType::F32, |g, x| {
        let v = View::contiguous(Shape::from([200, 3])).permute(&[1, 0]);
        let x = g.push(Op::View(v), &[x]).unwrap();
        let e = g.push(Op::Unary(UnaryOp::Exp), &[x]).unwrap();
        g.push(Op::Reduce { op: ReduceOp::Sum, axes: vec![1] }, &[e]).unwrap()
    });
    check(&k, &[values(600, DType::F32, 24)], &p);
    assert!(!uses_row_function(&k), "{k}");
}

/// Kernels mixing a 16-bit float with f32 (an autocast step's casts, 16-bit arithmetic and
/// copies) run on f32 vectors and round every 16-bit result as the reference does, bit for
/// bit: ties to even, overflow to infinity, NaN, infinities, zeros of both signs,
/// subnormals; contiguous, broadcast and transposed 16-bit reads, both output dtypes, odd
/// lengths.
#[test]
fn half_precision_kernels_run_on_vectors_and_round_like_the_reference() {
    let ties = |bits: i32| {
        let step = 2f64.powi(-bits);
        [1.0 + step / 2.0, 1.0 + 1.5 * step, -(1.0 + 1.5 * step)]
    };
    for (dtype, mantissa) in [(DType::BF16, 7), (DType::F16, 10)] {
        let mut specials = ties(mantissa).to_vec();
        specials.extend([
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -0.0,
            1e-40,
            f64::from(f32::MAX),
            3.3895e38,            // rounds up past bf16's largest finite value
            65519.0,              // f16: down to 65504
            65520.0,              // f16: a tie between 65504 and infinity, to infinity
            2f64.powi(-25),       // f16: a tie between zero and the smallest subnormal
            3.0 * 2f64.powi(-25), // f16: a tie, up to the even subnormal
            -1e-6,                // f16: subnormal
            6.1e-5,               // f16: just below the smallest normal
        ]);
        half_precision_kernel(dtype, &specials);
    }
}

fn half_precision_kernel(dtype: DType, specials: &[f64]) {
    for n in [1usize, 4, 5, 17, 203] {
        let mut g = Graph::new();
        let xt = g.input(Shape::from([n, 3]), dtype);
        let y = g.input(Shape::from([3, n]), DType::F32);
        let row = g.input(Shape::from([n]), dtype);
        let x = g.push(Op::View(View::contiguous(Shape::from([n, 3])).permute(&[1, 0])), &[xt]);
        let r = g.push(
            Op::View(View::contiguous(Shape::from([n])).expand(&Shape::from([3, n]))),
            &[row],
        );
        let (x, r) = (x.unwrap(), r.unwrap());
        let a = g.push(Op::Cast(dtype), &[y]).unwrap();
        let s = g.push(Op::Binary(BinaryOp::Add), &[a, r]).unwrap();
        let c = scalar(&mut g, 1.7, dtype, &[3, n]);
        let m = g.push(Op::Binary(BinaryOp::Mul), &[s, c]).unwrap();
        let m = g.push(Op::Binary(BinaryOp::Sub), &[m, x]).unwrap();
        let wide = g.push(Op::Cast(DType::F32), &[m]).unwrap();
        let d = g.push(Op::Binary(BinaryOp::Sub), &[wide, y]).unwrap();
        g.mark_output(m);
        g.mark_output(d);
        g.mark_output(a);
        let plan = crate::plan_steps(&g);
        let [Step::Kernel(k)] = plan.as_slice() else { panic!("one kernel: {plan:?}") };
        assert!(compile(&k.kernel).unwrap().vectorized(), "{}", k.kernel);
        let mut ys = values(3 * n, DType::F32, 11);
        for (slot, v) in ys.iter_mut().zip(specials.iter().cycle()).step_by(2) {
            *slot = *v;
        }
        let by_node = [(xt, values(3 * n, dtype, 12)), (y, ys), (row, values(n, dtype, 13))];
        let ordered: Vec<Vec<f64>> = k
            .inputs
            .iter()
            .map(|id| by_node.iter().find(|(node, _)| node == id).expect("a graph input").1.clone())
            .collect();
        check(&k.kernel, &ordered, &k.params);
        // Bit for bit (`check`'s tolerance would pass a subnormal's wrong rounding).
        let want = interpret(&k.kernel, &ordered, &k.params);
        for chunk in [7, 1 << 20] {
            let got = run(&k.kernel, &ordered, &k.params, chunk);
            for (o, (g, w)) in got.iter().zip(&want).enumerate() {
                for (i, (a, b)) in g.iter().zip(w).enumerate() {
                    assert!(
                        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                        "{dtype} output {o} element {i}: got {a:e}, want {b:e} (chunk {chunk})"
                    );
                }
            }
        }
    }
}

/// A staged kernel over rows that are not whole blocks or whole vectors, with a broadcast
/// input, a parameter and outputs of two dtypes (one of them bf16): the values the
/// reference gives, and the same bits however the range is cut into pieces (pieces start
/// blocks in the middle of rows).
#[test]
fn staged_rows_with_tails_and_several_outputs() {
    let (rows, cols) = (5usize, 1301usize);
    let mut g = Graph::new();
    let x = g.input(Shape::from([rows, cols]), DType::F32);
    let bias = g.input(Shape::from([cols]), DType::F32);
    let b = g
        .push(
            Op::View(View::contiguous(Shape::from([cols])).expand(&Shape::from([rows, cols]))),
            &[bias],
        )
        .unwrap();
    let h = g.push(Op::Binary(BinaryOp::Add), &[x, b]).unwrap();
    let c = scalar(&mut g, 1.5, DType::F32, &[rows, cols]);
    let a = g.push(Op::Binary(BinaryOp::Mul), &[h, c]).unwrap();
    let s = g.push(Op::Unary(UnaryOp::Sigmoid), &[a]).unwrap();
    let z = g.push(Op::Cast(DType::BF16), &[h]).unwrap();
    let zf = g.push(Op::Cast(DType::F32), &[z]).unwrap();
    let y = g.push(Op::Binary(BinaryOp::Mul), &[zf, s]).unwrap();
    for out in [y, z] {
        g.mark_output(out);
    }
    let plan = crate::plan_steps(&g);
    let [Step::Kernel(k)] = plan.as_slice() else { panic!("one kernel: {plan:?}") };
    assert_eq!(k.kernel.outputs.len(), 2, "{}", k.kernel);
    let lanes = Some((DType::F32, cranelift_codegen::ir::types::F32X4));
    assert!(
        !super::staging::staged_ops(
            &k.kernel,
            lanes,
            cols >= super::staging::MIN_ROW,
            super::CpuFeatures::X86_64_V3
        )
        .is_empty()
    );
    let by_node = [(x, values(rows * cols, DType::F32, 21)), (bias, values(cols, DType::F32, 22))];
    let inputs: Vec<Vec<f64>> = k
        .inputs
        .iter()
        .map(|id| by_node.iter().find(|(node, _)| node == id).expect("a graph input").1.clone())
        .collect();
    check(&k.kernel, &inputs, &k.params);
    let whole = run(&k.kernel, &inputs, &k.params, 1 << 20);
    for chunk in [600, 1000, 2603] {
        let pieces = run(&k.kernel, &inputs, &k.params, chunk);
        for (o, (p, w)) in pieces.iter().zip(&whole).enumerate() {
            let same = p.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "output {o} differs in pieces of {chunk}");
        }
    }
}
