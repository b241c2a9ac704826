//! Framing for byte-stream transports (TCP): each packet (the same header as over UDP, then the
//! whole message: a stream needs no fragments) goes as one frame, a 4-byte little-endian length of
//! the packet and the packet.
//!
//! ```text
//!  0      4                      4+56                  4+len
//!  ┌──────┬──────────────────────┬─────────────────────┐
//!  │ len  │ header (wire.rs)     │ payload: one message │   len = 56 + payload length
//!  └──────┴──────────────────────┴─────────────────────┘
//! ```
//!
//! [`Deframer`] holds what arrived of the stream and cuts it into frames, refusing a length beyond
//! its limit before anything is allocated for it; [`check_frame`] checks a frame's packet the way a
//! datagram is checked, and that it is whole (one fragment, payload equal to the message).

use crate::wire::{Packet, HEADER_LEN};

/// Bytes of a frame's length prefix.
pub const PREFIX_LEN: usize = 4;

/// Why a stream's bytes cannot be framed: the connection cannot be trusted further and is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// A frame shorter than a header.
    TooShort(usize),
    /// A frame longer than the limit.
    TooLong {
        /// Its length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// The packet in the frame failed validation, or is not whole.
    BadPacket,
}

impl core::fmt::Display for FrameError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            FrameError::TooShort(n) => write!(f, "a frame of {n} bytes is shorter than a header"),
            FrameError::TooLong { len, limit } => write!(f, "a frame of {len} bytes exceeds the limit of {limit}"),
            FrameError::BadPacket => f.write_str("a frame's packet is malformed or not whole"),
        }
    }
}

/// The prefix of a frame holding a packet of `len` bytes.
pub fn prefix(len: usize) -> [u8; PREFIX_LEN] {
    (len as u32).to_le_bytes()
}

/// The largest frame (packet) a peer may send when messages are at most `max_message` bytes.
pub fn max_frame(max_message: usize) -> usize {
    HEADER_LEN + max_message
}

/// Checks a frame's packet: a valid header, one fragment, payload equal to the message and to what
/// the frame holds.
pub fn check_frame(frame: &[u8]) -> Result<Packet<&[u8]>, FrameError> {
    let p = Packet::new_checked(frame).map_err(|_| FrameError::BadPacket)?;
    let whole = p.frag_index() == 0
        && p.frag_count() == 1
        && p.payload_len() == p.message_len()
        && HEADER_LEN + p.payload_len() as usize == frame.len();
    if whole {
        Ok(p)
    } else {
        Err(FrameError::BadPacket)
    }
}

/// What has arrived of a stream, cut into frames.
///
/// Bytes are read into [`Deframer::spare`] and counted with [`Deframer::filled`]; [`Deframer::next`]
/// says whether a whole frame is there. The buffer starts at the capacity given and grows to hold a
/// larger frame only when the caller asks ([`Deframer::grow_for`]), after it has decided the frame
/// may take that memory: nothing is allocated on the strength of a length alone.
#[derive(Debug)]
pub struct Deframer {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    limit: usize,
    base: usize,
    /// Bytes still to come of a frame being skipped: dropped as they arrive.
    skip: usize,
}

/// What the buffered bytes hold next.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Not even a whole length prefix.
    Nothing,
    /// A frame of this many bytes (prefix not counted), not all of it here yet.
    Partial(usize),
    /// A whole frame of this many bytes: [`Deframer::frame`] has it.
    Frame(usize),
}

impl Deframer {
    /// A deframer with `capacity` bytes of buffer, refusing frames longer than `limit`.
    pub fn new(capacity: usize, limit: usize) -> Deframer {
        let capacity = capacity.max(PREFIX_LEN + HEADER_LEN);
        Deframer { buf: vec![0; capacity], start: 0, end: 0, limit, base: capacity, skip: 0 }
    }

    /// What comes next in the buffered bytes.
    pub fn next(&self) -> Result<Next, FrameError> {
        let have = &self.buf[self.start..self.end];
        let Some(prefix) = have.get(..PREFIX_LEN) else { return Ok(Next::Nothing) };
        let len = u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
        if len < HEADER_LEN {
            return Err(FrameError::TooShort(len));
        }
        if len > self.limit {
            return Err(FrameError::TooLong { len, limit: self.limit });
        }
        Ok(if have.len() >= PREFIX_LEN + len { Next::Frame(len) } else { Next::Partial(len) })
    }

