//! The header on the fast path: writing the changing fields into a prebuilt template, and
//! validating a received packet once.

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use tiercel_proto::wire::{Header, Kind, Packet, HEADER_LEN};

fn header(c: &mut Criterion) {
    let template = Header { binding: 7, slot: 3, incarnation: 9, token: 0xfeed, ..Header::new(Kind::Call) }.to_bytes();
    c.bench_function("header: set seq, procedure, lengths in the template", |b| {
        let mut h = template;
        let mut seq = 0u32;
        b.iter(|| {
            seq = seq.wrapping_add(1);
            let mut p = Packet::new_unchecked(&mut h[..]);
            p.set_seq(black_box(seq));
            p.set_procedure(black_box(4));
            p.set_lengths(black_box(8), black_box(8));
            black_box(&h);
        })
    });
    let mut datagram = Header { payload_len: 8, message_len: 8, ..Header::new(Kind::Result) }.to_bytes().to_vec();
    datagram.extend_from_slice(&[1; 8]);
    c.bench_function("header: validate a received packet", |b| {
        b.iter(|| {
            let p = Packet::new_checked(black_box(&datagram[..])).unwrap();
            black_box(p.seq());
        })
    });
    c.bench_function("header: encode a whole header", |b| {
        let h = Header { seq: 5, ..Header::new(Kind::Call) };
        let mut out = [0u8; HEADER_LEN];
        b.iter(|| {
            black_box(&h).emit(&mut out);
            black_box(&out);
        })
    });
}

criterion_group!(benches, header);
criterion_main!(benches);
