//! The server side of the shared-memory transport: the rendezvous listener, and for each binding
//! the threads that serve its slots, spinning for `ServerConfig::spin` after each call and then
//! sleeping on the region's doorbell futex.
//!
//! A binding starts with one thread. While every awake thread of a binding has been running a slow
//! call (see `crate::waiting::crew::slow_calls`) at two of the rendezvous thread's looks in a row (a [`LOOK`] apart
//! while its threads are busy, up to 8 ms apart otherwise) and another call waits, the rendezvous
//! thread starts a helper (or wakes a parked one), up to `ServerConfig::workers`, so that a slow
//! procedure holds up only its own caller. A thread claims a slot's call (the lock of the slot's
//! [`Books`]) before it reads it, and keeps the claim for the slot's next call until it serves another
//! slot or sleeps.
//!
//! Before a client has a binding it costs no thread: the rendezvous thread runs every bind exchange
//! itself, on non-blocking sockets, through the same doorway as TCP's (`super::handshake`): at
//! most [`MAX_HANDSHAKES`] at once and [`MAX_HANDSHAKES_PER_SOURCE`] of one user, each within
//! `HANDSHAKE` from its connection. A binding's memory (the slot pages the server has mapped, and its private
//! copies of arguments and results) is charged to `ServerConfig::binding_memory` and to the
//! server-wide `ServerConfig::message_memory` before it is touched; a call that does not fit is
//! answered `Busy` without reading it (its client tries again later), or `TooLarge` if no budget
//! could ever hold it.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tiercel_proto::bind::Rendezvous;
use tiercel_proto::endpoint::{Caller, Carrier};
use tiercel_proto::shm::{self as proto, header, Layout, PAGE};
use tiercel_sys::shm::Region;

use super::handshake::{Broken, Doorway, Exchange, Step};
use super::Shared;
use crate::rendezvous;

#[cfg(feature = "async")]
mod asynch;
mod team;
mod worker;

use super::charge::Charge;
pub(super) use team::Team;
use team::*;
use worker::*;

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

/// The connections of the bindings, watched for their clients hanging up: a binding whose client
/// is gone gives its memory back at once, not at its first thread's next look (a sleep's period,
/// [`LIVENESS`], later). A scratch client that made 16 MiB `In` calls, run again just after the
/// last one ended, had its first call refused `Busy` for the memory of the binding gone.
struct HangUps {
    /// An `epoll` set of the connections, armed once each; `None` if it could not be made (the
    /// bindings are then seen gone at their threads' looks only).
    set: Option<tiercel_sys::tcp::Parked>,
    /// Each watched connection's token, and its team. (No descriptor is kept here: the set forgets
    /// a connection when its last one, its first thread's, closes.)
    watched: Vec<(u64, std::sync::Weak<Team>)>,
    next: u64,
    ready: Vec<u64>,
}

impl HangUps {
    fn new() -> HangUps {
        HangUps { set: tiercel_sys::tcp::Parked::new().ok(), watched: Vec::new(), next: 0, ready: Vec::new() }
    }

    /// Watches `connection`, the client's of `team`.
    fn watch(&mut self, team: &std::sync::Weak<Team>, connection: std::os::fd::BorrowedFd<'_>) {
        let Some(set) = &self.set else { return };
        self.next += 1;
        if set.park(connection, self.next).is_ok() {
            self.watched.push((self.next, team.clone()));
        }
    }

    /// Marks the teams whose connections hung up (reported by the set, once each) and wakes their
    /// threads; forgets those, and teams that have ended.
    fn tend(&mut self) {
        let Some(set) = &self.set else { return };
        if set.ready(&mut self.ready).is_err() {
            self.ready.clear();
        }
        let ready = &self.ready;
        self.watched.retain(|(token, team)| match (ready.contains(token), team.upgrade()) {
            (_, None) => false,
            (true, Some(team)) => {
                team.hang_up();
                false
            }
            (false, Some(_)) => true,
        });
    }

    /// What to wait on beside the listener.
    fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.set.as_ref().map(std::os::fd::AsFd::as_fd)
    }
}

