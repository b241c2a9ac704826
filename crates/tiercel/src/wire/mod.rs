//! Marshaling: the [`Wire`] trait, and the [`Writer`] and [`Reader`] that generated stubs use.
//!
//! The encoding is fixed-layout little-endian with no padding and no tags beyond what a type needs:
//! integers and floats in their native little-endian bytes, `bool` as one byte, variable-length values
//! as a `u32` length then their elements, `Option` and enums as a tag then the value. On the common
//! (little-endian) machine the bytes go through verbatim. Byte slices and strings are borrowed on both
//! sides: the client sends them straight from the caller's memory (a gather segment, no staging copy)
//! and the server decodes them as slices of the received packet.

mod impls;
#[cfg(feature = "serde")]
mod serde;
pub mod shape;

#[cfg(feature = "serde")]
pub use self::serde::Serde;

use std::io::IoSlice;

/// A value that can travel as an argument or a result.
///
/// `'de` is the lifetime of the received message: `&'de [u8]` and `&'de str` borrow from it.
/// Implemented for integers, floats, `bool`, `char`, `()`, fixed arrays, tuples, `&[u8]`, `&str`,
/// `Vec<T>`, `String`, `Option<T>`, `Result<T, E>`, `HashMap`, `BTreeMap`, `HashSet`, `BTreeSet`, and any
/// struct or enum with `#[derive(Wire)]`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot travel as an argument or result: it does not implement `tiercel::Wire`",
    label = "not `tiercel::Wire`",
    note = "derive it with `#[derive(tiercel::Wire)]`, or, for a type with serde's `Serialize` and \
            `Deserialize`, pass it as `tiercel::wire::Serde<T>` (crate feature `serde`)"
)]
pub trait Wire<'de>: Sized {
    /// Appends the encoding of `self`. Large byte slices may be recorded by reference, so the writer
    /// borrows `self` for `'a`.
    fn encode<'a>(&'a self, w: &mut Writer<'_, 'a>);

    /// Decodes a value, borrowing from the message where the type borrows.
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError>;

    /// Writes the shape of the type's encoding ([`shape`]): what client and server compare at bind,
    /// and what `tiercel call` reads values by. `#[derive(Wire)]` writes the fields and variants;
    /// a hand-written implementation is known only by its Rust name unless it writes its own.
    fn shape(s: &mut shape::Shape<'_>) {
        s.opaque::<Self>();
    }

    /// Encodes a slice of values; `u8` overrides this to send the bytes as they are.
    #[doc(hidden)]
    fn encode_slice<'a>(items: &'a [Self], w: &mut Writer<'_, 'a>) {
        for item in items {
            item.encode(w);
        }
    }

    /// Decodes a fixed array; `u8` overrides this with one copy.
    #[doc(hidden)]
    fn decode_array<const N: usize>(r: &mut Reader<'de>) -> Result<[Self; N], DecodeError> {
        let mut failed = None;
        let items: [Option<Self>; N] = core::array::from_fn(|_| {
            if failed.is_some() {
                return None;
            }
            Self::decode(r).map_err(|e| failed = Some(e)).ok()
        });
        if let Some(e) = failed {
            return Err(e);
        }
        // No element failed, so every option is `Some`.
        Ok(items.map(|v| v.unwrap_or_else(|| unreachable!("every element decoded"))))
    }

    /// Decodes `n` values into a vector; `u8` overrides this with one copy.
    #[doc(hidden)]
    fn decode_vec(r: &mut Reader<'de>, n: usize) -> Result<Vec<Self>, DecodeError> {
        // `n` is bounded by the bytes left, but an element may take far more memory than its
        // encoding (an enum's unit variant is one byte on the wire, the enum may be kilobytes).
        // Refuse a vector whose memory would exceed `MAX_EXPANSION` times the bytes left, and
        // reserve no more memory up front than the message holds.
        let size = core::mem::size_of::<Self>();
        if n.saturating_mul(size) > r.remaining().saturating_mul(MAX_EXPANSION).max(1 << 20) {
            return Err(DecodeError::BadLength(n as u64));
        }
        let mut v = Vec::with_capacity(n.min(r.remaining().max(4096) / size.max(1)));
        for _ in 0..n {
            v.push(Self::decode(r)?);
        }
        Ok(v)
    }
}

