//! The server's secure bindings: each one's keys, by binding id, and the budget of handshakes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use std::sync::atomic::Ordering;

use tiercel_proto::bind::{Admission, BindDecision, BindServer};
use tiercel_proto::wire::{Kind, Packet};

use super::{Door, Shared};
use crate::secure::{Responder, Session};

/// A secure binding's keys and the answer that made it (sent again to a retransmitted `Hello`).
struct Entry {
    token: u128,
    session: Arc<Session>,
    welcome: Arc<[u8]>,
}

/// The keys of the server's secure bindings, by binding id: at most one entry per binding the
/// endpoint holds (a binding forgotten, its entry goes at the next sweep; an id granted again
/// replaces it).
#[derive(Default)]
pub(crate) struct Sessions {
    table: RwLock<HashMap<u32, Entry>>,
}

impl Sessions {
    /// The keys of binding `id`.
    pub(crate) fn get(&self, id: u32) -> Option<Arc<Session>> {
        let table = self.table.read().unwrap_or_else(|p| p.into_inner());
        table.get(&id).map(|e| e.session.clone())
    }

    /// The answer that made binding `id` with `token`, for a retransmitted `Hello`.
    pub(crate) fn welcome(&self, id: u32, token: u128) -> Option<Arc<[u8]>> {
        let table = self.table.read().unwrap_or_else(|p| p.into_inner());
        table.get(&id).filter(|e| e.token == token).map(|e| e.welcome.clone())
    }

    pub(crate) fn insert(&self, id: u32, token: u128, session: Arc<Session>, welcome: Arc<[u8]>) {
        let mut table = self.table.write().unwrap_or_else(|p| p.into_inner());
        table.insert(id, Entry { token, session, welcome });
    }

    /// Keeps the entries of the bindings `live` says are still held.
    pub(crate) fn retain(&self, mut live: impl FnMut(u32, u128) -> bool) {
        let mut table = self.table.write().unwrap_or_else(|p| p.into_inner());
        table.retain(|&id, e| live(id, e.token));
    }
}

/// The budget of handshakes: a token bucket of `rate` a second, in bursts of up to a tenth of a
/// second's, for all senders together; and, before it, two buckets of an eighth of that for each
/// sender's address (two distinct of [`SOURCES`] buckets, chosen by a hash keyed by this server),
/// from which a handshake takes one token together. So one address that floods the server with
/// handshakes takes at most a quarter of the budget, and the clients at other addresses share the
/// rest: a client is starved by a flooding address only if both its buckets are the flood's (about
/// one address in 33,000 for one flooder, where a single bucket would starve one in 256). Bounded
/// memory, whatever the number of senders; a sender that forges other addresses is limited only by
/// the whole budget.
pub(crate) struct HandshakeBudget {
    rate: f64,
    state: Mutex<(f64, Instant)>,
    sources: Mutex<Box<[(f64, Instant)]>>,
    key: [u8; 32],
}

/// Buckets of senders' addresses.
const SOURCES: usize = 256;

impl HandshakeBudget {
    pub(crate) fn new(per_second: u32) -> HandshakeBudget {
        Self::with_key(per_second, crate::random::bytes32().unwrap_or([0; 32]))
    }

    /// [`new`](Self::new) with the hash's `key` given.
    fn with_key(per_second: u32, key: [u8; 32]) -> HandshakeBudget {
        let rate = f64::from(per_second.max(1));
        let now = Instant::now();
        let share = Self::share(rate);
        HandshakeBudget {
            rate,
            state: Mutex::new((Self::burst(rate), now)),
            sources: Mutex::new(vec![(Self::burst(share), now); SOURCES].into_boxed_slice()),
            key,
        }
    }

    fn burst(rate: f64) -> f64 {
        (rate / 10.0).max(1.0)
    }

    /// The rate of each of an address's two buckets: together, a quarter of the whole.
    fn share(rate: f64) -> f64 {
        (rate / 8.0).max(1.0)
    }

    /// Refills `bucket` at `rate` up to `now`; the tokens it then holds.
    fn refill(bucket: &mut (f64, Instant), rate: f64, now: Instant) -> f64 {
        let (tokens, at) = *bucket;
        let tokens = (tokens + now.saturating_duration_since(at).as_secs_f64() * rate).min(Self::burst(rate));
        *bucket = (tokens, now);
        tokens
    }

    /// Takes a token from `bucket`, refilled at `rate`, if it has one.
    fn take_from(bucket: &mut (f64, Instant), rate: f64, now: Instant) -> bool {
        let taken = Self::refill(bucket, rate, now) >= 1.0;
        if taken {
            bucket.0 -= 1.0;
        }
        taken
    }

    /// The two distinct buckets of `source`'s address.
    fn buckets(&self, source: std::net::IpAddr) -> (usize, usize) {
        let octets = match source {
            std::net::IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
            std::net::IpAddr::V6(a) => a.octets(),
        };
        let hash = blake3::keyed_hash(&self.key, &octets);
        let h = hash.as_bytes();
        let first = usize::from(h[0]) % SOURCES;
        (first, (first + 1 + usize::from(h[1]) % (SOURCES - 1)) % SOURCES)
    }

