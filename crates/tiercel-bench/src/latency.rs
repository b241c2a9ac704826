//! The latency tables: Null, Add, BigIn, BigInOut and MaxResult over a transport against the raw
//! ping-pong of the same sizes, measured in interleaved rounds with the same placement and waiting.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tiercel::{ClientConfig, In, InOut, Out, Spin};
use tiercel_sys::clock::{elapsed_ns, stamp};

use crate::harness::{serve_pinned, spawn, Baseline, Medium};
use crate::progress::outln;
use crate::raw::PingPong;
use crate::raw_shm::ShmPingPong;
use crate::raw_tcp::TcpPingPong;
use crate::seeds::{TestClient, BIG_BUFFER, MAX_BUFFER};
use crate::summary::Summary;

/// One latency table: a transport and a waiting policy, each row against its raw baseline.
#[derive(serde::Serialize)]
pub struct LatencyTable {
    transport: &'static str,
    waiting: &'static str,
    baseline: &'static str,
    /// Over shared memory, the placements the rounds went round: each a region of its own for the
    /// floors and a binding of its own (its own region) for tiercel. Elsewhere 1.
    placements: usize,
    /// Calls timed together, each block's time a call one sample of the medians and p99s ([`BLOCK`]
    /// spinning over shared memory; elsewhere 1, each call timed alone).
    block_calls: u32,
    rows: Vec<LatencyRow>,
}

#[derive(serde::Serialize)]
struct LatencyRow {
    procedure: &'static str,
    call_bytes: usize,
    result_bytes: usize,
    calls: u64,
    raw_median_us: f64,
    raw_p99_us: f64,
    rpc_median_us: f64,
    rpc_p99_us: f64,
    ratio_median: f64,
    ratio_p99: f64,
    /// The means of each cell's middle half ([`crate::summary::Summary::middle_mean_us`]), and their
    /// ratio: finer than the tick counter's step, which the medians land on.
    raw_middle_mean_us: f64,
    rpc_middle_mean_us: f64,
    ratio_middle_mean: f64,
    /// tiercel's median came out under the raw ping-pong's (see `below_floor`).
    below_floor: bool,
    /// Over several placements, each one's median, the floor's (of the ping-pong the row took) and
    /// tiercel's, in the order the rounds went round them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    raw_by_placement_us: Vec<f64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    rpc_by_placement_us: Vec<f64>,
}

/// One procedure's round trips, raw and through tiercel.
pub struct Row {
    pub name: &'static str,
    pub call_bytes: usize,
    pub result_bytes: usize,
    pub raw: Summary,
    pub rpc: Summary,
    /// Over shared memory, `raw` is the ping-pong that moves its data as tiercel does
    /// (`ShmPingPong::like_tiercel`): in this row it was the faster.
    pub raw_like_tiercel: bool,
    /// Placements the rounds went round (see [`measure`]).
    pub placements: usize,
    /// Calls timed together: each sample of `raw` and `rpc` is a block's time a call ([`BLOCK`]).
    pub block: u32,
    /// With several placements, each one's median, the floor's and tiercel's (µs).
    pub raw_by_placement: Vec<f64>,
    pub rpc_by_placement: Vec<f64>,
}

