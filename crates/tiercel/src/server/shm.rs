//! The server side of the shared-memory transport: the rendezvous listener, and one thread per
//! binding that serves its slots, spinning for `ServerConfig::spin` after each call and then sleeping
//! on the region's doorbell futex.
//!
//! Before a client has a binding it costs no thread: the rendezvous thread runs every bind exchange
//! itself, on non-blocking sockets, at most [`MAX_HANDSHAKES`] at once, each within [`HANDSHAKE`]
//! from its connection. A binding's memory (the slot pages the server has mapped, and its private
//! copies of arguments and results) is charged to `ServerConfig::binding_memory` and to the
//! server-wide `ServerConfig::message_memory` before it is touched; a call that does not fit is
//! answered `Busy` without reading it.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tiercel_proto::bind::{BindDecision, Refused, Rendezvous};
use tiercel_proto::endpoint::Budget;
use tiercel_proto::shm::{self as proto, header, slot, Layout, PAGE};
use tiercel_proto::wire::{Packet, Status};
use tiercel_sys::clock;
use tiercel_sys::shm::{futex_wait, futex_wake, Region};

use super::dispatch::Arrival;
use super::Shared;
use crate::rendezvous;
use crate::retention::{self, Retention};
use crate::steps::{self, mark, Point};

/// How long a blocked server thread sleeps before looking whether its client is still there.
const LIVENESS: Duration = Duration::from_millis(100);
/// How long a connection has, from its arrival, to complete the bind exchange.
pub(crate) const HANDSHAKE: Duration = Duration::from_secs(2);
/// Connections in the bind exchange at once; more are closed at once (their clients bind over UDP).
pub(crate) const MAX_HANDSHAKES: usize = 16;

/// The rendezvous socket of a server, bound under a name random for this incarnation.
pub(super) struct Listener {
    listener: UnixListener,
    /// What the server tells clients on its host that ask where to bind.
    pub(super) rendezvous: Rendezvous,
    /// The abstract socket name.
    pub(super) name: String,
}

/// Binds the rendezvous socket under a fresh random name.
pub(super) fn open() -> std::io::Result<Listener> {
    open_named(crate::client::random_bytes()?)
}

/// Binds the rendezvous socket under `random`'s name; an error when the name is taken (what
/// makes `Server::start` fail with `ServerError::SharedMemory` rather than serve without it).
fn open_named(random: [u8; 16]) -> std::io::Result<Listener> {
    let name = rendezvous::socket_name(&random);
    let listener = UnixListener::bind_addr(&UnixAddr::from_abstract_name(name.as_bytes())?)?;
    listener.set_nonblocking(true)?;
    let (pid, uid) = tiercel_sys::shm::own_credentials();
    Ok(Listener { listener, rendezvous: Rendezvous { name: random, pid, uid }, name })
}

/// Serves bind exchanges on `listener` until the server stops.
pub(super) fn listen(shared: &Arc<Shared>, listener: Listener) -> std::io::Result<std::thread::JoinHandle<()>> {
    let shared = shared.clone();
    std::thread::Builder::new()
        .name("tiercel-shm-rendezvous".into())
        .spawn(move || accept_loop(shared, listener.listener))
}

/// A connection in the bind exchange: no binding, no thread, no region yet.
struct Handshake {
    stream: UnixStream,
    arrived: Instant,
    /// What has arrived of the current request.
    partial: Vec<u8>,
    /// Requests answered so far (a challenge allows a second).
    answered: u8,
    /// Stands for the peer's address in challenges: they are bound to this connection.
    peer: [u8; 16],
}

/// Where a handshake stands after some progress.
enum Step {
    /// Waiting for more bytes.
    Wait,
    /// Over: bound (its thread runs), refused, or failed.
    Done,
}

/// How often the rendezvous thread bumps every binding's heartbeat.
const HEARTBEAT: Duration = Duration::from_millis(50);

