//! Secure bindings: a Noise handshake at bind time that proves the server's key (and the client's),
//! then every packet sealed. Tested through an on-path relay that reads, changes and replays what
//! passes; and against servers and clients holding the wrong keys.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tiercel::{BindError, Caller, Client, ClientConfig, Identity, PublicKey, Server, ServerConfig, Timing};

#[tiercel::interface]
pub trait Vault {
    fn echo(&self, data: Vec<u8>) -> Vec<u8>;
    fn deposit(&self, amount: u64) -> u64;
    /// The caller's key, as the procedure sees it.
    fn whoami(&self) -> Option<[u8; 32]>;
}

#[derive(Default)]
struct Store {
    deposits: Arc<AtomicU64>,
}

impl Vault for Store {
    fn echo(&self, data: Vec<u8>) -> Vec<u8> {
        data
    }
    fn deposit(&self, amount: u64) -> u64 {
        self.deposits.fetch_add(amount, Ordering::Relaxed) + amount
    }
    fn whoami(&self) -> Option<[u8; 32]> {
        match tiercel::caller() {
            Some(Caller::Key { key, .. }) => Some(key),
            _ => None,
        }
    }
}

/// A server with a fresh key pair, over UDP on loopback, counting deposits.
fn keyed(config: ServerConfig) -> (tiercel::RunningServer, Identity, Arc<AtomicU64>) {
    let key = Identity::generate().unwrap();
    let deposits = Arc::new(AtomicU64::new(0));
    let server = Server::bind("127.0.0.1:0")
        .unwrap()
        .with_config(ServerConfig { key: Some(key.clone()), ..config })
        .export(VaultServer::new(Store { deposits: deposits.clone() }))
        .start()
        .unwrap();
    (server, key, deposits)
}

fn quick() -> Timing {
    Timing { dead_after: Duration::from_secs(2), ..Timing::default() }
}

fn secure(key: PublicKey) -> ClientConfig {
    ClientConfig { server_key: Some(key), timing: quick(), ..ClientConfig::default() }
}

#[test]
fn a_secure_binding_calls_with_every_packet_sealed_and_each_side_knows_the_others_key() {
    for cipher in [tiercel::Cipher::Aes256Gcm, tiercel::Cipher::ChaCha20Poly1305] {
        let (server, key, _) = keyed(ServerConfig::default());
        let me = Identity::generate().unwrap();
        let config = ClientConfig { key: Some(me.clone()), cipher, ..secure(key.public()) };
        let client: VaultClient =
            Client::connect(format!("udp://{}", server.addr())).unwrap().with_config(config).import().unwrap();
        assert_eq!(client.binding().server_key(), Some(key.public()));
        assert_eq!(client.deposit(5).unwrap(), 5);
        assert_eq!(client.whoami().unwrap(), Some(me.public().0), "the procedure knows the client's key");
        // Single-packet and multi-packet calls and results.
        for len in [0, 1000, 200_000, 3 << 20] {
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            assert_eq!(client.echo(data.clone()).unwrap(), data, "{cipher:?}, {len} bytes");
        }
        let stats = server.stats();
        assert_eq!((stats.handshakes, stats.unopened), (1, 0), "{stats:?}");
        assert!(stats.landed > 0, "a large call's sealed fragments are opened where they land: {stats:?}");
    }
}

