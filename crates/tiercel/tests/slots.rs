//! A binding's client slots never make one call wait for another: a call after one its thread gave
//! up goes out on another slot at once, rather than behind the abandoned call the server still
//! runs; and more threads than the binding has slots take turns on them rather than being refused.
//! On every transport.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tiercel::{CallError, Client, Server, ServerConfig, Transport};

#[tiercel::interface]
pub trait Gate {
    /// Waits until the gate opens (or 20 s pass); returns `tag`.
    fn hold(&self, tag: u64) -> u64;
    fn add(&self, a: u64, b: u64) -> u64;
}

#[derive(Clone, Default)]
struct GateImpl {
    open: Arc<(Mutex<bool>, Condvar)>,
    held: Arc<AtomicU64>,
}

impl GateImpl {
    fn open(&self) {
        *self.open.0.lock().unwrap() = true;
        self.open.1.notify_all();
    }
}

impl Gate for GateImpl {
    fn hold(&self, tag: u64) -> u64 {
        self.held.fetch_add(1, Ordering::SeqCst);
        let open = self.open.0.lock().unwrap();
        let _open = self.open.1.wait_timeout_while(open, Duration::from_secs(20), |open| !*open).unwrap();
        tag
    }
    fn add(&self, a: u64, b: u64) -> u64 {
        a + b
    }
}

const TRANSPORTS: [(&str, Transport); 3] =
    [("udp://", Transport::Udp), ("shm:", Transport::SharedMemory), ("tcp://", Transport::Tcp)];

fn serve(config: ServerConfig) -> (tiercel::RunningServer, GateImpl) {
    let gate = GateImpl::default();
    let server =
        Server::bind("127.0.0.1:0").unwrap().with_config(config).export(GateServer::new(gate.clone())).start().unwrap();
    (server, gate)
}

#[test]
fn a_call_after_an_abandoned_one_goes_out_at_once_on_every_transport() {
    for (scheme, transport) in TRANSPORTS {
        let (server, gate) = serve(ServerConfig::default());
        let client: GateClient = Client::connect(format!("{scheme}{}", server.addr())).unwrap().import().unwrap();
        assert_eq!(client.binding().transport(), transport);
        assert_eq!(client.add(1, 1).unwrap(), 2);
        // Given up while the server runs it (and keeps running it: the gate is shut).
        let err = client.with_deadline(Duration::from_millis(100)).hold(1).unwrap_err();
        assert!(matches!(err, CallError::DeadlineExceeded { may_have_run: true }), "{transport:?}: {err}");
        assert_eq!(gate.held.load(Ordering::SeqCst), 1, "{transport:?}: the abandoned call runs");
        // The same thread's next calls are answered while the abandoned call still runs: they
        // would otherwise wait for the gate, which opens only after them (or fail at their
        // deadline, 10 s).
        let patient = client.with_deadline(Duration::from_secs(10));
        for i in 0..100 {
            assert_eq!(patient.add(i, 1).unwrap_or_else(|e| panic!("{transport:?}: call {i}: {e}")), i + 1);
        }
        // A second abandoned call, and a third: each leaves its slot to the server.
        for tag in [2, 3] {
            let err = client.with_deadline(Duration::from_millis(100)).hold(tag).unwrap_err();
            assert!(matches!(err, CallError::DeadlineExceeded { may_have_run: true }), "{transport:?}: {err}");
            assert_eq!(patient.add(tag, 1).unwrap_or_else(|e| panic!("{transport:?}: after {tag}: {e}")), tag + 1);
        }
        gate.open();
        // Once the gate opens, the abandoned calls end; the slots they held serve again.
        for i in 0..200 {
            assert_eq!(patient.add(i, 2).unwrap(), i + 2);
        }
        assert_eq!(gate.held.load(Ordering::SeqCst), 3, "{transport:?}: each abandoned call ran once");
        drop(client);
        drop(server);
    }
}

