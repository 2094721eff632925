//! `scatter_reduce`: PyTorch's scatter with a reduction (`sum`, `prod`, `mean`, `amax`,
//! `amin`), with or without the destination's own values, as [`Opaque`] ops over rows (the
//! scattered dimension moved last) and PyTorch's gradients written with kiln ops.

use std::sync::LazyLock;

use kiln_ir::{DType, Element, Scalar};

use super::scan::along_last;
use super::{CpuInput, CpuOutput, Opaque, Split};
use crate::error::{Error, Result, ok};
use crate::tensor::Tensor;

/// How [`Tensor::scatter_reduce`] combines the values that land on one position
/// (PyTorch's `reduce` argument).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScatterReduce {
    /// Their sum (`"sum"`).
    Sum,
    /// Their product (`"prod"`).
    Prod,
    /// Their mean (`"mean"`; integers round down).
    Mean,
    /// Their maximum (`"amax"`; NaN wins).
    Amax,
    /// Their minimum (`"amin"`; NaN wins).
    Amin,
}

impl ScatterReduce {
    const ALL: [ScatterReduce; 5] = [
        ScatterReduce::Sum,
        ScatterReduce::Prod,
        ScatterReduce::Mean,
        ScatterReduce::Amax,
        ScatterReduce::Amin,
    ];

    fn name(self) -> &'static str {
        match self {
            ScatterReduce::Sum => "scatter_reduce(sum)",
            ScatterReduce::Prod => "scatter_reduce(prod)",
            ScatterReduce::Mean => "scatter_reduce(mean)",
            ScatterReduce::Amax => "scatter_reduce(amax)",
            ScatterReduce::Amin => "scatter_reduce(amin)",
        }
    }
}

/// The arithmetic a reduction needs, in f64 for floats and i64 (wrapping) for integers.
trait Accumulate: Copy + PartialOrd {
    fn of(s: Scalar) -> Self;
    fn to(self) -> Scalar;
    fn combine(self, v: Self, how: ScatterReduce) -> Self;
    fn mean(self, count: usize) -> Self;
}

impl Accumulate for f64 {
    fn of(s: Scalar) -> f64 {
        s.to_f64()
    }
    fn to(self) -> Scalar {
        Scalar::F64(self)
    }
    fn combine(self, v: f64, how: ScatterReduce) -> f64 {
        match how {
            ScatterReduce::Sum | ScatterReduce::Mean => self + v,
            ScatterReduce::Prod => self * v,
            _ if self.is_nan() || v.is_nan() => f64::NAN,
            ScatterReduce::Amax => self.max(v),
            ScatterReduce::Amin => self.min(v),
        }
    }
    fn mean(self, count: usize) -> f64 {
        self / count as f64
    }
}

impl Accumulate for i64 {
    fn of(s: Scalar) -> i64 {
        s.to_i64()
    }
    fn to(self) -> Scalar {
        Scalar::I64(self)
    }
    fn combine(self, v: i64, how: ScatterReduce) -> i64 {
        match how {
            ScatterReduce::Sum | ScatterReduce::Mean => self.wrapping_add(v),
            ScatterReduce::Prod => self.wrapping_mul(v),
            ScatterReduce::Amax => self.max(v),
            ScatterReduce::Amin => self.min(v),
        }
    }
    fn mean(self, count: usize) -> i64 {
        self.div_euclid(count as i64)
    }
}

