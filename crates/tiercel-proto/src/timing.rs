//! The protocol's timers and limits, shared by both ends.

use core::time::Duration;
use std::time::Instant;

/// Timers and limits of the packet-exchange protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Retransmission timeout before any round trip has been measured; doubled on every retry.
    pub retransmit_initial: Duration,
    /// Floor of the retransmission timeout computed from measured round trips (srtt + 4 rttvar).
    pub retransmit_min: Duration,
    /// Ceiling of the retransmission timeout.
    pub retransmit_max: Duration,
    /// Interval between probes once the server has acknowledged a call that is still running.
    pub probe_interval: Duration,
    /// A call fails as unreachable when nothing has been heard from the server for this long.
    pub dead_after: Duration,
    /// Fragments in flight beyond the acknowledged prefix of a multi-packet message whose fragments
    /// are the largest (datagrams of 65,507 bytes, as over loopback). Smaller fragments get as many
    /// more as keep the bytes in flight the same, up to 256 on a binding whose two sides speak
    /// [`crate::bind::wire::features::WIDE_WINDOW`], else 64 (datagrams of a 1,500-byte MTU: 256
    /// and 64): [`Timing::window_for`].
    pub window: u16,
    /// Largest call or result message, in bytes ([`MAX_MESSAGE`] by default).
    pub max_message: usize,
}

/// The default largest message: 16 MiB of data, and 4 KiB more for the marshaling around it
/// (length prefixes, the other arguments), so that a 16 MiB buffer or `Vec<u8>` goes whole.
pub const MAX_MESSAGE: usize = (16 << 20) + 4096;

impl Default for Timing {
    fn default() -> Timing {
        Timing {
            retransmit_initial: Duration::from_millis(20),
            retransmit_min: Duration::from_millis(2),
            retransmit_max: Duration::from_millis(500),
            probe_interval: Duration::from_millis(500),
            dead_after: Duration::from_secs(5),
            window: 32,
            max_message: MAX_MESSAGE,
        }
    }
}

/// Payload of the largest fragment: a 65,507-byte datagram less the header.
const LARGEST_FRAGMENT: usize = crate::wire::MAX_UDP_PAYLOAD - crate::wire::HEADER_LEN;

impl Timing {
    /// The window of a message cut into fragments of `frag_payload` bytes: [`Timing::window`] scaled
    /// from the largest fragments to these, never below it, at most `limit` (what the binding's
    /// receiver accepts: [`crate::bind::wire::features::max_window`]) and
    /// [`crate::fragment::MAX_WINDOW`].
    pub fn window_for(&self, frag_payload: usize, limit: u16) -> u16 {
        let max = limit.clamp(1, crate::fragment::MAX_WINDOW);
        let window = self.window.clamp(1, max);
        let scaled = usize::from(window).saturating_mul(LARGEST_FRAGMENT) / frag_payload.max(1);
        scaled.clamp(usize::from(window), usize::from(max)) as u16
    }
}

/// A call's refusals as busy (`Status::Busy`), and what the client does about them: one rule for
/// every transport. A refusal means the server did not take the call, and that it may take it
/// later (its memory budgets free up as other calls end, a worker frees up); so the client sends
/// the call again after a wait that doubles at each refusal, and fails it (`Overloaded`) once
/// `dead_after` has passed since the first. A call the server could never take is refused
/// `TooLarge` instead, and fails at once.
#[derive(Debug, Default, Clone, Copy)]
pub struct Refusals {
    since: Option<Instant>,
    backoff: Duration,
}

impl Refusals {
    /// After a refusal at `now`: when to send the call again, or `None` to fail it, `dead_after`
    /// having passed since the first refusal. The wait is twice the last one, at least twice
    /// `first` (the transport's timeout of a round trip: UDP's retransmission timeout, which then
    /// follows the wait; [`Timing::retransmit_min`] where a connection or a region carries the call)
    /// and at most [`Timing::retransmit_max`]; it never runs past the first refusal and
    /// `dead_after`, when one last try is made (a server that refuses even then is overloaded).
    pub fn refused(&mut self, now: Instant, first: Duration, timing: &Timing) -> Option<Instant> {
        let since = *self.since.get_or_insert(now);
        if now.saturating_duration_since(since) >= timing.dead_after {
            return None;
        }
        self.backoff = self.backoff.max(first).saturating_mul(2).min(timing.retransmit_max);
        Some((now + self.backoff).min(since + timing.dead_after))
    }

