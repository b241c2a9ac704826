//! What client and server of the shared-memory transport share: the rendezvous name, and the framing
//! of the bind exchange over the rendezvous socket (the same bind packets as over UDP, each preceded
//! by its length; `tiercel_proto::bind` decides what they say).
//!
//! A server with shared memory listens on an abstract UNIX socket whose name is random for each
//! incarnation. A client never guesses it: it asks the server over UDP, with a bind request that
//! asks for the rendezvous; the server answers a client on its own host (a loopback source, or the
//! address it is bound to) with the name, its process id and its user id, proven with the shared
//! secret if it has one. The client connects to that name in its own network namespace and checks
//! the connection's peer credentials (`SO_PEERCRED`) against the pid and uid it was told, so that
//! another process holding the name (a local user squatting it after a crash) is never used:
//!
//! ```text
//! client                                             server
//!   Bind {…, asks for the rendezvous} over UDP ─────►  the bind machine, as for any bind
//!             ◄─ BindReply {rendezvous: name, pid, uid} (no binding made)
//!   connect @tiercel/<name>; peer pid and uid must match
//!   Bind (as over UDP) ────────────────────────────►  the bind machine again, in the rendezvous
//!                                                      thread: no thread and at most 16 pending
//!                                                      connections before a grant, 2 s in all
//!             ◄─ Reject AuthRequired {challenge}      (only with a shared secret; the client sends
//!                                                      the request again with its proof)
//!             ◄─ BindReply {grant: slots, slot data}  create a sealed memfd region, one slot per
//!                 + the region's descriptor           client thread; its descriptor rides along
//!                                                      (SCM_RIGHTS): holding it is the capability
//!   or        ◄─ Reject {status, what is exported}
//! ```
//!
//! The connection stays open for the life of the binding: when either process dies, the other sees it
//! closed, and gives up the binding (server) or fails the call in progress (client). A client that
//! cannot bind through shared memory (no answer with a rendezvous, the wrong process at the name,
//! no room) binds over UDP, unless its address asked for shared memory only.

use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;

/// Longest message of the bind exchange: a padded bind request.
pub(crate) const MAX_MESSAGE: usize = tiercel_proto::bind::PADDED_REQUEST;

/// The abstract socket name of rendezvous `name`.
pub(crate) fn socket_name(name: &[u8; 16]) -> String {
    let hex: String = name.iter().map(|b| format!("{b:02x}")).collect();
    format!("tiercel/{hex}")
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

/// Reads what has arrived of one framed message from a non-blocking stream into `buf` (which keeps
/// a partial message between calls). `Ok(Some(msg))` once a whole message is there; `Ok(None)` for
/// more to come; an error when the peer closed or announced a message too long.
pub(crate) fn recv_nonblocking(stream: &UnixStream, buf: &mut Vec<u8>) -> io::Result<Option<Vec<u8>>> {
    let mut chunk = [0u8; 512];
    loop {
        let want = match buf.len() {
            n if n < 4 => 4 - n,
            n => {
                let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
                if len > MAX_MESSAGE {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, format!("bind message of {len} bytes")));
                }
                if n == 4 + len {
                    let msg = buf[4..].to_vec();
                    buf.clear();
                    return Ok(Some(msg));
                }
                4 + len - n
            }
        };
        let take = want.min(chunk.len());
        match (&*stream).read(&mut chunk[..take]) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "rendezvous connection closed")),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}
