//! What idle TCP connections cost the server: no thread and little memory each. Alone in their
//! test binary (and one after the other), since they count the threads of the whole process.

use std::net::TcpStream;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tiercel::{In, Server, ServerConfig};
use tiercel_seeds::{self as seeds, SeedTest, TestServer};

#[allow(dead_code)]
mod tcp_common;

use tcp_common::{bind_raw, serve, tcp};

/// Held by each test: they count the threads of the process.
static ALONE: Mutex<()> = Mutex::new(());

#[test]
fn ten_thousand_idle_connections_hold_no_thread_and_little_memory() {
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    // Each connection is a descriptor here and one at the server, both in this process.
    let limit = seeds::raise_open_files();
    let n = 10_000.min(limit.saturating_sub(1000) as usize / 2);
    assert!(n >= 400, "too few descriptors for the test: {limit}");
    let config = ServerConfig { max_bindings: n + 10, ..ServerConfig::default() };
    let server =
        Server::bind("127.0.0.1:0").unwrap().with_config(config).export(TestServer::new(SeedTest)).start().unwrap();
    let warm = tcp(&server);
    assert_eq!(warm.add(1, 1).unwrap(), 2);
    let (threads_before, rss_before) = seeds::threads_and_rss();
    let idle: Vec<TcpStream> = (0..n).map(|_| bind_raw(&server).0).collect();
    let bound = Instant::now() + Duration::from_secs(30);
    while server.bindings() < n + 1 {
        assert!(Instant::now() < bound, "{} of {n} bound: {}", server.bindings(), server.stats());
        std::thread::sleep(Duration::from_millis(10));
    }
    let (threads, rss) = seeds::threads_and_rss();
    let held = server.message_memory();
    let per_connection = rss.saturating_sub(rss_before) / n as u64;
    eprintln!(
        "{n} idle connections: threads {threads_before} → {threads}, resident memory +{} KiB ({per_connection} \
         bytes each, both ends), message memory {held} bytes",
        rss.saturating_sub(rss_before) >> 10
    );
    assert!(threads <= threads_before + 4, "{n} idle connections took {} threads", threads - threads_before);
    assert!(held <= 1 << 20, "{n} idle connections hold {held} bytes of message memory");
    assert!(per_connection <= 2048, "{per_connection} bytes of resident memory for each idle connection");
    // Clients still bind and call, small and large, on every transport.
    let client = tcp(&server);
    assert_eq!(client.add(20, 22).unwrap(), 42);
    seeds::every_transport_serves(server.addr()).expect("a client beside the idle connections");
    // The server closes first, so that the TIME_WAIT of 10,000 connections stays on its own port:
    // on the clients' ports it would keep later servers of this machine from listening there for
    // a minute.
    drop(client);
    drop(server);
    drop(idle);
}

#[test]
fn an_idle_binding_gives_up_its_thread_and_its_next_call_wakes_it() {
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    let server = serve();
    let client = tcp(&server);
    let big: Vec<u8> = (0..1 << 20).map(seeds::pattern).collect();
    client.bulk_in(In(&big)).unwrap();
    let (busy, _) = seeds::threads_and_rss();
    assert!(server.message_memory() >= 64 << 10, "a binding in use holds its buffer");
    // Idle past the parking time: its thread ends and its buffers go.
    let parked = Instant::now() + Duration::from_secs(10);
    while seeds::threads_and_rss().0 >= busy || server.message_memory() > 0 {
        assert!(Instant::now() < parked, "never parked: {} bytes held", server.message_memory());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(server.bindings(), 1, "parked, still bound");
    for i in 0..100 {
        assert_eq!(client.add(i, 1).unwrap(), i + 1);
    }
    client.bulk_in(In(&big)).unwrap();
    assert_eq!(server.stats().bindings, 1, "the same binding all along");
}
