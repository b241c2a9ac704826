//! The envelope of a secure binding's packets, without the cryptography: the outer header every
//! sealed datagram (or frame) starts with, and the replay window that drops old and repeated
//! packets before anything is opened further. The `tiercel` crate seals and opens (an AEAD whose
//! keys come from a Noise handshake); this module decides what a sealed packet says and whether
//! one may be taken.
//!
//! ```text
//!  0      2     3      4              8                              16
//!  +------+-----+------+--------------+------------------------------+
//!  | "tS" | ver | type | index (u32)  |       counter (u64)          |  then the sealed bytes
//!  +------+-----+------+--------------+------------------------------+
//! ```
//!
//! * `Data`: `index` is the binding id (the receiver's key), `counter` the sender's packet number
//!   in this direction, which is the AEAD nonce. The sealed bytes are a whole tiercel packet
//!   (header and payload) encrypted, then its 16-byte tag; the outer header is the associated data.
//! * `Hello` (client to server): `index` names the cipher suite; the sealed bytes are the first
//!   message of the Noise handshake, whose payload is a `Bind` request.
//! * `Welcome` (server to client): the second handshake message, whose payload is the answer.
//!
//! A plain tiercel packet starts with `"tc"`, so one look tells the two apart.

use core::fmt;

/// Length of the outer header.
pub const OUTER_LEN: usize = 16;
/// Length of an AEAD tag.
pub const TAG_LEN: usize = 16;
/// What sealing adds to a packet: the outer header and the tag.
pub const SEAL_OVERHEAD: usize = OUTER_LEN + TAG_LEN;
/// First two bytes of a sealed packet.
pub const SEALED_MAGIC: [u8; 2] = *b"tS";
/// Version of the envelope.
pub const SEAL_VERSION: u8 = 1;
/// Packets sealed with one key before the next is derived from it (Noise's `REKEY`): 2^20, far
/// below the limits of either cipher (AES-GCM's is the lower: about 2^23 packets of 64 KiB).
pub const EPOCH_PACKETS: u64 = 1 << 20;
/// The last counter a sender uses: a binding that reaches it seals nothing more (at a million
/// packets a second that is half a million years away).
pub const LAST_COUNTER: u64 = u64::MAX - 1;

/// What a sealed packet is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum SealType {
    /// A packet of a secure binding.
    Data = 1,
    /// The first handshake message, carrying a bind request.
    Hello = 2,
    /// The second handshake message, carrying the answer.
    Welcome = 3,
}

/// The outer header of a sealed packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outer {
    /// What the packet is.
    pub kind: SealType,
    /// The binding id (`Data`), or the cipher suite (`Hello`).
    pub index: u32,
    /// The packet number in its direction (`Data`).
    pub counter: u64,
}

/// Why bytes are not a sealed packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotSealed {
    /// Shorter than an outer header and a tag.
    Short,
    /// Not `"tS"`: a plain packet, or noise.
    Magic,
    /// Another version of the envelope.
    Version(u8),
    /// An unknown type byte.
    Type(u8),
}

impl fmt::Display for NotSealed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotSealed::Short => write!(f, "shorter than a sealed packet"),
            NotSealed::Magic => write!(f, "not a sealed packet"),
            NotSealed::Version(v) => write!(f, "sealed with envelope version {v}, not {SEAL_VERSION}"),
            NotSealed::Type(t) => write!(f, "unknown sealed packet type {t}"),
        }
    }
}

/// Whether `bytes` start as a sealed packet does (the magic alone).
pub fn is_sealed(bytes: &[u8]) -> bool {
    bytes.get(..2) == Some(&SEALED_MAGIC[..])
}

impl Outer {
    /// The outer header of `bytes`, which must hold at least the header and a tag.
    pub fn parse(bytes: &[u8]) -> Result<Outer, NotSealed> {
        if !is_sealed(bytes) {
            return Err(NotSealed::Magic);
        }
        if bytes.len() < SEAL_OVERHEAD {
            return Err(NotSealed::Short);
        }
        let mut header = [0u8; OUTER_LEN];
        header.copy_from_slice(&bytes[..OUTER_LEN]);
        Outer::from_header(&header)
    }

