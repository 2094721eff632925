//! `autocast` (which ops run in 16 bits, which in f32, master weights) and `GradScaler`.

use kiln::nn::{LayerNorm, Linear, Module, Parameters, functional as F};
use kiln::optim::{Adam, AdamConfig, GradScaler, GradScalerConfig, Optimizer, Sgd, SgdConfig};
use kiln::prelude::*;

#[test]
fn autocast_lowers_products_and_keeps_sensitive_ops_in_f32() {
    kiln::manual_seed(1);
    let x = Tensor::randn([4, 8]);
    let w = Tensor::randn([8, 6]).requires_grad_(true);
    let target = Tensor::from_vec(vec![0i64, 5, 2, 1], [4]);
    for low in [DType::BF16, DType::F16] {
        let (h, probs, ln, loss) = kiln::autocast(low, || {
            assert_eq!(kiln::autocast_dtype(), Some(low));
            let h = x.matmul(&w);
            let ln = F::layer_norm(&h, &[6], None, None, 1e-5);
            (h.clone(), h.softmax(1), ln, F::cross_entropy(&h, &target))
        });
        assert_eq!(h.dtype(), low);
        assert_eq!((probs.dtype(), ln.dtype(), loss.dtype()), (DType::F32, DType::F32, DType::F32));
        assert_eq!(kiln::autocast_dtype(), None);
        // The product is the 16-bit product of the 16-bit operands.
        let (xr, wr) = (x.to_dtype(low).to_vec::<f64>(), w.to_dtype(low).to_vec::<f64>());
        let got = h.to_vec::<f64>();
        for i in 0..4 {
            for j in 0..6 {
                let want: f64 = (0..8).map(|k| xr[i * 8 + k] * wr[k * 6 + j]).sum();
                assert!((got[i * 6 + j] - want).abs() <= 1e-2 * want.abs().max(1.0), "{low:?}");
            }
        }
        w.zero_grad();
        loss.backward();
        assert_eq!(w.grad().expect("a gradient").dtype(), DType::F32, "master weights stay f32");
    }
    // Outside autocast nothing changes.
    assert_eq!(x.matmul(&w).dtype(), DType::F32);
    // Attention (fused or composite) takes 16-bit operands too.
    let q = Tensor::randn([2, 5, 4]);
    let mask = Tensor::zeros([5, 5]);
    let (fused, composite) = kiln::autocast(DType::BF16, || {
        (
            F::scaled_dot_product_attention(&q, &q, &q, None, true),
            F::scaled_dot_product_attention(&q, &q, &q, Some(&mask), false),
        )
    });
    assert_eq!((fused.dtype(), composite.dtype()), (DType::BF16, DType::BF16));
}

#[test]
fn autocast_nests_restores_after_a_panic_and_refuses_other_dtypes() {
    let inner = kiln::autocast(DType::BF16, || kiln::autocast(DType::F16, kiln::autocast_dtype));
    assert_eq!(inner, Some(DType::F16));
    let outer = kiln::autocast(DType::BF16, || {
        kiln::autocast(DType::F16, || ());
        kiln::autocast_dtype()
    });
    assert_eq!(outer, Some(DType::BF16));
    let caught = std::panic::catch_unwind(|| kiln::autocast(DType::BF16, || panic!("inside")));
    assert!(caught.is_err());
    assert_eq!(kiln::autocast_dtype(), None);
    let err = kiln::try_autocast(DType::F32, || ()).unwrap_err().to_string();
    assert!(err.contains("autocast") && err.contains("16-bit"), "{err}");
}

struct Net {
    fc1: Linear,
    ln: LayerNorm,
    fc2: Linear,
}

kiln::parameters!(Net { fc1, ln, fc2 });

impl Module for Net {
    fn try_forward(&self, x: &Tensor) -> kiln::Result<Tensor> {
        self.fc2.try_forward(&self.ln.try_forward(&self.fc1.try_forward(x)?)?.gelu_tanh())
    }
}

fn net() -> Net {
    Net { fc1: Linear::new(10, 32), ln: LayerNorm::new(&[32]), fc2: Linear::new(32, 3) }
}

#[test]
fn a_network_trains_under_bf16_autocast_with_f32_master_weights() {
    kiln::manual_seed(2);
    let model = net();
    let x = Tensor::randn([64, 10]);
    let y = x.narrow(1, 0, 3).argmax(1, false);
    let mut opt = Adam::new(model.parameters(), AdamConfig { lr: 1e-2, ..Default::default() });
    let mut losses = Vec::new();
    for _ in 0..60 {
        opt.zero_grad();
        let loss = kiln::autocast(DType::BF16, || F::cross_entropy(&model.forward(&x), &y));
        loss.backward();
        opt.step();
        losses.push(loss.item::<f32>());
    }
    assert!(losses[59] < 0.5 * losses[0], "{losses:?}");
    assert!(model.parameters().iter().all(|p| p.dtype() == DType::F32));
}

