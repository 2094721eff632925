//! Views: how a tensor's elements sit in a flat buffer (shape, strides, offset).

use std::fmt;

use crate::Shape;

/// The layout of a tensor inside a flat, row-major buffer: element `[i0, i1, ..]` lives at
/// `offset + i0 * strides[0] + i1 * strides[1] + ..`. A broadcast dimension has stride 0.
///
/// Movement ops (`permute`, `expand`, `narrow`, `reshape`, ...) compose views without touching
/// data; [`View::reshape`] returns `None` when the new shape cannot be expressed as strides
/// over the same buffer (a permuted tensor flattened, for example), which is when a copy is
/// needed. The constructors keep every reachable offset inside the buffer the view was made
/// for.
///
/// ```
/// use kiln_ir::{Shape, View};
/// let v = View::contiguous(Shape::from([2, 3])).permute(&[1, 0]);
/// assert_eq!(v.strides(), &[1, 3]);
/// assert!(!v.is_contiguous());
/// assert!(v.reshape(&Shape::from([6])).is_none());
/// assert_eq!(v.offsets().collect::<Vec<_>>(), vec![0, 3, 1, 4, 2, 5]);
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct View {
    shape: Shape,
    strides: Vec<isize>,
    offset: usize,
}

impl View {
    /// The dense row-major view of `shape` at offset 0.
    pub fn contiguous(shape: Shape) -> View {
        let strides = shape.contiguous_strides();
        View { shape, strides, offset: 0 }
    }

    /// A view from its parts. The caller guarantees that every element's offset is
    /// inside the buffer it will index.
    pub fn from_parts(shape: Shape, strides: Vec<isize>, offset: usize) -> View {
        assert_eq!(shape.rank(), strides.len(), "a view needs one stride per dimension");
        View { shape, strides, offset }
    }

    /// The logical shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The stride of each dimension, in elements.
    pub fn strides(&self) -> &[isize] {
        &self.strides
    }

