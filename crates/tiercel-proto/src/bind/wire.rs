//! The bind messages as they travel after the packet header: request, grant, challenge and refusal.
//!
//! Each message has its fields at named offsets (`mod field`) and a value type with `parse` and
//! `emit`; a parse that succeeds has checked every length, so nothing after it panics. The same
//! bytes travel in UDP datagrams and, framed by length, over the shared-memory rendezvous socket.
//!
//! ```text
//! request  0 interface id  8 version  12 max datagram  16 nonce  24 fingerprint  32 flags
//!          33 features (u16)  35 zero  36 challenge (16)  52 proof (32)  84 padding to the datagram
//!          the client chose                     (0..36 keep this layout in every protocol version)
//! grant    0 slots  4 max datagram  8 version  12 nonce  20 region bytes  28 flags
//!          29 features (u16)  31 zero  32 proof (32)
//!                                               (binding id, token and incarnation: in the header)
//!          with the rendezvous flag: 64 rendezvous name (16)  80 server pid  84 server uid
//! challenge 0 nonce  8 challenge (16)           (a Reject with status AuthRequired)
//! refusal  0 nonce  8 exported version  12 exported fingerprint  20 procedures exported (u16)
//!          22 entries here (u16)  24 entries: name hash (u32), shape hash (u32), in procedure order
//!          then the exported signature (UTF-8); entries, then signature, cut to what the server
//!          may send back                        (a Reject with the refusal's status)
//! versions 0 nonce  8 oldest protocol version spoken  9 newest   (a Reject with status
//!          UnsupportedVersion, answering a request of a version the server does not speak)
//! key      0 nonce  8 zero (20)  28 flags (key)  29 has a key  30 zero  32 public key (32)
//!          (a BindReply, answering a request with the key flag)
//! ```

/// Bytes of a server's challenge.
pub const CHALLENGE_LEN: usize = 16;
/// Bytes of a proof of the shared secret (a keyed hash).
pub const PROOF_LEN: usize = 32;
/// Encoded size of a [`BindRequest`] before its padding.
pub const REQUEST_LEN: usize = 84;
/// Encoded size of a [`BindGrant`] without a rendezvous.
pub const GRANT_LEN: usize = 64;
/// Encoded size of a [`BindGrant`] with a [`Rendezvous`].
pub const RENDEZVOUS_GRANT_LEN: usize = GRANT_LEN + 24;
/// Encoded size of a [`BindChallenge`].
pub const CHALLENGE_MSG_LEN: usize = 24;
/// Encoded size of a [`BindRefusal`] before its procedure table and the exported signature.
pub const REFUSAL_LEN: usize = 24;
/// Encoded size of one entry of a refusal's procedure table.
pub const PROCEDURE_LEN: usize = 8;
/// Encoded size of a [`VersionRefusal`].
pub const VERSIONS_LEN: usize = 10;

/// What a binding may use beyond the packet exchange of protocol version 6 without it: each side
/// says what it speaks, and the grant carries what both do. A client uses only what was granted.
pub mod features {
    /// Call context blocks (`flags::CONTEXT`): deadlines and trace ids travel with calls.
    pub const CONTEXT: u16 = 1;
    /// `Cancel` packets over UDP, and the cancel word of a shared-memory slot.
    pub const CANCEL: u16 = 2;
    /// Windows of multi-packet messages up to [`crate::fragment::MAX_WINDOW`] fragments past the
    /// acknowledged prefix (a receiver accepts fragments that far on); without it, up to
    /// [`crate::fragment::NARROW_WINDOW`], what an acknowledgement's mask covers.
    pub const WIDE_WINDOW: u16 = 4;
    /// Results with [`crate::wire::Status::Refused`]: a call the server's interceptor refused.
    pub const REFUSED: u16 = 8;
    /// Everything this code speaks.
    pub const ALL: u16 = CONTEXT | CANCEL | WIDE_WINDOW | REFUSED;

    /// The largest window either side of a binding granted `granted` may send with.
    pub fn max_window(granted: u16) -> u16 {
        if granted & WIDE_WINDOW != 0 {
            crate::fragment::MAX_WINDOW
        } else {
            crate::fragment::NARROW_WINDOW
        }
    }
}

mod field {
    use core::ops::Range;

