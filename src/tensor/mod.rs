//! The tensor handle and its attributes.

mod arith;
mod arrange;
mod autocast;
mod bins;
mod bitwise;
mod checks;
mod create;
mod data_sized;
mod display;
mod division;
mod dynamic;
mod einsum;
mod erfinv;
mod gamma;
pub(crate) mod grad_mode;
pub(crate) mod history;
mod index;
mod inplace;
mod linalg;
mod movement;
mod operators;
mod read;
mod reduce;
mod sample;
mod select;
mod sort;
mod special;
mod statistics;
mod trig;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use kiln_ir::{DType, Op, Shape, View};
use kiln_runtime::{Buffer, Device};
use smallvec::SmallVec;

pub use arith::Operand;
pub use arrange::Indexing;
pub use data_sized::Unique;
pub use division::Rounding;
pub use einsum::{einsum, try_einsum};
pub use index::{Ellipsis, IndexOp, NewAxis, TensorIndex};
pub use reduce::Dims;
pub use statistics::Interpolation;

use crate::engine::lazy::{Inputs, LazyNode};
use crate::engine::storage::Storage;
use crate::{Error, Result};
use history::AutogradMeta;

/// An n-dimensional array of one dtype on one device, recorded lazily.
///
/// Operations on tensors do not compute: they record a node of a graph and return at once,
/// checking shapes, dtypes and devices on the way (so a mistake is reported at the line that
/// made it). The graph runs when a value is needed: [`item`](Tensor::item),
/// [`to_vec`](Tensor::to_vec), printing, or an explicit [`realize`](Tensor::realize).
///
/// A `Tensor` is a cheap handle: cloning it shares the data, and it is `Send + Sync`. Like a
/// PyTorch tensor it is a *view* of a storage: [`permute`](Tensor::permute),
/// [`transpose`](Tensor::transpose), [`expand`](Tensor::expand), [`narrow`](Tensor::narrow),
/// [`view`](Tensor::view) and friends make new tensors over the same storage without
/// recording any work, and [`stride`](Tensor::stride) and
/// [`is_contiguous`](Tensor::is_contiguous) report the layout as PyTorch does.
///
/// ```
/// use kiln::prelude::*;
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]);
/// let y = (&x * 2.0 + 1.0).relu().sum_dim(1, false); // recorded, not computed
/// assert_eq!(y.to_vec::<f32>(), vec![15.0, 33.0]);  // computed here
/// assert_eq!(x.t().stride(), vec![1, 3]);
/// ```
#[derive(Clone)]
pub struct Tensor(pub(crate) Arc<TensorInner>);

pub(crate) struct TensorInner {
    storage: Arc<Storage>,
    view: View,
    pub(crate) autograd: Mutex<AutogradMeta>,
    /// The dimensions marked dynamic ([`Tensor::mark_dynamic`]), one bit each.
    dynamic: AtomicU64,
}

impl Tensor {
    /// A tensor owning the result of a new node, viewed densely.
    pub(crate) fn from_node(node: Arc<LazyNode>) -> Tensor {
        let view = View::contiguous(node.shape.clone());
        Tensor(Arc::new(TensorInner {
            storage: Storage::new(node),
            view,
            autograd: Mutex::default(),
            dynamic: AtomicU64::new(0),
        }))
    }

    /// A tensor over an already computed buffer.
    #[track_caller]
    pub(crate) fn from_buffer(buffer: Buffer, shape: Shape) -> Tensor {
        Tensor::from_node(LazyNode::realized(buffer, shape, crate::engine::origin::caller()))
    }

    /// Another view of the same storage, with no autograd history.
    pub(crate) fn with_view(&self, view: View) -> Tensor {
        Tensor(Arc::new(TensorInner {
            storage: self.0.storage.clone(),
            view,
            autograd: Mutex::default(),
            dynamic: AtomicU64::new(0),
        }))
    }

