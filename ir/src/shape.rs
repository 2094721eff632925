//! Shapes, dimension normalization and NumPy broadcasting.

use smallvec::SmallVec;
use std::fmt;

use crate::{DType, IrError};

/// The extent of each dimension of a tensor, outermost first. `[]` is a scalar.
///
/// Anything that lists dimensions converts into a `Shape`: `[2, 3]`, `&[2, 3][..]`,
/// `vec![2, 3]`, and `()` for a scalar.
///
/// ```
/// use kiln_ir::Shape;
/// let s = Shape::from([2, 3, 4]);
/// assert_eq!(s.numel(), 24);
/// assert_eq!(s.contiguous_strides(), vec![12, 4, 1]);
/// assert_eq!(Shape::from(()).numel(), 1);
/// ```
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape(Dims);

/// A shape's dimensions: up to four inline (every shape kiln records is one per op, and most
/// have four or fewer), more on the heap.
type Dims = SmallVec<[usize; 4]>;

impl Shape {
    /// A shape from its dimensions.
    pub fn new(dims: Vec<usize>) -> Shape {
        Shape(Dims::from_vec(dims))
    }

    /// The dimensions, outermost first.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// The number of elements: the product of the dimensions (1 for a scalar). It saturates
    /// at `usize::MAX` instead of wrapping; every shape kiln records has passed
    /// [`Shape::check_size`], so for those it is exact.
    pub fn numel(&self) -> usize {
        self.checked_numel().unwrap_or(usize::MAX)
    }

    /// How many leading dimensions multiply to `rows` (size-1 dimensions after them are not
    /// counted), or `None` when no prefix does: where a domain splits into `rows` rows.
    ///
    /// ```
    /// use kiln_ir::Shape;
    /// let s = Shape::new(vec![4, 3, 5]);
    /// assert_eq!((s.leading_dims(12), s.leading_dims(4), s.leading_dims(6)), (Some(2), Some(1), None));
    /// ```
    pub fn leading_dims(&self, rows: usize) -> Option<usize> {
        let mut product = 1;
        for (i, &d) in self.0.iter().enumerate() {
            if product == rows {
                return Some(i);
            }
            product *= d;
        }
        (product == rows).then_some(self.0.len())
    }

    /// The number of elements, or `None` when the product overflows `usize`.
    pub fn checked_numel(&self) -> Option<usize> {
        if self.0.contains(&0) {
            return Some(0);
        }
        self.0.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
    }

    /// Checks that a tensor of this shape and `dtype` could exist: its element count and byte
    /// size fit in `isize` (the most any allocation can hold), with an error for `op` that
    /// names the shape otherwise.
    pub fn check_size(&self, op: &'static str, dtype: DType) -> Result<(), IrError> {
        let bytes = self.checked_numel().and_then(|n| n.checked_mul(dtype.size_in_bytes()));
        match bytes {
            Some(b) if b <= isize::MAX as usize => Ok(()),
            _ => Err(IrError::shape(
                op,
                format!(
                    "a tensor of shape {self} and dtype {dtype} would hold more than {} bytes, more than any memory can address",
                    isize::MAX
                ),
            )),
        }
    }

    /// The row-major strides of a dense tensor of this shape, in elements.
    pub fn contiguous_strides(&self) -> Vec<isize> {
        let mut strides = vec![0isize; self.rank()];
        let mut acc = 1isize;
        for (s, &d) in strides.iter_mut().zip(&self.0).rev() {
            *s = acc;
            acc = acc.saturating_mul(d.max(1) as isize);
        }
        strides
    }

    /// Turns a possibly negative dimension into an index in `0..rank` (`-1` is the last),
    /// or an error naming `op`, the dimension and the valid range.
    pub fn normalize_dim(&self, op: &'static str, dim: i64) -> Result<usize, IrError> {
        normalize_axis(op, dim, self.rank())
    }

