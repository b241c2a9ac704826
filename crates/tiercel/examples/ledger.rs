//! The cost ledger: what each optional piece of tiercel costs a Null call, on every transport, off
//! (compiled in but unused) and on. Run it with `./ledger` at the top of the repository, which
//! builds this example once for each set of crate features and then runs
//! `ledger table --build NAME=PATH ...` with them.
//!
//! * `ledger measure [--transport udp|shm|tcp] [--plain-only] [--subscriber info|debug]
//!   [--seconds S]` measures the lines of this build (`ledger/lines.rs`; with `--plain-only`, only
//!   `plain`), over every transport or the one named, in interleaved batches, and prints per line
//!   the median of the batches' mean time per call: `transport<TAB>line<TAB>nanoseconds`. With
//!   `--subscriber`, a `tracing` subscriber is installed for the whole process first (recording
//!   nothing at `info`, since tiercel's spans are at debug level; at `debug`, every span,
//!   formatted to nowhere).
//! * `ledger table --build NAME=PATH ... [--runs N] [--seconds S]` runs, `N` times in alternation
//!   (5 by default), each build's `measure --plain-only`, the last build's `measure` with every
//!   line, and the last build's `measure --plain-only` with each subscriber; and prints the
//!   ledger's two tables in Markdown, each figure the median of the runs with each run's figure
//!   beside it. Processes compared with one another have the same lines, hence the same servers and
//!   threads.
//!
//! The client is this process's main thread on CPU 0, every server thread is on CPU 1, and both
//! wait as tiercel's defaults have them (the client spins up to 200 µs, then blocks; the servers
//! adapt their spin). A batch is 5 ms of calls after 3 ms of warm-up, so that the spinning server
//! thread of the line before has gone quiet; each round takes a transport's lines in turn, starting
//! from another line each round.

#[path = "ledger/lines.rs"]
mod lines;

use std::collections::BTreeMap;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use lines::{Lines, TRANSPORTS};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("measure") => measure(&args[1..]),
        Some("table") => table(&args[1..]),
        _ => Err("usage: ledger measure [--transport udp|shm|tcp] [--plain-only] [--subscriber info|debug] [--seconds S] | ledger table --build NAME=PATH ... [--runs N] [--seconds S]".into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ledger: {e}");
            ExitCode::FAILURE
        }
    }
}

type Result<T> = std::result::Result<T, String>;

/// The value after `flag` in `args`, parsed.
fn option<T: std::str::FromStr>(args: &[String], flag: &str) -> Result<Option<T>> {
    match args.iter().position(|a| a == flag) {
        None => Ok(None),
        Some(i) => {
            args.get(i + 1).and_then(|v| v.parse().ok()).map(Some).ok_or_else(|| format!("{flag} needs a value"))
        }
    }
}

