//! The accounting of a call: where the time of a Null, a BigIn and a MaxResult call goes, on each
//! transport, the way Firefly's Tables VI–VIII and Peregrine's Table 4 account for it.
//!
//! Every step on both sides is timed from the running system: the client and server threads take a
//! tick-counter timestamp at each point of the fast path (`tiercel::steps`; the points cost one load
//! of a flag while recording is off). The time on the wire and in the kernel is not inferred from
//! tiercel's own wait but taken from the raw ping-pong of the same sizes measured in the same run:
//! the raw client's wait less the raw echo's turnaround is the network-and-kernel time of a round
//! trip. The sum of the steps is then set against the measured time of a call, and the difference is
//! printed, with where it lies.

use std::time::Duration;

use tiercel::steps::{self, mark, Point, Step};
use tiercel::{ClientConfig, In, Out, Server, ServerConfig, Spin};
use tiercel_sys::clock::{stamp, ticks, ticks_to_ns};

use crate::harness::{spawn, Baseline, Medium, HEADER};
use crate::progress::outln;
use crate::raw::{PingPong, Stamps};
use crate::raw_shm::ShmPingPong;
use crate::seeds::{SeedTest, TestClient, TestServer, BIG_BUFFER, MAX_BUFFER};
use crate::summary::Summary;

mod books;

pub use books::{account, print_account};

/// A procedure accounted for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Procedure {
    Null,
    /// LRPC's BigIn: a 200-byte buffer in, nothing back.
    BigIn,
    MaxResult,
}

impl Procedure {
    /// The procedures accounted for, in the order of their accountings.
    pub const ALL: [Procedure; 3] = [Procedure::Null, Procedure::BigIn, Procedure::MaxResult];

    /// The procedure's name.
    pub fn name(self) -> &'static str {
        match self {
            Procedure::Null => "Null",
            Procedure::BigIn => "BigIn",
            Procedure::MaxResult => "MaxResult",
        }
    }

    /// Marshaled bytes of the call and of the result (without tiercel's header).
    /// Bytes of its call and its result.
    pub fn sizes(self) -> (usize, usize) {
        match self {
            Procedure::Null => (0, 0),
            Procedure::BigIn => (4 + BIG_BUFFER, 0),
            Procedure::MaxResult => (4, MAX_BUFFER),
        }
    }
}

/// One line of an accounting.
#[derive(serde::Serialize, Clone)]
pub struct Line {
    pub side: &'static str,
    pub step: String,
    pub mean_us: f64,
    /// A step that runs while the transfer it starts is under way, so not added to the sum: the
    /// publishing store of shared memory is visible to the other side before the publisher's fence
    /// ends.
    pub overlapped: bool,
}

/// The accounting of one procedure on one transport with one waiting policy.
#[derive(serde::Serialize, Clone)]
pub struct Account {
    pub transport: &'static str,
    pub waiting: &'static str,
    pub procedure: &'static str,
    pub calls: u64,
    pub lines: Vec<Line>,
    /// Sum of the lines.
    pub sum_us: f64,
    /// Mean time of a call from the client's first timestamp to its last (the caller's clock around
    /// the stub, with timestamps on, less the cost of those two timestamps).
    pub measured_us: f64,
    /// `measured_us - sum_us`, and as a share of `measured_us`.
    pub gap_us: f64,
    pub gap_percent: f64,
    /// What the client waited for (send returned → result arrived), and what the server was busy.
    pub client_wait_us: f64,
    pub server_busy_us: f64,
    /// The raw ping-pong of the same sizes: the client's wait and the echo's turnaround.
    pub raw_wait_us: f64,
    pub raw_turnaround_us: f64,
    pub raw_round_trip_us: f64,
    /// Through shared memory, whether a raw baseline of this account is the ping-pong that moves its
    /// data as tiercel does (the faster of the two in the run, see [`RawRun`]).
    pub raw_like_tiercel: bool,
    /// The same calls with timestamps off: mean, median, p99.
    pub off_mean_us: f64,
    pub off_median_us: f64,
    pub off_p99_us: f64,
    /// Share of the recorded calls in which the client slept waiting for its result, and in which
    /// the server slept waiting for the call (0 when both sides spin).
    pub client_slept_percent: f64,
    pub server_slept_percent: f64,
    /// Through shared memory, the two ways measured across the client's and the server's threads
    /// (`tiercel::steps::handoffs`): from the call published to the server's mark that it arrived,
    /// and from the server's mark that the result is ready to the client's that it arrived; with
    /// the client's wait of the calls they were measured in, and how many there were.
    pub handoff: Option<Handoff>,
}

