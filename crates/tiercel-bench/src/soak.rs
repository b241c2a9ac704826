//! `tiercel soak`: many calls from several threads through a lossy, duplicating, reordering and
//! corrupting network, with a server that records every execution, checking that every call completes
//! or fails with a clear error, that no call body runs twice, and that every result is intact.

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tiercel::{ClientConfig, In, InOut, Out, Server, StatsHandle, Timing};
use tiercel_sys::faults::{self, FaultConfig};

use crate::harness::start;
use crate::netns;

/// Port of the soak server in the namespaces.
const PORT: u16 = 7474;

/// Options of `tiercel soak`.
#[derive(clap::Args, Clone)]
pub struct Args {
    /// Calls in all.
    #[arg(long, default_value_t = 100_000)]
    calls: u64,
    /// Caller threads.
    #[arg(long, default_value_t = 8)]
    threads: u64,
    /// Percent of UDP packets dropped (by nftables with --netns, else by the fault layer), each way.
    #[arg(long, default_value_t = 10.0)]
    loss: f64,
    /// Percent of packets duplicated by the fault layer, on both sides.
    #[arg(long, default_value_t = 5.0)]
    dup: f64,
    /// Percent of packets held back up to 2 ms (reordered) by the fault layer, on both sides.
    #[arg(long, default_value_t = 5.0)]
    reorder: f64,
    /// Percent of packets with a byte flipped by the fault layer (caught by the binding's checksum).
    #[arg(long, default_value_t = 1.0)]
    corrupt: f64,
    /// Every Nth call moves 100 KB each way (a multi-packet call and result).
    #[arg(long, default_value_t = 100)]
    big_every: u64,
    /// Seed of the fault layer.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Calls that may fail with an error before the soak fails: the network only loses,
    /// duplicates, delays and corrupts packets, and the client waits long enough to recover from
    /// all of it, so by default none may.
    #[arg(long, default_value_t = 0)]
    max_failed: u64,
    /// Run across two network namespaces joined by a veth pair, with nftables dropping packets
    /// (needs root, ip and nft); otherwise on loopback with the fault layer dropping them.
    #[arg(long)]
    netns: bool,
    /// UDP sockets the server reads its port through (`ServerConfig::sockets`): with several, the
    /// callers' sockets are spread over them and over the workers reading each.
    #[arg(long, default_value_t = tiercel::ServerConfig::default().sockets)]
    sockets: usize,
    /// Run only the client part against this server (used by --netns).
    #[arg(long, hide = true)]
    addr: Option<String>,
}

/// Options of the `soak-server` helper role.
#[derive(clap::Args)]
pub struct ServerArgs {
    #[arg(long, default_value = "udp://127.0.0.1:0")]
    addr: String,
    /// UDP sockets on the port (`ServerConfig::sockets`).
    #[arg(long, default_value_t = tiercel::ServerConfig::default().sockets)]
    sockets: usize,
    /// Exit after this many seconds whatever happens.
    #[arg(long, default_value_t = 1800)]
    max_seconds: u64,
}

/// What the server knows at the end of a soak.
#[derive(tiercel::Wire, Debug, Default, Clone)]
pub struct LedgerReport {
    /// Procedure bodies run.
    pub executions: u64,
    /// Distinct call ids run.
    pub distinct: u64,
    /// Call ids whose body ran more than once (must be 0).
    pub ran_twice: u64,
    /// Duplicate call packets answered from saved state.
    pub duplicates: u64,
    /// Result fragments resent.
    pub resent: u64,
    /// Packets dropped as malformed or corrupt.
    pub malformed: u64,
    /// Calls refused as busy.
    pub busy: u64,
    /// Peak resident memory of the server, KiB.
    pub peak_rss_kib: u64,
    /// Faults the server's layer injected: dropped, duplicated, delayed, corrupted.
    pub faults: (u64, u64, u64, u64),
}

/// The soak's counter service.
#[tiercel::interface]
pub trait Ledger {
    /// Records one execution of call `id`; returns a checksum of `data` and fills `out` with the
    /// call's pattern.
    fn record(&self, id: u64, data: In<&[u8]>, out: Out<&mut [u8]>) -> u64;
    /// Records one execution of call `id`; returns a checksum of `both` and changes each of its
    /// bytes by the call's pattern (its one buffer, last: run where the call arrived, and its
    /// result received into the caller's buffer).
    fn stamp(&self, id: u64, both: InOut<&mut [u8]>) -> u64;
    /// What the server has seen.
    fn report(&self) -> LedgerReport;
}

struct LedgerImpl {
    runs: Mutex<HashMap<u64, u32>>,
}

