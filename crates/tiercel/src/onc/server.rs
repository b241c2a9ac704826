//! The ONC server: threads on the UDP socket ([`OncConfig::udp_threads`], one by default), one
//! accepting TCP connections, one per connection (at most [`OncConfig::max_connections`]); the
//! duplicate request cache shared by all.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tiercel_proto::onc::{self, Accepted, Cache, CacheKey, Credential, RecordReader, Refused, Seen};
use tiercel_sys::udp::{self, Received};

use super::{Failure, Program};
use crate::server::{CallInfo, Caller};

/// `auth_stat` of a call the server's interceptor refused ("rejected for security reasons").
const AUTH_TOOWEAK: u32 = 5;
/// Largest UDP datagram.
const MAX_DATAGRAM: usize = 65_507;
/// How often blocked threads look at the stop flag.
const TICK: Duration = Duration::from_millis(100);

/// An ONC server's limits. Every one bounds what a caller can make the server hold before its call
/// has run.
#[derive(Debug, Clone)]
pub struct OncConfig {
    /// Most TCP connections at once; one more is closed at once (default 64).
    pub max_connections: usize,
    /// Most bytes of one call over TCP (default 1 MiB): a record that claims more ends its
    /// connection.
    pub max_record: usize,
    /// A TCP connection idle this long, or as slow to finish a call it began, is closed; a reply
    /// its peer does not read within it ends it too (default 30 s).
    pub idle: Duration,
    /// Most calls the duplicate request cache remembers (default 1,024).
    pub cache_entries: usize,
    /// Largest reply it keeps (default 64 KiB): a copy of a call with a larger reply is dropped.
    pub cache_reply: usize,
    /// Most bytes of replies it keeps in all (default 8 MiB).
    pub cache_bytes: usize,
    /// How long it remembers a call (default 120 s, as `nfsd`).
    pub cache_lifetime: Duration,
    /// How long a UDP thread, and each connection's thread, spins for the next call after
    /// answering one before it blocks (default 1 ms, as a tiercel server's workers; zero blocks at
    /// once). On a VM a blocked thread takes tens of microseconds to wake.
    pub spin: Duration,
    /// Threads reading the UDP socket, each running the calls it reads (default 1, as libtirpc's
    /// `svc_run`: a long procedure then holds up the UDP calls behind it). The duplicate cache is
    /// shared, so a copy of a call running on one thread is dropped by another.
    pub udp_threads: usize,
}

impl Default for OncConfig {
    fn default() -> Self {
        OncConfig {
            max_connections: 64,
            max_record: 1 << 20,
            idle: Duration::from_secs(30),
            cache_entries: 1024,
            cache_reply: 64 << 10,
            cache_bytes: 8 << 20,
            cache_lifetime: Duration::from_secs(120),
            spin: Duration::from_millis(1),
            udp_threads: 1,
        }
    }
}

/// What an ONC server counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OncStats {
    /// Calls run (the null procedure included).
    pub calls: u64,
    /// Copies of calls answered from the duplicate request cache.
    pub replayed: u64,
    /// Copies dropped because their call was running, or had run with a reply too large to keep.
    pub dropped_copies: u64,
    /// Messages dropped unanswered: not calls, or cut short.
    pub malformed: u64,
    /// Calls refused before running: another RPC version, a bad credential, no such program,
    /// version or procedure, garbage arguments, or the interceptor.
    pub refused: u64,
    /// TCP connections closed at once for want of room, and those closed for a record too large,
    /// for idling or for not reading.
    pub connections_closed: u64,
}

#[derive(Default)]
struct Counters {
    calls: AtomicU64,
    replayed: AtomicU64,
    dropped_copies: AtomicU64,
    malformed: AtomicU64,
    refused: AtomicU64,
    connections_closed: AtomicU64,
}

type Interceptor = dyn Fn(&CallInfo) -> Result<(), String> + Send + Sync;

/// Serves ONC programs (see the [module](super)).
pub struct OncServer {
    programs: Vec<Arc<dyn Program>>,
    config: OncConfig,
    interceptor: Option<Arc<Interceptor>>,
    register: bool,
}

