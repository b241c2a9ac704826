//! The client side of the UDP transport: a calling thread's endpoint on a binding, with its client
//! slot, socket, buffers and prebuilt header.
//!
//! The fast path of a call is all here: [`UdpEndpoint::run`] writes the changing header fields into the
//! template, sends header, scratch and borrowed argument slices with one system call (`sendmsg`, or
//! for a datagram of at most `tiercel_sys::udp::GATHER_SMALL` bytes, copied into one buffer, `send`),
//! then waits on the endpoint's own socket (spinning, then blocking), so the result arrives at this thread with no
//! dispatcher and no handoff. Nothing on this path allocates once the endpoint exists.
//!
//! This file holds the endpoint and a call's steps; `sending` sends a call's fragments, and
//! `receiving` puts a result's fragments straight into their place.

use std::io::{ErrorKind, IoSlice, IoSliceMut};
use std::net::UdpSocket;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tiercel_proto::bind::wire::features;
use tiercel_proto::client::{ClientCall, Failure, Handled, Outcome, Transmit};
use tiercel_proto::context::{self, Context};
use tiercel_proto::fragment::{fragment_count, fragment_range};
use tiercel_proto::seal::{OUTER_LEN, SEAL_OVERHEAD};
use tiercel_proto::wire::{flags, Header, Kind, Packet, Status, CHECKSUM_LEN, HEADER_LEN};
use tiercel_sys::mmsg;
use tiercel_sys::udp::{self, Received};

use super::BindingInner;
use crate::retention::Retention;
use crate::steps::{mark, Point};
use crate::transmit::{self, MAX_RUN as MAX_LANDED};
use crate::waiting::spin::{SpinBudget, SpinDeadline, SPINNERS};
use crate::wire::{Segments, MAX_SEGMENTS};
use crate::{Binding, CallError};

mod receiving;
mod sending;
mod shared;

pub(crate) use shared::SharedPort;

use receiving::InPlace;

impl UdpEndpoint {
    /// The binding's unique id (what the thread's cache knows it by).
    pub(super) fn uid(&self) -> u64 {
        self.uid
    }
    /// Whether the binding still exists.
    pub(super) fn is_live(&self) -> bool {
        self.binding.strong_count() > 0
    }
}

pub(crate) struct UdpEndpoint {
    uid: u64,
    binding: Weak<BindingInner>,
    socket: UdpSocket,
    slot: u32,
    seq: u32,
    frag_payload: usize,
    template: [u8; HEADER_LEN],
    scratch: Vec<u8>,
    rx: Vec<u8>,
    result_len: usize,
    big_result: Option<Vec<u8>>,
    call: ClientCall,
    /// `call.retransmissions()` as already added to the binding's counter.
    counted_retransmissions: u64,
    /// `call.retransmissions()` when the call being made started.
    retransmissions_at_start: u64,
    spin: SpinBudget,
    /// `flags::CHECKSUM` when the binding checksums its packets, else 0.
    flag_base: u8,
    /// `flags::CONTEXT` when the call being made starts with a context block, else 0.
    context_flag: u8,
    /// The deadline of the call being made, when its context carries one: refreshed in the block
    /// before every send, so that a retransmission tells the time left then.
    context_deadline: Option<Instant>,
    /// When large messages last passed (their buffers are kept a while).
    retention: Retention,
    /// Call fragments sent together by one segmented send (UDP GSO), or 0 to send them one by one:
    /// how many full datagrams fit in one, when the path's datagrams are small enough for two.
    run_length: usize,
    /// Whether the socket can take runs of result fragments whole (UDP GRO: on the same paths, when
    /// the kernel agreed), so that receives are cut where each datagram ends.
    coalescing: bool,
    /// Whether it does now: GRO costs the kernel more for every datagram received
    /// ([`udp::set_gro`]), so it is on only while large messages pass: from the first (a call of
    /// several fragments, or a result's first fragment) until the endpoint's buffers for them go.
    gro: bool,
    /// The result fragments of the call being made that were received straight into the caller's
    /// buffer ([`UdpEndpoint::run_in_out`]), one bit each.
    in_tail: Vec<u64>,
    /// The last call was given up while the server may still run it: the next leaves it the slot.
    leaving: bool,
    /// The binding's keys when it is secure: every packet sealed, each datagram opened before it
    /// is read (and none received in place).
    seal: Option<Arc<crate::secure::Session>>,
    /// The endpoint's port steered to the binding's AF_XDP station, when it has one: datagrams go
    /// and come through it, one at a time (no segmented sends, none received in place), and the
    /// socket only holds the port.
    xdp: Option<crate::xdp::Port>,
    /// The longest a receive that blocks waits on the socket
    /// ([`RECEIVE_WAIT`](crate::waiting::RECEIVE_WAIT) as the kernel took it), when a call blocked
    /// for its result waits in its receive ([`UdpEndpoint::waits_in_receive`]); `None` when it
    /// waits in `poll` (the socket of an async endpoint, which does not block, or a kernel that
    /// refused the read timeout).
    receive_wait: Option<Duration>,
    /// The socket the binding's threads beyond its first share, when this endpoint's is that one
    /// (`shared`): its datagrams come through its slot's mailbox, its calls go out in batches.
    port: Option<Arc<SharedPort>>,
    /// The call just sent waits in the port's batch of this number, for the others' calls to join
    /// it (`SharedPort::gathered`).
    queued: Option<u64>,
    /// The packets being sent are a call's first (`sending::flush` from `send_call`).
    starting: bool,
    /// Counted among the binding's threads' UDP endpoints (`BindingInner::udp_threads`).
    counted: bool,
}

