//! PyTorch's loss modules (`nn.MSELoss()`, `nn.CrossEntropyLoss(label_smoothing=0.1)`, ...):
//! each holds its options, with PyTorch's defaults, and `forward(input, target)` calls the
//! `functional` loss. (A loss takes two inputs, so these are not [`super::Module`]s.)
//!
//! ```
//! use kiln::nn::{CrossEntropyLoss, MSELoss};
//! use kiln::prelude::*;
//! let logits = Tensor::from_vec(vec![2.0f32, 0.0, 0.0, 2.0], [2, 2]);
//! let labels = Tensor::from_vec(vec![0i64, 1], [2]);
//! let loss = CrossEntropyLoss::default().forward(&logits, &labels).item::<f32>();
//! assert!((loss - (1.0 + (-2.0f32).exp()).ln()).abs() < 1e-6);
//! assert_eq!(MSELoss::default().forward(&logits, &logits.zeros_like()).item::<f32>(), 2.0);
//! ```

use super::functional::{
    CrossEntropyOptions, CtcLossOptions, KlReduction, Reduction, try_binary_cross_entropy,
    try_binary_cross_entropy_with_logits, try_cross_entropy_with, try_ctc_loss, try_huber_loss,
    try_kl_div, try_l1_loss, try_margin_ranking_loss, try_mse_loss_with, try_nll_loss_with,
    try_smooth_l1_loss, try_triplet_margin_loss,
};
use crate::error::ok;
use crate::{Result, Tensor};

