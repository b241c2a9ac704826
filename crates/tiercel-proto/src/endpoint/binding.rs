//! A binding on the server: its client slots, each with its protocol state and saved result, and
//! the binding's memory budget.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use super::budget::Budget;
use crate::fragment::{fragment_count, fragment_range};
use crate::server::{CallAction, Slot};
use crate::timing::Timing;
use crate::wire::{flags, Header, Kind, Packet, Status, HEADER_LEN};

/// How a binding's calls reach the server: what the endpoint keeps for it besides its place in the
/// table, its budget, its admission and its expiry, which are the same for all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Carrier {
    /// Datagrams (UDP), which name the binding by id and token: each slot keeps its duplicate
    /// suppression, reassembly and saved result here ([`SlotCell`]).
    Datagram,
    /// A connection of its own (TCP): the connection is the binding, ordered and reliable, so a
    /// call is never duplicated and no result is saved. Forgotten when idle, as a datagram binding.
    Stream,
    /// A shared-memory region of its own, whose slots hold the calls and results: the binding
    /// lasts while its client holds the rendezvous connection.
    Region,
}

/// A binding granted to a client: what every packet on it is checked against, and its slots.
/// `E` is what the transport attaches to it (the `tiercel` crate: the exported interface).
#[derive(Debug)]
pub struct Binding<A, E> {
    /// How its calls come.
    pub carrier: Carrier,
    /// The binding id (index into the endpoint's table, from 1).
    pub id: u32,
    /// The capability every packet of the binding must carry.
    pub token: u128,
    /// What the transport attached.
    pub export: E,
    /// Largest datagram sent on the binding.
    pub max_datagram: usize,
    /// Who holds it, where its transport knew ([`super::ServerEndpoint::grant_from`],
    /// [`super::ServerEndpoint::connect_from`]).
    pub caller: Option<super::Caller>,
    /// The protocol features granted (`bind::wire::features`).
    pub features: u16,
    /// Fragments of a multi-packet message in flight beyond the acknowledged prefix, both ways: the
    /// server's timing for this binding's fragments, within what its client accepts.
    window: u16,
    incarnation: u64,
    /// Client slots (their number, whatever the carrier).
    slot_count: u32,
    /// A datagram binding's slots (empty for other carriers, whose transport keeps the calls).
    slots: Box<[Mutex<SlotCell<A>>]>,
    /// Bytes of this binding's messages, within `binding_memory`, and within its carrier's share
    /// of the server's budget ([`super::EndpointConfig::carrier_memory`]) and the server's.
    memory: Arc<Budget>,
    /// Nanoseconds after the endpoint's base time when a packet of the binding last arrived.
    pub(super) last_active: AtomicU64,
    /// Calls of a connection's binding running (an idle binding with a call running is not
    /// forgotten, and a draining server waits for them); a datagram binding's are counted by the
    /// endpoint, a region's by its transport.
    running: AtomicU32,
    /// The endpoint has forgotten the binding as idle: its transport closes it.
    expired: AtomicBool,
}

/// One client slot of a binding: its protocol state, its saved result and where to send it.
#[derive(Debug)]
pub struct SlotCell<A> {
    /// Duplicate suppression and reassembly ([`Slot`]).
    pub proto: Slot,
    /// The marshaled result of the slot's latest call from `body` on (header space before it when
    /// `body` is [`HEADER_LEN`]), kept until the client acknowledges it so that a duplicate is
    /// answered without running the call again.
    result: Vec<u8>,
    /// Where the result's bytes start in `result`: [`HEADER_LEN`], or where a procedure left them
    /// in the buffer of the call's arguments ([`SlotCell::complete_in_place`]).
    body: usize,
    /// The header of the saved result's first fragment.
    header: Header,
    /// Bytes of `result` charged to the binding's memory budget.
    charged: usize,
    /// The address this slot's client has proven it receives at (it echoed a challenge sent there):
    /// the only one the slot's packets are taken from and its answers sent to.
    pub peer: Option<A>,
}

