//! Recurrent layers against PyTorch: `scripts/torch_fixtures.py` ran `nn.LSTM` (two layers,
//! bidirectional, batch-first), `nn.GRU` and `nn.RNN` (relu, two layers, no bias, one
//! unbatched sequence) in float64 and saved their parameters, inputs, initial states,
//! outputs, final states and every gradient of a random weighting of the outputs
//! (`tests/data/torch_layers.safetensors`). kiln's layers, given the same parameters by
//! name, must agree.

use std::collections::HashMap;

use kiln::nn::{Gru, Lstm, Parameters, RecurrentOptions, Rnn};
use kiln::prelude::*;

use crate::common::*;

fn fixture() -> HashMap<String, Tensor> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/torch_layers.safetensors");
    kiln::serialize::load(&path).expect("the fixture file").into_iter().collect()
}

/// Gives `layer` PyTorch's parameters (by name), as leaves that require gradients.
fn load(layer: &mut impl Parameters, file: &HashMap<String, Tensor>, name: &str) {
    let mut loaded = 0;
    layer.visit_mut("", &mut |n, t| {
        let p = file.get(&format!("{name}.param.{n}")).unwrap_or_else(|| panic!("{name}: no {n}"));
        assert_eq!(t.dims(), p.dims(), "{name}.{n}");
        *t = p.detach().requires_grad_(true);
        loaded += 1;
    });
    assert_eq!(loaded, file.keys().filter(|k| k.starts_with(&format!("{name}.param."))).count());
}

/// The outputs and final states against PyTorch's, then the gradients of the same weighting
/// with respect to the input, the initial states and every parameter.
fn check(
    name: &str,
    file: &HashMap<String, Tensor>,
    layer: &impl Parameters,
    run: impl Fn(&Tensor, &[Tensor]) -> Vec<Tensor>,
    states: usize,
) {
    let get =
        |k: &str| file.get(&format!("{name}.{k}")).unwrap_or_else(|| panic!("{name}.{k}")).clone();
    let x = get("x").requires_grad_(true);
    let init: Vec<Tensor> =
        (0..states).map(|i| get(&format!("state{i}")).requires_grad_(true)).collect();
    let outs = run(&x, &init);
    let want: Vec<Tensor> =
        std::iter::once(get("out")).chain((0..states).map(|i| get(&format!("final{i}")))).collect();
    let weights: Vec<Tensor> = std::iter::once(get("r_out"))
        .chain((0..states).map(|i| get(&format!("r_final{i}"))))
        .collect();
    let mut loss = Tensor::scalar(0.0f64);
    for ((got, want), r) in outs.iter().zip(&want).zip(&weights) {
        assert_close_tol(
            &got.to_vec::<f64>(),
            &want.to_vec::<f64>(),
            1e-10,
            &format!("{name} outputs"),
        );
        loss = loss + (got * r).sum();
    }
    loss.backward();
    assert_close_tol(
        &x.grad().expect("dx").to_vec::<f64>(),
        &get("grad_x").to_vec::<f64>(),
        1e-10,
        &format!("{name} dx"),
    );
    for (i, s) in init.iter().enumerate() {
        let want = get(&format!("grad_state{i}")).to_vec::<f64>();
        assert_close_tol(
            &s.grad().expect("dstate").to_vec::<f64>(),
            &want,
            1e-10,
            &format!("{name} dstate{i}"),
        );
    }
    for (n, p) in layer.named_parameters() {
        let want = get(&format!("grad.{n}")).to_vec::<f64>();
        assert_close_tol(
            &p.grad().expect("dparam").to_vec::<f64>(),
            &want,
            1e-10,
            &format!("{name} d{n}"),
        );
    }
}

#[test]
fn lstm_gru_and_rnn_match_pytorch_outputs_and_gradients() {
    let file = fixture();
    let options = RecurrentOptions {
        num_layers: 2,
        bidirectional: true,
        batch_first: true,
        ..Default::default()
    };
    let mut lstm = Lstm::with_options(5, 6, options);
    load(&mut lstm, &file, "lstm");
    check(
        "lstm",
        &file,
        &lstm,
        |x, s| {
            let (out, (h, c)) = lstm.forward_with(x, Some((&s[0], &s[1])));
            vec![out, h, c]
        },
        2,
    );

    let mut gru = Gru::new(5, 6);
    load(&mut gru, &file, "gru");
    check(
        "gru",
        &file,
        &gru,
        |x, s| {
            let (out, h) = gru.forward_with(x, Some(&s[0]));
            vec![out, h]
        },
        1,
    );

    let options = RecurrentOptions { num_layers: 2, bias: false, ..Default::default() };
    let mut rnn = Rnn::relu(5, 6, options);
    load(&mut rnn, &file, "rnn_relu");
    check(
        "rnn_relu",
        &file,
        &rnn,
        |x, s| {
            let (out, h) = rnn.forward_with(x, Some(&s[0]));
            vec![out, h]
        },
        1,
    );
}

#[test]
fn recurrent_layers_name_their_parameters_as_pytorch_and_check_shapes() {
    let options = RecurrentOptions { num_layers: 2, bidirectional: true, ..Default::default() };
    let names: Vec<String> =
        Gru::with_options(3, 4, options).named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names.len(), 16);
    assert_eq!(&names[..4], ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"]);
    assert_eq!(names[4], "weight_ih_l0_reverse");
    let lstm = Lstm::new(3, 4);
    assert_eq!(lstm.named_parameters()[0].1.dims(), &[16, 3]);
    let m = lstm.try_forward_with(&Tensor::zeros([5, 2, 7]), None).unwrap_err().to_string();
    assert!(
        m.starts_with("LSTM") && m.contains("[seq, batch, 3]") && m.contains("[5, 2, 7]"),
        "{m}"
    );
    let h0 = Tensor::zeros([2, 2, 4]);
    let m =
        lstm.try_forward_with(&Tensor::zeros([5, 2, 3]), Some((&h0, &h0))).unwrap_err().to_string();
    assert!(m.contains("h0 should be [1, 2, 4]") && m.contains("[2, 2, 4]"), "{m}");
    // Trains inside compile(): one plan for the unrolled steps.
    let gru = Gru::new(3, 4);
    let params = gru.parameters();
    let mut opt =
        kiln::optim::Sgd::new(params, kiln::optim::SgdConfig { lr: 0.1, ..Default::default() });
    let x = Tensor::randn([6, 2, 3]);
    let mut step = kiln::compile(|x: &Tensor| {
        opt.zero_grad();
        let loss = gru.forward(x).square().mean();
        loss.backward();
        opt.step();
        loss
    });
    let first = step.call(&x).item::<f32>();
    let mut last = first;
    for _ in 0..20 {
        last = step.call(&x).item::<f32>();
    }
    assert!(last < first, "{first} -> {last}");
    assert_eq!(step.stats().plans, 1, "{:?}", step.stats());
}
