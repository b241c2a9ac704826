//! The async client (crate feature `async`) on both transports: every kind of argument, many
//! concurrent calls from one task and from many tasks on one binding (more than it has slots),
//! runtime threads left free while calls wait, calls through a lossy relay, deadlines, and futures
//! dropped mid-call.
#![cfg(feature = "async")]

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tiercel::{CallError, Client, ClientConfig, Execution, In, InOut, Out, Server, ServerConfig, Transport};

#[tiercel::interface]
pub trait Ledger {
    fn add(&self, a: u64, b: u64) -> u64;
    fn echo(&self, data: &[u8]) -> Vec<u8>;
    fn buffers(&self, data: In<&[u8]>, out: Out<&mut [u8]>, both: InOut<&mut [u8]>) -> u64;
    /// Xors every byte of `both` with `key`; returns the sum of its bytes before. (Its one buffer
    /// an `InOut` and its last argument: run in place, and the client lends it to the call.)
    fn flip(&self, key: u8, both: InOut<&mut [u8]>) -> u64;
    /// Sleeps `ms`, then records `tag` as run (once per call: a second run of a tag is counted).
    fn slow(&self, ms: u64, tag: u64) -> u64;
}

#[derive(Default)]
struct LedgerImpl {
    ran: Mutex<HashSet<u64>>,
    twice: AtomicU64,
}

impl Ledger for LedgerImpl {
    fn add(&self, a: u64, b: u64) -> u64 {
        a + b
    }
    fn echo(&self, data: &[u8]) -> Vec<u8> {
        data.to_vec()
    }
    fn buffers(&self, data: In<&[u8]>, out: Out<&mut [u8]>, both: InOut<&mut [u8]>) -> u64 {
        let n = out.0.len().min(data.0.len());
        out.0[..n].copy_from_slice(&data.0[..n]);
        both.0.iter_mut().for_each(|b| *b = !*b);
        data.0.iter().map(|&b| b as u64).sum()
    }
    fn flip(&self, key: u8, both: InOut<&mut [u8]>) -> u64 {
        let sum = both.0.iter().map(|&b| b as u64).sum();
        both.0.iter_mut().for_each(|b| *b ^= key);
        sum
    }
    fn slow(&self, ms: u64, tag: u64) -> u64 {
        std::thread::sleep(Duration::from_millis(ms));
        if !self.ran.lock().unwrap().insert(tag) {
            self.twice.fetch_add(1, Ordering::Relaxed);
        }
        tag
    }
}

struct Served {
    server: tiercel::RunningServer,
    ledger: Arc<LedgerImpl>,
}

/// A `Ledger` implementation shared with the test, so that it can see what ran.
struct Shared(Arc<LedgerImpl>);

impl Ledger for Shared {
    fn add(&self, a: u64, b: u64) -> u64 {
        self.0.add(a, b)
    }
    fn echo(&self, data: &[u8]) -> Vec<u8> {
        self.0.echo(data)
    }
    fn buffers(&self, data: In<&[u8]>, out: Out<&mut [u8]>, both: InOut<&mut [u8]>) -> u64 {
        self.0.buffers(data, out, both)
    }
    fn flip(&self, key: u8, both: InOut<&mut [u8]>) -> u64 {
        self.0.flip(key, both)
    }
    fn slow(&self, ms: u64, tag: u64) -> u64 {
        self.0.slow(ms, tag)
    }
}

fn serve(config: ServerConfig) -> Served {
    let ledger = Arc::new(LedgerImpl::default());
    let server = Server::bind("127.0.0.1:0")
        .unwrap()
        .with_config(config)
        .export(LedgerServer::new(Shared(ledger.clone())))
        .start()
        .unwrap();
    Served { server, ledger }
}

const TRANSPORTS: [(&str, Transport); 3] =
    [("udp://", Transport::Udp), ("shm:", Transport::SharedMemory), ("tcp://", Transport::Tcp)];

async fn import(served: &Served, scheme: &str) -> LedgerAsyncClient {
    Client::connect(format!("{scheme}{}", served.server.addr())).unwrap().import_async().await.unwrap()
}