/// Measures the latency table of `medium`, spinning or blocking, with the caller on this thread and
/// the servers on `server_cpu`.
///
/// Over shared memory each round goes to a placement of its own: a region of its own for the raw
/// ping-pongs and a binding of its own (its own region) for tiercel, at most 16. On the Intel VMs
/// with `cldemote`, the plain ping-pong's round trip moves between about 30 and 150 ns from one
/// window of time to the next (by the clock: the larger swings earlier runs saw, 0.04 to 0.37 µs a
/// Null, were mostly the counter read early, see [`BLOCK`]); over several regions, in interleaved
/// rounds, the floor and tiercel each meet several of those windows.
pub fn measure(
    server_cpu: usize,
    medium: Medium,
    spin: bool,
    calls: u32,
    rounds: u32,
    deadline: Instant,
) -> crate::Result<Vec<Row>> {
    let cpu = server_cpu.to_string();
    let echo = match medium {
        Medium::Udp => "raw-echo",
        Medium::Shm => "raw-shm-echo",
        Medium::Tcp => "raw-tcp-echo",
    };
    let placements = if medium == Medium::Shm { rounds.clamp(1, 16) as usize } else { 1 };
    let mut raw_args = vec![echo.to_string(), "--cpu".into(), cpu.clone()];
    if spin {
        raw_args.push("--spin".into());
    }
    if placements > 1 {
        raw_args.extend(["--regions".into(), placements.to_string()]);
    }
    let (_raw_server, raw_addr) = spawn(&raw_args)?;
    let (_rpc_server, rpc_addr) = serve_pinned(server_cpu, spin)?;
    let policy = if spin { Spin::Fixed(Duration::from_secs(3600)) } else { Spin::Never };
    let clients: Vec<TestClient> = (0..placements)
        .map(|_| {
            crate::harness::import(
                format!("{}{rpc_addr}", medium.scheme()),
                ClientConfig { spin: policy, ..ClientConfig::default() },
            )
        })
        .collect::<crate::Result<_>>()?;
    let mut out = vec![0u8; MAX_BUFFER];
    let mut big = vec![0u8; BIG_BUFFER];
    let mut max = vec![0u8; MAX_BUFFER];
    crate::seeds::fill(&mut max);
    // LRPC's Table IV (Null, Add, BigIn, BigInOut) and Firefly's MaxResult. Sizes are the marshaled
    // data each way (a buffer travels with its 4-byte length); over UDP each adds a packet header,
    // over TCP a header and the frame's length.
    let header = medium.overhead();
    let row = |name, call: usize, result: usize| Row {
        name,
        call_bytes: header + call,
        result_bytes: header + result,
        raw: Summary::new(),
        rpc: Summary::new(),
        raw_like_tiercel: false,
        placements,
        block: if medium == Medium::Shm && spin { BLOCK } else { 1 },
        raw_by_placement: Vec::new(),
        rpc_by_placement: Vec::new(),
    };
    let mut rows = vec![
        row("Null", 0, 0),
        row("Add", 8, 4),
        row("BigIn", 4 + BIG_BUFFER, 0),
        row("BigInOut", 4 + BIG_BUFFER, BIG_BUFFER),
        row("MaxResult", 4, MAX_BUFFER),
    ];
    let shm_conn = match medium {
        Medium::Shm => Some(crate::raw_shm::Connection::new(&raw_addr)?),
        Medium::Udp | Medium::Tcp => None,
    };
    let mut pings: Vec<Baseline> = rows
        .iter()
        .map(|r| match medium {
            Medium::Udp => raw_addr
                .strip_prefix("udp://")
                .and_then(|a| a.parse::<SocketAddr>().ok())
                .ok_or_else(|| crate::Error::from(format!("raw echo address {raw_addr:?}")))
                .and_then(|a| PingPong::new(a, r.call_bytes, r.result_bytes, spin))
                .map(Baseline::Udp),
            Medium::Shm => shm_conn
                .as_ref()
                .map(|c| Baseline::Shm(ShmPingPong::new(c, r.call_bytes, r.result_bytes, spin)))
                .ok_or_else(|| crate::Error::from("no raw shared-memory connection")),
            Medium::Tcp => raw_addr
                .strip_prefix("tcp://")
                .and_then(|a| a.parse::<SocketAddr>().ok())
                .ok_or_else(|| crate::Error::from(format!("raw echo address {raw_addr:?}")))
                .and_then(|a| TcpPingPong::new(a, r.call_bytes, r.result_bytes, spin))
                .map(Baseline::Tcp),
        })
        .collect::<crate::Result<_>>()?;
    // Over shared memory, a second floor: the same ping-pong moving its data as tiercel does, the
    // reply in the request's place and both sides pushing the lines they wrote (and the echo the
    // request's it read) out to the shared cache. Each row's floor is the faster of the two in this
    // run (as measured here, neither was faster for every size).
    let mut like_tiercel: Vec<(ShmPingPong, Summary)> = match &shm_conn {
        Some(c) => rows
            .iter()
            .map(|r| (ShmPingPong::new(c, r.call_bytes, r.result_bytes, spin).like_tiercel(), Summary::new()))
            .collect(),
        None => Vec::new(),
    };
    let place = |p: usize| -> crate::Result<()> {
        match &shm_conn {
            Some(c) => c.borrow_mut().place(p, spin),
            None => Ok(()),
        }
    };
    let mut rpc_call = |p: usize, row: usize, out: &mut [u8]| -> crate::Result<()> {
        let client = &clients[p];
        match row {
            0 => client.null(),
            1 => client.add(2, 3).map(|_| ()),
            2 => client.big_in(In(&max[..BIG_BUFFER])),
            3 => client.big_in_out(InOut(&mut big)),
            _ => client.max_result(Out(out)),
        }
        .map_err(crate::Error::from)
    };
    let mut warmup_lost = 0u64;
    // Raw and tiercel warm up in turn, not call by call: their servers share a CPU, and a spinning
    // server must have gone quiet before the other one runs. Each placement warms up.
    for p in 0..placements {
        place(p)?;
        for (i, ping) in pings.iter_mut().enumerate() {
            for _ in 0..2_000 {
                if !ping.round_trip()? {
                    warmup_lost += 1;
                }
            }
            if let Some((ping, _)) = like_tiercel.get_mut(i) {
                for _ in 0..2_000 {
                    ping.round_trip()?;
                }
            }
            for _ in 0..2_000 {
                rpc_call(p, i, &mut out)?;
            }
        }
    }
    if warmup_lost > 0 {
        outln!("({warmup_lost} raw round trips lost a packet during the warm-up)");
    }
    let per_round = calls.div_ceil(rounds);
    let block = rows.first().map_or(1, |r| r.block);
    let mut lost = 0u64;
    // With several placements, each row's calls in each placement as well: the plain ping-pong's,
    // the other's, and tiercel's.
    let mut placed: Vec<Vec<[Summary; 3]>> = (0..rows.len())
        .map(|_| (0..if placements > 1 { placements } else { 0 }).map(|_| Default::default()).collect())
        .collect();
    // Spinning, each server spins on for 2 ms past its last call, on the CPU the other one needs:
    // before the raw calls and before tiercel's, the other side's server is let go quiet. (Without
    // this pause, each block of calls ran while the server measured before it still spun on that
    // CPU; over shared memory, with a binding per placement, tiercel's Null had a p99 of 17 µs.)
    let quiet = || {
        if spin {
            std::thread::sleep(QUIET);
        }
    };
    'rounds: for round in 0..rounds {
        let p = round as usize % placements;
        for (i, row) in rows.iter_mut().enumerate() {
            if Instant::now() > deadline {
                outln!("(time limit reached: rows hold fewer calls)");
                break 'rounds;
            }
            quiet();
            if i == 0 {
                place(p)?;
            }
            // Timed with fenced reads of the tick counter (`clock::stamp`), not the system clock,
            // whose two readings added some 45 ns to every shared-memory round trip, raw and
            // tiercel alike, which made their ratio look closer to 1 than it is. Spinning over
            // shared memory, in blocks of `block` calls (see `BLOCK`).
            lost += time_calls(
                per_round,
                block,
                || pings[i].round_trip(),
                |d| {
                    row.raw.record(d);
                    if let Some(s) = placed[i].get_mut(p) {
                        s[0].record(d);
                    }
                },
            )?;
            if let Some((ping, raw)) = like_tiercel.get_mut(i) {
                lost += time_calls(
                    per_round,
                    block,
                    || ping.round_trip(),
                    |d| {
                        raw.record(d);
                        if let Some(s) = placed[i].get_mut(p) {
                            s[1].record(d);
                        }
                    },
                )?;
            }
            quiet();
            time_calls(
                per_round,
                block,
                || rpc_call(p, i, &mut out).map(|()| true),
                |d| {
                    row.rpc.record(d);
                    if let Some(s) = placed[i].get_mut(p) {
                        s[2].record(d);
                    }
                },
            )?;
        }
    }
    if lost > 0 {
        outln!("({lost} raw round trips lost a packet and were left out)");
    }
    for (row, (_, raw)) in rows.iter_mut().zip(like_tiercel) {
        if !raw.is_empty() && raw.median_us() < row.raw.median_us() {
            (row.raw, row.raw_like_tiercel) = (raw, true);
        }
    }
    // The placements the rounds reached (all, unless the time limit cut the rounds short).
    for (row, placed) in rows.iter_mut().zip(placed) {
        let floor = usize::from(row.raw_like_tiercel);
        let reached = || placed.iter().filter(|s| !s[2].is_empty());
        row.raw_by_placement = reached().map(|s| s[floor].median_us()).collect();
        row.rpc_by_placement = reached().map(|s| s[2].median_us()).collect();
    }
    let retransmissions: u64 = clients.iter().map(|c| c.binding().stats().retransmissions).sum();
    outln!("tiercel retransmissions during the run: {retransmissions}");
    Ok(rows)
}

