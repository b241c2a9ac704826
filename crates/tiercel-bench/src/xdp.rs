//! AF_XDP against the kernel's UDP across two network namespaces joined by a veth pair, in the same
//! run: the floor (round trips of a 64-byte UDP datagram through AF_XDP sockets on both sides,
//! tiercel's XDP program steering them in veth's driver hook, and through the kernel's UDP
//! sockets), then tiercel's calls through each (`xdp://` against `udp://`, the server with and
//! without `--xdp`): Null, MaxResult and a 64 KiB InOut from one caller, and Null from eight caller
//! threads on one binding; with the CPU time and the system calls per call of each side (the
//! system calls counted by perf in a window after the timed one, since counting slows them). Both sides spin (tiercel's
//! defaults); each path is measured in turn, round by round, its server alone on the server CPU.
//! Last, the floor and tiercel's Null through AF_XDP measured in turn, window by window, from one
//! client process to both servers at once (the AF_XDP echo on a second veth pair): the rounds'
//! processes come and go, and this VM's speed changes between them by as much as tiercel's cost.
//! Needs root (it creates the namespaces and attaches the program); skipped otherwise, and the
//! AF_XDP rows are missing, with why, where tiercel-sys was built without its XDP program.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

use tiercel_sys::xdp::{frame, mac_of, Steering, Xsk, FRAMES};

use crate::progress::outln;
use crate::raw::PingPong;
use crate::seeds::TestClient;
use crate::summary::Summary;
use crate::syscalls::{Counter, Probes};

/// The ports in the server's namespace: the AF_XDP echo's, the kernel echo's, tiercel's server's.
const XDP_PORT: u16 = 7581;
const ECHO_PORT: u16 = 7582;
const SERVE_PORT: u16 = 7583;
/// The client's own port for the AF_XDP round trips.
const CLIENT_PORT: u16 = 7590;
/// Bytes of each datagram's UDP payload, both ways.
const PAYLOAD: usize = 64;
/// A round trip with no answer for this long is counted lost.
const LOST_AFTER: Duration = Duration::from_millis(200);

/// The paths measured, as the helper is told them: the raw floors, and tiercel's calls through the
/// kernel's UDP and through AF_XDP (each gives several rows).
const PATHS: [&str; 4] = ["xdp", "udp", "tiercel", "tiercel-xdp"];

/// The row of the AF_XDP floor, which the others are compared with.
const FLOOR: &str = "raw AF_XDP ping-pong";

/// One row's round trips (or calls) in one round.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, Default)]
pub struct Round {
    /// Which round of the run (from 0): the rows of one round were measured one after another.
    #[serde(default)]
    pub round: u32,
    /// Median and p99 of the round trip, µs (of eight callers: the time between completions,
    /// 1 / the rate, in both).
    pub median_us: f64,
    pub p99_us: f64,
    /// Round trips timed, and those lost.
    pub round_trips: u64,
    pub lost: u64,
    /// Calls completed a second (the rows of several callers), else 0.
    #[serde(default)]
    pub calls_per_second: f64,
    /// CPU time (user and system) per round trip of the client's process and of the server's (the
    /// server's from `/proc`, in 10 ms ticks), µs; and of it, the system's (in the kernel).
    #[serde(default)]
    pub client_cpu_us: f64,
    #[serde(default)]
    pub client_system_us: f64,
    #[serde(default)]
    pub server_cpu_us: f64,
    #[serde(default)]
    pub server_system_us: f64,
    /// System calls per round trip of the client's process and of the server's, counted by perf
    /// (`None` where it cannot count: no perf, not root).
    #[serde(default)]
    pub client_syscalls: Option<f64>,
    #[serde(default)]
    pub server_syscalls: Option<f64>,
}

/// One row: every round, and the median of their medians and of their p99s.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug)]
pub struct Row {
    /// What was measured (`raw AF_XDP ping-pong`, `tiercel Null, AF_XDP`, ...).
    pub path: String,
    pub median_us: f64,
    pub p99_us: f64,
    pub rounds: Vec<Round>,
}

