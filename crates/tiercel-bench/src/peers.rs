//! `tiercel bench --peers`: tiercel against the RPC systems a user would pick instead (tarpc, tonic
//! plain and over TLS),
//! a raw tokio TCP echo, and the raw UDP echo beneath tiercel's UDP, in the same run, with the same
//! pinning and the same process split: each server in a process of its own pinned to the server CPU
//! (the peers on tokio's default multi-thread runtime, whose workers inherit the pinning), each
//! client in this process on the caller's CPU. The same workloads for every system: one caller's Null
//! and MaxResult (1440 bytes) latency, then Null calls per second of 1, 2, 4 and 8 callers on one
//! binding, client, or channel (tiercel's callers are threads, and in its `async` rows tasks of the
//! peers' runtime calling through its async client; the peers' are tasks of their runtime, as their
//! users write them; the echoes' callers each have a connection or socket), with the CPU
//! time both processes spent per call. tiercel runs with its default settings, over UDP and over TCP,
//! and again with spinning off on both sides (`block` rows: the client `Spin::Never`, the server
//! spinning 0 µs), against raw UDP and TCP ping-pongs that block on both sides, as the peers do
//! between calls.
//!
//! The peers are the `peers` feature (on by default, and in the `tiercel` command): without it
//! (tiercel's own tests build this crate so, under sanitizers too) `--peers` says so and measures
//! nothing.
#![cfg_attr(not(feature = "peers"), allow(dead_code, unused_imports))]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tiercel::Out;
#[cfg(feature = "peers")]
use tiercel_peers::{Caller, Client, Peer};
use tiercel_sys::cpu;

use crate::harness::spawn;
use crate::progress::outln;
use crate::raw::{AsyncPingPong, PingPong};
use crate::raw_tcp::{SharedTcp, TcpPingPong};
use crate::seeds::{TestAsyncClient, TestClient};
use crate::summary::Summary;
use crate::syscalls::{Counter, Probes};

/// Callers of the throughput rows.
pub const CALLERS: [u32; 4] = [1, 2, 4, 8];
/// Rounds of the latency rows: each system's calls are timed in this many shares, every system in
/// turn in each round.
pub const LATENCY_ROUNDS: u32 = 40;
/// MaxResult's result, as in Firefly Table I.
const MAX_RESULT: u32 = 1440;

/// One system's row, for `--json`.
#[derive(serde::Serialize)]
pub struct Row {
    pub system: String,
    pub null_median_us: f64,
    pub null_p99_us: f64,
    pub max_result_median_us: f64,
    pub max_result_p99_us: f64,
    pub load: Vec<Load>,
}

/// Null throughput of some callers.
#[derive(Clone, serde::Serialize)]
pub struct Load {
    pub callers: u32,
    pub calls_per_second: f64,
    /// User and system time of the client process per call, µs.
    pub client_cpu_us: f64,
    /// User and system time of the server process per call, µs.
    pub server_cpu_us: f64,
    /// System calls of the client process per call (`None`: perf could not count them).
    pub client_syscalls: Option<f64>,
    /// System calls of the server process per call.
    pub server_syscalls: Option<f64>,
    /// Heap allocations (allocator calls) of the client process per call.
    pub client_allocations: Option<f64>,
    /// Heap allocations of the server process per call.
    pub server_allocations: Option<f64>,
}

/// Options of the `peer-serve` helper role.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// `tarpc`, `tonic`, `tonic-tls` or `echo`.
    #[arg(long)]
    peer: String,
    /// CPU to pin to (the runtime's threads inherit it).
    #[arg(long)]
    cpu: usize,
}

/// Why `--peers` measures nothing in a build without the `peers` feature.
#[cfg(not(feature = "peers"))]
const WITHOUT_PEERS: &str = "this build of tiercel-bench has no peers (its `peers` feature is off)";

/// The `peer-serve` helper without the peers: there is none to serve.
#[cfg(not(feature = "peers"))]
pub fn serve(_: ServeArgs) -> crate::Result<()> {
    Err(WITHOUT_PEERS.into())
}

/// Without the peers, nothing to measure them against.
#[cfg(not(feature = "peers"))]
pub fn table(_: usize, _: usize, _: u32, _: Duration, _: u32) -> crate::Result<Vec<Row>> {
    Err(WITHOUT_PEERS.into())
}

/// The `peer-serve` helper: serves a peer on loopback until killed.
#[cfg(feature = "peers")]
pub fn serve(args: ServeArgs) -> crate::Result<()> {
    let peer = Peer::from_name(&args.peer).ok_or_else(|| format!("no peer {:?}", args.peer))?;
    cpu::pin_current_thread(args.cpu)?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    println!("listening {}", listener.local_addr()?);
    tiercel_peers::serve(peer, listener).map_err(|e| e.to_string())?;
    Ok(())
}

