//! Scaled dot-product attention and multi-head attention against an f64 loop and PyTorch,
//! and a whole pre-norm transformer block's gradients against PyTorch.

use std::collections::HashMap;

use kiln::autograd::gradcheck;
use kiln::nn::functional::{self as F, AttentionOptions};
use kiln::nn::{LayerNorm, Linear, Module, MultiheadAttention, Parameters};
use kiln::prelude::*;

use crate::common::*;

/// The mask of one score: `None` to keep it as is, `Some(add)` to add `add` (−∞ blocks).
type MaskFn<'a> = &'a dyn Fn(&[usize], usize, usize) -> f64;

/// `softmax(q kᵀ scale + mask) v` by loops over `[B, H, L, E]` operands broadcast from
/// their own shapes.
#[allow(clippy::too_many_arguments)]
fn reference(
    q: (&[f64], &[usize]),
    k: (&[f64], &[usize]),
    v: (&[f64], &[usize]),
    batch: &[usize],
    scale: f64,
    mask: MaskFn<'_>,
) -> Vec<f64> {
    let r = q.1.len();
    let (l, e, s, ev) = (q.1[r - 2], q.1[r - 1], k.1[r - 2], v.1[r - 1]);
    let at = |t: (&[f64], &[usize]), b: &[usize], i: usize, j: usize| {
        let mut idx: Vec<usize> =
            b.iter().zip(t.1).map(|(&x, &d)| if d == 1 { 0 } else { x }).collect();
        idx.extend([i, j]);
        t.0[ravel(&idx, t.1)]
    };
    let mut out = Vec::new();
    let n: usize = batch.iter().product();
    for flat in 0..n {
        let b = unravel(flat, batch);
        for i in 0..l {
            let scores: Vec<f64> = (0..s)
                .map(|j| {
                    (0..e).map(|c| at(q, &b, i, c) * at(k, &b, j, c)).sum::<f64>() * scale
                        + mask(&b, i, j)
                })
                .collect();
            let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = w.iter().sum();
            for c in 0..ev {
                out.push((0..s).map(|j| w[j] / z * at(v, &b, j, c)).sum());
            }
        }
    }
    out
}

#[test]
fn attention_matches_the_loop_with_broadcasts_masks_and_layouts() {
    let mut rng = Rng::new(401);
    let (qs, ks, vs) = ([2usize, 3, 4, 5], [2usize, 1, 6, 5], [1usize, 3, 6, 7]);
    let data = |rng: &mut Rng, s: &[usize]| values(rng, s.iter().product(), DType::F64);
    let (qd, kd, vd) = (data(&mut rng, &qs), data(&mut rng, &ks), data(&mut rng, &vs));
    let float_mask = data(&mut rng, &[4, 6]);
    let bool_mask: Vec<bool> =
        (0..2 * 4 * 6).map(|i| i % 6 == 0 || rng.uniform(0.0, 1.0) > 0.4).collect();
    for layout in LAYOUTS {
        let q = make(&qd, &qs, DType::F64, layout);
        let (k, v) = (make(&kd, &ks, DType::F64, layout), make(&vd, &vs, DType::F64, layout));
        let none: MaskFn<'_> = &|_, _, _| 0.0;
        let got = F::scaled_dot_product_attention(&q, &k, &v, None, false).to_vec::<f64>();
        let want = reference((&qd, &qs), (&kd, &ks), (&vd, &vs), &[2, 3], 1.0 / 5f64.sqrt(), none);
        assert_close_tol(&got, &want, 1e-12, &format!("plain {layout:?}"));

        let fm = make(&float_mask, &[4, 6], DType::F64, layout);
        let options =
            AttentionOptions { attn_mask: Some(&fm), scale: Some(0.25), ..Default::default() };
        let got = F::scaled_dot_product_attention_with(&q, &k, &v, options).to_vec::<f64>();
        let add: MaskFn<'_> = &|_, i, j| float_mask[i * 6 + j];
        let want = reference((&qd, &qs), (&kd, &ks), (&vd, &vs), &[2, 3], 0.25, add);
        assert_close_tol(&got, &want, 1e-12, &format!("float mask {layout:?}"));

        let bm = Tensor::from_vec(bool_mask.clone(), [2, 1, 4, 6]);
        let got = F::scaled_dot_product_attention(&q, &k, &v, Some(&bm), false).to_vec::<f64>();
        let block: MaskFn<'_> =
            &|b, i, j| if bool_mask[b[0] * 24 + i * 6 + j] { 0.0 } else { f64::NEG_INFINITY };
        let want = reference((&qd, &qs), (&kd, &ks), (&vd, &vs), &[2, 3], 1.0 / 5f64.sqrt(), block);
        assert_close_tol(&got, &want, 1e-12, &format!("bool mask {layout:?}"));

        // Causal, with fewer queries than keys: query i sees keys 0..=i.
        let got = F::scaled_dot_product_attention(&q, &k, &v, None, true).to_vec::<f64>();
        let causal: MaskFn<'_> = &|_, i, j| if j <= i { 0.0 } else { f64::NEG_INFINITY };
        let want =
            reference((&qd, &qs), (&kd, &ks), (&vd, &vs), &[2, 3], 1.0 / 5f64.sqrt(), causal);
        assert_close_tol(&got, &want, 1e-12, &format!("causal {layout:?}"));
    }
}