    /// A handle to this tensor's current value that later in-place writes do not reach: the
    /// same node in a storage of its own, with this tensor's autograd history.
    pub(crate) fn snapshot(&self) -> Tensor {
        let storage = Storage::new(self.0.storage.node());
        let autograd = Mutex::new(history::snapshot_meta(self));
        let dynamic = AtomicU64::new(self.0.dynamic.load(Ordering::Relaxed));
        Tensor(Arc::new(TensorInner { storage, view: self.0.view.clone(), autograd, dynamic }))
    }

    pub(crate) fn storage(&self) -> &Arc<Storage> {
        &self.0.storage
    }

    pub(crate) fn layout(&self) -> &View {
        &self.0.view
    }

    /// The node whose dense, row-major result is this tensor's value: the storage's node
    /// itself when the view covers it exactly, otherwise a `View` node reading it.
    #[track_caller]
    pub(crate) fn node(&self) -> Arc<LazyNode> {
        let base = self.0.storage.node();
        if self.0.view.is_identity_of(&base.shape) {
            return base;
        }
        let (dtype, device) = (base.dtype, base.device);
        LazyNode::pending(
            Op::View(self.0.view.clone()),
            smallvec::smallvec![base],
            self.0.view.shape().clone(),
            dtype,
            device,
            crate::engine::origin::caller(),
        )
    }

    /// Records `op` over `inputs` (which must share a device), inferring shape and dtype.
    #[track_caller]
    pub(crate) fn from_op(op: Op, inputs: &[&Tensor]) -> Result<Tensor> {
        let device = check_same_device(op.name(), inputs)?;
        // A loop, not a closure: `#[track_caller]` does not pass through closures, and a
        // view node made here must record the user's line.
        let mut nodes = Inputs::with_capacity(inputs.len());
        // Constants recorded again on the device: autograd must save these, not the
        // originals, or the backward graph would mix devices (`x.pow(2.5)` on a GPU).
        let mut moved: Vec<Tensor> = Vec::new();
        for t in inputs {
            if t.device() == device {
                nodes.push(t.node());
            } else {
                let r = t.rehomed(device);
                nodes.push(r.node());
                moved.push(r);
            }
        }
        let (shape, dtype) = {
            let typed: SmallVec<[(&Shape, DType); 4]> =
                nodes.iter().map(|n| (&n.shape, n.dtype)).collect();
            op.infer(&typed)?
        };
        shape.check_size(op.name(), dtype)?;
        let grad_op = history::wants_grad(&op, dtype, inputs).then(|| op.clone());
        let out = Tensor::from_node(LazyNode::pending(
            op,
            nodes,
            shape,
            dtype,
            device,
            crate::engine::origin::caller(),
        ));
        if let Some(op) = grad_op {
            if moved.is_empty() {
                history::attach(&out, op, inputs);
            } else {
                let mut moved = moved.iter();
                let saved: Vec<&Tensor> =
                    inputs
                        .iter()
                        .map(|&t| {
                            if t.device() == device {
                                t
                            } else {
                                moved.next().expect("one per move")
                            }
                        })
                        .collect();
                history::attach(&out, op, &saved);
            }
        }
        Ok(out)
    }

    /// Records a leaf op (a fill) with the given shape and dtype.
    #[track_caller]
    pub(crate) fn from_leaf(op: Op, shape: Shape, dtype: DType) -> Result<Tensor> {
        Tensor::from_leaf_on(op, shape, dtype, Device::Cpu)
    }

    /// Records a leaf op (a fill) on `device`.
    #[track_caller]
    pub(crate) fn from_leaf_on(
        op: Op,
        shape: Shape,
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        op.check_leaf(dtype)?;
        shape.check_size(op.name(), dtype)?;
        Ok(Tensor::from_node(LazyNode::pending(
            op,
            Inputs::new(),
            shape,
            dtype,
            device,
            crate::engine::origin::caller(),
        )))
    }

