//! One server exporting two versions of an interface side by side: each client binds to its own
//! version, `tiercel list` shows both with each procedure's shape, and `tiercel call` calls the
//! newest unless a version is named (`Store@1.put`).

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tiercel::{Client, Server};

const TIERCEL: &str = env!("CARGO_BIN_EXE_tiercel");

mod v1 {
    #[tiercel::interface]
    pub trait Store {
        fn get(&self, key: u32) -> u64;
        fn put(&self, key: u32, value: u64);
    }
}

mod v2 {
    #[tiercel::interface(version = 2)]
    pub trait Store {
        fn get(&self, key: u32) -> Option<u64>;
        fn put(&self, key: u32, value: u64) -> bool;
    }
}

/// Both versions over one cell: v1 adds 1000 to what it stores, so that the answer tells which ran.
struct Cell(Arc<AtomicU64>);

impl v1::Store for Cell {
    fn get(&self, _: u32) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
    fn put(&self, _: u32, value: u64) {
        self.0.store(value + 1000, Ordering::SeqCst);
    }
}

impl v2::Store for Cell {
    fn get(&self, _: u32) -> Option<u64> {
        Some(self.0.load(Ordering::SeqCst))
    }
    fn put(&self, _: u32, value: u64) -> bool {
        self.0.store(value, Ordering::SeqCst);
        true
    }
}

fn tiercel(args: &[&str]) -> String {
    let out = Command::new(TIERCEL).args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "tiercel {args:?}: {text}{}", String::from_utf8_lossy(&out.stderr));
    text
}

#[test]
fn two_versions_side_by_side_serve_their_own_clients_and_the_command_line() {
    let cell = Arc::new(AtomicU64::new(0));
    let server = Server::bind("udp://127.0.0.1:0")
        .unwrap()
        .export(v1::StoreServer::new(Cell(cell.clone())))
        .export(v2::StoreServer::new(Cell(cell.clone())))
        .start()
        .unwrap();
    let addr = format!("udp://{}", server.addr());
    let old: v1::StoreClient = Client::connect(addr.as_str()).unwrap().import().unwrap();
    let new: v2::StoreClient = Client::connect(addr.as_str()).unwrap().import().unwrap();
    old.put(1, 5).unwrap();
    assert_eq!(new.get(1).unwrap(), Some(1005), "v1's put ran");
    assert!(new.put(1, 7).unwrap());
    assert_eq!(old.get(1).unwrap(), 7, "v2's put ran");

    let listed = tiercel(&["list", &addr]);
    assert!(listed.contains(": Store v1 (fingerprint") && listed.contains(": Store v2 (fingerprint"), "{listed}");
    assert!(listed.contains("put(u32, u64) -> bool  [shape "), "{listed}");
    // The newest version unless one is named.
    let called = tiercel(&["call", &addr, "Store.put", "1", "9"]);
    assert!(called.contains("true"), "{called}");
    assert_eq!(cell.load(Ordering::SeqCst), 9);
    tiercel(&["call", &addr, "Store@1.put", "1", "9"]);
    assert_eq!(cell.load(Ordering::SeqCst), 1009);
    let got = tiercel(&["call", &addr, "get", "1"]);
    assert!(got.contains("1009"), "{got}");
}
