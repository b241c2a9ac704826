//! The raw UDP ping-pong the benchmark measures tiercel against: the same system calls (`send`, or
//! `sendmsg` for a datagram of more than `tiercel_sys::udp::GATHER_SMALL` bytes in parts;
//! non-blocking `recv`/`recvfrom`) with no protocol at all; not spinning, each side blocks in its
//! receive itself, [`RECEIVE_WAIT`] at a time, as tiercel's blocking callers and listeners do (the
//! cheapest blocking wait there is). A request's first four bytes say
//! how long the reply must be; a request of several datagrams (a multi-packet transfer) says in its
//! next eight how many datagrams it has and which transfer they belong to, and the echo replies
//! once all have come.
//!
//! A transfer moves the bytes of one buffer into another or only the kernel's: sent from one small
//! buffer over and over and received into one, or ([`PingPong::transfer_message`]) sent from a
//! message of its size, each datagram its header and the next bytes of the message, and received by
//! the echo into a buffer of its size, each datagram (or coalesced run) after the one before, as a
//! receiver that puts a message together does. A 16 MiB message fits no cache, so the second pays
//! for memory the first never touches: it is the floor of an RPC that moves a 16 MiB argument.

use std::io::{IoSlice, Write};
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use tiercel_sys::clock::ticks;
use tiercel_sys::udp::{self, Received};

/// High bit of a request's reply length: a request that announces that the next transfer is to be
/// received into its place in a buffer of the message's size.
const PLACE_NEXT: u32 = 1 << 31;

/// How long a spinning echo server goes on spinning without a request before it blocks.
pub const SPIN_WHILE_IDLE: Duration = Duration::from_millis(2);

/// The read timeout of a blocking floor's socket, as tiercel's (`RECEIVE_WAIT` in
/// `tiercel::waiting`): the floors' threads wait in their receives for at most this long at a time
/// (the kernel rounds it up to a tick of its clock), as tiercel's blocking callers and listeners
/// do, and look again. The timer a thread sleeps with changes how soon it wakes. On our VM, in
/// alternating 200-ms windows of a scratch client (three runs, medians of each run's calls), a
/// blocking raw Null ping-pong whose caller's receive waited a second at most and its echo's 100
/// ms took 58.2 to 59.3 µs, and tiercel's blocking Null 55.8 to 56.7 (0.95× to 0.96×); with the
/// echo's receive waiting this long, 54.8 to 55.5 (tiercel 54.7 to 55.5); with both sides' waiting
/// this long, 51.5 to 52.0 (tiercel 53.1 to 53.5, 1.03×).
pub const RECEIVE_WAIT: Duration = Duration::from_millis(1);

/// How long a blocking floor then waits in `poll`, after a receive that waited its [`RECEIVE_WAIT`]
/// for nothing, before it receives again: as a blocked tiercel caller parks or polls at a time
/// (`TICK` of tiercel's TCP client).
pub const POLL_WAIT: Duration = Duration::from_millis(100);

/// Options of the `raw-echo` helper role.
#[derive(clap::Args)]
pub struct EchoArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    addr: SocketAddr,
    /// CPU to pin to.
    #[arg(long)]
    cpu: Option<usize>,
    /// Busy-poll instead of blocking in `poll`.
    #[arg(long)]
    spin: bool,
    /// Exit after this many seconds, whatever happens.
    #[arg(long, default_value_t = 900)]
    max_seconds: u64,
    /// Time each turnaround (receive returned → send returned) and put the running sum of ticks and
    /// count, two little-endian u64, in the first 16 bytes of each reply (for `tiercel explain`).
    #[arg(long)]
    stamp: bool,
    /// Take runs of datagrams as one coalesced buffer (`UDP_GRO`), as a receiver of a segmented
    /// stream does.
    #[arg(long)]
    gro: bool,
    /// Blocking, after each answer take the requests that queued meanwhile in batches and answer
    /// each batch with one send ([`drain_requests`]): for requests of one datagram only (several
    /// callers' Nulls), not multi-packet transfers.
    #[arg(long)]
    drain: bool,
    /// With `--gro`, answer each run of one-datagram requests taken whole with one segmented send
    /// of their answers (UDP GSO), and a lone request with one datagram, each answer starting with
    /// its request's first 16 bytes (the caller's number, [`Batched`]): the echo beneath several
    /// callers sharing one socket.
    #[arg(long)]
    runs: bool,
}

pub fn echo(args: EchoArgs) -> crate::Result<()> {
    if let Some(cpu) = args.cpu {
        tiercel_sys::cpu::pin_current_thread(cpu).map_err(crate::Error::from)?;
    }
    let socket = udp::bind(args.addr, false).map_err(crate::Error::from)?;
    println!("listening udp://{}", socket.local_addr().map_err(crate::Error::from)?);
    let _ = std::io::stdout().flush();
    serve_echo(&socket, &args)
}

