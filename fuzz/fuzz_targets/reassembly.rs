//! Fragment reassembly with whatever a sender claims: lengths and counts that disagree, fragments
//! out of range, duplicates; some received straight into the place the reassembly gives for the
//! fragment it expects next, whatever fragment they turn out to be. It must refuse what breaks its
//! limit before allocating, never panic, and put each accepted fragment where it belongs.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tiercel_proto::fragment::{fragment_range, Inserted, Reassembly, MAX_WINDOW};

const LIMIT: usize = 1 << 20;

#[derive(Arbitrary, Debug)]
struct Input {
    message_len: u32,
    count: u16,
    frag_payload: u16,
    fragments: Vec<Fragment>,
}

#[derive(Arbitrary, Debug)]
struct Fragment {
    index: u16,
    count: u16,
    message_len: u32,
    /// Length of the payload; filled with a byte derived from the index.
    len: u16,
    /// Received into the landing place (as a client's endpoint does), then handled in place if it
    /// was the fragment expected there, else inserted as usual.
    landed: bool,
}

fuzz_target!(|input: Input| {
    let frag_payload = input.frag_payload as usize;
    let Ok(mut r) = Reassembly::new(input.message_len, input.count, frag_payload, LIMIT) else { return };
    assert!(r.message_len() <= LIMIT);
    let mut inserted = vec![false; input.count as usize];
    for f in input.fragments.iter().take(4096) {
        let payload = vec![f.index as u8 ^ 0x5a; f.len as usize];
        let mut in_place = false;
        if f.landed {
            if let Some((index, place)) = r.landing_run(1, |_| true) {
                let n = place.len().min(payload.len());
                place[..n].copy_from_slice(&payload[..n]);
                in_place = index == f.index && place.len() == payload.len();
            }
        }
        let outcome = if in_place {
            r.insert_landed(f.index, f.count, f.message_len, payload.len())
        } else {
            r.insert(f.index, f.count, f.message_len, &payload)
        };
        match outcome {
            Ok(Inserted::Duplicate) => assert!(inserted[f.index as usize]),
            Ok(_) => {
                assert!(!inserted[f.index as usize]);
                inserted[f.index as usize] = true;
            }
            Err(_) => {}
        }
        let ack = r.ack();
        assert!(ack.prefix <= input.count);
        // Memory grows with the fragments that came: no further than the window past the prefix.
        assert!(r.held() <= r.message_len());
        assert!(r.held() <= (usize::from(ack.prefix) + usize::from(MAX_WINDOW) + 1) * frag_payload);
        assert_eq!(r.is_complete(), inserted.iter().all(|&b| b));
    }
    for (i, &got) in inserted.iter().enumerate() {
        if got {
            let range = fragment_range(i as u16, r.message_len(), frag_payload);
            assert!(r.message()[range].iter().all(|&b| b == i as u8 ^ 0x5a));
        }
    }
});
