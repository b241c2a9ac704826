//! The client side of one call: sending its fragments, waiting, probing, and receiving its result.
//!
//! A [`ClientCall`] is reused for every call a client slot makes, so the common case allocates nothing.
//! Drive it in this order: [`ClientCall::start`], then send everything [`ClientCall::poll_transmit`]
//! yields; feed each packet of this slot to [`ClientCall::handle_packet`] and call
//! [`ClientCall::handle_timeout`] when [`ClientCall::poll_timeout`] passes, sending again what
//! `poll_transmit` yields after each; stop when [`ClientCall::outcome`] is `Some`.

use std::time::Instant;

use crate::fragment::{fragment_count, AckInfo, Blast, Inserted, Reassembly};
use crate::timing::{Refusals, Timing};
use crate::wire::{flags, Kind, Packet, Status};

/// A packet the client must send for the current call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transmit {
    /// Fragment `index` of the call message; `please_ack` marks a retransmission.
    CallFragment {
        /// Fragment index.
        index: u16,
        /// Ask the server to acknowledge.
        please_ack: bool,
    },
    /// A probe: is the call still running?
    Probe,
    /// An acknowledgement of result fragments; `resend` asks for the missing ones.
    Ack {
        /// What has arrived.
        ack: AckInfo,
        /// Ask for the fragments the ack does not cover.
        resend: bool,
    },
    /// A probe with [`flags::ADDRESS_PROOF`] echoing the server's challenge: proves that this slot's
    /// address receives (sent when the server answered `AddressUnproven`).
    AddressProof {
        /// The challenge, as received.
        challenge: [u8; crate::bind::wire::CHALLENGE_LEN],
    },
}

/// Why a call failed in the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Nothing was heard from the server for `Timing::dead_after`. `acknowledged` says whether the
    /// server had confirmed receiving the call (then it certainly started it).
    Unreachable {
        /// The server acknowledged the whole call before going silent.
        acknowledged: bool,
    },
    /// The caller's deadline passed.
    DeadlineExceeded,
    /// The server refused the call with this status in a `Reject` packet.
    Rejected(Status),
    /// The call message is larger than the protocol allows.
    TooLarge,
}

/// How a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A result arrived with this status. When the result was one packet its payload is in that
    /// packet; otherwise take it with [`ClientCall::take_message`].
    Result {
        /// Result status.
        status: Status,
        /// Whether the result came in several fragments.
        reassembled: bool,
    },
    /// The call failed.
    Failed(Failure),
}

/// What [`ClientCall::handle_packet`] made of a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// Not for the current call (stale sequence number, duplicate) or malformed; dropped.
    Ignored,
    /// Accepted; the call goes on.
    Progress,
    /// The call is over: see [`ClientCall::outcome`].
    Complete,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle,
    Sending,
    Waiting,
    Receiving,
    Done,
}

/// The protocol state of the call a client slot has in progress.
#[derive(Debug)]
pub struct ClientCall {
    timing: Timing,
    frag_payload: usize,
    /// Fragments of a message in flight beyond the acknowledged prefix, both ways.
    window: u16,
    seq: u32,
    phase: Phase,
    blast: Blast,
    reassembly: Option<Reassembly>,
    /// The buffer of an earlier reassembled result, lent back for the next one.
    spare: Vec<u8>,
    transmits: Vec<Transmit>,
    next_transmit: usize,
    rto: core::time::Duration,
    timer: Option<Instant>,
    deadline: Option<Instant>,
    last_heard: Instant,
    acknowledged: bool,
    outcome: Option<Outcome>,
    retransmissions: u64,
    started: Instant,
    /// How long the call took from its start to its result, once it has one.
    took: Option<core::time::Duration>,
    retransmitted: bool,
    /// The smoothed round trip and its variation, in nanoseconds (`srtt_ns` 0: none measured
    /// yet), and the retransmission timeout they give ([`ClientCall::base_rto`]), worked out once
    /// a sample rather than again at each call's start.
    srtt_ns: u64,
    rttvar_ns: u64,
    base_rto: core::time::Duration,
    /// The call's refusals as busy ([`Refusals`]).
    refusals: Refusals,
    /// When this slot last proved its address (at most once a retransmission interval).
    proved_at: Option<Instant>,
    /// Whether the server has answered this slot. Until then its first packet draws a challenge
    /// (`AddressUnproven`), and the server drops what comes before the slot answers it: a call of
    /// several fragments sends its first alone, asking for an acknowledgement, and the rest of
    /// its window once the server has answered.
    heard: bool,
    /// When the newest call fragments went out for the first time, and the fragment after them:
    /// an acknowledgement of the newest measures a round trip of the path, not of the whole call
    /// (which, for a large one, is mostly its transfer).
    window_sent_at: Option<Instant>,
    window_end: u16,
    /// Whether fragments went out again since (Karn: then a sample is ambiguous).
    window_resent: bool,
}

