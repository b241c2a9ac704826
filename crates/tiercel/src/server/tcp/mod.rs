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
//! grow: a call frame that does not fit is answered `Busy` (its client tries again later), or
//! `TooLarge` if no budget could ever hold it, and its bytes are dropped as they arrive, never held.
//!
//! A bound connection starts parked ([`Parking`]): no thread and no receive buffer, its descriptor
//! in an `epoll` set the listener polls beside its own sockets. When its client sends, the
//! listener gives it a thread of the pool all connections share ([`pool`]), which reads a call,
//! copies its arguments out, runs it, and sends
//! the result as one frame with one `write`. Calls read together (a client's threads sent them
//! while the last ran) are run in turn by the thread that read them, where they landed, and their
//! results go out together with one `write`, as long as their procedures are ones this thread has
//! seen run quickly (a call of any other goes as a lone call does, after the results held;
//! `ServerStats::sent_together`). Once the client has sent nothing for [`PARK_AFTER`],
//! with no call running and no other thread (or, when other connections wait for a thread of the
//! pool, as soon as its spin after the last frame is over), that thread gives its buffers back and
//! serves the next connection, and the connection is parked again. So an idle connection costs a descriptor and under a kilobyte (about 800 bytes measured, client
//! and server ends together),
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

use tiercel_proto::endpoint::{Caller, Carrier};
use tiercel_proto::seal::SealType;
use tiercel_proto::stream::{self, Deframer, Next, PREFIX_LEN};
use tiercel_proto::wire::{Header, Kind, HEADER_LEN};

use super::charge::Charge;
use super::handshake::{Broken, Doorway, Exchange, Step};
use super::secure::Hello;
use super::Shared;
use crate::framed;
use crate::retention::Retention;

mod binding;
mod pool;
mod reading;

use binding::*;

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
/// How often an extra thread waiting for its turn, or a thread that cannot give its connection up
/// while others wait for a thread, looks again.
const HELPER_LOOK: Duration = Duration::from_millis(10);
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
    let pool = Arc::new(pool::Pool::new(shared.config.connection_threads)?);
    let parking = Arc::new(Parking { set, bindings: Mutex::new(Default::default()), pool });
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
    /// How long a write may wait for the client to make room.
    send_timeout: Duration,
    /// A secure binding's keys: every frame both ways is sealed with them.
    seal: Option<Arc<crate::secure::Session>>,
    /// The stream blocks in its receives, each for at most
    /// [`RECEIVE_WAIT`](crate::waiting::RECEIVE_WAIT) as the kernel took it
    /// (`tiercel_sys::tcp::set_receive_wait`): its first thread, done spinning, waits for the
    /// next call in its read (`StreamBinding::read_call`). Its writes never block.
    receive_wait: bool,
}