/// Spinning over shared memory, calls are timed in blocks of this many, each block's time a call
/// recorded as one sample: a round trip there is a few hundred nanoseconds, and a stamp on each
/// call, fenced or not, is no fair clock for it. Unfenced (`clock::ticks`), the CPU read the counter
/// before the spin-wait's last load had brought the result, and on the development VM a raw
/// ping-pong's per-call medians came out at 28-34 ns where the same loops took 190-260 ns a round trip
/// by the clock; fenced, each call's stamps held its next call back until the last had settled, and
/// the same ping-pong took 240-406 ns a call. Blocks of 50 put the stamps' cost at two readings in 50 calls.
pub const BLOCK: u32 = 50;

/// Times `calls` round trips of `call` (false: a round trip lost a packet and was left out), one by
/// one or, with `block` above 1, in blocks of `block`, and gives `record` each call's time, or each
/// block's time a call. Returns the round trips left out (with blocks, every call of a block that
/// lost one).
pub(crate) fn time_calls(
    calls: u32,
    block: u32,
    mut call: impl FnMut() -> crate::Result<bool>,
    mut record: impl FnMut(Duration),
) -> crate::Result<u64> {
    let mut lost = 0u64;
    if block <= 1 {
        for _ in 0..calls {
            let t = stamp();
            if call()? {
                record(Duration::from_nanos(elapsed_ns(t, stamp())));
            } else {
                lost += 1;
            }
        }
        return Ok(lost);
    }
    for _ in 0..calls.div_ceil(block) {
        let t = stamp();
        let mut whole = true;
        for _ in 0..block {
            whole &= call()?;
        }
        if whole {
            record(Duration::from_nanos(elapsed_ns(t, stamp()) / u64::from(block)));
        } else {
            lost += u64::from(block);
        }
    }
    Ok(lost)
}

