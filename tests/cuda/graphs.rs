//! `compile()`d plans on a GPU replay as CUDA graphs: captured at their first replay, then
//! one graph launch per call whose kernels take each call's values (new input buffers, a
//! changed learning rate, Adam's step count, fresh dropout keys), with results in new
//! buffers; plans that a graph cannot hold run step by step and say why.

use std::cell::Cell;

use kiln::nn::functional as F;
use kiln::nn::{Embedding, Linear, Module};
use kiln::optim::{AdamConfig, AdamW, Optimizer};
use kiln::prelude::*;

use crate::common::*;

/// An embedding (a gather, whose index check runs after each graph launch), a linear layer
/// (cuBLAS), dropout in training mode (a random key per call), cross-entropy and AdamW under
/// a learning rate that changes every call; each call's batch in buffers of its own.
fn train(device: Device, calls: usize) -> (Vec<f32>, Vec<f32>, kiln::compile::CompileStats) {
    kiln::manual_seed(5);
    let mut embed = Embedding::new(13, 8);
    let mut linear = Linear::new(8, 5);
    embed.to(device).expect("embedding to the device");
    linear.to(device).expect("linear to the device");
    let mut params = embed.parameters();
    params.extend(linear.parameters());
    let mut opt = AdamW::new(params, AdamConfig { lr: 1e-2, ..AdamConfig::default() });
    let lr = Cell::new(1e-2);
    let mut step = kiln::compile(|(tokens, target): (&Tensor, &Tensor)| {
        opt.set_lr(lr.get());
        opt.zero_grad();
        let hidden = F::dropout(&embed.forward(tokens), 0.25, true);
        let loss = F::cross_entropy(&linear.forward(&hidden), target);
        loss.backward();
        opt.step();
        loss
    });
    let mut losses = Vec::new();
    for call in 0..calls {
        let tokens: Vec<i64> = (0..12).map(|i| ((i * 5 + call * 3) % 13) as i64).collect();
        let target: Vec<i64> = (0..12).map(|i| ((i + call) % 5) as i64).collect();
        let tokens = Tensor::from_vec(tokens, [12]).to(device);
        let target = Tensor::from_vec(target, [12]).to(device);
        losses.push(step.call((&tokens, &target)));
        lr.set(lr.get() * 0.8);
    }
    // Every call's loss is its own buffer: reading them after the last call sees each value.
    let losses = losses.iter().map(|l| l.item::<f32>()).collect();
    (losses, linear.weight.to_vec::<f32>(), step.stats().clone())
}

#[test]
fn a_compiled_training_step_replays_as_one_cuda_graph() {
    let Some((gpu, _memory)) = gpu_or_skip("a_compiled_training_step_replays_as_one_cuda_graph")
    else {
        return;
    };
    let (cpu_losses, cpu_w, _) = train(Device::Cpu, 6);
    let (gpu_losses, gpu_w, stats) = train(gpu, 6);
    let f64s = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
    assert_close_tol(&f64s(&gpu_losses), &f64s(&cpu_losses), 1e-5, "losses");
    assert_close_tol(&f64s(&gpu_w), &f64s(&cpu_w), 1e-5, "weights");
    // The first call plans without the optimizer's moments, the second with them; that plan
    // is captured at its first replay and launched as a graph from then on.
    assert_eq!(stats.plans, 2, "{stats}");
    assert_eq!(stats.graph_captures, 1, "{stats}");
    assert_eq!(stats.replays, 4, "{stats}");
    assert_eq!(stats.graph_launches, 4, "every replay is one graph launch: {stats}");
    assert_eq!(stats.stepwise, None, "{stats}");
}

