//! Fusion: partition a graph into fused elementwise kernels and the ops that run on their
//! own.
//!
//! The rule is small and states every cut:
//! - Elementwise ops (`Unary`, `Binary`, `Where`, `Cast`) fuse into the kernel of the value
//!   that consumes them.
//! - Constants (`Full`) become kernel parameters and views of computed buffers become index
//!   maps, wherever they are used: both are free to recompute, so they are never stored.
//! - A reduction (`sum`, `prod`, `max`, `min`, `logsumexp`) fuses the elementwise expression
//!   it reduces; a stored value that a row sum reduces whole is written by the sum's kernel
//!   in the same pass (`merge_into_reductions`: softmax's `exp(x - max)`).
//! - A value is stored (a kernel boundary) when it is a result the caller wants
//!   ([`Cut::Output`]), when several ops consume it and recomputing it in each costs more
//!   than storing and reloading it on the plan's target ([`Cut::Shared`], see
//!   [`crate::target::Target::op_cost`]: a CPU stores a shared exponential, a GPU recomputes
//!   it) or reading its inputs again in each moves more memory (a residual stream summed
//!   over many layers), when an op that is
//!   neither elementwise nor a fusable reduction consumes it ([`Cut::Feeds`]), or when it is
//!   read through a view ([`Cut::View`]: a view of an expression is not an index map into a
//!   buffer). A kernel also ends at [`MAX_KERNEL_OPS`] ops ([`Cut::Size`]).
//! - A shared value whose consumers all end in one kernel is computed once there, not stored
//!   (`compute_shared_values_once`).
//! - A kept result that only elementwise ops of one kernel consume is written by that kernel
//!   as a second output instead of being stored by its own (see `merge_kept_results`); so is
//!   a stored cast of a stored value, by the value's kernel (`merge_casts_into_producers`),
//!   and a value several kernels read, by the first elementwise kernel that reads it when
//!   every other reader comes later (`merge_shared_into_consumers`: a training step's
//!   forward values, read again by the backward).
//!
//! The partition depends only on the graph, so the same program gives the same kernels with
//! the same names on every run.

use rustc_hash::FxHashMap as HashMap;

use crate::kernel::{Expr, ExprKind, Kernel, KernelInput, KernelReduce};
use crate::pipeline::{Fusion, PlanOptions};
use crate::{Graph, NodeId, Op, Scalar, View};

/// Why a value was stored instead of fused into its consumer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// The caller asked for it (or a live tensor holds it).
    Output,
    /// Several ops consume it.
    Shared,
    /// An op that is not elementwise consumes it (named).
    Feeds(&'static str),
    /// It is read through a view, which is an index map only over a stored buffer.
    View,
    /// Fusion is off.
    Unfused,
    /// The kernel reached the size limit ([`MAX_KERNEL_OPS`]).
    Size,
}

/// The most ops one kernel fuses; longer chains are cut into several kernels, which keeps
/// compile times bounded (and code generation free of deep recursion).
pub const MAX_KERNEL_OPS: usize = 96;

impl std::fmt::Display for Cut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cut::Output => f.write_str("a result that is kept"),
            Cut::Shared => f.write_str("used by several ops"),
            Cut::Feeds(op) => write!(f, "feeds {op}"),
            Cut::View => f.write_str("read through a view"),
            Cut::Unfused => f.write_str("fusion is off"),
            Cut::Size => write!(f, "the kernel reached {MAX_KERNEL_OPS} ops"),
        }
    }
}

/// A fused kernel and how it binds to the graph.
#[derive(Clone, Debug)]
pub struct KernelStep {
    /// The kernel.
    pub kernel: Kernel,
    /// The node whose buffer each kernel input reads.
    pub inputs: Vec<NodeId>,
    /// The parameter values, in order.
    pub params: Vec<Scalar>,
    /// The `Full` node each parameter holds the value of, in order.
    pub param_nodes: Vec<NodeId>,
    /// The node each kernel output computes.
    pub outputs: Vec<NodeId>,
    /// Every graph node the kernel computes (outputs included), in topological order.
    pub fused: Vec<NodeId>,
    /// Why the output was stored.
    pub cut: Cut,
}

