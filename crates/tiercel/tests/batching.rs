//! Calls that queue at a UDP server are taken with one receive and their results sent together, and
//! a result held for the rest of such a batch never waits for a procedure that may be slow.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use tiercel::config::{ClientConfig, ServerConfig, Timing};
use tiercel::{Client, Server};

#[tiercel::interface]
pub trait Desk {
    /// Holds the worker until the test opens gate `which` (at most 10 s); returns whether it was opened.
    fn gate(&self, which: u32) -> bool;
    /// A quick call.
    fn add(&self, a: u64, b: u64) -> u64;
    /// Waits (at most 10 s) until the test says a quick call's result has reached its caller;
    /// returns whether it did. With `behind_marked`, a call that should have arrived behind
    /// `add(MARKED, _)`: if that call has not run, this one overtook it on its way (its thread
    /// sent first), so it returns at once and says so in `Flags::overtook`.
    fn after_quick_result(&self, behind_marked: bool) -> bool;
}

/// The first argument of the quick call that `after_quick_result(true)` should run behind.
const MARKED: u64 = 1000;

#[derive(Default)]
struct Flags {
    in_gate: AtomicU32,
    open: [AtomicBool; 2],
    quick_result_seen: AtomicBool,
    waiting_runs: AtomicBool,
    marked_ran: AtomicBool,
    overtook: AtomicBool,
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
        if a == MARKED {
            self.0.marked_ran.store(true, Ordering::Release);
        }
        a + b
    }
    fn after_quick_result(&self, behind_marked: bool) -> bool {
        // Never quick, even when the quick call's result was seen before it ran (in a round whose
        // calls were not received together) or it overtook the quick call: a worker that had seen
        // it finish within `QUICK_RUN` would hold the quick result across it, and it would wait
        // for that result in vain.
        std::thread::sleep(Duration::from_micros(200));
        if behind_marked && !self.0.marked_ran.load(Ordering::Acquire) {
            self.0.overtook.store(true, Ordering::Release);
            return true;
        }
        self.0.waiting_runs.store(true, Ordering::Release);
        wait_for(&self.0.quick_result_seen)
    }
}

/// A server of `workers` workers, and a client that does not retransmit within the tests' waits
/// (so that each call is one datagram in the server's socket).
fn setup(workers: usize) -> (tiercel::RunningServer, DeskClient, Arc<Flags>) {
    setup_spinning(workers, ServerConfig::default().spin)
}

/// [`setup`] with workers that spin `spin` past their last packet.
fn setup_spinning(workers: usize, spin: Duration) -> (tiercel::RunningServer, DeskClient, Arc<Flags>) {
    let flags = Arc::new(Flags::default());
    let config = ServerConfig { workers, spin, ..ServerConfig::default() };
    let server = Server::bind("udp://127.0.0.1:0")
        .unwrap()
        .with_config(config)
        .export(DeskServer::new(DeskImpl(flags.clone())))
        .start()
        .unwrap();
    let timing = Timing {
        retransmit_initial: Duration::from_millis(500),
        retransmit_min: Duration::from_millis(500),
        ..Timing::default()
    };
    let client = ClientConfig { timing, ..ClientConfig::default() };
    let desk: DeskClient =
        Client::connect(format!("udp://{}", server.addr()).as_str()).unwrap().with_config(client).import().unwrap();
    (server, desk, flags)
}