/// Where a result packet's payload is.
enum Payload<'a> {
    /// In the packet.
    Here(&'a [u8]),
    /// This many bytes, received into the place the reassembly gave ([`ClientCall::landing`]).
    Landed(usize),
}

impl ClientCall {
    /// A call machine for a binding whose packets carry at most `frag_payload` payload bytes and
    /// whose windows may reach `max_window` fragments ([`crate::bind::wire::features::max_window`]
    /// of what was granted).
    pub fn new(timing: Timing, frag_payload: usize, max_window: u16, now: Instant) -> ClientCall {
        ClientCall {
            timing,
            frag_payload: frag_payload.max(1),
            window: timing.window_for(frag_payload.max(1), max_window),
            seq: 0,
            phase: Phase::Idle,
            blast: Blast::new(1, 1),
            reassembly: None,
            spare: Vec::new(),
            transmits: Vec::with_capacity(2 * crate::fragment::MAX_WINDOW as usize),
            next_transmit: 0,
            rto: timing.retransmit_initial,
            timer: None,
            deadline: None,
            last_heard: now,
            acknowledged: false,
            outcome: None,
            retransmissions: 0,
            started: now,
            took: None,
            retransmitted: false,
            srtt_ns: 0,
            rttvar_ns: 0,
            base_rto: timing.retransmit_initial,
            refusals: Refusals::default(),
            proved_at: None,
            heard: false,
            window_sent_at: None,
            window_end: 0,
            window_resent: false,
        }
    }

    /// The retransmission timeout a fresh attempt starts from: measured (srtt + 4 rttvar, Jacobson)
    /// once round trips are known, `retransmit_initial` before.
    pub fn base_rto(&self) -> core::time::Duration {
        self.base_rto
    }

    /// Feeds a round-trip sample (only from calls that were never retransmitted: Karn's rule).
    fn sample_rtt(&mut self, rtt: core::time::Duration) {
        // (At least a nanosecond: 0 means no sample yet. A round trip of 584 years saturates.)
        let rtt = rtt.as_secs().saturating_mul(1_000_000_000).saturating_add(u64::from(rtt.subsec_nanos())).max(1);
        if self.srtt_ns == 0 {
            self.srtt_ns = rtt;
            self.rttvar_ns = rtt / 2;
        } else {
            let err = self.srtt_ns.abs_diff(rtt);
            self.rttvar_ns = self.rttvar_ns.saturating_mul(3).saturating_add(err) / 4;
            self.srtt_ns = self.srtt_ns.saturating_mul(7).saturating_add(rtt) / 8;
        }
        let rto = core::time::Duration::from_nanos(self.srtt_ns.saturating_add(self.rttvar_ns.saturating_mul(4)));
        self.base_rto = rto.clamp(self.timing.retransmit_min, self.timing.retransmit_max);
    }

    /// Begins call `seq` whose message is `message_len` bytes. The first window of fragments is queued.
    pub fn start(&mut self, seq: u32, message_len: usize, now: Instant, deadline: Option<Instant>) {
        self.seq = seq;
        self.transmits.clear();
        self.next_transmit = 0;
        self.reassembly = None;
        self.acknowledged = false;
        self.deadline = deadline;
        self.last_heard = now;
        self.started = now;
        self.took = None;
        self.retransmitted = false;
        self.refusals = Refusals::default();
        self.rto = self.base_rto();
        self.timer = Some(now + self.rto);
        let count = match fragment_count(message_len, self.frag_payload) {
            Some(c) if message_len <= self.timing.max_message => c,
            _ => {
                self.finish(Outcome::Failed(Failure::TooLarge));
                return;
            }
        };
        self.outcome = None;
        self.phase = Phase::Sending;
        self.blast = Blast::new(count, if self.heard { self.window } else { 1 });
        self.window_sent_at = None;
        self.queue_new(now);
        if !self.heard && count > 1 {
            if let Some(Transmit::CallFragment { please_ack, .. }) = self.transmits.last_mut() {
                *please_ack = true;
            }
        }
    }