    pub mod request {
        use super::Range;
        pub const INTERFACE: Range<usize> = 0..8;
        pub const VERSION: Range<usize> = 8..12;
        pub const MAX_DATAGRAM: Range<usize> = 12..16;
        pub const NONCE: Range<usize> = 16..24;
        pub const FINGERPRINT: Range<usize> = 24..32;
        pub const FLAGS: usize = 32;
        pub const FEATURES: Range<usize> = 33..35;
        pub const RESERVED: Range<usize> = 35..36;
        pub const CHALLENGE: Range<usize> = 36..52;
        pub const PROOF: Range<usize> = 52..84;
    }

    pub mod grant {
        use super::Range;
        pub const SLOTS: Range<usize> = 0..4;
        pub const MAX_DATAGRAM: Range<usize> = 4..8;
        pub const VERSION: Range<usize> = 8..12;
        pub const NONCE: Range<usize> = 12..20;
        pub const REGION: Range<usize> = 20..28;
        pub const FLAGS: usize = 28;
        pub const FEATURES: Range<usize> = 29..31;
        pub const RESERVED: Range<usize> = 31..32;
        pub const PROOF: Range<usize> = 32..64;
        pub const NAME: Range<usize> = 64..80;
        pub const PID: Range<usize> = 80..84;
        pub const UID: Range<usize> = 84..88;
    }

    pub mod challenge {
        use super::Range;
        pub const NONCE: Range<usize> = 0..8;
        pub const CHALLENGE: Range<usize> = 8..24;
    }

    pub mod refusal {
        use super::Range;
        pub const NONCE: Range<usize> = 0..8;
        pub const VERSION: Range<usize> = 8..12;
        pub const FINGERPRINT: Range<usize> = 12..20;
        pub const PROCEDURES: Range<usize> = 20..22;
        pub const ENTRIES: Range<usize> = 22..24;
        pub const TABLE: usize = 24;
    }
}

/// Flag of a request or grant: the proof fields are filled in.
const HAS_PROOF: u8 = 1;
/// Flag of a request: the client asks what the server exports, not for a binding (the interface
/// field is the index of the export asked about). Flag of an [`ExportListing`], at the place of a
/// grant's flags (so that it is never read as a grant).
const LIST: u8 = 4;
/// Flag of a request: the client is on the server's host and asks where to bind through shared
/// memory. Flag of a grant: the answer is that place (a [`Rendezvous`]), not a binding.
const RENDEZVOUS: u8 = 2;
/// Flag of a request: the client asks for the server's static public key, not for a binding.
/// Flag of a [`KeyAnswer`], at the place of a grant's flags (so that it is never read as a grant
/// or a listing).
const KEY: u8 = 8;

fn zero(b: &[u8]) -> bool {
    b.iter().all(|&x| x == 0)
}

fn u32_at(b: &[u8], r: core::ops::Range<usize>) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[r]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], r: core::ops::Range<usize>) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[r]);
    u64::from_le_bytes(a)
}

fn array_at<const N: usize>(b: &[u8], r: core::ops::Range<usize>) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[r]);
    a
}

/// A client's answer to a server's challenge: the challenge and a keyed hash, under the shared
/// secret, of the request and the challenge ([`BindRequest::proof_transcript`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindProof {
    /// The challenge the server sent.
    pub challenge: [u8; CHALLENGE_LEN],
    /// The keyed hash.
    pub mac: [u8; PROOF_LEN],
}

/// A client's request for a binding to an exported interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindRequest {
    /// The interface's id (a hash of its name).
    pub interface: u64,
    /// The interface version the client was generated from.
    pub version: u32,
    /// Largest datagram the client can receive (0 through shared memory).
    pub max_datagram: u32,
    /// A random number the answer echoes, so that a stale answer is not mistaken for this one.
    pub nonce: u64,
    /// A hash of the whole interface as the client sees it: procedure names, argument and result
    /// types, in order.
    pub fingerprint: u64,
    /// Proof of the server's shared secret, once the server has asked for it.
    pub proof: Option<BindProof>,
    /// Whether the client asks for the server's shared-memory [`Rendezvous`] rather than a
    /// binding over this transport (a server that offers none, or sees the client elsewhere,
    /// grants a binding as usual).
    pub rendezvous: bool,
    /// The [`features`] the client speaks.
    pub features: u16,
    /// Whether the client asks what export number `interface` is, rather than for a binding.
    pub list: bool,
    /// Whether the client asks for the server's static public key, rather than for a binding (a
    /// client that pins the key on first use: it binds securely with the key once told).
    pub ask_key: bool,
}

