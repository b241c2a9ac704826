//! Results held while the calls of one receive batch run, then sent together with one `sendmmsg`.
//!
//! When calls queue, a UDP worker takes the datagrams waiting (up to 16) with one `recvmmsg` and runs
//! the calls in turn. The result of each small call is copied here instead of sent, and when the batch
//! is done all of them go out with one system call (Lampson's t = 1 + s/b; Firefly's batched
//! transmission). A lone call is not held: a batch of one datagram sends its result at once.
//!
//! A held result waits for the calls after it in the batch, so it is held only across procedures
//! this worker has seen finish quickly ([`QUICK_RUN`]) and for at most [`MAX_HOLD`]: before a
//! procedure not known to be quick runs, or once the oldest result has waited that long, what is held
//! goes out first. A procedure known to be quick that turns slow delays the results held before it
//! once, and is then known as slow.

use std::io::IoSlice;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tiercel_proto::wire::checksum;
use tiercel_sys::mmsg::{self, MAX_BATCH};
use tiercel_sys::udp;

/// Largest datagram held (a MaxResult's 1,496 bytes and its trailer fit); larger ones go at once.
pub(super) const MAX_HELD: usize = 2048;

/// A procedure that ran within this long (its whole handling, from its packet read to its result
/// ready) is quick: results are held across it.
pub(super) const QUICK_RUN: Duration = Duration::from_micros(20);

/// Longest a result is held for the calls after it.
pub(super) const MAX_HOLD: Duration = Duration::from_micros(50);

/// Results waiting to be sent together, in the order they were held.
pub(super) struct Outbox {
    bytes: Vec<u8>,
    held: Vec<(SocketAddr, usize, usize)>,
    /// When the first result now held was held.
    since: Option<Instant>,
    /// Whether results may be held: a batch of several datagrams is being handled.
    open: bool,
    /// The shortest result length whose segmented send the kernel refused (`usize::MAX`: none):
    /// results this long or longer go by `sendmmsg`. (A route's MTU bounds the segments, and a
    /// result that needs IP fragmentation cannot be a segment.)
    refused_at: usize,
}

impl Outbox {
    /// An empty outbox; its room is allocated now, once.
    pub(super) fn new() -> Outbox {
        Outbox {
            bytes: Vec::with_capacity(MAX_BATCH * MAX_HELD),
            held: Vec::with_capacity(MAX_BATCH),
            since: None,
            open: false,
            refused_at: usize::MAX,
        }
    }

    /// Lets results be held (a batch of several datagrams begins) or not.
    pub(super) fn open(&mut self, open: bool) {
        self.open = open;
    }

    /// Whether a batch of several datagrams is being handled.
    pub(super) fn is_open(&self) -> bool {
        self.open
    }

    /// Holds the datagram gathered from `parts` (and its CRC32C trailer when `with_checksum`) for `to`.
    /// False when it cannot be held (no batch, too large, the outbox full): the caller sends it now.
    pub(super) fn hold(&mut self, to: SocketAddr, parts: &[&[u8]], with_checksum: bool) -> bool {
        let len = parts.iter().map(|p| p.len()).sum::<usize>() + if with_checksum { 4 } else { 0 };
        if !self.open
            || len > MAX_HELD
            || self.held.len() == MAX_BATCH
            || self.bytes.len() + len > self.bytes.capacity()
        {
            return false;
        }
        let start = self.bytes.len();
        for part in parts {
            tiercel_proto::copy::extend(&mut self.bytes, part);
        }
        if with_checksum {
            let sum = checksum(parts.iter().copied()).to_le_bytes();
            self.bytes.extend_from_slice(&sum);
        }
        self.held.push((to, start, len));
        self.since.get_or_insert_with(Instant::now);
        true
    }

    /// Whether results are held.
    pub(super) fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Whether what is held must go out before a procedure runs at `now`: the procedure is not known
    /// to be quick, or the oldest result has waited [`MAX_HOLD`].
    pub(super) fn due_before(&self, quick: bool, now: Instant) -> bool {
        !self.is_empty() && (!quick || self.since.is_some_and(|t| now.saturating_duration_since(t) >= MAX_HOLD))
    }

