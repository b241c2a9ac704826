//! The server side of the TCP transport: a listener on the same port number as the UDP socket, and
//! one thread per connection (one connection is one binding) that reads its frames and runs its
//! calls.
//!
//! Before a client has a binding it costs no thread: the listener thread runs every bind exchange
//! itself, on non-blocking sockets, at most [`MAX_HANDSHAKES`] at once (a few kilobytes each), each
//! within [`HANDSHAKE`] of its connection, with the same bind machine as UDP and shared memory (interface check, shared
//! secret). A binding's buffers are charged to `ServerConfig::binding_memory` and the server-wide
//! `ServerConfig::message_memory` before they grow: a call frame that does not fit is answered
//! `Busy` and its bytes are dropped as they arrive, never held.
//!
//! Calls of one connection run one at a time on its thread, in the order they arrived (an async
//! procedure runs on the runtime, so others go on meanwhile); each result goes back as one frame
//! with one `write`. While a call of the connection runs, the listener thread sends the client a
//! heartbeat frame every [`HEARTBEAT`], so that a stopped or hung server process is told from a
//! slow procedure by silence, as over the other transports. A client that does not read its
//! results loses its connection after `Timing::dead_after`.

use std::io::IoSlice;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tiercel_proto::bind::{BindDecision, Refused};
use tiercel_proto::endpoint::Budget;
use tiercel_proto::stream::{self, Deframer, Next, PREFIX_LEN};
use tiercel_proto::wire::{flags, Header, Kind, Packet, Status, HEADER_LEN};

use super::dispatch::{self, Arrival};
use super::shm::{wait_for_handshakes, Charge, HANDSHAKE};
use super::Shared;
use crate::framed;
use crate::retention::Retention;

/// Connections in the bind exchange at once; more are closed at once. Each holds a buffer of a
/// few kilobytes and a descriptor for at most [`HANDSHAKE`], so that peers who connect and send
/// nothing cannot keep others out for long.
pub(crate) const MAX_HANDSHAKES: usize = 256;
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
    std::thread::Builder::new().name("tiercel-tcp-listener".into()).spawn(move || accept_loop(shared, listener))
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
struct Handshake {
    stream: TcpStream,
    arrived: Instant,
    frames: Deframer,
    /// Requests answered so far (a challenge allows a second).
    answered: u8,
    /// Stands for the peer in challenges: they are bound to this connection.
    peer: [u8; 16],
}

fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    let live = Arc::new(AtomicUsize::new(0));
    let mut pending: Vec<Handshake> = Vec::new();
    let mut conns: Vec<(Weak<Conn>, [u8; FRAME_HEAD])> = Vec::new();
    let mut ready = Vec::new();
    let mut last_beat = Instant::now();
    let idle = shared.config.timing.dead_after;
    while !shared.stop.load(Ordering::Relaxed) {
        if last_beat.elapsed() >= HEARTBEAT {
            conns.retain(|(c, header)| match c.upgrade() {
                Some(conn) => {
                    conn.beat(header);
                    true
                }
                None => false,
            });
            last_beat = Instant::now();
        }
        loop {
            match listener.accept() {
                Ok((stream, _)) => {
                    let Ok(peer) = crate::client::random_bytes() else { continue };
                    if pending.len() >= MAX_HANDSHAKES
                        || shared.refusing_bindings()
                        || tiercel_sys::tcp::prepare(&stream, idle).is_err()
                    {
                        // No room: closing the connection unread tells the client.
                        shared.stats.rejected.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let frames = Deframer::new(
                        PREFIX_LEN + 2 * crate::rendezvous::MAX_MESSAGE,
                        2 * crate::rendezvous::MAX_MESSAGE,
                    );
                    pending.push(Handshake { stream, arrived: Instant::now(), frames, answered: 0, peer });
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    // Out of descriptors, for example: try again a little later.
                    std::thread::sleep(Duration::from_millis(10));
                    break;
                }
            }
        }
        let now = Instant::now();
        pending.retain_mut(|h| {
            if now.saturating_duration_since(h.arrived) >= HANDSHAKE {
                shared.stats.rejected.fetch_add(1, Ordering::Relaxed);
                return false;
            }
            match progress(&shared, &live, h) {
                Progress::Wait => true,
                Progress::Done => false,
                Progress::Bound(conn, header) => {
                    conns.push((conn, header));
                    false
                }
            }
        });
        let handshakes = pending.iter().map(|h| (h.arrived, std::os::fd::AsFd::as_fd(&h.stream)));
        wait_for_handshakes(std::os::fd::AsFd::as_fd(&listener), handshakes, now, HEARTBEAT, &mut ready);
    }
}