impl BindRequest {
    /// Writes the request into `buf` (at least [`REQUEST_LEN`] bytes); bytes after it are zeroed
    /// (padding the request lets the server's refusal carry its interface's signature back).
    pub fn emit(&self, buf: &mut [u8]) {
        use field::request as f;
        buf.fill(0);
        buf[f::INTERFACE].copy_from_slice(&self.interface.to_le_bytes());
        buf[f::VERSION].copy_from_slice(&self.version.to_le_bytes());
        buf[f::MAX_DATAGRAM].copy_from_slice(&self.max_datagram.to_le_bytes());
        buf[f::NONCE].copy_from_slice(&self.nonce.to_le_bytes());
        buf[f::FINGERPRINT].copy_from_slice(&self.fingerprint.to_le_bytes());
        buf[f::FEATURES].copy_from_slice(&self.features.to_le_bytes());
        if self.rendezvous {
            buf[f::FLAGS] |= RENDEZVOUS;
        }
        if self.list {
            buf[f::FLAGS] |= LIST;
        }
        if self.ask_key {
            buf[f::FLAGS] |= KEY;
        }
        if let Some(p) = &self.proof {
            buf[f::FLAGS] |= HAS_PROOF;
            buf[f::CHALLENGE].copy_from_slice(&p.challenge);
            buf[f::PROOF].copy_from_slice(&p.mac);
        }
    }

    /// The request as `len` bytes (at least [`REQUEST_LEN`]).
    pub fn to_bytes(&self, len: usize) -> Vec<u8> {
        let mut b = vec![0; len.max(REQUEST_LEN)];
        self.emit(&mut b);
        b
    }

    /// Decodes a request payload: [`REQUEST_LEN`] bytes and any padding. `None` when it is too
    /// short, has unknown flags, non-zero reserved bytes, or proof bytes without the proof flag.
    pub fn parse(b: &[u8]) -> Option<BindRequest> {
        use field::request as f;
        if b.len() < REQUEST_LEN || b[f::FLAGS] & !(HAS_PROOF | RENDEZVOUS | LIST | KEY) != 0 || !zero(&b[f::RESERVED])
        {
            return None;
        }
        if b[f::FLAGS] & HAS_PROOF == 0 && !zero(&b[f::CHALLENGE.start..f::PROOF.end]) {
            return None;
        }
        let proof = (b[f::FLAGS] & HAS_PROOF != 0)
            .then(|| BindProof { challenge: array_at(b, f::CHALLENGE), mac: array_at(b, f::PROOF) });
        Some(BindRequest {
            interface: u64_at(b, f::INTERFACE),
            version: u32_at(b, f::VERSION),
            max_datagram: u32_at(b, f::MAX_DATAGRAM),
            nonce: u64_at(b, f::NONCE),
            fingerprint: u64_at(b, f::FINGERPRINT),
            proof,
            rendezvous: b[f::FLAGS] & RENDEZVOUS != 0,
            features: u16::from_le_bytes(array_at(b, f::FEATURES)),
            list: b[f::FLAGS] & LIST != 0,
            ask_key: b[f::FLAGS] & KEY != 0,
        })
    }

    /// What the client's proof hashes: a label, every field of the request but the proof (its
    /// flags included), and the challenge.
    pub fn proof_transcript(&self, challenge: &[u8; CHALLENGE_LEN]) -> [u8; 16 + 35 + CHALLENGE_LEN] {
        let mut t = [0u8; 16 + 35 + CHALLENGE_LEN];
        t[..16].copy_from_slice(b"tiercel bind rq4");
        let mut fields = [0u8; REQUEST_LEN];
        BindRequest { proof: None, ..*self }.emit(&mut fields);
        t[16..51].copy_from_slice(&fields[..35]);
        t[51..].copy_from_slice(challenge);
        t
    }
}

