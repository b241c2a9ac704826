//! One socket for the threads of a binding beyond its first, so that their calls go out together
//! and their results come back together.
//!
//! Each datagram costs the kernel the same path whether it carries a Null call or more, and with
//! several threads calling on one binding that path is what bounds the calls a second: a socket per
//! thread means a datagram per call each way. The threads that share this socket put their calls
//! in one batch instead, which the first of them to look for its result after letting the others
//! run sends with one segmented send (UDP GSO): the kernel carries the batch as one packet to the
//! server, whose results for it go back the same way ([`crate::server`]'s outbox), and arrive here
//! as one run taken whole (UDP GRO). Whichever thread looks at the socket takes the run, keeps the
//! datagram for its own slot and puts each other one in its slot's mailbox, waking the thread if it
//! sleeps. A binding's first thread keeps a socket of its own, and with it the path of a lone
//! caller (results received straight into their place, no mailbox).
//!
//! Every datagram is still the protocol's own: a thread's call machine handles what its mailbox
//! holds exactly as what its own socket would have brought, so retransmission, duplicates and
//! multi-packet calls and results work as before (a result of several datagrams is put together
//! from the mailbox's copies, not received straight into its place). A mailbox holds at most
//! [`MAX_HELD`] datagrams; more are dropped (the protocol's timers recover them) and counted
//! stale. Only datagrams that carry the binding's id and token are handed to a slot.
//!
//! The price: a thread taken off its CPU between reading a run and handing it out holds the
//! others' results until it runs again, and their timers may send their calls again meanwhile
//! (the server answers a call sent again with the result it kept). With eight threads on one CPU
//! that happened to about one call in 70,000 on our VM, where threads with sockets of their own
//! sent none again.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tiercel_proto::wire::Packet;
use tiercel_sys::udp::{self, Nudge, Received};

use super::super::ClientCounters;
use super::BindingInner;

/// Most turns a call waits in the batch for the others' calls to join it (each turn a look at the
/// socket, and a yield of the CPU while other callers spin).
const GATHER_TURNS: u32 = 16;

/// Most datagrams a mailbox holds for a thread that has not looked yet.
pub(super) const MAX_HELD: usize = 64;

/// The socket the threads of a binding beyond its first share, their mailboxes and their batch.
pub(crate) struct SharedPort {
    /// Connected to the server; takes runs whole (UDP GRO).
    pub(super) socket: UdpSocket,
    /// By client slot: the datagrams read for it by another thread.
    boxes: Box<[Mailbox]>,
    /// Calls waiting to go out together.
    batch: Mutex<Batch>,
    /// The calls in the batch now (its `count`, read without the lock).
    queued: AtomicUsize,
    /// Batches sent (its `number`, read without the lock).
    sent: AtomicU64,
    /// Threads of this port in a call now.
    calling: AtomicUsize,
    /// Of those, the ones asleep waiting for their results: none of them queues a call before its
    /// result wakes it, so a call in the batch does not wait for them.
    sleeping: AtomicUsize,
    /// The shortest call whose segmented send the kernel refused (`usize::MAX`: none): calls this
    /// long or longer go one by one. (A route's MTU bounds the segments: a call that needs IP
    /// fragmentation cannot be one.)
    refused_at: AtomicUsize,
    /// The binding's id and token: what a datagram must carry to be handed to a slot.
    binding: (u32, u128),
    stats: Arc<ClientCounters>,
}

struct Mailbox {
    /// Datagrams held (the owner's look without the lock).
    held: AtomicUsize,
    queue: Mutex<Held>,
    /// The owner waits for its socket and its nudge.
    asleep: AtomicBool,
    /// Made when the owner first waits (`None` inside if the system would not make one).
    nudge: OnceLock<Option<Nudge>>,
}

/// A mailbox's datagrams, and the buffers of those taken, kept for the next (so that a stream of
/// calls allocates nothing once each mailbox has held its most).
struct Held {
    datagrams: VecDeque<Vec<u8>>,
    spare: Vec<Vec<u8>>,
}

/// Calls queued to go out together: datagrams of one length, one after another.
struct Batch {
    bytes: Vec<u8>,
    segment: usize,
    count: usize,
    /// Batches sent before this one.
    number: u64,
}

