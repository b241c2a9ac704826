//! Where the time of a call goes: timestamps at fixed points of the fast path, for `tiercel explain`.
//!
//! Built with the `explain` feature, every point of the path below calls [`mark`], which does nothing
//! but load one flag until [`enable`] turns recording on. Without the feature, [`mark`] and [`close`]
//! are empty and compile to nothing.
//!
//! A thread records the points it passes; [`close`] turns each pair of consecutive points into a step
//! (`from → to`) and adds its duration to a process-wide table, read with [`snapshot`]. The client's
//! caller closes after each call; a server thread closes after each call it answers. Durations are
//! taken between two timestamps of one thread, but for the two ways between a client and its server
//! in the same process ([`handoffs`]), which pair the client's marks with the server thread's.

// Without `explain` only the marks are used (they compile to nothing); the reading is the bench's.
#![cfg_attr(not(feature = "explain"), allow(dead_code))]

#[cfg(feature = "explain")]
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// A point on the path of a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
#[allow(missing_docs)] // each variant is described by `Point::describe`
pub enum Point {
    // The caller's own points, around the stub call.
    Begin,
    End,
    // Client side, both transports.
    CallStart,
    EndpointReady,
    Marshaled,
    HeaderReady,
    Sent,
    Arrived,
    Validated,
    Finished,
    Unmarshaled,
    // Client side, shared memory.
    ArgsCopied,
    ResultCopied,
    // Server side.
    ServerArrived,
    ServerValidated,
    ServerAccepted,
    ArgsDecoded,
    ProcedureDone,
    ResultsEncoded,
    ResultReady,
    ResultSent,
    // Either side, on a secure binding.
    Sealed,
    Opened,
}

/// Number of points.
pub const POINTS: usize = Point::Opened as usize + 1;

impl Point {
    /// Every point, in declaration order.
    pub const ALL: [Point; POINTS] = [
        Point::Begin,
        Point::End,
        Point::CallStart,
        Point::EndpointReady,
        Point::Marshaled,
        Point::HeaderReady,
        Point::Sent,
        Point::Arrived,
        Point::Validated,
        Point::Finished,
        Point::Unmarshaled,
        Point::ArgsCopied,
        Point::ResultCopied,
        Point::ServerArrived,
        Point::ServerValidated,
        Point::ServerAccepted,
        Point::ArgsDecoded,
        Point::ProcedureDone,
        Point::ResultsEncoded,
        Point::ResultReady,
        Point::ResultSent,
        Point::Sealed,
        Point::Opened,
    ];

    /// What has just happened when a thread passes this point.
    pub fn describe(self) -> &'static str {
        match self {
            Point::Begin => "caller: about to call the stub",
            Point::End => "caller: stub returned",
            Point::CallStart => "client stub entered the runtime",
            Point::EndpointReady => "thread's endpoint taken from its cache",
            Point::Marshaled => "arguments marshaled",
            Point::HeaderReady => "header template filled in",
            Point::Sent => "call sent (send returned / slot published)",
            Point::Arrived => "result arrived (recv returned / slot seen done)",
            Point::Validated => "result header checked, call state machine updated",
            Point::Finished => "outcome turned into the result location",
            Point::Unmarshaled => "results unmarshaled, endpoint back in its cache",
            Point::ArgsCopied => "arguments copied into the slot",
            Point::ResultCopied => "result copied out of the slot",
            Point::ServerArrived => "server: call arrived (recvmsg returned / slot seen)",
            Point::ServerValidated => "server: header checked, binding and slot found",
            Point::ServerAccepted => "server: duplicate check passed, arguments in place",
            Point::ArgsDecoded => "server stub: arguments unmarshaled",
            Point::ProcedureDone => "procedure returned",
            Point::ResultsEncoded => "server stub: results marshaled",
            Point::ResultReady => "server: result header / slot words written",
            Point::ResultSent => "server: result sent (send returned / slot published)",
            Point::Sealed => "packet sealed (secure binding: gathered, encrypted, tagged)",
            Point::Opened => "packet opened (secure binding: window and tag checked, decrypted)",
        }
    }
}

/// One step: the time from one point to the next on the same thread, summed over calls.
#[derive(Clone, Copy, Debug)]
pub struct Step {
    /// Where the step starts.
    pub from: Point,
    /// Where it ends.
    pub to: Point,
    /// How many times a thread went from `from` straight to `to`.
    pub count: u64,
    /// Their total duration, in nanoseconds.
    pub total_ns: f64,
}

