//! The client side of the shared-memory transport: binding through the rendezvous socket, and the
//! calling thread's slot.
//!
//! A call marshals its arguments into the thread's private scratch buffer (small values) and borrows
//! large byte slices from the caller; both are copied once into the slot, the call is published with
//! a release store, and the thread spins (adaptively, as over UDP) and then sleeps on the slot's futex,
//! looking every 50 ms whether the server's process is still there. The result is copied once out of
//! the slot into private memory before anything reads it: the server's process is not trusted.

use std::net::SocketAddr;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tiercel_proto::bind::{BindClient, BindEvent, Keyed, Rendezvous};
use tiercel_proto::context::Context;
use tiercel_proto::shm::{self as proto, header, slot, Layout, Liveness};
use tiercel_proto::wire::{Packet, Status};
use tiercel_sys::clock;
use tiercel_sys::shm::{futex_wait, futex_wake, Region};

use super::BindingInner;
use crate::config::ClientConfig;
use crate::error::Violation;
use crate::interface::InterfaceInfo;
use crate::rendezvous;
use crate::retention::{self, Retention};
use crate::steps::{self, mark, Point};
use crate::waiting::spin::{SpinBudget, SPINNERS};
use crate::wire::Segments;
use crate::{BindError, CallError};

/// Bytes the private argument and result buffers start with: a page, enough for every call but
/// those with large buffers, which grow them.
const SCRATCH: usize = 4096;
/// How long a blocked caller sleeps before looking whether the server's process is still there.
const LIVENESS: Duration = Duration::from_millis(50);
/// Looks at the slot for the result before the spin reads the clock: a few microseconds.
const FIRST_LOOKS: u32 = 64;
/// A quick call's round trip (its result in within the first looks) goes into the spin budget once
/// in this many calls.
const SAMPLE_EVERY: u32 = 8;

/// A binding's shared region and the connection that keeps it alive.
pub(crate) struct Link {
    region: Region,
    layout: Layout,
    stream: UnixStream,
    /// This process receives the system-wide barriers a server issues before it sleeps: with a
    /// server that issues them, calls are published without a fence.
    barriers: bool,
}

/// What a shared-memory bind produced.
pub(crate) struct Granted {
    pub(crate) link: Link,
    pub(crate) id: u32,
    pub(crate) incarnation: u64,
    pub(crate) slots: u32,
    /// The protocol features granted (`tiercel_proto::bind::wire::features`).
    pub(crate) features: u16,
    /// The server's procedure numbers, where its copy of the interface differs.
    pub(crate) procedures: Option<Vec<u16>>,
}

/// Connects to the rendezvous the server at `server` told over UDP, and checks that the process
/// found there is the one the server said it is (`SO_PEERCRED`): another process holding the name
/// is never used.
pub(crate) fn connect(server: SocketAddr, place: &Rendezvous) -> Result<UnixStream, BindError> {
    let unavailable = |reason: String| BindError::SharedMemoryUnavailable { server, reason };
    let name = rendezvous::socket_name(&place.name);
    let stream = UnixAddr::from_abstract_name(name.as_bytes())
        .and_then(|addr| UnixStream::connect_addr(&addr))
        .map_err(|e| unavailable(format!("cannot connect to its rendezvous @{name}: {e}")))?;
    let (pid, uid) = tiercel_sys::shm::peer_credentials(&stream)
        .map_err(|e| unavailable(format!("cannot read the credentials of @{name}: {e}")))?;
    if (pid, uid) != (place.pid, place.uid) {
        return Err(unavailable(format!(
            "its rendezvous @{name} is held by process {pid} of user {uid}, not by the server that answered \
             (process {} of user {})",
            place.pid, place.uid
        )));
    }
    Ok(stream)
}