impl SharedPort {
    /// A port to the binding's server, if this kernel takes runs whole and sends them segmented
    /// (else the threads keep sockets of their own).
    pub(super) fn open(inner: &BindingInner) -> Option<SharedPort> {
        let socket = udp::connect(inner.server).ok()?;
        SharedPort::on(socket, inner.id, inner.token, inner.slot_count, inner.stats.clone())
    }

    /// A port on `socket` (connected) for binding `id` with `token` and `slots` client slots, if
    /// the socket takes runs whole.
    fn on(socket: UdpSocket, id: u32, token: u128, slots: u32, stats: Arc<ClientCounters>) -> Option<SharedPort> {
        if !udp::set_gro(&socket, true) || socket.set_nonblocking(true).is_err() {
            return None;
        }
        let boxes = (0..slots)
            .map(|_| Mailbox {
                held: AtomicUsize::new(0),
                queue: Mutex::new(Held { datagrams: VecDeque::new(), spare: Vec::new() }),
                asleep: AtomicBool::new(false),
                nudge: OnceLock::new(),
            })
            .collect();
        Some(SharedPort {
            socket,
            boxes,
            batch: Mutex::new(Batch { bytes: Vec::new(), segment: 0, count: 0, number: 0 }),
            queued: AtomicUsize::new(0),
            sent: AtomicU64::new(0),
            calling: AtomicUsize::new(0),
            sleeping: AtomicUsize::new(0),
            refused_at: AtomicUsize::new(usize::MAX),
            binding: (id, token),
            stats,
        })
    }

    /// Counts a thread in a call, until [`SharedPort::stop_calling`].
    pub(super) fn start_calling(&self) {
        self.calling.fetch_add(1, Ordering::Relaxed);
    }

    /// A thread's call is over.
    pub(super) fn stop_calling(&self) {
        self.calling.fetch_sub(1, Ordering::Relaxed);
    }

    /// Whether a thread of the port is in a call (asked before this one's call counts): a call
    /// sent now may go out with the next of theirs.
    pub(super) fn anyone_calling(&self) -> bool {
        self.calling.load(Ordering::Relaxed) > 0
    }