/// Why a message did not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The message ended before the value did.
    #[error("message truncated: needed {needed} more bytes, {available} left")]
    Truncated {
        /// Bytes the next field needs.
        needed: usize,
        /// Bytes left in the message.
        available: usize,
    },
    /// Bytes were left over after the last value.
    #[error("{0} unexpected bytes after the last value")]
    TrailingBytes(usize),
    /// A length prefix claims more elements than the message could hold.
    #[error("length {0} exceeds what the message holds")]
    BadLength(u64),
    /// A `bool`, `char`, `Option`, `Result` or enum tag with no meaning.
    #[error("invalid value for {0}")]
    Invalid(&'static str),
    /// A string that is not UTF-8.
    #[error("string is not UTF-8")]
    Utf8,
    /// Values nested deeper than [`MAX_DEPTH`] (boxes or vectors within each other).
    #[error("values nested deeper than {MAX_DEPTH}")]
    TooDeep,
    /// An `Out` or `InOut` buffer of another length than the caller's.
    #[error("buffer of {got} bytes where {expected} were expected")]
    BufferLength {
        /// The caller's buffer length.
        expected: usize,
        /// What arrived.
        got: usize,
    },
}

/// Segments shorter than this are copied into the scratch buffer rather than sent by reference: an
/// extra iovec costs more than copying a few bytes.
pub const GATHER_MIN: usize = 256;
/// Most segments one message is gathered from; beyond this, slices are copied.
pub const MAX_SEGMENTS: usize = 8;

/// A part of a message: 16 bytes (a range of the scratch buffer, whose messages are far below 4 GiB,
/// fits beside the slice's pointer), so that a call's segments are few cache lines to set up.
#[derive(Debug, Clone, Copy)]
enum Segment<'a> {
    Scratch { start: u32, end: u32 },
    Borrowed(&'a [u8]),
}

/// The segments of a message being marshaled: ranges of the scratch buffer and borrowed slices.
#[derive(Debug, Clone, Copy)]
pub struct Segments<'a> {
    segs: [Segment<'a>; MAX_SEGMENTS],
    len: usize,
    open_from: usize,
}

impl<'a> Default for Segments<'a> {
    fn default() -> Self {
        Segments { segs: [Segment::Scratch { start: 0, end: 0 }; MAX_SEGMENTS], len: 0, open_from: 0 }
    }
}

