//! A binding's team: the threads that serve its slots, their lanes, and each slot's books.

#[cfg(feature = "async")]
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tiercel_proto::endpoint::Budget;
use tiercel_proto::shm::{self as proto, header, slot, Layout};
#[cfg(feature = "async")]
use tiercel_proto::wire::Status;
use tiercel_sys::clock;
use tiercel_sys::shm::{futex_wake, Region};

use super::super::Shared;
use super::*;
use crate::retention::Retention;

/// What a thread serving a binding is doing, as the rendezvous thread sees it.
pub(super) mod lane {
    /// No thread.
    pub(crate) const FREE: u32 = 0;
    /// Looking at the slots for a call, or spinning.
    pub(crate) const AWAKE: u32 = 1;
    /// Serving a call (running its procedure).
    pub(crate) const RUNNING: u32 = 2;
    /// Asleep: the first thread on the doorbell; a helper on the doorbell within a while of its last
    /// call if that was slow, else parked until the rendezvous thread wakes it.
    pub(crate) const ASLEEP: u32 = 3;
}

/// One thread's marker, alone on its cache line: written with plain stores by its thread, read by
/// the rendezvous thread now and then.
#[repr(align(64))]
pub(super) struct Lane {
    /// What the thread is doing (`lane::*`).
    pub(super) state: AtomicU32,
    /// Calls it has served (only its thread writes it).
    pub(super) served: AtomicU64,
}

impl Lane {
    pub(super) fn new() -> Lane {
        Lane { state: AtomicU32::new(lane::FREE), served: AtomicU64::new(0) }
    }
}

/// The bookkeeping of one slot. Its lock is the claim on the slot's call: the thread that serves
/// the call holds it from before it reads the call until the result is published, and then keeps it
/// for the slot's next call until it serves another slot or sleeps (`Worker::kept`).
pub(super) struct Books {
    /// Bytes of the slot's data the server has mapped (read arguments from, written results to) and
    /// not given back or forgotten since: whole pages.
    pub(super) held: usize,
    /// `held`, charged to the budgets.
    pub(super) charge: Charge,
    /// When the slot last moved a large call and gave pages back.
    pub(super) retention: Retention,
    /// The slot's call runs on the async runtime (so its published call is not new).
    #[cfg(feature = "async")]
    pub(super) pending: bool,
    /// That call has been aborted for its client.
    #[cfg(feature = "async")]
    pub(super) aborted: bool,
}

/// A granted binding: what the threads serving it share. The first thread serves it from the
/// grant until its client goes; others (helpers) are started by the rendezvous thread while
/// every awake thread has been running a slow call and another call waits, and end after
/// [`HELPER_IDLE`] without a call.
pub(in crate::server) struct Team {
    pub(super) shared: Arc<Shared>,
    pub(super) region: Arc<Region>,
    pub(super) layout: Layout,
    pub(super) binding: Arc<dyn crate::interface::Export>,
    /// Its place in the server's endpoint: its memory budget (shared by the slots' and the
    /// threads' charges), its admission.
    pub(super) place: Arc<crate::server::EndpointBinding>,
    /// The binding's memory budget.
    pub(super) budget: Arc<Budget>,
    pub(super) books: Vec<std::sync::Mutex<Books>>,
    /// One per thread the binding may have; the first is the first thread's.
    pub(super) lanes: Vec<Lane>,
    /// Futex where parked helpers wait for the rendezvous thread (not the doorbell, once they have
    /// had no slow call for a while: a helper asleep there makes every call of the binding's client
    /// ring it).
    pub(super) parked: AtomicU32,
    /// When a call of the binding last ended, in ticks of the tick counter.
    pub(super) last_result: AtomicU64,
    /// The binding is over (its client went, or the server stops): helpers end.
    pub(super) closed: AtomicBool,
    /// The rendezvous thread saw the client's connection hang up (or bytes come on it): the first
    /// thread looks whether the client is gone at once rather than after its sleep's period, so
    /// that a binding ended frees its memory for the next (see `HangUps`, in the module above).
    pub(super) hung_up: AtomicBool,
    /// The header and the slots' control pages, charged.
    pub(super) _control: Charge,
    /// Calls of async procedures running on the runtime.
    #[cfg(feature = "async")]
    pub(super) running: AtomicUsize,
    /// Where their results go, for the first thread to write into their slots.
    #[cfg(feature = "async")]
    pub(super) done: std::sync::mpsc::Sender<(u32, Status, Vec<u8>)>,
    /// The binding's key among the runtime's calls (shared-memory ids are kept apart from UDP's).
    #[cfg(feature = "async")]
    pub(super) id: u32,
}

/// What the rendezvous thread remembers of a binding between its looks.
#[derive(Default)]
pub(super) struct Watch {
    /// At the last look, every awake thread was running a slow call and another call waited.
    pub(super) held_up: bool,
    /// Calls served by the binding's threads at the last look.
    pub(super) served: u64,
}

impl Team {
    pub(super) fn word(&self, at: usize) -> &AtomicU32 {
        word(&self.region, at)
    }

    #[inline]
    pub(super) fn state(&self, i: usize) -> &AtomicU32 {
        self.word(self.layout.slot(i as u32) + slot::STATE)
    }

