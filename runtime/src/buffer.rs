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
/// allocator, aligned to 64 bytes.
#[derive(Clone)]
pub struct Buffer(Arc<Block>);

struct Block {
    ptr: NonNull<u8>,
    class: usize,
    len: usize,
    dtype: DType,
}

// SAFETY: the block's memory is written only before the `Buffer` is handed out and is
// immutable afterwards; shared reads from any thread are sound.
unsafe impl Send for Block {}
// SAFETY: as above.
unsafe impl Sync for Block {}

impl Block {
    /// Uninitialized memory for `len` elements of `dtype` from the caching allocator (a
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
        Ok(Block { ptr, class, len, dtype })
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if self.class > 0 {
            alloc::release(self.ptr, self.class);
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
        let typed = block.ptr.cast::<T>();
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
        let filled = unsafe { Buffer::from_raw_fill_many(&[dtype], len, |ptrs| fill(ptrs[0])) }?;
        Ok(filled.map(|mut one| one.pop().expect("one buffer")))
    }

    /// Buffers of `len` elements of each of `dtypes`, written together by `fill` (a kernel
    /// with several outputs), which receives their uninitialized memory in order.
    ///
    /// # Safety
    /// `fill` must write every element of every buffer with a valid value of its dtype
    /// before returning.
    ///
    /// # Errors
    /// [`RuntimeError::OutOfMemory`] when an allocation fails.
    pub unsafe fn from_raw_fill_many<E>(
        dtypes: &[DType],
        len: usize,
        fill: impl FnOnce(&[*mut u8]) -> Result<(), E>,
    ) -> Result<Result<Vec<Buffer>, E>, RuntimeError> {
        let mut blocks = Vec::with_capacity(dtypes.len());
        for &dtype in dtypes {
            // Built before filling, so that an early return releases what was allocated.
            blocks.push(Block::new(dtype, len)?);
        }
        let ptrs: Vec<*mut u8> = blocks.iter().map(|b| b.ptr.as_ptr()).collect();
        Ok(fill(&ptrs).map(|()| blocks.into_iter().map(|b| Buffer(Arc::new(b))).collect()))
    }

    /// The address of the first element, for generated code that only reads it.
    pub fn as_ptr(&self) -> *const u8 {
        self.0.ptr.as_ptr()
    }

    /// A buffer holding a copy of `data`.
    ///
    /// # Errors
    /// [`RuntimeError::OutOfMemory`] when the allocation fails.
    pub fn from_slice<T: Element>(data: &[T]) -> Result<Buffer, RuntimeError> {
        Buffer::from_iter(data.len(), data.iter().copied())
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
        Device::Cpu
    }

    /// The elements, if `T` is the buffer's element type.
    pub fn as_slice<T: Element>(&self) -> Option<&[T]> {
        if T::DTYPE != self.0.dtype {
            return None;
        }
        // SAFETY: the block holds `len` initialized elements of `T` (checked by dtype), is
        // aligned for it, and is immutable while `self` borrows it.
        Some(unsafe { std::slice::from_raw_parts(self.0.ptr.cast::<T>().as_ptr(), self.0.len) })
    }

    /// Element `i` as a scalar.
    ///
    /// # Panics
    /// If `i` is out of range.
    pub fn get(&self, i: usize) -> Scalar {
        with_element_type!(self.dtype(), T => self.typed::<T>()[i].to_scalar())
    }

    /// The elements that `view` selects, in row-major order, converted to `T` (Rust `as`
    /// semantics).
    ///
    /// # Panics
    /// If the view reaches past the end of the buffer.
    pub fn gather<T: Element>(&self, view: &View) -> Vec<T> {
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