    /// The offset of element `[0, 0, ..]`, in elements.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Whether the elements are dense and in row-major order, as PyTorch's `is_contiguous`
    /// decides it: strides of dimensions of size 1 do not matter.
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1isize;
        for (&d, &s) in self.shape.dims().iter().zip(&self.strides).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected *= d as isize;
        }
        true
    }

    /// Whether every element sits at its own offset (no broadcast or otherwise overlapping
    /// dimensions), so that writing through the view is well defined.
    pub fn is_non_overlapping(&self) -> bool {
        let mut dims: Vec<(usize, usize)> = self
            .shape
            .dims()
            .iter()
            .zip(&self.strides)
            .filter(|(d, _)| **d > 1)
            .map(|(&d, &s)| (s.unsigned_abs(), d))
            .collect();
        dims.sort_unstable();
        let mut reach = 0usize; // the largest offset difference the smaller dims span
        for (stride, size) in dims {
            if stride <= reach {
                return false;
            }
            reach += stride * (size - 1);
        }
        true
    }

    /// Whether this view reads all of a dense buffer of `shape` in order: the identity.
    pub fn is_identity_of(&self, shape: &Shape) -> bool {
        self.offset == 0 && &self.shape == shape && self.is_contiguous()
    }

    /// Whether this view reads all of a dense buffer of `numel` elements in order, under any
    /// shape: a reshape that can share the buffer instead of copying it.
    pub fn is_dense_over(&self, numel: usize) -> bool {
        self.offset == 0 && self.shape.numel() == numel && self.is_contiguous()
    }

    /// Reorders the dimensions: dimension `i` of the result is dimension `perm[i]` of `self`.
    /// `perm` must be a permutation of `0..rank`.
    pub fn permute(&self, perm: &[usize]) -> View {
        View {
            shape: Shape::new(perm.iter().map(|&p| self.shape.dims()[p]).collect()),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
        }
    }

    /// Broadcasts to `shape` (same rank or more; new dimensions on the left; each old
    /// dimension equal or 1), giving stride 0 to every broadcast dimension.
    pub fn expand(&self, shape: &Shape) -> View {
        let extra = shape.rank() - self.shape.rank();
        let mut strides = vec![0isize; shape.rank()];
        for (i, s) in strides.iter_mut().enumerate().skip(extra) {
            let old = self.shape.dims()[i - extra];
            *s = if old == shape.dims()[i] && old != 1 { self.strides[i - extra] } else { 0 };
        }
        View { shape: shape.clone(), strides, offset: self.offset }
    }

    /// Keeps `len` elements of dimension `dim`, starting at `start` (`start + len` must not
    /// exceed the dimension).
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> View {
        let mut dims = self.shape.dims().to_vec();
        dims[dim] = len;
        let offset = if len == 0 { self.offset } else { self.offset_at(dim, start) };
        View { shape: Shape::new(dims), strides: self.strides.clone(), offset }
    }

    /// Reverses dimension `dim`: a negative stride, starting from its last element.
    pub fn flip(&self, dim: usize) -> View {
        let n = self.shape.dims()[dim];
        let mut strides = self.strides.clone();
        let offset = if n == 0 { self.offset } else { self.offset_at(dim, n - 1) };
        strides[dim] = -strides[dim];
        View { shape: self.shape.clone(), strides, offset }
    }

    /// Inserts a dimension of size 1 at `dim` (in `0..=rank`).
    pub fn unsqueeze(&self, dim: usize) -> View {
        let mut dims = self.shape.dims().to_vec();
        let mut strides = self.strides.clone();
        let stride = if dim < strides.len() { strides[dim] * dims[dim] as isize } else { 1 };
        dims.insert(dim, 1);
        strides.insert(dim, stride);
        View { shape: Shape::new(dims), strides, offset: self.offset }
    }

    /// Removes dimension `dim`, which must have size 1.
    pub fn squeeze(&self, dim: usize) -> View {
        let mut dims = self.shape.dims().to_vec();
        let mut strides = self.strides.clone();
        dims.remove(dim);
        strides.remove(dim);
        View { shape: Shape::new(dims), strides, offset: self.offset }
    }

    /// The same elements with a new shape of the same element count, as strides over the
    /// same buffer; `None` when that is impossible and a copy is needed. This is PyTorch's
    /// rule for `view`: each run of dimensions that is merged or split must be contiguous
    /// within itself.
    pub fn reshape(&self, shape: &Shape) -> Option<View> {
        if shape.numel() != self.shape.numel() {
            return None;
        }
        if self.is_contiguous() || self.shape.numel() <= 1 {
            return Some(View {
                shape: shape.clone(),
                strides: shape.contiguous_strides(),
                offset: self.offset,
            });
        }
        let old_dims = self.shape.dims();
        let new_dims = shape.dims();
        let mut new_strides = vec![0isize; new_dims.len()];
        let mut view_d = new_dims.len() as isize - 1;
        let mut chunk_base_stride = *self.strides.last()?;
        let mut tensor_numel = 1usize;
        let mut view_numel = 1usize;
        for tensor_d in (0..old_dims.len()).rev() {
            tensor_numel *= old_dims[tensor_d];
            let chunk_ends = tensor_d == 0
                || (old_dims[tensor_d - 1] != 1
                    && self.strides[tensor_d - 1] != tensor_numel as isize * chunk_base_stride);
            if chunk_ends {
                while view_d >= 0 && (view_numel < tensor_numel || new_dims[view_d as usize] == 1) {
                    new_strides[view_d as usize] = view_numel as isize * chunk_base_stride;
                    view_numel *= new_dims[view_d as usize];
                    view_d -= 1;
                }
                if view_numel != tensor_numel {
                    return None;
                }
                if tensor_d > 0 {
                    chunk_base_stride = self.strides[tensor_d - 1];
                    tensor_numel = 1;
                    view_numel = 1;
                }
            }
        }
        (view_d == -1).then(|| View {
            shape: shape.clone(),
            strides: new_strides,
            offset: self.offset,
        })
    }

    /// The buffer offset of each element, in row-major order of the logical shape.
    pub fn offsets(&self) -> Offsets<'_> {
        let numel = self.shape.numel();
        Offsets {
            view: self,
            index: vec![0; self.shape.rank()],
            next: self.offset as isize,
            remaining: numel,
        }
    }

    /// This view read through `inner`: `self` indexes the dense row-major layout of
    /// `inner`'s shape, and the result indexes `inner`'s buffer directly, so a view of a
    /// view needs no copy in between. `None` when that is not a view (a step of `self`
    /// that carries across a dimension of `inner`, or a negative stride): then the inner
    /// view is stored first.
    ///
    /// ```
    /// use kiln_ir::{Shape, View};
    /// // Columns 2..4 of a [3, 4] buffer, then that [3, 2] slice transposed.
    /// let inner = View::contiguous(Shape::from([3, 4])).narrow(1, 2, 2);
    /// let outer = View::contiguous(Shape::from([3, 2])).permute(&[1, 0]);
    /// let both = outer.compose(&inner).unwrap();
    /// assert_eq!((both.strides(), both.offset()), (&[1, 4][..], 2));
    /// ```
    pub fn compose(&self, inner: &View) -> Option<View> {
        if self.strides.iter().any(|&s| s < 0) || self.shape.numel() == 0 {
            return None;
        }
        let dims = inner.shape.dims();
        let dense = inner.shape.contiguous_strides();
        // The first element's index in `inner`, and how far each inner dim is walked.
        let mut start = Vec::with_capacity(dims.len());
        let mut rest = self.offset;
        for &d in &dense {
            let d = d.max(1) as usize;
            start.push(rest / d);
            rest %= d;
        }
        let mut reach = start.clone();
        let mut strides = Vec::with_capacity(self.shape.rank());
        for (&size, &step) in self.shape.dims().iter().zip(&self.strides) {
            if size == 1 || step == 0 {
                strides.push(0);
                continue;
            }
            // The inner dim whose dense stride divides this step: walking this dim of
            // `self` walks only that dim of `inner`.
            let step = step as usize;
            let j = (0..dims.len()).find(|&j| {
                let d = dense[j].max(1) as usize;
                dims[j] > 1 && step.is_multiple_of(d) && step / d < dims[j]
            })?;
            let per = step / dense[j].max(1) as usize;
            reach[j] += per * (size - 1);
            strides.push(per as isize * inner.strides[j]);
        }
        if reach.iter().zip(dims).any(|(&r, &d)| r >= d.max(1)) {
            return None;
        }
        let offset = start.iter().zip(&inner.strides).map(|(&i, &s)| i as isize * s).sum::<isize>()
            + inner.offset as isize;
        Some(View { shape: self.shape.clone(), strides, offset: usize::try_from(offset).ok()? })
    }

    /// The smallest buffer length (in elements) that holds every element of this view.
    pub fn span(&self) -> usize {
        if self.shape.numel() == 0 {
            return 0;
        }
        let last: isize = self
            .shape
            .dims()
            .iter()
            .zip(&self.strides)
            .map(|(&d, &s)| (d as isize - 1).saturating_mul(s.max(0)))
            .fold(0isize, isize::saturating_add);
        self.offset.saturating_add(last as usize).saturating_add(1)
    }

    fn offset_at(&self, dim: usize, index: usize) -> usize {
        (self.offset as isize + index as isize * self.strides[dim]) as usize
    }
}

