//! Process groups, collectives and data-parallel training on ranks that are threads of this
//! process (`ProcessGroup::local`); the same checks run over MPI in `tests/mpi.rs`.

use kiln::distributed::{self, Backend, DistributedSampler, LaunchInfo, ProcessGroup, ReduceOp};
use kiln::nn::{DdpOptions, DistributedDataParallel, Linear, Module};
use kiln::{DType, Tensor};
use kiln_ir::testing::skip;

#[path = "collectives.rs"]
mod collectives;

/// Runs `check` on every rank of a local group of `world`, each on its own thread.
fn on_ranks(world: usize, check: impl Fn(&ProcessGroup) + Send + Sync + Copy + 'static) {
    let ranks: Vec<_> = ProcessGroup::local(world)
        .into_iter()
        .map(|g| std::thread::spawn(move || check(&g)))
        .collect();
    for (rank, r) in ranks.into_iter().enumerate() {
        if let Err(e) = r.join() {
            std::panic::resume_unwind(Box::new(format!("rank {rank} of {world} failed: {e:?}")));
        }
    }
}

#[test]
fn collectives_agree_with_the_reference_on_1_2_and_3_ranks() {
    for world in [1, 2, 3] {
        on_ranks(world, collectives::collectives_agree_with_the_reference);
    }
}

#[test]
fn collectives_fuse_differentiate_and_compile() {
    for world in [1, 3] {
        on_ranks(world, collectives::collectives_fuse_with_their_neighbours);
        on_ranks(world, collectives::collective_gradients_are_the_adjoint_collectives);
        on_ranks(world, collectives::compiled_steps_replay_collectives);
    }
}

#[test]
fn data_parallel_training_matches_one_process() {
    for world in [1, 2, 3, 4] {
        on_ranks(world, |g| {
            collectives::ddp_matches_one_process_on_the_global_batch(g, DdpOptions::default());
        });
    }
    // Small buckets: one per parameter, reduced as each completes.
    on_ranks(2, |g| {
        let options = DdpOptions { bucket_cap_mb: 1e-6, ..DdpOptions::default() };
        collectives::ddp_matches_one_process_on_the_global_batch(g, options);
    });
    on_ranks(2, collectives::no_sync_accumulates_then_reduces);
}

#[test]
fn a_collective_is_a_step_of_its_own_in_the_plan() {
    let g = ProcessGroup::single();
    let x = Tensor::ones([4]);
    let y = g.all_reduce(&(&x * 2.0 + 1.0), ReduceOp::Sum).exp();
    let stages = kiln::debug::passes(&[&y]);
    let lower = &stages.last().expect("the lower stage").1;
    assert!(lower.contains("all_reduce"), "{lower}");
    let partition = &stages[stages.len() - 2].1;
    assert!(partition.contains("all_reduce"), "the collective's result is stored: {partition}");
    assert_eq!(y.to_vec::<f32>(), vec![3f32.exp(); 4]);
}

#[test]
fn buckets_follow_reverse_parameter_order_and_the_cap() {
    let g = ProcessGroup::single();
    let model = kiln::nn::Sequential::new().with(Linear::new(4, 3)).with(Linear::new(3, 2));
    let ddp = DistributedDataParallel::new(model, &g);
    assert_eq!(ddp.bucket_names(), vec![vec!["1.bias", "1.weight", "0.bias", "0.weight"]]);
    let model = kiln::nn::Sequential::new().with(Linear::new(4, 3)).with(Linear::new(3, 2));
    // 40 bytes: the [2, 3] weight (24 bytes) and the [2] bias fit, the [3, 4] weight not.
    let options = DdpOptions { bucket_cap_mb: 40.0 / (1024.0 * 1024.0), ..DdpOptions::default() };
    let ddp = DistributedDataParallel::try_new(model, &g, options).expect("wraps");
    assert_eq!(
        ddp.bucket_names(),
        vec![vec!["1.bias", "1.weight"], vec!["0.bias"], vec!["0.weight"]]
    );
    // A small first bucket (the one backward completes first), larger ones after it.
    let model = kiln::nn::Sequential::new().with(Linear::new(4, 3)).with(Linear::new(3, 2));
    let options = DdpOptions { first_bucket_cap_mb: 8.0 / (1024.0 * 1024.0), ..options };
    let options = DdpOptions { bucket_cap_mb: 1.0, ..options };
    let ddp = DistributedDataParallel::try_new(model, &g, options).expect("wraps");
    assert_eq!(ddp.bucket_names(), vec![vec!["1.bias"], vec!["1.weight", "0.bias", "0.weight"]]);
    let bad = DdpOptions { first_bucket_cap_mb: 0.0, ..options };
    let model = kiln::nn::Sequential::new().with(Linear::new(4, 3));
    let err = DistributedDataParallel::try_new(model, &g, bad).err().expect("a zero cap");
    assert!(err.to_string().contains("first_bucket_cap_mb"), "{err}");
}

