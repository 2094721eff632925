//! `compile()`: a function whose calls run one cached, fused plan.
//!
//! kiln is lazy already; what `compile` adds is that each call of the function is *one*
//! realization, planned once. Realizations that the closure asks for (`backward()`,
//! `Optimizer::step`, `realize()`) are deferred to its end, so forward pass, loss, backward
//! pass and optimizer update become one graph. The first call plans that graph: symbolic
//! graph passes, fusion, code generation. Later calls run the closure again only to *record*
//! its ops (a few hundred nanoseconds each), check them node by node against the cached plan,
//! and run the plan: no graph building, no optimization, no fusion, no hashing, no compiling.
//!
//! Running the closure on every call is what keeps a compiled function honest in Rust, where
//! a trace cannot see the closure's environment: Rust scalars (a learning rate, Adam's step
//! count) are read afresh and bound as kernel parameters, random ops get fresh keys, Rust-side
//! state (optimizer moments) is updated, and control flow is re-evaluated. When the recorded
//! program differs in structure (another shape, another branch taken), the call replans and
//! [`CompileStats`] says why, naming the user line that recorded the differing op.
//!
//! A call at other sizes (a ragged last batch) is the same program at other sizes: it plans
//! once for them, and its kernels whose sizes changed are compiled size-generic, so
//! that later sizes compile nothing ([`Dynamic::Auto`]; [`compile_with`] takes
//! [`Dynamic::Always`] or [`Dynamic::Never`]). An argument's dimension marked with
//! [`Tensor::mark_dynamic`] makes the kernels over its size generic from the first call
//! instead. Sizes seen before replay their plans.
//!
//! Reading a value that the closure itself computed (`.item()`, `.to_vec()`, printing) would
//! need a realization in the middle of the plan: it is an error ([`Error::Compile`](crate::Error::Compile)), a
//! *graph break*; return the tensor and read it after the call.
//!
//! On a GPU, a replayed plan is a CUDA graph: captured at the plan's first replay, then
//! launched once per call after kiln updates the launches whose values changed (the
//! learning rate, Adam's step, dropout keys, the copies into the graph's own input buffers
//! and out to the call's new result buffers). Each call's results are buffers of their own,
//! as without graphs. A gather's or scatter's index error in a graph is reported by the next
//! call or the next read of a value on the same thread. A plan with host work or a
//! collective, a profiled call, `KILN_CHECK` and `KILN_CUDA_GRAPHS=0` launch step by step:
//! [`CompileStats::stepwise`] says why, [`CompileStats::graph_launches`] counts the graphed
//! calls. A graph keeps the memory of its plan's intermediates and its own input buffers for
//! as long as the compiled function keeps the plan (up to 16 plans); dropping the function
//! returns it to the device's cache.
//!
//! ```
//! use kiln::prelude::*;
//!
//! let w = Tensor::randn([4, 3]).requires_grad_(true);
//! let mut step = kiln::compile(|x: &Tensor| {
//!     let loss = x.matmul(&w).tanh().square().mean();
//!     loss.backward();
//!     kiln::no_grad(|| w.sub_(&(w.grad().unwrap() * 0.1)));
//!     w.zero_grad();
//!     loss
//! });
//! let x = Tensor::randn([8, 4]);
//! let first = step.call(&x).item::<f32>();
//! let second = step.call(&x).item::<f32>();
//! assert!(second < first);                   // the update happened
//! assert_eq!(step.stats().plans, 1);         // planned once
//! assert_eq!(step.stats().replays, 1);       // then replayed
//! ```

use std::fmt;
use std::sync::Arc;

use kiln_ir::pipeline::{Constants, Fusion};
use kiln_ir::{DType, Shape};
use kiln_runtime::Device;
use kiln_runtime::exec::{GraphRun, Marked, Prepared, SizePolicy, Sizes};

use crate::engine::lazy::LazyNode;
use crate::engine::realize::{
    Captured, build_graph, capture_sized, output_slots, run_captured, run_captured_graphed,
};
use crate::engine::replay::Recorded;
use crate::engine::session::record;
use crate::error::ok;
use crate::{Result, Tensor};

/// Arguments a compiled function can take: `&Tensor`, tuples of up to four `&Tensor`s,
/// `&[Tensor]`, `Tensor`, and `()`.
pub trait Inputs {
    /// The tensors, in order.
    fn tensors(&self) -> Vec<&Tensor>;
}

