//! Bindings whose calls come over a connection of their own (TCP) or a shared-memory region: their
//! place in the same table as datagram bindings (so `max_bindings` bounds them all together and a
//! draining endpoint refuses them all), the decision on every frame of a stream, and their expiry.
//!
//! ```text
//! bind handshake admitted ─► connect ─► Binding (token 0, reached only through its connection)
//! bytes ─► read_frame ─┬─ Arrived::More      read more into the deframer (its buffer grown,
//!                      │                     charged first, for a large frame as it arrives)
//!                      ├─ Arrived::Answer(h) send h back (a frame the budgets have no room for:
//!                      │                     Busy from its header, TooLarge if they never could,
//!                      │                     its bytes dropped as they come)
//!                      ├─ Arrived::Close     the peer broke the framing: close the connection
//!                      └─ a whole frame ─► on_frame ─┬─ Call        admitted: run_started … run_finished
//!                                                    ├─ Answer(h)   a probe's reply, or a refusal
//!                                                    ├─ Cancel      the slot's call stops
//!                                                    └─ Malformed   close the connection
//! connection over, or expired ─► release
//! ```
//!
//! The TCP server reads its connections through [`ServerEndpoint::read_frame`], and the stream
//! simulation (`tests/sim_stream.rs`) drives the same function with bytes cut and reset at random.

use std::hash::Hash;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Binding, Carrier, ServerEndpoint, Terms, TOUCH_EVERY};
use crate::stream::{check_frame, Deframer, Next, PREFIX_LEN};
use crate::wire::{flags, Header, Kind, Packet, Status};

/// Where a bind request came from, for [`ServerEndpoint::connect_from`] and
/// [`ServerEndpoint::grant_from`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// A TCP connection's peer address, or the address a UDP bind request came from (where its
    /// grant, and the token calls must carry, are sent).
    Address(std::net::IpAddr),
    /// A shared-memory peer's user id.
    User(u32),
}

/// Who holds a binding, as its transport knew it when the binding was made: what a procedure is
/// told of its caller, and what decides whose part of the budgets the binding's memory lies in
/// ([`Caller::source`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Caller {
    /// A client over UDP (the address its bind request came from, where the grant and the token
    /// calls must carry went) or over TCP (the connection's peer).
    Address(std::net::SocketAddr),
    /// A process of this host, through shared memory: its user and process ids, as the kernel
    /// recorded them for its rendezvous connection (`SO_PEERCRED`).
    Process {
        /// Its user id.
        uid: u32,
        /// Its process id.
        pid: u32,
    },
    /// A client of a secure binding: the static public key it proved in the bind handshake, and
    /// the address the handshake came from. Every packet of its binding is sealed
    /// ([`crate::seal`]); [`ServerEndpoint::route_opened`] takes no other.
    Key {
        /// Where its handshake came from (a UDP address, or a TCP connection's peer).
        address: std::net::SocketAddr,
        /// Its static public key (X25519).
        key: [u8; 32],
    },
    /// An ONC RPC caller with an `AUTH_SYS` credential: the address its call came from and the
    /// user and group it says it is. Claims of the calling machine, not proofs: believe them as far
    /// as you trust the machines that can reach the server.
    System {
        /// Where the call came from.
        address: std::net::SocketAddr,
        /// The user id the credential claims.
        uid: u32,
        /// The group id it claims.
        gid: u32,
    },
}

impl Caller {
    /// Whose part of a carrier's share the caller's bindings take: its IP address, or its user.
    pub fn source(&self) -> Source {
        match *self {
            Caller::Address(a) => Source::Address(a.ip().to_canonical()),
            Caller::Process { uid, .. } => Source::User(uid),
            Caller::Key { address, .. } | Caller::System { address, .. } => {
                Source::Address(address.ip().to_canonical())
            }
        }
    }

    /// Whether the binding's packets are sealed: it was made by a secure handshake.
    pub fn is_sealed(&self) -> bool {
        matches!(self, Caller::Key { .. })
    }
}

