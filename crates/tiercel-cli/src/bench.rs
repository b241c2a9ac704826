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

use crate::progress::outln;
use crate::raw::PingPong;
use crate::raw_shm::ShmPingPong;
use crate::summary::Summary;

/// Header bytes of every tiercel packet.
pub(crate) const HEADER: usize = 56;

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
    /// Also measure the latency tables with blocking waits (no spinning) on both sides in a --quick
    /// run (a full run always does).
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
    /// Also draw SVG plots into this directory: latency CDFs per transport, throughput against caller
    /// threads, response time against load, and the accounting of a call as stacked bars.
    #[arg(long, value_name = "DIR")]
    plot: Option<std::path::PathBuf>,
}

/// Everything a run measured, for `--json`.
#[derive(serde::Serialize, Default)]
pub struct Report {
    cpus: usize,
    client_cpu: usize,
    server_cpu: usize,
    latency: Vec<LatencyTable>,
    pub baselines: Vec<crate::baselines::Row>,
    pub mach: Vec<crate::tables::MachJson>,
    pub firefly_table1: Vec<crate::tables::Table1Json>,
    pub firefly_marshaling: Vec<crate::tables::MarshalJson>,
    pub peregrine: crate::peregrine::Json,
    pub load: Vec<crate::load::Row>,
    /// The accounting of Null and MaxResult per transport (as `tiercel explain` prints it, spinning).
    pub breakdown: Vec<crate::explain::Account>,
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
pub(crate) enum Medium {
    Udp,
    Shm,
}

/// The raw baseline of a medium.
pub(crate) enum Baseline {
    Udp(PingPong),
    Shm(ShmPingPong),
}

impl Baseline {
    pub(crate) fn round_trip(&mut self) -> crate::Result<bool> {
        match self {
            Baseline::Udp(p) => p.round_trip(),
            Baseline::Shm(p) => p.round_trip(),
        }
    }