/// Results a compiled function can return: `Tensor`, tuples of up to four, `Vec<Tensor>`,
/// `()` (for a step that only updates parameters in place), and `Result` of any of them.
pub trait Outputs {
    /// The tensors, in order.
    fn tensors(&self) -> Vec<&Tensor>;
}

impl Inputs for () {
    fn tensors(&self) -> Vec<&Tensor> {
        Vec::new()
    }
}

impl Outputs for () {
    fn tensors(&self) -> Vec<&Tensor> {
        Vec::new()
    }
}

impl Inputs for &Tensor {
    fn tensors(&self) -> Vec<&Tensor> {
        vec![*self]
    }
}

impl Inputs for Tensor {
    fn tensors(&self) -> Vec<&Tensor> {
        vec![self]
    }
}

impl Inputs for &[Tensor] {
    fn tensors(&self) -> Vec<&Tensor> {
        self.iter().collect()
    }
}

impl Outputs for Tensor {
    fn tensors(&self) -> Vec<&Tensor> {
        vec![self]
    }
}

impl Outputs for Vec<Tensor> {
    fn tensors(&self) -> Vec<&Tensor> {
        self.iter().collect()
    }
}

/// A closure that can fail returns its error through the call: `try_call` then gives
/// `Ok(Err(e))` (in-place writes it recorded before failing still take effect).
impl<O: Outputs> Outputs for Result<O> {
    fn tensors(&self) -> Vec<&Tensor> {
        match self {
            Ok(o) => o.tensors(),
            Err(_) => Vec::new(),
        }
    }
}

macro_rules! tuples {
    ($(($($t:ident $i:tt),+))*) => {$(
        impl Inputs for ($(tuples!(@ref $t),)+) {
            fn tensors(&self) -> Vec<&Tensor> {
                vec![$(self.$i),+]
            }
        }
        impl Outputs for ($(tuples!(@own $t),)+) {
            fn tensors(&self) -> Vec<&Tensor> {
                vec![$(&self.$i),+]
            }
        }
    )*};
    (@ref $t:ident) => { &Tensor };
    (@own $t:ident) => { Tensor };
}

tuples! {
    (A 0, B 1)
    (A 0, B 1, C 2)
    (A 0, B 1, C 2, D 3)
}

/// The shapes, dtypes, devices and `requires_grad` of a call's arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Signature(Vec<(Shape, DType, Device, bool)>);

impl Signature {
    fn of(inputs: &[&Tensor]) -> Signature {
        Signature(
            inputs
                .iter()
                .map(|t| (t.shape().clone(), t.dtype(), t.device(), t.requires_grad()))
                .collect(),
        )
    }

    /// How `self` differs from `old`, for a recompile reason.
    fn difference(&self, old: &Signature) -> Option<String> {
        if self.0.len() != old.0.len() {
            return Some(format!("{} arguments instead of {}", self.0.len(), old.0.len()));
        }
        self.0.iter().zip(&old.0).enumerate().find_map(|(i, (new, old))| {
            let what = |(s, d, dev, g): &(Shape, DType, Device, bool)| {
                format!("{s} {d} on {dev}{}", if *g { " requiring grad" } else { "" })
            };
            let (s, d, dev, g) = new;
            let resized = s.rank() == old.0.rank() && (d, dev, g) == (&old.1, &old.2, &old.3);
            if resized && s != &old.0 {
                // Name the dimensions that changed, as `torch.compile`'s recompile log does.
                let dims: Vec<String> = (s.dims().iter().zip(old.0.dims()).enumerate())
                    .filter(|(_, (a, b))| a != b)
                    .map(|(k, (a, b))| format!("dimension {k} is {a} (was {b})"))
                    .collect();
                return Some(format!("argument {i}'s {} ({})", dims.join(", "), what(new)));
            }
            (new != old).then(|| format!("argument {i} is {} (was {})", what(new), what(old)))
        })
    }
}

/// A plan and what it was built from.
struct CompiledPlan {
    signature: Signature,
    recorded: Recorded,
    prepared: Prepared,
}

