//! The simulation's server side: each datagram routed and dispatched by the shipped endpoint
//! (`route`, `call_step`, `control_step`), as the UDP server does, and its procedures run.

use super::*;

impl Scenario {
    /// Sends the result fragments the slot has queued.
    pub(super) fn server_flush(&mut self, slot: usize) {
        let binding = self.server.binding.clone();
        let mut out = Vec::new();
        if let Some(mut cell) = binding.slot(slot as u32) {
            while let Some(f) = cell.poll_transmit(&binding) {
                out.push(match f {
                    Fragment::Whole(b) => b.to_vec(),
                    Fragment::Parts(h, body) => [&h[..], body].concat(),
                });
            }
        }
        for bytes in out {
            self.send(Dest::Client(slot), bytes);
        }
    }

    pub(super) fn server_receive(&mut self, bytes: Vec<u8>, log: &mut Log) {
        if !self.server.alive {
            return;
        }
        // A secure binding's packets are opened first, as the UDP worker opens them, and routed
        // as opened with the binding's keys.
        let id = self.server.binding.id;
        let (bytes, opened) = match self.server.seal.as_mut() {
            Some(seal) => match seal.open(id, &bytes) {
                Some(packet) => (packet, Some(id)),
                None => {
                    self.unopened += 1;
                    return;
                }
            },
            None => (bytes, None),
        };
        if self.server_receive_in_place(&bytes, log) {
            return;
        }
        // A corrupted packet fails its checksum (or its header check) and is dropped.
        let Ok(p) = Packet::new_checked(&bytes[..]) else { return };
        let slot = p.slot() as usize;
        let now = self.at(self.now);
        let binding = match self.server.endpoint.route_opened(&p, opened, now) {
            Route::Binding(b) => b,
            Route::Reject(h) => return self.send(Dest::Client(slot), Self::packet(h, &[])),
            Route::Bind | Route::Malformed => panic!("the sim's clients send only calls, acks and probes"),
        };
        // Each slot's client sends from its own address (a thread's socket), and proves it on its
        // first packet.
        let entered = self.server.endpoint.enter(&binding, &p, slot, now);
        let mut cell = match entered {
            Ok(cell) => cell,
            Err(Refusal::Reject(h)) => {
                self.busy += u64::from(h.status == Status::Busy);
                return self.send(Dest::Client(slot), Self::packet(h, &[]));
            }
            Err(Refusal::Challenge(h, challenge)) => {
                self.challenges += 1;
                return self.send(Dest::Client(slot), Self::packet(h, &challenge));
            }
        };
        // The shipped dispatch: what the slot's answer asks the transport to do.
        let step = match p.kind() {
            Kind::Call => {
                let action = cell.on_call(&binding, &p, now, &self.timing);
                self.server.endpoint.call_step(&binding, &mut cell, &p, action)
            }
            _ => self.server.endpoint.control_step(&binding, &mut cell, &p, now).0,
        };
        let (reply, run) = self.server_step(&binding, step, p.payload());
        if p.kind() == Kind::Call && slot % 2 == 1 && p.frag_count() > 1 && cell.proto.is_receiving() {
            self.server.expected = Some((p.slot(), p.seq()));
        }
        drop(cell);
        if let Some(r) = reply {
            self.send(Dest::Client(slot), r);
        }
        if let Some(args) = run {
            self.execute(slot, p.seq(), bytes, args, log);
        }
        self.server_flush(slot);
    }

