//! ONC RPC: a tiercel interface served to a C client that `rpcgen` made from the interface's own
//! `.x` file and libtirpc runs, over UDP and TCP; the RFC's reply statuses; retransmitted calls run
//! once; `rpcbind` lists the server while it runs and not after.
//!
//! Needs `rpcgen` (Debian's `rpcsvc-proto`), `libtirpc-dev`, `rpcbind` and a C compiler: `./test`
//! installs them.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tiercel::onc::{OncClient, OncServer, OncTransport, RunningOnc};
use tiercel::{CallError, Execution, OncError};
use tiercel_proto::onc::{self, Accepted, AuthSys, Credential, ReplyStatus};

#[derive(tiercel::Wire, tiercel::Xdr, Debug, Clone, PartialEq)]
pub enum Color {
    Red,
    Green,
    Blue,
}

#[derive(tiercel::Wire, tiercel::Xdr, Debug, Clone, PartialEq)]
pub struct Point {
    pub x: i32,
    pub y: i32,
}

#[derive(tiercel::Wire, tiercel::Xdr, Debug, Clone, PartialEq)]
pub enum Shape {
    Empty,
    Circle(u32),
    Rect { w: u32, h: u32 },
}

#[derive(tiercel::Wire, tiercel::Xdr, Debug, Clone, PartialEq)]
pub struct Node {
    pub value: i32,
    pub next: Option<Box<Node>>,
}

/// Every type XDR has, as the interface's one struct.
#[derive(tiercel::Wire, tiercel::Xdr, Debug, Clone, PartialEq)]
pub struct Everything {
    pub i: i32,
    pub u: u32,
    pub h: i64,
    pub uh: u64,
    pub b: bool,
    pub f: f32,
    pub d: f64,
    pub name: String,
    pub data: Vec<u8>,
    pub key: [u8; 8],
    pub points: Vec<Point>,
    pub pair: [Point; 2],
    pub color: Color,
    pub shape: Shape,
    pub maybe: Option<Point>,
    pub list: Option<Box<Node>>,
}

#[tiercel::interface(onc(program = 0x2000_7101, version = 1))]
pub trait Kitchen {
    #[onc(procedure = 1)]
    fn add(&self, a: i32, b: i32) -> i32;
    /// Returns its argument with every number plus one, every string and list reversed, the
    /// union's next variant and the list one node longer.
    #[onc(procedure = 2)]
    fn change(&self, e: Everything) -> Everything;
    #[onc(procedure = 3)]
    fn length(&self, data: &[u8]) -> u32;
    #[onc(procedure = 4)]
    fn greet(&self, name: &str) -> String;
    /// The caller's uid (from `AUTH_SYS`), or `u32::MAX` without one.
    #[onc(procedure = 5)]
    fn whoami(&self) -> u32;
    #[onc(procedure = 6)]
    fn fail(&self);
    /// Counts its runs.
    #[onc(procedure = 7)]
    fn bump(&self) -> u64;
}

#[derive(Default)]
struct Impl {
    bumps: Arc<AtomicU64>,
}

impl Kitchen for Impl {
    fn add(&self, a: i32, b: i32) -> i32 {
        a.wrapping_add(b)
    }
    fn change(&self, e: Everything) -> Everything {
        change(e)
    }
    fn length(&self, data: &[u8]) -> u32 {
        data.len() as u32
    }
    fn greet(&self, name: &str) -> String {
        if name == "sleep" {
            std::thread::sleep(Duration::from_millis(500));
        }
        format!("hello, {name}")
    }
    fn whoami(&self) -> u32 {
        match tiercel::caller() {
            Some(tiercel::Caller::System { uid, .. }) => uid,
            _ => u32::MAX,
        }
    }
    fn fail(&self) {
        panic!("this procedure always fails");
    }
    fn bump(&self) -> u64 {
        self.bumps.fetch_add(1, Ordering::SeqCst) + 1
    }
}

fn change(e: Everything) -> Everything {
    let p = |p: Point| Point { x: p.x + 1, y: p.y + 1 };
    Everything {
        i: e.i + 1,
        u: e.u + 1,
        h: e.h + 1,
        uh: e.uh + 1,
        b: !e.b,
        f: e.f + 1.0,
        d: e.d + 1.0,
        name: e.name.chars().rev().collect(),
        data: e.data.iter().rev().copied().collect(),
        key: e.key.map(|b| b + 1),
        points: e.points.into_iter().rev().map(p).collect(),
        pair: e.pair.map(p),
        color: match e.color {
            Color::Red => Color::Green,
            Color::Green => Color::Blue,
            Color::Blue => Color::Red,
        },
        shape: match e.shape {
            Shape::Empty => Shape::Circle(1),
            Shape::Circle(r) => Shape::Rect { w: r, h: r + 1 },
            Shape::Rect { .. } => Shape::Empty,
        },
        maybe: e.maybe.map(p),
        list: Some(Box::new(Node { value: 0, next: e.list })),
    }
}

