//! Frames on a non-blocking TCP stream, for both sides of the TCP transport: a whole frame goes
//! out with one `writev` (more only when the socket's buffer is full), and what arrives is read
//! into a [`Deframer`].

use std::io::{ErrorKind, IoSlice, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use tiercel_proto::stream::Deframer;

/// Writes all of `parts` to the non-blocking `stream`, waiting for room at most `timeout` in all
/// (a peer that does not read gets `TimedOut`: the connection is then broken, since part of a frame
/// may have gone).
pub(crate) fn send(stream: &TcpStream, parts: &mut [IoSlice<'_>], timeout: Duration) -> std::io::Result<()> {
    let mut parts = parts;
    let mut until = None;
    while !parts.is_empty() {
        match (&*stream).write_vectored(parts) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut parts, n),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                let until = *until.get_or_insert_with(|| Instant::now() + timeout);
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() || !tiercel_sys::udp::wait_writable_fd(stream, Some(left))? {
                    return Err(std::io::Error::new(ErrorKind::TimedOut, "the peer does not read"));
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes the frame given whole in `parts` (its prefix first), sealed with `session` (a secure
/// connection's frames are), as [`send`] does. The caller holds the connection's writing lock, so
/// that frames go in the order they were sealed. The frame is sealed in a buffer of the thread's
/// (kept while it is no larger than `retention::LARGE`).
pub(crate) fn send_sealed(
    stream: &TcpStream,
    session: &crate::secure::Session,
    parts: &[IoSlice<'_>],
    timeout: Duration,
) -> std::io::Result<()> {
    SEALING.with(|buf| {
        let mut buf = buf.borrow_mut();
        let sealed = session.seal_frame(parts, &mut buf);
        let sent = match sealed {
            Ok(()) => send(stream, &mut [IoSlice::new(&buf)], timeout),
            Err(_) => Err(std::io::Error::other("the binding's keys have sealed all they may: bind again")),
        };
        if buf.capacity() > crate::retention::LARGE {
            *buf = Vec::new();
        }
        sent
    })
}

thread_local! {
    /// Where this thread seals the frames it sends on secure connections.
    static SEALING: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Reads what the non-blocking `stream` has into `frames`: `Ok(true)` if something came,
/// `Ok(false)` if nothing was there, an error (`UnexpectedEof` when the peer closed) if the
/// connection is over.
pub(crate) fn receive(stream: &TcpStream, frames: &mut Deframer) -> std::io::Result<bool> {
    receive_up_to(stream, frames, usize::MAX)
}

/// [`receive`] of at most `most` bytes.
pub(crate) fn receive_up_to(stream: &TcpStream, frames: &mut Deframer, most: usize) -> std::io::Result<bool> {
    let spare = frames.spare();
    let room = most.min(spare.len());
    let spare = &mut spare[..room];
    if spare.is_empty() {
        // A whole frame is buffered and not yet taken: nothing to read for now.
        return Ok(false);
    }
    match (&*stream).read(spare) {
        Ok(0) => Err(ErrorKind::UnexpectedEof.into()),
        Ok(n) => {
            frames.filled(n);
            Ok(true)
        }
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => Ok(false),
        Err(e) => Err(e),
    }
}
