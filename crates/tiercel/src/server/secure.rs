//! The server's secure bindings: each one's keys, by binding id, and the budget of handshakes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use crate::secure::Session;

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
