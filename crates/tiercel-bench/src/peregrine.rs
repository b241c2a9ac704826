//! Peregrine's tables (Johnson & Zwaenepoel, §5): the network penalty of single packets (Table 1) and
//! of multi-packet transfers (Table 3), then calls of growing size against the penalty of the packets
//! they need (Table 5): penalty, measured, overhead, throughput.
//!
//! The network penalty of a message is the time to move it from user space in one process to user
//! space in the other: half the raw round trip of two messages of its size, or, for a multi-packet
//! transfer, the time from the first send to the reply less the penalty of the (small) reply. Both
//! sides busy-poll, as tiercel's client and server do in the measured calls.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::seeds::TestClient;
use tiercel::{ClientConfig, In, InOut, Spin};

use crate::harness::{spawn, Medium, HEADER};
use crate::progress::outln;
use crate::raw::PingPong;
use crate::raw_shm::ShmPingPong;
use crate::raw_tcp::TcpPingPong;
use crate::summary::Summary;

/// Single-packet payload sizes of Table 1 (46 bytes is Ethernet's smallest payload; 1472 bytes the
/// largest UDP payload of a 1500-byte packet).
pub const TABLE1_SIZES: [usize; 7] = [46, 100, 200, 400, 800, 1200, 1472];
/// Transfer sizes of Table 3.
pub const TABLE3_SIZES: [usize; 4] = [3000, 48_000, 1 << 20, 16 << 20];

#[derive(serde::Serialize)]
pub struct Table1Row {
    pub bytes: usize,
    pub spin_median_us: f64,
    pub spin_p99_us: f64,
    pub block_median_us: f64,
    pub block_p99_us: f64,
}

#[derive(serde::Serialize)]
pub struct Table3Row {
    pub bytes: usize,
    pub datagram_bytes: usize,
    pub datagrams: usize,
    pub transfers: u64,
    pub lost: u64,
    pub penalty_median_us: f64,
    pub penalty_p99_us: f64,
    pub mbit_per_second: f64,
    /// The same datagrams carrying a message's own bytes: each tiercel's header's length and the
    /// next bytes of a buffer of the size, received by the echo into a buffer of the size
    /// (`raw::PingPong::transfer_message`), less the reply's penalty.
    pub message_penalty_median_us: f64,
    pub message_mbit_per_second: f64,
    pub message_lost: u64,
}

#[derive(serde::Serialize)]
pub struct Table5Row {
    pub transport: &'static str,
    pub procedure: String,
    pub call_bytes: usize,
    pub result_bytes: usize,
    pub calls: u64,
    /// The row's floor (`floor_of`), measured in turn with the row's calls: the raw round trip of
    /// the call's sizes, one each way, or where quicker the call's bytes and the result's in round
    /// trips of their own, less an empty one; over UDP, for messages of several datagrams, each
    /// message's penalty one way (the quicker of Table 3's two).
    pub penalty_us: f64,
    pub median_us: f64,
    pub p99_us: f64,
    pub overhead_us: f64,
    pub ratio: f64,
    pub mbit_per_second: f64,
    /// Packets the client sent again during the row (timeouts and negative acknowledgements).
    pub retransmissions: u64,
    /// Over UDP, for a row whose call or result takes several datagrams: the penalty of its
    /// messages moved from and into buffers of their size (measured in the row's rounds as Table 3's
    /// message column is, for this row's sizes; a single-datagram message counts its ordinary
    /// penalty), and the call's ratio to it (`message_floor`).
    pub message_penalty_us: Option<f64>,
    pub message_ratio: Option<f64>,
}

#[derive(serde::Serialize, Default)]
pub struct Json {
    pub table1: Vec<Table1Row>,
    pub table3: Vec<Table3Row>,
    pub table5: Vec<Table5Row>,
}

/// Repeats `f` for about `budget` (at least `min` times, at most 20,000), recording each run that
/// returns true.
fn repeat(budget: Duration, min: u32, mut f: impl FnMut() -> crate::Result<bool>) -> crate::Result<(Summary, u64)> {
    let mut s = Summary::new();
    let mut lost = 0;
    let start = Instant::now();
    let mut n = 0u32;
    while (n < min || start.elapsed() < budget) && n < 20_000 {
        let t = Instant::now();
        if f()? {
            s.record(t.elapsed());
        } else {
            lost += 1;
        }
        n += 1;
    }
    Ok((s, lost))
}

fn echo(medium: Medium, spin: bool, server_cpu: usize) -> crate::Result<(crate::harness::Spawned, String)> {
    let role = match medium {
        Medium::Udp => "raw-echo",
        Medium::Shm => "raw-shm-echo",
        Medium::Tcp => "raw-tcp-echo",
    };
    let mut args = vec![role.to_string(), "--cpu".into(), server_cpu.to_string()];
    if spin {
        args.push("--spin".into());
    }
    spawn(&args)
}

