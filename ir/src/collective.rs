//! Collectives: ops whose result depends on the same op's input on every rank of a process
//! group. They are ordinary graph nodes (recorded lazily, scheduled by the planner, kept by
//! `compile()`), never fused: each runs as a step of its own that hands its input buffer to
//! the group's communication engine.

use std::fmt;

use crate::{DType, IrError, Shape};

/// How a reducing collective combines the ranks' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CollectiveReduce {
    /// The sum (on `Bool`, logical or, as PyTorch does).
    Sum,
    /// The sum divided by the number of ranks (float dtypes only).
    Mean,
    /// The product (on `Bool`, logical and).
    Product,
    /// The largest value (NaN wins, as in every kiln max).
    Max,
    /// The smallest value.
    Min,
}

impl CollectiveReduce {
    /// The reduction's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            CollectiveReduce::Sum => "sum",
            CollectiveReduce::Mean => "mean",
            CollectiveReduce::Product => "product",
            CollectiveReduce::Max => "max",
            CollectiveReduce::Min => "min",
        }
    }
}

/// Which collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CollectiveKind {
    /// Every rank gets the reduction of every rank's tensor.
    AllReduce(CollectiveReduce),
    /// Every rank gets rank `root`'s tensor.
    Broadcast {
        /// The rank whose tensor is sent.
        root: u32,
    },
    /// Every rank gets the ranks' tensors concatenated along dimension 0, in rank order.
    AllGather,
    /// The reduction of every rank's tensor, split along dimension 0 into one part per rank:
    /// rank `r` gets part `r`.
    ReduceScatter(CollectiveReduce),
}

/// A collective over one process group: the op's whole description, so that equal
/// collectives of equal inputs are the same node and a compiled step replays the same ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Collective {
    /// What it computes.
    pub kind: CollectiveKind,
    /// The process group (its number in the runtime's registry).
    pub group: u32,
    /// The number of ranks in the group: results' shapes depend on it.
    pub world: u32,
}

impl Collective {
    /// The op's name, as it appears in messages and graph dumps.
    pub fn name(&self) -> &'static str {
        match self.kind {
            CollectiveKind::AllReduce(_) => "all_reduce",
            CollectiveKind::Broadcast { .. } => "broadcast",
            CollectiveKind::AllGather => "all_gather",
            CollectiveKind::ReduceScatter(_) => "reduce_scatter",
        }
    }

    /// The reduction, for the reducing collectives.
    pub fn reduce(&self) -> Option<CollectiveReduce> {
        match self.kind {
            CollectiveKind::AllReduce(r) | CollectiveKind::ReduceScatter(r) => Some(r),
            _ => None,
        }
    }

    /// The result's shape and dtype for an input of `shape` and `dtype`.
    pub fn infer(&self, shape: &Shape, dtype: DType) -> Result<(Shape, DType), IrError> {
        let name = self.name();
        if let Some(r) = self.reduce()
            && r == CollectiveReduce::Mean
            && !dtype.is_float()
        {
            return Err(IrError::dtype(
                name,
                format!(
                    "a mean over ranks needs a float tensor, got {dtype}; reduce with Sum and \
                     divide, or cast to a float dtype first"
                ),
            ));
        }
        let world = self.world as usize;
        if world == 0 {
            return Err(IrError::InvalidGraph(format!("{name} over a group of no ranks")));
        }
        match self.kind {
            CollectiveKind::AllReduce(_) => Ok((shape.clone(), dtype)),
            CollectiveKind::Broadcast { root } => {
                if root as usize >= world {
                    return Err(IrError::shape(
                        name,
                        format!("root rank {root} is not in a group of {world} ranks"),
                    ));
                }
                Ok((shape.clone(), dtype))
            }
            CollectiveKind::AllGather => {
                let mut dims = leading(name, shape)?;
                dims[0] *= world;
                Ok((Shape::from(dims), dtype))
            }
            CollectiveKind::ReduceScatter(_) => {
                let mut dims = leading(name, shape)?;
                if dims[0] % world != 0 {
                    return Err(IrError::shape(
                        name,
                        format!(
                            "dimension 0 of the input {shape} must split evenly over the group's \
                             {world} ranks; pad it to a multiple of {world}"
                        ),
                    ));
                }
                dims[0] /= world;
                Ok((Shape::from(dims), dtype))
            }
        }
    }
}

/// The dimensions of a tensor that has a dimension 0 to gather or scatter along.
fn leading(name: &'static str, shape: &Shape) -> Result<Vec<usize>, IrError> {
    if shape.rank() == 0 {
        return Err(IrError::shape(
            name,
            "needs a tensor with at least one dimension (it joins or splits dimension 0); \
             reshape a scalar to [1]",
        ));
    }
    Ok(shape.dims().to_vec())
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name())?;
        match self.kind {
            CollectiveKind::AllReduce(r) | CollectiveKind::ReduceScatter(r) => {
                write!(f, "({}", r.name())?;
            }
            CollectiveKind::Broadcast { root } => write!(f, "(root {root}")?,
            CollectiveKind::AllGather => write!(f, "(")?,
        }
        write!(f, ", group {}, world {})", self.group, self.world)
    }
}