/// Measures tiercel (UDP and TCP) and every peer. `calls`: timed calls per latency row; `time`: how
/// long each throughput window runs. Every server runs from the start to the end: the latency rows
/// are measured in [`LATENCY_ROUNDS`] rounds, each of which times a share of every system's calls
/// in turn (after 2,000 warm-up Nulls in the first round, 100 in the others), then the throughput rows in
/// `rounds` rounds, each of which measures every system at 1, 2, 4 and 8 callers in turn, so that
/// drift of the machine hits them alike, each round in another order (`window_order`); a latency
/// row's figures are of all its calls, a throughput row's its median window's (system calls and
/// allocations are counted in the last round's, where perf can count them).
#[cfg(feature = "peers")]
pub fn table(server_cpu: usize, client_cpu: usize, calls: u32, time: Duration, rounds: u32) -> crate::Result<Vec<Row>> {
    // The allocator uprobes, added for the run and removed when it ends.
    let probes = Probes::add();
    let cpu_arg = server_cpu.to_string();
    let serve: Vec<String> = ["serve", "--addr", "udp://127.0.0.1:0", "--cpus", &cpu_arg, "--no-shared-memory"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let (tiercel_server, addr) = spawn(&serve)?;
    let addr = addr.strip_prefix("udp://").unwrap_or(&addr).to_string();
    let mut systems = Vec::new();
    for (name, scheme) in [("tiercel udp", "udp://"), ("tiercel tcp", "tcp://")] {
        let client: TestClient = crate::harness::import(format!("{scheme}{addr}"), tiercel::ClientConfig::default())?;
        systems.push((name.to_string(), tiercel_server.0.id(), System::Tiercel(client)));
    }
    // The same server called as a tokio application calls it: the async client's tasks, on the
    // runtime the peers' callers run on.
    for (name, scheme) in [("tiercel udp async", "udp://"), ("tiercel tcp async", "tcp://")] {
        let client: TestClient = crate::harness::import(format!("{scheme}{addr}"), tiercel::ClientConfig::default())?;
        systems.push((name.to_string(), tiercel_server.0.id(), System::TiercelAsync(client.to_async())));
    }
    let (raw_server, raw_addr) = crate::harness::spinning_echo(server_cpu)?;
    systems.push(("raw udp echo".to_string(), raw_server.0.id(), System::RawUdp(raw_addr, RawWait::Spin)));
    systems.push(("raw udp yield".to_string(), raw_server.0.id(), System::RawUdp(raw_addr, RawWait::Yield)));
    // Beneath the threads of a tiercel binding beyond its first, which share a socket and send
    // their calls together: callers sharing one socket, and an echo that answers runs as runs.
    let (raw_runs, raw_runs_addr) =
        spawn(&["raw-echo", "--cpu", &cpu_arg, "--spin", "--gro", "--runs"].map(String::from))?;
    let raw_runs_addr = crate::harness::udp_addr(&raw_runs_addr)?;
    systems.push(("raw udp batch".to_string(), raw_runs.0.id(), System::RawUdp(raw_runs_addr, RawWait::Batch)));
    // Beneath tiercel's async calls: callers that are tasks of the same runtime, with a socket each,
    // waiting as tiercel's async calls wait.
    systems.push(("raw udp async".to_string(), raw_server.0.id(), System::RawUdpAsync(raw_addr)));
    // Nobody spins: tiercel's client and server, and the raw echoes of the floor beneath them.
    let (blocking_server, blocking_addr) = spawn(&[serve.as_slice(), &["--spin-us".into(), "0".into()]].concat())?;
    let blocking_addr = blocking_addr.strip_prefix("udp://").unwrap_or(&blocking_addr).to_string();
    for (name, scheme) in [("tiercel udp block", "udp://"), ("tiercel tcp block", "tcp://")] {
        let config = tiercel::ClientConfig { spin: tiercel::Spin::Never, ..tiercel::ClientConfig::default() };
        let client: TestClient = crate::harness::import(format!("{scheme}{blocking_addr}"), config)?;
        systems.push((name.to_string(), blocking_server.0.id(), System::Tiercel(client)));
    }
    let (raw_blocking, raw_blocking_addr) =
        spawn(&["raw-echo".into(), "--cpu".into(), cpu_arg.clone(), "--drain".into()])?;
    let raw_blocking_addr = crate::harness::udp_addr(&raw_blocking_addr)?;
    systems.push(("raw udp block".to_string(), raw_blocking.0.id(), System::RawUdp(raw_blocking_addr, RawWait::Block)));
    let (raw_tcp, raw_tcp_addr) = spawn(&["raw-tcp-echo".into(), "--cpu".into(), cpu_arg.clone()])?;
    let raw_tcp_addr = crate::harness::udp_addr(&raw_tcp_addr)?;
    systems.push(("raw tcp block".to_string(), raw_tcp.0.id(), System::RawTcp(raw_tcp_addr)));
    // Beneath several threads of a blocking tiercel TCP binding, which share its connection:
    // callers sharing one connection to an echo that answers what came together with one write.
    let (raw_tcp_shared, raw_tcp_shared_addr) =
        spawn(&["raw-tcp-echo".into(), "--cpu".into(), cpu_arg.clone(), "--shared".into()])?;
    let raw_tcp_shared_addr = crate::harness::udp_addr(&raw_tcp_shared_addr)?;
    systems.push((
        "raw tcp shared block".to_string(),
        raw_tcp_shared.0.id(),
        System::RawTcpShared(raw_tcp_shared_addr),
    ));
    // The peers' clients run on tokio's default runtime, its workers pinned with this thread.
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let mut peer_servers = Vec::new();
    for peer in Peer::ALL {
        let args: Vec<String> =
            ["peer-serve", "--peer", peer.key(), "--cpu", &cpu_arg].iter().map(|s| s.to_string()).collect();
        let (server, addr) = spawn(&args)?;
        let addr: std::net::SocketAddr = addr.parse().map_err(|e| format!("peer address {addr:?}: {e}"))?;
        let client = rt.block_on(Client::connect(peer, addr)).map_err(|e| e.to_string())?;
        systems.push((peer.name().to_string(), server.0.id(), System::Peer(peer, client)));
        peer_servers.push(server);
    }
    // The latency rows in short rounds, every system in turn in each, so that a floor and the
    // system above it meet the same moments of the machine: a blocking round trip's median drifts
    // from 65 to 85 µs from one 0.2-s stretch to the next on our VM, and in 5 rounds tiercel's
    // blocking TCP Null came out under its floor in three runs of three, in 40 over it in both.
    let rounds = rounds.max(1);
    let latency_rounds = LATENCY_ROUNDS.min(calls.max(1));
    let mut latency: Vec<(Summary, Summary)> = systems.iter().map(|_| (Summary::new(), Summary::new())).collect();
    for round in 0..latency_rounds {
        let share = calls / latency_rounds + u32::from(round < calls % latency_rounds);
        let warm = if round == 0 { 2_000 } else { 100 };
        for ((_, _, system), (null, max)) in systems.iter().zip(&mut latency) {
            // The server measured before this one spins on past its last call (tiercel's for 1 ms,
            // the raw echoes' for 2) on the CPU this one needs: it is let go quiet first. Without
            // the pause the raw UDP echo, measured after tiercel's async TCP calls, could meet
            // tiercel's server still spinning, and tiercel's lone UDP Null came out under it in one
            // run.
            std::thread::sleep(crate::latency::QUIET);
            let (n, m) = system.latency(&rt, share, warm)?;
            null.add(&n);
            max.add(&m);
        }
    }
    let mut rows = Vec::new();
    for ((name, _, _), (null, max)) in systems.iter().zip(latency) {
        rows.push(Row {
            system: name.clone(),
            null_median_us: null.median_us(),
            null_p99_us: null.p99_us(),
            max_result_median_us: max.median_us(),
            max_result_p99_us: max.p99_us(),
            load: Vec::new(),
        });
    }
    let mut windows: Vec<Vec<Vec<Load>>> = (0..systems.len()).map(|_| vec![Vec::new(); CALLERS.len()]).collect();
    for round in 0..rounds {
        let counted = round + 1 == rounds;
        for (k, callers) in CALLERS.into_iter().enumerate() {
            for i in window_order(systems.len(), round) {
                let (_, server, system) = &systems[i];
                let measure = |done: &AtomicU64| window(*server, done, time, callers, &probes, counted);
                windows[i][k].push(system.load(&rt, callers, client_cpu, measure)?);
            }
        }
    }
    for (row, windows) in rows.iter_mut().zip(windows) {
        row.load = windows.into_iter().map(median_window).collect();
    }
    drop(systems);
    drop((tiercel_server, raw_server, peer_servers, blocking_server, raw_blocking, raw_tcp, raw_tcp_shared));
    Ok(rows)
}

/// The order in which round `round` measures the throughput windows of `n` systems: every one
/// once, each round after a different one where it can. On our VM a window's figure depends on
/// the window before it: in windows taken in turn, the raw shared TCP floor made 28,664–34,539 calls a second at two callers after a window
/// of its own kind and 37,603–44,301 after one of tiercel's (README). Round `r` steps through the
/// systems `r + 1` at a time from the start (a permutation whenever `r + 1` shares no factor with
/// `n`; else it steps by one, as round 0 does), so that a system's window follows the one `r + 1`
/// before it in the list.
#[cfg(feature = "peers")]
fn window_order(n: usize, round: u32) -> impl Iterator<Item = usize> {
    let step = round as usize % n.max(1) + 1;
    let step = if gcd(step, n) == 1 { step } else { 1 };
    (0..n).map(move |i| i * step % n.max(1))
}

#[cfg(feature = "peers")]
fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[cfg(all(test, feature = "peers"))]
mod order_tests {
    use super::window_order;

    #[test]
    fn each_round_measures_every_system_once_and_most_after_another_than_the_round_before() {
        for n in [1, 2, 16, 17] {
            for round in 0..5 {
                let mut order: Vec<_> = window_order(n, round).collect();
                order.sort_unstable();
                assert_eq!(order, (0..n).collect::<Vec<_>>(), "{n} systems, round {round}");
            }
        }
        // Seventeen systems (the peers table's): round r measures each after the one r + 1 before it.
        for round in 0..5u32 {
            let order: Vec<_> = window_order(17, round).collect();
            for pair in order.windows(2) {
                assert_eq!((pair[1] + 17 - pair[0]) % 17, round as usize + 1);
            }
        }
        // Sixteen: steps that share a factor with it fall back to one.
        assert_eq!(window_order(16, 1).take(3).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(window_order(16, 2).take(3).collect::<Vec<_>>(), vec![0, 3, 6]);
    }
}

/// A system measured, with what its callers call.
#[cfg(feature = "peers")]
enum System {
    Tiercel(TestClient),
    /// tiercel's async client: its callers are tasks of the peers' runtime.
    TiercelAsync(TestAsyncClient),
    /// A raw UDP echo's address, and how its callers wait.
    RawUdp(std::net::SocketAddr, RawWait),
    /// A raw UDP echo's address, its callers tasks of the peers' runtime ([`crate::raw::AsyncPingPong`]).
    RawUdpAsync(std::net::SocketAddr),
    /// A raw TCP echo's address (`raw-tcp-echo`, blocking in its reads), its callers blocking too.
    RawTcp(std::net::SocketAddr),
    /// A raw TCP echo's address (`raw-tcp-echo --shared`), its callers sharing one connection
    /// ([`crate::raw_tcp::SharedTcp`]), blocking.
    RawTcpShared(std::net::SocketAddr),
    Peer(Peer, Client),
}

/// How the callers of a raw UDP echo wait for its answer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum RawWait {
    /// One caller spins, as tiercel's does; several block in their receives.
    Spin,
    /// Every caller spins, yielding the CPU between looks, as tiercel's callers do beside one
    /// another.
    Yield,
    /// Several callers share one socket and send their requests together, yielding the CPU
    /// between looks, as the threads of a tiercel binding beyond its first do ([`crate::raw::Batched`]),
    /// against an echo that answers each run of requests as one run (`raw-echo --gro --runs`).
    Batch,
    /// Every caller blocks in its receive (several after a yield of the CPU and a look that does
    /// not block, as tiercel's blocking callers do), against an echo that blocks too, answers the
    /// requests that queued meanwhile in batches and looks ten times before it blocks again
    /// (`raw-echo --drain`), as tiercel's server takes what queued and looks before it waits.
    Block,
}

#[cfg(feature = "peers")]
impl System {
    /// One caller's Null and MaxResult latency: `calls` of each, alternating, after `warm` Nulls.
    fn latency(&self, rt: &tokio::runtime::Runtime, calls: u32, warm: u32) -> crate::Result<(Summary, Summary)> {
        match self {
            System::Tiercel(client) => tiercel_latency(client, calls, warm),
            System::TiercelAsync(client) => tiercel_async_latency(rt, client, calls, warm),
            System::RawUdp(addr, wait) => raw_udp_latency(*addr, calls, warm, *wait != RawWait::Block),
            System::RawUdpAsync(addr) => raw_udp_async_latency(rt, *addr, calls, warm),
            System::RawTcp(addr) => raw_tcp_latency(*addr, calls, warm),
            System::RawTcpShared(addr) => raw_tcp_shared_latency(*addr, calls, warm),
            System::Peer(peer, client) => peer_latency(*peer, rt, client, calls, warm),
        }
    }

    /// Runs `measure` while `callers` callers make Null calls without pause, counting them.
    fn load(
        &self,
        rt: &tokio::runtime::Runtime,
        callers: u32,
        client_cpu: usize,
        measure: impl FnOnce(&AtomicU64) -> Load,
    ) -> crate::Result<Load> {
        match self {
            System::Tiercel(client) => crate::asynch::callers(client, callers, client_cpu, measure),
            System::TiercelAsync(client) => tiercel_async_load(rt, client, callers, measure),
            System::RawUdp(addr, wait) => raw_udp_load(*addr, callers, *wait, client_cpu, measure),
            System::RawUdpAsync(addr) => raw_udp_async_load(rt, *addr, callers, measure),
            System::RawTcp(addr) => raw_tcp_load(*addr, callers, client_cpu, measure),
            System::RawTcpShared(addr) => raw_tcp_shared_load(*addr, callers, client_cpu, measure),
            System::Peer(peer, client) => peer_load(*peer, rt, client, callers, measure),
        }
    }
}

/// The window of median calls per second among a row's, with the system calls and allocations of
/// the one where they were counted.
fn median_window(mut windows: Vec<Load>) -> Load {
    windows.sort_by(|a, b| a.calls_per_second.total_cmp(&b.calls_per_second));
    let counted = windows.iter().find(|w| w.client_syscalls.is_some() || w.server_syscalls.is_some()).cloned();
    let mut median = windows.swap_remove(windows.len() / 2);
    if let Some(c) = counted {
        median.client_syscalls = c.client_syscalls;
        median.server_syscalls = c.server_syscalls;
        median.client_allocations = c.client_allocations;
        median.server_allocations = c.server_allocations;
    }
    median
}

/// CPU time of this process and of `server` so far, both to the nanosecond (a smoke run's windows
/// are too short for `/proc`'s ticks of 10 ms).
fn cpu_now(server: u32) -> (Duration, Duration) {
    let (u, s) = cpu::process_times();
    (u + s, cpu::other_process_cpu(server).unwrap_or_default())
}

/// Counts the calls in `done` for `time`, with the CPU time of both processes meanwhile; then, if
/// `counted` and where perf can count them, the system calls of both processes per call in a second
/// window as long (a counted system call costs more, so the first window's figures are left
/// untouched by it).
fn window(server: u32, done: &AtomicU64, time: Duration, callers: u32, probes: &Probes, counted: bool) -> Load {
    let (before, n0, start) = (cpu_now(server), done.load(Ordering::Relaxed), Instant::now());
    std::thread::sleep(time);
    let (after, n1, elapsed) = (cpu_now(server), done.load(Ordering::Relaxed), start.elapsed());
    let calls = (n1 - n0).max(1) as f64;
    let per_call = |d: Duration| d.as_secs_f64() * 1e6 / calls;
    let mut counts = if counted { count(server, done, time, probes) } else { [None, None] };
    if counts.iter().any(Option::is_none) && counts.iter().any(Option::is_some) {
        // perf counted one process and not the other (it failed to attach or to answer in time):
        // the window is counted once more rather than left without its figure.
        counts = count(server, done, time, probes);
    }
    let [client, server] = counts;
    Load {
        callers,
        calls_per_second: (n1 - n0) as f64 / elapsed.as_secs_f64(),
        client_cpu_us: per_call(after.0.saturating_sub(before.0)),
        server_cpu_us: per_call(after.1.saturating_sub(before.1)),
        client_syscalls: client.map(|c| c.syscalls),
        server_syscalls: server.map(|c| c.syscalls),
        client_allocations: client.and_then(|c| c.allocations),
        server_allocations: server.and_then(|c| c.allocations),
    }
}

/// System calls and allocations per call that perf counts in this process and in `server` while the
/// calls in `done` go on for `time`.
fn count(server: u32, done: &AtomicU64, time: Duration, probes: &Probes) -> [Option<PerCall>; 2] {
    let mut counters = [Counter::attach(std::process::id(), probes), Counter::attach(server, probes)];
    for c in &mut counters {
        if c.as_mut().is_some_and(|c| !c.enable()) {
            *c = None;
        }
    }
    if counters.iter().all(Option::is_none) {
        return [None, None];
    }
    let n0 = done.load(Ordering::Relaxed);
    std::thread::sleep(time);
    let n1 = done.load(Ordering::Relaxed);
    let calls = (n1 - n0).max(1) as f64;
    counters.map(|c| {
        c.and_then(Counter::finish).map(|c| PerCall {
            syscalls: c.syscalls as f64 / calls,
            allocations: c.allocations.map(|n| n as f64 / calls),
        })
    })
}

/// A process's system calls and allocations per call.
#[derive(Clone, Copy)]
struct PerCall {
    syscalls: f64,
    allocations: Option<f64>,
}

/// tiercel's one caller: Null and MaxResult, `calls` of each.
fn tiercel_latency(client: &TestClient, calls: u32, warm: u32) -> crate::Result<(Summary, Summary)> {
    let (mut null, mut max) = (Summary::new(), Summary::new());
    let mut out = vec![0u8; MAX_RESULT as usize];
    for _ in 0..warm {
        client.null()?;
    }
    for _ in 0..calls {
        let t = Instant::now();
        client.null()?;
        null.record(t.elapsed());
        let t = Instant::now();
        client.max_result(Out(&mut out))?;
        max.record(t.elapsed());
    }
    Ok((null, max))
}

/// tiercel's one async caller (a task on `rt`): Null and MaxResult, `calls` of each.
#[cfg(feature = "peers")]
fn tiercel_async_latency(
    rt: &tokio::runtime::Runtime,
    client: &TestAsyncClient,
    calls: u32,
    warm: u32,
) -> crate::Result<(Summary, Summary)> {
    rt.block_on(async {
        let (mut null, mut max) = (Summary::new(), Summary::new());
        let mut out = vec![0u8; MAX_RESULT as usize];
        for _ in 0..warm {
            client.null().await?;
        }
        for _ in 0..calls {
            let t = Instant::now();
            client.null().await?;
            null.record(t.elapsed());
            let t = Instant::now();
            client.max_result(Out(&mut out)).await?;
            max.record(t.elapsed());
        }
        Ok((null, max))
    })
}

/// Runs `measure` while `callers` tasks of tiercel's async client on `rt` make Null calls.
#[cfg(feature = "peers")]
fn tiercel_async_load(
    rt: &tokio::runtime::Runtime,
    client: &TestAsyncClient,
    callers: u32,
    measure: impl FnOnce(&AtomicU64) -> Load,
) -> crate::Result<Load> {
    tasks_load(rt, callers, "tiercel async", measure, |done, stop| {
        let client = client.clone();
        async move {
            while !stop.load(Ordering::Relaxed) {
                client.null().await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, tiercel::CallError>(())
        }
    })
}

/// Runs `measure` while `callers` tasks on `rt`, each the future `task` makes (given the counter of
/// calls done and the flag that tells it to stop), make calls; `name` names them in an error.
#[cfg(feature = "peers")]
fn tasks_load<F, E>(
    rt: &tokio::runtime::Runtime,
    callers: u32,
    name: &str,
    measure: impl FnOnce(&AtomicU64) -> Load,
    task: impl Fn(Arc<AtomicU64>, Arc<AtomicBool>) -> F,
) -> crate::Result<Load>
where
    F: std::future::Future<Output = Result<(), E>> + Send + 'static,
    E: Send + 'static,
    crate::Error: From<E>,
{
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..callers).map(|_| rt.spawn(task(done.clone(), stop.clone()))).collect();
    std::thread::sleep(Duration::from_millis(50));
    let measured = measure(&done);
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        rt.block_on(t).map_err(|e| format!("{name}: a caller task failed: {e}"))??;
    }
    Ok(measured)
}

