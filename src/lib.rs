//! # kiln
//!
//! A tensor library with PyTorch's define-by-run feel and a compiler underneath.
//!
//! Tensor operations do not compute: they record a lazy graph, checking shapes, dtypes and
//! devices as they go, so a mistake is reported at the line that made it. The graph is
//! *realized* when a value is needed ([`Tensor::item`], [`Tensor::to_vec`], printing,
//! [`Tensor::realize`]); kiln then sees the whole program at once, runs it, and keeps only
//! what live tensors still need.
//!
//! ```
//! use kiln::prelude::*;
//!
//! kiln::manual_seed(0);
//! let x = Tensor::randn([4, 3]);
//! let w = Tensor::from_vec(vec![0.5f32, -1.0, 2.0], [3, 1]);
//! let y = x.matmul(&w).relu() + 1.0;          // recorded, nothing computed yet
//! assert_eq!(y.dims(), &[4, 1]);
//! let total: f32 = y.sum().item();            // computed here
//! assert!(total >= 4.0);
//! println!("{y}");                             // prints like PyTorch
//! ```
//!
//! ## Map
//! - [`Tensor`]: the handle; constructors, arithmetic (with broadcasting and PyTorch's type
//!   promotion), math functions, comparisons, reductions, matrix products and views.
//! - [`DType`], [`Shape`], [`Device`]: element types, shapes and devices.
//! - [`Error`]: every failure, with `try_` forms of every fallible operation.
//! - [`autograd`]: symbolic reverse-mode differentiation: [`Tensor::backward`], [`grad`]
//!   (higher-order too), [`no_grad`].
//! - [`debug`]: the recorded graph as Graphviz DOT.
//! - [`manual_seed`]: deterministic random numbers.
//!
//! ## Design
//! A tensor is a view (shape, strides, offset) of a storage, as in PyTorch: movement ops make
//! new views and record nothing. Each storage is produced by a node of the lazy graph; a node
//! keeps its inputs until it is realized and then keeps only its buffer, so dropping tensors
//! frees everything they alone kept alive, and long chains are freed without recursion.
//! Every node records the source line of the user's call (`#[track_caller]`), so an error
//! found while running the graph names the line that recorded the failing op.
//!
//! Graphs currently run on the reference executor, one op at a time; see `ARCHITECTURE.md`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod autograd;
pub mod debug;
mod error;
mod lazy;
mod random;
mod realize;
mod tensor;

pub use autograd::{
    BackwardOptions, GradModeGuard, NoGradGuard, enable_grad, grad, inference_mode,
    is_grad_enabled, no_grad, try_grad,
};
pub use error::{Error, Result};
pub use kiln_ir::{DType, Element, Scalar, Shape};
pub use kiln_runtime::{Device, RunError, RuntimeError};
pub use random::manual_seed;
pub use tensor::{
    Dims, Ellipsis, IndexOp, NewAxis, Operand, Tensor, TensorIndex, einsum, try_einsum,
};

/// The names most programs need: `use kiln::prelude::*;`.
pub mod prelude {
    pub use crate::{
        BackwardOptions, DType, Device, Ellipsis, Error, IndexOp, NewAxis, NoGradGuard, Result,
        Shape, Tensor, no_grad,
    };
}
