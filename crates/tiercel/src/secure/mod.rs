//! Secure bindings: keys, the bind handshake, and every packet sealed.
//!
//! A server with a static key pair ([`Identity`]) takes secure bindings: the client, which knows
//! the server's public key ([`PublicKey`]), binds with a Noise handshake (pattern `IKpsk1`: one
//! round trip, the client's own static key sent encrypted, the server's shared secret, if it has
//! one, mixed in as the pre-shared key) whose two messages carry the bind request and its answer.
//! The handshake gives the binding a key in each direction; from then on every packet of the
//! binding, both ways, is sealed with an AEAD ([`Cipher`]) under the outer header of
//! `tiercel_proto::seal` (the associated data), with the packet's number in its direction as the
//! nonce. So a nonce is never used twice with one key: a retransmission is sealed again with the
//! next number. The receiver drops a packet whose number its replay window has seen or has left
//! behind, before the packet is parsed. Every [`EPOCH_PACKETS`](tiercel_proto::seal::EPOCH_PACKETS) packets both sides move to the next
//! key, derived from the last by Noise's `REKEY`. `docs/security.md` gives each choice and why.
//!
//! The cryptography is the `snow` crate's (the handshake: X25519, BLAKE2s) and `aws-lc-rs`'s (the
//! AEADs); nothing here is more than their use.

use std::fmt;
use std::io::IoSlice;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tiercel_proto::seal::{self, Outer, ReplayWindow, SealType, LAST_COUNTER, OUTER_LEN, TAG_LEN};
use tiercel_proto::stream::PREFIX_LEN;

mod endorse;
mod handshake;
mod known;

pub(crate) use endorse::unix_now;
pub use endorse::{Authority, AuthorityKey, Endorsement, NotEndorsed};
pub use known::{KnownError, KnownServers};

pub(crate) use handshake::{Hello, Keys, Responder, HANDSHAKE_ROOM};

/// Length of a key, public or private.
pub const KEY_LEN: usize = 32;

/// An X25519 public key: who a server (or a client) is. Written and read as 64 hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicKey(pub [u8; KEY_LEN]);

impl PublicKey {
    /// The key in a file written by [`Identity::write`] (`NAME.pub`), or any file whose first
    /// line is the key's hex.
    pub fn from_file(path: impl AsRef<Path>) -> Result<PublicKey, KeyError> {
        parse_file(path.as_ref())
    }
}

/// What the text of the file at `path` parses as, trimmed; errors name the file.
fn parse_file<T: std::str::FromStr<Err = KeyError>>(path: &Path) -> Result<T, KeyError> {
    let text = std::fs::read_to_string(path).map_err(|e| KeyError(format!("{}: {e}", path.display())))?;
    text.trim().parse().map_err(|KeyError(m)| KeyError(format!("{}: {m}", path.display())))
}

