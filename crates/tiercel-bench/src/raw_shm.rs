//! The raw shared-memory ping-pong the benchmark measures tiercel's shared-memory transport against:
//! two processes, one shared page of control words and a data area, no protocol. The client copies
//! the request's bytes in and bumps a request counter; the server sees it, copies the bytes out,
//! copies the reply's bytes in and bumps the response counter; the client sees that and copies the
//! reply out. Waiting is a spin on the counter, or a futex wait (with an unconditional wake on every
//! publish: the plain futex ping-pong).

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
// (as tiercel's results are), and the lines each side wrote pushed out to the shared cache once
// published (`cldemote`), as tiercel's client and server do.
const LIKE_TIERCEL: usize = 16;
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
    let (stream, _) = listener.accept().map_err(crate::Error::from)?;
    let region = Region::create("tiercel-raw-shm", REGION).map_err(crate::Error::from)?;
    tiercel_sys::shm::send_with_fd(&stream, b"r", Some(region.fd())).map_err(crate::Error::from)?;
    let (request, response) = (word(&region, REQUEST), word(&region, RESPONSE));
    let mut scratch = vec![0u8; AREA];
    let reply = vec![0x5au8; AREA];
    let end = Instant::now() + Duration::from_secs(args.max_seconds);
    let mut seen = 0u32;
    let mut checks = 0u32;
    let mut idle_since = Instant::now();
    let (mut turn_ticks, mut turns) = (0u64, 0u64);
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
                if tiercel_sys::shm::peer_closed(&stream) {
                    return Ok(());
                }
            }
            continue;
        }
        let s0 = if args.stamp { ticks() } else { 0 };
        seen = now;
        checks = 0;
        let n = (word(&region, REQUEST_LEN).load(Ordering::Relaxed) as usize).min(AREA);
        let r = (word(&region, REPLY_LEN).load(Ordering::Relaxed) as usize).min(AREA);
        let like_tiercel = word(&region, LIKE_TIERCEL).load(Ordering::Relaxed) == 1;
        let reply_at = if like_tiercel { DATA } else { DATA + AREA };
        region.read(DATA, &mut scratch[..n]);
        region.write(reply_at, &reply[..r]);
        response.store(seen, Ordering::Release);
        if like_tiercel {
            region.demote(REQUEST, 4);
            region.demote(reply_at, r);
        }
        if !args.spin {
            futex_wake(response, 1);
        }
        if args.stamp {
            turn_ticks += ticks().wrapping_sub(s0);
            turns += 1;
            store_u64(&region, TURN_TICKS, turn_ticks);
            store_u64(&region, TURNS, turns);
        }
    }
}

/// A connection to a `raw-shm-echo`, shared by the ping-pongs of several sizes.
pub struct Connection {
    region: Region,
    _stream: UnixStream,
    seq: u32,
}

impl Connection {
    /// Connects to a `raw-shm-echo` listening on `name` and maps its region.
    pub fn new(name: &str) -> crate::Result<std::rc::Rc<std::cell::RefCell<Connection>>> {
        let stream = UnixAddr::from_abstract_name(name.as_bytes())
            .and_then(|a| UnixStream::connect_addr(&a))
            .map_err(|e| format!("connecting to {name}: {e}"))?;
        let mut b = [0u8; 1];
        let (_, fd) = tiercel_sys::shm::recv_with_fd(&stream, &mut b).map_err(crate::Error::from)?;
        let region = Region::from_fd(fd.ok_or("no region received")?, REGION).map_err(crate::Error::from)?;
        Ok(std::rc::Rc::new(std::cell::RefCell::new(Connection { region, _stream: stream, seq: 0 })))
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
    /// (as tiercel's results are), and both sides pushing the lines they wrote out of their core's
    /// caches once published (`cldemote`), as tiercel's client and server do. The floor tiercel's
    /// calls are measured against is the faster of the two, row by row (see `latency.rs`).
    pub fn like_tiercel(mut self) -> ShmPingPong {
        self.like_tiercel = true;
        self
    }

    /// One round trip; always true (nothing is lost in memory).
    pub fn round_trip(&mut self) -> crate::Result<bool> {
        let mut conn = self.conn.borrow_mut();
        conn.seq = conn.seq.wrapping_add(1);
        let seq = conn.seq;
        let r = &conn.region;
        let t0 = if self.stamps.is_some() { ticks() } else { 0 };
        r.write(DATA, &self.request);
        word(r, REQUEST_LEN).store(self.request.len() as u32, Ordering::Relaxed);
        word(r, REPLY_LEN).store(self.reply.len() as u32, Ordering::Relaxed);
        word(r, LIKE_TIERCEL).store(u32::from(self.like_tiercel), Ordering::Relaxed);
        let (request, response) = (word(r, REQUEST), word(r, RESPONSE));
        request.store(seq, Ordering::Release);
        if self.like_tiercel {
            r.demote(REQUEST, 4);
            r.demote(DATA, self.request.len());
        }
        if !self.spin {
            futex_wake(request, 1);
        }
        let t1 = if self.stamps.is_some() { ticks() } else { 0 };
        // The clock is read for the first time after 1024 checks, and every 1024 after: a round trip
        // that needs none reads none (tiercel's quick calls read it on one in eight).
        let mut start: Option<Instant> = None;
        let mut checks = 0u32;
        loop {
            let now = response.load(Ordering::Acquire);
            if now == seq {
                break;
            }
            // The clock only every 1024 checks: the reply is noticed within a load, as tiercel's is.
            checks = checks.wrapping_add(1);
            if checks.is_multiple_of(1024) && start.get_or_insert_with(Instant::now).elapsed() > Duration::from_secs(10)
            {
                return Err("raw shared-memory echo stopped answering".into());
            }
            if self.spin {
                core::hint::spin_loop();
            } else {
                futex_wait(response, now, Some(Duration::from_millis(100)));
            }
        }
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
