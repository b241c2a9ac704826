//! The AF_XDP floor: round trips of a 64-byte UDP datagram across two network namespaces joined by
//! a veth pair, through AF_XDP sockets on both sides (tiercel's XDP program steering the datagrams,
//! in veth's driver hook) against the same round trip through the kernel's UDP sockets, and
//! tiercel's Null over its kernel UDP path, in the same run. Both sides spin; each path is measured
//! in turn, round by round, its server alone on the server CPU. Needs root (it creates the
//! namespaces and attaches the program); skipped otherwise, and the AF_XDP row is missing, with
//! why, where tiercel-sys was built without its XDP program.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

use tiercel_sys::xdp::{frame, mac_of, Steering, Xsk};

use crate::progress::outln;
use crate::raw::PingPong;
use crate::seeds::TestClient;
use crate::summary::Summary;

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

/// The paths measured, as the helper is told them.
const PATHS: [(&str, &str); 3] =
    [("xdp", "raw AF_XDP ping-pong"), ("udp", "raw kernel UDP ping-pong"), ("tiercel", "tiercel Null, kernel UDP")];

/// One path's round trips in one round.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug)]
pub struct Round {
    /// Median and p99 of the round trip, µs.
    pub median_us: f64,
    pub p99_us: f64,
    /// Round trips timed, and those lost.
    pub round_trips: u64,
    pub lost: u64,
}

/// One path's row: every round, and the median of their medians and of their p99s.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug)]
pub struct Row {
    /// What was measured (`raw AF_XDP ping-pong`, ...).
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
}

