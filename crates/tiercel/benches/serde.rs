//! The cost of `tiercel::Serde<T>` against a native `Wire` type: the same order (an id, a
//! customer's name, 20 line items, an optional note), marshaled into a reused buffer and
//! unmarshaled, once with `#[derive(Wire)]` and once with `#[derive(Serialize, Deserialize)]`
//! wrapped in `Serde`. `cargo bench -p tiercel --features serde --bench serde`.

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use tiercel::wire::{from_slice, to_vec, Segments, Serde, Writer};
use tiercel::Wire;

#[derive(Wire, serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq)]
pub struct Item {
    sku: u32,
    quantity: u16,
}

#[derive(Wire, serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq)]
pub struct Order {
    id: u64,
    customer: String,
    items: Vec<Item>,
    note: Option<String>,
}

fn order() -> Order {
    Order {
        id: 1_234_567,
        customer: "Ada Lovelace".into(),
        items: (0..20).map(|i| Item { sku: 1000 + i, quantity: (i % 3 + 1) as u16 }).collect(),
        note: Some("leave at the door".into()),
    }
}

fn one<T: for<'de> Wire<'de>>(c: &mut Criterion, name: &str, value: T) {
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
    let bytes = to_vec(&value);
    println!("{name}: {} bytes on the wire", bytes.len());
    c.bench_function(&format!("unmarshal {name}"), |b| {
        b.iter(|| black_box(from_slice::<T>(black_box(&bytes)).unwrap()))
    });
}

fn serde_against_wire(c: &mut Criterion) {
    one(c, "order, native Wire", order());
    one(c, "order, Serde<T>", Serde(order()));
}

criterion_group!(benches, serde_against_wire);
criterion_main!(benches);
