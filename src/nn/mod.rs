//! Neural-network building blocks: the [`Module`] and [`Parameters`] traits, layers,
//! activations, and the losses and functions of [`functional`].
//!
//! A module is a plain Rust struct whose fields are tensors and other modules. Its
//! parameters are ordinary leaf tensors that require grad; optimizers update them in place,
//! so every handle to a parameter (the model's, the optimizer's) sees the new values.
//!
//! ```
//! use kiln::nn::{self, Linear, Module, Parameters, ReLU};
//! use kiln::prelude::*;
//!
//! struct Mlp {
//!     fc1: Linear,
//!     fc2: Linear,
//! }
//! kiln::parameters!(Mlp { fc1, fc2 });
//!
//! impl Module for Mlp {
//!     fn try_forward(&self, x: &Tensor) -> kiln::Result<Tensor> {
//!         self.fc2.try_forward(&self.fc1.try_forward(x)?.try_relu()?)
//!     }
//! }
//!
//! kiln::manual_seed(0);
//! let model = Mlp { fc1: Linear::new(4, 8), fc2: Linear::new(8, 3) };
//! let names: Vec<String> = model.named_parameters().into_iter().map(|(n, _)| n).collect();
//! assert_eq!(names, ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]);
//! assert_eq!(model.num_parameters(), 4 * 8 + 8 + 8 * 3 + 3);
//!
//! let logits = model.forward(&Tensor::randn([2, 4]));
//! let loss = nn::functional::cross_entropy(&logits, &Tensor::from_vec(vec![0i64, 2], [2]));
//! loss.backward();
//! assert!(model.fc1.weight.grad().is_some());
//! # let _ = ReLU;
//! ```

// `activation!`, `parameterized_activation!` and `arguments!` serve `pointwise.rs` and
// `criteria.rs` too.
#[macro_use]
mod activation;
mod attention;
mod batchnorm;
mod conv;
mod criteria;
mod ctc;
mod ddp;
mod distance;
mod dropout;
mod embedding;
mod fold;
pub mod functional;
mod grid;
pub mod init;
mod linear;
mod losses;
mod norm;
mod pointwise;
// `pool_modules!` serves the 1-D modules of `sequence.rs` too.
#[macro_use]
mod pool;
mod recurrent;
mod resize;
mod sequence;
mod sequential;
mod shuffle;
mod transformer;
mod volume;

pub use activation::{
    ELU, GELU, GELUTanh, Identity, LeakyReLU, ReLU, SiLU, Sigmoid, Softplus, Tanh,
};
pub use attention::MultiheadAttention;
pub use batchnorm::{BatchNorm, BatchNorm1d, BatchNorm2d};
pub use conv::{Conv1d, Conv2d};
pub use criteria::{
    BCELoss, BCEWithLogitsLoss, CTCLoss, CrossEntropyLoss, HuberLoss, KLDivLoss, L1Loss, MSELoss,
    MarginRankingLoss, NLLLoss, SmoothL1Loss, TripletMarginLoss,
};
pub use ddp::{DdpOptions, DistributedDataParallel, NoSync};
pub use dropout::Dropout;
pub use embedding::{BagMode, Embedding, EmbeddingBag};
pub use fold::ConvTranspose2d;
pub use linear::Linear;
pub use norm::{GroupNorm, LayerNorm, RmsNorm};
pub use pointwise::{
    CELU, GLU, Hardshrink, Hardsigmoid, Hardswish, Hardtanh, LogSigmoid, LogSoftmax, Mish, PReLU,
    ReLU6, SELU, Softmax, Softmin, Softshrink, Softsign, Tanhshrink, Threshold,
};
pub use pool::{AdaptiveAvgPool2d, AdaptiveMaxPool2d, AvgPool2d, MaxPool2d};
pub use recurrent::{Gru, Lstm, RecurrentOptions, Rnn};
pub use resize::{Flatten, Upsample};
pub use sequence::{
    AdaptiveAvgPool1d, AdaptiveMaxPool1d, AvgPool1d, Bilinear, ConvTranspose1d, InstanceNorm,
    InstanceNorm1d, InstanceNorm2d, InstanceNorm3d, MaxPool1d,
};
pub use sequential::Sequential;
pub use shuffle::{PixelShuffle, PixelUnshuffle};
pub use transformer::{
    FeedForward, Masks, Transformer, TransformerDecoder, TransformerDecoderLayer,
    TransformerEncoder, TransformerEncoderLayer, TransformerOptions,
};
pub use volume::{AdaptiveAvgPool3d, AdaptiveMaxPool3d, AvgPool3d, Conv3d, MaxPool3d};

