//! The bind exchange on the connection transports (TCP, and shared memory's rendezvous socket),
//! written once: the listener thread keeps the connections that have not bound yet in the
//! endpoint's table of handshakes ([`Handshakes`]: its limits per source and in all, its eviction
//! of the slow under pressure, its deadline), reads each one's requests without blocking, and
//! answers them through the server's bind machine. The transport supplies the bytes
//! ([`Exchange`]) and, once the machine admits a request, makes the binding.

use std::hash::Hash;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tiercel_proto::bind::{Admission, BindDecision};
use tiercel_proto::endpoint::{HandshakeLimits, Handshakes};
use tiercel_proto::wire::Packet;

use super::Shared;

/// Connections a listener accepts before it lets those in the exchange progress.
const ARRIVALS: usize = 16;
/// How long a connection has, from its arrival, to complete the bind exchange.
pub(crate) const HANDSHAKE: Duration = Duration::from_secs(2);

/// Why a connection's exchange is over before an answer.
pub(super) enum Broken {
    /// The peer closed it, or a socket error.
    Closed,
    /// It sent bytes that are not a request (counted as malformed).
    Malformed,
}

/// A connection in the bind exchange, as its transport moves its bytes.
pub(super) trait Exchange: AsFd {
    /// The next whole request, if one has arrived (reading what the socket holds, never
    /// blocking); `None` while more must come.
    fn request(&mut self) -> Result<Option<Vec<u8>>, Broken>;
    /// Sends `packet`, the answer to the last request, without waiting: a fresh connection's
    /// socket buffer takes an answer this small whole. False if it did not go.
    fn answer(&mut self, packet: &[u8]) -> bool;
}

/// A connection waiting in the table: its bytes, how many requests it has had answered
/// (`Refused::expects_another`), and what stands for it in challenges (they are bound to it).
pub(super) struct Waiting<E> {
    pub(super) exchange: E,
    answered: u8,
    peer: [u8; 16],
}

/// Where a connection's exchange stands after some progress.
pub(super) enum Step {
    /// Waiting for more bytes.
    Wait,
    /// Over without a binding: answered for the last time, refused, or broken.
    Done,
    /// The bind machine admits this request: the transport asks the endpoint for the binding
    /// (`ServerEndpoint::connect`, which has room for `ServerConfig::max_bindings` of every
    /// transport together, and none while draining) and answers with the grant, or with
    /// [`Admission::busy`].
    Admit(Admission),
    /// A secure handshake's first message (over TCP only): the transport reads it
    /// (`Shared::hello`), answers, and makes the binding it admits.
    Hello(Vec<u8>),
}

/// The connections of one listener that have not bound yet.
pub(super) struct Doorway<S, E> {
    table: Handshakes<S, Waiting<E>>,
    ready: Vec<bool>,
    door: super::Door,
}

impl<S: Eq + Hash + Copy, E: Exchange> Doorway<S, E> {
    /// An empty doorway holding at most `total` connections, `per_source` of them from one source.
    pub(super) fn new(total: usize, per_source: usize, door: super::Door) -> Doorway<S, E> {
        let table = Handshakes::new(HandshakeLimits { total, per_source, time: HANDSHAKE });
        Doorway { table, ready: Vec::new(), door }
    }