/// The floor beneath tiercel over UDP as a row of its own: a raw UDP echo (`raw-echo`, one thread in
/// its process on the server CPU; with `--spin` it spins 2 ms past each request) at `addr` answering
/// datagrams of tiercel's sizes (its 56-byte header; MaxResult's 4-byte argument and 1440 bytes
/// back), the caller spinning or blocking (`spin`) as the echo does.
fn raw_udp_latency(addr: std::net::SocketAddr, calls: u32, warm: u32, spin: bool) -> crate::Result<(Summary, Summary)> {
    let mut null = PingPong::new(addr, HEADER, HEADER, spin)?;
    let mut max = PingPong::new(addr, HEADER + 4, HEADER + MAX_RESULT as usize, spin)?;
    let (mut null_times, mut max_times) = (Summary::new(), Summary::new());
    for _ in 0..warm {
        null.round_trip()?;
    }
    let time_one = |ping: &mut PingPong, into: &mut Summary| -> crate::Result<()> {
        let t = Instant::now();
        // A lost datagram (none on loopback, in practice) is left out, not timed as a second.
        if ping.round_trip()? {
            into.record(t.elapsed());
        }
        Ok(())
    };
    for _ in 0..calls {
        time_one(&mut null, &mut null_times)?;
        time_one(&mut max, &mut max_times)?;
    }
    Ok((null_times, max_times))
}