    /// The whole frame [`Deframer::next`] found (its packet, without the prefix); empty if none.
    pub fn frame(&self) -> &[u8] {
        match self.next() {
            Ok(Next::Frame(len)) => &self.buf[self.start + PREFIX_LEN..self.start + PREFIX_LEN + len],
            _ => &[],
        }
    }

    /// Whether another whole frame is buffered behind the whole frame [`Deframer::next`] found: the
    /// peer sent several before they were read. (A frame behind it that is malformed is not one.)
    pub fn whole_behind(&self) -> bool {
        let Ok(Next::Frame(len)) = self.next() else { return false };
        let behind = &self.buf[self.start + PREFIX_LEN + len..self.end];
        let Some(prefix) = behind.get(..PREFIX_LEN) else { return false };
        let next = u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
        (HEADER_LEN..=self.limit).contains(&next) && behind.len() >= PREFIX_LEN + next
    }

    /// Drops the whole frame [`Deframer::next`] found.
    pub fn consume(&mut self) {
        if let Ok(Next::Frame(len)) = self.next() {
            self.start += PREFIX_LEN + len;
            if self.start == self.end {
                (self.start, self.end) = (0, 0);
            }
        }
    }

    /// The length of the whole frame [`Deframer::next`] found when it is all the buffer holds, from
    /// its first byte: then the buffer can be worked on or taken where the frame landed.
    fn alone(&self) -> Option<usize> {
        match self.next() {
            Ok(Next::Frame(len)) if self.start == 0 && self.end == PREFIX_LEN + len => Some(PREFIX_LEN + len),
            _ => None,
        }
    }

    /// Hands the buffer to `f` when the whole frame [`Deframer::next`] found is all it holds, from its
    /// first byte, then drops the frame: the buffer (a `Vec` exactly as long as the frame, its prefix
    /// then its packet) may be changed and appended to, so that a large frame is worked on where it
    /// landed rather than copied out. `None`, with `f` not called and the frame still there,
    /// otherwise.
    pub fn consume_in_place<R>(&mut self, f: impl FnOnce(&mut Vec<u8>) -> R) -> Option<R> {
        let len = self.alone()?;
        self.buf.truncate(len);
        let r = f(&mut self.buf);
        (self.start, self.end) = (0, 0);
        if self.buf.len() < self.base {
            self.buf.resize(self.base, 0);
        }
        Some(r)
    }

    /// Takes the buffer when the whole frame [`Deframer::next`] found is all it holds, from its first
    /// byte: returns it, exactly as long as the frame (prefix, then packet), and goes on with `spare`
    /// as its buffer (its bytes need not be zero; it is lengthened to the starting capacity if
    /// shorter). So a large frame is handed on without a copy, and two buffers can take turns.
    /// `Err(spare)`, the frame still there, otherwise.
    pub fn take_frame(&mut self, mut spare: Vec<u8>) -> Result<Vec<u8>, Vec<u8>> {
        let Some(len) = self.alone() else { return Err(spare) };
        if spare.len() < self.base {
            spare.resize(self.base, 0);
        }
        // Never more than the limit allows.
        spare.truncate(self.base.max(PREFIX_LEN + self.limit));
        let mut frame = core::mem::replace(&mut self.buf, spare);
        frame.truncate(len);
        (self.start, self.end) = (0, 0);
        Ok(frame)
    }

    /// Whether the buffer can hold a frame of `len` bytes (prefix not counted) whole.
    pub fn fits(&self, len: usize) -> bool {
        PREFIX_LEN + len <= self.buf.len()
    }

    /// Grows the buffer to hold a frame of `len` bytes whole (at most the limit). The caller has
    /// accounted for the memory.
    pub fn grow_for(&mut self, len: usize) {
        let want = PREFIX_LEN + len.min(self.limit);
        if want > self.buf.len() {
            self.compact();
            self.buf.resize(want, 0);
        }
    }

    /// Whether the partial frame [`Deframer::next`] found (of `len` bytes) has filled the buffer,
    /// so that no more of it can be read until the buffer grows ([`Deframer::grow_toward`]).
    pub fn needs_room(&self, len: usize) -> bool {
        !self.fits(len) && self.buffered() == self.buf.len()
    }

