//! Shared memory across real processes: a `tiercel serve` process and `tiercel check` clients with
//! 1 to 8 threads on one binding, every result verified; and either process killed mid-call.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{Served, TIERCEL};

/// A server on `127.0.0.1` (with a free port) and its address without the scheme.
fn serve() -> (Served, String) {
    let served = common::serve("127.0.0.1:0");
    let addr = served.addr.strip_prefix("udp://").expect("a UDP address").to_string();
    (served, addr)
}

fn held_bindings(served: &Served) -> Option<u64> {
    served.stats_since(0)?.get("bindings_held").copied()
}

fn check(addr: &str, rounds: u32, threads: u32) -> String {
    let out = Command::new(TIERCEL)
        .args(["check", addr, "--rounds", &rounds.to_string(), "--threads", &threads.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    text
}

#[test]
fn every_procedure_across_processes_with_one_to_eight_threads() {
    let (_served, addr) = serve();
    // A plain address on this host chooses shared memory; `shm:` insists on it.
    let out = check(&addr, 100_000, 1);
    assert!(
        out.contains("through shared memory")
            && out.contains(&format!("ok: {} calls", 100_000 * tiercel_bench::seeds::CHECK_CALLS)),
        "{out}"
    );
    for threads in [2, 4, 8] {
        let out = check(&format!("shm:{}", addr), 2_000, threads);
        assert!(
            out.contains(&format!("ok: {} calls", 2_000 * threads as u64 * tiercel_bench::seeds::CHECK_CALLS)),
            "{out}"
        );
    }
    let out = check(&format!("udp://{}", addr), 1_000, 2);
    assert!(
        out.contains("through UDP")
            && out.contains(&format!("ok: {} calls", 1_000 * 2 * tiercel_bench::seeds::CHECK_CALLS)),
        "{out}"
    );
}

#[test]
fn a_killed_server_fails_the_client_clearly_and_quickly() {
    let (mut served, addr) = serve();
    let client = Command::new(TIERCEL)
        .args(["check", &format!("shm:{}", addr), "--rounds", "100000000", "--threads", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    served.child.kill().unwrap();
    let killed = Instant::now();
    let out = client.wait_with_output().unwrap();
    let took = killed.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("went away") && stderr.contains("may have run"), "{stderr}");
    assert!(took < Duration::from_secs(3), "the client noticed after {took:?}");
}

#[test]
fn a_killed_client_has_its_binding_freed() {
    let (served, addr) = serve();
    let mut client = Command::new(TIERCEL)
        .args(["check", &format!("shm:{}", addr), "--rounds", "100000000", "--threads", "4"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while held_bindings(&served) != Some(1) {
        assert!(start.elapsed() < Duration::from_secs(10), "the client never bound");
        std::thread::sleep(Duration::from_millis(50));
    }
    client.kill().unwrap(); // SIGKILL, mid-call
    let _ = client.wait();
    let killed = Instant::now();
    while held_bindings(&served) != Some(0) {
        assert!(killed.elapsed() < Duration::from_secs(5), "binding of a killed client not freed");
        std::thread::sleep(Duration::from_millis(50));
    }
    // And the server goes on serving.
    let out = check(&addr, 100, 1);
    assert!(out.contains(&format!("ok: {} calls", 100 * tiercel_bench::seeds::CHECK_CALLS)), "{out}");
}

#[test]
fn a_stopped_server_fails_the_call_after_dead_after_and_the_binding_recovers_on_every_transport() {
    // SIGSTOP: the process neither dies nor answers. Over UDP nothing is heard; through shared
    // memory the server's heartbeat stands still; over TCP its heartbeat frames stop. Either way
    // the call fails after `dead_after` (before: a shared-memory caller waited for as long as the
    // server was stopped), and once the server runs again the same binding calls on (before: a TCP
    // binding failed every later call, "nothing heard from the server").
    let (served, addr) = serve();
    let pid = served.child.id().to_string();
    let signal = |sig: &str| tiercel_seeds::signal(served.child.id(), sig).unwrap();
    let transports = [
        ("", tiercel::Transport::SharedMemory),
        ("udp://", tiercel::Transport::Udp),
        ("tcp://", tiercel::Transport::Tcp),
    ];
    for (scheme, transport) in transports {
        let timing = tiercel::Timing { dead_after: Duration::from_secs(1), ..tiercel::Timing::default() };
        let client: tiercel_bench::seeds::TestClient = tiercel::Client::connect(format!("{scheme}{addr}"))
            .unwrap()
            .with_config(tiercel::ClientConfig { timing, ..tiercel::ClientConfig::default() })
            .import()
            .unwrap();
        assert_eq!(client.binding().transport(), transport);
        client.null().unwrap();
        signal("-STOP");
        // kill(2) only queues the signal: wait until every thread of the process is stopped, or a spinning
        // server thread may still answer the call below.
        let stopped = Instant::now();
        while !all_threads_stopped(&pid) {
            assert!(stopped.elapsed() < Duration::from_secs(5), "the server did not stop");
            std::thread::sleep(Duration::from_millis(1));
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let caller = {
            let client = client.clone();
            std::thread::spawn(move || tx.send(client.null()).unwrap())
        };
        // A watchdog, so that a caller blocked for good fails the test instead of hanging it.
        let outcome = rx.recv_timeout(Duration::from_secs(30));
        signal("-CONT");
        let err = outcome.expect("the call returned while the server was stopped").unwrap_err();
        caller.join().unwrap();
        assert!(matches!(err, tiercel::CallError::Unreachable { .. }), "{transport:?}: {err}");
        assert_eq!(err.execution(), tiercel::Execution::MayHaveRun);
        // Running again, the server answers the same binding's calls.
        let resumed = Instant::now();
        while let Err(e) = client.add(2, 3) {
            assert!(resumed.elapsed() < Duration::from_secs(10), "{transport:?}: the binding never recovered: {e}");
            std::thread::sleep(Duration::from_millis(50));
        }
        for i in 0..1000 {
            assert_eq!(client.add(i, 1).unwrap(), i + 1, "{transport:?}");
        }
        assert_eq!(client.binding().transport(), transport);
    }
}

/// Whether every thread of a process is stopped (state `T` in `/proc/PID/task/TID/stat`).
fn all_threads_stopped(pid: &str) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks.flatten().all(|task| {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // The command name in parentheses may hold spaces: the state follows its closing parenthesis.
        stat.rfind(')').and_then(|end| stat[end + 1..].trim_start().chars().next()) == Some('T')
    })
}
