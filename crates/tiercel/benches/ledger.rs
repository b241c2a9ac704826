//! The cost ledger as a criterion group: a Null call on each transport with each optional piece this
//! build has switched on in turn (`examples/ledger/lines.rs`). Build it with and without the crate
//! features to see what each costs compiled in but unused; `./ledger` at the top of the repository
//! does that in one run and prints the ledger's tables.

#[path = "../examples/ledger/lines.rs"]
mod lines;

use criterion::{criterion_group, criterion_main, Criterion};

fn ledger(c: &mut Criterion) {
    tiercel_sys::cpu::pin_current_thread(0).expect("pin to CPU 0");
    let lines = lines::Lines::new(&lines::TRANSPORTS.map(|(t, _)| t), false);
    for (transport, _) in lines::TRANSPORTS {
        let mut group = c.benchmark_group(format!("ledger/{transport}"));
        for line in lines.lines.iter().filter(|l| l.transport == transport) {
            line.begin();
            group.bench_function(line.piece.name(), |b| b.iter(|| line.call()));
            line.end();
        }
        group.finish();
    }
}

criterion_group!(benches, ledger);
criterion_main!(benches);
