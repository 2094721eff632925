//! Fusion: kernel counts, and differential tests of random programs — fused, unfused (one
//! kernel per op) and the reference executor must agree.

use kiln::Execution;
use kiln::debug::{RowGroupSizes, with_row_group_sizes};
use kiln::nn::functional as F;
use kiln::prelude::*;

use crate::common::*;
use crate::programs::*;

/// A program's values, run in `mode`: its result, and (when the result is floating point
/// and depends on the first input) the gradient of the result's sum with respect to that
/// input, through backward's own generated kernels.
struct Run {
    shape: Vec<usize>,
    dtype: DType,
    values: Vec<f64>,
    gradient: Option<Vec<f64>>,
    /// How many derivatives `gradient` holds: 1, or 2 with a double backward.
    orders: usize,
    precision: (Precision, Precision),
    coarsest: DType,
}

/// A program's result and (as [`run`] computes it) gradient, as a compiled function
/// returns them.
fn compiled_program(source: &Source) -> Vec<Tensor> {
    let p = program_full(source, Device::Cpu, true);
    let derivatives = derivatives(&p);
    std::iter::once(p.y).chain(derivatives).collect()
}

/// The gradient of a program's sum with respect to its first input, and the gradient of that
/// gradient's sum (double backward) where it depends on the input: none when the result is
/// not floating point or does not depend on the input ([`kiln::Error::NoGradient`]). Any
/// other error (a refused in-place write, a rule that records an invalid op) fails the
/// program: read as "no gradient", every mode would agree on it and it would pass.
fn derivatives(p: &Program) -> Vec<Tensor> {
    if !(p.y.dtype().is_float() && p.input.requires_grad()) {
        return Vec::new();
    }
    let Some(first) = gradient_if_any(kiln::try_grad(&[&p.y.sum()], &[&p.input], true)) else {
        return Vec::new();
    };
    let second = gradient_if_any(kiln::try_grad(&[&first[0].sum()], &[&p.input], false));
    first.into_iter().chain(second.into_iter().flatten()).collect()
}

/// The gradients, or `None` where there are none to take.
///
/// # Panics
/// On any error but [`kiln::Error::NoGradient`].
fn gradient_if_any(result: kiln::Result<Vec<Tensor>>) -> Option<Vec<Tensor>> {
    match result {
        Ok(g) => Some(g),
        Err(kiln::Error::NoGradient { .. }) => None,
        Err(e) => panic!("autograd failed on a program that has a gradient to take: {e}"),
    }
}

fn run(source: &Source, mode: Execution) -> Run {
    kiln::with_execution(mode, || {
        let p = program_full(source, Device::Cpu, true);
        let derivatives = derivatives(&p);
        let gradient = (!derivatives.is_empty())
            .then(|| derivatives.iter().flat_map(|g| g.to_vec::<f64>()).collect());
        Run {
            shape: p.y.dims().to_vec(),
            dtype: p.y.dtype(),
            values: p.y.to_vec::<f64>(),
            gradient,
            orders: derivatives.len(),
            precision: (p.values, p.gradients),
            coarsest: p.coarsest,
        }
    })
}

/// The tolerances for a program's result of `dtype`: between generated modes, and against
/// the reference (`None`: not comparable, see [`Precision::Discontinuous`]).
pub(crate) fn tolerances(dtype: DType, precision: Precision) -> (f64, Option<f64>) {
    // The generated code computes what the reference computes, up to the double rounding
    // of 16-bit floats (through f32) and the few ULP of the f32 polynomials.
    let floor = if precision == Precision::Exact { 1e-12 } else { tolerance(DType::F32) };
    let tight = 4.0 * tolerance(dtype).max(floor);
    match precision {
        Precision::Exact => (tight, Some(tight)),
        Precision::Approximated => (tight, Some(tight.max(1e-2))),
        Precision::Discontinuous => (tight, None),
    }
}

/// What one program exercised.
#[derive(Default)]
struct Exercised {
    gradient: bool,
    second: bool,
    replays: usize,
    /// Whether its gradient was checked against finite differences.
    differenced: bool,
    /// Whether a size-generic kernel ran in its compiled calls at other sizes.
    generic: bool,
}

