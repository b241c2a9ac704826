//! Every received datagram goes through `Packet::new_checked`; whatever it accepts must be safe to
//! read, and every control payload decoder must agree with its encoder.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercel_proto::bind::wire::{BindChallenge, BindGrant, BindRefusal, BindRequest, REQUEST_LEN};
use tiercel_proto::context::Context;
use tiercel_proto::fragment::AckInfo;
use tiercel_proto::wire::{checksum, flags, Packet, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = Packet::new_checked(data) {
        // Accessors cannot panic once checked, and the header survives a round trip.
        let header = p.header();
        let mut bytes = header.to_bytes().to_vec();
        bytes.extend_from_slice(p.payload());
        if header.flags & flags::CHECKSUM != 0 {
            let sum = checksum([&bytes[..]]);
            bytes.extend_from_slice(&sum.to_le_bytes());
        }
        let again = Packet::new_checked(&bytes[..]).expect("a re-encoded valid header must validate");
        assert_eq!(again.header(), header);
        assert_eq!(again.payload(), p.payload());
        assert!(p.payload().len() + HEADER_LEN <= data.len());
        assert!(p.frag_index() < p.frag_count());
    }
    // The control payload decoders take any bytes.
    let payload = data.get(HEADER_LEN.min(data.len())..).unwrap_or_default();
    for b in [data, payload] {
        // A call's context block: what parses survives a round trip, and the arguments are what
        // follows the block.
        if let Ok((context, args)) = Context::parse(b) {
            let mut block = [0u8; tiercel_proto::context::MAX_LEN];
            let n = context.encode(&mut block);
            assert_eq!(Context::parse(&block[..n]), Ok((context, &[][..])));
            assert!(b.ends_with(args) && args.len() < b.len());
        }
        if let Some(r) = BindRequest::parse(b) {
            // The padding after the request's fields is not read; the fields survive a round trip.
            assert_eq!(&r.to_bytes(b.len())[..REQUEST_LEN], &b[..REQUEST_LEN]);
        }
        if let Some(g) = BindGrant::parse(b) {
            assert_eq!(&g.to_bytes()[..], b);
        }
        if let Some(r) = BindRefusal::parse(b) {
            assert_eq!(&r.to_bytes(b.len())[..], b);
        }
        if let Some(a) = AckInfo::parse(b) {
            assert_eq!(&a.to_bytes()[..], b);
        }
        if let Some(c) = BindChallenge::parse(b) {
            assert_eq!(&c.to_bytes()[..], b);
        }
    }
});
