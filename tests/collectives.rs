//! Checks of collectives and data-parallel training that every engine must pass, written
//! against one rank of a group: the local (threads) tests and the MPI tests (`mpirun`) run
//! the same functions. Every rank's input is a pure function of its rank, so each rank
//! computes the expected result of a collective itself, in f64.

use kiln::distributed::{ProcessGroup, ReduceOp};
use kiln::nn::{DdpOptions, DistributedDataParallel, Linear, Module, Parameters, Sequential, Tanh};
use kiln::optim::{Optimizer, Sgd, SgdConfig};
use kiln::{DType, Device, Tensor};

/// Rank `rank`'s values for a tensor of `n` elements: small multiples of 1/8 (exact in every
/// float dtype), small integers, or booleans.
pub fn rank_values(rank: usize, n: usize, dtype: DType, salt: u64) -> Vec<f64> {
    let mut state = (rank as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ salt;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let r = (state >> 33) % 65;
            match dtype {
                DType::Bool => (r % 2) as f64,
                DType::U8 => (r % 20) as f64,
                DType::I8 | DType::I32 | DType::I64 => r as f64 - 32.0,
                _ => (r as f64 - 32.0) / 8.0,
            }
        })
        .collect()
}

fn tensor_of(values: &[f64], dims: &[usize], dtype: DType) -> Tensor {
    Tensor::from_vec(values.to_vec(), dims.to_vec()).to_dtype(dtype)
}

/// The elementwise reduction of the ranks' values, as the engines must compute it.
fn reduce(op: ReduceOp, dtype: DType, all: &[Vec<f64>]) -> Vec<f64> {
    let world = all.len() as f64;
    (0..all[0].len())
        .map(|i| {
            let xs = all.iter().map(|v| v[i]);
            match (dtype, op) {
                (DType::Bool, ReduceOp::Sum | ReduceOp::Max) => xs.fold(0.0, f64::max),
                (DType::Bool, ReduceOp::Product | ReduceOp::Min) => xs.fold(1.0, f64::min),
                (DType::U8, ReduceOp::Product) => {
                    xs.fold(1u8, |a, x| a.wrapping_mul(x as u8)) as f64
                }
                (DType::I8, ReduceOp::Product) => {
                    xs.fold(1i8, |a, x| a.wrapping_mul(x as i8)) as f64
                }
                (_, ReduceOp::Sum) => xs.sum(),
                (_, ReduceOp::Mean) => xs.sum::<f64>() / world,
                (_, ReduceOp::Product) => xs.product(),
                (_, ReduceOp::Max) => xs.fold(f64::NEG_INFINITY, f64::max),
                (_, ReduceOp::Min) => xs.fold(f64::INFINITY, f64::min),
            }
        })
        .collect()
}

fn assert_close(what: &str, got: &[f64], want: &[f64], dtype: DType) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let tol = match dtype {
        DType::BF16 => 1e-2,
        DType::F16 => 2e-3,
        DType::F32 => 1e-6,
        DType::F64 => 1e-12,
        _ => 0.0,
    };
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * w.abs().max(1.0),
            "{what}: element {i} is {g}, expected {w}"
        );
    }
}

