//! A server's duplicate request cache, keyed as Linux's NFS server keys its own (`nfsd`'s
//! `nfscache.c`): the xid, the program, version and procedure, the caller's address and port, the
//! transport, the arguments' length and a checksum of their first 256 bytes. A retransmitted call
//! finds its entry: while the call runs the copy is dropped, once it has run its reply is sent
//! again (or, for a reply too large to keep, the copy is dropped: it never runs twice).
//!
//! The cache is bounded in entries and in bytes of kept replies; the oldest entries go first, and
//! an entry older than the cache's lifetime is forgotten. Reply buffers are recycled from the
//! entries that go, so a server in a steady state allocates nothing per call.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use super::Call;

/// How many bytes of the arguments the key's checksum covers (`nfsd`'s `RC_CSUMLEN`).
const CHECKSUMMED: usize = 256;

/// What identifies a call among its retransmissions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheKey {
    xid: u32,
    program: u32,
    version: u32,
    procedure: u32,
    address: SocketAddr,
    tcp: bool,
    length: u32,
    checksum: u32,
}

impl CacheKey {
    /// The key of `call` from `address`, over TCP or not.
    pub fn of(call: &Call<'_>, address: SocketAddr, tcp: bool) -> CacheKey {
        let head = &call.args[..call.args.len().min(CHECKSUMMED)];
        CacheKey {
            xid: call.xid,
            program: call.program,
            version: call.version,
            procedure: call.procedure,
            address,
            tcp,
            length: call.args.len() as u32,
            checksum: crate::wire::checksum([head]),
        }
    }
}

/// What the cache knew of a call.
#[derive(Debug, PartialEq, Eq)]
pub enum Seen<'c> {
    /// Never seen (or forgotten): it is now in the cache as running; run it, then
    /// [`Cache::complete`] it.
    New,
    /// A copy of a call still running: drop it.
    Running,
    /// A copy of a call that ran: send this reply again.
    Replay(&'c [u8]),
    /// A copy of a call that ran, whose reply was too large to keep: drop it.
    Ran,
}

#[derive(Debug)]
enum State {
    Running,
    Done(Vec<u8>),
    Ran,
}

#[derive(Debug)]
struct Entry {
    state: State,
    born: Duration,
}

/// The duplicate request cache of one server (see the module's documentation).
#[derive(Debug)]
pub struct Cache {
    entries: HashMap<CacheKey, Entry>,
    /// Keys in the order they came; a key whose entry is gone is skipped.
    order: VecDeque<CacheKey>,
    spare: Vec<Vec<u8>>,
    max_entries: usize,
    max_reply: usize,
    max_bytes: usize,
    bytes: usize,
    lifetime: Duration,
    /// Calls answered from the cache or dropped as copies.
    pub duplicates: u64,
}

impl Cache {
    /// A cache of at most `max_entries` calls, keeping replies of at most `max_reply` bytes and
    /// `max_bytes` of them in all, each for at most `lifetime`.
    pub fn new(max_entries: usize, max_reply: usize, max_bytes: usize, lifetime: Duration) -> Cache {
        let max_entries = max_entries.max(1);
        Cache {
            // Twice the room needed: entries come and go, and a table at most half full cleans out
            // the places of those gone where it is, instead of growing into a new allocation.
            entries: HashMap::with_capacity(max_entries.saturating_mul(2)),
            order: VecDeque::with_capacity(max_entries),
            spare: Vec::new(),
            max_entries,
            max_reply,
            max_bytes,
            bytes: 0,
            lifetime,
            duplicates: 0,
        }
    }

