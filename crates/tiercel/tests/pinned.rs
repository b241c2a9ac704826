//! Servers' keys pinned on first use (`ClientConfig::known_servers`): the first bind learns the key
//! and pins it once the server proved it; every later bind, by address or name, re-binds
//! included, goes only to a server that proves that key, and a changed key is a clear refusal.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tiercel::{BindError, CallError, Client, ClientConfig, Identity, KnownServers, Server, ServerConfig, Timing};

#[tiercel::interface]
pub trait Till {
    fn deposit(&self, amount: u64) -> u64;
}

struct Counter(Arc<AtomicU64>);

impl Till for Counter {
    fn deposit(&self, amount: u64) -> u64 {
        self.0.fetch_add(amount, Ordering::Relaxed) + amount
    }
}

/// A server at `addr` with `key` (none: plain only), over UDP and TCP, counting deposits.
fn till(addr: SocketAddr, key: Option<&Identity>) -> (tiercel::RunningServer, Arc<AtomicU64>) {
    let deposits = Arc::new(AtomicU64::new(0));
    let config = ServerConfig { key: key.cloned(), shared_memory: false, ..ServerConfig::default() };
    let server = Server::bind(addr)
        .unwrap()
        .with_config(config)
        .export(TillServer::new(Counter(deposits.clone())))
        .start()
        .unwrap();
    (server, deposits)
}

