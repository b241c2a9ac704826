//! The raw baselines, measured in the same run as the RPC figures and with the same placement: a
//! plain and an indirect function call, a system call, and the ping-pongs of every mechanism a
//! transport (or a user's hand-rolled alternative) stands on: UDP, shared memory, futex, TCP.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::harness::{spawn, Baseline, HEADER};
use crate::progress::outln;
use crate::raw::PingPong;
use crate::raw_shm::ShmPingPong;
use crate::raw_tcp::TcpPingPong;
use crate::summary::Summary;

/// A baseline row, for `--json`.
#[derive(serde::Serialize)]
pub struct Row {
    pub name: &'static str,
    pub mechanism: &'static str,
    pub bytes_each_way: usize,
    pub operations: u64,
    pub median_us: f64,
    pub p99_us: f64,
}

#[inline(never)]
fn plain(x: u64) -> u64 {
    std::hint::black_box(x).wrapping_add(1)
}

/// Times `f` for about `time`. Operations too short for a clock read each are timed in batches of
/// `batch`, each batch recorded as its mean per operation.
fn timed(time: Duration, batch: u32, mut f: impl FnMut() -> crate::Result<()>) -> crate::Result<Summary> {
    let mut s = Summary::new();
    let start = Instant::now();
    while start.elapsed() < time {
        let t = Instant::now();
        for _ in 0..batch {
            f()?;
        }
        s.record(t.elapsed() / batch);
    }
    Ok(s)
}

/// The socket address of an echo helper's `udp://` or `tcp://` address.
pub(crate) fn udp_addr(addr: &str) -> crate::Result<SocketAddr> {
    addr.strip_prefix("udp://")
        .or_else(|| addr.strip_prefix("tcp://"))
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| crate::Error::from(format!("echo address {addr:?}")))
}

/// Measures every baseline for about `time` each; `progress` is told as each row ends.
pub fn run(server_cpu: usize, time: Duration, mut progress: impl FnMut()) -> crate::Result<Vec<Row>> {
    let mut rows = Vec::new();
    let mut push = |name, mechanism, bytes_each_way, s: Summary| {
        rows.push(Row {
            name,
            mechanism,
            bytes_each_way,
            operations: s.len(),
            median_us: s.median_us(),
            p99_us: s.p99_us(),
        });
    };
    let mut x = 0u64;
    push(
        "function call",
        "plain call, not inlined",
        0,
        timed(time, 1000, || {
            x = plain(x);
            Ok(())
        })?,
    );
    let indirect: fn(u64) -> u64 = plain;
    push(
        "indirect call",
        "through a function pointer the compiler cannot see",
        0,
        timed(time, 1000, || {
            x = std::hint::black_box(indirect)(x);
            Ok(())
        })?,
    );
    push(
        "syscall",
        "getppid()",
        0,
        timed(time, 100, || {
            std::hint::black_box(std::os::unix::process::parent_id());
            Ok(())
        })?,
    );
    progress();
    let cpu = server_cpu.to_string();
    for (echo, spin) in [
        ("raw-echo", true),
        ("raw-echo", false),
        ("raw-shm-echo", true),
        ("raw-shm-echo", false),
        ("raw-tcp-echo", true),
        ("raw-tcp-echo", false),
    ] {
        let mut args = vec![echo.to_string(), "--cpu".into(), cpu.clone()];
        if spin {
            args.push("--spin".into());
        }
        let (_server, addr) = spawn(&args)?;
        let (name, mechanism, bytes) = match (echo, spin) {
            ("raw-echo", true) => ("raw UDP ping-pong", "loopback, both sides busy-poll", HEADER),
            ("raw-echo", false) => ("raw UDP ping-pong", "loopback, both sides block in poll()", HEADER),
            ("raw-shm-echo", true) => ("raw shm ping-pong", "shared memory, both sides spin", 0),
            ("raw-shm-echo", false) => ("futex ping-pong", "shared memory, both sides sleep on futexes", 0),
            ("raw-tcp-echo", true) => ("raw TCP ping-pong", "loopback, TCP_NODELAY, both sides busy-poll", HEADER),
            _ => ("raw TCP ping-pong", "loopback, TCP_NODELAY, both sides block in read()", HEADER),
        };
        let mut tcp = None;
        let mut ping = None;
        match echo {
            "raw-echo" => ping = Some(Baseline::Udp(PingPong::new(udp_addr(&addr)?, bytes, bytes, spin)?)),
            "raw-shm-echo" => {
                let conn = crate::raw_shm::Connection::new(&addr)?;
                ping = Some(Baseline::Shm(ShmPingPong::new(&conn, bytes, bytes, spin)));
            }
            _ => tcp = Some(TcpPingPong::new(udp_addr(&addr)?, bytes, bytes, spin)?),
        }
        let mut round_trip = || -> crate::Result<()> {
            let ok = match (&mut ping, &mut tcp) {
                (Some(p), _) => p.round_trip()?,
                (None, Some(t)) => t.round_trip()?,
                (None, None) => true,
            };
            if ok {
                Ok(())
            } else {
                Err(format!("{name}: the echo stopped answering").into())
            }
        };
        for _ in 0..500 {
            round_trip()?;
        }
        push(name, mechanism, bytes, timed(time, 1, &mut round_trip)?);
        progress();
    }
    Ok(rows)
}

/// Prints the baselines.
pub fn print(rows: &[Row]) {
    outln!("\nRaw baselines (the floor beneath each transport), median and p99 per operation, µs");
    outln!("{:<20} {:<52} {:>6} {:>10} {:>10} {:>10}", "baseline", "mechanism", "bytes", "ops", "median", "p99");
    for r in rows {
        outln!(
            "{:<20} {:<52} {:>6} {:>10} {:>10.3} {:>10.3}",
            r.name,
            r.mechanism,
            r.bytes_each_way,
            r.operations,
            r.median_us,
            r.p99_us
        );
    }
    outln!("(function and indirect calls and the syscall are timed in batches of 1000 and 100; each");
    outln!("ping-pong is a round trip between this thread and an echo process on the server CPU)");
}