fn socket_addr(addr: &str) -> crate::Result<SocketAddr> {
    crate::harness::udp_addr(addr)
}

/// Table 1: half the raw UDP round trip of two packets of each size, busy-polling and blocking.
pub fn table1(server_cpu: usize, budget: Duration) -> crate::Result<Vec<Table1Row>> {
    let mut out = Vec::new();
    let mut halves = Vec::new();
    for spin in [true, false] {
        let (_echo, addr) = echo(Medium::Udp, spin, server_cpu)?;
        let addr = socket_addr(&addr)?;
        let mut row = Vec::new();
        for bytes in TABLE1_SIZES {
            let mut ping = PingPong::new(addr, bytes, bytes, spin)?;
            for _ in 0..200 {
                ping.round_trip()?;
            }
            let (s, _) = repeat(budget, 100, || ping.round_trip())?;
            row.push((s.median_us() / 2.0, s.p99_us() / 2.0));
        }
        halves.push(row);
    }
    outln!("\nPeregrine Table 1: network penalty (half a raw UDP round trip of two packets of the size), µs");
    outln!("{:>8} | {:>12} {:>12} | {:>12} {:>12}", "bytes", "busy median", "busy p99", "block median", "block p99");
    for (i, bytes) in TABLE1_SIZES.into_iter().enumerate() {
        let ((sm, sp), (bm, bp)) = (halves[0][i], halves[1][i]);
        outln!("{bytes:>8} | {sm:>12.2} {sp:>12.2} | {bm:>12.2} {bp:>12.2}");
        out.push(Table1Row { bytes, spin_median_us: sm, spin_p99_us: sp, block_median_us: bm, block_p99_us: bp });
    }
    Ok(out)
}

/// What each Table 5 row's floor is made of, per medium ([`Penalties::floor_parts`]), measured in
/// the row's rounds, and the network penalty of each message size Tables 1 and 3 need: half the raw
/// round trip of that size, or for a UDP message over one datagram, its multi-packet transfer less
/// the reply's penalty.
struct Penalties {
    medium: Medium,
    datagram: usize,
    budget: Duration,
    known: Vec<(usize, f64)>,
    udp: Option<SocketAddr>,
    shm: Option<std::rc::Rc<std::cell::RefCell<crate::raw_shm::Connection>>>,
    tcp: Option<SocketAddr>,
    /// The bytes those messages carry.
    message: Vec<u8>,
    /// The raw ping-pongs of the rows' floors, by their bytes each way ([`Penalties::floor_parts`]).
    pings: Vec<((usize, usize), Pings)>,
    /// Over TCP, the connection of every row's floor.
    tcp_ping: Option<TcpPingPong>,
    /// Over UDP, the ping-pong of the rows' multi-packet transfers ([`Part::Transfer`]).
    transfer_ping: Option<PingPong>,
}

/// What a Table 5 row's floor is made of, each part measured in every round of the row
/// ([`Penalties::floor_parts`]).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Part {
    /// Raw round trips of this many bytes out and back.
    RoundTrip(usize, usize),
    /// Over UDP, a message of this many bytes in several datagrams with a short answer, moved both
    /// of Table 3's ways: from one small buffer into another, and from and into buffers of its size.
    Transfer(usize),
}

/// The raw ping-pongs of one pair of sizes (call bytes, result bytes), kept for every row that
/// needs them.
enum Pings {
    Udp(PingPong),
    /// One connection for every pair, as tiercel's binding has one for every call
    /// ([`Penalties::tcp_ping`]): on a connection of its own, made for the row and warmed up with
    /// two round trips, a 1 MiB InOut round trip took longer than tiercel's call, its socket
    /// buffers not yet grown by the kernel as those of a connection in use are.
    Tcp,
    /// The plain ping-pong and the one that moves its data as tiercel does (the reply in the
    /// request's place, the lines each side wrote and those the echo read pushed out to the shared
    /// cache): the floor is the faster, as in the latency table. With the plain one alone,
    /// tiercel's InOut calls of 1,024 bytes to 16 MiB came out at 0.57x to 0.95x of their floors
    /// in the kept runs of `b749409`.
    Shm(ShmPingPong, ShmPingPong),
}

