//! `tiercel bench`: every table of the seed papers, each against the raw mechanism beneath it
//! measured in the same run, with the same thread placement and the same waiting policy: over UDP
//! against a raw UDP ping-pong of the same packet sizes, through shared memory against a raw
//! shared-memory ping-pong (spinning) or futex ping-pong (blocking) of the same data sizes.

use std::time::{Duration, Instant};

use crate::harness::{serve_pinned, spawn, Medium};
use crate::latency::{measure, print_table, LatencyTable, Row};
use crate::progress::outln;

/// Options of `tiercel bench`.
#[derive(clap::Args)]
pub struct Args {
    /// Timed calls per row (after a warm-up), spread over several interleaved rounds: 50,000 by
    /// default, 10,000 with --quick, 1,000 with --smoke.
    #[arg(long)]
    calls: Option<u32>,
    /// A short run: 10,000 calls per row, shorter timed windows.
    #[arg(long)]
    quick: bool,
    /// A run that checks the harness, not the speed (what the tests run): --quick's tables with
    /// 1,000 calls per row and timed windows of 100 ms, too short for figures worth quoting.
    #[arg(long, conflicts_with = "quick")]
    smoke: bool,
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
    /// Transports to measure: `udp`, `shm`, `tcp`, `xdp` (comma-separated). TCP has the latency,
    /// async, tracing and blocking tables and Peregrine's Table 5; the other seeds' tables, the load
    /// table and the breakdowns are of UDP and shared memory. `xdp` is the table of AF_XDP against
    /// the kernel's UDP across two network namespaces (root), which a full run always has; alone,
    /// it is all the run measures.
    #[arg(long, default_value = "udp,shm,tcp")]
    transports: String,
    /// Only the latency tables against the raw baselines (skip the Mach list and Firefly Table I).
    #[arg(long)]
    latency_only: bool,
    /// Also measure tarpc, tonic and a raw tokio TCP echo beside tiercel (over UDP and TCP): Null and
    /// MaxResult latency, Null calls/s of 1, 2, 4 and 8 callers, CPU time per call.
    #[arg(long)]
    peers: bool,
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
    /// The commit, date and machine of the run (what `tiercel report` stamps its tables with).
    run: crate::report::Stamp,
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
    /// 1 MiB calls across two namespaces at 0%, 1% and 10% loss each way.
    pub loss: Vec<crate::loss::Row>,
    /// 1 MiB and 16 MiB calls across two namespaces against raw plain and segmented (GSO+GRO) streams.
    pub wide: Vec<crate::wide::Row>,
    /// The accounting of Null, BigIn and MaxResult per transport (as `tiercel explain` prints it, spinning).
    pub breakdown: Vec<crate::accounting::Account>,
    /// Async Null against the synchronous call and the raw ping-pong, per transport.
    pub asynch: Vec<crate::asynch::Row>,
    /// Null throughput of concurrent async tasks and of synchronous threads on one binding.
    pub async_throughput: Vec<crate::asynch::Throughput>,
    /// Null without and with a tracing subscriber, per transport.
    pub tracing: Vec<crate::traced::Row>,
    /// Null over UDP on the default server against servers of 1, 2 and 4 workers.
    pub workers: Vec<crate::workers::Row>,
    /// Calls of a procedure that sleeps 1 ms by 1 to 8 callers on one binding, per transport.
    pub blocking: Vec<crate::blocking::Row>,
    /// tiercel against tarpc, tonic and a raw tokio echo (`--peers`).
    pub peers: Vec<crate::peers::Row>,
    /// Plain against secure bindings over UDP (when UDP is measured).
    pub secure: Option<crate::secure::Json>,
    /// ONC RPC against rpcgen and libtirpc.
    pub onc: Option<crate::onc::Json>,
    /// Round trips across two namespaces through AF_XDP and through kernel UDP, and tiercel's Null.
    #[cfg(feature = "xdp")]
    pub xdp: Vec<crate::xdp::Row>,
}

/// How long each part of the run measures.
struct Budget {
    calls: u32,
    baseline_row: Duration,
    mach_row: Duration,
    marshal_calls: u32,
    peregrine_row: Duration,
    load_row: Duration,
    async_row: Duration,
    accounting_calls: u32,
    loss_calls: usize,
    wide_calls: u32,
}