fn serve() -> RunningOnc {
    OncServer::new().export(KitchenServer::new(Impl::default())).serve("127.0.0.1:0").unwrap()
}

fn everything() -> Everything {
    Everything {
        i: -5,
        u: 7,
        h: -(1 << 40),
        uh: 1 << 50,
        b: true,
        f: 1.5,
        d: -2.25,
        name: "tiercel".into(),
        data: vec![1, 2, 3],
        key: [9; 8],
        points: vec![Point { x: 1, y: 2 }, Point { x: 3, y: 4 }],
        pair: [Point { x: 5, y: 6 }, Point { x: 7, y: 8 }],
        color: Color::Blue,
        shape: Shape::Circle(4),
        maybe: Some(Point { x: 10, y: 20 }),
        list: Some(Box::new(Node { value: 1, next: Some(Box::new(Node { value: 2, next: None })) })),
    }
}

/// Sends `msg` over UDP and reads the reply, if one comes within a second.
fn udp_exchange(socket: &UdpSocket, to: SocketAddr, msg: &[u8]) -> Option<Vec<u8>> {
    socket.send_to(msg, to).unwrap();
    let mut buf = vec![0u8; 65_536];
    let n = socket.recv(&mut buf).ok()?;
    buf.truncate(n);
    Some(buf)
}

fn call_bytes(
    xid: u32,
    program: u32,
    version: u32,
    procedure: u32,
    credential: &Credential<'_>,
    args: &[u8],
) -> Vec<u8> {
    let mut msg = Vec::new();
    onc::write_call(&mut msg, xid, program, version, procedure, credential);
    msg.extend_from_slice(args);
    msg
}

fn status_of(reply: &[u8]) -> ReplyStatus {
    onc::parse_reply(reply).expect("a reply").status
}

fn udp_socket() -> UdpSocket {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    socket
}

const P: u32 = KitchenOnc::PROGRAM;

#[test]
fn every_xdr_type_round_trips_through_the_server_as_xdr() {
    let server = serve();
    let socket = udp_socket();
    let mut args = Vec::new();
    tiercel::xdr::Xdr::encode(&everything(), &mut args);
    let reply = udp_exchange(&socket, server.udp_addr(), &call_bytes(1, P, 1, 2, &Credential::None, &args)).unwrap();
    let reply = onc::parse_reply(&reply).unwrap();
    assert_eq!(reply.status, ReplyStatus::Accepted(Accepted::Success));
    let mut r = tiercel::xdr::XdrReader::new(reply.results);
    let got: Everything = r.decode().unwrap();
    r.finish().unwrap();
    assert_eq!(got, change(everything()));
}

#[test]
fn each_refusal_gets_the_status_rfc_5531_gives_it_and_nothing_runs() {
    let server = serve();
    let socket = udp_socket();
    let to = server.udp_addr();
    let sys = AuthSys::new(1, b"here", 1234, 100);
    let cases: Vec<(Vec<u8>, ReplyStatus)> = vec![
        (call_bytes(1, P + 1, 1, 1, &Credential::None, &[0; 8]), ReplyStatus::Accepted(Accepted::ProgUnavail)),
        (
            call_bytes(2, P, 2, 1, &Credential::None, &[0; 8]),
            ReplyStatus::Accepted(Accepted::ProgMismatch { low: 1, high: 1 }),
        ),
        (call_bytes(3, P, 1, 99, &Credential::None, &[]), ReplyStatus::Accepted(Accepted::ProcUnavail)),
        (call_bytes(4, P, 1, 1, &Credential::None, &[0; 4]), ReplyStatus::Accepted(Accepted::GarbageArgs)),
        (call_bytes(5, P, 1, 1, &Credential::None, &[0; 12]), ReplyStatus::Accepted(Accepted::GarbageArgs)),
        (call_bytes(6, P, 1, 6, &Credential::None, &[]), ReplyStatus::Accepted(Accepted::SystemErr)),
        (call_bytes(7, P, 1, 0, &Credential::None, &[]), ReplyStatus::Accepted(Accepted::Success)),
        (call_bytes(8, P, 1, 0, &Credential::Sys(sys), &[]), ReplyStatus::Accepted(Accepted::Success)),
    ];
    for (msg, want) in &cases {
        let reply = udp_exchange(&socket, to, msg).unwrap();
        assert_eq!(status_of(&reply), *want, "xid {}", onc::parse_reply(&reply).unwrap().xid);
    }
    let mut other_rpc = call_bytes(9, P, 1, 0, &Credential::None, &[]);
    other_rpc[8..12].copy_from_slice(&3u32.to_be_bytes());
    let reply = udp_exchange(&socket, to, &other_rpc).unwrap();
    assert_eq!(status_of(&reply), ReplyStatus::RpcMismatch { low: 2, high: 2 });
    let mut other_flavor = call_bytes(10, P, 1, 0, &Credential::None, &[]);
    other_flavor[24..28].copy_from_slice(&6u32.to_be_bytes());
    let reply = udp_exchange(&socket, to, &other_flavor).unwrap();
    assert_eq!(status_of(&reply), ReplyStatus::AuthError(onc::auth::REJECTEDCRED));
    assert_eq!(udp_exchange(&socket, to, &[1, 2, 3]), None, "bytes that are not a call get no answer");
    let stats = server.stats();
    assert_eq!(stats.malformed, 1);
    assert_eq!(stats.calls, 3, "the two null calls and the procedure that panicked ran; nothing else");
}