/// The server's grant of a binding. Binding id, token and incarnation travel in the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindGrant {
    /// Client slots in the binding's slot table.
    pub slots: u32,
    /// Largest datagram either side will send on this binding (0 through shared memory).
    pub max_datagram: u32,
    /// The interface version the server exports (equal to the request's).
    pub version: u32,
    /// The request's nonce, echoed.
    pub nonce: u64,
    /// Through shared memory, the bytes of each slot's data area in the region that comes with the
    /// grant; 0 over UDP.
    pub region: u64,
    /// From a server with a shared secret: a keyed hash of the grant ([`BindGrant::proof_transcript`]),
    /// so that the client knows the binding comes from a holder of the secret.
    pub proof: Option<[u8; PROOF_LEN]>,
    /// Instead of a binding (no slots), where this server takes shared-memory binds: the answer to
    /// a request that asked for it.
    pub rendezvous: Option<Rendezvous>,
    /// The [`features`] the binding may use: those both sides speak.
    pub features: u16,
}

/// Where a server takes shared-memory binds, told over the transport the client reached it by:
/// an abstract UNIX socket name, random for each incarnation of the server, and the process that
/// must be found listening there (its id and user, which the client checks against the
/// credentials of the socket's peer, so that another process holding the name is never used).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rendezvous {
    /// The random part of the socket's name.
    pub name: [u8; 16],
    /// The server's process id.
    pub pid: u32,
    /// The server's user id.
    pub uid: u32,
}

impl BindGrant {
    /// The grant as [`GRANT_LEN`] bytes, or [`RENDEZVOUS_GRANT_LEN`] with a rendezvous.
    pub fn to_bytes(&self) -> Vec<u8> {
        use field::grant as f;
        let mut b = vec![0u8; if self.rendezvous.is_some() { RENDEZVOUS_GRANT_LEN } else { GRANT_LEN }];
        b[f::SLOTS].copy_from_slice(&self.slots.to_le_bytes());
        b[f::MAX_DATAGRAM].copy_from_slice(&self.max_datagram.to_le_bytes());
        b[f::VERSION].copy_from_slice(&self.version.to_le_bytes());
        b[f::NONCE].copy_from_slice(&self.nonce.to_le_bytes());
        b[f::REGION].copy_from_slice(&self.region.to_le_bytes());
        b[f::FEATURES].copy_from_slice(&self.features.to_le_bytes());
        if let Some(p) = &self.proof {
            b[f::FLAGS] |= HAS_PROOF;
            b[f::PROOF].copy_from_slice(p);
        }
        if let Some(r) = &self.rendezvous {
            b[f::FLAGS] |= RENDEZVOUS;
            b[f::NAME].copy_from_slice(&r.name);
            b[f::PID].copy_from_slice(&r.pid.to_le_bytes());
            b[f::UID].copy_from_slice(&r.uid.to_le_bytes());
        }
        b
    }

    /// Decodes a grant payload. `None` when it has the wrong length for its flags, unknown flags,
    /// non-zero reserved bytes, or proof bytes without the proof flag.
    pub fn parse(b: &[u8]) -> Option<BindGrant> {
        use field::grant as f;
        if b.len() < GRANT_LEN || b[f::FLAGS] & !(HAS_PROOF | RENDEZVOUS) != 0 || !zero(&b[f::RESERVED]) {
            return None;
        }
        let with_rendezvous = b[f::FLAGS] & RENDEZVOUS != 0;
        if b.len() != if with_rendezvous { RENDEZVOUS_GRANT_LEN } else { GRANT_LEN } {
            return None;
        }
        if b[f::FLAGS] & HAS_PROOF == 0 && !zero(&b[f::PROOF]) {
            return None;
        }
        Some(BindGrant {
            slots: u32_at(b, f::SLOTS),
            max_datagram: u32_at(b, f::MAX_DATAGRAM),
            version: u32_at(b, f::VERSION),
            nonce: u64_at(b, f::NONCE),
            region: u64_at(b, f::REGION),
            proof: (b[f::FLAGS] & HAS_PROOF != 0).then(|| array_at(b, f::PROOF)),
            rendezvous: with_rendezvous.then(|| Rendezvous {
                name: array_at(b, f::NAME),
                pid: u32_at(b, f::PID),
                uid: u32_at(b, f::UID),
            }),
            features: u16::from_le_bytes(array_at(b, f::FEATURES)),
        })
    }

