//! Deadlines travel with calls: a procedure sees its caller's deadline, a server does not start a
//! call whose deadline has passed or whose caller gave it up, and nothing runs twice.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tiercel::{CallError, Client, Server, ServerConfig, Transport};

#[tiercel::interface]
pub trait Timed {
    /// Milliseconds left to the caller's deadline as the procedure sees it, if it has one.
    fn left_ms(&self) -> Option<u64>;
    /// Sleeps `ms`, then records `tag` as run.
    fn work(&self, ms: u64, tag: u64) -> u64;
}

#[derive(Clone, Default)]
struct TimedImpl {
    ran: Arc<Mutex<HashSet<u64>>>,
}

impl Timed for TimedImpl {
    fn left_ms(&self) -> Option<u64> {
        tiercel::deadline().map(|d| d.saturating_duration_since(Instant::now()).as_millis() as u64)
    }
    fn work(&self, ms: u64, tag: u64) -> u64 {
        std::thread::sleep(Duration::from_millis(ms));
        assert!(self.ran.lock().unwrap().insert(tag), "call {tag} ran twice");
        tag
    }
}

fn serve() -> (tiercel::RunningServer, TimedImpl) {
    serve_with(ServerConfig::default())
}

fn serve_with(config: ServerConfig) -> (tiercel::RunningServer, TimedImpl) {
    let timed = TimedImpl::default();
    let server = Server::bind("127.0.0.1:0")
        .unwrap()
        .with_config(config)
        .export(TimedServer::new(timed.clone()))
        .start()
        .unwrap();
    (server, timed)
}

#[test]
fn a_procedure_sees_its_callers_deadline_on_either_transport() {
    let (server, _) = serve();
    for (scheme, transport) in
        [("udp://", Transport::Udp), ("shm:", Transport::SharedMemory), ("tcp://", Transport::Tcp)]
    {
        let client: TimedClient = Client::connect(format!("{scheme}{}", server.addr())).unwrap().import().unwrap();
        assert_eq!(client.binding().transport(), transport);
        assert_eq!(client.left_ms().unwrap(), None, "{transport:?}: no deadline, none seen");
        let left = client.with_deadline(Duration::from_secs(2)).left_ms().unwrap();
        let left = left.unwrap_or_else(|| panic!("{transport:?}: the deadline did not reach the procedure"));
        assert!((1000..=2000).contains(&left), "{transport:?}: {left} ms left of 2 s");
        // Back to no deadline on the same thread's slot.
        assert_eq!(client.left_ms().unwrap(), None);
    }
}

#[test]
fn a_shared_memory_call_whose_deadline_passes_while_it_waits_is_never_started() {
    // With one worker, one server thread serves a binding's slots in turn: while it runs a 600 ms
    // call, a call on another slot with a 100 ms deadline waits in its slot. Its caller gives up at
    // the deadline, and when the server reaches the slot it answers without running it.
    let (server, timed) = serve_with(ServerConfig { workers: 1, ..ServerConfig::default() });
    let client: TimedClient = Client::connect(format!("shm:{}", server.addr())).unwrap().import().unwrap();
    let slow = {
        let client = client.clone();
        std::thread::spawn(move || client.work(600, 1))
    };
    std::thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    let err = client.with_deadline(Duration::from_millis(100)).work(0, 2).unwrap_err();
    assert!(matches!(err, CallError::DeadlineExceeded { may_have_run: true }), "{err}");
    assert!(started.elapsed() < Duration::from_millis(400), "the caller waited for the slow call");
    assert_eq!(slow.join().unwrap().unwrap(), 1);
    // The next call on the abandoned slot waits for the server's answer to the abandoned call.
    assert_eq!(client.work(0, 3).unwrap(), 3);
    let ran = timed.ran.lock().unwrap().clone();
    assert_eq!(ran, HashSet::from([1, 3]), "the call given up before it started ran");
    let refused = server.stats().late + server.stats().cancelled;
    assert_eq!(refused, 1, "{}", server.stats());
}