impl UdpEndpoint {
    /// A thread's endpoint: through the binding's AF_XDP station when it has one. With `thread`
    /// (a calling thread's, not the async calls' pool), an endpoint made while another thread's
    /// lives shares the binding's port (`shared`) where it can.
    pub(super) fn new(inner: &Arc<BindingInner>, thread: bool) -> Result<UdpEndpoint, CallError> {
        let mut ep = UdpEndpoint::through_kernel(inner, thread)?;
        if let Some(station) = &inner.xdp {
            let (std::net::SocketAddr::V4(server), Ok(std::net::SocketAddr::V4(local))) =
                (inner.server, ep.socket.local_addr())
            else {
                return Ok(ep);
            };
            // A port the station cannot steer (its table is full) leaves this endpoint on the
            // kernel's UDP.
            if let Ok(port) = crate::xdp::Port::open(station, local.port(), server) {
                ep.xdp = Some(port);
                (ep.run_length, ep.coalescing) = (0, false);
                if ep.gro {
                    ep.gro = !udp::set_gro(&ep.socket, false);
                }
                ep.rx.truncate(inner.max_datagram + CHECKSUM_LEN.max(SEAL_OVERHEAD));
            }
        }
        Ok(ep)
    }

    /// An endpoint whose datagrams go through the kernel's UDP.
    fn through_kernel(inner: &Arc<BindingInner>, thread: bool) -> Result<UdpEndpoint, CallError> {
        let free = inner.take_slot()?;
        let (slot, seq) = (free.slot, free.seq);
        // A thread's endpoint made while another's lives shares the port, on a binding whose calls
        // spin (callers that block at once were left out when they took no turn in which the
        // others' calls could join their own; with the few they take now, `spin::WAIT_TURNS`,
        // sharing is not yet measured), with nothing that takes datagrams one by one (AF_XDP,
        // sealing, checksum trailers).
        let sharing = thread
            && inner.udp_threads.fetch_add(1, Ordering::Relaxed) > 0
            && inner.config.batch_threads
            && !inner.config.checksum
            && inner.config.spin != crate::config::Spin::Never
            && inner.xdp.is_none()
            && inner.seal.is_none();
        let port =
            if sharing { inner.udp_port.get_or_init(|| SharedPort::open(inner).map(Arc::new)).clone() } else { None };
        let socket = match &port {
            Some(port) => port.socket.try_clone(),
            None => udp::connect(inner.server),
        };
        let socket = match socket {
            Ok(s) => s,
            Err(e) => {
                if thread {
                    inner.udp_threads.fetch_sub(1, Ordering::Relaxed);
                }
                inner.free_slots.give(free);
                return Err(e.into());
            }
        };
        let frag_payload = inner.max_datagram - HEADER_LEN;
        let seal = inner.seal.clone();
        if seal.is_some() {
            transmit::prepare_sealing();
        }
        // A secure binding's packets are sealed one by one and sent alone.
        let run_length = match transmit::run_length(inner.max_datagram + CHECKSUM_LEN) {
            n if n >= 2 && seal.is_none() => n,
            _ => 0,
        };
        // Small datagrams (a path MTU's): the server's result fragments may arrive as runs. Asked
        // for, then off until a large message passes.
        let (coalescing, gro) = if port.is_some() {
            // The port's socket takes runs whole, always.
            (true, true)
        } else {
            let coalescing = run_length >= 2 && udp::set_gro(&socket, true);
            (coalescing, coalescing && !udp::set_gro(&socket, false))
        };
        let rx_len = inner.max_datagram + CHECKSUM_LEN.max(if seal.is_some() { SEAL_OVERHEAD } else { 0 });
        let receive_wait =
            if port.is_some() { None } else { udp::set_receive_wait(&socket, crate::waiting::RECEIVE_WAIT) };
        Ok(UdpEndpoint {
            uid: inner.uid,
            binding: Arc::downgrade(inner),
            socket,
            slot,
            seq,
            frag_payload,
            template: template(inner, slot),
            scratch: Vec::with_capacity(frag_payload),
            rx: vec![0; if coalescing { rx_len.max(udp::GRO_BUFFER) } else { rx_len }],
            result_len: 0,
            big_result: None,
            call: fresh_call(inner),
            counted_retransmissions: 0,
            retransmissions_at_start: 0,
            spin: SpinBudget::new(inner.config.spin),
            flag_base: if inner.config.checksum { flags::CHECKSUM } else { 0 },
            context_flag: 0,
            context_deadline: None,
            retention: Retention::default(),
            run_length,
            coalescing,
            gro,
            in_tail: Vec::new(),
            leaving: false,
            seal,
            xdp: None,
            receive_wait,
            port,
            queued: None,
            starting: false,
            counted: thread,
        })
    }

