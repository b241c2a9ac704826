//! Bindings that bind again by themselves (`ClientConfig::rebind`): to the next exporter of a name
//! when theirs stops, to a server restarted at the same address, and from UDP back to shared memory
//! once the server has room. The call that finds the server gone fails, saying that it may have
//! run, and is never sent again; every call is counted by the server that ran it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tiercel::names::Registry;
use tiercel::{CallError, Client, ClientConfig, Execution, Server, ServerConfig, Timing, Transport};

#[tiercel::interface]
pub trait Counter {
    /// Counts the call on the server that runs it; returns the server's tag.
    fn bump(&self) -> u32;
}

struct Counting {
    tag: u32,
    ran: Arc<AtomicU64>,
}

impl Counter for Counting {
    fn bump(&self) -> u32 {
        self.ran.fetch_add(1, Ordering::SeqCst);
        self.tag
    }
}

fn serve(
    addr: &str,
    tag: u32,
    ran: &Arc<AtomicU64>,
    registry: Option<&Registry>,
    config: ServerConfig,
) -> tiercel::RunningServer {
    let server = Server::bind(addr).unwrap().with_config(config);
    let export = CounterServer::new(Counting { tag, ran: ran.clone() });
    match registry {
        Some(r) => server.with_registry(r.clone()).export_as("counter", export),
        None => server.export(export),
    }
    .start()
    .unwrap()
}

fn rebinding() -> ClientConfig {
    let timing = Timing { dead_after: Duration::from_millis(500), ..Timing::default() };
    ClientConfig { rebind: true, timing, ..ClientConfig::default() }
}

