//! The client side of the TCP transport: binding over a connection, and the calls of every thread
//! and task of the binding sharing it.
//!
//! A call is one frame (length, header, arguments) written with one `writev`, under a lock so that
//! frames never interleave; calls of several threads are in flight at once, each on its own client
//! slot. The results come back in the order the server finishes them and are matched to their
//! callers by slot and call number: the waiting caller that finds no one reading the connection
//! reads it (spinning, then blocking in `poll`) and hands every other caller's result to its slot,
//! waking it; when its own result is in, it gives the reading over to another waiting caller. With
//! one caller there is no handoff at all: it reads its own result. A result larger than the
//! connection's 64 KiB buffer that is all the buffer holds is not copied: the buffer it was read
//! into goes to its caller, and the connection is read on into the one the caller had before. A
//! caller that lends its buffer to the call ([`TcpEndpoint::run`]) reads its result's bytes
//! that go back into that buffer straight there ([`Link::land`]).
//!
//! The server sends a heartbeat frame every second while a call of the connection runs, so when
//! nothing arrives for `Timing::dead_after` (at least 2 s) while calls wait, those calls fail with
//! [`CallError::Unreachable`] (they may have run), as over UDP, and the connection stays for the
//! calls that follow (a stopped server that runs again answers them). A closed or reset connection
//! fails its calls at once with [`CallError::ConnectionLost`], and nothing is sent on it again.

use std::io::{IoSlice, Read};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
#[cfg(feature = "async")]
use std::task::Waker;
use std::time::{Duration, Instant};

use tiercel_proto::bind::{BindClient, BindEvent, Keyed};
use tiercel_proto::context::{self, Context};
use tiercel_proto::stream::{self, Deframer, Next, PREFIX_LEN};
use tiercel_proto::wire::{flags, Header, Kind, Packet, Status, HEADER_LEN};

use super::BindingInner;
use crate::config::ClientConfig;
use crate::framed;
use crate::interface::InterfaceInfo;
use crate::spin::{SpinBudget, SPINNERS};
use crate::steps::{mark, Point};
use crate::wire::{Segments, MAX_SEGMENTS};
use crate::{BindError, CallError};

/// Bytes of the connection's receive buffer (larger results grow it while they pass).
const BUFFER: usize = 64 * 1024;
/// Bytes of a call's private argument buffer to start with.
const SCRATCH: usize = 4096;
/// How long a blocked caller waits before looking again at its deadline and the connection's
/// silence.
const TICK: Duration = Duration::from_millis(100);
/// Prefix and header of every frame.
const FRAME_HEAD: usize = PREFIX_LEN + HEADER_LEN;
/// A waiting caller reads the connection itself when nobody has for this long.
const STALE_READER: Duration = Duration::from_millis(50);
/// After this long without a call, a call first looks whether the server closed the connection.
const IDLE_LOOK: Duration = Duration::from_secs(1);
/// The least silence that fails the calls waiting: a few of the server's heartbeats.
const MIN_SILENCE: Duration = Duration::from_secs(2);

/// What a TCP bind produced.
pub(crate) struct Granted {
    pub(crate) link: Link,
    pub(crate) id: u32,
    pub(crate) incarnation: u64,
    pub(crate) slots: u32,
    pub(crate) features: u16,
    /// The server's procedure numbers, where its copy of the interface differs.
    pub(crate) procedures: Option<Vec<u16>>,
}

/// A binding's connection, shared by its callers.
pub(crate) struct Link {
    stream: TcpStream,
    server: SocketAddr,
    /// Held while a frame is written.
    writing: Mutex<()>,
    demux: Mutex<Demux>,
    /// Silence after which the connection is given up while calls wait.
    silence: Duration,
    /// How long a write may wait for the server to make room.
    send_timeout: Duration,
    /// Readiness of the connection on the runtime of async calls (made by the first).
    #[cfg(feature = "async")]
    ready: std::sync::OnceLock<Option<tokio::net::TcpStream>>,
}

/// Who waits for a slot's result.
enum Wake {
    Thread(std::thread::Thread),
    #[cfg(feature = "async")]
    Task(Waker),
}

impl Wake {
    fn wake(self) {
        match self {
            Wake::Thread(t) => t.unpark(),
            #[cfg(feature = "async")]
            Wake::Task(w) => w.wake(),
        }
    }
}

/// One client slot's mailbox.
#[derive(Default)]
struct Mail {
    /// The call awaited, if any.
    awaiting: Option<u32>,
    /// How to wake its caller when it is not the one reading.
    wake: Option<Wake>,
    /// What arrived for it: kind and status; the payload is in `result`, from `result_at` on.
    arrived: Option<(Kind, Status)>,
    result: Vec<u8>,
    /// Where the payload starts in `result`: 0, or [`FRAME_HEAD`] when `result` is the buffer the
    /// frame was read into.
    result_at: usize,
}

