//! What a secure binding costs: the same calls over plain and secure bindings to one server
//! (`serve --key --allow-plain`, pinned), over UDP and then over TCP, in interleaved rounds from
//! this thread: Null, MaxResult, 1 MiB and 16 MiB in; 8 callers' Null calls a second on one binding
//! of each kind; and the handshake's cost, as binds a second (for as long as the other rates, or
//! 1,000 binds). Both bindings have the defaults a user gets (the secure one seals with AES-256-GCM,
//! the default cipher).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tiercel::{ClientConfig, In, Out};

use crate::harness::serve_pinned_with;
use crate::progress::outln;
use crate::seeds::{TestClient, MAX_BUFFER};
use crate::summary::Summary;

/// Most binds of each kind the table makes.
const MAX_BINDS: u32 = 1_000;

/// A latency row, for `--json`.
#[derive(serde::Serialize, Clone)]
pub struct Row {
    /// `udp` or `tcp`.
    pub transport: &'static str,
    pub call: &'static str,
    pub bytes: usize,
    pub plain_median_us: f64,
    pub plain_p99_us: f64,
    pub secure_median_us: f64,
    pub secure_p99_us: f64,
    /// Secure median over plain median.
    pub ratio_median: f64,
}

/// A rate, plain and secure.
#[derive(serde::Serialize, Clone)]
pub struct Rate {
    pub transport: &'static str,
    pub what: &'static str,
    pub plain_per_s: f64,
    pub secure_per_s: f64,
    /// Secure over plain.
    pub ratio: f64,
}

/// What `tiercel bench` measures of secure bindings.
#[derive(serde::Serialize, Clone, Default)]
pub struct Json {
    pub rows: Vec<Row>,
    /// Null calls a second of 8 threads on one binding; binds (import and one Null) a second, one
    /// after another.
    pub rates: Vec<Rate>,
}

