//! Sending one datagram gathered from parts, with the optional checksum trailer appended.

use std::io::{self, IoSlice};
use std::net::{SocketAddr, UdpSocket};

use tiercel_proto::wire::checksum;
use tiercel_sys::udp;

/// Most parts a datagram is gathered from, trailer included.
const MAX_PARTS: usize = crate::wire::MAX_SEGMENTS + 4;

/// Sends `parts` as one datagram (to `to`, or on a connected socket), followed by a CRC32C trailer of
/// them when `with_checksum` (the header in `parts` must then carry `flags::CHECKSUM`).
pub(crate) fn send(
    socket: &UdpSocket,
    to: Option<&SocketAddr>,
    parts: &[IoSlice<'_>],
    with_checksum: bool,
) -> io::Result<usize> {
    if !with_checksum {
        // The parts as they are (no copy of them behind a trailer).
        return send_plain(socket, to, parts);
    }
    let sum = checksum(parts.iter().map(|p| &**p)).to_le_bytes();
    let mut io = [IoSlice::new(&[]); MAX_PARTS];
    let n = parts.len().min(MAX_PARTS - 1);
    io[..n].copy_from_slice(&parts[..n]);
    io[n] = IoSlice::new(&sum);
    let k = n + 1;
    match to {
        Some(addr) => udp::send_gather_to(socket, addr, &io[..k]),
        None => udp::send_gather(socket, &io[..k]),
    }
}

/// Sends `parts` as they are, one datagram (to `to`, or on a connected socket).
#[inline(always)]
fn send_plain(socket: &UdpSocket, to: Option<&SocketAddr>, parts: &[IoSlice<'_>]) -> io::Result<usize> {
    match to {
        Some(addr) => udp::send_gather_to(socket, addr, parts),
        None => udp::send_gather(socket, parts),
    }
}

/// Sends `parts` as one datagram sealed with `seal` when the binding is secure, or as [`send`] does
/// otherwise. Sealed, the packet is gathered into this thread's sealing buffer (kept at its
/// largest, so that sending neither allocates nor zeroes it after the first packet) and encrypted
/// there. A packet that cannot be sealed (its binding used its last number) is not sent: to the
/// protocol, a lost packet.
pub(crate) fn send_as(
    socket: &UdpSocket,
    to: Option<&SocketAddr>,
    parts: &[IoSlice<'_>],
    with_checksum: bool,
    seal: Option<&crate::secure::Session>,
) -> io::Result<usize> {
    let Some(session) = seal else { return send(socket, to, parts, with_checksum) };
    SEALING.with(|buf| {
        let mut buf = buf.borrow_mut();
        let Ok(len) = session.seal_into(parts, &mut buf) else {
            return Err(io::Error::from(io::ErrorKind::WouldBlock));
        };
        crate::steps::mark(crate::steps::Point::Sealed);
        send_plain(socket, to, &[IoSlice::new(&buf[..len])])
    })
}

/// [`send_as`], through an AF_XDP station when `xdp` gives one (to its `to`; `to` and `socket`
/// then serve only a datagram too long for the interface's frames, or to a peer whose hardware
/// address the station does not have, which goes through the kernel).
///
/// A plain datagram through the kernel (no station, no seal, no trailer: every call and result of
/// a default binding) goes to the socket from here, without the calls of `send_as` and `send` on
/// its way (about 60 instructions a datagram, callgrind).
#[inline(always)]
pub(crate) fn send_via(
    xdp: Option<crate::xdp::Via<'_>>,
    socket: &UdpSocket,
    to: Option<&SocketAddr>,
    parts: &[IoSlice<'_>],
    with_checksum: bool,
    seal: Option<&crate::secure::Session>,
) -> io::Result<usize> {
    let Some(via) = xdp else {
        if seal.is_none() && !with_checksum {
            return send_plain(socket, to, parts);
        }
        return send_as(socket, to, parts, with_checksum, seal);
    };
    match send_xdp(via, parts, with_checksum, seal) {
        Err(e) if matches!(e.kind(), io::ErrorKind::InvalidInput | io::ErrorKind::NotFound) => {
            let to = to.copied().unwrap_or(SocketAddr::V4(via.to));
            send_as(socket, Some(&to), parts, with_checksum, seal)
        }
        sent => sent,
    }
}

/// Sends `parts` as one datagram through an AF_XDP station: with its checksum trailer, or sealed,
/// as [`send_as`] sends it through a socket.
#[inline(never)]
fn send_xdp(
    via: crate::xdp::Via<'_>,
    parts: &[IoSlice<'_>],
    with_checksum: bool,
    seal: Option<&crate::secure::Session>,
) -> io::Result<usize> {
    let Some(session) = seal else {
        let sum;
        let mut all: [&[u8]; MAX_PARTS] = [&[]; MAX_PARTS];
        let n = parts.len().min(MAX_PARTS - 1);
        for (to, from) in all.iter_mut().zip(&parts[..n]) {
            *to = from;
        }
        let mut k = n;
        if with_checksum {
            sum = checksum(parts.iter().map(|p| &**p)).to_le_bytes();
            all[k] = &sum;
            k += 1;
        }
        return via.station.send(via.port, via.to, &all[..k], via.heard_only);
    };
    SEALING.with(|buf| {
        let mut buf = buf.borrow_mut();
        let Ok(len) = session.seal_into(parts, &mut buf) else {
            return Err(io::Error::from(io::ErrorKind::WouldBlock));
        };
        crate::steps::mark(crate::steps::Point::Sealed);
        via.station.send(via.port, via.to, &[&buf[..len]], via.heard_only)
    })
}

/// Makes this thread's sealing buffer as large as any datagram at once, so that sealing never
/// allocates on a call: a thread that will seal calls it when it starts (a server's worker, a
/// client's endpoint), not on its first packet.
pub(crate) fn prepare_sealing() {
    SEALING.with(|buf| {
        let mut buf = buf.borrow_mut();
        let room = tiercel_proto::wire::MAX_UDP_PAYLOAD + tiercel_proto::seal::SEAL_OVERHEAD;
        buf.resize(room, 0);
    });
}

thread_local! {
    /// Where this thread seals the packets it sends.
    static SEALING: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Most datagrams of one segmented send ([`send_run`]).
pub(crate) const MAX_RUN: usize = udp::MAX_SEGMENTS;
/// Most parts of one segmented send: the kernel's `UIO_MAXIOV`.
const MAX_RUN_PARTS: usize = 1024;

/// Fragments waiting to go out together in one [`send_run`]. Its buffer is set up only when the
/// first is queued, so a flush of single-packet messages (every Null call's) costs nothing.
pub(crate) struct RunQueue<T> {
    items: Option<[T; MAX_RUN]>,
    len: usize,
}

impl<T: Copy + Default> RunQueue<T> {
    pub(crate) fn new() -> RunQueue<T> {
        RunQueue { items: None, len: 0 }
    }

    /// Queues `item` (at most [`MAX_RUN`]: the caller sends a full run first); returns how many
    /// are queued.
    pub(crate) fn push(&mut self, item: T) -> usize {
        debug_assert!(self.len < MAX_RUN, "a full run is sent before another fragment is queued");
        let items = self.items.get_or_insert([T::default(); MAX_RUN]);
        items[self.len.min(MAX_RUN - 1)] = item;
        self.len = (self.len + 1).min(MAX_RUN);
        self.len
    }

    /// The queued items, and the queue emptied.
    pub(crate) fn take(&mut self) -> &[T] {
        let len = std::mem::take(&mut self.len);
        self.items.as_ref().map_or(&[], |items| &items[..len])
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// How many full datagrams of `datagram` bytes (trailer included) one segmented send may carry;
/// below 2, segmentation is of no use and datagrams go one by one.
pub(crate) fn run_length(datagram: usize) -> usize {
    (udp::MAX_SEGMENTED / datagram.max(1)).min(MAX_RUN)
}

/// Sends several datagrams with one `sendmsg`, cut by the kernel (UDP segmentation offload): datagram
/// `i` is gathered from `parts[ends[i - 1]..ends[i]]`, followed by its CRC32C trailer when
/// `with_checksum`. Every datagram but the last must be `segment` bytes long (trailer included), at
/// most [`MAX_RUN`] of them. An error of [`udp::is_segmentation_refused`] means nothing went out.
pub(crate) fn send_run(
    socket: &UdpSocket,
    to: Option<&SocketAddr>,
    parts: &[IoSlice<'_>],
    ends: &[usize],
    with_checksum: bool,
    segment: usize,
) -> io::Result<usize> {
    let mut sums = [[0u8; 4]; MAX_RUN];
    let count = ends.len().min(MAX_RUN);
    if with_checksum {
        let mut start = 0;
        for (sum, &end) in sums.iter_mut().zip(&ends[..count]) {
            *sum = checksum(parts[start..end].iter().map(|p| &**p)).to_le_bytes();
            start = end;
        }
    }
    let mut io = [IoSlice::new(&[]); MAX_RUN_PARTS];
    let (mut k, mut start) = (0, 0);
    for (sum, &end) in sums.iter().zip(&ends[..count]) {
        let n = end - start;
        if k + n + 1 > MAX_RUN_PARTS {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        io[k..k + n].copy_from_slice(&parts[start..end]);
        k += n;
        if with_checksum {
            io[k] = IoSlice::new(sum);
            k += 1;
        }
        start = end;
    }
    udp::send_segments(socket, to, &io[..k], segment)
}

/// Whether a send that failed is, to the protocol, a lost packet that its timers recover: a full
/// socket buffer (`EAGAIN`, `ENOBUFS`) or a local firewall that dropped it (`EPERM`, what netfilter's
/// drop in the output path returns). Other errors (a bad address, a closed socket) are real failures.
pub(crate) fn is_loss(e: &io::Error) -> bool {
    const EPERM: i32 = 1;
    const ENOBUFS: i32 = 105;
    e.kind() == io::ErrorKind::WouldBlock || matches!(e.raw_os_error(), Some(EPERM | ENOBUFS))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_buffers_and_firewall_drops_are_losses_other_errors_are_not() {
        for errno in [1, 105, 11] {
            assert!(is_loss(&io::Error::from_raw_os_error(errno)), "errno {errno}");
        }
        for errno in [9, 22, 101] {
            assert!(!is_loss(&io::Error::from_raw_os_error(errno)), "errno {errno}");
        }
    }

    #[test]
    fn a_run_queue_gives_back_what_was_queued_and_starts_again_empty() {
        let mut run = RunQueue::new();
        assert!(run.is_empty());
        assert_eq!(run.take(), &[] as &[u16]);
        assert_eq!(run.push(7u16), 1);
        assert_eq!(run.push(9), 2);
        assert!(!run.is_empty());
        assert_eq!(run.take(), &[7, 9]);
        assert!(run.is_empty());
        for i in 0..MAX_RUN as u16 {
            assert_eq!(run.push(i), usize::from(i) + 1);
        }
        assert_eq!(run.take().len(), MAX_RUN);
        assert_eq!(run.push(3), 1);
        assert_eq!(run.take(), &[3]);
    }
}
