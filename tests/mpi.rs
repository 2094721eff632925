#![allow(unreachable_pub, reason = "the checks are shared with the local tests")]
//! The collective and data-parallel checks of `tests/collectives.rs` over MPI: run this
//! binary under `mpirun` (scripts/test-mpi starts it on 1, 2 and 3 ranks), with
//! `--test-threads=1` so that every rank runs the tests, and so the collectives, in the
//! same order.
#![cfg(feature = "mpi")]

use std::sync::OnceLock;

use kiln::Tensor;
use kiln::distributed::{self, Backend, ProcessGroup, ReduceOp};
use kiln::nn::DdpOptions;
use kiln_ir::testing::skip;

#[path = "collectives.rs"]
mod collectives;

fn group() -> &'static ProcessGroup {
    static GROUP: OnceLock<ProcessGroup> = OnceLock::new();
    GROUP.get_or_init(|| distributed::init(Backend::Mpi))
}

#[test]
fn the_group_is_mpis_world() {
    let g = group();
    assert_eq!(g.backend(), Backend::Mpi);
    if let Some(launch) = distributed::LaunchInfo::from_env() {
        assert_eq!((g.rank(), g.world_size()), (launch.rank, launch.world));
    }
    eprintln!("rank {} of {} (local rank {})", g.rank(), g.world_size(), g.local_rank());
    g.barrier().expect("a barrier");
}

#[test]
fn collectives_agree_with_the_reference() {
    collectives::collectives_agree_with_the_reference(group());
}

#[test]
fn collectives_fuse_with_their_neighbours() {
    collectives::collectives_fuse_with_their_neighbours(group());
}

#[test]
fn collective_gradients_are_the_adjoint_collectives() {
    collectives::collective_gradients_are_the_adjoint_collectives(group());
}

#[test]
fn compiled_steps_replay_collectives() {
    collectives::compiled_steps_replay_collectives(group());
}

#[test]
fn ddp_matches_one_process_on_the_global_batch() {
    if 12 % group().world_size() != 0 {
        let why = format!("12 examples do not split over {} ranks", group().world_size());
        skip("ddp_matches_one_process_on_the_global_batch", &why, &[]);
        return;
    }
    collectives::ddp_matches_one_process_on_the_global_batch(group(), DdpOptions::default());
    let small = DdpOptions { bucket_cap_mb: 1e-6, ..DdpOptions::default() };
    collectives::ddp_matches_one_process_on_the_global_batch(group(), small);
    collectives::no_sync_accumulates_then_reduces(group());
}

#[test]
fn large_tensors_cross_in_one_call() {
    // 3 million elements: beyond any eager-protocol threshold, so MPI uses its large-message path.
    let g = group();
    let x = Tensor::full([3_000_000], g.rank() as f64 + 1.0);
    let total = g.all_reduce(&x, ReduceOp::Sum).sum().item::<f64>();
    let world = g.world_size() as f64;
    assert_eq!(total, 3_000_000.0 * world * (world + 1.0) / 2.0);
}