/// Measures plain against secure over UDP and over TCP: the server on `server_cpu`, this thread the
/// caller; `calls` Null and MaxResult calls (fewer of the large ones) in `rounds` rounds, and
/// `each` seconds of throughput and of binds.
pub fn table(server_cpu: usize, calls: u32, rounds: u32, each: Duration) -> crate::Result<Json> {
    let dir = std::env::temp_dir().join(format!("tiercel-bench-key-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let key_path = dir.join("server.key");
    let key = tiercel::Identity::generate().map_err(tiercel::Error::from)?;
    key.write(&key_path).map_err(tiercel::Error::from)?;
    let path = key_path.to_string_lossy().into_owned();
    // The handshake budget well above what one client can bind a second: the binds/s row measures
    // what a secure bind costs, not the budget (1,000 a second by default, a quarter of it for one
    // address, which held the row at about 330 binds/s).
    let served =
        serve_pinned_with(server_cpu, true, &["--key", &path, "--allow-plain", "--handshakes-per-second", "1000000"]);
    let _ = std::fs::remove_dir_all(&dir);
    let (_server, addr) = served?;
    let mut json = Json::default();
    for transport in ["udp", "tcp"] {
        let one = over(transport, &addr, &key, calls, rounds, each)?;
        json.rows.extend(one.rows);
        json.rates.extend(one.rates);
    }
    Ok(json)
}

/// [`table`]'s rows and rates over one transport, to the server at `addr` whose key is `key`.
fn over(
    transport: &'static str,
    addr: &str,
    key: &tiercel::Identity,
    calls: u32,
    rounds: u32,
    each: Duration,
) -> crate::Result<Json> {
    let target = format!("{transport}://{addr}");
    let plain_config = ClientConfig::default();
    let secure_config = ClientConfig { server_key: Some(key.public()), ..ClientConfig::default() };
    let plain: TestClient = crate::harness::import(target.as_str(), plain_config.clone())?;
    let secure: TestClient = crate::harness::import(target.as_str(), secure_config.clone())?;
    if secure.binding().server_key() != Some(key.public()) {
        return Err("the secure binding is not secure".into());
    }
    let mib = 1 << 20;
    let big = vec![7u8; 16 * mib];
    let mut out = vec![0u8; MAX_BUFFER];
    type Call<'a> = Box<dyn FnMut(&TestClient) -> Result<(), tiercel::CallError> + 'a>;
    let mut kinds: Vec<(&'static str, usize, u32, Call<'_>)> = vec![
        ("Null", 0, calls, Box::new(|c: &TestClient| c.null())),
        ("MaxResult", MAX_BUFFER, calls, Box::new(move |c: &TestClient| c.max_result(Out(&mut out[..])))),
        ("1 MiB in", mib, (calls / 100).clamp(20, 200), Box::new(|c: &TestClient| c.bulk_in(In(&big[..mib])))),
        ("16 MiB in", 16 * mib, (calls / 1000).clamp(5, 20), Box::new(|c: &TestClient| c.bulk_in(In(&big[..])))),
    ];
    let mut rows = Vec::new();
    for (name, bytes, n, call) in &mut kinds {
        let (mut p, mut s) = (Summary::new(), Summary::new());
        for _ in 0..(*n / 10).max(2) {
            call(&plain)?;
            call(&secure)?;
        }
        let per_round = (*n / rounds).max(1);
        for _ in 0..rounds {
            for (client, summary) in [(&plain, &mut p), (&secure, &mut s)] {
                for _ in 0..per_round {
                    let start = Instant::now();
                    call(client)?;
                    summary.record(start.elapsed());
                }
            }
        }
        rows.push(Row {
            transport,
            call: name,
            bytes: *bytes,
            plain_median_us: p.median_us(),
            plain_p99_us: p.p99_us(),
            secure_median_us: s.median_us(),
            secure_p99_us: s.p99_us(),
            ratio_median: s.median_us() / p.median_us(),
        });
    }
    let plain_8 = callers(&plain, 8, each)?;
    let secure_8 = callers(&secure, 8, each)?;
    // At most 1,000 binds of each kind: a binding lasts on the server until it is idle for
    // `binding_idle`, and the server holds at most `max_bindings` (4,096) at once.
    let binds = |config: &ClientConfig| -> crate::Result<f64> {
        let start = Instant::now();
        let mut n = 0u32;
        while start.elapsed() < each && n < MAX_BINDS {
            let c: TestClient = crate::harness::import(target.as_str(), config.clone())?;
            c.null()?;
            n += 1;
        }
        Ok(f64::from(n) / start.elapsed().as_secs_f64())
    };
    let plain_binds = binds(&ClientConfig { shared_memory: false, ..plain_config })?;
    let secure_binds = binds(&ClientConfig { shared_memory: false, ..secure_config })?;
    let rate = |what, plain_per_s: f64, secure_per_s: f64| Rate {
        transport,
        what,
        plain_per_s,
        secure_per_s,
        ratio: secure_per_s / plain_per_s,
    };
    Ok(Json {
        rows,
        rates: vec![
            rate("Null calls/s, 8 callers on one binding", plain_8, secure_8),
            rate("binds/s (import and one Null)", plain_binds, secure_binds),
        ],
    })
}

/// Null calls a second of `threads` threads sharing `client`'s binding for `each`.
fn callers(client: &TestClient, threads: usize, each: Duration) -> crate::Result<f64> {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (c, stop, done) = (client.clone(), stop.clone(), done.clone());
            std::thread::spawn(move || -> Result<(), tiercel::CallError> {
                while !stop.load(Ordering::Relaxed) {
                    c.null()?;
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            })
        })
        .collect();
    std::thread::sleep(each);
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().map_err(|_| crate::Error::from("a caller thread panicked"))??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64())
}

/// Prints the table.
pub fn print(t: &Json, calls: u32, rounds: u32) {
    outln!(
        "\nSecure calls over UDP and TCP: the same server (serve --key --allow-plain, pinned, its handshake budget \
         raised to 1,000,000 a second so that binds/s is what a bind costs), a plain and a \
         secure binding with the defaults (AES-256-GCM), calls alternating by round ({rounds} rounds; {calls} \
         Null and MaxResult calls, fewer large ones); this thread spins as a caller does by default"
    );
    outln!(
        "  {:<4} {:<12} {:>11} {:>11} {:>11} {:>11} {:>15}",
        "",
        "call",
        "plain med",
        "plain p99",
        "secure med",
        "secure p99",
        "secure / plain"
    );
    for r in &t.rows {
        outln!(
            "  {:<4} {:<12} {:>9.2}µs {:>9.2}µs {:>9.2}µs {:>9.2}µs {:>14.2}×",
            r.transport,
            r.call,
            r.plain_median_us,
            r.plain_p99_us,
            r.secure_median_us,
            r.secure_p99_us,
            r.secure_median_us / r.plain_median_us
        );
        if r.bytes >= 1 << 20 {
            let mb = |us: f64| r.bytes as f64 / us;
            outln!(
                "  {:<4} {:<12} {:>9.0} MB/s plain, {:.0} MB/s secure ({:.2}× plain bandwidth)",
                "",
                "",
                mb(r.plain_median_us),
                mb(r.secure_median_us),
                r.plain_median_us / r.secure_median_us
            );
        }
    }
    for r in &t.rates {
        outln!(
            "  {:<4} {}: {:.0} plain, {:.0} secure ({:.2}×)",
            r.transport,
            r.what,
            r.plain_per_s,
            r.secure_per_s,
            r.ratio
        );
    }
}