/// The ways of a call between the client's thread and the server's, measured on both tick counters,
/// and the client's wait of the same calls (means, µs).
#[derive(serde::Serialize, Clone)]
pub struct Handoff {
    pub to_server_us: f64,
    pub to_client_us: f64,
    /// What the raw baselines give each way (the spinning one's one way; without a spin budget,
    /// the blocking one's in the share of calls whose receiving side slept).
    pub raw_to_server_us: f64,
    pub raw_to_client_us: f64,
    pub wait_us: f64,
    pub calls: u64,
}

/// A Firefly §4.2-style estimate: what a call would cost with a step added or removed.
#[derive(serde::Serialize)]
pub struct Estimate {
    pub change: String,
    pub procedure: &'static str,
    pub base_us: f64,
    pub estimate_us: f64,
    /// The same change measured, where it can be made.
    pub measured_us: Option<f64>,
}

#[derive(serde::Serialize, Default)]
pub struct Report {
    pub client_cpu: usize,
    pub server_cpu: usize,
    pub accounts: Vec<Account>,
    pub estimates: Vec<Estimate>,
}

/// The points a client passes on each transport, in order.
const CLIENT_UDP: &[Point] = &[
    Point::Begin,
    Point::CallStart,
    Point::EndpointReady,
    Point::Marshaled,
    Point::HeaderReady,
    Point::Sent,
    Point::Arrived,
    Point::Validated,
    Point::Finished,
    Point::Unmarshaled,
    Point::End,
];
const CLIENT_SHM: &[Point] = &[
    Point::Begin,
    Point::CallStart,
    Point::EndpointReady,
    Point::Marshaled,
    Point::ArgsCopied,
    Point::Sent,
    Point::Arrived,
    Point::Validated,
    Point::ResultCopied,
    Point::Finished,
    Point::Unmarshaled,
    Point::End,
];
/// The points a client passes over UDP on a secure binding: its call sealed before it goes, its
/// result opened before it is checked.
const CLIENT_SEALED: &[Point] = &[
    Point::Begin,
    Point::CallStart,
    Point::EndpointReady,
    Point::Marshaled,
    Point::HeaderReady,
    Point::Sealed,
    Point::Sent,
    Point::Arrived,
    Point::Opened,
    Point::Validated,
    Point::Finished,
    Point::Unmarshaled,
    Point::End,
];
/// The points the server passes on a secure binding.
const SERVER_SEALED: &[Point] = &[
    Point::ServerArrived,
    Point::Opened,
    Point::ServerValidated,
    Point::ServerAccepted,
    Point::ArgsDecoded,
    Point::ProcedureDone,
    Point::ResultsEncoded,
    Point::ResultReady,
    Point::Sealed,
    Point::ResultSent,
];
/// The points the server passes (both transports).
const SERVER: &[Point] = &[
    Point::ServerArrived,
    Point::ServerValidated,
    Point::ServerAccepted,
    Point::ArgsDecoded,
    Point::ProcedureDone,
    Point::ResultsEncoded,
    Point::ResultReady,
    Point::ResultSent,
];

/// The raw baseline of one size: its round trip and its steps.
pub struct Raw {
    pub round_trip: Summary,
    pub stamps: Stamps,
    /// Through shared memory, whether this is the ping-pong that moves its data as tiercel does
    /// ([`ShmPingPong::like_tiercel`]), which was the faster of the two in this run.
    pub like_tiercel: bool,
}

