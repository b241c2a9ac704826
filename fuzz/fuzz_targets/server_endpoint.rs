//! The shipped server endpoint fed arbitrary packets from arbitrary peers, as the UDP server drives
//! it: route, enter the slot, handle the call, ack or probe, run and complete calls, send what it
//! queues, expire idle bindings. Whatever arrives: nothing panics, no (binding, slot, seq) runs
//! twice, no binding's charged memory exceeds its budget, and every packet it asks to send is valid.
#![no_main]

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tiercel_proto::bind::wire::features;
use tiercel_proto::endpoint::{Binding, EndpointConfig, Fragment, Refusal, Route, ServerEndpoint, SlotCell, Terms};
use tiercel_proto::server::{CallAction, ProbeAction};
use tiercel_proto::wire::{Header, Kind, Packet, Status, HEADER_LEN};
use tiercel_proto::Timing;

const BUDGET: usize = 4096;
/// Bytes all bindings together may hold: less than three bindings' budgets, so that it binds.
const SERVER_BUDGET: usize = 6144;

#[derive(Arbitrary, Debug)]
enum Op {
    /// A packet from `peer`; `binding` picks one of the granted bindings (or a wrong one) and
    /// `good_token` whether it carries that binding's token; `prove` whether its sender answers an
    /// address challenge, as a client does.
    Packet {
        peer: u8,
        prove: bool,
        kind: u8,
        binding: u8,
        good_token: bool,
        old_incarnation: bool,
        flags: u8,
        slot: u8,
        seq: u8,
        frag_index: u8,
        frag_count: u8,
        message_len: u16,
        payload: Vec<u8>,
    },
    /// A bind request granted to `peer` with `nonce`.
    Grant { peer: u8, nonce: u8 },
    /// The oldest running call finishes with a result of this many bytes.
    Complete { result_len: u16 },
    /// Time passes, and idle bindings are forgotten.
    Wait { ms: u16 },
}

type B = Binding<u8, ()>;

/// Sends everything the slot queued, checking each packet.
fn drain(binding: &B, cell: &mut SlotCell<u8>) {
    while let Some(f) = cell.poll_transmit(binding) {
        let bytes = match f {
            Fragment::Whole(b) => b.to_vec(),
            Fragment::Parts(h, body) => [&h[..], body].concat(),
        };
        let p = Packet::new_checked(&bytes[..]).expect("queued result fragments are valid packets");
        assert_eq!(p.kind(), Kind::Result);
    }
}

