//! Marshaling on the fast path, one argument kind at a time (Firefly Tables II-V): integers, fixed
//! and variable arrays, strings, a derived struct; encode into a reused buffer, decode borrowing.

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use tiercel::wire::{from_slice, Segments, Writer};
use tiercel::Wire;

#[derive(Wire, Debug, Clone, PartialEq)]
pub struct Point {
    x: i32,
    y: i32,
    label: String,
}

fn bench_kind<T: for<'de> Wire<'de> + Clone>(c: &mut Criterion, name: &str, value: T) {
    let mut scratch = Vec::with_capacity(4096);
    c.bench_function(&format!("marshal {name}"), |b| {
        b.iter(|| {
            scratch.clear();
            let mut segs = Segments::new(0);
            let mut w = Writer::gathering(&mut scratch, &mut segs);
            w.encode(black_box(&value));
            black_box(segs.message_len(&scratch));
        })
    });
    let bytes = tiercel::wire::to_vec(&value);
    c.bench_function(&format!("unmarshal {name}"), |b| {
        b.iter(|| black_box(from_slice::<T>(black_box(&bytes)).unwrap()))
    });
}

fn marshal(c: &mut Criterion) {
    bench_kind(c, "1 integer", 7i32);
    bench_kind(c, "2 integers", (7i32, 8i32));
    bench_kind(c, "4 integers", (7i32, 8i32, 9i32, 10i32));
    bench_kind(c, "fixed array of 4 bytes", [1u8; 4]);
    bench_kind(c, "fixed array of 400 bytes", [1u8; 400]);
    bench_kind(c, "variable array of 1 byte", vec![1u8; 1]);
    bench_kind(c, "variable array of 1440 bytes", vec![1u8; 1440]);
    bench_kind(c, "string of 0 bytes", String::new());
    bench_kind(c, "string of 1 byte", "a".to_string());
    bench_kind(c, "string of 128 bytes", "a".repeat(128));
    bench_kind(c, "derived struct", Point { x: 1, y: 2, label: "p".into() });
    let borrowed = vec![1u8; 1440];
    c.bench_function("unmarshal borrowed &[u8] of 1440 bytes", |b| {
        let bytes = tiercel::wire::to_vec(&&borrowed[..]);
        b.iter(|| black_box(from_slice::<&[u8]>(black_box(&bytes)).unwrap().len()))
    });
}

criterion_group!(benches, marshal);
criterion_main!(benches);