    fn queue_new(&mut self, now: Instant) {
        let new = self.blast.take_new();
        if !new.is_empty() {
            self.window_sent_at = Some(now);
            self.window_end = new.end;
            self.window_resent = false;
        }
        for index in new {
            self.transmits.push(Transmit::CallFragment { index, please_ack: false });
        }
    }

    fn finish(&mut self, outcome: Outcome) {
        self.phase = Phase::Done;
        self.timer = None;
        self.outcome = Some(outcome);
    }

    /// Sequence number of the current call.
    pub fn seq(&self) -> u32 {
        self.seq
    }

    /// How the call ended, once it has.
    pub fn outcome(&self) -> Option<Outcome> {
        self.outcome
    }

    /// Whether the server has confirmed holding the whole call message.
    pub fn acknowledged(&self) -> bool {
        self.acknowledged
    }

    /// Packets retransmitted (call fragments, probes, result requests) over this machine's life.
    pub fn retransmissions(&self) -> u64 {
        self.retransmissions
    }

    /// How long the call took from its start to its result, once its result came: what an
    /// endpoint would work out again from the same two readings of the clock.
    pub fn took(&self) -> Option<core::time::Duration> {
        self.took
    }

    /// Whether a packet waits to be sent ([`ClientCall::poll_transmit`]): an endpoint that finds
    /// none has nothing to flush (most calls of one packet each way, once their result came).
    #[inline]
    pub fn has_transmit(&self) -> bool {
        self.next_transmit < self.transmits.len()
    }

