//! AF_XDP across two network namespaces joined by a veth pair (as root): tiercel's XDP program
//! steers the datagrams of its port to an AF_XDP socket and passes everything else to the kernel;
//! frames made from the template go both ways, between AF_XDP sockets and kernel sockets; and the
//! program is gone from the interface once its `Steering` is dropped.
#![cfg(feature = "xdp")]

use std::net::{SocketAddrV4, UdpSocket};
use std::os::fd::AsFd;
use std::process::Command;
use std::time::{Duration, Instant};

use tiercel_sys::xdp::{frame, mac_of, Mode, Steering, Xsk, FRAMES};

/// Two namespaces and a veth pair between them, removed when dropped.
struct Pair {
    a: String,
    b: String,
    subnet: u8,
}

fn ip(args: &[&str]) {
    let status = Command::new("ip").args(args).status().unwrap();
    assert!(status.success(), "ip {args:?}");
}

impl Pair {
    fn new() -> Pair {
        let id = std::process::id();
        let pair = Pair { a: format!("txa{id}"), b: format!("txb{id}"), subnet: (id % 200) as u8 + 20 };
        ip(&["netns", "add", &pair.a]);
        ip(&["netns", "add", &pair.b]);
        ip(&["link", "add", "xa", "netns", &pair.a, "type", "veth", "peer", "name", "xb", "netns", &pair.b]);
        for (ns, dev, host) in [(&pair.a, "xa", 1), (&pair.b, "xb", 2)] {
            ip(&["-n", ns, "addr", "add", &format!("10.{}.0.{host}/24", pair.subnet), "dev", dev]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
        }
        pair
    }

    fn addr(&self, host: u8, port: u16) -> SocketAddrV4 {
        SocketAddrV4::new([10, self.subnet, 0, host].into(), port)
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

/// Reads frames from `xsk` for up to `wait`, until `take` says it has what it wanted.
fn receive(xsk: &mut Xsk, wait: Duration, mut take: impl FnMut(&[u8]) -> bool) -> bool {
    let until = Instant::now() + wait;
    while Instant::now() < until {
        if xsk.recv(&mut take) == Some(true) {
            return true;
        }
        std::hint::spin_loop();
    }
    false
}

/// The hardware address of b's interface, as a's kernel learned it (its neighbour table).
fn peer_mac(pair: &Pair) -> [u8; 6] {
    let out = Command::new("ip").args(["-n", &pair.a, "neigh", "show", "dev", "xa"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let entry = text.split_whitespace().skip_while(|w| *w != "lladdr").nth(1).unwrap_or_default();
    frame::parse_mac(entry).unwrap_or_else(|| panic!("no neighbour entry for b: {text}"))
}

#[test]
fn an_af_xdp_socket_takes_its_ports_datagrams_and_the_kernel_keeps_the_rest() {
    tiercel_seeds::needs!(ROOT, IP, CLANG, LIBBPF);
    let pair = Pair::new();
    const STEERED: u16 = 7777;
    const KERNEL: u16 = 7000;
    let (b_xdp, b_kernel) = (pair.addr(2, STEERED), pair.addr(2, KERNEL));
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let b_ns = pair.b.clone();
    // In namespace b: an AF_XDP echo on the steered port, a kernel echo on the other.
    let echo = std::thread::spawn(move || {
        enter(&b_ns);
        let kernel = UdpSocket::bind(b_kernel).unwrap();
        kernel.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
        let mut steering = Steering::attach("xb").unwrap();
        let mode = steering.mode();
        steering.steer_port(STEERED).unwrap();
        let mut xsk = Xsk::bind(&mut steering, 0, FRAMES).unwrap();
        let me = mac_of("xb").unwrap();
        ready_tx.send(()).unwrap();
        let (mut echoed, mut buf, mut out) = (0, [0u8; 2048], Vec::new());
        let until = Instant::now() + Duration::from_secs(20);
        while echoed < 40 && Instant::now() < until {
            let reply = xsk.recv(|f| {
                let d = frame::parse(f)?;
                frame::Template::new(me, d.to, d.from_mac, d.from).frame(d.payload, &mut out)
            });
            if let Some(Some(())) = reply {
                assert!(xsk.send(&out).unwrap());
                echoed += 1;
            }
            if let Ok((n, from)) = kernel.recv_from(&mut buf) {
                kernel.send_to(&buf[..n], from).unwrap();
            }
        }
        (echoed, mode, has_xdp(&b_ns, "xb"))
    });
    ready.recv_timeout(Duration::from_secs(10)).unwrap();
    enter(&pair.a);
    // A kernel socket in namespace a: its datagrams to the steered port come back through the
    // AF_XDP socket, and those to the other port through the kernel's.
    let socket = UdpSocket::bind(pair.addr(1, 0)).unwrap();
    socket.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut buf = [0u8; 2048];
    for (to, round) in [(b_xdp, 0), (b_kernel, 1), (b_xdp, 2)] {
        for i in 0..10u8 {
            let marker = [b"marker ".as_slice(), &[round, i]].concat();
            let answered = (0..10).any(|_| {
                socket.send_to(&marker, to).unwrap();
                matches!(socket.recv_from(&mut buf), Ok((n, from)) if buf[..n] == marker[..] && from == to.into())
            });
            assert!(answered, "{to}: datagram {i} of round {round} not echoed");
        }
    }
    // AF_XDP in namespace a too: frames from the template, both ways without the kernel's UDP.
    let mut steering = Steering::attach("xa").unwrap();
    let me = pair.addr(1, 7778);
    steering.steer_port(me.port()).unwrap();
    let mut xsk = Xsk::bind(&mut steering, 0, FRAMES).unwrap();
    let template = frame::Template::new(mac_of("xa").unwrap(), me, peer_mac(&pair), b_xdp);
    let mut out = Vec::new();
    for i in 0..20u8 {
        template.frame(&[b'x', i], &mut out).unwrap();
        let answered = (0..10).any(|_| {
            assert!(xsk.send(&out).unwrap());
            receive(&mut xsk, Duration::from_millis(200), |f| {
                frame::parse(f).is_some_and(|d| d.payload == [b'x', i] && d.from == b_xdp && d.to == me)
            })
        });
        assert!(answered, "frame {i} not echoed");
    }
    let (echoed, mode, attached_while_running) = echo.join().unwrap();
    assert_eq!(echoed, 40);
    assert_eq!(mode, Mode::Driver, "veth runs XDP in its driver");
    assert!(attached_while_running);
    // Dropped (in namespace b, when its thread ended): detached.
    assert!(has_xdp(&pair.a, "xa"));
    drop(xsk);
    drop(steering);
    assert!(!has_xdp(&pair.a, "xa"), "the program stayed attached to xa");
    assert!(!has_xdp(&pair.b, "xb"), "the program stayed attached to xb");
}
