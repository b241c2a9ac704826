use super::*;

#[test]
fn counts_and_ranges_cover_the_message() {
    assert_eq!(fragment_count(0, 100), Some(1));
    assert_eq!(fragment_count(100, 100), Some(1));
    assert_eq!(fragment_count(101, 100), Some(2));
    assert_eq!(fragment_count(100 * 70_000, 100), None);
    assert_eq!(fragment_range(1, 250, 100), 100..200);
    assert_eq!(fragment_range(2, 250, 100), 200..250);
}

#[test]
fn reassembly_out_of_order_with_duplicates() {
    let msg: Vec<u8> = (0..250u32).map(|i| i as u8).collect();
    let mut r = Reassembly::new(250, 3, 100, 1000).unwrap();
    assert_eq!(r.insert(2, 3, 250, &msg[200..]).unwrap(), Inserted::New);
    assert_eq!(r.ack(), AckInfo { prefix: 0, mask: 0b10 });
    assert_eq!(r.insert(2, 3, 250, &msg[200..]).unwrap(), Inserted::Duplicate);
    assert_eq!(r.insert(0, 3, 250, &msg[..100]).unwrap(), Inserted::New);
    assert_eq!(r.insert(1, 3, 250, &msg[100..200]).unwrap(), Inserted::Complete);
    assert_eq!(r.message(), &msg[..]);
    assert_eq!(r.ack().prefix, 3);
}

#[test]
fn a_reused_buffer_holds_only_the_new_message() {
    let old = vec![0xee; 1000];
    let msg: Vec<u8> = (0..250u32).map(|i| i as u8).collect();
    let mut r = Reassembly::reusing(old.clone(), 250, 3, 100, 1 << 20).unwrap();
    assert_eq!(r.held(), 0, "the old bytes are not charged to the new message");
    for i in [2u16, 0, 1] {
        r.insert(i, 3, 250, &msg[fragment_range(i, 250, 100)]).unwrap();
    }
    assert!(r.is_complete());
    assert_eq!(r.message(), &msg[..]);
    // The old bytes are overwritten, not zeroed first, but charged as the fragments come:
    // growth is asked of the budget past the furthest fragment, whatever the buffer held.
    let mut r = Reassembly::reusing(old, 250, 3, 100, 1 << 20).unwrap();
    let mut asked = Vec::new();
    let mut ask = |n| {
        asked.push(n);
        true
    };
    r.insert_within(0, 3, 250, &msg[..100], &mut ask).unwrap();
    assert_eq!((r.held(), r.message()), (100, &msg[..100]));
    r.insert_within(2, 3, 250, &msg[200..], &mut ask).unwrap();
    assert_eq!(r.insert_within(1, 3, 250, &msg[100..200], &mut ask), Ok(Inserted::Complete));
    assert_eq!(asked, vec![100, 150], "fragment 1 was within what fragment 2 made held");
    assert_eq!(r.into_message(), msg);
    // Growing a small buffer works too.
    let mut r = Reassembly::reusing(vec![1; 10], 250, 3, 100, 1 << 20).unwrap();
    for i in 0..3u16 {
        r.insert(i, 3, 250, &msg[fragment_range(i, 250, 100)]).unwrap();
    }
    assert_eq!(r.into_message(), msg);
}

#[test]
fn fragments_received_into_place() {
    let msg: Vec<u8> = (0..250u32).map(|i| (i * 7) as u8).collect();
    let mut r = Reassembly::new(250, 3, 100, 1000).unwrap();
    // In order: each lands where the next one goes.
    let (i, place) = r.landing_run(1, |_| true).unwrap();
    assert_eq!((i, place.len()), (0, 100));
    place.copy_from_slice(&msg[..100]);
    assert_eq!(r.insert_landed(0, 3, 250, 100), Ok(Inserted::New));
    // A datagram that was not the next fragment (here fragment 2, arriving before 1) is inserted
    // the usual way; what the landing place held is overwritten when fragment 1 comes.
    let (i, place) = r.landing_run(1, |_| true).unwrap();
    assert_eq!(i, 1);
    place.fill(0xaa);
    assert_eq!(r.insert_landed(2, 3, 250, 50), Err(ReassemblyError::Inconsistent), "not the landing's fragment");
    assert_eq!(r.insert(2, 3, 250, &msg[200..]), Ok(Inserted::New));
    assert!(r.landing_run(1, |_| true).is_none(), "only a resent fragment is awaited");
    assert_eq!(r.insert(1, 3, 250, &msg[100..200]), Ok(Inserted::Complete));
    assert_eq!(r.message(), &msg[..]);
    // Lies are refused as by insert: a wrong length, a duplicate.
    let mut r = Reassembly::new(250, 3, 100, 1000).unwrap();
    r.landing_run(1, |_| true).unwrap().1.copy_from_slice(&msg[..100]);
    assert_eq!(r.insert_landed(0, 3, 250, 99), Err(ReassemblyError::Inconsistent));
    assert_eq!(r.insert_landed(0, 3, 251, 100), Err(ReassemblyError::Inconsistent));
    assert_eq!(r.insert_landed(0, 3, 250, 100), Ok(Inserted::New));
    assert_eq!(r.insert_landed(0, 3, 250, 100), Err(ReassemblyError::Inconsistent), "landed twice");
    assert_eq!(r.insert(0, 3, 250, &msg[..100]), Ok(Inserted::Duplicate));
}

