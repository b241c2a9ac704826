//! The server side of the UDP transport: a worker thread: receive, validate, find the slot, run the procedure inline, send the result.
//!
//! The fast path of the server is `UdpWorker::listen` → `handle_batch` → `handle_packet` → `on_call`
//! → `execute`: one `recvmsg` into the worker's buffer, an O(1) header check, the binding and slot
//! found by index, the procedure run with arguments borrowed from that buffer,
//! results marshaled into the slot's result buffer behind a prebuilt header, one `sendmsg`. The
//! slot's lock is not held while the procedure runs. When calls queue, one `recvmmsg` takes up to 16
//! of them, and the results of the quick ones go out together with one `sendmmsg` (`outbox`), those
//! of one client's calls that came together (several threads of one binding sharing a socket) with
//! one segmented send, which the client takes whole; the calls behind one that may be slow are left
//! to the other listeners (`handoff`). While a large call's fragments arrive, the next receive puts
//! them straight into its reassembly (`landing`).
//! A server may have several sockets on its port (`Lane`, `ServerConfig::sockets`): each worker
//! reads one at a time, and the crew says which.
//!
//! This file is the worker's loop and its decisions on each packet; `receiving` puts a large
//! call's fragments in place, `running` runs calls (here or on the async runtime), and `sending`
//! sends results, control answers, rejects and bind replies.

use std::cell::{Cell, RefCell};
use std::io::{IoSlice, IoSliceMut};
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tiercel_proto::bind::BindDecision;
use tiercel_proto::endpoint::{Fragment, Quiet, Refusal, Route, Step, Terms};
use tiercel_proto::server::CallAction;
use tiercel_proto::wire::{flags, Header, Kind, Packet, Status, CHECKSUM_LEN, HEADER_LEN};
use tiercel_sys::clock;
use tiercel_sys::mmsg::{self, RecvBatch, MAX_BATCH};
use tiercel_sys::udp::{self, Received};

use super::dispatch::{run_in_place, run_procedure, Arrival};
use super::handoff::Handoff;
use super::landing::{gather, Landing, MAX_LANDED, MAX_PARTS};
use super::outbox::{Outbox, QuickProcedures, MAX_HELD, QUICK_RUN};
use super::{EndpointBinding, Shared, UdpSlot};
use crate::retention::{KEEP_IDLE, SPARES_IDLE};
use crate::secure::Session;
use crate::steps::{self, mark, Point};
use crate::transmit;
use crate::waiting::crew::Standby;
use crate::waiting::leases::SpinLease;

mod receiving;
mod running;
mod sealed;
mod sending;

/// What [`UdpWorker::receive_in_place`] did.
enum Landed {
    /// No large call is being received: nothing was read.
    NotExpected,
    /// Nothing was waiting.
    Nothing,
    /// A datagram (or run) of this many bytes was received and handled.
    Received(usize),
}

/// The server's AF_XDP workers: which reads the station, and how far each is in the datagrams it has
/// handled (the reader's only store per datagram: no clock is read).
pub(super) struct XdpCrew {
    /// The worker reading the station.
    reader: AtomicUsize,
    /// Twice the datagrams each worker has handled, plus one while it handles one.
    handling: Box<[AtomicU64]>,
}

impl XdpCrew {
    pub(super) fn new(workers: usize) -> XdpCrew {
        XdpCrew { reader: AtomicUsize::new(0), handling: (0..workers).map(|_| AtomicU64::new(0)).collect() }
    }

    /// Worker `me` handles a datagram with `handle`.
    #[inline]
    fn handle(&self, me: usize, handle: impl FnOnce()) {
        let Some(count) = self.handling.get(me) else { return handle() };
        let n = count.load(Ordering::Relaxed);
        count.store(n + 1, Ordering::Release);
        handle();
        count.store(n + 2, Ordering::Release);
    }

    /// Waits, then reads in the reader's stead if it is handling the very datagram it was at the
    /// last look (`seen`), a wait of at least a tick ago (it stands by once that call is over). The
    /// deputy (the first worker standing by) waits `waited`: a tick after a look that found the
    /// reader on the datagram of the look before, else twice the last wait, up to 8 ms (as the
    /// deputy of the UDP listeners looks, `waiting::crew::next_look`): while calls are quick, 125
    /// looks a second, and a long call is taken over within about 17 ms. The others look every
    /// 100 ms: one of them takes over only while the deputy itself is running a long call as the
    /// reader.
    fn stand_by(&self, me: usize, waited: &mut Duration, seen: &mut (usize, u64)) {
        let reader = self.reader.load(Ordering::Acquire);
        let deputy = usize::from(reader == 0);
        std::thread::park_timeout(if me == deputy { *waited } else { SPARES_IDLE });
        let reader = self.reader.load(Ordering::Acquire);
        let at = self.handling.get(reader).map_or(0, |c| c.load(Ordering::Acquire));
        // On one datagram since the last look: a long call. Quick calls look free to the backoff.
        let stuck = at & 1 == 1 && *seen == (reader, at);
        if stuck {
            let _ = self.reader.compare_exchange(reader, me, Ordering::AcqRel, Ordering::Acquire);
        }
        *seen = (reader, at);
        *waited = crate::waiting::crew::next_look(*waited, stuck);
    }
}

