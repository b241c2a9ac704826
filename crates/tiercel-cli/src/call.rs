//! `tiercel call`.

use std::time::Instant;

use tiercel::names::NameError;
use tiercel::{BindError, In, InOut, Out};
use tiercel_bench::seeds::{self, BIG_BUFFER, MAX_BUFFER};

use tiercel_bench::summary::Summary;

use crate::Error;

/// Options of `tiercel call`.
#[derive(clap::Args)]
pub struct Args {
    /// Server address, as printed by `tiercel serve`, or a name it exports under
    /// (`tiercel serve --name`, `Server::export_as`).
    addr: String,
    /// Procedure: of Test, null, add, max_arg, max_result, big_in, big_out or big_in_out (typed
    /// here); or any procedure of any interface the server exports, `name` or `Interface.name`.
    procedure: String,
    /// Arguments: two integers for `add`; a buffer size for the buffer procedures. For any other
    /// procedure, of any interface, one per argument of its signature (`tiercel list` shows it):
    /// JSON (`42`, `"text"`, `[1, 2]`, `null` for `None`, `{"Ok": 1}`), or a bare string for a
    /// string or byte-string argument; an `Out` buffer takes its length.
    #[arg(allow_negative_numbers = true)]
    args: Vec<String>,
    /// Make the call this many times and report the median and p99 latency.
    #[arg(long, default_value_t = 1)]
    repeat: u32,
    /// Print the span of each call (`tiercel.call`: procedure, transport, outcome, retransmissions,
    /// and the trace and span ids the server's `serve --trace` shows too) to stderr as it ends.
    #[arg(long)]
    trace: bool,
    #[command(flatten)]
    secret: tiercel_bench::SecretArgs,
    #[command(flatten)]
    registry: tiercel_bench::RegistryArgs,
}

/// The procedures of the seeds' `Test` interface this command calls with typed arguments (sizes,
/// patterns checked); every other procedure, of any interface, is called from its signature.
const TEST_PROCEDURES: [&str; 7] = ["null", "add", "max_arg", "max_result", "big_in", "big_out", "big_in_out"];

pub fn run(args: Args) -> crate::Result<()> {
    if args.trace {
        tiercel_bench::trace(tiercel_bench::TraceTo::Stderr);
    }
    let unqualified = args.procedure.strip_prefix("Test.").unwrap_or(&args.procedure);
    if TEST_PROCEDURES.contains(&unqualified) {
        match run_test(&args, unqualified) {
            // Not a Test server: the procedure may be one of its own interface's.
            Err(Error::Rpc(tiercel::Error::Bind(
                BindError::UnknownInterface { .. } | BindError::Name(NameError::WrongInterface { .. }),
            ))) => {}
            done => return done,
        }
    }
    crate::dynamic_call::run(&args.addr, &args.procedure, &args.args, args.repeat, &args.secret, &args.registry)
}

/// Calls a procedure of the seeds' Test interface.
fn run_test(args: &Args, procedure: &str) -> crate::Result<()> {
    let bind_start = Instant::now();
    let client = crate::check::import(&args.addr, args.secret.client_config()?, &args.registry)?;
    let bind_time = bind_start.elapsed();
    let int = |i: usize, default: i64| -> crate::Result<i64> {
        args.args
            .get(i)
            .map(|s| s.parse::<i64>().map_err(|e| Error::Usage(format!("argument {s:?}: {e}"))))
            .unwrap_or(Ok(default))
    };
    let size = |default: usize| -> crate::Result<usize> { int(0, default as i64).map(|n| n.max(0) as usize) };
    let mut summary = Summary::new();
    let mut shown = String::new();
    for _ in 0..args.repeat.max(1) {
        let start = Instant::now();
        shown = match procedure {
            "null" => client.null().map(|()| "null() = ()".to_string()),
            "add" => {
                let (a, b) = (int(0, 2)? as i32, int(1, 3)? as i32);
                client.add(a, b).map(|r| format!("add({a}, {b}) = {r}"))
            }
            "max_arg" | "big_in" => {
                let n = size(if procedure == "max_arg" { MAX_BUFFER } else { BIG_BUFFER })?;
                let mut buf = vec![0u8; n];
                seeds::fill(&mut buf);
                let r = if procedure == "max_arg" { client.max_arg(In(&buf)) } else { client.big_in(In(&buf)) };
                r.map(|()| format!("{procedure}({n} bytes) = ()"))
            }
            "max_result" | "big_out" => {
                let n = size(if procedure == "max_result" { MAX_BUFFER } else { BIG_BUFFER })?;
                let mut buf = vec![0u8; n];
                let r = if procedure == "max_result" {
                    client.max_result(Out(&mut buf))
                } else {
                    client.big_out(Out(&mut buf))
                };
                r.map(|()| format!("{procedure}({n} bytes) = {n} bytes, pattern ok: {}", seeds::check(&buf)))
            }
            "big_in_out" => {
                let n = size(BIG_BUFFER)?;
                let mut buf = vec![0u8; n];
                seeds::fill(&mut buf);
                client.big_in_out(InOut(&mut buf)).map(|()| {
                    let ok = buf.iter().enumerate().all(|(i, &b)| b == seeds::pattern(i).wrapping_add(1));
                    format!("big_in_out({n} bytes) = {n} bytes, each byte + 1: {ok}")
                })
            }
            other => return Err(Error::Usage(format!("unknown procedure {other:?}; see `tiercel call --help`"))),
        }
        .map_err(|source| Error::Call { procedure: args.procedure.clone(), source })?;
        summary.record(start.elapsed());
    }
    println!("{shown}");
    if args.repeat > 1 {
        println!(
            "latency over {} calls: median {:.1} µs, p99 {:.1} µs (bind {:.1} µs)",
            args.repeat,
            summary.median_us(),
            summary.p99_us(),
            bind_time.as_secs_f64() * 1e6
        );
    } else {
        println!("latency {:.1} µs (bind {:.1} µs)", summary.median_us(), bind_time.as_secs_f64() * 1e6);
    }
    Ok(())
}
