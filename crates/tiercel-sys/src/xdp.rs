//! AF_XDP (feature `xdp`): datagrams sent and received through an interface's queues without the
//! kernel's UDP stack, as U-Net proposed.
//!
//! * [`Steering`]: tiercel's XDP program (`bpf/steer.bpf.c`, built by `build.rs` with clang), loaded
//!   with `aya` and attached to an interface, in the driver's own XDP hook where the driver has one
//!   (veth does), else in the kernel's generic hook. It sends the UDP datagrams addressed to the
//!   ports given to it ([`Steering::steer_port`]) to the AF_XDP socket of the queue they arrived on,
//!   and everything else on to the kernel. It is attached through a BPF link, which the kernel
//!   removes when the last descriptor of it closes: when the `Steering` is dropped, or when the
//!   process ends however it ends.
//! * [`Xsk`]: an AF_XDP socket on one queue of the interface, with its UMEM (the frames it shares
//!   with the kernel) and its four rings (the `xdp` crate's), each frame copied in when sent and
//!   read in place when received.
//! * [`frame`]: Ethernet, IPv4 and UDP headers, made from a template and read with every length
//!   checked.
//!
//! Root (or `CAP_NET_ADMIN`, `CAP_NET_RAW` and `CAP_BPF`) is needed to load the program and open the
//! socket.

use std::io;
use std::os::fd::AsRawFd;

use xdp::nic::NicIndex;
use xdp::slab::{HeapSlab, Slab};

pub mod frame;
mod station;

pub use station::{Batch, Station, StationStats, Turn};

/// Where the XDP program runs on the interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// In the driver, before the kernel makes a socket buffer of the packet (veth, and most NICs'
    /// drivers).
    Driver,
    /// In the kernel's generic hook, after it made a socket buffer: for drivers without XDP.
    Generic,
}

/// The XDP program, loaded and attached to one interface. Dropped, it is detached.
pub struct Steering {
    /// The program and its maps; dropping it closes the link's descriptor, which detaches it.
    bpf: aya::Ebpf,
    ifindex: u32,
    mode: Mode,
}

impl std::fmt::Debug for Steering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Steering").field("ifindex", &self.ifindex).field("mode", &self.mode).finish()
    }
}

/// The program's object file, as `build.rs` made it (8-byte aligned, as the ELF parser wants).
#[cfg(tiercel_xdp_program)]
fn program() -> io::Result<&'static [u8]> {
    #[repr(C)]
    struct Aligned<T: ?Sized> {
        _align: [u64; 0],
        bytes: T,
    }
    static OBJECT: &Aligned<[u8]> =
        &Aligned { _align: [], bytes: *include_bytes!(concat!(env!("OUT_DIR"), "/steer.bpf.o")) };
    Ok(&OBJECT.bytes)
}

/// Why there is no program: `build.rs` could not build it.
#[cfg(not(tiercel_xdp_program))]
fn program() -> io::Result<&'static [u8]> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        concat!("tiercel-sys was built without its XDP program: ", env!("TIERCEL_XDP_MISSING")),
    ))
}

fn other(what: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("{what}: {e}"))
}

impl Steering {
    /// Loads the program and attaches it to the interface `ifname` (of this thread's network
    /// namespace): in the driver's hook, else in the generic one. It steers nothing until a port
    /// is given to it.
    pub fn attach(ifname: &str) -> io::Result<Steering> {
        let ifindex = ifindex(ifname)?;
        let mut bpf = aya::EbpfLoader::new().load(program()?).map_err(|e| other("loading the XDP program", e))?;
        let program: &mut aya::programs::Xdp = bpf
            .program_mut("tiercel_steer")
            .ok_or_else(|| other("the XDP program", "no tiercel_steer in it"))?
            .try_into()
            .map_err(|e| other("the XDP program", e))?;
        program.load().map_err(|e| other("loading the XDP program into the kernel", e))?;
        let mode = match program.attach_to_if_index(ifindex, aya::programs::XdpFlags::DRV_MODE) {
            Ok(_) => Mode::Driver,
            Err(_) => {
                program
                    .attach_to_if_index(ifindex, aya::programs::XdpFlags::SKB_MODE)
                    .map_err(|e| other(&format!("attaching the XDP program to {ifname}"), e))?;
                Mode::Generic
            }
        };
        Ok(Steering { bpf, ifindex, mode })
    }