/// The receiving side of the connection.
struct Demux {
    /// A caller is reading the connection.
    reading: bool,
    frames: Deframer,
    mail: Vec<Mail>,
    /// Calls sent (or being sent) and not answered.
    expecting: usize,
    /// When the server was last heard from (or, with no call waiting, the last call began).
    heard: Instant,
    /// Why the connection is over.
    broken: Option<String>,
    /// When the connection was last read.
    pumped: Instant,
}

impl Demux {
    /// Ends the connection for every call: each waiting caller is woken to find out.
    fn break_off(&mut self, why: String) {
        if self.broken.is_none() {
            self.broken = Some(why);
        }
        for m in &mut self.mail {
            if let Some(w) = m.wake.take() {
                w.wake();
            }
        }
    }

    /// Hands over the reading to another waiting caller, if one waits.
    fn hand_over(&mut self) {
        self.reading = false;
        if let Some(w) = self.mail.iter_mut().find(|m| m.awaiting.is_some() && m.arrived.is_none() && m.wake.is_some())
        {
            if let Some(w) = w.wake.take() {
                w.wake();
            }
        }
    }

    /// Delivers every whole frame buffered to its slot. Err: the server broke the protocol.
    fn deliver(&mut self, binding: u32, stale: &std::sync::atomic::AtomicU64) -> Result<(), String> {
        loop {
            match self.frames.next() {
                Err(e) => return Err(format!("the server sent a bad frame: {e}")),
                Ok(Next::Frame(_)) => {}
                Ok(Next::Partial(len)) => {
                    if !self.frames.fits(len) {
                        self.frames.grow_for(len);
                    }
                    return Ok(());
                }
                Ok(Next::Nothing) => return Ok(()),
            }
            let frame = self.frames.frame();
            let p = stream::check_frame(frame).map_err(|e| format!("the server sent a bad frame: {e}"))?;
            let (kind, slot, seq, status) = (p.kind(), p.slot() as usize, p.seq(), p.status());
            let ours = p.binding() == binding || kind == Kind::Reject;
            let large = p.payload().len() > BUFFER;
            let mail = self.mail.get_mut(slot).filter(|m| m.awaiting == Some(seq) && m.arrived.is_none());
            match (kind, mail) {
                // A heartbeat, or a probe's answer: the server lives.
                (Kind::ProbeReply, _) => {}
                (Kind::Result | Kind::Reject, Some(m)) if ours => {
                    // A large result is not copied: the buffer it was read into goes to its caller,
                    // and the connection is read on into the one the caller had (they take turns).
                    let spare = std::mem::take(&mut m.result);
                    let taken = if large { self.frames.take_frame(spare) } else { Err(spare) };
                    (m.result, m.result_at) = match taken {
                        Ok(frame) => (frame, FRAME_HEAD),
                        Err(mut result) => {
                            result.clear();
                            result.extend_from_slice(&self.frames.frame()[HEADER_LEN..]);
                            (result, 0)
                        }
                    };
                    m.arrived = Some((kind, status));
                    if let Some(w) = m.wake.take() {
                        w.wake();
                    }
                }
                (Kind::Result | Kind::Reject, _) => {
                    // The result of a call given up at its deadline.
                    stale.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                _ => return Err(format!("the server sent a {kind:?} frame")),
            }
            self.frames.consume();
        }
    }
}

/// Connects to `server` and binds over the connection, decided by the client's bind machine.
pub(crate) fn bind(
    server: SocketAddr,
    info: &'static InterfaceInfo,
    config: &ClientConfig,
) -> Result<Granted, BindError> {
    // A server with too many connections binding at once closes one before answering it: a new
    // connection, with a new request, is likely to be answered (its request lands whole as it
    // connects, where the ones closed dribble theirs).
    let mut attempts = 0;
    let (granted, stream) = loop {
        attempts += 1;
        let nonce = u64::from_le_bytes(crate::random::bytes()?[..8].try_into().unwrap_or_default());
        let machine = BindClient::new(&info.spec(), 0, nonce, false);
        let exchanged = exchange(server, config, machine, |event| match event {
            BindEvent::Refused(r) => Some(Err(super::udp_bind::refusal_error(info, r))),
            BindEvent::Granted(g) => Some(Ok(g)),
            _ => None,
        });
        match exchanged {
            Err(Unanswered) if attempts < BIND_ATTEMPTS => std::thread::sleep(Duration::from_millis(attempts)),
            Err(Unanswered) => return Err(BindError::Busy),
            Ok(bound) => break bound?,
        }
    };
    let dead_after = config.timing.dead_after;
    let link = Link {
        stream,
        server,
        writing: Mutex::new(()),
        demux: Mutex::new(Demux {
            reading: false,
            frames: Deframer::new(BUFFER, stream::max_frame(config.timing.max_message)),
            mail: Vec::new(),
            expecting: 0,
            heard: Instant::now(),
            broken: None,
            pumped: Instant::now(),
        }),
        silence: dead_after.max(MIN_SILENCE),
        send_timeout: dead_after,
        #[cfg(feature = "async")]
        ready: std::sync::OnceLock::new(),
    };
    Ok(Granted {
        link,
        id: granted.binding,
        incarnation: granted.incarnation,
        slots: granted.grant.slots.clamp(1, 1 << 16),
        features: granted.grant.features,
        procedures: granted.procedures,
    })
}

/// What the server exports, asked over TCP: one connection per interface (the server answers a
/// listing and closes).
pub(crate) fn list(server: SocketAddr, config: &ClientConfig) -> Result<Vec<crate::ExportInfo>, BindError> {
    super::udp_bind::list_each(server, |index, offset| {
        let nonce = u64::from_le_bytes(crate::random::bytes()?[..8].try_into().unwrap_or_default());
        let machine = BindClient::listing_from(index, offset, nonce, false);
        match exchange(server, config, machine, super::udp_bind::listed) {
            Ok(listed) => listed.map(|(listed, _)| listed),
            Err(Unanswered) => Err(BindError::Busy),
        }
    })
}

/// Connects to `server` and runs a bind exchange (a bind or a listing) over the connection: the
/// request, a challenge answered if the server asks for the shared secret, and the answer, which
/// `on` turns into the outcome (`None`: not an answer to this request). Everything within
/// `Timing::dead_after`.
fn exchange<T>(
    server: SocketAddr,
    config: &ClientConfig,
    machine: BindClient,
    on: impl FnMut(BindEvent<'_>) -> Option<Result<T, BindError>>,
) -> Result<Result<(T, TcpStream), BindError>, Unanswered> {
    let mut answered = false;
    match exchange_answered(server, config, machine, on, &mut answered) {
        Err(BindError::Busy) if !answered => Err(Unanswered),
        outcome => Ok(outcome),
    }
}

/// The server closed the connection before it answered anything.
struct Unanswered;

/// Binds at most this many times over as many connections when the server closes each before
/// answering.
const BIND_ATTEMPTS: u64 = 3;

/// [`exchange`], setting `answered` once an answer has come (a closed connection is
/// `BindError::Busy` either way).
fn exchange_answered<T>(
    server: SocketAddr,
    config: &ClientConfig,
    mut machine: BindClient,
    mut on: impl FnMut(BindEvent<'_>) -> Option<Result<T, BindError>>,
    answered: &mut bool,
) -> Result<(T, TcpStream), BindError> {
    // Measure the tick counter's rate (2 ms) now, not on the first call.
    let _ = tiercel_sys::clock::ticks_per_second();
    let dead_after = config.timing.dead_after;
    let stream = tiercel_sys::tcp::connect(server, dead_after).map_err(|e| match e.kind() {
        std::io::ErrorKind::ConnectionRefused => BindError::NoServer(server),
        std::io::ErrorKind::TimedOut => BindError::Unreachable(server),
        _ => BindError::Io(e),
    })?;
    tiercel_sys::tcp::prepare(&stream, dead_after)?;
    let bad = |why: &str| BindError::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, why.to_string()));
    let until = Instant::now() + dead_after;
    let secret = config.secret.as_ref().map(|s| s as &dyn Keyed);
    let mut frames = Deframer::new(PREFIX_LEN + 4 * crate::rendezvous::MAX_MESSAGE, 4 * crate::rendezvous::MAX_MESSAGE);
    let send = |packet: &[u8]| {
        let prefix = stream::prefix(packet.len());
        framed::send(&stream, &mut [IoSlice::new(&prefix), IoSlice::new(packet)], dead_after)
    };
    // A server with no room closes the connection at once: writing to it may fail already.
    let closed = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::UnexpectedEof => {
            BindError::Busy
        }
        _ => BindError::Io(e),
    };
    send(&machine.packet()).map_err(closed)?;
    // At most three answers: a challenge, a refusal by an interface's other copy (then the bind
    // by procedure names), then the answer.
    for _ in 0..tiercel_proto::bind::MAX_REQUESTS {
        loop {
            match frames.next() {
                Ok(Next::Frame(_)) => break,
                Ok(_) => {}
                Err(_) => return Err(bad("malformed bind answer")),
            }
            if !framed::receive(&stream, &mut frames).map_err(closed)? {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() || !tiercel_sys::udp::wait_readable_fd(&stream, Some(left))? {
                    return Err(BindError::Unreachable(server));
                }
            }
        }
        *answered = true;
        let p = Packet::new_checked(frames.frame()).map_err(|_| bad("malformed bind answer"))?;
        match machine.handle(&p, secret) {
            BindEvent::SendAgain => {
                let again = machine.packet();
                frames.consume();
                send(&again).map_err(closed)?;
            }
            event => {
                return match on(event) {
                    Some(outcome) => outcome.map(|t| (t, stream)),
                    None => Err(bad("bind answer for another request")),
                }
            }
        }
    }
    Err(bad("a second challenge"))
}