fn measure(args: &[String]) -> Result<()> {
    let seconds: f64 = option(args, "--seconds")?.unwrap_or(6.0);
    let plain_only = args.iter().any(|a| a == "--plain-only");
    if let Some(level) = option::<String>(args, "--subscriber")? {
        let level = match level.as_str() {
            "info" => tracing::Level::INFO,
            "debug" => tracing::Level::DEBUG,
            other => return Err(format!("--subscriber {other}: info or debug")),
        };
        let subscriber = tracing_subscriber::fmt().with_max_level(level).with_writer(std::io::sink).finish();
        tracing::subscriber::set_global_default(subscriber).map_err(|e| e.to_string())?;
    }
    tiercel_sys::cpu::pin_current_thread(0).map_err(|e| format!("pin to CPU 0: {e}"))?;
    let transports: Vec<&str> = match option::<String>(args, "--transport")? {
        Some(t) => TRANSPORTS.iter().map(|(name, _)| *name).filter(|name| *name == t).collect(),
        None => TRANSPORTS.iter().map(|(name, _)| *name).collect(),
    };
    if transports.is_empty() {
        return Err("--transport: udp, shm or tcp".into());
    }
    let lines = Lines::new(&transports, plain_only);
    // Calls per batch: 5 ms of each line's calls, as its warm-up measured them.
    let batch: Vec<u32> = lines
        .lines
        .iter()
        .map(|line| {
            line.begin();
            let start = Instant::now();
            for _ in 0..2_000 {
                line.call();
            }
            line.end();
            let per_call = start.elapsed().as_secs_f64() / 2_000.0;
            ((0.005 / per_call) as u32).clamp(100, 50_000)
        })
        .collect();
    let mut means: Vec<Vec<f64>> = vec![Vec::new(); lines.lines.len()];
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    // Each transport's lines (not every piece has a line on every transport).
    let of_transport: Vec<Vec<usize>> = transports
        .iter()
        .map(|t| (0..lines.lines.len()).filter(|&i| lines.lines[i].transport == *t).collect())
        .collect();
    let mut round = 0;
    while Instant::now() < until || round < 3 {
        // One transport's lines after another, each round starting from another line, so that
        // no line always follows the same one (whose server may still be spinning).
        for indices in &of_transport {
            for k in 0..indices.len() {
                let i = indices[(round + k) % indices.len()];
                let line = &lines.lines[i];
                line.begin();
                let warm = Instant::now();
                while warm.elapsed() < WARM_UP {
                    line.call();
                }
                let start = Instant::now();
                for _ in 0..batch[i] {
                    line.call();
                }
                means[i].push(start.elapsed().as_nanos() as f64 / f64::from(batch[i]));
                line.end();
            }
        }
        round += 1;
    }
    for (line, means) in lines.lines.iter().zip(&mut means) {
        println!("{}\t{}\t{:.1}", line.transport, line.piece.name(), median(means));
    }
    Ok(())
}

/// Calls made before each batch is timed: longer than a server thread spins past its last call, so
/// that the line before has gone quiet.
const WARM_UP: Duration = Duration::from_millis(3);

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// One process of the ledger: a build, the subscriber it runs with, and whether it has every line
/// of its build or only `plain`.
struct Setup {
    name: String,
    path: String,
    subscriber: Option<&'static str>,
    every_piece: bool,
}

/// What each run of each setup measured: (setup, transport, line) → one figure per run.
type Figures = BTreeMap<(String, String, String), Vec<f64>>;

fn table(args: &[String]) -> Result<()> {
    let runs: usize = option(args, "--runs")?.unwrap_or(5);
    let seconds: f64 = option(args, "--seconds")?.unwrap_or(6.0);
    let builds: Vec<(String, String)> = args
        .windows(2)
        .filter(|w| w[0] == "--build")
        .map(|w| w[1].split_once('=').map(|(n, p)| (n.to_string(), p.to_string())))
        .collect::<Option<_>>()
        .ok_or("--build wants NAME=PATH")?;
    let Some((last, last_path)) = builds.last().cloned() else {
        return Err("no --build given".into());
    };
    // Processes compared with one another have the same lines (`plain` only, so the same servers
    // and threads); the pieces switched on are compared with `plain` in one process.
    let mut setups: Vec<Setup> = builds
        .iter()
        .map(|(n, p)| Setup { name: n.clone(), path: p.clone(), subscriber: None, every_piece: false })
        .collect();
    let every = format!("{last}, every piece");
    setups.push(Setup { name: every.clone(), path: last_path.clone(), subscriber: None, every_piece: true });
    for level in ["info", "debug"] {
        setups.push(Setup {
            name: format!("{last}, subscriber {level}"),
            path: last_path.clone(),
            subscriber: Some(level),
            every_piece: false,
        });
    }
    let mut figures = Figures::new();
    for run in 0..runs {
        // Each run starts from another setup, so that none always follows the same one.
        for k in 0..setups.len() {
            let setup = &setups[(run + k) % setups.len()];
            eprintln!("run {} of {runs}: {}", run + 1, setup.name);
            let mut command = Command::new(&setup.path);
            command.args(["measure", "--seconds", &seconds.to_string()]);
            if let Some(level) = setup.subscriber {
                command.args(["--subscriber", level]);
            }
            if !setup.every_piece {
                command.arg("--plain-only");
            }
            let output = command.output().map_err(|e| format!("{}: {e}", setup.path))?;
            if !output.status.success() {
                return Err(format!("{} measure failed: {}", setup.name, String::from_utf8_lossy(&output.stderr)));
            }
            for row in String::from_utf8_lossy(&output.stdout).lines() {
                let mut fields = row.split('\t');
                let (Some(transport), Some(line), Some(ns)) = (fields.next(), fields.next(), fields.next()) else {
                    return Err(format!("{}: bad line {row:?}", setup.name));
                };
                let ns: f64 = ns.parse().map_err(|_| format!("{}: bad figure {row:?}", setup.name))?;
                figures.entry((setup.name.clone(), transport.into(), line.into())).or_default().push(ns);
            }
        }
    }
    print_tables(&figures, &setups, &builds[0].0, (&last, &every), runs);
    Ok(())
}

