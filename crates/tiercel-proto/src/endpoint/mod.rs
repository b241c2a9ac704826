//! The server endpoint: every decision about a packet that reaches a server, with no I/O.
//!
//! ```text
//! packet ─► route ─┬─ Bind ─────────► the bind machine (crate::bind), then grant
//!                  ├─ Reject(header)  unknown binding or token, old incarnation
//!                  ├─ Malformed       not a packet a client sends
//!                  └─ Binding ─► enter ─┬─ Err(header): bad slot, or busy (no worker to spare)
//!                                       └─ the slot, locked: on_call / on_result_ack / on_probe,
//!                                          complete, then poll_transmit until None
//! ```
//!
//! The endpoint holds the binding table (ids, tokens, slots with saved results), the memory each
//! binding's messages may take, the admission of new calls (at most `max_running` at once, the rest
//! refused as busy so that they do not queue without bound), and the expiry of idle bindings. Time
//! comes in as an argument. It is shared by the server's worker threads (a read-mostly table and a
//! lock per slot, never held while a procedure runs), and the simulation drives the same code.

mod binding;
mod budget;
mod connection;
mod dispatch;
mod handshakes;
mod region;

pub use binding::{Binding, CallAt, Carrier, Fragment, SlotCell};
pub use budget::Budget;
pub use connection::{Activity, Arrived, Caller, Framed, Source};
pub use dispatch::{Quiet, Reply, Step};
pub use handshakes::{HandshakeLimits, Handshakes, Pending};
pub use region::SlotStep;

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use crate::bind::wire::CHALLENGE_LEN;
use crate::bind::Challenges;
use crate::timing::Timing;
use crate::wire::{flags, Header, Kind, Packet, Status};

/// Most remembered bind requests (sender and nonce) whose duplicates get the binding already granted.
const RECENT_BINDS: usize = 4096;
/// A binding's last activity is written at most this often (nanoseconds): it is shared by threads.
const TOUCH_EVERY: u64 = 100_000_000;

/// What the bind handshake settled for a binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terms {
    /// Largest datagram sent on the binding.
    pub max_datagram: usize,
    /// The features granted ([`crate::bind::wire::features`]); they bound the binding's window.
    pub features: u16,
}

/// What a server endpoint allows.
#[derive(Debug, Clone)]
pub struct EndpointConfig {
    /// This incarnation's boot id.
    pub incarnation: u64,
    /// Most bindings held at once.
    pub max_bindings: usize,
    /// Client slots per binding.
    pub slots_per_binding: u32,
    /// Bytes of multi-packet messages (calls being reassembled, results not yet acknowledged) one
    /// binding may hold.
    pub binding_memory: usize,
    /// Bytes of such messages all bindings together may hold: a call that would take more is
    /// refused as busy, a result that would is replaced by a `ResultTooLarge` error.
    pub memory: usize,
    /// Bytes of `memory` the bindings of one carrier (UDP, TCP, shared memory) may hold together,
    /// so that one transport's abuse leaves the others room for their calls.
    pub carrier_memory: usize,
    /// A call being reassembled that has not heard from its client for this long is given up and
    /// its memory reclaimed ([`ServerEndpoint::reclaim`]).
    pub stalled_after: Duration,
    /// A binding unheard from for this long is forgotten.
    pub binding_idle: Duration,
    /// Most calls running at once; a new call beyond is refused as busy.
    pub max_running: usize,
    /// Protocol timing and the message size limit.
    pub timing: Timing,
}

/// Where a packet goes.
#[derive(Debug)]
pub enum Route<A, E> {
    /// A bind request: decide with [`crate::bind::BindServer`], then [`ServerEndpoint::grant`].
    Bind,
    /// A packet of this binding: [`ServerEndpoint::enter`] its slot.
    Binding(Arc<Binding<A, E>>),
    /// Answer with this header alone (a `Reject`): the binding is unknown, or the packet is for an
    /// earlier incarnation.
    Reject(Header),
    /// Not a packet a client sends: count it and drop it.
    Malformed,
}

