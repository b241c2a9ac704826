//! The client side of the UDP transport: a calling thread's endpoint on a binding, with its client
//! slot, socket, buffers and prebuilt header.
//!
//! The fast path of a call is all here: [`UdpEndpoint::run`] writes the changing header fields into the
//! template, sends header, scratch and borrowed argument slices with one `sendmsg`, then waits on the
//! endpoint's own socket (spinning, then blocking), so the result arrives at this thread with no
//! dispatcher and no handoff. Nothing on this path allocates once the endpoint exists.

use std::io::{ErrorKind, IoSlice, IoSliceMut};
use std::net::UdpSocket;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Instant;

use tiercel_proto::bind::wire::features;
use tiercel_proto::client::{ClientCall, Failure, Handled, Outcome, Transmit};
use tiercel_proto::context::{self, Context};
use tiercel_proto::fragment::{fragment_count, fragment_range};
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
    /// Whether the socket takes runs of result fragments whole (UDP GRO): on the same paths.
    coalescing: bool,
    /// The result fragments of the call being made that were received straight into the caller's
    /// buffer ([`UdpEndpoint::run_in_out`]), one bit each.
    in_tail: Vec<u64>,
}

impl UdpEndpoint {
    pub(super) fn new(inner: &Arc<BindingInner>) -> Result<UdpEndpoint, CallError> {
        let (slot, seq) = inner.take_slot()?;
        let socket = match udp::connect(inner.server) {
            Ok(s) => s,
            Err(e) => {
                inner.give_slot(slot, seq);
                return Err(e.into());
            }
        };
        let header = Header {
            binding: inner.id,
            slot,
            incarnation: inner.incarnation,
            token: inner.token,
            ..Header::new(Kind::Call)
        };
        let frag_payload = inner.max_datagram - HEADER_LEN;
        let run_length = match transmit::run_length(inner.max_datagram + CHECKSUM_LEN) {
            n if n >= 2 => n,
            _ => 0,
        };
        // Small datagrams (a path MTU's): the server's result fragments may arrive as runs.
        let coalescing = run_length >= 2 && udp::enable_gro(&socket);
        let rx_len = inner.max_datagram + CHECKSUM_LEN;
        Ok(UdpEndpoint {
            uid: inner.uid,
            binding: Arc::downgrade(inner),
            socket,
            slot,
            seq,
            frag_payload,
            template: header.to_bytes(),
            scratch: Vec::with_capacity(frag_payload),
            rx: vec![0; if coalescing { rx_len.max(udp::GRO_BUFFER) } else { rx_len }],
            result_len: 0,
            big_result: None,
            call: ClientCall::new(
                inner.config.timing,
                frag_payload,
                features::max_window(inner.features),
                Instant::now(),
            ),
            counted_retransmissions: 0,
            retransmissions_at_start: 0,
            spin: SpinBudget::new(inner.config.spin),
            flag_base: if inner.config.checksum { flags::CHECKSUM } else { 0 },
            context_flag: 0,
            context_deadline: None,
            retention: Retention::default(),
            run_length,
            coalescing,
            in_tail: Vec::new(),
        })
    }

