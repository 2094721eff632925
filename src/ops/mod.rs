//! User-defined ops, of two kinds.
//!
//! An [`Elementwise`] op is defined once by an expression over kiln's own elementwise
//! operations (arithmetic, comparisons, `where_`, the transcendental functions, casts,
//! constants and broadcasts). Each call records that expression, labelled with the op's
//! name, so it is a program like any other: it fuses with its neighbours into one kernel on
//! the CPU and on CUDA, its gradient is the expression's, differentiated symbolically (to
//! any order), the reference executor and `KILN_CHECK` evaluate it in f64, and profiles and
//! [`crate::debug::kernels`] show its ops grouped under its name (`swish(mul sigmoid mul)`,
//! and `swish.grad(..)` for its gradient's).
//!
//! ```
//! use kiln::ops::Elementwise;
//! use kiln::prelude::*;
//! let beta = 1.5;
//! let swish = Elementwise::new("swish", move |x: &Tensor| x * (x * beta).sigmoid());
//! let x = Tensor::from_vec(vec![-1.0f32, 0.0, 2.0], [3]).requires_grad_(true);
//! let y = (swish.call(&x) + 1.0).sum(); // one fused kernel with the `+ 1` and the sum
//! y.backward();
//! assert_eq!(x.grad().unwrap().dims(), &[3]);
//! ```
//!
//! An [`Opaque`] op is a name, a shape and dtype rule, a CPU implementation (a Rust function
//! over strided input views, run on every thread), optionally CUDA C source and a backward
//! written with kiln ops. It runs as a step of its own between fused kernels; `compile()`,
//! autocast ([`AutocastPolicy`]), profiles (by name), errors (naming the caller's line) and
//! `KILN_CHECK` (an element the CPU function leaves unwritten, a CUDA result that differs
//! from the CPU function's) all know it.

mod mode;
mod opaque;
mod scan;
mod scatter_reduce;

pub use opaque::{
    AutocastPolicy, Backward, CpuInput, CpuOutput, CudaKernel, Opaque, OpaqueBuilder, Saved,
    ShapeRule, Split,
};
pub use scatter_reduce::ScatterReduce;

use std::sync::Arc;

use kiln_ir::{Label, Op, Shape};

use crate::engine::lazy::{LazyNode, State, with_label};
use crate::error::{Error, Result, ok};
use crate::tensor::Tensor;

/// An elementwise op of one tensor, defined by an expression over kiln's elementwise ops
/// (parameters are captured by the closure).
pub struct Elementwise<F> {
    name: &'static str,
    f: F,
}

/// An elementwise op of two tensors, broadcast together as kiln's binary ops are.
pub struct Elementwise2<F> {
    name: &'static str,
    f: F,
}

impl<F> std::fmt::Debug for Elementwise<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Elementwise({})", self.name)
    }
}

impl<F> std::fmt::Debug for Elementwise2<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Elementwise2({})", self.name)
    }
}

impl<F: Fn(&Tensor) -> Tensor> Elementwise<F> {
    /// The op `name`, computing `f` of its input.
    pub fn new(name: &'static str, f: F) -> Elementwise<F> {
        Elementwise { name, f }
    }

    /// The op's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The op of `x`.
    ///
    /// # Panics
    /// As [`Elementwise::try_call`] fails.
    #[track_caller]
    pub fn call(&self, x: &Tensor) -> Tensor {
        ok(self.try_call(x))
    }

    /// [`Elementwise::call`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Value`] when the definition records an op that is not elementwise (a
    /// product, a reduction, an indexing op) or its result does not have `x`'s shape; the
    /// errors of the ops it records.
    #[track_caller]
    pub fn try_call(&self, x: &Tensor) -> Result<Tensor> {
        let _at = crate::engine::origin::enter();
        let label = Label { name: self.name, grad: false };
        let out = with_label(Some(label), || (self.f)(x));
        check(self.name, label, &out, x.shape())?;
        Ok(out)
    }
}

impl<F: Fn(&Tensor, &Tensor) -> Tensor> Elementwise2<F> {
    /// The op `name`, computing `f` of its two inputs.
    pub fn new(name: &'static str, f: F) -> Elementwise2<F> {
        Elementwise2 { name, f }
    }

    /// The op's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The op of `a` and `b`.
    ///
    /// # Panics
    /// As [`Elementwise2::try_call`] fails.
    #[track_caller]
    pub fn call(&self, a: &Tensor, b: &Tensor) -> Tensor {
        ok(self.try_call(a, b))
    }

    /// [`Elementwise2::call`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] when `a` and `b` do not broadcast; as [`Elementwise::try_call`],
    /// against their broadcast shape.
    #[track_caller]
    pub fn try_call(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let _at = crate::engine::origin::enter();
        let shape = a.shape().broadcast(b.shape(), self.name).map_err(|_| Error::Shape {
            op: self.name,
            detail: format!("inputs of shapes {} and {} do not broadcast", a.shape(), b.shape()),
        })?;
        let label = Label { name: self.name, grad: false };
        let out = with_label(Some(label), || (self.f)(a, b));
        check(self.name, label, &out, &shape)?;
        Ok(out)
    }
}

/// Checks that every node the definition recorded (those labelled `label`, reached from
/// `out`) is elementwise, a view or a constant, and that `out` has the inputs' shape.
fn check(name: &'static str, label: Label, out: &Tensor, shape: &Shape) -> Result<()> {
    if out.shape() != shape {
        return Err(Error::Value {
            op: name,
            detail: format!(
                "an elementwise op returns its inputs' shape {shape}; its definition returned {}",
                out.shape()
            ),
        });
    }
    let mut stack: Vec<Arc<LazyNode>> = vec![out.node()];
    let mut seen = std::collections::HashSet::new();
    while let Some(node) = stack.pop() {
        if node.label != Some(label) || !seen.insert(Arc::as_ptr(&node)) {
            continue;
        }
        if !(node.op.is_elementwise() || matches!(node.op, Op::View(_) | Op::Full(_))) {
            return Err(Error::Value {
                op: name,
                detail: format!(
                    "an elementwise op is an expression over kiln's elementwise ops; its \
                     definition records `{}` (at {})",
                    node.op.name(),
                    node.origin
                ),
            });
        }
        if let State::Pending(inputs) = &*node.state() {
            stack.extend(inputs.iter().cloned());
        }
    }
    Ok(())
}
