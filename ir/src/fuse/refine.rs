//! The partition stage's refinements ([`REFINEMENTS`]): named steps over one context, each
//! changing which values are stored or who writes them.

use super::*;

/// What the partition's refinements work on: the graph, and the partition so far with each
/// stored value's size in ops.
pub(super) struct Refining<'g> {
    pub(super) graph: &'g Graph,
    pub(super) options: &'g PlanOptions,
    pub(super) order: Vec<NodeId>,
    pub(super) consumers: HashMap<NodeId, Vec<NodeId>>,
    pub(super) partition: Partition,
    pub(super) size: HashMap<NodeId, usize>,
}

/// One named step of the partition stage.
pub struct Refinement {
    /// The name `KILN_DEBUG=passes` and the stage snapshots show (`partition.<name>`).
    pub name: &'static str,
    /// Whether it runs under the plan's options.
    pub(super) applies: fn(&PlanOptions) -> bool,
    pub(super) run: fn(&mut Refining<'_>),
}

fn fused(options: &PlanOptions) -> bool {
    options.fusion == Fusion::Fused
}

/// The partition stage's refinements, in order: the cuts every plan makes (a value feeding a
/// reduction, a library op or a view read, a result that is kept, a kernel grown too
/// large), then, in fused plans: shared values that cost too much to recompute are stored
/// once; a kept result is written by the kernel that consumes it; on targets whose
/// reductions store their inputs, a stored value is written by the reduction over it; a
/// cast of a stored value is written by its producer; a value several kernels read is
/// written by the first elementwise kernel that reads it.
pub const REFINEMENTS: [Refinement; 6] = [
    Refinement {
        name: "partition.cuts",
        applies: |_| true,
        run: |cx| {
            let (stored, size) = cuts(cx.graph, &cx.order, &cx.consumers, cx.options);
            (cx.partition.stored, cx.size) = (stored, size);
        },
    },
    Refinement {
        name: "partition.shared_values",
        applies: fused,
        run: |cx| {
            let (stored, size) = (&mut cx.partition.stored, &mut cx.size);
            compute_shared_values_once(cx.graph, &cx.order, &cx.consumers, stored, size);
        },
    },
    Refinement {
        name: "partition.kept_results",
        applies: fused,
        run: |cx| {
            let p = &cx.partition;
            cx.partition.merged =
                merge_kept_results(cx.graph, &cx.order, &p.stored, &cx.size, &cx.consumers);
        },
    },
    Refinement {
        name: "partition.into_reductions",
        applies: |o| fused(o) && o.target.reductions_store_inputs,
        run: |cx| {
            let p = &cx.partition;
            cx.partition.reduced_by = merge_into_reductions(
                cx.graph,
                &cx.order,
                &p.stored,
                &p.merged,
                &cx.size,
                &cx.consumers,
            );
        },
    },
    Refinement {
        name: "partition.casts_into_producers",
        applies: fused,
        run: |cx| {
            let p = &mut cx.partition;
            let (stored, reduced_by) = (&p.stored, &p.reduced_by);
            merge_casts_into_producers(
                cx.graph,
                &cx.order,
                stored,
                reduced_by,
                &cx.size,
                &mut p.merged,
            );
        },
    },
    Refinement {
        name: "partition.shared_into_consumers",
        applies: fused,
        run: |cx| {
            let p = &mut cx.partition;
            let (stored, reduced_by) = (&p.stored, &p.reduced_by);
            let size = &mut cx.size;
            merge_shared_into_consumers(
                cx.graph,
                &cx.order,
                stored,
                reduced_by,
                size,
                &cx.consumers,
                &mut p.merged,
            );
        },
    },
];

/// Kept results ([`Cut::Output`]) that are written by the kernel consuming them instead of by
/// a kernel of their own, mapped to that kernel's root.
///
/// A tensor the user still holds (often only a temporary of the statement that realizes,
/// `((a * b + c).relu() - a).realize()`) must be stored, but storing it in its own kernel
/// costs a write and a read back of the value. When every op that consumes it is elementwise
/// and all of them end in one elementwise kernel, that kernel computes it inline and writes
/// it as a second output: one pass over the inputs instead of two. Merges follow chains (a
/// kept value consumed by another kept value) and respect [`MAX_KERNEL_OPS`].
fn merge_kept_results(
    graph: &Graph,
    order: &[NodeId],
    stored: &HashMap<NodeId, Cut>,
    size: &HashMap<NodeId, usize>,
    consumers: &HashMap<NodeId, Vec<NodeId>>,
) -> HashMap<NodeId, NodeId> {
    let consumers_of = |n: NodeId| consumers.get(&n).map_or(&[][..], Vec::as_slice);
    // The root of the one elementwise kernel an unstored elementwise value is computed in,
    // if there is exactly one (values shared by several kernels are recomputed in each).
    let mut root_of: HashMap<NodeId, Option<NodeId>> = HashMap::default();
    let mut merged: HashMap<NodeId, NodeId> = HashMap::default();
    // The ops each kernel root holds, growing as results merge into it.
    let mut ops: HashMap<NodeId, usize> = HashMap::default();
    for &n in order.iter().rev() {
        let op = &graph.node(n).op;
        if !op.is_elementwise() {
            continue;
        }
        let root = single_root(consumers_of(n), |c| {
            if !graph.node(c).op.is_elementwise() {
                None
            } else if stored.contains_key(&c) {
                Some(merged.get(&c).copied().unwrap_or(c))
            } else {
                root_of.get(&c).copied().flatten()
            }
        });
        match stored.get(&n) {
            None => {
                root_of.insert(n, root);
            }
            Some(Cut::Output) => {
                if let Some(r) = root {
                    let held = *ops.entry(r).or_insert_with(|| size.get(&r).copied().unwrap_or(0));
                    let own = size.get(&n).copied().unwrap_or(0);
                    if held + own <= MAX_KERNEL_OPS {
                        ops.insert(r, held + own);
                        merged.insert(n, r);
                    }
                }
            }
            Some(_) => {}
        }
    }
    merged
}

/// Shared values ([`Cut::Shared`]) whose consumers all end in one kernel are computed once in
/// that kernel instead of stored: the store exists to avoid recomputing a costly value in
/// several kernels, and within one kernel a value is computed once however many ops read it.
/// (A gradient such as GELU's reads one costly product twice; storing it cost a write and a
/// read back of the whole tensor.) Runs from the last value back, so each value's consumers
/// already know their kernel; respects [`MAX_KERNEL_OPS`].
fn compute_shared_values_once(
    graph: &Graph,
    order: &[NodeId],
    consumers: &HashMap<NodeId, Vec<NodeId>>,
    stored: &mut HashMap<NodeId, Cut>,
    size: &mut HashMap<NodeId, usize>,
) {
    // The root of the one kernel each unstored elementwise value is computed in, if one.
    let mut root_of: HashMap<NodeId, Option<NodeId>> = HashMap::default();
    for &n in order.iter().rev() {
        let op = &graph.node(n).op;
        if !op.is_elementwise() {
            continue;
        }
        let cons = consumers.get(&n).map_or(&[][..], Vec::as_slice);
        let root = single_root(cons, |c| {
            let cop = &graph.node(c).op;
            if stored.contains_key(&c) || cop.is_kernel_reduce() {
                Some(c)
            } else if cop.is_elementwise() {
                root_of.get(&c).copied().flatten()
            } else {
                None
            }
        });
        match (stored.get(&n), root) {
            (None, _) => {
                root_of.insert(n, root);
            }
            (Some(Cut::Shared), Some(r)) => {
                let (own, held) =
                    (size.get(&n).copied().unwrap_or(0), size.get(&r).copied().unwrap_or(0));
                if own + held <= MAX_KERNEL_OPS {
                    stored.remove(&n);
                    size.insert(r, own + held);
                    root_of.insert(n, Some(r));
                }
            }
            _ => {}
        }
    }
}

/// The root of the one kernel all of `consumers` end in, given the root each one ends in
/// (`None` for a consumer outside any kernel); `None` when they end in several, or there
/// are none.
fn single_root(consumers: &[NodeId], root: impl Fn(NodeId) -> Option<NodeId>) -> Option<NodeId> {
    let mut roots = consumers.iter().map(|&c| root(c));
    let first = roots.next()??;
    roots.all(|r| r == Some(first)).then_some(first)
}

/// Stored casts of stored values, written by the kernel of the value they cast as a second
/// output: added to `merged` (cast -> that kernel's root).
///
/// Under autocast a value computed in f32 is often needed in 16 bits too: the gradient
/// entering a `Linear` is summed for the bias in f32 and cast for the weight's product. When
/// the value is stored by its own kernel, a kernel of just the cast would read it all back;
/// the value's kernel writes the cast beside it instead. The value must be written by an
/// elementwise kernel of its own (not merged into another, nor written by a reduction).
fn merge_casts_into_producers(
    graph: &Graph,
    order: &[NodeId],
    stored: &HashMap<NodeId, Cut>,
    reduced_by: &HashMap<NodeId, NodeId>,
    size: &HashMap<NodeId, usize>,
    merged: &mut HashMap<NodeId, NodeId>,
) {
    let mut ops: HashMap<NodeId, usize> = HashMap::default();
    for &c in order {
        if !matches!(graph.node(c).op, Op::Cast(_))
            || !stored.contains_key(&c)
            || merged.contains_key(&c)
            || reduced_by.contains_key(&c)
        {
            continue;
        }
        let x = graph.arg_slice(c)[0];
        let producer = graph.node(x);
        if !producer.op.is_elementwise()
            || !stored.contains_key(&x)
            || merged.contains_key(&x)
            || reduced_by.contains_key(&x)
        {
            continue;
        }
        let held = *ops.entry(x).or_insert_with(|| size.get(&x).copied().unwrap_or(0));
        if held < MAX_KERNEL_OPS {
            ops.insert(x, held + 1);
            merged.insert(c, x);
        }
    }
}

/// Stored values written by the reduction that consumes them, mapped to that reduction.
///
/// On a CPU a shared transcendental is stored rather than recomputed (row softmax's
/// `exp(x - max)`, read by its row sum and by the division). Stored by a kernel of its own,
/// it costs a pass that writes it and another that reads it back for the sum; when the sum
/// reduces exactly that value over trailing dimensions, the reduction kernel computes it,
/// sums it and writes it in one pass: row softmax then takes three passes (the max, the
/// exponential with its sum, the division) instead of four. The value's other consumers must
/// come after the reduction (they read what it wrote), and it must be an `f32` or `f64`
/// value (what the reduction's vector loop stores). Kept results the value's kernel would
/// have written move with it into the reduction's kernel.
fn merge_into_reductions(
    graph: &Graph,
    order: &[NodeId],
    stored: &HashMap<NodeId, Cut>,
    merged: &HashMap<NodeId, NodeId>,
    size: &HashMap<NodeId, usize>,
    consumers: &HashMap<NodeId, Vec<NodeId>>,
) -> HashMap<NodeId, NodeId> {
    let position: HashMap<NodeId, usize> = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let mut out = HashMap::default();
    let mut taken: HashMap<NodeId, ()> = HashMap::default();
    for &n in order {
        let node = graph.node(n);
        if !matches!(stored.get(&n), Some(Cut::Shared))
            || merged.contains_key(&n)
            || !node.op.is_elementwise()
            || !matches!(node.dtype, crate::DType::F32 | crate::DType::F64)
            || size.get(&n).copied().unwrap_or(0) >= MAX_KERNEL_OPS
        {
            continue;
        }
        let cons = consumers.get(&n).map_or(&[][..], Vec::as_slice);
        let rank = node.shape.rank();
        let reduction = cons.iter().copied().find(|&c| match &graph.node(c).op {
            op @ Op::Reduce { axes, .. } => {
                op.is_kernel_reduce()
                    && !taken.contains_key(&c)
                    && axes.iter().enumerate().all(|(i, &a)| a == rank - axes.len() + i)
            }
            _ => false,
        });
        let Some(r) = reduction else { continue };
        if cons.iter().all(|&c| c == r || position[&c] > position[&r]) {
            taken.insert(r, ());
            out.insert(n, r);
        }
    }
    out
}

/// Stored values that several kernels read ([`Cut::Shared`], or kept results
/// [`merge_kept_results`] could not place), written as one more output by the first
/// elementwise kernel that reads them instead of by a kernel of their own: added to `merged`
/// (value -> that kernel's root).
///
/// A training step's forward values are read by the next forward op and again by the
/// backward: an LSTM step's four gates, its cell state and `tanh` of it were each a kernel
/// (seven per step) that wrote the value for the backward and for the one forward kernel that
/// read it back. Computed inline in that forward kernel and written from there, the step is
/// one kernel. The value's other readers must all come after the kernel (they read what it
/// wrote, and none of them may feed it), the kernel must be elementwise and not written by
/// a reduction, and [`MAX_KERNEL_OPS`] holds. Values already merged into this one move with
/// it.
fn merge_shared_into_consumers(
    graph: &Graph,
    order: &[NodeId],
    stored: &HashMap<NodeId, Cut>,
    reduced_by: &HashMap<NodeId, NodeId>,
    size: &mut HashMap<NodeId, usize>,
    consumers: &HashMap<NodeId, Vec<NodeId>>,
    merged: &mut HashMap<NodeId, NodeId>,
) {
    let position: HashMap<NodeId, usize> = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let written: HashMap<NodeId, ()> = reduced_by.values().map(|&r| (r, ())).collect();
    // The values each kernel root writes besides its own (kept current as merges move them).
    let mut riding: HashMap<NodeId, Vec<NodeId>> = HashMap::default();
    for (&v, &root) in merged.iter() {
        riding.entry(root).or_default().push(v);
    }
    // The root of the one elementwise kernel an unstored elementwise value ends in, if one.
    let mut root_of: HashMap<NodeId, Option<NodeId>> = HashMap::default();
    for &n in order.iter().rev() {
        let node = graph.node(n);
        if !node.op.is_elementwise() {
            continue;
        }
        let cons = consumers.get(&n).map_or(&[][..], Vec::as_slice);
        // The kernel each consumer ends in (`None`: not one elementwise kernel).
        let kernel_of = |c: NodeId, merged: &HashMap<NodeId, NodeId>| {
            let op = &graph.node(c).op;
            if !op.is_elementwise() {
                None
            } else if stored.contains_key(&c) {
                Some(merged.get(&c).copied().unwrap_or(c))
            } else {
                root_of.get(&c).copied().flatten()
            }
        };
        if !stored.contains_key(&n) {
            root_of.insert(n, single_root(cons, |c| kernel_of(c, merged)));
            continue;
        }
        let mergeable = matches!(stored.get(&n), Some(Cut::Shared | Cut::Output))
            && !merged.contains_key(&n)
            && !reduced_by.contains_key(&n)
            && !written.contains_key(&n);
        if !mergeable {
            continue;
        }
        let first = cons
            .iter()
            .filter_map(|&c| kernel_of(c, merged))
            .filter(|&r| {
                // (A value this one's own kernel writes reads it there, not elsewhere.)
                r != n
                    && stored.contains_key(&r)
                    && !reduced_by.contains_key(&r)
                    && !written.contains_key(&r)
            })
            .min_by_key(|r| position[r]);
        let Some(r) = first else { continue };
        // What this kernel writes already moves with it: its readers too must come after.
        let riders = riding.get(&n).map_or(&[][..], Vec::as_slice);
        let after = std::iter::once(n).chain(riders.iter().copied()).all(|v| {
            let cons = consumers.get(&v).map_or(&[][..], Vec::as_slice);
            cons.iter().all(|&c| kernel_of(c, merged) == Some(r) || position[&c] > position[&r])
        });
        let (own, held) = (size.get(&n).copied().unwrap_or(0), size.get(&r).copied().unwrap_or(0));
        if !after || own + held > MAX_KERNEL_OPS {
            continue;
        }
        size.insert(r, own + held);
        let mut moved = riding.remove(&n).unwrap_or_default();
        for &v in &moved {
            merged.insert(v, r);
        }
        moved.push(n);
        riding.entry(r).or_default().extend(moved);
        merged.insert(n, r);
    }
}
