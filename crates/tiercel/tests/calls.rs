//! End-to-end calls over UDP on loopback, server and client in one process.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tiercel::{BindError, CallError, Client, ClientConfig, Execution, In, InOut, Out, Server, Spin, Timing, Wire};
use tiercel_seeds::{self as seeds, SeedTest, TestClient, TestServer};

#[derive(Wire, Debug, Clone, PartialEq)]
pub struct Point {
    x: f64,
    y: f64,
}

#[derive(Wire, Debug, Clone, PartialEq)]
pub enum Shape {
    Empty,
    Circle { center: Point, radius: f32 },
    Polygon(Vec<Point>),
}

#[derive(Wire, Debug, PartialEq)]
pub struct Borrowing<'a> {
    name: &'a str,
    bytes: &'a [u8],
}

#[tiercel::interface(version = 3)]
pub trait Kitchen {
    fn echo_str(&self, s: &str) -> String;
    fn concat(&self, parts: Vec<String>, sep: char) -> String;
    fn area(&self, shape: Shape) -> Option<f64>;
    fn sum(&self, xs: Vec<u64>, scale: (u8, bool)) -> Result<u64, String>;
    fn fixed(&self, a: [u16; 4]) -> [u16; 4];
    fn borrowed(&self, b: Borrowing<'_>) -> (String, usize);
    fn big(&self, data: In<&[u8]>, out: Out<&mut [u8]>, both: InOut<&mut [u8]>) -> u64;
    fn sleep_ms(&self, ms: u64) -> u32;
    fn boom(&self, msg: String);
    /// Its one buffer last: run where a large call's arguments were put together.
    fn stamp(&self, tag: String, key: u8, both: InOut<&mut [u8]>) -> (u64, usize);
}

struct KitchenImpl {
    slept: AtomicU32,
}

impl Kitchen for KitchenImpl {
    fn echo_str(&self, s: &str) -> String {
        s.to_owned()
    }
    fn concat(&self, parts: Vec<String>, sep: char) -> String {
        parts.join(&sep.to_string())
    }
    fn area(&self, shape: Shape) -> Option<f64> {
        match shape {
            Shape::Empty => None,
            Shape::Circle { radius, .. } => Some(std::f64::consts::PI * (radius as f64).powi(2)),
            Shape::Polygon(p) => Some(p.len() as f64),
        }
    }
    fn sum(&self, xs: Vec<u64>, scale: (u8, bool)) -> Result<u64, String> {
        if scale.1 {
            return Err("refused".into());
        }
        Ok(xs.iter().sum::<u64>() * scale.0 as u64)
    }
    fn fixed(&self, a: [u16; 4]) -> [u16; 4] {
        [a[3], a[2], a[1], a[0]]
    }
    fn borrowed(&self, b: Borrowing<'_>) -> (String, usize) {
        (b.name.to_uppercase(), b.bytes.len())
    }
    fn big(&self, data: In<&[u8]>, out: Out<&mut [u8]>, both: InOut<&mut [u8]>) -> u64 {
        for (i, b) in out.0.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        for b in both.0.iter_mut() {
            *b ^= 0xff;
        }
        data.0.iter().map(|&b| b as u64).sum()
    }
    fn sleep_ms(&self, ms: u64) -> u32 {
        std::thread::sleep(Duration::from_millis(ms));
        self.slept.fetch_add(1, Ordering::SeqCst) + 1
    }
    fn boom(&self, msg: String) {
        panic!("{msg}");
    }
    fn stamp(&self, tag: String, key: u8, both: InOut<&mut [u8]>) -> (u64, usize) {
        assert!(tag != "panic", "stamp told to panic");
        let sum = both.0.iter().map(|&b| b as u64).sum();
        both.0.iter_mut().for_each(|b| *b ^= key);
        (sum, tag.len())
    }
}

/// The server's address with the UDP transport forced (the server also offers shared memory, which a
/// plain address would choose: `tests/shm.rs` covers that transport).
fn udp(addr: std::net::SocketAddr) -> String {
    format!("udp://{addr}")
}

fn kitchen() -> (tiercel::RunningServer, KitchenClient) {
    let server = Server::bind("udp://127.0.0.1:0")
        .unwrap()
        .export(KitchenServer::new(KitchenImpl { slept: AtomicU32::new(0) }))
        .export(TestServer::new(SeedTest))
        .start()
        .unwrap();
    let client: KitchenClient = Client::connect(udp(server.addr())).unwrap().import().unwrap();
    (server, client)
}

#[test]
fn every_seed_procedure_returns_correct_results() {
    let server = Server::bind("udp://127.0.0.1:0").unwrap().export(TestServer::new(SeedTest)).start().unwrap();
    let client: TestClient = Client::connect(udp(server.addr())).unwrap().import().unwrap();
    for round in 0..200 {
        seeds::check_all(&client, round).unwrap();
    }
    assert_eq!(server.stats().calls, 200 * seeds::CHECK_CALLS);
    assert_eq!(server.stats().panics, 0);
}

#[test]
fn kitchen_sink_of_types() {
    let (_server, k) = kitchen();
    assert_eq!(k.echo_str("héllo").unwrap(), "héllo");
    assert_eq!(k.concat(vec!["a".into(), "b".into(), "c".into()], '-').unwrap(), "a-b-c");
    assert_eq!(k.area(Shape::Empty).unwrap(), None);
    let c = Shape::Circle { center: Point { x: 1.0, y: 2.0 }, radius: 2.0 };
    assert!((k.area(c).unwrap().unwrap() - 4.0 * std::f64::consts::PI).abs() < 1e-9);
    assert_eq!(k.area(Shape::Polygon(vec![Point { x: 0.0, y: 0.0 }; 3])).unwrap(), Some(3.0));
    assert_eq!(k.sum(vec![1, 2, 3], (2, false)).unwrap(), Ok(12));
    assert_eq!(k.sum(vec![], (2, true)).unwrap(), Err("refused".to_string()));
    assert_eq!(k.fixed([1, 2, 3, 4]).unwrap(), [4, 3, 2, 1]);
    assert_eq!(k.borrowed(Borrowing { name: "abc", bytes: &[1; 300] }).unwrap(), ("ABC".to_string(), 300));
}

#[test]
fn buffers_in_out_and_in_out_in_one_call() {
    let (_server, k) = kitchen();
    let data = vec![1u8; 5000];
    let mut out = vec![0u8; 3000];
    let mut both = vec![0x0fu8; 700];
    let sum = k.big(In(&data), Out(&mut out), InOut(&mut both)).unwrap();
    assert_eq!(sum, 5000);
    assert!(out.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
    assert!(both.iter().all(|&b| b == 0xf0));
}

#[test]
fn on_small_datagrams_fragments_go_in_segmented_runs_and_arrive_whole() {
    // Datagrams of a 1500-byte MTU path: fragments go out in runs of one segmented send (UDP GSO)
    // both ways, and loopback hands each run to the receiver whole (UDP GRO), which must cut it where
    // each datagram ends. With and without checksum trailers, which each datagram of a run carries.
    for checksum in [false, true] {
        let server = Server::bind("udp://127.0.0.1:0")
            .unwrap()
            .export(KitchenServer::new(KitchenImpl { slept: AtomicU32::new(0) }))
            .start()
            .unwrap();
        let config = ClientConfig { max_datagram: 1472, checksum, ..ClientConfig::default() };
        let k: KitchenClient = Client::connect(udp(server.addr())).unwrap().with_config(config).import().unwrap();
        assert_eq!(k.binding().max_datagram(), if checksum { 1468 } else { 1472 });
        let data: Vec<u8> = (0..1 << 20).map(|i| (i % 253) as u8).collect();
        let mut out = vec![0u8; 1 << 20];
        let mut both: Vec<u8> = (0..(1 << 20) + 333).map(|i| (i % 7) as u8).collect();
        let expected: u64 = data.iter().map(|&b| b as u64).sum();
        for _ in 0..3 {
            both.iter_mut().for_each(|b| *b ^= 0xff);
            assert_eq!(k.big(In(&data), Out(&mut out), InOut(&mut both)).unwrap(), expected);
            assert!(out.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
            assert!(both.iter().enumerate().all(|(i, &b)| b == (i % 7) as u8));
            // Single-packet calls between the large ones, on the same endpoint.
            assert_eq!(k.echo_str("between").unwrap(), "between");
        }
        assert_eq!(server.stats().malformed, 0, "checksum {checksum}");
        assert_eq!(server.stats().calls, 6);
        // Each call of 2 MiB is about 1,500 datagrams: far fewer receives than datagrams.
        let coalesced = server.stats().coalesced;
        assert!(coalesced >= 3, "the server took {coalesced} runs whole (checksum {checksum})");
        // Fragments of a run that follow those the worker took went straight into place, and on
        // the client the runs of the results' fragments (each result is some 1,500 datagrams).
        let landed = server.stats().landed;
        assert!(landed >= 1000, "{landed} fragments landed in place (checksum {checksum})");
        let landed = k.binding().stats().landed;
        assert!(landed >= 1000, "{landed} result fragments landed in place (checksum {checksum})");
        assert_eq!(k.binding().stats().malformed, 0);
    }
}

#[test]
fn a_large_in_out_buffer_goes_back_from_where_its_call_was_put_together() {
    // `stamp` takes its `InOut` buffer last: a large call runs on it where the server put the call
    // together, and the result goes back from there. On 64 KiB and on 1,472-byte datagrams (with
    // checksums), with and without a deadline (a context block before the arguments).
    for (max_datagram, checksum, deadline) in [(65507, false, false), (1472, true, true), (65507, false, true)] {
        let server = Server::bind("udp://127.0.0.1:0")
            .unwrap()
            .export(KitchenServer::new(KitchenImpl { slept: AtomicU32::new(0) }))
            .start()
            .unwrap();
        let config = ClientConfig { max_datagram, checksum, ..ClientConfig::default() };
        let mut k: KitchenClient = Client::connect(udp(server.addr())).unwrap().with_config(config).import().unwrap();
        if deadline {
            k = k.with_deadline(Duration::from_secs(60));
        }
        let case = format!("datagrams {max_datagram}, checksum {checksum}, deadline {deadline}");
        let in_place = || server.stats().in_place;
        let mut both: Vec<u8> = (0..(1 << 20) + 77).map(|i| (i % 249) as u8).collect();
        let mut expected = both.clone();
        for key in [0x5a, 0xa5, 0x0f] {
            let sum: u64 = expected.iter().map(|&b| b as u64).sum();
            assert_eq!(k.stamp("tag".into(), key, InOut(&mut both)).unwrap(), (sum, 3), "{case}");
            expected.iter_mut().for_each(|b| *b ^= key);
            assert!(both == expected, "{case}: the buffer came back changed by the procedure");
        }
        assert_eq!(in_place(), 3, "{case}");
        // A large call whose buffer is small: run in place, its one-datagram result sent from a copy.
        let long = "x".repeat(300_000);
        let mut small = [1u8, 2, 3];
        assert_eq!(k.stamp(long, 1, InOut(&mut small)).unwrap(), (6, 300_000), "{case}");
        assert_eq!(small, [0, 3, 2]);
        // A small call takes the usual path.
        assert_eq!(k.stamp("s".into(), 2, InOut(&mut small)).unwrap(), (5, 1));
        assert_eq!(small, [2, 1, 0]);
        // A procedure that panics on the buffer: the call fails, the next one runs.
        match k.stamp("panic".into(), 3, InOut(&mut both)) {
            Err(CallError::Panicked(m)) => assert!(m.contains("told to panic"), "{case}: {m}"),
            other => panic!("{case}: {other:?}"),
        }
        let sum: u64 = expected.iter().map(|&b| b as u64).sum();
        assert_eq!(k.stamp("again".into(), 0, InOut(&mut both)).unwrap(), (sum, 5), "{case}");
        assert_eq!(in_place(), 4, "{case}: only the large results went back in place");
        // And the client received those four results into the caller's buffer, almost every
        // fragment straight there (the first of each, or on small datagrams the first run of up to
        // 44 that arrived whole, comes the usual way and starts the reassembly; so does the last,
        // which holds the return value), the one-datagram results the usual way.
        let client = k.binding().stats();
        assert_eq!(client.in_place, 4, "{case}");
        // (Fragments of 56 bytes of header less than the datagram, 4 more with a checksum.)
        let (most, fewest) = (both.len() / (max_datagram - 60) + 2, both.len() / (max_datagram - 56));
        let lent = client.lent_fragments as usize;
        assert!(
            lent >= 4 * fewest.saturating_sub(50).max(fewest / 2) && lent <= 4 * most,
            "{case}: {lent} of 4 × {fewest} to {most}"
        );
        assert_eq!(server.stats().panics, 1, "{case}");
        assert_eq!(server.stats().malformed, 0, "{case}");
    }
}

#[test]
fn multi_packet_calls_and_results_reassemble() {
    let (server, k) = kitchen();
    // 3 MiB each way: tens of 64 KiB datagrams on loopback.
    let data: Vec<u8> = (0..3 << 20).map(|i| (i % 253) as u8).collect();
    let mut out = vec![0u8; 3 << 20];
    let mut both: Vec<u8> = (0..1 << 20).map(|i| (i % 7) as u8).collect();
    let expected: u64 = data.iter().map(|&b| b as u64).sum();
    for _ in 0..3 {
        both.iter_mut().for_each(|b| *b ^= 0xff);
        let sum = k.big(In(&data), Out(&mut out), InOut(&mut both)).unwrap();
        assert_eq!(sum, expected);
        assert!(out.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        assert!(both.iter().enumerate().all(|(i, &b)| b == (i % 7) as u8));
    }
    // The counters say what happened, no more: a fragment received for the first time is not a
    // duplicate, and one sent for the first time is not resent. Loopback never duplicates a packet,
    // so every duplicate the server saw is one the client sent again (it does, when a window of
    // 64 KiB datagrams overflows a socket buffer), and without retransmissions there is none.
    let (duplicates, resent) = (server.stats().duplicates, server.stats().resent);
    let retransmissions = k.binding().stats().retransmissions;
    assert!(duplicates <= retransmissions, "{duplicates} duplicates from {retransmissions} retransmissions");
    if retransmissions == 0 {
        assert_eq!((duplicates, resent), (0, 0), "no retransmission, yet counted as duplicates and resent");
    }
    assert_eq!(server.stats().malformed, 0);
    assert_eq!(server.stats().bindings, 1);
    // 64 fragments of 64 KiB in the arguments of each call: after the first of a call, the
    // worker expects the next, and receives it straight into place (about 58 a call land here; a
    // fragment another worker takes, or one resent, does not).
    let landed = server.stats().landed;
    assert!(landed >= 3 * 16, "{landed} fragments landed in place");
    // And the client its results' fragments (64 of each result's 4 MiB, after the first).
    let landed = k.binding().stats().landed;
    assert!(landed >= 3 * 16, "{landed} result fragments landed in place");
    // Once acknowledged, a big result no longer holds memory in the server's budget (the
    // acknowledgement is on its way when the call returns: wait for it, boundedly).
    let give_up = Instant::now() + Duration::from_secs(5);
    while server.message_memory() != 0 {
        assert!(Instant::now() < give_up, "{} bytes still held", server.message_memory());
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_16_mib_argument_goes_whole_over_either_transport() {
    let server = Server::bind("udp://127.0.0.1:0").unwrap().export(TestServer::new(SeedTest)).start().unwrap();
    let data = vec![1u8; 16 << 20];
    for addr in [udp(server.addr()), server.addr().to_string()] {
        let client: TestClient = Client::connect(addr.as_str()).unwrap().import().unwrap();
        client.var_array(&data).unwrap_or_else(|e| panic!("{addr}: {e}"));
        client.bulk_in(In(&data)).unwrap_or_else(|e| panic!("{addr}: {e}"));
    }
}

#[test]
fn oversized_call_is_refused_before_sending() {
    let (_server, k) = kitchen();
    let data = vec![0u8; tiercel::config::MAX_MESSAGE + 1];
    let err = k.big(In(&data), Out(&mut []), InOut(&mut [])).unwrap_err();
    assert!(matches!(err, CallError::TooLarge(_)), "{err:?}");
    assert_eq!(err.execution(), Execution::NeverRan);
}

#[test]
fn panicking_procedure_reports_and_server_keeps_serving() {
    let (server, k) = kitchen();
    let err = k.boom("kaboom".into()).unwrap_err();
    match &err {
        CallError::Panicked(m) => assert!(m.contains("kaboom"), "{m}"),
        other => panic!("expected Panicked, got {other:?}"),
    }
    assert_eq!(err.execution(), Execution::Ran);
    assert_eq!(k.echo_str("still here").unwrap(), "still here");
    assert_eq!(server.stats().panics, 1);
}

#[test]
fn unknown_interface_and_version_are_clear_errors() {
    let server = Server::bind("udp://127.0.0.1:0").unwrap().export(TestServer::new(SeedTest)).start().unwrap();
    let err = Client::connect(udp(server.addr())).unwrap().import::<KitchenClient>().unwrap_err();
    assert!(matches!(err, BindError::UnknownInterface { name: "Kitchen" }), "{err:?}");
    assert_eq!(err.execution(), Execution::NeverRan);

    mod v2 {
        #![allow(dead_code)]
        #[tiercel::interface(version = 2)]
        pub trait Kitchen {
            fn echo_str(&self, s: &str) -> String;
        }
    }
    let (server, _k) = kitchen();
    let err = Client::connect(udp(server.addr())).unwrap().import::<v2::KitchenClient>().unwrap_err();
    assert!(matches!(err, BindError::VersionMismatch { client: 2, server: 3, .. }), "{err:?}");
}

#[test]
fn unknown_procedures_and_undecodable_arguments_are_clear_errors() {
    // Bound clients agree with the server on every procedure (the bind compares fingerprints), so
    // only a client that builds calls by hand can name a procedure the server lacks or send
    // arguments that do not decode.
    let (server, k) = kitchen();
    let err = k.binding().call(10).unwrap().invoke().map(drop).unwrap_err();
    assert!(matches!(err, CallError::UnknownProcedure(10)), "{err:?}");
    assert_eq!(err.execution(), Execution::NeverRan);
    let mut call = k.binding().call(2).unwrap(); // area(Shape): a variant index no Shape has
    call.writer().put(&[200, 0, 0, 0]);
    let err = call.invoke().map(drop).unwrap_err();
    assert!(matches!(err, CallError::BadArguments(_)), "{err:?}");
    assert_eq!(err.execution(), Execution::NeverRan);
    assert_eq!(k.echo_str("ok").unwrap(), "ok");
    drop(server);
}

#[test]
fn many_threads_share_one_binding() {
    let server = Server::bind("udp://127.0.0.1:0").unwrap().export(TestServer::new(SeedTest)).start().unwrap();
    let client: TestClient = Client::connect(udp(server.addr())).unwrap().import().unwrap();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let c = client.clone();
            std::thread::spawn(move || {
                for i in 0..300 {
                    assert_eq!(c.add(t, i).unwrap(), t + i);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(server.stats().calls, 8 * 300);
}

#[test]
fn slow_procedure_stays_alive_through_probes() {
    let timing = Timing {
        retransmit_initial: Duration::from_millis(5),
        probe_interval: Duration::from_millis(20),
        dead_after: Duration::from_millis(300),
        ..Timing::default()
    };
    let (server, _) = kitchen();
    let k: KitchenClient = Client::connect(udp(server.addr()))
        .unwrap()
        .with_config(ClientConfig { timing, ..ClientConfig::default() })
        .import()
        .unwrap();
    // Runs four times longer than dead_after: probes keep it alive, and it runs exactly once.
    assert_eq!(k.sleep_ms(1200).unwrap(), 1);
    assert!(k.binding().stats().retransmissions > 0, "the client probed");
    assert_eq!(k.sleep_ms(0).unwrap(), 2);
}

#[test]
fn dead_server_fails_within_the_configured_time() {
    let timing = Timing { dead_after: Duration::from_millis(400), ..Timing::default() };
    let (server, _) = kitchen();
    let k: KitchenClient = Client::connect(udp(server.addr()))
        .unwrap()
        .with_config(ClientConfig { timing, ..ClientConfig::default() })
        .import()
        .unwrap();
    assert_eq!(k.echo_str("x").unwrap(), "x");
    server.stop();
    let start = Instant::now();
    let err = k.echo_str("y").unwrap_err();
    assert!(matches!(err, CallError::Unreachable { acknowledged: false, .. }), "{err:?}");
    assert_eq!(err.execution(), Execution::MayHaveRun);
    assert!(start.elapsed() < Duration::from_secs(5), "fails after dead_after, not forever");
}

#[test]
fn deadline_exceeded() {
    let (_server, k) = kitchen();
    let err = k.with_deadline(Duration::from_millis(50)).sleep_ms(400).unwrap_err();
    assert!(matches!(err, CallError::DeadlineExceeded { .. }), "{err:?}");
    assert_eq!(err.execution(), Execution::MayHaveRun);
    // The slot was busy with the abandoned call; the next call waits it out and then runs.
    assert_eq!(k.echo_str("after").unwrap(), "after");
}

#[test]
fn spin_policies_all_complete() {
    let server = Server::bind("udp://127.0.0.1:0").unwrap().export(TestServer::new(SeedTest)).start().unwrap();
    for spin in [Spin::Never, Spin::Fixed(Duration::from_micros(50)), Spin::default()] {
        let c: TestClient = Client::connect(udp(server.addr()))
            .unwrap()
            .with_config(ClientConfig { spin, ..ClientConfig::default() })
            .import()
            .unwrap();
        for i in 0..50 {
            seeds::check_all(&c, i).unwrap();
        }
    }
}

/// A relay on loopback between one client and `server`, which drops the next datagram from the
/// client whenever the flag it returns is set (and clears it).
fn dropping_relay(server: std::net::SocketAddr) -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicBool>) {
    let relay = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = relay.local_addr().unwrap();
    let drop_next = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = drop_next.clone();
    std::thread::spawn(move || {
        let mut client = None;
        let mut buf = vec![0u8; 65536];
        while let Ok((n, from)) = relay.recv_from(&mut buf) {
            if from == server {
                if let Some(c) = client {
                    let _ = relay.send_to(&buf[..n], c);
                }
            } else {
                client = Some(from);
                if !flag.swap(false, Ordering::SeqCst) {
                    let _ = relay.send_to(&buf[..n], server);
                }
            }
        }
    });
    (addr, drop_next)
}

#[test]
fn a_caller_blocked_in_its_receive_still_retransmits_and_keeps_its_deadline() {
    // Never spinning, a caller blocks in its receive (with the socket's read timeout) rather than
    // in `poll`: its timers must still be looked at while it waits.
    let (server, _) = kitchen();
    let (relay, drop_next) = dropping_relay(server.addr());
    let k: KitchenClient = Client::connect(udp(relay))
        .unwrap()
        .with_config(ClientConfig { spin: Spin::Never, ..ClientConfig::default() })
        .import()
        .unwrap();
    assert_eq!(k.echo_str("a").unwrap(), "a");
    for i in 0..3 {
        let before = k.binding().stats().retransmissions;
        drop_next.store(true, Ordering::SeqCst);
        assert_eq!(k.echo_str(&format!("lost {i}")).unwrap(), format!("lost {i}"));
        assert!(k.binding().stats().retransmissions > before, "call {i} was sent again");
    }
    // A deadline sooner than the receive's longest wait (the caller then waits in `poll`), and one
    // later (in the receive): each call fails at its deadline, not before, and never ran long.
    for ms in [2, 30] {
        let start = Instant::now();
        let err = k.with_deadline(Duration::from_millis(ms)).sleep_ms(2000).unwrap_err();
        assert!(matches!(err, CallError::DeadlineExceeded { .. }), "{err:?}");
        assert!(start.elapsed() >= Duration::from_millis(ms), "failed before its deadline");
    }
    assert_eq!(k.echo_str("after").unwrap(), "after");
}

#[test]
fn restarted_server_never_runs_old_calls() {
    let server = Server::bind("udp://127.0.0.1:0").unwrap().export(TestServer::new(SeedTest)).start().unwrap();
    let addr = server.addr();
    let client: TestClient = Client::connect(udp(addr)).unwrap().import().unwrap();
    client.null().unwrap();
    let old = server.incarnation();
    server.stop();
    let server = Server::bind(addr).unwrap().export(TestServer::new(SeedTest)).start().unwrap();
    assert_ne!(server.incarnation(), old);
    let err = client.null().unwrap_err();
    assert!(matches!(err, CallError::UnknownBinding | CallError::ServerRestarted), "{err:?}");
    assert_eq!(err.execution(), Execution::MayHaveRun);
    assert_eq!(server.stats().calls, 0, "nothing of the old binding ran");
    let client: TestClient = Client::connect(udp(addr)).unwrap().import().unwrap();
    client.null().unwrap();
    let _ = Arc::new(());
}

#[test]
fn checksummed_binding_works_both_ways() {
    let (server, _) = kitchen();
    let config = ClientConfig { checksum: true, ..ClientConfig::default() };
    let c: TestClient = Client::connect(udp(server.addr())).unwrap().with_config(config.clone()).import().unwrap();
    for i in 0..50 {
        seeds::check_all(&c, i).unwrap();
    }
    let k: KitchenClient = Client::connect(udp(server.addr())).unwrap().with_config(config).import().unwrap();
    let data = vec![3u8; 200_000];
    let mut out = vec![0u8; 150_000];
    assert_eq!(k.big(In(&data), Out(&mut out), InOut(&mut [])).unwrap(), 600_000);
    assert!(out.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
}

/// A Kitchen server with three workers: two may run calls, one stays free to receive and answer
/// "busy".
fn three_workers() -> tiercel::RunningServer {
    let config = tiercel::ServerConfig { workers: 3, ..tiercel::ServerConfig::default() };
    Server::bind("udp://127.0.0.1:0")
        .unwrap()
        .with_config(config)
        .export(KitchenServer::new(KitchenImpl { slept: AtomicU32::new(0) }))
        .start()
        .unwrap()
}

#[test]
fn overloaded_server_refuses_new_calls_and_clients_back_off() {
    // Three workers: two may run calls, one stays free to receive and answer "busy".
    let server = three_workers();
    let k: KitchenClient = Client::connect(udp(server.addr())).unwrap().import().unwrap();
    let threads: Vec<_> = (0..5)
        .map(|_| {
            let k = k.clone();
            std::thread::spawn(move || k.sleep_ms(150).unwrap())
        })
        .collect();
    let mut runs: Vec<u32> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    runs.sort();
    assert_eq!(runs, vec![1, 2, 3, 4, 5], "every call ran exactly once");
    assert!(server.stats().busy > 0, "some calls were refused as busy first");
}

#[test]
fn a_client_with_one_thread_is_served_while_clients_with_many_keep_every_worker_busy() {
    // Three workers: two may run calls. Three clients with four threads each keep both busy with
    // 400-ms calls, asking again the moment one returns; a fourth client, with one thread, must
    // still get its calls in (before: it backed off while the busy clients' threads took every
    // freed worker, and failed after `dead_after` as overloaded).
    let server = three_workers();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hogs: Vec<_> = (0..3)
        .flat_map(|_| {
            let k: KitchenClient = Client::connect(udp(server.addr())).unwrap().import().unwrap();
            (0..4).map(move |_| (k.clone(), ()))
        })
        .map(|(k, ())| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut done = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    if k.sleep_ms(400).is_ok() {
                        done += 1;
                    }
                }
                done
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let timing = Timing { dead_after: Duration::from_secs(3), ..Timing::default() };
    let config = ClientConfig { timing, ..ClientConfig::default() };
    let small: KitchenClient = Client::connect(udp(server.addr())).unwrap().with_config(config).import().unwrap();
    for i in 0..5 {
        let s = format!("call {i}");
        assert_eq!(small.echo_str(&s).expect("the one-thread client gets its turn"), s);
    }
    stop.store(true, Ordering::Relaxed);
    let hog_calls: u32 = hogs.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(hog_calls > 0, "the busy clients were served too");
    assert!(server.stats().busy > 0, "the workers were contended");
}
