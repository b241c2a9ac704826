//! A client call fed whatever a server (or anyone spoofing it) might send: results, acks, probe
//! replies and rejects with arbitrary fields, interleaved with timeouts. It must never panic, stop
//! changing its mind once it has an outcome, and never hold a reassembled result beyond the limit.
#![no_main]

use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tiercel_proto::client::ClientCall;
use tiercel_proto::wire::{Header, Kind, Packet, Status};
use tiercel_proto::Timing;

#[derive(Arbitrary, Debug)]
enum Op {
    Packet {
        kind: u8,
        flags: u8,
        status: u8,
        /// Offset from the call's sequence number (mostly small, so packets often match).
        seq_delta: i8,
        frag_index: u16,
        frag_count: u16,
        message_len: u32,
        payload: Vec<u8>,
    },
    Wait {
        ms: u16,
    },
    Transmit,
}

#[derive(Arbitrary, Debug)]
struct Input {
    frag_payload: u16,
    seq: u32,
    message_len: u32,
    deadline_ms: Option<u16>,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let timing = Timing { max_message: 1 << 20, ..Timing::default() };
    let mut now = Instant::now();
    let mut call = ClientCall::new(timing, input.frag_payload as usize, tiercel_proto::fragment::MAX_WINDOW, now);
    let deadline = input.deadline_ms.map(|ms| now + Duration::from_millis(ms as u64));
    call.start(input.seq, input.message_len as usize % (1 << 20), now, deadline);
    let mut outcome = None;
    for op in input.ops.into_iter().take(2048) {
        match op {
            Op::Packet { kind, flags, status, seq_delta, frag_index, frag_count, message_len, payload } => {
                let (Some(kind), Some(status)) = (Kind::from_u8(kind), Status::from_u8(status)) else { continue };
                let header = Header {
                    flags,
                    status,
                    seq: input.seq.wrapping_add(seq_delta as u32),
                    frag_index,
                    frag_count,
                    payload_len: payload.len() as u32,
                    message_len,
                    ..Header::new(kind)
                };
                let mut bytes = header.to_bytes().to_vec();
                bytes.extend_from_slice(&payload);
                let Ok(p) = Packet::new_checked(&bytes[..]) else { continue };
                call.handle_packet(&p, now);
            }
            Op::Wait { ms } => {
                now += Duration::from_millis(ms as u64);
                call.handle_timeout(now);
            }
            Op::Transmit => while call.poll_transmit().is_some() {},
        }
        match (outcome, call.outcome()) {
            (None, o) => outcome = o,
            (Some(before), o) => assert_eq!(o, Some(before), "an outcome never changes"),
        }
        if let Some(m) = call.message() {
            assert!(m.len() <= timing.max_message);
        }
    }
});