/// The bind exchange over a connected rendezvous socket, decided by the client's bind machine.
pub(crate) fn bind(
    stream: UnixStream,
    info: &'static InterfaceInfo,
    config: &ClientConfig,
) -> Result<Granted, BindError> {
    // Measure the tick counter's rate (2 ms) now, not on the first call.
    let _ = clock::ticks_per_second();
    let bad = |why: &'static str| BindError::Protocol(Violation::BindAnswer(why));
    stream.set_read_timeout(Some(config.timing.dead_after))?;
    let nonce = u64::from_le_bytes(crate::random::bytes()?[..8].try_into().unwrap_or_default());
    let mut machine = BindClient::new(&info.spec(), 0, nonce, false);
    let secret = config.secret.as_ref().map(|s| s as &dyn Keyed);
    // A server with no room closes the connection at once: writing to it may fail already.
    rendezvous::send(&stream, &machine.packet(), None).map_err(|e| match e.kind() {
        std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset => BindError::Busy,
        _ => BindError::Io(e),
    })?;
    // At most three answers: a challenge, a refusal by an interface's other copy (then the bind
    // by procedure names), then the grant or refusal.
    for _ in 0..tiercel_proto::bind::MAX_REQUESTS {
        let (msg, fd) = match rendezvous::recv(&stream) {
            Ok(m) => m,
            // The server closes a connection unanswered only when it has no room for another binding
            // or is shutting down (closed with the request unread, the close comes as a reset).
            Err(e) if matches!(e.kind(), std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset) => {
                return Err(BindError::Busy)
            }
            // A length no server sends: not a server of tiercel's rendezvous.
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                return Err(bad("bind answer longer than any bind message"))
            }
            Err(e) => return Err(e.into()),
        };
        let p = Packet::new_checked(&msg[..]).map_err(|_| bad("malformed bind answer"))?;
        let granted = match machine.handle(&p, secret) {
            BindEvent::Ignored | BindEvent::Rendezvous { .. } | BindEvent::Listed(_) | BindEvent::ServerKey(_) => {
                return Err(bad("bind answer for another request"))
            }
            BindEvent::SendAgain => {
                rendezvous::send(&stream, &machine.packet(), None)?;
                continue;
            }
            BindEvent::Refused(r) => return Err(super::udp_bind::refusal_error(info, r)),
            BindEvent::Granted(g) => g,
        };
        let grant = granted.grant;
        let layout = Layout::granted(grant.slots, grant.region).ok_or_else(|| bad("impossible region geometry"))?;
        let len = layout.region_len().ok_or_else(|| bad("impossible region size"))?;
        let fd = fd.ok_or_else(|| bad("grant without a region"))?;
        let region = Region::from_fd(fd, len)?;
        let matches = |(at, v): (usize, u32)| region.u32_at(at).map(|w| w.load(Ordering::Relaxed)) == Some(v);
        if !layout.header_words().into_iter().all(matches) {
            return Err(bad("region header does not match the grant"));
        }
        stream.set_read_timeout(None)?;
        return Ok(Granted {
            link: Link { region, layout, stream, barriers: tiercel_sys::shm::receive_barriers() },
            id: granted.binding,
            incarnation: granted.incarnation,
            slots: grant.slots,
            features: grant.features,
            procedures: granted.procedures,
        });
    }
    Err(bad("a second challenge"))
}

/// A calling thread's slot in a shared-memory binding.
pub(crate) struct ShmEndpoint {
    uid: u64,
    binding: Weak<BindingInner>,
    slot: u32,
    scratch: Vec<u8>,
    /// The private copy of the last result: its first `result_len` bytes. (The buffer keeps the
    /// length of the longest result since it was last given back, so that its bytes are zeroed
    /// once, not before every copy.)
    result: Vec<u8>,
    result_len: usize,
    spin: SpinBudget,
    /// The slot holds a call given up (this endpoint's, when no other slot was free to trade for,
    /// or one whose slot this endpoint took): the server's answer to it comes before the next call.
    abandoned: bool,
    /// The call being made starts with a context block.
    context: bool,
    /// When large calls last passed and the slot's pages were last given back.
    retention: Retention,
    /// Calls made, for sampling quick calls' round trips.
    calls: u32,
}

fn word(region: &Region, at: usize) -> &AtomicU32 {
    region.u32_at(at).unwrap_or_else(|| unreachable!("layout offset {at} inside the region"))
}

/// The control words of the slot at `at` (see [`slot`]: word `i` is at offset `4 * i`), found with
/// one bounds check rather than one per word.
fn slot_words(region: &Region, at: usize) -> &[AtomicU32; slot::WORDS] {
    region.words(at).unwrap_or_else(|| unreachable!("slot at {at} inside the region"))
}

