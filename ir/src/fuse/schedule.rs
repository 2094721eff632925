//! Step order for communication: a collective, and the steps that exist only to feed it,
//! run as soon as their inputs are ready, so that the executor can hand it to the group's
//! engine and run the later steps while it communicates (a gradient all-reduce of the last
//! layers overlaps the backward of the first ones).

use rustc_hash::FxHashMap as HashMap;

use super::Step;
use crate::{Graph, NodeId, Op};

/// `steps` (in dependency order) reordered so that every collective, with the steps whose
/// only readers are collectives or such steps, comes right after the last step it depends
/// on. Every other step keeps its relative order, and the result is still in dependency
/// order: a moved step only moves earlier, never before what it reads.
pub(super) fn collectives_early(graph: &Graph, steps: Vec<Step>) -> Vec<Step> {
    let is_collective =
        |s: &Step| matches!(s, Step::Node(n) if matches!(graph.node(*n).op, Op::Collective(_)));
    if !steps.iter().any(is_collective) {
        return steps;
    }
    let mut producer: HashMap<NodeId, usize> = HashMap::default();
    let mut deps: Vec<Vec<usize>> = Vec::with_capacity(steps.len());
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); steps.len()];
    for (i, step) in steps.iter().enumerate() {
        let (reads, writes) = (step.reads(graph), step.writes());
        let mut d: Vec<usize> = reads.iter().filter_map(|n| producer.get(n).copied()).collect();
        d.sort_unstable();
        d.dedup();
        for &p in &d {
            readers[p].push(i);
        }
        deps.push(d);
        producer.extend(writes.into_iter().map(|n| (n, i)));
    }
    // Readers come later: one backward sweep decides what moves.
    let mut early = vec![false; steps.len()];
    for i in (0..steps.len()).rev() {
        early[i] = is_collective(&steps[i])
            || (!readers[i].is_empty() && readers[i].iter().all(|&r| early[r]));
    }
    // A step that stays keeps its index as its place; a moved one goes right after its last
    // dependency's place (behind the step there, in original order among the moved).
    let mut place: Vec<i64> = Vec::with_capacity(steps.len());
    for i in 0..steps.len() {
        let own = i64::try_from(i).unwrap_or(i64::MAX);
        place.push(if early[i] {
            deps[i].iter().map(|&d| place[d]).max().unwrap_or(-1)
        } else {
            own
        });
    }
    let mut order: Vec<usize> = (0..steps.len()).collect();
    order.sort_by_key(|&i| (place[i], early[i], i));
    let mut slots: Vec<Option<Step>> = steps.into_iter().map(Some).collect();
    order.into_iter().filter_map(|i| slots[i].take()).collect()
}
