//! Rearrangements with PyTorch's names and semantics, composed of views, gathers and
//! elementwise ops (so they differentiate): `repeat_interleave`, `diag`, `take_along_dim`,
//! `rot90` and `meshgrid`.

use kiln_ir::normalize_axis;

use super::Tensor;
use crate::error::ok;
use crate::{Error, Result};

/// How [`Tensor::meshgrid`] lays out its grids (PyTorch's `indexing`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Indexing {
    /// Matrix indexing: grid `i` varies along dimension `i`.
    #[default]
    Ij,
    /// Cartesian indexing: the first two grids swap their dimensions (NumPy's default).
    Xy,
}

impl Tensor {
    /// Each element repeated `repeats` times along `dim` (over the flattened tensor for
    /// `None`): PyTorch's `repeat_interleave` with a count.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![1i64, 2, 3, 4], [2, 2]);
    /// assert_eq!(x.repeat_interleave(2, Some(1)).to_vec::<i64>(), [1, 1, 2, 2, 3, 3, 4, 4]);
    /// assert_eq!(x.repeat_interleave(2, None).dims(), [8]);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_repeat_interleave`] fails.
    #[must_use]
    #[track_caller]
    pub fn repeat_interleave(&self, repeats: usize, dim: Option<i64>) -> Tensor {
        ok(self.try_repeat_interleave(repeats, dim))
    }

    /// [`Tensor::repeat_interleave`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] for a dimension out of range.
    #[track_caller]
    pub fn try_repeat_interleave(&self, repeats: usize, dim: Option<i64>) -> Result<Tensor> {
        let Some(dim) = dim else {
            return self.try_reshape(&[-1])?.try_repeat_interleave(repeats, Some(0));
        };
        let d = normalize_axis("repeat_interleave", dim, self.ndim())?;
        let mut expanded: Vec<i64> = self.dims().iter().map(|&n| n as i64).collect();
        let mut out = expanded.clone();
        expanded.insert(d + 1, repeats as i64);
        out[d] *= repeats as i64;
        self.try_unsqueeze(d as i64 + 1)?.try_expand(&expanded)?.try_reshape(&out)
    }

    /// A vector as the `diagonal`-th diagonal of a square matrix (zeros elsewhere), or a
    /// matrix's `diagonal`-th diagonal as a vector (above the main one for positive
    /// `diagonal`): PyTorch's `diag`.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let v = Tensor::from_vec(vec![1.0f32, 2.0], [2]);
    /// assert_eq!(v.diag(1).to_vec::<f32>(), [0.0, 1.0, 0.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0]);
    /// assert_eq!(v.diag(1).diag(1).to_vec::<f32>(), [1.0, 2.0]);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_diag`] fails.
    #[must_use]
    #[track_caller]
    pub fn diag(&self, diagonal: i64) -> Tensor {
        ok(self.try_diag(diagonal))
    }

    /// [`Tensor::diag`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] unless the tensor is 1-D or 2-D.
    #[track_caller]
    pub fn try_diag(&self, diagonal: i64) -> Result<Tensor> {
        let k = diagonal.unsigned_abs() as usize;
        match *self.dims() {
            [n] => {
                let m = (n + k) as i64;
                let padded =
                    Tensor::try_cat(&[self, &Tensor::zeros([k]).to_dtype(self.dtype())], 0)?;
                let rows = Tensor::try_arange(0i64, m, 1)?.try_reshape(&[m, 1])?;
                let cols = Tensor::try_arange(0i64, m, 1)?.try_reshape(&[1, m])?;
                let on = cols.try_sub(&rows)?.eq(diagonal as f64);
                // Row r holds element r above the main diagonal, column c below it.
                let values = if diagonal >= 0 {
                    padded.try_reshape(&[m, 1])?
                } else {
                    padded.try_reshape(&[1, m])?
                };
                Tensor::try_where_(&on, &values, 0.0)
            }
            [r, c] => {
                let (r0, c0) = if diagonal >= 0 { (0, k.min(c)) } else { (k.min(r), 0) };
                let len = (r - r0).min(c - c0);
                let square = self.try_narrow(0, r0, len)?.try_narrow(1, c0, len)?;
                crate::try_einsum("ii->i", &[&square])
            }
            _ => Err(Error::shape(
                "diag",
                format!("takes a vector or a matrix, got shape {}", self.shape()),
            )),
        }
    }

    /// The elements at `indices` along `dim`, the other dimensions broadcast between the
    /// two (PyTorch's `take_along_dim`; `gather` without the broadcasting): with the
    /// indices of `topk` or `argsort`, their values.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![10.0f32, 30.0, 20.0, 5.0, 1.0, 7.0], [2, 3]);
    /// let i = x.argsort(1, true).narrow(1, 0, 1);
    /// assert_eq!(x.take_along_dim(&i, 1).to_vec::<f32>(), [30.0, 7.0]);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_take_along_dim`] fails.
    #[must_use]
    #[track_caller]
    pub fn take_along_dim(&self, indices: &Tensor, dim: i64) -> Tensor {
        ok(self.try_take_along_dim(indices, dim))
    }

