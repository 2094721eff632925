//! The connectionist temporal classification loss (PyTorch's `ctc_loss`): the forward
//! (α) and backward (β) recursions over the blank-extended targets in log space, in f64, one
//! sample per call, as two [`Opaque`] ops: the losses, and the gradient PyTorch's CPU
//! kernel computes from α, β and the loss.

use std::sync::LazyLock;

use kiln_ir::{DType, Shape};

use super::functional::Reduction;
use crate::error::ok;
use crate::ops::{CpuInput, CpuOutput, Opaque, Split};
use crate::{Error, Result, Tensor};

/// `ln(e^a + e^b)`, `-inf` when both are.
fn lse(a: f64, b: f64) -> f64 {
    let (hi, lo) = if a > b { (a, b) } else { (b, a) };
    if hi == f64::NEG_INFINITY { hi } else { hi + (lo - hi).exp().ln_1p() }
}

/// One sample: its log-probabilities `[T, C]` read through the input's strides, its labels.
struct Sample {
    lp: Vec<f64>,
    classes: usize,
    steps: usize,
    labels: Vec<usize>,
    blank: usize,
}

impl Sample {
    fn read(
        inputs: &[CpuInput<'_>],
        n: usize,
        blank: usize,
    ) -> std::result::Result<Sample, String> {
        let (lp, targets, input_lengths, target_lengths) =
            (&inputs[0], &inputs[1], &inputs[2], &inputs[3]);
        let (t_max, classes) = (lp.shape()[0], lp.shape()[2]);
        let steps = input_lengths.data::<i64>()?[input_lengths.position(&[n])];
        let length = target_lengths.data::<i64>()?[target_lengths.position(&[n])];
        let s_max = targets.shape()[1];
        let steps = usize::try_from(steps)
            .ok()
            .filter(|&s| s <= t_max)
            .ok_or_else(|| format!("input length {steps} of sample {n} is outside 0..={t_max}"))?;
        let length = usize::try_from(length).ok().filter(|&l| l <= s_max).ok_or_else(|| {
            format!("target length {length} of sample {n} is outside 0..={s_max}")
        })?;
        let ids = targets.data::<i64>()?;
        let labels = (0..length)
            .map(|s| {
                let id = ids[targets.position(&[n, s])];
                usize::try_from(id).ok().filter(|&c| c < classes && c != blank).ok_or_else(|| {
                    format!(
                        "target {id} of sample {n} is not a class other than the blank ({blank}) \
                         in 0..{classes}"
                    )
                })
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let values = lp.data::<f64>()?;
        let mut all = Vec::with_capacity(steps * classes);
        for t in 0..steps {
            all.extend((0..classes).map(|c| values[lp.position(&[t, n, c])]));
        }
        Ok(Sample { lp: all, classes, steps, labels, blank })
    }

    /// Label `s` of the blank-extended sequence `blank, l1, blank, l2, .., blank`.
    fn extended(&self, s: usize) -> usize {
        if s.is_multiple_of(2) { self.blank } else { self.labels[s / 2] }
    }

    /// Whether a path may skip from `s - 2` to `s` (a label that differs from the one before).
    fn skips(&self, s: usize) -> bool {
        s >= 2 && s % 2 == 1 && self.extended(s) != self.extended(s - 2)
    }

    fn lp(&self, t: usize, c: usize) -> f64 {
        self.lp[t * self.classes + c]
    }

    /// `α[t][s]` for every step and extended position (each including step `t`'s emission).
    fn alpha(&self) -> Vec<Vec<f64>> {
        let width = 2 * self.labels.len() + 1;
        let mut alpha = vec![vec![f64::NEG_INFINITY; width]; self.steps];
        for t in 0..self.steps {
            for s in 0..width {
                let from = if t == 0 {
                    if s < 2 { 0.0 } else { f64::NEG_INFINITY }
                } else {
                    let prev = &alpha[t - 1];
                    let mut v = prev[s];
                    if s >= 1 {
                        v = lse(v, prev[s - 1]);
                    }
                    if self.skips(s) {
                        v = lse(v, prev[s - 2]);
                    }
                    v
                };
                alpha[t][s] = from + self.lp(t, self.extended(s));
            }
        }
        alpha
    }

    /// `β[t][s]`, the mirror of [`Sample::alpha`].
    fn beta(&self) -> Vec<Vec<f64>> {
        let width = 2 * self.labels.len() + 1;
        let mut beta = vec![vec![f64::NEG_INFINITY; width]; self.steps];
        for t in (0..self.steps).rev() {
            for s in (0..width).rev() {
                let from = if t + 1 == self.steps {
                    if s + 2 >= width { 0.0 } else { f64::NEG_INFINITY }
                } else {
                    let next = &beta[t + 1];
                    let mut v = next[s];
                    if s + 1 < width {
                        v = lse(v, next[s + 1]);
                    }
                    if s + 2 < width && self.skips(s + 2) {
                        v = lse(v, next[s + 2]);
                    }
                    v
                };
                beta[t][s] = from + self.lp(t, self.extended(s));
            }
        }
        beta
    }

    /// `-ln p(labels)`: infinite when no path fits in the steps.
    fn nll(&self, alpha: &[Vec<f64>]) -> f64 {
        let width = 2 * self.labels.len() + 1;
        match alpha.last() {
            Some(last) if width >= 2 => -lse(last[width - 1], last[width - 2]),
            Some(last) => -last[width - 1],
            None if self.labels.is_empty() => 0.0,
            None => f64::INFINITY,
        }
    }
}

fn read_blank(inputs: &[CpuInput<'_>]) -> std::result::Result<usize, String> {
    let b = &inputs[4];
    let v = b.data::<i64>()?[b.position(&[0])];
    usize::try_from(v).map_err(|_| format!("blank {v} is negative"))
}

fn losses_cpu(inputs: &[CpuInput<'_>], out: &mut CpuOutput<'_>) -> std::result::Result<(), String> {
    let blank = read_blank(inputs)?;
    let start = out.start();
    for (k, v) in out.values::<f64>()?.iter_mut().enumerate() {
        let sample = Sample::read(inputs, start + k, blank)?;
        *v = sample.nll(&sample.alpha());
    }
    Ok(())
}

/// PyTorch's gradient (`ctc_loss_backward_cpu`): `(e^lp - e^(ln Σ_{s: l'(s) = c} αβ + nll -
/// lp)) · g` for the steps of each sample, 0 after them and where the loss is infinite and
/// zeroed. Its `e^lp` term makes it the gradient with respect to the logits under a
/// `log_softmax` (which adds nothing more there), as PyTorch's is.
fn gradient_cpu(
    inputs: &[CpuInput<'_>],
    out: &mut CpuOutput<'_>,
    zero_infinity: bool,
) -> std::result::Result<(), String> {
    let blank = read_blank(inputs)?;
    let (nll_in, grad_in) = (&inputs[5], &inputs[6]);
    let [t_max, batch, classes] = [0, 1, 2].map(|i| inputs[0].shape()[i]);
    let values = out.values::<f64>()?;
    values.fill(0.0);
    for n in 0..batch {
        let sample = Sample::read(inputs, n, blank)?;
        let nll = nll_in.data::<f64>()?[nll_in.position(&[n])];
        let g = grad_in.data::<f64>()?[grad_in.position(&[n])];
        if zero_infinity && nll.is_infinite() {
            continue;
        }
        let (alpha, beta) = (sample.alpha(), sample.beta());
        for t in 0..sample.steps.min(t_max) {
            let mut lcab = vec![f64::NEG_INFINITY; classes];
            for s in 0..alpha[t].len() {
                let c = sample.extended(s);
                lcab[c] = lse(lcab[c], alpha[t][s] + beta[t][s]);
            }
            for (c, &l) in lcab.iter().enumerate() {
                let lp = sample.lp(t, c);
                values[(t * batch + n) * classes + c] = (lp.exp() - (l + nll - lp).exp()) * g;
            }
        }
    }
    Ok(())
}

/// The losses op and its gradient op, for `zero_infinity` off and on.
static OPS: LazyLock<[Opaque; 2]> = LazyLock::new(|| [losses_op(false), losses_op(true)]);

fn losses_op(zero_infinity: bool) -> Opaque {
    let gradient = Opaque::builder("ctc_loss_backward", 7, move |inputs, out| {
        gradient_cpu(inputs, out, zero_infinity)
    })
    .shape(|inputs| Ok((inputs[0].0.clone(), DType::F64)))
    .split(Split::Whole)
    .host_on_gpu()
    .build();
    Opaque::builder("ctc_loss", 5, losses_cpu)
        .shape(|inputs| Ok((Shape::new(vec![inputs[0].0.dims()[1]]), DType::F64)))
        .host_on_gpu()
        .backward(move |saved, grad| {
            let s = saved.inputs();
            let g =
                gradient.try_call(&[&s[0], &s[1], &s[2], &s[3], &s[4], saved.output(), grad])?;
            Ok(vec![Some(g), None, None, None, None])
        })
        .build()
}

/// The options of [`ctc_loss`], PyTorch's names and defaults.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtcLossOptions {
    /// The blank class (0).
    pub blank: usize,
    /// `Mean` (the default) divides each loss by its target length (at least 1), then
    /// averages over the batch, as PyTorch; `Sum` adds the losses; `None` keeps them.
    pub reduction: Reduction,
    /// Infinite losses (targets no path of the input's length can emit) and their
    /// gradients become 0.
    pub zero_infinity: bool,
}

/// The CTC loss (PyTorch's `F.ctc_loss`): `log_probs` `[T, N, C]` (or `[T, C]` for one
/// sample) of log-probabilities over `C` classes, `targets` `[N, S]` padded or 1-D with the
/// targets one after another, and each sample's input and target lengths. The gradient is
/// PyTorch's: exact for the logits under a `log_softmax` (how CTC is used), not the plain
/// derivative with respect to `log_probs`.
///
/// ```
/// use kiln::nn::functional::{CtcLossOptions, ctc_loss};
/// use kiln::prelude::*;
/// // Two steps, two classes (blank and "1"), target "1": paths "1 1", "b 1", "1 b".
/// let p = Tensor::from_vec(vec![0.6f64, 0.4, 0.3, 0.7], [2, 1, 2]);
/// let loss = ctc_loss(&p.log(), &Tensor::from_vec(vec![1i64], [1, 1]), &[2], &[1],
///     CtcLossOptions { reduction: kiln::nn::functional::Reduction::Sum, ..Default::default() });
/// let want = -(0.4 * 0.7 + 0.6 * 0.7 + 0.4 * 0.3f64).ln();
/// assert!((loss.item::<f64>() - want).abs() < 1e-12);
/// ```
///
/// # Panics
/// As [`try_ctc_loss`] fails.
#[track_caller]
pub fn ctc_loss(
    log_probs: &Tensor,
    targets: &Tensor,
    input_lengths: &[usize],
    target_lengths: &[usize],
    options: CtcLossOptions,
) -> Tensor {
    ok(try_ctc_loss(log_probs, targets, input_lengths, target_lengths, options))
}

/// [`ctc_loss`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when the shapes or lengths do not fit one another, [`Error::DType`] for
/// integer log-probabilities or float targets, [`Error::Value`] for a blank that is not a
/// class; a target that is the blank or out of range,
/// or a length past its tensor, fails the run, naming the sample.
#[track_caller]
pub fn try_ctc_loss(
    log_probs: &Tensor,
    targets: &Tensor,
    input_lengths: &[usize],
    target_lengths: &[usize],
    options: CtcLossOptions,
) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    const OP: &str = "ctc_loss";
    if !log_probs.dtype().is_float() || targets.dtype().is_float() {
        return Err(Error::dtype(
            OP,
            format!(
                "takes float log-probabilities and integer targets, got {} and {}",
                log_probs.dtype(),
                targets.dtype()
            ),
        ));
    }
    let unbatched = log_probs.ndim() == 2;
    let lp = if unbatched { log_probs.try_unsqueeze(1)? } else { log_probs.clone() };
    let n = if lp.ndim() == 3 { lp.dims()[1] } else { 0 };
    if lp.ndim() != 3 || input_lengths.len() != n || target_lengths.len() != n {
        return Err(Error::shape(
            OP,
            format!(
                "takes log_probs [T, N, C] (or [T, C]) and N input and target lengths, got {} \
                 with {} and {} lengths",
                log_probs.shape(),
                input_lengths.len(),
                target_lengths.len()
            ),
        ));
    }
    let classes = lp.dims()[2];
    if options.blank >= classes {
        return Err(Error::value(
            OP,
            format!("blank = {} is not one of the {classes} classes", options.blank),
        ));
    }
    let targets = padded_targets(OP, targets, target_lengths, unbatched)?.to_dtype(DType::I64);
    let device = lp.device();
    let lengths = |v: &[usize]| -> Result<Tensor> {
        let v: Vec<i64> = v.iter().map(|&l| l as i64).collect();
        Tensor::try_from_vec(v, [n])?.try_to(device)
    };
    let blank = Tensor::try_from_vec(vec![options.blank as i64], [1])?.try_to(device)?;
    let (inputs, target_lens) = (lengths(input_lengths)?, lengths(target_lengths)?);
    let op = &OPS[usize::from(options.zero_infinity)];
    let mut losses = op.try_call(&[&lp.double(), &targets, &inputs, &target_lens, &blank])?;
    if options.zero_infinity {
        losses = Tensor::try_where_(&losses.isinf(), 0.0, &losses)?;
    }
    let losses = losses.to_dtype(log_probs.dtype());
    let loss = match options.reduction {
        Reduction::Mean => {
            losses.try_div(target_lens.clamp_min(1.0).to_dtype(losses.dtype()))?.try_mean()?
        }
        Reduction::Sum => losses.sum(),
        Reduction::None => losses,
    };
    if unbatched && options.reduction == Reduction::None { loss.try_squeeze(0) } else { Ok(loss) }
}

/// `targets` as `[N, S]`: as given when 2-D, else the concatenated targets cut by their
/// lengths and padded (by repeating a sample's last target, which its length leaves unread).
fn padded_targets(
    op: &'static str,
    targets: &Tensor,
    lengths: &[usize],
    unbatched: bool,
) -> Result<Tensor> {
    if unbatched && targets.ndim() == 1 {
        return targets.try_unsqueeze(0);
    }
    if targets.ndim() == 2 {
        return Ok(targets.clone());
    }
    let total: usize = lengths.iter().sum();
    if targets.ndim() != 1 || targets.dims()[0] < total {
        return Err(Error::shape(
            op,
            format!(
                "takes targets [N, S] or 1-D with the {total} targets of the lengths one after \
                 another, got {}",
                targets.shape()
            ),
        ));
    }
    let width = lengths.iter().copied().max().unwrap_or(0).max(1);
    if total == 0 {
        return Tensor::try_full_dtype([lengths.len(), width], 0i64, DType::I64)?
            .try_to(targets.device());
    }
    let mut index = Vec::with_capacity(lengths.len() * width);
    let mut offset = 0;
    for &l in lengths {
        // Past a sample's length any position will do: it is never read.
        index.extend(
            (0..width).map(|s| (offset + s.min(l.saturating_sub(1))).min(total - 1) as i64),
        );
        offset += l;
    }
    let index = Tensor::try_from_vec(index, [lengths.len() * width])?.try_to(targets.device())?;
    targets.try_index_select(0, &index)?.try_reshape(&[lengths.len() as i64, width as i64])
}