/// Whether a reply to `p` carries a checksum trailer: when `p` did.
fn checksummed(p: &Packet<&[u8]>) -> bool {
    p.flags() & flags::CHECKSUM != 0
}

/// How often worker 0 looks for idle bindings.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Looks at an AF_XDP port between two looks at the clock while a worker spins for the next
/// datagram: a look makes no system call, and a clock read at every one (31 ns on our VM) would
/// lengthen each turn of the spin, and so the time a datagram may wait to be seen.
const XDP_LOOKS: u32 = 16;

/// Looks at the socket that may find nothing, after datagrams were handled, before a listener that
/// does not spin (`ServerConfig::spin` zero, or its spin lease refused) or has spun its time waits:
/// its first look and nine more, each a system call; as many as the raw blocking echo beneath the
/// bench's blocking rows makes (`DRAIN_LOOKS` in tiercel-bench). A listener asleep must be woken
/// by the next datagram, which on our VM takes tens of µs and some of the sender's CPU. With
/// spinning off, blocking callers on one CPU (a scratch client, 1 s each, servers looking 3, 6, 10
/// and 20 times in turn, three rounds) made, calls a second, at two callers 27,935-29,862,
/// 29,246-33,330, 30,150-33,643 and 33,200-43,105; at four 77,388-78,974, 97,688-101,108,
/// 122,131-129,614 and 169,002-196,265; at eight 251,598-284,269, 295,249-311,377,
/// 302,220-323,761 and 310,806-325,679 (the raw echo's, looking ten times: 27,684-29,217,
/// 94,987-112,934, 359,217-389,885). A lone caller's call costs the server these looks, after its
/// result went out: about 26 µs of the server's CPU a call with three looks and with ten (the wake-up's).
pub(crate) const IDLE_LOOKS: u32 = 10;

/// A spinning listener that finds nothing reads the clock (for the end of its spin, and as when
/// what it receives next came) on one turn of its loop in this many. Each turn read it twice: 94
/// ns on our VM (a read takes 47 ns), and 12% of a spinning server's time in a profile. (Three
/// runs of each build, alternating, could not tell the Null call's latency apart: 1.153, 1.187
/// and 1.172 times the raw ping-pong before, 1.180, 1.162 and 1.157 after.) A spin overruns its
/// budget by at most eight turns, and a datagram's arrival time may be early by as much.
const SPIN_CLOCK: u32 = 8;

/// How many more looks at its socket a listener makes before it waits: [`IDLE_LOOKS`] after
/// datagrams were handled, and none when the last wait or the spin ran out with nothing found.
#[derive(Debug, Default)]
pub(crate) struct Looks {
    left: u32,
}

impl Looks {
    /// Datagrams were handled: the next looks may find nothing [`IDLE_LOOKS`] times in a row.
    #[inline]
    pub(crate) fn found(&mut self) {
        self.left = IDLE_LOOKS - 1;
    }

    /// A look found nothing (and the spin, if any, is over): whether to look again rather than wait.
    #[inline]
    pub(crate) fn again(&mut self) -> bool {
        let again = self.left > 0;
        self.left = self.left.saturating_sub(1);
        again
    }
}