    /// Where the program runs.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The interface's index.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// Steers the UDP datagrams addressed to `port` to the AF_XDP sockets.
    pub fn steer_port(&mut self, port: u16) -> io::Result<()> {
        let map = self.bpf.map_mut("tiercel_ports").ok_or_else(|| other("the XDP program", "no port map"))?;
        let mut ports: aya::maps::HashMap<_, u16, u8> =
            aya::maps::HashMap::try_from(map).map_err(|e| other("the port map", e))?;
        ports.insert(port.to_be(), 1, 0).map_err(|e| other("the port map", e))
    }

    /// Steers the datagrams addressed to `port` to the kernel again.
    pub fn unsteer_port(&mut self, port: u16) -> io::Result<()> {
        let map = self.bpf.map_mut("tiercel_ports").ok_or_else(|| other("the XDP program", "no port map"))?;
        let mut ports: aya::maps::HashMap<_, u16, u8> =
            aya::maps::HashMap::try_from(map).map_err(|e| other("the port map", e))?;
        ports.remove(&port.to_be()).map_err(|e| other("the port map", e))
    }

    /// Sends the datagrams the program steers from queue `queue` to `socket`.
    fn register(&mut self, queue: u32, socket: i32) -> io::Result<()> {
        let map = self.bpf.map_mut("tiercel_xsks").ok_or_else(|| other("the XDP program", "no socket map"))?;
        let mut sockets = aya::maps::XskMap::try_from(map).map_err(|e| other("the socket map", e))?;
        sockets.set(queue, socket, 0).map_err(|e| other("the socket map", e))
    }
}

/// The index of interface `ifname`.
pub fn ifindex(ifname: &str) -> io::Result<u32> {
    let name = std::ffi::CString::new(ifname).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    match NicIndex::lookup_by_name(&name)? {
        Some(nic) => Ok(nic.into()),
        None => Err(io::Error::new(io::ErrorKind::NotFound, format!("no interface {ifname}"))),
    }
}

/// An `ifreq` that names interface `ifname`, the rest zeroes.
fn ifreq(ifname: &str) -> io::Result<libc::ifreq> {
    // SAFETY: `ifreq` is plain data, for which all zeroes is a valid value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    let name = ifname.as_bytes();
    if name.is_empty() || name.len() >= request.ifr_name.len() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("no interface {ifname}")));
    }
    for (to, from) in request.ifr_name.iter_mut().zip(name) {
        *to = *from as libc::c_char;
    }
    Ok(request)
}

/// The hardware address of interface `ifname` of this thread's network namespace
/// (`SIOCGIFHWADDR`; sysfs shows the namespace it was mounted in, not this thread's).
pub fn mac_of(ifname: &str) -> io::Result<[u8; 6]> {
    let socket = std::net::UdpSocket::bind((std::net::Ipv4Addr::UNSPECIFIED, 0))?;
    let mut request = ifreq(ifname)?;
    // SAFETY: the descriptor is open for the call (held by `socket`), and `request` is an `ifreq`
    // with a NUL-terminated name, which SIOCGIFHWADDR reads and fills in.
    if unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFHWADDR, &mut request) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFHWADDR filled in the union's hardware address.
    let address = unsafe { request.ifr_ifru.ifru_hwaddr };
    let mut mac = [0u8; 6];
    for (to, from) in mac.iter_mut().zip(address.sa_data) {
        *to = from as u8;
    }
    Ok(mac)
}

/// The MTU of interface `ifname` of this thread's network namespace (`SIOCGIFMTU`): the longest IP
/// packet its frames carry.
pub fn mtu_of(ifname: &str) -> io::Result<usize> {
    let socket = std::net::UdpSocket::bind((std::net::Ipv4Addr::UNSPECIFIED, 0))?;
    let mut request = ifreq(ifname)?;
    // SAFETY: as in `mac_of`; SIOCGIFMTU fills in the union's MTU.
    if unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFMTU, &mut request) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFMTU filled in the union's MTU.
    let mtu = unsafe { request.ifr_ifru.ifru_mtu };
    usize::try_from(mtu).map_err(|_| io::Error::other("a negative MTU"))
}