/// Answers on `socket` until `args.max_seconds` have passed.
fn serve_echo(socket: &UdpSocket, args: &EchoArgs) -> crate::Result<()> {
    let mut reply = vec![0x5au8; tiercel::config::MAX_UDP_PAYLOAD];
    let (mut turn_ticks, mut turns) = (0u64, 0u64);
    // The multi-packet transfer being received: its id and the datagrams of it seen so far.
    let (mut transfer, mut seen) = (0u32, 0u32);
    let mut rx = vec![0u8; tiercel::config::MAX_UDP_PAYLOAD.max(udp::GRO_BUFFER)];
    // Where a transfer announced with `PLACE_NEXT` is received: each datagram after the one before
    // (from `placed`), in a buffer that grows to the largest message (and a receive's room).
    let (mut placing, mut placed) = (false, 0usize);
    let mut message: Vec<u8> = Vec::new();
    let end = Instant::now() + Duration::from_secs(args.max_seconds);
    let mut idle_checks = 0u32;
    let mut last = Instant::now();
    // Requests that queued while the blocking echo answered one: taken in batches.
    let mut drained = tiercel_sys::mmsg::RecvBatch::new(HEADER_ROOM);
    // The answers of a run of requests (`--runs`).
    let mut runs = Vec::new();
    if args.gro && !udp::enable_gro(socket) {
        return Err("this kernel refuses UDP_GRO".into());
    }
    if !args.spin && !args.gro {
        // Not spinning, the echo blocks in its receives, each at most `RECEIVE_WAIT`, as a tiercel
        // listener's first wait after calls is.
        socket.set_read_timeout(Some(RECEIVE_WAIT)).map_err(crate::Error::from)?;
    }
    loop {
        let room = rx.len();
        if placing && message.len() < placed + room {
            if placed + room > MAX_PLACED {
                placed = 0;
            }
            message.resize(placed + room, 0);
        }
        let (buf, at) = if placing { (&mut message[placed..placed + room], placed) } else { (&mut rx[..], 0) };
        let got = if args.gro {
            udp::recv_from_segments_nowait(socket, buf).map_err(crate::Error::from)?
        } else if !args.spin {
            udp::recv_from_wait(socket, buf)
                .map_err(crate::Error::from)?
                .map(|(received, from)| (udp::Segmented { received, segment: None }, from))
        } else {
            udp::recv_from_nowait(socket, buf)
                .map_err(crate::Error::from)?
                .map(|(received, from)| (udp::Segmented { received, segment: None }, from))
        };
        match got {
            Some((udp::Segmented { received: Received::Datagram(len), segment }, from)) => {
                idle_checks = 0;
                let bytes = if placing { &message[at..at + len] } else { &rx[..len] };
                if placing {
                    placed += len;
                }
                if args.runs && answer_run(socket, from, &bytes[..len], segment, &mut runs) {
                    continue;
                }
                // Each datagram of a coalesced run is one of the transfer's (or a request).
                for piece in udp::segments(len, segment) {
                    let rx = &bytes[piece];
                    if rx.len() < 4 {
                        continue;
                    }
                    let first = u32::from_le_bytes([rx[0], rx[1], rx[2], rx[3]]);
                    if rx.len() >= 12 {
                        let count = u32::from_le_bytes([rx[4], rx[5], rx[6], rx[7]]);
                        let id = u32::from_le_bytes([rx[8], rx[9], rx[10], rx[11]]);
                        if count > 1 {
                            if id != transfer {
                                (transfer, seen) = (id, 0);
                            }
                            seen += 1;
                            if seen < count {
                                continue;
                            }
                        }
                    }
                    // A transfer has ended or a request came: the next transfer is placed only if
                    // this one announces it.
                    (placing, placed) = (first & PLACE_NEXT != 0, 0);
                    let s0 = if args.stamp { ticks() } else { 0 };
                    let want = ((first & !PLACE_NEXT) as usize).min(reply.len());
                    if args.stamp && want >= 16 {
                        reply[..8].copy_from_slice(&turn_ticks.to_le_bytes());
                        reply[8..16].copy_from_slice(&turns.to_le_bytes());
                    }
                    let _ = udp::send_gather_to(socket, &from, &[IoSlice::new(&reply[..want])]);
                    if args.stamp {
                        turn_ticks += ticks().wrapping_sub(s0);
                        turns += 1;
                    }
                }
                if args.drain && !args.spin && !args.gro {
                    drain_requests(socket, &mut drained, &reply);
                }
                continue;
            }
            Some(_) => continue,
            None => {}
        }
        idle_checks = idle_checks.wrapping_add(1);
        if idle_checks.is_multiple_of(4096) {
            let now = Instant::now();
            if now > end {
                return Ok(());
            }
            if idle_checks == 4096 {
                last = now;
            }
        }
        // Spin while calls come; after 2 ms without one (the benchmark measuring the other side),
        // block, so as not to take the CPU from the server measured next.
        if args.spin && (idle_checks < 4096 || last.elapsed() < SPIN_WHILE_IDLE) {
            core::hint::spin_loop();
        } else if !args.spin && !args.gro {
            // The receive waited its `RECEIVE_WAIT` for nothing: as a tiercel listener then waits
            // in `epoll`, the echo waits in `poll`, longer, and receives again when a datagram came.
            if Instant::now() > end {
                return Ok(());
            }
            let _ = udp::wait_readable(socket, Some(POLL_WAIT));
        } else {
            let _ = udp::wait_readable(socket, Some(Duration::from_millis(100)));
        }
    }
}

/// Answers a run of one-datagram requests taken whole (`len` bytes cut every `segment`) with one
/// segmented send to `from`, each answer the size its request asks for, starting with the
/// request's first 16 bytes; false (nothing sent) when the run is not such requests, all asking for
/// answers of one size.
fn answer_run(socket: &UdpSocket, from: SocketAddr, run: &[u8], segment: Option<usize>, out: &mut Vec<u8>) -> bool {
    let mut want = None;
    out.clear();
    for piece in udp::segments(run.len(), segment) {
        let rx = &run[piece];
        if rx.len() < 16 {
            return false;
        }
        let first = u32::from_le_bytes([rx[0], rx[1], rx[2], rx[3]]);
        let count = u32::from_le_bytes([rx[4], rx[5], rx[6], rx[7]]);
        let size = first as usize;
        if count > 1
            || first & PLACE_NEXT != 0
            || !(16..=HEADER_ROOM).contains(&size)
            || *want.get_or_insert(size) != size
        {
            return false;
        }
        let at = out.len();
        out.resize(at + size, 0x5a);
        out[at..at + 16].copy_from_slice(&rx[..16]);
    }
    let Some(size) = want else { return false };
    let sent = if out.len() > size {
        udp::send_segments(socket, Some(&from), &[IoSlice::new(out)], size)
    } else {
        udp::send_gather_to(socket, &from, &[IoSlice::new(out)])
    };
    sent.is_ok()
}

/// The room of each datagram of a drained batch: requests of one datagram are a header's size or
/// a little more (a larger one is dropped, as a lost datagram: its client sends it again).
const HEADER_ROOM: usize = 2048;

/// How many looks in a row that find nothing end a drain ([`drain_requests`]); a tiercel UDP
/// listener makes as many before it waits (`IDLE_LOOKS` in tiercel's server).
const DRAIN_LOOKS: u32 = 10;

