//! The server side of the UDP transport: a worker thread: receive, validate, find the slot, run the procedure inline, send the result.
//!
//! The fast path of the server is `UdpWorker::listen` → `handle_batch` → `handle_packet` → `on_call`
//! → `execute`: one `recvmsg` into the worker's buffer, an O(1) header check, the binding and slot
//! found by index, the procedure run with arguments borrowed from that buffer,
//! results marshaled into the slot's result buffer behind a prebuilt header, one `sendmsg`. The
//! slot's lock is not held while the procedure runs. When calls queue, one `recvmmsg` takes up to 16
//! of them, and the results of the quick ones go out together with one `sendmmsg` (`outbox`); the
//! calls behind one that may be slow are left to the other listeners (`handoff`). While a large
//! call's fragments arrive, the next receive puts them straight into its reassembly (`landing`).
//! A server may have several sockets on its port (`Lane`, `ServerConfig::sockets`): each worker
//! reads one at a time, and the crew says which.

use std::cell::{Cell, RefCell};
use std::io::{IoSlice, IoSliceMut};
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use tiercel_proto::bind::BindDecision;
use tiercel_proto::endpoint::{Fragment, Refusal, Route, Terms};
use tiercel_proto::server::{CallAction, DropReason, ProbeAction};
use tiercel_proto::wire::{flags, Header, Kind, Packet, Status, CHECKSUM_LEN, HEADER_LEN};
use tiercel_sys::mmsg::{self, RecvBatch, MAX_BATCH};
use tiercel_sys::udp::{self, Received};

use super::crew::Standby;
use super::dispatch::{run_in_place, run_procedure, Arrival};
use super::handoff::Handoff;
use super::landing::{gather, Landing, MAX_LANDED, MAX_PARTS};
use super::outbox::{Outbox, QuickProcedures, MAX_HELD, QUICK_RUN};
use super::spinning::SpinLease;
use super::{Shared, UdpBinding, UdpSlot};
use crate::retention::SPARES_IDLE;
use crate::steps::{self, mark, Point};
use crate::transmit;

/// What [`UdpWorker::receive_in_place`] did.
enum Landed {
    /// No large call is being received: nothing was read.
    NotExpected,
    /// Nothing was waiting.
    Nothing,
    /// A datagram (or run) of this many bytes was received and handled.
    Received(usize),
}

/// Whether a reply to `p` carries a checksum trailer: when `p` did.
fn checksummed(p: &Packet<&[u8]>) -> bool {
    p.flags() & flags::CHECKSUM != 0
}

/// How often worker 0 looks for idle bindings.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// One of the server's UDP sockets (`ServerConfig::sockets`), with what the workers reading it
/// share.
pub(super) struct Lane {
    socket: UdpSocket,
    /// Whether the socket takes runs of datagrams whole (UDP GRO), so that receives must be cut.
    coalescing: bool,
    /// Datagrams a worker took in a batch from this socket and left to its other listeners.
    handoff: Handoff,
    /// Procedures that this socket's listeners are running: the crew's deputy asks whether every
    /// one of them is running a call.
    running: AtomicUsize,
    /// Procedures that this socket's listeners have started: whether any started between two of
    /// the deputy's looks.
    started: AtomicU64,
}

impl Lane {
    /// A lane reading `socket`, whose datagrams are at most `datagram` bytes (a coalesced run more).
    pub(super) fn new(socket: UdpSocket, datagram: usize) -> Lane {
        Lane {
            coalescing: udp::enable_gro(&socket),
            socket,
            handoff: Handoff::new(datagram),
            running: AtomicUsize::new(0),
            started: AtomicU64::new(0),
        }
    }

    /// Whether a datagram waits for this socket's listeners (in the socket, or handed over).
    fn queued(&self) -> bool {
        !self.handoff.is_empty() || udp::wait_readable(&self.socket, Some(Duration::ZERO)).unwrap_or(false)
    }
}

pub(super) struct UdpWorker {
    shared: Arc<Shared>,
    index: usize,
    /// The socket this worker reads (while listening), an index into `Shared::lanes`.
    lane: usize,
    /// Where one `recvmmsg` puts the datagrams waiting.
    batch: RecvBatch,
    /// The datagram of the batch being handled, and the end of what is left of the batch to this
    /// worker (the rest may be handed off).
    at: Cell<usize>,
    end: Cell<usize>,
    /// Results held while the rest of a batch runs.
    outbox: RefCell<Outbox>,
    /// Procedures seen to run quickly, across which results are held.
    quick: RefCell<QuickProcedures>,
    /// Leave to spin while waiting for the next datagram.
    lease: SpinLease,
    waiter: Option<udp::ExclusiveWaiter>,
    spares: RefCell<Spares>,
    /// The large call whose fragments the next receive puts straight into place.
    landing: Landing,
}

/// The arguments of a call: in the packet it came in, or a message put together from several.
enum Args<'a> {
    Packet(&'a [u8]),
    Message(Vec<u8>),
}

/// Buffers of the last multi-packet call this worker ran and of its result, kept for the next one
/// so that a stream of large calls does not allocate, fault in and zero fresh ones each time (or
/// leave the allocator to alternate between mapping and unmapping them). One pair per worker, each at
/// most the message limit; freed when the worker has heard nothing for 100 ms.
#[derive(Default)]
struct Spares {
    message: Vec<u8>,
    result: Vec<u8>,
}

