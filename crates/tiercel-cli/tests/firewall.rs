//! A local firewall that drops a third of a client's packets on their way out: the kernel fails
//! those `sendmsg` calls with `EPERM`, and the client must take each for a lost packet and
//! retransmit it, not fail the call as "may have run". Runs client and server in a network namespace
//! of its own (needs root, `ip` and `nft`).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

const TIERCEL: &str = env!("CARGO_BIN_EXE_tiercel");

/// A network namespace with its loopback up, deleted (with its rules and processes' sockets) when
/// dropped; the server process in it is killed first.
struct Namespace {
    name: String,
    server: Option<Child>,
}

impl Namespace {
    fn new(name: String) -> Namespace {
        run("ip", &["netns", "add", &name]);
        let ns = Namespace { name, server: None };
        run("ip", &["-n", &ns.name, "link", "set", "lo", "up"]);
        ns
    }

    fn nft(&self, args: &[&str]) {
        let mut all = vec!["netns", "exec", &self.name, "nft"];
        all.extend_from_slice(args);
        run("ip", &all);
    }

    fn tiercel(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, TIERCEL]).args(args);
        c
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        if let Some(mut s) = self.server.take() {
            let _ = s.kill();
            let _ = s.wait();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

fn run(program: &str, args: &[&str]) {
    let status = Command::new(program).args(args).status().unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(status.success(), "{program} {args:?} failed");
}

#[test]
fn a_firewall_drop_on_the_way_out_is_a_lost_packet_not_a_failed_call() {
    tiercel_seeds::needs!(ROOT, IP, NFT);
    let mut ns = Namespace::new(format!("tcfw{}", std::process::id()));
    let port = "7400";
    ns.nft(&["add", "table", "inet", "tiercel"]);
    ns.nft(&["add", "chain", "inet", "tiercel", "out", "{ type filter hook output priority 0; }"]);
    // Packets to the server's port: the client's bind requests, calls, probes and acks.
    ns.nft(&[
        "add", "rule", "inet", "tiercel", "out", "udp", "dport", port, "numgen", "random", "mod", "3", "==", "0",
        "drop",
    ]);
    let mut server =
        ns.tiercel(&["serve", "--addr", &format!("udp://127.0.0.1:{port}")]).stdout(Stdio::piped()).spawn().unwrap();
    let mut first = String::new();
    BufReader::new(server.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert!(first.starts_with("listening"), "{first}");
    ns.server = Some(server);

    // UDP only: through shared memory nothing would cross the firewall.
    let out = ns
        .tiercel(&["check", &format!("udp://127.0.0.1:{port}"), "--rounds", "200", "--threads", "2"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}{stderr}");
    assert!(out.status.success(), "calls failed behind a dropping firewall:\n{stdout}{stderr}");
    // The drops happened, and were recovered: the client retransmitted (about a third of 6,800 calls'
    // packets were refused by the firewall).
    let retransmissions: u64 = stdout
        .split(" retransmissions")
        .next()
        .and_then(|s| s.rsplit('(').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no retransmission count in {stdout}"));
    assert!(retransmissions > 100, "{retransmissions} retransmissions: did the firewall drop anything?");
}
