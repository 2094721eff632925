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
//! - [`Tensor`]: the handle; constructors, arithmetic, math functions, comparisons,
//!   reductions (`sum`, `mean`, `var`, `softmax`, `logsumexp`, `cumsum`, ...), matrix
//!   products and [`einsum`], views, [`IndexOp::i`] indexing, selection (`gather`, `scatter`,
//!   `masked_select`, `cat`, ...) and in-place ops (`add_`, `fill_`, `copy_`, ...).
//! - [`DType`], [`Shape`], [`Device`]: element types, shapes and devices.
//! - [`Error`]: every failure, with `try_` forms of every fallible operation.
//! - [`autograd`]: symbolic reverse-mode differentiation: [`Tensor::backward`], [`grad`]
//!   (higher-order too), [`no_grad`], [`autograd::gradcheck`].
//! - [`nn`]: modules ([`nn::Linear`], [`nn::Sequential`], [`nn::LayerNorm`], ...), the
//!   [`parameters!`] macro for your own models, and [`nn::functional`] losses.
//! - [`optim`]: [`optim::Sgd`], [`optim::Adam`], [`optim::AdamW`], schedules, gradient
//!   clipping. [`data`]: [`data::DataLoader`] over a [`data::Dataset`].
//! - [`distributed`]: process groups and collectives (MPI, NCCL, threads) as graph ops, for
//!   [`nn::DistributedDataParallel`].
//! - [`serialize`]: named tensors to and from safetensors files.
//! - [`debug`]: the recorded graph as Graphviz DOT, before and after fusion, and the
//!   generated kernels. [`profile()`]: what ran and how fast. [`compile()`]: one fused plan
//!   per call of a function. [`cuda`]: whether there are NVIDIA GPUs.
//! - [`manual_seed`]: deterministic random numbers.
//!
//! ## Type promotion
//! Binary ops, `where_` and `cat` follow PyTorch's rules ([`kiln_ir::result_type`]): the
//! operands meet in the highest category among them (`bool < integer < float`); within it,
//! tensors with dimensions decide, then zero-dimensional tensors, and Rust scalar literals
//! decide only the category. So `f16_tensor * 2.5` stays `f16`, `i32_tensor + 1` stays
//! `i32`, `i64_tensor * 2.5` is `f32`, `f16` with `bf16` is `f32`, and `u8` with `i32` is
//! `i32`. Division and `pow` of integers give `f32`; comparisons give `bool`; math functions
//! (`exp`, `sqrt`, ...) of integer tensors give `f32`; sums and products of integers and bools
//! give `i64`. Casts ([`Tensor::to_dtype`]) follow Rust's `as`: float to integer truncates
//! toward zero and saturates (NaN gives 0), narrowing integers wrap, non-zero is `true`.
//!
//! ```
//! use kiln::prelude::*;
//! let i = Tensor::from_vec(vec![1i32, 2], [2]);
//! assert_eq!((&i + 1).dtype(), DType::I32);
//! assert_eq!((&i * 2.5).dtype(), DType::F32);
//! assert_eq!((&i / &i).dtype(), DType::F32);
//! assert_eq!(i.gt(1).dtype(), DType::Bool);
//! assert_eq!((&i.half() + &i.bfloat16()).dtype(), DType::F32);
//! ```
//!
//! ## Views and in-place operations
//! A tensor is a view (shape, strides, offset) of a storage, as in PyTorch: `view`,
//! `reshape` (when it can), `permute`, `transpose`, `t`, `expand`, `narrow`, `select`,
//! `squeeze`, `unsqueeze` and `i(..)` make new views and record nothing. An in-place op
//! (`add_`, `fill_`, ...) replaces the storage's value with a functional update of it, so
//! every alias sees the write, lazily, while results recorded earlier keep the values they
//! saw, exactly as in eager PyTorch. Each write bumps the storage's version; autograd
//! refuses to differentiate through a value it needed that was overwritten.
//!
//! ```
//! use kiln::prelude::*;
//! let x = Tensor::zeros([3, 4]);
//! let before = x.sum();                  // recorded before the write
//! x.view(&[4, 3]).i((0, 0)).fill_(999.0);
//! assert_eq!(x.to_vec::<f32>()[0], 999.0);
//! assert_eq!(before.item::<f32>(), 0.0);
//! ```
//!
//! ## Design
//! Each storage is produced by a node of the lazy graph; a node keeps its inputs until it is
//! realized and then keeps only its buffer, so dropping tensors frees everything they alone
//! kept alive, and long chains are freed without recursion. Every node records the source
//! line of the user's call (`#[track_caller]`), so an error found while running the graph
//! names the line that recorded the failing op.
//!
//! At realization the graph is partitioned into fused kernels, which Cranelift compiles to
//! machine code (cached, and split across threads); see [`with_execution`],
//! [`with_check`] and `ARCHITECTURE.md`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod autocast;
pub mod autograd;
pub mod checkpoint;
pub mod compile;
pub mod cuda;
pub mod data;
pub mod debug;
pub mod distributed;
mod engine;
mod error;
pub mod linalg;
pub mod nn;
pub mod ops;
pub mod optim;
mod profile;
mod random;
pub mod serialize;
mod tensor;

pub use autocast::{autocast, autocast_dtype, try_autocast};
pub use autograd::{
    BackwardOptions, GradModeGuard, InferenceModeGuard, NoGradGuard, enable_grad, grad,
    inference_mode, is_grad_enabled, no_grad, try_grad,
};
pub use compile::{CompileOptions, Compiled, Dynamic, compile, compile_with};
pub use engine::execution::{Execution, execution, with_check, with_check_scale, with_execution};
pub use error::{Error, Result};
pub use kiln_ir::{DType, Element, Scalar, Shape};
pub use kiln_runtime::{CheckReport, Device, RunError, RuntimeError};
pub use ops::ScatterReduce;
pub use profile::{
    Comparison, KernelStats, MemoryPeak, Profile, StepEvent, StepKind, copy_ceiling,
    machine_bandwidth, profile,
};
pub use random::{RngState, get_rng_state, manual_seed, set_rng_state};
pub use tensor::{
    Dims, Ellipsis, IndexOp, Indexing, Interpolation, NewAxis, Operand, Rounding, Tensor,
    TensorIndex, Unique, einsum, try_einsum,
};

/// The names most programs need: `use kiln::prelude::*;`.
pub mod prelude {
    pub use crate::nn::{Module, Parameters};
    pub use crate::optim::Optimizer;
    pub use crate::{
        BackwardOptions, DType, Device, Ellipsis, Error, IndexOp, NewAxis, NoGradGuard, Result,
        Shape, Tensor, no_grad,
    };
}
