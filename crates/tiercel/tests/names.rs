//! Export and import by name, in one process: several servers under one name share its clients,
//! the transport is chosen as for an address, a name exported with another interface is refused
//! before anything is sent, and a server takes its names back when it shuts down.

use std::collections::HashMap;
use std::path::PathBuf;

use tiercel::names::{NameError, Registry};
use tiercel::{BindError, Client, Server, ServerConfig, ServerError, Target, Transport};

#[tiercel::interface]
pub trait Accounts {
    fn balance(&self, account: u32) -> i64;
}

#[tiercel::interface]
pub trait Weather {
    fn temperature(&self, city: u32) -> i32;
}

struct Bank(i64);

impl Accounts for Bank {
    fn balance(&self, account: u32) -> i64 {
        self.0 + i64::from(account)
    }
}

struct Sky;

impl Weather for Sky {
    fn temperature(&self, city: u32) -> i32 {
        city as i32 - 10
    }
}

/// A registry of this test's own, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("tiercel-names-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Scratch(dir)
    }
    fn registry(&self) -> Registry {
        Registry::dir(self.0.clone())
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn bank(registry: &Registry, name: &str, base: i64) -> tiercel::RunningServer {
    Server::bind("127.0.0.1:0")
        .unwrap()
        .with_registry(registry.clone())
        .export_as(name, AccountsServer::new(Bank(base)))
        .start()
        .unwrap()
}

fn import(registry: &Registry, target: &str) -> Result<AccountsClient, BindError> {
    Client::connect(target).unwrap().with_registry(registry.clone()).import()
}

#[test]
fn clients_of_a_name_spread_over_its_servers_on_the_chosen_transport() {
    let scratch = Scratch::new("spread");
    let registry = scratch.registry();
    let (a, b) = (bank(&registry, "accounts", 1000), bank(&registry, "accounts", 2000));
    let mut seen: HashMap<std::net::SocketAddr, usize> = HashMap::new();
    for _ in 0..40 {
        let client = import(&registry, "accounts").unwrap();
        assert_eq!(client.binding().transport(), Transport::SharedMemory, "a local server: shared memory");
        let expected = if client.binding().server() == a.addr() { 1007 } else { 2007 };
        assert_eq!(client.balance(7).unwrap(), expected);
        *seen.entry(client.binding().server()).or_default() += 1;
    }
    // Random order: both are taken (all 40 on one has odds of 2^-39).
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen.contains_key(&a.addr()) && seen.contains_key(&b.addr()));
    let forced = import(&registry, "udp://accounts").unwrap();
    assert_eq!(forced.binding().transport(), Transport::Udp);
    assert!(forced.balance(1).unwrap() > 1000);
    assert_eq!(registry.names().unwrap(), vec!["accounts".to_string()]);
}

#[test]
fn a_name_exported_with_another_interface_is_refused_naming_both() {
    let scratch = Scratch::new("wrong");
    let registry = scratch.registry();
    let weather = Server::bind("127.0.0.1:0")
        .unwrap()
        .with_registry(registry.clone())
        .export_as("accounts", WeatherServer::new(Sky))
        .start()
        .unwrap();
    let err = import(&registry, "accounts").map(|_| ()).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, BindError::Name(NameError::WrongInterface { .. })), "{err:?}");
    assert!(text.contains("Weather v1") && text.contains("Accounts v1"), "{text}");
    assert!(text.contains(&weather.addr().to_string()), "{text}");
    // The same server, imported as the interface it exports, binds.
    let sky: WeatherClient = Client::connect("accounts").unwrap().with_registry(registry.clone()).import().unwrap();
    assert_eq!(sky.temperature(30).unwrap(), 20);
}

