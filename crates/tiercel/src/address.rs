//! Server addresses: `udp://host:port` forces the UDP transport; a plain `host:port` lets the binder
//! choose (today UDP is the only transport, so it chooses UDP).

use std::net::{SocketAddr, ToSocketAddrs};

use crate::Error;

/// Which transport an address asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// The reliable packet-exchange protocol over UDP.
    Udp,
}

/// Something that names a server: a socket address, or a string such as `udp://127.0.0.1:7000`.
pub trait ToAddress {
    /// Resolves to a transport and a socket address.
    fn to_address(&self) -> Result<(Transport, SocketAddr), Error>;
}

impl ToAddress for SocketAddr {
    fn to_address(&self) -> Result<(Transport, SocketAddr), Error> {
        Ok((Transport::Udp, *self))
    }
}

impl ToAddress for str {
    fn to_address(&self) -> Result<(Transport, SocketAddr), Error> {
        let bad = |why: &str| Error::Address(self.to_owned(), why.to_owned());
        let (transport, rest) = match self.split_once("://") {
            Some(("udp", rest)) => (Transport::Udp, rest),
            Some((scheme, _)) => return Err(bad(&format!("unsupported transport {scheme:?} (supported: udp)"))),
            None => (Transport::Udp, self),
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
    fn to_address(&self) -> Result<(Transport, SocketAddr), Error> {
        (**self).to_address()
    }
}

impl ToAddress for String {
    fn to_address(&self) -> Result<(Transport, SocketAddr), Error> {
        self.as_str().to_address()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes() {
        assert_eq!("udp://127.0.0.1:7".to_address().unwrap(), (Transport::Udp, "127.0.0.1:7".parse().unwrap()));
        assert_eq!("127.0.0.1:7".to_address().unwrap().0, Transport::Udp);
        assert!(matches!("tcp://127.0.0.1:7".to_address(), Err(Error::Address(..))));
        assert!(matches!("nonsense".to_address(), Err(Error::Address(..))));
    }
}