/// A padding mask `[batch, 1, 1, keys]` (the same row for every query, as BERT's) over more
/// than one tile of queries and keys, one key tile hidden whole in one entry: against the
/// loop, in f32 and f64.
#[test]
fn a_padding_mask_broadcast_over_queries_matches_the_loop() {
    let mut rng = Rng::new(403);
    let (qs, ks) = ([2usize, 2, 70, 8], [2usize, 2, 130, 8]);
    let data = |rng: &mut Rng, s: &[usize]| values(rng, s.iter().product(), DType::F64);
    let (qd, kd, vd) = (data(&mut rng, &qs), data(&mut rng, &ks), data(&mut rng, &ks));
    // Entry 0 sees its first 61 keys, entry 1 all but keys 3 and 100.
    let keep: Vec<bool> =
        (0..2 * 130).map(|i| if i < 130 { i < 61 } else { !matches!(i - 130, 3 | 100) }).collect();
    let block: MaskFn<'_> = &|b, _, j| if keep[b[0] * 130 + j] { 0.0 } else { f64::NEG_INFINITY };
    let want = reference((&qd, &qs), (&kd, &ks), (&vd, &ks), &[2, 2], 1.0 / 8f64.sqrt(), block);
    for dtype in [DType::F64, DType::F32] {
        let (q, k, v) = (
            make(&qd, &qs, dtype, LAYOUTS[0]),
            make(&kd, &ks, dtype, LAYOUTS[0]),
            make(&vd, &ks, dtype, LAYOUTS[0]),
        );
        let mask = Tensor::from_vec(keep.clone(), [2, 1, 1, 130]);
        let got = F::scaled_dot_product_attention(&q, &k, &v, Some(&mask), false).to_vec::<f64>();
        let tol = if dtype == DType::F64 { 1e-12 } else { 1e-5 };
        assert_close_tol(&got, &want, tol, &format!("padding mask {dtype:?}"));
    }
}

#[test]
fn attention_passes_gradcheck() {
    let mut rng = Rng::new(402);
    let mk = |rng: &mut Rng, s: &[usize], layout| {
        make(&values(rng, s.iter().product(), DType::F64), s, DType::F64, layout)
    };
    let q = mk(&mut rng, &[2, 3, 4], Layout::Permuted);
    let k = mk(&mut rng, &[1, 5, 4], Layout::Sliced);
    let v = mk(&mut rng, &[2, 5, 3], Layout::Contiguous);
    let mask = mk(&mut rng, &[3, 5], Layout::Contiguous);
    let inputs = [q, k, v];
    gradcheck(
        |t| F::scaled_dot_product_attention(&t[0], &t[1], &t[2], Some(&mask), false),
        &inputs,
        1e-6,
        1e-6,
    )
    .unwrap();
    gradcheck(
        |t| F::scaled_dot_product_attention(&t[0], &t[1], &t[2], None, true),
        &inputs,
        1e-6,
        1e-6,
    )
    .unwrap();
}

#[test]
fn attention_errors_name_the_shapes_and_the_fix() {
    let (q, k) = (Tensor::zeros([2, 4, 5]), Tensor::zeros([2, 6, 3]));
    let err = F::try_scaled_dot_product_attention_with(&q, &k, &k, AttentionOptions::default())
        .unwrap_err();
    assert!(err.to_string().contains("[2, 4, 5]") && err.to_string().contains("feature"), "{err}");
    let k = Tensor::zeros([2, 6, 5]);
    let m = Tensor::ones([4, 6]);
    let both = AttentionOptions { attn_mask: Some(&m), is_causal: true, ..Default::default() };
    let err = F::try_scaled_dot_product_attention_with(&q, &k, &k, both).unwrap_err();
    assert!(err.to_string().contains("not both"), "{err}");
    let int_mask = Tensor::ones([4, 6]).long();
    let bad = AttentionOptions { attn_mask: Some(&int_mask), ..Default::default() };
    assert!(F::try_scaled_dot_product_attention_with(&q, &k, &k, bad).is_err());
    assert!(MultiheadAttention::try_new(10, 3, 0.0, true).is_err());
    let mha = MultiheadAttention::new(6, 2);
    let err = mha.try_attend(&Tensor::zeros([2, 3, 5]), &k, &k, None, None, false).unwrap_err();
    assert!(err.to_string().contains("[B, L, 6]"), "{err}");
}

