//! The raw shared-memory ping-pong the benchmark measures tiercel's shared-memory transport against:
//! two processes, one shared page of control words and a data area, no protocol. The client copies
//! the request's bytes in and bumps a request counter; the server sees it, copies the bytes out,
//! copies the reply's bytes in and bumps the response counter; the client sees that and copies the
//! reply out. Waiting is a spin on the counter, or a futex wait (with an unconditional wake on every
//! publish: the plain futex ping-pong).
//!
//! The echo can hand over several regions (`--regions`), each a placement of the same ping-pong on
//! other pages: on a machine where a round trip's time depends on which cache lines it moves and
//! when (on the Intel VMs with `cldemote`, a line bounces up to four times faster at some times than
//! at others, and which lines are fast changed from region to region and from run to run), a floor
//! measured over several placements in interleaved rounds draws its luck as often as tiercel's
//! calls over as many bindings. The client moves from one to another with a request that names the
//! next ([`Connection::place`]).

use std::io::Write;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tiercel_sys::clock::ticks;
use tiercel_sys::shm::{futex_wait, futex_wake, Region};

use crate::raw::Stamps;

// All control words share one cache line, as a tiercel slot's do: the minimal ping-pong moves that
// line each way, plus the data.
const REQUEST: usize = 0;
const REQUEST_LEN: usize = 4;
const REPLY_LEN: usize = 8;
const RESPONSE: usize = 12;
// 1 when the request asks for tiercel's way with the data: the reply written in the request's place
// (as tiercel's results are), and the lines each side wrote (and the echo the request's it read)
// pushed out to the shared cache once published (`cldemote`), as tiercel's client and server do.
const LIKE_TIERCEL: usize = 16;
// Nonzero in a request that moves the echo to another region: that region's index plus one. The
// echo answers it on this region and watches the other from then on.
const MOVE_TO: usize = 20;
// With `--stamp`, the echo's running sum of turnaround ticks and count of turns, each as two u32
// words (low, high), on a cache line of their own, written after each response is published.
const TURN_TICKS: usize = 64;
const TURNS: usize = 72;
const DATA: usize = 4096;
// Each way's area holds the largest message tiercel sends (`tiercel::config::MAX_MESSAGE`) and a
// header; the memfd's pages are only allocated as they are touched.
const AREA: usize = tiercel::config::MAX_MESSAGE + 4096;
const REGION: usize = DATA + 2 * AREA;

/// Options of the `raw-shm-echo` helper role.
#[derive(clap::Args)]
pub struct EchoArgs {
    /// CPU to pin to.
    #[arg(long)]
    cpu: Option<usize>,
    /// Spin on the request counter instead of waiting on its futex.
    #[arg(long)]
    spin: bool,
    /// Exit after this many seconds, whatever happens.
    #[arg(long, default_value_t = 900)]
    max_seconds: u64,
    /// Time each turnaround (request seen → response published) and publish the running sum
    /// (for `tiercel explain`).
    #[arg(long)]
    stamp: bool,
    /// Regions to hand over, each a placement of the ping-pong on other pages (at most 16).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=16))]
    regions: u8,
}

fn store_u64(region: &Region, at: usize, v: u64) {
    word(region, at).store(v as u32, Ordering::Relaxed);
    word(region, at + 4).store((v >> 32) as u32, Ordering::Relaxed);
}

fn load_u64(region: &Region, at: usize) -> u64 {
    word(region, at).load(Ordering::Relaxed) as u64 | (word(region, at + 4).load(Ordering::Relaxed) as u64) << 32
}

fn word(region: &Region, at: usize) -> &AtomicU32 {
    region.u32_at(at).unwrap_or_else(|| unreachable!("fixed offset {at} inside the region"))
}

/// Serves one client: prints the abstract socket name, hands the region over, echoes until the client
/// goes away.
pub fn echo(args: EchoArgs) -> crate::Result<()> {
    if let Some(cpu) = args.cpu {
        tiercel_sys::cpu::pin_current_thread(cpu).map_err(crate::Error::from)?;
    }
    let name = format!("tiercel-raw-shm/{}", std::process::id());
    let listener = UnixAddr::from_abstract_name(name.as_bytes())
        .and_then(|a| UnixListener::bind_addr(&a))
        .map_err(crate::Error::from)?;
    println!("listening {name}");
    let _ = std::io::stdout().flush();
    serve_echo(&listener, &args)
}

