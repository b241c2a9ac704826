//! The server side of the TCP transport: a listener on the same port number as the UDP socket, and
//! for each connection (one connection is one binding) threads that take turns reading its frames
//! and run its calls.
//!
//! Before a client has a binding it costs no thread: the listener thread runs every bind exchange
//! itself, on non-blocking sockets, through the doorway shared with shared memory
//! (`super::handshake`): at most [`MAX_HANDSHAKES`] at once (a few kilobytes each) and
//! [`MAX_HANDSHAKES_PER_SOURCE`] of one address, each within `HANDSHAKE` of its connection, with
//! the same bind machine as UDP and shared memory
//! (interface check, shared secret). A binding's buffers are charged to
//! `ServerConfig::binding_memory` and the server-wide `ServerConfig::message_memory` before they
//! grow: a call frame that does not fit is answered `Busy` and its bytes are dropped as they arrive,
//! never held.
//!
//! A bound connection starts parked ([`Parking`]): no thread and no receive buffer, its descriptor
//! in an `epoll` set the listener polls beside its own sockets. When its client sends, the
//! listener gives it a thread, which reads a call, copies its arguments out, runs it, and sends
//! the result as one frame with one `write`; once the client has sent nothing for [`PARK_AFTER`],
//! with no call running and no other thread, that thread gives its buffers back and ends, and the
//! connection is parked again. So an idle connection costs a descriptor and a few hundred bytes,
//! and only connections in use have threads. While it runs, another thread of the connection
//! may read: when every thread has been running a call for [`HELP_AFTER`], or was running slow
//! calls at [`WAITED_LOOKS`] of the listener's looks in a row (every [`HELP_AFTER`]) while the
//! client's bytes waited unread, the listener starts one more, up to `ServerConfig::workers`, so
//! that a slow procedure holds up only its own caller and calls whose procedures block run side by
//! side; an extra thread idle for [`HELPER_IDLE`] ends. While a call of the connection runs, the listener
//! also sends the client a heartbeat frame every [`HEARTBEAT`], so that a stopped or hung server
//! process is told from a slow procedure by silence, as over the other transports. A client that
//! does not read its results loses its connection after `Timing::dead_after`.
//!
//! A call larger than [`SMALL_CALL`] is not copied: the thread that read it runs it where it
//! landed. When its procedure works on its one `InOut` buffer in place ([`crate::Export::in_place`])
//! and the call's frame is all the receive buffer holds, the procedure changes the buffer there and
//! the result (the buffer, then the return value) goes back from there, behind a new prefix and
//! header (`ServerStats::in_place`).

use std::io::IoSlice;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tiercel_proto::endpoint::Budget;
use tiercel_proto::stream::{self, Deframer, Next, PREFIX_LEN};
use tiercel_proto::wire::{flags, Header, Kind, Packet, Status, HEADER_LEN};

use super::charge::Charge;
use super::dispatch::{self, Arrival};
use super::handshake::{has_room, Broken, Doorway, Exchange, Step, ARRIVALS};
use super::Shared;
use crate::framed;
use crate::retention::Retention;

/// Connections in the bind exchange at once, each holding a buffer of a few kilobytes and a
/// descriptor for at most `HANDSHAKE`. When they are all taken, a new one makes room by closing
/// the oldest of the address that holds the most ([`Doorway`]).
pub(crate) const MAX_HANDSHAKES: usize = 256;
/// Of those, from one IP address (at its limit, an address's new connection closes its oldest).
pub(crate) const MAX_HANDSHAKES_PER_SOURCE: usize = 64;
/// How often a connection with a call running hears from the server.
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(1);
/// Bytes of a connection's receive buffer (frames larger grow it, charged to the budgets).
const BUFFER: usize = 64 * 1024;
/// Bytes of a connection's result buffer before a large result grows it.
const OUT: usize = 4096;
/// How long a blocked connection thread waits before looking whether the server is stopping.
const POLL: Duration = Duration::from_millis(100);
/// Bytes of the frame prefix and header that start every frame the server sends.
const FRAME_HEAD: usize = PREFIX_LEN + HEADER_LEN;

