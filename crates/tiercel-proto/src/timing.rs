//! The protocol's timers and limits, shared by both ends.

use core::time::Duration;

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
    /// Fragments in flight beyond the acknowledged prefix of a multi-packet message (at most 64).
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

/// Whether sequence number `a` comes after `b`, with wrap-around (serial number arithmetic).
pub fn seq_after(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}
