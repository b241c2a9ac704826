use super::*;
use crate::wire::Header;
use core::time::Duration;

fn packet(h: Header, payload: &[u8]) -> Vec<u8> {
    let mut b = h.to_bytes().to_vec();
    b.extend_from_slice(payload);
    b
}

fn handle(c: &mut ClientCall, h: Header, payload: &[u8], now: Instant) -> Handled {
    let bytes = packet(Header { payload_len: payload.len() as u32, message_len: payload.len() as u32, ..h }, payload);
    c.handle_packet(&Packet::new_checked(&bytes[..]).unwrap(), now)
}

fn sent(c: &mut ClientCall) -> Vec<Transmit> {
    core::iter::from_fn(|| c.poll_transmit()).collect()
}

fn fragments(ts: &[Transmit]) -> Vec<u16> {
    ts.iter()
        .map(|t| match t {
            Transmit::CallFragment { index, .. } => *index,
            other => panic!("not a call fragment: {other:?}"),
        })
        .collect()
}

/// A fresh slot's call `seq` of ten fragments: the first goes alone, asking for an
/// acknowledgement.
fn first_fragment_alone(seq: u32, now: Instant) -> ClientCall {
    let mut c = ClientCall::new(Timing::default(), 100, crate::fragment::MAX_WINDOW, now);
    c.start(seq, 1000, now, None);
    assert_eq!(sent(&mut c), [Transmit::CallFragment { index: 0, please_ack: true }]);
    c
}

#[test]
fn a_slot_the_server_has_not_answered_sends_its_first_fragment_alone() {
    let now = Instant::now();
    let mut c = first_fragment_alone(7, now);
    // The server asks the slot to prove its address: the proof, then that fragment again and
    // the rest of the window.
    let challenge = Header { seq: 7, status: Status::AddressUnproven, ..Header::new(Kind::Reject) };
    assert_eq!(handle(&mut c, challenge, &[3; 16], now), Handled::Progress);
    let ts = sent(&mut c);
    assert_eq!(ts[0], Transmit::AddressProof { challenge: [3; 16] });
    assert_eq!(fragments(&ts[1..]), (0..10).collect::<Vec<u16>>());
    // The call's result; the next call goes a whole window at once.
    assert_eq!(handle(&mut c, Header { seq: 7, ..Header::new(Kind::Result) }, &[], now), Handled::Complete);
    c.start(8, 1000, now, None);
    let ts = sent(&mut c);
    assert_eq!(fragments(&ts), (0..10).collect::<Vec<u16>>());
    assert!(ts.iter().all(|t| matches!(t, Transmit::CallFragment { please_ack: false, .. })));
}

#[test]
fn a_first_fragment_the_server_takes_opens_the_window() {
    let now = Instant::now();
    let mut c = first_fragment_alone(1, now);
    // A server that already knows the slot's address acknowledges it: the other nine go.
    let ack = AckInfo { prefix: 1, mask: 0 }.to_bytes();
    assert_eq!(handle(&mut c, Header { seq: 1, ..Header::new(Kind::Ack) }, &ack, now), Handled::Progress);
    assert_eq!(fragments(&sent(&mut c)), (1..10).collect::<Vec<u16>>());
    // A call of one packet is sent as ever.
    let mut d = ClientCall::new(Timing::default(), 100, crate::fragment::MAX_WINDOW, now);
    d.start(1, 60, now, None);
    assert_eq!(sent(&mut d), [Transmit::CallFragment { index: 0, please_ack: false }]);
}

#[test]
fn the_retransmission_timeout_follows_measured_round_trips_within_its_bounds_and_each_call_says_what_it_took() {
    let ms = Duration::from_millis;
    let us = Duration::from_micros;
    let timing = Timing { retransmit_min: ms(2), retransmit_max: ms(100), ..Timing::default() };
    let t0 = Instant::now();
    let mut c = ClientCall::new(timing, 100, crate::fragment::MAX_WINDOW, t0);
    let result = |seq| Header { seq, ..Header::new(Kind::Result) };
    // Nothing measured: the first call's timer is `retransmit_initial` away.
    c.start(1, 60, t0, None);
    assert_eq!(c.poll_timeout(), Some(t0 + timing.retransmit_initial));
    // A round trip of 10 ms: srtt 10, rttvar 5, so 10 + 4 × 5 = 30 ms.
    assert_eq!(c.took(), None);
    assert_eq!(handle(&mut c, result(1), &[], t0 + ms(10)), Handled::Complete);
    assert_eq!(c.took(), Some(ms(10)));
    let t1 = t0 + ms(50);
    c.start(2, 60, t1, None);
    assert_eq!(c.took(), None, "a new call has not taken any time yet");
    assert_eq!(c.base_rto(), ms(30));
    assert_eq!(c.poll_timeout(), Some(t1 + ms(30)));
    // Then 20 ms: rttvar (3 × 5 + |10 − 20|) / 4 = 6.25, srtt (7 × 10 + 20) / 8 = 11.25, so 36.25 ms.
    assert_eq!(handle(&mut c, result(2), &[], t1 + ms(20)), Handled::Complete);
    assert_eq!(c.base_rto(), us(36_250));
    // Round trips of 10 µs bring it down to `retransmit_min`, and never below.
    let mut t = t1 + ms(100);
    for seq in 3..200 {
        c.start(seq, 60, t, None);
        assert_eq!(handle(&mut c, result(seq), &[], t + us(10)), Handled::Complete);
        t += ms(1);
    }
    assert_eq!(c.base_rto(), ms(2));
    // A retransmitted call gives no sample (Karn): its 1 s round trip leaves the timeout as it was.
    c.start(200, 60, t, None);
    let resend = c.poll_timeout().unwrap();
    c.handle_timeout(resend);
    assert_eq!(handle(&mut c, result(200), &[], t + Duration::from_secs(1)), Handled::Complete);
    assert_eq!(c.took(), Some(Duration::from_secs(1)), "it took that long all the same");
    assert_eq!(c.base_rto(), ms(2));
    // One of 1 s does, up to `retransmit_max`.
    let t = t + ms(1100);
    c.start(201, 60, t, None);
    assert_eq!(handle(&mut c, result(201), &[], t + Duration::from_secs(1)), Handled::Complete);
    assert_eq!(c.base_rto(), ms(100));
}