/// The gradient of a program's sum with respect to its first input by central differences
/// on the reference executor, compared with the gradient autograd gives there. The program
/// runs with its `.float()` calls keeping f64 values f64 ([`with_f64_floats`]), so that from
/// a small f64 input it can stay f64 throughout, where differences are a fair oracle. Each
/// input value moves by ±h through the program's choices (its data), and the program is
/// built again. Says whether the program qualified.
fn check_finite_differences(source: &Source) -> bool {
    let reference = with_f64_floats(|| run(source, Execution::Reference));
    let Some(gradient) = &reference.gradient else { return false };
    if reference.coarsest != DType::F64 {
        return false;
    }
    let choices = with_f64_floats(|| choices_of(source));
    // The first input's values are the first data the program chose.
    let Some(at) = choices.iter().position(|c| matches!(c, Choice::Data(_))) else { return false };
    let Choice::Data(data) = &choices[at] else { return false };
    if data.is_empty() || data.len() > 16 {
        return false;
    }
    let sum_at = |d: Vec<f64>| {
        let mut c = choices.clone();
        c[at] = Choice::Data(d);
        kiln::with_execution(Execution::Reference, || {
            with_f64_floats(|| program_full(&Source::Replay(c), Device::Cpu, true).y.sum())
                .double()
                .item::<f64>()
        })
    };
    // Central differences where the program is smooth around the input; near a kink (a
    // relu at zero, a clamp's bound) the derivative autograd gives (PyTorch's convention:
    // one side, or 0) lies between the one-sided differences, which is all that is asked
    // there (seed 50968: relu of exactly 0).
    let h = 1e-6;
    let at_input = sum_at(data.clone());
    for i in 0..data.len() {
        let (mut up, mut down) = (data.clone(), data.clone());
        up[i] += h;
        down[i] -= h;
        let (above, below) = (sum_at(up), sum_at(down));
        let central = (above - below) / (2.0 * h);
        let (right, left) = ((above - at_input) / h, (at_input - below) / h);
        let tol = 1e-5 * central.abs().max(1.0);
        let g = gradient[i];
        let between = g >= left.min(right) - tol && g <= left.max(right) + tol;
        assert!(
            (g - central).abs() <= tol || between,
            "gradient vs finite differences: element {i}: got {g}, want {central} \
             (one-sided: {left} and {right}; tolerance {tol})"
        );
    }
    true
}

/// Runs a program fused, unfused, in row groups, on the reference executor and as a
/// `compile()`d function, and panics where any two disagree.
fn check_program(source: &Source) -> Exercised {
    let reference = run(source, Execution::Reference);
    let (tight, loose) = tolerances(reference.dtype, reference.precision.0);
    let (g_tight, g_loose) = tolerances(reference.coarsest, reference.precision.1);
    let mut fused: Option<Run> = None;
    for (mode, grouped) in
        [(Execution::Fused, false), (Execution::Unfused, false), (Execution::Fused, true)]
    {
        // Row groups of a row per tile, however small the program.
        let sizes = if grouped {
            RowGroupSizes { min_positions: 1, tile_positions: 1 }
        } else {
            RowGroupSizes::default()
        };
        let got = with_row_group_sizes(sizes, || run(source, mode));
        let mode = format!("{mode:?}{}", if grouped { " in row groups" } else { "" });
        let what = |part: &str| format!("{mode} {part}");
        assert_eq!((&got.shape, got.dtype), (&reference.shape, reference.dtype), "{}", what(""));
        assert_eq!(got.gradient.is_some(), reference.gradient.is_some(), "{}", what("gradient"));
        if let Some(loose) = loose {
            assert_close_tol(&got.values, &reference.values, loose, &what("values"));
        }
        if let (Some(g), Some(r), Some(loose)) = (&got.gradient, &reference.gradient, g_loose) {
            assert_close_tol(g, r, loose, &what("gradient"));
        }
        match &fused {
            None => fused = Some(got),
            Some(f) => {
                assert_close_tol(&got.values, &f.values, tight, &what("values vs fused"));
                if let (Some(g), Some(h)) = (&got.gradient, &f.gradient) {
                    assert_close_tol(g, h, g_tight, &what("gradient vs fused"));
                }
            }
        }
    }
    // The same program as a `compile()`d function: planned on the first call, replayed on
    // the next two, each agreeing with the eager fused run. A compiled step fuses forward
    // and backward into other kernels than the eager run, whose f32 polynomials may take
    // the vector or the scalar path: approximated programs are held to 1% there (seed
    // 11745: seven transcendentals, two products, a second derivative).
    let fused = fused.expect("the fused run");
    let between = |tight: f64, loose: Option<f64>, precision: Precision| match precision {
        Precision::Exact => Some(tight),
        Precision::Approximated => loose,
        Precision::Discontinuous => None,
    };
    let c_tol = between(tight, loose, reference.precision.0);
    let c_g_tol = between(g_tight, g_loose, reference.precision.1);
    // The program the compiled function builds: `source`, then the same at other sizes.
    let current = std::cell::RefCell::new(source.clone());
    let mut compiled = kiln::compile(|(): ()| compiled_program(&current.borrow()));
    for call in 0..3 {
        let out: Vec<Tensor> = compiled.call(());
        let what = |part: &str| format!("compiled call {call} {part}");
        if let Some(tol) = c_tol {
            assert_close_tol(&out[0].to_vec::<f64>(), &fused.values, tol, &what("values"));
        }
        let gradient: Vec<f64> = out[1..].iter().flat_map(|g| g.to_vec::<f64>()).collect();
        assert_eq!(out.len() > 1, fused.gradient.is_some(), "{}", what("gradient"));
        if let (Some(h), Some(tol)) = (&fused.gradient, c_g_tol) {
            assert_close_tol(&gradient, h, tol, &what("gradient"));
        }
    }
    // (A program whose result is an input seen through a view computes nothing: no plan.)
    let stats = compiled.stats();
    assert!(stats.plans <= 1, "replayed, not planned again: {stats:?}");
    let replays = stats.replays as usize;
    // The same program at two other sizes (its dimensions of 2, 3, 5 and 7 resized): eager
    // fused and unfused runs agree, and so does the compiled function called at those
    // sizes, which plans once for each and compiles its kernels whose sizes changed
    // size-generic (the second size is served by the first's generic kernels).
    // Under `KILN_CHECK`, an approximated program's kernels are held to 1% of the reference
    // at these sizes, as this test holds the program: new data can put a few-ULP difference
    // of f32 polynomials into a cancellation (the kept regression of seed 11745 at 8x9x9
    // is 1.07e-5 off in one of 648 elements, whatever its kernels' sizes).
    let approximated = reference.precision != (Precision::Exact, Precision::Exact);
    let choices = choices_of(source);
    let mut generic = 0;
    for sizes in OTHER_SIZES {
        let resized = Source::Resized(choices.clone(), sizes);
        let (fused, unfused) = loosened_check(approximated, || {
            (run(&resized, Execution::Fused), run(&resized, Execution::Unfused))
        });
        let (tight, _) = tolerances(fused.dtype, fused.precision.0);
        let (g_tight, _) = tolerances(fused.coarsest, fused.precision.1);
        let what = |part: &str| format!("at sizes {sizes:?}: {part}");
        assert_eq!((&unfused.shape, unfused.dtype), (&fused.shape, fused.dtype), "{}", what(""));
        assert_close_tol(&unfused.values, &fused.values, tight, &what("unfused values"));
        if let (Some(g), Some(h)) = (&unfused.gradient, &fused.gradient) {
            assert_close_tol(g, h, g_tight, &what("unfused gradient"));
        }
        *current.borrow_mut() = resized;
        let (out, profile) = loosened_check(approximated, || kiln::profile(|| compiled.call(())));
        generic += profile.kernels().iter().filter(|k| k.generic).count();
        if let Some(tol) = between(tight, Some(tight.max(1e-2)), fused.precision.0) {
            assert_close_tol(&out[0].to_vec::<f64>(), &fused.values, tol, &what("compiled"));
        }
        let gradient: Vec<f64> = out[1..].iter().flat_map(|g| g.to_vec::<f64>()).collect();
        if let (Some(h), Some(tol)) =
            (&fused.gradient, between(g_tight, Some(g_tight.max(1e-2)), fused.precision.1))
        {
            assert_close_tol(&gradient, h, tol, &what("compiled gradient"));
        }
    }
    Exercised {
        gradient: reference.gradient.is_some(),
        second: reference.orders == 2,
        replays,
        differenced: check_finite_differences(source),
        generic: generic > 0,
    }
}

