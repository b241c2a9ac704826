//! A live `tiercel serve` attacked by a peer that holds bindings of its own (so that its packets
//! carry valid tokens): partial multi-packet calls that claim 16 MiB on every slot of several
//! bindings, and spoofed-source packets aimed at a victim address. The server's resident memory
//! stays under its message budget plus a fixed overhead, stalled calls are reclaimed, the victim
//! receives no more than 3× what was sent in its name, and a legitimate client keeps being served
//! (its latency during each attack is printed beside the same client's without attack), on every
//! transport with small and 1 MiB calls.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tiercel::Client;
use tiercel_bench::seeds::TestClient;
use tiercel_proto::bind::{BindClient, BindEvent, Granted};
use tiercel_proto::wire::{flags, Header, Kind, Packet, Status, HEADER_LEN};

mod common;

use common::{null_latency, Served, TIERCEL};

/// The server's budget for messages in flight in these tests, MiB.
const BUDGET_MIB: u64 = 64;
/// Resident memory a server has besides messages (code, stacks, buffers of its workers), MiB.
const OVERHEAD_MIB: u64 = 48;

fn serve_with_budget() -> Served {
    let child = std::process::Command::new(TIERCEL)
        .args(["serve", "--addr", "udp://127.0.0.1:0", "--stats-every", "1"])
        .args(["--message-memory-mib", &BUDGET_MIB.to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    common::collect(child)
}

/// A socket that has bound to the Test interface: the binding it was granted.
fn bind(server: SocketAddr, nonce: u64) -> (UdpSocket, Granted) {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.connect(server).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let info = <TestClient as tiercel::Import>::INFO;
    let spec = tiercel_seeds::bind_spec(info);
    let mut bind = BindClient::new(&spec, tiercel::config::MAX_UDP_PAYLOAD as u32, nonce, false);
    socket.send(&bind.packet()).unwrap();
    let mut buf = vec![0u8; 65_536];
    loop {
        let n = socket.recv(&mut buf).expect("a bind reply");
        let Ok(p) = Packet::new_checked(&buf[..n]) else { continue };
        if let BindEvent::Granted(g) = bind.handle(&p, None) {
            return (socket, g);
        }
    }
}

fn header(g: &Granted, slot: u32, seq: u32) -> Header {
    Header { binding: g.binding, token: g.token, incarnation: g.incarnation, slot, seq, ..Header::new(Kind::Call) }
}

/// Proves `socket`'s address for `slot` of `g`, as a client thread does on its first call.
fn prove(socket: &UdpSocket, g: &Granted, slot: u32) {
    let probe = Header { kind: Kind::Probe, ..header(g, slot, 0) };
    socket.send(&probe.to_bytes()).unwrap();
    let mut buf = [0u8; 2048];
    loop {
        let n = socket.recv(&mut buf).expect("a challenge");
        let Ok(p) = Packet::new_checked(&buf[..n]) else { continue };
        if p.kind() == Kind::Reject && p.status() == Status::AddressUnproven && p.slot() == slot {
            let proof = Header { flags: flags::ADDRESS_PROOF, payload_len: p.payload_len(), ..probe };
            socket.send(&[&proof.to_bytes()[..], p.payload()].concat()).unwrap();
            return;
        }
    }
}

#[test]
fn partial_calls_claiming_16_mib_hold_no_more_than_the_budget() {
    let served = serve_with_budget();
    let addr: SocketAddr = served.addr.strip_prefix("udp://").unwrap().parse().unwrap();
    let client: TestClient = Client::connect(served.addr.as_str()).unwrap().import().unwrap();
    let quiet = null_latency(&client, 2000);

    // Eight bindings, every slot: the first and the furthest fragment the window allows of a call
    // that claims 16 MiB. Before budgets, each such call made the server allocate and zero 16 MiB.
    let frag = tiercel::config::MAX_UDP_PAYLOAD - HEADER_LEN;
    let len = 16 << 20;
    let count = (len as usize).div_ceil(frag) as u16;
    let payload = vec![0xa5u8; frag];
    let stop = Arc::new(AtomicBool::new(false));
    let attacker = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut sent = 0u64;
            for b in 0..8 {
                let (socket, g) = bind(addr, 1000 + b);
                for slot in 0..64 {
                    prove(&socket, &g, slot);
                    for index in [0u16, 64] {
                        let h = Header {
                            frag_index: index,
                            frag_count: count,
                            payload_len: frag as u32,
                            message_len: len,
                            ..header(&g, slot, 1)
                        };
                        if socket.send(&[&h.to_bytes()[..], &payload].concat()).is_ok() {
                            sent += 1;
                        }
                    }
                    if stop.load(Ordering::Relaxed) {
                        return sent;
                    }
                }
            }
            sent
        })
    };
    let attacked = null_latency(&client, 2000);
    let sent = attacker.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    // While the partial calls hold what they took, a client binds and calls, small and 1 MiB, on
    // every transport.
    tiercel_bench::seeds::every_transport_serves(addr).expect("a legitimate client beside the partial calls");
    let during = served.lines.lock().unwrap().len();
    std::thread::sleep(Duration::from_millis(1200));
    let peak = served.wait_stats_since(during);
    eprintln!(
        "partial calls: {sent} fragments claiming 16 MiB each; server {peak:?}; legitimate Null median/p99 \
         {:.1}/{:.1} µs quiet, {:.1}/{:.1} µs under attack",
        quiet.0, quiet.1, attacked.0, attacked.1
    );
    assert!(sent >= 8 * 64, "the attack ran");
    common::assert_held_within(&peak, BUDGET_MIB, OVERHEAD_MIB);
    // The stalled calls are reclaimed within a couple of seconds.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let n = served.lines.lock().unwrap().len();
        std::thread::sleep(Duration::from_millis(1100));
        let stats = served.wait_stats_since(n);
        if stats["message_memory_kib"] == 0 {
            assert!(stats["reclaimed"] > 0);
            break;
        }
        assert!(Instant::now() < deadline, "stalled calls still hold {} KiB", stats["message_memory_kib"]);
    }
    tiercel_bench::seeds::check_all(&client, 3).expect("the server still serves");
}