#[test]
fn a_place_is_lent_with_the_bytes_behind_it_only_where_there_are_enough() {
    let msg: Vec<u8> = (0..250u32).map(|i| (i * 3) as u8).collect();
    let mut r = Reassembly::new(250, 3, 100, 1000).unwrap();
    assert!(r.landing_run_behind(1, 56, |_| true).is_none(), "nothing lies before the first fragment");
    assert_eq!(r.insert(0, 3, 250, &msg[..100]), Ok(Inserted::New));
    let (i, place) = r.landing_run_behind(1, 56, |_| true).unwrap();
    assert_eq!((i, place.len()), (1, 156));
    assert_eq!(&place[..56], &msg[44..100], "the end of fragment 0, then fragment 1's place");
    place[56..].copy_from_slice(&msg[100..200]);
    assert_eq!(r.insert_landed(1, 3, 250, 100), Ok(Inserted::New));
    assert!(r.landing_run_behind(1, 201, |_| true).is_none(), "no more than lies before the place");
    let (i, place) = r.landing_run_behind(1, 100, |_| true).unwrap();
    assert_eq!((i, place.len()), (2, 150));
    place[100..].copy_from_slice(&msg[200..]);
    assert_eq!(r.insert_landed(2, 3, 250, 50), Ok(Inserted::Complete));
    assert_eq!(r.message(), &msg[..]);
}

#[test]
fn a_run_of_fragments_lands_in_place_within_the_budget_and_window() {
    let msg: Vec<u8> = (0..250u32).map(|i| (i * 5) as u8).collect();
    let mut r = Reassembly::new(250, 3, 100, 1000).unwrap();
    assert!(r.landing_run(2, |_| false).is_none(), "a refused reservation lands nothing");
    assert_eq!(r.held(), 0);
    let mut asked = 0;
    let (i, place) = r
        .landing_run(2, |n| {
            asked = n;
            true
        })
        .unwrap();
    assert_eq!((i, place.len(), asked), (0, 200, 200));
    place.copy_from_slice(&msg[..200]);
    assert_eq!(r.held(), 200, "what was made ready is held");
    assert_eq!(r.insert_landed(0, 3, 250, 100), Ok(Inserted::New));
    assert_eq!(r.insert_landed(1, 3, 250, 100), Ok(Inserted::New));
    // The run stops at the message's end; the budget is asked only for growth.
    let (i, place) = r.landing_run(8, |n| n == 50).unwrap();
    assert_eq!((i, place.len()), (2, 50));
    place.copy_from_slice(&msg[200..]);
    assert_eq!(r.insert_landed(2, 3, 250, 50), Ok(Inserted::Complete));
    assert_eq!(r.message(), &msg[..]);
    assert!(r.landing_run(8, |_| true).is_none(), "nothing left to land");
    // Past a hole, a run reaches no further than the window.
    let count = MAX_WINDOW + 10;
    let len = u32::from(count) * 10;
    let mut r = Reassembly::new(len, count, 10, 1 << 20).unwrap();
    r.insert(1, count, len, &[1; 10]).unwrap();
    let (i, place) = r.landing_run(u16::MAX, |_| true).unwrap();
    assert_eq!((i, place.len()), (2, (usize::from(MAX_WINDOW) - 1) * 10));
}

#[test]
fn reassembly_refuses_lies_before_allocating() {
    assert!(matches!(Reassembly::new(u32::MAX, 65535, 1400, 1 << 24), Err(ReassemblyError::TooLarge { .. })));
    assert_eq!(Reassembly::new(250, 9, 100, 1000).unwrap_err(), ReassemblyError::Inconsistent);
    let mut r = Reassembly::new(250, 3, 100, 1000).unwrap();
    assert_eq!(r.insert(0, 3, 250, &[0; 99]), Err(ReassemblyError::Inconsistent));
    assert_eq!(r.insert(0, 4, 250, &[0; 100]), Err(ReassemblyError::Inconsistent));
    assert_eq!(r.insert(0, 3, 251, &[0; 100]), Err(ReassemblyError::Inconsistent));
}