/// `f`, with the oracle's tolerances (when `KILN_CHECK` has it on) multiplied by 1000 where
/// `loosen` says so.
fn loosened_check<T>(loosen: bool, f: impl FnOnce() -> T) -> T {
    if loosen && kiln_ir::settings::Setting::Check.on() {
        kiln::with_check_scale(1e3, f)
    } else {
        f()
    }
}

/// The sizes a program is replayed at besides [`SIZES`]: every dimension of 2, 3, 5 or 7
/// resized, in order and out of it.
const OTHER_SIZES: [[usize; 5]; 2] = [[1, 4, 6, 9, 11], [1, 6, 4, 13, 8]];

/// Shrinks the failing program of `source` (called `name`) and panics with the smallest
/// program that still fails, its failure and its choices.
fn report_failure(name: &str, source: &Source, failure: &str) -> ! {
    let fails = |c: &[Choice]| {
        failure_of(|| {
            check_program(&Source::Replay(c.to_vec()));
        })
    };
    let (small, shrunk) = shrink(choices_of(source), &fails, 1000);
    let text = program_full(&Source::Replay(small.clone()), Device::Cpu, true).text;
    let lines: Vec<&str> = text.lines().collect();
    panic!(
        "{name} disagrees: {failure}\n\nshrunk to:\n{text}\nwhere it fails with: {}\n\n\
         to keep in tests/data/fuzz_regressions.json once fixed, with a \"found\" line:\n\
         \"choices\": {},\n\"program\": {}",
        shrunk.as_deref().unwrap_or("(no failure on replay: a nondeterministic disagreement)"),
        to_json(&small),
        serde_json::Value::from(lines)
    );
}