/// One step of a plan.
#[derive(Clone, Debug)]
pub enum Step {
    /// Run a fused kernel.
    Kernel(Box<KernelStep>),
    /// Run one op that is not elementwise (a gather, a scatter, ...).
    Node(NodeId),
    /// A library op that reads its operands through views of stored buffers (a matrix
    /// product; fused attention, a slice's gradient (`Unview`) and an `Assign`'s values where
    /// [`crate::target::Target::library_reads_views`]): a transposed or sliced operand is
    /// passed as strides, not copied.
    Library {
        /// The op's node.
        node: NodeId,
        /// Each operand's buffer and the view of it the op reads.
        operands: Vec<(NodeId, View)>,
    },
    /// A reshape of a whole stored buffer: the node's value is `of`'s buffer under its own
    /// shape, with no work.
    Alias {
        /// The reshape's node.
        node: NodeId,
        /// The node whose buffer it is.
        of: NodeId,
    },
    /// An `Assign` whose base no later step or output reads: the values are written into
    /// the base's buffer, which becomes the result (where
    /// [`crate::target::Target::writes_in_place`]; the executor copies instead when the
    /// buffer is shared, as a graph input the caller holds is).
    AssignInPlace {
        /// The assignment's node.
        node: NodeId,
        /// The base it writes into.
        base: NodeId,
        /// The values' buffer and the view of it the assignment reads.
        values: (NodeId, View),
    },
    /// A scatter whose base is one value everywhere, read by nothing else: the scatter fills
    /// its own output with the value of the `Full` node `fill` (read when it runs, so a
    /// rebound constant is seen) and scatters into it; the kernel that would have filled the
    /// base is not a step (where [`crate::target::Target::writes_in_place`]).
    ScatterOntoFill {
        /// The scatter's node.
        node: NodeId,
        /// The `Full` node holding the base's value.
        fill: NodeId,
    },
    /// A scatter whose base no later step or output reads: the values are written into the
    /// base's buffer, which becomes the result (where
    /// [`crate::target::Target::writes_in_place`]; the executor copies instead when the
    /// buffer is shared). A static key/value cache's step writes its new keys this way.
    ScatterInPlace {
        /// The scatter's node (its base is its first argument).
        node: NodeId,
    },
}

impl Step {
    /// The nodes whose buffers the step reads, once per read.
    pub fn reads(&self, graph: &Graph) -> Vec<NodeId> {
        match self {
            Step::Kernel(k) => k.inputs.clone(),
            Step::Node(n) | Step::ScatterInPlace { node: n } => graph.arg_slice(*n).to_vec(),
            Step::Library { operands, .. } => operands.iter().map(|(n, _)| *n).collect(),
            Step::Alias { of, .. } => vec![*of],
            Step::AssignInPlace { base, values, .. } => vec![*base, values.0],
            Step::ScatterOntoFill { node, .. } => graph.arg_slice(*node)[1..].to_vec(),
        }
    }

    /// The nodes whose values the step writes.
    pub fn writes(&self) -> Vec<NodeId> {
        match self {
            Step::Kernel(k) => k.outputs.clone(),
            Step::Node(n)
            | Step::Library { node: n, .. }
            | Step::Alias { node: n, .. }
            | Step::AssignInPlace { node: n, .. }
            | Step::ScatterOntoFill { node: n, .. }
            | Step::ScatterInPlace { node: n } => vec![*n],
        }
    }
}

/// Which values of a graph are stored (kernel boundaries), and why: the partition stage's
/// result, which [`lower`] turns into steps.
#[derive(Clone, Debug, Default)]
pub struct Partition {
    /// Every stored value, with the reason.
    pub stored: HashMap<NodeId, Cut>,
    /// Kept results, and casts of stored values, written by the kernel of another value
    /// (value -> that kernel's root) rather than by a kernel of their own.
    pub merged: HashMap<NodeId, NodeId>,
    /// Stored values that the reduction over them writes (value -> the reduction).
    pub reduced_by: HashMap<NodeId, NodeId>,
}

