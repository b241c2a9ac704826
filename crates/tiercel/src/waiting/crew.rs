//! Which UDP workers read the socket: one leader, and followers that take over only while every
//! reader is held up in a long procedure.
//!
//! A worker that reads the socket (a *listener*) runs the calls it reads inline, so a Null call
//! costs one thread no handoff. Every listener that waits in `epoll` is woken by a datagram even
//! when another listener (spinning) takes it, and on a small machine those wake-ups take the CPU
//! that the caller or the spinning listener needs: four workers all listening made a single
//! caller's calls twice as slow, with a p99 six times the raw ping-pong's. So by default one
//! worker listens and the others stand by, parked. One of them, the *deputy*, looks now and then
//! while calls are being made: when every listener was running a call at two looks in a row and
//! none started in between (the server's count of calls started has not moved), or was running
//! slow calls at [`QUEUED_LOOKS`] looks in a row while datagrams waited in the socket, it becomes a
//! listener itself, up to `ServerConfig::workers` listeners. It looks again a [`TICK`] after a look
//! that found every listener running a call, and otherwise waits twice as long as the time before,
//! up to [`MAX_LOOK`]: each look wakes a thread on the server's CPUs, and looking every tick while
//! quick calls streamed took the spinning listener's CPU a thousand times a second (Null's p99 over
//! UDP was 29.5 µs against 10.4 with a single worker, which has no deputy). So a long procedure
//! never holds up the short calls behind it for more than about [`MAX_LOOK`] and a tick, and calls
//! whose procedures block (on a disk, on another service) run side by side instead of queueing
//! behind one another. A listener that has found nothing to read for [`MAX_LOOK`] (after its
//! spin) while another listener is free stands by again. (A listener that has just sent a result
//! finds nothing until its caller's next call comes: standing by then, listeners made 4 callers'
//! calls of a procedure that sleeps 1 ms 0.77 and 0.80 times as many a second as 4 times one
//! caller's, 8 callers' 0.72 and 0.73 times; waiting, 0.90 to 0.98 and 0.75 to 0.80: two runs of
//! the bench's blocking table before, three after.) The deputy's looks stop while
//! the server is idle, and resume when a listener wakes for a datagram.
//!
//! A server with several sockets on its port (`ServerConfig::sockets`) has one listener on each
//! from the start, and one pool of workers standing by: the deputy looks at each socket when its
//! time comes, by the same rules and with that socket's own counts of calls running and started,
//! and sends a worker to whichever has calls held up. A listener stands by only while another
//! listener of its own socket is free, so no socket is left without one.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Calls shorter than this on average are not worth another server thread while calls wait: one
/// thread takes them as they come (on a small machine a second only takes the callers' CPU, and a
/// UDP listener waiting in `epoll` costs every datagram a wake-up).
pub(crate) const SLOW_CALL: std::time::Duration = std::time::Duration::from_micros(50);

/// Whether the calls were slow (see [`SLOW_CALL`]): `calls` went through in `period` on `threads`
/// threads, fewer than one per [`SLOW_CALL`] per thread. Used by every transport to decide whether
/// calls that wait while every thread runs one are worth another thread.
pub(crate) fn slow_calls(calls: u64, threads: usize, period: std::time::Duration) -> bool {
    let per_thread = (period.as_nanos() / SLOW_CALL.as_nanos()) as u64;
    calls < threads as u64 * per_thread
}

/// How soon the deputy looks again after a look at which every listener was running a call.
pub(crate) const TICK: Duration = Duration::from_millis(1);

/// The longest the deputy waits between looks while calls are being made (after looks that found
/// a listener free, each wait twice the one before).
pub(crate) const MAX_LOOK: Duration = Duration::from_millis(8);

/// The wait before the next look of a thread that looks whether calls are held up (the deputy, the
/// shared-memory rendezvous thread), `waited` having been the last: a [`TICK`] after a look that
/// found every thread serving the calls running one (`all_busy`), else twice the last wait, up to
/// [`MAX_LOOK`].
pub(crate) fn next_look(waited: Duration, all_busy: bool) -> Duration {
    if all_busy {
        TICK
    } else {
        (waited * 2).clamp(TICK, MAX_LOOK)
    }
}

