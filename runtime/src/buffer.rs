//! Buffers: immutable, reference-counted blocks of elements on a device.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use kiln_ir::{DType, Element, Scalar, View};

use crate::{Device, RuntimeError, alloc};

/// Calls `$body` with `$t` bound to the Rust element type of `$dtype`.
macro_rules! with_element_type {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            kiln_ir::DType::F32 => {
                type $t = f32;
                $body
            }
            kiln_ir::DType::F64 => {
                type $t = f64;
                $body
            }
            kiln_ir::DType::F16 => {
                type $t = half::f16;
                $body
            }
            kiln_ir::DType::BF16 => {
                type $t = half::bf16;
                $body
            }
            kiln_ir::DType::I64 => {
                type $t = i64;
                $body
            }
            kiln_ir::DType::I32 => {
                type $t = i32;
                $body
            }
            kiln_ir::DType::I8 => {
                type $t = i8;
                $body
            }
            kiln_ir::DType::U8 => {
                type $t = u8;
                $body
            }
            kiln_ir::DType::Bool => {
                type $t = bool;
                $body
            }
        }
    };
}
pub(crate) use with_element_type;

/// A dense block of `len` elements of one dtype, written once when created and read-only
/// afterwards, so clones share it freely across threads. CPU blocks come from kiln's caching
/// allocator, aligned to 64 bytes; CUDA blocks from the device's caching allocator.
#[derive(Clone)]
pub struct Buffer(Arc<Block>);

struct Block {
    memory: Memory,
    len: usize,
    dtype: DType,
}

enum Memory {
    /// Host memory from [`alloc`]: `class` is its size class (0 for an empty block, whose
    /// pointer is dangling and never dereferenced).
    Host { ptr: NonNull<u8>, class: usize },
    /// Device memory, returned to its device's cache on drop.
    Cuda(crate::cuda::DeviceMemory),
}

// SAFETY: the block's memory is written only before the `Buffer` is handed out and is
// immutable afterwards; shared reads from any thread are sound.
unsafe impl Send for Block {}
// SAFETY: as above.
unsafe impl Sync for Block {}

impl Block {
    /// Uninitialized host memory for `len` elements of `dtype` from the caching allocator (a
    /// dangling, never-dereferenced pointer when empty).
    fn new(dtype: DType, len: usize) -> Result<Block, RuntimeError> {
        let bytes = len
            .checked_mul(dtype.size_in_bytes())
            .ok_or(RuntimeError::OutOfMemory { device: Device::Cpu, bytes: usize::MAX })?;
        let (ptr, class) = if bytes == 0 {
            (NonNull::<u64>::dangling().cast::<u8>(), 0)
        } else {
            alloc::allocate(bytes)
                .ok_or(RuntimeError::OutOfMemory { device: Device::Cpu, bytes })?
        };
        Ok(Block { memory: Memory::Host { ptr, class }, len, dtype })
    }

    /// The host address of the first element.
    ///
    /// # Panics
    /// For a device block: the executors hand host code only host buffers.
    fn host_ptr(&self) -> NonNull<u8> {
        match &self.memory {
            Memory::Host { ptr, .. } => *ptr,
            Memory::Cuda(_) => panic!("a CUDA buffer was handed to host code (a bug in kiln)"),
        }
    }

    fn bytes(&self) -> usize {
        self.len * self.dtype.size_in_bytes()
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if let Memory::Host { ptr, class } = self.memory
            && class > 0
        {
            alloc::release(ptr, class);
        }
    }
}

impl Buffer {
    /// A buffer of `len` elements of type `T`, the `i`-th taken from `values`. Elements the
    /// iterator does not provide are zero.
    ///
    /// # Errors
    /// [`RuntimeError::OutOfMemory`] when the allocation fails.
    pub fn from_iter<T: Element>(
        len: usize,
        values: impl IntoIterator<Item = T>,
    ) -> Result<Buffer, RuntimeError> {
        let block = Block::new(T::DTYPE, len)?;
        let typed = block.host_ptr().cast::<T>();
        let mut written = 0;
        for v in values.into_iter().take(len) {
            // SAFETY: `written < len` and the block holds `len` elements of `T`, aligned to 64.
            unsafe { typed.as_ptr().add(written).write(v) };
            written += 1;
        }
        for i in written..len {
            // SAFETY: as above; the all-zero bit pattern is a valid value of every element type.
            unsafe { typed.as_ptr().add(i).cast::<u8>().write_bytes(0, std::mem::size_of::<T>()) };
        }
        Ok(Buffer(Arc::new(block)))
    }