/// A model whose second layer is used only when asked.
struct Branchy {
    a: Linear,
    b: Linear,
    use_b: bool,
}
kiln::parameters!(Branchy { a, b });

impl Module for Branchy {
    fn try_forward(&self, x: &Tensor) -> kiln::Result<Tensor> {
        let h = self.a.try_forward(x)?;
        if self.use_b { self.b.try_forward(&h) } else { Ok(h) }
    }
}

#[test]
fn unused_parameters_are_an_error_unless_looked_for() {
    let g = ProcessGroup::single();
    let model = Branchy { a: Linear::new(3, 3), b: Linear::new(3, 3), use_b: false };
    let ddp = DistributedDataParallel::try_new(
        model,
        &g,
        DdpOptions { bucket_cap_mb: 1.0, ..DdpOptions::default() },
    )
    .expect("wraps");
    ddp.forward(&Tensor::ones([2, 3])).sum().backward();
    let err = ddp.try_forward(&Tensor::ones([2, 3])).unwrap_err().to_string();
    assert!(err.contains("b.weight") && err.contains("find_unused_parameters"), "{err}");

    let model = Branchy { a: Linear::new(3, 3), b: Linear::new(3, 3), use_b: false };
    let options = DdpOptions { find_unused_parameters: true, ..DdpOptions::default() };
    let ddp = DistributedDataParallel::try_new(model, &g, options).expect("wraps");
    for _ in 0..2 {
        ddp.forward(&Tensor::ones([2, 3])).sum().backward();
    }
    let grad_b = ddp.module().b.weight.grad().expect("zeros from the reduction");
    assert_eq!(grad_b.to_vec::<f32>(), vec![0.0; 9]);
    let grad_a = ddp.module().a.bias.as_ref().expect("a bias").grad().expect("a gradient");
    assert_eq!(grad_a.to_vec::<f32>(), vec![4.0; 3]);
}

#[test]
fn collective_misuse_is_reported_with_the_fix() {
    let g = ProcessGroup::local(2).pop().expect("two ranks");
    let ints = Tensor::from_vec(vec![1i64, 2, 3], [3]);
    let err = g.try_all_reduce(&ints, ReduceOp::Mean).unwrap_err().to_string();
    assert!(err.contains("mean over ranks needs a float tensor"), "{err}");
    let err = g.try_reduce_scatter(&Tensor::ones([3]), ReduceOp::Sum).unwrap_err().to_string();
    assert!(err.contains("split evenly over the group's 2 ranks"), "{err}");
    let err = g.try_broadcast(&Tensor::ones([3]), 2).unwrap_err().to_string();
    assert!(err.contains("root rank 2 is not in a group of 2 ranks"), "{err}");
    let err = g.try_all_gather(&Tensor::scalar(1.0)).unwrap_err().to_string();
    assert!(err.contains("at least one dimension"), "{err}");
    let w = Tensor::ones([3]).requires_grad_(true);
    let err = g.try_broadcast(&w, 0).unwrap_err().to_string();
    assert!(err.contains("no gradient") && err.contains("detach"), "{err}");
    let err = g.try_all_reduce(&w, ReduceOp::Max).unwrap_err().to_string();
    assert!(err.contains("no gradient"), "{err}");
    assert!(g.try_broadcast(&w.detach(), 0).is_ok());
}

#[test]
fn engines_that_are_not_there_say_what_is_missing() {
    if kiln::cuda::is_available() {
        let test = "engines_that_are_not_there_say_what_is_missing";
        skip(test, "a CUDA device is present (the NCCL tests run instead)", &[]);
    } else {
        let err = distributed::try_init(Backend::Nccl).unwrap_err().to_string();
        assert!(err.contains("distributed::init") && err.contains("cuda:0"), "{err}");
    }
    #[cfg(not(feature = "mpi"))]
    {
        let err = distributed::try_init(Backend::Mpi).unwrap_err().to_string();
        assert!(err.contains("`mpi` feature") && err.contains("libopenmpi-dev"), "{err}");
    }
    let local = distributed::init(Backend::Local);
    assert_eq!((local.rank(), local.world_size(), local.device()), (0, 1, kiln::Device::Cpu));
}

