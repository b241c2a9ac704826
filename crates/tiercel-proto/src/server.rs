//! The server side of one client slot: duplicate suppression, reassembly of calls, the saved result.
//!
//! A client slot makes one call at a time with increasing sequence numbers, so the server keeps, per
//! slot, the last sequence number and what became of it. A call packet with a newer number starts a
//! call (and implicitly acknowledges the previous result); one with the same number is a duplicate
//! and is answered from the saved state, never run again; an older one is dropped. That is what
//! makes a call run at most once.

use std::time::Instant;

use crate::fragment::{fragment_count, AckInfo, Blast, Inserted, Reassembly, ReassemblyError};
use crate::timing::{seq_after, Timing};
use crate::wire::{flags, Packet};

/// What the server must do with a call packet.
#[derive(Debug, PartialEq, Eq)]
pub enum CallAction {
    /// A new single-packet call: run it with the packet's payload as the arguments, then call
    /// [`Slot::complete`].
    Execute,
    /// The last fragment of a multi-packet call arrived: run it with this message, then call
    /// [`Slot::complete`].
    ExecuteMessage(Vec<u8>),
    /// Send this acknowledgement of call fragments.
    Ack(AckInfo),
    /// A duplicate of a finished call: resend the saved result with [`Slot::resend_result`].
    ResendResult,
    /// Answer a new call with this refusal status as its result, without running anything, then
    /// call [`Slot::complete`]. Used for a call too large to accept.
    Refuse(crate::wire::Status),
    /// Answer with a `Reject` of status `Busy`, recording nothing: the call is not accepted now (the
    /// memory budget has no room for it, its partial message was reclaimed, or the slot still runs
    /// a call its client gave up), and the client backs off and sends it again from its first
    /// fragment. It never ran.
    Busy,
    /// Nothing to do.
    Drop(DropReason),
}

/// Why a packet was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Sequence number older than the slot's current call.
    Stale,
    /// A duplicate of a fragment already held, or of a call that is running and asked for no ack.
    Duplicate,
    /// A fragment that contradicts the message it belongs to, or lies beyond any sender's window.
    Malformed,
    /// Nothing to answer (for example the result was already acknowledged).
    Nothing,
}

/// What a cancellation freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancelled {
    /// A partial call: these bytes of reassembly go back to the memory budget.
    Reassembly(usize),
    /// The saved result: release it as if acknowledged.
    Result,
    /// Nothing (the call runs, or is not the slot's).
    Nothing,
}

/// What the server must do with a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeAction {
    /// The call is running: send a probe reply.
    Alive,
    /// Send this acknowledgement (the call is incomplete, or unknown when the prefix is 0).
    Ack(AckInfo),
    /// The call has finished: resend the saved result with [`Slot::resend_result`].
    ResendResult,
    /// Ignore it.
    Drop,
}

#[derive(Debug)]
enum State {
    Idle,
    Receiving(Reassembly),
    Running,
    Done(Blast),
    Acknowledged,
}

/// Protocol state of one client slot of a binding.
#[derive(Debug)]
pub struct Slot {
    seq: Option<u32>,
    /// The slot's sequence number before the call being reassembled: what it goes back to when that
    /// call is given up for want of memory or progress, so that the client's new attempt is new.
    prev_seq: Option<u32>,
    /// A call whose partial message was reclaimed: its fragments other than the first are refused as
    /// busy, so that the client starts it again from the first.
    reclaimed: Option<u32>,
    state: State,
    last_activity: Option<Instant>,
    released: usize,
    /// A buffer lent by the caller for the next multi-packet call to be reassembled in.
    lent: Vec<u8>,
    /// Result fragments to send, oldest first, taken with [`Slot::poll_transmit`]; `next` is the
    /// first not yet taken. Kept (cleared) between calls, so that sending allocates nothing.
    transmits: Vec<u16>,
    next: usize,
    /// Result fragments queued that had been sent before, since [`Slot::take_resent`].
    resent: u32,
}

impl Default for Slot {
    fn default() -> Slot {
        Slot::new()
    }
}

impl Slot {
    /// A slot that has seen no call.
    pub const fn new() -> Slot {
        Slot {
            seq: None,
            prev_seq: None,
            reclaimed: None,
            state: State::Idle,
            last_activity: None,
            released: 0,
            lent: Vec::new(),
            transmits: Vec::new(),
            next: 0,
            resent: 0,
        }
    }

    /// How many result fragments queued since the last call of this had been sent before (a
    /// retransmission), not for the first time; resets the count.
    pub fn take_resent(&mut self) -> u32 {
        core::mem::take(&mut self.resent)
    }

