//! A live `tiercel serve` attacked from its own host, through the shared-memory transport: bindings
//! that publish maximum-size calls on every slot and never read the results, connections that hold
//! the rendezvous with a byte every half second, and an impostor of another user that takes the
//! names a client might be sent to. The server's resident memory stays under its message budget
//! plus a fixed overhead, the slow connections cost no thread and keep no client from binding (over
//! UDP while they last), and no client ever talks to the impostor.

use std::io::{Read, Write};
use std::net::{SocketAddr, UdpSocket};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tiercel::{BindError, Client, Transport};
use tiercel_bench::seeds::TestClient;
use tiercel_proto::bind::wire::{BindGrant, BindRequest};
use tiercel_proto::bind::{BindDecision, BindServer, InterfaceSpec, Rendezvous};
use tiercel_proto::shm::{self as proto, header, slot, Layout};
use tiercel_proto::wire::{Header, Kind, Packet, HEADER_LEN};
use tiercel_sys::shm::Region;

mod common;

use common::{null_latency, Served, TIERCEL};

/// The server's budget for messages in flight in the memory test, MiB.
const BUDGET_MIB: u64 = 64;
/// Resident memory a server has besides messages (code, stacks, buffers of its workers), MiB.
const OVERHEAD_MIB: u64 = 48;
/// The user the impostor runs as.
const NOBODY: u32 = 65534;

/// The rendezvous name `tiercel serve` printed, without the `@`.
fn rendezvous_of(served: &Served) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let found = served
            .lines
            .lock()
            .unwrap()
            .iter()
            .find_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("@")).map(str::to_string));
        if let Some(name) = found {
            return name;
        }
        assert!(Instant::now() < deadline, "the server printed no rendezvous");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn connect_abstract(name: &str) -> std::io::Result<UnixStream> {
    UnixStream::connect_addr(&UnixAddr::from_abstract_name(name.as_bytes())?)
}

fn test_spec() -> InterfaceSpec<'static> {
    let info = <TestClient as tiercel::Import>::INFO;
    tiercel_seeds::bind_spec(info)
}

/// A shared-memory binding made by hand, whose slots the caller writes as it likes.
struct HandBinding {
    region: Region,
    layout: Layout,
    _stream: UnixStream,
}

impl HandBinding {
    fn bind(name: &str) -> HandBinding {
        let stream = connect_abstract(name).unwrap();
        let spec = test_spec();
        let request = BindRequest {
            interface: spec.id,
            version: spec.version,
            max_datagram: 0,
            nonce: 1,
            fingerprint: spec.fingerprint,
            proof: None,
            rendezvous: false,
            features: tiercel_proto::bind::wire::features::ALL,
            list: false,
            ask_key: false,
        };
        let payload = request.to_bytes(0);
        let h =
            Header { payload_len: payload.len() as u32, message_len: payload.len() as u32, ..Header::new(Kind::Bind) };
        let bytes = [&h.to_bytes()[..], &payload].concat();
        (&stream).write_all(&[&(bytes.len() as u32).to_le_bytes()[..], &bytes].concat()).unwrap();
        let mut msg = [0u8; 256];
        let (n, fd) = tiercel_sys::shm::recv_with_fd(&stream, &mut msg).unwrap();
        let grant = BindGrant::parse(&msg[4 + HEADER_LEN..n]).expect("a grant");
        let layout = Layout::granted(grant.slots, grant.region).unwrap();
        let region = Region::from_fd(fd.unwrap(), layout.region_len().unwrap()).unwrap();
        HandBinding { region, layout, _stream: stream }
    }

    fn word(&self, at: usize) -> &AtomicU32 {
        self.region.u32_at(at).unwrap()
    }