    /// Slots below the clients' high-water mark (a malicious client's value is capped).
    #[inline]
    pub(super) fn used(&self) -> usize {
        (self.word(header::SLOTS_USED).load(Ordering::Acquire) as usize).min(self.books.len())
    }

    #[cfg(feature = "async")]
    pub(super) fn books(&self, i: usize) -> std::sync::MutexGuard<'_, Books> {
        self.books[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Claims slot `i`, if no other thread holds it.
    pub(super) fn claim(&self, i: usize) -> Option<std::sync::MutexGuard<'_, Books>> {
        match self.books[i].try_lock() {
            Ok(b) => Some(b),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Whether a slot holds a call no thread has taken (not one running on the async runtime).
    pub(super) fn any_call(&self) -> bool {
        (0..self.used())
            .any(|i| proto::server_has_call(self.state(i)) && self.claim(i).is_some_and(|b| !Self::runs_async(&b)))
    }

    #[inline]
    pub(super) fn runs_async(b: &Books) -> bool {
        #[cfg(feature = "async")]
        return b.pending;
        #[cfg(not(feature = "async"))]
        return {
            let _ = b;
            false
        };
    }

    /// Wakes a thread of the binding asleep on the doorbell.
    pub(super) fn ring(&self) {
        let bell = self.word(header::DOORBELL);
        bell.fetch_add(1, Ordering::SeqCst);
        futex_wake(bell, 1);
    }

    /// The client's connection hung up: marks the team so, and wakes every thread asleep on the
    /// doorbell (a helper may sleep there too), so that the first thread looks at once whether
    /// the client is gone.
    pub(super) fn hang_up(&self) {
        self.hung_up.store(true, Ordering::SeqCst);
        let bell = self.word(header::DOORBELL);
        bell.fetch_add(1, Ordering::SeqCst);
        futex_wake(bell, i32::MAX as u32);
    }

    /// Most threads serving the binding: a slow call then holds up only its own caller while fewer
    /// than this many run at once.
    pub(super) fn max_threads(shared: &Shared, slots: u32) -> usize {
        (slots as usize).min(shared.config.workers).max(1)
    }

    /// Whether the binding has been in use lately (the rendezvous thread then looks whether it
    /// needs another thread a [`LOOK`] to 8 ms apart, rather than once a [`HEARTBEAT`]).
    pub(super) fn in_use(&self) -> bool {
        !self.closed.load(Ordering::Acquire)
            && (clock::elapsed(self.last_result.load(Ordering::Relaxed), clock::ticks()) < IN_USE
                || self.lanes.iter().any(|l| l.state.load(Ordering::Relaxed) == lane::RUNNING))
    }

    /// One look of the rendezvous thread, `since` after the last: whether the binding is held up
    /// (at this look and the last, every awake thread was running a call while another call waited,
    /// and the calls were slow: fewer served between the looks than one per 50 µs per running
    /// thread, `crate::waiting::crew::slow_calls`), and whether every awake thread was running a call.
    pub(super) fn held_up(&self, watch: &mut Watch, since: Duration) -> (bool, bool) {
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
        let now = running > 0 && crate::waiting::crew::slow_calls(calls, running, since) && {
            let waiting = (0..self.used()).filter(|&i| proto::server_has_call(self.state(i))).count();
            waiting > running + on_runtime
        };
        let held = now && watch.held_up;
        // After a thread is added, two more looks before another.
        watch.held_up = now && !held;
        (held, running > 0)
    }

    /// Stops mapping the data pages of slots whose client has taken the result (but those another
    /// thread holds), so that they no longer count as this binding's memory. The client keeps the
    /// bytes; the server maps them again if it reads them.
    #[cold]
    #[inline(never)]
    pub(super) fn forget_taken(&self) {
        for j in 0..self.books.len() {
            let taken = || proto::server_may_forget(self.state(j), self.word(self.layout.slot(j as u32) + slot::TAKEN));
            if !taken() {
                continue;
            }
            let Some(mut b) = self.claim(j) else { continue };
            if b.held > 0 && taken() {
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
pub(super) fn new_team(
    shared: &Arc<Shared>,
    place: Arc<crate::server::EndpointBinding>,
    region: Arc<Region>,
    layout: Layout,
    control: Charge,
) -> (Arc<Team>, AsyncResults) {
    let (binding, id) = (place.export.clone(), place.id);
    let budget = control.binding.clone();
    let books = (0..layout.slots)
        .map(|_| {
            std::sync::Mutex::new(Books {
                held: 0,
                charge: Charge::new(budget.clone()),
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
        place,
        budget,
        books,
        lanes: (0..Team::max_threads(shared, layout.slots)).map(|_| Lane::new()).collect(),
        parked: AtomicU32::new(0),
        last_result: AtomicU64::new(clock::ticks()),
        closed: AtomicBool::new(false),
        hung_up: AtomicBool::new(false),
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
pub(super) type AsyncResults = std::sync::mpsc::Receiver<(u32, Status, Vec<u8>)>;
#[cfg(not(feature = "async"))]
pub(super) type AsyncResults = ();
