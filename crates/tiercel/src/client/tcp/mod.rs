//! The client side of the TCP transport: binding over a connection, and the calls of every thread
//! and task of the binding sharing it.
//!
//! A call is one frame (length, header, arguments) written with one `sendmsg`, under a lock so that
//! frames never interleave; calls of several threads are in flight at once, each on its own client
//! slot. The results come back in the order the server finishes them and are matched to their
//! callers by slot and call number: the waiting caller that finds no one reading the connection
//! reads it (spinning, then blocking in `poll`) and hands every other caller's result to its slot,
//! waking it once the connection's lock is let go; when its own result is in, it gives the reading
//! over to the waiting caller whose call went out first, which the server most likely answers
//! next. A read that takes less than there was room for ends the reading until the connection is
//! readable again. With one caller there is no handoff at all: it reads its own result. A result
//! larger than the connection's 64 KiB buffer that is all the buffer holds is not copied: the
//! buffer it was read into goes to its caller, and the connection is read on into the one the
//! caller had before. A caller that lends its buffer to the call ([`TcpEndpoint::run`]) reads its
//! result's bytes that go back into that buffer straight there ([`Link::land`]).
//!
//! The server sends a heartbeat frame every second while a call of the connection runs, so when
//! nothing arrives for `Timing::dead_after` (at least 2 s) while calls wait, those calls fail with
//! [`CallError::Unreachable`] (they may have run), as over UDP, and the connection stays for the
//! calls that follow (a stopped server that runs again answers them). A closed or reset connection
//! fails its calls at once with [`CallError::ConnectionLost`], and nothing is sent on it again.
//!
//! This file holds a call's steps; `link` the connection its callers share and its reading,
//! `binding` makes the connection and binds over it, `demux` delivers what the reading caller reads to the other callers, and `asynch` runs
//! calls from async tasks.

use std::io::IoSlice;
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
use crate::error::Violation;
use crate::framed::{self, Got};
use crate::interface::InterfaceInfo;
use crate::steps::{mark, Point};
use crate::waiting::spin::{SpinBudget, SPINNERS};
use crate::wire::{Segments, MAX_SEGMENTS};
use crate::{BindError, CallError};

#[cfg(feature = "async")]
mod asynch;
#[cfg(feature = "async")]
use asynch::Reactor;
mod binding;
mod demux;
mod link;

pub(crate) use binding::{ask_key, bind, list};
use demux::*;
pub(crate) use link::Link;
use link::*;