/// Writes `bytes` in hex.
fn write_hex(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    bytes.iter().try_for_each(|b| write!(f, "{b:02x}"))
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

impl std::str::FromStr for PublicKey {
    type Err = KeyError;

    /// 64 hex digits.
    fn from_str(s: &str) -> Result<PublicKey, KeyError> {
        Ok(PublicKey(hex32(s.trim()).ok_or_else(|| KeyError(format!("`{s}` is not a key (64 hex digits)")))?))
    }
}

/// 32 bytes from 64 hex digits.
fn hex32(s: &str) -> Option<[u8; KEY_LEN]> {
    let s = s.as_bytes();
    if s.len() != 2 * KEY_LEN {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; KEY_LEN];
    for (o, pair) in out.iter_mut().zip(s.chunks(2)) {
        *o = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

/// Why a key could not be made, read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("key: {0}")]
pub struct KeyError(pub String);

/// A static X25519 key pair: a server's identity (and a client's, where the server should know
/// it). Its `Debug` output shows only the public half.
#[derive(Clone)]
pub struct Identity {
    private: [u8; KEY_LEN],
    public: PublicKey,
}

impl Identity {
    /// A new key pair, from the operating system's random source.
    pub fn generate() -> Result<Identity, KeyError> {
        let pair = snow::Builder::new(handshake::params(Cipher::default()))
            .generate_keypair()
            .map_err(|e| KeyError(format!("could not make a key pair: {e}")))?;
        Identity::from_private(&pair.private)
    }

    /// The key pair of a private key.
    pub fn from_private(private: &[u8]) -> Result<Identity, KeyError> {
        let private: [u8; KEY_LEN] =
            private.try_into().map_err(|_| KeyError(format!("a private key has {KEY_LEN} bytes")))?;
        Ok(Identity { public: PublicKey(handshake::public_of(&private)), private })
    }

    /// The public half: what a client must know of the server.
    pub fn public(&self) -> PublicKey {
        self.public
    }

    pub(crate) fn public_bytes(&self) -> &[u8; KEY_LEN] {
        &self.public.0
    }

    pub(crate) fn private(&self) -> &[u8; KEY_LEN] {
        &self.private
    }

    /// The key pair in `path`, a file [`Identity::write`] made (64 hex digits). Like ssh with its
    /// keys, refuses a file that users other than its owner may read.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Identity, KeyError> {
        let path = path.as_ref();
        let bytes = crate::auth::read_private(path).map_err(KeyError)?;
        let private = std::str::from_utf8(&bytes)
            .ok()
            .and_then(|s| hex32(s.trim()))
            .ok_or_else(|| KeyError(format!("{}: not a private key (64 hex digits)", path.display())))?;
        Identity::from_private(&private)
    }

    /// Writes the private key to `path` (mode 0600) and the public key to `path` + `.pub`. Refuses
    /// to replace either file.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<(), KeyError> {
        let hex: String = self.private.iter().map(|b| format!("{b:02x}")).collect();
        write_new(path.as_ref(), &format!("{hex}\n"), &format!("{}\n", self.public))
    }
}

/// Writes a key pair's files: `private` to `path` (mode 0600), `public` to `path` + `.pub` (mode
/// 0644). Refuses to replace either file.
fn write_new(path: &Path, private: &str, public: &str) -> Result<(), KeyError> {
    let public_file = public_path(path);
    if public_file.exists() {
        return Err(KeyError(format!("{}: already exists", public_file.display())));
    }
    create_new(path, 0o600, private)?;
    create_new(&public_file, 0o644, public)
}

/// Makes the file `path` with `mode` and writes `text` into it; refuses to replace a file.
fn create_new(path: &Path, mode: u32, text: &str) -> Result<(), KeyError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .and_then(|mut file| file.write_all(text.as_bytes()))
        .map_err(|e| KeyError(format!("{}: {e}", path.display())))
}

/// Where [`Identity::write`] puts the public key of a private key written at `path`.
pub fn public_path(path: &Path) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".pub");
    name.into()
}

impl PartialEq for Identity {
    /// The same key pair: the public halves, derived from the private ones, are equal.
    fn eq(&self, other: &Identity) -> bool {
        self.public == other.public
    }
}

impl Eq for Identity {}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Identity({})", self.public)
    }
}

/// The AEAD that seals a secure binding's packets. The client chooses; a server takes either.
/// AES-256-GCM is the default: on this project's machines (which have AES-NI, VAES and carry-less
/// multiply), through `aws-lc-rs`, it sealed a 64-byte packet in 108 ns against ChaCha20-Poly1305's
/// 193 ns, 1,440 bytes in 270 ns against 762, and 64 KiB at 10.4 GB/s against 2.5, and it can
/// encrypt a large packet's body from where it lies (`docs/security.md`). ChaCha20-Poly1305 is for
/// CPUs without AES instructions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Cipher {
    /// AES-256 in Galois/counter mode.
    #[default]
    Aes256Gcm,
    /// ChaCha20 with the Poly1305 authenticator (RFC 8439).
    ChaCha20Poly1305,
}

impl Cipher {
    /// Its number in a handshake's first message.
    pub(crate) fn code(self) -> u32 {
        match self {
            Cipher::Aes256Gcm => 1,
            Cipher::ChaCha20Poly1305 => 2,
        }
    }

