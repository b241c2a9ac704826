//! Multi-packet messages: their memory charged as fragments arrive, windows, stalled calls,
//! address proofs, duplicates, cancels, and fragments received into place.

use super::*;

#[test]
fn multi_packet_messages_are_charged_to_the_binding_budget() {
    let now = Instant::now();
    let (e, b) = endpoint(now);
    let timing = e.config().timing;
    // A call larger than the message limit is refused at once as too large (it never runs).
    let len = timing.max_message as u32 + 1;
    let count = crate::fragment::fragment_count(len as usize, 100).unwrap();
    let huge = fragment(b.id, 1, 0, count, len, &[0; 100]);
    let p = Packet::new_checked(&huge[..]).unwrap();
    let mut cell = enter(&e, &b, &p, 1).unwrap();
    assert_eq!(cell.on_call(&b, &p, now, &timing), CallAction::Refuse(Status::TooLarge));
    assert_eq!(b.memory(), 0);
    cell.refuse(&b, &p, Status::TooLarge, &timing);
    let Some(Fragment::Whole(bytes)) = cell.poll_transmit(&b) else { panic!() };
    assert_eq!(Packet::new_checked(bytes).unwrap().status(), Status::TooLarge);
    assert!(cell.poll_transmit(&b).is_none());
    // A 300-byte call is charged while it is reassembled, and given back once it runs.
    let parts: Vec<Vec<u8>> = (0..3).map(|i| fragment(b.id, 2, i, 3, 300, &[i as u8; 100])).collect();
    let p = Packet::new_checked(&parts[1][..]).unwrap();
    cell.on_call(&b, &p, now, &timing);
    assert_eq!(b.memory(), 200, "fragment 1 first: the buffer reaches it, and no further");
    let p = Packet::new_checked(&parts[0][..]).unwrap();
    assert!(matches!(cell.on_call(&b, &p, now, &timing), CallAction::Drop(_) | CallAction::Ack(_)));
    assert_eq!(b.memory(), 200);
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

/// Sends fragments `indexes` of call `seq` (of `count` 100-byte fragments) on `slot` of `b`, from
/// `from`; the actions.
#[allow(clippy::too_many_arguments)]
fn send_fragments(
    e: &ServerEndpoint<u8, ()>,
    b: &Binding<u8, ()>,
    from: u8,
    slot: u32,
    seq: u32,
    count: u16,
    indexes: impl IntoIterator<Item = u16>,
    now: Instant,
) -> Vec<CallAction> {
    let len = u32::from(count) * 100;
    indexes
        .into_iter()
        .map(|i| {
            let h = Header {
                binding: b.id,
                token: TOKEN,
                incarnation: 9,
                slot,
                seq,
                frag_index: i,
                frag_count: count,
                payload_len: 100,
                message_len: len,
                ..Header::new(Kind::Call)
            };
            let bytes = [&h.to_bytes()[..], &[i as u8; 100]].concat();
            let p = Packet::new_checked(&bytes[..]).unwrap();
            let mut cell = enter(e, b, &p, from).unwrap();
            cell.on_call(b, &p, now, &e.config().timing)
        })
        .collect()
}

fn quiet(a: &CallAction) -> bool {
    matches!(a, CallAction::Drop(_) | CallAction::Ack(_))
}

#[test]
fn a_call_is_charged_for_the_fragments_that_came_not_for_what_it_claims() {
    let now = Instant::now();
    let (e, b) = endpoint(now);
    assert_eq!(b.memory_most(), 1000);
    // A first fragment that claims 1,000 bytes holds 100.
    assert!(send_fragments(&e, &b, 1, 0, 1, 10, [0], now).iter().all(quiet));
    assert_eq!((b.memory(), e.memory()), (100, 100));
    // The buffer reaches the furthest fragment that came.
    assert!(send_fragments(&e, &b, 1, 0, 1, 10, [8], now).iter().all(quiet));
    assert_eq!(b.memory(), 900);
    // Another slot's call of two fragments: its first fits, its second would pass the binding's
    // 1,000 bytes: that call is given up and refused as busy, its memory returned.
    assert!(send_fragments(&e, &b, 1, 1, 1, 2, [0], now).iter().all(quiet));
    assert_eq!(b.memory(), 1000);
    assert_eq!(send_fragments(&e, &b, 1, 1, 1, 2, [1], now), vec![CallAction::Busy]);
    assert_eq!((b.memory(), e.memory()), (900, 900));
    // The client's new attempt of the same call is a new call again.
    assert!(send_fragments(&e, &b, 1, 1, 1, 2, [0], now).iter().all(quiet));
    assert_eq!(b.memory(), 1000);
}

#[test]
fn a_call_longer_than_its_binding_could_ever_hold_is_refused_too_large_at_once() {
    let now = Instant::now();
    let (e, b) = endpoint(now);
    let timing = e.config().timing;
    // 1,100 bytes claimed, more than the binding's 1,000 (though within the message limit):
    // refused from its first fragment, which is not kept; the refusal is its result.
    let first = fragment(b.id, 1, 0, 11, 1100, &[0; 100]);
    let p = Packet::new_checked(&first[..]).unwrap();
    let mut cell = enter(&e, &b, &p, 1).unwrap();
    assert_eq!(cell.on_call(&b, &p, now, &timing), CallAction::Refuse(Status::TooLarge));
    assert_eq!(b.memory(), 0);
    cell.refuse(&b, &p, Status::TooLarge, &timing);
    let Some(Fragment::Whole(bytes)) = cell.poll_transmit(&b) else { panic!() };
    assert_eq!(Packet::new_checked(bytes).unwrap().status(), Status::TooLarge);
    // Its later fragments are not taken.
    let later = fragment(b.id, 1, 5, 11, 1100, &[5; 100]);
    let p = Packet::new_checked(&later[..]).unwrap();
    assert!(!matches!(cell.on_call(&b, &p, now, &timing), CallAction::Ack(_) | CallAction::ExecuteMessage(_)));
    // 1,000 bytes fit.
    let next = fragment(b.id, 2, 0, 10, 1000, &[0; 100]);
    let p = Packet::new_checked(&next[..]).unwrap();
    assert!(quiet(&cell.on_call(&b, &p, now, &timing)));
}

#[test]
fn fragments_beyond_the_window_are_dropped_without_being_charged() {
    let now = Instant::now();
    // A message long enough to reach past the window.
    let config = EndpointConfig {
        binding_memory: 40_000,
        memory: 40_000,
        carrier_memory: 40_000,
        timing: Timing { max_message: 30_000, ..Timing::default() },
        ..config()
    };
    let e = ServerEndpoint::new(config, now, Box::new(crate::bind::InsecureChallenges));
    let b = e.grant(1, 77, (), TOKEN, terms(HEADER_LEN + 100), now).unwrap().0;
    let actions = send_fragments(&e, &b, 1, 1, 1, 300, [0, crate::fragment::MAX_WINDOW + 2], now);
    assert!(quiet(&actions[0]));
    assert_eq!(actions[1], CallAction::Drop(crate::server::DropReason::Malformed));
    assert_eq!(b.memory(), 100);
}

#[test]
fn a_binding_windows_only_as_wide_as_its_client_accepts() {
    use crate::bind::wire::features::{ALL, WIDE_WINDOW};
    let now = Instant::now();
    let e = ServerEndpoint::new(config(), now, Box::new(crate::bind::InsecureChallenges));
    let wide = e.grant(1, 1, (), TOKEN, Terms { max_datagram: 1472, features: ALL }, now).unwrap().0;
    let narrow = Terms { max_datagram: 1472, features: ALL & !WIDE_WINDOW };
    let narrow = e.grant(2, 2, (), TOKEN, narrow, now).unwrap().0;
    assert_eq!((wide.window(), narrow.window()), (crate::fragment::MAX_WINDOW, crate::fragment::NARROW_WINDOW));
    // Loopback's datagrams: the configured window, whatever the client accepts.
    let e = ServerEndpoint::new(config(), now, Box::new(crate::bind::InsecureChallenges));
    let large = e.grant(1, 1, (), TOKEN, Terms { max_datagram: 65_507, features: ALL & !WIDE_WINDOW }, now).unwrap().0;
    assert_eq!(large.window(), config().timing.window);
}

#[test]
fn no_combination_of_bindings_passes_the_server_budget() {
    let now = Instant::now();
    let (e, b) = endpoint(now);
    let (c, _) = e.grant(2, 1, (), TOKEN, terms(HEADER_LEN + 100), now).unwrap();
    assert!(send_fragments(&e, &b, 1, 0, 1, 10, 0..9, now).iter().all(quiet));
    assert!(send_fragments(&e, &c, 2, 0, 1, 10, 0..6, now).iter().all(quiet));
    assert_eq!((b.memory(), c.memory(), e.memory()), (900, 600, 1500));
    // `c` has 400 bytes of its own budget left, the server none.
    assert_eq!(send_fragments(&e, &c, 2, 0, 1, 10, [6], now), vec![CallAction::Busy]);
    assert_eq!((c.memory(), e.memory()), (0, 900));
}

#[test]
fn a_stalled_call_is_reclaimed_and_its_client_told_to_start_again() {
    let now = Instant::now();
    let (e, b) = endpoint(now);
    assert!(send_fragments(&e, &b, 1, 0, 1, 10, 0..3, now).iter().all(quiet));
    assert_eq!(e.reclaim(now + Duration::from_secs(1)), 0, "not stalled long enough");
    assert_eq!(e.memory(), 300);
    let later = now + Duration::from_secs(2);
    assert_eq!(e.reclaim(later), 1);
    assert_eq!((b.memory(), e.memory()), (0, 0));
    // Its later fragments are refused as busy (the client backs off and starts again)...
    assert_eq!(send_fragments(&e, &b, 1, 0, 1, 10, [3], later), vec![CallAction::Busy]);
    // ... and its first fragment starts it again.
    assert!(send_fragments(&e, &b, 1, 0, 1, 10, [0, 1], later).iter().all(quiet));
    assert_eq!(b.memory(), 200);
}

#[test]
fn an_address_is_answered_only_after_it_proves_it_receives() {
    let now = Instant::now();
    let (e, b) = endpoint(now);
    let bytes = packet(Kind::Call, b.id, TOKEN, 9, 0, 1);
    let p = Packet::new_checked(&bytes[..]).unwrap();
    assert!(matches!(e.route(&p, now), Route::Binding(_)), "the token is right");
    // A first packet from an address: a challenge, no larger than the packet plus 16 bytes.
    let Err(Refusal::Challenge(h, c)) = e.enter(&b, &p, 1, now) else { panic!("challenged") };
    assert_eq!((h.kind, h.status, h.payload_len as usize), (Kind::Reject, Status::AddressUnproven, c.len()));
    // A wrong echo, or the right one from another address, proves nothing.
    assert!(matches!(
        e.enter(&b, &Packet::new_checked(&proof(&b, 0, [0; 16])[..]).unwrap(), 1, now),
        Err(Refusal::Challenge(..))
    ));
    assert!(matches!(
        e.enter(&b, &Packet::new_checked(&proof(&b, 0, c)[..]).unwrap(), 2, now),
        Err(Refusal::Challenge(..))
    ));
    // The echo from the address it was sent to: the slot's peer from now on.
    let cell = e.enter(&b, &Packet::new_checked(&proof(&b, 0, c)[..]).unwrap(), 1, now).unwrap();
    assert_eq!(cell.peer, Some(1));
    drop(cell);
    assert!(e.enter(&b, &p, 1, now).is_ok());
    // Another address with the right token (a spoofed source) is challenged, and the peer stays.
    assert!(matches!(e.enter(&b, &p, 2, now), Err(Refusal::Challenge(..))));
    assert_eq!(b.slot(0).unwrap().peer, Some(1));
    // The proof is per slot.
    let other = packet(Kind::Call, b.id, TOKEN, 9, 1, 1);
    assert!(matches!(e.enter(&b, &Packet::new_checked(&other[..]).unwrap(), 1, now), Err(Refusal::Challenge(..))));
}

#[test]
fn a_duplicate_or_probe_draws_one_result_fragment_not_the_window() {
    let now = Instant::now();
    let (e, b) = endpoint(now);
    let timing = e.config().timing;
    let bytes = packet(Kind::Call, b.id, TOKEN, 9, 0, 1);
    let p = Packet::new_checked(&bytes[..]).unwrap();
    let mut cell = enter(&e, &b, &p, 1).unwrap();
    assert_eq!(cell.on_call(&b, &p, now, &timing), CallAction::Execute);
    let mut out = cell.take_result(&b);
    out.resize(HEADER_LEN + 500, 7);
    cell.complete(&b, &p, Status::Ok, out, &timing);
    let mut first = 0;
    while cell.poll_transmit(&b).is_some() {
        first += 1;
    }
    assert_eq!(first, 5, "the whole result goes once");
    assert_eq!(cell.proto.take_resent(), 0, "sent for the first time: nothing resent");
    assert_eq!(cell.on_call(&b, &p, now, &timing), CallAction::ResendResult);
    cell.resend_result();
    assert!(matches!(cell.poll_transmit(&b), Some(Fragment::Parts(..))), "one fragment");
    assert!(cell.poll_transmit(&b).is_none(), "and only one");
    assert_eq!(cell.proto.take_resent(), 1, "counted as resent");
    assert_eq!(cell.proto.on_probe(1, now), crate::server::ProbeAction::ResendResult);
    cell.resend_result();
    assert!(cell.poll_transmit(&b).is_some());
    assert!(cell.poll_transmit(&b).is_none(), "a probe draws one too");
    assert_eq!(cell.proto.take_resent(), 1);
    // An acknowledgement of the first two fragments lets no new one go (all five went), and one
    // asking for the rest again resends the three it lacks.
    let info = crate::fragment::AckInfo { prefix: 2, mask: 0 }.to_bytes();
    let h = Header {
        binding: b.id,
        token: TOKEN,
        incarnation: 9,
        seq: 1,
        flags: crate::wire::flags::RESEND,
        payload_len: info.len() as u32,
        message_len: info.len() as u32,
        ..Header::new(Kind::Ack)
    };
    let ack = [&h.to_bytes()[..], &info].concat();
    let a = Packet::new_checked(&ack[..]).unwrap();
    assert!(cell.on_result_ack(&b, &a, now).is_none());
    let mut again = 0;
    while cell.poll_transmit(&b).is_some() {
        again += 1;
    }
    assert_eq!((again, cell.proto.take_resent()), (3, 3), "the unacknowledged three, each counted once");
}

#[test]
fn a_cancel_frees_a_partial_call_or_a_saved_result_and_a_running_slot_answers_busy() {
    let now = Instant::now();
    let (e, b) = endpoint(now);
    let timing = e.config().timing;
    let cancel = |seq: u32| {
        let bytes = packet(Kind::Cancel, b.id, TOKEN, 9, 0, seq);
        let p = Packet::new_checked(&bytes[..]).unwrap();
        assert!(matches!(route(&e, &bytes, now), Route::Binding(_)), "a cancel goes to its binding");
        enter(&e, &b, &p, 1).unwrap().on_cancel(&b, &p, now);
    };
    // A partial call: its bytes go back, and its late fragments are dropped, not reassembled anew.
    assert!(send_fragments(&e, &b, 1, 0, 1, 3, [0, 1], now).iter().all(quiet));
    assert_eq!(b.memory(), 200);
    cancel(1);
    assert_eq!(b.memory(), 0, "the cancelled call's fragments were given back");
    assert!(send_fragments(&e, &b, 1, 0, 1, 3, [2, 0], now).iter().all(quiet));
    assert_eq!(b.memory(), 0, "late fragments of a cancelled call are not reassembled");
    // A call running when its client gives it up and sends the next: the next is refused as busy
    // (its client backs off), and the cancel of the running one changes nothing.
    let one = fragment(b.id, 2, 0, 1, 1, &[1]);
    let p = Packet::new_checked(&one[..]).unwrap();
    assert_eq!(enter(&e, &b, &p, 1).unwrap().on_call(&b, &p, now, &timing), CallAction::Execute);
    cancel(2);
    let next = fragment(b.id, 3, 0, 1, 1, &[2]);
    let q = Packet::new_checked(&next[..]).unwrap();
    assert_eq!(enter(&e, &b, &q, 1).unwrap().on_call(&b, &q, now, &timing), CallAction::Busy);
    // It finishes with a 250-byte result, charged until acknowledged; a cancel drops it.
    let mut cell = enter(&e, &b, &p, 1).unwrap();
    let mut out = cell.take_result(&b);
    out.resize(HEADER_LEN + 250, 3);
    assert_eq!(cell.complete(&b, &p, Status::Ok, out, &timing), Status::Ok);
    while cell.poll_transmit(&b).is_some() {}
    drop(cell);
    assert_eq!(b.memory(), 250);
    cancel(2);
    assert_eq!(b.memory(), 0, "the cancelled call's saved result was given back");
    // The next call now runs.
    assert_eq!(enter(&e, &b, &q, 1).unwrap().on_call(&b, &q, now, &timing), CallAction::Execute);
}

#[test]
fn a_withdrawn_call_is_new_again_and_the_slot_keeps_its_last_sequence_number() {
    let now = Instant::now();
    let (e, b) = endpoint(now);
    let timing = e.config().timing;
    let first = fragment(b.id, 1, 0, 1, 1, &[1]);
    let p = Packet::new_checked(&first[..]).unwrap();
    assert_eq!(enter(&e, &b, &p, 1).unwrap().on_call(&b, &p, now, &timing), CallAction::Execute);
    let mut cell = enter(&e, &b, &p, 1).unwrap();
    let out = cell.take_result(&b);
    cell.complete(&b, &p, Status::Ok, out, &timing);
    drop(cell);
    // Call 2 was about to run, and is taken back (no room for it): its retry runs.
    let second = fragment(b.id, 2, 0, 1, 1, &[2]);
    let q = Packet::new_checked(&second[..]).unwrap();
    assert_eq!(enter(&e, &b, &q, 1).unwrap().on_call(&b, &q, now, &timing), CallAction::Execute);
    assert!(enter(&e, &b, &q, 1).unwrap().proto.withdraw(2));
    assert_eq!(enter(&e, &b, &q, 1).unwrap().proto.seq(), Some(1));
    assert_eq!(enter(&e, &b, &q, 1).unwrap().on_call(&b, &q, now, &timing), CallAction::Execute);
    // Only a running call can be taken back.
    assert!(!enter(&e, &b, &p, 1).unwrap().proto.withdraw(1));
}

#[test]
fn fragments_received_into_place_are_charged_and_checked_like_any() {
    let now = Instant::now();
    let (e, b) = endpoint(now);
    let timing = e.config().timing;
    let (slot, seq, count, len) = (1, 4, 5u16, 500u32);
    let header = |index: u16, from_seq: u32| Header {
        binding: b.id,
        token: TOKEN,
        incarnation: 9,
        slot,
        seq: from_seq,
        frag_index: index,
        frag_count: count,
        payload_len: 100,
        message_len: len,
        ..Header::new(Kind::Call)
    };
    // Nothing to land before a call is being received.
    let first = [&header(0, seq).to_bytes()[..], &[0u8; 100]].concat();
    let p = Packet::new_checked(&first[..]).unwrap();
    let mut cell = enter(&e, &b, &p, 1).unwrap();
    assert!(cell.landing(&b, seq, 2, 0).is_none());
    assert!(quiet(&cell.on_call(&b, &p, now, &timing)));
    assert_eq!(b.memory(), 100);
    assert!(cell.landing(&b, seq + 1, 2, 0).is_none(), "only the call being received");
    // Two fragments land in a row; the growth is charged before the bytes are written.
    let (index, place) = cell.landing(&b, seq, 2, 0).unwrap();
    assert_eq!((index, place.len()), (1, 200));
    place[..100].fill(1);
    place[100..].fill(2);
    assert_eq!(b.memory(), 300);
    // Only the same call from the slot's proven peer continues it.
    let h1 = header(1, seq).to_bytes();
    let p1 = Packet::new_unchecked(&h1[..]);
    p1.check_split(&[1; 100], &[]).unwrap();
    let at = cell.call_at(slot).unwrap();
    assert_eq!(at, CallAt { slot, seq, peer: 1 });
    assert!(e.continues(&b, at, &p1, 1, now));
    assert!(!e.continues(&b, at, &p1, 2, now), "another address");
    assert!(!e.continues(&b, CallAt { slot: 0, ..at }, &p1, 1, now), "another slot");
    let stale = header(1, seq - 1).to_bytes();
    assert!(!e.continues(&b, at, &Packet::new_unchecked(&stale[..]), 1, now), "another call");
    let forged = Header { token: TOKEN + 1, ..header(1, seq) }.to_bytes();
    assert!(!e.continues(&b, at, &Packet::new_unchecked(&forged[..]), 1, now), "a wrong token");
    let ack = Header { kind: Kind::Ack, ..header(1, seq) }.to_bytes();
    assert!(!e.continues(&b, at, &Packet::new_unchecked(&ack[..]), 1, now), "another kind");
    assert!(quiet(&cell.on_landed(&b, &p1, now)));
    let h2 = header(2, seq).to_bytes();
    assert!(quiet(&cell.on_landed(&b, &Packet::new_unchecked(&h2[..]), now)));
    // A lie about the message is malformed, and lands nothing.
    let (index, place) = cell.landing(&b, seq, 8, 0).unwrap();
    assert_eq!((index, place.len()), (3, 200));
    place[..100].fill(3);
    place[100..].fill(4);
    let lie = Header { message_len: 600, frag_count: 6, ..header(3, seq) }.to_bytes();
    let action = cell.on_landed(&b, &Packet::new_unchecked(&lie[..]), now);
    assert_eq!(action, CallAction::Drop(crate::server::DropReason::Malformed));
    let h3 = header(3, seq).to_bytes();
    assert!(quiet(&cell.on_landed(&b, &Packet::new_unchecked(&h3[..]), now)));
    let h4 = header(4, seq).to_bytes();
    let CallAction::ExecuteMessage(m) = cell.on_landed(&b, &Packet::new_unchecked(&h4[..]), now) else {
        panic!("the last fragment completes the call")
    };
    let expected: Vec<u8> = (0..5u8).flat_map(|i| [i; 100]).collect();
    assert_eq!(m, expected);
    assert_eq!(b.memory(), 500);
    b.release(m.len());
    assert!(cell.landing(&b, seq, 2, 0).is_none(), "the call runs");
    assert!(cell.call_at(slot).is_none());
    // A landing past the budget is refused, and charges nothing (another slot: this one runs).
    // The binding holds 200 bytes of the running call's first.
    assert!(b.reserve(200));
    let big = Header { slot: 0, message_len: 1000, frag_count: 10, ..header(0, 1) };
    let big = [&big.to_bytes()[..], &[0u8; 100]].concat();
    let p = Packet::new_checked(&big[..]).unwrap();
    drop(cell);
    let mut cell = enter(&e, &b, &p, 1).unwrap();
    assert!(quiet(&cell.on_call(&b, &p, now, &timing)));
    assert!(cell.landing(&b, 1, 9, 0).is_none(), "900 bytes more, 1,200 in all, past the binding's 1,000");
    assert_eq!(b.memory(), 300);
    assert_eq!(cell.landing(&b, 1, 7, 0).map(|(i, p)| (i, p.len())), Some((1, 700)));
    assert_eq!(b.memory(), 1000);
}

#[test]
fn a_result_left_where_its_arguments_were_goes_from_there() {
    let now = Instant::now();
    let (e, b) = endpoint(now);
    let timing = e.config().timing;
    let run = |seq: u32| {
        let call = fragment(b.id, seq, 0, 1, 1, &[1]);
        let p = Packet::new_checked(&call[..]).unwrap();
        assert_eq!(enter(&e, &b, &p, 1).unwrap().on_call(&b, &p, now, &timing), CallAction::Execute);
        call
    };
    // A 250-byte result 7 bytes into the buffer (too few for a header before it): three
    // fragments, each sent from where it lies, charged until acknowledged; a duplicate of the call
    // has the first sent again from there.
    let call = run(1);
    let p = Packet::new_checked(&call[..]).unwrap();
    let mut cell = enter(&e, &b, &p, 1).unwrap();
    drop(cell.take_result(&b));
    let result: Vec<u8> = (0..250u32).map(|i| (i * 7) as u8).collect();
    let buf = [vec![0xee; 7], result.clone()].concat();
    assert_eq!(cell.complete_in_place(&b, &p, Status::Ok, buf, 7, &timing), Status::Ok);
    assert_eq!(b.memory(), 250);
    for round in 0..2 {
        let mut sent = Vec::new();
        while let Some(f) = cell.poll_transmit(&b) {
            let Fragment::Parts(h, body) = f else { panic!("a multi-packet result goes in parts") };
            let h = Packet::new_checked([&h[..], body].concat()).unwrap().header();
            assert_eq!((h.frag_index, h.frag_count, h.message_len), (sent.len() as u16 / 100, 3, 250));
            sent.extend_from_slice(body);
        }
        let expected = if round == 0 { &result[..] } else { &result[..100] };
        assert_eq!(sent, expected, "round {round}");
        cell.resend_result();
    }
    let ack = Header {
        binding: b.id,
        token: TOKEN,
        incarnation: 9,
        seq: 1,
        payload_len: crate::fragment::ACK_PAYLOAD_LEN as u32,
        ..Header::new(Kind::Ack)
    };
    let ack = [&ack.to_bytes()[..], &AckInfo { prefix: 3, mask: 0 }.to_bytes()].concat();
    let big = cell.on_result_ack(&b, &Packet::new_checked(&ack[..]).unwrap(), now);
    assert!(big.is_some_and(|v| v.is_empty() && v.capacity() >= 257), "the buffer comes back for the next call");
    assert_eq!(b.memory(), 0);
    drop(cell);
    // A result of one datagram with too few bytes before it for its header: sent whole, copied
    // behind header space.
    let call = run(2);
    let p = Packet::new_checked(&call[..]).unwrap();
    let mut cell = enter(&e, &b, &p, 1).unwrap();
    drop(cell.take_result(&b));
    let buf = [vec![0xee; 3], vec![9; 40]].concat();
    assert_eq!(cell.complete_in_place(&b, &p, Status::Ok, buf, 3, &timing), Status::Ok);
    let Some(Fragment::Whole(bytes)) = cell.poll_transmit(&b) else { panic!("one datagram, sent whole") };
    let r = Packet::new_checked(bytes).unwrap();
    assert_eq!((r.status(), r.frag_count(), r.payload()), (Status::Ok, 1, &[9u8; 40][..]));
    assert_eq!(b.memory(), 0, "a one-datagram result is not charged");
    drop(cell);
    // One beyond the budget becomes ResultTooLarge, its message behind a header as any.
    let call = run(3);
    let p = Packet::new_checked(&call[..]).unwrap();
    let mut cell = enter(&e, &b, &p, 1).unwrap();
    drop(cell.take_result(&b));
    let buf = [vec![0; 5], vec![1; 5000]].concat();
    assert_eq!(cell.complete_in_place(&b, &p, Status::Ok, buf, 5, &timing), Status::ResultTooLarge);
    let Some(Fragment::Whole(bytes)) = cell.poll_transmit(&b) else { panic!() };
    let r = Packet::new_checked(bytes).unwrap();
    assert_eq!((r.status(), r.frag_count()), (Status::ResultTooLarge, 1));
    assert!(String::from_utf8_lossy(r.payload()).contains("5000 bytes"));
    assert_eq!(b.memory(), 0);
}