    /// Takes a new connection from `source`, and lets it progress at once (`progress` as in
    /// [`Doorway::tend`]): a client sends its request as it connects, so that it is usually
    /// answered here, before later arrivals could push it out. Kept waiting, it may make another
    /// connection close to make room for it (counted as rejected).
    pub(super) fn arrive(
        &mut self,
        shared: &Shared,
        source: S,
        exchange: E,
        mut progress: impl FnMut(&mut E, Step) -> bool,
    ) {
        let Ok(peer) = crate::random::bytes() else { return };
        let mut w = Waiting { exchange, answered: 0, peer };
        let next = step(shared, self.door, &mut w.exchange, &mut w.answered, &w.peer);
        if progress(&mut w.exchange, next) && self.table.admit(source, Instant::now(), w).is_some() {
            shared.stats.rejected.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Takes the connections waiting at the listener, [`ARRIVALS`] at most, each as
    /// [`Doorway::arrive`] does: `accept` gives the next one, `open` makes it ready for the
    /// exchange (its source and its bytes; `None` closes it), and `progress` is as in
    /// [`Doorway::tend`]. While the server refuses bindings, each is closed unread (the client
    /// is told by the closing) and counted. True if any came (more may be waiting).
    pub(super) fn take_arrivals<C>(
        &mut self,
        shared: &Shared,
        mut accept: impl FnMut() -> std::io::Result<C>,
        mut open: impl FnMut(C) -> Option<(S, E)>,
        mut progress: impl FnMut(&mut E, Step) -> bool,
    ) -> bool {
        let mut any = false;
        // A few arrivals at a time, then the connections' progress: a burst of arrivals from
        // one source cannot push out a client whose request is landing meanwhile.
        for _ in 0..ARRIVALS {
            match accept() {
                Ok(connection) => {
                    any = true;
                    if shared.refusing_bindings() {
                        shared.stats.rejected.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    if let Some((source, exchange)) = open(connection) {
                        self.arrive(shared, source, exchange, &mut progress);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    // Out of descriptors, for example: try again a little later.
                    std::thread::sleep(Duration::from_millis(10));
                    break;
                }
            }
        }
        any
    }

    /// Closes the connections whose time ran out, then lets each of the others progress through
    /// `step` ([`step`], then the transport's binding), keeping those that wait for more.
    pub(super) fn tend(&mut self, shared: &Shared, mut progress: impl FnMut(&mut E, Step) -> bool) {
        let expired = self.table.expire(Instant::now());
        shared.stats.rejected.fetch_add(expired.len() as u64, Ordering::Relaxed);
        self.table.retain(|p| {
            let w = &mut p.io;
            let next = step(shared, self.door, &mut w.exchange, &mut w.answered, &w.peer);
            progress(&mut w.exchange, next)
        });
    }

    /// Waits until `listener`, `also` or a connection in the table is readable, or the server
    /// stops, at most until the first of those connections runs out of time or `period` passes.
    pub(super) fn wait(
        &mut self,
        shared: &Shared,
        listener: BorrowedFd<'_>,
        also: Option<BorrowedFd<'_>>,
        period: Duration,
    ) {
        let now = Instant::now();
        let until = self.table.next_expiry().map_or(period, |t| t.saturating_duration_since(now));
        let wait = until.min(period).max(Duration::from_millis(1));
        let stopping = shared.stopping.as_fd();
        // With no connection in the table (the usual case), nothing is allocated.
        if self.table.is_empty() {
            let _ = match also {
                None => tiercel_sys::udp::wait_one_of([listener, stopping], Some(wait)),
                Some(also) => tiercel_sys::udp::wait_one_of([listener, stopping, also], Some(wait)),
            };
            return;
        }
        let fds: Vec<_> = [listener, stopping]
            .into_iter()
            .chain(also)
            .chain(self.table.iter().map(|p| p.io.exchange.as_fd()))
            .collect();
        let _ = tiercel_sys::udp::wait_any_readable(&fds, Some(wait), &mut self.ready);
    }
}

/// Reads a connection's next request and answers it through the server's bind machine, unless the
/// machine admits it (then the transport makes the binding).
fn step(shared: &Shared, door: super::Door, exchange: &mut impl Exchange, answered: &mut u8, peer: &[u8; 16]) -> Step {
    let malformed = || {
        shared.stats.malformed.fetch_add(1, Ordering::Relaxed);
        Step::Done
    };
    let request = match exchange.request() {
        Ok(Some(request)) => request,
        Ok(None) => return Step::Wait,
        Err(Broken::Closed) => return Step::Done,
        Err(Broken::Malformed) => return malformed(),
    };
    if door == super::Door::Tcp && tiercel_proto::seal::is_sealed(&request) {
        return Step::Hello(request);
    }
    let Ok(p) = Packet::new_checked(&request[..]) else { return malformed() };
    let machine = shared.bind_machine(door);
    match machine.on_request(&p, peer, crate::rendezvous::MAX_MESSAGE) {
        BindDecision::Malformed => malformed(),
        BindDecision::Answer { packet, refused } => {
            shared.count_refusal(refused);
            *answered += 1;
            let sent = exchange.answer(&packet);
            if sent && refused.expects_another(*answered) {
                Step::Wait
            } else {
                Step::Done
            }
        }
        BindDecision::Admit(a) => Step::Admit(a),
    }
}