#[test]
fn a_server_with_a_key_refuses_plain_bindings_unless_told_and_a_secure_client_never_binds_plain() {
    let (server, key, _) = keyed(ServerConfig::default());
    let addr = server.addr();
    for target in [format!("udp://{addr}"), format!("tcp://{addr}")] {
        let plain = ClientConfig { timing: quick(), shared_memory: false, ..ClientConfig::default() };
        let err = Client::connect(target.as_str()).unwrap().with_config(plain).import::<VaultClient>().unwrap_err();
        assert!(matches!(err, BindError::KeyRequired), "{target}: {err:?}");
    }
    assert_eq!(server.stats().key_required, 2);
    // Through shared memory (this host's processes, the kernel keeping the region private) a plain
    // binding is still granted.
    let local: VaultClient = Client::connect(format!("shm://{addr}")).unwrap().import().unwrap();
    assert_eq!(local.deposit(1).unwrap(), 1);
    // A secure client asked for TCP binds over TCP, sealed.
    let over_tcp: VaultClient =
        Client::connect(format!("tcp://{addr}")).unwrap().with_config(secure(key.public())).import().unwrap();
    assert_eq!(over_tcp.binding().transport(), tiercel::Transport::Tcp);
    assert_eq!(over_tcp.binding().server_key(), Some(key.public()));
    assert_eq!(over_tcp.deposit(1).unwrap(), 2);
    // Told to, the server takes both.
    let (open, key, _) = keyed(ServerConfig { allow_plain: true, ..ServerConfig::default() });
    let target = format!("udp://{}", open.addr());
    let plain: VaultClient = Client::connect(target.as_str()).unwrap().import().unwrap();
    let sealed: VaultClient =
        Client::connect(target.as_str()).unwrap().with_config(secure(key.public())).import().unwrap();
    assert_eq!((plain.deposit(2).unwrap(), sealed.deposit(3).unwrap()), (2, 5));
    assert_eq!((plain.binding().server_key(), sealed.binding().server_key()), (None, Some(key.public())));
    assert_eq!(plain.whoami().unwrap(), None);
}

#[test]
fn a_client_binds_only_to_a_server_that_proves_the_key_it_expects() {
    let (server, _, deposits) = keyed(ServerConfig::default());
    let impostor = Identity::generate().unwrap();
    let target = format!("udp://{}", server.addr());
    // Expecting another key: the server cannot read the handshake, and says so (which proves
    // nothing, so the client fails the bind, naming the key it expected).
    let err = Client::connect(target.as_str())
        .unwrap()
        .with_config(secure(impostor.public()))
        .import::<VaultClient>()
        .unwrap_err();
    assert!(matches!(err, BindError::KeyNotProven(_, k) if k == impostor.public()), "{err:?}");
    assert!(server.stats().handshakes_dropped >= 1);
    // A server without the key the client expects: the answers that come do not open.
    let (other, _, _) = server_without_key();
    let err = Client::connect(format!("udp://{}", other.addr()))
        .unwrap()
        .with_config(secure(impostor.public()))
        .import::<VaultClient>()
        .unwrap_err();
    assert!(matches!(err, BindError::KeyNotProven(..)), "{err:?}");
    // The shared secret is the handshake's pre-shared key: a client without it gets nothing.
    let secret = tiercel::Secret::new(&[9; 32]).unwrap();
    let (guarded, key, _) = keyed(ServerConfig { secret: Some(secret.clone()), ..ServerConfig::default() });
    let target = format!("udp://{}", guarded.addr());
    let err = Client::connect(target.as_str()).unwrap().with_config(secure(key.public())).import::<VaultClient>();
    assert!(matches!(err, Err(BindError::KeyNotProven(..))), "{:?}", err.err());
    let with_secret = ClientConfig { secret: Some(secret), ..secure(key.public()) };
    let client: VaultClient = Client::connect(target.as_str()).unwrap().with_config(with_secret).import().unwrap();
    assert_eq!(client.deposit(4).unwrap(), 4);
    assert_eq!(deposits.load(Ordering::Relaxed), 0);
}

fn server_without_key() -> (tiercel::RunningServer, (), ()) {
    let server = Server::bind("127.0.0.1:0").unwrap().export(VaultServer::new(Store::default())).start().unwrap();
    (server, (), ())
}

/// What the relay does to the datagrams it passes.
#[derive(Default)]
struct Tamper {
    /// Flip this bit of the next datagram that is at least this long, each way.
    flip: Mutex<Option<usize>>,
    /// Every datagram that passed, client to server.
    upstream: Mutex<Vec<Vec<u8>>>,
    /// Every datagram that passed, server to client.
    downstream: Mutex<Vec<Vec<u8>>>,
    flipped: AtomicU64,
    stop: AtomicBool,
    /// Percent of datagrams dropped, sent twice, and held back to go after the next one.
    faults: Option<(u64, u64, u64)>,
    /// The seeded generator of the faults, and the datagram held back in each direction.
    random: Mutex<u64>,
    held: Mutex<[Option<Vec<u8>>; 2]>,
}

