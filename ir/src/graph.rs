//! The graph of ops that one realization runs, built on petgraph.

use std::panic::Location;

use petgraph::Direction;
use petgraph::stable_graph::StableDiGraph;
use petgraph::visit::EdgeRef;
use rustc_hash::FxHashMap as HashMap;

use crate::{DType, IrError, Op, Shape};

/// A node's handle in a [`Graph`].
pub type NodeId = petgraph::stable_graph::NodeIndex;

/// One node: an op with its inferred shape and dtype, and the user's source line that
/// recorded it (so that a failure found later can point there).
#[derive(Clone, Debug)]
pub struct Node {
    /// The op.
    pub op: Op,
    /// The result's shape.
    pub shape: Shape,
    /// The result's dtype.
    pub dtype: DType,
    /// Where the op was recorded, when known.
    pub origin: Option<&'static Location<'static>>,
    /// The user-defined op it was recorded inside, if any (`kiln::ops::Elementwise`):
    /// profiles and kernel descriptions show it by that name.
    pub label: Option<Label>,
}

/// The name of a user-defined op, on the nodes its definition records (and `grad` on the
/// nodes of its gradient).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Label {
    /// The op's name.
    pub name: &'static str,
    /// Whether the node belongs to the op's gradient.
    pub grad: bool,
}

impl std::fmt::Display for Label {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.grad {
            true => write!(f, "{}.grad", self.name),
            false => f.write_str(self.name),
        }
    }
}

