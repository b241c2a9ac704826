//! What tracing costs a call: Null with tiercel's `tracing` feature compiled in (as in this binary),
//! with no subscriber (one load of tracing's global level, no context on the wire) against a
//! subscriber on both sides that formats every `tiercel.call` and `tiercel.serve` span and throws
//! the text away, on the same CPUs: the calls without a subscriber first (once a subscriber exists,
//! tracing's global level is raised for the whole process, and each call then also looks at its
//! thread's subscriber). (Without the feature the spans are not compiled at all: a build of its
//! own, measured apart.)

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

/// The rows of `media`: servers pinned to `server_cpu`, this thread the caller.
pub fn rows(media: &[Medium], server_cpu: usize, calls: u32) -> crate::Result<Vec<Row>> {
    let (_quiet_server, quiet_addr) = serve_pinned_with(server_cpu, true, &[])?;
    let (_traced_server, traced_addr) = serve_pinned_with(server_cpu, true, &["--trace", "nowhere"])?;
    let client = |medium: Medium, addr: &str| -> crate::Result<TestClient> {
        let scheme = medium.scheme();
        crate::harness::import(format!("{scheme}{addr}"), tiercel::ClientConfig::default())
    };
    let timed = |client: &TestClient, n: u32| -> Result<Summary, tiercel::CallError> {
        let mut s = Summary::new();
        for _ in 0..n {
            let start = Instant::now();
            client.null()?;
            s.record(start.elapsed());
        }
        Ok(s)
    };
    // Every call without a subscriber first: a subscriber, once made, raises tracing's global
    // level for the whole process, and every call then looks further.
    // Each server (its UDP worker, each shared-memory binding's thread) spins 2 ms past its last
    // call: a pause before each row, so that none spins on the shared server CPU while another is
    // measured.
    let pause = || std::thread::sleep(std::time::Duration::from_millis(5));
    let mut quiet = Vec::new();
    for &medium in media {
        pause();
        let c = client(medium, &quiet_addr)?;
        timed(&c, 2_000)?;
        quiet.push(timed(&c, calls)?);
    }
    let subscriber = tracing::Dispatch::new(subscriber());
    let mut rows = Vec::new();
    for (&medium, q) in media.iter().zip(quiet) {
        pause();
        let c = client(medium, &traced_addr)?;
        let t = tracing::dispatcher::with_default(&subscriber, || {
            timed(&c, 2_000)?;
            timed(&c, calls)
        })?;
        rows.push(Row {
            transport: medium.name(),
            quiet_median_us: q.median_us(),
            quiet_p99_us: q.p99_us(),
            traced_median_us: t.median_us(),
            traced_p99_us: t.p99_us(),
        });
    }
    Ok(rows)
}

/// Prints the rows.
pub fn print(rows: &[Row], calls: u32) {
    outln!(
        "\nTracing: Null with the `tracing` feature compiled in, no subscriber against a subscriber on both sides \
         that"
    );
    outln!(
        "formats every span and discards the text; {calls} calls each, the calls without a subscriber first, \
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