/// Bytes of the connection's receive buffer (larger results grow it while they pass).
const BUFFER: usize = 64 * 1024;
/// Bytes of a call's private argument buffer to start with.
const SCRATCH: usize = 4096;
/// How long a blocked caller waits before looking again at its deadline and the connection's
/// silence.
const TICK: Duration = Duration::from_millis(100);
/// Prefix and header of every frame.
const FRAME_HEAD: usize = PREFIX_LEN + HEADER_LEN;
/// Most bytes a reader waiting in its receive takes in it ([`Link::pump_waiting`]): a few small
/// results' frames.
const WAIT_READ: usize = 512;
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
    /// The key the server proved, on a secure binding.
    pub(crate) proven: Option<crate::PublicKey>,
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
        let free = inner.take_slot()?;
        let (slot, seq) = (free.slot, free.seq);
        room_for(link, slot);
        Ok(TcpEndpoint {
            uid: inner.uid,
            binding: Arc::downgrade(inner),
            slot,
            seq,
            head: head(inner, slot),
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

impl super::refused::Tries for TcpEndpoint {
    type Link = Link;

    /// One try of [`TcpEndpoint::run`].
    #[inline]
    fn once(
        &mut self,
        inner: &BindingInner,
        link: &Link,
        deadline: Option<Duration>,
        procedure: u16,
        segs: &Segments<'_>,
        mut tail: Option<&mut [u8]>,
    ) -> Result<bool, CallError> {
        let start = Instant::now();
        #[cfg(feature = "async")]
        link.leave_reactor_if_idle();
        self.send_lent(inner, link, procedure, segs, tail.as_deref())?;
        self.wait(inner, link, deadline.map(|d| start + d), start, tail.as_deref_mut())?;
        self.finish(procedure)?;
        Ok(tail.is_some_and(|tail| self.settle_lent(inner, tail)))
    }
}

impl TcpEndpoint {
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
        tiercel_proto::copy::copy(&mut tail[lent.filled..], &result[lent.filled..len]);
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
        // Counted among the spinners until it blocks, a caller that blocks at once too (see the
        // UDP caller's wait).
        let mut spinner = SPINNERS.start();
        // A caller that blocks at once (spinning off): its place among the others that wait, and
        // the turns it took among them (`spin::WAIT_TURNS`), each a yield of the CPU and a look.
        let (mut waiting, mut turns) = (None, 0);
        // Alone, it waits for the connection to be readable before its first read: a read made as
        // soon as the call is sent finds nothing. Beside others, it reads after its first turn.
        let mut read = spin_until > start || waiting.insert(SPINNERS.waiting()).take_turn(&mut turns);
        // Whether the reader's next wait is in its receive (`Link::pump_waiting`): not after one
        // that found nothing, until a wait in `poll` has passed.
        let mut in_receive = true;
        loop {
            let now = Instant::now();
            // Spinning, nobody need wake this thread; about to block, it says how.
            let wake = (now >= spin_until).then(|| Wake::Thread(std::thread::current()));
            let looked = self.look(inner, link, deadline, now, wake, tail.as_deref_mut(), read);
            read = true;
            let reading = match looked? {
                Waited::Arrived => break,
                Waited::Not(reading) => reading,
            };
            if now < spin_until {
                spinner.pause();
                continue;
            }
            if waiting.as_ref().is_some_and(|w| w.take_turn(&mut turns)) {
                // Others ran meanwhile: look again before blocking.
                continue;
            }
            spinner.stop();
            let tick = deadline.map_or(TICK, |d| d.saturating_duration_since(now).min(TICK));
            crate::steps::slept(crate::steps::Side::Client);
            if reading
                && in_receive
                && tail.is_none()
                && link.reads_block()
                && deadline.is_none_or(|d| d.saturating_duration_since(now) > link.receive_wait)
            {
                // Waits in the receive (no result lent a buffer, no deadline within the wait): the
                // look and the wait in one system call. A deadline is never passed by it.
                in_receive = !matches!(link.pump_waiting(inner), Ok(Got::Nothing));
                continue;
            }
            in_receive = true;
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

    /// Numbers the call and sends its frame with one `sendmsg`.
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
            demux.sent += 1;
            let order = demux.sent;
            let mail = &mut demux.mail[self.slot as usize];
            mail.awaiting = Some(self.seq);
            mail.order = order;
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
        let sent = link.send(&mut io[..n + 1]);
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

    /// One look for the result, reading the connection if no one else is (and `read`): `Arrived`,
    /// or whether this caller now reads (then it waits on the socket) or waits to be woken with
    /// `wake`.
    #[allow(clippy::too_many_arguments)]
    fn look(
        &mut self,
        inner: &BindingInner,
        link: &Link,
        deadline: Option<Instant>,
        now: Instant,
        wake: Option<Wake>,
        tail: Option<&mut [u8]>,
        read: bool,
    ) -> Result<Waited, CallError> {
        let mut demux = link.demux();
        // A result another caller's read brought is taken without a read: beside other callers
        // that take turns, a caller that read whenever it looked, its result there or not, took
        // the reading from the one that had given it up with its own result, and so each of eight
        // callers read once a call, each read bringing one result or two.
        if demux.mail[self.slot as usize].arrived.is_some() {
            return Ok(self.take_result(&mut demux));
        }
        // The reading waits for the caller woken to take it, but not a caller still spinning,
        // which would only spin longer.
        let next = wake.is_none() || demux.heir.is_none_or(|h| h == self.slot);
        if !demux.reading && demux.broken.is_none() && next {
            demux.reading = true;
            demux.heir = None;
            self.reading = true;
        }
        // The reader reads; so does anyone when the reader has not for a while (an async task
        // whose runtime is busy elsewhere must not hold up the binding's threads). The lock makes
        // any number of readers safe: the role only spares the socket needless reads.
        if read && !demux.away && (self.reading || now.saturating_duration_since(demux.pumped) >= STALE_READER) {
            demux.pumped = now;
            // (A sealed result opens only whole: none is read straight into a lent buffer.)
            let tail = tail.filter(|_| link.seal.is_none());
            let mut lend = tail.map(|tail| Lend { slot: self.slot, seq: self.seq, tail, lent: self.lent });
            // A read that drained the connection ends the reading: one more would find nothing.
            while let Ok(Got::Filled) = link.pump(&mut demux, inner, lend.as_mut()) {}
            if let Some(lend) = lend {
                self.lent = lend.lent;
            }
        }
        let i = self.slot as usize;
        if demux.mail[i].arrived.is_some() {
            return Ok(self.take_result(&mut demux));
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
            self.cancel(inner, link);
            return Err(CallError::DeadlineExceeded { may_have_run: true });
        }
        if !self.reading {
            demux.mail[i].wake = wake;
        }
        Ok(Waited::Not(self.reading))
    }

    /// Takes the result delivered to this caller's mailbox: the call waits no more.
    fn take_result(&mut self, demux: &mut Demux) -> Waited {
        let mail = &mut demux.mail[self.slot as usize];
        std::mem::swap(&mut mail.result, &mut self.result);
        self.result_at = mail.result_at;
        self.arrived = mail.arrived.take();
        self.give_up(demux);
        Waited::Arrived
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
        if self.reading || demux.heir == Some(self.slot) {
            // (An heir that gives up before it reads passes the reading on as a reader does.)
            self.reading = false;
            demux.hand_over();
        }
    }

    /// Tells the server, best effort, that the call being made is given up: an async procedure
    /// running it stops (a plain one runs to its end), and its result, when it comes, is dropped.
    /// The slot is left to it: the next call goes out on another, where one is free.
    pub(super) fn cancel(&mut self, inner: &BindingInner, link: &Link) {
        self.give_up(&mut link.demux());
        if inner.features & tiercel_proto::bind::wire::features::CANCEL != 0 {
            self.send_cancel(link);
        }
        self.leave_slot(inner, link);
    }

    /// Trades the slot a call given up may still hold on the server for a free one, where there is
    /// one (`super::slots`).
    fn leave_slot(&mut self, inner: &BindingInner, link: &Link) {
        let Some(free) = inner.free_slots.trade(self.slot, self.seq) else { return };
        (self.slot, self.seq) = (free.slot, free.seq);
        room_for(link, free.slot);
        self.head = head(inner, free.slot);
    }

    fn send_cancel(&self, link: &Link) {
        let mut head = self.head;
        head[..PREFIX_LEN].copy_from_slice(&stream::prefix(HEADER_LEN));
        let mut p = Packet::new_unchecked(&mut head[PREFIX_LEN..]);
        p.set_kind(Kind::Cancel);
        p.set_lengths(0, 0);
        if link.send(&mut [IoSlice::new(&head)]).is_err() {
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
                // Refused from its header, its bytes dropped unread.
                Err(CallError::Overloaded { may_have_run: false })
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

impl Drop for TcpEndpoint {
    fn drop(&mut self) {
        if let Some(inner) = self.binding.upgrade() {
            if let Some(link) = &inner.tcp {
                self.give_up(&mut link.demux());
            }
            inner.give_slot(self.slot, self.seq, false);
        }
    }
}

/// Makes `slot`'s mailbox, if it has none yet.
fn room_for(link: &Link, slot: u32) {
    let mut demux = link.demux();
    if demux.mail.len() <= slot as usize {
        demux.mail.resize_with(slot as usize + 1, Mail::default);
    }
}

/// The frame head of `slot`'s calls (its prefix and the changing fields are written per call).
fn head(inner: &BindingInner, slot: u32) -> [u8; FRAME_HEAD] {
    let header = Header { binding: inner.id, slot, incarnation: inner.incarnation, ..Header::new(Kind::Call) };
    let mut head = [0u8; FRAME_HEAD];
    head[PREFIX_LEN..].copy_from_slice(&header.to_bytes());
    head
}
