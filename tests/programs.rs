//! Random programs for differential fuzzing, and the shrinker that reduces a failing one.
//!
//! A program is built from a sequence of *choices* — integers and input data — drawn from a
//! seeded generator, which records them. Replaying a recorded sequence rebuilds the same
//! program; replaying a shorter or smaller one builds a simpler program (a choice past the
//! end reads as its smallest value). So a failure is shrunk by editing its choices —
//! deleting spans, lowering integers, zeroing data — and keeping each edit under which the
//! program still fails, the way Hypothesis shrinks. Every program also prints itself as the
//! kiln calls it made, which is what a failure reports.

use std::cell::Cell;
use std::fmt::Write as _;

use kiln::prelude::*;

use crate::common::*;

/// How closely generated code must agree with the reference executor on a program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Precision {
    /// Only exactly rounded ops: the reference's values, up to 16-bit double rounding.
    Exact,
    /// A function that generated code approximates in f32 (a few ULP). Later ops can
    /// amplify those ULP without bound (`x * c * c`, squared, then a softmax over values near
    /// 1e5: seed 33470), so the reference is matched to 1%.
    Approximated,
    /// An approximated value then cast to an integer or bool: a value a ULP below 1.0
    /// truncates to 0 (seed 39696). Only the generated modes can be compared, with each
    /// other (they share the polynomials).
    Discontinuous,
}

/// One recorded decision of the generator.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Choice {
    /// An integer, as its distance above the smallest value it could have had.
    Int(u64),
    /// An input's values, or a gather's indices.
    Data(Vec<f64>),
}

/// Where a program's choices come from.
#[derive(Clone, Debug)]
pub(crate) enum Source {
    /// Drawn from a seeded generator.
    Seed(u64),
    /// Replayed from a recorded sequence.
    Replay(Vec<Choice>),
    /// A recorded sequence replayed at other sizes: the dimensions the generator draws from
    /// [`SIZES`] are drawn from these instead (the same positions: 1 stays 1), and each
    /// recorded input's values and gather's indices are repeated to fill its new size (an
    /// index reduced into range). The same program, over tensors of other sizes.
    Resized(Vec<Choice>, [usize; 5]),
}

/// The sizes a program's dimensions are drawn from.
pub(crate) const SIZES: [usize; 5] = [1, 2, 3, 5, 7];

/// The generator's side of a [`Source`]: draws (or replays) choices and records them.
struct Choices {
    rng: Option<Rng>,
    replay: std::vec::IntoIter<Choice>,
    drawn: Vec<Choice>,
    /// The sizes dimensions are drawn from ([`SIZES`], or a resized replay's).
    sizes: [usize; 5],
    /// Whether recorded data of another length is repeated to fill (a resized replay).
    repeat: bool,
}

impl Choices {
    fn new(source: &Source) -> Choices {
        match source {
            Source::Seed(seed) => Choices {
                rng: Some(Rng::new(*seed)),
                replay: Vec::new().into_iter(),
                drawn: Vec::new(),
                sizes: SIZES,
                repeat: false,
            },
            Source::Replay(choices) => Choices {
                rng: None,
                replay: choices.clone().into_iter(),
                drawn: Vec::new(),
                sizes: SIZES,
                repeat: false,
            },
            Source::Resized(choices, sizes) => Choices {
                rng: None,
                replay: choices.clone().into_iter(),
                drawn: Vec::new(),
                sizes: *sizes,
                repeat: true,
            },
        }
    }

    /// An integer in `lo..hi`.
    fn int(&mut self, lo: i64, hi: i64) -> i64 {
        let v = match &mut self.rng {
            Some(rng) => rng.int(lo, hi),
            None => match self.replay.next() {
                Some(Choice::Int(c)) => lo + (c % (hi - lo) as u64) as i64,
                _ => lo,
            },
        };
        self.drawn.push(Choice::Int((v - lo) as u64));
        v
    }

    /// A dimension: one of the sizes, as an integer choice.
    fn size(&mut self) -> usize {
        self.sizes[self.int(0, 5) as usize]
    }

