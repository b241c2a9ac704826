//! Reading a bound connection: the thread whose turn it is reads frames until a call to run comes,
//! answering probes, cancels and refusals itself. What the bytes ask for is the endpoint's decision
//! (`ServerEndpoint::read_frame`, which the stream simulation drives too): this file moves the
//! bytes, spins and waits, and runs the calls.

use std::io::IoSlice;
use std::sync::atomic::Ordering;
use std::time::Instant;

use tiercel_proto::endpoint::Arrived;
use tiercel_proto::stream::{self, Deframer, Next};
use tiercel_proto::wire::{Header, Kind, Status, HEADER_LEN};

use super::super::dispatch::Arrival;
use super::super::outbox::MAX_HOLD;
use super::binding::*;
use super::*;
use crate::framed;
use crate::retention::Retention;

impl StreamBinding {
    /// Reads the connection until a call to run comes (`None`: the connection is over, or this
    /// extra thread has had nothing to do for [`HELPER_IDLE`]). Everything else that comes is
    /// handled here: probes, cancels, refusals, async procedures (started on the runtime), and
    /// calls too large to copy, run by this thread where they landed.
    pub(super) fn take(&self, own: &mut Own, first: bool) -> Option<Taken> {
        let waiting_since = Instant::now();
        let mut r = {
            let mut slot = self.reader.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if self.closed.load(Ordering::Acquire) || self.shared.stop.load(Ordering::Relaxed) {
                    return None;
                }
                if let Some(r) = slot.take() {
                    break r;
                }
                // An extra thread goes when it has had nothing to do for a while, or when other
                // connections wait for a thread.
                if !first && (waiting_since.elapsed() >= HELPER_IDLE || self.parking.pool.pressed()) {
                    return None;
                }
                if own.retention.holds_large() && own.retention.idle(Instant::now()) {
                    own.shrink();
                }
                self.waiting.fetch_add(1, Ordering::AcqRel);
                let period = if first { POLL } else { HELPER_LOOK };
                slot = match self.turn.wait_timeout(slot, period) {
                    Ok((slot, _)) => slot,
                    Err(p) => p.into_inner().0,
                };
                self.waiting.fetch_sub(1, Ordering::AcqRel);
            }
        };
        let taken = self.read_call(&mut r, own, first, waiting_since);
        *self.reader.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        if self.waiting.load(Ordering::Acquire) > 0 {
            self.turn.notify_one();
        }
        taken
    }

    /// Reads the connection, holding its reading side, until a call to run comes (see
    /// [`StreamBinding::take`]).
    pub(super) fn read_call(
        &self,
        r: &mut Reader,
        own: &mut Own,
        first: bool,
        waiting_since: Instant,
    ) -> Option<Taken> {
        let spin = self.shared.config.spin;
        // A secure binding's record buffer, charged with the frames' (`framed::Records`).
        let records = if self.conn.seal.is_some() { framed::RECORDS_BUFFER } else { 0 };
        if r.charge.charged() == 0 {
            if r.charge.settle(BUFFER + records) {
                // Back from the parking: the buffer again (without room for it, the frames grow
                // from nothing, charged as they arrive).
                r.frames = Deframer::new(BUFFER, stream::max_frame(self.shared.config.timing.max_message));
            } else if !r.charge.settle(records) {
                // Not even room for the records a secure binding cannot read without.
                self.shared.stats.busy.fetch_add(1, Ordering::Relaxed);
                self.close();
                return None;
            }
        }
        if records > 0 && r.records.is_none() {
            r.records = Some(framed::Records::new());
        }
        let stats = &self.shared.stats;
        let mut now = Instant::now();
        // This thread's last wait ended in its read with nothing come: it waits in `poll` until a
        // frame comes.
        let mut waited_in_receive = false;
        // Results held in `own.out` for the others of a run of calls read together
        // ([`StreamBinding::runs_here`]), and when the first of them began.
        let (mut held, mut held_since) = (0usize, now);
        loop {
            if self.closed.load(Ordering::Acquire) || self.shared.stop.load(Ordering::Relaxed) {
                if held > 0 {
                    self.send_held(own, &mut held);
                }
                return None;
            }
            // What the bytes ask for, decided by the endpoint: the frame's buffer grown (charged
            // first) as a large frame arrives, or refused `Busy` from its header without room.
            let Reader { frames, charge, retention, activity, .. } = r;
            let grow = |to| {
                let room = charge.settle(to + records);
                if room {
                    retention.large(now);
                }
                room
            };
            let arrived = self.shared.endpoint.read_frame(frames, &self.binding, activity, now, grow);
            if !matches!(arrived, Arrived::More) {
                waited_in_receive = false;
                r.last_frame = now;
                r.spin_until = if r.lease.take() { now + spin } else { now };
            }
            match arrived {
                Arrived::More => {}
                Arrived::Call { slot, seq, procedure, context } => {
                    let arrival = Arrival::of(&self.binding, "tcp", context, Some(now), None);
                    let behind = r.frames.whole_behind();
                    let call = Taken { slot, seq, procedure, arrival, timed: behind };
                    if (behind || held > 0) && self.runs_here(&r.frames, own, procedure) {
                        if held == 0 {
                            // (The buffer may still hold the last result this thread sent.)
                            own.out.clear();
                            held_since = Instant::now();
                        }
                        let done = self.run_held(&r.frames, own, &call);
                        held += 1;
                        r.frames.consume();
                        // The run is over (no whole frame behind), or the results held have
                        // waited long enough, or the procedure turned slow: they go.
                        let over = !matches!(r.frames.next(), Ok(Next::Frame(_)));
                        let due = over
                            || own.out.len() >= OUT
                            || done.saturating_duration_since(held_since) >= MAX_HOLD
                            || !own.quick.is_quick(self.export_key(), procedure);
                        if due && !self.send_held(own, &mut held) {
                            self.close();
                            return None;
                        }
                        continue;
                    }
                    if held > 0 && !self.send_held(own, &mut held) {
                        self.close();
                        return None;
                    }
                    match self.on_call(r, own, call) {
                        Handled::Next => {
                            r.frames.consume();
                            continue;
                        }
                        Handled::Take(call) => {
                            r.frames.consume();
                            return Some(call);
                        }
                        Handled::Over => {
                            self.close();
                            return None;
                        }
                    }
                }
                Arrived::Answer(h) => {
                    match (h.kind, h.status) {
                        (Kind::Reject, _) => stats.rejected.fetch_add(1, Ordering::Relaxed),
                        (_, Status::Busy) => stats.busy.fetch_add(1, Ordering::Relaxed),
                        (_, Status::TooLarge) => stats.too_large.fetch_add(1, Ordering::Relaxed),
                        _ => 0,
                    };
                    if self.send_header(&h).is_err() {
                        self.close();
                        return None;
                    }
                    continue;
                }
                Arrived::Cancel { slot, seq } => {
                    stats.cancelled.fetch_add(1, Ordering::Relaxed);
                    // A plain procedure runs to its end; an async one stops.
                    #[cfg(feature = "async")]
                    if let Some(runner) = &self.shared.asynch {
                        runner.cancel((self.id | 1 << 31, slot, seq));
                    }
                    #[cfg(not(feature = "async"))]
                    let _ = (slot, seq);
                    continue;
                }
                Arrived::Close => {
                    stats.malformed.fetch_add(1, Ordering::Relaxed);
                    self.close();
                    return None;
                }
            }
            if held > 0 && !self.send_held(own, &mut held) {
                self.close();
                return None;
            }
            let received = match (&self.conn.seal, &mut r.records) {
                _ if std::mem::take(&mut r.drained) && now >= r.spin_until => Ok(false),
                (Some(session), Some(sealed)) => sealed.receive(&self.conn.stream, session, &mut r.frames),
                _ => framed::receive_up_to(&self.conn.stream, &mut r.frames, usize::MAX).map(|got| {
                    r.drained = got == framed::Got::Drained;
                    got != framed::Got::Nothing
                }),
            };
            now = Instant::now();
            match received {
                Ok(true) => continue,
                Ok(false) => {}
                Err(e) => {
                    if e.kind() == std::io::ErrorKind::InvalidData {
                        // Changed, forged or replayed: nothing after it on the stream is believed.
                        stats.unopened.fetch_add(1, Ordering::Relaxed);
                    }
                    self.close();
                    return None;
                }
            }
            if now < r.spin_until {
                core::hint::spin_loop();
                continue;
            }
            // Done spinning: another thread may.
            r.lease.give_back();
            // A binding the endpoint forgot as idle goes as an idle UDP binding does (its client
            // finds the connection closed, and binds again).
            if self.binding.is_expired() {
                self.close();
                return None;
            }
            let quiet = now.saturating_duration_since(r.last_frame);
            // Other connections wait for a thread of the pool: this one gives its thread up if it
            // has nothing to do but wait for its client.
            let pressed = self.parking.pool.pressed();
            if !first && (pressed || now.saturating_duration_since(waiting_since) >= HELPER_IDLE) {
                return None;
            }
            let alone = self.threads.load(Ordering::Acquire) == 1 && self.binding.running() == 0;
            let empty = r.frames.buffered() == 0 && !r.records.as_ref().is_some_and(framed::Records::holds);
            if first && alone && (pressed || quiet >= PARK_AFTER && empty) {
                // Parked with a partial frame (when pressed), the buffer stays, charged, for the
                // rest of it.
                if empty {
                    r.records = None;
                    r.frames = Deframer::new(0, stream::max_frame(self.shared.config.timing.max_message));
                    r.charge.settle(0);
                    r.retention = Retention::default();
                }
                // Back from the parking, the connection is read at once (it was readable).
                r.drained = false;
                self.parked.store(true, Ordering::Release);
                return None;
            }
            if r.retention.holds_large() && r.retention.idle(now) {
                r.frames.shrink();
                r.charge.settle(BUFFER + records);
            }
            if own.retention.holds_large() && own.retention.idle(now) {
                own.shrink();
            }
            if first && !pressed && self.conn.receive_wait && !waited_in_receive {
                // The connection's first thread waits for its client's next call in the read
                // itself: one system call where `poll` and a read took two. While it waits there,
                // a connection waiting for a thread of the pool, or the server stopping, waits for
                // the read to end, at most `RECEIVE_WAIT`; after a wait that ends with nothing,
                // the thread waits in `poll`, which either ends, until a frame comes.
                match framed::receive_wait(&self.conn.stream, &mut r.frames) {
                    Ok(got) => {
                        waited_in_receive = got == framed::Got::Nothing;
                        r.drained = got == framed::Got::Drained;
                    }
                    Err(_) => {
                        self.close();
                        return None;
                    }
                }
                now = Instant::now();
                continue;
            }
            // While nobody waits for a thread, the wait also ends when someone starts to.
            let waited = if pressed {
                tiercel_sys::udp::wait_readable_fd(&self.conn.stream, Some(HELPER_LOOK))
            } else {
                let conn = std::os::fd::AsFd::as_fd(&self.conn.stream);
                tiercel_sys::udp::wait_either_readable(conn, self.parking.pool.pressure(), Some(POLL))
            };
            if waited.is_err() {
                self.close();
                return None;
            }
        }
    }

    /// Whether the call of `procedure`, whole at the front of `frames` with calls behind it (or
    /// after others run here), runs here where it landed, its result held for theirs, one write
    /// for them all (Lampson's t = 1 + s/b, as a UDP worker's batch): it is small, not async, and
    /// this thread has seen its procedure run within `QUICK_RUN` when calls queued. Else it goes as
    /// a lone call does: its arguments are copied out, and the connection may be read by another
    /// thread while it runs (a procedure not known to be quick may be slow: the calls behind it do
    /// not wait for it when the connection has other threads, nor results already run for it).
    pub(super) fn runs_here(&self, frames: &Deframer, own: &Own, procedure: u16) -> bool {
        #[cfg(feature = "async")]
        if self.export.is_async(procedure) {
            return false;
        }
        frames.frame().len() <= HEADER_LEN + SMALL_CALL && own.quick.is_quick(self.export_key(), procedure)
    }

    /// Sends a frame without payload (a refusal, a probe's answer).
    pub(super) fn answer(
        &self,
        kind: Kind,
        status: Status,
        slot: u32,
        seq: u32,
        procedure: u16,
    ) -> std::io::Result<()> {
        self.send_header(&self.shared.endpoint.stream_answer(&self.binding, kind, status, (slot, seq, procedure)))
    }

    /// Sends `h` as a frame of its own.
    pub(super) fn send_header(&self, h: &Header) -> std::io::Result<()> {
        let prefix = stream::prefix(HEADER_LEN);
        self.conn.send(&mut [IoSlice::new(&prefix), IoSlice::new(&h.to_bytes())])
    }

    /// Handles `call`, admitted by the endpoint, whole at the front of the buffer: an async
    /// procedure is started on the runtime, a small call's arguments are copied out for this
    /// thread to run ([`Handled::Take`]), a large one is run where it landed.
    pub(super) fn on_call(&self, r: &mut Reader, own: &mut Own, call: Taken) -> Handled {
        let stats = &self.shared.stats;
        let ok = |sent: std::io::Result<()>| if sent.is_ok() { Handled::Next } else { Handled::Over };
        let (slot, seq, procedure) = (call.slot, call.seq, call.procedure);
        let args = r.frames.frame().get(HEADER_LEN..).unwrap_or_default();
        // Whether the procedure is async is looked at first: starting one clones the connection and
        // the binding and counts the call begun, which a plain call must not pay for (with the
        // `async` feature compiled in, that made a TCP Null 45 ns slower with the server in a process
        // of its own, 113 ns in the ledger's one process).
        #[cfg(feature = "async")]
        if self.export.is_async(procedure) {
            own.out.clear();
            own.out.resize(FRAME_HEAD, 0);
            if let Some(started) = self.start_async(args, &call, &mut own.out) {
                return match started {
                    Ok(()) => Handled::Next,
                    Err(status) => {
                        if self.send_result(&mut own.out, slot, seq, procedure, status) {
                            Handled::Next
                        } else {
                            Handled::Over
                        }
                    }
                };
            }
        }
        if args.len() <= SMALL_CALL {
            // The copy is charged before it is made.
            if !own.charge.settle(args.len().max(own.args.capacity()) + own.out.capacity()) {
                stats.busy.fetch_add(1, Ordering::Relaxed);
                return ok(self.answer(Kind::Result, Status::Busy, slot, seq, procedure));
            }
            own.args.clear();
            tiercel_proto::copy::extend(&mut own.args, args);
            return Handled::Take(call);
        }
        // Too large to copy: run here, borrowed where it landed, the connection unread meanwhile.
        // A procedure that runs on its `InOut` buffer where it lies has it sent back from there.
        self.busy();
        let in_place = self.export.in_place(procedure);
        let sent = match in_place.then(|| r.frames.consume_in_place(|frame| self.run_in_place(frame, own, &call))) {
            Some(Some(sent)) => sent,
            _ => {
                let args = r.frames.frame().get(HEADER_LEN..).unwrap_or_default();
                let status = self.run_with(args, &mut own.out, &own.calls, &call);
                self.send_result(&mut own.out, slot, seq, procedure, status)
            }
        };
        own.settle();
        self.idle.fetch_add(1, Ordering::AcqRel);
        if sent {
            Handled::Next
        } else {
            Handled::Over
        }
    }
}

/// What became of a frame.
pub(super) enum Handled {
    /// Dealt with: the next.
    Next,
    /// A call for the reading thread to run.
    Take(Taken),
    /// The connection is over.
    Over,
}
