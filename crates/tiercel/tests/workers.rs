//! The UDP server's workers on their default settings: one reads the socket while calls are quick,
//! and long procedures do not hold up the quick calls that arrive behind them; with several
//! sockets on the port, one reads each, and the same holds on each.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tiercel::{Client, Server};

#[tiercel::interface]
pub trait Desk {
    /// Runs `ms` milliseconds; returns the most slow calls seen running at once.
    fn slow(&self, ms: u64) -> u32;
    /// Returns the slow calls running now.
    fn quick(&self) -> u32;
    /// The name of the server thread running the call.
    fn worker(&self) -> String;
    /// Runs `ms` milliseconds, counted as `slow` counts; returns the CPUs the thread running it may
    /// use (`Cpus_allowed_list` of /proc/thread-self/status).
    fn allowed(&self, ms: u64) -> String;
}

#[derive(Default)]
struct Counts {
    running: AtomicU32,
    most: AtomicU32,
}

struct DeskImpl(Arc<Counts>);

impl Desk for DeskImpl {
    fn slow(&self, ms: u64) -> u32 {
        let now = self.0.running.fetch_add(1, Ordering::AcqRel) + 1;
        self.0.most.fetch_max(now, Ordering::AcqRel);
        std::thread::sleep(Duration::from_millis(ms));
        self.0.running.fetch_sub(1, Ordering::AcqRel);
        self.0.most.load(Ordering::Acquire)
    }
    fn quick(&self) -> u32 {
        self.0.running.load(Ordering::Acquire)
    }
    fn worker(&self) -> String {
        std::thread::current().name().unwrap_or_default().to_owned()
    }
    fn allowed(&self, ms: u64) -> String {
        self.slow(ms);
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default();
        let line = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:"));
        line.unwrap_or("unknown").trim().to_owned()
    }
}

/// A server of `config`, bound to a free port on loopback, exporting a `Desk` that counts in `counts`.
fn desk_server(config: tiercel::ServerConfig, counts: &Arc<Counts>) -> tiercel::RunningServer {
    Server::bind("udp://127.0.0.1:0")
        .unwrap()
        .with_config(config)
        .export(DeskServer::new(DeskImpl(counts.clone())))
        .start()
        .unwrap()
}

/// Starts `n` calls of `ms` milliseconds from `n` threads, and waits (at most `within`) until all of
/// them run at once.
fn long_calls(
    desk: &DeskClient,
    counts: &Counts,
    n: u32,
    ms: u64,
    within: Duration,
) -> Vec<std::thread::JoinHandle<Result<u32, tiercel::CallError>>> {
    let calls: Vec<_> = (0..n)
        .map(|_| {
            let desk = desk.clone();
            std::thread::spawn(move || desk.slow(ms))
        })
        .collect();
    let give_up = Instant::now() + within;
    while counts.running.load(Ordering::Acquire) < n {
        assert!(Instant::now() < give_up, "only {} long calls running", counts.running.load(Ordering::Acquire));
        std::thread::sleep(Duration::from_millis(5));
    }
    calls
}

/// Waits for the long calls and checks that all `n` ran at once, and that nothing was refused.
fn ran_at_once(
    calls: Vec<std::thread::JoinHandle<Result<u32, tiercel::CallError>>>,
    n: u32,
    server: &tiercel::RunningServer,
) {
    for c in calls {
        assert_eq!(c.join().unwrap().unwrap(), n, "the long calls did not all run at once");
    }
    assert_eq!(server.stats().busy, 0, "a call was refused as busy");
}

#[test]
fn long_calls_run_at_once_and_a_quick_call_is_answered_while_they_run() {
    long_calls_and_a_quick_one(tiercel::ServerConfig::default());
}

#[test]
fn on_three_sockets_long_calls_run_at_once_and_a_quick_call_is_answered_while_they_run() {
    // The six long calls' client sockets fall on the three sockets as the kernel's hash puts them:
    // the workers standing by take over on whichever sockets have calls held up.
    long_calls_and_a_quick_one(tiercel::ServerConfig { sockets: 3, ..tiercel::ServerConfig::default() });
}