/// The blocking echo (with `--drain`), after it answered a request: takes the one-datagram
/// requests that queued meanwhile (from several callers) with a `recvmmsg` that does not block, up
/// to 16 at a time, and answers each batch with one `sendmmsg`, as a server that batches does, and
/// goes back to its blocking receive only after [`DRAIN_LOOKS`] looks in a row found nothing. Each
/// time the echo falls asleep, the next request must wake it, which on our VM takes tens of µs and
/// some of its sender's CPU; the more it looks, the less often it sleeps while
/// requests stream in. Against blocking callers on one CPU that yield and look before they block (a
/// scratch client, 1 s each, echoes looking 3, 6 and 10 times in turn), calls a second at two
/// callers: 43,086, 69,926, 94,686 (3 looks); 49,853, 88,885, 113,330 (6); 70,837, 138,738, 133,770
/// (10); at four, 158,939-213,717, 186,006-211,283 and 186,294-208,136; at eight, alike. With one
/// caller the looks are made while the reply is on its way, and find nothing.
fn drain_requests(socket: &UdpSocket, batch: &mut tiercel_sys::mmsg::RecvBatch, reply: &[u8]) {
    let mut answers = [(SocketAddr::from(([0, 0, 0, 0], 0)), &reply[..0]); tiercel_sys::mmsg::MAX_BATCH];
    let mut empty = 0;
    loop {
        let n = match batch.recv_nowait(socket, tiercel_sys::mmsg::MAX_BATCH) {
            Ok(n) if n > 0 => n,
            _ => {
                empty += 1;
                if empty == DRAIN_LOOKS {
                    return;
                }
                continue;
            }
        };
        empty = 0;
        let mut k = 0;
        for i in 0..n {
            let Some(d) = batch.get(i) else { continue };
            let (Received::Datagram(_), Some(from)) = (d.received, d.from) else { continue };
            if d.bytes.len() < 4 {
                continue;
            }
            let first = u32::from_le_bytes([d.bytes[0], d.bytes[1], d.bytes[2], d.bytes[3]]);
            answers[k] = (from, &reply[..((first & !PLACE_NEXT) as usize).min(reply.len())]);
            k += 1;
        }
        let _ = tiercel_sys::mmsg::send_batch(socket, &answers[..k]);
    }
}

/// Most bytes of placed transfers the echo holds (a 16 MiB message, its datagrams' headers and a
/// receive's room); a longer transfer goes on from the start of the buffer.
const MAX_PLACED: usize = 24 << 20;

/// The most turns a blocking caller beside others takes before it blocks
/// ([`PingPong::looking_first`]): as many as tiercel's blocking UDP callers take
/// (`tiercel::waiting::spin::WAIT_TURNS`).
pub const LOOK_TURNS: u32 = 4;

/// The client side of the raw ping-pong.
pub struct PingPong {
    /// The datagram of multi-packet transfers, and the id of the last one.
    blast: Vec<u8>,
    transfer: u32,
    socket: UdpSocket,
    request: Vec<u8>,
    rx: Vec<u8>,
    spin: bool,
    /// Spinning, yields the CPU between looks (to the other callers sharing it), as tiercel's
    /// callers do beside one another ([`PingPong::yielding`]).
    yielding: bool,
    /// Blocking, yields the CPU once and looks for the reply without blocking before it blocks in
    /// the receive ([`PingPong::looking_first`]).
    look_first: bool,
    /// The shortest round trip seen lately, in ns: a lone spinning caller (neither yielding nor
    /// blocking) first looks for its reply three quarters of it after its send, as tiercel's lone
    /// caller does (`SpinBudget::first_look`). 0 until the first round trip.
    floor_ns: u64,
    /// With `Some`, each round trip is split into its steps (for `tiercel explain`).
    pub stamps: Option<Stamps>,
}

/// A raw round trip split in steps, summed in ticks: the client's send, its wait for the reply, and
/// the echo's turnaround (as the echo reported it).
#[derive(Default, Clone, Copy, Debug)]
pub struct Stamps {
    pub send: u64,
    pub wait: u64,
    pub round_trips: u64,
    pub echo_turnaround: u64,
    pub echo_turns: u64,
}

impl Stamps {
    /// Mean per round trip, in µs, of the client's send, its wait, and the echo's turnaround.
    pub fn means_us(&self) -> (f64, f64, f64) {
        let us = |t: u64, n: u64| tiercel_sys::clock::ticks_to_ns(t as f64) / 1e3 / n.max(1) as f64;
        (us(self.send, self.round_trips), us(self.wait, self.round_trips), us(self.echo_turnaround, self.echo_turns))
    }
}

impl PingPong {
    pub fn new(server: SocketAddr, request_len: usize, reply_len: usize, spin: bool) -> crate::Result<PingPong> {
        let socket = udp::connect(server).map_err(crate::Error::from)?;
        if !spin {
            // A blocking round trip waits in its receive, `RECEIVE_WAIT` at a time, for a second
            // at most.
            socket.set_read_timeout(Some(RECEIVE_WAIT)).map_err(crate::Error::from)?;
        }
        let mut request = vec![0u8; request_len.max(4)];
        request[..4].copy_from_slice(&(reply_len as u32).to_le_bytes());
        Ok(PingPong {
            blast: Vec::new(),
            transfer: 0,
            socket,
            request,
            rx: vec![0; tiercel::config::MAX_UDP_PAYLOAD],
            spin,
            yielding: false,
            look_first: false,
            floor_ns: 0,
            stamps: None,
        })
    }

    /// A spinning ping-pong that yields the CPU between looks for its reply (`sched_yield`), as
    /// tiercel's callers do when several share a CPU: the floor for several callers on one CPU.
    pub fn yielding(mut self) -> PingPong {
        self.yielding = self.spin;
        self
    }

