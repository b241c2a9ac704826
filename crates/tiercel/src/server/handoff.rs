//! Datagrams a UDP worker took in a batch but leaves to the other listeners: it is about to run a
//! procedure that may be slow, and the calls behind it in its batch must not wait for it.
//!
//! One `recvmmsg` takes up to 16 datagrams waiting, so the calls behind a slow one would otherwise be
//! held in that worker's buffers, out of reach of the listener the crew adds while calls wait. Before
//! a procedure not known to be quick runs, the rest of the batch is copied here; every listener
//! takes from here before it reads the socket, and the crew's deputy counts what waits here as
//! datagrams waiting. Each datagram left here rings a [`Nudge`] that listeners asleep on the socket
//! wait on too, so that one of them wakes for it as for a datagram in the socket. At most one batch,
//! less one datagram, is added per procedure a worker starts, and workers take from here before
//! they take a new batch. The copies go into buffers the listeners give back once they have handled
//! what came in them ([`Handoff::recycle`]), so that handing over allocates nothing once as many
//! buffers as are ever in flight at once have been made.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use tiercel_sys::udp::Nudge;

/// A datagram handed over: its sender, its bytes, and where the datagrams of a coalesced run end.
pub(super) struct Handed {
    pub(super) from: SocketAddr,
    pub(super) bytes: Vec<u8>,
    pub(super) segment: Option<usize>,
}

/// Buffers kept for the copies of datagrams handed over: a batch's worth.
const SPARE_BUFFERS: usize = 16;

/// Datagrams waiting for a listener, in the order they arrived.
pub(super) struct Handoff {
    /// How many wait: read without the lock on every look at the socket.
    waiting: AtomicUsize,
    queue: Mutex<VecDeque<Handed>>,
    /// Buffers given back, for the next copies.
    spare: Mutex<Vec<Vec<u8>>>,
    /// Counts what waits, for listeners asleep on the socket (none if the kernel refused one:
    /// they then wake with the next datagram, at the latest the retransmission of a call here).
    nudge: Option<Nudge>,
}

impl Handoff {
    /// A handoff whose spare buffers each hold a datagram of `datagram` bytes (a coalesced run of
    /// several, the start of a multi-packet message, may grow one).
    pub(super) fn new(datagram: usize) -> Handoff {
        Handoff {
            waiting: AtomicUsize::new(0),
            queue: Mutex::new(VecDeque::with_capacity(SPARE_BUFFERS)),
            spare: Mutex::new((0..SPARE_BUFFERS).map(|_| Vec::with_capacity(datagram)).collect()),
            nudge: Nudge::new().ok(),
        }
    }

    /// What listeners asleep on the socket wait on too.
    pub(super) fn nudge(&self) -> Option<&Nudge> {
        self.nudge.as_ref()
    }

    /// Whether nothing waits (one relaxed load).
    pub(super) fn is_empty(&self) -> bool {
        self.waiting.load(Ordering::Relaxed) == 0
    }

    /// Leaves `datagrams` to the next listener; returns how many.
    pub(super) fn hand_over<'a>(
        &self,
        datagrams: impl Iterator<Item = (SocketAddr, &'a [u8], Option<usize>)>,
    ) -> usize {
        let mut spare = self.spare.lock().unwrap_or_else(|p| p.into_inner());
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let before = queue.len();
        queue.extend(datagrams.map(|(from, bytes, segment)| {
            let mut copy = spare.pop().unwrap_or_default();
            copy.clear();
            tiercel_proto::copy::extend(&mut copy, bytes);
            Handed { from, bytes: copy, segment }
        }));
        self.waiting.store(queue.len(), Ordering::Relaxed);
        // Under the lock, so that the nudge's count is the queue's length.
        if let Some(nudge) = &self.nudge {
            for _ in before..queue.len() {
                let _ = nudge.ring();
            }
        }
        queue.len() - before
    }

    /// Gives back the buffer of a datagram taken and handled, for the next copy.
    pub(super) fn recycle(&self, buffer: Vec<u8>) {
        let mut spare = self.spare.lock().unwrap_or_else(|p| p.into_inner());
        if spare.len() < SPARE_BUFFERS {
            spare.push(buffer);
        }
    }

    /// The datagram that has waited longest, if any (without the lock when none waits).
    pub(super) fn take_if_any(&self) -> Option<Handed> {
        if self.is_empty() {
            return None;
        }
        self.take()
    }

    /// The datagram that has waited longest.
    fn take(&self) -> Option<Handed> {
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let first = queue.pop_front();
        if let (Some(nudge), Some(_)) = (&self.nudge, &first) {
            nudge.take();
        }
        self.waiting.store(queue.len(), Ordering::Relaxed);
        first
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagrams_handed_over_are_taken_in_order_once() {
        let handoff = Handoff::new(1500);
        let nudge = handoff.nudge().unwrap();
        assert!(handoff.is_empty());
        assert!(handoff.take().is_none());
        let from: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let n = handoff.hand_over([(from, &b"one"[..], None), (from, &b"two"[..], Some(2))].into_iter());
        assert_eq!(n, 2);
        assert!(!handoff.is_empty());
        let socket = tiercel_sys::udp::bind("127.0.0.1:0".parse().unwrap(), false).unwrap();
        let waiter = tiercel_sys::udp::ExclusiveWaiter::new(&socket).unwrap();
        waiter.also(nudge.as_fd()).unwrap();
        assert!(waiter.wait(Some(std::time::Duration::ZERO)).unwrap(), "a listener asleep wakes");
        let first = handoff.take().unwrap();
        assert_eq!((first.from, &first.bytes[..], first.segment), (from, &b"one"[..], None));
        let second = handoff.take().unwrap();
        assert_eq!((&second.bytes[..], second.segment), (&b"two"[..], Some(2)));
        assert!(handoff.is_empty());
        assert!(handoff.take().is_none());
        assert!(!waiter.wait(Some(std::time::Duration::ZERO)).unwrap(), "nothing left to wake for");
    }
}
