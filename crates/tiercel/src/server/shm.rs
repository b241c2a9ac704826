//! The server side of the shared-memory transport: the rendezvous listener, and for each binding
//! the threads that serve its slots, spinning for `ServerConfig::spin` after each call and then
//! sleeping on the region's doorbell futex.
//!
//! A binding starts with one thread. While every awake thread of a binding has been running a slow
//! call (see `super::slow_calls`) at two of the rendezvous thread's looks in a row (a [`LOOK`] apart
//! while its threads are busy, up to 8 ms apart otherwise) and another call waits, the rendezvous
//! thread starts a helper (or wakes a parked one), up to `ServerConfig::workers`, so that a slow
//! procedure holds up only its own caller. A thread claims a slot's call (the lock of the slot's
//! [`Books`]) before it reads it.
//!
//! Before a client has a binding it costs no thread: the rendezvous thread runs every bind exchange
//! itself, on non-blocking sockets, through the same doorway as TCP's (`super::handshake`): at
//! most [`MAX_HANDSHAKES`] at once and [`MAX_HANDSHAKES_PER_SOURCE`] of one user, each within
//! `HANDSHAKE` from its connection. A binding's memory (the slot pages the server has mapped, and its private
//! copies of arguments and results) is charged to `ServerConfig::binding_memory` and to the
//! server-wide `ServerConfig::message_memory` before it is touched; a call that does not fit is
//! answered `Busy` without reading it.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tiercel_proto::bind::Rendezvous;
use tiercel_proto::endpoint::Budget;
use tiercel_proto::shm::{self as proto, header, slot, Layout, PAGE};
use tiercel_proto::wire::Status;
use tiercel_sys::clock;
use tiercel_sys::shm::{futex_wait, futex_wake, Region};

use super::dispatch::Arrival;
use super::handshake::{has_room, Broken, Doorway, Exchange, Step, ARRIVALS};
use super::Shared;
use crate::rendezvous;
use crate::retention::{self, Retention};
use crate::steps::{self, mark, Point};

/// How long a blocked server thread sleeps before looking whether its client is still there.
const LIVENESS: Duration = Duration::from_millis(100);
/// A call longer than this whose procedure works on its `InOut` buffer in place runs on its
/// arguments' private copy, and its result is published from there (`serve_in_place`).
const IN_PLACE: usize = PAGE;
/// Connections in the bind exchange at once. When they are all taken, a new one makes room by
/// closing the oldest of the user that holds the most ([`Doorway`]); a client whose connection is
/// closed binds over UDP.
pub(crate) const MAX_HANDSHAKES: usize = 16;
/// Of those, from one user id (at its limit, a user's new connection closes its oldest).
pub(crate) const MAX_HANDSHAKES_PER_SOURCE: usize = 8;

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
    open_named(crate::random::bytes()?)
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
struct Connecting {
    stream: UnixStream,
    /// What has arrived of the current request.
    partial: Vec<u8>,
}

impl std::os::fd::AsFd for Connecting {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.stream.as_fd()
    }
}

impl Exchange for Connecting {
    fn request(&mut self) -> Result<Option<Vec<u8>>, Broken> {
        rendezvous::recv_nonblocking(&self.stream, &mut self.partial).map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidData => Broken::Malformed,
            _ => Broken::Closed,
        })
    }

    fn answer(&mut self, packet: &[u8]) -> bool {
        rendezvous::send(&self.stream, packet, None).is_ok()
    }
}

/// How often the rendezvous thread bumps every binding's heartbeat.
const HEARTBEAT: Duration = Duration::from_millis(50);

/// What one look of the rendezvous thread at the bindings found.
#[derive(Debug, Default)]
struct Looked {
    /// A binding has been in use lately.
    in_use: bool,
    /// At a binding in use, every awake thread was running a call.
    all_busy: bool,
}

/// Bumps the heartbeat word of every live binding's region (when `beat`), gives a binding held up
/// by its calls another thread, and forgets the bindings gone. `since` is the time since the last
/// look.
fn look_after(teams: &mut Vec<(std::sync::Weak<Team>, Watch)>, beat: bool, since: Duration) -> Looked {
    let mut looked = Looked::default();
    teams.retain_mut(|(team, watch)| match team.upgrade() {
        Some(team) => {
            if beat {
                team.word(header::HEARTBEAT).fetch_add(1, Ordering::Release);
            }
            if team.in_use() {
                looked.in_use = true;
                let (held, all_busy) = team.held_up(watch, since);
                looked.all_busy |= all_busy;
                if held {
                    team.add_thread();
                }
            } else {
                *watch = Watch::default();
            }
            true
        }
        None => false,
    });
    looked
}

