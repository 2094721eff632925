//! kiln's intermediate representation: everything about a tensor program that does not
//! depend on a machine.
//!
//! - [`DType`], [`Scalar`] and [`Element`]: element types, values and PyTorch's promotion
//!   rules ([`result_type`]).
//! - [`Shape`] and [`View`]: dimensions, NumPy broadcasting, and strided layouts that movement
//!   ops compose without copying.
//! - [`Op`]: the closed set of primitive ops, with shape and dtype inference ([`Op::infer`]).
//! - [`Collective`]: ops over the ranks of a process group, planned like any other op.
//! - [`Graph`]: a petgraph dataflow graph of ops, with a deterministic topological order,
//!   verification and Graphviz export.
//! - [`fuse`] and [`kernel`]: the partition of a graph into fused elementwise kernels, and
//!   the machine-free description of one kernel that code generators lower.
//! - [`pipeline`]: the planner: named graph passes ([`passes`]), then partition and
//!   lowering to kernels, with the options a plan depends on and the [`target`] it is for.
//! - [`semantics`]: what every scalar op computes, shared by every executor.
//! - [`autodiff`]: the gradient rule of every op, written against an abstract builder.
//! - [`random`]: the counter-based generator behind random fills.
//!
//! This crate has no `unsafe`, no threads and no IO: backends and the runtime build on it.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod autodiff;
mod check;
mod collective;
mod custom;
mod dtype;
mod error;
pub mod fuse;
mod graph;
pub mod kernel;
mod op;
mod op_tables;
pub mod passes;
pub mod pipeline;
mod products;
pub mod random;
pub mod semantics;
pub mod settings;
mod shape;
pub mod target;
#[doc(hidden)]
pub mod testing;
pub mod text;
mod view;

pub use check::Check;
pub use collective::{Collective, CollectiveKind, CollectiveReduce};
pub use custom::Custom;
pub use dtype::{Category, DType, Element, Participant, Scalar, result_type};
pub use error::IrError;
pub use graph::{Graph, Label, Node, NodeId};
pub use op::{BinaryOp, Op, RandomDist, ReduceOp, UnaryOp};
pub use products::{AttentionDims, AttentionMask};
pub use semantics::{bf16_from_f64, f16_from_f64};
pub use shape::{Shape, normalize_axis};
pub use view::{Offsets, View};
