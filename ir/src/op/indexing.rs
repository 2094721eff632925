//! Shape and dtype inference of the indexing ops, `gather` and `scatter`.

use crate::{DType, IrError, Shape};

/// [`Op::infer`] of `scatter`.
pub(super) fn infer_scatter(
    axis: usize,
    accumulate: bool,
    inputs: &[(&Shape, DType)],
) -> Result<(Shape, DType), IrError> {
    let op = if accumulate { "scatter_add" } else { "scatter" };
    let (base, dtype) = inputs[0];
    let (index, idtype) = inputs[1];
    let (src, sdtype) = inputs[2];
    check_index(op, axis, base, index, idtype)?;
    if index.rank() != src.rank() || index.dims().iter().zip(src.dims()).any(|(i, s)| i > s) {
        return Err(IrError::shape(
            op,
            format!(
                "index of shape {index} does not fit in src of shape {src}: every dimension must be at most src's"
            ),
        ));
    }
    if sdtype != dtype {
        return Err(IrError::dtype(
            op,
            format!("src has dtype {sdtype} but the tensor has {dtype}"),
        ));
    }
    if accumulate && dtype == DType::Bool {
        return Err(IrError::dtype(op, "is not defined for bool tensors"));
    }
    Ok((base.clone(), dtype))
}

/// The rules `gather` and `scatter` share: an `I64` index of the tensor's rank, no larger
/// than it outside `axis`.
pub(super) fn check_index(
    op: &'static str,
    axis: usize,
    x: &Shape,
    index: &Shape,
    dtype: DType,
) -> Result<(), IrError> {
    if dtype != DType::I64 {
        return Err(IrError::dtype(
            op,
            format!("the index must be an i64 tensor, got {dtype}; convert it with .long()"),
        ));
    }
    if axis >= x.rank() {
        return Err(IrError::index(
            op,
            format!("dimension {axis} is out of range for a tensor of rank {}", x.rank()),
        ));
    }
    if index.rank() != x.rank() {
        return Err(IrError::shape(
            op,
            format!(
                "the index (shape {index}) must have as many dimensions as the tensor (shape {x})"
            ),
        ));
    }
    if let Some(d) = (0..x.rank()).find(|&d| d != axis && index.dims()[d] > x.dims()[d]) {
        return Err(IrError::shape(
            op,
            format!(
                "the index (shape {index}) is larger than the tensor (shape {x}) in dimension {d}; outside dimension {axis} it must be at most as large"
            ),
        ));
    }
    Ok(())
}