impl Tamper {
    fn with_faults(loss: u64, duplicate: u64, reorder: u64, seed: u64) -> Tamper {
        Tamper { faults: Some((loss, duplicate, reorder)), random: Mutex::new(seed | 1), ..Tamper::default() }
    }

    /// A number below 100 from the seeded generator (xorshift64).
    fn percent(&self) -> u64 {
        let mut x = self.random.lock().unwrap();
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x % 100
    }

    /// What goes out for datagram `d` travelling `way` (0 up, 1 down): nothing, it, it twice, or
    /// it and the one held back before it, in the other order.
    fn pass(&self, way: usize, d: Vec<u8>) -> Vec<Vec<u8>> {
        let Some((loss, duplicate, reorder)) = self.faults else { return vec![d] };
        if self.percent() < loss {
            return vec![];
        }
        let mut held = self.held.lock().unwrap();
        if self.percent() < reorder && held[way].is_none() {
            held[way] = Some(d);
            return vec![];
        }
        let mut out = vec![d.clone()];
        if self.percent() < duplicate {
            out.push(d);
        }
        out.extend(held[way].take());
        out
    }
}

/// An on-path relay on loopback: each client socket gets a socket of its own towards the server,
/// and everything passes both ways, recorded, and changed as `tamper` says.
fn relay(server: SocketAddr, tamper: Arc<Tamper>) -> SocketAddr {
    let front = UdpSocket::bind("127.0.0.1:0").unwrap();
    front.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    let addr = front.local_addr().unwrap();
    let front = Arc::new(front);
    std::thread::spawn(move || {
        let mut backs: HashMap<SocketAddr, Arc<UdpSocket>> = HashMap::new();
        let mut buf = vec![0u8; 70_000];
        while !tamper.stop.load(Ordering::Relaxed) {
            let Ok((n, from)) = front.recv_from(&mut buf) else { continue };
            let back = backs.entry(from).or_insert_with(|| {
                let back = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
                back.connect(server).unwrap();
                back.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
                let (b, f, t) = (back.clone(), front.clone(), tamper.clone());
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 70_000];
                    while !t.stop.load(Ordering::Relaxed) {
                        let Ok(n) = b.recv(&mut buf) else { continue };
                        let mut d = buf[..n].to_vec();
                        t.change(&mut d);
                        t.downstream.lock().unwrap().push(d.clone());
                        for d in t.pass(1, d) {
                            let _ = f.send_to(&d, from);
                        }
                    }
                });
                back
            });
            let mut d = buf[..n].to_vec();
            tamper.change(&mut d);
            tamper.upstream.lock().unwrap().push(d.clone());
            for d in tamper.pass(0, d) {
                let _ = back.send(&d);
            }
        }
    });
    addr
}