/// Options of the `xdp-echo` helper role.
#[derive(clap::Args)]
pub struct EchoArgs {
    /// The interface to attach the XDP program to and read.
    #[arg(long)]
    ifname: String,
    /// The UDP port whose datagrams are steered to the AF_XDP socket.
    #[arg(long)]
    port: u16,
    /// CPU to pin to.
    #[arg(long)]
    cpu: Option<usize>,
    /// Exit after this many seconds.
    #[arg(long, default_value_t = 120)]
    max_seconds: u64,
    /// Block (in `poll`) after this many microseconds without a frame, rather than spin on: for an
    /// echo that shares its CPU with another server, measured in turn with it.
    #[arg(long)]
    idle_us: Option<u64>,
}

/// The AF_XDP echo: each UDP datagram of the port steered to it goes back to its sender with the
/// addresses swapped, built from a template, through the same socket. Spins.
pub fn echo(args: EchoArgs) -> crate::Result<()> {
    if let Some(cpu) = args.cpu {
        tiercel_sys::cpu::pin_current_thread(cpu).map_err(crate::Error::from)?;
    }
    let mut steering = Steering::attach(&args.ifname)?;
    steering.steer_port(args.port)?;
    let mut xsk = Xsk::bind(&mut steering, 0, FRAMES)?;
    let me = mac_of(&args.ifname)?;
    println!("listening xdp://{}:{} ({:?} mode)", args.ifname, args.port, steering.mode());
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let end = Instant::now() + Duration::from_secs(args.max_seconds);
    let mut out = Vec::with_capacity(2048);
    let mut looks = 0u32;
    let idle = args.idle_us.map(Duration::from_micros);
    let mut last = Instant::now();
    loop {
        let reply = xsk.recv(|f| {
            let d = frame::parse(f)?;
            frame::Template::new(me, d.to, d.from_mac, d.from).frame(d.payload, &mut out)
        });
        if let Some(Some(())) = reply {
            xsk.send(&out)?;
            if idle.is_some() {
                last = Instant::now();
            }
            continue;
        }
        looks = looks.wrapping_add(1);
        if let Some(idle) = idle {
            if looks.is_multiple_of(64) && last.elapsed() > idle {
                xsk.wait(Some(Duration::from_millis(100)))?;
                last = Instant::now();
            }
        }
        if looks.is_multiple_of(1 << 16) && Instant::now() > end {
            return Ok(());
        }
        std::hint::spin_loop();
    }
}

/// Options of the `xdp-remote` helper role.
#[derive(clap::Args)]
pub struct RemoteArgs {
    /// `xdp`, `udp` or `tiercel`.
    #[arg(long)]
    path: String,
    /// The server, `host:port`.
    #[arg(long)]
    addr: SocketAddrV4,
    /// This namespace's interface (for `xdp`).
    #[arg(long)]
    ifname: String,
    /// How long to time round trips, ms.
    #[arg(long)]
    millis: u64,
    /// The server's process id, for its CPU time.
    #[arg(long)]
    server_pid: Option<u32>,
    /// For `interleaved`: the AF_XDP echo on the second link, and this namespace's end of it.
    #[arg(long)]
    floor_addr: Option<SocketAddrV4>,
    #[arg(long)]
    floor_ifname: Option<String>,
}

/// Eight callers on one binding, in the rows of several.
const CALLERS: usize = 8;

/// One round of one path, measured from inside the client's namespace and printed as JSON: each
/// row's label and round.
pub fn remote(args: RemoteArgs) -> crate::Result<()> {
    let _ = tiercel_sys::cpu::pin_current_thread(0);
    let time = Duration::from_millis(args.millis);
    let server = args.server_pid;
    let rows: Vec<(String, Round)> = match args.path.as_str() {
        "udp" => {
            let mut ping = PingPong::new(SocketAddr::V4(args.addr), PAYLOAD, PAYLOAD, true)?;
            vec![("raw kernel UDP ping-pong".into(), timed(time, server, || ping.round_trip())?)]
        }
        "tiercel" => calls(&format!("udp://{}", args.addr), "kernel UDP", time, server)?,
        "tiercel-xdp" => calls(&format!("xdp://{}", args.addr), "AF_XDP", time, server)?,
        "xdp" => vec![(FLOOR.into(), xdp_round(&args, time)?)],
        "interleaved" => interleaved(&args, time)?,
        other => return Err(format!("no path {other}").into()),
    };
    println!("{}", serde_json::to_string(&rows)?);
    Ok(())
}

