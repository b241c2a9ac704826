//! What the AF_XDP call tests share: two namespaces joined by a veth pair, a server of `Test` in
//! one, threads that enter the other.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;

use tiercel::{Server, ServerConfig};
use tiercel_seeds::{SeedTest, TestServer};

/// Two namespaces and a veth pair between them (`a` at 10.s.0.1, `b` at 10.s.0.2), removed when
/// dropped.
pub struct Pair {
    pub a: String,
    pub b: String,
    pub va: String,
    pub vb: String,
    pub subnet: u8,
}

fn ip(args: &[&str]) {
    let status = Command::new("ip").args(args).status().unwrap();
    assert!(status.success(), "ip {args:?}");
}

impl Pair {
    pub fn new() -> Pair {
        Pair::with_queues(1)
    }

    /// A pair whose interfaces have `queues` receive and transmit queues each: a datagram the
    /// kernel sends leaves on the queue its flow hashes to, and arrives on the peer's queue of the
    /// same number.
    pub fn with_queues(queues: u32) -> Pair {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let id = format!("{}{}", std::process::id() % 100_000, NEXT.fetch_add(1, Ordering::Relaxed));
        let subnet = (std::process::id() % 100) as u8 + 100 + NEXT.load(Ordering::Relaxed) as u8;
        let pair =
            Pair { a: format!("tqa{id}"), b: format!("tqb{id}"), va: format!("qa{id}"), vb: format!("qb{id}"), subnet };
        ip(&["netns", "add", &pair.a]);
        ip(&["netns", "add", &pair.b]);
        let q = queues.to_string();
        ip(&[
            "link",
            "add",
            &pair.va,
            "netns",
            &pair.a,
            "numtxqueues",
            &q,
            "numrxqueues",
            &q,
            "type",
            "veth",
            "peer",
            "name",
            &pair.vb,
            "netns",
            &pair.b,
            "numtxqueues",
            &q,
            "numrxqueues",
            &q,
        ]);
        for (ns, dev, host) in [(&pair.a, &pair.va, 1), (&pair.b, &pair.vb, 2)] {
            ip(&["-n", ns, "addr", "add", &format!("10.{}.0.{host}/24", pair.subnet), "dev", dev]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
        }
        pair
    }

    pub fn server_ip(&self) -> String {
        format!("10.{}.0.1", self.subnet)
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.a]).status();
        let _ = Command::new("ip").args(["netns", "del", &self.b]).status();
    }
}

/// Three namespaces: a client's (`c`, at 10.s.1.2 on `vc`), a router's (`r`, forwarding), and a
/// server's (`s`, at 10.s.2.2 on `vs`), each end joined to the router by a veth pair and routed
/// through it: the server by its default route, the client by a rule that sends what is for the
/// server's subnet to a table of its own (its main table has no route there); removed when
/// dropped.
pub struct Routed {
    pub c: String,
    pub r: String,
    pub s: String,
    pub vc: String,
    pub vs: String,
    pub subnet: u8,
}

