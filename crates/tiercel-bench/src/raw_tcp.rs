//! The raw TCP ping-pong among the benchmark's baselines: one loopback connection with `TCP_NODELAY`,
//! a request of an 8-byte header (reply length, request length) and its payload, a reply of the
//! asked length (up to 16 MiB and a little more, for the large calls of Peregrine's Table 5); both
//! sides busy-poll non-blocking reads, or block in them. A spinning echo server
//! blocks after 2 ms without a request (as the raw UDP one does), leaving the CPU to the server
//! measured next; it serves each connection on a thread of its own.

use crate::raw::{POLL_WAIT, RECEIVE_WAIT};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Largest request or reply: tiercel's largest message and room for a header.
const MAX: usize = (16 << 20) + 1024;

/// Options of the `raw-tcp-echo` helper role.
#[derive(clap::Args)]
pub struct EchoArgs {
    /// CPU to pin to.
    #[arg(long)]
    cpu: Option<usize>,
    /// Busy-poll non-blocking reads instead of blocking in them.
    #[arg(long)]
    spin: bool,
    /// Serve each connection as one shared by several callers (blocking, as `SharedTcp`'s do):
    /// take every request that has come with one read, and answer them all with one write, each
    /// answer starting with its request's first four payload bytes (its caller) and its length.
    #[arg(long, conflicts_with = "spin")]
    shared: bool,
}

