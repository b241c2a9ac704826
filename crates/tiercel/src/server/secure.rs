//! The server's secure bindings: each one's keys, by binding id, and the budget of handshakes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use std::sync::atomic::Ordering;

use tiercel_proto::bind::{Admission, BindDecision, BindServer};
use tiercel_proto::wire::{Kind, Packet};

use super::{Door, Shared};
use crate::secure::{Responder, Session};

/// A secure binding's keys and the answer that made it (sent again to a retransmitted `Hello`).
struct Entry {
    token: u128,
    session: Arc<Session>,
    welcome: Arc<[u8]>,
}

/// The keys of the server's secure bindings, by binding id: at most one entry per binding the
/// endpoint holds (a binding forgotten, its entry goes at the next sweep; an id granted again
/// replaces it).
#[derive(Default)]
pub(crate) struct Sessions {
    table: RwLock<HashMap<u32, Entry>>,
}

impl Sessions {
    /// The keys of binding `id`.
    pub(crate) fn get(&self, id: u32) -> Option<Arc<Session>> {
        let table = self.table.read().unwrap_or_else(|p| p.into_inner());
        table.get(&id).map(|e| e.session.clone())
    }

    /// The answer that made binding `id` with `token`, for a retransmitted `Hello`.
    pub(crate) fn welcome(&self, id: u32, token: u128) -> Option<Arc<[u8]>> {
        let table = self.table.read().unwrap_or_else(|p| p.into_inner());
        table.get(&id).filter(|e| e.token == token).map(|e| e.welcome.clone())
    }

    pub(crate) fn insert(&self, id: u32, token: u128, session: Arc<Session>, welcome: Arc<[u8]>) {
        let mut table = self.table.write().unwrap_or_else(|p| p.into_inner());
        table.insert(id, Entry { token, session, welcome });
    }

    /// Keeps the entries of the bindings `live` says are still held.
    pub(crate) fn retain(&self, mut live: impl FnMut(u32, u128) -> bool) {
        let mut table = self.table.write().unwrap_or_else(|p| p.into_inner());
        table.retain(|&id, e| live(id, e.token));
    }
}

/// A token bucket of handshakes: `rate` a second, in bursts of up to a tenth of a second's.
pub(crate) struct HandshakeBudget {
    rate: f64,
    state: Mutex<(f64, Instant)>,
}

impl HandshakeBudget {
    pub(crate) fn new(per_second: u32) -> HandshakeBudget {
        let rate = f64::from(per_second.max(1));
        HandshakeBudget { rate, state: Mutex::new((Self::burst(rate), Instant::now())) }
    }

    fn burst(rate: f64) -> f64 {
        (rate / 10.0).max(1.0)
    }

    /// Whether one more handshake may be answered now.
    pub(crate) fn take(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let (tokens, at) = *s;
        let tokens = (tokens + now.saturating_duration_since(at).as_secs_f64() * self.rate).min(Self::burst(self.rate));
        if tokens >= 1.0 {
            *s = (tokens - 1.0, now);
            true
        } else {
            *s = (tokens, now);
            false
        }
    }
}

/// What a handshake's first message came to, over either transport.
pub(super) enum Hello<'s> {
    /// Dropped unanswered (beyond the handshake budget, or not a bind request), and counted.
    Dropped,
    /// It does not open with the server's key and secret (or the server has none): the sender is
    /// told so, in an answer that proves nothing (counted as dropped).
    Unreadable,
    /// Answered without a binding (a refusal, `Busy`): the handshake's answer to send.
    Answered(Vec<u8>),
    /// The bind machine admits the request: the transport makes the binding and sends
    /// `Responder::welcome` of its grant (or of [`Admission::busy`]).
    Admitted(Box<Responder>, Admission, BindServer<'s>),
}

impl Shared {
    /// Reads a handshake's first message, `bytes`, from the sender that `peer` stands for, with
    /// the server's key and secret, and decides its bind request through the bind machine of
    /// `door`: an answer is no longer than the request it carried (the handshake adds less to it
    /// than to the request), so the server never sends more than it was sent. Handshakes beyond
    /// `handshakes_per_second` are dropped before anything is computed.
    pub(super) fn hello(&self, bytes: &[u8], peer: &[u8], door: Door, opened: &mut Vec<u8>) -> Hello<'_> {
        let stats = &self.stats;
        let Some(key) = &self.config.key else { return Hello::Unreadable };
        let dropped = || {
            stats.handshakes_dropped.fetch_add(1, Ordering::Relaxed);
            Hello::Dropped
        };
        if !self.handshakes.take() {
            return dropped();
        }
        opened.resize(bytes.len(), 0);
        let psk = crate::auth::psk(self.config.secret.as_ref());
        let Some((responder, n)) = Responder::hello(key, &psk, bytes, opened) else {
            stats.handshakes_dropped.fetch_add(1, Ordering::Relaxed);
            return Hello::Unreadable;
        };
        let Ok(p) = Packet::new_checked(&opened[..n]) else { return dropped() };
        if p.kind() != Kind::Bind {
            return dropped();
        }
        let machine = self.bind_machine(door);
        let welcome = |responder: Responder, answer: &[u8]| match responder.welcome(answer) {
            Some((sealed, _)) => Hello::Answered(sealed),
            None => dropped(),
        };
        let budget = bytes.len().saturating_sub(crate::secure::HANDSHAKE_ROOM);
        match machine.on_request(&p, peer, budget) {
            BindDecision::Malformed => dropped(),
            BindDecision::Answer { packet, refused } => {
                self.count_refusal(refused);
                welcome(responder, &packet)
            }
            BindDecision::Admit(a) if self.refusing_bindings() => {
                stats.rejected.fetch_add(1, Ordering::Relaxed);
                welcome(responder, &a.busy(&machine))
            }
            BindDecision::Admit(a) => Hello::Admitted(Box::new(responder), a, machine),
        }
    }
}
