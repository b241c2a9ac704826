//! A binding's client slots: which are free, which a call given up may still hold on the server,
//! and the turns threads take on them when more threads call than the binding has slots.
//!
//! A thread takes a slot with its first call and keeps it, in its endpoint, for the calls after,
//! so that a call costs no lock here. Two things make a slot change hands:
//!
//! - **A call given up while the server may still run it** (its deadline passed, its future was
//!   dropped) leaves its slot to the server and takes another free one ([`Slots::trade`]): the
//!   thread's next call goes out at once, instead of behind the abandoned call (which over UDP and
//!   TCP drew `Busy` until it ended, and through shared memory was waited for). The slot left goes
//!   to the front of the free ones, to be taken last, marked as abandoned: through shared memory,
//!   whoever takes it waits for the server's answer before using it.
//! - **More threads than slots**: a thread that finds none free waits for its turn
//!   ([`Slots::wait_turn`]) instead of failing, up to its call's deadline (without one, up to
//!   `Timing::dead_after`, then `NoFreeSlot`); while any thread waits, a thread whose call ends
//!   hands its endpoint over ([`Slots::hand_over`]) rather than keep it, and a thread that ends
//!   gives its slot back. A thread that keeps its slot while it makes no calls keeps it from the
//!   others: threads beyond the slots are served by those that call.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::call::Engine;
use crate::CallError;

/// How often a thread waiting for its turn looks again without a signal: for its deadline, and for
/// an endpoint a thread kept because it read `wanted` before the waiter raised it.
const LOOK: Duration = Duration::from_millis(100);

/// A slot not held by an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Free {
    pub(super) slot: u32,
    /// The sequence number of the slot's last call (the next is one more).
    pub(super) seq: u32,
    /// A call given up in it may still be running on the server.
    pub(super) abandoned: bool,
}

pub(super) struct Slots {
    /// Slots the server granted.
    count: u32,
    pool: Mutex<Pool>,
    /// Threads waiting for their turn: read, without the lock, as every call ends.
    wanted: AtomicUsize,
    /// Signalled when an endpoint is handed over, or a slot given back, while threads wait.
    turn: Condvar,
}

#[derive(Default)]
struct Pool {
    /// Taken from the back; slots left by abandoned calls go to the front.
    free: VecDeque<Free>,
    /// Slots handed out so far: the numbers below it exist.
    made: u32,
    /// Endpoints handed over to the threads waiting for their turn.
    handed: Vec<Engine>,
}

impl Pool {
    /// A slot no abandoned call holds: one given back, else a new one while fewer than `count`
    /// were handed out.
    fn take_fresh(&mut self, count: u32) -> Option<Free> {
        match self.free.back() {
            Some(free) if !free.abandoned => self.free.pop_back(),
            _ if self.made < count => {
                self.made += 1;
                Some(Free { slot: self.made - 1, seq: 0, abandoned: false })
            }
            _ => None,
        }
    }

    /// A fresh slot, else the one abandoned longest ago.
    fn take(&mut self, count: u32) -> Option<Free> {
        self.take_fresh(count).or_else(|| self.free.pop_back())
    }
}

impl Slots {
    /// The slots of a binding granted `count`.
    pub(super) fn new(count: u32) -> Slots {
        Slots { count, pool: Mutex::new(Pool::default()), wanted: AtomicUsize::new(0), turn: Condvar::new() }
    }

    fn pool(&self) -> MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A free slot for a new endpoint: one given back, else a new one while fewer than `count`
    /// were handed out; `NoFreeSlot` when every slot is held.
    pub(super) fn take(&self) -> Result<Free, CallError> {
        self.pool().take(self.count).ok_or(CallError::NoFreeSlot(self.count))
    }

    /// Gives back a slot whose endpoint is gone (`abandoned`: a call given up in it may still run).
    pub(super) fn give(&self, free: Free) {
        let mut pool = self.pool();
        if free.abandoned {
            pool.free.push_front(free);
        } else {
            pool.free.push_back(free);
        }
        if self.wanted.load(Ordering::SeqCst) > 0 {
            self.turn.notify_one();
        }
    }

