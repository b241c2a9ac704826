//! A server worker thread: receive, validate, find the slot, run the procedure inline, send the result.
//!
//! The fast path of the server is `Worker::run` → `handle` → `on_call` → `execute`: one `recvfrom`
//! into the worker's buffer, an O(1) header check, the binding and slot found by index, the procedure
//! run with arguments borrowed from that buffer, results marshaled into the slot's result buffer behind
//! a prebuilt header, one `sendmsg`. The slot's lock is not held while the procedure runs.

use std::cell::RefCell;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use tiercel_proto::bind::BindDecision;
use tiercel_proto::fragment::{fragment_count, fragment_range};
use tiercel_proto::server::{CallAction, ProbeAction};
use tiercel_proto::wire::{flags, Header, Kind, Packet, Status, HEADER_LEN};
use tiercel_sys::udp::{self, Received};

use super::table::{ServerBinding, SlotCell};
use super::Shared;
use crate::interface::{DispatchError, Export, Results};
use crate::steps::{self, mark, Point};
use crate::transmit;

/// Whether a reply to `p` carries a checksum trailer: when `p` did.
fn checksummed(p: &Packet<&[u8]>) -> bool {
    p.flags() & flags::CHECKSUM != 0
}

/// How often worker 0 looks for idle bindings.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Longest error message sent back in a result.
const MAX_ERROR_MESSAGE: usize = 1024;

pub(super) struct Worker {
    shared: Arc<Shared>,
    index: usize,
    rx: Vec<u8>,
    spinning: bool,
    waiter: Option<udp::ExclusiveWaiter>,
    spares: RefCell<Spares>,
}

/// Buffers of the last multi-packet call this worker ran and of its result, kept for the next one
/// so that a stream of large calls does not allocate, fault in and zero fresh ones each time (or
/// leave the allocator to alternate between mapping and unmapping them). One pair per worker, each at
/// most the message limit; freed when the worker has heard nothing for 100 ms.
#[derive(Default)]
struct Spares {
    message: Vec<u8>,
    result: Vec<u8>,
}

impl Worker {
    pub(super) fn new(shared: Arc<Shared>, index: usize) -> Worker {
        let rx = vec![0; shared.config.max_datagram];
        // Each worker waits through its own exclusive waiter, so that a packet wakes one blocked
        // worker, not all of them (falling back to `poll` if epoll is refused).
        let waiter = udp::ExclusiveWaiter::new(&shared.socket).ok();
        Worker { shared, index, rx, spinning: false, waiter, spares: RefCell::default() }
    }