    /// A recorded data choice of `n` elements: the recording, or (in a resized replay) the
    /// recording repeated to `n`; zeros when there is none.
    fn data(&mut self, n: usize) -> Vec<f64> {
        match self.replay.next() {
            Some(Choice::Data(d)) if d.len() == n => d,
            Some(Choice::Data(d)) if self.repeat && !d.is_empty() => {
                (0..n).map(|i| d[i % d.len()]).collect()
            }
            _ => vec![0.0; n],
        }
    }

    /// `n` indices in `0..hi`, as one choice.
    fn indices(&mut self, n: usize, hi: i64) -> Vec<i64> {
        let v: Vec<i64> = match &mut self.rng {
            Some(rng) => (0..n).map(|_| rng.int(0, hi)).collect(),
            None => self.data(n).iter().map(|&i| (i as i64).rem_euclid(hi)).collect(),
        };
        self.drawn.push(Choice::Data(v.iter().map(|&i| i as f64).collect()));
        v
    }

    /// `n` values representable in `dtype` (see [`values`]).
    fn values(&mut self, n: usize, dtype: DType) -> Vec<f64> {
        let v = match &mut self.rng {
            Some(rng) => values(rng, n, dtype),
            None => self.data(n),
        };
        self.drawn.push(Choice::Data(v.clone()));
        v
    }
}

/// A program's result and what can be compared of it.
pub(crate) struct Program {
    pub(crate) y: Tensor,
    /// How closely the values match the reference.
    pub(crate) values: Precision,
    /// How closely gradients match: an approximated value that a non-smooth op (relu, abs,
    /// a comparison, a clamp, a cast) reads may fall on the other side of the kink, where
    /// the derivative jumps.
    pub(crate) gradients: Precision,
    /// The first input, which requires grad when asked for and it is floating point.
    pub(crate) input: Tensor,
    /// The least precise float dtype any value of the program had: gradients carry its
    /// rounding whatever the input's dtype.
    pub(crate) coarsest: DType,
    /// The choices the program was built from: replaying them builds it again.
    pub(crate) choices: Vec<Choice>,
    /// The program as the calls it made, one per line.
    pub(crate) text: String,
}

const DTYPES: [DType; 8] = [
    DType::F32,
    DType::F64,
    DType::F16,
    DType::BF16,
    DType::I32,
    DType::I64,
    DType::U8,
    DType::Bool,
];

/// How many ops [`program_full`] chooses from.
const OPS: i64 = 30;

/// A random program: inputs of random shapes, dtypes and layouts, then random elementwise
/// ops, broadcasts, movement ops, casts, reductions, products, gathers, in-place writes
/// through views, cumulative sums and flips, its inputs stored on `device`. Also says how
/// closely generated code can match the reference on it.
pub(crate) fn program_on(seed: u64, device: Device) -> (Tensor, Precision) {
    let p = program_full(&Source::Seed(seed), device, false);
    (p.y, p.values)
}

