//! `einsum`: parsing, checking, and lowering to views, reductions and batched matmul.

use std::collections::BTreeMap;

use kiln_ir::View;

use super::Tensor;
use crate::error::ok;
use crate::{Error, Result};

/// Einstein summation over up to three operands, as `torch.einsum`:
/// `kiln::einsum("bij,bjk->bik", &[&a, &b])`.
///
/// Each operand is named by one letter per dimension; letters repeated across operands are
/// multiplied together, letters missing from the output (after `->`) are summed, and a letter
/// repeated within one operand takes its diagonal. `...` stands for the remaining dimensions
/// and broadcasts across operands. Without `->`, the output is `...` followed by the letters
/// that appear exactly once, in alphabetical order. Products are lowered to batched matrix
/// multiplications, so `"ij,jk->ik"` costs what `matmul` costs.
///
/// # Panics
/// As [`try_einsum`] fails.
///
/// ```
/// use kiln::prelude::*;
/// let a = Tensor::arange(0.0f32, 6.0, 1.0).view(&[2, 3]);
/// let b = Tensor::ones([3, 2]);
/// assert_eq!(kiln::einsum("ij,jk->ik", &[&a, &b]).to_vec::<f32>(), a.matmul(&b).to_vec::<f32>());
/// assert_eq!(kiln::einsum("ij->", &[&a]).item::<f32>(), 15.0);
/// assert_eq!(kiln::einsum("ii", &[&Tensor::eye(3)]).item::<f32>(), 3.0); // the trace
/// ```
#[must_use]
#[track_caller]
pub fn einsum(equation: &str, operands: &[&Tensor]) -> Tensor {
    ok(try_einsum(equation, operands))
}

/// [`einsum`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] for a malformed equation, a number of subscripts that differs from an
/// operand's rank, sizes that disagree for one letter, or more than three operands;
/// [`Error::DType`] for operands of different dtypes.
#[track_caller]
pub fn try_einsum(equation: &str, operands: &[&Tensor]) -> Result<Tensor> {
    let spec = parse(equation, operands)?;
    let mut terms: Vec<(Tensor, Vec<char>)> = Vec::new();
    for (t, labels) in operands.iter().zip(&spec.inputs) {
        terms.push(diagonalize(t, labels)?);
    }
    // Sizes must agree per letter; size 1 broadcasts only for the dimensions of `...`.
    let mut sizes: BTreeMap<char, usize> = BTreeMap::new();
    for (i, (t, labels)) in terms.iter().enumerate() {
        for (&l, &d) in labels.iter().zip(t.dims()) {
            let entry = sizes.entry(l).or_insert(d);
            if *entry != d {
                if is_ellipsis(l) && (*entry == 1 || d == 1) {
                    *entry = (*entry).max(d);
                } else {
                    return Err(Error::shape(
                        "einsum",
                        format!(
                            "{} has size {d} in operand {i} but {} elsewhere ({equation})",
                            describe(l),
                            *entry
                        ),
                    ));
                }
            }
        }
    }
    if let Some((i, t)) =
        operands.iter().enumerate().find(|(_, t)| t.dtype() != operands[0].dtype())
    {
        return Err(Error::dtype(
            "einsum",
            format!(
                "operand {i} has dtype {} but operand 0 has {}; cast them to one dtype",
                t.dtype(),
                operands[0].dtype()
            ),
        ));
    }

    let mut acc = terms.remove(0);
    for (k, next) in terms.into_iter().enumerate() {
        // Letters still needed: the output's and those of operands not yet folded in.
        let mut keep: Vec<char> = spec.output.clone();
        for later in &spec.inputs[k + 2..] {
            keep.extend(later);
        }
        acc = contract(acc, next, &keep, &sizes)?;
    }
    let (t, labels) = acc;
    let (t, labels) = sum_out(t, labels, &spec.output)?;
    let perm: Vec<i64> = spec
        .output
        .iter()
        .map(|l| {
            labels.iter().position(|x| x == l).expect("every output letter survives contraction")
                as i64
        })
        .collect();
    t.try_permute(&perm)
}

/// The letters of each operand and of the output; `...` is expanded to digit labels, counted
/// from the right so that broadcasting aligns them.
struct Spec {
    inputs: Vec<Vec<char>>,
    output: Vec<char>,
}

/// The labels of `...`'s dimensions: private-use characters, which no equation can spell
/// (subscripts are letters), so there are as many as a tensor has dimensions.
const ELLIPSIS_BASE: u32 = 0xE000;

