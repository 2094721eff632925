//! A storage: the data that views of a tensor share, as the lazy node producing it.

use std::panic::Location;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use kiln_ir::DType;
use kiln_runtime::Device;

use super::lazy::LazyNode;

/// The data that views share: the node that produces it, dense and row-major.
///
/// In-place ops replace the node with a functional update of it (so every view sees the new
/// values, lazily) and bump `version`, which autograd checks for the tensors it saved.
pub(crate) struct Storage {
    node: Mutex<Arc<LazyNode>>,
    version: AtomicU64,
    /// The in-place writes under autograd that gave a handle of this storage a new
    /// history: how many, and where the last one was made.
    /// (Read on every op recorded under autograd: an atomic; the line only when stale.)
    history_writes: AtomicU64,
    last_history_write: Mutex<Option<&'static Location<'static>>>,
    /// After a write under autograd that gave it a new history: the whole storage's value
    /// as a tensor with that write's history (the tensor layer's type, which this layer
    /// does not name), and the storage's version it is the value of. Its views take their
    /// history from it; any later write (one without history too) makes it stale.
    autograd_base: Mutex<Option<(u64, Arc<dyn std::any::Any + Send + Sync>)>>,
    dtype: DType,
    device: Device,
}

impl Storage {
    pub(crate) fn new(node: Arc<LazyNode>) -> Arc<Storage> {
        Arc::new(Storage {
            dtype: node.dtype,
            device: node.device,
            node: Mutex::new(node),
            version: AtomicU64::new(0),
            history_writes: AtomicU64::new(0),
            last_history_write: Mutex::new(None),
            autograd_base: Mutex::new(None),
        })
    }

    pub(crate) fn node(&self) -> Arc<LazyNode> {
        self.node.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Installs the node of an in-place write and bumps the version.
    pub(crate) fn replace(&self, node: Arc<LazyNode>) {
        let old =
            std::mem::replace(&mut *self.node.lock().unwrap_or_else(PoisonError::into_inner), node);
        self.version.fetch_add(1, Ordering::SeqCst);
        drop(old);
    }

    /// How many in-place writes gave a handle of this storage a new history.
    pub(crate) fn history_writes(&self) -> u64 {
        self.history_writes.load(Ordering::SeqCst)
    }

    /// Where the last history-changing write was made, if it came after `seen` of them.
    pub(crate) fn history_write_after(&self, seen: u64) -> Option<&'static Location<'static>> {
        if self.history_writes() <= seen {
            return None;
        }
        *self.last_history_write.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a history-changing write made at `origin`.
    pub(crate) fn note_history_write(&self, origin: &'static Location<'static>) {
        let mut last = self.last_history_write.lock().unwrap_or_else(PoisonError::into_inner);
        *last = Some(origin);
        self.history_writes.fetch_add(1, Ordering::SeqCst);
    }

    /// Records `base` as the value, with history, of the write just made.
    pub(crate) fn set_autograd_base(&self, base: Arc<dyn std::any::Any + Send + Sync>) {
        let version = self.version();
        *self.autograd_base.lock().unwrap_or_else(PoisonError::into_inner) = Some((version, base));
    }

    /// The value with history that the last write left, if it recorded one and no write
    /// came after it. (A count of history-changing writes alone would let a write without
    /// history, under `no_grad`, leave a stale value here for the next write to build on.)
    pub(crate) fn autograd_base(&self) -> Option<Arc<dyn std::any::Any + Send + Sync>> {
        let slot = self.autograd_base.lock().unwrap_or_else(PoisonError::into_inner);
        match &*slot {
            Some((version, base)) if *version == self.version() => Some(base.clone()),
            _ => None,
        }
    }

    /// The element type of its values.
    pub(crate) fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device holding its values.
    pub(crate) fn device(&self) -> Device {
        self.device
    }

    /// How many in-place writes the storage has seen.
    pub(crate) fn version(&self) -> u64 {
        self.version.load(Ordering::SeqCst)
    }
}