impl Default for OncServer {
    fn default() -> Self {
        OncServer::new()
    }
}

impl OncServer {
    /// A server with no program yet and the default [`OncConfig`].
    pub fn new() -> OncServer {
        OncServer { programs: Vec::new(), config: OncConfig::default(), interceptor: None, register: false }
    }

    /// Serves `program` (a `{Trait}Server` of an interface with `onc(...)`). Several versions of
    /// one program may be served side by side.
    pub fn export(mut self, program: impl Program) -> OncServer {
        self.programs.push(Arc::new(program));
        self
    }

    /// Sets the server's limits.
    pub fn config(mut self, config: OncConfig) -> OncServer {
        self.config = config;
        self
    }

    /// Shows every call to `interceptor` before it runs, as [`crate::Server::intercept`] does
    /// (`transport` is `"onc-udp"` or `"onc-tcp"`; `number` is the ONC procedure number, 65535
    /// for larger ones); a refusal is answered `AUTH_ERROR` (`AUTH_TOOWEAK`): it never ran.
    pub fn intercept(
        mut self,
        interceptor: impl Fn(&CallInfo) -> Result<(), String> + Send + Sync + 'static,
    ) -> OncServer {
        self.interceptor = Some(Arc::new(interceptor));
        self
    }

    /// Registers each program with this host's `rpcbind` (portmapper version 2, over UDP to
    /// 127.0.0.1:111) once the server listens, for UDP and TCP, and unregisters it when the server
    /// stops; `rpcinfo -p` then lists it, and C clients find it by `clnt_create`. Without
    /// `rpcbind` running, [`OncServer::serve`] fails.
    pub fn register(mut self, register: bool) -> OncServer {
        self.register = register;
        self
    }

    /// Listens on `addr` for UDP and TCP (the same port for both: with port 0, one free for both)
    /// and serves until the returned handle is stopped or dropped.
    pub fn serve(self, addr: impl ToSocketAddrs) -> io::Result<RunningOnc> {
        let addr = addr
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address to serve ONC on"))?;
        // With port 0, a port free for both: the UDP socket's may be taken for TCP.
        let mut tries = if addr.port() == 0 { 16 } else { 1 };
        let (udp, listener) = loop {
            let udp = UdpSocket::bind(addr)?;
            match TcpListener::bind(udp.local_addr()?) {
                Ok(listener) => break (udp, listener),
                Err(e) if e.kind() == io::ErrorKind::AddrInUse && tries > 1 => tries -= 1,
                Err(e) => return Err(e),
            }
        };
        let (udp_addr, tcp_addr) = (udp.local_addr()?, listener.local_addr()?);
        let c = &self.config;
        let shared = Arc::new(Shared {
            programs: self.programs,
            cache: Mutex::new(Cache::new(c.cache_entries, c.cache_reply, c.cache_bytes, c.cache_lifetime)),
            interceptor: self.interceptor,
            config: self.config,
            counters: Counters::default(),
            stop: AtomicBool::new(false),
            connections: AtomicUsize::new(0),
            connection_threads: Mutex::new(Vec::new()),
            born: Instant::now(),
        });
        // Each program and version once: `unset` removes it for every protocol. A registration
        // that fails takes back those made before it.
        let mut registered = Vec::new();
        if self.register {
            for p in &shared.programs {
                registered.push((p.program(), p.version()));
                for (protocol, port) in [(onc_protocol::UDP, udp_addr.port()), (onc_protocol::TCP, tcp_addr.port())] {
                    if let Err(e) = super::rpcbind::set(p.program(), p.version(), protocol, port) {
                        for (program, version) in registered {
                            let _ = super::rpcbind::unset(program, version);
                        }
                        return Err(e);
                    }
                }
            }
        }
        // `serve` returns once every thread runs.
        let udp_threads = shared.config.udp_threads.max(1);
        let started = Arc::new(std::sync::Barrier::new(udp_threads + 2));
        let udp = Arc::new(udp);
        let mut threads = Vec::with_capacity(udp_threads + 1);
        for _ in 0..udp_threads {
            // Each thread's buffers are made here, so that none is allocated while calls run.
            let buffers = (vec![0u8; MAX_DATAGRAM], Vec::with_capacity(MAX_DATAGRAM));
            threads.push(spawn("tiercel-onc-udp", {
                let (shared, started, udp) = (shared.clone(), started.clone(), udp.clone());
                move || {
                    started.wait();
                    serve_udp(&shared, &udp, buffers)
                }
            })?);
        }
        threads.push(spawn("tiercel-onc-tcp", {
            let (shared, started) = (shared.clone(), started.clone());
            move || {
                started.wait();
                accept(&shared, &listener)
            }
        })?);
        started.wait();
        Ok(RunningOnc { shared, udp_addr, tcp_addr, threads, registered })
    }
}

