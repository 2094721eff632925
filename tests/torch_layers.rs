//! Layers against PyTorch: `scripts/torch_fixtures.py` ran `nn.TransformerEncoderLayer`
//! (post-norm, GELU, batch-first, a key padding mask; and pre-norm, ReLU, sequence-first, a
//! causal mask), `nn.TransformerDecoderLayer` (a causal target mask and a memory padding
//! mask), 1-D pooling, instance norm and the bilinear layer in float64 with random
//! parameters, and saved the outputs and every gradient of a random weighting of them
//! (`tests/data/torch_layers.safetensors`). kiln's layers, given the parameters by name,
//! must agree. And `gumbel_softmax`'s samples follow their distribution.

use std::collections::HashMap;

use kiln::nn::{
    FeedForward, Masks, Parameters, TransformerDecoderLayer, TransformerEncoderLayer,
    TransformerOptions,
};
use kiln::prelude::*;

use crate::common::*;

fn fixture() -> HashMap<String, Tensor> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/torch_layers.safetensors");
    kiln::serialize::load(&path).expect("the fixture file").into_iter().collect()
}

/// Runs `forward` over the fixture's inputs with PyTorch's parameters loaded into `layer`,
/// and checks the output and the gradients of the inputs (`floats` of them) and parameters.
fn check<L: Parameters>(
    name: &str,
    mut layer: L,
    floats: usize,
    forward: impl Fn(&L, &[Tensor]) -> Tensor,
) {
    let file = fixture();
    let get =
        |k: &str| file.get(&format!("{name}.{k}")).unwrap_or_else(|| panic!("{name}.{k}")).clone();
    let mut count = 0;
    layer.visit_mut("", &mut |n, t| {
        let p = get(&format!("param.{n}"));
        assert_eq!(t.dims(), p.dims(), "{name}.{n}");
        *t = p.requires_grad_(true);
        count += 1;
    });
    assert_eq!(count, file.keys().filter(|k| k.starts_with(&format!("{name}.param."))).count());
    let inputs: Vec<Tensor> = (0..)
        .map_while(|i| file.get(&format!("{name}.in{i}")).cloned())
        .enumerate()
        .map(|(i, t)| if i < floats { t.requires_grad_(true) } else { t })
        .collect();
    let y = forward(&layer, &inputs);
    assert_close_tol(
        &y.to_vec::<f64>(),
        &get("out").to_vec::<f64>(),
        1e-10,
        &format!("{name} output"),
    );
    (&y * &get("r")).sum().backward();
    for (i, x) in inputs.iter().take(floats).enumerate() {
        let want = get(&format!("grad_in{i}")).to_vec::<f64>();
        assert_close_tol(
            &x.grad().expect("an input gradient").to_vec::<f64>(),
            &want,
            1e-10,
            &format!("{name} d input {i}"),
        );
    }
    for (n, p) in layer.named_parameters() {
        let want = get(&format!("grad.{n}")).to_vec::<f64>();
        assert_close_tol(
            &p.grad().expect("a parameter gradient").to_vec::<f64>(),
            &want,
            1e-10,
            &format!("{name} d{n}"),
        );
    }
}

#[test]
fn encoder_and_decoder_layers_match_pytorch() {
    let options = TransformerOptions {
        dim_feedforward: 16,
        dropout: 0.0,
        activation: FeedForward::Gelu,
        batch_first: true,
        ..Default::default()
    };
    check("encoder", TransformerEncoderLayer::with_options(8, 2, options), 1, |l, x| {
        let masks = Masks { key_padding_mask: Some(&x[1]), ..Default::default() };
        l.try_forward_with(&x[0], masks).unwrap()
    });
    let options = TransformerOptions {
        dim_feedforward: 16,
        dropout: 0.0,
        norm_first: true,
        ..Default::default()
    };
    check("encoder_prenorm", TransformerEncoderLayer::with_options(8, 2, options), 1, |l, x| {
        let masks = Masks { attn_mask: Some(&x[1]), ..Default::default() };
        l.try_forward_with(&x[0], masks).unwrap()
    });
    let options = TransformerOptions {
        dim_feedforward: 16,
        dropout: 0.0,
        batch_first: true,
        ..Default::default()
    };
    check("decoder", TransformerDecoderLayer::with_options(8, 2, options), 2, |l, x| {
        let tgt = Masks { attn_mask: Some(&x[2]), ..Default::default() };
        let memory = Masks { key_padding_mask: Some(&x[3]), ..Default::default() };
        l.forward_with(&x[0], &x[1], tgt, memory)
    });
}