    /// The outer header in `bytes` alone (a packet received in parts, its tag apart).
    pub fn from_header(bytes: &[u8; OUTER_LEN]) -> Result<Outer, NotSealed> {
        if !is_sealed(bytes) {
            return Err(NotSealed::Magic);
        }
        if bytes[2] != SEAL_VERSION {
            return Err(NotSealed::Version(bytes[2]));
        }
        let kind = match bytes[3] {
            1 => SealType::Data,
            2 => SealType::Hello,
            3 => SealType::Welcome,
            t => return Err(NotSealed::Type(t)),
        };
        let mut index = [0u8; 4];
        index.copy_from_slice(&bytes[4..8]);
        let mut counter = [0u8; 8];
        counter.copy_from_slice(&bytes[8..16]);
        Ok(Outer { kind, index: u32::from_le_bytes(index), counter: u64::from_le_bytes(counter) })
    }

    /// The header's bytes.
    pub fn to_bytes(&self) -> [u8; OUTER_LEN] {
        let mut b = [0u8; OUTER_LEN];
        b[..2].copy_from_slice(&SEALED_MAGIC);
        b[2] = SEAL_VERSION;
        b[3] = self.kind as u8;
        b[4..8].copy_from_slice(&self.index.to_le_bytes());
        b[8..16].copy_from_slice(&self.counter.to_le_bytes());
        b
    }
}

/// The key epoch a counter falls in.
pub fn epoch(counter: u64) -> u64 {
    counter / EPOCH_PACKETS
}

/// Counters a receiver remembers behind the highest it has taken.
pub const WINDOW: u64 = 4096;
// One word more than the window: the word of the highest counter never shares its place with
// the word of the oldest one remembered.
const WORDS: usize = (WINDOW / 64) as usize + 1;

/// Which packet numbers of one direction have been taken: the highest, and a bitmap of the
/// [`WINDOW`] before it (the scheme of RFC 6479). A counter below the window, or one already
/// taken, is refused; so a replayed or duplicated sealed packet is dropped before it is opened
/// further, and a packet reordered by less than the window is still taken.
#[derive(Debug, Clone)]
pub struct ReplayWindow {
    /// One more than the highest counter taken (0: none yet).
    next: u64,
    bits: [u64; WORDS],
}

impl Default for ReplayWindow {
    fn default() -> Self {
        ReplayWindow::new()
    }
}

impl ReplayWindow {
    /// A window that has taken nothing.
    pub fn new() -> ReplayWindow {
        ReplayWindow { next: 0, bits: [0; WORDS] }
    }

    /// Whether `counter` could be taken now: not taken before, not below the window, not past
    /// [`LAST_COUNTER`]. Asked before a packet is opened (to spare the work); the answer is
    /// binding only through [`ReplayWindow::take`], after it opened.
    pub fn fresh(&self, counter: u64) -> bool {
        if counter > LAST_COUNTER {
            return false;
        }
        if counter >= self.next {
            return true;
        }
        if self.next - counter > WINDOW {
            return false;
        }
        let (word, bit) = Self::place(counter);
        self.bits[word] & (1 << bit) == 0
    }

    /// Takes `counter` (of a packet that opened): false if it is not fresh, and then nothing
    /// changes.
    pub fn take(&mut self, counter: u64) -> bool {
        if !self.fresh(counter) {
            return false;
        }
        if counter >= self.next {
            // Clear the words the window slides past: those after the highest taken's, up to
            // and including the new one's (all of them after a jump of a whole window).
            let old_word = self.next.saturating_sub(1) / 64;
            let new_word = counter / 64;
            let clear = (new_word - old_word).min(WORDS as u64);
            for i in 1..=clear {
                self.bits[((old_word + i) % WORDS as u64) as usize] = 0;
            }
            self.next = counter + 1;
        }
        let (word, bit) = Self::place(counter);
        self.bits[word] |= 1 << bit;
        true
    }

    /// The highest counter taken, if any.
    pub fn highest(&self) -> Option<u64> {
        self.next.checked_sub(1)
    }

    fn place(counter: u64) -> (usize, u32) {
        (((counter / 64) % WORDS as u64) as usize, (counter % 64) as u32)
    }
}

#[cfg(test)]
mod tests;