/// IP protocol numbers as portmapper takes them.
mod onc_protocol {
    pub const TCP: u32 = 6;
    pub const UDP: u32 = 17;
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(name.into()).spawn(f)
}

/// A running ONC server; dropping it stops it.
pub struct RunningOnc {
    shared: Arc<Shared>,
    udp_addr: SocketAddr,
    tcp_addr: SocketAddr,
    threads: Vec<JoinHandle<()>>,
    registered: Vec<(u32, u32)>,
}

impl RunningOnc {
    /// Where the server takes calls over UDP.
    pub fn udp_addr(&self) -> SocketAddr {
        self.udp_addr
    }

    /// Where it takes calls over TCP.
    pub fn tcp_addr(&self) -> SocketAddr {
        self.tcp_addr
    }

    /// What it counted so far.
    pub fn stats(&self) -> OncStats {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        OncStats {
            calls: get(&c.calls),
            replayed: get(&c.replayed),
            dropped_copies: get(&c.dropped_copies),
            malformed: get(&c.malformed),
            refused: get(&c.refused),
            connections_closed: get(&c.connections_closed),
        }
    }

    /// Stops serving: unregisters from `rpcbind` (if it registered), stops taking calls and
    /// connections, closes the connections, and waits for its threads (a call running finishes
    /// first).
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        if self.shared.stop.swap(true, Ordering::SeqCst) {
            return;
        }
        for (program, version) in self.registered.drain(..) {
            let _ = super::rpcbind::unset(program, version);
        }
        // Wake the accepting thread.
        let _ = TcpStream::connect_timeout(&self.tcp_addr, TICK);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let connections =
            std::mem::take(&mut *self.shared.connection_threads.lock().unwrap_or_else(|p| p.into_inner()));
        for t in connections {
            let _ = t.join();
        }
    }
}

impl Drop for RunningOnc {
    fn drop(&mut self) {
        self.halt();
    }
}

struct Shared {
    programs: Vec<Arc<dyn Program>>,
    cache: Mutex<Cache>,
    interceptor: Option<Arc<Interceptor>>,
    config: OncConfig,
    counters: Counters,
    stop: AtomicBool,
    connections: AtomicUsize,
    /// The connections' threads (those finished are let go at each accept).
    connection_threads: Mutex<Vec<JoinHandle<()>>>,
    born: Instant,
}