#[test]
fn a_server_takes_its_names_back_when_it_shuts_down() {
    let scratch = Scratch::new("shutdown");
    let registry = scratch.registry();
    let server = bank(&registry, "ledger", 0);
    let client = import(&registry, "ledger").unwrap();
    assert_eq!(client.balance(3).unwrap(), 3);
    assert_eq!(registry.lookup("ledger").unwrap().len(), 1);
    let handle = server.shutdown_handle();
    handle.shutdown();
    // Gone from the registry as soon as the shutdown begins, before the workers stop.
    assert!(registry.lookup("ledger").unwrap().is_empty());
    server.wait();
    let err = import(&registry, "ledger").map(|_| ()).unwrap_err();
    assert!(matches!(err, BindError::Name(NameError::NotFound { .. })), "{err:?}");
    // Dropped without a shutdown: gone too.
    drop(bank(&registry, "ledger", 0));
    assert!(registry.lookup("ledger").unwrap().is_empty());
}

#[test]
fn names_are_checked_when_the_server_starts() {
    let scratch = Scratch::new("invalid");
    let registry = scratch.registry();
    let start = |names: &[&str]| {
        let mut server = Server::bind("127.0.0.1:0")
            .unwrap()
            .with_config(ServerConfig { shared_memory: false, ..ServerConfig::default() })
            .with_registry(registry.clone());
        for name in names {
            server = server.export_as(name, AccountsServer::new(Bank(0)));
        }
        server.start().map(|_| ())
    };
    assert!(matches!(start(&["a/b"]), Err(ServerError::Name(NameError::InvalidName(_)))));
    assert!(matches!(start(&["twice", "twice"]), Err(ServerError::DuplicateName(_))));
    // Neither left a name behind.
    assert!(registry.names().unwrap().is_empty());
    assert_eq!(Client::connect("accounts").unwrap().target(), &Target::Name("accounts".into()));
}

/// A server of `name` with `secret` (`None`: plain), its `balance` answering `base + account`.
fn bank_with(registry: &Registry, name: &str, base: i64, secret: Option<tiercel::Secret>) -> tiercel::RunningServer {
    Server::bind("127.0.0.1:0")
        .unwrap()
        .with_config(ServerConfig { secret, ..ServerConfig::default() })
        .with_registry(registry.clone())
        .export_as(name, AccountsServer::new(Bank(base)))
        .start()
        .unwrap()
}

/// Whoever may write the registry can add exporters of any name; with a secret, a client passes
/// every one that cannot prove it (plain, or with another secret), reaches the real server at
/// every import, and counts those it passed.
#[test]
fn exporters_that_fail_the_proof_are_passed_over_and_counted() {
    let scratch = Scratch::new("forged");
    let registry = scratch.registry();
    let secret = || tiercel::Secret::new(&[7; 32]).unwrap();
    let real = bank_with(&registry, "accounts", 1000, Some(secret()));
    let _plain = bank_with(&registry, "accounts", -1, None);
    let _other = bank_with(&registry, "accounts", -2, Some(tiercel::Secret::new(&[8; 32]).unwrap()));
    let _third = bank_with(&registry, "accounts", -3, None);
    assert_eq!(registry.lookup("accounts").unwrap().len(), 4);
    for transport in ["udp://accounts", "tcp://accounts", "accounts"] {
        let client = Client::connect(transport)
            .unwrap()
            .with_registry(registry.clone())
            .with_config(tiercel::ClientConfig { secret: Some(secret()), ..Default::default() });
        for _ in 0..10 {
            let bound: AccountsClient = client.import().unwrap();
            assert_eq!(bound.binding().server(), real.addr(), "{transport}");
            assert_eq!(bound.balance(5).unwrap(), 1005, "{transport}");
        }
        // Ten imports, each starting at one of four exporters at random: the chance that no
        // import met a forged one first is 4^-10.
        assert!(client.exporters_refused() > 0, "{transport}");
    }
    // Without a secret of its own, a client is refused by the real server and has the others'
    // plain ones, which is what a plain client asked for.
    let plain = import(&registry, "udp://accounts").unwrap();
    assert!(plain.balance(5).unwrap() < 5);
}
