//! TCP where UDP cannot go: a server in a network namespace of its own whose UDP port nftables
//! drops every packet to and from, reached from a client namespace over a veth pair. A forced
//! `udp://` bind gets no answer; a plain address falls back to TCP by itself; `tcp://` binds at
//! once; and a server killed with SIGKILL mid-call fails that call at once as "may have run".
//! Needs root, `ip` and `nft`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use tiercel_bench::netns::{Pair, SERVER_IP};

const TIERCEL: &str = env!("CARGO_BIN_EXE_tiercel");
const PORT: u16 = 7300;

fn tiercel_in(ns: &str, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, TIERCEL]).args(args);
    c
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// A server process, killed when dropped.
struct Served(std::process::Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(pair: &Pair) -> Served {
    let addr = format!("{SERVER_IP}:{PORT}");
    let mut child = tiercel_in(&pair.b, &["serve", "--addr", &addr]).stdout(Stdio::piped()).spawn().unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut lines = Vec::new();
    for _ in 0..3 {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        lines.push(line);
    }
    assert!(lines[0].starts_with("listening udp://"), "{lines:?}");
    assert!(lines.iter().any(|l| l.starts_with(&format!("also over TCP at tcp://{addr}"))), "{lines:?}");
    // Keep reading what it prints, so that it never blocks on a full pipe.
    std::thread::spawn(move || for _ in reader.lines() {});
    Served(child)
}

#[test]
fn where_udp_is_dropped_calls_go_over_tcp_and_a_killed_server_fails_them_at_once() {
    tiercel_seeds::needs!(ROOT, IP, NFT);
    let pair = Pair::new(PORT, 100.0).unwrap();
    let mut server = serve(&pair);
    let addr = format!("{SERVER_IP}:{PORT}");

    // UDP forced: the bind request is dropped, and the client says so.
    let out = tiercel_in(&pair.a, &["call", &format!("udp://{addr}"), "add", "2", "3"]).output().unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("did not answer the bind request"), "{}", text(&out));

    // The binder chooses: UDP gets no answer, so it binds over TCP.
    let out = tiercel_in(&pair.a, &["call", &addr, "add", "2", "3"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("add(2, 3) = 5"), "{}", text(&out));

    // TCP forced: at once, and many calls on one binding.
    let out = tiercel_in(&pair.a, &["call", &format!("tcp://{addr}"), "null", "--repeat", "2000"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("over 2000 calls"), "{}", text(&out));
    let out = tiercel_in(&pair.a, &["list", &format!("tcp://{addr}")]).output().unwrap();
    assert!(out.status.success() && text(&out).contains("Test v1"), "{}", text(&out));

    // A call of 5 s under way when the server is killed: it fails when the connection is reset,
    // not after a timeout, and says the procedure may have run.
    let caller = tiercel_in(&pair.a, &["call", &format!("tcp://{addr}"), "work", "5000000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    server.0.kill().unwrap();
    let killed = Instant::now();
    let out = caller.wait_with_output().unwrap();
    let waited = killed.elapsed();
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("connection to server"), "{}", text(&out));
    assert!(text(&out).contains("may have run"), "{}", text(&out));
    assert!(waited < Duration::from_secs(3), "the caller took {waited:?} to see the server gone");
}