/// The tiercel calls of one procedure: timestamps off, then on.
pub struct Measured {
    pub off: Summary,
    pub off_mean_us: f64,
    pub on_mean_us: f64,
    pub steps: Vec<Step>,
    pub calls: u64,
    /// Sleeps of the client and of the server during the recorded calls.
    pub sleeps: (u64, u64),
}

pub fn us_since(t0: u64) -> Duration {
    Duration::from_nanos(ticks_to_ns(ticks().wrapping_sub(t0) as f64) as u64)
}

/// Rounds the measurements of an accounting are split into: each round times the raw ping-pong and
/// then tiercel, so that both see the same moments of the machine (a VM's wake-up cost and its
/// neighbours drift within a run).
pub const ROUNDS: u32 = 10;

/// Untimed round trips before each round's timed ones: the echo or server may be napping or asleep
/// after the other was measured.
const WARMUP: u32 = 500;

/// Pause after each round so that a spinning server or echo gives up the server CPU (tiercel's
/// spinning server spins 10 ms past its last call) before the other is measured.
const SETTLE: Duration = Duration::from_millis(20);

/// A raw echo helper and its ping-pongs of the sizes of Null, BigIn and MaxResult, timed in chunks.
/// Through shared memory each size has two ping-pongs, as in the latency table: the plain one and
/// the one that moves its data as tiercel does (the reply in the request's place, the lines each
/// side wrote pushed out to the shared cache); the faster of the two in the run is the baseline.
pub struct RawRun {
    /// By procedure, its ping-pongs and their totals.
    pings: Vec<Vec<(Baseline, Raw)>>,
    /// Round trips timed together ([`crate::latency::BLOCK`] spinning over shared memory, else 1).
    block: u32,
    _shm: Option<std::rc::Rc<std::cell::RefCell<crate::raw_shm::Connection>>>,
    _echo: crate::harness::Spawned,
}

impl RawRun {
    /// Starts the raw echo of `medium`, spinning or blocking, on `server_cpu`.
    pub fn start(medium: Medium, spin: bool, server_cpu: usize) -> crate::Result<RawRun> {
        let echo = if medium == Medium::Udp { "raw-echo" } else { "raw-shm-echo" };
        let mut args = vec![echo.to_string(), "--cpu".into(), server_cpu.to_string(), "--stamp".into()];
        if spin {
            args.push("--spin".into());
        }
        let (echo, addr) = spawn(&args)?;
        let header = if medium == Medium::Udp { HEADER } else { 0 };
        let shm = match medium {
            Medium::Shm => Some(crate::raw_shm::Connection::new(&addr)?),
            Medium::Udp | Medium::Tcp => None,
        };
        let totals = |like_tiercel| Raw { round_trip: Summary::new(), stamps: Stamps::default(), like_tiercel };
        let mut pings = Vec::new();
        for p in Procedure::ALL {
            let (call, result) = p.sizes();
            let (call, result) = (header + call, header + result);
            pings.push(match &shm {
                None => {
                    let server = addr
                        .strip_prefix("udp://")
                        .and_then(|a| a.parse().ok())
                        .ok_or_else(|| format!("raw echo address {addr:?}"))?;
                    vec![(Baseline::Udp(PingPong::new(server, call, result, spin)?), totals(false))]
                }
                Some(conn) => vec![
                    (Baseline::Shm(ShmPingPong::new(conn, call, result, spin)), totals(false)),
                    (Baseline::Shm(ShmPingPong::new(conn, call, result, spin).like_tiercel()), totals(true)),
                ],
            });
        }
        let block = if medium == Medium::Shm && spin { crate::latency::BLOCK } else { 1 };
        Ok(RawRun { pings, block, _shm: shm, _echo: echo })
    }