/// tiercel's rows through one path (`via`): Null, MaxResult and a 64 KiB InOut from one caller,
/// Null from eight threads on one binding, and from eight tasks.
fn calls(target: &str, via: &str, time: Duration, server: Option<u32>) -> crate::Result<Vec<(String, Round)>> {
    let client: TestClient = crate::harness::import(target, tiercel::ClientConfig::default())?;
    if let Some(why) = client.binding().xdp_refused() {
        return Err(format!("no AF_XDP: {why}").into());
    }
    let e = crate::Error::from;
    let mut max = vec![0u8; crate::seeds::MAX_BUFFER];
    let mut big = vec![0u8; 64 << 10];
    let mut rows = vec![
        (format!("tiercel Null, {via}"), timed(time, server, || client.null().map(|()| true).map_err(e))?),
        (
            format!("tiercel MaxResult, {via}"),
            timed(time, server, || client.max_result(tiercel::Out(&mut max)).map(|()| true).map_err(e))?,
        ),
        (
            format!("tiercel 64 KiB InOut, {via}"),
            timed(time, server, || client.bulk_in_out(tiercel::InOut(&mut big)).map(|()| true).map_err(e))?,
        ),
    ];
    rows.push((format!("tiercel Null, {CALLERS} callers, {via}"), together(&client, time, server)?));
    rows.push((format!("tiercel Null, {CALLERS} async callers, {via}"), together_async(&client, time, server)?));
    Ok(rows)
}

/// Null calls from [`CALLERS`] tasks of tokio's multi-thread runtime (one worker thread: this
/// process is pinned to the client's CPU, and tokio counts the CPUs it may use) through the async
/// stub of `client`'s binding, for `time` after a warm-up: as [`together`].
fn together_async(client: &TestClient, time: Duration, server: Option<u32>) -> crate::Result<Round> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
    use std::sync::Arc;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let (stop, done) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let tasks: Vec<_> = (0..CALLERS)
        .map(|_| {
            let (client, stop, done) = (client.to_async(), stop.clone(), done.clone());
            rt.spawn(async move {
                while !stop.load(Relaxed) {
                    client.null().await?;
                    done.fetch_add(1, Relaxed);
                }
                Ok::<_, tiercel::CallError>(())
            })
        })
        .collect();
    std::thread::sleep(time / 5);
    let (before, start, first) = (Cpu::now(server), Instant::now(), done.load(Relaxed));
    std::thread::sleep(time);
    let (calls, elapsed) = (done.load(Relaxed) - first, start.elapsed());
    let cpu = Cpu::now(server).since(&before);
    // The window perf counts in.
    let syscalls = count_syscalls(server, || {
        let before = done.load(Relaxed);
        std::thread::sleep(time / 4);
        Ok(done.load(Relaxed) - before)
    });
    stop.store(true, Relaxed);
    for t in tasks {
        rt.block_on(t).map_err(|e| format!("an async caller failed: {e}"))??;
    }
    Ok(several(calls, elapsed, &cpu, syscalls?))
}

/// The round of several callers that made `calls` in `elapsed`, with `cpu` and `syscalls` a call:
/// the time between completions as its median and p99.
fn several(calls: u64, elapsed: Duration, cpu: &Cpu, syscalls: (Option<f64>, Option<f64>)) -> Round {
    let rate = calls as f64 / elapsed.as_secs_f64();
    let between = 1e6 / rate;
    let (client_syscalls, server_syscalls) = syscalls;
    cpu.per(
        calls,
        Round {
            median_us: between,
            p99_us: between,
            round_trips: calls,
            lost: 0,
            calls_per_second: rate,
            client_syscalls,
            server_syscalls,
            ..Round::default()
        },
    )
}