/// What a frame on a connection's binding asks for ([`ServerEndpoint::on_frame`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framed {
    /// A new call, admitted: count it with [`ServerEndpoint::run_started`] when it runs.
    Call,
    /// Send this header back alone: a probe's reply, or a refusal (`Reject`, or a `Result` with
    /// `Busy` for a call refused because the server is full or draining, which the client retries
    /// after backing off).
    Answer(Header),
    /// A cancel of the slot's call: an async procedure stops, a plain one runs to its end.
    Cancel,
    /// Not a frame a client sends: count it and close the connection.
    Malformed,
}

/// What the bytes read from a connection ask for next ([`ServerEndpoint::read_frame`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrived {
    /// An admitted call, whole at the front of the deframer ([`Deframer::frame`]: its header, then
    /// its arguments from [`crate::wire::HEADER_LEN`] on): run it (counted with
    /// [`ServerEndpoint::run_started`]), and consume the frame when its arguments are no longer
    /// needed there.
    Call {
        /// The client slot.
        slot: u32,
        /// The call's number.
        seq: u32,
        /// The procedure.
        procedure: u16,
        /// The call carries a context ([`flags::CONTEXT`]).
        context: bool,
    },
    /// Send this header back as a frame of its own (the frame it answers is consumed).
    Answer(Header),
    /// The slot's call `seq` is cancelled: an async procedure stops (the frame is consumed).
    Cancel {
        /// The client slot.
        slot: u32,
        /// The call's number.
        seq: u32,
    },
    /// Nothing whole yet: read more bytes into [`Deframer::spare`].
    More,
    /// The peer broke the framing or sent what a client never sends: close the connection.
    Close,
}

/// When the packets of one binding that one reader handles next write the binding's last activity
/// (a connection's frames, [`ServerEndpoint::read_frame`]; the datagrams of the binding a UDP
/// worker holds, [`Held`](super::Held)): until then, a packet skips the write, which would change
/// nothing (nanoseconds since the endpoint's start, a clock subtraction and a multiply, worked out
/// for every packet). A write by anything else only moves the next write later, so a packet never
/// skips a write its own would have made.
#[derive(Debug, Default, Clone, Copy)]
pub struct Activity {
    due: Option<Instant>,
}

impl<A: Copy + Eq + Hash, E> ServerEndpoint<A, E> {
    /// Decides what the bytes buffered in `frames`, read from `binding`'s connection at `now`, ask
    /// for next: a whole frame counts as the binding's activity (through `activity`, the
    /// connection's) and is checked and decided as by [`ServerEndpoint::on_frame`]; a frame
    /// that has filled the buffer makes it grow toward its length (twice what it holds at most,
    /// so that a prefix claiming a large frame is given only as much as has arrived), each step
    /// charged first through `grow` (false: no room); a frame the budgets have no room for is
    /// refused from its header, `Busy` (the client tries again later, [`crate::timing::Refusals`])
    /// or, larger than the binding's memory could ever hold ([`Binding::memory_most`]),
    /// `TooLarge`; its bytes are dropped as they arrive, never held.
    pub fn read_frame(
        &self,
        frames: &mut Deframer,
        binding: &Binding<A, E>,
        activity: &mut Activity,
        now: Instant,
        mut grow: impl FnMut(usize) -> bool,
    ) -> Arrived {
        let len = match frames.next() {
            Err(_) => return Arrived::Close,
            Ok(Next::Nothing) => return Arrived::More,
            Ok(Next::Partial(len)) => len,
            Ok(Next::Frame(_)) => {
                let Ok(p) = check_frame(frames.frame()) else { return Arrived::Close };
                let (slot, seq, procedure) = (p.slot(), p.seq(), p.procedure());
                let context = p.flags() & flags::CONTEXT != 0;
                self.touch_through(activity, binding, now);
                let arrived = match self.decide_frame(binding, &p, now) {
                    Framed::Call => return Arrived::Call { slot, seq, procedure, context },
                    Framed::Answer(h) => Arrived::Answer(h),
                    Framed::Cancel => Arrived::Cancel { slot, seq },
                    Framed::Malformed => return Arrived::Close,
                };
                frames.consume();
                return arrived;
            }
        };
        if !frames.needs_room(len) {
            return Arrived::More;
        }
        let to = frames.next_size(len);
        let never = PREFIX_LEN + len > binding.memory_most();
        if !never && grow(to) {
            frames.grow_toward(len, to);
            return Arrived::More;
        }
        // The header comes first: the refusal needs its slot and number.
        let Some(header) = frames.header() else { return Arrived::More };
        // Only the header is here: it is checked as far as it goes (the payload follows).
        let p = Packet::new_unchecked(header);
        if p.kind() != Kind::Call || p.binding() != binding.id || p.incarnation() != self.config.incarnation {
            return Arrived::Close;
        }
        let status = if never { Status::TooLarge } else { Status::Busy };
        let answer = self.stream_answer(binding, Kind::Result, status, (p.slot(), p.seq(), p.procedure()));
        frames.skip_frame();
        Arrived::Answer(answer)
    }