/// The number of receive queues of interface `ifname` of this thread's network namespace: its
/// receive-only and combined channels (`SIOCETHTOOL`, `ETHTOOL_GCHANNELS`), or 1 when its driver
/// does not say (a driver without channels has one queue).
pub fn rx_queues(ifname: &str) -> io::Result<u32> {
    /// `struct ethtool_channels` of `<linux/ethtool.h>`.
    #[repr(C)]
    #[derive(Default)]
    struct Channels {
        cmd: u32,
        max_rx: u32,
        max_tx: u32,
        max_other: u32,
        max_combined: u32,
        rx_count: u32,
        tx_count: u32,
        other_count: u32,
        combined_count: u32,
    }
    const ETHTOOL_GCHANNELS: u32 = 0x3c;
    let socket = std::net::UdpSocket::bind((std::net::Ipv4Addr::UNSPECIFIED, 0))?;
    let mut request = ifreq(ifname)?;
    let mut channels = Channels { cmd: ETHTOOL_GCHANNELS, ..Channels::default() };
    request.ifr_ifru.ifru_data = (&mut channels as *mut Channels).cast();
    // SAFETY: the descriptor is open for the call (held by `socket`), `request` has a NUL-terminated
    // name and points at `channels`, an `ethtool_channels` that lives through the call, which
    // ETHTOOL_GCHANNELS fills in.
    if unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCETHTOOL, &mut request) } != 0 {
        let e = io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::EOPNOTSUPP) { Ok(1) } else { Err(e) };
    }
    Ok(channels.rx_count.saturating_add(channels.combined_count).max(1))
}

/// The hardware address the kernel's neighbor table holds for `ip` on interface `ifname` (of this
/// thread's network namespace), if it holds a complete one (`SIOCGARP`).
pub fn neighbor(ifname: &str, ip: std::net::Ipv4Addr) -> io::Result<Option<[u8; 6]>> {
    let socket = std::net::UdpSocket::bind((std::net::Ipv4Addr::UNSPECIFIED, 0))?;
    // SAFETY: `arpreq` is plain data, for which all zeroes is a valid value.
    let mut request: libc::arpreq = unsafe { std::mem::zeroed() };
    let name = ifname.as_bytes();
    if name.is_empty() || name.len() >= request.arp_dev.len() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("no interface {ifname}")));
    }
    for (to, from) in request.arp_dev.iter_mut().zip(name) {
        *to = *from as libc::c_char;
    }
    let address = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(ip.octets()) },
        sin_zero: [0; 8],
    };
    // SAFETY: `sockaddr_in` and `sockaddr` are both 16 bytes of plain data; `arp_pa` is read by
    // the kernel as the `sockaddr_in` its family says it is.
    request.arp_pa = unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(address) };
    // SAFETY: the descriptor is open for the call (held by `socket`), and `request` is an `arpreq`
    // with an IPv4 address and a NUL-terminated device name, which SIOCGARP reads and fills in.
    if unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCGARP, &mut request) } != 0 {
        let e = io::Error::last_os_error();
        // ENXIO: no entry.
        return if e.raw_os_error() == Some(libc::ENXIO) { Ok(None) } else { Err(e) };
    }
    if request.arp_flags & libc::ATF_COM == 0 {
        return Ok(None);
    }
    let mut mac = [0u8; 6];
    for (to, from) in mac.iter_mut().zip(request.arp_ha.sa_data) {
        *to = from as u8;
    }
    Ok(Some(mac))
}

/// The next hop from interface `ifname` toward `ip` (in this thread's network namespace), as the
/// kernel would route a datagram to `ip` out of `ifname` (`RTM_GETROUTE`, what `ip route get`
/// asks, so policy rules and every table count): the route's gateway, or `ip` itself when the
/// route has none (the host is on the link). An error when the kernel has no such route.
pub fn next_hop(ifname: &str, ip: std::net::Ipv4Addr) -> io::Result<std::net::Ipv4Addr> {
    use rustix::net::{netlink, AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};
    let socket = rustix::net::socket_with(AddressFamily::NETLINK, SocketType::RAW, SocketFlags::CLOEXEC, None)?;
    // The kernel answers at once; a second is for a kernel that does not.
    rustix::net::sockopt::set_socket_timeout(
        &socket,
        rustix::net::sockopt::Timeout::Recv,
        Some(std::time::Duration::from_secs(1)),
    )?;
    const SEQ: u32 = 1;
    rustix::net::sendto(
        &socket,
        &route_request(ip, ifindex(ifname)?, SEQ),
        SendFlags::empty(),
        &netlink::SocketAddrNetlink::new(0, 0),
    )?;
    let mut reply = [0u8; 4096];
    loop {
        let (got, _) = rustix::net::recv(&socket, &mut reply[..], RecvFlags::empty())?;
        if let Some(hop) = route_reply(&reply[..got], SEQ, ip) {
            return hop;
        }
    }
}

