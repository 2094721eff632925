//! The planning pipeline: from a captured graph to a [`Plan`], through named stages.
//!
//! ```text
//! Graph ──precise_log_softmax──▶ Graph ──expand_logsumexp──▶ Graph ──transpose_products──▶ Graph
//!       ──gather_first──▶ Graph ──casts_before_views──▶ Graph ──simplify──▶ Graph ──cse──▶ Graph
//!       ──partition.cuts──▶ Partition ──partition.shared_values──▶ ... ──lower──▶ Plan
//!       (kernels and other steps)
//! ```
//!
//! Every graph pass is a value implementing [`Pass`]: it has a name and returns one
//! [`Rewrite`] (the new graph, and where each kept node went) or nothing when it changes
//! nothing. A [`Pipeline`] runs passes in order and composes their maps once; a
//! [`Planner`] runs the pipeline, then the two fusion stages ([`crate::fuse::partition`]
//! decides which values are stored and why, in the named refinements of
//! [`crate::fuse::REFINEMENTS`]; [`crate::fuse::lower`] writes each fused group as Kernel
//! IR). An observer sees the graph after every named stage: that is what
//! `KILN_DEBUG=passes` prints.
//!
//! [`PlanOptions`] holds every choice a plan depends on; nothing else in the pipeline reads
//! a setting.
//!
//! ```
//! use kiln_ir::pipeline::{Constants, Fusion, PlanOptions, Planner};
//! use kiln_ir::target::{OpCosts, Target};
//! use kiln_ir::{BinaryOp, DType, Graph, Op, Shape, UnaryOp};
//! # const TARGET: Target = Target { name: "cpu", costs: OpCosts { transcendental: 32, division: 4, arithmetic: 1 }, gemm_dtypes: &[DType::F32], library_reads_views: true, reductions_store_inputs: true, fused_logsumexp: true, writes_in_place: true, custom_ops_read_views: true };
//! let mut g = Graph::new();
//! let x = g.input(Shape::from([8]), DType::F32);
//! let e = g.push(Op::Unary(UnaryOp::Exp), &[x])?;
//! let y = g.push(Op::Binary(BinaryOp::Mul), &[e, x])?;
//! g.mark_output(y);
//! let options = PlanOptions { fusion: Fusion::Fused, constants: Constants::Fold, target: TARGET };
//! let mut stages = Vec::new();
//! let plan = Planner::default().plan_observed(&g, options, &mut |name, _| stages.push(name.to_string()));
//! assert_eq!(plan.steps.len(), 1); // exp and mul in one kernel
//! assert_eq!(stages, ["precise_log_softmax", "expand_logsumexp", "transpose_products", "gather_first", "casts_before_views", "simplify", "cse", "partition.cuts", "partition.shared_values", "partition.kept_results", "partition.into_reductions", "partition.casts_into_producers", "partition.shared_into_consumers", "lower", "reuse_buffers"]);
//! # Ok::<(), kiln_ir::IrError>(())
//! ```

use rustc_hash::FxHashMap as HashMap;

use crate::fuse::{self, Step};
use crate::passes;
use crate::target::Target;
use crate::{Graph, NodeId};

/// Whether a plan fuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Fusion {
    /// Elementwise chains, broadcasts and reduction prologues fuse into few kernels.
    #[default]
    Fused,
    /// One kernel per op: the unfused baseline the profiler compares against. Row groups
    /// and other scheduling of fused plans are off too.
    Unfused,
}

/// What a plan may assume about the graph's constants and random keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Constants {
    /// Their values are fixed: passes fold them and merge equal ones.
    #[default]
    Fold,
    /// They take new values on every run (`compile()`): passes keep each one apart and
    /// never read its value, so the plan stays valid when they are rebound.
    Rebindable,
}

/// Every choice a plan depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PlanOptions {
    /// Fused or one kernel per op.
    pub fusion: Fusion,
    /// Folded or rebindable constants.
    pub constants: Constants,
    /// The machine the plan runs on.
    pub target: Target,
}