#[test]
fn an_async_call_outside_a_runtime_fails_typed_and_never_ran() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let served = runtime.block_on(async { serve(ServerConfig::default()) });
    for (scheme, _) in TRANSPORTS {
        let client = runtime.block_on(import(&served, scheme));
        // Polled by hand, with no tokio runtime around.
        let mut call = std::pin::pin!(client.add(2, 3));
        let polled = call.as_mut().poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
        let std::task::Poll::Ready(Err(err)) = polled else { panic!("{scheme}: {polled:?}") };
        assert!(matches!(err, tiercel::CallError::Internal(tiercel::Invariant::NoRuntime)), "{scheme}: {err}");
        assert_eq!(err.execution(), tiercel::Execution::NeverRan);
    }
}

#[test]
fn calls_of_a_runtime_made_after_the_first_was_shut_down_complete() {
    // A binding outlives the runtime its first async calls ran on: what they registered with that
    // runtime's reactor does not hold up the calls of the next.
    let served = serve(ServerConfig::default());
    for (scheme, transport) in TRANSPORTS {
        let mut client = None;
        for round in 0..3u64 {
            let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            runtime.block_on(async {
                if client.is_none() {
                    client = Some(import(&served, scheme).await);
                }
                let client = client.as_ref().unwrap();
                // Several at once: they wait for their results on the reactor, not spinning.
                let calls: Vec<_> = (0..8u64)
                    .map(|t| async move {
                        for i in 0..50 {
                            let (a, b) = (i, round * 100 + t);
                            assert_eq!(client.add(a, b).await.unwrap(), a + b, "{transport:?} round {round}");
                        }
                    })
                    .collect();
                futures_join_all(calls).await;
            });
            drop(runtime);
            std::thread::sleep(std::time::Duration::from_millis(30));
        }
        assert_eq!(client.unwrap().binding().transport(), transport);
    }
}