/// Binds the TCP listener at `addr` (the UDP socket's address and port).
pub(super) fn open(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let listener = TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Serves bind exchanges on `listener`, and beats the connections' hearts, until the server stops.
pub(super) fn listen(shared: &Arc<Shared>, listener: TcpListener) -> std::io::Result<std::thread::JoinHandle<()>> {
    let shared = shared.clone();
    // The set of parked connections: without it the server would take connections it cannot serve.
    let set = tiercel_sys::tcp::Parked::new()?;
    let parking = Arc::new(Parking { set, bindings: Mutex::new(Default::default()) });
    std::thread::Builder::new()
        .name("tiercel-tcp-listener".into())
        .spawn(move || accept_loop(shared, listener, parking))
}

/// A bound connection, shared by its thread, the listener (heartbeats) and async procedures
/// finishing on the runtime.
pub(crate) struct Conn {
    stream: TcpStream,
    /// Held while a frame is written, so that frames never interleave.
    writing: Mutex<()>,
    /// Calls of the connection running (inline or on the runtime).
    running: AtomicUsize,
    /// How long a write may wait for the client to make room.
    send_timeout: Duration,
}

impl Conn {
    /// Writes one frame; on failure the connection is shut down (part of a frame may have gone).
    fn send(&self, parts: &mut [IoSlice<'_>]) -> std::io::Result<()> {
        let _writing = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        framed::send(&self.stream, parts, self.send_timeout).inspect_err(|_| {
            let _ = self.stream.shutdown(std::net::Shutdown::Both);
        })
    }

    /// Sends a heartbeat if a call is running and the connection is not being written (a result
    /// going out says as much) and has room for it (a client with a full window gets none).
    fn beat(&self, header: &[u8; FRAME_HEAD]) {
        if self.running.load(Ordering::Acquire) == 0 {
            return;
        }
        let Ok(_writing) = self.writing.try_lock() else { return };
        use std::io::Write;
        match (&self.stream).write(header) {
            Ok(n) if n == header.len() => {}
            // Part of it went: the rest must follow, or the stream is broken.
            Ok(n) => {
                let rest = &header[n..];
                if framed::send(&self.stream, &mut [IoSlice::new(rest)], self.send_timeout).is_err() {
                    let _ = self.stream.shutdown(std::net::Shutdown::Both);
                }
            }
            Err(_) => {}
        }
    }
}

/// A connection in the bind exchange: no binding, no thread yet.
struct Connecting {
    stream: TcpStream,
    frames: Deframer,
}

impl std::os::fd::AsFd for Connecting {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.stream.as_fd()
    }
}

impl Exchange for Connecting {
    fn request(&mut self) -> Result<Option<Vec<u8>>, Broken> {
        loop {
            match self.frames.next() {
                Err(_) => return Err(Broken::Malformed),
                Ok(Next::Frame(_)) => {
                    let request = self.frames.frame().to_vec();
                    self.frames.consume();
                    return Ok(Some(request));
                }
                Ok(_) => match framed::receive(&self.stream, &mut self.frames) {
                    Ok(true) => continue,
                    Ok(false) => return Ok(None),
                    Err(_) => return Err(Broken::Closed),
                },
            }
        }
    }

    fn answer(&mut self, packet: &[u8]) -> bool {
        let prefix = stream::prefix(packet.len());
        framed::send(&self.stream, &mut [IoSlice::new(&prefix), IoSlice::new(packet)], Duration::ZERO).is_ok()
    }
}

fn accept_loop(shared: Arc<Shared>, listener: TcpListener, parking: Arc<Parking>) {
    let live = Arc::new(AtomicUsize::new(0));
    let mut tokens = Vec::new();
    let mut doorway: Doorway<std::net::IpAddr, Connecting> = Doorway::new(MAX_HANDSHAKES, MAX_HANDSHAKES_PER_SOURCE);
    // Each bound connection, the heartbeat frame it is sent, and what the last looks saw of it.
    let mut bindings: Vec<(Weak<StreamBinding>, [u8; FRAME_HEAD], Watch)> = Vec::new();
    let mut last_beat = Instant::now();
    let idle = shared.config.timing.dead_after;
    while !shared.stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        let beat = now.saturating_duration_since(last_beat) >= HEARTBEAT;
        if beat {
            last_beat = now;
        }
        // Heartbeats; and another thread for a binding whose threads are all running calls.
        bindings.retain_mut(|(b, header, watch)| match b.upgrade() {
            Some(binding) => {
                if beat {
                    binding.conn.beat(header);
                }
                if binding.wants_helper(now, watch) {
                    spawn(&binding, false);
                }
                true
            }
            None => false,
        });
        // What becomes of a connection in the bind exchange after some progress.
        let mut progress = |connecting: &mut Connecting, step: Step| match step {
            Step::Wait => true,
            Step::Done => false,
            Step::Admit(admission) => {
                if let Some(bound) = bind(&shared, &live, &parking, connecting, admission) {
                    bindings.push(bound);
                }
                false
            }
        };
        // A few arrivals at a time, then the connections' progress: a burst of arrivals from
        // one source cannot push out a client whose request is landing meanwhile.
        let mut more = false;
        for _ in 0..ARRIVALS {
            match listener.accept() {
                Ok((stream, from)) => {
                    more = true;
                    if shared.refusing_bindings() || tiercel_sys::tcp::prepare(&stream, idle).is_err() {
                        // Closing the connection unread tells the client.
                        shared.stats.rejected.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let frames = Deframer::new(
                        PREFIX_LEN + 2 * crate::rendezvous::MAX_MESSAGE,
                        2 * crate::rendezvous::MAX_MESSAGE,
                    );
                    doorway.arrive(&shared, from.ip(), Connecting { stream, frames }, &mut progress);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    // Out of descriptors, for example: try again a little later.
                    std::thread::sleep(Duration::from_millis(10));
                    break;
                }
            }
        }
        doorway.tend(&shared, &mut progress);
        parking.wake_ready(&mut tokens);
        if beat {
            parking.expire(now, shared.config.binding_idle);
        }
        // Often while a binding is in use (it may need another thread soon), else once a heartbeat.
        let now = Instant::now();
        let active = bindings.iter().any(|(b, _, _)| b.upgrade().is_some_and(|b| b.active(now)));
        let period = if active { HELP_AFTER } else { HEARTBEAT };
        if !more {
            let parked = std::os::fd::AsFd::as_fd(&parking.set);
            doorway.wait(std::os::fd::AsFd::as_fd(&listener), Some(parked), period);
        }
    }
    // Stopping: the parked bindings' connections close with them.
    parking.bindings().clear();
}

/// Makes the binding a connection's bind request was admitted to, and answers with the grant (or
/// busy, without room): the binding, with the heartbeat frame the listener sends it, for the
/// listener to watch.
fn bind(
    shared: &Arc<Shared>,
    live: &Arc<AtomicUsize>,
    parking: &Arc<Parking>,
    h: &mut Connecting,
    admission: tiercel_proto::bind::Admission,
) -> Option<(Weak<StreamBinding>, [u8; FRAME_HEAD], Watch)> {
    let machine = shared.bind_machine(0);
    let slots = shared.config.slots_per_binding.max(1);
    let budget = Arc::new(Budget::new(shared.config.binding_memory));
    let charge = Charge::new(budget.clone(), shared.memory.clone());
    // No buffer and no thread yet: the binding starts parked, and its first call gives it both.
    if !has_room(shared, live) {
        shared.stats.rejected.fetch_add(1, Ordering::Relaxed);
        h.answer(&admission.busy(&machine));
        return None;
    }
    let id = shared.next_shm_binding.fetch_add(1, Ordering::Relaxed);
    if !h.answer(&admission.grant(&machine, id, 0, slots, 0)) {
        return None;
    }
    let stream = h.stream.try_clone().ok()?;
    let conn = Arc::new(Conn {
        stream,
        writing: Mutex::new(()),
        running: AtomicUsize::new(0),
        send_timeout: shared.config.timing.dead_after,
    });
    let mut beat = [0u8; FRAME_HEAD];
    beat[..PREFIX_LEN].copy_from_slice(&stream::prefix(HEADER_LEN));
    let header = Header { binding: id, incarnation: shared.incarnation, ..Header::new(Kind::ProbeReply) };
    beat[PREFIX_LEN..].copy_from_slice(&header.to_bytes());
    let now = Instant::now();
    let binding = Arc::new(StreamBinding {
        shared: shared.clone(),
        conn,
        export: shared.exports[admission.export].clone(),
        id,
        slots,
        budget,
        turn: std::sync::Condvar::new(),
        waiting: AtomicUsize::new(0),
        reader: Mutex::new(Some(Reader {
            frames: Deframer::new(0, stream::max_frame(shared.config.timing.max_message)),
            charge,
            retention: Retention::default(),
            last_frame: now,
            spin_until: now,
            lease: super::spinning::SpinLease::new(&shared.spin_leases),
        })),
        threads: AtomicUsize::new(0),
        idle: AtomicUsize::new(0),
        all_busy_since: AtomicU64::new(0),
        taken: AtomicU64::new(0),
        created: now,
        closed: AtomicBool::new(false),
        live: live.clone(),
        parking: parking.clone(),
        parked: AtomicBool::new(true),
    });
    live.fetch_add(1, Ordering::Relaxed);
    shared.stats.bindings.fetch_add(1, Ordering::Relaxed);
    shared.stream_bindings.fetch_add(1, Ordering::Relaxed);
    if !binding.park() {
        binding.ended();
        return None;
    }
    Some((Arc::downgrade(&binding), beat, Watch::default()))
}

/// How long every thread of a binding must have been running a call before the listener gives
/// it another thread (up to [`StreamBinding::max_threads`]).
const HELP_AFTER: Duration = Duration::from_millis(10);
/// Looks in a row at which every thread of a connection runs a call while its client's bytes wait
/// that give it another thread. (At one look, or two, a caller whose next call arrives as its
/// result goes out can look the same.)
const WAITED_LOOKS: u8 = 3;

/// What the listener remembers of a connection between its looks.
#[derive(Default)]
struct Watch {
    /// Looks in a row, up to the last, at which every thread ran a slow call while bytes waited.
    waited: u8,
    /// Calls taken by the connection's threads at the last look.
    taken: u64,
}
/// A binding's extra thread that has had no call for this long ends.
const HELPER_IDLE: Duration = Duration::from_secs(5);
/// A binding whose client has sent nothing for this long, with no call running and no other
/// thread, gives up its thread and its receive buffer: it waits, parked, for its next bytes.
const PARK_AFTER: Duration = Duration::from_secs(1);

/// The bound connections that have no thread (bound and not called yet, or idle for
/// [`PARK_AFTER`]): they cost a descriptor and a few hundred bytes each, no thread and no buffer.
/// The listener polls them beside its own sockets and gives one a thread when its client sends.
pub(crate) struct Parking {
    set: tiercel_sys::tcp::Parked,
    bindings: Mutex<std::collections::HashMap<u64, Arc<StreamBinding>>>,
}

impl Parking {
    fn bindings(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, Arc<StreamBinding>>> {
        self.bindings.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Gives a thread to each parked binding whose client has sent something (or closed).
    fn wake_ready(&self, tokens: &mut Vec<u64>) {
        if self.set.ready(tokens).is_err() {
            return;
        }
        for token in tokens.iter() {
            let Some(binding) = self.bindings().remove(token) else { continue };
            self.set.remove(std::os::fd::AsFd::as_fd(&binding.conn.stream));
            binding.parked.store(false, Ordering::Release);
            spawn(&binding, true);
        }
    }

    /// Ends the parked bindings unheard from for `idle` (as a bound connection's thread would).
    fn expire(&self, now: Instant, idle: Duration) {
        let mut bindings = self.bindings();
        bindings.retain(|_, b| {
            let quiet = b.reader.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|r| r.last_frame);
            if quiet.is_some_and(|last| now.saturating_duration_since(last) < idle) {
                return true;
            }
            self.set.remove(std::os::fd::AsFd::as_fd(&b.conn.stream));
            b.shared.stats.expired.fetch_add(1, Ordering::Relaxed);
            b.ended();
            false
        });
    }
}
/// Bytes of call arguments a thread copies out of the receive buffer (a larger call runs on the
/// thread that reads it, borrowed where it landed).
const SMALL_CALL: usize = BUFFER;

/// Starts a thread serving `binding` (`first`: the one it starts with, which ends only with the
/// connection). False if no thread could be had.
fn spawn(binding: &Arc<StreamBinding>, first: bool) -> bool {
    binding.threads.fetch_add(1, Ordering::AcqRel);
    binding.idle.fetch_add(1, Ordering::AcqRel);
    let b = binding.clone();
    let spawned = std::thread::Builder::new().name("tiercel-tcp-binding".into()).spawn(move || {
        let cpus = &b.shared.config.cpus;
        if first && !cpus.is_empty() {
            let i = b.shared.stream_bindings.load(Ordering::Relaxed);
            let _ = tiercel_sys::cpu::pin_current_thread(cpus[i % cpus.len()]);
        }
        b.serve(first);
        StreamBinding::thread_ends(&b);
    });
    match spawned {
        // Joined when the server stops, so that nothing of it outlives `RunningServer::stop`.
        Ok(thread) => {
            let mut threads = binding.shared.binding_threads.lock().unwrap_or_else(|p| p.into_inner());
            threads.retain(|t| !t.is_finished());
            threads.push(thread);
            true
        }
        Err(_) => {
            binding.close();
            StreamBinding::thread_ends(binding);
            false
        }
    }
}

/// One connection's binding: its threads take turns reading the connection, and run the calls
/// they read.
pub(crate) struct StreamBinding {
    shared: Arc<Shared>,
    conn: Arc<Conn>,
    export: Arc<dyn crate::interface::Export>,
    id: u32,
    slots: u32,
    /// The binding's memory budget, shared by its threads' charges.
    budget: Arc<Budget>,
    /// The reading side, taken out by the thread reading the connection and put back when it has a
    /// call to run (`None` meanwhile).
    reader: Mutex<Option<Reader>>,
    /// Signalled when the reading side is put back and a thread waits for it.
    turn: std::sync::Condvar,
    /// Threads waiting for their turn to read.
    waiting: AtomicUsize,
    /// Threads serving the binding.
    threads: AtomicUsize,
    /// Those of them not running a call (reading, or waiting to read).
    idle: AtomicUsize,
    /// Nanoseconds after `created` when the last idle thread took a call.
    all_busy_since: AtomicU64,
    /// Calls taken by the binding's threads.
    taken: AtomicU64,
    created: Instant,
    /// The connection is over: the threads end.
    closed: AtomicBool,
    /// Bindings of the listener, counted down when the binding ends.
    live: Arc<AtomicUsize>,
    /// Where the binding waits without a thread.
    parking: Arc<Parking>,
    /// Its last thread found it idle and gives it up to the parking when it ends.
    parked: AtomicBool,
}

/// The reading side of a connection.
struct Reader {
    frames: Deframer,
    /// The receive buffer, charged to the binding's budget and the server's.
    charge: Charge,
    retention: Retention,
    /// When the last frame was read.
    last_frame: Instant,
    /// Reading spins until then (`ServerConfig::spin` after the last frame, while it holds the
    /// lease to).
    spin_until: Instant,
    lease: super::spinning::SpinLease,
}

/// A call read from the connection, its arguments copied into the reading thread's buffer.
struct Taken {
    slot: u32,
    seq: u32,
    procedure: u16,
    arrival: Arrival,
}

/// A thread's own buffers and their charge.
struct Own {
    args: Vec<u8>,
    /// Prefix, header and results of the frame going back.
    out: Vec<u8>,
    charge: Charge,
    /// When large results last passed (their buffer is kept a while).
    retention: Retention,
}

impl Own {
    /// Charges what the buffers hold now; without room, gives back what large calls grew.
    fn settle(&mut self) {
        if self.out.capacity() > OUT {
            self.retention.large(Instant::now());
        }
        if !self.charge.settle(self.args.capacity() + self.out.capacity()) {
            self.shrink();
        }
    }

    /// Gives back what large calls grew.
    fn shrink(&mut self) {
        self.args = Vec::new();
        self.out = Vec::with_capacity(OUT);
        self.charge.settle(OUT);
    }
}

impl StreamBinding {
    /// Most threads serving one binding: a slow call then holds up only its own caller while
    /// fewer than this many run at once.
    fn max_threads(&self) -> usize {
        (self.slots as usize).min(self.shared.config.workers.max(2))
    }

    /// Whether the listener should give the binding another thread: there is room for one more,
    /// and every thread has been running a call for [`HELP_AFTER`], or every thread was running a
    /// slow one (see `super::slow_calls`) while more of the client's bytes waited to be read at
    /// [`WAITED_LOOKS`] looks in a row, so that calls whose procedures block run side by side
    /// instead of queueing behind one another.
    fn wants_helper(&self, now: Instant, watch: &mut Watch) -> bool {
        let taken = self.taken.load(Ordering::Acquire);
        let since_taken = taken.wrapping_sub(std::mem::replace(&mut watch.taken, taken));
        let waited = &mut watch.waited;
        let threads = self.threads.load(Ordering::Acquire);
        if self.idle.load(Ordering::Acquire) != 0
            || threads == 0
            || threads >= self.max_threads()
            || self.closed.load(Ordering::Acquire)
        {
            *waited = 0;
            return false;
        }
        let since = Duration::from_nanos(self.all_busy_since.load(Ordering::Acquire));
        let slow = super::slow_calls(since_taken, threads, HELP_AFTER);
        *waited = if slow && self.bytes_waiting() { waited.saturating_add(1) } else { 0 };
        let help = now.saturating_duration_since(self.created + since) >= HELP_AFTER || *waited >= WAITED_LOOKS;
        if help {
            *waited = 0;
        }
        help
    }

    /// Whether bytes of the client wait to be read: in the socket, or read into the reading side's
    /// buffer while no thread reads (every thread runs a call).
    fn bytes_waiting(&self) -> bool {
        let buffered = match self.reader.try_lock() {
            Ok(r) => r.as_ref().is_some_and(|r| r.frames.buffered() > 0),
            Err(_) => false,
        };
        buffered || tiercel_sys::udp::wait_readable_fd(&self.conn.stream, Some(Duration::ZERO)).unwrap_or(false)
    }

    /// Whether a call of the binding started within the last second, or it was made within the
    /// last second: the listener then looks every [`HELP_AFTER`] whether it needs another thread.
    fn active(&self, now: Instant) -> bool {
        let since = Duration::from_nanos(self.all_busy_since.load(Ordering::Acquire));
        !self.closed.load(Ordering::Acquire) && now.saturating_duration_since(self.created + since) < HEARTBEAT
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let _ = self.conn.stream.shutdown(std::net::Shutdown::Both);
    }

    /// A thread ends (from idle); the last one parks the binding, if it found it idle, or ends it.
    fn thread_ends(self: &Arc<Self>) {
        self.idle.fetch_sub(1, Ordering::AcqRel);
        if self.threads.fetch_sub(1, Ordering::AcqRel) == 1 {
            let over = self.closed.load(Ordering::Acquire) || self.shared.stop.load(Ordering::Relaxed);
            if !(self.parked.load(Ordering::Acquire) && !over && self.park()) {
                self.ended();
            }
        }
    }

    /// Leaves the binding, with no thread, to the listener until its client sends again. False if
    /// it could not be parked.
    fn park(self: &Arc<Self>) -> bool {
        let token = u64::from(self.id);
        self.parking.bindings().insert(token, self.clone());
        let parked = self.parking.set.park(std::os::fd::AsFd::as_fd(&self.conn.stream), token).is_ok();
        if !parked {
            self.parking.bindings().remove(&token);
        }
        parked
    }

    /// The binding is over: its connection closes, and it no longer counts.
    fn ended(&self) {
        self.close();
        self.shared.stream_bindings.fetch_sub(1, Ordering::Relaxed);
        self.live.fetch_sub(1, Ordering::Relaxed);
    }

    /// One thread's life: take a call from the connection, run it, answer, again.
    fn serve(&self, first: bool) {
        let mut own = Own {
            args: Vec::new(),
            out: Vec::new(),
            charge: Charge::new(self.budget.clone(), self.shared.memory.clone()),
            retention: Retention::default(),
        };
        if !own.charge.reserve(OUT) {
            if first {
                self.close();
            }
            return;
        }
        own.out.reserve(OUT);
        while let Some(call) = self.take(&mut own, first) {
            self.busy();
            let status = self.run(&mut own, &call);
            // Idle again before the result goes: the caller's next call, which may arrive as soon
            // as it has gone, must not look like a call waiting while every thread is busy.
            self.idle.fetch_add(1, Ordering::AcqRel);
            let sent = self.send_result(&mut own.out, call.slot, call.seq, call.procedure, status);
            own.settle();
            if !sent {
                self.close();
                return;
            }
        }
    }

    /// This thread takes a call: one fewer idle. The instant is stored first, so that the listener,
    /// seeing no thread idle, reads when the last one went busy (or later), never an older one.
    fn busy(&self) {
        let since = self.created.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        self.all_busy_since.store(since, Ordering::Release);
        self.taken.fetch_add(1, Ordering::Relaxed);
        self.idle.fetch_sub(1, Ordering::AcqRel);
    }

    /// Runs a plain procedure with the arguments in `own.args`, its results into `own.out`.
    fn run(&self, own: &mut Own, call: &Taken) -> Status {
        self.run_with(&own.args, &mut own.out, call)
    }

    fn run_with(&self, args: &[u8], out: &mut Vec<u8>, call: &Taken) -> Status {
        let shared = &*self.shared;
        out.clear();
        out.resize(FRAME_HEAD, 0);
        self.conn.running.fetch_add(1, Ordering::AcqRel);
        shared.stream_running.fetch_add(1, Ordering::AcqRel);
        shared.stats.calls.fetch_add(1, Ordering::Relaxed);
        let limit = shared.config.timing.max_message;
        let status =
            dispatch::run_procedure(shared, &self.export, call.procedure, args, call.arrival, out, FRAME_HEAD, limit);
        shared.stream_running.fetch_sub(1, Ordering::AcqRel);
        self.conn.running.fetch_sub(1, Ordering::AcqRel);
        status
    }

    /// Runs an in-place procedure ([`crate::Export::in_place`]) on `frame`, its call's whole frame
    /// (prefix, header, message) where it landed, and sends the result from there: the buffer as
    /// the procedure left it, then what it returned, appended. An error goes back from `own.out`.
    /// False: the connection is over.
    fn run_in_place(&self, frame: &mut Vec<u8>, own: &mut Own, call: &Taken) -> bool {
        let shared = &*self.shared;
        let (slot, seq, procedure) = (call.slot, call.seq, call.procedure);
        let out = &mut own.out;
        out.clear();
        out.resize(FRAME_HEAD, 0);
        self.conn.running.fetch_add(1, Ordering::AcqRel);
        shared.stream_running.fetch_add(1, Ordering::AcqRel);
        shared.stats.calls.fetch_add(1, Ordering::Relaxed);
        let ran =
            dispatch::run_in_place(shared, &self.export, procedure, frame, FRAME_HEAD, call.arrival, out, FRAME_HEAD);
        shared.stream_running.fetch_sub(1, Ordering::AcqRel);
        self.conn.running.fetch_sub(1, Ordering::AcqRel);
        let limit = shared.config.timing.max_message;
        match ran {
            Ok(body) if frame.len() - body <= limit => {
                shared.stats.in_place.fetch_add(1, Ordering::Relaxed);
                let mut head = [0u8; FRAME_HEAD];
                fill_head(&mut head, self.id, shared.incarnation, slot, seq, procedure, Status::Ok, frame.len() - body);
                self.conn.send(&mut [IoSlice::new(&head), IoSlice::new(&frame[body..])]).is_ok()
            }
            Ok(body) => {
                let message = format!("result of {} bytes exceeds the limit of {limit} bytes", frame.len() - body);
                out.extend_from_slice(message.as_bytes());
                self.send_result(out, slot, seq, procedure, Status::ResultTooLarge)
            }
            Err(status) => self.send_result(out, slot, seq, procedure, status),
        }
    }

    /// Reads the connection until a call to run comes (`None`: the connection is over, or this
    /// extra thread has had nothing to do for [`HELPER_IDLE`]). Everything else that comes is
    /// handled here: probes, cancels, refusals, async procedures (started on the runtime), and
    /// calls too large to copy, run by this thread where they landed.
    fn take(&self, own: &mut Own, first: bool) -> Option<Taken> {
        let waiting_since = Instant::now();
        let mut r = {
            let mut slot = self.reader.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if self.closed.load(Ordering::Acquire) || self.shared.stop.load(Ordering::Relaxed) {
                    return None;
                }
                if let Some(r) = slot.take() {
                    break r;
                }
                if !first && waiting_since.elapsed() >= HELPER_IDLE {
                    return None;
                }
                if own.retention.holds_large() && own.retention.idle(Instant::now()) {
                    own.shrink();
                }
                self.waiting.fetch_add(1, Ordering::AcqRel);
                slot = match self.turn.wait_timeout(slot, POLL) {
                    Ok((slot, _)) => slot,
                    Err(p) => p.into_inner().0,
                };
                self.waiting.fetch_sub(1, Ordering::AcqRel);
            }
        };
        let taken = self.read_call(&mut r, own, first, waiting_since);
        *self.reader.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        if self.waiting.load(Ordering::Acquire) > 0 {
            self.turn.notify_one();
        }
        taken
    }

    /// Reads the connection, holding its reading side, until a call to run comes (see
    /// [`StreamBinding::take`]).
    fn read_call(&self, r: &mut Reader, own: &mut Own, first: bool, waiting_since: Instant) -> Option<Taken> {
        let spin = self.shared.config.spin;
        if r.charge.charged() == 0 && r.charge.settle(BUFFER) {
            // Back from the parking: the buffer again (without room for it, the frames grow from
            // nothing, charged as they arrive).
            r.frames = Deframer::new(BUFFER, stream::max_frame(self.shared.config.timing.max_message));
        }
        loop {
            if self.closed.load(Ordering::Acquire) || self.shared.stop.load(Ordering::Relaxed) {
                return None;
            }
            loop {
                match r.frames.next() {
                    Err(_) => {
                        self.shared.stats.malformed.fetch_add(1, Ordering::Relaxed);
                        self.close();
                        return None;
                    }
                    Ok(Next::Frame(_)) => {
                        let now = Instant::now();
                        r.last_frame = now;
                        r.spin_until = if r.lease.take() { now + spin } else { now };
                        match self.on_frame(r, own, now) {
                            Handled::Next => r.frames.consume(),
                            Handled::Take(call) => {
                                r.frames.consume();
                                return Some(call);
                            }
                            Handled::Over => {
                                self.close();
                                return None;
                            }
                        }
                    }
                    Ok(Next::Partial(len)) => {
                        if r.frames.needs_room(len) && !self.grow_for(r, len) {
                            self.close();
                            return None;
                        }
                        break;
                    }
                    Ok(Next::Nothing) => break,
                }
            }
            match framed::receive(&self.conn.stream, &mut r.frames) {
                Ok(true) => continue,
                Ok(false) => {}
                Err(_) => {
                    self.close();
                    return None;
                }
            }
            let now = Instant::now();
            if now < r.spin_until {
                core::hint::spin_loop();
                continue;
            }
            // Done spinning: another thread may.
            r.lease.give_back();
            // A binding that has sent nothing for `binding_idle`, with nothing running, goes as an
            // idle UDP binding does (its client finds the connection closed, and binds again).
            let quiet = now.saturating_duration_since(r.last_frame);
            if quiet >= self.shared.config.binding_idle && self.conn.running.load(Ordering::Acquire) == 0 {
                self.shared.stats.expired.fetch_add(1, Ordering::Relaxed);
                self.close();
                return None;
            }
            if !first && now.saturating_duration_since(waiting_since) >= HELPER_IDLE {
                return None;
            }
            let alone = self.threads.load(Ordering::Acquire) == 1 && self.conn.running.load(Ordering::Acquire) == 0;
            if first && alone && quiet >= PARK_AFTER && r.frames.buffered() == 0 {
                r.frames = Deframer::new(0, stream::max_frame(self.shared.config.timing.max_message));
                r.charge.settle(0);
                r.retention = Retention::default();
                self.parked.store(true, Ordering::Release);
                return None;
            }
            if r.retention.holds_large() && r.retention.idle(now) {
                r.frames.shrink();
                r.charge.settle(BUFFER);
            }
            if own.retention.holds_large() && own.retention.idle(now) {
                own.shrink();
            }
            if tiercel_sys::udp::wait_readable_fd(&self.conn.stream, Some(POLL)).is_err() {
                self.close();
                return None;
            }
        }
    }

    /// Makes room for more of a frame of `len` bytes that has filled the buffer: twice what the
    /// buffer holds (at most the frame), charged before it is touched, so that a prefix claiming a
    /// large frame is charged only as its bytes arrive. A frame larger than the binding may ever
    /// hold, or one the budgets have no room for, is answered `Busy` and its bytes are dropped as
    /// they come. False: the connection is over.
    fn grow_for(&self, r: &mut Reader, len: usize) -> bool {
        let to = r.frames.next_size(len);
        if PREFIX_LEN + len <= r.charge.binding_limit() && r.charge.settle(to) {
            r.frames.grow_toward(len, to);
            r.retention.large(Instant::now());
            return true;
        }
        // The header comes first: the refusal needs its slot and number.
        let Some(header) = r.frames.header() else { return true };
        // Only the header is here: it is checked as far as it goes (the payload follows).
        let p = Packet::new_unchecked(header);
        if p.kind() != Kind::Call || p.binding() != self.id || p.incarnation() != self.shared.incarnation {
            self.shared.stats.malformed.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let (slot, seq, procedure) = (p.slot(), p.seq(), p.procedure());
        self.shared.stats.busy.fetch_add(1, Ordering::Relaxed);
        r.frames.skip_frame();
        self.answer(Kind::Result, Status::Busy, slot, seq, procedure).is_ok()
    }

    /// Sends a frame without payload (a refusal, a probe's answer).
    fn answer(&self, kind: Kind, status: Status, slot: u32, seq: u32, procedure: u16) -> std::io::Result<()> {
        let h = Header {
            status,
            procedure,
            binding: self.id,
            slot,
            seq,
            incarnation: self.shared.incarnation,
            ..Header::new(kind)
        };
        let prefix = stream::prefix(HEADER_LEN);
        self.conn.send(&mut [IoSlice::new(&prefix), IoSlice::new(&h.to_bytes())])
    }

    /// Handles the whole frame at the front of the buffer.
    fn on_frame(&self, r: &mut Reader, own: &mut Own, now: Instant) -> Handled {
        let stats = &self.shared.stats;
        let ok = |sent: std::io::Result<()>| if sent.is_ok() { Handled::Next } else { Handled::Over };
        let Ok(p) = stream::check_frame(r.frames.frame()) else {
            stats.malformed.fetch_add(1, Ordering::Relaxed);
            return Handled::Over;
        };
        let (slot, seq, procedure) = (p.slot(), p.seq(), p.procedure());
        let reject = |status| {
            stats.rejected.fetch_add(1, Ordering::Relaxed);
            ok(self.answer(Kind::Reject, status, slot, seq, procedure))
        };
        if p.binding() != self.id || p.token() != 0 {
            return reject(Status::UnknownBinding);
        }
        if p.incarnation() != self.shared.incarnation {
            return reject(Status::WrongIncarnation);
        }
        if slot >= self.slots {
            return reject(Status::BadSlot);
        }
        match p.kind() {
            Kind::Call => {}
            Kind::Probe => return ok(self.answer(Kind::ProbeReply, Status::Ok, slot, seq, procedure)),
            Kind::Cancel => {
                stats.cancelled.fetch_add(1, Ordering::Relaxed);
                // A plain procedure runs to its end; an async one stops.
                #[cfg(feature = "async")]
                if let Some(runner) = &self.shared.asynch {
                    runner.cancel((self.id | 1 << 31, slot, seq));
                }
                return Handled::Next;
            }
            _ => {
                stats.malformed.fetch_add(1, Ordering::Relaxed);
                return Handled::Over;
            }
        }
        if self.shared.refusing_bindings() {
            stats.busy.fetch_add(1, Ordering::Relaxed);
            return ok(self.answer(Kind::Result, Status::Busy, slot, seq, procedure));
        }
        let arrival =
            Arrival { at: Some(now), context: p.flags() & flags::CONTEXT != 0, deadline: None, transport: "tcp" };
        let call = Taken { slot, seq, procedure, arrival };
        let args = p.payload();
        #[cfg(feature = "async")]
        {
            own.out.clear();
            own.out.resize(FRAME_HEAD, 0);
            if let Some(started) = self.start_async(args, &call, &mut own.out) {
                return match started {
                    Ok(()) => Handled::Next,
                    Err(status) => {
                        if self.send_result(&mut own.out, slot, seq, procedure, status) {
                            Handled::Next
                        } else {
                            Handled::Over
                        }
                    }
                };
            }
        }
        if args.len() <= SMALL_CALL {
            // The copy is charged before it is made.
            if !own.charge.settle(args.len().max(own.args.capacity()) + own.out.capacity()) {
                stats.busy.fetch_add(1, Ordering::Relaxed);
                return ok(self.answer(Kind::Result, Status::Busy, slot, seq, procedure));
            }
            own.args.clear();
            own.args.extend_from_slice(args);
            return Handled::Take(call);
        }
        // Too large to copy: run here, borrowed where it landed, the connection unread meanwhile.
        // A procedure that runs on its `InOut` buffer where it lies has it sent back from there.
        self.busy();
        let in_place = self.export.in_place(procedure);
        let sent = match in_place.then(|| r.frames.consume_in_place(|frame| self.run_in_place(frame, own, &call))) {
            Some(Some(sent)) => sent,
            _ => {
                let args = r.frames.frame().get(HEADER_LEN..).unwrap_or_default();
                let status = self.run_with(args, &mut own.out, &call);
                self.send_result(&mut own.out, slot, seq, procedure, status)
            }
        };
        own.settle();
        self.idle.fetch_add(1, Ordering::AcqRel);
        if sent {
            Handled::Next
        } else {
            Handled::Over
        }
    }

    /// Starts the call on the runtime if its procedure is async (`None`: it is not).
    #[cfg(feature = "async")]
    fn start_async(&self, args: &[u8], call: &Taken, out: &mut Vec<u8>) -> Option<Result<(), Status>> {
        let (id, incarnation, conn) = (self.id, self.shared.incarnation, self.conn.clone());
        let (slot, seq, procedure) = (call.slot, call.seq, call.procedure);
        let finish = move |status: Status, results: Vec<u8>| {
            let mut head = [0u8; FRAME_HEAD];
            fill_head(&mut head, id, incarnation, slot, seq, procedure, status, results.len());
            let _ = conn.send(&mut [IoSlice::new(&head), IoSlice::new(&results)]);
            conn.running.fetch_sub(1, Ordering::AcqRel);
        };
        self.conn.running.fetch_add(1, Ordering::AcqRel);
        let key = (id | 1 << 31, slot, seq);
        let limit = self.shared.config.timing.max_message;
        let started =
            dispatch::start_async(&self.shared, &self.export, procedure, args, call.arrival, out, limit, key, finish);
        if !matches!(started, Some(Ok(()))) {
            self.conn.running.fetch_sub(1, Ordering::AcqRel);
        }
        started
    }

    /// Sends the result frame in `out` (prefix and header filled in here). False: the connection
    /// is over.
    fn send_result(&self, out: &mut [u8], slot: u32, seq: u32, procedure: u16, status: Status) -> bool {
        let len = out.len() - FRAME_HEAD;
        let (head, _) = out.split_at_mut(FRAME_HEAD);
        let head: &mut [u8; FRAME_HEAD] = match head.try_into() {
            Ok(h) => h,
            Err(_) => unreachable!("the result buffer starts with a frame head"),
        };
        fill_head(head, self.id, self.shared.incarnation, slot, seq, procedure, status, len);
        self.conn.send(&mut [IoSlice::new(out)]).is_ok()
    }
}

/// What became of a frame.
enum Handled {
    /// Dealt with: the next.
    Next,
    /// A call for the reading thread to run.
    Take(Taken),
    /// The connection is over.
    Over,
}

/// Writes the prefix and header of a result frame of `len` bytes of results.
#[allow(clippy::too_many_arguments)]
fn fill_head(
    head: &mut [u8; FRAME_HEAD],
    binding: u32,
    incarnation: u64,
    slot: u32,
    seq: u32,
    procedure: u16,
    status: Status,
    len: usize,
) {
    head[..PREFIX_LEN].copy_from_slice(&stream::prefix(HEADER_LEN + len));
    let h = Header {
        status,
        procedure,
        binding,
        slot,
        seq,
        incarnation,
        payload_len: len as u32,
        message_len: len as u32,
        ..Header::new(Kind::Result)
    };
    head[PREFIX_LEN..].copy_from_slice(&h.to_bytes());
}
