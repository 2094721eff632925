//! Symbolic autograd: backward adds gradient ops to the lazy graph.
//!
//! Every differentiable op on a tensor that requires grad attaches a grad node to its
//! result: the primitive op and its input tensors. `backward` walks these nodes in reverse
//! topological order and applies each op's rule from [`kiln_ir::autodiff`], recording the
//! gradient computation as ordinary lazy tensor ops; the leaf gradients are then realized
//! together, so the backward pass is one graph. With `create_graph` the gradient ops record
//! history themselves, which is all that higher-order derivatives need.

mod check;
mod hooks;

use rustc_hash::FxHashMap as HashMap;
use std::sync::{Arc, PoisonError};

use kiln_ir::autodiff::{self, GradBuilder};
use kiln_ir::{DType, Op, Shape};

pub use crate::tensor::grad_mode::{
    GradModeGuard, InferenceModeGuard, NoGradGuard, enable_grad, inference_mode, is_grad_enabled,
    no_grad,
};
pub use check::gradcheck;
pub use hooks::HookHandle;
pub(crate) use hooks::reachable_leaves;

use crate::error::ok;
use crate::tensor::TensorInner;
use crate::tensor::history::{GradNode, meta};
use crate::{Error, Result, Tensor};

/// Options of [`Tensor::backward_with`], as in PyTorch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackwardOptions {
    /// Keep the graph's saved tensors so that it can be differentiated again.
    pub retain_graph: bool,
    /// Record the gradient computation itself, so gradients can be differentiated
    /// (higher-order derivatives). Implies `retain_graph`.
    pub create_graph: bool,
}

/// Records gradient ops as lazy tensors.
struct TensorBuilder;

impl GradBuilder for TensorBuilder {
    type Node = Tensor;
    type Error = Error;

    fn shape(&self, n: &Tensor) -> Shape {
        n.shape().clone()
    }

    fn dtype(&self, n: &Tensor) -> DType {
        n.dtype()
    }

    #[track_caller]
    fn op(&mut self, op: Op, inputs: &[Tensor]) -> Result<Tensor> {
        let refs: Vec<&Tensor> = inputs.iter().collect();
        Tensor::from_op(op, &refs)
    }

    #[track_caller]
    fn leaf(&mut self, op: Op, shape: Shape, dtype: DType) -> Result<Tensor> {
        Tensor::from_leaf(op, shape, dtype)
    }

    #[track_caller]
    fn leaf_beside(&mut self, op: Op, shape: Shape, dtype: DType, like: &Tensor) -> Result<Tensor> {
        Tensor::from_leaf_on(op, shape, dtype, like.device())
    }
}

/// The key of a tensor's handle (leaves are identified by it).
fn key(t: &Tensor) -> *const TensorInner {
    Arc::as_ptr(&t.0)
}

fn add_grad(slot: Option<Tensor>, g: Tensor) -> Result<Tensor> {
    match slot {
        None => Ok(g),
        Some(acc) => acc.try_add(&g),
    }
}

/// The gradients flowing into each node and leaf during one backward pass.
struct Pass {
    /// Total gradient of each node's output, by node address.
    nodes: HashMap<*const GradNode, Tensor>,
    /// Gradient of each leaf, in first-seen order.
    leaves: Vec<(Tensor, Tensor)>,
    leaf_index: HashMap<*const TensorInner, usize>,
    /// Gradients of the wanted non-leaf tensors, by their node.
    captured: HashMap<*const GradNode, Tensor>,
}

impl Pass {
    /// Adds `g` to the gradient of `t`'s current history.
    fn route(&mut self, t: &Tensor, g: Tensor) -> Result<()> {
        self.route_to(t, t.grad_fn().as_ref(), g)
    }

    /// Adds `g` to the gradient of the history `f` of `t` (a leaf's own when `None`).
    fn route_to(&mut self, t: &Tensor, f: Option<&Arc<GradNode>>, g: Tensor) -> Result<()> {
        match f {
            Some(f) => {
                let k = Arc::as_ptr(f);
                let acc = self.nodes.remove(&k);
                self.nodes.insert(k, add_grad(acc, g)?);
            }
            None => match self.leaf_index.get(&key(t)) {
                Some(&i) => {
                    let acc = self.leaves[i].1.clone();
                    self.leaves[i].1 = acc.try_add(&g)?;
                }
                None => {
                    self.leaf_index.insert(key(t), self.leaves.len());
                    self.leaves.push((t.clone(), g));
                }
            },
        }
        Ok(())
    }
}

