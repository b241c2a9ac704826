//! `tiercel serve`.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use signal_hook::consts::{SIGINT, SIGTERM};

use crate::seeds::{SeedTest, TestClient, TestServer};
use tiercel::{Server, ServerConfig};

/// Options of `tiercel serve`.
#[derive(clap::Args)]
pub struct Args {
    /// Address to listen on: `udp://HOST:PORT` or `HOST:PORT` (port 0 picks a free one). Default:
    /// `udp://127.0.0.1:7373`, or a free port on 127.0.0.1 with `--name`.
    #[arg(long)]
    addr: Option<String>,
    /// Export Test under this name too, for as long as the server runs: clients then call it by name
    /// (`tiercel call NAME add 2 3`). Several servers may export one name.
    #[arg(long)]
    name: Option<String>,
    /// Most worker threads: one reads each socket while calls are quick, more while long calls run
    /// (with three or more, one for each socket is kept free to answer probes and refuse new calls
    /// as busy when all the others are running calls).
    #[arg(long, default_value_t = ServerConfig::default().workers)]
    workers: usize,
    /// UDP sockets on the port (`SO_REUSEPORT`), each with a worker reading it: the kernel spreads
    /// the clients' sockets over them, and the calls of many clients can run on as many cores (at
    /// most half of `--workers`). The default is one less than the CPUs, at least 1.
    #[arg(long, default_value_t = ServerConfig::default().sockets)]
    sockets: usize,
    /// Most threads serving TCP connections at once, all connections together: beyond, the
    /// connections that sent wait in line, and a thread whose connection has nothing to do serves
    /// the next.
    #[arg(long, default_value_t = ServerConfig::default().connection_threads)]
    connection_threads: usize,
    /// Microseconds an idle worker spins for the next packet before blocking.
    #[arg(long, default_value_t = 1000)]
    spin_us: u64,
    /// Spin the full `--spin-us` after every call on shared-memory bindings, instead of adapting the
    /// spin to the gaps between calls.
    #[arg(long)]
    spin_fixed: bool,
    /// CPUs to pin the threads that run calls to (every transport's), comma-separated (for example `1`).
    #[arg(long, default_value = "")]
    cpus: String,
    /// Print the server's counters every this many seconds (0: never).
    #[arg(long, default_value_t = 0, value_name = "SECONDS")]
    stats_every: u64,
    /// MiB all bindings together may hold for messages: multi-packet calls and results over UDP,
    /// slot pages and argument copies through shared memory (calls beyond are refused as busy).
    #[arg(long, default_value_t = ServerConfig::default().message_memory >> 20, value_name = "MIB")]
    message_memory_mib: usize,
    /// Most secure handshakes answered a second (each costs two X25519 operations before the
    /// client has proven anything); one sender's address gets at most a quarter of them.
    #[arg(long, default_value_t = ServerConfig::default().handshakes_per_second, value_name = "N")]
    handshakes_per_second: u32,
    /// MiB one binding may hold for messages (calls beyond are refused as busy).
    #[arg(long, default_value_t = ServerConfig::default().binding_memory >> 20, value_name = "MIB")]
    binding_memory_mib: usize,
    /// Offer no shared memory to clients on this host (they bind over UDP, or TCP).
    #[arg(long)]
    no_shared_memory: bool,
    /// Serve over UDP (and shared memory) only, without the TCP listener on the same port.
    #[arg(long)]
    no_tcp: bool,
    /// Read and answer the UDP datagrams that arrive on interface IFACE through an AF_XDP socket,
    /// not the kernel's UDP stack (root; clients use `xdp://` addresses). Without it, or when it
    /// cannot be had (the reason is printed), the kernel serves.
    #[arg(long, value_name = "IFACE")]
    xdp: Option<String>,
    /// Expose per-procedure call counts and latency histograms for Prometheus to scrape at
    /// `http://ADDR/metrics` (for example `127.0.0.1:9187`).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
    /// Print the span of each call served (`tiercel.serve`: procedure, transport, outcome, and the
    /// trace and span ids that link it to the caller's `tiercel.call --trace`) to stderr as it
    /// ends; `nowhere` formats them and throws them away (what tracing costs).
    #[arg(long, value_name = "TO", num_args = 0..=1, default_missing_value = "stderr")]
    trace: Option<crate::TraceTo>,
    #[command(flatten)]
    secret: crate::SecretArgs,
    #[command(flatten)]
    registry: crate::RegistryArgs,
}

