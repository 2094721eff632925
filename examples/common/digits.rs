//! The handwritten-digits training run shared by `examples/train_digits.rs` and the test
//! that checks its accuracy.

use std::cell::RefCell;
use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use kiln::data::{DataLoader, TensorDataset};
use kiln::nn::{Dropout, Linear, Module, functional as F};
use kiln::optim::{Adam, AdamConfig, CosineAnnealingLr, LrScheduler, Optimizer};
use kiln::prelude::*;

/// The 1,797 8x8 images (pixels scaled from 0..16 to 0..1) and their labels.
pub(crate) struct Digits {
    /// `[n, 64]`, `f32`.
    pub(crate) images: Tensor,
    /// `[n]`, `i64` in 0..10.
    pub(crate) labels: Tensor,
}

/// Reads `data/digits.csv.gz`: one image per line, 64 pixel values then the label.
pub(crate) fn load(path: &Path) -> Result<Digits, String> {
    let file =
        std::fs::File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let mut text = String::new();
    flate2::read::GzDecoder::new(file)
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot decompress {}: {e}", path.display()))?;
    let (mut pixels, mut labels) = (Vec::new(), Vec::new());
    for (line_no, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let values: Vec<f32> = line
            .split(',')
            .map(|v| v.trim().parse::<f32>())
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{}:{}: {e}", path.display(), line_no + 1))?;
        if values.len() != 65 {
            return Err(format!(
                "{}:{}: expected 65 values, got {}",
                path.display(),
                line_no + 1,
                values.len()
            ));
        }
        pixels.extend(values[..64].iter().map(|p| p / 16.0));
        labels.push(values[64] as i64);
    }
    let n = labels.len();
    Ok(Digits { images: Tensor::from_vec(pixels, [n, 64]), labels: Tensor::from_vec(labels, [n]) })
}

/// A two-hidden-layer perceptron with dropout.
pub(crate) struct Mlp {
    pub fc1: Linear,
    pub fc2: Linear,
    pub fc3: Linear,
    pub(crate) dropout: Dropout,
}
kiln::parameters!(Mlp { fc1, fc2, fc3, dropout });

impl Mlp {
    pub(crate) fn new(hidden: usize) -> Mlp {
        Mlp {
            fc1: Linear::new(64, hidden),
            fc2: Linear::new(hidden, hidden),
            fc3: Linear::new(hidden, 10),
            dropout: Dropout::new(0.1),
        }
    }
}

impl Module for Mlp {
    fn try_forward(&self, x: &Tensor) -> kiln::Result<Tensor> {
        let h = self.fc1.try_forward(x)?.try_relu()?;
        let h = self.dropout.try_forward(&self.fc2.try_forward(&h)?.try_relu()?)?;
        self.fc3.try_forward(&h)
    }
}

/// How to train.
pub(crate) struct Config {
    pub(crate) epochs: usize,
    pub(crate) batch_size: usize,
    pub(crate) lr: f64,
    pub(crate) hidden: usize,
    pub(crate) seed: u64,
    pub(crate) progress: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config { epochs: 30, batch_size: 64, lr: 3e-3, hidden: 128, seed: 0, progress: true }
    }
}

/// What a run produced.
pub(crate) struct Report {
    pub(crate) model: Mlp,
    pub(crate) final_loss: f32,
    pub(crate) test_accuracy: f64,
    pub(crate) train_time: Duration,
    pub(crate) steps: usize,
    /// One held-out batch, for profiling a training step.
    pub(crate) sample: (Tensor, Tensor),
}

/// The share of `images` whose predicted class is `labels`.
pub(crate) fn accuracy(model: &Mlp, images: &Tensor, labels: &Tensor) -> f64 {
    let predicted = kiln::no_grad(|| model.forward(images).argmax(1, false));
    predicted.eq(labels).sum().item::<i64>() as f64 / labels.numel() as f64
}

/// Splits the data 80/20 under `config.seed`, trains, and evaluates on the held-out fifth.
pub(crate) fn train(data: &Digits, config: &Config) -> kiln::Result<Report> {
    kiln::manual_seed(config.seed);
    let n = data.labels.numel();
    let perm = Tensor::randperm(n);
    let n_train = n * 4 / 5;
    let (train_idx, test_idx) = (perm.narrow(0, 0, n_train), perm.narrow(0, n_train, n - n_train));
    let pick = |t: &Tensor, idx: &Tensor| t.index_select(0, idx).realize().clone();
    let train_set =
        TensorDataset::new(vec![pick(&data.images, &train_idx), pick(&data.labels, &train_idx)])?;
    let (test_x, test_y) = (pick(&data.images, &test_idx), pick(&data.labels, &test_idx));

    let mut model = Mlp::new(config.hidden);
    let opt = RefCell::new(Adam::new(
        model.parameters(),
        AdamConfig { lr: config.lr, ..Default::default() },
    ));
    let mut schedule =
        CosineAnnealingLr::new(&mut *opt.borrow_mut(), config.epochs, config.lr / 20.0);
    let loader =
        DataLoader::new(&train_set, config.batch_size).shuffle(config.seed).drop_last(true);

    let bar = if config.progress {
        ProgressBar::new((config.epochs * loader.len()) as u64)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:32.cyan/blue} {pos:>4}/{len} steps  {msg}  [{elapsed_precise}]",
        )
        .map_err(|e| kiln::Error::Internal(e.to_string()))?,
    );
    let start = Instant::now();
    let (mut final_loss, mut steps) = (f32::NAN, 0);
    model.train();
    {
        // One training step, compiled: forward, loss, backward and the Adam update are one
        // fused plan, planned on the first calls and replayed afterwards.
        let mut step = kiln::compile(|(x, y): (&Tensor, &Tensor)| {
            let mut opt = opt.borrow_mut();
            opt.zero_grad();
            let loss = F::cross_entropy(&model.forward(x), y);
            loss.backward();
            opt.step();
            loss
        });
        for epoch in 0..config.epochs {
            for batch in &loader {
                let batch = batch?;
                final_loss = step.try_call((&batch[0], &batch[1]))?.item();
                steps += 1;
                bar.inc(1);
            }
            schedule.step(&mut *opt.borrow_mut());
            bar.set_message(format!(
                "epoch {:>2}  loss {final_loss:.4}  lr {:.5}",
                epoch + 1,
                opt.borrow().lr()
            ));
        }
    }
    let train_time = start.elapsed();
    bar.finish();
    model.eval();
    let test_accuracy = accuracy(&model, &test_x, &test_y);
    let sample = (test_x.narrow(0, 0, config.batch_size), test_y.narrow(0, 0, config.batch_size));
    Ok(Report { model, final_loss, test_accuracy, train_time, steps, sample })
}
