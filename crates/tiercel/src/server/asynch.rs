//! Async procedures (crate feature `async`): run on a tokio runtime instead of a worker thread, so
//! that a procedure awaiting I/O (a database, another tiercel call) holds no worker (eRPC's
//! background handlers; plain `fn` procedures still run inline on the worker).
//!
//! The transport hands a call over with its arguments copied out of the packet (or slot) and a
//! `finish` that sends the result when the procedure ends; meanwhile the call's slot stays running,
//! so duplicates and probes are answered as for any long call. The procedure runs as its own task,
//! so that a panic in it is caught by the runtime and a cancelled call can be aborted at its next
//! await; a second task waits for it and finishes the call.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tiercel_proto::context::Trace;
use tiercel_proto::wire::Status;

use super::dispatch::CallKey;
use crate::interface::DispatchError;
use crate::trace::TASK_CALL;

/// The async calls running, by (binding, slot): the call's sequence number and how to abort it.
type Running = Arc<Mutex<HashMap<(u32, u32), (u32, tokio::task::AbortHandle)>>>;

/// The server's runtime for async procedures and the calls running on it.
pub(crate) struct Runner {
    handle: tokio::runtime::Handle,
    /// The runtime the server started itself (none when the application gave its own).
    runtime: Option<tokio::runtime::Runtime>,
    in_flight: Arc<AtomicUsize>,
    limit: usize,
    running: Running,
}

impl Runner {
    /// A runner on `handle`, or on a runtime of its own with `threads` threads; at most `limit`
    /// calls in flight.
    pub(crate) fn new(handle: Option<tokio::runtime::Handle>, threads: usize, limit: usize) -> std::io::Result<Runner> {
        let (handle, runtime) = match handle {
            Some(h) => (h, None),
            None => {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(threads.max(1))
                    .thread_name("tiercel-async")
                    .enable_all()
                    .build()?;
                (rt.handle().clone(), Some(rt))
            }
        };
        Ok(Runner { handle, runtime, in_flight: Arc::new(AtomicUsize::new(0)), limit, running: Arc::default() })
    }

    /// Async calls in flight.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Starts `procedure` (a started async dispatch) with the call's `deadline`, `trace` (what
    /// the procedure's own calls continue) and `caller`; `finish` gets its
    /// status and marshaled results (or error message) on the runtime when it ends. False, and
    /// nothing started, when `limit` calls are in flight already: the caller refuses the call as
    /// busy.
    pub(crate) fn spawn(
        &self,
        procedure: impl core::future::Future<Output = Result<Vec<u8>, DispatchError>> + Send + 'static,
        deadline: Option<Instant>,
        trace: Option<Trace>,
        caller: Option<tiercel_proto::endpoint::Caller>,
        key: CallKey,
        finish: impl FnOnce(Status, Vec<u8>) + Send + 'static,
    ) -> bool {
        if self.in_flight.fetch_add(1, Ordering::AcqRel) >= self.limit {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        let task = self.handle.spawn(TASK_CALL.scope((deadline, trace, caller), procedure));
        let (binding, slot, seq) = key;
        let running = self.running.clone();
        running.lock().unwrap_or_else(|p| p.into_inner()).insert((binding, slot), (seq, task.abort_handle()));
        let in_flight = self.in_flight.clone();
        self.handle.spawn(async move {
            let outcome = task.await;
            {
                let mut running = running.lock().unwrap_or_else(|p| p.into_inner());
                if running.get(&(binding, slot)).is_some_and(|(s, _)| *s == seq) {
                    running.remove(&(binding, slot));
                }
            }
            let (status, bytes) = match outcome {
                Ok(Ok(results)) => (Status::Ok, results),
                Ok(Err(DispatchError::UnknownProcedure)) => (Status::UnknownProcedure, Vec::new()),
                Ok(Err(DispatchError::BadArguments(e))) => (Status::BadArguments, e.to_string().into_bytes()),
                Err(e) if e.is_panic() => {
                    let mut message = Vec::new();
                    super::dispatch::error_message(&mut message, &super::dispatch::panic_message(&*e.into_panic()));
                    (Status::Panicked, message)
                }
                // Aborted: its client cancelled it.
                Err(_) => (Status::Cancelled, Vec::new()),
            };
            finish(status, bytes);
            in_flight.fetch_sub(1, Ordering::AcqRel);
        });
        true
    }

    /// Aborts the running async call `key` (its client cancelled it): it stops at its next await,
    /// and its call is answered `Cancelled`. True when there was such a call.
    pub(crate) fn cancel(&self, key: CallKey) -> bool {
        let (binding, slot, seq) = key;
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        match running.get(&(binding, slot)) {
            Some((s, abort)) if *s == seq => {
                abort.abort();
                true
            }
            _ => false,
        }
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        // The server may go while one of its tasks holds the last reference: a runtime cannot be
        // dropped on one of its own threads, so it goes on a thread of its own.
        if let Some(rt) = self.runtime.take() {
            let _ = std::thread::Builder::new().name("tiercel-async-stop".into()).spawn(move || {
                rt.shutdown_background();
            });
        }
    }
}
