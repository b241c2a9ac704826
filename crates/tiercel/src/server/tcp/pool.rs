//! The threads that serve TCP connections: at most `ServerConfig::connection_threads` at once,
//! however many connections are bound and however many of them send.
//!
//! A connection with bytes to read, or a slow call that needs another thread, asks the pool for one
//! ([`Pool::submit`]). While fewer than the limit live, a thread starts for it, serves it, and when
//! the connection is idle (parked) or over, serves the next connection waiting, or ends. At the
//! limit, the connection waits in line, and the pool's pressure (an `eventfd`, readable while any
//! wait) wakes the threads blocked reading their own connections: each whose connection has
//! nothing to do parks it (with a partial frame, its buffer kept and charged) and serves the next
//! in line, and extra threads of a slow connection give theirs back. A thread that finds nobody in
//! line waits [`LINGER`] for the next connection before it ends, so that connections which send
//! now and then are served by the same few threads rather than each by a thread started for it.
//! So a thousand connections that send take turns on the pool's threads as datagrams take turns on
//! UDP's workers, and a connection that dribbles a frame holds a thread only while it has bytes to
//! read.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::binding::StreamBinding;

/// How long a thread with nothing to serve waits for a connection before it ends.
const LINGER: Duration = Duration::from_secs(1);

/// A connection waiting for a thread, and whether it is its first (see [`StreamBinding::serve`]).
type Job = (Arc<StreamBinding>, bool);

pub(crate) struct Pool {
    max: usize,
    state: Mutex<State>,
    /// Signalled when a connection is put in line for a lingering thread.
    job: Condvar,
    /// Connections waiting in line with every thread busy (read without the lock).
    waiting: AtomicUsize,
    /// Readable while connections wait in line: one count for each.
    pressure: tiercel_sys::udp::Nudge,
}

struct State {
    /// Threads started and not ended, lingering ones included.
    live: usize,
    /// Of those, threads lingering for a connection to serve.
    lingering: usize,
    /// The server stops: no thread lingers.
    stopped: bool,
    /// Connections for the next thread free, each with whether it counts in `waiting`.
    line: VecDeque<(Job, bool)>,
}

impl Pool {
    /// A pool of at most `max` threads (at least one).
    pub(super) fn new(max: usize) -> std::io::Result<Pool> {
        Ok(Pool {
            max: max.max(1),
            state: Mutex::new(State { live: 0, lingering: 0, stopped: false, line: VecDeque::new() }),
            job: Condvar::new(),
            waiting: AtomicUsize::new(0),
            pressure: tiercel_sys::udp::Nudge::new()?,
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Gives `binding` a thread (`first`: the one that parks it when idle; else an extra thread for
    /// its slow calls): a lingering one, else a new one while fewer than the limit live, else the
    /// next one free.
    pub(super) fn submit(self: &Arc<Self>, binding: &Arc<StreamBinding>, first: bool) {
        binding.threads.fetch_add(1, Ordering::AcqRel);
        binding.idle.fetch_add(1, Ordering::AcqRel);
        let mut state = self.state();
        // Connections already in line are taken first: a lingering thread is for a line that is
        // empty but for this one.
        if state.lingering > state.line.len() {
            state.line.push_back(((binding.clone(), first), false));
            drop(state);
            self.job.notify_one();
            return;
        }
        if state.live >= self.max {
            state.line.push_back(((binding.clone(), first), true));
            self.waiting.fetch_add(1, Ordering::AcqRel);
            // An eventfd write fails only when its count would overflow.
            let _ = self.pressure.ring();
            return;
        }
        state.live += 1;
        drop(state);
        let (pool, job) = (self.clone(), (binding.clone(), first));
        // Joined when the server stops, so that nothing of it outlives `RunningServer::stop`.
        let spawned = crate::server::spawn_kept(&binding.shared.binding_threads, || {
            std::thread::Builder::new().name("tiercel-tcp-binding".into()).spawn(move || pool.work(job))
        });
        if spawned.is_err() {
            self.state().live -= 1;
            binding.close();
            StreamBinding::thread_ends(binding);
        }
    }

    /// A thread's life: serve a connection until it is idle or over, then the next in line.
    fn work(&self, mut job: Job) {
        loop {
            let (binding, first) = job;
            // Extra threads too: a pool thread started for one ran wherever the kernel put it.
            binding.shared.pin(binding.shared.stream_bindings.load(Ordering::Relaxed));
            binding.serve(first);
            StreamBinding::thread_ends(&binding);
            drop(binding);
            match self.next() {
                Some(next) => job = next,
                None => return,
            }
        }
    }

    /// The next connection in line, waiting up to [`LINGER`] for one; `None` (and one thread
    /// fewer) when none comes.
    fn next(&self) -> Option<Job> {
        let give_up = Instant::now() + LINGER;
        let mut state = self.state();
        loop {
            if let Some((job, pressed)) = state.line.pop_front() {
                if pressed {
                    self.waiting.fetch_sub(1, Ordering::AcqRel);
                    self.pressure.take();
                }
                return Some(job);
            }
            let now = Instant::now();
            if now >= give_up || state.stopped {
                state.live -= 1;
                return None;
            }
            state.lingering += 1;
            state = match self.job.wait_timeout(state, give_up - now) {
                Ok((state, _)) => state,
                Err(p) => p.into_inner().0,
            };
            state.lingering -= 1;
        }
    }

    /// Whether connections wait for a thread: a thread whose connection has nothing to do gives
    /// it up.
    pub(super) fn pressed(&self) -> bool {
        self.waiting.load(Ordering::Acquire) > 0
    }

    /// Readable while [`Pool::pressed`]: waited on beside a connection.
    pub(super) fn pressure(&self) -> std::os::fd::BorrowedFd<'_> {
        self.pressure.as_fd()
    }

    /// The server stops: the connections in line end without a thread, and lingering threads end.
    pub(super) fn clear(&self) {
        let line = {
            let mut state = self.state();
            state.stopped = true;
            std::mem::take(&mut state.line)
        };
        self.job.notify_all();
        for ((binding, _), pressed) in line {
            if pressed {
                self.waiting.fetch_sub(1, Ordering::AcqRel);
                self.pressure.take();
            }
            StreamBinding::thread_ends(&binding);
        }
    }
}
