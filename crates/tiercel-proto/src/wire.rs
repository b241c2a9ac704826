//! The packet header: a zero-copy view with named field offsets, and a validated representation.
//!
//! Every tiercel packet starts with the same fixed 56-byte header, little-endian:
//!
//! ```text
//!  0      2   3   4   5   6       8               12              16
//!  +------+---+---+---+---+-------+---------------+---------------+
//!  | magic|ver|knd|flg|sts| proc  |   binding     |     slot      |
//!  +------+---+---+---+---+-------+---------------+---------------+
//!  16              20      22      24              28              32
//!  +---------------+-------+-------+---------------+---------------+
//!  |     seq       | frag  | frags | payload len   | message len   |
//!  +---------------+-------+-------+---------------+---------------+
//!  32                              40
//!  +-------------------------------+-------------------------------+
//!  |       incarnation (u64)       |     token (u128) ...          |
//!  +-------------------------------+-------------------------------+
//! ```
//!
//! `docs/protocol.md` explains each field. After [`Packet::check`] succeeds no accessor panics.

use core::ops::Range;

/// Length of the fixed header in bytes.
pub const HEADER_LEN: usize = 56;
/// First two bytes of every packet: "tc".
pub const MAGIC: u16 = u16::from_le_bytes(*b"tc");
/// Protocol version carried in every packet.
pub const VERSION: u8 = 7;
/// Oldest protocol version this code speaks. A `Bind` of a newer version (whose header, and the
/// first 36 bytes of whose request, keep their layout in every version from 6 on) is answered with
/// `Reject {UnsupportedVersion}` and the range spoken here, in this code's version; a client reads
/// such a reject whatever its version.
pub const MIN_VERSION: u8 = 7;

mod field {
    use core::ops::Range;
    pub const MAGIC: Range<usize> = 0..2;
    pub const VERSION: usize = 2;
    pub const KIND: usize = 3;
    pub const FLAGS: usize = 4;
    pub const STATUS: usize = 5;
    pub const PROCEDURE: Range<usize> = 6..8;
    pub const BINDING: Range<usize> = 8..12;
    pub const SLOT: Range<usize> = 12..16;
    pub const SEQ: Range<usize> = 16..20;
    pub const FRAG_INDEX: Range<usize> = 20..22;
    pub const FRAG_COUNT: Range<usize> = 22..24;
    pub const PAYLOAD_LEN: Range<usize> = 24..28;
    pub const MESSAGE_LEN: Range<usize> = 28..32;
    pub const INCARNATION: Range<usize> = 32..40;
    pub const TOKEN: Range<usize> = 40..56;
}

/// What a packet is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// A fragment of a call message, client to server.
    Call = 1,
    /// A fragment of a result message, server to client. Its status says whether the call succeeded.
    Result = 2,
    /// Acknowledges fragments received so far; sent only on the slow path.
    Ack = 3,
    /// "Are you still working on call `seq`?", client to server.
    Probe = 4,
    /// "Yes, call `seq` is running", server to client.
    ProbeReply = 5,
    /// The server refuses a packet it cannot attach to a call (unknown binding, old incarnation, ...).
    Reject = 6,
    /// Asks the server for a binding to an exported interface.
    Bind = 7,
    /// Grants a binding.
    BindReply = 8,
    /// "I no longer want the result of call `seq`", client to server, best effort: the server gives
    /// up reassembling it, or drops its saved result. A call already running runs to its end.
    Cancel = 9,
}

impl Kind {
    /// Decodes a kind byte.
    pub fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Call,
            2 => Kind::Result,
            3 => Kind::Ack,
            4 => Kind::Probe,
            5 => Kind::ProbeReply,
            6 => Kind::Reject,
            7 => Kind::Bind,
            8 => Kind::BindReply,
            9 => Kind::Cancel,
            _ => return None,
        })
    }
}

