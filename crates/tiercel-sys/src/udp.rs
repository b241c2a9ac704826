//! UDP sockets for the packet-exchange transport.

use std::io::{self, IoSlice};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::net::{recv, recvfrom, sendmsg, sendmsg_addr, RecvFlags, SendAncillaryBuffer, SendFlags};

/// Socket buffer size asked for, so that a window of fragments fits.
const SOCKET_BUFFER: usize = 4 << 20;

fn tune(socket: &socket2::Socket) {
    // Larger buffers only help multi-packet blasts; a kernel that refuses keeps its default.
    let _ = socket.set_recv_buffer_size(SOCKET_BUFFER);
    let _ = socket.set_send_buffer_size(SOCKET_BUFFER);
}

/// Binds a UDP socket to `addr`. With `reuse_port`, several sockets may bind the same address and the
/// kernel spreads clients over them.
pub fn bind(addr: SocketAddr, reuse_port: bool) -> io::Result<UdpSocket> {
    let socket = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::DGRAM, None)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    tune(&socket);
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// A UDP socket on an ephemeral port, connected to `server`: it receives only the server's packets.
pub fn connect(server: SocketAddr) -> io::Result<UdpSocket> {
    let local: SocketAddr = match server {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = bind(local, false)?;
    socket.connect(server)?;
    Ok(socket)
}

/// Sends one datagram gathered from `parts` on a connected socket: one `sendmsg`, no staging copy.
pub fn send_gather(socket: &UdpSocket, parts: &[IoSlice<'_>]) -> io::Result<usize> {
    #[cfg(feature = "fault-injection")]
    if let Some(r) = crate::faults::intercept(socket, None, parts) {
        return r;
    }
    Ok(sendmsg(socket, parts, &mut SendAncillaryBuffer::default(), SendFlags::empty())?)
}

/// Sends one datagram gathered from `parts` to `addr`.
pub fn send_gather_to(socket: &UdpSocket, addr: &SocketAddr, parts: &[IoSlice<'_>]) -> io::Result<usize> {
    #[cfg(feature = "fault-injection")]
    if let Some(r) = crate::faults::intercept(socket, Some(addr), parts) {
        return r;
    }
    Ok(sendmsg_addr(socket, addr, parts, &mut SendAncillaryBuffer::default(), SendFlags::empty())?)
}

/// What a non-blocking receive found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// A datagram of this many bytes is in the buffer.
    Datagram(usize),
    /// A datagram larger than the buffer arrived; it was discarded.
    Truncated(usize),
    /// Nothing was waiting.
    Nothing,
    /// The kernel reported an ICMP port unreachable for an earlier send on this connected socket:
    /// nothing listened at the peer's address then.
    Refused,
}

fn classify(len: usize, full: usize) -> Received {
    if full > len {
        Received::Truncated(full)
    } else {
        Received::Datagram(full)
    }
}

/// Receives one datagram on a connected socket without blocking. An ICMP error reported for an
/// earlier send (`ECONNREFUSED`, no server listening) is reported as `Ok(Nothing)` after being
/// consumed, since the caller's timers decide when a server is dead.
pub fn recv_nowait(socket: &UdpSocket, buf: &mut [u8]) -> io::Result<Received> {
    match recv(socket, &mut *buf, RecvFlags::DONTWAIT | RecvFlags::TRUNC) {
        Ok((_, full)) => Ok(classify(buf.len(), full)),
        Err(rustix::io::Errno::AGAIN) => Ok(Received::Nothing),
        Err(rustix::io::Errno::CONNREFUSED) => Ok(Received::Refused),
        Err(e) => Err(e.into()),
    }
}

/// Receives one datagram and its sender without blocking.
pub fn recv_from_nowait(socket: &UdpSocket, buf: &mut [u8]) -> io::Result<Option<(Received, SocketAddr)>> {
    match recvfrom(socket, &mut *buf, RecvFlags::DONTWAIT | RecvFlags::TRUNC) {
        Ok((_, full, Some(addr))) => {
            let addr = SocketAddr::try_from(addr).map_err(|_| io::Error::other("non-IP sender address"))?;
            Ok(Some((classify(buf.len(), full), addr)))
        }
        Ok((_, _, None)) => Ok(None),
        Err(e) if e == rustix::io::Errno::AGAIN || e == rustix::io::Errno::CONNREFUSED => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Blocks until the socket is readable or `timeout` passes (forever if `None`). Returns whether it
/// is readable.
pub fn wait_readable(socket: &UdpSocket, timeout: Option<Duration>) -> io::Result<bool> {
    wait_readable_fd(socket, timeout)
}

/// Waits until any descriptor (a listening socket, say) is readable, or `timeout` passes.
pub fn wait_readable_fd(socket: impl std::os::fd::AsFd, timeout: Option<Duration>) -> io::Result<bool> {
    let ts = timeout.map(|d| Timespec { tv_sec: d.as_secs() as i64, tv_nsec: d.subsec_nanos() as i64 });
    let mut fds = [PollFd::new(&socket, PollFlags::IN)];
    loop {
        match poll(&mut fds, ts.as_ref()) {
            Ok(n) => return Ok(n > 0),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Waits until a descriptor (a stream socket with a full send buffer, say) is writable, or
/// `timeout` passes. Returns whether it is.
pub fn wait_writable_fd(socket: impl std::os::fd::AsFd, timeout: Option<Duration>) -> io::Result<bool> {
    let ts = timeout.map(|d| Timespec { tv_sec: d.as_secs() as i64, tv_nsec: d.subsec_nanos() as i64 });
    let mut fds = [PollFd::new(&socket, PollFlags::OUT)];
    loop {
        match poll(&mut fds, ts.as_ref()) {
            Ok(n) => return Ok(n > 0),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Waits until any of `fds` is readable (or closed), for at most `timeout`; sets `ready[i]` for
/// each one that is. Returns how many are.
pub fn wait_any_readable(
    fds: &[std::os::fd::BorrowedFd<'_>],
    timeout: Option<Duration>,
    ready: &mut Vec<bool>,
) -> io::Result<usize> {
    let ts = timeout.map(|d| Timespec { tv_sec: d.as_secs() as i64, tv_nsec: d.subsec_nanos() as i64 });
    let mut polled: Vec<PollFd<'_>> = fds.iter().map(|fd| PollFd::new(fd, PollFlags::IN)).collect();
    let n = loop {
        match poll(&mut polled, ts.as_ref()) {
            Ok(n) => break n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    ready.clear();
    ready.extend(polled.iter().map(|p| !p.revents().is_empty()));
    Ok(n)
}

/// A way for one of several threads sharing a socket to wait for it: a datagram wakes one waiting
/// thread (`EPOLLEXCLUSIVE`), where `poll` would wake all of them only for one to get it.
pub struct ExclusiveWaiter {
    epoll: std::os::fd::OwnedFd,
}

impl ExclusiveWaiter {
    /// A waiter on `socket`, for one thread.
    pub fn new(socket: &UdpSocket) -> io::Result<ExclusiveWaiter> {
        use rustix::event::epoll;
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        epoll::add(&ep, socket, epoll::EventData::new_u64(0), epoll::EventFlags::IN | epoll::EventFlags::EXCLUSIVE)?;
        Ok(ExclusiveWaiter { epoll: ep })
    }

    /// Waits until the socket is readable or `timeout` passes; true when readable.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<bool> {
        let ts = timeout.map(|d| Timespec { tv_sec: d.as_secs() as i64, tv_nsec: d.subsec_nanos() as i64 });
        let mut events = [std::mem::MaybeUninit::<rustix::event::epoll::Event>::uninit(); 1];
        loop {
            match rustix::event::epoll::wait(&self.epoll, &mut events[..], ts.as_ref()) {
                Ok((ready, _)) => return Ok(!ready.is_empty()),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// The path MTU the kernel knows for a connected socket (`IP_MTU`), if it can tell.
pub fn path_mtu(socket: &UdpSocket) -> Option<u32> {
    match socket.peer_addr().ok()? {
        SocketAddr::V4(_) => rustix::net::sockopt::ip_mtu(socket).ok(),
        SocketAddr::V6(_) => rustix::net::sockopt::ipv6_mtu(socket).ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_send_arrives_as_one_datagram() {
        let server = bind("127.0.0.1:0".parse().unwrap(), false).unwrap();
        let client = connect(server.local_addr().unwrap()).unwrap();
        let n = send_gather(&client, &[IoSlice::new(b"head"), IoSlice::new(b"er+body")]).unwrap();
        assert_eq!(n, 11);
        assert!(wait_readable(&server, Some(Duration::from_secs(5))).unwrap());
        let mut buf = [0u8; 64];
        let (r, from) = recv_from_nowait(&server, &mut buf).unwrap().unwrap();
        assert_eq!(r, Received::Datagram(11));
        assert_eq!(&buf[..11], b"header+body");
        send_gather_to(&server, &from, &[IoSlice::new(b"reply")]).unwrap();
        assert!(wait_readable(&client, Some(Duration::from_secs(5))).unwrap());
        let mut small = [0u8; 3];
        assert_eq!(recv_nowait(&client, &mut small).unwrap(), Received::Truncated(5));
        assert_eq!(recv_nowait(&client, &mut buf).unwrap(), Received::Nothing);
        assert!(path_mtu(&client).unwrap() >= 1280);
    }
}