    /// Queues the datagram gathered from `io` to go out with the batch; the batch's number, or
    /// `None` when it cannot join it (too large): the caller sends it now. A batch of datagrams of
    /// another length, or full, goes out first.
    pub(super) fn queue(&self, io: &[IoSlice<'_>]) -> Option<u64> {
        let len: usize = io.iter().map(|s| s.len()).sum();
        if len >= self.refused_at.load(Ordering::Relaxed) {
            return None;
        }
        let mut b = self.batch.lock().unwrap_or_else(|e| e.into_inner());
        if b.count > 0 && (len != b.segment || b.count == udp::MAX_SEGMENTS || b.bytes.len() + len > udp::MAX_SEGMENTED)
        {
            self.send_batch(&mut b);
        }
        if len == 0 || len > udp::MAX_SEGMENTED {
            return None;
        }
        for s in io {
            tiercel_proto::copy::extend(&mut b.bytes, s);
        }
        b.segment = len;
        b.count += 1;
        self.queued.store(b.count, Ordering::Relaxed);
        Some(b.number)
    }

    /// Whether the call queued in batch `number` is on its way, `turns` turns after it was
    /// queued: sent with it by another thread, or sent now because every thread of the port in a
    /// call has queued one or sleeps waiting for its result (none will join before a result
    /// comes: a thread whose call is long, once it has blocked, holds up nobody's), or because it
    /// waited [`GATHER_TURNS`].
    pub(super) fn gathered(&self, number: u64, turns: u32) -> bool {
        if self.sent.load(Ordering::Acquire) != number {
            return true;
        }
        let waiting = self.queued.load(Ordering::Relaxed) + self.sleeping.load(Ordering::Relaxed);
        if turns < GATHER_TURNS && waiting < self.calling.load(Ordering::Relaxed) {
            return false;
        }
        self.send_now(number);
        true
    }

    /// Sends batch `number` now, unless it went out already.
    pub(super) fn send_now(&self, number: u64) {
        let mut b = self.batch.lock().unwrap_or_else(|e| e.into_inner());
        if b.number == number && b.count > 0 {
            self.send_batch(&mut b);
        }
    }

    /// Sends the batch: one segmented send for several, one datagram for one. A failure is lost
    /// packets to the protocol, whose timers send them again; a segmented send the kernel refuses
    /// goes one by one, and so do calls as long or longer from then on.
    fn send_batch(&self, b: &mut Batch) {
        let bytes = &b.bytes[..];
        let sent = if b.count > 1 {
            udp::send_segments(&self.socket, None, &[IoSlice::new(bytes)], b.segment)
        } else {
            // (The system call itself, as every send of a call: `std`'s goes through the C
            // library's cancellation-point wrapper.)
            udp::send_gather(&self.socket, &[IoSlice::new(bytes)])
        };
        match sent {
            Ok(_) if b.count > 1 => {
                self.stats.sent_together.fetch_add(b.count as u64, Ordering::Relaxed);
            }
            Err(e) if udp::is_segmentation_refused(&e) => {
                self.refused_at.fetch_min(b.segment, Ordering::Relaxed);
                for d in bytes.chunks(b.segment) {
                    let _ = udp::send_gather(&self.socket, &[IoSlice::new(d)]);
                }
            }
            _ => {}
        }
        b.bytes.clear();
        b.count = 0;
        b.number += 1;
        self.queued.store(0, Ordering::Relaxed);
        self.sent.store(b.number, Ordering::Release);
    }

    /// One look for a datagram for client slot `slot`, without blocking: the first its mailbox
    /// holds, or else one read from the socket into `rx` (a run taken whole), the rest of what that
    /// read brought going to their mailboxes. Leaves the datagram at the start of `rx`.
    pub(super) fn receive(&self, slot: u32, rx: &mut [u8]) -> std::io::Result<Received> {
        let Some(own) = self.boxes.get(slot as usize) else { return Ok(Received::Nothing) };
        if own.held.load(Ordering::Acquire) > 0 {
            if let Some(got) = own.take(rx) {
                return Ok(got);
            }
        }
        let got = udp::recv_segments_nowait(&self.socket, rx)?;
        let Received::Datagram(n) = got.received else { return Ok(got.received) };
        // The datagram for this slot (the first, if several) moves to the start of `rx` once the
        // others are in their mailboxes.
        let mut mine = None;
        for piece in udp::segments(n, got.segment) {
            let d = &rx[piece.clone()];
            let to = match Packet::new_checked(d) {
                Ok(p) if (p.binding(), p.token()) == self.binding => p.slot(),
                // Not the binding's: the slot's own look would drop it as stale; so does this.
                Ok(_) => {
                    self.stats.stale.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                Err(_) => {
                    self.stats.malformed.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            };
            if to == slot && mine.is_none() {
                mine = Some(piece);
                continue;
            }
            match self.boxes.get(to as usize) {
                Some(mailbox) if mailbox.hold(d) => {
                    self.stats.handed_over.fetch_add(1, Ordering::Relaxed);
                }
                _ => {
                    self.stats.stale.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        Ok(match mine {
            Some(piece) => {
                rx.copy_within(piece.clone(), 0);
                Received::Datagram(piece.len())
            }
            None => Received::Nothing,
        })
    }

    /// Waits until a datagram may be there for `slot` (in its mailbox, or on the socket), or
    /// `timeout` passes.
    pub(super) fn wait(&self, slot: u32, timeout: Option<Duration>) -> std::io::Result<()> {
        use std::os::fd::AsFd;
        let Some(own) = self.boxes.get(slot as usize) else { return Ok(()) };
        let Some(nudge) = own.nudge.get_or_init(|| Nudge::new().ok()) else {
            // No nudge to wake it: a short wait, then a look.
            let short = Duration::from_millis(1);
            udp::wait_readable(&self.socket, Some(timeout.map_or(short, |t| t.min(short))))?;
            return Ok(());
        };
        // Asleep, then a look at the mailbox: a thread that holds a datagram for it after this
        // look sees it asleep and nudges it (both sides store, then load the other's word).
        own.asleep.store(true, Ordering::SeqCst);
        self.sleeping.fetch_add(1, Ordering::Relaxed);
        let waited = match own.held.load(Ordering::SeqCst) {
            0 => udp::wait_either_readable(self.socket.as_fd(), nudge.as_fd(), timeout).map(drop),
            _ => Ok(()),
        };
        self.sleeping.fetch_sub(1, Ordering::Relaxed);
        own.asleep.store(false, Ordering::Relaxed);
        waited?;
        while nudge.take() {}
        Ok(())
    }
}

impl Mailbox {
    /// Holds a copy of datagram `d`, and nudges the owner if it sleeps; false when full.
    fn hold(&self, d: &[u8]) -> bool {
        {
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            if q.datagrams.len() >= MAX_HELD {
                return false;
            }
            let mut buf = q.spare.pop().unwrap_or_default();
            buf.clear();
            tiercel_proto::copy::extend(&mut buf, d);
            q.datagrams.push_back(buf);
            self.held.store(q.datagrams.len(), Ordering::SeqCst);
        }
        if self.asleep.load(Ordering::SeqCst) {
            if let Some(Some(n)) = self.nudge.get() {
                let _ = n.ring();
            }
        }
        true
    }

    /// The first datagram held, put at the start of `rx`.
    fn take(&self, rx: &mut [u8]) -> Option<Received> {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let d = q.datagrams.pop_front()?;
        self.held.store(q.datagrams.len(), Ordering::Release);
        let got = put(&d, rx);
        q.spare.push(d);
        Some(got)
    }
}

/// Datagram `d` at the start of `rx`, as a receive into `rx` would have left it.
fn put(d: &[u8], rx: &mut [u8]) -> Received {
    match rx.get_mut(..d.len()) {
        Some(to) => {
            tiercel_proto::copy::copy(to, d);
            Received::Datagram(d.len())
        }
        None => Received::Truncated(d.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiercel_proto::wire::{Header, Kind};

    const ID: u32 = 7;
    const TOKEN: u128 = 0x5eed;

    /// A port of four slots connected to a socket standing for the server, and that socket.
    fn port() -> (SharedPort, UdpSocket) {
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        let socket = udp::connect(server.local_addr().unwrap()).unwrap();
        server.connect(socket.local_addr().unwrap()).unwrap();
        let port = SharedPort::on(socket, ID, TOKEN, 4, Arc::default()).expect("this kernel takes runs whole");
        (port, server)
    }

    /// A result header for `slot` of binding `id`, its sequence number `seq`.
    fn result(id: u32, slot: u32, seq: u32) -> Vec<u8> {
        Header { binding: id, slot, token: TOKEN, seq, ..Header::new(Kind::Result) }.to_bytes().to_vec()
    }

    /// Looks for `slot`'s next datagram until one comes (a second at most); its sequence number.
    fn next_for(port: &SharedPort, slot: u32) -> Option<u32> {
        let mut rx = vec![0u8; udp::GRO_BUFFER];
        let give_up = std::time::Instant::now() + Duration::from_secs(1);
        while std::time::Instant::now() < give_up {
            if let Received::Datagram(n) = port.receive(slot, &mut rx).unwrap() {
                return Some(Packet::new_checked(&rx[..n]).unwrap().seq());
            }
        }
        None
    }

    #[test]
    fn a_run_read_by_one_slot_is_handed_to_the_slots_it_is_for() {
        let (port, server) = port();
        let run: Vec<u8> = [result(ID, 1, 10), result(ID, 2, 20), result(ID, 1, 11), result(ID + 1, 3, 30)].concat();
        let segment = run.len() / 4;
        udp::send_segments(&server, None, &[IoSlice::new(&run)], segment).unwrap();
        // Slot 1 looks first: it takes its first datagram, and leaves the rest where they belong.
        assert_eq!(next_for(&port, 1), Some(10));
        assert_eq!(port.boxes[2].held.load(Ordering::Relaxed), 1);
        assert_eq!(port.boxes[1].held.load(Ordering::Relaxed), 1);
        assert_eq!(port.boxes[3].held.load(Ordering::Relaxed), 0, "another binding's datagram is nobody's");
        let stats = port.stats.snapshot();
        assert_eq!((stats.handed_over, stats.stale), (2, 1));
        assert_eq!(next_for(&port, 2), Some(20));
        assert_eq!(next_for(&port, 1), Some(11));
        // A slot beyond the binding's, and a datagram that is no packet: dropped and counted.
        server.send(&result(ID, 9, 40)).unwrap();
        server.send(b"not a packet").unwrap();
        server.send(&result(ID, 0, 50)).unwrap();
        assert_eq!(next_for(&port, 0), Some(50));
        let stats = port.stats.snapshot();
        assert_eq!((stats.stale, stats.malformed), (2, 1));
    }

    #[test]
    fn a_mailbox_holds_at_most_its_bound_and_wakes_its_sleeping_owner() {
        let (port, server) = port();
        for seq in 0..MAX_HELD as u32 + 3 {
            server.send(&result(ID, 2, seq)).unwrap();
        }
        // Slot 0 reads everything that came: slot 2's mailbox keeps the first `MAX_HELD`.
        let mut rx = vec![0u8; udp::GRO_BUFFER];
        for _ in 0..MAX_HELD + 3 {
            let _ = port.receive(0, &mut rx).unwrap();
        }
        assert_eq!(port.boxes[2].held.load(Ordering::Relaxed), MAX_HELD);
        assert_eq!(port.stats.snapshot().stale, 3);
        for seq in 0..MAX_HELD as u32 {
            assert_eq!(next_for(&port, 2), Some(seq));
        }
        // Slot 3 sleeps in its wait, the socket empty; another thread hands it a datagram it read
        // (from a run) and nudges it awake.
        std::thread::scope(|s| {
            let sleeper = s.spawn(|| {
                let t = std::time::Instant::now();
                port.wait(3, Some(Duration::from_secs(10))).unwrap();
                (t.elapsed(), port.boxes[3].held.load(Ordering::Relaxed))
            });
            while !port.boxes[3].asleep.load(Ordering::SeqCst) {
                std::thread::yield_now();
            }
            assert!(port.boxes[3].hold(&result(ID, 3, 99)));
            let (waited, held) = sleeper.join().unwrap();
            assert!(waited < Duration::from_secs(10), "woken, not timed out");
            assert_eq!(held, 1);
        });
        assert_eq!(next_for(&port, 3), Some(99));
    }

    #[test]
    fn calls_queued_together_go_out_in_one_run_once_every_caller_has_queued_or_waited_its_turns() {
        let (port, server) = port();
        udp::set_gro(&server, true);
        let a = result(ID, 0, 1);
        port.start_calling();
        port.start_calling();
        let first = port.queue(&[IoSlice::new(&a)]).unwrap();
        assert!(!port.gathered(first, 0), "the other caller has not queued yet");
        let second = port.queue(&[IoSlice::new(&result(ID, 1, 2))]).unwrap();
        assert_eq!(first, second, "one batch");
        assert!(port.gathered(first, 1), "both callers queued: sent");
        assert!(port.gathered(second, 0), "sent with the first");
        let mut buf = vec![0u8; udp::GRO_BUFFER];
        let got = udp::recv_segments_nowait(&server, &mut buf).unwrap();
        assert_eq!(got.received, Received::Datagram(2 * a.len()));
        assert_eq!(got.segment, Some(a.len()), "one run");
        assert_eq!(port.stats.snapshot().sent_together, 2);
        // A lone call waits its turns at most; one of another length sends the batch before it.
        let third = port.queue(&[IoSlice::new(&a)]).unwrap();
        assert!(!port.gathered(third, GATHER_TURNS - 1));
        let longer = [a.clone(), vec![0u8; 4]].concat();
        let fourth = port.queue(&[IoSlice::new(&longer)]).unwrap();
        assert_ne!(third, fourth);
        assert!(port.gathered(third, 0), "sent when the longer one was queued");
        assert!(port.gathered(fourth, GATHER_TURNS));
        // Calls as long as one whose segmented send the kernel refused (set here by hand: loopback
        // refuses none) are sent one by one, not queued.
        port.refused_at.store(longer.len(), Ordering::Relaxed);
        assert_eq!(port.queue(&[IoSlice::new(&longer)]), None);
        port.refused_at.store(usize::MAX, Ordering::Relaxed);
        // A caller asleep waiting for its result will not queue before it wakes: a call queued
        // beside it goes at once.
        port.sleeping.fetch_add(1, Ordering::Relaxed);
        let fifth = port.queue(&[IoSlice::new(&a)]).unwrap();
        assert!(port.gathered(fifth, 0), "the other caller sleeps");
        port.sleeping.fetch_sub(1, Ordering::Relaxed);
        for len in [a.len(), longer.len()] {
            let mut got = udp::recv_segments_nowait(&server, &mut buf).unwrap();
            while got.received == Received::Nothing {
                got = udp::recv_segments_nowait(&server, &mut buf).unwrap();
            }
            assert_eq!((got.received, got.segment), (Received::Datagram(len), None));
        }
    }
}