/// A cell: the median of the runs' figures, then each run's figure.
fn cell(values: &[f64]) -> String {
    let mut sorted = values.to_vec();
    let runs: Vec<String> = values.iter().map(|v| format!("{v:.0}")).collect();
    format!("{:.0} ({})", median(&mut sorted), runs.join(", "))
}

/// A difference cell: the median of the runs' differences, each run's beside it.
fn difference(line: &[f64], base: &[f64]) -> String {
    let mut deltas: Vec<f64> = line.iter().zip(base).map(|(l, b)| l - b).collect();
    let runs: Vec<String> = deltas.iter().map(|d| format!("{d:+.0}")).collect();
    format!("{:+.0} ({})", median(&mut deltas), runs.join(", "))
}

/// The tables: each build's `plain` against the `first` build's; then each piece in the process of
/// `every` piece of the `last` build against its `plain`, and each subscriber against the `last`
/// build's `plain`.
fn print_tables(figures: &Figures, setups: &[Setup], first: &str, (last, every): (&str, &str), runs: usize) {
    // A row: `label`, then `line` of `setup` on each transport, then its difference from `plain`
    // of `base`.
    let row = |label: &str, setup: &str, line: &str, base: &str| {
        let get = |setup: &str, transport: &str, line: &str| {
            figures.get(&(setup.to_string(), transport.to_string(), line.to_string()))
        };
        let mut row = format!("| {label} |");
        for (transport, _) in TRANSPORTS {
            row += &format!(" {} |", get(setup, transport, line).map(|v| cell(v)).unwrap_or_default());
        }
        for (transport, _) in TRANSPORTS {
            let d = match (get(setup, transport, line), get(base, transport, "plain")) {
                (Some(l), Some(b)) => difference(l, b),
                _ => String::new(),
            };
            row += &format!(" {d} |");
        }
        println!("{row}");
    };
    println!("### Compiled in, unused: a plain Null call, ns (median of {runs} runs; each run)\n");
    println!("| build | udp | shm | tcp | udp − {first} | shm − {first} | tcp − {first} |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for setup in setups.iter().filter(|s| s.subscriber.is_none() && !s.every_piece) {
        row(&setup.name, &setup.name, "plain", first);
    }
    println!("\n### Switched on, in the build `{last}`: ns per Null call, and what the piece adds to `plain` of the same run\n");
    println!("| line | udp | shm | tcp | udp + | shm + | tcp + |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    let pieces: Vec<String> =
        figures.keys().filter(|(s, t, _)| s == every && t == "udp").map(|(_, _, l)| l.clone()).collect();
    let order =
        ["plain", "deadline", "checksum", "secret", "rebind", "intercept", "secure", "metrics", "explain", "async"];
    for line in order.iter().filter(|l| pieces.iter().any(|p| p == *l)) {
        row(line, every, line, every);
    }
    // A subscriber is the whole process's: its lines come from processes of their own, against
    // `plain` of the build's own processes (with `plain` only, as theirs).
    for setup in setups.iter().filter(|s| s.subscriber.is_some()) {
        let label = format!("tracing subscriber at {} (own process)", setup.subscriber.unwrap_or_default());
        row(&label, &setup.name, "plain", last);
    }
}
