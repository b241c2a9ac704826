//! The bind handshake of a secure binding: Noise `IKpsk1` (the `snow` crate), whose first message
//! carries the client's bind request and whose second carries the server's answer.
//!
//! ```text
//! client (Hello)                                   server (Responder)
//!   Hello {outer, e, es, s, ss, psk, [Bind]}  ──►  reads it with its static key and the psk: the
//!                                                  client's key is known and the request decrypted
//!          ◄── Welcome {outer, e, ee, se, [answer]}  the answer (a grant, a refusal) encrypted
//!   both split the handshake's chaining key: one key for each direction, then `Session`
//! ```
//!
//! A client that knows the wrong server key, or a secret the server does not have, gets no
//! answer that opens; a server impostor without the server's private key cannot read the request
//! nor write an answer that opens. The outer header of the `Hello` (its version and cipher) is the
//! handshake's prologue, so that neither can be changed on the way.

use snow::params::NoiseParams;
use snow::resolvers::{CryptoResolver, DefaultResolver};
use tiercel_proto::seal::{Outer, SealType, OUTER_LEN};

use super::{Cipher, Identity, KeyError, PublicKey, Session, KEY_LEN};

/// What the handshake adds to the bind request (the `Hello`'s outer header, ephemeral key,
/// encrypted static key and two tags), more than it adds to the answer.
pub(crate) const HANDSHAKE_ROOM: usize = OUTER_LEN + KEY_LEN + (KEY_LEN + 16) + 16;

/// Bytes of the first message's prologue before its outer header.
const PROLOGUE: &[u8] = b"tiercel secure bind 1";

/// The Noise protocol of a cipher.
pub(super) fn params(cipher: Cipher) -> NoiseParams {
    let name = match cipher {
        Cipher::Aes256Gcm => "Noise_IKpsk1_25519_AESGCM_BLAKE2s",
        Cipher::ChaCha20Poly1305 => "Noise_IKpsk1_25519_ChaChaPoly_BLAKE2s",
    };
    // Both names are valid Noise protocol names, which `snow` parses.
    name.parse().unwrap_or_else(|_| unreachable!("{name} is a Noise protocol name"))
}

/// The public key of an X25519 private key.
pub(super) fn public_of(private: &[u8; KEY_LEN]) -> [u8; KEY_LEN] {
    let mut out = [0u8; KEY_LEN];
    if let Some(mut dh) = DefaultResolver.resolve_dh(&snow::params::DHChoice::Curve25519) {
        dh.set(private);
        out.copy_from_slice(&dh.pubkey()[..KEY_LEN]);
    }
    out
}

fn prologue(outer: &[u8; OUTER_LEN]) -> Vec<u8> {
    [PROLOGUE, &outer[..]].concat()
}

fn failed(e: snow::Error) -> KeyError {
    KeyError(format!("handshake: {e}"))
}

/// A client's handshake in flight: the `Hello` datagram to send (and send again, unchanged, until
/// answered) and what reads the answer.
pub(crate) struct Hello {
    state: snow::HandshakeState,
    cipher: Cipher,
    server: PublicKey,
    /// The datagram: outer header and the first message.
    pub(crate) datagram: Vec<u8>,
    /// The request it carries.
    pub(crate) request: Vec<u8>,
}

impl Hello {
    /// Starts a handshake with the server whose key is `server`, carrying `request`.
    pub(crate) fn new(
        me: &Identity,
        server: &PublicKey,
        psk: &[u8; KEY_LEN],
        cipher: Cipher,
        request: &[u8],
    ) -> Result<Hello, KeyError> {
        let outer = Outer { kind: SealType::Hello, index: cipher.code(), counter: 0 }.to_bytes();
        let prologue = prologue(&outer);
        let mut state = snow::Builder::new(params(cipher))
            .local_private_key(me.private())
            .and_then(|b| b.remote_public_key(&server.0))
            .and_then(|b| b.psk(1, psk))
            .and_then(|b| b.prologue(&prologue))
            .and_then(|b| b.build_initiator())
            .map_err(failed)?;
        let mut datagram = vec![0u8; OUTER_LEN + request.len() + HANDSHAKE_ROOM];
        datagram[..OUTER_LEN].copy_from_slice(&outer);
        let n = state.write_message(request, &mut datagram[OUTER_LEN..]).map_err(failed)?;
        datagram.truncate(OUTER_LEN + n);
        Ok(Hello { state, cipher, server: *server, datagram, request: request.to_vec() })
    }

