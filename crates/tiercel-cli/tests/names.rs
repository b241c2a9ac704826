//! `tiercel serve --name` and `tiercel call NAME` as separate processes: two servers under one
//! name share the clients, one killed with SIGKILL drops out at once (its lock died with it) and
//! its stale entry is removed, and the last one shut down with SIGTERM takes the name back. And a
//! user of another uid, with its own `tiercel serve`, cannot point a name elsewhere.

use std::collections::HashSet;
use std::path::Path;
use std::process::{Command, Stdio};

use tiercel::names::Registry;
use tiercel::{Client, Transport};
use tiercel_bench::seeds::TestClient;

mod common;

use common::{as_nobody, collect, Served, Sticky, NOBODY, TIERCEL};

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
    assert!(listed.contains("    1 add(i32, i32) -> i32  [shape "), "{listed}");
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
    tiercel_seeds::signal(second.child.id(), "TERM").unwrap();
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

/// `tiercel list` and `tiercel call` against an interface the command was not built with: the
/// failover test's `Journal`, served under a name by a helper process.
#[test]
fn the_command_lists_and_calls_a_users_own_interface() {
    let dir = std::env::temp_dir().join(format!("tiercel-cli-journal-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let spec = format!("dir:{}", dir.join("names").display());
    let journal = dir.join("journal");
    let child = Command::new(TIERCEL)
        .env(tiercel_bench::helpers::HELPER_ENV, "1")
        .args(["journal-server", "--addr", "udp://127.0.0.1:0", "--name", "books", "--registry", &spec, "--tag", "7"])
        .arg("--journal")
        .arg(&journal)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let served = collect(child);
    let run = |args: &[&str]| {
        let out = Command::new(TIERCEL).args(args).args(["--registry", &spec]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    };
    let (ok, listed) = run(&["list", "books"]);
    assert!(ok && listed.contains(": Journal v1 (fingerprint") && listed.contains("    0 run(u64) -> u32"), "{listed}");
    let (ok, called) = run(&["call", "books", "run", "42"]);
    assert!(ok && called.starts_with("Journal.run(42) = 7\n"), "{called}");
    let (ok, called) = run(&["call", &served.addr, "Journal.run", "43", "--repeat", "3"]);
    assert!(ok && called.starts_with("Journal.run(43) = 7\n"), "{called}");
    // The calls ran, once each, with the arguments given.
    let ran: Vec<u64> =
        std::fs::read(&journal).unwrap().chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().unwrap())).collect();
    assert_eq!(ran, [42, 43, 43, 43]);
    let (ok, refused) = run(&["call", "books", "run", "-1"]);
    assert!(!ok && refused.contains("-1 is not a u64"), "{refused}");
    let (ok, unknown) = run(&["call", "books", "nothing"]);
    assert!(!ok && unknown.contains("exports no procedure \"nothing\" (it exports Journal v1"), "{unknown}");
    drop(served);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tiercel` run to its end by root with `env` set: whether it succeeded, and its output.
fn run(args: &[&str], env: &[(&str, &Path)]) -> (bool, String) {
    let mut command = Command::new(TIERCEL);
    command.args(args).env_remove("TIERCEL_REGISTRY");
    for (k, v) in env {
        command.env(k, v);
    }
    let out = command.output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

/// A process of another user prepares what it can before root's server starts: a link where root's
/// default registry will be, a name's directory made first in a shared sticky registry, its own
/// server registered in both. Root's server refuses to register in either, naming what it found,
/// and root's client refuses to look either up: no call reaches the impostor. Where root's server
/// registered first, the impostor cannot add itself, and every import reaches root's server.
#[test]
fn a_process_of_another_user_cannot_point_a_name_elsewhere() {
    tiercel_seeds::needs!(ROOT);
    let area = Sticky::new("squat");
    let exe = area.tiercel();
    let impostor_serves = |registry: &str, name: &str| {
        let child = as_nobody(&exe, &area.0)
            .args(["serve", "--name", name, "--registry", registry, "--workers", "1", "--spin-us", "0"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        collect(child)
    };

    // 1. Root's default registry (`$XDG_RUNTIME_DIR/tiercel/names`), made a link to the impostor's
    //    own registry before root's first server.
    let run_dir = area.0.join("run");
    std::fs::create_dir(&run_dir).unwrap();
    std::fs::set_permissions(&run_dir, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    let made = as_nobody(Path::new("sh"), &area.0).args(["-c", "mkdir evil && ln -s ../evil run/tiercel"]).status();
    assert!(made.unwrap().success());
    let evil = format!("dir:{}", area.0.join("evil/names").display());
    let impostor = impostor_serves(&evil, "accounts");
    let xdg = [("XDG_RUNTIME_DIR", run_dir.as_path())];
    let (ok, out) = run(&["serve", "--name", "accounts", "--workers", "1"], &xdg);
    assert!(!ok && out.contains("is not safe: a symbolic link (owned by uid 65534)"), "{out}");
    let (ok, out) = run(&["call", "accounts", "add", "2", "3"], &xdg);
    assert!(!ok && out.contains("is not safe: a symbolic link (owned by uid 65534)"), "{out}");
    assert!(out.contains("never ran") && !out.contains("= 5"), "{out}");
    drop(impostor);

    // 2. A shared sticky registry where the impostor made the name's directory first.
    let shared = format!("dir:{}", area.0.join("shared").display());
    std::fs::create_dir(area.0.join("shared")).unwrap();
    std::fs::set_permissions(area.0.join("shared"), std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    let impostor = impostor_serves(&shared, "accounts");
    let (ok, out) = run(&["serve", "--name", "accounts", "--registry", &shared, "--workers", "1"], &[]);
    assert!(!ok && out.contains("is not safe: owned by uid 65534"), "{out}");
    let (ok, out) = run(&["call", "accounts", "add", "2", "3", "--registry", &shared], &[]);
    assert!(!ok && out.contains("is not safe: owned by uid 65534") && out.contains("never ran"), "{out}");
    // Trusted by name, the same user's server is reached: the refusal above was the trust rule.
    let (ok, out) = run(&["call", "accounts", "add", "2", "3", "--registry", &format!("{shared}?trust={NOBODY}")], &[]);
    assert!(ok && out.contains("add(2, 3) = 5"), "{out}");
    drop(impostor);

    // 3. Root's server registered first: the impostor can neither register beside it nor plant an
    //    entry, and every import reaches root's server.
    let real = serve_named(&shared, "billing");
    let out = as_nobody(&exe, &area.0).args(["serve", "--name", "billing", "--registry", &shared]).output().unwrap();
    assert!(!out.status.success(), "the impostor registered beside root's server");
    let planted = as_nobody(Path::new("sh"), &area.0)
        .args(["-c", "echo x > shared/billing/0000000000000001-1"])
        .status()
        .unwrap();
    assert!(!planted.success(), "the impostor wrote into root's name");
    let registry = Registry::parse(&shared).unwrap();
    for _ in 0..10 {
        let client: TestClient = Client::connect("billing").unwrap().with_registry(registry.clone()).import().unwrap();
        assert_eq!(format!("udp://{}", client.binding().server()), real.addr);
        assert_eq!(client.add(2, 3).unwrap(), 5);
    }
}
