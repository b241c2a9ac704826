//! The `Test` interface of the seed papers (Firefly, Peregrine, Mach), exported by `tiercel serve`
//! and called by tiercel's own tests, and the kit those tests share: [`etcd::EtcdServer`], a real
//! etcd; [`needs`](mod@needs), what a test needs of the machine (root, a command) and, where it is missing, the
//! test skipped and listed by `./test`.
//!
//! Procedures and buffer sizes follow the seeds: Null; Add; MaxArg and MaxResult with 1440-byte
//! buffers (one Ethernet packet of data); BigIn, BigOut and BigInOut with 200-byte buffers; the
//! argument kinds of Firefly's marshaling tables; Peregrine's In and InOut calls of any size; and a
//! procedure with a fixed service time for the load table. The
//! implementation checks what it receives and fills what it returns with [`pattern`], so that a
//! client can verify every byte.

#![forbid(unsafe_code)]

pub mod etcd;
pub mod needs;

use tiercel::{In, InOut, Out};

/// Buffer size of MaxArg and MaxResult.
pub const MAX_BUFFER: usize = 1440;
/// Buffer size of BigIn, BigOut and BigInOut.
pub const BIG_BUFFER: usize = 200;

/// The byte expected at offset `i` of every buffer sent to or returned by [`SeedTest`].
pub fn pattern(i: usize) -> u8 {
    (i as u8).wrapping_mul(31).wrapping_add(7)
}

/// One period of [`pattern`] (it repeats every 256 bytes), so that filling and checking a buffer
/// are copies and comparisons of whole blocks: a procedure of the bench that checks its 200 bytes
/// byte by byte took longer than the raw ping-pong's whole round trip.
const PERIOD: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = (i as u8).wrapping_mul(31).wrapping_add(7);
        i += 1;
    }
    t
};

/// Fills `buf` with [`pattern`].
pub fn fill(buf: &mut [u8]) {
    for chunk in buf.chunks_mut(PERIOD.len()) {
        chunk.copy_from_slice(&PERIOD[..chunk.len()]);
    }
}

/// Whether `buf` holds [`pattern`].
pub fn check(buf: &[u8]) -> bool {
    buf.chunks(PERIOD.len()).all(|chunk| chunk == &PERIOD[..chunk.len()])
}

/// The seeds' test interface.
#[tiercel::interface]
pub trait Test {
    /// Does nothing: the cost of the call itself.
    fn null(&self);
    /// Adds two integers.
    fn add(&self, a: i32, b: i32) -> i32;
    /// Takes a buffer (1440 bytes in the seeds) on the call.
    fn max_arg(&self, buf: In<&[u8]>);
    /// Returns a buffer (1440 bytes in the seeds) on the result, written in place.
    fn max_result(&self, buf: Out<&mut [u8]>);
    /// Takes a 200-byte buffer on the call.
    fn big_in(&self, buf: In<&[u8]>);
    /// Returns a 200-byte buffer on the result.
    fn big_out(&self, buf: Out<&mut [u8]>);
    /// Takes a 200-byte buffer and returns it changed (every byte plus one).
    fn big_in_out(&self, buf: InOut<&mut [u8]>);
    /// One integer argument (Firefly Table II; Peregrine's 4-byte argument). Does nothing.
    fn int1(&self, a: i32);
    /// Two integer arguments (Firefly Table II). Does nothing.
    fn int2(&self, a: i32, b: i32);
    /// Four integer arguments (Firefly Table II). Does nothing.
    fn int4(&self, a: i32, b: i32, c: i32, d: i32);
    /// A fixed array of 4 bytes passed by value (Firefly Table III). Does nothing.
    fn fixed4(&self, a: [u8; 4]);
    /// A fixed array of 400 bytes passed by value (Firefly Table III). Does nothing.
    fn fixed400(&self, a: [u8; 400]);
    /// A variable-length array (Firefly Table IV: 1 and 1440 bytes), borrowed where it lands.
    /// Does nothing.
    fn var_array(&self, a: &[u8]);
    /// A string (Firefly Table V: 0, 1 and 128 bytes), borrowed where it lands. Does nothing.
    fn string(&self, s: &str);
    /// Takes a buffer of any size and does nothing with it (Peregrine's In calls).
    fn bulk_in(&self, buf: In<&[u8]>);
    /// Takes a buffer of any size and returns it as it came (Peregrine's InOut calls).
    fn bulk_in_out(&self, buf: InOut<&mut [u8]>);
    /// Busy for `micros` microseconds of its thread's CPU time (the fixed service time of the load
    /// table), however many threads share the CPU: counted on the wall clock, two calls running
    /// side by side on one CPU each finished in about half their CPU time, and a server that ran
    /// calls side by side seemed to serve a 50 µs call in 31 µs.
    fn work(&self, micros: u32);
}

