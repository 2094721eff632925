//! In-place ops: functional updates of the storage that every view sees.
//!
//! `x.add_(y)` computes `x + y` like the out-of-place op, then installs the result as the new
//! value of `x`'s storage, through `x`'s view when it covers only part of it. Nothing is
//! computed at once: the storage's node becomes an `Assign` of the new values into the old
//! ones, so every alias reads the update, and tensors recorded earlier keep reading the old
//! values, as they would have in eager PyTorch.

use kiln_ir::{Op, Scalar};

use super::{Operand, Tensor};
use crate::engine::lazy::LazyNode;
use crate::error::ok;
use crate::{Error, Result};

impl Tensor {
    /// Writes `value(old)` into this tensor, where `old` is its current value.
    #[track_caller]
    fn write(
        &self,
        op: &'static str,
        value: impl FnOnce(&Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let grad_on = super::grad_mode::is_grad_enabled();
        if grad_on && self.is_leaf() && self.requires_grad() {
            return Err(Error::Autograd {
                op,
                detail: "a leaf tensor that requires grad cannot be modified in place; do it inside kiln::no_grad(..), or on a .detach()ed tensor".into(),
            });
        }
        if !self.layout().is_non_overlapping() {
            return Err(Error::shape(
                op,
                format!(
                    "several elements of this tensor (shape {}, strides {:?}) share one memory location, so an in-place write is ambiguous; .copy() it first",
                    self.shape(),
                    self.stride()
                ),
            ));
        }
        let whole = self.layout().is_identity_of(&self.storage().node().shape);
        // A write into part of the storage under autograd differentiates through the whole
        // storage's value before it (PyTorch's `CopySlices`): the old values are read as a
        // view of that base, so the new history does not hold this storage's handles.
        let base = if grad_on && !whole { self.autograd_base(op)? } else { None };
        let old = match &base {
            Some(b) => Tensor::from_op(Op::View(self.layout().clone()), &[b])?,
            None => self.snapshot(),
        };
        let new = value(&old)?;
        if new.shape() != self.shape() {
            return Err(Error::shape(
                op,
                format!(
                    "the result has shape {} and cannot be written into a tensor of shape {}",
                    new.shape(),
                    self.shape()
                ),
            ));
        }
        if new.dtype().category() > self.dtype().category() {
            return Err(Error::dtype(
                op,
                format!(
                    "the result type {} cannot be cast to the tensor's type {} in place",
                    new.dtype(),
                    self.dtype()
                ),
            ));
        }
        let mut new = new.to_dtype(self.dtype());
        if new.device() != self.device() {
            if !new.is_pending_fill() {
                return Err(Error::Device {
                    op,
                    detail: format!(
                        "cannot write a tensor on {} into one on {}; move it first with .to({})",
                        new.device(),
                        self.device(),
                        self.device()
                    ),
                });
            }
            new = new.rehomed(self.device());
        }
        if grad_on && old.requires_grad() && !new.requires_grad() {
            // A constant overwrote a value with history: keep the tensor in the graph with a
            // zero gradient to that history, as PyTorch's FillBackward does.
            new = Tensor::try_where_(&Tensor::full(new.shape(), true), &new, &old)?;
        }
        if let Some(base) = base
            && (new.requires_grad() || base.requires_grad())
        {
            // The storage's new value is the base with the view's elements replaced; every
            // handle of the storage takes its history from it (`Tensor::grad_fn`).
            let written = Tensor::from_op(Op::Assign(self.layout().clone()), &[&base, &new])?;
            self.storage().replace(written.node());
            crate::engine::session::note_write(self.storage());
            self.storage().note_history_write(crate::engine::origin::caller());
            self.storage().set_autograd_base(std::sync::Arc::new(written));
            return Ok(self.clone());
        }
        if grad_on && new.requires_grad() && !whole {
            return Err(Error::Autograd {
                op,
                detail: format!(
                    "in-place writes into part of a storage (this view of shape {}) are not differentiable yet; use out-of-place ops such as Tensor::where_ or Tensor::cat",
                    self.shape()
                ),
            });
        }
        let base = self.storage().node();
        let whole_base =
            (grad_on && whole && new.requires_grad()).then(|| Tensor::whole_base_of(&new));
        let node = if whole {
            new.node()
        } else {
            LazyNode::pending(
                Op::Assign(self.layout().clone()),
                smallvec::smallvec![base.clone(), new.node()],
                base.shape.clone(),
                base.dtype,
                base.device,
                crate::engine::origin::caller(),
            )
        };
        self.storage().replace(node);
        crate::engine::session::note_write(self.storage());
        if grad_on {
            super::history::adopt_history(self, &new);
            if let Some(base) = whole_base {
                self.storage().set_autograd_base(std::sync::Arc::new(base));
            }
        }
        Ok(self.clone())
    }

    /// The value other handles of the storage (the tensor a view was taken from) take their
    /// history from after a whole write of `new`, as after a write into part of it: a handle
    /// of its own (`new` itself may be a view of the storage, which would then hold itself).
    fn whole_base_of(new: &Tensor) -> Tensor {
        let view = kiln_ir::View::contiguous(new.shape().clone());
        super::history::with_value(new.node(), view, new.grad_fn())
    }

    /// The whole storage's current value with its history, for a write into part of it
    /// under autograd: the value the last such write left, or the tensor this view was taken
    /// from (followed through views of the same storage), or, when neither this view nor
    /// its storage has a history, the values as a constant. `None` when the history cannot
    /// be followed (the write is then refused if it needs gradients).
    fn autograd_base(&self, op: &'static str) -> Result<Option<Tensor>> {
        if let Some(base) = self.storage().autograd_base()
            && let Ok(base) = base.downcast::<Tensor>()
        {
            return Ok(Some((*base).clone()));
        }
        let storage_shape = self.storage().node().shape.clone();
        let mut t = self.clone();
        loop {
            if t.layout().is_identity_of(&storage_shape) {
                if t.is_leaf() && t.requires_grad() {
                    return Err(Error::Autograd {
                        op,
                        detail: "a view of a leaf tensor that requires grad cannot be modified in place; do it inside kiln::no_grad(..), or on a .detach()ed tensor".into(),
                    });
                }
                // The storage's current value, under the history of the handle found.
                let history = super::history::meta(&t).grad_fn.clone();
                let view = t.layout().clone();
                return Ok(Some(super::history::with_value(self.storage().node(), view, history)));
            }
            let Some(f) = super::history::meta(&t).grad_fn.clone() else {
                // No history at all: the values are a constant to the write.
                return Ok(if self.storage().history_writes() == 0 {
                    Some(Tensor::from_node(self.storage().node()))
                } else {
                    None
                });
            };
            let parent = match (&f.op, f.inputs().as_ref()) {
                (Some(Op::View(_)), Some(inputs)) if inputs.len() == 1 => inputs[0].clone(),
                _ => return Ok(None),
            };
            // A view saves a value of its own: whether it was taken from this storage is
            // the recorded source's to say.
            let source = f.sources.first().and_then(std::sync::Weak::upgrade);
            if !source.is_some_and(|s| std::sync::Arc::ptr_eq(&s, self.storage())) {
                return Ok(None);
            }
            t = parent;
        }
    }

    /// A copy with its own storage (PyTorch's `clone()`; Rust's `clone` shares the handle).
    /// Gradients flow through it.
    #[must_use]
    #[track_caller]
    pub fn copy(&self) -> Tensor {
        let out = Tensor::from_node(self.node());
        super::history::record(
            &out,
            || Op::View(kiln_ir::View::contiguous(self.shape().clone())),
            &[self],
        );
        out
    }
}

macro_rules! inplace_binary {
    ($($(#[$doc:meta])* $name:ident, $try_name:ident => $method:ident;)*) => {
        impl Tensor {$(
            $(#[$doc])*
            ///
            /// # Panics
            #[doc = concat!("As [`Tensor::", stringify!($try_name), "`] fails.")]
            #[track_caller]
            pub fn $name<'a>(&self, rhs: impl Into<Operand<'a>>) -> Tensor {
                ok(self.$try_name(rhs))
            }

            #[doc = concat!("[`Tensor::", stringify!($name), "`], returning an error instead of panicking.")]
            ///
            /// # Errors
            /// [`Error::Shape`] when the result would not have this tensor's shape,
            /// [`Error::DType`] when it would need a higher category (a float written into
            /// an integer tensor), [`Error::Autograd`] on a leaf that requires grad.
            #[track_caller]
            pub fn $try_name<'a>(&self, rhs: impl Into<Operand<'a>>) -> Result<Tensor> {
                let rhs = rhs.into();
                self.write(stringify!($name), |old| old.$method(rhs))
            }
        )*}
    };
}

inplace_binary! {
    /// `self += rhs` in place (broadcasting `rhs`), returning `self`.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::zeros([2, 3]);
    /// x.narrow(1, 1, 1).add_(5.0);   // writes through the view into x
    /// assert_eq!(x.to_vec::<f32>(), vec![0.0, 5.0, 0.0, 0.0, 5.0, 0.0]);
    /// ```
    add_, try_add_ => try_add;
    /// `self -= rhs` in place, returning `self`.
    sub_, try_sub_ => try_sub;
    /// `self *= rhs` in place, returning `self`.
    mul_, try_mul_ => try_mul;
    /// `self /= rhs` in place (true division: integer tensors cannot hold the result), returning `self`.
    div_, try_div_ => try_div;
}

impl Tensor {
    /// Clamps to `[min, max]` in place, returning `self`.
    ///
    /// # Panics
    /// As [`Tensor::try_clamp_`] fails.
    #[track_caller]
    pub fn clamp_(&self, min: f64, max: f64) -> Tensor {
        ok(self.try_clamp_(min, max))
    }

    /// [`Tensor::clamp_`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::DType`] when fractional bounds would make an integer tensor float;
    /// [`Error::Autograd`] on a leaf that requires grad.
    #[track_caller]
    pub fn try_clamp_(&self, min: f64, max: f64) -> Result<Tensor> {
        self.write("clamp_", |old| Ok(old.clamp(min, max)))
    }

    /// `max(self, 0)` in place, returning `self`.
    ///
    /// # Panics
    /// As [`Tensor::try_relu_`] fails.
    #[track_caller]
    pub fn relu_(&self) -> Tensor {
        ok(self.try_relu_())
    }

    /// [`Tensor::relu_`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::DType`] on a bool tensor; [`Error::Autograd`] on a leaf that requires grad.
    #[track_caller]
    pub fn try_relu_(&self) -> Result<Tensor> {
        self.write("relu_", Tensor::try_relu)
    }

    /// Sets every element to zero, returning `self`.
    ///
    /// # Panics
    /// As [`Tensor::try_fill_`] fails.
    #[track_caller]
    pub fn zero_(&self) -> Tensor {
        self.fill_(0)
    }

    /// Sets every element to `value` (converted to this tensor's dtype with Rust `as`
    /// semantics, as PyTorch's `fill_` does), returning `self`.
    ///
    /// # Panics
    /// As [`Tensor::try_fill_`] fails.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::zeros([3, 4]);
    /// x.view(&[4, 3]).i((0, 0)).fill_(999.0);
    /// assert_eq!(x.to_vec::<f32>()[0], 999.0);
    /// ```
    #[track_caller]
    pub fn fill_(&self, value: impl Into<Scalar>) -> Tensor {
        ok(self.try_fill_(value))
    }

    /// [`Tensor::fill_`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Autograd`] on a leaf that requires grad (or a view of one); [`Error::Shape`]
    /// on a broadcast view.
    #[track_caller]
    pub fn try_fill_(&self, value: impl Into<Scalar>) -> Result<Tensor> {
        let value = value.into();
        self.write("fill_", |old| Ok(Tensor::full_dtype(old.shape(), value, old.dtype())))
    }

    /// Sets the elements where `mask` (broadcast) is true to `value`, returning `self`
    /// (PyTorch's `masked_fill_`; through a view it writes the base, differentiably).
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0], [3]);
    /// x.masked_fill_(&x.lt(0.0), 0.0);
    /// assert_eq!(x.to_vec::<f32>(), [1.0, 0.0, 3.0]);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_masked_fill_`] fails.
    #[track_caller]
    pub fn masked_fill_(&self, mask: &Tensor, value: impl Into<Scalar>) -> Tensor {
        ok(self.try_masked_fill_(mask, value))
    }

