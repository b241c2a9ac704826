//! ONC RPC against C: a Null call and a call with a 1 KiB argument through an rpcgen/libtirpc C
//! client and server, and through tiercel's ONC client and server, in all four pairings, over UDP
//! and TCP, with tiercel's own protocol beside them; all servers in processes of their own on the
//! server CPU, all clients on the client CPU, in interleaved rounds.
//!
//! The C programs are built in a scratch directory from the interface's own `.x` file, with
//! `rpcgen -N` and `cc` against libtirpc, as a C user would build them; each waits as libtirpc
//! does (in `poll`). tiercel's client and server have their defaults (the server spins 1 ms after
//! each call, the client 200 µs for its reply). Where `rpcgen`, `cc` or libtirpc's headers are
//! missing, the table is left out and says why.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tiercel::onc::{OncClient, OncServer, OncTransport};

use crate::harness::Spawned;
use crate::progress::outln;
use crate::summary::Summary;

/// The interface measured: a call with nothing either way, and one with a 1 KiB argument.
#[tiercel::interface(onc(program = 0x2000_7301, version = 1))]
pub trait OncBench {
    #[onc(procedure = 1)]
    fn nothing(&self);
    #[onc(procedure = 2)]
    fn kib(&self, data: &[u8]);
}

struct Bench;

impl OncBench for Bench {
    fn nothing(&self) {}
    fn kib(&self, _data: &[u8]) {}
}

/// The argument of the 1 KiB call.
const KIB: usize = 1024;
/// Calls each client makes before it is timed, each round.
const WARM_UP: u32 = 200;

/// One pairing's latency.
#[derive(serde::Serialize, Clone)]
pub struct Pair {
    /// `C` or `tiercel`.
    pub client: &'static str,
    /// `C` or `tiercel`.
    pub server: &'static str,
    pub median_us: f64,
    pub p99_us: f64,
}

/// A row: one call over one transport, in every pairing.
#[derive(serde::Serialize, Clone)]
pub struct Row {
    /// `udp` or `tcp`.
    pub transport: &'static str,
    /// `Null` or `1 KiB in`.
    pub call: &'static str,
    /// C→C, C→tiercel, tiercel→C, tiercel→tiercel.
    pub pairs: Vec<Pair>,
    /// The same call through tiercel's own protocol and stubs.
    pub own_median_us: f64,
    pub own_p99_us: f64,
    /// A C client's median with the C server over that with tiercel's ONC server.
    pub server_speedup: f64,
}

/// What `tiercel bench` measures of ONC RPC.
#[derive(serde::Serialize, Clone, Default)]
pub struct Json {
    pub rows: Vec<Row>,
    /// Why there are no rows, when there are none.
    pub skipped: Option<String>,
}

/// Options of the `onc-serve` helper: tiercel's ONC server, and the same interface on tiercel's own
/// protocol.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// CPU to pin the server's threads to.
    #[arg(long)]
    cpu: usize,
}

/// The `onc-serve` helper: prints `listening ONC_UDP ONC_TCP OWN` and serves until killed.
pub fn serve(args: ServeArgs) -> crate::Result<()> {
    tiercel_sys::cpu::pin_current_thread(args.cpu).map_err(crate::Error::from)?;
    let onc = OncServer::new().export(OncBenchServer::new(Bench)).serve("127.0.0.1:0")?;
    let own = tiercel::Server::bind("udp://127.0.0.1:0")?
        .with_config(tiercel::ServerConfig { cpus: vec![args.cpu], ..Default::default() })
        .export(OncBenchServer::new(Bench))
        .start()?;
    println!("listening {} {} {}", onc.udp_addr(), onc.tcp_addr(), own.addr());
    loop {
        std::thread::park();
    }
}