impl Partition {
    /// The partition as text, one stored value a line (what `KILN_DEBUG=passes` prints).
    pub fn write(&self, graph: &Graph, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names = graph.numbering();
        for n in graph.topo_order() {
            let Some(cut) = self.stored.get(&n) else { continue };
            let node = graph.node(n);
            write!(f, "%{} {} {}: {cut}", names[&n], node.op.name(), node.shape)?;
            if let Some(root) = self.merged.get(&n) {
                write!(f, "; written by the kernel of %{}", names[root])?;
            }
            if let Some(r) = self.reduced_by.get(&n) {
                write!(f, "; written by the reduction %{}", names[r])?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

/// A shared value is recomputed by each consumer rather than stored when its ops cost at most
/// this much ([`crate::target::Target::op_cost`]): cheap arithmetic costs less than the store and reload of the
/// value, a transcendental function (a polynomial of some thirty instructions on 128-bit
/// vectors) costs more.
pub const MAX_RECOMPUTE_COST: usize = 8;

/// The partition stage: decides which values of `graph` are stored and why.
pub fn partition(graph: &Graph, options: &PlanOptions) -> Partition {
    partition_observed(graph, options, &mut |_, _| {})
}

/// [`partition`], calling `observe` with each refinement's name and the partition after it
/// (the [`REFINEMENTS`] that apply under `options`, in order).
pub fn partition_observed(
    graph: &Graph,
    options: &PlanOptions,
    observe: &mut dyn FnMut(&'static str, &Partition),
) -> Partition {
    let order = graph.topo_order();
    let consumers = consumers(graph, &order);
    let mut cx = Refining {
        graph,
        options,
        order,
        consumers,
        partition: Partition::default(),
        size: HashMap::default(),
    };
    for r in REFINEMENTS.iter().filter(|r| (r.applies)(options)) {
        (r.run)(&mut cx);
        observe(r.name, &cx.partition);
    }
    cx.partition
}

/// Each node's consumers.
fn consumers(graph: &Graph, order: &[NodeId]) -> HashMap<NodeId, Vec<NodeId>> {
    let mut consumers: HashMap<NodeId, Vec<NodeId>> = HashMap::default();
    for &n in order {
        for &a in graph.arg_slice(n) {
            consumers.entry(a).or_default().push(n);
        }
    }
    consumers
}

/// The fusable values that are stored, with why; and the ops each value's kernel would hold
/// if it were stored.
fn cuts(
    graph: &Graph,
    order: &[NodeId],
    consumers: &HashMap<NodeId, Vec<NodeId>>,
    options: &PlanOptions,
) -> (HashMap<NodeId, Cut>, HashMap<NodeId, usize>) {
    let mut stored: HashMap<NodeId, Cut> = HashMap::default();
    let mut size: HashMap<NodeId, usize> = HashMap::default();
    let mut costs: HashMap<NodeId, usize> = HashMap::default();
    let mut reads: HashMap<NodeId, Vec<NodeId>> = HashMap::default();
    for &n in order {
        let op = &graph.node(n).op;
        if !op.is_elementwise() && !op.is_free() {
            continue;
        }
        let unstored = || graph.arg_slice(n).iter().filter(|a| !stored.contains_key(a));
        let own = usize::from(op.is_elementwise())
            + unstored().filter_map(|a| size.get(a)).sum::<usize>();
        let cost =
            options.target.op_cost(op) + unstored().filter_map(|a| costs.get(a)).sum::<usize>();
        size.insert(n, own);
        costs.insert(n, cost);
        let read = buffers_read(graph, n, &stored, &size, &reads);
        let cons = consumers.get(&n).map_or(&[][..], Vec::as_slice);
        let node = Candidate { n, own, cost, reads: read.len(), consumers: cons };
        reads.insert(n, read);
        if let Some(cut) = cut_of(graph, &node, &stored, options) {
            stored.insert(n, cut);
        }
    }
    (stored, size)
}

/// Buffers of its own size (at most [`MAX_TRACKED_READS`] of them) that computing fusable
/// value `n` where it is used reads: its stored arguments, and those its unstored arguments
/// read. Smaller ones (a norm's weight, a row's statistic) are left out: they stay in cache.
fn buffers_read(
    graph: &Graph,
    n: NodeId,
    stored: &HashMap<NodeId, Cut>,
    size: &HashMap<NodeId, usize>,
    reads: &HashMap<NodeId, Vec<NodeId>>,
) -> Vec<NodeId> {
    let numel = graph.node(n).shape.numel();
    let mut out: Vec<NodeId> = Vec::new();
    for &a in graph.arg_slice(n) {
        let buffer = stored.contains_key(&a) || !size.contains_key(&a);
        let theirs = if buffer {
            if matches!(graph.node(a).op, Op::Full(_)) || graph.node(a).shape.numel() != numel {
                continue;
            }
            std::slice::from_ref(&a)
        } else {
            reads.get(&a).map_or(&[][..], Vec::as_slice)
        };
        for &b in theirs {
            if out.len() < MAX_TRACKED_READS && !out.contains(&b) {
                out.push(b);
            }
        }
    }
    out
}

/// How many buffers [`buffers_read`] follows: enough to tell that storing pays.
const MAX_TRACKED_READS: usize = 4;

/// A fusable value as the cut rule sees it.
struct Candidate<'a> {
    n: NodeId,
    /// Ops its kernel would hold.
    own: usize,
    /// What recomputing it in a consumer costs.
    cost: usize,
    /// Buffers of its size that recomputing it reads.
    reads: usize,
    consumers: &'a [NodeId],
}

impl Candidate<'_> {
    /// Whether reading its inputs again in every consumer moves more memory than storing it
    /// once and reading it back: `k` consumers of a value over `r` buffers read `k·r`
    /// buffers recomputing, `r + 1 + k` storing (a tie stores). A residual stream `x + a + b + ..` is then
    /// stored every few additions, instead of every later layer's norm recomputing it from
    /// all the earlier layers' outputs.
    fn rereads_cost_more(&self) -> bool {
        let k = self.consumers.len();
        k > 1 && (k - 1) * self.reads > k
    }
}

/// Why `c` is stored, or `None` when it fuses into its consumers.
fn cut_of(
    graph: &Graph,
    c: &Candidate<'_>,
    stored: &HashMap<NodeId, Cut>,
    options: &PlanOptions,
) -> Option<Cut> {
    let op = &graph.node(c.n).op;
    let fused = options.fusion == Fusion::Fused;
    if graph.outputs().contains(&c.n) {
        return Some(Cut::Output);
    }
    if let Op::View(view) = op
        && is_buffer(graph, graph.arg_slice(c.n)[0], stored)
        && !c.consumers.is_empty()
        && c.consumers.iter().all(|&m| reads_view_of(graph, m, (c.n, view), options))
    {
        return None;
    }
    if let Some(&m) = c.consumers.iter().find(|&&m| {
        let cop = &graph.node(m).op;
        !(cop.is_elementwise() || cop.is_free() || (cop.is_kernel_reduce() && fused))
    }) {
        return Some(Cut::Feeds(graph.node(m).op.name()));
    }
    if matches!(op, Op::Full(_)) {
        None
    } else if c.consumers.iter().any(|&m| matches!(graph.node(m).op, Op::View(_))) {
        Some(Cut::View)
    } else if op.is_free() {
        None
    } else if !fused {
        Some(Cut::Unfused)
    } else if c.consumers.len() > 1 && (c.cost > MAX_RECOMPUTE_COST || c.rereads_cost_more()) {
        Some(Cut::Shared)
    } else if c.own >= MAX_KERNEL_OPS {
        Some(Cut::Size)
    } else {
        None
    }
}

/// The lowering stage: every kernel of `partition` written as Kernel IR, and the other
/// steps, in dependency order; collectives as early as their inputs allow, so that
/// communication overlaps the steps after them.
pub fn lower(graph: &Graph, partition: &Partition, options: &PlanOptions) -> Vec<Step> {
    let Partition { stored, merged, reduced_by } = partition;
    // Kernels that write merged results build with those values computed inline.
    let mut written_by: HashMap<NodeId, Vec<NodeId>> = HashMap::default();
    let order = graph.topo_order();
    for &n in &order {
        if let Some(&root) = merged.get(&n) {
            written_by.entry(root).or_default().push(n);
        }
    }
    // A kernel computes the values merged into it inline and reads every other stored value
    // (a merged value is read by kernels besides its writer's).
    let inline_stored = |extra: &[NodeId]| -> HashMap<NodeId, Cut> {
        let mut inline = stored.clone();
        for e in extra {
            inline.remove(e);
        }
        inline
    };
    let writes: HashMap<NodeId, NodeId> = reduced_by.iter().map(|(&v, &r)| (r, v)).collect();
    let kernel = |step: KernelStep| Step::Kernel(Box::new(step));
    let mut steps = Vec::new();
    for &n in &order {
        let op = &graph.node(n).op;
        if matches!(op, Op::Input) || merged.contains_key(&n) || reduced_by.contains_key(&n) {
            continue;
        }
        if stored.contains_key(&n)
            && !written_by.contains_key(&n)
            && shares_buffer(graph, n, stored)
        {
            steps.push(Step::Alias { node: n, of: graph.arg_slice(n)[0] });
        } else if let Some(&cut) = stored.get(&n) {
            steps.push(kernel(match written_by.get(&n) {
                Some(extra) => build_kernel(graph, n, cut, &inline_stored(extra), extra),
                None => build_kernel(graph, n, cut, stored, &[]),
            }));
        } else if let Some(&value) = writes.get(&n) {
            // The value it reduces, and the kept results that value's own kernel would
            // have written, stored unreduced. It computes that value; the values other
            // reductions wrote before it are buffers it reads (recomputing them would
            // recompute, say, a post-norm residual stream from every earlier layer).
            let mut extra = vec![value];
            extra.extend(written_by.get(&value).into_iter().flatten().copied());
            steps.push(kernel(build_reduce_kernel(graph, n, &inline_stored(&extra), &extra)));
        } else if op.is_kernel_reduce() {
            steps.push(kernel(build_reduce_kernel(graph, n, stored, &[])));
        } else if reads_views(graph, n, options) {
            steps.push(library_step(graph, n, stored));
        } else if !op.is_elementwise() && !op.is_free() {
            steps.push(Step::Node(n));
        }
    }
    schedule::collectives_early(graph, steps)
}

/// Whether op `n` runs as a [`Step::Library`], reading views of stored buffers as strides.
fn reads_views(graph: &Graph, n: NodeId, options: &PlanOptions) -> bool {
    let target = &options.target;
    let node = graph.node(n);
    match node.op {
        Op::MatMul => target.has_gemm(node.dtype),
        Op::Attention { .. } | Op::AttentionGrad { .. } => target.library_reads_views,
        Op::Unview { .. } | Op::Assign(_) => {
            target.library_reads_views && node.dtype != crate::DType::Bool
        }
        Op::Custom(_) => target.custom_ops_read_views,
        _ => false,
    }
}

/// Whether op `m` reads its argument `arg` (a view) as strides: every argument of a product
/// (any strides), and with non-negative strides every argument of attention and the values
/// (not the base) of a slice's gradient or an `Assign`.
fn reads_view_of(
    graph: &Graph,
    m: NodeId,
    (arg, view): (NodeId, &View),
    options: &PlanOptions,
) -> bool {
    let op = &graph.node(m).op;
    reads_views(graph, m, options)
        && (matches!(op, Op::MatMul | Op::Custom(_))
            || (view.strides().iter().all(|&s| s >= 0)
                && (!matches!(op, Op::Assign(_)) || graph.arg_slice(m)[0] != arg)))
}

/// A library op reading its operands' views of stored buffers as strides.
fn library_step(graph: &Graph, n: NodeId, stored: &HashMap<NodeId, Cut>) -> Step {
    let operand = |&a: &NodeId| match &graph.node(a).op {
        Op::View(v) if !stored.contains_key(&a) => (graph.arg_slice(a)[0], v.clone()),
        _ => (a, View::contiguous(graph.node(a).shape.clone())),
    };
    Step::Library { node: n, operands: graph.arg_slice(n).iter().map(operand).collect() }
}

/// Whether `n` is a view that reads all of its argument's buffer in order (a reshape of a
/// stored value), so that it needs no kernel: its consumers can read that buffer.
pub fn shares_buffer(graph: &Graph, n: NodeId, stored: &HashMap<NodeId, Cut>) -> bool {
    let Op::View(view) = &graph.node(n).op else { return false };
    let arg = graph.arg_slice(n)[0];
    is_buffer(graph, arg, stored) && view.is_dense_over(graph.node(arg).shape.numel())
}

/// Whether `n`'s value is a buffer when a kernel reads it.
fn is_buffer(graph: &Graph, n: NodeId, stored: &HashMap<NodeId, Cut>) -> bool {
    let op = &graph.node(n).op;
    stored.contains_key(&n) || (!op.is_elementwise() && !op.is_free())
}

struct Builder<'a> {
    graph: &'a Graph,
    stored: &'a HashMap<NodeId, Cut>,
    kernel: Kernel,
    inputs: Vec<NodeId>,
    params: Vec<Scalar>,
    param_nodes: Vec<NodeId>,
    fused: Vec<NodeId>,
    memo: HashMap<NodeId, usize>,
    loads: HashMap<(NodeId, View), usize>,
}

/// A reduction kernel for `root`: its input's elementwise expression (or a load of it),
/// evaluated over the input's shape permuted to `[kept.., reduced..]`, and reduced.
///
/// `extra` are values of the input's shape (the reduced value, and values computed on the
/// way to it) that the kernel also writes unreduced; they need a reduction over trailing
/// dimensions, whose domain is the input's own layout.
fn build_reduce_kernel(
    graph: &Graph,
    root: NodeId,
    stored: &HashMap<NodeId, Cut>,
    extra: &[NodeId],
) -> KernelStep {
    let Op::Reduce { op, axes } = &graph.node(root).op else { unreachable!("a reduce node") };
    let src = graph.args(root)[0];
    let shape = graph.node(src).shape.clone();
    let mut b = Builder::new(graph, stored, shape.clone());
    let out = if is_buffer(graph, src, stored) {
        b.load(src, View::contiguous(shape.clone()))
    } else {
        b.expr(src, false)
    };
    let written: Vec<usize> = extra.iter().map(|&m| b.expr(m, false)).collect();
    b.fused.push(root);
    let kept: Vec<usize> = (0..shape.rank()).filter(|d| !axes.contains(d)).collect();
    let perm: Vec<usize> = kept.iter().chain(axes).copied().collect();
    let mut kernel = b.kernel;
    kernel.shape = crate::Shape::new(perm.iter().map(|&d| shape.dims()[d]).collect());
    for input in &mut kernel.inputs {
        input.view = input.view.permute(&perm);
    }
    kernel.outputs.push(out);
    kernel.outputs.extend(written);
    kernel.params = b.params.len();
    kernel.reduce = Some(KernelReduce { op: *op, kept: kept.len() });
    KernelStep {
        kernel,
        inputs: b.inputs,
        params: b.params,
        param_nodes: b.param_nodes,
        outputs: std::iter::once(root).chain(extra.iter().copied()).collect(),
        fused: b.fused,
        cut: Cut::Feeds("a reduction"),
    }
}

/// The kernel that stores `root`, and also writes the kept results `extra` that it
/// computes on the way (see [`merge_kept_results`]).
fn build_kernel(
    graph: &Graph,
    root: NodeId,
    cut: Cut,
    stored: &HashMap<NodeId, Cut>,
    extra: &[NodeId],
) -> KernelStep {
    let node = graph.node(root);
    let mut b = Builder::new(graph, stored, node.shape.clone());
    let out = b.expr(root, true);
    b.kernel.outputs.push(out);
    let mut outputs = vec![root];
    for &m in extra {
        let e = b.expr(m, false);
        b.kernel.outputs.push(e);
        outputs.push(m);
    }
    b.kernel.params = b.params.len();
    KernelStep {
        kernel: b.kernel,
        inputs: b.inputs,
        params: b.params,
        param_nodes: b.param_nodes,
        outputs,
        fused: b.fused,
        cut,
    }
}

impl<'a> Builder<'a> {
    fn new(graph: &'a Graph, stored: &'a HashMap<NodeId, Cut>, shape: crate::Shape) -> Builder<'a> {
        Builder {
            graph,
            stored,
            kernel: Kernel {
                shape,
                inputs: Vec::new(),
                exprs: Vec::new(),
                outputs: Vec::new(),
                params: 0,
                reduce: None,
            },
            inputs: Vec::new(),
            params: Vec::new(),
            param_nodes: Vec::new(),
            fused: Vec::new(),
            memo: HashMap::default(),
            loads: HashMap::default(),
        }
    }
}

impl Builder<'_> {
    fn push(&mut self, kind: ExprKind, dtype: crate::DType) -> usize {
        self.kernel.exprs.push(Expr { kind, dtype });
        self.kernel.exprs.len() - 1
    }

