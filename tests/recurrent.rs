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

/// Padded batches with lengths (PyTorch's `pack_padded_sequence`, unpacked): each sequence's
/// outputs and final states are those of the sequence run alone at its own length (both
/// directions, two layers), zeros past it, and the padding gets no gradient.
#[test]
fn padded_sequences_with_lengths_run_as_each_sequence_alone() {
    kiln::manual_seed(5);
    let options = RecurrentOptions { num_layers: 2, bidirectional: true, ..Default::default() };
    let lstm = Lstm::with_options(3, 4, options);
    let lengths = [6usize, 2, 4];
    let x = Tensor::randn([6, 3, 3]).requires_grad_(true);
    let (out, (h, c)) = lstm.forward_padded(&x, None, &lengths);
    for (b, &len) in lengths.iter().enumerate() {
        let alone = x.narrow(0, 0, len).narrow(1, b, 1);
        let (o, (hb, cb)) = lstm.forward_with(&alone, None);
        let got = out.narrow(0, 0, len).narrow(1, b, 1);
        assert_close_tol(&got.to_vec::<f64>(), &o.to_vec::<f64>(), 1e-5, "outputs");
        assert_close_tol(&h.narrow(1, b, 1).to_vec::<f64>(), &hb.to_vec::<f64>(), 1e-5, "h");
        assert_close_tol(&c.narrow(1, b, 1).to_vec::<f64>(), &cb.to_vec::<f64>(), 1e-5, "c");
        if len < 6 {
            let past = out.narrow(0, len, 6 - len).narrow(1, b, 1);
            assert_eq!(past.abs().sum().item::<f32>(), 0.0, "zeros past the length");
        }
    }
    (out.sum() + h.sum()).backward();
    let g = x.grad().expect("a gradient");
    assert_eq!(g.narrow(0, 2, 4).narrow(1, 1, 1).abs().sum().item::<f32>(), 0.0, "padding");
    assert!(g.narrow(0, 0, 2).narrow(1, 1, 1).abs().sum().item::<f32>() > 0.0);
    let gru = Gru::new(3, 4);
    let (_, hg) = gru.forward_padded(&x.detach(), None, &lengths);
    let (_, alone) = gru.forward_with(&x.detach().narrow(0, 0, 2).narrow(1, 1, 1), None);
    assert_close_tol(&hg.narrow(1, 1, 1).to_vec::<f64>(), &alone.to_vec::<f64>(), 1e-6, "GRU");
    let err = lstm.try_forward_padded(&x, None, Some(&[7, 1, 1])).expect_err("a length past 6");
    assert!(err.to_string().contains("LSTM"), "{err}");
}

/// Dropout between layers (PyTorch's `dropout`): on in training mode, off after `eval()`.
#[test]
fn dropout_between_layers_follows_the_training_mode() {
    kiln::manual_seed(6);
    let options = RecurrentOptions { num_layers: 2, dropout: 0.5, ..Default::default() };
    let mut lstm = Lstm::with_options(3, 4, options);
    let x = Tensor::randn([5, 2, 3]);
    let (a, b) = (lstm.forward(&x).to_vec::<f32>(), lstm.forward(&x).to_vec::<f32>());
    assert_ne!(a, b, "training mode draws a new mask each call");
    lstm.eval();
    let plain = {
        let mut p = lstm.clone();
        p.train();
        let mut names = Vec::new();
        p.visit("", &mut |n, _| names.push(n.to_string()));
        assert_eq!(names.len(), 8);
        p
    };
    let (e1, e2) = (lstm.forward(&x).to_vec::<f32>(), lstm.forward(&x).to_vec::<f32>());
    assert_eq!(e1, e2, "no dropout in evaluation mode");
    assert_ne!(plain.forward(&x).to_vec::<f32>(), e1);
    let bad = RecurrentOptions { dropout: 1.5, ..Default::default() };
    let err = std::panic::catch_unwind(|| Lstm::with_options(3, 4, bad)).expect_err("dropout 1.5");
    let message = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(message.contains("dropout must be in [0, 1]"), "{message}");
}
