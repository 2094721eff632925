//! The compile session: what a compiled call records while its closure runs. Realization
//! and in-place writes ask it whether they run inside one (deferring a realization to the
//! end of the call, noting a write, refusing a read); `compile()` opens and closes it. It
//! sits below both `realize` and `compile`, so neither imports the other's internals.

use std::cell::RefCell;
use std::sync::Arc;

use super::lazy::LazyNode;
use super::storage::Storage;
use crate::{Error, Result};

/// What one compiled call records: realizations asked for, storages written.
pub(crate) struct Session {
    pub(crate) deferred: Vec<Arc<LazyNode>>,
    pub(crate) written: Vec<Arc<Storage>>,
    pub(crate) first_serial: u64,
}

thread_local! {
    static SESSION: RefCell<Option<Session>> = const { RefCell::new(None) };
}

/// Inside a compiled call, a realization is deferred to the end of the call: returns `true`
/// when it was.
pub(crate) fn defer(targets: &[Arc<LazyNode>]) -> bool {
    SESSION.with(|s| match &mut *s.borrow_mut() {
        Some(session) => {
            session.deferred.extend(targets.iter().cloned());
            true
        }
        None => false,
    })
}

/// Inside a compiled call, reading a pending value is a graph break.
pub(crate) fn check_read(node: &Arc<LazyNode>) -> Result<()> {
    let inside = SESSION.with(|s| s.borrow().is_some());
    if !inside {
        return Ok(());
    }
    Err(Error::Compile {
        op: "compile",
        detail: format!(
            "the value of the {} recorded at {} was read inside a compiled function, which would split its plan (a graph break); return the tensor from the closure and read it after the call",
            node.op.name(),
            node.origin
        ),
    })
}

/// Inside a compiled call, an in-place write makes the storage's new value a result of the
/// call.
pub(crate) fn note_write(storage: &Arc<Storage>) {
    SESSION.with(|s| {
        if let Some(session) = &mut *s.borrow_mut()
            && !session.written.iter().any(|w| Arc::ptr_eq(w, storage))
        {
            session.written.push(storage.clone());
        }
    });
}

/// Runs `f` with realizations deferred and writes noted; returns its value and the session.
pub(crate) fn record<T>(f: impl FnOnce() -> T) -> Result<(T, Session)> {
    /// Ends the session however `f` returns, a panic included.
    struct End;
    impl Drop for End {
        fn drop(&mut self) {
            SESSION.with(|s| s.borrow_mut().take());
        }
    }
    if SESSION.with(|s| s.borrow().is_some()) {
        return Err(Error::Compile {
            op: "compile",
            detail: "a compiled function called another compiled function; call the inner one's closure directly (its ops join the outer plan)".into(),
        });
    }
    SESSION.with(|s| {
        *s.borrow_mut() = Some(Session {
            deferred: Vec::new(),
            written: Vec::new(),
            first_serial: super::lazy::next_serial(),
        });
    });
    let end = End;
    let value = f();
    let session = SESSION.with(|s| s.borrow_mut().take());
    drop(end);
    let session =
        session.ok_or_else(|| Error::Internal("the compile session disappeared".into()))?;
    Ok((value, session))
}