/// Serves the first client of `listener` until it goes away or `args.max_seconds` have passed.
fn serve_echo(listener: &UnixListener, args: &EchoArgs) -> crate::Result<()> {
    let (stream, _) = listener.accept().map_err(crate::Error::from)?;
    // Each region goes with a byte saying how many there are.
    let mut regions = Vec::with_capacity(usize::from(args.regions));
    for _ in 0..args.regions {
        let region = Region::create("tiercel-raw-shm", REGION).map_err(crate::Error::from)?;
        tiercel_sys::shm::send_with_fd(&stream, &[args.regions], Some(region.fd())).map_err(crate::Error::from)?;
        regions.push(region);
    }
    let mut scratch = vec![0u8; AREA];
    let reply = vec![0x5au8; AREA];
    let end = Instant::now() + Duration::from_secs(args.max_seconds);
    let mut checks = 0u32;
    let mut idle_since = Instant::now();
    let (mut turn_ticks, mut turns) = (0u64, 0u64);
    // The region watched, and the last request seen in each.
    let mut active = 0usize;
    let mut last_seen = vec![0u32; regions.len()];
    loop {
        let region = &regions[active];
        let (request, response) = (word(region, REQUEST), word(region, RESPONSE));
        let mut seen = last_seen[active];
        loop {
            let now = request.load(Ordering::Acquire);
            if now == seen {
                checks = checks.wrapping_add(1);
                if checks.is_multiple_of(65_536) && (Instant::now() > end || tiercel_sys::shm::peer_closed(&stream)) {
                    return Ok(());
                }
                if checks == 4096 {
                    idle_since = Instant::now();
                }
                // Spin while requests come; after 2 ms without one (the benchmark measuring the other
                // side), nap in 200 µs futex waits so as not to take the CPU from the server measured
                // next (the client does not wake a spinning echo: the first request after a pause may
                // wait out a nap).
                let napping = checks > 4096 && idle_since.elapsed() > crate::raw::SPIN_WHILE_IDLE;
                if args.spin && !napping {
                    core::hint::spin_loop();
                } else if args.spin {
                    futex_wait(request, seen, Some(Duration::from_micros(200)));
                } else {
                    futex_wait(request, seen, Some(Duration::from_millis(100)));
                    // Whether the client is gone is asked only of a wait that brought no request
                    // (its timeout): a look at the socket on every wake-up was a system call on
                    // the round trip's path that tiercel's server does not make, and tiercel's
                    // blocking Null came out under this floor (0.906x in three runs of three).
                    if request.load(Ordering::Acquire) == seen && tiercel_sys::shm::peer_closed(&stream) {
                        return Ok(());
                    }
                }
                continue;
            }
            let s0 = if args.stamp { ticks() } else { 0 };
            seen = now;
            checks = 0;
            let move_to = word(region, MOVE_TO).load(Ordering::Relaxed) as usize;
            if move_to != 0 {
                word(region, MOVE_TO).store(0, Ordering::Relaxed);
                response.store(seen, Ordering::Release);
                if !args.spin {
                    futex_wake(response, 1);
                }
                last_seen[active] = seen;
                active = (move_to - 1).min(regions.len() - 1);
                break;
            }
            let n = (word(region, REQUEST_LEN).load(Ordering::Relaxed) as usize).min(AREA);
            let r = (word(region, REPLY_LEN).load(Ordering::Relaxed) as usize).min(AREA);
            let like_tiercel = word(region, LIKE_TIERCEL).load(Ordering::Relaxed) == 1;
            let reply_at = if like_tiercel { DATA } else { DATA + AREA };
            region.read(DATA, &mut scratch[..n]);
            // The copy is what a server's work on the request begins with; nothing reads `scratch`
            // after it, and without this the compiler left the copy out: the floor of a call with
            // arguments then moved none of them (BigIn's floor took Null's time).
            std::hint::black_box(&mut scratch[..n]);
            region.write(reply_at, &reply[..r]);
            response.store(seen, Ordering::Release);
            if like_tiercel {
                // As tiercel's server publishes: the fence drains the response's store out of the
                // store buffer before the line is pushed out, which a `cldemote` issued while the
                // store was still pending did not do (in a scratch run, a Null's round trip took
                // 32-36 ns with the fence in 4 regions of 6, where without it nearly every region
                // took 110-150).
                std::sync::atomic::fence(Ordering::SeqCst);
                region.demote(REQUEST, 4);
                // The reply's lines, and the request's this side read (the reply is in their
                // place), as tiercel's server pushes out its result's and its arguments'.
                region.demote(reply_at, r.max(n));
            }
            if !args.spin {
                futex_wake(response, 1);
            }
            if args.stamp {
                turn_ticks += ticks().wrapping_sub(s0);
                turns += 1;
                store_u64(region, TURN_TICKS, turn_ticks);
                store_u64(region, TURNS, turns);
            }
        }
    }
}

