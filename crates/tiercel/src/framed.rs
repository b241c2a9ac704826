//! Frames on a TCP stream, for both sides of the TCP transport: a whole frame goes out with one
//! `sendmsg` that never blocks (more only when the socket's buffer is full), and what arrives is
//! read into a [`Deframer`], without blocking or, where a reader waits, blocking in the read.

use std::io::{ErrorKind, IoSlice};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use tiercel_proto::stream::Deframer;

/// Writes all of `parts` to `stream`, whose writes never block (`MSG_DONTWAIT`), waiting in `poll`
/// for room at most `timeout` in all (a peer that does not read gets `TimedOut`: the connection is
/// then broken, since part of a frame may have gone).
pub(crate) fn send(stream: &TcpStream, parts: &mut [IoSlice<'_>], timeout: Duration) -> std::io::Result<()> {
    let mut parts = parts;
    let mut until = None;
    while !parts.is_empty() {
        match tiercel_sys::tcp::write_vectored(stream, parts) {
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

/// Most bytes of the stream one sealed record carries: a record is opened only whole, so this
/// much stays in the cache from its arrival to its opening and its copy into the frames.
pub(crate) const RECORD: usize = 64 * 1024;
/// Sealed bytes a sender gathers before it writes them: eight records, so that a large frame goes
/// in writes of half a megabyte (the thread's sealing buffer grows to that, and keeps it). With each
/// record written as soon as it was sealed, a 16 MiB call over loopback had 0.56-0.68 of a plain
/// connection's bandwidth; four records a write 0.61-0.76, eight 0.73-0.85, sixteen 0.81-1.02
/// (alternating probes on this project's machines).
const SEALED_WRITE: usize = 8 * RECORD;
/// Most pieces of one record (a record is cut short where a frame has more).
const RECORD_PARTS: usize = 16;

/// Writes the frame given whole in `parts` (its prefix first) on a secure connection, as [`send`]
/// does, as sealed records of up to [`RECORD`] bytes of the stream each, sealed with `session` in
/// a buffer of the thread's (a record long, so that a large frame never needs one as large).
/// The caller holds the connection's writing lock, so that records go in the order they were
/// sealed.
pub(crate) fn send_sealed(
    stream: &TcpStream,
    session: &crate::secure::Session,
    parts: &[IoSlice<'_>],
    timeout: Duration,
) -> std::io::Result<()> {
    let exhausted = |_| std::io::Error::other("the binding's keys have sealed all they may: bind again");
    SEALING.with(|buf| {
        // The buffer keeps its length between records and frames (only `used` of it is this
        // write's), so that it is not zeroed again for each record.
        let mut buf = buf.borrow_mut();
        let mut used = 0;
        let mut record = [IoSlice::new(&[]); RECORD_PARTS];
        let (mut n, mut len) = (0, 0);
        for part in parts {
            let mut part: &[u8] = part;
            while !part.is_empty() {
                let take = part.len().min(RECORD - len);
                record[n] = IoSlice::new(&part[..take]);
                (n, len, part) = (n + 1, len + take, &part[take..]);
                if len == RECORD || n == RECORD_PARTS {
                    used = session.seal_record(&record[..n], &mut buf, used).map_err(exhausted)?;
                    (n, len) = (0, 0);
                    if used >= SEALED_WRITE {
                        send(stream, &mut [IoSlice::new(&buf[..used])], timeout)?;
                        used = 0;
                    }
                }
            }
        }
        if n > 0 {
            used = session.seal_record(&record[..n], &mut buf, used).map_err(exhausted)?;
        }
        if used > 0 {
            send(stream, &mut [IoSlice::new(&buf[..used])], timeout)?;
        }
        Ok(())
    })
}

thread_local! {
    /// Where this thread seals what it sends on secure connections.
    static SEALING: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The sealed records of a secure connection as they arrive: each is opened once it is whole, and
/// its bytes go on into the connection's frames, as a plain connection's bytes do.
pub(crate) struct Records {
    buf: Vec<u8>,
    /// Bytes read into `buf`.
    end: usize,
    /// The opened record's bytes not yet in the frames (`buf[from..to]`), and where the record
    /// ends in `buf`.
    from: usize,
    to: usize,
    used: usize,
}

/// Bytes of the record buffer: the largest sealed record with its prefix.
pub(crate) const RECORDS_BUFFER: usize =
    tiercel_proto::stream::PREFIX_LEN + tiercel_proto::seal::SEAL_OVERHEAD + RECORD;

impl Records {
    pub(crate) fn new() -> Records {
        Records { buf: vec![0; RECORDS_BUFFER], end: 0, from: 0, to: 0, used: 0 }
    }

    /// Whether bytes are here that the frames have not taken yet.
    pub(crate) fn holds(&self) -> bool {
        self.end > 0
    }

    /// Moves into `frames` what it has room for of the records arrived on
    /// `stream` (reading it as [`receive`] does), opening each with `session` once it is whole:
    /// `Ok(true)` if anything went into the frames, `Ok(false)` if nothing could. A record that
    /// does not open (changed, forged, replayed: `session` counts it) fails with `InvalidData`, and
    /// nothing after it on the stream is believed either: the connection is over.
    pub(crate) fn receive(
        &mut self,
        stream: &TcpStream,
        session: &crate::secure::Session,
        frames: &mut Deframer,
    ) -> std::io::Result<bool> {
        use tiercel_proto::seal::{OUTER_LEN, SEAL_OVERHEAD};
        use tiercel_proto::stream::PREFIX_LEN;
        let mut moved = false;
        loop {
            if self.from < self.to {
                let spare = frames.spare();
                let n = spare.len().min(self.to - self.from);
                if n == 0 {
                    return Ok(moved);
                }
                tiercel_proto::copy::copy(&mut spare[..n], &self.buf[self.from..self.from + n]);
                frames.filled(n);
                (self.from, moved) = (self.from + n, true);
                if self.from < self.to {
                    return Ok(moved);
                }
                // The record is all in the frames: what came after it moves up.
                self.buf.copy_within(self.used..self.end, 0);
                (self.end, self.from, self.to, self.used) = (self.end - self.used, 0, 0, 0);
            }
            if let Some(prefix) = self.buf.get(..PREFIX_LEN).filter(|_| self.end >= PREFIX_LEN) {
                let len = u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
                if !(SEAL_OVERHEAD + 1..=SEAL_OVERHEAD + RECORD).contains(&len) {
                    return Err(std::io::Error::new(ErrorKind::InvalidData, "a sealed record of no possible length"));
                }
                if self.end >= PREFIX_LEN + len {
                    let refused = |_| std::io::Error::new(ErrorKind::InvalidData, "a record did not open");
                    let sealed = PREFIX_LEN..PREFIX_LEN + len;
                    let spare = frames.spare();
                    if spare.len() >= len - SEAL_OVERHEAD {
                        // Room in the frames for all of it: opened straight into them.
                        let opened = session.open_into(&self.buf[sealed], spare).map_err(refused)?;
                        frames.filled(opened);
                        moved = true;
                        self.buf.copy_within(PREFIX_LEN + len..self.end, 0);
                        self.end -= PREFIX_LEN + len;
                        continue;
                    }
                    let opened = session.open_in_place(&mut self.buf[sealed]).map_err(refused)?;
                    self.from = PREFIX_LEN + OUTER_LEN;
                    (self.to, self.used) = (self.from + opened, PREFIX_LEN + len);
                    continue;
                }
            }
            if moved {
                // Bytes went into the frames: read on when they have been taken (a read that
                // finds nothing is a system call spent), as a plain connection's reader does.
                return Ok(true);
            }
            // Once a record's length is known, up to its end and the next one's prefix, not into
            // the next record: what is read past a record is moved up once it is taken. Before,
            // as much as there is, so that a small record takes one read.
            let want = match self.buf.get(..PREFIX_LEN).filter(|_| self.end >= PREFIX_LEN) {
                Some(p) => 2 * PREFIX_LEN + u32::from_le_bytes([p[0], p[1], p[2], p[3]]) as usize,
                None => self.buf.len(),
            };
            let upto = want.max(self.end + 1).min(self.buf.len());
            match tiercel_sys::tcp::read(stream, &mut self.buf[self.end..upto]) {
                Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
                Ok(n) => self.end += n,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => return Ok(moved),
                Err(e) => return Err(e),
            }
        }
    }
}

/// Reads what `stream` has into `frames`, without blocking: `Ok(true)` if something came,
/// `Ok(false)` if nothing was there, an error (`UnexpectedEof` when the peer closed) if the
/// connection is over.
pub(crate) fn receive(stream: &TcpStream, frames: &mut Deframer) -> std::io::Result<bool> {
    receive_up_to(stream, frames, usize::MAX).map(|got| got != Got::Nothing)
}

/// What a read of a connection got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Got {
    /// Nothing was there (or there was no room to read into).
    Nothing,
    /// Less than there was room for: the connection held no more at the time of the read, so a
    /// read straight after it would most likely find nothing.
    Drained,
    /// As much as there was room for: more may be there.
    Filled,
}

/// [`receive_up_to`] that blocks in the receive until bytes come or the stream's receive wait
/// passes (`tiercel_sys::tcp::set_receive_wait`; at once on a stream that does not block): then
/// [`Got::Nothing`]. A waiting reader's one system call, where `poll` and a read take two.
pub(crate) fn receive_wait(stream: &TcpStream, frames: &mut Deframer) -> std::io::Result<Got> {
    receive_with(frames, usize::MAX, |spare| tiercel_sys::tcp::read_wait(stream, spare))
}

/// [`receive`] of at most `most` bytes, telling whether the read drained the connection.
pub(crate) fn receive_up_to(stream: &TcpStream, frames: &mut Deframer, most: usize) -> std::io::Result<Got> {
    receive_with(frames, most, |spare| match tiercel_sys::tcp::read(stream, spare) {
        Ok(n) => Ok(Some(n)),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => Ok(None),
        Err(e) => Err(e),
    })
}

/// Reads with `read` into at most `most` bytes of the frames' spare room (`None` from it: nothing
/// came), and says what the read found.
fn receive_with(
    frames: &mut Deframer,
    most: usize,
    read: impl FnOnce(&mut [u8]) -> std::io::Result<Option<usize>>,
) -> std::io::Result<Got> {
    let spare = frames.spare();
    let room = most.min(spare.len());
    if room == 0 {
        // A whole frame is buffered and not yet taken: nothing to read for now.
        return Ok(Got::Nothing);
    }
    match read(&mut spare[..room])? {
        None => Ok(Got::Nothing),
        Some(0) => Err(ErrorKind::UnexpectedEof.into()),
        Some(n) => {
            frames.filled(n);
            Ok(if n < room { Got::Drained } else { Got::Filled })
        }
    }
}