/// [`program_on`] from any [`Source`], optionally with the first input requiring grad.
pub(crate) fn program_full(source: &Source, device: Device, grad: bool) -> Program {
    let mut c = Choices::new(source);
    let mut text = String::new();
    let rank = c.int(0, 4) as usize;
    let shape: Vec<usize> = (0..rank).map(|_| c.size()).collect();
    let mut pool: Vec<Tensor> = Vec::new();
    // One to three inputs and two to twelve ops, each after a choice to go on: deleting
    // an input's or an op's choices deletes it (a shrinker cannot edit a count and the
    // choices it governs at once).
    for i in 0..3 {
        if i > 0 && c.int(0, 2) == 0 {
            break;
        }
        let dtype = DTYPES[c.int(0, DTYPES.len() as i64) as usize];
        // Inputs broadcast against `shape`: some dimensions replaced by 1, some dropped.
        let drop = c.int(0, rank as i64 + 1) as usize;
        let s: Vec<usize> =
            shape[drop..].iter().map(|&d| if c.int(0, 4) == 0 { 1 } else { d }).collect();
        let data = c.values(s.iter().product(), dtype);
        let layout = LAYOUTS[c.int(0, 3) as usize];
        let t = make_on(&data, &s, dtype, layout, device);
        let requires = grad && pool.is_empty() && dtype.is_float();
        let _ = writeln!(
            text,
            "t{i} = {dtype} {s:?} {layout:?}{}: {data:?}",
            if requires { ", requires grad" } else { "" }
        );
        pool.push(if requires { t.requires_grad_(true) } else { t });
    }
    let input = pool[0].clone();
    let mut x = pool[0].clone();
    let _ = writeln!(text, "x = t0");
    let approximated = Cell::new(false);
    let discontinuous = Cell::new(false);
    let nonsmooth = Cell::new(false);
    let coarsest = Cell::new(DType::F64);
    for t in &pool {
        if t.dtype().is_float() && tolerance(t.dtype()) > tolerance(coarsest.get()) {
            coarsest.set(t.dtype());
        }
    }
    // The fallback when an op does not apply (a binary op's shapes do not broadcast).
    let cos = |x: &Tensor| {
        approximated.set(true);
        ("x.float().cos()".to_string(), fl(x).cos())
    };
    for step in 0..12 {
        if step >= 2 && c.int(0, 6) == 0 {
            break;
        }
        let o = c.int(0, pool.len() as i64) as usize;
        let other = pool[o].clone();
        let op = c.int(0, OPS);
        if matches!(op, 0..=5 | 18 | 21..=23 | 26) {
            approximated.set(true);
        }
        if approximated.get() && matches!(op, 2 | 3 | 6 | 7 | 11 | 13 | 14) {
            nonsmooth.set(true);
        }
        let numeric = x.dtype() != DType::Bool && other.dtype() != DType::Bool;
        let named = |call: &str, t: Tensor| (call.replace("{o}", &format!("t{o}")), t);
        let (call, y) = match op {
            0 => named("x.float().tanh()", fl(&x).tanh()),
            1 => named("x.float().sigmoid()", fl(&x).sigmoid()),
            2 => named("x.float().exp().clamp(-10, 10)", fl(&x).exp().clamp(-10.0, 10.0)),
            3 => named("(x.float().abs() + 1).log()", (fl(&x).abs() + 1.0).log()),
            4 => named("x.float().sin()", fl(&x).sin()),
            5 => named("x.float().gelu()", fl(&x).gelu()),
            6 => named("x.float().abs().sqrt()", fl(&x).abs().sqrt()),
            7 if x.dtype() != DType::Bool => named("x.relu()", x.relu()),
            8 if x.dtype() != DType::Bool => named("-x", -&x),
            9 if numeric => match x.try_add(&other) {
                Ok(y) => named("x + {o}", y),
                Err(_) => cos(&x),
            },
            10 if numeric => match x.try_mul(&other) {
                Ok(y) => named("x * {o}", y),
                Err(_) => cos(&x),
            },
            11 if numeric => match x.try_maximum(&other) {
                Ok(y) => named("x.maximum({o})", y),
                Err(_) => cos(&x),
            },
            12 => match fl(&x).try_div(fl(&other).abs() + 1.0) {
                Ok(y) => named("x.float() / ({o}.float().abs() + 1)", y),
                Err(_) => cos(&x),
            },
            13 => match x.try_gt(&other).and_then(|m| Tensor::try_where_(&m, &x, &other)) {
                Ok(y) => named("where(x > {o}, x, {o})", y),
                Err(_) => cos(&x),
            },
            14 => {
                let to = DTYPES[c.int(0, DTYPES.len() as i64) as usize];
                if approximated.get() && !to.is_float() {
                    discontinuous.set(true);
                }
                named(&format!("x.to_dtype({to})"), x.to_dtype(to))
            }
            15 if x.ndim() >= 2 => named("x.transpose(0, -1)", x.transpose(0, -1)),
            16 if x.ndim() >= 1 && x.dims()[0] > 1 => {
                named("x.narrow(0, 1, len - 1)", x.narrow(0, 1, x.dims()[0] - 1))
            }
            17 if x.ndim() >= 1 => {
                let keep = c.int(0, 2) == 0;
                named(&format!("x.float().sum_dim(-1, {keep})"), fl(&x).sum_dim(-1, keep))
            }
            18 if x.ndim() >= 1 && x.numel() > 0 => {
                named("x.float().softmax(0)", fl(&x).softmax(0))
            }
            19 => named("x.float() * 0.5 + 0.25", fl(&x) * 0.5 + 0.25),
            20 if x.ndim() >= 1 => {
                named("x.float().mean_dim(0, true) - x", fl(&x).mean_dim(0, true) - fl(&x))
            }
            21 => named("x.float().square().tanh()", fl(&x).square().tanh()),
            // Products of bounded values (|tanh| < 1), so f32 accumulation stays within
            // tolerance whatever the cancellation.
            22 if x.ndim() >= 2 => {
                let t = fl(&x).tanh();
                named("tanh(x) @ tanh(x)^T", t.matmul(&t.transpose(-2, -1)))
            }
            23 if x.ndim() == 1 => {
                let t = fl(&x).tanh();
                named("tanh(x) . tanh(x)", t.matmul(&t))
            }
            // Selection: a gather along the last dimension.
            24 if x.ndim() >= 1 && x.numel() > 0 => {
                let last = *x.dims().last().expect("a dimension") as i64;
                let index = c.indices(x.numel(), last);
                let call = format!("x.gather(-1, {index:?})");
                named(&call, x.gather(-1, &Tensor::from_vec(index, x.dims()).to(device)))
            }
            // An in-place write through a view of a computed tensor (not differentiable yet:
            // only where nothing requires grad).
            25 if x.ndim() >= 1 && x.dims()[0] > 1 && !x.requires_grad() => {
                let y = fl(&x) + 0.0;
                y.narrow(0, 0, 1).fill_(2.5);
                named("y = x.float() + 0; y.narrow(0, 0, 1).fill_(2.5)", y)
            }
            26 if x.ndim() >= 1 => named("x.float().tanh().cumsum(-1)", fl(&x).tanh().cumsum(-1)),
            27 if x.ndim() >= 1 && x.numel() > 0 => named("x.flip([0])", x.flip(&[0])),
            // A whole tensor written in place after a result read it (under autograd too):
            // the result keeps the values, and the gradient, of before the write.
            28 => {
                let y = fl(&x) * 1.0;
                let before = &y + 1.0;
                y.mul_(1.5);
                named("y = x.float() * 1; b = y + 1; y.mul_(1.5); b + y", &before + &y)
            }
            // A write into part of a computed tensor, under autograd too (PyTorch's
            // `CopySlices`): through a narrow, a select, a column (strided), a transposed
            // narrow, or a mask. (Case 25 stays as it was, so that kept regressions replay.)
            29 if x.ndim() >= 1 && x.dims()[0] > 1 => {
                let y = fl(&x) * 1.0;
                let wide = x.ndim() >= 2;
                let how = match c.int(0, 5) {
                    0 => {
                        y.narrow(0, 0, 1).mul_(2.0);
                        "y.narrow(0, 0, 1).mul_(2)"
                    }
                    1 => {
                        y.select(0, 1).add_(0.5);
                        "y.select(0, 1).add_(0.5)"
                    }
                    2 if wide => {
                        y.narrow(-1, 0, 1).mul_(-1.5);
                        "y.narrow(-1, 0, 1).mul_(-1.5)"
                    }
                    3 if wide => {
                        y.transpose(0, -1).narrow(0, 0, 1).sub_(0.25);
                        "y.transpose(0, -1).narrow(0, 0, 1).sub_(0.25)"
                    }
                    _ => {
                        y.masked_fill_(&y.gt(0.5), 0.25);
                        "y.masked_fill_(y > 0.5, 0.25)"
                    }
                };
                named(&format!("y = x.float() * 1; {how}; y"), y)
            }
            _ => cos(&x),
        };
        x = y;
        let _ = writeln!(text, "x = {call}  // {} {:?}", x.dtype(), x.dims());
        if tolerance(x.dtype()) > tolerance(coarsest.get()) {
            coarsest.set(x.dtype());
        }
        if c.int(0, 4) == 3 {
            let _ = writeln!(text, "t{} = x", pool.len());
            pool.push(x.clone());
        }
    }
    let class = |broken: bool| match (approximated.get(), broken) {
        (_, true) => Precision::Discontinuous,
        (true, false) => Precision::Approximated,
        (false, false) => Precision::Exact,
    };
    Program {
        y: x,
        values: class(discontinuous.get()),
        gradients: class(discontinuous.get() || nonsmooth.get()),
        input,
        coarsest: coarsest.get(),
        choices: c.drawn,
        text,
    }
}