    /// Does what the endpoint's dispatch decided, as the UDP server does: the packet to send the
    /// slot's client, if any, and the arguments of a call to run. (What the slot queued goes out
    /// with `server_flush` after every packet.)
    pub(super) fn server_step(
        &mut self,
        binding: &Binding<usize, ()>,
        step: Step,
        payload: &[u8],
    ) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
        match step {
            Step::Run => (None, Some(payload.to_vec())),
            Step::RunMessage(m) => {
                binding.release(m.len());
                (None, Some(m))
            }
            Step::Reply(r) => {
                self.busy += u64::from(r.header.kind == Kind::Reject && r.header.status == Status::Busy);
                (Some(Self::packet(r.header, r.payload())), None)
            }
            Step::Flush { .. } | Step::Quiet(_) => (None, None),
        }
    }

    /// Receives `bytes` as a UDP worker expecting the next fragment of a call does: the payload
    /// written into the place the reassembly gives, whatever the datagram is, then handled there
    /// if it was that fragment, from that call's client. True when it was (and was handled);
    /// anything else goes the usual way.
    pub(super) fn server_receive_in_place(&mut self, bytes: &[u8], log: &mut Log) -> bool {
        let Some((slot, seq)) = self.server.expected else { return false };
        let (binding, now) = (self.server.binding.clone(), self.at(self.now));
        let Some(mut cell) = binding.slot(slot) else { return false };
        let call = cell.call_at(slot).filter(|c| c.seq == seq);
        let Some((index, place)) = call.and_then(|_| cell.landing(&binding, seq, 1, 0)) else {
            self.server.expected = None;
            return false;
        };
        let want = place.len();
        let n = bytes.len().saturating_sub(HEADER_LEN).min(want);
        place[..n].copy_from_slice(&bytes[HEADER_LEN.min(bytes.len())..][..n]);
        if bytes.len() < HEADER_LEN + want {
            return false;
        }
        let p = Packet::new_unchecked(&bytes[..HEADER_LEN]);
        let Some((_, place)) = cell.landing(&binding, seq, 1, 0) else { return false };
        let fits = p.frag_index() == index
            && p.check_split(place, &bytes[HEADER_LEN + want..]).is_ok()
            && call.is_some_and(|c| self.server.endpoint.continues(&binding, c, &p, p.slot() as usize, now));
        if !fits {
            return false;
        }
        self.server_landed += 1;
        let action = cell.on_landed(&binding, &p, now);
        assert!(
            matches!(action, CallAction::Ack(_) | CallAction::ExecuteMessage(_) | CallAction::Drop(_)),
            "a fragment that continues a call drew {action:?}"
        );
        if matches!(action, CallAction::ExecuteMessage(_)) {
            self.server.expected = None;
        }
        let step = self.server.endpoint.call_step(&binding, &mut cell, &p, action);
        let (reply, run) = self.server_step(&binding, step, p.payload());
        drop(cell);
        if let Some(r) = reply {
            self.send(Dest::Client(slot as usize), r);
        }
        if let Some(args) = run {
            self.execute(slot as usize, seq, bytes.to_vec(), args, log);
        }
        self.server_flush(slot as usize);
        true
    }

    /// Runs call `seq` of `slot` (started by `packet`) for a random service time.
    pub(super) fn execute(&mut self, slot: usize, seq: u32, packet: Vec<u8>, args: Vec<u8>, log: &mut Log) {
        let n = log.executions.entry((slot, seq)).or_default();
        *n += 1;
        assert_eq!(*n, 1, "call {seq} of slot {slot} ran twice");
        let incarnation = self.server.endpoint.incarnation();
        *log.by_incarnation.entry(incarnation).or_default() += 1;
        let binding = self.server.binding.clone();
        self.server.endpoint.run_started(&binding);
        self.server.running[slot] = Some((packet, args));
        let (lo, hi) = self.server.service;
        let d = self.rng.random_range(lo..=hi);
        self.push(self.now + d, Event::Complete { incarnation, slot, seq });
    }

    pub(super) fn complete(&mut self, incarnation: u64, slot: usize, seq: u32) {
        if !self.server.alive || incarnation != self.server.endpoint.incarnation() {
            return;
        }
        let Some((packet, args)) = self.server.running[slot].take() else { return };
        let p = Packet::new_checked(&packet[..]).expect("it was checked when it arrived");
        assert_eq!(p.seq(), seq);
        let binding = self.server.binding.clone();
        self.server.endpoint.run_finished(&binding);
        let timing = self.timing;
        // Odd slots' results are left behind other bytes of their buffer, as a procedure run in
        // place of its arguments leaves them: fewer than a header's or more.
        let offset = (slot % 2 == 1).then(|| self.rng.random_range(0..=2 * HEADER_LEN));
        if let Some(mut cell) = binding.slot(slot as u32) {
            let result = result_for(&args);
            if let Some(offset) = offset {
                if result.len() > binding.frag_payload() {
                    self.in_place += 1;
                }
                let buf = [vec![0xee; offset], result].concat();
                assert_eq!(cell.complete_in_place(&binding, &p, Status::Ok, buf, offset, &timing), Status::Ok);
            } else {
                let mut out = cell.take_result(&binding);
                out.resize(HEADER_LEN, 0);
                out.extend_from_slice(&result);
                assert_eq!(cell.complete(&binding, &p, Status::Ok, out, &timing), Status::Ok);
            }
        }
        self.server_flush(slot);
    }
}