/// A registry of this test's own, removed when dropped.
struct Scratch(std::path::PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_binding_by_name_moves_to_the_next_exporter_and_never_repeats_a_call() {
    for target in ["counter", "udp://counter"] {
        let dir = Scratch(std::env::temp_dir().join(format!("tiercel-rebind-{}-{}", std::process::id(), target.len())));
        let registry = Registry::dir(dir.0.clone());
        let (ran_a, ran_b) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let a = serve("127.0.0.1:0", 1, &ran_a, Some(&registry), ServerConfig::default());
        let client: CounterClient =
            Client::connect(target).unwrap().with_config(rebinding()).with_registry(registry.clone()).import().unwrap();
        let mut ok = 0u64;
        for _ in 0..10 {
            assert_eq!(client.bump().unwrap(), 1);
            ok += 1;
        }
        a.stop();
        // The call that finds the server gone fails, and may have run: it is not sent again.
        let err = client.bump().unwrap_err();
        assert_eq!(err.execution(), Execution::MayHaveRun, "{target}: {err}");
        // Nobody exports the name now: binding again fails, and the call was never sent.
        let err = client.bump().unwrap_err();
        assert!(matches!(err, CallError::BindAgain(_)), "{target}: {err:?}");
        assert_eq!(err.execution(), Execution::NeverRan);
        let b = serve("127.0.0.1:0", 2, &ran_b, Some(&registry), ServerConfig::default());
        for _ in 0..10 {
            assert_eq!(client.bump().unwrap(), 2, "{target}: the binding moved to the new exporter");
            ok += 1;
        }
        assert_eq!(client.binding().server(), b.addr());
        assert_eq!(client.binding().rebinds(), 1);
        let expected = if target.starts_with("udp") { Transport::Udp } else { Transport::SharedMemory };
        assert_eq!(client.binding().transport(), expected);
        // Every successful call ran once; the failed one at most once.
        let ran = ran_a.load(Ordering::SeqCst) + ran_b.load(Ordering::SeqCst);
        assert!(ran == ok || ran == ok + 1, "{target}: {ran} runs for {ok} calls and one that may have run");
    }
}

#[test]
fn a_server_restarted_at_the_same_address_is_bound_again_through_shared_memory() {
    let ran = Arc::new(AtomicU64::new(0));
    let first = serve("127.0.0.1:0", 1, &ran, None, ServerConfig::default());
    let addr = first.addr();
    let client: CounterClient = Client::connect(addr).unwrap().with_config(rebinding()).import().unwrap();
    let stub = client.clone();
    assert_eq!(client.bump().unwrap(), 1);
    assert_eq!(client.binding().transport(), Transport::SharedMemory);
    first.stop();
    let second = serve(&addr.to_string(), 2, &ran, None, ServerConfig::default());
    let err = client.bump().unwrap_err();
    assert_eq!(err.execution(), Execution::MayHaveRun, "{err}");
    // No code of the application's: the next call goes to the new server, through shared memory,
    // on every clone of the stub.
    assert_eq!(client.bump().unwrap(), 2);
    assert_eq!(stub.bump().unwrap(), 2);
    assert_eq!(stub.binding().transport(), Transport::SharedMemory);
    assert_eq!(client.binding().incarnation(), second.incarnation());
    // A thread of its own (its own endpoint) goes there too.
    let other = client.clone();
    assert_eq!(std::thread::spawn(move || other.bump().unwrap()).join().unwrap(), 2);
    assert_eq!(client.binding().rebinds(), 1);
}

#[test]
fn a_binding_that_fell_back_to_udp_returns_to_shared_memory() {
    let ran = Arc::new(AtomicU64::new(0));
    // Memory for one shared-memory binding (its header and 64 slots' control pages, 260 KiB, and
    // a call's page) in the part of shared memory's share one user may hold (a quarter of the
    // server's): the second client, of the same user, falls back to UDP, which needs none to bind.
    let config = ServerConfig { message_memory: 1_200_000, ..ServerConfig::default() };
    let server = serve("127.0.0.1:0", 1, &ran, None, config);
    let first: CounterClient = Client::connect(server.addr()).unwrap().import().unwrap();
    assert_eq!(first.binding().transport(), Transport::SharedMemory);
    let client: CounterClient = Client::connect(server.addr()).unwrap().with_config(rebinding()).import().unwrap();
    assert_eq!(client.binding().transport(), Transport::Udp);
    let why = client.binding().shared_memory_refused().expect("says why not shared memory");
    assert!(why.contains("busy"), "{why}");
    assert_eq!(client.bump().unwrap(), 1);
    // Room again: within about a second, a call moves the binding to shared memory.
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.binding().transport() != Transport::SharedMemory {
        assert!(Instant::now() < deadline, "never returned to shared memory");
        assert_eq!(client.bump().unwrap(), 1);
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(client.binding().shared_memory_refused(), None);
    assert_eq!(client.bump().unwrap(), 1);
    assert_eq!(client.binding().rebinds(), 1);
}

#[cfg(feature = "async")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_binding_binds_again_off_the_runtimes_threads() {
    let ran = Arc::new(AtomicU64::new(0));
    let first = serve("127.0.0.1:0", 1, &ran, None, ServerConfig::default());
    let addr = first.addr();
    let client: CounterAsyncClient =
        Client::connect(addr).unwrap().with_config(rebinding()).import_async().await.unwrap();
    assert_eq!(client.bump().await.unwrap(), 1);
    first.stop();
    let err = client.bump().await.unwrap_err();
    assert_eq!(err.execution(), Execution::MayHaveRun, "{err}");
    // Nobody listens: binding again fails at once (port unreachable), and the call never went out.
    let err = client.bump().await.unwrap_err();
    assert!(matches!(err, CallError::BindAgain(_)), "{err:?}");
    let _second = serve(&addr.to_string(), 2, &ran, None, ServerConfig::default());
    let (a, b) = tokio::join!(client.bump(), client.bump());
    assert_eq!((a.unwrap(), b.unwrap()), (2, 2));
    assert_eq!(client.binding().transport(), Transport::SharedMemory);
    assert_eq!(client.binding().rebinds(), 1);
}