#[test]
fn a_retransmitted_call_runs_once_and_gets_the_same_reply_over_udp_and_tcp() {
    let bumps = Arc::new(AtomicU64::new(0));
    let server =
        OncServer::new().export(KitchenServer::new(Impl { bumps: bumps.clone() })).serve("127.0.0.1:0").unwrap();
    let socket = udp_socket();
    let msg = call_bytes(77, P, 1, 7, &Credential::None, &[]);
    let first = udp_exchange(&socket, server.udp_addr(), &msg).unwrap();
    let again = udp_exchange(&socket, server.udp_addr(), &msg).unwrap();
    assert_eq!(first, again);
    assert_eq!(bumps.load(Ordering::SeqCst), 1);
    // The same xid from another port is another caller's call.
    let other = udp_exchange(&udp_socket(), server.udp_addr(), &msg).unwrap();
    assert_ne!(other, first);
    assert_eq!(bumps.load(Ordering::SeqCst), 2);

    let mut tcp = TcpStream::connect(server.tcp_addr()).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut record = onc::record_mark(msg.len(), true).to_vec();
    record.extend_from_slice(&msg);
    let mut replies = Vec::new();
    for _ in 0..2 {
        tcp.write_all(&record).unwrap();
        let mut mark = [0u8; 4];
        tcp.read_exact(&mut mark).unwrap();
        let len = (u32::from_be_bytes(mark) & !onc::LAST_FRAGMENT) as usize;
        let mut reply = vec![0u8; len];
        tcp.read_exact(&mut reply).unwrap();
        replies.push(reply);
    }
    assert_eq!(replies[0], replies[1]);
    assert_eq!(bumps.load(Ordering::SeqCst), 3, "once over TCP, however often it came");
    assert_eq!(server.stats().replayed, 2);
}

#[test]
fn with_several_udp_threads_a_slow_call_does_not_hold_up_a_quick_one_and_copies_still_run_once() {
    let bumps = Arc::new(AtomicU64::new(0));
    let config = tiercel::onc::OncConfig { udp_threads: 2, ..Default::default() };
    let server = OncServer::new()
        .export(KitchenServer::new(Impl { bumps: bumps.clone() }))
        .config(config)
        .serve("127.0.0.1:0")
        .unwrap();
    let slow: KitchenClient = OncClient::new(server.udp_addr(), OncTransport::Udp)
        .unwrap()
        .retry(Duration::from_millis(20))
        .import()
        .unwrap();
    let quick: KitchenClient = OncClient::new(server.udp_addr(), OncTransport::Udp).unwrap().import().unwrap();
    std::thread::scope(|s| {
        // `greet` of a name that makes the procedure sleep half a second, sent again every 20 ms
        // meanwhile: the copies reach the other thread, which drops them.
        let slow = s.spawn(|| slow.greet("sleep").unwrap());
        std::thread::sleep(Duration::from_millis(100));
        let start = std::time::Instant::now();
        assert_eq!(quick.add(1, 2).unwrap(), 3);
        assert!(start.elapsed() < Duration::from_millis(400), "the quick call waited for the slow one");
        assert_eq!(slow.join().unwrap(), "hello, sleep");
    });
    assert!(server.stats().dropped_copies > 0, "{:?}", server.stats());
    assert_eq!(server.stats().calls, 2);
}