/// Null calls from [`CALLERS`] threads on `client`'s binding for `time` after a warm-up: the rate,
/// and the time between completions.
fn together(client: &TestClient, time: Duration, server: Option<u32>) -> crate::Result<Round> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
    let go = std::sync::Barrier::new(CALLERS + 1);
    let (stop, stop_counted) = (AtomicBool::new(false), AtomicBool::new(false));
    let (done, counted) = (AtomicU64::new(0), AtomicU64::new(0));
    let (calls, elapsed, cpu, syscalls) = std::thread::scope(|scope| -> crate::Result<_> {
        let threads: Vec<_> = (0..CALLERS)
            .map(|_| {
                let client = client.clone();
                let (go, stop, done, stop_counted, counted) = (&go, &stop, &done, &stop_counted, &counted);
                scope.spawn(move || -> Result<(), tiercel::CallError> {
                    let warm = Instant::now() + time / 5;
                    while Instant::now() < warm {
                        client.null()?;
                    }
                    go.wait();
                    let mut n = 0;
                    while !stop.load(Relaxed) {
                        client.null()?;
                        n += 1;
                    }
                    done.fetch_add(n, Relaxed);
                    // The window perf counts in.
                    while !stop_counted.load(Relaxed) {
                        client.null()?;
                        counted.fetch_add(1, Relaxed);
                    }
                    Ok(())
                })
            })
            .collect();
        go.wait();
        let before = Cpu::now(server);
        let start = Instant::now();
        std::thread::sleep(time);
        stop.store(true, Relaxed);
        let elapsed = start.elapsed();
        let cpu = Cpu::now(server).since(&before);
        let syscalls = count_syscalls(server, || {
            let before = counted.load(Relaxed);
            std::thread::sleep(time / 4);
            Ok(counted.load(Relaxed) - before)
        });
        stop_counted.store(true, Relaxed);
        for t in threads {
            t.join().map_err(|_| "a caller panicked")??;
        }
        Ok((done.load(Relaxed), elapsed, cpu, syscalls?))
    })?;
    Ok(several(calls, elapsed, &cpu, syscalls))
}

/// System calls per round trip of this process and of `server`'s, counted by perf during `window`,
/// which makes round trips and returns how many; `None` for a process perf could not count. A
/// window in which perf counted one process and not the other (it failed to attach or to answer in
/// time, on CPUs the calls keep busy) is counted once more.
fn count_syscalls(
    server: Option<u32>,
    mut window: impl FnMut() -> crate::Result<u64>,
) -> crate::Result<(Option<f64>, Option<f64>)> {
    let probes = Probes::system_calls();
    let mut counted = (None, None);
    for _ in 0..2 {
        let mut counters =
            [Counter::attach(std::process::id(), &probes), server.and_then(|s| Counter::attach(s, &probes))];
        for c in &mut counters {
            if c.as_mut().is_some_and(|c| !c.enable()) {
                *c = None;
            }
        }
        let trips = window()?.max(1) as f64;
        let [client, server_counts] = counters.map(|c| c.and_then(Counter::finish).map(|c| c.syscalls as f64 / trips));
        counted = (client, server_counts);
        if client.is_some() == (server_counts.is_some() || server.is_none()) {
            break;
        }
    }
    Ok(counted)
}

/// CPU times of this process and of the server's.
#[derive(Default)]
struct Cpu {
    client: (Duration, Duration),
    server: (Duration, Duration),
}

impl Cpu {
    fn now(server: Option<u32>) -> Cpu {
        Cpu {
            client: tiercel_sys::cpu::process_times(),
            server: server.and_then(tiercel_sys::cpu::other_process_times).unwrap_or_default(),
        }
    }

    fn since(&self, before: &Cpu) -> Cpu {
        let d = |a: (Duration, Duration), b: (Duration, Duration)| (a.0.saturating_sub(b.0), a.1.saturating_sub(b.1));
        Cpu { client: d(self.client, before.client), server: d(self.server, before.server) }
    }

    /// `round` with this CPU time spread over `calls`.
    fn per(&self, calls: u64, round: Round) -> Round {
        let us = |t: Duration| t.as_secs_f64() * 1e6 / calls.max(1) as f64;
        Round {
            client_cpu_us: us(self.client.0 + self.client.1),
            client_system_us: us(self.client.1),
            server_cpu_us: us(self.server.0 + self.server.1),
            server_system_us: us(self.server.1),
            ..round
        }
    }
}

