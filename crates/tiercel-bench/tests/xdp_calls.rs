//! tiercel's calls through AF_XDP across two network namespaces joined by a veth pair (as root):
//! every procedure of the seeds' interface both ways with the kernel's UDP stack left out (its
//! counters in both namespaces say so), the fallback to the kernel's UDP with the reason when
//! AF_XDP cannot be had, and the XDP program gone from both interfaces once the server and the
//! client are.
#![cfg(feature = "xdp")]

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;

use tiercel::{Client, Server, ServerConfig, Transport};
use tiercel_seeds::{check_all, fill, pattern, SeedTest, TestClient, TestServer, CHECK_CALLS};

/// Two namespaces and a veth pair between them (`a` at 10.s.0.1, `b` at 10.s.0.2), removed when
/// dropped.
struct Pair {
    a: String,
    b: String,
    va: String,
    vb: String,
    subnet: u8,
}

fn ip(args: &[&str]) {
    let status = Command::new("ip").args(args).status().unwrap();
    assert!(status.success(), "ip {args:?}");
}

impl Pair {
    fn new() -> Pair {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let id = format!("{}{}", std::process::id() % 100_000, NEXT.fetch_add(1, Ordering::Relaxed));
        let subnet = (std::process::id() % 100) as u8 + 100 + NEXT.load(Ordering::Relaxed) as u8;
        let pair =
            Pair { a: format!("tqa{id}"), b: format!("tqb{id}"), va: format!("qa{id}"), vb: format!("qb{id}"), subnet };
        ip(&["netns", "add", &pair.a]);
        ip(&["netns", "add", &pair.b]);
        ip(&["link", "add", &pair.va, "netns", &pair.a, "type", "veth", "peer", "name", &pair.vb, "netns", &pair.b]);
        for (ns, dev, host) in [(&pair.a, &pair.va, 1), (&pair.b, &pair.vb, 2)] {
            ip(&["-n", ns, "addr", "add", &format!("10.{}.0.{host}/24", pair.subnet), "dev", dev]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
        }
        pair
    }

    fn server_ip(&self) -> String {
        format!("10.{}.0.1", self.subnet)
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.a]).status();
        let _ = Command::new("ip").args(["netns", "del", &self.b]).status();
    }
}

/// Moves this thread into network namespace `ns`.
fn enter(ns: &str) {
    let file = std::fs::File::open(format!("/var/run/netns/{ns}")).unwrap();
    rustix::thread::move_into_link_name_space(file.as_fd(), Some(rustix::thread::LinkNameSpaceType::Network)).unwrap();
}

/// Whether interface `dev` in namespace `ns` has an XDP program attached.
fn has_xdp(ns: &str, dev: &str) -> bool {
    let out = Command::new("ip").args(["-n", ns, "-d", "link", "show", dev]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).contains("prog/xdp")
}

/// UDP datagrams the kernel of namespace `ns` has received and sent (`/proc/net/snmp`).
fn kernel_udp(ns: &str) -> (u64, u64) {
    let out = Command::new("ip").args(["netns", "exec", ns, "cat", "/proc/net/snmp"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines().filter(|l| l.starts_with("Udp: "));
    let (names, values) = (lines.next().unwrap(), lines.next().unwrap());
    let field = |name: &str| {
        let i = names.split_whitespace().position(|n| n == name).unwrap();
        values.split_whitespace().nth(i).unwrap().parse::<u64>().unwrap()
    };
    (field("InDatagrams"), field("OutDatagrams"))
}

/// Starts a server of `Test` in namespace `ns` at `addr` with `xdp` as its AF_XDP interface;
/// returns what became of it, and a sender that stops it (the thread then ends).
fn serve(
    ns: &str,
    addr: SocketAddr,
    xdp: &str,
) -> (Option<Result<String, String>>, mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (ns, xdp) = (ns.to_owned(), xdp.to_owned());
    let (told, status) = mpsc::channel();
    let (stop, stopped) = mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        enter(&ns);
        let config = ServerConfig { xdp: Some(xdp), shared_memory: false, ..ServerConfig::default() };
        let server = Server::bind(addr).unwrap().with_config(config).export(TestServer::new(SeedTest)).start().unwrap();
        told.send(server.xdp()).unwrap();
        let _ = stopped.recv();
        server.stop();
    });
    (status.recv().unwrap(), stop, thread)
}