/// Measures every row: the servers on `server_cpu`, the clients on `client_cpu`, `calls` timed
/// calls of each kind per pairing in `rounds` rounds.
pub fn table(server_cpu: usize, client_cpu: usize, calls: u32, rounds: u32) -> crate::Result<Json> {
    let dir = std::env::temp_dir().join(format!("tiercel-bench-onc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let built = build(&dir);
    let result = match built {
        Ok((c_server, c_client)) => measure(&c_server, &c_client, server_cpu, client_cpu, calls, rounds),
        Err(why) => Ok(Json { rows: Vec::new(), skipped: Some(why) }),
    };
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Builds the C server and client in `dir`, or says why it cannot.
fn build(dir: &Path) -> Result<(PathBuf, PathBuf), String> {
    if !Path::new("/usr/include/tirpc/rpc/rpc.h").is_file() {
        return Err("libtirpc's headers are missing (apt-get install libtirpc-dev)".into());
    }
    let run = |cmd: &mut Command| -> Result<(), String> {
        let out =
            cmd.current_dir(dir).output().map_err(|e| format!("{cmd:?}: {e} (apt-get install rpcsvc-proto gcc)"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr)))
        }
    };
    std::fs::write(dir.join("bench.x"), OncBenchOnc::x_file()).map_err(|e| e.to_string())?;
    for (flag, out) in [("-h", "bench.h"), ("-c", "bench_xdr.c"), ("-l", "bench_clnt.c"), ("-m", "bench_svc.c")] {
        run(Command::new("rpcgen").args(["-N", flag, "-o", out, "bench.x"]))?;
    }
    std::fs::write(dir.join("server.c"), C_SERVER).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("client.c"), C_CLIENT).map_err(|e| e.to_string())?;
    let cc = |out: &str, sources: &[&str]| {
        run(Command::new("cc").args(["-O2", "-I/usr/include/tirpc", "-o", out]).args(sources).arg("-ltirpc"))
    };
    cc("server", &["server.c", "bench_svc.c", "bench_xdr.c"])?;
    cc("client", &["client.c", "bench_clnt.c", "bench_xdr.c"])?;
    Ok((dir.join("server"), dir.join("client")))
}

/// Starts `command` and reads its first line, `listening …`: the words after it.
fn start(command: &mut Command) -> crate::Result<(Spawned, Vec<String>)> {
    let (spawned, line) = crate::harness::start(command)?;
    Ok((spawned, line.split_whitespace().map(str::to_string).collect()))
}