    /// The next result fragment to send, by index; call until `None` after every input.
    pub fn poll_transmit(&mut self) -> Option<u16> {
        let i = *self.transmits.get(self.next)?;
        self.next += 1;
        if self.next == self.transmits.len() {
            self.transmits.clear();
            self.next = 0;
        }
        Some(i)
    }

    fn queue(&mut self, fragments: impl IntoIterator<Item = u16>) {
        self.transmits.extend(fragments);
    }

    /// Lends a buffer (of an earlier message) for the next multi-packet call to be reassembled in;
    /// take it back with [`Slot::take_lent`] if no call used it. (tiercel's server keeps such buffers
    /// per worker thread, not per slot, so that its memory does not grow with the bindings.)
    pub fn lend(&mut self, buf: Vec<u8>) {
        self.lent = buf;
    }

    /// The lent buffer, unless a reassembly took it.
    pub fn take_lent(&mut self) -> Vec<u8> {
        core::mem::take(&mut self.lent)
    }

    /// Sequence number of the slot's latest call.
    pub fn seq(&self) -> Option<u32> {
        self.seq
    }

    /// When the slot last heard from its client.
    pub fn last_activity(&self) -> Option<Instant> {
        self.last_activity
    }

    /// Whether a call with sequence number `seq` would start a new call (rather than be a duplicate or
    /// stale). The server asks before deciding it has no worker to spare for a new call.
    pub fn is_new(&self, seq: u32) -> bool {
        self.seq.is_none_or(|s| seq_after(seq, s))
    }

    /// Whether the slot is receiving the fragments of a call.
    pub fn is_receiving(&self) -> bool {
        matches!(self.state, State::Receiving(_))
    }

    /// Whether a call is running on the slot.
    pub fn is_running(&self) -> bool {
        matches!(self.state, State::Running)
    }

    /// Whether the slot holds a saved result its client has not yet acknowledged.
    pub fn holds_result(&self) -> bool {
        matches!(self.state, State::Done(_))
    }

    /// Bytes held by a call being reassembled (what it has been granted by `reserve`).
    pub fn reassembly_bytes(&self) -> usize {
        match &self.state {
            State::Receiving(r) => r.held(),
            _ => 0,
        }
    }

    /// Gives up a call being reassembled that has not heard from its client for `after`: its bytes
    /// are returned (for the caller's memory budget) and its later fragments refused as busy until
    /// the client starts it again. Returns the bytes freed, if it gave a call up.
    pub fn reclaim_stale(&mut self, now: Instant, after: core::time::Duration) -> Option<usize> {
        let stale = self.last_activity.is_some_and(|t| now.saturating_duration_since(t) >= after);
        if !stale || !matches!(self.state, State::Receiving(_)) {
            return None;
        }
        self.reclaimed = self.seq;
        Some(self.give_up())
    }

    /// Drops the call being reassembled as if it had never come; returns the bytes it held.
    fn give_up(&mut self) -> usize {
        let State::Receiving(r) = core::mem::replace(&mut self.state, State::Acknowledged) else { return 0 };
        self.seq = self.prev_seq;
        // Its buffer is freed, not kept: memory no longer charged to a budget must not stay held.
        r.held()
    }

    /// Bytes of reassembly buffers dropped since the last call (a call abandoned by its client for a
    /// newer one); the caller returns them to its memory budget.
    pub fn take_released(&mut self) -> usize {
        core::mem::take(&mut self.released)
    }