/// Starts a server of `Test` in namespace `ns` at `addr`, without AF_XDP.
fn serve_plain(
    ns: &str,
    addr: SocketAddr,
) -> (Option<Result<String, String>>, mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let ns = ns.to_owned();
    let (told, status) = mpsc::channel();
    let (stop, stopped) = mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        enter(&ns);
        let config = ServerConfig { shared_memory: false, ..ServerConfig::default() };
        let server = Server::bind(addr).unwrap().with_config(config).export(TestServer::new(SeedTest)).start().unwrap();
        told.send(server.xdp()).unwrap();
        let _ = stopped.recv();
        server.stop();
    });
    (status.recv().unwrap(), stop, thread)
}

/// Runs `calls` on a thread of its own in namespace `ns`.
fn in_namespace<T: Send + 'static>(ns: &str, calls: impl FnOnce() -> T + Send + 'static) -> T {
    let ns = ns.to_owned();
    std::thread::spawn(move || {
        enter(&ns);
        calls()
    })
    .join()
    .unwrap()
}

#[test]
fn every_procedure_goes_through_af_xdp_and_the_program_is_gone_once_client_and_server_are() {
    tiercel_seeds::needs!(ROOT, IP, CLANG, LIBBPF);
    let pair = Pair::new();
    let port = tiercel_seeds::free_port();
    let addr: SocketAddr = format!("{}:{port}", pair.server_ip()).parse().unwrap();
    let (status, stop, server) = serve(&pair.a, addr, &pair.va);
    let said = status.expect("the server was given an interface").expect("the server has AF_XDP");
    assert!(said.contains(&pair.va) && said.contains("driver"), "{said}");
    assert!(has_xdp(&pair.a, &pair.va));
    let before = (kernel_udp(&pair.a), kernel_udp(&pair.b));
    const ROUNDS: u32 = 20;
    let (transport, refused, stats) = in_namespace(&pair.b, move || {
        let client: TestClient = Client::connect(format!("xdp://{addr}")).unwrap().import().unwrap();
        let binding = client.binding().clone();
        for round in 0..ROUNDS {
            check_all(&client, round).unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        // A call and a result of many packets each (64 KiB in frames of one MTU).
        let mut big = vec![0u8; 64 << 10];
        fill(&mut big);
        client.bulk_in_out(tiercel::InOut(&mut big)).unwrap();
        assert!(big.iter().enumerate().all(|(i, &b)| b == pattern(i)), "64 KiB came back changed");
        (binding.transport(), binding.xdp_refused(), binding.stats())
    });
    assert_eq!((transport, refused), (Transport::Xdp, None));
    assert_eq!(stats.malformed, 0, "{stats:?}");
    let after = (kernel_udp(&pair.a), kernel_udp(&pair.b));
    // The bind exchange goes through the client's kernel (a few datagrams); the calls do not.
    let calls = u64::from(ROUNDS) * CHECK_CALLS + 1;
    for (side, (before, after)) in [("server", (before.0, after.0)), ("client", (before.1, after.1))] {
        let (received, sent) = (after.0 - before.0, after.1 - before.1);
        assert!(received <= 4 && sent <= 4, "{side}'s kernel: {received} in, {sent} out, for {calls} calls");
    }
    // The client's thread ended, and with it its endpoint and the binding: its station is gone.
    assert!(!has_xdp(&pair.b, &pair.vb), "the client's program stayed on {}", pair.vb);
    stop.send(()).unwrap();
    server.join().unwrap();
    assert!(!has_xdp(&pair.a, &pair.va), "the server's program stayed on {}", pair.va);
}

/// Attaches another XDP program (tiercel's, steering nothing) to `dev` in namespace `ns` until the
/// sender returned is used or dropped.
fn hold(ns: &str, dev: &str) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (ns, dev) = (ns.to_owned(), dev.to_owned());
    let (release, released) = mpsc::channel::<()>();
    let (held_tx, held) = mpsc::channel();
    let holder = std::thread::spawn(move || {
        enter(&ns);
        let steering = tiercel_sys::xdp::Steering::attach(&dev).unwrap();
        held_tx.send(()).unwrap();
        let _ = released.recv();
        drop(steering);
    });
    held.recv().unwrap();
    (release, holder)
}