impl Tamper {
    fn change(&self, d: &mut [u8]) {
        let mut flip = self.flip.lock().unwrap();
        if let Some(bit) = *flip {
            if bit / 8 < d.len() {
                d[bit / 8] ^= 1 << (bit % 8);
                *flip = None;
                self.flipped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

#[test]
fn an_on_path_relay_reads_nothing_and_each_packet_it_changes_or_replays_is_dropped() {
    let (server, key, deposits) = keyed(ServerConfig { shared_memory: false, ..ServerConfig::default() });
    let tamper = Arc::new(Tamper::default());
    let via = relay(server.addr(), tamper.clone());
    let config = ClientConfig { timing: quick(), ..secure(key.public()) };
    let client: VaultClient = Client::connect(format!("udp://{via}")).unwrap().with_config(config).import().unwrap();
    let marker = b"MARKER-of-the-arguments".repeat(3);
    let big: Vec<u8> = marker.iter().copied().cycle().take(100_000).collect();
    assert_eq!(client.echo(marker.clone()).unwrap(), marker);
    assert_eq!(client.echo(big.clone()).unwrap(), big);
    assert_eq!(client.deposit(10).unwrap(), 10);
    let seen = |w: &[Vec<u8>]| w.iter().any(|d| d.windows(6).any(|x| x == b"MARKER"));
    assert!(!seen(&tamper.upstream.lock().unwrap()), "the arguments crossed the relay in the clear");
    assert!(!seen(&tamper.downstream.lock().unwrap()), "the results crossed the relay in the clear");
    // Each bit the relay flips (in a call, in a result, at every place of the packet) makes that
    // packet dropped and counted; the call's retransmission brings the right result.
    let mut total = 10;
    for bit in (0..(16 + 56 + 8 + 16) * 8).step_by(37) {
        *tamper.flip.lock().unwrap() = Some(bit);
        total += 1;
        assert_eq!(client.deposit(1).unwrap(), total, "bit {bit}");
    }
    assert!(tamper.flipped.load(Ordering::Relaxed) > 0);
    let dropped = server.stats().unopened + client.binding().stats().unopened;
    assert!(dropped >= tamper.flipped.load(Ordering::Relaxed) - 1, "{dropped}");
    assert_eq!(deposits.load(Ordering::Relaxed), total, "every deposit ran once");
    // Replaying every datagram the client sent runs nothing again.
    let calls = server.stats().calls;
    let replay = UdpSocket::bind("127.0.0.1:0").unwrap();
    for d in tamper.upstream.lock().unwrap().iter() {
        replay.send_to(d, server.addr()).unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(server.stats().calls, calls, "a replayed call ran");
    assert_eq!(deposits.load(Ordering::Relaxed), total);
    tamper.stop.store(true, Ordering::Relaxed);
}

/// A server with `key` exporting the Vault under `name` in the directory registry `dir`, holding
/// `base` on its account.
fn named(dir: &std::path::Path, name: &str, key: Identity, base: u64) -> tiercel::RunningServer {
    let deposits = Arc::new(AtomicU64::new(base));
    Server::bind("127.0.0.1:0")
        .unwrap()
        .with_config(ServerConfig { key: Some(key), shared_memory: false, ..ServerConfig::default() })
        .with_registry(tiercel::names::Registry::dir(dir))
        .export_as(name, VaultServer::new(Store { deposits }))
        .start()
        .unwrap()
}

#[test]
fn an_import_by_name_binds_with_the_key_the_entry_carries_and_passes_over_impostors() {
    let dir = std::env::temp_dir().join(format!("tiercel-secure-names-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let registry = tiercel::names::Registry::dir(&dir);
    let key = Identity::generate().unwrap();
    let real = named(&dir, "vault", key.clone(), 1000);
    let entries = registry.lookup("vault").unwrap();
    assert_eq!(entries[0].key, Some(key.public()), "the entry carries the server's key");
    // An impostor whose entry claims the real server's key (a forged entry, or a copy of the
    // real one pointing elsewhere): it cannot prove the key.
    let impostor = named(&dir, "vault-impostor", Identity::generate().unwrap(), 0);
    let forged = tiercel::names::Exporter { name: "vault".into(), addr: impostor.addr(), pid: 1, ..entries[0].clone() };
    let _held = registry.register(&forged).unwrap();
    assert_eq!(registry.lookup("vault").unwrap().len(), 2, "both entries are read");
    let client = Client::connect("udp://vault")
        .unwrap()
        .with_registry(registry.clone())
        .with_config(ClientConfig { timing: quick(), ..ClientConfig::default() });
    for _ in 0..16 {
        let bound: VaultClient = client.import().unwrap();
        assert_eq!(bound.binding().server(), real.addr());
        assert_eq!(bound.binding().server_key(), Some(key.public()), "secure without being told the key");
        assert!(bound.deposit(1).unwrap() > 1000);
    }
    assert!(client.exporters_refused() > 0, "the impostor was met and passed over (16 imports, each starting at either exporter at random: the chance that none met the impostor first is 2^-16)");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn through_loss_duplication_and_reordering_every_secure_call_runs_once_and_returns_whole() {
    let (server, key, deposits) = keyed(ServerConfig { shared_memory: false, ..ServerConfig::default() });
    for seed in [1, 7, 42] {
        let tamper = Arc::new(Tamper::with_faults(10, 10, 10, seed));
        let via = relay(server.addr(), tamper.clone());
        let config = ClientConfig {
            timing: Timing { dead_after: Duration::from_secs(20), ..Timing::default() },
            ..secure(key.public())
        };
        let client: VaultClient =
            Client::connect(format!("udp://{via}")).unwrap().with_config(config).import().unwrap();
        let before = deposits.load(Ordering::Relaxed);
        for i in 1..=60u64 {
            assert_eq!(client.deposit(1).unwrap(), before + i, "seed {seed}: deposit {i}");
        }
        let data: Vec<u8> = (0..150_000).map(|i| (i % 253) as u8).collect();
        assert_eq!(client.echo(data.clone()).unwrap(), data, "seed {seed}: a multi-packet call and result");
        assert_eq!(deposits.load(Ordering::Relaxed), before + 60, "seed {seed}: a deposit ran twice or not at all");
        tamper.stop.store(true, Ordering::Relaxed);
    }
    assert!(server.stats().unopened > 0, "duplicated datagrams are dropped by the replay window");
}

#[test]
fn over_tcp_every_frame_is_sealed_and_a_server_that_cannot_prove_the_key_binds_nothing() {
    let (server, key, deposits) = keyed(ServerConfig::default());
    let target = format!("tcp://{}", server.addr());
    let me = Identity::generate().unwrap();
    for cipher in [tiercel::Cipher::Aes256Gcm, tiercel::Cipher::ChaCha20Poly1305] {
        let config = ClientConfig { key: Some(me.clone()), cipher, ..secure(key.public()) };
        let client: VaultClient = Client::connect(target.as_str()).unwrap().with_config(config).import().unwrap();
        assert_eq!(client.binding().server_key(), Some(key.public()));
        assert_eq!(client.whoami().unwrap(), Some(me.public().0), "the procedure knows the client's key");
        // Calls and results in the connection's buffer and far beyond it (a 16 MiB frame).
        for len in [0, 1000, 200_000, 16 << 20] {
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            assert_eq!(client.echo(data.clone()).unwrap(), data, "{cipher:?}, {len} bytes");
        }
        // Calls of several threads at once on the one connection, each sealed in its turn.
        let before = deposits.load(Ordering::Relaxed);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| (0..50).for_each(|_| assert!(client.deposit(1).unwrap() > before)));
            }
        });
        assert_eq!(deposits.load(Ordering::Relaxed), before + 200);
    }
    assert_eq!((server.stats().handshakes, server.stats().unopened), (2, 0));
    // Expecting another key: the server cannot read the handshake, says so, and the bind fails.
    let impostor = Identity::generate().unwrap();
    let err = Client::connect(target.as_str()).unwrap().with_config(secure(impostor.public())).import::<VaultClient>();
    assert!(matches!(err, Err(BindError::KeyNotProven(_, k)) if k == impostor.public()), "{:?}", err.err());
    // A server without a key at all: the same.
    let (other, _, _) = server_without_key();
    let err = Client::connect(format!("tcp://{}", other.addr()))
        .unwrap()
        .with_config(secure(key.public()))
        .import::<VaultClient>();
    assert!(matches!(err, Err(BindError::KeyNotProven(..))), "{:?}", err.err());
}

/// What the TCP relay does to the bytes it passes.
#[derive(Default)]
struct StreamTamper {
    /// Every byte that passed, client to server and server to client.
    upstream: Mutex<Vec<u8>>,
    downstream: Mutex<Vec<u8>>,
    /// Flip this bit of the next read, in this direction (0 up, 1 down).
    flip: Mutex<Option<(usize, usize)>>,
}

/// An on-path TCP relay on loopback: each connection gets one towards the server, and the bytes
/// pass both ways, recorded, and changed as `tamper` says.
fn tcp_relay(server: SocketAddr, tamper: Arc<StreamTamper>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for front in listener.incoming() {
            let Ok(front) = front else { return };
            let back = TcpStream::connect(server).unwrap();
            for (way, mut from, mut to) in
                [(0, front.try_clone().unwrap(), back.try_clone().unwrap()), (1, back, front)]
            {
                let t = tamper.clone();
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 1 << 16];
                    while let Ok(n) = from.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        let mut flip = t.flip.lock().unwrap();
                        if let Some((w, bit)) = *flip {
                            if w == way && bit / 8 < n {
                                buf[bit / 8] ^= 1 << (bit % 8);
                                *flip = None;
                            }
                        }
                        drop(flip);
                        let record = if way == 0 { &t.upstream } else { &t.downstream };
                        record.lock().unwrap().extend_from_slice(&buf[..n]);
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = to.shutdown(std::net::Shutdown::Both);
                });
            }
        }
    });
    addr
}

