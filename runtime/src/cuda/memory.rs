//! Device memory: a caching allocator per device, and copies between host and device.
//!
//! Sizes are rounded up (to 512 bytes below 1 MiB, to 2 MiB above) and freed blocks are kept
//! in free lists by rounded size, so a training loop that allocates the same shapes every
//! step stops calling the driver after its first step. When an allocation fails, the cache
//! is returned to the driver and the allocation tried once more.
//!
//! Copies above [`STAGED_ABOVE`] bytes go through two pinned host buffers of [`STAGE`] bytes
//! each, alternately: the CPU fills (or drains) one while the DMA engine moves the other, and
//! the copy runs at the bus's pinned-memory speed without pinning the user's memory.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError};

use cudarc::driver::{result, sys};

use super::{Gpu, graph};
use crate::RuntimeError;

/// Free lists and counters of one device.
#[derive(Default)]
pub(crate) struct Pool {
    /// Cached blocks by rounded size.
    free: BTreeMap<usize, Vec<sys::CUdeviceptr>>,
    /// Bytes in live blocks.
    pub(crate) allocated: usize,
    /// Bytes in cached blocks.
    pub(crate) cached: usize,
}

/// The size of each pinned staging buffer.
const STAGE: usize = 8 << 20;
/// Copies larger than this are staged through pinned memory; smaller ones are not worth the
/// extra host copy.
const STAGED_ABOVE: usize = 1 << 20;

/// Two pinned host buffers and the events that say when the copy using each has finished.
pub(crate) struct Staging {
    buffers: [*mut u8; 2],
    events: [sys::CUevent; 2],
}

// SAFETY: the buffers and events are only used under the device's staging lock.
unsafe impl Send for Staging {}

impl Staging {
    fn new(gpu: &Gpu) -> Result<Staging, RuntimeError> {
        gpu.bind()?;
        let mut buffers = [std::ptr::null_mut(); 2];
        let mut events = [std::ptr::null_mut(); 2];
        for k in 0..2 {
            // SAFETY: a plain pinned allocation in the current context, freed never (it lives
            // as long as the device's state, which is the process).
            buffers[k] = unsafe { result::malloc_host(STAGE, 0) }
                .map_err(|e| gpu.error("allocating pinned staging memory", e))?
                .cast::<u8>();
            events[k] = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                .map_err(|e| gpu.error("creating an event", e))?;
        }
        Ok(Staging { buffers, events })
    }
}

/// The size a request of `bytes` is served with.
fn rounded(bytes: usize) -> usize {
    const SMALL: usize = 512;
    const LARGE: usize = 2 << 20;
    if bytes <= 1 << 20 { bytes.div_ceil(SMALL) * SMALL } else { bytes.div_ceil(LARGE) * LARGE }
}

/// A block of device memory, returned to its device's cache when dropped.
pub(crate) struct DeviceMemory {
    gpu: &'static Gpu,
    ptr: sys::CUdeviceptr,
    bytes: usize,
    home: Home,
}

/// Where a block goes back to when its buffer is dropped.
pub(crate) enum Home {
    /// The device's cache.
    Pool,
    /// A captured CUDA graph's memory (see `graph.rs`), which keeps it for the graph's
    /// replays.
    Arena(Arc<graph::Arena>),
    /// Nowhere: a block of a graph's memory handed out again while the graph's plan is
    /// walked to update its launches; the graph keeps it.
    Borrowed,
}

impl DeviceMemory {
    pub(crate) fn new(gpu: &'static Gpu, ptr: sys::CUdeviceptr, bytes: usize, home: Home) -> Self {
        DeviceMemory { gpu, ptr, bytes, home }
    }

    /// The device address (0 for an empty block).
    pub(crate) fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    pub(crate) fn gpu(&self) -> &'static Gpu {
        self.gpu
    }

    /// The block's size in bytes (a rounded size).
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        if self.bytes == 0 {
            return;
        }
        match &self.home {
            Home::Pool => self.gpu.give_back(self.bytes, self.ptr),
            Home::Arena(arena) => arena.release(self.bytes, self.ptr),
            Home::Borrowed => {}
        }
    }
}

impl Gpu {
    /// Uninitialized device memory for `bytes` bytes: from the graph being captured or
    /// updated on this thread, if any (see `graph.rs`), else from the device's cache.
    pub(crate) fn alloc(&'static self, bytes: usize) -> Result<DeviceMemory, RuntimeError> {
        if bytes == 0 {
            return Ok(DeviceMemory::new(self, 0, 0, Home::Pool));
        }
        let size = rounded(bytes);
        if let Some(block) = graph::allocate(self, size) {
            return block;
        }
        let ptr = self.take(size)?;
        Ok(DeviceMemory::new(self, ptr, size, Home::Pool))
    }