    /// Prepares the endpoint for a call whose message starts with `context` (when not empty).
    /// The call being made is given up while the server may still run it: the next call leaves
    /// it the slot ([`UdpEndpoint::leave_slot`]).
    pub(super) fn abandon(&mut self) {
        self.leaving = true;
    }

    /// Trades the slot a call given up may still hold on the server for a free one, where there is
    /// one ([`super::slots`]): the next call goes out at once, not behind it.
    fn leave_slot(&mut self, inner: &BindingInner) {
        self.leaving = false;
        let Some(free) = inner.free_slots.trade(self.slot, self.seq) else { return };
        let uncounted = self.call.retransmissions() - self.counted_retransmissions;
        inner.stats.retransmissions.fetch_add(uncounted, Ordering::Relaxed);
        (self.slot, self.seq) = (free.slot, free.seq);
        self.template = template(inner, free.slot);
        // The new slot's address is not proven yet, and its round trips are its own.
        self.call = fresh_call(inner);
        self.counted_retransmissions = 0;
        self.retransmissions_at_start = 0;
    }

    pub(super) fn begin(&mut self, context: &Context) {
        self.scratch.clear();
        self.context_flag = 0;
        self.context_deadline = None;
        if !context.is_empty() {
            let mut block = [0u8; context::MAX_LEN];
            let n = context.encode(&mut block);
            self.scratch.extend_from_slice(&block[..n]);
            self.context_flag = flags::CONTEXT;
        }
        if let Some(buf) = self.big_result.take() {
            // The next multi-packet result is reassembled in this one's buffer.
            self.call.recycle(buf);
        } else if self.retention.holds_large() && self.retention.idle(Instant::now()) {
            // No large message for a while: give back the buffers large ones grew, and take
            // datagrams one by one again.
            self.call.drop_spare();
            self.set_gro(false);
        }
        self.result_len = 0;
    }

    pub(super) fn scratch_mut(&mut self) -> &mut Vec<u8> {
        &mut self.scratch
    }

    /// The marshaled results of the last call.
    pub(super) fn result(&self) -> &[u8] {
        match &self.big_result {
            Some(v) => v,
            None => self.rx.get(HEADER_LEN..self.result_len).unwrap_or(&[]),
        }
    }

