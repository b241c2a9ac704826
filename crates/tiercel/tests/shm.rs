//! Calls through shared memory, server and client in one process (`tiercel-cli/tests/shm.rs` runs
//! them across processes): the transport chosen at bind time, every `Test` procedure and a kitchen
//! sink of types, 1 to 8 threads on one binding, large buffers, errors, deadlines, secrets, and a
//! server that goes away.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tiercel::{
    BindError, CallError, Client, ClientConfig, Error, Execution, In, InOut, Out, Secret, Server, ServerConfig, Timing,
    Transport,
};
use tiercel_seeds::{self as seeds, SeedTest, TestClient, TestServer};

#[tiercel::interface]
pub trait Store {
    fn put(&self, key: String, value: Vec<u8>) -> usize;
    fn echo(&self, data: In<&[u8]>, out: Out<&mut [u8]>, both: InOut<&mut [u8]>) -> u64;
    fn nested(&self, v: Vec<Option<(u32, String)>>) -> Result<u32, String>;
    fn sleep_ms(&self, ms: u64);
    fn boom(&self);
    /// Xors every byte of `both` with `key`; returns the sum of its bytes before. Panics when `key`
    /// is 0. (Its one buffer an `InOut` and its last argument: the client lends it to the call.)
    fn flip(&self, key: u8, both: InOut<&mut [u8]>) -> u64;
}

struct StoreImpl;

impl Store for StoreImpl {
    fn put(&self, key: String, value: Vec<u8>) -> usize {
        key.len() + value.len()
    }
    fn echo(&self, data: In<&[u8]>, out: Out<&mut [u8]>, both: InOut<&mut [u8]>) -> u64 {
        let n = out.0.len().min(data.0.len());
        out.0[..n].copy_from_slice(&data.0[..n]);
        both.0.iter_mut().for_each(|b| *b = !*b);
        data.0.iter().map(|&b| b as u64).sum()
    }
    fn nested(&self, v: Vec<Option<(u32, String)>>) -> Result<u32, String> {
        if v.is_empty() {
            return Err("empty".into());
        }
        Ok(v.iter().flatten().map(|(n, s)| n + s.len() as u32).sum())
    }
    fn sleep_ms(&self, ms: u64) {
        std::thread::sleep(Duration::from_millis(ms));
    }
    fn boom(&self) {
        panic!("boom on purpose");
    }
    fn flip(&self, key: u8, both: InOut<&mut [u8]>) -> u64 {
        assert!(key != 0, "told to panic");
        let sum = both.0.iter().map(|&b| b as u64).sum();
        both.0.iter_mut().for_each(|b| *b ^= key);
        sum
    }
}

fn server_with(config: ServerConfig) -> tiercel::RunningServer {
    Server::bind("udp://127.0.0.1:0")
        .unwrap()
        .with_config(config)
        .export(TestServer::new(SeedTest))
        .export(StoreServer::new(StoreImpl))
        .start()
        .unwrap()
}

fn server() -> tiercel::RunningServer {
    server_with(ServerConfig::default())
}

#[test]
fn a_plain_address_on_this_host_binds_through_shared_memory() {
    let s = server();
    let plain: TestClient = Client::connect(s.addr()).unwrap().import().unwrap();
    assert_eq!(plain.binding().transport(), Transport::SharedMemory);
    let forced: TestClient = Client::connect(format!("shm:{}", s.addr())).unwrap().import().unwrap();
    assert_eq!(forced.binding().transport(), Transport::SharedMemory);
    let udp: TestClient = Client::connect(format!("udp://{}", s.addr())).unwrap().import().unwrap();
    assert_eq!(udp.binding().transport(), Transport::Udp);
    let config = ClientConfig { shared_memory: false, ..ClientConfig::default() };
    let declined: TestClient = Client::connect(s.addr()).unwrap().with_config(config).import().unwrap();
    assert_eq!(declined.binding().transport(), Transport::Udp);
    for c in [&plain, &forced, &udp, &declined] {
        seeds::check_all(c, 3).unwrap();
    }
    assert_eq!(s.bindings(), 4);
}

#[test]
fn a_server_without_shared_memory_is_reached_over_udp_unless_shm_is_forced() {
    let s = server_with(ServerConfig { shared_memory: false, ..ServerConfig::default() });
    let plain: TestClient = Client::connect(s.addr()).unwrap().import().unwrap();
    assert_eq!(plain.binding().transport(), Transport::Udp);
    let err = Client::connect(format!("shm:{}", s.addr())).unwrap().import::<TestClient>().unwrap_err();
    assert!(matches!(err, BindError::NoSharedMemory(_)), "{err}");
    assert_eq!(Error::from(err).execution(), Execution::NeverRan);
}