impl<'a> Segments<'a> {
    /// Starts a message whose scratch bytes begin at `scratch_start`.
    pub fn new(scratch_start: usize) -> Segments<'a> {
        Segments { open_from: scratch_start, ..Segments::default() }
    }

    fn close(&mut self, scratch_len: usize) {
        if scratch_len > self.open_from && self.len < MAX_SEGMENTS {
            // A message's scratch bytes are far fewer than 4 GiB: its limit is refused first.
            let (start, end) = (self.open_from as u32, scratch_len.min(u32::MAX as usize) as u32);
            self.segs[self.len] = Segment::Scratch { start, end };
            self.len += 1;
        }
        self.open_from = scratch_len;
    }

    /// Whether [`Segments::with_tail`] has room for a tail.
    pub fn takes_tail(&self) -> bool {
        self.len + 2 <= MAX_SEGMENTS
    }

    /// These segments, the scratch bytes marshaled so far (`scratch_len`) closed, followed by
    /// `tail`, borrowed: the message of a call whose last argument is a buffer lent mutably, sent
    /// from it and (its result) received into it. `None` without room ([`Segments::takes_tail`]).
    pub fn with_tail<'t>(&self, scratch_len: usize, tail: &'t [u8]) -> Option<Segments<'t>>
    where
        'a: 't,
    {
        if !self.takes_tail() {
            return None;
        }
        let mut s: Segments<'t> = *self;
        s.close(scratch_len);
        s.segs[s.len] = Segment::Borrowed(tail);
        s.len += 1;
        Some(s)
    }

    /// Total bytes in the message.
    pub fn message_len(&self, scratch: &[u8]) -> usize {
        if scratch.len() > u32::MAX as usize {
            // Longer than any message may be (and than a segment's range can say): refused by size.
            return usize::MAX;
        }
        let closed: usize = self.segs[..self.len]
            .iter()
            .map(|s| match *s {
                Segment::Scratch { start, end } => (end - start) as usize,
                Segment::Borrowed(b) => b.len(),
            })
            .sum();
        closed + scratch.len().saturating_sub(self.open_from)
    }

    /// The message's parts, in order.
    fn parts<'s>(&'s self, scratch: &'s [u8]) -> impl Iterator<Item = &'s [u8]> + 's
    where
        'a: 's,
    {
        let closed = self.segs[..self.len].iter().map(move |s| match *s {
            Segment::Scratch { start, end } => scratch.get(start as usize..end as usize).unwrap_or_default(),
            Segment::Borrowed(b) => b,
        });
        closed.chain(scratch.get(self.open_from..).filter(|rest| !rest.is_empty()))
    }

    /// Calls `f` with each of the message's non-empty parts, in order.
    #[inline]
    pub(crate) fn for_each_part(&self, scratch: &[u8], f: impl FnMut(&[u8])) {
        self.parts(scratch).for_each(f);
    }

    /// Fills `out` with the message's slices, in order, and returns how many it used.
    ///
    /// Never inlined: inlined into the UDP client's send loop, the compiler unrolled the walk over
    /// all eight segments and hoisted it out of the loop, so every call sent paid some 180
    /// instructions for segments it does not have (a Null call has none).
    #[inline(never)]
    pub fn io_slices<'s>(&'s self, scratch: &'s [u8], out: &mut [IoSlice<'s>]) -> usize
    where
        'a: 's,
    {
        let mut n = 0;
        for part in self.parts(scratch) {
            out[n] = IoSlice::new(part);
            n += 1;
        }
        n
    }

    /// Fills `out` with the slices of bytes `range` of the message (one fragment of a multi-packet
    /// message, sent straight from the caller's buffers) and returns how many it used.
    pub fn range_slices<'s>(
        &'s self,
        scratch: &'s [u8],
        range: core::ops::Range<usize>,
        out: &mut [IoSlice<'s>],
    ) -> usize
    where
        'a: 's,
    {
        let (mut n, mut at) = (0, 0);
        for part in self.parts(scratch) {
            let (start, end) = (at, at + part.len());
            at = end;
            if end <= range.start || n == out.len() {
                continue;
            }
            if start >= range.end {
                break;
            }
            let from = range.start.saturating_sub(start);
            let to = (range.end - start).min(part.len());
            out[n] = IoSlice::new(&part[from..to]);
            n += 1;
        }
        n
    }
}

/// Marshals values into a message: small values into a scratch buffer, large byte slices by reference.
#[derive(Debug)]
pub struct Writer<'s, 'a> {
    scratch: &'s mut Vec<u8>,
    segments: Option<&'s mut Segments<'a>>,
}

impl<'s, 'a> Writer<'s, 'a> {
    /// A writer that appends every byte to `buf` (used for results, which are saved anyway).
    pub fn copying(buf: &'s mut Vec<u8>) -> Writer<'s, 'a> {
        Writer { scratch: buf, segments: None }
    }

    /// A writer that appends small values to `scratch` and records large slices in `segments`.
    pub fn gathering(scratch: &'s mut Vec<u8>, segments: &'s mut Segments<'a>) -> Writer<'s, 'a> {
        Writer { scratch, segments: Some(segments) }
    }

    /// Appends bytes.
    #[inline]
    pub fn put(&mut self, bytes: &[u8]) {
        tiercel_proto::copy::extend(self.scratch, bytes);
    }

    /// Appends bytes that live at least as long as the message; large ones are sent by reference.
    #[inline]
    pub fn put_borrowed(&mut self, bytes: &'a [u8]) {
        match &mut self.segments {
            Some(segs) if bytes.len() >= GATHER_MIN && segs.len + 2 <= MAX_SEGMENTS => {
                segs.close(self.scratch.len());
                segs.segs[segs.len] = Segment::Borrowed(bytes);
                segs.len += 1;
            }
            _ => tiercel_proto::copy::extend(self.scratch, bytes),
        }
    }