    /// Reads `datagram` as the server's `Welcome`: its answer, decrypted into `out`, and the
    /// binding's keys (made into a session once the answer names the binding). `None` for a
    /// datagram that is no answer to this handshake (forged, changed, another's): nothing changes.
    pub(crate) fn welcome(&mut self, datagram: &[u8], out: &mut [u8]) -> Option<(usize, Keys)> {
        let outer = Outer::parse(datagram).ok()?;
        if outer.kind != SealType::Welcome {
            return None;
        }
        let n = self.state.read_message(&datagram[OUTER_LEN..], out).ok()?;
        let (to_server, to_client) = self.state.dangerously_get_raw_split();
        Some((n, Keys { cipher: self.cipher, send: to_server, receive: to_client, peer: self.server }))
    }
}

/// The keys a handshake gave one side, and who the other side proved to be.
pub(crate) struct Keys {
    cipher: Cipher,
    send: [u8; KEY_LEN],
    receive: [u8; KEY_LEN],
    peer: PublicKey,
}

impl Keys {
    /// The session of binding `index` under these keys.
    pub(crate) fn session(self, index: u32) -> Session {
        Session::new(self.cipher, index, self.peer, self.send, self.receive)
    }

    /// The key the other side proved.
    pub(crate) fn peer(&self) -> PublicKey {
        self.peer
    }
}

/// A server's side of a handshake whose `Hello` it has read.
pub(crate) struct Responder {
    state: snow::HandshakeState,
    cipher: Cipher,
    client: PublicKey,
}

impl Responder {
    /// Reads the `Hello` in `datagram` with the server's key and pre-shared key: the request it
    /// carries is decrypted into `out`. `None` if it is no `Hello` this server can read (another
    /// server's key, another secret, changed on the way, an unknown cipher).
    pub(crate) fn hello(
        me: &Identity,
        psk: &[u8; KEY_LEN],
        datagram: &[u8],
        out: &mut [u8],
    ) -> Option<(Responder, usize)> {
        let outer = Outer::parse(datagram).ok()?;
        if outer.kind != SealType::Hello || outer.counter != 0 {
            return None;
        }
        let cipher = Cipher::from_code(outer.index)?;
        let mut header = [0u8; OUTER_LEN];
        header.copy_from_slice(&datagram[..OUTER_LEN]);
        let prologue = prologue(&header);
        let mut state = snow::Builder::new(params(cipher))
            .local_private_key(me.private())
            .and_then(|b| b.psk(1, psk))
            .and_then(|b| b.prologue(&prologue))
            .and_then(|b| b.build_responder())
            .ok()?;
        let n = state.read_message(&datagram[OUTER_LEN..], out).ok()?;
        let client = PublicKey(state.get_remote_static()?.try_into().ok()?);
        Some((Responder { state, cipher, client }, n))
    }

    /// The client's static key, as it proved it.
    pub(crate) fn client(&self) -> PublicKey {
        self.client
    }

    /// The `Welcome` carrying `answer`, and the binding's keys.
    pub(crate) fn welcome(mut self, answer: &[u8]) -> Option<(Vec<u8>, Keys)> {
        let outer = Outer { kind: SealType::Welcome, index: 0, counter: 0 }.to_bytes();
        let mut datagram = vec![0u8; OUTER_LEN + answer.len() + HANDSHAKE_ROOM];
        datagram[..OUTER_LEN].copy_from_slice(&outer);
        let n = self.state.write_message(answer, &mut datagram[OUTER_LEN..]).ok()?;
        datagram.truncate(OUTER_LEN + n);
        let (to_server, to_client) = self.state.dangerously_get_raw_split();
        Some((datagram, Keys { cipher: self.cipher, send: to_client, receive: to_server, peer: self.client }))
    }
}