impl Conn {
    /// Writes one frame (its prefix first, in `parts`; sealed, on a secure binding); on failure
    /// the connection is shut down (part of a frame may have gone).
    fn send(&self, parts: &mut [IoSlice<'_>]) -> std::io::Result<()> {
        let _writing = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        let sent = match &self.seal {
            Some(session) => framed::send_sealed(&self.stream, session, parts, self.send_timeout),
            None => framed::send(&self.stream, parts, self.send_timeout),
        };
        sent.inspect_err(|_| {
            let _ = self.stream.shutdown(std::net::Shutdown::Both);
        })
    }

    /// Sends a heartbeat (a call of the connection runs) unless the connection is being written
    /// (a result going out says as much) or has no room for it (a client with a full window gets
    /// none).
    fn beat(&self, header: &[u8; FRAME_HEAD]) {
        let Ok(_writing) = self.writing.try_lock() else { return };
        if let Some(session) = &self.seal {
            // A sealed heartbeat goes whole, when there is room for it now.
            let room = tiercel_sys::udp::wait_writable_fd(&self.stream, Some(Duration::ZERO)).unwrap_or(false);
            let parts = [IoSlice::new(header)];
            if room && framed::send_sealed(&self.stream, session, &parts, self.send_timeout).is_err() {
                let _ = self.stream.shutdown(std::net::Shutdown::Both);
            }
            return;
        }
        match tiercel_sys::tcp::write_vectored(&self.stream, &[IoSlice::new(header)]) {
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
                    let request = tiercel_proto::copy::to_vec(self.frames.frame());
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
    let mut tokens = Vec::new();
    let mut doorway: Doorway<std::net::IpAddr, Connecting> =
        Doorway::new(MAX_HANDSHAKES, MAX_HANDSHAKES_PER_SOURCE, super::Door::Tcp);
    // Each bound connection, the heartbeat frame it is sent, and what the last looks saw of it.
    let mut bindings: Vec<(Weak<StreamBinding>, [u8; FRAME_HEAD], Watch)> = Vec::new();
    let mut last_beat = Instant::now();
    // Bindings the endpoint has forgotten as idle, at the last look.
    let mut expired = 0;
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
                if beat && binding.binding.running() > 0 {
                    binding.conn.beat(header);
                }
                if binding.wants_helper(now, watch) {
                    parking.pool.submit(&binding, false);
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
                if let Some(bound) = bind(&shared, &parking, connecting, admission) {
                    bindings.push(bound);
                }
                false
            }
            Step::Hello(request) => {
                if let Some(bound) = hello(&shared, &parking, connecting, &request) {
                    bindings.push(bound);
                }
                false
            }
        };
        let open = |(stream, from): (TcpStream, SocketAddr)| {
            if tiercel_sys::tcp::prepare(&stream, idle).is_err() {
                // Closing the connection unread tells the client.
                shared.stats.rejected.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            let frames =
                Deframer::new(PREFIX_LEN + 2 * crate::rendezvous::MAX_MESSAGE, 2 * crate::rendezvous::MAX_MESSAGE);
            Some((from.ip(), Connecting { stream, frames }))
        };
        let more = doorway.take_arrivals(&shared, || listener.accept(), open, &mut progress);
        doorway.tend(&shared, &mut progress);
        parking.wake_ready(&mut tokens);
        // Parked connections whose bindings the endpoint forgot close as soon as the listener
        // looks after the sweep.
        let swept = shared.stats.expired.load(Ordering::Relaxed);
        if beat || swept != expired {
            expired = swept;
            parking.close_expired();
        }
        // Often while a binding is in use (it may need another thread soon), else once a heartbeat.
        let now = Instant::now();
        let active = bindings.iter().any(|(b, _, _)| b.upgrade().is_some_and(|b| b.active(now)));
        let period = if active { HELP_AFTER } else { HEARTBEAT };
        if !more {
            let parked = std::os::fd::AsFd::as_fd(&parking.set);
            doorway.wait(&shared, std::os::fd::AsFd::as_fd(&listener), Some(parked), period);
        }
    }
    // Stopping: the parked bindings' connections close with them, and those waiting for a thread.
    parking.bindings().clear();
    parking.pool.clear();
}

/// Makes the binding a connection's bind request was admitted to, and answers with the grant (or
/// busy, without room): the binding, with the heartbeat frame the listener sends it, for the
/// listener to watch.
fn bind(
    shared: &Arc<Shared>,
    parking: &Arc<Parking>,
    h: &mut Connecting,
    admission: tiercel_proto::bind::Admission,
) -> Option<(Weak<StreamBinding>, [u8; FRAME_HEAD], Watch)> {
    let machine = shared.bind_machine(super::Door::Tcp);
    if machine.key_required {
        // A request for a rendezvous, which TCP never tells: no plain binding instead.
        shared.count_refusal(tiercel_proto::bind::Refused::KeyRequired);
        h.answer(&admission.key_required(&machine));
        return None;
    }
    let peer = h.stream.peer_addr().ok().map(Caller::Address);
    make(shared, parking, h, admission, &machine, peer, None)
}

/// A secure handshake's first message on a new connection: read with the server's key
/// (`Shared::hello`), answered in the handshake, and the binding it admits made, its frames
/// sealed both ways with the handshake's keys.
fn hello(
    shared: &Arc<Shared>,
    parking: &Arc<Parking>,
    h: &mut Connecting,
    request: &[u8],
) -> Option<(Weak<StreamBinding>, [u8; FRAME_HEAD], Watch)> {
    let peer = h.stream.peer_addr().ok()?;
    let mut opened = Vec::new();
    match shared.hello(request, peer, super::Door::SealedTcp, &mut opened) {
        Hello::Dropped => None,
        Hello::Unreadable => {
            // As over UDP, an answer that proves nothing (as long as a frame's least packet).
            let outer = tiercel_proto::seal::Outer { kind: SealType::Welcome, index: 0, counter: 0 }.to_bytes();
            h.answer(&[&outer[..], &[0; HEADER_LEN - tiercel_proto::seal::OUTER_LEN]].concat());
            None
        }
        Hello::Answered(answer) => {
            h.answer(&answer);
            None
        }
        Hello::Admitted(responder, admission, machine) => {
            let caller = Caller::Key { address: peer, key: responder.client().0 };
            make(shared, parking, h, admission, &machine, Some(caller), Some(*responder))
        }
    }
}

/// Makes the binding admitted on connection `h` for `caller`, and answers with the grant (sealed
/// by `responder`, for a secure binding) or busy, without room.
fn make(
    shared: &Arc<Shared>,
    parking: &Arc<Parking>,
    h: &mut Connecting,
    admission: tiercel_proto::bind::Admission,
    machine: &tiercel_proto::bind::BindServer<'_>,
    caller: Option<Caller>,
    responder: Option<crate::secure::Responder>,
) -> Option<(Weak<StreamBinding>, [u8; FRAME_HEAD], Watch)> {
    let export = shared.exports[admission.export].clone();
    // No buffer and no thread yet: the binding starts parked, and its first call gives it both.
    // Its memory lies within its address's part of TCP's share.
    let features = admission.features();
    let binding = match caller {
        Some(caller) => shared.endpoint.connect_from(Carrier::Stream, caller, features, export, Instant::now()),
        None => shared.endpoint.connect(Carrier::Stream, export, Instant::now()),
    };
    // The answer, sealed in the handshake for a secure binding (whose keys it yields).
    let seal = |answer: Vec<u8>, responder: Option<crate::secure::Responder>| match responder {
        None => Some((answer, None)),
        Some(r) => r.welcome(&answer).map(|(sealed, keys)| (sealed, Some(keys))),
    };
    let Some(binding) = binding else {
        shared.stats.rejected.fetch_add(1, Ordering::Relaxed);
        if let Some((answer, _)) = seal(admission.busy(machine), responder) {
            h.answer(&answer);
        }
        return None;
    };
    let (id, slots) = (binding.id, binding.slots());
    let charge = Charge::new(binding.budget());
    let answered = seal(admission.grant(machine, id, 0, slots, 0), responder);
    let granted = answered.as_ref().is_some_and(|(answer, _)| h.answer(answer));
    let stream = h.stream.try_clone().ok().filter(|_| granted);
    let Some(stream) = stream else {
        shared.endpoint.release(&binding);
        return None;
    };
    let seal = answered.and_then(|(_, keys)| keys).map(|keys| Arc::new(keys.session(id)));
    if seal.is_some() {
        shared.stats.handshakes.fetch_add(1, Ordering::Relaxed);
    }
    let send_timeout = shared.config.timing.dead_after;
    // Plain connections wait in their receives; a secure one's are read a record at a time, into
    // a buffer of their own, and its threads wait in `poll`.
    let receive_wait =
        seal.is_none() && tiercel_sys::tcp::set_receive_wait(&stream, crate::waiting::RECEIVE_WAIT).is_some();
    let conn = Arc::new(Conn { stream, writing: Mutex::new(()), send_timeout, seal, receive_wait });
    let mut beat = [0u8; FRAME_HEAD];
    beat[..PREFIX_LEN].copy_from_slice(&stream::prefix(HEADER_LEN));
    let header = Header { binding: id, incarnation: shared.incarnation, ..Header::new(Kind::ProbeReply) };
    beat[PREFIX_LEN..].copy_from_slice(&header.to_bytes());
    let now = Instant::now();
    let binding = Arc::new(StreamBinding {
        shared: shared.clone(),
        conn,
        export: binding.export.clone(),
        id,
        binding,
        turn: std::sync::Condvar::new(),
        waiting: AtomicUsize::new(0),
        reader: Mutex::new(Some(Reader {
            frames: Deframer::new(0, stream::max_frame(shared.config.timing.max_message)),
            records: None,
            charge,
            retention: Retention::default(),
            last_frame: now,
            spin_until: now,
            drained: false,
            activity: tiercel_proto::endpoint::Activity::default(),
            lease: crate::waiting::leases::SpinLease::new(&shared.spin_leases),
        })),
        threads: AtomicUsize::new(0),
        idle: AtomicUsize::new(0),
        all_busy_since: AtomicU64::new(0),
        taken: AtomicU64::new(0),
        created: now,
        closed: AtomicBool::new(false),
        parking: parking.clone(),
        parked: AtomicBool::new(true),
    });
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
/// [`PARK_AFTER`]): they cost a descriptor and under a kilobyte each, no thread and no buffer.
/// The listener polls them beside its own sockets and gives one a thread when its client sends.
pub(crate) struct Parking {
    set: tiercel_sys::tcp::Parked,
    bindings: Mutex<std::collections::HashMap<u64, Arc<StreamBinding>>>,
    /// The threads that serve the connections not parked.
    pool: Arc<pool::Pool>,
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
            self.pool.submit(&binding, true);
        }
    }

    /// Ends the parked bindings the endpoint forgot as idle (as a bound connection's thread would).
    fn close_expired(&self) {
        self.bindings().retain(|_, b| {
            if !b.binding.is_expired() {
                return true;
            }
            self.set.remove(std::os::fd::AsFd::as_fd(&b.conn.stream));
            b.ended();
            false
        });
    }
}
/// Bytes of call arguments a thread copies out of the receive buffer (a larger call runs on the
/// thread that reads it, borrowed where it landed).
const SMALL_CALL: usize = BUFFER;
