//! Payloads of the slow-path control packets: bind request and reply.

/// Encoded size of a [`BindRequest`].
pub const BIND_REQUEST_LEN: usize = 24;
/// Encoded size of a [`BindReply`].
pub const BIND_REPLY_LEN: usize = 20;

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
}

impl BindRequest {
    /// Encodes the request.
    pub fn to_bytes(&self) -> [u8; BIND_REQUEST_LEN] {
        let mut b = [0u8; BIND_REQUEST_LEN];
        b[0..8].copy_from_slice(&self.interface.to_le_bytes());
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&self.max_datagram.to_le_bytes());
        b[16..24].copy_from_slice(&self.nonce.to_le_bytes());
        b
    }
    /// Decodes a request payload.
    pub fn parse(b: &[u8]) -> Option<BindRequest> {
        if b.len() != BIND_REQUEST_LEN {
            return None;
        }
        Some(BindRequest {
            interface: u64::from_le_bytes(b[0..8].try_into().ok()?),
            version: u32::from_le_bytes(b[8..12].try_into().ok()?),
            max_datagram: u32::from_le_bytes(b[12..16].try_into().ok()?),
            nonce: u64::from_le_bytes(b[16..24].try_into().ok()?),
        })
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
}

impl BindReply {
    /// Encodes the reply.
    pub fn to_bytes(&self) -> [u8; BIND_REPLY_LEN] {
        let mut b = [0u8; BIND_REPLY_LEN];
        b[0..4].copy_from_slice(&self.slots.to_le_bytes());
        b[4..8].copy_from_slice(&self.max_datagram.to_le_bytes());
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..20].copy_from_slice(&self.nonce.to_le_bytes());
        b
    }
    /// Decodes a reply payload.
    pub fn parse(b: &[u8]) -> Option<BindReply> {
        if b.len() != BIND_REPLY_LEN {
            return None;
        }
        Some(BindReply {
            slots: u32::from_le_bytes(b[0..4].try_into().ok()?),
            max_datagram: u32::from_le_bytes(b[4..8].try_into().ok()?),
            version: u32::from_le_bytes(b[8..12].try_into().ok()?),
            nonce: u64::from_le_bytes(b[12..20].try_into().ok()?),
        })
    }
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
        let r = BindRequest { interface: 1 << 40, version: 3, max_datagram: 1472, nonce: 9 };
        assert_eq!(BindRequest::parse(&r.to_bytes()), Some(r));
        assert_eq!(BindRequest::parse(&[0; 5]), None);
        let g = BindReply { slots: 64, max_datagram: 65000, version: 3, nonce: 5 };
        assert_eq!(BindReply::parse(&g.to_bytes()), Some(g));
    }
}
