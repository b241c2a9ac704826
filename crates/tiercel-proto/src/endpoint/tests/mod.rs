use super::*;
use crate::fragment::AckInfo;
use crate::server::CallAction;
use crate::wire::HEADER_LEN;

const TOKEN: u128 = 0xfeed;

/// A binding's terms: datagrams of `max_datagram` bytes, every feature.
fn terms(max_datagram: usize) -> Terms {
    Terms { max_datagram, features: crate::bind::wire::features::ALL }
}

fn config() -> EndpointConfig {
    EndpointConfig {
        incarnation: 9,
        max_bindings: 2,
        slots_per_binding: 2,
        binding_memory: 1000,
        memory: 1500,
        carrier_memory: 1500,
        stalled_after: Duration::from_secs(2),
        binding_idle: Duration::from_secs(10),
        max_running: 1,
        timing: Timing { max_message: 10_000, ..Timing::default() },
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
    let e = ServerEndpoint::new(config(), now, Box::new(crate::bind::InsecureChallenges));
    let (b, new) = e.grant(1, 77, (), TOKEN, terms(HEADER_LEN + 100), now).unwrap();
    assert!(new);
    (e, b)
}

/// A probe of slot `slot` of `b` echoing `challenge`.
fn proof(b: &Binding<u8, ()>, slot: u32, challenge: [u8; 16]) -> Vec<u8> {
    let h = Header {
        binding: b.id,
        token: TOKEN,
        incarnation: 9,
        slot,
        flags: flags::ADDRESS_PROOF,
        payload_len: 16,
        ..Header::new(Kind::Probe)
    };
    [&h.to_bytes()[..], &challenge].concat()
}

/// Enters as a client does: answering the address challenge first when there is one.
fn enter<'b>(
    e: &ServerEndpoint<u8, ()>,
    b: &'b Binding<u8, ()>,
    p: &Packet<&[u8]>,
    from: u8,
) -> Result<MutexGuard<'b, SlotCell<u8>>, Header> {
    let now = Instant::now();
    match e.enter(b, p, from, now) {
        Err(Refusal::Challenge(_, c)) => {
            let probe = proof(b, p.slot(), c);
            drop(e.enter(b, &Packet::new_checked(&probe[..]).unwrap(), from, now).expect("the proof is taken"));
            e.enter(b, p, from, now).map_err(|r| *r.header())
        }
        r => r.map_err(|r| *r.header()),
    }
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
    let err = enter(&e, &b, &Packet::new_checked(&bytes[..]).unwrap(), 1).unwrap_err();
    assert_eq!(err.status, Status::BadSlot);
    let first = call(0, 1);
    let p = Packet::new_checked(&first[..]).unwrap();
    let mut cell = enter(&e, &b, &p, 1).unwrap();
    assert_eq!(cell.on_call(&b, &p, now, &e.config().timing), CallAction::Execute);
    drop(cell);
    e.run_started(&b);
    let second = call(1, 1);
    let err = enter(&e, &b, &Packet::new_checked(&second[..]).unwrap(), 1).unwrap_err();
    assert_eq!(err.status, Status::Busy, "the one call allowed is running");
    // A duplicate of the running call is no new call: it is let through (and suppressed there).
    let mut cell = enter(&e, &b, &p, 1).unwrap();
    assert!(matches!(cell.on_call(&b, &p, now, &e.config().timing), CallAction::Drop(_)));
    drop(cell);
    e.run_finished(&b);
    assert!(enter(&e, &b, &Packet::new_checked(&second[..]).unwrap(), 1).is_ok());
    // Draining: new calls are refused, calls under way are still answered.
    e.drain();
    let third = call(1, 2);
    assert_eq!(enter(&e, &b, &Packet::new_checked(&third[..]).unwrap(), 1).unwrap_err().status, Status::Busy);
    assert!(enter(&e, &b, &p, 1).is_ok(), "a duplicate of an earlier call gets its answer");
}

#[test]
fn a_freed_worker_goes_to_the_binding_that_waited_first() {
    let now = Instant::now();
    let (e, a) = endpoint(now);
    let (b, _) = e.grant(2, 78, (), TOKEN, terms(HEADER_LEN + 100), now).unwrap();
    let call = |binding: u32, slot, seq| packet(Kind::Call, binding, TOKEN, 9, slot, seq);
    let start = |bytes: &[u8], binding: &Binding<u8, ()>, from| {
        let p = Packet::new_checked(bytes).unwrap();
        enter(&e, binding, &p, from).map(|mut cell| {
            assert_eq!(cell.on_call(binding, &p, now, &e.config().timing), CallAction::Execute);
        })
    };
    // A's call takes the one worker; B's is refused and B waits.
    start(&call(a.id, 0, 1), &a, 1).unwrap();
    e.run_started(&a);
    assert_eq!(start(&call(b.id, 0, 1), &b, 2).unwrap_err().status, Status::Busy);
    e.run_finished(&a);
    // The worker is free, but A (whose threads ask again at once) does not get it before B.
    assert_eq!(start(&call(a.id, 1, 1), &a, 1).unwrap_err().status, Status::Busy, "B waited first");
    start(&call(b.id, 0, 1), &b, 2).expect("B's retry takes the worker");
    e.run_started(&a);
    e.run_finished(&a);
    // Then A, which waited next.
    start(&call(a.id, 1, 1), &a, 1).expect("A's turn");
    e.run_started(&a);
    e.run_finished(&a);
    // No one waits: first come, first served again.
    start(&call(b.id, 1, 1), &b, 2).unwrap();
    // A binding that stops asking leaves the queue after twice the longest backoff.
    e.run_started(&a);
    assert_eq!(start(&call(a.id, 0, 2), &a, 1).unwrap_err().status, Status::Busy);
    e.run_finished(&a);
    let later = now + 3 * e.config().timing.retransmit_max;
    let p = call(b.id, 1, 2);
    let p = Packet::new_checked(&p[..]).unwrap();
    assert!(e.enter(&b, &p, 2, later).is_ok(), "A gave up: B is not held back");
}

