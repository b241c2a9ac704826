//! The server's workers as a user gets them: Null over UDP against servers of the default
//! configuration and of 1, 2 and 4 workers (everything else at its default, spinning included),
//! in interleaved rounds (each starting with the next server), with the latency of one caller
//! against a raw spinning UDP ping-pong measured in the same rounds (the machine's tail swings from
//! minute to minute, so a ratio of p99s taken minutes apart says little), and the calls per second
//! of 1 and 8 caller threads on one binding.

use std::time::{Duration, Instant};

use crate::progress::outln;
use crate::seeds::TestClient;
use crate::summary::Summary;

/// A row, for `--json`.
#[derive(serde::Serialize)]
pub struct Row {
    /// `"default (16)"`, or the number of workers.
    pub workers: String,
    pub median_us: f64,
    pub p99_us: f64,
    pub raw_median_us: f64,
    pub raw_p99_us: f64,
    pub one_caller_calls_per_second: f64,
    pub eight_callers_calls_per_second: f64,
}

/// Worker counts set against the default.
const FIXED: [usize; 3] = [1, 2, 4];

/// Timed calls of one server in one latency round.
const LATENCY_ROUND: u32 = 400;

/// Untimed calls at the start of each latency round: the server (or echo) had stopped spinning
/// while the others were measured, and its first calls wake it.
const ROUND_WARM_UP: u32 = 50;

/// The latency's timed calls per server in a round, and its rounds, for `calls` calls per server.
/// Short rounds, many of them: the machine's slow stretches last milliseconds, and in rounds of
/// 2,000 calls (10 ms each), five per server, the p99 of servers of the same code differed by up to
/// 2.2× in one run (1.6× on average in three runs); in rounds of 400, by 1.3× on average in nine
/// runs (the largest p99 over the smallest of the four).
fn latency_rounds(calls: u32) -> (u32, u32) {
    let per_round = LATENCY_ROUND.min(calls).max(1);
    (per_round, calls.div_ceil(per_round))
}

/// Slices of calls/s measurement per server and caller count in each round.
const SLICES_PER_ROUND: usize = 3;