fn is_ellipsis(l: char) -> bool {
    (ELLIPSIS_BASE..ELLIPSIS_BASE + 0x1000).contains(&u32::from(l))
}

/// A label as messages show it.
fn describe(l: char) -> String {
    if is_ellipsis(l) {
        let k = u32::from(l) - ELLIPSIS_BASE;
        format!("dimension {} from the right of '...'", k + 1)
    } else {
        format!("subscript '{l}'")
    }
}

fn parse(equation: &str, operands: &[&Tensor]) -> Result<Spec> {
    let bad = |why: String| Error::shape("einsum", format!("{why} in \"{equation}\""));
    let eq: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((_, r)) if r.contains("->") => return Err(bad("more than one '->'".into())),
        Some((l, r)) => (l.to_string(), Some(r.to_string())),
        None => (eq.clone(), None),
    };
    let parts: Vec<&str> = lhs.split(',').collect();
    if parts.len() != operands.len() {
        return Err(bad(format!(
            "{} operand subscripts for {} operands",
            parts.len(),
            operands.len()
        )));
    }
    if operands.is_empty() || operands.len() > 3 {
        return Err(bad(format!("einsum takes one to three operands, got {}", operands.len())));
    }
    let mut max_ellipsis = 0;
    let mut inputs = Vec::new();
    for (i, (part, t)) in parts.iter().zip(operands).enumerate() {
        let (letters, has_ellipsis) =
            split_ellipsis(part).ok_or_else(|| bad(format!("a malformed '...' in operand {i}")))?;
        if let Some(c) = letters.iter().flatten().find(|c| !c.is_ascii_alphabetic()) {
            return Err(bad(format!(
                "invalid subscript '{c}' in operand {i}: use letters a-z and A-Z"
            )));
        }
        let named = letters.iter().map(Vec::len).sum::<usize>();
        let rank = t.ndim();
        let fits = if has_ellipsis { named <= rank } else { named == rank };
        if !fits {
            return Err(bad(format!(
                "operand {i} has {rank} dimensions (shape {}) but {named} subscripts",
                t.shape()
            )));
        }
        let extra = rank - named;
        max_ellipsis = max_ellipsis.max(extra);
        let mut labels = letters[0].clone();
        if has_ellipsis {
            labels.extend((0..extra).rev().map(ellipsis_label));
            labels.extend(&letters[1]);
        }
        inputs.push(labels);
    }
    let ellipsis_out: Vec<char> = (0..max_ellipsis).rev().map(ellipsis_label).collect();
    let output = match rhs {
        Some(r) => {
            let (letters, has_ellipsis) =
                split_ellipsis(&r).ok_or_else(|| bad("a malformed '...' in the output".into()))?;
            let mut out = letters[0].clone();
            if has_ellipsis {
                out.extend(&ellipsis_out);
                out.extend(&letters[1]);
            }
            for (k, l) in out.iter().enumerate() {
                if !is_ellipsis(*l) && !inputs.iter().any(|inp| inp.contains(l)) {
                    return Err(bad(format!(
                        "output subscript '{l}' does not appear in any operand"
                    )));
                }
                if out[..k].contains(l) {
                    return Err(bad(format!("output subscript '{l}' appears more than once")));
                }
            }
            if let Some(c) = out.iter().find(|c| !c.is_ascii_alphabetic() && !is_ellipsis(**c)) {
                return Err(bad(format!("invalid output subscript '{c}'")));
            }
            out
        }
        None => {
            let mut counts: BTreeMap<char, usize> = BTreeMap::new();
            for l in inputs.iter().flatten().filter(|l| !is_ellipsis(**l)) {
                *counts.entry(*l).or_default() += 1;
            }
            let mut out = ellipsis_out;
            out.extend(counts.into_iter().filter(|(_, n)| *n == 1).map(|(l, _)| l));
            out
        }
    };
    Ok(Spec { inputs, output })
}

/// The label of the `k`-th `...` dimension counted from the right.
fn ellipsis_label(k: usize) -> char {
    // Below 0x1000 dimensions (no tensor has that many), every label is a valid char.
    char::from_u32(ELLIPSIS_BASE + (k as u32).min(0xFFF)).unwrap_or('\u{E000}')
}

/// The letters before and after `...` (if any), or `None` when dots are misplaced.
fn split_ellipsis(s: &str) -> Option<(Vec<Vec<char>>, bool)> {
    match s.split_once("...") {
        Some((a, b)) => {
            if a.contains('.') || b.contains('.') {
                return None;
            }
            Some((vec![a.chars().collect(), b.chars().collect()], true))
        }
        None if s.contains('.') => None,
        None => Some((vec![s.chars().collect(), Vec::new()], false)),
    }
}