#[test]
fn duplicate_bind_requests_get_the_same_binding_and_the_table_is_bounded() {
    let now = Instant::now();
    let (e, b) = endpoint(now);
    let (again, new) = e.grant(1, 77, (), 5, terms(HEADER_LEN + 100), now).unwrap();
    assert!(!new && Arc::ptr_eq(&again, &b), "same sender and nonce: the same binding");
    let (other, new) = e.grant(2, 77, (), 6, terms(HEADER_LEN + 100), now).unwrap();
    assert!(new && other.id != b.id);
    assert!(e.grant(3, 1, (), 7, terms(HEADER_LEN + 100), now).is_none(), "max_bindings is 2");
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
    assert!(e.grant(1, 77, (), TOKEN, terms(HEADER_LEN + 100), later).unwrap().1, "its request is forgotten too");
}

/// A worker's packets through its hold skip the binding's activity while a write would change
/// nothing, and write it when the table's route would: the binding's last activity is the same
/// after each packet whether it was routed through a hold or not, on two workers at once too.
#[test]
fn packets_through_a_hold_write_a_bindings_last_activity_when_the_tables_route_would() {
    let now = Instant::now();
    let ms = |n: u64| now + Duration::from_millis(n);
    let (held_e, held_b) = endpoint(now);
    let (table_e, table_b) = endpoint(now);
    let (mut a, mut b) = (Held::default(), Held::default());
    // Worker `a` alone, then `b` beside it, then `a` after `b` wrote: each packet's time, and the
    // worker that routes it.
    let packets =
        [(0, 0), (30, 0), (99, 0), (100, 0), (150, 0), (199, 0), (210, 1), (260, 0), (305, 0), (312, 0), (330, 1)];
    for (seq, &(at, worker)) in packets.iter().enumerate() {
        let p = packet(Kind::Call, held_b.id, TOKEN, 9, 0, seq as u32 + 1);
        let p = Packet::new_checked(&p[..]).unwrap();
        let held = if worker == 0 { &mut a } else { &mut b };
        let Route::Binding(r) = held_e.route_held(held, &p, None, ms(at)) else { panic!() };
        held.keep(r);
        let Route::Binding(_) = table_e.route(&p, ms(at)) else { panic!() };
        assert_eq!(
            held_b.last_active.load(Ordering::Relaxed),
            table_b.last_active.load(Ordering::Relaxed),
            "after the packet at {at} ms (worker {worker})"
        );
    }
    // Written at 100, 210 (by `b`) and 312 ms (by `a`, which at 260 learned of `b`'s write): each
    // 100 ms or more after the last write.
    assert_eq!(held_b.last_active.load(Ordering::Relaxed), 312_000_000);
}

