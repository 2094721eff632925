//! Opaque user ops: a name, a shape and dtype rule, a CPU implementation, an optional CUDA
//! implementation and an optional backward written with kiln ops. Each call records one
//! node ([`kiln_ir::Op::Custom`]) that the planner runs as a step of its own, between fused
//! kernels, in eager code and inside [`crate::compile()`] alike.

use std::sync::Arc;

use kiln_ir::{Custom, DType, Op, Shape};
use kiln_runtime::custom::{self as registry, CpuFn, Implementation};

pub use registry::{CudaKernel, Input as CpuInput, Output as CpuOutput, Split};

use crate::autograd::is_grad_enabled;
use crate::error::{Error, Result, ok};
use crate::tensor::Tensor;
use crate::tensor::history::{self, CustomBackward};

/// The shape and dtype rule of an [`Opaque`] op: its result's shape and dtype from its
/// inputs', or a message saying what does not fit.
pub type ShapeRule =
    dyn Fn(&[(Shape, DType)]) -> std::result::Result<(Shape, DType), String> + Send + Sync;

/// The backward of an [`Opaque`] op: the gradient of each input (`None` for an input that
/// gets none) from the saved tensors and the output's gradient, written with kiln ops (so
/// it is recorded, fused and differentiable again).
pub type Backward = dyn Fn(&Saved<'_>, &Tensor) -> Result<Vec<Option<Tensor>>> + Send + Sync;

/// What autocast does to an [`Opaque`] op's inputs (see [`crate::autocast()`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AutocastPolicy {
    /// Nothing: the op runs on the dtypes it is given.
    #[default]
    Keep,
    /// 16-bit float inputs are widened to f32, as precision-sensitive ops' are (PyTorch's
    /// `custom_fwd(cast_inputs=torch.float32)`).
    Widen,
    /// f32 and f64 inputs are lowered to the autocast type, as products' are.
    Lower,
}

/// The tensors an [`Opaque`] op's backward reads: its inputs as they were when it ran, and
/// its output.
pub struct Saved<'a> {
    inputs: &'a [Tensor],
    output: &'a Tensor,
}

impl Saved<'_> {
    /// The op's inputs.
    pub fn inputs(&self) -> &[Tensor] {
        self.inputs
    }

    /// The op's output, with the op's history: a backward that reads it is differentiable
    /// again through the op (second derivatives).
    pub fn output(&self) -> &Tensor {
        self.output
    }
}

/// An opaque user op, defined once with [`Opaque::builder`] and called like a built-in op.
///
/// ```
/// use kiln::ops::{Opaque, Split};
/// use kiln::prelude::*;
/// // The running product of each row, with its gradient.
/// let cumprod = Opaque::builder("row_cumprod", 1, |inputs, out| {
///     let x = &inputs[0];
///     let (data, cols) = (x.data::<f32>()?, x.shape()[1]);
///     let (start, values) = (out.start(), out.values::<f32>()?);
///     for (i, row) in values.chunks_mut(cols).enumerate() {
///         let mut acc = 1.0;
///         for (j, v) in row.iter_mut().enumerate() {
///             acc *= data[x.position(&[start / cols + i, j])];
///             *v = acc;
///         }
///     }
///     Ok(())
/// })
/// .split(Split::Rows)
/// .backward(|saved, grad| {
///     // d/dx_j of Σ_k g_k y_k = Σ_{k ≥ j} g_k y_k / x_j
///     let (x, y) = (&saved.inputs()[0], saved.output());
///     let g = (grad * y).flip(&[1]).cumsum(1).flip(&[1]);
///     Ok(vec![Some(g / x)])
/// })
/// .build();
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]).requires_grad_(true);
/// let y = cumprod.call(&[&x.t()]); // a transposed input is read through its strides
/// assert_eq!(y.to_vec::<f32>(), vec![1.0, 4.0, 2.0, 10.0, 3.0, 18.0]);
/// cumprod.call(&[&x]).sum().backward();
/// assert_eq!(x.grad().unwrap().to_vec::<f32>(), vec![9.0, 4.0, 2.0, 36.0, 28.0, 20.0]);
/// ```
#[derive(Clone)]
pub struct Opaque(Arc<Definition>);

struct Definition {
    name: &'static str,
    id: u64,
    arity: usize,
    shape: Option<Box<ShapeRule>>,
    backward: Option<Arc<Backward>>,
    autocast: AutocastPolicy,
    runs_on_gpu: bool,
}

/// An [`Opaque`] op being defined: [`Opaque::builder`], then the optional parts, then
/// [`OpaqueBuilder::build`].
pub struct OpaqueBuilder {
    name: &'static str,
    arity: usize,
    cpu: Box<CpuFn>,
    split: Split,
    cuda: Option<CudaKernel>,
    host_on_gpu: bool,
    shape: Option<Box<ShapeRule>>,
    backward: Option<Arc<Backward>>,
    autocast: AutocastPolicy,
    reference: Option<(Box<CpuFn>, f64)>,
}