#[test]
fn an_on_path_tcp_relay_reads_nothing_and_a_frame_it_changes_or_replays_runs_nothing() {
    let (server, key, deposits) = keyed(ServerConfig::default());
    let tamper = Arc::new(StreamTamper::default());
    let via = tcp_relay(server.addr(), tamper.clone());
    let target = format!("tcp://{via}");
    let connect = || -> VaultClient {
        Client::connect(target.as_str()).unwrap().with_config(secure(key.public())).import().unwrap()
    };
    let client = connect();
    let marker = b"MARKER-of-the-arguments".repeat(3);
    let big: Vec<u8> = marker.iter().copied().cycle().take(300_000).collect();
    assert_eq!(client.echo(marker.clone()).unwrap(), marker);
    assert_eq!(client.echo(big.clone()).unwrap(), big);
    assert_eq!(client.deposit(10).unwrap(), 10);
    let seen = |w: &[u8]| w.windows(6).any(|x| x == b"MARKER");
    assert!(!seen(&tamper.upstream.lock().unwrap()), "the arguments crossed the relay in the clear");
    assert!(!seen(&tamper.downstream.lock().unwrap()), "the results crossed the relay in the clear");
    // Replaying everything the client sent, on a connection of its own, runs nothing: the
    // handshake is answered with keys the replayer does not have, and the calls do not open.
    let calls = server.stats().calls;
    let unopened = server.stats().unopened;
    let mut replay = TcpStream::connect(server.addr()).unwrap();
    replay.write_all(&tamper.upstream.lock().unwrap()).unwrap();
    replay.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut answer = Vec::new();
    let _ = replay.read_to_end(&mut answer);
    assert_eq!(server.stats().calls, calls, "a replayed call ran");
    assert_eq!(deposits.load(Ordering::Relaxed), 10);
    assert_eq!(server.stats().unopened, unopened + 1, "the replayed call did not open, and ended the connection");
    // A bit flipped in a call: the server cannot open the frame and ends the connection; the call
    // never ran. In a result: the client cannot open it and fails the call (it ran). A length
    // prefix changed leaves the frame unfinished or cut short: the connection ends when the frame
    // does not open, or the call fails when the server has been silent too long.
    for (way, bit) in [(0, 5), (0, 200), (0, 700), (1, 9), (1, 300), (1, 700)] {
        let client = connect();
        assert_eq!(client.deposit(0).unwrap(), deposits.load(Ordering::Relaxed));
        let before = deposits.load(Ordering::Relaxed);
        *tamper.flip.lock().unwrap() = Some((way, bit));
        let err = client.deposit(1).unwrap_err();
        let prefix = bit < 32;
        let lost = matches!(err, tiercel::CallError::ConnectionLost { .. });
        let silent = matches!(err, tiercel::CallError::Unreachable { .. });
        assert!(lost || (prefix && silent), "{way} {bit}: {err:?}");
        let ran = deposits.load(Ordering::Relaxed) - before;
        assert_eq!(ran, way as u64, "{way} {bit}: a changed call ran, or a result was lost before it ran");
        if way == 1 && !prefix {
            assert_eq!(client.binding().stats().unopened, 1);
        }
    }
}