#[test]
fn a_padded_key_is_the_same_as_a_missing_key() {
    kiln::manual_seed(3);
    let mha = MultiheadAttention::new(8, 2);
    let (q, kv) = (Tensor::randn([2, 3, 8]), Tensor::randn([2, 5, 8]));
    let pad = Tensor::from_vec(
        vec![false, false, false, false, true, false, false, false, false, true],
        [2, 5],
    );
    let padded = mha.attend(&q, &kv, &kv, None, Some(&pad), false).to_vec::<f32>();
    let short = kv.narrow(1, 0, 4);
    let missing = mha.attend(&q, &short, &short, None, None, false).to_vec::<f32>();
    assert_close_tol(
        &padded.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(),
        &missing.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(),
        1e-6,
        "key padding",
    );
    let unbatched = mha.forward(&q.narrow(0, 0, 1).squeeze(0));
    assert_eq!(unbatched.dims(), [3, 8]);
    let names: Vec<String> = mha.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"]);
}

fn fixture() -> HashMap<String, Tensor> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/torch_transformer.safetensors");
    kiln::serialize::load(&path).expect("the fixture file").into_iter().collect()
}

#[test]
fn attention_agrees_with_pytorch_float64() {
    let file = fixture();
    let get =
        |name: &str| file.get(name).unwrap_or_else(|| panic!("{name} is in the fixture")).clone();
    let (float_mask, bool_mask) = (get("sdpa_float.mask"), get("sdpa_bool.mask"));
    type Op<'a> = Box<dyn Fn(&[Tensor]) -> Tensor + 'a>;
    let cases: Vec<(&str, Op<'_>)> = vec![
        (
            "sdpa_plain",
            Box::new(|i| F::scaled_dot_product_attention(&i[0], &i[1], &i[2], None, false)),
        ),
        (
            "sdpa_float",
            Box::new(|i| {
                let o = AttentionOptions {
                    attn_mask: Some(&float_mask),
                    scale: Some(0.3),
                    ..Default::default()
                };
                F::scaled_dot_product_attention_with(&i[0], &i[1], &i[2], o)
            }),
        ),
        (
            "sdpa_bool",
            Box::new(|i| {
                F::scaled_dot_product_attention(&i[0], &i[1], &i[2], Some(&bool_mask), false)
            }),
        ),
        (
            "sdpa_causal",
            Box::new(|i| F::scaled_dot_product_attention(&i[0], &i[1], &i[2], None, true)),
        ),
    ];
    for (name, op) in cases {
        let inputs: Vec<Tensor> =
            (0..3).map(|i| get(&format!("{name}.in{i}")).requires_grad_(true)).collect();
        let y = op(&inputs);
        assert_close_tol(
            &y.to_vec::<f64>(),
            &get(&format!("{name}.out")).to_vec::<f64>(),
            1e-12,
            name,
        );
        let refs: Vec<&Tensor> = inputs.iter().collect();
        let grads = kiln::grad(&[&(&y * &get(&format!("{name}.r"))).sum()], &refs, false);
        for (i, g) in grads.iter().enumerate() {
            let want = get(&format!("{name}.grad{i}")).to_vec::<f64>();
            assert_close_tol(&g.to_vec::<f64>(), &want, 1e-12, &format!("{name} grad {i}"));
        }
    }
}