/// tiercel's header: the raw echo's datagrams are as long as its Null's.
const HEADER: usize = tiercel_proto::wire::HEADER_LEN;

/// Runs `measure` while `callers` callers of the raw UDP echo at `addr`, with a connected socket
/// each on `client_cpu`, make round trips, waiting as `wait` says.
fn raw_udp_load(
    addr: std::net::SocketAddr,
    callers: u32,
    wait: RawWait,
    client_cpu: usize,
    measure: impl FnOnce(&AtomicU64) -> Load,
) -> crate::Result<Load> {
    let spin = match wait {
        RawWait::Spin => callers == 1,
        RawWait::Yield | RawWait::Batch => true,
        RawWait::Block => false,
    };
    if wait == RawWait::Batch && callers > 1 {
        let shared = crate::raw::Batched::new(addr, callers)?;
        let caller = move || {
            let mut c = shared.caller(HEADER)?;
            Ok(move || c.round_trip())
        };
        return crate::asynch::round_trips(callers, client_cpu, caller, measure);
    }
    let caller = move || {
        let ping = PingPong::new(addr, HEADER, HEADER, spin)?;
        let mut ping = match wait {
            RawWait::Yield if callers > 1 => ping.yielding(),
            RawWait::Block if callers > 1 => ping.looking_first(),
            _ => ping,
        };
        Ok(move || ping.round_trip())
    };
    crate::asynch::round_trips(callers, client_cpu, caller, measure)
}