fn accept_loop(shared: Arc<Shared>, listener: UnixListener) {
    let live = Arc::new(AtomicUsize::new(0));
    let mut doorway: Doorway<u32, Connecting> = Doorway::new(MAX_HANDSHAKES, MAX_HANDSHAKES_PER_SOURCE);
    let mut teams = Vec::new();
    let mut last_beat = Instant::now();
    let (mut last_look, mut waited) = (Instant::now(), LOOK);
    while !shared.stop.load(Ordering::Relaxed) {
        // This thread, not a binding's (which may be running a long procedure), shows that the
        // process lives: a stopped or hung process stops the beat.
        let beat = last_beat.elapsed() >= HEARTBEAT;
        if beat {
            last_beat = Instant::now();
        }
        // Often while a binding is in use (it may need another thread soon), else once a heartbeat.
        // Each look wakes this thread on the server's CPUs, where a binding's thread may be spinning:
        // looking every millisecond while one caller's quick calls streamed, the server's CPU took
        // about 1,100 timer interrupts a second, against about 600 with these waits
        // (`crew::next_look`).
        let looked = look_after(&mut teams, beat, last_look.elapsed());
        last_look = Instant::now();
        waited = if looked.in_use { super::crew::next_look(waited, looked.all_busy) } else { LOOK };
        let period = if looked.in_use { waited } else { HEARTBEAT };
        // What becomes of a connection in the bind exchange after some progress.
        let mut progress = |connecting: &mut Connecting, step: Step| match step {
            Step::Wait => true,
            Step::Done => false,
            Step::Admit(admission) => {
                if let Some(team) = bind(&shared, &live, connecting, admission) {
                    teams.push((team, Watch::default()));
                }
                false
            }
        };
        // A few arrivals at a time, then the connections' progress: a burst of arrivals from
        // one source cannot push out a client whose request is landing meanwhile.
        let mut more = false;
        for _ in 0..ARRIVALS {
            match listener.accept() {
                Ok((stream, _)) => {
                    more = true;
                    // The user the kernel recorded for the connection: what limits its share of
                    // the handshakes.
                    let uid = tiercel_sys::shm::peer_credentials(&stream).map(|(_, uid)| uid);
                    let Ok(uid) = uid else { continue };
                    if shared.refusing_bindings() || stream.set_nonblocking(true).is_err() {
                        // Closing the connection unread tells the client (it reads end of file,
                        // and binds over UDP).
                        shared.stats.rejected.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    doorway.arrive(&shared, uid, Connecting { stream, partial: Vec::new() }, &mut progress);
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
        let period = if teams.is_empty() { HEARTBEAT } else { period };
        if !more {
            doorway.wait(std::os::fd::AsFd::as_fd(&listener), None, period);
        }
    }
}

/// Makes the binding (its region, its first thread) a connection's bind request was admitted to,
/// and answers with the grant and the region (or busy, without room): the binding's team, for the
/// rendezvous thread to watch.
fn bind(
    shared: &Arc<Shared>,
    live: &Arc<AtomicUsize>,
    h: &mut Connecting,
    admission: tiercel_proto::bind::Admission,
) -> Option<std::sync::Weak<Team>> {
    let machine = shared.bind_machine(0);
    let slots = shared.config.slots_per_binding.clamp(1, proto::MAX_SLOTS);
    // The header and the slots' control pages are the server's from the start.
    let control = PAGE * (1 + slots as usize);
    let budget = Arc::new(Budget::new(shared.config.binding_memory));
    let mut charged = Charge::new(budget, shared.memory.clone());
    let made = (has_room(shared, live) && charged.reserve(control))
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
        h.answer(&admission.busy(&machine));
        return None;
    };
    let region = Arc::new(region);
    let id = shared.next_shm_binding.fetch_add(1, Ordering::Relaxed);
    let reply = admission.grant(&machine, id, 0, slots, layout.data as u64);
    let stream = h.stream.try_clone().ok()?;
    if rendezvous::send(&stream, &reply, Some(region.fd())).is_err() || stream.set_nonblocking(false).is_err() {
        return None;
    }
    let export = shared.exports[admission.export].clone();
    let (team, results) = new_team(shared, export, region, id, layout, charged);
    let watched = Arc::downgrade(&team);
    live.fetch_add(1, Ordering::Relaxed);
    let live_ = live.clone();
    let spawned = std::thread::Builder::new().name("tiercel-shm-binding".into()).spawn(move || {
        serve_first(&team, stream, results);
        live_.fetch_sub(1, Ordering::Relaxed);
    });
    match spawned {
        // Joined when the server stops, so that nothing of it outlives `RunningServer::stop`.
        Ok(thread) => {
            let mut threads = shared.binding_threads.lock().unwrap_or_else(|p| p.into_inner());
            threads.retain(|t| !t.is_finished());
            threads.push(thread);
            Some(watched)
        }
        // No thread: the connection (and with it the region) goes, and the client sees it closed.
        Err(_) => {
            live.fetch_sub(1, Ordering::Relaxed);
            None
        }
    }
}

/// Which of the server's CPUs a new binding's first thread takes (round robin).
fn binding_index(shared: &Shared) -> usize {
    shared.shm_bindings.load(Ordering::Relaxed)
}

/// How soon the rendezvous thread looks again whether a binding in use needs another thread, after
/// a look that found every awake thread of a binding running a call (after other looks, twice the
/// wait before, up to `crew::MAX_LOOK`).
const LOOK: Duration = super::crew::TICK;
/// A binding whose last call ended longer ago than this is looked at only once a [`HEARTBEAT`].
const IN_USE: Duration = Duration::from_secs(1);
/// A binding's extra thread that has served no call for this long ends.
const HELPER_IDLE: Duration = Duration::from_secs(5);

/// What a thread serving a binding is doing, as the rendezvous thread sees it.
mod lane {
    /// No thread.
    pub(super) const FREE: u32 = 0;
    /// Looking at the slots for a call, or spinning.
    pub(super) const AWAKE: u32 = 1;
    /// Serving a call (running its procedure).
    pub(super) const RUNNING: u32 = 2;
    /// Asleep: the first thread on the doorbell, a helper parked until the rendezvous thread wakes it.
    pub(super) const ASLEEP: u32 = 3;
}

/// One thread's marker, alone on its cache line: written with plain stores by its thread, read by
/// the rendezvous thread now and then.
#[repr(align(64))]
struct Lane {
    /// What the thread is doing (`lane::*`).
    state: AtomicU32,
    /// Calls it has served (only its thread writes it).
    served: AtomicU64,
}

impl Lane {
    fn new() -> Lane {
        Lane { state: AtomicU32::new(lane::FREE), served: AtomicU64::new(0) }
    }
}

/// The bookkeeping of one slot. Its lock is the claim on the slot's call: the thread that serves
/// the call holds it from before it reads the call until the result is published.
struct Books {
    /// Bytes of the slot's data the server has mapped (read arguments from, written results to) and
    /// not given back or forgotten since: whole pages.
    held: usize,
    /// `held`, charged to the budgets.
    charge: Charge,
    /// When the slot last moved a large call and gave pages back.
    retention: Retention,
    /// The slot's call runs on the async runtime (so its published call is not new).
    #[cfg(feature = "async")]
    pending: bool,
    /// That call has been aborted for its client.
    #[cfg(feature = "async")]
    aborted: bool,
}

/// A granted binding: what the threads serving it share. The first thread serves it from the
/// grant until its client goes; others (helpers) are started by the rendezvous thread while
/// every awake thread has been running a slow call and another call waits, and end after
/// [`HELPER_IDLE`] without a call.
pub(super) struct Team {
    shared: Arc<Shared>,
    region: Arc<Region>,
    layout: Layout,
    binding: Arc<dyn crate::interface::Export>,
    /// The binding's memory budget, shared by the slots' and the threads' charges.
    budget: Arc<Budget>,
    books: Vec<std::sync::Mutex<Books>>,
    /// One per thread the binding may have; the first is the first thread's.
    lanes: Vec<Lane>,
    /// Futex where parked helpers wait for the rendezvous thread (not the doorbell: a helper asleep
    /// there would make every call of the binding's client ring it).
    parked: AtomicU32,
    /// When a call of the binding last ended, in ticks of the tick counter.
    last_result: AtomicU64,
    /// The binding is over (its client went, or the server stops): helpers end.
    closed: AtomicBool,
    /// The header and the slots' control pages, charged.
    _control: Charge,
    /// Calls of async procedures running on the runtime.
    #[cfg(feature = "async")]
    running: AtomicUsize,
    /// Where their results go, for the first thread to write into their slots.
    #[cfg(feature = "async")]
    done: std::sync::mpsc::Sender<(u32, Status, Vec<u8>)>,
    /// The binding's key among the runtime's calls (shared-memory ids are kept apart from UDP's).
    #[cfg(feature = "async")]
    id: u32,
}

/// What the rendezvous thread remembers of a binding between its looks.
#[derive(Default)]
pub(super) struct Watch {
    /// At the last look, every awake thread was running a slow call and another call waited.
    held_up: bool,
    /// Calls served by the binding's threads at the last look.
    served: u64,
}

impl Team {
    fn word(&self, at: usize) -> &AtomicU32 {
        word(&self.region, at)
    }

    fn state(&self, i: usize) -> &AtomicU32 {
        self.word(self.layout.slot(i as u32) + slot::STATE)
    }

    /// Slots below the clients' high-water mark (a malicious client's value is capped).
    fn used(&self) -> usize {
        (self.word(header::SLOTS_USED).load(Ordering::Acquire) as usize).min(self.books.len())
    }

    #[cfg(feature = "async")]
    fn books(&self, i: usize) -> std::sync::MutexGuard<'_, Books> {
        self.books[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Claims slot `i`, if no other thread holds it.
    fn claim(&self, i: usize) -> Option<std::sync::MutexGuard<'_, Books>> {
        match self.books[i].try_lock() {
            Ok(b) => Some(b),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Whether a slot holds a call no thread has taken (not one running on the async runtime).
    fn any_call(&self) -> bool {
        (0..self.used())
            .any(|i| proto::server_has_call(self.state(i)) && self.claim(i).is_some_and(|b| !Self::runs_async(&b)))
    }

    #[inline]
    fn runs_async(b: &Books) -> bool {
        #[cfg(feature = "async")]
        return b.pending;
        #[cfg(not(feature = "async"))]
        return {
            let _ = b;
            false
        };
    }

    /// Wakes a thread of the binding asleep on the doorbell.
    fn ring(&self) {
        let bell = self.word(header::DOORBELL);
        bell.fetch_add(1, Ordering::SeqCst);
        futex_wake(bell, 1);
    }

    /// Most threads serving the binding: a slow call then holds up only its own caller while fewer
    /// than this many run at once.
    fn max_threads(shared: &Shared, slots: u32) -> usize {
        (slots as usize).min(shared.config.workers).max(1)
    }

    /// Whether the binding has been in use lately (the rendezvous thread then looks whether it
    /// needs another thread a [`LOOK`] to 8 ms apart, rather than once a [`HEARTBEAT`]).
    fn in_use(&self) -> bool {
        !self.closed.load(Ordering::Acquire)
            && (clock::elapsed(self.last_result.load(Ordering::Relaxed), clock::ticks()) < IN_USE
                || self.lanes.iter().any(|l| l.state.load(Ordering::Relaxed) == lane::RUNNING))
    }

    /// One look of the rendezvous thread, `since` after the last: whether the binding is held up
    /// (at this look and the last, every awake thread was running a call while another call waited,
    /// and the calls were slow: fewer served between the looks than one per 50 µs per running
    /// thread, `super::slow_calls`), and whether every awake thread was running a call.
    fn held_up(&self, watch: &mut Watch, since: Duration) -> (bool, bool) {
        let served: u64 = self.lanes.iter().map(|l| l.served.load(Ordering::Relaxed)).fold(0, u64::wrapping_add);
        let calls = served.wrapping_sub(std::mem::replace(&mut watch.served, served));
        let mut running = 0;
        for l in &self.lanes {
            match l.state.load(Ordering::Relaxed) {
                // A thread free to take the next call: nothing more to look at.
                lane::AWAKE => {
                    watch.held_up = false;
                    return (false, false);
                }
                lane::RUNNING => running += 1,
                _ => {}
            }
        }
        #[cfg(feature = "async")]
        let on_runtime = self.running.load(Ordering::Relaxed);
        #[cfg(not(feature = "async"))]
        let on_runtime = 0;
        let now = running > 0 && super::slow_calls(calls, running, since) && {
            let waiting = (0..self.used()).filter(|&i| proto::server_has_call(self.state(i))).count();
            waiting > running + on_runtime
        };
        let held = now && watch.held_up;
        // After a thread is added, two more looks before another.
        watch.held_up = now && !held;
        (held, running > 0)
    }

    /// A thread to serve the binding beside those it has, when every one is held up: a new
    /// helper if there is room for one, or else a wake-up for a sleeping one.
    fn add_thread(self: &Arc<Self>) {
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        if self.lanes.iter().skip(1).any(|l| l.state.load(Ordering::Relaxed) == lane::ASLEEP) {
            // A parked helper: wake it.
            self.parked.fetch_add(1, Ordering::SeqCst);
            futex_wake(&self.parked, 1);
            return;
        }
        let free = self.lanes.iter().position(|l| {
            l.state.compare_exchange(lane::FREE, lane::AWAKE, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        });
        let Some(at) = free else {
            self.ring();
            return;
        };
        let team = self.clone();
        let spawned = std::thread::Builder::new().name("tiercel-shm-helper".into()).spawn(move || {
            Worker::new(&team, at).help();
            team.lanes[at].state.store(lane::FREE, Ordering::Release);
        });
        match spawned {
            // Joined when the server stops, so that nothing of it outlives `RunningServer::stop`.
            Ok(thread) => {
                let mut threads = self.shared.binding_threads.lock().unwrap_or_else(|p| p.into_inner());
                threads.retain(|t| !t.is_finished());
                threads.push(thread);
            }
            Err(_) => self.lanes[at].state.store(lane::FREE, Ordering::Release),
        }
    }

    /// Stops mapping the data pages of slots whose client has taken the result (but those another
    /// thread holds), so that they no longer count as this binding's memory. The client keeps the
    /// bytes; the server maps them again if it reads them.
    #[cold]
    #[inline(never)]
    fn forget_taken(&self) {
        for j in 0..self.books.len() {
            if self.state(j).load(Ordering::Acquire) != proto::state::IDLE {
                continue;
            }
            let Some(mut b) = self.claim(j) else { continue };
            if b.held > 0 && self.state(j).load(Ordering::Acquire) == proto::state::IDLE {
                self.region.forget(self.layout.data(j as u32), b.held);
                b.held = 0;
                b.charge.settle(0);
            }
            drop(b);
            // A call published while this held the claim may have found no thread to take it
            // (a thread going to sleep skips slots another holds): wake one.
            if proto::server_has_call(self.state(j)) {
                self.ring();
            }
        }
    }
}

/// The team of a binding just granted, and where its async results arrive.
fn new_team(
    shared: &Arc<Shared>,
    binding: Arc<dyn crate::interface::Export>,
    region: Arc<Region>,
    id: u32,
    layout: Layout,
    control: Charge,
) -> (Arc<Team>, AsyncResults) {
    let budget = control.binding.clone();
    let books = (0..layout.slots)
        .map(|_| {
            std::sync::Mutex::new(Books {
                held: 0,
                charge: Charge::new(budget.clone(), shared.memory.clone()),
                retention: Retention::default(),
                #[cfg(feature = "async")]
                pending: false,
                #[cfg(feature = "async")]
                aborted: false,
            })
        })
        .collect();
    #[cfg(feature = "async")]
    let (done, results) = std::sync::mpsc::channel();
    #[cfg(not(feature = "async"))]
    let (results, _) = ((), id);
    let team = Arc::new(Team {
        shared: shared.clone(),
        region,
        layout,
        binding,
        budget,
        books,
        lanes: (0..Team::max_threads(shared, layout.slots)).map(|_| Lane::new()).collect(),
        parked: AtomicU32::new(0),
        last_result: AtomicU64::new(clock::ticks()),
        closed: AtomicBool::new(false),
        _control: control,
        #[cfg(feature = "async")]
        running: AtomicUsize::new(0),
        #[cfg(feature = "async")]
        done,
        #[cfg(feature = "async")]
        id: id | 1 << 31,
    });
    team.lanes[0].state.store(lane::AWAKE, Ordering::Release);
    (team, results)
}

/// Where the results of a binding's async calls arrive (nothing without the `async` feature).
#[cfg(feature = "async")]
type AsyncResults = std::sync::mpsc::Receiver<(u32, Status, Vec<u8>)>;
#[cfg(not(feature = "async"))]
type AsyncResults = ();

/// Serves a binding on its first thread until its client goes away or the server stops.
#[cfg_attr(not(feature = "async"), allow(unused_variables))]
fn serve_first(team: &Team, stream: UnixStream, results: AsyncResults) {
    let shared = &*team.shared;
    // Measure the tick counter's rate now, not on the first call.
    let _ = clock::ticks_per_second();
    let cpus = &shared.config.cpus;
    if !cpus.is_empty() {
        let _ = tiercel_sys::cpu::pin_current_thread(cpus[binding_index(shared) % cpus.len()]);
    }
    shared.stats.bindings.fetch_add(1, Ordering::Relaxed);
    shared.shm_bindings.fetch_add(1, Ordering::Relaxed);
    let mut first = Worker::new(team, 0);
    #[cfg(feature = "async")]
    {
        first.results = Some(results);
    }
    first.run(&stream);
    drop(first);
    team.closed.store(true, Ordering::Release);
    // Parked helpers look at `closed` within their wait's period; wake them now.
    team.parked.fetch_add(1, Ordering::SeqCst);
    futex_wake(&team.parked, i32::MAX as u32);
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

    /// Bytes charged now.
    pub(super) fn charged(&self) -> usize {
        self.charged
    }

    /// The most the binding's budget allows.
    pub(super) fn binding_limit(&self) -> usize {
        self.binding.limit()
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

/// One thread serving a binding: its private copies of arguments and results, and their charge.
struct Worker<'a> {
    team: &'a Team,
    /// Which of the team's lanes is this thread's.
    lane: usize,
    args: Vec<u8>,
    out: Vec<u8>,
    /// The capacity of `args` and `out`, charged.
    charge: Charge,
    /// Leave to spin after a call; without it, this thread sleeps as soon as no call is there.
    lease: super::spinning::SpinLease,
    /// Results of the binding's async calls (the first thread's).
    #[cfg(feature = "async")]
    results: Option<std::sync::mpsc::Receiver<(u32, Status, Vec<u8>)>>,
}

/// A control word of the region. Offsets come from the layout the region was created with, so they
/// are in bounds and aligned.
fn word(region: &Region, at: usize) -> &AtomicU32 {
    region.u32_at(at).unwrap_or_else(|| unreachable!("layout offset {at} inside the region"))
}

impl<'a> Worker<'a> {
    fn new(team: &'a Team, lane: usize) -> Worker<'a> {
        Worker {
            team,
            lane,
            args: Vec::new(),
            out: Vec::new(),
            charge: Charge::new(team.budget.clone(), team.shared.memory.clone()),
            lease: super::spinning::SpinLease::new(&team.shared.spin_leases),
            #[cfg(feature = "async")]
            results: None,
        }
    }

    fn word(&self, at: usize) -> &'a AtomicU32 {
        word(&self.team.region, at)
    }

    #[inline]
    fn mark(&self, what: u32) {
        self.team.lanes[self.lane].state.store(what, Ordering::Relaxed);
    }

    /// Serves every call in the slots that no other thread has taken; true if there were any.
    #[inline]
    fn serve_all(&mut self) -> bool {
        let team = self.team;
        let mut served = false;
        for i in 0..team.used() {
            if !proto::server_has_call(team.state(i)) {
                continue;
            }
            let Some(mut b) = team.claim(i) else { continue };
            // Looked at again under the claim: another thread may have served it meanwhile.
            if Team::runs_async(&b) || !proto::server_has_call(team.state(i)) {
                continue;
            }
            mark(Point::ServerArrived);
            self.mark(lane::RUNNING);
            self.serve(i as u32, &mut b);
            drop(b);
            self.mark(lane::AWAKE);
            let count = &self.team.lanes[self.lane].served;
            count.store(count.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
            steps::close();
            served = true;
        }
        served
    }

    /// The first thread's life: serves the binding's calls until its client goes away or the
    /// server stops, spinning after each call, then sleeping on the region's doorbell.
    fn run(&mut self, stream: &UnixStream) {
        let team = self.team;
        let shared = &*team.shared;
        let (doorbell, sleeping) = (self.word(header::DOORBELL), self.word(header::SERVER_SLEEPING));
        // Spin after each call for twice the recent gap between a result and the next call plus
        // 50 µs (at most `spin`), or always `spin` when adaptation is off; then sleep on the doorbell.
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
        loop {
            let mut served = false;
            #[cfg(feature = "async")]
            if team.running.load(Ordering::Relaxed) > 0 {
                served |= self.finish_async();
            }
            served |= self.serve_all();
            if served {
                // Off the critical path: the result is already published. The gap between results
                // stands for how soon the client calls again.
                let now = clock::ticks();
                budget.observe(clock::elapsed(last_result, now));
                last_result = now;
                team.last_result.store(now, Ordering::Relaxed);
                spin_until = if self.lease.take() { now + clock::ticks_in(budget.budget()) } else { now };
                rounds = rounds.wrapping_add(1);
                idle = 0;
                // A client calling without pause never lets this thread sleep: look at the stop flag
                // now and then all the same.
                if rounds.is_multiple_of(1024) && shared.stop.load(Ordering::Relaxed) {
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
            if team.running.load(Ordering::Relaxed) > 0 {
                self.cancel_async();
            }
            self.lease.give_back();
            self.sleep(doorbell, sleeping, LIVENESS);
            if clock::elapsed(last_result, clock::ticks()) >= LIVENESS {
                // Idle a while: give back the private copies of large arguments and results (kept
                // while calls come, so that a stream of large calls does not fault them in anew),
                // and stop mapping the slot pages whose results the client has taken.
                self.shrink();
                team.forget_taken();
            }
            if shared.stop.load(Ordering::Relaxed) || tiercel_sys::shm::peer_closed(stream) {
                // The client died or dropped the binding: its region goes with this thread.
                shared.stats.expired.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }

    /// A helper's life: serves calls no other thread has taken, spinning after each while it holds
    /// a lease, parked otherwise until the rendezvous thread finds the binding held up again; ends
    /// after [`HELPER_IDLE`] without a call, or with the binding.
    fn help(&mut self) {
        let team = self.team;
        let shared = &*team.shared;
        let spin = clock::ticks_in(shared.config.spin);
        let mut last_call = Instant::now();
        let mut spin_until = clock::ticks();
        let mut idle = 0u32;
        while !team.closed.load(Ordering::Acquire) && !shared.stop.load(Ordering::Relaxed) {
            if self.serve_all() {
                let now = clock::ticks();
                team.last_result.store(now, Ordering::Relaxed);
                spin_until = if self.lease.take() { now + spin } else { now };
                last_call = Instant::now();
                idle = 0;
                continue;
            }
            idle = idle.wrapping_add(1);
            if !idle.is_multiple_of(64) || clock::ticks() < spin_until {
                core::hint::spin_loop();
                continue;
            }
            if last_call.elapsed() >= HELPER_IDLE {
                break;
            }
            self.lease.give_back();
            let bell = team.parked.load(Ordering::SeqCst);
            self.mark(lane::ASLEEP);
            if !team.any_call() {
                futex_wait(&team.parked, bell, Some(LIVENESS));
            }
            self.mark(lane::AWAKE);
            if last_call.elapsed() >= LIVENESS {
                self.shrink();
            }
        }
    }

    /// Sleeps on the doorbell (at most `period`) unless a call no other thread holds is there (the
    /// first thread: helpers park on their own futex).
    fn sleep(&self, doorbell: &AtomicU32, sleeping: &AtomicU32, period: Duration) {
        self.mark(lane::ASLEEP);
        if let Some(bell) = proto::server_prepare_sleep(doorbell, sleeping, || self.team.any_call()) {
            if futex_wait(doorbell, bell, Some(period)) {
                steps::slept(steps::Side::Server);
            }
            proto::server_woke(sleeping);
        }
        self.mark(lane::AWAKE);
    }

    /// Gives back the private copies of large arguments and results.
    fn shrink(&mut self) {
        if self.args.capacity() > retention::LARGE {
            self.args = Vec::new();
        }
        if self.out.capacity() > retention::LARGE {
            self.out = Vec::new();
        }
        self.charge.settle(self.buffers());
    }

    /// Gives back this thread's large private buffers that the call just served (with `len` bytes
    /// of arguments; its result in the arguments' copy if `result_in_args`) did not use.
    #[cold]
    #[inline(never)]
    fn give_back_unused(&mut self, len: usize, result_in_args: bool) {
        if len <= retention::LARGE && self.args.capacity() > retention::LARGE {
            self.args = Vec::new();
        }
        if (result_in_args || self.out.len() <= retention::LARGE) && self.out.capacity() > retention::LARGE {
            self.out = Vec::new();
        }
        self.charge.settle(self.buffers());
    }

    /// Bytes of this thread's private buffers.
    fn buffers(&self) -> usize {
        self.args.capacity() + self.out.capacity()
    }

    /// Charges slot `b` holding `held` bytes and this thread's buffers with room for `args` bytes of
    /// arguments; true if both fit. Without room, the slot's charge is left as it was.
    fn settle(&mut self, b: &mut Books, held: usize, args: usize) -> bool {
        let buffers = self.buffers() + args.saturating_sub(self.args.capacity());
        if !b.charge.settle(held) {
            return false;
        }
        if self.charge.settle(buffers) {
            b.held = held;
            return true;
        }
        b.charge.settle(b.held);
        false
    }

    /// Charges slot `b` with `held` bytes mapped and the argument buffer with `args` bytes; if the
    /// budgets have no room, first gives back what can be given back.
    #[cold]
    #[inline(never)]
    fn make_room(&mut self, b: &mut Books, held: usize, args: usize) -> bool {
        let held = held.max(b.held);
        self.settle(b, held, args) || {
            self.team.forget_taken();
            if self.args.capacity() > args {
                self.args = Vec::new();
            }
            self.out = Vec::new();
            self.settle(b, held, args)
        }
    }

    /// Runs the call in slot `i` (claimed: `b`): reads what the client wrote once into private
    /// memory, validates it, runs the procedure, writes the result in place and publishes it.
    fn serve(&mut self, i: u32, b: &mut Books) {
        let team = self.team;
        let base = team.layout.slot(i);
        let data = team.layout.data(i);
        // Each control word is read once; the call is validated before anything uses it.
        let procedure = self.word(base + slot::PROCEDURE).load(Ordering::Relaxed);
        let len = self.word(base + slot::LEN).load(Ordering::Relaxed);
        let deadline = proto::deadline_from_words(
            self.word(base + slot::DEADLINE_LO).load(Ordering::Relaxed),
            self.word(base + slot::DEADLINE_HI).load(Ordering::Relaxed),
        );
        let cancelled = self.word(base + slot::CANCEL).load(Ordering::Relaxed) != 0;
        self.out.clear();
        let call = proto::validate_call(procedure, len, team.layout.data);
        mark(Point::ServerValidated);
        let len = call.map_or(0, |c| c.len);
        // The pages the call's arguments (and at least an error message) take, charged before they
        // are touched; the fast path finds them charged already.
        let pages = len.max(1).next_multiple_of(PAGE);
        // A grown argument buffer has a page of room past the arguments, for the return value an
        // in-place procedure appends there (`serve_in_place`): without it that would grow the
        // buffer to twice the arguments.
        let fits = b.held >= pages && self.args.capacity() >= len || self.make_room(b, pages, len + PAGE);
        let status = match call {
            _ if !fits => {
                // No room in the budgets: refused unread, nothing written to the slot's data.
                team.shared.stats.busy.fetch_add(1, Ordering::Relaxed);
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
                team.shared.stats.cancelled.fetch_add(1, Ordering::Relaxed);
                Status::Cancelled
            }
            Some(call) => {
                if self.args.capacity() < call.len {
                    self.args.reserve_exact(call.len + PAGE - self.args.len());
                }
                self.args.resize(call.len, 0);
                team.region.read(data, &mut self.args);
                mark(Point::ServerAccepted);
                #[cfg(feature = "async")]
                if team.shared.asynch.is_some() && team.binding.is_async(call.procedure) {
                    match self.start_async(i, b, call, deadline) {
                        // The result comes later, through `finish_async`.
                        Ok(()) => return,
                        Err(status) => return self.publish(i, b, status, 0),
                    }
                }
                team.shared.stats.calls.fetch_add(1, Ordering::Relaxed);
                let limit = team.layout.data;
                let arrival = Arrival {
                    // A relative deadline is the network's: this transport carries the instant.
                    at: None,
                    context: call.context,
                    deadline: deadline.map(tiercel_sys::clock::instant_of_monotonic),
                    transport: "shm",
                };
                if call.len > IN_PLACE && team.binding.in_place(call.procedure) {
                    return self.serve_in_place(i, b, call.procedure, arrival, len);
                }
                let mut status = super::dispatch::run_procedure(
                    &team.shared,
                    &team.binding,
                    call.procedure,
                    &self.args,
                    arrival,
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
                if self.out.len() > b.held || self.buffers() > self.charge.charged {
                    status = self.charge_result(b, status);
                }
                status
            }
        };
        self.publish(i, b, status, len);
    }

    /// Runs a call of an in-place procedure ([`crate::Export::in_place`]) on its arguments' private
    /// copy, where its `InOut` buffer is changed and its return value appended, and publishes the
    /// result from there: no result buffer grows to the buffer's size, and it is not copied once
    /// more. An error goes back from `self.out`.
    #[cold]
    #[inline(never)]
    fn serve_in_place(&mut self, i: u32, b: &mut Books, procedure: u16, arrival: Arrival, len: usize) {
        let team = self.team;
        let ran = super::dispatch::run_in_place(
            &team.shared,
            &team.binding,
            procedure,
            &mut self.args,
            0,
            arrival,
            &mut self.out,
            0,
        );
        let limit = team.layout.data;
        match ran {
            Ok(body) if self.args.len() - body <= limit => {
                // The return value may have grown the arguments' copy, and the result may reach
                // past the pages the call took: charged first, as any result.
                let n = self.args.len() - body;
                let held = b.held.max(n.next_multiple_of(PAGE));
                let fits = (held == b.held && self.buffers() <= self.charge.charged) || self.settle(b, held, 0) || {
                    self.team.forget_taken();
                    self.settle(b, held, 0)
                };
                if fits {
                    team.shared.stats.in_place.fetch_add(1, Ordering::Relaxed);
                    return self.publish_from(i, b, Status::Ok, len, Some(body));
                }
                self.args = Vec::new();
                let message = format!("result of {n} bytes exceeds the server's shared-memory budget");
                super::dispatch::error_message(&mut self.out, &message);
                self.charge.settle(self.buffers());
                self.publish(i, b, Status::ResultTooLarge, len)
            }
            Ok(body) => {
                let n = self.args.len() - body;
                super::dispatch::error_message(
                    &mut self.out,
                    &format!("result of {n} bytes exceeds the slot's {limit}"),
                );
                self.publish(i, b, Status::ResultTooLarge, len)
            }
            Err(status) => self.publish(i, b, status, len),
        }
    }

    /// Writes the result in `self.out` with `status` into slot `i` (claimed: `b`), whose call had
    /// `len` bytes of arguments, and publishes it.
    fn publish(&mut self, i: u32, b: &mut Books, status: Status, len: usize) {
        self.publish_from(i, b, status, len, None)
    }

    /// [`Self::publish`] of the result in `self.out`, or with `in_args`, in `self.args` from there on
    /// (an in-place procedure's).
    fn publish_from(&mut self, i: u32, b: &mut Books, status: Status, len: usize, in_args: Option<usize>) {
        let team = self.team;
        let base = team.layout.slot(i);
        let data = team.layout.data(i);
        let out = match in_args {
            Some(body) => &self.args[body..],
            None => &self.out[..],
        };
        team.region.write(data, out);
        let out_len = out.len();
        self.word(base + slot::LEN).store(out_len as u32, Ordering::Relaxed);
        self.word(base + slot::STATUS).store(status as u32, Ordering::Relaxed);
        // The binding holds more than three quarters of its budget. (Not half: a maximum-size
        // call's slot pages and private copy take half the default budget by themselves, and giving
        // them back after every such call made a stream of them 13 times slower.)
        let pressed = || team.budget.used() > team.budget.limit() / 4 * 3;
        if (len > retention::LARGE || out_len > retention::LARGE) && pressed() {
            // First the private buffer a large call of another shape grew and this one left
            // unused: only this process pays to grow it again, while the slot's pages given back
            // are faulted in anew by both (large Out results alternating with large In arguments
            // had the slot's pages given back after every In call, which took twice as long).
            self.give_back_unused(len, in_args.is_some());
        }
        let extent = b.held;
        let result = out_len.next_multiple_of(PAGE);
        if len > retention::LARGE && extent > result {
            // The arguments were large: give back the part of the slot the result does not cover,
            // but not on every call (a stream of large calls would fault the pages in anew) unless
            // the binding is still pressed.
            if b.retention.large(Instant::now()) || pressed() {
                team.region.discard(data + result, extent - result);
                team.shared.stats.given_back.fetch_add((extent - result) as u64, Ordering::Relaxed);
                b.held = result;
                b.charge.settle(result);
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

    /// Starts the call in slot `i` (claimed: `b`; its arguments in `self.args`) on the async
    /// runtime. Refused at once: the status to answer with, its message in `self.out`.
    #[cfg(feature = "async")]
    fn start_async(
        &mut self,
        i: u32,
        b: &mut Books,
        call: proto::SlotCall,
        deadline: Option<u64>,
    ) -> Result<(), Status> {
        let team = self.team;
        let (done, region) = (team.done.clone(), team.region.clone());
        let finish = move |status: Status, results: Vec<u8>| {
            // The binding's first thread writes the result; wake it if it sleeps. A binding gone
            // since drops the result.
            if done.send((i, status, results)).is_ok() {
                let bell = word(&region, header::DOORBELL);
                bell.fetch_add(1, Ordering::SeqCst);
                futex_wake(bell, i32::MAX as u32);
            }
        };
        let arrival = Arrival {
            at: None,
            context: call.context,
            deadline: deadline.map(tiercel_sys::clock::instant_of_monotonic),
            transport: "shm",
        };
        let key = (team.id, i, 0);
        let started = super::dispatch::start_async(
            &team.shared,
            &team.binding,
            call.procedure,
            &self.args,
            arrival,
            &mut self.out,
            team.layout.data,
            key,
            finish,
        );
        match started {
            Some(Ok(())) => {
                b.pending = true;
                team.running.fetch_add(1, Ordering::AcqRel);
                Ok(())
            }
            Some(Err(status)) => Err(status),
            None => unreachable!("the procedure is async"),
        }
    }

    /// Writes the results of async calls that ended into their slots; true if there were any.
    /// (The first thread's: it holds the receiver.)
    #[cfg(feature = "async")]
    fn finish_async(&mut self) -> bool {
        let mut any = false;
        while let Some(Ok((i, mut status, results))) = self.results.as_ref().map(|r| r.try_recv()) {
            let team = self.team;
            let at = i as usize;
            // Another thread holds the claim only while it looks and sees the call pending.
            let mut b = team.books(at);
            b.pending = false;
            b.aborted = false;
            team.running.fetch_sub(1, Ordering::AcqRel);
            any = true;
            self.out.clear();
            let limit = team.layout.data;
            if results.len() > limit {
                super::dispatch::error_message(
                    &mut self.out,
                    &format!("result of {} bytes exceeds the slot's {limit}", results.len()),
                );
                status = Status::ResultTooLarge;
            } else {
                self.out.extend_from_slice(&results);
            }
            if self.out.len() > b.held || self.buffers() > self.charge.charged {
                status = self.charge_result(&mut b, status);
            }
            self.publish(i, &mut b, status, 0);
        }
        any
    }

    /// Aborts the async calls whose clients have given them up (the slot's cancel word).
    #[cfg(feature = "async")]
    fn cancel_async(&mut self) {
        let team = self.team;
        let Some(runner) = &team.shared.asynch else { return };
        for i in 0..team.books.len() {
            let Some(mut b) = team.claim(i) else { continue };
            if !b.pending || b.aborted {
                continue;
            }
            let cancel = self.word(team.layout.slot(i as u32) + slot::CANCEL);
            if cancel.load(Ordering::Relaxed) != 0 && runner.cancel((team.id, i as u32, 0)) {
                b.aborted = true;
                team.shared.stats.cancelled.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Charges the pages a result written to slot `b` takes, and the buffers the procedure grew.
    /// A result the budgets have no room for is replaced by an error that says so (the procedure
    /// ran), as over UDP.
    #[cold]
    #[inline(never)]
    fn charge_result(&mut self, b: &mut Books, status: Status) -> Status {
        let held = b.held.max(self.out.len().next_multiple_of(PAGE));
        if self.settle(b, held, 0) {
            return status;
        }
        // The arguments are no longer needed.
        self.args = Vec::new();
        self.team.forget_taken();
        if self.settle(b, held, 0) {
            return status;
        }
        let n = self.out.len();
        self.out = Vec::new();
        super::dispatch::error_message(
            &mut self.out,
            &format!("result of {n} bytes exceeds the server's shared-memory budget"),
        );
        // At most a page of message, in a page charged before the call ran.
        self.charge.settle(self.buffers());
        Status::ResultTooLarge
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rendezvous_name_already_held_is_an_error_not_a_silent_fallback() {
        let random = crate::random::bytes().unwrap();
        let first = open_named(random).expect("a fresh name binds");
        assert_eq!(first.rendezvous.name, random);
        assert_eq!((first.rendezvous.pid, first.rendezvous.uid), tiercel_sys::shm::own_credentials());
        let again = open_named(random).err().expect("a name already held is refused");
        assert_eq!(again.kind(), std::io::ErrorKind::AddrInUse);
        let started = crate::ServerError::SharedMemory(again).to_string();
        assert!(started.contains("cannot offer shared memory"), "{started}");
    }
}
