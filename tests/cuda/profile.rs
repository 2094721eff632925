//! A GPU profile tells the host's work of issuing each step from the wait for the device.

use std::time::Duration;

use kiln::prelude::*;

use crate::common::*;

#[test]
fn a_gpu_profile_splits_issuing_from_waiting() {
    let Some((gpu, _memory)) = gpu_or_skip("a_gpu_profile_splits_issuing_from_waiting") else {
        return;
    };
    let x = Tensor::randn([64, 48]).to(gpu);
    let w = Tensor::randn([48, 32]).to(gpu);
    let (_, p) = kiln::profile(|| (x.matmul(&w).tanh() + 1.0).softmax(1).to_vec::<f32>());
    assert!(p.issue_time() > Duration::ZERO, "{p}");
    // Each step's time is its issue and its wait.
    let parts = p.issue_time() + p.device_wait_time();
    assert!(parts.abs_diff(p.step_time()) < Duration::from_micros(50), "{p}");
    for k in p.kernels() {
        assert!(k.waited <= k.total, "{}: {:?} of {:?}", k.name, k.waited, k.total);
    }
    let text = p.to_string();
    assert!(
        text.contains(&format!("on {gpu}: ")) && text.contains("waiting for the device"),
        "{text}"
    );
    // On the CPU there is nothing to wait for.
    let cpu = Tensor::randn([64, 48]);
    let (_, p) = kiln::profile(|| cpu.tanh().sum().item::<f32>());
    assert_eq!(p.issue_time(), Duration::ZERO);
    assert!(!p.to_string().contains("waiting for the device"), "{p}");
}