#[test]
fn without_af_xdp_a_binding_and_a_server_use_the_kernels_udp_and_say_why() {
    tiercel_seeds::needs!(ROOT, IP, CLANG, LIBBPF);
    let pair = Pair::new();
    // Another program holds each interface's hook: tiercel's cannot be attached there.
    let holders = [hold(&pair.a, &pair.va), hold(&pair.b, &pair.vb)];
    let port = tiercel_seeds::free_port();
    let addr: SocketAddr = format!("{}:{port}", pair.server_ip()).parse().unwrap();
    let (status, stop, server) = serve(&pair.a, addr, &pair.va);
    let why = status.expect("the server was given an interface").expect_err("the interface was taken");
    assert!(why.contains(&pair.va), "{why}");
    let (transport, refused) = in_namespace(&pair.b, move || {
        let client: TestClient = Client::connect(format!("xdp://{addr}")).unwrap().import().unwrap();
        check_all(&client, 0).unwrap();
        (client.binding().transport(), client.binding().xdp_refused())
    });
    assert_eq!(transport, Transport::Udp);
    let why = refused.expect("a reason");
    assert!(why.contains(&pair.vb), "{why}");
    for (release, holder) in holders {
        release.send(()).unwrap();
        holder.join().unwrap();
    }
    stop.send(()).unwrap();
    server.join().unwrap();
    assert!(!has_xdp(&pair.a, &pair.va) && !has_xdp(&pair.b, &pair.vb));

    // A server on loopback: no AF_XDP path to it, and the binding says so.
    let server = Server::bind("127.0.0.1:0").unwrap().export(TestServer::new(SeedTest)).start().unwrap();
    let client: TestClient = Client::connect(format!("xdp://{}", server.addr())).unwrap().import().unwrap();
    check_all(&client, 1).unwrap();
    assert_eq!(client.binding().transport(), Transport::Udp);
    let why = client.binding().xdp_refused().expect("a reason");
    assert!(why.contains("loopback"), "{why}");
}

#[test]
fn a_client_through_af_xdp_calls_a_server_without_it_and_back() {
    tiercel_seeds::needs!(ROOT, IP, CLANG, LIBBPF);
    let pair = Pair::new();
    let port = tiercel_seeds::free_port();
    let addr: SocketAddr = format!("{}:{port}", pair.server_ip()).parse().unwrap();
    // The server's kernel takes the client's frames, and sends the results the usual way; the
    // client's program steers them to its socket.
    let (status, stop, server) = serve_plain(&pair.a, addr);
    assert_eq!(status, None);
    let (transport, refused) = in_namespace(&pair.b, move || {
        let client: TestClient = Client::connect(format!("xdp://{addr}")).unwrap().import().unwrap();
        for round in 0..5 {
            check_all(&client, round).unwrap();
        }
        (client.binding().transport(), client.binding().xdp_refused())
    });
    assert_eq!((transport, refused), (Transport::Xdp, None));
    stop.send(()).unwrap();
    server.join().unwrap();
}