fn measure(
    c_server: &Path,
    c_client: &Path,
    server_cpu: usize,
    client_cpu: usize,
    calls: u32,
    rounds: u32,
) -> crate::Result<Json> {
    let (_c, c_ports) = start(Command::new(c_server).arg(server_cpu.to_string()))?;
    let (_t, t_addrs) = start(crate::helpers::command()?.args(["onc-serve", "--cpu", &server_cpu.to_string()]))?;
    let bad = || crate::Error::from("a server printed no addresses");
    let c_udp: u16 = c_ports.first().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
    let c_tcp: u16 = c_ports.get(1).and_then(|p| p.parse().ok()).ok_or_else(bad)?;
    let t_udp: std::net::SocketAddr = t_addrs.first().and_then(|a| a.parse().ok()).ok_or_else(bad)?;
    let t_tcp: std::net::SocketAddr = t_addrs.get(1).and_then(|a| a.parse().ok()).ok_or_else(bad)?;
    let own = t_addrs.get(2).ok_or_else(bad)?.clone();
    let per_round = (calls / rounds).max(1);
    let mut rows = Vec::new();
    for (transport, name, c_port, t_addr) in
        [("udp", OncTransport::Udp, c_udp, t_udp), ("tcp", OncTransport::Tcp, c_tcp, t_tcp)]
    {
        let c_addr = std::net::SocketAddr::from(([127, 0, 0, 1], c_port));
        let to_c: OncBenchClient = OncClient::new(c_addr, name)?.import()?;
        let to_t: OncBenchClient = OncClient::new(t_addr, name)?.import()?;
        let own_client: OncBenchClient = tiercel::Client::connect(format!("{transport}://{own}"))?.import()?;
        // [Null, 1 KiB] × [C→C, C→t, t→C, t→t, own].
        let mut sums: Vec<Vec<Summary>> = (0..2).map(|_| (0..5).map(|_| Summary::new()).collect()).collect();
        let data = [7u8; KIB];
        for _ in 0..rounds {
            for (i, port) in [c_port, t_addr.port()].into_iter().enumerate() {
                let (null, kib) = c_calls(c_client, transport, port, client_cpu, per_round)?;
                sums[0][i].add(&null);
                sums[1][i].add(&kib);
            }
            for (i, client) in [(2, &to_c), (3, &to_t), (4, &own_client)] {
                for _ in 0..WARM_UP {
                    client.nothing()?;
                    client.kib(&data)?;
                }
                for _ in 0..per_round {
                    let start = Instant::now();
                    client.nothing()?;
                    sums[0][i].record(start.elapsed());
                }
                for _ in 0..per_round {
                    let start = Instant::now();
                    client.kib(&data)?;
                    sums[1][i].record(start.elapsed());
                }
            }
        }
        for (call, s) in ["Null", "1 KiB in"].into_iter().zip(&sums) {
            let pairs = [("C", "C"), ("C", "tiercel"), ("tiercel", "C"), ("tiercel", "tiercel")]
                .iter()
                .zip(s)
                .map(|(&(client, server), s)| Pair { client, server, median_us: s.median_us(), p99_us: s.p99_us() })
                .collect();
            rows.push(Row {
                transport,
                call,
                pairs,
                own_median_us: s[4].median_us(),
                own_p99_us: s[4].p99_us(),
                server_speedup: s[0].median_us() / s[1].median_us(),
            });
        }
    }
    Ok(Json { rows, skipped: None })
}

/// Runs the C client: `n` timed Null calls and `n` timed 1 KiB calls to the server at `port`.
fn c_calls(client: &Path, transport: &str, port: u16, cpu: usize, n: u32) -> crate::Result<(Summary, Summary)> {
    let out = Command::new(client)
        .args([transport, &port.to_string(), &cpu.to_string(), &WARM_UP.to_string(), &n.to_string()])
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        return Err(format!("the C client ({transport}) failed: {}", String::from_utf8_lossy(&out.stdout)).into());
    }
    let (mut null, mut kib) = (Summary::new(), Summary::new());
    for line in BufReader::new(&out.stdout[..]).lines() {
        let line = line?;
        let mut words = line.split_whitespace();
        let (Some(kind), Some(ns)) = (words.next(), words.next().and_then(|w| w.parse::<u64>().ok())) else { continue };
        let d = Duration::from_nanos(ns);
        match kind {
            "null" => null.record(d),
            "kib" => kib.record(d),
            _ => {}
        }
    }
    if null.len() != u64::from(n) || kib.len() != u64::from(n) {
        return Err(format!("the C client ({transport}) timed {} and {} calls, not {n}", null.len(), kib.len()).into());
    }
    Ok((null, kib))
}

/// Prints the table.
pub fn print(t: &Json, calls: u32, rounds: u32) {
    outln!("\nONC RPC (Sun RPC) against rpcgen and libtirpc: median (p99) µs; {calls} timed calls per cell in {rounds} interleaved rounds");
    if let Some(why) = &t.skipped {
        outln!("  left out: {why}");
        return;
    }
    outln!(
        "  {:<4} {:<9} {:>17} {:>17} {:>17} {:>17} {:>17} {:>9}",
        "",
        "call",
        "C → C",
        "C → tiercel",
        "tiercel → C",
        "tiercel → tiercel",
        "tiercel's own",
        "C server / tiercel server"
    );
    for r in &t.rows {
        let cell = |m: f64, p: f64| format!("{m:.2} ({p:.1})");
        let pairs: Vec<String> = r.pairs.iter().map(|p| cell(p.median_us, p.p99_us)).collect();
        outln!(
            "  {:<4} {:<9} {:>17} {:>17} {:>17} {:>17} {:>17} {:>8.2}×",
            r.transport,
            r.call,
            pairs[0],
            pairs[1],
            pairs[2],
            pairs[3],
            cell(r.own_median_us, r.own_p99_us),
            r.server_speedup
        );
    }
}

