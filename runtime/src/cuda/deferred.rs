//! The index checks of a replayed CUDA graph, read without waiting for the graph.
//!
//! A gather or scatter outside a graph waits for its kernel and reads its error flag at once.
//! Inside a graph that wait would stop the host from preparing the next call while the
//! device runs this one, so after each launch the flags are copied into pinned host memory
//! behind the graph, and read once those copies have run: when the next launch of the same
//! graph has been queued (the device stays busy), or when the thread that launched it waits
//! for the device ([`Gpu::synchronize`], every read of a value). An out-of-range index is
//! then reported by that call or that read, with the same error as outside a graph (another
//! thread's work never reports it); the results of the call that held it are not to be
//! trusted, as with PyTorch's device-side asserts.

use std::cell::RefCell;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use cudarc::driver::{result, sys};

use super::Gpu;
use super::graph::IndexCheck;
use crate::RuntimeError;

/// Bytes of one flag: the position and the index (see `library.rs`).
const FLAG: usize = 16;

thread_local! {
    /// The graphs this thread launched whose checks may be pending.
    static LAUNCHED: RefCell<Vec<Weak<Deferred>>> = const { RefCell::new(Vec::new()) };
}

/// The flags of one graph, copied into two pinned slots in turn (one launch's copies may
/// land while the previous launch's are read).
pub(crate) struct Deferred {
    gpu: &'static Gpu,
    checks: Vec<IndexCheck>,
    slots: [*mut u8; 2],
    events: [sys::CUevent; 2],
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The slot the next launch's flags go to.
    next: usize,
    /// The slot holding (or about to hold) flags not read yet.
    pending: Option<usize>,
}

// SAFETY: the slots and events are used under `state`'s lock.
unsafe impl Send for Deferred {}
// SAFETY: as above.
unsafe impl Sync for Deferred {}

impl Deferred {
    /// The checks of a captured graph.
    pub(crate) fn new(
        gpu: &'static Gpu,
        checks: Vec<IndexCheck>,
    ) -> Result<Arc<Deferred>, RuntimeError> {
        gpu.bind()?;
        let bytes = (checks.len() * FLAG).max(1);
        let mut slots = [std::ptr::null_mut(); 2];
        let mut events = [std::ptr::null_mut(); 2];
        for k in 0..2 {
            // SAFETY: a plain pinned allocation in the current context, freed by `drop`.
            slots[k] = unsafe { result::malloc_host(bytes, 0) }
                .map_err(|e| gpu.error("allocating pinned memory", e))?
                .cast::<u8>();
            events[k] = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                .map_err(|e| gpu.error("creating an event", e))?;
        }
        Ok(Arc::new(Deferred { gpu, checks, slots, events, state: Mutex::default() }))
    }

    /// After a launch of the graph on this thread: queues the copies of its flags, then
    /// reads the previous launch's (waiting for them, not for this launch).
    ///
    /// # Errors
    /// The previous launch's bad index; the driver's errors.
    pub(crate) fn launched(self: &Arc<Self>) -> Result<(), RuntimeError> {
        LAUNCHED.with(|l| {
            let mut l = l.borrow_mut();
            l.retain(|d| d.strong_count() > 0);
            if !l.iter().any(|d| std::ptr::eq(d.as_ptr(), Arc::as_ptr(self))) {
                l.push(Arc::downgrade(self));
            }
        });
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let previous = state.pending.take();
        let slot = state.next;
        state.next ^= 1;
        let stream = self.gpu.stream.cu_stream();
        for (i, check) in self.checks.iter().enumerate() {
            // SAFETY: the slot holds a flag's bytes per check, and is not read until the event
            // recorded after these copies has completed; the flag lives as long as `self`.
            unsafe {
                let to = std::slice::from_raw_parts_mut(self.slots[slot].add(i * FLAG), FLAG);
                result::memcpy_dtoh_async(to, check.flag.device_ptr(self.gpu)?, stream)
            }
            .map_err(|e| self.gpu.error("copying index checks to the host", e))?;
        }
        // SAFETY: an event of this object, recorded on the device's stream.
        unsafe { result::event::record(self.events[slot], stream) }
            .map_err(|e| self.gpu.error("recording an event", e))?;
        state.pending = Some(slot);
        match previous {
            Some(p) => self.read(p),
            None => Ok(()),
        }
    }

    /// Reads the flags not read yet (the device has finished, or is waited for here).
    fn settle(&self) -> Result<(), RuntimeError> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match state.pending.take() {
            Some(p) => self.read(p),
            None => Ok(()),
        }
    }

    /// Waits for the copies into `slot` and fails with the first bad index they hold.
    fn read(&self, slot: usize) -> Result<(), RuntimeError> {
        // SAFETY: an event of this object, recorded after the copies into `slot`.
        unsafe { result::event::synchronize(self.events[slot]) }
            .map_err(|e| self.gpu.error("waiting for index checks", e))?;
        for (i, check) in self.checks.iter().enumerate() {
            let mut flag = [0u8; FLAG];
            // SAFETY: the copies into the slot have completed (the event above).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.slots[slot].add(i * FLAG),
                    flag.as_mut_ptr(),
                    FLAG,
                );
            }
            super::library::flag_error(check.op, flag, check.axis, check.size)?;
        }
        Ok(())
    }
}

impl Drop for Deferred {
    fn drop(&mut self) {
        for k in 0..2 {
            // SAFETY: created by `new`; the copies into the slot have run once its event has
            // (an event never recorded is complete).
            unsafe {
                let _ = result::event::synchronize(self.events[k]);
                let _ = result::event::destroy(self.events[k]);
                let _ = result::free_host(self.slots[k].cast());
            }
        }
    }
}

impl Gpu {
    /// Reads the index checks not read yet of the graphs this thread launched on this device,
    /// once the device's work has finished (called by [`Gpu::synchronize`]).
    pub(crate) fn settle_deferred(&self) -> Result<(), RuntimeError> {
        let live: Vec<Arc<Deferred>> = LAUNCHED.with(|l| {
            let l = l.borrow();
            l.iter().filter_map(Weak::upgrade).filter(|d| std::ptr::eq(d.gpu, self)).collect()
        });
        let mut first = Ok(());
        for d in live {
            let read = d.settle();
            if first.is_ok() {
                first = read;
            }
        }
        first
    }
}
