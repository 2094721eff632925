//! Data-parallel training: every rank holds the whole model, runs its own share of the
//! batch, and averages gradients with the other ranks during backward.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use super::{Module, Parameters};
use crate::autograd::HookHandle;
use crate::distributed::{ProcessGroup, ReduceOp};
use crate::error::ok;
use crate::{Error, Result, Tensor};

/// How [`DistributedDataParallel`] groups and reduces gradients.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DdpOptions {
    /// The most bytes of gradients one all-reduce carries (PyTorch's `bucket_cap_mb`,
    /// 25 MiB). Larger buckets mean fewer, larger messages.
    pub bucket_cap_mb: f64,
    /// The cap of the first bucket, the one backward completes first (PyTorch's 1 MiB): a
    /// small one starts communication early, so that more of it overlaps the rest of
    /// backward. Capped by `bucket_cap_mb`.
    pub first_bucket_cap_mb: f64,
    /// Copies rank 0's buffers (batch norm's running statistics) to every rank before each
    /// forward pass, as PyTorch does.
    pub broadcast_buffers: bool,
    /// Finds, after each forward pass, the parameters it did not use, so that buckets
    /// holding them still complete (they contribute zeros). Costs a walk of the autograd
    /// graph per forward; without it, a parameter with no gradient is an error at the next
    /// forward pass.
    pub find_unused_parameters: bool,
}

impl Default for DdpOptions {
    fn default() -> DdpOptions {
        DdpOptions {
            bucket_cap_mb: 25.0,
            first_bucket_cap_mb: 1.0,
            broadcast_buffers: true,
            find_unused_parameters: false,
        }
    }
}

/// Wraps a model for data-parallel training over a [`ProcessGroup`] (PyTorch's
/// `DistributedDataParallel`).
///
/// - At construction, rank 0's parameters and buffers are copied to every rank.
/// - During `backward`, each parameter's gradient is handed to its *bucket* as backward
///   accumulates it (parameters are bucketed in reverse order, as backward tends to reach
///   them, up to [`DdpOptions::bucket_cap_mb`] each); a complete bucket records one
///   all-reduce of its gradients, averaged over ranks. The all-reduces are graph ops in the
///   same graph as the backward pass, so each is a step of backward's plan that depends only
///   on its bucket's gradients (inside [`crate::compile()`], the compiled step holds them).
///   After `backward`, every rank's `.grad()` is the mean of the ranks' gradients: with
///   equal shares of a batch, the gradient of the global batch's mean loss.
/// - [`DistributedDataParallel::no_sync`] skips the reduction for gradient accumulation:
///   gradients add up locally, and the next backward outside it reduces their sum.
///
/// Parameters and buffers are the wrapped model's, under the same names (so a state dict
/// saved from the wrapper loads into the bare model).
///
/// ```
/// use kiln::distributed::ProcessGroup;
/// use kiln::nn::{DistributedDataParallel, Linear};
/// use kiln::optim::{Optimizer, Sgd, SgdConfig};
/// use kiln::prelude::*;
/// let group = ProcessGroup::single();
/// let model = DistributedDataParallel::new(Linear::new(4, 2), &group);
/// let mut opt = Sgd::new(model.parameters(), SgdConfig { lr: 0.1, ..Default::default() });
/// let loss = model.forward(&Tensor::ones([8, 4])).pow(2.0).mean();
/// loss.backward();
/// opt.step();
/// ```
pub struct DistributedDataParallel<M: Module> {
    module: M,
    reducer: Arc<Reducer>,
    hooks: Vec<HookHandle>,
    options: DdpOptions,
}

struct Reducer {
    group: ProcessGroup,
    /// The parameters of each bucket, in the order their gradients are laid out.
    buckets: Vec<Vec<(String, Tensor)>>,
    /// Which parameters of each bucket have their gradient for this backward pass.
    ready: Mutex<Vec<Vec<bool>>>,
    sync: AtomicBool,
}

impl<M: Module> DistributedDataParallel<M> {
    /// Wraps `module` with the default [`DdpOptions`].
    ///
    /// # Panics
    /// Where [`DistributedDataParallel::try_new`] fails.
    #[track_caller]
    pub fn new(module: M, group: &ProcessGroup) -> DistributedDataParallel<M> {
        ok(DistributedDataParallel::try_new(module, group, DdpOptions::default()))
    }