const RTM_NEWROUTE: u16 = 24;
const RTM_GETROUTE: u16 = 26;
const NLMSG_ERROR: u16 = 2;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
/// The lengths of `nlmsghdr` and `rtmsg`.
const NLMSG_HEADER: usize = 16;
const RTMSG: usize = 12;

/// A netlink request for the route to `ip` out of interface `oif`: `nlmsghdr`, `rtmsg`, and the
/// attributes `RTA_DST` and `RTA_OIF`, in the machine's byte order (the address in the network's).
fn route_request(ip: std::net::Ipv4Addr, oif: u32, seq: u32) -> Vec<u8> {
    const NLM_F_REQUEST: u16 = 1;
    const AF_INET: u8 = 2;
    let len = NLMSG_HEADER + RTMSG + 8 + 8;
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&RTM_GETROUTE.to_ne_bytes());
    m.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    // rtmsg: family, destination prefix length, then nothing asked of the rest.
    m.extend_from_slice(&[AF_INET, 32, 0, 0, 0, 0, 0, 0]);
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&8u16.to_ne_bytes());
    m.extend_from_slice(&RTA_DST.to_ne_bytes());
    m.extend_from_slice(&ip.octets());
    m.extend_from_slice(&8u16.to_ne_bytes());
    m.extend_from_slice(&RTA_OIF.to_ne_bytes());
    m.extend_from_slice(&oif.to_ne_bytes());
    m
}

/// What the kernel's reply `reply` (one datagram of netlink messages) says of the route to `ip`
/// asked in request `seq`: its gateway, else `ip`; the error it gave; or `None` when it holds no
/// answer to that request. Every length is checked: a reply that does not read is an error.
fn route_reply(reply: &[u8], seq: u32, ip: std::net::Ipv4Addr) -> Option<io::Result<std::net::Ipv4Addr>> {
    let bad = || Some(Err(io::Error::new(io::ErrorKind::InvalidData, "a route reply that does not read")));
    let u16_at = |b: &[u8], at: usize| b.get(at..at + 2).map(|x| u16::from_ne_bytes([x[0], x[1]]));
    let u32_at = |b: &[u8], at: usize| b.get(at..at + 4).map(|x| u32::from_ne_bytes([x[0], x[1], x[2], x[3]]));
    let mut rest = reply;
    while rest.len() >= NLMSG_HEADER {
        let (Some(len), Some(kind), Some(got_seq)) = (u32_at(rest, 0), u16_at(rest, 4), u32_at(rest, 8)) else {
            return bad();
        };
        let len = len as usize;
        if len < NLMSG_HEADER || len > rest.len() {
            return bad();
        }
        let (message, next) = (&rest[NLMSG_HEADER..len], &rest[len.next_multiple_of(4).min(rest.len())..]);
        rest = next;
        if got_seq != seq {
            continue;
        }
        if kind == NLMSG_ERROR {
            let Some(code) = u32_at(message, 0) else { return bad() };
            let code = code as i32;
            return Some(Err(if code < 0 {
                io::Error::from_raw_os_error(-code)
            } else {
                io::Error::other("the kernel acknowledged a route request without a route")
            }));
        }
        if kind != RTM_NEWROUTE || message.len() < RTMSG {
            return bad();
        }
        let mut attributes = &message[RTMSG..];
        let mut gateway = None;
        while attributes.len() >= 4 {
            let (Some(alen), Some(akind)) = (u16_at(attributes, 0), u16_at(attributes, 2)) else { return bad() };
            let alen = alen as usize;
            if alen < 4 || alen > attributes.len() {
                return bad();
            }
            if akind == RTA_GATEWAY {
                let Ok(octets) = <[u8; 4]>::try_from(&attributes[4..alen]) else { return bad() };
                gateway = Some(std::net::Ipv4Addr::from(octets));
            }
            attributes = &attributes[alen.next_multiple_of(4).min(attributes.len())..];
        }
        return Some(Ok(gateway.unwrap_or(ip)));
    }
    None
}

/// The name of the interface (of this thread's network namespace) that holds the IPv4 address
/// `ip`, if one does.
pub fn interface_of(ip: std::net::Ipv4Addr) -> io::Result<Option<String>> {
    Ok(interface_addresses()?.into_iter().find(|(_, a)| *a == ip).map(|(name, _)| name))
}