/// The AF_XDP echo: each UDP datagram of the port steered to it goes back to its sender with the
/// addresses swapped, built from a template, through the same socket. Spins.
pub fn echo(args: EchoArgs) -> crate::Result<()> {
    if let Some(cpu) = args.cpu {
        tiercel_sys::cpu::pin_current_thread(cpu).map_err(crate::Error::from)?;
    }
    let mut steering = Steering::attach(&args.ifname)?;
    steering.steer_port(args.port)?;
    let mut xsk = Xsk::bind(&mut steering, 0)?;
    let me = mac_of(&args.ifname)?;
    println!("listening xdp://{}:{} ({:?} mode)", args.ifname, args.port, steering.mode());
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let end = Instant::now() + Duration::from_secs(args.max_seconds);
    let mut out = Vec::with_capacity(2048);
    let mut looks = 0u32;
    loop {
        let reply = xsk.recv(|f| {
            let d = frame::parse(f)?;
            frame::Template::new(me, d.to, d.from_mac, d.from).frame(d.payload, &mut out)
        });
        if let Some(Some(())) = reply {
            xsk.send(&out)?;
            continue;
        }
        looks = looks.wrapping_add(1);
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
}

/// One round of one path, measured from inside the client's namespace and printed as JSON.
pub fn remote(args: RemoteArgs) -> crate::Result<()> {
    let _ = tiercel_sys::cpu::pin_current_thread(0);
    let time = Duration::from_millis(args.millis);
    let round = match args.path.as_str() {
        "udp" => {
            let mut ping = PingPong::new(SocketAddr::V4(args.addr), PAYLOAD, PAYLOAD, true)?;
            timed(time, || ping.round_trip())?
        }
        "tiercel" => {
            let client: TestClient =
                crate::harness::import(format!("udp://{}", args.addr), tiercel::ClientConfig::default())?;
            timed(time, || client.null().map(|()| true).map_err(crate::Error::from))?
        }
        "xdp" => xdp_round(&args, time)?,
        other => return Err(format!("no path {other}").into()),
    };
    println!("{}", serde_json::to_string(&round)?);
    Ok(())
}

/// Round trips made by `once` (false: lost) for `time` after a warm-up, timed.
fn timed(time: Duration, mut once: impl FnMut() -> crate::Result<bool>) -> crate::Result<Round> {
    let mut summary = Summary::new();
    let mut lost = 0;
    let warm = Instant::now() + time / 5;
    while Instant::now() < warm {
        once()?;
    }
    let end = Instant::now() + time;
    while Instant::now() < end {
        let t = Instant::now();
        if once()? {
            summary.record(t.elapsed());
        } else {
            lost += 1;
        }
    }
    Ok(Round { median_us: summary.median_us(), p99_us: summary.p99_us(), round_trips: summary.len(), lost })
}

/// The AF_XDP round trips: the program attached to this namespace's interface too, each datagram
/// framed from the template and its echo read from the rings, no UDP socket on either side.
fn xdp_round(args: &RemoteArgs, time: Duration) -> crate::Result<Round> {
    let peer = peer_mac(args.addr)?;
    let mut steering = Steering::attach(&args.ifname)?;
    steering.steer_port(CLIENT_PORT)?;
    let mut xsk = Xsk::bind(&mut steering, 0)?;
    let me = SocketAddrV4::new(client_ip(), CLIENT_PORT);
    let template = frame::Template::new(mac_of(&args.ifname)?, me, peer, args.addr);
    let (mut out, mut payload) = (Vec::with_capacity(2048), [0u8; PAYLOAD]);
    let mut seq = 0u64;
    timed(time, || {
        seq += 1;
        payload[..8].copy_from_slice(&seq.to_le_bytes());
        template.frame(&payload, &mut out).ok_or("a datagram too long for IPv4")?;
        if !xsk.send(&out)? {
            return Ok(false);
        }
        let until = Instant::now() + LOST_AFTER;
        loop {
            let echoed = xsk.recv(|f| frame::parse(f).is_some_and(|d| d.payload.get(..8) == Some(&payload[..8])));
            if echoed == Some(true) {
                return Ok(true);
            }
            if echoed.is_none() && Instant::now() > until {
                return Ok(false);
            }
        }
    })
}

/// The client's address in its namespace.
fn client_ip() -> Ipv4Addr {
    crate::netns::CLIENT_IP.parse().unwrap_or(Ipv4Addr::UNSPECIFIED)
}

/// The hardware address of `server`'s interface: asked of the kernel (a few datagrams through its
/// UDP socket make it resolve the address; the AF_XDP echo answers them), then read from its
/// neighbour table.
fn peer_mac(server: SocketAddrV4) -> crate::Result<[u8; 6]> {
    let socket = UdpSocket::bind((client_ip(), 0))?;
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

/// The table: `rounds` rounds, each timing every path for `time`.
pub fn table(server_cpu: usize, rounds: usize, time: Duration) -> crate::Result<Vec<Row>> {
    outln!(
        "\nThe AF_XDP floor: round trips of a {PAYLOAD}-byte UDP datagram across two network namespaces (veth), through \
         AF_XDP sockets\non both sides (tiercel's XDP program steering them) and through the kernel's UDP sockets, \
         and tiercel's Null over\nkernel UDP; both sides spin, each server alone on the server CPU, the paths in \
         turn in {rounds} rounds of {} ms each;\nmedian of the rounds' medians (each round's), µs",
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
    for _ in 0..rounds {
        for (path, label) in PATHS {
            let (server, port): (Vec<String>, u16) = match path {
                "xdp" => (
                    strings(&["xdp-echo", "--ifname", &pair.vb, "--port", &XDP_PORT.to_string(), "--cpu", &cpu]),
                    XDP_PORT,
                ),
                "udp" => {
                    (strings(&["raw-echo", "--addr", &format!("{ip}:{ECHO_PORT}"), "--cpu", &cpu, "--spin"]), ECHO_PORT)
                }
                _ => (strings(&["serve", "--addr", &format!("udp://{ip}:{SERVE_PORT}"), "--cpus", &cpu]), SERVE_PORT),
            };
            let row = match rows.iter().position(|r| r.path == label) {
                Some(i) => i,
                None => {
                    rows.push(Row { path: label.into(), median_us: 0.0, p99_us: 0.0, rounds: Vec::new() });
                    rows.len() - 1
                }
            };
            let spawned = match crate::harness::spawn_in_namespace(&pair.b, &server) {
                Ok((spawned, _)) => spawned,
                Err(e) => {
                    outln!("{label}: unavailable: {e}");
                    continue;
                }
            };
            let out = crate::helpers::command_in_namespace(&pair.a)?
                .args(["xdp-remote", "--path", path, "--addr", &format!("{ip}:{port}")])
                .args(["--ifname", &pair.va, "--millis", &time.as_millis().to_string()])
                .output()?;
            drop(spawned);
            if !out.status.success() {
                outln!("{label}: failed: {}", String::from_utf8_lossy(&out.stderr).trim());
                continue;
            }
            rows[row].rounds.push(serde_json::from_slice(&out.stdout)?);
        }
    }
    drop(pair);
    rows.retain(|r| !r.rounds.is_empty());
    for row in &mut rows {
        row.median_us = median(row.rounds.iter().map(|r| r.median_us));
        row.p99_us = median(row.rounds.iter().map(|r| r.p99_us));
    }
    print(&rows);
    Ok(rows)
}

fn strings(s: &[&str]) -> Vec<String> {
    s.iter().map(|s| s.to_string()).collect()
}

fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The table's rows, then each path against the AF_XDP floor.
pub fn print(rows: &[Row]) {
    outln!("{:<26} | {:>7} {:>7} | {:>9} {:>5} | each round's median", "path", "median", "p99", "trips", "lost");
    for r in rows {
        let each: Vec<String> = r.rounds.iter().map(|x| format!("{:.2}", x.median_us)).collect();
        let trips: u64 = r.rounds.iter().map(|x| x.round_trips).sum();
        let lost: u64 = r.rounds.iter().map(|x| x.lost).sum();
        outln!(
            "{:<26} | {:>7.2} {:>7.2} | {:>9} {:>5} | {}",
            r.path,
            r.median_us,
            r.p99_us,
            trips,
            lost,
            each.join(", ")
        );
    }
    if let Some(floor) = rows.iter().find(|r| r.path == PATHS[0].1) {
        for r in rows.iter().filter(|r| r.path != floor.path) {
            outln!("{} / {}: {:.2}×", r.path, floor.path, r.median_us / floor.median_us);
        }
    }
}