/// A gather's bad index inside a replayed graph is the error it is outside one, reported
/// without stopping the host: by the first read of a value (here, the call's result) or by
/// the next call, whichever comes first.
#[test]
fn a_bad_index_in_a_graph_replay_is_reported_at_the_next_wait() {
    let Some((gpu, _memory)) =
        gpu_or_skip("a_bad_index_in_a_graph_replay_is_reported_at_the_next_wait")
    else {
        return;
    };
    let table = Tensor::randn([7, 3]).to(gpu);
    let mut f = kiln::compile(|index: &Tensor| table.index_select(0, index).sum());
    let good = Tensor::from_vec(vec![1i64, 6, 0], [3]).to(gpu);
    let want = table.index_select(0, &good).sum().item::<f32>();
    for _ in 0..3 {
        assert_eq!(f.call::<_, Tensor>(&good).item::<f32>(), want);
    }
    assert_eq!(f.stats().graph_launches, 2, "{}", f.stats());
    let bad = Tensor::from_vec(vec![1i64, 9, 0], [3]).to(gpu);
    // Read at once: the read reports it.
    let out = f.try_call::<_, Tensor>(&bad).expect("queued");
    let err = out.try_item::<f32>().unwrap_err().to_string();
    assert!(err.contains("index 9 is out of bounds for dimension 0 with size 7"), "{err}");
    assert_eq!(f.call::<_, Tensor>(&good).item::<f32>(), want, "the graph still replays");
    // Not read: the next call reports it.
    f.try_call::<_, Tensor>(&bad).expect("queued");
    let err = f.try_call::<_, Tensor>(&good).unwrap_err().to_string();
    assert!(err.contains("index 9 is out of bounds"), "{err}");
    assert_eq!(f.call::<_, Tensor>(&good).item::<f32>(), want);
    assert_eq!(f.stats().graph_launches, 6, "{}", f.stats());
}

/// Host work cannot be captured: an integer product runs on host copies, so the plan runs
/// step by step, with the same results, and the stats say why.
#[test]
fn a_plan_with_host_work_runs_step_by_step_and_says_why() {
    let Some((gpu, _memory)) = gpu_or_skip("a_plan_with_host_work_runs_step_by_step_and_says_why")
    else {
        return;
    };
    let a = Tensor::from_vec((0..6).collect::<Vec<i64>>(), [2, 3]).to(gpu);
    let mut f = kiln::compile(|b: &Tensor| a.matmul(b) + 1);
    let b = Tensor::from_vec((0..12).collect::<Vec<i64>>(), [3, 4]).to(gpu);
    let want = (a.cpu().matmul(&b.cpu()) + 1).to_vec::<i64>();
    for _ in 0..3 {
        assert_eq!(f.call::<_, Tensor>(&b).to_vec::<i64>(), want);
    }
    let stats = f.stats();
    assert_eq!(stats.graph_launches, 0, "{stats}");
    let why = stats.stepwise.as_deref().unwrap_or_default();
    assert!(why.contains("cannot be captured in a CUDA graph"), "{stats}");
}

/// Each plan of a compiled function has its own graph: calls with another shape plan and
/// capture again, and the two plans' graphs then replay in turn, each with its own results.
/// A profiled call and a checked call launch step by step and say why, and the graphs replay
/// again after them.
#[test]
fn each_plan_has_its_own_graph_and_profiling_or_checking_goes_step_by_step() {
    let Some((gpu, _memory)) =
        gpu_or_skip("each_plan_has_its_own_graph_and_profiling_or_checking_goes_step_by_step")
    else {
        return;
    };
    let w = Tensor::randn([5, 3]).to(gpu);
    let mut f = kiln::compile(|x: &Tensor| (x.matmul(&w).tanh() * 2.0).sum_dim(0, false));
    let small = Tensor::randn([4, 5]).to(gpu);
    let large = Tensor::randn([9, 5]).to(gpu);
    let want =
        |x: &Tensor| (x.cpu().matmul(&w.cpu()).tanh() * 2.0).sum_dim(0, false).to_vec::<f32>();
    let close = |got: Vec<f32>, want: Vec<f32>| {
        assert!(got.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-5), "{got:?} {want:?}");
    };
    for _ in 0..3 {
        close(f.call::<_, Tensor>(&small).to_vec(), want(&small));
        close(f.call::<_, Tensor>(&large).to_vec(), want(&large));
    }
    let stats = f.stats().clone();
    assert_eq!((stats.plans, stats.graph_captures, stats.graph_launches), (2, 2, 4), "{stats}");
    let (out, _) = kiln::profile(|| f.call::<_, Tensor>(&small));
    close(out.to_vec(), want(&small));
    let why = f.stats().stepwise.clone().unwrap_or_default();
    assert!(why.contains("profiling"), "{}", f.stats());
    let out = kiln::with_check_scale(1.0, || f.call::<_, Tensor>(&large));
    close(out.to_vec(), want(&large));
    let why = f.stats().stepwise.clone().unwrap_or_default();
    assert!(why.contains("KILN_CHECK"), "{}", f.stats());
    close(f.call::<_, Tensor>(&small).to_vec(), want(&small));
    assert_eq!(f.stats().stepwise, None, "{}", f.stats());
    assert_eq!(f.stats().graph_launches, 5, "{}", f.stats());
}