struct Block {
    ln1: LayerNorm,
    attn: MultiheadAttention,
    ln2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

kiln::parameters!(Block { ln1, attn, ln2, fc1, fc2 });

impl Block {
    fn forward(&self, x: &Tensor, causal: &Tensor) -> Tensor {
        let h = self.ln1.forward(x);
        let x = x + self.attn.attend(&h, &h, &h, Some(causal), None, false);
        &x + self.fc2.forward(&self.fc1.forward(&self.ln2.forward(&x)).gelu_tanh())
    }
}

#[test]
fn a_pre_norm_transformer_block_agrees_with_pytorch_float64() {
    let file = fixture();
    let get =
        |name: &str| file.get(name).unwrap_or_else(|| panic!("{name} is in the fixture")).clone();
    let (e, t) = (8, 5);
    let mut block = Block {
        ln1: LayerNorm::new(&[e]),
        attn: MultiheadAttention::new(e, 2),
        ln2: LayerNorm::new(&[e]),
        fc1: Linear::new(e, 4 * e),
        fc2: Linear::new(4 * e, e),
    };
    // PyTorch's weights, by PyTorch's names.
    block.visit_mut("", &mut |name, p| {
        *p = get(&format!("block.param.{name}")).requires_grad_(true);
    });
    let causal: Vec<bool> = (0..t * t).map(|i| i % t > i / t).collect();
    let causal = Tensor::from_vec(causal, [t, t]);
    let x = get("block.x").requires_grad_(true);
    let y = block.forward(&x, &causal);
    assert_close_tol(&y.to_vec::<f64>(), &get("block.out").to_vec::<f64>(), 1e-12, "block output");
    (&y * &get("block.r")).sum().backward();
    let gx = x.grad().expect("x's gradient").to_vec::<f64>();
    assert_close_tol(&gx, &get("block.grad_x").to_vec::<f64>(), 1e-11, "block grad x");
    let named = block.named_parameters();
    assert_eq!(named.len(), 12);
    for (name, p) in named {
        let g = p.grad().unwrap_or_else(|| panic!("{name} has a gradient")).to_vec::<f64>();
        assert_close_tol(&g, &get(&format!("block.grad.{name}")).to_vec::<f64>(), 1e-11, &name);
    }
}

#[test]
fn fused_attention_matches_the_composite_path_in_every_dtype() {
    let mut rng = Rng::new(403);
    // One batch entry takes the backward's tile passes, two its pass per entry.
    // 16-bit operands go entry by entry with enough entries, widened whole with one.
    for (dtype, n) in [
        (DType::F32, 2),
        (DType::F64, 2),
        (DType::BF16, 2),
        (DType::F16, 2),
        (DType::BF16, 1),
        (DType::F64, 1),
    ] {
        for causal in [false, true] {
            // Odd sizes across tile edges: 70 queries, 131 keys.
            let (qs, ks, vs) = ([n, 70, 12], [n, 131, 12], [n, 131, 5]);
            let data: Vec<Vec<f64>> = [&qs[..], &ks, &vs]
                .iter()
                .map(|s| {
                    values(&mut rng, s.iter().product(), DType::F64)
                        .iter()
                        .map(|&v| round_to(dtype, v))
                        .collect()
                })
                .collect();
            let shapes = [&qs[..], &ks, &vs];
            let mk = |d: DType| -> Vec<Tensor> {
                data.iter().zip(shapes).map(|(x, s)| tensor(x, s, d).requires_grad_(true)).collect()
            };
            // The fused op in `dtype` against the composite path in f64 on the same values.
            let (low, high) = (mk(dtype), mk(DType::F64));
            let fused = F::scaled_dot_product_attention(&low[0], &low[1], &low[2], None, causal);
            let mask = if causal {
                Tensor::from_vec(
                    (0..70 * 131).map(|i| i % 131 <= i / 131).collect::<Vec<_>>(),
                    [70, 131],
                )
            } else {
                Tensor::ones([70, 131]).bool()
            };
            let composite =
                F::scaled_dot_product_attention(&high[0], &high[1], &high[2], Some(&mask), false);
            let tol = match dtype {
                DType::F64 => 1e-12,
                DType::F32 => 2e-5,
                _ => 2e-2,
            };
            let ctx = format!("{dtype:?} n {n} causal {causal}");
            assert_close_tol(&read(&fused, dtype), &composite.to_vec::<f64>(), tol, &ctx);
            let r: Vec<f64> = values(&mut rng, n * 70 * 5, DType::F64)
                .iter()
                .map(|&v| round_to(dtype, v))
                .collect();
            let gf = kiln::grad(
                &[&(&fused * &tensor(&r, &[n, 70, 5], dtype)).sum()],
                &low.iter().collect::<Vec<_>>(),
                false,
            );
            let gc = kiln::grad(
                &[&(&composite * &tensor(&r, &[n, 70, 5], DType::F64)).sum()],
                &high.iter().collect::<Vec<_>>(),
                false,
            );
            for (i, (a, b)) in gf.iter().zip(&gc).enumerate() {
                assert_close_tol(
                    &read(a, dtype),
                    &b.to_vec::<f64>(),
                    tol * 4.0,
                    &format!("{ctx} grad {i}"),
                );
            }
        }
    }
}

/// q, k and v as a transformer block makes them: heads split out of one `[B, T, 3·C]`
/// projection by `narrow`, `reshape` and `transpose`.
fn heads(qkv: &Tensor, heads: i64) -> [Tensor; 3] {
    let (b, t, c) = (qkv.dims()[0] as i64, qkv.dims()[1] as i64, qkv.dims()[2] as i64 / 3);
    let head = |i: i64| {
        qkv.narrow(2, (i * c) as usize, c as usize)
            .reshape(&[b, t, heads, c / heads])
            .transpose(1, 2)
    };
    [head(0), head(1), head(2)]
}

#[test]
fn attention_reads_the_heads_of_a_projection_in_place() {
    let mut rng = Rng::new(404);
    // 16-bit operands go entry by entry with 8 batch entries and are widened whole with
    // one; 70 queries span two tiles.
    for (dtype, b, t, h) in [
        (DType::F32, 2, 70, 4),
        (DType::F64, 1, 70, 4),
        (DType::BF16, 2, 33, 4),
        (DType::F16, 1, 70, 1),
    ] {
        let c = 24;
        let data: Vec<f64> = values(&mut rng, b * t * 3 * c, DType::F64)
            .iter()
            .map(|&v| round_to(dtype, v))
            .collect();
        let r: Vec<f64> =
            values(&mut rng, b * t * c, DType::F64).iter().map(|&v| round_to(dtype, v)).collect();
        let shape = [b, t, 3 * c];
        let (low, high) = (tensor(&data, &shape, dtype), tensor(&data, &shape, DType::F64));
        low.realize();
        let [q, k, v] = heads(&low, h as i64);
        let ((), profile) = kiln::profile(|| {
            F::scaled_dot_product_attention(&q, &k, &v, None, true).realize();
        });
        let steps: Vec<String> = profile.kernels().iter().map(|k| k.name.clone()).collect();
        assert_eq!(steps, ["attention"], "{dtype:?}: no copy of the heads before attention");

        let (low, high) = (low.requires_grad_(true), high.requires_grad_(true));
        let y = |x: &Tensor, fused: bool| {
            let [q, k, v] = heads(x, h as i64);
            let keep: Vec<bool> = (0..t * t).map(|i| i % t <= i / t).collect();
            let mask = Tensor::from_vec(keep, [t, t]);
            let y = if fused {
                F::scaled_dot_product_attention(&q, &k, &v, None, true)
            } else {
                F::scaled_dot_product_attention(&q, &k, &v, Some(&mask), false)
            };
            y.transpose(1, 2).reshape(&[b as i64, t as i64, c as i64])
        };
        let (fused, composite) = (y(&low, true), y(&high, false));
        let tol = match dtype {
            DType::F64 => 1e-12,
            DType::F32 => 2e-5,
            _ => 2e-2,
        };
        let ctx = format!("{dtype:?} b {b}");
        assert_close_tol(&read(&fused, dtype), &composite.to_vec::<f64>(), tol, &ctx);
        let weighted = |y: &Tensor, d: DType| (y * &tensor(&r, &[b, t, c], d)).sum();
        let (gf, profile) = kiln::profile(|| {
            let g = kiln::grad(&[&weighted(&fused, dtype)], &[&low], false).remove(0);
            g.realize();
            g
        });
        // The gradients of the heads go from attention's packed result straight into the
        // projection's gradient: no copy of them in between.
        let copies: Vec<String> = profile
            .kernels()
            .iter()
            .filter(|k| k.ops == "view")
            .map(|k| format!("{} {}", k.name, k.cut))
            .collect();
        assert!(copies.is_empty(), "{dtype:?}: {copies:?}");
        let gc = kiln::grad(&[&weighted(&composite, DType::F64)], &[&high], false).remove(0);
        assert_close_tol(&read(&gf, dtype), &gc.to_vec::<f64>(), tol * 4.0, &format!("{ctx} grad"));
    }
}

#[test]
fn the_profile_names_the_path_and_long_contexts_never_store_the_score_matrix() {
    kiln::manual_seed(4);
    let (t, e) = (2048usize, 32usize);
    let q = Tensor::randn([1, 2, t, e]).requires_grad_(true);
    let (k, v) = (
        Tensor::randn([1, 2, t, e]).requires_grad_(true),
        Tensor::randn([1, 2, t, e]).requires_grad_(true),
    );
    for x in [&q, &k, &v] {
        x.realize();
    }
    let ((), profile) = kiln::profile(|| {
        let y = F::scaled_dot_product_attention(&q, &k, &v, None, true);
        let grads = kiln::grad(&[&y.square().sum()], &[&q, &k, &v], false);
        Tensor::try_realize_all(&grads.iter().collect::<Vec<_>>()).unwrap();
    });
    let names: Vec<String> = profile.kernels().iter().map(|k| k.name.clone()).collect();
    assert!(
        names.iter().any(|n| n == "attention") && names.iter().any(|n| n == "attention_grad"),
        "{names:?}"
    );
    assert!(!names.iter().any(|n| n == "matmul"), "{names:?}");
    let scores = (2 * t * t * 4) as u64; // the 2 heads' 2048² f32 score matrices
    let peak = profile.peak_memory().peak_bytes;
    assert!(peak < scores / 4, "peak {peak} bytes; the score matrices alone are {scores}");

    // With a mask, the composite path: products and a stored score matrix.
    let (qs, ks) = (q.narrow(2, 0, 64), k.narrow(2, 0, 64));
    let mask = Tensor::zeros([64, 64]);
    let (_, profile) = kiln::profile(|| {
        F::scaled_dot_product_attention(&qs, &ks, &ks, Some(&mask), false).realize().clone()
    });
    assert!(profile.kernels().iter().any(|k| k.name == "matmul"));
}

#[test]
fn gradients_of_gradients_through_fused_attention_are_an_error_that_names_the_fix() {
    let q = Tensor::randn([1, 4, 8]).double().requires_grad_(true);
    let y = F::scaled_dot_product_attention(&q, &q, &q, None, false).sum();
    let g = kiln::grad(&[&y], &[&q], true).remove(0);
    let err = kiln::try_grad(&[&g.sum()], &[&q], false).unwrap_err().to_string();
    assert!(err.contains("attn_mask"), "{err}");
    // The composite path (a zero float mask) differentiates twice.
    let zero = Tensor::zeros([4, 4]).double();
    let y = F::scaled_dot_product_attention(&q, &q, &q, Some(&zero), false).sum();
    let g = kiln::grad(&[&y], &[&q], true).remove(0);
    assert!(kiln::try_grad(&[&g.sum()], &[&q], false).is_ok());
}

device_test!(
    fused_attention_matches_the_reference,
    super::fused_attention_matches_the_reference_on
);

/// Fused attention and its gradients on `device` in every float dtype, unmasked, causal from
/// either corner or with a given bool mask (one query seeing no key), with rows longer than a
/// warp, against the reference executor; they run as the device's own library steps, not
/// host copies.
fn fused_attention_matches_the_reference_on(device: Device) {
    use kiln::nn::functional::{self as F, CausalVariant};
    let mut rng = Rng::new(810);
    let given = Tensor::from_vec(
        (0..2 * 9 * 11)
            .map(|x| x / 11 != 4 && (x % 11 == x / 11 % 9 || x % 3 != 0))
            .collect::<Vec<_>>(),
        [2, 9, 11],
    );
    let masks = [
        AttentionOptions::default(),
        AttentionOptions { is_causal: true, ..Default::default() },
        AttentionOptions {
            is_causal: true,
            causal_variant: CausalVariant::LowerRight,
            ..Default::default()
        },
        AttentionOptions { attn_mask: Some(&given), ..Default::default() },
    ];
    // Every float dtype (16-bit ones widened on the device and rounded once, as on the CPU),
    // and rows longer than a warp's 32 lanes (e = 40, ev = 70).
    for (dtype, mask, tol, [e, ev]) in [
        (DType::F64, 1, 1e-12, [4, 3]),
        (DType::F64, 0, 1e-12, [40, 70]),
        (DType::F64, 2, 1e-12, [40, 3]),
        (DType::F64, 3, 1e-12, [4, 70]),
        (DType::F32, 1, 2e-5, [4, 3]),
        (DType::F32, 3, 2e-5, [4, 3]),
        // Dot products of 40 and 70 terms summed in another order; `dp - D` cancels.
        (DType::F32, 1, 2e-4, [40, 70]),
        (DType::F16, 0, 4e-3, [40, 3]),
        (DType::BF16, 1, 3e-2, [4, 70]),
        (DType::BF16, 3, 3e-2, [4, 70]),
    ] {
        let q = tensor(&values(&mut rng, 2 * 9 * e, DType::F64), &[2, 9, e], dtype);
        let k = tensor(&values(&mut rng, 2 * 11 * e, DType::F64), &[2, 11, e], dtype);
        let v = tensor(&values(&mut rng, 2 * 11 * ev, DType::F64), &[2, 11, ev], dtype);
        let options = masks[mask];
        let run = |q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>| {
            let (q, k, v) =
                (q.requires_grad_(true), k.requires_grad_(true), v.requires_grad_(true));
            let options = AttentionOptions { attn_mask: mask, ..options };
            let y = F::scaled_dot_product_attention_with(&q, &k, &v, options);
            let g = kiln::grad(&[&y.square().sum()], &[&q, &k, &v], false);
            [y.to_vec::<f64>(), g[0].to_vec::<f64>(), g[1].to_vec::<f64>(), g[2].to_vec::<f64>()]
        };
        let causal = format!("{options:?}");
        let want =
            kiln::with_execution(kiln::Execution::Reference, || run(&q, &k, &v, options.attn_mask));
        let (qg, kg, vg) = (q.to(device).detach(), k.to(device).detach(), v.to(device).detach());
        let mask = options.attn_mask.map(|m| m.to(device));
        let (got, profile) = kiln::profile(|| run(&qg, &kg, &vg, mask.as_ref()));
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_close_tol(g, w, tol, &format!("{dtype:?} {causal} part {i}"));
        }
        // The device's own kernels, not host copies.
        let kernels = profile.kernels();
        let attention: Vec<_> =
            kernels.iter().filter(|k| k.name.starts_with("attention")).collect();
        assert_eq!(attention.len(), 2, "attention and attention_grad");
        for k in attention {
            assert_eq!(k.kind, kiln::StepKind::Library, "{}", k.name);
        }
    }
}