    /// The shape both `self` and `other` broadcast to under NumPy's rules: dimensions are
    /// aligned from the right, and each pair must be equal or contain a 1.
    pub fn broadcast(&self, other: &Shape, op: &'static str) -> Result<Shape, IrError> {
        let rank = self.rank().max(other.rank());
        let mut dims: Dims = smallvec::smallvec![0; rank];
        for (i, d) in dims.iter_mut().enumerate() {
            let a = self.dim_from_right(rank - 1 - i);
            let b = other.dim_from_right(rank - 1 - i);
            *d = match (a, b) {
                (a, b) if a == b => a,
                (1, b) => b,
                (a, 1) => a,
                (a, b) => {
                    return Err(IrError::shape(
                        op,
                        format!(
                            "shapes {self} and {other} cannot be broadcast together: dimension {i} of the result would need {a} and {b} to agree (sizes must be equal, or one of them 1)"
                        ),
                    ));
                }
            };
        }
        Ok(Shape(dims))
    }

    /// The `k`-th dimension counted from the right (0 is the last); 1 past the rank.
    fn dim_from_right(&self, k: usize) -> usize {
        if k < self.rank() { self.0[self.rank() - 1 - k] } else { 1 }
    }
}

/// Turns a possibly negative axis into an index in `0..rank`.
pub fn normalize_axis(op: &'static str, dim: i64, rank: usize) -> Result<usize, IrError> {
    let r = rank as i64;
    let d = if dim < 0 { dim + r } else { dim };
    if (0..r).contains(&d) {
        Ok(d as usize)
    } else {
        let range = if rank == 0 {
            "a scalar has no dimensions to index".to_string()
        } else {
            format!("expected a dimension in -{r}..={}", r - 1)
        };
        Err(IrError::index(
            op,
            format!("dimension {dim} is out of range for a tensor of rank {rank}: {range}"),
        ))
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl From<()> for Shape {
    fn from(_: ()) -> Shape {
        Shape(Dims::new())
    }
}

impl From<usize> for Shape {
    fn from(d: usize) -> Shape {
        Shape(smallvec::smallvec![d])
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(d: [usize; N]) -> Shape {
        Shape(Dims::from_slice(&d))
    }
}

impl<const N: usize> From<&[usize; N]> for Shape {
    fn from(d: &[usize; N]) -> Shape {
        Shape(Dims::from_slice(d))
    }
}

impl From<&[usize]> for Shape {
    fn from(d: &[usize]) -> Shape {
        Shape(Dims::from_slice(d))
    }
}

impl From<Vec<usize>> for Shape {
    fn from(d: Vec<usize>) -> Shape {
        Shape(Dims::from_vec(d))
    }
}

impl From<&Vec<usize>> for Shape {
    fn from(d: &Vec<usize>) -> Shape {
        Shape(Dims::from_slice(d))
    }
}

impl From<&Shape> for Shape {
    fn from(s: &Shape) -> Shape {
        s.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_follows_numpy() {
        let b = |a: &[usize], c: &[usize]| Shape::from(a).broadcast(&Shape::from(c), "add");
        assert_eq!(b(&[3, 1], &[4]).unwrap(), Shape::from([3, 4]));
        assert_eq!(b(&[], &[2, 3]).unwrap(), Shape::from([2, 3]));
        assert_eq!(b(&[5, 1, 7], &[6, 1]).unwrap(), Shape::from([5, 6, 7]));
        assert_eq!(b(&[0, 1], &[3]).unwrap(), Shape::from([0, 3]));
        let err = b(&[2, 3], &[4, 3]).unwrap_err().to_string();
        assert!(err.starts_with("add: shapes [2, 3] and [4, 3] cannot be broadcast"), "{err}");
    }

    #[test]
    fn normalize_dim_counts_from_the_end() {
        let s = Shape::from([2, 3, 4]);
        assert_eq!(s.normalize_dim("sum", -1).unwrap(), 2);
        assert_eq!(s.normalize_dim("sum", 0).unwrap(), 0);
        let err = s.normalize_dim("sum", 3).unwrap_err().to_string();
        assert_eq!(
            err,
            "sum: dimension 3 is out of range for a tensor of rank 3: expected a dimension in -3..=2"
        );
    }
}
