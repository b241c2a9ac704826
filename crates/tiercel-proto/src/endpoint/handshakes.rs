//! Connections in the bind exchange, on the transports where a peer holds something of the
//! server's before it has proven anything (a TCP connection, a shared-memory rendezvous
//! connection): one table, one rule, for every such transport. (UDP holds nothing for an unproven
//! peer: its challenges are stateless.)
//!
//! Each connection costs a descriptor and a small buffer until it binds, is refused, or runs out
//! of time. A peer that opens many and dribbles its requests (slowloris) must not keep others
//! out, even one that shares its address (every local peer is 127.0.0.1, or the same uid). So:
//!
//! - **No source holds more than `per_source`.** A source at its limit that opens another gives up
//!   its own oldest: it competes with itself.
//! - **When the table is full, the newcomer stays** and the oldest connection of the source that
//!   holds the most goes. A client's whole exchange is a few round trips (well under a
//!   millisecond on one host) while a dribbler needs seconds: under pressure the table keeps the
//!   quick and sheds the slow, so that a legitimate bind competes with the attacker's *rate* of
//!   new connections, not with the number it holds.
//! - **Each has `time` from its arrival**, then goes ([`Handshakes::expire`]).
//!
//! Time comes in as an argument; the transport keeps its connection in `T` and does the I/O.

use std::hash::Hash;
use std::time::{Duration, Instant};

/// What the table allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandshakeLimits {
    /// Connections in the bind exchange at once.
    pub total: usize,
    /// Of those, from one source (an IP address; a uid).
    pub per_source: usize,
    /// How long a connection has, from its arrival, to bind.
    pub time: Duration,
}

/// A connection in the bind exchange.
#[derive(Debug)]
pub struct Pending<S, T> {
    /// Who it came from.
    pub source: S,
    /// When it arrived.
    pub arrived: Instant,
    /// The transport's connection and what it has read so far.
    pub io: T,
}

/// The connections in the bind exchange of one transport's listener.
#[derive(Debug)]
pub struct Handshakes<S, T> {
    limits: HandshakeLimits,
    pending: Vec<Pending<S, T>>,
}

impl<S: Eq + Hash + Copy, T> Handshakes<S, T> {
    /// An empty table with `limits` (each at least 1).
    pub fn new(limits: HandshakeLimits) -> Handshakes<S, T> {
        let limits = HandshakeLimits { total: limits.total.max(1), per_source: limits.per_source.max(1), ..limits };
        Handshakes { limits, pending: Vec::new() }
    }

    /// Takes a connection that arrived from `source` at `now`. Returns the connection that made
    /// room for it, if one had to: the transport closes it (and counts it).
    pub fn admit(&mut self, source: S, now: Instant, io: T) -> Option<Pending<S, T>> {
        let from_source = self.pending.iter().filter(|p| p.source == source).count();
        let evicted = if from_source >= self.limits.per_source {
            self.oldest_of(source).map(|i| self.pending.remove(i))
        } else if self.pending.len() >= self.limits.total {
            let heaviest = self.heaviest_source();
            heaviest.and_then(|s| self.oldest_of(s)).map(|i| self.pending.remove(i))
        } else {
            None
        };
        self.pending.push(Pending { source, arrived: now, io });
        evicted
    }

    /// Removes and returns every connection whose time ran out at `now`.
    pub fn expire(&mut self, now: Instant) -> Vec<Pending<S, T>> {
        let time = self.limits.time;
        let mut gone = Vec::new();
        let mut i = 0;
        while i < self.pending.len() {
            if now.saturating_duration_since(self.pending[i].arrived) >= time {
                gone.push(self.pending.swap_remove(i));
            } else {
                i += 1;
            }
        }
        gone
    }

    /// Keeps the connections for which `f` (the transport's progress: read, answer) returns true.
    pub fn retain(&mut self, mut f: impl FnMut(&mut Pending<S, T>) -> bool) {
        self.pending.retain_mut(|p| f(p));
    }

    /// When the first connection runs out of time; `None` with none pending.
    pub fn next_expiry(&self) -> Option<Instant> {
        self.pending.iter().map(|p| p.arrived + self.limits.time).min()
    }

    /// The connections pending.
    pub fn iter(&self) -> impl Iterator<Item = &Pending<S, T>> + Clone {
        self.pending.iter()
    }

