//! Export and import by name through a real etcd (started by the test from Debian's
//! `etcd-server`): servers register under leases, clients spread over them, a shutdown revokes the
//! name at once, and a registry that cannot be reached is a clear error.
#![cfg(feature = "etcd")]

use std::collections::HashSet;

use tiercel::names::{NameError, Registry};
use tiercel::{BindError, Client, Server, ServerError};
use tiercel_seeds::etcd::EtcdServer;

#[tiercel::interface]
pub trait Accounts {
    fn balance(&self, account: u32) -> i64;
}

struct Bank(i64);

impl Accounts for Bank {
    fn balance(&self, account: u32) -> i64 {
        self.0 + i64::from(account)
    }
}

fn bank(registry: &Registry, name: &str, base: i64) -> Result<tiercel::RunningServer, ServerError> {
    Server::bind("127.0.0.1:0")?
        .with_registry(registry.clone())
        .export_as(name, AccountsServer::new(Bank(base)))
        .start()
}

#[test]
fn servers_register_in_etcd_and_clients_spread_over_them() {
    tiercel_seeds::needs!(ETCD);
    let etcd = EtcdServer::start().unwrap();
    let registry = Registry::parse(&etcd.registry(2)).unwrap();
    let servers: Vec<_> = (0..3).map(|i| bank(&registry, "accounts", i * 1000).unwrap()).collect();
    assert_eq!(registry.lookup("accounts").unwrap().len(), 3);
    assert_eq!(registry.names().unwrap(), vec!["accounts".to_string()]);
    let mut seen = HashSet::new();
    for _ in 0..60 {
        let client: AccountsClient =
            Client::connect("accounts").unwrap().with_registry(registry.clone()).import().unwrap();
        let server = client.binding().server();
        let base = servers.iter().position(|s| s.addr() == server).unwrap() as i64 * 1000;
        assert_eq!(client.balance(5).unwrap(), base + 5);
        seen.insert(server);
    }
    assert_eq!(seen.len(), 3, "bindings spread over every exporter");

    // A shutdown revokes the lease: the name is gone at once, not after its time to live.
    let mut servers = servers.into_iter();
    servers.next().unwrap().shutdown();
    assert_eq!(registry.lookup("accounts").unwrap().len(), 2);
    drop(servers);
    assert!(registry.lookup("accounts").unwrap().is_empty());
    let err =
        Client::connect("accounts").unwrap().with_registry(registry.clone()).import::<AccountsClient>().unwrap_err();
    assert!(matches!(err, BindError::Name(NameError::NotFound { .. })), "{err:?}");
}

#[test]
fn an_unreachable_etcd_is_a_clear_error() {
    tiercel_seeds::needs!(ETCD);
    // Nothing listens there (etcd started and stopped).
    let gone = {
        let etcd = EtcdServer::start().unwrap();
        etcd.registry(2)
    };
    let registry = Registry::parse(&gone).unwrap();
    let err = bank(&registry, "accounts", 0).map(|_| ()).unwrap_err();
    assert!(matches!(err, ServerError::Name(NameError::Io { .. })), "{err:?}");
    let err = Client::connect("accounts").unwrap().with_registry(registry).import::<AccountsClient>().unwrap_err();
    assert!(err.to_string().contains("etcd://"), "{err}");
}

#[test]
fn a_binding_by_name_leaves_an_exporter_that_goes_before_calling_it() {
    tiercel_seeds::needs!(ETCD);
    let etcd = EtcdServer::start().unwrap();
    let registry = Registry::parse(&etcd.registry(2)).unwrap();
    let mut servers: Vec<_> = (0..2).map(|i| Some(bank(&registry, "accounts", i * 1000).unwrap())).collect();
    let config = tiercel::ClientConfig { rebind: true, ..tiercel::ClientConfig::default() };
    let client: AccountsClient =
        Client::connect("accounts").unwrap().with_registry(registry.clone()).with_config(config).import().unwrap();
    let first = client.binding().server();
    let at = servers.iter().position(|s| s.as_ref().unwrap().addr() == first).unwrap();
    assert_eq!(client.balance(1).unwrap(), at as i64 * 1000 + 1);
    // Its exporter shuts down: the watch of the name sees the lease revoked, and the next call
    // binds to the other exporter first, instead of being refused by the one shutting down.
    let handle = servers[at].as_ref().unwrap().shutdown_handle();
    handle.shutdown();
    let other = 1 - at;
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while client.binding().rebinds() == 0 {
        std::thread::sleep(std::time::Duration::from_millis(20));
        // No call yet: the binding moves at the next one. Wait for the watch to have seen it.
        if registry.lookup("accounts").unwrap().len() == 1 {
            std::thread::sleep(std::time::Duration::from_millis(200));
            break;
        }
        assert!(std::time::Instant::now() < give_up, "the name was not revoked");
    }
    assert_eq!(client.balance(2).unwrap(), other as i64 * 1000 + 2, "the call went to the exporter left");
    assert_eq!(client.binding().server(), servers[other].as_ref().unwrap().addr());
    assert_eq!(client.binding().rebinds(), 1);
    servers[at].take().unwrap().wait();
}
