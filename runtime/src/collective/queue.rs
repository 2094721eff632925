//! A host group's communication thread. Every collective and barrier of the group runs
//! there, one at a time in the order they were issued, so the ranks' sequences stay equal
//! however many threads issue them; the thread that issued a collective goes on with other
//! steps and waits only when it needs the result ([`Pending::wait`]). This is what lets a
//! gradient all-reduce run while the rest of backward computes.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use super::Communicator;
use crate::RuntimeError;

type Job = Box<dyn FnOnce() + Send>;

/// A host group: its communicator and, once the first collective is issued, the thread that
/// runs them.
pub(crate) struct HostEngine {
    pub(crate) communicator: Arc<dyn Communicator>,
    queue: Mutex<Option<Sender<Job>>>,
}

/// A collective in flight: its result, once the group's thread has run it.
pub(crate) struct Pending<T> {
    result: Receiver<(Result<T, RuntimeError>, Instant)>,
    op: &'static str,
}

fn stopped(op: &'static str) -> RuntimeError {
    RuntimeError::Collective {
        op,
        detail: "the group's communication thread has stopped; the group is unusable".into(),
    }
}

impl HostEngine {
    pub(crate) fn new(communicator: Arc<dyn Communicator>) -> HostEngine {
        HostEngine { communicator, queue: Mutex::new(None) }
    }

    /// Queues `work` behind everything issued to this group before it.
    ///
    /// # Errors
    /// [`RuntimeError::Collective`] when the thread cannot be started or has stopped.
    pub(crate) fn submit<T: Send + 'static>(
        &self,
        op: &'static str,
        work: impl FnOnce(&dyn Communicator) -> Result<T, RuntimeError> + Send + 'static,
    ) -> Result<Pending<T>, RuntimeError> {
        let (send, result) = mpsc::channel();
        let communicator = self.communicator.clone();
        let job: Job = Box::new(move || {
            // An engine that panics fails this collective, not the process.
            let done =
                catch_unwind(AssertUnwindSafe(|| work(&*communicator))).unwrap_or_else(|_| {
                    Err(RuntimeError::Collective { op, detail: "the engine panicked".into() })
                });
            // The issuer may have stopped waiting (its run failed earlier): nothing to do.
            let _ = send.send((done, Instant::now()));
        });
        // Held while sending: two threads issuing to one group get one order.
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        if queue.is_none() {
            *queue = Some(self.spawn(op)?);
        }
        queue.as_ref().map_or(Err(()), |q| q.send(job).map_err(drop)).map_err(|()| stopped(op))?;
        Ok(Pending { result, op })
    }

    fn spawn(&self, op: &'static str) -> Result<Sender<Job>, RuntimeError> {
        let (send, jobs) = mpsc::channel::<Job>();
        let name = format!("kiln-{}-rank{}", self.communicator.engine(), self.communicator.rank());
        std::thread::Builder::new()
            .name(name)
            .spawn(move || jobs.into_iter().for_each(|job| job()))
            .map_err(|e| RuntimeError::Collective {
                op,
                detail: format!("could not start the group's communication thread: {e}"),
            })?;
        Ok(send)
    }
}

impl<T> Pending<T> {
    /// Blocks until the group's thread has run it.
    ///
    /// # Errors
    /// The collective's own error, or [`RuntimeError::Collective`] when the thread stopped.
    pub(crate) fn wait(self) -> Result<T, RuntimeError> {
        self.wait_timed().0
    }

    /// As [`Pending::wait`], with when the group's thread finished it.
    pub(crate) fn wait_timed(self) -> (Result<T, RuntimeError>, Instant) {
        self.result.recv().unwrap_or_else(|_| (Err(stopped(self.op)), Instant::now()))
    }
}