use crate::error::ok;
use crate::{Device, Error, Result, Tensor};

/// Something that holds parameters: a module, a container of modules, or a tensor.
///
/// Implement it for your own structs with [`crate::parameters!`], which lists the fields
/// that hold parameters; the provided methods then work on the whole tree. Names are the
/// field path joined by dots, as in PyTorch (`encoder.layers.0.weight`).
pub trait Parameters {
    /// Calls `f` with the name and handle of every parameter under `prefix`, in a fixed order.
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor));

    /// Like [`Parameters::visit`], with mutable access to each handle (to replace it, as
    /// [`Parameters::to`] does).
    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor));

    /// Calls `f` with the name and handle of every *buffer* under `prefix`: state that is
    /// saved, loaded and moved with the model but is not trained (batch norm's running
    /// statistics). Optimizers never see buffers, as they are built from
    /// [`Parameters::parameters`]. Declare buffers in [`crate::parameters!`]'s `buffers`
    /// list.
    fn visit_buffers(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        let _ = (prefix, f);
    }

    /// Like [`Parameters::visit_buffers`], with mutable access to each handle.
    fn visit_buffers_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor)) {
        let _ = (prefix, f);
    }

    /// Switches training-only behavior (dropout) on or off in this tree.
    fn set_training(&mut self, training: bool) {
        let _ = training;
    }

    /// Every parameter with its dotted name, in declaration order.
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        self.visit("", &mut |name, t| out.push((name.to_string(), t.clone())));
        out
    }

    /// Every parameter, in declaration order (handles sharing the model's storage).
    fn parameters(&self) -> Vec<Tensor> {
        let mut out = Vec::new();
        self.visit("", &mut |_, t| out.push(t.clone()));
        out
    }

    /// Every buffer with its dotted name, in declaration order.
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        self.visit_buffers("", &mut |name, t| out.push((name.to_string(), t.clone())));
        out
    }

    /// Every buffer, in declaration order (handles sharing the model's storage).
    fn buffers(&self) -> Vec<Tensor> {
        self.named_buffers().into_iter().map(|(_, t)| t).collect()
    }

    /// The model's whole state, as PyTorch's `state_dict`: every parameter, then every
    /// buffer, with their dotted names. The tensors share the model's storage; what
    /// [`Parameters::save`] writes.
    fn state_dict(&self) -> Vec<(String, Tensor)> {
        let mut out = self.named_parameters();
        out.extend(self.named_buffers());
        out
    }

    /// Copies `state` (names and tensors, as [`Parameters::state_dict`] or
    /// [`crate::serialize::load`] give them) into this model's parameters and buffers, in
    /// place. Every name, shape and dtype must match; otherwise nothing is changed and the
    /// error lists every difference.
    ///
    /// # Errors
    /// [`Error::Load`] listing missing, unexpected and mismatched tensors;
    /// [`Error::Runtime`] when computing a pending tensor fails.
    fn load_state_dict(&self, state: Vec<(String, Tensor)>) -> Result<()> {
        crate::serialize::assign(&self.state_dict(), state)
    }

    /// The total number of scalar parameters.
    fn num_parameters(&self) -> usize {
        let mut n = 0;
        self.visit("", &mut |_, t| n += t.numel());
        n
    }

    /// Clears the gradients of every parameter.
    fn zero_grad(&self) {
        self.visit("", &mut |_, t| t.zero_grad());
    }

    /// Training mode: dropout is active.
    fn train(&mut self) {
        self.set_training(true);
    }

    /// Evaluation mode: dropout passes its input through.
    fn eval(&mut self) {
        self.set_training(false);
    }

    /// Moves every parameter and buffer to `device`, keeping names and `requires_grad`. The
    /// moved parameters are leaves of their own (as PyTorch's `module.to`): gradients
    /// collect on them, where an optimizer built from [`Parameters::parameters`] afterwards
    /// finds them.
    ///
    /// # Errors
    /// [`Error::Device`] when the device cannot be used.
    fn to(&mut self, device: Device) -> Result<()> {
        let mut failure = None;
        let mut move_one = |t: &mut Tensor| {
            if failure.is_some() || t.device() == device {
                return;
            }
            let moved = t
                .try_to(device)
                .and_then(|moved| moved.detach().try_requires_grad_(t.requires_grad()));
            match moved {
                Ok(moved) => *t = moved,
                Err(e) => failure = Some(e),
            }
        };
        self.visit_mut("", &mut |_, t| move_one(t));
        self.visit_buffers_mut("", &mut |_, t| move_one(t));
        failure.map_or(Ok(()), Err)
    }

    /// Writes the model's [`Parameters::state_dict`] (parameters and buffers) to a
    /// safetensors file.
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be written; [`Error::Runtime`] when computing a
    /// pending parameter fails.
    fn save(&self, path: impl AsRef<std::path::Path>) -> Result<()>
    where
        Self: Sized,
    {
        crate::serialize::save(path, &self.state_dict())
    }

    /// Reads parameters and buffers saved by [`Parameters::save`] (or any safetensors file
    /// with the same names) into this model, in place. Every name, shape and dtype must match; otherwise
    /// nothing is changed and the error lists every difference.
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be read or parsed; [`Error::Load`] listing missing,
    /// unexpected and mismatched tensors.
    fn load(&self, path: impl AsRef<std::path::Path>) -> Result<()>
    where
        Self: Sized,
    {
        self.load_state_dict(crate::serialize::load(path)?)
    }
}