/// A keyed server like [`keyed`]'s at `addr`, with `key`.
fn keyed_at(addr: SocketAddr, key: &Identity) -> (tiercel::RunningServer, Arc<AtomicU64>) {
    let deposits = Arc::new(AtomicU64::new(0));
    let config = ServerConfig { key: Some(key.clone()), shared_memory: false, ..ServerConfig::default() };
    let server = Server::bind(addr)
        .unwrap()
        .with_config(config)
        .export(VaultServer::new(Store { deposits: deposits.clone() }))
        .start()
        .unwrap();
    (server, deposits)
}

#[test]
fn what_a_client_sent_replayed_to_the_restarted_server_runs_nothing() {
    let key = Identity::generate().unwrap();
    let (server, deposits) = keyed_at("127.0.0.1:0".parse().unwrap(), &key);
    let addr = server.addr();
    let (datagrams, stream) = (Arc::new(Tamper::default()), Arc::new(StreamTamper::default()));
    let (udp_via, tcp_via) = (relay(addr, datagrams.clone()), tcp_relay(addr, stream.clone()));
    for target in [format!("udp://{udp_via}"), format!("tcp://{tcp_via}")] {
        let client: VaultClient =
            Client::connect(target.as_str()).unwrap().with_config(secure(key.public())).import().unwrap();
        client.deposit(5).unwrap();
        client.echo(vec![1; 100_000]).unwrap();
    }
    assert_eq!(deposits.load(Ordering::Relaxed), 10);
    datagrams.stop.store(true, Ordering::Relaxed);
    server.shutdown();
    // The same key at the same address: the handshake's first message is read again (it is a
    // new bind), but the calls that follow were sealed with the old binding's keys.
    let (restarted, deposits) = keyed_at(addr, &key);
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    for d in datagrams.upstream.lock().unwrap().iter() {
        socket.send_to(d, addr).unwrap();
    }
    let mut replay = TcpStream::connect(addr).unwrap();
    replay.write_all(&stream.upstream.lock().unwrap()).unwrap();
    replay.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let _ = replay.read_to_end(&mut Vec::new());
    std::thread::sleep(Duration::from_millis(300));
    let stats = restarted.stats();
    assert_eq!((stats.calls, deposits.load(Ordering::Relaxed)), (0, 0), "a replayed call ran: {stats:?}");
    assert!(stats.unopened >= 2, "the replayed calls were dropped as unopened: {stats:?}");
}