/// One of the server's UDP sockets (`ServerConfig::sockets`), with what the workers reading it
/// share.
pub(super) struct Lane {
    socket: UdpSocket,
    /// Whether the socket can take runs of datagrams whole (UDP GRO: the kernel agreed when it
    /// opened), so that receives must be cut, and receive buffers have room for a run.
    coalescing: bool,
    /// Held while the socket's GRO option is set, so that `takes_runs` is what the socket has: a
    /// run and the sweep may meet.
    gro_setting: Mutex<()>,
    /// Whether it does now: GRO costs the kernel more for every datagram the socket receives
    /// ([`udp::set_gro`]), so it is on only while runs come (calls of several fragments, or
    /// calls of several threads sent together): turned on by the first, off by the sweep once
    /// none has come for [`KEEP_IDLE`]. The listeners read it on every look, without the lock: it
    /// is set before the option is turned on and cleared once it is off, so that a listener that
    /// reads it clear receives with a plain `recvfrom` (cheaper than the `recvmsg` a run's segment
    /// size takes) from a socket that takes no runs. One that read it just before a run turned the
    /// option on may read that run as one datagram: malformed, dropped and counted, and sent again
    /// by the client's timers, as a run that meets the sweep is.
    takes_runs: AtomicBool,
    /// When the last run came through this socket (`clock::ticks`).
    large_at: AtomicU64,
    /// Datagrams a worker took in a batch from this socket and left to its other listeners.
    handoff: Handoff,
    /// Procedures that this socket's listeners have started, or about as many: whether any started
    /// between two of the deputy's looks. Its listeners add to it with a load and a store, not a
    /// locked add (no read-modify-write of a shared line on the path of every call): two that start
    /// calls at once may count one, and the count still moves.
    started: AtomicU64,
    /// Whether the socket's receives may block, for at most
    /// [`RECEIVE_WAIT`](crate::waiting::RECEIVE_WAIT) (the kernel took the read timeout): a
    /// listener's first wait after calls is then a blocking receive, the look and
    /// the wait in one system call, where a wait in its waiter (`epoll`) and a receive after it
    /// take two. The cost: a datagram handed over by another worker ([`Handoff`]) and the server
    /// stopping wait for that receive to end, at most `RECEIVE_WAIT` (a tick of the kernel's
    /// clock, 4 ms at 250 Hz), where the waiter wakes for them at once. After a receive that found
    /// nothing, the listener waits in its waiter until a datagram comes. A lone blocking caller's
    /// Null over UDP (`bench --quick --blocking --latency-only --transports udp`, the builds
    /// alternating) took 1.122× the raw blocking ping-pong, median of eight runs (1.147, 1.121,
    /// 1.148, 1.103, 1.134, 1.112, 1.124, 1.118), where waiting in the waiter alone it took 1.149×
    /// (1.134, 1.104, 1.156, 1.174, 1.142, 1.157, 1.162, 1.134).
    receive_wait: bool,
}

/// Most AF_XDP workers of a server: one reads the port, the others take over from a long call.
pub(super) const MAX_XDP_WORKERS: usize = 4;

/// What one UDP worker is running, on a cache line of its own: `i + 1` while it runs a call it read
/// from socket `i` (`Shared::lanes`), else 0. Only the worker writes it, with a plain store on the path
/// of its calls (where a count of each socket's running calls took two locked adds a call on a
/// line every worker writes); the crew, asking how many of a socket's listeners are running calls
/// ([`Shared::running_on`]), counts the workers that are.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Running(AtomicUsize);

impl Shared {
    /// How many workers are running calls read from socket `lane`.
    pub(super) fn running_on(&self, lane: usize) -> usize {
        self.udp_running.iter().filter(|r| r.0.load(Ordering::Acquire) == lane + 1).count()
    }
}

impl Lane {
    /// A lane reading `socket`, whose datagrams are at most `datagram` bytes (a coalesced run more).
    pub(super) fn new(socket: UdpSocket, datagram: usize) -> Lane {
        // Asked for, then off until a large call comes.
        let coalescing = udp::set_gro(&socket, true);
        let gro = coalescing && !udp::set_gro(&socket, false);
        let receive_wait = udp::set_receive_wait(&socket, crate::waiting::RECEIVE_WAIT).is_some();
        Lane {
            coalescing,
            gro_setting: Mutex::new(()),
            takes_runs: AtomicBool::new(gro),
            large_at: AtomicU64::new(0),
            socket,
            handoff: Handoff::new(datagram),
            started: AtomicU64::new(0),
            receive_wait,
        }
    }

    /// A run came through this socket (a call of several fragments, or calls a client sent
    /// together): the next runs are taken whole from now on.
    fn runs_come(&self) {
        self.large_at.store(clock::ticks(), Ordering::Relaxed);
        if self.coalescing {
            let _setting = self.gro_setting.lock().unwrap_or_else(|p| p.into_inner());
            if !self.takes_runs.load(Ordering::Relaxed) {
                self.takes_runs.store(true, Ordering::Relaxed);
                let on = udp::set_gro(&self.socket, true);
                self.takes_runs.store(on, Ordering::Relaxed);
            }
        }
    }