/// Header flags.
pub mod flags {
    /// The sender wants an explicit acknowledgement of this fragment (it is a retransmission).
    pub const PLEASE_ACK: u8 = 0x01;
    /// On an `Ack` from a client: resend the result fragments the ack does not cover.
    pub const RESEND: u8 = 0x02;
    /// On a `Result` packet: this is a retransmission of a saved result.
    pub const RETRANSMIT: u8 = 0x04;
    /// The datagram ends with a 4-byte CRC32C of everything before it (header and payload). Set on
    /// every packet of a binding made with checksums; a packet failing it is dropped as corrupt.
    pub const CHECKSUM: u8 = 0x08;
    /// On a `Probe` from a client: its payload is the challenge of an `AddressUnproven` reject,
    /// echoed from the address it was sent to, proving that the address receives.
    pub const ADDRESS_PROOF: u8 = 0x10;
    /// On a `Call` fragment: the message starts with a call context block (a deadline, a trace),
    /// see [`crate::context`].
    pub const CONTEXT: u8 = 0x20;
}

/// Length of the checksum trailer of a packet with [`flags::CHECKSUM`].
pub const CHECKSUM_LEN: usize = 4;

/// Largest payload of a UDP datagram over IPv4.
pub const MAX_UDP_PAYLOAD: usize = 65_507;

/// CRC32C of the concatenation of `parts` (hardware-accelerated where the CPU has it).
pub fn checksum<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> u32 {
    parts.into_iter().fold(0, crc32c::crc32c_append)
}

/// The outcome carried by a `Result` packet, or the reason carried by a `Reject` packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Status {
    /// The procedure ran and returned; the payload is its marshaled results.
    Ok = 0,
    /// The procedure number is not part of the bound interface. The procedure never ran.
    UnknownProcedure = 1,
    /// The arguments did not decode. The procedure never ran.
    BadArguments = 2,
    /// The procedure panicked; the payload is the panic message. It ran and failed.
    Panicked = 3,
    /// The binding id or token is not known to this server (never granted, expired, or a previous
    /// incarnation's). Nothing ran.
    UnknownBinding = 4,
    /// The packet names a server incarnation other than the running one: the server restarted.
    WrongIncarnation = 5,
    /// The interface asked for at bind time is not exported.
    UnknownInterface = 6,
    /// The interface is exported, but in another version; the payload holds the exported version.
    VersionMismatch = 7,
    /// The call exceeds the server's size limit or its memory budget for the binding. The procedure
    /// never ran.
    TooLarge = 8,
    /// The slot id is outside the binding's slot table.
    BadSlot = 9,
    /// The server has no room for another binding.
    Busy = 10,
    /// The server requires proof of its shared secret before it grants a binding; the payload holds
    /// the request's nonce and a challenge.
    AuthRequired = 11,
    /// The proof of the shared secret in a bind request was wrong or its challenge stale.
    AuthFailed = 12,
    /// The interface is exported in the asked-for version but with other procedures or types (its
    /// fingerprint differs); the payload holds what the server exports.
    InterfaceMismatch = 13,
    /// The procedure ran, and its result exceeds the server's size limit or memory budget; the
    /// payload says how large it was. (A call refused for its own size is `TooLarge`: it never ran.)
    ResultTooLarge = 14,
    /// The packet came from an address that has not proven it receives for this client slot (a
    /// client thread's first packet, or a packet whose source may be spoofed); the payload holds a
    /// challenge to echo in a `Probe` with [`flags::ADDRESS_PROOF`] from that address. Nothing ran.
    AddressUnproven = 15,
    /// The call's deadline had passed when the server was about to start it. It never ran.
    DeadlineExceeded = 16,
    /// The client gave the call up before the server started it. It never ran.
    Cancelled = 17,
    /// The server does not speak the bind request's protocol version; the reject carries the range
    /// it speaks.
    UnsupportedVersion = 18,
    /// The server's interceptor refused the call before it ran (an authorization decision); the
    /// payload says why. It never ran. Sent only on a binding granted
    /// [`crate::bind::wire::features::REFUSED`]; other clients are answered `BadArguments`.
    Refused = 19,
    /// The server takes only secure bindings (made with its key, `crate::seal`) on this transport,
    /// and the request came plain. Nothing was bound.
    KeyRequired = 20,
}

