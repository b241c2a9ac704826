//! Async procedures on the server: run concurrently without holding a worker, aborted when their
//! caller drops the call, their arguments counted against the message budget; and threads on a
//! TCP binding not held up by an async reader whose runtime is busy.

use super::*;

/// An interface whose procedures are mostly `async fn`: they run on the server's tokio runtime.
#[tiercel::interface]
pub trait Relay {
    /// `a` after awaiting a timer of `ms`: holds no worker while it waits.
    async fn later(&self, ms: u64, a: u64) -> u64;
    /// Adds through another tiercel server (a `Ledger`), awaiting its async client.
    async fn forward(&self, a: u64, b: u64) -> Result<u64, String>;
    /// Panics.
    async fn boom(&self, why: String);
    /// Milliseconds left to the caller's deadline, as the async procedure sees it.
    async fn left_ms(&self) -> Option<u64>;
    /// Awaits `ms`, then records `tag` as finished (a dropped, aborted call never does).
    async fn slow(&self, ms: u64, tag: u64) -> u64;
    /// A plain procedure, run inline on a worker.
    fn plain(&self, x: u64) -> u64;
}

#[derive(Default)]
struct RelayState {
    running: AtomicU64,
    most_running: AtomicU64,
    finished: Mutex<HashSet<u64>>,
    aborted: AtomicU64,
}

struct RelayImpl {
    state: Arc<RelayState>,
    ledger: LedgerAsyncClient,
}

/// Counts an async procedure running, and one dropped before it finished.
struct Running<'a>(&'a RelayState, bool);