    /// Turns GRO off once no run has come for [`KEEP_IDLE`]. A run the socket took whole just
    /// before is then read as one datagram, malformed, and its datagrams are sent again by the
    /// client's timers.
    fn quiet(&self) {
        let _setting = self.gro_setting.lock().unwrap_or_else(|p| p.into_inner());
        if self.takes_runs.load(Ordering::Relaxed)
            && clock::elapsed(self.large_at.load(Ordering::Relaxed), clock::ticks()) >= KEEP_IDLE
        {
            let off = udp::set_gro(&self.socket, false);
            self.takes_runs.store(!off, Ordering::Relaxed);
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
    /// Where sealed datagrams are opened (and handshakes read): one datagram's room, made at the
    /// first.
    opened: RefCell<Vec<u8>>,
    /// When the datagram being handled came: the clock as this worker's loop last read it before
    /// the receive that brought it (at most [`SPIN_CLOCK`] turns of the loop earlier), so that handling a lone
    /// datagram reads no clock of its own; for each datagram of a batch of several, when its
    /// handling starts.
    received_at: Cell<Instant>,
    /// This worker's count of the calls it ran (the server's `calls`, summed with the others').
    calls: crate::counters::Shard,
    /// The binding of the last packet routed, kept for the next ([`tiercel_proto::endpoint::Held`]).
    held: Cell<tiercel_proto::endpoint::Held<SocketAddr, Arc<dyn crate::Export>>>,
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
        let calls = shared.call_shards.take();
        let shared_key = shared.config.key.is_some();
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
            // Made now rather than at the first sealed datagram: a call never allocates it.
            opened: RefCell::new(if shared_key { Vec::with_capacity(size) } else { Vec::new() }),
            received_at: Cell::new(Instant::now()),
            calls,
            held: Cell::default(),
        }
    }

    /// The socket this worker reads, and what its listeners share.
    #[inline]
    fn lane(&self) -> &Lane {
        &self.shared.lanes[self.lane]
    }

