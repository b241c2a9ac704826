//! Calls that queue at a UDP server are taken with one receive and their results sent together, and
//! a result held for the rest of such a batch never waits for a procedure that may be slow.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use tiercel::config::ServerConfig;
use tiercel::{Client, Server};

#[tiercel::interface]
pub trait Desk {
    /// Holds the worker until the test opens gate `which` (at most 10 s); returns whether it was opened.
    fn gate(&self, which: u32) -> bool;
    /// A quick call.
    fn add(&self, a: u64, b: u64) -> u64;
    /// Waits (at most 10 s) until the test says a quick call's result has reached its caller;
    /// returns whether it did.
    fn after_quick_result(&self) -> bool;
}

#[derive(Default)]
struct Flags {
    in_gate: AtomicU32,
    open: [AtomicBool; 2],
    quick_result_seen: AtomicBool,
    waiting_runs: AtomicBool,
}

fn wait_for(flag: &AtomicBool) -> bool {
    let give_up = Instant::now() + Duration::from_secs(10);
    while !flag.load(Ordering::Acquire) {
        if Instant::now() > give_up {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

struct DeskImpl(Arc<Flags>);

impl Desk for DeskImpl {
    fn gate(&self, which: u32) -> bool {
        self.0.in_gate.fetch_add(1, Ordering::AcqRel);
        wait_for(&self.0.open[which as usize])
    }
    fn add(&self, a: u64, b: u64) -> u64 {
        a + b
    }
    fn after_quick_result(&self) -> bool {
        self.0.waiting_runs.store(true, Ordering::Release);
        wait_for(&self.0.quick_result_seen)
    }
}

/// A server of `workers` workers, and a client.
fn setup(workers: usize) -> (tiercel::RunningServer, DeskClient, Arc<Flags>) {
    let flags = Arc::new(Flags::default());
    let config = ServerConfig { workers, ..ServerConfig::default() };
    let server = Server::bind("udp://127.0.0.1:0")
        .unwrap()
        .with_config(config)
        .export(DeskServer::new(DeskImpl(flags.clone())))
        .start()
        .unwrap();
    let desk: DeskClient = Client::connect(format!("udp://{}", server.addr()).as_str()).unwrap().import().unwrap();
    (server, desk, flags)
}

/// Starts a call of `gate(which)` and waits until a worker runs it.
fn hold_a_worker(desk: &DeskClient, flags: &Flags, which: u32) -> std::thread::JoinHandle<bool> {
    let before = flags.in_gate.load(Ordering::Acquire);
    let d = desk.clone();
    let gate = std::thread::spawn(move || d.gate(which).unwrap());
    let give_up = Instant::now() + Duration::from_secs(10);
    while flags.in_gate.load(Ordering::Acquire) == before {
        assert!(Instant::now() < give_up, "the gate call never ran");
        std::thread::sleep(Duration::from_millis(1));
    }
    gate
}

/// A calling thread that has made one call already (a thread's first call proves its address to
/// the server first) and then makes `call` when told to.
fn caller<T: Send + 'static>(
    desk: &DeskClient,
    call: impl FnOnce(&DeskClient) -> T + Send + 'static,
) -> (mpsc::Sender<()>, std::thread::JoinHandle<T>) {
    let (go, told) = mpsc::channel();
    let (ready, warmed) = mpsc::channel();
    let d = desk.clone();
    let thread = std::thread::spawn(move || {
        assert_eq!(d.add(1, 1).unwrap(), 2);
        ready.send(()).unwrap();
        told.recv().unwrap();
        call(&d)
    });
    warmed.recv().unwrap();
    (go, thread)
}

#[test]
fn calls_that_queue_are_received_together_and_their_results_sent_together() {
    let (server, desk, flags) = setup(1);
    let stats = server.stats();
    // A quick procedure's result is held only once the worker has seen it run quickly, and a
    // preempted run can make it look slow: a few rounds at most.
    for round in 0..5u64 {
        let callers: Vec<_> = (0..8u64).map(|i| caller(&desk, move |d| (i, d.add(round, i).unwrap()))).collect();
        flags.open[0].store(false, Ordering::Release);
        let gate = hold_a_worker(&desk, &flags, 0);
        for (go, _) in &callers {
            go.send(()).unwrap();
        }
        // The eight calls are sent while the worker is held, and wait in the server's socket.
        std::thread::sleep(Duration::from_millis(20));
        flags.open[0].store(true, Ordering::Release);
        assert!(gate.join().unwrap());
        for (_, c) in callers {
            let (i, sum) = c.join().unwrap();
            assert_eq!(sum, round + i);
        }
        if stats.sent_together.load(Ordering::Relaxed) >= 2 {
            break;
        }
    }
    let batched = stats.batched.load(Ordering::Relaxed);
    let together = stats.sent_together.load(Ordering::Relaxed);
    assert!(batched >= 1, "no receive took several datagrams");
    assert!(together >= 2, "no results went out together ({batched} batched receives)");
    assert_eq!(stats.malformed.load(Ordering::Relaxed), 0);
}

#[test]
fn a_held_result_goes_out_before_a_procedure_not_known_to_be_quick_runs() {
    let (server, desk, flags) = setup(1);
    // A quick call, then (behind it in the socket) a call whose procedure waits until the quick
    // call's result has reached its caller. Were that result held until the end of the batch, the
    // second procedure would wait for it in vain.
    let f = flags.clone();
    let (go_quick, quick) = caller(&desk, move |d| {
        let sum = d.add(2, 3).unwrap();
        f.quick_result_seen.store(true, Ordering::Release);
        sum
    });
    let (go_waiting, waiting) = caller(&desk, |d| d.after_quick_result().unwrap());
    let gate = hold_a_worker(&desk, &flags, 0);
    go_quick.send(()).unwrap();
    // Less than the client's first retransmission timeout (20 ms): one datagram each.
    std::thread::sleep(Duration::from_millis(5));
    go_waiting.send(()).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    flags.open[0].store(true, Ordering::Release);
    assert!(gate.join().unwrap());
    assert_eq!(quick.join().unwrap(), 5);
    assert!(waiting.join().unwrap(), "the quick call's result waited for the procedure after it");
    assert!(server.stats().batched.load(Ordering::Relaxed) >= 1, "the two calls were not received together");
}

#[test]
fn a_call_behind_a_slow_one_in_a_batch_is_left_to_another_worker() {
    // Two workers, both held. Then a call whose procedure waits until a quick call's result has
    // reached its caller, and the quick call behind it. The first worker let go takes both with one
    // receive, and leaves the quick call to the other worker before it runs the waiting procedure.
    // (Were the quick call kept in its batch, the second worker, let go once that procedure runs,
    // would answer only the quick call's retransmission.)
    let (server, desk, flags) = setup(2);
    let f = flags.clone();
    let (go_quick, quick) = caller(&desk, move |d| {
        let sum = d.add(4, 5).unwrap();
        f.quick_result_seen.store(true, Ordering::Release);
        sum
    });
    let (go_waiting, waiting) = caller(&desk, |d| d.after_quick_result().unwrap());
    let first = hold_a_worker(&desk, &flags, 0);
    let second = hold_a_worker(&desk, &flags, 1);
    go_waiting.send(()).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    go_quick.send(()).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    flags.open[0].store(true, Ordering::Release);
    assert!(first.join().unwrap());
    assert!(wait_for(&flags.waiting_runs), "the waiting call never ran");
    flags.open[1].store(true, Ordering::Release);
    assert!(second.join().unwrap());
    assert_eq!(quick.join().unwrap(), 9);
    assert!(waiting.join().unwrap(), "the quick call waited behind the procedure before it");
    let stats = server.stats();
    assert!(stats.handed_off.load(Ordering::Relaxed) >= 1, "nothing was left to the other worker: {stats}");
}