/// [`raw_tcp_latency`] through a connection made to be shared ([`SharedTcp`]), by one caller.
fn raw_tcp_shared_latency(addr: std::net::SocketAddr, calls: u32, warm: u32) -> crate::Result<(Summary, Summary)> {
    let mut caller = SharedTcp::new(addr, 1)?.caller()?;
    alternating_tcp_sizes(calls, warm, |request, reply| caller.round_trip_of(request, reply))
}

/// Runs `measure` while `callers` threads on `client_cpu`, sharing one connection to the raw TCP
/// echo at `addr` (`--shared`), make round trips of tiercel's Null sizes, blocking.
fn raw_tcp_shared_load(
    addr: std::net::SocketAddr,
    callers: u32,
    client_cpu: usize,
    measure: impl FnOnce(&AtomicU64) -> Load,
) -> crate::Result<Load> {
    let shared = SharedTcp::new(addr, callers)?;
    let caller = move || {
        let mut c = shared.caller()?;
        Ok(move || c.round_trip_of(TCP_FRAME, TCP_FRAME))
    };
    crate::asynch::round_trips(callers, client_cpu, caller, measure)
}

/// The floor beneath tiercel's one async caller: a task of `rt` that spins for the raw UDP echo's
/// reply at `addr`, as tiercel's lone async call does.
#[cfg(feature = "peers")]
fn raw_udp_async_latency(
    rt: &tokio::runtime::Runtime,
    addr: std::net::SocketAddr,
    calls: u32,
    warm: u32,
) -> crate::Result<(Summary, Summary)> {
    rt.block_on(async {
        let mut null = AsyncPingPong::new(addr, HEADER, HEADER, true)?;
        let mut max = AsyncPingPong::new(addr, HEADER + 4, HEADER + MAX_RESULT as usize, true)?;
        let (mut null_times, mut max_times) = (Summary::new(), Summary::new());
        for _ in 0..warm {
            null.round_trip().await?;
        }
        for _ in 0..calls {
            for (ping, into) in [(&mut null, &mut null_times), (&mut max, &mut max_times)] {
                let t = Instant::now();
                // A lost datagram is left out, not timed as a second.
                if ping.round_trip().await? {
                    into.record(t.elapsed());
                }
            }
        }
        Ok((null_times, max_times))
    })
}

