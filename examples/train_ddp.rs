//! Data-parallel training of the digits MLP: every rank holds the model, trains on its
//! share of each global batch (a `DistributedSampler`), and `DistributedDataParallel`
//! averages the gradients during backward. Prints the loss per epoch, each rank's
//! throughput, and the test accuracy.
//!
//! Over MPI (kiln built with the `mpi` feature), one process per rank:
//!
//! ```text
//! cargo build --release --features mpi --example train_ddp
//! mpirun -np 2 target/release/examples/train_ddp
//! ```
//!
//! Started without a launcher, it runs `KILN_RANKS` ranks (default 2) as threads of one
//! process (`ProcessGroup::local`): `cargo run --release --example train_ddp`.

#[path = "common/digits.rs"]
#[allow(dead_code, reason = "the example uses the loader, not the single-process trainer")]
mod digits;

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use kiln::data::{DataLoader, TensorDataset};
use kiln::distributed::{self, Backend, DistributedSampler, LaunchInfo, ProcessGroup, ReduceOp};
use kiln::nn::{DistributedDataParallel, Linear, ReLU, Sequential, functional as F};
use kiln::optim::{Adam, AdamConfig, Optimizer};
use kiln::prelude::*;

const GLOBAL_BATCH: usize = 64;
const EPOCHS: usize = 30;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let data = Arc::new(digits::load(&root.join("data/digits.csv.gz"))?);
    if LaunchInfo::from_env().is_some() {
        let group = distributed::try_init(Backend::Mpi)?;
        train(&group, &data)?;
        return Ok(());
    }
    let world = std::env::var("KILN_RANKS").ok().and_then(|v| v.parse().ok()).unwrap_or(2);
    println!("no launcher found: {world} ranks as threads of this process");
    let ranks: Vec<_> = ProcessGroup::local(world)
        .into_iter()
        .map(|group| {
            let data = data.clone();
            std::thread::spawn(move || train(&group, &data).map_err(|e| e.to_string()))
        })
        .collect();
    for rank in ranks {
        rank.join().map_err(|_| "a rank panicked")??;
    }
    Ok(())
}

fn train(group: &ProcessGroup, data: &digits::Digits) -> kiln::Result<()> {
    let (rank, world) = (group.rank(), group.world_size());
    let lead = rank == 0;
    // The same 80/20 split on every rank: a permutation from a fixed seed.
    let n = data.labels.numel();
    let order = DistributedSampler::new(0, 1).shuffle(0).indices(n, 0);
    let (train_idx, test_idx) = order.split_at(n * 4 / 5);
    let pick = |t: &Tensor, idx: &[usize]| {
        let idx = Tensor::from_vec(idx.iter().map(|&i| i as i64).collect::<Vec<_>>(), [idx.len()]);
        t.index_select(0, &idx).realize().clone()
    };
    let train_set =
        TensorDataset::new(vec![pick(&data.images, train_idx), pick(&data.labels, train_idx)])?;
    let (test_x, test_y) = (pick(&data.images, test_idx), pick(&data.labels, test_idx));

    // Each rank draws its own initial weights; the wrapper replaces them with rank 0's.
    let model = Sequential::new()
        .with(Linear::new(64, 128))
        .with(ReLU)
        .with(Linear::new(128, 128))
        .with(ReLU)
        .with(Linear::new(128, 10));
    let model = DistributedDataParallel::new(model, group);
    let mut opt = Adam::new(model.parameters(), AdamConfig { lr: 3e-3, ..Default::default() });
    let sampler = DistributedSampler::for_group(group).shuffle(0).drop_last(true);
    let loader = DataLoader::new(&train_set, GLOBAL_BATCH / world).sampler(sampler).drop_last(true);
    if lead {
        println!(
            "{world} ranks ({:?}), global batch {GLOBAL_BATCH} = {world} x {}, {} steps per epoch",
            group.backend(),
            GLOBAL_BATCH / world,
            loader.len()
        );
    }

    let start = Instant::now();
    let mut examples = 0;
    for epoch in 0..EPOCHS {
        let mut total = Tensor::zeros([]);
        for batch in &loader {
            let [x, y]: [Tensor; 2] = batch?.try_into().map_err(|_| {
                kiln::Error::Internal("a digits batch holds images and labels".into())
            })?;
            examples += y.numel();
            opt.zero_grad();
            let loss = F::cross_entropy(&model.forward(&x), &y);
            loss.backward();
            opt.step();
            total = total + loss.detach();
        }
        // The mean over every rank's batches: one all-reduce per epoch.
        let mean = group.all_reduce(&(total / loader.len() as f64), ReduceOp::Mean).item::<f64>();
        if lead && (epoch % 5 == 4 || epoch == 0) {
            println!("epoch {:>2}: mean loss {mean:.4}", epoch + 1);
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    // Every rank reports its own throughput, then rank 0 the totals.
    let mine = examples as f64 / seconds;
    println!("rank {rank}: {examples} examples in {seconds:.2} s, {mine:.0} examples/s");
    let all = group.all_reduce(&Tensor::scalar(mine), ReduceOp::Sum).item::<f64>();
    let accuracy = kiln::no_grad(|| {
        let predicted = model.forward(&test_x).argmax(1, false);
        predicted.eq(&test_y).sum().item::<i64>() as f64 / test_y.numel() as f64
    });
    if lead {
        println!("all ranks: {all:.0} examples/s; test accuracy {:.1}%", 100.0 * accuracy);
    }
    if accuracy < 0.95 {
        return Err(kiln::Error::Value {
            op: "train_ddp",
            detail: format!("test accuracy {:.1}% is below 95%", 100.0 * accuracy),
        });
    }
    Ok(())
}
