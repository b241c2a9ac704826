//! Secure bindings over UDP: sealed datagrams opened before they are routed, and the handshake
//! that makes a secure binding (`crate::secure`).

use tiercel_proto::seal::{Outer, SealType, OUTER_LEN};

use super::super::secure::Hello;
use super::*;
use crate::secure::Responder;

impl UdpWorker {
    /// A sealed datagram: a packet of a secure binding, opened with its keys and then handled as
    /// any packet (its answers sealed too), or a handshake's first message. Anything that does not
    /// open is dropped and counted; a sender that has proven nothing is sent nothing.
    pub(super) fn on_sealed(&self, bytes: &[u8], from: SocketAddr) {
        let stats = &self.shared.stats;
        let outer = match Outer::parse(bytes) {
            Ok(o) => o,
            Err(_) => {
                stats.unopened.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        match outer.kind {
            SealType::Data => {}
            SealType::Hello => return self.on_hello(bytes, from),
            SealType::Welcome => {
                stats.unopened.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        let Some(session) = self.shared.sessions.get(outer.index) else {
            stats.unopened.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let mut buf = self.opened.borrow_mut();
        buf.clear();
        tiercel_proto::copy::extend(&mut buf, bytes);
        match session.open_in_place(&mut buf) {
            Ok(len) => {
                crate::steps::mark(crate::steps::Point::Opened);
                self.handle_opened(&buf[OUTER_LEN..OUTER_LEN + len], from, Some(&session))
            }
            Err(_) => {
                stats.unopened.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Tells the sender of a handshake this server cannot read (it expects another key or
    /// secret, or the server has no key) so, in a datagram smaller than the handshake's, which
    /// proves nothing: its client fails the bind soon (`BindError::KeyNotProven`) rather than wait
    /// for a dead server. Within the handshake budget.
    pub(super) fn unreadable(&self, from: SocketAddr) {
        let outer = Outer { kind: SealType::Welcome, index: 0, counter: 0 }.to_bytes();
        let datagram = [&outer[..], &[0u8; tiercel_proto::seal::TAG_LEN]].concat();
        self.send_packet(from, &datagram, false);
    }

    /// A handshake's first message: read with the server's key and secret, its bind request
    /// answered through the bind machine inside the handshake's answer. A binding it grants is a
    /// secure one: its keys are kept with its id, and the answer with them, so that a retransmitted
    /// `Hello` (the same request) gets the same answer and the same binding. Handshakes beyond
    /// `handshakes_per_second`, and those that do not open, are dropped unanswered.
    fn on_hello(&self, bytes: &[u8], from: SocketAddr) {
        let shared = &self.shared;
        let stats = &shared.stats;
        let hello = {
            let mut buf = self.opened.borrow_mut();
            shared.hello(bytes, from, super::super::Door::Sealed, &mut buf)
        };
        let (responder, admission, machine) = match hello {
            Hello::Dropped => return,
            Hello::Unreadable => return self.unreadable(from),
            Hello::Answered(answer) => return self.send_packet(from, &answer, false),
            Hello::Admitted(responder, admission, machine) => (*responder, admission, machine),
        };
        let client = responder.client();
        // An answer without a binding: sealed in the handshake, no keys kept.
        let welcome = |responder: Responder, answer: &[u8]| {
            if let Some((datagram, _)) = responder.welcome(answer) {
                self.send_packet(from, &datagram, false);
            }
        };
        if let Some((rendezvous, _)) = shared.rendezvous.as_ref().filter(|_| admission.request.rendezvous) {
            // As a plain request's: only a source on this host is told where to bind through
            // shared memory; the answer is sealed, so the client knows it is this server's.
            if self.on_this_host(from) {
                return welcome(responder, &admission.rendezvous(&machine, *rendezvous));
            }
        }
        let caller = tiercel_proto::endpoint::Caller::Key { address: from, key: client.0 };
        let granted = crate::random::bytes().ok().map(u128::from_le_bytes).and_then(|token| {
            let export = shared.exports[admission.export].clone();
            let terms = Terms { max_datagram: admission.max_datagram as usize, features: admission.features() };
            shared.endpoint.grant_from(from, caller, admission.request.nonce, export, token, terms, Instant::now())
        });
        let Some((binding, new)) = granted else {
            stats.rejected.fetch_add(1, Ordering::Relaxed);
            return welcome(responder, &admission.busy(&machine));
        };
        if !new {
            // A retransmitted `Hello`: the answer that made the binding, again (its keys are the
            // ones the client will take). One from another client key gets nothing.
            if binding.caller == Some(caller) {
                if let Some(answer) = shared.sessions.welcome(binding.id, binding.token) {
                    self.send_packet(from, &answer, false);
                }
            }
            return;
        }
        let reply = admission.grant(&machine, binding.id, binding.token, shared.config.slots_per_binding, 0);
        let Some((datagram, keys)) = responder.welcome(&reply) else {
            stats.handshakes_dropped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let session = Arc::new(keys.session(binding.id));
        shared.sessions.insert(binding.id, binding.token, session, datagram.clone().into());
        stats.bindings.fetch_add(1, Ordering::Relaxed);
        stats.handshakes.fetch_add(1, Ordering::Relaxed);
        self.send_packet(from, &datagram, false);
    }
}