    pub(super) fn run(mut self) {
        let cpus = &self.shared.config.cpus;
        if !cpus.is_empty() {
            let _ = tiercel_sys::cpu::pin_current_thread(cpus[self.index % cpus.len()]);
        }
        let mut spin_until = Instant::now();
        let mut next_sweep = Instant::now() + SWEEP_INTERVAL;
        while !self.shared.stop.load(Ordering::Relaxed) {
            if self.index == 0 && Instant::now() >= next_sweep {
                next_sweep = Instant::now() + SWEEP_INTERVAL;
                self.sweep();
            }
            match udp::recv_from_nowait(&self.shared.socket, &mut self.rx) {
                Ok(Some((Received::Datagram(n), from))) => {
                    mark(Point::ServerArrived);
                    self.handle(n, from);
                    steps::close();
                    if self.spinning || self.try_spin() {
                        spin_until = Instant::now() + self.shared.config.spin;
                    }
                    continue;
                }
                Ok(Some((Received::Truncated(_), _))) => {
                    self.shared.stats.malformed.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                Ok(None | Some((Received::Nothing | Received::Refused, _))) => {}
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
            if self.spinning {
                if Instant::now() < spin_until {
                    core::hint::spin_loop();
                    continue;
                }
                self.spinning = false;
                self.shared.spinners.fetch_sub(1, Ordering::AcqRel);
            }
            let ready = match &self.waiter {
                Some(w) => w.wait(Some(Duration::from_millis(100))),
                None => udp::wait_readable(&self.shared.socket, Some(Duration::from_millis(100))),
            };
            if matches!(ready, Ok(false)) {
                // 100 ms without a packet: give the spare buffers back.
                self.spares.take();
            }
        }
        if self.spinning {
            self.shared.spinners.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Forgets idle bindings (worker 0, about once a second).
    fn sweep(&self) {
        let idle = self.shared.config.binding_idle.as_millis() as u64;
        let cutoff = self.now_ms().saturating_sub(idle);
        let n = self.shared.table.expire(cutoff);
        self.shared.stats.expired.fetch_add(n as u64, Ordering::Relaxed);
    }

    fn now_ms(&self) -> u64 {
        self.shared.epoch.elapsed().as_millis() as u64
    }

    fn try_spin(&mut self) -> bool {
        let max = self.shared.config.spinners;
        let mut n = self.shared.spinners.load(Ordering::Acquire);
        while n < max {
            match self.shared.spinners.compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    self.spinning = true;
                    return true;
                }
                Err(m) => n = m,
            }
        }
        false
    }

    fn handle(&mut self, n: usize, from: SocketAddr) {
        let rx = std::mem::take(&mut self.rx);
        self.handle_packet(&rx[..n], from);
        self.rx = rx;
    }

    fn handle_packet(&self, bytes: &[u8], from: SocketAddr) {
        let stats = &self.shared.stats;
        let Ok(p) = Packet::new_checked(bytes) else {
            stats.malformed.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let kind = p.kind();
        if kind == Kind::Bind {
            return self.on_bind(&p, from);
        }
        if !matches!(kind, Kind::Call | Kind::Ack | Kind::Probe) {
            stats.malformed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let Some(binding) = self.shared.table.lookup(p.binding(), p.token()) else {
            return self.reject(&p, from, Status::UnknownBinding);
        };
        if p.incarnation() != self.shared.incarnation {
            return self.reject(&p, from, Status::WrongIncarnation);
        }
        binding.touch(self.now_ms());
        let Some(mut cell) = binding.slot(p.slot()) else {
            return self.reject(&p, from, Status::BadSlot);
        };
        if kind == Kind::Call
            && self.shared.running.load(Ordering::Acquire) >= self.shared.max_running
            && cell.proto.is_new(p.seq())
        {
            // Every worker that may run calls is running one: refuse the new call at once (it is not
            // recorded, so the client's retransmission after backing off is a fresh attempt) rather
            // than let it queue without bound.
            self.shared.stats.busy.fetch_add(1, Ordering::Relaxed);
            return self.reject(&p, from, Status::Busy);
        }
        cell.peer = Some(from);
        let now = Instant::now();
        match kind {
            Kind::Call => self.on_call(&binding, cell, &p, now),
            Kind::Ack => {
                let SlotCell { proto, result, status, peer, .. } = &mut *cell;
                let done = proto.on_result_ack(&p, now, |i| {
                    stats.resent.fetch_add(1, Ordering::Relaxed);
                    self.send_result_fragment(&binding, &p, *status, result, *peer, i);
                });
                if done {
                    binding.release(std::mem::take(&mut cell.charged));
                    cell.result.truncate(HEADER_LEN);
                    if cell.result.capacity() > binding.max_datagram {
                        // The slot keeps a buffer of one datagram; a larger one goes to this
                        // worker's spares for the next large result.
                        let big = std::mem::replace(&mut cell.result, Vec::with_capacity(binding.max_datagram));
                        let mut spares = self.spares.borrow_mut();
                        if big.capacity() > spares.result.capacity() {
                            spares.result = big;
                        }
                    }
                }
            }
            _ => match cell.proto.on_probe(p.seq(), now) {
                ProbeAction::Alive => self.send_control(&binding, &p, from, Kind::ProbeReply, &[]),
                ProbeAction::Ack(a) => self.send_control(&binding, &p, from, Kind::Ack, &a.to_bytes()),
                ProbeAction::ResendResult => self.resend(&binding, &mut cell, &p),
                ProbeAction::Drop => {}
            },
        }
    }

    fn on_call(
        &self,
        binding: &Arc<ServerBinding>,
        mut cell: MutexGuard<'_, SlotCell>,
        p: &Packet<&[u8]>,
        now: Instant,
    ) {
        mark(Point::ServerValidated);
        let frag_payload = binding.max_datagram - HEADER_LEN;
        let timing = &self.shared.config.timing;
        let multi_packet = p.frag_count() > 1;
        if multi_packet {
            let lent = std::mem::take(&mut self.spares.borrow_mut().message);
            cell.proto.lend(lent);
        }
        let action = cell.proto.on_call(p, now, frag_payload, timing, |n| binding.reserve(n));
        if multi_packet {
            let unused = cell.proto.take_lent();
            if unused.capacity() > 0 {
                self.spares.borrow_mut().message = unused;
            }
        }
        binding.release(cell.proto.take_released());
        match action {
            CallAction::Execute => {
                mark(Point::ServerAccepted);
                self.execute(binding, cell, p, p.payload(), Status::Ok, false)
            }
            CallAction::ExecuteMessage(message) => {
                let len = message.len();
                self.execute(binding, cell, p, &message, Status::Ok, true);
                binding.release(len);
                let mut spares = self.spares.borrow_mut();
                if message.capacity() > spares.message.capacity() {
                    spares.message = message;
                }
            }
            CallAction::Ack(a) => {
                if let Some(peer) = cell.peer {
                    self.send_control(binding, p, peer, Kind::Ack, &a.to_bytes());
                }
            }
            CallAction::ResendResult => {
                self.shared.stats.duplicates.fetch_add(1, Ordering::Relaxed);
                self.resend(binding, &mut cell, p);
            }
            CallAction::Refuse(status) => self.execute(binding, cell, p, &[], status, false),
            CallAction::Drop(_) => {
                self.shared.stats.duplicates.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Runs a call (or, with a refusal `status`, records the refusal as its result) and sends the result.
    /// A `large` call (one of several packets) has its result marshaled into this worker's spare
    /// result buffer, if it has one: large calls tend to have large results.
    fn execute(
        &self,
        binding: &ServerBinding,
        mut cell: MutexGuard<'_, SlotCell>,
        p: &Packet<&[u8]>,
        args: &[u8],
        refusal: Status,
        large: bool,
    ) {
        binding.release(std::mem::take(&mut cell.charged));
        let mut out = std::mem::take(&mut cell.result);
        if large {
            let mut spares = self.spares.borrow_mut();
            if spares.result.capacity() > out.capacity() {
                std::mem::swap(&mut out, &mut spares.result);
            }
        }
        let slot = p.slot();
        drop(cell);
        out.clear();
        out.resize(HEADER_LEN, 0);
        let mut status = if refusal == Status::Ok {
            self.shared.stats.calls.fetch_add(1, Ordering::Relaxed);
            self.shared.running.fetch_add(1, Ordering::AcqRel);
            let status = self.run_procedure(&*binding.export, p.procedure(), args, &mut out);
            self.shared.running.fetch_sub(1, Ordering::AcqRel);
            status
        } else {
            error_message(&mut out, "call exceeds the server's message limit or memory budget");
            refusal
        };
        let frag_payload = binding.max_datagram - HEADER_LEN;
        let mut len = out.len() - HEADER_LEN;
        if large && len <= frag_payload && out.capacity() > binding.max_datagram {
            // A small result in the large spare: the slot keeps it in a small buffer instead.
            let mut spares = self.spares.borrow_mut();
            let mut small = std::mem::take(&mut spares.result);
            small.clear();
            small.extend_from_slice(&out);
            spares.result = std::mem::replace(&mut out, small);
        }
        let mut charged = 0;
        if len > frag_payload {
            if len <= self.shared.config.timing.max_message && binding.reserve(len) {
                charged = len;
            } else {
                out.truncate(HEADER_LEN);
                error_message(&mut out, &format!("result of {len} bytes exceeds the server's limit or memory budget"));
                status = Status::ResultTooLarge;
                len = out.len() - HEADER_LEN;
            }
        }
        let Some(mut cell) = binding.slot(slot) else { return };
        cell.result = out;
        cell.status = status;
        cell.charged = charged;
        let count = fragment_count(len, frag_payload).unwrap_or(u16::MAX);
        let header = result_header(binding, p, status, 0, count, len.min(frag_payload), len);
        if let Some(h) = cell.result.first_chunk_mut::<HEADER_LEN>() {
            header.emit(h);
        }
        let SlotCell { proto, result, peer, .. } = &mut *cell;
        mark(Point::ResultReady);
        proto.complete(p.seq(), len, frag_payload, &self.shared.config.timing, |i| {
            self.send_result_fragment(binding, p, status, result, *peer, i);
        });
        mark(Point::ResultSent);
    }

    fn run_procedure(&self, export: &dyn Export, procedure: u16, args: &[u8], out: &mut Vec<u8>) -> Status {
        run_procedure(
            export,
            procedure,
            args,
            out,
            HEADER_LEN,
            self.shared.config.timing.max_message,
            &self.shared.stats,
        )
    }

    fn resend(&self, binding: &ServerBinding, cell: &mut SlotCell, p: &Packet<&[u8]>) {
        let SlotCell { proto, result, status, peer, .. } = cell;
        proto.resend_result(|i| {
            self.shared.stats.resent.fetch_add(1, Ordering::Relaxed);
            self.send_result_fragment(binding, p, *status, result, *peer, i);
        });
    }

    fn send_result_fragment(
        &self,
        binding: &ServerBinding,
        p: &Packet<&[u8]>,
        status: Status,
        result: &[u8],
        peer: Option<SocketAddr>,
        index: u16,
    ) {
        let Some(peer) = peer else { return };
        let len = result.len().saturating_sub(HEADER_LEN);
        let frag_payload = binding.max_datagram - HEADER_LEN;
        let count = fragment_count(len, frag_payload).unwrap_or(u16::MAX);
        let sent = if count == 1 {
            transmit::send(&self.shared.socket, Some(&peer), &[IoSlice::new(result)], checksummed(p))
        } else {
            let range = fragment_range(index, len, frag_payload);
            let hdr = result_header(binding, p, status, index, count, range.len(), len).to_bytes();
            let body = &result[HEADER_LEN + range.start..HEADER_LEN + range.end];
            transmit::send(&self.shared.socket, Some(&peer), &[IoSlice::new(&hdr), IoSlice::new(body)], checksummed(p))
        };
        // A failed send is a lost packet: the client's timers ask again.
        let _ = sent;
    }

    fn send_control(&self, binding: &ServerBinding, p: &Packet<&[u8]>, to: SocketAddr, kind: Kind, payload: &[u8]) {
        let mut h = result_header(binding, p, Status::Ok, 0, 1, payload.len(), payload.len());
        h.kind = kind;
        let _ = transmit::send(
            &self.shared.socket,
            Some(&to),
            &[IoSlice::new(&h.to_bytes()), IoSlice::new(payload)],
            checksummed(p),
        );
    }

    fn reject(&self, p: &Packet<&[u8]>, to: SocketAddr, status: Status) {
        self.shared.stats.rejected.fetch_add(1, Ordering::Relaxed);
        let h = Header {
            status,
            flags: p.flags() & flags::CHECKSUM,
            binding: p.binding(),
            slot: p.slot(),
            seq: p.seq(),
            procedure: p.procedure(),
            incarnation: self.shared.incarnation,
            token: p.token(),
            ..Header::new(Kind::Reject)
        };
        let _ = transmit::send(&self.shared.socket, Some(&to), &[IoSlice::new(&h.to_bytes())], checksummed(p));
    }

    /// Answers a bind request through the server's bind machine: a binding from the table, or the
    /// machine's answer (a challenge or a refusal, never longer than the request).
    fn on_bind(&self, p: &Packet<&[u8]>, from: SocketAddr) {
        let stats = &self.shared.stats;
        let machine = self.shared.bind_machine(self.shared.config.max_datagram);
        let received = HEADER_LEN + p.payload_len() as usize;
        let admission = match machine.on_request(p, &crate::auth::peer_bytes(from), received) {
            BindDecision::Malformed => {
                stats.malformed.fetch_add(1, Ordering::Relaxed);
                return;
            }
            BindDecision::Answer { packet, refused } => {
                self.shared.count_refusal(refused);
                return self.send_packet(from, &packet, checksummed(p));
            }
            BindDecision::Admit(a) => a,
        };
        let config = &self.shared.config;
        let granted = crate::client::random_bytes().ok().map(u128::from_le_bytes).and_then(|token| {
            self.shared.table.grant(
                from,
                admission.request.nonce,
                self.shared.exports[admission.export].clone(),
                token,
                config.slots_per_binding,
                admission.max_datagram as usize,
                config.binding_memory,
                self.now_ms(),
            )
        });
        let Some((binding, new)) = granted else {
            stats.rejected.fetch_add(1, Ordering::Relaxed);
            return self.send_packet(from, &admission.busy(&machine), checksummed(p));
        };
        if new {
            stats.bindings.fetch_add(1, Ordering::Relaxed);
        }
        let reply = admission.grant(&machine, binding.id, binding.token, config.slots_per_binding, 0);
        self.send_packet(from, &reply, checksummed(p));
    }

    fn send_packet(&self, to: SocketAddr, packet: &[u8], checksum: bool) {
        // A failed send is a lost packet: the client retransmits its request.
        let _ = transmit::send(&self.shared.socket, Some(&to), &[IoSlice::new(packet)], checksum);
    }
}

fn result_header(
    binding: &ServerBinding,
    p: &Packet<&[u8]>,
    status: Status,
    index: u16,
    count: u16,
    payload_len: usize,
    message_len: usize,
) -> Header {
    Header {
        kind: Kind::Result,
        flags: p.flags() & flags::CHECKSUM,
        status,
        procedure: p.procedure(),
        binding: binding.id,
        slot: p.slot(),
        seq: p.seq(),
        frag_index: index,
        frag_count: count,
        payload_len: payload_len as u32,
        message_len: message_len as u32,
        // Only packets of the running incarnation reach a binding, so the packet's incarnation is ours.
        incarnation: p.incarnation(),
        token: binding.token,
    }
}

/// Runs `procedure` of `export` with marshaled `args`, appending its marshaled results (or, on
/// failure, an error message) to `out` after its first `start` bytes. Catches a panic.
pub(crate) fn run_procedure(
    export: &dyn Export,
    procedure: u16,
    args: &[u8],
    out: &mut Vec<u8>,
    start: usize,
    limit: usize,
    stats: &super::ServerStats,
) -> Status {
    let outcome = catch_unwind(AssertUnwindSafe(|| export.dispatch(procedure, args, &mut Results::new(out, limit))));
    mark(Point::ResultsEncoded);
    match outcome {
        Ok(Ok(())) => Status::Ok,
        Ok(Err(DispatchError::UnknownProcedure)) => {
            out.truncate(start);
            Status::UnknownProcedure
        }
        Ok(Err(DispatchError::BadArguments(e))) => {
            out.truncate(start);
            error_message(out, &e.to_string());
            Status::BadArguments
        }
        Err(panic) => {
            stats.panics.fetch_add(1, Ordering::Relaxed);
            out.truncate(start);
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic with a non-string payload".into());
            error_message(out, &msg);
            Status::Panicked
        }
    }
}

pub(crate) fn error_message(out: &mut Vec<u8>, message: &str) {
    let mut end = message.len().min(MAX_ERROR_MESSAGE);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&message.as_bytes()[..end]);
}
