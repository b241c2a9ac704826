//! Payloads of the slow-path control packets: bind request and reply, and the challenge and proofs
//! of a server's optional shared secret (the hashing itself is the caller's: this crate has no crypto).

/// Encoded size of a [`BindRequest`] without a proof.
pub const BIND_REQUEST_LEN: usize = 24;
/// Encoded size of a [`BindReply`] without a proof.
pub const BIND_REPLY_LEN: usize = 20;
/// Bytes of a server's challenge.
pub const CHALLENGE_LEN: usize = 16;
/// Bytes of a proof of the shared secret (a keyed BLAKE3 hash).
pub const PROOF_LEN: usize = 32;

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
    /// The interface's stable id (a hash of its name).
    pub interface: u64,
    /// The interface version the client was generated from.
    pub version: u32,
    /// Largest datagram the client can receive.
    pub max_datagram: u32,
    /// A random number the reply echoes, so that a stale reply is not mistaken for this one.
    pub nonce: u64,
    /// Proof of the server's shared secret, once the server has asked for it.
    pub proof: Option<BindProof>,
}

impl BindRequest {
    /// Encodes the request: 24 bytes, or 72 with a proof.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(BIND_REQUEST_LEN + CHALLENGE_LEN + PROOF_LEN);
        b.extend_from_slice(&self.interface.to_le_bytes());
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&self.max_datagram.to_le_bytes());
        b.extend_from_slice(&self.nonce.to_le_bytes());
        if let Some(p) = &self.proof {
            b.extend_from_slice(&p.challenge);
            b.extend_from_slice(&p.mac);
        }
        b
    }

    /// Decodes a request payload.
    pub fn parse(b: &[u8]) -> Option<BindRequest> {
        let proof = match b.len() {
            BIND_REQUEST_LEN => None,
            n if n == BIND_REQUEST_LEN + CHALLENGE_LEN + PROOF_LEN => {
                Some(BindProof { challenge: b[24..40].try_into().ok()?, mac: b[40..72].try_into().ok()? })
            }
            _ => return None,
        };
        Some(BindRequest {
            interface: u64::from_le_bytes(b[0..8].try_into().ok()?),
            version: u32::from_le_bytes(b[8..12].try_into().ok()?),
            max_datagram: u32::from_le_bytes(b[12..16].try_into().ok()?),
            nonce: u64::from_le_bytes(b[16..24].try_into().ok()?),
            proof,
        })
    }

    /// What the client's proof hashes: a label, the request's fields and the challenge.
    pub fn proof_transcript(&self, challenge: &[u8; CHALLENGE_LEN]) -> [u8; 56] {
        let mut t = [0u8; 56];
        t[..16].copy_from_slice(b"tiercel bind rq1");
        t[16..24].copy_from_slice(&self.interface.to_le_bytes());
        t[24..28].copy_from_slice(&self.version.to_le_bytes());
        t[28..32].copy_from_slice(&self.max_datagram.to_le_bytes());
        t[32..40].copy_from_slice(&self.nonce.to_le_bytes());
        t[40..56].copy_from_slice(challenge);
        t
    }
}

/// The server's grant. Binding id, token and incarnation travel in the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindReply {
    /// Client slots in the binding's slot table.
    pub slots: u32,
    /// Largest datagram either side will send on this binding.
    pub max_datagram: u32,
    /// The interface version the server exports (equal to the request's on success).
    pub version: u32,
    /// The request's nonce, echoed.
    pub nonce: u64,
    /// From a server with a shared secret: a keyed hash of the grant ([`BindReply::proof_transcript`]),
    /// so that the client knows the binding comes from a holder of the secret.
    pub proof: Option<[u8; PROOF_LEN]>,
}

impl BindReply {
    /// Encodes the reply: 20 bytes, or 52 with a proof.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(BIND_REPLY_LEN + PROOF_LEN);
        b.extend_from_slice(&self.slots.to_le_bytes());
        b.extend_from_slice(&self.max_datagram.to_le_bytes());
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&self.nonce.to_le_bytes());
        if let Some(p) = &self.proof {
            b.extend_from_slice(p);
        }
        b
    }

    /// Decodes a reply payload.
    pub fn parse(b: &[u8]) -> Option<BindReply> {
        let proof = match b.len() {
            BIND_REPLY_LEN => None,
            n if n == BIND_REPLY_LEN + PROOF_LEN => Some(b[20..52].try_into().ok()?),
            _ => return None,
        };
        Some(BindReply {
            slots: u32::from_le_bytes(b[0..4].try_into().ok()?),
            max_datagram: u32::from_le_bytes(b[4..8].try_into().ok()?),
            version: u32::from_le_bytes(b[8..12].try_into().ok()?),
            nonce: u64::from_le_bytes(b[12..20].try_into().ok()?),
            proof,
        })
    }

    /// What the server's proof hashes: a label, the grant (binding id, token and incarnation from the
    /// header, and the reply's fields) and the challenge the client answered.
    pub fn proof_transcript(
        &self,
        binding: u32,
        token: u128,
        incarnation: u64,
        challenge: &[u8; CHALLENGE_LEN],
    ) -> [u8; 80] {
        let mut t = [0u8; 80];
        t[..16].copy_from_slice(b"tiercel bind ok1");
        t[16..20].copy_from_slice(&binding.to_le_bytes());
        t[20..36].copy_from_slice(&token.to_le_bytes());
        t[36..44].copy_from_slice(&incarnation.to_le_bytes());
        t[44..48].copy_from_slice(&self.slots.to_le_bytes());
        t[48..52].copy_from_slice(&self.max_datagram.to_le_bytes());
        t[52..56].copy_from_slice(&self.version.to_le_bytes());
        t[56..64].copy_from_slice(&self.nonce.to_le_bytes());
        t[64..80].copy_from_slice(challenge);
        t
    }
}