/// A bool mask `[2, 1, l, s]` with query 5 of the first entry seeing no key and keys
/// 64..128 hidden from every query (a whole key tile the fused kernel skips).
fn holey_mask(rng: &mut Rng, l: usize, s: usize) -> Vec<bool> {
    (0..2 * l * s)
        .map(|x| {
            let (b, i, j) = (x / (l * s), x / s % l, x % s);
            let hidden = (b == 0 && i == 5) || (64..128).contains(&j);
            !hidden && (j == i % s || rng.uniform(0.0, 1.0) > 0.3)
        })
        .collect()
}

/// The same mask as an additive float one (0 or -inf), which takes the composite path.
fn additive(mask: &Tensor) -> Tensor {
    Tensor::where_(mask, Tensor::zeros(mask.dims()).double(), f64::NEG_INFINITY)
}

#[test]
fn fused_masks_and_the_lower_right_triangle_match_the_composite_path() {
    let mut rng = Rng::new(404);
    let (l, s) = (70, 131);
    let mk = |rng: &mut Rng, dims: &[usize], layout| {
        make(&values(rng, dims.iter().product(), DType::F64), dims, DType::F64, layout)
    };
    let mask = Tensor::from_vec(holey_mask(&mut rng, l, s), [2, 1, l, s]);
    let lower_right =
        Tensor::from_vec((0..l * s).map(|x| x % s <= x / s + s - l).collect::<Vec<_>>(), [l, s]);
    for layout in [Layout::Contiguous, Layout::Permuted] {
        let q = mk(&mut rng, &[2, 3, l, 12], layout);
        let (k, v) = (mk(&mut rng, &[2, 3, s, 12], layout), mk(&mut rng, &[2, 1, s, 5], layout));
        let run = |options: AttentionOptions<'_>| {
            let (q, k, v) =
                (q.requires_grad_(true), k.requires_grad_(true), v.requires_grad_(true));
            let (y, profile) = kiln::profile(|| {
                let y = F::scaled_dot_product_attention_with(&q, &k, &v, options);
                y.realize();
                y
            });
            let g = kiln::grad(&[&(y.square().sum())], &[&q, &k, &v], false);
            let fused = profile.kernels().iter().any(|k| k.name.starts_with("attention"));
            let parts = [&y, &g[0], &g[1], &g[2]].map(|t| t.to_vec::<f64>());
            (parts, fused)
        };
        let given = AttentionOptions { attn_mask: Some(&mask), ..Default::default() };
        let float = additive(&mask);
        let composite = AttentionOptions { attn_mask: Some(&float), ..Default::default() };
        let causal = AttentionOptions {
            is_causal: true,
            causal_variant: F::CausalVariant::LowerRight,
            ..Default::default()
        };
        let float_lr = additive(&lower_right);
        let composite_lr = AttentionOptions { attn_mask: Some(&float_lr), ..Default::default() };
        for (name, fast, slow) in
            [("bool mask", given, composite), ("lower right", causal, composite_lr)]
        {
            let ((got, fused), (want, composed)) = (run(fast), run(slow));
            assert!(fused && !composed, "{name}: the fused op, then the composite path");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_close_tol(g, w, 1e-10, &format!("{name} {layout:?} part {i}"));
            }
        }
        // The query that sees no key gives zeros, as PyTorch's, and no gradient.
        let y = F::scaled_dot_product_attention(&q, &k, &v, Some(&mask), false);
        assert!(y.narrow(0, 0, 1).narrow(2, 5, 1).to_vec::<f64>().iter().all(|&x| x == 0.0));
    }
    // The lower-right triangle with more queries than keys: the first queries see none.
    let (q, k) = (
        mk(&mut rng, &[1, 5, 4], Layout::Contiguous),
        mk(&mut rng, &[1, 3, 4], Layout::Contiguous),
    );
    let options = AttentionOptions {
        is_causal: true,
        causal_variant: F::CausalVariant::LowerRight,
        ..Default::default()
    };
    let y = F::scaled_dot_product_attention_with(&q, &k, &k, options).to_vec::<f64>();
    assert!(y[..8].iter().all(|&x| x == 0.0) && y[8..].iter().all(|&x| x != 0.0), "{y:?}");
    // Gradcheck through the fused masked op (no query without keys here).
    let small =
        Tensor::from_vec((0..4 * 7).map(|x| x % 7 != 3 || x % 2 == 0).collect::<Vec<_>>(), [4, 7]);
    let inputs = [
        mk(&mut rng, &[2, 4, 5], Layout::Permuted),
        mk(&mut rng, &[2, 7, 5], Layout::Contiguous),
        mk(&mut rng, &[1, 7, 3], Layout::Sliced),
    ];
    gradcheck(
        |t| F::scaled_dot_product_attention(&t[0], &t[1], &t[2], Some(&small), false),
        &inputs,
        1e-6,
        1e-6,
    )
    .unwrap();
    gradcheck(
        |t| F::scaled_dot_product_attention_with(&t[0], &t[1], &t[2], options),
        &inputs,
        1e-6,
        1e-6,
    )
    .unwrap();
}