    /// A blocking ping-pong for one of several callers sharing a CPU, waiting as tiercel's blocking
    /// callers do beside one another: after its send it takes up to [`LOOK_TURNS`] turns, each a
    /// yield of the CPU (`sched_yield`, so that the others send their requests or take their
    /// replies) and a look for its reply with a receive that does not block, and only then blocks
    /// in the receive. A reply that came while the others ran is taken without a wake-up, which on
    /// our VM costs tens of µs; a caller that blocks at once sleeps and is woken even then.
    pub fn looking_first(mut self) -> PingPong {
        self.look_first = !self.spin;
        self
    }

    /// A multi-packet transfer: `total` bytes sent as datagrams of `datagram` bytes, answered by one
    /// reply of the ping-pong's reply size once all have come; false if a datagram or the reply was
    /// lost (nothing waits longer than a second).
    pub fn transfer(&mut self, total: usize, datagram: usize) -> crate::Result<bool> {
        let datagram = datagram.clamp(12, tiercel::config::MAX_UDP_PAYLOAD);
        let count = total.div_ceil(datagram).max(1);
        self.transfer = self.transfer.wrapping_add(1);
        self.blast.resize(datagram, 0);
        self.blast[..4].copy_from_slice(&self.request[..4]);
        self.blast[4..8].copy_from_slice(&(count as u32).to_le_bytes());
        self.blast[8..12].copy_from_slice(&self.transfer.to_le_bytes());
        let mut left = total.max(12);
        for _ in 0..count {
            let n = left.min(datagram).max(12);
            left = left.saturating_sub(n);
            // A full socket buffer is a lost datagram: the transfer then fails as a whole.
            let _ = udp::send_gather(&self.socket, &[IoSlice::new(&self.blast[..n])]);
        }
        self.await_reply()
    }

    /// [`PingPong::transfer`] with the datagrams handed to the kernel in runs, one `sendmsg` per run
    /// of up to [`udp::MAX_SEGMENTS`] datagrams or [`udp::MAX_SEGMENTED`] bytes, cut by UDP
    /// segmentation offload (`UDP_SEGMENT`). An error if the kernel refuses segmentation.
    pub fn transfer_segmented(&mut self, total: usize, datagram: usize) -> crate::Result<bool> {
        let datagram = datagram.clamp(12, udp::MAX_SEGMENTED / 2);
        let count = total.div_ceil(datagram).max(1);
        let per_send = (udp::MAX_SEGMENTED / datagram).min(udp::MAX_SEGMENTS);
        self.transfer = self.transfer.wrapping_add(1);
        self.blast.resize(per_send * datagram, 0);
        for d in self.blast.chunks_mut(datagram) {
            d[..4].copy_from_slice(&self.request[..4]);
            d[4..8].copy_from_slice(&(count as u32).to_le_bytes());
            d[8..12].copy_from_slice(&self.transfer.to_le_bytes());
        }
        let mut left = total.max(12);
        while left > 0 {
            let n = left.min(per_send * datagram);
            // The last datagram is never shorter than the 12 bytes that say what it is.
            let n = if !n.is_multiple_of(datagram) && n % datagram < 12 { n - n % datagram + 12 } else { n };
            left = left.saturating_sub(n);
            match udp::send_segments(&self.socket, None, &[IoSlice::new(&self.blast[..n])], datagram) {
                Ok(_) => {}
                Err(e) if udp::is_segmentation_refused(&e) => return Err(e.into()),
                // A full socket buffer loses the run: the transfer then fails as a whole.
                Err(_) => {}
            }
        }
        self.await_reply()
    }

    /// Tells the echo to receive the next transfer into its place in a buffer of the message's size
    /// (one round trip, before the transfer is timed); false if the reply did not come.
    pub fn place_next(&mut self) -> crate::Result<bool> {
        let mut request = self.request.clone();
        let first = u32::from_le_bytes([request[0], request[1], request[2], request[3]]) | PLACE_NEXT;
        request[..4].copy_from_slice(&first.to_le_bytes());
        udp::send_gather(&self.socket, &[IoSlice::new(&request)]).map_err(crate::Error::from)?;
        self.await_reply()
    }

    /// A multi-packet transfer of the bytes of `message`: datagrams of up to `datagram` bytes, each
    /// a `header` of `header` bytes (the transfer's 12 and zeros; at least 12) and the next bytes of
    /// the message, gathered by the kernel from both; `segmented`, in runs as
    /// [`PingPong::transfer_segmented`] sends them. Answered once all have come; false if a datagram
    /// or the reply was lost. After [`PingPong::place_next`] the echo receives it into a buffer of
    /// its size.
    pub fn transfer_message(
        &mut self,
        message: &[u8],
        header: usize,
        datagram: usize,
        segmented: bool,
    ) -> crate::Result<bool> {
        let header = header.max(12);
        let datagram = datagram.clamp(header + 1, if segmented { udp::MAX_SEGMENTED / 2 } else { udp::MAX_SEGMENTED });
        let chunk = datagram - header;
        let count = message.len().div_ceil(chunk).max(1);
        self.transfer = self.transfer.wrapping_add(1);
        let mut head = vec![0u8; header];
        head[..4].copy_from_slice(&self.request[..4]);
        head[4..8].copy_from_slice(&(count as u32).to_le_bytes());
        head[8..12].copy_from_slice(&self.transfer.to_le_bytes());
        let per_send = if segmented { (udp::MAX_SEGMENTED / datagram).min(udp::MAX_SEGMENTS) } else { 1 };
        let chunks: Vec<&[u8]> = if message.is_empty() { vec![&[][..]] } else { message.chunks(chunk).collect() };
        for run in chunks.chunks(per_send) {
            let parts: Vec<IoSlice<'_>> = run.iter().flat_map(|c| [IoSlice::new(&head), IoSlice::new(c)]).collect();
            let sent = if segmented {
                udp::send_segments(&self.socket, None, &parts, datagram)
            } else {
                udp::send_gather(&self.socket, &parts)
            };
            match sent {
                Ok(_) => {}
                Err(e) if segmented && udp::is_segmentation_refused(&e) => return Err(e.into()),
                // A full socket buffer loses the datagrams: the transfer then fails as a whole.
                Err(_) => {}
            }
        }
        self.await_reply()
    }

