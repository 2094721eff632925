//! Rotary position embeddings as transformers computes them: `inv_freq` from the base and
//! the scaling, `cos` and `sin` of `position * inv_freq` with the frequencies repeated over
//! the two halves of a head, and `x * cos + rotate_half(x) * sin`.

use kiln::{DType, Device, Tensor};

use crate::config::{Rope, RopeScaling};

/// The inverse frequencies of a head of `head_dim` (`head_dim / 2` of them), in f64.
pub fn inv_freq(rope: &Rope, head_dim: usize) -> Vec<f64> {
    let half = head_dim / 2;
    let base: Vec<f64> =
        (0..half).map(|i| 1.0 / rope.theta.powf((2 * i) as f64 / head_dim as f64)).collect();
    match rope.scaling {
        RopeScaling::None => base,
        RopeScaling::Linear { factor } => base.iter().map(|f| f / factor).collect(),
        RopeScaling::Divisors(ref divisors) => {
            base.iter().zip(divisors).map(|(f, d)| f / d).collect()
        }
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings: original,
        } => {
            let (low_wavelen, high_wavelen) =
                (original / low_freq_factor, original / high_freq_factor);
            base.iter()
                .map(|&f| {
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    if wavelen < high_wavelen {
                        f
                    } else if wavelen > low_wavelen {
                        f / factor
                    } else {
                        let smooth = (original / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
        }
    }
}

/// `cos` and `sin` tables for positions `0..len`, each `[len, head_dim]` (the frequencies
/// repeated over both halves), in `dtype` on `device`. transformers computes the angles in
/// f32; so does this, so positions agree to the last bit.
pub fn tables(
    rope: &Rope,
    head_dim: usize,
    len: usize,
    dtype: DType,
    device: Device,
) -> (Tensor, Tensor) {
    let freqs: Vec<f32> = inv_freq(rope, head_dim).iter().map(|&f| f as f32).collect();
    let (mut cos, mut sin) =
        (Vec::with_capacity(len * head_dim), Vec::with_capacity(len * head_dim));
    for p in 0..len {
        for i in 0..head_dim {
            let angle = p as f32 * freqs[i % freqs.len()];
            cos.push(angle.cos());
            sin.push(angle.sin());
        }
    }
    let make = |v: Vec<f32>| Tensor::from_vec(v, [len, head_dim]).to_dtype(dtype).to(device);
    (make(cos), make(sin))
}

/// `cos` and `sin` `[len, head_dim]` computed on the device from `positions` (`[len]`, i64)
/// and `inv_freq` (`[head_dim / 2]`, f32), as transformers computes them (the angles in f32),
/// in `dtype`: no data moves to the device, so a compiled step can call it.
///
/// # Errors
/// When `positions` is not 1-D.
pub fn on_device(
    positions: &Tensor,
    inv_freq: &Tensor,
    dtype: DType,
) -> kiln::Result<(Tensor, Tensor)> {
    let angles = positions.to_dtype(DType::F32).try_unsqueeze(-1)? * inv_freq;
    let angles = Tensor::cat(&[&angles, &angles], -1);
    Ok((angles.cos().to_dtype(dtype), angles.sin().to_dtype(dtype)))
}

/// `x * cos + rotate_half(x) * sin` for `x` of `[.., len, head_dim]`, where
/// `rotate_half(x) = cat(-x2, x1)` over the head's two halves.
pub fn apply(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    let d = x.dims()[x.ndim() - 1];
    let (x1, x2) = (x.narrow(-1, 0, d / 2), x.narrow(-1, d / 2, d - d / 2));
    let rotated = Tensor::cat(&[&x2.neg(), &x1], -1);
    x * cos + rotated * sin
}