/// The reference implementation of [`Test`]: checks the pattern of incoming buffers (panicking, so
/// that the caller sees an error, if a byte is wrong) and writes the pattern into outgoing ones.
#[derive(Debug, Default, Clone, Copy)]
pub struct SeedTest;

impl Test for SeedTest {
    fn null(&self) {}

    fn add(&self, a: i32, b: i32) -> i32 {
        a.wrapping_add(b)
    }

    fn max_arg(&self, buf: In<&[u8]>) {
        assert!(check(buf.0), "max_arg: buffer does not hold the test pattern");
    }

    fn max_result(&self, buf: Out<&mut [u8]>) {
        fill(buf.0);
    }

    fn big_in(&self, buf: In<&[u8]>) {
        assert!(check(buf.0), "big_in: buffer does not hold the test pattern");
    }

    fn big_out(&self, buf: Out<&mut [u8]>) {
        fill(buf.0);
    }

    fn big_in_out(&self, buf: InOut<&mut [u8]>) {
        for b in buf.0.iter_mut() {
            *b = b.wrapping_add(1);
        }
    }

    fn int1(&self, _a: i32) {}

    fn int2(&self, _a: i32, _b: i32) {}

    fn int4(&self, _a: i32, _b: i32, _c: i32, _d: i32) {}

    fn fixed4(&self, _a: [u8; 4]) {}

    fn fixed400(&self, _a: [u8; 400]) {}

    fn var_array(&self, _a: &[u8]) {}

    fn string(&self, _s: &str) {}

    fn bulk_in(&self, _buf: In<&[u8]>) {}

    fn bulk_in_out(&self, _buf: InOut<&mut [u8]>) {}

    fn work(&self, micros: u32) {
        let until = thread_cpu_ns() + u64::from(micros.min(1_000_000)) * 1_000;
        while thread_cpu_ns() < until {
            std::hint::spin_loop();
        }
    }
}

/// The CPU time this thread has had, ns.
fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Why [`check_all`] failed.
#[derive(Debug)]
pub enum CheckFailure {
    /// A procedure failed with an error.
    Call(&'static str, tiercel::CallError),
    /// A procedure returned a wrong result.
    Wrong(String),
}

impl core::fmt::Display for CheckFailure {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CheckFailure::Call(p, e) => {
                let ran = match e.execution() {
                    tiercel::Execution::NeverRan => "never ran",
                    tiercel::Execution::MayHaveRun => "may have run",
                    tiercel::Execution::Ran => "ran and failed",
                };
                write!(f, "{p}: {e} (the procedure {ran})")
            }
            CheckFailure::Wrong(w) => f.write_str(w),
        }
    }
}

impl std::error::Error for CheckFailure {}

/// How many calls one [`check_all`] makes: one of each procedure of [`Test`].
pub const CHECK_CALLS: u64 = 17;

