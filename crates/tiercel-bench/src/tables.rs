//! The seeds' tables beyond single-call latency, on every transport: the Mach RPC test list (elapsed,
//! user and system time per call, from `getrusage` and `/proc` of both processes) and Firefly's
//! Table I (10,000 calls from 1 to 8 caller threads: seconds, calls per second, Mbit/s).

use std::time::{Duration, Instant};

use crate::seeds::{SeedTest, TestClient, TestServer, BIG_BUFFER, MAX_BUFFER};
use tiercel::{In, InOut, Out, Server, ServerConfig};
use tiercel_sys::cpu;

use crate::progress::outln;

/// One measured row of the Mach list.
struct MachRow {
    test: String,
    transport: &'static str,
    calls: u64,
    elapsed: Duration,
    user: Duration,
    system: Duration,
}

/// A Mach list row, per call in µs, for `--json`.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct MachJson {
    test: String,
    transport: String,
    calls: u64,
    elapsed_us: f64,
    user_us: f64,
    system_us: f64,
}

/// A Firefly Table I row, for `--json`.
#[derive(serde::Serialize)]
pub struct Table1Json {
    pub transport: &'static str,
    pub threads: u32,
    calls: u64,
    null_seconds: f64,
    pub null_calls_per_second: f64,
    max_result_seconds: f64,
    max_result_mbit_per_second: f64,
}

impl MachRow {
    fn json(&self) -> MachJson {
        let per = |d: Duration| d.as_secs_f64() * 1e6 / self.calls.max(1) as f64;
        MachJson {
            test: self.test.clone(),
            transport: self.transport.to_string(),
            calls: self.calls,
            elapsed_us: per(self.elapsed),
            user_us: per(self.user),
            system_us: per(self.system),
        }
    }

    fn print(&self) -> MachJson {
        let json = self.json();
        json.print();
        json
    }
}

impl MachJson {
    fn print(&self) {
        outln!(
            "{:<16} {:<26} {:>10} {:>10.3} {:>10.3} {:>10.3}",
            self.test,
            self.transport,
            self.calls,
            self.elapsed_us,
            self.user_us,
            self.system_us
        );
    }
}

/// Runs `f` repeatedly for about `time`, returning the calls made and the elapsed, user and system
/// time, the last two summed over this process and `server` (another process) if given.
fn timed(
    time: Duration,
    server: Option<u32>,
    mut f: impl FnMut() -> crate::Result<()>,
) -> crate::Result<(u64, Duration, Duration, Duration)> {
    let other = || server.and_then(cpu::other_process_times).unwrap_or_default();
    let (u0, s0) = cpu::process_times();
    let (ou0, os0) = other();
    let start = Instant::now();
    let mut calls = 0u64;
    while start.elapsed() < time {
        for _ in 0..100 {
            f()?;
        }
        calls += 100;
    }
    let elapsed = start.elapsed();
    let (u1, s1) = cpu::process_times();
    let (ou1, os1) = other();
    Ok((calls, elapsed, (u1 - u0) + (ou1.saturating_sub(ou0)), (s1 - s0) + (os1.saturating_sub(os0))))
}

fn procedures(
    client: &TestClient,
    prefix: &str,
    transport: &'static str,
    time: Duration,
    server: Option<u32>,
) -> crate::Result<Vec<MachRow>> {
    let mut max = vec![0u8; MAX_BUFFER];
    crate::seeds::fill(&mut max);
    let mut big = vec![0u8; BIG_BUFFER];
    let mut rows = Vec::new();
    let e = crate::Error::from;
    let mut run = |name: &str, f: &mut dyn FnMut() -> crate::Result<()>| -> crate::Result<()> {
        let (calls, elapsed, user, system) = timed(time, server, f)?;
        rows.push(MachRow { test: format!("{prefix}{name}"), transport, calls, elapsed, user, system });
        Ok(())
    };
    run("Null", &mut || client.null().map_err(e))?;
    run("Add", &mut || client.add(2, 3).map(|_| ()).map_err(e))?;
    run("BigIn", &mut || client.big_in(In(&max[..BIG_BUFFER])).map_err(e))?;
    let mut out = vec![0u8; BIG_BUFFER];
    run("BigOut", &mut || client.big_out(Out(&mut out)).map_err(e))?;
    run("BigInOut", &mut || client.big_in_out(InOut(&mut big)).map_err(e))?;
    Ok(rows)
}

#[inline(never)]
fn empty(x: u64) -> u64 {
    std::hint::black_box(x)
}