#[test]
fn lone_calls_after_one_that_waited_on_the_reactor_leave_the_runtimes_thread_asleep() {
    // A lone call spins for its result and reads it itself. Once a call has waited on the reactor
    // (its procedure outlasted the spin), its socket or connection was registered there; were it
    // still, every datagram or segment of the lone calls after it would wake the runtime's thread
    // asleep in `epoll_wait` (a context switch each, on a CPU the caller or the server needs).
    // The calls spin for up to 50 ms, which only the slow call outlasts.
    let served = serve(ServerConfig::default());
    let config = ClientConfig { spin: tiercel::Spin::Fixed(Duration::from_millis(50)), ..ClientConfig::default() };
    const CALLS: u64 = 2_000;
    for (round, (scheme, transport)) in TRANSPORTS.into_iter().enumerate() {
        if transport == Transport::SharedMemory {
            continue;
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("lone-reactor")
            .enable_all()
            .build()
            .unwrap();
        let woken = runtime.block_on(async {
            let address = format!("{scheme}{}", served.server.addr());
            let client: LedgerAsyncClient =
                Client::connect(address).unwrap().with_config(config.clone()).import_async().await.unwrap();
            let tag = 7_000 + round as u64;
            assert_eq!(client.slow(100, tag).await.unwrap(), tag, "{transport:?}: a call that waits on the reactor");
            let before = tiercel_seeds::context_switches_of("lone-reactor");
            for i in 0..CALLS {
                assert_eq!(client.add(i, 2).await.unwrap(), i + 2);
            }
            tiercel_seeds::context_switches_of("lone-reactor") - before
        });
        assert!(woken < CALLS / 20, "{transport:?}: the runtime's thread woke {woken} times in {CALLS} lone calls");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_argument_over_both_transports() {
    let served = serve(ServerConfig::default());
    for (scheme, transport) in TRANSPORTS {
        let client = import(&served, scheme).await;
        assert_eq!(client.binding().transport(), transport);
        assert_eq!(client.add(2, 3).await.unwrap(), 5);
        let data: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        assert_eq!(client.echo(&data).await.unwrap(), data, "{transport:?}: a multi-packet call and result");
        let (mut out, mut both) = (vec![0u8; 3], vec![1u8, 2, 3]);
        let sum = client.buffers(In(&[7, 8, 9, 10]), Out(&mut out), InOut(&mut both)).await.unwrap();
        assert_eq!((sum, out, both), (34, vec![7, 8, 9], vec![!1u8, !2, !3]));
        // The synchronous stub on the same binding, from a blocking thread.
        let sync = client.to_sync();
        assert_eq!(tokio::task::spawn_blocking(move || sync.add(40, 2)).await.unwrap().unwrap(), 42);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_concurrent_calls_than_slots_queue_and_all_complete() {
    // 4 slots per binding: 200 calls at once from 50 tasks, and 16 joined in one task, must queue
    // for the slots rather than fail with NoFreeSlot.
    let served = serve(ServerConfig { slots_per_binding: 4, ..ServerConfig::default() });
    for (scheme, transport) in TRANSPORTS {
        let client = import(&served, scheme).await;
        let mut tasks = tokio::task::JoinSet::new();
        for t in 0..50u64 {
            let client = client.clone();
            tasks.spawn(async move {
                for i in 0..4u64 {
                    let data = vec![(t * 4 + i) as u8; 1 + (t as usize * 97) % 3000];
                    assert_eq!(client.add(t, i).await.unwrap(), t + i);
                    assert_eq!(client.echo(&data).await.unwrap(), data);
                }
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.unwrap_or_else(|e| panic!("{transport:?}: {e}"));
        }
        let (a, b, c, d) = tokio::join!(client.add(1, 1), client.add(2, 2), client.add(3, 3), client.echo(b"four"));
        assert_eq!((a.unwrap(), b.unwrap(), c.unwrap(), d.unwrap()), (2, 4, 6, b"four".to_vec()));
        let joined: Vec<_> = (0..16u64).map(|i| client.add(i, i)).collect();
        for (i, r) in futures_join_all(joined).await.into_iter().enumerate() {
            assert_eq!(r.unwrap(), 2 * i as u64);
        }
        // The async calls, done, hold every slot idle in their pool: threads making synchronous
        // calls on the same binding take them over instead of failing with NoFreeSlot.
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let sync = client.to_sync();
                std::thread::spawn(move || sync.add(t, 100))
            })
            .collect();
        for (t, h) in threads.into_iter().enumerate() {
            assert_eq!(h.join().unwrap().unwrap_or_else(|e| panic!("{transport:?}: thread {t}: {e}")), t as u64 + 100);
        }
        // The threads are gone and their slots with them back to the binding: async calls make new
        // endpoints on them.
        let again: Vec<_> = (0..8u64).map(|i| client.add(i, 1)).collect();
        for (i, r) in futures_join_all(again).await.into_iter().enumerate() {
            assert_eq!(r.unwrap(), i as u64 + 1);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_stub_lends_a_large_in_out_buffer_and_receives_its_result_into_it() {
    // `flip` takes its one buffer, an `InOut`, last: the async stub lends the caller's buffer to
    // the call as the synchronous one does. Over UDP a large result's fragments are received
    // straight into it (on 64 KiB and on 1,472-byte checksummed datagrams), over TCP the bytes of
    // its frame; through shared memory the result's bytes are copied from the slot straight into
    // it. Small buffers, and a call whose future is dropped while its result may be arriving, leave
    // every later result whole.
    let served = serve(ServerConfig::default());
    let cases = [
        ("udp://", Transport::Udp, 65507, false),
        ("udp://", Transport::Udp, 1472, true),
        ("shm:", Transport::SharedMemory, 65507, false),
        ("tcp://", Transport::Tcp, 65507, false),
    ];
    for (scheme, transport, max_datagram, checksum) in cases {
        let case = format!("{transport:?}, datagrams {max_datagram}");
        let config = ClientConfig { max_datagram, checksum, ..ClientConfig::default() };
        let client: LedgerAsyncClient = Client::connect(format!("{scheme}{}", served.server.addr()))
            .unwrap()
            .with_config(config)
            .import_async()
            .await
            .unwrap();
        assert_eq!(client.binding().transport(), transport);
        let mut both: Vec<u8> = (0..(1 << 20) + 77).map(|i| (i % 249) as u8).collect();
        let mut expected = both.clone();
        let sum = |b: &[u8]| b.iter().map(|&x| x as u64).sum::<u64>();
        for key in [0x5a, 0xa5] {
            assert_eq!(client.flip(key, InOut(&mut both)).await.unwrap(), sum(&expected), "{case}");
            expected.iter_mut().for_each(|b| *b ^= key);
            assert!(both == expected, "{case}: the buffer came back flipped");
        }
        let mut small = [1u8, 2, 3];
        assert_eq!(client.flip(1, InOut(&mut small)).await.unwrap(), 6, "{case}");
        assert_eq!(small, [0, 3, 2], "{case}");
        // Dropped after 300 µs: before, during or after its result arrives into `scratch`.
        let mut scratch = both.clone();
        let _ = tokio::time::timeout(Duration::from_micros(300), client.flip(0xff, InOut(&mut scratch))).await;
        assert_eq!(client.flip(0x0f, InOut(&mut both)).await.unwrap(), sum(&expected), "{case}");
        expected.iter_mut().for_each(|b| *b ^= 0x0f);
        assert!(both == expected, "{case}: the call after the dropped one came back whole");
        let (in_place, lent) = (client.binding().stats().in_place, client.binding().stats().lent_fragments as usize);
        let lent_bytes = client.binding().stats().lent_bytes as usize;
        if transport == Transport::Tcp {
            // The three awaited large calls, and perhaps the dropped one; each result's bytes
            // read straight into the buffer but for what came with its frame's header (at most
            // the connection's 64 KiB receive buffer).
            assert!((3..=4).contains(&in_place), "{case}: {in_place} results received into the lent buffer");
            assert_eq!(lent, 0, "{case}: no fragments over TCP");
            assert!(lent_bytes >= 3 * (both.len() - (64 << 10)), "{case}: {lent_bytes} bytes straight into the buffer");
        } else if transport == Transport::Udp {
            // The three awaited large calls, and perhaps the dropped one; almost every fragment of
            // each straight into the buffer (fragments of 56 bytes of header less than the datagram).
            let fragments = both.len() / (max_datagram - 56);
            assert!((3..=4).contains(&in_place), "{case}: {in_place} results received into the lent buffer");
            assert!(lent >= 3 * fragments / 2, "{case}: {lent} fragments straight into the buffer of 3 × {fragments}");
        } else {
            // Every result copied from the slot into the buffer, the small one's too: the four
            // awaited calls, and perhaps the dropped one.
            assert!((4..=5).contains(&in_place), "{case}: {in_place} results copied into the lent buffer");
            assert_eq!((lent, lent_bytes), (0, 0), "{case}: no fragments, no connection");
        }
    }
}

/// Awaits every future, concurrently, in one task.
async fn futures_join_all<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in futures.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *o = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(|o| o.unwrap()).collect()
}

/// A UDP relay in front of `server` that drops every `nth` datagram each way (counted over all the
/// relay's traffic in that direction), each client socket with an upstream socket of its own, so
/// that the server tells the client's sockets apart. Runs until the process ends.
fn lossy_relay(server: std::net::SocketAddr, nth: u64) -> std::net::SocketAddr {
    use std::collections::HashMap;
    use std::net::UdpSocket;
    let front = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
    let addr = front.local_addr().unwrap();
    let (up_count, down_count) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    std::thread::spawn(move || {
        let mut upstream: HashMap<std::net::SocketAddr, Arc<UdpSocket>> = HashMap::new();
        let mut buf = vec![0u8; 65_536];
        loop {
            let Ok((n, client)) = front.recv_from(&mut buf) else { continue };
            let up = upstream.entry(client).or_insert_with(|| {
                let up = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
                up.connect(server).unwrap();
                let (back, front, down_count) = (up.clone(), front.clone(), down_count.clone());
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 65_536];
                    while let Ok(n) = back.recv(&mut buf) {
                        if down_count.fetch_add(1, Ordering::Relaxed) % nth != nth - 1 {
                            let _ = front.send_to(&buf[..n], client);
                        }
                    }
                });
                up
            });
            if up_count.fetch_add(1, Ordering::Relaxed) % nth != nth - 1 {
                let _ = up.send(&buf[..n]);
            }
        }
    });
    addr
}

#[tokio::test(flavor = "current_thread")]
async fn concurrent_calls_on_one_runtime_thread_complete_once_each_through_a_lossy_relay() {
    // Eight tasks' calls in flight at once on one thread (a call not alone waits for its socket to
    // be readable before its first look), with every fifth datagram dropped each way: every call
    // completes, with its own result, and no procedure runs twice.
    let served = serve(ServerConfig::default());
    let relay = lossy_relay(served.server.addr(), 5);
    let client: LedgerAsyncClient = Client::connect(format!("udp://{relay}")).unwrap().import_async().await.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..8u64 {
        let client = client.clone();
        tasks.spawn(async move {
            for i in 0..25u64 {
                let tag = 10_000 + t * 100 + i;
                assert_eq!(client.slow(0, tag).await.unwrap(), tag);
                let data = vec![tag as u8; if i % 5 == 0 { 5_000 } else { 40 }];
                assert_eq!(client.echo(&data).await.unwrap(), data);
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    assert_eq!(served.ledger.ran.lock().unwrap().len(), 200);
    assert_eq!(served.ledger.twice.load(Ordering::Relaxed), 0, "a call ran twice");
    let resent = client.binding().stats().retransmissions;
    assert!(resent > 0, "the relay dropped datagrams, yet nothing was sent again");
}

#[tokio::test(flavor = "current_thread")]
async fn a_waiting_call_leaves_the_runtime_thread_free() {
    // One runtime thread: while a 300 ms call waits, another task on the same thread ticks.
    let served = serve(ServerConfig::default());
    for (scheme, transport) in TRANSPORTS {
        let client = import(&served, scheme).await;
        let ticks = Arc::new(AtomicU64::new(0));
        let ticker = {
            let ticks = ticks.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    ticks.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        assert_eq!(client.slow(300, 1_000 + transport as u64).await.unwrap(), 1_000 + transport as u64);
        ticker.abort();
        let ticked = ticks.load(Ordering::Relaxed);
        assert!(ticked >= 10, "{transport:?}: the other task ticked only {ticked} times during the call");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_and_dropped_futures_leave_the_binding_usable_and_run_nothing_twice() {
    // One slot, so that every later call reuses the slot of the call given up.
    let served = serve(ServerConfig { slots_per_binding: 1, ..ServerConfig::default() });
    let mut tag = 0;
    for (scheme, transport) in TRANSPORTS {
        let client = import(&served, scheme).await;
        // A deadline: the call fails when it passes, and says it may have run.
        tag += 1;
        let started = Instant::now();
        let err = client.with_deadline(Duration::from_millis(100)).slow(400, tag).await.unwrap_err();
        assert!(matches!(err, CallError::DeadlineExceeded { may_have_run: true }), "{transport:?}: {err}");
        assert_eq!(err.execution(), Execution::MayHaveRun);
        assert!(started.elapsed() < Duration::from_millis(390), "{transport:?}: gave up only after the call ended");
        // A dropped future: a timeout around a slow call.
        tag += 1;
        let dropped = tokio::time::timeout(Duration::from_millis(50), client.slow(300, tag)).await;
        assert!(dropped.is_err(), "{transport:?}: the slow call finished within 50 ms");
        // The slot is the one both calls left behind: the next calls get it, and their results
        // are their own, not the abandoned calls'.
        for i in 0..20u64 {
            tag += 1;
            assert_eq!(client.slow(0, tag).await.unwrap(), tag, "{transport:?}: call {i} after the abandoned ones");
        }
        assert_eq!(client.add(20, 22).await.unwrap(), 42);
    }
    // Every call given up ran at most once.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(served.ledger.twice.load(Ordering::Relaxed), 0, "a call ran twice");
}

#[path = "async_calls/procedures.rs"]
mod procedures;