#[test]
fn a_tcp_record_longer_than_the_bound_ends_its_connection_and_the_server_serves_on() {
    let server = serve();
    let mut tcp = TcpStream::connect(server.tcp_addr()).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    tcp.write_all(&onc::record_mark(onc::MAX_FRAGMENT, true)).unwrap();
    let mut buf = [0u8; 4];
    assert!(matches!(tcp.read(&mut buf), Ok(0) | Err(_)), "the connection was closed");
    let reply = udp_exchange(&udp_socket(), server.udp_addr(), &call_bytes(1, P, 1, 0, &Credential::None, &[]));
    assert_eq!(status_of(&reply.unwrap()), ReplyStatus::Accepted(Accepted::Success));
    assert_eq!(server.stats().connections_closed, 1);
}

#[test]
fn the_interceptor_sees_the_callers_credential_and_its_refusal_runs_nothing() {
    let bumps = Arc::new(AtomicU64::new(0));
    let server = OncServer::new()
        .export(KitchenServer::new(Impl { bumps: bumps.clone() }))
        .intercept(|call| match call.caller {
            Some(tiercel::Caller::System { uid: 0, .. }) => Ok(()),
            _ if call.procedure == "whoami" => Ok(()),
            other => Err(format!("{other:?} may not call {}", call.procedure)),
        })
        .serve("127.0.0.1:0")
        .unwrap();
    let socket = udp_socket();
    let to = server.udp_addr();
    let reply = udp_exchange(&socket, to, &call_bytes(1, P, 1, 7, &Credential::None, &[])).unwrap();
    assert_eq!(status_of(&reply), ReplyStatus::AuthError(5), "AUTH_TOOWEAK");
    assert_eq!(bumps.load(Ordering::SeqCst), 0);
    let root = AuthSys::new(1, b"here", 0, 0);
    let reply = udp_exchange(&socket, to, &call_bytes(2, P, 1, 7, &Credential::Sys(root), &[])).unwrap();
    assert_eq!(status_of(&reply), ReplyStatus::Accepted(Accepted::Success));
    assert_eq!(bumps.load(Ordering::SeqCst), 1);
    let user = AuthSys::new(1, b"here", 1234, 100);
    let reply = udp_exchange(&socket, to, &call_bytes(3, P, 1, 5, &Credential::Sys(user), &[])).unwrap();
    assert_eq!(onc::parse_reply(&reply).unwrap().results, 1234u32.to_be_bytes());
}

/// Calls every procedure of `kitchen` and checks what comes back, as `Impl` (and the C server
/// below) answer: `uid` is the uid its binding's credential gives.
fn check_every_procedure(kitchen: &KitchenClient, uid: u32) {
    assert_eq!(kitchen.add(40, 2).unwrap(), 42);
    assert_eq!(kitchen.change(everything()).unwrap(), change(everything()));
    assert_eq!(kitchen.length(&[7; 5000]).unwrap(), 5000);
    assert_eq!(kitchen.greet("Rust").unwrap(), "hello, Rust");
    assert_eq!(kitchen.whoami().unwrap(), uid);
    let failed = kitchen.fail().unwrap_err();
    assert!(matches!(failed, CallError::Onc(OncError::SystemErr)), "{failed:?}");
    assert_eq!(failed.execution(), Execution::MayHaveRun);
    let first = kitchen.bump().unwrap();
    assert_eq!(kitchen.bump().unwrap(), first + 1);
}

#[test]
fn the_generated_client_calls_an_onc_server_over_udp_and_tcp() {
    let server = serve();
    for (transport, addr) in [(OncTransport::Udp, server.udp_addr()), (OncTransport::Tcp, server.tcp_addr())] {
        let kitchen: KitchenClient = OncClient::new(addr, transport).unwrap().import().unwrap();
        assert!(kitchen.binding().is_onc());
        check_every_procedure(&kitchen, u32::MAX);
        let root: KitchenClient = OncClient::new(addr, transport).unwrap().auth_sys("here", 0, 0).import().unwrap();
        check_every_procedure(&root, 0);
        // Eight threads on one binding at once.
        std::thread::scope(|s| {
            for t in 0..8 {
                let kitchen = &kitchen;
                s.spawn(move || {
                    for i in 0..200 {
                        assert_eq!(kitchen.add(t, i).unwrap(), t + i);
                    }
                });
            }
        });
    }
}

