//! The simulation's clients: the shipped `ClientCall` driven by the datagrams that reach it and
//! by its timers, starting, cancelling and abandoning calls.

use super::*;

impl Scenario {
    pub(super) fn client_flush(&mut self, k: usize) {
        while let Some(t) = self.clients[k].call.poll_transmit() {
            let c = &self.clients[k];
            let mut h = Header {
                binding: 1,
                token: TOKEN,
                incarnation: 1,
                slot: k as u32,
                seq: c.seq,
                ..Header::new(Kind::Call)
            };
            let bytes = match t {
                Transmit::CallFragment { index, please_ack } => {
                    let count = tiercel_proto::fragment::fragment_count(c.message.len(), self.frag).unwrap();
                    h.frag_index = index;
                    h.frag_count = count;
                    h.message_len = c.message.len() as u32;
                    h.flags = if please_ack { flags::PLEASE_ACK } else { 0 };
                    Self::packet(h, &c.message[fragment_range(index, c.message.len(), self.frag)])
                }
                Transmit::Probe => {
                    h.kind = Kind::Probe;
                    Self::packet(h, &[])
                }
                Transmit::Ack { ack, resend } => {
                    h.kind = Kind::Ack;
                    h.flags = if resend { flags::RESEND } else { 0 };
                    Self::packet(h, &ack.to_bytes())
                }
                Transmit::AddressProof { challenge } => {
                    h.kind = Kind::Probe;
                    h.flags = flags::ADDRESS_PROOF;
                    Self::packet(h, &challenge)
                }
            };
            self.send(Dest::Server, bytes);
        }
    }

    /// Tells the server that client `k` gives up its current call (best effort, like any packet).
    pub(super) fn client_cancel(&mut self, k: usize) {
        let h = Header {
            binding: 1,
            token: TOKEN,
            incarnation: 1,
            slot: k as u32,
            seq: self.clients[k].seq,
            ..Header::new(Kind::Cancel)
        };
        self.send(Dest::Server, Self::packet(h, &[]));
    }

    /// Client `k` gives up call `seq`, if it still waits for it, and goes on to its next call.
    pub(super) fn client_abandon(&mut self, k: usize, seq: u32) {
        let c = &self.clients[k];
        if c.done || c.seq != seq || c.call.outcome().is_some() {
            return;
        }
        self.client_cancel(k);
        let c = &mut self.clients[k];
        c.abandoned += 1;
        if c.remaining == 0 {
            c.done = true;
        } else {
            self.client_start(k);
        }
    }

    pub(super) fn client_start(&mut self, k: usize) {
        let big = self.rng.random_bool(0.3);
        let max = if big { self.largest } else { self.frag };
        let arg_len = self.rng.random_range(4..=max.max(4));
        let res_len = self.rng.random_range(0..=max) as u32;
        let mut m = vec![0u8; arg_len];
        self.rng.fill(&mut m[..]);
        m[..4].copy_from_slice(&res_len.to_le_bytes());
        let now = self.at(self.now);
        let c = &mut self.clients[k];
        c.seq = c.seq.wrapping_add(1);
        c.remaining -= 1;
        c.expected = result_for(&m);
        c.message = m;
        let (seq, len) = (c.seq, c.message.len());
        let deadline = self.deadlines.map(|(lo, hi)| self.now + self.rng.random_range(lo..=hi));
        let deadline = deadline.map(|d| self.at(d));
        self.clients[k].call.start(seq, len, now, deadline);
        if self.rng.random_bool(self.abandon) {
            let at = self.now + self.rng.random_range(0..50_000_000u64);
            self.push(at, Event::Abandon { slot: k, seq });
        }
        self.client_flush(k);
    }

    pub(super) fn client_receive(&mut self, k: usize, bytes: Vec<u8>) {
        if self.clients[k].done {
            return;
        }
        let id = self.server.binding.id;
        let bytes = match self.client_seal.as_mut() {
            Some(seal) => match seal.open(id, &bytes) {
                Some(packet) => packet,
                None => {
                    self.unopened += 1;
                    return;
                }
            },
            None => bytes,
        };
        let now = self.at(self.now);
        // Odd clients read the payload of the result fragment they expect next straight into its
        // place, as the UDP endpoint does: anything else (another fragment, another kind, a
        // corrupted packet) goes the usual way, after its payload was written into the place.
        if k % 2 == 1 {
            if let Some(handled) = self.receive_in_place(k, &bytes, now) {
                if handled == Handled::Complete {
                    self.complete_call(k, None);
                }
                self.client_flush(k);
                return;
            }
        }
        // A corrupted packet fails its checksum (or its header check) and is dropped.
        let Ok(p) = Packet::new_checked(&bytes[..]) else { return };
        let handled = self.clients[k].call.handle_packet(&p, now);
        if handled == Handled::Complete {
            self.complete_call(k, Some(p.payload()));
        }
        self.client_flush(k);
    }

    /// Delivers `bytes` to client `k` as a scattered receive would: header apart, payload into the
    /// place the reassembly gives, trailer after. `Some` when it was the fragment expected there.
    pub(super) fn receive_in_place(&mut self, k: usize, bytes: &[u8], now: Instant) -> Option<Handled> {
        let call = &mut self.clients[k].call;
        let (index, place) = call.landing(1)?;
        let want = place.len();
        let n = bytes.len().saturating_sub(HEADER_LEN).min(want);
        place[..n].copy_from_slice(&bytes[HEADER_LEN.min(bytes.len())..][..n]);
        if bytes.len() < HEADER_LEN + want {
            return None;
        }
        let p = Packet::new_unchecked(&bytes[..HEADER_LEN]);
        if p.kind() != Kind::Result || p.frag_index() != index || p.payload_len() as usize != want {
            return None;
        }
        let (_, place) = call.landing(1)?;
        p.check_split(place, &bytes[HEADER_LEN + want..]).ok()?;
        self.landed += 1;
        Some(self.clients[k].call.handle_landed(&p, now))
    }

    /// Checks the outcome of client `k`'s call that just completed (`single`: the payload of a
    /// one-packet result) and moves on.
    pub(super) fn complete_call(&mut self, k: usize, single: Option<&[u8]>) {
        let c = &mut self.clients[k];
        let outcome = c.call.outcome().expect("complete has an outcome");
        let r = match outcome {
            Outcome::Result { status: Status::Ok, reassembled } => {
                let got = if reassembled {
                    c.call.take_message().expect("reassembled")
                } else {
                    single.expect("a one-packet result arrives whole").to_vec()
                };
                assert_eq!(got, c.expected, "wrong result for call {} of slot {k}", c.seq);
                Ok(())
            }
            Outcome::Result { status, .. } => panic!("unexpected status {status:?}"),
            Outcome::Failed(f) => Err(f),
        };
        self.finish_call(k, r);
    }

    pub(super) fn finish_call(&mut self, k: usize, r: Result<(), Failure>) {
        let failed = r.is_err();
        let now = self.now;
        self.clients[k].outcomes.push((now, r));
        if self.clients[k].remaining == 0 || (failed && self.crash_at.is_some()) {
            self.clients[k].done = true;
        } else {
            self.client_start(k);
        }
    }

    pub(super) fn client_timeout(&mut self, k: usize) {
        let now = self.at(self.now);
        self.clients[k].call.handle_timeout(now);
        if let Some(Outcome::Failed(f)) = self.clients[k].call.outcome() {
            if f == Failure::DeadlineExceeded {
                // As the client does: the server may drop what it holds of the call.
                self.client_cancel(k);
            }
            self.finish_call(k, Err(f));
        }
        self.client_flush(k);
    }
}
