use super::*;

fn sample() -> Header {
    Header {
        kind: Kind::Result,
        flags: flags::PLEASE_ACK,
        status: Status::Panicked,
        procedure: 7,
        binding: 0xdead,
        slot: 3,
        seq: 99,
        frag_index: 2,
        frag_count: 5,
        payload_len: 4,
        message_len: 4000,
        incarnation: 0x1122_3344_5566_7788,
        token: 0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10,
    }
}

#[test]
fn emit_then_parse_round_trips() {
    let h = sample();
    let mut buf = h.to_bytes().to_vec();
    buf.extend_from_slice(&[1, 2, 3, 4]);
    let p = Packet::new_checked(&buf[..]).unwrap();
    assert_eq!(p.header(), h);
    assert_eq!(p.payload(), &[1, 2, 3, 4]);
}

#[test]
fn a_packet_received_in_two_places_checks_as_one() {
    let h = Header { flags: flags::CHECKSUM, payload_len: 4, ..sample() };
    let (head, payload) = (h.to_bytes(), [1u8, 2, 3, 4]);
    let sum = checksum([&head[..], &payload[..]]).to_le_bytes();
    let p = Packet::new_unchecked(&head[..]);
    assert_eq!(p.check_split(&payload, &sum), Ok(()));
    assert_eq!(p.check_split(&[1, 2, 3, 5], &sum), Err(WireError::BadChecksum));
    assert!(matches!(p.check_split(&payload, &sum[..3]), Err(WireError::BadLength { .. })));
    assert!(matches!(p.check_split(&payload[..3], &sum), Err(WireError::BadLength { .. })));
    let plain = Header { payload_len: 4, ..sample() }.to_bytes();
    let p = Packet::new_unchecked(&plain[..]);
    assert_eq!(p.check_split(&payload, &[]), Ok(()));
    assert!(matches!(p.check_split(&payload, &[0]), Err(WireError::BadLength { .. })));
    let mut bad = plain;
    bad[0] ^= 1;
    assert_eq!(Packet::new_unchecked(&bad[..]).check_split(&payload, &[]), Err(WireError::BadMagic));
    assert!(matches!(Packet::new_unchecked(&plain[..10]).check_split(&payload, &[]), Err(WireError::Truncated(10))));
}

#[test]
fn check_rejects_each_bad_field() {
    let h = sample();
    let good = {
        let mut b = h.to_bytes().to_vec();
        b.extend_from_slice(&[0; 4]);
        b
    };
    assert_eq!(Packet::new_checked(&good[..10]).unwrap_err(), WireError::Truncated(10));
    let mut b = good.clone();
    b[0] = b'x';
    assert_eq!(Packet::new_checked(&b[..]).unwrap_err(), WireError::BadMagic);
    let mut b = good.clone();
    b[2] = 9;
    assert_eq!(Packet::new_checked(&b[..]).unwrap_err(), WireError::BadVersion(9));
    let mut b = good.clone();
    b[3] = 0;
    assert_eq!(Packet::new_checked(&b[..]).unwrap_err(), WireError::BadKind(0));
    let mut b = good.clone();
    b[5] = 200;
    assert_eq!(Packet::new_checked(&b[..]).unwrap_err(), WireError::BadStatus(200));
    let mut b = good.clone();
    b.push(0);
    assert!(matches!(Packet::new_checked(&b[..]), Err(WireError::BadLength { .. })));
    let mut b = good.clone();
    b[20] = 5;
    assert!(matches!(Packet::new_checked(&b[..]), Err(WireError::BadFragment { .. })));
}

#[test]
fn checksum_trailer_is_verified() {
    let mut h = sample();
    h.flags = flags::CHECKSUM;
    let mut b = h.to_bytes().to_vec();
    b.extend_from_slice(&[1, 2, 3, 4]);
    let sum = checksum([&b[..]]);
    b.extend_from_slice(&sum.to_le_bytes());
    let p = Packet::new_checked(&b[..]).unwrap();
    assert_eq!(p.payload(), &[1, 2, 3, 4]);
    for i in 0..b.len() {
        let mut c = b.clone();
        c[i] ^= 0x10;
        assert!(Packet::new_checked(&c[..]).is_err(), "flipping byte {i} goes unnoticed");
    }
}

#[test]
fn setters_write_only_their_field() {
    let mut b = sample().to_bytes();
    let mut p = Packet::new_unchecked(&mut b[..]);
    p.set_seq(1234);
    p.set_procedure(2);
    p.set_fragment(0, 1);
    p.set_lengths(0, 0);
    let h = p.header();
    assert_eq!((h.seq, h.procedure, h.frag_index, h.frag_count), (1234, 2, 0, 1));
    assert_eq!(h.token, sample().token);
    assert_eq!(h.incarnation, sample().incarnation);
}