/// A layer or model: [`Parameters`] plus a forward pass.
///
/// Implement [`Module::try_forward`]; [`Module::forward`] is its panicking twin, as
/// everywhere in kiln.
///
/// An error found while computing (an index out of range, say) names the line that recorded
/// the failing op: for kiln's own layers and losses, the line of your program that called
/// them (also through a [`Sequential`]); for your own modules, the line in your
/// `try_forward`.
pub trait Module: Parameters {
    /// The forward pass.
    ///
    /// # Errors
    /// Whatever the layer's ops report: shapes that do not fit, mostly.
    fn try_forward(&self, input: &Tensor) -> Result<Tensor>;

    /// The forward pass, panicking where [`Module::try_forward`] returns an error.
    ///
    /// # Panics
    /// As [`Module::try_forward`] fails.
    #[track_caller]
    fn forward(&self, input: &Tensor) -> Tensor {
        ok(self.try_forward(input))
    }
}

/// `prefix.name`, or `name` at the root: the dotted parameter path.
#[doc(hidden)]
pub fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() { name.to_string() } else { format!("{prefix}.{name}") }
}

/// A bare tensor field is one parameter, named by its path.
impl Parameters for Tensor {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        f(prefix, self);
    }

    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor)) {
        f(prefix, self);
    }
}

/// A list of modules: elements are named by their position (`layers.0.weight`).
impl<T: Parameters> Parameters for Vec<T> {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        for (i, m) in self.iter().enumerate() {
            m.visit(&join(prefix, &i.to_string()), f);
        }
    }

    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor)) {
        for (i, m) in self.iter_mut().enumerate() {
            m.visit_mut(&join(prefix, &i.to_string()), f);
        }
    }

    fn visit_buffers(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        for (i, m) in self.iter().enumerate() {
            m.visit_buffers(&join(prefix, &i.to_string()), f);
        }
    }

    fn visit_buffers_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor)) {
        for (i, m) in self.iter_mut().enumerate() {
            m.visit_buffers_mut(&join(prefix, &i.to_string()), f);
        }
    }

    fn set_training(&mut self, training: bool) {
        for m in self {
            m.set_training(training);
        }
    }
}

/// An optional part (a bias): nothing when absent.
impl<T: Parameters> Parameters for Option<T> {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        if let Some(m) = self {
            m.visit(prefix, f);
        }
    }

    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor)) {
        if let Some(m) = self {
            m.visit_mut(prefix, f);
        }
    }

    fn visit_buffers(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        if let Some(m) = self {
            m.visit_buffers(prefix, f);
        }
    }

    fn visit_buffers_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor)) {
        if let Some(m) = self {
            m.visit_buffers_mut(prefix, f);
        }
    }

    fn set_training(&mut self, training: bool) {
        if let Some(m) = self {
            m.set_training(training);
        }
    }
}

impl<T: Parameters + ?Sized> Parameters for Box<T> {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        (**self).visit(prefix, f);
    }

    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor)) {
        (**self).visit_mut(prefix, f);
    }

    fn visit_buffers(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        (**self).visit_buffers(prefix, f);
    }

    fn visit_buffers_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor)) {
        (**self).visit_buffers_mut(prefix, f);
    }

    fn set_training(&mut self, training: bool) {
        (**self).set_training(training);
    }
}