/// Measures every configuration, and the raw spinning UDP Null ping-pong in the same rounds.
pub fn table(server_cpu: usize, client_cpu: usize, calls: u32, rounds: u32, time: Duration) -> crate::Result<Vec<Row>> {
    let default_workers = tiercel::ServerConfig::default().workers;
    let mut configs: Vec<(String, Option<usize>)> = FIXED.iter().map(|&n| (n.to_string(), Some(n))).collect();
    configs.push((format!("default ({default_workers})"), None));
    let cpu = server_cpu.to_string();
    let mut servers = Vec::new();
    for (_, workers) in &configs {
        let mut args: Vec<String> =
            ["serve", "--addr", "udp://127.0.0.1:0", "--cpus", &cpu, "--no-shared-memory", "--no-tcp"]
                .iter()
                .map(|s| s.to_string())
                .collect();
        if let Some(n) = workers {
            args.extend(["--workers".to_string(), n.to_string()]);
        }
        let (server, addr) = crate::harness::spawn(&args)?;
        let client: TestClient = crate::harness::import(addr.as_str(), tiercel::ClientConfig::default())?;
        for _ in 0..2_000 {
            client.null()?;
        }
        servers.push((server, client, Summary::new()));
    }
    // The raw ping-pong: tiercel's 56-byte header each way to an echo spinning on the server CPU.
    let (_raw_server, raw_addr) = crate::harness::spinning_echo(server_cpu)?;
    const HEADER: usize = tiercel_proto::wire::HEADER_LEN;
    let mut ping = crate::raw::PingPong::new(raw_addr, HEADER, HEADER, true)?;
    for _ in 0..2_000 {
        ping.round_trip()?;
    }
    let mut raw = Summary::new();
    let (per_round, latency_rounds) = latency_rounds(calls);
    let count = servers.len();
    for round in 0..latency_rounds as usize {
        std::thread::sleep(Duration::from_millis(5));
        for _ in 0..ROUND_WARM_UP {
            ping.round_trip()?;
        }
        for _ in 0..per_round {
            let t = Instant::now();
            // A lost datagram (none on loopback, in practice) is left out, not timed as a second.
            if ping.round_trip()? {
                raw.record(t.elapsed());
            }
        }
        // Each round starts with the next server, so that none is always measured right after
        // the same other one.
        for i in 0..count {
            let (_, client, summary) = &mut servers[(round + i) % count];
            // The server last measured spins 1 ms past its last call: let it stop first.
            std::thread::sleep(Duration::from_millis(5));
            for _ in 0..ROUND_WARM_UP {
                client.null()?;
            }
            for _ in 0..per_round {
                let t = Instant::now();
                client.null()?;
                summary.record(t.elapsed());
            }
        }
    }
    // Throughput in interleaved slices too: the machine's slow stretches last seconds, and a row
    // measured in one piece can fall into one. A slice's rate swings by a tenth or more either way,
    // so each row is the median of `SLICES_PER_ROUND` slices a round.
    let slice = time / rounds;
    let mut rates = vec![(Vec::new(), Vec::new()); count];
    for round in 0..rounds as usize * SLICES_PER_ROUND {
        for i in (0..count).map(|i| (round + i) % count) {
            let ((_, client, _), (one, eight)) = (&servers[i], &mut rates[i]);
            std::thread::sleep(Duration::from_millis(5));
            one.push(crate::asynch::threads(client, 1, client_cpu, slice)?);
            std::thread::sleep(Duration::from_millis(5));
            eight.push(crate::asynch::threads(client, 8, client_cpu, slice)?);
        }
    }
    let rates = rates.into_iter().map(|(one, eight)| (crate::summary::median(one), crate::summary::median(eight)));
    let mut rows = Vec::new();
    for (((name, _), (server, _, summary)), (one, eight)) in configs.into_iter().zip(servers).zip(rates) {
        rows.push(Row {
            workers: name,
            median_us: summary.median_us(),
            p99_us: summary.p99_us(),
            raw_median_us: raw.median_us(),
            raw_p99_us: raw.p99_us(),
            one_caller_calls_per_second: one,
            eight_callers_calls_per_second: eight,
        });
        drop(server);
    }
    Ok(rows)
}

/// Prints the table.
pub fn print(rows: &[Row], calls: u32, rounds: u32, time: Duration) {
    let (per_round, latency_rounds) = latency_rounds(calls);
    outln!(
        "\nServer workers: Null over UDP, the default server against servers of 1, 2 and 4 workers (all else at its \
         default:"
    );
    outln!(
        "one worker spins 1 ms past its last packet); latency of one caller ({calls} calls per server in \
         {latency_rounds} interleaved rounds of {per_round},"
    );
    outln!("each after {ROUND_WARM_UP} untimed calls, each round starting with the next server)");
    outln!(
        "against a raw spinning UDP ping-pong (56 bytes each way) timed in the same rounds; calls/s of 1 and 8 caller threads on one \
         binding (the median of {} slices of {:.0} ms each, interleaved the same way)",
        rounds as usize * SLICES_PER_ROUND,
        time.as_secs_f64() * 1e3 / rounds as f64
    );
    outln!(
        "{:>12} | {:>8} {:>8} | {:>8} {:>8} | {:>9} | {:>10} {:>10}",
        "workers",
        "median",
        "p99",
        "raw p99",
        "p99/raw",
        "med/raw",
        "1 caller/s",
        "8 callers/s"
    );
    for r in rows {
        outln!(
            "{:>12} | {:>8.2} {:>8.2} | {:>8.2} {:>7.2}× | {:>8.2}× | {:>10.0} {:>10.0}",
            r.workers,
            r.median_us,
            r.p99_us,
            r.raw_p99_us,
            r.p99_us / r.raw_p99_us,
            r.median_us / r.raw_median_us,
            r.one_caller_calls_per_second,
            r.eight_callers_calls_per_second
        );
    }
}