/// What a compiled function has done so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompileStats {
    /// Calls made.
    pub calls: usize,
    /// Plans built (the first call, and each recompile).
    pub plans: usize,
    /// Calls that ran a cached plan.
    pub replays: usize,
    /// Calls with nothing to compute.
    pub empty: usize,
    /// Calls that ran unplanned, as eager realizations: under the reference executor, or
    /// with results on more than one device (a GPU step returning `loss.cpu()`: each device's
    /// values realize separately; the first such call warns on standard error).
    pub unplanned: usize,
    /// Why each plan after the first was built, with the call it happened in.
    pub recompiles: Vec<Recompile>,
    /// Steps (kernel launches, library calls, reference ops) of the last call's plan.
    pub steps_per_call: usize,
    /// Calls on a GPU that ran their plan as one CUDA graph launch (the capture's included):
    /// every replay of a GPU plan, unless [`CompileStats::stepwise`] says why not.
    pub graph_launches: usize,
    /// CUDA graphs captured (one per GPU plan, at its first replay).
    pub graph_captures: usize,
    /// Why the last replay on a GPU launched its plan's kernels one by one instead of as a
    /// CUDA graph (host work in the plan, a collective, profiling, `KILN_CUDA_GRAPHS=0`,
    /// `KILN_CHECK`); `None` when it ran as a graph.
    pub stepwise: Option<String>,
}

/// Why a compiled function planned again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recompile {
    /// The call (counting from 1).
    pub call: usize,
    /// What differed from every cached plan.
    pub reason: String,
}

impl fmt::Display for CompileStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} calls: {} planned, {} replayed, {} with nothing to compute; {} steps per call",
            self.calls, self.plans, self.replays, self.empty, self.steps_per_call
        )?;
        if self.unplanned > 0 {
            write!(f, "; {} ran unplanned (eagerly)", self.unplanned)?;
        }
        if self.graph_launches > 0 {
            write!(f, "; {} as one CUDA graph launch", self.graph_launches)?;
        }
        if let Some(why) = &self.stepwise {
            write!(f, "; the last replay launched kernels one by one: {why}")?;
        }
        for r in &self.recompiles {
            write!(f, "\n  call {} planned again: {}", r.call, r.reason)?;
        }
        Ok(())
    }
}

/// A function compiled by [`compile`].
pub struct Compiled<F> {
    f: F,
    entries: Vec<CompiledPlan>,
    stats: CompileStats,
    recompile_limit: usize,
    warned: bool,
    warned_devices: bool,
    options: CompileOptions,
}

/// Compiles `f`: each call of the result records `f`'s ops and runs them as one cached,
/// fused plan (see the [module documentation](self)). `f` takes [`Inputs`] (a `&Tensor`, a
/// tuple of them, a slice) and returns [`Outputs`] (a `Tensor`, a tuple, a `Vec`, `()`).
/// Tensors it captures from its environment (parameters) are read afresh on every call.
pub fn compile<F>(f: F) -> Compiled<F> {
    compile_with(f, CompileOptions::default())
}

/// How a compiled function treats the sizes of its tensors (PyTorch's `torch.compile(dynamic=...)`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Dynamic {
    /// The first call's kernels are specialised to its sizes; when a later call is the same
    /// program at other sizes (a ragged last batch), its CPU kernels whose sizes changed are
    /// compiled size-generic, and serve every later size.
    #[default]
    Auto,
    /// Every kernel (CPU and CUDA) is compiled size-generic from the first call: no size compiles a new
    /// kernel, at the cost of generic code (a division per row) for every kernel.
    Always,
    /// Every kernel is specialised: each new size compiles its own kernels.
    Never,
}

/// Options of [`compile_with`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompileOptions {
    /// How sizes are treated ([`Dynamic::Auto`] by default).
    pub dynamic: Dynamic,
}

/// [`compile`] with `options`.
///
/// ```
/// use kiln::compile::{CompileOptions, Dynamic};
/// use kiln::prelude::*;
///
/// let w = Tensor::randn([8]);
/// let mut f = kiln::compile_with(|x: &Tensor| (x * &w).tanh().sum_dim(0, false),
///                                CompileOptions { dynamic: Dynamic::Always });
/// for n in [5, 9, 13] {
///     f.call(&Tensor::randn([n, 8])).to_vec::<f32>();
/// }
/// assert_eq!(f.stats().plans, 3); // each size plans once, with kernels compiled for every size
/// ```
pub fn compile_with<F>(f: F, options: CompileOptions) -> Compiled<F> {
    Compiled {
        f,
        entries: Vec::new(),
        stats: CompileStats::default(),
        recompile_limit: 8,
        warned: false,
        warned_devices: false,
        options,
    }
}