/// Iterator over the buffer offsets of a [`View`]'s elements; see [`View::offsets`].
pub struct Offsets<'a> {
    view: &'a View,
    index: Vec<usize>,
    next: isize,
    remaining: usize,
}

impl Iterator for Offsets<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let current = self.next as usize;
        // Odometer increment: bump the last dimension, carrying into the ones before it.
        let dims = self.view.shape.dims();
        for d in (0..dims.len()).rev() {
            self.index[d] += 1;
            self.next += self.view.strides[d];
            if self.index[d] < dims[d] {
                break;
            }
            self.next -= self.view.strides[d] * dims[d] as isize;
            self.index[d] = 0;
        }
        Some(current)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl ExactSizeIterator for Offsets<'_> {}

impl fmt::Display for View {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} strides {:?} offset {}", self.shape, self.strides, self.offset)
    }
}

impl fmt::Debug for View {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets(v: &View) -> Vec<usize> {
        v.offsets().collect()
    }

    #[test]
    fn narrow_and_expand_index_the_right_elements() {
        let base = View::contiguous(Shape::from([3, 4]));
        let n = base.narrow(1, 1, 2);
        assert_eq!(offsets(&n), vec![1, 2, 5, 6, 9, 10]);
        assert_eq!(n.span(), 11);
        let e = View::contiguous(Shape::from([3, 1])).expand(&Shape::from([2, 3, 2]));
        assert_eq!(e.strides(), &[0, 1, 0]);
        assert_eq!(offsets(&e), vec![0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2]);
    }

    #[test]
    fn reshape_follows_pytorch_view_rules() {
        let base = View::contiguous(Shape::from([2, 3, 4]));
        // Splitting and merging contiguous runs is a view.
        let p = base.permute(&[1, 0, 2]); // [3, 2, 4], strides [4, 12, 1]
        let r = p.reshape(&Shape::from([3, 2, 2, 2])).expect("splitting the last dim is a view");
        assert_eq!(r.strides(), &[4, 12, 2, 1]);
        assert!(p.reshape(&Shape::from([6, 4])).is_none(), "merging permuted dims needs a copy");
        let t = View::contiguous(Shape::from([2, 3])).permute(&[1, 0]);
        assert!(t.reshape(&Shape::from([6])).is_none());
        // Size-1 dimensions can be inserted anywhere.
        let u = t.reshape(&Shape::from([3, 1, 2])).expect("inserting a 1 is a view");
        assert_eq!(offsets(&u), offsets(&t));
    }