    /// Whether there is room for another binding of any carrier (and the endpoint is not
    /// draining): a transport asks before it spends anything on a bind request it could not grant.
    pub fn has_room(&self) -> bool {
        !self.is_draining() && self.len() < self.config.max_bindings
    }

    /// Grants a binding carried by a connection or a region (`carrier` is not
    /// [`Carrier::Datagram`]) to a bind request the bind machine admitted, in the table every
    /// carrier shares. `None` when the table is full or the endpoint is draining. Its memory lies
    /// within its carrier's share alone; [`ServerEndpoint::connect_from`] puts it within its
    /// source's part of that share.
    pub fn connect(&self, carrier: Carrier, export: E, now: Instant) -> Option<Arc<Binding<A, E>>> {
        self.connect_within(carrier, self.carrier_budget(carrier), None, 0, export, now)
    }

    /// [`ServerEndpoint::connect`] for a bind request from `caller`, granted the protocol
    /// `features`: the memory of all the bindings of one source ([`Caller::source`]) and carrier
    /// together lies within half of the carrier's share, so that one address (or one local user)
    /// filling what it may hold leaves the others room.
    pub fn connect_from(
        &self,
        carrier: Carrier,
        caller: Caller,
        features: u16,
        export: E,
        now: Instant,
    ) -> Option<Arc<Binding<A, E>>> {
        self.connect_within(carrier, self.part(carrier, caller.source()), Some(caller), features, export, now)
    }

    /// `source`'s part of `carrier`'s share: half of it, for all of the source's bindings of that
    /// carrier together, made when it binds first and gone with its last binding.
    pub(super) fn part(&self, carrier: Carrier, source: Source) -> Arc<super::Budget> {
        let mut sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
        match sources.get(&(carrier, source)).and_then(std::sync::Weak::upgrade) {
            Some(budget) => budget,
            None => {
                // The parts of sources whose bindings are all gone go (at most one entry for
                // each binding held, and one more).
                sources.retain(|_, part| part.strong_count() > 0);
                let share = self.carrier_budget(carrier);
                let part = Arc::new(super::Budget::within(share.limit() / 2, share));
                sources.insert((carrier, source), Arc::downgrade(&part));
                part
            }
        }
    }

