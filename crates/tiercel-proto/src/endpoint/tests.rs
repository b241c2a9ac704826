use super::*;
use crate::fragment::AckInfo;
use crate::server::CallAction;
use crate::wire::HEADER_LEN;

const TOKEN: u128 = 0xfeed;

fn config() -> EndpointConfig {
    EndpointConfig {
        incarnation: 9,
        max_bindings: 2,
        slots_per_binding: 2,
        binding_memory: 1000,
        binding_idle: Duration::from_secs(10),
        max_running: 1,
        timing: Timing::default(),
    }
}

fn packet(kind: Kind, binding: u32, token: u128, incarnation: u64, slot: u32, seq: u32) -> Vec<u8> {
    let h = Header { binding, token, incarnation, slot, seq, ..Header::new(kind) };
    h.to_bytes().to_vec()
}

fn fragment(binding: u32, seq: u32, index: u16, count: u16, message_len: u32, payload: &[u8]) -> Vec<u8> {
    let h = Header {
        binding,
        token: TOKEN,
        incarnation: 9,
        seq,
        frag_index: index,
        frag_count: count,
        payload_len: payload.len() as u32,
        message_len,
        ..Header::new(Kind::Call)
    };
    [&h.to_bytes()[..], payload].concat()
}

fn endpoint(now: Instant) -> (ServerEndpoint<u8, ()>, Arc<Binding<u8, ()>>) {
    let e = ServerEndpoint::new(config(), now);
    let (b, new) = e.grant(1, 77, (), TOKEN, HEADER_LEN + 100, now).unwrap();
    assert!(new);
    (e, b)
}

fn route(e: &ServerEndpoint<u8, ()>, bytes: &[u8], now: Instant) -> Route<u8, ()> {
    e.route(&Packet::new_checked(bytes).unwrap(), now)
}

#[test]
fn packets_are_routed_by_kind_binding_token_and_incarnation() {
    let now = Instant::now();
    let (e, b) = endpoint(now);
    assert!(matches!(route(&e, &packet(Kind::Bind, 0, 0, 0, 0, 0), now), Route::Bind));
    for kind in [Kind::Result, Kind::ProbeReply, Kind::Reject, Kind::BindReply] {
        assert!(matches!(route(&e, &packet(kind, b.id, TOKEN, 9, 0, 1), now), Route::Malformed), "{kind:?}");
    }
    let Route::Reject(h) = route(&e, &packet(Kind::Call, b.id, TOKEN + 1, 9, 0, 1), now) else { panic!() };
    assert_eq!((h.kind, h.status), (Kind::Reject, Status::UnknownBinding), "wrong token");
    let Route::Reject(h) = route(&e, &packet(Kind::Call, b.id + 1, TOKEN, 9, 0, 1), now) else { panic!() };
    assert_eq!(h.status, Status::UnknownBinding, "unknown id");
    // The right binding and token from an earlier incarnation: the incarnation check alone refuses it.
    let Route::Reject(h) = route(&e, &packet(Kind::Call, b.id, TOKEN, 8, 0, 1), now) else { panic!() };
    assert_eq!((h.status, h.incarnation), (Status::WrongIncarnation, 9));
    assert!(matches!(route(&e, &packet(Kind::Probe, b.id, TOKEN, 9, 0, 1), now), Route::Binding(_)));
}

#[test]
fn slots_outside_the_binding_and_new_calls_beyond_max_running_are_refused() {
    let now = Instant::now();
    let (e, b) = endpoint(now);
    let call = |slot, seq| packet(Kind::Call, b.id, TOKEN, 9, slot, seq);
    let bytes = call(2, 1);
    let err = e.enter(&b, &Packet::new_checked(&bytes[..]).unwrap(), 1).unwrap_err();
    assert_eq!(err.status, Status::BadSlot);
    let first = call(0, 1);
    let p = Packet::new_checked(&first[..]).unwrap();
    let mut cell = e.enter(&b, &p, 1).unwrap();
    assert_eq!(cell.on_call(&b, &p, now, &e.config().timing), CallAction::Execute);
    drop(cell);
    e.run_started();
    let second = call(1, 1);
    let err = e.enter(&b, &Packet::new_checked(&second[..]).unwrap(), 1).unwrap_err();
    assert_eq!(err.status, Status::Busy, "the one call allowed is running");
    // A duplicate of the running call is no new call: it is let through (and suppressed there).
    let mut cell = e.enter(&b, &p, 1).unwrap();
    assert!(matches!(cell.on_call(&b, &p, now, &e.config().timing), CallAction::Drop(_)));
    drop(cell);
    e.run_finished();
    assert!(e.enter(&b, &Packet::new_checked(&second[..]).unwrap(), 1).is_ok());
    // Draining: new calls are refused, calls under way are still answered.
    e.drain();
    let third = call(1, 2);
    assert_eq!(e.enter(&b, &Packet::new_checked(&third[..]).unwrap(), 1).unwrap_err().status, Status::Busy);
    assert!(e.enter(&b, &p, 1).is_ok(), "a duplicate of an earlier call gets its answer");
}

