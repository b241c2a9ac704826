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
    // Killed when dropped: a failing assertion leaves no server behind.
    let mut server =
        Killed(Command::new(example("server")).arg("udp://127.0.0.1:0").stdout(Stdio::piped()).spawn().unwrap());
    let mut lines = BufReader::new(server.0.stdout.take().unwrap()).lines().map_while(Result::ok);
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
    tiercel_seeds::signal(server.0.id(), "TERM").unwrap();
    let give_up = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = server.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < give_up, "the server did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    assert_eq!(lines.next().as_deref(), Some("shutting down after 4 calls"));
}

/// A child process killed when dropped.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `example` with `args` and reads the address it prints (`listening ADDR`).
#[cfg(feature = "async")]
fn listening(example_name: &str, args: &[&str]) -> (Killed, String) {
    let mut child = Command::new(example(example_name)).args(args).stdout(Stdio::piped()).spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let child = Killed(child);
    let first = BufReader::new(stdout).lines().next().expect("the server prints its address").unwrap();
    let addr = first.strip_prefix("listening ").expect("a `listening ADDR` line").to_string();
    (child, addr)
}

#[cfg(feature = "async")]
#[test]
fn the_async_service_runs_across_three_processes_on_both_transports() {
    // A stock server of plain procedures, a shop of async procedures that call it, and a client
    // of 64 tasks placing orders through the async client, with deadlines expiring and futures
    // dropped mid-call: every result checked, and no order reserved twice or after its caller
    // gave up (the client checks with the stock server, and fails otherwise).
    let (_stock, stock) = listening("async_service", &["stock", "udp://127.0.0.1:0"]);
    let (_shop, shop) = listening("async_service", &["shop", "udp://127.0.0.1:0", &stock]);
    for (addr, transport) in [(shop.clone(), "SharedMemory"), (format!("udp://{shop}"), "Udp")] {
        let out = Command::new(example("async_service")).args(["client", &addr]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
        for line in [
            format!("bound over {transport}"),
            "orders: 2048 ok, 256 past their deadline".to_string(),
            "256 dropped".to_string(),
            "stock: 2048 orders reserved, 0 reserved twice".to_string(),
            "at-most-once: ok".to_string(),
        ] {
            assert!(text.contains(&line), "{line:?} in {text}");
        }
    }
}

#[test]
fn the_ledger_measures_every_line_of_its_build_and_tables_the_runs() {
    let ledger = example("ledger");
    let out = Command::new(&ledger).args(["measure", "--transport", "shm", "--seconds", "0"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    // One line per piece the example's build can switch on (every build has the first seven; the
    // example may have been built with other features than this test), over shared memory only,
    // each a time per call.
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
    let pieces: Vec<&str> = rows.iter().map(|r| r[1]).collect();
    assert_eq!(pieces[..7], ["plain", "deadline", "checksum", "secret", "rebind", "intercept", "secure"], "{text}");
    let optional = ["metrics", "explain", "async"];
    assert!(pieces[7..].iter().all(|p| optional.contains(p)), "{text}");
    for row in &rows {
        assert_eq!(row[0], "shm", "{text}");
        let ns: f64 = row[2].parse().unwrap();
        assert!(ns > 0.0 && ns.is_finite(), "{text}");
    }

    // Two builds (this one twice), one run each: every build and piece has its row, with a figure.
    let build = format!("one={}", ledger.display());
    let again = format!("two={}", ledger.display());
    let out = Command::new(&ledger)
        .args(["table", "--runs", "1", "--seconds", "0", "--build", &build, "--build", &again])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}{}", String::from_utf8_lossy(&out.stderr));
    for row in ["| one | ", "| two | ", "| tracing subscriber at info (own process) | "] {
        assert!(table.contains(row), "{row:?} in {table}");
    }
    for piece in &pieces {
        assert!(table.contains(&format!("| {piece} | ")), "{piece} in {table}");
    }
    assert!(!table.contains("NaN") && !table.contains("inf ("), "{table}");
}