#[test]
fn every_socket_of_the_port_is_read_by_a_worker_of_its_own() {
    let config = tiercel::ServerConfig { sockets: 2, workers: 4, ..tiercel::ServerConfig::default() };
    let server = desk_server(config, &Arc::default());
    let addr = format!("udp://{}", server.addr());
    // 24 clients, each with a socket of its own: all on one of the two sockets has odds of 2^-23.
    let mut workers = std::collections::BTreeSet::new();
    for _ in 0..24 {
        let desk: DeskClient = Client::connect(addr.as_str()).unwrap().import().unwrap();
        for _ in 0..10 {
            workers.insert(desk.worker().unwrap());
        }
    }
    // Quick calls: each is run by the worker reading its socket (worker `i` reads socket `i`).
    // Another may take over where a call was held up (a worker preempted in one), so the test asks
    // for both readers, not for them alone.
    assert!(workers.contains("tiercel-worker-0") && workers.contains("tiercel-worker-1"), "{workers:?}");
    assert_eq!(server.stats().calls, 240);
    // A server of one worker has one socket, whatever is asked: each socket has a worker to spare.
    let config = tiercel::ServerConfig { sockets: 4, workers: 1, ..tiercel::ServerConfig::default() };
    let one = desk_server(config, &Arc::default());
    let desk: DeskClient = Client::connect(format!("udp://{}", one.addr())).unwrap().import().unwrap();
    assert_eq!(desk.worker().unwrap(), "tiercel-worker-0");
}

#[test]
fn a_port_with_several_sockets_is_still_refused_to_a_plain_socket() {
    let config = tiercel::ServerConfig { sockets: 2, ..tiercel::ServerConfig::default() };
    let server = desk_server(config, &Arc::default());
    let err = std::net::UdpSocket::bind(server.addr()).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
    let err = Server::bind(format!("udp://{}", server.addr()).as_str()).unwrap_err();
    assert!(matches!(err, tiercel::ServerError::Listen { .. }), "{err}");
}

fn long_calls_and_a_quick_one(config: tiercel::ServerConfig) {
    let counts = Arc::new(Counts::default());
    let server = desk_server(config, &counts);
    let addr = format!("udp://{}", server.addr());
    let desk: DeskClient = Client::connect(addr.as_str()).unwrap().import().unwrap();
    // Quick calls first: they are all served by one worker, and nothing is refused.
    for _ in 0..1000 {
        assert_eq!(desk.quick().unwrap(), 0);
    }
    // Six long calls from six threads of one client (before, a default server ran three at a time,
    // and a quick caller waited for them).
    const SLOW: u32 = 6;
    let slow = long_calls(&desk, &counts, SLOW, 5000, Duration::from_secs(4));
    // Another client's quick call is answered while all six still run.
    let other: DeskClient = Client::connect(addr.as_str()).unwrap().import().unwrap();
    assert_eq!(other.quick().unwrap(), SLOW, "the quick call waited for a long one to end");
    ran_at_once(slow, SLOW, &server);
    // And quick calls go on as before.
    for _ in 0..1000 {
        assert_eq!(desk.quick().unwrap(), 0);
    }
}

#[test]
fn a_server_of_two_workers_serves_a_quick_call_beside_a_long_one() {
    let counts = Arc::new(Counts::default());
    let config = tiercel::ServerConfig { workers: 2, ..tiercel::ServerConfig::default() };
    let server = desk_server(config, &counts);
    let addr = format!("udp://{}", server.addr());
    let desk: DeskClient = Client::connect(addr.as_str()).unwrap().import().unwrap();
    let long = {
        let desk = desk.clone();
        std::thread::spawn(move || desk.slow(2000))
    };
    while counts.running.load(Ordering::Acquire) < 1 {
        std::thread::sleep(Duration::from_millis(1));
    }
    // The second worker takes over reading: many quick calls while the long one runs.
    for _ in 0..100 {
        assert_eq!(desk.quick().unwrap(), 1, "a quick call waited for the long one");
    }
    assert_eq!(long.join().unwrap().unwrap(), 1);
}

/// Through shared memory: each thread of a client calls on its own slot of the one binding.
fn shm_desk(config: tiercel::ServerConfig, counts: &Arc<Counts>) -> (tiercel::RunningServer, DeskClient) {
    let server = desk_server(config, counts);
    let desk: DeskClient = Client::connect(server.addr()).unwrap().import().unwrap();
    assert_eq!(desk.binding().transport(), tiercel::Transport::SharedMemory);
    (server, desk)
}

