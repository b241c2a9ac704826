//! Graceful shutdown: started from another thread, it refuses new bindings and new calls, lets the
//! calls under way finish with their results delivered, and then the server stops; over UDP,
//! shared memory and TCP alike.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tiercel::{BindError, CallError, Client, ClientConfig, Execution, Server, Timing};

#[tiercel::interface]
pub trait Slow {
    fn sleep_ms(&self, ms: u64) -> u64;
    fn ping(&self) -> u64;
}

struct Sleeper(Arc<AtomicU64>);

impl Slow for Sleeper {
    fn sleep_ms(&self, ms: u64) -> u64 {
        std::thread::sleep(Duration::from_millis(ms));
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }
    fn ping(&self) -> u64 {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }
}

#[test]
fn calls_under_way_finish_and_new_ones_are_refused() {
    for transport in ["udp://", "shm:", "tcp://"] {
        let ran = Arc::new(AtomicU64::new(0));
        let server =
            Server::bind("udp://127.0.0.1:0").unwrap().export(SlowServer::new(Sleeper(ran.clone()))).start().unwrap();
        let addr = format!("{transport}{}", server.addr());
        // Clients that give up quickly on a server that refuses them.
        let quick = ClientConfig {
            timing: Timing { dead_after: Duration::from_millis(400), ..Timing::default() },
            ..ClientConfig::default()
        };
        let early: SlowClient = Client::connect(addr.as_str()).unwrap().with_config(quick.clone()).import().unwrap();
        let slow: SlowClient = Client::connect(addr.as_str()).unwrap().import().unwrap();
        let under_way = std::thread::spawn(move || slow.sleep_ms(1200));
        std::thread::sleep(Duration::from_millis(150));
        let handle = server.shutdown_handle();
        handle.shutdown();
        // New bindings are refused at once.
        let err = Client::connect(addr.as_str()).unwrap().import::<SlowClient>().map(drop).unwrap_err();
        assert!(matches!(err, BindError::Busy), "{transport}: {err:?}");
        // A new call on an existing binding is refused as busy, sent again after a backoff until
        // its client gives up (`dead_after` of refusals, on every transport), and never runs: the
        // endpoint decides so for every transport. Over UDP an earlier copy could have been
        // taken, for all its client knows; elsewhere each was refused unread.
        let asked = std::time::Instant::now();
        let err = early.ping().unwrap_err();
        assert!(asked.elapsed() >= Duration::from_millis(400), "{transport}: given up before dead_after");
        let may_have_run = transport == "udp://";
        assert!(matches!(err, CallError::Overloaded { may_have_run: m } if m == may_have_run), "{transport}: {err:?}");
        let execution = if may_have_run { Execution::MayHaveRun } else { Execution::NeverRan };
        assert_eq!(err.execution(), execution, "{transport}");
        assert!(server.stats().busy > 1, "{transport}: the refused call was sent again");
        // The call under way finishes and its result is delivered.
        assert_eq!(under_way.join().unwrap().unwrap(), 1, "{transport}: the call under way ran, alone");
        server.wait();
        assert_eq!(ran.load(Ordering::SeqCst), 1, "{transport}: nothing else ran");
    }
}

#[test]
fn stop_returns_once_the_calls_under_way_do_not_after_a_listeners_period() {
    // `RunningServer::stop` says it returns about 100 ms after the procedures running return. The
    // listeners of shared memory and TCP wait in their socket for up to a heartbeat (a second over
    // TCP, when no binding is in use) between looks; stopping must end that wait, not sit it out.
    let quick = ClientConfig {
        timing: Timing { dead_after: Duration::from_millis(400), ..Timing::default() },
        ..ClientConfig::default()
    };
    for transports in [&[][..], &["udp://"], &["shm:"], &["tcp://"], &["udp://", "shm:", "tcp://"]] {
        let server = Server::bind("udp://127.0.0.1:0")
            .unwrap()
            .export(SlowServer::new(Sleeper(Default::default())))
            .start()
            .unwrap();
        let clients: Vec<SlowClient> = transports
            .iter()
            .map(|transport| {
                let addr = format!("{transport}{}", server.addr());
                Client::connect(addr.as_str()).unwrap().with_config(quick.clone()).import().unwrap()
            })
            .collect();
        for client in &clients {
            client.ping().unwrap();
        }
        // Every listener is now inside a wait it began after the last call.
        std::thread::sleep(Duration::from_millis(100));
        let stopping = std::time::Instant::now();
        server.stop();
        let took = stopping.elapsed();
        assert!(took < Duration::from_millis(500), "{transports:?}: stop took {took:?}, with no call under way");
        // The clients see a server that is gone.
        for client in &clients {
            assert!(client.ping().is_err(), "{transports:?}");
        }
    }
}