#[test]
fn random_programs_agree_fused_unfused_and_reference() {
    // `KILN_FUZZ_SEEDS=START..END` (or `=N` for 0..N) runs other programs: `scripts/fuzz`.
    let seeds = match std::env::var("KILN_FUZZ_SEEDS") {
        Ok(v) => match v.split_once("..") {
            Some((a, b)) => a.parse().expect("a start seed")..b.parse().expect("an end seed"),
            None => 0..v.parse().expect("a number of seeds"),
        },
        Err(_) => 0..2000u64,
    };
    // Every program that ever disagreed runs too, whatever the seeds.
    let programs = seeds.map(|s| (format!("seed {s}"), Source::Seed(s))).chain(
        regressions()
            .into_iter()
            .map(|r| (format!("the regression {:?}", r.found), Source::Replay(r.choices))),
    );
    let (mut count, mut with_gradients, mut with_second, mut replays) = (0, 0, 0, 0);
    let (mut differenced, mut generic) = (0, 0);
    for (name, source) in programs {
        let checked =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check_program(&source)));
        let exercised = match checked {
            Ok(e) => e,
            Err(e) => report_failure(&name, &source, &panic_message(e.as_ref())),
        };
        count += 1;
        with_gradients += usize::from(exercised.gradient);
        with_second += usize::from(exercised.second);
        replays += exercised.replays;
        differenced += usize::from(exercised.differenced);
        generic += usize::from(exercised.generic);
    }
    // Backward is really exercised: a good share of the programs have a gradient.
    assert!(with_gradients * 4 >= count, "{with_gradients} of {count} with gradients");
    // Double backward too, on the programs whose gradient depends on the input.
    assert!(with_second * 10 >= count, "{with_second} of {count} with second derivatives");
    // Autograd itself is checked, on the programs where finite differences are exact enough.
    assert!(differenced * 20 >= count, "{differenced} of {count} checked by finite differences");
    // And so are compiled replays: two per program that computes anything.
    assert!(replays >= count, "{replays} replays for {count} programs");
    // And size-generic kernels, in the compiled calls at other sizes.
    if kiln::debug::size_policy() != kiln::debug::SizePolicy::Specialize {
        assert!(generic * 4 >= count, "{generic} of {count} ran size-generic kernels");
    }
}

/// A kept regression replays to exactly the program it recorded: every choice read as it was
/// drawn (none mapped into a smaller range or defaulted) and the same calls. Replay is
/// lenient for shrinking's sake, so without this a change to the generator would silently
/// turn `tests/data/fuzz_regressions.json` into other programs.
#[test]
fn every_kept_regression_replays_to_the_program_it_recorded() {
    let kept = regressions();
    assert!(!kept.is_empty());
    for r in kept {
        let p = program_full(&Source::Replay(r.choices.clone()), Device::Cpu, true);
        assert_eq!(
            to_json(&p.choices),
            to_json(&r.choices),
            "{}: choices read differently",
            r.found
        );
        assert_eq!(p.text, r.program, "{}: the generator builds another program now", r.found);
    }
}

#[test]
fn a_failing_program_shrinks_to_the_calls_that_fail() {
    // A stand-in for a bug: every program with a matrix product "fails". Its smallest
    // program has one f32 input holding a single zero, the product, and the one other op
    // that every program has (two at least), the simplest (tanh).
    let fails = |c: &[Choice]| {
        let p = program_full(&Source::Replay(c.to_vec()), Device::Cpu, true);
        p.text.contains("tanh(x) @").then(|| "a product".to_string())
    };
    let big = (0..1000u64)
        .map(|s| choices_of(&Source::Seed(s)))
        .find(|c| {
            let text = program_full(&Source::Replay(c.clone()), Device::Cpu, true).text;
            fails(c).is_some() && text.lines().count() >= 8
        })
        .expect("a program with a product and several other ops");
    let (small, failure) = shrink(big.clone(), &fails, 5000);
    let text = program_full(&Source::Replay(small.clone()), Device::Cpu, true).text;
    assert_eq!(failure.as_deref(), Some("a product"));
    assert!(small.len() < big.len(), "{small:?}");
    // (`tN = x` lines keep a result for later ops to read.)
    let inputs: Vec<&str> =
        text.lines().filter(|l| l.starts_with('t') && !l.ends_with("= x")).collect();
    let ops: Vec<&str> = text.lines().filter(|l| l.starts_with("x = ") && *l != "x = t0").collect();
    assert_eq!(inputs, ["t0 = f32 [1, 1] Contiguous, requires grad: [0.0]"], "{text}");
    assert_eq!(ops.len(), 2, "{text}");
    assert!(ops.iter().any(|l| l.starts_with("x = tanh(x) @")), "{text}");
    assert!(ops.iter().any(|l| l.starts_with("x = x.float().tanh()")), "{text}");
    // A choice past the end of a sequence reads as its smallest value: the empty sequence
    // is the smallest program of all, an f32 scalar through two tanh.
    let empty = program_full(&Source::Replay(Vec::new()), Device::Cpu, false).text;
    assert_eq!(
        empty,
        "t0 = f32 [] Contiguous: [0.0]\nx = t0\nx = x.float().tanh()  // f32 []\n\
         x = x.float().tanh()  // f32 []\n"
    );
    // And a recorded sequence replays to the program it came from.
    let first = program_full(&Source::Seed(0), Device::Cpu, true);
    let replayed = program_full(&Source::Replay(first.choices.clone()), Device::Cpu, true);
    assert_eq!((replayed.text, replayed.choices), (first.text, first.choices));
}