    /// The length the buffer grows to next for a frame of `len` bytes: twice what it is, at most
    /// the frame (and the limit). Growing by what has arrived, a peer that announces a large frame
    /// and sends little of it is given little.
    pub fn next_size(&self, len: usize) -> usize {
        (PREFIX_LEN + len.min(self.limit)).min(self.buf.len().saturating_mul(2)).max(self.buf.len())
    }

    /// Grows the buffer to `to` bytes ([`Deframer::next_size`]) for a frame of `len` bytes. At the
    /// first step it sets aside room for the whole frame (address space, not memory: its pages are
    /// touched as the buffer grows into them), so that growing never copies what arrived. The
    /// caller has accounted for `to` bytes.
    pub fn grow_toward(&mut self, len: usize, to: usize) {
        let whole = PREFIX_LEN + len.min(self.limit);
        let to = to.min(whole);
        if to > self.buf.len() {
            self.compact();
            self.buf.reserve_exact(whole - self.buf.len());
            self.buf.resize(to, 0);
        }
    }

    /// Bytes the buffer holds beyond its starting capacity (grown for large frames).
    pub fn grown(&self) -> usize {
        self.buf.len() - self.base
    }

    /// Gives back what the buffer grew for large frames, if nothing beyond its starting capacity is
    /// buffered. Returns the bytes given back.
    pub fn shrink(&mut self) -> usize {
        let grown = self.grown();
        if grown == 0 || self.end - self.start > self.base {
            return 0;
        }
        self.compact();
        self.buf.truncate(self.base);
        self.buf.shrink_to_fit();
        grown
    }

    /// Where to read more bytes into (compacting first when the free space is at the end).
    pub fn spare(&mut self) -> &mut [u8] {
        if self.end == self.buf.len() && self.start > 0 {
            self.compact();
        }
        &mut self.buf[self.end..]
    }

    /// Counts `n` bytes read into [`Deframer::spare`].
    pub fn filled(&mut self, n: usize) {
        let n = n.min(self.buf.len() - self.end);
        let dropped = n.min(self.skip);
        if dropped > 0 {
            self.buf.copy_within(self.end + dropped..self.end + n, self.end);
            self.skip -= dropped;
        }
        self.end += n - dropped;
    }

    /// Counts `n` bytes of the frame being received as arrived although they were read elsewhere
    /// (straight into the buffer of the caller they are for): the frame keeps its length, and its
    /// bytes at their place here are whatever the buffer held there. At most [`Deframer::spare`]'s
    /// length.
    pub fn filled_elsewhere(&mut self, n: usize) {
        let n = n.min(self.buf.len() - self.end);
        let dropped = n.min(self.skip);
        self.skip -= dropped;
        self.end += n - dropped;
    }

    /// The bytes buffered, from the prefix of the frame [`Deframer::next`] finds on.
    pub fn front(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Drops the frame [`Deframer::next`] found partial (one the reader will not take): what is
    /// buffered of it now, and the rest as it arrives. Its header, if buffered, is read first.
    pub fn skip_frame(&mut self) {
        if let Ok(Next::Partial(len)) = self.next() {
            self.skip = PREFIX_LEN + len - self.buffered();
            (self.start, self.end) = (0, 0);
        }
    }

    /// The header of the frame [`Deframer::next`] found (whole or partial), if it is buffered.
    pub fn header(&self) -> Option<&[u8]> {
        self.buf
            .get(self.start + PREFIX_LEN..self.start + PREFIX_LEN + HEADER_LEN)
            .filter(|_| self.buffered() >= PREFIX_LEN + HEADER_LEN)
    }

    /// Bytes buffered.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    fn compact(&mut self) {
        self.buf.copy_within(self.start..self.end, 0);
        self.end -= self.start;
        self.start = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Header, Kind};

    fn packet(payload: &[u8]) -> Vec<u8> {
        let h =
            Header { payload_len: payload.len() as u32, message_len: payload.len() as u32, ..Header::new(Kind::Call) };
        let mut p = h.to_bytes().to_vec();
        p.extend_from_slice(payload);
        p
    }

