//! A live server (a `tiercel serve` process) flooded with malformed, truncated, oversized, random,
//! misdirected and forged packets while legitimate clients keep calling: the clients' calls all
//! succeed, the server counts and drops the bad packets, never runs a forged call, stays up, and its
//! memory stays bounded.

use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use tiercel::Client;
use tiercel_bench::seeds::{self, TestClient};
use tiercel_proto::bind::BindClient;
use tiercel_proto::wire::{flags, Header, Kind, Status, HEADER_LEN};

mod common;

use common::serve;
const FLOOD: Duration = Duration::from_secs(4);
/// Packets per second the attacker sends (paced, so that the test measures handling, not how fast
/// loopback overflows a socket buffer).
const RATE: u64 = 40_000;

/// What the attacker sent, by the server's expected reaction.
#[derive(Default)]
struct Sent {
    /// Packets the server must drop as malformed.
    malformed: AtomicU64,
    /// Well-formed packets naming a binding the sender does not hold: answered with a `Reject`.
    forged: AtomicU64,
    /// Everything sent.
    total: AtomicU64,
}

fn header(kind: Kind, rng: &mut impl Rng) -> Header {
    Header {
        binding: rng.random_range(0..8),
        slot: rng.random_range(0..70),
        seq: rng.random(),
        procedure: rng.random_range(0..10),
        incarnation: rng.random(),
        token: rng.random(),
        ..Header::new(kind)
    }
}

/// One bad datagram, and whether the server should count it as malformed (true) or reject it as
/// forged (false).
fn bad_packet(rng: &mut impl Rng, buf: &mut Vec<u8>) -> bool {
    buf.clear();
    match rng.random_range(0..10) {
        // Random bytes of random length.
        0 => {
            let n = rng.random_range(0..1500);
            buf.extend((0..n).map(|_| rng.random::<u8>()));
            // A random 56+ byte string with the right magic and version is a 1-in-65536×… chance;
            // starting with a zero byte makes sure the magic is wrong.
            if let Some(b) = buf.first_mut() {
                *b = 0;
            }
            true
        }
        // A valid header cut short.
        1 => {
            buf.extend_from_slice(&header(Kind::Call, rng).to_bytes());
            buf.truncate(rng.random_range(0..HEADER_LEN));
            true
        }
        // A header whose payload length lies.
        2 => {
            let mut h = header(Kind::Call, rng);
            h.payload_len = rng.random_range(1..u32::MAX);
            buf.extend_from_slice(&h.to_bytes());
            buf.extend_from_slice(&[7; 100]);
            true
        }
        // Bad version, kind, status or fragment fields.
        3 => {
            let mut b = header(Kind::Call, rng).to_bytes();
            match rng.random_range(0..4) {
                0 => b[2] = 99,
                1 => b[3] = 200,
                2 => b[5] = 200,
                _ => b[20..24].copy_from_slice(&[5, 0, 3, 0]), // fragment 5 of 3
            }
            buf.extend_from_slice(&b);
            true
        }
        // An oversized datagram, beyond anything the server accepts.
        4 if rng.random_range(0..20) == 0 => {
            buf.resize(65_000, 0xab);
            true
        }
        // A checksummed packet whose checksum is wrong.
        5 => {
            let mut h = header(Kind::Call, rng);
            h.flags = flags::CHECKSUM;
            h.payload_len = 8;
            buf.extend_from_slice(&h.to_bytes());
            buf.extend_from_slice(&[1; 8]);
            buf.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
            true
        }
        // Packets only a server sends.
        6 => {
            let kind = [Kind::Result, Kind::ProbeReply, Kind::Reject, Kind::BindReply][rng.random_range(0..4)];
            buf.extend_from_slice(&header(kind, rng).to_bytes());
            true
        }
        // A bind request with a payload of the wrong size.
        7 => {
            let mut h = header(Kind::Bind, rng);
            h.payload_len = 10;
            h.message_len = 10;
            buf.extend_from_slice(&h.to_bytes());
            buf.extend_from_slice(&[3; 10]);
            true
        }
        // Well-formed calls, acks and probes with a guessed binding id and a wrong token, some
        // claiming a multi-packet message of 4 GiB.
        _ => {
            let kind = [Kind::Call, Kind::Ack, Kind::Probe][rng.random_range(0..3)];
            let mut h = header(kind, rng);
            if kind == Kind::Call && rng.random() {
                h.frag_count = u16::MAX;
                h.frag_index = rng.random_range(0..u16::MAX);
                h.message_len = u32::MAX;
                h.payload_len = 64;
                h.status = Status::Ok;
            }
            buf.extend_from_slice(&h.to_bytes());
            buf.resize(HEADER_LEN + h.payload_len as usize, 0x55);
            false
        }
    }
}