    fn load(&mut self, buffer: NodeId, view: View) -> usize {
        let dtype = self.graph.node(buffer).dtype;
        let input = match self.loads.get(&(buffer, view.clone())) {
            Some(&i) => i,
            None => {
                self.kernel.inputs.push(KernelInput { dtype, view: view.clone() });
                self.inputs.push(buffer);
                self.loads.insert((buffer, view), self.inputs.len() - 1);
                self.inputs.len() - 1
            }
        };
        self.push(ExprKind::Load(input), dtype)
    }

    /// The expression for node `n` over the kernel's domain; `root` marks the stored value
    /// itself (which is computed here even though it is stored).
    fn expr(&mut self, n: NodeId, root: bool) -> usize {
        if let Some(&e) = self.memo.get(&n) {
            return e;
        }
        let graph = self.graph;
        let node = graph.node(n);
        let e = if !root && is_buffer(graph, n, self.stored) {
            self.load(n, View::contiguous(node.shape.clone()))
        } else {
            match &node.op {
                Op::Full(v) => {
                    self.params.push(*v);
                    self.param_nodes.push(n);
                    self.push(ExprKind::Param(self.params.len() - 1), node.dtype)
                }
                Op::View(view) => {
                    let src = graph.args(n)[0];
                    match &graph.node(src).op {
                        Op::Full(v) => {
                            if !self.fused.contains(&src) {
                                self.fused.push(src);
                            }
                            self.params.push(*v);
                            self.param_nodes.push(src);
                            self.push(ExprKind::Param(self.params.len() - 1), node.dtype)
                        }
                        _ => self.load(src, view.clone()),
                    }
                }
                op => {
                    let args: Vec<usize> =
                        graph.args(n).into_iter().map(|a| self.expr(a, false)).collect();
                    let kind = match op {
                        Op::Unary(u) => ExprKind::Unary(*u, args[0]),
                        Op::Binary(b) => ExprKind::Binary(*b, args[0], args[1]),
                        Op::Where => ExprKind::Where(args[0], args[1], args[2]),
                        Op::Cast(_) => ExprKind::Cast(args[0]),
                        other => unreachable!("{} is not elementwise", other.name()),
                    };
                    self.push(kind, node.dtype)
                }
            }
        };
        if root || !is_buffer(graph, n, self.stored) {
            self.fused.push(n);
        }
        self.memo.insert(n, e);
        e
    }
}

mod buffers;
mod refine;
mod schedule;

pub use buffers::reuse_buffers;

use refine::Refining;
pub use refine::{REFINEMENTS, Refinement};
#[cfg(test)]
mod tests;