/// The nodes reachable from the roots, inputs before the nodes that read them (an
/// iterative depth-first walk along the recorded edges).
fn topological_order(roots: &[(Tensor, Tensor)], op: &'static str) -> Result<Vec<Arc<GradNode>>> {
    let mut order: Vec<Arc<GradNode>> = Vec::new();
    let mut seen: HashMap<*const GradNode, ()> = HashMap::default();
    let mut stack: Vec<(Arc<GradNode>, bool)> =
        roots.iter().filter_map(|(t, _)| t.grad_fn()).map(|f| (f, false)).collect();
    while let Some((node, expanded)) = stack.pop() {
        let k = Arc::as_ptr(&node);
        if expanded {
            order.push(node);
            continue;
        }
        if seen.insert(k, ()).is_some() {
            continue;
        }
        if node.inputs().is_none() {
            return Err(freed_error(op, &node));
        }
        let edges: Vec<Arc<GradNode>> = node.edges.iter().rev().flatten().cloned().collect();
        stack.push((node, true));
        for f in edges {
            if !seen.contains_key(&Arc::as_ptr(&f)) {
                stack.push((f, false));
            }
        }
    }

    Ok(order)
}

/// Runs a backward pass from `roots` (each with its seed gradient). Returns the gradients of
/// `wanted` if given (without touching `.grad`), else accumulates into the leaves' `.grad`.
fn run_backward(
    roots: &[(Tensor, Tensor)],
    opts: BackwardOptions,
    wanted: Option<&[&Tensor]>,
    op: &'static str,
) -> Result<Vec<Tensor>> {
    let retain_graph = opts.retain_graph || opts.create_graph;
    let _mode = GradModeGuard::new(opts.create_graph);

    let order = topological_order(roots, op)?;

    let mut pass = Pass {
        nodes: HashMap::default(),
        leaves: Vec::new(),
        leaf_index: HashMap::default(),
        captured: HashMap::default(),
    };
    for (root, seed) in roots {
        pass.route(root, seed.clone())?;
    }
    let wanted_nodes: Vec<*const GradNode> =
        wanted.unwrap_or(&[]).iter().filter_map(|t| t.grad_fn()).map(|f| Arc::as_ptr(&f)).collect();

    for node in order.iter().rev() {
        let k = Arc::as_ptr(node);
        let Some(g) = pass.nodes.remove(&k) else { continue };
        if wanted_nodes.contains(&k) {
            pass.captured.insert(k, g.clone());
        }
        if wanted.is_none()
            && let Some(out) = node.output.upgrade()
        {
            let mut m = out.autograd.lock().unwrap_or_else(PoisonError::into_inner);
            if m.retain_grad {
                let previous = m.grad.take();
                drop(m);
                let total = add_grad(previous.map(|p| p.detach()), g.detach())?;
                out.autograd.lock().unwrap_or_else(PoisonError::into_inner).grad = Some(total);
            }
        }
        if let Some(why) = &node.refused {
            return Err(Error::Autograd { op, detail: why.clone() });
        }
        let inputs = node.inputs().clone().ok_or_else(|| freed_error(op, node))?;
        check_versions(op, node, &inputs)?;
        // The gradient ops are recorded as coming from the forward op's line, so profiles and
        // errors point at user code rather than at the gradient rules.
        // A user-defined op's gradient is labelled as such (and an unlabelled op's is not,
        // even when a labelled op's backward is running it).
        let label = node.label.map(|l| kiln_ir::Label { grad: true, ..l });
        let grads = crate::engine::lazy::with_origin(node.origin, || {
            crate::engine::lazy::with_label(label, || match (&node.op, &node.backward) {
                (_, Some(backward)) => {
                    // The saved output (last) carries this node's history again.
                    let mut saved = inputs.clone();
                    if let Some(output) = saved.last_mut() {
                        *output = crate::tensor::history::with_history(output, Arc::clone(node));
                    }
                    backward(&saved, &g)
                }
                (Some(op), None) => autodiff::vjp(&mut TensorBuilder, op, &inputs, &g),
                (None, None) => inputs.iter().map(|x| g.try_to(x.device()).map(Some)).collect(),
            })
        })?;
        for ((input, edge), gi) in inputs.iter().zip(&node.edges).zip(grads) {
            if let Some(gi) = gi
                && (edge.is_some() || input.requires_grad())
            {
                pass.route_to(input, edge.as_ref(), gi)?;
            }
        }
    }
    if !retain_graph {
        for node in &order {
            *node.inputs() = None;
        }
    }

    if let Some(wanted) = wanted {
        let mut out = Vec::with_capacity(wanted.len());
        for (i, t) in wanted.iter().enumerate() {
            let g = match t.grad_fn() {
                Some(f) => pass.captured.remove(&Arc::as_ptr(&f)),
                None => pass.leaf_index.get(&key(t)).map(|&j| pass.leaves[j].1.clone()),
            };
            out.push(g.ok_or_else(|| Error::NoGradient {
                op,
                detail: format!(
                    "input {i} (shape {}) was not used to compute the outputs, so it has no gradient",
                    t.shape()
                ),
            })?);
        }
        let refs: Vec<&Tensor> = out.iter().collect();
        Tensor::try_realize_all(&refs)?;
        return Ok(out);
    }

    let mut updated = Vec::with_capacity(pass.leaves.len());
    for (leaf, g) in pass.leaves {
        if !leaf.requires_grad() {
            continue;
        }
        let previous = meta(&leaf).grad.take();
        let total = add_grad(previous, g)?;
        meta(&leaf).grad = Some(total);
        updated.push(leaf);
    }
    for leaf in &updated {
        hooks::run(leaf)?;
    }
    // What the hooks left in `.grad()` is what is computed.
    let updated: Vec<Tensor> = updated.iter().filter_map(|leaf| meta(leaf).grad.clone()).collect();
    let refs: Vec<&Tensor> = updated.iter().collect();
    Tensor::try_realize_all(&refs)?;
    Ok(Vec::new())
}

