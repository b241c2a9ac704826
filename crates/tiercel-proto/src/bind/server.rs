//! The server's side of binding: which requests get a binding, and what every other one is told.

use super::wire::{
    features, BindChallenge, BindGrant, BindRefusal, BindRequest, ExportListing, KeyAnswer, ProcedureTable, Rendezvous,
    VersionRefusal, CHALLENGE_LEN,
};
use super::{Challenges, InterfaceSpec, Keyed};
use crate::wire::{flags, Header, Kind, Packet, Status, CHECKSUM_LEN, HEADER_LEN};

/// Smallest datagram a binding uses, whatever the two sides ask for.
const MIN_DATAGRAM: usize = HEADER_LEN + 64;

/// A server's shared secret and the challenges it makes.
#[derive(Clone, Copy)]
pub struct ServerAuth<'a> {
    /// The secret clients must prove.
    pub secret: &'a dyn Keyed,
    /// Makes and checks challenges.
    pub challenges: &'a dyn Challenges,
}

impl core::fmt::Debug for ServerAuth<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("ServerAuth(..)")
    }
}

/// The server's bind machine: what it exports and how it authenticates. It keeps no state between
/// requests (challenges are stateless), so one serves every transport and thread.
#[derive(Debug, Clone, Copy)]
pub struct BindServer<'a> {
    /// The exported interfaces.
    pub exports: &'a [InterfaceSpec<'a>],
    /// The shared secret, if the server has one.
    pub auth: Option<ServerAuth<'a>>,
    /// This incarnation's boot id, written into every answer.
    pub incarnation: u64,
    /// Largest datagram the server sends or receives (0 through shared memory).
    pub max_datagram: usize,
    /// Whether the request came plain to a server that takes only secure bindings here: it is
    /// refused ([`Status::KeyRequired`]) and told nothing else, unless it asks where to bind
    /// through shared memory (admitted: the transport answers it with the rendezvous when the
    /// client is on this host, and with [`Admission::key_required`] otherwise).
    pub key_required: bool,
    /// The server's static public key, if it has one: told to a client that asks for it
    /// ([`KeyAnswer`]), which then binds securely with it.
    pub key: Option<&'a [u8; 32]>,
    /// Whether the transport adds the checksum trailer that the answer to a request flagged
    /// `CHECKSUM` is flagged for (UDP's plain packets). Where it does not (a stream, a sealed
    /// packet), such a request is malformed, rather than answered with a packet its sender cannot
    /// parse.
    pub trailers: bool,
}

/// Why a request got an answer instead of a binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The server has a secret and the request carried no proof: it was sent a challenge.
    Challenged,
    /// The proof was wrong or its challenge stale.
    AuthFailed,
    /// No interface of that name is exported.
    UnknownInterface,
    /// The interface is exported in another version.
    VersionMismatch,
    /// The interface is exported in the same version but with other procedures or types.
    InterfaceMismatch,
    /// The request is in a protocol version the server does not speak.
    ProtocolVersion,
    /// Not a bind: the request asked what the server exports, and was told.
    Listed,
    /// The request came plain to a server that takes only secure bindings.
    KeyRequired,
    /// Not a bind: the request asked for the server's public key, and was told.
    KeyTold,
}

impl Refused {
    /// Whether a connection's handshake (TCP, the shared-memory rendezvous) waits for another
    /// request after this answer, the `answered`-th on it: after a challenge the proof follows, and
    /// after an interface mismatch the client may bind again by procedure names; three requests at
    /// most (a request, its proof, its second form).
    pub fn expects_another(self, answered: u8) -> bool {
        matches!(self, Refused::Challenged | Refused::InterfaceMismatch) && answered < MAX_REQUESTS
    }
}

/// Most bind requests one connection's handshake may make.
pub const MAX_REQUESTS: u8 = 3;

/// What to do with a bind request.
#[derive(Debug)]
pub enum BindDecision {
    /// Send `packet` back; no binding is made.
    Answer {
        /// The answer: header and payload (a checksum trailer is the transport's to add when the
        /// header's flags ask for one).
        packet: Vec<u8>,
        /// Why.
        refused: Refused,
    },
    /// The request may have a binding, if the transport has room for one.
    Admit(Admission),
    /// Not a bind request, or a malformed one: count it and drop it.
    Malformed,
}

/// A request the server accepts: the transport makes the binding and answers with
/// [`Admission::grant`], or with [`Admission::busy`] when it has no room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    /// Index of the interface in [`BindServer::exports`].
    pub export: usize,
    /// The request.
    pub request: BindRequest,
    /// The challenge the client proved the secret over, if the server has one.
    challenge: Option<[u8; CHALLENGE_LEN]>,
    /// Flags the answers carry (the request's checksum flag).
    flags: u8,
    /// The binding's largest datagram (0 through shared memory).
    pub max_datagram: u32,
}