#[test]
fn transformer_layers_name_parameters_as_pytorch() {
    let names: Vec<String> =
        TransformerDecoderLayer::new(8, 2).named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "self_attn.in_proj_weight",
            "self_attn.in_proj_bias",
            "self_attn.out_proj.weight",
            "self_attn.out_proj.bias",
            "multihead_attn.in_proj_weight",
            "multihead_attn.in_proj_bias",
            "multihead_attn.out_proj.weight",
            "multihead_attn.out_proj.bias",
            "linear1.weight",
            "linear1.bias",
            "linear2.weight",
            "linear2.bias",
            "norm1.weight",
            "norm1.bias",
            "norm2.weight",
            "norm2.bias",
            "norm3.weight",
            "norm3.bias",
        ]
    );
    let m = TransformerEncoderLayer::try_with_options(10, 3, TransformerOptions::default())
        .unwrap_err();
    assert!(m.to_string().contains("num_heads"), "{m}");
}

/// A fixture op's output and input gradients (`scripts/torch_fixtures.py`'s `case`).
fn check_case(name: &str, op: &dyn Fn(&[Tensor]) -> Tensor) {
    let file = fixture();
    let get =
        |k: &str| file.get(&format!("{name}.{k}")).unwrap_or_else(|| panic!("{name}.{k}")).clone();
    let inputs: Vec<Tensor> = (0..)
        .map_while(|i| file.get(&format!("{name}.in{i}")).map(|t| t.requires_grad_(true)))
        .collect();
    let y = op(&inputs);
    assert_close_tol(
        &y.to_vec::<f64>(),
        &get("out").to_vec::<f64>(),
        1e-10,
        &format!("{name} output"),
    );
    (&y * &get("r")).sum().backward();
    for (i, x) in inputs.iter().enumerate() {
        let want = get(&format!("grad{i}")).to_vec::<f64>();
        assert_close_tol(
            &x.grad().expect("a gradient").to_vec::<f64>(),
            &want,
            1e-10,
            &format!("{name} grad {i}"),
        );
    }
}

#[test]
fn sequence_pooling_instance_norm_and_bilinear_match_pytorch() {
    use kiln::nn::functional::{self as F, Pool1dOptions};
    let max = Pool1dOptions {
        stride: Some(2),
        padding: 1,
        dilation: 2,
        ceil_mode: true,
        ..Pool1dOptions::new(3)
    };
    check_case("max_pool1d", &|i| F::max_pool1d(&i[0], max));
    let avg = Pool1dOptions {
        stride: Some(3),
        padding: 2,
        ceil_mode: true,
        count_include_pad: false,
        ..Pool1dOptions::new(4)
    };
    check_case("avg_pool1d", &|i| F::avg_pool1d(&i[0], avg));
    check_case("adaptive_avg_pool1d", &|i| F::adaptive_avg_pool1d(&i[0], 4));
    check_case("instance_norm", &|i| F::instance_norm(&i[0], Some(&i[1]), Some(&i[2]), 1e-5));
    check_case("bilinear", &|i| F::bilinear(&i[0], &i[1], &i[2], Some(&i[3])));
}

