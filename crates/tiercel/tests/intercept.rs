//! Who is calling, and a server's say over each call before it runs, over every transport: a
//! procedure asks `tiercel::caller()`, and an interceptor given to `Server::intercept` sees each
//! call (interface, procedure, caller, deadline) and may refuse it; the caller then learns it never
//! ran.

use std::net::UdpSocket;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tiercel::{
    CallError, CallInfo, Caller, Client, ClientConfig, ClientInterceptor, Execution, OutgoingCall, Server, Transport,
};
use tiercel_proto::bind::wire::features;
use tiercel_proto::wire::{flags, Header, Kind, Packet, Status};

#[tiercel::interface]
pub trait Vault {
    fn read(&self, key: u32) -> u64;
    fn write(&self, key: u32, value: u64);
    /// The caller as the procedure sees it, as text.
    fn whoami(&self) -> String;
}

struct Store {
    writes: Arc<AtomicU64>,
}

impl Vault for Store {
    fn read(&self, key: u32) -> u64 {
        u64::from(key) * 2
    }
    fn write(&self, _key: u32, _value: u64) {
        self.writes.fetch_add(1, Ordering::Relaxed);
    }
    fn whoami(&self) -> String {
        format!("{:?}", tiercel::caller())
    }
}

/// What the interceptor saw: procedure, caller, whether a deadline came, transport.
type Seen = Arc<Mutex<Vec<(&'static str, Option<Caller>, bool, &'static str)>>>;

/// A server whose interceptor refuses `write` (read-only) and records every call; with its count of
/// writes that ran.
fn vault() -> (tiercel::RunningServer, Arc<AtomicU64>, Seen) {
    let writes = Arc::new(AtomicU64::new(0));
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let server = Server::bind("udp://127.0.0.1:0")
        .unwrap()
        .export(VaultServer::new(Store { writes: writes.clone() }))
        .intercept(move |call: &CallInfo| {
            assert_eq!((call.interface, call.version), ("Vault", 1));
            log.lock().unwrap().push((call.procedure, call.caller, call.deadline.is_some(), call.transport));
            match call.procedure {
                "write" => Err("this vault is read-only".to_owned()),
                _ => Ok(()),
            }
        })
        .start()
        .unwrap();
    (server, writes, seen)
}

#[test]
fn an_interceptor_refuses_calls_before_they_run_on_every_transport() {
    let (server, writes, seen) = vault();
    let addr = server.addr();
    let mut refused = 0;
    for (target, transport) in [
        (format!("udp://{addr}"), Transport::Udp),
        (format!("tcp://{addr}"), Transport::Tcp),
        (addr.to_string(), Transport::SharedMemory),
    ] {
        let client: VaultClient = Client::connect(target.as_str()).unwrap().import().unwrap();
        assert_eq!(client.binding().transport(), transport);
        assert_eq!(client.read(21).unwrap(), 42, "{target}");
        let err = client.write(1, 2).unwrap_err();
        assert!(matches!(&err, CallError::Refused(why) if why == "this vault is read-only"), "{target}: {err:?}");
        assert_eq!(err.execution(), Execution::NeverRan, "{target}");
        assert_eq!(err.to_string(), "the server refused the call: this vault is read-only");
        refused += 1;
        // The binding goes on after a refusal.
        assert_eq!(client.with_deadline(Duration::from_secs(5)).read(5).unwrap(), 10, "{target}");
    }
    assert_eq!(writes.load(Ordering::Relaxed), 0, "no refused call ran");
    assert_eq!(server.stats().refused, refused);
    let seen = seen.lock().unwrap();
    let transports: Vec<_> = seen.iter().map(|s| (s.0, s.2, s.3)).collect();
    assert_eq!(
        transports,
        [
            ("read", false, "udp"),
            ("write", false, "udp"),
            ("read", true, "udp"),
            ("read", false, "tcp"),
            ("write", false, "tcp"),
            ("read", true, "tcp"),
            ("read", false, "shm"),
            ("write", false, "shm"),
            ("read", true, "shm"),
        ],
        "each call, once, with its deadline"
    );
}