    /// Publishes, in every slot whose previous call is answered (its result left unread), a call
    /// of `procedure` claiming the slot's whole data area. Returns how many were published.
    fn publish_all(&self, procedure: u16) -> usize {
        let mut published = 0;
        self.word(header::SLOTS_USED).store(self.layout.slots, Ordering::SeqCst);
        for i in 0..self.layout.slots {
            let base = self.layout.slot(i);
            let state = self.word(base + slot::STATE);
            if state.load(Ordering::Acquire) == proto::state::CALL {
                continue;
            }
            self.word(base + slot::PROCEDURE).store(procedure as u32, Ordering::Relaxed);
            self.word(base + slot::LEN).store(self.layout.data as u32, Ordering::Relaxed);
            state.store(proto::state::IDLE, Ordering::SeqCst);
            proto::client_publish(state, self.word(header::SERVER_SLEEPING), self.word(header::DOORBELL));
            tiercel_sys::shm::futex_wake(self.word(header::DOORBELL), 1);
            published += 1;
        }
        published
    }
}

#[test]
fn unread_maximum_size_calls_on_every_slot_hold_no_more_than_the_budget() {
    let child = Command::new(TIERCEL)
        .args(["serve", "--addr", "udp://127.0.0.1:0", "--stats-every", "1"])
        .args(["--message-memory-mib", &BUDGET_MIB.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let served = common::collect(child);
    let name = rendezvous_of(&served);
    let client: TestClient = Client::connect(served.addr.trim_start_matches("udp://")).unwrap().import().unwrap();
    assert_eq!(client.binding().transport(), Transport::SharedMemory);
    let quiet = null_latency(&client, 20_000);

    // Four bindings, every slot: a call of `big_in` claiming 16 MiB, published again as soon as
    // it is answered, its result never read. Before budgets, the server mapped every slot's pages
    // while reading them and kept them: about 1 GiB a binding.
    let stop = Arc::new(AtomicBool::new(false));
    let attacker = {
        let (stop, name) = (stop.clone(), name.clone());
        std::thread::spawn(move || {
            let bindings: Vec<HandBinding> = (0..4).map(|_| HandBinding::bind(&name)).collect();
            let mut published = 0;
            while !stop.load(Ordering::Relaxed) {
                published += bindings.iter().map(|b| b.publish_all(4)).sum::<usize>();
                std::thread::sleep(Duration::from_millis(1));
            }
            (published, bindings)
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let attacked = null_latency(&client, 20_000);
    // A new client binds and calls, small and 1 MiB, on every transport, beside the attack.
    let addr = served.addr.trim_start_matches("udp://").parse().unwrap();
    tiercel_bench::seeds::every_transport_serves(addr).expect("a legitimate client beside the unread calls");
    std::thread::sleep(Duration::from_millis(1500));
    let during = served.lines.lock().unwrap().len();
    let peak = served.wait_stats_since(during);
    stop.store(true, Ordering::Relaxed);
    let (published, bindings) = attacker.join().unwrap();
    eprintln!(
        "unread calls: {published} calls of 16 MiB published on 4 bindings × 64 slots; server {peak:?}; \
         legitimate Null (shared memory) median/p99 {:.2}/{:.2} µs quiet, {:.2}/{:.2} µs under attack",
        quiet.0, quiet.1, attacked.0, attacked.1
    );
    assert!(published >= 4 * 64, "the attack ran");
    common::assert_held_within(&peak, BUDGET_MIB, OVERHEAD_MIB);
    // The bindings go, and their memory with them.
    drop(bindings);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let n = served.lines.lock().unwrap().len();
        let stats = served.wait_stats_since(n);
        // What is left: the legitimate binding's control pages and at most its few pages of data,
        // and the UDP binding of the check on every transport (a UDP binding stays until idle).
        if stats["message_memory_kib"] <= 1024 && stats["bindings_held"] == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "the attacker's bindings still hold {stats:?}");
    }
    tiercel_bench::seeds::check_all(&client, 3).expect("the server still serves");
}

#[test]
fn slow_handshakes_hold_no_thread_and_keep_no_local_client_from_shared_memory() {
    let served = common::serve("udp://127.0.0.1:0");
    let name = rendezvous_of(&served);
    let n = served.lines.lock().unwrap().len();
    let before = served.wait_stats_since(n)["threads"];
    let udp: TestClient = Client::connect(served.addr.as_str()).unwrap().import().unwrap();
    let quiet = null_latency(&udp, 2000);

    // Forty connections to the rendezvous, each sending a byte of a bind request every half second
    // (before: each held a thread and a binding place, with a fresh 5-s timeout at every byte).
    let slow: Vec<UnixStream> = (0..40).filter_map(|_| connect_abstract(&name).ok()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let dribbler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut open = slow;
            while !stop.load(Ordering::Relaxed) {
                open.retain(|mut s| s.write_all(&[1]).is_ok());
                std::thread::sleep(Duration::from_millis(500));
            }
            open.len()
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    let client: TestClient =
        Client::connect(served.addr.trim_start_matches("udp://")).unwrap().import().expect("a local client binds");
    let took = t0.elapsed();
    tiercel_bench::seeds::check_all(&client, 3).unwrap();
    let attacked = null_latency(&client, 2000);
    let n = served.lines.lock().unwrap().len();
    let during = served.wait_stats_since(n);
    eprintln!(
        "slow handshakes: bound over {:?} in {took:?} while they held the rendezvous; server threads {before} \
         before, {} during; Null over UDP median/p99 {:.1}/{:.1} µs quiet, {:.1}/{:.1} µs during",
        client.binding().transport(),
        during["threads"],
        quiet.0,
        quiet.1,
        attacked.0,
        attacked.1
    );
    // The dribblers share the client's uid: the server keeps at most 8 of theirs, and the client's
    // connection, whose request came whole, is answered as it arrives.
    assert_eq!(client.binding().transport(), Transport::SharedMemory, "a quick handshake gets through");
    assert_eq!(during["threads"], before + 1, "the client's binding has its thread; a connection binding has none");
    let addr = served.addr.trim_start_matches("udp://").parse().unwrap();
    tiercel_bench::seeds::every_transport_serves(addr).expect("a legitimate client beside the slow handshakes");
    // Each slow connection is closed once its two seconds are over; shared memory is there again.
    std::thread::sleep(Duration::from_millis(2500));
    stop.store(true, Ordering::Relaxed);
    assert_eq!(dribbler.join().unwrap(), 0, "every slow connection was closed");
    let again: TestClient = Client::connect(served.addr.trim_start_matches("udp://")).unwrap().import().unwrap();
    assert_eq!(again.binding().transport(), Transport::SharedMemory);
    tiercel_bench::seeds::check_all(&again, 3).unwrap();
}

/// The impostor: when run with `TIERCEL_IMPOSTOR` set (a comma-separated list of abstract names),
/// listens on each name and reports every connection, and every byte it receives, on stdout.
#[test]
#[ignore = "a helper process of `an_impostor_of_another_user_never_serves_a_client`"]
fn impostor_process() {
    let Ok(names) = std::env::var("TIERCEL_IMPOSTOR") else { return };
    let listeners: Vec<UnixListener> = names
        .split(',')
        .map(|n| UnixListener::bind_addr(&UnixAddr::from_abstract_name(n.as_bytes()).unwrap()).unwrap())
        .collect();
    for l in &listeners {
        l.set_nonblocking(true).unwrap();
    }
    println!("ready");
    let mut open = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        for (l, name) in listeners.iter().zip(names.split(',')) {
            if let Ok((s, _)) = l.accept() {
                println!("connected {name}");
                s.set_nonblocking(true).unwrap();
                open.push(s);
            }
        }
        for s in &mut open {
            let mut buf = [0u8; 2048];
            if let Ok(n @ 1..) = s.read(&mut buf) {
                println!("received {n} bytes");
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs [`impostor_process`] as user `NOBODY` from a copy of this test binary that user can run,
/// and returns it with its output lines as they come.
fn impostor(names: &[&str]) -> Served {
    let dir = std::env::temp_dir().join(format!("tiercel-impostor-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("impostor");
    std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut child = Command::new(&exe)
        .args(["impostor_process", "--exact", "--ignored", "--nocapture", "--test-threads", "1"])
        .env("TIERCEL_IMPOSTOR", names.join(","))
        .uid(NOBODY)
        .gid(NOBODY)
        .current_dir(&dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(std::io::BufRead::read_line(&mut out, &mut line).unwrap() > 0, "the impostor did not start");
        if line.trim_end().ends_with("ready") {
            break;
        }
    }
    let lines = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = lines.clone();
    std::thread::spawn(move || {
        for l in std::io::BufRead::lines(out).map_while(Result::ok) {
            sink.lock().unwrap().push(l);
        }
        let _ = std::fs::remove_dir_all(&dir);
    });
    Served { child, addr: String::new(), lines }
}

/// A UDP responder that says, to a request asking for it, that the server's rendezvous is
/// `rendezvous` (as a real server would have said before it crashed and another process took the
/// name), and grants a plain request a binding. Serves until dropped.
fn lying_server(rendezvous: Rendezvous) -> (SocketAddr, Arc<AtomicBool>) {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let addr = socket.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    std::thread::spawn(move || {
        let exports = [test_spec()];
        let machine = BindServer {
            exports: &exports,
            auth: None,
            incarnation: 9,
            key_required: false,
            key: None,
            max_datagram: 1400,
            trailers: true,
        };
        let mut buf = [0u8; 2048];
        while !stopped.load(Ordering::Relaxed) {
            let Ok((n, from)) = socket.recv_from(&mut buf) else { continue };
            let Ok(p) = Packet::new_checked(&buf[..n]) else { continue };
            if let BindDecision::Admit(a) = machine.on_request(&p, b"peer", n) {
                let answer = if a.request.rendezvous {
                    a.rendezvous(&machine, rendezvous)
                } else {
                    a.grant(&machine, 1, 1, 1, 0)
                };
                let _ = socket.send_to(&answer, from);
            }
        }
    });
    (addr, stop)
}

#[test]
fn an_impostor_of_another_user_never_serves_a_client() {
    tiercel_seeds::needs!(ROOT);
    // The name a server of this address would have had before (fixed by the address), taken by
    // the impostor before the server starts; and a random name it took after learning it.
    let port = tiercel_seeds::free_port();
    let squatted = format!("tiercel/127.0.0.1:{port}");
    let taken_name = [0x5au8; 16];
    let taken = format!("tiercel/{}", taken_name.iter().map(|b| format!("{b:02x}")).collect::<String>());
    let impostor = impostor(&[&squatted, &taken]);

    // The real server starts on that address: shared memory all the same, under its own name,
    // and a plain `host:port` reaches it, not the impostor.
    let served = common::serve(&format!("udp://127.0.0.1:{port}"));
    let name = rendezvous_of(&served);
    assert_ne!(name, squatted);
    let client: TestClient = Client::connect(format!("127.0.0.1:{port}")).unwrap().import().unwrap();
    assert_eq!(client.binding().transport(), Transport::SharedMemory);
    tiercel_bench::seeds::check_all(&client, 3).expect("results from the real server");

    // A server that told the name the impostor holds (its own pid, root's uid): a client that asks
    // for shared memory only refuses the impostor, naming it; a default client binds over UDP.
    let (lying, stop) = lying_server(Rendezvous { name: taken_name, pid: served.child.id(), uid: 0 });
    let err = Client::connect(format!("shm:{lying}")).unwrap().import::<TestClient>().unwrap_err();
    eprintln!("impostor refused: {err}");
    assert!(matches!(err, BindError::SharedMemoryUnavailable { .. }), "{err}");
    assert!(err.to_string().contains(&format!("user {NOBODY}")), "{err}");
    let fallback: TestClient = Client::connect(lying).unwrap().import().unwrap();
    assert_eq!(fallback.binding().transport(), Transport::Udp);
    stop.store(true, Ordering::Relaxed);

    std::thread::sleep(Duration::from_millis(100));
    let seen = impostor.lines.lock().unwrap().clone();
    eprintln!("the impostor saw: {seen:?}");
    assert!(!seen.iter().any(|l| l.contains(&squatted)), "nobody went to the squatted name");
    assert!(!seen.iter().any(|l| l.starts_with("received")), "the impostor was told nothing: {seen:?}");
}