    /// Sends what is held with as few system calls as it can: each run of results held one after
    /// another for one address, all of one length but perhaps the last (the results of one client's
    /// calls that went out together), with one segmented send (UDP GSO: the kernel carries the run
    /// as one packet as far as it can, and a client that takes runs whole receives it with one
    /// system call), and the rest with one `sendmmsg`. A refused datagram is a lost packet to the
    /// protocol: the client's timers ask again. With `segmenting` false (the server's sockets
    /// cannot segment) every result goes out by `sendmmsg`; so does a run the kernel refuses to
    /// segment (its results too long for the route, say), and from then on every run of results as
    /// long or longer. Returns how many went out together with another.
    pub(super) fn send(&mut self, socket: &UdpSocket, segmenting: &AtomicBool) -> usize {
        let mut out = [(SocketAddr::from(([0, 0, 0, 0], 0)), &[][..]); MAX_BATCH];
        let mut singles = 0;
        let mut together = 0;
        let mut i = 0;
        while i < self.held.len() {
            let (to, start, len) = self.held[i];
            let run = if segmenting.load(Ordering::Relaxed) && len < self.refused_at { self.run_at(i) } else { 1 };
            if run >= 2 {
                let (_, last, last_len) = self.held[i + run - 1];
                let bytes = &self.bytes[start..last + last_len];
                match udp::send_segments(socket, Some(&to), &[IoSlice::new(bytes)], len) {
                    Ok(_) => together += run,
                    Err(e) if udp::is_segmentation_refused(&e) => {
                        // Sent one by one below, with the rest.
                        self.refused_at = len;
                        continue;
                    }
                    // Lost to the protocol, as a refused datagram of a batch is.
                    Err(_) => {}
                }
                i += run;
                continue;
            }
            out[singles] = (to, &self.bytes[start..start + len]);
            singles += 1;
            i += 1;
        }
        if singles > 0 {
            let (sent, _) = mmsg::send_batch(socket, &out[..singles]);
            if singles > 1 {
                together += sent;
            }
        }
        self.held.clear();
        self.bytes.clear();
        self.since = None;
        together
    }

    /// How many results held from `i` on form one run for a segmented send: held one after another
    /// for the same address, each as long as the first but the last, which may be shorter (at most
    /// [`udp::MAX_SEGMENTS`], and at most [`udp::MAX_SEGMENTED`] bytes).
    fn run_at(&self, i: usize) -> usize {
        let (to, _, len) = self.held[i];
        let mut n = 1;
        let mut bytes = len;
        for &(t, _, l) in &self.held[i + 1..] {
            if t != to || l > len || n == udp::MAX_SEGMENTS || bytes + l > udp::MAX_SEGMENTED {
                break;
            }
            n += 1;
            bytes += l;
            if l < len {
                break;
            }
        }
        n
    }
}

/// Entries of [`QuickProcedures`].
const QUICK_ENTRIES: usize = 64;

/// Which procedures this worker has seen run quickly, by export and procedure number: a small
/// direct-mapped table, so that a lookup is one index and a compare (a procedure whose entry another
/// took is unknown, so not held across: safe, merely unbatched).
pub(super) struct QuickProcedures {
    entries: [(usize, u16, bool); QUICK_ENTRIES],
}

impl QuickProcedures {
    pub(super) fn new() -> QuickProcedures {
        QuickProcedures { entries: [(0, 0, false); QUICK_ENTRIES] }
    }

    fn index(export: usize, procedure: u16) -> usize {
        ((export >> 4) ^ usize::from(procedure).wrapping_mul(0x9e37)) % QUICK_ENTRIES
    }

    /// Whether `procedure` of the export at `export` (its address) last ran quickly here.
    pub(super) fn is_quick(&self, export: usize, procedure: u16) -> bool {
        let (e, p, quick) = self.entries[Self::index(export, procedure)];
        e == export && p == procedure && quick
    }

