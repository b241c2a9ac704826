//! The load table, after Lampson's queueing rule of thumb r = s/(1 − u): an open-loop generator with
//! Poisson arrivals offers calls of a fixed service time at fractions of the server's measured
//! capacity, and the median and p99 response times are set against the model.
//!
//! The server's CPU is the one server of the queue. Over UDP one thread runs the calls (the one
//! worker reading the socket, which no call this short makes another join); over shared memory the
//! binding's thread, and helpers that join it while calls wait behind these calls of 50 µs or more
//! (slow calls, to the binding), all pinned to the server's CPU, which they share. `work` counts
//! its thread's CPU time, so two calls side by side take twice as long and the capacity measured is
//! the CPU's (on the wall clock, with the helpers left unpinned, it was not: a 50 µs call seemed to
//! take 31 µs of service, and the rows' responses 2.7–4.1 times the model's). Arrivals
//! come from many caller threads pinned to the client CPU, each a Poisson stream of its share of the
//! rate; together they are one Poisson stream. Callers block while they wait (they
//! would otherwise take the client CPU from one another), and a response is timed from the moment
//! its caller starts the call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::seeds::TestClient;
use rand::{Rng, SeedableRng};
use tiercel::{ClientConfig, Spin};

use crate::harness::Medium;
use crate::progress::outln;
use crate::summary::Summary;

/// Utilizations offered.
pub const UTILIZATIONS: [f64; 8] = [0.1, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95];
/// Caller threads of the generator.
const CALLERS: u32 = 32;

/// A load table row, for `--json`.
#[derive(serde::Serialize)]
pub struct Row {
    pub transport: &'static str,
    pub service_us: u32,
    pub capacity_per_second: f64,
    pub offered_utilization: f64,
    pub offered_per_second: f64,
    pub achieved_per_second: f64,
    pub utilization: f64,
    pub calls: u64,
    pub unloaded_median_us: f64,
    /// The server's service time per call, 1 / capacity, µs.
    pub service_time_us: f64,
    pub median_us: f64,
    pub mean_us: f64,
    pub p99_us: f64,
    /// Lampson's r = s/(1 − u), plus the part of the unloaded response that does not queue.
    pub model_us: f64,
    /// The same for a fixed service time (M/D/1): d + s + s·u/(2(1 − u)).
    pub fixed_service_model_us: f64,
}

fn client(medium: Medium, addr: &str) -> crate::Result<TestClient> {
    let scheme = medium.scheme();
    let config = ClientConfig { spin: Spin::Never, ..ClientConfig::default() };
    crate::harness::import(format!("{scheme}{addr}"), config)
}