/// Every collective, every dtype and reduction, odd sizes, a non-contiguous input, against
/// the f64 reference.
pub fn collectives_agree_with_the_reference(group: &ProcessGroup) {
    let (rank, world) = (group.rank(), group.world_size());
    for (salt, dtype) in DType::ALL.into_iter().enumerate() {
        for dims in [vec![1usize], vec![7], vec![3, 5]] {
            let n: usize = dims.iter().product();
            let all: Vec<Vec<f64>> =
                (0..world).map(|r| rank_values(r, n, dtype, salt as u64 + n as u64)).collect();
            let mine = tensor_of(&all[rank], &dims, dtype).to(group.device());
            let what = |c: &str| format!("{c} of {dtype} {dims:?} on rank {rank} of {world}");
            let mut ops = vec![ReduceOp::Sum, ReduceOp::Product, ReduceOp::Max, ReduceOp::Min];
            if dtype.is_float() {
                ops.push(ReduceOp::Mean);
            }
            for op in ops {
                let got = group.all_reduce(&mine, op).to_dtype(DType::F64).to_vec::<f64>();
                assert_close(
                    &what(&format!("all_reduce {op:?}")),
                    &got,
                    &reduce(op, dtype, &all),
                    dtype,
                );
            }
            let root = world - 1;
            let got = group.broadcast(&mine, root).to_dtype(DType::F64).to_vec::<f64>();
            assert_close(&what("broadcast"), &got, &all[root], dtype);
            let gathered = group.all_gather(&mine);
            assert_eq!(gathered.shape().dims()[0], dims[0] * world, "{}", what("all_gather"));
            let got = gathered.to_dtype(DType::F64).to_vec::<f64>();
            assert_close(&what("all_gather"), &got, &all.concat(), dtype);
            // reduce_scatter of a [world, n] stack: rank r gets row r of the reduction.
            let stacked: Vec<Vec<f64>> = (0..world)
                .map(|r| {
                    (0..world).flat_map(|_| rank_values(r, n, dtype, 99 + salt as u64)).collect()
                })
                .collect();
            let input = tensor_of(&stacked[rank], &[world * n], dtype).to(group.device());
            let got =
                group.reduce_scatter(&input, ReduceOp::Sum).to_dtype(DType::F64).to_vec::<f64>();
            let whole = reduce(ReduceOp::Sum, dtype, &stacked);
            assert_close(&what("reduce_scatter"), &got, &whole[rank * n..(rank + 1) * n], dtype);
        }
    }
    // A transposed view and a slice are read through their views.
    let values = rank_values(rank, 15, DType::F32, 7);
    let base = tensor_of(&values, &[5, 3], DType::F32).to(group.device());
    let got = group.all_reduce(&base.t(), ReduceOp::Sum).to_vec::<f32>();
    let all: Vec<Vec<f64>> = (0..world).map(|r| rank_values(r, 15, DType::F32, 7)).collect();
    let sum = reduce(ReduceOp::Sum, DType::F32, &all);
    let transposed: Vec<f64> = (0..15).map(|i| sum[(i % 5) * 3 + i / 5]).collect();
    let got: Vec<f64> = got.iter().map(|&v| f64::from(v)).collect();
    assert_close("all_reduce of a transposed view", &got, &transposed, DType::F32);
    let sliced = group.all_gather(&base.narrow(0, 1, 2)).to_vec::<f32>();
    let want: Vec<f64> = all.iter().flat_map(|v| v[3..9].to_vec()).collect();
    let sliced: Vec<f64> = sliced.iter().map(|&v| f64::from(v)).collect();
    assert_close("all_gather of a slice", &sliced, &want, DType::F32);
}

/// Elementwise work before and after a collective fuses around it, in one materialization.
pub fn collectives_fuse_with_their_neighbours(group: &ProcessGroup) {
    let (rank, world) = (group.rank(), group.world_size());
    let x = tensor_of(&rank_values(rank, 10, DType::F32, 3), &[10], DType::F32).to(group.device());
    let y = (group.all_reduce(&(x.exp() * 2.0 + 1.0), ReduceOp::Sum) / world as f64).sqrt();
    let want: Vec<f64> = (0..10)
        .map(|i| {
            let s: f64 =
                (0..world).map(|r| rank_values(r, 10, DType::F32, 3)[i].exp() * 2.0 + 1.0).sum();
            (s / world as f64).sqrt()
        })
        .collect();
    let got: Vec<f64> = y.to_vec::<f32>().iter().map(|&v| f64::from(v)).collect();
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 1e-5 * w.abs(), "fused around all_reduce: {g} vs {w}");
    }
}

