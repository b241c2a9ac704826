//! The shipped server endpoint driven with what TCP and shared memory give it: bindings connected
//! and released in the one table every transport shares, arbitrary bytes read from a connection in
//! arbitrary pieces (deframed, checked, and decided by `on_frame` as the TCP server does), calls
//! started and finished on a binding's own threads (as both transports run them), the words of calls
//! found in a region's slots decided by `slot_call` as the shared-memory server does, datagram bindings
//! granted beside them, time passing and the server draining. Whatever arrives: nothing panics; the
//! table never holds more than `max_bindings` and counts exactly what it holds; a connection's
//! binding is never reached by datagram; a frame is taken as a call only if it names its binding,
//! this incarnation and one of its slots, and never while draining; an answer always names the
//! binding and the frame's slot and call; a slot's call runs only when its words are in range, room
//! was found first, its client had not given it up and the server is not draining; a stream binding
//! with a call running is never expired.
#![no_main]

use std::sync::Arc;
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tiercel_proto::endpoint::{Binding, Carrier, EndpointConfig, Framed, ServerEndpoint, SlotStep, Terms};
use tiercel_proto::shm::{validate_call, CallWords};
use tiercel_proto::stream::{check_frame, Deframer, Next};
use tiercel_proto::wire::{Kind, Status};
use tiercel_proto::Timing;

const MAX_BINDINGS: usize = 4;
const SLOTS: u32 = 3;
/// Bytes of data in each slot of a region.
const REGION_DATA: usize = 8192;

#[derive(Arbitrary, Debug)]
enum Op {
    /// A TCP (`stream`) or shared-memory binding is granted.
    Connect { stream: bool },
    /// A UDP binding is granted beside them.
    Grant { nonce: u8 },
    /// Binding `which` ends (its connection closed).
    Release { which: u8 },
    /// These bytes arrive on binding `which`'s connection, read `chunk` bytes at a time.
    Bytes { which: u8, chunk: u8, bytes: Vec<u8> },
    /// A call of binding `which` starts on its own threads, or the oldest running one ends.
    Run { which: u8, start: bool },
    /// A call's words, as read from a slot of binding `which`'s region, decided with `room` (or
    /// not) in the budgets.
    Slot { which: u8, procedure: u32, len: u32, cancelled: bool, room: bool },
    /// Time passes and the endpoint expires what is idle.
    Wait { ms: u16 },
    /// The server begins to shut down.
    Drain,
}

type B = Binding<u8, ()>;

struct Connection {
    binding: Arc<B>,
    frames: Deframer,
    running: u32,
}