    /// Records that `procedure` of `export` took `took` to run.
    pub(super) fn observe(&mut self, export: usize, procedure: u16, took: Duration) {
        self.entries[Self::index(export, procedure)] = (export, procedure, took < QUICK_RUN);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_held_only_in_a_batch_and_within_bounds() {
        let mut outbox = Outbox::new();
        let to: SocketAddr = "127.0.0.1:9".parse().unwrap();
        assert!(!outbox.hold(to, &[b"result"], false), "no batch: sent at once");
        outbox.open(true);
        assert!(outbox.hold(to, &[b"head", b"body"], true));
        assert!(!outbox.hold(to, &[&[0u8; MAX_HELD + 1]], false), "too large to hold");
        for _ in 1..MAX_BATCH {
            assert!(outbox.hold(to, &[&[1u8; 100]], false));
        }
        assert!(!outbox.hold(to, &[b"x"], false), "full");
        let (start, len) = (outbox.held[0].1, outbox.held[0].2);
        assert_eq!(len, 12);
        let sum = checksum([&b"head"[..], &b"body"[..]]).to_le_bytes();
        assert_eq!(&outbox.bytes[start..start + len], [&b"headbody"[..], &sum].concat());
    }

    #[test]
    fn results_held_for_one_address_go_out_as_one_run_and_the_rest_by_sendmmsg() {
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        let (a, b) = (UdpSocket::bind("127.0.0.1:0").unwrap(), UdpSocket::bind("127.0.0.1:0").unwrap());
        assert!(udp::set_gro(&a, true), "this kernel takes runs whole");
        let (to_a, to_b) = (a.local_addr().unwrap(), b.local_addr().unwrap());
        let mut outbox = Outbox::new();
        outbox.open(true);
        // A run for `a` of three of 40 bytes and a shorter last; then one for `b`, one more for `a`.
        for (to, len, byte) in
            [(to_a, 40, 1), (to_a, 40, 2), (to_a, 40, 3), (to_a, 30, 4), (to_b, 40, 5), (to_a, 40, 6)]
        {
            assert!(outbox.hold(to, &[&vec![byte; len]], false));
        }
        let segmenting = AtomicBool::new(true);
        assert_eq!(outbox.send(&server, &segmenting), 4 + 2, "the run, and the two sent by one sendmmsg");
        assert!(outbox.is_empty());
        let mut buf = vec![0u8; udp::GRO_BUFFER];
        let mut next = |s: &UdpSocket| loop {
            let got = udp::recv_segments_nowait(s, &mut buf).unwrap();
            if let udp::Received::Datagram(n) = got.received {
                return (buf[..n].to_vec(), got.segment);
            }
        };
        let expected = [vec![1u8; 40], vec![2; 40], vec![3; 40], vec![4; 30]].concat();
        assert_eq!(next(&a), (expected, Some(40)), "one run, taken whole");
        assert_eq!(next(&a), (vec![6; 40], None));
        assert_eq!(next(&b), (vec![5; 40], None));
        // Results as long as those of a run the kernel refused to segment (set here by hand:
        // loopback's MTU refuses no run) go by sendmmsg, and the server's flag stays set.
        outbox.refused_at = 40;
        outbox.open(true);
        for byte in [9, 10] {
            assert!(outbox.hold(to_a, &[&[byte; 40]], false));
        }
        assert_eq!(outbox.send(&server, &segmenting), 2);
        assert!(segmenting.load(Ordering::Relaxed));
        assert_eq!(next(&a), (vec![9; 40], None));
        assert_eq!(next(&a), (vec![10; 40], None));
        // Without segmentation every result goes by sendmmsg.
        outbox.open(true);
        for byte in [7, 8] {
            assert!(outbox.hold(to_a, &[&[byte; 40]], false));
        }
        assert_eq!(outbox.send(&server, &AtomicBool::new(false)), 2);
        assert_eq!(next(&a), (vec![7; 40], None));
        assert_eq!(next(&a), (vec![8; 40], None));
    }

    #[test]
    fn what_is_held_goes_before_a_procedure_not_known_quick_or_after_the_longest_hold() {
        let mut outbox = Outbox::new();
        let now = Instant::now();
        assert!(!outbox.due_before(false, now), "nothing held");
        outbox.open(true);
        assert!(outbox.hold("127.0.0.1:9".parse().unwrap(), &[b"r"], false));
        let held = outbox.since.unwrap();
        assert!(outbox.due_before(false, held));
        assert!(!outbox.due_before(true, held));
        assert!(outbox.due_before(true, held + MAX_HOLD));
    }

    #[test]
    fn procedures_are_quick_once_seen_quick_and_until_seen_slow() {
        let mut quick = QuickProcedures::new();
        assert!(!quick.is_quick(0x1000, 3));
        quick.observe(0x1000, 3, Duration::from_micros(2));
        assert!(quick.is_quick(0x1000, 3));
        assert!(!quick.is_quick(0x2000, 3), "another export's procedure 3");
        assert!(!quick.is_quick(0x1000, 4));
        quick.observe(0x1000, 3, QUICK_RUN);
        assert!(!quick.is_quick(0x1000, 3));
    }
}