    /// Handles a checked `Call` packet for this slot. `frag_payload` is the binding's fragment size
    /// and `window` its senders' window (what an acknowledgement is sent every half of); `reserve` is asked before a multi-packet call's reassembly buffer grows (by the bytes of the
    /// fragments that arrived, never by what the header claims) and may refuse: the call is then
    /// given up and refused as busy ([`CallAction::Busy`]). A new multi-packet call longer than
    /// `most()`, the most its binding's memory could ever hold, is refused `TooLarge` at its first
    /// fragment, as one longer than `max_message` is: it could never be put together.
    #[allow(clippy::too_many_arguments)]
    pub fn on_call(
        &mut self,
        packet: &Packet<&[u8]>,
        now: Instant,
        frag_payload: usize,
        window: u16,
        timing: &Timing,
        most: impl FnOnce() -> usize,
        reserve: impl FnOnce(usize) -> bool,
    ) -> CallAction {
        self.last_activity = Some(now);
        let seq = packet.seq();
        let please_ack = packet.flags() & flags::PLEASE_ACK != 0;
        let is_new = self.seq.is_none_or(|s| seq_after(seq, s));
        if is_new {
            if matches!(self.state, State::Running) {
                // The client gave the running call up (its deadline, a dropped future) and went on
                // to the next: refused as busy, so that it backs off and tries again, rather than
                // hear nothing and take the server for dead while the old call runs.
                return CallAction::Busy;
            }
            if self.reclaimed == Some(seq) && packet.frag_index() != 0 {
                return CallAction::Busy;
            }
            self.reclaimed = None;
            if let State::Receiving(abandoned) = &self.state {
                self.released += abandoned.held();
                self.state = State::Idle;
            }
            let count = packet.frag_count();
            if count == 1 {
                self.prev_seq = self.seq;
                self.seq = Some(seq);
                self.state = State::Running;
                return CallAction::Execute;
            }
            let len = packet.message_len() as usize;
            if fragment_count(len, frag_payload) != Some(count) {
                return CallAction::Drop(DropReason::Malformed);
            }
            if len > timing.max_message || len > most() {
                self.seq = Some(seq);
                self.state = State::Running;
                return CallAction::Refuse(crate::wire::Status::TooLarge);
            }
            let buf = core::mem::take(&mut self.lent);
            match Reassembly::reusing(buf, packet.message_len(), count, frag_payload, timing.max_message) {
                Ok(r) => {
                    self.prev_seq = self.seq;
                    self.seq = Some(seq);
                    self.state = State::Receiving(r);
                }
                Err(ReassemblyError::TooLarge { .. }) => {
                    self.seq = Some(seq);
                    self.state = State::Running;
                    return CallAction::Refuse(crate::wire::Status::TooLarge);
                }
                Err(ReassemblyError::NoMemory) => return CallAction::Busy,
                Err(_) => return CallAction::Drop(DropReason::Malformed),
            }
        } else if Some(seq) != self.seq {
            return CallAction::Drop(DropReason::Stale);
        }
        match &mut self.state {
            State::Receiving(r) => {
                let (index, count, len) = (packet.frag_index(), packet.frag_count(), packet.message_len());
                let inserted = r.insert_within(index, count, len, packet.payload(), reserve);
                self.after_insert(inserted, please_ack, window)
            }
            State::Running if please_ack => CallAction::Ack(AckInfo { prefix: packet.frag_count(), mask: 0 }),
            State::Running => CallAction::Drop(DropReason::Duplicate),
            State::Done(_) => CallAction::ResendResult,
            State::Acknowledged | State::Idle => CallAction::Drop(DropReason::Nothing),
        }
    }

    /// What a fragment's insertion into the call being received calls for.
    fn after_insert(
        &mut self,
        inserted: Result<Inserted, ReassemblyError>,
        please_ack: bool,
        window: u16,
    ) -> CallAction {
        let State::Receiving(r) = &mut self.state else { return CallAction::Drop(DropReason::Stale) };
        match inserted {
            Err(ReassemblyError::NoMemory) => {
                self.released += self.give_up();
                CallAction::Busy
            }
            Err(_) => CallAction::Drop(DropReason::Malformed),
            Ok(Inserted::Complete) => {
                let State::Receiving(r) = core::mem::replace(&mut self.state, State::Running) else {
                    unreachable!("matched Receiving above")
                };
                CallAction::ExecuteMessage(r.into_message())
            }
            Ok(inserted) => {
                if please_ack || r.wants_ack(window) {
                    CallAction::Ack(r.take_ack())
                } else if inserted == Inserted::Duplicate {
                    CallAction::Drop(DropReason::Duplicate)
                } else {
                    CallAction::Drop(DropReason::Nothing)
                }
            }
        }
    }

    /// Where the next fragments of call `seq`, which this slot is receiving, go: for a receiver
    /// that reads up to `max` of them in a row straight into place ([`Reassembly::landing_run`]),
    /// the first's index and their bytes. `reserve` is asked for the bytes the reassembly grows by
    /// (held, and given back with it). `None` when the slot is not receiving `seq`, nothing is
    /// awaited in order, or `reserve` refuses. With `behind`, the bytes given start that many before
    /// the place ([`Reassembly::landing_run_behind`]).
    pub fn landing(
        &mut self,
        seq: u32,
        max: u16,
        behind: usize,
        reserve: impl FnOnce(usize) -> bool,
    ) -> Option<(u16, &mut [u8])> {
        match &mut self.state {
            State::Receiving(r) if self.seq == Some(seq) => r.landing_run_behind(max, behind, reserve),
            _ => None,
        }
    }

    /// Handles a `Call` fragment received into the place [`Slot::landing`] gave: `packet` is its
    /// header alone (checked with [`Packet::check_split`]) and must be the fragment expected there
    /// (its index the first of the landing, or the next after one landed). Acts as
    /// [`Slot::on_call`] for the same fragment.
    pub fn on_landed(&mut self, packet: &Packet<&[u8]>, now: Instant, window: u16) -> CallAction {
        if self.seq != Some(packet.seq()) {
            return CallAction::Drop(DropReason::Stale);
        }
        let State::Receiving(r) = &mut self.state else { return CallAction::Drop(DropReason::Stale) };
        self.last_activity = Some(now);
        let (index, count, len) = (packet.frag_index(), packet.frag_count(), packet.message_len());
        let inserted = r.insert_landed(index, count, len, packet.payload_len() as usize);
        self.after_insert(inserted, packet.flags() & flags::PLEASE_ACK != 0, window)
    }