/// Round trips made by `once` (false: lost) for `time` after a warm-up, timed, with the CPU time
/// of both sides (`server`: the server's process), then their system calls.
fn timed(time: Duration, server: Option<u32>, mut once: impl FnMut() -> crate::Result<bool>) -> crate::Result<Round> {
    let mut before = Cpu::default();
    let round = sampled(time, &mut once, || before = Cpu::now(server))?;
    let cpu = Cpu::now(server).since(&before);
    let (client_syscalls, server_syscalls) = count_syscalls(server, || {
        let (end, mut made) = (Instant::now() + time / 4, 0);
        while Instant::now() < end {
            once()?;
            made += 1;
        }
        Ok(made)
    })?;
    Ok(cpu.per(round.round_trips + round.lost, Round { client_syscalls, server_syscalls, ..round }))
}

/// The AF_XDP round trips: the program attached to this namespace's interface too, each datagram
/// framed from the template and its echo read from the rings, no UDP socket on either side.
fn xdp_round(args: &RemoteArgs, time: Duration) -> crate::Result<Round> {
    let mut floor = Floor::new(&args.ifname, client_ip(), args.addr)?;
    timed(time, args.server_pid, || floor.round_trip())
}

/// The client's side of the AF_XDP floor: its program, socket and frame template.
struct Floor {
    xsk: Xsk,
    template: frame::Template,
    out: Vec<u8>,
    payload: [u8; PAYLOAD],
    seq: u64,
    /// Dropped after the socket.
    _steering: Steering,
}

impl Floor {
    /// The floor's client on interface `ifname` (whose address is `me`), to the echo at `server`.
    fn new(ifname: &str, me: Ipv4Addr, server: SocketAddrV4) -> crate::Result<Floor> {
        let peer = peer_mac(me, server)?;
        let mut steering = Steering::attach(ifname)?;
        steering.steer_port(CLIENT_PORT)?;
        let xsk = Xsk::bind(&mut steering, 0, FRAMES)?;
        let template = frame::Template::new(mac_of(ifname)?, SocketAddrV4::new(me, CLIENT_PORT), peer, server);
        Ok(Floor { xsk, template, out: Vec::with_capacity(2048), payload: [0; PAYLOAD], seq: 0, _steering: steering })
    }

    /// One round trip: false when its echo did not come back in time (lost).
    fn round_trip(&mut self) -> crate::Result<bool> {
        self.seq += 1;
        self.payload[..8].copy_from_slice(&self.seq.to_le_bytes());
        self.template.frame(&self.payload, &mut self.out).ok_or("a datagram too long for IPv4")?;
        if !self.xsk.send(&self.out)? {
            return Ok(false);
        }
        let until = Instant::now() + LOST_AFTER;
        let sent = &self.payload[..8];
        loop {
            let echoed = self.xsk.recv(|f| frame::parse(f).is_some_and(|d| d.payload.get(..8) == Some(sent)));
            if echoed == Some(true) {
                return Ok(true);
            }
            if echoed.is_none() && Instant::now() > until {
                return Ok(false);
            }
        }
    }
}

/// Windows of each path in the interleaved measurement.
const WINDOWS: u32 = 10;

/// The AF_XDP floor and tiercel's Null through AF_XDP measured in turn, window by window, from one
/// process to two servers that run the whole time (the AF_XDP echo on the second link, tiercel's
/// server on the first; each blocks when the other's window comes): a change of the VM's speed
/// moves both paths of a window alike, which rounds of separate processes do not promise.
fn interleaved(args: &RemoteArgs, time: Duration) -> crate::Result<Vec<(String, Round)>> {
    let (Some(floor_addr), Some(floor_ifname)) = (args.floor_addr, &args.floor_ifname) else {
        return Err("interleaved needs --floor-addr and --floor-ifname".into());
    };
    let second_ip: Ipv4Addr = crate::netns::SECOND_CLIENT_IP.parse().map_err(|_| "a bad address")?;
    let mut floor = Floor::new(floor_ifname, second_ip, floor_addr)?;
    let client: TestClient =
        crate::harness::import(format!("xdp://{}", args.addr).as_str(), tiercel::ClientConfig::default())?;
    if let Some(why) = client.binding().xdp_refused() {
        return Err(format!("no AF_XDP: {why}").into());
    }
    let window = time / 4;
    let mut rows = Vec::new();
    for w in 0..WINDOWS {
        let f = Round { round: w, ..sampled(window, &mut || floor.round_trip(), || ())? };
        let null = &mut || client.null().map(|()| true).map_err(crate::Error::from);
        let t = Round { round: w, ..sampled(window, null, || ())? };
        rows.push((format!("{FLOOR}, interleaved"), f));
        rows.push(("tiercel Null, AF_XDP, interleaved".to_string(), t));
    }
    Ok(rows)
}