    #[test]
    fn a_whole_frame_behind_the_next_is_seen_only_when_all_of_it_is_buffered() {
        let frame = |payload: &[u8]| {
            let p = packet(payload);
            [&prefix(p.len())[..], &p].concat()
        };
        let (a, b) = (frame(b"first"), frame(b"second"));
        let mut d = Deframer::new(1024, 1024);
        let put = |d: &mut Deframer, bytes: &[u8]| {
            d.spare()[..bytes.len()].copy_from_slice(bytes);
            d.filled(bytes.len());
        };
        put(&mut d, &a[..a.len() - 1]);
        assert!(!d.whole_behind(), "the first frame is not whole");
        put(&mut d, &a[a.len() - 1..]);
        assert!(!d.whole_behind(), "nothing behind it");
        put(&mut d, &b[..PREFIX_LEN + 3]);
        assert!(!d.whole_behind(), "only part of the second is here");
        put(&mut d, &b[PREFIX_LEN + 3..]);
        assert!(d.whole_behind());
        d.consume();
        assert!(!d.whole_behind(), "the second is the last");
        d.consume();
        put(&mut d, &a);
        put(&mut d, &prefix(HEADER_LEN - 1));
        assert!(!d.whole_behind(), "a malformed prefix behind is not a frame");
    }

    fn feed(d: &mut Deframer, mut bytes: &[u8], chunk: usize) -> Vec<Vec<u8>> {
        let mut frames = Vec::new();
        while !bytes.is_empty() || d.next() == Ok(Next::Frame(d.frame().len())) {
            while let Ok(Next::Frame(_)) = d.next() {
                frames.push(d.frame().to_vec());
                d.consume();
            }
            if let Ok(Next::Partial(len)) = d.next() {
                if !d.fits(len) {
                    d.grow_for(len);
                }
            }
            if bytes.is_empty() {
                break;
            }
            let spare = d.spare();
            let n = spare.len().min(chunk).min(bytes.len());
            spare[..n].copy_from_slice(&bytes[..n]);
            d.filled(n);
            bytes = &bytes[n..];
        }
        while let Ok(Next::Frame(_)) = d.next() {
            frames.push(d.frame().to_vec());
            d.consume();
        }
        frames
    }

    #[test]
    fn a_large_frame_is_given_room_as_its_bytes_arrive() {
        let big = packet(&vec![7u8; 100_000]);
        let mut stream = prefix(big.len()).to_vec();
        stream.extend_from_slice(&big);
        let mut d = Deframer::new(1024, 1 << 20);
        let mut fed = 0;
        let mut most = 0;
        while fed < stream.len() {
            if let Ok(Next::Partial(len)) = d.next() {
                if d.needs_room(len) {
                    let to = d.next_size(len);
                    assert!(to <= 2 * d.buffered().max(1024), "room for {to} bytes with {} here", d.buffered());
                    d.grow_toward(len, to);
                }
            }
            let spare = d.spare();
            let n = spare.len().min(stream.len() - fed).min(3000);
            spare[..n].copy_from_slice(&stream[fed..fed + n]);
            d.filled(n);
            fed += n;
            most = most.max(d.grown() + 1024);
            assert!(most <= 2 * fed.max(1024), "{most} bytes of buffer for {fed} bytes arrived");
        }
        assert_eq!(d.next(), Ok(Next::Frame(big.len())));
        assert_eq!(d.frame(), &big[..]);
    }

    #[test]
    fn frames_come_out_whole_whatever_the_reads() {
        let sent: Vec<Vec<u8>> = (0..20).map(|i| packet(&vec![i as u8; i * 37])).collect();
        let mut stream = Vec::new();
        for p in &sent {
            stream.extend_from_slice(&prefix(p.len()));
            stream.extend_from_slice(p);
        }
        for chunk in [1, 3, 64, 100, 4096] {
            let mut d = Deframer::new(128, 4096);
            let got = feed(&mut d, &stream, chunk);
            assert_eq!(got, sent, "reads of {chunk} bytes");
            assert!(got.iter().all(|f| check_frame(f).is_ok()));
        }
    }