impl Step {
    /// Mean duration in nanoseconds.
    pub fn mean_ns(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.total_ns / self.count as f64
        }
    }
}

#[cfg(feature = "explain")]
mod imp {
    use super::*;
    use std::cell::{Cell, RefCell};
    use std::sync::{Arc, Mutex};

    /// The switch, alone on its cache line: every mark on every thread reads it.
    #[repr(align(64))]
    pub(super) struct Switch(pub(super) AtomicBool);
    pub(super) static ON: Switch = Switch(AtomicBool::new(false));

    /// One thread's steps, summed. Only the owning thread writes (a load and a store, no
    /// read-modify-write on the path); [`snapshot`] reads every thread's.
    pub(super) struct Sums {
        pub(super) ticks: [AtomicU64; POINTS * POINTS],
        pub(super) counts: [AtomicU64; POINTS * POINTS],
    }

    /// Every thread that has recorded a step.
    pub(super) static THREADS: Mutex<Vec<Arc<Sums>>> = Mutex::new(Vec::new());

    /// Sleeps of the client and of the server sides.
    pub(super) static SLEEPS: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

    /// The ticks at which a server thread last passed [`Point::ServerArrived`] and
    /// [`Point::ResultReady`], alone on their cache line: both are stored before the result is
    /// published, so a client that has seen its result reads its own call's (see [`handoffs`]).
    #[repr(align(64))]
    pub(super) struct Handoff(pub(super) [AtomicU64; 2]);
    pub(super) static HANDOFF: Handoff = Handoff([AtomicU64::new(0), AtomicU64::new(0)]);

    /// Most points one thread records between closes; later ones are dropped.
    const MAX_MARKS: usize = 32;

    /// One thread's points since its last close, in cells: recording a point is a few stores into
    /// thread-local memory, inlined at the point, with no function call (a call on the path, even
    /// one never taken, costs the code around it registers and reloads).
    pub(super) struct Trace {
        marks: [Cell<(u8, u64)>; MAX_MARKS],
        n: Cell<usize>,
        sums: RefCell<Option<Arc<Sums>>>,
    }

    thread_local! {
        pub(super) static TRACE: Trace = const {
            Trace { marks: [const { Cell::new((0, 0)) }; MAX_MARKS], n: Cell::new(0), sums: RefCell::new(None) }
        };
    }

    #[inline(always)]
    pub(super) fn record(p: Point) {
        let t = tiercel_sys::clock::ticks();
        match p {
            Point::ServerArrived => HANDOFF.0[0].store(t, Ordering::Relaxed),
            Point::ResultReady => HANDOFF.0[1].store(t, Ordering::Relaxed),
            _ => {}
        }
        let _ = TRACE.try_with(|tr| {
            let n = tr.n.get();
            if let Some(slot) = tr.marks.get(n) {
                slot.set((p as u8, t));
                tr.n.set(n + 1);
            }
        });
    }

    /// Forgets this thread's unclosed points.
    pub(super) fn clear() {
        let _ = TRACE.try_with(|tr| tr.n.set(0));
    }

    #[cold]
    #[inline(never)]
    pub(super) fn flush() {
        let _ = TRACE.try_with(|tr| {
            let mut sums = tr.sums.borrow_mut();
            let sums = sums.get_or_insert_with(|| {
                let sums = Arc::new(Sums {
                    ticks: std::array::from_fn(|_| AtomicU64::new(0)),
                    counts: std::array::from_fn(|_| AtomicU64::new(0)),
                });
                THREADS.lock().unwrap_or_else(|e| e.into_inner()).push(sums.clone());
                sums
            });
            let n = tr.n.get().min(MAX_MARKS);
            // A client's call: the steps across to the server's thread and back, when this thread
            // published a call and saw its result after the server's marks (see [`handoffs`]).
            let at = |p: Point| tr.marks[..n].iter().map(Cell::get).find(|&(q, _)| q == p as u8).map(|(_, t)| t);
            if let (Some(sent), Some(arrived)) = (at(Point::Sent), at(Point::Arrived)) {
                let (seen, ready) = (HANDOFF.0[0].load(Ordering::Relaxed), HANDOFF.0[1].load(Ordering::Relaxed));
                if sent <= seen && seen <= ready && ready <= arrived {
                    let add =
                        |c: &AtomicU64, v: u64| c.store(c.load(Ordering::Relaxed).wrapping_add(v), Ordering::Relaxed);
                    for (i, v) in [
                        (Point::Sent, Point::ServerArrived, seen - sent),
                        (Point::ResultReady, Point::Arrived, arrived - ready),
                        (WAIT_ACROSS.0, WAIT_ACROSS.1, arrived - sent),
                    ]
                    .map(|(a, b, v)| (a as usize * POINTS + b as usize, v))
                    {
                        add(&sums.ticks[i], v);
                        add(&sums.counts[i], 1);
                    }
                }
            }
            for w in tr.marks[..n].windows(2) {
                let (a, ta) = w[0].get();
                let (b, tb) = w[1].get();
                let i = a as usize * POINTS + b as usize;
                let add = |c: &AtomicU64, v: u64| c.store(c.load(Ordering::Relaxed).wrapping_add(v), Ordering::Relaxed);
                add(&sums.ticks[i], tb.wrapping_sub(ta));
                add(&sums.counts[i], 1);
            }
            tr.n.set(0);
        });
    }
}