impl<T: Module + ?Sized> Module for Box<T> {
    #[track_caller]
    fn try_forward(&self, input: &Tensor) -> Result<Tensor> {
        let _at = crate::engine::origin::enter();
        (**self).try_forward(input)
    }
}

/// Implements [`nn::Parameters`](crate::nn::Parameters) for a struct by listing the fields
/// that hold parameters (tensors, modules, `Vec`s and `Option`s of them), and after
/// `buffers`, the tensor fields that are state but not trained (running statistics). Names
/// are the field names joined by dots, as PyTorch's `named_parameters` and `named_buffers`
/// give them. A module field's own buffers are found through it.
///
/// ```
/// use kiln::nn::{Dropout, Linear, Parameters};
///
/// struct Block {
///     proj: Linear,
///     drop: Dropout,
///     scale: kiln::Tensor,
///     extra: Vec<Linear>,
/// }
/// kiln::parameters!(Block { proj, drop, scale, extra });
///
/// let block = Block {
///     proj: Linear::new(4, 4),
///     drop: Dropout::new(0.1),
///     scale: kiln::Tensor::ones([4]).requires_grad_(true),
///     extra: vec![Linear::new(4, 2)],
/// };
/// let names: Vec<String> = block.named_parameters().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["proj.weight", "proj.bias", "scale", "extra.0.weight", "extra.0.bias"]);
///
/// // Buffers: saved, loaded and moved with the model, never trained.
/// struct Counter {
///     proj: Linear,
///     seen: kiln::Tensor,
/// }
/// kiln::parameters!(Counter { proj } buffers { seen });
/// let c = Counter { proj: Linear::new(2, 2), seen: kiln::Tensor::zeros([1]) };
/// assert_eq!(c.parameters().len(), 2);
/// assert_eq!(c.named_buffers()[0].0, "seen");
/// assert_eq!(c.state_dict().len(), 3);
/// ```
#[macro_export]
macro_rules! parameters {
    ($ty:ty { $($field:ident),* $(,)? }) => {
        $crate::parameters!($ty { $($field),* } buffers {});
    };
    ($ty:ty { $($field:ident),* $(,)? } buffers { $($buffer:ident),* $(,)? }) => {
        impl $crate::nn::Parameters for $ty {
            fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &$crate::Tensor)) {
                $($crate::nn::Parameters::visit(
                    &self.$field,
                    &$crate::nn::join(prefix, stringify!($field)),
                    f,
                );)*
            }

            fn visit_mut(
                &mut self,
                prefix: &str,
                f: &mut dyn FnMut(&str, &mut $crate::Tensor),
            ) {
                $($crate::nn::Parameters::visit_mut(
                    &mut self.$field,
                    &$crate::nn::join(prefix, stringify!($field)),
                    f,
                );)*
            }

            fn visit_buffers(&self, prefix: &str, f: &mut dyn FnMut(&str, &$crate::Tensor)) {
                $($crate::nn::Parameters::visit_buffers(
                    &self.$field,
                    &$crate::nn::join(prefix, stringify!($field)),
                    f,
                );)*
                $($crate::nn::Parameters::visit(
                    &self.$buffer,
                    &$crate::nn::join(prefix, stringify!($buffer)),
                    f,
                );)*
            }

            fn visit_buffers_mut(
                &mut self,
                prefix: &str,
                f: &mut dyn FnMut(&str, &mut $crate::Tensor),
            ) {
                $($crate::nn::Parameters::visit_buffers_mut(
                    &mut self.$field,
                    &$crate::nn::join(prefix, stringify!($field)),
                    f,
                );)*
                $($crate::nn::Parameters::visit_mut(
                    &mut self.$buffer,
                    &$crate::nn::join(prefix, stringify!($buffer)),
                    f,
                );)*
            }

            fn set_training(&mut self, training: bool) {
                $($crate::nn::Parameters::set_training(&mut self.$field, training);)*
            }
        }
    };
}

/// The checks every layer makes on its input's last dimension.
fn check_features(op: &'static str, input: &Tensor, expected: usize) -> Result<()> {
    match input.dims().last() {
        Some(&n) if n == expected => Ok(()),
        _ => Err(Error::shape(
            op,
            format!(
                "expected an input whose last dimension is {expected}, got shape {}; reshape the input or build the layer for {} features",
                input.shape(),
                input.dims().last().map_or("0".to_string(), ToString::to_string)
            ),
        )),
    }
}