fuzz_target!(|ops: Vec<Op>| {
    let config = EndpointConfig {
        incarnation: 5,
        max_bindings: MAX_BINDINGS,
        slots_per_binding: SLOTS,
        binding_memory: 1 << 16,
        memory: 1 << 18,
        carrier_memory: 1 << 18,
        stalled_after: Duration::from_millis(300),
        binding_idle: Duration::from_millis(500),
        max_running: 1,
        timing: Timing::default(),
    };
    let mut now = Instant::now();
    let endpoint: ServerEndpoint<u8, ()> =
        ServerEndpoint::new(config, now, Box::new(tiercel_proto::bind::InsecureChallenges));
    let mut connections: Vec<Connection> = Vec::new();
    let mut datagram = 0usize;
    for op in ops.into_iter().take(256) {
        match op {
            Op::Connect { stream } => {
                let carrier = if stream { Carrier::Stream } else { Carrier::Region };
                let room = endpoint.has_room();
                match endpoint.connect(carrier, (), now) {
                    Some(binding) => {
                        assert!(room, "granted without room");
                        assert_eq!(binding.token, 0);
                        assert!(endpoint.lookup(binding.id, 0).is_none(), "reached by datagram");
                        assert!(connections.iter().all(|c| c.binding.id != binding.id), "id given twice");
                        connections.push(Connection { binding, frames: Deframer::new(64, 4096), running: 0 });
                    }
                    None => assert!(!room, "refused with room"),
                }
            }
            Op::Grant { nonce } => {
                let terms = Terms { max_datagram: 1500, features: 0 };
                if let Some((b, new)) = endpoint.grant(1, u64::from(nonce), (), 0x77, terms, now) {
                    assert!(connections.iter().all(|c| c.binding.id != b.id), "id given twice");
                    datagram += usize::from(new);
                }
            }
            Op::Release { which } => {
                if connections.is_empty() {
                    continue;
                }
                let c = connections.swap_remove(usize::from(which) % connections.len());
                for _ in 0..c.running {
                    endpoint.run_finished(&c.binding);
                }
                endpoint.release(&c.binding);
                endpoint.release(&c.binding);
            }
            Op::Bytes { which, chunk, bytes } => {
                if connections.is_empty() {
                    continue;
                }
                let n = connections.len();
                let c = &mut connections[usize::from(which) % n];
                let chunk = usize::from(chunk) + 1;
                let draining = endpoint.is_draining();
                let mut rest = &bytes[..];
                'read: loop {
                    loop {
                        match c.frames.next() {
                            Err(_) => break 'read,
                            Ok(Next::Frame(_)) => {}
                            Ok(Next::Partial(len)) => {
                                // The TCP server's way: room as the bytes arrive.
                                if c.frames.needs_room(len) {
                                    let to = c.frames.next_size(len);
                                    c.frames.grow_toward(len, to);
                                }
                                break;
                            }
                            Ok(Next::Nothing) => break,
                        }
                        let Ok(p) = check_frame(c.frames.frame()) else { break 'read };
                        let (slot, seq, procedure) = (p.slot(), p.seq(), p.procedure());
                        match endpoint.on_frame(&c.binding, &p, now) {
                            Framed::Call => {
                                assert!(!draining, "a call taken while draining");
                                let named = (p.kind(), p.binding(), p.token(), p.incarnation());
                                assert_eq!(named, (Kind::Call, c.binding.id, 0, 5));
                                assert!(slot < SLOTS);
                            }
                            Framed::Answer(h) => {
                                let named = (h.binding, h.slot, h.seq, h.procedure, h.incarnation);
                                assert_eq!(named, (c.binding.id, slot, seq, procedure, 5));
                                match h.kind {
                                    Kind::Reject => assert_ne!(h.status, Status::Ok),
                                    Kind::Result => assert_eq!((p.kind(), h.status), (Kind::Call, Status::Busy)),
                                    Kind::ProbeReply => assert_eq!(p.kind(), Kind::Probe),
                                    other => panic!("answered with {other:?}"),
                                }
                            }
                            Framed::Cancel => assert_eq!(p.kind(), Kind::Cancel),
                            Framed::Malformed => break 'read,
                        }
                        c.frames.consume();
                    }
                    let spare = c.frames.spare();
                    let n = spare.len().min(chunk).min(rest.len());
                    if n == 0 {
                        break;
                    }
                    spare[..n].copy_from_slice(&rest[..n]);
                    c.frames.filled(n);
                    rest = &rest[n..];
                }
            }
            Op::Run { which, start } => {
                if connections.is_empty() {
                    continue;
                }
                let n = connections.len();
                let c = &mut connections[usize::from(which) % n];
                if start {
                    // A call starts only on a binding the endpoint still holds open.
                    if c.binding.is_expired() {
                        continue;
                    }
                    endpoint.run_started(&c.binding);
                    c.running += 1;
                } else if c.running > 0 {
                    endpoint.run_finished(&c.binding);
                    c.running -= 1;
                }
            }
            Op::Slot { which, procedure, len, cancelled, room } => {
                let Some(c) =
                    connections.iter().filter(|c| c.binding.carrier == Carrier::Region).nth(usize::from(which))
                else {
                    continue;
                };
                let words = CallWords { procedure, len, deadline: None, cancelled };
                let valid = validate_call(procedure, len, REGION_DATA);
                let mut asked = None;
                let ask = |n: usize| {
                    asked = Some(n);
                    if room {
                        Ok(())
                    } else {
                        Err(n)
                    }
                };
                let step = endpoint.slot_call(&c.binding, &words, REGION_DATA, ask, || now);
                // Room is asked first, for what the call's arguments take (nothing past the slot).
                assert_eq!(asked, Some(valid.map_or(0, |v| v.len)));
                // Without room: `TooLarge` for what the binding could never hold, else `Busy`.
                let needed = valid.map_or(0, |v| v.len);
                let expected = match valid {
                    _ if !room && needed > c.binding.memory_most() => SlotStep::TooLarge,
                    _ if !room => SlotStep::Busy,
                    None => SlotStep::Malformed,
                    Some(_) if cancelled => SlotStep::Cancelled,
                    Some(_) if endpoint.is_draining() => SlotStep::Busy,
                    Some(call) => SlotStep::Run(call),
                };
                assert_eq!(step, expected);
            }
            Op::Wait { ms } => {
                now += Duration::from_millis(u64::from(ms));
                let busy: Vec<bool> = connections.iter().map(|c| c.running > 0 && !c.binding.is_expired()).collect();
                endpoint.expire(now);
                for (c, busy) in connections.iter().zip(busy) {
                    assert!(!(busy && c.binding.is_expired()), "expired with a call running");
                }
                for c in &connections {
                    if c.binding.carrier == Carrier::Region {
                        assert!(!c.binding.is_expired(), "a region's binding lasts with its client");
                    }
                }
            }
            Op::Drain => endpoint.drain(),
        }
        assert!(endpoint.len() <= MAX_BINDINGS);
        assert!(endpoint.len() >= connections.len());
        assert!(endpoint.len() <= connections.len() + datagram);
        // A region's calls are watched by its transport, not counted by the endpoint.
        let running: u32 = connections.iter().filter(|c| c.binding.carrier == Carrier::Stream).map(|c| c.running).sum();
        assert_eq!(endpoint.running(), running as usize);
    }
});