impl Penalties {
    /// A multi-packet transfer of `bytes` over raw UDP (Table 3's row), and of a message of as many
    /// bytes (its datagrams each a header and the message's next bytes) from and into buffers of
    /// its size.
    fn transfer(&mut self, bytes: usize) -> crate::Result<Table3Row> {
        let small = self.one_way(HEADER)?;
        let addr = self.udp.ok_or("no raw UDP echo")?;
        let mut ping = PingPong::new(addr, HEADER, HEADER, true)?;
        let min = if bytes > 4 << 20 { 5 } else { 20 };
        let (s, lost) = repeat(self.budget, min, || ping.transfer(bytes, self.datagram))?;
        let penalty = (s.median_us() - small).max(0.0);
        // The message's own bytes: as many datagrams as tiercel's fragments of a `bytes`-long
        // packet stream (a header each, and the payload behind it).
        let payload = bytes.saturating_sub(HEADER);
        if self.message.len() < payload {
            self.message.resize(payload, 0);
            crate::seeds::fill(&mut self.message);
        }
        let (message, datagram) = (&self.message[..payload], self.datagram);
        // The announcement is a round trip of its own, before the transfer is timed.
        let mut placed = 0u32;
        let mut m = Summary::new();
        let mut message_lost = 0u64;
        let start = Instant::now();
        while (placed < min || start.elapsed() < self.budget) && placed < 20_000 {
            placed += 1;
            if !ping.place_next()? {
                message_lost += 1;
                continue;
            }
            let t = Instant::now();
            if ping.transfer_message(message, HEADER, datagram, false)? {
                m.record(t.elapsed());
            } else {
                message_lost += 1;
            }
        }
        let message_penalty = (m.median_us() - small).max(0.0);
        Ok(Table3Row {
            bytes,
            datagram_bytes: self.datagram,
            datagrams: bytes.div_ceil(self.datagram),
            transfers: s.len(),
            lost,
            penalty_median_us: penalty,
            penalty_p99_us: (s.p99_us() - small).max(0.0),
            mbit_per_second: bytes as f64 * 8.0 / penalty.max(1e-3),
            message_penalty_median_us: message_penalty,
            message_mbit_per_second: bytes as f64 * 8.0 / message_penalty.max(1e-3),
            message_lost,
        })
    }

    /// What makes the floor of a call of `call` bytes answered by `result` bytes ([`floor_of`]).
    /// Where the raw echo makes one round trip of those sizes (TCP, shared memory, and UDP messages
    /// of one datagram each way): that round trip, and, when both messages carry more than an empty
    /// one, the call's bytes with an empty answer, an empty call answered by the result's bytes,
    /// and an empty round trip. (Half a round trip of a large message each way, added up, is no
    /// floor: a 1 MiB TCP ping-pong each way takes more than twice one 1 MiB message and a short
    /// answer. Nor is that ping-pong itself: in scratch clients it took 591 to 728 µs, where a
    /// 1 MiB message with a short answer took 124 to 166 µs and a short message with a 1 MiB answer
    /// 123 to 172 µs, and tiercel's 1 MiB InOut call 494 to 605 µs in Table 5's quick runs.) A UDP message of
    /// several datagrams has no round trip of its size: then an empty round trip, and for each
    /// message its transfer (several datagrams) or its round trip each way (one).
    fn floor_parts(&self, call: usize, result: usize) -> Vec<Part> {
        let empty = if self.medium == Medium::Shm { 0 } else { HEADER };
        if self.medium == Medium::Udp && call.max(result) > self.datagram {
            let message =
                |bytes| if bytes > self.datagram { Part::Transfer(bytes) } else { Part::RoundTrip(bytes, bytes) };
            return vec![Part::RoundTrip(empty, empty), message(call), message(result)];
        }
        let mut parts = vec![Part::RoundTrip(call, result)];
        if call > empty && result > empty {
            parts.extend([Part::RoundTrip(call, empty), Part::RoundTrip(empty, result), Part::RoundTrip(empty, empty)]);
        }
        parts
    }

    /// Times `part` for `budget` (at least `min` round trips or transfers, after `warm` untimed),
    /// adding them to `into` ([`Penalties::time_pair`], [`Penalties::time_transfer`]).
    fn time_part(
        &mut self,
        part: Part,
        budget: Duration,
        min: u32,
        warm: u32,
        into: &mut [Summary; 2],
    ) -> crate::Result<()> {
        match part {
            Part::RoundTrip(call, result) => self.time_pair((call, result), budget, min, warm, into),
            Part::Transfer(bytes) => self.time_transfer(bytes, budget, min, warm, into),
        }
    }

