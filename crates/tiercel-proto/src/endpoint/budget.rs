//! Memory budgets: bytes charged before they are allocated, against a limit no combination of
//! charges can exceed.

use std::sync::atomic::{AtomicUsize, Ordering};

/// A count of bytes charged against a limit, shared by the threads that charge it.
#[derive(Debug)]
pub struct Budget {
    used: AtomicUsize,
    limit: usize,
}

impl Budget {
    /// A budget of `limit` bytes, none used.
    pub const fn new(limit: usize) -> Budget {
        Budget { used: AtomicUsize::new(0), limit }
    }

    /// Charges `bytes`; false (and nothing charged) if that would exceed the limit.
    pub fn reserve(&self, bytes: usize) -> bool {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let Some(after) = used.checked_add(bytes).filter(|&a| a <= self.limit) else { return false };
            match self.used.compare_exchange_weak(used, after, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(u) => used = u,
            }
        }
    }

    /// Gives back `bytes` charged earlier.
    pub fn release(&self, bytes: usize) {
        if bytes > 0 {
            let before = self.used.fetch_sub(bytes, Ordering::AcqRel);
            debug_assert!(before >= bytes, "released {bytes} bytes of {before} charged");
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
}
