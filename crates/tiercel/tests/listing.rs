//! Asking a server what it exports (`Client::exports`): every interface with its procedures, by
//! address or by name, and only to a client that proves the server's secret when it has one.

use tiercel::names::Registry;
use tiercel::{BindError, Client, ClientConfig, Secret, Server, ServerConfig};

#[tiercel::interface(version = 3)]
pub trait Ledger {
    fn add(&self, a: u64, b: u64) -> u64;
    fn name(&self, id: u32) -> String;
}

#[tiercel::interface]
pub trait Clock {
    fn now(&self) -> u64;
}

struct Impl;

impl Ledger for Impl {
    fn add(&self, a: u64, b: u64) -> u64 {
        a + b
    }
    fn name(&self, id: u32) -> String {
        id.to_string()
    }
}

impl Clock for Impl {
    fn now(&self) -> u64 {
        0
    }
}

#[test]
fn a_server_lists_every_export_with_its_procedures() {
    let dir = std::env::temp_dir().join(format!("tiercel-listing-{}", std::process::id()));
    let registry = Registry::dir(dir.clone());
    let server = Server::bind("127.0.0.1:0")
        .unwrap()
        .with_registry(registry.clone())
        .export_as("books", LedgerServer::new(Impl))
        .export(ClockServer::new(Impl))
        .start()
        .unwrap();
    let exports = Client::connect(server.addr()).unwrap().exports().unwrap();
    let ledger = <LedgerClient as tiercel::Import>::INFO;
    assert_eq!(exports.len(), 2);
    assert_eq!((exports[0].name.as_str(), exports[0].version), ("Ledger", 3));
    assert_eq!(exports[0].fingerprint, ledger.fingerprint());
    assert_eq!(exports[0].signature, ledger.signature());
    assert_eq!(exports[0].signature.lines().collect::<Vec<_>>(), ["add(u64, u64) -> u64", "name(u32) -> String"]);
    assert!(exports[0].complete);
    assert_eq!((exports[1].name.as_str(), exports[1].signature.as_str()), ("Clock", "now() -> u64"));
    assert!(exports.iter().all(|e| e.server == server.addr()));
    // By name: every live exporter's.
    let by_name = Client::connect("books").unwrap().with_registry(registry).exports().unwrap();
    assert_eq!(by_name, exports);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_server_with_a_secret_lists_only_to_a_client_that_proves_it() {
    let secret = Secret::new(&[7u8; 32]).unwrap();
    let config = ServerConfig { secret: Some(secret.clone()), ..ServerConfig::default() };
    let server =
        Server::bind("127.0.0.1:0").unwrap().with_config(config).export(ClockServer::new(Impl)).start().unwrap();
    let err = Client::connect(server.addr()).unwrap().exports().unwrap_err();
    assert!(matches!(err, BindError::AuthenticationRequired), "{err:?}");
    let wrong = ClientConfig { secret: Some(Secret::new(&[8u8; 32]).unwrap()), ..ClientConfig::default() };
    let err = Client::connect(server.addr()).unwrap().with_config(wrong).exports().unwrap_err();
    assert!(matches!(err, BindError::AuthenticationFailed(_)), "{err:?}");
    let right = ClientConfig { secret: Some(secret), ..ClientConfig::default() };
    let exports = Client::connect(server.addr()).unwrap().with_config(right).exports().unwrap();
    assert_eq!(exports.len(), 1);
    assert_eq!(exports[0].name, "Clock");
}

/// A type whose definition alone is longer than one listing answer holds.
#[derive(tiercel::Wire, Debug, Clone, PartialEq)]
pub struct Wide {
    pub the_first_field_with_a_rather_long_name_a: u64,
    pub the_first_field_with_a_rather_long_name_b: u64,
    pub the_first_field_with_a_rather_long_name_c: u64,
    pub the_first_field_with_a_rather_long_name_d: u64,
    pub the_first_field_with_a_rather_long_name_e: Option<String>,
    pub the_first_field_with_a_rather_long_name_f: Vec<u8>,
    pub the_first_field_with_a_rather_long_name_g: (u8, u16, u32),
    pub the_first_field_with_a_rather_long_name_h: bool,
    pub the_second_field_with_a_rather_long_name_a: u64,
    pub the_second_field_with_a_rather_long_name_b: u64,
    pub the_second_field_with_a_rather_long_name_c: u64,
    pub the_second_field_with_a_rather_long_name_d: u64,
    pub the_second_field_with_a_rather_long_name_e: Option<String>,
    pub the_second_field_with_a_rather_long_name_f: Vec<u8>,
    pub the_second_field_with_a_rather_long_name_g: (u8, u16, u32),
    pub the_second_field_with_a_rather_long_name_h: bool,
    pub the_third_field_with_a_rather_long_name_a: u64,
    pub the_third_field_with_a_rather_long_name_b: u64,
    pub the_third_field_with_a_rather_long_name_c: u64,
    pub the_third_field_with_a_rather_long_name_d: u64,
    pub the_third_field_with_a_rather_long_name_e: Option<String>,
    pub the_third_field_with_a_rather_long_name_f: Vec<u8>,
    pub the_third_field_with_a_rather_long_name_g: (u8, u16, u32),
    pub the_third_field_with_a_rather_long_name_h: bool,
}

#[tiercel::interface]
pub trait Archive {
    fn store(&self, w: Wide) -> u64;
    fn fetch(&self, id: u64) -> Option<Wide>;
}

impl Archive for Impl {
    fn store(&self, _: Wide) -> u64 {
        1
    }
    fn fetch(&self, _: u64) -> Option<Wide> {
        None
    }
}

#[test]
fn a_signature_longer_than_an_answer_comes_whole_in_pages_over_udp_and_tcp() {
    let server = Server::bind("127.0.0.1:0").unwrap().export(ArchiveServer::new(Impl)).start().unwrap();
    let info = <ArchiveClient as tiercel::Import>::INFO;
    assert!(info.signature().len() > tiercel_proto::bind::PADDED_REQUEST, "{}", info.signature().len());
    for addr in [format!("udp://{}", server.addr()), format!("tcp://{}", server.addr())] {
        let exports = Client::connect(addr.as_str()).unwrap().exports().unwrap();
        assert_eq!(exports.len(), 1);
        assert!(exports[0].complete, "{addr}");
        assert_eq!(exports[0].signature, info.signature(), "{addr}");
        assert_eq!(exports[0].fingerprint, info.fingerprint());
    }
}