    /// The next packet to send, if any.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        let t = self.transmits.get(self.next_transmit).copied();
        if t.is_some() {
            self.next_transmit += 1;
        } else if self.next_transmit != 0 {
            self.transmits.clear();
            self.next_transmit = 0;
        }
        t
    }

    /// When [`ClientCall::handle_timeout`] must next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match (self.timer, self.deadline) {
            (Some(t), Some(d)) => Some(t.min(d)),
            (t, d) => t.or(d).filter(|_| self.phase != Phase::Done),
        }
    }

    fn backoff(&mut self, now: Instant) {
        self.retransmitted = true;
        self.rto = (self.rto * 2).min(self.timing.retransmit_max);
        self.timer = Some(now + self.rto);
    }

    /// Advances timers: retransmits, probes, or fails the call.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.phase == Phase::Done || self.phase == Phase::Idle {
            return;
        }
        if self.deadline.is_some_and(|d| now >= d) {
            self.finish(Outcome::Failed(Failure::DeadlineExceeded));
            return;
        }
        if now.saturating_duration_since(self.last_heard) >= self.timing.dead_after {
            self.finish(Outcome::Failed(Failure::Unreachable { acknowledged: self.acknowledged }));
            return;
        }
        if self.timer.is_none_or(|t| now < t) {
            return;
        }
        self.resend();
        self.backoff(now);
    }

    /// Queues what the current phase sends again: the unacknowledged call fragments, a probe, or
    /// an acknowledgement asking for the missing result fragments.
    fn resend(&mut self) {
        match self.phase {
            Phase::Sending => {
                self.window_resent = true;
                let first = self.transmits.len();
                for index in self.blast.unacked().take(crate::fragment::MAX_WINDOW as usize) {
                    self.transmits.push(Transmit::CallFragment { index, please_ack: false });
                }
                if let Some(Transmit::CallFragment { please_ack, .. }) = self.transmits.last_mut() {
                    *please_ack = true;
                }
                self.retransmissions += (self.transmits.len() - first) as u64;
            }
            Phase::Waiting => {
                self.transmits.push(Transmit::Probe);
                self.retransmissions += 1;
            }
            Phase::Receiving => {
                let ack = self.reassembly.as_mut().map(|r| r.take_ack()).unwrap_or_default();
                self.transmits.push(Transmit::Ack { ack, resend: true });
                self.retransmissions += 1;
            }
            Phase::Idle | Phase::Done => {}
        }
    }

    /// Handles a checked packet addressed to this client slot. The caller has already matched its
    /// binding, token and incarnation.
    pub fn handle_packet(&mut self, packet: &Packet<&[u8]>, now: Instant) -> Handled {
        if self.phase == Phase::Done || self.phase == Phase::Idle || packet.seq() != self.seq {
            return Handled::Ignored;
        }
        if !self.heard {
            // The server answers this slot: the rest of the call's first window may go (after the
            // proof of its address, if that is what it asks for).
            self.heard = true;
            self.blast.widen(self.window);
        }
        match packet.kind() {
            Kind::Result => self.on_result(packet, Payload::Here(packet.payload()), now),
            Kind::Ack => {
                let Some(ack) = AckInfo::parse(packet.payload()) else { return Handled::Ignored };
                self.last_heard = now;
                if self.phase == Phase::Sending && self.blast.on_ack(ack) {
                    if let Some(sent) = self.window_sent_at.filter(|_| !self.window_resent) {
                        if ack.has(self.window_end.saturating_sub(1)) {
                            self.sample_rtt(now.saturating_duration_since(sent));
                            self.window_sent_at = None;
                        }
                    }
                    self.rto = self.base_rto();
                    // Fragments the acknowledgement shows lost go again at once.
                    let first = self.transmits.len();
                    for index in self.blast.take_lost() {
                        self.transmits.push(Transmit::CallFragment { index, please_ack: false });
                    }
                    self.retransmissions += (self.transmits.len() - first) as u64;
                    if self.blast.is_acked() {
                        self.server_has_call(now);
                    } else {
                        self.queue_new(now);
                        self.timer = Some(now + self.rto);
                    }
                }
                Handled::Progress
            }
            Kind::ProbeReply => {
                self.last_heard = now;
                if self.phase == Phase::Sending || self.phase == Phase::Waiting {
                    self.server_has_call(now);
                }
                Handled::Progress
            }
            Kind::Reject if packet.status() == Status::Busy && self.phase == Phase::Sending => {
                // The server is alive but has no worker free: the call was not accepted. Back off and
                // retransmit as every transport does ([`Refusals`]), the retransmission timeout
                // following the backoff; give up after `dead_after` of refusals.
                self.last_heard = now;
                let Some(again) = self.refusals.refused(now, self.rto, &self.timing) else {
                    self.finish(Outcome::Failed(Failure::Rejected(Status::Busy)));
                    return Handled::Complete;
                };
                self.blast = Blast::new(self.blast.count(), self.window);
                self.blast.take_new();
                self.retransmitted = true;
                self.rto = self.refusals.backoff();
                self.timer = Some(again);
                Handled::Progress
            }
            // A refusal of a packet of this call after the server has shown it holds the call (an
            // acknowledgement, a probe reply): a late or reordered answer to an earlier copy, or a
            // refused duplicate. The call stands; the refusal says nothing about it.
            Kind::Reject if packet.status() == Status::Busy => Handled::Ignored,
            Kind::Reject if packet.status() == Status::AddressUnproven => {
                // The server has not seen this slot's address prove that it receives (this thread's
                // first packet, or the address changed): echo its challenge and send again what it
                // refused. Nothing ran. At most once a retransmission interval, so that a server
                // that keeps refusing is left to the timers.
                let Ok(challenge) = packet.payload().try_into() else { return Handled::Ignored };
                if self.proved_at.is_some_and(|t| now.saturating_duration_since(t) < self.rto) {
                    return Handled::Ignored;
                }
                self.proved_at = Some(now);
                self.last_heard = now;
                self.retransmitted = true;
                self.transmits.push(Transmit::AddressProof { challenge });
                self.resend();
                if self.phase == Phase::Sending {
                    self.queue_new(now);
                }
                Handled::Progress
            }
            Kind::Reject => {
                self.finish(Outcome::Failed(Failure::Rejected(packet.status())));
                Handled::Complete
            }
            _ => Handled::Ignored,
        }
    }

    fn complete(&mut self, status: Status, reassembled: bool, now: Instant) {
        // A call of one packet each way measures a round trip (and the procedure's time); a larger
        // one is sampled from the acknowledgements of its fragments instead.
        let took = now.saturating_duration_since(self.started);
        self.took = Some(took);
        if !self.retransmitted && !reassembled && self.blast.count() == 1 {
            self.sample_rtt(took);
        }
        self.finish(Outcome::Result { status, reassembled });
    }

    fn server_has_call(&mut self, now: Instant) {
        self.acknowledged = true;
        self.phase = Phase::Waiting;
        self.rto = self.base_rto();
        self.timer = Some(now + self.timing.probe_interval);
    }

    /// Where the next fragments (up to `max` in a row) of a multi-packet result being received go,
    /// for an endpoint that reads them straight into place (then [`ClientCall::handle_landed`] for
    /// each that came): the first's index and their bytes, in order
    /// ([`crate::fragment::Reassembly::landing_run`]). `None` when no such result is being
    /// received, or the fragment expected next is not new.
    pub fn landing(&mut self, max: u16) -> Option<(u16, &mut [u8])> {
        if self.phase != Phase::Receiving {
            return None;
        }
        self.reassembly.as_mut()?.landing_run(max, |_| true)
    }

    /// The deadline of the call being made, if it has one: the call fails at it
    /// ([`ClientCall::poll_timeout`] is never later).
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// The length of the result message being reassembled, once its first fragment has come.
    pub fn result_len(&self) -> Option<usize> {
        self.reassembly.as_ref().map(Reassembly::message_len)
    }

    /// Handles a result fragment whose payload was received into the place [`ClientCall::landing`]
    /// gave: `packet` is its header alone, checked with [`Packet::check_split`], and already matched
    /// to the binding, token and incarnation. Anything else (another kind, another fragment) is
    /// the caller's to handle as a whole datagram with [`ClientCall::handle_packet`].
    pub fn handle_landed(&mut self, packet: &Packet<&[u8]>, now: Instant) -> Handled {
        if self.phase != Phase::Receiving
            || packet.seq() != self.seq
            || packet.kind() != Kind::Result
            || packet.frag_count() == 1
        {
            return Handled::Ignored;
        }
        self.on_result(packet, Payload::Landed(packet.payload_len() as usize), now)
    }

    fn on_result(&mut self, packet: &Packet<&[u8]>, payload: Payload<'_>, now: Instant) -> Handled {
        self.last_heard = now;
        let count = packet.frag_count();
        if count == 1 {
            self.complete(packet.status(), false, now);
            return Handled::Complete;
        }
        self.acknowledged = true;
        if self.reassembly.is_none() {
            let spare = core::mem::take(&mut self.spare);
            match Reassembly::reusing(spare, packet.message_len(), count, self.frag_payload, self.timing.max_message) {
                Ok(r) => self.reassembly = Some(r),
                Err(_) => return Handled::Ignored,
            }
        }
        self.phase = Phase::Receiving;
        let base_rto = self.base_rto();
        let Some(r) = self.reassembly.as_mut() else { return Handled::Ignored };
        let (index, len) = (packet.frag_index(), packet.message_len());
        let inserted = match payload {
            Payload::Here(bytes) => r.insert(index, count, len, bytes),
            Payload::Landed(n) => r.insert_landed(index, count, len, n),
        };
        match inserted {
            Err(_) | Ok(Inserted::Duplicate) => Handled::Ignored,
            Ok(Inserted::New) => {
                self.rto = base_rto;
                self.timer = Some(now + self.rto);
                if r.wants_ack(self.window) || packet.flags() & flags::PLEASE_ACK != 0 {
                    let ack = r.take_ack();
                    self.transmits.push(Transmit::Ack { ack, resend: false });
                }
                Handled::Progress
            }
            Ok(Inserted::Complete) => {
                let ack = r.take_ack();
                self.transmits.push(Transmit::Ack { ack, resend: false });
                self.complete(packet.status(), true, now);
                Handled::Complete
            }
        }
    }

    /// The reassembled result of a multi-packet result, once complete.
    pub fn take_message(&mut self) -> Option<Vec<u8>> {
        self.reassembly.take().filter(|r| r.is_complete()).map(Reassembly::into_message)
    }

    /// Lends the buffer of a result taken with [`ClientCall::take_message`] back, for the next
    /// multi-packet result to be reassembled in.
    pub fn recycle(&mut self, buf: Vec<u8>) {
        if buf.capacity() > self.spare.capacity() {
            self.spare = buf;
        }
    }

    /// Frees the lent buffer.
    pub fn drop_spare(&mut self) {
        self.spare = Vec::new();
    }

    /// The reassembled result of a multi-packet result, borrowed.
    pub fn message(&self) -> Option<&[u8]> {
        self.reassembly.as_ref().filter(|r| r.is_complete()).map(|r| r.message())
    }
}

#[cfg(test)]
mod tests;