/// The IPv4 addresses of this thread's network namespace's interfaces, each with its interface's
/// name.
pub fn interface_addresses() -> io::Result<Vec<(String, std::net::Ipv4Addr)>> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `getifaddrs` fills `list` with a list it allocated, freed below with `freeifaddrs`.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut found = Vec::new();
    let mut at = list;
    while !at.is_null() {
        // SAFETY: `at` is an entry of the list `getifaddrs` made, not freed yet.
        let entry = unsafe { &*at };
        at = entry.ifa_next;
        if entry.ifa_addr.is_null() || entry.ifa_name.is_null() {
            continue;
        }
        // SAFETY: `ifa_addr` points to a socket address at least as long as its family says.
        if i32::from(unsafe { (*entry.ifa_addr).sa_family }) != libc::AF_INET {
            continue;
        }
        // SAFETY: an `AF_INET` address is a `sockaddr_in`.
        let address = unsafe { &*(entry.ifa_addr as *const libc::sockaddr_in) };
        // SAFETY: `ifa_name` is a NUL-terminated string of the list.
        let name = unsafe { std::ffi::CStr::from_ptr(entry.ifa_name) };
        let ip = std::net::Ipv4Addr::from(address.sin_addr.s_addr.to_ne_bytes());
        found.push((name.to_string_lossy().into_owned(), ip));
    }
    // SAFETY: `list` came from `getifaddrs` and is freed once; nothing of it is used after.
    unsafe { libc::freeifaddrs(list) };
    Ok(found)
}

/// Waits for one of the descriptors `fds` ([`Xsk`]s', kept open by their owner meanwhile) to be
/// readable, at most `timeout`.
fn poll_readable(fds: &[i32], timeout: Option<std::time::Duration>) -> io::Result<bool> {
    use rustix::event::{PollFd, PollFlags};
    let timeout = timeout.map(|t| rustix::event::Timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as i64,
        tv_nsec: i64::from(t.subsec_nanos()),
    });
    let poll = |polled: &mut [PollFd<'_>]| match rustix::event::poll(polled, timeout.as_ref()) {
        Ok(n) => Ok(n > 0),
        Err(rustix::io::Errno::INTR) => Ok(false),
        Err(e) => Err(e.into()),
    };
    if let [fd] = fds {
        // SAFETY: the caller keeps the descriptor open for the call (a station holds its sockets).
        let fd = unsafe { rustix::fd::BorrowedFd::borrow_raw(*fd) };
        return poll(&mut [PollFd::new(&fd, PollFlags::IN)]);
    }
    let borrowed: Vec<_> = fds
        .iter()
        // SAFETY: as above, for each descriptor.
        .map(|&fd| unsafe { rustix::fd::BorrowedFd::borrow_raw(fd) })
        .collect();
    let mut polled: Vec<_> = borrowed.iter().map(|fd| PollFd::new(fd, PollFlags::IN)).collect();
    poll(&mut polled)
}

/// An `epoll` set of `fds`, each for reading (level-triggered): readable while any of them is.
fn readiness_set(fds: &[i32]) -> io::Result<std::os::fd::OwnedFd> {
    use rustix::event::epoll::{self, CreateFlags, EventData, EventFlags};
    let set = epoll::create(CreateFlags::CLOEXEC)?;
    for &fd in fds {
        // SAFETY: the caller keeps the descriptors open for the call (a station holds its sockets);
        // the set holds no reference to a descriptor once it is closed.
        let fd = unsafe { rustix::fd::BorrowedFd::borrow_raw(fd) };
        epoll::add(&set, fd, EventData::new_u64(0), EventFlags::IN)?;
    }
    Ok(set)
}

/// `fd` (a station's readiness, [`Station::readiness`]) registered with the reactor of the current
/// tokio runtime, for reading: a task waits for it with `poll_read_ready` (feature `async`). Panics
/// outside a runtime.
#[cfg(feature = "async")]
pub fn register(fd: std::os::fd::OwnedFd) -> io::Result<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
    // SAFETY: the `AsyncFd` owns `fd`, which stays open, and the same descriptor, for its whole
    // life: nothing else can close it, and an `OwnedFd` always gives the one it holds.
    let registered = unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) };
    registered.map_err(io::Error::from)
}