impl std::fmt::Debug for Opaque {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Opaque({}, {} inputs)", self.0.name, self.0.arity)
    }
}

impl Opaque {
    /// Starts defining the op `name` of `inputs` inputs, computed on the CPU by `cpu`.
    ///
    /// `cpu` fills one chunk of the result (`out.values::<T>()`, element `i` being the
    /// result's row-major element `out.start() + i`) from the inputs' strided views; kiln
    /// calls it on every thread, for chunks as [`OpaqueBuilder::split`] allows. It is also
    /// the reference the reference executor and `KILN_CHECK` run. Returning `Err` (or
    /// panicking) fails the run with the message, naming the op and the caller's line.
    pub fn builder<F>(name: &'static str, inputs: usize, cpu: F) -> OpaqueBuilder
    where
        F: Fn(&[CpuInput<'_>], &mut CpuOutput<'_>) -> std::result::Result<(), String>
            + Send
            + Sync
            + 'static,
    {
        OpaqueBuilder {
            name,
            arity: inputs,
            cpu: Box::new(cpu),
            split: Split::Elements,
            cuda: None,
            host_on_gpu: false,
            shape: None,
            backward: None,
            autocast: AutocastPolicy::Keep,
            reference: None,
        }
    }

    /// The op's name.
    pub fn name(&self) -> &'static str {
        self.0.name
    }

    /// The op of `inputs`.
    ///
    /// # Panics
    /// As [`Opaque::try_call`] fails.
    #[track_caller]
    pub fn call(&self, inputs: &[&Tensor]) -> Tensor {
        ok(self.try_call(inputs))
    }

    /// [`Opaque::call`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] for the wrong number of inputs or when the shape rule refuses them;
    /// [`Error::Device`] for inputs on different devices, or on a GPU when the op has no
    /// CUDA implementation.
    #[track_caller]
    pub fn try_call(&self, inputs: &[&Tensor]) -> Result<Tensor> {
        let _at = crate::engine::origin::enter();
        let d = &*self.0;
        if inputs.len() != d.arity {
            return Err(Error::Shape {
                op: d.name,
                detail: format!("takes {} inputs, got {}", d.arity, inputs.len()),
            });
        }
        let cast: Vec<Tensor> = inputs
            .iter()
            .map(|t| match d.autocast {
                AutocastPolicy::Keep => (*t).clone(),
                AutocastPolicy::Widen => t.autocast_widened(),
                AutocastPolicy::Lower => t.autocast_lowered(),
            })
            .collect();
        if let Some(gpu) = cast.iter().find(|t| t.device() != crate::Device::Cpu)
            && !d.runs_on_gpu
        {
            return Err(Error::Device {
                op: d.name,
                detail: format!(
                    "an input is on {}, and the op has no CUDA implementation: give it one \
                     with OpaqueBuilder::cuda (or let it run on host copies with \
                     OpaqueBuilder::host_on_gpu), or move its inputs to the CPU",
                    gpu.device()
                ),
            });
        }
        let typed: Vec<(Shape, DType)> =
            cast.iter().map(|t| (t.shape().clone(), t.dtype())).collect();
        let (shape, dtype) = match &d.shape {
            Some(rule) => rule(&typed).map_err(|detail| Error::Shape { op: d.name, detail })?,
            None => typed.first().cloned().ok_or_else(|| Error::Shape {
                op: d.name,
                detail: "an op without inputs needs a shape rule (OpaqueBuilder::shape)".into(),
            })?,
        };
        let op = Op::Custom(Custom {
            id: d.id,
            name: d.name,
            inputs: d.arity,
            shape,
            dtype,
            differentiable: d.backward.is_some(),
        });
        let detached: Vec<Tensor> = cast.iter().map(Tensor::detach).collect();
        let refs: Vec<&Tensor> = detached.iter().collect();
        let out = Tensor::from_op(op.clone(), &refs)?;
        let cast_refs: Vec<&Tensor> = cast.iter().collect();
        if is_grad_enabled() && dtype.is_float() && cast.iter().any(Tensor::requires_grad) {
            history::attach_custom(&out, op, &cast_refs, self.rule());
        }
        Ok(out)
    }

    /// The gradient rule autograd runs: the user's backward, its answer checked; or why
    /// there is none.
    fn rule(&self) -> std::result::Result<Arc<CustomBackward>, String> {
        let d = Arc::clone(&self.0);
        let Some(backward) = d.backward.clone() else {
            return Err(format!(
                "the user-defined op `{}` has no backward, so no gradient flows through it: \
                 give it one with OpaqueBuilder::backward, or detach its inputs",
                d.name
            ));
        };
        Ok(Arc::new(move |saved: &[Tensor], grad: &Tensor| {
            let (inputs, output) = saved.split_at(d.arity);
            let grads = backward(&Saved { inputs, output: &output[0] }, grad)?;
            if grads.len() != d.arity {
                return Err(Error::Autograd {
                    op: d.name,
                    detail: format!(
                        "its backward returned {} gradients for {} inputs (one `Option` per input)",
                        grads.len(),
                        d.arity
                    ),
                });
            }
            grads
                .into_iter()
                .zip(inputs)
                .enumerate()
                .map(|(i, (g, x))| match g {
                    Some(g) if g.shape() != x.shape() => Err(Error::Autograd {
                        op: d.name,
                        detail: format!(
                            "its backward returned a gradient of shape {} for input {i} of shape {}",
                            g.shape(),
                            x.shape()
                        ),
                    }),
                    Some(g) if g.dtype() != x.dtype() => Ok(Some(g.to_dtype(x.dtype()))),
                    g => Ok(g),
                })
                .collect()
        }))
    }
}

impl OpaqueBuilder {
    /// The result's shape and dtype from the inputs' (by default: the first input's).
    pub fn shape<F>(mut self, rule: F) -> OpaqueBuilder
    where
        F: Fn(&[(Shape, DType)]) -> std::result::Result<(Shape, DType), String>
            + Send
            + Sync
            + 'static,
    {
        self.shape = Some(Box::new(rule));
        self
    }