/// Round trips made by `once` (false: lost) for `time` after a warm-up of a fifth of it (in which
/// a server that was busy before stops spinning), timed; `started` is called when the timing starts.
fn sampled(
    time: Duration,
    once: &mut impl FnMut() -> crate::Result<bool>,
    started: impl FnOnce(),
) -> crate::Result<Round> {
    let warm = Instant::now() + time / 5;
    while Instant::now() < warm {
        once()?;
    }
    started();
    let (mut summary, mut lost) = (Summary::new(), 0);
    let end = Instant::now() + time;
    while Instant::now() < end {
        let t = Instant::now();
        if once()? {
            summary.record(t.elapsed());
        } else {
            lost += 1;
        }
    }
    Ok(Round {
        median_us: summary.median_us(),
        p99_us: summary.p99_us(),
        round_trips: summary.len(),
        lost,
        ..Round::default()
    })
}

/// The client's address in its namespace.
fn client_ip() -> Ipv4Addr {
    crate::netns::CLIENT_IP.parse().unwrap_or(Ipv4Addr::UNSPECIFIED)
}

/// The hardware address of `server`'s interface: asked of the kernel (a few datagrams through its
/// UDP socket make it resolve the address; the AF_XDP echo answers them), then read from its
/// neighbour table.
fn peer_mac(me: Ipv4Addr, server: SocketAddrV4) -> crate::Result<[u8; 6]> {
    let socket = UdpSocket::bind((me, 0))?;
    socket.set_read_timeout(Some(Duration::from_millis(100)))?;
    for _ in 0..20 {
        socket.send_to(&[0u8; PAYLOAD], server)?;
        if socket.recv(&mut [0u8; 2048]).is_ok() {
            break;
        }
    }
    let table = std::fs::read_to_string("/proc/net/arp")?;
    let ip = server.ip().to_string();
    table
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.first() == Some(&ip.as_str()))
        .and_then(|f| frame::parse_mac(f.get(3)?))
        .ok_or_else(|| format!("no neighbour entry for {ip}: {table}").into())
}