    /// Waits up to a second for the reply to a transfer; false if it did not come.
    fn await_reply(&mut self) -> crate::Result<bool> {
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            match udp::recv_nowait(&self.socket, &mut self.rx).map_err(crate::Error::from)? {
                Received::Datagram(_) => return Ok(true),
                _ if Instant::now() > deadline => return Ok(false),
                _ if self.spin => core::hint::spin_loop(),
                _ => {
                    udp::wait_readable(&self.socket, Some(Duration::from_millis(100))).map_err(crate::Error::from)?;
                }
            }
        }
    }

    /// Counts a lone caller's round trip of `ns` in the shortest seen lately (as tiercel's spin
    /// budget does).
    fn observe(&mut self, ns: u64) {
        self.floor_ns =
            if self.floor_ns == 0 || ns < self.floor_ns { ns } else { self.floor_ns + (ns - self.floor_ns) / 256 };
    }

    /// One round trip; false if the reply did not come within a second (a lost packet).
    ///
    /// A lone spinning caller waits as tiercel's lone caller after a one-packet call does: it reads
    /// the clock, without a system call, until three quarters of the shortest round trip seen
    /// lately have passed since its send, then looks for its reply without blocking, reading the
    /// clock after each look that finds nothing. The round trip it then takes (from before the
    /// send to the last clock reading before the look that found the reply, as tiercel's call
    /// machine counts its own) lowers that floor at once, or raises it by 1/256 of the
    /// difference. Without this wait the floor made a receive every few hundred nanoseconds
    /// while the reply was on its way, and tiercel's lone Null came out under it in some runs.
    pub fn round_trip(&mut self) -> crate::Result<bool> {
        let lone = self.spin && !self.yielding;
        let start = if lone { Some(Instant::now()) } else { None };
        let t0 = if self.stamps.is_some() { ticks() } else { 0 };
        udp::send_gather(&self.socket, &[IoSlice::new(&self.request)]).map_err(crate::Error::from)?;
        let t1 = if self.stamps.is_some() { ticks() } else { 0 };
        let mut seen = start;
        if let Some(start) = start {
            let first = start + Duration::from_nanos(self.floor_ns / 4 * 3);
            loop {
                let now = Instant::now();
                seen = Some(now);
                if now >= first {
                    break;
                }
            }
        }
        // A caller that yields reads the clock only every 64 looks, from the first 64 on (each
        // look is a receive and a yield, two system calls, against a clock read's tens of ns).
        let mut deadline: Option<Instant> = None;
        let mut looks = 0u32;
        loop {
            let turn = self.look_first && looks < LOOK_TURNS;
            if turn {
                std::thread::yield_now();
            }
            let received = if self.spin || turn {
                udp::recv_nowait(&self.socket, &mut self.rx)
            } else {
                udp::recv_wait(&self.socket, &mut self.rx)
            };
            let received = received.map_err(crate::Error::from)?;
            if let Received::Datagram(n) = received {
                if let (Some(start), Some(seen)) = (start, seen) {
                    self.observe(seen.saturating_duration_since(start).as_nanos() as u64);
                }
                if let Some(s) = &mut self.stamps {
                    let t2 = ticks();
                    s.send += t1 - t0;
                    s.wait += t2 - t1;
                    s.round_trips += 1;
                    if n >= 16 {
                        s.echo_turnaround = u64::from_le_bytes(self.rx[..8].try_into().unwrap_or_default());
                        s.echo_turns = u64::from_le_bytes(self.rx[8..16].try_into().unwrap_or_default());
                    }
                }
                return Ok(true);
            }
            if lone {
                core::hint::spin_loop();
                let now = Instant::now();
                seen = Some(now);
                if now > *deadline.get_or_insert(now + Duration::from_secs(1)) {
                    return Ok(false);
                }
            } else if self.spin {
                std::thread::yield_now();
                looks = looks.wrapping_add(1);
                if looks.is_multiple_of(64)
                    && Instant::now() > *deadline.get_or_insert_with(|| Instant::now() + Duration::from_secs(1))
                {
                    return Ok(false);
                }
            } else if turn {
                // The look found nothing: another turn, or the receive that blocks.
                looks += 1;
            } else if received == Received::Nothing
                && Instant::now() > *deadline.get_or_insert_with(|| Instant::now() + Duration::from_secs(1))
            {
                // The receive waited its `RECEIVE_WAIT` for nothing, again and again for a second.
                return Ok(false);
            }
        }
    }
}

/// A raw UDP ping-pong whose caller is a task of a tokio runtime: the floor beneath tiercel's async
/// calls over UDP, which wait as this does. A round trip sends its request and takes the reply with
/// a receive that does not block: a lone caller (`spin`) looks again at once until it comes, as
/// tiercel's lone async call spins, its socket not registered with the reactor (as tiercel's is not
/// while its calls spin: a registered socket has every datagram wake the reactor's thread if it
/// sleeps); one of several has a second descriptor of its connected socket registered with the
/// runtime's reactor, forgets that the socket was readable (no system call) before it sends, and
/// waits for the reactor to say the socket is readable before each look, leaving the thread to the
/// other tasks, as tiercel's calls do when others of their binding are in flight. A send and a
/// receive a round trip, as tiercel's.
pub struct AsyncPingPong {
    socket: UdpSocket,
    /// The socket's registration with the reactor, for a caller that waits there (not `spin`).
    ready: Option<tokio::net::UdpSocket>,
    request: Vec<u8>,
    rx: Vec<u8>,
    spin: bool,
    /// The length of the last reply.
    last: usize,
}

impl AsyncPingPong {
    /// A caller of the echo at `server` whose requests ask for replies of `reply_len` bytes. Made in
    /// a task (or within the runtime): unless it spins, its socket is registered with the runtime's
    /// reactor.
    pub fn new(server: SocketAddr, request_len: usize, reply_len: usize, spin: bool) -> crate::Result<AsyncPingPong> {
        let socket = udp::connect(server).map_err(crate::Error::from)?;
        socket.set_nonblocking(true).map_err(crate::Error::from)?;
        let ready = match spin {
            true => None,
            false => Some(tokio::net::UdpSocket::from_std(socket.try_clone()?).map_err(crate::Error::from)?),
        };
        let mut request = vec![0u8; request_len.max(4)];
        request[..4].copy_from_slice(&(reply_len as u32).to_le_bytes());
        Ok(AsyncPingPong { socket, ready, request, rx: vec![0; tiercel::config::MAX_UDP_PAYLOAD], spin, last: 0 })
    }