#[test]
fn kernel_counts() {
    use kiln::debug::plan_summary;
    let x = Tensor::randn([64, 64]);
    let col = Tensor::randn([64, 1]);
    x.realize();
    col.realize();
    // An elementwise chain with broadcasts and constants is one kernel.
    let y = ((&x * 1.5 + 0.5).tanh() * x.sigmoid() + (&x - 0.2).relu()) / (x.square() + 1.0);
    assert_eq!(plan_summary(&[&y]).kernels, 1);
    let z = (&x * &col + 1.0).relu() - &x / 2.0;
    assert_eq!(plan_summary(&[&z]).kernels, 1);
    // Unfused, every op is its own kernel.
    let unfused = kiln::with_execution(kiln::Execution::Unfused, || plan_summary(&[&z]));
    assert_eq!(unfused.kernels, 5);
    // A softmax: three passes over the rows. The max, a tiny kernel that makes the shift
    // safe for infinite maxima, the sum of exp(x - max) that also writes exp(x - max) (it is
    // shared by the sum and the product, and too costly to compute twice), a tiny kernel of
    // the sums' reciprocals, the product.
    let s = x.softmax(1);
    let p = plan_summary(&[&s]);
    let full = p.kernel_text.iter().filter(|k| k.starts_with("kernel over [64, 64]")).count();
    assert_eq!((p.kernels, full, p.other_ops), (5, 3, 0), "{p:?}");
    // Centring by the mean: two passes over x (the sum, the subtraction) and a tiny
    // division of the sums.
    let c = &x - &x.mean_dim(1, true);
    let p = plan_summary(&[&c]);
    let full = p.kernel_text.iter().filter(|k| k.starts_with("kernel over [64, 64]")).count();
    assert_eq!((p.kernels, full), (3, 2), "{:?}", p.kernel_notes);
}

#[test]
fn a_row_sum_writes_the_shared_values_it_sums() {
    // Softmax over odd rows (vector lanes and scalar tails, several thread chunks), in f32
    // and f64, on the reference oracle: the sum of exp(x - max) also writes exp(x - max),
    // which the division reads back. Three passes over the rows, right values.
    for dtype in [DType::F32, DType::F64] {
        for &(rows, cols) in &[(1, 1), (3, 7), (37, 203), (300, 1029)] {
            let mut rng = Rng::new(rows as u64 * 7 + cols as u64);
            let xs = values(&mut rng, rows * cols, dtype);
            let x = tensor(&xs, &[rows, cols], dtype);
            x.realize();
            let (y, profile) =
                kiln::profile(|| kiln::with_check(|| x.softmax(1).realize().clone()));
            let writers: Vec<_> = profile
                .kernels()
                .into_iter()
                .filter(|k| k.cut.contains("also writes the values it reduces"))
                .collect();
            assert_eq!(writers.len(), 1, "{profile}");
            let mut want = vec![0.0; rows * cols];
            for r in 0..rows {
                let row = &xs[r * cols..(r + 1) * cols];
                let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let total: f64 = row.iter().map(|v| (v - m).exp()).sum();
                for (c, v) in row.iter().enumerate() {
                    want[r * cols + c] = (v - m).exp() / total;
                }
            }
            assert_close(&y.to_vec::<f64>(), &want, dtype, &format!("{dtype} {rows}x{cols}"));
        }
    }
    // Masked scores: exp(-inf) is exactly 0, in vector lanes and tails.
    let masked =
        Tensor::from_vec(vec![0.0f32, f32::NEG_INFINITY, 1.0, f32::NEG_INFINITY, 2.0], [1, 5]);
    let p = masked.softmax(1).to_vec::<f32>();
    assert_eq!((p[1], p[3]), (0.0, 0.0), "{p:?}");
}

/// A costly value read by several ops that all end in one kernel is computed once in that
/// kernel, not stored by a kernel of its own (GELU's gradient reads such a product twice);
/// read by two kernels, it is stored once and loaded by both.
#[test]
fn shared_values_inside_one_kernel_are_computed_once_there() {
    let (rows, cols) = (19, 33);
    let mut rng = Rng::new(92);
    let xs = values(&mut rng, rows * cols, DType::F32);
    let x = tensor(&xs, &[rows, cols], DType::F32);
    x.realize();
    // `e` is a temporary: a value the caller holds would be stored as a kept result.
    let y = {
        let e = (&x / 3.0).exp();
        &e * &x - e.sqrt()
    };
    let ((), profile) = kiln::profile(|| {
        y.realize();
    });
    let kernels = profile.kernels();
    assert_eq!(kernels.len(), 1, "{profile}");
    assert_eq!(kernels[0].ops.matches("exp").count(), 1, "{profile}");
    let want: Vec<f64> = xs.iter().map(|&v| (v / 3.0).exp() * v - (v / 6.0).exp()).collect();
    assert_close(&y.to_vec::<f64>(), &want, DType::F32, "one kernel");
    // Read by a row sum and by an elementwise output of another kernel: stored.
    let (s, z) = {
        let e = (&x / 3.0).exp();
        (e.sum_dim(1, false), &e * 2.0)
    };
    let ((), profile) = kiln::profile(|| {
        Tensor::try_realize_all(&[&s, &z]).unwrap();
    });
    let exps: usize = profile.kernels().iter().map(|k| k.ops.matches("exp").count()).sum();
    assert_eq!(exps, 1, "computed once, stored for both: {profile}");
    let want: Vec<f64> =
        (0..rows).map(|i| (0..cols).map(|j| (xs[i * cols + j] / 3.0).exp()).sum()).collect();
    assert_close(&s.to_vec::<f64>(), &want, DType::F32, "the sum");
}