    /// A buffer of `len` elements of `dtype` whose contents `fill` writes through a raw
    /// pointer (a generated kernel). The memory handed to `fill` is uninitialized.
    ///
    /// # Safety
    /// `fill` must write every one of the `len` elements with a valid value of `dtype`
    /// before returning.
    ///
    /// # Errors
    /// [`RuntimeError::OutOfMemory`] when the allocation fails.
    pub unsafe fn from_raw_fill<E>(
        dtype: DType,
        len: usize,
        fill: impl FnOnce(*mut u8) -> Result<(), E>,
    ) -> Result<Result<Buffer, E>, RuntimeError> {
        // SAFETY: `fill` writes the one buffer, per this function's contract.
        let filled = unsafe { Buffer::from_raw_fill_many(&[(dtype, len)], |ptrs| fill(ptrs[0])) }?;
        Ok(filled.map(|mut one| one.pop().expect("one buffer")))
    }

    /// Buffers of the given dtypes and lengths, written together by `fill` (a kernel with
    /// several outputs), which receives their uninitialized memory in order.
    ///
    /// # Safety
    /// `fill` must write every element of every buffer with a valid value of its dtype
    /// before returning.
    ///
    /// # Errors
    /// [`RuntimeError::OutOfMemory`] when an allocation fails.
    pub unsafe fn from_raw_fill_many<E>(
        outputs: &[(DType, usize)],
        fill: impl FnOnce(&[*mut u8]) -> Result<(), E>,
    ) -> Result<Result<Vec<Buffer>, E>, RuntimeError> {
        let mut blocks = Vec::with_capacity(outputs.len());
        for &(dtype, len) in outputs {
            // Built before filling, so that an early return releases what was allocated.
            blocks.push(Block::new(dtype, len)?);
        }
        let ptrs: Vec<*mut u8> = blocks.iter().map(|b| b.host_ptr().as_ptr()).collect();
        Ok(fill(&ptrs).map(|()| blocks.into_iter().map(|b| Buffer(Arc::new(b))).collect()))
    }

    /// The host address of the first element, for generated code that only reads it.
    ///
    /// # Panics
    /// For a buffer on a CUDA device ([`Buffer::device`] tells).
    pub fn as_ptr(&self) -> *const u8 {
        self.0.host_ptr().as_ptr()
    }

    /// The address of the first element, in host or device memory.
    pub fn address(&self) -> usize {
        match &self.0.memory {
            Memory::Host { ptr, .. } => ptr.as_ptr() as usize,
            Memory::Cuda(m) => m.ptr() as usize,
        }
    }

