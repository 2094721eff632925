//! Hooks that run when backward has accumulated a leaf's gradient (PyTorch's
//! `register_post_accumulate_grad_hook`): the gradient is still lazy then, so what a hook
//! records (a distributed all-reduce, say) is computed together with the backward pass.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::tensor::history::{GradHook, meta};
use crate::{Result, Tensor};

static NEXT_HOOK: AtomicU64 = AtomicU64::new(0);

/// Removes a hook registered with [`Tensor::register_post_accumulate_grad_hook`].
#[derive(Debug)]
#[must_use = "dropping the handle keeps the hook; call `remove` to take it off"]
pub struct HookHandle {
    tensor: Tensor,
    id: u64,
}

impl HookHandle {
    /// Takes the hook off its tensor.
    pub fn remove(self) {
        meta(&self.tensor).hooks.retain(|(id, _)| *id != self.id);
    }
}

impl Tensor {
    /// Calls `hook` with this leaf each time a backward pass has accumulated its gradient
    /// into [`Tensor::grad`], before the gradients are computed: the gradient is lazy, and
    /// what the hook records (replacing it with [`Tensor::set_grad`], say) is computed in
    /// the same graph as the rest of backward. Hooks of the leaves run in the order
    /// backward reaches them. An error from a hook fails the backward call.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let w = Tensor::ones([3]).requires_grad_(true);
    /// let _handle = w.register_post_accumulate_grad_hook(|w| {
    ///     let doubled = w.grad().map(|g| g * 2.0);
    ///     w.set_grad(doubled);
    ///     Ok(())
    /// });
    /// (&w * 3.0).sum().backward();
    /// assert_eq!(w.grad().unwrap().to_vec::<f32>(), vec![6.0; 3]);
    /// ```
    pub fn register_post_accumulate_grad_hook(
        &self,
        hook: impl Fn(&Tensor) -> Result<()> + Send + Sync + 'static,
    ) -> HookHandle {
        let id = NEXT_HOOK.fetch_add(1, Ordering::Relaxed);
        meta(self).hooks.push((id, Arc::new(hook)));
        HookHandle { tensor: self.clone(), id }
    }
}

/// Runs every hook of `leaf` (with its gradient accumulated).
pub(crate) fn run(leaf: &Tensor) -> Result<()> {
    let hooks: Vec<GradHook> = meta(leaf).hooks.iter().map(|(_, h)| h.clone()).collect();
    hooks.iter().try_for_each(|h| h(leaf))
}

/// The leaves that require grad and that a backward pass from `output` would reach (what
/// distributed data parallelism needs to know about parameters a forward pass left unused).
pub(crate) fn reachable_leaves(output: &Tensor) -> Vec<Tensor> {
    let mut leaves = Vec::new();
    let Some(root) = output.grad_fn() else {
        if output.requires_grad() {
            leaves.push(output.clone());
        }
        return leaves;
    };
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![root];
    while let Some(node) = stack.pop() {
        if !seen.insert(Arc::as_ptr(&node)) {
            continue;
        }
        let inputs = node.inputs().clone().unwrap_or_default();
        for (input, edge) in inputs.iter().zip(&node.edges) {
            match edge {
                Some(f) => stack.push(f.clone()),
                None if input.requires_grad() && input.grad_fn().is_none() => {
                    leaves.push(input.clone());
                }
                None => {}
            }
        }
    }
    leaves
}
