//! How long memory grown by large messages is kept, on both sides of both transports: one policy.
//!
//! A stream of large calls should not allocate, fault in and zero its buffers and slot pages anew on
//! every call; an endpoint that has stopped making them should not keep megabytes. So buffers grown
//! by large messages stay while such messages keep coming and go after [`KEEP_IDLE`] without one,
//! and the pages of a shared-memory slot that held more than [`LARGE`] bytes are given back at most
//! once per [`DISCARD_EVERY`].

use std::time::{Duration, Instant};

/// A message above this many bytes is large: its buffers and pages are given back when done.
pub(crate) const LARGE: usize = 1 << 20;
/// Buffers grown by large messages are dropped after this long without one.
pub(crate) const KEEP_IDLE: Duration = Duration::from_secs(1);
/// A shared-memory slot's pages are given back at most this often.
pub(crate) const DISCARD_EVERY: Duration = Duration::from_secs(1);
/// A UDP server worker's spare buffers go after this long without a packet (its wait's period).
pub(crate) const SPARES_IDLE: Duration = Duration::from_millis(100);

/// When large messages last passed and when pages were last given back, for one endpoint or slot.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Retention {
    last_large: Option<Instant>,
    last_discard: Option<Instant>,
}

impl Retention {
    /// Notes a large message at `now`; true when the pages it used may be given back now.
    pub(crate) fn large(&mut self, now: Instant) -> bool {
        self.last_large = Some(now);
        let discard = self.last_discard.is_none_or(|t| now.saturating_duration_since(t) >= DISCARD_EVERY);
        if discard {
            self.last_discard = Some(now);
        }
        discard
    }

    /// Whether a large message passed and its buffers are still kept: only then is there anything
    /// for [`Retention::idle`] to give back (so a caller need not read the clock otherwise).
    pub(crate) fn holds_large(&self) -> bool {
        self.last_large.is_some()
    }

    /// True once, when [`KEEP_IDLE`] has passed since the last large message: drop what it grew.
    pub(crate) fn idle(&mut self, now: Instant) -> bool {
        let idle = self.last_large.is_some_and(|t| now.saturating_duration_since(t) >= KEEP_IDLE);
        if idle {
            self.last_large = None;
        }
        idle
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_go_back_at_most_once_a_period_and_buffers_after_an_idle_period() {
        let t0 = Instant::now();
        let mut r = Retention::default();
        assert!(!r.idle(t0), "nothing large yet");
        assert!(r.large(t0));
        assert!(!r.large(t0 + DISCARD_EVERY / 2), "not twice within a period");
        assert!(r.large(t0 + DISCARD_EVERY));
        assert!(!r.idle(t0 + DISCARD_EVERY + KEEP_IDLE / 2));
        assert!(r.idle(t0 + DISCARD_EVERY + KEEP_IDLE));
        assert!(!r.idle(t0 + DISCARD_EVERY + 2 * KEEP_IDLE), "once");
    }
}