    pub(crate) fn from_code(code: u32) -> Option<Cipher> {
        match code {
            1 => Some(Cipher::Aes256Gcm),
            2 => Some(Cipher::ChaCha20Poly1305),
            _ => None,
        }
    }

    /// The name `tiercel` and the docs use.
    pub fn name(self) -> &'static str {
        match self {
            Cipher::Aes256Gcm => "aes-256-gcm",
            Cipher::ChaCha20Poly1305 => "chacha20-poly1305",
        }
    }
}

impl std::str::FromStr for Cipher {
    type Err = KeyError;

    fn from_str(s: &str) -> Result<Cipher, KeyError> {
        match s {
            "aes-256-gcm" | "aes" => Ok(Cipher::Aes256Gcm),
            "chacha20-poly1305" | "chacha" => Ok(Cipher::ChaCha20Poly1305),
            _ => Err(KeyError(format!("unknown cipher `{s}` (aes-256-gcm, chacha20-poly1305)"))),
        }
    }
}

/// Shortest last part of a packet (a call's arguments, a result) that [`Session::seal_into`]
/// encrypts where it lies rather than copying it into the sealing buffer first; shorter ones are
/// copied with the rest of the packet, as its header always is.
const SCATTER_FROM: usize = 4096;

/// How long the packet gathered from `parts` is once sealed.
fn sealed_len(parts: &[IoSlice<'_>]) -> usize {
    OUTER_LEN + parts.iter().map(|p| p.len()).sum::<usize>() + TAG_LEN
}

/// One direction's AEAD under one key.
#[derive(Clone)]
struct Aead {
    key: std::sync::Arc<aws_lc_rs::aead::LessSafeKey>,
    cipher: Cipher,
}

impl Aead {
    fn new(cipher: Cipher, key: &[u8; KEY_LEN]) -> Aead {
        let algorithm = match cipher {
            Cipher::Aes256Gcm => &aws_lc_rs::aead::AES_256_GCM,
            Cipher::ChaCha20Poly1305 => &aws_lc_rs::aead::CHACHA20_POLY1305,
        };
        // Both take 32-byte keys, which is all `UnboundKey::new` checks.
        let unbound = aws_lc_rs::aead::UnboundKey::new(algorithm, key)
            .unwrap_or_else(|_| unreachable!("a 32-byte key for a 32-byte-key AEAD"));
        Aead { key: std::sync::Arc::new(aws_lc_rs::aead::LessSafeKey::new(unbound)), cipher }
    }

    /// The 96-bit nonce of packet number `n`, encoded as Noise encodes it for the cipher.
    fn nonce(&self, n: u64) -> aws_lc_rs::aead::Nonce {
        let mut nonce = [0u8; 12];
        match self.cipher {
            Cipher::Aes256Gcm => nonce[4..].copy_from_slice(&n.to_be_bytes()),
            Cipher::ChaCha20Poly1305 => nonce[4..].copy_from_slice(&n.to_le_bytes()),
        }
        aws_lc_rs::aead::Nonce::assume_unique_for_key(nonce)
    }

    fn seal(&self, n: u64, ad: &[u8], buf: &mut [u8]) -> [u8; TAG_LEN] {
        let aad = aws_lc_rs::aead::Aad::from(ad);
        // Sealing fails only for messages beyond the cipher's limit (64 GiB), which no packet is.
        let tag = self.key.seal_in_place_separate_tag(self.nonce(n), aad, buf);
        tag.map(|t| {
            let mut out = [0u8; TAG_LEN];
            out.copy_from_slice(t.as_ref());
            out
        })
        .unwrap_or([0; TAG_LEN])
    }

    /// Seals `head` in place followed by `rest`, which it reads where it lies and encrypts into
    /// `rest_out_and_tag` (as long as `rest` and a tag): what [`Aead::seal`] of the two together
    /// would make, without first copying `rest`. False only when the lengths do not match.
    fn seal_scatter(&self, n: u64, ad: &[u8], head: &mut [u8], rest: &[u8], rest_out_and_tag: &mut [u8]) -> bool {
        let aad = aws_lc_rs::aead::Aad::from(ad);
        self.key.seal_in_place_scatter(self.nonce(n), aad, head, rest, rest_out_and_tag).is_ok()
    }

    /// Opens `body` in place, its tag given apart; true when it is authentic.
    fn open_separate(&self, n: u64, ad: &[u8], body: &mut [u8], tag: &[u8; TAG_LEN]) -> bool {
        let aad = aws_lc_rs::aead::Aad::from(ad);
        self.key.open_in_place_separate_tag(self.nonce(n), aad, tag, body).is_ok()
    }

    /// Opens `body` (its tag given apart) from where it lies into `out`, as long as it; true when
    /// it is authentic (`out` holds nothing to believe otherwise).
    fn open_gather(&self, n: u64, ad: &[u8], body: &[u8], tag: &[u8], out: &mut [u8]) -> bool {
        let aad = aws_lc_rs::aead::Aad::from(ad);
        self.key.open_separate_gather(self.nonce(n), aad, body, tag, out).is_ok()
    }

    /// Opens `sealed` (the encrypted bytes, then the tag) in place; true when it is authentic.
    fn open(&self, n: u64, ad: &[u8], sealed: &mut [u8]) -> bool {
        let aad = aws_lc_rs::aead::Aad::from(ad);
        self.key.open_in_place(self.nonce(n), aad, sealed).is_ok()
    }
}

/// Noise's `REKEY(k)`: the first 32 bytes of `ENCRYPT(k, 2^64 - 1, "", zeros)`.
fn rekey(cipher: Cipher, key: &[u8; KEY_LEN]) -> [u8; KEY_LEN] {
    let aead = Aead::new(cipher, key);
    let mut next = [0u8; KEY_LEN];
    aead.seal(u64::MAX, &[], &mut next);
    next
}

/// A key and the epoch it seals.
#[derive(Clone)]
struct Epoch {
    number: u64,
    key: [u8; KEY_LEN],
    aead: Aead,
}

impl Epoch {
    fn first(cipher: Cipher, key: [u8; KEY_LEN]) -> Epoch {
        Epoch { number: 0, aead: Aead::new(cipher, &key), key }
    }

    fn next(&self, cipher: Cipher) -> Epoch {
        let key = rekey(cipher, &self.key);
        Epoch { number: self.number + 1, aead: Aead::new(cipher, &key), key }
    }
}

/// The sending side's keys: this epoch's and the one before (for a thread that took its number
/// just before another moved on).
struct Sending {
    previous: Option<Epoch>,
    current: Epoch,
}

/// The receiving side's keys and replay window.
struct Receiving {
    window: ReplayWindow,
    previous: Option<Epoch>,
    current: Epoch,
    next: Option<Epoch>,
}

/// Why a packet could not be sealed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SealError {
    /// The binding has sealed its last packet number: it must be made again.
    Exhausted,
    /// The packet is too large for the buffer.
    TooLarge,
}

