//! Async calls (`TestAsyncClient`, a tokio current-thread runtime on the caller's CPU) against the
//! synchronous call on the same binding and against the raw ping-pong of the same run: Null in
//! interleaved rounds, then Null throughput of 1, 8 and 64 concurrent async tasks against 8 caller
//! threads, all on one binding and one CPU, with the client's default settings.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::Medium;
use crate::progress::outln;
use crate::seeds::{TestAsyncClient, TestClient};
use crate::summary::Summary;

/// A Null latency row, for `--json`.
#[derive(serde::Serialize)]
pub struct Row {
    pub transport: &'static str,
    pub raw_median_us: f64,
    pub raw_p99_us: f64,
    pub sync_median_us: f64,
    pub sync_p99_us: f64,
    pub async_median_us: f64,
    pub async_p99_us: f64,
}

/// A throughput row, for `--json`.
#[derive(serde::Serialize)]
pub struct Throughput {
    pub transport: &'static str,
    /// `"async tasks"` or `"sync threads"`.
    pub callers_are: &'static str,
    pub callers: u32,
    pub calls_per_second: f64,
}

/// Concurrent async callers measured.
pub const ASYNC_CALLERS: [u32; 3] = [1, 8, 64];
/// Caller threads the async callers are set against.
const SYNC_THREADS: u32 = 8;

fn runtime() -> crate::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread().enable_all().build()?)
}

/// The async table over `medium` against the spinning `tiercel serve` at `addr`
/// (host:port); this thread is pinned to the client CPU. `raw`: the raw Null ping-pong measured
/// earlier in the run, spinning.
pub fn table(
    medium: Medium,
    addr: &str,
    client_cpu: usize,
    calls: u32,
    rounds: u32,
    raw: &Summary,
    time: Duration,
) -> crate::Result<(Row, Vec<Throughput>)> {
    let scheme = medium.scheme();
    let sync: TestClient = crate::harness::import(format!("{scheme}{addr}"), tiercel::ClientConfig::default())?;
    let rt = runtime()?;
    let client = sync.to_async();
    let (mut s, mut a) = (Summary::new(), Summary::new());
    let per_round = (calls / rounds).max(1);
    // The server spins 2 ms past its last call on another transport: let it stop first.
    std::thread::sleep(Duration::from_millis(5));
    for _ in 0..2_000 {
        sync.null()?;
    }
    rt.block_on(async {
        for _ in 0..2_000 {
            client.null().await?;
        }
        Ok::<_, tiercel::CallError>(())
    })?;
    for _ in 0..rounds {
        for _ in 0..per_round {
            let t = Instant::now();
            sync.null()?;
            s.record(t.elapsed());
        }
        rt.block_on(async {
            for _ in 0..per_round {
                let t = Instant::now();
                client.null().await?;
                a.record(t.elapsed());
            }
            Ok::<_, tiercel::CallError>(())
        })?;
    }
    let transport = medium.name();
    let row = Row {
        transport,
        raw_median_us: raw.median_us(),
        raw_p99_us: raw.p99_us(),
        sync_median_us: s.median_us(),
        sync_p99_us: s.p99_us(),
        async_median_us: a.median_us(),
        async_p99_us: a.p99_us(),
    };
    // Throughput in `rounds` interleaved slices of each row's time, each round starting with the
    // next row: a row measured in one piece can fall into one of the machine's slow stretches, and
    // a slice's rate swings by a tenth or more either way. Each row is the median of its slices.
    let rows = 1 + ASYNC_CALLERS.len();
    let slice = time / rounds.max(1);
    let mut rates = vec![Vec::new(); rows];
    for round in 0..rounds.max(1) as usize {
        for k in (0..rows).map(|k| (round + k) % rows) {
            rates[k].push(match k {
                0 => threads(&sync, SYNC_THREADS, client_cpu, slice)?,
                _ => rt.block_on(tasks(&client, ASYNC_CALLERS[k - 1], slice))?,
            });
        }
    }
    let mut rates = rates.into_iter().map(crate::summary::median);
    let mut throughput = vec![Throughput {
        transport,
        callers_are: "sync threads",
        callers: SYNC_THREADS,
        calls_per_second: rates.next().unwrap_or(0.0),
    }];
    for (callers, calls_per_second) in ASYNC_CALLERS.into_iter().zip(rates) {
        throughput.push(Throughput { transport, callers_are: "async tasks", callers, calls_per_second });
    }
    Ok((row, throughput))
}

/// Null calls per second of `n` threads on `cpu`, all on `client`'s binding, for `time`.
pub(crate) fn threads(client: &TestClient, n: u32, cpu: usize, time: Duration) -> crate::Result<f64> {
    callers(client, n, cpu, |done| {
        let (start, before) = (Instant::now(), done.load(Ordering::Relaxed));
        std::thread::sleep(time);
        let n = done.load(Ordering::Relaxed) - before;
        n as f64 / start.elapsed().as_secs_f64()
    })
}

/// Runs `measure` while `n` threads on `cpu` make Null calls on `client`'s binding without pause,
/// counting them in the counter `measure` is given; then stops them.
pub(crate) fn callers<R>(
    client: &TestClient,
    n: u32,
    cpu: usize,
    measure: impl FnOnce(&AtomicU64) -> R,
) -> crate::Result<R> {
    callers_of(client, n, cpu, |c| c.null(), measure)
}