/// The Mach test list. `served` is a `tiercel serve` process (its pid and `host:port`) pinned to the
/// server CPU; the same-process rows start their own server.
pub fn mach(served: (u32, &str), server_cpu: usize, time: Duration) -> crate::Result<Vec<MachJson>> {
    let mut out = Vec::new();
    outln!("\nMach RPC test list (Forin): per call, in µs; user and system are summed over client and server");
    outln!("processes (the server's from /proc, in 10 ms ticks); waiting: tiercel's defaults (adaptive spin)");
    outln!("{:<16} {:<26} {:>10} {:>10} {:>10} {:>10}", "test", "transport", "calls", "elapsed", "user", "system");
    let (calls, elapsed, user, system) = timed(time, None, || {
        std::hint::black_box(std::os::unix::process::parent_id());
        Ok(())
    })?;
    out.push(MachRow { test: "syscall".into(), transport: "getppid()", calls, elapsed, user, system }.print());
    let mut x = 0u64;
    let (calls, elapsed, user, system) = timed(time, None, || {
        x = empty(x.wrapping_add(1));
        Ok(())
    })?;
    out.push(
        MachRow { test: "localLoop".into(), transport: "plain function call", calls, elapsed, user, system }.print(),
    );

    let config = ServerConfig { cpus: vec![server_cpu], ..ServerConfig::default() };
    let inproc = Server::bind("udp://127.0.0.1:0")
        .and_then(|s| s.with_config(config).export(TestServer::new(SeedTest)).start())
        .map_err(crate::Error::from)?;
    let client: TestClient =
        crate::harness::import(format!("shm:{}", inproc.addr()), tiercel::ClientConfig::default())?;
    for r in procedures(&client, "local", "shm, same process", time, None)? {
        out.push(r.print());
    }
    drop(client);
    drop(inproc);

    let (pid, addr) = served;
    for (prefix, scheme, transport) in
        [("local", "shm:", "shm, 2 processes"), ("remote", "udp://", "UDP loopback, 2 processes")]
    {
        let client: TestClient = crate::harness::import(format!("{scheme}{addr}"), tiercel::ClientConfig::default())?;
        for r in procedures(&client, prefix, transport, time, Some(pid))? {
            out.push(r.print());
        }
    }
    match remote_across_namespaces(server_cpu, time) {
        Ok(rows) => {
            for r in rows {
                r.print();
                out.push(r);
            }
        }
        Err(e) => outln!("(remote rows across two network namespaces skipped: {e})"),
    }
    Ok(out)
}

/// Options of the `mach-remote` helper role.
#[derive(clap::Args)]
pub struct RemoteArgs {
    /// The server, `host:port`.
    addr: String,
    /// The server's process id, for its CPU time.
    #[arg(long)]
    server_pid: u32,
    /// Milliseconds per row.
    #[arg(long)]
    millis: u64,
}

/// The remote rows, measured from inside the client's namespace and printed as JSON.
pub fn mach_remote(args: RemoteArgs) -> crate::Result<()> {
    let _ = cpu::pin_current_thread(0);
    let client: TestClient = crate::harness::import(format!("udp://{}", args.addr), tiercel::ClientConfig::default())?;
    let rows =
        procedures(&client, "remote", "UDP, 2 netns, veth", Duration::from_millis(args.millis), Some(args.server_pid))?;
    let json: Vec<MachJson> = rows.iter().map(MachRow::json).collect();
    println!("{}", serde_json::to_string(&json).map_err(crate::Error::from)?);
    Ok(())
}

/// The remote rows across two network namespaces joined by a veth pair (root only): a server in one,
/// the client in the other, both in processes of their own.
fn remote_across_namespaces(server_cpu: usize, time: Duration) -> crate::Result<Vec<MachJson>> {
    if let Some(why) = crate::namespaces_unavailable() {
        return Err(why.into());
    }
    let out = crate::harness::across_namespaces(7575, 0.0, server_cpu, "mach-remote", |pid, addr| {
        let millis = time.as_millis().to_string();
        [addr, "--server-pid", &pid.to_string(), "--millis", &millis].iter().map(|s| s.to_string()).collect()
    })?;
    Ok(serde_json::from_slice(&out)?)
}

/// Firefly's Table I: 10,000 calls made by 1 to 8 caller threads sharing one binding.
pub fn firefly_table1(addr: &str, calls: u32) -> crate::Result<Vec<Table1Json>> {
    let mut json = Vec::new();
    outln!("\nFirefly Table I: {calls} calls by 1 to 8 caller threads on one binding (threads not pinned;");
    outln!("tiercel's default waiting); MaxResult moves {MAX_BUFFER} bytes per call");
    outln!(
        "{:<22} {:>7} | {:>9} {:>10} | {:>9} {:>10}",
        "transport",
        "threads",
        "Null s",
        "calls/s",
        "MaxRes s",
        "Mbit/s"
    );
    for (scheme, transport) in [("shm:", "shm, 2 processes"), ("udp://", "UDP loopback")] {
        let client: TestClient = crate::harness::import(format!("{scheme}{addr}"), tiercel::ClientConfig::default())?;
        for threads in 1..=8u32 {
            let run = |max_result: bool| -> crate::Result<Duration> {
                let per_thread = calls.div_ceil(threads);
                let start = Instant::now();
                let handles: Vec<_> = (0..threads)
                    .map(|_| {
                        let c = client.clone();
                        std::thread::spawn(move || -> crate::Result<()> {
                            let mut out = vec![0u8; MAX_BUFFER];
                            for _ in 0..per_thread {
                                if max_result {
                                    c.max_result(Out(&mut out)).map_err(crate::Error::from)?;
                                } else {
                                    c.null().map_err(crate::Error::from)?;
                                }
                            }
                            Ok(())
                        })
                    })
                    .collect();
                for h in handles {
                    h.join().map_err(|_| "a caller thread panicked".to_string())??;
                }
                Ok(start.elapsed())
            };
            let null = run(false)?;
            let maxr = run(true)?;
            let n = (calls.div_ceil(threads) * threads) as f64;
            outln!(
                "{:<22} {:>7} | {:>9.3} {:>10.0} | {:>9.3} {:>10.1}",
                transport,
                threads,
                null.as_secs_f64(),
                n / null.as_secs_f64(),
                maxr.as_secs_f64(),
                n * MAX_BUFFER as f64 * 8.0 / maxr.as_secs_f64() / 1e6
            );
            json.push(Table1Json {
                transport,
                threads,
                calls: n as u64,
                null_seconds: null.as_secs_f64(),
                null_calls_per_second: n / null.as_secs_f64(),
                max_result_seconds: maxr.as_secs_f64(),
                max_result_mbit_per_second: n * MAX_BUFFER as f64 * 8.0 / maxr.as_secs_f64() / 1e6,
            });
        }
    }
    Ok(json)
}