/// Frames of the UMEM of an [`Xsk`] that sends, each 4 KiB: half for receiving (handed to the
/// kernel), half for sending.
pub const FRAMES: u32 = 4096;
/// Frames of the UMEM of an [`Xsk`] that only receives (a station's sockets on queues other than
/// its first), half of them handed to the kernel: 1,024 (4 MiB) each for up to 16 of them, fewer
/// beyond, down to 256 each for 63, so that together they hold at most 16,384 (64 MiB).
pub(crate) fn receiving_frames(receiving_queues: u32) -> u32 {
    let each = (16_384 / receiving_queues.max(1)).clamp(256, 1024);
    // A power of two: 1,024, 512 or 256.
    1 << (31 - each.leading_zeros())
}
/// Frames handed to the kernel for receiving, and the most read or sent at once.
const BATCH: usize = 64;

/// An AF_XDP socket on one queue of an interface, with its UMEM and rings.
pub struct Xsk {
    // Declared (and so dropped) before the UMEM, which must outlive them.
    socket: xdp::socket::XdpSocket,
    fill: xdp::FillRing,
    rx: xdp::RxRing,
    tx: xdp::TxRing,
    completion: xdp::CompletionRing,
    received: HeapSlab,
    sending: HeapSlab,
    /// Frames sent and not yet completed.
    in_flight: usize,
    /// Frames queued since the kernel was last told to send.
    unsent: usize,
    umem: xdp::Umem,
}

// SAFETY: an `Xsk` owns its socket, its UMEM mapping and its rings (mappings of the socket's),
// whose raw pointers point into those mappings and nowhere else; nothing of them is shared with
// another value, and every use takes `&mut self`, so moving the whole to another thread is sound
// (the kernel's side of the rings does not care which thread reads them).
unsafe impl Send for Xsk {}

impl std::fmt::Debug for Xsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Xsk").field("fd", &self.socket.raw_fd()).field("in_flight", &self.in_flight).finish()
    }
}

impl Xsk {
    /// Opens an AF_XDP socket on queue `queue` of the interface `steering` is attached to, with a
    /// UMEM of `frames` frames (half handed to the kernel for receiving), and has the program send
    /// that queue's steered datagrams to it. Copy mode: veth has no zero-copy.
    pub fn bind(steering: &mut Steering, queue: u32, frames: u32) -> io::Result<Xsk> {
        let config = xdp::umem::UmemCfgBuilder { frame_count: frames, ..Default::default() }
            .build()
            .map_err(|e| other("UMEM", e))?;
        let mut umem = xdp::Umem::map(config)?;
        let mut builder = xdp::socket::XdpSocketBuilder::new().map_err(|e| other("AF_XDP socket", e))?;
        let rings = xdp::RingConfigBuilder::default().build().map_err(|e| other("AF_XDP rings", e))?;
        let (rings, mut flags) = builder.build_rings(&umem, rings).map_err(|e| other("AF_XDP rings", e))?;
        let mut fill = rings.fill_ring;
        // SAFETY: the UMEM is kept in the `Xsk` with the socket and dropped after it (field order).
        unsafe { fill.enqueue(&mut umem, frames as usize / 2) };
        flags.force_copy();
        let socket = builder
            .bind(NicIndex::new(steering.ifindex), queue, flags)
            .map_err(|e| other("binding the AF_XDP socket", e))?;
        steering.register(queue, socket.raw_fd())?;
        let (Some(rx), Some(tx)) = (rings.rx_ring, rings.tx_ring) else {
            return Err(other("AF_XDP rings", "no receive or transmit ring"));
        };
        Ok(Xsk {
            socket,
            fill,
            rx,
            tx,
            completion: rings.completion_ring,
            received: HeapSlab::with_capacity(BATCH),
            sending: HeapSlab::with_capacity(BATCH),
            in_flight: 0,
            unsent: 0,
            umem,
        })
    }

