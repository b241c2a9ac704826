//! The shared-memory transport gives the pages of large transfers back, but not on every call of a
//! stream of large calls (faulting 16 MiB in anew each time would cost more than the copy). Alone in
//! its test binary: it reads the process's resident shared memory.

use std::time::Duration;

use tiercel::{Client, InOut, Server, Transport};
use tiercel_seeds::{SeedTest, TestClient, TestServer};

/// Resident shared memory of this process (both mappings of the region count), MiB.
fn shmem_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("RssShmem:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kib / 1024.0
}

#[test]
fn large_transfers_give_their_slot_pages_back_but_not_on_every_call_of_a_stream() {
    let server = Server::bind("udp://127.0.0.1:0").unwrap().export(TestServer::new(SeedTest)).start().unwrap();
    let client: TestClient = Client::connect(server.addr()).unwrap().import().unwrap();
    assert_eq!(client.binding().transport(), Transport::SharedMemory);
    client.null().unwrap();
    let base = shmem_mib();
    // 16 MiB each way: a buffer of the size the message limit is made for.
    let mut big = vec![7u8; 16 << 20];
    client.bulk_in_out(InOut(&mut big)).unwrap();
    assert!(big.iter().all(|&b| b == 7));
    let after_one = shmem_mib();
    assert!(after_one < base + 4.0, "the first large transfer gave its pages back: {base:.1} → {after_one:.1} MiB");
    // A stream of large calls keeps the pages (it would fault them in again on every call).
    for _ in 0..3 {
        client.bulk_in_out(InOut(&mut big)).unwrap();
    }
    let streaming = shmem_mib();
    assert!(streaming > base + 12.0, "pages kept while large calls come: {base:.1} → {streaming:.1} MiB");
    // After a pause, the next large transfer gives them back again.
    std::thread::sleep(Duration::from_millis(1100));
    client.bulk_in_out(InOut(&mut big)).unwrap();
    let after_pause = shmem_mib();
    assert!(after_pause < base + 4.0, "given back after a pause: {base:.1} → {after_pause:.1} MiB");
}