/// How long a spinning server (the raw echo's or tiercel's, `serve_pinned`) takes to stop spinning
/// after its last call, and a margin.
pub(crate) const QUIET: Duration = Duration::from_millis(4);

/// Whether tiercel's median came out under the raw ping-pong's beneath it. A call does at least what
/// the ping-pong does, so such a row's floor was not a fair one in that run (or, for a ratio near 1,
/// the two differ by less than the run's noise), as Peregrine Table 5 marks its rows.
fn below_floor(r: &Row) -> bool {
    r.rpc.median_us() < r.raw.median_us()
}

pub fn print_table(rows: &[Row], medium: Medium, spin: bool) -> LatencyTable {
    outln!(
        "{:<10} {:>13} | {:>10} {:>10} | {:>10} {:>10} | {:>8} {:>8} {:>8}",
        "procedure",
        "bytes c/r",
        "raw med",
        "raw p99",
        "rpc med",
        "rpc p99",
        "ratio",
        "p99 rat.",
        "mid rat."
    );
    for r in rows {
        outln!(
            "{:<10} {:>13} | {:>8.2}µs {:>8.2}µs | {:>8.2}µs {:>8.2}µs | {:>7.3}× {:>7.3}× {:>7.3}×{}",
            r.name,
            format!("{}/{}", r.call_bytes, r.result_bytes),
            r.raw.median_us(),
            r.raw.p99_us(),
            r.rpc.median_us(),
            r.rpc.p99_us(),
            r.rpc.median_us() / r.raw.median_us(),
            r.rpc.p99_us() / r.raw.p99_us(),
            r.rpc.middle_mean_us() / r.raw.middle_mean_us(),
            if below_floor(r) { " below" } else { "" },
        );
    }
    let n = rows.first().map(|r| r.rpc.len()).unwrap_or(0);
    let block = rows.first().map_or(1, |r| r.block);
    let raw = match (medium, spin) {
        (Medium::Udp, _) => "UDP ping-pong of the same datagram sizes",
        (Medium::Tcp, _) => "TCP ping-pong (TCP_NODELAY) of the same message sizes",
        (Medium::Shm, true) => "shared-memory spin ping-pong copying the same data sizes",
        (Medium::Shm, false) => "futex ping-pong copying the same data sizes",
    };
    if block > 1 {
        outln!(
            "(median and p99 of {n} blocks of {block} calls per cell, each block's time a call: a stamp on every call is no \
             fair clock for calls this short; raw = {raw}, same CPUs, same waiting)"
        );
    } else {
        outln!("(median and p99 of {n} calls per cell; raw = {raw}, same CPUs, same waiting)");
    }
    if medium == Medium::Shm {
        let of = |theirs: bool| {
            let names: Vec<&str> = rows.iter().filter(|r| r.raw_like_tiercel == theirs).map(|r| r.name).collect();
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        };
        let n = rows.first().map_or(1, |r| r.placements);
        if n > 1 {
            outln!(
                "(each round on a placement of its own, {n} in all: a region of its own for the raw ping-pongs, a binding \
                 of its own for tiercel; on some machines a round trip's time depends on the cache lines it moves)"
            );
            if let Some(null) = rows.first() {
                let each: Vec<String> = null
                    .raw_by_placement
                    .iter()
                    .zip(&null.rpc_by_placement)
                    .map(|(raw, rpc)| format!("{raw:.3}/{rpc:.3}"))
                    .collect();
                outln!("({} by placement, raw/rpc median µs: {})", null.name, each.join(", "));
            }
        }
        outln!(
            "(raw: row by row the faster of that ping-pong and the same moving its data as tiercel does, the reply in the \
             request's place and the lines each side wrote (and the echo the request's) pushed out to the shared cache, `cldemote`; the latter in {}, the \
             former in {})",
            of(true),
            of(false)
        );
    }
    outln!("(mid rat.: the ratio of the means of each cell's middle half, the calls between its 25th and 75th percentiles: finer than the tick counter's step)");
    if rows.iter().any(below_floor) {
        outln!("(\"below\": tiercel's median under the raw ping-pong's, which is then not a fair floor in this run)");
    }
    LatencyTable {
        transport: medium.name(),
        waiting: if spin { "spin" } else { "block" },
        baseline: raw,
        placements: rows.first().map_or(1, |r| r.placements),
        block_calls: block,
        rows: rows
            .iter()
            .map(|r| LatencyRow {
                procedure: r.name,
                call_bytes: r.call_bytes,
                result_bytes: r.result_bytes,
                calls: r.rpc.len() * u64::from(r.block),
                raw_median_us: r.raw.median_us(),
                raw_p99_us: r.raw.p99_us(),
                rpc_median_us: r.rpc.median_us(),
                rpc_p99_us: r.rpc.p99_us(),
                ratio_median: r.rpc.median_us() / r.raw.median_us(),
                ratio_p99: r.rpc.p99_us() / r.raw.p99_us(),
                raw_middle_mean_us: r.raw.middle_mean_us(),
                rpc_middle_mean_us: r.rpc.middle_mean_us(),
                ratio_middle_mean: r.rpc.middle_mean_us() / r.raw.middle_mean_us(),
                below_floor: below_floor(r),
                raw_by_placement_us: r.raw_by_placement.clone(),
                rpc_by_placement_us: r.rpc_by_placement.clone(),
            })
            .collect(),
    }
}
