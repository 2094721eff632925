//! The autograd history a tensor carries: whether it requires grad, the grad node of the op
//! that made it, its accumulated gradient. Recording ops attach grad nodes here; the
//! backward pass ([`crate::autograd`], above the tensor API) walks them.

use std::panic::Location;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use kiln_ir::autodiff;
use kiln_ir::{DType, Op};

use super::TensorInner;
use super::grad_mode::is_grad_enabled;
use crate::engine::storage::Storage;
use crate::error::ok;
use crate::{Error, Result, Tensor};

/// A post-accumulate-grad hook.
pub(crate) type GradHook = Arc<dyn Fn(&Tensor) -> Result<()> + Send + Sync>;

/// A tensor's autograd state.
#[derive(Default)]
pub(crate) struct AutogradMeta {
    /// Set by `requires_grad_` on a leaf.
    pub(crate) requires_grad: bool,
    /// The op that produced a non-leaf tensor.
    pub(crate) grad_fn: Option<Arc<GradNode>>,
    /// How many history-changing in-place writes the storage had seen when `grad_fn` was
    /// set: a later one (through another view) leaves `grad_fn` describing old values.
    pub(crate) writes_seen: u64,
    /// The accumulated gradient (leaves, and non-leaves that `retain_grad`).
    pub(crate) grad: Option<Tensor>,
    pub(crate) retain_grad: bool,
    /// Post-accumulate-grad hooks, with the ids their handles remove them by.
    pub(crate) hooks: Vec<(u64, GradHook)>,
}

/// One differentiable op in the autograd graph.
pub(crate) struct GradNode {
    /// The op, or `None` for a copy between devices (whose gradient is the copy back).
    pub(crate) op: Option<Op>,
    /// The op's inputs as saved ([`save`]: a leaf that requires grad itself, any other
    /// tensor its value then under that history); `None` once a backward pass without
    /// `retain_graph` freed them.
    pub(crate) inputs: Mutex<Option<Vec<Tensor>>>,
    /// Each input's history when the op was recorded: where its gradient goes. (An
    /// in-place write later gives the input's handle a new history, which the gradient of
    /// this op must not flow into.)
    pub(crate) edges: Vec<Option<Arc<GradNode>>>,
    /// The storage version of each input when the op was recorded.
    pub(crate) versions: Vec<u64>,
    /// Each input's storage, to tell a later in-place write by its version (weakly: a
    /// storage a history holds could hold that history back, through a handle a write
    /// gave it, and neither would be freed).
    pub(crate) sources: Vec<Weak<Storage>>,
    /// The tensor this node produced, for `retain_grad`.
    pub(crate) output: Weak<TensorInner>,
    /// Where the op was recorded.
    pub(crate) origin: &'static Location<'static>,
    /// The user-defined op it was recorded inside: its gradient's nodes carry the label
    /// too, marked as gradient.
    pub(crate) label: Option<kiln_ir::Label>,
    /// Why no gradient may flow through this node (a view whose values an in-place write
    /// through another view changed); backward fails with it if a gradient reaches it.
    pub(crate) refused: Option<String>,
    /// A user-defined op's gradient, in place of the op's IR rule: given the saved inputs
    /// (the op's inputs, then its output) and the output's gradient.
    pub(crate) backward: Option<Arc<CustomBackward>>,
}

/// A user-defined op's gradient (see [`GradNode::backward`]).
pub(crate) type CustomBackward =
    dyn Fn(&[Tensor], &Tensor) -> Result<Vec<Option<Tensor>>> + Send + Sync;

impl GradNode {
    pub(crate) fn name(&self) -> &'static str {
        self.op.as_ref().map_or("to", Op::name)
    }

    pub(crate) fn inputs(&self) -> MutexGuard<'_, Option<Vec<Tensor>>> {
        self.inputs.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for GradNode {
    // A long chain of results would otherwise be freed recursively (through each tensor's
    // grad_fn), overflowing the stack: unlink it onto an explicit stack instead.
    fn drop(&mut self) {
        let mut stack: Vec<Tensor> =
            self.inputs.get_mut().map(Option::take).ok().flatten().unwrap_or_default();
        let mut nodes: Vec<Arc<GradNode>> =
            std::mem::take(&mut self.edges).into_iter().flatten().collect();
        loop {
            if let Some(t) = stack.pop() {
                let Some(inner) = Arc::into_inner(t.0) else { continue };
                let meta = inner.autograd.into_inner().unwrap_or_else(PoisonError::into_inner);
                stack.extend(meta.grad);
                nodes.extend(meta.grad_fn);
            } else if let Some(node) = nodes.pop() {
                if let Some(mut node) = Arc::into_inner(node) {
                    stack.extend(
                        node.inputs.get_mut().map(Option::take).ok().flatten().unwrap_or_default(),
                    );
                    nodes.extend(std::mem::take(&mut node.edges).into_iter().flatten());
                }
            } else {
                break;
            }
        }
    }
}