/// The same program number in another version: its client reaches the server, which says which
/// versions it serves; a program it does not serve at all is unavailable.
#[tiercel::interface(onc(program = 0x2000_7101, version = 2))]
pub trait KitchenTwo {
    #[onc(procedure = 1)]
    fn add(&self, a: i32, b: i32) -> i32;
}

#[tiercel::interface(onc(program = 0x2000_7102, version = 1))]
pub trait Elsewhere {
    #[onc(procedure = 1)]
    fn add(&self, a: i32, b: i32) -> i32;
}

#[test]
fn a_version_or_program_the_server_lacks_and_a_silent_server_are_told_apart_and_never_ran() {
    let server = serve();
    let two: KitchenTwoClient = OncClient::new(server.udp_addr(), OncTransport::Udp).unwrap().import().unwrap();
    let err = two.add(1, 2).unwrap_err();
    assert!(matches!(err, CallError::Onc(OncError::ProgMismatch { low: 1, high: 1 })), "{err:?}");
    assert_eq!(err.execution(), Execution::NeverRan);
    let elsewhere: ElsewhereClient = OncClient::new(server.tcp_addr(), OncTransport::Tcp).unwrap().import().unwrap();
    let err = elsewhere.add(1, 2).unwrap_err();
    assert!(matches!(err, CallError::Onc(OncError::ProgUnavail)), "{err:?}");
    assert_eq!(err.execution(), Execution::NeverRan);
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let nobody: KitchenClient = OncClient::new(silent.local_addr().unwrap(), OncTransport::Udp)
        .unwrap()
        .timeout(Duration::from_millis(300))
        .import()
        .unwrap();
    let err = nobody.add(1, 2).unwrap_err();
    assert!(matches!(err, CallError::Unreachable { .. }), "{err:?}");
    assert_eq!(err.execution(), Execution::MayHaveRun);
    let err = nobody.with_deadline(Duration::from_millis(100)).add(1, 2).unwrap_err();
    assert!(matches!(err, CallError::DeadlineExceeded { may_have_run: true }), "{err:?}");
}

/// The interface's `.x` file, `rpcgen -N` on it, and a C client built from what it made.
fn build_c_client(dir: &Path) -> PathBuf {
    build_c(dir, ("-l", "kitchen_clnt.c"), "client", C_CLIENT)
}

