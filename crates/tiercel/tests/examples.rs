//! The standalone examples work as their docs say: the server in one process, the client in
//! another, then a graceful shutdown on SIGTERM.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// An example's executable, built by `cargo test` beside the test executables.
fn example(name: &str) -> PathBuf {
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let path = deps.parent().unwrap().join("examples").join(name);
    assert!(path.exists(), "{} is built by `cargo test`", path.display());
    path
}

#[test]
fn the_example_client_calls_the_example_server_in_another_process() {
    let mut server = Command::new(example("server")).arg("udp://127.0.0.1:0").stdout(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines().map_while(Result::ok);
    let first = lines.next().expect("the server prints its address");
    let addr = first.strip_prefix("listening ").expect("a `listening ADDR` line");
    let out = Command::new(example("client")).arg(format!("udp://{addr}")).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    for line in [
        "add(2, 3) = 5",
        "checksum(0..=255) = 32640",
        "divide(7, 0) failed in the procedure: cannot divide 7 by 0",
        "divide(7, 2) within 100 ms = Ok(3)",
    ] {
        assert!(text.contains(line), "{line:?} in {text}");
    }
    assert!(Command::new("kill").args(["-TERM", &server.id().to_string()]).status().unwrap().success());
    let give_up = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = server.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < give_up, "the server did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    assert_eq!(lines.next().as_deref(), Some("shutting down after 4 calls"));
}