/// Runs a Test server until SIGINT or SIGTERM, then shuts it down gracefully.
pub fn run(args: Args) -> crate::Result<()> {
    if args.secret.server_key.is_some() {
        return Err(crate::Error::Measure("--server-key is a client's option; a server's own key is --key".into()));
    }
    if !args.secret.authorities.is_empty() {
        return Err(crate::Error::Measure("--authority is a client's option; a server carries --endorsement".into()));
    }
    if args.secret.pin || args.secret.known_servers.is_some() {
        return Err(crate::Error::Measure("--pin and --known-servers are a client's options".into()));
    }
    let config = ServerConfig {
        workers: args.workers,
        sockets: args.sockets,
        connection_threads: args.connection_threads,
        spin: Duration::from_micros(args.spin_us),
        cpus: crate::parse_cpus(&args.cpus)?,
        secret: args.secret.load()?,
        key: args.secret.identity().map_err(tiercel::Error::from)?,
        allow_plain: args.secret.allow_plain,
        endorsements: args.secret.endorsements().map_err(tiercel::Error::from)?,
        adaptive_spin: !args.spin_fixed,
        message_memory: args.message_memory_mib << 20,
        handshakes_per_second: args.handshakes_per_second,
        binding_memory: args.binding_memory_mib << 20,
        shared_memory: !args.no_shared_memory,
        tcp: !args.no_tcp,
        metrics: args.metrics.is_some(),
        xdp: args.xdp.clone(),
        ..ServerConfig::default()
    };
    if let Some(to) = args.trace {
        crate::trace(to);
    }
    if let Some(addr) = args.metrics {
        // Installed before the server starts, so that its handles register with it.
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(addr)
            .set_buckets(&[1e-6, 4e-6, 16e-6, 64e-6, 256e-6, 1e-3, 4e-3, 16e-3, 64e-3, 0.25, 1.0, 4.0])
            .map_err(|e| crate::Error::Measure(format!("metrics: {e}")))?
            .install()
            .map_err(|e| crate::Error::Measure(format!("metrics at {addr}: {e}")))?;
    }
    let addr = match (&args.addr, &args.name) {
        (Some(addr), _) => addr.as_str(),
        (None, None) => "udp://127.0.0.1:7373",
        (None, Some(_)) => "udp://127.0.0.1:0",
    };
    let server_key = config.key.as_ref().map(tiercel::Identity::public);
    let endorsements = config.endorsements.clone();
    let server = Server::bind(addr).map_err(crate::Error::from)?.with_config(config);
    let server = match &args.name {
        Some(name) => {
            let registry = args.registry.load().map_err(|e| crate::Error::from(tiercel::ServerError::from(e)))?;
            server.with_registry(registry).export_as(name, TestServer::new(SeedTest))
        }
        None => server.export(TestServer::new(SeedTest)),
    };
    let server = server.start().map_err(crate::Error::from)?;
    // The first line is the address, for scripts and for `tiercel bench`. A closed stdout must not
    // stop the server, so write errors are ignored.
    let mut out = std::io::stdout();
    let _ = writeln!(out, "listening udp://{}", server.addr());
    let info = <TestClient as tiercel::Import>::INFO;
    let _ = writeln!(out, "exporting {} v{} ({})", info.name, info.version, info.procedures.join(", "));
    if let Some(name) = &args.name {
        let registry = args.registry.load().map_err(|e| crate::Error::from(tiercel::ServerError::from(e)))?;
        let _ = writeln!(out, "exported as {name:?} in {registry} while the server runs");
        match endorsements.iter().find(|e| e.name == *name) {
            Some(e) => {
                let _ = writeln!(
                    out,
                    "its entry carries the endorsement of authority {} until {} (Unix time)",
                    e.authority, e.not_after
                );
            }
            None if !endorsements.is_empty() => {
                let _ = writeln!(out, "WARNING: no --endorsement given is of {name:?}: its entry carries none");
            }
            None => {}
        }
    } else if !endorsements.is_empty() {
        let _ = writeln!(out, "WARNING: --endorsement without --name: no registry entry carries it");
    }
    if let Some(addr) = args.metrics {
        let _ = writeln!(out, "metrics for Prometheus at http://{addr}/metrics");
    }
    match server.tcp_addr() {
        Some(addr) => {
            let _ = writeln!(out, "also over TCP at tcp://{addr} (for clients UDP does not reach)");
        }
        None => {
            let _ = writeln!(out, "TCP: off (--no-tcp)");
        }
    }
    match server.rendezvous() {
        Some(name) => {
            let _ = writeln!(out, "shared memory for clients on this host: rendezvous @{name} (told over UDP)");
        }
        None => {
            let _ = writeln!(out, "shared memory: off (--no-shared-memory); clients on this host use UDP");
        }
    }
    match server.xdp() {
        Some(Ok(station)) => {
            let _ = writeln!(out, "{station}: its UDP datagrams bypass the kernel");
        }
        Some(Err(why)) => {
            let _ = writeln!(out, "WARNING: no AF_XDP ({why}); the kernel's UDP serves instead");
        }
        None => {}
    }
    if let Some(key) = &server_key {
        let plain = if args.secret.allow_plain {
            "plain bindings too (--allow-plain)"
        } else {
            "no plain bindings over UDP or TCP"
        };
        let _ = writeln!(out, "secure bindings over UDP and TCP with key {key}; {plain}");
    }
    let _ = writeln!(
        out,
        "incarnation {:016x}; Ctrl-C or SIGTERM shuts down gracefully (calls under way finish)",
        server.incarnation()
    );
    let _ = out.flush();
    let keyed = server_key.is_some() && !args.secret.allow_plain;
    if let Some(warning) = plain_exposure(server.addr(), args.secret.secret_file.is_some(), keyed) {
        eprintln!("{warning}");
    }
    // SIGINT and SIGTERM begin a graceful shutdown; the signal handler only sets a flag.
    let signalled = Arc::new(AtomicBool::new(false));
    for signal in [SIGINT, SIGTERM] {
        signal_hook::flag::register(signal, signalled.clone())?;
    }
    let handle = server.shutdown_handle();
    let every = (args.stats_every > 0).then(|| Duration::from_secs(args.stats_every));
    let mut next_stats = every.map(|d| Instant::now() + d);
    while !signalled.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(50));
        if let (Some(at), Some(every)) = (next_stats, every) {
            if Instant::now() >= at {
                next_stats = Some(at + every);
                let mut out = std::io::stdout();
                let _ = writeln!(
                    out,
                    "stats {} bindings_held={} message_memory_kib={} rss_kib={} peak_rss_kib={} threads={}",
                    server.stats(),
                    server.bindings(),
                    server.message_memory() >> 10,
                    crate::rss_kib("VmRSS:"),
                    crate::peak_rss_kib(),
                    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
                );
                let _ = out.flush();
            }
        }
    }
    let _ = writeln!(std::io::stdout(), "shutting down: refusing new bindings and calls, finishing calls under way");
    handle.shutdown();
    server.wait();
    let _ = writeln!(std::io::stdout(), "stopped");
    Ok(())
}