    /// The last wait [`Refusals::refused`] gave (zero before a refusal).
    pub fn backoff(&self) -> Duration {
        self.backoff
    }
}

/// Whether sequence number `a` comes after `b`, with wrap-around (serial number arithmetic).
pub fn seq_after(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_back_off_doubling_and_give_up_after_dead_after() {
        let t = Timing { dead_after: Duration::from_millis(100), ..Timing::default() };
        let ms = Duration::from_millis;
        let start = Instant::now();
        let mut r = Refusals::default();
        assert_eq!(r.backoff(), Duration::ZERO);
        // From twice the transport's round-trip timeout, doubling.
        assert_eq!(r.refused(start, ms(2), &t), Some(start + ms(4)));
        assert_eq!(r.refused(start + ms(4), ms(2), &t), Some(start + ms(12)));
        assert_eq!(r.backoff(), ms(8));
        // A larger timeout meanwhile (UDP's, doubled by a retransmission) counts.
        assert_eq!(r.refused(start + ms(12), ms(20), &t), Some(start + ms(52)));
        // Never past the first refusal and `dead_after`: one last try then, and no more.
        assert_eq!(r.refused(start + ms(52), ms(2), &t), Some(start + ms(100)));
        assert_eq!(r.refused(start + ms(100), ms(2), &t), None);
        // At most `retransmit_max`.
        let long = Timing { dead_after: Duration::from_secs(60), ..Timing::default() };
        let mut r = Refusals::default();
        for _ in 0..20 {
            r.refused(start, ms(2), &long);
        }
        assert_eq!(r.backoff(), long.retransmit_max);
    }

    #[test]
    fn smaller_fragments_get_a_wider_window_up_to_what_the_receiver_accepts() {
        use crate::fragment::{MAX_WINDOW as WIDE, NARROW_WINDOW as NARROW};
        let t = Timing::default();
        // Loopback's largest fragments: the configured window.
        assert_eq!(t.window_for(LARGEST_FRAGMENT, WIDE), 32);
        assert_eq!(t.window_for(LARGEST_FRAGMENT, NARROW), 32);
        // A 1,500-byte MTU's fragments: the receiver's limit (1,479 scaled).
        assert_eq!(t.window_for(1_416, WIDE), 256);
        assert_eq!(t.window_for(1_416, NARROW), 64);
        // In between: scaled, so that about the same bytes are in flight.
        assert_eq!(t.window_for(LARGEST_FRAGMENT / 2 + 1, WIDE), 63);
        assert_eq!(t.window_for(40_000, NARROW), 52);
        assert_eq!(t.window_for(8_000, WIDE), 256, "261 scaled");
        assert_eq!(t.window_for(16_000, WIDE), 130);
        // Never below the configured window, never above the limit, whatever is configured.
        let narrow = Timing { window: 1, ..t };
        assert_eq!(narrow.window_for(LARGEST_FRAGMENT, WIDE), 1);
        assert_eq!(narrow.window_for(1_416, WIDE), 46);
        let wide = Timing { window: 500, ..t };
        assert_eq!(wide.window_for(LARGEST_FRAGMENT, WIDE), 256);
        assert_eq!(wide.window_for(LARGEST_FRAGMENT, NARROW), 64);
        assert_eq!(Timing { window: 0, ..t }.window_for(0, WIDE), 256);
        assert_eq!(t.window_for(1_416, 0), 1, "a limit of 0 is taken as 1");
        assert_eq!(t.window_for(1_416, u16::MAX), 256, "nothing past MAX_WINDOW");
    }
}
