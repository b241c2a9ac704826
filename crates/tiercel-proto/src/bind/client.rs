//! The client's side of binding: the request, the proof of a shared secret, and what an answer means.

use super::wire::{
    features, BindChallenge, BindGrant, BindProof, BindRefusal, BindRequest, ExportListing, KeyAnswer, Rendezvous,
    VersionRefusal, CHALLENGE_LEN, REQUEST_LEN,
};
use super::{InterfaceSpec, Keyed, ProcedureShape};
use crate::wire::{flags, Header, Kind, Packet, Status, HEADER_LEN};

/// Bytes of a bind request packet (header and padded request): large enough that a server's refusal,
/// never longer than the request, can carry the exported interface's signature, and small enough
/// for any IPv4 or IPv6 path without fragmentation (QUIC pads its first packet the same way).
pub const PADDED_REQUEST: usize = 1200;

/// The client's bind machine: makes the request and reads the answers to it.
#[derive(Debug, Clone)]
pub struct BindClient {
    request: BindRequest,
    flags: u8,
    /// The challenge last answered, once a server with a shared secret sent one.
    challenge: Option<[u8; CHALLENGE_LEN]>,
    /// This client's procedures, by name and shape.
    procedures: Vec<ProcedureShape>,
    /// Once the server's copy of the interface was found to differ and to agree on every procedure
    /// both have: the server's number for each of this client's procedures ([`ABSENT`] for those it
    /// lacks).
    map: Option<Vec<u16>>,
}

/// In [`BindClient::procedure_map`]: a procedure the server does not have.
pub const ABSENT: u16 = u16::MAX;

/// A binding granted by the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Granted {
    /// The binding's id on the server.
    pub binding: u32,
    /// The binding's capability token (0 through shared memory, where the region is the capability).
    pub token: u128,
    /// The server's incarnation.
    pub incarnation: u64,
    /// What the server granted.
    pub grant: BindGrant,
    /// Where the server's copy of the interface differs: its number for each of this client's
    /// procedures ([`ABSENT`] for one it lacks); `None` when the copies are the same
    /// ([`BindClient::procedure_map`]).
    pub procedures: Option<Vec<u16>>,
}

