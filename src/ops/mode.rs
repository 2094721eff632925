//! `mode`: the most frequent value of each row, as an [`Opaque`] op giving its index (the
//! value is gathered from it, so it is differentiable).

use std::cmp::Ordering;
use std::sync::LazyLock;

use kiln_ir::{DType, Element, Shape};

use super::scan::along_last;
use super::{CpuInput, CpuOutput, Opaque};
use crate::error::{Result, ok};
use crate::tensor::Tensor;

/// The index PyTorch's `mode` gives for each row: of the values that occur most often (NaN
/// equals nothing, not even itself), the smallest, and its last occurrence.
fn mode_cpu<T: Element + PartialOrd>(
    inputs: &[CpuInput<'_>],
    out: &mut CpuOutput<'_>,
) -> std::result::Result<(), String> {
    let x = &inputs[0];
    let len = x.shape().last().copied().unwrap_or(1);
    let data = x.data::<T>()?;
    #[allow(clippy::eq_op)] // x != x: the NaN test for every element type
    let nan = |v: T| v != v;
    // Ascending, NaN last, ties in index order.
    let order = |a: &(T, usize), b: &(T, usize)| match (nan(a.0), nan(b.0)) {
        (false, false) => a.0.partial_cmp(&b.0).unwrap_or(Ordering::Equal).then(a.1.cmp(&b.1)),
        (nan_a, nan_b) => nan_a.cmp(&nan_b).then(a.1.cmp(&b.1)),
    };
    let start = out.start();
    let mut row: Vec<(T, usize)> = Vec::with_capacity(len);
    for (k, at) in out.values::<i64>()?.iter_mut().enumerate() {
        let first = (start + k) * len;
        row.clear();
        row.extend((0..len).map(|j| (data[x.position_of(first + j)], j)));
        row.sort_by(order);
        let (mut best, mut best_count) = (0usize, 0usize);
        let mut i = 0;
        while i < row.len() {
            let mut end = i + 1;
            while end < row.len() && !nan(row[i].0) && row[end].0 == row[i].0 {
                end += 1;
            }
            if end - i > best_count {
                // The run's last element has its largest index (ties were kept in order).
                (best, best_count) = (row[end - 1].1, end - i);
            }
            i = end;
        }
        *at = best as i64;
    }
    Ok(())
}

static MODE: LazyLock<Opaque> = LazyLock::new(|| {
    Opaque::builder("mode", 1, |inputs, out| match inputs[0].dtype() {
        DType::F32 => mode_cpu::<f32>(inputs, out),
        DType::F64 => mode_cpu::<f64>(inputs, out),
        DType::F16 => mode_cpu::<half::f16>(inputs, out),
        DType::BF16 => mode_cpu::<half::bf16>(inputs, out),
        DType::I64 => mode_cpu::<i64>(inputs, out),
        DType::I32 => mode_cpu::<i32>(inputs, out),
        DType::I8 => mode_cpu::<i8>(inputs, out),
        DType::U8 => mode_cpu::<u8>(inputs, out),
        DType::Bool => mode_cpu::<bool>(inputs, out),
    })
    .shape(|inputs| {
        let d = inputs[0].0.dims();
        if d.last() == Some(&0) {
            return Err("a row of no elements has no mode".into());
        }
        Ok((Shape::new(d[..d.len() - 1].to_vec()), DType::I64))
    })
    .host_on_gpu()
    .build()
});

impl Tensor {
    /// The most frequent value along `dim` and its index (PyTorch's `mode`): of equally
    /// frequent values the smallest, at its last occurrence; NaN counts once each. `keepdim`
    /// keeps `dim` with size 1. The values are differentiable (through their indices).
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![2i64, 2, 1, 1, 1, 2, 3, 3, 0], [3, 3]);
    /// let (values, indices) = x.mode(1, false);
    /// assert_eq!(values.to_vec::<i64>(), [2, 1, 3]);
    /// assert_eq!(indices.to_vec::<i64>(), [1, 1, 1]);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_mode`] fails.
    #[must_use]
    #[track_caller]
    pub fn mode(&self, dim: i64, keepdim: bool) -> (Tensor, Tensor) {
        ok(self.try_mode(dim, keepdim))
    }

    /// [`Tensor::mode`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`crate::Error::Index`] when `dim` is out of range, [`crate::Error::Shape`] when it
    /// has size 0.
    #[track_caller]
    pub fn try_mode(&self, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
        // The op drops the last dimension; put it back as size 1 to move it home.
        let indices = along_last("mode", self, dim, |x| MODE.try_call(&[x])?.try_unsqueeze(-1))?;
        let values = if self.ndim() == 0 { self.clone() } else { self.try_gather(dim, &indices)? };
        if keepdim || self.ndim() == 0 {
            return Ok((values, indices));
        }
        Ok((values.try_squeeze(dim)?, indices.try_squeeze(dim)?))
    }
}
