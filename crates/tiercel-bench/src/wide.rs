//! Large calls across two network namespaces joined by a veth pair (1500-byte MTU, so datagrams of
//! 1472 bytes): 1 MiB and 16 MiB In and InOut calls on tiercel's default client and server, against
//! the raw transfer of the same bytes in the same datagrams, sent one `sendmsg` per datagram and sent
//! as a segmented stream (UDP GSO, runs of up to 44 datagrams per `sendmsg`) to a receiver that takes
//! runs whole (UDP GRO), both from and into one small buffer, and the segmented stream of the
//! message's own bytes, from and into buffers of its size (`raw::PingPong::transfer_message`). Needs
//! root (it creates the namespaces); skipped otherwise.

use std::net::SocketAddr;
use std::time::Instant;

use tiercel::{In, InOut};

use crate::progress::outln;
use crate::raw::PingPong;
use crate::seeds::{fill, TestClient};
use crate::summary::Summary;

/// The ports of the server and of the raw echo inside their namespace.
const PORT: u16 = 7577;
const ECHO_PORT: u16 = 7578;
/// Pause before the raw transfers and before the calls: longer than the echo's spin and the
/// server's past their last packet.
const SETTLE: std::time::Duration = std::time::Duration::from_millis(5);
/// Message sizes measured.
pub const SIZES: [(usize, &str); 2] = [(1 << 20, "1 MiB"), (16 << 20, "16 MiB")];
/// The protocol header the raw datagrams stand in for (tiercel's packet header).
const HEADER: usize = tiercel_proto::wire::HEADER_LEN;

/// One row: a call of one size, with the raw penalties of its bytes.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug)]
pub struct Row {
    /// `1 MiB In`, `16 MiB InOut`, ...
    pub call: String,
    /// Bytes of the call's buffer.
    pub bytes: usize,
    /// Datagram size of the binding (the path MTU's).
    pub datagram: usize,
    /// Calls timed.
    pub calls: u64,
    /// Median and p99 of the call, µs.
    pub median_us: f64,
    pub p99_us: f64,
    /// Packets tiercel's client retransmitted during the timed calls.
    pub retransmissions: u64,
    /// The raw penalty of the call's messages (one way each), one datagram per `sendmsg`, µs.
    pub raw_plain_us: f64,
    /// The same bytes as a segmented stream to a GRO receiver, sent from one small buffer over and
    /// over and received into one, µs.
    pub raw_gso_us: f64,
    /// The segmented stream of the message itself: sent from a buffer of its size (each datagram
    /// tiercel's header's length and the next bytes) and received into one (each run after the last),
    /// µs.
    pub raw_gso_message_us: f64,
    /// Raw transfers lost (a datagram dropped): plain, segmented, segmented message.
    pub raw_lost: (u64, u64, u64),
}

impl Row {
    /// Bytes moved by the call, both ways.
    fn moved(&self) -> f64 {
        let ways = if self.call.ends_with("InOut") { 2.0 } else { 1.0 };
        ways * self.bytes as f64
    }
}

/// Options of the `wide-remote` helper role.
#[derive(clap::Args)]
pub struct RemoteArgs {
    /// The tiercel server, `host:port`.
    addr: String,
    /// The raw echo (spinning, with GRO), `host:port`.
    #[arg(long)]
    echo: SocketAddr,
    /// Timed calls (and raw transfers of each kind) per size and direction.
    #[arg(long)]
    calls: u32,
}

