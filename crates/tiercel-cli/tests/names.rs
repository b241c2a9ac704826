//! `tiercel serve --name` and `tiercel call NAME` as separate processes: two servers under one
//! name share the clients, one killed with SIGKILL drops out at once (its lock died with it) and
//! its stale entry is removed, and the last one shut down with SIGTERM takes the name back.

use std::collections::HashSet;
use std::process::{Command, Stdio};

use tiercel::names::Registry;
use tiercel::{Client, Transport};
use tiercel_bench::seeds::TestClient;

mod common;

use common::{collect, Served, TIERCEL};

fn serve_named(registry: &str, name: &str) -> Served {
    let child = Command::new(TIERCEL)
        .args(["serve", "--name", name, "--registry", registry, "--workers", "1", "--spin-us", "0"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    collect(child)
}

/// `tiercel call NAME add 2 3`: its output, and whether it succeeded.
fn call_add(registry: &str, name: &str) -> (bool, String) {
    let out = Command::new(TIERCEL).args(["call", name, "add", "2", "3", "--registry", registry]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn servers_export_a_name_and_clients_call_it_until_the_last_is_gone() {
    let dir = std::env::temp_dir().join(format!("tiercel-cli-names-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let spec = format!("dir:{}", dir.display());
    let registry = Registry::parse(&spec).unwrap();
    let mut first = serve_named(&spec, "accounts");
    let second = serve_named(&spec, "accounts");
    let addrs: HashSet<String> =
        [&first, &second].iter().map(|s| s.addr.trim_start_matches("udp://").to_string()).collect();

    for _ in 0..3 {
        let (ok, out) = call_add(&spec, "accounts");
        assert!(ok && out.contains("add(2, 3) = 5"), "{out}");
    }
    // `tiercel list`: the names, then what the exporters of one export, procedure by procedure.
    let list = |args: &[&str]| {
        let out = Command::new(TIERCEL).arg("list").args(args).args(["--registry", &spec]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let names = list(&[]);
    assert!(names.starts_with("1 name in dir:"), "{names}");
    assert_eq!(names.lines().filter(|l| l.starts_with("accounts\tTest v1\t127.0.0.1:")).count(), 2, "{names}");
    let listed = list(&["accounts"]);
    assert_eq!(listed.lines().filter(|l| l.contains(": Test v1 (fingerprint")).count(), 2, "{listed}");
    assert!(listed.contains("    1 add(i32, i32) -> i32"), "{listed}");
    let one = list(&[&first.addr]);
    assert_eq!(one.lines().filter(|l| l.contains(": Test v1")).count(), 1, "{one}");
    // Bindings by name go to both servers, through shared memory (they are on this host).
    let mut bound = HashSet::new();
    for _ in 0..30 {
        let client: TestClient = Client::connect("accounts").unwrap().with_registry(registry.clone()).import().unwrap();
        assert_eq!(client.binding().transport(), Transport::SharedMemory);
        assert_eq!(client.add(40, 2).unwrap(), 42);
        bound.insert(client.binding().server().to_string());
    }
    assert_eq!(bound, addrs);

    // SIGKILL: no chance to unregister, but the lock on its entry died with it.
    let killed = first.addr.trim_start_matches("udp://").to_string();
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    for _ in 0..10 {
        let client: TestClient = Client::connect("accounts").unwrap().with_registry(registry.clone()).import().unwrap();
        assert_ne!(client.binding().server().to_string(), killed, "bound to the killed server");
        assert_eq!(client.add(1, 2).unwrap(), 3);
    }
    let entries = std::fs::read_dir(dir.join("accounts")).unwrap().count();
    assert_eq!(entries, 1, "the killed server's entry is removed by the first lookup that finds it stale");

    // SIGTERM: a graceful shutdown takes the name back.
    let pid = second.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !registry.lookup("accounts").unwrap().is_empty() {
        assert!(std::time::Instant::now() < deadline, "the name outlived the shutdown");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (ok, out) = call_add(&spec, "accounts");
    assert!(!ok && out.contains("no server exports the name \"accounts\"") && out.contains("never ran"), "{out}");
    drop(second);
    let _ = std::fs::remove_dir_all(&dir);
}