impl Status {
    /// Decodes a status byte.
    pub fn from_u8(v: u8) -> Option<Status> {
        Some(match v {
            0 => Status::Ok,
            1 => Status::UnknownProcedure,
            2 => Status::BadArguments,
            3 => Status::Panicked,
            4 => Status::UnknownBinding,
            5 => Status::WrongIncarnation,
            6 => Status::UnknownInterface,
            7 => Status::VersionMismatch,
            8 => Status::TooLarge,
            9 => Status::BadSlot,
            10 => Status::Busy,
            11 => Status::AuthRequired,
            12 => Status::AuthFailed,
            13 => Status::InterfaceMismatch,
            14 => Status::ResultTooLarge,
            15 => Status::AddressUnproven,
            16 => Status::DeadlineExceeded,
            17 => Status::Cancelled,
            18 => Status::UnsupportedVersion,
            19 => Status::Refused,
            20 => Status::KeyRequired,
            _ => return None,
        })
    }
}

/// Why a packet was refused by [`Packet::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// Shorter than the fixed header.
    #[error("packet of {0} bytes is shorter than the {HEADER_LEN}-byte header")]
    Truncated(usize),
    /// Not a tiercel packet.
    #[error("bad magic")]
    BadMagic,
    /// A tiercel packet of another protocol version.
    #[error("unsupported protocol version {0}")]
    BadVersion(u8),
    /// Unknown packet kind.
    #[error("unknown packet kind {0}")]
    BadKind(u8),
    /// Unknown status code.
    #[error("unknown status {0}")]
    BadStatus(u8),
    /// The payload length field disagrees with the datagram length.
    #[error("payload length {claimed} disagrees with the {actual} bytes received")]
    BadLength {
        /// What the header claims.
        claimed: u32,
        /// What arrived after the header.
        actual: usize,
    },
    /// The checksum trailer does not match the packet.
    #[error("checksum mismatch")]
    BadChecksum,
    /// Fragment index not below fragment count, or a zero count.
    #[error("fragment {index} of {count} is out of range")]
    BadFragment {
        /// Fragment index.
        index: u16,
        /// Fragment count.
        count: u16,
    },
}

/// A zero-copy view of a packet: the header fields read and written in place.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