    /// Sends `frame` (a whole Ethernet frame) now: copied into a UMEM frame, put on the transmit
    /// ring, and the kernel told (one `sendto`: copy mode transmits only when told). `Ok(false)`
    /// when every sending frame is still in flight.
    pub fn send(&mut self, frame: &[u8]) -> io::Result<bool> {
        self.reap();
        // SAFETY: the packet is pushed to the transmit ring below or given back to the UMEM, which
        // the `Xsk` owns; it never leaves it.
        let Some(mut packet) = (unsafe { self.umem.alloc() }) else { return Ok(false) };
        if let Err(e) = packet.append(frame) {
            self.umem.free_packet(packet);
            return Err(other("AF_XDP frame", e));
        }
        self.sending.push_front(packet);
        // SAFETY: the packet is of this `Xsk`'s UMEM, which outlives the socket (field order).
        let queued = unsafe { self.tx.send(&mut self.sending) };
        if queued == 0 {
            if let Some(packet) = self.sending.pop_back() {
                self.umem.free_packet(packet);
            }
            return Ok(false);
        }
        self.in_flight += queued;
        self.unsent += queued;
        self.kick()?;
        Ok(true)
    }

    /// Sends the frame that `parts` make, one after another (headers first): copied into a UMEM
    /// frame, as [`Xsk::send`] does with a whole frame. `Ok(false)` when every sending frame is still
    /// in flight.
    pub fn send_parts(&mut self, parts: &[&[u8]]) -> io::Result<bool> {
        if !self.queue_parts(parts)? {
            return Ok(false);
        }
        self.kick()?;
        Ok(true)
    }

    /// Puts the frame that `parts` make on the transmit ring, as [`Xsk::send_parts`] does, without
    /// telling the kernel: [`Xsk::kick`] sends every frame queued so. `Ok(false)` when every sending
    /// frame is still in flight.
    pub fn queue_parts(&mut self, parts: &[&[u8]]) -> io::Result<bool> {
        self.reap();
        // SAFETY: as in `send`.
        let Some(mut packet) = (unsafe { self.umem.alloc() }) else { return Ok(false) };
        for part in parts {
            if let Err(e) = packet.append(part) {
                self.umem.free_packet(packet);
                return Err(other("AF_XDP frame", e));
            }
        }
        self.sending.push_front(packet);
        // SAFETY: as in `send`.
        let queued = unsafe { self.tx.send(&mut self.sending) };
        if queued == 0 {
            if let Some(packet) = self.sending.pop_back() {
                self.umem.free_packet(packet);
            }
            return Ok(false);
        }
        self.in_flight += queued;
        self.unsent += queued;
        Ok(true)
    }

    /// Tells the kernel to send the frames queued: as many times as it takes (it sends a batch of
    /// them, 32 in copy mode, each time it is told).
    pub fn kick(&mut self) -> io::Result<()> {
        let times = self.unsent.div_ceil(32).max(1);
        self.unsent = 0;
        for _ in 0..times {
            self.wake()?;
        }
        Ok(())
    }

    /// Tells the kernel there is something to transmit.
    fn wake(&self) -> io::Result<()> {
        // SAFETY: the descriptor is the socket's, which `self` holds open for as long as this borrow.
        let fd = unsafe { rustix::fd::BorrowedFd::borrow_raw(self.socket.raw_fd()) };
        match rustix::net::send(fd, &[], rustix::net::SendFlags::DONTWAIT) {
            Ok(_) => Ok(()),
            // The transmit ring is being worked on, or full: the frames go when it is.
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::BUSY | rustix::io::Errno::NOBUFS) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Takes back the frames the kernel has sent.
    fn reap(&mut self) {
        if self.in_flight > 0 {
            self.in_flight -= self.completion.dequeue(&mut self.umem, BATCH);
        }
    }

    /// Waits until a frame may be there to read, at most `timeout` (true when there may be one).
    pub fn wait(&self, timeout: Option<std::time::Duration>) -> io::Result<bool> {
        poll_readable(&[self.socket.raw_fd()], timeout)
    }

    /// Reads the next frame received, if one is there, with `read`; its UMEM frame goes back to
    /// the kernel after. Never blocks.
    pub fn recv<R>(&mut self, read: impl FnOnce(&[u8]) -> R) -> Option<R> {
        if self.received.is_empty() {
            // SAFETY: the packets stay in `received` (of this `Xsk`) until given back to the UMEM.
            let got = unsafe { self.rx.recv(&self.umem, &mut self.received) };
            if got == 0 {
                return None;
            }
        }
        let packet = self.received.pop_back()?;
        let result = read(&packet);
        self.umem.free_packet(packet);
        // SAFETY: as in `bind`.
        unsafe { self.fill.enqueue(&mut self.umem, 1) };
        Some(result)
    }
}

impl AsRawFd for Xsk {
    /// The socket's descriptor, to wait on with `poll` when there is nothing to read.
    fn as_raw_fd(&self) -> i32 {
        self.socket.raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::{route_reply, route_request};
    use std::net::Ipv4Addr;

    /// A reply as the kernel makes it: `nlmsghdr` of `kind` and `seq`, then `body`.
    fn message(kind: u16, seq: u32, body: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&0u16.to_ne_bytes());
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(body);
        m
    }