/// Each output row: its own values (or none, without `include_self`), then every value of
/// the matching rows of `index` and `src` reduced into the position its index names.
fn scatter_cpu<T: Element, A: Accumulate>(
    inputs: &[CpuInput<'_>],
    out: &mut CpuOutput<'_>,
    how: ScatterReduce,
    include_self: bool,
) -> std::result::Result<(), String> {
    let (me, index, src) = (&inputs[0], &inputs[1], &inputs[2]);
    let len = me.shape().last().copied().unwrap_or(1).max(1);
    let (lead, width) =
        (&index.shape()[..index.shape().len() - 1], index.shape()[index.shape().len() - 1]);
    let (mine, ids, values) = (me.data::<T>()?, index.data::<i64>()?, src.data::<T>()?);
    let mut acc: Vec<Option<A>> = vec![None; len];
    let mut counts = vec![0usize; len];
    let start = out.start();
    for (k, row) in out.values::<T>()?.chunks_mut(len).enumerate() {
        let first = start + k * len;
        for (j, a) in acc.iter_mut().enumerate() {
            *a = include_self.then(|| A::of(mine[me.position_of(first + j)].to_scalar()));
        }
        counts.fill(usize::from(include_self));
        // The row's place among the leading dimensions, and the index row there if any.
        let mut at = Vec::with_capacity(lead.len() + 1);
        let mut rest = first / len;
        for &d in me.shape()[..me.shape().len() - 1].iter().rev() {
            at.push(rest % d);
            rest /= d;
        }
        at.reverse();
        if at.iter().zip(lead).all(|(&i, &n)| i < n) {
            at.push(0);
            for j in 0..width {
                *at.last_mut().expect("a last dimension") = j;
                let target = ids[index.position(&at)];
                let t = usize::try_from(target).ok().filter(|&t| t < len).ok_or_else(|| {
                    format!("index {target} is out of bounds for a dimension of size {len}")
                })?;
                let v = A::of(values[src.position(&at)].to_scalar());
                acc[t] = Some(match acc[t] {
                    Some(a) => a.combine(v, how),
                    None => v,
                });
                counts[t] += 1;
            }
        }
        for (j, v) in row.iter_mut().enumerate() {
            *v = match acc[j] {
                Some(a) if how == ScatterReduce::Mean && counts[j] > 0 => {
                    T::from_scalar(a.mean(counts[j]).to())
                }
                Some(a) => T::from_scalar(a.to()),
                None => mine[me.position_of(first + j)],
            };
        }
    }
    Ok(())
}

fn scatter_op(how: ScatterReduce, include_self: bool) -> Opaque {
    Opaque::builder(how.name(), 3, move |inputs, out| match out.dtype() {
        DType::F32 => scatter_cpu::<f32, f64>(inputs, out, how, include_self),
        DType::F64 => scatter_cpu::<f64, f64>(inputs, out, how, include_self),
        DType::I64 => scatter_cpu::<i64, i64>(inputs, out, how, include_self),
        DType::I32 => scatter_cpu::<i32, i64>(inputs, out, how, include_self),
        DType::I8 => scatter_cpu::<i8, i64>(inputs, out, how, include_self),
        DType::U8 => scatter_cpu::<u8, i64>(inputs, out, how, include_self),
        d => Err(format!("computes f32, f64 and integer tensors, not {d}")),
    })
    .split(Split::Rows)
    .host_on_gpu()
    .backward(move |saved, grad| {
        let [me, index, src] = saved.inputs() else { unreachable!("three inputs") };
        let (me_grad, src_grad) =
            gradients(how, include_self, me, index, src, saved.output(), grad)?;
        Ok(vec![Some(me_grad), None, Some(src_grad)])
    })
    .build()
}

/// PyTorch's gradients of `scatter_reduce` along the last dimension (`scatter_reduce_backward`).
fn gradients(
    how: ScatterReduce,
    include_self: bool,
    me: &Tensor,
    index: &Tensor,
    src: &Tensor,
    result: &Tensor,
    grad: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let ones = src.ones_like();
    let (me_grad, src_grad) = match how {
        ScatterReduce::Sum => (grad.clone(), grad.try_gather(-1, index)?),
        ScatterReduce::Mean => {
            let start = if include_self { grad.ones_like() } else { grad.zeros_like() };
            let n = start.try_scatter_add(-1, index, &ones)?;
            let n = Tensor::try_where_(&n.eq(0.0), 1.0, &n)?;
            (grad.try_div(&n)?, grad.try_gather(-1, index)?.try_div(&n.try_gather(-1, index)?)?)
        }
        ScatterReduce::Amax | ScatterReduce::Amin => {
            // Shared evenly among every value equal to the result.
            let value = result.try_gather(-1, index)?;
            let me_is = me.eq(result).to_dtype(me.dtype());
            let src_is = src.eq(&value).to_dtype(me.dtype());
            let share = grad.try_div(&me_is.try_scatter_add(-1, index, &src_is)?)?;
            (me_is.try_mul(&share)?, src_is.try_mul(&share.try_gather(-1, index)?)?)
        }
        ScatterReduce::Prod => {
            // The product of the others, computed without dividing by a zero.
            let me_safe = Tensor::try_where_(&me.eq(0.0), 1.0, me)?;
            let op = &SCATTER_OPS[position(how)][usize::from(include_self)];
            let others = op.try_call(&[&me_safe, index, src])?;
            let me_grad = grad.try_mul(&others)?.try_div(&me_safe)?;
            let zero = src.eq(0.0);
            let zeros_there = grad
                .zeros_like()
                .try_scatter_add(-1, index, &zero.to_dtype(src.dtype()))?
                .try_gather(-1, index)?;
            let single = zero.logical_and(zeros_there.eq(1.0));
            let src_safe = Tensor::try_where_(&single, 1.0, src)?;
            let without = op.try_call(&[me, index, &src_safe])?;
            let divided = grad
                .try_mul(result)?
                .try_gather(-1, index)?
                .try_div(&Tensor::try_where_(&zero, 1.0, src)?)?;
            let src_grad = Tensor::try_where_(
                &single,
                grad.try_mul(&without)?.try_gather(-1, index)?,
                &divided,
            )?;
            (me_grad, src_grad)
        }
    };
    if include_self {
        return Ok((me_grad, src_grad));
    }
    // Positions that received values did not use their own.
    let hit = grad.zeros_like().try_scatter_add(-1, index, &ones)?.gt(0.0);
    Ok((Tensor::try_where_(&hit, 0.0, &me_grad)?, src_grad))
}

fn position(how: ScatterReduce) -> usize {
    ScatterReduce::ALL.iter().position(|&h| h == how).expect("every reduction is in ALL")
}

/// One op per reduction, without and with `include_self`.
static SCATTER_OPS: LazyLock<Vec<[Opaque; 2]>> = LazyLock::new(|| {
    ScatterReduce::ALL.iter().map(|&how| [scatter_op(how, false), scatter_op(how, true)]).collect()
});

impl Tensor {
    /// A copy where the values of `src` are reduced, with `reduce`, into the positions
    /// `index` names along `dim` (PyTorch's `scatter_reduce`): position `i` of `dim` in the
    /// result combines `self`'s value there (unless `include_self` is false) with every
    /// `src[p]` whose `index[p]` is `i`; positions nothing lands on keep `self`'s value.
    /// `index` has `self`'s rank and sizes no larger than `src`'s (and than `self`'s away
    /// from `dim`); only that corner of `src` is read. Gradients are PyTorch's (shared
    /// evenly among tied extremes; products of the others for `prod`).
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// use kiln::ScatterReduce;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]);
    /// let index = Tensor::from_vec(vec![0i64, 0, 2, 2], [4]);
    /// let src = Tensor::from_vec(vec![5.0f32, 7.0, -1.0, 4.0], [4]);
    /// let y = x.scatter_reduce(0, &index, &src, ScatterReduce::Amax, true);
    /// assert_eq!(y.to_vec::<f32>(), [7.0, 2.0, 4.0]);
    /// let y = x.scatter_reduce(0, &index, &src, ScatterReduce::Mean, false);
    /// assert_eq!(y.to_vec::<f32>(), [6.0, 2.0, 1.5]);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_scatter_reduce`] fails.
    #[must_use]
    #[track_caller]
    pub fn scatter_reduce(
        &self,
        dim: i64,
        index: &Tensor,
        src: &Tensor,
        reduce: ScatterReduce,
        include_self: bool,
    ) -> Tensor {
        ok(self.try_scatter_reduce(dim, index, src, reduce, include_self))
    }

    /// [`Tensor::scatter_reduce`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] when the ranks or sizes do not fit, [`Error::DType`] for an index
    /// that is not `i64` or a `src` of another dtype, [`Error::Index`] for an out-of-range
    /// `dim`; an index out of range fails the run, naming it.
    #[track_caller]
    pub fn try_scatter_reduce(
        &self,
        dim: i64,
        index: &Tensor,
        src: &Tensor,
        reduce: ScatterReduce,
        include_self: bool,
    ) -> Result<Tensor> {
        let op = "scatter_reduce";
        let axis = kiln_ir::normalize_axis(op, dim, self.ndim().max(1))?;
        if index.dtype() != DType::I64 || src.dtype() != self.dtype() {
            return Err(Error::dtype(
                op,
                format!(
                    "takes an i64 index and a src of self's dtype {}, got {} and {}",
                    self.dtype(),
                    index.dtype(),
                    src.dtype()
                ),
            ));
        }
        let (d, i, s) = (self.dims(), index.dims(), src.dims());
        let fits = i.len() == d.len()
            && s.len() == d.len()
            && (0..d.len()).all(|k| i[k] <= s[k] && (k == axis || i[k] <= d[k]));
        if !fits {
            return Err(Error::shape(
                op,
                format!(
                    "index {} must have the rank of self {} and of src {}, sizes no larger than \
                     src's, and no larger than self's except along dim {axis}",
                    index.shape(),
                    self.shape(),
                    src.shape()
                ),
            ));
        }
        let mut src = src.clone();
        for (k, &n) in i.iter().enumerate() {
            src = src.try_narrow(k as i64, 0, n)?;
        }
        let ops = &SCATTER_OPS[position(reduce)][usize::from(include_self)];
        let index_last = index.try_movedim(dim, -1)?;
        let src_last = src.try_movedim(dim, -1)?;
        along_last(op, self, dim, |me| ops.try_call(&[me, &index_last, &src_last]))
    }
}
