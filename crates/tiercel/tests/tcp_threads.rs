//! A TCP binding's threads: one while its calls are quick, more while slow ones run (so that they
//! hold up only their own callers), and back to one when the extra ones have had nothing to do for
//! a while; after bursts of a thousand async tasks; and the pool all connections share, which
//! they take turns on when more send than it has threads, also when some dribble their frames or
//! a thread waits in its read for a quiet client. Alone in their test binary, and one after
//! the other: they count this process's threads.

use std::time::{Duration, Instant};

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tiercel::{Client, In, Server, ServerConfig};
use tiercel_seeds::{self as seeds, SeedTest, TestClient, TestServer};

#[allow(dead_code)]
mod tcp_common;

/// Held by each test: they count the threads of the process.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Threads of this process serving TCP bindings (thread names are cut to 15 bytes), by id.
fn binding_thread_ids() -> Vec<std::ffi::OsString> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| {
            let t = t.ok()?;
            let name = std::fs::read_to_string(t.path().join("comm")).ok()?;
            (name.trim() == "tiercel-tcp-bin").then(|| t.file_name())
        })
        .collect()
}

fn binding_threads() -> usize {
    binding_thread_ids().len()
}

#[test]
fn extra_threads_come_for_slow_calls_and_go_when_idle() {
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    let server = Server::bind("127.0.0.1:0").unwrap().export(TestServer::new(SeedTest)).start().unwrap();
    let client: TestClient = Client::connect(format!("tcp://{}", server.addr())).unwrap().import().unwrap();
    for i in 0..1000 {
        assert_eq!(client.add(i, 1).unwrap(), i + 1);
    }
    assert_eq!(binding_threads(), 1, "quick calls, one thread");
    let slow: Vec<_> = (0..3)
        .map(|_| {
            let client = client.clone();
            std::thread::spawn(move || client.work(500_000))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(client.add(1, 1).unwrap(), 2);
    let during = binding_threads();
    for s in slow {
        s.join().unwrap().unwrap();
    }
    assert!(during >= 3, "{during} threads while three slow calls ran and a quick one was answered");
    assert!(during <= tiercel::ServerConfig::default().workers, "{during} threads: more than `workers`");
    let give_up = Instant::now() + Duration::from_secs(15);
    while binding_threads() > 1 {
        assert!(Instant::now() < give_up, "{} threads still, idle", binding_threads());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(client.add(2, 2).unwrap(), 4);
    drop(server);
}

#[cfg(feature = "async")]
#[tiercel::interface]
pub trait Adder {
    fn add(&self, a: u64, b: u64) -> u64;
}

#[cfg(feature = "async")]
struct Sum;

#[cfg(feature = "async")]
impl Adder for Sum {
    fn add(&self, a: u64, b: u64) -> u64 {
        a + b
    }
}

#[cfg(feature = "async")]
#[test]
fn after_bursts_of_a_thousand_tasks_a_binding_is_back_to_one_thread_on_every_transport() {
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(bursts());
}

#[cfg(feature = "async")]
async fn bursts() {
    // Bursts of 1,000 tasks calling at once on one binding once left a TCP binding serving one task
    // at 2-3% of its rate for seconds after. What a burst leaves behind is checked here: every call
    // answered once and right, the same binding all along, and the server's extra threads for the
    // connection gone, so that one task's calls are served as on a fresh binding (its rate, which
    // a test does not assert, is in the bench).
    let server = Server::bind("127.0.0.1:0").unwrap().export(AdderServer::new(Sum)).start().unwrap();
    for (scheme, transport) in [
        ("tcp://", tiercel::Transport::Tcp),
        ("udp://", tiercel::Transport::Udp),
        ("shm:", tiercel::Transport::SharedMemory),
    ] {
        let client: AdderAsyncClient =
            Client::connect(format!("{scheme}{}", server.addr())).unwrap().import_async().await.unwrap();
        let id = client.binding().id();
        for burst in 0..4u64 {
            let mut tasks = tokio::task::JoinSet::new();
            for t in 0..1000u64 {
                let client = client.clone();
                tasks.spawn(async move {
                    for i in 0..10u64 {
                        assert_eq!(client.add(burst << 32 | t, i).await.unwrap(), (burst << 32 | t) + i);
                    }
                });
            }
            while let Some(done) = tasks.join_next().await {
                done.unwrap_or_else(|e| panic!("{transport:?}: {e}"));
            }
            for i in 0..2000 {
                assert_eq!(client.add(i, 1).await.unwrap(), i + 1, "{transport:?}, after burst {burst}");
            }
        }
        assert_eq!(client.binding().id(), id, "{transport:?}: bound again");
        assert_eq!(client.binding().transport(), transport);
        if transport == tiercel::Transport::Tcp {
            let give_up = Instant::now() + Duration::from_secs(15);
            while binding_threads() > 1 {
                assert!(Instant::now() < give_up, "{} threads still, idle after the bursts", binding_threads());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            for i in 0..2000 {
                assert_eq!(client.add(i, 2).await.unwrap(), i + 2);
            }
            assert_eq!(binding_threads(), 1, "one task's calls served by one thread");
        }
    }
    assert_eq!(server.stats().calls, 3 * 4 * (10_000 + 2000) + 2000, "a call ran twice or never");
}

/// The most threads serving TCP connections seen at once while `f` runs, and how many different
/// ones were seen in all.
fn most_threads_while(f: impl FnOnce()) -> (usize, usize) {
    let stop = Arc::new(AtomicBool::new(false));
    let watch = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (mut most, mut seen) = (0, std::collections::HashSet::new());
            while !stop.load(Ordering::Relaxed) {
                let now = binding_thread_ids();
                most = most.max(now.len());
                seen.extend(now);
                std::thread::sleep(Duration::from_millis(1));
            }
            (most, seen.len())
        })
    };
    f();
    stop.store(true, Ordering::Relaxed);
    watch.join().unwrap()
}

fn serve_with_pool(threads: usize) -> tiercel::RunningServer {
    let config = ServerConfig { connection_threads: threads, ..ServerConfig::default() };
    Server::bind("127.0.0.1:0").unwrap().with_config(config).export(TestServer::new(SeedTest)).start().unwrap()
}

#[test]
fn more_connections_sending_than_the_pool_has_threads_take_turns() {
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    let server = serve_with_pool(3);
    let big: Arc<Vec<u8>> = Arc::new((0..256 << 10).map(seeds::pattern).collect());
    let clients: Vec<TestClient> = (0..12).map(|_| tcp_common::tcp(&server)).collect();
    let (most, seen) = most_threads_while(|| {
        let callers: Vec<_> = clients
            .iter()
            .enumerate()
            .map(|(t, client)| {
                let (client, big) = (client.clone(), big.clone());
                std::thread::spawn(move || {
                    for i in 0..300i32 {
                        assert_eq!(client.add(i, t as i32).unwrap(), i + t as i32);
                        if i % 100 == 0 {
                            client.bulk_in(In(&big)).unwrap();
                        }
                    }
                })
            })
            .collect();
        for c in callers {
            c.join().unwrap();
        }
    });
    assert!(most <= 3, "{most} threads served TCP connections, of a pool of 3");
    // Connections that come back for a thread find one of those that served before, lingering,
    // rather than a new one each time.
    assert!(seen <= 3, "{seen} threads started to serve TCP connections, for a pool of 3");
    assert_eq!(server.stats().calls, 12 * (300 + 3), "{}", server.stats());
    assert_eq!(server.bindings(), 12);
    drop(clients);
    drop(server);
}

#[test]
fn connections_that_dribble_their_frames_keep_no_one_waiting() {
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    use tiercel_proto::wire::{Header, Kind};
    let server = serve_with_pool(2);
    // Six bound connections each send the start of a call frame of 1,000 bytes, then a byte now
    // and then: each has bytes to read, and never a whole frame.
    let mut dribblers: Vec<_> = (0..6)
        .map(|_| {
            let (mut s, granted) = tcp_common::bind_raw(&server);
            let h = Header {
                binding: granted.binding,
                procedure: 1,
                incarnation: granted.incarnation,
                payload_len: 1000,
                message_len: 1000,
                ..Header::new(Kind::Call)
            };
            s.write_all(&tiercel_proto::stream::prefix(60 + 1000)).unwrap();
            s.write_all(&h.to_bytes()).unwrap();
            s.write_all(&[0; 10]).unwrap();
            s
        })
        .collect();
    let done = Arc::new(AtomicBool::new(false));
    let dribble = {
        let done = done.clone();
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                for s in &mut dribblers {
                    let _ = s.write_all(&[0]);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            dribblers
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    // A client's binds and calls, small and large, go on beside them.
    let (most, _) = most_threads_while(|| {
        let client = tcp_common::tcp(&server);
        for i in 0..200 {
            assert_eq!(client.add(i, 1).unwrap(), i + 1);
        }
        seeds::every_transport_serves(server.addr()).expect("a client beside connections dribbling frames");
    });
    done.store(true, Ordering::Relaxed);
    let dribblers = dribble.join().unwrap();
    assert!(most <= 2, "{most} threads served TCP connections, of a pool of 2");
    drop(server);
    drop(dribblers);
}

#[test]
fn a_thread_waiting_in_its_read_for_a_quiet_client_gives_way_to_another_connection() {
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    // One thread for every connection. A's thread, after its call, waits for A's next call in its
    // read (and then in `poll`, beside the pool's pressure): B's calls, coming at once and a while
    // later, find it there, and it gives its thread up to B; A, calling again, gets it back.
    let server = serve_with_pool(1);
    let (a, b) = (tcp_common::tcp(&server), tcp_common::tcp(&server));
    for round in 0..20 {
        assert_eq!(a.add(round, 1).unwrap(), round + 1);
        if round % 2 == 1 {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(b.add(round, 2).unwrap(), round + 2);
    }
    assert_eq!(server.stats().calls, 40, "{}", server.stats());
    assert!(binding_threads() <= 1, "a pool of one thread");
    drop((a, b));
    drop(server);
}