    /// Whether one more handshake from `source` may be answered now.
    pub(crate) fn take(&self, source: std::net::IpAddr) -> bool {
        self.take_at(source, Instant::now())
    }

    /// [`take`](Self::take) at `now`.
    fn take_at(&self, source: std::net::IpAddr, now: Instant) -> bool {
        let (first, second) = self.buckets(source);
        {
            let mut sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
            let share = Self::share(self.rate);
            let a = Self::refill(&mut sources[first], share, now);
            let b = Self::refill(&mut sources[second], share, now);
            if a + b < 1.0 {
                return false;
            }
            // One token from the two together, as much of it as it holds from the fuller: an
            // address whose buckets are both drained waits for the sum of their refills, as long
            // as for one bucket of twice the rate, not for either bucket alone to refill a token.
            let (fuller, other) = if a >= b { (first, second) } else { (second, first) };
            let part = sources[fuller].0.min(1.0);
            sources[fuller].0 -= part;
            sources[other].0 = (sources[other].0 - (1.0 - part)).max(0.0);
        }
        let mut all = self.state.lock().unwrap_or_else(|p| p.into_inner());
        Self::take_from(&mut all, self.rate, now)
    }
}

/// What a handshake's first message came to, over either transport.
pub(super) enum Hello<'s> {
    /// Dropped unanswered (beyond the handshake budget, or not a bind request), and counted.
    Dropped,
    /// It does not open with the server's key and secret (or the server has none): the sender is
    /// told so, in an answer that proves nothing (counted as dropped).
    Unreadable,
    /// Answered without a binding (a refusal, `Busy`): the handshake's answer to send.
    Answered(Vec<u8>),
    /// The bind machine admits the request: the transport makes the binding and sends
    /// `Responder::welcome` of its grant (or of [`Admission::busy`]).
    Admitted(Box<Responder>, Admission, BindServer<'s>),
}