/// Runs `measure` while `callers` tasks of `rt`, each with a socket of its own, make round trips to
/// the raw UDP echo at `addr`: one alone spins for its reply, several wait for the reactor, as
/// tiercel's async calls do.
#[cfg(feature = "peers")]
fn raw_udp_async_load(
    rt: &tokio::runtime::Runtime,
    addr: std::net::SocketAddr,
    callers: u32,
    measure: impl FnOnce(&AtomicU64) -> Load,
) -> crate::Result<Load> {
    tasks_load(rt, callers, "raw udp async", measure, |done, stop| async move {
        let mut ping = AsyncPingPong::new(addr, HEADER, HEADER, callers == 1)?;
        while !stop.load(Ordering::Relaxed) {
            if ping.round_trip().await? {
                done.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok::<_, crate::Error>(())
    })
}

/// tiercel's frame over TCP: the raw TCP echo's messages are as long as its Null's.
const TCP_FRAME: usize = crate::harness::Medium::Tcp.overhead();

/// The blocking floor beneath tiercel over TCP: the raw TCP echo at `addr` (a thread per
/// connection, blocking in its reads, on the server CPU) answering messages of tiercel's sizes, the
/// caller blocking in its reads too. Null and MaxResult alternate on one connection, as tiercel's
/// alternate on its binding's one connection: two connections would have two threads of the echo
/// take turns, each asleep through the other's round trip.
fn raw_tcp_latency(addr: std::net::SocketAddr, calls: u32, warm: u32) -> crate::Result<(Summary, Summary)> {
    let mut ping = TcpPingPong::new(addr, TCP_FRAME, TCP_FRAME, false)?;
    alternating_tcp_sizes(calls, warm, |request, reply| ping.round_trip_of(request, reply))
}

/// Times `calls` round trips of tiercel's Null sizes over TCP and as many of its MaxResult's,
/// alternating, after `warm` of Null's, each made by `round_trip(request bytes, reply bytes)`
/// (false: the echo went away).
fn alternating_tcp_sizes(
    calls: u32,
    warm: u32,
    mut round_trip: impl FnMut(usize, usize) -> crate::Result<bool>,
) -> crate::Result<(Summary, Summary)> {
    let sizes = [(TCP_FRAME, TCP_FRAME), (TCP_FRAME + 4, TCP_FRAME + MAX_RESULT as usize)];
    let (mut null_times, mut max_times) = (Summary::new(), Summary::new());
    for _ in 0..warm {
        round_trip(sizes[0].0, sizes[0].1)?;
    }
    for _ in 0..calls {
        for ((request, reply), times) in sizes.into_iter().zip([&mut null_times, &mut max_times]) {
            let t = Instant::now();
            if !round_trip(request, reply)? {
                return Err("the raw TCP echo went away".into());
            }
            times.record(t.elapsed());
        }
    }
    Ok((null_times, max_times))
}

/// Runs `measure` while `callers` callers of the raw TCP echo at `addr`, a connection each on
/// `client_cpu`, make round trips, blocking in their reads.
fn raw_tcp_load(
    addr: std::net::SocketAddr,
    callers: u32,
    client_cpu: usize,
    measure: impl FnOnce(&AtomicU64) -> Load,
) -> crate::Result<Load> {
    let caller = move || {
        let mut ping = TcpPingPong::new(addr, TCP_FRAME, TCP_FRAME, false)?;
        Ok(move || ping.round_trip())
    };
    crate::asynch::round_trips(callers, client_cpu, caller, measure)
}

/// A peer's one caller (a task on `rt`): Null and MaxResult, `calls` of each.
#[cfg(feature = "peers")]
fn peer_latency(
    peer: Peer,
    rt: &tokio::runtime::Runtime,
    client: &Client,
    calls: u32,
    warm: u32,
) -> crate::Result<(Summary, Summary)> {
    let failed = |e: tiercel_peers::Error| crate::Error::from(format!("{}: {e}", peer.name()));
    rt.block_on(async {
        let mut caller = client.caller().await?;
        let (mut null, mut max) = (Summary::new(), Summary::new());
        for _ in 0..warm {
            caller.null().await?;
        }
        for _ in 0..calls {
            let t = Instant::now();
            caller.null().await?;
            null.record(t.elapsed());
            let t = Instant::now();
            caller.max_result(MAX_RESULT).await?;
            max.record(t.elapsed());
        }
        Ok::<_, tiercel_peers::Error>((null, max))
    })
    .map_err(failed)
}

/// Runs `measure` while `callers` tasks of the peer's client on `rt` make Null calls.
#[cfg(feature = "peers")]
fn peer_load(
    peer: Peer,
    rt: &tokio::runtime::Runtime,
    client: &Client,
    callers: u32,
    measure: impl FnOnce(&AtomicU64) -> Load,
) -> crate::Result<Load> {
    let failed = |e: tiercel_peers::Error| crate::Error::from(format!("{}: {e}", peer.name()));
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = rt
        .block_on(async {
            let mut tasks = Vec::new();
            for _ in 0..callers {
                let mut caller: Caller = client.caller().await?;
                let (done, stop) = (done.clone(), stop.clone());
                tasks.push(tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        caller.null().await?;
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok::<_, tiercel_peers::Error>(())
                }));
            }
            Ok::<_, tiercel_peers::Error>(tasks)
        })
        .map_err(failed)?;
    std::thread::sleep(Duration::from_millis(50));
    let measured = measure(&done);
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        rt.block_on(t).map_err(|e| format!("{}: a caller task failed: {e}", peer.name()))?.map_err(failed)?;
    }
    Ok(measured)
}

