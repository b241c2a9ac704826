//! Crashes with real processes: a server killed mid-run (SIGKILL) and started again on the same
//! address, and a client killed mid-call.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tiercel::{Server, ServerConfig, Timing};
use tiercel_bench::seeds::{SeedTest, TestServer};

const TIERCEL: &str = env!("CARGO_BIN_EXE_tiercel");

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve_process(addr: &str) -> (Killed, BufReader<std::process::ChildStdout>) {
    let mut child =
        Killed(Command::new(TIERCEL).args(["serve", "--addr", addr]).stdout(Stdio::piped()).spawn().unwrap());
    let mut out = BufReader::new(child.0.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), format!("listening udp://{}", addr.trim_start_matches("udp://")));
    (child, out)
}

fn checker(addr: &str, extra: &[&str]) -> Child {
    Command::new(TIERCEL)
        .args(["check", addr, "--rounds", "100000000"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn server_with(addr: &str, config: ServerConfig) -> tiercel::RunningServer {
    // The old process may still hold the port for a moment after SIGKILL.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match Server::bind(addr) {
            Ok(s) => return s.with_config(config).export(TestServer::new(SeedTest)).start().unwrap(),
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("rebind {addr}: {e}"),
        }
    }
}

#[test]
fn restarted_server_never_runs_calls_from_before_the_restart() {
    let addr = format!("udp://127.0.0.1:{}", tiercel_seeds::free_port());
    let (server, _out) = serve_process(&addr);
    let client = checker(&addr, &[]);
    std::thread::sleep(Duration::from_millis(500));
    drop(server); // SIGKILL mid-run
    let restarted = server_with(&addr, ServerConfig::default());
    let out = client.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the client must see the crash");
    assert!(stderr.contains("may have run"), "the error says the call may have run: {stderr}");
    assert!(
        stderr.contains("restarted")
            || stderr.contains("does not know this binding")
            || stderr.contains("did not answer"),
        "{stderr}"
    );
    assert_eq!(restarted.stats().calls, 0, "no call from before the restart ran");
}

#[test]
fn clients_import_again_after_a_restart() {
    // Over UDP, and through shared memory (a plain address on this host).
    for (scheme, transport) in [("udp://", "UDP"), ("", "shared memory")] {
        let addr = format!("{scheme}127.0.0.1:{}", tiercel_seeds::free_port());
        let (server, _out) = serve_process(&addr);
        let client = Command::new(TIERCEL)
            .args(["check", &addr, "--rounds", "30000", "--threads", "2", "--reimport"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        drop(server);
        let restarted = server_with(&format!("udp://{}", addr.trim_start_matches("udp://")), ServerConfig::default());
        let out = client.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{transport}: {stdout}{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains(&format!("through {transport}")), "{stdout}");
        assert!(stdout.contains(&format!("ok: {} calls", 30_000 * 2 * tiercel_bench::seeds::CHECK_CALLS)), "{stdout}");
        assert!(!stdout.contains(", 0 imports again"), "{transport}: both threads imported again: {stdout}");
        assert!(restarted.stats().calls > 0);
    }
}

#[test]
fn killed_client_has_its_binding_freed() {
    let timing = Timing { dead_after: Duration::from_millis(200), ..Timing::default() };
    let config = ServerConfig { timing, binding_idle: Duration::from_millis(400), ..ServerConfig::default() };
    let server = server_with("udp://127.0.0.1:0", config);
    let addr = format!("udp://{}", server.addr());
    let mut client = Killed(checker(&addr, &["--threads", "4"]));
    let start = Instant::now();
    while server.stats().calls < 1000 {
        assert!(start.elapsed() < Duration::from_secs(20), "client never got going");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(server.bindings(), 1);
    // SIGKILL (what Child::kill sends) mid-call.
    client.0.kill().unwrap();
    let _ = client.0.wait();
    let killed = Instant::now();
    while server.bindings() > 0 {
        assert!(killed.elapsed() < Duration::from_secs(5), "binding of a dead client not freed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(server.stats().expired, 1);
}