    /// Forgets that the socket was readable (no system call): the next datagram marks it again.
    fn forget_readiness(&self) {
        if let Some(ready) = &self.ready {
            let _ = ready.try_io(tokio::io::Interest::READABLE, || Err::<(), _>(std::io::ErrorKind::WouldBlock.into()));
        }
    }

    /// Waits until the socket is readable, up to `deadline`: false if it passed.
    async fn readable(&self, deadline: tokio::time::Instant) -> crate::Result<bool> {
        let Some(ready) = &self.ready else { return Err("a spinning caller waits on no reactor".into()) };
        match tokio::time::timeout_at(deadline, ready.readable()).await {
            Ok(readable) => readable.map(|()| true).map_err(crate::Error::from),
            Err(_) => Ok(false),
        }
    }

    /// One round trip; false if the reply did not come within a second (a lost packet).
    pub async fn round_trip(&mut self) -> crate::Result<bool> {
        self.forget_readiness();
        udp::send_gather(&self.socket, &[IoSlice::new(&self.request)]).map_err(crate::Error::from)?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        if !self.spin && !self.readable(deadline).await? {
            return Ok(false);
        }
        let mut looks = 0u32;
        loop {
            // Forgotten before the look, the readiness is set again by a datagram after it: the
            // wait below cannot miss the reply.
            self.forget_readiness();
            if let Received::Datagram(n) = udp::recv_nowait(&self.socket, &mut self.rx).map_err(crate::Error::from)? {
                self.last = n;
                return Ok(true);
            }
            if self.spin {
                core::hint::spin_loop();
                looks = looks.wrapping_add(1);
                if looks.is_multiple_of(64) && tokio::time::Instant::now() > deadline {
                    return Ok(false);
                }
            } else if !self.readable(deadline).await? {
                return Ok(false);
            }
        }
    }
}

/// Callers of the raw UDP echo that share one socket, as the threads of a tiercel binding beyond
/// its first do: the floor beneath tiercel's batched calls. A caller's request waits in the
/// callers' batch while others are waiting for their answers, and goes out, with the batch, at
/// the first look at which every caller waiting has queued one or after 16 looks
/// (one segmented send, UDP GSO); the echo (`raw-echo --gro --runs`) answers a run with one
/// segmented send, each answer starting with its request's caller number; whichever caller looks
/// takes the run whole (UDP GRO) and counts each answer to its caller. Callers yield the CPU
/// between looks, as tiercel's do beside one another. Without the mailboxes' copies and locks of
/// tiercel's: a count per caller.
pub struct Batched {
    socket: UdpSocket,
    batch: std::sync::Mutex<(Vec<u8>, usize)>,
    /// Batches sent so far.
    sent: std::sync::atomic::AtomicU64,
    /// Requests sent in batches of several.
    together: std::sync::atomic::AtomicU64,
    queued: std::sync::atomic::AtomicUsize,
    calling: std::sync::atomic::AtomicUsize,
    answers: Vec<std::sync::atomic::AtomicU32>,
    callers: std::sync::atomic::AtomicU32,
}

/// As tiercel's `GATHER_TURNS`: the most looks a request waits in the batch.
const GATHER_TURNS: u32 = 16;

impl Batched {
    /// At most `callers` callers of the echo at `server`, sharing one socket ([`Batched::caller`]).
    pub fn new(server: SocketAddr, callers: u32) -> crate::Result<std::sync::Arc<Batched>> {
        let socket = udp::connect(server).map_err(crate::Error::from)?;
        if !udp::enable_gro(&socket) {
            return Err("this kernel refuses UDP_GRO".into());
        }
        Ok(std::sync::Arc::new(Batched {
            socket,
            batch: std::sync::Mutex::new((Vec::new(), 0)),
            sent: Default::default(),
            together: Default::default(),
            queued: Default::default(),
            calling: Default::default(),
            answers: (0..callers).map(|_| Default::default()).collect(),
            callers: Default::default(),
        }))
    }

    /// The next caller's round trips: requests of `len` bytes (at least 16) asking for answers as
    /// long.
    pub fn caller(self: &std::sync::Arc<Batched>, len: usize) -> crate::Result<BatchedCaller> {
        use std::sync::atomic::Ordering;
        let me = self.callers.fetch_add(1, Ordering::Relaxed);
        if me as usize >= self.answers.len() || len < 16 {
            return Err("more callers than the batch was made for, or requests too short".into());
        }
        let mut request = vec![0u8; len];
        request[..4].copy_from_slice(&(len as u32).to_le_bytes());
        request[12..16].copy_from_slice(&me.to_le_bytes());
        Ok(BatchedCaller { shared: self.clone(), me, request, rx: vec![0; udp::GRO_BUFFER] })
    }

    /// Sends the batch (one segmented send of several, a send of one), if it is still number `n`.
    fn send(&self, n: u64) {
        use std::sync::atomic::Ordering;
        let mut b = self.batch.lock().unwrap_or_else(|e| e.into_inner());
        if self.sent.load(Ordering::Relaxed) != n || b.1 == 0 {
            return;
        }
        let segment = b.0.len() / b.1;
        let _ = if b.1 > 1 {
            self.together.fetch_add(b.1 as u64, Ordering::Relaxed);
            udp::send_segments(&self.socket, None, &[IoSlice::new(&b.0)], segment)
        } else {
            udp::send_gather(&self.socket, &[IoSlice::new(&b.0)])
        };
        b.0.clear();
        b.1 = 0;
        self.queued.store(0, Ordering::Relaxed);
        self.sent.store(n + 1, Ordering::Release);
    }
}