/// Why a sealed packet was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dropped {
    /// Not a sealed data packet of this binding.
    NotOurs,
    /// Its number was seen before, or is older than the window remembers: a replay, a duplicate.
    Replayed,
    /// It did not open: changed on the way, or sealed with other keys.
    Forged,
}

/// The keys of one secure binding, both ways, and the peer's static key.
pub(crate) struct Session {
    cipher: Cipher,
    /// The binding id: the outer header's index, both ways.
    index: u32,
    /// The peer's static public key, as it proved it in the handshake.
    peer: PublicKey,
    counter: AtomicU64,
    sending: Mutex<Sending>,
    receiving: Mutex<Receiving>,
    /// Packets that did not open (tampered, forged) and packets dropped as replays.
    pub(crate) forged: AtomicU64,
    pub(crate) replayed: AtomicU64,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Session({}, binding {}, peer {})", self.cipher.name(), self.index, self.peer)
    }
}

impl Session {
    pub(crate) fn new(
        cipher: Cipher,
        index: u32,
        peer: PublicKey,
        send: [u8; KEY_LEN],
        receive: [u8; KEY_LEN],
    ) -> Session {
        Session {
            cipher,
            index,
            peer,
            counter: AtomicU64::new(0),
            sending: Mutex::new(Sending { previous: None, current: Epoch::first(cipher, send) }),
            receiving: Mutex::new(Receiving {
                window: ReplayWindow::new(),
                previous: None,
                current: Epoch::first(cipher, receive),
                next: None,
            }),
            forged: AtomicU64::new(0),
            replayed: AtomicU64::new(0),
        }
    }