impl Link {
    fn demux(&self) -> MutexGuard<'_, Demux> {
        self.demux.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lost(&self, why: &str, sent: bool) -> CallError {
        CallError::ConnectionLost { server: self.server, sent, reason: why.to_owned() }
    }

    /// Reads what the connection has and delivers it; the caller holds the reading. The bytes of
    /// `lend`'s result that go into its buffer are read straight there ([`Link::land`]). Err: the
    /// connection is over (the demux broken off).
    fn pump(&self, demux: &mut Demux, binding: &BindingInner, lend: Option<&mut Lend<'_>>) -> Result<bool, ()> {
        // A caller lending its buffer reads no more than the connection's starting buffer the
        // usual way before its result's header is seen, so that little of its result is copied.
        let (most, landed) = match lend {
            Some(lend) => (BUFFER, self.land(demux, binding.id, lend)),
            None => (usize::MAX, None),
        };
        let got = match landed.unwrap_or_else(|| framed::receive_up_to(&self.stream, &mut demux.frames, most)) {
            Ok(got) => got,
            Err(e) => {
                let why = match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => "the server closed the connection".to_owned(),
                    _ => format!("the connection failed: {e}"),
                };
                demux.break_off(why);
                return Err(());
            }
        };
        if got {
            demux.heard = Instant::now();
            if let Err(why) = demux.deliver(binding.id, &binding.stats.stale) {
                binding.stats.malformed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let _ = self.stream.shutdown(std::net::Shutdown::Both);
                demux.break_off(why);
                return Err(());
            }
        }
        Ok(got)
    }

    /// Reads the next bytes of `lend`'s result straight into its buffer, when its frame is the one
    /// being received and those bytes go there: the frame is the call's `Ok` result, larger than
    /// the receive buffer (which has grown for it), and its results start with the buffer's bytes
    /// (its payload is at least as long). What was read of them into the receive buffer before is
    /// copied over first. The receive buffer counts the bytes without holding them, so that the
    /// frame is delivered whole as any (its copy of those bytes is stale, and never read). `None`:
    /// read the usual way.
    fn land(&self, demux: &mut Demux, binding: u32, lend: &mut Lend<'_>) -> Option<std::io::Result<bool>> {
        let Ok(Next::Partial(len)) = demux.frames.next() else { return None };
        let p = Packet::new_unchecked(demux.frames.header()?);
        let payload = len - HEADER_LEN;
        let ours = p.kind() == Kind::Result
            && p.status() == Status::Ok
            && p.binding() == binding
            && (p.slot(), p.seq()) == (lend.slot, lend.seq)
            && p.payload_len() as usize == payload;
        let at = demux.frames.buffered() - FRAME_HEAD;
        if !ours || payload < lend.tail.len() || len <= BUFFER || !demux.frames.fits(len) || at >= lend.tail.len() {
            return None;
        }
        // Bytes read the usual way (by this caller before its frame's header came, or by another
        // caller reading meanwhile) go to the buffer first.
        if lend.lent.filled < at {
            let front = &demux.frames.front()[FRAME_HEAD..];
            lend.tail[lend.lent.filled..at].copy_from_slice(&front[lend.lent.filled..at]);
            lend.lent.filled = at;
        }
        let room = demux.frames.spare().len().min(lend.tail.len() - at);
        if room == 0 {
            // (Not with a frame that fits and is not whole; a read of nothing would look like the
            // end of the connection.)
            return None;
        }
        match (&self.stream).read(&mut lend.tail[at..at + room]) {
            Ok(0) => Some(Err(std::io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => {
                demux.frames.filled_elsewhere(n);
                lend.lent.filled += n;
                lend.lent.read += n;
                Some(Ok(true))
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted) => {
                Some(Ok(false))
            }
            Err(e) => Some(Err(e)),
        }
    }

    /// Whether the server has been silent too long while calls wait: each waiting call then fails
    /// as over UDP (`Unreachable`), and the connection stays. A server stopped for a while (a
    /// pause, a debugger, a host under load) answers the binding's next calls once it runs again,
    /// and the late results of the calls given up are dropped as stale; a server that went away
    /// closes or resets the connection (its kernel, or keepalive's probes, tell), which ends it.
    fn silent(&self, demux: &Demux, now: Instant) -> bool {
        demux.expecting > 0 && now.saturating_duration_since(demux.heard) >= self.silence
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// A calling thread's (or an async call's) client slot on a TCP binding.
pub(crate) struct TcpEndpoint {
    uid: u64,
    binding: Weak<BindingInner>,
    slot: u32,
    seq: u32,
    /// Prefix and header of the call frame, rewritten per call.
    head: [u8; FRAME_HEAD],
    scratch: Vec<u8>,
    /// The last result's payload, from `result_at` on (swapped with the slot's mailbox).
    result: Vec<u8>,
    result_at: usize,
    spin: SpinBudget,
    /// `flags::CONTEXT` when the call starts with a context block.
    context_flag: u8,
    /// This caller reads the connection for every caller now.
    reading: bool,
    /// What arrived for the last call: kind and status.
    arrived: Option<(Kind, Status)>,
    /// Of the buffer lent to the call being made ([`TcpEndpoint::run`]), the first bytes
    /// that hold the result's already, and of those the ones read straight there.
    lent: Lent,
}

/// How far a result has come into the buffer lent to its call.
#[derive(Debug, Default, Clone, Copy)]
struct Lent {
    /// The buffer's first bytes that hold the result's: copied there, or read there.
    filled: usize,
    /// Of those, the bytes read from the connection straight into the buffer.
    read: usize,
}

/// The buffer a caller lent to its call, while its result is read: the result's first bytes go
/// there.
struct Lend<'t> {
    slot: u32,
    seq: u32,
    tail: &'t mut [u8],
    lent: Lent,
}

impl TcpEndpoint {
    /// The binding's unique id (what the thread's cache knows it by).
    pub(super) fn uid(&self) -> u64 {
        self.uid
    }
    /// Whether the binding still exists.
    pub(super) fn is_live(&self) -> bool {
        self.binding.strong_count() > 0
    }
}

/// What a wait found.
enum Waited {
    /// The result is in the slot's mailbox.
    Arrived,
    /// Not yet; the caller reads the connection (`true`) or waits to be woken.
    Not(bool),
}

impl TcpEndpoint {
    pub(super) fn new(inner: &Arc<BindingInner>, link: &Link) -> Result<TcpEndpoint, CallError> {
        let (slot, seq) = inner.take_slot()?;
        {
            let mut demux = link.demux();
            if demux.mail.len() <= slot as usize {
                demux.mail.resize_with(slot as usize + 1, Mail::default);
            }
        }
        let header = Header { binding: inner.id, slot, incarnation: inner.incarnation, ..Header::new(Kind::Call) };
        let mut head = [0u8; FRAME_HEAD];
        head[PREFIX_LEN..].copy_from_slice(&header.to_bytes());
        Ok(TcpEndpoint {
            uid: inner.uid,
            binding: Arc::downgrade(inner),
            slot,
            seq,
            head,
            scratch: Vec::with_capacity(SCRATCH),
            result: Vec::new(),
            result_at: 0,
            spin: SpinBudget::new(inner.config.spin),
            context_flag: 0,
            reading: false,
            arrived: None,
            lent: Lent::default(),
        })
    }

    /// Prepares the endpoint for a call whose message starts with `context` (when not empty).
    pub(super) fn begin(&mut self, context: &Context) {
        self.scratch.clear();
        self.context_flag = 0;
        if self.scratch.capacity() > crate::retention::LARGE {
            self.scratch = Vec::with_capacity(SCRATCH);
        }
        if !context.is_empty() {
            let mut block = [0u8; context::MAX_LEN];
            let n = context.encode(&mut block);
            self.scratch.extend_from_slice(&block[..n]);
            self.context_flag = flags::CONTEXT;
        }
    }

    pub(super) fn scratch_mut(&mut self) -> &mut Vec<u8> {
        &mut self.scratch
    }

    /// The marshaled results of the last call.
    pub(super) fn result(&self) -> &[u8] {
        self.result.get(self.result_at..).unwrap_or_default()
    }

    /// Makes the call: send, wait (spinning, then blocking), and leave the results where
    /// [`TcpEndpoint::result`] finds them. With `tail`, a buffer lent to the call (an `InOut` that
    /// is the procedure's one buffer and its last argument), the call is sent from it, and its
    /// result's first bytes, which go back into it, are read straight there: true when they were
    /// (false: the stub copies them from the result as usual).
    pub(super) fn run(
        &mut self,
        inner: &BindingInner,
        link: &Link,
        deadline: Option<Duration>,
        procedure: u16,
        segs: &Segments<'_>,
        mut tail: Option<&mut [u8]>,
    ) -> Result<bool, CallError> {
        let start = Instant::now();
        self.send_lent(inner, link, procedure, segs, tail.as_deref())?;
        self.wait(inner, link, deadline.map(|d| start + d), start, tail.as_deref_mut())?;
        self.finish(procedure)?;
        Ok(tail.is_some_and(|tail| self.settle_lent(inner, tail)))
    }

    /// [`TcpEndpoint::send`] of the message `segs` followed by `tail`, if a buffer is lent.
    fn send_lent(
        &mut self,
        inner: &BindingInner,
        link: &Link,
        procedure: u16,
        segs: &Segments<'_>,
        tail: Option<&[u8]>,
    ) -> Result<(), CallError> {
        match tail {
            Some(tail) => self.send(inner, link, procedure, &super::udp::with_lent(segs, self.scratch.len(), tail)?),
            None => self.send(inner, link, procedure, segs),
        }
    }

    /// Once a call with a lent buffer has its result: copies into `tail` the buffer's bytes that
    /// came the usual way and returns whether any were read straight into it (false: the result
    /// came the usual way, all of it, and `tail` is as it was).
    fn settle_lent(&mut self, inner: &BindingInner, tail: &mut [u8]) -> bool {
        let lent = std::mem::take(&mut self.lent);
        let result = self.result.get(self.result_at..).unwrap_or_default();
        if lent.filled == 0 || result.len() < tail.len() {
            return false;
        }
        let len = tail.len();
        tail[lent.filled..].copy_from_slice(&result[lent.filled..len]);
        inner.stats.in_place.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        inner.stats.lent_bytes.fetch_add(lent.read as u64, std::sync::atomic::Ordering::Relaxed);
        true
    }

    /// Waits for the call's result (spinning, then blocking), reading it into `tail` as far as it
    /// goes there when a buffer is lent.
    fn wait(
        &mut self,
        inner: &BindingInner,
        link: &Link,
        deadline: Option<Instant>,
        start: Instant,
        mut tail: Option<&mut [u8]>,
    ) -> Result<(), CallError> {
        let spin_until = start + self.spin.budget();
        let mut spinner = SPINNERS.start();
        loop {
            let now = Instant::now();
            // Spinning, nobody need wake this thread; about to block, it says how.
            let wake = (now >= spin_until).then(|| Wake::Thread(std::thread::current()));
            let reading = match self.look(inner, link, deadline, now, wake, tail.as_deref_mut())? {
                Waited::Arrived => break,
                Waited::Not(reading) => reading,
            };
            if now < spin_until {
                spinner.pause();
                continue;
            }
            spinner.stop();
            let tick = deadline.map_or(TICK, |d| d.saturating_duration_since(now).min(TICK));
            crate::steps::slept(crate::steps::Side::Client);
            if reading {
                let readable = tiercel_sys::udp::wait_readable_fd(&link.stream, Some(tick));
                if let Err(e) = readable {
                    link.demux().break_off(format!("the connection failed: {e}"));
                }
            } else {
                std::thread::park_timeout(tick);
            }
        }
        mark(Point::Validated);
        self.spin.observe(start.elapsed());
        Ok(())
    }

    /// Numbers the call and sends its frame with one `writev`.
    pub(super) fn send(
        &mut self,
        inner: &BindingInner,
        link: &Link,
        procedure: u16,
        segs: &Segments<'_>,
    ) -> Result<(), CallError> {
        let len = segs.message_len(&self.scratch);
        if len > inner.config.timing.max_message {
            return Err(CallError::TooLarge(format!(
                "call of {len} bytes exceeds the limit of {} bytes",
                inner.config.timing.max_message
            )));
        }
        self.seq = self.seq.wrapping_add(1);
        self.lent = Lent::default();
        {
            let mut demux = link.demux();
            if demux.expecting == 0 && !demux.reading {
                // Idle a while: the server may have closed the connection meanwhile (it expires
                // idle bindings, or went away). One look tells, before anything is sent.
                let now = Instant::now();
                if now.saturating_duration_since(demux.heard) >= IDLE_LOOK {
                    let _ = link.pump(&mut demux, inner, None);
                }
                demux.heard = now;
            }
            if let Some(why) = &demux.broken {
                return Err(link.lost(why, false));
            }
            demux.expecting += 1;
            let mail = &mut demux.mail[self.slot as usize];
            mail.awaiting = Some(self.seq);
            mail.arrived = None;
            mail.wake = None;
        }
        self.head[..PREFIX_LEN].copy_from_slice(&stream::prefix(HEADER_LEN + len));
        let mut p = Packet::new_unchecked(&mut self.head[PREFIX_LEN..]);
        p.set_seq(self.seq);
        p.set_procedure(procedure);
        p.set_lengths(len as u32, len as u32);
        p.set_fragment(0, 1);
        p.set_flags(self.context_flag);
        mark(Point::HeaderReady);
        let mut io = [IoSlice::new(&[]); MAX_SEGMENTS + 2];
        io[0] = IoSlice::new(&self.head);
        let n = segs.io_slices(&self.scratch, &mut io[1..]);
        let sent = {
            let _writing = link.writing.lock().unwrap_or_else(|p| p.into_inner());
            framed::send(&link.stream, &mut io[..n + 1], link.send_timeout)
        };
        mark(Point::Sent);
        let mut demux = link.demux();
        match sent {
            Ok(()) => {
                // Sending a large call may take a while: the server was reading it meanwhile.
                demux.heard = demux.heard.max(Instant::now());
                Ok(())
            }
            Err(e) => {
                let _ = link.stream.shutdown(std::net::Shutdown::Both);
                demux.break_off(format!("sending the call failed: {e}"));
                self.give_up(&mut demux);
                Err(link.lost(&format!("sending the call failed: {e}"), true))
            }
        }
    }

    /// One look for the result, reading the connection if no one else is: `Arrived`, or whether
    /// this caller now reads (then it waits on the socket) or waits to be woken with `wake`.
    fn look(
        &mut self,
        inner: &BindingInner,
        link: &Link,
        deadline: Option<Instant>,
        now: Instant,
        wake: Option<Wake>,
        tail: Option<&mut [u8]>,
    ) -> Result<Waited, CallError> {
        let mut demux = link.demux();
        if !demux.reading && demux.broken.is_none() {
            demux.reading = true;
            self.reading = true;
        }
        // The reader reads; so does anyone when the reader has not for a while (an async task
        // whose runtime is busy elsewhere must not hold up the binding's threads). The lock makes
        // any number of readers safe: the role only spares the socket needless reads.
        if self.reading || now.saturating_duration_since(demux.pumped) >= STALE_READER {
            demux.pumped = now;
            let mut lend = tail.map(|tail| Lend { slot: self.slot, seq: self.seq, tail, lent: self.lent });
            while let Ok(true) = link.pump(&mut demux, inner, lend.as_mut()) {}
            if let Some(lend) = lend {
                self.lent = lend.lent;
            }
        }
        let i = self.slot as usize;
        if demux.mail[i].arrived.is_some() {
            let mail = &mut demux.mail[i];
            std::mem::swap(&mut mail.result, &mut self.result);
            self.result_at = mail.result_at;
            self.arrived = mail.arrived.take();
            self.give_up(&mut demux);
            return Ok(Waited::Arrived);
        }
        if link.silent(&demux, now) {
            self.give_up(&mut demux);
            return Err(CallError::Unreachable { server: link.server, acknowledged: false });
        }
        if let Some(why) = demux.broken.clone() {
            self.give_up(&mut demux);
            return Err(link.lost(&why, true));
        }
        if deadline.is_some_and(|d| now >= d) {
            self.give_up(&mut demux);
            drop(demux);
            self.cancel(link, inner.features & tiercel_proto::bind::wire::features::CANCEL != 0);
            return Err(CallError::DeadlineExceeded { may_have_run: true });
        }
        if !self.reading {
            demux.mail[i].wake = wake;
        }
        Ok(Waited::Not(self.reading))
    }

    /// The call waits no more (its result came, or it failed): its mailbox is cleared, and the
    /// reading, if this caller had it, goes to another waiting caller.
    fn give_up(&mut self, demux: &mut Demux) {
        let mail = &mut demux.mail[self.slot as usize];
        if mail.awaiting.take().is_some() {
            demux.expecting -= 1;
        }
        mail.wake = None;
        mail.arrived = None;
        if self.reading {
            self.reading = false;
            demux.hand_over();
        }
    }

    /// Tells the server, best effort, that the call being made is given up: an async procedure
    /// running it stops (a plain one runs to its end), and its result, when it comes, is dropped.
    pub(super) fn cancel(&mut self, link: &Link, tell: bool) {
        self.give_up(&mut link.demux());
        if !tell {
            return;
        }
        let mut head = self.head;
        head[..PREFIX_LEN].copy_from_slice(&stream::prefix(HEADER_LEN));
        let mut p = Packet::new_unchecked(&mut head[PREFIX_LEN..]);
        p.set_kind(Kind::Cancel);
        p.set_lengths(0, 0);
        let _writing = link.writing.lock().unwrap_or_else(|p| p.into_inner());
        if framed::send(&link.stream, &mut [IoSlice::new(&head)], link.send_timeout).is_err() {
            let _ = link.stream.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Turns what arrived into the result location or an error.
    pub(super) fn finish(&mut self, procedure: u16) -> Result<(), CallError> {
        match self.arrived.take() {
            Some((Kind::Result, Status::Ok)) => Ok(()),
            Some((_, Status::Busy)) => {
                self.result.clear();
                self.result_at = 0;
                Err(CallError::Overloaded)
            }
            Some((_, status)) => {
                let message = String::from_utf8_lossy(self.result()).into_owned();
                self.result.clear();
                self.result_at = 0;
                Err(super::udp::status_error(status, procedure, message))
            }
            None => Err(CallError::Internal(crate::error::Invariant::NoOutcome)),
        }
    }
}

#[cfg(feature = "async")]
impl Link {
    /// The connection registered with the runtime's reactor (by the binding's first async call).
    /// (A duplicate of the descriptor: same socket, so readiness of one is readiness of the other;
    /// it is never read through.)
    fn ready(&self) -> Result<&tokio::net::TcpStream, CallError> {
        let ready = self.ready.get_or_init(|| {
            let stream = self.stream.try_clone().ok()?;
            tokio::net::TcpStream::from_std(stream).ok()
        });
        ready.as_ref().ok_or(CallError::Internal(crate::error::Invariant::NotRegistered))
    }
}

#[cfg(feature = "async")]
impl TcpEndpoint {
    /// [`TcpEndpoint::run`] for an async call: the caller that reads the connection waits for it
    /// on tokio's reactor, the others are woken by it. Spins first when `alone` (the only async
    /// call of the binding in flight), as a synchronous call does. The frame is written on the
    /// task's thread: it waits there only if the socket's buffer is full. `tail`: a buffer lent to
    /// the call, as to [`TcpEndpoint::run`]; true when its result was read into it.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn run_async(
        &mut self,
        inner: &BindingInner,
        link: &Link,
        deadline: Option<Duration>,
        procedure: u16,
        segs: &Segments<'_>,
        mut tail: Option<&mut [u8]>,
        alone: bool,
    ) -> Result<bool, CallError> {
        let ready = link.ready()?;
        let start = Instant::now();
        let deadline = deadline.map(|d| start + d);
        self.send_lent(inner, link, procedure, segs, tail.as_deref())?;
        let spin_until = if alone { start + self.spin.budget() } else { start };
        loop {
            let now = Instant::now();
            if now >= spin_until {
                break;
            }
            if let Waited::Arrived = self.look(inner, link, deadline, now, None, tail.as_deref_mut())? {
                self.spin.observe(start.elapsed());
                self.finish(procedure)?;
                return Ok(tail.is_some_and(|tail| self.settle_lent(inner, tail)));
            }
            core::hint::spin_loop();
        }
        loop {
            let now = Instant::now();
            let tick = deadline.map_or(TICK, |d| d.saturating_duration_since(now).min(TICK));
            let waited = std::future::poll_fn(|cx| loop {
                // Readiness cleared, then a look: bytes arriving after the clear set it again, so
                // the wait below cannot miss them.
                let _ =
                    ready.try_io(tokio::io::Interest::READABLE, || Err::<(), _>(std::io::ErrorKind::WouldBlock.into()));
                let wake = Some(Wake::Task(cx.waker().clone()));
                match self.look(inner, link, deadline, Instant::now(), wake, tail.as_deref_mut()) {
                    Err(e) => return std::task::Poll::Ready(Err(e)),
                    Ok(Waited::Arrived) => return std::task::Poll::Ready(Ok(())),
                    Ok(Waited::Not(false)) => return std::task::Poll::Pending,
                    Ok(Waited::Not(true)) => match ready.poll_read_ready(cx) {
                        std::task::Poll::Ready(Ok(())) => continue,
                        std::task::Poll::Ready(Err(e)) => return std::task::Poll::Ready(Err(e.into())),
                        std::task::Poll::Pending => return std::task::Poll::Pending,
                    },
                }
            });
            match tokio::time::timeout(tick, waited).await {
                Ok(Ok(())) => break,
                Ok(Err(e)) => return Err(e),
                // A tick: the next look checks the deadline and the connection's silence.
                Err(_) => {}
            }
        }
        self.spin.observe(start.elapsed());
        self.finish(procedure)?;
        Ok(tail.is_some_and(|tail| self.settle_lent(inner, tail)))
    }
}

impl Drop for TcpEndpoint {
    fn drop(&mut self) {
        if let Some(inner) = self.binding.upgrade() {
            if let Some(link) = &inner.tcp {
                self.give_up(&mut link.demux());
            }
            inner.give_slot(self.slot, self.seq);
        }
    }
}