    /// Trades `slot`, whose call was given up while the server may still run it, for a free slot
    /// no such call holds: `None` (keep it) when there is none.
    pub(super) fn trade(&self, slot: u32, seq: u32) -> Option<Free> {
        let mut pool = self.pool();
        let fresh = pool.take_fresh(self.count)?;
        pool.free.push_front(Free { slot, seq, abandoned: true });
        Some(fresh)
    }

    /// Whether a thread waits for its turn: an endpoint whose call ends goes to it
    /// ([`Slots::hand_over`]) rather than back to its thread's cache.
    #[inline]
    pub(super) fn wanted(&self) -> bool {
        self.wanted.load(Ordering::Relaxed) > 0
    }

    /// Hands `engine` to a thread waiting for its turn; gives it back when none waits any more.
    pub(super) fn hand_over(&self, engine: Engine) -> Option<Engine> {
        let mut pool = self.pool();
        if self.wanted.load(Ordering::SeqCst) == 0 {
            return Some(engine);
        }
        pool.handed.push(engine);
        drop(pool);
        self.turn.notify_one();
        None
    }

    /// Waits for an endpoint handed over, or a slot given back (then `make` makes an endpoint on
    /// it): every slot is held by another thread's endpoint. At the call's `deadline` fails with
    /// `DeadlineExceeded`, and without one after `patience` (threads holding every slot and making
    /// no calls hand none over) with `NoFreeSlot`: the call never went out.
    pub(super) fn wait_turn(
        &self,
        deadline: Option<Instant>,
        patience: Duration,
        make: impl Fn() -> Result<Engine, CallError>,
    ) -> Result<Engine, CallError> {
        let (until, missed) = match deadline {
            Some(t) => (t, CallError::DeadlineExceeded { may_have_run: false }),
            None => (Instant::now() + patience, CallError::NoFreeSlot(self.count)),
        };
        self.wanted.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(&self.wanted);
        let mut pool = self.pool();
        loop {
            if let Some(engine) = pool.handed.pop() {
                return Ok(engine);
            }
            // Looked at under the lock that `give` takes before it signals: no signal is missed.
            if !pool.free.is_empty() || pool.made < self.count {
                drop(pool);
                match make() {
                    Err(CallError::NoFreeSlot(_)) => {}
                    made => return made,
                }
                pool = self.pool();
                continue;
            }
            let now = Instant::now();
            if until <= now {
                return Err(missed);
            }
            let wait = (until - now).min(LOOK);
            pool = match self.turn.wait_timeout(pool, wait) {
                Ok((pool, _)) => pool,
                Err(p) => p.into_inner().0,
            };
        }
    }
}

/// Counts a thread waiting for its turn while it lives.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_made_up_to_the_count_and_given_back_ones_come_first() {
        let s = Slots::new(2);
        assert_eq!(s.take().unwrap(), Free { slot: 0, seq: 0, abandoned: false });
        assert_eq!(s.take().unwrap().slot, 1);
        assert!(matches!(s.take(), Err(CallError::NoFreeSlot(2))));
        s.give(Free { slot: 1, seq: 7, abandoned: false });
        assert_eq!(s.take().unwrap(), Free { slot: 1, seq: 7, abandoned: false });
    }

    #[test]
    fn a_slot_left_by_an_abandoned_call_is_traded_for_a_free_one_and_taken_last() {
        let s = Slots::new(3);
        let a = s.take().unwrap();
        let b = s.trade(a.slot, 4).unwrap();
        assert_eq!(b, Free { slot: 1, seq: 0, abandoned: false });
        // A new slot before the abandoned one; the abandoned one when nothing else is left.
        let c = s.take().unwrap();
        assert_eq!(c.slot, 2);
        assert_eq!(s.take().unwrap(), Free { slot: 0, seq: 4, abandoned: true });
        assert!(s.take().is_err());
        // A slot given back is a fresh one to trade for.
        s.give(Free { slot: 2, seq: 1, abandoned: false });
        assert_eq!(s.trade(b.slot, 9).unwrap(), Free { slot: 2, seq: 1, abandoned: false });
        // Nothing free but abandoned slots: no trade, the endpoint keeps its own.
        assert_eq!(s.trade(2, 3), None);
        assert_eq!(s.take().unwrap(), Free { slot: 1, seq: 9, abandoned: true });
    }
}