/// The region header's words (see [`header`]).
fn header_words(region: &Region) -> &[AtomicU32; header::WORDS] {
    region.words(0).unwrap_or_else(|| unreachable!("the header inside the region"))
}

impl ShmEndpoint {
    pub(super) fn new(inner: &Arc<BindingInner>, link: &Link) -> Result<ShmEndpoint, CallError> {
        let free = inner.take_slot()?;
        let slot = free.slot;
        // The server scans the slots below the high-water mark.
        word(&link.region, header::SLOTS_USED).fetch_max(slot + 1, Ordering::SeqCst);
        Ok(ShmEndpoint {
            uid: inner.uid,
            binding: Arc::downgrade(inner),
            slot,
            scratch: Vec::with_capacity(SCRATCH),
            result: Vec::with_capacity(SCRATCH),
            result_len: 0,
            spin: SpinBudget::new(inner.config.spin),
            // A slot left by a call given up: the server's answer to it comes before this one's call.
            abandoned: free.abandoned,
            context: false,
            retention: Retention::default(),
            calls: 0,
        })
    }

    /// [`ShmEndpoint::begin`] of a call without a context block.
    #[inline]
    pub(super) fn begin_plain(&mut self) {
        self.scratch.clear();
        self.result_len = 0;
        self.context = false;
        if self.retention.holds_large() && self.retention.idle(Instant::now()) {
            // No large call for a while: give back the private buffers they grew.
            self.give_back_large();
        }
    }

    /// Gives back the private buffers large calls grew.
    #[cold]
    #[inline(never)]
    fn give_back_large(&mut self) {
        self.scratch = Vec::with_capacity(SCRATCH);
        self.result = Vec::with_capacity(SCRATCH);
    }

    /// Prepares the endpoint for a call whose data starts with `context` (when not empty). A
    /// deadline goes in the slot's own words, not in the block.
    pub(super) fn begin(&mut self, context: &Context) {
        self.begin_plain();
        let context = Context { deadline: None, ..*context };
        self.context = !context.is_empty();
        if self.context {
            let mut block = [0u8; tiercel_proto::context::MAX_LEN];
            let n = context.encode(&mut block);
            self.scratch.extend_from_slice(&block[..n]);
        }
    }

    pub(super) fn scratch_mut(&mut self) -> &mut Vec<u8> {
        &mut self.scratch
    }

    #[inline]
    pub(super) fn result(&self) -> &[u8] {
        &self.result[..self.result_len]
    }

    /// Makes the call: publish, wait (spinning, then sleeping), and copy the result out. With
    /// `tail`, a buffer lent to the call (an `InOut` that is the procedure's one buffer and its
    /// last argument), the call is copied into the slot from it, and its result's first bytes,
    /// which go back into it, are copied from the slot straight there: true when they were.
    ///
    /// A call the server refuses as busy goes again after a backoff, as on every transport
    /// ([`super::refused`]), until `dead_after` of refusals has passed.
    #[inline]
    pub(super) fn run(
        &mut self,
        inner: &BindingInner,
        link: &Link,
        deadline: Option<Duration>,
        procedure: u16,
        segs: &Segments<'_>,
        tail: Option<&mut [u8]>,
    ) -> Result<bool, CallError> {
        super::refused::run(self, inner, link, deadline, procedure, segs, tail)
    }
}

impl super::refused::Tries for ShmEndpoint {
    type Link = Link;