#[test]
fn procedures_and_interceptors_know_the_caller() {
    let (server, _, seen) = vault();
    let addr = server.addr();
    let me = Caller::Process { uid: tiercel_sys::process::euid(), pid: std::process::id() };
    for target in [format!("udp://{addr}"), format!("tcp://{addr}"), addr.to_string()] {
        let client: VaultClient = Client::connect(target.as_str()).unwrap().import().unwrap();
        let told = client.whoami().unwrap();
        let caller = seen.lock().unwrap().last().unwrap().1.expect("the interceptor saw a caller");
        assert_eq!(told, format!("{:?}", Some(caller)), "the procedure and the interceptor agree");
        match (client.binding().transport(), caller) {
            (Transport::SharedMemory, c) => assert_eq!(c, me, "{target}"),
            (_, Caller::Address(a)) => assert_eq!(a.ip(), addr.ip(), "{target}: {a}"),
            (t, c) => panic!("{target}: {c:?} over {t:?}"),
        }
    }
    assert_eq!(tiercel::caller(), None, "outside a procedure");
}

#[test]
fn an_interceptor_that_panics_refuses_the_call_and_the_server_goes_on() {
    let server = Server::bind("udp://127.0.0.1:0")
        .unwrap()
        .export(VaultServer::new(Store { writes: Arc::default() }))
        .intercept(|call: &CallInfo| match call.procedure {
            "read" => panic!("no rule for reads"),
            _ => Ok(()),
        })
        .start()
        .unwrap();
    let client: VaultClient = Client::connect(format!("udp://{}", server.addr())).unwrap().import().unwrap();
    let err = client.read(1).unwrap_err();
    assert!(matches!(&err, CallError::Refused(why) if why.contains("no rule for reads")), "{err:?}");
    assert_eq!(err.execution(), Execution::NeverRan);
    client.write(1, 1).unwrap();
    assert_eq!(server.stats().refused, 1);
}

