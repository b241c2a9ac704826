//! Calls through AF_XDP across two network namespaces (as root) with the fault-injection layer under
//! every frame both sides send: lost, duplicated and overtaken frames (nftables never sees them, so
//! the layer drops them in the station) are recovered by the protocol, and every result is right.
//! A test binary of its own: the layer is installed for the whole process.
#![cfg(all(feature = "xdp", feature = "fault-injection"))]

mod xdp_common;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use tiercel::{Client, ClientConfig, Timing, Transport};
use tiercel_seeds::{check_all, fill, pattern, TestClient};
use tiercel_sys::faults::{self, FaultConfig};
use xdp_common::*;

#[test]
fn calls_through_af_xdp_recover_from_lost_duplicated_and_overtaken_frames() {
    tiercel_seeds::needs!(ROOT, IP, CLANG, LIBBPF);
    let config = FaultConfig { loss: 0.05, dup: 0.05, reorder: 0.05, seed: 42, ..FaultConfig::default() };
    assert!(faults::install(config), "the layer was installed before this test");
    let pair = Pair::new();
    let port = tiercel_seeds::free_port();
    let addr: SocketAddr = format!("{}:{port}", pair.server_ip()).parse().unwrap();
    let (status, stop, server) = serve(&pair.a, addr, &pair.va);
    assert!(matches!(status, Some(Ok(_))), "{status:?}");
    let (transport, retransmissions) = in_namespace(&pair.b, move || {
        // Retransmissions after a few milliseconds, so that the test does not wait long for them.
        let ms = std::time::Duration::from_millis;
        let timing =
            Timing { retransmit_initial: ms(5), retransmit_min: ms(5), retransmit_max: ms(50), ..Timing::default() };
        let config = ClientConfig { timing, ..ClientConfig::default() };
        let client: TestClient =
            Client::connect(format!("xdp://{addr}")).unwrap().with_config(config).import().unwrap();
        for round in 0..30 {
            check_all(&client, round).unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        let mut big = vec![0u8; 64 << 10];
        fill(&mut big);
        for _ in 0..5 {
            client.bulk_in_out(tiercel::InOut(&mut big)).unwrap();
            assert!(big.iter().enumerate().all(|(i, &b)| b == pattern(i)), "64 KiB came back changed");
        }
        (client.binding().transport(), client.binding().stats().retransmissions)
    });
    assert_eq!(transport, Transport::Xdp);
    let counts = faults::counts().unwrap();
    let (dropped, duplicated, delayed) = (
        counts.dropped.load(Ordering::Relaxed),
        counts.duplicated.load(Ordering::Relaxed),
        counts.delayed.load(Ordering::Relaxed),
    );
    assert!(dropped > 0 && duplicated > 0 && delayed > 0, "{dropped} dropped, {duplicated} sent twice, {delayed} held");
    assert!(retransmissions > 0, "frames were lost, yet nothing was retransmitted");
    stop.send(()).unwrap();
    server.join().unwrap();
}