    /// [`Tensor::masked_fill_`], returning an error instead of panicking.
    ///
    /// # Errors
    /// As [`Tensor::try_masked_fill`], and [`Error::Autograd`] on a leaf that requires grad.
    #[track_caller]
    pub fn try_masked_fill_(&self, mask: &Tensor, value: impl Into<Scalar>) -> Result<Tensor> {
        let value = value.into();
        self.write("masked_fill_", |old| old.try_masked_fill(mask, value))
    }

    /// Copies `src` into this tensor (broadcasting it, converting it to this tensor's dtype,
    /// and moving it from another device), returning `self`.
    ///
    /// # Panics
    /// As [`Tensor::try_copy_`] fails.
    #[track_caller]
    pub fn copy_(&self, src: &Tensor) -> Tensor {
        ok(self.try_copy_(src))
    }

    /// [`Tensor::copy_`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] when `src` does not broadcast to this tensor's shape;
    /// [`Error::Autograd`] on a leaf that requires grad.
    #[track_caller]
    pub fn try_copy_(&self, src: &Tensor) -> Result<Tensor> {
        let shape = self.shape().clone();
        let dtype = self.dtype();
        // A copy between devices moves the data first (as PyTorch's `copy_` does).
        let moved;
        let src = if src.device() != self.device() && !src.is_pending_fill() {
            moved = src.try_to(self.device())?;
            &moved
        } else {
            src
        };
        self.write("copy_", |_| {
            let target = src.shape().broadcast(&shape, "copy_")?;
            if target != shape {
                return Err(Error::shape(
                    "copy_",
                    format!(
                        "src of shape {} cannot be broadcast to the tensor's shape {shape}",
                        src.shape()
                    ),
                ));
            }
            Ok(src.to_dtype(dtype).broadcast_to(&shape))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::Tensor;

    /// Writes under autograd whose values read the tensor written (or a result its history
    /// holds), never differentiated: the storage is freed with its last handle, as no
    /// history holds a handle whose history holds it back.
    #[test]
    fn writes_that_read_their_own_tensor_free_its_storage() {
        type Write = fn(&Tensor);
        let writes: [(&str, Write); 6] = [
            ("whole, from itself", |y| {
                y.copy_(&(y * 2.0));
            }),
            ("whole, from a view of itself", |y| {
                y.copy_(&y.flip(&[0]));
            }),
            ("whole, from an earlier result", |y| {
                let z = y * 3.0;
                y.copy_(&z);
            }),
            ("part, in place", |y| {
                y.narrow(0, 0, 2).mul_(2.0);
            }),
            ("part, from itself", |y| {
                let v = y.narrow(0, 0, 2);
                v.copy_(&(&v * 2.0));
            }),
            ("part, from the whole", |y| {
                y.narrow(1, 1, 2).copy_(&(y.narrow(1, 0, 2) + y.narrow(1, 2, 2)));
            }),
        ];
        let x = Tensor::randn([4, 4]).requires_grad_(true);
        for (name, write) in writes {
            let y = &x * 1.0;
            let storage = Arc::downgrade(y.storage());
            write(&y);
            y.realize();
            drop(y);
            assert!(storage.upgrade().is_none(), "{name}: the storage outlives its handles");
        }
    }
}