/// Calls every procedure of [`Test`] once with the seeds' buffer sizes and checks every result: each
/// value returned and every byte of every buffer that comes back (the server checks the bytes of
/// `max_arg`'s and `big_in`'s arguments). The procedures of Firefly's marshaling tables take
/// arguments and return nothing: for them it checks that the call completes.
pub fn check_all(client: &TestClient, round: u32) -> Result<(), CheckFailure> {
    let e = |p: &'static str| move |err: tiercel::CallError| CheckFailure::Call(p, err);
    let wrong = |w: &str| Err(CheckFailure::Wrong(w.to_string()));
    client.null().map_err(e("null"))?;
    let a = round as i32;
    let sum = client.add(a, 3).map_err(e("add"))?;
    if sum != a.wrapping_add(3) {
        return Err(CheckFailure::Wrong(format!("add({a}, 3) returned {sum}")));
    }
    let mut max = [0u8; MAX_BUFFER];
    fill(&mut max);
    client.max_arg(In(&max)).map_err(e("max_arg"))?;
    let mut out = [0u8; MAX_BUFFER];
    client.max_result(Out(&mut out)).map_err(e("max_result"))?;
    if !check(&out) {
        return wrong("max_result: wrong bytes");
    }
    client.big_in(In(&max[..BIG_BUFFER])).map_err(e("big_in"))?;
    let mut big = [0u8; BIG_BUFFER];
    client.big_out(Out(&mut big)).map_err(e("big_out"))?;
    if !check(&big) {
        return wrong("big_out: wrong bytes");
    }
    client.big_in_out(InOut(&mut big)).map_err(e("big_in_out"))?;
    if !big.iter().enumerate().all(|(i, &b)| b == pattern(i).wrapping_add(1)) {
        return wrong("big_in_out: wrong bytes");
    }
    client.int1(a).map_err(e("int1"))?;
    client.int2(a, 2).map_err(e("int2"))?;
    client.int4(a, 2, 3, 4).map_err(e("int4"))?;
    client.fixed4([1, 2, 3, 4]).map_err(e("fixed4"))?;
    client.fixed400([7; 400]).map_err(e("fixed400"))?;
    client.var_array(&max).map_err(e("var_array"))?;
    client.string("the Firefly's string").map_err(e("string"))?;
    client.bulk_in(In(&max)).map_err(e("bulk_in"))?;
    client.bulk_in_out(InOut(&mut max)).map_err(e("bulk_in_out"))?;
    if !check(&max) {
        return wrong("bulk_in_out: the buffer came back changed");
    }
    client.work(1).map_err(e("work"))?;
    Ok(())
}

/// Calls one [`every_transport_serves`] makes: a small one and a 1 MiB one on each of three
/// transports.
pub const EVERY_TRANSPORT_CALLS: u64 = 6;

/// What a legitimate client of the server at `addr` must still get while the server is attacked:
/// a binding through shared memory, over UDP and over TCP, and on each an `add` and a 1 MiB
/// `bulk_in`. The first failure names its transport and step.
pub fn every_transport_serves(addr: std::net::SocketAddr) -> Result<(), String> {
    use tiercel::Transport;
    let big: Vec<u8> = (0..1 << 20).map(pattern).collect();
    for (scheme, transport) in
        [("shm:", Transport::SharedMemory), ("udp://", Transport::Udp), ("tcp://", Transport::Tcp)]
    {
        let client: TestClient = tiercel::Client::connect(format!("{scheme}{addr}"))
            .map_err(|e| format!("{transport:?}: {e}"))?
            .import()
            .map_err(|e| format!("{transport:?}: bind: {e}"))?;
        if client.binding().transport() != transport {
            return Err(format!("{transport:?}: bound over {:?}", client.binding().transport()));
        }
        match client.add(20, 22) {
            Ok(42) => {}
            other => return Err(format!("{transport:?}: add: {other:?}")),
        }
        client.bulk_in(In(&big)).map_err(|e| format!("{transport:?}: a 1 MiB call: {e}"))?;
    }
    Ok(())
}

