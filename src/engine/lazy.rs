//! Lazy nodes: the recorded, not yet computed, program.

use std::cell::Cell;
use std::panic::Location;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use kiln_ir::{DType, Op, Shape};
use kiln_runtime::{Buffer, Device};
use smallvec::SmallVec;

/// One recorded op. It holds its inputs until it is realized; then it holds its buffer and
/// lets its history go, so memory is bounded by what user handles can still reach.
pub(crate) struct LazyNode {
    pub(crate) op: Op,
    pub(crate) shape: Shape,
    pub(crate) dtype: DType,
    pub(crate) device: Device,
    /// The user's source line that recorded the op.
    pub(crate) origin: &'static Location<'static>,
    /// The user-defined op it was recorded inside ([`with_label`]).
    pub(crate) label: Option<kiln_ir::Label>,
    /// When the node was recorded: a process-wide counter (compile() tells the nodes its
    /// closure recorded from older ones by it).
    pub(crate) serial: u64,
    state: Mutex<State>,
}

static SERIAL: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The line that nodes recorded now are attributed to, instead of their caller's: set
    /// while backward records the gradient of a forward op.
    static ORIGIN: Cell<Option<&'static Location<'static>>> = const { Cell::new(None) };
}

thread_local! {
    /// The user-defined op whose definition is recording now.
    static LABEL: Cell<Option<kiln_ir::Label>> = const { Cell::new(None) };
}

/// Runs `f` with every node it records labelled `label` (a user-defined op's name; `None`
/// records unlabelled nodes, as the gradient of an unlabelled op does).
pub(crate) fn with_label<T>(label: Option<kiln_ir::Label>, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<kiln_ir::Label>);
    impl Drop for Restore {
        fn drop(&mut self) {
            LABEL.with(|l| l.set(self.0));
        }
    }
    let _restore = Restore(LABEL.with(|l| l.replace(label)));
    f()
}

/// The label nodes recorded now get.
pub(crate) fn current_label() -> Option<kiln_ir::Label> {
    LABEL.with(Cell::get)
}

/// Runs `f` with every node it records attributed to `origin`.
pub(crate) fn with_origin<T>(origin: &'static Location<'static>, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<&'static Location<'static>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            ORIGIN.with(|o| o.set(self.0));
        }
    }
    let _restore = Restore(ORIGIN.with(|o| o.replace(Some(origin))));
    f()
}

/// The serial number the next recorded node will get.
pub(crate) fn next_serial() -> u64 {
    SERIAL.load(Ordering::Relaxed)
}

/// A node's inputs: most ops have one or two, kept inline (no allocation per node).
pub(crate) type Inputs = SmallVec<[Arc<LazyNode>; 2]>;

pub(crate) enum State {
    Pending(Inputs),
    Realized(Buffer),
    /// The buffer was handed to a plan that writes into it ([`LazyNode::hand_over`]): no
    /// live handle reaches the node, unless that plan failed.
    HandedOver,
}

impl LazyNode {
    pub(crate) fn pending(
        op: Op,
        inputs: Inputs,
        shape: Shape,
        dtype: DType,
        device: Device,
        origin: &'static Location<'static>,
    ) -> Arc<LazyNode> {
        Arc::new(LazyNode {
            op,
            shape,
            dtype,
            device,
            origin: ORIGIN.with(Cell::get).unwrap_or(origin),
            label: LABEL.with(Cell::get),
            serial: SERIAL.fetch_add(1, Ordering::Relaxed),
            state: Mutex::new(State::Pending(inputs)),
        })
    }

    pub(crate) fn realized(
        buffer: Buffer,
        shape: Shape,
        origin: &'static Location<'static>,
    ) -> Arc<LazyNode> {
        Arc::new(LazyNode {
            op: Op::Input,
            dtype: buffer.dtype(),
            device: buffer.device(),
            shape,
            origin,
            label: None,
            serial: SERIAL.fetch_add(1, Ordering::Relaxed),
            state: Mutex::new(State::Realized(buffer)),
        })
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        // Every update replaces the state whole, so a panic elsewhere cannot leave it torn.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The buffer, once realized.
    pub(crate) fn buffer(&self) -> Option<Buffer> {
        match &*self.state() {
            State::Realized(b) => Some(b.clone()),
            State::Pending(_) | State::HandedOver => None,
        }
    }

    /// Gives the realized buffer up to a plan that writes into it in place
    /// (`realize::handed_over`, which has checked that nothing outside the plan's capture
    /// holds this node, so its value is dead once the plan has read it).
    pub(crate) fn hand_over(&self) -> Option<Buffer> {
        match std::mem::replace(&mut *self.state(), State::HandedOver) {
            State::Realized(b) => Some(b),
            other => {
                *self.state() = other;
                None
            }
        }
    }

    /// Stores the computed buffer and drops the history.
    pub(crate) fn set_realized(&self, buffer: Buffer) {
        let old = std::mem::replace(&mut *self.state(), State::Realized(buffer));
        drop(old);
    }
}

impl Drop for LazyNode {
    // Freeing a long chain recursively would overflow the stack (PyTorch issue #5534), so
    // inputs whose last handle this node holds are unlinked onto an explicit stack.
    fn drop(&mut self) {
        let mut stack: Vec<Arc<LazyNode>> = match self.state.get_mut() {
            Ok(State::Pending(inputs)) => std::mem::take(inputs).into_vec(),
            _ => return,
        };
        while let Some(node) = stack.pop() {
            if let Some(mut inner) = Arc::into_inner(node)
                && let Ok(State::Pending(inputs)) = inner.state.get_mut()
            {
                stack.extend(inputs.drain(..));
            }
        }
    }
}