    /// Appends a length prefix.
    #[inline]
    pub fn put_len(&mut self, len: usize) {
        // Lengths beyond u32 cannot be sent: the message limit is far below 4 GiB, and a message that
        // large is refused before it is sent.
        self.put(&(len.min(u32::MAX as usize) as u32).to_le_bytes());
    }

    /// Appends a value.
    #[inline]
    pub fn encode<'de, T: Wire<'de>>(&mut self, value: &'a T) {
        value.encode(self);
    }

    /// Appends a length prefix and then the bytes `fill` appends to the buffer it is given (the
    /// prefix is their count): for encodings written by other libraries, without a copy.
    pub fn put_with_len(&mut self, fill: impl FnOnce(&mut Vec<u8>)) {
        let at = self.scratch.len();
        self.put(&[0; 4]);
        fill(self.scratch);
        let len = (self.scratch.len() - at - 4).min(u32::MAX as usize) as u32;
        self.scratch[at..at + 4].copy_from_slice(&len.to_le_bytes());
    }

    /// Appends `len` zero bytes and returns them to be filled in place (an `Out` buffer).
    pub fn reserve(&mut self, len: usize) -> &mut [u8] {
        let start = self.scratch.len();
        self.scratch.resize(start + len, 0);
        &mut self.scratch[start..]
    }
}

/// A decoded vector may take at most this many times the bytes of the message left to decode (or
/// 1 MiB, whichever is more), so that a small hostile message cannot claim gigabytes.
pub const MAX_EXPANSION: usize = 32;

/// How deeply boxes and vectors may nest in a received value: a recursive type decoded from a
/// hostile message must not exhaust the stack.
pub const MAX_DEPTH: u32 = 128;

/// Unmarshals values from a received message, borrowing from it.
#[derive(Debug, Clone)]
pub struct Reader<'de> {
    buf: &'de [u8],
    depth: u32,
}

impl<'de> Reader<'de> {
    /// Reads from `buf`.
    pub fn new(buf: &'de [u8]) -> Reader<'de> {
        Reader { buf, depth: 0 }
    }

    /// Decodes with `f` one level deeper; fails past [`MAX_DEPTH`]. Used by `Box` and `Vec`, the
    /// types through which a value can contain itself.
    #[inline]
    pub fn nested<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T, DecodeError>) -> Result<T, DecodeError> {
        if self.depth >= MAX_DEPTH {
            return Err(DecodeError::TooDeep);
        }
        self.depth += 1;
        let v = f(self);
        self.depth -= 1;
        v
    }

    /// Bytes not yet read.
    #[inline]
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    /// Takes the next `n` bytes.
    #[inline]
    pub fn take(&mut self, n: usize) -> Result<&'de [u8], DecodeError> {
        if n > self.buf.len() {
            return Err(DecodeError::Truncated { needed: n, available: self.buf.len() });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    /// Takes the next `N` bytes as an array.
    #[inline]
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    /// Reads a length prefix and checks that `len * min_elem` bytes could follow.
    #[inline]
    pub fn len_prefix(&mut self, min_elem: usize) -> Result<usize, DecodeError> {
        let len = u32::from_le_bytes(self.array()?) as usize;
        if len.saturating_mul(min_elem.max(1)) > self.remaining() {
            return Err(DecodeError::BadLength(len as u64));
        }
        Ok(len)
    }

    /// Decodes a value.
    #[inline]
    pub fn decode<T: Wire<'de>>(&mut self) -> Result<T, DecodeError> {
        T::decode(self)
    }

    /// Reads an `Out`/`InOut` buffer's bytes into the caller's buffer, which must be the same length.
    pub fn read_into(&mut self, out: &mut [u8]) -> Result<(), DecodeError> {
        let bytes = self.take(out.len())?;
        tiercel_proto::copy::copy(out, bytes);
        Ok(())
    }

    /// Checks that every byte was read.
    pub fn finish(&self) -> Result<(), DecodeError> {
        match self.buf.len() {
            0 => Ok(()),
            n => Err(DecodeError::TrailingBytes(n)),
        }
    }
}

/// Encodes one value into a fresh vector (tests, tools; not the call path).
pub fn to_vec<'de, T: Wire<'de>>(value: &T) -> Vec<u8> {
    let mut v = Vec::new();
    value.encode(&mut Writer::copying(&mut v));
    v
}