/// Records that this thread passed `p`, if recording is on.
#[inline(always)]
pub fn mark(p: Point) {
    #[cfg(feature = "explain")]
    if imp::ON.0.load(Ordering::Relaxed) {
        imp::record(p);
    }
    #[cfg(not(feature = "explain"))]
    let _ = p;
}

/// Ends this thread's trace: its consecutive points become steps in the process-wide table.
#[inline(always)]
pub fn close() {
    #[cfg(feature = "explain")]
    if imp::ON.0.load(Ordering::Relaxed) {
        imp::flush();
    }
}

/// Turns recording on or off for every thread of the process. Returns false (and does nothing) when
/// tiercel was built without the `explain` feature. Recording, a Null call took 88 ns more through
/// shared memory (the cost ledger's fifth run, on an AMD VM) and 0.12 µs more over UDP; on the
/// Intel VM of 2026-12-01, 0.3–0.5 µs more through shared memory; in the ledger's tenth run, on an
/// Intel VM, 0.28 µs through shared memory, 0.15 µs over UDP and 0.10 µs over TCP
/// (`docs/ledger.md`).
pub fn enable(on: bool) -> bool {
    #[cfg(feature = "explain")]
    {
        imp::ON.0.store(on, Ordering::SeqCst);
        true
    }
    #[cfg(not(feature = "explain"))]
    {
        let _ = on;
        false
    }
}

/// Forgets every step recorded so far (and this thread's unclosed points).
pub fn reset() {
    #[cfg(feature = "explain")]
    {
        for s in &imp::SLEEPS {
            s.store(0, Ordering::Relaxed);
        }
        for sums in imp::THREADS.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            for (t, c) in sums.ticks.iter().zip(&sums.counts) {
                t.store(0, Ordering::Relaxed);
                c.store(0, Ordering::Relaxed);
            }
        }
        imp::clear();
    }
}

/// Where the client's wait of the calls in [`Handoffs`] is summed: a pair of points no thread passes
/// in this order.
const WAIT_ACROSS: (Point, Point) = (Point::Arrived, Point::Sent);

/// The steps across threads of the calls whose server ran in this process and marked both of its
/// ends inside the client's wait (a client alone on the server, as `tiercel explain` calls), each
/// summed over those calls.
#[derive(Clone, Copy, Debug)]
pub struct Handoffs {
    /// From the client's [`Point::Sent`] to the server's [`Point::ServerArrived`]: the call seen,
    /// taken and checked.
    pub to_server: Step,
    /// From the server's [`Point::ResultReady`] to the client's [`Point::Arrived`]: the result
    /// published and seen.
    pub to_client: Step,
    /// The client's wait of the same calls, from its [`Point::Sent`] to its [`Point::Arrived`]: the
    /// two ways and the server's steps between them.
    pub wait: Step,
}

/// The steps across threads recorded since the last [`reset`], from `steps` (a [`snapshot`]); none
/// without the `explain` feature. The sum of the two ways does not depend on how the two CPUs' tick
/// counters are aligned; the split between them does (Linux keeps them in step where it uses the
/// counter as its clock).
pub fn handoffs(steps: &[Step]) -> Option<Handoffs> {
    let find = |from: Point, to: Point| steps.iter().find(|s| s.from == from && s.to == to).copied();
    Some(Handoffs {
        to_server: find(Point::Sent, Point::ServerArrived)?,
        to_client: find(Point::ResultReady, Point::Arrived)?,
        wait: find(WAIT_ACROSS.0, WAIT_ACROSS.1)?,
    })
}

/// Which side of a call went to sleep (blocked in `poll` or on a futex) while waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The calling thread, waiting for its result.
    Client,
    /// A server thread, waiting for a call.
    Server,
}

