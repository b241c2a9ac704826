//! `tiercel bench`: Null and MaxResult over each transport against the raw mechanism beneath it,
//! measured in the same run, with the same thread placement and the same waiting policy: over UDP
//! against a raw UDP ping-pong of the same packet sizes, through shared memory against a raw
//! shared-memory ping-pong (spinning) or futex ping-pong (blocking) of the same data sizes.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tiercel::seeds::{TestClient, BIG_BUFFER, MAX_BUFFER};
use tiercel::{Client, ClientConfig, In, InOut, Out, Spin};

use crate::raw::PingPong;
use crate::raw_shm::ShmPingPong;
use crate::summary::Summary;

/// Header bytes of every tiercel packet.
const HEADER: usize = 56;

/// Options of `tiercel bench`.
#[derive(clap::Args)]
pub struct Args {
    /// Timed calls per row (after a warm-up), spread over several interleaved rounds.
    #[arg(long, default_value_t = 50_000)]
    calls: u32,
    /// A short run: 10,000 calls per row.
    #[arg(long)]
    quick: bool,
    /// Interleaved rounds: raw and tiercel alternate so that drift of the machine hits both alike.
    #[arg(long, default_value_t = 5)]
    rounds: u32,
    /// CPU of the calling thread.
    #[arg(long, default_value_t = 0)]
    client_cpu: usize,
    /// CPU of the server processes.
    #[arg(long, default_value_t = 1)]
    server_cpu: usize,
    /// Also measure with blocking waits (no spinning) on both sides.
    #[arg(long)]
    blocking: bool,
    /// Stop measuring after this many seconds in all.
    #[arg(long, default_value_t = 240)]
    max_seconds: u64,
    /// Transports to measure: `udp`, `shm`, or both (comma-separated).
    #[arg(long, default_value = "udp,shm")]
    transports: String,
    /// Only the latency tables against the raw baselines (skip the Mach list and Firefly Table I).
    #[arg(long)]
    latency_only: bool,
    /// Also write every table as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<std::path::PathBuf>,
}

/// Everything a run measured, for `--json`.
#[derive(serde::Serialize, Default)]
pub struct Report {
    cpus: usize,
    client_cpu: usize,
    server_cpu: usize,
    latency: Vec<LatencyTable>,
    pub mach: Vec<crate::tables::MachJson>,
    pub firefly_table1: Vec<crate::tables::Table1Json>,
}

/// One latency table: a transport and a waiting policy, each row against its raw baseline.
#[derive(serde::Serialize)]
struct LatencyTable {
    transport: &'static str,
    waiting: &'static str,
    baseline: &'static str,
    rows: Vec<LatencyRow>,
}

#[derive(serde::Serialize)]
struct LatencyRow {
    procedure: &'static str,
    call_bytes: usize,
    result_bytes: usize,
    calls: u64,
    raw_median_us: f64,
    raw_p99_us: f64,
    rpc_median_us: f64,
    rpc_p99_us: f64,
    ratio_median: f64,
    ratio_p99: f64,
}

/// A transport and the raw mechanism beneath it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Medium {
    Udp,
    Shm,
}

/// The raw baseline of a medium.
enum Baseline {
    Udp(PingPong),
    Shm(ShmPingPong),
}

impl Baseline {
    fn round_trip(&mut self) -> crate::Result<bool> {
        match self {
            Baseline::Udp(p) => p.round_trip(),
            Baseline::Shm(p) => p.round_trip(),
        }
    }
}

