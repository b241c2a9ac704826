//! TCP stream options of the TCP transport.

use std::io;
use std::net::TcpStream;
use std::time::Duration;

/// Prepares a connected stream for calls: no Nagle delay (`TCP_NODELAY`), non-blocking, and
/// keepalive probes after `idle` of silence, so that a peer whose host vanished (no FIN, no reset)
/// is found gone within `idle` + 3 probes a second apart.
pub fn prepare(stream: &TcpStream, idle: Duration) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_nonblocking(true)?;
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(idle.max(Duration::from_secs(1)))
        .with_interval(Duration::from_secs(1))
        .with_retries(3);
    socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive)
}

/// Reads what the stream holds into `buf` without blocking, as `Read::read` of a non-blocking
/// stream does (`WouldBlock` when nothing has come, `Ok(0)` when the peer closed), but with the
/// system call itself: the C library's `recv` and `read` are thread cancellation points, each
/// turning asynchronous cancellation on and off around the call, which no Rust thread needs.
pub fn read(stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    match crate::udp::read_stream_nowait(stream, buf)? {
        Some(n) => Ok(n),
        None => Err(io::ErrorKind::WouldBlock.into()),
    }
}

/// Writes what it can of `parts` with one `sendmsg`, without blocking whatever the socket's own
/// mode (`MSG_DONTWAIT`: `WouldBlock` when its buffer is full), as `Write::write_vectored` of a
/// non-blocking stream does, made as the system call itself (see [`read`]). A peer that closed
/// is an error (`MSG_NOSIGNAL`), never a `SIGPIPE`.
pub fn write_vectored(stream: &TcpStream, parts: &[io::IoSlice<'_>]) -> io::Result<usize> {
    use rustix::net::{sendmsg, SendAncillaryBuffer, SendFlags};
    let flags = SendFlags::DONTWAIT | SendFlags::NOSIGNAL;
    Ok(sendmsg(stream, parts, &mut SendAncillaryBuffer::default(), flags)?)
}

/// Makes the receives of [`read_wait`] on `stream` block, each for at most `wait`, and returns
/// the wait as the kernel took it (it counts in ticks of its clock and rounds up to a whole one:
/// 4 ms at 250 Hz). The stream is then in blocking mode: every other read and write of this
/// module still returns at once ([`read`], [`write_vectored`]), and so does a `poll` on it; only
/// `std`'s own `Read` and `Write` would block. `None` if the kernel refused (the stream may then
/// be left in either mode, which the functions of this module do not mind).
pub fn set_receive_wait(stream: &TcpStream, wait: Duration) -> Option<Duration> {
    stream.set_read_timeout(Some(wait)).ok()?;
    let took = stream.read_timeout().ok().flatten()?;
    stream.set_nonblocking(false).ok()?;
    Some(took)
}

/// Reads what comes on `stream` into `buf`, blocking in the receive itself until bytes come or the
/// stream's receive wait passes ([`set_receive_wait`]): then `Ok(None)`, as it is at once on a
/// stream that does not block. `Ok(Some(0))` when the peer closed. A waiting reader's cheapest
/// wait: one system call, where `poll` and a read after it take two. An interrupted receive is
/// taken again.
pub fn read_wait(stream: &TcpStream, buf: &mut [u8]) -> io::Result<Option<usize>> {
    loop {
        return match rustix::net::recv(stream, &mut *buf, rustix::net::RecvFlags::empty()) {
            Ok((n, _)) => Ok(Some(n)),
            Err(rustix::io::Errno::AGAIN) => Ok(None),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => Err(e.into()),
        };
    }
}

/// Connects to `addr` within `timeout`.
pub fn connect(addr: std::net::SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    TcpStream::connect_timeout(&addr, timeout)
}

/// Connections waiting, without a thread, for their next bytes: an `epoll` set, itself a
/// descriptor a thread can `poll` beside others. Each connection is armed once
/// ([`Parked::park`]): it is reported by [`Parked::ready`] when readable (or closed by its peer),
/// and then left out until parked again.
pub struct Parked {
    epoll: std::os::fd::OwnedFd,
}

impl Parked {
    /// An empty set.
    pub fn new() -> io::Result<Parked> {
        Ok(Parked { epoll: rustix::event::epoll::create(rustix::event::epoll::CreateFlags::CLOEXEC)? })
    }

    /// Arms `fd`, known by `token`: reported once when it becomes readable (at once if it is).
    pub fn park(&self, fd: std::os::fd::BorrowedFd<'_>, token: u64) -> io::Result<()> {
        use rustix::event::epoll::{add, EventData, EventFlags};
        let flags = EventFlags::IN | EventFlags::RDHUP | EventFlags::ONESHOT;
        Ok(add(&self.epoll, fd, EventData::new_u64(token), flags)?)
    }

    /// Leaves `fd` out of the set (after it was reported, or to close it parked).
    pub fn remove(&self, fd: std::os::fd::BorrowedFd<'_>) {
        let _ = rustix::event::epoll::delete(&self.epoll, fd);
    }

    /// The tokens of the connections readable now (without waiting), into `tokens`.
    pub fn ready(&self, tokens: &mut Vec<u64>) -> io::Result<()> {
        use rustix::event::epoll::{wait, Event};
        tokens.clear();
        let mut events = [std::mem::MaybeUninit::<Event>::uninit(); 64];
        loop {
            let zero = rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 };
            match wait(&self.epoll, &mut events[..], Some(&zero)) {
                Ok((got, _)) => {
                    let n = got.len();
                    tokens.extend(got.iter().map(|e| e.data.u64()));
                    if n < events.len() {
                        return Ok(());
                    }
                }
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl std::os::fd::AsFd for Parked {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.epoll.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    #[test]
    fn a_parked_connection_is_reported_once_when_bytes_come() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let parked = Parked::new().unwrap();
        let mut tokens = Vec::new();
        parked.park(server.as_fd(), 7).unwrap();
        parked.ready(&mut tokens).unwrap();
        assert!(tokens.is_empty(), "nothing to read yet");
        client.write_all(b"x").unwrap();
        let readable = crate::udp::wait_readable_fd(&parked, Some(Duration::from_secs(5))).unwrap();
        assert!(readable, "the set itself polls readable");
        parked.ready(&mut tokens).unwrap();
        assert_eq!(tokens, [7]);
        parked.ready(&mut tokens).unwrap();
        assert!(tokens.is_empty(), "reported once until parked again");
        parked.remove(server.as_fd());
        parked.park(server.as_fd(), 8).unwrap();
        parked.ready(&mut tokens).unwrap();
        assert_eq!(tokens, [8], "parked again with its byte unread: at once");
    }

    #[test]
    fn a_parked_connection_is_reported_when_its_peer_hangs_up() {
        // Any stream socket: the shared-memory rendezvous watches its clients' connections so.
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let parked = Parked::new().unwrap();
        let mut tokens = Vec::new();
        parked.park(ours.as_fd(), 3).unwrap();
        parked.ready(&mut tokens).unwrap();
        assert!(tokens.is_empty(), "the peer is there");
        drop(theirs);
        let readable = crate::udp::wait_readable_fd(&parked, Some(Duration::from_secs(5))).unwrap();
        assert!(readable, "the set polls readable at the hang-up");
        parked.ready(&mut tokens).unwrap();
        assert_eq!(tokens, [3]);
    }

    #[test]
    fn a_stream_that_waits_in_its_receive_still_reads_and_writes_without_blocking() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        prepare(&server, Duration::from_secs(2)).unwrap();
        let wait = set_receive_wait(&server, Duration::from_millis(1)).expect("the kernel takes a read timeout");
        assert!(wait >= Duration::from_millis(1), "rounded up, never down: {wait:?}");
        let mut buf = [0u8; 8];
        assert_eq!(read(&server, &mut buf).unwrap_err().kind(), io::ErrorKind::WouldBlock, "a look does not wait");
        assert_eq!(read_wait(&server, &mut buf).unwrap(), None, "the receive waits, then gives up");
        client.write_all(b"abc").unwrap();
        assert_eq!(read_wait(&server, &mut buf).unwrap(), Some(3));
        assert_eq!(&buf[..3], b"abc");
        // Writes never wait for room: with the peer reading nothing, they stop at a full buffer.
        let chunk = vec![7u8; 64 * 1024];
        let mut sent = 0;
        loop {
            match write_vectored(&server, &[io::IoSlice::new(&chunk)]) {
                Ok(n) => sent += n,
                Err(e) => {
                    assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
                    break;
                }
            }
            assert!(sent < 1 << 30, "the socket's buffer has no end");
        }
        assert!(sent > 0);
        // The peer gone with bytes unread (it resets the connection): a write fails, with no
        // signal, and so does a read.
        drop(client);
        let mut failed = false;
        for _ in 0..100 {
            if write_vectored(&server, &[io::IoSlice::new(b"x")]).is_err() {
                failed = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(failed, "writing to a closed peer fails");
        let read = read_wait(&server, &mut buf);
        assert!(matches!(read, Ok(Some(0)) | Err(_)), "the connection is over: {read:?}");
    }
}