    /// What the server's proof hashes: a label, the grant (binding id, token and incarnation from
    /// the header, and every field of the grant but the proof, its flags and rendezvous included)
    /// and the challenge the client answered.
    pub fn proof_transcript(
        &self,
        binding: u32,
        token: u128,
        incarnation: u64,
        challenge: &[u8; CHALLENGE_LEN],
    ) -> [u8; 16 + 28 + 31 + 24 + CHALLENGE_LEN] {
        use field::grant as f;
        let mut t = [0u8; 16 + 28 + 31 + 24 + CHALLENGE_LEN];
        t[..16].copy_from_slice(b"tiercel bind ok4");
        t[16..20].copy_from_slice(&binding.to_le_bytes());
        t[20..36].copy_from_slice(&token.to_le_bytes());
        t[36..44].copy_from_slice(&incarnation.to_le_bytes());
        let fields = BindGrant { proof: None, ..*self }.to_bytes();
        t[44..75].copy_from_slice(&fields[..31]);
        if self.rendezvous.is_some() {
            t[75..99].copy_from_slice(&fields[f::NAME.start..f::UID.end]);
        }
        t[99..].copy_from_slice(challenge);
        t
    }
}

/// What a server exports at one index: the answer (a `BindReply` with the list flag where a
/// grant has its flags) to a request with the list flag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportListing<'a> {
    /// The request's nonce, echoed.
    pub nonce: u64,
    /// How many interfaces the server exports.
    pub count: u32,
    /// The index asked about (at or past `count`: nothing there, and the fields below are empty).
    pub index: u32,
    /// The interface's version.
    pub version: u32,
    /// Its fingerprint.
    pub fingerprint: u64,
    /// Its name (UTF-8).
    pub name: &'a [u8],
    /// Its signature (UTF-8, one procedure a line), cut to what the answer may hold.
    pub signature: &'a [u8],
}

/// Encoded size of an [`ExportListing`] before its name and signature.
pub const LISTING_LEN: usize = 32;

impl ExportListing<'_> {
    /// The listing in at most `budget` bytes (never fewer than [`LISTING_LEN`] and the name): the
    /// signature is cut to fit.
    pub fn to_bytes(&self, budget: usize) -> Vec<u8> {
        let name = &self.name[..self.name.len().min(u8::MAX as usize)];
        let room = budget.saturating_sub(LISTING_LEN + name.len());
        let mut b = vec![0u8; LISTING_LEN];
        b[0..8].copy_from_slice(&self.nonce.to_le_bytes());
        b[8..12].copy_from_slice(&self.count.to_le_bytes());
        b[12..16].copy_from_slice(&self.index.to_le_bytes());
        b[16..20].copy_from_slice(&self.version.to_le_bytes());
        b[20..28].copy_from_slice(&self.fingerprint.to_le_bytes());
        b[28] = LIST;
        b[29] = name.len() as u8;
        b.extend_from_slice(name);
        b.extend_from_slice(&self.signature[..self.signature.len().min(room)]);
        b
    }

    /// Decodes one; `None` when it is shorter than its fixed fields and name, or is not flagged as
    /// a listing.
    pub fn parse(b: &[u8]) -> Option<ExportListing<'_>> {
        if b.len() < LISTING_LEN || b[28] != LIST || !zero(&b[30..32]) {
            return None;
        }
        let name_end = LISTING_LEN + b[29] as usize;
        (b.len() >= name_end).then(|| ExportListing {
            nonce: u64_at(b, 0..8),
            count: u32_at(b, 8..12),
            index: u32_at(b, 12..16),
            version: u32_at(b, 16..20),
            fingerprint: u64_at(b, 20..28),
            name: &b[LISTING_LEN..name_end],
            signature: &b[name_end..],
        })
    }
}

/// The server's static public key, or that it has none: the answer (a `BindReply` with the key
/// flag where a grant has its flags) to a request with the key flag. Told to anyone who asks, in
/// fewer bytes than any request: a public key is no secret, and what it is worth is proven only by
/// the secure handshake made with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyAnswer {
    /// The request's nonce, echoed.
    pub nonce: u64,
    /// The key (X25519); `None`: the server has no key pair and takes only plain bindings.
    pub key: Option<[u8; 32]>,
}