    /// Views a test composes: the movement ops a program applies to a rank-3 buffer whose
    /// dims are at least 3.
    fn some_views(shape: &Shape) -> Vec<View> {
        let c = View::contiguous(shape.clone());
        let d = shape.dims();
        let mut views = vec![c.clone(), c.narrow(1, 1, d[1] - 2), c.narrow(2, d[2] / 2, d[2] / 2)];
        views.push(c.permute(&[2, 0, 1]));
        views.push(c.narrow(2, 1, d[2] - 1).permute(&[0, 2, 1]));
        views.push(c.narrow(0, 1, 2).narrow(2, 2, d[2] - 2).permute(&[1, 0, 2]));
        views.push(c.narrow(1, 0, 1).expand(&Shape::from([d[0], 3, d[2]])));
        views.push(c.flip(1));
        views
    }

    #[test]
    fn composed_views_read_what_the_view_of_the_view_reads() {
        let buffer = Shape::from([4, 6, 10]);
        let mut composed = 0;
        for inner in some_views(&buffer) {
            // The outer views index the inner view's logical (dense) layout.
            for outer in some_views(inner.shape()) {
                let inner_offsets = offsets(&inner);
                let want: Vec<usize> = outer.offsets().map(|i| inner_offsets[i]).collect();
                match outer.compose(&inner) {
                    Some(v) => {
                        assert_eq!(offsets(&v), want, "{outer:?} of {inner:?}");
                        composed += 1;
                    }
                    None => assert!(
                        outer.strides().iter().any(|&s| s < 0)
                            || inner.strides().iter().any(|&s| s < 0)
                            || want.is_empty(),
                        "only flips and empty views fail to compose here: {outer:?} of {inner:?}"
                    ),
                }
            }
        }
        assert!(composed > 30, "{composed}");
        // A reshape that merges a slice's rows carries across its dims: no single view.
        let inner = View::contiguous(Shape::from([3, 4])).narrow(1, 0, 2);
        assert!(View::contiguous(Shape::from([6])).compose(&inner).is_none());
        let split = View::contiguous(Shape::from([3, 4])).narrow(1, 1, 2);
        let rows = View::contiguous(Shape::from([3, 2])).reshape(&Shape::from([3, 1, 2])).unwrap();
        assert_eq!(offsets(&rows.compose(&split).unwrap()), vec![1, 2, 5, 6, 9, 10]);
    }

    #[test]
    fn overlap_is_detected() {
        let base = View::contiguous(Shape::from([3, 4]));
        assert!(base.is_non_overlapping());
        assert!(base.permute(&[1, 0]).narrow(0, 1, 2).is_non_overlapping());
        assert!(
            !View::contiguous(Shape::from([3, 1]))
                .expand(&Shape::from([3, 2]))
                .is_non_overlapping()
        );
        assert!(!View::from_parts(Shape::from([3, 3]), vec![1, 1], 0).is_non_overlapping());
    }

    #[test]
    fn flip_reverses_one_dimension() {
        let v = View::contiguous(Shape::from([2, 3])).flip(1);
        assert_eq!(offsets(&v), vec![2, 1, 0, 5, 4, 3]);
        assert_eq!(v.span(), 6);
        assert!(!v.is_contiguous());
        assert_eq!(offsets(&v.flip(1)), vec![0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn unsqueeze_and_squeeze_round_trip() {
        let v = View::contiguous(Shape::from([2, 3])).permute(&[1, 0]);
        for d in 0..=2 {
            let u = v.unsqueeze(d);
            assert_eq!(offsets(&u), offsets(&v));
            assert_eq!(u.squeeze(d), v);
        }
    }

    #[test]
    fn contiguity_ignores_size_one_dims() {
        let v = View::from_parts(Shape::from([1, 3]), vec![17, 1], 0);
        assert!(v.is_contiguous());
        assert!(View::contiguous(Shape::from([0, 3])).is_contiguous());
        assert_eq!(View::contiguous(Shape::from([0, 3])).span(), 0);
    }
}