fn get_u16(b: &[u8], r: Range<usize>) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(&b[r]);
    u16::from_le_bytes(a)
}
fn get_u32(b: &[u8], r: Range<usize>) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[r]);
    u32::from_le_bytes(a)
}
fn get_u64(b: &[u8], r: Range<usize>) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[r]);
    u64::from_le_bytes(a)
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking it; use [`Packet::new_checked`] on anything received.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a received datagram, validating every header field once.
    pub fn new_checked(buffer: T) -> Result<Packet<T>, WireError> {
        let p = Packet { buffer };
        p.check()?;
        Ok(p)
    }

    /// Validates the header: length, magic, version, kind, status, fragment range and payload length.
    /// Afterwards the accessors and [`Packet::payload`] cannot panic.
    pub fn check(&self) -> Result<(), WireError> {
        let b = self.buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(WireError::Truncated(b.len()));
        }
        let trailer = self.check_header(b.len() - HEADER_LEN)?;
        if trailer != 0 {
            let (body, sum) = b.split_at(b.len() - CHECKSUM_LEN);
            if checksum([body]).to_le_bytes() != sum {
                return Err(WireError::BadChecksum);
            }
        }
        Ok(())
    }

    /// Validates a packet received in two places: this view holds its header alone, `payload` the
    /// payload received apart from it (into where it belongs), `trailer` what came after the
    /// payload (the checksum trailer, if any). The accessors cannot panic afterwards;
    /// [`Packet::payload`] must not be called on the view (it holds no payload).
    pub fn check_split(&self, payload: &[u8], trailer: &[u8]) -> Result<(), WireError> {
        let b = self.buffer.as_ref();
        if b.len() != HEADER_LEN {
            return Err(WireError::Truncated(b.len()));
        }
        let expected = self.check_header(payload.len() + trailer.len())?;
        if trailer.len() != expected {
            return Err(WireError::BadLength { claimed: self.payload_len(), actual: payload.len() + trailer.len() });
        }
        if expected != 0 && checksum([b, payload]).to_le_bytes() != trailer {
            return Err(WireError::BadChecksum);
        }
        Ok(())
    }

    /// Checks every header field against a datagram of `body` bytes after the header; returns the
    /// length of its checksum trailer.
    fn check_header(&self, body: usize) -> Result<usize, WireError> {
        let b = self.buffer.as_ref();
        if get_u16(b, field::MAGIC) != MAGIC {
            return Err(WireError::BadMagic);
        }
        // A newer peer's bind request, or a newer server's refusal of ours for its version, is read
        // whatever its version: their headers keep this layout.
        let version = b[field::VERSION];
        let negotiating = b[field::KIND] == Kind::Bind as u8
            || (b[field::KIND] == Kind::Reject as u8 && b[field::STATUS] == Status::UnsupportedVersion as u8);
        if version < MIN_VERSION || (version > VERSION && !negotiating) {
            return Err(WireError::BadVersion(version));
        }
        if Kind::from_u8(b[field::KIND]).is_none() {
            return Err(WireError::BadKind(b[field::KIND]));
        }
        if Status::from_u8(b[field::STATUS]).is_none() {
            return Err(WireError::BadStatus(b[field::STATUS]));
        }
        let (index, count) = (self.frag_index(), self.frag_count());
        if count == 0 || index >= count {
            return Err(WireError::BadFragment { index, count });
        }
        let claimed = self.payload_len();
        let trailer = if self.flags() & flags::CHECKSUM != 0 { CHECKSUM_LEN } else { 0 };
        if claimed as usize != body.wrapping_sub(trailer) {
            return Err(WireError::BadLength { claimed, actual: body });
        }
        Ok(trailer)
    }

    /// Consumes the view, returning the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Protocol version the sender wrote the packet in (between [`MIN_VERSION`] and [`VERSION`],
    /// except in a bind request or a version refusal, after [`Packet::check`]).
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION]
    }

    /// Packet kind. Only valid after [`Packet::check`].
    pub fn kind(&self) -> Kind {
        Kind::from_u8(self.buffer.as_ref()[field::KIND]).unwrap_or(Kind::Reject)
    }
    /// Flag bits, see [`flags`].
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }
    /// Status of a result or reject. Only valid after [`Packet::check`].
    pub fn status(&self) -> Status {
        Status::from_u8(self.buffer.as_ref()[field::STATUS]).unwrap_or(Status::BadArguments)
    }
    /// Procedure number within the bound interface.
    pub fn procedure(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::PROCEDURE)
    }
    /// Binding id granted by the server.
    pub fn binding(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::BINDING)
    }
    /// Client slot id within the binding.
    pub fn slot(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::SLOT)
    }
    /// Call sequence number within the slot.
    pub fn seq(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::SEQ)
    }
    /// Index of this fragment within its message.
    pub fn frag_index(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::FRAG_INDEX)
    }
    /// Number of fragments in the message.
    pub fn frag_count(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::FRAG_COUNT)
    }
    /// Bytes of payload in this packet.
    pub fn payload_len(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::PAYLOAD_LEN)
    }
    /// Bytes of the whole message this fragment belongs to.
    pub fn message_len(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::MESSAGE_LEN)
    }
    /// Server incarnation (boot id) the packet belongs to.
    pub fn incarnation(&self) -> u64 {
        get_u64(self.buffer.as_ref(), field::INCARNATION)
    }
    /// The binding's capability token.
    pub fn token(&self) -> u128 {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buffer.as_ref()[field::TOKEN]);
        u128::from_le_bytes(a)
    }
    /// The payload after the header (without a checksum trailer). Only valid after [`Packet::check`].
    pub fn payload(&self) -> &[u8] {
        let end = HEADER_LEN.saturating_add(self.payload_len() as usize);
        self.buffer.as_ref().get(HEADER_LEN..end).unwrap_or(&[])
    }
    /// The header fields as a value.
    pub fn header(&self) -> Header {
        Header {
            kind: self.kind(),
            flags: self.flags(),
            status: self.status(),
            procedure: self.procedure(),
            binding: self.binding(),
            slot: self.slot(),
            seq: self.seq(),
            frag_index: self.frag_index(),
            frag_count: self.frag_count(),
            payload_len: self.payload_len(),
            message_len: self.message_len(),
            incarnation: self.incarnation(),
            token: self.token(),
        }
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn b(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
    /// Sets the kind.
    pub fn set_kind(&mut self, v: Kind) {
        self.b()[field::KIND] = v as u8;
    }
    /// Sets the flags.
    pub fn set_flags(&mut self, v: u8) {
        self.b()[field::FLAGS] = v;
    }
    /// Sets the status.
    pub fn set_status(&mut self, v: Status) {
        self.b()[field::STATUS] = v as u8;
    }
    /// Sets the procedure number.
    pub fn set_procedure(&mut self, v: u16) {
        self.b()[field::PROCEDURE].copy_from_slice(&v.to_le_bytes());
    }
    /// Sets the slot id.
    pub fn set_slot(&mut self, v: u32) {
        self.b()[field::SLOT].copy_from_slice(&v.to_le_bytes());
    }
    /// Sets the sequence number.
    pub fn set_seq(&mut self, v: u32) {
        self.b()[field::SEQ].copy_from_slice(&v.to_le_bytes());
    }
    /// Sets fragment index and count.
    pub fn set_fragment(&mut self, index: u16, count: u16) {
        self.b()[field::FRAG_INDEX].copy_from_slice(&index.to_le_bytes());
        self.b()[field::FRAG_COUNT].copy_from_slice(&count.to_le_bytes());
    }
    /// Sets the payload length of this packet and the length of the whole message.
    pub fn set_lengths(&mut self, payload: u32, message: u32) {
        self.b()[field::PAYLOAD_LEN].copy_from_slice(&payload.to_le_bytes());
        self.b()[field::MESSAGE_LEN].copy_from_slice(&message.to_le_bytes());
    }
}

/// The header as a value: what [`Packet::header`] reads and [`Header::emit`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Packet kind.
    pub kind: Kind,
    /// Flag bits, see [`flags`].
    pub flags: u8,
    /// Result or reject status.
    pub status: Status,
    /// Procedure number.
    pub procedure: u16,
    /// Binding id.
    pub binding: u32,
    /// Client slot id.
    pub slot: u32,
    /// Call sequence number.
    pub seq: u32,
    /// Fragment index.
    pub frag_index: u16,
    /// Fragment count.
    pub frag_count: u16,
    /// Payload bytes in this packet.
    pub payload_len: u32,
    /// Bytes in the whole message.
    pub message_len: u32,
    /// Server incarnation.
    pub incarnation: u64,
    /// Binding capability token.
    pub token: u128,
}

