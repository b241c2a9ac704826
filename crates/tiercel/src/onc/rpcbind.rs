//! Talking to `rpcbind` with portmapper version 2 (RFC 1833) over UDP: registering with this
//! host's (`PMAPPROC_SET` and `PMAPPROC_UNSET` to 127.0.0.1:111, where `rpcbind` takes them from
//! local callers), and asking a host's for a program's port (`PMAPPROC_GETPORT`).

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use tiercel_proto::onc::{self, Accepted, Credential, ReplyStatus};

/// The portmapper's program, version and port.
const PMAP_PROGRAM: u32 = 100_000;
const PMAP_VERSION: u32 = 2;
const PMAP_PORT: u16 = 111;
const PMAPPROC_SET: u32 = 1;
const PMAPPROC_UNSET: u32 = 2;
const PMAPPROC_GETPORT: u32 = 3;
/// Tries, each waiting this long for the answer.
const TRIES: u32 = 3;
const WAIT: Duration = Duration::from_millis(500);

/// Registers `program` `version` at `port` for `protocol` (6 TCP, 17 UDP). A mapping already there
/// (a server that died without unregistering) is replaced.
pub(super) fn set(program: u32, version: u32, protocol: u32, port: u16) -> io::Result<()> {
    if local(PMAPPROC_SET, [program, version, protocol, u32::from(port)])? {
        return Ok(());
    }
    local(PMAPPROC_UNSET, [program, version, 0, 0])?;
    if local(PMAPPROC_SET, [program, version, protocol, u32::from(port)])? {
        return Ok(());
    }
    Err(io::Error::other(format!("rpcbind refused to register program {program} version {version}")))
}

/// Removes every mapping of `program` `version`.
pub(super) fn unset(program: u32, version: u32) -> io::Result<bool> {
    local(PMAPPROC_UNSET, [program, version, 0, 0])
}

/// Where `host`'s `rpcbind` says `program` `version` is served over `transport`.
pub(super) fn port_of(
    host: &str,
    program: u32,
    version: u32,
    transport: super::OncTransport,
) -> Result<SocketAddr, crate::BindError> {
    use std::net::ToSocketAddrs as _;
    let (protocol, name) = match transport {
        super::OncTransport::Udp => (17, "udp"),
        super::OncTransport::Tcp => (6, "tcp"),
    };
    let found = || -> io::Result<SocketAddr> {
        let rpcbind = (host, PMAP_PORT).to_socket_addrs()?.next().ok_or_else(|| io::Error::other("no address"))?;
        match call(rpcbind, PMAPPROC_GETPORT, [program, version, protocol, 0])? {
            0 => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("rpcbind on {host} has no program {program} version {version} over {name}"),
            )),
            port => Ok(SocketAddr::new(rpcbind.ip(), port as u16)),
        }
    };
    found().map_err(crate::BindError::Io)
}

/// Calls this host's portmapper's `procedure` with a mapping; its boolean answer.
fn local(procedure: u32, mapping: [u32; 4]) -> io::Result<bool> {
    Ok(call(SocketAddr::from(([127, 0, 0, 1], PMAP_PORT)), procedure, mapping)? == 1)
}

/// Calls the portmapper at `rpcbind` with a mapping: its one-word answer.
fn call(rpcbind: SocketAddr, procedure: u32, mapping: [u32; 4]) -> io::Result<u32> {
    let any: SocketAddr =
        if rpcbind.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { (std::net::Ipv6Addr::UNSPECIFIED, 0).into() };
    let socket = UdpSocket::bind(any)?;
    socket.connect(rpcbind)?;
    socket.set_read_timeout(Some(WAIT))?;
    let random = crate::random::bytes()?;
    let xid = u32::from_be_bytes([random[0], random[1], random[2], random[3]]);
    let mut msg = Vec::with_capacity(64);
    onc::write_call(&mut msg, xid, PMAP_PROGRAM, PMAP_VERSION, procedure, &Credential::None);
    for word in mapping {
        msg.extend_from_slice(&word.to_be_bytes());
    }
    let mut buf = [0u8; 512];
    for _ in 0..TRIES {
        socket.send(&msg)?;
        loop {
            let n = match socket.recv(&mut buf) {
                Ok(n) => n,
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => break,
                Err(e) => return Err(e),
            };
            let Some(reply) = onc::parse_reply(&buf[..n]) else { continue };
            if reply.xid != xid {
                continue;
            }
            return match (reply.status, reply.results) {
                (ReplyStatus::Accepted(Accepted::Success), &[a, b, c, d]) => Ok(u32::from_be_bytes([a, b, c, d])),
                (status, _) => Err(io::Error::other(format!("rpcbind answered {status:?}"))),
            };
        }
    }
    Err(io::Error::new(io::ErrorKind::TimedOut, format!("rpcbind did not answer at {rpcbind} (is it running?)")))
}
