//! AF_XDP under the packet-exchange protocol (feature `xdp`): the same packets as over UDP, sent and
//! received through an interface's AF_XDP socket, a [`Station`] of `tiercel-sys`, instead of the
//! kernel's UDP stack. Without the feature, [`Station`] is a type with no values, and every path
//! that would use one is never taken.
//!
//! A client's endpoint (a thread's, or one of the binding's async calls') keeps its own UDP socket,
//! connected to the server, which holds its port; the station steers that port's datagrams to
//! itself while the endpoint lives ([`Port`]). A server's station steers the server's port, and a worker of its own reads it; a
//! result goes back through the station to any peer whose frames arrive there.

use std::net::{SocketAddr, SocketAddrV4};
use std::sync::Arc;

#[cfg(feature = "xdp")]
pub(crate) use tiercel_sys::xdp::Station;

/// No station: this build has no AF_XDP (feature `xdp`).
#[cfg(not(feature = "xdp"))]
#[derive(Debug)]
pub(crate) enum Station {}

#[cfg(not(feature = "xdp"))]
impl Station {
    pub(crate) fn send(&self, _: u16, _: SocketAddrV4, _: &[&[u8]], _: bool) -> std::io::Result<usize> {
        match *self {}
    }
    pub(crate) fn recv(&self, _: u16, _: &mut [u8]) -> Option<(usize, SocketAddrV4)> {
        match *self {}
    }
    pub(crate) fn wait(&self, _: u16, _: Option<std::time::Duration>) -> std::io::Result<bool> {
        match *self {}
    }
    pub(crate) fn open_port(&self, _: u16) -> std::io::Result<()> {
        match *self {}
    }
    pub(crate) fn close_port(&self, _: u16) {
        match *self {}
    }
    pub(crate) fn batch(&self) {
        match *self {}
    }
}

/// A port steered to a station while this lives: a client endpoint's, or a server's.
pub(crate) struct Port {
    pub(crate) station: Arc<Station>,
    pub(crate) port: u16,
    /// Where the endpoint's datagrams go (a client's server).
    pub(crate) peer: SocketAddrV4,
}

impl Port {
    /// Steers `port` (held by a socket of the caller's) to `station`.
    pub(crate) fn open(station: &Arc<Station>, port: u16, peer: SocketAddrV4) -> std::io::Result<Port> {
        station.open_port(port)?;
        Ok(Port { station: station.clone(), port, peer })
    }

    /// Where [`crate::transmit::send_via`] sends the endpoint's datagrams.
    pub(crate) fn via(&self) -> Via<'_> {
        Via { station: &self.station, port: self.port, to: self.peer, heard_only: false }
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        self.station.close_port(self.port);
    }
}

/// A datagram's way out through a station: from `port` to `to`; with `heard_only`, only if the
/// station heard `to` (a server's answers: a peer heard through the kernel is answered through it).
#[derive(Clone, Copy)]
pub(crate) struct Via<'a> {
    pub(crate) station: &'a Station,
    pub(crate) port: u16,
    pub(crate) to: SocketAddrV4,
    pub(crate) heard_only: bool,
}

/// The station of the interface on the way to `server`, for a client's binding: an error says why
/// there is none (the binding then stays on the kernel's UDP).
pub(crate) fn station_for(server: SocketAddr) -> Result<Arc<Station>, String> {
    let SocketAddr::V4(server) = server else {
        return Err(format!("AF_XDP carries tiercel's packets over IPv4 only, and {server} is IPv6"));
    };
    if server.ip().is_loopback() {
        return Err(format!("{server} is on loopback, which has no AF_XDP path"));
    }
    open_toward(server)
}

#[cfg(feature = "xdp")]
fn open_toward(server: SocketAddrV4) -> Result<Arc<Station>, String> {
    let socket = tiercel_sys::udp::connect(server.into()).map_err(|e| format!("no route to {server}: {e}"))?;
    let local = match socket.local_addr() {
        Ok(SocketAddr::V4(a)) => *a.ip(),
        Ok(other) => return Err(format!("the way to {server} leaves from {other}, not IPv4")),
        Err(e) => return Err(format!("no route to {server}: {e}")),
    };
    let station = Station::holding(local).map_err(|e| format!("no AF_XDP socket on the interface of {local}: {e}"))?;
    // The hardware address of the next hop (the server, or the router on the way to it): the
    // kernel learned it for the bind's datagrams.
    match station.resolve(*server.ip()) {
        Ok(_) => Ok(station),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(not(feature = "xdp"))]
fn open_toward(_: SocketAddrV4) -> Result<Arc<Station>, String> {
    Err("this build of tiercel has no AF_XDP (its feature `xdp` is off)".to_owned())
}

/// The station of interface `ifname`, for a server; an error says why there is none.
#[cfg(feature = "xdp")]
pub(crate) fn station_on(ifname: &str) -> Result<Arc<Station>, String> {
    Station::on(ifname).map_err(|e| format!("no AF_XDP socket on {ifname}: {e}"))
}

#[cfg(not(feature = "xdp"))]
pub(crate) fn station_on(_: &str) -> Result<Arc<Station>, String> {
    Err("this build of tiercel has no AF_XDP (its feature `xdp` is off)".to_owned())
}

/// The way out through `station`, from `port`, to `to` (IPv4, or IPv4-mapped) if the station has
/// heard from it.
#[inline]
pub(crate) fn via_heard<'s>(station: &'s Station, port: u16, to: &SocketAddr) -> Option<Via<'s>> {
    let to = match to {
        SocketAddr::V4(a) => *a,
        SocketAddr::V6(a) => SocketAddrV4::new(a.ip().to_ipv4_mapped()?, a.port()),
    };
    Some(Via { station, port, to, heard_only: true })
}

/// What a server says of its station: the interface, and where the program runs.
#[cfg(feature = "xdp")]
pub(crate) fn describe(station: &Station) -> String {
    let hook = match station.mode() {
        tiercel_sys::xdp::Mode::Driver => "the driver's XDP hook",
        tiercel_sys::xdp::Mode::Generic => "the kernel's generic XDP hook (the driver has none)",
    };
    let queues = match station.queues() {
        1 => "its one queue".to_owned(),
        n => format!("its {n} queues"),
    };
    format!("AF_XDP on {} ({}), {queues}, in {hook}", station.ifname(), station.ip())
}

#[cfg(not(feature = "xdp"))]
pub(crate) fn describe(station: &Station) -> String {
    match *station {}
}