fn sgd_pair(seed: u64) -> (Net, Sgd) {
    kiln::manual_seed(seed);
    let model = net();
    let opt =
        Sgd::new(model.parameters(), SgdConfig { lr: 0.05, momentum: 0.9, ..Default::default() });
    (model, opt)
}

#[test]
fn scaling_by_a_power_of_two_trains_bit_for_bit_like_no_scaling() {
    let x = Tensor::randn([16, 10]);
    let y = Tensor::randint(0, 3, [16]);
    let (plain, mut plain_opt) = sgd_pair(3);
    let (scaled, mut scaled_opt) = sgd_pair(3);
    let mut scaler = GradScaler::new();
    for _ in 0..3 {
        plain_opt.zero_grad();
        F::cross_entropy(&plain.forward(&x), &y).backward();
        plain_opt.step();
        scaled_opt.zero_grad();
        scaler.scale(&F::cross_entropy(&scaled.forward(&x), &y)).backward();
        assert!(scaler.step(&mut scaled_opt));
        scaler.update();
    }
    for (a, b) in plain.parameters().iter().zip(scaled.parameters()) {
        assert_eq!(a.to_vec::<f32>(), b.to_vec::<f32>());
    }
}

#[test]
fn an_overflow_skips_the_step_and_backs_off_the_scale() {
    let config = GradScalerConfig { init_scale: 1024.0, growth_interval: 2, ..Default::default() };
    let mut scaler = GradScaler::with_config(config).unwrap();
    let p = Tensor::from_vec(vec![1.0f32, 2.0], [2]).requires_grad_(true);
    let mut opt = Adam::new(vec![p.clone()], AdamConfig { lr: 0.1, ..Default::default() });
    // A clean step: taken, and the gradient divided by the scale.
    p.set_grad(Some(Tensor::from_vec(vec![1024.0f32, -2048.0], [2])));
    assert!(scaler.step(&mut opt));
    scaler.update();
    assert_eq!(p.grad().unwrap().to_vec::<f32>(), [1.0, -2.0]);
    let after_one = p.to_vec::<f32>();
    assert_eq!(opt.steps(), 1);
    // An overflow: nothing moves, the step count stays, the scale halves.
    p.set_grad(Some(Tensor::from_vec(vec![f32::INFINITY, 1.0], [2])));
    assert!(!scaler.step(&mut opt));
    scaler.update();
    assert_eq!(p.to_vec::<f32>(), after_one);
    assert_eq!(opt.steps(), 1);
    assert_eq!(scaler.get_scale(), 512.0);
    p.set_grad(Some(Tensor::from_vec(vec![f32::NAN, 1.0], [2])));
    assert!(!scaler.step(&mut opt));
    scaler.update();
    assert_eq!(scaler.get_scale(), 256.0);
    // Two clean steps grow the scale back.
    for _ in 0..2 {
        p.set_grad(Some(Tensor::from_vec(vec![0.5f32 * 256.0, 0.25 * 256.0], [2])));
        assert!(scaler.step(&mut opt));
        scaler.update();
    }
    assert_eq!(scaler.get_scale(), 512.0);
    assert_eq!(opt.steps(), 3);
    // The skipped steps left no trace: the same three updates without them agree bit for bit.
    let q = Tensor::from_vec(vec![1.0f32, 2.0], [2]).requires_grad_(true);
    let mut reference = Adam::new(vec![q.clone()], AdamConfig { lr: 0.1, ..Default::default() });
    for g in [[1.0f32, -2.0], [0.5, 0.25], [0.5, 0.25]] {
        q.set_grad(Some(Tensor::from_vec(g.to_vec(), [2])));
        reference.step();
    }
    assert_eq!(p.to_vec::<f32>(), q.to_vec::<f32>());
    assert!(
        GradScaler::with_config(GradScalerConfig { backoff_factor: 1.5, ..Default::default() })
            .is_err()
    );
}

struct Fixed(Vec<Tensor>, Vec<kiln::optim::GroupConfig>);