    /// How the CPU implementation's result may be split across threads (by default any
    /// run of elements; [`Split::Rows`] for whole rows of the last dimension,
    /// [`Split::Whole`] for one call, [`Split::Runs`] for short runs of costly elements).
    pub fn split(mut self, split: Split) -> OpaqueBuilder {
        self.split = split;
        self
    }

    /// A CUDA implementation: `source` (CUDA C, compiled by NVRTC when first run) with the
    /// entry point `entry`, declared with kiln's launch convention ([`CudaKernel`]).
    pub fn cuda(mut self, source: impl Into<String>, entry: impl Into<String>) -> OpaqueBuilder {
        let (source, entry) = (source.into(), entry.into());
        self.cuda = Some(CudaKernel { source, entry, warp_per_element: false });
        self
    }

    /// [`OpaqueBuilder::cuda`] with a warp (32 threads) per result element: the kernel is
    /// launched over `32 n` threads, and a grid-stride loop gives a warp's lanes the same
    /// element on every turn ([`CudaKernel::warp_per_element`]), for elements that are each
    /// a long reduction (a matrix-vector product's dot products).
    pub fn cuda_warp_per_element(
        mut self,
        source: impl Into<String>,
        entry: impl Into<String>,
    ) -> OpaqueBuilder {
        let (source, entry) = (source.into(), entry.into());
        self.cuda = Some(CudaKernel { source, entry, warp_per_element: true });
        self
    }

    /// Without a CUDA implementation, GPU inputs run the CPU implementation on host copies
    /// (their values copied to the host and the result back, inside the plan: a host step
    /// in profiles, and a plan that does not run as one CUDA graph) instead of being refused.
    pub fn host_on_gpu(mut self) -> OpaqueBuilder {
        self.host_on_gpu = true;
        self
    }

    /// The backward: each input's gradient from the [`Saved`] tensors and the output's
    /// gradient (see [`Backward`]). Without one, a gradient reaching the op is an error.
    pub fn backward<F>(mut self, backward: F) -> OpaqueBuilder
    where
        F: Fn(&Saved<'_>, &Tensor) -> Result<Vec<Option<Tensor>>> + Send + Sync + 'static,
    {
        self.backward = Some(Arc::new(backward));
        self
    }

    /// A simpler implementation of the same result (same signature as the CPU one, split
    /// the same way: an f64 loop beside an optimised kernel) that `KILN_CHECK` runs too,
    /// failing the run where an element differs from it by more than `tolerance` of the
    /// larger magnitude (at least 1).
    pub fn reference<F>(mut self, tolerance: f64, reference: F) -> OpaqueBuilder
    where
        F: Fn(&[CpuInput<'_>], &mut CpuOutput<'_>) -> std::result::Result<(), String>
            + Send
            + Sync
            + 'static,
    {
        self.reference = Some((Box::new(reference), tolerance));
        self
    }

    /// What autocast does to the inputs ([`AutocastPolicy::Keep`] by default).
    pub fn autocast(mut self, policy: AutocastPolicy) -> OpaqueBuilder {
        self.autocast = policy;
        self
    }

    /// The op, ready to call (its implementations registered with the runtime for the life
    /// of the process: define an op once, in a `static` `LazyLock` or a struct that keeps
    /// it, not once per call).
    pub fn build(self) -> Opaque {
        let runs_on_gpu = self.cuda.is_some() || self.host_on_gpu;
        let id = registry::register(Implementation {
            name: self.name,
            cpu: self.cpu,
            split: self.split,
            cuda: self.cuda,
            host_on_gpu: self.host_on_gpu,
            reference: self.reference,
        });
        Opaque(Arc::new(Definition {
            name: self.name,
            id,
            arity: self.arity,
            shape: self.shape,
            backward: self.backward,
            autocast: self.autocast,
            runs_on_gpu,
        }))
    }
}