    /// One try of [`ShmEndpoint::run`].
    #[inline]
    fn once(
        &mut self,
        inner: &BindingInner,
        link: &Link,
        deadline: Option<Duration>,
        procedure: u16,
        segs: &Segments<'_>,
        tail: Option<&mut [u8]>,
    ) -> Result<bool, CallError> {
        // The round trip goes into the spin budget: timed from the start (the tick counter, a third
        // of the system clock's cost) on every eighth call, and on the others only if the result
        // was not in within the first looks, from then on (`start` 0: not read yet). A stream of
        // quick calls reads the clock on one in eight.
        self.calls = self.calls.wrapping_add(1);
        let mut start = if self.calls.is_multiple_of(SAMPLE_EVERY) { clock::ticks() } else { 0 };
        let deadline = deadline.map(|d| Instant::now() + d);
        if self.abandoned {
            // The call given up at its deadline still owns the slot until the server answers it;
            // this call's deadline runs meanwhile (and if it passes, this call never went out).
            self.wait(inner, link, &mut start, deadline, false)?;
            self.reclaim();
        }
        let len = self.publish_lent(link, procedure, segs, tail.as_deref(), deadline, true)?;
        self.wait(inner, link, &mut start, deadline, true)?;
        mark(Point::Arrived);
        if start != 0 {
            self.spin.observe_ns(clock::elapsed_ns(start, clock::ticks()));
        }
        self.collect(inner, link, procedure, len, tail)
    }
}

impl ShmEndpoint {
    /// [`ShmEndpoint::publish`] of the message `segs` followed by `tail`, if a buffer is lent.
    #[inline]
    pub(super) fn publish_lent(
        &mut self,
        link: &Link,
        procedure: u16,
        segs: &Segments<'_>,
        tail: Option<&[u8]>,
        deadline: Option<Instant>,
        demote: bool,
    ) -> Result<usize, CallError> {
        match tail {
            Some(tail) => {
                let segs = super::udp::with_lent(segs, self.scratch.len(), tail)?;
                self.publish(link, procedure, &segs, deadline, demote)
            }
            None => self.publish(link, procedure, segs, deadline, demote),
        }
    }

