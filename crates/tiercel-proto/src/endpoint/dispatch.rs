//! The dispatch of a datagram's packet once its slot is entered: what the protocol's answer asks
//! the transport to do, decided here once for the UDP server and the simulation alike.
//!
//! ```text
//! Call ─► SlotCell::on_call (the transport may lend a buffer around it) ─► call_step ─┐
//! Ack, Cancel, Probe ─► control_step ─────────────────────────────────────────────────┤
//!                                                                                     ▼
//!        Step::Run / RunMessage (run, then complete the slot) · Reply (to the slot's peer)
//!        · Flush (what the slot queued) · Quiet (nothing to send; counted by reason)
//! ```

use std::hash::Hash;
use std::time::Instant;

use super::{Binding, ServerEndpoint, SlotCell};
use crate::fragment::ACK_PAYLOAD_LEN;
use crate::server::{CallAction, DropReason, ProbeAction};
use crate::wire::{Header, Kind, Packet, Status};

/// A packet for the slot's proven peer alone, with nothing saved behind it: an `Ack`, a
/// `ProbeReply`, a `Reject {Busy}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    /// Its header.
    pub header: Header,
    ack: Option<[u8; ACK_PAYLOAD_LEN]>,
}

impl Reply {
    /// Its payload (an acknowledgement's, or none).
    pub fn payload(&self) -> &[u8] {
        self.ack.as_ref().map_or(&[], |a| &a[..])
    }
}

/// Why nothing is sent for a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quiet {
    /// A duplicate of a fragment held or of a call running.
    Duplicate,
    /// A fragment that contradicts its message, or lies beyond any sender's window.
    Malformed,
    /// A cancel, handled (an async procedure running the call is to be stopped by the transport).
    Cancelled,
    /// Nothing to count: a fragment held, a stale packet, a probe needing no answer.
    Nothing,
}

/// What the transport does for a packet of a slot.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Run the call with the packet's payload as its arguments, then complete the slot
    /// ([`SlotCell::complete`]) and send what it queues.
    Run,
    /// Run the call with its reassembled message, which stays charged to the binding until the
    /// transport releases its length ([`Binding::release`]); then as [`Step::Run`].
    RunMessage(Vec<u8>),
    /// Send this to the slot's peer.
    Reply(Reply),
    /// Send what the slot queued: its saved result again (`duplicate`: for a duplicate of a
    /// finished call), a refusal just recorded, or the rest of a result after an acknowledgement.
    Flush {
        /// It answers a duplicate (for the transport's count).
        duplicate: bool,
    },
    /// Send nothing.
    Quiet(Quiet),
}

impl<A: Copy + Eq + Hash, E> ServerEndpoint<A, E> {
    /// What to do for call packet `p` of `cell`, a slot of `binding`, whose protocol state answered
    /// `action` ([`SlotCell::on_call`] or [`SlotCell::on_landed`]). A call too large to accept is
    /// recorded refused here, so that its duplicates get the same answer.
    pub fn call_step(
        &self,
        binding: &Binding<A, E>,
        cell: &mut SlotCell<A>,
        p: &Packet<&[u8]>,
        action: CallAction,
    ) -> Step {
        match action {
            CallAction::Execute => Step::Run,
            CallAction::ExecuteMessage(message) => Step::RunMessage(message),
            CallAction::Ack(a) => Step::Reply(Reply {
                header: binding.reply_header(p, Kind::Ack, Status::Ok, ACK_PAYLOAD_LEN),
                ack: Some(a.to_bytes()),
            }),
            CallAction::Busy => Step::Reply(Reply { header: self.reject(p, Status::Busy), ack: None }),
            CallAction::ResendResult => {
                cell.resend_result();
                Step::Flush { duplicate: true }
            }
            CallAction::Refuse(status) => {
                cell.refuse(binding, p, status, &self.config.timing);
                Step::Flush { duplicate: false }
            }
            CallAction::Drop(DropReason::Duplicate) => Step::Quiet(Quiet::Duplicate),
            CallAction::Drop(DropReason::Malformed) => Step::Quiet(Quiet::Malformed),
            CallAction::Drop(DropReason::Nothing | DropReason::Stale) => Step::Quiet(Quiet::Nothing),
        }
    }

    /// What to do for `p`, an `Ack`, `Cancel` or `Probe` of `cell`, a slot of `binding`, at `now`;
    /// with a large result buffer the slot gave back (an acknowledged or cancelled result), for the
    /// transport to keep or drop.
    pub fn control_step(
        &self,
        binding: &Binding<A, E>,
        cell: &mut SlotCell<A>,
        p: &Packet<&[u8]>,
        now: Instant,
    ) -> (Step, Option<Vec<u8>>) {
        match p.kind() {
            Kind::Ack => {
                let spare = cell.on_result_ack(binding, p, now);
                (Step::Flush { duplicate: false }, spare)
            }
            Kind::Cancel => (Step::Quiet(Quiet::Cancelled), cell.on_cancel(binding, p, now)),
            Kind::Probe => {
                let step = match cell.proto.on_probe(p.seq(), now) {
                    ProbeAction::Alive => Step::Reply(Reply {
                        header: binding.reply_header(p, Kind::ProbeReply, Status::Ok, 0),
                        ack: None,
                    }),
                    ProbeAction::Ack(a) => Step::Reply(Reply {
                        header: binding.reply_header(p, Kind::Ack, Status::Ok, ACK_PAYLOAD_LEN),
                        ack: Some(a.to_bytes()),
                    }),
                    ProbeAction::ResendResult => {
                        cell.resend_result();
                        Step::Flush { duplicate: false }
                    }
                    ProbeAction::Drop => Step::Quiet(Quiet::Nothing),
                };
                (step, None)
            }
            // `route` sends nothing else to a slot.
            _ => (Step::Quiet(Quiet::Malformed), None),
        }
    }
}
