//! Who this process is.

/// This process's effective user id.
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Opens `path` for reading without following a symbolic link in its last component: a link there
/// is an error (`ELOOP`), not the file it points to. For files whose owner decides whether they
/// are trusted, checked on the open descriptor (`File::metadata`) rather than by path.
pub fn open_nofollow(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let flags = rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::CLOEXEC;
    std::fs::OpenOptions::new().read(true).custom_flags(flags.bits() as i32).open(path)
}

/// Opens `path` for appending, made with mode 0600 if it is not there, without following a
/// symbolic link in its last component (as [`open_nofollow`]).
pub fn append_nofollow(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let flags = rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::CLOEXEC;
    std::fs::OpenOptions::new().append(true).create(true).mode(0o600).custom_flags(flags.bits() as i32).open(path)
}

/// The user that owns the sockets serving `addr` on this host: unconnected UDP sockets, or listening
/// TCP ones, bound to `addr` itself or to the unspecified address of its family when `addr` is an
/// address of this host. `None` when no such socket is found (a server on another host, or none),
/// or when sockets of more than one user are (the kernel lets only one user's sockets share a port
/// through `SO_REUSEPORT`).
///
/// Asked of the kernel with one sock_diag dump per address family, filtered by port and state in
/// the kernel: the kernel walks its table once for the dump, and the few sockets of a port fit its
/// first message, so that sockets opened and closed meanwhile on other ports cannot hide one (UDP's
/// sockets of a port share one bucket, walked under its lock); `/proc/net/udp` is walked again for
/// each page read, and a socket can be skipped when the table changes between pages.
/// Where the kernel has no sock_diag for the protocol, the `/proc/net` tables are read instead.
pub fn socket_owner(tcp: bool, addr: std::net::SocketAddr) -> Option<u32> {
    use std::net::IpAddr;
    let here = std::net::UdpSocket::bind((addr.ip(), 0)).is_ok();
    let sockets = diag::sockets_on_port(tcp, addr.port()).or_else(|_| proc_sockets_on_port(tcp, addr.port())).ok()?;
    let mut owner = None;
    for (bound, uid) in sockets {
        let bound = match bound {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(bound, IpAddr::V4),
            v4 => v4,
        };
        if bound == addr.ip() || (here && bound.is_unspecified() && bound.is_ipv4() == addr.is_ipv4()) {
            match owner {
                Some(other) if other != uid => return None,
                _ => owner = Some(uid),
            }
        }
    }
    owner
}

/// The address and owner of each unconnected UDP socket (listening TCP socket with `tcp`) on
/// `port`, from the kernel's sock_diag netlink protocol.
mod diag {
    use std::io;
    use std::net::IpAddr;