/// Where a handshake stands after some progress.
enum Progress {
    /// Waiting for more bytes.
    Wait,
    /// Over without a binding: refused, or failed.
    Done,
    /// Bound: its thread runs; the listener beats its heart (with this frame).
    Bound(Weak<Conn>, [u8; FRAME_HEAD]),
}

/// Reads what a handshake's client sent and answers it, through the server's bind machine.
fn progress(shared: &Arc<Shared>, live: &Arc<AtomicUsize>, h: &mut Handshake) -> Progress {
    let malformed = || {
        shared.stats.malformed.fetch_add(1, Ordering::Relaxed);
        Progress::Done
    };
    loop {
        match h.frames.next() {
            Err(_) => return malformed(),
            Ok(Next::Frame(_)) => break,
            Ok(_) => match framed::receive(&h.stream, &mut h.frames) {
                Ok(true) => continue,
                Ok(false) => return Progress::Wait,
                Err(_) => return Progress::Done,
            },
        }
    }
    let Ok(p) = Packet::new_checked(h.frames.frame()) else { return malformed() };
    let machine = shared.bind_machine(0);
    let answer = |packet: &[u8]| {
        let prefix = stream::prefix(packet.len());
        // A fresh connection's socket buffer takes an answer this small whole.
        framed::send(&h.stream, &mut [IoSlice::new(&prefix), IoSlice::new(packet)], Duration::ZERO).is_ok()
    };
    let admission = match machine.on_request(&p, &h.peer, crate::rendezvous::MAX_MESSAGE) {
        BindDecision::Malformed => return malformed(),
        BindDecision::Answer { packet, refused } => {
            shared.count_refusal(refused);
            h.answered += 1;
            h.frames.consume();
            let sent = answer(&packet);
            return if sent && refused == Refused::Challenged && h.answered < 2 {
                Progress::Wait
            } else {
                Progress::Done
            };
        }
        BindDecision::Admit(a) => a,
    };
    let slots = shared.config.slots_per_binding.max(1);
    let mut charge = Charge::new(Arc::new(Budget::new(shared.config.binding_memory)), shared.memory.clone());
    let room = live.load(Ordering::Relaxed) < shared.config.max_bindings && !shared.refusing_bindings();
    if !room || !charge.reserve(BUFFER + OUT) {
        shared.stats.rejected.fetch_add(1, Ordering::Relaxed);
        answer(&admission.busy(&machine));
        return Progress::Done;
    }
    let id = shared.next_shm_binding.fetch_add(1, Ordering::Relaxed);
    if !answer(&admission.grant(&machine, id, 0, slots, 0)) {
        return Progress::Done;
    }
    let Ok(stream) = h.stream.try_clone() else { return Progress::Done };
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
    let export = shared.exports[admission.export].clone();
    let weak = Arc::downgrade(&conn);
    live.fetch_add(1, Ordering::Relaxed);
    let (shared_, live_) = (shared.clone(), live.clone());
    let spawned = std::thread::Builder::new().name("tiercel-tcp-binding".into()).spawn(move || {
        let cpus = &shared_.config.cpus;
        if !cpus.is_empty() {
            let i = shared_.stream_bindings.load(Ordering::Relaxed);
            let _ = tiercel_sys::cpu::pin_current_thread(cpus[i % cpus.len()]);
        }
        shared_.stats.bindings.fetch_add(1, Ordering::Relaxed);
        shared_.stream_bindings.fetch_add(1, Ordering::Relaxed);
        let frames = Deframer::new(BUFFER, stream::max_frame(shared_.config.timing.max_message));
        let mut binding = StreamBinding {
            shared: &shared_,
            conn,
            export,
            id,
            slots,
            frames,
            out: Vec::with_capacity(OUT),
            charge,
            retention: Retention::default(),
        };
        binding.run();
        shared_.stream_bindings.fetch_sub(1, Ordering::Relaxed);
        live_.fetch_sub(1, Ordering::Relaxed);
    });
    match spawned {
        Ok(thread) => {
            let mut threads = shared.binding_threads.lock().unwrap_or_else(|p| p.into_inner());
            threads.retain(|t| !t.is_finished());
            threads.push(thread);
            Progress::Bound(weak, beat)
        }
        // No thread: the connection goes, and the client sees it closed.
        Err(_) => {
            live.fetch_sub(1, Ordering::Relaxed);
            Progress::Done
        }
    }
}