    /// A block of `size` bytes (a rounded size) from the cache, or from the driver.
    pub(crate) fn take(&'static self, size: usize) -> Result<sys::CUdeviceptr, RuntimeError> {
        {
            let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(ptr) = pool.free.get_mut(&size).and_then(Vec::pop) {
                pool.cached -= size;
                pool.allocated += size;
                return Ok(ptr);
            }
        }
        self.bind()?;
        // SAFETY: a plain allocation in the current context; the memory is only used through
        // the returned block.
        let ptr = match unsafe { result::malloc_sync(size) } {
            Ok(p) => p,
            Err(_) => {
                // Give the cache back (after the queued work that may still use it) and retry.
                self.release_cached()?;
                // SAFETY: as above.
                unsafe { result::malloc_sync(size) }
                    .map_err(|_| RuntimeError::OutOfMemory { device: self.device(), bytes: size })?
            }
        };
        self.pool.lock().unwrap_or_else(PoisonError::into_inner).allocated += size;
        Ok(ptr)
    }

    /// Returns a block of `size` bytes to the cache.
    pub(crate) fn give_back(&self, size: usize, ptr: sys::CUdeviceptr) {
        let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        pool.allocated -= size;
        pool.cached += size;
        pool.free.entry(size).or_default().push(ptr);
    }

    /// Frees every cached block.
    pub(crate) fn release_cached(&self) -> Result<(), RuntimeError> {
        self.synchronize()?;
        let blocks: Vec<(usize, Vec<sys::CUdeviceptr>)> = {
            let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
            pool.cached = 0;
            std::mem::take(&mut pool.free).into_iter().collect()
        };
        for ptr in blocks.into_iter().flat_map(|(_, ptrs)| ptrs) {
            // SAFETY: the block came from `malloc_sync` in this context, no buffer refers to it
            // (it was in the free list) and the stream has finished with it (synchronized).
            unsafe { result::free_sync(ptr) }
                .map_err(|e| self.error("freeing cached memory", e))?;
        }
        Ok(())
    }

    /// Device memory holding a copy of `host`.
    pub(crate) fn upload(&'static self, host: &[u8]) -> Result<DeviceMemory, RuntimeError> {
        graph::no_host_work(self, "a copy from the host")?;
        let mem = self.alloc(host.len())?;
        if host.len() > STAGED_ABOVE {
            self.upload_staged(mem.ptr, host)?;
        } else if !host.is_empty() {
            self.bind()?;
            // SAFETY: `mem` holds at least `host.len()` bytes. A copy from pageable memory
            // returns once the source has been staged, so `host` may be freed afterwards.
            unsafe { result::memcpy_htod_async(mem.ptr, host, self.stream.cu_stream()) }
                .map_err(|e| self.error("copying to the device", e))?;
        }
        Ok(mem)
    }

    /// Copies `host.len()` bytes from device address `ptr` into `host`, after the work queued
    /// before it has finished.
    pub(crate) fn download(
        &self,
        ptr: sys::CUdeviceptr,
        host: &mut [u8],
    ) -> Result<(), RuntimeError> {
        if host.is_empty() {
            return Ok(());
        }
        graph::no_host_work(self, "a copy to the host")?;
        if host.len() > STAGED_ABOVE {
            return self.download_staged(ptr, host);
        }
        self.bind()?;
        // SAFETY: the caller guarantees that `ptr` holds `host.len()` bytes; the stream is
        // synchronized before `host` is read.
        unsafe { result::memcpy_dtoh_async(host, ptr, self.stream.cu_stream()) }
            .map_err(|e| self.error("copying to the host", e))?;
        self.synchronize()
    }
}

