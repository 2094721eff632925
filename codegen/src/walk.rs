//! The strided walk both back ends generate loops over: a kernel's domain with size-1
//! dimensions dropped and neighbours that every input walks contiguously merged, so a dense
//! tensor is one long row.

use kiln_ir::kernel::Kernel;

/// The layout the generated loops walk: coalesced dimensions (row-major, the last is the
/// row) and each input's strides over them, in elements.
#[derive(Debug)]
pub(crate) struct Walk {
    pub(crate) dims: Vec<usize>,
    pub(crate) strides: Vec<Vec<i64>>,
    pub(crate) offsets: Vec<i64>,
}

impl Walk {
    /// Every number of the walk, in the order [`Layout::with`] reads its marks: the
    /// dimensions, each input's strides, each input's offset.
    pub(crate) fn numbers(&self, out: &mut Vec<i64>) {
        out.extend(self.dims.iter().map(|&d| d as i64));
        self.strides.iter().for_each(|s| out.extend_from_slice(s));
        out.extend_from_slice(&self.offsets);
    }
}

/// The walk of `kernel`'s dimensions `range`, coalesced.
pub(crate) fn coalesce(kernel: &Kernel, range: std::ops::Range<usize>) -> Walk {
    let mut dims: Vec<usize> = Vec::new();
    let mut strides: Vec<Vec<i64>> = vec![Vec::new(); kernel.inputs.len()];
    for d in range {
        let size = kernel.shape.dims()[d];
        if size == 1 {
            continue;
        }
        let mergeable = !dims.is_empty()
            && kernel.inputs.iter().zip(&strides).all(|(input, s)| {
                let inner = input.view.strides()[d] as i64;
                *s.last().expect("dims is not empty") == inner * size as i64
            });
        if mergeable {
            *dims.last_mut().expect("dims is not empty") *= size;
            for (input, s) in kernel.inputs.iter().zip(strides.iter_mut()) {
                *s.last_mut().expect("dims is not empty") = input.view.strides()[d] as i64;
            }
        } else {
            dims.push(size);
            for (input, s) in kernel.inputs.iter().zip(strides.iter_mut()) {
                s.push(input.view.strides()[d] as i64);
            }
        }
    }
    if dims.is_empty() {
        dims.push(1);
        strides.iter_mut().for_each(|s| s.push(0));
    }
    let offsets = kernel.inputs.iter().map(|i| i.view.offset() as i64).collect();
    Walk { dims, strides, offsets }
}

/// A size, stride or offset in generated code: known when the kernel is compiled, or read
/// when it runs from slot `i` of its size arguments (a size-generic kernel).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Sz {
    Known(i64),
    Slot(u32),
}

impl Sz {
    /// The value when it is known.
    pub(crate) fn known(self) -> Option<i64> {
        match self {
            Sz::Known(v) => Some(v),
            Sz::Slot(_) => None,
        }
    }
}

/// A [`Walk`] as generated code sees it: every number known (a kernel specialised to its
/// sizes) or, in a size-generic kernel, read from its size arguments, except the strides
/// 0 and 1 (a broadcast, a contiguous row), which choose the code and stay known.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Layout {
    pub(crate) dims: Vec<Sz>,
    pub(crate) strides: Vec<Vec<Sz>>,
    pub(crate) offsets: Vec<Sz>,
    /// The product of every dimension but the last: how many rows.
    pub(crate) rows: Sz,
    /// The product of every dimension.
    pub(crate) numel: Sz,
}

/// A [`Layout`] seen as rows of its last dimension.
pub(crate) struct Rows {
    /// Elements per row.
    pub(crate) len: Sz,
    /// How many rows.
    pub(crate) count: Sz,
    /// The dimensions the rows are indexed by (all but the last).
    pub(crate) dims: Vec<Sz>,
    /// Each input's strides along those dimensions.
    pub(crate) strides: Vec<Vec<Sz>>,
}

impl Layout {
    /// `walk` with the numbers that `dynamic` marks (in [`Walk::numbers`]' order; missing
    /// marks are `false`) read from size slots, numbered from `values.len()` on, their
    /// values appended to `values`, and every other number known: the code generator and
    /// the launch of a size-generic kernel build the same slots this way.
    pub(crate) fn with(
        walk: &Walk,
        dynamic: &mut dyn Iterator<Item = bool>,
        values: &mut Vec<i64>,
    ) -> Layout {
        let mut number = |v: i64| {
            if dynamic.next().unwrap_or(false) {
                values.push(v);
                Sz::Slot(values.len() as u32 - 1)
            } else {
                Sz::Known(v)
            }
        };
        let dims: Vec<Sz> = walk.dims.iter().map(|&d| number(d as i64)).collect();
        let strides =
            (walk.strides.iter()).map(|s| s.iter().map(|&v| number(v)).collect()).collect();
        let offsets = walk.offsets.iter().map(|&o| number(o)).collect();
        let mut derived = |dims: &[Sz], value: usize| {
            if dims.iter().all(|d| d.known().is_some()) {
                Sz::Known(value as i64)
            } else {
                values.push(value as i64);
                Sz::Slot(values.len() as u32 - 1)
            }
        };
        let last = walk.dims.len() - 1;
        let rows = derived(&dims[..last], walk.dims[..last].iter().product());
        let numel = derived(&dims, walk.dims.iter().product());
        Layout { dims, strides, offsets, rows, numel }
    }

    /// `walk` with every number known (a kernel specialised to its sizes).
    pub(crate) fn known(walk: &Walk) -> Layout {
        Layout::with(walk, &mut std::iter::empty(), &mut Vec::new())
    }

    /// The layout as rows of its last dimension.
    pub(crate) fn rows(&self) -> Rows {
        let (&len, dims) = self.dims.split_last().expect("at least one dimension");
        Rows {
            len,
            count: self.rows,
            dims: dims.to_vec(),
            strides: self.strides.iter().map(|s| s[..s.len() - 1].to_vec()).collect(),
        }
    }

    /// The last dimension: the row.
    pub(crate) fn inner(&self) -> Sz {
        *self.dims.last().expect("at least one dimension")
    }
}