/// Fails if an input whose value the gradient rule reads was modified in place after the op
/// was recorded (its values are gone, so the gradient would be wrong).
fn check_versions(op: &'static str, node: &GradNode, inputs: &[Tensor]) -> Result<()> {
    let saved = inputs.iter().zip(&node.versions).zip(&node.sources);
    for (i, ((t, &saved), source)) in saved.enumerate() {
        // A storage no handle holds any more can be written no more; the values saved
        // are the values read.
        let Some(now) = source.upgrade().map(|s| s.version()) else { continue };
        // A copy reads no input values: its gradient is the copy back.
        if now != saved && node.op.as_ref().is_some_and(|op| autodiff::reads_input(op, i)) {
            return Err(Error::Autograd {
                op,
                detail: format!(
                    "input {i} (shape {}) of `{}` (recorded at {}) was modified by an in-place operation: it is at version {now}, the gradient needs version {saved}; use the out-of-place form (add instead of add_), or .copy() the tensor before modifying it",
                    t.shape(),
                    node.name(),
                    node.origin
                ),
            });
        }
    }
    Ok(())
}

fn freed_error(op: &'static str, node: &GradNode) -> Error {
    Error::Autograd {
        op,
        detail: format!(
            "trying to backward through the graph a second time: the tensors saved by `{}` (recorded at {}) were freed by the first backward; pass retain_graph: true to the first call if you need to backward twice",
            node.name(),
            node.origin
        ),
    }
}