    /// Times multi-packet transfers of `bytes` over raw UDP, each answered by a short reply, for
    /// `budget` each way (at least `min`, after `warm` untimed), as Table 3 moves them: from one
    /// small buffer into another, added to the first of `into`, and the message's own bytes from
    /// and into buffers of its size, to the second. A transfer that lost a datagram is left out.
    fn time_transfer(
        &mut self,
        bytes: usize,
        budget: Duration,
        min: u32,
        warm: u32,
        into: &mut [Summary; 2],
    ) -> crate::Result<()> {
        let addr = self.udp.ok_or("no raw UDP echo")?;
        let ping = match &mut self.transfer_ping {
            Some(ping) => ping,
            None => self.transfer_ping.insert(PingPong::new(addr, HEADER, HEADER, true)?),
        };
        let datagram = self.datagram;
        for _ in 0..warm {
            ping.transfer(bytes, datagram)?;
        }
        into[0].add(&repeat(budget, min, || ping.transfer(bytes, datagram))?.0);
        let payload = bytes.saturating_sub(HEADER);
        if self.message.len() < payload {
            self.message.resize(payload, 0);
            crate::seeds::fill(&mut self.message);
        }
        let message = &self.message[..payload];
        // The announcement is a round trip of its own, before the transfer is timed.
        let mut placed = 0u32;
        let start = Instant::now();
        while (placed < min + warm || start.elapsed() < budget) && placed < 20_000 {
            placed += 1;
            if !ping.place_next()? {
                continue;
            }
            let t = Instant::now();
            if ping.transfer_message(message, HEADER, datagram, false)? && placed > warm {
                into[1].record(t.elapsed());
            }
        }
        Ok(())
    }

    /// Times raw round trips of `call` bytes answered by `result` bytes for `budget` (at least
    /// `min` of them), after `warm` untimed ones, adding them to `into`: the plain ping-pong's to
    /// the first, over shared memory the other's to the second ([`Pings`]).
    fn time_pair(
        &mut self,
        (call, result): (usize, usize),
        budget: Duration,
        min: u32,
        warm: u32,
        into: &mut [Summary; 2],
    ) -> crate::Result<()> {
        let index = match self.pings.iter().position(|(sizes, _)| *sizes == (call, result)) {
            Some(i) => i,
            None => {
                let pings = match (self.medium, self.udp, self.tcp, &self.shm) {
                    (Medium::Tcp, _, Some(addr), _) => {
                        if self.tcp_ping.is_none() {
                            self.tcp_ping = Some(TcpPingPong::new(addr, call, result, true)?);
                        }
                        Pings::Tcp
                    }
                    (Medium::Udp, Some(addr), ..) => Pings::Udp(PingPong::new(addr, call, result, true)?),
                    (Medium::Shm, _, _, Some(conn)) => Pings::Shm(
                        ShmPingPong::new(conn, call, result, true),
                        ShmPingPong::new(conn, call, result, true).like_tiercel(),
                    ),
                    _ => return Err("no raw echo for the floor".into()),
                };
                self.pings.push(((call, result), pings));
                self.pings.len() - 1
            }
        };
        let [first, second] = into;
        match (&mut self.pings[index].1, self.tcp_ping.as_mut()) {
            (Pings::Udp(ping), _) => {
                for _ in 0..warm {
                    ping.round_trip()?;
                }
                first.add(&repeat(budget, min, || ping.round_trip())?.0);
            }
            (Pings::Tcp, Some(ping)) => {
                for _ in 0..warm {
                    ping.round_trip_of(call, result)?;
                }
                first.add(&repeat(budget, min, || ping.round_trip_of(call, result))?.0);
            }
            (Pings::Tcp, None) => return Err("no raw TCP connection for the floor".into()),
            (Pings::Shm(plain, like), _) => {
                for (ping, into) in [(plain, first), (like, second)] {
                    for _ in 0..warm.min(20) {
                        ping.round_trip()?;
                    }
                    into.add(&repeat(budget, min, || ping.round_trip())?.0);
                }
            }
        }
        Ok(())
    }

    /// Over UDP, the network penalty of a message of `bytes` one way (Tables 3 and 5): half its raw
    /// round trip each way, or for a message of several datagrams its transfer less the short
    /// reply's penalty.
    fn one_way(&mut self, bytes: usize) -> crate::Result<f64> {
        if let Some(&(_, p)) = self.known.iter().find(|(b, _)| *b == bytes) {
            return Ok(p);
        }
        let addr = self.udp.ok_or("no raw UDP echo for the penalties")?;
        let p = if bytes > self.datagram {
            self.transfer(bytes)?.penalty_median_us
        } else {
            let mut ping = PingPong::new(addr, bytes, bytes, true)?;
            for _ in 0..100 {
                ping.round_trip()?;
            }
            repeat(self.budget, 50, || ping.round_trip())?.0.median_us() / 2.0
        };
        self.known.push((bytes, p));
        Ok(p)
    }
}