/// Runs `CALLERS` threads on `cpu` for `time`; each makes calls of `service_us`, at Poisson times of
/// total rate `rate` (None: back to back). Returns the responses and the calls made.
fn generate(
    client: &TestClient,
    cpu: usize,
    service_us: u32,
    rate: Option<f64>,
    time: Duration,
    seed: u64,
) -> crate::Result<(Summary, u64)> {
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let end = start + time;
    let handles: Vec<_> = (0..CALLERS)
        .map(|t| {
            let (c, done) = (client.clone(), done.clone());
            std::thread::spawn(move || -> crate::Result<Summary> {
                let _ = tiercel_sys::cpu::pin_current_thread(cpu);
                let mut rng = rand::rngs::SmallRng::seed_from_u64(seed.wrapping_mul(1000).wrapping_add(t as u64));
                let mut s = Summary::new();
                let mut next = start;
                loop {
                    if let Some(rate) = rate {
                        // Exponential gaps of mean CALLERS / rate: this thread's share of the stream.
                        let u: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
                        next += Duration::from_secs_f64(-u.ln() * CALLERS as f64 / rate);
                        let now = Instant::now();
                        if next > now {
                            std::thread::sleep(next - now);
                        }
                    }
                    let t0 = Instant::now();
                    if t0 >= end {
                        return Ok(s);
                    }
                    c.work(service_us).map_err(crate::Error::from)?;
                    s.record(t0.elapsed());
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let mut all = Summary::new();
    for h in handles {
        let s = h.join().map_err(|_| "a caller thread panicked".to_string())??;
        all.add(&s);
    }
    Ok((all, done.load(Ordering::Relaxed)))
}

/// The load table over `medium` against the spinning `tiercel serve` at `addr` (host:port, one
/// worker), `time` per row.
pub fn table(
    medium: Medium,
    addr: &str,
    client_cpu: usize,
    service_us: u32,
    time: Duration,
    mut progress: impl FnMut(),
) -> crate::Result<Vec<Row>> {
    let client = client(medium, addr)?;
    let mut unloaded = Summary::new();
    for i in 0..2_200 {
        let t = Instant::now();
        client.work(service_us).map_err(crate::Error::from)?;
        if i >= 200 {
            unloaded.record(t.elapsed());
        }
    }
    let unloaded_us = unloaded.median_us();
    let (_, n) = generate(&client, client_cpu, service_us, None, time, 0)?;
    let capacity = n as f64 / time.as_secs_f64();
    // The server's service time: how long it is busy per call at capacity. The rest of an unloaded
    // call (client, kernel, wakeups) does not queue.
    let s = 1e6 / capacity.max(1.0);
    let d = (unloaded_us - s).max(0.0);
    progress();
    let transport = medium.name();
    let mut rows = Vec::new();
    for (i, u) in UTILIZATIONS.into_iter().enumerate() {
        let rate = u * capacity;
        let (r, n) = generate(&client, client_cpu, service_us, Some(rate), time, i as u64 + 1)?;
        let achieved = n as f64 / time.as_secs_f64();
        let utilization = achieved / capacity;
        let busy = utilization.min(0.999);
        rows.push(Row {
            transport,
            service_us,
            capacity_per_second: capacity,
            offered_utilization: u,
            offered_per_second: rate,
            achieved_per_second: achieved,
            utilization,
            calls: r.len(),
            unloaded_median_us: unloaded_us,
            service_time_us: s,
            median_us: r.median_us(),
            mean_us: r.mean_us(),
            p99_us: r.p99_us(),
            model_us: d + s / (1.0 - busy),
            fixed_service_model_us: d + s + s * busy / (2.0 * (1.0 - busy)),
        });
        progress();
    }
    outln!(
        "\nLoad (Lampson's r = s/(1 − u)) over {}: open-loop Poisson arrivals from {CALLERS} caller threads on CPU \
         {client_cpu}",
        if medium == Medium::Udp { "UDP loopback" } else { "shared memory" }
    );
    outln!(
        "(callers block while waiting), calls of {service_us} µs of CPU work run on the server CPU (by one thread over \
         UDP; over"
    );
    outln!(
        "shared memory helpers join the binding's thread while calls wait), spinning 2 ms past each call, then \
         blocking; capacity {capacity:.0} calls/s"
    );
    outln!(
        "(closed loop, {CALLERS} callers), so the server's service time s = 1/capacity = {s:.1} µs; unloaded median \
         response {unloaded_us:.1} µs,"
    );
    outln!(
        "of which d = {d:.1} µs does not queue; model r = d + s/(1 − u) (Lampson), and d + s + s·u/(2(1 − u)) for a \
         fixed service time"
    );
    outln!("(M/D/1); {:.1} s per row; µs (the models give the mean response)", time.as_secs_f64());
    outln!(
        "{:>8} {:>10} {:>10} {:>6} | {:>8} {:>9} {:>9} {:>9} | {:>9} {:>9} {:>8}",
        "offered",
        "calls/s",
        "achieved",
        "u",
        "calls",
        "median",
        "mean",
        "p99",
        "model r",
        "M/D/1",
        "mean/r"
    );
    for r in &rows {
        outln!(
            "{:>7.0}% {:>10.0} {:>10.0} {:>6.2} | {:>8} {:>9.1} {:>9.1} {:>9.1} | {:>9.1} {:>9.1} {:>8.2}",
            r.offered_utilization * 100.0,
            r.offered_per_second,
            r.achieved_per_second,
            r.utilization,
            r.calls,
            r.median_us,
            r.mean_us,
            r.p99_us,
            r.model_us,
            r.fixed_service_model_us,
            r.mean_us / r.model_us
        );
    }
    Ok(rows)
}