    /// Wraps `module`: copies rank 0's parameters and buffers to every rank (one graph,
    /// materialized here) and registers the gradient hooks.
    ///
    /// # Errors
    /// [`Error::Value`] for a bucket cap that is not positive; whatever the broadcast
    /// reports.
    pub fn try_new(
        module: M,
        group: &ProcessGroup,
        options: DdpOptions,
    ) -> Result<DistributedDataParallel<M>> {
        for (name, cap) in [
            ("bucket_cap_mb", options.bucket_cap_mb),
            ("first_bucket_cap_mb", options.first_bucket_cap_mb),
        ] {
            if cap.is_nan() || cap <= 0.0 {
                return Err(Error::value(
                    "DistributedDataParallel",
                    format!("{name} must be positive, got {cap}"),
                ));
            }
        }
        if group.world_size() > 1 {
            let state: Vec<Tensor> = module.state_dict().into_iter().map(|(_, t)| t).collect();
            broadcast_from_root(group, &state)?;
        }
        let buckets =
            buckets(module.named_parameters(), options.bucket_cap_mb, options.first_bucket_cap_mb);
        let ready = buckets.iter().map(|b| vec![false; b.len()]).collect();
        let reducer = Arc::new(Reducer {
            group: group.clone(),
            buckets,
            ready: Mutex::new(ready),
            sync: AtomicBool::new(true),
        });
        let mut hooks = Vec::new();
        for (b, bucket) in reducer.buckets.iter().enumerate() {
            for (i, (_, p)) in bucket.iter().enumerate() {
                // A weak handle: the parameters hold the hooks, the reducer the parameters.
                // Once the wrapper is dropped the hooks do nothing.
                let weak: Weak<Reducer> = Arc::downgrade(&reducer);
                hooks.push(p.register_post_accumulate_grad_hook(move |_| match weak.upgrade() {
                    Some(r) => r.ready(b, i),
                    None => Ok(()),
                }));
            }
        }
        Ok(DistributedDataParallel { module, reducer, hooks, options })
    }

    /// The wrapped model.
    pub fn module(&self) -> &M {
        &self.module
    }

    /// The wrapped model, mutably (its parameter handles stay those the hooks watch as long
    /// as they are not replaced).
    pub fn module_mut(&mut self) -> &mut M {
        &mut self.module
    }

    /// The wrapped model, with the gradient hooks removed.
    pub fn into_inner(self) -> M {
        for h in self.hooks {
            h.remove();
        }
        self.module
    }

    /// The group gradients are averaged over.
    pub fn group(&self) -> &ProcessGroup {
        &self.reducer.group
    }

    /// The parameter names in each bucket, in the order the buckets were built.
    pub fn bucket_names(&self) -> Vec<Vec<String>> {
        self.reducer.buckets.iter().map(|b| b.iter().map(|(n, _)| n.clone()).collect()).collect()
    }

    /// Skips the gradient all-reduce until the guard is dropped (PyTorch's `no_sync`), for
    /// gradient accumulation: backward passes inside it add to the local gradients, and the
    /// first backward after it reduces what accumulated.
    ///
    /// ```
    /// # use kiln::distributed::ProcessGroup;
    /// # use kiln::nn::{DistributedDataParallel, Linear};
    /// # use kiln::prelude::*;
    /// # let model = DistributedDataParallel::new(Linear::new(4, 2), &ProcessGroup::single());
    /// # let x = Tensor::ones([2, 4]);
    /// {
    ///     let _accumulate = model.no_sync();
    ///     model.forward(&x).sum().backward(); // local only
    /// }
    /// model.forward(&x).sum().backward(); // reduces the sum of both
    /// ```
    pub fn no_sync(&self) -> NoSync<'_> {
        self.reducer.sync.store(false, Ordering::SeqCst);
        NoSync { reducer: &self.reducer }
    }
}

/// Keeps [`DistributedDataParallel`] from reducing gradients while alive.
#[derive(Debug)]
#[must_use = "gradients are reduced again as soon as the guard is dropped"]
pub struct NoSync<'a> {
    reducer: &'a Reducer,
}

impl Drop for NoSync<'_> {
    fn drop(&mut self) {
        self.reducer.sync.store(true, Ordering::SeqCst);
    }
}

impl std::fmt::Debug for Reducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Reducer({} buckets)", self.buckets.len())
    }
}

/// Copies rank 0's tensors into every rank's, in one graph.
fn broadcast_from_root(group: &ProcessGroup, tensors: &[Tensor]) -> Result<()> {
    crate::no_grad(|| {
        let written: Vec<Tensor> = tensors
            .iter()
            .map(|t| t.try_copy_(&group.try_broadcast(&t.detach(), 0)?))
            .collect::<Result<_>>()?;
        Tensor::try_realize_all(&written.iter().collect::<Vec<_>>())
    })
}

/// Parameters in reverse order, cut into buckets of at most `cap_mb` MiB (the first
/// `first_mb`) of one dtype and device each (a parameter larger than the cap gets a bucket
/// of its own).
fn buckets(
    params: Vec<(String, Tensor)>,
    cap_mb: f64,
    first_mb: f64,
) -> Vec<Vec<(String, Tensor)>> {
    let mib = 1024.0 * 1024.0;
    let mut out: Vec<Vec<(String, Tensor)>> = Vec::new();
    let mut bytes = 0.0;
    for (name, p) in params.into_iter().rev().filter(|(_, p)| p.requires_grad()) {
        let size = (p.numel() * p.dtype().size_in_bytes()) as f64;
        let fits = out.last().is_some_and(|b| {
            let first = &b[0].1;
            let cap = if out.len() == 1 { first_mb.min(cap_mb) } else { cap_mb } * mib;
            first.dtype() == p.dtype() && first.device() == p.device() && bytes + size <= cap
        });
        if !fits {
            out.push(Vec::new());
            bytes = 0.0;
        }
        bytes += size;
        out.last_mut().unwrap_or_else(|| unreachable!("a bucket was just pushed")).push((name, p));
    }
    out
}