/// Payload of a `Reject` with status `AuthRequired` answering a `Bind`: the request's nonce and a
/// challenge the client must prove the shared secret over.
pub fn bind_challenge_payload(nonce: u64, challenge: &[u8; CHALLENGE_LEN]) -> [u8; 8 + CHALLENGE_LEN] {
    let mut b = [0u8; 8 + CHALLENGE_LEN];
    b[0..8].copy_from_slice(&nonce.to_le_bytes());
    b[8..].copy_from_slice(challenge);
    b
}

/// Decodes [`bind_challenge_payload`].
pub fn parse_bind_challenge(b: &[u8]) -> Option<(u64, [u8; CHALLENGE_LEN])> {
    if b.len() != 8 + CHALLENGE_LEN {
        return None;
    }
    Some((u64::from_le_bytes(b[0..8].try_into().ok()?), b[8..].try_into().ok()?))
}

/// Payload of a `Reject` answering a `Bind`: the request's nonce and the version the server exports
/// (0 when the interface is not exported at all).
pub fn bind_reject_payload(nonce: u64, exported_version: u32) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[0..8].copy_from_slice(&nonce.to_le_bytes());
    b[8..12].copy_from_slice(&exported_version.to_le_bytes());
    b
}

/// Decodes [`bind_reject_payload`].
pub fn parse_bind_reject(b: &[u8]) -> Option<(u64, u32)> {
    if b.len() != 12 {
        return None;
    }
    Some((u64::from_le_bytes(b[0..8].try_into().ok()?), u32::from_le_bytes(b[8..12].try_into().ok()?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_payloads_round_trip() {
        let mut r = BindRequest { interface: 1 << 40, version: 3, max_datagram: 1472, nonce: 9, proof: None };
        assert_eq!(r.to_bytes().len(), BIND_REQUEST_LEN);
        assert_eq!(BindRequest::parse(&r.to_bytes()), Some(r));
        r.proof = Some(BindProof { challenge: [7; CHALLENGE_LEN], mac: [8; PROOF_LEN] });
        assert_eq!(BindRequest::parse(&r.to_bytes()), Some(r));
        assert_eq!(BindRequest::parse(&[0; 5]), None);
        assert_eq!(BindRequest::parse(&[0; 25]), None);
        let mut g = BindReply { slots: 64, max_datagram: 65000, version: 3, nonce: 5, proof: None };
        assert_eq!(BindReply::parse(&g.to_bytes()), Some(g));
        g.proof = Some([1; PROOF_LEN]);
        assert_eq!(BindReply::parse(&g.to_bytes()), Some(g));
        assert_eq!(
            parse_bind_challenge(&bind_challenge_payload(5, &[3; CHALLENGE_LEN])),
            Some((5, [3; CHALLENGE_LEN]))
        );
    }

    #[test]
    fn transcripts_bind_every_field() {
        let r = BindRequest { interface: 1, version: 2, max_datagram: 3, nonce: 4, proof: None };
        let base = r.proof_transcript(&[0; CHALLENGE_LEN]);
        assert_ne!(base, r.proof_transcript(&[1; CHALLENGE_LEN]));
        assert_ne!(base, BindRequest { nonce: 5, ..r }.proof_transcript(&[0; CHALLENGE_LEN]));
        assert_ne!(base, BindRequest { interface: 9, ..r }.proof_transcript(&[0; CHALLENGE_LEN]));
        let g = BindReply { slots: 1, max_datagram: 2, version: 3, nonce: 4, proof: None };
        let base = g.proof_transcript(1, 2, 3, &[0; CHALLENGE_LEN]);
        assert_ne!(base, g.proof_transcript(1, 3, 3, &[0; CHALLENGE_LEN]));
        assert_ne!(base, g.proof_transcript(1, 2, 4, &[0; CHALLENGE_LEN]));
        assert_ne!(base, g.proof_transcript(2, 2, 3, &[0; CHALLENGE_LEN]));
    }
}