pub(crate) fn meta(t: &Tensor) -> MutexGuard<'_, AutogradMeta> {
    t.0.autograd.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether a new result of `op` over `inputs` must record a [`GradNode`].
pub(crate) fn wants_grad(op: &Op, out_dtype: DType, inputs: &[&Tensor]) -> bool {
    is_grad_enabled()
        && out_dtype.is_float()
        && autodiff::is_differentiable(op)
        && inputs.iter().any(|t| t.requires_grad())
}

/// Attaches a [`GradNode`] for `op` over `inputs` to `out`.
#[track_caller]
pub(crate) fn attach(out: &Tensor, op: Op, inputs: &[&Tensor]) {
    let edges: Vec<Option<Arc<GradNode>>> = inputs.iter().map(|t| t.grad_fn()).collect();
    let node = GradNode {
        op: Some(op),
        inputs: Mutex::new(Some(save_all(inputs, &edges))),
        versions: inputs.iter().map(|t| t.storage().version()).collect(),
        sources: inputs.iter().map(|t| Arc::downgrade(t.storage())).collect(),
        edges,
        output: Arc::downgrade(&out.0),
        origin: crate::engine::origin::caller(),
        label: crate::engine::lazy::current_label(),
        refused: None,
        backward: None,
    };
    set_history(out, Some(Arc::new(node)));
}

/// [`save`] of each input, once per handle (`x * x` saves `x` once).
fn save_all(inputs: &[&Tensor], edges: &[Option<Arc<GradNode>>]) -> Vec<Tensor> {
    let mut saved: Vec<Tensor> = Vec::with_capacity(inputs.len());
    for (i, (t, e)) in inputs.iter().zip(edges).enumerate() {
        let earlier = inputs[..i].iter().position(|u| Arc::ptr_eq(&u.0, &t.0));
        saved.push(match earlier {
            Some(j) => saved[j].clone(),
            None => save(t, e),
        });
    }
    saved
}

/// `t` as a grad node saves it: a leaf that requires grad is itself (its gradient
/// accumulates there); any other tensor is its current value in a storage of its own with
/// the history `edge`, so that no later in-place write through `t` gives the saved
/// handle a history that holds this node (a cycle that would never be freed).
fn save(t: &Tensor, edge: &Option<Arc<GradNode>>) -> Tensor {
    if meta(t).requires_grad {
        return t.clone();
    }
    with_value(t.storage().node(), t.layout().clone(), edge.clone())
}

/// A handle of `node`'s value, in a storage of its own, read through `view`, with the
/// history `grad_fn`.
pub(crate) fn with_value(
    node: Arc<crate::engine::lazy::LazyNode>,
    view: kiln_ir::View,
    grad_fn: Option<Arc<GradNode>>,
) -> Tensor {
    let autograd = AutogradMeta { grad_fn, ..AutogradMeta::default() };
    Tensor(Arc::new(TensorInner {
        storage: Storage::new(node),
        view,
        autograd: Mutex::new(autograd),
        dynamic: Default::default(),
    }))
}

/// Attaches to `out` the grad node of the user-defined op `op` over `inputs`: `backward`
/// computes its gradients from the inputs and `output` (a detached alias of `out`, saved
/// beside them), or without one, `refused` says why there is none.
#[track_caller]
pub(crate) fn attach_custom(
    out: &Tensor,
    op: Op,
    inputs: &[&Tensor],
    backward: Result<Arc<CustomBackward>, String>,
) {
    let label = kiln_ir::Label { name: op.name(), grad: false };
    attach_rule(out, op, Some(label), inputs, backward);
}

/// Attaches to `out`, the result of a built-in composite `op` over `inputs`, a grad node
/// with a hand-written `backward` in place of the gradients of the ops it is made of (as
/// `cat`'s: one view of the gradient per piece, not a chain of masked copies).
#[track_caller]
pub(crate) fn attach_composite(
    out: &Tensor,
    op: Op,
    inputs: &[&Tensor],
    backward: Arc<CustomBackward>,
) {
    attach_rule(out, op, crate::engine::lazy::current_label(), inputs, Ok(backward));
}