    /// [`Tensor::take_along_dim`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] when the ranks differ or the other dimensions do not broadcast;
    /// [`Error::Index`] (when computed) for an index out of range.
    #[track_caller]
    pub fn try_take_along_dim(&self, indices: &Tensor, dim: i64) -> Result<Tensor> {
        let d = normalize_axis("take_along_dim", dim, self.ndim())?;
        if indices.ndim() != self.ndim() {
            return Err(Error::shape(
                "take_along_dim",
                format!("indices of shape {} need the rank of {}", indices.shape(), self.shape()),
            ));
        }
        let (mut xs, mut is) = (Vec::new(), Vec::new());
        for (i, (&a, &b)) in self.dims().iter().zip(indices.dims()).enumerate() {
            let both = if i == d {
                (a, b)
            } else if a == b || b == 1 {
                (a, a)
            } else if a == 1 {
                (b, b)
            } else {
                return Err(Error::shape(
                    "take_along_dim",
                    format!(
                        "input {} and indices {} do not broadcast outside dimension {d}",
                        self.shape(),
                        indices.shape()
                    ),
                ));
            };
            xs.push(both.0 as i64);
            is.push(both.1 as i64);
        }
        self.try_expand(&xs)?.try_gather(d as i64, &indices.try_expand(&is)?)
    }

    /// Rotated by 90° `k` times in the plane of `dims`, from the first toward the second
    /// (PyTorch's `rot90`).
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![1i64, 2, 3, 4], [2, 2]);
    /// assert_eq!(x.rot90(1, [0, 1]).to_vec::<i64>(), [2, 4, 1, 3]);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_rot90`] fails.
    #[must_use]
    #[track_caller]
    pub fn rot90(&self, k: i64, dims: [i64; 2]) -> Tensor {
        ok(self.try_rot90(k, dims))
    }

    /// [`Tensor::rot90`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] for dimensions out of range or equal.
    #[track_caller]
    pub fn try_rot90(&self, k: i64, dims: [i64; 2]) -> Result<Tensor> {
        let (a, b) = (
            normalize_axis("rot90", dims[0], self.ndim())?,
            normalize_axis("rot90", dims[1], self.ndim())?,
        );
        if a == b {
            return Err(Error::shape("rot90", format!("needs two different dims, got {dims:?}")));
        }
        let (a, b) = (a as i64, b as i64);
        match k.rem_euclid(4) {
            1 => self.try_flip(&[b])?.try_transpose(a, b),
            2 => self.try_flip(&[a, b]),
            3 => self.try_flip(&[a])?.try_transpose(a, b),
            _ => Ok(self.clone()),
        }
    }

    /// Coordinate grids of 1-D tensors (PyTorch's `meshgrid`): each expanded to the shape
    /// `[n0, n1, ..]` (views), varying along its own dimension ([`Indexing::Ij`]) or with the
    /// first two swapped ([`Indexing::Xy`]).
    ///
    /// ```
    /// use kiln::prelude::*;
    /// use kiln::Indexing;
    /// let (x, y) = (Tensor::arange(0i64, 3, 1), Tensor::arange(0i64, 2, 1));
    /// let g = Tensor::meshgrid(&[&x, &y], Indexing::Ij);
    /// assert_eq!(g[0].to_vec::<i64>(), [0, 0, 1, 1, 2, 2]);
    /// assert_eq!(Tensor::meshgrid(&[&x, &y], Indexing::Xy)[0].dims(), [2, 3]);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_meshgrid`] fails.
    #[must_use]
    #[track_caller]
    pub fn meshgrid(tensors: &[&Tensor], indexing: Indexing) -> Vec<Tensor> {
        ok(Tensor::try_meshgrid(tensors, indexing))
    }

    /// [`Tensor::meshgrid`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] unless every tensor is 1-D.
    #[track_caller]
    pub fn try_meshgrid(tensors: &[&Tensor], indexing: Indexing) -> Result<Vec<Tensor>> {
        if let Some(t) = tensors.iter().find(|t| t.ndim() != 1) {
            return Err(Error::shape(
                "meshgrid",
                format!("takes 1-D tensors, got one of shape {}", t.shape()),
            ));
        }
        let swap = indexing == Indexing::Xy && tensors.len() >= 2;
        // The output dimension each tensor varies along.
        let axis = |i: usize| match (swap, i) {
            (true, 0) => 1,
            (true, 1) => 0,
            _ => i,
        };
        let mut shape = vec![0i64; tensors.len()];
        for (i, t) in tensors.iter().enumerate() {
            shape[axis(i)] = t.dims()[0] as i64;
        }
        tensors
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let mut own = vec![1i64; tensors.len()];
                own[axis(i)] = shape[axis(i)];
                t.try_reshape(&own)?.try_expand(&shape)
            })
            .collect()
    }
}