/// Encoded size of a [`KeyAnswer`].
pub const KEY_ANSWER_LEN: usize = 64;

impl KeyAnswer {
    /// The answer as [`KEY_ANSWER_LEN`] bytes.
    pub fn to_bytes(&self) -> [u8; KEY_ANSWER_LEN] {
        let mut b = [0u8; KEY_ANSWER_LEN];
        b[0..8].copy_from_slice(&self.nonce.to_le_bytes());
        b[28] = KEY;
        if let Some(key) = &self.key {
            b[29] = 1;
            b[32..64].copy_from_slice(key);
        }
        b
    }

    /// Decodes one; `None` when it is not [`KEY_ANSWER_LEN`] bytes, is not flagged as a key
    /// answer, or has bytes set where it must have none.
    pub fn parse(b: &[u8]) -> Option<KeyAnswer> {
        if b.len() != KEY_ANSWER_LEN || b[28] != KEY || b[29] > 1 || !zero(&b[8..28]) || !zero(&b[30..32]) {
            return None;
        }
        if b[29] == 0 && !zero(&b[32..64]) {
            return None;
        }
        Some(KeyAnswer { nonce: u64_at(b, 0..8), key: (b[29] == 1).then(|| array_at(b, 32..64)) })
    }
}

/// A server's refusal of a bind request in a protocol version it does not speak: the range it
/// does. The payload of a `Reject` with status `UnsupportedVersion`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionRefusal {
    /// The request's nonce, echoed (read from where every version's request has it).
    pub nonce: u64,
    /// The oldest protocol version the server speaks.
    pub min: u8,
    /// The newest.
    pub max: u8,
}

impl VersionRefusal {
    /// The refusal as [`VERSIONS_LEN`] bytes.
    pub fn to_bytes(&self) -> [u8; VERSIONS_LEN] {
        let mut b = [0u8; VERSIONS_LEN];
        b[..8].copy_from_slice(&self.nonce.to_le_bytes());
        (b[8], b[9]) = (self.min, self.max);
        b
    }

    /// Decodes one; `None` when it is not [`VERSIONS_LEN`] bytes or its range is empty.
    pub fn parse(b: &[u8]) -> Option<VersionRefusal> {
        (b.len() == VERSIONS_LEN && b[8] <= b[9]).then(|| VersionRefusal {
            nonce: u64_at(b, 0..8),
            min: b[8],
            max: b[9],
        })
    }

    /// The nonce of a bind request of any version (at the same place in all of them), if its
    /// payload is long enough to hold one.
    pub fn nonce_of(request: &[u8]) -> Option<u64> {
        (request.len() >= field::request::NONCE.end).then(|| u64_at(request, field::request::NONCE))
    }
}

/// A server's demand for proof of its shared secret: the payload of a `Reject` with status
/// `AuthRequired` answering a bind request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindChallenge {
    /// The request's nonce, echoed.
    pub nonce: u64,
    /// What the client must prove the secret over.
    pub challenge: [u8; CHALLENGE_LEN],
}

impl BindChallenge {
    /// The challenge as [`CHALLENGE_MSG_LEN`] bytes.
    pub fn to_bytes(&self) -> [u8; CHALLENGE_MSG_LEN] {
        use field::challenge as f;
        let mut b = [0u8; CHALLENGE_MSG_LEN];
        b[f::NONCE].copy_from_slice(&self.nonce.to_le_bytes());
        b[f::CHALLENGE].copy_from_slice(&self.challenge);
        b
    }

    /// Decodes a challenge payload.
    pub fn parse(b: &[u8]) -> Option<BindChallenge> {
        use field::challenge as f;
        (b.len() == CHALLENGE_MSG_LEN)
            .then(|| BindChallenge { nonce: u64_at(b, f::NONCE), challenge: array_at(b, f::CHALLENGE) })
    }
}