impl Optimizer for Fixed {
    fn try_step(&mut self) -> kiln::Result<()> {
        Ok(())
    }
    fn parameters(&self) -> &[Tensor] {
        &self.0
    }
    fn param_groups(&self) -> &[kiln::optim::GroupConfig] {
        &self.1
    }
    fn param_groups_mut(&mut self) -> &mut [kiln::optim::GroupConfig] {
        &mut self.1
    }
    fn state_dict(&self) -> kiln::optim::StateDict {
        kiln::optim::StateDict::default()
    }
    fn load_state_dict(&mut self, _: &kiln::optim::StateDict) -> kiln::Result<()> {
        Ok(())
    }
}

#[test]
fn an_optimizer_that_cannot_skip_says_so() {
    let p = Tensor::zeros([1]).requires_grad_(true);
    p.set_grad(Some(Tensor::ones([1])));
    let mut opt = Fixed(vec![p], Vec::new());
    let err = GradScaler::new().try_step(&mut opt).unwrap_err().to_string();
    assert!(err.contains("try_step_unless"), "{err}");
}

#[test]
fn generated_bf16_rounding_matches_half_on_every_kind_of_value() {
    // Ties (both parities), just above and below them, NaNs (quiet and signalling), the
    // infinities, the largest finite values, subnormals, and random bit patterns.
    let mut bits: Vec<u32> = vec![
        0x3F80_8000,
        0x3F81_8000,
        0x3F80_8001,
        0x3F80_7FFF,
        0x7FC0_0000,
        0x7F80_0001,
        0xFFA0_0001,
        0x7F80_0000,
        0xFF80_0000,
        0x7F7F_FFFF,
        0xFF7F_FFFF,
        0x7F7F_8000,
        0x0000_8000,
        0x0001_8000,
        0x8000_0001,
        0,
        0x8000_0000,
    ];
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    bits.extend((0..20_000).map(|_| {
        state =
            state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (state >> 32) as u32
    }));
    assert_generated_rounding(&bits, DType::BF16, |v| half::bf16::from_f32(v).to_f32());
}

#[test]
fn generated_f16_rounding_matches_half_on_every_kind_of_value() {
    // Ties of f16's precision (both parities), the overflow threshold 65520 and its
    // neighbours, f16's subnormal range and its ties, f32 subnormals, NaNs, the infinities,
    // and random bit patterns: a cast (rounding and the store) and an op computed in f16.
    let mut bits: Vec<u32> = vec![
        0x3F80_1000,
        0x3F80_3000,
        0x3F80_1001,
        0x3F80_0FFF,
        0x477F_E000,
        0x477F_EFFF,
        0x477F_F000,
        0x477F_F001,
        0x4780_0000,
        0x3300_0000,
        0x3340_0000,
        0x33C0_0000,
        0x387F_F000,
        0x3880_0000,
        0x0000_8000,
        0x8000_0001,
        0x7FC0_0000,
        0x7F80_0001,
        0xFFA0_2001,
        0x7F80_0000,
        0xFF80_0000,
        0,
        0x8000_0000,
    ];
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    bits.extend((0..20_000).map(|i| {
        state =
            state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        // Half of them within f16's range, where the rounding has work to do.
        let b = (state >> 32) as u32;
        if i % 2 == 0 { (b & 0x8FFF_FFFF) | 0x3000_0000 } else { b }
    }));
    assert_generated_rounding(&bits, DType::F16, |v| half::f16::from_f32(v).to_f32());
}

/// Generated rounding to `dtype` of the f32 values with these `bits`, against `round`
/// (`half`'s conversion there and back), bit for bit (any NaN for a NaN): a cast (rounded
/// and stored in 16 bits), an op computed in `dtype` (the rounding after each op), and a
/// cast widened again in the same kernel (the rounded value never stored). Each is built
/// from `x` afresh, so that it fuses into one kernel.
fn assert_generated_rounding(bits: &[u32], dtype: DType, round: fn(f32) -> f32) {
    let values: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
    let x = Tensor::from_vec(values.clone(), [values.len()]);
    let cast = x.to_dtype(dtype).to_vec::<f32>();
    let doubled = (x.to_dtype(dtype) * 2.0).to_vec::<f32>();
    let round_trip = x.to_dtype(dtype).to_dtype(DType::F32).to_vec::<f32>();
    let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
    for (i, &v) in values.iter().enumerate() {
        let (want, got) = (round(v), cast[i]);
        assert!(same(got, want), "{dtype} {v:e} ({:#x}): {got:e} vs {want:e}", bits[i]);
        let (twice, got) = (round(want * 2.0), doubled[i]);
        assert!(same(got, twice), "{dtype} 2·{v:e}: {got:e} vs {twice:e}");
        let back = round_trip[i];
        assert!(same(back, want), "{dtype} {v:e} there and back: {back:e} vs {want:e}");
    }
}