/// A row's floor from what its [`Penalties::floor_parts`] measured, each part's figure the median of
/// its faster way of measuring it: where it has a round trip of its sizes, that round trip, or,
/// where the parts say so and it is quicker, the call's bytes with an empty answer and an empty call
/// answered by the result's bytes less the empty round trip that the two add beyond the bytes;
/// where it has transfers, each message's penalty one way (its transfer less half an empty round
/// trip, for the short answer; half its round trip each way for a message of one datagram).
fn floor_of(parts: &[Part], raw: &[[Summary; 2]]) -> f64 {
    // `f64::min` passes over a way without a figure; a part with none keeps NaN.
    let fastest: Vec<f64> = raw.iter().map(|ways| ways.iter().map(median_of).fold(f64::NAN, f64::min)).collect();
    if parts.iter().any(|p| matches!(p, Part::Transfer(_))) {
        return one_way_sum(parts, &fastest);
    }
    quicker(&fastest)
}

/// Over UDP, for a row with transfers ([`Part::Transfer`]): the penalty of its messages moved from
/// and into buffers of their size, from the rounds that measured its floor: each transfer's second
/// way ([`Penalties::time_transfer`]), each single-datagram message's round trip, as [`one_way_sum`]
/// adds them. Taken once before the row's rounds instead, a 16 MiB message's came out at 29 ms in
/// one kept run of `0929173` (2.5 ms in Table 3 at its end), and tiercel's call at 0.10× of it.
fn message_floor(parts: &[Part], raw: &[[Summary; 2]]) -> Option<f64> {
    if !parts.iter().any(|p| matches!(p, Part::Transfer(_))) {
        return None;
    }
    let figures: Vec<f64> = parts
        .iter()
        .zip(raw)
        .map(|(part, [first, second])| median_of(if matches!(part, Part::Transfer(_)) { second } else { first }))
        .collect();
    Some(one_way_sum(parts, &figures))
}

/// A call's median against a message floor, where the floor has a figure.
fn ratio_to(median_us: f64, floor_us: Option<f64>) -> Option<f64> {
    floor_us.filter(|f| f.is_finite()).map(|f| median_us / f.max(1e-3))
}

/// The median of one way of measuring a part, or NaN where every try of it was lost: no figure,
/// rather than an endless or a zero one.
fn median_of(way: &Summary) -> f64 {
    if way.is_empty() {
        f64::NAN
    } else {
        way.median_us()
    }
}

/// [`floor_of`]'s rule where the row has a round trip of its sizes, over each part's median.
fn quicker(fastest: &[f64]) -> f64 {
    match *fastest {
        [direct, call_only, result_only, empty] => direct.min(call_only + result_only - empty),
        [direct, ..] => direct,
        [] => f64::NAN,
    }
}

/// [`floor_of`]'s rule where the row has transfers: the first part is the empty round trip, each
/// other a message's. A part without a figure (all lost) leaves the sum without one.
fn one_way_sum(parts: &[Part], fastest: &[f64]) -> f64 {
    let Some((&empty, messages)) = fastest.split_first() else { return f64::NAN };
    if fastest.iter().any(|f| f.is_nan()) {
        return f64::NAN;
    }
    parts
        .iter()
        .skip(1)
        .zip(messages)
        .map(|(part, &m)| match part {
            Part::Transfer(_) => (m - empty / 2.0).max(0.0),
            Part::RoundTrip(..) => m / 2.0,
        })
        .sum()
}

/// Rounds of each Table 5 row: in each, the floor's round trips and then tiercel's calls.
const TABLE5_ROUNDS: u32 = 5;

/// One Table 5 call: its name, its marshaled sizes each way, and how to make it.
struct Call {
    name: String,
    call: usize,
    result: usize,
    size: usize,
    kind: Kind,
}

#[derive(Clone, Copy)]
enum Kind {
    Null,
    Int,
    In,
    InOut,
}

fn calls() -> Vec<Call> {
    let mut v = vec![
        Call { name: "Null".into(), call: 0, result: 0, size: 0, kind: Kind::Null },
        Call { name: "4-byte argument".into(), call: 4, result: 0, size: 0, kind: Kind::Int },
    ];
    // Up to 16 MiB of buffer (the message limit leaves room for its 4-byte length).
    for (label, size) in [("1024", 1024), ("3000", 3000), ("48000", 48_000), ("1 MiB", 1 << 20), ("16 MiB", 16 << 20)] {
        // A buffer travels with its 4-byte length; an InOut buffer comes back as it went.
        v.push(Call { name: format!("{label}-byte In"), call: 4 + size, result: 0, size, kind: Kind::In });
        v.push(Call { name: format!("{label}-byte InOut"), call: 4 + size, result: 4 + size, size, kind: Kind::InOut });
    }
    for c in &mut v {
        if c.name.contains("MiB-byte") {
            c.name = c.name.replace("MiB-byte", "MiB");
        }
    }
    v
}