thread_local! {
    /// Whether [`fl`] keeps f64 values f64 (see [`with_f64_floats`]).
    static KEEP_F64: Cell<bool> = const { Cell::new(false) };
}

/// `x.float()` as the programs call it: f32, except an f64 value under [`with_f64_floats`].
fn fl(x: &Tensor) -> Tensor {
    if KEEP_F64.with(Cell::get) && x.dtype() == DType::F64 { x.clone() } else { x.float() }
}

/// Runs `f` with the programs' `.float()` calls keeping f64 values f64, so that a program
/// from an f64 input can stay f64 throughout (a finite-difference oracle needs it).
pub(crate) fn with_f64_floats<R>(f: impl FnOnce() -> R) -> R {
    let before = KEEP_F64.with(|k| k.replace(true));
    let out = f();
    KEEP_F64.with(|k| k.set(before));
    out
}

/// `choices` as JSON: an integer is a number, data an array of numbers.
pub(crate) fn to_json(choices: &[Choice]) -> String {
    let values: Vec<serde_json::Value> = choices
        .iter()
        .map(|c| match c {
            Choice::Int(v) => serde_json::Value::from(*v),
            Choice::Data(d) => serde_json::Value::from(d.clone()),
        })
        .collect();
    serde_json::Value::from(values).to_string()
}