fn attack(addr: std::net::SocketAddr, stop: Arc<AtomicBool>, sent: Arc<Sent>, seed: u64) {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.connect(addr).unwrap();
    socket.set_nonblocking(true).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut buf = Vec::with_capacity(65_536);
    let mut junk = [0u8; 2048];
    let start = Instant::now();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        // Pace to RATE / 2 per attacker thread.
        let due = start + Duration::from_micros(n * 2_000_000 / RATE);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let malformed = bad_packet(&mut rng, &mut buf);
        if socket.send(&buf).is_ok() {
            sent.total.fetch_add(1, Ordering::Relaxed);
            if malformed { &sent.malformed } else { &sent.forged }.fetch_add(1, Ordering::Relaxed);
        }
        while socket.recv(&mut junk).is_ok() {} // the server's rejects
        n += 1;
    }
}

#[test]
fn a_flooded_server_keeps_serving_and_drops_what_is_bad() {
    let served = serve("udp://127.0.0.1:0");
    let addr: std::net::SocketAddr = served.addr.strip_prefix("udp://").unwrap().parse().unwrap();
    let client: TestClient = Client::connect(served.addr.as_str()).unwrap().import().unwrap();
    let lines_before = served.lines.lock().unwrap().len();

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(Sent::default());
    let attackers: Vec<_> = (0..2)
        .map(|i| {
            let (stop, sent) = (stop.clone(), sent.clone());
            std::thread::spawn(move || attack(addr, stop, sent, 0x5eed + i))
        })
        .collect();
    // Bind requests from strangers at the same time: each gets a binding (no secret here), up to the
    // server's limit, and nothing else.
    let binder = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
            socket.connect(addr).unwrap();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) && n < 500 {
                let info = <TestClient as tiercel::Import>::INFO;
                let spec = tiercel_seeds::bind_spec(info);
                let _ = socket.send(&BindClient::new(&spec, 1400, n, false).packet());
                n += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };

    // Legitimate callers, every result checked, throughout the flood.
    let rounds = Arc::new(AtomicU64::new(0));
    let callers: Vec<_> = (0..2)
        .map(|t| {
            let (client, stop, rounds) = (client.clone(), stop.clone(), rounds.clone());
            std::thread::spawn(move || {
                let mut round = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    seeds::check_all(&client, round.wrapping_mul(t + 7))
                        .unwrap_or_else(|e| panic!("legit call failed: {e}"));
                    round += 1;
                    rounds.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    std::thread::sleep(FLOOD / 2);
    // A new client binds and calls, small and 1 MiB, on every transport, in the flood.
    seeds::every_transport_serves(addr).expect("a legitimate client on every transport during the flood");
    std::thread::sleep(FLOOD / 2);
    stop.store(true, Ordering::Relaxed);
    for t in callers {
        t.join().expect("a legitimate caller failed");
    }
    for t in attackers {
        t.join().unwrap();
    }
    binder.join().unwrap();

    // Let the server print a stats line covering the whole flood.
    std::thread::sleep(Duration::from_millis(1500));
    let stats = served.wait_stats_since(lines_before);
    let (malformed_sent, forged_sent) = (sent.malformed.load(Ordering::Relaxed), sent.forged.load(Ordering::Relaxed));
    let rounds = rounds.load(Ordering::Relaxed);
    eprintln!(
        "flood: sent {} bad packets ({malformed_sent} malformed, {forged_sent} forged); {rounds} rounds of \
         legitimate calls succeeded; server: {stats:?}",
        sent.total.load(Ordering::Relaxed)
    );
    assert!(rounds > 0, "legitimate calls went on during the flood");
    // Loopback may drop some of the flood when the socket buffer fills, so the counts are lower
    // bounds; most of what was sent must have been seen and counted.
    assert!(stats["malformed"] >= malformed_sent / 2, "malformed counted {} of {malformed_sent}", stats["malformed"]);
    assert!(stats["malformed"] <= malformed_sent, "good packets counted as malformed");
    assert!(stats["rejected"] >= forged_sent / 2, "rejected {} of {forged_sent} forged", stats["rejected"]);
    // Each round calls every procedure once; forged calls ran none.
    let legitimate = rounds * tiercel_bench::seeds::CHECK_CALLS + tiercel_bench::seeds::EVERY_TRANSPORT_CALLS;
    assert_eq!(stats["calls"], legitimate, "only legitimate calls ran");
    assert_eq!(stats["panics"], 0);
    assert!(stats["bindings"] <= 1 + 500 + 3, "one binding per distinct request at most");
    // Memory stayed bounded: well under what the flood's claimed sizes would need (4 GiB per
    // forged multi-packet call).
    assert!(stats["peak_rss_kib"] < 128 * 1024, "server peak RSS {} KiB", stats["peak_rss_kib"]);

    // The server is still up and a new client can bind and call.
    let fresh: TestClient = Client::connect(served.addr.as_str()).unwrap().import().unwrap();
    seeds::check_all(&fresh, 99).unwrap();
}
