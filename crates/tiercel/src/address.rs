//! Server addresses: `udp://host:port` forces the UDP transport, `tcp://host:port` the TCP one,
//! `xdp://host:port` UDP through AF_XDP (see [`Transport::Xdp`]),
//! `shm:host:port` (or `shm://host:port`) forces shared memory with the server bound to that
//! address on this host, and a plain `host:port` lets the binder choose: shared memory when the
//! server is on this host and offers it, else UDP, else (no answer over UDP) TCP.

use std::net::{SocketAddr, ToSocketAddrs};

use crate::AddressError;

/// A transport: what an address asks for, and what a binding got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// The reliable packet-exchange protocol over UDP.
    Udp,
    /// Call slots in memory shared with a server process on the same host.
    SharedMemory,
    /// Length-framed messages on a TCP connection, for paths UDP does not take.
    Tcp,
    /// The packet-exchange protocol over UDP, each thread's datagrams sent and received through
    /// the interface's AF_XDP socket instead of the kernel's UDP stack (`xdp://host:port`; crate
    /// feature `xdp`, root, a server reached through an interface of this host's). A binding that asked for it and could not
    /// have it is over UDP, and [`Binding::xdp_refused`](crate::Binding::xdp_refused) says why.
    /// Compiled in and unused, the feature cost a UDP Null call +56 ns in the cost ledger's eighth
    /// run, within its spread (`docs/ledger.md`); through AF_XDP, a Null call across two network
    /// namespaces took 0.57 to 0.67 times the time of one over the kernel's UDP in four sets of
    /// three runs, and 1.20 times the raw AF_XDP ping-pong measured in turn with it (README).
    Xdp,
}

/// What a client imports from: a server's address, or a name servers export under (looked up in
/// a [`Registry`](crate::names::Registry) at each import).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A server's socket address.
    Addr(SocketAddr),
    /// A name (see [`crate::names`]).
    Name(String),
}

/// Something that names a server: a socket address, or a string such as `udp://127.0.0.1:7000`.
pub trait ToAddress {
    /// Resolves to the transport the address insists on (`None`: the binder chooses) and the server's
    /// socket address.
    fn to_address(&self) -> Result<(Option<Transport>, SocketAddr), AddressError>;

    /// [`ToAddress::to_address`], or a name for a client to look up: a string without a port
    /// (`accounts`, `udp://accounts`) is a name.
    fn to_target(&self) -> Result<(Option<Transport>, Target), AddressError> {
        self.to_address().map(|(transport, addr)| (transport, Target::Addr(addr)))
    }
}

impl ToAddress for SocketAddr {
    fn to_address(&self) -> Result<(Option<Transport>, SocketAddr), AddressError> {
        Ok((None, *self))
    }
}

/// The transport a string insists on, and the rest of it.
fn scheme(s: &str) -> Result<(Option<Transport>, &str), AddressError> {
    let bad = |why: &str| AddressError { address: s.to_owned(), reason: why.to_owned() };
    Ok(if let Some(rest) = s.strip_prefix("shm://").or_else(|| s.strip_prefix("shm:")) {
        (Some(Transport::SharedMemory), rest)
    } else {
        match s.split_once("://") {
            Some(("udp", rest)) => (Some(Transport::Udp), rest),
            Some(("tcp", rest)) => (Some(Transport::Tcp), rest),
            Some(("xdp", rest)) => (Some(Transport::Xdp), rest),
            Some((scheme, _)) => {
                return Err(bad(&format!("unsupported transport {scheme:?} (supported: udp, tcp, shm, xdp)")))
            }
            None => (None, s),
        }
    })
}

impl ToAddress for str {
    fn to_target(&self) -> Result<(Option<Transport>, Target), AddressError> {
        let (transport, rest) = scheme(self)?;
        if rest.contains(':') {
            return self.to_address().map(|(transport, addr)| (transport, Target::Addr(addr)));
        }
        if !crate::names::valid_name(rest) {
            return Err(AddressError {
                address: self.to_owned(),
                reason: "neither host:port nor a name (1 to 128 ASCII letters, digits, '.', '_' or '-')".to_owned(),
            });
        }
        Ok((transport, Target::Name(rest.to_owned())))
    }

    fn to_address(&self) -> Result<(Option<Transport>, SocketAddr), AddressError> {
        let bad = |why: &str| AddressError { address: self.to_owned(), reason: why.to_owned() };
        let (transport, rest) = scheme(self)?;
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
    fn to_target(&self) -> Result<(Option<Transport>, Target), AddressError> {
        (**self).to_target()
    }
}

impl ToAddress for String {
    fn to_address(&self) -> Result<(Option<Transport>, SocketAddr), AddressError> {
        self.as_str().to_address()
    }
    fn to_target(&self) -> Result<(Option<Transport>, Target), AddressError> {
        self.as_str().to_target()
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
        assert_eq!("tcp://127.0.0.1:7".to_address().unwrap().0, Some(Transport::Tcp));
        assert_eq!("xdp://10.0.0.2:7".to_address().unwrap().0, Some(Transport::Xdp));
        let err = "sctp://127.0.0.1:7".to_address().unwrap_err();
        assert_eq!(err.address, "sctp://127.0.0.1:7");
        assert!("nonsense".to_address().is_err());
    }

    #[test]
    fn a_string_without_a_port_is_a_name() {
        assert_eq!("accounts".to_target().unwrap(), (None, Target::Name("accounts".into())));
        assert_eq!("udp://accounts".to_target().unwrap(), (Some(Transport::Udp), Target::Name("accounts".into())));
        assert_eq!(
            "shm:billing.v2".to_target().unwrap(),
            (Some(Transport::SharedMemory), Target::Name("billing.v2".into()))
        );
        assert_eq!("127.0.0.1:7".to_target().unwrap(), (None, Target::Addr("127.0.0.1:7".parse().unwrap())));
        assert!("a/b".to_target().is_err());
        assert_eq!("tcp://accounts".to_target().unwrap(), (Some(Transport::Tcp), Target::Name("accounts".into())));
        assert!("sctp://accounts".to_target().is_err());
        // A name is no address to serve at.
        assert!("accounts".to_address().is_err());
    }
}