impl UdpWorker {
    pub(super) fn new(shared: Arc<Shared>, index: usize) -> UdpWorker {
        // A socket that takes runs of datagrams whole needs room for a whole run.
        let size = if shared.lanes.iter().any(|l| l.coalescing) {
            shared.config.max_datagram.max(udp::GRO_BUFFER)
        } else {
            shared.config.max_datagram
        };
        let lease = SpinLease::new(&shared.spin_leases);
        UdpWorker {
            lane: index % shared.lanes.len(),
            shared,
            index,
            batch: RecvBatch::new(size),
            at: Cell::new(0),
            end: Cell::new(0),
            outbox: RefCell::new(Outbox::new()),
            quick: RefCell::new(QuickProcedures::new()),
            lease,
            waiter: None,
            spares: RefCell::default(),
            landing: Landing::default(),
        }
    }

    /// The socket this worker reads, and what its listeners share.
    #[inline]
    fn lane(&self) -> &Lane {
        &self.shared.lanes[self.lane]
    }

    /// Runs the worker: listening (see `crew`) or standing by, until the server stops.
    pub(super) fn run(mut self) {
        let cpus = &self.shared.config.cpus;
        if !cpus.is_empty() {
            let _ = tiercel_sys::cpu::pin_current_thread(cpus[self.index % cpus.len()]);
        }
        let shared = self.shared.clone();
        // Worker `i` starts as the listener of socket `i`, if there is one; the others stand by.
        let mut listening = self.index < shared.lanes.len();
        while !shared.stop.load(Ordering::Acquire) {
            if listening {
                self.listen();
                // A worker that stands by holds no spare buffers.
                self.spares.take();
                self.landing.free();
            }
            let lane = |i: usize| &shared.lanes[i];
            let running = |i| lane(i).running.load(Ordering::Acquire);
            let started = |i| lane(i).started.load(Ordering::Relaxed);
            let queued = |i| lane(i).queued();
            listening = match shared.crew.stand_by(&shared.stop, running, started, queued) {
                Standby::Listen(i) => {
                    self.lane = i;
                    true
                }
                Standby::Stop => break,
            };
        }
    }

