//! The `tiercel` command: a thin front end. `serve`, `call` and `check` run and use a server of the
//! seeds' `Test` interface; `list` shows what any server exports; `bench`, `explain` and `soak` run the measurements of `tiercel-bench`.

#![forbid(unsafe_code)]

mod call;
mod check;
mod dynamic;
mod dynamic_call;
mod list;

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
    Serve(tiercel_bench::serve::Args),
    /// Call one procedure of a server and print the result and the latency: Test's with typed
    /// arguments, any other interface's from the signature the server gives.
    Call(call::Args),
    /// Call every Test procedure many times and verify every result.
    Check(check::Args),
    /// What a server (or every exporter of a name) exports, procedure by procedure; without an
    /// address, the names in the registry.
    List(list::Args),
    /// Write a new key pair: the private key to FILE (readable by its owner only), the public key
    /// to FILE.pub. `serve --key FILE` makes a server secure; its clients give
    /// `--server-key FILE.pub`. With `--authority`, an authority's key pair, which endorses servers'
    /// keys for names (`endorse`); clients given `--authority FILE.pub` trust its endorsements.
    Keygen(KeygenArgs),
    /// Endorse a server's public key for a name with an authority's key, until a time: the server
    /// carries the endorsement in its registry entry (`serve --endorsement FILE`), and clients that
    /// trust the authority (`--authority`) bind by name only to a server it endorsed.
    Endorse(EndorseArgs),
    /// The seeds' tables, each against the raw mechanism beneath it measured in the same run.
    Bench(tiercel_bench::bench::Args),
    /// Where the time of a Null, a BigIn and a MaxResult call goes, step by step, on each transport, against
    /// the raw baselines measured in the same run.
    Explain(tiercel_bench::explain::Args),
    /// Write docs/measured/README.md and the README's headline table from the kept runs
    /// (docs/measured/runs/*.json); with --check, fail if they are not up to date.
    Report(tiercel_bench::report::Args),
    /// Many calls through a lossy, duplicating, reordering, corrupting network; checks that each call
    /// returns intact or fails clearly and that none runs twice (built with `--features fault-injection`).
    #[cfg(feature = "fault-injection")]
    Soak(tiercel_bench::soak::Args),
}

#[derive(clap::Args)]
struct KeygenArgs {
    /// Where to write the private key (never over an existing file).
    file: std::path::PathBuf,
    /// An authority's key pair (Ed25519), not a server's or a client's (X25519).
    #[arg(long)]
    authority: bool,
}

/// Writes a new key pair and prints its public key.
fn keygen(args: KeygenArgs) -> Result<()> {
    let failed = |e: tiercel::KeyError| Error::Usage(e.to_string());
    let public_key = match args.authority {
        false => {
            let key = tiercel::Identity::generate().map_err(failed)?;
            key.write(&args.file).map_err(failed)?;
            key.public().to_string()
        }
        true => {
            let key = tiercel::Authority::generate().map_err(failed)?;
            key.write(&args.file).map_err(failed)?;
            key.public().to_string()
        }
    };
    let public = tiercel::secure::public_path(&args.file);
    println!("private key: {} (mode 600)", args.file.display());
    println!("public key:  {} = {public_key}", public.display());
    Ok(())
}

#[derive(clap::Args)]
struct EndorseArgs {
    /// The authority's private key (a file `tiercel keygen --authority` wrote).
    #[arg(long, value_name = "FILE")]
    authority: std::path::PathBuf,
    /// The name the server exports.
    #[arg(long)]
    name: String,
    /// The server's public key: 64 hex digits, or the `.pub` file `tiercel keygen` wrote.
    #[arg(long, value_name = "KEY|FILE")]
    server_key: String,
    /// For how many days the endorsement holds.
    #[arg(long, default_value_t = 365)]
    days: u64,
    /// Where to write the endorsement (never over an existing file).
    file: std::path::PathBuf,
}

/// Writes an authority's endorsement of a server's key for a name.
fn endorse(args: EndorseArgs) -> Result<()> {
    let failed = |e: tiercel::KeyError| Error::Usage(e.to_string());
    let authority = tiercel::Authority::from_file(&args.authority).map_err(failed)?;
    let server = match args.server_key.parse() {
        Ok(key) => key,
        Err(_) => tiercel::PublicKey::from_file(&args.server_key).map_err(failed)?,
    };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let not_after = now.saturating_add(args.days.saturating_mul(86_400));
    let endorsement = authority.endorse(&args.name, server, not_after).map_err(failed)?;
    endorsement.write(&args.file).map_err(failed)?;
    println!(
        "{}: {} endorsed for {:?} by {} for {} days",
        args.file.display(),
        server,
        args.name,
        authority.public(),
        args.days
    );
    Ok(())
}

/// Why the command failed.
#[derive(Debug, thiserror::Error)]
enum Error {
    /// A call, an import or a server start of tiercel failed.
    #[error("{0} (the procedure {ran})", ran = said(.0.execution()))]
    Rpc(#[from] tiercel::Error),
    /// A procedure called with `tiercel call` failed.
    #[error("{procedure} failed: {source} (the procedure {ran})", ran = said(source.execution()))]
    Call {
        /// The procedure's name.
        procedure: String,
        /// How it failed.
        source: tiercel::CallError,
    },
    /// A measurement failed.
    #[error("{0}")]
    Bench(#[from] tiercel_bench::Error),
    /// The command's arguments do not make sense.
    #[error("{0}")]
    Usage(String),
    /// A result did not verify, or a caller thread failed.
    #[error("{0}")]
    Check(String),
}

/// Whether the procedure ran, in words.
fn said(e: tiercel::Execution) -> &'static str {
    match e {
        tiercel::Execution::NeverRan => "never ran",
        tiercel::Execution::MayHaveRun => "may have run",
        tiercel::Execution::Ran => "ran and failed",
    }
}

type Result<T> = std::result::Result<T, Error>;

fn main() -> ExitCode {
    if let Some(code) = tiercel_bench::roles::run_if_helper() {
        return code;
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(a) => tiercel_bench::serve::run(a).map_err(Error::from),
        Command::Call(a) => call::run(a),
        Command::Check(a) => check::run(a),
        Command::List(a) => list::run(a),
        Command::Keygen(a) => keygen(a),
        Command::Endorse(a) => endorse(a),
        Command::Bench(a) => tiercel_bench::bench::run(a).map_err(Error::from),
        Command::Explain(a) => tiercel_bench::explain::run(a).map_err(Error::from),
        Command::Report(a) => tiercel_bench::report::run(a).map_err(Error::from),
        #[cfg(feature = "fault-injection")]
        Command::Soak(a) => tiercel_bench::soak::run(a).map_err(Error::from),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tiercel: {e}");
            // 2 for a command line that does not make sense, as clap does.
            ExitCode::from(if matches!(e, Error::Usage(_)) { 2 } else { 1 })
        }
    }
}
