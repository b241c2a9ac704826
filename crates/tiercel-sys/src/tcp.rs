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

/// Connects to `addr` within `timeout`.
pub fn connect(addr: std::net::SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    TcpStream::connect_timeout(&addr, timeout)
}