    fn connect_within(
        &self,
        carrier: Carrier,
        outer: Arc<super::Budget>,
        caller: Option<Caller>,
        features: u16,
        export: E,
        now: Instant,
    ) -> Option<Arc<Binding<A, E>>> {
        debug_assert!(carrier != Carrier::Datagram, "datagram bindings are granted by `grant`");
        if self.is_draining() {
            return None;
        }
        let mut table = self.bindings.write().unwrap_or_else(|p| p.into_inner());
        let index = self.free_place(&mut table)?;
        // No datagrams: the size only sizes what the binding never uses.
        let terms = Terms { max_datagram: crate::wire::HEADER_LEN + 1, features };
        let id = index as u32 + 1;
        let binding =
            Arc::new(Binding::new(&self.config, carrier, id, 0, export, terms, outer, caller, self.nanos(now)));
        table[index] = Some(binding.clone());
        self.held.fetch_add(1, Ordering::AcqRel);
        Some(binding)
    }

    /// Takes a connection's binding out of the table (its connection is over): its id is free for
    /// the next binding. Idempotent.
    pub fn release(&self, binding: &Arc<Binding<A, E>>) {
        let mut table = self.bindings.write().unwrap_or_else(|p| p.into_inner());
        let Some(entry) = (binding.id as usize).checked_sub(1).and_then(|i| table.get_mut(i)) else { return };
        if entry.as_ref().is_some_and(|b| Arc::ptr_eq(b, binding)) {
            *entry = None;
            self.held.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Counts activity of `binding` at `now` (written at most every 100 ms): an active binding is
    /// not forgotten as idle.
    #[inline]
    pub fn touch(&self, binding: &Binding<A, E>, now: Instant) {
        self.touch_until(binding, now);
    }

    /// [`ServerEndpoint::touch`] through `activity`, the binding's as one reader keeps it: skipped
    /// until the next write could change anything.
    #[inline]
    pub(super) fn touch_through(&self, activity: &mut Activity, binding: &Binding<A, E>, now: Instant) {
        if activity.due.is_none_or(|due| now >= due) {
            activity.due = now.checked_add(Duration::from_nanos(self.touch_until(binding, now)));
        }
    }

    /// [`ServerEndpoint::touch`], returning how long after `now` (in nanoseconds) a touch would
    /// next write the binding's last activity: until then, touching it again changes nothing.
    #[inline]
    fn touch_until(&self, binding: &Binding<A, E>, now: Instant) -> u64 {
        let t = self.nanos(now);
        let next = binding.last_active.load(Ordering::Relaxed) + TOUCH_EVERY;
        if t >= next {
            binding.last_active.store(t, Ordering::Relaxed);
            return TOUCH_EVERY;
        }
        next - t
    }

    /// Decides on a whole frame `p` (checked with [`crate::stream::check_frame`]) that arrived on
    /// `binding`'s connection at `now`, and counts it as the binding's activity. The frame must
    /// name the binding (and carry no token: the connection is the capability) and this
    /// incarnation, and a slot of the binding; a call is admitted as a datagram's is
    /// ([`ServerEndpoint::admit_call`]).
    pub fn on_frame(&self, binding: &Binding<A, E>, p: &Packet<&[u8]>, now: Instant) -> Framed {
        self.touch(binding, now);
        self.decide_frame(binding, p, now)
    }

    /// [`ServerEndpoint::on_frame`] without counting the frame as activity.
    fn decide_frame(&self, binding: &Binding<A, E>, p: &Packet<&[u8]>, now: Instant) -> Framed {
        let answer = |kind, status| self.stream_answer(binding, kind, status, (p.slot(), p.seq(), p.procedure()));
        if p.binding() != binding.id || p.token() != 0 {
            return Framed::Answer(answer(Kind::Reject, Status::UnknownBinding));
        }
        if p.incarnation() != self.config.incarnation {
            return Framed::Answer(answer(Kind::Reject, Status::WrongIncarnation));
        }
        if p.slot() >= binding.slots() {
            return Framed::Answer(answer(Kind::Reject, Status::BadSlot));
        }
        match p.kind() {
            Kind::Call if self.admit_call(binding, || now) => Framed::Call,
            Kind::Call => Framed::Answer(answer(Kind::Result, Status::Busy)),
            Kind::Probe => Framed::Answer(answer(Kind::ProbeReply, Status::Ok)),
            Kind::Cancel => Framed::Cancel,
            _ => Framed::Malformed,
        }
    }

    /// The header of an answer of `kind` and `status` to a frame of `binding`'s connection for
    /// `slot`, call `seq` of `procedure`, with no payload (a refusal the transport decides itself,
    /// such as a frame too large for the binding's memory).
    pub fn stream_answer(&self, binding: &Binding<A, E>, kind: Kind, status: Status, at: (u32, u32, u16)) -> Header {
        let (slot, seq, procedure) = at;
        Header {
            status,
            procedure,
            binding: binding.id,
            slot,
            seq,
            incarnation: self.config.incarnation,
            ..Header::new(kind)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::EndpointConfig;
    use crate::timing::Timing;

    fn endpoint(now: Instant) -> ServerEndpoint<u8, ()> {
        let config = EndpointConfig {
            incarnation: 9,
            max_bindings: 2,
            slots_per_binding: 2,
            binding_memory: 1000,
            memory: 1500,
            carrier_memory: 1500,
            stalled_after: Duration::from_secs(2),
            binding_idle: Duration::from_secs(10),
            max_running: 1,
            timing: Timing::default(),
        };
        ServerEndpoint::new(config, now, Box::new(crate::bind::InsecureChallenges))
    }

    fn frame(kind: Kind, binding: u32, token: u128, incarnation: u64, slot: u32) -> Vec<u8> {
        Header { binding, token, incarnation, slot, seq: 1, ..Header::new(kind) }.to_bytes().to_vec()
    }

    fn decide(e: &ServerEndpoint<u8, ()>, b: &Binding<u8, ()>, bytes: &[u8], now: Instant) -> Framed {
        e.on_frame(b, &Packet::new_checked(bytes).unwrap(), now)
    }

    /// Frames read through a connection's [`Activity`] skip the write of the binding's last
    /// activity while it would change nothing, and write it when [`ServerEndpoint::on_frame`]
    /// would: the binding's last activity is the same after each frame either way, a write by
    /// something else between them (which moves the next write later) included.
    #[test]
    fn frames_read_through_their_connections_activity_write_it_when_each_frame_would() {
        let now = Instant::now();
        let (read_e, decided_e) = (endpoint(now), endpoint(now));
        let read_b = read_e.connect(Carrier::Stream, (), now).unwrap();
        let decided_b = decided_e.connect(Carrier::Stream, (), now).unwrap();
        let mut frames = Deframer::new(1 << 10, 1 << 10);
        let mut activity = Activity::default();
        // Each frame's time; `false`: a touch by something else instead.
        let events = [
            (0, true),
            (30, true),
            (99, true),
            (100, true),
            (150, true),
            (199, true),
            (210, true),
            (260, true),
            (305, true),
            (311, true),
            (312, true),
            (500, true),
            (620, false),
            (650, true),
            (700, true),
            (720, true),
        ];
        for (at, by_frame) in events {
            let at = now + Duration::from_millis(at);
            if !by_frame {
                read_e.touch(&read_b, at);
                decided_e.touch(&decided_b, at);
                continue;
            }
            let bytes = frame(Kind::Probe, read_b.id, 0, 9, 0);
            let mut framed = crate::stream::prefix(bytes.len()).to_vec();
            framed.extend_from_slice(&bytes);
            frames.spare()[..framed.len()].copy_from_slice(&framed);
            frames.filled(framed.len());
            let arrived = read_e.read_frame(&mut frames, &read_b, &mut activity, at, |_| false);
            assert!(matches!(arrived, Arrived::Answer(h) if h.kind == Kind::ProbeReply));
            assert_eq!(answered(decide(&decided_e, &decided_b, &bytes, at)), (Kind::ProbeReply, Status::Ok));
            assert_eq!(
                read_b.last_active.load(Ordering::Relaxed),
                decided_b.last_active.load(Ordering::Relaxed),
                "after the frame at {at:?}"
            );
        }
        // Written at 100, 210, 311, 500, 620 (the other touch) and 720 ms: each 100 ms or more
        // after the last write.
        assert_eq!(read_b.last_active.load(Ordering::Relaxed), 720_000_000);
    }

    fn answered(f: Framed) -> (Kind, Status) {
        match f {
            Framed::Answer(h) => (h.kind, h.status),
            other => panic!("expected an answer, got {other:?}"),
        }
    }

    #[test]
    fn every_carrier_shares_one_table_and_max_bindings() {
        let now = Instant::now();
        let e = endpoint(now);
        let tcp = e.connect(Carrier::Stream, (), now).unwrap();
        let shm = e.connect(Carrier::Region, (), now).unwrap();
        assert_ne!(tcp.id, shm.id);
        assert_eq!(e.len(), 2);
        assert!(!e.has_room());
        let terms = Terms { max_datagram: 1000, features: 0 };
        assert!(e.grant(1, 1, (), 5, terms, now).is_none(), "a datagram binding finds the table full too");
        assert!(e.connect(Carrier::Stream, (), now).is_none());
        e.release(&tcp);
        e.release(&tcp);
        assert_eq!(e.len(), 1, "released once, however often asked");
        let (udp, _) = e.grant(1, 1, (), 5, terms, now).unwrap();
        assert_eq!(udp.id, tcp.id, "the freed id is taken again");
        e.release(&shm);
        e.drain();
        assert!(!e.has_room());
        assert!(e.connect(Carrier::Region, (), now).is_none(), "a draining endpoint binds no one");
    }

    #[test]
    fn the_bindings_of_one_source_hold_at_most_half_their_carriers_share() {
        let now = Instant::now();
        // A share of 1,500 bytes: 750 for each source, whatever its bindings may hold alone.
        let config = EndpointConfig {
            incarnation: 9,
            max_bindings: 3,
            slots_per_binding: 2,
            binding_memory: 1000,
            memory: 3000,
            carrier_memory: 1500,
            stalled_after: Duration::from_secs(2),
            binding_idle: Duration::from_secs(10),
            max_running: 1,
            timing: Timing::default(),
        };
        let e: ServerEndpoint<u8, ()> = ServerEndpoint::new(config, now, Box::new(crate::bind::InsecureChallenges));
        // Two ports of one address are one source.
        let a = Caller::Address(([127, 0, 0, 2], 4000).into());
        let (a2, b) = (Caller::Address(([127, 0, 0, 2], 4001).into()), Caller::Process { uid: 1000, pid: 7 });
        let first = e.connect_from(Carrier::Stream, a, 0, (), now).unwrap();
        let second = e.connect_from(Carrier::Stream, a2, 0, (), now).unwrap();
        assert_eq!((first.caller, second.caller), (Some(a), Some(a2)), "each binding knows its own caller");
        assert!(first.reserve(500));
        assert!(!second.reserve(500), "the source's two bindings past its part");
        assert!(second.reserve(250));
        let other = e.connect_from(Carrier::Stream, b, 0, (), now).unwrap();
        assert!(other.reserve(750), "another source has a part of its own");
        assert!(!other.reserve(1));
        assert_eq!(e.memory(), 1500);
        first.release(500);
        second.release(250);
        other.release(750);
        for binding in [&first, &second, &other] {
            e.release(binding);
        }
        drop((first, second, other));
        assert_eq!(e.memory(), 0);
        // A source whose bindings are gone starts again with its whole part.
        let again = e.connect_from(Carrier::Stream, a, 0, (), now).unwrap();
        assert!(again.reserve(750));
    }

    #[test]
    fn a_connections_binding_is_not_reached_by_datagram() {
        let now = Instant::now();
        let e = endpoint(now);
        let tcp = e.connect(Carrier::Stream, (), now).unwrap();
        assert!(e.lookup(tcp.id, 0).is_none(), "token zero proves nothing over UDP");
        assert_eq!(tcp.slot(0).map(|_| ()), None, "no datagram slot state is kept for it");
        assert_eq!(tcp.slots(), 2);
    }

    #[test]
    fn frames_are_checked_and_calls_admitted_as_datagrams_are() {
        let now = Instant::now();
        let e = endpoint(now);
        let b = e.connect(Carrier::Stream, (), now).unwrap();
        assert_eq!(decide(&e, &b, &frame(Kind::Call, b.id, 0, 9, 0), now), Framed::Call);
        let refusal = |kind, id, token, inc, slot| answered(decide(&e, &b, &frame(kind, id, token, inc, slot), now));
        assert_eq!(refusal(Kind::Call, b.id + 1, 0, 9, 0), (Kind::Reject, Status::UnknownBinding));
        assert_eq!(refusal(Kind::Call, b.id, 7, 9, 0), (Kind::Reject, Status::UnknownBinding));
        assert_eq!(refusal(Kind::Call, b.id, 0, 8, 0), (Kind::Reject, Status::WrongIncarnation));
        assert_eq!(refusal(Kind::Call, b.id, 0, 9, 2), (Kind::Reject, Status::BadSlot));
        assert_eq!(refusal(Kind::Probe, b.id, 0, 9, 1), (Kind::ProbeReply, Status::Ok));
        assert_eq!(decide(&e, &b, &frame(Kind::Cancel, b.id, 0, 9, 1), now), Framed::Cancel);
        assert_eq!(decide(&e, &b, &frame(Kind::Result, b.id, 0, 9, 1), now), Framed::Malformed);
        // max_running (1) bounds the workers' calls, which a connection's calls do not take: its
        // threads were paid for when it bound. Neither kind is refused for the other.
        e.run_started(&b);
        assert_eq!(e.running(), 1);
        assert_eq!(decide(&e, &b, &frame(Kind::Call, b.id, 0, 9, 1), now), Framed::Call);
        let terms = Terms { max_datagram: 1000, features: 0 };
        let (udp, _) = e.grant(1, 1, (), 5, terms, now).unwrap();
        assert!(e.admit_call(&udp, || now), "a datagram's call finds the workers free");
        e.run_started(&udp);
        assert!(!e.admit_call(&udp, || now), "max_running");
        assert_eq!(decide(&e, &b, &frame(Kind::Call, b.id, 0, 9, 1), now), Framed::Call);
        e.run_finished(&udp);
        e.run_finished(&b);
        assert_eq!(e.running(), 0);
        e.drain();
        assert_eq!(refusal(Kind::Call, b.id, 0, 9, 1), (Kind::Result, Status::Busy), "draining");
        assert_eq!(refusal(Kind::Probe, b.id, 0, 9, 1), (Kind::ProbeReply, Status::Ok), "still answered");
    }

    #[test]
    fn an_idle_stream_binding_expires_unless_a_call_runs_and_a_region_lasts() {
        let now = Instant::now();
        let e = endpoint(now);
        let tcp = e.connect(Carrier::Stream, (), now).unwrap();
        let shm = e.connect(Carrier::Region, (), now).unwrap();
        let later = now + Duration::from_secs(11);
        tcp.call_began();
        assert_eq!(e.expire(later), 0, "a call runs");
        assert!(!tcp.is_expired());
        tcp.call_ended();
        // Heard from a moment ago: not idle.
        decide(&e, &tcp, &frame(Kind::Probe, tcp.id, 0, 9, 0), later);
        assert_eq!(e.expire(later + Duration::from_secs(9)), 0);
        assert_eq!(e.expire(later + Duration::from_secs(11)), 1);
        assert!(tcp.is_expired() && !shm.is_expired());
        assert_eq!(e.expire(later + Duration::from_secs(12)), 0, "counted once");
        assert_eq!(e.len(), 2, "held until its transport releases it");
        e.release(&tcp);
        assert_eq!(e.len(), 1);
    }
}