    /// The slot's control word `at` (an offset from the slot's start).
    fn slot_word<'l>(&self, link: &'l Link, at: usize) -> &'l AtomicU32 {
        word(&link.region, link.layout.slot(self.slot) + at)
    }

    /// Takes the slot back from a call abandoned earlier, once its result is in (left unread: the
    /// next call's words replace it).
    pub(super) fn reclaim(&mut self) {
        self.abandoned = false;
    }

    /// Copies the call into the slot and publishes it, with its deadline (by which the server must
    /// have started it). Returns the call's length. With `demote`, the slot's words and the call's
    /// bytes are pushed out to the cache the cores share, where the server's core reads them next
    /// (for a caller that only waits for the result: an async call among others, whose thread
    /// looks at the slot again between other calls, was slower for it).
    pub(super) fn publish(
        &mut self,
        link: &Link,
        procedure: u16,
        segs: &Segments<'_>,
        deadline: Option<Instant>,
        demote: bool,
    ) -> Result<usize, CallError> {
        let (region, layout) = (&link.region, link.layout);
        let base = layout.slot(self.slot);
        let data = layout.data(self.slot);
        let len = segs.message_len(&self.scratch);
        if len > layout.data {
            return Err(CallError::TooLarge(format!("call of {len} bytes exceeds the slot's {} bytes", layout.data)));
        }
        proto::client_calls(word(region, base + slot::TAKEN));
        // Each part where it goes: `len` fits in the slot, so every part is inside the region.
        let mut at = data;
        segs.for_each_part(&self.scratch, |part| {
            region.write(at, part);
            at += part.len();
        });
        let flag = if self.context { proto::CONTEXT } else { 0 };
        let words = proto::CallWords {
            procedure: procedure as u32 | flag,
            len: len as u32,
            deadline: deadline.map(clock::monotonic_of_instant),
            cancelled: false,
        };
        let w = slot_words(region, base);
        words.write(|at| &w[at / 4]);
        mark(Point::ArgsCopied);
        let h = header_words(region);
        let (state, sleeping, doorbell) =
            (&w[slot::STATE / 4], &h[header::SERVER_SLEEPING / 4], &h[header::DOORBELL / 4]);
        // The server's barrier word shares its cache line with `sleeping`, read here anyway.
        let ring = if link.barriers && h[header::SERVER_BARRIER / 4].load(Ordering::Relaxed) == 1 {
            proto::client_publish_light(state, sleeping, doorbell)
        } else {
            proto::client_publish(state, sleeping, doorbell)
        };
        if ring {
            futex_wake(doorbell, 1);
        }
        if demote {
            region.demote(base, slot::WORDS * 4);
            region.demote(data, len);
        }
        mark(Point::Sent);
        Ok(len)
    }

    /// Reads the published result of a call of `len` bytes into private memory, checks it, and
    /// gives the slot back. With `tail`, a buffer lent to the call, an `Ok` result at least as long
    /// has its first bytes copied straight there (the result's bytes in its place in the private
    /// copy are left as they were, and the stub skips them): true when they were.
    #[inline]
    pub(super) fn collect(
        &mut self,
        inner: &BindingInner,
        link: &Link,
        procedure: u16,
        len: usize,
        tail: Option<&mut [u8]>,
    ) -> Result<bool, CallError> {
        let (region, layout) = (&link.region, link.layout);
        let base = layout.slot(self.slot);
        let data = layout.data(self.slot);
        let w = slot_words(region, base);
        // Read what the server wrote once, into private memory, and check it before use.
        let rlen = w[slot::LEN / 4].load(Ordering::Relaxed);
        let status = w[slot::STATUS / 4].load(Ordering::Relaxed);
        let Some((rlen, status)) = proto::validate_result(rlen, status, layout.data) else {
            return Err(CallError::Protocol(Violation::ImpossibleResult { len: rlen, status }));
        };
        mark(Point::Validated);
        if self.result.len() < rlen {
            self.result.resize(rlen, 0);
        }
        self.result_len = rlen;
        let result = &mut self.result[..rlen];
        let lent = match tail {
            // The bytes in the lent buffer's place in the private copy are left as they were: the
            // stub skips them.
            Some(tail) if status == Status::Ok && rlen >= tail.len() => {
                region.read(data, tail);
                region.read(data + tail.len(), &mut result[tail.len()..]);
                true
            }
            _ => {
                if rlen > 0 {
                    region.read(data, result);
                }
                false
            }
        };
        mark(Point::ResultCopied);
        // The slot is left in RESULT, the result marked taken on a line of the client's own: the next
        // call's CALL replaces it. (A store of IDLE here took the slot's line from the server's core,
        // whose spinning look had it, once more on every call.)
        proto::client_took(word(region, base + slot::TAKEN));
        let extent = rlen.max(len);
        if extent > retention::LARGE && self.retention.large(Instant::now()) {
            // Give the slot's pages back, but not on every call: a stream of large calls would
            // otherwise fault them in anew (and zero them) each time.
            region.discard(data, extent);
        }
        match status {
            Status::Ok => {
                if lent {
                    inner.stats.in_place.fetch_add(1, Ordering::Relaxed);
                }
                Ok(lent)
            }
            s => Err(self.failure(s, procedure)),
        }
    }

    /// The error of a call whose result came back with `status`, not `Ok` (out of line: the path of
    /// every call is the one that succeeds).
    #[cold]
    #[inline(never)]
    fn failure(&self, status: Status, procedure: u16) -> CallError {
        match status {
            // The server's memory budgets had no room: the call was refused unread.
            Status::Busy => CallError::Overloaded { may_have_run: false },
            s => {
                let message = String::from_utf8_lossy(self.result()).into_owned();
                super::udp::status_error(s, procedure, message)
            }
        }
    }

    /// Spins, then sleeps on the slot's futex, until the result is published or
    /// [`ShmEndpoint::check_alive`] fails the call. `start`: the ticks the spin budget counts from
    /// (0 until read, see [`ShmEndpoint::spin_for_result`]).
    #[inline]
    fn wait(
        &mut self,
        inner: &BindingInner,
        link: &Link,
        start: &mut u64,
        deadline: Option<Instant>,
        ours: bool,
    ) -> Result<(), CallError> {
        if self.spin_for_result(link, start) {
            return Ok(());
        }
        self.block(inner, link, deadline, ours)
    }

    /// [`ShmEndpoint::wait`] once the spin is spent: sleeps on the slot's futex until the result is
    /// in or the call fails.
    #[cold]
    #[inline(never)]
    fn block(
        &mut self,
        inner: &BindingInner,
        link: &Link,
        deadline: Option<Instant>,
        ours: bool,
    ) -> Result<(), CallError> {
        let (state, waiting) = (self.slot_word(link, slot::STATE), self.slot_word(link, slot::CLIENT_WAITING));
        let mut liveness = self.liveness(link);
        loop {
            if proto::client_prepare_block(state, waiting) {
                let now = Instant::now();
                let timeout = deadline.map_or(LIVENESS, |d| d.saturating_duration_since(now).min(LIVENESS));
                if futex_wait(state, proto::state::CALL, Some(timeout)) {
                    steps::slept(steps::Side::Client);
                }
            }
            proto::client_woke(waiting);
            if proto::client_done(state) {
                return Ok(());
            }
            self.check_alive(inner, link, &mut liveness, deadline, ours)?;
        }
    }

    /// Spins on the slot until the result is in (true) or the spin budget, counted from `start`
    /// (ticks; when 0, read after the first looks and set), is spent (false).
    #[inline]
    pub(super) fn spin_for_result(&self, link: &Link, start: &mut u64) -> bool {
        let state = self.slot_word(link, slot::STATE);
        // The first looks read no clock and count this thread among no spinners (a shared atomic
        // word): a short call's result comes within them.
        for _ in 0..FIRST_LOOKS {
            if proto::client_done(state) {
                return true;
            }
            core::hint::spin_loop();
        }
        if *start == 0 {
            *start = clock::ticks();
        }
        let start = *start;
        let spin = clock::ticks_in(self.spin.budget());
        if clock::ticks().saturating_sub(start) >= spin {
            // No budget left (or none at all, `Spin::Never`): the first looks were the spin.
            return false;
        }
        let spinner = SPINNERS.start();
        // Look at the clock only every 64 checks: the result is noticed within a load, not a clock
        // read. Another caller of the process spinning too gets the CPU there (see `Spinners`).
        let mut checks = 0u32;
        loop {
            if proto::client_done(state) {
                return true;
            }
            checks = checks.wrapping_add(1);
            if checks.is_multiple_of(64) {
                if clock::ticks().saturating_sub(start) >= spin {
                    return false;
                }
                if spinner.crowded() {
                    std::thread::yield_now();
                    continue;
                }
            }
            core::hint::spin_loop();
        }
    }

    /// The server's heartbeat as seen now, for [`ShmEndpoint::check_alive`].
    pub(super) fn liveness(&self, link: &Link) -> Liveness {
        Liveness::new(word(&link.region, header::HEARTBEAT).load(Ordering::Acquire), Instant::now())
    }

    /// After a wait that ended without the result: fails the call (leaving the slot abandoned) when
    /// its deadline has passed, the server's process is gone, or its heartbeat has stood still for
    /// `dead_after` (stopped or hung, as a UDP server that answers nothing). `ours`: the call in the
    /// slot is this one (else an earlier one abandoned, and this one has not gone out).
    pub(super) fn check_alive(
        &mut self,
        inner: &BindingInner,
        link: &Link,
        liveness: &mut Liveness,
        deadline: Option<Instant>,
        ours: bool,
    ) -> Result<(), CallError> {
        let now = Instant::now();
        let failure = if deadline.is_some_and(|d| now >= d) {
            CallError::DeadlineExceeded { may_have_run: ours }
        } else if tiercel_sys::shm::peer_closed(&link.stream) {
            CallError::ServerGone { server: inner.server }
        } else {
            let beat = word(&link.region, header::HEARTBEAT).load(Ordering::Acquire);
            if liveness.alive(beat, now, inner.config.timing.dead_after) {
                return Ok(());
            }
            CallError::Unreachable { server: inner.server, acknowledged: false }
        };
        self.abandon(inner, link);
        Err(failure)
    }
}

