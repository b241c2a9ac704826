//! A `tiercel serve` process for tests that read its periodic counters.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const TIERCEL: &str = env!("CARGO_BIN_EXE_tiercel");

/// A server process, killed when dropped, whose output lines are collected as they come.
pub struct Served {
    pub child: Child,
    /// The address it printed, with its `udp://` scheme.
    pub addr: String,
    pub lines: Arc<Mutex<Vec<String>>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `tiercel serve --addr ADDR --stats-every 1`.
#[allow(dead_code)] // not every test binary uses every helper
pub fn serve(addr: &str) -> Served {
    let child = Command::new(TIERCEL)
        .args(["serve", "--addr", addr, "--stats-every", "1"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    collect(child)
}

/// A started server process with its stdout piped: reads the address it prints first, then
/// collects its output lines as they come.
pub fn collect(mut child: Child) -> Served {
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    let addr = first.trim().strip_prefix("listening ").expect("address line").to_string();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = lines.clone();
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            sink.lock().unwrap().push(line);
        }
    });
    Served { child, addr, lines }
}

impl Served {
    /// The counters of the newest `stats` line printed after the first `after` lines, if any.
    pub fn stats_since(&self, after: usize) -> Option<HashMap<String, u64>> {
        let lines = self.lines.lock().unwrap();
        let line = lines.iter().skip(after).rfind(|l| l.starts_with("stats "))?;
        Some(
            line.split_whitespace()
                .skip(1)
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
                .collect(),
        )
    }

    /// As [`Served::stats_since`], waiting up to 10 s for such a line.
    #[allow(dead_code)] // not every test binary uses every helper
    pub fn wait_stats_since(&self, after: usize) -> HashMap<String, u64> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(stats) = self.stats_since(after) {
                return stats;
            }
            assert!(Instant::now() < deadline, "no stats line from the server");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Median and p99 of `n` Null calls, µs (each must succeed: a legitimate client during an attack).
#[allow(dead_code)] // not every test binary uses every helper
pub fn null_latency(client: &tiercel_bench::seeds::TestClient, n: usize) -> (f64, f64) {
    let mut t: Vec<f64> = (0..n)
        .map(|_| {
            let t0 = Instant::now();
            client.null().expect("a legitimate call during the attack");
            t0.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    t.sort_by(f64::total_cmp);
    (t[n / 2], t[n * 99 / 100])
}

/// The counters `peak` of a server attacked with a message budget of `budget_mib`: calls beyond the
/// budget were refused (as busy, or as more than it could ever hold), the messages held stayed
/// within it, and the process's peak resident
/// memory within it plus `overhead_mib` (code, stacks, the workers' buffers).
#[allow(dead_code)] // not every test binary uses every helper
pub fn assert_held_within(peak: &HashMap<String, u64>, budget_mib: u64, overhead_mib: u64) {
    assert!(peak["busy"] + peak["too_large"] > 0, "calls beyond the budget were refused");
    assert!(peak["message_memory_kib"] <= budget_mib << 10);
    assert!(
        peak["peak_rss_kib"] <= (budget_mib + overhead_mib) << 10,
        "peak RSS {} KiB against a {budget_mib} MiB budget",
        peak["peak_rss_kib"]
    );
}

/// The user an impostor runs as.
#[allow(dead_code)] // not every test binary uses every helper
pub const NOBODY: u32 = 65534;

/// A directory of this test's own, mode 1777 like `/tmp`, removed when dropped.
#[allow(dead_code)]
pub struct Sticky(pub PathBuf);

#[allow(dead_code)]
impl Sticky {
    pub fn new(tag: &str) -> Sticky {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("tiercel-cli-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        Sticky(dir)
    }

    /// A copy of the `tiercel` command in the directory, which any user may run.
    pub fn tiercel(&self) -> PathBuf {
        let exe = self.0.join("tiercel");
        if !exe.exists() {
            std::fs::copy(TIERCEL, &exe).unwrap();
        }
        exe
    }
}

impl Drop for Sticky {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A command run as user `NOBODY` in `dir`.
#[allow(dead_code)]
pub fn as_nobody(program: &Path, dir: &Path) -> Command {
    let mut command = Command::new(program);
    command.uid(NOBODY).gid(NOBODY).current_dir(dir).env_remove("XDG_RUNTIME_DIR");
    command
}
