//! Registering with this host's `rpcbind`: portmapper version 2 (RFC 1833), `PMAPPROC_SET` and
//! `PMAPPROC_UNSET`, over UDP to 127.0.0.1:111 (where `rpcbind` takes them from local callers).

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
/// Tries, each waiting this long for the answer.
const TRIES: u32 = 3;
const WAIT: Duration = Duration::from_millis(500);

/// Registers `program` `version` at `port` for `protocol` (6 TCP, 17 UDP). A mapping already there
/// (a server that died without unregistering) is replaced.
pub(super) fn set(program: u32, version: u32, protocol: u32, port: u16) -> io::Result<()> {
    if call(PMAPPROC_SET, [program, version, protocol, u32::from(port)])? {
        return Ok(());
    }
    call(PMAPPROC_UNSET, [program, version, 0, 0])?;
    if call(PMAPPROC_SET, [program, version, protocol, u32::from(port)])? {
        return Ok(());
    }
    Err(io::Error::other(format!("rpcbind refused to register program {program} version {version}")))
}

/// Removes every mapping of `program` `version`.
pub(super) fn unset(program: u32, version: u32) -> io::Result<bool> {
    call(PMAPPROC_UNSET, [program, version, 0, 0])
}

/// Calls the portmapper's `procedure` with a mapping; its boolean answer.
fn call(procedure: u32, mapping: [u32; 4]) -> io::Result<bool> {
    let socket = UdpSocket::bind("127.0.0.1:0")?;
    socket.connect(SocketAddr::from(([127, 0, 0, 1], PMAP_PORT)))?;
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
                (ReplyStatus::Accepted(Accepted::Success), [0, 0, 0, answer]) => Ok(*answer == 1),
                (status, _) => Err(io::Error::other(format!("rpcbind answered {status:?}"))),
            };
        }
    }
    Err(io::Error::new(io::ErrorKind::TimedOut, "rpcbind did not answer on 127.0.0.1:111 (is it running?)"))
}