#[test]
fn reassembly_holds_what_arrived_not_what_was_claimed() {
    let mut r = Reassembly::new(1 << 20, 10_486, 100, 1 << 20).unwrap();
    assert_eq!(r.held(), 0, "nothing written before a fragment comes");
    r.insert(0, 10_486, 1 << 20, &[1; 100]).unwrap();
    assert_eq!(r.held(), 100);
    r.insert(64, 10_486, 1 << 20, &[1; 100]).unwrap();
    assert_eq!(r.held(), 6500, "up to the furthest fragment, within the window");
    assert_eq!(r.insert(MAX_WINDOW + 2, 10_486, 1 << 20, &[1; 100]), Err(ReassemblyError::OutOfWindow));
    // A refused reservation changes nothing.
    assert_eq!(r.insert_within(1, 10_486, 1 << 20, &[2; 100], |_| false), Ok(Inserted::New), "no growth");
    assert_eq!(r.insert_within(65, 10_486, 1 << 20, &[2; 100], |_| false), Err(ReassemblyError::NoMemory));
    assert_eq!((r.held(), r.ack().prefix), (6500, 2));
    let mut asked = 0;
    r.insert_within(65, 10_486, 1 << 20, &[2; 100], |n| {
        asked = n;
        true
    })
    .unwrap();
    assert_eq!((asked, r.held()), (100, 6600));
}

#[test]
fn blast_sends_window_then_only_what_is_missing() {
    let mut b = Blast::new(10, 4);
    assert_eq!(b.take_new(), 0..4);
    assert_eq!(b.take_new(), 4..4);
    assert!(b.on_ack(AckInfo { prefix: 1, mask: 0b1 })); // holds 0 and 2
    assert_eq!(b.unacked().collect::<Vec<_>>(), vec![1, 3]);
    assert_eq!(b.take_new(), 4..5);
    assert!(!b.on_ack(AckInfo { prefix: 0, mask: 0 }), "stale ack ignored");
    b.on_ack(AckInfo { prefix: 10, mask: 0 });
    assert!(b.is_acked());
}

#[test]
fn an_acknowledgement_past_a_hole_resends_the_hole_once() {
    let mut b = Blast::new(20, 8);
    assert_eq!(b.take_new(), 0..8);
    // Holds 0..2, then 3 and 5: 2 and 4 are lost (a later one arrived); 6 and 7 may be on the way.
    b.on_ack(AckInfo { prefix: 2, mask: 0b101 });
    assert_eq!(b.take_lost().collect::<Vec<_>>(), vec![2, 4]);
    assert_eq!(b.take_lost().count(), 0, "each only once");
    // 7 arrives too: 6 is now lost as well, 2 and 4 are left to the timer.
    b.on_ack(AckInfo { prefix: 2, mask: 0b1_0101 });
    assert_eq!(b.take_lost().collect::<Vec<_>>(), vec![6]);
    b.on_ack(AckInfo { prefix: 8, mask: 0 });
    assert_eq!(b.take_lost().count(), 0, "nothing missing");
}

#[test]
fn a_retransmission_lost_again_goes_again_once_a_later_fragment_arrives() {
    let mut b = Blast::new(20, 8);
    assert_eq!(b.take_new(), 0..8);
    b.on_ack(AckInfo { prefix: 2, mask: 0b10 }); // holds 0, 1, 4: 2 and 3 lost
    assert_eq!(b.take_lost().collect::<Vec<_>>(), vec![2, 3]);
    assert_eq!(b.take_new(), 8..10, "the window moved on past the holes' retransmission");
    // 3's retransmission arrived, 2's did not; fragments up to 7 arrived, sent before it: wait.
    b.on_ack(AckInfo { prefix: 2, mask: 0b1_1111 });
    assert_eq!(b.take_lost().count(), 0, "nothing sent after the retransmission has arrived yet");
    // 8 arrives, sent after the retransmission of 2: 2 was lost again.
    b.on_ack(AckInfo { prefix: 2, mask: 0b11_1111 });
    assert_eq!(b.take_lost().collect::<Vec<_>>(), vec![2]);
}

#[test]
fn the_receiver_acknowledges_at_once_past_a_hole_and_when_it_fills() {
    let mut r = Reassembly::new(10 * 100, 10, 100, 1 << 20).unwrap();
    let part = [7u8; 100];
    r.insert(0, 10, 1000, &part).unwrap();
    r.insert(1, 10, 1000, &part).unwrap();
    assert!(!r.wants_ack(32), "in order: at the usual pace");
    r.insert(3, 10, 1000, &part).unwrap();
    assert!(r.wants_ack(32), "past the hole at 2: at once");
    assert_eq!(r.take_ack(), AckInfo { prefix: 2, mask: 0b1 });
    r.insert(4, 10, 1000, &part).unwrap();
    assert!(!r.wants_ack(32), "the same hole is reported once");
    r.insert(2, 10, 1000, &part).unwrap();
    assert!(r.wants_ack(32), "the hole filled: at once");
    assert_eq!(r.take_ack().prefix, 5);
}

#[test]
fn ack_payload_round_trips() {
    let a = AckInfo { prefix: 77, mask: 0xf0f0 };
    assert_eq!(AckInfo::parse(&a.to_bytes()), Some(a));
    assert_eq!(AckInfo::parse(&[0; 3]), None);
    assert!(a.has(76) && !a.has(77) && a.has(82) && !a.has(78));
}