fn accept_loop(shared: Arc<Shared>, listener: UnixListener) {
    let mut doorway: Doorway<u32, Connecting> =
        Doorway::new(MAX_HANDSHAKES, MAX_HANDSHAKES_PER_SOURCE, super::Door::Shm);
    let mut teams = Vec::new();
    let mut hang_ups = HangUps::new();
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
        hang_ups.tend();
        let looked = look_after(&mut teams, beat, last_look.elapsed());
        last_look = Instant::now();
        waited = if looked.in_use { crate::waiting::crew::next_look(waited, looked.all_busy) } else { LOOK };
        let period = if looked.in_use { waited } else { HEARTBEAT };
        // What becomes of a connection in the bind exchange after some progress.
        let mut progress = |connecting: &mut Connecting, step: Step| match step {
            Step::Wait => true,
            // (Never over the rendezvous socket: its requests are plain.)
            Step::Done | Step::Hello(_) => false,
            Step::Admit(admission) => {
                if let Some(team) = bind(&shared, connecting, admission) {
                    // (The same connection as the first thread's, which keeps it open.)
                    hang_ups.watch(&team, std::os::fd::AsFd::as_fd(&connecting.stream));
                    teams.push((team, Watch::default()));
                }
                false
            }
        };
        let open = |(stream, _): (UnixStream, UnixAddr)| {
            // The user the kernel recorded for the connection: what limits its share of the
            // handshakes.
            let (_, uid) = tiercel_sys::shm::peer_credentials(&stream).ok()?;
            if stream.set_nonblocking(true).is_err() {
                // Closing the connection unread tells the client (it reads end of file, and
                // binds over UDP).
                shared.stats.rejected.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            Some((uid, Connecting { stream, partial: Vec::new() }))
        };
        let more = doorway.take_arrivals(&shared, || listener.accept(), open, &mut progress);
        doorway.tend(&shared, &mut progress);
        let period = if teams.is_empty() { HEARTBEAT } else { period };
        if !more {
            doorway.wait(&shared, std::os::fd::AsFd::as_fd(&listener), hang_ups.fd(), period);
        }
    }
}

/// Makes the binding (its region, its first thread) a connection's bind request was admitted to,
/// and answers with the grant and the region (or busy, without room): the binding's team, for the
/// rendezvous thread to watch.
fn bind(
    shared: &Arc<Shared>,
    h: &mut Connecting,
    admission: tiercel_proto::bind::Admission,
) -> Option<std::sync::Weak<Team>> {
    let machine = shared.bind_machine(super::Door::Shm);
    let slots = shared.config.slots_per_binding.clamp(1, proto::MAX_SLOTS);
    // The header and the slots' control pages are the server's from the start.
    let control = PAGE * (1 + slots as usize);
    let export = shared.exports[admission.export].clone();
    // Its memory lies within its user's part of shared memory's share.
    let features = admission.features();
    let place = match tiercel_sys::shm::peer_credentials(&h.stream) {
        Ok((pid, uid)) => {
            let caller = Caller::Process { uid, pid };
            shared.endpoint.connect_from(Carrier::Region, caller, features, export, Instant::now())
        }
        Err(_) => shared.endpoint.connect(Carrier::Region, export, Instant::now()),
    };
    let Some(place) = place else {
        shared.stats.rejected.fetch_add(1, Ordering::Relaxed);
        h.answer(&admission.busy(&machine));
        return None;
    };
    // Taken out of the endpoint again unless the binding's first thread starts.
    let release = Release(shared, Some(place.clone()));
    let mut charged = Charge::new(place.budget());
    let made =
        charged.reserve(control).then(|| Layout::new(slots, shared.config.timing.max_message)).flatten().and_then(
            |layout| {
                let region = Region::create("tiercel-binding", layout.region_len()?).ok()?;
                for (at, v) in layout.header_words() {
                    region.u32_at(at)?.store(v, Ordering::Relaxed);
                }
                // Whether the binding's threads issue a system-wide barrier before they sleep: its
                // clients may then publish their calls without a fence
                // (`proto::client_publish_light`).
                let barrier = u32::from(issues_barriers(&shared.config));
                region.u32_at(header::SERVER_BARRIER)?.store(barrier, Ordering::Relaxed);
                Some((region, layout))
            },
        );
    let Some((region, layout)) = made else {
        shared.stats.rejected.fetch_add(1, Ordering::Relaxed);
        h.answer(&admission.busy(&machine));
        return None;
    };
    let region = Arc::new(region);
    let reply = admission.grant(&machine, place.id, 0, slots, layout.data as u64);
    let stream = h.stream.try_clone().ok()?;
    if rendezvous::send(&stream, &reply, Some(region.fd())).is_err() || stream.set_nonblocking(false).is_err() {
        return None;
    }
    let (team, results) = new_team(shared, place, region, layout, charged);
    let watched = Arc::downgrade(&team);
    shared.shm_teams.lock().unwrap_or_else(|p| p.into_inner()).push(watched.clone());
    // Joined when the server stops, so that nothing of it outlives `RunningServer::stop`.
    let spawned = crate::server::spawn_kept(&shared.binding_threads, || {
        std::thread::Builder::new()
            .name("tiercel-shm-binding".into())
            .spawn(move || serve_first(&team, stream, results))
    });
    match spawned {
        Ok(()) => {
            // The first thread releases it when the binding ends.
            release.keep();
            Some(watched)
        }
        // No thread: the connection (and with it the region) goes, and the client sees it closed.
        Err(_) => None,
    }
}