    /// The binding id, which the outer header names.
    pub(crate) fn index(&self) -> u32 {
        self.index
    }

    /// The peer's static public key.
    pub(crate) fn peer(&self) -> PublicKey {
        self.peer
    }

    /// The AEAD for packet number `n`, moving the sending side on to the next key as `n` enters a
    /// new epoch.
    fn sending_aead(&self, n: u64) -> Option<Aead> {
        let epoch = seal::epoch(n);
        let mut s = self.sending.lock().unwrap_or_else(|p| p.into_inner());
        while s.current.number < epoch {
            let next = s.current.next(self.cipher);
            s.previous = Some(std::mem::replace(&mut s.current, next));
        }
        if s.current.number == epoch {
            return Some(s.current.aead.clone());
        }
        s.previous.as_ref().filter(|p| p.number == epoch).map(|p| p.aead.clone())
    }

    /// Seals the packet gathered from `parts` into the front of `out`: outer header, the packet
    /// encrypted, its tag; returns its length. `out` only grows, and keeps its length between
    /// packets, so that a reused buffer is neither allocated nor zeroed again for each packet.
    pub(crate) fn seal_into(&self, parts: &[IoSlice<'_>], out: &mut Vec<u8>) -> Result<usize, SealError> {
        let len = sealed_len(parts);
        if len > tiercel_proto::wire::MAX_UDP_PAYLOAD + seal::SEAL_OVERHEAD {
            return Err(SealError::TooLarge);
        }
        if out.len() < len {
            out.resize(len, 0);
        }
        self.seal_in(parts, &mut out[..len])?;
        Ok(len)
    }

    /// Writes into `out` at `at` one record of a secure stream: a length prefix, then the bytes
    /// gathered from `parts` (any stretch of the stream) sealed as [`Session::seal_into`] seals a
    /// packet; returns where the record ends. `out` only grows, as `seal_into`'s does. The records
    /// of one stream are sealed in the order they are sent, so that their numbers rise along it.
    pub(crate) fn seal_record(&self, parts: &[IoSlice<'_>], out: &mut Vec<u8>, at: usize) -> Result<usize, SealError> {
        let len = sealed_len(parts);
        let end = at + PREFIX_LEN + len;
        if out.len() < end {
            out.resize(end, 0);
        }
        self.seal_in(parts, &mut out[at + PREFIX_LEN..end])?;
        out[at..at + PREFIX_LEN].copy_from_slice(&tiercel_proto::stream::prefix(len));
        Ok(end)
    }

    /// Seals the packet gathered from `parts` into `out`, which is exactly as long as the sealed
    /// packet ([`sealed_len`]).
    fn seal_in(&self, parts: &[IoSlice<'_>], out: &mut [u8]) -> Result<(), SealError> {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        if n > LAST_COUNTER {
            self.counter.store(LAST_COUNTER + 1, Ordering::Relaxed);
            return Err(SealError::Exhausted);
        }
        // A number from an epoch already left behind twice (a thread held up for a million
        // packets) is not used: the packet is lost, and its retransmission takes a fresh number.
        let aead = self.sending_aead(n).ok_or(SealError::Exhausted)?;
        let outer = Outer { kind: SealType::Data, index: self.index, counter: n }.to_bytes();
        let (ad, rest) = out.split_at_mut(OUTER_LEN);
        ad.copy_from_slice(&outer);
        // A large last part (a call's arguments, a result) is encrypted from where it lies into
        // the buffer, not copied there first, where the cipher does that at full speed (AES-GCM;
        // ChaCha20-Poly1305 is far slower that way in AWS-LC, so its packets are copied).
        let scatter = match parts.split_last() {
            Some((last, _)) if last.len() >= SCATTER_FROM && aead.cipher == Cipher::Aes256Gcm => Some(&**last),
            _ => None,
        };
        let copied = if scatter.is_some() { &parts[..parts.len() - 1] } else { parts };
        let mut at = 0;
        for p in copied {
            tiercel_proto::copy::copy(&mut rest[at..at + p.len()], p);
            at += p.len();
        }
        let (head, tail) = rest.split_at_mut(at);
        match scatter {
            None => {
                let sealed = aead.seal(n, ad, head);
                tail.copy_from_slice(&sealed);
                Ok(())
            }
            // Not met only if `tail` were not as long as `last` and a tag: the packet is not sent.
            Some(last) => match aead.seal_scatter(n, ad, head, last, tail) {
                true => Ok(()),
                false => Err(SealError::TooLarge),
            },
        }
    }

    /// Opens the sealed packet `buf` in place: on success the packet lies at
    /// `buf[OUTER_LEN..OUTER_LEN + len]` and its length is returned. A packet whose number the
    /// window has seen, or that does not open, is dropped and counted; nothing about it is
    /// believed.
    pub(crate) fn open_in_place(&self, buf: &mut [u8]) -> Result<usize, Dropped> {
        let outer = Outer::parse(buf).map_err(|_| Dropped::NotOurs)?;
        let len = buf.len() - OUTER_LEN - TAG_LEN;
        let (ad, sealed) = buf.split_at_mut(OUTER_LEN);
        self.open_with(outer, |aead, n| aead.open(n, ad, sealed))?;
        Ok(len)
    }

    /// Opens the sealed packet `sealed` into `out` (at least as long as the packet): its bytes are
    /// decrypted from where they arrived into where they go, as [`Session::open_in_place`] would
    /// leave them in place; returns their length. `sealed` is left as it was.
    pub(crate) fn open_into(&self, sealed: &[u8], out: &mut [u8]) -> Result<usize, Dropped> {
        let outer = Outer::parse(sealed).map_err(|_| Dropped::NotOurs)?;
        let len = sealed.len() - OUTER_LEN - TAG_LEN;
        let (ad, rest) = sealed.split_at(OUTER_LEN);
        let (body, tag) = rest.split_at(len);
        let out = out.get_mut(..len).ok_or(Dropped::NotOurs)?;
        self.open_with(outer, |aead, n| aead.open_gather(n, ad, body, tag, out))?;
        Ok(len)
    }

    /// Opens in place a sealed packet received in three parts: its outer header `outer`, its
    /// encrypted bytes `body` (the packet, once opened) and its tag, as
    /// [`Session::open_in_place`] opens a whole one.
    pub(crate) fn open_parts(
        &self,
        outer: &[u8; OUTER_LEN],
        body: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> Result<(), Dropped> {
        let parsed = Outer::from_header(outer).map_err(|_| Dropped::NotOurs)?;
        self.open_with(parsed, |aead, n| aead.open_separate(n, outer, body, tag))
    }

    /// The checks of a sealed packet with outer header `outer` around `open`, which opens it with
    /// the key and number given: the window first, then the key of its epoch, then, once it has
    /// opened, the window again (the packet taken).
    fn open_with(&self, outer: Outer, open: impl FnOnce(&Aead, u64) -> bool) -> Result<(), Dropped> {
        if outer.kind != SealType::Data || outer.index != self.index {
            return Err(Dropped::NotOurs);
        }
        let n = outer.counter;
        let epoch = seal::epoch(n);
        let aead = {
            let mut r = self.receiving.lock().unwrap_or_else(|p| p.into_inner());
            if !r.window.fresh(n) {
                self.replayed.fetch_add(1, Ordering::Relaxed);
                return Err(Dropped::Replayed);
            }
            let current = r.current.number;
            if epoch == current {
                r.current.aead.clone()
            } else if epoch + 1 == current {
                match &r.previous {
                    Some(p) => p.aead.clone(),
                    None => return Err(self.forged()),
                }
            } else if epoch == current + 1 {
                if r.next.is_none() {
                    r.next = Some(r.current.next(self.cipher));
                }
                r.next.as_ref().map(|e| e.aead.clone()).ok_or(Dropped::Forged)?
            } else {
                return Err(self.forged());
            }
        };
        if !open(&aead, n) {
            return Err(self.forged());
        }
        let mut r = self.receiving.lock().unwrap_or_else(|p| p.into_inner());
        if !r.window.take(n) {
            // The same packet, opened twice at once on two threads: one of them runs.
            self.replayed.fetch_add(1, Ordering::Relaxed);
            return Err(Dropped::Replayed);
        }
        if epoch == r.current.number + 1 {
            if let Some(next) = r.next.take() {
                r.previous = Some(std::mem::replace(&mut r.current, next));
            }
        }
        Ok(())
    }

    fn forged(&self) -> Dropped {
        self.forged.fetch_add(1, Ordering::Relaxed);
        Dropped::Forged
    }
}

/// Entry points for the fuzz targets (`fuzz/fuzz_targets/sealed.rs`): the sealed packet and the
/// handshake's messages read from arbitrary bytes, under fixed keys. Not part of the API.
#[doc(hidden)]
pub mod fuzzing {
    use super::*;

    fn pair() -> (Session, Session) {
        let (a, b) = ([1u8; KEY_LEN], [2u8; KEY_LEN]);
        let peer = PublicKey([3; KEY_LEN]);
        (Session::new(Cipher::default(), 9, peer, a, b), Session::new(Cipher::default(), 9, peer, b, a))
    }

    /// Opens `bytes` as a sealed packet of binding 9: whether they opened (they never should).
    pub fn open(bytes: &[u8]) -> bool {
        let (_, server) = pair();
        server.open_in_place(&mut bytes.to_vec()).is_ok()
    }

    /// Seals `packet`, flips bit `flip` of the sealed datagram (if any, and within it), and opens
    /// it: opened and equal to `packet` when nothing was flipped, dropped when a bit was.
    pub fn seal_and_open(packet: &[u8], flip: Option<usize>) -> Result<(), String> {
        let (client, server) = pair();
        let mut sealed = Vec::new();
        let n = client.seal_into(&[IoSlice::new(packet)], &mut sealed).map_err(|e| format!("{e:?}"))?;
        sealed.truncate(n);
        let flipped = flip.map(|bit| bit % (sealed.len() * 8));
        if let Some(bit) = flipped {
            sealed[bit / 8] ^= 1 << (bit % 8);
        }
        match (server.open_in_place(&mut sealed), flipped) {
            (Ok(n), None) if &sealed[OUTER_LEN..OUTER_LEN + n] == packet => Ok(()),
            (Err(_), Some(_)) => Ok(()),
            (got, flipped) => Err(format!("{got:?} with bit {flipped:?} flipped")),
        }
    }

    /// Reads `bytes` as a handshake's first message at a server with a fixed key: whether it was
    /// read (it never should be).
    pub fn read_hello(bytes: &[u8]) -> bool {
        let Ok(me) = Identity::from_private(&[4; KEY_LEN]) else { return false };
        let mut out = vec![0u8; bytes.len()];
        Responder::hello(&me, &[0; KEY_LEN], bytes, &mut out).is_some()
    }

    /// Reads `bytes` as the answer to a handshake: whether it opened (it never should).
    pub fn read_welcome(bytes: &[u8]) -> bool {
        let (Ok(me), Ok(server)) = (Identity::from_private(&[5; KEY_LEN]), Identity::from_private(&[4; KEY_LEN]))
        else {
            return false;
        };
        let Ok(mut hello) = Hello::new(&me, &server.public(), &[0; KEY_LEN], Cipher::default(), b"bind") else {
            return false;
        };
        let mut out = vec![0u8; bytes.len()];
        hello.welcome(bytes, &mut out).is_some()
    }
}

#[cfg(test)]
mod tests;
