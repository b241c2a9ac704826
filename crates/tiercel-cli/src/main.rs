//! The `tiercel` command: run a server of the seeds' `Test` interface, call it, check it, and measure it
//! against a raw UDP ping-pong in the same run.

#![forbid(unsafe_code)]

mod baselines;
mod bench;
mod call;
mod check;
mod explain;
mod load;
mod netns;
mod peregrine;
mod plot;
mod progress;
mod raw;
mod raw_shm;
mod raw_tcp;
mod serve;
#[cfg(feature = "fault-injection")]
mod soak;
mod summary;
mod tables;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Remote procedure calls that cost little more than the packets that carry them.
#[derive(Parser)]
#[command(name = "tiercel", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a server exporting the seeds' Test interface and print its address.
    Serve(serve::Args),
    /// Call one procedure of a Test server and print the result and the latency.
    Call(call::Args),
    /// Call every Test procedure many times and verify every result.
    Check(check::Args),
    /// Measure Null and MaxResult over UDP and shared memory against raw ping-pongs of the same sizes,
    /// in one run.
    Bench(bench::Args),
    /// Where the time of a Null and a MaxResult call goes, step by step, on each transport, against
    /// the raw baselines measured in the same run.
    Explain(explain::Args),
    /// Many calls through a lossy, duplicating, reordering, corrupting network; checks that each call
    /// returns intact or fails clearly and that none runs twice (built with `--features fault-injection`).
    #[cfg(feature = "fault-injection")]
    Soak(soak::Args),
    /// The soak's ledger server (started by `soak`).
    #[cfg(feature = "fault-injection")]
    #[command(hide = true)]
    SoakServer(soak::ServerArgs),
    /// The raw UDP echo server the benchmark measures against (started by `bench`).
    #[command(hide = true)]
    RawEcho(raw::EchoArgs),
    /// The raw shared-memory echo server the benchmark measures against (started by `bench`).
    #[command(hide = true)]
    RawShmEcho(raw_shm::EchoArgs),
    /// The remote rows of the Mach list, run inside a network namespace (started by `bench`).
    #[command(hide = true)]
    MachRemote(tables::RemoteArgs),
    /// The raw TCP echo server among the benchmark's baselines (started by `bench`).
    #[command(hide = true)]
    RawTcpEcho(raw_tcp::EchoArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(a) => serve::run(a),
        Command::Call(a) => call::run(a),
        Command::Check(a) => check::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Explain(a) => explain::run(a),
        Command::RawEcho(a) => raw::echo(a),
        Command::RawShmEcho(a) => raw_shm::echo(a),
        Command::RawTcpEcho(a) => raw_tcp::echo(a),
        Command::MachRemote(a) => tables::mach_remote(a),
        #[cfg(feature = "fault-injection")]
        Command::Soak(a) => soak::run(a),
        #[cfg(feature = "fault-injection")]
        Command::SoakServer(a) => soak::server(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tiercel: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Errors of the command, as text for the user.
pub(crate) type Result<T> = std::result::Result<T, String>;

/// The `--secret-file` option of the commands that serve or bind.
#[derive(clap::Args, Clone)]
pub(crate) struct SecretArgs {
    /// File holding a shared secret: at least 16 bytes, readable by its owner only (make one with
    /// `(umask 077; head -c 32 /dev/urandom > tiercel.secret)`). A server with one binds only clients
    /// that prove it; a client with one binds only to a server that proves it back.
    #[arg(long, value_name = "FILE")]
    secret_file: Option<std::path::PathBuf>,
}

impl SecretArgs {
    pub(crate) fn load(&self) -> Result<Option<tiercel::Secret>> {
        self.secret_file.as_ref().map(tiercel::Secret::from_file).transpose().map_err(|e| e.to_string())
    }
}

/// Peak resident set size of this process (VmHWM), KiB.
pub(crate) fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).map(|l| l.to_string()))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

/// Parses a comma-separated CPU list such as `0,1`.
pub(crate) fn parse_cpus(s: &str) -> std::result::Result<Vec<usize>, String> {
    if s.is_empty() {
        return Ok(Vec::new());
    }
    s.split(',').map(|c| c.trim().parse::<usize>().map_err(|e| format!("bad CPU {c:?}: {e}"))).collect()
}
