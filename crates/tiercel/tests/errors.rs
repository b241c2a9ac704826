//! Each way an import, a call or a server start fails, and what the error says about whether the
//! procedure ran.

use std::net::UdpSocket;
use std::sync::atomic::{AtomicU64, Ordering};

use tiercel::{
    BindError, CallError, Client, ClientConfig, Error, Execution, In, RunningServer, Server, ServerConfig, ServerError,
    Timing,
};

#[tiercel::interface]
pub trait Store {
    fn put(&self, data: In<&[u8]>) -> u64;
    fn get(&self, len: u64) -> Vec<u8>;
}

struct Counted(AtomicU64);

impl Store for Counted {
    fn put(&self, data: In<&[u8]>) -> u64 {
        self.0.fetch_add(1, Ordering::SeqCst);
        data.len() as u64
    }
    fn get(&self, len: u64) -> Vec<u8> {
        self.0.fetch_add(1, Ordering::SeqCst);
        vec![7; len as usize]
    }
}

/// Messages the server takes: 64 KiB, a quarter of what the clients below allow.
const SERVER_LIMIT: usize = 64 << 10;

fn store() -> RunningServer {
    let config =
        ServerConfig { timing: Timing { max_message: SERVER_LIMIT, ..Timing::default() }, ..Default::default() };
    Server::bind("udp://127.0.0.1:0")
        .unwrap()
        .with_config(config)
        .export(StoreServer::new(Counted(AtomicU64::new(0))))
        .start()
        .unwrap()
}

fn client(server: &RunningServer, transport: &str) -> StoreClient {
    let config =
        ClientConfig { timing: Timing { max_message: 4 * SERVER_LIMIT, ..Timing::default() }, ..Default::default() };
    let addr = format!("{transport}{}", server.addr());
    Client::connect(addr.as_str()).unwrap().with_config(config).import().unwrap()
}

#[test]
fn a_result_too_large_after_the_procedure_ran_says_it_ran() {
    let server = store();
    for transport in ["udp://", "shm:"] {
        let c = client(&server, transport);
        let before = server.stats().calls;
        let err = c.get(2 * SERVER_LIMIT as u64).unwrap_err();
        assert!(matches!(err, CallError::ResultTooLarge(_)), "{transport}: {err:?}");
        assert_eq!(err.execution(), Execution::Ran, "{transport}");
        assert_eq!(server.stats().calls, before + 1, "{transport}: it did run");
        assert_eq!(c.get(10).unwrap(), vec![7; 10], "{transport}: the binding goes on");
    }
}

#[test]
fn a_call_too_large_for_the_server_never_runs() {
    let server = store();
    let big = vec![1u8; 2 * SERVER_LIMIT];
    for transport in ["udp://", "shm:"] {
        let c = client(&server, transport);
        let before = server.stats().calls;
        let err = c.put(In(&big)).unwrap_err();
        assert!(matches!(err, CallError::TooLarge(_)), "{transport}: {err:?}");
        assert_eq!(err.execution(), Execution::NeverRan, "{transport}");
        assert_eq!(server.stats().calls, before, "{transport}: it did not run");
        assert_eq!(c.put(In(&big[..100])).unwrap(), 100);
    }
}

#[test]
fn a_call_larger_than_the_servers_memory_could_ever_hold_fails_at_once_on_every_transport() {
    // A binding may hold 1 MiB; the messages the server takes may be 16 MiB. A 2 MiB call is
    // refused `TooLarge` from its first fragment, header or look, not `Busy`: trying again after
    // a backoff, until `dead_after` of refusals, could never make room for it.
    let config = ServerConfig { binding_memory: 1 << 20, ..ServerConfig::default() };
    let server = Server::bind("udp://127.0.0.1:0")
        .unwrap()
        .with_config(config)
        .export(StoreServer::new(Counted(AtomicU64::new(0))))
        .start()
        .unwrap();
    let big = vec![1u8; 2 << 20];
    for transport in ["udp://", "shm:", "tcp://"] {
        let c: StoreClient = Client::connect(format!("{transport}{}", server.addr())).unwrap().import().unwrap();
        let (calls, busy, too_large) = (server.stats().calls, server.stats().busy, server.stats().too_large);
        let err = c.put(In(&big)).unwrap_err();
        assert!(matches!(err, CallError::TooLarge(_)), "{transport}: {err:?}");
        assert_eq!(err.execution(), Execution::NeverRan, "{transport}");
        assert_eq!(server.stats().calls, calls, "{transport}: it did not run");
        assert_eq!(server.stats().busy, busy, "{transport}: not refused as busy, so not tried again");
        assert_eq!(server.stats().too_large, too_large + 1, "{transport}: refused once, as too large");
        assert_eq!(c.put(In(&big[..100 << 10])).unwrap(), 100 << 10, "{transport}: the binding goes on");
    }
}

#[test]
fn importing_from_a_closed_port_fails_at_once_with_no_server() {
    // A port nobody listens on: the kernel answers with ICMP port unreachable.
    let port = UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = ClientConfig { shared_memory: false, ..Default::default() };
    let err = Client::connect(format!("udp://127.0.0.1:{port}"))
        .unwrap()
        .with_config(config)
        .import::<StoreClient>()
        .unwrap_err();
    assert!(err.to_string().contains(&format!("127.0.0.1:{port}")), "{err}");
    assert!(matches!(err, BindError::NoServer(a) if a.port() == port), "{err:?}");
    assert_eq!(Error::from(err).execution(), Execution::NeverRan);
}

#[test]
fn a_server_address_in_use_is_named() {
    let first = store();
    let err = Server::bind(format!("udp://{}", first.addr()).as_str()).unwrap_err();
    assert!(matches!(&err, ServerError::Listen { addr, .. } if *addr == first.addr()), "{err:?}");
    assert!(err.to_string().contains(&first.addr().to_string()), "{err}");
    assert!(err.to_string().to_lowercase().contains("in use"), "{err}");
}
