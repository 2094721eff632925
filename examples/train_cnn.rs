//! Trains a small convolutional network on the bundled handwritten-digits images (1,797 8x8
//! images): three conv–batch-norm–ReLU blocks, max pooling, global average pooling and a
//! linear head. Reports test accuracy, profiles one training step fused and unfused (what
//! fused into each kernel), and saves the weights with the batch-norm running statistics.
//!
//! Run with `cargo run --release --example train_cnn`.

#[path = "common/digits.rs"]
#[allow(dead_code, reason = "the shared file also holds the MLP run")]
mod digits;

use std::cell::RefCell;
use std::path::Path;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use kiln::data::{DataLoader, TensorDataset};
use kiln::nn::functional::{self as F, Conv2dOptions, Pool2dOptions};
use kiln::nn::{
    AdaptiveAvgPool2d, BatchNorm2d, Conv2d, Flatten, Linear, MaxPool2d, Module, Parameters, ReLU,
    Sequential,
};
use kiln::optim::{CosineAnnealingLr, LrScheduler, Optimizer, Sgd, SgdConfig};
use kiln::prelude::*;

/// conv 3x3 (no bias: the batch norm's shift replaces it), batch norm, ReLU.
fn block(c_in: usize, c_out: usize, stride: usize) -> Sequential {
    let options = Conv2dOptions::default().padding([1, 1]).stride([stride, stride]);
    let mut conv = Conv2d::new(c_in, c_out, [3, 3], options);
    conv.bias = None;
    Sequential::new().with(conv).with(BatchNorm2d::new(c_out)).with(ReLU)
}

/// The network: 8x8 → 32 channels → 64 channels → 4x4 → 96 channels → global average → 10.
fn cnn() -> Sequential {
    Sequential::new()
        .with(block(1, 32, 1))
        .with(block(32, 64, 1))
        .with(MaxPool2d(Pool2dOptions::new([2, 2])))
        .with(block(64, 96, 1))
        .with(AdaptiveAvgPool2d([1, 1]))
        .with(Flatten)
        .with(Linear::new(96, 10))
}

/// Images shifted by up to one pixel in each direction (zero fill): a cheap augmentation.
fn shifted(images: &Tensor) -> Tensor {
    let n = images.dims()[0];
    let padded = F::pad(images, &[1, 1, 1, 1], F::PadMode::Constant, 0.0);
    let dy = (Tensor::rand([1]).item::<f32>() * 3.0).floor() as usize;
    let dx = (Tensor::rand([1]).item::<f32>() * 3.0).floor() as usize;
    padded.narrow(2, dy.min(2), 8).narrow(3, dx.min(2), 8).reshape(&[n as i64, 1, 8, 8])
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let data = digits::load(&root.join("data/digits.csv.gz"))?;
    let n = data.labels.numel();
    let images = data.images.reshape(&[n as i64, 1, 8, 8]);
    println!("digits: {n} images of 1x8x8 pixels, 10 classes");

    let (epochs, batch_size, lr) = (30, 64, 0.05);
    kiln::manual_seed(0);
    let perm = Tensor::randperm(n);
    let n_train = n * 4 / 5;
    let (train_idx, test_idx) = (perm.narrow(0, 0, n_train), perm.narrow(0, n_train, n - n_train));
    let pick = |t: &Tensor, idx: &Tensor| t.index_select(0, idx).realize().clone();
    let train_set =
        TensorDataset::new(vec![pick(&images, &train_idx), pick(&data.labels, &train_idx)])?;
    let (test_x, test_y) = (pick(&images, &test_idx), pick(&data.labels, &test_idx));

    let mut model = cnn();
    println!("model: {} parameters, {} buffers", model.num_parameters(), model.buffers().len());
    let opt = RefCell::new(Sgd::new(
        model.parameters(),
        SgdConfig { lr, momentum: 0.9, weight_decay: 5e-4, nesterov: true, ..Default::default() },
    ));
    let mut schedule = CosineAnnealingLr::new(&mut *opt.borrow_mut(), epochs, 0.0);
    let loader = DataLoader::new(&train_set, batch_size).shuffle(0).drop_last(true);
    let bar = ProgressBar::new((epochs * loader.len()) as u64);
    bar.set_style(ProgressStyle::with_template(
        "{bar:32.cyan/blue} {pos:>4}/{len} steps  {msg}  [{elapsed_precise}]",
    )?);

    let start = Instant::now();
    let mut final_loss = f32::NAN;
    model.train();
    {
        // One compiled step: forward, loss, backward, the SGD update and the batch-norm
        // running statistics are one plan, replayed every step.
        let mut step = kiln::compile(|(x, y): (&Tensor, &Tensor)| {
            let mut opt = opt.borrow_mut();
            opt.zero_grad();
            let loss = F::cross_entropy(&model.forward(x), y);
            loss.backward();
            opt.step();
            loss
        });
        for epoch in 0..epochs {
            for batch in &loader {
                let batch = batch?;
                final_loss = step.try_call((&shifted(&batch[0]), &batch[1]))?.item();
                bar.inc(1);
            }
            schedule.step(&mut *opt.borrow_mut());
            bar.set_message(format!("epoch {:>2}  loss {final_loss:.4}", epoch + 1));
        }
        println!("\ncompiled step: {:?}", step.stats());
    }
    bar.finish();
    let train_time = start.elapsed();
    model.eval();
    let accuracy = |m: &Sequential| {
        let predicted = kiln::no_grad(|| m.forward(&test_x).argmax(1, false));
        predicted.eq(&test_y).sum().item::<i64>() as f64 / test_y.numel() as f64
    };
    let test_accuracy = accuracy(&model);
    println!(
        "trained {epochs} epochs (batch {batch_size}) in {:.2} s: final loss {final_loss:.4}, test accuracy {:.1}%",
        train_time.as_secs_f64(),
        100.0 * test_accuracy
    );

    // The accuracy this example promises; CI runs it.
    if test_accuracy < 0.985 {
        return Err(format!("test accuracy {:.1}% is below 98.5%", 100.0 * test_accuracy).into());
    }

    let out_dir = root.join("target");
    std::fs::create_dir_all(&out_dir)?;
    let path = out_dir.join("digits_cnn.safetensors");
    model.save(&path)?;
    let mut reloaded = cnn();
    reloaded.load(&path)?;
    reloaded.eval();
    println!("saved the weights and batch-norm statistics to {}", path.display());
    assert_eq!(accuracy(&reloaded), test_accuracy);
    // One training step profiled fused (the default) and unfused (one kernel per op).
    let (x, y) = (test_x.narrow(0, 0, batch_size), test_y.narrow(0, 0, batch_size));
    model.train();
    let profile_step = |mode: kiln::Execution| {
        kiln::with_execution(mode, || {
            let mut opt = Sgd::new(model.parameters(), SgdConfig { lr: 0.0, ..Default::default() });
            let mut run = || {
                opt.zero_grad();
                let loss = F::cross_entropy(&model.forward(&x), &y);
                loss.backward();
                opt.step();
            };
            run();
            kiln::profile(run).1
        })
    };
    let (fused, unfused) =
        (profile_step(kiln::Execution::Fused), profile_step(kiln::Execution::Unfused));
    println!("\none training step, fused:\n{fused}\n");
    println!("{}", kiln::Profile::compare(&fused, &unfused));
    Ok(())
}