/// Why [`ServerEndpoint::enter`] refused a packet, and the answer to send back to its source.
#[derive(Debug, Clone, Copy)]
pub enum Refusal {
    /// Answer with this `Reject` header alone.
    Reject(Header),
    /// The source has not proven it receives for the slot: answer with this `Reject`
    /// (`AddressUnproven`) header followed by the challenge, no larger than the packet it answers
    /// give or take 16 bytes, so that a spoofed source draws no amplified answer.
    Challenge(Header, [u8; CHALLENGE_LEN]),
}

impl Refusal {
    /// The `Reject` header.
    pub fn header(&self) -> &Header {
        match self {
            Refusal::Reject(h) | Refusal::Challenge(h, _) => h,
        }
    }
}

/// The bytes an address feeds a hasher, collected: what a challenge is bound to.
struct AddressBytes {
    buf: [u8; 64],
    len: usize,
}

impl std::hash::Hasher for AddressBytes {
    fn write(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(self.buf.len() - self.len);
        crate::copy::copy(&mut self.buf[self.len..self.len + n], &bytes[..n]);
        self.len += n;
    }
    fn finish(&self) -> u64 {
        0
    }
}

fn address_bytes<A: Hash>(a: &A) -> AddressBytes {
    let mut b = AddressBytes { buf: [0; 64], len: 0 };
    a.hash(&mut b);
    b
}

/// The stateless challenges that prove addresses, supplied by the transport.
struct Challenger(Box<dyn Challenges + Send + Sync>);

impl core::fmt::Debug for Challenger {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("Challenger")
    }
}

/// The bindings, indexed by binding id - 1; a forgotten binding leaves its place empty for the next.
type Table<A, E> = Vec<Option<Arc<Binding<A, E>>>>;

/// The server's bindings and the decisions on their packets. `A` is a peer's address, `E` what the
/// transport attaches to a binding.
#[derive(Debug)]
pub struct ServerEndpoint<A, E> {
    config: EndpointConfig,
    base: Instant,
    bindings: RwLock<Table<A, E>>,
    /// Bindings in the table, of every carrier.
    held: AtomicUsize,
    /// Bind requests granted lately, by sender and nonce, so that a duplicate gets the same binding.
    recent: Mutex<HashMap<(A, u64), u32>>,
    /// Calls running on the workers (datagram bindings'): what `max_running` bounds.
    running: AtomicUsize,
    /// Bindings refused as busy, in the order they were first refused, with when last refused
    /// (ns since `base`): while any waits, a worker that comes free goes to the first of them,
    /// not to whichever binding asks first (a client with many threads would always win).
    waiting: Mutex<VecDeque<(u32, u64)>>,
    /// `waiting.len()`, read without the lock on the fast path.
    waiting_len: AtomicUsize,
    memory: Arc<Budget>,
    /// Each carrier's share of `memory` ([`EndpointConfig::carrier_memory`]), by [`Carrier`].
    carriers: [Arc<Budget>; 3],
    /// Each source's part of its carrier's share, while it holds bindings (see
    /// [`ServerEndpoint::connect_from`]).
    sources: Mutex<HashMap<(Carrier, Source), std::sync::Weak<Budget>>>,
    challenger: Challenger,
    /// Shutting down: no new binding, no new call; calls under way finish.
    draining: AtomicBool,
    /// Bumped when an idle datagram binding could not expire because a thread held it: workers
    /// let go of the binding they hold ([`Held`]) at their next packet, so that the next sweep
    /// finds it unheld.
    letting_go: AtomicU64,
}

/// What one worker of a datagram transport keeps of the binding it routed its last packet to
/// ([`ServerEndpoint::route_held`]), so that the next packet of that binding (a caller's calls
/// come one after another on one binding) is routed without the binding table's lock or a count
/// on the binding's `Arc`: lines that every worker would otherwise write for every packet. A
/// worker lets go of it before it waits for packets ([`Held::let_go`]): a binding held by a
/// worker is in use, and does not expire.
#[derive(Debug)]
pub struct Held<A, E> {
    binding: Option<Arc<Binding<A, E>>>,
    /// The endpoint's `letting_go` when `binding` was taken from the table.
    epoch: u64,
    /// When a packet of `binding` next writes its last activity (written at most every
    /// `TOUCH_EVERY`): before, a clock comparison, where working out the nanoseconds since the
    /// endpoint's start took about 55 instructions a packet.
    activity: Activity,
}