impl Shared {
    /// Answers the message `msg` from `from` into `out` (cleared first): `false` when it gets no
    /// answer (malformed, or a copy of a call running or run).
    fn answer(&self, msg: &[u8], from: SocketAddr, tcp: bool, out: &mut Vec<u8>) -> bool {
        out.clear();
        let call = match onc::parse_call(msg) {
            Ok(call) => call,
            Err(refused) => {
                let counter =
                    if refused == Refused::Dropped { &self.counters.malformed } else { &self.counters.refused };
                counter.fetch_add(1, Ordering::Relaxed);
                return onc::write_refusal(out, refused);
            }
        };
        let key = CacheKey::of(&call, from, tcp);
        {
            let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            match cache.check(key, self.born.elapsed()) {
                Seen::New => {}
                Seen::Replay(reply) => {
                    tiercel_proto::copy::extend(out, reply);
                    self.counters.replayed.fetch_add(1, Ordering::Relaxed);
                    return true;
                }
                Seen::Running | Seen::Ran => {
                    self.counters.dropped_copies.fetch_add(1, Ordering::Relaxed);
                    return false;
                }
            }
        }
        self.run(&call, from, tcp, out);
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).complete(key, out);
        true
    }

    /// Runs `call`, writing its whole reply to `out`.
    fn run(&self, call: &onc::Call<'_>, from: SocketAddr, tcp: bool, out: &mut Vec<u8>) {
        let refuse = |out: &mut Vec<u8>, status| {
            self.counters.refused.fetch_add(1, Ordering::Relaxed);
            onc::write_accepted(out, call.xid, status);
        };
        let mut versions = self.programs.iter().filter(|p| p.program() == call.program).peekable();
        if versions.peek().is_none() {
            return refuse(out, Accepted::ProgUnavail);
        }
        let Some(program) = self.programs.iter().find(|p| p.program() == call.program && p.version() == call.version)
        else {
            let (low, high) = versions.fold((u32::MAX, 0), |(l, h), p| (l.min(p.version()), h.max(p.version())));
            return refuse(out, Accepted::ProgMismatch { low, high });
        };
        let name = program.procedure_name(call.procedure);
        if call.procedure != 0 && name.is_none() {
            return refuse(out, Accepted::ProcUnavail);
        }
        let caller = match call.credential {
            Credential::None => Caller::Address(from),
            Credential::Sys(sys) => Caller::System { address: from, uid: sys.uid, gid: sys.gid },
        };
        if let Some(interceptor) = &self.interceptor {
            let info = CallInfo {
                interface: program.interface(),
                version: program.version(),
                procedure: name.unwrap_or("null"),
                number: u16::try_from(call.procedure).unwrap_or(u16::MAX),
                caller: Some(caller),
                deadline: None,
                transport: if tcp { "onc-tcp" } else { "onc-udp" },
            };
            let verdict = catch_unwind(AssertUnwindSafe(|| interceptor(&info)));
            if !matches!(verdict, Ok(Ok(()))) {
                self.counters.refused.fetch_add(1, Ordering::Relaxed);
                onc::write_refusal(out, Refused::Credential { xid: call.xid, stat: AUTH_TOOWEAK });
                return;
            }
        }
        onc::write_accepted(out, call.xid, Accepted::Success);
        if call.procedure == 0 {
            self.counters.calls.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let outcome = {
            let _current = crate::server::Current::set(None, Some(caller));
            catch_unwind(AssertUnwindSafe(|| program.dispatch(call.procedure, call.args, out)))
        };
        if let Ok(Ok(())) = outcome {
            self.counters.calls.fetch_add(1, Ordering::Relaxed);
            return;
        }
        out.clear();
        match outcome {
            Ok(Ok(())) => unreachable!("returned above"),
            Ok(Err(Failure::NoProcedure)) => refuse(out, Accepted::ProcUnavail),
            Ok(Err(Failure::Garbage(_))) => refuse(out, Accepted::GarbageArgs),
            // It ran, and failed.
            Err(_) => {
                self.counters.calls.fetch_add(1, Ordering::Relaxed);
                onc::write_accepted(out, call.xid, Accepted::SystemErr);
            }
        }
    }
}

