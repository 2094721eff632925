//! Reading values: the realization triggers.

use kiln_ir::Element;
use kiln_runtime::Buffer;

use super::Tensor;
use crate::error::ok;
use crate::{Device, Error, Result};

impl Tensor {
    /// Computes this tensor now (and everything it depends on that is still pending),
    /// returning it for chaining. Reading values does this implicitly.
    ///
    /// # Panics
    /// When the computation fails (out of memory, say); [`Tensor::try_realize`] returns the
    /// error.
    #[track_caller]
    pub fn realize(&self) -> &Tensor {
        ok(self.try_realize());
        self
    }

    /// [`Tensor::realize`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Runtime`] when the computation fails; it names the op that failed and the
    /// line that recorded it.
    pub fn try_realize(&self) -> Result<()> {
        Tensor::try_realize_all(&[self])
    }

    /// This tensor on `device`: the same tensor when it is already there, otherwise a copy
    /// (which computes it first: moving data is a realization trigger). Autograd history is
    /// kept: gradients flow back across the copy, to the source's device.
    ///
    /// # Panics
    /// As [`Tensor::try_to`] fails.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::ones([2]);
    /// assert!(x.to(Device::Cpu).shares_storage_with(&x));
    /// let device = Device::cuda_if_available(0);
    /// assert_eq!(x.to(device).to_vec::<f32>(), vec![1.0, 1.0]);
    /// if !kiln::cuda::is_available() {
    ///     assert!(x.try_to(Device::Cuda(0)).is_err());
    /// }
    /// ```
    #[track_caller]
    #[must_use]
    pub fn to(&self, device: Device) -> Tensor {
        ok(self.try_to(device))
    }

    /// [`Tensor::to`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Device`] for a device that cannot be used (no CUDA driver, no such device),
    /// with the reason; [`Error::Runtime`] when computing the tensor or the copy fails.
    #[track_caller]
    pub fn try_to(&self, device: Device) -> Result<Tensor> {
        if device == self.device() {
            return Ok(self.clone());
        }
        if let Device::Cuda(i) = device
            && i >= kiln_runtime::cuda::device_count()
        {
            let why = match kiln_runtime::cuda::unavailable_reason() {
                Some(reason) => reason.to_string(),
                None => {
                    format!("there are only {} CUDA devices", kiln_runtime::cuda::device_count())
                }
            };
            return Err(Error::Device {
                op: "to",
                detail: format!(
                    "cannot move a tensor from {} to {device}: {why}; keep tensors on Device::Cpu (Device::cuda_if_available picks the CPU when there is no GPU)",
                    self.device()
                ),
            });
        }
        // The node whose dense result is exactly this tensor's elements.
        let node = self.node();
        crate::engine::session::check_read(&node)?;
        crate::engine::realize::realize(std::slice::from_ref(&node))?;
        let buffer =
            node.buffer().ok_or_else(|| Error::Internal("a realized node has no buffer".into()))?;
        let moved = buffer.to_device(device).map_err(kiln_runtime::RunError::from)?;
        let out = Tensor::from_buffer(moved, self.shape().clone());
        super::history::record_copy(&out, self);
        Ok(out)
    }

    /// This tensor on CUDA device 0 (see [`Tensor::to`]).
    ///
    /// # Panics
    /// As [`Tensor::try_to`] fails.
    #[track_caller]
    #[must_use]
    pub fn cuda(&self) -> Tensor {
        self.to(Device::Cuda(0))
    }

    /// This tensor on the CPU (see [`Tensor::to`]).
    #[track_caller]
    #[must_use]
    pub fn cpu(&self) -> Tensor {
        self.to(Device::Cpu)
    }

    /// Computes several tensors together, sharing the work they have in common.
    ///
    /// # Errors
    /// [`Error::Runtime`] when the computation fails.
    pub fn try_realize_all(tensors: &[&Tensor]) -> Result<()> {
        let nodes: Vec<_> = tensors.iter().map(|t| t.storage().node()).collect();
        crate::engine::realize::realize(&nodes)
    }

    /// The address of the first element (PyTorch's `data_ptr`), in host memory or on the
    /// tensor's GPU, computing the tensor first: two tensors with one address share memory,
    /// and a value written in place keeps its address.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::zeros([4, 4]);
    /// let at = x.data_ptr();
    /// assert_eq!(x.narrow(0, 1, 2).data_ptr(), at + 4 * x.element_size()); // row 1
    /// ```
    ///
    /// # Panics
    /// When the computation fails; [`Tensor::try_data_ptr`] returns the error.
    #[track_caller]
    pub fn data_ptr(&self) -> usize {
        crate::error::ok(self.try_data_ptr())
    }

    /// [`Tensor::data_ptr`], returning an error when computing the tensor fails.
    ///
    /// # Errors
    /// The computation's errors.
    pub fn try_data_ptr(&self) -> Result<usize> {
        Ok(self.buffer()?.address() + self.storage_offset() * self.element_size())
    }

    /// The storage's buffer in host memory (a copy of a GPU tensor's), computing it if needed.
    pub(crate) fn host_buffer(&self) -> Result<Buffer> {
        let buffer = self.buffer()?;
        buffer.to_device(Device::Cpu).map_err(|e| kiln_runtime::RunError::from(e).into())
    }

    /// The storage's buffer, computing it if needed.
    pub(crate) fn buffer(&self) -> Result<Buffer> {
        let node = self.storage().node();
        if let Some(b) = node.buffer() {
            return Ok(b);
        }
        crate::engine::session::check_read(&node)?;
        crate::engine::realize::realize(std::slice::from_ref(&node))?;
        node.buffer().ok_or_else(|| Error::Internal("a realized node has no buffer".into()))
    }

    /// The elements in row-major order, converted to `T` (Rust `as` semantics).
    ///
    /// # Panics
    /// When the computation fails; [`Tensor::try_to_vec`] returns the error.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![1.5f32, 2.5, 3.5, 4.5], [2, 2]);
    /// assert_eq!(x.t().to_vec::<f32>(), vec![1.5, 3.5, 2.5, 4.5]);
    /// assert_eq!(x.to_vec::<i64>(), vec![1, 2, 3, 4]);
    /// ```
    #[track_caller]
    pub fn to_vec<T: Element>(&self) -> Vec<T> {
        ok(self.try_to_vec())
    }

    /// [`Tensor::to_vec`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Runtime`] when the computation fails.
    pub fn try_to_vec<T: Element>(&self) -> Result<Vec<T>> {
        Ok(self.host_buffer()?.gather(self.layout()))
    }

    /// The value of a one-element tensor, converted to `T`.
    ///
    /// # Panics
    /// When the tensor has more or fewer than one element, or the computation fails;
    /// [`Tensor::try_item`] returns the error.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]);
    /// assert_eq!(x.sum().item::<f32>(), 6.0);
    /// ```
    #[track_caller]
    pub fn item<T: Element>(&self) -> T {
        ok(self.try_item())
    }

    /// [`Tensor::item`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] unless the tensor has exactly one element; [`Error::Runtime`] when
    /// the computation fails.
    pub fn try_item<T: Element>(&self) -> Result<T> {
        if self.numel() != 1 {
            return Err(Error::shape(
                "item",
                format!(
                    "needs a tensor with one element, got shape {} ({} elements); reduce it first (e.g. .sum()) or use .to_vec()",
                    self.shape(),
                    self.numel()
                ),
            ));
        }
        let buffer = self.host_buffer()?;
        Ok(T::from_scalar(buffer.get(self.layout().offset())))
    }
}