    /// Records that call `seq` finished with a result message of `result_len` bytes, saved by the
    /// caller until acknowledged, and queues the fragments to send now ([`Slot::poll_transmit`]):
    /// the first `window` of them.
    pub fn complete(&mut self, seq: u32, result_len: usize, frag_payload: usize, window: u16) {
        if self.seq != Some(seq) || !matches!(self.state, State::Running) {
            return;
        }
        let count = fragment_count(result_len, frag_payload).unwrap_or(u16::MAX);
        let mut blast = Blast::new(count, window);
        self.queue(blast.take_new());
        self.state = State::Done(blast);
    }

    /// Queues one fragment of the saved result (a duplicate call or a probe asked for it): the first
    /// the client has not acknowledged. Never more than one, whatever the packet that asked, so that
    /// a small request never draws a window of fragments; the client's acknowledgement of it, which
    /// says what it holds, brings the rest ([`Slot::on_result_ack`]).
    pub fn resend_result(&mut self) {
        let Slot { state, transmits, resent, .. } = self;
        if let State::Done(blast) = state {
            // Every fragment of a one-fragment result, and every unacknowledged one, went out before.
            let again = blast.count() == 1 || blast.unacked().next().is_some();
            let one = if blast.count() == 1 { Some(0) } else { blast.take_one() };
            if let Some(i) = one {
                transmits.push(i);
                *resent += u32::from(again);
            }
        }
    }

    /// Handles the client's acknowledgement of result fragments, queueing fragments to send. Returns
    /// true when the whole result is acknowledged and its buffer may be released.
    pub fn on_result_ack(&mut self, packet: &Packet<&[u8]>, now: Instant) -> bool {
        self.last_activity = Some(now);
        if self.seq != Some(packet.seq()) {
            return false;
        }
        let Some(ack) = AckInfo::parse(packet.payload()) else { return false };
        let Slot { state, transmits, resent, .. } = self;
        let State::Done(blast) = state else { return false };
        blast.on_ack(ack);
        if blast.is_acked() {
            *state = State::Acknowledged;
            return true;
        }
        let before = transmits.len();
        if packet.flags() & flags::RESEND != 0 {
            transmits.extend(blast.unacked());
        } else {
            // Fragments the acknowledgement shows lost go again at once.
            transmits.extend(blast.take_lost());
        }
        *resent += (transmits.len() - before) as u32;
        transmits.extend(blast.take_new());
        false
    }

    /// Takes back call `seq`, which the slot was about to run ([`CallAction::Execute`] or
    /// [`CallAction::ExecuteMessage`]) and did not start after all (no room for it): the slot is as if
    /// the call had never come, so that the client's next attempt, after a `Reject {Busy}`, is a new
    /// call. True if the slot was running `seq`.
    pub fn withdraw(&mut self, seq: u32) -> bool {
        if self.seq != Some(seq) || !matches!(self.state, State::Running) {
            return false;
        }
        self.seq = self.prev_seq;
        self.state = State::Acknowledged;
        true
    }

    /// Handles the client's cancellation of call `seq`: a call being reassembled is given up (its
    /// later fragments are dropped as those of a finished call), a saved result is dropped as if
    /// acknowledged. A call running, or one not yet seen, is left alone: cancellation is best
    /// effort, and the client treats the call as one that may have run.
    pub fn on_cancel(&mut self, seq: u32, now: Instant) -> Cancelled {
        self.last_activity = Some(now);
        if self.seq != Some(seq) {
            return Cancelled::Nothing;
        }
        match core::mem::replace(&mut self.state, State::Acknowledged) {
            State::Receiving(r) => Cancelled::Reassembly(r.held()),
            State::Done(_) => Cancelled::Result,
            other => {
                self.state = other;
                Cancelled::Nothing
            }
        }
    }

    /// Handles a probe for call `seq`.
    pub fn on_probe(&mut self, seq: u32, now: Instant) -> ProbeAction {
        self.last_activity = Some(now);
        match self.seq {
            Some(s) if s == seq => match &self.state {
                State::Running => ProbeAction::Alive,
                State::Receiving(r) => ProbeAction::Ack(r.ack()),
                State::Done(_) => ProbeAction::ResendResult,
                State::Acknowledged | State::Idle => ProbeAction::Drop,
            },
            Some(s) if !seq_after(seq, s) => ProbeAction::Drop,
            _ => ProbeAction::Ack(AckInfo::default()),
        }
    }
}