    /// Whether this tensor is a constant not computed yet (a pending fill, or a view of
    /// one): it holds no data, so it can join tensors of any device, as scalars in
    /// expressions like `&x * 2.0` do.
    pub(crate) fn is_pending_fill(&self) -> bool {
        let node = self.storage().node();
        matches!(node.op, Op::Full(_)) && node.buffer().is_none()
    }

    /// A pending fill (`is_pending_fill`) recorded again on `device` (same value, shape and
    /// view), so that every node of a graph is on the device the graph runs on.
    pub(crate) fn rehomed(&self, device: Device) -> Tensor {
        let base = self.storage().node();
        let leaf = LazyNode::pending(
            base.op.clone(),
            Inputs::new(),
            base.shape.clone(),
            base.dtype,
            device,
            base.origin,
        );
        Tensor::from_node(leaf).with_view(self.layout().clone())
    }

    // ----- attributes ---------------------------------------------------------------------

    /// The shape.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// assert_eq!(Tensor::zeros([2, 3]).shape().dims(), &[2, 3]);
    /// ```
    pub fn shape(&self) -> &Shape {
        self.0.view.shape()
    }

    /// The extent of each dimension.
    pub fn dims(&self) -> &[usize] {
        self.0.view.shape().dims()
    }

    /// The number of dimensions.
    pub fn ndim(&self) -> usize {
        self.0.view.shape().rank()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.0.view.shape().numel()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.0.storage.dtype()
    }

    /// The device holding the data.
    pub fn device(&self) -> Device {
        self.0.storage.device()
    }

    /// The step, in elements, between neighbours along each dimension of the storage, as
    /// PyTorch reports it (0 for a broadcast dimension).
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::zeros([2, 3, 4]);
    /// assert_eq!(x.stride(), vec![12, 4, 1]);
    /// assert_eq!(x.permute(&[2, 0, 1]).stride(), vec![1, 12, 4]);
    /// assert_eq!(Tensor::zeros([3, 1]).expand(&[3, 5]).stride(), vec![1, 0]);
    /// ```
    pub fn stride(&self) -> Vec<usize> {
        self.0.view.strides().iter().map(|&s| s.unsigned_abs()).collect()
    }

    /// Whether the elements lie densely in row-major order in the storage.
    pub fn is_contiguous(&self) -> bool {
        self.0.view.is_contiguous()
    }

    /// Bytes per element.
    pub fn element_size(&self) -> usize {
        self.dtype().size_in_bytes()
    }

    /// The offset of the first element in the storage, in elements.
    pub fn storage_offset(&self) -> usize {
        self.0.view.offset()
    }

    /// Whether two tensors are views of one storage.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::zeros([2, 3]);
    /// assert!(x.t().shares_storage_with(&x));
    /// assert!(!x.contiguous().t().contiguous().shares_storage_with(&x));
    /// ```
    pub fn shares_storage_with(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0.storage, &other.0.storage)
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({} {} on {}", self.shape(), self.dtype(), self.device())?;
        if !self.is_contiguous() {
            write!(f, ", strides {:?}", self.0.view.strides())?;
        }
        f.write_str(")")
    }
}

/// The device an op over `inputs` runs on: theirs, which must agree (constants not computed
/// yet join any device), or an error naming both.
pub(crate) fn check_same_device(op: &'static str, inputs: &[&Tensor]) -> Result<Device> {
    let Some(first) = inputs.first() else { return Ok(Device::Cpu) };
    if inputs.iter().all(|t| t.device() == first.device()) {
        return Ok(first.device());
    }
    let placed: Vec<&&Tensor> = inputs.iter().filter(|t| !t.is_pending_fill()).collect();
    let Some(anchor) = placed.first() else { return Ok(first.device()) };
    if let Some(other) = placed.iter().find(|t| t.device() != anchor.device()) {
        return Err(Error::Device {
            op,
            detail: format!(
                "expected all tensors on one device, found {} and {}; move one with .to(device)",
                anchor.device(),
                other.device()
            ),
        });
    }
    Ok(anchor.device())
}