#[test]
fn gumbel_softmax_samples_and_passes_gradients_straight_through() {
    use kiln::nn::functional::gumbel_softmax;
    kiln::manual_seed(3);
    let logits =
        Tensor::from_vec(vec![2.0f64, 0.0, -1.0, 0.5], [1, 4]).expand(&[4000, 4]).contiguous();
    let hard = gumbel_softmax(&logits, 1.0, true, -1);
    let counts = hard.sum_dim(0, false).to_vec::<f64>();
    // Gumbel-max sampling draws category k with probability softmax(logits)_k.
    let p = [2.0f64, 0.0, -1.0, 0.5].map(f64::exp);
    let total: f64 = p.iter().sum();
    for (k, c) in counts.iter().enumerate() {
        let want = 4000.0 * p[k] / total;
        assert!(
            (c - want).abs() < 4.0 * want.sqrt() + 5.0,
            "category {k}: {c} draws, about {want} expected"
        );
    }
    assert!(hard.to_vec::<f64>().iter().all(|&v| v == 0.0 || v == 1.0));
    let x = Tensor::randn([3, 5]).double().requires_grad_(true);
    let soft = gumbel_softmax(&x, 0.5, false, 1);
    let rows = soft.sum_dim(1, false).to_vec::<f64>();
    assert!(rows.iter().all(|r| (r - 1.0).abs() < 1e-12), "{rows:?}");
    gumbel_softmax(&x, 0.5, true, 1).square().sum().backward();
    assert!(
        x.grad().is_some_and(|g| g.abs().sum().item::<f64>() > 0.0),
        "the soft sample's gradient"
    );
    let m = kiln::nn::functional::try_gumbel_softmax(&x, 0.0, false, 1).unwrap_err().to_string();
    assert!(m.starts_with("gumbel_softmax") && m.contains("tau"), "{m}");
}

#[test]
fn affine_grid_and_grid_sample_match_pytorch() {
    use kiln::nn::functional as F;
    // The fixture names them as Python prints the flag.
    for (ac, py) in [(false, "False"), (true, "True")] {
        check_case(&format!("affine_grid_{py}"), &|i| F::affine_grid(&i[0], [2, 3, 4, 5], ac));
        check_case(&format!("grid_sample_{py}"), &|i| F::grid_sample(&i[0], &i[1], ac));
    }
}

#[test]
fn embedding_bags_match_pytorch() {
    use kiln::nn::BagMode;
    use kiln::nn::functional as F;
    let file = fixture();
    let (ids, offsets) = (file["embedding_bag.ids"].clone(), file["embedding_bag.offsets"].clone());
    for (name, mode) in [("sum", BagMode::Sum), ("mean", BagMode::Mean), ("max", BagMode::Max)] {
        check_case(&format!("embedding_bag_{name}"), &|i| {
            F::embedding_bag(&ids, &i[0], Some(&offsets), mode, None)
        });
    }
    check_case("embedding_bag_weighted", &|i| {
        F::embedding_bag(&ids, &i[0], Some(&offsets), BagMode::Sum, Some(&i[1]))
    });
    let fixed = file["embedding_bag_2d.ids"].clone();
    check_case("embedding_bag_2d", &|i| F::embedding_bag(&fixed, &i[0], None, BagMode::Mean, None));
    let m = F::try_embedding_bag(&ids, &file["embedding_bag_sum.in0"], None, BagMode::Sum, None)
        .unwrap_err()
        .to_string();
    assert!(m.starts_with("embedding_bag") && m.contains("offsets"), "{m}");
}

#[test]
fn conv_transpose1d_matches_pytorch() {
    use kiln::nn::functional::{self as F, ConvTranspose1dOptions};
    let o =
        ConvTranspose1dOptions { stride: 3, padding: 1, output_padding: 1, groups: 2, dilation: 2 };
    check_case("conv_transpose1d", &|i| F::conv_transpose1d(&i[0], &i[1], Some(&i[2]), o));
}

#[test]
fn the_whole_transformer_matches_pytorch() {
    use kiln::nn::Transformer;
    let options = TransformerOptions { dim_feedforward: 16, dropout: 0.0, ..Default::default() };
    check("transformer", Transformer::new(8, 2, 2, 1, options), 2, |m, x| {
        let causal = Masks { attn_mask: Some(&x[2]), ..Default::default() };
        m.forward_with(&x[0], &x[1], Masks::default(), causal, Masks::default())
    });
}