/// A connection to a `raw-shm-echo`, shared by the ping-pongs of several sizes.
pub struct Connection {
    /// The regions the echo handed over, the one in use, and each one's last request.
    regions: Vec<Region>,
    active: usize,
    seqs: Vec<u32>,
    _stream: UnixStream,
}

impl Connection {
    /// Connects to a `raw-shm-echo` listening on `name` and maps its regions.
    pub fn new(name: &str) -> crate::Result<std::rc::Rc<std::cell::RefCell<Connection>>> {
        let stream = UnixAddr::from_abstract_name(name.as_bytes())
            .and_then(|a| UnixStream::connect_addr(&a))
            .map_err(|e| format!("connecting to {name}: {e}"))?;
        let mut regions = Vec::new();
        loop {
            let mut count = [0u8; 1];
            let (_, fd) = tiercel_sys::shm::recv_with_fd(&stream, &mut count).map_err(crate::Error::from)?;
            regions.push(Region::from_fd(fd.ok_or("no region received")?, REGION).map_err(crate::Error::from)?);
            if regions.len() >= usize::from(count[0]) {
                break;
            }
        }
        let seqs = vec![0; regions.len()];
        Ok(std::rc::Rc::new(std::cell::RefCell::new(Connection { regions, active: 0, seqs, _stream: stream })))
    }

    /// How many regions the echo handed over.
    pub fn placements(&self) -> usize {
        self.regions.len()
    }

    /// Moves the ping-pongs to region `to` (of [`Connection::placements`]), telling the echo to
    /// watch it from now on.
    pub fn place(&mut self, to: usize, spin: bool) -> crate::Result<()> {
        if to >= self.regions.len() {
            return Err(format!("no placement {to}: the echo handed over {}", self.regions.len()).into());
        }
        if to == self.active {
            return Ok(());
        }
        let r = &self.regions[self.active];
        word(r, MOVE_TO).store(to as u32 + 1, Ordering::Relaxed);
        let seq = self.seqs[self.active].wrapping_add(1);
        self.seqs[self.active] = seq;
        word(r, REQUEST).store(seq, Ordering::Release);
        if !spin {
            futex_wake(word(r, REQUEST), 1);
        }
        wait_response(r, seq, spin)?;
        self.active = to;
        Ok(())
    }
}

/// Waits for the response to request `seq` on `r`.
#[inline]
fn wait_response(r: &Region, seq: u32, spin: bool) -> crate::Result<()> {
    let response = word(r, RESPONSE);
    // The clock is read for the first time after 1024 checks, and every 1024 after: a round trip
    // that needs none reads none (tiercel's quick calls read it on one in eight).
    let mut start: Option<Instant> = None;
    let mut checks = 0u32;
    loop {
        let now = response.load(Ordering::Acquire);
        if now == seq {
            return Ok(());
        }
        // The clock only every 1024 checks: the reply is noticed within a load, as tiercel's is.
        checks = checks.wrapping_add(1);
        if checks.is_multiple_of(1024) && start.get_or_insert_with(Instant::now).elapsed() > Duration::from_secs(10) {
            return Err("raw shared-memory echo stopped answering".into());
        }
        if spin {
            core::hint::spin_loop();
        } else {
            futex_wait(response, now, Some(Duration::from_millis(100)));
        }
    }
}

/// The client side of a raw shared-memory ping-pong of given sizes.
pub struct ShmPingPong {
    conn: std::rc::Rc<std::cell::RefCell<Connection>>,
    request: Vec<u8>,
    reply: Vec<u8>,
    spin: bool,
    /// The ping-pong moves its data as tiercel does (see [`ShmPingPong::like_tiercel`]).
    like_tiercel: bool,
    /// With `Some`, each round trip is split into its steps (for `tiercel explain`).
    pub stamps: Option<Stamps>,
}

