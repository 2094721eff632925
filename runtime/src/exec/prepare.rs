//! A plan made ready to run: planned by the pipeline, its kernels compiled, its schedule
//! decided (row groups).

use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln_codegen::cpu::CpuKernel;
use kiln_ir::fuse::{KernelStep, Step};
use kiln_ir::kernel::Kernel;
use kiln_ir::pipeline::{Fusion, NodeMap, PlanOptions, Planner, Stage};
use kiln_ir::{Graph, NodeId, Op};
use rustc_hash::FxHashMap as HashMap;

use crate::sizes::Sizes;
use crate::trace::{self, StepKind};
use crate::{Device, cuda, rows};

/// A graph made ready to run: optimized, partitioned, its kernels compiled. Running it again
/// with new input buffers costs no planning, hashing or compiling; planned with rebindable
/// constants, it can also take new values for its constants and random keys between runs
/// ([`Prepared::rebind`]).
pub struct Prepared {
    pub(super) graph: Graph,
    pub(super) device: Device,
    pub(super) options: PlanOptions,
    pub(super) steps: Vec<PreparedStep>,
    /// How many steps (and outputs) read each node: buffers are freed after the last.
    pub(super) readers: Vec<u32>,
    pub(super) outputs: Vec<NodeId>,
    /// The node of the prepared graph that each node of the given graph became.
    map: NodeMap,
    /// Where each `Full` node's value is a kernel parameter: (step, parameter).
    params_of: HashMap<NodeId, Vec<(usize, usize)>>,
    /// Runs of kernel steps over the same rows: tile by tile on the CPU (see
    /// [`crate::rows`]), one kernel each on a GPU.
    pub(super) groups: Vec<rows::RowGroup>,
    /// A GPU plan's kernel for each of `groups`.
    pub(super) gpu_groups: Vec<Arc<cuda::GroupKernel>>,
    /// The CUDA graph that [`Prepared::run_graphed`] replays, or why there is none.
    pub(super) cuda_graph: super::graph::GraphState,
    /// The step computing each node that is a step of its own (a random fill, a gather).
    node_step: HashMap<NodeId, usize>,
    /// For each input, in order, whether a step writes into its buffer
    /// ([`Prepared::writes_into_inputs`]).
    writes_inputs: Vec<bool>,
    /// Steps whose values changed ([`Prepared::rebind`]) since the graph's launches were
    /// last updated: an update walks only these.
    pub(super) dirty: Vec<bool>,
}

/// One step of a prepared plan.
pub(crate) enum PreparedStep {
    Kernel {
        step: Box<KernelStep>,
        kernel: Option<Arc<CpuKernel>>,
        /// Compile time not yet reported (the first run reports it).
        compile: Option<Duration>,
    },
    Node(NodeId),
    /// A matrix product or fused attention reading its operands through views.
    Library(NodeId, Vec<(NodeId, kiln_ir::View)>),
    /// [`Step::Alias`]: (node, the node whose buffer it is).
    Alias(NodeId, NodeId),
    /// [`Step::AssignInPlace`].
    AssignInPlace {
        node: NodeId,
        base: NodeId,
        values: (NodeId, kiln_ir::View),
    },
    /// [`Step::ScatterOntoFill`]: (scatter, the `Full` node of its base's value).
    ScatterOntoFill(NodeId, NodeId),
    /// [`Step::ScatterInPlace`]: the scatter.
    ScatterInPlace(NodeId),
}

impl Prepared {
    /// Plans `graph` under `options` for `device` and compiles its kernels (CPU kernels
    /// through the kernel cache; a GPU plan's new kernels in parallel).
    pub fn new(graph: &Graph, options: PlanOptions, device: Device) -> Prepared {
        Prepared::with_sizes(graph, options, device, Sizes::First)
    }

