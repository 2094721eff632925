//! Loss scaling for f16 training.

use super::Optimizer;
use crate::error::ok;
use crate::{Error, Result, Tensor};

/// The settings of a [`GradScaler`]; the defaults are PyTorch's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GradScalerConfig {
    /// The first scale.
    pub init_scale: f64,
    /// What the scale is multiplied by after `growth_interval` steps without an overflow.
    pub growth_factor: f64,
    /// What the scale is multiplied by after a step with an overflow.
    pub backoff_factor: f64,
    /// Overflow-free steps before the scale grows.
    pub growth_interval: usize,
}

impl Default for GradScalerConfig {
    fn default() -> GradScalerConfig {
        GradScalerConfig {
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
        }
    }
}

/// Dynamic loss scaling, as PyTorch's `GradScaler`: multiply the loss by a large scale so
/// that small f16 gradients do not flush to zero, then divide the gradients by it before the
/// update. When a gradient overflowed (inf or NaN), the step is skipped and the scale backs
/// off; after `growth_interval` clean steps it grows. The unscaling, the finiteness check
/// and the update are one graph: [`GradScaler::step`] reads back a single flag after it.
/// It reads that flag, so it cannot run inside [`crate::compile()`].
///
/// ```
/// use kiln::nn::{Linear, Module, functional as F};
/// use kiln::optim::{GradScaler, Optimizer, Sgd, SgdConfig};
/// use kiln::prelude::*;
/// let model = Linear::new(4, 1);
/// let mut opt = Sgd::new(model.parameters(), SgdConfig { lr: 0.1, ..Default::default() });
/// let mut scaler = GradScaler::new();
/// let (x, y) = (Tensor::randn([8, 4]), Tensor::randn([8, 1]));
/// let loss = kiln::autocast(DType::F16, || F::mse_loss(&model.forward(&x), &y));
/// opt.zero_grad();
/// scaler.scale(&loss).backward();
/// assert!(scaler.step(&mut opt));   // finite gradients: the step was taken
/// scaler.update();
/// assert_eq!(scaler.get_scale(), 65536.0);
/// ```
#[derive(Clone, Debug)]
pub struct GradScaler {
    config: GradScalerConfig,
    scale: f64,
    clean_steps: usize,
    found_inf: Option<bool>,
}

impl Default for GradScaler {
    fn default() -> GradScaler {
        GradScaler::new()
    }
}

impl GradScaler {
    /// A scaler with PyTorch's defaults.
    #[must_use]
    pub fn new() -> GradScaler {
        GradScaler {
            config: GradScalerConfig::default(),
            scale: 65536.0,
            clean_steps: 0,
            found_inf: None,
        }
    }

    /// A scaler with `config`.
    ///
    /// # Errors
    /// [`Error::Value`] for a scale or growth factor that is not a finite number above 0
    /// (above 1 for growth), a backoff factor outside `(0, 1)`, or a zero interval.
    pub fn with_config(config: GradScalerConfig) -> Result<GradScaler> {
        let ok = config.init_scale.is_finite()
            && config.init_scale > 0.0
            && config.growth_factor.is_finite()
            && config.growth_factor > 1.0
            && config.backoff_factor > 0.0
            && config.backoff_factor < 1.0
            && config.growth_interval > 0;
        if !ok {
            return Err(Error::value(
                "GradScaler::with_config",
                format!(
                    "needs init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and growth_interval > 0; got {config:?}"
                ),
            ));
        }
        Ok(GradScaler { config, scale: config.init_scale, clean_steps: 0, found_inf: None })
    }

    /// The current scale.
    pub fn get_scale(&self) -> f64 {
        self.scale
    }

    /// `loss` times the scale: call `backward` on this.
    #[must_use]
    #[track_caller]
    pub fn scale(&self, loss: &Tensor) -> Tensor {
        loss * self.scale
    }

    /// [`GradScaler::try_step`], panicking on failure.
    ///
    /// # Panics
    /// As [`GradScaler::try_step`] fails.
    #[track_caller]
    pub fn step(&mut self, optimizer: &mut dyn Optimizer) -> bool {
        ok(self.try_step(optimizer))
    }

    /// Divides every parameter's gradient by the scale and steps the optimizer unless a
    /// gradient is not finite (see [`Optimizer::try_step_unless`]); returns whether it
    /// stepped. Call [`GradScaler::update`] afterwards.
    ///
    /// # Errors
    /// As [`Optimizer::try_step_unless`].
    #[track_caller]
    pub fn try_step(&mut self, optimizer: &mut dyn Optimizer) -> Result<bool> {
        let _at = crate::engine::origin::enter();
        let inverse = 1.0 / self.scale;
        let skip = crate::no_grad(|| {
            let mut skip: Option<Tensor> = None;
            for p in optimizer.parameters() {
                let Some(g) = p.grad() else { continue };
                let g = g * inverse;
                // g·0 is NaN exactly where g is infinite or NaN.
                let bad = (&g * 0.0).ne(0.0).any();
                skip = Some(match skip {
                    Some(s) => s.logical_or(&bad),
                    None => bad,
                });
                p.set_grad(Some(g));
            }
            skip
        });
        let stepped = match skip {
            Some(skip) => optimizer.try_step_unless(&skip)?,
            None => optimizer.try_step().map(|()| true)?,
        };
        self.found_inf = Some(!stepped);
        Ok(stepped)
    }

    /// Adjusts the scale after a step: backs off when the step found an overflow, grows
    /// after `growth_interval` clean steps in a row. Does nothing without a step since the
    /// last update.
    pub fn update(&mut self) {
        match self.found_inf.take() {
            Some(true) => {
                self.scale *= self.config.backoff_factor;
                self.clean_steps = 0;
            }
            Some(false) => {
                self.clean_steps += 1;
                if self.clean_steps == self.config.growth_interval {
                    self.scale *= self.config.growth_factor;
                    self.clean_steps = 0;
                }
            }
            None => {}
        }
    }
}