#[test]
fn more_threads_than_slots_take_turns_and_none_is_refused_on_every_transport() {
    // Eight slots, so that a test's threads outnumber them several times over.
    let config = ServerConfig { slots_per_binding: 8, ..ServerConfig::default() };
    for (scheme, transport) in TRANSPORTS {
        let (server, _) = serve(config.clone());
        let client: GateClient = Client::connect(format!("{scheme}{}", server.addr())).unwrap().import().unwrap();
        assert_eq!(client.binding().transport(), transport);
        let threads: Vec<_> = (0..40u64)
            .map(|t| {
                let client = client.clone();
                std::thread::spawn(move || {
                    for i in 0..50u64 {
                        match client.add(t << 32, i) {
                            Ok(sum) => assert_eq!(sum, (t << 32) + i),
                            Err(e) => panic!("{transport:?}: thread {t}, call {i}: {e}"),
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(server.stats().calls, 40 * 50, "{transport:?}: {}", server.stats());
        drop(client);
        drop(server);
    }
}

#[test]
fn a_hundred_threads_on_a_binding_of_64_slots_are_all_served() {
    let (server, _) = serve(ServerConfig::default());
    for (scheme, transport) in TRANSPORTS {
        let client: GateClient = Client::connect(format!("{scheme}{}", server.addr())).unwrap().import().unwrap();
        let threads: Vec<_> = (0..100u64)
            .map(|t| {
                let client = client.clone();
                std::thread::spawn(move || {
                    for i in 0..20u64 {
                        let sum = client.add(t, i).unwrap_or_else(|e| panic!("{transport:?}: thread {t}: {e}"));
                        assert_eq!(sum, t + i);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
    assert_eq!(server.stats().calls, 3 * 100 * 20);
}

#[cfg(feature = "async")]
#[test]
fn an_async_call_after_a_dropped_one_goes_out_at_once_on_every_transport() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        for (scheme, transport) in TRANSPORTS {
            let (server, gate) = serve(ServerConfig::default());
            let client: GateAsyncClient =
                Client::connect(format!("{scheme}{}", server.addr())).unwrap().import_async().await.unwrap();
            assert_eq!(client.add(1, 1).await.unwrap(), 2);
            // Dropped while the server runs it: its future is cancelled, the procedure runs on.
            let dropped = tokio::time::timeout(Duration::from_millis(100), client.hold(1)).await;
            assert!(dropped.is_err(), "{transport:?}: the held call returned");
            // One task's next calls are answered while the dropped call still runs (else they wait
            // for the gate, and time out here at 10 s).
            for i in 0..100 {
                let sum = tokio::time::timeout(Duration::from_secs(10), client.add(i, 1)).await;
                let sum = sum.unwrap_or_else(|_| panic!("{transport:?}: call {i} waited for the dropped one"));
                assert_eq!(sum.unwrap(), i + 1);
            }
            gate.open();
            for i in 0..100 {
                assert_eq!(client.add(i, 2).await.unwrap(), i + 2);
            }
            assert_eq!(gate.held.load(Ordering::SeqCst), 1);
            drop(client);
            drop(server);
        }
    });
}

#[test]
fn a_thread_finds_no_slot_while_idle_threads_hold_them_and_one_when_a_holder_ends() {
    let config = ServerConfig { slots_per_binding: 2, ..ServerConfig::default() };
    let timing = tiercel::Timing { dead_after: Duration::from_millis(300), ..tiercel::Timing::default() };
    let client_config = tiercel::ClientConfig { timing, ..tiercel::ClientConfig::default() };
    for (scheme, transport) in TRANSPORTS {
        let (server, _) = serve(config.clone());
        let client: GateClient = Client::connect(format!("{scheme}{}", server.addr()))
            .unwrap()
            .with_config(client_config.clone())
            .import()
            .unwrap();
        // Two threads take the two slots with a call each, then keep them, calling no more.
        let (release, holders): (Vec<_>, Vec<_>) = (0..2u64)
            .map(|t| {
                let client = client.clone();
                let (tx, rx) = std::sync::mpsc::channel::<()>();
                let (held_tx, held_rx) = std::sync::mpsc::channel();
                let holder = std::thread::spawn(move || {
                    assert_eq!(client.add(t, 1).unwrap(), t + 1);
                    held_tx.send(()).unwrap();
                    let _ = rx.recv();
                });
                held_rx.recv().unwrap();
                (tx, holder)
            })
            .unzip();
        // A third finds none handed over: without a deadline it says so after `dead_after`, with
        // one at its deadline; neither call went out.
        let err = client.add(1, 1).unwrap_err();
        assert!(matches!(err, CallError::NoFreeSlot(2)), "{transport:?}: {err}");
        assert_eq!(err.execution(), tiercel::Execution::NeverRan);
        let err = client.with_deadline(Duration::from_millis(100)).add(1, 1).unwrap_err();
        assert!(matches!(err, CallError::DeadlineExceeded { may_have_run: false }), "{transport:?}: {err}");
        // A holder ends: its slot is given back, and the waiting call takes it.
        let waiting = {
            let client = client.clone();
            std::thread::spawn(move || client.with_deadline(Duration::from_secs(10)).add(2, 2))
        };
        std::thread::sleep(Duration::from_millis(50));
        let mut release = release.into_iter();
        drop(release.next());
        assert_eq!(waiting.join().unwrap().unwrap_or_else(|e| panic!("{transport:?}: {e}")), 4);
        drop(release);
        for h in holders {
            h.join().unwrap();
        }
        assert_eq!(server.stats().calls, 3, "{transport:?}");
        drop(client);
        drop(server);
    }
}