/// Takes a binding out of the endpoint when dropped, unless kept: a bind that fails halfway
/// leaves no place taken.
struct Release<'a>(&'a Shared, Option<Arc<crate::server::EndpointBinding>>);

impl Release<'_> {
    fn keep(mut self) {
        self.1 = None;
    }
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        if let Some(place) = self.1.take() {
            self.0.endpoint.release(&place);
        }
    }
}

/// Whether the threads of a binding of a server with `config` issue a system-wide barrier
/// (`membarrier`) before they sleep, so that its clients publish their calls with a compiler fence
/// only ([`header::SERVER_BARRIER`]): when the kernel has the barrier and the server spins. A
/// server that never spins (`spin` zero) sleeps after every call, and the barrier, a system call,
/// would come before each of them; its clients fence themselves instead (a full fence a call,
/// which waits for nothing while the server sleeps). Decided when the region is made and never
/// changed: a client that read the word publishes as it says.
pub(super) fn issues_barriers(config: &crate::ServerConfig) -> bool {
    !config.spin.is_zero() && tiercel_sys::shm::barriers_available()
}

/// Calls of shared-memory bindings running now: threads marked running a call in their lane (a
/// plain store each, where counting calls in a shared word would cost every call an atomic
/// read-modify-write). A draining server waits for them as for the other transports' calls.
pub(super) fn calls_running(shared: &Shared) -> usize {
    let mut teams = shared.shm_teams.lock().unwrap_or_else(|p| p.into_inner());
    teams.retain(|t| t.strong_count() > 0);
    teams
        .iter()
        .filter_map(std::sync::Weak::upgrade)
        .map(|t| t.lanes.iter().filter(|l| l.state.load(Ordering::Acquire) == lane::RUNNING).count())
        .sum()
}

/// Which of the server's CPUs a new binding's first thread takes (round robin).
fn binding_index(shared: &Shared) -> usize {
    shared.shm_bindings.load(Ordering::Relaxed)
}

/// How soon the rendezvous thread looks again whether a binding in use needs another thread, after
/// a look that found every awake thread of a binding running a call (after other looks, twice the
/// wait before, up to `crew::MAX_LOOK`).
const LOOK: Duration = crate::waiting::crew::TICK;
/// A binding whose last call ended longer ago than this is looked at only once a [`HEARTBEAT`].
const IN_USE: Duration = Duration::from_secs(1);
/// A binding's extra thread that has served no call for this long ends.
const HELPER_IDLE: Duration = Duration::from_secs(5);

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