/// A program that once disagreed, kept once fixed (`tests/data/fuzz_regressions.json`).
pub(crate) struct Regression {
    /// What it found.
    pub(crate) found: String,
    /// Its choices.
    pub(crate) choices: Vec<Choice>,
    /// The program as recorded, one call per line: replaying the choices must build it
    /// again, or a change to the generator has turned the regression into another program.
    pub(crate) program: String,
}

/// The programs that ever disagreed, kept once fixed (`tests/data/fuzz_regressions.json`).
pub(crate) fn regressions() -> Vec<Regression> {
    let file: serde_json::Value =
        serde_json::from_str(include_str!("data/fuzz_regressions.json")).expect("valid JSON");
    let cases = file.as_array().expect("a list of regressions");
    cases
        .iter()
        .map(|case| {
            let choices = case["choices"].as_array().expect("a list of choices");
            let choices = choices
                .iter()
                .map(|c| match c.as_array() {
                    Some(d) => {
                        Choice::Data(d.iter().map(|v| v.as_f64().expect("a number")).collect())
                    }
                    None => Choice::Int(c.as_u64().expect("an integer choice")),
                })
                .collect();
            let lines = case["program"].as_array().expect("the program's calls");
            Regression {
                found: case["found"].as_str().expect("what it found").to_string(),
                choices,
                program: lines
                    .iter()
                    .map(|l| l.as_str().expect("a call").to_string() + "\n")
                    .collect(),
            }
        })
        .collect()
}

/// The choices of `source`'s program, as recorded.
pub(crate) fn choices_of(source: &Source) -> Vec<Choice> {
    program_full(source, Device::Cpu, true).choices
}