impl ShmPingPong {
    /// A ping-pong of `request_len` bytes one way and `reply_len` the other over `conn`.
    pub fn new(
        conn: &std::rc::Rc<std::cell::RefCell<Connection>>,
        request_len: usize,
        reply_len: usize,
        spin: bool,
    ) -> ShmPingPong {
        ShmPingPong {
            conn: conn.clone(),
            request: vec![1; request_len.min(AREA)],
            reply: vec![0; reply_len.min(AREA)],
            spin,
            like_tiercel: false,
            stamps: None,
        }
    }

    /// The same ping-pong the way tiercel moves its data: the reply written where the request was
    /// (as tiercel's results are), and both sides pushing the lines they wrote (the echo those of
    /// the request it read as well) out of their core's caches once published (`cldemote`), as
    /// tiercel's client and server do. The floor tiercel's calls are measured against is the
    /// faster of the two, row by row (see `latency.rs`).
    pub fn like_tiercel(mut self) -> ShmPingPong {
        self.like_tiercel = true;
        self
    }

    /// One round trip; always true (nothing is lost in memory).
    pub fn round_trip(&mut self) -> crate::Result<bool> {
        let mut conn = self.conn.borrow_mut();
        let active = conn.active;
        conn.seqs[active] = conn.seqs[active].wrapping_add(1);
        let seq = conn.seqs[active];
        let r = &conn.regions[active];
        let t0 = if self.stamps.is_some() { ticks() } else { 0 };
        r.write(DATA, &self.request);
        word(r, REQUEST_LEN).store(self.request.len() as u32, Ordering::Relaxed);
        word(r, REPLY_LEN).store(self.reply.len() as u32, Ordering::Relaxed);
        word(r, LIKE_TIERCEL).store(u32::from(self.like_tiercel), Ordering::Relaxed);
        let request = word(r, REQUEST);
        request.store(seq, Ordering::Release);
        if self.like_tiercel {
            r.demote(REQUEST, 4);
            r.demote(DATA, self.request.len());
        }
        if !self.spin {
            futex_wake(request, 1);
        }
        let t1 = if self.stamps.is_some() { ticks() } else { 0 };
        wait_response(r, seq, self.spin)?;
        if let Some(s) = &mut self.stamps {
            s.send += t1 - t0;
            s.wait += ticks() - t1;
            s.round_trips += 1;
            s.echo_turnaround = load_u64(r, TURN_TICKS);
            s.echo_turns = load_u64(r, TURNS);
        }
        r.read(if self.like_tiercel { DATA } else { DATA + AREA }, &mut self.reply);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_placement_is_a_region_of_its_own_and_the_echo_follows_the_client_there() {
        let name = format!("tiercel-raw-shm-test/{}", std::process::id());
        let listener = UnixAddr::from_abstract_name(name.as_bytes()).and_then(|a| UnixListener::bind_addr(&a)).unwrap();
        let args = EchoArgs { cpu: None, spin: false, max_seconds: 60, stamp: false, regions: 3 };
        std::thread::spawn(move || serve_echo(&listener, &args));
        let conn = Connection::new(&name).unwrap();
        assert_eq!(conn.borrow().placements(), 3);
        let mut plain = ShmPingPong::new(&conn, 204, 100, false);
        let mut in_place = ShmPingPong::new(&conn, 204, 300, false).like_tiercel();
        let mut expected = [0u32; 3];
        assert!(conn.borrow_mut().place(3, false).is_err(), "only three placements");
        for p in [0, 2, 1, 2, 0] {
            conn.borrow_mut().place(p, false).unwrap();
            for ping in [&mut plain, &mut in_place] {
                ping.reply.fill(0);
                assert!(ping.round_trip().unwrap());
                assert!(ping.reply.iter().all(|&b| b == 0x5a), "placement {p}: the reply's bytes came back");
            }
            // Two round trips here; a move away from a region is one more there.
            expected[p] += 2;
            let c = conn.borrow();
            for (i, region) in c.regions.iter().enumerate() {
                assert_eq!(word(region, REQUEST).load(Ordering::Acquire), expected[i], "after placement {p}");
                assert_eq!(word(region, RESPONSE).load(Ordering::Acquire), expected[i], "answered in region {i}");
            }
            expected[p] += 1;
        }
    }
}
