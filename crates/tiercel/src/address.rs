//! Server addresses: `udp://host:port` forces the UDP transport, `shm:host:port` (or
//! `shm://host:port`) forces shared memory with the server bound to that address on this host, and a
//! plain `host:port` lets the binder choose: shared memory when the server is on this host and offers
//! it, else UDP.

use std::net::{SocketAddr, ToSocketAddrs};

use crate::AddressError;

/// A transport: what an address asks for, and what a binding got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// The reliable packet-exchange protocol over UDP.
    Udp,
    /// Call slots in memory shared with a server process on the same host.
    SharedMemory,
}

/// Something that names a server: a socket address, or a string such as `udp://127.0.0.1:7000`.
pub trait ToAddress {
    /// Resolves to the transport the address insists on (`None`: the binder chooses) and the server's
    /// socket address.
    fn to_address(&self) -> Result<(Option<Transport>, SocketAddr), AddressError>;
}

impl ToAddress for SocketAddr {
    fn to_address(&self) -> Result<(Option<Transport>, SocketAddr), AddressError> {
        Ok((None, *self))
    }
}

impl ToAddress for str {
    fn to_address(&self) -> Result<(Option<Transport>, SocketAddr), AddressError> {
        let bad = |why: &str| AddressError { address: self.to_owned(), reason: why.to_owned() };
        let (transport, rest) = if let Some(rest) = self.strip_prefix("shm://").or_else(|| self.strip_prefix("shm:")) {
            (Some(Transport::SharedMemory), rest)
        } else {
            match self.split_once("://") {
                Some(("udp", rest)) => (Some(Transport::Udp), rest),
                Some((scheme, _)) => {
                    return Err(bad(&format!("unsupported transport {scheme:?} (supported: udp, shm)")))
                }
                None => (None, self),
            }
        };
        let addr = rest
            .to_socket_addrs()
            .map_err(|e| bad(&e.to_string()))?
            .next()
            .ok_or_else(|| bad("resolves to no address"))?;
        Ok((transport, addr))
    }
}

impl ToAddress for &str {
    fn to_address(&self) -> Result<(Option<Transport>, SocketAddr), AddressError> {
        (**self).to_address()
    }
}

impl ToAddress for String {
    fn to_address(&self) -> Result<(Option<Transport>, SocketAddr), AddressError> {
        self.as_str().to_address()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes() {
        assert_eq!("udp://127.0.0.1:7".to_address().unwrap(), (Some(Transport::Udp), "127.0.0.1:7".parse().unwrap()));
        assert_eq!("127.0.0.1:7".to_address().unwrap().0, None);
        assert_eq!(
            "shm:127.0.0.1:7".to_address().unwrap(),
            (Some(Transport::SharedMemory), "127.0.0.1:7".parse().unwrap())
        );
        assert_eq!("shm://127.0.0.1:7".to_address().unwrap().0, Some(Transport::SharedMemory));
        let err = "tcp://127.0.0.1:7".to_address().unwrap_err();
        assert_eq!(err.address, "tcp://127.0.0.1:7");
        assert!("nonsense".to_address().is_err());
    }
}
