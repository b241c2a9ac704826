//! Client and server in two network namespaces joined by a veth pair (1500-byte MTU, so MaxArg and
//! MaxResult travel as two fragments each): 100,000 calls of every `Test` procedure.
//!
//! Needs root and `ip` (iproute2). The namespaces and the veth pair are created here and removed
//! afterwards, even when the test fails. Addresses come from TEST-NET-1 (192.0.2.0/24) and exist only
//! inside the two namespaces.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

const TIERCEL: &str = env!("CARGO_BIN_EXE_tiercel");

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip (iproute2)");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// Two namespaces joined by a veth pair; removed on drop.
struct Net {
    a: String,
    b: String,
}

impl Net {
    fn new() -> Net {
        let id = std::process::id();
        let net = Net { a: format!("tcA{id}"), b: format!("tcB{id}") };
        ip(&["netns", "add", &net.a]);
        ip(&["netns", "add", &net.b]);
        let (va, vb) = (format!("tca{id}"), format!("tcb{id}"));
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb]);
        ip(&["link", "set", &va, "netns", &net.a]);
        ip(&["link", "set", &vb, "netns", &net.b]);
        for (ns, dev, addr) in [(&net.a, &va, "192.0.2.1/24"), (&net.b, &vb, "192.0.2.2/24")] {
            ip(&["-n", ns, "addr", "add", addr, "dev", dev]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        net
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end inside it, and with it the pair.
        let _ = Command::new("ip").args(["netns", "del", &self.a]).status();
        let _ = Command::new("ip").args(["netns", "del", &self.b]).status();
    }
}

#[test]
fn hundred_thousand_calls_of_every_procedure_across_namespaces() {
    tiercel_seeds::needs!(ROOT, IP);
    let net = Net::new();
    let mut server = Command::new("ip")
        .args(["netns", "exec", &net.b, TIERCEL, "serve", "--addr", "udp://192.0.2.2:7373"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start server in namespace");
    let mut out = BufReader::new(server.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "listening udp://192.0.2.2:7373");
    let result = Command::new("ip")
        .args(["netns", "exec", &net.a, TIERCEL, "check", "udp://192.0.2.2:7373", "--rounds", "100000"])
        .output()
        .expect("run client in namespace");
    let _ = server.kill();
    let _ = server.wait();
    drop(out);
    let stdout = String::from_utf8_lossy(&result.stdout);
    assert!(result.status.success(), "{stdout}{}", String::from_utf8_lossy(&result.stderr));
    assert!(stdout.contains(&format!("ok: {} calls", 100_000 * tiercel_bench::seeds::CHECK_CALLS)), "{stdout}");
}