    /// Makes the call: send, wait, and leave the results where [`UdpEndpoint::result`] finds them.
    pub(super) fn run(&mut self, binding: &Binding, procedure: u16, segs: &Segments<'_>) -> Result<(), CallError> {
        let (len, start) = self.send_call(binding, procedure, segs)?;
        let end = self.wait(&binding.inner, segs, None, len, start)?;
        self.spin.observe(self.call.took().unwrap_or_else(|| end.saturating_duration_since(start)));
        self.finish(&binding.inner, procedure)
    }

    /// Makes a call whose message is `segs` followed by `tail` (the caller's buffer, lent mutably:
    /// an `InOut` that is the procedure's one buffer and last argument, whose bytes begin the
    /// result). The fragments of the result that hold nothing but the buffer's bytes are received
    /// straight into `tail`, and the few others copied there once the result is whole; true when
    /// so, and the result's first `tail.len()` bytes, where [`UdpEndpoint::result`] finds the
    /// result, are then not to be read. False when the result came otherwise (one datagram, an
    /// error); `tail` may then hold part of what arrived. `segs` must take a tail
    /// ([`Segments::takes_tail`]).
    pub(super) fn run_in_out(
        &mut self,
        binding: &Binding,
        procedure: u16,
        segs: &Segments<'_>,
        tail: &mut [u8],
    ) -> Result<bool, CallError> {
        let (len, start) = self.send_lent(binding, procedure, segs, tail)?;
        let end = self.wait(&binding.inner, segs, Some(&mut *tail), len, start)?;
        self.spin.observe(self.call.took().unwrap_or_else(|| end.saturating_duration_since(start)));
        self.finish(&binding.inner, procedure)?;
        Ok(self.settle_lent(&binding.inner, tail))
    }

    /// [`UdpEndpoint::send_call`] of the message `segs` followed by `tail`, the buffer lent to the
    /// call ([`UdpEndpoint::run_in_out`]).
    pub(super) fn send_lent(
        &mut self,
        binding: &Binding,
        procedure: u16,
        segs: &Segments<'_>,
        tail: &[u8],
    ) -> Result<(usize, Instant), CallError> {
        let message = with_lent(segs, self.scratch.len(), tail)?;
        self.in_tail.clear();
        self.send_call(binding, procedure, &message)
    }

    /// Once a call with a lent buffer has its result: copies into `tail` the buffer's bytes that
    /// came the usual way, into the reassembly, and returns whether the result was received into
    /// it (false: one datagram, an error, or a result shorter than the buffer).
    pub(super) fn settle_lent(&mut self, inner: &BindingInner, tail: &mut [u8]) -> bool {
        let Some(result) = self.big_result.as_deref().filter(|r| r.len() >= tail.len()) else { return false };
        let mut lent = 0;
        for (i, chunk) in tail.chunks_mut(self.frag_payload).enumerate() {
            if self.in_tail.get(i / 64).is_none_or(|w| w & (1 << (i % 64)) == 0) {
                let at = i * self.frag_payload;
                tiercel_proto::copy::copy(chunk, &result[at..at + chunk.len()]);
            } else {
                lent += 1;
            }
        }
        inner.stats.in_place.fetch_add(1, Ordering::Relaxed);
        inner.stats.lent_fragments.fetch_add(lent, Ordering::Relaxed);
        true
    }

    /// Turns the socket's GRO on or off, when it can take runs whole.
    fn set_gro(&mut self, on: bool) {
        if self.port.is_none() && self.coalescing && self.gro != on && udp::set_gro(&self.socket, on) {
            self.gro = on;
        }
    }

    /// Packets the call being made (or last made) has retransmitted.
    pub(super) fn call_retransmissions(&self) -> u64 {
        self.call.retransmissions() - self.retransmissions_at_start
    }

    /// Tells the server, best effort, that the call being made is given up (its deadline passed,
    /// or its future was dropped): it stops reassembling it, or drops its saved result.
    pub(super) fn cancel(&self) {
        let _ = self.send_control(Kind::Cancel, 0, &[]);
    }

    fn send_control(&self, kind: Kind, flag: u8, payload: &[u8]) -> std::io::Result<usize> {
        let mut hdr = self.template;
        let mut p = Packet::new_unchecked(&mut hdr[..]);
        p.set_kind(kind);
        p.set_flags(flag | self.flag_base);
        p.set_fragment(0, 1);
        p.set_lengths(payload.len() as u32, payload.len() as u32);
        let io = [IoSlice::new(&hdr), IoSlice::new(payload)];
        self.send_datagram(&io)
    }