impl Shared {
    /// Reads a handshake's first message, `bytes`, from `from`, with
    /// the server's key and secret, and decides its bind request through the bind machine of
    /// `door`: an answer is no longer than the request it carried (the handshake adds less to it
    /// than to the request), so the server never sends more than it was sent. Handshakes beyond
    /// `handshakes_per_second`, or beyond a quarter of it from `from`'s address, are dropped before
    /// anything is computed.
    pub(super) fn hello(
        &self,
        bytes: &[u8],
        from: std::net::SocketAddr,
        door: Door,
        opened: &mut Vec<u8>,
    ) -> Hello<'_> {
        let stats = &self.stats;
        let Some(key) = &self.config.key else { return Hello::Unreadable };
        let dropped = || {
            stats.handshakes_dropped.fetch_add(1, Ordering::Relaxed);
            Hello::Dropped
        };
        if !self.handshakes.take(from.ip()) {
            return dropped();
        }
        let peer = &crate::auth::peer_bytes(from)[..];
        opened.resize(bytes.len(), 0);
        let psk = crate::auth::psk(self.config.secret.as_ref());
        let Some((responder, n)) = Responder::hello(key, &psk, bytes, opened) else {
            stats.handshakes_dropped.fetch_add(1, Ordering::Relaxed);
            return Hello::Unreadable;
        };
        let Ok(p) = Packet::new_checked(&opened[..n]) else { return dropped() };
        if p.kind() != Kind::Bind {
            return dropped();
        }
        let machine = self.bind_machine(door);
        let welcome = |responder: Responder, answer: &[u8]| match responder.welcome(answer) {
            Some((sealed, _)) => Hello::Answered(sealed),
            None => dropped(),
        };
        let budget = bytes.len().saturating_sub(crate::secure::HANDSHAKE_ROOM);
        match machine.on_request(&p, peer, budget) {
            BindDecision::Malformed => dropped(),
            BindDecision::Answer { packet, refused } => {
                self.count_refusal(refused);
                welcome(responder, &packet)
            }
            BindDecision::Admit(a) if self.refusing_bindings() => {
                stats.rejected.fetch_add(1, Ordering::Relaxed);
                welcome(responder, &a.busy(&machine))
            }
            BindDecision::Admit(a) => Hello::Admitted(Box::new(responder), a, machine),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::HandshakeBudget;
    use std::net::IpAddr;
    use std::time::Instant;

    #[test]
    fn a_sealed_bind_request_flagged_for_a_checksum_trailer_is_dropped_unanswered() {
        use crate::secure::{Cipher, Hello};
        use tiercel_proto::bind::BindClient;
        use tiercel_proto::wire::Packet;
        let key = crate::Identity::generate().unwrap();
        let config = crate::ServerConfig { key: Some(key.clone()), shared_memory: false, ..Default::default() };
        let server = crate::Server::bind("127.0.0.1:0").unwrap().with_config(config).start().unwrap();
        let me = crate::Identity::generate().unwrap();
        let psk = crate::auth::psk(None);
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        // A request for the server's key, sealed in a handshake; the answer opened, if one comes
        // within `wait`.
        let ask = |checksum: bool, wait: u64| {
            socket.set_read_timeout(Some(std::time::Duration::from_millis(wait))).unwrap();
            let mut request = BindClient::asking_key(7, checksum).packet();
            if checksum {
                // With the trailer UDP's sender adds to a plain packet so flagged.
                let sum = tiercel_proto::wire::checksum([&request[..]]);
                request.extend_from_slice(&sum.to_le_bytes());
            }
            let mut hello = Hello::new(&me, &key.public(), &psk, Cipher::default(), &request).unwrap();
            socket.send_to(&hello.datagram, server.addr()).unwrap();
            let mut buf = [0u8; 2048];
            let n = socket.recv(&mut buf).ok()?;
            let mut out = [0u8; 2048];
            let (n, _) = hello.welcome(&buf[..n], &mut out).expect("the answer opens");
            Some(out[..n].to_vec())
        };
        let dropped = server.stats().handshakes_dropped;
        assert_eq!(ask(true, 500), None, "a flagged request is answered");
        assert_eq!(server.stats().handshakes_dropped, dropped + 1);
        // The same request unflagged is answered, with a packet its sender reads.
        let answer = ask(false, 10_000).expect("an unflagged request is answered");
        assert!(Packet::new_checked(&answer[..]).is_ok(), "the answer is a valid packet: {answer:?}");
    }

    #[test]
    fn one_address_takes_at_most_a_quarter_of_the_budget_and_the_others_share_the_rest() {
        // 4,000 a second: bursts of 400 for everyone, of 100 for one address.
        // One instant for every handshake, so that no bucket refills during the test however slow
        // the machine (the buckets start full, so the time since `new` adds nothing).
        let budget = HandshakeBudget::new(4000);
        let now = Instant::now();
        let take = |a: IpAddr| budget.take_at(a, now);
        let flood: IpAddr = "192.0.2.66".parse().unwrap();
        let taken = (0..1000).filter(|_| take(flood)).count();
        assert_eq!(taken, 100, "{taken} taken from one address in a burst");
        // Other addresses still find the rest (some may share the flood's bucket: a few of 300).
        let others: Vec<IpAddr> = (1..=250).map(|i| format!("198.51.100.{i}").parse().unwrap()).collect();
        let granted = others.iter().filter(|a| take(**a)).count();
        assert!(granted >= 240, "{granted} of 250 other addresses had a handshake answered");
        // And no more than the whole budget, whatever the addresses.
        let more = (0..1000u32).filter(|i| take(IpAddr::from((0x0a00_0000 + i).to_be_bytes()))).count();
        assert_eq!(granted + taken + more, 400, "{} in one burst", granted + taken + more);
    }

    #[test]
    fn a_drained_address_waits_for_its_two_buckets_refilled_together_not_for_either_alone() {
        let budget = HandshakeBudget::with_key(4000, [7; 32]);
        let start = Instant::now();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        assert_eq!((0..1000).filter(|_| budget.take_at(a, start)).count(), 100);
        // A quarter of 4,000 a second: a handshake a millisecond, though each bucket refills a
        // token in two (a TCP client tries three times within a few milliseconds).
        for ms in 1..=20u64 {
            let now = start + std::time::Duration::from_micros(ms * 1000 + 100);
            assert_eq!((0..10).filter(|_| budget.take_at(a, now)).count(), 1, "at {ms} ms");
        }
    }

    #[test]
    fn an_address_that_shares_a_bucket_with_a_flooding_one_is_still_answered() {
        // A fixed key, so that the addresses sharing a bucket with the flood's are known.
        let budget = HandshakeBudget::with_key(4000, [7; 32]);
        let start = Instant::now();
        let flood: IpAddr = "127.0.0.2".parse().unwrap();
        let (f1, f2) = budget.buckets(flood);
        assert_ne!(f1, f2, "an address's two buckets are distinct");
        let neighbors: Vec<IpAddr> = (1..=u32::MAX)
            .map(|i| IpAddr::from((0x7f00_0000 + i).to_be_bytes()))
            .filter(|a| {
                let (a1, a2) = budget.buckets(*a);
                [a1, a2].iter().filter(|b| **b == f1 || **b == f2).count() == 1
            })
            .take(8)
            .collect();
        // The flood takes every handshake it may, again and again as its buckets refill: one
        // hundred in its first burst, then a quarter of the whole rate.
        for ms in 0..100u64 {
            let now = start + std::time::Duration::from_millis(ms);
            let taken = (0..1000).filter(|_| budget.take_at(flood, now)).count();
            assert!(taken <= if ms == 0 { 100 } else { 2 }, "{taken} taken by the flood at {ms} ms");
            // Each address that shares one of the flood's buckets is still answered from its other.
            if ms % 10 == 5 {
                for a in &neighbors {
                    assert!(budget.take_at(*a, now), "{a}, sharing a bucket with the flood, refused at {ms} ms");
                }
            }
        }
    }
}