/// Plans kept per compiled function; the oldest is dropped beyond this.
const MAX_PLANS: usize = 16;

impl<F> Compiled<F> {
    /// What the function has done so far.
    pub fn stats(&self) -> &CompileStats {
        &self.stats
    }

    /// After how many recompiles a warning is printed to standard error (8 by default): a
    /// function that replans on most calls is slower than not compiling it.
    #[must_use]
    pub fn recompile_limit(mut self, limit: usize) -> Compiled<F> {
        self.recompile_limit = limit;
        self
    }

    /// Calls the function.
    ///
    /// # Panics
    /// When the closure panics, and as [`Compiled::try_call`] fails.
    #[track_caller]
    pub fn call<I: Inputs, O: Outputs>(&mut self, inputs: I) -> O
    where
        F: FnMut(I) -> O,
    {
        ok(self.try_call(inputs))
    }

    /// [`Compiled::call`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Compile`](crate::Error::Compile) for a graph break (the closure read a value it computed);
    /// [`Error::Runtime`](crate::Error::Runtime) when running the plan fails.
    pub fn try_call<I: Inputs, O: Outputs>(&mut self, inputs: I) -> Result<O>
    where
        F: FnMut(I) -> O,
    {
        self.stats.calls += 1;
        let (signature, marked) = {
            let tensors = inputs.tensors();
            let marked =
                tensors.iter().flat_map(|t| t.dynamic_dims().into_iter().map(|d| t.dims()[d]));
            (Signature::of(&tensors), Marked::new(marked))
        };
        let (out, session) = record(|| (self.f)(inputs))?;
        let mut targets: Vec<Arc<LazyNode>> =
            out.tensors().iter().map(|t| t.storage().node()).collect();
        targets.extend(session.deferred);
        targets.extend(session.written.iter().map(|s| s.node()));
        self.run(signature, &targets, session.first_serial, marked)?;
        Ok(out)
    }

    fn run(
        &mut self,
        signature: Signature,
        targets: &[Arc<LazyNode>],
        first_serial: u64,
        marked: Option<Marked>,
    ) -> Result<()> {
        let device = targets.first().map_or(Device::Cpu, |t| t.device);
        let options = crate::engine::execution::plan_options(Constants::Rebindable, device);
        let other = targets.iter().map(|t| t.device).find(|&d| d != device);
        let (Some(options), None) = (options, other) else {
            // The reference executor runs unplanned; a step whose results live on several
            // devices runs as separate realizations. Both are counted, and the second warns.
            self.stats.unplanned += 1;
            if let Some(other) = other
                && !std::mem::replace(&mut self.warned_devices, true)
            {
                eprintln!(
                    "kiln: warning: a compiled function's results live on {device} and {other}: \
                     its calls run eagerly, unplanned (return them on one device, e.g. the loss \
                     on the GPU, and move it after the call)"
                );
            }
            return crate::engine::realize::realize(targets);
        };
        // Room for the program last planned: a replay records as many nodes.
        let hint = self.entries.last().map_or(64, |e| e.recorded.len());
        let mut captured = capture_sized(targets, hint);
        // Values recorded before the call (an in-place write made outside) are not part of
        // the function: compute them first, so the plan sees them as inputs.
        let older: Vec<Arc<LazyNode>> = captured
            .nodes
            .iter()
            .zip(&captured.buffers)
            .filter(|(n, b)| n.serial < first_serial && b.is_none())
            .map(|(n, _)| n)
            .cloned()
            .collect();
        if !older.is_empty() {
            crate::engine::realize::realize(&older)?;
            captured = capture_sized(targets, hint);
        }
        captured.check_whole()?;
        if captured.pending == 0 {
            self.stats.empty += 1;
            return Ok(());
        }
        let outputs = output_slots(&captured, targets);

        let mut reason = None;
        for i in 0..self.entries.len() {
            let entry = &self.entries[i];
            let planned = entry.prepared.options();
            let why = if planned.fusion != options.fusion {
                let on_off = |f: Fusion| if f == Fusion::Fused { "on" } else { "off" };
                Some(format!(
                    "fusion is {} now and was {} when the plan was made",
                    on_off(options.fusion),
                    on_off(planned.fusion)
                ))
            } else if entry.prepared.device() != device {
                Some(format!(
                    "the results are on {device}, the plan was made for {}",
                    entry.prepared.device()
                ))
            } else if entry.signature == signature {
                entry.recorded.mismatch(&captured, &outputs)
            } else {
                signature.difference(&entry.signature)
            };
            let Some(why) = why else {
                let entry = &mut self.entries[i];
                entry.recorded.rebind(&mut entry.prepared, &captured);
                if device == Device::Cpu {
                    run_captured(&mut entry.prepared, &mut captured, &outputs)?;
                } else {
                    let run = run_captured_graphed(&mut entry.prepared, &mut captured, &outputs)?;
                    self.stats.stepwise = None;
                    match run {
                        GraphRun::Captured { .. } => {
                            self.stats.graph_captures += 1;
                            self.stats.graph_launches += 1;
                        }
                        GraphRun::Replayed { .. } => self.stats.graph_launches += 1,
                        GraphRun::Stepwise(why) => self.stats.stepwise = Some(why),
                    }
                }
                self.stats.replays += 1;
                self.stats.steps_per_call = entry.prepared.steps();
                return Ok(());
            };
            reason = Some(why);
        }

        let sizes = self.sizes_of(&captured, &outputs, device, marked);
        let built = build_graph(&captured, targets)?;
        debug_assert_eq!(built.outputs, outputs);
        let recorded = Recorded::new(&captured, &outputs, &built.ids);
        let graph = built.graph;
        drop(built.buffers); // so that an input the plan writes into can be handed over
        let mut prepared = Prepared::with_sizes(&graph, options, device, sizes);
        run_captured(&mut prepared, &mut captured, &outputs)?;
        self.stats.plans += 1;
        self.stats.steps_per_call = prepared.steps();
        if let Some(reason) = reason {
            self.note_recompile(reason, sizes);
        }
        if self.entries.len() == MAX_PLANS {
            self.entries.remove(0);
        }
        self.entries.push(CompiledPlan { signature, recorded, prepared });
        Ok(())
    }