/// The seed gradient of a root: ones for a one-element output, else `gradient`, checked.
#[track_caller]
fn seed(output: &Tensor, gradient: Option<&Tensor>, op: &'static str) -> Result<Tensor> {
    if !output.requires_grad() {
        return Err(Error::NoGradient {
            op,
            detail: format!(
                "the output (shape {}) does not require grad and has no grad_fn: nothing it was computed from requires grad; call .requires_grad_(true) on the leaves you want gradients for",
                output.shape()
            ),
        });
    }
    match gradient {
        Some(g) if g.shape() != output.shape() => Err(Error::shape(
            op,
            format!(
                "the gradient has shape {} but the output has shape {}; they must match",
                g.shape(),
                output.shape()
            ),
        )),
        Some(g) => Ok(g.to_dtype(output.dtype())),
        None if output.numel() == 1 => {
            // A guard, not a closure, so that the seed records the caller's line.
            let _no_grad = NoGradGuard::new();
            Ok(output.ones_like())
        }
        None => Err(Error::Autograd {
            op,
            detail: format!(
                "a gradient can be created implicitly only for one-element outputs, but the output has shape {}; pass one with .backward_with(Some(&gradient), options)",
                output.shape()
            ),
        }),
    }
}

/// The gradients of the sums of `outputs` with respect to each of `inputs`, as PyTorch's
/// `torch.autograd.grad` computes them: `.grad` fields are not touched. With `create_graph`
/// the gradients record their own history, so they can be differentiated again.
///
/// # Panics
/// As [`try_grad`] fails.
///
/// ```
/// use kiln::prelude::*;
/// let x = Tensor::scalar(3.0f64).requires_grad_(true);
/// let y = x.pow(3.0);
/// let dy = kiln::grad(&[&y], &[&x], true)[0].clone();   // 3x^2 = 27
/// let d2y = kiln::grad(&[&dy], &[&x], false)[0].clone(); // 6x = 18
/// assert_eq!((dy.item::<f64>(), d2y.item::<f64>()), (27.0, 18.0));
/// ```
#[track_caller]
pub fn grad(outputs: &[&Tensor], inputs: &[&Tensor], create_graph: bool) -> Vec<Tensor> {
    ok(try_grad(outputs, inputs, create_graph))
}

/// [`grad`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::NoGradient`] when an output does not require grad or an input was not used to
/// compute the outputs; [`Error::Autograd`] when an output is not a one-element tensor, or
/// the graph was freed by an earlier backward.
#[track_caller]
pub fn try_grad(
    outputs: &[&Tensor],
    inputs: &[&Tensor],
    create_graph: bool,
) -> Result<Vec<Tensor>> {
    let roots: Vec<(Tensor, Tensor)> =
        outputs.iter().map(|&o| Ok((o.clone(), seed(o, None, "grad")?))).collect::<Result<_>>()?;
    let opts = BackwardOptions { retain_graph: create_graph, create_graph };
    run_backward(&roots, opts, Some(inputs), "grad")
}

impl Tensor {
    /// Computes the gradient of this one-element tensor with respect to every leaf that
    /// requires grad, accumulating into their `.grad()`. The graph's saved tensors are freed.
    ///
    /// # Panics
    /// As [`Tensor::try_backward`] fails.
    #[track_caller]
    pub fn backward(&self) {
        ok(self.try_backward());
    }

    /// [`Tensor::backward`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Autograd`] when the tensor does not require grad, has more than one element,
    /// or its graph was freed by an earlier backward; [`Error::Runtime`] when computing the
    /// gradients fails.
    #[track_caller]
    pub fn try_backward(&self) -> Result<()> {
        self.try_backward_with(None, BackwardOptions::default())
    }

    /// Backward with an explicit output gradient (needed for outputs of more than one
    /// element) and options.
    ///
    /// # Panics
    /// As [`Tensor::try_backward_with`] fails.
    #[track_caller]
    pub fn backward_with(&self, gradient: Option<&Tensor>, options: BackwardOptions) {
        ok(self.try_backward_with(gradient, options));
    }

    /// [`Tensor::backward_with`], returning an error instead of panicking.
    ///
    /// # Errors
    /// As [`Tensor::try_backward`], and [`Error::Shape`] when the gradient's shape differs
    /// from the output's.
    #[track_caller]
    pub fn try_backward_with(
        &self,
        gradient: Option<&Tensor>,
        options: BackwardOptions,
    ) -> Result<()> {
        let seed = seed(self, gradient, "backward")?;
        run_backward(&[(self.clone(), seed)], options, None, "backward").map(|_| ())
    }
}