/// The rows, measured from inside the client's namespace and printed as JSON. Raw transfers and
/// calls alternate size by size, so that drift of the machine hits them alike.
pub fn remote(args: RemoteArgs) -> crate::Result<()> {
    let _ = tiercel_sys::cpu::pin_current_thread(0);
    let client: TestClient = crate::harness::import(format!("udp://{}", args.addr), tiercel::ClientConfig::default())?;
    let datagram = client.binding().max_datagram();
    // The raw datagrams are as long as tiercel's: its header and fragment.
    let mut ping = PingPong::new(args.echo, HEADER, HEADER, true)?;
    let mut small = Summary::new();
    for i in 0..300 {
        let t = Instant::now();
        if ping.round_trip()? && i >= 100 {
            small.record(t.elapsed());
        }
    }
    // Half the round trip of a header-sized datagram: the reply that ends a raw transfer.
    let reply = small.median_us() / 2.0;
    let mut data = vec![0u8; SIZES[SIZES.len() - 1].0];
    fill(&mut data);
    let resent = || client.binding().stats().retransmissions;
    let mut rows = Vec::new();
    for (bytes, label) in SIZES {
        let mut raw = [Summary::new(), Summary::new(), Summary::new()];
        let mut lost = [0u64; 3];
        let mut calls = [Summary::new(), Summary::new()];
        let buf = &mut data[..bytes];
        // Warm up: the binding's buffers on both sides, the path, the echo.
        client.bulk_in(In(buf)).map_err(crate::Error::from)?;
        client.bulk_in_out(InOut(buf)).map_err(crate::Error::from)?;
        if ping.place_next()? {
            ping.transfer_message(buf, HEADER, datagram, true)?;
        }
        let before = resent();
        for _ in 0..args.calls {
            // The server and the echo share the server CPU: each is measured once the other has
            // stopped spinning (tiercel's server spins 1 ms past its last packet, the echo 2 ms).
            std::thread::sleep(SETTLE);
            for (kind, (summary, lost)) in raw.iter_mut().zip(lost.iter_mut()).enumerate() {
                if kind == 2 && !ping.place_next()? {
                    *lost += 1;
                    continue;
                }
                let t = Instant::now();
                let arrived = match kind {
                    0 => ping.transfer(HEADER + bytes, datagram)?,
                    1 => ping.transfer_segmented(HEADER + bytes, datagram)?,
                    _ => ping.transfer_message(buf, HEADER, datagram, true)?,
                };
                if arrived {
                    summary.record(t.elapsed());
                } else {
                    *lost += 1;
                }
            }
            std::thread::sleep(SETTLE);
            // The raw transfers compared are measured after one that woke the echo; the calls,
            // after an untimed Null that wakes the server's worker from its sleep (a first call
            // after an idle spell pays the wake-up, which the latency tables count, on top of
            // its bytes: 1 MiB In calls took 0.9 to 1.3 ms without this call, 0.5 to 0.6 with).
            client.null().map_err(crate::Error::from)?;
            let t = Instant::now();
            client.bulk_in(In(buf)).map_err(crate::Error::from)?;
            calls[0].record(t.elapsed());
            let t = Instant::now();
            client.bulk_in_out(InOut(buf)).map_err(crate::Error::from)?;
            calls[1].record(t.elapsed());
        }
        let resent = resent() - before;
        let penalty = |s: &Summary| (s.median_us() - reply).max(0.0);
        for (ways, (call, summary)) in [1.0, 2.0].into_iter().zip(["In", "InOut"].into_iter().zip(&calls)) {
            rows.push(Row {
                call: format!("{label} {call}"),
                bytes,
                datagram,
                calls: summary.len(),
                median_us: summary.median_us(),
                p99_us: summary.p99_us(),
                // Shared by the two calls of the size: reported once, on the In row.
                retransmissions: if ways == 1.0 { resent } else { 0 },
                raw_plain_us: ways * penalty(&raw[0]),
                raw_gso_us: ways * penalty(&raw[1]),
                raw_gso_message_us: ways * penalty(&raw[2]),
                raw_lost: (lost[0], lost[1], lost[2]),
            });
        }
    }
    println!("{}", serde_json::to_string(&rows).map_err(crate::Error::from)?);
    Ok(())
}