#[test]
fn a_clients_interceptor_sees_each_call_and_stops_it_before_it_is_sent() {
    let (server, writes, seen) = vault();
    let addr = server.addr();
    // Each call the client's interceptor saw: procedure, transport, whether it had a deadline.
    type Sent = Arc<Mutex<Vec<(&'static str, Transport, bool)>>>;
    let sent: Sent = Arc::default();
    let log = sent.clone();
    let interceptor = ClientInterceptor::new(move |call: &OutgoingCall| {
        assert_eq!((call.interface, call.server), ("Vault", addr));
        log.lock().unwrap().push((call.procedure, call.transport, call.deadline.is_some()));
        match call.procedure {
            "whoami" => Err("this program does not ask".to_owned()),
            _ => Ok(()),
        }
    });
    let config = ClientConfig { interceptor: Some(interceptor), ..ClientConfig::default() };
    for (target, transport) in [
        (format!("udp://{addr}"), Transport::Udp),
        (format!("tcp://{addr}"), Transport::Tcp),
        (addr.to_string(), Transport::SharedMemory),
    ] {
        let vault: VaultClient =
            Client::connect(target.as_str()).unwrap().with_config(config.clone()).import().unwrap();
        let before = seen.lock().unwrap().len();
        let err = vault.whoami().unwrap_err();
        assert!(matches!(&err, CallError::Intercepted(why) if why == "this program does not ask"), "{err:?}");
        assert_eq!(err.execution(), Execution::NeverRan);
        assert_eq!(seen.lock().unwrap().len(), before, "{target}: the server never saw it");
        assert_eq!(vault.with_deadline(Duration::from_secs(1)).read(2).unwrap(), 4);
        let log = sent.lock().unwrap().split_off(0);
        assert_eq!(log, [("whoami", transport, false), ("read", transport, true)], "{target}");
    }
    assert_eq!(writes.load(Ordering::Relaxed), 0);
}

/// A hand-made client over UDP, granted `features`, sends `write` (procedure 1; the interceptor
/// refuses before the arguments are read, so none are sent): the status of the answer, and its
/// message.
fn refusal_with(server: &tiercel::RunningServer, asked: u16) -> (Status, String) {
    use tiercel_proto::bind::{BindClient, BindEvent};
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.connect(server.addr()).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let spec = tiercel_seeds::bind_spec(<VaultClient as tiercel::Import>::INFO);
    let mut bind = BindClient::new(&spec, 1472, 7, false).with_features(asked);
    socket.send(&bind.packet()).unwrap();
    let mut buf = vec![0u8; 2048];
    let g = loop {
        let n = socket.recv(&mut buf).expect("a bind reply");
        let Ok(p) = Packet::new_checked(&buf[..n]) else { continue };
        if let BindEvent::Granted(g) = bind.handle(&p, None) {
            break g;
        }
    };
    assert_eq!(g.grant.features, asked);
    let call = Header {
        binding: g.binding,
        token: g.token,
        incarnation: g.incarnation,
        seq: 1,
        procedure: 1,
        ..Header::new(Kind::Call)
    };
    socket.send(&call.to_bytes()).unwrap();
    loop {
        let n = socket.recv(&mut buf).expect("an answer");
        let Ok(p) = Packet::new_checked(&buf[..n]) else { continue };
        match (p.kind(), p.status()) {
            // The first packet of a slot's client proves its address first, as a client does.
            (Kind::Reject, Status::AddressUnproven) => {
                let proof = Header { flags: flags::ADDRESS_PROOF, payload_len: p.payload_len(), ..call };
                let proof = Header { kind: Kind::Probe, ..proof };
                socket.send(&[&proof.to_bytes()[..], p.payload()].concat()).unwrap();
                socket.send(&call.to_bytes()).unwrap();
            }
            (Kind::Result, status) => return (status, String::from_utf8_lossy(p.payload()).into_owned()),
            _ => {}
        }
    }
}

#[test]
fn a_client_that_predates_refusals_is_told_its_call_never_ran_as_it_understands() {
    let (server, writes, _) = vault();
    let refused = (Status::Refused, "this vault is read-only".to_owned());
    assert_eq!(refusal_with(&server, features::ALL), refused);
    let older = (Status::BadArguments, "this vault is read-only".to_owned());
    assert_eq!(refusal_with(&server, features::ALL & !features::REFUSED), older);
    assert_eq!(writes.load(Ordering::Relaxed), 0);
    assert_eq!(server.stats().refused, 2);
}

/// An async procedure runs on the server's runtime, not on the thread that took the call: it knows
/// its caller all the same, and the interceptor refuses its calls as any other's.
#[cfg(feature = "async")]
mod asynch {
    use super::*;

    #[tiercel::interface]
    pub trait Teller {
        async fn whoami(&self) -> String;
        async fn withdraw(&self, amount: u64) -> u64;
    }

    struct Bank;

    impl Teller for Bank {
        async fn whoami(&self) -> String {
            tokio::task::yield_now().await;
            format!("{:?}", tiercel::caller())
        }
        async fn withdraw(&self, amount: u64) -> u64 {
            amount
        }
    }

    #[test]
    fn async_procedures_know_the_caller_and_are_refused_alike() {
        let server = Server::bind("udp://127.0.0.1:0")
            .unwrap()
            .export(TellerServer::new(Bank))
            .intercept(|call: &CallInfo| match call.procedure {
                "withdraw" => Err("closed".to_owned()),
                _ => Ok(()),
            })
            .start()
            .unwrap();
        let me = Caller::Process { uid: tiercel_sys::process::euid(), pid: std::process::id() };
        for target in [format!("udp://{}", server.addr()), server.addr().to_string()] {
            let client: TellerClient = Client::connect(target.as_str()).unwrap().import().unwrap();
            let told = client.whoami().unwrap();
            match client.binding().transport() {
                Transport::SharedMemory => assert_eq!(told, format!("{:?}", Some(me))),
                _ => assert!(told.starts_with("Some(Address(127.0.0.1:"), "{told}"),
            }
            let err = client.withdraw(5).unwrap_err();
            assert!(matches!(&err, CallError::Refused(why) if why == "closed"), "{target}: {err:?}");
        }
        assert_eq!(server.stats().refused, 2);
    }

    #[tokio::test]
    async fn an_async_call_is_shown_to_the_clients_interceptor_too() {
        let server = Server::bind("udp://127.0.0.1:0").unwrap().export(TellerServer::new(Bank)).start().unwrap();
        let asked = Arc::new(AtomicU64::new(0));
        let count = asked.clone();
        let client: TellerAsyncClient = Client::connect(server.addr())
            .unwrap()
            .intercept(move |call: &OutgoingCall| {
                count.fetch_add(1, Ordering::Relaxed);
                match call.procedure {
                    "withdraw" => Err("not from here".to_owned()),
                    _ => Ok(()),
                }
            })
            .import_async()
            .await
            .unwrap();
        assert!(client.whoami().await.unwrap().starts_with("Some("));
        let err = client.withdraw(1).await.unwrap_err();
        assert!(matches!(&err, CallError::Intercepted(why) if why == "not from here"), "{err:?}");
        assert_eq!(asked.load(Ordering::Relaxed), 2);
    }
}
