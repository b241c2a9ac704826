//! UDP sockets for the packet-exchange transport.

use std::io::{self, IoSlice};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::Duration;

// Level and types of the control messages of UDP segmentation offload.
use libc::{SOL_UDP, UDP_GRO, UDP_SEGMENT};
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::net::{
    recv, recvfrom, recvmsg, sendmsg, sendmsg_addr, RecvAncillaryBuffer, RecvFlags, SendAncillaryBuffer, SendFlags,
};

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

/// Opens `more` sockets on the address `socket` is bound to, sharing its datagrams with it
/// (`SO_REUSEPORT`, set on `socket` too, after its bind): the kernel gives each datagram to one of
/// them by a hash of its source and destination, so the datagrams of one client socket all go to
/// the same one. Only sockets of the same user may join (the kernel refuses others), and a socket
/// without `SO_REUSEPORT` still gets "address in use".
pub fn share_port(socket: &UdpSocket, more: usize) -> io::Result<Vec<UdpSocket>> {
    if more == 0 {
        return Ok(Vec::new());
    }
    socket2::SockRef::from(socket).set_reuse_port(true)?;
    let addr = socket.local_addr()?;
    (0..more).map(|_| bind(addr, true)).collect()
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

/// Bytes up to which a datagram gathered from several parts is copied into one buffer and sent
/// with `send` or `sendto`: the kernel then takes one buffer, where `sendmsg` first copies in and
/// checks the message header and the list of parts.
pub const GATHER_SMALL: usize = 256;

/// Sends the datagram of `parts` in one piece with `send`, when it is small: the one part that is
/// not empty as it is, or all of them copied into a buffer on the stack first. `None`: larger than
/// [`GATHER_SMALL`] in several parts, nothing sent.
#[inline]
fn send_in_one_piece(
    parts: &[IoSlice<'_>],
    send: impl FnOnce(&[u8]) -> io::Result<usize>,
) -> Option<io::Result<usize>> {
    let mut filled = parts.iter().filter(|p| !p.is_empty());
    let first = filled.next().map_or(&[][..], |p| &**p);
    let Some(second) = filled.next() else { return Some(send(first)) };
    let len: usize = parts.iter().map(|p| p.len()).sum();
    if len > GATHER_SMALL {
        return None;
    }
    let mut staging = [0u8; GATHER_SMALL];
    staging[..first.len()].copy_from_slice(first);
    let mut at = first.len();
    for part in std::iter::once(second).chain(filled) {
        staging[at..at + part.len()].copy_from_slice(part);
        at += part.len();
    }
    Some(send(&staging[..len]))
}

/// Sends one datagram gathered from `parts` on a connected socket: one `sendmsg`, no staging copy,
/// or, when it is small or in one part, one `send` ([`GATHER_SMALL`]).
pub fn send_gather(socket: &UdpSocket, parts: &[IoSlice<'_>]) -> io::Result<usize> {
    #[cfg(feature = "fault-injection")]
    if let Some(r) = crate::faults::intercept(socket, None, parts) {
        return r;
    }
    if let Some(sent) = send_in_one_piece(parts, |d| Ok(rustix::net::send(socket, d, SendFlags::empty())?)) {
        return sent;
    }
    Ok(sendmsg(socket, parts, &mut SendAncillaryBuffer::default(), SendFlags::empty())?)
}

/// Sends one datagram gathered from `parts` to `addr` (one `sendto` when it is small or in one part,
/// as [`send_gather`]).
pub fn send_gather_to(socket: &UdpSocket, addr: &SocketAddr, parts: &[IoSlice<'_>]) -> io::Result<usize> {
    #[cfg(feature = "fault-injection")]
    if let Some(r) = crate::faults::intercept(socket, Some(addr), parts) {
        return r;
    }
    if let Some(sent) = send_in_one_piece(parts, |d| Ok(rustix::net::sendto(socket, d, SendFlags::empty(), addr)?)) {
        return sent;
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

pub(crate) fn classify(len: usize, full: usize) -> Received {
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
    recv_with(socket, buf, RecvFlags::DONTWAIT | RecvFlags::TRUNC)
}

/// One `recv` with `flags` on a connected socket: nothing waiting (or a read timeout passed) is
/// `Nothing`, an ICMP error for an earlier send `Refused`; a blocking receive that a signal
/// interrupted is taken again.
#[inline]
fn recv_with(socket: &UdpSocket, buf: &mut [u8], flags: RecvFlags) -> io::Result<Received> {
    loop {
        return match recv(socket, &mut *buf, flags) {
            Ok((_, full)) => Ok(classify(buf.len(), full)),
            Err(rustix::io::Errno::AGAIN) => Ok(Received::Nothing),
            Err(rustix::io::Errno::CONNREFUSED) => Ok(Received::Refused),
            Err(rustix::io::Errno::INTR) if !flags.contains(RecvFlags::DONTWAIT) => continue,
            Err(e) => Err(e.into()),
        };
    }
}

/// As [`recv_nowait`], with the datagram scattered over `parts` in order (a header into one buffer,
/// a payload straight into where it belongs, the rest into a third): `Datagram(n)` of `n` bytes in
/// all, `Truncated` when the parts could not hold it.
pub fn recv_scattered_nowait(socket: &UdpSocket, parts: &mut [io::IoSliceMut<'_>]) -> io::Result<Received> {
    let room = parts.iter().map(|p| p.len()).sum();
    match recvmsg(socket, parts, &mut RecvAncillaryBuffer::default(), RecvFlags::DONTWAIT | RecvFlags::TRUNC) {
        Ok(msg) => Ok(classify(room, msg.bytes)),
        Err(rustix::io::Errno::AGAIN) => Ok(Received::Nothing),
        Err(rustix::io::Errno::CONNREFUSED) => Ok(Received::Refused),
        Err(e) => Err(e.into()),
    }
}

/// Receives one datagram and its sender without blocking.
pub fn recv_from_nowait(socket: &UdpSocket, buf: &mut [u8]) -> io::Result<Option<(Received, SocketAddr)>> {
    recv_from_with(socket, buf, RecvFlags::DONTWAIT | RecvFlags::TRUNC)
}

/// One `recvfrom` with `flags`: `None` when nothing was waiting (or a read timeout passed) or for an
/// ICMP error; a blocking receive that a signal interrupted is taken again.
#[inline]
fn recv_from_with(socket: &UdpSocket, buf: &mut [u8], flags: RecvFlags) -> io::Result<Option<(Received, SocketAddr)>> {
    loop {
        return match recvfrom(socket, &mut *buf, flags) {
            Ok((_, full, Some(addr))) => {
                let addr = SocketAddr::try_from(addr).map_err(|_| io::Error::other("non-IP sender address"))?;
                Ok(Some((classify(buf.len(), full), addr)))
            }
            Ok((_, _, None)) => Ok(None),
            Err(e) if e == rustix::io::Errno::AGAIN || e == rustix::io::Errno::CONNREFUSED => Ok(None),
            Err(rustix::io::Errno::INTR) if !flags.contains(RecvFlags::DONTWAIT) => continue,
            Err(e) => Err(e.into()),
        };
    }
}

/// Receives one datagram on a connected socket, blocking in the receive itself until one comes or
/// the socket's read timeout (`UdpSocket::set_read_timeout`) passes: then `Nothing`. A blocking
/// ping-pong's cheapest wait, one system call where a look and a `poll` take three. An ICMP error
/// for an earlier send is `Refused`; an interrupted receive is taken again.
pub fn recv_wait(socket: &UdpSocket, buf: &mut [u8]) -> io::Result<Received> {
    recv_with(socket, buf, RecvFlags::TRUNC)
}

/// Sets the longest a blocking receive on `socket` waits ([`recv_wait`]: `SO_RCVTIMEO`) to `wait`,
/// and returns the wait as the kernel took it: it counts in ticks of its clock and rounds up to a
/// whole one (4 ms at 250 Hz). A receive then waits at most that long (less when a tick
/// was near). `None` if the kernel refused the option.
pub fn set_receive_wait(socket: &UdpSocket, wait: Duration) -> Option<Duration> {
    socket.set_read_timeout(Some(wait)).ok()?;
    socket.read_timeout().ok().flatten()
}

/// As [`recv_from_nowait`], blocking in the receive until a datagram comes or the socket's read
/// timeout passes (then `None`), as [`recv_wait`] does.
pub fn recv_from_wait(socket: &UdpSocket, buf: &mut [u8]) -> io::Result<Option<(Received, SocketAddr)>> {
    recv_from_with(socket, buf, RecvFlags::TRUNC)
}

/// Blocks until the socket is readable or `timeout` passes (forever if `None`). Returns whether it
/// is readable.
pub fn wait_readable(socket: &UdpSocket, timeout: Option<Duration>) -> io::Result<bool> {
    wait_readable_fd(socket, timeout)
}

/// Reads what a stream socket (TCP) holds into `buf` without blocking, whatever the socket's own
/// mode (`MSG_DONTWAIT`: one system call, where switching a blocking socket to non-blocking and
/// back takes two more): `Ok(None)` when nothing has come, `Ok(Some(0))` when the peer closed.
pub fn read_stream_nowait(stream: impl std::os::fd::AsFd, buf: &mut [u8]) -> io::Result<Option<usize>> {
    loop {
        return match recv(&stream, &mut *buf, RecvFlags::DONTWAIT) {
            Ok((n, _)) => Ok(Some(n)),
            Err(rustix::io::Errno::AGAIN) => Ok(None),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => Err(e.into()),
        };
    }
}

/// Waits until any descriptor (a listening socket, say) is readable, or `timeout` passes.
pub fn wait_readable_fd(socket: impl std::os::fd::AsFd, timeout: Option<Duration>) -> io::Result<bool> {
    wait_one_of([socket.as_fd()], timeout)
}

/// Waits until either of two descriptors is readable, or `timeout` passes, allocating nothing.
/// Returns whether one is.
pub fn wait_either_readable(
    a: std::os::fd::BorrowedFd<'_>,
    b: std::os::fd::BorrowedFd<'_>,
    timeout: Option<Duration>,
) -> io::Result<bool> {
    wait_one_of([a, b], timeout)
}

/// Waits until one of `fds` (a few: they are polled from the stack) is readable, or `timeout`
/// passes, allocating nothing. Returns whether one is.
pub fn wait_one_of<const N: usize>(
    fds: [std::os::fd::BorrowedFd<'_>; N],
    timeout: Option<Duration>,
) -> io::Result<bool> {
    let ts = timeout.map(|d| Timespec { tv_sec: d.as_secs() as i64, tv_nsec: d.subsec_nanos() as i64 });
    let mut polled = fds.map(|fd| PollFd::from_borrowed_fd(fd, PollFlags::IN));
    loop {
        match poll(&mut polled, ts.as_ref()) {
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
///
/// The socket is in the waiter's epoll set only from a [`ExclusiveWaiter::wait`] to the next
/// [`ExclusiveWaiter::disarm`]: while it is, every datagram that arrives visits the set (a lock and a
/// ready list, in the sender's system call), so a thread that spins on the socket between waits,
/// or blocks in its receive, disarms its waiter first. Over loopback, a spinning echo whose socket
/// stayed in an epoll set answered a 56-byte ping-pong 0.1 to 0.45 µs slower in four of five
/// alternating runs.
pub struct ExclusiveWaiter {
    epoll: std::os::fd::OwnedFd,
    /// The socket's descriptor, duplicated: added to the set and taken out again.
    socket: std::os::fd::OwnedFd,
    /// Whether the socket is in the set.
    armed: std::cell::Cell<bool>,
}

impl ExclusiveWaiter {
    /// A waiter on `socket`, for one thread (not yet in the set: the first wait adds it).
    pub fn new(socket: &UdpSocket) -> io::Result<ExclusiveWaiter> {
        use rustix::event::epoll;
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        let socket = rustix::io::fcntl_dupfd_cloexec(socket, 0)?;
        Ok(ExclusiveWaiter { epoll: ep, socket, armed: std::cell::Cell::new(false) })
    }

    /// Also wakes for `fd` (a [`Nudge`], say), one waiting thread at a time as for the socket. It
    /// stays in the set for the waiter's life.
    pub fn also(&self, fd: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
        use rustix::event::epoll;
        epoll::add(&self.epoll, fd, epoll::EventData::new_u64(1), exclusive())?;
        Ok(())
    }

    /// Also wakes for `fd`, every waiting thread at once: for a descriptor that, once readable, stays
    /// so (a [`Nudge`] rung once and never taken, that says the threads are to stop).
    pub fn also_every(&self, fd: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
        use rustix::event::epoll;
        epoll::add(&self.epoll, fd, epoll::EventData::new_u64(2), epoll::EventFlags::IN)?;
        Ok(())
    }

    /// Waits until the socket (or a descriptor added with [`ExclusiveWaiter::also`]) is readable or
    /// `timeout` passes; true when readable. Adds the socket to the set first if it is not there (a
    /// datagram already waiting makes the wait return at once), and leaves it there.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<bool> {
        use rustix::event::epoll;
        if !self.armed.get() {
            epoll::add(&self.epoll, &self.socket, epoll::EventData::new_u64(0), exclusive())?;
            self.armed.set(true);
        }
        let ts = timeout.map(|d| Timespec { tv_sec: d.as_secs() as i64, tv_nsec: d.subsec_nanos() as i64 });
        let mut events = [std::mem::MaybeUninit::<epoll::Event>::uninit(); 1];
        loop {
            match epoll::wait(&self.epoll, &mut events[..], ts.as_ref()) {
                Ok((ready, _)) => return Ok(!ready.is_empty()),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Takes the socket out of the set, if it is there: for a thread about to spin on the socket, so
    /// that the datagrams that come meanwhile do not visit the set. One system call, the first time
    /// after a wait; nothing after that.
    #[inline]
    pub fn disarm(&self) {
        if self.armed.get() {
            // A refusal leaves the socket in the set: every datagram then costs a little more, and
            // every wait still wakes for it.
            if rustix::event::epoll::delete(&self.epoll, &self.socket).is_ok() {
                self.armed.set(false);
            }
        }
    }
}

fn exclusive() -> rustix::event::epoll::EventFlags {
    rustix::event::epoll::EventFlags::IN | rustix::event::epoll::EventFlags::EXCLUSIVE
}

/// A count that threads waiting on a socket can wait on beside it (an `eventfd` in semaphore mode):
/// each [`Nudge::ring`] wakes one waiting thread and makes the count readable for one more
/// [`Nudge::take`]. For work a thread leaves to others that wait for datagrams.
pub struct Nudge {
    fd: std::os::fd::OwnedFd,
}

impl Nudge {
    /// A count at zero.
    pub fn new() -> io::Result<Nudge> {
        use rustix::event::{eventfd, EventfdFlags};
        let fd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK | EventfdFlags::SEMAPHORE)?;
        Ok(Nudge { fd })
    }

    /// Adds one to the count, waking one thread that waits for it.
    pub fn ring(&self) -> io::Result<()> {
        rustix::io::write(&self.fd, &1u64.to_ne_bytes())?;
        Ok(())
    }

    /// Takes one from the count; false when it was zero.
    pub fn take(&self) -> bool {
        let mut buf = [0u8; 8];
        rustix::io::read(&self.fd, &mut buf).is_ok()
    }

    /// The descriptor to wait on ([`ExclusiveWaiter::also`]).
    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }
}

/// Largest number of segments one [`send_segments`] may carry: the kernel's limit
/// (`UDP_MAX_SEGMENTS`, 64 on the oldest kernels with segmentation offload).
pub const MAX_SEGMENTS: usize = 64;
/// Largest total of one [`send_segments`]: what one IPv4 datagram could carry, less its headers.
pub const MAX_SEGMENTED: usize = 65_507;

/// Bytes of a control message header (`struct cmsghdr`: a `usize` length, a level and a type).
const CMSG_HEADER: usize = std::mem::size_of::<libc::cmsghdr>();
/// Room for one control message of `data` bytes (`CMSG_SPACE`).
pub(crate) const fn cmsg_space(data: usize) -> usize {
    let align = std::mem::size_of::<usize>();
    CMSG_HEADER + data.div_ceil(align) * align
}

/// Sends `parts` as datagrams of `segment` bytes each (the last may be shorter) in one `sendmsg`,
/// letting the kernel cut them (UDP generic segmentation offload, `UDP_SEGMENT`). At most
/// [`MAX_SEGMENTS`] segments and [`MAX_SEGMENTED`] bytes. An error means nothing was sent; a kernel or
/// route without segmentation offload answers `EIO`, `EINVAL` or `ENOPROTOOPT`
/// ([`is_segmentation_refused`]), and the caller then sends one datagram at a time.
pub fn send_segments(
    socket: &UdpSocket,
    to: Option<&SocketAddr>,
    parts: &[IoSlice<'_>],
    segment: usize,
) -> io::Result<usize> {
    let Ok(segment16) = u16::try_from(segment) else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    #[cfg(feature = "fault-injection")]
    if let Some(r) = crate::faults::intercept_segments(socket, to, parts, segment) {
        return r;
    }
    let mut control = [0u8; cmsg_space(2)];
    control[..CMSG_HEADER - 8].copy_from_slice(&(CMSG_HEADER + 2).to_ne_bytes());
    control[CMSG_HEADER - 8..CMSG_HEADER - 4].copy_from_slice(&SOL_UDP.to_ne_bytes());
    control[CMSG_HEADER - 4..CMSG_HEADER].copy_from_slice(&UDP_SEGMENT.to_ne_bytes());
    control[CMSG_HEADER..CMSG_HEADER + 2].copy_from_slice(&segment16.to_ne_bytes());
    let addr = to.map(|a| socket2::SockAddr::from(*a));
    // SAFETY: `msghdr` is plain old data (integers and pointers), for which all zeroes is valid.
    let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
    if let Some(addr) = &addr {
        h.msg_name = addr.as_ptr().cast_mut().cast();
        h.msg_namelen = addr.len();
    }
    // `IoSlice` is guaranteed to be ABI compatible with `iovec` on Unix; the kernel only reads it.
    h.msg_iov = parts.as_ptr().cast_mut().cast::<libc::iovec>();
    h.msg_iovlen = parts.len() as _;
    h.msg_control = control.as_mut_ptr().cast();
    h.msg_controllen = control.len() as _;
    // SAFETY: the header points at `parts` (each a live buffer of its length), the control message
    // and the address, all live until the call returns, with their true lengths; the kernel only
    // reads them.
    let r = unsafe { raw_sendmsg(socket, &h) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as usize)
}

/// Whether a [`send_segments`] error says that segmentation offload cannot be used here (rather than
/// a lost datagram or a real failure).
pub fn is_segmentation_refused(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL | libc::ENOPROTOOPT | libc::EOPNOTSUPP))
}

/// Asks the kernel to hand this socket runs of same-sized datagrams from one sender as one buffer
/// (UDP generic receive offload, `UDP_GRO`); [`recv_segments_nowait`] and
/// [`recv_from_segments_nowait`] then say where each datagram ends. Returns whether the kernel
/// agreed. A socket with it must receive into buffers of at least [`GRO_BUFFER`] bytes.
pub fn enable_gro(socket: &UdpSocket) -> bool {
    set_gro(socket, true)
}

/// Turns `UDP_GRO` on or off ([`enable_gro`]); whether the kernel agreed. A run taken whole while
/// it was on and read after it is off comes as one datagram, without where its datagrams end: turn
/// it off when no runs are expected. Each datagram a socket receives with it on costs the kernel
/// more: in an A/B on loopback (one process, the two pairs of sockets in turn, 1,000 round trips
/// each; five runs), a Null-sized ping-pong whose echo's socket had it on took 1.0–3.3% longer
/// than one whose had it off (within 1% once turned off again, as two sockets without it ever
/// were), and 2.4–8.5% longer with it on at both ends.
pub fn set_gro(socket: &UdpSocket, on: bool) -> bool {
    use std::os::fd::AsRawFd;
    let on: libc::c_int = on.into();
    // SAFETY: the descriptor is the socket's, open while it is borrowed; the option value is a
    // live `c_int` and its size is given.
    let r = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            SOL_UDP,
            UDP_GRO,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    r == 0
}

/// Whether `UDP_GRO` is on ([`set_gro`]), as the kernel says.
pub fn gro_is_on(socket: &UdpSocket) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    let mut on: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the descriptor is the socket's, open while it is borrowed; the kernel writes at most
    // `len` bytes to the live `c_int`, and `len` back.
    let r = unsafe {
        libc::getsockopt(socket.as_raw_fd(), SOL_UDP, UDP_GRO, (&mut on as *mut libc::c_int).cast(), &mut len)
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(on != 0)
}

/// The smallest receive buffer of a socket with [`enable_gro`]: a coalesced run is at most what one
/// IPv4 datagram carries.
pub const GRO_BUFFER: usize = 65_536;

/// The segment size a received control area announces (`UDP_GRO`), if any.
pub(crate) fn gro_segment(control: &[u8]) -> Option<usize> {
    let mut at = 0;
    while control.len() >= at + CMSG_HEADER {
        let word = std::mem::size_of::<usize>();
        let len = usize::from_ne_bytes(control[at..at + word].try_into().ok()?);
        let level = i32::from_ne_bytes(control[at + word..at + word + 4].try_into().ok()?);
        let kind = i32::from_ne_bytes(control[at + word + 4..at + word + 8].try_into().ok()?);
        if len < CMSG_HEADER || len > control.len() - at {
            return None;
        }
        if level == SOL_UDP && kind == UDP_GRO && len >= CMSG_HEADER + 2 {
            let data = &control[at + CMSG_HEADER..at + len];
            // The kernel writes an int; a u16 in older ones.
            let size = match data.len() {
                2..=3 => u16::from_ne_bytes([data[0], data[1]]) as usize,
                _ => i32::from_ne_bytes(data[..4].try_into().ok()?).max(0) as usize,
            };
            return (size > 0).then_some(size);
        }
        at += cmsg_space(len - CMSG_HEADER);
    }
    None
}

/// A `recvmsg` of whatever waits (`MSG_DONTWAIT`, `MSG_TRUNC`), made as the system call itself,
/// as this crate's other receives are (rustix's, and `mmsg`'s). glibc's `recvmsg`, `recvfrom` and
/// `recvmmsg` are thread cancellation points: each turns asynchronous cancellation on before the
/// call and off after it, which no Rust thread needs (none is ever cancelled). Those two turns were
/// 5.5% of a spinning UDP server's time on our VM, where the raw echo (rustix's system calls, which
/// skip them) spent none: a spinning server looks at its socket about ten times a call. `-1` with
/// `errno` set on failure, as glibc's.
///
/// # Safety
///
/// `h` must point only at memory the kernel may write, with its true lengths, live until the call
/// returns.
pub(crate) unsafe fn raw_recvmsg(socket: &UdpSocket, h: &mut libc::msghdr) -> libc::c_long {
    // SAFETY: as the caller promises; `syscall` passes the arguments to the kernel as they are.
    unsafe {
        libc::syscall(
            libc::SYS_recvmsg,
            libc::c_long::from(socket.as_raw_fd()),
            h as *mut libc::msghdr,
            libc::c_long::from(libc::MSG_DONTWAIT | libc::MSG_TRUNC),
        )
    }
}

/// A `sendmsg` of `h` with no flags, made as the system call itself, for the reason [`raw_recvmsg`]
/// is: glibc's `sendmsg` is a thread cancellation point, and turns asynchronous cancellation on
/// and off around the call. `-1` with `errno` set on failure, as glibc's.
///
/// # Safety
///
/// `h` must point only at memory the kernel may read, with its true lengths, live until the call
/// returns.
pub(crate) unsafe fn raw_sendmsg(socket: &UdpSocket, h: &libc::msghdr) -> libc::c_long {
    // SAFETY: as the caller promises; `syscall` passes the arguments to the kernel as they are.
    unsafe {
        libc::syscall(
            libc::SYS_sendmsg,
            libc::c_long::from(socket.as_raw_fd()),
            h as *const libc::msghdr,
            libc::c_long::from(0),
        )
    }
}

/// The IP address and port in `storage`, of which the kernel wrote `len` bytes.
pub(crate) fn socket_addr(storage: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    let len = len as usize;
    match i32::from(storage.ss_family) {
        libc::AF_INET if len >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the storage holds a `sockaddr_in`, which it is large and
            // aligned enough for, and the kernel wrote all of it.
            let a = unsafe { &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Some(SocketAddrV4::new(ip, u16::from_be(a.sin_port)).into())
        }
        libc::AF_INET6 if len >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for a `sockaddr_in6`.
            let a = unsafe { &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            Some(SocketAddrV6::new(ip, u16::from_be(a.sin6_port), a.sin6_flowinfo, a.sin6_scope_id).into())
        }
        _ => None,
    }
}

/// What [`recv_segments_nowait`] and [`recv_from_segments_nowait`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segmented {
    /// What arrived (the whole run's length, for a coalesced run).
    pub received: Received,
    /// Each datagram of the run is this long but the last (`None`: one datagram).
    pub segment: Option<usize>,
}

/// One non-blocking `recvmsg` into `buf`, reading the segment size of a coalesced run and, with
/// `want_addr`, the sender. `None` when nothing was waiting.
fn recv_segments(
    socket: &UdpSocket,
    buf: &mut [u8],
    want_addr: bool,
) -> io::Result<Option<(Segmented, Option<SocketAddr>)>> {
    let len = buf.len();
    let got = match recv_parts(socket, &mut [io::IoSliceMut::new(buf)], want_addr) {
        Ok(got) => got,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
        Err(e) => return Err(e),
    };
    let from = if want_addr { Some(got.from.ok_or_else(|| io::Error::other("non-IP sender address"))?) } else { None };
    Ok(Some((Segmented { received: classify(len, got.len), segment: got.segment }, from)))
}

/// What one [`recv_parts`] brought.
pub(crate) struct Parts {
    /// The datagram's (or coalesced run's) whole length, whether or not the parts held it.
    pub(crate) len: usize,
    /// The parts could not hold all of it.
    pub(crate) truncated: bool,
    /// Each datagram of a coalesced run (UDP GRO) is this long but the last; `None`: one datagram.
    pub(crate) segment: Option<usize>,
    /// The sender, when asked for and the kernel gave an IP address.
    pub(crate) from: Option<SocketAddr>,
}

/// One `recvmsg` that does not block ([`raw_recvmsg`]) of the datagram waiting on `socket`,
/// scattered over `parts` in order, with room for a GRO segment size and, with `want_addr`, the
/// sender's address. An error is the system call's (`WouldBlock` when nothing was waiting).
pub(crate) fn recv_parts(socket: &UdpSocket, parts: &mut [io::IoSliceMut<'_>], want_addr: bool) -> io::Result<Parts> {
    let room: usize = parts.iter().map(|p| p.len()).sum();
    let mut control = [0u8; cmsg_space(4) * 2];
    // SAFETY: `sockaddr_storage` and `msghdr` are plain old data (integers, arrays and pointers),
    // for which all zeroes is valid.
    let mut name: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
    if want_addr {
        h.msg_name = (&mut name as *mut libc::sockaddr_storage).cast();
        h.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    }
    // `IoSliceMut` is guaranteed to be ABI compatible with `iovec` on Unix.
    h.msg_iov = parts.as_mut_ptr().cast::<libc::iovec>();
    h.msg_iovlen = parts.len() as _;
    h.msg_control = control.as_mut_ptr().cast();
    h.msg_controllen = control.len() as _;
    // SAFETY: the header points at `parts` (each a live, exclusively borrowed buffer of its length),
    // the control area and the address storage, all live until the call returns, with their true
    // lengths; the kernel writes only within them.
    let r = unsafe { raw_recvmsg(socket, &mut h) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let len = r as usize;
    let truncated = h.msg_flags & libc::MSG_TRUNC != 0 || len > room;
    let segment = gro_segment(&control[..(h.msg_controllen as usize).min(control.len())]).filter(|&s| s < len);
    let from = if want_addr { socket_addr(&name, h.msg_namelen) } else { None };
    Ok(Parts { len, truncated, segment, from })
}

/// As [`recv_nowait`], on a socket with [`enable_gro`]: also says where the datagrams of a
/// coalesced run end.
pub fn recv_segments_nowait(socket: &UdpSocket, buf: &mut [u8]) -> io::Result<Segmented> {
    match recv_segments(socket, buf, false) {
        Ok(Some((s, _))) => Ok(s),
        Ok(None) => Ok(Segmented { received: Received::Nothing, segment: None }),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            Ok(Segmented { received: Received::Refused, segment: None })
        }
        Err(e) => Err(e),
    }
}

/// As [`recv_from_nowait`], on a socket with [`enable_gro`]: also says where the datagrams of a
/// coalesced run end.
pub fn recv_from_segments_nowait(socket: &UdpSocket, buf: &mut [u8]) -> io::Result<Option<(Segmented, SocketAddr)>> {
    match recv_segments(socket, buf, true) {
        Ok(Some((s, Some(from)))) => Ok(Some((s, from))),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Ok(None),
        Err(e) => Err(e),
    }
}

/// The datagrams of a received run: `len` bytes cut every `segment` bytes (one piece without one).
pub fn segments(len: usize, segment: Option<usize>) -> impl Iterator<Item = std::ops::Range<usize>> {
    let step = segment.unwrap_or(len).max(1);
    // An empty datagram is one (empty) piece.
    (0..len.max(1)).step_by(step).map(move |at| at..(at + step).min(len))
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
    fn a_datagram_in_parts_arrives_whole_by_every_way_of_sending_it() {
        let server = bind("127.0.0.1:0".parse().unwrap(), false).unwrap();
        let client = connect(server.local_addr().unwrap()).unwrap();
        server.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        client.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let big = vec![7u8; GATHER_SMALL];
        // Small in several parts (copied into one: `send`), in one part with empty ones around it,
        // and larger than GATHER_SMALL in parts (`sendmsg`).
        let ways: [&[&[u8]]; 4] = [&[b"head", b"", b"body", b"sum"], &[b"", b"alone", b""], &[b"h", &big], &[]];
        let mut buf = vec![0u8; 2 * GATHER_SMALL];
        for parts in ways {
            let io: Vec<IoSlice<'_>> = parts.iter().map(|p| IoSlice::new(p)).collect();
            let whole = parts.concat();
            assert_eq!(send_gather(&client, &io).unwrap(), whole.len());
            let (got, from) = recv_from_wait(&server, &mut buf).unwrap().unwrap();
            assert_eq!((got, &buf[..whole.len()]), (Received::Datagram(whole.len()), &whole[..]));
            assert_eq!(send_gather_to(&server, &from, &io).unwrap(), whole.len());
            assert_eq!(recv_wait(&client, &mut buf).unwrap(), Received::Datagram(whole.len()));
            assert_eq!(&buf[..whole.len()], &whole[..]);
        }
    }

    #[test]
    fn a_blocking_receive_with_a_wait_set_ends_empty_handed_when_nothing_comes() {
        let server = bind("127.0.0.1:0".parse().unwrap(), false).unwrap();
        let client = connect(server.local_addr().unwrap()).unwrap();
        let wait = set_receive_wait(&client, Duration::from_millis(1)).unwrap();
        // The kernel may round it up to a tick of its clock, never down.
        assert!(wait >= Duration::from_millis(1), "{wait:?}");
        let mut buf = [0u8; 16];
        assert_eq!(recv_wait(&client, &mut buf).unwrap(), Received::Nothing);
        send_gather_to(&server, &client.local_addr().unwrap(), &[IoSlice::new(b"here")]).unwrap();
        assert_eq!(recv_wait(&client, &mut buf).unwrap(), Received::Datagram(4));
        assert_eq!(&buf[..4], b"here");
    }

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

    #[test]
    fn a_waiting_receive_takes_what_comes_and_returns_empty_at_the_read_timeout() {
        let server = bind("127.0.0.1:0".parse().unwrap(), false).unwrap();
        let client = connect(server.local_addr().unwrap()).unwrap();
        server.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        client.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(recv_from_wait(&server, &mut buf).unwrap(), None);
        assert_eq!(recv_wait(&client, &mut buf).unwrap(), Received::Nothing);
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            send_gather(&client, &[IoSlice::new(b"ping")]).unwrap();
            client
        });
        server.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let (r, from) = recv_from_wait(&server, &mut buf).unwrap().unwrap();
        assert_eq!((r, &buf[..4]), (Received::Datagram(4), &b"ping"[..]));
        let client = sender.join().unwrap();
        send_gather_to(&server, &from, &[IoSlice::new(b"pong!")]).unwrap();
        let mut small = [0u8; 3];
        assert_eq!(recv_wait(&client, &mut small).unwrap(), Received::Truncated(5));
    }

    #[test]
    fn gro_goes_on_and_off_and_a_run_sent_while_it_is_off_comes_one_datagram_at_a_time() {
        let server = bind("127.0.0.1:0".parse().unwrap(), false).unwrap();
        assert!(!gro_is_on(&server).unwrap());
        assert!(set_gro(&server, true));
        assert!(gro_is_on(&server).unwrap());
        assert!(set_gro(&server, false));
        assert!(!gro_is_on(&server).unwrap());
        // A run of three datagrams sent with one segmented send arrives as three.
        let client = connect(server.local_addr().unwrap()).unwrap();
        let run = [7u8; 3 * 100];
        if send_segments(&client, None, &[IoSlice::new(&run)], 100).is_ok() {
            let mut buf = vec![0u8; GRO_BUFFER];
            for _ in 0..3 {
                assert!(wait_readable(&server, Some(Duration::from_secs(5))).unwrap());
                let s = recv_segments_nowait(&server, &mut buf).unwrap();
                assert_eq!((s.received, s.segment), (Received::Datagram(100), None));
            }
        }
    }

    #[test]
    fn a_nudge_wakes_a_waiter_once_per_ring() {
        let socket = bind("127.0.0.1:0".parse().unwrap(), false).unwrap();
        let nudge = Nudge::new().unwrap();
        let waiter = ExclusiveWaiter::new(&socket).unwrap();
        waiter.also(nudge.as_fd()).unwrap();
        assert!(!waiter.wait(Some(Duration::ZERO)).unwrap());
        assert!(!nudge.take());
        nudge.ring().unwrap();
        nudge.ring().unwrap();
        assert!(waiter.wait(Some(Duration::from_secs(5))).unwrap());
        assert!(nudge.take());
        assert!(waiter.wait(Some(Duration::ZERO)).unwrap(), "one ring left");
        assert!(nudge.take());
        assert!(!nudge.take());
        assert!(!waiter.wait(Some(Duration::ZERO)).unwrap());
    }

    /// The descriptors in the epoll set of `waiter`, as the kernel lists them.
    fn in_set(waiter: &ExclusiveWaiter) -> Vec<i32> {
        use std::os::fd::AsRawFd;
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", waiter.epoll.as_raw_fd())).unwrap();
        info.lines()
            .filter_map(|l| l.strip_prefix("tfd:"))
            .map(|l| l.split_whitespace().next().unwrap().parse().unwrap())
            .collect()
    }

    #[test]
    fn a_waiter_holds_its_socket_in_the_set_only_from_a_wait_to_a_disarm_and_misses_no_datagram() {
        use std::os::fd::AsRawFd;
        let socket = bind("127.0.0.1:0".parse().unwrap(), false).unwrap();
        let sender = connect(socket.local_addr().unwrap()).unwrap();
        let waiter = ExclusiveWaiter::new(&socket).unwrap();
        let own = waiter.socket.as_raw_fd();
        assert!(in_set(&waiter).is_empty(), "not in the set before the first wait");
        // A datagram that came before the wait armed the waiter wakes it at once.
        send_gather(&sender, &[IoSlice::new(b"early")]).unwrap();
        assert!(waiter.wait(Some(Duration::from_secs(5))).unwrap());
        assert_eq!(in_set(&waiter), [own]);
        let mut buf = [0u8; 16];
        assert_eq!(recv_nowait(&socket, &mut buf).unwrap(), Received::Datagram(5));
        // Spinning: out of the set, and a second disarm changes nothing.
        waiter.disarm();
        waiter.disarm();
        assert!(in_set(&waiter).is_empty(), "out of the set while spinning");
        // A datagram that arrives while it is out wakes the next wait.
        send_gather(&sender, &[IoSlice::new(b"while out")]).unwrap();
        assert!(waiter.wait(Some(Duration::from_secs(5))).unwrap());
        assert_eq!(in_set(&waiter), [own]);
        assert_eq!(recv_nowait(&socket, &mut buf).unwrap(), Received::Datagram(9));
        assert!(!waiter.wait(Some(Duration::ZERO)).unwrap(), "nothing left to wake for");
        // Blocking again and again, it stays in the set: no system call to add it each time.
        assert_eq!(in_set(&waiter), [own]);
    }

    #[test]
    fn a_segmented_send_arrives_as_datagrams_or_as_one_coalesced_run() {
        let plain = bind("127.0.0.1:0".parse().unwrap(), false).unwrap();
        let gro = bind("127.0.0.1:0".parse().unwrap(), false).unwrap();
        assert!(enable_gro(&gro), "this kernel has UDP_GRO");
        let sender = bind("127.0.0.1:0".parse().unwrap(), false).unwrap();
        let data: Vec<u8> = (0..3500u32).map(|i| i as u8).collect();
        for to in [&plain, &gro] {
            let addr = to.local_addr().unwrap();
            let parts = [IoSlice::new(&data[..1200]), IoSlice::new(&data[1200..])];
            assert_eq!(send_segments(&sender, Some(&addr), &parts, 1000).unwrap(), 3500);
        }
        // Without GRO: four datagrams, 1000 bytes each but the last.
        let mut buf = vec![0u8; GRO_BUFFER];
        let mut got = Vec::new();
        while got.len() < 4 {
            assert!(wait_readable(&plain, Some(Duration::from_secs(5))).unwrap());
            let (r, from) = recv_from_segments_nowait(&plain, &mut buf).unwrap().unwrap();
            assert_eq!(from, sender.local_addr().unwrap());
            let Received::Datagram(n) = r.received else { panic!("{r:?}") };
            assert_eq!(r.segment, None);
            got.push(buf[..n].to_vec());
        }
        assert_eq!(got.iter().map(Vec::len).collect::<Vec<_>>(), [1000, 1000, 1000, 500]);
        assert_eq!(got.concat(), data);
        // With GRO: the run in one buffer, cut where the datagrams end.
        assert!(wait_readable(&gro, Some(Duration::from_secs(5))).unwrap());
        let (r, _) = recv_from_segments_nowait(&gro, &mut buf).unwrap().unwrap();
        assert_eq!(r, Segmented { received: Received::Datagram(3500), segment: Some(1000) });
        assert_eq!(&buf[..3500], &data[..]);
        let pieces: Vec<_> = segments(3500, r.segment).collect();
        assert_eq!(pieces, [0..1000, 1000..2000, 2000..3000, 3000..3500]);
        assert_eq!(recv_from_segments_nowait(&gro, &mut buf).unwrap(), None);
    }

    #[test]
    fn a_lone_datagram_on_a_gro_socket_has_no_segment_size() {
        let server = bind("127.0.0.1:0".parse().unwrap(), false).unwrap();
        let client = connect(server.local_addr().unwrap()).unwrap();
        assert!(enable_gro(&client));
        let mut buf = vec![0u8; GRO_BUFFER];
        assert_eq!(recv_segments_nowait(&client, &mut buf).unwrap().received, Received::Nothing);
        send_gather_to(&server, &client.local_addr().unwrap(), &[IoSlice::new(b"one")]).unwrap();
        assert!(wait_readable(&client, Some(Duration::from_secs(5))).unwrap());
        let r = recv_segments_nowait(&client, &mut buf).unwrap();
        assert_eq!(r, Segmented { received: Received::Datagram(3), segment: None });
        assert_eq!(segments(3, None).collect::<Vec<_>>(), vec![(0..3)]);
        assert_eq!(segments(0, None).collect::<Vec<_>>(), vec![(0..0)]);
        // Too many segments, or a segment size no datagram has, is refused and sends nothing.
        let big = vec![0u8; 200];
        let e = send_segments(&client, None, &[IoSlice::new(&big)], 1).unwrap_err();
        assert!(is_segmentation_refused(&e), "{e}");
    }

    #[test]
    fn control_messages_other_than_gro_are_skipped_and_bad_lengths_end_the_walk() {
        let word = std::mem::size_of::<usize>();
        let mut area = Vec::new();
        let mut push = |level: i32, kind: i32, data: &[u8]| {
            let start = area.len();
            area.extend_from_slice(&(CMSG_HEADER + data.len()).to_ne_bytes());
            area.extend_from_slice(&level.to_ne_bytes());
            area.extend_from_slice(&kind.to_ne_bytes());
            area.extend_from_slice(data);
            area.resize(start + cmsg_space(data.len()), 0);
        };
        push(0, 8, &[1, 2, 3, 4]);
        push(SOL_UDP, UDP_GRO, &1472i32.to_ne_bytes());
        assert_eq!(gro_segment(&area), Some(1472));
        assert_eq!(gro_segment(&area[..cmsg_space(4)]), None);
        let mut bad = area.clone();
        bad[..word].copy_from_slice(&4096usize.to_ne_bytes());
        assert_eq!(gro_segment(&bad), None);
        bad[..word].copy_from_slice(&0usize.to_ne_bytes());
        assert_eq!(gro_segment(&bad), None);
    }
}