fn sum(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

fn pattern(id: u64, i: usize) -> u8 {
    (id as u8).wrapping_add((i as u8).wrapping_mul(13))
}

impl Ledger for LedgerImpl {
    fn record(&self, id: u64, data: In<&[u8]>, out: Out<&mut [u8]>) -> u64 {
        *self.runs.lock().unwrap_or_else(|p| p.into_inner()).entry(id).or_default() += 1;
        for (i, b) in out.0.iter_mut().enumerate() {
            *b = pattern(id, i);
        }
        sum(data.0)
    }

    fn stamp(&self, id: u64, both: InOut<&mut [u8]>) -> u64 {
        *self.runs.lock().unwrap_or_else(|p| p.into_inner()).entry(id).or_default() += 1;
        let s = sum(both.0);
        for (i, b) in both.0.iter_mut().enumerate() {
            *b ^= pattern(id, i);
        }
        s
    }

    fn report(&self) -> LedgerReport {
        let runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        let s = STATS.get().map(StatsHandle::get).unwrap_or_default();
        LedgerReport {
            executions: runs.values().map(|&n| n as u64).sum(),
            distinct: runs.len() as u64,
            ran_twice: runs.values().filter(|&&n| n > 1).count() as u64,
            duplicates: s.duplicates,
            resent: s.resent,
            malformed: s.malformed,
            busy: s.busy,
            peak_rss_kib: crate::peak_rss_kib(),
            faults: fault_counts(),
        }
    }
}

fn fault_counts() -> (u64, u64, u64, u64) {
    faults::counts()
        .map(|c| {
            let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
            (l(&c.dropped), l(&c.duplicated), l(&c.delayed), l(&c.corrupted))
        })
        .unwrap_or_default()
}

fn fault_config(args: &Args, with_loss: bool) -> FaultConfig {
    FaultConfig {
        loss: if with_loss { args.loss / 100.0 } else { 0.0 },
        dup: args.dup / 100.0,
        reorder: args.reorder / 100.0,
        delay: Duration::from_millis(2),
        corrupt: args.corrupt / 100.0,
        seed: args.seed,
    }
}

fn fault_env(c: &FaultConfig) -> String {
    format!(
        "loss={},dup={},reorder={},delay_us={},corrupt={},seed={}",
        c.loss,
        c.dup,
        c.reorder,
        c.delay.as_micros(),
        c.corrupt,
        c.seed.wrapping_add(1)
    )
}

pub fn server(args: ServerArgs) -> crate::Result<()> {
    let ledger = LedgerImpl { runs: Mutex::new(HashMap::new()) };
    let config = tiercel::ServerConfig { sockets: args.sockets, ..tiercel::ServerConfig::default() };
    let server = Server::bind(args.addr.as_str())
        .map_err(crate::Error::from)?
        .with_config(config)
        .export(LedgerServer::new(ledger))
        .start()
        .map_err(crate::Error::from)?;
    let _ = writeln!(std::io::stdout(), "listening udp://{}", server.addr());
    let _ = std::io::stdout().flush();
    // The ledger reports the server's counters too.
    STATS.get_or_init(|| server.stats_handle());
    std::thread::sleep(Duration::from_secs(args.max_seconds));
    Ok(())
}

/// The soak server's counters, for the ledger's report.
static STATS: OnceLock<StatsHandle> = OnceLock::new();

/// Runs `tiercel soak`.
pub fn run(args: Args) -> crate::Result<()> {
    if let Some(addr) = &args.addr {
        return client(&args, addr);
    }
    if args.netns {
        let pair = netns::Pair::new(PORT, args.loss)?;
        let server_addr = format!("udp://{}:{PORT}", netns::SERVER_IP);
        let faults = fault_env(&fault_config(&args, false));
        let (_server, addr) = start(
            crate::helpers::command_in_namespace(&pair.b)?
                .args(["soak-server", "--addr", &server_addr, "--sockets", &args.sockets.to_string()])
                .env("TIERCEL_FAULTS", &faults),
        )?;
        let mut client = crate::helpers::command_in_namespace(&pair.a)?;
        client.arg("soak").args(
            [
                "--addr",
                &addr,
                "--calls",
                &args.calls.to_string(),
                "--threads",
                &args.threads.to_string(),
                "--loss",
                "0",
                "--dup",
                &args.dup.to_string(),
                "--reorder",
                &args.reorder.to_string(),
                "--corrupt",
                &args.corrupt.to_string(),
                "--big-every",
                &args.big_every.to_string(),
                "--seed",
                &args.seed.to_string(),
                "--max-failed",
                &args.max_failed.to_string(),
            ]
            .map(String::from),
        );
        println!(
            "soak across namespaces {} (client) and {} (server, {} UDP sockets): nftables drops {}% of UDP each way",
            pair.a, pair.b, args.sockets, args.loss
        );
        let status = client.status()?;
        drop(pair);
        return if status.success() { Ok(()) } else { Err("soak failed".into()) };
    }
    let faults = fault_env(&fault_config(&args, true));
    let (_server, addr) = start(
        crate::helpers::command()?
            .args(["soak-server", "--addr", "udp://127.0.0.1:0", "--sockets", &args.sockets.to_string()])
            .env("TIERCEL_FAULTS", &faults),
    )?;
    println!(
        "soak on loopback (server: {} UDP sockets): the fault layer drops {}% of packets on both sides",
        args.sockets, args.loss
    );
    client(&args, &addr)
}

#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    failed: Mutex<HashMap<String, u64>>,
    wrong: AtomicU64,
}