impl ShmEndpoint {
    /// Gives up the call in the slot: the slot stays the server's until it answers, and a server
    /// that has not started the call yet answers without running it.
    pub(super) fn abandon(&mut self, inner: &BindingInner, link: &Link) {
        self.abandoned = true;
        proto::client_cancel(|at| self.slot_word(link, at));
        // The slot is left to the server, for a free one where there is one (`super::slots`): the
        // next call goes out at once rather than wait for the server's answer to this one.
        if let Some(free) = inner.free_slots.trade(self.slot, 0) {
            word(&link.region, header::SLOTS_USED).fetch_max(free.slot + 1, Ordering::SeqCst);
            (self.slot, self.abandoned) = (free.slot, free.abandoned);
        }
    }
}

#[cfg(feature = "async")]
impl ShmEndpoint {
    pub(super) fn slot(&self) -> u32 {
        self.slot
    }

    /// Starts bringing the slot's control words into this CPU's cache for writing, before an async
    /// call writes them ([`ShmEndpoint::publish`]): its task goes on to other work once the call is
    /// out, and that work's stores would queue behind stores still waiting for the line.
    #[inline]
    pub(super) fn prefetch(&self, link: &Link) {
        tiercel_sys::shm::prefetch_for_write(self.slot_word(link, slot::STATE));
    }