/// A dataflow graph of [`Op`]s. Edges run from an input to its consumer and carry the
/// input's position. Nodes are added with their inputs already present, so insertion order
/// is a topological order, and [`Graph::topo_order`] returns it (passes rebuild a rewritten
/// graph node by node in such an order, so this holds for their graphs too).
///
/// ```
/// use kiln_ir::{BinaryOp, DType, Graph, Op, Shape, UnaryOp};
/// let mut g = Graph::new();
/// let x = g.input(Shape::from([2, 3]), DType::F32);
/// let e = g.push(Op::Unary(UnaryOp::Exp), &[x])?;
/// let y = g.push(Op::Binary(BinaryOp::Add), &[e, x])?;
/// g.mark_output(y);
/// assert_eq!(g.node(y).shape, Shape::from([2, 3]));
/// assert_eq!(g.topo_order(), vec![x, e, y]);
/// assert!(g.to_dot().contains("add"));
/// # Ok::<(), kiln_ir::IrError>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct Graph {
    graph: StableDiGraph<Node, usize>,
    /// Each node's inputs in argument order, by node index: `args` is called for every node
    /// by every pass, and reading the edges back (collect, sort) cost two allocations a call.
    arg_lists: Vec<Vec<NodeId>>,
    inputs: Vec<NodeId>,
    outputs: Vec<NodeId>,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Graph {
        Graph::default()
    }

    /// Adds an `Input` node, bound to the next buffer passed when the graph runs.
    pub fn input(&mut self, shape: Shape, dtype: DType) -> NodeId {
        let id =
            self.graph.add_node(Node { op: Op::Input, shape, dtype, origin: None, label: None });
        self.arg_lists.push(Vec::new());
        self.inputs.push(id);
        id
    }

    /// Adds a leaf op other than `Input` (`Full`, `Random`) with its given shape and dtype.
    pub fn leaf(&mut self, op: Op, shape: Shape, dtype: DType) -> Result<NodeId, IrError> {
        if matches!(op, Op::Input) {
            return Ok(self.input(shape, dtype));
        }
        op.check_leaf(dtype)?;
        shape.check_size(op.name(), dtype)?;
        let id = self.graph.add_node(Node { op, shape, dtype, origin: None, label: None });
        self.arg_lists.push(Vec::new());
        Ok(id)
    }

    /// Adds an op over existing nodes, inferring its shape and dtype.
    pub fn push(&mut self, op: Op, inputs: &[NodeId]) -> Result<NodeId, IrError> {
        let mut typed = Vec::with_capacity(inputs.len());
        for &i in inputs {
            let n = self
                .graph
                .node_weight(i)
                .ok_or_else(|| IrError::InvalidGraph(format!("no node {i:?}")))?;
            typed.push((&n.shape, n.dtype));
        }
        let (shape, dtype) = op.infer(&typed)?;
        shape.check_size(op.name(), dtype)?;
        let id = self.graph.add_node(Node { op, shape, dtype, origin: None, label: None });
        for (slot, &i) in inputs.iter().enumerate() {
            self.graph.add_edge(i, id, slot);
        }
        self.arg_lists.push(inputs.to_vec());
        Ok(id)
    }

    /// Records where node `id` was created in user code.
    pub fn set_origin(&mut self, id: NodeId, origin: &'static Location<'static>) {
        if let Some(n) = self.graph.node_weight_mut(id) {
            n.origin = Some(origin);
        }
    }

    /// Labels node `id` as part of a user-defined op.
    pub fn set_label(&mut self, id: NodeId, label: Option<Label>) {
        if let Some(n) = self.graph.node_weight_mut(id) {
            n.label = label;
        }
    }

    /// Gives node `id` the origin and label of `from` (a node of another graph it replaces,
    /// as a pass rebuilds a graph).
    pub fn copy_provenance(&mut self, id: NodeId, from: &Node) {
        if let Some(n) = self.graph.node_weight_mut(id) {
            n.origin = from.origin.or(n.origin);
            n.label = from.label.or(n.label);
        }
    }

    /// Marks a node as a result the caller wants back.
    pub fn mark_output(&mut self, id: NodeId) {
        if !self.outputs.contains(&id) {
            self.outputs.push(id);
        }
    }

    /// The node behind `id`.
    ///
    /// # Panics
    /// If `id` is not a node of this graph.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.graph[id]
    }

    /// Replaces the op of a leaf with another of the same kind, shape and dtype: a new value
    /// for a `Full`, a new key for a `Random`. Plans built from the graph bind these per run.
    ///
    /// # Panics
    /// If `id` is not a `Full` or `Random` node, or `op` is of another kind.
    pub fn rebind_leaf(&mut self, id: NodeId, op: Op) {
        let node = &mut self.graph[id];
        let same_kind = matches!(
            (&node.op, &op),
            (Op::Full(a), Op::Full(b)) if a.category() == b.category()
        ) || matches!((&node.op, &op), (Op::Random { dist: a, .. }, Op::Random { dist: b, .. }) if a == b);
        assert!(same_kind, "rebind_leaf: {} cannot become {}", node.op, op);
        node.op = op;
    }

    /// The inputs of `id`, in argument order.
    pub fn args(&self, id: NodeId) -> Vec<NodeId> {
        self.arg_slice(id).to_vec()
    }

    /// The inputs of `id`, in argument order, without a copy.
    pub fn arg_slice(&self, id: NodeId) -> &[NodeId] {
        &self.arg_lists[id.index()]
    }

    /// The number of consumers of `id` (one per argument slot it fills).
    pub fn uses(&self, id: NodeId) -> usize {
        self.graph.edges_directed(id, Direction::Outgoing).count()
    }

    /// The `Input` nodes, in binding order.
    pub fn inputs(&self) -> &[NodeId] {
        &self.inputs
    }

    /// The nodes marked as outputs, in marking order.
    pub fn outputs(&self) -> &[NodeId] {
        &self.outputs
    }

    /// The number of nodes.
    pub fn len(&self) -> usize {
        self.graph.node_count()
    }

    /// Whether the graph has no nodes.
    pub fn is_empty(&self) -> bool {
        self.graph.node_count() == 0
    }

    /// The nodes in an order where every input comes before its consumers: insertion order,
    /// which is deterministic.
    pub fn topo_order(&self) -> Vec<NodeId> {
        // Nodes are only ever added over existing nodes and never removed, so insertion
        // order is topological.
        self.graph.node_indices().collect()
    }

    /// Checks the graph's invariants: no cycles, every op's inputs agree with its inferred
    /// shape and dtype, and every output exists.
    pub fn verify(&self) -> Result<(), IrError> {
        let order = self.topo_order();
        if order.len() != self.len() {
            return Err(IrError::InvalidGraph("the graph has a cycle".into()));
        }
        for id in order {
            let node = &self.graph[id];
            if node.op.is_leaf() {
                continue;
            }
            let args = self.args(id);
            let typed: Vec<_> =
                args.iter().map(|&a| (&self.graph[a].shape, self.graph[a].dtype)).collect();
            let (shape, dtype) = node.op.infer(&typed)?;
            if shape != node.shape || dtype != node.dtype {
                return Err(IrError::InvalidGraph(format!(
                    "node {} ({}) says {} {} but its inputs give {shape} {dtype}",
                    id.index(),
                    node.op,
                    node.shape,
                    node.dtype
                )));
            }
        }
        if let Some(o) = self.outputs.iter().find(|o| !self.graph.contains_node(**o)) {
            return Err(IrError::InvalidGraph(format!("output {} is not a node", o.index())));
        }
        Ok(())
    }

    /// The graph in Graphviz DOT (through petgraph's `Dot`): one box per node with its
    /// index, op, shape and dtype; outputs drawn bold; edges labelled with the argument
    /// position when an op has several.
    pub fn to_dot(&self) -> String {
        use petgraph::dot::{Config, Dot};
        let node_attrs = |_, (id, n): (NodeId, &Node)| {
            let style = if self.outputs.contains(&id) { ", style=bold" } else { "" };
            let label = format!("%{} = {}\\n{} {}", id.index(), n.op, n.shape, n.dtype)
                .replace('"', "\\\"");
            format!("label=\"{label}\", shape=box{style}")
        };
        let edge_attrs = |_, e: petgraph::stable_graph::EdgeReference<'_, usize>| {
            if self.graph.edges_directed(e.target(), Direction::Incoming).count() > 1 {
                format!("label=\"{}\"", e.weight())
            } else {
                String::new()
            }
        };
        let dot = Dot::with_attr_getters(
            &self.graph,
            &[Config::NodeNoLabel, Config::EdgeNoLabel],
            &edge_attrs,
            &node_attrs,
        );
        format!("{dot:?}")
    }

    /// Each node's number in [`Graph::topo_order`]: how the text form names nodes, so that
    /// the text does not depend on how a pass allocated its node ids.
    pub fn numbering(&self) -> HashMap<NodeId, usize> {
        self.topo_order().into_iter().enumerate().map(|(i, n)| (n, i)).collect()
    }
}

/// The graph as text, one node a line in topological order (`%2 = exp(%1) : [4, 5] f32`),
/// outputs marked: what `KILN_DEBUG=passes` prints after each pass.
impl std::fmt::Display for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names = self.numbering();
        for n in self.topo_order() {
            let node = self.node(n);
            let args: Vec<String> =
                self.arg_slice(n).iter().map(|a| format!("%{}", names[a])).collect();
            let args =
                if args.is_empty() { String::new() } else { format!("({})", args.join(", ")) };
            let out = if self.outputs.contains(&n) { "  (output)" } else { "" };
            writeln!(f, "%{} = {}{args} : {} {}{out}", names[&n], node.op, node.shape, node.dtype)?;
        }
        Ok(())
    }
}