/// Writes the interface's `.x` file into `dir`, runs `rpcgen -N` for its header, its XDR routines
/// and `stubs` (a flag and the file it writes), and builds `name` from `main` (its own C source)
/// and those: its path.
fn build_c(dir: &Path, stubs: (&str, &str), name: &str, main: &str) -> PathBuf {
    std::fs::write(dir.join("kitchen.x"), KitchenOnc::x_file()).unwrap();
    for (flag, out) in [("-h", "kitchen.h"), ("-c", "kitchen_xdr.c"), stubs] {
        let made = Command::new("rpcgen").current_dir(dir).args(["-N", flag, "-o", out, "kitchen.x"]).output().unwrap();
        let why = String::from_utf8_lossy(&made.stderr);
        assert!(made.status.success(), "rpcgen {flag}: {why}\n{}", KitchenOnc::x_file());
    }
    let source = format!("{name}.c");
    std::fs::write(dir.join(&source), main).unwrap();
    let built = Command::new("cc")
        .current_dir(dir)
        .args(["-Wall", "-I/usr/include/tirpc", "-o", name, &source, stubs.1, "kitchen_xdr.c", "-ltirpc"])
        .output()
        .unwrap();
    assert!(built.status.success(), "cc: {}", String::from_utf8_lossy(&built.stderr));
    dir.join(name)
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tiercel-onc-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_c_client_made_by_rpcgen_calls_every_procedure_over_udp_and_tcp() {
    tiercel_seeds::needs!(RPCGEN, TIRPC, CC);
    let dir = temp_dir("c-client");
    let client = build_c_client(&dir);
    let server = serve();
    for (transport, addr) in [("udp", server.udp_addr()), ("tcp", server.tcp_addr())] {
        let out = Command::new(&client).args([transport, &addr.port().to_string()]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "the C client over {transport}: {text}{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(text.lines().filter(|l| l.starts_with("ok ")).count(), 7, "over {transport}:\n{text}");
    }
    assert_eq!(server.stats().calls, 14);
    let _ = std::fs::remove_dir_all(&dir);
}

/// This host's `rpcbind`: the one running, or one this test starts (and stops when dropped). The
/// tests that use it take turns (`_turn`), so that none stops the one another uses.
struct Rpcbind {
    child: Option<std::process::Child>,
    _turn: std::sync::MutexGuard<'static, ()>,
}

static RPCBIND_TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Drop for Rpcbind {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn rpcinfo() -> Option<String> {
    let out = Command::new("rpcinfo").arg("-p").arg("127.0.0.1").output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn rpcbind() -> Rpcbind {
    let turn = RPCBIND_TURN.lock().unwrap_or_else(|p| p.into_inner());
    if rpcinfo().is_some() {
        return Rpcbind { child: None, _turn: turn };
    }
    let child = Command::new("rpcbind").arg("-f").spawn().expect("rpcbind starts");
    let running = Rpcbind { child: Some(child), _turn: turn };
    for _ in 0..100 {
        if rpcinfo().is_some() {
            return running;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("rpcbind started but does not answer rpcinfo");
}

/// Whether `rpcinfo -p` lists the program over `protocol` at `port`.
fn listed(program: u32, protocol: &str, port: u16) -> bool {
    let want = [program.to_string(), "1".into(), protocol.into(), port.to_string()];
    rpcinfo().unwrap_or_default().lines().any(|l| l.split_whitespace().take(4).eq(want.iter().map(String::as_str)))
}

#[test]
fn rpcbind_lists_the_server_while_it_runs_and_a_c_client_finds_it_there() {
    tiercel_seeds::needs!(ROOT, RPCBIND, RPCGEN, TIRPC, CC);
    let dir = temp_dir("rpcbind");
    let _rpcbind = rpcbind();
    let client = build_c_client(&dir);
    let server =
        OncServer::new().export(KitchenServer::new(Impl::default())).register(true).serve("127.0.0.1:0").unwrap();
    let port = server.udp_addr().port();
    assert!(listed(P, "udp", port) && listed(P, "tcp", server.tcp_addr().port()), "{:?}", rpcinfo());
    for transport in ["rpcbind-udp", "rpcbind-tcp"] {
        let out = Command::new(&client).arg(transport).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "the C client by {transport}: {text}{}", String::from_utf8_lossy(&out.stderr));
    }
    server.stop();
    assert!(!listed(P, "udp", port) && !rpcinfo().unwrap_or_default().contains(&P.to_string()), "{:?}", rpcinfo());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The `Kitchen` program as a C server: `rpcgen -N` makes its dispatch routine, and `C_SERVER`
/// answers as `Impl` does and registers it with `rpcbind` over UDP and TCP.
fn build_c_server(dir: &Path) -> PathBuf {
    // `-m`: the dispatch routine only; `C_SERVER` has the `main` that registers it.
    build_c(dir, ("-m", "kitchen_svc.c"), "server", C_SERVER)
}

/// A child process killed when dropped.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_generated_client_calls_a_c_server_made_by_rpcgen_found_through_rpcbind() {
    tiercel_seeds::needs!(ROOT, RPCBIND, RPCGEN, TIRPC, CC);
    let dir = temp_dir("c-server");
    let _rpcbind = rpcbind();
    let server = build_c_server(&dir);
    let _server = Child(Command::new(&server).spawn().unwrap());
    let mut found = None;
    for _ in 0..100 {
        if let Ok(k) = OncClient::rpcbind("127.0.0.1", OncTransport::Udp).unwrap().import::<KitchenClient>() {
            found = Some(k);
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let by_rpcbind_udp = found.expect("the C server registers with rpcbind");
    check_every_procedure(&by_rpcbind_udp, u32::MAX);
    let by_rpcbind_tcp: KitchenClient = OncClient::rpcbind("127.0.0.1", OncTransport::Tcp).unwrap().import().unwrap();
    check_every_procedure(&by_rpcbind_tcp, u32::MAX);
    // By address: the port rpcbind gave.
    let by_address: KitchenClient = OncClient::new(by_rpcbind_tcp.binding().server(), OncTransport::Tcp)
        .unwrap()
        .auth_sys("rust", 4321, 99)
        .import()
        .unwrap();
    check_every_procedure(&by_address, 4321);
    let err = OncClient::new(by_rpcbind_udp.binding().server(), OncTransport::Udp)
        .unwrap()
        .import::<KitchenTwoClient>()
        .unwrap()
        .add(1, 2)
        .unwrap_err();
    assert!(matches!(err, CallError::Onc(OncError::ProgMismatch { low: 1, high: 1 })), "{err:?}");
    drop(_server);
    let _ = Command::new("rpcinfo").args(["-d", &P.to_string(), "1"]).output();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The `Kitchen` program's procedures in C, answering as `Impl` does.
const C_SERVER: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <rpc/rpc.h>
#include "kitchen.h"

int *add_1_svc(int a, int b, struct svc_req *req) {
    static int r;
    r = a + b;
    return &r;
}

static Node *copy_list(Node *n) {
    if (!n) return NULL;
    Node *c = malloc(sizeof *c);
    c->value = n->value;
    c->next = copy_list(n->next);
    return c;
}

Everything *change_1_svc(Everything e, struct svc_req *req) {
    static Everything r;
    static int kept = 0;
    if (kept) xdr_free((xdrproc_t)xdr_Everything, (char *)&r);
    memset(&r, 0, sizeof r);
    kept = 1;
    r.i = e.i + 1; r.u = e.u + 1; r.h = e.h + 1; r.uh = e.uh + 1; r.b = !e.b; r.f = e.f + 1; r.d = e.d + 1;
    size_t n = strlen(e.name);
    r.name = malloc(n + 1);
    for (size_t k = 0; k < n; k++) r.name[k] = e.name[n - 1 - k];
    r.name[n] = 0;
    r.data.data_len = e.data.data_len;
    r.data.data_val = malloc(e.data.data_len + 1);
    for (u_int k = 0; k < e.data.data_len; k++) r.data.data_val[k] = e.data.data_val[e.data.data_len - 1 - k];
    for (int k = 0; k < 8; k++) r.key[k] = e.key[k] + 1;
    u_int np = e.points.points_len;
    r.points.points_len = np;
    r.points.points_val = malloc((np + 1) * sizeof(Point));
    for (u_int k = 0; k < np; k++) {
        r.points.points_val[k].x = e.points.points_val[np - 1 - k].x + 1;
        r.points.points_val[k].y = e.points.points_val[np - 1 - k].y + 1;
    }
    for (int k = 0; k < 2; k++) { r.pair[k].x = e.pair[k].x + 1; r.pair[k].y = e.pair[k].y + 1; }
    r.color = (e.color + 1) % 3;
    switch (e.shape.kind) {
    case 0: r.shape.kind = 1; r.shape.Shape_u.Circle = 1; break;
    case 1: r.shape.kind = 2; r.shape.Shape_u.Rect.w = e.shape.Shape_u.Circle; r.shape.Shape_u.Rect.h = e.shape.Shape_u.Circle + 1; break;
    default: r.shape.kind = 0; break;
    }
    if (e.maybe) {
        r.maybe = malloc(sizeof(Point));
        r.maybe->x = e.maybe->x + 1;
        r.maybe->y = e.maybe->y + 1;
    }
    r.list = malloc(sizeof(Node));
    r.list->value = 0;
    r.list->next = copy_list(e.list);
    return &r;
}

u_int *length_1_svc(octets data, struct svc_req *req) {
    static u_int r;
    r = data.octets_len;
    return &r;
}

text *greet_1_svc(text name, struct svc_req *req) {
    static char buf[512];
    static text r = buf;
    snprintf(buf, sizeof buf, "hello, %s", name);
    return &r;
}

u_int *whoami_1_svc(struct svc_req *req) {
    static u_int r;
    r = req->rq_cred.oa_flavor == AUTH_SYS ? ((struct authunix_parms *)req->rq_clntcred)->aup_uid : 0xffffffff;
    return &r;
}

void *fail_1_svc(struct svc_req *req) {
    svcerr_systemerr(req->rq_xprt);
    return NULL;
}

u_quad_t *bump_1_svc(struct svc_req *req) {
    static u_quad_t r;
    r++;
    return &r;
}

extern void kitchen_prog_1(struct svc_req *, SVCXPRT *);

int main(void) {
    pmap_unset(KITCHEN_PROG, KITCHEN_V1);
    SVCXPRT *udp = svcudp_create(RPC_ANYSOCK);
    SVCXPRT *tcp = svctcp_create(RPC_ANYSOCK, 0, 0);
    if (!udp || !tcp
        || !svc_register(udp, KITCHEN_PROG, KITCHEN_V1, kitchen_prog_1, IPPROTO_UDP)
        || !svc_register(tcp, KITCHEN_PROG, KITCHEN_V1, kitchen_prog_1, IPPROTO_TCP)) {
        fprintf(stderr, "cannot serve or register the program\n");
        return 1;
    }
    svc_run();
    return 1;
}
"#;

/// A C client of the `Kitchen` program by address (`udp` or `tcp`, then the port on 127.0.0.1) or
/// found through `rpcbind` (`rpcbind-udp` or `rpcbind-tcp`):
/// each line it prints is `ok <procedure>` or `FAIL <procedure>: why`; it exits non-zero on a failure.
const C_CLIENT: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <rpc/rpc.h>
#include "kitchen.h"

static int failed = 0;
#define CHECK(name, cond) do { if (cond) printf("ok %s\n", name); else { printf("FAIL %s: %s\n", name, #cond); failed = 1; } } while (0)

int main(int argc, char **argv) {
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons(argc > 2 ? atoi(argv[2]) : 0);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int sock = RPC_ANYSOCK;
    CLIENT *c;
    if (strncmp(argv[1], "rpcbind-", 8) == 0) {
        c = clnt_create("127.0.0.1", KITCHEN_PROG, KITCHEN_V1, argv[1] + 8);
    } else if (strcmp(argv[1], "udp") == 0) {
        struct timeval wait = { 0, 200000 };
        c = clntudp_create(&addr, KITCHEN_PROG, KITCHEN_V1, wait, &sock);
    } else {
        c = clnttcp_create(&addr, KITCHEN_PROG, KITCHEN_V1, &sock, 0, 0);
    }
    if (!c) { clnt_pcreateerror("create"); return 2; }
    struct timeval total = { 5, 0 };
    clnt_control(c, CLSET_TIMEOUT, (char *)&total);
    c->cl_auth = authunix_create("c-client", 4321, 99, 0, NULL);

    int *sum = add_1(40, 2, c);
    CHECK("add", sum && *sum == 42);

    Everything e;
    memset(&e, 0, sizeof e);
    e.i = -5; e.u = 7; e.h = -(1LL << 40); e.uh = 1ULL << 50; e.b = 1; e.f = 1.5; e.d = -2.25;
    e.name = "tiercel";
    char data[3] = { 1, 2, 3 };
    e.data.data_len = 3; e.data.data_val = data;
    memset(e.key, 9, 8);
    Point points[2] = { { 1, 2 }, { 3, 4 } };
    e.points.points_len = 2; e.points.points_val = points;
    e.pair[0].x = 5; e.pair[0].y = 6; e.pair[1].x = 7; e.pair[1].y = 8;
    e.color = Color_Blue;
    e.shape.kind = 1; e.shape.Shape_u.Circle = 4;
    Point maybe = { 10, 20 };
    e.maybe = &maybe;
    Node second = { 2, NULL };
    Node first = { 1, &second };
    e.list = &first;
    Everything *r = change_1(e, c);
    CHECK("change", r && r->i == -4 && r->u == 8 && r->h == -(1LL << 40) + 1 && r->uh == (1ULL << 50) + 1
        && r->b == 0 && r->f == 2.5 && r->d == -1.25 && strcmp(r->name, "lecreit") == 0
        && r->data.data_len == 3 && r->data.data_val[0] == 3 && r->data.data_val[2] == 1
        && r->key[0] == 10 && r->key[7] == 10
        && r->points.points_len == 2 && r->points.points_val[0].x == 4 && r->points.points_val[1].y == 3
        && r->pair[1].x == 8 && r->pair[1].y == 9 && r->color == Color_Red
        && r->shape.kind == 2 && r->shape.Shape_u.Rect.w == 4 && r->shape.Shape_u.Rect.h == 5
        && r->maybe && r->maybe->x == 11 && r->maybe->y == 21
        && r->list && r->list->value == 0 && r->list->next && r->list->next->value == 1
        && r->list->next->next && r->list->next->next->value == 2 && !r->list->next->next->next);

    char big[5000];
    memset(big, 7, sizeof big);
    octets b = { sizeof big, big };
    u_int *len = length_1(b, c);
    CHECK("length", len && *len == 5000);

    char **hello = greet_1("C", c);
    CHECK("greet", hello && strcmp(*hello, "hello, C") == 0);

    u_int *uid = whoami_1(c);
    CHECK("whoami", uid && *uid == 4321);

    enum clnt_stat st = clnt_call(c, 6, (xdrproc_t)xdr_void, NULL, (xdrproc_t)xdr_void, NULL, total);
    CHECK("fail", st == RPC_SYSTEMERROR);

    st = clnt_call(c, 0, (xdrproc_t)xdr_void, NULL, (xdrproc_t)xdr_void, NULL, total);
    CHECK("null", st == RPC_SUCCESS);

    auth_destroy(c->cl_auth);
    clnt_destroy(c);
    return failed;
}
"#;