/// Bumps the heartbeat word of every live binding's region, and forgets the regions gone.
fn beat(shared: &Shared) {
    let mut regions = shared.shm_regions.lock().unwrap_or_else(|p| p.into_inner());
    regions.retain(|r| match r.upgrade() {
        Some(region) => {
            word(&region, header::HEARTBEAT).fetch_add(1, Ordering::Release);
            true
        }
        None => false,
    });
}

fn accept_loop(shared: Arc<Shared>, listener: UnixListener) {
    let live = Arc::new(AtomicUsize::new(0));
    let mut pending: Vec<Handshake> = Vec::new();
    let mut ready = Vec::new();
    let mut last_beat = Instant::now();
    while !shared.stop.load(Ordering::Relaxed) {
        if last_beat.elapsed() >= HEARTBEAT {
            // This thread, not a binding's (which may be running a long procedure), shows that
            // the process lives: a stopped or hung process stops the beat.
            beat(&shared);
            last_beat = Instant::now();
        }
        loop {
            match listener.accept() {
                Ok((stream, _)) => {
                    let Ok(peer) = crate::client::random_bytes() else { continue };
                    if pending.len() >= MAX_HANDSHAKES
                        || shared.refusing_bindings()
                        || stream.set_nonblocking(true).is_err()
                    {
                        // No room: closing the connection unread tells the client (it reads end of
                        // file, and binds over UDP).
                        shared.stats.rejected.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    pending.push(Handshake { stream, arrived: Instant::now(), partial: Vec::new(), answered: 0, peer });
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
            matches!(progress(&shared, &live, h), Step::Wait)
        });
        let handshakes = pending.iter().map(|h| (h.arrived, std::os::fd::AsFd::as_fd(&h.stream)));
        wait_for_handshakes(std::os::fd::AsFd::as_fd(&listener), handshakes, now, HEARTBEAT, &mut ready);
    }
}

/// Waits until the listener or a connection in the bind exchange is readable, at most until the
/// first of those connections runs out of time or `period` passes. Idle (no handshake), it waits on
/// the listener alone, allocating nothing.
pub(super) fn wait_for_handshakes<'a>(
    listener: std::os::fd::BorrowedFd<'a>,
    handshakes: impl Iterator<Item = (Instant, std::os::fd::BorrowedFd<'a>)> + Clone,
    now: Instant,
    period: Duration,
    ready: &mut Vec<bool>,
) {
    let wait = handshakes
        .clone()
        .map(|(arrived, _)| (arrived + HANDSHAKE).saturating_duration_since(now))
        .min()
        .unwrap_or(period)
        .min(period)
        .max(Duration::from_millis(1));
    if handshakes.clone().next().is_none() {
        let _ = tiercel_sys::udp::wait_readable_fd(listener, Some(wait));
        return;
    }
    let fds: Vec<_> = std::iter::once(listener).chain(handshakes.map(|(_, fd)| fd)).collect();
    let _ = tiercel_sys::udp::wait_any_readable(&fds, Some(wait), ready);
}

/// Reads what a handshake's client sent and answers it, through the server's bind machine.
fn progress(shared: &Arc<Shared>, live: &Arc<AtomicUsize>, h: &mut Handshake) -> Step {
    let msg = match rendezvous::recv_nonblocking(&h.stream, &mut h.partial) {
        Ok(Some(msg)) => msg,
        Ok(None) => return Step::Wait,
        Err(e) => {
            if e.kind() == std::io::ErrorKind::InvalidData {
                shared.stats.malformed.fetch_add(1, Ordering::Relaxed);
            }
            return Step::Done;
        }
    };
    let Ok(p) = Packet::new_checked(&msg[..]) else {
        shared.stats.malformed.fetch_add(1, Ordering::Relaxed);
        return Step::Done;
    };
    let machine = shared.bind_machine(0);
    let admission = match machine.on_request(&p, &h.peer, rendezvous::MAX_MESSAGE) {
        BindDecision::Malformed => {
            shared.stats.malformed.fetch_add(1, Ordering::Relaxed);
            return Step::Done;
        }
        BindDecision::Answer { packet, refused } => {
            shared.count_refusal(refused);
            h.answered += 1;
            // A fresh connection's socket buffer takes an answer this small whole.
            let sent = rendezvous::send(&h.stream, &packet, None).is_ok();
            return if sent && refused == Refused::Challenged && h.answered < 2 { Step::Wait } else { Step::Done };
        }
        BindDecision::Admit(a) => a,
    };
    let slots = shared.config.slots_per_binding.clamp(1, proto::MAX_SLOTS);
    // The header and the slots' control pages are the server's from the start.
    let control = PAGE * (1 + slots as usize);
    let budget = Arc::new(Budget::new(shared.config.binding_memory));
    let mut charged = Charge::new(budget, shared.memory.clone());
    let room = live.load(Ordering::Relaxed) < shared.config.max_bindings && !shared.refusing_bindings();
    let made = (room && charged.reserve(control))
        .then(|| Layout::new(slots, shared.config.timing.max_message))
        .flatten()
        .and_then(|layout| {
            let region = Region::create("tiercel-binding", layout.region_len()?).ok()?;
            for (at, v) in layout.header_words() {
                region.u32_at(at)?.store(v, Ordering::Relaxed);
            }
            Some((region, layout))
        });
    let Some((region, layout)) = made else {
        shared.stats.rejected.fetch_add(1, Ordering::Relaxed);
        let _ = rendezvous::send(&h.stream, &admission.busy(&machine), None);
        return Step::Done;
    };
    let region = Arc::new(region);
    shared.shm_regions.lock().unwrap_or_else(|p| p.into_inner()).push(Arc::downgrade(&region));
    let id = shared.next_shm_binding.fetch_add(1, Ordering::Relaxed);
    let reply = admission.grant(&machine, id, 0, slots, layout.data as u64);
    let Ok(stream) = h.stream.try_clone() else { return Step::Done };
    if rendezvous::send(&stream, &reply, Some(region.fd())).is_err() || stream.set_nonblocking(false).is_err() {
        return Step::Done;
    }
    let export = shared.exports[admission.export].clone();
    live.fetch_add(1, Ordering::Relaxed);
    let (shared_, live_) = (shared.clone(), live.clone());
    let spawned = std::thread::Builder::new().name("tiercel-shm-binding".into()).spawn(move || {
        serve_binding(&shared_, stream, export, region, id, layout, charged, control);
        live_.fetch_sub(1, Ordering::Relaxed);
    });
    match spawned {
        // Joined when the server stops, so that nothing of it outlives `RunningServer::stop`.
        Ok(thread) => {
            let mut threads = shared.binding_threads.lock().unwrap_or_else(|p| p.into_inner());
            threads.retain(|t| !t.is_finished());
            threads.push(thread);
        }
        // No thread: the connection (and with it the region) goes, and the client sees it closed.
        Err(_) => {
            live.fetch_sub(1, Ordering::Relaxed);
        }
    }
    Step::Done
}

/// Which of the server's CPUs a new binding thread takes (round robin).
fn binding_index(shared: &Shared) -> usize {
    shared.shm_bindings.load(Ordering::Relaxed)
}

/// One binding, granted: serves its slots until the client goes away.
#[allow(clippy::too_many_arguments)]
#[cfg_attr(not(feature = "async"), allow(unused_variables))]
fn serve_binding(
    shared: &Arc<Shared>,
    stream: UnixStream,
    binding: Arc<dyn crate::interface::Export>,
    region: Arc<Region>,
    id: u32,
    layout: Layout,
    charge: Charge,
    control: usize,
) {
    // Measure the tick counter's rate now, not on the first call.
    let _ = clock::ticks_per_second();
    let cpus = &shared.config.cpus;
    if !cpus.is_empty() {
        let _ = tiercel_sys::cpu::pin_current_thread(cpus[binding_index(shared) % cpus.len()]);
    }
    shared.stats.bindings.fetch_add(1, Ordering::Relaxed);
    shared.shm_bindings.fetch_add(1, Ordering::Relaxed);
    let retention = vec![Retention::default(); layout.slots as usize];
    SlotServer {
        shared,
        stream: &stream,
        region: &region,
        layout,
        binding,
        args: Vec::new(),
        out: Vec::new(),
        retention,
        held: vec![0; layout.slots as usize],
        held_total: 0,
        control,
        charge,
        #[cfg(feature = "async")]
        asynch: AsyncSlots::new(shared, &region, id, layout.slots),
    }
    .run();
    shared.shm_bindings.fetch_sub(1, Ordering::Relaxed);
}

/// Bytes charged to a binding's budget and to the server's, given back when dropped.
pub(super) struct Charge {
    binding: Arc<Budget>,
    server: Arc<Budget>,
    charged: usize,
}

impl Charge {
    pub(super) fn new(binding: Arc<Budget>, server: Arc<Budget>) -> Charge {
        Charge { binding, server, charged: 0 }
    }

    /// Charges `bytes` more to both budgets; false (nothing charged) if either has no room.
    pub(super) fn reserve(&mut self, bytes: usize) -> bool {
        if !self.binding.reserve(bytes) {
            return false;
        }
        if !self.server.reserve(bytes) {
            self.binding.release(bytes);
            return false;
        }
        self.charged += bytes;
        true
    }

    /// Makes the charge `total`: more if there is room (false if not, the charge unchanged),
    /// or less.
    pub(super) fn settle(&mut self, total: usize) -> bool {
        match total.checked_sub(self.charged) {
            Some(more) => self.reserve(more),
            None => {
                let less = self.charged - total;
                self.binding.release(less);
                self.server.release(less);
                self.charged = total;
                true
            }
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.settle(0);
    }
}

struct SlotServer<'a> {
    shared: &'a Shared,
    stream: &'a UnixStream,
    region: &'a Region,
    layout: Layout,
    binding: Arc<dyn crate::interface::Export>,
    args: Vec<u8>,
    out: Vec<u8>,
    /// When each slot last moved a large call and gave pages back.
    retention: Vec<Retention>,
    /// Bytes of each slot's data this thread has mapped (read arguments from, written results to)
    /// and not given back or forgotten since: whole pages.
    held: Vec<usize>,
    /// The sum of `held`.
    held_total: usize,
    /// Bytes of the region's header and control pages.
    control: usize,
    /// What all of it is charged to the budgets.
    charge: Charge,
    /// The binding's calls of async procedures under way.
    #[cfg(feature = "async")]
    asynch: AsyncSlots,
}

/// A shared-memory binding's calls of async procedures: each runs on the server's runtime while its
/// slot stays published (`CALL`); its result comes back to the binding's thread, which writes it
/// into the slot (the only thread that touches the slots and their memory accounting).
#[cfg(feature = "async")]
struct AsyncSlots {
    /// Slots whose call runs on the runtime.
    pending: Vec<bool>,
    /// Slots whose running call has been aborted for its client.
    aborted: Vec<bool>,
    running: usize,
    done: std::sync::mpsc::Sender<(u32, Status, Vec<u8>)>,
    results: std::sync::mpsc::Receiver<(u32, Status, Vec<u8>)>,
    region: Arc<Region>,
    /// The binding's key among the runtime's calls (shared-memory ids are kept apart from UDP's).
    id: u32,
    shared: Arc<Shared>,
}

#[cfg(feature = "async")]
impl AsyncSlots {
    fn new(shared: &Arc<Shared>, region: &Arc<Region>, id: u32, slots: u32) -> AsyncSlots {
        let (done, results) = std::sync::mpsc::channel();
        AsyncSlots {
            pending: vec![false; slots as usize],
            aborted: vec![false; slots as usize],
            running: 0,
            done,
            results,
            region: region.clone(),
            id: id | 1 << 31,
            shared: shared.clone(),
        }
    }
}

/// A control word of the region. Offsets come from the layout the region was created with, so they
/// are in bounds and aligned.
fn word(region: &Region, at: usize) -> &AtomicU32 {
    region.u32_at(at).unwrap_or_else(|| unreachable!("layout offset {at} inside the region"))
}

impl<'a> SlotServer<'a> {
    fn word(&self, at: usize) -> &'a AtomicU32 {
        word(self.region, at)
    }

    fn run(&mut self) {
        let shared = self.shared;
        let slots = self.layout.slots;
        let (doorbell, sleeping) = (self.word(header::DOORBELL), self.word(header::SERVER_SLEEPING));
        let states: Vec<&AtomicU32> = (0..slots).map(|i| self.word(self.layout.slot(i) + slot::STATE)).collect();
        let used_word = self.word(header::SLOTS_USED);
        // Slots below the clients' high-water mark (a malicious client's value is capped).
        let used = || (used_word.load(Ordering::Acquire) as usize).min(slots as usize);
        // Spin after each call for about twice the recent gap between a result and the next call
        // (at most `spin`), or always `spin` when adaptation is off; then sleep on the doorbell.
        let policy = if shared.config.adaptive_spin {
            crate::Spin::Adaptive { max: shared.config.spin }
        } else {
            crate::Spin::Fixed(shared.config.spin)
        };
        let mut budget = crate::spin::SpinBudget::new(policy);
        // Times in ticks of the tick counter: read after every call, it costs a third of the clock.
        let mut last_result = clock::ticks();
        let mut spin_until = last_result + clock::ticks_in(budget.budget());
        let mut rounds = 0u32;
        let mut idle = 0u32;
        // Leave to spin after a call; without it, this thread sleeps as soon as no call is there.
        let mut lease = super::spinning::SpinLease::new(&shared.spin_leases);
        loop {
            let mut served = false;
            #[cfg(feature = "async")]
            if self.asynch.running > 0 {
                served |= self.finish_async();
            }
            for (i, state) in states[..used()].iter().enumerate() {
                if proto::server_has_call(*state) && !self.runs_async(i) {
                    mark(Point::ServerArrived);
                    self.serve(i as u32);
                    steps::close();
                    served = true;
                }
            }
            if served {
                // Off the critical path: the result is already published. The gap between results
                // stands for how soon the client calls again.
                let now = clock::ticks();
                budget.observe(clock::elapsed(last_result, now));
                last_result = now;
                spin_until = if lease.take() { now + clock::ticks_in(budget.budget()) } else { now };
                rounds = rounds.wrapping_add(1);
                idle = 0;
                // A client calling without pause never lets this thread sleep: look at the stop flag
                // now and then all the same.
                if rounds.is_multiple_of(1024) && self.shared.stop.load(Ordering::Relaxed) {
                    return;
                }
                continue;
            }
            // Read the clock only every 64 idle rounds, so that a spinning server notices a call
            // within a few loads, not a clock read.
            idle = idle.wrapping_add(1);
            if !idle.is_multiple_of(64) || clock::ticks() < spin_until {
                core::hint::spin_loop();
                continue;
            }
            #[cfg(feature = "async")]
            if self.asynch.running > 0 {
                self.cancel_async();
            }
            lease.give_back();
            let any_call =
                || states[..used()].iter().enumerate().any(|(i, s)| proto::server_has_call(*s) && !self.runs_async(i));
            if let Some(bell) = proto::server_prepare_sleep(doorbell, sleeping, any_call) {
                if futex_wait(doorbell, bell, Some(LIVENESS)) {
                    steps::slept(steps::Side::Server);
                }
            }
            proto::server_woke(sleeping);
            if clock::elapsed(last_result, clock::ticks()) >= LIVENESS {
                // Idle a while: give back the private copies of large arguments and results (kept
                // while calls come, so that a stream of large calls does not fault them in anew),
                // and stop mapping the slot pages whose results the client has taken.
                if self.args.capacity() > retention::LARGE {
                    self.args = Vec::new();
                }
                if self.out.capacity() > retention::LARGE {
                    self.out = Vec::new();
                }
                self.forget_taken(None);
                self.charge.settle(self.footprint());
            }
            if self.shared.stop.load(Ordering::Relaxed) || tiercel_sys::shm::peer_closed(self.stream) {
                // The client died or dropped the binding: its region goes with this thread.
                self.shared.stats.expired.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }

    /// Bytes this binding holds: control pages, mapped slot data, private buffers.
    fn footprint(&self) -> usize {
        self.control + self.held_total + self.args.capacity() + self.out.capacity()
    }

    fn set_held(&mut self, i: usize, bytes: usize) {
        self.held_total = self.held_total - self.held[i] + bytes;
        self.held[i] = bytes;
    }

    /// Stops mapping the data pages of slots (but `except`) whose client has taken the result, so
    /// that they no longer count as this binding's memory. The client keeps the bytes; the
    /// server maps them again if it reads them.
    #[cold]
    #[inline(never)]
    fn forget_taken(&mut self, except: Option<usize>) {
        for j in 0..self.held.len() {
            if self.held[j] == 0 || Some(j) == except {
                continue;
            }
            let state = self.word(self.layout.slot(j as u32) + slot::STATE).load(Ordering::Acquire);
            if state == proto::state::IDLE {
                self.region.forget(self.layout.data(j as u32), self.held[j]);
                self.set_held(j, 0);
            }
        }
    }

    /// Charges what the binding holds with slot `i` holding `held` bytes and the argument buffer
    /// `args` bytes; if the budgets have no room, first gives back what can be given back.
    #[cold]
    #[inline(never)]
    fn make_room(&mut self, i: usize, held: usize, args: usize) -> bool {
        let grow = held.saturating_sub(self.held[i]);
        let need = |s: &Self| s.footprint() + grow + args.saturating_sub(s.args.capacity());
        let room = self.charge.settle(need(self)) || {
            self.forget_taken(Some(i));
            if self.args.capacity() > args {
                self.args = Vec::new();
            }
            self.out = Vec::new();
            self.charge.settle(need(self))
        };
        if room {
            self.set_held(i, self.held[i].max(held));
        }
        room
    }

    /// Runs the call in slot `i`: reads what the client wrote once into private memory, validates it,
    /// runs the procedure, writes the result in place and publishes it.
    fn serve(&mut self, i: u32) {
        let base = self.layout.slot(i);
        let data = self.layout.data(i);
        let at = i as usize;
        // Each control word is read once; the call is validated before anything uses it.
        let procedure = self.word(base + slot::PROCEDURE).load(Ordering::Relaxed);
        let len = self.word(base + slot::LEN).load(Ordering::Relaxed);
        let deadline = proto::deadline_from_words(
            self.word(base + slot::DEADLINE_LO).load(Ordering::Relaxed),
            self.word(base + slot::DEADLINE_HI).load(Ordering::Relaxed),
        );
        let cancelled = self.word(base + slot::CANCEL).load(Ordering::Relaxed) != 0;
        self.out.clear();
        let call = proto::validate_call(procedure, len, self.layout.data);
        mark(Point::ServerValidated);
        let len = call.map_or(0, |c| c.len);
        // The pages the call's arguments (and at least an error message) take, charged before they
        // are touched; the fast path finds them charged already.
        let pages = len.max(1).next_multiple_of(PAGE);
        let fits = self.held[at] >= pages && self.args.capacity() >= len || self.make_room(at, pages, len);
        let status = match call {
            _ if !fits => {
                // No room in the budgets: refused unread, nothing written to the slot's data.
                self.shared.stats.busy.fetch_add(1, Ordering::Relaxed);
                Status::Busy
            }
            None => {
                super::dispatch::error_message(
                    &mut self.out,
                    "malformed shared-memory call: length or procedure out of range",
                );
                Status::BadArguments
            }
            // Given up by its client (its deadline passed, its future dropped) before it started.
            Some(_) if cancelled => {
                self.shared.stats.cancelled.fetch_add(1, Ordering::Relaxed);
                Status::Cancelled
            }
            Some(call) => {
                if self.args.capacity() < call.len {
                    self.args.reserve_exact(call.len - self.args.len());
                }
                self.args.resize(call.len, 0);
                self.region.read(data, &mut self.args);
                mark(Point::ServerAccepted);
                #[cfg(feature = "async")]
                if self.shared.asynch.is_some() && self.binding.is_async(call.procedure) {
                    match self.start_async(i, call, deadline) {
                        // The result comes later, through `finish_async`.
                        Ok(()) => return,
                        Err(status) => return self.publish(i, status, 0),
                    }
                }
                self.shared.stats.calls.fetch_add(1, Ordering::Relaxed);
                let limit = self.layout.data;
                let mut status = super::dispatch::run_procedure(
                    self.shared,
                    &self.binding,
                    call.procedure,
                    &self.args,
                    Arrival {
                        // A relative deadline is the network's: this transport carries the instant.
                        at: None,
                        context: call.context,
                        deadline: deadline.map(tiercel_sys::clock::instant_of_monotonic),
                        transport: "shm",
                    },
                    &mut self.out,
                    0,
                    limit,
                );
                if self.out.len() > limit {
                    let n = self.out.len();
                    self.out.clear();
                    super::dispatch::error_message(
                        &mut self.out,
                        &format!("result of {n} bytes exceeds the slot's {limit}"),
                    );
                    status = Status::ResultTooLarge;
                }
                if self.out.len() > self.held[at] || self.footprint() > self.charge.charged {
                    status = self.charge_result(at, status);
                }
                status
            }
        };
        self.publish(i, status, len);
    }

    /// Writes the result in `self.out` with `status` into slot `i` (whose call had `len` bytes of
    /// arguments), and publishes it.
    fn publish(&mut self, i: u32, status: Status, len: usize) {
        let base = self.layout.slot(i);
        let data = self.layout.data(i);
        let at = i as usize;
        self.region.write(data, &self.out);
        self.word(base + slot::LEN).store(self.out.len() as u32, Ordering::Relaxed);
        self.word(base + slot::STATUS).store(status as u32, Ordering::Relaxed);
        let extent = self.held[at];
        let result = self.out.len().next_multiple_of(PAGE);
        if len > retention::LARGE && extent > result {
            // The arguments were large: give back the part of the slot the result does not cover,
            // but not on every call (a stream of large calls would fault the pages in anew) unless
            // the binding holds more than three quarters of its budget. (Not half: a maximum-size
            // call's slot pages and private copy take half the default budget by themselves, and
            // giving them back after every such call made a stream of them 13 times slower.)
            let pressed = self.charge.charged > self.charge.binding.limit() / 4 * 3;
            if self.retention.get_mut(at).is_some_and(|r| r.large(Instant::now())) || pressed {
                self.region.discard(data + result, extent - result);
                self.set_held(at, result);
            }
        }
        let (state, waiting) = (self.word(base + slot::STATE), self.word(base + slot::CLIENT_WAITING));
        mark(Point::ResultReady);
        match proto::server_publish(state, waiting) {
            proto::Wake::Nobody => {}
            proto::Wake::Slot => futex_wake(state, 1),
            proto::Wake::Doorbell => {
                let bell = self.word(header::CLIENT_DOORBELL);
                bell.fetch_add(1, Ordering::SeqCst);
                futex_wake(bell, i32::MAX as u32);
            }
        }
        mark(Point::ResultSent);
    }

    /// Whether slot `i`'s call runs on the async runtime (so its published call is not new).
    #[inline]
    fn runs_async(&self, i: usize) -> bool {
        #[cfg(feature = "async")]
        return self.asynch.pending[i];
        #[cfg(not(feature = "async"))]
        return {
            let _ = i;
            false
        };
    }

    /// Starts the call in slot `i` (its arguments in `self.args`) on the async runtime. Refused at
    /// once: the status to answer with, its message in `self.out`.
    #[cfg(feature = "async")]
    fn start_async(&mut self, i: u32, call: proto::SlotCall, deadline: Option<u64>) -> Result<(), Status> {
        let (done, region) = (self.asynch.done.clone(), self.asynch.region.clone());
        let finish = move |status: Status, results: Vec<u8>| {
            // The binding's thread writes the result; wake it if it sleeps. A binding gone since
            // drops the result.
            if done.send((i, status, results)).is_ok() {
                let bell = word(&region, header::DOORBELL);
                bell.fetch_add(1, Ordering::SeqCst);
                futex_wake(bell, 1);
            }
        };
        let arrival = Arrival {
            at: None,
            context: call.context,
            deadline: deadline.map(tiercel_sys::clock::instant_of_monotonic),
            transport: "shm",
        };
        let key = (self.asynch.id, i, 0);
        let started = super::dispatch::start_async(
            &self.asynch.shared,
            &self.binding,
            call.procedure,
            &self.args,
            arrival,
            &mut self.out,
            self.layout.data,
            key,
            finish,
        );
        match started {
            Some(Ok(())) => {
                self.asynch.pending[i as usize] = true;
                self.asynch.running += 1;
                Ok(())
            }
            Some(Err(status)) => Err(status),
            None => unreachable!("the procedure is async"),
        }
    }

    /// Writes the results of async calls that ended into their slots; true if there were any.
    #[cfg(feature = "async")]
    fn finish_async(&mut self) -> bool {
        let mut any = false;
        while let Ok((i, mut status, results)) = self.asynch.results.try_recv() {
            let at = i as usize;
            self.asynch.pending[at] = false;
            self.asynch.aborted[at] = false;
            self.asynch.running -= 1;
            any = true;
            self.out.clear();
            let limit = self.layout.data;
            if results.len() > limit {
                super::dispatch::error_message(
                    &mut self.out,
                    &format!("result of {} bytes exceeds the slot's {limit}", results.len()),
                );
                status = Status::ResultTooLarge;
            } else {
                self.out.extend_from_slice(&results);
            }
            if self.out.len() > self.held[at] || self.footprint() > self.charge.charged {
                status = self.charge_result(at, status);
            }
            self.publish(i, status, 0);
        }
        any
    }

    /// Aborts the async calls whose clients have given them up (the slot's cancel word).
    #[cfg(feature = "async")]
    fn cancel_async(&mut self) {
        let Some(runner) = &self.shared.asynch else { return };
        let AsyncSlots { pending, aborted, id, .. } = &mut self.asynch;
        for (i, (_, aborted)) in pending.iter().zip(aborted.iter_mut()).enumerate().filter(|(_, (p, a))| **p && !**a) {
            let cancel = word(self.region, self.layout.slot(i as u32) + slot::CANCEL);
            if cancel.load(Ordering::Relaxed) != 0 && runner.cancel((*id, i as u32, 0)) {
                *aborted = true;
                self.shared.stats.cancelled.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Charges the pages a result written to slot `i` takes, and the buffers the procedure grew.
    /// A result the budgets have no room for is replaced by an error that says so (the procedure
    /// ran), as over UDP.
    #[cold]
    #[inline(never)]
    fn charge_result(&mut self, i: usize, status: Status) -> Status {
        let before = self.held[i];
        self.set_held(i, before.max(self.out.len().next_multiple_of(PAGE)));
        if self.charge.settle(self.footprint()) {
            return status;
        }
        // The arguments are no longer needed.
        self.args = Vec::new();
        self.forget_taken(Some(i));
        if self.charge.settle(self.footprint()) {
            return status;
        }
        let n = self.out.len();
        self.out = Vec::new();
        super::dispatch::error_message(
            &mut self.out,
            &format!("result of {n} bytes exceeds the server's shared-memory budget"),
        );
        self.set_held(i, before);
        // At most a page of message, in a page charged before the call ran.
        self.charge.settle(self.footprint());
        Status::ResultTooLarge
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rendezvous_name_already_held_is_an_error_not_a_silent_fallback() {
        let random = crate::client::random_bytes().unwrap();
        let first = open_named(random).expect("a fresh name binds");
        assert_eq!(first.rendezvous.name, random);
        assert_eq!((first.rendezvous.pid, first.rendezvous.uid), tiercel_sys::shm::own_credentials());
        let again = open_named(random).err().expect("a name already held is refused");
        assert_eq!(again.kind(), std::io::ErrorKind::AddrInUse);
        let started = crate::ServerError::SharedMemory(again).to_string();
        assert!(started.contains("cannot offer shared memory"), "{started}");
    }
}