    /// Sends a datagram made of `io` to the server: through the AF_XDP station when the endpoint has
    /// one, else its socket; sealed on a secure binding, with a checksum trailer when the binding
    /// has them.
    #[inline]
    fn send_datagram(&self, io: &[IoSlice<'_>]) -> std::io::Result<usize> {
        let via = self.xdp.as_ref().map(crate::xdp::Port::via);
        transmit::send_via(via, &self.socket, None, io, self.flag_base != 0, self.seal.as_deref())
    }

    /// Spins, then blocks, until the call completes or fails. While packets of the call keep coming
    /// (acknowledgements of its fragments, fragments of its result), it spins for the next one from
    /// the last, as long as a wake-up would cost. Returns the clock's last reading before the look
    /// that ended the call, which is when the call ended to its timers: the packet that ends a call
    /// is handled without a clock read of its own, and the clock is read again after each packet
    /// handled and each wake-up.
    fn wait(
        &mut self,
        inner: &BindingInner,
        segs: &Segments<'_>,
        tail: Option<&mut [u8]>,
        len: usize,
        start: Instant,
    ) -> Result<Instant, CallError> {
        // Counted among the shared socket's threads in a call while it waits (no clone of the
        // port's `Arc` a call: its count is a line all the socket's threads write).
        if let Some(port) = &self.port {
            port.start_calling();
        }
        let waited = self.wait_for_result(inner, segs, tail, len, start);
        if let Some(port) = &self.port {
            port.stop_calling();
        }
        waited
    }

    /// [`UdpEndpoint::wait`], the endpoint counted among its shared socket's threads in a call.
    fn wait_for_result(
        &mut self,
        inner: &BindingInner,
        segs: &Segments<'_>,
        mut tail: Option<&mut [u8]>,
        len: usize,
        start: Instant,
    ) -> Result<Instant, CallError> {
        let mut deadline = SpinDeadline::new(start, &self.spin);
        let spinning = deadline.spinning(start);
        // Counted among the spinners until it blocks, a caller that blocks at once too: while it
        // takes its turns among the others (`take_turn`), the spinners yield to it. (Not counted
        // there, four and eight spinning threads on one UDP binding made a third to a half fewer
        // calls a second: the spinners no longer yielded while a caller whose adaptive spin had
        // run out took its turns.)
        let mut spinner = SPINNERS.start();
        let mut seen;
        // A caller that blocks at once yields to the others waiting, blocked or not; one that spins,
        // to those spinning (a blocked caller has nothing to run until its result comes).
        // A caller that blocks at once: its place among the others, and the turns it took among them.
        let (mut waiting, mut turns) = (None, 0);
        let yielded = if spinning {
            spinner.before_first_look()
        } else {
            waiting.insert(SPINNERS.waiting()).take_turn(&mut turns)
        };
        let lone = !yielded && len <= self.frag_payload && self.port.is_none();
        if lone && waiting.is_some() && self.call.deadline().is_none() {
            // A lone one-packet call that blocks at once, without a deadline: nothing before its
            // receive needs the clock (`waits_in_receive` reads it for a deadline only), which is
            // read when the receive returns. (Should it not block in the receive, the first look
            // below takes the call's start, a send ago, for the time.)
            seen = start;
        } else if lone {
            // A lone one-packet call: nothing to look for before its result. The wait reads the clock
            // and nothing else. With a `pause` in each turn, as the other spins have, a lone
            // caller's mean Null call took 0.04 to 0.15 µs longer than with no wait in three of
            // four A/B runs on our VM (perhaps the hypervisor's pause-loop exiting, which takes a
            // long run of `pause` for a lock's spin); without it, within 0.02 µs in three and 0.18
            // µs shorter in the fourth.
            let first = self.spin.first_look(start);
            loop {
                seen = Instant::now();
                if seen >= first {
                    break;
                }
            }
        } else {
            seen = Instant::now();
        }
        // What a receive that blocked brought: handled at the next turn as a look's find.
        let mut received = None;
        if !yielded
            && waiting.is_some()
            && len <= self.frag_payload
            && self.port.is_none()
            && self.waits_in_receive(seen)
        {
            // A lone one-packet call that blocks at once: a look made as soon as the call went out
            // finds nothing (its result is a round trip away), so the wait starts in the receive,
            // one system call where a look and the receive took two.
            spinner.stop();
            crate::steps::slept(crate::steps::Side::Client);
            received = Some(InPlace::Whole(udp::recv_wait(&self.socket, &mut self.rx)?, None));
            seen = Instant::now();
        }
        // Turns this call has waited in the port's batch for the others' calls.
        let mut gathering = 0;
        loop {
            if let (Some(batch), Some(port)) = (self.queued, &self.port) {
                if port.gathered(batch, gathering) {
                    self.queued = None;
                }
                gathering += 1;
            }
            let step = match received.take() {
                Some(got) => self.handle(got, inner, segs, tail.as_deref_mut(), len, seen)?,
                None => self.step(inner, segs, tail.as_deref_mut(), len, seen)?,
            };
            let now = match step {
                Step::Done => {
                    if let (Some(batch), Some(port)) = (self.queued.take(), &self.port) {
                        port.send_now(batch);
                    }
                    return Ok(seen);
                }
                Step::Progress => {
                    seen = Instant::now();
                    if deadline.progress(seen) {
                        spinner.resume();
                    }
                    continue;
                }
                Step::Idle(now) => now,
            };
            seen = now;
            if deadline.spinning(now) {
                if spinner.pause() {
                    // Other threads ran meanwhile: what the next look finds may have come since.
                    seen = Instant::now();
                }
                continue;
            }
            if waiting.as_ref().is_some_and(|w| w.take_turn(&mut turns)) {
                // Others ran meanwhile: look again before blocking (`spin::WAIT_TURNS`).
                seen = Instant::now();
                continue;
            }
            spinner.stop();
            if let (Some(batch), Some(port)) = (self.queued.take(), &self.port) {
                port.send_now(batch);
            }
            crate::steps::slept(crate::steps::Side::Client);
            if self.waits_in_receive(now) {
                // Blocks in the receive (a wait of at most `receive_wait`): the look and the wait
                // in one system call, where `poll` and a receive after it take two.
                received = Some(InPlace::Whole(udp::recv_wait(&self.socket, &mut self.rx)?, None));
                seen = Instant::now();
                continue;
            }
            let timeout = self.call.poll_timeout().map(|t| t.saturating_duration_since(now));
            match (&self.xdp, &self.port) {
                (None, None) => {
                    udp::wait_readable(&self.socket, timeout)?;
                }
                (None, Some(port)) => port.wait(self.slot, timeout)?,
                (Some(x), _) => {
                    x.station.wait(x.port, timeout)?;
                }
            };
            seen = Instant::now();
        }
    }

    /// Whether the call's wait for its next datagram, at `now`, blocks in the receive itself
    /// rather than in `poll`: when its socket blocks with a read timeout (`receive_wait`), its
    /// datagrams come through the kernel one by one (no AF_XDP, no coalesced runs, no result being
    /// received in place), and the call has no deadline within `receive_wait`. The receive wakes
    /// at the latest after `receive_wait`, and the call's timers are looked at then: a
    /// retransmission or probe may go out up to that late (a tick of the kernel's clock, 4 ms at
    /// 250 Hz), a deadline never.
    #[inline]
    fn waits_in_receive(&self, now: Instant) -> bool {
        self.receive_wait.is_some_and(|wait| {
            self.xdp.is_none()
                && !self.gro
                && self.call.result_len().is_none()
                && self.call.deadline().is_none_or(|d| d.saturating_duration_since(now) > wait)
        })
    }

    /// One look at the socket and at the call's timers, without blocking: handles a datagram if one
    /// is there (received, to the call's timers, at `seen`: the clock's last reading before this
    /// look), else a timer that is due, and sends what the protocol asks for.
    #[inline]
    pub(super) fn step(
        &mut self,
        inner: &BindingInner,
        segs: &Segments<'_>,
        mut tail: Option<&mut [u8]>,
        len: usize,
        seen: Instant,
    ) -> Result<Step, CallError> {
        let got = self.receive_in_place(inner, tail.as_deref_mut())?;
        self.handle(got, inner, segs, tail, len, seen)
    }

    /// [`UdpEndpoint::step`] once its look at the socket found `got`.
    #[inline]
    fn handle(
        &mut self,
        got: InPlace,
        inner: &BindingInner,
        segs: &Segments<'_>,
        tail: Option<&mut [u8]>,
        len: usize,
        seen: Instant,
    ) -> Result<Step, CallError> {
        let (received, segment) = match got {
            InPlace::Handled(done) => {
                mark(Point::Arrived);
                self.flush_with(inner, segs, tail.as_deref(), len)?;
                return Ok(if done { Step::Done } else { Step::Progress });
            }
            InPlace::Whole(received, segment) => (received, segment),
        };
        match received {
            Received::Datagram(n) => {
                mark(Point::Arrived);
                // A coalesced run (UDP GRO) is handled datagram by datagram, up to the one that ends
                // the call.
                let done = udp::segments(n, segment).any(|piece| self.on_datagram(inner, piece, seen));
                if done {
                    mark(Point::Validated);
                }
                self.flush_with(inner, segs, tail.as_deref(), len)?;
                return Ok(if done { Step::Done } else { Step::Progress });
            }
            Received::Truncated(_) => {
                inner.stats.malformed.fetch_add(1, Ordering::Relaxed);
                return Ok(Step::Progress);
            }
            // A refusal during a call is a lost packet to the protocol: a server restarting on
            // the same port may still answer, and `dead_after` bounds the wait.
            Received::Nothing | Received::Refused => {}
        }
        let now = Instant::now();
        if self.call.poll_timeout().is_some_and(|t| now >= t) {
            self.call.handle_timeout(now);
            if self.call.outcome().is_some() {
                return Ok(Step::Done);
            }
            self.flush_with(inner, segs, tail.as_deref(), len)?;
            return Ok(Step::Progress);
        }
        Ok(Step::Idle(now))
    }

    /// Turns the call's outcome into the result location or an error.
    pub(super) fn finish(&mut self, inner: &BindingInner, procedure: u16) -> Result<(), CallError> {
        let server = inner.server;
        match self.call.outcome() {
            Some(Outcome::Result { status, reassembled }) => {
                if reassembled {
                    self.big_result = self.call.take_message();
                    self.retention.large(Instant::now());
                    self.set_gro(true);
                }
                if status == Status::Ok {
                    return Ok(());
                }
                let message = String::from_utf8_lossy(self.result()).into_owned();
                self.big_result = None;
                self.result_len = 0;
                Err(status_error(status, procedure, message))
            }
            Some(Outcome::Failed(f)) => Err(match f {
                Failure::Unreachable { acknowledged } => CallError::Unreachable { server, acknowledged },
                Failure::DeadlineExceeded => {
                    self.cancel();
                    self.abandon();
                    CallError::DeadlineExceeded { may_have_run: true }
                }
                // An earlier copy of the call, still queued, may have been taken.
                Failure::Rejected(Status::Busy) => CallError::Overloaded { may_have_run: true },
                Failure::Rejected(status) => status_error(status, procedure, String::new()),
                Failure::TooLarge => CallError::TooLarge("call exceeds the message limit".into()),
            }),
            None => Err(CallError::Internal(crate::error::Invariant::NoOutcome)),
        }
    }
}

#[cfg(feature = "async")]
impl UdpEndpoint {
    /// When the call's next timer is due.
    pub(super) fn next_timeout(&self) -> Option<Instant> {
        self.call.poll_timeout()
    }