#[test]
fn launchers_environment_gives_rank_world_and_local_rank() {
    fn env<'a>(pairs: &'a [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
    }
    let ompi = [
        ("OMPI_COMM_WORLD_RANK", "3"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
    ];
    assert_eq!(
        LaunchInfo::from_vars(env(&ompi)),
        Some(LaunchInfo { rank: 3, world: 4, local_rank: 1 })
    );
    let slurm = [("SLURM_PROCID", "5"), ("SLURM_NTASKS", "8"), ("SLURM_LOCALID", "2")];
    assert_eq!(
        LaunchInfo::from_vars(env(&slurm)),
        Some(LaunchInfo { rank: 5, world: 8, local_rank: 2 })
    );
    let torchrun = [("RANK", "0"), ("WORLD_SIZE", "2")];
    assert_eq!(
        LaunchInfo::from_vars(env(&torchrun)),
        Some(LaunchInfo { rank: 0, world: 2, local_rank: 0 })
    );
    assert_eq!(LaunchInfo::from_vars(env(&[("RANK", "2"), ("WORLD_SIZE", "2")])), None);
    assert_eq!(LaunchInfo::from_vars(env(&[])), None);
}

#[test]
fn distributed_sampler_splits_pads_and_reshuffles_like_pytorch() {
    for (len, world) in [(10, 3), (7, 2), (2, 4), (12, 4)] {
        let shares: Vec<Vec<usize>> = (0..world)
            .map(|r| DistributedSampler::new(r, world).shuffle(5).indices(len, 0))
            .collect();
        let per = len.div_ceil(world);
        assert!(shares.iter().all(|s| s.len() == per), "{len} over {world}: {shares:?}");
        let mut seen: Vec<usize> = shares.concat();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen, (0..len).collect::<Vec<_>>(), "every example is visited");
        let dropped = DistributedSampler::new(0, world).drop_last(true).indices(len, 0);
        assert_eq!(dropped.len(), len / world);
    }
    let s = DistributedSampler::new(1, 2).shuffle(9);
    assert_ne!(s.indices(100, 0), s.indices(100, 1), "a new order every epoch");
    assert_eq!(s.indices(100, 3), s.indices(100, 3), "the same order for the same epoch");

    let data =
        kiln::data::TensorDataset::new(vec![Tensor::arange(0.0, 10.0, 1.0)]).expect("one tensor");
    let rank1 = DistributedSampler::new(1, 3);
    let loader = kiln::data::DataLoader::new(&data, 2).sampler(rank1);
    assert_eq!(loader.len(), 2);
    let seen: Vec<f32> =
        loader.iter().flat_map(|b| b.expect("a batch")[0].to_vec::<f32>()).collect();
    assert_eq!(seen, vec![1.0, 4.0, 7.0, 0.0]);
    loader.set_epoch(0);
    assert_eq!(loader.next_order(), vec![1, 4, 7, 0]);
}

#[test]
fn post_accumulate_grad_hooks_see_the_gradient_and_can_be_removed() {
    let w = Tensor::ones([2]).requires_grad_(true);
    let handle = w.register_post_accumulate_grad_hook(|w| {
        w.set_grad(w.grad().map(|g| g * 10.0));
        Ok(())
    });
    (&w * 2.0).sum().backward();
    assert_eq!(w.grad().expect("grad").to_vec::<f32>(), vec![20.0; 2]);
    handle.remove();
    w.zero_grad();
    (&w * 2.0).sum().backward();
    assert_eq!(w.grad().expect("grad").to_vec::<f32>(), vec![2.0; 2]);
    let failing =
        w.register_post_accumulate_grad_hook(|_| Err(kiln::Error::Internal("hook said no".into())));
    let err = (&w * 2.0).sum().try_backward().unwrap_err().to_string();
    assert!(err.contains("hook said no"), "{err}");
    failing.remove();
    let _ = DType::F32;
}

#[test]
fn the_nccl_library_loads_and_answers_without_a_gpu() {
    // CI installs NCCL from the nvidia-nccl-cu13 wheel and sets KILN_REQUIRE_NCCL=1.
    match distributed::nccl_version() {
        Ok((major, minor, _)) => {
            assert!(
                major == 2 && minor >= 18,
                "NCCL {major}.{minor} is older than kiln's bindings"
            );
            let id = distributed::nccl_unique_id().expect("an id without a GPU");
            assert!(id.iter().any(|&b| b != 0), "the id holds the bootstrap address");
            assert_ne!(id, distributed::nccl_unique_id().expect("another id"), "ids are fresh");
        }
        Err(e) => skip(
            "the_nccl_library_loads_and_answers_without_a_gpu",
            &e.to_string(),
            &["KILN_REQUIRE_NCCL"],
        ),
    }
}

