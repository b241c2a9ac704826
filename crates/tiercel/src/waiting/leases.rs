//! Leave to spin: how many of a server's threads may spin for their next call at once.
//!
//! A spinning thread answers in a fraction of a microsecond where a blocked one takes tens to wake,
//! but a thread that spins holds a CPU. UDP workers, shared-memory binding threads and TCP
//! connection readers all spin after a call, and on a small machine a few of them spinning at once
//! take every core from the callers and from each other. So a thread spins only while it holds a
//! lease from the server's pool (`ServerConfig::spinners`, by default one less than the CPUs, at
//! least one); without one it blocks at once. A lease is taken when a thread starts spinning and
//! given back when it blocks, not on every call.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The server's leases.
#[derive(Debug)]
pub(crate) struct SpinLeases {
    most: usize,
    held: AtomicUsize,
}

impl SpinLeases {
    /// A pool of `most` leases.
    pub(crate) fn new(most: usize) -> Arc<SpinLeases> {
        Arc::new(SpinLeases { most, held: AtomicUsize::new(0) })
    }

    /// Leases held now.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }
}

/// One thread's (or one connection reader's) lease, if it holds one; given back when dropped.
#[derive(Debug)]
pub(crate) struct SpinLease {
    pool: Arc<SpinLeases>,
    held: bool,
}

impl SpinLease {
    /// No lease yet, from `pool`.
    pub(crate) fn new(pool: &Arc<SpinLeases>) -> SpinLease {
        SpinLease { pool: pool.clone(), held: false }
    }

    /// Whether this may spin: true if it holds a lease, or could take one now.
    #[inline]
    pub(crate) fn take(&mut self) -> bool {
        if self.held {
            return true;
        }
        let pool = &self.pool;
        let mut n = pool.held.load(Ordering::Acquire);
        while n < pool.most {
            match pool.held.compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    self.held = true;
                    return true;
                }
                Err(m) => n = m,
            }
        }
        false
    }

    /// Gives the lease back (this is about to block).
    #[inline]
    pub(crate) fn give_back(&mut self) {
        if std::mem::take(&mut self.held) {
            self.pool.held.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for SpinLease {
    fn drop(&mut self) {
        self.give_back();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_more_spin_than_leases_and_each_given_back_once() {
        let pool = SpinLeases::new(2);
        let (mut a, mut b, mut c) = (SpinLease::new(&pool), SpinLease::new(&pool), SpinLease::new(&pool));
        assert!(a.take());
        assert!(a.take(), "a holder keeps its lease");
        assert!(b.take());
        assert!(!c.take(), "two leases, three spinners");
        assert_eq!(pool.held(), 2);
        a.give_back();
        a.give_back();
        assert_eq!(pool.held(), 1, "given back once");
        assert!(c.take());
        drop(b);
        drop(c);
        assert_eq!(pool.held(), 0, "dropped leases go back");
    }
}
