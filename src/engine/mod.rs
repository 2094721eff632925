//! The realization engine: lazy nodes and the storages that hold them, realizing them
//! (capture, plan, run, store back), the plan caches, the compile session, and the
//! execution settings.
//!
//! It sits below the tensor API and never names [`crate::Tensor`]: it works on
//! [`lazy::LazyNode`]s and [`storage::Storage`]s, and imports nothing of the crate but
//! [`crate::error`]. The tensor API records nodes into it and asks it for values.

pub(crate) mod execution;
pub(crate) mod lazy;
pub(crate) mod origin;
pub(crate) mod plans;
pub(crate) mod realize;
pub(crate) mod replay;
pub(crate) mod session;
pub(crate) mod storage;