/// One caller of a [`Batched`] echo.
pub struct BatchedCaller {
    shared: std::sync::Arc<Batched>,
    me: u32,
    request: Vec<u8>,
    rx: Vec<u8>,
}

impl BatchedCaller {
    /// One round trip; false if no answer came within a second.
    pub fn round_trip(&mut self) -> crate::Result<bool> {
        use std::sync::atomic::Ordering;
        let b = &*self.shared;
        let queued = if b.calling.load(Ordering::Relaxed) > 0 {
            let mut batch = b.batch.lock().unwrap_or_else(|e| e.into_inner());
            batch.0.extend_from_slice(&self.request);
            batch.1 += 1;
            b.queued.store(batch.1, Ordering::Relaxed);
            Some(b.sent.load(Ordering::Relaxed))
        } else {
            udp::send_gather(&b.socket, &[IoSlice::new(&self.request)]).map_err(crate::Error::from)?;
            None
        };
        b.calling.fetch_add(1, Ordering::Relaxed);
        let result = wait_batched(b, self.me, queued, &mut self.rx);
        b.calling.fetch_sub(1, Ordering::Relaxed);
        result
    }
}

/// Waits for caller `me`'s answer, sending its queued request (batch `queued`) when the batch is
/// gathered; false if none came within a second.
fn wait_batched(b: &Batched, me: u32, mut queued: Option<u64>, rx: &mut [u8]) -> crate::Result<bool> {
    use std::sync::atomic::Ordering;
    let mine = &b.answers[me as usize];
    let give_up = Instant::now() + Duration::from_secs(1);
    let (mut turns, mut looks) = (0, 0u32);
    loop {
        std::thread::yield_now();
        if let Some(n) = queued {
            let everyone = b.queued.load(Ordering::Relaxed) >= b.calling.load(Ordering::Relaxed);
            if b.sent.load(Ordering::Acquire) != n || everyone || turns >= GATHER_TURNS {
                b.send(n);
                queued = None;
            }
            turns += 1;
        }
        if mine.load(Ordering::Acquire) > 0 {
            mine.fetch_sub(1, Ordering::AcqRel);
            return Ok(true);
        }
        let got = udp::recv_segments_nowait(&b.socket, rx).map_err(crate::Error::from)?;
        if let Received::Datagram(n) = got.received {
            for piece in udp::segments(n, got.segment) {
                let d = &rx[piece];
                if d.len() >= 16 {
                    let to = u32::from_le_bytes([d[12], d[13], d[14], d[15]]);
                    if let Some(count) = b.answers.get(to as usize) {
                        count.fetch_add(1, Ordering::Release);
                    }
                }
            }
            continue;
        }
        looks = looks.wrapping_add(1);
        if looks.is_multiple_of(64) && Instant::now() > give_up {
            if let Some(n) = queued {
                b.send(n);
            }
            return Ok(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo on loopback in a thread of its own (it stops after a minute), and its address.
    fn echo_thread(gro: bool) -> SocketAddr {
        echo_thread_with(gro, false)
    }

    /// [`echo_thread`], draining what queued after each answer (`--drain`) or not.
    fn echo_thread_with(gro: bool, drain: bool) -> SocketAddr {
        let socket = udp::bind("127.0.0.1:0".parse().unwrap(), false).unwrap();
        let addr = socket.local_addr().unwrap();
        let args = EchoArgs { addr, cpu: None, spin: false, max_seconds: 60, stamp: false, gro, drain, runs: false };
        std::thread::spawn(move || serve_echo(&socket, &args));
        addr
    }

    /// A server on loopback that answers each request `late`, and its address.
    fn slow_echo(late: Duration) -> SocketAddr {
        let slow = udp::bind("127.0.0.1:0".parse().unwrap(), false).unwrap();
        let addr = slow.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while let Ok((n, from)) = slow.recv_from(&mut buf) {
                std::thread::sleep(late);
                let _ = slow.send_to(&buf[..n], from);
            }
        });
        addr
    }

    /// A blocking floor waits in receives of [`RECEIVE_WAIT`] each, and that is no bound on a
    /// round trip: a reply that comes many such waits late is taken, and a blocking echo that sat
    /// idle for as long (in `poll`, after its receive waited for nothing) answers the next request.
    #[test]
    fn a_blocking_round_trip_waits_past_its_receives_timeout() {
        let late = Duration::from_millis(40);
        let slow_addr = slow_echo(late);
        let mut ping = PingPong::new(slow_addr, 56, 56, false).unwrap();
        for _ in 0..3 {
            let t = Instant::now();
            assert!(ping.round_trip().unwrap(), "a reply {late:?} late was not waited for");
            assert!(t.elapsed() >= late);
        }
        for drain in [false, true] {
            let mut ping = PingPong::new(echo_thread_with(false, drain), 56, 56, false).unwrap();
            assert!(ping.round_trip().unwrap());
            std::thread::sleep(late);
            assert!(ping.round_trip().unwrap(), "the echo (drain {drain}) did not answer after sitting idle");
        }
    }

    /// A lone spinning caller learns the shortest round trip it has seen, and its first look, three
    /// quarters of that after its send, loses no reply: a round trip that found a shorter one
    /// lowers the floor at once, a longer one raises it by 1/256 of the difference.
    #[test]
    fn a_lone_spinning_caller_looks_first_after_three_quarters_of_its_shortest_round_trip() {
        let late = Duration::from_millis(5);
        let slow_addr = slow_echo(late);
        let mut ping = PingPong::new(slow_addr, 56, 56, true).unwrap();
        assert_eq!(ping.floor_ns, 0);
        let mut longest = Duration::ZERO;
        for _ in 0..4 {
            let t = Instant::now();
            assert!(ping.round_trip().unwrap(), "a reply {late:?} late was lost");
            longest = longest.max(t.elapsed());
            // Each round trip took `late` at least, and the floor is one of them.
            assert!(ping.floor_ns >= late.as_nanos() as u64, "floor {} ns", ping.floor_ns);
            assert!(ping.floor_ns <= longest.as_nanos() as u64, "floor {} ns over {longest:?}", ping.floor_ns);
        }
        // A caller that yields beside others looks at once and learns nothing.
        let mut yielding = PingPong::new(slow_addr, 56, 56, true).unwrap().yielding();
        assert!(yielding.round_trip().unwrap());
        assert_eq!(yielding.floor_ns, 0);

        ping.floor_ns = 0;
        for (seen, floor) in [(10_000, 10_000), (8_000, 8_000), (10_560, 8_010), (1_000, 1_000)] {
            ping.observe(seen);
            assert_eq!(ping.floor_ns, floor, "after a round trip of {seen} ns");
        }
    }

    #[test]
    fn a_message_is_answered_once_all_its_datagrams_have_come_placed_or_not() {
        for gro in [false, true] {
            let mut ping = PingPong::new(echo_thread(gro), 56, 56, false).unwrap();
            let message: Vec<u8> = (0..90_000u32).map(|i| i as u8).collect();
            for segmented in [false, true] {
                // The placed transfer is the shorter, so that an echo that read it as the last
                // one's datagrams would wait for more.
                for (place, message) in [(false, &message[..]), (true, &message[..60_000])] {
                    if place {
                        assert!(ping.place_next().unwrap());
                    }
                    // 1472-byte datagrams (a 56-byte header and 1416 bytes each): 64 of them, two runs, within
                    // a loopback socket's default receive buffer.
                    assert!(
                        ping.transfer_message(message, 56, 1472, segmented).unwrap(),
                        "gro {gro} segmented {segmented} placed {place}"
                    );
                    // One reply per transfer, none for each datagram.
                    assert!(!udp::wait_readable(&ping.socket, Some(Duration::from_millis(20))).unwrap());
                    // A transfer that has ended leaves the echo answering requests as before.
                    assert!(ping.round_trip().unwrap());
                }
            }
            assert!(ping.transfer_segmented(90_000, 1472).unwrap());
        }
    }

    /// Callers sharing one socket send their requests together, and the echo that answers runs as
    /// runs gets each answer back to its caller: every round trip of every caller ends with its
    /// answer, and some went out in runs.
    #[test]
    fn callers_sharing_a_socket_get_their_own_answers_from_an_echo_of_runs() {
        let socket = udp::bind("127.0.0.1:0".parse().unwrap(), false).unwrap();
        let addr = socket.local_addr().unwrap();
        let args = EchoArgs {
            addr,
            cpu: None,
            spin: true,
            max_seconds: 60,
            stamp: false,
            gro: true,
            drain: false,
            runs: true,
        };
        std::thread::spawn(move || serve_echo(&socket, &args));
        let shared = Batched::new(addr, 4).unwrap();
        std::thread::scope(|s| {
            for _ in 0..4 {
                let mut c = shared.caller(56).unwrap();
                s.spawn(move || {
                    for _ in 0..2_000 {
                        assert!(c.round_trip().unwrap(), "an answer lost or handed to another caller");
                    }
                });
            }
        });
        assert!(shared.caller(56).is_err(), "a fifth caller of a batch made for four");
        assert!(shared.together.load(std::sync::atomic::Ordering::Relaxed) > 0, "no requests went out together");
        for a in &shared.answers {
            assert_eq!(a.load(std::sync::atomic::Ordering::Relaxed), 0, "an answer nobody took");
        }
    }

    /// Tasks of one runtime, each with a socket of its own, get their own answers whether they spin
    /// (a lone caller) or wait for the reactor (several), and a lost reply ends a round trip with
    /// false rather than a wait without end.
    #[test]
    fn async_callers_get_their_answers_spinning_or_waiting_for_the_reactor() {
        let addr = echo_thread(false);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let mut lone = AsyncPingPong::new(addr, 56, 100, true).unwrap();
            for _ in 0..200 {
                assert!(lone.round_trip().await.unwrap());
                assert_eq!(lone.last, 100);
                assert_eq!(udp::recv_nowait(&lone.socket, &mut lone.rx).unwrap(), Received::Nothing);
            }
            let mut tasks = tokio::task::JoinSet::new();
            for i in 0..4 {
                tasks.spawn(async move {
                    let mut c = AsyncPingPong::new(addr, 56, 60 + i, false).unwrap();
                    for _ in 0..500 {
                        assert!(c.round_trip().await.unwrap());
                        assert_eq!(c.last, 60 + i, "an answer of another caller's length");
                    }
                });
            }
            while let Some(done) = tasks.join_next().await {
                done.unwrap();
            }
        });
        // Nobody answers at this address: the round trip gives up after its second.
        let silent = udp::bind("127.0.0.1:0".parse().unwrap(), false).unwrap();
        let addr = silent.local_addr().unwrap();
        for spin in [false, true] {
            let ended = rt.block_on(async { AsyncPingPong::new(addr, 56, 56, spin).unwrap().round_trip().await });
            assert!(!ended.unwrap(), "spin {spin}: a round trip without a reply");
        }
    }

    /// A draining echo answers every request that queued behind the one it took, each to its own
    /// sender and of the length it asked for, and callers that yield and look first get them.
    #[test]
    fn a_draining_echo_answers_every_request_that_queued() {
        let addr = echo_thread_with(false, true);
        let mut callers: Vec<PingPong> =
            (0..40).map(|i| PingPong::new(addr, 56, 60 + i, false).unwrap().looking_first()).collect();
        for _ in 0..3 {
            // Forty requests at once: more than a batch queue behind the first.
            for c in &callers {
                udp::send_gather(&c.socket, &[IoSlice::new(&c.request)]).unwrap();
            }
            for (i, c) in callers.iter_mut().enumerate() {
                match udp::recv_wait(&c.socket, &mut c.rx).unwrap() {
                    Received::Datagram(n) => assert_eq!(n, 60 + i, "caller {i}"),
                    other => panic!("caller {i}: {other:?}"),
                }
            }
        }
        // Nothing more came than one answer each; a round trip that yields and looks first ends.
        for c in &mut callers {
            assert_eq!(udp::recv_nowait(&c.socket, &mut c.rx).unwrap(), Received::Nothing);
            assert!(c.round_trip().unwrap());
        }
    }
}