/// Serves datagrams from `socket` into `buf` (`MAX_DATAGRAM` long), writing each reply in `out`.
fn serve_udp(shared: &Shared, socket: &UdpSocket, (mut buf, mut out): (Vec<u8>, Vec<u8>)) {
    // Until when to spin for the next datagram before blocking.
    let mut spin_until = Instant::now();
    while !shared.stop.load(Ordering::Relaxed) {
        let (n, from) = match udp::recv_from_nowait(socket, &mut buf) {
            Ok(Some((Received::Datagram(n), from))) => (n, from),
            Ok(Some(_)) => {
                shared.counters.malformed.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            Ok(None) if Instant::now() < spin_until => {
                std::hint::spin_loop();
                continue;
            }
            Ok(None) | Err(_) => {
                let _ = udp::wait_readable(socket, Some(TICK));
                continue;
            }
        };
        if shared.answer(&buf[..n], from, false, &mut out) {
            if out.len() > MAX_DATAGRAM {
                // A result larger than a datagram cannot go over UDP: say the server failed.
                if let Ok(call) = onc::parse_call(&buf[..n]) {
                    out.clear();
                    onc::write_accepted(&mut out, call.xid, Accepted::SystemErr);
                }
            }
            let _ = socket.send_to(&out, from);
        }
        spin_until = Instant::now() + shared.config.spin;
    }
}

fn accept(shared: &Arc<Shared>, listener: &TcpListener) {
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else { continue };
        let Ok(peer) = stream.peer_addr() else { continue };
        if shared.connections.fetch_add(1, Ordering::SeqCst) >= shared.config.max_connections {
            shared.connections.fetch_sub(1, Ordering::SeqCst);
            shared.counters.connections_closed.fetch_add(1, Ordering::Relaxed);
            continue; // Dropped: closed at once.
        }
        let conn_shared = shared.clone();
        let spawned = crate::server::spawn_kept(&shared.connection_threads, || {
            spawn("tiercel-onc-conn", move || {
                let _ = serve_connection(&conn_shared, stream, peer);
                conn_shared.connections.fetch_sub(1, Ordering::SeqCst);
            })
        });
        if spawned.is_err() {
            shared.connections.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Serves a connection's calls until its peer closes it (`Ok`), or it breaks a rule or fails
/// (`Err`), which the counters note before the connection closes (so that whoever sees it closed
/// sees it counted).
fn serve_connection(shared: &Shared, mut stream: TcpStream, peer: SocketAddr) -> io::Result<()> {
    let served = serve_records(shared, &mut stream, peer);
    if served.is_err() {
        shared.counters.connections_closed.fetch_add(1, Ordering::Relaxed);
    }
    served
}

fn serve_records(shared: &Shared, stream: &mut TcpStream, peer: SocketAddr) -> io::Result<()> {
    let idle = shared.config.idle;
    stream.set_nonblocking(true)?;
    let _ = stream.set_nodelay(true);
    let mut reader = RecordReader::new(shared.config.max_record);
    let mut buf = vec![0u8; 64 << 10];
    let mut out = Vec::new();
    let mut reply = Vec::new();
    // Since when the connection has waited for a call to be whole, and until when to spin.
    let mut waiting = Instant::now();
    let mut spin_until = waiting;
    while !shared.stop.load(Ordering::Relaxed) {
        let n = match stream.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() < spin_until {
                    std::hint::spin_loop();
                } else if waiting.elapsed() > idle {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "an idle or slow ONC connection"));
                } else {
                    udp::wait_readable_fd(&*stream, Some(TICK))?;
                }
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let mut input = &buf[..n];
        while !input.is_empty() {
            let (used, whole) = reader
                .feed(input)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "an ONC record over the bound"))?;
            input = &input[used..];
            if !whole {
                continue;
            }
            waiting = Instant::now();
            if shared.answer(reader.record(), peer, true, &mut out) {
                reply.clear();
                for (i, chunk) in out.chunks(onc::MAX_FRAGMENT).enumerate() {
                    let last = (i + 1) * onc::MAX_FRAGMENT >= out.len();
                    reply.extend_from_slice(&onc::record_mark(chunk.len(), last));
                    tiercel_proto::copy::extend(&mut reply, chunk);
                }
                write_within(stream, &reply, idle)?;
            }
            spin_until = Instant::now() + shared.config.spin;
        }
    }
    Ok(())
}

/// Writes all of `bytes` to the non-blocking `stream`, failing if its peer takes none of them for
/// `idle`.
pub(super) fn write_within(stream: &mut TcpStream, mut bytes: &[u8], idle: Duration) -> io::Result<()> {
    while !bytes.is_empty() {
        match stream.write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if !udp::wait_writable_fd(&*stream, Some(idle))? {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "an ONC peer that does not read"));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