/// What to say loudly when a server listens where other hosts may reach it without a key (or with
/// plain bindings allowed): its calls travel in the clear, and without a shared secret anyone may
/// bind. Nothing when `keyed` (every binding it grants over the network is secure).
fn plain_exposure(addr: std::net::SocketAddr, secret: bool, keyed: bool) -> Option<String> {
    if addr.ip().is_loopback() || keyed {
        return None;
    }
    let who = match secret {
        false => "anyone who reaches it can bind and call every procedure (give --secret-file), and ",
        true => "",
    };
    Some(format!(
        "WARNING: serving at {addr}, which other hosts may reach: {who}calls and results travel unencrypted, \
         so whoever can read the traffic can read them and call with a binding's token; give the \
         server a key (tiercel keygen, then --key) for secure bindings (docs/security.md)."
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_server_that_other_hosts_may_reach_says_it_is_plain() {
        let warn = |a: &str, secret| super::plain_exposure(a.parse().unwrap(), secret, false);
        assert_eq!(super::plain_exposure("0.0.0.0:7373".parse().unwrap(), false, true), None, "with a key");
        let plain = warn("0.0.0.0:7373", false).unwrap();
        assert!(plain.contains("anyone who reaches it can bind") && plain.contains("unencrypted"), "{plain}");
        let with_secret = warn("0.0.0.0:7373", true).unwrap();
        assert!(!with_secret.contains("anyone") && with_secret.contains("unencrypted"), "{with_secret}");
        assert!(warn("[::]:7373", false).is_some());
        assert!(warn("192.0.2.1:7373", false).is_some());
        assert_eq!(warn("127.0.0.1:7373", false), None, "loopback");
        assert_eq!(warn("[::1]:7373", false), None, "loopback");
    }
}