/// Why a server refused a bind request, as far as it tells: the payload of a `Reject` answering a
/// bind request (the header's status says why). Carries what the server exports under the
/// requested name, so that the client can say how the two sides differ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindRefusal<'a> {
    /// The request's nonce, echoed.
    pub nonce: u64,
    /// The version the server exports (0 when it exports no interface of that name).
    pub version: u32,
    /// The exported interface's fingerprint (0 when there is none).
    pub fingerprint: u64,
    /// The exported interface's procedures, by name and shape.
    pub procedures: ProcedureTable<'a>,
    /// The exported interface's signature: one procedure a line, then the types they reach
    /// (`type Name = …`), cut short where the server may not send more; empty when there is none.
    pub signature: &'a [u8],
}

/// The procedure table of a refusal: how many procedures the interface has, and the encoded
/// entries ([`PROCEDURE_LEN`] bytes each, a name hash and a shape hash) of the first of them, all of
/// them unless the server could not send more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProcedureTable<'a> {
    /// How many procedures the exported interface has.
    pub total: u16,
    /// The entries that travel.
    pub entries: &'a [u8],
}

impl ProcedureTable<'_> {
    /// The entries of `procedures`, encoded.
    pub fn encode(procedures: &[crate::bind::ProcedureShape]) -> Vec<u8> {
        procedures.iter().flat_map(|p| p.name.to_le_bytes().into_iter().chain(p.shape.to_le_bytes())).collect()
    }

    /// The procedures whose entries travel, in order.
    pub fn shapes(&self) -> impl Iterator<Item = crate::bind::ProcedureShape> + '_ {
        self.entries.chunks_exact(PROCEDURE_LEN).map(|e| crate::bind::ProcedureShape {
            name: u32::from_le_bytes([e[0], e[1], e[2], e[3]]),
            shape: u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
        })
    }

    /// Whether every procedure's entry travels.
    pub fn is_whole(&self) -> bool {
        self.entries.len() / PROCEDURE_LEN == usize::from(self.total)
    }
}

impl BindRefusal<'_> {
    /// A refusal telling nothing of an export (for want of one, of proof, or of room).
    pub fn nothing(nonce: u64, version: u32) -> BindRefusal<'static> {
        BindRefusal { nonce, version, fingerprint: 0, procedures: ProcedureTable::default(), signature: &[] }
    }

    /// The refusal as bytes, at most `limit` long (the table, then the signature, cut to fit).
    pub fn to_bytes(&self, limit: usize) -> Vec<u8> {
        use field::refusal as f;
        let room = limit.saturating_sub(REFUSAL_LEN);
        let entries = (self.procedures.entries.len() / PROCEDURE_LEN).min(room / PROCEDURE_LEN).min(u16::MAX.into());
        let table = entries * PROCEDURE_LEN;
        let keep = self.signature.len().min(room - table);
        let mut b = vec![0u8; REFUSAL_LEN + table + keep];
        b[f::NONCE].copy_from_slice(&self.nonce.to_le_bytes());
        b[f::VERSION].copy_from_slice(&self.version.to_le_bytes());
        b[f::FINGERPRINT].copy_from_slice(&self.fingerprint.to_le_bytes());
        b[f::PROCEDURES].copy_from_slice(&self.procedures.total.to_le_bytes());
        b[f::ENTRIES].copy_from_slice(&(entries as u16).to_le_bytes());
        b[f::TABLE..f::TABLE + table].copy_from_slice(&self.procedures.entries[..table]);
        b[f::TABLE + table..].copy_from_slice(&self.signature[..keep]);
        b
    }

    /// Decodes a refusal payload.
    pub fn parse(b: &[u8]) -> Option<BindRefusal<'_>> {
        use field::refusal as f;
        if b.len() < REFUSAL_LEN {
            return None;
        }
        let total = u16::from_le_bytes([b[f::PROCEDURES.start], b[f::PROCEDURES.start + 1]]);
        let entries = usize::from(u16::from_le_bytes([b[f::ENTRIES.start], b[f::ENTRIES.start + 1]]));
        let table_end = f::TABLE + entries * PROCEDURE_LEN;
        if entries > usize::from(total) || table_end > b.len() {
            return None;
        }
        Some(BindRefusal {
            nonce: u64_at(b, f::NONCE),
            version: u32_at(b, f::VERSION),
            fingerprint: u64_at(b, f::FINGERPRINT),
            procedures: ProcedureTable { total, entries: &b[f::TABLE..table_end] },
            signature: &b[table_end..],
        })
    }
}

#[cfg(test)]
mod tests;