    /// Times `calls` round trips of procedure `i`'s sizes on each of its ping-pongs in turn (each
    /// after an untimed warm-up) and adds them to its totals; then lets the echo give up the server
    /// CPU.
    pub fn chunk(&mut self, i: usize, calls: u32) -> crate::Result<()> {
        for (ping, total) in &mut self.pings[i] {
            *ping.stamps_mut() = Some(Stamps::default());
            for _ in 0..WARMUP {
                ping.round_trip()?;
            }
            // The echo's sums run from its start: keep what it had reported before the timed calls.
            let before = ping.stamps_mut().take().unwrap_or_default();
            *ping.stamps_mut() = Some(Stamps::default());
            // Spinning over shared memory, in blocks (see `latency::BLOCK`).
            let round_trip = &mut total.round_trip;
            crate::latency::time_calls(calls, self.block, || ping.round_trip(), |d| round_trip.record(d))?;
            let s = ping.stamps_mut().take().unwrap_or_default();
            let t = &mut total.stamps;
            t.send += s.send;
            t.wait += s.wait;
            t.round_trips += s.round_trips;
            t.echo_turnaround += s.echo_turnaround.saturating_sub(before.echo_turnaround);
            t.echo_turns += s.echo_turns.saturating_sub(before.echo_turns);
        }
        // A spinning echo spins on for `SPIN_WHILE_IDLE` after its last request, on the CPU of the
        // tiercel server measured next: calls made meanwhile wait for the scheduler to hand the
        // CPU over.
        std::thread::sleep(SETTLE);
        Ok(())
    }

    /// The totals of every chunk, by procedure: of its faster ping-pong (the lower median).
    pub fn finish(self) -> Vec<Raw> {
        self.pings
            .into_iter()
            .filter_map(|alternatives| {
                alternatives.into_iter().map(|(_, raw)| raw).min_by(|a, b| {
                    a.round_trip.median_us().partial_cmp(&b.round_trip.median_us()).unwrap_or(std::cmp::Ordering::Equal)
                })
            })
            .collect()
    }
}

/// The raw ping-pongs of the sizes of Null, BigIn and MaxResult over `medium`, with `spin` or
/// blocking, in one go.
pub fn raw(medium: Medium, spin: bool, server_cpu: usize, calls: u32) -> crate::Result<Vec<Raw>> {
    let mut run = RawRun::start(medium, spin, server_cpu)?;
    for i in 0..Procedure::ALL.len() {
        run.chunk(i, calls)?;
    }
    Ok(run.finish())
}

/// What the binding of a [`tiercel_pair`] has beyond the defaults.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    Plain,
    /// The CRC32C checksum on every packet (`ClientConfig::checksum`).
    Checksum,
    /// A secure binding: the server has a key, the client knows it (over UDP, every packet sealed).
    Sealed,
}

/// A server of the seeds' Test interface in this process, on the server CPU, spinning (10 ms after
/// each call) or blocking at once, and a client of it over `medium`, its binding as `variant` says.
pub fn tiercel_pair(
    medium: Medium,
    spin: bool,
    variant: Variant,
    server_cpu: usize,
) -> crate::Result<(tiercel::RunningServer, TestClient)> {
    let key = match variant {
        Variant::Sealed => Some(tiercel::Identity::generate().map_err(tiercel::Error::from)?),
        Variant::Plain | Variant::Checksum => None,
    };
    let config = ServerConfig {
        key: key.clone(),
        workers: 1,
        spinners: 1,
        cpus: vec![server_cpu],
        spin: if spin { Duration::from_millis(10) } else { Duration::ZERO },
        adaptive_spin: false,
        ..ServerConfig::default()
    };
    let server = Server::bind("udp://127.0.0.1:0")
        .and_then(|s| s.with_config(config).export(TestServer::new(SeedTest)).start())
        .map_err(crate::Error::from)?;
    let scheme = if medium == Medium::Udp { "udp://" } else { "shm:" };
    let config = ClientConfig {
        spin: if spin { Spin::Fixed(Duration::from_secs(1)) } else { Spin::Never },
        checksum: variant == Variant::Checksum,
        server_key: key.map(|k| k.public()),
        ..ClientConfig::default()
    };
    let client: TestClient = crate::harness::import(format!("{scheme}{}", server.addr()), config)?;
    Ok((server, client))
}