    /// Runs the worker: listening (see `crew`) or standing by, until the server stops.
    pub(super) fn run(mut self) {
        if self.shared.config.key.is_some() {
            transmit::prepare_sealing();
        }
        self.shared.pin(self.index);
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
            let running = |i| shared.running_on(i);
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
        // by has none, and a listener's is registered on the socket only from a wait until it
        // spins: every waiter registered is visited for every datagram that arrives (16 of them
        // made a Null call 0.7 µs slower; one, 0.2 to 0.5 µs slower than none).
        self.waiter = udp::ExclusiveWaiter::new(&self.lane().socket).ok();
        // Datagrams another worker leaves wake a listener asleep as datagrams in the socket do.
        // (Refused, they wake with the next datagram, at the latest a retransmission of theirs.)
        if let (Some(w), Some(nudge)) = (&self.waiter, self.lane().handoff.nudge()) {
            let _ = w.also(nudge.as_fd());
        }
        // The server stopping wakes every listener. (Refused, they notice within `SPARES_IDLE`.)
        if let Some(w) = &self.waiter {
            let _ = w.also_every(self.shared.stopping.as_fd());
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
        let mut looks = Looks::default();
        // Turns in a row that found nothing while spinning: the loop reads the clock on one in
        // `SPIN_CLOCK` of them, and on every turn after one that found something.
        let (mut idle, mut now) = (0u32, Instant::now());
        // Whether this listener's last wait was in the receive and found nothing: the next is in
        // its waiter, until something comes.
        let mut waited_in_receive = false;
        // When this listener last found a datagram: it stands by only a while after that (see
        // `Crew::should_stand_by`).
        let mut found_at = Instant::now();
        while !self.shared.stop.load(Ordering::Relaxed) {
            if idle.is_multiple_of(SPIN_CLOCK) {
                now = Instant::now();
            }
            let idle_before = std::mem::take(&mut idle);
            self.received_at.set(now);
            if found > 0 {
                // The last look found datagrams (and this one read the clock after their calls).
                found_at = now;
            }
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
                looks.found();
                found_at = Instant::now();
                spin_until = self.spin_on(spin_until);
                continue;
            }
            if !queueing {
                match self.receive_in_place() {
                    Ok(Landed::NotExpected) => {}
                    Ok(Landed::Nothing) => {
                        if now < spin_until {
                            idle = idle_before + 1;
                            core::hint::spin_loop();
                            continue;
                        }
                    }
                    Ok(Landed::Received(bytes)) => {
                        (found, found_bytes) = (1, bytes);
                        looks.found();
                        spin_until = self.spin_on(spin_until);
                        continue;
                    }
                    Err(_) => self.landing.forget(),
                }
            }
            let lane = &self.shared.lanes[self.lane];
            let received = if queueing {
                self.batch.recv_nowait(&lane.socket, MAX_BATCH)
            } else if lane.takes_runs.load(Ordering::Relaxed) {
                self.batch.recv_one_nowait(&lane.socket)
            } else {
                self.batch.recv_one_from_nowait(&lane.socket)
            };
            match received {
                Ok(0) => {}
                Ok(n) => {
                    found = n as u32;
                    found_bytes = self.handle_batch(n);
                    looks.found();
                    spin_until = self.spin_on(spin_until);
                    continue;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
            if now < spin_until {
                idle = idle_before + 1;
                core::hint::spin_loop();
                continue;
            }
            if looks.again() {
                continue;
            }
            // Nothing to read for a while (`Crew::should_stand_by`): stand by rather than wait
            // beside another listener that is free (a listener with calls waiting in the socket
            // keeps taking them).
            if self.shared.crew.should_stand_by(
                self.lane,
                || Instant::now().saturating_duration_since(found_at),
                || self.shared.running_on(self.lane),
            ) {
                break;
            }
            self.lease.give_back();
            self.let_go();
            steps::slept(steps::Side::Server);
            let lane = &self.shared.lanes[self.lane];
            if lane.receive_wait && !waited_in_receive && !lane.takes_runs.load(Ordering::Relaxed) {
                // The first wait after calls is in the receive (see `Lane::receive_wait`), with the
                // socket out of the waiter's set: else every datagram visits the set on its way to
                // this receive (a system call the first time after a wait in the waiter; none while
                // calls keep coming).
                if let Some(w) = &self.waiter {
                    w.disarm();
                }
                waited_in_receive = true;
                match self.batch.recv_one_from_wait(&lane.socket) {
                    Ok(0) => {}
                    Ok(n) => {
                        self.shared.crew.woke();
                        now = Instant::now();
                        self.received_at.set(now);
                        (found, last_look) = (n as u32, now);
                        found_bytes = self.handle_batch(n);
                        looks.found();
                        spin_until = self.spin_on(spin_until);
                        waited_in_receive = false;
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(1)),
                }
                continue;
            }
            let ready = match self.waiter.as_ref().map(|w| w.wait(Some(SPARES_IDLE))) {
                Some(Ok(ready)) => Ok(ready),
                // No waiter, or its set refused the socket: `poll` waits as well (for the
                // socket only: datagrams handed over wake it with the next one to arrive).
                _ => udp::wait_readable(&self.lane().socket, Some(SPARES_IDLE)),
            };
            match ready {
                // A datagram after a wait: calls may be coming again, and the deputy looks.
                Ok(true) => {
                    self.shared.crew.woke();
                    waited_in_receive = false;
                }
                // A while without a packet: give the spare buffers back.
                Ok(false) => {
                    drop(self.spares.take());
                    self.landing.free();
                }
                Err(_) => {}
            }
        }
        self.lease.give_back();
        self.let_go();
        self.waiter = None;
    }

    /// Lets go of the binding held for the next packet ([`UdpWorker::held`]), before a wait: a
    /// binding held by a worker does not expire.
    fn let_go(&self) {
        let mut held = self.held.take();
        held.let_go();
        self.held.set(held);
    }

    /// After datagrams were handled: until when the listener spins for the next (`spin_until`
    /// unchanged without a spin lease). A listener that will spin takes its socket out of its
    /// waiter's epoll set, where every datagram that arrives would visit it, until it waits again
    /// there: a server that spins pays one system call a wake-up for it (the first time after a
    /// wait; while calls stream in, none). One that never spins takes it out before it waits in
    /// its receive (`Lane::receive_wait`), at the same price.
    #[inline]
    fn spin_on(&mut self, spin_until: Instant) -> Instant {
        if !self.lease.take() {
            return spin_until;
        }
        if let (Some(w), false) = (&self.waiter, self.shared.config.spin.is_zero()) {
            w.disarm();
        }
        Instant::now() + self.shared.config.spin
    }

    /// Reads the server's AF_XDP port (`ServerConfig::xdp`) and runs what arrives, as `listen` reads
    /// a socket: each datagram handled as it comes (no batches, none received in place), spinning
    /// for `ServerConfig::spin` after each (a look at the clock every `XDP_LOOKS` looks at the
    /// port, so that a datagram is seen within a look's time), then blocking. One of the server's
    /// AF_XDP workers (this is worker `me` of `crew`) reads at a time; the others stand by, and one
    /// of them reads in its stead once it has been running one call for a while
    /// ([`XdpCrew::stand_by`]), so that a long procedure holds up only its own caller. Returns when the server stops; the port goes back to
    /// the kernel when the last worker has.
    pub(super) fn run_xdp(self, port: Arc<crate::xdp::Port>, crew: Arc<XdpCrew>, me: usize) {
        if self.shared.config.key.is_some() {
            transmit::prepare_sealing();
        }
        self.shared.pin(self.index);
        // Peers as the server's own socket names them: IPv4-mapped on an IPv6 socket.
        let mapped = self.lane().socket.local_addr().is_ok_and(|a| a.is_ipv6());
        let mut buf = vec![0u8; self.shared.config.max_datagram.max(tiercel_proto::wire::MAX_UDP_PAYLOAD)];
        let spin = self.shared.config.spin;
        let mut spin_until = Instant::now();
        self.received_at.set(spin_until);
        let (mut waited, mut seen) = (crate::waiting::crew::TICK, (usize::MAX, 0));
        let mut looks = 0u32;
        while !self.shared.stop.load(Ordering::Relaxed) {
            if crew.reader.load(Ordering::Acquire) != me {
                self.let_go();
                crew.stand_by(me, &mut waited, &mut seen);
                spin_until = Instant::now();
                self.received_at.set(spin_until);
                continue;
            }
            if let Some((n, from)) = port.station.recv(port.port, &mut buf) {
                mark(Point::ServerArrived);
                let from = match mapped {
                    false => SocketAddr::V4(from),
                    true => SocketAddr::V6(std::net::SocketAddrV6::new(from.ip().to_ipv6_mapped(), from.port(), 0, 0)),
                };
                crew.handle(me, || self.handle_packet(&buf[..n], from));
                steps::close();
                let now = Instant::now();
                self.received_at.set(now);
                spin_until = now + spin;
                continue;
            }
            looks = looks.wrapping_add(1);
            if !looks.is_multiple_of(XDP_LOOKS) {
                core::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            self.received_at.set(now);
            if now < spin_until {
                core::hint::spin_loop();
                continue;
            }
            self.let_go();
            steps::slept(steps::Side::Server);
            if let Ok(false) = port.station.wait(port.port, Some(SPARES_IDLE)) {
                // A while without a packet: give the spare buffers back.
                drop(self.spares.take());
            }
            self.received_at.set(Instant::now());
        }
    }

    /// Forgets idle bindings and reclaims the memory of stalled calls (one listener, about once a
    /// second).
    fn sweep(&self) {
        for lane in &self.shared.lanes {
            lane.quiet();
        }
        // This worker's own hold would keep its binding from expiring until a later sweep.
        self.let_go();
        let now = Instant::now();
        let n = self.shared.endpoint.expire(now);
        self.shared.stats.expired.fetch_add(n as u64, Ordering::Relaxed);
        let n = self.shared.endpoint.reclaim(now);
        self.shared.stats.reclaimed.fetch_add(n as u64, Ordering::Relaxed);
        if self.shared.config.key.is_some() {
            let endpoint = &self.shared.endpoint;
            self.shared.sessions.retain(|id, token| endpoint.lookup(id, token).is_some());
        }
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
        // A lone datagram may be a run taken whole (UDP GRO): its calls are a batch too.
        let whole = self.batch.segment(0).is_some();
        let several = n > 1 || whole;
        if whole {
            // Runs still come, and the socket takes them whole already.
            self.lane().large_at.store(clock::ticks(), Ordering::Relaxed);
        } else if n > 1 && self.first_two_from_one_address() {
            // A client sends its calls in runs (several threads' calls together): the socket
            // takes them whole from now on, until runs stop coming ([`Lane::quiet`]).
            self.lane().runs_come();
        }
        self.outbox.borrow_mut().open(several);
        self.end.set(n);
        let mut i = 0;
        while i < self.end.get() {
            self.at.set(i);
            let Some(d) = self.batch.get(i) else { break };
            i += 1;
            match (d.received, d.from) {
                (Received::Datagram(len), Some(from)) => {
                    bytes += len;
                    if several {
                        // Each of a batch is handled from when its handling starts: whether its
                        // procedure is quick, and how long a result is held, are its own.
                        self.received_at.set(Instant::now());
                    }
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

    /// Whether the first two datagrams of the batch came from one address (a client sending runs,
    /// to a socket that does not take them whole).
    fn first_two_from_one_address(&self) -> bool {
        let from = |i| self.batch.get(i).and_then(|d| d.from);
        from(0).is_some() && from(0) == from(1)
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
            let together = outbox.send(&self.lane().socket, &self.shared.segmenting);
            self.shared.stats.sent_together.fetch_add(together as u64, Ordering::Relaxed);
        }
    }

    /// Routes a datagram through the server endpoint (`tiercel_proto::endpoint`), which makes every
    /// decision; this runs the procedure and moves the bytes. A sealed datagram (to a server with a
    /// key) is opened first (`secure`).
    fn handle_packet(&self, bytes: &[u8], from: SocketAddr) {
        if tiercel_proto::seal::is_sealed(bytes) {
            if self.shared.config.key.is_some() {
                return self.on_sealed(bytes, from);
            }
            // A secure client's handshake, to a server without a key: it is told, within the
            // handshake budget, and the datagram counted.
            self.shared.stats.unopened.fetch_add(1, Ordering::Relaxed);
            let hello =
                tiercel_proto::seal::Outer::parse(bytes).is_ok_and(|o| o.kind == tiercel_proto::seal::SealType::Hello);
            if hello && self.shared.handshakes.take(from.ip()) {
                self.unreadable(from);
            }
            return;
        }
        self.handle_opened(bytes, from, None);
    }

    /// [`UdpWorker::handle_packet`] of a packet that came plain (`seal` is `None`), or sealed and
    /// opened with the keys `seal` of its binding; the answers to it go the same way.
    fn handle_opened(&self, bytes: &[u8], from: SocketAddr, seal: Option<&Session>) {
        let stats = &self.shared.stats;
        let Ok(p) = Packet::new_checked(bytes) else {
            stats.malformed.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let endpoint = &self.shared.endpoint;
        let now = self.received_at.get();
        let mut held = self.held.take();
        let route = endpoint.route_held(&mut held, &p, seal.map(Session::index), now);
        let binding = match route {
            Route::Binding(b) => b,
            other => {
                self.held.set(held);
                match other {
                    Route::Bind => self.on_bind(&p, from),
                    Route::Reject(h) => self.send_reject(h, &[], from, seal),
                    _ if seal.is_some() || self.shared.config.key.is_some() => {
                        stats.unopened.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {
                        stats.malformed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                return;
            }
        };
        self.handle_routed(&binding, &p, from, now, seal);
        held.keep(binding);
        self.held.set(held);
    }

    /// [`UdpWorker::handle_opened`] of a packet routed to `binding`.
    fn handle_routed(
        &self,
        binding: &Arc<EndpointBinding>,
        p: &Packet<&[u8]>,
        from: SocketAddr,
        now: Instant,
        seal: Option<&Session>,
    ) {
        let (stats, endpoint) = (&self.shared.stats, &self.shared.endpoint);
        let mut cell = match endpoint.enter(binding, p, from, now) {
            Ok(cell) => cell,
            Err(Refusal::Reject(h)) => {
                if h.status == Status::Busy {
                    stats.busy.fetch_add(1, Ordering::Relaxed);
                }
                return self.send_reject(h, &[], from, seal);
            }
            Err(Refusal::Challenge(h, challenge)) => {
                stats.challenged_addresses.fetch_add(1, Ordering::Relaxed);
                return self.send_reject(h, &challenge, from, seal);
            }
        };
        if p.kind() == Kind::Call {
            return self.on_call(binding, cell, p, now, seal);
        }
        let (step, spare) = endpoint.control_step(binding, &mut cell, p, now);
        if let Some(big) = spare {
            // A large result buffer goes to this worker's spares for the next large call.
            self.keep_spare(big);
        }
        if step == Step::Quiet(Quiet::Cancelled) {
            // An async procedure running the call stops at its next await.
            #[cfg(feature = "async")]
            if let Some(runner) = &self.shared.asynch {
                runner.cancel((binding.id, p.slot(), p.seq()));
            }
        }
        self.step(binding, cell, p, step, now);
    }

    fn on_call(
        &self,
        binding: &Arc<EndpointBinding>,
        mut cell: MutexGuard<'_, UdpSlot>,
        p: &Packet<&[u8]>,
        now: Instant,
        seal: Option<&Session>,
    ) {
        mark(Point::ServerValidated);
        let timing = &self.shared.config.timing;
        let multi_packet = p.frag_count() > 1;
        if multi_packet {
            if transmit::run_length(binding.max_datagram + CHECKSUM_LEN) >= 2 {
                // Its client sends fragments in runs (its datagrams are small enough).
                self.lane().runs_come();
            }
            let lent = std::mem::take(&mut self.spares.borrow_mut().message);
            cell.proto.lend(lent);
        }
        let action = cell.on_call(binding, p, now, timing);
        if multi_packet {
            if action == CallAction::Refuse(Status::TooLarge) {
                self.shared.stats.too_large.fetch_add(1, Ordering::Relaxed);
            }
            let unused = cell.proto.take_lent();
            if unused.capacity() > 0 {
                self.spares.borrow_mut().message = unused;
            }
            if cell.proto.is_receiving() {
                // The next datagram is likely this call's next fragment: received in place (a
                // sealed one opened there).
                self.landing.expect(binding, p, || seal.and_then(|s| self.shared.sessions.get(s.index())));
            }
        }
        self.act(binding, cell, p, action, now);
    }

    /// Does what the slot's protocol state asked of call packet `p`.
    fn act(
        &self,
        binding: &Arc<EndpointBinding>,
        mut cell: MutexGuard<'_, UdpSlot>,
        p: &Packet<&[u8]>,
        action: CallAction,
        now: Instant,
    ) {
        let step = self.shared.endpoint.call_step(binding, &mut cell, p, action);
        self.step(binding, cell, p, step, now);
    }

    /// Does what the endpoint decided for packet `p` of the slot `cell`.
    fn step(
        &self,
        binding: &Arc<EndpointBinding>,
        mut cell: MutexGuard<'_, UdpSlot>,
        p: &Packet<&[u8]>,
        step: Step,
        now: Instant,
    ) {
        let stats = &self.shared.stats;
        match step {
            Step::Run => {
                mark(Point::ServerAccepted);
                self.execute(binding, cell, p, Args::Packet(p.payload()), now);
            }
            Step::RunMessage(message) => {
                let len = message.len();
                let spare = self.execute(binding, cell, p, Args::Message(message), now);
                binding.release(len);
                if let Some(spare) = spare {
                    self.keep_spare(spare);
                }
            }
            Step::Flush { duplicate } => {
                if duplicate {
                    stats.duplicates.fetch_add(1, Ordering::Relaxed);
                }
                self.flush(binding, &mut cell);
            }
            // A reply (sent with the slot let go first) or nothing.
            quick => {
                let peer = cell.peer;
                drop(cell);
                self.answer(peer, quick, self.shared.session_of(binding).as_deref());
            }
        }
    }

    /// Sends the endpoint's reply to the slot's peer (sealed with `seal` on a secure binding), or
    /// counts why nothing goes, holding the slot.
    pub(super) fn answer_now(&self, cell: &UdpSlot, step: Step, seal: Option<&Session>) {
        self.answer(cell.peer, step, seal);
    }

    /// Sends a reply to `peer`, sealed with `seal` on a secure binding, or counts why nothing goes
    /// (for steps that run nothing and queue nothing).
    fn answer(&self, peer: Option<SocketAddr>, step: Step, seal: Option<&Session>) {
        let stats = &self.shared.stats;
        match step {
            Step::Reply(reply) => {
                let Some(peer) = peer else { return };
                if reply.header.kind == Kind::Reject {
                    stats.busy.fetch_add(1, Ordering::Relaxed);
                    self.send_reject(reply.header, reply.payload(), peer, seal);
                } else {
                    self.send_reply(&reply, peer, seal);
                }
            }
            Step::Quiet(Quiet::Duplicate) => {
                stats.duplicates.fetch_add(1, Ordering::Relaxed);
            }
            Step::Quiet(Quiet::Malformed) => {
                stats.malformed.fetch_add(1, Ordering::Relaxed);
            }
            Step::Quiet(Quiet::Cancelled) => {
                stats.cancelled.fetch_add(1, Ordering::Relaxed);
            }
            Step::Quiet(Quiet::Nothing) => {}
            // Steps that run or flush need the slot, and `step` takes them before this.
            Step::Run | Step::RunMessage(_) | Step::Flush { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_looks_again_only_after_datagrams_and_as_many_times_as_said() {
        let mut looks = Looks::default();
        // Nothing found since the last wait: it waits after its one look.
        assert!(!looks.again());
        looks.found();
        // Its first look after the datagrams found nothing; IDLE_LOOKS - 1 more, then it waits.
        for _ in 1..IDLE_LOOKS {
            assert!(looks.again());
        }
        assert!(!looks.again());
        assert!(!looks.again());
        // A find in between starts the count again.
        looks.found();
        assert!(looks.again());
        looks.found();
        for _ in 1..IDLE_LOOKS {
            assert!(looks.again());
        }
        assert!(!looks.again());
        assert_eq!(IDLE_LOOKS, 10);
    }

    #[test]
    fn a_lane_takes_runs_whole_only_while_large_calls_come() {
        let socket = udp::bind("127.0.0.1:0".parse().unwrap(), false).unwrap();
        let lane = Lane::new(socket, 65_507);
        assert!(lane.coalescing, "this kernel takes UDP_GRO");
        assert!(!udp::gro_is_on(&lane.socket).unwrap(), "off until a large call comes");
        lane.quiet();
        assert!(!udp::gro_is_on(&lane.socket).unwrap());
        lane.runs_come();
        assert!(udp::gro_is_on(&lane.socket).unwrap());
        lane.quiet();
        assert!(udp::gro_is_on(&lane.socket).unwrap(), "a large call came just now");
        // The last large call a second ago: the sweep turns it off.
        let long_ago = clock::ticks().saturating_sub(clock::ticks_in(KEEP_IDLE) + 1);
        lane.large_at.store(long_ago, Ordering::Relaxed);
        lane.quiet();
        assert!(!udp::gro_is_on(&lane.socket).unwrap());
        lane.runs_come();
        assert!(udp::gro_is_on(&lane.socket).unwrap(), "on again at the next");
    }
}