/// A loopback port free for UDP and for TCP both when asked (a server binds both on one port): a
/// port that only a UDP socket was asked for may be another process's TCP port. The caller binds it
/// soon after; another process may still take it meanwhile.
pub fn free_port() -> u16 {
    for _ in 0..100 {
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind a UDP socket on loopback");
        let port = udp.local_addr().expect("a bound socket's address").port();
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no loopback port free for both UDP and TCP in 100 tries")
}

/// Whether this process runs as root (and may create network namespaces).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(2) == Some("0")))
        .unwrap_or(false)
}

/// Sends `signal` (`"TERM"`, `"INT"`, `"KILL"`, `"STOP"`, `"CONT"`) to process `pid`, as `kill -SIGNAL`
/// would: the tests' processes are signalled without the `kill` command, which a minimal machine
/// lacks.
pub fn signal(pid: u32, signal: &str) -> std::io::Result<()> {
    use rustix::process::{kill_process, Pid, Signal};
    let signal = match signal.trim_start_matches('-') {
        "TERM" => Signal::TERM,
        "INT" => Signal::INT,
        "KILL" => Signal::KILL,
        "STOP" => Signal::STOP,
        "CONT" => Signal::CONT,
        other => return Err(std::io::Error::other(format!("no signal {other:?} here"))),
    };
    let pid = i32::try_from(pid).ok().and_then(Pid::from_raw).ok_or_else(|| std::io::Error::other("no such pid"))?;
    kill_process(pid, signal).map_err(std::io::Error::from)
}

/// `info` as the bind exchange of `tiercel-proto` sees it, for tests that play a client or a
/// server by hand: the same name, id, version, fingerprint, signature and procedure shapes the
/// library sends (kept for the life of the test process).
pub fn bind_spec(info: &tiercel::InterfaceInfo) -> tiercel_proto::bind::InterfaceSpec<'static> {
    let procedures: Vec<_> = info
        .procedures
        .iter()
        .zip(info.procedure_fingerprints())
        .map(|(name, shape)| tiercel_proto::bind::ProcedureShape {
            name: tiercel::interface::interface_id(name) as u32,
            shape: shape as u32,
        })
        .collect();
    tiercel_proto::bind::InterfaceSpec {
        name: info.name,
        id: info.id,
        version: info.version,
        fingerprint: info.fingerprint(),
        signature: info.signature(),
        procedures: Box::leak(procedures.into_boxed_slice()),
    }
}

/// Raises this process's limit of open descriptors to the most it may have, for tests that hold
/// thousands of connections; returns the limit now.
pub fn raise_open_files() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.maximum.is_some() && limit.current != limit.maximum {
        limit.current = limit.maximum;
        let _ = setrlimit(Resource::Nofile, limit);
    }
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// Threads and resident memory of this process now (`/proc/self/status`): for tests that show
/// what a thousand idle peers cost.
pub fn threads_and_rss() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| -> u64 {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap_or_default();
        line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0)
    };
    (field("Threads:"), field("VmRSS:") * 1024)
}

/// Context switches (voluntary and not) of this process's threads named `name` so far
/// (`/proc/self/task`): how often a runtime's thread was woken, for tests that show it sleeps.
pub fn context_switches_of(name: &str) -> u64 {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        total += status
            .lines()
            .filter(|l| l.starts_with("voluntary_ctxt_switches") || l.starts_with("nonvoluntary_ctxt_switches"))
            .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
            .sum::<u64>();
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_and_check_follow_the_pattern_across_its_period() {
        for len in [0, 1, 200, 255, 256, 257, 1440, 4096 + 3] {
            let mut buf = vec![0u8; len];
            fill(&mut buf);
            assert!(buf.iter().enumerate().all(|(i, &b)| b == pattern(i)), "fill of {len}");
            assert!(check(&buf), "check of {len}");
            if len > 0 {
                buf[len - 1] ^= 1;
                assert!(!check(&buf), "a changed last byte of {len} is seen");
                buf[len - 1] ^= 1;
                buf[len / 2] ^= 0x80;
                assert!(!check(&buf), "a changed middle byte of {len} is seen");
            }
        }
    }
}