    /// Whether a call given up (its deadline, its future dropped) still holds the slot.
    pub(super) fn is_abandoned(&self) -> bool {
        self.abandoned
    }

    pub(super) fn set_abandoned(&mut self, abandoned: bool) {
        self.abandoned = abandoned;
    }

    /// Records a completed call's round trip in the spin budget.
    pub(super) fn observe(&mut self, rtt: Duration) {
        self.spin.observe(rtt);
    }

    /// The longest its spin policy spins.
    #[cfg(feature = "async")]
    pub(super) fn spin_longest(&self) -> Duration {
        self.spin.longest()
    }

    /// Says that an async call waits for the client doorbell; false when the result is in already.
    pub(super) fn prepare_wait_async(&self, link: &Link) -> bool {
        proto::client_prepare_wait_async(self.slot_word(link, slot::STATE), self.slot_word(link, slot::CLIENT_WAITING))
    }

    /// Done waiting.
    pub(super) fn woke(&self, link: &Link) {
        proto::client_woke(self.slot_word(link, slot::CLIENT_WAITING));
    }
}

#[cfg(feature = "async")]
impl Link {
    /// Whether slot `i` holds no call of the client's that the server has yet to answer.
    pub(super) fn slot_done(&self, i: u32) -> bool {
        proto::client_done(word(&self.region, self.layout.slot(i) + slot::STATE))
    }

    /// The client doorbell's value.
    pub(super) fn client_doorbell(&self) -> u32 {
        word(&self.region, header::CLIENT_DOORBELL).load(Ordering::SeqCst)
    }

    /// Sleeps while the client doorbell holds `seen`, at most `timeout`.
    pub(super) fn wait_client_doorbell(&self, seen: u32, timeout: Duration) {
        futex_wait(word(&self.region, header::CLIENT_DOORBELL), seen, Some(timeout));
    }
}

impl Drop for ShmEndpoint {
    fn drop(&mut self) {
        // A slot whose call was abandoned may still be written by the server: whoever takes it next
        // waits for the server's answer first.
        if let Some(inner) = self.binding.upgrade() {
            inner.give_slot(self.slot, 0, self.abandoned);
        }
    }
}

impl ShmEndpoint {
    /// The binding's unique id (what the thread's cache knows it by).
    pub(super) fn uid(&self) -> u64 {
        self.uid
    }
    /// Whether the binding still exists.
    pub(super) fn is_live(&self) -> bool {
        self.binding.strong_count() > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static INFO: InterfaceInfo = InterfaceInfo {
        name: "Test",
        id: 1,
        version: 1,
        procedures: &["null"],
        source: crate::SignatureSource::Given("null()"),
    };

    #[test]
    fn a_rendezvous_answer_of_impossible_length_is_named_not_reported_as_io() {
        let (client, server) = UnixStream::pair().unwrap();
        let answer = std::thread::spawn(move || {
            let (request, _) = rendezvous::recv(&server).unwrap();
            assert!(!request.is_empty(), "the bind request came");
            let len = (rendezvous::MAX_MESSAGE as u32 + 1).to_le_bytes();
            std::io::Write::write_all(&mut &server, &len).unwrap();
            server
        });
        let err = bind(client, &INFO, &ClientConfig::default()).err().expect("no binding from a liar");
        assert!(
            matches!(err, BindError::Protocol(Violation::BindAnswer("bind answer longer than any bind message"))),
            "{err}"
        );
        drop(answer.join().unwrap());
    }
}