/// Where each node of a graph went in its rewritten form: old node -> new node, for every
/// node that is still computed.
pub type NodeMap = HashMap<NodeId, NodeId>;

/// What a pass returns: the rewritten graph and where each kept node went.
#[derive(Clone, Debug)]
pub struct Rewrite {
    /// The new graph. Its inputs bind to the same buffers, in the same order.
    pub graph: Graph,
    /// Old node -> new node.
    pub map: NodeMap,
}

impl Rewrite {
    /// `self` followed by `next` (a rewrite of `self.graph`): one map from the first graph
    /// to the last.
    pub fn then(self, next: Rewrite) -> Rewrite {
        let map = self
            .map
            .into_iter()
            .filter_map(|(old, mid)| next.map.get(&mid).map(|&new| (old, new)))
            .collect();
        Rewrite { graph: next.graph, map }
    }

    /// The identity rewrite of `graph` (a copy).
    pub fn identity(graph: &Graph) -> Rewrite {
        let map = graph.topo_order().into_iter().map(|n| (n, n)).collect();
        Rewrite { graph: graph.clone(), map }
    }
}

/// A graph pass: a named rewrite that keeps the graph's values.
pub trait Pass: Sync {
    /// The pass's name, as debug output shows it.
    fn name(&self) -> &'static str;
    /// The rewritten graph, or `None` when the pass changes nothing.
    fn run(&self, graph: &Graph, options: &PlanOptions) -> Option<Rewrite>;
}

/// Passes run in order.
pub struct Pipeline {
    passes: Vec<&'static dyn Pass>,
}

impl Default for Pipeline {
    /// The standard pipeline: [`passes::PreciseLogSoftmax`], [`passes::ExpandLogSumExp`],
    /// [`passes::TransposeProducts`],
    /// [`passes::GatherFirst`], [`passes::CastsBeforeViews`], [`passes::Simplify`],
    /// [`passes::Cse`].
    fn default() -> Pipeline {
        Pipeline::new(vec![
            &passes::PreciseLogSoftmax,
            &passes::ExpandLogSumExp,
            &passes::TransposeProducts,
            &passes::GatherFirst,
            &passes::CastsBeforeViews,
            &passes::Simplify,
            &passes::Cse,
        ])
    }
}

impl Pipeline {
    /// A pipeline of `passes`, run in that order.
    pub fn new(passes: Vec<&'static dyn Pass>) -> Pipeline {
        Pipeline { passes }
    }

    /// The passes, in order.
    pub fn passes(&self) -> &[&'static dyn Pass] {
        &self.passes
    }

    /// The passes' names, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.passes.iter().map(|p| p.name()).collect()
    }

    /// Runs every pass; `observe` sees each pass's name and the graph after it.
    pub fn run(
        &self,
        graph: &Graph,
        options: &PlanOptions,
        observe: &mut dyn FnMut(&str, Stage<'_>),
    ) -> Rewrite {
        let mut done: Option<Rewrite> = None;
        for pass in &self.passes {
            let current = done.as_ref().map_or(graph, |r| &r.graph);
            if let Some(next) = pass.run(current, options) {
                done = Some(match done {
                    Some(before) => before.then(next),
                    None => next,
                });
            }
            observe(pass.name(), Stage::Graph(done.as_ref().map_or(graph, |r| &r.graph)));
        }
        done.unwrap_or_else(|| Rewrite::identity(graph))
    }
}

/// A plan: the optimized graph and the steps that compute it.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The graph after every pass; the steps refer to its nodes.
    pub graph: Graph,
    /// Node of the captured graph -> node of [`Plan::graph`], for every node still computed.
    pub map: NodeMap,
    /// The captured graph's outputs, in order, as nodes of [`Plan::graph`] (outputs that
    /// merged appear once per original output).
    pub outputs: Vec<NodeId>,
    /// The steps, in dependency order.
    pub steps: Vec<Step>,
    /// The options it was made with.
    pub options: PlanOptions,
}

