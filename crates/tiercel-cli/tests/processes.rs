//! Server and client in separate processes on loopback: 100,000 calls of every `Test` procedure, each
//! result verified, then several threads sharing one binding.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

const TIERCEL: &str = env!("CARGO_BIN_EXE_tiercel");

/// A child process killed when dropped, with its stdout kept open.
pub struct Spawned(Child, #[allow(dead_code)] BufReader<std::process::ChildStdout>);

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve() -> (Spawned, String) {
    let mut child = Command::new(TIERCEL)
        .args(["serve", "--addr", "udp://127.0.0.1:0"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start tiercel serve");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let addr = line.trim().strip_prefix("listening ").expect("serve prints its address first").to_string();
    (Spawned(child, out), addr)
}

fn check(addr: &str, rounds: u32, threads: u32) -> String {
    let out = Command::new(TIERCEL)
        .args(["check", addr, "--rounds", &rounds.to_string(), "--threads", &threads.to_string()])
        .output()
        .expect("run tiercel check");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "check failed: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

#[test]
fn hundred_thousand_calls_of_every_procedure_across_processes() {
    let (_server, addr) = serve();
    let out = check(&addr, 100_000, 1);
    assert!(out.contains(&format!("ok: {} calls", 100_000 * tiercel::seeds::CHECK_CALLS)), "{out}");
    let out = check(&addr, 2_000, 8);
    assert!(out.contains(&format!("ok: {} calls", 2_000 * 8 * tiercel::seeds::CHECK_CALLS)), "{out}");
}

#[test]
fn call_prints_result_and_latency_and_errors_clearly() {
    let (_server, addr) = serve();
    let out = Command::new(TIERCEL).args(["call", &addr, "add", "40", "2"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(text.contains("add(40, 2) = 42") && text.contains("latency"), "{text}");
    let out = Command::new(TIERCEL).args(["call", &addr, "max_result", "--repeat", "100"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("pattern ok: true") && text.contains("median"), "{text}");
    let out = Command::new(TIERCEL).args(["call", &addr, "nonesuch"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown procedure"));
    for cmd in ["serve", "call", "check", "bench"] {
        let out = Command::new(TIERCEL).args([cmd, "--help"]).output().unwrap();
        assert!(out.status.success() && !out.stdout.is_empty(), "{cmd} --help");
    }
}

#[test]
fn a_server_with_a_secret_file_binds_only_clients_that_hold_it() {
    let dir = std::env::temp_dir().join(format!("tiercel-secret-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (right, wrong, short) = (dir.join("right"), dir.join("wrong"), dir.join("short"));
    std::fs::write(&right, "0123456789abcdef0123456789abcdef\n").unwrap();
    std::fs::write(&wrong, "fedcba9876543210fedcba9876543210\n").unwrap();
    std::fs::write(&short, "tooshort\n").unwrap();
    for f in [&right, &wrong, &short] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let secret_arg = |p: &std::path::Path| p.to_str().unwrap().to_string();

    let mut child = Command::new(TIERCEL)
        .args(["serve", "--addr", "udp://127.0.0.1:0", "--secret-file", &secret_arg(&right)])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let _server = Spawned(child, out);
    let addr = line.trim().strip_prefix("listening ").unwrap().to_string();

    let run = |extra: &[&str]| {
        let out = Command::new(TIERCEL).args(["check", &addr, "--rounds", "100"]).args(extra).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, text) = run(&["--secret-file", &secret_arg(&right)]);
    assert!(ok && text.contains(&format!("ok: {} calls", 100 * tiercel::seeds::CHECK_CALLS)), "{text}");
    let (ok, text) = run(&[]);
    assert!(!ok && text.contains("requires a shared secret"), "{text}");
    let (ok, text) = run(&["--secret-file", &secret_arg(&wrong)]);
    assert!(!ok && text.contains("secrets differ"), "{text}");
    let (ok, text) = run(&["--secret-file", &secret_arg(&short)]);
    assert!(!ok && text.contains("at least 16 needed"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_prints_every_row_against_its_baseline() {
    // A tiny run: the harness, not the speed (no test asserts a speed).
    let json = std::env::temp_dir().join(format!("tiercel-bench-{}.json", std::process::id()));
    let out = Command::new(TIERCEL)
        .args(["bench", "--calls", "200", "--rounds", "2", "--blocking", "--latency-only", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    for table in [
        "UDP over loopback; both sides busy-poll",
        "UDP over loopback; both sides block",
        "shared memory; both sides spin",
        "shared memory; both sides sleep on futexes",
    ] {
        assert!(text.contains(table), "missing table {table:?}: {text}");
    }
    for row in ["Null", "Add", "BigIn", "BigInOut", "MaxResult"] {
        let lines = text.lines().filter(|l| l.starts_with(&format!("{row} "))).count();
        assert_eq!(lines, 4, "{row} in each of the four tables: {text}");
    }
    assert!(text.contains("raw = futex ping-pong") && text.contains("raw = UDP ping-pong"), "{text}");
    assert!(text.contains("ratio"), "{text}");
    // The same tables as JSON.
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    let tables = report["latency"].as_array().unwrap();
    assert_eq!(tables.len(), 4);
    for t in tables {
        assert!(["udp", "shm"].contains(&t["transport"].as_str().unwrap()));
        let rows = t["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 5);
        for r in rows {
            assert!(r["raw_median_us"].as_f64().unwrap() > 0.0 && r["rpc_p99_us"].as_f64().unwrap() > 0.0);
            assert!(r["ratio_median"].as_f64().unwrap() > 0.0);
            assert_eq!(r["calls"].as_u64(), Some(200));
        }
    }
}