    /// Reads the socket and runs what arrives, spinning then blocking, until the server stops or
    /// this worker is to stand by (another listener is free).
    fn listen(&mut self) {
        // A listener waits through its own exclusive waiter, so that a packet wakes one blocked
        // listener, not all of them (falling back to `poll` if epoll is refused). A worker standing
        // by has none: every waiter registered on the socket is visited for every datagram that
        // arrives (16 of them made a Null call 0.7 µs slower).
        self.waiter = udp::ExclusiveWaiter::new(&self.lane().socket).ok();
        // Datagrams another worker leaves wake a listener asleep as datagrams in the socket do.
        // (Refused, they wake with the next datagram, at the latest a retransmission of theirs.)
        if let (Some(w), Some(nudge)) = (&self.waiter, self.lane().handoff.nudge()) {
            let _ = w.also(nudge.as_fd());
        }
        let mut spin_until = Instant::now();
        // Datagrams the last look found, their bytes, and when it was made. When it found some,
        // small ones, and handled them quickly (within `QUICK_RUN` each), calls are queueing, and the
        // next receive takes up to a batch of them. Otherwise it asks for one, with `recvmsg` (a
        // `recvmmsg` makes the kernel try the socket again after a lone caller's datagram); calls
        // of slow procedures stay in the socket, for whichever listener is free, rather than in
        // one worker's batch; and the fragments of large messages are read
        // one by one into the same buffer, which stays in the cache, rather than into a batch's
        // (16 fragments of 64 KiB, read through a batch, made 16 MiB calls 18% slower).
        let (mut found, mut found_bytes, mut last_look) = (0u32, 0usize, Instant::now());
        while !self.shared.stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            let queueing = found > 0
                && found_bytes <= found as usize * MAX_HELD
                && now.saturating_duration_since(last_look) < QUICK_RUN * found;
            (found, found_bytes, last_look) = (0, 0, now);
            if self.shared.crew.sweep_due(now, SWEEP_INTERVAL) {
                self.sweep();
            }
            if self.shared.refusing_bindings() && self.shared.drained(now) {
                // A graceful shutdown has drained: every worker stops.
                self.shared.stop_workers();
            }
            // Datagrams another worker left first: they were received before what waits now.
            if let Some(handed) = self.lane().handoff.take_if_any() {
                self.outbox.borrow_mut().open(false);
                for piece in udp::segments(handed.bytes.len(), handed.segment) {
                    self.handle_packet(&handed.bytes[piece], handed.from);
                }
                self.lane().handoff.recycle(handed.bytes);
                if self.lease.take() {
                    spin_until = Instant::now() + self.shared.config.spin;
                }
                continue;
            }
            if !queueing {
                match self.receive_in_place() {
                    Ok(Landed::NotExpected) => {}
                    Ok(Landed::Nothing) => {
                        if Instant::now() < spin_until {
                            core::hint::spin_loop();
                            continue;
                        }
                    }
                    Ok(Landed::Received(bytes)) => {
                        (found, found_bytes) = (1, bytes);
                        if self.lease.take() {
                            spin_until = Instant::now() + self.shared.config.spin;
                        }
                        continue;
                    }
                    Err(_) => self.landing.forget(),
                }
            }
            let max = if queueing { MAX_BATCH } else { 1 };
            match self.batch.recv_nowait(&self.shared.lanes[self.lane].socket, max) {
                Ok(0) => {}
                Ok(n) => {
                    found = n as u32;
                    found_bytes = self.handle_batch(n);
                    if self.lease.take() {
                        spin_until = Instant::now() + self.shared.config.spin;
                    }
                    continue;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
            if Instant::now() < spin_until {
                core::hint::spin_loop();
                continue;
            }
            // Nothing to read: stand by rather than wait beside another listener that is free
            // (a listener with calls waiting in the socket keeps taking them).
            if self.shared.crew.should_stand_by(self.lane, || self.lane().running.load(Ordering::Acquire)) {
                break;
            }
            self.lease.give_back();
            steps::slept(steps::Side::Server);
            let ready = match &self.waiter {
                Some(w) => w.wait(Some(SPARES_IDLE)),
                None => udp::wait_readable(&self.lane().socket, Some(SPARES_IDLE)),
            };
            match ready {
                // A datagram after a wait: calls may be coming again, and the deputy looks.
                Ok(true) => self.shared.crew.woke(),
                // A while without a packet: give the spare buffers back.
                Ok(false) => {
                    drop(self.spares.take());
                    self.landing.free();
                }
                Err(_) => {}
            }
        }
        self.lease.give_back();
        self.waiter = None;
    }

    /// Receives the next datagram into the place of the fragments expected next of the large call
    /// this worker is receiving (`landing`), if it is receiving one, and handles it: the fragments
    /// that landed as expected without a copy, the rest put back together and handled whole.
    fn receive_in_place(&mut self) -> std::io::Result<Landed> {
        let Some(expected) = self.landing.expected() else { return Ok(Landed::NotExpected) };
        let binding = &expected.binding;
        let (frag_payload, trailer) = (binding.frag_payload(), expected.trailer);
        let max = if self.lane().coalescing {
            (udp::GRO_BUFFER / (HEADER_LEN + frag_payload + trailer)).clamp(1, MAX_LANDED)
        } else {
            1
        };
        let Some(mut cell) = binding.slot(expected.slot) else { return Ok(self.nothing_expected()) };
        let Some(call) = cell.call_at(expected.slot).filter(|c| c.seq == expected.seq) else {
            return Ok(self.nothing_expected());
        };
        self.landing.ready(self.batch.size());
        let Landing { heads, tail, rebuilt, .. } = &mut self.landing;
        let Some((first, span)) = cell.landing(binding, expected.seq, max as u16) else {
            drop(cell);
            return Ok(self.nothing_expected());
        };
        // Each fragment's header, payload and trailer, then the tail.
        let mut parts: [IoSliceMut<'_>; MAX_PARTS] = std::array::from_fn(|_| IoSliceMut::new(&mut []));
        let stride = if trailer > 0 { 3 } else { 2 };
        let mut n = 0;
        for (payload, head) in span.chunks_mut(frag_payload).zip(heads.chunks_mut(HEADER_LEN + CHECKSUM_LEN)) {
            let (header, rest) = head.split_at_mut(HEADER_LEN);
            parts[n] = IoSliceMut::new(header);
            parts[n + 1] = IoSliceMut::new(payload);
            if trailer > 0 {
                parts[n + 2] = IoSliceMut::new(&mut rest[..trailer]);
            }
            n += stride;
        }
        let fragments = n / stride;
        parts[n] = IoSliceMut::new(tail);
        let got = mmsg::recv_scattered_from_nowait(&self.shared.lanes[self.lane].socket, &mut parts[..=n])?;
        let stats = &self.shared.stats;
        let (len, from) = match (got.received, got.from) {
            (Received::Datagram(len), Some(from)) => (len, from),
            (Received::Nothing | Received::Refused, _) => return Ok(Landed::Nothing),
            // Too large for the buffers, or from no IP address: nothing tiercel sent.
            _ => {
                stats.malformed.fetch_add(1, Ordering::Relaxed);
                return Ok(Landed::Received(0));
            }
        };
        mark(Point::ServerArrived);
        if got.segment.is_some() {
            stats.coalesced.fetch_add(1, Ordering::Relaxed);
        }
        // The fragments that landed: each datagram of the run just where a fragment's header,
        // payload and trailer went, and the next fragment of the call from its peer.
        let now = Instant::now();
        let step = got.segment.unwrap_or(len);
        let (mut landed, mut at) = (0, 0);
        while landed < fragments && at < len {
            let pieces = &parts[landed * stride..landed * stride + stride];
            let end = (at + step).min(len);
            if end - at != HEADER_LEN + pieces[1].len() + trailer {
                break;
            }
            let p = Packet::new_unchecked(&pieces[0][..]);
            let fits = p.check_split(&pieces[1], pieces.get(2).map_or(&[][..], |t| &t[..])).is_ok()
                && usize::from(p.frag_index()) == usize::from(first) + landed
                && self.shared.endpoint.continues(binding, call, &p, from, now);
            if !fits {
                break;
            }
            (landed, at) = (landed + 1, end);
        }
        // What did not land, put back together.
        let rest = gather(&parts[..=n], at..len, rebuilt);
        if rest < len - at {
            stats.malformed.fetch_add(1, Ordering::Relaxed);
        }
        stats.landed.fetch_add(landed as u64, Ordering::Relaxed);
        let mut held = Some(cell);
        for j in 0..landed {
            let Some(mut cell) = held.take() else { break };
            let mut header = [0u8; HEADER_LEN];
            header.copy_from_slice(&self.landing.heads[j * (HEADER_LEN + CHECKSUM_LEN)..][..HEADER_LEN]);
            let p = Packet::new_unchecked(&header[..]);
            match cell.on_landed(binding, &p, now) {
                // At once, as for a fragment received whole: an acknowledgement held to the end of
                // the run made 1 MiB calls with 10% loss resend 40% more fragments.
                CallAction::Ack(a) => {
                    if let Some(peer) = cell.peer {
                        self.send_control(binding, &p, peer, Kind::Ack, &a.to_bytes());
                    }
                    held = Some(cell);
                }
                CallAction::Drop(reason) => {
                    match reason {
                        DropReason::Malformed => stats.malformed.fetch_add(1, Ordering::Relaxed),
                        DropReason::Duplicate => stats.duplicates.fetch_add(1, Ordering::Relaxed),
                        DropReason::Nothing | DropReason::Stale => 0,
                    };
                    held = Some(cell);
                }
                // Not of a fragment that continues a call.
                CallAction::Execute => {
                    stats.malformed.fetch_add(1, Ordering::Relaxed);
                    held = Some(cell);
                }
                // The call is whole (or given up): it runs, or is answered, as any.
                action => {
                    self.landing.forget();
                    self.act(binding, cell, &p, action, now);
                }
            }
        }
        // The slot is let go before the rest of the datagram, which may be for it, is handled.
        drop(held);
        if rest == len - at && rest > 0 {
            let rebuilt = std::mem::take(&mut self.landing.rebuilt);
            for piece in udp::segments(rest, got.segment) {
                self.handle_packet(&rebuilt[piece], from);
            }
            self.landing.rebuilt = rebuilt;
        }
        steps::close();
        Ok(Landed::Received(len))
    }

    /// Forgets the call expected: the next receive takes datagrams whole.
    fn nothing_expected(&self) -> Landed {
        self.landing.forget();
        Landed::NotExpected
    }

    /// Forgets idle bindings and reclaims the memory of stalled calls (one listener, about once a
    /// second).
    fn sweep(&self) {
        let now = Instant::now();
        let n = self.shared.endpoint.expire(now);
        self.shared.stats.expired.fetch_add(n as u64, Ordering::Relaxed);
        let n = self.shared.endpoint.reclaim(now);
        self.shared.stats.reclaimed.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Handles the `n` datagrams one receive brought, in order. Of several, the results of quick
    /// calls are held and sent together at the end (`outbox`); a lone datagram's go out at once.
    /// Returns the bytes received.
    fn handle_batch(&self, n: usize) -> usize {
        let mut bytes = 0;
        let stats = &self.shared.stats;
        if n > 1 {
            stats.batched.fetch_add(1, Ordering::Relaxed);
        }
        self.outbox.borrow_mut().open(n > 1);
        self.end.set(n);
        let mut i = 0;
        while i < self.end.get() {
            self.at.set(i);
            let Some(d) = self.batch.get(i) else { break };
            i += 1;
            match (d.received, d.from) {
                (Received::Datagram(len), Some(from)) => {
                    bytes += len;
                    mark(Point::ServerArrived);
                    if d.segment.is_some() {
                        stats.coalesced.fetch_add(1, Ordering::Relaxed);
                    }
                    for piece in udp::segments(d.bytes.len(), d.segment) {
                        self.handle_packet(&d.bytes[piece], from);
                    }
                    steps::close();
                }
                // Too large for a buffer, or from no IP address: nothing tiercel sent.
                _ => {
                    stats.malformed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        self.send_held();
        self.outbox.borrow_mut().open(false);
        bytes
    }

    /// Leaves the datagrams of the batch after the one being handled to the other listeners.
    fn hand_off_rest(&self) {
        let (next, end) = (self.at.get() + 1, self.end.get());
        if next >= end {
            return;
        }
        self.end.set(next);
        let rest = (next..end).filter_map(|i| self.batch.get(i)).filter_map(|d| match (d.received, d.from) {
            (Received::Datagram(_), Some(from)) => Some((from, d.bytes, d.segment)),
            _ => {
                self.shared.stats.malformed.fetch_add(1, Ordering::Relaxed);
                None
            }
        });
        let n = self.lane().handoff.hand_over(rest);
        self.shared.stats.handed_off.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Sends the results held, together.
    fn send_held(&self) {
        let mut outbox = self.outbox.borrow_mut();
        if !outbox.is_empty() {
            let together = outbox.send(&self.lane().socket);
            self.shared.stats.sent_together.fetch_add(together as u64, Ordering::Relaxed);
        }
    }

    /// Routes a datagram through the server endpoint (`tiercel_proto::endpoint`), which makes every
    /// decision; this runs the procedure and moves the bytes.
    fn handle_packet(&self, bytes: &[u8], from: SocketAddr) {
        let stats = &self.shared.stats;
        let Ok(p) = Packet::new_checked(bytes) else {
            stats.malformed.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let endpoint = &self.shared.endpoint;
        let now = Instant::now();
        let binding = match endpoint.route(&p, now) {
            Route::Binding(b) => b,
            Route::Bind => return self.on_bind(&p, from),
            Route::Reject(h) => return self.send_reject(h, &[], from),
            Route::Malformed => {
                stats.malformed.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        let mut cell = match endpoint.enter(&binding, &p, from, now) {
            Ok(cell) => cell,
            Err(Refusal::Reject(h)) => {
                if h.status == Status::Busy {
                    stats.busy.fetch_add(1, Ordering::Relaxed);
                }
                return self.send_reject(h, &[], from);
            }
            Err(Refusal::Challenge(h, challenge)) => {
                stats.challenged_addresses.fetch_add(1, Ordering::Relaxed);
                return self.send_reject(h, &challenge, from);
            }
        };
        match p.kind() {
            Kind::Call => self.on_call(&binding, cell, &p, now),
            Kind::Ack => {
                if let Some(big) = cell.on_result_ack(&binding, &p, now) {
                    // A large result buffer goes to this worker's spares for the next large call.
                    self.keep_spare(big);
                }
                self.flush(&binding, &mut cell);
            }
            Kind::Cancel => {
                stats.cancelled.fetch_add(1, Ordering::Relaxed);
                // An async procedure running the call stops at its next await.
                #[cfg(feature = "async")]
                if let Some(runner) = &self.shared.asynch {
                    runner.cancel((binding.id, p.slot(), p.seq()));
                }
                if let Some(big) = cell.on_cancel(&binding, &p, now) {
                    self.keep_spare(big);
                }
            }
            _ => match cell.proto.on_probe(p.seq(), now) {
                ProbeAction::Alive => self.send_control(&binding, &p, from, Kind::ProbeReply, &[]),
                ProbeAction::Ack(a) => self.send_control(&binding, &p, from, Kind::Ack, &a.to_bytes()),
                ProbeAction::ResendResult => {
                    cell.resend_result();
                    self.flush(&binding, &mut cell);
                }
                ProbeAction::Drop => {}
            },
        }
    }

    fn on_call(&self, binding: &Arc<UdpBinding>, mut cell: MutexGuard<'_, UdpSlot>, p: &Packet<&[u8]>, now: Instant) {
        mark(Point::ServerValidated);
        let timing = &self.shared.config.timing;
        let multi_packet = p.frag_count() > 1;
        if multi_packet {
            let lent = std::mem::take(&mut self.spares.borrow_mut().message);
            cell.proto.lend(lent);
        }
        let action = cell.on_call(binding, p, now, timing);
        if multi_packet {
            let unused = cell.proto.take_lent();
            if unused.capacity() > 0 {
                self.spares.borrow_mut().message = unused;
            }
            if cell.proto.is_receiving() {
                // The next datagram is likely this call's next fragment: received in place.
                self.landing.expect(binding, p);
            }
        }
        self.act(binding, cell, p, action, now);
    }

    /// Does what the slot's protocol state asked of call packet `p`.
    fn act(
        &self,
        binding: &Arc<UdpBinding>,
        cell: MutexGuard<'_, UdpSlot>,
        p: &Packet<&[u8]>,
        action: CallAction,
        now: Instant,
    ) {
        let timing = &self.shared.config.timing;
        let mut cell = cell;
        match action {
            CallAction::Execute => {
                mark(Point::ServerAccepted);
                self.execute(binding, cell, p, Args::Packet(p.payload()), now);
            }
            CallAction::ExecuteMessage(message) => {
                let len = message.len();
                let spare = self.execute(binding, cell, p, Args::Message(message), now);
                binding.release(len);
                if let Some(spare) = spare {
                    self.keep_spare(spare);
                }
            }
            CallAction::Ack(a) => {
                if let Some(peer) = cell.peer {
                    self.send_control(binding, p, peer, Kind::Ack, &a.to_bytes());
                }
            }
            CallAction::Busy => {
                let peer = cell.peer;
                drop(cell);
                self.shared.stats.busy.fetch_add(1, Ordering::Relaxed);
                if let Some(peer) = peer {
                    self.send_reject(self.shared.endpoint.reject(p, Status::Busy), &[], peer);
                }
            }
            CallAction::ResendResult => {
                self.shared.stats.duplicates.fetch_add(1, Ordering::Relaxed);
                cell.resend_result();
                self.flush(binding, &mut cell);
            }
            CallAction::Refuse(status) => {
                cell.refuse(binding, p, status, timing);
                self.flush(binding, &mut cell);
            }
            CallAction::Drop(DropReason::Duplicate) => {
                self.shared.stats.duplicates.fetch_add(1, Ordering::Relaxed);
            }
            CallAction::Drop(DropReason::Malformed) => {
                self.shared.stats.malformed.fetch_add(1, Ordering::Relaxed);
            }
            // A new fragment held (`Nothing`), or a packet of an older call: nothing to count.
            CallAction::Drop(DropReason::Nothing | DropReason::Stale) => {}
        }
    }

    /// Runs a call with `args` and sends its result. A large call (a message of several packets)
    /// whose procedure runs in place ([`crate::Export::in_place`]) has its result left in the
    /// message's buffer, which the slot then keeps; another has its result marshaled into this
    /// worker's spare result buffer, if it has one: large calls tend to have large results. Returns
    /// a large buffer this worker may keep for the next large call. The slot's lock is not held
    /// while the procedure runs.
    fn execute(
        &self,
        binding: &Arc<UdpBinding>,
        mut cell: MutexGuard<'_, UdpSlot>,
        p: &Packet<&[u8]>,
        args: Args<'_>,
        arrived: Instant,
    ) -> Option<Vec<u8>> {
        #[cfg(feature = "async")]
        // A server without async procedures has no runner: no virtual call on its fast path.
        if self.shared.asynch.is_some() && binding.export.is_async(p.procedure()) {
            drop(cell);
            return match args {
                Args::Packet(bytes) => {
                    self.execute_async(binding, p, bytes, arrived);
                    None
                }
                Args::Message(message) => {
                    self.execute_async(binding, p, &message, arrived);
                    Some(message)
                }
            };
        }
        let large = matches!(args, Args::Message(_));
        let in_place = large && binding.export.in_place(p.procedure());
        let mut out = cell.take_result(binding);
        if large && !in_place {
            let mut spares = self.spares.borrow_mut();
            if spares.result.capacity() > out.capacity() {
                std::mem::swap(&mut out, &mut spares.result);
            }
        }
        drop(cell);
        // Neither results held for the rest of a batch nor the calls behind this one in it wait
        // for a procedure that may be slow.
        let export = Arc::as_ptr(&binding.export) as *const () as usize;
        let batching = self.outbox.borrow().is_open();
        if batching {
            let quick = self.quick.borrow().is_quick(export, p.procedure());
            if !quick {
                self.hand_off_rest();
            }
            if self.outbox.borrow().due_before(quick, arrived) {
                self.send_held();
            }
        }
        out.resize(HEADER_LEN, 0);
        let endpoint = &self.shared.endpoint;
        self.shared.stats.calls.fetch_add(1, Ordering::Relaxed);
        endpoint.run_started(binding);
        let lane = self.lane();
        lane.started.fetch_add(1, Ordering::Relaxed);
        lane.running.fetch_add(1, Ordering::AcqRel);
        let arrival =
            Arrival { at: Some(arrived), context: p.flags() & flags::CONTEXT != 0, deadline: None, transport: "udp" };
        let limit = self.shared.config.timing.max_message;
        let procedure = p.procedure();
        // The result's buffer, where its bytes start in it, and the large buffer left over.
        let (status, mut result, body, spare) = match args {
            Args::Packet(bytes) => {
                let status = run_procedure(
                    &self.shared,
                    &binding.export,
                    procedure,
                    bytes,
                    arrival,
                    &mut out,
                    HEADER_LEN,
                    limit,
                );
                (status, out, HEADER_LEN, None)
            }
            Args::Message(mut message) if in_place => {
                match run_in_place(
                    &self.shared,
                    &binding.export,
                    procedure,
                    &mut message,
                    0,
                    arrival,
                    &mut out,
                    HEADER_LEN,
                ) {
                    Ok(body) if message.len().saturating_sub(body) > binding.frag_payload() => {
                        self.shared.stats.in_place.fetch_add(1, Ordering::Relaxed);
                        (Status::Ok, message, body, None)
                    }
                    Ok(body) => {
                        // A small result: sent from the slot's own buffer, behind its header.
                        out.extend_from_slice(message.get(body..).unwrap_or_default());
                        (Status::Ok, out, HEADER_LEN, Some(message))
                    }
                    Err(status) => (status, out, HEADER_LEN, Some(message)),
                }
            }
            Args::Message(message) => {
                let status = run_procedure(
                    &self.shared,
                    &binding.export,
                    procedure,
                    &message,
                    arrival,
                    &mut out,
                    HEADER_LEN,
                    limit,
                );
                (status, out, HEADER_LEN, Some(message))
            }
        };
        endpoint.run_finished(binding);
        lane.running.fetch_sub(1, Ordering::AcqRel);
        if batching {
            self.quick.borrow_mut().observe(export, p.procedure(), arrived.elapsed());
        }
        if large
            && body == HEADER_LEN
            && result.len() <= binding.max_datagram
            && result.capacity() > binding.max_datagram
        {
            // A small result in the large spare: the slot keeps it in a small buffer instead.
            let mut spares = self.spares.borrow_mut();
            let mut small = std::mem::take(&mut spares.result);
            small.clear();
            small.extend_from_slice(&result);
            spares.result = std::mem::replace(&mut result, small);
        }
        let Some(mut cell) = binding.slot(p.slot()) else { return spare };
        mark(Point::ResultReady);
        cell.complete_in_place(binding, p, status, result, body, &self.shared.config.timing);
        self.flush(binding, &mut cell);
        mark(Point::ResultSent);
        spare
    }

    /// Keeps a large buffer for the next large call's arguments, or failing that its result: the
    /// larger of the two places that the buffer is larger than.
    fn keep_spare(&self, buf: Vec<u8>) {
        let mut spares = self.spares.borrow_mut();
        if buf.capacity() > spares.message.capacity() {
            let displaced = std::mem::replace(&mut spares.message, buf);
            if displaced.capacity() > spares.result.capacity() {
                spares.result = displaced;
            }
        } else if buf.capacity() > spares.result.capacity() {
            spares.result = buf;
        }
    }

    /// Starts a call of an async procedure on the server's runtime; its result is sent from there
    /// when it ends. Meanwhile the slot runs it, as any long call (probes are answered, duplicates
    /// dropped). A call refused at once (its deadline passed, too many in flight, a bad context)
    /// is answered now.
    #[cfg(feature = "async")]
    fn execute_async(&self, binding: &Arc<UdpBinding>, p: &Packet<&[u8]>, args: &[u8], arrived: Instant) {
        // The call's header alone, to answer it later.
        let header = Header { payload_len: 0, message_len: 0, frag_index: 0, frag_count: 1, ..p.header() }.to_bytes();
        let (shared, b, lane) = (self.shared.clone(), binding.clone(), self.lane);
        let finish = move |status: Status, results: Vec<u8>| {
            let p = Packet::new_unchecked(&header[..]);
            let Some(mut cell) = b.slot(p.slot()) else { return };
            let mut out = cell.take_result(&b);
            out.resize(HEADER_LEN, 0);
            out.extend_from_slice(&results);
            cell.complete(&b, &p, status, out, &shared.config.timing);
            flush(&shared, lane, &b, &mut cell, None);
        };
        let arrival =
            Arrival { at: Some(arrived), context: p.flags() & flags::CONTEXT != 0, deadline: None, transport: "udp" };
        let mut message = Vec::new();
        let key = (binding.id, p.slot(), p.seq());
        let limit = self.shared.config.timing.max_message;
        let started = super::dispatch::start_async(
            &self.shared,
            &binding.export,
            p.procedure(),
            args,
            arrival,
            &mut message,
            limit,
            key,
            finish,
        );
        if let Some(Err(status)) = started {
            let Some(mut cell) = binding.slot(p.slot()) else { return };
            if status == Status::Busy {
                // No room for it now: refused as any busy call, nothing recorded, so that the
                // client's retry after backing off is a new call.
                cell.proto.withdraw(p.seq());
                let peer = cell.peer;
                drop(cell);
                if let Some(peer) = peer {
                    self.send_reject(self.shared.endpoint.reject(p, Status::Busy), &[], peer);
                }
                return;
            }
            let mut out = cell.take_result(binding);
            out.resize(HEADER_LEN, 0);
            out.extend_from_slice(&message);
            cell.complete(binding, p, status, out, &self.shared.config.timing);
            self.flush(binding, &mut cell);
        }
    }

    /// Sends the result fragments the slot has queued, counting those sent before as resent; in a
    /// batch, small ones are held to go out with the batch's other results.
    fn flush(&self, binding: &UdpBinding, cell: &mut UdpSlot) {
        flush(&self.shared, self.lane, binding, cell, Some(&mut self.outbox.borrow_mut()));
    }

    fn send_control(&self, binding: &UdpBinding, p: &Packet<&[u8]>, to: SocketAddr, kind: Kind, payload: &[u8]) {
        let h = binding.reply_header(p, kind, Status::Ok, payload.len());
        let _ = transmit::send(
            &self.lane().socket,
            Some(&to),
            &[IoSlice::new(&h.to_bytes()), IoSlice::new(payload)],
            checksummed(p),
        );
    }

    /// Sends a `Reject` header `h` and its payload (empty, or an address challenge) to `to`.
    fn send_reject(&self, h: Header, payload: &[u8], to: SocketAddr) {
        self.shared.stats.rejected.fetch_add(1, Ordering::Relaxed);
        let checksum = h.flags & flags::CHECKSUM != 0;
        let header = h.to_bytes();
        let io = [IoSlice::new(&header), IoSlice::new(payload)];
        let _ = transmit::send(&self.lane().socket, Some(&to), &io, checksum);
    }

    /// Answers a bind request through the server's bind machine: a binding from the table, or the
    /// machine's answer (a challenge or a refusal, never longer than the request).
    fn on_bind(&self, p: &Packet<&[u8]>, from: SocketAddr) {
        let stats = &self.shared.stats;
        let machine = self.shared.bind_machine(self.shared.config.max_datagram);
        let received = HEADER_LEN + p.payload_len() as usize;
        let admission = match machine.on_request(p, &crate::auth::peer_bytes(from), received) {
            BindDecision::Malformed => {
                stats.malformed.fetch_add(1, Ordering::Relaxed);
                return;
            }
            BindDecision::Answer { packet, refused } => {
                self.shared.count_refusal(refused);
                return self.send_packet(from, &packet, checksummed(p));
            }
            BindDecision::Admit(a) if self.shared.refusing_bindings() => {
                stats.rejected.fetch_add(1, Ordering::Relaxed);
                return self.send_packet(from, &a.busy(&machine), checksummed(p));
            }
            BindDecision::Admit(a) => a,
        };
        if let Some((rendezvous, _)) = self.shared.rendezvous.as_ref().filter(|_| admission.request.rendezvous) {
            // A client on this host asks where to bind through shared memory. Only a source on this
            // host is told: loopback, or the very address the server is bound to.
            let ip = from.ip().to_canonical();
            let local = self.lane().socket.local_addr().is_ok_and(|a| a.ip().to_canonical() == ip);
            if ip.is_loopback() || local {
                return self.send_packet(from, &admission.rendezvous(&machine, *rendezvous), checksummed(p));
            }
        }
        let config = &self.shared.config;
        let granted = crate::random::bytes().ok().map(u128::from_le_bytes).and_then(|token| {
            let export = self.shared.exports[admission.export].clone();
            self.shared.endpoint.grant(
                from,
                admission.request.nonce,
                export,
                token,
                Terms { max_datagram: admission.max_datagram as usize, features: admission.features() },
                Instant::now(),
            )
        });
        let Some((binding, new)) = granted else {
            stats.rejected.fetch_add(1, Ordering::Relaxed);
            return self.send_packet(from, &admission.busy(&machine), checksummed(p));
        };
        if new {
            stats.bindings.fetch_add(1, Ordering::Relaxed);
        }
        let reply = admission.grant(&machine, binding.id, binding.token, config.slots_per_binding, 0);
        self.send_packet(from, &reply, checksummed(p));
    }

    fn send_packet(&self, to: SocketAddr, packet: &[u8], checksum: bool) {
        // A failed send is a lost packet: the client retransmits its request.
        let _ = transmit::send(&self.lane().socket, Some(&to), &[IoSlice::new(packet)], checksum);
    }
}

/// Sends the result fragments the slot has queued, counting those sent before as resent. Fragments
/// of a multi-packet result go out in runs, one segmented send each (UDP GSO), when the kernel
/// allows it: every fragment but the message's last is full, so a run is cut where it ends. A small
/// fragment is held in `outbox` instead, when it will take it (a batch is being handled).
/// They go out on socket `lane`: any of the server's sockets sends from its address.
fn flush(shared: &Shared, lane: usize, binding: &UdpBinding, cell: &mut UdpSlot, mut outbox: Option<&mut Outbox>) {
    let socket = &shared.lanes[lane].socket;
    let Some(peer) = cell.peer else { return };
    let again = cell.proto.take_resent();
    if again > 0 {
        shared.stats.resent.fetch_add(u64::from(again), Ordering::Relaxed);
    }
    let checksum = cell.checksummed();
    let full = binding.frag_payload();
    let segment = HEADER_LEN + full + if checksum { CHECKSUM_LEN } else { 0 };
    let run_length = if shared.segmenting.load(Ordering::Relaxed) { transmit::run_length(segment) } else { 0 };
    let mut run = transmit::RunQueue::new();
    while let Some(index) = cell.poll_fragment() {
        if run_length >= 2 {
            if let Fragment::Parts(_, body) = cell.fragment(binding, index) {
                let short = body.len() < full;
                if run.push(index) == run_length || short {
                    send_run(shared, socket, binding, cell, peer, run.take(), segment);
                }
                continue;
            }
        }
        let fragment = cell.fragment(binding, index);
        if let Some(outbox) = outbox.as_deref_mut() {
            let held = match &fragment {
                Fragment::Whole(datagram) => outbox.hold(peer, &[datagram], checksum),
                Fragment::Parts(header, body) => outbox.hold(peer, &[header, body], checksum),
            };
            if held {
                continue;
            }
        }
        // A failed send is a lost packet: the client's timers ask again.
        let _ = send_fragment(socket, fragment, peer, checksum);
    }
    if !run.is_empty() {
        send_run(shared, socket, binding, cell, peer, run.take(), segment);
    }
}

fn send_fragment(
    socket: &UdpSocket,
    fragment: Fragment<'_>,
    peer: SocketAddr,
    checksum: bool,
) -> std::io::Result<usize> {
    match fragment {
        Fragment::Whole(datagram) => transmit::send(socket, Some(&peer), &[IoSlice::new(datagram)], checksum),
        Fragment::Parts(header, body) => {
            transmit::send(socket, Some(&peer), &[IoSlice::new(&header), IoSlice::new(body)], checksum)
        }
    }
}

/// Sends result fragments `run` with one segmented send, or one by one (from now on, server-wide)
/// if the kernel refuses segmentation.
fn send_run(
    shared: &Shared,
    socket: &UdpSocket,
    binding: &UdpBinding,
    cell: &UdpSlot,
    peer: SocketAddr,
    run: &[u16],
    segment: usize,
) {
    let checksum = cell.checksummed();
    let mut headers = [[0u8; HEADER_LEN]; transmit::MAX_RUN];
    let mut bodies: [&[u8]; transmit::MAX_RUN] = [&[]; transmit::MAX_RUN];
    for ((h, b), &index) in headers.iter_mut().zip(bodies.iter_mut()).zip(run) {
        if let Fragment::Parts(header, body) = cell.fragment(binding, index) {
            (*h, *b) = (header, body);
        }
    }
    let mut parts = [IoSlice::new(&[]); 2 * transmit::MAX_RUN];
    let mut ends = [0usize; transmit::MAX_RUN];
    for (i, (h, b)) in headers.iter().zip(&bodies).take(run.len()).enumerate() {
        parts[2 * i] = IoSlice::new(h);
        parts[2 * i + 1] = IoSlice::new(b);
        ends[i] = 2 * i + 2;
    }
    let k = 2 * run.len();
    if let Err(e) = transmit::send_run(socket, Some(&peer), &parts[..k], &ends[..run.len()], checksum, segment) {
        if tiercel_sys::udp::is_segmentation_refused(&e) {
            shared.segmenting.store(false, Ordering::Relaxed);
            for pair in parts[..k].chunks(2) {
                let _ = transmit::send(socket, Some(&peer), pair, checksum);
            }
        }
    }
}