/// A child process killed when dropped; its stdout stays open so that it can go on printing.
struct Spawned(Child, #[allow(dead_code)] BufReader<std::process::ChildStdout>);

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a server process of this program and reads the address (or name) it listens on.
fn spawn(args: &[String]) -> crate::Result<(Spawned, String)> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("starting {args:?}: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut reader = BufReader::new(stdout);
    let mut line = String::new();
    let read = reader.read_line(&mut line);
    let child = Spawned(child, reader);
    read.map_err(|e| e.to_string())?;
    let addr = line
        .trim()
        .strip_prefix("listening ")
        .map(str::to_string)
        .ok_or_else(|| format!("{args:?} printed {line:?} instead of its address"))?;
    Ok((child, addr))
}

struct Row {
    name: &'static str,
    call_bytes: usize,
    result_bytes: usize,
    raw: Summary,
    rpc: Summary,
}

pub fn run(args: Args) -> crate::Result<()> {
    let calls = if args.quick { 10_000 } else { args.calls.max(100) };
    let rounds = args.rounds.max(1);
    let deadline = Instant::now() + Duration::from_secs(args.max_seconds);
    let mut modes = vec![true];
    if args.blocking {
        modes.push(false);
    }
    let mut media = Vec::new();
    for t in args.transports.split(',').map(str::trim) {
        media.push(match t {
            "udp" => Medium::Udp,
            "shm" => Medium::Shm,
            other => return Err(format!("unknown transport {other:?} (udp, shm)")),
        });
    }
    tiercel_sys::cpu::pin_current_thread(args.client_cpu).map_err(|e| e.to_string())?;
    let mut report = Report {
        cpus: tiercel_sys::cpu::available(),
        client_cpu: args.client_cpu,
        server_cpu: args.server_cpu,
        ..Report::default()
    };
    println!("tiercel bench: {} CPUs", tiercel_sys::cpu::available());
    println!(
        "placement: caller thread pinned to CPU {}, server process (1 worker, and its shared-memory binding \
         thread) pinned to CPU {}",
        args.client_cpu, args.server_cpu
    );
    for medium in media {
        for &spin in &modes {
            let policy = match (medium, spin) {
                (Medium::Udp, true) => {
                    "UDP over loopback; both sides busy-poll (non-blocking recv in a loop, never block)"
                }
                (Medium::Udp, false) => "UDP over loopback; both sides block in poll() at once (no spinning)",
                (Medium::Shm, true) => "shared memory; both sides spin on the slot's words (never block)",
                (Medium::Shm, false) => "shared memory; both sides sleep on futexes at once (no spinning)",
            };
            println!(
                "\n{policy}; {calls} timed calls per row in {rounds} interleaved rounds, after 2,000 warm-up calls"
            );
            let rows = measure(&args, medium, spin, calls, rounds, deadline)?;
            report.latency.push(print_table(&rows, medium, spin));
        }
    }
    if !args.latency_only {
        let cpu = args.server_cpu.to_string();
        let serve: Vec<String> =
            ["serve", "--addr", "udp://127.0.0.1:0", "--cpus", &cpu].iter().map(|s| s.to_string()).collect();
        let (server, addr) = spawn(&serve)?;
        let addr = addr.strip_prefix("udp://").unwrap_or(&addr).to_string();
        let row_time = Duration::from_millis(if args.quick { 200 } else { 1000 });
        report.mach = crate::tables::mach((server.0.id(), &addr), args.server_cpu, row_time)?;
        report.firefly_table1 = crate::tables::firefly_table1(&addr, 10_000)?;
    }
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(path, json).map_err(|e| format!("{}: {e}", path.display()))?;
        println!("\nwrote {}", path.display());
    }
    Ok(())
}

