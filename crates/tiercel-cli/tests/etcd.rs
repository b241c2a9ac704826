//! `tiercel serve --name … --registry etcd://…` as separate processes against a real etcd: three
//! exporters share the name; one killed with SIGKILL (no chance to unregister) drops out when its
//! lease runs out, and calls by name go on to the others meanwhile and after.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tiercel::names::Registry;
use tiercel_bench::etcd::EtcdServer;

mod common;

use common::{collect, Served, TIERCEL};

/// The lease's time to live, seconds.
const TTL: u64 = 2;

fn serve_named(registry: &str) -> Served {
    let child = Command::new(TIERCEL)
        .args(["serve", "--name", "accounts", "--registry", registry, "--workers", "1", "--spin-us", "0"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    collect(child)
}

fn call_add(registry: &str) -> String {
    let out =
        Command::new(TIERCEL).args(["call", "accounts", "add", "2", "3", "--registry", registry]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_killed_exporter_drops_out_when_its_lease_runs_out() {
    tiercel_seeds::needs!(ETCD);
    let etcd = EtcdServer::start().unwrap();
    let spec = etcd.registry(TTL);
    let registry = Registry::parse(&spec).unwrap();
    let mut servers: Vec<Served> = (0..3).map(|_| serve_named(&spec)).collect();
    assert_eq!(registry.lookup("accounts").unwrap().len(), 3);
    assert!(call_add(&spec).contains("add(2, 3) = 5"));

    let victim = servers.remove(0);
    let killed_addr = victim.addr.trim_start_matches("udp://").to_string();
    let mut victim = victim;
    victim.child.kill().unwrap();
    victim.child.wait().unwrap();
    let killed = Instant::now();
    // Until the lease runs out the entry is still there; imports that pick it fail over to the
    // next exporter (the dead one answers the bind with a port unreachable).
    let mut calls = 0;
    while registry.lookup("accounts").unwrap().iter().any(|e| e.addr.to_string() == killed_addr) {
        assert!(killed.elapsed() < Duration::from_secs(5 * TTL + 5), "the killed server's entry outlived its lease");
        assert!(call_add(&spec).contains("add(2, 3) = 5"));
        calls += 1;
    }
    let gone_after = killed.elapsed();
    eprintln!(
        "the killed exporter's entry was gone {gone_after:?} after SIGKILL (lease {TTL} s), {calls} calls meanwhile"
    );
    assert_eq!(registry.lookup("accounts").unwrap().len(), 2);
    for _ in 0..5 {
        assert!(call_add(&spec).contains("add(2, 3) = 5"));
    }
    drop(servers);
}