/// The table: `rounds` rounds, each timing every path for `time` a row.
pub fn table(server_cpu: usize, rounds: usize, time: Duration) -> crate::Result<Vec<Row>> {
    outln!(
        "\nAF_XDP against the kernel's UDP across two network namespaces (veth): the floor, round trips of a \
         {PAYLOAD}-byte UDP datagram\nthrough AF_XDP sockets on both sides (tiercel's XDP program steering them) and \
         through the kernel's UDP sockets; then\ntiercel's calls through each (xdp:// and a server with --xdp, against \
         udp://), from one caller and from {CALLERS} threads or tasks on one\nbinding; both sides spin (tiercel's defaults), \
         each server alone on the server CPU, the paths in turn in {rounds} rounds of\n{} ms a row; median of the \
         rounds' medians (each round's), µs; CPU per call of each side (user + system, and system); last, the \
         floor and tiercel's Null\nthrough AF_XDP in turn, {WINDOWS} windows each, both servers running (each blocking \
         when the other's window comes), one client process",
        time.as_millis()
    );
    if let Some(why) = crate::namespaces_unavailable() {
        outln!("(skipped: {why})");
        return Ok(Vec::new());
    }
    let pair = crate::netns::Pair::new(SERVE_PORT, 0.0)?;
    let cpu = server_cpu.to_string();
    let ip = crate::netns::SERVER_IP;
    let mut rows: Vec<Row> = Vec::new();
    for round_number in 0..rounds as u32 {
        for path in PATHS {
            let serve = format!("udp://{ip}:{SERVE_PORT}");
            let (server, port): (Vec<String>, u16) = match path {
                "xdp" => (
                    strings(&["xdp-echo", "--ifname", &pair.vb, "--port", &XDP_PORT.to_string(), "--cpu", &cpu]),
                    XDP_PORT,
                ),
                "udp" => {
                    (strings(&["raw-echo", "--addr", &format!("{ip}:{ECHO_PORT}"), "--cpu", &cpu, "--spin"]), ECHO_PORT)
                }
                "tiercel" => (strings(&["serve", "--addr", &serve, "--cpus", &cpu, "--no-shared-memory"]), SERVE_PORT),
                _ => (
                    strings(&["serve", "--addr", &serve, "--cpus", &cpu, "--no-shared-memory", "--xdp", &pair.vb]),
                    SERVE_PORT,
                ),
            };
            let spawned = match crate::harness::spawn_in_namespace(&pair.b, &server) {
                Ok((spawned, _)) => spawned,
                Err(e) => {
                    outln!("{path}: unavailable: {e}");
                    continue;
                }
            };
            let out = crate::helpers::command_in_namespace(&pair.a)?
                .args(["xdp-remote", "--path", path, "--addr", &format!("{ip}:{port}")])
                .args(["--ifname", &pair.va, "--millis", &time.as_millis().to_string()])
                .args(["--server-pid", &spawned.0.id().to_string()])
                .output()?;
            drop(spawned);
            if !out.status.success() {
                outln!("{path}: failed: {}", String::from_utf8_lossy(&out.stderr).trim());
                continue;
            }
            let measured: Vec<(String, Round)> = serde_json::from_slice(&out.stdout)?;
            for (label, round) in measured {
                let round = Round { round: round_number, ..round };
                match rows.iter_mut().find(|r| r.path == label) {
                    Some(row) => row.rounds.push(round),
                    None => rows.push(Row { path: label, median_us: 0.0, p99_us: 0.0, rounds: vec![round] }),
                }
            }
        }
    }
    match interleave(&pair, &cpu, time) {
        Ok(measured) => {
            for (label, round) in measured {
                match rows.iter_mut().find(|r| r.path == label) {
                    Some(row) => row.rounds.push(round),
                    None => rows.push(Row { path: label, median_us: 0.0, p99_us: 0.0, rounds: vec![round] }),
                }
            }
        }
        Err(e) => outln!("interleaved: failed: {e}"),
    }
    drop(pair);
    for row in &mut rows {
        row.median_us = median(row.rounds.iter().map(|r| r.median_us));
        row.p99_us = median(row.rounds.iter().map(|r| r.p99_us));
    }
    print(&rows);
    Ok(rows)
}

/// The floor and tiercel's Null through AF_XDP in turn, [`WINDOWS`] windows of each, with both
/// servers running: the AF_XDP echo on a second link (blocking when idle), tiercel's server on the
/// first.
fn interleave(pair: &crate::netns::Pair, cpu: &str, time: Duration) -> crate::Result<Vec<(String, Round)>> {
    let (vc, vd) = pair.second_link()?;
    let ip = crate::netns::SERVER_IP;
    let echo =
        strings(&["xdp-echo", "--ifname", &vd, "--port", &XDP_PORT.to_string(), "--cpu", cpu, "--idle-us", "1000"]);
    let serve = format!("udp://{ip}:{SERVE_PORT}");
    let server = strings(&["serve", "--addr", &serve, "--cpus", cpu, "--no-shared-memory", "--xdp", &pair.vb]);
    let (echo, _) = crate::harness::spawn_in_namespace(&pair.b, &echo)?;
    let (server, _) = crate::harness::spawn_in_namespace(&pair.b, &server)?;
    let out = crate::helpers::command_in_namespace(&pair.a)?
        .args(["xdp-remote", "--path", "interleaved", "--addr", &format!("{ip}:{SERVE_PORT}")])
        .args(["--ifname", &pair.va, "--millis", &time.as_millis().to_string()])
        .args(["--floor-addr", &format!("{}:{XDP_PORT}", crate::netns::SECOND_SERVER_IP), "--floor-ifname", &vc])
        .output()?;
    drop((server, echo));
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string().into());
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn strings(s: &[&str]) -> Vec<String> {
    s.iter().map(|s| s.to_string()).collect()
}