#[test]
fn every_procedure_and_type_round_trips() {
    let s = server();
    let t: TestClient = Client::connect(s.addr()).unwrap().import().unwrap();
    for round in 0..1000 {
        seeds::check_all(&t, round).unwrap();
    }
    let k: StoreClient = Client::connect(s.addr()).unwrap().import().unwrap();
    assert_eq!(k.put("key".into(), vec![1; 10]).unwrap(), 13);
    assert_eq!(k.nested(vec![Some((1, "ab".into())), None, Some((2, String::new()))]).unwrap(), Ok(5));
    assert_eq!(k.nested(vec![]).unwrap(), Err("empty".into()));
    assert_eq!(s.stats().calls, 1000 * seeds::CHECK_CALLS + 3);
}

#[test]
fn large_buffers_up_to_the_message_limit() {
    let s = server();
    let k: StoreClient = Client::connect(s.addr()).unwrap().import().unwrap();
    for size in [0, 1, 4095, 4096, 1 << 20, 4 << 20] {
        let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let mut out = vec![0u8; size];
        let mut both: Vec<u8> = (0..size).map(|i| (i % 7) as u8).collect();
        let sum = k.echo(In(&data), Out(&mut out), InOut(&mut both)).unwrap();
        assert_eq!(sum, data.iter().map(|&b| b as u64).sum::<u64>());
        assert_eq!(out, data, "{size} bytes out");
        assert!(both.iter().enumerate().all(|(i, &b)| b == !((i % 7) as u8)), "{size} bytes in-out");
    }
    let too_big = vec![0u8; tiercel::config::MAX_MESSAGE + 1];
    let err = k.echo(In(&too_big), Out(&mut []), InOut(&mut [])).unwrap_err();
    assert!(matches!(err, CallError::TooLarge(_)), "{err}");
    assert_eq!(err.execution(), Execution::NeverRan);
}