/// The tiercel calls of one procedure, timed in chunks: timestamps off, then on.
pub struct Measurer<'a> {
    client: &'a TestClient,
    p: Procedure,
    out: Vec<u8>,
    /// BigIn's buffer, holding the pattern the server checks.
    big: Vec<u8>,
    off: Summary,
    /// Calls timed together with timestamps off ([`crate::latency::BLOCK`] spinning over shared
    /// memory, else 1).
    block: u32,
    off_ticks: u64,
    off_calls: u64,
    on_ticks: u64,
    on_calls: u64,
}

impl<'a> Measurer<'a> {
    /// Starts measuring `p` through `client`, its calls with timestamps off timed in blocks of
    /// `block`; forgets the steps recorded so far.
    pub fn new(client: &'a TestClient, p: Procedure, block: u32) -> Measurer<'a> {
        steps::enable(false);
        steps::reset();
        Measurer {
            client,
            p,
            out: vec![0u8; MAX_BUFFER],
            big: {
                let mut big = vec![0u8; BIG_BUFFER];
                crate::seeds::fill(&mut big);
                big
            },
            off: Summary::new(),
            block,
            off_ticks: 0,
            off_calls: 0,
            on_ticks: 0,
            on_calls: 0,
        }
    }

    fn call(&mut self) -> crate::Result<()> {
        call(self.client, self.p, &self.big, &mut self.out)
    }

    /// Times `calls` calls with timestamps off (after an untimed warm-up), then, if `record`,
    /// `calls` more with them on; then lets the server go idle.
    pub fn chunk(&mut self, calls: u32, record: bool) -> crate::Result<()> {
        for _ in 0..WARMUP {
            self.call()?;
        }
        // Each call alone, or spinning over shared memory in blocks (see `latency::BLOCK`).
        let (client, p, big, out, off) = (self.client, self.p, &self.big, &mut self.out, &mut self.off);
        let t0 = stamp();
        crate::latency::time_calls(calls, self.block, || call(client, p, big, out).map(|()| true), |d| off.record(d))?;
        self.off_ticks += stamp().wrapping_sub(t0);
        self.off_calls += u64::from(calls);
        if record {
            steps::enable(true);
            for _ in 0..calls {
                let t0 = ticks();
                mark(Point::Begin);
                let r = self.call();
                mark(Point::End);
                self.on_ticks += ticks().wrapping_sub(t0);
                steps::close();
                r?;
            }
            self.on_calls += u64::from(calls);
        }
        // Let the server close its trace of the last call, and give up the server CPU.
        std::thread::sleep(SETTLE);
        steps::enable(false);
        Ok(())
    }

    /// What the chunks measured.
    pub fn finish(self) -> Measured {
        let mean = |t: u64, n: u64| ticks_to_ns(t as f64) / 1e3 / n.max(1) as f64;
        let recorded = self.on_calls > 0;
        Measured {
            off_mean_us: mean(self.off_ticks, self.off_calls),
            on_mean_us: mean(self.on_ticks, self.on_calls),
            off: self.off,
            steps: if recorded { steps::snapshot() } else { Vec::new() },
            calls: self.on_calls,
            sleeps: if recorded { steps::sleeps() } else { (0, 0) },
        }
    }
}

/// A call of `p` through `client`.
fn call(client: &TestClient, p: Procedure, big: &[u8], out: &mut [u8]) -> crate::Result<()> {
    match p {
        Procedure::Null => client.null(),
        Procedure::BigIn => client.big_in(In(big)),
        Procedure::MaxResult => client.max_result(Out(out)),
    }
    .map_err(crate::Error::from)
}

/// Times `calls` calls of `p` with timestamps off, each alone, then (if `record`) `calls` more with
/// them on.
pub fn measure(client: &TestClient, p: Procedure, calls: u32, record: bool) -> crate::Result<Measured> {
    let mut m = Measurer::new(client, p, 1);
    m.chunk(calls, record)?;
    Ok(m.finish())
}

/// Mean duration in µs of the step `from → to`, if every recorded call took it.
pub fn step_us(steps: &[Step], from: Point, to: Point) -> Option<f64> {
    steps.iter().find(|s| s.from == from && s.to == to).map(|s| s.mean_ns() / 1e3)
}

pub fn name(medium: Medium) -> &'static str {
    if medium == Medium::Udp {
        "udp"
    } else {
        "shm"
    }
}