    use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST};
    use netlink_packet_sock_diag::constants::{AF_INET, AF_INET6, IPPROTO_TCP, IPPROTO_UDP};
    use netlink_packet_sock_diag::inet::{ExtensionFlags, InetRequest, SocketId, StateFlags};
    use netlink_packet_sock_diag::SockDiagMessage;
    use rustix::net::netlink::{SocketAddrNetlink, SOCK_DIAG};

    /// Messages read from one dump at most: a port has at most a few sockets per worker, and a
    /// kernel that sent more than this would be answering another question.
    const MOST: usize = 4096;

    pub(super) fn sockets_on_port(tcp: bool, port: u16) -> io::Result<Vec<(IpAddr, u32)>> {
        use rustix::net::{AddressFamily, SocketFlags, SocketType};
        let socket =
            rustix::net::socket_with(AddressFamily::NETLINK, SocketType::DGRAM, SocketFlags::CLOEXEC, Some(SOCK_DIAG))?;
        // Connected to the kernel, the socket takes messages from no one else.
        rustix::net::connect(&socket, &SocketAddrNetlink::new(0, 0))?;
        let mut found = Vec::new();
        let mut buf = vec![0u8; 32 << 10];
        for (family, id) in [(AF_INET, SocketId::new_v4()), (AF_INET6, SocketId::new_v6())] {
            let mut header = NetlinkHeader::default();
            header.flags = NLM_F_REQUEST | NLM_F_DUMP;
            header.sequence_number = u32::from(family);
            let (protocol, states) =
                if tcp { (IPPROTO_TCP, StateFlags::LISTEN) } else { (IPPROTO_UDP, StateFlags::CLOSE) };
            let request = InetRequest {
                family,
                protocol,
                extensions: ExtensionFlags::empty(),
                states,
                socket_id: SocketId { source_port: port, ..id },
            };
            let mut message = NetlinkMessage::new(header, SockDiagMessage::InetRequest(request).into());
            message.finalize();
            let mut bytes = vec![0u8; message.buffer_len()];
            message.serialize(&mut bytes);
            rustix::net::send(&socket, &bytes, rustix::net::SendFlags::empty())?;
            read_dump(&socket, &mut buf, u32::from(family), port, &mut found)?;
        }
        Ok(found)
    }

    /// Reads the answer to one dump request into `found`, to its end.
    fn read_dump(
        socket: &rustix::fd::OwnedFd,
        buf: &mut [u8],
        sequence: u32,
        port: u16,
        found: &mut Vec<(IpAddr, u32)>,
    ) -> io::Result<()> {
        let invalid = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
        let mut messages = 0;
        loop {
            let (len, _) = rustix::net::recv(socket, &mut *buf, rustix::net::RecvFlags::empty())?;
            let mut at = 0;
            while at < len {
                let message = NetlinkMessage::<SockDiagMessage>::deserialize(&buf[at..len])
                    .map_err(|e| invalid(format!("sock_diag: {e}")))?;
                let size = message.header.length as usize;
                if size == 0 || message.header.sequence_number != sequence {
                    return Err(invalid(format!(
                        "sock_diag: a message of {size} bytes, sequence {}",
                        message.header.sequence_number
                    )));
                }
                messages += 1;
                if messages > MOST {
                    return Err(invalid(format!("sock_diag: more than {MOST} sockets on one port")));
                }
                match message.payload {
                    NetlinkPayload::Done(_) => return Ok(()),
                    NetlinkPayload::Error(e) => return Err(e.to_io()),
                    NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => {
                        let id = &r.header.socket_id;
                        if id.source_port == port {
                            found.push((id.source_address, r.header.uid));
                        }
                    }
                    _ => {}
                }
                at += size.next_multiple_of(4);
            }
        }
    }
}