impl Gpu {
    /// The staging buffers, created on first use.
    fn staging(&self) -> Result<std::sync::MutexGuard<'_, Option<Staging>>, RuntimeError> {
        let mut guard = self.staging.lock().unwrap_or_else(PoisonError::into_inner);
        if guard.is_none() {
            *guard = Some(Staging::new(self)?);
        }
        Ok(guard)
    }

    /// Copies `host` to device address `dst` through the staging buffers, returning once the
    /// last chunk has left them.
    fn upload_staged(&self, dst: sys::CUdeviceptr, host: &[u8]) -> Result<(), RuntimeError> {
        let mut guard = self.staging()?;
        let st = guard.as_mut().expect("created above");
        self.bind()?;
        let stream = self.stream.cu_stream();
        let mut pending = [false; 2];
        for (c, chunk) in host.chunks(STAGE).enumerate() {
            let k = c % 2;
            if pending[k] {
                // SAFETY: an event created by `Staging::new`, recorded below.
                unsafe { result::event::synchronize(st.events[k]) }
                    .map_err(|e| self.error("waiting for a copy", e))?;
            }
            // SAFETY: the staging buffer holds STAGE >= chunk.len() bytes and no copy is
            // reading it (its event has completed); the device block holds `host.len()`
            // bytes from `dst`; the event is recorded after the copy on the same stream.
            unsafe {
                std::ptr::copy_nonoverlapping(chunk.as_ptr(), st.buffers[k], chunk.len());
                let staged = std::slice::from_raw_parts(st.buffers[k], chunk.len());
                result::memcpy_htod_async(dst + (c * STAGE) as u64, staged, stream)
                    .map_err(|e| self.error("copying to the device", e))?;
                result::event::record(st.events[k], stream)
                    .map_err(|e| self.error("recording an event", e))?;
            }
            pending[k] = true;
        }
        // The staging buffers may be refilled by the next copy only once these have run.
        for (&event, _) in st.events.iter().zip(pending).filter(|(_, p)| *p) {
            // SAFETY: as above.
            unsafe { result::event::synchronize(event) }
                .map_err(|e| self.error("waiting for a copy", e))?;
        }
        Ok(())
    }

    /// Copies `host.len()` bytes from device address `src` into `host` through the staging
    /// buffers, chunk `c + 2` moving while chunk `c` is copied out.
    fn download_staged(&self, src: sys::CUdeviceptr, host: &mut [u8]) -> Result<(), RuntimeError> {
        let mut guard = self.staging()?;
        let st = guard.as_mut().expect("created above");
        self.bind()?;
        let stream = self.stream.cu_stream();
        let total = host.len();
        let chunks = total.div_ceil(STAGE);
        let len = |c: usize| STAGE.min(total - c * STAGE);
        let issue = |c: usize, st: &Staging| -> Result<(), RuntimeError> {
            let k = c % 2;
            // SAFETY: the staging buffer holds STAGE >= len(c) bytes and nothing reads it until
            // its event completes; the device block holds the chunk; the event is recorded
            // after the copy on the same stream (ordered after the kernels that wrote `src`).
            unsafe {
                let staged = std::slice::from_raw_parts_mut(st.buffers[k], len(c));
                result::memcpy_dtoh_async(staged, src + (c * STAGE) as u64, stream)
                    .map_err(|e| self.error("copying to the host", e))?;
                result::event::record(st.events[k], stream)
                    .map_err(|e| self.error("recording an event", e))
            }
        };
        for c in 0..chunks.min(2) {
            issue(c, st)?;
        }
        for c in 0..chunks {
            let k = c % 2;
            // SAFETY: the event was recorded by `issue(c)`; once it completes the staging
            // buffer holds chunk `c`, which is copied out before `issue(c + 2)` reuses it.
            unsafe {
                result::event::synchronize(st.events[k])
                    .map_err(|e| self.error("waiting for a copy", e))?;
                std::ptr::copy_nonoverlapping(
                    st.buffers[k],
                    host.as_mut_ptr().add(c * STAGE),
                    len(c),
                );
            }
            if c + 2 < chunks {
                issue(c + 2, st)?;
            }
        }
        // The last copy ran after everything queued before it.
        self.settle_deferred()
    }
}

/// The device-to-device copy bandwidth of device `ordinal` in GB/s (bytes read plus bytes
/// written), the median of `reps` copies of `bytes` bytes: the ceiling that memory-bound
/// kernels are measured against.
///
/// # Errors
/// When the device cannot be used or runs out of memory.
pub fn copy_bandwidth(ordinal: usize, bytes: usize, reps: usize) -> Result<f64, RuntimeError> {
    let gpu = super::gpu(ordinal)?;
    let (src, dst) = (gpu.alloc(bytes)?, gpu.alloc(bytes)?);
    let copy = || -> Result<f64, RuntimeError> {
        gpu.synchronize()?;
        let started = std::time::Instant::now();
        // SAFETY: both blocks hold at least `bytes` bytes and live until the stream is
        // synchronized below.
        unsafe { result::memcpy_dtod_async(dst.ptr, src.ptr, bytes, gpu.stream.cu_stream()) }
            .map_err(|e| gpu.error("copying on the device", e))?;
        gpu.synchronize()?;
        Ok(started.elapsed().as_secs_f64())
    };
    copy()?;
    let mut times = (0..reps.max(1)).map(|_| copy()).collect::<Result<Vec<f64>, _>>()?;
    times.sort_by(f64::total_cmp);
    Ok(2.0 * bytes as f64 / times[times.len() / 2] / 1e9)
}

#[cfg(test)]
mod tests {
    use super::rounded;

    #[test]
    fn sizes_round_to_their_class() {
        assert_eq!(rounded(1), 512);
        assert_eq!(rounded(512), 512);
        assert_eq!(rounded(513), 1024);
        assert_eq!(rounded(1 << 20), 1 << 20);
        assert_eq!(rounded((1 << 20) + 1), 2 << 20);
        assert_eq!(rounded(5 << 20), 6 << 20);
    }
}