    /// How a new plan of `captured` treats sizes: under [`Dynamic::Auto`], the kernels over
    /// sizes an argument marked dynamic ([`Tensor::mark_dynamic`]) are compiled size-generic,
    /// and the same program as a cached plan's at other sizes (a ragged batch) compiles its
    /// kernels whose sizes changed size-generic, to serve the sizes still to come.
    fn sizes_of(
        &self,
        captured: &Captured,
        outputs: &[usize],
        device: Device,
        marked: Option<Marked>,
    ) -> Sizes {
        let resized = || {
            self.entries.iter().any(|e| {
                e.prepared.device() == device && e.recorded.same_up_to_sizes(captured, outputs)
            })
        };
        match self.options.dynamic {
            Dynamic::Always => Sizes::Dynamic,
            Dynamic::Never => Sizes::Static,
            Dynamic::Auto if let Some(marked) = marked => Sizes::Marked(marked),
            Dynamic::Auto if resized() => Sizes::Changed,
            Dynamic::Auto => Sizes::First,
        }
    }

    /// Records why the call planned again, and warns once past the recompile limit.
    fn note_recompile(&mut self, reason: String, sizes: Sizes) {
        let policy = kiln_runtime::exec::size_policy();
        let reason = match sizes {
            _ if policy == SizePolicy::Specialize => reason,
            Sizes::Changed => format!(
                "{reason}; the same program at other sizes: its kernels whose sizes changed are \
                 compiled size-generic, for every size"
            ),
            Sizes::Marked(marked) => {
                let sizes: Vec<String> = marked.sizes().map(|s| s.to_string()).collect();
                format!(
                    "{reason}; kernels over the sizes marked dynamic ({}) are size-generic, \
                     and any other whose sizes changed is compiled size-generic",
                    sizes.join(", ")
                )
            }
            Sizes::First | Sizes::Dynamic | Sizes::Static => reason,
        };
        self.stats.recompiles.push(Recompile { call: self.stats.calls, reason: reason.clone() });
        if self.stats.recompiles.len() > self.recompile_limit && !self.warned {
            self.warned = true;
            eprintln!(
                "kiln: warning: a compiled function has planned {} times in {} calls; the last time because {reason}. Pass values that change as tensors, keep shapes fixed, or call it uncompiled.",
                self.stats.plans, self.stats.calls
            );
        }
    }
}