/// Takes diagonals for letters repeated within one operand, leaving distinct letters.
#[track_caller]
fn diagonalize(t: &Tensor, labels: &[char]) -> Result<(Tensor, Vec<char>)> {
    let mut t = (*t).clone();
    let mut labels = labels.to_vec();
    while let Some((i, j)) = repeated(&labels) {
        if t.dims()[i] != t.dims()[j] {
            return Err(Error::shape(
                "einsum",
                format!(
                    "subscript '{}' is repeated in one operand over dimensions of sizes {} and {}",
                    labels[i],
                    t.dims()[i],
                    t.dims()[j]
                ),
            ));
        }
        t = t.restrided(|v| diagonal(v, i, j));
        labels.remove(j);
    }
    Ok((t, labels))
}

fn repeated(labels: &[char]) -> Option<(usize, usize)> {
    (0..labels.len()).find_map(|j| labels[..j].iter().position(|l| *l == labels[j]).map(|i| (i, j)))
}

/// The view of elements with equal coordinates in dimensions `i < j`, keeping dimension `i`.
fn diagonal(v: &View, i: usize, j: usize) -> View {
    let mut dims = v.shape().dims().to_vec();
    let mut strides = v.strides().to_vec();
    strides[i] += strides[j];
    dims.remove(j);
    strides.remove(j);
    View::from_parts(dims.into(), strides, v.offset())
}

/// Sums away the letters of `t` that are not in `keep`.
#[track_caller]
fn sum_out(t: Tensor, labels: Vec<char>, keep: &[char]) -> Result<(Tensor, Vec<char>)> {
    let gone: Vec<usize> = (0..labels.len()).filter(|&d| !keep.contains(&labels[d])).collect();
    if gone.is_empty() {
        return Ok((t, labels));
    }
    let kept: Vec<char> = labels.iter().filter(|l| keep.contains(l)).copied().collect();
    Ok((t.try_sum_dim(gone, false)?, kept))
}

/// Multiplies two terms and sums the letters that neither `keep` nor each other needs, as
/// one batched matmul: `[batch, left, contracted] x [batch, contracted, right]`.
#[track_caller]
fn contract(
    (a, la): (Tensor, Vec<char>),
    (b, lb): (Tensor, Vec<char>),
    keep: &[char],
    sizes: &BTreeMap<char, usize>,
) -> Result<(Tensor, Vec<char>)> {
    // Letters only one side has and nobody needs are summed before multiplying.
    let needed_a: Vec<char> = keep.iter().chain(&lb).copied().collect();
    let needed_b: Vec<char> = keep.iter().chain(&la).copied().collect();
    let (a, la) = sum_out(a, la, &needed_a)?;
    let (b, lb) = sum_out(b, lb, &needed_b)?;
    let batch: Vec<char> =
        la.iter().filter(|l| lb.contains(l) && keep.contains(l)).copied().collect();
    let contracted: Vec<char> =
        la.iter().filter(|l| lb.contains(l) && !keep.contains(l)).copied().collect();
    let left: Vec<char> = la.iter().filter(|l| !lb.contains(l)).copied().collect();
    let right: Vec<char> = lb.iter().filter(|l| !la.contains(l)).copied().collect();
    let size = |l: &char| sizes[l];
    let arrange = |t: &Tensor, labels: &[char], order: &[&[char]]| -> Result<Tensor> {
        let wanted: Vec<char> = order.iter().flat_map(|g| g.iter().copied()).collect();
        let perm: Vec<i64> = wanted
            .iter()
            .map(|l| labels.iter().position(|x| x == l).expect("partition") as i64)
            .collect();
        let full: Vec<i64> = wanted.iter().map(|l| size(l) as i64).collect();
        let grouped: Vec<i64> =
            order.iter().map(|g| g.iter().map(size).product::<usize>() as i64).collect();
        t.try_permute(&perm)?.try_expand(&full)?.try_reshape(&grouped)
    };
    let a3 = arrange(&a, &la, &[&batch, &left, &contracted])?;
    let b3 = arrange(&b, &lb, &[&batch, &contracted, &right])?;
    let product = a3.try_bmm(&b3)?;
    let labels: Vec<char> = batch.iter().chain(&left).chain(&right).copied().collect();
    let dims: Vec<i64> = labels.iter().map(|l| size(l) as i64).collect();
    Ok((product.try_reshape(&dims)?, labels))
}
