//! The endpoint's table of connections in the bind exchange (TCP, shared memory's rendezvous) fed
//! arbitrary arrivals, expiries and progress. Nothing panics; the table never holds more than its
//! limits, in all or of one source; a newcomer is always kept; and no connection is lost: each one
//! admitted is in the table, or was handed back (made room, expired, or finished) exactly once.
#![no_main]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tiercel_proto::endpoint::{HandshakeLimits, Handshakes};

#[derive(Arbitrary, Debug)]
enum Op {
    /// A connection from this source arrives this many milliseconds later.
    Arrive { source: u8, after_ms: u16 },
    /// Time passes and the table expires what ran out of time.
    Expire { after_ms: u16 },
    /// Progress: the connections whose id has this bit set finish (bind, or are refused).
    Progress { bit: u8 },
}

#[derive(Arbitrary, Debug)]
struct Input {
    total: u8,
    per_source: u8,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let limits = HandshakeLimits {
        total: usize::from(input.total % 32),
        per_source: usize::from(input.per_source % 16),
        time: Duration::from_secs(2),
    };
    let mut table: Handshakes<u8, u32> = Handshakes::new(limits);
    let limits = table.limits();
    let mut now = Instant::now();
    let mut next = 0u32;
    let mut inside = BTreeSet::new();
    for op in input.ops.iter().take(512) {
        match *op {
            Op::Arrive { source, after_ms } => {
                now += Duration::from_millis(u64::from(after_ms));
                let id = next;
                next += 1;
                assert!(inside.insert(id));
                if let Some(out) = table.admit(source % 8, now, id) {
                    assert_ne!(out.io, id, "the newcomer is kept");
                    assert!(inside.remove(&out.io), "{} handed back twice", out.io);
                }
                assert!(table.iter().any(|p| p.io == id));
            }
            Op::Expire { after_ms } => {
                now += Duration::from_millis(u64::from(after_ms));
                for gone in table.expire(now) {
                    assert!(now.saturating_duration_since(gone.arrived) >= limits.time);
                    assert!(inside.remove(&gone.io));
                }
                assert!(table.iter().all(|p| now.saturating_duration_since(p.arrived) < limits.time));
            }
            Op::Progress { bit } => {
                let bit = 1u32 << (bit % 8);
                table.retain(|p| {
                    let done = p.io & bit != 0;
                    if done {
                        assert!(inside.remove(&p.io));
                    }
                    !done
                });
            }
        }
        assert!(table.len() <= limits.total);
        for s in 0..8u8 {
            assert!(table.iter().filter(|p| p.source == s).count() <= limits.per_source);
        }
        let held: BTreeSet<u32> = table.iter().map(|p| p.io).collect();
        assert_eq!(held, inside, "every connection is in the table or was handed back");
        assert_eq!(table.next_expiry(), table.iter().map(|p| p.arrived + limits.time).min());
    }
});