#[track_caller]
fn attach_rule(
    out: &Tensor,
    op: Op,
    label: Option<kiln_ir::Label>,
    inputs: &[&Tensor],
    backward: Result<Arc<CustomBackward>, String>,
) {
    let edges: Vec<Option<Arc<GradNode>>> =
        inputs.iter().map(|t| t.grad_fn()).chain([None]).collect();
    let originals: Vec<&Tensor> = inputs.iter().copied().chain([out]).collect();
    let output = out.detach();
    let saved: Vec<Tensor> =
        inputs.iter().zip(&edges).map(|(t, e)| save(t, e)).chain([save(&output, &None)]).collect();
    let (backward, refused) = match backward {
        Ok(b) => (Some(b), None),
        Err(why) => (None, Some(why)),
    };
    let node = GradNode {
        op: Some(op),
        versions: originals.iter().map(|t| t.storage().version()).collect(),
        sources: originals.iter().map(|t| Arc::downgrade(t.storage())).collect(),
        edges,
        inputs: Mutex::new(Some(saved)),
        output: Arc::downgrade(&out.0),
        origin: crate::engine::origin::caller(),
        label,
        refused,
        backward,
    };
    set_history(out, Some(Arc::new(node)));
}

/// Another handle of `t`'s storage and view whose history is `f`: a user-defined op's
/// saved output as its backward sees it, so that a gradient recorded from it flows back
/// through the op again (saved without it, which would make a cycle through the node).
pub(crate) fn with_history(t: &Tensor, f: Arc<GradNode>) -> Tensor {
    let out = t.with_view(t.layout().clone());
    set_history(&out, Some(f));
    out
}

/// Makes `f` the history of `t`, as of the storage's current in-place writes.
fn set_history(t: &Tensor, f: Option<Arc<GradNode>>) {
    let writes = t.storage().history_writes();
    let mut m = meta(t);
    m.grad_fn = f;
    m.writes_seen = writes;
}

/// Attaches the grad node of a copy of `input` to another device to `out`, if `input` needs
/// gradients.
#[track_caller]
pub(crate) fn record_copy(out: &Tensor, input: &Tensor) {
    if is_grad_enabled() && out.dtype().is_float() && input.requires_grad() {
        let edge = input.grad_fn();
        let node = GradNode {
            op: None,
            inputs: Mutex::new(Some(vec![save(input, &edge)])),
            edges: vec![edge],
            versions: vec![input.storage().version()],
            sources: vec![Arc::downgrade(input.storage())],
            output: Arc::downgrade(&out.0),
            origin: crate::engine::origin::caller(),
            label: crate::engine::lazy::current_label(),
            refused: None,
            backward: None,
        };
        set_history(out, Some(Arc::new(node)));
    }
}

/// The autograd state a snapshot of `t` starts with: the same flag and history.
pub(crate) fn snapshot_meta(t: &Tensor) -> AutogradMeta {
    let m = meta(t);
    AutogradMeta {
        requires_grad: m.requires_grad,
        grad_fn: m.grad_fn.clone(),
        writes_seen: m.writes_seen,
        grad: None,
        retain_grad: false,
        hooks: Vec::new(),
    }
}

/// Makes `target`'s history that of `value` (after an in-place write put `value` into it).
///
/// Every other handle of `target`'s storage whose history is older now reads new values
/// through an old history: a gradient reaching it is refused (see [`Tensor::grad_fn`]).
#[track_caller]
pub(crate) fn adopt_history(target: &Tensor, value: &Tensor) {
    let grad_fn = value.grad_fn();
    if grad_fn.is_some() {
        target.storage().note_history_write(crate::engine::origin::caller());
        set_history(target, grad_fn);
    }
}

/// Attaches a [`GradNode`] if `wants_grad`, building the op only then.
#[track_caller]
pub(crate) fn record(out: &Tensor, op: impl FnOnce() -> Op, inputs: &[&Tensor]) {
    if is_grad_enabled() && out.dtype().is_float() && inputs.iter().any(|t| t.requires_grad()) {
        attach(out, op(), inputs);
    }
}

impl Tensor {
    /// Sets whether this leaf tensor records operations for autograd, and returns it.
    ///
    /// # Panics
    /// On a non-leaf tensor or a non-float tensor; [`Tensor::try_requires_grad_`] returns
    /// the error.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::scalar(2.0f32).requires_grad_(true);
    /// let y = &x * &x + &x * 3.0 + 1.0;
    /// y.backward();
    /// assert_eq!(x.grad().unwrap().item::<f32>(), 7.0);
    /// ```
    #[track_caller]
    pub fn requires_grad_(&self, requires_grad: bool) -> Tensor {
        ok(self.try_requires_grad_(requires_grad))
    }

