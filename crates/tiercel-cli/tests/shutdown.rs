//! `tiercel serve` shuts down gracefully on SIGTERM: it says so, finishes, and exits successfully;
//! afterwards a client is told at once that no server is there.

use std::process::Command;
use std::time::{Duration, Instant};

mod common;

use common::TIERCEL;

#[test]
fn sigterm_shuts_the_server_down_gracefully() {
    let mut served = common::serve("127.0.0.1:0");
    let addr = served.addr.clone();
    let call = |addr: &str| Command::new(TIERCEL).args(["call", addr, "add", "2", "3"]).output().unwrap();
    let out = call(&addr);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("= 5"), "{out:?}");
    tiercel_seeds::signal(served.child.id(), "TERM").unwrap();
    // Bounded so that a server that never exits fails the test instead of hanging it.
    let give_up = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = served.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < give_up, "the server did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    // The output thread may still be reading the last lines.
    std::thread::sleep(Duration::from_millis(100));
    let lines = served.lines.lock().unwrap().join("\n");
    assert!(lines.contains("shutting down") && lines.ends_with("stopped"), "{lines}");
    let out = call(&addr);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("no server at"), "{err}");
    assert!(err.contains("never ran"), "{err}");
}