/// [`diag::sockets_on_port`] from the `/proc/net/{udp,udp6}` tables (`/proc/net/{tcp,tcp6}`), for a
/// kernel without sock_diag.
fn proc_sockets_on_port(tcp: bool, port: u16) -> std::io::Result<Vec<(std::net::IpAddr, u32)>> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let (table, listening) = if tcp { ("tcp", "0A") } else { ("udp", "07") };
    let mut found = Vec::new();
    for (file, needed) in [(format!("/proc/net/{table}"), true), (format!("/proc/net/{table}6"), false)] {
        // The IPv6 table is missing where IPv6 is off.
        let text = match std::fs::read_to_string(&file) {
            Ok(text) => text,
            Err(_) if !needed => continue,
            Err(e) => return Err(e),
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state), Some(uid)) = (fields.get(1), fields.get(3), fields.get(7)) else { continue };
            let Some((ip, port_hex)) = local.split_once(':') else { continue };
            if *state != listening || u16::from_str_radix(port_hex, 16) != Ok(port) {
                continue;
            }
            // Each 32-bit word of the address as the kernel holds it in memory, printed as a
            // number of this machine's byte order.
            let words: Option<Vec<[u8; 4]>> = (0..ip.len() / 8)
                .map(|w| u32::from_str_radix(ip.get(w * 8..w * 8 + 8)?, 16).ok().map(u32::to_ne_bytes))
                .collect();
            let bound = match words.as_deref() {
                Some([a]) => IpAddr::V4(Ipv4Addr::from(*a)),
                Some([a, b, c, d]) => {
                    let mut bytes = [0u8; 16];
                    for (chunk, word) in bytes.chunks_exact_mut(4).zip([a, b, c, d]) {
                        chunk.copy_from_slice(word);
                    }
                    IpAddr::V6(Ipv6Addr::from(bytes))
                }
                _ => continue,
            };
            let Ok(uid) = uid.parse::<u32>() else { continue };
            found.push((bound, uid));
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    #[test]
    fn open_nofollow_refuses_a_link_and_opens_the_file() {
        let dir = std::env::temp_dir().join(format!("tiercel-nofollow-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("file"), b"x").unwrap();
        std::os::unix::fs::symlink(dir.join("file"), dir.join("link")).unwrap();
        assert!(super::open_nofollow(&dir.join("file")).is_ok());
        let err = super::open_nofollow(&dir.join("link")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(rustix::io::Errno::LOOP.raw_os_error()), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_owner_of_a_port_is_the_user_whose_socket_serves_it() {
        let me = super::euid();
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        assert_eq!(super::socket_owner(false, udp.local_addr().unwrap()), Some(me));
        let any = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        let port = any.local_addr().unwrap().port();
        assert_eq!(super::socket_owner(false, ([127, 0, 0, 1], port).into()), Some(me));
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert_eq!(super::socket_owner(true, tcp.local_addr().unwrap()), Some(me));
        // Not UDP's, and nobody's once closed.
        assert_eq!(super::socket_owner(false, tcp.local_addr().unwrap()), None);
        let closed = udp.local_addr().unwrap();
        drop(udp);
        assert_eq!(super::socket_owner(false, closed), None);
        // An address of another host: never this host's socket on the same port.
        assert_eq!(super::socket_owner(false, ([192, 0, 2, 1], port).into()), None);
    }

    /// The kernel's sock_diag answers (not the `/proc` tables behind it), and both ways find the
    /// same sockets: an IPv4 and an IPv6 socket sharing a port, and not a connected one.
    #[test]
    fn sock_diag_and_the_proc_tables_list_the_same_sockets_of_a_port() {
        use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
        let me = super::euid();
        let v4 = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = v4.local_addr().unwrap().port();
        let v6 = socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::DGRAM, None).unwrap();
        v6.set_only_v6(true).unwrap();
        let have_v6 = v6.bind(&std::net::SocketAddr::from((Ipv6Addr::LOCALHOST, port)).into()).is_ok();
        let connected = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        connected.connect(v4.local_addr().unwrap()).unwrap();
        let mut expected = vec![(IpAddr::V4(Ipv4Addr::LOCALHOST), me)];
        if have_v6 {
            expected.push((IpAddr::V6(Ipv6Addr::LOCALHOST), me));
        }
        let sorted = |mut found: Vec<(IpAddr, u32)>| {
            found.sort();
            found
        };
        // The `/proc` tables may skip or repeat a socket while other tests of this process open
        // and close theirs (what the next test is about): read them again until they show what the
        // kernel has.
        let from_proc = |tcp, port, expected: &Vec<(IpAddr, u32)>| {
            let mut found = Vec::new();
            for _ in 0..50 {
                found = sorted(super::proc_sockets_on_port(tcp, port).unwrap());
                if found == *expected {
                    break;
                }
            }
            found
        };
        assert_eq!(sorted(super::diag::sockets_on_port(false, port).unwrap()), expected);
        assert_eq!(from_proc(false, port, &expected), expected);
        // The connected socket's own port: nothing unconnected there.
        let own = connected.local_addr().unwrap().port();
        assert_eq!(super::diag::sockets_on_port(false, own).unwrap(), vec![]);
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let tcp_port = tcp.local_addr().unwrap().port();
        let listener = vec![(IpAddr::V4(Ipv4Addr::LOCALHOST), me)];
        assert_eq!(super::diag::sockets_on_port(true, tcp_port).unwrap(), listener);
        assert_eq!(from_proc(true, tcp_port, &listener), listener);
    }

    /// Sockets opened and closed on other ports all the while never hide the one on ours (the
    /// `/proc/net/udp` tables, read a page at a time, did, now and then: a rebinding client then
    /// took another user's server for an unknown one, or its own server for none).
    #[test]
    fn the_owner_stays_found_while_other_sockets_come_and_go() {
        let me = super::euid();
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = udp.local_addr().unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let churn = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let many: Vec<_> = (0..64).map(|_| std::net::UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
                    drop(many);
                }
            })
        };
        let missed = (0..500).filter(|_| super::socket_owner(false, addr) != Some(me)).count();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        churn.join().unwrap();
        assert_eq!(missed, 0, "the owner of {addr} was missed {missed} times of 500");
    }
}