/// A stored value that is also needed cast (under autocast, a gradient summed in f32 for a
/// bias and cast to bf16 for a product) is cast by the kernel that computes it: no kernel
/// of just the cast reads the value back, and both results hold the right values.
#[test]
fn casts_of_stored_values_are_written_by_the_value_kernel() {
    let (rows, cols) = (37, 70);
    let mut rng = Rng::new(91);
    let (xs, ys) =
        (values(&mut rng, rows * cols, DType::F32), values(&mut rng, rows * cols, DType::F32));
    let x = tensor(&xs, &[rows, cols], DType::F32);
    let y = tensor(&ys, &[rows, cols], DType::F32);
    Tensor::try_realize_all(&[&x, &y]).unwrap();
    // `g` is shared by a sum over rows and a cast: an exponential is stored, not recomputed.
    let g = (&x * &y / 4.0).exp();
    let bias = g.sum_dim(0, false);
    let low = g.bfloat16();
    let product = low.t().matmul(&low);
    let ((), profile) = kiln::profile(|| {
        Tensor::try_realize_all(&[&bias, &product]).unwrap();
    });
    let kernels = profile.kernels();
    assert!(kernels.iter().all(|k| k.ops != "cast(bf16)"), "{profile}");
    assert!(
        kernels.iter().any(|k| k.ops.contains("exp cast(bf16)") && k.cut.contains("also writes")),
        "{profile}"
    );
    let want_g: Vec<f64> = (0..rows * cols).map(|i| (xs[i] * ys[i] / 4.0).exp()).collect();
    let want_bias: Vec<f64> =
        (0..cols).map(|j| (0..rows).map(|i| want_g[i * cols + j]).sum()).collect();
    assert_close(&bias.to_vec::<f64>(), &want_bias, DType::F32, "the sum of the value");
    let want_low: Vec<f64> = want_g.iter().map(|&v| round_to(DType::BF16, v)).collect();
    assert_close(&low.to_vec::<f64>(), &want_low, DType::BF16, "its cast");
}

/// A post-norm residual stream under autocast (BERT's layers: `h = layer_norm(x·Wᵀ + b + h)`,
/// each product reading the stream cast to bf16): the sum a norm reduces is written by its
/// reduction kernel, and every later kernel reads it there; none recomputes the stream
/// from every earlier layer's product (a kernel per layer whose work grew with the depth).
#[test]
fn a_post_norm_stream_under_autocast_is_read_not_recomputed_from_every_layer() {
    let (rows, width, layers) = (12, 32, 8);
    let mut rng = Rng::new(17);
    let h0 = tensor(&values(&mut rng, rows * width, DType::F32), &[rows, width], DType::F32);
    let weights: Vec<Tensor> = (0..layers)
        .map(|_| {
            let w = values(&mut rng, width * width, DType::F32);
            tensor(&w.iter().map(|v| v / 4.0).collect::<Vec<_>>(), &[width, width], DType::F32)
        })
        .collect();
    let b = tensor(&values(&mut rng, width, DType::F32), &[width], DType::F32);
    let run = || {
        let mut h = h0.clone();
        for w in &weights {
            let y = h.matmul(&w.t()) + &b;
            h = F::layer_norm(&(y + &h), &[width], Some(&b), Some(&b), 1e-5);
        }
        h
    };
    let h = kiln::autocast(DType::BF16, run);
    let (_, kernels) = kiln::debug::kernels(|| h.realize().clone());
    for k in &kernels {
        let products = k.ops.matches("cast(f32)").count();
        assert!(products <= 1, "{} reads {products} layers' products: {}", k.name, k.ops);
    }
    let unfused = kiln::with_execution(Execution::Unfused, || kiln::autocast(DType::BF16, run))
        .to_vec::<f64>();
    assert_close(&h.to_vec::<f64>(), &unfused, DType::BF16, "fused against unfused");
}