/// What a stage of the planner produced, as [`Planner::plan_observed`] shows it. Its
/// `Display` is the text `KILN_DEBUG=passes` prints and the stage snapshots hold.
#[derive(Clone, Copy)]
pub enum Stage<'a> {
    /// A graph pass's result.
    Graph(&'a Graph),
    /// Which values are stored, and why.
    Partition(&'a Graph, &'a fuse::Partition),
    /// The plan's steps.
    Steps(&'a Graph, &'a [Step]),
}

impl std::fmt::Display for Stage<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Stage::Graph(g) => write!(f, "{g}"),
            Stage::Partition(g, p) => p.write(g, f),
            Stage::Steps(g, steps) => {
                let names = g.numbering();
                for step in steps {
                    match step {
                        Step::Kernel(k) => {
                            let outs: Vec<String> =
                                k.outputs.iter().map(|o| format!("%{}", names[o])).collect();
                            writeln!(
                                f,
                                "kernel {} -> {} (stored: {})",
                                k.kernel.name(),
                                outs.join(", "),
                                k.cut
                            )?;
                            writeln!(f, "{}", k.kernel)?;
                        }
                        Step::Node(n) => writeln!(f, "node %{} = {}", names[n], g.node(*n).op)?,
                        Step::Library { node, operands } => {
                            let op = g.node(*node).op.name();
                            let between = if op == "matmul" { " @ " } else { ", " };
                            let operands: Vec<String> = operands
                                .iter()
                                .map(|(n, v)| format!("%{} {v:?}", names[n]))
                                .collect();
                            writeln!(f, "{op} %{} = {}", names[node], operands.join(between))?;
                        }
                        Step::Alias { node, of } => {
                            writeln!(
                                f,
                                "alias %{} = %{} as {}",
                                names[node],
                                names[of],
                                g.node(*node).shape
                            )?;
                        }
                        Step::AssignInPlace { node, base, values: (v, view) } => writeln!(
                            f,
                            "assign in place %{} = %{} <- %{} {view:?}",
                            names[node], names[base], names[v]
                        )?,
                        Step::ScatterOntoFill { node, fill } => writeln!(
                            f,
                            "scatter onto fill %{} = {} onto %{}",
                            names[node],
                            g.node(*node).op,
                            names[fill]
                        )?,
                        Step::ScatterInPlace { node } => writeln!(
                            f,
                            "scatter in place %{} = {} into %{}",
                            names[node],
                            g.node(*node).op,
                            names[&g.arg_slice(*node)[0]]
                        )?,
                    }
                }
                Ok(())
            }
        }
    }
}

/// Turns graphs into plans: the graph pipeline, then partition and lowering.
#[derive(Default)]
pub struct Planner {
    pipeline: Pipeline,
}

impl Planner {
    /// A planner with its own graph pipeline.
    pub fn new(pipeline: Pipeline) -> Planner {
        Planner { pipeline }
    }

    /// The plan of `graph` under `options`.
    pub fn plan(&self, graph: &Graph, options: PlanOptions) -> Plan {
        self.plan_observed(graph, options, &mut |_, _| {})
    }

    /// [`Planner::plan`], calling `observe` with each stage's name and what it produced.
    pub fn plan_observed(
        &self,
        graph: &Graph,
        options: PlanOptions,
        observe: &mut dyn FnMut(&str, Stage<'_>),
    ) -> Plan {
        let Rewrite { graph: optimized, map } = self.pipeline.run(graph, &options, observe);
        let outputs: Vec<NodeId> = graph.outputs().iter().map(|o| map[o]).collect();
        let partition = fuse::partition_observed(&optimized, &options, &mut |name, p| {
            observe(name, Stage::Partition(&optimized, p));
        });
        let steps = fuse::lower(&optimized, &partition, &options);
        observe("lower", Stage::Steps(&optimized, &steps));
        let steps = fuse::reuse_buffers(&optimized, steps, &outputs, &options);
        observe("reuse_buffers", Stage::Steps(&optimized, &steps));
        Plan { graph: optimized, map, outputs, steps, options }
    }
}