    /// [`Prepared::new`] for a program that ran before at other sizes (`Sizes::Changed`):
    /// its kernels whose sizes changed, CPU and CUDA alike, are compiled size-generic (see
    /// [`crate::sizes`]).
    pub fn with_sizes(
        graph: &Graph,
        options: PlanOptions,
        device: Device,
        sizes: Sizes,
    ) -> Prepared {
        let planning = Instant::now();
        let plan = Planner::default().plan_observed(graph, options, &mut show_stage);
        let bound = plan.graph.topo_order().iter().map(|n| n.index() + 1).max().unwrap_or(0);
        let mut readers = vec![0u32; bound];
        let mut params_of: HashMap<NodeId, Vec<(usize, usize)>> = HashMap::default();
        let mut node_step = HashMap::default();
        let mut steps = Vec::with_capacity(plan.steps.len());
        for (i, step) in plan.steps.into_iter().enumerate() {
            step.reads(&plan.graph).iter().for_each(|n| readers[n.index()] += 1);
            steps.push(match step {
                Step::Kernel(k) => {
                    for (j, &n) in k.param_nodes.iter().enumerate() {
                        params_of.entry(n).or_default().push((i, j));
                    }
                    let (kernel, compile) = if device == Device::Cpu {
                        super::cpu::compiled(&k.kernel, sizes)
                    } else {
                        (None, None)
                    };
                    PreparedStep::Kernel { step: k, kernel, compile }
                }
                Step::Node(n) => {
                    node_step.insert(n, i);
                    PreparedStep::Node(n)
                }
                Step::Library { node, operands } => PreparedStep::Library(node, operands),
                Step::Alias { node, of } => PreparedStep::Alias(node, of),
                Step::AssignInPlace { node, base, values } => {
                    PreparedStep::AssignInPlace { node, base, values }
                }
                Step::ScatterOntoFill { node, fill } => {
                    // A rebound fill value changes what the scatter writes.
                    node_step.insert(fill, i);
                    PreparedStep::ScatterOntoFill(node, fill)
                }
                Step::ScatterInPlace { node } => {
                    node_step.insert(node, i);
                    PreparedStep::ScatterInPlace(node)
                }
            });
        }
        for &o in &plan.outputs {
            readers[o.index()] += 1;
        }
        let mut prepared = Prepared {
            graph: plan.graph,
            device,
            options,
            steps,
            readers,
            outputs: plan.outputs,
            map: plan.map,
            params_of,
            groups: Vec::new(),
            gpu_groups: Vec::new(),
            cuda_graph: super::graph::GraphState::default(),
            node_step,
            writes_inputs: Vec::new(),
            dirty: Vec::new(),
        };
        prepared.dirty = vec![false; prepared.steps.len()];
        prepared.writes_inputs = prepared.inputs_written();
        prepared.schedule();
        let (gpu_compiling, took) = precompile_gpu(&prepared, sizes);
        // Each GPU kernel's compile time, reported by its first run (a CPU kernel's was
        // noted when it was looked up above).
        if device != Device::Cpu {
            let mut took = took.into_iter();
            for (s, step) in prepared.steps.iter_mut().enumerate() {
                let grouped = prepared.groups.iter().any(|g| (g.start..g.end).contains(&s));
                if let (PreparedStep::Kernel { compile, .. }, false) = (step, grouped) {
                    *compile = took.next().flatten();
                }
            }
        }
        prepared.trace_planning(planning, gpu_compiling);
        prepared
    }

    /// Reports the planning time (compiles excluded) to the trace.
    fn trace_planning(&self, planning: Instant, gpu_compiling: Duration) {
        if !trace::enabled() {
            return;
        }
        let ops = format!("{} nodes, {} steps", self.graph.len(), self.steps.len());
        let mut e = trace::plain_event("plan", StepKind::Plan, ops, String::new());
        // CPU kernels compile one by one; GPU kernels in parallel (their wall time).
        let compiling: Duration = if self.device == Device::Cpu {
            self.steps
                .iter()
                .filter_map(|s| match s {
                    PreparedStep::Kernel { compile, .. } => *compile,
                    _ => None,
                })
                .sum()
        } else {
            gpu_compiling
        };
        e.duration = planning.elapsed().saturating_sub(compiling);
        trace::record(planning, e);
    }