/// `a`'s median over `b`'s, round by round: the median of the rounds' ratios, then each round's.
pub fn paired(a: &Row, b: &Row) -> String {
    let each: Vec<f64> = a
        .rounds
        .iter()
        .filter_map(|x| b.rounds.iter().find(|y| y.round == x.round).map(|y| x.median_us / y.median_us))
        .collect();
    let shown: Vec<String> = each.iter().map(|r| format!("{r:.2}")).collect();
    format!("{:.2}× ({})", median(each.iter().copied()), shown.join(", "))
}

fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The table's rows, then tiercel through AF_XDP against the kernel's UDP, and each path against the
/// AF_XDP floor.
pub fn print(rows: &[Row]) {
    outln!(
        "{:<36} | {:>7} {:>7} | {:>9} {:>5} | {:>10} | {:>11} {:>11} | {:>11} | each round's median",
        "path",
        "median",
        "p99",
        "trips",
        "lost",
        "calls/s",
        "client cpu",
        "server cpu",
        "syscalls c/s"
    );
    let mid = |r: &Row, f: fn(&Round) -> f64| median(r.rounds.iter().map(f));
    for r in rows {
        let each: Vec<String> = r.rounds.iter().map(|x| format!("{:.2}", x.median_us)).collect();
        let trips: u64 = r.rounds.iter().map(|x| x.round_trips).sum();
        let lost: u64 = r.rounds.iter().map(|x| x.lost).sum();
        let rate = mid(r, |x| x.calls_per_second);
        let rate = if rate > 0.0 { format!("{rate:.0}") } else { "-".into() };
        let cpu = |total: f64, system: f64| match total > 0.0 {
            true => format!("{total:.2} ({system:.2})"),
            false => "-".to_string(),
        };
        // The median of the rounds perf counted, for each side.
        let counted = |f: fn(&Round) -> Option<f64>| {
            let counts: Vec<f64> = r.rounds.iter().filter_map(f).collect();
            if counts.is_empty() {
                "-".to_string()
            } else {
                format!("{:.2}", median(counts.into_iter()))
            }
        };
        let syscalls = format!("{}/{}", counted(|x| x.client_syscalls), counted(|x| x.server_syscalls));
        outln!(
            "{:<36} | {:>7.2} {:>7.2} | {:>9} {:>5} | {:>10} | {:>11} {:>11} | {:>11} | {}",
            r.path,
            r.median_us,
            r.p99_us,
            trips,
            lost,
            rate,
            cpu(mid(r, |x| x.client_cpu_us), mid(r, |x| x.client_system_us)),
            cpu(mid(r, |x| x.server_cpu_us), mid(r, |x| x.server_system_us)),
            syscalls,
            each.join(", ")
        );
    }
    outln!(
        "ratios: the median of each round's (the paths of a round are measured one after another, so a \
         change of the VM's speed between rounds moves both), each round's beside it"
    );
    for r in rows.iter().filter(|r| r.path.ends_with(", AF_XDP")) {
        let kernel = r.path.replace(", AF_XDP", ", kernel UDP");
        if let Some(k) = rows.iter().find(|k| k.path == kernel) {
            outln!("{} / {}: {}", r.path, k.path, paired(r, k));
        }
    }
    let interleaved = |label: &str| rows.iter().find(|r| r.path == format!("{label}, interleaved"));
    if let (Some(t), Some(f)) = (interleaved("tiercel Null, AF_XDP"), interleaved(FLOOR)) {
        outln!("{} / {} (window by window): {}", t.path, f.path, paired(t, f));
    }
    if let Some(floor) = rows.iter().find(|r| r.path == FLOOR) {
        let compared =
            |r: &&Row| r.path != floor.path && !r.path.contains("callers") && !r.path.ends_with("interleaved");
        for r in rows.iter().filter(compared) {
            let beaten = r
                .rounds
                .iter()
                .filter(|x| floor.rounds.iter().any(|y| y.round == x.round && x.median_us < y.median_us))
                .count();
            let note = match beaten {
                0 => String::new(),
                n => format!(" (under its floor in {n} round(s): the VM changed speed between the two)"),
            };
            outln!("{} / {}: {}{note}", r.path, floor.path, paired(r, floor));
        }
    }
}
