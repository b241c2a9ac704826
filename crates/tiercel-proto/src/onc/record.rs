//! Record marking (RFC 5531 §11): over a byte stream, each message is a record of one or more
//! fragments, each behind a 4-byte mark: the top bit says "last fragment", the other 31 bits the
//! fragment's length.

/// The mark's bit of a record's last fragment.
pub const LAST_FRAGMENT: u32 = 0x8000_0000;
/// Most bytes of one fragment.
pub const MAX_FRAGMENT: usize = 0x7fff_ffff;

/// The mark of a fragment of `len` bytes (at most [`MAX_FRAGMENT`]), the record's last when `last`.
pub fn record_mark(len: usize, last: bool) -> [u8; 4] {
    let len = len.min(MAX_FRAGMENT) as u32;
    (len | if last { LAST_FRAGMENT } else { 0 }).to_be_bytes()
}

/// Why a stream of records cannot be read on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordError {
    /// A record longer than the reader's bound: the stream is abandoned (its end cannot be found
    /// without reading what it claims).
    TooLarge,
}

/// Puts records together from a byte stream fed to it in pieces of any size. The record grows
/// only as its bytes arrive, never by what a mark claims, up to the bound given; its buffer is kept
/// from one record to the next.
#[derive(Debug)]
pub struct RecordReader {
    max: usize,
    record: Vec<u8>,
    mark: [u8; 4],
    mark_have: usize,
    /// Bytes of the current fragment still to come.
    left: usize,
    last: bool,
    done: bool,
}

impl RecordReader {
    /// A reader of records of at most `max` bytes.
    pub fn new(max: usize) -> RecordReader {
        RecordReader { max, record: Vec::new(), mark: [0; 4], mark_have: 0, left: 0, last: false, done: false }
    }

    /// Reads from `input` until a record is whole or `input` is used up: how many bytes it took,
    /// and whether a record is now whole ([`RecordReader::record`]). Feed the rest of `input`
    /// after taking the record.
    pub fn feed(&mut self, input: &[u8]) -> Result<(usize, bool), RecordError> {
        if self.done {
            self.record.clear();
            self.done = false;
        }
        let mut at = 0;
        while at < input.len() {
            if self.left == 0 && self.mark_have < 4 {
                let take = (4 - self.mark_have).min(input.len() - at);
                self.mark[self.mark_have..self.mark_have + take].copy_from_slice(&input[at..at + take]);
                self.mark_have += take;
                at += take;
                if self.mark_have < 4 {
                    break;
                }
                let word = u32::from_be_bytes(self.mark);
                self.left = (word & !LAST_FRAGMENT) as usize;
                self.last = word & LAST_FRAGMENT != 0;
                if self.record.len().saturating_add(self.left) > self.max {
                    return Err(RecordError::TooLarge);
                }
            }
            let take = self.left.min(input.len() - at);
            crate::copy::extend(&mut self.record, &input[at..at + take]);
            self.left -= take;
            at += take;
            if self.left == 0 {
                self.mark_have = 0;
                if self.last {
                    self.done = true;
                    return Ok((at, true));
                }
            }
        }
        Ok((at, false))
    }

    /// The record made whole by the last [`RecordReader::feed`] that said so.
    pub fn record(&self) -> &[u8] {
        &self.record
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marked(fragments: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, f) in fragments.iter().enumerate() {
            out.extend_from_slice(&record_mark(f.len(), i + 1 == fragments.len()));
            out.extend_from_slice(f);
        }
        out
    }

    #[test]
    fn records_of_several_fragments_come_whole_however_the_stream_is_cut() {
        let mut stream = marked(&[b"abc", b"", b"defgh"]);
        stream.extend(marked(&[b"ij"]));
        for piece in 1..=stream.len() {
            let mut reader = RecordReader::new(64);
            let mut got = Vec::new();
            for chunk in stream.chunks(piece) {
                let mut rest = chunk;
                while !rest.is_empty() {
                    let (used, whole) = reader.feed(rest).unwrap();
                    rest = &rest[used..];
                    if whole {
                        got.push(reader.record().to_vec());
                    }
                }
            }
            assert_eq!(got, vec![b"abcdefgh".to_vec(), b"ij".to_vec()], "in pieces of {piece}");
        }
    }

    #[test]
    fn a_mark_claiming_more_than_the_bound_ends_the_stream_before_anything_is_kept() {
        let mut reader = RecordReader::new(100);
        assert_eq!(reader.feed(&record_mark(101, true)), Err(RecordError::TooLarge));
        let mut reader = RecordReader::new(100);
        let mut stream = marked(&[&[1; 60], &[2; 60]]);
        stream.truncate(70);
        assert_eq!(reader.feed(&stream), Err(RecordError::TooLarge), "the bound is on the whole record");
        let mut reader = RecordReader::new(100);
        assert_eq!(reader.feed(&(0x7fff_ffffu32).to_be_bytes()), Err(RecordError::TooLarge));
        assert!(reader.record.capacity() < 100, "nothing was reserved for what the mark claimed");
    }
}