/// The C server: `server CPU`, pinned there; serves on a UDP and a TCP port of its own (not
/// registered with rpcbind), printing `listening UDP_PORT TCP_PORT`.
const C_SERVER: &str = r#"
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <netinet/in.h>
#include <rpc/rpc.h>
#include "bench.h"

extern void onc_bench_prog_1(struct svc_req *, SVCXPRT *);

void *nothing_1_svc(struct svc_req *req) {
    static char done;
    return &done;
}

void *kib_1_svc(octets data, struct svc_req *req) {
    static char done;
    return &done;
}

int main(int argc, char **argv) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(atoi(argv[1]), &set);
    sched_setaffinity(0, sizeof set, &set);
    SVCXPRT *udp = svcudp_create(RPC_ANYSOCK);
    SVCXPRT *tcp = svctcp_create(RPC_ANYSOCK, 0, 0);
    if (!udp || !tcp) { fprintf(stderr, "cannot create the services\n"); return 1; }
    /* Protocol 0: served, not registered with rpcbind. */
    if (!svc_register(udp, ONC_BENCH_PROG, ONC_BENCH_V1, onc_bench_prog_1, 0)
        || !svc_register(tcp, ONC_BENCH_PROG, ONC_BENCH_V1, onc_bench_prog_1, 0)) {
        fprintf(stderr, "cannot register the program\n");
        return 1;
    }
    printf("listening %d %d\n", udp->xp_port, tcp->xp_port);
    fflush(stdout);
    svc_run();
    return 1;
}
"#;

/// The C client: `client udp|tcp PORT CPU WARM N`, pinned to CPU: WARM then N timed calls of each
/// kind, printing `null NS` and `kib NS` for each timed call.
const C_CLIENT: &str = r#"
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <arpa/inet.h>
#include <rpc/rpc.h>
#include "bench.h"

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

int main(int argc, char **argv) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(atoi(argv[3]), &set);
    sched_setaffinity(0, sizeof set, &set);
    int warm = atoi(argv[4]), n = atoi(argv[5]);
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons(atoi(argv[2]));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int sock = RPC_ANYSOCK;
    CLIENT *c;
    if (strcmp(argv[1], "udp") == 0) {
        struct timeval wait = { 1, 0 };
        c = clntudp_create(&addr, ONC_BENCH_PROG, ONC_BENCH_V1, wait, &sock);
    } else {
        c = clnttcp_create(&addr, ONC_BENCH_PROG, ONC_BENCH_V1, &sock, 0, 0);
    }
    if (!c) { clnt_pcreateerror("create"); return 2; }
    static long long null_ns[1000000], kib_ns[1000000];
    if (n > 1000000) n = 1000000;
    char data[1024];
    memset(data, 7, sizeof data);
    octets d = { sizeof data, data };
    for (int i = 0; i < warm; i++) {
        if (!nothing_1(c) || !kib_1(d, c)) { clnt_perror(c, "warm-up"); return 3; }
    }
    for (int i = 0; i < n; i++) {
        long long t = now_ns();
        if (!nothing_1(c)) { clnt_perror(c, "null"); return 3; }
        null_ns[i] = now_ns() - t;
    }
    for (int i = 0; i < n; i++) {
        long long t = now_ns();
        if (!kib_1(d, c)) { clnt_perror(c, "kib"); return 3; }
        kib_ns[i] = now_ns() - t;
    }
    for (int i = 0; i < n; i++) printf("null %lld\n", null_ns[i]);
    for (int i = 0; i < n; i++) printf("kib %lld\n", kib_ns[i]);
    clnt_destroy(c);
    return 0;
}
"#;
