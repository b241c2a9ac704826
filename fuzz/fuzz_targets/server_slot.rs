//! The server's per-slot state machine fed arbitrary call, ack and probe packets, interleaved with
//! procedures finishing. Whatever arrives, no sequence number is ever executed twice (at most
//! once), reassembled messages are exactly as long as announced and within the limit, and nothing
//! panics. Sequence numbers stay within 2^16 of each other, as a client's do (it counts up by one):
//! serial-number arithmetic makes a number "new" again only half the number space later.
#![no_main]

use std::collections::HashSet;
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tiercel_proto::server::{CallAction, Slot};
use tiercel_proto::wire::{Header, Kind, Packet};
use tiercel_proto::Timing;

#[derive(Arbitrary, Debug)]
enum Op {
    Packet {
        kind: u8,
        flags: u8,
        seq: u16,
        frag_index: u16,
        frag_count: u16,
        message_len: u32,
        payload: Vec<u8>,
    },
    /// The running procedure returns a result of this many bytes.
    Complete {
        result_len: u32,
    },
    /// A retransmitted call asks for the saved result again.
    Resend,
    Wait {
        ms: u16,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    frag_payload: u16,
    budget: u32,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let timing = Timing { max_message: 1 << 20, ..Timing::default() };
    let frag_payload = (input.frag_payload as usize).max(1);
    let window = timing.window_for(frag_payload, tiercel_proto::fragment::MAX_WINDOW);
    let mut slot = Slot::new();
    let mut now = Instant::now();
    let mut executed = HashSet::new();
    let mut running: Option<u32> = None;
    let mut reserved = 0usize;
    let budget = input.budget as usize % (2 << 20);
    for op in input.ops.into_iter().take(2048) {
        match op {
            Op::Packet { kind, flags, seq, frag_index, frag_count, message_len, payload } => {
                let Some(kind) = Kind::from_u8(kind) else { continue };
                let seq = u32::from(seq);
                let header = Header {
                    flags,
                    seq,
                    frag_index,
                    frag_count,
                    payload_len: payload.len() as u32,
                    message_len,
                    ..Header::new(kind)
                };
                let mut bytes = header.to_bytes().to_vec();
                bytes.extend_from_slice(&payload);
                let Ok(p) = Packet::new_checked(&bytes[..]) else { continue };
                match kind {
                    Kind::Call => {
                        let reserve = |n: usize| {
                            if reserved + n > budget {
                                return false;
                            }
                            reserved += n;
                            true
                        };
                        // A message longer than the budget could never be reserved.
                        match slot.on_call(&p, now, frag_payload, window, &timing, || budget, reserve) {
                            CallAction::Execute => {
                                assert!(executed.insert(seq), "call {seq} executed twice");
                                running = Some(seq);
                            }
                            CallAction::ExecuteMessage(m) => {
                                assert!(executed.insert(seq), "call {seq} executed twice");
                                assert_eq!(m.len(), message_len as usize);
                                assert!(m.len() <= timing.max_message);
                                // The whole message was reserved as its fragments came; it is
                                // given back once the call has run.
                                assert!(m.len() <= reserved);
                                reserved -= m.len();
                                running = Some(seq);
                            }
                            CallAction::Refuse(_) => {
                                // Refused without running: completes at once with the refusal.
                                slot.complete(seq, 0, frag_payload, window);
                            }
                            _ => {}
                        }
                    }
                    Kind::Ack => {
                        slot.on_result_ack(&p, now);
                    }
                    Kind::Probe => {
                        slot.on_probe(seq, now);
                    }
                    _ => {}
                }
            }
            Op::Complete { result_len } => {
                if let Some(seq) = running.take() {
                    slot.complete(seq, result_len as usize % (1 << 20), frag_payload, window);
                    let mut sent = 0usize;
                    while slot.poll_transmit().is_some() {
                        sent += 1;
                    }
                    // The first blast is at most the window.
                    assert!(sent <= usize::from(window));
                }
            }
            Op::Resend => slot.resend_result(),
            Op::Wait { ms } => now += Duration::from_millis(ms as u64),
        }
        while slot.poll_transmit().is_some() {}
        reserved = reserved.saturating_sub(slot.take_released());
        assert!(slot.reassembly_bytes() <= timing.max_message);
        assert!(slot.reassembly_bytes() <= reserved, "a call holds only memory it reserved");
    }
});