    /// Prepares the endpoint for a call whose message starts with `context` (when not empty).
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
            // No large message for a while: give back the buffers large ones grew.
            self.call.drop_spare();
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
        self.wait(&binding.inner, segs, None, len, start)?;
        self.spin.observe(start.elapsed());
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
        self.wait(&binding.inner, segs, Some(&mut *tail), len, start)?;
        self.spin.observe(start.elapsed());
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
                chunk.copy_from_slice(&result[at..at + chunk.len()]);
            } else {
                lent += 1;
            }
        }
        inner.stats.in_place.fetch_add(1, Ordering::Relaxed);
        inner.stats.lent_fragments.fetch_add(lent, Ordering::Relaxed);
        true
    }

    /// [`UdpEndpoint::flush`] of the message `segs` followed by `tail`, if any.
    fn flush_with(
        &mut self,
        inner: &BindingInner,
        segs: &Segments<'_>,
        tail: Option<&[u8]>,
        len: usize,
    ) -> Result<(), CallError> {
        match tail {
            Some(tail) => self.flush(inner, &with_lent(segs, self.scratch.len(), tail)?, len),
            None => self.flush(inner, segs, len),
        }
    }

    /// Starts the call: numbers it, and sends its first packets. Returns the message's length and
    /// when the call started.
    pub(super) fn send_call(
        &mut self,
        binding: &Binding,
        procedure: u16,
        segs: &Segments<'_>,
    ) -> Result<(usize, Instant), CallError> {
        let inner = &*binding.inner;
        let len = segs.message_len(&self.scratch);
        self.seq = self.seq.wrapping_add(1);
        let start = Instant::now();
        let deadline = binding.deadline.map(|d| start + d);
        self.retransmissions_at_start = self.call.retransmissions();
        self.call.start(self.seq, len, start, deadline);
        if self.context_flag != 0 {
            self.context_deadline = deadline;
        }
        if let Some(Outcome::Failed(Failure::TooLarge)) = self.call.outcome() {
            return Err(CallError::TooLarge(format!(
                "call of {len} bytes exceeds the limit of {} bytes",
                inner.config.timing.max_message
            )));
        }
        let mut p = Packet::new_unchecked(&mut self.template[..]);
        p.set_seq(self.seq);
        p.set_procedure(procedure);
        if len > self.frag_payload {
            self.retention.large(start);
        }
        mark(Point::HeaderReady);
        self.flush(inner, segs, len)?;
        mark(Point::Sent);
        Ok((len, start))
    }

    /// Sends every packet the protocol asks for.
    fn flush(&mut self, inner: &BindingInner, segs: &Segments<'_>, len: usize) -> Result<(), CallError> {
        // Every packet the machine queued as a retransmission: each fragment of a window sent again,
        // each probe, each request for missing result fragments.
        let retransmissions = self.call.retransmissions();
        if retransmissions != self.counted_retransmissions {
            let new = retransmissions - self.counted_retransmissions;
            inner.stats.retransmissions.fetch_add(new, Ordering::Relaxed);
            self.counted_retransmissions = retransmissions;
        }
        if let Some(deadline) = self.context_deadline {
            let left = context::micros(deadline.saturating_duration_since(Instant::now()));
            let at = context::DEADLINE_AT;
            if let Some(field) = self.scratch.get_mut(at..at + 4) {
                field.copy_from_slice(&left.to_le_bytes());
            }
        }
        // Fragments of a multi-packet call wait here to go out together (one segmented send), until
        // the run is full, its last fragment is the message's short one, or another packet is due.
        let mut run = transmit::RunQueue::new();
        let run_length = if len > self.frag_payload { self.run_length } else { 0 };
        while let Some(t) = self.call.poll_transmit() {
            if let Transmit::CallFragment { index, please_ack } = t {
                if run_length >= 2 {
                    let queued = run.push((index, please_ack));
                    let short = fragment_range(index, len, self.frag_payload).len() < self.frag_payload;
                    if queued == run_length || short {
                        self.send_fragments(run.take(), segs, len)?;
                    }
                    continue;
                }
            }
            if !run.is_empty() {
                self.send_fragments(run.take(), segs, len)?;
            }
            let sent = match t {
                Transmit::CallFragment { index: _, please_ack } if len <= self.frag_payload => {
                    let flag = self.call_flags(please_ack);
                    let mut p = Packet::new_unchecked(&mut self.template[..]);
                    p.set_fragment(0, 1);
                    p.set_lengths(len as u32, len as u32);
                    p.set_flags(flag);
                    let mut io = [IoSlice::new(&[]); MAX_SEGMENTS + 2];
                    io[0] = IoSlice::new(&self.template);
                    let n = segs.io_slices(&self.scratch, &mut io[1..]);
                    transmit::send(&self.socket, None, &io[..n + 1], self.flag_base != 0)
                }
                Transmit::CallFragment { index, please_ack } => {
                    let hdr = self.fragment_header(index, please_ack, len);
                    // The fragment goes out straight from the caller's buffers, like a
                    // single-packet call: no copy of the whole message first.
                    let mut io = [IoSlice::new(&[]); MAX_SEGMENTS + 2];
                    io[0] = IoSlice::new(&hdr);
                    let range = fragment_range(index, len, self.frag_payload);
                    let n = segs.range_slices(&self.scratch, range, &mut io[1..]);
                    transmit::send(&self.socket, None, &io[..n + 1], self.flag_base != 0)
                }
                Transmit::Probe => self.send_control(Kind::Probe, 0, &[]),
                Transmit::Ack { ack, resend } => {
                    let flag = if resend { flags::RESEND } else { 0 };
                    self.send_control(Kind::Ack, flag, &ack.to_bytes())
                }
                Transmit::AddressProof { challenge } => {
                    self.send_control(Kind::Probe, flags::ADDRESS_PROOF, &challenge)
                }
            };
            sent_or_lost(sent)?;
        }
        if !run.is_empty() {
            self.send_fragments(run.take(), segs, len)?;
        }
        Ok(())
    }

    /// The flags of a call packet.
    fn call_flags(&self, please_ack: bool) -> u8 {
        self.flag_base | self.context_flag | if please_ack { flags::PLEASE_ACK } else { 0 }
    }

    /// The header of fragment `index` of a call of `len` bytes.
    fn fragment_header(&self, index: u16, please_ack: bool, len: usize) -> [u8; HEADER_LEN] {
        let count = fragment_count(len, self.frag_payload).unwrap_or(u16::MAX);
        let range = fragment_range(index, len, self.frag_payload);
        let mut hdr = self.template;
        let mut p = Packet::new_unchecked(&mut hdr[..]);
        p.set_fragment(index, count);
        p.set_lengths(range.len() as u32, len as u32);
        p.set_flags(self.call_flags(please_ack));
        hdr
    }

    /// Sends a run of call fragments (every one full but perhaps the last) with one segmented send,
    /// each gathered straight from the caller's buffers. A kernel or route that refuses segmentation
    /// gets them one by one, now and for the rest of the endpoint's life.
    fn send_fragments(&mut self, run: &[(u16, bool)], segs: &Segments<'_>, len: usize) -> Result<(), CallError> {
        let mut headers = [[0u8; HEADER_LEN]; transmit::MAX_RUN];
        for (h, &(index, please_ack)) in headers.iter_mut().zip(run) {
            *h = self.fragment_header(index, please_ack, len);
        }
        let mut parts = [IoSlice::new(&[]); transmit::MAX_RUN * (MAX_SEGMENTS + 1)];
        let mut ends = [0usize; transmit::MAX_RUN];
        let mut k = 0;
        for (i, (h, &(index, _))) in headers.iter().zip(run).enumerate() {
            parts[k] = IoSlice::new(h);
            let range = fragment_range(index, len, self.frag_payload);
            k += 1 + segs.range_slices(&self.scratch, range, &mut parts[k + 1..k + 1 + MAX_SEGMENTS]);
            ends[i] = k;
        }
        let checksum = self.flag_base != 0;
        let segment = HEADER_LEN + self.frag_payload + if checksum { CHECKSUM_LEN } else { 0 };
        match transmit::send_run(&self.socket, None, &parts[..k], &ends[..run.len()], checksum, segment) {
            Err(e) if udp::is_segmentation_refused(&e) => {
                self.run_length = 0;
                let mut start = 0;
                for &end in &ends[..run.len()] {
                    sent_or_lost(transmit::send(&self.socket, None, &parts[start..end], checksum))?;
                    start = end;
                }
                Ok(())
            }
            sent => sent_or_lost(sent),
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
        transmit::send(&self.socket, None, &[IoSlice::new(&hdr), IoSlice::new(payload)], self.flag_base != 0)
    }

    /// Spins, then blocks, until the call completes or fails. While packets of the call keep coming
    /// (acknowledgements of its fragments, fragments of its result), it spins for the next one from
    /// the last, as long as a wake-up would cost.
    fn wait(
        &mut self,
        inner: &BindingInner,
        segs: &Segments<'_>,
        mut tail: Option<&mut [u8]>,
        len: usize,
        start: Instant,
    ) -> Result<(), CallError> {
        let mut deadline = SpinDeadline::new(start, &self.spin);
        let mut spinner = SPINNERS.start();
        if !spinner.before_first_look() && len <= self.frag_payload {
            // A lone one-packet call: nothing to look for before its result. The wait reads the clock
            // and nothing else. With a `pause` in each turn, as the other spins have, a lone
            // caller's mean Null call took 0.04 to 0.15 µs longer than with no wait in three of
            // four A/B runs on our VM (perhaps the hypervisor's pause-loop exiting, which takes a
            // long run of `pause` for a lock's spin); without it, within 0.02 µs in three and 0.18
            // µs shorter in the fourth.
            let first = self.spin.first_look(start);
            while Instant::now() < first {}
        }
        loop {
            let now = match self.step(inner, segs, tail.as_deref_mut(), len)? {
                Step::Done => return Ok(()),
                Step::Progress => {
                    if deadline.progress(Instant::now()) {
                        spinner.resume();
                    }
                    continue;
                }
                Step::Idle(now) => now,
            };
            if deadline.spinning(now) {
                spinner.pause();
                continue;
            }
            spinner.stop();
            let timeout = self.call.poll_timeout().map(|t| t.saturating_duration_since(now));
            crate::steps::slept(crate::steps::Side::Client);
            udp::wait_readable(&self.socket, timeout)?;
        }
    }

    /// One look at the socket and at the call's timers, without blocking: handles a datagram if one
    /// is there, else a timer that is due, and sends what the protocol asks for.
    #[inline]
    pub(super) fn step(
        &mut self,
        inner: &BindingInner,
        segs: &Segments<'_>,
        mut tail: Option<&mut [u8]>,
        len: usize,
    ) -> Result<Step, CallError> {
        let (received, segment) = match self.receive_in_place(inner, tail.as_deref_mut())? {
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
                let done = udp::segments(n, segment).any(|piece| self.on_datagram(inner, piece));
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

    /// Receives a datagram (or a coalesced run) without blocking. While a multi-packet result is
    /// arriving, the payloads go straight into the places of the fragments expected next in its
    /// reassembly (as many as the receive buffer holds datagrams of the binding's size: one, or a
    /// run's worth), and each header and trailer, and anything after the last payload, where it
    /// would lie in the receive buffer. Each datagram that was the fragment expected there is
    /// handled in place: one copy of its bytes, the kernel's. The rest are put back together in
    /// the receive buffer and handled whole. With `lent` (the caller's buffer, whose bytes begin the
    /// result: [`UdpEndpoint::run_in_out`]), the fragments that hold nothing else go there instead.
    fn receive_in_place(&mut self, inner: &BindingInner, lent: Option<&mut [u8]>) -> std::io::Result<InPlace> {
        let trailer = if self.flag_base != 0 { CHECKSUM_LEN } else { 0 };
        let full = HEADER_LEN + self.frag_payload + trailer;
        let max = (self.rx.len() / full).clamp(1, MAX_LANDED);
        // A result at least as long as the lent buffer begins with its bytes (anything shorter is
        // no result of the call, and is read the usual way).
        let lent = match (lent, self.call.result_len()) {
            (Some(lent), Some(n)) if n >= lent.len() => lent,
            _ => &mut [][..],
        };
        let Some((first, span)) = self.call.landing(max as u16) else {
            if self.coalescing {
                let s = udp::recv_segments_nowait(&self.socket, &mut self.rx)?;
                return Ok(InPlace::Whole(s.received, s.segment));
            }
            return Ok(InPlace::Whole(udp::recv_nowait(&self.socket, &mut self.rx)?, None));
        };
        // The receive buffer, cut where the datagrams of a run of fragments would lie: headers and
        // trailers (and what follows the last payload) are received there, payloads into their
        // places; `holes` are where the payloads would lie, for those put back.
        let stride = if trailer > 0 { 3 } else { 2 };
        let mut parts: [IoSliceMut<'_>; 3 * MAX_LANDED + 1] = std::array::from_fn(|_| IoSliceMut::new(&mut []));
        let mut holes: [&mut [u8]; MAX_LANDED] = std::array::from_fn(|_| &mut [][..]);
        let mut rest = &mut self.rx[..];
        let mut fragments = 0;
        // The lent buffer from the run's first fragment on: the run's fragments that end within it
        // (its first ones) are received there, the rest into the reassembly.
        let from = usize::from(first) * self.frag_payload;
        let mut lent_rest = lent.get_mut(from..).unwrap_or_default();
        let mut in_lent = 0;
        let mut places = span.chunks_mut(self.frag_payload).peekable();
        while let Some(place) = places.next() {
            let place = if place.len() <= lent_rest.len() {
                let (there, after) = std::mem::take(&mut lent_rest).split_at_mut(place.len());
                lent_rest = after;
                in_lent += 1;
                there
            } else {
                lent_rest = &mut [];
                place
            };
            let (header, after) = std::mem::take(&mut rest).split_at_mut(HEADER_LEN);
            let (hole, after) = after.split_at_mut(place.len());
            parts[fragments * stride] = IoSliceMut::new(header);
            parts[fragments * stride + 1] = IoSliceMut::new(place);
            holes[fragments] = hole;
            rest = after;
            if places.peek().is_some() && trailer > 0 {
                let (t, after) = std::mem::take(&mut rest).split_at_mut(trailer);
                parts[fragments * stride + 2] = IoSliceMut::new(t);
                rest = after;
            }
            fragments += 1;
        }
        let n = (fragments - 1) * stride + 2;
        parts[n] = IoSliceMut::new(rest);
        let got = mmsg::recv_scattered_from_nowait(&self.socket, &mut parts[..=n])?;
        let Received::Datagram(len) = got.received else { return Ok(InPlace::Whole(got.received, None)) };
        // The fragments that landed: each datagram of the run just where a fragment's header,
        // payload and trailer went, and the next fragment of this call's result.
        let step = got.segment.unwrap_or(len);
        let mut landed = 0;
        while landed < fragments {
            let (at, k) = (landed * full, landed * stride);
            if at >= len
                || (landed > 0 && step != full)
                || (at + step).min(len) - at != HEADER_LEN + parts[k + 1].len() + trailer
            {
                break;
            }
            let t = if landed + 1 < fragments { &parts[k + 2][..] } else { &parts[n][..trailer] };
            let p = Packet::new_unchecked(&parts[k][..]);
            let expected = p.kind() == Kind::Result
                && usize::from(p.frag_index()) == usize::from(first) + landed
                && p.check_split(&parts[k + 1], &t[..trailer]).is_ok()
                && ours(inner, self.slot, &p);
            if !expected {
                break;
            }
            landed += 1;
        }
        // The payloads received that did not land, back where they lie in the datagram.
        for (j, hole) in holes.iter_mut().enumerate().take(fragments).skip(landed) {
            let k = hole.len().min(len.saturating_sub(j * full + HEADER_LEN));
            hole[..k].copy_from_slice(&parts[j * stride + 1][..k]);
        }
        inner.stats.landed.fetch_add(landed as u64, Ordering::Relaxed);
        let now = Instant::now();
        for j in 0..landed {
            let p = Packet::new_unchecked(&self.rx[j * full..j * full + HEADER_LEN]);
            let handled = self.call.handle_landed(&p, now);
            if handled != Handled::Ignored && j < in_lent {
                // Taken as this call's: its bytes are in the lent buffer, not the reassembly.
                let i = usize::from(first) + j;
                if self.in_tail.len() <= i / 64 {
                    self.in_tail.resize(i / 64 + 1, 0);
                }
                self.in_tail[i / 64] |= 1 << (i % 64);
            }
            match handled {
                Handled::Complete => return Ok(InPlace::Handled(true)),
                Handled::Progress => {}
                Handled::Ignored => {
                    inner.stats.stale.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let at = landed * full;
        let done = at < len
            && udp::segments(len - at, got.segment)
                .any(|piece| self.on_datagram(inner, at + piece.start..at + piece.end));
        Ok(InPlace::Handled(done))
    }

    /// Handles the received datagram at `at` in the receive buffer; true when the call is over.
    fn on_datagram(&mut self, inner: &BindingInner, at: std::ops::Range<usize>) -> bool {
        let start = at.start;
        let Ok(p) = Packet::new_checked(&self.rx[at]) else {
            inner.stats.malformed.fetch_add(1, Ordering::Relaxed);
            return false;
        };
        if !ours(inner, self.slot, &p) {
            inner.stats.stale.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        match self.call.handle_packet(&p, Instant::now()) {
            Handled::Complete => {
                self.result_len = HEADER_LEN + p.payload_len() as usize;
                if start > 0 {
                    // A single-packet result read from within a coalesced run: where the next
                    // call's stub looks for it.
                    self.rx.copy_within(start..start + self.result_len, 0);
                }
                true
            }
            Handled::Progress => false,
            Handled::Ignored => {
                inner.stats.stale.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Turns the call's outcome into the result location or an error.
    pub(super) fn finish(&mut self, inner: &BindingInner, procedure: u16) -> Result<(), CallError> {
        let server = inner.server;
        match self.call.outcome() {
            Some(Outcome::Result { status, reassembled }) => {
                if reassembled {
                    self.big_result = self.call.take_message();
                    self.retention.large(Instant::now());
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
                    CallError::DeadlineExceeded { may_have_run: true }
                }
                Failure::Rejected(Status::Busy) => CallError::Overloaded,
                Failure::Rejected(status) => status_error(status, procedure, String::new()),
                Failure::TooLarge => CallError::TooLarge("call exceeds the message limit".into()),
            }),
            None => Err(CallError::Internal(crate::error::Invariant::NoOutcome)),
        }
    }
}

/// What [`UdpEndpoint::receive_in_place`] did.
enum InPlace {
    /// A datagram (or run) was received and handled, its result fragments expected in place: true
    /// when the call is over.
    Handled(bool),
    /// A datagram, run (each datagram this long but the last) or nothing, to handle whole from the
    /// receive buffer.
    Whole(Received, Option<usize>),
}

/// Whether a checked packet is addressed to this binding's client slot `slot`.
fn ours(inner: &BindingInner, slot: u32, p: &Packet<&[u8]>) -> bool {
    p.binding() == inner.id
        && p.slot() == slot
        && p.token() == inner.token
        && (p.kind() == Kind::Reject || p.incarnation() == inner.incarnation)
}

#[cfg(feature = "async")]
impl UdpEndpoint {
    /// When the call's next timer is due.
    pub(super) fn next_timeout(&self) -> Option<Instant> {
        self.call.poll_timeout()
    }

    /// The endpoint's socket.
    pub(super) fn socket(&self) -> &UdpSocket {
        &self.socket
    }

    /// Records a completed call's round trip in the spin budget.
    pub(super) fn observe(&mut self, rtt: std::time::Duration) {
        self.spin.observe(rtt);
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
        Status::Panicked => CallError::Panicked(message),
        Status::UnknownBinding | Status::BadSlot => CallError::UnknownBinding,
        Status::WrongIncarnation => CallError::ServerRestarted,
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
        // Only the result of a call its client gave up, which no caller waits for.
        Status::Cancelled => violation("Cancelled"),
        Status::Ok => violation("Ok"),
    }
}

impl Drop for UdpEndpoint {
    fn drop(&mut self) {
        if let Some(inner) = self.binding.upgrade() {
            inner.give_slot(self.slot, self.seq);
        }
    }
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
mod tests {
    use super::*;
    use crate::Execution;

    #[test]
    fn every_status_maps_to_the_error_of_where_the_call_stopped() {
        let ran = |s: Status| status_error(s, 3, "why".into()).execution();
        assert!(matches!(status_error(Status::UnknownProcedure, 3, String::new()), CallError::UnknownProcedure(3)));
        assert_eq!(ran(Status::UnknownProcedure), Execution::NeverRan);
        assert!(
            matches!(status_error(Status::BadArguments, 3, "why".into()), CallError::BadArguments(m) if m == "why")
        );
        assert_eq!(ran(Status::BadArguments), Execution::NeverRan);
        assert_eq!(ran(Status::TooLarge), Execution::NeverRan, "refused before it ran");
        assert_eq!(ran(Status::ResultTooLarge), Execution::Ran, "refused after it ran");
        assert_eq!(ran(Status::Panicked), Execution::Ran);
        assert!(matches!(
            status_error(Status::DeadlineExceeded, 3, String::new()),
            CallError::DeadlineExceeded { may_have_run: false }
        ));
        assert!(matches!(status_error(Status::UnknownBinding, 3, String::new()), CallError::UnknownBinding));
        assert!(matches!(status_error(Status::BadSlot, 3, String::new()), CallError::UnknownBinding));
        assert!(matches!(status_error(Status::WrongIncarnation, 3, String::new()), CallError::ServerRestarted));
        assert_eq!(ran(Status::WrongIncarnation), Execution::MayHaveRun);
        // What no server sends as a call's result is a protocol violation, not a guess.
        for s in [
            Status::Ok,
            Status::Busy,
            Status::AddressUnproven,
            Status::UnknownInterface,
            Status::VersionMismatch,
            Status::InterfaceMismatch,
            Status::AuthRequired,
            Status::AuthFailed,
            Status::Cancelled,
            Status::UnsupportedVersion,
        ] {
            let e = status_error(s, 3, String::new());
            assert!(matches!(e, CallError::Protocol(_)), "{s:?}: {e:?}");
            assert_eq!(e.execution(), Execution::MayHaveRun);
        }
    }
}