    /// The endpoint's port at the binding's AF_XDP station, when its datagrams go through it.
    #[cfg(all(feature = "async", feature = "xdp"))]
    pub(super) fn xdp_port(&self) -> Option<&crate::xdp::Port> {
        self.xdp.as_ref()
    }

    /// The endpoint's socket.
    pub(super) fn socket(&self) -> &UdpSocket {
        &self.socket
    }

    /// The endpoint's socket no longer blocks (an async endpoint's, whose runtime reads it): its
    /// calls wait for readiness, never in a receive.
    pub(super) fn set_nonblocking(&mut self) -> std::io::Result<()> {
        self.socket.set_nonblocking(true)?;
        self.receive_wait = None;
        Ok(())
    }

    /// Records a completed call's round trip in the spin budget.
    pub(super) fn observe(&mut self, rtt: std::time::Duration) {
        self.spin.observe(rtt);
    }

    /// Whether a lone call spins for its result now (its spin budget is not spent at once).
    pub(super) fn spins(&self) -> bool {
        !self.spin.budget().is_zero()
    }

    /// Until when to spin for a call that started at `start` (pushed on by its packets).
    pub(super) fn spin_deadline(&self, start: Instant) -> SpinDeadline {
        SpinDeadline::new(start, &self.spin)
    }
}

/// What one look at the socket and the timers found.
pub(super) enum Step {
    /// The call is over (a result, or a failure).
    Done,
    /// Something was handled: look again at once.
    Progress,
    /// Nothing to do at this instant.
    Idle(Instant),
}

/// A send's outcome to the call: a full socket buffer, a local firewall's drop or an ICMP error from an
/// earlier packet is a lost packet, which the protocol's timers recover; anything else fails the call.
fn sent_or_lost(sent: std::io::Result<usize>) -> Result<(), CallError> {
    match sent {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == ErrorKind::ConnectionRefused || transmit::is_loss(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn violation(status: &'static str) -> CallError {
    CallError::Protocol(crate::error::Violation::CallStatus(status))
}

pub(super) fn status_error(status: Status, procedure: u16, message: String) -> CallError {
    match status {
        Status::UnknownProcedure => CallError::UnknownProcedure(procedure),
        Status::BadArguments => CallError::BadArguments(message),
        Status::Refused => CallError::Refused(message),
        Status::Panicked => CallError::Panicked(message),
        Status::UnknownBinding | Status::BadSlot => CallError::UnknownBinding,
        Status::WrongIncarnation => CallError::ServerRestarted,
        Status::TooLarge if message.is_empty() => super::refused::too_large(),
        Status::TooLarge => CallError::TooLarge(message),
        Status::ResultTooLarge => CallError::ResultTooLarge(message),
        Status::DeadlineExceeded => CallError::DeadlineExceeded { may_have_run: false },
        // Statuses that answer a bind request, a refusal as busy or a challenge of the address
        // (`Reject`s the call machine handles), or success, are no failure of a call's result: a
        // server that sends them as one breaks the protocol.
        Status::Busy => violation("Busy"),
        Status::AddressUnproven => violation("AddressUnproven"),
        Status::UnknownInterface => violation("UnknownInterface"),
        Status::VersionMismatch => violation("VersionMismatch"),
        Status::InterfaceMismatch => violation("InterfaceMismatch"),
        Status::AuthRequired => violation("AuthRequired"),
        Status::AuthFailed => violation("AuthFailed"),
        Status::UnsupportedVersion => violation("UnsupportedVersion"),
        Status::KeyRequired => violation("KeyRequired"),
        // Only the result of a call its client gave up, which no caller waits for.
        Status::Cancelled => violation("Cancelled"),
        Status::Ok => violation("Ok"),
    }
}

impl Drop for UdpEndpoint {
    fn drop(&mut self) {
        if let Some(inner) = self.binding.upgrade() {
            if self.counted {
                inner.udp_threads.fetch_sub(1, Ordering::Relaxed);
            }
            inner.give_slot(self.slot, self.seq, false);
        }
    }
}

/// The header template of `slot`'s calls.
fn template(inner: &BindingInner, slot: u32) -> [u8; HEADER_LEN] {
    let header = Header {
        binding: inner.id,
        slot,
        incarnation: inner.incarnation,
        token: inner.token,
        ..Header::new(Kind::Call)
    };
    header.to_bytes()
}

/// The protocol machine of a slot's calls, before its first.
fn fresh_call(inner: &BindingInner) -> ClientCall {
    let frag_payload = inner.max_datagram - HEADER_LEN;
    ClientCall::new(inner.config.timing, frag_payload, features::max_window(inner.features), Instant::now())
}

/// The message `segs` (marshaled into a scratch buffer of `scratch_len` bytes) followed by the lent
/// buffer `tail`. The stubs lend a buffer only to calls whose segments take one
/// ([`Segments::takes_tail`]), so an error here is a bug of the caller, reported rather than sent as
/// a message without the buffer's bytes.
pub(super) fn with_lent<'a: 't, 't>(
    segs: &Segments<'a>,
    scratch_len: usize,
    tail: &'t [u8],
) -> Result<Segments<'t>, CallError> {
    segs.with_tail(scratch_len, tail).ok_or(CallError::Internal(crate::error::Invariant::LentBufferMisplaced))
}

#[cfg(test)]
mod tests;