impl Reducer {
    /// Parameter `i` of bucket `b` has its gradient: reduce the bucket once all have.
    fn ready(&self, b: usize, i: usize) -> Result<()> {
        if !self.sync.load(Ordering::SeqCst) {
            return Ok(());
        }
        let complete = {
            let mut ready = self.ready.lock().unwrap_or_else(PoisonError::into_inner);
            ready[b][i] = true;
            let complete = ready[b].iter().all(|&r| r);
            if complete {
                ready[b].iter_mut().for_each(|r| *r = false);
            }
            complete
        };
        if complete { self.reduce(b) } else { Ok(()) }
    }

    /// Records the bucket's all-reduce: its gradients flattened into one tensor, averaged
    /// over ranks, and handed back as views of the result.
    fn reduce(&self, b: usize) -> Result<()> {
        let bucket = &self.buckets[b];
        let flat: Vec<Tensor> = bucket
            .iter()
            .map(|(_, p)| match p.grad() {
                Some(g) => g.try_reshape(&[-1]),
                // Unused here (`find_unused_parameters`): contributes zeros.
                None => Ok(Tensor::zeros([p.numel()]).to_dtype(p.dtype())),
            })
            .collect::<Result<_>>()?;
        let joined = match flat.as_slice() {
            [one] => one.clone(),
            many => Tensor::try_cat(&many.iter().collect::<Vec<_>>(), 0)?,
        };
        let mean = self.group.try_all_reduce(&joined, ReduceOp::Mean)?;
        let mut offset = 0;
        for (_, p) in bucket {
            let dims: Vec<i64> = p.shape().dims().iter().map(|&d| d as i64).collect();
            p.set_grad(Some(mean.try_narrow(0, offset, p.numel())?.try_reshape(&dims)?));
            offset += p.numel();
        }
        Ok(())
    }

    /// Fails if the last backward left a bucket incomplete (a parameter got no gradient).
    fn check_complete(&self) -> Result<()> {
        let mut ready = self.ready.lock().unwrap_or_else(PoisonError::into_inner);
        let mut missing = Vec::new();
        for (bucket, flags) in self.buckets.iter().zip(ready.iter_mut()) {
            if flags.iter().any(|&r| r) {
                missing.extend(
                    bucket.iter().zip(flags.iter()).filter(|(_, r)| !**r).map(|(p, _)| p.0.clone()),
                );
                flags.iter_mut().for_each(|r| *r = false);
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        Err(Error::Autograd {
            op: "DistributedDataParallel",
            detail: format!(
                "the last backward pass gave no gradient to {}, so their buckets were never \
                 averaged across ranks; set DdpOptions::find_unused_parameters to true when a \
                 forward pass may leave parameters unused",
                missing.join(", ")
            ),
        })
    }

    /// Marks every parameter `output` cannot reach as ready, so its bucket completes.
    fn mark_unused(&self, output: &Tensor) -> Result<()> {
        if !self.sync.load(Ordering::SeqCst) || !crate::autograd::is_grad_enabled() {
            return Ok(());
        }
        let used: HashMap<usize, ()> = crate::autograd::reachable_leaves(output)
            .iter()
            .map(|t| (Arc::as_ptr(&t.0) as usize, ()))
            .collect();
        for (b, bucket) in self.buckets.iter().enumerate() {
            for (i, (_, p)) in bucket.iter().enumerate() {
                if !used.contains_key(&(Arc::as_ptr(&p.0) as usize)) {
                    self.ready(b, i)?;
                }
            }
        }
        Ok(())
    }
}

impl<M: Module> Parameters for DistributedDataParallel<M> {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        self.module.visit(prefix, f);
    }

    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor)) {
        self.module.visit_mut(prefix, f);
    }

    fn visit_buffers(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        self.module.visit_buffers(prefix, f);
    }

    fn visit_buffers_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor)) {
        self.module.visit_buffers_mut(prefix, f);
    }

    fn set_training(&mut self, training: bool) {
        self.module.set_training(training);
    }
}

impl<M: Module> Module for DistributedDataParallel<M> {
    /// Checks that the last backward reduced every bucket, copies rank 0's buffers to every
    /// rank ([`DdpOptions::broadcast_buffers`]), and runs the wrapped model.
    fn try_forward(&self, input: &Tensor) -> Result<Tensor> {
        self.reducer.check_complete()?;
        let buffers = self.module.buffers();
        if self.options.broadcast_buffers
            && self.reducer.group.world_size() > 1
            && !buffers.is_empty()
        {
            broadcast_from_root(&self.reducer.group, &buffers)?;
        }
        let output = self.module.try_forward(input)?;
        if self.options.find_unused_parameters {
            self.reducer.mark_unused(&output)?;
        }
        Ok(output)
    }
}
