//! What a binding's memory costs: bytes charged to its budget, which lies within its transport's
//! share of the server's and the server's (`tiercel_proto::endpoint::Budget::within`).

use std::sync::Arc;

use tiercel_proto::endpoint::Budget;

/// Bytes charged to a binding's budget (and so to every budget it lies within), given back when
/// dropped.
pub(super) struct Charge {
    pub(super) binding: Arc<Budget>,
    pub(super) charged: usize,
}

impl Charge {
    pub(super) fn new(binding: Arc<Budget>) -> Charge {
        Charge { binding, charged: 0 }
    }

    /// Charges `bytes` more; false (nothing charged) if any budget has no room.
    pub(super) fn reserve(&mut self, bytes: usize) -> bool {
        if !self.binding.reserve(bytes) {
            return false;
        }
        self.charged += bytes;
        true
    }

    /// Bytes charged now.
    pub(super) fn charged(&self) -> usize {
        self.charged
    }

    /// Makes the charge `total`: more if there is room (false if not, the charge unchanged),
    /// or less.
    pub(super) fn settle(&mut self, total: usize) -> bool {
        match total.checked_sub(self.charged) {
            Some(more) => self.reserve(more),
            None => {
                self.binding.release(self.charged - total);
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
