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

/// Writes what it can of `parts` with one `writev`, as `Write::write_vectored` does, made as the
/// system call itself (see [`read`]).
pub fn write_vectored(stream: &TcpStream, parts: &[io::IoSlice<'_>]) -> io::Result<usize> {
    Ok(rustix::io::writev(stream, parts)?)
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
}