#[test]
fn slow_calls_on_slots_of_a_shared_memory_binding_do_not_delay_its_other_slots() {
    let counts = Arc::new(Counts::default());
    let (server, desk) = shm_desk(tiercel::ServerConfig::default(), &counts);
    for _ in 0..1000 {
        assert_eq!(desk.quick().unwrap(), 0);
    }
    // Six long calls from six threads of the client, on six slots of its one binding.
    const SLOW: u32 = 6;
    let slow = long_calls(&desk, &counts, SLOW, 4000, Duration::from_secs(3));
    // Quick calls on another slot of the same binding are answered while all six run.
    for _ in 0..200 {
        assert_eq!(desk.quick().unwrap(), SLOW, "a quick call waited for a long one");
    }
    ran_at_once(slow, SLOW, &server);
    assert_eq!(server.bindings(), 1, "every call went through the one binding");
    for _ in 0..1000 {
        assert_eq!(desk.quick().unwrap(), 0);
    }
}

#[test]
fn a_shared_memory_binding_has_at_most_workers_threads() {
    let counts = Arc::new(Counts::default());
    let config = tiercel::ServerConfig { workers: 2, ..tiercel::ServerConfig::default() };
    let (_server, desk) = shm_desk(config, &counts);
    // Three long calls on a binding that may have two threads: two run at once, then the third.
    let slow: Vec<_> = (0..3)
        .map(|_| {
            let desk = desk.clone();
            std::thread::spawn(move || desk.slow(600))
        })
        .collect();
    let most: Vec<u32> = slow.into_iter().map(|s| s.join().unwrap().unwrap()).collect();
    assert_eq!(counts.most.load(Ordering::Acquire), 2, "two threads serve the binding: {most:?}");
}

#[test]
fn calls_whose_procedures_block_for_a_millisecond_run_side_by_side_on_every_transport() {
    // Each call is shorter than the looks that catch one long call (two deputy ticks over UDP, ten
    // milliseconds over TCP): what makes more threads serve them is calls waiting while every
    // thread runs one.
    let mut most = Vec::new();
    for scheme in ["udp://", "shm:", "tcp://"] {
        let counts = Arc::new(Counts::default());
        let server = Server::bind("udp://127.0.0.1:0")
            .unwrap()
            .export(DeskServer::new(DeskImpl(counts.clone())))
            .start()
            .unwrap();
        let desk: DeskClient = Client::connect(format!("{scheme}{}", server.addr())).unwrap().import().unwrap();
        let callers: Vec<_> = (0..8)
            .map(|_| {
                let desk = desk.clone();
                std::thread::spawn(move || {
                    for _ in 0..300 {
                        desk.slow(1).unwrap();
                    }
                })
            })
            .collect();
        for c in callers {
            c.join().unwrap();
        }
        most.push((scheme, counts.most.load(Ordering::Acquire)));
        assert_eq!(server.stats().busy, 0, "{scheme}: a call was refused as busy");
    }
    // One thread serving the calls in turn would have run one at a time.
    assert!(most.iter().all(|&(_, n)| n >= 4), "most of 8 callers' calls running at once: {most:?}");
}

#[test]
fn every_thread_that_runs_a_call_is_pinned_as_the_config_says_on_every_transport() {
    // The last CPU this process may use: on a machine of several, a thread left unpinned may use
    // the others too.
    let cpu = std::thread::available_parallelism().map_or(0, |n| n.get() - 1);
    for scheme in ["udp://", "shm:", "tcp://"] {
        let counts = Arc::new(Counts::default());
        let config = tiercel::ServerConfig { cpus: vec![cpu], ..tiercel::ServerConfig::default() };
        let server = desk_server(config, &counts);
        let desk: DeskClient = Client::connect(format!("{scheme}{}", server.addr())).unwrap().import().unwrap();
        // Four long calls at once: beside the first thread, the server starts more (a shared-memory
        // binding's helpers, TCP's extra threads, UDP's workers standing by).
        let calls: Vec<_> = (0..4)
            .map(|_| {
                let desk = desk.clone();
                std::thread::spawn(move || desk.allowed(400))
            })
            .collect();
        let allowed: Vec<String> = calls.into_iter().map(|c| c.join().unwrap().unwrap()).collect();
        assert!(counts.most.load(Ordering::Acquire) >= 2, "{scheme}: the calls ran one at a time: {allowed:?}");
        assert!(
            allowed.iter().all(|a| *a == cpu.to_string()),
            "{scheme}: threads not pinned to CPU {cpu}: {allowed:?}"
        );
    }
}