/// Starts a call of `gate(which)` and waits until a worker runs it.
fn hold_a_worker(desk: &DeskClient, flags: &Flags, which: u32) -> std::thread::JoinHandle<bool> {
    flags.open[which as usize].store(false, Ordering::Release);
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

/// A call one of the test's threads makes.
type Call<T> = Box<dyn FnOnce(&DeskClient) -> T + Send>;

/// Quick calls that lead a queue: the worker let go takes the first alone (after a slow call it
/// reads one datagram at a time) and, once it has handled one quickly, the rest of the queue with
/// one receive. Several, in case a preempted one looks slow.
const LEADS: u64 = 4;

/// Makes calls queue while `gates` workers are held, then lets the first go, then the others:
/// `LEADS` quick calls, then `rest` in order, each sent 2 ms after the one before. Returns the
/// results of the rest once all have returned.
fn queue_behind_gates<T: Send + 'static>(
    desk: &DeskClient,
    flags: &Flags,
    gates: u32,
    rest: Vec<Call<T>>,
    before_the_others: impl FnOnce(),
) -> Vec<T> {
    let leads: Vec<_> = (0..LEADS).map(|i| caller(desk, move |d| assert_eq!(d.add(i, 2).unwrap(), i + 2))).collect();
    let rest: Vec<_> = rest.into_iter().map(|call| caller(desk, call)).collect();
    let held: Vec<_> = (0..gates).map(|g| hold_a_worker(desk, flags, g)).collect();
    for go in leads.iter().map(|(go, _)| go).chain(rest.iter().map(|(go, _)| go)) {
        go.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    flags.open[0].store(true, Ordering::Release);
    let mut held = held.into_iter();
    assert!(held.next().unwrap().join().unwrap());
    before_the_others();
    for (g, gate) in held.enumerate() {
        flags.open[g + 1].store(true, Ordering::Release);
        assert!(gate.join().unwrap());
    }
    for (_, lead) in leads {
        lead.join().unwrap();
    }
    rest.into_iter().map(|(_, call)| call.join().unwrap()).collect()
}

/// Queues quick calls until their results have gone out together: the worker then knows `add` as
/// quick. At most ten rounds (a preempted run makes a call look slow).
fn batch_quick_calls(server: &tiercel::RunningServer, desk: &DeskClient, flags: &Flags, gates: u32) {
    for round in 0..10u64 {
        let rest: Vec<Call<u64>> =
            (0..6u64).map(|i| Box::new(move |d: &DeskClient| d.add(round, i).unwrap() - round - i) as _).collect();
        let sums = queue_behind_gates(desk, flags, gates, rest, || {});
        assert_eq!(sums, vec![0; 6]);
        if server.stats().sent_together >= 2 {
            return;
        }
    }
    panic!("no results went out together in ten rounds: {}", server.stats());
}

#[test]
fn calls_that_queue_are_received_together_and_their_results_sent_together() {
    let (server, desk, flags) = setup(1);
    batch_quick_calls(&server, &desk, &flags, 1);
    assert!(server.stats().batched >= 1, "no receive took several datagrams");
    assert!(server.stats().sent_together >= 2);
    assert_eq!(server.stats().malformed, 0);
}

#[test]
fn a_held_result_goes_out_before_a_procedure_not_known_to_be_quick_runs() {
    let (server, desk, flags) = setup(1);
    batch_quick_calls(&server, &desk, &flags, 1);
    // A quick call, then (behind it in the socket) a call whose procedure waits until the quick
    // call's result has reached its caller. Were that result held until the end of the batch, the
    // second procedure would wait for it in vain. Until the two are received together (a preempted
    // run makes the worker read one datagram at a time) and in that order (a thread preempted
    // for longer than the 2 ms between the sends sends after the one behind it; the second call
    // then finds the first has not run, and returns), at most ten rounds.
    for _ in 0..10 {
        flags.quick_result_seen.store(false, Ordering::Release);
        flags.marked_ran.store(false, Ordering::Release);
        flags.overtook.store(false, Ordering::Release);
        let f = flags.clone();
        let rest: Vec<Call<bool>> = vec![
            Box::new(move |d| {
                let sum = d.add(MARKED, 3).unwrap();
                f.quick_result_seen.store(true, Ordering::Release);
                sum == MARKED + 3
            }),
            Box::new(|d| d.after_quick_result(true).unwrap()),
        ];
        let batched = server.stats().batched;
        let results = queue_behind_gates(&desk, &flags, 1, rest, || {});
        assert!(results[0]);
        assert!(results[1], "the quick call's result waited for the procedure after it");
        if server.stats().batched > batched && !flags.overtook.load(Ordering::Acquire) {
            return;
        }
    }
    panic!("the calls were not received together and in order in ten rounds: {}", server.stats());
}

#[test]
fn a_call_behind_a_slow_one_in_a_batch_is_left_to_another_worker() {
    // Two workers, both held. Then a call whose procedure waits until a quick call's result has
    // reached its caller, and the quick call behind it. The first worker let go takes both with one
    // receive, and leaves the quick call to the other worker before it runs the waiting procedure.
    // (Were the quick call kept in its batch, the second worker, let go once that procedure runs,
    // would find nothing to answer until the quick call's retransmission.) Until the two are
    // received together, at most ten rounds.
    left_to_another_worker(setup(2));
}

#[test]
fn a_call_behind_a_slow_one_is_left_to_a_worker_blocked_in_its_receive() {
    // As above, with workers that never spin: a worker let go blocks at once, in a receive of the
    // socket (its first wait after calls), which a datagram handed over does not end (it is not in
    // the socket) but the receive's read timeout does, or parked as a worker standing by, which
    // the deputy wakes. Either way the datagram handed over is taken.
    left_to_another_worker(setup_spinning(2, Duration::ZERO));
}

fn left_to_another_worker((server, desk, flags): (tiercel::RunningServer, DeskClient, Arc<Flags>)) {
    batch_quick_calls(&server, &desk, &flags, 2);
    for _ in 0..10 {
        flags.quick_result_seen.store(false, Ordering::Release);
        flags.waiting_runs.store(false, Ordering::Release);
        let f = flags.clone();
        let rest: Vec<Call<bool>> = vec![
            Box::new(|d| d.after_quick_result(false).unwrap()),
            Box::new(move |d| {
                let sum = d.add(4, 5).unwrap();
                f.quick_result_seen.store(true, Ordering::Release);
                sum == 9
            }),
        ];
        let handed_off = server.stats().handed_off;
        let results = queue_behind_gates(&desk, &flags, 2, rest, || {
            assert!(wait_for(&flags.waiting_runs), "the waiting call never ran");
        });
        assert!(results[0], "the quick call waited behind the procedure before it");
        assert!(results[1]);
        if server.stats().handed_off > handed_off {
            return;
        }
    }
    panic!("nothing was left to the other worker in ten rounds: {}", server.stats());
}

/// Eight threads calling on one binding, each `calls` additions whose sums say whose they are, with
/// `config`; the binding's counters once all are back.
fn eight_threads(config: ClientConfig, calls: u64) -> (tiercel::RunningServer, tiercel::ClientStats) {
    let server =
        Server::bind("udp://127.0.0.1:0").unwrap().export(DeskServer::new(DeskImpl(Arc::default()))).start().unwrap();
    let desk: DeskClient =
        Client::connect(format!("udp://{}", server.addr()).as_str()).unwrap().with_config(config).import().unwrap();
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let desk = &desk;
            s.spawn(move || {
                for i in 0..calls {
                    assert_eq!(desk.add(t << 32, i).unwrap(), (t << 32) + i, "thread {t} got another's result");
                }
            });
        }
    });
    (server, desk.binding().stats())
}

#[test]
fn threads_sharing_a_binding_send_their_calls_together_and_each_gets_its_own_result() {
    // Batches form where the threads' calls meet; in so many calls they do (on any number of CPUs:
    // a call waits a few turns for those of the other threads waiting for their results).
    let (server, stats) = eight_threads(ClientConfig::default(), 3_000);
    assert!(stats.sent_together > 0, "no calls went out together: {stats:?}");
    assert!(stats.handed_over > 0, "no thread took another's result: {stats:?}");
    assert_eq!(stats.malformed, 0);
    let served = server.stats();
    assert!(served.sent_together > 0, "no results went back together: {served}");
    assert_eq!(served.malformed, 0);
}

#[test]
fn threads_that_do_not_spin_or_are_told_not_to_batch_keep_sockets_of_their_own() {
    use tiercel::config::Spin;
    for config in [
        ClientConfig { batch_threads: false, ..ClientConfig::default() },
        ClientConfig { spin: Spin::Never, ..ClientConfig::default() },
        ClientConfig { checksum: true, ..ClientConfig::default() },
    ] {
        let (_server, stats) = eight_threads(config.clone(), 300);
        assert_eq!((stats.sent_together, stats.handed_over), (0, 0), "{config:?}");
    }
}
