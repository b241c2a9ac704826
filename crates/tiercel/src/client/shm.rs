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
use tiercel_proto::shm::{self as proto, header, slot, Layout};
use tiercel_proto::wire::{Packet, Status};
use tiercel_sys::clock;
use tiercel_sys::shm::{futex_wait, futex_wake, Region};

use super::BindingInner;
use crate::config::ClientConfig;
use crate::interface::InterfaceInfo;
use crate::rendezvous;
use crate::retention::{self, Retention};
use crate::spin::SpinBudget;
use crate::steps::{self, mark, Point};
use crate::wire::{Segments, MAX_SEGMENTS};
use crate::{BindError, CallError};

/// Bytes the private argument and result buffers start with: a page, enough for every call but
/// those with large buffers, which grow them.
const SCRATCH: usize = 4096;
/// How long a blocked caller sleeps before looking whether the server's process is still there.
const LIVENESS: Duration = Duration::from_millis(50);

/// A binding's shared region and the connection that keeps it alive.
pub(crate) struct Link {
    region: Region,
    layout: Layout,
    stream: UnixStream,
}

/// What a shared-memory bind produced.
pub(crate) struct Granted {
    pub(crate) link: Link,
    pub(crate) id: u32,
    pub(crate) incarnation: u64,
    pub(crate) slots: u32,
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
    let bad = |why: &str| BindError::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, why.to_string()));
    stream.set_read_timeout(Some(config.timing.dead_after))?;
    let nonce = u64::from_le_bytes(super::random_bytes()?[..8].try_into().unwrap_or_default());
    let mut machine = BindClient::new(&info.spec(), 0, nonce, false);
    let secret = config.secret.as_ref().map(|s| s as &dyn Keyed);
    // A server with no room closes the connection at once: writing to it may fail already.
    rendezvous::send(&stream, &machine.packet(), None).map_err(|e| match e.kind() {
        std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset => BindError::Busy,
        _ => BindError::Io(e),
    })?;
    // At most two answers: a challenge, then the grant or refusal.
    for _ in 0..2 {
        let (msg, fd) = match rendezvous::recv(&stream) {
            Ok(m) => m,
            // The server closes a connection unanswered only when it has no room for another binding
            // or is shutting down (closed with the request unread, the close comes as a reset).
            Err(e) if matches!(e.kind(), std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset) => {
                return Err(BindError::Busy)
            }
            Err(e) => return Err(e.into()),
        };
        let p = Packet::new_checked(&msg[..]).map_err(|_| bad("malformed bind answer"))?;
        let granted = match machine.handle(&p, secret) {
            BindEvent::Ignored | BindEvent::Rendezvous { .. } => return Err(bad("bind answer for another request")),
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
            link: Link { region, layout, stream },
            id: granted.binding,
            incarnation: granted.incarnation,
            slots: grant.slots,
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
    result: Vec<u8>,
    spin: SpinBudget,
    /// A call abandoned at its deadline is still in the slot: wait for it before the next one.
    abandoned: bool,
    /// When large calls last passed and the slot's pages were last given back.
    retention: Retention,
}

fn word(region: &Region, at: usize) -> &AtomicU32 {
    region.u32_at(at).unwrap_or_else(|| unreachable!("layout offset {at} inside the region"))
}

impl ShmEndpoint {
    pub(super) fn new(inner: &Arc<BindingInner>, link: &Link) -> Result<ShmEndpoint, CallError> {
        let (slot, _) = inner.take_slot()?;
        // The server scans the slots below the high-water mark.
        word(&link.region, header::SLOTS_USED).fetch_max(slot + 1, Ordering::SeqCst);
        Ok(ShmEndpoint {
            uid: inner.uid,
            binding: Arc::downgrade(inner),
            slot,
            scratch: Vec::with_capacity(SCRATCH),
            result: Vec::with_capacity(SCRATCH),
            spin: SpinBudget::new(inner.config.spin),
            abandoned: false,
            retention: Retention::default(),
        })
    }

    pub(super) fn begin(&mut self) {
        self.scratch.clear();
        self.result.clear();
        if self.retention.idle(Instant::now()) {
            // No large call for a while: give back the private buffers they grew.
            self.scratch = Vec::with_capacity(SCRATCH);
            self.result = Vec::with_capacity(SCRATCH);
        }
    }

    pub(super) fn scratch_mut(&mut self) -> &mut Vec<u8> {
        &mut self.scratch
    }

    pub(super) fn result(&self) -> &[u8] {
        &self.result
    }

    pub(super) fn run(
        &mut self,
        inner: &BindingInner,
        link: &Link,
        deadline: Option<Duration>,
        procedure: u16,
        segs: &Segments<'_>,
    ) -> Result<(), CallError> {
        let (region, layout) = (&link.region, link.layout);
        let base = layout.slot(self.slot);
        let data = layout.data(self.slot);
        let state = word(region, base + slot::STATE);
        let waiting = word(region, base + slot::CLIENT_WAITING);
        // The tick counter, not the system clock (a third of the cost): the fast path reads it twice.
        let start = clock::ticks();
        let deadline = deadline.map(|d| Instant::now() + d);
        if self.abandoned {
            // The call given up at its deadline still owns the slot until the server answers it;
            // this call's deadline runs meanwhile (and if it passes, this call never went out).
            self.wait(inner, link, state, waiting, start, deadline, false)?;
            proto::client_reset(state);
            self.abandoned = false;
        }
        let len = segs.message_len(&self.scratch);
        if len > layout.data {
            return Err(CallError::TooLarge(format!("call of {len} bytes exceeds the slot's {} bytes", layout.data)));
        }
        let mut io = [std::io::IoSlice::new(&[]); MAX_SEGMENTS];
        let n = segs.io_slices(&self.scratch, &mut io);
        region.write_vectored(data, &io[..n]);
        word(region, base + slot::PROCEDURE).store(procedure as u32, Ordering::Relaxed);
        word(region, base + slot::LEN).store(len as u32, Ordering::Relaxed);
        mark(Point::ArgsCopied);
        let doorbell = word(region, header::DOORBELL);
        if proto::client_publish(state, word(region, header::SERVER_SLEEPING), doorbell) {
            futex_wake(doorbell, 1);
        }
        mark(Point::Sent);
        self.wait(inner, link, state, waiting, start, deadline, true)?;
        mark(Point::Arrived);
        self.spin.observe(clock::elapsed(start, clock::ticks()));
        // Read what the server wrote once, into private memory, and check it before use.
        let rlen = word(region, base + slot::LEN).load(Ordering::Relaxed);
        let status = word(region, base + slot::STATUS).load(Ordering::Relaxed);
        let Some((rlen, status)) = proto::validate_result(rlen, status, layout.data) else {
            proto::client_reset(state);
            return Err(CallError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("server wrote an impossible result (length {rlen}, status {status})"),
            )));
        };
        mark(Point::Validated);
        self.result.resize(rlen, 0);
        region.read(data, &mut self.result);
        mark(Point::ResultCopied);
        proto::client_reset(state);
        let extent = rlen.max(len);
        if extent > retention::LARGE && self.retention.large(Instant::now()) {
            // Give the slot's pages back, but not on every call: a stream of large calls would
            // otherwise fault them in anew (and zero them) each time.
            region.discard(data, extent);
        }
        match status {
            Status::Ok => Ok(()),
            // The server's memory budgets had no room: the call was refused unread.
            Status::Busy => Err(CallError::Overloaded),
            s => {
                let message = String::from_utf8_lossy(&self.result).into_owned();
                Err(super::udp::status_error(s, procedure, message))
            }
        }
    }

    /// Spins, then sleeps on the slot's futex, until the result is published, the deadline passes,
    /// the server's process is gone, or its heartbeat has stood still for `dead_after` (stopped or
    /// hung, as a UDP server that answers nothing). `ours`: the call in the slot is this one (else
    /// an earlier one abandoned at its deadline, and this one has not gone out).
    #[allow(clippy::too_many_arguments)]
    fn wait(
        &mut self,
        inner: &BindingInner,
        link: &Link,
        state: &AtomicU32,
        waiting: &AtomicU32,
        start: u64,
        deadline: Option<Instant>,
        ours: bool,
    ) -> Result<(), CallError> {
        let spin = clock::ticks_in(self.spin.budget());
        // Look at the clock only every 64 checks: the result is noticed within a load, not a clock read.
        let mut checks = 0u32;
        loop {
            if proto::client_done(state) {
                return Ok(());
            }
            checks = checks.wrapping_add(1);
            if checks.is_multiple_of(64) && clock::ticks().saturating_sub(start) >= spin {
                break;
            }
            core::hint::spin_loop();
        }
        let heartbeat = word(&link.region, header::HEARTBEAT);
        let (mut beat, mut beat_seen) = (heartbeat.load(Ordering::Acquire), Instant::now());
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
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                self.abandoned = true;
                return Err(CallError::DeadlineExceeded { may_have_run: ours });
            }
            if tiercel_sys::shm::peer_closed(&link.stream) {
                self.abandoned = true;
                return Err(CallError::ServerGone { server: inner.server });
            }
            let b = heartbeat.load(Ordering::Acquire);
            if b != beat {
                (beat, beat_seen) = (b, now);
            } else if now.saturating_duration_since(beat_seen) >= inner.config.timing.dead_after {
                self.abandoned = true;
                return Err(CallError::Unreachable { server: inner.server, acknowledged: false });
            }
        }
    }
}

impl Drop for ShmEndpoint {
    fn drop(&mut self) {
        // A slot whose call was abandoned may still be written by the server: never hand it out again.
        if self.abandoned {
            return;
        }
        if let Some(inner) = self.binding.upgrade() {
            inner.give_slot(self.slot, 0);
        }
    }
}

impl super::cache::Cached for ShmEndpoint {
    fn uid(&self) -> u64 {
        self.uid
    }
    fn is_live(&self) -> bool {
        self.binding.strong_count() > 0
    }
}
