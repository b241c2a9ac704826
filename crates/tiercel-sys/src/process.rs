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

/// The user that owns the sockets serving `addr` on this host, from the kernel's socket tables
/// (`/proc/net/{udp,udp6}` for unconnected UDP sockets, `/proc/net/{tcp,tcp6}` for listening TCP
/// ones): those bound to `addr` itself, or to the unspecified address of its family when `addr` is
/// an address of this host. `None` when no such socket is found (a server on another host, or
/// none), or when sockets of more than one user are (the kernel lets only one user's sockets share
/// a port through `SO_REUSEPORT`).
pub fn socket_owner(tcp: bool, addr: std::net::SocketAddr) -> Option<u32> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let here = std::net::UdpSocket::bind((addr.ip(), 0)).is_ok();
    let (table, listening) = if tcp { ("tcp", "0A") } else { ("udp", "07") };
    let mut owner = None;
    for file in [format!("/proc/net/{table}"), format!("/proc/net/{table}6")] {
        let Ok(text) = std::fs::read_to_string(&file) else { continue };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state), Some(uid)) = (fields.get(1), fields.get(3), fields.get(7)) else { continue };
            let Some((ip, port)) = local.split_once(':') else { continue };
            if *state != listening || u16::from_str_radix(port, 16) != Ok(addr.port()) {
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
            let bound = match bound {
                IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(bound, IpAddr::V4),
                v4 => v4,
            };
            let serves = bound == addr.ip() || (here && bound.is_unspecified() && bound.is_ipv4() == addr.is_ipv4());
            let Ok(uid) = uid.parse::<u32>() else { continue };
            if serves {
                match owner {
                    Some(other) if other != uid => return None,
                    _ => owner = Some(uid),
                }
            }
        }
    }
    owner
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
}