    /// [`Tensor::requires_grad_`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Autograd`] on a non-leaf tensor, [`Error::DType`] on a non-float tensor.
    pub fn try_requires_grad_(&self, requires_grad: bool) -> Result<Tensor> {
        if !self.is_leaf() {
            return Err(Error::Autograd {
                op: "requires_grad_",
                detail: "can only change the flag of leaf tensors; to use a computed tensor without its history, call .detach() first".into(),
            });
        }
        if requires_grad && !self.dtype().is_float() {
            return Err(Error::dtype(
                "requires_grad_",
                format!("only floating-point tensors can require gradients, got {}", self.dtype()),
            ));
        }
        meta(self).requires_grad = requires_grad;
        Ok(self.clone())
    }

    /// Whether gradients flow to or through this tensor.
    pub fn requires_grad(&self) -> bool {
        let (flag, has, seen) = {
            let m = meta(self);
            (m.requires_grad, m.grad_fn.is_some(), m.writes_seen)
        };
        if flag || self.storage().history_write_after(seen).is_none() {
            return flag || has;
        }
        // A write into part of the storage since: the history is the base's, through this view.
        self.grad_fn().is_some()
    }

    /// Whether this tensor was made by the user rather than by a recorded op (the tensors
    /// whose `.grad()` backward fills).
    pub fn is_leaf(&self) -> bool {
        meta(self).grad_fn.is_none()
    }

    /// This tensor's history. After an in-place write into part of its storage under
    /// autograd (PyTorch's `CopySlices`), it is this view of the written base, whose history
    /// the write recorded: taken once and kept. After another history-changing write (a
    /// whole write through another handle), a refusal: kiln must not differentiate the old
    /// values.
    pub(crate) fn grad_fn(&self) -> Option<Arc<GradNode>> {
        let (f, seen) = {
            let m = meta(self);
            (m.grad_fn.clone(), m.writes_seen)
        };
        let Some(write) = self.storage().history_write_after(seen) else { return f };
        if let Some(base) = self.storage().autograd_base()
            && let Ok(base) = base.downcast::<Tensor>()
        {
            let edge = base.grad_fn();
            let node = Arc::new(GradNode {
                op: Some(Op::View(self.layout().clone())),
                inputs: Mutex::new(Some(vec![save(&base, &edge)])),
                edges: vec![edge],
                versions: vec![base.storage().version()],
                sources: vec![Arc::downgrade(base.storage())],
                output: Arc::downgrade(&self.0),
                origin: write,
                label: None,
                refused: None,
                backward: None,
            });
            set_history(self, Some(node.clone()));
            return Some(node);
        }
        let f = f?;
        Some(Arc::new(GradNode {
            op: f.op.clone(),
            inputs: Mutex::new(Some(Vec::new())),
            edges: Vec::new(),
            versions: Vec::new(),
            sources: Vec::new(),
            output: Arc::downgrade(&self.0),
            origin: f.origin,
            label: f.label,
            backward: f.backward.clone(),
            refused: Some(format!(
                "a tensor of shape {} made by `{}` at {} is a view whose values an in-place write through another view of its storage (at {write}) changed; kiln cannot differentiate through such a view yet: take the view again after the write, or write out of place (Tensor::where_, Tensor::cat)",
                self.shape(),
                f.name(),
                f.origin
            )),
        }))
    }

    /// The name of the op that made this tensor, for display (`None` for leaves).
    pub(crate) fn grad_fn_name(&self) -> Option<&'static str> {
        meta(self).grad_fn.as_ref().map(|f| f.name())
    }

    /// The gradient accumulated by backward passes: on leaves that require grad, and on
    /// non-leaves after [`Tensor::retain_grad`]. `None` before the first backward.
    pub fn grad(&self) -> Option<Tensor> {
        meta(self).grad.clone()
    }

    /// Clears the accumulated gradient (PyTorch's `grad = None`).
    pub fn zero_grad(&self) {
        meta(self).grad = None;
    }

    /// Replaces the accumulated gradient.
    pub fn set_grad(&self, grad: Option<Tensor>) {
        meta(self).grad = grad;
    }

    /// Asks backward to fill `.grad()` of this non-leaf tensor too.
    pub fn retain_grad(&self) {
        meta(self).retain_grad = true;
    }

    /// The same data with no autograd history, sharing storage.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::ones([2]).requires_grad_(true);
    /// let y = (&x * 2.0).detach();
    /// assert!(!y.requires_grad() && y.is_leaf());
    /// ```
    #[must_use]
    pub fn detach(&self) -> Tensor {
        self.with_view(self.layout().clone())
    }
}