macro_rules! criterion {
    ($(
        $(#[$doc:meta])*
        $name:ident { $($field:ident: $t:ty = $default:expr),* }
        => |$s:ident, $input:ident, $target:ident| $body:expr;
    )*) => {$(
        arguments! {
            $(#[$doc])*
            $name { $($field: $t = $default),* }
        }

        impl $name {
            /// The loss of `input` against `target`.
            ///
            /// # Panics
            /// As the `try_` form fails.
            #[track_caller]
            #[must_use]
            pub fn forward(&self, input: &Tensor, target: &Tensor) -> Tensor {
                ok(self.try_forward(input, target))
            }

            /// [`Self::forward`], returning an error instead of panicking.
            ///
            /// # Errors
            /// As the `functional` loss it calls.
            #[track_caller]
            pub fn try_forward(&self, $input: &Tensor, $target: &Tensor) -> Result<Tensor> {
                let $s = self;
                $body
            }
        }
    )*};
}

criterion! {
    /// The mean absolute error (PyTorch's `nn.L1Loss`).
    L1Loss { reduction: Reduction = Reduction::Mean }
        => |s, x, y| try_l1_loss(x, y, s.reduction);
    /// The mean squared error (PyTorch's `nn.MSELoss`).
    MSELoss { reduction: Reduction = Reduction::Mean }
        => |s, x, y| try_mse_loss_with(x, y, s.reduction);
    /// Cross-entropy of logits against class indices (PyTorch's `nn.CrossEntropyLoss`).
    CrossEntropyLoss {
        reduction: Reduction = Reduction::Mean,
        label_smoothing: f64 = 0.0,
        ignore_index: Option<i64> = None
    } => |s, x, y| {
        let options = CrossEntropyOptions {
            reduction: s.reduction,
            label_smoothing: s.label_smoothing,
            ignore_index: s.ignore_index,
        };
        try_cross_entropy_with(x, y, options)
    };
    /// The negative log-likelihood of log-probabilities (PyTorch's `nn.NLLLoss`).
    NLLLoss { reduction: Reduction = Reduction::Mean, ignore_index: Option<i64> = None }
        => |s, x, y| try_nll_loss_with(x, y, s.reduction, s.ignore_index);
    /// Binary cross-entropy of probabilities (PyTorch's `nn.BCELoss`).
    BCELoss { reduction: Reduction = Reduction::Mean }
        => |s, x, y| try_binary_cross_entropy(x, y, s.reduction);
    /// Binary cross-entropy of logits (PyTorch's `nn.BCEWithLogitsLoss`).
    BCEWithLogitsLoss { reduction: Reduction = Reduction::Mean }
        => |s, x, y| try_binary_cross_entropy_with_logits(x, y, s.reduction);
    /// The Huber loss (PyTorch's `nn.HuberLoss`).
    HuberLoss { reduction: Reduction = Reduction::Mean, delta: f64 = 1.0 }
        => |s, x, y| try_huber_loss(x, y, s.reduction, s.delta);
    /// The smooth L1 loss (PyTorch's `nn.SmoothL1Loss`).
    SmoothL1Loss { reduction: Reduction = Reduction::Mean, beta: f64 = 1.0 }
        => |s, x, y| try_smooth_l1_loss(x, y, s.reduction, s.beta);
    /// The Kullback-Leibler divergence of log-probabilities (PyTorch's `nn.KLDivLoss`).
    KLDivLoss { reduction: KlReduction = KlReduction::Mean, log_target: bool = false }
        => |s, x, y| try_kl_div(x, y, s.reduction, s.log_target);
}

/// The CTC loss (PyTorch's `nn.CTCLoss`): [`super::functional::ctc_loss`] with these
/// options; its `forward` takes the lengths too.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(clippy::upper_case_acronyms, reason = "PyTorch's name, so users find it")]
pub struct CTCLoss(pub CtcLossOptions);

impl CTCLoss {
    /// The loss of `log_probs` `[T, N, C]` against `targets`.
    ///
    /// # Panics
    /// As [`try_ctc_loss`] fails.
    #[track_caller]
    #[must_use]
    pub fn forward(
        &self,
        log_probs: &Tensor,
        targets: &Tensor,
        input_lengths: &[usize],
        target_lengths: &[usize],
    ) -> Tensor {
        ok(try_ctc_loss(log_probs, targets, input_lengths, target_lengths, self.0))
    }
}

/// `max(0, -y·(x1 - x2) + margin)` (PyTorch's `nn.MarginRankingLoss`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MarginRankingLoss {
    /// PyTorch's argument of this name (0).
    pub margin: f64,
    /// PyTorch's argument of this name.
    pub reduction: Reduction,
}

impl MarginRankingLoss {
    /// The loss of the pairs `x1`, `x2` ranked by `y` (±1).
    ///
    /// # Panics
    /// As [`try_margin_ranking_loss`] fails.
    #[track_caller]
    #[must_use]
    pub fn forward(&self, x1: &Tensor, x2: &Tensor, y: &Tensor) -> Tensor {
        ok(try_margin_ranking_loss(x1, x2, y, self.margin, self.reduction))
    }
}

/// The triplet margin loss (PyTorch's `nn.TripletMarginLoss`; defaults margin 1, p 2,
/// eps 1e-6, no swap, mean).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TripletMarginLoss {
    /// PyTorch's argument of this name.
    pub margin: f64,
    /// PyTorch's argument of this name.
    pub p: f64,
    /// PyTorch's argument of this name.
    pub eps: f64,
    /// PyTorch's argument of this name.
    pub swap: bool,
    /// PyTorch's argument of this name.
    pub reduction: Reduction,
}

impl Default for TripletMarginLoss {
    fn default() -> TripletMarginLoss {
        TripletMarginLoss {
            margin: 1.0,
            p: 2.0,
            eps: 1e-6,
            swap: false,
            reduction: Reduction::Mean,
        }
    }
}

impl TripletMarginLoss {
    /// The loss of `anchor` against `positive` and `negative`.
    ///
    /// # Panics
    /// As [`try_triplet_margin_loss`] fails.
    #[track_caller]
    #[must_use]
    pub fn forward(&self, anchor: &Tensor, positive: &Tensor, negative: &Tensor) -> Tensor {
        let s = self;
        ok(try_triplet_margin_loss(
            anchor,
            positive,
            negative,
            s.margin,
            s.p,
            s.eps,
            s.swap,
            s.reduction,
        ))
    }
}