    /// Row groups: they change the schedule, not the kernels, so one kernel per op (the
    /// unfused baseline) keeps its one-pass-per-op schedule.
    fn schedule(&mut self) {
        if self.options.fusion == Fusion::Unfused {
            return;
        }
        if let Device::Cuda(_) = self.device {
            // Every kernel of a GPU plan may join a group (a CPU plan's, compiled ones).
            let kernels: Vec<Option<&KernelStep>> = self
                .steps
                .iter()
                .map(|s| match s {
                    PreparedStep::Kernel { step, .. } => Some(&**step),
                    _ => None,
                })
                .collect();
            self.groups = rows::find(&kernels, &self.readers, rows::Grouping::Cuda);
            self.gpu_groups = (self.groups.iter())
                .map(|g| {
                    let members: Vec<&KernelStep> =
                        kernels[g.start..g.end].iter().map(|k| k.expect("a kernel")).collect();
                    Arc::new(cuda::GroupKernel::new(&self.graph, &members, g.rows))
                })
                .collect();
            return;
        }
        let kernels: Vec<Option<&KernelStep>> = self
            .steps
            .iter()
            .map(|s| match s {
                PreparedStep::Kernel { step, kernel: Some(_), .. } => Some(&**step),
                _ => None,
            })
            .collect();
        self.groups = rows::find(&kernels, &self.readers, rows::Grouping::Cpu);
    }

    /// Gives the `Full` or `Random` node `node` of the graph this was prepared from a new
    /// value or key (`op`), for the following runs. Nodes that optimization dropped are
    /// ignored.
    ///
    /// # Panics
    /// If `op` is not of the node's kind (see [`Graph::rebind_leaf`]).
    pub fn rebind(&mut self, node: NodeId, op: &Op) {
        let Some(&n) = self.map.get(&node) else { return };
        if &self.graph.node(n).op == op {
            return;
        }
        if let (Op::Full(v), Some(uses)) = (op, self.params_of.get(&n)) {
            for &(s, j) in uses {
                if let PreparedStep::Kernel { step, .. } = &mut self.steps[s] {
                    step.params[j] = *v;
                    self.dirty[s] = true;
                }
            }
        }
        if let Some(&s) = self.node_step.get(&n) {
            self.dirty[s] = true;
        }
        self.graph.rebind_leaf(n, op.clone());
    }

    /// The device the plan runs on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The options the plan was made with.
    pub fn options(&self) -> PlanOptions {
        self.options
    }

    /// For each of the plan's inputs, in order, whether a step writes into its buffer when
    /// nothing else holds it (the base of an in-place assign or scatter): a caller that will
    /// not read the value again may hand the buffer over ([`Prepared::run_owned`]).
    pub fn writes_into_inputs(&self) -> &[bool] {
        &self.writes_inputs
    }

    /// [`Prepared::writes_into_inputs`], found once when the plan is made.
    fn inputs_written(&self) -> Vec<bool> {
        let bases: Vec<NodeId> = self
            .steps
            .iter()
            .filter_map(|s| match s {
                PreparedStep::AssignInPlace { base, .. } => Some(*base),
                PreparedStep::ScatterInPlace(n) => Some(self.graph.arg_slice(*n)[0]),
                _ => None,
            })
            .collect();
        self.graph.inputs().iter().map(|i| bases.contains(i)).collect()
    }

    /// The number of steps (kernels, library calls and reference ops) one run takes.
    pub fn steps(&self) -> usize {
        self.steps.len()
    }
}

/// `KILN_DEBUG=passes`: each planning stage's result on standard error.
fn show_stage(name: &str, stage: Stage<'_>) {
    if trace::debug_passes() {
        eprintln!("kiln: after {name}:\n{stage}");
    }
}

/// Compiles a GPU plan's new kernels in parallel (each row group as its one kernel, its
/// members not on their own); returns the wall time it took and the time each kernel step
/// outside the groups took, in order (when this call compiled it).
fn precompile_gpu(prepared: &Prepared, sizes: Sizes) -> (Duration, Vec<Option<Duration>>) {
    let started = Instant::now();
    let Device::Cuda(i) = prepared.device else { return (Duration::ZERO, Vec::new()) };
    let Ok(gpu) = cuda::gpu(i) else { return (Duration::ZERO, Vec::new()) };
    let grouped = |s: usize| prepared.groups.iter().any(|g| (g.start..g.end).contains(&s));
    let kernels: Vec<&Kernel> = (prepared.steps.iter().enumerate())
        .filter_map(|(s, step)| match step {
            PreparedStep::Kernel { step, .. } if !grouped(s) => Some(&step.kernel),
            _ => None,
        })
        .collect();
    let groups: Vec<_> = prepared.gpu_groups.iter().map(|g| g.library_kernel().clone()).collect();
    let took = cuda::precompile(gpu, &kernels, &groups, sizes);
    (started.elapsed(), took)
}