#[test]
fn duplicate_bind_requests_get_the_same_binding_and_the_table_is_bounded() {
    let now = Instant::now();
    let (e, b) = endpoint(now);
    let (again, new) = e.grant(1, 77, (), 5, HEADER_LEN + 100, now).unwrap();
    assert!(!new && Arc::ptr_eq(&again, &b), "same sender and nonce: the same binding");
    let (other, new) = e.grant(2, 77, (), 6, HEADER_LEN + 100, now).unwrap();
    assert!(new && other.id != b.id);
    assert!(e.grant(3, 1, (), 7, HEADER_LEN + 100, now).is_none(), "max_bindings is 2");
    assert_eq!(e.len(), 2);
}

#[test]
fn idle_bindings_expire_unless_in_use() {
    let now = Instant::now();
    let (e, b) = endpoint(now);
    let later = now + Duration::from_secs(11);
    assert_eq!(e.expire(later), 0, "held by a thread");
    drop(b);
    assert_eq!(e.expire(now + Duration::from_secs(5)), 0, "not idle long enough");
    assert_eq!(e.expire(later), 1);
    assert!(e.is_empty());
    assert!(e.grant(1, 77, (), TOKEN, HEADER_LEN + 100, later).unwrap().1, "its request is forgotten too");
}

#[test]
fn multi_packet_messages_are_charged_to_the_binding_budget() {
    let now = Instant::now();
    let (e, b) = endpoint(now);
    let timing = e.config().timing;
    // A 2,000-byte call does not fit the 1,000-byte budget: refused before anything is allocated.
    let big = fragment(b.id, 1, 0, 20, 2000, &[0; 100]);
    let p = Packet::new_checked(&big[..]).unwrap();
    let mut cell = e.enter(&b, &p, 1).unwrap();
    assert_eq!(cell.on_call(&b, &p, now, &timing), CallAction::Refuse(Status::TooLarge));
    assert_eq!(b.memory(), 0);
    cell.refuse(&b, &p, Status::TooLarge, &timing);
    let Some(Fragment::Whole(bytes)) = cell.poll_transmit(&b) else { panic!() };
    assert_eq!(Packet::new_checked(bytes).unwrap().status(), Status::TooLarge);
    assert!(cell.poll_transmit(&b).is_none());
    // A 300-byte call is charged while it is reassembled, and given back once it runs.
    let parts: Vec<Vec<u8>> = (0..3).map(|i| fragment(b.id, 2, i, 3, 300, &[i as u8; 100])).collect();
    let p = Packet::new_checked(&parts[0][..]).unwrap();
    assert!(matches!(cell.on_call(&b, &p, now, &timing), CallAction::Drop(_) | CallAction::Ack(_)));
    assert_eq!(b.memory(), 300);
    cell.on_call(&b, &Packet::new_checked(&parts[1][..]).unwrap(), now, &timing);
    let last = Packet::new_checked(&parts[2][..]).unwrap();
    let CallAction::ExecuteMessage(m) = cell.on_call(&b, &last, now, &timing) else { panic!() };
    assert_eq!(m.len(), 300);
    b.release(m.len());
    // Its 250-byte result is charged until acknowledged.
    let mut out = cell.take_result(&b);
    out.resize(HEADER_LEN + 250, 3);
    assert_eq!(cell.complete(&b, &last, Status::Ok, out, &timing), Status::Ok);
    assert_eq!(b.memory(), 250);
    let mut sent = 0;
    while let Some(f) = cell.poll_transmit(&b) {
        let Fragment::Parts(h, body) = f else { panic!("a multi-packet result goes in parts") };
        let h = Packet::new_checked([&h[..], body].concat()).unwrap().header();
        assert_eq!((h.kind, h.frag_index, h.frag_count, h.message_len, h.seq), (Kind::Result, sent, 3, 250, 2));
        sent += 1;
    }
    assert_eq!(sent, 3);
    let ack = Header {
        binding: b.id,
        token: TOKEN,
        incarnation: 9,
        seq: 2,
        payload_len: crate::fragment::ACK_PAYLOAD_LEN as u32,
        ..Header::new(Kind::Ack)
    };
    let ack = [&ack.to_bytes()[..], &AckInfo { prefix: 3, mask: 0 }.to_bytes()].concat();
    cell.on_result_ack(&b, &Packet::new_checked(&ack[..]).unwrap(), now);
    assert_eq!(b.memory(), 0, "the acknowledged result gave its bytes back");
    assert_eq!(e.memory(), 0);
    // A result beyond the budget, after the procedure ran, becomes ResultTooLarge.
    let third = fragment(b.id, 3, 0, 1, 1, &[1]);
    let p = Packet::new_checked(&third[..]).unwrap();
    assert_eq!(cell.on_call(&b, &p, now, &timing), CallAction::Execute);
    let mut out = cell.take_result(&b);
    out.resize(HEADER_LEN + 5000, 0);
    assert_eq!(cell.complete(&b, &p, Status::Ok, out, &timing), Status::ResultTooLarge);
    let Some(Fragment::Whole(bytes)) = cell.poll_transmit(&b) else { panic!() };
    let r = Packet::new_checked(bytes).unwrap();
    assert_eq!((r.status(), r.frag_count()), (Status::ResultTooLarge, 1));
    assert!(String::from_utf8_lossy(r.payload()).contains("5000 bytes"));
    assert_eq!(b.memory(), 0);
}