/// Runs `tiercel bench`.
pub fn run(args: Args) -> crate::Result<()> {
    let budget = if args.smoke {
        Budget {
            calls: 1_000,
            baseline_row: Duration::from_millis(100),
            mach_row: Duration::from_millis(100),
            marshal_calls: 1_000,
            peregrine_row: Duration::from_millis(100),
            load_row: Duration::from_millis(100),
            async_row: Duration::from_millis(100),
            accounting_calls: 1_000,
            loss_calls: 10,
            wide_calls: 15,
        }
    } else if args.quick {
        Budget {
            calls: 10_000,
            baseline_row: Duration::from_millis(150),
            mach_row: Duration::from_millis(200),
            marshal_calls: 5_000,
            peregrine_row: Duration::from_millis(100),
            load_row: Duration::from_millis(300),
            async_row: Duration::from_millis(300),
            accounting_calls: 5_000,
            loss_calls: 10,
            wide_calls: 15,
        }
    } else {
        Budget {
            calls: 50_000,
            baseline_row: Duration::from_millis(1000),
            mach_row: Duration::from_millis(1000),
            marshal_calls: 50_000,
            peregrine_row: Duration::from_millis(400),
            load_row: Duration::from_millis(1500),
            async_row: Duration::from_millis(1000),
            accounting_calls: 20_000,
            loss_calls: 40,
            wide_calls: 40,
        }
    };
    let calls = args.calls.map_or(budget.calls, |n| n.max(100));
    let quick = args.quick || args.smoke;
    let rounds = args.rounds.max(1);
    let deadline = Instant::now() + Duration::from_secs(args.max_seconds);
    let mut modes = vec![true];
    if args.blocking || !quick {
        modes.push(false);
    }
    let mut media = Vec::new();
    // `xdp`: the AF_XDP table (which a full run always has).
    let mut xdp = false;
    for t in args.transports.split(',').map(str::trim) {
        media.push(match t {
            "udp" => Medium::Udp,
            "shm" => Medium::Shm,
            "tcp" => Medium::Tcp,
            "xdp" => {
                xdp = true;
                continue;
            }
            other => return Err(format!("unknown transport {other:?} (udp, shm, tcp, xdp)").into()),
        });
    }
    // The seeds' tables, load and breakdowns: UDP and shared memory (and Peregrine's Table 5 of
    // every transport measured).
    let seed_media: Vec<Medium> = media.iter().copied().filter(|m| *m != Medium::Tcp).collect();
    let table5_media: Vec<Medium> =
        [Medium::Udp, Medium::Shm, Medium::Tcp].into_iter().filter(|m| media.contains(m)).collect();
    tiercel_sys::cpu::pin_current_thread(args.client_cpu).map_err(crate::Error::from)?;
    let mut report = Report {
        run: crate::report::Stamp::now(),
        cpus: tiercel_sys::cpu::available(),
        client_cpu: args.client_cpu,
        server_cpu: args.server_cpu,
        ..Report::default()
    };
    outln!("tiercel bench: {} CPUs", tiercel_sys::cpu::available());
    outln!(
        "placement: caller thread pinned to CPU {}, server process (its workers, and its shared-memory binding \
         threads) pinned to CPU {}",
        args.client_cpu,
        args.server_cpu
    );
    let full = !args.latency_only;
    let xdp = cfg!(feature = "xdp") && (xdp || full);
    if media.is_empty() && xdp {
        // The AF_XDP table alone.
        crate::progress::start(1);
        #[cfg(feature = "xdp")]
        {
            crate::progress::doing("AF_XDP against kernel UDP");
            report.xdp = crate::xdp::table(args.server_cpu, 3, budget.mach_row)?;
        }
        crate::progress::finish();
        return write_json(&args, &report);
    }
    // Per medium of the seeds' tables; and a step per Table 5 row.
    let seeds = (seed_media.len() as u64) * (1 + crate::load::UTILIZATIONS.len() as u64 + 1);
    let table5_rows = (table5_media.len() as u64) * 12;
    crate::progress::start(
        (media.len() * modes.len() + media.len() + 4 + usize::from(args.peers)) as u64
            + if full { 7 + 3 + 1 + 1 + 1 + seeds + table5_rows } else { 0 }
            + u64::from(xdp),
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
                    "UDP over loopback; both sides busy-poll (non-blocking recv in a loop, never block; each caller first reads the clock, no system call, until 3/4 of its shortest recent round trip)"
                }
                (Medium::Udp, false) => "UDP over loopback; both sides block at once (no spinning): tiercel's caller in recv() (with a read timeout), its server in recv() after calls (for up to a tick of the kernel's clock, then in epoll_wait()), the raw ping-pong's two sides in recv() with the same read timeout (then in poll())",
                (Medium::Shm, true) => "shared memory; both sides spin on the slot's words (never block)",
                (Medium::Shm, false) => "shared memory; both sides sleep on futexes at once (no spinning)",
                (Medium::Tcp, true) => "TCP over loopback; both sides busy-poll (non-blocking read in a loop)",
                (Medium::Tcp, false) => "TCP over loopback; both sides block at once (no spinning): tiercel's caller in recv() (with a read timeout, then in poll()), its server in read() after calls (for up to a tick of the kernel's clock, then in poll()), the raw ping-pong's two sides in read() with the same read timeout (then in poll())",
            };
            crate::progress::doing(&format!("latency {}", medium.name()));
            outln!("\n{policy}; {calls} timed calls per row in {rounds} interleaved rounds, after 2,000 warm-up calls");
            let rows = measure(args.server_cpu, medium, spin, calls, rounds, deadline)?;
            report.latency.push(print_table(&rows, medium, spin));
            latency.push((medium, spin, rows));
            crate::progress::step();
        }
    }
    {
        let (_spinning, addr) = serve_pinned(args.server_cpu, true)?;
        for (medium, _, rows) in latency.iter().filter(|(_, spin, _)| *spin) {
            crate::progress::doing(&format!("async {}", medium.name()));
            let Some(null) = rows.iter().find(|r| r.name == "Null") else { continue };
            let (row, throughput) =
                crate::asynch::table(*medium, &addr, args.client_cpu, calls, rounds, &null.raw, budget.async_row)?;
            report.asynch.push(row);
            report.async_throughput.extend(throughput);
            crate::progress::step();
        }
        crate::asynch::print(&report.asynch, &report.async_throughput, rounds, calls, budget.async_row);
        drop(_spinning);
        crate::progress::doing("tracing");
        report.tracing = crate::traced::rows(&media, args.server_cpu, calls)?;
        crate::progress::step();
        crate::traced::print(&report.tracing, calls);
    }
    if latency.iter().any(|(m, spin, _)| *m == Medium::Udp && *spin) {
        crate::progress::doing("workers");
        report.workers = crate::workers::table(args.server_cpu, args.client_cpu, calls, rounds, budget.async_row)?;
        crate::workers::print(&report.workers, calls, rounds, budget.async_row);
    }
    crate::progress::step();
    if media.contains(&Medium::Udp) {
        crate::progress::doing("secure calls");
        let secure = crate::secure::table(args.server_cpu, calls, rounds, budget.async_row)?;
        crate::secure::print(&secure, calls, rounds);
        report.secure = Some(secure);
        crate::progress::doing("ONC RPC against C");
        let onc = crate::onc::table(args.server_cpu, args.client_cpu, calls, rounds)?;
        crate::onc::print(&onc, calls, rounds);
        report.onc = Some(onc);
    }
    crate::progress::step();
    crate::progress::doing("blocking procedures");
    report.blocking = crate::blocking::table(&media, args.client_cpu, budget.async_row)?;
    crate::blocking::print(&report.blocking, budget.async_row);
    crate::progress::step();
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
        crate::progress::doing("loss recovery");
        report.loss = crate::loss::table(args.server_cpu, budget.loss_calls, Duration::from_secs(90))?;
        crate::progress::step();
        crate::progress::doing("large calls across namespaces");
        report.wide = crate::wide::table(args.server_cpu, budget.wide_calls)?;
        crate::progress::step();
        let (_spinning, addr) = serve_pinned(args.server_cpu, true)?;
        crate::progress::doing("Firefly Tables II-V");
        report.firefly_marshaling = crate::tables::firefly_marshaling(&addr, budget.marshal_calls)?;
        crate::progress::step();
        crate::progress::doing("Peregrine Table 1");
        report.peregrine.table1 = crate::peregrine::table1(args.server_cpu, budget.peregrine_row)?;
        for &medium in &table5_media {
            let t = medium.name();
            crate::progress::doing(&format!("Peregrine Table 5 {t}"));
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
        for &medium in &seed_media {
            let t = medium.name();
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
        let (accounts, _) = crate::accounting::accounts(
            &seed_media,
            &[true],
            false,
            budget.accounting_calls,
            args.client_cpu,
            args.server_cpu,
        )?;
        report.breakdown = accounts;
    }
    #[cfg(feature = "xdp")]
    if xdp {
        crate::progress::doing("AF_XDP against kernel UDP");
        report.xdp = crate::xdp::table(args.server_cpu, 3, budget.mach_row)?;
        crate::progress::step();
    }
    if args.peers {
        crate::progress::doing("peers");
        report.peers = crate::peers::table(args.server_cpu, args.client_cpu, calls, budget.async_row, rounds)?;
        crate::peers::print(&report.peers, calls, budget.async_row, rounds);
        crate::progress::step();
    }
    crate::progress::finish();
    if let Some(dir) = &args.plot {
        for path in plots(dir, &latency, &report)? {
            outln!("wrote {}", path.display());
        }
    }
    write_json(&args, &report)
}

/// Writes `report` to the file of `--json`, if there is one.
fn write_json(args: &Args, report: &Report) -> crate::Result<()> {
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(report).map_err(crate::Error::from)?;
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
        let t = medium.name();
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