fuzz_target!(|ops: Vec<Op>| {
    let timing = Timing { max_message: 1 << 16, window: 4, ..Timing::default() };
    let config = EndpointConfig {
        incarnation: 2,
        max_bindings: 3,
        slots_per_binding: 2,
        binding_memory: BUDGET,
        memory: SERVER_BUDGET,
        carrier_memory: SERVER_BUDGET,
        stalled_after: Duration::from_millis(300),
        binding_idle: Duration::from_millis(500),
        max_running: 2,
        timing,
    };
    let mut now = Instant::now();
    let endpoint: ServerEndpoint<u8, ()> =
        ServerEndpoint::new(config, now, Box::new(tiercel_proto::bind::InsecureChallenges));
    // Bindings granted (id and token; the endpoint holds them), and the next token to give.
    let mut granted: Vec<(u32, u128)> = Vec::new();
    let mut next_token = 1u128;
    let mut executed = HashSet::new();
    let mut running: Vec<(Arc<B>, Vec<u8>)> = Vec::new();
    for op in ops {
        match op {
            Op::Grant { peer, nonce } => {
                // Clients with and without wide windows.
                let features = if nonce % 2 == 0 { features::ALL } else { features::ALL & !features::WIDE_WINDOW };
                let terms = Terms { max_datagram: HEADER_LEN + 64, features };
                if let Some((b, new)) = endpoint.grant(peer, u64::from(nonce), (), next_token, terms, now) {
                    if new {
                        next_token += 1;
                    }
                    granted.push((b.id, b.token));
                }
            }
            Op::Packet {
                peer,
                prove,
                kind,
                binding,
                good_token,
                old_incarnation,
                flags,
                slot,
                seq,
                frag_index,
                frag_count,
                message_len,
                payload,
            } => {
                let Some(kind) = Kind::from_u8(kind % 9) else { continue };
                let target = granted.get(usize::from(binding) % (granted.len() + 1));
                let h = Header {
                    kind,
                    flags: flags & 0x07,
                    binding: target.map_or(u32::from(binding), |&(id, _)| id),
                    token: target.map_or(0, |&(_, token)| if good_token { token } else { token ^ (1 << 100) }),
                    incarnation: if old_incarnation { 1 } else { 2 },
                    slot: u32::from(slot % 3),
                    seq: u32::from(seq),
                    frag_index: u16::from(frag_index),
                    frag_count: u16::from(frag_count),
                    payload_len: payload.len() as u32,
                    message_len: u32::from(message_len),
                    ..Header::new(kind)
                };
                let bytes = [&h.to_bytes()[..], &payload].concat();
                let Ok(p) = Packet::new_checked(&bytes[..]) else { continue };
                let b = match endpoint.route(&p, now) {
                    Route::Binding(b) => b,
                    Route::Reject(r) => {
                        assert_eq!((r.kind, r.incarnation), (Kind::Reject, 2));
                        continue;
                    }
                    Route::Bind | Route::Malformed => continue,
                };
                assert!(good_token && !old_incarnation, "only the right token and incarnation reach a binding");
                let mut cell = match endpoint.enter(&b, &p, peer, now) {
                    Ok(cell) => cell,
                    Err(Refusal::Reject(h)) => {
                        assert_eq!((h.kind, h.payload_len), (Kind::Reject, 0));
                        continue;
                    }
                    Err(Refusal::Challenge(h, challenge)) => {
                        // No larger than the packet it answers, plus the challenge.
                        assert_eq!((h.kind, h.status), (Kind::Reject, Status::AddressUnproven));
                        assert!(HEADER_LEN + challenge.len() <= bytes.len() + 16);
                        if !prove {
                            continue;
                        }
                        let probe = Header {
                            flags: tiercel_proto::wire::flags::ADDRESS_PROOF,
                            payload_len: challenge.len() as u32,
                            ..Header::new(Kind::Probe)
                        };
                        let probe =
                            Header { binding: h.binding, slot: h.slot, token: h.token, incarnation: 2, ..probe };
                        let proof = [&probe.to_bytes()[..], &challenge].concat();
                        let proof = Packet::new_checked(&proof[..]).expect("a valid probe");
                        let cell =
                            endpoint.enter(&b, &proof, peer, now).expect("an echoed challenge proves the address");
                        assert_eq!(cell.peer, Some(peer));
                        continue;
                    }
                };
                assert_eq!(cell.peer, Some(peer), "only a proven address enters its slot");
                match kind {
                    Kind::Call => match cell.on_call(&b, &p, now, &timing) {
                        CallAction::ExecuteMessage(m) => {
                            assert!(executed.insert((b.token, p.slot(), p.seq())), "a call ran twice");
                            b.release(m.len());
                            endpoint.run_started(&b);
                            drop(cell);
                            running.push((b.clone(), bytes.clone()));
                        }
                        CallAction::Execute => {
                            // Tokens are never reused, so a token names one binding for good.
                            assert!(executed.insert((b.token, p.slot(), p.seq())), "a call ran twice");
                            endpoint.run_started(&b);
                            drop(cell);
                            running.push((b.clone(), bytes.clone()));
                        }
                        CallAction::Refuse(status) => {
                            cell.refuse(&b, &p, status, &timing);
                            drain(&b, &mut cell);
                        }
                        CallAction::ResendResult => {
                            cell.resend_result();
                            drain(&b, &mut cell);
                        }
                        CallAction::Ack(_) | CallAction::Drop(_) | CallAction::Busy => {}
                    },
                    Kind::Ack => {
                        cell.on_result_ack(&b, &p, now);
                        drain(&b, &mut cell);
                    }
                    Kind::Probe => {
                        if cell.proto.on_probe(p.seq(), now) == ProbeAction::ResendResult {
                            cell.resend_result();
                        }
                        drain(&b, &mut cell);
                    }
                    _ => unreachable!("routed only calls, acks and probes"),
                }
                assert!(b.memory() <= BUDGET && endpoint.memory() <= SERVER_BUDGET);
            }
            Op::Complete { result_len } => {
                if running.is_empty() {
                    continue;
                }
                let (b, bytes) = running.remove(0);
                endpoint.run_finished(&b);
                let p = Packet::new_checked(&bytes[..]).expect("checked before");
                if let Some(mut cell) = b.slot(p.slot()) {
                    let mut out = cell.take_result(&b);
                    out.resize(HEADER_LEN + usize::from(result_len), 5);
                    let status = cell.complete(&b, &p, Status::Ok, out, &timing);
                    assert!(status == Status::Ok || status == Status::ResultTooLarge);
                    drain(&b, &mut cell);
                }
                assert!(b.memory() <= BUDGET && endpoint.memory() <= SERVER_BUDGET);
            }
            Op::Wait { ms } => {
                now += Duration::from_millis(u64::from(ms));
                endpoint.expire(now);
                endpoint.reclaim(now);
            }
        }
    }
});