impl Header {
    /// A header of `kind` with every other field zero and a single fragment.
    pub fn new(kind: Kind) -> Header {
        Header {
            kind,
            flags: 0,
            status: Status::Ok,
            procedure: 0,
            binding: 0,
            slot: 0,
            seq: 0,
            frag_index: 0,
            frag_count: 1,
            payload_len: 0,
            message_len: 0,
            incarnation: 0,
            token: 0,
        }
    }

    /// Writes the header into the first [`HEADER_LEN`] bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8; HEADER_LEN]) {
        buf[field::MAGIC].copy_from_slice(&MAGIC.to_le_bytes());
        buf[field::VERSION] = VERSION;
        buf[field::KIND] = self.kind as u8;
        buf[field::FLAGS] = self.flags;
        buf[field::STATUS] = self.status as u8;
        buf[field::PROCEDURE].copy_from_slice(&self.procedure.to_le_bytes());
        buf[field::BINDING].copy_from_slice(&self.binding.to_le_bytes());
        buf[field::SLOT].copy_from_slice(&self.slot.to_le_bytes());
        buf[field::SEQ].copy_from_slice(&self.seq.to_le_bytes());
        buf[field::FRAG_INDEX].copy_from_slice(&self.frag_index.to_le_bytes());
        buf[field::FRAG_COUNT].copy_from_slice(&self.frag_count.to_le_bytes());
        buf[field::PAYLOAD_LEN].copy_from_slice(&self.payload_len.to_le_bytes());
        buf[field::MESSAGE_LEN].copy_from_slice(&self.message_len.to_le_bytes());
        buf[field::INCARNATION].copy_from_slice(&self.incarnation.to_le_bytes());
        buf[field::TOKEN].copy_from_slice(&self.token.to_le_bytes());
    }

    /// The header as bytes.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        self.emit(&mut b);
        b
    }
}

#[cfg(test)]
mod tests;