/// Why the server would not bind, as the client can tell it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal<'p> {
    /// No interface of that name is exported.
    UnknownInterface,
    /// Exported in another version; what the server exports.
    VersionMismatch(BindRefusal<'p>),
    /// Exported in the same version with other procedures or types, and the client could not match
    /// its procedures to the server's (the server did not send its whole table); what the server
    /// exports.
    InterfaceMismatch(BindRefusal<'p>),
    /// A procedure this client has is exported under the same name with another shape: the
    /// client's procedure number, and what the server exports.
    ProcedureMismatch {
        /// This client's number of the procedure that differs.
        procedure: usize,
        /// What the server exports.
        exported: BindRefusal<'p>,
    },
    /// The server wants proof of a shared secret and this client has none.
    AuthRequired,
    /// The secrets differ: the server refused the proof, or could not prove the secret back.
    AuthFailed(&'static str),
    /// The server has no room for another binding.
    Busy,
    /// The server takes only secure bindings, and this request came plain.
    KeyRequired,
    /// The server does not speak this client's protocol version; the range it speaks.
    ProtocolVersion {
        /// The oldest version the server speaks.
        min: u8,
        /// The newest.
        max: u8,
    },
}

/// What an answer did to the bind exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindEvent<'p> {
    /// Not an answer to this request (another nonce, another kind, malformed): ignore it.
    Ignored,
    /// The server asked for proof of the secret: send [`BindClient::packet`] again, now.
    SendAgain,
    /// Bound.
    Granted(Granted),
    /// Not bound: the server takes this client's bind through shared memory, at `rendezvous` (only
    /// ever the answer to a request that asked for it, proven like a grant).
    Rendezvous {
        /// Where, and which process must be found there.
        rendezvous: Rendezvous,
        /// The server's incarnation.
        incarnation: u64,
    },
    /// Refused: the exchange is over.
    Refused(Refusal<'p>),
    /// What the server exports at the index a listing request asked about.
    Listed(ExportListing<'p>),
    /// The server's static public key (`None`: it has none), as it told it to a request that asked.
    /// Not proven: a client binds securely with it to learn whether the server holds it.
    ServerKey(Option<[u8; 32]>),
}

impl BindClient {
    /// A request for `interface`, receiving datagrams of at most `max_datagram` bytes (0 through
    /// shared memory), with a random `nonce`, and the checksum flag if `checksum`.
    pub fn new(interface: &InterfaceSpec<'_>, max_datagram: u32, nonce: u64, checksum: bool) -> BindClient {
        BindClient {
            request: BindRequest {
                interface: interface.id,
                version: interface.version,
                max_datagram,
                nonce,
                fingerprint: interface.fingerprint,
                proof: None,
                rendezvous: false,
                features: features::ALL,
                list: false,
                ask_key: false,
            },
            flags: if checksum { flags::CHECKSUM } else { 0 },
            challenge: None,
            procedures: interface.procedures.to_vec(),
            map: None,
        }
    }

    /// Asks only for the protocol `features` given (of those this code speaks), as a client of an
    /// older version would.
    pub fn with_features(mut self, asked: u16) -> BindClient {
        self.request.features = asked & features::ALL;
        self
    }

    /// Where the server's copy of the interface differs from this client's and the bind went on by
    /// procedure names and shapes: the server's number for each of this client's procedures
    /// ([`ABSENT`] for one the server lacks). `None` when both copies are the same (a procedure's
    /// number is then the same on both sides).
    pub fn procedure_map(&self) -> Option<&[u16]> {
        self.map.as_deref()
    }

    /// Matches this client's procedures to `exported`'s table by name: the server's number for each,
    /// or the client's number of the first that the server has with another shape.
    fn match_procedures(&self, exported: &BindRefusal<'_>) -> Result<Vec<u16>, usize> {
        let theirs: Vec<ProcedureShape> = exported.procedures.shapes().collect();
        self.procedures
            .iter()
            .enumerate()
            .map(|(i, ours)| match theirs.iter().position(|t| t.name == ours.name) {
                Some(at) if theirs[at].shape == ours.shape => Ok(at as u16),
                Some(_) => Err(i),
                None => Ok(ABSENT),
            })
            .collect()
    }

    /// A request for what the server exports at `index` (an [`ExportListing`]) instead of a
    /// binding. A server with a shared secret asks for proof first, as for a binding.
    pub fn listing(index: u32, nonce: u64, checksum: bool) -> BindClient {
        BindClient::listing_from(index, 0, nonce, checksum)
    }

    /// [`BindClient::listing`] of the signature from byte `offset` on: a signature longer than one
    /// answer holds is asked for in pages (the version field of a listing request carries the
    /// offset).
    pub fn listing_from(index: u32, offset: u32, nonce: u64, checksum: bool) -> BindClient {
        let spec = InterfaceSpec {
            name: "",
            id: u64::from(index),
            version: offset,
            fingerprint: 0,
            signature: "",
            procedures: &[],
        };
        let mut c = BindClient::new(&spec, 0, nonce, checksum);
        c.request.list = true;
        c
    }

    /// A request for the server's static public key, not for a binding.
    pub fn asking_key(nonce: u64, checksum: bool) -> BindClient {
        let mut c = BindClient::listing_from(0, 0, nonce, checksum);
        (c.request.list, c.request.ask_key) = (false, true);
        c
    }

    /// The same request, asking for the server's shared-memory rendezvous instead of a binding (the
    /// client is on the server's host); a server without one answers with a binding all the same.
    pub fn asking_rendezvous(mut self) -> BindClient {
        self.request.rendezvous = true;
        self
    }

    /// The request as it stands: header and request padded to [`PADDED_REQUEST`] bytes in all (a
    /// checksum trailer, when asked for, is the transport's to add).
    pub fn packet(&self) -> Vec<u8> {
        let payload = (PADDED_REQUEST - HEADER_LEN).max(REQUEST_LEN);
        let h = Header {
            flags: self.flags,
            payload_len: payload as u32,
            message_len: payload as u32,
            ..Header::new(Kind::Bind)
        };
        let mut b = vec![0u8; HEADER_LEN + payload];
        b[..HEADER_LEN].copy_from_slice(&h.to_bytes());
        self.request.emit(&mut b[HEADER_LEN..]);
        b
    }

    /// Reads packet `p` received during the exchange; `secret` is the client's shared secret, if any.
    pub fn handle<'p>(&mut self, p: &Packet<&'p [u8]>, secret: Option<&dyn Keyed>) -> BindEvent<'p> {
        let payload: &'p [u8] = packet_payload(p);
        match (p.kind(), p.status()) {
            (Kind::BindReply, _) if self.request.ask_key => {
                match KeyAnswer::parse(payload).filter(|a| a.nonce == self.request.nonce) {
                    Some(answer) => BindEvent::ServerKey(answer.key),
                    None => BindEvent::Ignored,
                }
            }
            (Kind::BindReply, _) if self.request.list => {
                match ExportListing::parse(payload).filter(|l| l.nonce == self.request.nonce) {
                    Some(listing) => BindEvent::Listed(listing),
                    None => BindEvent::Ignored,
                }
            }
            (Kind::BindReply, _) => {
                let Some(grant) = BindGrant::parse(payload).filter(|g| g.nonce == self.request.nonce) else {
                    return BindEvent::Ignored;
                };
                let acceptable = match grant.rendezvous {
                    // A rendezvous answers only a request that asked for one, and grants nothing.
                    Some(_) => self.request.rendezvous && grant.slots == 0 && p.binding() == 0 && p.token() == 0,
                    None => grant.slots != 0,
                };
                if !acceptable || grant.version != self.request.version {
                    return BindEvent::Ignored;
                }
                let granted = Granted {
                    binding: p.binding(),
                    token: p.token(),
                    incarnation: p.incarnation(),
                    grant,
                    procedures: self.map.clone(),
                };
                if let Some(secret) = secret {
                    let (Some(proof), Some(challenge)) = (grant.proof, self.challenge) else {
                        return BindEvent::Refused(Refusal::AuthFailed(
                            "the server did not ask for the shared secret, so it cannot prove it holds it",
                        ));
                    };
                    let transcript = grant.proof_transcript(p.binding(), p.token(), p.incarnation(), &challenge);
                    if !secret.verify(&transcript, &proof) {
                        return BindEvent::Refused(Refusal::AuthFailed(
                            "the server's proof does not match this client's secret",
                        ));
                    }
                }
                match grant.rendezvous {
                    Some(rendezvous) => BindEvent::Rendezvous { rendezvous, incarnation: p.incarnation() },
                    None => BindEvent::Granted(granted),
                }
            }
            (Kind::Reject, Status::UnsupportedVersion) => {
                match VersionRefusal::parse(payload).filter(|r| r.nonce == self.request.nonce) {
                    Some(r) => BindEvent::Refused(Refusal::ProtocolVersion { min: r.min, max: r.max }),
                    None => BindEvent::Ignored,
                }
            }
            // Any other answer in a version this client does not speak is not one to it.
            _ if p.version() > crate::wire::VERSION => BindEvent::Ignored,
            (Kind::Reject, Status::AuthRequired) => {
                let Some(c) = BindChallenge::parse(payload).filter(|c| c.nonce == self.request.nonce) else {
                    return BindEvent::Ignored;
                };
                let Some(secret) = secret else { return BindEvent::Refused(Refusal::AuthRequired) };
                let request = BindRequest { proof: None, ..self.request };
                let mac = secret.prove(&request.proof_transcript(&c.challenge));
                self.request.proof = Some(BindProof { challenge: c.challenge, mac });
                self.challenge = Some(c.challenge);
                BindEvent::SendAgain
            }
            (Kind::Reject, status) => {
                let Some(r) = BindRefusal::parse(payload).filter(|r| r.nonce == self.request.nonce) else {
                    return BindEvent::Ignored;
                };
                BindEvent::Refused(match status {
                    Status::UnknownInterface => Refusal::UnknownInterface,
                    Status::VersionMismatch => Refusal::VersionMismatch(r),
                    // Another copy of the interface: bind by procedure names and shapes where the
                    // server sent its whole table and every procedure both have agrees (once: a
                    // second refusal ends the bind).
                    Status::InterfaceMismatch if self.map.is_none() && r.procedures.is_whole() => {
                        match self.match_procedures(&r) {
                            Err(procedure) => Refusal::ProcedureMismatch { procedure, exported: r },
                            Ok(map) => {
                                self.map = Some(map);
                                self.request.fingerprint = r.fingerprint;
                                if let (Some(secret), Some(proof)) = (secret, self.request.proof) {
                                    let request = BindRequest { proof: None, ..self.request };
                                    let mac = secret.prove(&request.proof_transcript(&proof.challenge));
                                    self.request.proof = Some(BindProof { challenge: proof.challenge, mac });
                                }
                                return BindEvent::SendAgain;
                            }
                        }
                    }
                    Status::InterfaceMismatch => Refusal::InterfaceMismatch(r),
                    Status::AuthFailed => {
                        Refusal::AuthFailed("the server refused this client's proof: the secrets differ")
                    }
                    Status::KeyRequired => Refusal::KeyRequired,
                    Status::Busy => Refusal::Busy,
                    // No server answers a bind request so: not an answer to it.
                    _ => return BindEvent::Ignored,
                })
            }
            _ => BindEvent::Ignored,
        }
    }
}

/// The payload of `p` with the lifetime of its buffer.
fn packet_payload<'p>(p: &Packet<&'p [u8]>) -> &'p [u8] {
    let b: &'p [u8] = p.into_inner();
    &b[HEADER_LEN..HEADER_LEN + p.payload_len() as usize]
}

#[cfg(test)]
mod tests;