/// Tables 3 and 5 over `medium`: `rpc_addr` is a spinning `tiercel serve` (host:port).
pub fn table5(
    medium: Medium,
    rpc_addr: &str,
    server_cpu: usize,
    budget: Duration,
    json: &mut Json,
    mut progress: impl FnMut(),
) -> crate::Result<()> {
    let scheme = match medium {
        Medium::Udp => "udp://",
        Medium::Shm => "shm:",
        Medium::Tcp => "tcp://",
    };
    let config = ClientConfig { spin: Spin::Fixed(Duration::from_secs(1)), ..ClientConfig::default() };
    let client: TestClient = crate::harness::import(format!("{scheme}{rpc_addr}"), config)?;
    let (_echo, addr) = echo(medium, true, server_cpu)?;
    let header = if medium == Medium::Shm { 0 } else { HEADER };
    let mut penalties = Penalties {
        medium,
        datagram: client.binding().max_datagram(),
        budget,
        known: Vec::new(),
        udp: if medium == Medium::Udp { Some(socket_addr(&addr)?) } else { None },
        shm: if medium == Medium::Shm { Some(crate::raw_shm::Connection::new(&addr)?) } else { None },
        tcp: if medium == Medium::Tcp { Some(socket_addr(&addr)?) } else { None },
        message: Vec::new(),
        pings: Vec::new(),
        tcp_ping: None,
        transfer_ping: None,
    };
    let mut buf = vec![0u8; 16 << 20];
    crate::seeds::fill(&mut buf);
    let mut rows = Vec::new();
    for c in calls() {
        let (call_bytes, result_bytes) = (header + c.call, header + c.result);
        let parts = penalties.floor_parts(call_bytes, result_bytes);
        let mut call = || -> crate::Result<bool> {
            match c.kind {
                Kind::Null => client.null(),
                Kind::Int => client.int1(7),
                Kind::In => client.bulk_in(In(&buf[..c.size])),
                Kind::InOut => client.bulk_in_out(InOut(&mut buf[..c.size])),
            }
            .map(|()| true)
            .map_err(|e| crate::Error::from(format!("{}: {e}", c.name)))
        };
        for _ in 0..if c.size > 1 << 20 { 2 } else { 50 } {
            call()?;
        }
        let min: u32 = if c.size > 4 << 20 { 5 } else { 20 };
        let resent = || client.binding().stats().retransmissions;
        let resent_before = resent();
        // The floor's round trips and tiercel's calls in turn, in rounds, so that drift of the
        // machine hits both alike: measured one after the other, a shared-memory Null came out
        // at 0.85x its floor in one quick run and 1.33x in the next.
        let raw_large = call_bytes.max(result_bytes) > 2 << 20;
        // As Table 3 times them.
        let transfer_min: u32 = if call_bytes.max(result_bytes) > 4 << 20 { 5 } else { 20 };
        let (raw_warm, raw_min): (u32, u32) = if raw_large { (2, 5) } else { (100, 50) };
        let mut raw: Vec<[Summary; 2]> = parts.iter().map(|_| [Summary::new(), Summary::new()]).collect();
        let mut s = Summary::new();
        // Each server spins for 2 ms past its last call on the CPU the other needs: before the
        // floor's turn and before tiercel's, the other's server is let go quiet.
        let quiet = || std::thread::sleep(crate::latency::QUIET);
        // And each side warms up again in every round: taken cold after the other's turn, a
        // shared-memory 16 MiB InOut call took three times as long as in a run of them.
        let (raw_rewarm, rewarm) = if raw_large { (1, 1) } else { (10, 10) };
        for round in 0..TABLE5_ROUNDS {
            quiet();
            for (&part, into) in parts.iter().zip(&mut raw) {
                let (warm, min) = match part {
                    Part::Transfer(_) => (if round == 0 { 2 } else { 1 }, transfer_min),
                    Part::RoundTrip(..) => (if round == 0 { raw_warm } else { raw_rewarm }, raw_min),
                };
                penalties.time_part(part, budget / TABLE5_ROUNDS, min.div_ceil(TABLE5_ROUNDS), warm, into)?;
            }
            quiet();
            if round > 0 {
                for _ in 0..rewarm {
                    call()?;
                }
            }
            s.add(&repeat(budget / TABLE5_ROUNDS, min.div_ceil(TABLE5_ROUNDS), &mut call)?.0);
        }
        let penalty = floor_of(&parts, &raw);
        let message_penalty = message_floor(&parts, &raw);
        let moved = (c.call + c.result) as f64;
        rows.push(Table5Row {
            transport: medium.name(),
            procedure: c.name,
            call_bytes: header + c.call,
            result_bytes: header + c.result,
            calls: s.len(),
            penalty_us: penalty,
            median_us: s.median_us(),
            p99_us: s.p99_us(),
            overhead_us: s.median_us() - penalty,
            ratio: s.median_us() / penalty,
            mbit_per_second: moved * 8.0 / s.median_us(),
            retransmissions: resent() - resent_before,
            message_penalty_us: message_penalty,
            message_ratio: ratio_to(s.median_us(), message_penalty),
        });
        progress();
    }
    if medium == Medium::Udp {
        let t3 = TABLE3_SIZES.iter().map(|&b| penalties.transfer(b)).collect::<crate::Result<Vec<_>>>()?;
        outln!(
            "\nPeregrine Table 3: multi-packet network penalty over UDP loopback (datagrams of {} bytes, the binding's",
            penalties.datagram
        );
        outln!("size here: sizes up to it go in one), both sides busy-poll; a transfer is all its datagrams, then a");
        outln!("{HEADER}-byte reply, less that reply's penalty; sent from one small buffer over and over and received into");
        outln!("one, and (message) the message's own bytes sent from and received into buffers of its size");
        outln!(
            "{:>10} {:>10} {:>10} {:>6} | {:>12} {:>12} | {:>10} | {:>12} {:>10} {:>6}",
            "bytes",
            "datagrams",
            "transfers",
            "lost",
            "median µs",
            "p99 µs",
            "Mbit/s",
            "message µs",
            "Mbit/s",
            "lost"
        );
        for r in &t3 {
            outln!(
                "{:>10} {:>10} {:>10} {:>6} | {:>12.1} {:>12.1} | {:>10.0} | {:>12.1} {:>10.0} {:>6}",
                r.bytes,
                r.datagrams,
                r.transfers,
                r.lost,
                r.penalty_median_us,
                r.penalty_p99_us,
                r.mbit_per_second,
                r.message_penalty_median_us,
                r.message_mbit_per_second,
                r.message_lost
            );
        }
        json.table3 = t3;
    }
    let (over, raw) = match medium {
        Medium::Udp => (
            "UDP loopback",
            "UDP round trip of the call's sizes, each way, or for messages of several datagrams each message's \
             penalty one way, the quicker of Table 3's two,",
        ),
        Medium::Shm => (
            "shared memory",
            "shm ping-pong of the call's sizes, one each way, the faster of the plain one and the one that moves \
             its data as tiercel does,",
        ),
        Medium::Tcp => ("TCP loopback", "TCP ping-pong on one connection of the call's sizes, one each way,"),
    };
    let split = if medium == Medium::Udp {
        ""
    } else {
        " or, where quicker, the call's bytes and the result's in round trips of their own less an empty one's;"
    };
    outln!("\nPeregrine Table 5 over {over}: calls against the floor beneath them (the raw {raw}{split}");
    outln!(
        "both sides spin); medians of about {} ms of calls per row; \"below\": tiercel measured under its floor, \
         which is then not a fair one",
        budget.as_millis()
    );
    if medium == Medium::Udp {
        outln!(
            "(msg penalty: of messages of several datagrams, measured in the row's rounds as Table 3's message column \
             is, for these sizes: from and into buffers of their size)"
        );
    }
    outln!(
        "{:<18} {:>21} | {:>10} {:>10} {:>10} {:>9} {:>7} | {:>9} {:>7} | {:>11} {:>7}",
        "call",
        "bytes call/result",
        "penalty",
        "measured",
        "p99",
        "overhead",
        "ratio",
        "Mbit/s",
        "resent",
        "msg penalty",
        "× msg"
    );
    for r in &rows {
        // A floor whose every transfer was lost has no figure: "-", not "NaN" or a ratio to zero.
        let figure = |x: Option<f64>, unit: &str| match x.filter(|x| x.is_finite()) {
            Some(x) => format!("{x:.2}{unit}"),
            None => "-".to_string(),
        };
        let below = if r.ratio < 1.0 { " below" } else { "" };
        outln!(
            "{:<18} {:>21} | {:>10} {:>10.2} {:>10.2} {:>9} {:>7} | {:>9.0} {:>7} | {:>11} {:>7}{below}",
            r.procedure,
            format!("{}/{}", r.call_bytes, r.result_bytes),
            figure(Some(r.penalty_us), ""),
            r.median_us,
            r.p99_us,
            figure(Some(r.overhead_us), ""),
            figure(Some(r.ratio), "×"),
            r.mbit_per_second,
            r.retransmissions,
            figure(r.message_penalty_us, ""),
            figure(r.message_ratio, "×")
        );
    }
    json.table5.extend(rows);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A summary of one round trip or transfer of `us` µs.
    fn timed(us: u64) -> Summary {
        let mut s = Summary::new();
        s.record(Duration::from_micros(us));
        s
    }

    #[test]
    fn a_floor_is_the_direct_round_trip_unless_the_bytes_each_way_alone_are_quicker() {
        // TCP loopback's figures of one quick run, µs: 3,000 bytes each way in one round trip
        // (10.19) against 3,000 out (9.70) and 3,000 back (9.2), less an empty round trip (7.58).
        assert_eq!(quicker(&[10.19, 9.70, 9.2, 7.58]), 10.19);
        // A scratch client's 1 MiB each way: one round trip 690 against 150 out and 160 back.
        assert!((quicker(&[690.0, 150.0, 160.0, 7.0]) - 303.0).abs() < 1e-9);
        // A call with nothing but its header one way has its direct round trip alone.
        assert_eq!(quicker(&[8.3]), 8.3);
    }

    #[test]
    fn each_pair_counts_its_faster_way_of_measuring() {
        let timed = |us: &[u64]| {
            let mut s = Summary::new();
            for &u in us {
                s.record(Duration::from_micros(u));
            }
            s
        };
        // Over shared memory the second way was quicker for the direct round trip; elsewhere
        // only the first way measures.
        let raw = [
            [timed(&[700, 690, 710]), timed(&[650, 660, 640])],
            [timed(&[150]), Summary::new()],
            [timed(&[160]), Summary::new()],
            [timed(&[7]), Summary::new()],
        ];
        let split = [Part::RoundTrip(1, 1), Part::RoundTrip(1, 0), Part::RoundTrip(0, 1), Part::RoundTrip(0, 0)];
        let floor = floor_of(&split, &raw);
        assert!((floor - 303.0).abs() < 1.0, "{floor}");
        let direct_only = [[timed(&[9, 10, 11]), timed(&[12])]];
        assert!((floor_of(&[Part::RoundTrip(1, 1)], &direct_only) - 10.0).abs() < 0.1);
        // A pair whose round trips were all lost gives no floor, not an endless one.
        assert!(floor_of(&[Part::RoundTrip(1, 1)], &[[Summary::new(), Summary::new()]]).is_nan());
    }

    #[test]
    fn a_floor_of_transfers_adds_each_messages_penalty_one_way() {
        // An empty round trip of 4 µs; 1 MiB out, its faster way 150 µs with the short answer;
        // 1 MiB back the same, 160 µs: each less half the empty round trip.
        let parts = [Part::RoundTrip(56, 56), Part::Transfer(1 << 20), Part::Transfer(1 << 20)];
        let raw = [[timed(4), Summary::new()], [timed(170), timed(150)], [timed(160), timed(175)]];
        assert!((floor_of(&parts, &raw) - 306.0).abs() < 0.5, "{}", floor_of(&parts, &raw));
        // A 56-byte answer of one datagram counts half its round trip: 150 - 2 + 2.
        let parts = [Part::RoundTrip(56, 56), Part::Transfer(1 << 20), Part::RoundTrip(56, 56)];
        let raw = [[timed(4), Summary::new()], [timed(150), timed(160)], [timed(4), Summary::new()]];
        assert!((floor_of(&parts, &raw) - 150.0).abs() < 0.5, "{}", floor_of(&parts, &raw));
    }

    #[test]
    fn the_message_floor_takes_each_transfers_message_way_from_the_rounds() {
        // The same figures as above: the message way of 1 MiB out (175 µs there, 160 here) and
        // back, whichever way is quicker, each less half the empty round trip.
        let parts = [Part::RoundTrip(56, 56), Part::Transfer(1 << 20), Part::Transfer(1 << 20)];
        let raw = [[timed(4), Summary::new()], [timed(170), timed(150)], [timed(160), timed(175)]];
        let message = message_floor(&parts, &raw).unwrap();
        assert!((message - 321.0).abs() < 0.5, "{message}");
        // A short answer of one datagram counts half its round trip: 160 - 2 + 2.
        let parts = [Part::RoundTrip(56, 56), Part::Transfer(1 << 20), Part::RoundTrip(56, 56)];
        let raw = [[timed(4), Summary::new()], [timed(150), timed(160)], [timed(4), Summary::new()]];
        assert!((message_floor(&parts, &raw).unwrap() - 160.0).abs() < 0.5);
        // A transfer whose every message was lost gives no figure, not a small one.
        let raw = [[timed(4), Summary::new()], [timed(150), Summary::new()], [timed(4), Summary::new()]];
        let lost = message_floor(&parts, &raw);
        assert!(lost.unwrap().is_nan());
        // and no ratio to it: `f64::max` would have made it a ratio to 0.001 µs.
        assert_eq!(ratio_to(200.0, lost), None);
        assert_eq!(ratio_to(200.0, Some(160.0)), Some(1.25));
        // A row of single datagrams has no message floor.
        let parts = [Part::RoundTrip(3060, 3060)];
        assert_eq!(message_floor(&parts, &[[timed(5), Summary::new()]]), None);
    }
}