    fn attribute(kind: u16, data: &[u8]) -> Vec<u8> {
        let mut a = Vec::new();
        a.extend_from_slice(&((4 + data.len()) as u16).to_ne_bytes());
        a.extend_from_slice(&kind.to_ne_bytes());
        a.extend_from_slice(data);
        a
    }

    /// A route of `attributes` (after an `rtmsg`).
    fn route(seq: u32, attributes: &[Vec<u8>]) -> Vec<u8> {
        let mut body = vec![2, 32, 0, 0, 254, 0, 0, 1, 0, 0, 0, 0];
        for a in attributes {
            body.extend_from_slice(a);
        }
        message(super::RTM_NEWROUTE, seq, &body)
    }

    const SERVER: Ipv4Addr = Ipv4Addr::new(10, 2, 0, 2);

    #[test]
    fn a_route_with_a_gateway_goes_through_it_and_one_without_reaches_the_host_itself() {
        let via = route(
            7,
            &[attribute(1, &SERVER.octets()), attribute(5, &[10, 1, 0, 1]), attribute(4, &3u32.to_ne_bytes())],
        );
        assert_eq!(route_reply(&via, 7, SERVER).unwrap().unwrap(), Ipv4Addr::new(10, 1, 0, 1));
        let on_link = route(7, &[attribute(1, &SERVER.octets()), attribute(4, &3u32.to_ne_bytes())]);
        assert_eq!(route_reply(&on_link, 7, SERVER).unwrap().unwrap(), SERVER);
        // The answer to another request is passed over.
        assert!(route_reply(&via, 8, SERVER).is_none());
        let both = [route(6, &[]), via.clone()].concat();
        assert_eq!(route_reply(&both, 7, SERVER).unwrap().unwrap(), Ipv4Addr::new(10, 1, 0, 1));
    }

    #[test]
    fn the_kernels_error_is_the_answer_and_a_reply_that_does_not_read_is_refused() {
        let unreachable = message(super::NLMSG_ERROR, 7, &(-101i32).to_ne_bytes());
        let e = route_reply(&unreachable, 7, SERVER).unwrap().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(101));
        // An attribute longer than its message, a message longer than the reply, a gateway of
        // five bytes: each refused, none read past its end.
        let mut long = route(7, &[attribute(5, &[10, 1, 0, 1])]);
        let at = long.len() - 8;
        long[at..at + 2].copy_from_slice(&200u16.to_ne_bytes());
        let mut cut = route(7, &[attribute(5, &[10, 1, 0, 1])]);
        cut.truncate(cut.len() - 3);
        let five = route(7, &[attribute(5, &[10, 1, 0, 1, 9])]);
        for reply in [long, cut, five] {
            let e = route_reply(&reply, 7, SERVER).unwrap().unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        }
        assert!(route_reply(&[1, 2, 3], 7, SERVER).is_none(), "shorter than a header: no message");
    }

    #[test]
    fn the_request_asks_for_the_route_to_the_address_out_of_the_interface() {
        let r = route_request(SERVER, 3, 7);
        assert_eq!(r.len(), 44);
        assert_eq!(u32::from_ne_bytes(r[0..4].try_into().unwrap()), 44);
        assert_eq!(u16::from_ne_bytes(r[4..6].try_into().unwrap()), super::RTM_GETROUTE);
        assert_eq!(&r[16..18], &[2, 32]);
        assert_eq!(&r[28..36], &attribute(1, &SERVER.octets())[..]);
        assert_eq!(&r[36..44], &attribute(4, &3u32.to_ne_bytes())[..]);
    }

    #[test]
    fn receiving_queues_share_a_budget_of_frames_in_powers_of_two() {
        use super::receiving_frames;
        assert_eq!([1, 15, 16, 17, 31, 32, 33, 63].map(receiving_frames), [1024, 1024, 1024, 512, 512, 512, 256, 256]);
        for queues in 1..64 {
            assert!(queues * receiving_frames(queues) <= 16_384, "{queues} queues");
        }
    }
}
