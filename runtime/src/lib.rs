//! kiln's runtime: devices, buffers, the CPU allocator, and the executors that run graphs.
//!
//! - [`Device`]: where data lives.
//! - [`Buffer`]: an immutable, reference-counted block of elements from the device's
//!   allocator ([`alloc`] for the CPU: 64-byte aligned, cached by size class).
//! - [`reference::run`]: the reference executor, one op at a time with plain loops, the
//!   oracle that generated kernels are tested against.
//!
//! The runtime knows graphs and buffers, never tensors or autograd state.
#![warn(missing_docs)]

pub mod alloc;
mod buffer;
mod device;
mod error;
pub mod reference;

pub use buffer::Buffer;
pub use device::Device;
pub use error::{RunError, RuntimeError};