    #[test]
    fn a_length_beyond_the_limit_is_refused_before_any_allocation() {
        let mut d = Deframer::new(128, 1000);
        d.spare()[..4].copy_from_slice(&prefix(1_000_000));
        d.filled(4);
        assert_eq!(d.next(), Err(FrameError::TooLong { len: 1_000_000, limit: 1000 }));
        assert_eq!(d.grown(), 0);
        let mut d = Deframer::new(128, 1000);
        d.spare()[..4].copy_from_slice(&prefix(10));
        d.filled(4);
        assert_eq!(d.next(), Err(FrameError::TooShort(10)));
    }

    #[test]
    fn grown_buffers_are_given_back() {
        let mut d = Deframer::new(128, 10_000);
        let p = packet(&[7; 5000]);
        let mut stream = prefix(p.len()).to_vec();
        stream.extend_from_slice(&p);
        let got = feed(&mut d, &stream, 700);
        assert_eq!(got, vec![p]);
        assert!(d.grown() > 0);
        assert_eq!(d.shrink(), PREFIX_LEN + 5000 + HEADER_LEN - 128);
        assert_eq!(d.grown(), 0);
    }

    /// Reads `bytes` into `d` as far as its spare room goes; returns what is left.
    fn fill<'b>(d: &mut Deframer, bytes: &'b [u8]) -> &'b [u8] {
        let spare = d.spare();
        let n = spare.len().min(bytes.len());
        spare[..n].copy_from_slice(&bytes[..n]);
        d.filled(n);
        &bytes[n..]
    }

    /// Reads all of `bytes` into `d`, growing it for the frames that need it.
    fn fill_growing(d: &mut Deframer, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if let Ok(Next::Partial(len)) = d.next() {
                if !d.fits(len) {
                    d.grow_for(len);
                }
            }
            bytes = fill(d, bytes);
        }
    }

    fn framed(p: &[u8]) -> Vec<u8> {
        let mut f = prefix(p.len()).to_vec();
        f.extend_from_slice(p);
        f
    }

    #[test]
    fn a_large_frame_alone_in_the_buffer_is_worked_on_where_it_landed() {
        let big = packet(&[5; 3000]);
        let mut d = Deframer::new(128, 10_000);
        fill_growing(&mut d, &framed(&big));
        let landed = d.frame().as_ptr();
        let got = d.consume_in_place(|buf| {
            assert_eq!(buf[PREFIX_LEN..], big[..], "the buffer is the frame, prefix first, and no more");
            assert_eq!(buf[PREFIX_LEN..].as_ptr(), landed, "where it landed");
            buf[PREFIX_LEN + HEADER_LEN] = 6;
            buf.extend_from_slice(&[1, 2, 3]);
            buf.len()
        });
        assert_eq!(got, Some(PREFIX_LEN + big.len() + 3));
        assert_eq!(d.next(), Ok(Next::Nothing), "the frame is gone");
        // The next frames come out as usual.
        let small = packet(&[8; 10]);
        assert_eq!(feed(&mut d, &framed(&small), 7), vec![small]);
    }

    #[test]
    fn a_frame_not_alone_in_the_buffer_stays_there() {
        let (a, b) = (packet(&[1; 20]), packet(&[2; 30]));
        let mut d = Deframer::new(512, 10_000);
        let mut both = framed(&a);
        both.extend_from_slice(&framed(&b));
        assert!(fill(&mut d, &both).is_empty());
        // Another frame behind it.
        assert_eq!(d.consume_in_place(|_| unreachable!()), None);
        let spare = d.take_frame(vec![0; 40]).unwrap_err();
        assert_eq!(spare.len(), 40, "the spare comes back as it was");
        assert_eq!(d.frame(), &a[..]);
        d.consume();
        // The last frame, but not from the buffer's first byte.
        assert_eq!(d.consume_in_place(|_| unreachable!()), None);
        assert!(d.take_frame(Vec::new()).is_err());
        assert_eq!(d.frame(), &b[..]);
        d.consume();
        // Part of a frame.
        let rest = &framed(&a)[..10];
        assert!(fill(&mut d, rest).is_empty());
        assert_eq!(d.consume_in_place(|_| unreachable!()), None);
        assert!(d.take_frame(Vec::new()).is_err());
        assert_eq!(d.next(), Ok(Next::Partial(a.len())));
    }

    #[test]
    fn a_frame_taken_leaves_the_spare_buffer_in_its_place_and_two_take_turns() {
        let mut d = Deframer::new(128, 10_000);
        let mut spare = Vec::new();
        for round in 0..4u8 {
            let p = packet(&vec![round; 2000 + round as usize]);
            fill_growing(&mut d, &framed(&p));
            let frame = d.take_frame(spare).unwrap();
            assert_eq!(frame[PREFIX_LEN..], p[..]);
            assert_eq!(d.next(), Ok(Next::Nothing));
            assert!(d.spare().len() >= 128, "a short spare is lengthened to the starting capacity");
            spare = frame;
        }
        let small = packet(&[3; 5]);
        assert_eq!(feed(&mut d, &framed(&small), 64), vec![small]);
    }

    #[test]
    fn bytes_read_elsewhere_count_toward_their_frame() {
        let (big, next) = (packet(&[4; 3000]), packet(&[6; 10]));
        let mut stream = framed(&big);
        stream.extend_from_slice(&framed(&next));
        let mut d = Deframer::new(128, 10_000);
        let mut rest = fill(&mut d, &stream);
        let Ok(Next::Partial(len)) = d.next() else { panic!("a partial frame") };
        d.grow_for(len);
        assert_eq!(d.front(), &stream[..128], "what was read so far, prefix first");
        // The next 2000 bytes go to a buffer of the reader's own.
        let mut own = vec![0u8; 2000];
        let n = own.len().min(d.spare().len());
        own[..n].copy_from_slice(&rest[..n]);
        d.filled_elsewhere(n);
        rest = &rest[n..];
        assert_eq!(d.buffered(), 128 + 2000);
        while !rest.is_empty() {
            rest = fill(&mut d, rest);
            while let Ok(Next::Frame(_)) = d.next() {
                let frame = d.frame().to_vec();
                if frame.len() == big.len() {
                    // Whole, as long as it was: the bytes read elsewhere are where they were, not here.
                    assert_eq!(frame[..128 - PREFIX_LEN], big[..128 - PREFIX_LEN]);
                    assert_eq!(frame[128 - PREFIX_LEN + 2000..], big[128 - PREFIX_LEN + 2000..]);
                    assert_eq!(own[..], big[128 - PREFIX_LEN..128 - PREFIX_LEN + 2000]);
                } else {
                    assert_eq!(frame, next);
                }
                d.consume();
            }
        }
        assert_eq!(d.next(), Ok(Next::Nothing));
    }

    #[test]
    fn a_skipped_frame_is_dropped_as_it_arrives() {
        let big = packet(&[9; 3000]);
        let small = packet(&[1, 2]);
        let mut stream = prefix(big.len()).to_vec();
        stream.extend_from_slice(&big);
        stream.extend_from_slice(&prefix(small.len()));
        stream.extend_from_slice(&small);
        let mut d = Deframer::new(256, 10_000);
        let mut rest = &stream[..];
        let n = d.spare().len();
        d.spare().copy_from_slice(&rest[..n]);
        d.filled(n);
        rest = &rest[n..];
        assert_eq!(d.next(), Ok(Next::Partial(big.len())));
        assert_eq!(d.header(), Some(&big[..HEADER_LEN]));
        d.skip_frame();
        let mut frames = Vec::new();
        while !rest.is_empty() {
            let spare = d.spare();
            let n = spare.len().min(100).min(rest.len());
            spare[..n].copy_from_slice(&rest[..n]);
            d.filled(n);
            rest = &rest[n..];
            while let Ok(Next::Frame(_)) = d.next() {
                frames.push(d.frame().to_vec());
                d.consume();
            }
        }
        assert_eq!(frames, vec![small]);
        assert_eq!(d.grown(), 0);
    }

    #[test]
    fn a_frame_must_hold_one_whole_packet() {
        let p = packet(&[1, 2, 3]);
        assert!(check_frame(&p).is_ok());
        assert_eq!(check_frame(&p[..p.len() - 1]).err(), Some(FrameError::BadPacket));
        let mut fragment = p.clone();
        Packet::new_unchecked(&mut fragment[..]).set_fragment(0, 2);
        assert_eq!(check_frame(&fragment).err(), Some(FrameError::BadPacket));
        let mut garbage = p;
        garbage[0] ^= 0xff;
        assert_eq!(check_frame(&garbage).err(), Some(FrameError::BadPacket));
    }
}