impl<'a> Running<'a> {
    fn new(state: &'a RelayState) -> Running<'a> {
        let now = state.running.fetch_add(1, Ordering::SeqCst) + 1;
        state.most_running.fetch_max(now, Ordering::SeqCst);
        Running(state, false)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
        if !self.1 {
            self.0.aborted.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Relay for RelayImpl {
    async fn later(&self, ms: u64, a: u64) -> u64 {
        let mut running = Running::new(&self.state);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        running.1 = true;
        a
    }
    async fn forward(&self, a: u64, b: u64) -> Result<u64, String> {
        self.ledger.add(a, b).await.map_err(|e| e.to_string())
    }
    async fn boom(&self, why: String) {
        panic!("{why}");
    }
    async fn left_ms(&self) -> Option<u64> {
        tokio::task::yield_now().await;
        tiercel::deadline().map(|d| d.saturating_duration_since(Instant::now()).as_millis() as u64)
    }
    async fn slow(&self, ms: u64, tag: u64) -> u64 {
        let mut running = Running::new(&self.state);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        running.1 = true;
        self.state.finished.lock().unwrap().insert(tag);
        tag
    }
    fn plain(&self, x: u64) -> u64 {
        x * 2
    }
}

/// A `Relay` server with one worker, whose async procedures call the `Ledger` of `served`.
async fn relay(served: &Served) -> (tiercel::RunningServer, Arc<RelayState>) {
    let ledger = import(served, "").await;
    let state = Arc::new(RelayState::default());
    let server = Server::bind("127.0.0.1:0")
        .unwrap()
        .with_config(ServerConfig { workers: 1, ..ServerConfig::default() })
        .export(RelayServer::new(RelayImpl { state: state.clone(), ledger }))
        .start()
        .unwrap();
    (server, state)
}

async fn import_relay(server: &tiercel::RunningServer, scheme: &str) -> RelayAsyncClient {
    Client::connect(format!("{scheme}{}", server.addr())).unwrap().import_async().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_procedures_run_concurrently_without_holding_the_worker() {
    let served = serve(ServerConfig::default());
    let (server, state) = relay(&served).await;
    for (scheme, transport) in TRANSPORTS {
        let client = import_relay(&server, scheme).await;
        // 40 calls that each await 300 ms, on a server with one worker: they run at the same time,
        // and a plain procedure is served meanwhile.
        state.most_running.store(0, Ordering::SeqCst);
        let waiting: Vec<_> = (0..40u64).map(|i| client.later(300, i)).collect();
        let plain = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let during = state.running.load(Ordering::SeqCst);
            (client.plain(21).await.unwrap(), during)
        };
        let (results, (doubled, during)) = tokio::join!(futures_join_all(waiting), plain);
        for (i, r) in results.into_iter().enumerate() {
            assert_eq!(r.unwrap(), i as u64, "{transport:?}");
        }
        assert_eq!(doubled, 42);
        assert!(during > 1, "{transport:?}: {during} async calls running while the plain one was served");
        let most = state.most_running.load(Ordering::SeqCst);
        assert!(most >= 20, "{transport:?}: at most {most} of 40 async procedures ran at once on one worker");
        // An async procedure that calls another tiercel server; one that panics; one that sees
        // the caller's deadline.
        assert_eq!(client.forward(40, 2).await.unwrap(), Ok(42));
        let err = client.boom("async boom".into()).await.unwrap_err();
        assert!(matches!(&err, CallError::Panicked(m) if m.contains("async boom")), "{transport:?}: {err}");
        assert_eq!(err.execution(), Execution::Ran);
        assert_eq!(client.left_ms().await.unwrap(), None);
        let left = client.with_deadline(Duration::from_secs(2)).left_ms().await.unwrap();
        assert!(left.is_some_and(|l| (1000..=2000).contains(&l)), "{transport:?}: {left:?} ms left of 2 s");
    }
    assert!(server.stats().panics >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_call_of_an_async_procedure_is_aborted_on_the_server() {
    let served = serve(ServerConfig::default());
    let (server, state) = relay(&served).await;
    let mut tag = 100;
    for (scheme, transport) in TRANSPORTS {
        let client = import_relay(&server, scheme).await;
        tag += 1;
        let before = state.aborted.load(Ordering::SeqCst);
        let dropped = tokio::time::timeout(Duration::from_millis(100), client.slow(3_000, tag)).await;
        assert!(dropped.is_err(), "{transport:?}: a 3 s call finished within 100 ms");
        // The server is told, and the procedure stops at its await: it never finishes.
        let told = Instant::now();
        while state.aborted.load(Ordering::SeqCst) == before {
            assert!(told.elapsed() < Duration::from_secs(2), "{transport:?}: the procedure was not aborted");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The binding goes on: the next calls (on the slot given up, or another) get their own results.
        for i in 0..10u64 {
            tag += 1;
            assert_eq!(client.slow(0, tag).await.unwrap(), tag, "{transport:?}: call {i} after the abort");
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let finished = state.finished.lock().unwrap().clone();
    assert!(!finished.contains(&101) && !finished.contains(&112), "aborted calls finished: {finished:?}");
    assert!(server.stats().cancelled >= 2, "{}", server.stats());
}

/// Holds a buffer while an async procedure awaits.
#[tiercel::interface]
pub trait Holder {
    /// Awaits `ms`, then returns the length of `data`.
    async fn hold(&self, data: Vec<u8>, ms: u64) -> usize;
}

struct HolderImpl;

impl Holder for HolderImpl {
    async fn hold(&self, data: Vec<u8>, ms: u64) -> usize {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        data.len()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_arguments_of_running_async_procedures_count_against_the_message_budget() {
    // Calls of 1 MiB that each hold their arguments for 200 ms, charged to their binding and so to
    // their transport's share (half the server's budget) and their address's part of it (half the
    // share): over UDP a 12 MiB budget, a 6 MiB share, a 3 MiB part, where six at once do not fit
    // (a call's reassembled message, 1 MiB, is held too while its copy is made). The calls beyond
    // are refused as busy and sent again by their client after a backoff, on every transport (over
    // UDP a copy, through shared memory the call published anew), and every call completes.
    // (Through shared memory each call's slot pages and the server's private copy are charged too:
    // 2 MiB a call before the async procedure's copy, within the user's part of the share, half of
    // it, so that budget is 16 MiB: a 4 MiB part.)
    for ((scheme, transport), budget) in TRANSPORTS.into_iter().zip([12 << 20, 16 << 20]) {
        let config = ServerConfig { message_memory: budget, ..ServerConfig::default() };
        let server = Server::bind("127.0.0.1:0")
            .unwrap()
            .with_config(config)
            .export(HolderServer::new(HolderImpl))
            .start()
            .unwrap();
        let before = server.stats().busy;
        let client: HolderAsyncClient =
            Client::connect(format!("{scheme}{}", server.addr())).unwrap().import_async().await.unwrap();
        let data = vec![7u8; 1 << 20];
        let calls: Vec<_> = (0..6).map(|_| client.hold(data.clone(), 200)).collect();
        for r in futures_join_all(calls).await {
            assert_eq!(r.unwrap_or_else(|e| panic!("{transport:?}: {e}")), 1 << 20, "{transport:?}");
        }
        let busy = server.stats().busy - before;
        assert!(busy > 0, "{transport:?}: six 1 MiB calls held at once in a {budget}-byte budget");
        assert!(server.message_memory() <= budget, "{transport:?}: {} bytes held", server.message_memory());
    }
}

#[test]
fn threads_on_a_tcp_binding_are_not_held_up_by_an_async_reader_whose_runtime_is_busy() {
    // An async call reads the connection for every caller while it waits; if its runtime's only
    // thread is then blocked, a thread calling through the same binding reads for itself.
    let served = serve(ServerConfig::default());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let client: LedgerAsyncClient = rt.block_on(import(&served, "tcp://"));
    let sync = <LedgerClient as tiercel::Import>::from_binding(client.binding().clone());
    let released = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let released_ = released.clone();
    let runtime = std::thread::spawn(move || {
        rt.block_on(async move {
            let slow = tokio::spawn(async move { client.slow(300, 1).await });
            // The slow call goes out and waits on the connection, then the thread is blocked.
            tokio::time::sleep(Duration::from_millis(50)).await;
            std::thread::sleep(Duration::from_secs(3));
            released_.store(true, Ordering::SeqCst);
            slow.await.unwrap()
        })
    });
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(sync.add(2, 3).unwrap(), 5);
    assert!(!released.load(Ordering::SeqCst), "the thread's call waited for the blocked runtime");
    assert!(runtime.join().unwrap().is_ok());
}