/// Runs `measure` while `n` threads on `cpu` make `call` on `client`'s binding without pause,
/// counting the calls in the counter `measure` is given; then stops them.
pub(crate) fn callers_of<C: Clone + Send + 'static, R>(
    client: &C,
    n: u32,
    cpu: usize,
    call: fn(&C) -> Result<(), tiercel::CallError>,
    measure: impl FnOnce(&AtomicU64) -> R,
) -> crate::Result<R> {
    let client = client.clone();
    let caller = move || {
        let c = client.clone();
        Ok(move || call(&c).map(|()| true).map_err(crate::Error::from))
    };
    round_trips(n, cpu, caller, measure)
}

/// Runs `measure` while `n` threads on `cpu` each make round trips without pause with what
/// `caller` makes for it on the thread, counting those that return true (a round trip that got its
/// answer) in the counter `measure` is given; then stops them.
pub(crate) fn round_trips<M, F, R>(
    n: u32,
    cpu: usize,
    caller: M,
    measure: impl FnOnce(&AtomicU64) -> R,
) -> crate::Result<R>
where
    M: Fn() -> crate::Result<F> + Clone + Send + 'static,
    F: FnMut() -> crate::Result<bool>,
{
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let (caller, done, stop) = (caller.clone(), done.clone(), stop.clone());
            std::thread::spawn(move || -> crate::Result<()> {
                let _ = tiercel_sys::cpu::pin_current_thread(cpu);
                let mut round_trip = caller()?;
                while !stop.load(Ordering::Relaxed) {
                    if round_trip()? {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Ok(())
            })
        })
        .collect();
    // Let every thread make its first call (each binds its slot) before counting.
    std::thread::sleep(Duration::from_millis(50));
    let measured = measure(&done);
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().map_err(|_| "a caller thread panicked".to_string())??;
    }
    Ok(measured)
}

/// Null calls per second of `callers` concurrent tasks on this runtime, for `time`.
async fn tasks(client: &TestAsyncClient, callers: u32, time: Duration) -> crate::Result<f64> {
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..callers {
        let (c, done, stop) = (client.clone(), done.clone(), stop.clone());
        set.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                c.null().await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, tiercel::CallError>(())
        });
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (start, before) = (Instant::now(), done.load(Ordering::Relaxed));
    tokio::time::sleep(time).await;
    let n = done.load(Ordering::Relaxed) - before;
    let elapsed = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    while let Some(r) = set.join_next().await {
        r.map_err(|e| format!("an async caller failed: {e}"))??;
    }
    Ok(n as f64 / elapsed.as_secs_f64())
}

/// Prints the rows of every transport measured.
pub fn print(rows: &[Row], throughput: &[Throughput], rounds: u32, calls: u32, time: Duration) {
    outln!(
        "\nAsync calls: Null through `TestAsyncClient` on a tokio current-thread runtime on the caller's CPU, \
         against the"
    );
    outln!(
        "synchronous call on the same binding ({calls} calls each, in {rounds} interleaved rounds) and the raw \
         spinning ping-pong"
    );
    outln!(
        "of the latency table above; default client settings (an async call spins only while it is its binding's \
         only one in"
    );
    outln!("flight); µs");
    outln!(
        "{:>9} | {:>8} {:>8} | {:>8} {:>8} | {:>8} {:>8} | {:>10} {:>10} {:>10}",
        "transport",
        "raw",
        "p99",
        "sync",
        "p99",
        "async",
        "p99",
        "async/sync",
        "async/raw",
        "p99 a/s"
    );
    for r in rows {
        outln!(
            "{:>9} | {:>8.2} {:>8.2} | {:>8.2} {:>8.2} | {:>8.2} {:>8.2} | {:>9.2}× {:>9.2}× {:>9.2}×",
            r.transport,
            r.raw_median_us,
            r.raw_p99_us,
            r.sync_median_us,
            r.sync_p99_us,
            r.async_median_us,
            r.async_p99_us,
            r.async_median_us / r.sync_median_us,
            r.async_median_us / r.raw_median_us,
            r.async_p99_us / r.sync_p99_us
        );
    }
    outln!(
        "\nThroughput of Null calls on one binding, every caller on the caller's CPU ({:.1} s per row, the median of \
         {rounds} slices",
        time.as_secs_f64()
    );
    outln!(
        "of {:.0} ms interleaved with the other rows'): async tasks on one current-thread runtime against \
         {SYNC_THREADS} threads of",
        time.as_secs_f64() * 1e3 / rounds.max(1) as f64
    );
    outln!("synchronous calls");
    outln!("{:>9} | {:>14} {:>8} | {:>12} | {:>12}", "transport", "callers", "", "calls/s", "vs 8 threads");
    let mut stalled = false;
    for t in throughput {
        let threads = throughput
            .iter()
            .find(|x| x.transport == t.transport && x.callers_are == "sync threads")
            .map_or(0.0, |x| x.calls_per_second);
        stalled |= t.calls_per_second <= 0.0;
        outln!(
            "{:>9} | {:>14} {:>8} | {:>12.0} | {:>12}",
            t.transport,
            t.callers_are,
            t.callers,
            t.calls_per_second,
            times(t.calls_per_second, threads)
        );
    }
    if stalled {
        outln!("(a rate of 0: no call finished in most of that row's slices; its ratios are left out)");
    }
}

/// `a / b` as a ratio cell (`1.23×`), or `—` where either rate is 0 and the ratio would say nothing.
pub(crate) fn times(a: f64, b: f64) -> String {
    if a > 0.0 && b > 0.0 && (a / b).is_finite() {
        format!("{:.2}×", a / b)
    } else {
        "—".to_string()
    }
}