/// Counts a sleep of `side` while recording is on (so that the accounting can tell how many calls
/// paid a wake-up, and charge each its own baseline). Off, it loads one flag.
#[inline(always)]
pub fn slept(side: Side) {
    #[cfg(feature = "explain")]
    if imp::ON.0.load(Ordering::Relaxed) {
        imp::SLEEPS[side as usize].fetch_add(1, Ordering::Relaxed);
    }
    #[cfg(not(feature = "explain"))]
    let _ = side;
}

/// Sleeps counted since the last [`reset`]: (client, server).
pub fn sleeps() -> (u64, u64) {
    #[cfg(feature = "explain")]
    {
        (imp::SLEEPS[0].load(Ordering::Relaxed), imp::SLEEPS[1].load(Ordering::Relaxed))
    }
    #[cfg(not(feature = "explain"))]
    {
        (0, 0)
    }
}

/// Every step recorded since the last [`reset`], in no particular order.
pub fn snapshot() -> Vec<Step> {
    #[cfg(feature = "explain")]
    {
        let threads = imp::THREADS.lock().unwrap_or_else(|e| e.into_inner());
        let mut steps = Vec::new();
        for (a, from) in Point::ALL.iter().enumerate() {
            for (b, to) in Point::ALL.iter().enumerate() {
                let i = a * POINTS + b;
                let count: u64 = threads.iter().map(|t| t.counts[i].load(Ordering::Relaxed)).sum();
                if count > 0 {
                    let ticks = threads.iter().map(|t| t.ticks[i].load(Ordering::Relaxed)).sum::<u64>() as f64;
                    steps.push(Step { from: *from, to: *to, count, total_ns: tiercel_sys::clock::ticks_to_ns(ticks) });
                }
            }
        }
        steps
    }
    #[cfg(not(feature = "explain"))]
    Vec::new()
}

#[cfg(all(test, feature = "explain"))]
mod tests {
    use super::*;

    /// Recording is process-wide: one test at a time, each from nothing recorded.
    fn recording() -> std::sync::MutexGuard<'static, ()> {
        static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        enable(true);
        reset();
        one
    }

    #[test]
    fn consecutive_points_become_steps() {
        let _one = recording();
        for _ in 0..3 {
            mark(Point::Begin);
            mark(Point::CallStart);
            mark(Point::End);
            close();
        }
        enable(false);
        mark(Point::Begin); // not recorded: recording is off
        let steps = snapshot();
        let find = |f, t| steps.iter().find(|s| s.from == f && s.to == t).map(|s| s.count);
        assert_eq!(find(Point::Begin, Point::CallStart), Some(3));
        assert_eq!(find(Point::CallStart, Point::End), Some(3));
        assert_eq!(find(Point::End, Point::Begin), None);
        assert_eq!(Point::ALL.len(), POINTS);
        assert!(Point::ALL.iter().enumerate().all(|(i, p)| *p as usize == i));
    }

    /// A client thread's call and a server thread's handling of it, in turn, as through a slot.
    fn call_across(server_first: bool) {
        let serve = || {
            std::thread::spawn(|| {
                mark(Point::ServerArrived);
                mark(Point::ResultReady);
                mark(Point::ResultSent);
                close();
            })
            .join()
            .unwrap()
        };
        if server_first {
            serve();
        }
        mark(Point::Begin);
        mark(Point::Sent);
        if !server_first {
            serve();
        }
        mark(Point::Arrived);
        mark(Point::End);
        close();
    }

    #[test]
    fn the_ways_between_client_and_server_threads_are_measured_when_the_server_marked_inside_the_wait() {
        let _one = recording();
        for _ in 0..3 {
            call_across(false);
        }
        // Server marks from before the call went out are another call's: not counted.
        call_across(true);
        enable(false);
        let steps = snapshot();
        let h = handoffs(&steps).expect("both ways recorded");
        assert_eq!((h.to_server.count, h.to_client.count, h.wait.count), (3, 3, 3));
        assert!(h.to_server.total_ns > 0.0 && h.to_client.total_ns > 0.0, "{h:?}");
        // The client's wait of those calls spans both ways and the server's steps between them; its
        // wait of every call counts the fourth too.
        assert!(h.wait.total_ns >= h.to_server.total_ns + h.to_client.total_ns, "{h:?}");
        let wait = steps.iter().find(|s| s.from == Point::Sent && s.to == Point::Arrived).expect("the wait");
        assert_eq!(wait.count, 4);
        reset();
        assert!(handoffs(&snapshot()).is_none());
    }
}
