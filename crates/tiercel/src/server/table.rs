//! The server's bindings and their client slots.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use tiercel_proto::server::Slot;

use crate::interface::Export;

/// One client slot: its protocol state, saved result and where to send it.
pub(crate) struct SlotCell {
    pub(crate) proto: Slot,
    /// Header space followed by the marshaled result of the slot's latest call, kept until the client
    /// acknowledges it so that a duplicate call is answered without running again.
    pub(crate) result: Vec<u8>,
    pub(crate) status: tiercel_proto::wire::Status,
    pub(crate) peer: Option<SocketAddr>,
    /// Bytes of `result` charged to the binding's memory budget.
    pub(crate) charged: usize,
}

/// A binding granted to a client.
pub(crate) struct ServerBinding {
    pub(crate) id: u32,
    pub(crate) token: u128,
    pub(crate) export: Arc<dyn Export>,
    pub(crate) max_datagram: usize,
    slots: Box<[Mutex<SlotCell>]>,
    memory: AtomicUsize,
    memory_limit: usize,
    /// Milliseconds since the server started when a packet of the binding last arrived.
    last_active: AtomicU64,
}

impl ServerBinding {
    /// Notes a packet at `now_ms`; writes the shared word only when it moved by 100 ms or more.
    pub(crate) fn touch(&self, now_ms: u64) {
        if now_ms >= self.last_active.load(Ordering::Relaxed) + 100 {
            self.last_active.store(now_ms, Ordering::Relaxed);
        }
    }

    pub(crate) fn slot(&self, index: u32) -> Option<MutexGuard<'_, SlotCell>> {
        self.slots.get(index as usize).map(|m| m.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Charges `bytes` to the binding's memory budget; false if that would exceed it.
    pub(crate) fn reserve(&self, bytes: usize) -> bool {
        let mut used = self.memory.load(Ordering::Relaxed);
        loop {
            if used + bytes > self.memory_limit {
                return false;
            }
            match self.memory.compare_exchange_weak(used, used + bytes, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(u) => used = u,
            }
        }
    }

    /// Returns `bytes` to the budget.
    pub(crate) fn release(&self, bytes: usize) {
        if bytes > 0 {
            self.memory.fetch_sub(bytes, Ordering::AcqRel);
        }
    }

    /// Bytes charged now.
    pub(crate) fn memory(&self) -> usize {
        self.memory.load(Ordering::Relaxed)
    }
}

/// Every binding of a server incarnation, indexed by binding id - 1.
pub(crate) struct Table {
    bindings: RwLock<Vec<Option<Arc<ServerBinding>>>>,
    recent: Mutex<HashMap<(SocketAddr, u64), u32>>,
    max: usize,
}

impl Table {
    pub(crate) fn new(max: usize) -> Table {
        Table { bindings: RwLock::new(Vec::new()), recent: Mutex::new(HashMap::new()), max }
    }

    /// The binding with this id, if its token matches.
    pub(crate) fn lookup(&self, id: u32, token: u128) -> Option<Arc<ServerBinding>> {
        let table = self.bindings.read().unwrap_or_else(|p| p.into_inner());
        let b = table.get((id as usize).checked_sub(1)?)?.as_ref()?;
        // Compared in full: the token is a capability, not a hint.
        (b.token == token).then(|| b.clone())
    }

    /// Grants a binding, or returns the one already granted to a duplicate of the same request; with
    /// whether it is new.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn grant(
        &self,
        peer: SocketAddr,
        nonce: u64,
        export: Arc<dyn Export>,
        token: u128,
        slots: u32,
        max_datagram: usize,
        memory_limit: usize,
        now_ms: u64,
    ) -> Option<(Arc<ServerBinding>, bool)> {
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&id) = recent.get(&(peer, nonce)) {
            let table = self.bindings.read().unwrap_or_else(|p| p.into_inner());
            if let Some(Some(b)) = table.get(id as usize - 1) {
                return Some((b.clone(), false));
            }
        }
        let mut table = self.bindings.write().unwrap_or_else(|p| p.into_inner());
        let index = match table.iter().position(Option::is_none) {
            Some(i) => i,
            None if table.len() < self.max => {
                table.push(None);
                table.len() - 1
            }
            None => return None,
        };
        let binding = Arc::new(ServerBinding {
            id: index as u32 + 1,
            token,
            export,
            max_datagram,
            slots: (0..slots)
                .map(|_| {
                    Mutex::new(SlotCell {
                        proto: Slot::new(),
                        result: Vec::new(),
                        status: tiercel_proto::wire::Status::Ok,
                        peer: None,
                        charged: 0,
                    })
                })
                .collect(),
            memory: AtomicUsize::new(0),
            memory_limit,
            last_active: AtomicU64::new(now_ms),
        });
        table[index] = Some(binding.clone());
        if recent.len() >= 4096 {
            recent.clear();
        }
        recent.insert((peer, nonce), binding.id);
        Some((binding, true))
    }

    /// Forgets bindings idle since before `cutoff_ms` that no worker is using; returns how many.
    pub(crate) fn expire(&self, cutoff_ms: u64) -> usize {
        let mut table = self.bindings.write().unwrap_or_else(|p| p.into_inner());
        let mut freed = Vec::new();
        for entry in table.iter_mut() {
            let idle = entry
                .as_ref()
                .is_some_and(|b| b.last_active.load(Ordering::Relaxed) < cutoff_ms && Arc::strong_count(b) == 1);
            if idle {
                if let Some(b) = entry.take() {
                    freed.push(b.id);
                }
            }
        }
        drop(table);
        if !freed.is_empty() {
            self.recent.lock().unwrap_or_else(|p| p.into_inner()).retain(|_, id| !freed.contains(id));
        }
        freed.len()
    }

    /// Number of bindings held.
    pub(crate) fn len(&self) -> usize {
        self.bindings.read().unwrap_or_else(|p| p.into_inner()).iter().flatten().count()
    }
}