/// Gradients of the differentiable collectives, with the loss the sum of every rank's loss
/// `sum(w_r * collective(x_r))`, against the analytic adjoint.
pub fn collective_gradients_are_the_adjoint_collectives(group: &ProcessGroup) {
    let (rank, world) = (group.rank(), group.world_size());
    let n = 6;
    let weights = |r: usize, len: usize| rank_values(r, len, DType::F64, 40 + r as u64);
    let x = tensor_of(&rank_values(rank, world * n, DType::F64, 11), &[world * n], DType::F64)
        .to(group.device())
        .requires_grad_(true);
    type Case<'a> = (&'static str, Box<dyn Fn(&Tensor) -> Tensor + 'a>, usize);
    let cases: [Case<'_>; 5] = [
        ("all_reduce sum", Box::new(|x| group.all_reduce(x, ReduceOp::Sum)), world * n),
        ("all_reduce mean", Box::new(|x| group.all_reduce(x, ReduceOp::Mean)), world * n),
        ("all_gather", Box::new(|x| group.all_gather(x)), world * world * n),
        ("reduce_scatter sum", Box::new(|x| group.reduce_scatter(x, ReduceOp::Sum)), n),
        ("reduce_scatter mean", Box::new(|x| group.reduce_scatter(x, ReduceOp::Mean)), n),
    ];
    for (name, f, out_len) in cases {
        x.zero_grad();
        let w = tensor_of(&weights(rank, out_len), &[out_len], DType::F64).to(group.device());
        (f(&x) * &w).sum().backward();
        let got = x.grad().expect("x has a gradient").to_vec::<f64>();
        let all_w: Vec<Vec<f64>> = (0..world).map(|r| weights(r, out_len)).collect();
        let sum_w = reduce(ReduceOp::Sum, DType::F64, &all_w);
        let want: Vec<f64> = match name {
            "all_reduce sum" => sum_w,
            "all_reduce mean" => sum_w.iter().map(|v| v / world as f64).collect(),
            // Each rank's x is block `rank` of every rank's result.
            "all_gather" => sum_w[rank * world * n..(rank + 1) * world * n].to_vec(),
            "reduce_scatter sum" => all_w.concat(),
            _ => all_w.concat().iter().map(|v| v / world as f64).collect(),
        };
        assert_close(&format!("gradient of {name} on rank {rank}"), &got, &want, DType::F64);
    }
}

/// A compiled step that holds a collective replays it with new values every call.
pub fn compiled_steps_replay_collectives(group: &ProcessGroup) {
    let (rank, world) = (group.rank(), group.world_size());
    let g = group.clone();
    let mut step = kiln::compile(move |x: &Tensor| g.all_reduce(&(x * 2.0), ReduceOp::Sum) + 1.0);
    for call in 0..3u64 {
        let x =
            tensor_of(&rank_values(rank, 5, DType::F32, call), &[5], DType::F32).to(group.device());
        let got = step.call(&x).to_vec::<f32>();
        for (i, g) in got.iter().enumerate() {
            let want: f64 =
                (0..world).map(|r| 2.0 * rank_values(r, 5, DType::F32, call)[i]).sum::<f64>() + 1.0;
            assert!((f64::from(*g) - want).abs() < 1e-5, "call {call}, element {i}: {g} vs {want}");
        }
    }
}

/// The global batch the data-parallel checks train on: 12 rows, so that 1, 2, 3 and 4
/// ranks each take an equal share.
pub fn global_batch() -> (Tensor, Tensor) {
    let x = tensor_of(&rank_values(100, 12 * 5, DType::F32, 1), &[12, 5], DType::F32);
    let y = tensor_of(&rank_values(101, 12 * 2, DType::F32, 2), &[12, 2], DType::F32);
    (x, y)
}

/// A small MLP whose parameters depend on `seed` (so that ranks start different and the
/// wrapper's broadcast is what makes them equal).
pub fn mlp(seed: usize) -> Sequential {
    let model = Sequential::new().with(Linear::new(5, 4)).with(Tanh).with(Linear::new(4, 2));
    let state: Vec<(String, Tensor)> = model
        .named_parameters()
        .into_iter()
        .enumerate()
        .map(|(i, (name, p))| {
            let v: Vec<f64> = rank_values(seed, p.numel(), DType::F32, i as u64)
                .iter()
                .map(|v| v / 4.0)
                .collect();
            (name, tensor_of(&v, p.shape().dims(), DType::F32))
        })
        .collect();
    model.load_state_dict(state).expect("the state fits the model");
    model
}

/// [`mlp`] on `device`.
pub fn mlp_on(seed: usize, device: Device) -> Sequential {
    let mut model = mlp(seed);
    model.to(device).expect("the model moves");
    model
}