    /// A buffer holding a copy of `data`.
    ///
    /// # Errors
    /// [`RuntimeError::OutOfMemory`] when the allocation fails.
    pub fn from_slice<T: Element>(data: &[T]) -> Result<Buffer, RuntimeError> {
        let block = Block::new(T::DTYPE, data.len())?;
        // SAFETY: the block holds `data.len()` elements of `T` and is not shared yet.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                block.host_ptr().cast::<T>().as_ptr(),
                data.len(),
            );
        }
        Ok(Buffer(Arc::new(block)))
    }

    /// A buffer of `len` elements of `dtype` from their little-endian bytes, made on `device`:
    /// one copy into host memory, or, for a GPU, one upload straight from `bytes` (a
    /// memory-mapped file's pages, say), with no host buffer in between.
    ///
    /// # Errors
    /// [`RuntimeError::Check`] when `bytes` does not hold `len` elements of `dtype` (or a
    /// bool is neither 0 nor 1); [`RuntimeError::OutOfMemory`]; the device's errors.
    pub fn from_le_bytes(
        dtype: DType,
        len: usize,
        bytes: &[u8],
        device: Device,
    ) -> Result<Buffer, RuntimeError> {
        let want = len.checked_mul(dtype.size_in_bytes());
        if want != Some(bytes.len()) {
            let want = want.map_or("more than memory holds".to_string(), |w| w.to_string());
            return Err(RuntimeError::Check {
                op: "from_le_bytes",
                detail: format!(
                    "{} bytes for {len} elements of {dtype}, which take {want}",
                    bytes.len()
                ),
            });
        }
        if dtype == DType::Bool && bytes.iter().any(|&b| b > 1) {
            return Err(RuntimeError::Check {
                op: "from_le_bytes",
                detail: "a bool byte other than 0 or 1".into(),
            });
        }
        match device {
            #[cfg(target_endian = "little")]
            Device::Cuda(i) => {
                let gpu = crate::cuda::gpu(i)?;
                let memory = Memory::Cuda(gpu.upload(bytes)?);
                Ok(Buffer(Arc::new(Block { memory, len, dtype })))
            }
            _ => {
                let block = Block::new(dtype, len)?;
                // SAFETY: the block holds `bytes.len()` bytes and is not shared yet.
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(block.host_ptr().as_ptr(), block.bytes())
                };
                dst.copy_from_slice(bytes);
                #[cfg(target_endian = "big")]
                dst.chunks_mut(dtype.size_in_bytes()).for_each(<[u8]>::reverse);
                Buffer(Arc::new(block)).to_device(device)
            }
        }
    }

    /// A buffer of `len` elements of type `T`, zeroed and then written by `fill` (host code
    /// that writes its result in place instead of building a vector to copy).
    ///
    /// # Errors
    /// [`RuntimeError::OutOfMemory`] when the allocation fails.
    pub fn zeroed_with<T: Element>(
        len: usize,
        fill: impl FnOnce(&mut [T]),
    ) -> Result<Buffer, RuntimeError> {
        /// Elements zeroed per task: large buffers (attention's packed gradients) are
        /// cleared by the whole team, not by the calling thread alone.
        const CHUNK: usize = 1 << 16;
        struct Ptr<T>(*mut T);
        // SAFETY: the tasks clear disjoint chunks.
        unsafe impl<T> Sync for Ptr<T> {}
        let block = Block::new(T::DTYPE, len)?;
        let typed = Ptr(block.host_ptr().cast::<T>().as_ptr());
        crate::team::for_each(len.div_ceil(CHUNK), &|i| {
            let typed = &typed;
            let start = i * CHUNK;
            // SAFETY: the block holds `len` elements of `T`, aligned and not shared yet, and
            // `start..start + n` lies inside it; the all-zero bit pattern is a valid value of
            // every element type.
            unsafe { typed.0.add(start).write_bytes(0, CHUNK.min(len - start)) };
        });
        // SAFETY: every element is initialized (zero) and the block is not shared yet.
        let data = unsafe { std::slice::from_raw_parts_mut(typed.0, len) };
        fill(data);
        Ok(Buffer(Arc::new(block)))
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.0.dtype
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.0.len
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }

    /// The device holding the data.
    pub fn device(&self) -> Device {
        match &self.0.memory {
            Memory::Host { .. } => Device::Cpu,
            Memory::Cuda(m) => m.gpu().device(),
        }
    }

    /// This buffer's data on `device`: the same buffer when it is already there, else a copy
    /// (which waits for the device's queued work when it reads from a GPU).
    ///
    /// # Errors
    /// [`RuntimeError::BackendUnavailable`] for a device that cannot be used,
    /// [`RuntimeError::OutOfMemory`], [`RuntimeError::Cuda`] when a copy fails.
    pub fn to_device(&self, device: Device) -> Result<Buffer, RuntimeError> {
        if device == self.device() {
            return Ok(self.clone());
        }
        let host = match &self.0.memory {
            Memory::Host { .. } => self.clone(),
            Memory::Cuda(m) => {
                let block = Block::new(self.0.dtype, self.0.len)?;
                // SAFETY: the host block holds `bytes` bytes, written completely by the copy
                // before it is read or shared.
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(block.host_ptr().as_ptr(), block.bytes())
                };
                m.gpu().download(m.ptr(), dst)?;
                Buffer(Arc::new(block))
            }
        };
        match device {
            Device::Cpu => Ok(host),
            Device::Cuda(i) => {
                let gpu = crate::cuda::gpu(i)?;
                // SAFETY: the host block holds `bytes` initialized bytes and is immutable.
                let src = unsafe {
                    std::slice::from_raw_parts(host.0.host_ptr().as_ptr(), host.0.bytes())
                };
                let memory = Memory::Cuda(gpu.upload(src)?);
                Ok(Buffer(Arc::new(Block { memory, len: self.0.len, dtype: self.0.dtype })))
            }
        }
    }

    /// Uninitialized device memory for `len` elements of `dtype` on `gpu`, to be written by a
    /// kernel queued before anything reads it.
    pub(crate) fn on_gpu(
        gpu: &'static crate::cuda::Gpu,
        dtype: DType,
        len: usize,
    ) -> Result<Buffer, RuntimeError> {
        let bytes = len
            .checked_mul(dtype.size_in_bytes())
            .ok_or(RuntimeError::OutOfMemory { device: gpu.device(), bytes: usize::MAX })?;
        let memory = Memory::Cuda(gpu.alloc(bytes)?);
        Ok(Buffer(Arc::new(Block { memory, len, dtype })))
    }

    /// A handle on a block of a CUDA graph's memory (see `cuda/graph.rs`): `bytes` bytes at
    /// `ptr`, holding `len` elements of `dtype`, which the graph keeps (nothing is freed when
    /// the handle drops).
    pub(crate) fn borrowed_on_gpu(
        gpu: &'static crate::cuda::Gpu,
        (ptr, bytes): (u64, usize),
        dtype: DType,
        len: usize,
    ) -> Buffer {
        let memory = crate::cuda::DeviceMemory::new(gpu, ptr, bytes, crate::cuda::Home::Borrowed);
        Buffer(Arc::new(Block { memory: Memory::Cuda(memory), len, dtype }))
    }

    /// The device block holding a CUDA buffer: its address and size in bytes.
    pub(crate) fn device_block(&self) -> Option<(u64, usize)> {
        match &self.0.memory {
            Memory::Cuda(m) => Some((m.ptr(), m.bytes())),
            Memory::Host { .. } => None,
        }
    }

    /// The device address of the first element on `gpu`.
    ///
    /// # Errors
    /// [`RuntimeError::Binding`] when the buffer is not on that device (a bug in the caller).
    pub(crate) fn device_ptr(&self, gpu: &crate::cuda::Gpu) -> Result<u64, RuntimeError> {
        match &self.0.memory {
            Memory::Cuda(m) if m.gpu().device() == gpu.device() => Ok(m.ptr()),
            _ => Err(RuntimeError::Binding {
                index: 0,
                expected: format!("a buffer on {}", gpu.device()),
                got: format!("a buffer on {}", self.device()),
            }),
        }
    }

    /// The elements, writable, if no other handle shares this buffer, `T` is its element
    /// type and it is in host memory: a step that is the last reader of its input may then
    /// write its result there instead of into a copy.
    pub(crate) fn unique_slice_mut<T: Element>(&mut self) -> Option<&mut [T]> {
        let block = Arc::get_mut(&mut self.0)?;
        if T::DTYPE != block.dtype {
            return None;
        }
        let Memory::Host { ptr, .. } = &block.memory else { return None };
        // SAFETY: the block holds `len` initialized elements of `T`, aligned for it; the
        // `Arc` is unique, so nothing else reads it while the slice is borrowed.
        Some(unsafe { std::slice::from_raw_parts_mut(ptr.cast::<T>().as_ptr(), block.len) })
    }

    /// Whether no other handle shares this buffer and it is in host memory: a step that is
    /// the last reader of it may then write into it.
    pub(crate) fn is_unique_on_host(&mut self) -> bool {
        Arc::get_mut(&mut self.0).is_some_and(|b| matches!(b.memory, Memory::Host { .. }))
    }

    /// The elements, if `T` is the buffer's element type and the buffer is in host memory.
    pub fn as_slice<T: Element>(&self) -> Option<&[T]> {
        if T::DTYPE != self.0.dtype {
            return None;
        }
        let Memory::Host { ptr, .. } = &self.0.memory else { return None };
        // SAFETY: the block holds `len` initialized elements of `T` (checked by dtype), is
        // aligned for it, and is immutable while `self` borrows it.
        Some(unsafe { std::slice::from_raw_parts(ptr.cast::<T>().as_ptr(), self.0.len) })
    }

    /// Element `i` as a scalar.
    ///
    /// # Panics
    /// If `i` is out of range, or the buffer is on a GPU and cannot be copied to the host
    /// (copy it first with [`Buffer::to_device`] to handle that error).
    pub fn get(&self, i: usize) -> Scalar {
        if self.device() != Device::Cpu {
            return self.host_copy().get(i);
        }
        with_element_type!(self.dtype(), T => self.typed::<T>()[i].to_scalar())
    }

    /// A host copy of a device buffer, for the panicking readers.
    fn host_copy(&self) -> Buffer {
        match self.to_device(Device::Cpu) {
            Ok(b) => b,
            Err(e) => panic!("reading a buffer on {}: {e}", self.device()),
        }
    }

    /// The elements that `view` selects, in row-major order, converted to `T` (Rust `as`
    /// semantics).
    ///
    /// # Panics
    /// If the view reaches past the end of the buffer, or as [`Buffer::get`] for a buffer on
    /// a GPU.
    pub fn gather<T: Element>(&self, view: &View) -> Vec<T> {
        if self.device() != Device::Cpu {
            return self.host_copy().gather(view);
        }
        assert!(
            view.span() <= self.len(),
            "view {view} reaches past a buffer of {} elements",
            self.len()
        );
        if let Some(data) = self.as_slice::<T>() {
            if view.is_contiguous() {
                let start = view.offset();
                return data[start..start + view.shape().numel()].to_vec();
            }
            return view.offsets().map(|o| data[o]).collect();
        }
        with_element_type!(self.dtype(), S => {
            let data = self.typed::<S>();
            view.offsets().map(|o| T::from_scalar(data[o].to_scalar())).collect()
        })
    }

    /// Whether two handles share one block.
    pub fn same_storage(&self, other: &Buffer) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    fn typed<T: Element>(&self) -> &[T] {
        self.as_slice::<T>().expect("with_element_type! picks the buffer's own element type")
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Buffer({} x {} on {})", self.len(), self.dtype(), self.device())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::Shape;

    #[test]
    fn gather_reads_views_and_converts() {
        let b = Buffer::from_slice(&[1.5f32, 2.5, 3.5, 4.5, 5.5, 6.5]).unwrap();
        let t = View::contiguous(Shape::from([2, 3])).permute(&[1, 0]);
        assert_eq!(b.gather::<f32>(&t), vec![1.5, 4.5, 2.5, 5.5, 3.5, 6.5]);
        assert_eq!(b.gather::<i64>(&t), vec![1, 4, 2, 5, 3, 6]);
        assert_eq!(b.get(5), Scalar::F64(6.5));
    }

    #[test]
    fn empty_buffers_need_no_memory() {
        let b = Buffer::from_slice::<f64>(&[]).unwrap();
        assert!(b.is_empty());
        assert_eq!(b.as_slice::<f64>().unwrap(), &[] as &[f64]);
    }

    #[test]
    fn allocation_failure_is_an_error() {
        let err = Buffer::from_iter::<f32>(1 << 42, std::iter::empty()).unwrap_err();
        assert!(matches!(err, RuntimeError::OutOfMemory { bytes, .. } if bytes == 1 << 44));
    }
}