impl BindServer<'_> {
    /// Decides on a bind request `p` from `peer` (the source address's bytes, or a connection's id).
    /// No answer is longer than `budget` bytes (over UDP, the request's own length: the server never
    /// sends more than it was sent before the peer has proven anything).
    pub fn on_request(&self, p: &Packet<&[u8]>, peer: &[u8], budget: usize) -> BindDecision {
        let flags = p.flags() & flags::CHECKSUM;
        if flags != 0 && !self.trailers {
            return BindDecision::Malformed;
        }
        let answer = |status, payload: &[u8], refused| BindDecision::Answer {
            packet: self.packet(Kind::Reject, status, flags, 0, 0, payload),
            refused,
        };
        // A request in a protocol version this server does not speak: the versions it does (in
        // fewer bytes than the request, which is padded), and nothing else.
        if p.kind() == Kind::Bind && p.version() != crate::wire::VERSION {
            let Some(nonce) = VersionRefusal::nonce_of(p.payload()) else { return BindDecision::Malformed };
            let versions = VersionRefusal { nonce, min: crate::wire::MIN_VERSION, max: crate::wire::VERSION };
            return answer(Status::UnsupportedVersion, &versions.to_bytes(), Refused::ProtocolVersion);
        }
        let Some(req) = (p.kind() == Kind::Bind).then(|| BindRequest::parse(p.payload())).flatten() else {
            return BindDecision::Malformed;
        };
        let trailer = if flags != 0 { CHECKSUM_LEN } else { 0 };
        let room = budget.saturating_sub(HEADER_LEN + trailer);
        // The public key, to whoever asks (before the secret: it is no secret, and what it is
        // worth is proven only by the handshake made with it), in fewer bytes than the request.
        if req.ask_key {
            if crate::bind::wire::KEY_ANSWER_LEN > room {
                return BindDecision::Malformed;
            }
            let told = KeyAnswer { nonce: req.nonce, key: self.key.copied() };
            let packet = self.packet(Kind::BindReply, Status::Ok, flags, 0, 0, &told.to_bytes());
            return BindDecision::Answer { packet, refused: Refused::KeyTold };
        }
        if self.key_required && !req.rendezvous {
            let nothing = BindRefusal::nothing(req.nonce, 0);
            return answer(Status::KeyRequired, &nothing.to_bytes(room), Refused::KeyRequired);
        }
        // With a shared secret, nothing is told to a client (not even what is exported) before it
        // proves the secret over a fresh challenge.
        let mut challenge = None;
        if let Some(auth) = &self.auth {
            let Some(proof) = req.proof else {
                let c = BindChallenge { nonce: req.nonce, challenge: auth.challenges.challenge(peer, req.nonce) };
                return answer(Status::AuthRequired, &c.to_bytes(), Refused::Challenged);
            };
            let transcript = req.proof_transcript(&proof.challenge);
            if !auth.challenges.check(peer, req.nonce, &proof.challenge) || !auth.secret.verify(&transcript, &proof.mac)
            {
                let nothing = BindRefusal::nothing(req.nonce, 0);
                return answer(Status::AuthFailed, &nothing.to_bytes(room), Refused::AuthFailed);
            }
            challenge = Some(proof.challenge);
        }
        if req.list {
            let index = u32::try_from(req.interface).unwrap_or(u32::MAX);
            let spec = self.exports.get(index as usize);
            // The answer's fixed part and the whole name must fit in what the request allows (a
            // client pads its request): a request too short for them is dropped, not answered
            // with more than it brought.
            let name_len = spec.map_or(0, |s| s.name.len().min(u8::MAX as usize));
            if crate::bind::wire::LISTING_LEN + name_len > room {
                return BindDecision::Malformed;
            }
            let listing = ExportListing {
                nonce: req.nonce,
                count: self.exports.len() as u32,
                index,
                version: spec.map_or(0, |s| s.version),
                fingerprint: spec.map_or(0, |s| s.fingerprint),
                name: spec.map_or(&[][..], |s| s.name.as_bytes()),
                // From the offset the request's version field asks for (pages of a long signature).
                signature: spec.map_or(&[][..], |s| s.signature.as_bytes().get(req.version as usize..).unwrap_or(&[])),
            };
            let packet = self.packet(Kind::BindReply, Status::Ok, flags, 0, 0, &listing.to_bytes(room));
            return BindDecision::Answer { packet, refused: Refused::Listed };
        }
        // The export of the version asked for, where several versions are exported side by side;
        // else the first of that name, whose version the refusal tells.
        let named = |e: &InterfaceSpec<'_>| e.id == req.interface;
        let export = self.exports.iter().position(|e| named(e) && e.version == req.version);
        let Some(export) = export.or_else(|| self.exports.iter().position(named)) else {
            let nothing = BindRefusal::nothing(req.nonce, 0);
            return answer(Status::UnknownInterface, &nothing.to_bytes(room), Refused::UnknownInterface);
        };
        let spec = &self.exports[export];
        if spec.version != req.version || spec.fingerprint != req.fingerprint {
            let (status, refused) = if spec.version != req.version {
                (Status::VersionMismatch, Refused::VersionMismatch)
            } else {
                (Status::InterfaceMismatch, Refused::InterfaceMismatch)
            };
            // Each procedure's name and shape, so that a client whose copy differs can tell whether
            // the procedures it has agree with the server's (then it binds again by the server's
            // fingerprint), and which one differs where they do not.
            let table = ProcedureTable::encode(spec.procedures);
            let exported = BindRefusal {
                nonce: req.nonce,
                version: spec.version,
                fingerprint: spec.fingerprint,
                procedures: ProcedureTable { total: spec.procedures.len() as u16, entries: &table },
                signature: spec.signature.as_bytes(),
            };
            return answer(status, &exported.to_bytes(room), refused);
        }
        let max_datagram = match self.max_datagram {
            0 => 0,
            limit => (req.max_datagram as usize).min(limit.saturating_sub(trailer)).max(MIN_DATAGRAM) as u32,
        };
        BindDecision::Admit(Admission { export, request: req, challenge, flags, max_datagram })
    }

    fn packet(&self, kind: Kind, status: Status, flags: u8, binding: u32, token: u128, payload: &[u8]) -> Vec<u8> {
        let h = Header {
            status,
            flags,
            binding,
            token,
            incarnation: self.incarnation,
            payload_len: payload.len() as u32,
            message_len: payload.len() as u32,
            ..Header::new(kind)
        };
        let mut b = Vec::with_capacity(HEADER_LEN + payload.len());
        b.extend_from_slice(&h.to_bytes());
        b.extend_from_slice(payload);
        b
    }
}