#[test]
fn a_spoofed_source_receives_at_most_three_times_what_was_sent_in_its_name() {
    let served = common::serve("udp://127.0.0.1:0");
    let addr: SocketAddr = served.addr.strip_prefix("udp://").unwrap().parse().unwrap();
    let client: TestClient = Client::connect(served.addr.as_str()).unwrap().import().unwrap();
    let quiet = null_latency(&client, 2000);

    // The attacker binds and proves its own address for slot 0...
    let (attacker, g) = bind(addr, 7);
    prove(&attacker, &g, 0);
    // ... and the victim's socket sends, as the spoofed source would, packets carrying the
    // attacker's token: calls of `big_out` asking for 16 MiB, duplicates and probes of them, and
    // acknowledgements asking for everything to be sent again.
    let victim = UdpSocket::bind("127.0.0.2:0").unwrap();
    victim.connect(addr).unwrap();
    victim.set_nonblocking(true).unwrap();
    let big_out = 5; // the Test interface's sixth procedure
    let (mut sent, mut received) = (0usize, 0usize);
    let mut buf = vec![0u8; 65_536];
    let t0 = Instant::now();
    let mut i = 0u32;
    let stop = Arc::new(AtomicBool::new(false));
    let measure = {
        let (client, stop) = (client.clone(), stop.clone());
        std::thread::spawn(move || {
            let r = null_latency(&client, 2000);
            let served = tiercel_bench::seeds::every_transport_serves(addr);
            stop.store(true, Ordering::Relaxed);
            (r, served)
        })
    };
    while !stop.load(Ordering::Relaxed) || t0.elapsed() < Duration::from_millis(500) {
        let seq = 1 + i / 4;
        let mut h = Header { procedure: big_out, payload_len: 4, ..header(&g, i % 4, seq) };
        let mut payload = (16u32 << 20).to_le_bytes().to_vec();
        match i % 3 {
            1 => h.kind = Kind::Probe,
            2 => {
                h.kind = Kind::Ack;
                h.flags = flags::RESEND;
                payload = tiercel_proto::fragment::AckInfo::default().to_bytes().to_vec();
                h.payload_len = payload.len() as u32;
            }
            _ => {}
        }
        if h.kind == Kind::Probe {
            payload.clear();
            h.payload_len = 0;
        }
        let packet = [&h.to_bytes()[..], &payload].concat();
        if victim.send(&packet).is_ok() {
            sent += packet.len();
        }
        while let Ok(n) = victim.recv(&mut buf) {
            received += n;
        }
        i += 1;
        std::thread::sleep(Duration::from_micros(200));
    }
    let (attacked, served_all) = measure.join().unwrap();
    served_all.expect("a legitimate client during the spoofing");
    std::thread::sleep(Duration::from_millis(300));
    while let Ok(n) = victim.recv(&mut buf) {
        received += n;
    }
    eprintln!(
        "spoofed source: {i} packets, {sent} bytes sent in the victim's name, {received} bytes received by it \
         ({:.2}×); legitimate Null median/p99 {:.1}/{:.1} µs quiet, {:.1}/{:.1} µs under attack",
        received as f64 / sent as f64,
        quiet.0,
        quiet.1,
        attacked.0,
        attacked.1
    );
    assert!(sent > 0 && received > 0, "the victim was answered (challenges)");
    assert!(received <= 3 * sent, "the victim got {received} bytes for {sent}");
}
