//! The async client (crate feature `async`) on both transports: every kind of argument, many
//! concurrent calls from one task and from many tasks on one binding (more than it has slots),
//! runtime threads left free while calls wait, deadlines, and futures dropped mid-call.
#![cfg(feature = "async")]

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tiercel::{CallError, Client, Execution, In, InOut, Out, Server, ServerConfig, Transport};

#[tiercel::interface]
pub trait Ledger {
    fn add(&self, a: u64, b: u64) -> u64;
    fn echo(&self, data: &[u8]) -> Vec<u8>;
    fn buffers(&self, data: In<&[u8]>, out: Out<&mut [u8]>, both: InOut<&mut [u8]>) -> u64;
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

const TRANSPORTS: [(&str, Transport); 2] = [("udp://", Transport::Udp), ("shm:", Transport::SharedMemory)];

async fn import(served: &Served, scheme: &str) -> LedgerAsyncClient {
    Client::connect(format!("{scheme}{}", served.server.addr())).unwrap().import_async().await.unwrap()
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