impl<A, E> Default for Held<A, E> {
    fn default() -> Self {
        Held { binding: None, epoch: 0, activity: Activity::default() }
    }
}

impl<A, E> Held<A, E> {
    /// Keeps the binding a packet was routed to ([`Route::Binding`] of
    /// [`ServerEndpoint::route_held`]) for the next packet, once the packet is handled.
    #[inline]
    pub fn keep(&mut self, binding: Arc<Binding<A, E>>) {
        self.binding = Some(binding);
    }

    /// Lets go of the binding held: for a worker about to wait, whose hold would keep an idle
    /// binding from expiring.
    pub fn let_go(&mut self) {
        self.binding = None;
    }
}

/// Most bindings waiting for a worker that are remembered (more are refused without a place).
const MAX_WAITING: usize = 256;

impl<A: Copy + Eq + Hash, E> ServerEndpoint<A, E> {
    /// An endpoint with no bindings; `now` is its base time. `challenges` makes and checks the
    /// challenges by which a client's address proves it receives (a keyed hash with a key of this
    /// endpoint's own).
    pub fn new(
        config: EndpointConfig,
        now: Instant,
        challenges: Box<dyn Challenges + Send + Sync>,
    ) -> ServerEndpoint<A, E> {
        let memory = Arc::new(Budget::new(config.memory));
        let share = || Arc::new(Budget::within(config.carrier_memory, memory.clone()));
        ServerEndpoint {
            challenger: Challenger(challenges),
            carriers: [share(), share(), share()],
            sources: Mutex::new(HashMap::new()),
            memory,
            config,
            base: now,
            bindings: RwLock::new(Vec::new()),
            held: AtomicUsize::new(0),
            recent: Mutex::new(HashMap::new()),
            running: AtomicUsize::new(0),
            waiting: Mutex::new(VecDeque::new()),
            waiting_len: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
            letting_go: AtomicU64::new(0),
        }
    }

    /// Begins a graceful shutdown: from now on new calls are refused as busy (their clients back
    /// off, and fail as overloaded if the server never comes back) and the transport should refuse
    /// new bindings ([`ServerEndpoint::is_draining`]); duplicates, acknowledgements and probes of
    /// calls under way are still answered, so those calls finish.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Whether [`ServerEndpoint::drain`] was called.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Procedures running now, of every carrier (plain ones: async procedures are counted by
    /// their runtime). A connection's or region's calls are counted by their binding alone (no
    /// counter shared by every binding's threads on their fast path), and summed here.
    pub fn running(&self) -> usize {
        let table = self.bindings.read().unwrap_or_else(|p| p.into_inner());
        let apart: usize =
            table.iter().flatten().filter(|b| b.carrier != Carrier::Datagram).map(|b| b.running() as usize).sum();
        self.running.load(Ordering::Acquire) + apart
    }

    /// The settings.
    pub fn config(&self) -> &EndpointConfig {
        &self.config
    }

    /// This incarnation's boot id.
    pub fn incarnation(&self) -> u64 {
        self.config.incarnation
    }

