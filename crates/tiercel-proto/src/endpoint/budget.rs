//! Memory budgets: bytes charged before they are allocated, against a limit no combination of
//! charges can exceed. A budget may lie within another (a binding's within its transport's, a
//! transport's within the server's): a charge is taken from each, or from none.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A count of bytes charged against a limit, shared by the threads that charge it.
#[derive(Debug)]
pub struct Budget {
    used: AtomicUsize,
    limit: usize,
    /// The budget this one lies within: every byte charged here is charged there too.
    within: Option<Arc<Budget>>,
}

impl Budget {
    /// A budget of `limit` bytes, none used.
    pub const fn new(limit: usize) -> Budget {
        Budget { used: AtomicUsize::new(0), limit, within: None }
    }

    /// A budget of `limit` bytes within `outer`: a charge here is also a charge there, and fails
    /// when either has no room.
    pub fn within(limit: usize, outer: Arc<Budget>) -> Budget {
        Budget { used: AtomicUsize::new(0), limit, within: Some(outer) }
    }

    /// Charges `bytes` (here and in every budget this one lies within); false (and nothing
    /// charged anywhere) if that would exceed any of their limits.
    pub fn reserve(&self, bytes: usize) -> bool {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let Some(after) = used.checked_add(bytes).filter(|&a| a <= self.limit) else { return false };
            match self.used.compare_exchange_weak(used, after, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => break,
                Err(u) => used = u,
            }
        }
        if let Some(outer) = &self.within {
            if !outer.reserve(bytes) {
                self.used.fetch_sub(bytes, Ordering::AcqRel);
                return false;
            }
        }
        true
    }

    /// Gives back `bytes` charged earlier (here and in every budget this one lies within).
    pub fn release(&self, bytes: usize) {
        if bytes > 0 {
            let before = self.used.fetch_sub(bytes, Ordering::AcqRel);
            debug_assert!(before >= bytes, "released {bytes} bytes of {before} charged");
            if let Some(outer) = &self.within {
                outer.release(bytes);
            }
        }
    }

    /// Bytes charged now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// The limit.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The most a charge here could ever take: the least limit of this budget and those it lies
    /// within. A charge larger fails however much the others give back.
    pub fn most(&self) -> usize {
        self.within.as_ref().map_or(self.limit, |outer| self.limit.min(outer.most()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_charge_is_taken_from_every_enclosing_budget_or_from_none() {
        let server = Arc::new(Budget::new(100));
        let tcp = Arc::new(Budget::within(60, server.clone()));
        let udp = Arc::new(Budget::within(60, server.clone()));
        let binding = Budget::within(50, tcp.clone());
        assert!(binding.reserve(50));
        assert!(!binding.reserve(1), "the binding's own limit");
        assert!(tcp.reserve(10));
        assert!(!tcp.reserve(1), "the transport's share");
        assert_eq!(server.used(), 60);
        assert!(udp.reserve(40));
        assert!(!udp.reserve(1), "the server's limit, though the transport's share has room");
        assert_eq!((udp.used(), server.used()), (40, 100));
        binding.release(50);
        assert_eq!((binding.used(), tcp.used(), server.used()), (0, 10, 50));
        assert!(udp.reserve(20));
        assert_eq!(server.used(), 70);
    }

    #[test]
    fn the_most_a_charge_could_take_is_the_least_limit_around_it() {
        let server = Arc::new(Budget::new(100));
        let tcp = Arc::new(Budget::within(60, server.clone()));
        assert_eq!(Budget::within(50, tcp.clone()).most(), 50);
        assert_eq!(Budget::within(80, tcp.clone()).most(), 60, "the transport's share");
        let small = Arc::new(Budget::new(30));
        assert_eq!(Budget::within(50, Arc::new(Budget::within(60, small))).most(), 30, "the server's limit");
        let binding = Budget::within(80, tcp.clone());
        assert!(!binding.reserve(61), "more than the most fails with nothing else charged");
        assert!(binding.reserve(60));
    }
}