fn client(args: &Args, addr: &str) -> crate::Result<()> {
    faults::install(fault_config(args, true));
    let timing = Timing { dead_after: Duration::from_secs(10), ..Timing::default() };
    let config = ClientConfig { timing, checksum: true, ..ClientConfig::default() };
    let ledger: LedgerClient = crate::harness::import(addr, config)?;
    let tally = Arc::new(Tally::default());
    let start = Instant::now();
    let per_thread = args.calls.div_ceil(args.threads.max(1));
    let threads: Vec<_> = (0..args.threads.max(1))
        .map(|t| {
            let (ledger, tally, big_every) = (ledger.clone(), tally.clone(), args.big_every.max(1));
            std::thread::spawn(move || {
                let mut data = vec![0u8; 100_000];
                let mut out = vec![0u8; 100_000];
                for i in 0..per_thread {
                    let id = (t << 40) | i;
                    let n = if i % big_every == big_every - 1 { 100_000 } else { 64 };
                    for (k, b) in data[..n].iter_mut().enumerate() {
                        *b = (id as u8) ^ (k as u8);
                    }
                    // Every other large call lends its buffer (an InOut) rather than sending one
                    // and receiving another.
                    let lend = n > 64 && (i / big_every) % 2 == 1;
                    let called = if lend {
                        out[..n].copy_from_slice(&data[..n]);
                        ledger.stamp(id, InOut(&mut out[..n]))
                    } else {
                        ledger.record(id, In(&data[..n]), Out(&mut out[..n]))
                    };
                    match called {
                        Ok(s) => {
                            let back = |k: usize| if lend { data[k] ^ pattern(id, k) } else { pattern(id, k) };
                            let intact =
                                s == sum(&data[..n]) && out[..n].iter().enumerate().all(|(k, &b)| b == back(k));
                            if intact {
                                tally.ok.fetch_add(1, Ordering::Relaxed);
                            } else {
                                tally.wrong.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Err(e) => {
                            let kind = format!("{e} [{:?}]", e.execution());
                            *tally.failed.lock().unwrap_or_else(|p| p.into_inner()).entry(kind).or_default() += 1;
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| "a soak thread panicked")?;
    }
    let elapsed = start.elapsed();
    let report = ledger.report().map_err(|e| format!("report: {e}"))?;
    let ok = tally.ok.load(Ordering::Relaxed);
    let wrong = tally.wrong.load(Ordering::Relaxed);
    let failed = tally.failed.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let failed_total: u64 = failed.values().sum();
    let stats = ledger.binding().stats();
    let (fd, fu, fr, fc) = fault_counts();
    println!("calls:                 {} in {:.1} s from {} threads", args.calls, elapsed.as_secs_f64(), args.threads);
    println!("returned intact:       {ok}");
    println!("returned wrong:        {wrong}");
    println!("failed with an error:  {failed_total} (at most {} allowed)", args.max_failed);
    for (kind, n) in &failed {
        println!("    {n:>8}  {kind}");
    }
    println!("client retransmissions {}", stats.retransmissions);
    println!("client stale packets   {}", stats.stale);
    println!("client corrupt dropped {}", stats.malformed);
    let (in_place, lent) = (stats.in_place, stats.lent_fragments);
    println!("client results received into the lent buffer {in_place} ({lent} fragments straight there)");
    println!("client faults injected dropped {fd}, duplicated {fu}, delayed {fr}, corrupted {fc}");
    let (sd, su, sr, sc) = report.faults;
    println!("server faults injected dropped {sd}, duplicated {su}, delayed {sr}, corrupted {sc}");
    println!(
        "server executions      {} of {} distinct calls; ran twice: {}",
        report.executions, report.distinct, report.ran_twice
    );
    println!("server duplicates suppressed {}, result fragments resent {}", report.duplicates, report.resent);
    println!("server malformed/corrupt dropped {}, busy refusals {}", report.malformed, report.busy);
    println!(
        "peak memory            client {} MiB, server {} MiB",
        crate::peak_rss_kib() / 1024,
        report.peak_rss_kib / 1024
    );
    let mut problems = Vec::new();
    if report.ran_twice > 0 {
        problems.push(format!("{} calls ran twice", report.ran_twice));
    }
    if wrong > 0 {
        problems.push(format!("{wrong} results were wrong"));
    }
    if args.big_every <= per_thread / 2 && in_place == 0 {
        problems.push("no large result was received into the buffer its caller lent".into());
    }
    if failed_total > args.max_failed {
        problems.push(format!("{failed_total} calls failed, more than the {} allowed", args.max_failed));
    }
    if ok + wrong + failed_total != args.threads.max(1) * per_thread {
        problems.push("some calls neither returned nor failed".into());
    }
    // A call that failed may or may not have run.
    if report.distinct < ok || report.distinct > ok + failed_total {
        problems
            .push(format!("server ran {} distinct calls for {ok} returned and {failed_total} failed", report.distinct));
    }
    if problems.is_empty() {
        println!(
            "soak passed: every call returned intact or failed with an error ({failed_total}, at most {} allowed); \
             none ran twice",
            args.max_failed
        );
        Ok(())
    } else {
        Err(problems.join("; ").into())
    }
}