#[test]
fn a_flood_of_handshakes_from_one_address_leaves_the_budget_to_clients_at_others() {
    // 400 handshakes a second: one address gets 100 of them.
    let (server, key, _) = keyed(ServerConfig { handshakes_per_second: 400, ..ServerConfig::default() });
    let addr = server.addr();
    let stop = Arc::new(AtomicBool::new(false));
    // Handshakes that will not open (another key's, garbage), from 127.0.0.2, as fast as it can.
    let flood = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let socket = UdpSocket::bind("127.0.0.2:0").unwrap();
            let outer = tiercel_proto::seal::Outer { kind: tiercel_proto::seal::SealType::Hello, index: 1, counter: 0 };
            let hello = [&outer.to_bytes()[..], &[7u8; 200]].concat();
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let _ = socket.send_to(&hello, addr);
                sent += 1;
            }
            sent
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    // Clients at 127.0.0.1 bind securely all the while.
    for i in 0..10 {
        let client: VaultClient = Client::connect(format!("udp://{addr}"))
            .unwrap()
            .with_config(secure(key.public()))
            .import()
            .unwrap_or_else(|e| panic!("bind {i} during the flood: {e}"));
        assert_eq!(client.deposit(1).unwrap(), i + 1);
    }
    stop.store(true, Ordering::Relaxed);
    let sent = flood.join().unwrap();
    let stats = server.stats();
    assert_eq!(stats.handshakes, 10, "{stats:?}");
    assert!(stats.handshakes_dropped > sent / 2, "{sent} sent by the flood, {stats:?}");
}