/// A private directory of the test's own, with the path of a known-servers file in it.
fn known(tag: &str) -> (PathBuf, KnownServers) {
    let dir = std::env::temp_dir().join(format!("tiercel-pinned-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    let file = KnownServers::new(dir.join("known_servers"));
    (dir, file)
}

fn pinning(known: &KnownServers) -> ClientConfig {
    ClientConfig {
        known_servers: Some(known.clone()),
        timing: Timing { dead_after: Duration::from_secs(2), ..Timing::default() },
        ..ClientConfig::default()
    }
}

#[test]
fn the_first_bind_pins_the_key_and_later_binds_go_only_to_a_server_that_proves_it() {
    for scheme in ["udp", "tcp"] {
        let (dir, file) = known(scheme);
        let key = Identity::generate().unwrap();
        let (server, deposits) = till("127.0.0.1:0".parse().unwrap(), Some(&key));
        let addr = server.addr();
        let target = format!("{scheme}://{addr}");
        let client = Client::connect(target.as_str()).unwrap().with_config(pinning(&file));
        // First use: told the key, bound securely with it, pinned.
        let first: TillClient = client.import().unwrap();
        assert_eq!(first.binding().server_key(), Some(key.public()), "{target}");
        assert_eq!(first.deposit(1).unwrap(), 1);
        let text = std::fs::read_to_string(file.path()).unwrap();
        assert_eq!(text, format!("{addr} {}\n", key.public()), "{target}");
        assert_eq!(server.stats().key_required, 0, "{target}: nothing was sent plain but the question");
        // Later binds: with the pinned key, nothing more written.
        let again: TillClient = client.import().unwrap();
        assert_eq!(again.deposit(1).unwrap(), 2);
        assert_eq!(std::fs::read_to_string(file.path()).unwrap(), text);
        // The server gone and another, with another key, at its address: never bound, and the
        // error names both keys and the line to remove.
        server.shutdown();
        let other = Identity::generate().unwrap();
        let (impostor, stolen) = till(addr, Some(&other));
        let err = client.import::<TillClient>().unwrap_err();
        let BindError::KeyChanged(change) = &err else { panic!("{target}: {err:?}") };
        let expected = (key.public(), Some(other.public()), 1, file.path());
        assert_eq!((change.pinned, change.told, change.line, change.file.as_path()), expected);
        let message = err.to_string();
        assert!(message.contains(&key.public().to_string()) && message.contains("remove that line"), "{message}");
        assert_eq!((impostor.stats().bindings, stolen.load(Ordering::Relaxed)), (0, 0), "{target}");
        impostor.shutdown();
        // A plain server there: the same refusal, telling no key.
        let (plain, _) = till(addr, None);
        let err = client.import::<TillClient>().unwrap_err();
        assert!(matches!(&err, BindError::KeyChanged(c) if c.told.is_none()), "{target}: {err:?}");
        assert_eq!(plain.stats().bindings, 0);
        plain.shutdown();
        // The real server back: bound again.
        let (back, _) = till(addr, Some(&key));
        let bound: TillClient = client.import().unwrap();
        assert_eq!(bound.deposit(5).unwrap(), 5);
        // The change expected: the line removed, the next bind pins the key told then.
        back.shutdown();
        let (renewed, _) = till(addr, Some(&other));
        std::fs::write(file.path(), "").unwrap();
        let renewed_bound: TillClient = client.import().unwrap();
        assert_eq!(renewed_bound.binding().server_key(), Some(other.public()));
        assert_eq!(std::fs::read_to_string(file.path()).unwrap(), format!("{addr} {}\n", other.public()));
        assert_eq!(deposits.load(Ordering::Relaxed), 2);
        drop(renewed);
        std::fs::remove_dir_all(dir).unwrap();
    }
}

#[test]
fn a_client_that_pins_never_binds_plain_to_a_server_without_a_key() {
    let (dir, file) = known("plain");
    let (plain, _) = till("127.0.0.1:0".parse().unwrap(), None);
    let err = Client::connect(format!("udp://{}", plain.addr()))
        .unwrap()
        .with_config(pinning(&file))
        .import::<TillClient>()
        .unwrap_err();
    assert!(matches!(err, BindError::NoServerKey(a) if a == plain.addr()), "{err:?}");
    assert_eq!(plain.stats().bindings, 0);
    assert!(!file.path().exists(), "nothing pinned");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_re_binding_client_goes_back_only_to_the_server_whose_key_it_pinned() {
    let (dir, file) = known("rebind");
    let key = Identity::generate().unwrap();
    let (server, _) = till("127.0.0.1:0".parse().unwrap(), Some(&key));
    let addr = server.addr();
    let config = ClientConfig { rebind: true, ..pinning(&file) };
    let client: TillClient = Client::connect(format!("udp://{addr}")).unwrap().with_config(config).import().unwrap();
    assert_eq!(client.deposit(1).unwrap(), 1);
    // Killed, and another server takes the port with its own key before the real one is back.
    server.shutdown();
    let (impostor, stolen) = till(addr, Some(&Identity::generate().unwrap()));
    // The binding's sealed packets open for nobody there: the call finds its server gone …
    let err = client.deposit(1).unwrap_err();
    assert!(matches!(&err, CallError::Unreachable { acknowledged: false, .. }), "{err:?}");
    // … and the next binds again, only to a server that proves the pinned key.
    let err = client.deposit(1).unwrap_err();
    assert!(matches!(&err, CallError::BindAgain(BindError::KeyChanged(_))), "{err:?}");
    assert_eq!(err.execution(), tiercel::Execution::NeverRan);
    assert_eq!((impostor.stats().calls, stolen.load(Ordering::Relaxed)), (0, 0));
    impostor.shutdown();
    // The real server back at its port: the binding goes there.
    let (_back, deposits) = till(addr, Some(&key));
    assert_eq!(client.deposit(7).unwrap(), 7);
    assert_eq!(deposits.load(Ordering::Relaxed), 7);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_name_is_pinned_to_its_first_exporters_key_and_an_impostor_exporter_is_passed_over() {
    let (dir, file) = known("names");
    let registry_dir = dir.join("registry");
    let registry = tiercel::names::Registry::dir(&registry_dir);
    let key = Identity::generate().unwrap();
    let exporter = |key: &Identity, deposits: Arc<AtomicU64>| {
        let config = ServerConfig { key: Some(key.clone()), shared_memory: false, ..ServerConfig::default() };
        Server::bind("127.0.0.1:0")
            .unwrap()
            .with_config(config)
            .with_registry(registry.clone())
            .export_as("till", TillServer::new(Counter(deposits)))
            .start()
            .unwrap()
    };
    let real_deposits = Arc::new(AtomicU64::new(0));
    let real = exporter(&key, real_deposits.clone());
    let client = Client::connect("udp://till").unwrap().with_registry(registry.clone()).with_config(pinning(&file));
    let first: TillClient = client.import().unwrap();
    assert_eq!(first.binding().server_key(), Some(key.public()));
    let text = std::fs::read_to_string(file.path()).unwrap();
    assert_eq!(text, format!("name:till {}\n", key.public()));
    // Another server, with its own key, exports the name too (whoever may write the registry):
    // it cannot prove the pinned key, and every import reaches the real one.
    let stolen = Arc::new(AtomicU64::new(0));
    let impostor = exporter(&Identity::generate().unwrap(), stolen.clone());
    assert_eq!(registry.lookup("till").unwrap().len(), 2);
    for _ in 0..16 {
        let bound: TillClient = client.import().unwrap();
        assert_eq!(bound.binding().server(), real.addr());
        bound.deposit(1).unwrap();
    }
    assert_eq!((real_deposits.load(Ordering::Relaxed), stolen.load(Ordering::Relaxed)), (16, 0));
    assert!(client.exporters_refused() > 0, "the impostor was met and passed over (2^-16 that it never was)");
    assert_eq!(impostor.stats().bindings, 0);
    assert_eq!(std::fs::read_to_string(file.path()).unwrap(), text, "nothing more pinned");
    // The exports of the name, listed with the pinned key, come from both (the listing of the
    // impostor fails to prove it).
    let err = client.exports().unwrap_err();
    assert!(matches!(err, BindError::KeyChanged(_)), "{err:?}");
    drop(impostor);
    let listed = client.exports().unwrap();
    assert_eq!(listed.len(), 1);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_binding_that_tries_shared_memory_again_holds_the_server_to_the_key_it_pinned() {
    let (dir, file) = known("shm");
    let key = Identity::generate().unwrap();
    // Room for one shared-memory binding's slot pages at a time (the shared-memory bindings may
    // hold half the message memory).
    let config = ServerConfig { key: Some(key.clone()), message_memory: 2 << 20, ..ServerConfig::default() };
    let server = Server::bind("127.0.0.1:0")
        .unwrap()
        .with_config(config)
        .export(TillServer::new(Counter(Arc::new(AtomicU64::new(0)))))
        .start()
        .unwrap();
    let addr = server.addr();
    let first: TillClient = Client::connect(addr).unwrap().with_config(pinning(&file)).import().unwrap();
    assert_eq!(first.binding().transport(), tiercel::Transport::SharedMemory);
    // The second binding finds no room through shared memory: over UDP, sealed with the key
    // pinned, trying shared memory again every second.
    let rebinding = ClientConfig { rebind: true, ..pinning(&file) };
    let second: TillClient = Client::connect(addr).unwrap().with_config(rebinding).import().unwrap();
    assert_eq!(second.binding().transport(), tiercel::Transport::Udp);
    assert!(second.binding().shared_memory_refused().is_some());
    drop(first);
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(second.deposit(1).unwrap(), 1);
    // Through shared memory now, bound only once the server proved the pinned key again.
    assert_eq!(second.binding().transport(), tiercel::Transport::SharedMemory);
    assert_eq!(second.binding().server_key(), Some(key.public()));
    std::fs::remove_dir_all(dir).unwrap();
}