/// Looks in a row at which every listener runs a call while datagrams wait that make the deputy a
/// listener. (At one look, or two, a caller whose next call arrives as its result goes out can
/// look the same.)
pub(crate) const QUEUED_LOOKS: u8 = 3;

/// After this many looks without a new call (and with a listener free), the deputy stops looking
/// until a listener wakes from a blocking wait.
const IDLE_LOOKS: u32 = 100;

/// How long an idle deputy sleeps at most before looking again (in case a wake-up was missed).
const IDLE_LOOK: Duration = Duration::from_millis(100);

pub(crate) struct Crew {
    /// Workers in the listener role on each of the server's sockets (reading it or running a call
    /// they read); at least 1 each.
    listeners: Vec<AtomicUsize>,
    /// Most listeners, on all sockets together (`ServerConfig::workers`).
    workers: usize,
    /// The deputy looks only now and then: a listener that wakes for a datagram wakes it.
    deputy_idle: AtomicBool,
    roles: Mutex<Roles>,
    /// Where standing-by workers other than the deputy wait.
    changed: Condvar,
    /// Where the deputy waits between looks.
    look: Condvar,
    /// When a listener next sweeps the endpoint (idle bindings, stalled calls): milliseconds after
    /// `epoch`.
    next_sweep: AtomicU64,
    epoch: Instant,
}

struct Roles {
    /// Whether a standing-by worker is the deputy.
    deputy: bool,
    /// The deputy's memory of each socket, kept here between deputies so that becoming the deputy
    /// allocates nothing (the deputy takes it and gives it back).
    memory: Vec<(Deputy, Instant)>,
}

/// What a standing-by worker does next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Standby {
    /// Read the socket of this index.
    Listen(usize),
    /// The server is stopping.
    Stop,
}