impl Routed {
    pub fn new() -> Routed {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let id = format!("{}{}", std::process::id() % 100_000, NEXT.fetch_add(1, Ordering::Relaxed));
        let subnet = (std::process::id() % 100) as u8 + 100;
        let routed = Routed {
            c: format!("trc{id}"),
            r: format!("trr{id}"),
            s: format!("trs{id}"),
            vc: format!("rc{id}"),
            vs: format!("rs{id}"),
            subnet,
        };
        for ns in [&routed.c, &routed.r, &routed.s] {
            ip(&["netns", "add", ns]);
        }
        let (rc, rs) = (format!("rrc{id}"), format!("rrs{id}"));
        ip(&["link", "add", &routed.vc, "netns", &routed.c, "type", "veth", "peer", "name", &rc, "netns", &routed.r]);
        ip(&["link", "add", &routed.vs, "netns", &routed.s, "type", "veth", "peer", "name", &rs, "netns", &routed.r]);
        let net = |side: u8, host: u8| format!("10.{subnet}.{side}.{host}");
        for (ns, dev, address) in [
            (&routed.c, &routed.vc, net(1, 2)),
            (&routed.r, &rc, net(1, 1)),
            (&routed.r, &rs, net(2, 1)),
            (&routed.s, &routed.vs, net(2, 2)),
        ] {
            ip(&["-n", ns, "addr", "add", &format!("{address}/24"), "dev", dev]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
        }
        let servers = format!("10.{subnet}.2.0/24");
        ip(&["-n", &routed.c, "route", "add", &servers, "via", &net(1, 1), "table", "100"]);
        ip(&["-n", &routed.c, "rule", "add", "to", &servers, "table", "100"]);
        ip(&["-n", &routed.s, "route", "add", "default", "via", &net(2, 1)]);
        // Forwarding on in the router's namespace, by a thread in it (`/proc/sys/net` is the
        // writer's namespace's; a fresh machine may have no `sysctl`).
        let router = routed.r.clone();
        let forwarding = std::thread::spawn(move || {
            enter(&router);
            std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")
        });
        forwarding.join().unwrap().expect("the router does not forward");
        routed
    }

    pub fn server_ip(&self) -> String {
        format!("10.{}.2.2", self.subnet)
    }
}

impl Drop for Routed {
    fn drop(&mut self) {
        for ns in [&self.c, &self.r, &self.s] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// Moves this thread into network namespace `ns`.
pub fn enter(ns: &str) {
    let file = std::fs::File::open(format!("/var/run/netns/{ns}")).unwrap();
    rustix::thread::move_into_link_name_space(file.as_fd(), Some(rustix::thread::LinkNameSpaceType::Network)).unwrap();
}

/// Whether interface `dev` in namespace `ns` has an XDP program attached.
pub fn has_xdp(ns: &str, dev: &str) -> bool {
    let out = Command::new("ip").args(["-n", ns, "-d", "link", "show", dev]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).contains("prog/xdp")
}

/// UDP datagrams the kernel of namespace `ns` has received and sent (`/proc/net/snmp`).
pub fn kernel_udp(ns: &str) -> (u64, u64) {
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

/// What [`serve`] gives back: what became of the server's AF_XDP, a sender that stops the server,
/// and its thread.
pub type Serving = (Option<Result<String, String>>, mpsc::Sender<()>, std::thread::JoinHandle<()>);

/// Starts a server of `Test` in namespace `ns` at `addr` with `xdp` as its AF_XDP interface.
pub fn serve(ns: &str, addr: SocketAddr, xdp: &str) -> Serving {
    serve_with(ns, addr, ServerConfig { xdp: Some(xdp.to_owned()), ..ServerConfig::default() })
}

/// Starts a server of `Test` in namespace `ns` at `addr` without AF_XDP.
pub fn serve_plain(ns: &str, addr: SocketAddr) -> Serving {
    serve_with(ns, addr, ServerConfig::default())
}

/// Starts a server of `Test` in namespace `ns` at `addr` with `config` (no shared memory).
pub fn serve_with(ns: &str, addr: SocketAddr, config: ServerConfig) -> Serving {
    let ns = ns.to_owned();
    let (told, status) = mpsc::channel();
    let (stop, stopped) = mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        enter(&ns);
        let config = ServerConfig { shared_memory: false, ..config };
        let server = Server::bind(addr).unwrap().with_config(config).export(TestServer::new(SeedTest)).start().unwrap();
        told.send(server.xdp()).unwrap();
        let _ = stopped.recv();
        server.stop();
    });
    (status.recv().unwrap(), stop, thread)
}

/// Runs `calls` on a thread of its own in namespace `ns`.
pub fn in_namespace<T: Send + 'static>(ns: &str, calls: impl FnOnce() -> T + Send + 'static) -> T {
    let ns = ns.to_owned();
    std::thread::spawn(move || {
        enter(&ns);
        calls()
    })
    .join()
    .unwrap()
}