#[test]
fn grouped_query_attention_shares_key_heads_without_copying_them() {
    let mut rng = Rng::new(405);
    let mk = |rng: &mut Rng, dims: &[usize]| {
        make(&values(rng, dims.iter().product(), DType::F64), dims, DType::F64, Layout::Contiguous)
    };
    let (q, k, v) =
        (mk(&mut rng, &[2, 6, 9, 8]), mk(&mut rng, &[2, 2, 13, 8]), mk(&mut rng, &[2, 2, 13, 8]));
    // PyTorch's definition: key/value head h / 3 for query head h.
    let widen = |t: &Tensor| t.unsqueeze(2).expand(&[2, 2, 3, 13, 8]).reshape(&[2, 6, 13, 8]);
    let mask = Tensor::from_vec(holey_mask(&mut rng, 9, 13), [2, 1, 9, 13]);
    let per_head = Tensor::from_vec(
        (0..2 * 6 * 9 * 13).map(|x| x % 13 <= x / 13 % 9 + 4 || x % 5 == 0).collect::<Vec<_>>(),
        [2, 6, 9, 13],
    );
    for mask in [None, Some(&mask), Some(&per_head)] {
        for is_causal in [false, mask.is_none()] {
            let options = AttentionOptions {
                attn_mask: mask,
                is_causal,
                causal_variant: F::CausalVariant::LowerRight,
                ..Default::default()
            };
            let want = F::scaled_dot_product_attention_with(&q, &widen(&k), &widen(&v), options);
            let grouped = AttentionOptions { enable_gqa: true, ..options };
            let (got, profile) = kiln::profile(|| {
                let y = F::scaled_dot_product_attention_with(&q, &k, &v, grouped);
                y.realize();
                y
            });
            assert_eq!(got.dims(), [2, 6, 9, 8]);
            assert_close_tol(&got.to_vec::<f64>(), &want.to_vec::<f64>(), 1e-12, "gqa");
            // One attention op, and no kernel that copies the keys into heads.
            let kernels = profile.kernels();
            assert!(
                kernels.iter().all(|k| k.name.starts_with("attention") || k.name.contains("mask")),
                "{kernels:?}"
            );
        }
    }
    let err = F::try_scaled_dot_product_attention_with(
        &mk(&mut rng, &[1, 5, 3, 8]),
        &k,
        &v,
        AttentionOptions { enable_gqa: true, ..Default::default() },
    )
    .unwrap_err();
    assert!(err.to_string().contains("5 query, 2 key"), "{err}");
}

#[test]
fn hidden_trailing_keys_are_not_read() {
    // A decode step over a static cache: one query per head, keys past its position hidden
    // and holding garbage (NaN) that must not be read, in every float dtype.
    kiln::manual_seed(7);
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let q = Tensor::randn([1, 4, 1, 16]).to_dtype(dtype);
        let filled = Tensor::randn([1, 4, 10, 16]).to_dtype(dtype);
        let garbage = Tensor::full([1, 4, 30, 16], f64::NAN).to_dtype(dtype);
        let cache = Tensor::cat(&[&filled, &garbage], 2);
        let mask = Tensor::arange(0i64, 40, 1).lt(10.0).reshape(&[1, 40]);
        let got = F::scaled_dot_product_attention(&q, &cache, &cache, Some(&mask), false);
        let want = F::scaled_dot_product_attention(&q, &filled, &filled, None, false);
        assert_eq!(got.float().to_vec::<f32>(), want.float().to_vec::<f32>(), "{dtype:?}");
    }
}