/// Reduces `choices`, under which `fails` returns a failure, to a sequence as short and as
/// small as the failure allows, trying at most `budget` candidates. Returns it with its
/// failure. Each accepted edit deletes choices, lowers an integer or zeroes data, so this
/// ends.
pub(crate) fn shrink(
    choices: Vec<Choice>,
    fails: &dyn Fn(&[Choice]) -> Option<String>,
    budget: usize,
) -> (Vec<Choice>, Option<String>) {
    let failure = fails(&choices);
    let mut s = Shrinker { current: choices, failure, fails, tries: 0, budget };
    let mut progress = true;
    while progress && s.tries < s.budget {
        progress = false;
        // Delete spans, longest first.
        for span in [8, 4, 2, 1] {
            let mut i = 0;
            while i + span <= s.current.len() {
                let mut candidate = s.current.clone();
                candidate.drain(i..i + span);
                if s.attempt(candidate) {
                    progress = true;
                } else {
                    i += 1;
                }
            }
        }
        // Lower each integer: to zero, else halve it, else one less.
        for i in 0..s.current.len() {
            while let Some(Choice::Int(v)) = s.current.get(i).cloned() {
                let lowered = [0, v / 2, v.saturating_sub(1)]
                    .into_iter()
                    .filter(|&w| w < v)
                    .any(|w| s.attempt(replaced(&s.current, i, Choice::Int(w))));
                if !lowered {
                    break;
                }
                progress = true;
            }
        }
        // Simplify each input's values: all zero, else truncated, else one at a time zeroed.
        for i in 0..s.current.len() {
            let Some(Choice::Data(d)) = s.current.get(i).cloned() else { continue };
            let zeros = vec![0.0; d.len()];
            let truncated: Vec<f64> = d.iter().map(|v| v.trunc()).collect();
            if s.attempt(replaced(&s.current, i, Choice::Data(zeros)))
                || s.attempt(replaced(&s.current, i, Choice::Data(truncated)))
            {
                progress = true;
                continue;
            }
            for j in 0..d.len() {
                let Some(Choice::Data(d)) = s.current.get(i).cloned() else { break };
                if d.get(j).is_some_and(|&v| v != 0.0) {
                    let mut e = d.clone();
                    e[j] = 0.0;
                    progress |= s.attempt(replaced(&s.current, i, Choice::Data(e)));
                }
            }
        }
    }
    (s.current, s.failure)
}

/// The state of [`shrink`]: the smallest failing sequence so far.
struct Shrinker<'a> {
    current: Vec<Choice>,
    failure: Option<String>,
    fails: &'a dyn Fn(&[Choice]) -> Option<String>,
    tries: usize,
    budget: usize,
}

impl Shrinker<'_> {
    /// Tries a candidate; keeps it (as its program recorded it) when it still fails.
    fn attempt(&mut self, candidate: Vec<Choice>) -> bool {
        if self.tries >= self.budget || candidate == self.current {
            return false;
        }
        self.tries += 1;
        let Some(f) = (self.fails)(&candidate) else { return false };
        // A replay reads choices past the end as their smallest values: what it recorded
        // may be no simpler than what it had (an unread choice deleted, then read as 0).
        let recorded = normalized(candidate);
        if !simpler(&recorded, &self.current) {
            return false;
        }
        self.failure = Some(f);
        self.current = recorded;
        true
    }
}

/// Whether `a` is a simpler sequence than `b`: shorter, or as long and smaller at its first
/// difference (an integer lower, an input with fewer nonzero values or a smaller sum).
fn simpler(a: &[Choice], b: &[Choice]) -> bool {
    let key = |c: &Choice| match c {
        Choice::Int(v) => (0, *v as f64, 0.0),
        Choice::Data(d) => (
            1,
            d.iter().filter(|v| **v != 0.0).count() as f64,
            d.iter().map(|v| v.abs()).sum::<f64>(),
        ),
    };
    let keys = |s: &[Choice]| s.iter().map(key).collect::<Vec<_>>();
    (a.len(), keys(a)) < (b.len(), keys(b))
}

/// `choices` with the one at `i` replaced by `c`.
fn replaced(choices: &[Choice], i: usize, c: Choice) -> Vec<Choice> {
    let mut out = choices.to_vec();
    out[i] = c;
    out
}

/// The choices a replay of `choices` actually reads: what runs past the program is dropped,
/// and what it reads past the end is written out.
fn normalized(choices: Vec<Choice>) -> Vec<Choice> {
    choices_of(&Source::Replay(choices))
}

/// Runs `check`, turning a panic (a failed assertion, or one inside kiln) into its message.
/// The panic hook stays quiet meanwhile, so shrinking does not print every attempt.
pub(crate) fn failure_of(check: impl FnOnce()) -> Option<String> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(check));
    std::panic::set_hook(hook);
    result.err().map(|e| panic_message(e.as_ref()))
}

/// The message a panic carried (a formatted `String` or a literal `&str`).
pub(crate) fn panic_message(e: &(dyn std::any::Any + Send)) -> String {
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_string()))
        .unwrap_or_else(|| "a panic without a message".into())
}