impl Crew {
    /// A crew of `workers` for `sockets` sockets, in which one worker listens on each.
    pub(crate) fn new(workers: usize, sockets: usize) -> Crew {
        let sockets = sockets.max(1);
        Crew {
            listeners: (0..sockets).map(|_| AtomicUsize::new(1)).collect(),
            workers: workers.max(sockets),
            deputy_idle: AtomicBool::new(false),
            roles: Mutex::new(Roles { deputy: false, memory: Vec::with_capacity(sockets) }),
            changed: Condvar::new(),
            look: Condvar::new(),
            next_sweep: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    /// Listeners now, on every socket.
    #[cfg(test)]
    fn listeners(&self) -> usize {
        self.listeners.iter().map(|l| l.load(Ordering::Acquire)).sum()
    }

    /// Whether a listener on socket `lane` that found nothing to read should stand by: it has found
    /// nothing for at least [`MAX_LOOK`] (`found_nothing_for()`), and another listener of that
    /// socket is free (`running()` of its listeners are running calls). One atomic load while a
    /// single worker listens there.
    pub(crate) fn should_stand_by(
        &self,
        lane: usize,
        found_nothing_for: impl FnOnce() -> Duration,
        running: impl FnOnce() -> usize,
    ) -> bool {
        let Some(count) = self.listeners.get(lane) else { return false };
        if count.load(Ordering::Acquire) == 1 || found_nothing_for() < MAX_LOOK {
            return false;
        }
        let _roles = self.lock();
        let listeners = count.load(Ordering::Acquire);
        if listeners > 1 && listeners.saturating_sub(running()) >= 2 {
            count.store(listeners - 1, Ordering::Release);
            return true;
        }
        false
    }

    /// Parks a worker that is not listening until it is to listen, or the server stops. One
    /// standing-by worker at a time is the deputy and decides when another listener is needed on
    /// a socket, looking at each socket when its time comes: `running(lane)` gives the listeners
    /// of socket `lane` running calls, `started(lane)` the count of calls they have started,
    /// `queued(lane)` whether a datagram waits in that socket (asked only while every listener
    /// there runs a call).
    pub(crate) fn stand_by(
        &self,
        stop: &AtomicBool,
        running: impl Fn(usize) -> usize,
        started: impl Fn(usize) -> u64,
        queued: impl Fn(usize) -> bool,
    ) -> Standby {
        let mut roles = self.lock();
        // The deputy's memory of each socket, and when it looks at it next (empty unless this
        // worker is the deputy; taken from and given back to `Roles::memory`).
        let mut deputy: Vec<(Deputy, Instant)> = Vec::new();
        loop {
            if stop.load(Ordering::Acquire) {
                if !deputy.is_empty() {
                    roles.deputy = false;
                    deputy.clear();
                    roles.memory = deputy;
                }
                return Standby::Stop;
            }
            if deputy.is_empty() && !roles.deputy {
                roles.deputy = true;
                let now = Instant::now();
                deputy = std::mem::take(&mut roles.memory);
                deputy.extend((0..self.listeners.len()).map(|lane| (Deputy::new(started(lane)), now)));
            }
            if deputy.is_empty() {
                roles = self.changed.wait(roles).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            let now = Instant::now();
            let spare = self.workers.saturating_sub(self.listeners.iter().map(|l| l.load(Ordering::Acquire)).sum());
            let mut period = IDLE_LOOK;
            for (lane, (d, due)) in deputy.iter_mut().enumerate() {
                if now < *due {
                    period = period.min(*due - now);
                    continue;
                }
                let count = &self.listeners[lane];
                let listeners = count.load(Ordering::Acquire);
                match d.look(listeners, listeners + spare, running(lane), started(lane), || queued(lane)) {
                    Look::Listen => {
                        count.store(listeners + 1, Ordering::Release);
                        roles.deputy = false;
                        deputy.clear();
                        roles.memory = deputy;
                        // Another standing-by worker becomes the deputy.
                        self.changed.notify_one();
                        return Standby::Listen(lane);
                    }
                    Look::Again(wait) => {
                        *due = now + wait;
                        period = period.min(wait);
                    }
                }
            }
            // Idle only when every socket is: then a listener woken by a datagram wakes it.
            let idle = deputy.iter().all(|(d, _)| d.idle());
            if idle {
                self.deputy_idle.store(true, Ordering::Release);
            }
            roles = self.look.wait_timeout(roles, period).map(|(g, _)| g).unwrap_or_else(|p| p.into_inner().0);
            if idle && !self.deputy_idle.swap(false, Ordering::AcqRel) {
                // A listener woke for a datagram: calls may be coming again.
                let now = Instant::now();
                for (d, due) in &mut deputy {
                    d.wake();
                    *due = now;
                }
            }
        }
    }

    /// A listener woke from a blocking wait with a datagram: the server may be busy again, so an
    /// idle deputy goes back to looking every tick. One atomic load when the deputy is not idle.
    pub(crate) fn woke(&self) {
        if self.deputy_idle.load(Ordering::Acquire) && self.deputy_idle.swap(false, Ordering::AcqRel) {
            let _roles = self.lock();
            self.look.notify_all();
        }
    }

    /// Wakes every standing-by worker: the server is stopping (`stop` is already set).
    pub(crate) fn release(&self) {
        let _roles = self.lock();
        self.changed.notify_all();
        self.look.notify_all();
    }

    /// Whether it is time for a listener to sweep the endpoint; true for one caller every `every`.
    pub(crate) fn sweep_due(&self, now: Instant, every: Duration) -> bool {
        let at = now.saturating_duration_since(self.epoch).as_millis() as u64;
        let due = self.next_sweep.load(Ordering::Relaxed);
        at >= due
            && self
                .next_sweep
                .compare_exchange(due, at + every.as_millis() as u64, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Roles> {
        self.roles.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What the deputy remembers between its looks.
#[derive(Debug)]
struct Deputy {
    /// The count of calls started at the last look, if every listener was running a call then.
    held_up: Option<u64>,
    /// Looks in a row, up to the last, at which every listener was running a call while a datagram
    /// waited.
    queued: u8,
    /// The count of calls started at the last look.
    last_started: u64,
    /// Looks in a row with no new call and a listener free.
    quiet: u32,
    /// How long the deputy waited before this look.
    waited: Duration,
}

/// The deputy's decision after a look.
#[derive(Debug, PartialEq, Eq)]
enum Look {
    /// Become a listener.
    Listen,
    /// Look again after this long.
    Again(Duration),
}

impl Deputy {
    fn new(started: u64) -> Deputy {
        Deputy { held_up: None, queued: 0, last_started: started, quiet: 0, waited: TICK }
    }

    /// One look: `listeners` of at most `workers` read the socket, `running` of them run a call,
    /// `started` calls have been started so far, and `queued()` says whether a datagram waits.
    /// Another listener is needed when every listener was running the same calls at two looks in a
    /// row (none started in between), or was running slow calls (see [`slow_calls`]) while
    /// datagrams waited at [`QUEUED_LOOKS`] looks in a row. The next look comes a [`TICK`] after one
    /// that found every listener running a call, else after twice the last wait, up to
    /// [`MAX_LOOK`] (and every [`IDLE_LOOK`] once no call has started for [`IDLE_LOOKS`] looks).
    fn look(
        &mut self,
        listeners: usize,
        workers: usize,
        running: usize,
        started: u64,
        queued: impl FnOnce() -> bool,
    ) -> Look {
        let all_busy = running >= listeners;
        let slow = slow_calls(started.wrapping_sub(self.last_started), listeners, self.waited);
        // The socket is looked at only while every listener runs a slow call and there is room for
        // another.
        let queued = all_busy && slow && listeners < workers && queued();
        self.queued = if queued { self.queued.saturating_add(1) } else { 0 };
        if all_busy && listeners < workers && (self.held_up == Some(started) || self.queued >= QUEUED_LOOKS) {
            self.queued = 0;
            self.held_up = None;
            return Look::Listen;
        }
        self.held_up = all_busy.then_some(started);
        if started == self.last_started && !all_busy {
            self.quiet = self.quiet.saturating_add(1);
        } else {
            self.quiet = 0;
        }
        self.last_started = started;
        self.waited = if self.quiet >= IDLE_LOOKS { IDLE_LOOK } else { next_look(self.waited, all_busy) };
        Look::Again(self.waited)
    }

    /// Whether the looks have stopped for want of calls (each an [`IDLE_LOOK`] apart).
    fn idle(&self) -> bool {
        self.waited == IDLE_LOOK
    }

    /// Calls may be coming again: the waits between looks start again from a tick.
    fn wake(&mut self) {
        self.quiet = 0;
        self.waited = TICK;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn looks_come_a_tick_after_a_busy_look_and_further_apart_after_others() {
        assert_eq!(next_look(MAX_LOOK, true), TICK);
        assert_eq!(next_look(TICK, false), 2 * TICK);
        assert_eq!(next_look(4 * TICK, false), MAX_LOOK);
        assert_eq!(next_look(MAX_LOOK, false), MAX_LOOK);
        assert_eq!(next_look(Duration::ZERO, false), TICK);
    }

    #[test]
    fn a_listener_stands_by_only_when_another_is_free_and_it_found_nothing_for_a_while() {
        let crew = Crew::new(4, 1);
        assert!(!crew.should_stand_by(0, || MAX_LOOK, || 0), "the only listener never stands by");
        crew.listeners[0].store(2, Ordering::Release);
        assert!(!crew.should_stand_by(0, || MAX_LOOK, || 1), "the other listener is running a call");
        // One that has just sent a result finds nothing until its caller's next call comes.
        assert!(!crew.should_stand_by(0, || MAX_LOOK - TICK, || 0), "found a datagram within the last look");
        assert_eq!(crew.listeners(), 2);
        assert!(crew.should_stand_by(0, || MAX_LOOK, || 0));
        assert_eq!(crew.listeners(), 1);
        assert!(!crew.should_stand_by(0, || MAX_LOOK, || 0));
    }

    #[test]
    fn the_deputy_adds_a_listener_only_when_every_listener_is_held_up_by_one_call() {
        let mut d = Deputy::new(0);
        // Calls keep starting while the one listener runs them: no second listener.
        for started in 1..50 {
            assert_eq!(d.look(1, 4, 1, started, || false), Look::Again(TICK));
        }
        // A listener free: none either, however long the call count stays still.
        assert!(matches!(d.look(2, 4, 1, 49, || true), Look::Again(_)));
        assert!(matches!(d.look(2, 4, 1, 49, || true), Look::Again(_)));
        // Both listeners running the same calls at two looks: a third listener.
        assert_eq!(d.look(2, 4, 2, 49, || false), Look::Again(TICK));
        assert_eq!(d.look(2, 4, 2, 49, || false), Look::Listen);
        // Never more listeners than workers.
        let mut d = Deputy::new(7);
        for _ in 0..10 {
            assert_eq!(d.look(4, 4, 4, 7, || true), Look::Again(TICK));
        }
    }

    #[test]
    fn the_deputy_adds_a_listener_when_calls_wait_while_every_listener_runs_one() {
        let mut d = Deputy::new(0);
        // Calls start between looks (each takes about a tick) while datagrams wait: another listener
        // at the third such look.
        assert_eq!(d.look(1, 4, 1, 1, || true), Look::Again(TICK));
        assert_eq!(d.look(1, 4, 1, 2, || true), Look::Again(TICK));
        assert_eq!(d.look(1, 4, 1, 3, || true), Look::Listen);
        // Quick calls (many started between looks) add none, however long datagrams wait.
        let mut d = Deputy::new(0);
        for look in 1..10 {
            assert_eq!(d.look(1, 4, 1, look * 1000, || true), Look::Again(TICK));
        }
        // Datagrams waiting at fewer looks in a row, or with a listener free, add none.
        let mut d = Deputy::new(0);
        assert_eq!(d.look(2, 4, 2, 1, || true), Look::Again(TICK));
        assert_eq!(d.look(2, 4, 2, 2, || true), Look::Again(TICK));
        assert_eq!(d.look(2, 4, 2, 3, || false), Look::Again(TICK));
        assert_eq!(d.look(2, 4, 2, 4, || true), Look::Again(TICK));
        assert_eq!(d.look(2, 4, 2, 5, || true), Look::Again(TICK));
        assert!(matches!(d.look(2, 4, 1, 6, || true), Look::Again(_)));
        assert_eq!(d.look(2, 4, 2, 7, || true), Look::Again(TICK));
        // The socket is not looked at while a listener is free.
        assert!(matches!(d.look(2, 4, 1, 8, || panic!("looked at the socket")), Look::Again(_)));
    }

    #[test]
    fn the_deputy_looks_a_tick_after_a_busy_look_and_backs_off_while_a_listener_is_free() {
        let mut d = Deputy::new(0);
        // Quick calls, the listener free at every look: each wait twice the last, up to the most.
        let waits: Vec<Look> = (1..=5).map(|n| d.look(1, 4, 0, n * 1000, || false)).collect();
        assert_eq!(waits, [2, 4, 8, 8, 8].map(|ms| Look::Again(Duration::from_millis(ms))));
        assert_eq!(MAX_LOOK, Duration::from_millis(8));
        // A look that finds the listener running a call: the next a tick later, and the same call
        // still running then makes the deputy a listener.
        assert_eq!(d.look(1, 4, 1, 6000, || false), Look::Again(TICK));
        assert_eq!(d.look(1, 4, 1, 6000, || false), Look::Listen);
        // Calls that start between busy looks keep the looks a tick apart; a free listener, and
        // the waits grow again.
        let mut d = Deputy::new(0);
        assert_eq!(d.look(1, 4, 1, 1000, || false), Look::Again(TICK));
        assert_eq!(d.look(1, 4, 1, 2000, || false), Look::Again(TICK));
        assert_eq!(d.look(1, 4, 0, 3000, || false), Look::Again(2 * TICK));
        assert_eq!(d.look(1, 4, 1, 4000, || false), Look::Again(TICK));
    }

    #[test]
    fn an_idle_deputy_looks_seldom_until_woken() {
        let mut d = Deputy::new(0);
        for _ in 1..IDLE_LOOKS {
            assert!(matches!(d.look(1, 4, 0, 0, || false), Look::Again(p) if p <= MAX_LOOK));
        }
        assert_eq!(d.look(1, 4, 0, 0, || false), Look::Again(IDLE_LOOK));
        assert_eq!(d.look(1, 4, 0, 0, || false), Look::Again(IDLE_LOOK));
        d.wake();
        assert_eq!(d.look(1, 4, 0, 0, || false), Look::Again(2 * TICK), "woken: back to short waits");
        // A new call also brings it back.
        let mut d = Deputy::new(0);
        for _ in 0..=IDLE_LOOKS {
            d.look(1, 4, 0, 0, || false);
        }
        assert_eq!(d.look(1, 4, 0, 1, || false), Look::Again(MAX_LOOK));
    }

    #[test]
    fn a_standing_by_worker_listens_when_a_call_holds_the_listener() {
        let crew = Arc::new(Crew::new(3, 1));
        let stop = AtomicBool::new(false);
        // The one listener runs a call that does not end.
        let listen = crew.stand_by(&stop, |_| 1, |_| 5, |_| false);
        assert_eq!(listen, Standby::Listen(0));
        assert_eq!(crew.listeners(), 2);
    }

    #[test]
    fn with_several_sockets_a_worker_takes_over_on_the_one_held_up() {
        let crew = Crew::new(4, 2);
        let stop = AtomicBool::new(false);
        assert_eq!(crew.listeners(), 2, "one listener on each socket");
        // Socket 1's listener runs a call that does not end; socket 0's is free.
        let listen = crew.stand_by(&stop, |lane| usize::from(lane == 1), |_| 5, |_| false);
        assert_eq!(listen, Standby::Listen(1));
        assert_eq!(crew.listeners[1].load(Ordering::Acquire), 2);
        assert_eq!(crew.listeners[0].load(Ordering::Acquire), 1);
        // Each socket's listeners stand by on their own: never the last of a socket.
        assert!(!crew.should_stand_by(0, || MAX_LOOK, || 0), "the only listener of socket 0");
        assert!(!crew.should_stand_by(1, || MAX_LOOK, || 1), "the other listener of socket 1 runs a call");
        assert!(crew.should_stand_by(1, || MAX_LOOK, || 0));
        assert_eq!(crew.listeners(), 2);
        assert!(!crew.should_stand_by(7, || MAX_LOOK, || 0), "no such socket");
    }

    #[test]
    fn with_several_sockets_no_more_listeners_than_workers_in_all() {
        let crew = Crew::new(3, 2);
        let stop = AtomicBool::new(false);
        // Both sockets held up, one worker to spare: it goes to one of them, then none is left.
        assert!(matches!(crew.stand_by(&stop, |_| 2, |_| 5, |_| true), Standby::Listen(_)));
        assert_eq!(crew.listeners(), 3);
        assert_eq!(stand_by_for_ten_ticks(&crew, |_| 2), Standby::Stop);
        assert_eq!(crew.listeners(), 3);
    }

    #[test]
    fn standing_by_workers_stop_with_the_server() {
        let crew = Arc::new(Crew::new(4, 1));
        let stop = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..3)
            .map(|_| {
                let (crew, stop) = (crew.clone(), stop.clone());
                std::thread::spawn(move || crew.stand_by(&stop, |_| 0, |_| 0, |_| false))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20));
        stop.store(true, Ordering::Release);
        crew.release();
        for w in workers {
            assert_eq!(w.join().unwrap(), Standby::Stop);
        }
        assert_eq!(crew.listeners(), 1);
    }

    #[test]
    fn no_more_listeners_than_workers() {
        let crew = Crew::new(1, 1);
        // Every listener held up, but there is no worker to add: the deputy keeps looking.
        assert_eq!(stand_by_for_ten_ticks(&crew, |_| 1), Standby::Stop);
        assert_eq!(crew.listeners(), 1);
    }

    /// A worker standing by in `crew` while `running(lane)` listeners of each socket run calls
    /// that never end and datagrams wait, until the server stops ten ticks later.
    fn stand_by_for_ten_ticks(crew: &Crew, running: impl Fn(usize) -> usize + Sync) -> Standby {
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let h = s.spawn(|| crew.stand_by(&stop, &running, |_| 5, |_| true));
            std::thread::sleep(TICK * 10);
            stop.store(true, Ordering::Release);
            crew.release();
            h.join().unwrap()
        })
    }
}