    /// Where the round trips' steps are summed, if they are.
    pub(crate) fn stamps_mut(&mut self) -> &mut Option<crate::raw::Stamps> {
        match self {
            Baseline::Udp(p) => &mut p.stamps,
            Baseline::Shm(p) => &mut p.stamps,
        }
    }
}

/// A child process killed when dropped; its stdout stays open so that it can go on printing.
pub(crate) struct Spawned(pub(crate) Child, #[allow(dead_code)] BufReader<std::process::ChildStdout>);

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a server process of this program and reads the address (or name) it listens on.
pub(crate) fn spawn(args: &[String]) -> crate::Result<(Spawned, String)> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    spawn_program(exe, args)
}

/// Starts `program` (this program, or one that execs it) and reads the address it listens on.
pub(crate) fn spawn_program(program: impl AsRef<std::ffi::OsStr>, args: &[String]) -> crate::Result<(Spawned, String)> {
    let mut child = Command::new(program)
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

/// Starts a `tiercel serve` with one worker on `cpu`, spinning 2 ms past each call (`spin`) or
/// blocking at once, and returns it with its `host:port`.
fn serve_pinned(cpu: usize, spin: bool) -> crate::Result<(Spawned, String)> {
    // Spinning servers spin 2 ms past their last call, then block: the raw and tiercel servers share
    // the server CPU, and each must leave it to the other while the other is being measured.
    let spin_us = if spin { "2000" } else { "0" };
    let cpu = cpu.to_string();
    let args: Vec<String> = [
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
    let (server, addr) = spawn(&args)?;
    let addr = addr.strip_prefix("udp://").unwrap_or(&addr).to_string();
    Ok((server, addr))
}

/// How long each part of the run measures.
struct Budget {
    calls: u32,
    baseline_row: Duration,
    mach_row: Duration,
    marshal_calls: u32,
    peregrine_row: Duration,
    load_row: Duration,
    accounting_calls: u32,
}

pub fn run(args: Args) -> crate::Result<()> {
    let budget = if args.quick {
        Budget {
            calls: 10_000,
            baseline_row: Duration::from_millis(150),
            mach_row: Duration::from_millis(200),
            marshal_calls: 5_000,
            peregrine_row: Duration::from_millis(100),
            load_row: Duration::from_millis(300),
            accounting_calls: 5_000,
        }
    } else {
        Budget {
            calls: args.calls.max(100),
            baseline_row: Duration::from_millis(1000),
            mach_row: Duration::from_millis(1000),
            marshal_calls: 50_000,
            peregrine_row: Duration::from_millis(400),
            load_row: Duration::from_millis(1500),
            accounting_calls: 20_000,
        }
    };
    let calls = budget.calls;
    let rounds = args.rounds.max(1);
    let deadline = Instant::now() + Duration::from_secs(args.max_seconds);
    let mut modes = vec![true];
    if args.blocking || !args.quick {
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
    outln!("tiercel bench: {} CPUs", tiercel_sys::cpu::available());
    outln!(
        "placement: caller thread pinned to CPU {}, server process (1 worker, and its shared-memory binding \
         thread) pinned to CPU {}",
        args.client_cpu,
        args.server_cpu
    );
    let full = !args.latency_only;
    crate::progress::start(
        (media.len() * modes.len()) as u64
            + if full {
                7 + 3 + 1 + (media.len() as u64) * (12 + 1 + crate::load::UTILIZATIONS.len() as u64 + 1)
            } else {
                0
            },
    );
    if full {
        crate::progress::doing("raw baselines");
        report.baselines = crate::baselines::run(args.server_cpu, budget.baseline_row, crate::progress::step)?;
        crate::baselines::print(&report.baselines);
    }
    let mut latency = Vec::new();
    for &medium in &media {
        for &spin in &modes {
            let policy = match (medium, spin) {
                (Medium::Udp, true) => {
                    "UDP over loopback; both sides busy-poll (non-blocking recv in a loop, never block)"
                }
                (Medium::Udp, false) => "UDP over loopback; both sides block in poll() at once (no spinning)",
                (Medium::Shm, true) => "shared memory; both sides spin on the slot's words (never block)",
                (Medium::Shm, false) => "shared memory; both sides sleep on futexes at once (no spinning)",
            };
            crate::progress::doing(&format!("latency {}", if medium == Medium::Udp { "udp" } else { "shm" }));
            outln!("\n{policy}; {calls} timed calls per row in {rounds} interleaved rounds, after 2,000 warm-up calls");
            let rows = measure(&args, medium, spin, calls, rounds, deadline)?;
            report.latency.push(print_table(&rows, medium, spin));
            latency.push((medium, spin, rows));
            crate::progress::step();
        }
    }
    if full {
        let cpu = args.server_cpu.to_string();
        let serve: Vec<String> =
            ["serve", "--addr", "udp://127.0.0.1:0", "--cpus", &cpu].iter().map(|s| s.to_string()).collect();
        let (server, addr) = spawn(&serve)?;
        let addr = addr.strip_prefix("udp://").unwrap_or(&addr).to_string();
        crate::progress::doing("Mach test list");
        report.mach = crate::tables::mach((server.0.id(), &addr), args.server_cpu, budget.mach_row)?;
        crate::progress::step();
        crate::progress::doing("Firefly Table I");
        report.firefly_table1 = crate::tables::firefly_table1(&addr, 10_000)?;
        crate::progress::step();
        drop(server);
        let (_spinning, addr) = serve_pinned(args.server_cpu, true)?;
        crate::progress::doing("Firefly Tables II-V");
        report.firefly_marshaling = crate::tables::firefly_marshaling(&addr, budget.marshal_calls)?;
        crate::progress::step();
        crate::progress::doing("Peregrine Table 1");
        report.peregrine.table1 = crate::peregrine::table1(args.server_cpu, budget.peregrine_row)?;
        for &medium in &media {
            let t = if medium == Medium::Udp { "udp" } else { "shm" };
            crate::progress::doing(&format!("Peregrine Tables 3 and 5 {t}"));
            crate::peregrine::table5(
                medium,
                &addr,
                args.server_cpu,
                budget.peregrine_row,
                &mut report.peregrine,
                crate::progress::step,
            )?;
        }
        crate::progress::step();
        for &medium in &media {
            let t = if medium == Medium::Udp { "udp" } else { "shm" };
            crate::progress::doing(&format!("load {t}"));
            let rows = crate::load::table(
                medium,
                &addr,
                args.client_cpu,
                LOAD_SERVICE_US,
                budget.load_row,
                crate::progress::step,
            )?;
            report.load.extend(rows);
        }
        drop(_spinning);
        let (accounts, _) =
            crate::explain::accounts(&media, &[true], budget.accounting_calls, args.client_cpu, args.server_cpu)?;
        report.breakdown = accounts;
    }
    crate::progress::finish();
    if let Some(dir) = &args.plot {
        for path in plots(dir, &latency, &report)? {
            outln!("wrote {}", path.display());
        }
    }
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(path, json).map_err(|e| format!("{}: {e}", path.display()))?;
        outln!("\nwrote {}", path.display());
    }
    Ok(())
}

/// Service time of the load table's calls, µs.
const LOAD_SERVICE_US: u32 = 50;

/// Writes the plots of `--plot`.
fn plots(
    dir: &std::path::Path,
    latency: &[(Medium, bool, Vec<Row>)],
    report: &Report,
) -> crate::Result<Vec<std::path::PathBuf>> {
    use crate::plot::{lines, Chart, Series};
    use plotters::prelude::SeriesLabelPosition;
    let mut written = Vec::new();
    for (medium, spin, rows) in latency {
        let t = if *medium == Medium::Udp { "udp" } else { "shm" };
        let w = if *spin { "spin" } else { "block" };
        let mut series = Vec::new();
        for r in rows.iter().filter(|r| matches!(r.name, "Null" | "MaxResult")) {
            series.push(Series { name: format!("tiercel {}", r.name), points: r.rpc.cdf() });
            series.push(Series { name: format!("raw, {} sizes", r.name), points: r.raw.cdf() });
        }
        let title = format!("Latency CDF to the 99th percentile, {t}, {w}: tiercel against the raw ping-pong");
        let chart = Chart {
            title: &title,
            x_desc: "µs",
            y_desc: "fraction of calls",
            log_y: false,
            legend: SeriesLabelPosition::LowerRight,
        };
        written.push(lines(dir, &format!("latency-{t}-{w}.svg"), &chart, &series)?);
    }
    if !report.firefly_table1.is_empty() {
        let mut series = Vec::new();
        for transport in ["shm, 2 processes", "UDP loopback"] {
            let points: Vec<(f64, f64)> = report
                .firefly_table1
                .iter()
                .filter(|r| r.transport == transport)
                .map(|r| (r.threads as f64, r.null_calls_per_second))
                .collect();
            series.push(Series { name: format!("Null, {transport}"), points });
        }
        let chart = Chart {
            title: "Firefly Table I: Null calls per second against caller threads",
            x_desc: "caller threads",
            y_desc: "calls/s (log scale)",
            log_y: true,
            legend: SeriesLabelPosition::MiddleRight,
        };
        written.push(lines(dir, "throughput.svg", &chart, &series)?);
    }
    if !report.load.is_empty() {
        let mut series = Vec::new();
        for t in ["udp", "shm"] {
            let rows: Vec<_> = report.load.iter().filter(|r| r.transport == t).collect();
            if rows.is_empty() {
                continue;
            }
            let line = |f: fn(&crate::load::Row) -> f64| rows.iter().map(|r| (r.utilization, f(r))).collect();
            series.push(Series { name: format!("{t} median"), points: line(|r| r.median_us) });
            series.push(Series { name: format!("{t} p99"), points: line(|r| r.p99_us) });
            series.push(Series { name: format!("{t} model s/(1-u)"), points: line(|r| r.model_us) });
        }
        let chart = Chart {
            title: "Response time against utilization (open-loop Poisson arrivals)",
            x_desc: "utilization of the server",
            y_desc: "µs (log scale)",
            log_y: true,
            legend: SeriesLabelPosition::UpperLeft,
        };
        written.push(lines(dir, "load.svg", &chart, &series)?);
    }
    if !report.breakdown.is_empty() {
        written.push(crate::plot::breakdown(dir, &report.breakdown)?);
    }
    Ok(written)
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
    let (_rpc_server, rpc_addr) = serve_pinned(args.server_cpu, spin)?;
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
        outln!("({warmup_lost} raw round trips lost a packet during the warm-up)");
    }
    let per_round = calls.div_ceil(rounds);
    let mut lost = 0u64;
    'rounds: for _ in 0..rounds {
        for (i, row) in rows.iter_mut().enumerate() {
            if Instant::now() > deadline {
                outln!("(time limit reached: rows hold fewer calls)");
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
        outln!("({lost} raw round trips lost a packet and were left out)");
    }
    let retransmissions = client.binding().stats().retransmissions.load(std::sync::atomic::Ordering::Relaxed);
    outln!("tiercel retransmissions during the run: {retransmissions}");
    Ok(rows)
}

fn print_table(rows: &[Row], medium: Medium, spin: bool) -> LatencyTable {
    outln!(
        "{:<10} {:>13} | {:>10} {:>10} | {:>10} {:>10} | {:>8} {:>8}",
        "procedure",
        "bytes c/r",
        "raw med",
        "raw p99",
        "rpc med",
        "rpc p99",
        "ratio",
        "p99 rat."
    );
    for r in rows {
        outln!(
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
    outln!("(median and p99 of {n} calls per cell; raw = {raw}, same CPUs, same waiting)");
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