/// A call being received, as [`SlotCell::call_at`] tells it: what a fragment received in place
/// is checked against ([`crate::endpoint::ServerEndpoint::continues`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallAt<A> {
    /// The slot's number in its binding.
    pub slot: u32,
    /// The call's sequence number.
    pub seq: u32,
    /// The address the slot's client proved it receives at.
    pub peer: A,
}

/// How to send one fragment of a saved result.
#[derive(Debug)]
pub enum Fragment<'a> {
    /// The whole datagram (a single-fragment result, its header written in place).
    Whole(&'a [u8]),
    /// A header and the fragment's bytes, to be gathered into one datagram.
    Parts([u8; HEADER_LEN], &'a [u8]),
}

impl<A, E> Binding<A, E> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        config: &super::EndpointConfig,
        carrier: Carrier,
        id: u32,
        token: u128,
        export: E,
        terms: super::Terms,
        carrier_memory: Arc<Budget>,
        caller: Option<super::Caller>,
        now: u64,
    ) -> Binding<A, E> {
        let frag_payload = terms.max_datagram.saturating_sub(HEADER_LEN);
        let limit = crate::bind::wire::features::max_window(terms.features);
        let cells = if carrier == Carrier::Datagram { config.slots_per_binding } else { 0 };
        Binding {
            carrier,
            id,
            token,
            export,
            max_datagram: terms.max_datagram,
            caller,
            features: terms.features,
            window: config.timing.window_for(frag_payload, limit),
            incarnation: config.incarnation,
            slot_count: config.slots_per_binding,
            slots: (0..cells)
                .map(|_| {
                    Mutex::new(SlotCell {
                        proto: Slot::new(),
                        result: Vec::new(),
                        body: HEADER_LEN,
                        header: Header::new(Kind::Result),
                        charged: 0,
                        peer: None,
                    })
                })
                .collect(),
            memory: Arc::new(Budget::within(config.binding_memory, carrier_memory)),
            last_active: AtomicU64::new(now),
            running: AtomicU32::new(0),
            expired: AtomicBool::new(false),
        }
    }

    /// The binding's memory budget (within `binding_memory`, its carrier's share and the
    /// server's), for a transport that charges its connection's or region's buffers to it.
    pub fn budget(&self) -> Arc<Budget> {
        self.memory.clone()
    }

    /// Calls of the binding running now.
    pub fn running(&self) -> u32 {
        self.running.load(Ordering::Acquire)
    }

    /// Notes that a call of the binding that holds no worker (an async procedure) starts; see
    /// [`Binding::call_ended`].
    pub fn call_began(&self) {
        self.running.fetch_add(1, Ordering::AcqRel);
    }

    /// Notes that such a call ended.
    pub fn call_ended(&self) {
        self.running.fetch_sub(1, Ordering::AcqRel);
    }

    /// Whether the endpoint forgot the binding as idle ([`super::ServerEndpoint::expire`]): its
    /// transport closes it, and [`super::ServerEndpoint::release`]s it.
    pub fn is_expired(&self) -> bool {
        self.expired.load(Ordering::Acquire)
    }

    /// Marks the binding forgotten as idle; false if it was already.
    pub(super) fn expire(&self) -> bool {
        !self.expired.swap(true, Ordering::AcqRel)
    }

    /// Bytes of a fragment's payload on this binding.
    pub fn frag_payload(&self) -> usize {
        self.max_datagram - HEADER_LEN
    }

    /// Fragments of a message in flight beyond the acknowledged prefix on this binding.
    pub fn window(&self) -> u16 {
        self.window
    }

    /// Number of client slots.
    pub fn slots(&self) -> u32 {
        self.slot_count
    }

    /// Slot `index`, locked; `None` outside the slot table (and for a binding whose carrier is not
    /// [`Carrier::Datagram`]: its transport keeps its calls).
    pub fn slot(&self, index: u32) -> Option<MutexGuard<'_, SlotCell<A>>> {
        self.slots.get(index as usize).map(|m| m.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Slot `index`, locked, unless another thread holds it (or it is outside the slot table).
    pub fn try_slot(&self, index: u32) -> Option<MutexGuard<'_, SlotCell<A>>> {
        match self.slots.get(index as usize)?.try_lock() {
            Ok(cell) => Some(cell),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Charges `bytes` to the binding's memory budget (and so to its carrier's share and the
    /// server's); false (nothing charged) if that would exceed any of them.
    pub fn reserve(&self, bytes: usize) -> bool {
        self.memory.reserve(bytes)
    }

    /// Returns `bytes` to the budgets.
    pub fn release(&self, bytes: usize) {
        self.memory.release(bytes);
    }

    /// The most this binding's messages may hold (`binding_memory`).
    pub fn memory_limit(&self) -> usize {
        self.memory.limit()
    }

    /// The most a message of this binding could ever be charged: its own limit or the least of the
    /// budgets it lies within (its source's part, its carrier's share, the server's), whichever is
    /// less. A call that needs more is refused `TooLarge`: it never fits, however long it waits.
    pub fn memory_most(&self) -> usize {
        self.memory.most()
    }

    /// Bytes charged to this binding now.
    pub fn memory(&self) -> usize {
        self.memory.used()
    }

    /// The header of a packet of `kind` answering `p` on this binding, with a payload of `len` bytes.
    pub fn reply_header(&self, p: &Packet<&[u8]>, kind: Kind, status: Status, len: usize) -> Header {
        Header {
            kind,
            flags: p.flags() & flags::CHECKSUM,
            status,
            procedure: p.procedure(),
            binding: self.id,
            slot: p.slot(),
            seq: p.seq(),
            frag_index: 0,
            frag_count: 1,
            payload_len: len as u32,
            message_len: len as u32,
            incarnation: self.incarnation,
            token: self.token,
        }
    }
}

impl<A> SlotCell<A> {
    /// Handles a checked `Call` packet for this slot of `binding`: duplicate suppression,
    /// reassembly charged to the binding's memory budget, and the bytes of an abandoned
    /// reassembly given back.
    pub fn on_call<E>(
        &mut self,
        binding: &Binding<A, E>,
        p: &Packet<&[u8]>,
        now: Instant,
        timing: &Timing,
    ) -> CallAction {
        let (frag_payload, window) = (binding.frag_payload(), binding.window);
        let most = || binding.memory_most();
        let action = self.proto.on_call(p, now, frag_payload, window, timing, most, |n| binding.reserve(n));
        binding.release(self.proto.take_released());
        action
    }

    /// The call this slot (number `slot`) is receiving from its proven peer, if any.
    pub fn call_at(&self, slot: u32) -> Option<CallAt<A>>
    where
        A: Copy,
    {
        let seq = self.proto.seq().filter(|_| self.proto.is_receiving())?;
        Some(CallAt { slot, seq, peer: self.peer? })
    }

    /// Where the next fragments of call `seq`, which this slot is receiving, go, for a receiver
    /// that reads up to `max` of them in a row straight into place ([`Slot::landing`]): the
    /// first's index and their bytes. The bytes the reassembly grows by are charged to `binding`'s
    /// memory budget (and `None` when it has no room). With `behind`, the bytes given start that
    /// many before the place, as [`Slot::landing`] gives them.
    pub fn landing<E>(
        &mut self,
        binding: &Binding<A, E>,
        seq: u32,
        max: u16,
        behind: usize,
    ) -> Option<(u16, &mut [u8])> {
        self.proto.landing(seq, max, behind, |n| binding.reserve(n))
    }

    /// Handles a `Call` fragment received into place ([`Slot::on_landed`]), after
    /// [`crate::endpoint::ServerEndpoint::continues`] said it continues this slot's call; acts as
    /// [`SlotCell::on_call`].
    pub fn on_landed<E>(&mut self, binding: &Binding<A, E>, p: &Packet<&[u8]>, now: Instant) -> CallAction {
        let action = self.proto.on_landed(p, now, binding.window);
        binding.release(self.proto.take_released());
        action
    }

    /// Takes the buffer of the saved result (emptied), for the next result to be marshaled into
    /// behind [`HEADER_LEN`] bytes of header space; the memory it was charged goes back.
    pub fn take_result<E>(&mut self, binding: &Binding<A, E>) -> Vec<u8> {
        binding.release(core::mem::take(&mut self.charged));
        let mut out = core::mem::take(&mut self.result);
        out.clear();
        self.body = HEADER_LEN;
        out
    }

    /// Records the result of call `p` (`status`, and `result`: header space then the marshaled
    /// result) and queues its fragments for [`SlotCell::poll_transmit`]. A result of more than one
    /// fragment is charged to the binding's memory budget until acknowledged; past the budget or
    /// `timing.max_message` it is replaced by a `ResultTooLarge` error. Returns the final status.
    pub fn complete<E>(
        &mut self,
        binding: &Binding<A, E>,
        p: &Packet<&[u8]>,
        status: Status,
        result: Vec<u8>,
        timing: &Timing,
    ) -> Status {
        self.complete_in_place(binding, p, status, result, HEADER_LEN, timing)
    }

    /// As [`SlotCell::complete`], for a result whose bytes start at `body` in `result`: where a
    /// procedure marshaled them in place of the arguments it was called with, so that a large
    /// `InOut` buffer goes back without a copy. A result of one fragment whose header does not fit
    /// before `body` is copied behind header space in the slot's own buffer.
    pub fn complete_in_place<E>(
        &mut self,
        binding: &Binding<A, E>,
        p: &Packet<&[u8]>,
        mut status: Status,
        mut result: Vec<u8>,
        mut body: usize,
        timing: &Timing,
    ) -> Status {
        // A result saved before (not taken with `take_result`) is replaced: its charge goes back.
        binding.release(core::mem::take(&mut self.charged));
        let frag_payload = binding.frag_payload();
        if result.len() < body {
            // Header space not yet made.
            result.resize(body, 0);
        }
        let mut len = result.len() - body;
        if len <= frag_payload && body != HEADER_LEN {
            let mut whole = self.take_result(binding);
            whole.resize(HEADER_LEN, 0);
            crate::copy::extend(&mut whole, &result[body..]);
            (result, body) = (whole, HEADER_LEN);
        }
        if len > frag_payload {
            if len <= timing.max_message && binding.reserve(len) {
                self.charged = len;
            } else {
                result.truncate(HEADER_LEN);
                result.resize(HEADER_LEN, 0);
                body = HEADER_LEN;
                let message = format!("result of {len} bytes exceeds the server's limit or memory budget");
                result.extend_from_slice(message.as_bytes());
                status = Status::ResultTooLarge;
                len = result.len() - HEADER_LEN;
            }
        }
        let count = fragment_count(len, frag_payload).unwrap_or(u16::MAX);
        let mut header = binding.reply_header(p, Kind::Result, status, len.min(frag_payload));
        header.frag_count = count;
        header.message_len = len as u32;
        if body == HEADER_LEN {
            // The header a single-fragment result is sent whole with (its bytes lie behind it).
            if let Some(h) = result.first_chunk_mut::<HEADER_LEN>() {
                header.emit(h);
            }
        }
        self.header = header;
        self.result = result;
        self.body = body;
        self.proto.complete(p.seq(), len, frag_payload, binding.window);
        status
    }

    /// Records a refusal of call `p` ([`CallAction::Refuse`]) as its result, so that duplicates get
    /// the same answer, and queues it for [`SlotCell::poll_transmit`].
    pub fn refuse<E>(&mut self, binding: &Binding<A, E>, p: &Packet<&[u8]>, status: Status, timing: &Timing) {
        let mut out = self.take_result(binding);
        out.resize(HEADER_LEN, 0);
        out.extend_from_slice(b"call exceeds the server's message limit or memory budget");
        self.complete(binding, p, status, out, timing);
    }

    /// The next result fragment to send ([`Slot::poll_transmit`]) and how to send it.
    pub fn poll_transmit<E>(&mut self, binding: &Binding<A, E>) -> Option<Fragment<'_>> {
        let index = self.poll_fragment()?;
        Some(self.fragment(binding, index))
    }

    /// The index of the next result fragment to send ([`Slot::poll_transmit`]), for a sender that
    /// gathers several before sending them ([`SlotCell::fragment`] gives each one's bytes).
    pub fn poll_fragment(&mut self) -> Option<u16> {
        self.proto.poll_transmit()
    }

    /// Whether the saved result goes as one datagram ([`Fragment::Whole`]).
    #[inline]
    pub fn is_whole(&self) -> bool {
        self.header.frag_count == 1
    }

    /// Result fragment `index` of the saved result, and how to send it.
    pub fn fragment<E>(&self, binding: &Binding<A, E>, index: u16) -> Fragment<'_> {
        if self.is_whole() {
            return Fragment::Whole(&self.result);
        }
        let body = &self.result[self.body..self.body + self.header.message_len as usize];
        let range = fragment_range(index, body.len(), binding.frag_payload());
        let header = Header { frag_index: index, payload_len: range.len() as u32, ..self.header };
        Fragment::Parts(header.to_bytes(), &body[range])
    }

    /// Handles the client's acknowledgement of result fragments (queueing any to send). When the
    /// whole result is acknowledged its memory goes back to the budget and its buffer is returned
    /// (cleared; a small one stays with the slot), for the caller to keep or drop.
    pub fn on_result_ack<E>(&mut self, binding: &Binding<A, E>, p: &Packet<&[u8]>, now: Instant) -> Option<Vec<u8>> {
        if !self.proto.on_result_ack(p, now) {
            return None;
        }
        self.release_result(binding)
    }

    /// Handles the client's cancellation of call `p.seq()` ([`crate::server::Slot::on_cancel`]),
    /// returning its memory to the budgets. Returns a large result buffer, as
    /// [`SlotCell::on_result_ack`] does.
    pub fn on_cancel<E>(&mut self, binding: &Binding<A, E>, p: &Packet<&[u8]>, now: Instant) -> Option<Vec<u8>> {
        match self.proto.on_cancel(p.seq(), now) {
            crate::server::Cancelled::Reassembly(bytes) => {
                binding.release(bytes);
                None
            }
            crate::server::Cancelled::Result => self.release_result(binding),
            crate::server::Cancelled::Nothing => None,
        }
    }

    fn release_result<E>(&mut self, binding: &Binding<A, E>) -> Option<Vec<u8>> {
        binding.release(core::mem::take(&mut self.charged));
        self.result.truncate(HEADER_LEN);
        self.body = HEADER_LEN;
        if self.result.capacity() > binding.max_datagram {
            // The slot keeps a buffer of one datagram; a larger one goes back to the caller.
            let mut big = core::mem::replace(&mut self.result, Vec::with_capacity(binding.max_datagram));
            big.clear();
            return Some(big);
        }
        None
    }

    /// Whether the slot's results carry a checksum trailer (its call did).
    pub fn checksummed(&self) -> bool {
        self.header.flags & flags::CHECKSUM != 0
    }

    /// Queues the saved result again (a duplicate call, a probe of a finished call).
    pub fn resend_result(&mut self) {
        self.proto.resend_result();
    }
}