    /// How many are pending.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// The limits.
    pub fn limits(&self) -> HandshakeLimits {
        self.limits
    }

    fn oldest_of(&self, source: S) -> Option<usize> {
        let of_source = self.pending.iter().enumerate().filter(|(_, p)| p.source == source);
        of_source.min_by_key(|(_, p)| p.arrived).map(|(i, _)| i)
    }

    /// The source holding the most connections (of those that tie, the one whose oldest is oldest).
    fn heaviest_source(&self) -> Option<S> {
        let mut counts: std::collections::HashMap<S, (usize, Instant)> = std::collections::HashMap::new();
        for p in &self.pending {
            let e = counts.entry(p.source).or_insert((0, p.arrived));
            e.0 += 1;
            e.1 = e.1.min(p.arrived);
        }
        counts.into_iter().max_by(|a, b| a.1 .0.cmp(&b.1 .0).then(b.1 .1.cmp(&a.1 .1))).map(|(s, _)| s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: HandshakeLimits = HandshakeLimits { total: 8, per_source: 4, time: Duration::from_secs(2) };

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn a_source_at_its_limit_gives_up_its_own_oldest() {
        let t0 = Instant::now();
        let mut h = Handshakes::new(LIMITS);
        assert!(h.admit('b', t0, 100).is_none());
        for i in 0..4 {
            assert!(h.admit('a', at(t0, i + 1), i).is_none());
        }
        let gone = h.admit('a', at(t0, 10), 4).expect("a's fifth must push one of a's out");
        assert_eq!((gone.source, gone.io), ('a', 0));
        assert_eq!(h.len(), 5);
        assert!(h.iter().any(|p| p.source == 'b'), "another source's connection stays");
    }

    #[test]
    fn a_full_table_keeps_the_newcomer_and_sheds_the_heaviest_source() {
        let t0 = Instant::now();
        let mut h = Handshakes::new(LIMITS);
        // 'x' arrives first of all; 'a' and 'b' fill the rest, 'a' holding more.
        assert!(h.admit('x', t0, 0).is_none());
        for i in 0..4 {
            assert!(h.admit('a', at(t0, 10 + i), 10 + i).is_none());
        }
        for i in 0..3 {
            assert!(h.admit('b', at(t0, 20 + i), 20 + i).is_none());
        }
        assert_eq!(h.len(), 8);
        let gone = h.admit('c', at(t0, 30), 30).expect("full: one must go");
        assert_eq!((gone.source, gone.io), ('a', 10), "the heaviest source's oldest goes, not the oldest of all");
        assert_eq!(h.len(), 8);
        assert!(h.iter().any(|p| p.source == 'c'));
        assert!(h.iter().any(|p| p.source == 'x'));
    }

    #[test]
    fn a_quick_client_among_many_slow_ones_of_its_own_address_gets_through() {
        // One address: a dribbler reopens each connection the moment it is closed, one new
        // connection every 50 µs; the client needs 300 µs between its arrival and its bind.
        let t0 = Instant::now();
        let limits = HandshakeLimits { total: 256, per_source: 64, time: Duration::from_secs(2) };
        let mut h = Handshakes::new(limits);
        let mut t = t0;
        for i in 0..10_000u32 {
            t += Duration::from_micros(50);
            h.admit(1u8, t, i);
        }
        h.admit(1u8, t, u32::MAX);
        for _ in 0..6 {
            t += Duration::from_micros(50);
            h.admit(1u8, t, 0);
        }
        assert!(h.iter().any(|p| p.io == u32::MAX), "the client's connection is still there to bind");
        assert!(h.len() <= 64);
    }

    #[test]
    fn connections_expire_after_their_time_and_say_when() {
        let t0 = Instant::now();
        let mut h = Handshakes::new(LIMITS);
        h.admit('a', t0, 1);
        h.admit('b', at(t0, 500), 2);
        assert_eq!(h.next_expiry(), Some(at(t0, 2000)));
        assert!(h.expire(at(t0, 1999)).is_empty());
        let gone = h.expire(at(t0, 2000));
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].io, 1);
        assert_eq!(h.next_expiry(), Some(at(t0, 2500)));
        h.retain(|p| p.io != 2);
        assert!(h.is_empty());
        assert_eq!(h.next_expiry(), None);
    }
}