fn mse(model: &impl Module, x: &Tensor, y: &Tensor) -> Tensor {
    (model.forward(x) - y).pow(2.0).mean()
}

/// The loss of every step of SGD on the global batch in one process, from rank 0's start.
pub fn single_process_losses(steps: usize) -> Vec<f64> {
    let (x, y) = global_batch();
    let model = mlp(0);
    let mut opt = Sgd::new(model.parameters(), SgdConfig { lr: 0.5, ..Default::default() });
    (0..steps)
        .map(|_| {
            opt.zero_grad();
            let loss = mse(&model, &x, &y);
            loss.backward();
            opt.step();
            loss.item()
        })
        .collect()
}

/// Data-parallel SGD with each rank on its share of the global batch follows the loss curve
/// of one process on the whole batch, and ends with the same parameters on every rank.
pub fn ddp_matches_one_process_on_the_global_batch(group: &ProcessGroup, options: DdpOptions) {
    let (rank, world) = (group.rank(), group.world_size());
    let steps = 8;
    let dev = group.device();
    let (x, y) = global_batch();
    let (x, y) = (x.to(dev), y.to(dev));
    let share = 12 / world;
    let (xs, ys) = (x.narrow(0, rank * share, share), y.narrow(0, rank * share, share));
    let model = DistributedDataParallel::try_new(mlp_on(rank, dev), group, options).expect("wraps");
    // One process ran on the CPU: a GPU's kernels may sum in another order.
    let tol = if dev == Device::Cpu { 1e-5 } else { 1e-4 };
    let mut opt = Sgd::new(model.parameters(), SgdConfig { lr: 0.5, ..Default::default() });
    let reference = single_process_losses(steps);
    for (step, want) in reference.iter().enumerate() {
        // The global batch's loss before this step, from this rank's copy of the model.
        let global: f64 = kiln::no_grad(|| mse(model.module(), &x, &y).item());
        assert!(
            (global - want).abs() <= tol * want.abs().max(1.0),
            "rank {rank}, step {step}: loss {global} vs one process {want}"
        );
        opt.zero_grad();
        mse(&model, &xs, &ys).backward();
        opt.step();
    }
    // Every rank holds the same parameters: their all-reduced max equals their min.
    for p in model.parameters() {
        let hi = group.all_reduce(&p.detach(), ReduceOp::Max).to_vec::<f32>();
        let lo = group.all_reduce(&p.detach(), ReduceOp::Min).to_vec::<f32>();
        assert_eq!(hi, lo, "parameters differ across ranks");
    }
}

/// Gradient accumulation under `no_sync`: two half-batches accumulated locally, the second
/// backward outside `no_sync`, give the same update as one backward of their sum.
pub fn no_sync_accumulates_then_reduces(group: &ProcessGroup) {
    let (rank, world) = (group.rank(), group.world_size());
    let dev = group.device();
    let (x, y) = global_batch();
    let (x, y) = (x.to(dev), y.to(dev));
    let share = 12 / world;
    let (xs, ys) = (x.narrow(0, rank * share, share), y.narrow(0, rank * share, share));
    let half = share / 2;
    let a = DistributedDataParallel::new(mlp_on(0, dev), group);
    let b = mlp_on(0, dev);
    {
        let _local = a.no_sync();
        mse(&a, &xs.narrow(0, 0, half), &ys.narrow(0, 0, half)).backward();
    }
    let rest = share - half;
    mse(&a, &xs.narrow(0, half, rest), &ys.narrow(0, half, rest)).backward();
    let both = mse(&b, &xs.narrow(0, 0, half), &ys.narrow(0, 0, half))
        + mse(&b, &xs.narrow(0, half, rest), &ys.narrow(0, half, rest));
    both.backward();
    for (pa, pb) in a.parameters().iter().zip(b.parameters()) {
        // b is the bare model: its gradients are this rank's own; average them.
        let want = group.all_reduce(&pb.grad().expect("grad"), ReduceOp::Mean).to_vec::<f32>();
        let got = pa.grad().expect("grad").to_vec::<f32>();
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "rank {rank}: {g} vs {w}");
        }
    }
}
