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

/// A walk seen as rows of its last dimension.
pub(crate) struct Rows {
    /// Elements per row.
    pub(crate) len: i64,
    /// How many rows.
    pub(crate) count: i64,
    /// The dimensions the rows are indexed by (all but the last).
    pub(crate) dims: Vec<usize>,
    /// Each input's strides along those dimensions.
    pub(crate) strides: Vec<Vec<i64>>,
}

impl Walk {
    /// The walk as rows of its last dimension (a reduction's reduced walk: each output
    /// folds `count` rows of `len`).
    pub(crate) fn rows(&self) -> Rows {
        let (&len, dims) = self.dims.split_last().expect("at least one dimension");
        Rows {
            len: len as i64,
            count: dims.iter().product::<usize>() as i64,
            dims: dims.to_vec(),
            strides: self.strides.iter().map(|s| s[..s.len() - 1].to_vec()).collect(),
        }
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