/// Decodes one value that must fill `bytes` exactly.
pub fn from_slice<'de, T: Wire<'de>>(bytes: &'de [u8]) -> Result<T, DecodeError> {
    let mut r = Reader::new(bytes);
    let v = T::decode(&mut r)?;
    r.finish()?;
    Ok(v)
}

#[cfg(test)]
mod segment_tests {
    use super::*;

    #[test]
    fn a_tail_lent_after_marshaling_makes_the_message_borrowing_would() {
        let big: Vec<u8> = (0..GATHER_MIN + 7).map(|i| (i * 3) as u8).collect();
        let tail: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        let message = |segs: &Segments<'_>, scratch: &[u8]| {
            let mut out = [IoSlice::new(&[]); MAX_SEGMENTS + 1];
            let n = segs.io_slices(scratch, &mut out);
            out[..n].iter().flat_map(|s| s.iter().copied()).collect::<Vec<u8>>()
        };
        let (mut scratch, mut borrowed) = (Vec::new(), Segments::new(0));
        {
            let mut w = Writer::gathering(&mut scratch, &mut borrowed);
            w.put(&[1, 2, 3]);
            w.put_borrowed(&big);
            w.put_len(tail.len());
            w.put_borrowed(&tail);
        }
        let (mut scratch2, mut lent) = (Vec::new(), Segments::new(0));
        {
            let mut w = Writer::gathering(&mut scratch2, &mut lent);
            w.put(&[1, 2, 3]);
            w.put_borrowed(&big);
            w.put_len(tail.len());
        }
        let with = lent.with_tail(scratch2.len(), &tail).unwrap();
        assert_eq!(with.message_len(&scratch2), borrowed.message_len(&scratch));
        assert_eq!(message(&with, &scratch2), message(&borrowed, &scratch));
        // The fragments cut from it are the same too.
        let mut parts = [IoSlice::new(&[]); MAX_SEGMENTS];
        let n = with.range_slices(&scratch2, 250..1100, &mut parts);
        let cut: Vec<u8> = parts[..n].iter().flat_map(|s| s.iter().copied()).collect();
        assert_eq!(cut, message(&borrowed, &scratch)[250..1100]);
        // No room: segments already full of borrowed slices.
        let (mut scratch3, mut full) = (Vec::new(), Segments::new(0));
        {
            let mut w = Writer::gathering(&mut scratch3, &mut full);
            for _ in 0..MAX_SEGMENTS {
                w.put(&[9]);
                w.put_borrowed(&big);
            }
        }
        assert!(!full.takes_tail() && full.with_tail(scratch3.len(), &tail).is_none());
    }

    #[test]
    fn range_slices_cover_exactly_the_range() {
        let big: Vec<u8> = (0..GATHER_MIN + 100).map(|i| i as u8).collect();
        let mut scratch = Vec::new();
        let mut segs = Segments::new(0);
        {
            let mut w = Writer::gathering(&mut scratch, &mut segs);
            w.put(&[1, 2, 3, 4]);
            w.put_borrowed(&big);
            w.put(&[5, 6, 7, 8]);
        }
        let len = segs.message_len(&scratch);
        assert_eq!(len, big.len() + 8);
        let mut whole = [IoSlice::new(&[]); MAX_SEGMENTS + 1];
        let n = segs.io_slices(&scratch, &mut whole);
        assert!(n >= 3, "the large slice is borrowed, not copied");
        let flat: Vec<u8> = whole[..n].iter().flat_map(|s| s.iter().copied()).collect();
        assert_eq!(flat.len(), len);
        let big_end = 4 + big.len();
        for (start, end) in
            [(0, len), (0, 3), (2, 50), (4, big_end), (3, big_end + 1), (50, len), (len - 1, len), (10, 10)]
        {
            let mut out = [IoSlice::new(&[]); MAX_SEGMENTS + 1];
            let n = segs.range_slices(&scratch, start..end, &mut out);
            let got: Vec<u8> = out[..n].iter().flat_map(|s| s.iter().copied()).collect();
            assert_eq!(got, &flat[start..end], "{start}..{end}");
        }
    }
}