/// The inode of this process's UDP socket bound to `port` (from /proc/net/udp and udp6). Those
/// tables are read a page at a time and may skip a socket while other tests open and close theirs,
/// so they are read again until it shows.
fn udp_socket_inode(port: u16) -> u64 {
    let find = || {
        let table =
            ["/proc/net/udp", "/proc/net/udp6"].map(|p| std::fs::read_to_string(p).unwrap_or_default()).concat();
        table.lines().find_map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            let local_port = fields.get(1)?.rsplit(':').next()?;
            (u16::from_str_radix(local_port, 16).ok()? == port).then(|| fields.get(9)?.parse().ok())?
        })
    };
    (0..50).find_map(|_| find()).unwrap_or_else(|| panic!("no UDP socket on port {port}"))
}

/// The inodes of the files in this process's epoll sets (the `tfd` lines of each set's fdinfo).
fn in_epoll_sets() -> Vec<u64> {
    let mut inodes = Vec::new();
    for fd in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(target) = std::fs::read_link(fd.path()) else { continue };
        if target.to_string_lossy() != "anon_inode:[eventpoll]" {
            continue;
        }
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.file_name().to_string_lossy()))
            .unwrap_or_default();
        inodes.extend(info.lines().filter(|l| l.starts_with("tfd:")).filter_map(|l| {
            let ino = l.split_whitespace().find_map(|f| f.strip_prefix("ino:"))?;
            u64::from_str_radix(ino, 16).ok()
        }));
    }
    inodes
}

/// Waits (at most 5 s) until `want` holds of the inodes in this process's epoll sets: whether it did.
fn sets_come_to(want: impl Fn(&[u64]) -> bool) -> bool {
    let give_up = Instant::now() + Duration::from_secs(5);
    while Instant::now() < give_up {
        if want(&in_epoll_sets()) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

#[test]
fn a_listener_has_its_socket_in_an_epoll_set_only_while_it_waits_there() {
    // Every datagram that arrives at a socket in an epoll set visits the set, in the sender's
    // system call: a listener spinning on the socket has it out of them.
    for (spin, spinning) in [(Duration::from_secs(30), true), (Duration::ZERO, false)] {
        // One socket on the port (the default is one per CPU but one): the one the call reaches.
        let config = tiercel::ServerConfig { spin, sockets: 1, ..tiercel::ServerConfig::default() };
        let server = desk_server(config, &Arc::default());
        let inode = udp_socket_inode(server.addr().port());
        let desk: DeskClient = Client::connect(format!("udp://{}", server.addr())).unwrap().import().unwrap();
        assert_eq!(desk.quick().unwrap(), 0);
        // Before its first call the listener waited in its set; after it, it spins (30 s) or
        // waits again.
        let out = sets_come_to(|held| held.contains(&inode) != spinning);
        assert!(out, "spin {spin:?}: the socket is {} an epoll set", if spinning { "still in" } else { "not in" });
        // Calls go on being answered either way.
        for _ in 0..100 {
            assert_eq!(desk.quick().unwrap(), 0);
        }
        if !spinning {
            // A listener that does not spin waits first in its receive after calls (for up to a
            // tick of the kernel's clock, then in its set again): with the socket out of the set.
            // Looked at for 2 ms after each call, the socket is seen out at least once in 10 s of
            // calls (on a loaded machine the look itself may miss that millisecond many times).
            let mut seen_out = false;
            let give_up = Instant::now() + Duration::from_secs(10);
            while Instant::now() < give_up {
                assert_eq!(desk.quick().unwrap(), 0);
                let until = Instant::now() + Duration::from_millis(2);
                while !seen_out && Instant::now() < until {
                    seen_out = !in_epoll_sets().contains(&inode);
                }
                if seen_out {
                    break;
                }
            }
            assert!(seen_out, "a listener waiting in its receive left its socket in its epoll set for 10 s of calls");
        }
        drop(server);
    }
}