/// Prints the rows: latency and calls per second, then tiercel's ratios to each peer.
pub fn print(rows: &[Row], calls: u32, time: Duration, rounds: u32) {
    outln!(
        "\nPeers: tiercel (default settings, over UDP and over TCP) against the raw UDP echo (one spinning thread; \
         one caller spins,\nseveral block in their receives, or with \"yield\" spin and yield the CPU between looks as \
         tiercel's do, or with \"batch\" share one socket and send their requests together,\nas a tiercel binding's \
         threads beyond its first do, to an echo that answers each run as one; with \"async\", callers that are tasks of the \
         peers' runtime,\nwith a socket each, one alone spinning, several waiting for the reactor as tiercel's async calls do), tarpc, tonic (plain and over TLS) and a raw tokio TCP echo; \"block\" rows:\ntiercel with spinning off on both \
         sides, and raw UDP and TCP echoes where both sides block, as the peers do between calls (in receives that \
         wait 1 ms at most at a time,\nas tiercel's do; several callers of the raw UDP echo take up to four turns, a yield of the CPU and a look each, before they block, as tiercel's do, and that \
         echo takes what queued in batches and\nlooks ten times before it blocks; \"raw tcp shared block\": callers sharing \
         one connection, as the threads of a tiercel TCP binding do, taking as many turns (the first before \
         they look),\nto an echo that answers what \
         came together with one write). Each server in"
    );
    outln!(
        "its own process on the server CPU (the peers on tokio's default runtime), each client here on the caller's \
         CPU; one caller's"
    );
    outln!(
        "latency ({calls} calls each of Null and of MaxResult, 1440 bytes, alternating, in {} rounds with every system in \
         turn), then Null calls/s of 1, 2, 4 and 8 callers on one",
        LATENCY_ROUNDS.min(calls.max(1))
    );
    outln!(
        "binding, client or channel (tiercel's callers are threads, or with \"async\" tasks of the peers' runtime; the echoes' \
         callers have a connection or socket each) with the CPU time per call of the client"
    );
    outln!(
        "and the server process: the median of {} windows of {:.1} s, each system measured in turn at each number of \
         callers in each round, each round in another order",
        rounds.max(1),
        time.as_secs_f64()
    );
    outln!(
        "{:>20} | {:>7} {:>7} | {:>7} {:>7} | {:>9} {:>9} {:>9} {:>9} | cpu µs/call at 1 and 8 callers (client+server) \
         | syscalls/call at 1 and 8 | allocations/call at 1 and 8",
        "system",
        "Null",
        "p99",
        "MaxRes",
        "p99",
        "1 caller",
        "2",
        "4",
        "8"
    );
    for r in rows {
        let rate = |i: usize| r.load.get(i).map_or(f64::NAN, |l| l.calls_per_second);
        let cpu = |i: usize| r.load.get(i).map_or(f64::NAN, |l| l.client_cpu_us + l.server_cpu_us);
        let split = |i: usize| r.load.get(i).map_or((f64::NAN, f64::NAN), |l| (l.client_cpu_us, l.server_cpu_us));
        let (c1, s1) = split(0);
        let (c8, s8) = split(3);
        let pair = |c: Option<f64>, s: Option<f64>| match (c, s) {
            (Some(c), Some(s)) => format!("{c:.1}+{s:.1}"),
            _ => "n/a".to_string(),
        };
        let syscalls = |i: usize| r.load.get(i).map_or("n/a".into(), |l| pair(l.client_syscalls, l.server_syscalls));
        let allocations =
            |i: usize| r.load.get(i).map_or("n/a".into(), |l| pair(l.client_allocations, l.server_allocations));
        outln!(
            "{:>20} | {:>7.2} {:>7.2} | {:>7.2} {:>7.2} | {:>9.0} {:>9.0} {:>9.0} {:>9.0} | {:.1} ({:.1}+{:.1}), {:.1} ({:.1}+{:.1}) \
             | {}, {} | {}, {}",
            r.system,
            r.null_median_us,
            r.null_p99_us,
            r.max_result_median_us,
            r.max_result_p99_us,
            rate(0),
            rate(1),
            rate(2),
            rate(3),
            cpu(0),
            c1,
            s1,
            cpu(3),
            c8,
            s8,
            syscalls(0),
            syscalls(3),
            allocations(0),
            allocations(3)
        );
    }
    let tiercel: Vec<&Row> = rows.iter().filter(|r| r.system.starts_with("tiercel")).collect();
    let others: Vec<&Row> = rows.iter().filter(|r| !r.system.starts_with("tiercel")).collect();
    outln!(
        "tiercel's ratios to each peer (Null latency: peer / tiercel, so above 1× is tiercel faster; calls/s: \
         tiercel / peer);\nspinning tiercel against the spinning floors, blocking tiercel against the blocking one of its \
         transport, both against the peers;\n\"!\": tiercel faster than the raw floor beneath it, in latency or in calls/s \
         (a broken floor, or a machine that changed speed between them; \"raw udp echo\" with several callers is \
         one by design: they block in their receives;\nbeneath several threads of \"tiercel udp\", which share a socket \
         beyond the first, the floor is \"raw udp batch\", beneath several async calls \"raw udp async\", whose callers \
         are tasks of the same runtime,\nbeneath several threads of \"tiercel tcp block\", which share its connection, \
         \"raw tcp shared block\", beneath the others the floors whose callers are threads with a socket or connection each)"
    );
    outln!(
        "{:>17} {:>20} | {:>8} {:>8} | {:>8} {:>8} {:>8} {:>8}",
        "tiercel",
        "against",
        "Null",
        "MaxRes",
        "1",
        "2",
        "4",
        "8"
    );
    for t in &tiercel {
        // A blocking row against the blocking floor of its own transport; a spinning one against
        // the spinning floors (there are only UDP ones).
        let blocking = t.system.ends_with(" block");
        let transport = if t.system.starts_with("tiercel tcp") { "raw tcp" } else { "raw udp" };
        let floor = |p: &&&Row| {
            !p.system.starts_with("raw")
                || (p.system.ends_with(" block") == blocking && (!blocking || p.system.starts_with(transport)))
        };
        for p in others.iter().filter(floor) {
            let rate = |r: &Row, i: usize| r.load.get(i).map_or(0.0, |l| l.calls_per_second);
            // tiercel faster than the raw floor beneath it is marked: the floor is broken there,
            // or the machine changed speed between them. Beneath the threads of a spinning
            // binding beyond its first (`tiercel udp` at several callers), which share a socket,
            // the floor is the echo whose callers share one; beneath several async calls, the
            // echo whose callers are tasks; beneath a lone caller and the threads of the other
            // rows, those whose callers are threads with a socket each.
            let batching = t.system == "tiercel udp";
            let asynch = t.system.ends_with(" async");
            let under = |several: bool| match p.system.as_str() {
                "raw udp batch" => batching,
                "raw udp async" => asynch,
                "raw udp echo" | "raw udp yield" => !(several && (batching || asynch)),
                // Several threads of a TCP binding share its connection: beneath them, callers
                // that share one.
                "raw tcp block" => !several,
                system => system.starts_with("raw"),
            };
            let times = |a: f64, b: f64, several: bool| {
                let ratio = crate::asynch::times(a, b);
                if under(several) && a > b && b > 0.0 {
                    ratio + "!"
                } else {
                    ratio
                }
            };
            outln!(
                "{:>17} {:>20} | {:>8} {:>8} | {:>8} {:>8} {:>8} {:>8}",
                t.system,
                p.system,
                times(p.null_median_us, t.null_median_us, false),
                times(p.max_result_median_us, t.max_result_median_us, false),
                times(rate(t, 0), rate(p, 0), false),
                times(rate(t, 1), rate(p, 1), true),
                times(rate(t, 2), rate(p, 2), true),
                times(rate(t, 3), rate(p, 3), true)
            );
        }
    }
}