#[test]
fn a_lent_in_out_buffer_receives_its_result_straight_from_the_slot() {
    // `flip` takes its one buffer, an `InOut`, last: the stub lends the caller's buffer to the
    // call, which is copied into the slot from it, and the result's bytes are copied from the slot
    // straight into it (not through the private copy of the result). The server runs a large
    // call on its private copy of the arguments and publishes the result from there.
    let s = server();
    let k: StoreClient = Client::connect(s.addr()).unwrap().import().unwrap();
    assert_eq!(k.binding().transport(), tiercel::Transport::SharedMemory);
    let in_place = || k.binding().stats().in_place;
    let sum = |b: &[u8]| b.iter().map(|&x| x as u64).sum::<u64>();
    let mut expected = Vec::new();
    for (i, size) in [16 << 20, 3, 1 << 20, 0].into_iter().enumerate() {
        let mut both: Vec<u8> = (0..size).map(|j| (j % 249) as u8).collect();
        expected.clone_from(&both);
        let key = 0x5a ^ i as u8;
        assert_eq!(k.flip(key, InOut(&mut both)).unwrap(), sum(&expected), "{size} bytes");
        expected.iter_mut().for_each(|b| *b ^= key);
        assert!(both == expected, "{size} bytes: the buffer came back changed by the procedure");
        assert_eq!(in_place(), i as u64 + 1, "{size} bytes: copied from the slot into the buffer");
        if size == 16 << 20 {
            // The server holds the slot's pages and its copy of the arguments, the return value
            // appended to it: no result buffer of its own, and no copy grown to twice the size.
            let held = s.message_memory();
            assert!(held <= 2 * size + (1 << 20), "{held} bytes held after a {size}-byte call");
        }
    }
    // The server ran the large calls on its copy of their arguments, and published their results
    // from there.
    let ran_in_place = || s.stats().in_place;
    assert_eq!(ran_in_place(), 2, "the 16 MiB and 1 MiB calls");
    // A failed call leaves the buffer as it was, and the next one goes on.
    let mut both: Vec<u8> = (0..1 << 20).map(|j| (j % 13) as u8).collect();
    let unchanged = both.clone();
    match k.flip(0, InOut(&mut both)) {
        Err(CallError::Panicked(m)) => assert!(m.contains("told to panic"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(both == unchanged, "a failed call's buffer is untouched");
    assert_eq!(ran_in_place(), 2, "a call that failed sent no result from its arguments");
    let mut small = [1u8, 2, 3];
    assert_eq!(k.flip(1, InOut(&mut small)).unwrap(), 6);
    assert_eq!(small, [0, 3, 2]);
    assert_eq!(in_place(), 5);
    assert_eq!(k.flip(2, InOut(&mut both)).unwrap(), sum(&unchanged));
    assert!(both.iter().zip(&unchanged).all(|(&b, &u)| b == u ^ 2));
    assert_eq!((in_place(), ran_in_place()), (6, 3));
}

#[test]
fn large_results_between_large_arguments_keep_the_slot_pages() {
    // Large `Out` results alternating with large `In` arguments grow both of the server thread's
    // private buffers, which with the slot's pages take the binding past three quarters of its
    // budget. The server gives back the buffer each call left unused, not the slot's pages, which
    // both processes would fault in anew on the next call: those go back at most once a second.
    let size = 2 << 20;
    let s = server_with(ServerConfig { binding_memory: 8 << 20, ..ServerConfig::default() });
    let t: TestClient = Client::connect(s.addr()).unwrap().import().unwrap();
    assert_eq!(t.binding().transport(), Transport::SharedMemory);
    let mut out = vec![0u8; size];
    let mut data = vec![0u8; size];
    seeds::fill(&mut data);
    let given_back = || s.stats().given_back;
    let started = Instant::now();
    let pairs = 12;
    for i in 0..pairs {
        out.fill(0);
        t.big_out(Out(&mut out)).unwrap();
        assert!(seeds::check(&out), "call {i}: the result holds the pattern");
        t.big_in(In(&data)).unwrap();
        assert!(s.message_memory() <= 8 << 20, "{} bytes held", s.message_memory());
    }
    let seconds = started.elapsed().as_secs() as usize;
    // Each period may give a slot's pages back once (the arguments' pages, and a page of their
    // length's): after the first large call, and once more for each second the calls took.
    assert!(
        given_back() <= ((1 + seconds) * (size + (64 << 10))) as u64,
        "{} bytes given back in {pairs} pairs of calls over {seconds} s",
        given_back()
    );
    assert!(pairs > 2 * (1 + seconds), "the calls took too long ({seconds} s) to tell");
}

#[test]
fn results_read_in_other_slots_make_room_for_the_next_call() {
    // Four threads, alive together (each holds a slot), take a 2 MiB result in turn. A slot keeps
    // the pages of a result its client has read (its state stays RESULT until the next call), and a
    // binding of 5 MiB has room for the server's private copy of one such result and one slot's
    // pages: each call after the first fits only once the server stops mapping the earlier slots'
    // pages, which it may because their results were read (one not read stays charged, see
    // tiercel-cli's `unread_maximum_size_calls_on_every_slot_hold_no_more_than_the_budget`).
    let size = 2 << 20;
    let threads = 4;
    let s = server_with(ServerConfig { binding_memory: 5 << 20, ..ServerConfig::default() });
    let t: TestClient = Client::connect(s.addr()).unwrap().import().unwrap();
    assert_eq!(t.binding().transport(), Transport::SharedMemory);
    // Held while the threads call: each waits for it once its call is done, keeping its slot.
    let gate = std::sync::Mutex::new(());
    let (done, called) = std::sync::mpsc::channel();
    let mut results = Vec::new();
    std::thread::scope(|scope| {
        let closed = gate.lock().unwrap();
        for _ in 0..threads {
            let (t, done, gate) = (&t, done.clone(), &gate);
            scope.spawn(move || {
                let mut out = vec![0u8; size];
                let result = t.big_out(Out(&mut out));
                done.send(result.map(|_| seeds::check(&out))).unwrap();
                drop(gate.lock());
            });
            results.push((called.recv().unwrap(), s.message_memory()));
        }
        drop(closed);
    });
    for (i, (result, held)) in results.into_iter().enumerate() {
        assert!(matches!(result, Ok(true)), "thread {i}'s call: {result:?}");
        assert!(held <= 5 << 20, "after thread {i}'s call, {held} bytes held");
    }
}

#[test]
fn calls_published_without_a_fence_wake_a_server_that_sleeps_between_them() {
    // A server that spins 20 µs after each call, then sleeps on the doorbell: the calls below, 500
    // µs apart, find it asleep; those 30 µs apart, on its way there. Its region says that its
    // threads issue a system-wide barrier before they sleep, so this client (whose process
    // receives them) publishes its calls with a compiler fence only. What can fail here is that
    // setup (the header's word, the registration) and the calls' results: a wake-up lost would only
    // make a call wait out the server's sleep (100 ms), not fail it. That none is lost is loom's to
    // check (`loom_shm.rs`).
    let spin = Duration::from_micros(20);
    let s = server_with(ServerConfig { spin, adaptive_spin: false, ..ServerConfig::default() });
    let peek = hostile::Hostile::bind(s.rendezvous().expect("the server takes shared-memory clients"));
    assert!(tiercel_sys::shm::barriers_available(), "this kernel has membarrier's GLOBAL_EXPEDITED");
    assert_eq!(
        peek.word(tiercel_proto::shm::header::SERVER_BARRIER).load(Ordering::Relaxed),
        1,
        "the server says that it issues the barrier"
    );
    assert!(tiercel_sys::shm::receive_barriers(), "this process receives the server's barriers");
    calls_wake_a_sleeping_server(&s);
}

#[test]
fn a_server_that_never_spins_issues_no_barrier_and_its_clients_fence_themselves() {
    // It sleeps after every call: a system-wide barrier before each sleep would cost every call a
    // system call, where a fence costs the client a few cycles. Its region says so, and its clients'
    // calls, published with a full fence, wake it each time.
    let s = server_with(ServerConfig { spin: Duration::ZERO, adaptive_spin: false, ..ServerConfig::default() });
    let peek = hostile::Hostile::bind(s.rendezvous().expect("the server takes shared-memory clients"));
    assert_eq!(
        peek.word(tiercel_proto::shm::header::SERVER_BARRIER).load(Ordering::Relaxed),
        0,
        "the server says that it issues no barrier"
    );
    calls_wake_a_sleeping_server(&s);
}

/// Calls over shared memory to `s` (whose binding's thread sleeps between them), each with the
/// right result.
fn calls_wake_a_sleeping_server(s: &tiercel::RunningServer) {
    let client: TestClient = Client::connect(format!("shm:{}", s.addr())).unwrap().import().unwrap();
    assert_eq!(client.binding().transport(), Transport::SharedMemory);
    for i in 0..200 {
        // Long enough for the server's thread to be asleep, or on its way, when the call comes.
        std::thread::sleep(Duration::from_micros(if i % 2 == 0 { 500 } else { 30 }));
        assert_eq!(client.add(i, 1).unwrap(), i + 1);
    }
}

#[test]
fn a_client_gone_with_a_call_published_is_forgotten() {
    // The server asks whether a binding's client is still there only when it wakes and finds no
    // call: a client that published a call and went is served, then seen gone at the next wake.
    let s = server();
    let h = hostile::Hostile::bind(s.rendezvous().unwrap());
    assert_eq!(s.bindings(), 1);
    let base = h.layout.slot(0);
    use tiercel_proto::shm::{header, slot};
    h.word(base + slot::PROCEDURE).store(0, Ordering::Relaxed);
    h.word(base + slot::LEN).store(0, Ordering::Relaxed);
    h.word(header::SLOTS_USED).store(1, Ordering::SeqCst);
    tiercel_proto::shm::client_publish(
        h.word(base + slot::STATE),
        h.word(header::SERVER_SLEEPING),
        h.word(header::DOORBELL),
    );
    tiercel_sys::shm::futex_wake(h.word(header::DOORBELL), 1);
    drop(h);
    let start = Instant::now();
    while s.bindings() > 0 {
        assert!(start.elapsed() < Duration::from_secs(2), "the binding of a client gone not freed");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(s.stats().expired, 1);
    assert_eq!(s.stats().calls, 1, "its call was served");
}

#[test]
fn a_helper_that_ran_a_slow_call_sleeps_on_the_doorbell_for_a_while_then_parks() {
    // Two calls of 20 ms of CPU at once: the binding's thread runs one, and the rendezvous thread,
    // seeing the other wait, starts a helper for it. With spinning off, the binding's thread sleeps
    // on the region's doorbell as soon as its call is done. The helper, whose call was slow, sleeps
    // there too, so that a call that comes soon wakes it at once, but only for the server's
    // `MAX_LOOK` (8 ms) after its call; then it parks on the team's own futex, which no call
    // rings: the doorbell has two sleepers for those 8 ms, then one again.
    use tiercel_proto::shm::{client_done, client_publish, header, slot};
    const WORK: u32 = 16; // Test::work(micros)
    let s = server_with(ServerConfig { spin: Duration::ZERO, adaptive_spin: false, ..ServerConfig::default() });
    let h = hostile::Hostile::bind(s.rendezvous().unwrap());
    let sleepers = || h.word(header::SERVER_SLEEPING).load(Ordering::SeqCst);
    // A round whose watch starts after the 8 ms are over (a busy machine) sees one sleeper only:
    // it tries again.
    let mut most = 0;
    for _ in 0..10 {
        h.word(header::SLOTS_USED).store(2, Ordering::SeqCst);
        for i in 0..2 {
            let base = h.layout.slot(i);
            h.word(base + slot::PROCEDURE).store(WORK, Ordering::Relaxed);
            h.word(base + slot::LEN).store(4, Ordering::Relaxed);
            h.word(h.layout.data(i)).store(20_000, Ordering::Relaxed);
            if client_publish(h.word(base + slot::STATE), h.word(header::SERVER_SLEEPING), h.word(header::DOORBELL)) {
                tiercel_sys::shm::futex_wake(h.word(header::DOORBELL), 1);
            }
        }
        let start = Instant::now();
        while !(0..2).all(|i| client_done(h.word(h.layout.slot(i) + slot::STATE))) {
            assert!(start.elapsed() < Duration::from_secs(5), "the server stopped answering");
            std::thread::yield_now();
        }
        for i in 0..2 {
            let status = h.word(h.layout.slot(i) + slot::STATUS).load(Ordering::Relaxed);
            let status = tiercel_proto::wire::Status::from_u8(status as u8);
            assert_eq!(status, Some(tiercel_proto::wire::Status::Ok), "call {i} ran");
        }
        let watch = Instant::now();
        while most < 2 && watch.elapsed() < Duration::from_millis(50) {
            most = most.max(sleepers());
            std::hint::spin_loop();
        }
        if most == 2 {
            break;
        }
    }
    assert_eq!(most, 2, "a helper that ran a slow call sleeps on the doorbell beside the binding's thread");
    let start = Instant::now();
    while sleepers() != 1 {
        assert!(start.elapsed() < Duration::from_secs(2), "the helper stayed on the doorbell: {}", sleepers());
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn one_to_eight_threads_share_a_binding() {
    let s = server();
    let t: TestClient = Client::connect(s.addr()).unwrap().import().unwrap();
    for threads in [1u32, 2, 4, 8] {
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                let t = t.clone();
                std::thread::spawn(move || {
                    for round in 0..300 {
                        seeds::check_all(&t, round * (i + 1)).unwrap();
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }
    assert_eq!(s.stats().calls, seeds::CHECK_CALLS * 300 * (1 + 2 + 4 + 8));
}

#[test]
fn errors_are_clear_and_say_whether_the_procedure_ran() {
    let s = server();
    let k: StoreClient = Client::connect(s.addr()).unwrap().import().unwrap();
    let err = k.boom().unwrap_err();
    assert!(matches!(&err, CallError::Panicked(m) if m.contains("boom on purpose")), "{err}");
    assert_eq!(err.execution(), Execution::Ran);
    assert_eq!(k.put("still".into(), vec![]).unwrap(), 5, "the server goes on after a panic");
    let slow = k.with_deadline(Duration::from_millis(50));
    let start = Instant::now();
    let err = slow.sleep_ms(400).unwrap_err();
    assert!(matches!(err, CallError::DeadlineExceeded { .. }), "{err}");
    assert!(start.elapsed() < Duration::from_millis(350), "the deadline is kept");
    // The abandoned call still finishes on the server; the next call on this thread goes out on
    // another slot.
    assert_eq!(k.put("after".into(), vec![1]).unwrap(), 6);
}

#[test]
fn a_call_behind_an_abandoned_one_keeps_its_own_deadline_and_never_went_out() {
    // One slot: no other to leave the abandoned call's to (`tests/slots.rs` has the usual case,
    // where the next call goes out at once on another).
    let s = server_with(ServerConfig { slots_per_binding: 1, ..ServerConfig::default() });
    let k: StoreClient = Client::connect(s.addr()).unwrap().import().unwrap();
    let err = k.with_deadline(Duration::from_millis(50)).sleep_ms(1000).unwrap_err();
    assert!(matches!(err, CallError::DeadlineExceeded { may_have_run: true }), "{err}");
    assert_eq!(err.execution(), Execution::MayHaveRun);
    // The abandoned call holds the binding's one slot for most of a second yet: the next call's
    // own 100-ms deadline passes first (before: it waited for the abandoned one, then ran), and it
    // says that it never went out.
    let err = k.with_deadline(Duration::from_millis(100)).put("x".into(), vec![]).unwrap_err();
    assert!(matches!(err, CallError::DeadlineExceeded { may_have_run: false }), "{err}");
    assert_eq!(err.execution(), Execution::NeverRan);
    // Without a deadline, the next call waits for the slot and runs.
    assert_eq!(k.put("after".into(), vec![1]).unwrap(), 6);
}

#[test]
fn secrets_are_proven_over_shared_memory_too() {
    let secret = || Some(Secret::new(&[5; 32]).unwrap());
    let s = server_with(ServerConfig { secret: secret(), ..ServerConfig::default() });
    let config = ClientConfig { secret: secret(), ..ClientConfig::default() };
    let ok: TestClient = Client::connect(s.addr()).unwrap().with_config(config).import().unwrap();
    assert_eq!(ok.binding().transport(), Transport::SharedMemory);
    seeds::check_all(&ok, 1).unwrap();
    let err = Client::connect(s.addr()).unwrap().import::<TestClient>().unwrap_err();
    assert!(matches!(err, BindError::AuthenticationRequired), "{err}");
    let wrong = ClientConfig { secret: Some(Secret::new(&[6; 32]).unwrap()), ..ClientConfig::default() };
    let err = Client::connect(s.addr()).unwrap().with_config(wrong).import::<TestClient>().unwrap_err();
    assert!(matches!(err, BindError::AuthenticationFailed(_)), "{err}");
    assert_eq!(s.stats().auth_failed, 1);
}

#[test]
fn a_stopped_server_fails_the_call_in_progress_clearly() {
    let s = server();
    let k: StoreClient = Client::connect(s.addr()).unwrap().import().unwrap();
    k.put("warm".into(), vec![]).unwrap();
    let caller = std::thread::spawn(move || {
        let start = Instant::now();
        (k.sleep_ms(300), start.elapsed())
    });
    std::thread::sleep(Duration::from_millis(50));
    drop(s); // stops the binding threads once the running call returns
    let (result, took) = caller.join().unwrap();
    // The running procedure finished before its thread saw the stop, so the call either completed or
    // failed as "server gone"; it never hangs.
    match result {
        Ok(()) => {}
        Err(e) => {
            assert!(matches!(e, CallError::ServerGone { .. }), "{e}");
            assert_eq!(e.execution(), Execution::MayHaveRun);
        }
    }
    assert!(took < Duration::from_secs(5));
}

#[test]
fn a_dropped_client_frees_its_binding() {
    let s = server();
    let t: TestClient = Client::connect(s.addr()).unwrap().import().unwrap();
    seeds::check_all(&t, 0).unwrap();
    assert_eq!(s.bindings(), 1);
    drop(t);
    let start = Instant::now();
    while s.bindings() > 0 {
        assert!(start.elapsed() < Duration::from_secs(2), "binding of a dropped client not freed");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(s.stats().expired, 1);
}

#[test]
fn a_binding_whose_client_hangs_up_leaves_its_memory_to_the_next() {
    // 8 MiB in all: shared memory's share is 4 MiB, one user's part of it 2 MiB, where two
    // bindings (each 260 KiB of control pages) with a 600 KiB call each (its slot pages and the
    // server's private copy) do not fit.
    let s = server_with(ServerConfig { message_memory: 8 << 20, ..ServerConfig::default() });
    let data: Vec<u8> = (0..600 << 10).map(seeds::pattern).collect();
    let first: TestClient = Client::connect(s.addr()).unwrap().import().unwrap();
    assert_eq!(first.binding().transport(), Transport::SharedMemory);
    first.bulk_in(In(&data)).unwrap();
    // A client that gives up after 300 ms of refusals (it sends the call again meanwhile).
    let quick = ClientConfig {
        timing: Timing { dead_after: Duration::from_millis(300), ..Timing::default() },
        ..ClientConfig::default()
    };
    let next: TestClient = Client::connect(s.addr()).unwrap().with_config(quick).import().unwrap();
    assert_eq!(next.binding().transport(), Transport::SharedMemory);
    let err = next.bulk_in(In(&data)).unwrap_err();
    assert!(matches!(err, CallError::Overloaded { may_have_run: false }), "{err}");
    assert_eq!(err.execution(), Execution::NeverRan, "refused unread");
    assert!(s.stats().busy > 1, "sent again after its first refusal: {}", s.stats().busy);
    // The first client goes: its binding ends with its connection, and its memory with it. (The
    // rendezvous thread sees the connection hang up and wakes the binding's thread at once; how
    // soon is measured, not asserted here.)
    drop(first);
    let start = Instant::now();
    while s.stats().expired == 0 {
        assert!(start.elapsed() < Duration::from_secs(10), "the binding of a client gone never ended");
        std::thread::sleep(Duration::from_millis(1));
    }
    next.bulk_in(In(&data)).unwrap();
    assert_eq!(s.stats().expired, 1);
}

#[test]
fn a_call_refused_for_want_of_room_goes_again_and_runs_once_there_is_room() {
    // As above: two bindings with a 600 KiB call each do not fit in one user's part.
    let s = server_with(ServerConfig { message_memory: 8 << 20, ..ServerConfig::default() });
    let data: Vec<u8> = (0..600 << 10).map(seeds::pattern).collect();
    let first: TestClient = Client::connect(s.addr()).unwrap().import().unwrap();
    first.bulk_in(In(&data)).unwrap();
    let next: TestClient = Client::connect(s.addr()).unwrap().import().unwrap();
    let calls = s.stats().calls;
    let caller = std::thread::spawn(move || next.bulk_in(In(&data)));
    // The call is refused while the first binding holds its memory, and sent again meanwhile.
    let start = Instant::now();
    while s.stats().busy < 2 {
        assert!(start.elapsed() < Duration::from_secs(10), "the refused call was not sent again");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(s.stats().calls, calls, "nothing ran yet");
    drop(first);
    // Within `dead_after` (5 s) of its first refusal, a try finds room, and the call runs, once.
    caller.join().unwrap().unwrap();
    assert_eq!(s.stats().calls, calls + 1);
}

#[test]
fn a_call_larger_than_the_servers_budget_could_ever_hold_fails_at_once() {
    // A 600 KiB call takes its slot pages and the server's private copy: 1.2 MiB, more than a
    // binding may hold.
    let s = server_with(ServerConfig { binding_memory: 1 << 20, ..ServerConfig::default() });
    let client: TestClient = Client::connect(s.addr()).unwrap().import().unwrap();
    assert_eq!(client.binding().transport(), Transport::SharedMemory);
    let data: Vec<u8> = (0..600 << 10).map(seeds::pattern).collect();
    let err = client.bulk_in(In(&data)).unwrap_err();
    assert!(matches!(&err, CallError::TooLarge(m) if m.contains("can ever hold")), "{err:?}");
    assert_eq!(err.execution(), Execution::NeverRan, "refused unread");
    assert_eq!(s.stats().busy, 0, "refused once, not as busy: no second try");
    assert_eq!(s.stats().calls, 0);
    // A call that fits runs.
    client.bulk_in(In(&data[..100 << 10])).unwrap();
}

/// A hostile client of the shared-memory transport: binds by hand, then writes whatever it likes
/// into its region.
mod hostile {
    use std::io::Write;
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr as UnixAddr, UnixStream};
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::{Duration, Instant};

    use tiercel::Import;
    use tiercel_proto::bind::wire::{BindGrant, BindRequest};
    use tiercel_proto::shm::{self as proto, header, slot, Layout};
    use tiercel_proto::wire::Status;
    use tiercel_proto::wire::{Kind, Packet, HEADER_LEN};
    use tiercel_sys::shm::Region;

    pub struct Hostile {
        pub region: Region,
        pub layout: Layout,
        _stream: UnixStream,
    }

    impl Hostile {
        pub fn bind(name: &str) -> Hostile {
            let stream = UnixStream::connect_addr(&UnixAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
            let info = <super::TestClient as Import>::INFO;
            let req = BindRequest {
                interface: info.id,
                version: info.version,
                max_datagram: 0,
                nonce: 1,
                fingerprint: info.fingerprint(),
                proof: None,
                rendezvous: false,
                features: tiercel_proto::bind::wire::features::ALL,
                list: false,
                ask_key: false,
            };
            let payload = req.to_bytes(0);
            let h = tiercel_proto::wire::Header {
                payload_len: payload.len() as u32,
                message_len: payload.len() as u32,
                ..tiercel_proto::wire::Header::new(Kind::Bind)
            };
            let bytes = [&h.to_bytes()[..], &payload].concat();
            (&stream).write_all(&(bytes.len() as u32).to_le_bytes()).unwrap();
            (&stream).write_all(&bytes).unwrap();
            let mut msg = [0u8; 256];
            let (n, fd) = tiercel_sys::shm::recv_with_fd(&stream, &mut msg).unwrap();
            let p = Packet::new_checked(&msg[4..n]).unwrap();
            assert_eq!(p.kind(), Kind::BindReply, "a grant");
            let grant = BindGrant::parse(&msg[4 + HEADER_LEN..n]).unwrap();
            let layout = Layout::granted(grant.slots, grant.region).unwrap();
            let region = Region::from_fd(fd.unwrap(), layout.region_len().unwrap()).unwrap();
            Hostile { region, layout, _stream: stream }
        }

        pub fn word(&self, at: usize) -> &AtomicU32 {
            self.region.u32_at(at).unwrap()
        }

        /// Publishes whatever is in slot `i` and waits for the server's answer. Claims every slot
        /// number in use (far more than the region has), which the server must bound by the
        /// region's own geometry.
        pub fn call(&self, i: u32) -> Status {
            let base = self.layout.slot(i);
            self.word(header::SLOTS_USED).store(u32::MAX, Ordering::SeqCst);
            proto::client_publish(
                self.word(base + slot::STATE),
                self.word(header::SERVER_SLEEPING),
                self.word(header::DOORBELL),
            );
            tiercel_sys::shm::futex_wake(self.word(header::DOORBELL), 1);
            let start = Instant::now();
            while !proto::client_done(self.word(base + slot::STATE)) {
                assert!(start.elapsed() < Duration::from_secs(5), "the server stopped answering");
                std::thread::yield_now();
            }
            let status = self.word(base + slot::STATUS).load(Ordering::Relaxed);
            Status::from_u8(status as u8).unwrap()
        }
    }
}

#[test]
fn a_hostile_client_cannot_crash_the_server_or_touch_another_binding() {
    let s = server();
    let honest: TestClient = Client::connect(s.addr()).unwrap().import().unwrap();
    seeds::check_all(&honest, 0).unwrap();
    let h = hostile::Hostile::bind(s.rendezvous().unwrap());
    let base = h.layout.slot(0);
    use tiercel_proto::shm::slot;
    use tiercel_proto::wire::Status;
    let w = |at: usize, v: u32| h.word(base + at).store(v, Ordering::Relaxed);
    // A length beyond the slot, a procedure beyond u16, an unknown procedure, garbage arguments.
    w(slot::LEN, u32::MAX);
    w(slot::PROCEDURE, 0);
    assert_eq!(h.call(0), Status::BadArguments);
    w(slot::LEN, 0);
    w(slot::PROCEDURE, 1 << 20);
    assert_eq!(h.call(0), Status::BadArguments);
    w(slot::PROCEDURE, 999);
    assert_eq!(h.call(0), Status::UnknownProcedure);
    w(slot::PROCEDURE, 1); // add(i32, i32) with 3 bytes of arguments
    w(slot::LEN, 3);
    assert_eq!(h.call(0), Status::BadArguments);
    // Claiming more slots in use than exist, and a last slot, are bounded by the region's geometry.
    let last = h.layout.slots - 1;
    h.word(h.layout.slot(last) + slot::PROCEDURE).store(0, Ordering::Relaxed);
    h.word(h.layout.slot(last) + slot::LEN).store(0, Ordering::Relaxed);
    assert_eq!(h.call(last), Status::Ok);
    // The honest client, on its own region, never noticed.
    for round in 1..200 {
        seeds::check_all(&honest, round).unwrap();
    }
    assert_eq!(s.stats().panics, 0);
}

#[test]
fn max_bindings_bounds_every_transport_together() {
    let config = ServerConfig { max_bindings: 3, ..ServerConfig::default() };
    let s = Server::bind("127.0.0.1:0").unwrap().with_config(config).export(TestServer::new(SeedTest)).start().unwrap();
    let import = |scheme: &str| Client::connect(format!("{scheme}{}", s.addr())).unwrap().import::<TestClient>();
    let udp = import("udp://").unwrap();
    let tcp = import("tcp://").unwrap();
    let shm = import("shm:").unwrap();
    assert_eq!(s.bindings(), 3);
    for scheme in ["udp://", "tcp://", "shm:"] {
        let err = import(scheme).map(drop).unwrap_err();
        assert!(matches!(err, BindError::Busy), "{scheme}: {err:?}");
    }
    // A binding of one transport gone makes room for any other's.
    drop(tcp);
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.bindings() > 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let again = import("shm:").unwrap();
    for c in [&udp, &shm, &again] {
        seeds::check_all(c, 1).unwrap();
    }
}