/// A Firefly Tables II–V row, for `--json`.
#[derive(serde::Serialize)]
pub struct MarshalJson {
    table: &'static str,
    argument: &'static str,
    calls: u64,
    median_us: f64,
    p99_us: f64,
    null_median_us: f64,
    incremental_us: f64,
}

/// Firefly's Tables II–V: the time each argument kind adds to a Null call, on the cheapest transport
/// (shared memory, both sides spinning). `addr` is a spinning `tiercel serve` (host:port). Each row
/// is measured in rounds alternating with Null, so that drift hits both alike.
pub fn firefly_marshaling(addr: &str, calls: u32) -> crate::Result<Vec<MarshalJson>> {
    let config = tiercel::ClientConfig { spin: tiercel::Spin::Fixed(Duration::from_secs(1)), ..Default::default() };
    let client: TestClient = crate::harness::import(format!("shm:{addr}"), config)?;
    let e = crate::Error::from;
    let fixed400 = [7u8; 400];
    let mut var = vec![0u8; MAX_BUFFER];
    crate::seeds::fill(&mut var);
    let s128 = "x".repeat(128);
    type Row<'a> = (&'static str, &'static str, Box<dyn Fn() -> crate::Result<()> + 'a>);
    let rows: Vec<Row<'_>> = vec![
        ("II", "1 integer", Box::new(|| client.int1(1).map_err(e))),
        ("II", "2 integers", Box::new(|| client.int2(1, 2).map_err(e))),
        ("II", "4 integers", Box::new(|| client.int4(1, 2, 3, 4).map_err(e))),
        ("III", "fixed array, 4 bytes", Box::new(|| client.fixed4([1, 2, 3, 4]).map_err(e))),
        ("III", "fixed array, 400 bytes", Box::new(|| client.fixed400(fixed400).map_err(e))),
        ("IV", "variable array, 1 byte", Box::new(|| client.var_array(&var[..1]).map_err(e))),
        ("IV", "variable array, 1440 bytes", Box::new(|| client.var_array(&var).map_err(e))),
        ("V", "string, 0 bytes", Box::new(|| client.string("").map_err(e))),
        ("V", "string, 1 byte", Box::new(|| client.string("x").map_err(e))),
        ("V", "string, 128 bytes", Box::new(|| client.string(&s128).map_err(e))),
    ];
    let null = || client.null().map_err(e);
    for _ in 0..2_000 {
        null()?;
        for (_, _, f) in &rows {
            f()?;
        }
    }
    outln!("\nFirefly Tables II–V: marshaling, the time an argument adds to Null, on the cheapest transport");
    outln!("(shared memory, both sides spin; {calls} calls per row in 10 rounds alternating with Null), µs");
    outln!("{:<6} {:<28} | {:>9} {:>9} | {:>9} | {:>12}", "table", "argument", "median", "p99", "Null", "incremental");
    let mut out = Vec::new();
    let per_round = calls.div_ceil(10);
    for (table, argument, f) in &rows {
        let (mut s, mut n) = (crate::summary::Summary::new(), crate::summary::Summary::new());
        for _ in 0..10 {
            for _ in 0..per_round {
                let t = Instant::now();
                null()?;
                n.record(t.elapsed());
            }
            for _ in 0..per_round {
                let t = Instant::now();
                f()?;
                s.record(t.elapsed());
            }
        }
        let inc = s.median_us() - n.median_us();
        outln!(
            "{:<6} {:<28} | {:>9.3} {:>9.3} | {:>9.3} | {:>12.3}",
            table,
            argument,
            s.median_us(),
            s.p99_us(),
            n.median_us(),
            inc
        );
        out.push(MarshalJson {
            table,
            argument,
            calls: s.len(),
            median_us: s.median_us(),
            p99_us: s.p99_us(),
            null_median_us: n.median_us(),
            incremental_us: inc,
        });
    }
    Ok(out)
}