    fn nanos(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.base).as_nanos() as u64
    }

    /// Where checked packet `p`, arriving at `now`, goes. A packet of a known binding counts as
    /// activity of the binding.
    pub fn route(&self, p: &Packet<&[u8]>, now: Instant) -> Route<A, E> {
        self.route_opened(p, None, now)
    }

    /// [`ServerEndpoint::route`] of a packet that came sealed (`opened`: the binding whose keys
    /// opened it) or plain (`None`). A secure binding's packets must come sealed with its own keys,
    /// and a plain binding's plain: any other is [`Route::Malformed`], so that a relay holding a
    /// secure binding's token, but not its keys, reaches nothing. A bind request comes sealed only
    /// in a handshake, never on a binding.
    pub fn route_opened(&self, p: &Packet<&[u8]>, opened: Option<u32>, now: Instant) -> Route<A, E> {
        self.route_with(None, p, opened, now)
    }

    /// [`ServerEndpoint::route_opened`] by a worker that holds the binding of its last packet in
    /// `held`: a packet of that binding is routed to it without a look at the table (the same
    /// decision: a binding held is in the table, as a binding in use never leaves it). The
    /// binding routed to is taken out of `held`; the worker puts it back with [`Held::keep`] once
    /// the packet is handled.
    #[inline]
    pub fn route_held(
        &self,
        held: &mut Held<A, E>,
        p: &Packet<&[u8]>,
        opened: Option<u32>,
        now: Instant,
    ) -> Route<A, E> {
        self.route_with(Some(held), p, opened, now)
    }

    fn route_with(
        &self,
        mut held: Option<&mut Held<A, E>>,
        p: &Packet<&[u8]>,
        opened: Option<u32>,
        now: Instant,
    ) -> Route<A, E> {
        if opened.is_some_and(|id| id != p.binding()) {
            return Route::Malformed;
        }
        match p.kind() {
            Kind::Bind if opened.is_some() => return Route::Malformed,
            Kind::Bind => return Route::Bind,
            Kind::Call | Kind::Ack | Kind::Probe | Kind::Cancel => {}
            Kind::Result | Kind::ProbeReply | Kind::Reject | Kind::BindReply => return Route::Malformed,
        }
        let binding = match held.as_deref_mut() {
            Some(held) => {
                let epoch = self.letting_go.load(Ordering::Acquire);
                let kept =
                    held.binding.take().filter(|b| held.epoch == epoch && b.id == p.binding() && b.token == p.token());
                held.epoch = epoch;
                if kept.is_none() {
                    // (Its activity's times were another binding's.)
                    held.activity = Activity::default();
                }
                kept.or_else(|| self.lookup(p.binding(), p.token()))
            }
            None => self.lookup(p.binding(), p.token()),
        };
        let Some(binding) = binding else {
            return Route::Reject(self.reject(p, Status::UnknownBinding));
        };
        if binding.caller.is_some_and(|c| c.is_sealed()) != opened.is_some() {
            return Route::Malformed;
        }
        if p.incarnation() != self.config.incarnation {
            return Route::Reject(self.reject(p, Status::WrongIncarnation));
        }
        match held {
            Some(held) => self.touch_through(&mut held.activity, &binding, now),
            None => self.touch(&binding, now),
        }
        Route::Binding(binding)
    }

    /// The slot packet `p` from `from` is for, locked. Refused when the slot is outside the
    /// binding (`BadSlot`); when `from` has not proven that it receives for this slot
    /// ([`Refusal::Challenge`]: the token proves who bound, not where a packet comes from, which
    /// may be spoofed); or when `p` starts a new call and `max_running` calls are running, or
    /// another binding refused so before still waits for a worker, or the endpoint is draining
    /// (`Busy`, not recorded: the client's retry after backing off is a fresh attempt). Bindings
    /// refused as busy take freed workers in the order they were first refused, so that a client
    /// with a few threads is not starved by clients with many.
    ///
    /// An address proves itself by echoing the challenge in a `Probe` with
    /// [`flags::ADDRESS_PROOF`]; it then becomes the slot's peer, the only address the slot's
    /// packets are taken from and its answers go to, until another proves itself. So the server
    /// sends an address that has not proven itself nothing but `Reject` headers, each no larger
    /// than the packet it answers plus a 16-byte challenge.
    pub fn enter<'b>(
        &self,
        binding: &'b Binding<A, E>,
        p: &Packet<&[u8]>,
        from: A,
        now: Instant,
    ) -> Result<MutexGuard<'b, SlotCell<A>>, Refusal> {
        let Some(mut cell) = binding.slot(p.slot()) else {
            return Err(Refusal::Reject(self.reject(p, Status::BadSlot)));
        };
        if cell.peer != Some(from) {
            let address = address_bytes(&from);
            let address = &address.buf[..address.len];
            let nonce = (binding.token as u64) ^ (u64::from(binding.id) << 32 | u64::from(p.slot()));
            let proof = p.kind() == Kind::Probe && p.flags() & flags::ADDRESS_PROOF != 0;
            let proven = proof
                && p.payload()
                    .try_into()
                    .is_ok_and(|c: &[u8; CHALLENGE_LEN]| self.challenger.0.check(address, nonce, c));
            if !proven {
                let mut h = self.reject(p, Status::AddressUnproven);
                h.payload_len = CHALLENGE_LEN as u32;
                h.message_len = CHALLENGE_LEN as u32;
                return Err(Refusal::Challenge(h, self.challenger.0.challenge(address, nonce)));
            }
            cell.peer = Some(from);
        }
        if p.kind() == Kind::Call && cell.proto.is_new(p.seq()) && !self.admit_call(binding, || now) {
            return Err(Refusal::Reject(self.reject(p, Status::Busy)));
        }
        Ok(cell)
    }

    /// Whether a new call of `binding`, on any carrier, may run now: not while the endpoint is
    /// draining; and a datagram binding's call (which needs a worker) not while `max_running`
    /// calls run on the workers or another binding refused before still waits for one (refused
    /// bindings take freed workers in the order they were first refused, so that a client with a
    /// few threads is not starved by clients with many). A connection's or region's call runs on
    /// the binding's own threads, which its admission at bind time paid for. A refused call is
    /// answered `Busy`; an admitted one is counted with [`ServerEndpoint::run_started`]. `now` is
    /// read only when workers are contended.
    #[inline]
    pub fn admit_call(&self, binding: &Binding<A, E>, now: impl FnOnce() -> Instant) -> bool {
        if self.is_draining() {
            return false;
        }
        if binding.carrier != Carrier::Datagram {
            return true;
        }
        let full = self.running.load(Ordering::Acquire) >= self.config.max_running;
        let contended = full || self.waiting_len.load(Ordering::Acquire) > 0;
        !contended || self.admit(binding.id, full, now())
    }

    /// Whether `p`, the header of a datagram from `from` received into the place
    /// [`SlotCell::landing`] gave, continues `call` ([`SlotCell::call_at`], a slot of `binding`
    /// entered for an earlier fragment): a `Call` of the same binding, token, incarnation, slot and
    /// call, from the slot's proven peer. Touches the binding as
    /// [`ServerEndpoint::route`] does. Anything else is to be handled as a whole datagram.
    pub fn continues(
        &self,
        binding: &Arc<Binding<A, E>>,
        call: CallAt<A>,
        p: &Packet<&[u8]>,
        from: A,
        now: Instant,
    ) -> bool {
        let same = p.kind() == Kind::Call
            && p.slot() == call.slot
            && p.seq() == call.seq
            && from == call.peer
            && p.incarnation() == self.config.incarnation
            && self.lookup(p.binding(), p.token()).is_some_and(|b| Arc::ptr_eq(&b, binding));
        if same {
            self.touch(binding, now);
        }
        same
    }

    /// Whether a new call of binding `id` may take a worker while workers are contended (`full`:
    /// none is free): only if one is free and no other binding has waited longer. A refused
    /// binding joins the queue; one that has not asked again for `timing.retransmit_max` twice
    /// over (its client gave up, or got its call in) leaves it.
    fn admit(&self, id: u32, full: bool, now: Instant) -> bool {
        let t = self.nanos(now);
        let stale = 2 * self.config.timing.retransmit_max.as_nanos() as u64;
        let mut queue = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        queue.retain(|&(_, at)| t.saturating_sub(at) < stale);
        let admitted = match queue.front() {
            _ if full => false,
            None => true,
            Some(&(first, _)) => first == id,
        };
        if admitted {
            queue.pop_front();
        } else if let Some(entry) = queue.iter_mut().find(|(b, _)| *b == id) {
            entry.1 = t;
        } else if queue.len() < MAX_WAITING {
            queue.push_back((id, t));
        }
        self.waiting_len.store(queue.len(), Ordering::Release);
        admitted
    }

    /// Notes that a procedure of `binding` starts running on a worker (admission counts it until
    /// [`ServerEndpoint::run_finished`], and a stream's binding is not forgotten meanwhile). A
    /// region's calls are not counted here: its transport watches its threads (no read-modify-write
    /// of a shared word on its fast path).
    #[inline]
    pub fn run_started(&self, binding: &Binding<A, E>) {
        match binding.carrier {
            Carrier::Datagram => {
                self.running.fetch_add(1, Ordering::AcqRel);
            }
            Carrier::Stream => binding.call_began(),
            // A region's transport watches its calls itself (its threads mark what they do with
            // plain stores), and a region's binding never expires while its client holds it.
            Carrier::Region => {}
        }
    }

    /// Notes that a procedure of `binding` finished.
    #[inline]
    pub fn run_finished(&self, binding: &Binding<A, E>) {
        match binding.carrier {
            Carrier::Datagram => {
                self.running.fetch_sub(1, Ordering::AcqRel);
            }
            Carrier::Stream => binding.call_ended(),
            Carrier::Region => {}
        }
    }

    /// A `Reject` of `p` with `status`.
    pub fn reject(&self, p: &Packet<&[u8]>, status: Status) -> Header {
        Header {
            status,
            flags: p.flags() & flags::CHECKSUM,
            binding: p.binding(),
            slot: p.slot(),
            seq: p.seq(),
            procedure: p.procedure(),
            incarnation: self.config.incarnation,
            token: p.token(),
            ..Header::new(Kind::Reject)
        }
    }

    /// The binding with this id, if its token matches.
    pub fn lookup(&self, id: u32, token: u128) -> Option<Arc<Binding<A, E>>> {
        let table = self.bindings.read().unwrap_or_else(|p| p.into_inner());
        let b = table.get((id as usize).checked_sub(1)?)?.as_ref()?;
        // Compared in full: the token is a capability, not a hint. A connection's binding is
        // reached only through its connection (its token, zero, proves nothing).
        (b.carrier == Carrier::Datagram && b.token == token).then(|| b.clone())
    }

    /// The index of a free place in the binding table (growing it up to `max_bindings`), for a
    /// binding of any carrier; `None` when the table is full.
    fn free_place(&self, table: &mut Table<A, E>) -> Option<usize> {
        match table.iter().position(Option::is_none) {
            Some(i) => Some(i),
            None if table.len() < self.config.max_bindings => {
                table.push(None);
                Some(table.len() - 1)
            }
            None => None,
        }
    }

    /// Grants a binding to `from`'s request `nonce` (the bind machine admitted it), or returns the
    /// one already granted to a duplicate of the same request; with whether it is new. `None` when
    /// the table is full. Its memory lies within the datagram carrier's share alone;
    /// [`ServerEndpoint::grant_from`] puts it within its source's part of that share.
    pub fn grant(
        &self,
        from: A,
        nonce: u64,
        export: E,
        token: u128,
        terms: Terms,
        now: Instant,
    ) -> Option<(Arc<Binding<A, E>>, bool)> {
        self.grant_within(|| self.carrier_budget(Carrier::Datagram), from, None, nonce, export, token, terms, now)
    }

    /// [`ServerEndpoint::grant`] for a request from `caller` (the address the grant goes to): the
    /// memory of all of one source's datagram bindings together ([`Caller::source`]) lies within
    /// half of the datagram carrier's share, as for the other carriers
    /// ([`ServerEndpoint::connect_from`]).
    #[allow(clippy::too_many_arguments)]
    pub fn grant_from(
        &self,
        from: A,
        caller: Caller,
        nonce: u64,
        export: E,
        token: u128,
        terms: Terms,
        now: Instant,
    ) -> Option<(Arc<Binding<A, E>>, bool)> {
        let part = || self.part(Carrier::Datagram, caller.source());
        self.grant_within(part, from, Some(caller), nonce, export, token, terms, now)
    }

    #[allow(clippy::too_many_arguments)]
    fn grant_within(
        &self,
        outer: impl FnOnce() -> Arc<Budget>,
        from: A,
        caller: Option<Caller>,
        nonce: u64,
        export: E,
        token: u128,
        terms: Terms,
        now: Instant,
    ) -> Option<(Arc<Binding<A, E>>, bool)> {
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&id) = recent.get(&(from, nonce)) {
            let table = self.bindings.read().unwrap_or_else(|p| p.into_inner());
            if let Some(Some(b)) = table.get(id as usize - 1) {
                return Some((b.clone(), false));
            }
        }
        let mut table = self.bindings.write().unwrap_or_else(|p| p.into_inner());
        let index = self.free_place(&mut table)?;
        let binding = Arc::new(Binding::new(
            &self.config,
            Carrier::Datagram,
            index as u32 + 1,
            token,
            export,
            terms,
            outer(),
            caller,
            self.nanos(now),
        ));
        table[index] = Some(binding.clone());
        self.held.fetch_add(1, Ordering::AcqRel);
        if recent.len() >= RECENT_BINDS {
            recent.clear();
        }
        recent.insert((from, nonce), binding.id);
        Some((binding, true))
    }

    /// Forgets bindings unheard from for `binding_idle` with no call running; returns how many. A
    /// datagram binding no thread is using leaves the table (one that a worker holds, [`Held`], is
    /// let go of at that worker's next packet, or before it waits, and leaves at a later sweep); a
    /// connection's binding
    /// ([`Carrier::Stream`]) is marked expired, for its transport to close and release. A region's
    /// binding lasts while its client holds the rendezvous connection.
    pub fn expire(&self, now: Instant) -> usize {
        let cutoff = self.nanos(now).saturating_sub(self.config.binding_idle.as_nanos() as u64);
        let mut table = self.bindings.write().unwrap_or_else(|p| p.into_inner());
        let mut freed = Vec::new();
        let (mut expired, mut held) = (0, false);
        for entry in table.iter_mut() {
            let Some(b) = entry.as_ref() else { continue };
            if b.last_active.load(Ordering::Relaxed) >= cutoff {
                continue;
            }
            match b.carrier {
                Carrier::Datagram if Arc::strong_count(b) == 1 => {
                    freed.push(b.id);
                    *entry = None;
                }
                // Held: by a call running, or by a worker that routed its last packet to it
                // ([`Held`]), which lets go at its next packet; the next sweep tries again.
                Carrier::Datagram => held = true,
                Carrier::Stream if b.running() == 0 && b.expire() => expired += 1,
                _ => {}
            }
        }
        drop(table);
        if held {
            self.letting_go.fetch_add(1, Ordering::AcqRel);
        }
        self.held.fetch_sub(freed.len(), Ordering::AcqRel);
        if !freed.is_empty() {
            self.recent.lock().unwrap_or_else(|p| p.into_inner()).retain(|_, id| !freed.contains(id));
        }
        freed.len() + expired
    }

    /// Bytes of messages charged now, all bindings together (never more than `config.memory`).
    pub fn memory(&self) -> usize {
        self.memory.used()
    }

    /// The share of the server's budget the bindings of `carrier` charge (within
    /// `config.carrier_memory`).
    pub fn carrier_budget(&self, carrier: Carrier) -> Arc<Budget> {
        self.carriers[carrier as usize].clone()
    }

    /// The server-wide budget the bindings charge, to share with other transports of the same
    /// server (so that `config.memory` bounds them all together).
    pub fn budget(&self) -> Arc<Budget> {
        self.memory.clone()
    }

    /// Gives up the calls being reassembled that have not heard from their clients for
    /// `stalled_after`, returning their memory; returns how many. Slots busy with another thread
    /// are left for the next sweep.
    pub fn reclaim(&self, now: Instant) -> usize {
        // Under the table's read lock (slots are only tried, never waited for), and without
        // collecting the bindings first: the sweep allocates nothing.
        let table = self.bindings.read().unwrap_or_else(|p| p.into_inner());
        let mut reclaimed = 0;
        for b in table.iter().flatten() {
            for i in 0..b.slots() {
                let Some(mut cell) = b.try_slot(i) else { continue };
                if let Some(freed) = cell.proto.reclaim_stale(now, self.config.stalled_after) {
                    b.release(freed);
                    reclaimed += 1;
                }
            }
        }
        reclaimed
    }

    /// Number of bindings held, of every carrier.
    pub fn len(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// Whether no binding is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests;