impl Admission {
    /// The features granted: those of the request this code speaks.
    pub fn features(&self) -> u16 {
        self.request.features & features::ALL
    }

    /// The grant of binding `binding` with capability `token`, `slots` client slots and (through
    /// shared memory) `region` bytes of data per slot; proven with the secret if the server has one.
    pub fn grant(&self, server: &BindServer<'_>, binding: u32, token: u128, slots: u32, region: u64) -> Vec<u8> {
        let grant = BindGrant {
            slots,
            max_datagram: self.max_datagram,
            version: self.request.version,
            nonce: self.request.nonce,
            region,
            proof: None,
            rendezvous: None,
            features: self.features(),
        };
        self.reply(server, binding, token, grant)
    }

    /// Instead of a binding, where the server takes shared-memory binds: the answer to a request
    /// that asked for it ([`BindRequest::rendezvous`]) from a client on the server's host, proven
    /// with the secret like a grant.
    pub fn rendezvous(&self, server: &BindServer<'_>, rendezvous: Rendezvous) -> Vec<u8> {
        let grant = BindGrant {
            slots: 0,
            max_datagram: 0,
            version: self.request.version,
            nonce: self.request.nonce,
            region: 0,
            proof: None,
            rendezvous: Some(rendezvous),
            features: self.features(),
        };
        self.reply(server, 0, 0, grant)
    }

    fn reply(&self, server: &BindServer<'_>, binding: u32, token: u128, mut grant: BindGrant) -> Vec<u8> {
        if let (Some(auth), Some(challenge)) = (&server.auth, &self.challenge) {
            let transcript = grant.proof_transcript(binding, token, server.incarnation, challenge);
            grant.proof = Some(auth.secret.prove(&transcript));
        }
        server.packet(Kind::BindReply, Status::Ok, self.flags, binding, token, &grant.to_bytes())
    }

    /// The refusal of an admitted request that came plain to a server that takes only secure
    /// bindings, which asked for a rendezvous it is not to be told.
    pub fn key_required(&self, server: &BindServer<'_>) -> Vec<u8> {
        let spec = &server.exports[self.export];
        let refusal = BindRefusal::nothing(self.request.nonce, spec.version);
        server.packet(Kind::Reject, Status::KeyRequired, self.flags, 0, 0, &refusal.to_bytes(0))
    }

    /// The refusal of an admitted request for want of room (bindings, memory, threads).
    pub fn busy(&self, server: &BindServer<'_>) -> Vec<u8> {
        let spec = &server.exports[self.export];
        let refusal = BindRefusal::nothing(self.request.nonce, spec.version);
        server.packet(Kind::Reject, Status::Busy, self.flags, 0, 0, &refusal.to_bytes(0))
    }
}