#[test]
fn kept_intermediates_are_written_by_the_consuming_kernel() {
    // `t` is still held when `z` is realized (as a statement's temporaries are): one kernel
    // computes both and writes both, and both hold the right values.
    let (rows, cols) = (37, 23);
    let mut rng = Rng::new(5);
    let xs = values(&mut rng, rows * cols, DType::F32);
    let cs = values(&mut rng, rows, DType::F32);
    let x = Tensor::from_vec(xs.clone(), [rows, cols]).to_dtype(DType::F32);
    let col = Tensor::from_vec(cs.clone(), [rows, 1]).to_dtype(DType::F32);
    Tensor::try_realize_all(&[&x, &col]).unwrap();
    let t = &x * &col + 1.0;
    let z = t.relu() - &x / 2.0;
    let ((), profile) = kiln::profile(|| {
        z.realize();
    });
    let kernels = profile.kernels();
    assert_eq!(kernels.len(), 1, "{profile}");
    assert!(kernels[0].cut.contains("also writes 1 kept result"), "{profile}");
    let want_t: Vec<f64> = (0..rows * cols).map(|i| xs[i] * cs[i / cols] + 1.0).collect();
    let want_z: Vec<f64> = (0..rows * cols).map(|i| want_t[i].max(0.0) - xs[i] / 2.0).collect();
    assert_close(&t.to_vec::<f64>(), &want_t, DType::F32, "kept t");
    assert_close(&z.to_vec::<f64>(), &want_z, DType::F32, "z");
    // The check oracle compares every output of a kernel with several.
    let t2 = &x * &col + 1.0;
    let z2 = t2.relu() - &x / 2.0;
    kiln::with_check(|| z2.realize().clone());
    assert_close(&t2.to_vec::<f64>(), &want_t, DType::F32, "kept t, checked");
}

#[test]
fn the_check_oracle_passes_correct_kernels_and_reports_a_divergent_one() {
    // With the default tolerances every kernel of these programs agrees with the reference.
    for seed in 0..50 {
        kiln::with_check(|| program_on(seed, Device::Cpu).0.realize().clone());
    }
    // Demanding exact agreement, the polynomial exp differs from the reference's f64 exp in
    // the last bit somewhere: the report names the kernel, its ops and this file's line.
    let x = Tensor::linspace(-3.0, 3.0, 1000);
    x.realize();
    let line = line!() + 1;
    let y = (&x * 1.7).exp();
    let err = kiln::with_check_scale(0.0, || y.try_realize()).unwrap_err();
    let text = err.to_string();
    assert!(text.starts_with("check: fused kernel k_"), "{text}");
    assert!(text.contains("(full mul exp)"), "{text}");
    assert!(text.contains(&format!("fusion.rs:{line}")), "{text}");
    assert!(matches!(
        err,
        kiln::Error::Runtime(kiln::RunError { error: kiln::RuntimeError::CheckFailed { .. }, .. })
    ));
}

device_test!(index_ops_agree_with_the_reference, super::index_ops_agree_with_the_reference_on);

/// Random fills, the adjoint of a view (the gradient of a slice, and of an overlapping
/// view) and bf16 and integer products run natively on the CPU; they give what the reference
/// executor gives: random fills bit for bit, products of integers exactly (wrapping), bf16
/// products to bf16 precision.
#[test]
fn native_fills_unviews_and_products_agree_with_the_reference() {
    let mut rng = Rng::new(78);
    let both = |f: &dyn Fn() -> Vec<f64>| {
        let native = kiln::with_execution(Execution::Fused, f);
        let reference = kiln::with_execution(Execution::Reference, f);
        (native, reference)
    };
    for n in [0usize, 1, 7, 65_537, 200_003] {
        let (a, b) = both(&|| {
            kiln::manual_seed(n as u64);
            let mut v = Tensor::rand([n]).to_vec::<f64>();
            v.extend(Tensor::randn([n]).double().to_vec::<f64>());
            v.extend(Tensor::randint(-5, 1000, [n]).to_vec::<f64>());
            v
        });
        assert_eq!(
            a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            b.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "random fills of {n}"
        );
    }
    for dtype in [DType::F32, DType::F64, DType::F16] {
        let data = values(&mut rng, 6 * 7, dtype);
        let (a, b) = both(&|| {
            let x = tensor(&data, &[6, 7], dtype).requires_grad_(true);
            // A slice's gradient is an unview (non-overlapping); so is a flipped slice's.
            let y = x.narrow(1, 2, 4).exp().sum() + x.narrow(0, 1, 3).flip(&[1]).square().sum();
            kiln::grad(&[&y], &[&x], false).remove(0).to_vec::<f64>()
        });
        assert_close(&a, &b, dtype, &format!("unview gradients {dtype}"));
    }
    for dtype in [DType::I64, DType::I32, DType::I8, DType::U8, DType::BF16] {
        for (m, k, n) in [(1, 1, 1), (3, 5, 2), (17, 33, 9), (2, 0, 3)] {
            let da = values(&mut rng, 2 * m * k, dtype);
            let db = values(&mut rng, 2 * k * n, dtype);
            let (a, b) = both(&|| {
                let x = tensor(&da, &[2, m, k], dtype);
                let w = tensor(&db, &[2, n, k], dtype);
                x.matmul(&w.transpose(1, 2)).to_vec::<f64>()
            });
            let tol = if dtype == DType::BF16 { 1.6e-2 } else { 0.0 };
            assert_close_tol(&a, &b, tol, &format!("{dtype} product {m}x{k}x{n}"));
        }
    }
}

