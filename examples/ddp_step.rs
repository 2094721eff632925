//! The cost of a data-parallel training step, and how much of its communication overlaps
//! backward: an MLP of 2.6 M parameters (10.5 MB of gradients), 32 examples per rank, plain
//! SGD. It runs the step with DDP's default buckets (25 MiB, the first 1 MiB: the last
//! layers' all-reduce starts while the first layers' backward runs) and with one bucket
//! holding every gradient (nothing to overlap: the all-reduce can only start at the end),
//! and prints each one's median step time and, from a profile of one backward, the time
//! the plan waited for each all-reduce and the time it was hidden.
//!
//! ```text
//! cargo build --release --features mpi --example ddp_step
//! mpirun -np 2 target/release/examples/ddp_step
//! ```
//!
//! `--quick` times 3 steps instead of 30. Without a launcher it runs `KILN_RANKS` ranks (default 2) as threads of this process.
//! With `KILN_DDP_BACKEND=nccl` it runs through NCCL on CUDA device 0 instead (a world of
//! one without a launcher): the model and batch live on the GPU and each all-reduce runs on
//! NCCL's own stream, so the profile shows how much of it overlapped the rest of backward.

use std::time::Instant;

use kiln::distributed::{self, Backend, LaunchInfo, ProcessGroup};
use kiln::nn::{
    DdpOptions, DistributedDataParallel, Linear, Module, Parameters, ReLU, Sequential,
    functional as F,
};
use kiln::optim::{Optimizer, Sgd, SgdConfig};
use kiln::{StepKind, Tensor};

const WIDTH: usize = 1024;
/// Timed steps: 30, or 3 with `--quick` (CI runs it so on the emulated device).
fn steps() -> usize {
    if std::env::args().any(|a| a == "--quick") { 3 } else { 30 }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var("KILN_DDP_BACKEND").is_ok_and(|b| b.eq_ignore_ascii_case("nccl")) {
        let group = distributed::try_init(Backend::Nccl)?;
        println!("NCCL: a world of {} on {}", group.world_size(), group.device());
        return Ok(measure(&group)?);
    }
    if LaunchInfo::from_env().is_some() {
        return Ok(measure(&distributed::try_init(Backend::Mpi)?)?);
    }
    let world = std::env::var("KILN_RANKS").ok().and_then(|v| v.parse().ok()).unwrap_or(2);
    println!("no launcher found: {world} ranks as threads of this process");
    let ranks: Vec<_> = ProcessGroup::local(world)
        .into_iter()
        .map(|group| std::thread::spawn(move || measure(&group).map_err(|e| e.to_string())))
        .collect();
    for rank in ranks {
        rank.join().map_err(|_| "a rank panicked")??;
    }
    Ok(())
}

fn measure(group: &ProcessGroup) -> kiln::Result<()> {
    for (label, options) in [
        ("default buckets (25 MiB, first 1 MiB)", DdpOptions::default()),
        (
            "one bucket (no overlap)",
            DdpOptions { bucket_cap_mb: 1e6, first_bucket_cap_mb: 1e6, ..DdpOptions::default() },
        ),
    ] {
        let (median, waits) = step_time(group, options)?;
        if group.rank() == 0 {
            println!("{label}: median step {median:.2} ms over {} steps", steps());
            for (waited, hidden, mb) in waits {
                println!(
                    "  all_reduce {mb:>6.2} MB: waited {waited:>6.3} ms, in flight during other steps {hidden:>6.3} ms"
                );
            }
        }
    }
    Ok(())
}

/// One all-reduce of a profiled backward: ms waited, ms in flight during other steps, MB.
type Wait = (f64, f64, f64);

/// The median step in ms, and the all-reduces of one profiled backward.
fn step_time(group: &ProcessGroup, options: DdpOptions) -> kiln::Result<(f64, Vec<Wait>)> {
    let mut model = Sequential::new()
        .with(Linear::new(512, WIDTH))
        .with(ReLU)
        .with(Linear::new(WIDTH, WIDTH))
        .with(ReLU)
        .with(Linear::new(WIDTH, WIDTH))
        .with(ReLU)
        .with(Linear::new(WIDTH, 10));
    // The group's device: the CPU for threads and MPI, the GPU for NCCL.
    let device = group.device();
    model.to(device)?;
    let model = DistributedDataParallel::try_new(model, group, options)?;
    let mut opt = Sgd::new(model.parameters(), SgdConfig { lr: 1e-3, ..Default::default() });
    let x = Tensor::randn([32, 512]).try_to(device)?;
    let y = Tensor::from_vec((0..32).map(|i| i % 10).collect::<Vec<i64>>(), [32]).try_to(device)?;
    let mut times = Vec::with_capacity(steps());
    let mut waits = Vec::new();
    let steps = steps();
    for step in 0..steps + 5 {
        let started = Instant::now();
        opt.zero_grad();
        let loss = F::cross_entropy(&model.try_forward(&x)?, &y);
        if step == steps + 4 {
            let (done, profile) = kiln::profile(|| loss.try_backward());
            done?;
            waits = profile
                .events()
                .iter()
                .filter(|e| e.kind == StepKind::Collective)
                .map(|e| {
                    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
                    (ms(e.duration), ms(e.overlapped), e.bytes_read as f64 / 1e6)
                })
                .collect();
        } else {
            loss.try_backward()?;
        }
        opt.step();
        // The update is lazy: realize it, as the next forward would.
        model.module().parameters()[0].sum().try_item::<f32>()?;
        if (5..steps + 4).contains(&step) {
            times.push(started.elapsed().as_secs_f64() * 1e3);
        }
    }
    times.sort_by(f64::total_cmp);
    Ok((times[times.len() / 2], waits))
}