/// One connection's binding, served by its own thread.
struct StreamBinding<'a> {
    shared: &'a Arc<Shared>,
    conn: Arc<Conn>,
    export: Arc<dyn crate::interface::Export>,
    id: u32,
    slots: u32,
    frames: Deframer,
    /// Prefix, header and results of the frame going back.
    out: Vec<u8>,
    /// The binding's buffers, charged to its budget and the server's.
    charge: Charge,
    retention: Retention,
}

impl StreamBinding<'_> {
    /// Serves the connection until the client closes it, breaks the protocol, or the server stops.
    fn run(&mut self) {
        let spin = self.shared.config.spin;
        let mut spin_until = Instant::now();
        let mut last_frame = Instant::now();
        loop {
            loop {
                match self.frames.next() {
                    Err(_) => {
                        self.shared.stats.malformed.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    Ok(Next::Frame(_)) => {
                        if !self.on_frame() {
                            return;
                        }
                        self.frames.consume();
                        last_frame = Instant::now();
                        spin_until = last_frame + spin;
                    }
                    Ok(Next::Partial(len)) => {
                        if !self.frames.fits(len) && !self.grow_for(len) {
                            return;
                        }
                        break;
                    }
                    Ok(Next::Nothing) => break,
                }
            }
            if self.shared.stop.load(Ordering::Relaxed) {
                return;
            }
            match framed::receive(&self.conn.stream, &mut self.frames) {
                Ok(true) => continue,
                Ok(false) => {}
                Err(_) => return,
            }
            let now = Instant::now();
            if now < spin_until {
                core::hint::spin_loop();
                continue;
            }
            // A binding that has sent nothing for `binding_idle`, with nothing running, goes as an
            // idle UDP binding does (its client finds the connection closed, and binds again).
            let idle = now.saturating_duration_since(last_frame);
            if idle >= self.shared.config.binding_idle && self.conn.running.load(Ordering::Acquire) == 0 {
                self.shared.stats.expired.fetch_add(1, Ordering::Relaxed);
                return;
            }
            if self.retention.holds_large() && self.retention.idle(now) {
                self.frames.shrink();
                self.out = Vec::with_capacity(OUT);
                self.charge.settle(BUFFER + OUT);
            }
            if tiercel_sys::udp::wait_readable_fd(&self.conn.stream, Some(POLL)).is_err() {
                return;
            }
        }
    }

    /// Makes room for a frame of `len` bytes larger than the buffer, charging it; without room,
    /// answers the call `Busy` and drops its bytes as they come. False: the connection is over.
    fn grow_for(&mut self, len: usize) -> bool {
        if self.charge.settle(BUFFER + OUT + self.frames.grown().max(PREFIX_LEN + len - BUFFER) + self.out_grown()) {
            self.frames.grow_for(len);
            self.retention.large(Instant::now());
            return true;
        }
        // The header comes first: the refusal needs its slot and number.
        let Some(header) = self.frames.header() else { return true };
        // Only the header is here: it is checked as far as it goes (the payload follows).
        let p = Packet::new_unchecked(header);
        if p.kind() != Kind::Call || p.binding() != self.id || p.incarnation() != self.shared.incarnation {
            self.shared.stats.malformed.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let (slot, seq, procedure) = (p.slot(), p.seq(), p.procedure());
        self.shared.stats.busy.fetch_add(1, Ordering::Relaxed);
        self.frames.skip_frame();
        self.answer(Kind::Result, Status::Busy, slot, seq, procedure).is_ok()
    }

    fn out_grown(&self) -> usize {
        self.out.capacity().saturating_sub(OUT)
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

    /// Handles the whole frame at the front of the buffer. False: the connection is over.
    fn on_frame(&mut self) -> bool {
        let stats = &self.shared.stats;
        let Ok(p) = stream::check_frame(self.frames.frame()) else {
            stats.malformed.fetch_add(1, Ordering::Relaxed);
            return false;
        };
        let (slot, seq, procedure) = (p.slot(), p.seq(), p.procedure());
        let reject = |status| {
            stats.rejected.fetch_add(1, Ordering::Relaxed);
            self.answer(Kind::Reject, status, slot, seq, procedure).is_ok()
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
            Kind::Probe => return self.answer(Kind::ProbeReply, Status::Ok, slot, seq, procedure).is_ok(),
            Kind::Cancel => {
                stats.cancelled.fetch_add(1, Ordering::Relaxed);
                // A plain procedure ran to its end before this frame was read; an async one stops.
                #[cfg(feature = "async")]
                if let Some(runner) = &self.shared.asynch {
                    runner.cancel((self.id | 1 << 31, slot, seq));
                }
                return true;
            }
            _ => {
                stats.malformed.fetch_add(1, Ordering::Relaxed);
                return false;
            }
        }
        if self.shared.refusing_bindings() {
            stats.busy.fetch_add(1, Ordering::Relaxed);
            return self.answer(Kind::Result, Status::Busy, slot, seq, procedure).is_ok();
        }
        let arrival = Arrival {
            at: Some(Instant::now()),
            context: p.flags() & flags::CONTEXT != 0,
            deadline: None,
            transport: "tcp",
        };
        let limit = self.shared.config.timing.max_message;
        let shared = self.shared;
        let (out, conn, export) = (&mut self.out, &self.conn, &self.export);
        let args = p.payload();
        out.clear();
        out.resize(FRAME_HEAD, 0);
        #[cfg(feature = "async")]
        {
            let conn_ = conn.clone();
            let (id, incarnation) = (self.id, shared.incarnation);
            let finish = move |status: Status, results: Vec<u8>| {
                let mut head = [0u8; FRAME_HEAD];
                fill_head(&mut head, id, incarnation, slot, seq, procedure, status, results.len());
                let _ = conn_.send(&mut [IoSlice::new(&head), IoSlice::new(&results)]);
                conn_.running.fetch_sub(1, Ordering::AcqRel);
            };
            conn.running.fetch_add(1, Ordering::AcqRel);
            let key = (id | 1 << 31, slot, seq);
            match dispatch::start_async(shared, export, procedure, args, arrival, out, limit, key, finish) {
                Some(Ok(())) => return true,
                Some(Err(status)) => {
                    conn.running.fetch_sub(1, Ordering::AcqRel);
                    return self.send_result(slot, seq, procedure, status);
                }
                None => {
                    conn.running.fetch_sub(1, Ordering::AcqRel);
                }
            }
        }
        conn.running.fetch_add(1, Ordering::AcqRel);
        shared.stream_running.fetch_add(1, Ordering::AcqRel);
        stats.calls.fetch_add(1, Ordering::Relaxed);
        let status = dispatch::run_procedure(shared, export, procedure, args, arrival, out, FRAME_HEAD, limit);
        shared.stream_running.fetch_sub(1, Ordering::AcqRel);
        conn.running.fetch_sub(1, Ordering::AcqRel);
        self.send_result(slot, seq, procedure, status)
    }

    /// Sends the result frame in `out` (prefix and header filled in here). False: the connection
    /// is over.
    fn send_result(&mut self, slot: u32, seq: u32, procedure: u16, status: Status) -> bool {
        let len = self.out.len() - FRAME_HEAD;
        let (head, _) = self.out.split_at_mut(FRAME_HEAD);
        let head: &mut [u8; FRAME_HEAD] = match head.try_into() {
            Ok(h) => h,
            Err(_) => unreachable!("the result buffer starts with a frame head"),
        };
        fill_head(head, self.id, self.shared.incarnation, slot, seq, procedure, status, len);
        let sent = self.conn.send(&mut [IoSlice::new(&self.out)]).is_ok();
        if self.out_grown() > 0 {
            self.retention.large(Instant::now());
            // Kept for the next large result only while the budgets have room for it.
            if !self.charge.settle(BUFFER + OUT + self.frames.grown() + self.out_grown()) {
                self.out = Vec::with_capacity(OUT);
            }
        }
        sent
    }
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
