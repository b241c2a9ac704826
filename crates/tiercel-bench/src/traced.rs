//! What tracing costs a call: Null with tiercel's `tracing` feature compiled in (as in this binary),
//! with no subscriber (one check of each span's cached interest, no context on the wire) against a
//! subscriber on both sides that formats every `tiercel.call` and `tiercel.serve` span and throws
//! the text away, in interleaved rounds on the same CPUs. (Without the feature the spans are not
//! compiled at all: a build of its own, measured apart.)

use std::time::Instant;

use crate::harness::{serve_pinned_with, Medium};
use crate::progress::outln;
use crate::seeds::TestClient;
use crate::summary::Summary;

/// A row, for `--json`.
#[derive(serde::Serialize)]
pub struct Row {
    pub transport: &'static str,
    pub quiet_median_us: f64,
    pub quiet_p99_us: f64,
    pub traced_median_us: f64,
    pub traced_p99_us: f64,
}

/// A subscriber like `tiercel serve --trace nowhere`'s, for the calling thread only.
fn subscriber() -> impl tracing::Subscriber + Send + Sync {
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .with_ansi(false)
        .with_target(false)
        .with_writer(std::io::sink)
        .finish()
}

/// The row of `medium`: servers pinned to `server_cpu`, this thread the caller.
pub fn row(medium: Medium, server_cpu: usize, calls: u32, rounds: u32) -> crate::Result<Row> {
    let scheme = if medium == Medium::Udp { "udp://" } else { "shm:" };
    let (_quiet_server, quiet_addr) = serve_pinned_with(server_cpu, true, &[])?;
    let (_traced_server, traced_addr) = serve_pinned_with(server_cpu, true, &["--trace", "nowhere"])?;
    let config = tiercel::ClientConfig::default();
    let quiet: TestClient = crate::harness::import(format!("{scheme}{quiet_addr}"), config.clone())?;
    let traced: TestClient = crate::harness::import(format!("{scheme}{traced_addr}"), config)?;
    let subscriber = tracing::Dispatch::new(subscriber());
    let (mut q, mut t) = (Summary::new(), Summary::new());
    let per_round = (calls / rounds.max(1)).max(1);
    let timed = |client: &TestClient, s: &mut Summary, n: u32| -> Result<(), tiercel::CallError> {
        for _ in 0..n {
            let start = Instant::now();
            client.null()?;
            s.record(start.elapsed());
        }
        Ok(())
    };
    let mut warm = Summary::new();
    timed(&quiet, &mut warm, 2_000)?;
    tracing::dispatcher::with_default(&subscriber, || timed(&traced, &mut warm, 2_000))?;
    for _ in 0..rounds.max(1) {
        timed(&quiet, &mut q, per_round)?;
        tracing::dispatcher::with_default(&subscriber, || timed(&traced, &mut t, per_round))?;
    }
    Ok(Row {
        transport: if medium == Medium::Udp { "udp" } else { "shm" },
        quiet_median_us: q.median_us(),
        quiet_p99_us: q.p99_us(),
        traced_median_us: t.median_us(),
        traced_p99_us: t.p99_us(),
    })
}

/// Prints the rows.
pub fn print(rows: &[Row], calls: u32, rounds: u32) {
    outln!(
        "\nTracing: Null with the `tracing` feature compiled in, no subscriber against a subscriber on both sides \
         that"
    );
    outln!(
        "formats every span and discards the text; {calls} calls each in {rounds} interleaved rounds, one-worker \
         spinning servers; µs"
    );
    outln!(
        "{:>9} | {:>10} {:>8} | {:>10} {:>8} | {:>7} {:>9}",
        "transport",
        "no sub.",
        "p99",
        "traced",
        "p99",
        "ratio",
        "p99 rat."
    );
    for r in rows {
        outln!(
            "{:>9} | {:>10.2} {:>8.2} | {:>10.2} {:>8.2} | {:>6.2}× {:>8.2}×",
            r.transport,
            r.quiet_median_us,
            r.quiet_p99_us,
            r.traced_median_us,
            r.traced_p99_us,
            r.traced_median_us / r.quiet_median_us,
            r.traced_p99_us / r.quiet_p99_us
        );
    }
}