/// Reads exactly `buf.len()` bytes; false if the peer closed first or (with `patience`) nothing
/// came for that long. Spinning, it blocks after [`crate::raw::SPIN_WHILE_IDLE`] without a byte.
/// Blocking, on a stream whose reads wait [`RECEIVE_WAIT`] at most ([`wait_in_receive`]), it waits
/// in `poll` after a read that waited for nothing, as tiercel's connection threads do.
fn read_full(stream: &mut TcpStream, buf: &mut [u8], spin: bool, patience: Option<Duration>) -> std::io::Result<bool> {
    let mut at = 0;
    let mut polls = 0u32;
    let mut since = None;
    while at < buf.len() {
        match stream.read(&mut buf[at..]) {
            Ok(0) => return Ok(false),
            Ok(n) => {
                at += n;
                (polls, since) = (0, None);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock && spin => {
                polls = polls.wrapping_add(1);
                if polls.is_multiple_of(4096) {
                    let idle = since.get_or_insert_with(Instant::now).elapsed();
                    if patience.is_some_and(|p| idle > p) {
                        return Ok(false);
                    }
                    if idle > crate::raw::SPIN_WHILE_IDLE {
                        let _ = tiercel_sys::udp::wait_readable_fd(&*stream, Some(Duration::from_millis(100)));
                        continue;
                    }
                }
                core::hint::spin_loop();
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if patience.is_some_and(|p| since.get_or_insert_with(Instant::now).elapsed() > p) {
                    return Ok(false);
                }
                let _ = tiercel_sys::udp::wait_readable_fd(&*stream, Some(POLL_WAIT));
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// How long a blocking raw TCP caller waits for its answer before it gives up.
const SILENCE: Duration = Duration::from_secs(10);

/// Makes the blocking reads of `stream` wait [`RECEIVE_WAIT`] at most, as those of tiercel's
/// connections do (see [`RECEIVE_WAIT`] for why a floor must wait with the same timer).
fn wait_in_receive(stream: &TcpStream) -> std::io::Result<()> {
    stream.set_read_timeout(Some(RECEIVE_WAIT))
}

fn write_all(stream: &mut TcpStream, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        match stream.write(buf) {
            Ok(n) => buf = &buf[n..],
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => core::hint::spin_loop(),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Serves connections, each on its own thread until its client closes it, until killed.
pub fn echo(args: EchoArgs) -> crate::Result<()> {
    if let Some(cpu) = args.cpu {
        tiercel_sys::cpu::pin_current_thread(cpu).map_err(crate::Error::from)?;
    }
    let listener = TcpListener::bind("127.0.0.1:0").map_err(crate::Error::from)?;
    println!("listening tcp://{}", listener.local_addr().map_err(crate::Error::from)?);
    let _ = std::io::stdout().flush();
    loop {
        let (stream, _) = listener.accept().map_err(crate::Error::from)?;
        let (spin, shared, cpu) = (args.spin, args.shared, args.cpu);
        std::thread::spawn(move || {
            if let Some(cpu) = cpu {
                let _ = tiercel_sys::cpu::pin_current_thread(cpu);
            }
            let _ = if shared { serve_shared(stream) } else { serve_connection(stream, spin) };
        });
    }
}

fn serve_connection(mut stream: TcpStream, spin: bool) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_nonblocking(spin)?;
    if !spin {
        wait_in_receive(&stream)?;
    }
    // Grown to the largest request and reply seen, before the timed round trips.
    let (mut reply, mut request) = (Vec::new(), Vec::new());
    let mut header = [0u8; 8];
    loop {
        if !read_full(&mut stream, &mut header, spin, None)? {
            return Ok(());
        }
        let want = (u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize).min(MAX);
        let len = (u32::from_le_bytes([header[4], header[5], header[6], header[7]]) as usize).min(MAX);
        if reply.len() < want {
            reply.resize(want, 0x5a);
        }
        if request.len() < len {
            request.resize(len, 0);
        }
        if !read_full(&mut stream, &mut request[..len], spin, None)? {
            return Ok(());
        }
        write_all(&mut stream, &reply[..want])?;
    }
}

/// Serves a connection that several callers share ([`SharedTcp`]), blocking in its reads: each read
/// takes whatever has come, and the answers to every whole request in it go back with one write,
/// each of the length its request asks for (at least [`SHARED_HEAD`]), starting with its request's
/// first four payload bytes and its own length.
fn serve_shared(mut stream: TcpStream) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    wait_in_receive(&stream)?;
    let (mut input, mut held) = (vec![0u8; 64 << 10], 0);
    let mut out = Vec::new();
    loop {
        let n = match stream.read(&mut input[held..]) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                let _ = tiercel_sys::udp::wait_readable_fd(&stream, Some(POLL_WAIT));
                continue;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        held += n;
        let mut at = 0;
        while held - at >= 8 {
            let word = |i: usize| u32::from_le_bytes([input[i], input[i + 1], input[i + 2], input[i + 3]]) as usize;
            let (want, len) = (word(at).clamp(SHARED_HEAD, MAX), word(at + 4).min(MAX));
            if held - at < 8 + len {
                if input.len() < 8 + len {
                    // A request larger than the buffer: room for all of it.
                    input.resize(8 + len, 0);
                }
                break;
            }
            let mut tag = [0u8; 4];
            let payload = &input[at + 8..at + 8 + len];
            tag[..len.min(4)].copy_from_slice(&payload[..len.min(4)]);
            out.extend_from_slice(&tag);
            out.extend_from_slice(&(want as u32).to_le_bytes());
            out.resize(out.len() + want - SHARED_HEAD, 0x5a);
            at += 8 + len;
        }
        input.copy_within(at..held, 0);
        held -= at;
        if !out.is_empty() {
            write_all(&mut stream, &out)?;
            out.clear();
        }
    }
}

/// An answer on a shared connection starts with its caller (four bytes) and its length (four).
pub const SHARED_HEAD: usize = 8;

/// Callers that share one blocking TCP connection to `raw-tcp-echo --shared`, as the threads of a
/// tiercel TCP binding share its connection: the floor beneath several of them. A caller writes
/// its request (under a lock), then either reads the connection, if nobody is, until its own answer
/// has come, handing each other answer to its caller and waking it, and then wakes a caller still
/// waiting to read next; or parks (`std::thread::park`, as tiercel's callers do: a wake-up costs a
/// system call only when its caller sleeps) until its answer or its turn to read comes. As
/// tiercel's demultiplexer does, without its mailboxes' copies: an answer's bytes are
/// only counted. Beside other callers, a caller takes turns before it sleeps or blocks in its
/// read, as tiercel's blocking callers do (`SharedTcp::take_turn`): the first before its first
/// look (the answer to a request just written is not back yet), after which it reads at once if
/// nobody is reading; a caller alone blocks at once. (Taking the reading first and yielding with
/// it, as it did before, it made the others that looked meanwhile yield again: 1.5 yields a call
/// at four callers against tiercel's 1.0, and no more calls a second than tiercel's callers.)
pub struct SharedTcp {
    writer: std::sync::Mutex<TcpStream>,
    /// The connection's reading side and what it read that no answer has used yet.
    reader: std::sync::Mutex<(TcpStream, Vec<u8>, usize)>,
    turns: std::sync::Mutex<Turns>,
    /// Each caller's thread, once it has waited: unparked when its answer came or its turn to read
    /// did.
    threads: Vec<std::sync::OnceLock<std::thread::Thread>>,
    callers: std::sync::atomic::AtomicU32,
    /// Callers between their request and their answer ([`SharedTcp::take_turn`]).
    in_flight: std::sync::atomic::AtomicU32,
}

/// Who reads the connection, and whose answers came or who waits, a bit per caller.
#[derive(Default)]
struct Turns {
    reading: bool,
    answered: u64,
    waiting: u64,
}

/// One caller of a [`SharedTcp`].
pub struct SharedTcpCaller {
    shared: std::sync::Arc<SharedTcp>,
    me: u32,
    request: Vec<u8>,
}

impl SharedTcp {
    /// A connection to the shared echo at `server` for up to `callers` callers (at most 64).
    pub fn new(server: SocketAddr, callers: u32) -> crate::Result<std::sync::Arc<SharedTcp>> {
        if callers > 64 {
            return Err(format!("{callers} callers share a raw TCP connection: at most 64").into());
        }
        let stream = TcpStream::connect(server).map_err(|e| format!("connecting to {server}: {e}"))?;
        stream.set_nodelay(true).map_err(crate::Error::from)?;
        wait_in_receive(&stream).map_err(crate::Error::from)?;
        let reading = stream.try_clone().map_err(crate::Error::from)?;
        Ok(std::sync::Arc::new(SharedTcp {
            writer: std::sync::Mutex::new(stream),
            reader: std::sync::Mutex::new((reading, vec![0; 64 << 10], 0)),
            turns: std::sync::Mutex::new(Turns::default()),
            threads: (0..callers).map(|_| std::sync::OnceLock::new()).collect(),
            callers: std::sync::atomic::AtomicU32::new(0),
            in_flight: std::sync::atomic::AtomicU32::new(0),
        }))
    }

    /// The next of its callers.
    pub fn caller(self: &std::sync::Arc<SharedTcp>) -> crate::Result<SharedTcpCaller> {
        let me = self.callers.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if me as usize >= self.threads.len() {
            return Err(format!("a shared raw TCP connection made for {} callers", self.threads.len()).into());
        }
        Ok(SharedTcpCaller { shared: self.clone(), me, request: Vec::new() })
    }

    fn turns(&self) -> std::sync::MutexGuard<'_, Turns> {
        self.turns.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes caller `to`, or has its next park return at once.
    fn wake(&self, to: u32) {
        if let Some(thread) = self.threads[to as usize].get() {
            thread.unpark();
        }
    }

    /// A turn before the next look of a caller that would block, as tiercel's blocking callers take
    /// them (`tiercel::waiting::spin::WAIT_TURNS`): while another caller is between its request
    /// and its answer too, and this one has taken fewer than [`crate::raw::LOOK_TURNS`], it yields
    /// the CPU (`sched_yield`, so that the others send their requests or take their answers) and
    /// counts the turn. False when it should block. A caller alone never yields.
    fn take_turn(&self, turns: &mut u32) -> bool {
        let turn = *turns < crate::raw::LOOK_TURNS && self.in_flight.load(std::sync::atomic::Ordering::Relaxed) > 1;
        if turn {
            std::thread::yield_now();
            *turns += 1;
        }
        turn
    }

    /// Reads the connection until caller `me`'s answer has come, handing the others' to them.
    /// Beside other callers, a read after the first takes its turns ([`SharedTcp::take_turn`]),
    /// each a yield and a receive that does not block (one system call), and then blocks in the
    /// read; the first is a receive that does not block when the caller took a turn before it
    /// looked, else a turn too.
    fn read_until(&self, me: u32, turns: &mut u32) -> crate::Result<()> {
        let mut reader = self.reader.lock().unwrap_or_else(|e| e.into_inner());
        let (stream, input, held) = &mut *reader;
        // A caller that took its turn before it looked reads at once.
        let mut looked = *turns == 0;
        // Since when its reads have waited for nothing.
        let mut silent: Option<Instant> = None;
        loop {
            let read = if !std::mem::replace(&mut looked, true) || self.take_turn(turns) {
                match tiercel_sys::udp::read_stream_nowait(&*stream, &mut input[*held..]) {
                    Ok(Some(n)) => Ok(n),
                    Ok(None) => continue,
                    Err(e) => Err(e),
                }
            } else {
                stream.read(&mut input[*held..])
            };
            let n = match read {
                Ok(0) => return Err("the shared raw TCP echo closed the connection".into()),
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    // The read waited its `RECEIVE_WAIT` for nothing: `poll`, as tiercel's reader.
                    if silent.get_or_insert_with(Instant::now).elapsed() > SILENCE {
                        return Err(format!("no answer on the shared raw TCP connection for {SILENCE:?}").into());
                    }
                    let _ = tiercel_sys::udp::wait_readable_fd(&*stream, Some(POLL_WAIT));
                    continue;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("the shared raw TCP echo: {e}").into()),
            };
            *held += n;
            silent = None;
            let (mut at, mut mine, mut woken) = (0, false, 0u64);
            while *held - at >= SHARED_HEAD {
                let word = |i: usize| u32::from_le_bytes([input[i], input[i + 1], input[i + 2], input[i + 3]]);
                let (to, len) = (word(at), (word(at + 4) as usize).clamp(SHARED_HEAD, MAX));
                if *held - at < len {
                    if input.len() < len {
                        input.resize(len, 0);
                    }
                    break;
                }
                at += len;
                if to == me {
                    mine = true;
                } else if (to as usize) < self.threads.len() {
                    woken |= 1 << to;
                }
            }
            input.copy_within(at..*held, 0);
            *held -= at;
            if woken != 0 {
                let asleep = {
                    let mut t = self.turns();
                    t.answered |= woken;
                    woken & t.waiting
                };
                for to in (0..64).filter(|i| asleep & (1 << i) != 0) {
                    self.wake(to);
                }
            }
            if mine {
                return Ok(());
            }
        }
    }
}

impl SharedTcpCaller {
    /// One round trip of `request_len` payload bytes out (its first four this caller's number) and
    /// `reply_len` back (at least [`SHARED_HEAD`]).
    pub fn round_trip_of(&mut self, request_len: usize, reply_len: usize) -> crate::Result<bool> {
        use std::sync::atomic::Ordering;
        let s = &*self.shared;
        let (request_len, reply_len) = (request_len.clamp(4, MAX), reply_len.clamp(SHARED_HEAD, MAX));
        self.request.resize(8 + request_len, 0);
        self.request[..4].copy_from_slice(&(reply_len as u32).to_le_bytes());
        self.request[4..8].copy_from_slice(&(request_len as u32).to_le_bytes());
        self.request[8..12].copy_from_slice(&self.me.to_le_bytes());
        let bit = 1u64 << self.me;
        write_all(&mut s.writer.lock().unwrap_or_else(|e| e.into_inner()), &self.request)
            .map_err(crate::Error::from)?;
        s.in_flight.fetch_add(1, Ordering::Relaxed);
        let answered = self.wait_for_answer(bit);
        s.in_flight.fetch_sub(1, Ordering::Relaxed);
        answered
    }

    /// Waits for this caller's answer, reading the connection when nobody is; beside other callers,
    /// it takes its turns before it parks or blocks in its read.
    fn wait_for_answer(&self, bit: u64) -> crate::Result<bool> {
        let s = &*self.shared;
        s.threads[self.me as usize].get_or_init(std::thread::current);
        // Since when it has slept without its answer.
        let (mut asleep, mut turns) = (None::<Instant>, 0);
        // The answer to a request just written is not back yet: beside other callers, a turn
        // first, as tiercel's blocking callers take one before their first look.
        s.take_turn(&mut turns);
        loop {
            let mut t = s.turns();
            if t.answered & bit != 0 {
                t.answered &= !bit;
                t.waiting &= !bit;
                return Ok(true);
            }
            if !t.reading {
                t.reading = true;
                t.waiting &= !bit;
                drop(t);
                let read = s.read_until(self.me, &mut turns);
                let heir = {
                    let mut t = s.turns();
                    t.reading = false;
                    let still = t.waiting & !t.answered;
                    (still != 0).then(|| still.trailing_zeros())
                };
                if let Some(heir) = heir {
                    s.wake(heir);
                }
                return read.map(|()| true);
            }
            drop(t);
            if s.take_turn(&mut turns) {
                // Others ran meanwhile: look again before sleeping.
                continue;
            }
            let mut t = s.turns();
            if t.answered & bit != 0 || !t.reading {
                // Answered, or the reading given up, since the look.
                continue;
            }
            t.waiting |= bit;
            drop(t);
            if asleep.get_or_insert_with(Instant::now).elapsed() >= SILENCE {
                return Err(format!("no answer on the shared raw TCP connection for {SILENCE:?}").into());
            }
            // As long as a tiercel caller that does not read parks at a time (`TICK`).
            std::thread::park_timeout(POLL_WAIT);
        }
    }
}

/// The client side of the raw TCP ping-pong.
pub struct TcpPingPong {
    stream: TcpStream,
    request: Vec<u8>,
    reply: Vec<u8>,
    /// The request's and the reply's payload bytes of [`TcpPingPong::round_trip`].
    sizes: (usize, usize),
    spin: bool,
    /// Never summed step by step (the breakdowns are of UDP and shared memory).
    pub stamps: Option<crate::raw::Stamps>,
}

impl TcpPingPong {
    /// `request_len` payload bytes one way, `reply_len` the other.
    pub fn new(server: SocketAddr, request_len: usize, reply_len: usize, spin: bool) -> crate::Result<TcpPingPong> {
        let stream = TcpStream::connect(server).map_err(|e| format!("connecting to {server}: {e}"))?;
        stream.set_nodelay(true).and_then(|()| stream.set_nonblocking(spin)).map_err(crate::Error::from)?;
        if !spin {
            wait_in_receive(&stream).map_err(crate::Error::from)?;
        }
        let (request_len, reply_len) = (request_len.min(MAX), reply_len.min(MAX));
        let (request, reply) = (vec![0u8; 8 + request_len], vec![0; reply_len]);
        Ok(TcpPingPong { stream, request, reply, sizes: (request_len, reply_len), spin, stamps: None })
    }

    /// One round trip of the sizes it was made with; false if the echo went away.
    pub fn round_trip(&mut self) -> crate::Result<bool> {
        self.round_trip_of(self.sizes.0, self.sizes.1)
    }

    /// One round trip of `request_len` payload bytes out and `reply_len` back on the same
    /// connection, whatever sizes it was made with (so one connection, and one thread of the echo,
    /// can alternate sizes as one binding's calls do); false if the echo went away. The buffers grow
    /// to the largest sizes asked, once.
    pub fn round_trip_of(&mut self, request_len: usize, reply_len: usize) -> crate::Result<bool> {
        let (request_len, reply_len) = (request_len.min(MAX), reply_len.min(MAX));
        if self.request.len() < 8 + request_len {
            self.request.resize(8 + request_len, 0);
        }
        if self.reply.len() < reply_len {
            self.reply.resize(reply_len, 0);
        }
        self.request[..4].copy_from_slice(&(reply_len as u32).to_le_bytes());
        self.request[4..8].copy_from_slice(&(request_len as u32).to_le_bytes());
        write_all(&mut self.stream, &self.request[..8 + request_len]).map_err(crate::Error::from)?;
        read_full(&mut self.stream, &mut self.reply[..reply_len], self.spin, Some(SILENCE)).map_err(crate::Error::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blocking echo on loopback in a thread of its own, serving connections as `echo` does.
    fn echo_thread() -> SocketAddr {
        serving(|stream| serve_connection(stream, false))
    }

    /// The echo of connections shared by several callers (`echo --shared`), as [`echo_thread`].
    fn shared_echo_thread() -> SocketAddr {
        serving(serve_shared)
    }

    /// A listener on loopback whose every connection `serve` serves in a thread of its own.
    fn serving(serve: fn(TcpStream) -> std::io::Result<()>) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let stream = stream.unwrap();
                std::thread::spawn(move || serve(stream));
            }
        });
        addr
    }

    /// Callers sharing one connection each get their own answers, whether they read the connection
    /// or wait for whoever reads it, with sizes that differ from caller to caller and call to call.
    #[test]
    fn callers_sharing_a_connection_each_get_their_own_answers() {
        let addr = shared_echo_thread();
        let shared = SharedTcp::new(addr, 4).unwrap();
        std::thread::scope(|s| {
            for _ in 0..4 {
                let mut c = shared.caller().unwrap();
                s.spawn(move || {
                    for i in 0..2_000usize {
                        let (out, back) = (4 + (i + c.me as usize) % 50, SHARED_HEAD + (i * 7 + c.me as usize) % 1500);
                        assert!(c.round_trip_of(out, back).unwrap());
                    }
                });
            }
        });
        assert!(shared.caller().is_err(), "a fifth caller of a connection made for four");
        let t = shared.turns();
        assert_eq!((t.reading, t.answered), (false, 0), "an answer nobody took");
        drop(t);
        // Nothing is left unread: every answer went to its caller, and only one each.
        assert_eq!(shared.reader.lock().unwrap().2, 0);
        assert!(SharedTcp::new(addr, 65).is_err());
    }

    /// The blocking floors wait in reads of [`RECEIVE_WAIT`] each, and that is no bound on a round
    /// trip: an answer that comes many such waits late is taken, by a caller alone and by callers
    /// sharing a connection, and echoes that sat idle for as long answer the next request.
    #[test]
    fn blocking_round_trips_wait_past_their_reads_timeout() {
        let late = Duration::from_millis(40);
        // A server that answers each request of 8 + 16 bytes with 16 bytes, `late`.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let slow = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let mut stream = stream.unwrap();
                std::thread::spawn(move || {
                    let mut request = [0u8; 24];
                    while stream.read_exact(&mut request).is_ok() {
                        std::thread::sleep(late);
                        let _ = stream.write_all(&[0x5a; 16]);
                    }
                });
            }
        });
        let mut ping = TcpPingPong::new(slow, 16, 16, false).unwrap();
        for _ in 0..3 {
            let t = Instant::now();
            assert!(ping.round_trip().unwrap(), "an answer {late:?} late was not waited for");
            assert!(t.elapsed() >= late);
        }
        let mut ping = TcpPingPong::new(echo_thread(), 16, 16, false).unwrap();
        assert!(ping.round_trip().unwrap());
        std::thread::sleep(late);
        assert!(ping.round_trip().unwrap(), "the echo did not answer after sitting idle");
        // Two callers of a shared connection, one of them reading and the other asleep, through a
        // relay that holds each piece of the answers `late`, to a shared echo that sat idle.
        let echo = shared_echo_thread();
        let relay = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = relay.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut client, _) = relay.accept().unwrap();
            let mut server = TcpStream::connect(echo).unwrap();
            let (mut to_server, mut from_server) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || std::io::copy(&mut to_server, &mut server));
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = from_server.read(&mut buf) {
                std::thread::sleep(late);
                if client.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        });
        let shared = SharedTcp::new(addr, 2).unwrap();
        std::thread::scope(|s| {
            for _ in 0..2 {
                let mut c = shared.caller().unwrap();
                s.spawn(move || {
                    for _ in 0..3 {
                        std::thread::sleep(late);
                        assert!(c.round_trip_of(4, SHARED_HEAD).unwrap());
                    }
                });
            }
        });
    }

    #[test]
    fn one_connection_alternates_sizes_and_each_reply_is_as_long_as_asked() {
        let mut ping = TcpPingPong::new(echo_thread(), 16, 16, false).unwrap();
        for (request, reply) in [(16, 16), (20, 1456), (16, 16), (0, 70_000), (16, 16)] {
            assert!(ping.round_trip_of(request, reply).unwrap());
            // Nothing more is on the way: the next round trip's reply is its own, all of it.
            assert!(ping.round_trip_of(4, 3).unwrap());
            assert_eq!(&ping.reply[..3], &[0x5a; 3]);
        }
        // The sizes it was made with are still those of a plain round trip.
        assert!(ping.round_trip().unwrap());
        assert!(ping.round_trip_of(4, 3).unwrap());
        assert!(ping.round_trip().unwrap());
    }
}