/// Mean time in µs of `f` over many runs.
pub fn time_us(mut f: impl FnMut()) -> f64 {
    let n = 100_000u32;
    let t0 = ticks();
    for _ in 0..n {
        f();
    }
    ticks_to_ns(ticks().wrapping_sub(t0) as f64) / 1e3 / n as f64
}

/// The raw round trips of the sizes of Null, BigIn and MaxResult, per medium and waiting policy.
pub type Raws = Vec<(Medium, bool, Vec<Raw>)>;

/// Measures and prints the accounting of Null, BigIn and MaxResult over each of `media`, spinning and/or
/// blocking as `modes` say (true: spinning), and with `sealed`, over a secure UDP binding too
/// (spinning, when UDP is among `media`). The raw ping-pong and tiercel are timed in turn, in
/// [`ROUNDS`] rounds of `calls / ROUNDS` calls each. The calling thread must be pinned to
/// `client_cpu`.
pub fn accounts(
    media: &[Medium],
    modes: &[bool],
    sealed: bool,
    calls: u32,
    client_cpu: usize,
    server_cpu: usize,
) -> crate::Result<(Vec<Account>, Raws)> {
    if media.contains(&Medium::Tcp) {
        return Err("the breakdowns are of UDP and shared memory; TCP has none yet".into());
    }
    let placement = format!("caller CPU {client_cpu}, server CPU {server_cpu}");
    let chunk = calls.div_ceil(ROUNDS).max(1);
    let mut accounts = Vec::new();
    let mut base: Raws = Vec::new();
    let runs = media.iter().flat_map(|&m| modes.iter().map(move |&spin| (m, spin, Variant::Plain)));
    let secure = (sealed && media.contains(&Medium::Udp)).then_some((Medium::Udp, true, Variant::Sealed));
    for (medium, spin, variant) in runs.chain(secure) {
        {
            let sealed = variant == Variant::Sealed;
            let what = if sealed { "udp sealed" } else { name(medium) };
            crate::progress::doing(&format!("accounting {what} {}", if spin { "spin" } else { "block" }));
            // Without a spin budget some waits find the answer there already: they are charged
            // the spinning baseline, measured here unless this run already has it.
            let measured_spinning = base.iter().any(|(m, s, _)| *m == medium && *s);
            let own_spinning =
                if !spin && !measured_spinning { Some(raw(medium, true, server_cpu, calls)?) } else { None };
            let mut raw_run = RawRun::start(medium, spin, server_cpu)?;
            let (server, client) = tiercel_pair(medium, spin, variant, server_cpu)?;
            let mut measured = Vec::new();
            for (i, p) in Procedure::ALL.into_iter().enumerate() {
                let block = if medium == Medium::Shm && spin { crate::latency::BLOCK } else { 1 };
                let mut m = Measurer::new(&client, p, block);
                for _ in 0..ROUNDS {
                    raw_run.chunk(i, chunk)?;
                    m.chunk(chunk, true)?;
                }
                measured.push(m.finish());
            }
            drop(client);
            drop(server);
            let raws = raw_run.finish();
            let spinning: &[Raw] = match (&own_spinning, base.iter().find(|(m, s, _)| *m == medium && *s)) {
                (Some(own), _) => own,
                (None, Some((_, _, found))) => found,
                (None, None) => &raws,
            };
            for (i, (p, m)) in Procedure::ALL.into_iter().zip(&measured).enumerate() {
                let a = account(medium, spin, sealed, p, m, &raws[i], &spinning[i]);
                print_account(&a, &placement);
                accounts.push(a);
            }
            if !sealed {
                base.push((medium, spin, raws));
            }
            crate::progress::step();
        }
    }
    Ok((accounts, base))
}