/// Random tensors with ties and NaNs, every axis, several dtypes and layouts, indices with
/// repeats: the native loops (or device kernels) for gather, scatter, scatter_add, cumsum,
/// assign, argmax and argmin give exactly what the reference executor gives.
fn index_ops_agree_with_the_reference_on(device: Device) {
    let mut rng = Rng::new(77);
    for dtype in [DType::F32, DType::F64, DType::F16, DType::I32, DType::I64, DType::U8] {
        for (l, layout) in LAYOUTS.into_iter().enumerate() {
            let shape = [4usize, 5, 6];
            let mut data = values(&mut rng, 120, dtype);
            for v in data.iter_mut().step_by(7) {
                *v = (*v).round(); // ties
            }
            if dtype.is_float() {
                data[17] = f64::NAN;
            }
            let x = make_on(&data, &shape, dtype, layout, device);
            for axis in 0..3i64 {
                // One index per line in the first layout (a label per row: each position is
                // added to at most once), several in the others.
                let n_index = if l == 0 { [1usize, 1, 1] } else { [3, 2, 4] };
                let len = shape[axis as usize] as i64;
                let mut idx_shape = shape.to_vec();
                idx_shape[axis as usize] = n_index[axis as usize];
                let count: usize = idx_shape.iter().product();
                let idx: Vec<i64> = (0..count).map(|_| rng.int(0, len)).collect();
                let index = Tensor::from_vec(idx, idx_shape.clone()).to(device);
                // Sources for scatter: as many elements as the index, of x's dtype.
                let src =
                    make_on(&values(&mut rng, count, dtype), &idx_shape, dtype, layout, device);
                let run = |mode: Execution| {
                    kiln::with_execution(mode, || {
                        let g = x.gather(axis, &index).to_vec::<f64>();
                        let a = x.argmax(axis, false).to_vec::<i64>();
                        let b = x.argmin(axis, true).to_vec::<i64>();
                        let s = x.scatter(axis, &index, &src).to_vec::<f64>();
                        let sa = x.scatter_add(axis, &index, &src).to_vec::<f64>();
                        let c = if dtype == DType::U8 {
                            vec![]
                        } else {
                            x.cumsum(axis).to_vec::<f64>()
                        };
                        // An in-place write through a strided view (an `assign`).
                        let y = make_on(&data, &shape, dtype, layout, device);
                        y.narrow(axis, 1, 2).copy_(&x.narrow(axis, 0, 2));
                        // The gradient of a slice (an `unview`).
                        let u = if dtype.is_float() {
                            let leaf = x.to_dtype(DType::F64).detach().requires_grad_(true);
                            leaf.narrow(axis, 1, 2).sum().backward();
                            leaf.grad().expect("a gradient").to_vec::<f64>()
                        } else {
                            vec![]
                        };
                        (g, a, b, s, sa, c, y.to_vec::<f64>(), u)
                    })
                };
                let (g, a, b, s, sa, c, y, u) = run(Execution::Fused);
                let (rg, ra, rb, rs, rsa, rc, ry, ru) = run(Execution::Reference);
                let same = |p: &[f64], q: &[f64]| {
                    p.len() == q.len()
                        && p.iter().zip(q).all(|(u, v)| u == v || (u.is_nan() && v.is_nan()))
                };
                let at = format!("{dtype} {layout:?} axis {axis} on {device}");
                assert!(same(&g, &rg), "gather {at}");
                assert_eq!((a, b), (ra, rb), "argmax/argmin {at}");
                assert!(same(&s, &rs), "scatter {at}");
                assert!(same(&sa, &rsa), "scatter_add {at}");
                assert!(same(&c, &rc), "cumsum {at}");
                assert!(same(&y, &ry), "copy_ into a view {at}");
                assert!(same(&u, &ru), "gradient of a slice {at}");
            }
        }
    }
    // An index out of range is the same error, naming the first bad index.
    let x = Tensor::randn([3, 4]).to(device);
    let bad = Tensor::from_vec(vec![0i64, 4, 1, -2], [1, 4]).to(device);
    let err = x.gather(1, &bad).try_realize().expect_err("index 4 is out of range").to_string();
    assert!(err.contains("gather") && err.contains("index 4 "), "{err}");
    let src = Tensor::ones([1, 4]).to(device);
    let err = x
        .scatter_add(1, &bad, &src)
        .try_realize()
        .expect_err("index 4 is out of range")
        .to_string();
    assert!(err.contains("scatter_add") && err.contains("index 4 "), "{err}");
}