    /// Looks `key` up at `now` (any clock that only grows), entering it as running if it is new.
    pub fn check(&mut self, key: CacheKey, now: Duration) -> Seen<'_> {
        self.expire(now);
        if self.entries.contains_key(&key) {
            self.duplicates += 1;
            return match &self.entries[&key].state {
                State::Running => Seen::Running,
                State::Done(reply) => Seen::Replay(reply),
                State::Ran => Seen::Ran,
            };
        }
        while self.entries.len() >= self.max_entries {
            self.evict_oldest();
        }
        self.entries.insert(key, Entry { state: State::Running, born: now });
        self.order.push_back(key);
        Seen::New
    }

    /// Records the reply of the call `key` (which [`Cache::check`] entered): kept when it fits the
    /// budgets, else only remembered as run.
    pub fn complete(&mut self, key: CacheKey, reply: &[u8]) {
        if !self.entries.contains_key(&key) {
            return; // Evicted while it ran: its copies may run it again, as after a restart.
        }
        let fits = reply.len() <= self.max_reply;
        while fits && self.bytes + reply.len() > self.max_bytes && self.evict_oldest() {}
        let Some(entry) = self.entries.get_mut(&key) else { return };
        if !fits || self.bytes + reply.len() > self.max_bytes {
            entry.state = State::Ran;
            return;
        }
        let mut kept = self.spare.pop().unwrap_or_default();
        kept.clear();
        crate::copy::extend(&mut kept, reply);
        self.bytes += kept.len();
        entry.state = State::Done(kept);
    }

    /// Calls in the cache.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn expire(&mut self, now: Duration) {
        while let Some(oldest) = self.order.front() {
            match self.entries.get(oldest) {
                Some(e) if now.saturating_sub(e.born) < self.lifetime => break,
                _ => {
                    self.evict_oldest();
                }
            }
        }
    }

    /// Forgets the oldest entry; `false` when there was none.
    fn evict_oldest(&mut self) -> bool {
        while let Some(key) = self.order.pop_front() {
            if let Some(entry) = self.entries.remove(&key) {
                if let State::Done(reply) = entry.state {
                    self.bytes -= reply.len();
                    if self.spare.len() < self.max_entries.min(64) {
                        self.spare.push(reply);
                    }
                }
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onc::{write_call, Credential};

    fn key(xid: u32, args: &[u8], port: u16) -> CacheKey {
        let mut msg = Vec::new();
        write_call(&mut msg, xid, 1, 1, 2, &Credential::None);
        crate::copy::extend(&mut msg, args);
        let call = crate::onc::parse_call(&msg).unwrap();
        CacheKey::of(&call, SocketAddr::from(([127, 0, 0, 1], port)), false)
    }

    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn a_copy_is_dropped_while_its_call_runs_and_answered_from_the_cache_after() {
        let mut cache = Cache::new(8, 100, 1000, 120 * SEC);
        let k = key(1, b"args", 900);
        assert_eq!(cache.check(k, SEC), Seen::New);
        assert_eq!(cache.check(k, SEC), Seen::Running);
        cache.complete(k, b"reply");
        assert_eq!(cache.check(k, 2 * SEC), Seen::Replay(b"reply"));
        assert_eq!(cache.duplicates, 2);
    }

    #[test]
    fn another_address_port_xid_or_argument_is_another_call() {
        let mut cache = Cache::new(8, 100, 1000, 120 * SEC);
        assert_eq!(cache.check(key(1, b"args", 900), SEC), Seen::New);
        assert_eq!(cache.check(key(1, b"args", 901), SEC), Seen::New);
        assert_eq!(cache.check(key(2, b"args", 900), SEC), Seen::New);
        assert_eq!(cache.check(key(1, b"argz", 900), SEC), Seen::New);
        assert_eq!(cache.len(), 4);
    }

    #[test]
    fn a_reply_too_large_to_keep_still_keeps_its_call_from_running_twice() {
        let mut cache = Cache::new(8, 4, 1000, 120 * SEC);
        let k = key(1, b"", 900);
        cache.check(k, SEC);
        cache.complete(k, b"a long reply");
        assert_eq!(cache.check(k, SEC), Seen::Ran);
    }

    #[test]
    fn entries_and_bytes_stay_within_their_budgets_and_old_entries_go() {
        let mut cache = Cache::new(4, 10, 20, 120 * SEC);
        for xid in 0..10 {
            let k = key(xid, b"", 900);
            assert_eq!(cache.check(k, SEC), Seen::New);
            cache.complete(k, &[xid as u8; 10]);
            assert!(cache.len() <= 4 && cache.bytes <= 20, "{} entries, {} bytes", cache.len(), cache.bytes);
        }
        assert_eq!(cache.check(key(9, b"", 900), SEC), Seen::Replay(&[9; 10]));
        assert_eq!(cache.check(key(0, b"", 900), SEC), Seen::New, "the oldest went first");
        assert_eq!(cache.check(key(9, b"", 900), 200 * SEC), Seen::New, "forgotten after its lifetime");
    }
}