#[test]
fn a_held_binding_routes_as_the_table_does_and_is_let_go_of_when_it_would_expire() {
    let now = Instant::now();
    let (e, b) = endpoint(now);
    let other = e.grant(2, 78, (), TOKEN + 1, terms(HEADER_LEN + 100), now).unwrap().0;
    let mut held = Held::default();
    let route = |held: &mut Held<u8, ()>, bytes: &[u8], at: Instant| {
        e.route_held(held, &Packet::new_checked(bytes).unwrap(), None, at)
    };
    // The first packet takes the binding from the table; the worker keeps it.
    let Route::Binding(r) = route(&mut held, &packet(Kind::Call, b.id, TOKEN, 9, 0, 1), now) else { panic!() };
    assert!(Arc::ptr_eq(&r, &b));
    held.keep(r);
    assert_eq!(Arc::strong_count(&b), 3, "the table, the test and the hold");
    // While held, every decision is the table's: a wrong token, another incarnation, a sealed
    // packet for a plain binding, kinds a client never sends.
    let Route::Reject(h) = route(&mut held, &packet(Kind::Call, b.id, TOKEN + 1, 9, 0, 2), now) else { panic!() };
    assert_eq!(h.status, Status::UnknownBinding, "the token is checked against the held binding too");
    assert!(held.binding.is_none(), "a packet not of the held binding lets it go");
    let Route::Binding(r) = route(&mut held, &packet(Kind::Call, b.id, TOKEN, 9, 0, 2), now) else { panic!() };
    held.keep(r);
    let Route::Reject(h) = route(&mut held, &packet(Kind::Call, b.id, TOKEN, 8, 0, 3), now) else { panic!() };
    assert_eq!(h.status, Status::WrongIncarnation);
    let Route::Binding(r) = route(&mut held, &packet(Kind::Probe, b.id, TOKEN, 9, 0, 3), now) else { panic!() };
    held.keep(r);
    let p = packet(Kind::Call, b.id, TOKEN, 9, 0, 4);
    assert!(matches!(
        e.route_held(&mut held, &Packet::new_checked(&p[..]).unwrap(), Some(b.id), now),
        Route::Malformed
    ));
    assert!(matches!(route(&mut held, &packet(Kind::Result, b.id, TOKEN, 9, 0, 4), now), Route::Malformed));
    assert!(matches!(route(&mut held, &packet(Kind::Bind, 0, 0, 0, 0, 0), now), Route::Bind));
    // Another binding's packet: routed to that one, which is held from then on.
    let Route::Binding(r) = route(&mut held, &packet(Kind::Call, other.id, TOKEN + 1, 9, 0, 1), now) else { panic!() };
    assert!(Arc::ptr_eq(&r, &other));
    held.keep(r);
    assert_eq!(Arc::strong_count(&b), 2, "the first binding was let go");
    // Routed through the hold, a packet touches its binding as one routed through the table.
    let later = now + Duration::from_secs(11);
    drop((b, other));
    let Route::Binding(r) = route(&mut held, &packet(Kind::Call, 2, TOKEN + 1, 9, 0, 2), later) else { panic!() };
    held.keep(r);
    assert_eq!(e.expire(later), 1, "the binding idle and unheld expires");
    // The one held: not while held; the endpoint asks its workers to let go, and the next packet
    // of the holder does (to the same binding: taken from the table again).
    let idle = later + Duration::from_secs(11);
    assert_eq!(e.expire(idle), 0, "held by a worker");
    let Route::Binding(r) = route(&mut held, &packet(Kind::Call, 2, TOKEN + 1, 9, 0, 3), idle) else { panic!() };
    assert_eq!(Arc::strong_count(&r), 2, "taken from the table afresh, the held one let go");
    drop(r);
    assert_eq!(e.expire(idle + Duration::from_secs(11)), 1);
    // A worker about to wait lets go itself.
    let b = e.grant(3, 79, (), TOKEN, terms(HEADER_LEN + 100), now).unwrap().0;
    let id = b.id;
    drop(b);
    let at = idle + Duration::from_secs(12);
    let Route::Binding(r) = route(&mut held, &packet(Kind::Call, id, TOKEN, 9, 0, 1), at) else { panic!() };
    held.keep(r);
    held.let_go();
    assert_eq!(e.expire(at + Duration::from_secs(11)), 1);
    assert!(e.is_empty());
}

mod messages;

#[test]
fn a_secure_binding_takes_only_packets_opened_with_its_own_keys_and_a_plain_one_only_plain() {
    let now = Instant::now();
    let e: ServerEndpoint<u8, ()> = ServerEndpoint::new(config(), now, Box::new(crate::bind::InsecureChallenges));
    let address = "127.0.0.1:9".parse().unwrap();
    let key = Caller::Key { address, key: [3; 32] };
    let secure = e.grant_from(1, key, 1, (), TOKEN, terms(HEADER_LEN + 100), now).unwrap().0;
    let plain = e.grant_from(2, Caller::Address(address), 2, (), TOKEN, terms(HEADER_LEN + 100), now).unwrap().0;
    let routed = |bytes: &[u8], opened: Option<u32>| {
        let p = Packet::new_checked(bytes).unwrap();
        match e.route_opened(&p, opened, now) {
            Route::Binding(b) => Some(b.id),
            Route::Malformed => None,
            Route::Bind => Some(0),
            Route::Reject(_) => Some(u32::MAX),
        }
    };
    let to_secure = packet(Kind::Call, secure.id, TOKEN, 9, 0, 1);
    let to_plain = packet(Kind::Call, plain.id, TOKEN, 9, 0, 1);
    assert_eq!(routed(&to_secure, Some(secure.id)), Some(secure.id));
    assert_eq!(routed(&to_secure, None), None, "a secure binding's token alone reaches nothing");
    assert_eq!(routed(&to_secure, Some(plain.id)), None, "opened with another binding's keys");
    assert_eq!(routed(&to_plain, None), Some(plain.id));
    assert_eq!(routed(&to_plain, Some(plain.id)), None, "a plain binding takes nothing sealed");
    let bind = packet(Kind::Bind, 0, 0, 0, 0, 0);
    assert_eq!(routed(&bind, None), Some(0));
    assert_eq!(routed(&packet(Kind::Bind, secure.id, 0, 0, 0, 0), Some(secure.id)), None, "no bind on a binding");
}