#[test]
fn an_nccl_world_of_one_runs_the_collective_checks() {
    if !kiln::cuda::is_available() || distributed::nccl_version().is_err() {
        // Where a device and NCCL are both required (a GPU run), their absence fails.
        skip(
            "an_nccl_world_of_one_runs_the_collective_checks",
            "the NCCL checks need a CUDA device and the NCCL library",
            &["KILN_REQUIRE_GPU", "KILN_REQUIRE_NCCL"],
        );
        return;
    }
    let g = distributed::init(Backend::Nccl);
    assert_eq!((g.world_size(), g.device()), (1, kiln::Device::Cuda(0)));
    collectives::collectives_agree_with_the_reference(&g);
    collectives::collectives_fuse_with_their_neighbours(&g);
    collectives::collective_gradients_are_the_adjoint_collectives(&g);
    collectives::compiled_steps_replay_collectives(&g);
    collectives::ddp_matches_one_process_on_the_global_batch(&g, DdpOptions::default());
    collectives::no_sync_accumulates_then_reduces(&g);
    g.barrier().expect("a barrier through NCCL");
}

/// A world of one whose collectives wait (up to a deadline) until `opens` has been set by
/// another group's collective, then set `sets`.
struct Gate {
    waits_for: Option<std::sync::Arc<Flag>>,
    sets: Option<std::sync::Arc<Flag>>,
    fail: bool,
}

#[derive(Default)]
struct Flag(std::sync::Mutex<bool>, std::sync::Condvar);

impl distributed::Communicator for Gate {
    fn rank(&self) -> usize {
        0
    }
    fn world(&self) -> usize {
        1
    }
    fn engine(&self) -> &'static str {
        "gate"
    }
    fn run(
        &self,
        _: distributed::CollectiveKind,
        _: DType,
        input: &[u8],
        output: &mut [u8],
    ) -> Result<(), String> {
        if let Some(flag) = &self.sets {
            *flag.0.lock().expect("no holder panicked") = true;
            flag.1.notify_all();
        }
        if let Some(flag) = &self.waits_for {
            let open = flag.0.lock().expect("no holder panicked");
            let (open, _) = flag
                .1
                .wait_timeout_while(open, std::time::Duration::from_secs(20), |o| !*o)
                .expect("no holder panicked");
            if !*open {
                return Err(
                    "the later collective never started: the plan waited for this one".into()
                );
            }
        }
        if self.fail {
            return Err("the link went down".into());
        }
        output.copy_from_slice(input);
        Ok(())
    }
    fn barrier(&self) -> Result<(), String> {
        Ok(())
    }
}

#[test]
fn a_collective_communicates_while_the_steps_after_it_run() {
    use std::sync::Arc;
    // The first collective can only finish once the second has started: a plan that waited
    // for each collective before going on would never get there.
    let flag = Arc::new(Flag::default());
    let first = ProcessGroup::from_communicator(Arc::new(Gate {
        waits_for: Some(flag.clone()),
        sets: None,
        fail: false,
    }));
    let second = ProcessGroup::from_communicator(Arc::new(Gate {
        waits_for: None,
        sets: Some(flag),
        fail: false,
    }));
    assert_eq!(first.backend(), Backend::Custom);
    let x = Tensor::randn([7, 5]);
    let a = first.all_reduce(&x, ReduceOp::Sum);
    let b = second.all_reduce(&(&x * 2.0), ReduceOp::Sum);
    let (out, profile) = kiln::profile(|| (&a + &b).to_vec::<f32>());
    for (o, x) in out.iter().zip(x.to_vec::<f32>()) {
        assert!((o - 3.0 * x).abs() < 1e-5, "{o} vs {}", 3.0 * x);
    }
    let collectives =
        profile.events().iter().filter(|e| e.kind == kiln::StepKind::Collective).count();
    assert_eq!(collectives, 2, "{profile}");

    // An engine's failure in flight is the realization's error, and the plan still waits
    // for the rest (the group's order stays intact).
    let broken =
        ProcessGroup::from_communicator(Arc::new(Gate { waits_for: None, sets: None, fail: true }));
    let err = broken.try_all_reduce(&x, ReduceOp::Mean).unwrap().try_to_vec::<f32>().unwrap_err();
    let text = err.to_string();
    assert!(text.contains("all_reduce") && text.contains("the link went down"), "{text}");
    assert!(text.contains("tests/distributed.rs"), "the user's line: {text}");
    assert!(distributed::try_init(Backend::Custom).is_err());
}
