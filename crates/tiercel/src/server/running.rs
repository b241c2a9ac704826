//! A started server: the handle that stops it (gracefully, or at once), its counters, and the
//! shutdown's steps (refuse new calls and bindings, let the calls under way finish, stop the
//! threads).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

use super::*;

impl Shared {
    /// Begins a graceful shutdown (idempotent).
    fn begin_shutdown(&self) {
        let mut by = self.shutdown_by.lock().unwrap_or_else(|p| p.into_inner());
        if by.is_none() {
            *by = Some(std::time::Instant::now() + self.config.shutdown_grace);
            self.endpoint.drain();
            self.registrations.lock().unwrap_or_else(|p| p.into_inner()).clear();
        }
    }

    /// Whether a graceful shutdown is done draining: no procedure runs, or the grace is over. Then
    /// the workers stop.
    pub(crate) fn drained(&self, now: std::time::Instant) -> bool {
        let by = *self.shutdown_by.lock().unwrap_or_else(|p| p.into_inner());
        by.is_some_and(|by| {
            self.endpoint.running() == 0 && shm::calls_running(self) == 0 && self.async_in_flight() == 0 || now >= by
        })
    }

    /// Async procedures running.
    fn async_in_flight(&self) -> usize {
        #[cfg(feature = "async")]
        if let Some(runner) = &self.asynch {
            return runner.in_flight();
        }
        0
    }

    /// Stops the workers, those standing by too.
    pub(crate) fn stop_workers(&self) {
        self.stop.store(true, Ordering::Release);
        self.crew.release();
        // A failure leaves the listeners to notice within their period, as they did without it.
        let _ = self.stopping.ring();
    }

    /// Whether new bindings are refused (a graceful shutdown has begun).
    pub(crate) fn refusing_bindings(&self) -> bool {
        self.endpoint.is_draining()
    }
}

/// Shuts a running server down gracefully from any thread (or a signal handler's thread): new
/// bindings and new calls are refused, calls under way finish and their results go out, then the
/// workers stop and [`RunningServer::wait`] returns.
#[derive(Clone)]
pub struct ShutdownHandle {
    shared: Arc<Shared>,
}

impl core::fmt::Debug for ShutdownHandle {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ShutdownHandle").finish_non_exhaustive()
    }
}

impl ShutdownHandle {
    /// Begins the shutdown and returns at once. Calls still running after
    /// `ServerConfig::shutdown_grace` do not hold it up further.
    pub fn shutdown(&self) {
        self.shared.begin_shutdown();
    }
}

/// A running server. Dropping it stops the workers.
pub struct RunningServer {
    pub(super) shared: Arc<Shared>,
    pub(super) handles: Vec<JoinHandle<()>>,
    pub(super) addr: SocketAddr,
    pub(super) tcp: Option<SocketAddr>,
}

impl core::fmt::Debug for RunningServer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RunningServer").field("addr", &self.addr).finish()
    }
}

impl RunningServer {
    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where the server takes TCP bindings (the port of [`RunningServer::addr`]), unless
    /// `ServerConfig::tcp` is off.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp
    }

    /// What became of `ServerConfig::xdp`: `None` when it was not asked for; else the AF_XDP station
    /// the server reads (its interface, address and hook), or why it has none and serves through
    /// the kernel only.
    pub fn xdp(&self) -> Option<Result<String, String>> {
        self.shared.xdp_status.clone()
    }

    /// This incarnation's boot id: random at every start.
    pub fn incarnation(&self) -> u64 {
        self.shared.incarnation
    }

    /// The counters as they stand now.
    pub fn stats(&self) -> ServerStats {
        super::stats(&self.shared.stats, &self.shared.call_shards)
    }

    /// A handle that reads the counters from elsewhere (for example an exported implementation that
    /// reports them, or a line printed after the server has stopped).
    pub fn stats_handle(&self) -> StatsHandle {
        StatsHandle(self.shared.stats.clone(), self.shared.call_shards.clone())
    }

    /// Bindings currently held (over UDP, through shared memory and over TCP: one table).
    pub fn bindings(&self) -> usize {
        self.shared.endpoint.len()
    }

    /// Bytes the bindings hold now for messages: over UDP, calls being reassembled and results not
    /// yet acknowledged; through shared memory, the slot pages the server maps, its private copies
    /// of arguments and results, and each region's control pages (each binding at most
    /// `ServerConfig::binding_memory`, all of them at most `ServerConfig::message_memory`).
    pub fn message_memory(&self) -> usize {
        self.shared.memory.used()
    }

    /// The abstract UNIX socket name (without the leading NUL) where clients on this host bind
    /// through shared memory: random for each incarnation, and told to clients over UDP. `None`
    /// when shared memory is off.
    pub fn rendezvous(&self) -> Option<&str> {
        self.shared.rendezvous.as_ref().map(|(_, name)| name.as_str())
    }

    /// A handle that shuts the server down gracefully from another thread.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle { shared: self.shared.clone() }
    }

    /// Shuts down gracefully (see [`ShutdownHandle`]) and waits until the workers have stopped.
    pub fn shutdown(self) {
        self.shared.begin_shutdown();
        self.wait();
    }

    /// Stops the workers at once and waits for them (at most about 100 ms after the procedures they
    /// are running return); results not yet sent are lost, and their clients report "may have run".
    pub fn stop(mut self) {
        self.stop_now();
    }

    /// Blocks until the server stops: after [`ShutdownHandle::shutdown`] from another thread.
    pub fn wait(mut self) {
        self.join();
    }

    /// Serves until the process is sent SIGTERM or SIGINT (Ctrl-C), then shuts down gracefully (new
    /// bindings and calls refused, calls under way finish, names taken back at once rather than
    /// when a lease runs out) and returns the signal. What a server's `main` ends with, instead of
    /// signal handling of its own. The handlers stay installed for the rest of the process (a
    /// second signal is ignored rather than killing it mid-shutdown); an error if the process may
    /// not install them.
    pub fn run_until_signal(self) -> std::io::Result<i32> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?;
        let signal = signals.forever().next().unwrap_or(SIGTERM);
        self.shutdown();
        Ok(signal)
    }

    fn stop_now(&mut self) {
        self.shared.registrations.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.shared.stop_workers();
        self.join();
    }

    /// Waits for the workers, then for the threads of shared-memory and TCP bindings (which stop
    /// once the workers have, and hold the server's socket until they do).
    fn join(&mut self) {
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
        self.shared.stop_workers();
        let threads = std::mem::take(&mut *self.shared.binding_threads.lock().unwrap_or_else(|p| p.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        self.stop_now();
    }
}
