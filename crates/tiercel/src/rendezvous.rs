//! What client and server of the shared-memory transport share: the rendezvous name, and the framing
//! of the bind exchange over the rendezvous socket (the same bind packets as over UDP, each preceded
//! by its length; `tiercel_proto::bind` decides what they say).
//!
//! A server bound to a UDP address `A` also listens on the abstract UNIX socket `tiercel/A`. Abstract
//! sockets exist only inside one network namespace of one host, so a client that can connect to the
//! name of the address it imports is on the server's host, and binds through shared memory:
//!
//! ```text
//! client                                             server
//!   connect @tiercel/127.0.0.1:7373
//!   Bind (as over UDP) ────────────────────────────►  the bind machine: the export, its version
//!                                                      and fingerprint
//!             ◄─ Reject AuthRequired {challenge}      (only with a shared secret; the client sends
//!                                                      the request again with its proof)
//!             ◄─ BindReply {grant: slots, slot data}  create a sealed memfd region, one slot per
//!                 + the region's descriptor           client thread; its descriptor rides along
//!                                                      (SCM_RIGHTS): holding it is the capability
//!   or        ◄─ Reject {status, what is exported}
//! ```
//!
//! The connection stays open for the life of the binding: when either process dies, the other sees it
//! closed, and gives up the binding (server) or fails the call in progress (client).

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;

/// Longest message of the bind exchange: a padded bind request.
pub(crate) const MAX_MESSAGE: usize = tiercel_proto::bind::PADDED_REQUEST;

/// The abstract socket name of a server bound to `addr`.
pub(crate) fn rendezvous_name(addr: SocketAddr) -> String {
    format!("tiercel/{addr}")
}

/// Sends one framed message, with a descriptor if given.
pub(crate) fn send(stream: &UnixStream, msg: &[u8], fd: Option<std::os::fd::BorrowedFd<'_>>) -> io::Result<()> {
    let mut framed = Vec::with_capacity(4 + msg.len());
    framed.extend_from_slice(&(msg.len() as u32).to_le_bytes());
    framed.extend_from_slice(msg);
    match fd {
        Some(fd) => tiercel_sys::shm::send_with_fd(stream, &framed, Some(fd)),
        None => (&*stream).write_all(&framed),
    }
}

/// Receives one framed message (at most [`MAX_MESSAGE`] bytes) and the descriptor sent with it.
pub(crate) fn recv(stream: &UnixStream) -> io::Result<(Vec<u8>, Option<OwnedFd>)> {
    let mut len = [0u8; 4];
    let (n, mut fd) = tiercel_sys::shm::recv_with_fd(stream, &mut len)?;
    if n == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "rendezvous connection closed"));
    }
    (&*stream).read_exact(&mut len[n..])?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_MESSAGE {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("bind message of {len} bytes")));
    }
    let mut msg = vec![0u8; len];
    let mut got = 0;
    while got < len {
        let (n, more) = tiercel_sys::shm::recv_with_fd(stream, &mut msg[got..])?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "rendezvous connection closed"));
        }
        fd = fd.or(more);
        got += n;
    }
    Ok((msg, fd))
}