fn measure(
    args: &Args,
    medium: Medium,
    spin: bool,
    calls: u32,
    rounds: u32,
    deadline: Instant,
) -> crate::Result<Vec<Row>> {
    let cpu = args.server_cpu.to_string();
    let echo = if medium == Medium::Udp { "raw-echo" } else { "raw-shm-echo" };
    let mut raw_args = vec![echo.to_string(), "--cpu".into(), cpu.clone()];
    if spin {
        raw_args.push("--spin".into());
    }
    let (_raw_server, raw_addr) = spawn(&raw_args)?;
    // Spinning servers spin 2 ms past their last call, then block: the raw and tiercel servers share
    // the server CPU, and each must leave it to the other while the other is being measured.
    let spin_us = if spin { "2000" } else { "0" };
    let rpc_args: Vec<String> = [
        "serve",
        "--addr",
        "udp://127.0.0.1:0",
        "--workers",
        "1",
        "--spin-us",
        spin_us,
        "--spin-fixed",
        "--cpus",
        &cpu,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (_rpc_server, rpc_addr) = spawn(&rpc_args)?;
    let rpc_addr = rpc_addr.strip_prefix("udp://").unwrap_or(&rpc_addr).to_string();
    let policy = if spin { Spin::Fixed(Duration::from_secs(3600)) } else { Spin::Never };
    let scheme = if medium == Medium::Udp { "udp://" } else { "shm:" };
    let client: TestClient = Client::connect(format!("{scheme}{rpc_addr}"))
        .and_then(|c| c.with_config(ClientConfig { spin: policy, ..ClientConfig::default() }).import())
        .map_err(|e| e.to_string())?;
    let mut out = vec![0u8; MAX_BUFFER];
    let mut big = vec![0u8; BIG_BUFFER];
    let mut max = vec![0u8; MAX_BUFFER];
    tiercel::seeds::fill(&mut max);
    // LRPC's Table IV (Null, Add, BigIn, BigInOut) and Firefly's MaxResult. Sizes are the marshaled
    // data each way (a buffer travels with its 4-byte length); over UDP each adds a packet header.
    let header = if medium == Medium::Udp { HEADER } else { 0 };
    let row = |name, call: usize, result: usize| Row {
        name,
        call_bytes: header + call,
        result_bytes: header + result,
        raw: Summary::new(),
        rpc: Summary::new(),
    };
    let mut rows = vec![
        row("Null", 0, 0),
        row("Add", 8, 4),
        row("BigIn", 4 + BIG_BUFFER, 0),
        row("BigInOut", 4 + BIG_BUFFER, BIG_BUFFER),
        row("MaxResult", 4, MAX_BUFFER),
    ];
    let shm_conn = match medium {
        Medium::Shm => Some(crate::raw_shm::Connection::new(&raw_addr)?),
        Medium::Udp => None,
    };
    let mut pings: Vec<Baseline> = rows
        .iter()
        .map(|r| match medium {
            Medium::Udp => raw_addr
                .strip_prefix("udp://")
                .and_then(|a| a.parse::<SocketAddr>().ok())
                .ok_or_else(|| format!("raw echo address {raw_addr:?}"))
                .and_then(|a| PingPong::new(a, r.call_bytes, r.result_bytes, spin))
                .map(Baseline::Udp),
            Medium::Shm => shm_conn
                .as_ref()
                .map(|c| Baseline::Shm(ShmPingPong::new(c, r.call_bytes, r.result_bytes, spin)))
                .ok_or_else(|| "no raw shared-memory connection".to_string()),
        })
        .collect::<crate::Result<_>>()?;
    let mut rpc_call = |row: usize, out: &mut [u8]| -> crate::Result<()> {
        match row {
            0 => client.null(),
            1 => client.add(2, 3).map(|_| ()),
            2 => client.big_in(In(&max[..BIG_BUFFER])),
            3 => client.big_in_out(InOut(&mut big)),
            _ => client.max_result(Out(out)),
        }
        .map_err(|e| e.to_string())
    };
    let mut warmup_lost = 0u64;
    // Raw and tiercel warm up in turn, not call by call: their servers share a CPU, and a spinning
    // server must have gone quiet before the other one runs.
    for (i, ping) in pings.iter_mut().enumerate() {
        for _ in 0..2_000 {
            if !ping.round_trip()? {
                warmup_lost += 1;
            }
        }
        for _ in 0..2_000 {
            rpc_call(i, &mut out)?;
        }
    }
    if warmup_lost > 0 {
        println!("({warmup_lost} raw round trips lost a packet during the warm-up)");
    }
    let per_round = calls.div_ceil(rounds);
    let mut lost = 0u64;
    'rounds: for _ in 0..rounds {
        for (i, row) in rows.iter_mut().enumerate() {
            if Instant::now() > deadline {
                println!("(time limit reached: rows hold fewer calls)");
                break 'rounds;
            }
            for _ in 0..per_round {
                let t = Instant::now();
                if pings[i].round_trip()? {
                    row.raw.record(t.elapsed());
                } else {
                    lost += 1;
                }
            }
            for _ in 0..per_round {
                let t = Instant::now();
                rpc_call(i, &mut out)?;
                row.rpc.record(t.elapsed());
            }
        }
    }
    if lost > 0 {
        println!("({lost} raw round trips lost a packet and were left out)");
    }
    let retransmissions = client.binding().stats().retransmissions.load(std::sync::atomic::Ordering::Relaxed);
    println!("tiercel retransmissions during the run: {retransmissions}");
    Ok(rows)
}

fn print_table(rows: &[Row], medium: Medium, spin: bool) -> LatencyTable {
    println!(
        "{:<10} {:>13} | {:>10} {:>10} | {:>10} {:>10} | {:>8} {:>8}",
        "procedure", "bytes c/r", "raw med", "raw p99", "rpc med", "rpc p99", "ratio", "p99 rat."
    );
    for r in rows {
        println!(
            "{:<10} {:>13} | {:>8.2}µs {:>8.2}µs | {:>8.2}µs {:>8.2}µs | {:>7.3}× {:>7.3}×",
            r.name,
            format!("{}/{}", r.call_bytes, r.result_bytes),
            r.raw.median_us(),
            r.raw.p99_us(),
            r.rpc.median_us(),
            r.rpc.p99_us(),
            r.rpc.median_us() / r.raw.median_us(),
            r.rpc.p99_us() / r.raw.p99_us(),
        );
    }
    let n = rows.first().map(|r| r.rpc.len()).unwrap_or(0);
    let raw = match (medium, spin) {
        (Medium::Udp, _) => "UDP ping-pong of the same datagram sizes",
        (Medium::Shm, true) => "shared-memory spin ping-pong copying the same data sizes",
        (Medium::Shm, false) => "futex ping-pong copying the same data sizes",
    };
    println!("(median and p99 of {n} calls per cell; raw = {raw}, same CPUs, same waiting)");
    LatencyTable {
        transport: if medium == Medium::Udp { "udp" } else { "shm" },
        waiting: if spin { "spin" } else { "block" },
        baseline: raw,
        rows: rows
            .iter()
            .map(|r| LatencyRow {
                procedure: r.name,
                call_bytes: r.call_bytes,
                result_bytes: r.result_bytes,
                calls: r.rpc.len(),
                raw_median_us: r.raw.median_us(),
                raw_p99_us: r.raw.p99_us(),
                rpc_median_us: r.rpc.median_us(),
                rpc_p99_us: r.rpc.p99_us(),
                ratio_median: r.rpc.median_us() / r.raw.median_us(),
                ratio_p99: r.rpc.p99_us() / r.raw.p99_us(),
            })
            .collect(),
    }
}