/// Measures and prints the table: `calls` timed calls per row, the server and the echo pinned to
/// `server_cpu`.
pub fn table(server_cpu: usize, calls: u32) -> crate::Result<Vec<Row>> {
    outln!(
        "\nLarge calls across two network namespaces (veth, 1500-byte MTU), UDP, tiercel's default client and \
         server,\nagainst the raw transfer of the same datagrams to a spinning echo in the server's namespace \
         (one way each,\nless the echo's reply): one sendmsg per datagram, and segmented (UDP GSO, up to 44 \
         datagrams per sendmsg) to\na receiver that takes them in runs (UDP GRO), both from and into one small \
         buffer and (GSO msg) from and into\nbuffers of the message's size; {calls} of each per row, \
         interleaved, each call after an untimed Null\nthat wakes the server as the raw transfers before it \
         wake the echo; medians µs"
    );
    if let Some(why) = crate::namespaces_unavailable() {
        outln!("(skipped: {why})");
        return Ok(Vec::new());
    }
    let pair = crate::netns::Pair::new(PORT, 0.0)?;
    let addr = format!("{}:{PORT}", crate::netns::SERVER_IP);
    let echo = format!("{}:{ECHO_PORT}", crate::netns::SERVER_IP);
    let cpu = server_cpu.to_string();
    let serve: Vec<String> =
        ["serve", "--addr", &format!("udp://{addr}"), "--cpus", &cpu].iter().map(|s| s.to_string()).collect();
    let (server, _) = crate::harness::spawn_in_namespace(&pair.b, &serve)?;
    let echo_args: Vec<String> =
        ["raw-echo", "--addr", &echo, "--cpu", &cpu, "--spin", "--gro"].iter().map(|s| s.to_string()).collect();
    let (raw_echo, _) = crate::harness::spawn_in_namespace(&pair.b, &echo_args)?;
    let out = crate::helpers::command_in_namespace(&pair.a)?
        .args(["wide-remote", &addr, "--echo", &echo, "--calls", &calls.to_string()])
        .output()?;
    drop((server, raw_echo));
    drop(pair);
    if !out.status.success() {
        return Err(crate::Error::Helper {
            what: "wide-remote".into(),
            why: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    let rows: Vec<Row> = serde_json::from_slice(&out.stdout)?;
    outln!(
        "{:<13} {:>6} | {:>10} {:>10} {:>10} | {:>10} {:>10} {:>7} | {:>8} {:>8} {:>8} {:>8} | {:>7} {:>7} {:>7} {:>7}",
        "call",
        "calls",
        "raw plain",
        "raw GSO",
        "GSO msg",
        "tiercel",
        "p99",
        "resent",
        "×plain",
        "×GSO",
        "×GSO msg",
        "lost",
        "Gb/s",
        "plain",
        "GSO",
        "GSO msg"
    );
    let gbit = |bytes: f64, us: f64| bytes * 8.0 / us.max(1e-3) / 1e3;
    for r in &rows {
        outln!(
            "{:<13} {:>6} | {:>10.1} {:>10.1} {:>10.1} | {:>10.1} {:>10.1} {:>7} | {:>7.2}× {:>7.2}× {:>7.2}× {:>8} | {:>7.2} {:>7.2} {:>7.2} {:>7.2}",
            r.call,
            r.calls,
            r.raw_plain_us,
            r.raw_gso_us,
            r.raw_gso_message_us,
            r.median_us,
            r.p99_us,
            r.retransmissions,
            r.median_us / r.raw_plain_us.max(1e-3),
            r.median_us / r.raw_gso_us.max(1e-3),
            r.median_us / r.raw_gso_message_us.max(1e-3),
            format!("{}/{}/{}", r.raw_lost.0, r.raw_lost.1, r.raw_lost.2),
            gbit(r.moved(), r.median_us),
            gbit(r.moved(), r.raw_plain_us),
            gbit(r.moved(), r.raw_gso_us),
            gbit(r.moved(), r.raw_gso_message_us)
        );
    }
    outln!(
        "(datagrams of {} bytes; GSO msg: the message's own bytes, sent from and received into buffers of its \
         size, where\nplain and GSO resend one small buffer's; Gb/s: the call's bytes over tiercel's median and \
         over each raw penalty)",
        rows.first().map_or(0, |r| r.datagram)
    );
    Ok(rows)
}
