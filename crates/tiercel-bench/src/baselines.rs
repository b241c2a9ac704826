//! The raw baselines, measured in the same run as the RPC figures and with the same placement: a
//! plain and an indirect function call, a system call, a UDP send alone and in a batch, and the
//! ping-pongs of every mechanism a transport (or a user's hand-rolled alternative) stands on: UDP,
//! shared memory, futex, TCP.

use std::io::IoSlice;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tiercel_sys::mmsg::{self, RecvBatch, MAX_BATCH};

use crate::harness::{spawn, udp_addr, Baseline, HEADER};
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
    let (one, batched) = udp_sends(server_cpu, time)?;
    push("UDP send", "sendmsg of one datagram, loopback, the sender's time", HEADER, one);
    push("UDP send, batched", "sendmmsg of 16 datagrams, per datagram", HEADER, batched);
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
            ("raw-echo", false) => ("raw UDP ping-pong", "loopback, both sides block in recv()", HEADER),
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

/// Alternating rounds of the two kinds of UDP send.
const SEND_ROUNDS: u32 = 5;

/// The sender's time per datagram of `HEADER` bytes sent over loopback to a socket that a thread
/// on the server CPU drains: with a `sendmsg` each (timed in batches of 16 sends), and with one
/// `sendmmsg` of [`MAX_BATCH`] datagrams (each recorded as its time over the datagrams sent), in
/// alternating rounds. Their difference is what sharing one system call among several datagrams
/// saves the sender: the kernel's path for each datagram is the same either way.
fn udp_sends(server_cpu: usize, time: Duration) -> crate::Result<(Summary, Summary)> {
    let sink = UdpSocket::bind("127.0.0.1:0")?;
    let to = sink.local_addr()?;
    let stop = Arc::new(AtomicBool::new(false));
    let drain = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let _ = tiercel_sys::cpu::pin_current_thread(server_cpu);
            let mut batch = RecvBatch::new(HEADER);
            while !stop.load(Ordering::Relaxed) {
                let _ = batch.recv_nowait(&sink, MAX_BATCH);
            }
        })
    };
    let measured = (|| -> crate::Result<(Summary, Summary)> {
        let socket = UdpSocket::bind("127.0.0.1:0")?;
        let payload = [0u8; HEADER];
        let mut send = || -> crate::Result<()> {
            tiercel_sys::udp::send_gather_to(&socket, &to, &[IoSlice::new(&payload)])?;
            Ok(())
        };
        let datagrams: Vec<(SocketAddr, &[u8])> = (0..MAX_BATCH).map(|_| (to, &payload[..])).collect();
        let (mut one, mut batched) = (Summary::new(), Summary::new());
        // Untimed first, then the two kinds alternate, so that the machine's drift hits both.
        for _ in 0..20_000 {
            send()?;
        }
        for _ in 0..SEND_ROUNDS {
            one.add(&timed(time / SEND_ROUNDS, 16, &mut send)?);
            let start = Instant::now();
            while start.elapsed() < time / SEND_ROUNDS {
                let t = Instant::now();
                match mmsg::send_batch(&socket, &datagrams) {
                    (_, Some(e)) => return Err(e.into()),
                    (0, None) => return Err("sendmmsg sent nothing".into()),
                    (sent, None) => batched.record(t.elapsed() / sent as u32),
                }
            }
        }
        Ok((one, batched))
    })();
    stop.store(true, Ordering::Relaxed);
    let _ = drain.join();
    measured
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
    outln!("(function and indirect calls and the syscall are timed in batches of 1000 and 100, the UDP sends");
    outln!("in batches of 16 sendmsg or one sendmmsg of 16, to a socket drained on the server CPU; each");
    outln!("ping-pong is a round trip between this thread and an echo process on the server CPU)");
}
