//! Deterministic simulation of the TCP transport's server on virtual time.
//!
//! Each seed builds a scenario: a client with a few slots making calls of random sizes (some larger
//! than the binding may ever hold) over one connection, whose bytes reach the server cut at random
//! places and after random delays; procedures that take random time and finish in any order; and,
//! by seed, connections reset in the middle of frames, the server forgetting an idle binding,
//! server crashes (a new incarnation) and a shutdown that drains. The server is the shipped
//! `ServerEndpoint` (the one table of bindings, `connect`/`release`, and `read_frame`, which the TCP
//! server reads every connection through: framing, the buffer grown as a large frame arrives and
//! charged first, the refusal of frames without room, `on_frame`'s checks and admission) with the
//! real `Deframer` and memory budgets; the harness only moves bytes and runs procedures, and the
//! client is a model of tiercel's TCP client (a frame per call, results matched by slot and call
//! number, a lost connection failing the calls on it as sent or not).
//!
//! Every scenario asserts that each call ends once, with its own result or an error that says
//! truly whether it may have run; that no call runs twice, none runs after the server began to
//! drain, and none sent to an earlier incarnation runs; that the server never finds an honest
//! client's bytes malformed; that a binding's buffers never pass its budget; and that all memory is
//! given back when the connections are gone. `TIERCEL_SIM_SCENARIOS` sets the number of seeds
//! (default 10,000).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tiercel_proto::endpoint::{Activity, Arrived, Binding, Carrier, EndpointConfig, ServerEndpoint};
use tiercel_proto::stream::{self, Deframer, Next, PREFIX_LEN};
use tiercel_proto::wire::{Header, Kind, Packet, Status, HEADER_LEN};
use tiercel_proto::Timing;

type B = Binding<u8, ()>;

/// What became of a call, as its caller is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Its result, checked.
    Ran,
    /// Refused `Busy`: it never ran.
    Refused,
    /// Refused `TooLarge`, more than its binding could ever hold: it never ran.
    TooLarge,
    /// The connection was lost before its frame went out: it never ran.
    NotSent,
    /// The connection was lost after its frame went out: it may have run.
    MayHaveRun,
}

#[derive(PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Event {
    /// Some of the bytes in flight to the server arrive.
    ToServer,
    /// Some of the bytes in flight to the client arrive.
    ToClient,
    /// The call `id` running on connection `conn` of incarnation `incarnation` finishes.
    Finish { incarnation: u64, conn: u64, id: u64 },
    /// The connection is reset.
    Reset,
    /// The server process dies and a new one starts on the same port.
    Crash,
    /// The server begins to shut down.
    Drain,
    /// Time passes for the endpoint's expiry.
    Sweep,
    /// The client makes its next call on a free slot.
    Call,
}

/// The server's side of the connection.
struct ServerSide {
    binding: Arc<B>,
    frames: Deframer,
    /// Bytes of `frames`' buffer charged to the binding's budget.
    charged: usize,
    /// When the connection's frames next write its binding's activity.
    activity: Activity,
    /// Calls of this connection running, by id: (slot, seq, argument bytes).
    running: HashMap<u64, (u32, u32, usize)>,
}

impl ServerSide {
    /// Makes the charge `to` bytes; false (unchanged) without room.
    fn settle(binding: &B, charged: &mut usize, to: usize) -> bool {
        if to > *charged {
            if !binding.budget().reserve(to - *charged) {
                return false;
            }
        } else {
            binding.budget().release(*charged - to);
        }
        *charged = to;
        true
    }
}

/// A call the client has made and not heard the end of.
struct Waiting {
    id: u64,
    seq: u32,
    len: usize,
    /// Its frame went out on the connection (all of it is in flight or delivered).
    sent: bool,
}

struct Scenario {
    rng: ChaCha8Rng,
    base: Instant,
    now: u64,
    order: u64,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    config: EndpointConfig,
    endpoint: ServerEndpoint<u8, ()>,
    /// The connection's number (a reset or crash makes a new one).
    conn: u64,
    server: Option<ServerSide>,
    /// Call frames the client has not written yet (the socket had no room), by slot.
    unwritten: VecDeque<(usize, Vec<u8>)>,
    to_server: VecDeque<u8>,
    to_client: VecDeque<u8>,
    client_frames: Deframer,
    /// The client's slots: the call each waits for.
    slots: Vec<Option<Waiting>>,
    seqs: Vec<u32>,
    /// The binding the client holds (its id), if connected.
    bound: Option<u32>,
    next_id: u64,
    calls_left: u32,
    /// Times each call ran, by id.
    ran: HashMap<u64, u32>,
    /// Each call's argument bytes, by id.
    lens: HashMap<u64, usize>,
    outcomes: HashMap<u64, Outcome>,
    draining: bool,
    chunk: usize,
    largest: usize,
}

impl Scenario {
    fn at(&self) -> Instant {
        self.base + Duration::from_nanos(self.now)
    }

    /// Schedules `e` after a random number of microseconds in `range`.
    fn soon(&mut self, range: std::ops::Range<u64>, e: Event) {
        let after = self.rng.random_range(range);
        self.push(after, e);
    }

    fn push(&mut self, after_us: u64, e: Event) {
        self.order += 1;
        self.events.push(Reverse((self.now + after_us * 1000, self.order, e)));
    }

    /// Connects and binds (the bind exchange itself is the handshake tests' business).
    fn connect(&mut self) {
        self.conn += 1;
        self.unwritten.clear();
        self.to_server.clear();
        self.to_client.clear();
        self.client_frames = Deframer::new(256, usize::MAX >> 8);
        let Some(binding) = self.endpoint.connect(Carrier::Stream, (), self.at()) else {
            assert!(self.draining, "one client alone found no room");
            // Refused at bind: the calls left are never made.
            self.bound = None;
            self.calls_left = 0;
            return;
        };
        let capacity = self.rng.random_range(HEADER_LEN + PREFIX_LEN..4096);
        let limit = stream::max_frame(self.config.timing.max_message);
        let mut charged = 0;
        assert!(ServerSide::settle(&binding, &mut charged, capacity), "the first buffer fits");
        self.bound = Some(binding.id);
        self.server = Some(ServerSide {
            binding,
            frames: Deframer::new(capacity, limit),
            charged,
            activity: Activity::default(),
            running: HashMap::new(),
        });
    }

    /// The connection is gone: the server forgets the binding and gives its memory back; the
    /// client fails every call on it, as sent or not.
    fn lose_connection(&mut self) {
        if let Some(mut s) = self.server.take() {
            ServerSide::settle(&s.binding, &mut s.charged, 0);
            // Calls still running finish on their threads; their results go nowhere.
            for _ in s.running.drain() {
                self.endpoint.run_finished(&s.binding);
            }
            self.endpoint.release(&s.binding);
        }
        // What was in flight either way is gone with the connection.
        self.unwritten.clear();
        self.to_server.clear();
        self.to_client.clear();
        self.client_frames = Deframer::new(256, usize::MAX >> 8);
        for slot in self.slots.iter_mut() {
            if let Some(w) = slot.take() {
                let outcome = if w.sent { Outcome::MayHaveRun } else { Outcome::NotSent };
                assert!(self.outcomes.insert(w.id, outcome).is_none(), "call {} ended twice", w.id);
            }
        }
        self.bound = None;
    }

    fn client_call(&mut self) {
        if self.calls_left == 0 {
            return;
        }
        if self.bound.is_none() && self.server.is_none() {
            self.connect();
        }
        let Some(binding) = self.bound else { return };
        let Some(slot) = self.slots.iter().position(Option::is_none) else { return };
        self.calls_left -= 1;
        let id = self.next_id;
        self.next_id += 1;
        self.seqs[slot] += 1;
        let seq = self.seqs[slot];
        let len = if self.rng.random_bool(0.1) {
            self.rng.random_range(8..=self.largest)
        } else {
            self.rng.random_range(8..256)
        };
        let h = Header {
            binding,
            slot: slot as u32,
            seq,
            procedure: 1,
            incarnation: self.endpoint.incarnation(),
            payload_len: len as u32,
            message_len: len as u32,
            ..Header::new(Kind::Call)
        };
        let mut frame = stream::prefix(HEADER_LEN + len).to_vec();
        frame.extend(h.to_bytes());
        frame.extend(id.to_le_bytes());
        frame.extend((8..len).map(|i| (id as usize + i) as u8));
        // Written now, or later when the socket has room (lost with the connection meanwhile).
        let written = self.unwritten.is_empty() && self.rng.random_bool(0.8);
        if written {
            self.to_server.extend(frame);
        } else {
            self.unwritten.push_back((slot, frame));
        }
        self.slots[slot] = Some(Waiting { id, seq, len, sent: written });
        self.lens.insert(id, len);
        self.soon(1..50, Event::ToServer);
    }

    fn server_reads(&mut self) {
        // The frames the socket had no room for go out first.
        while let Some((slot, frame)) = self.unwritten.pop_front() {
            self.to_server.extend(frame);
            if let Some(w) = self.slots[slot].as_mut() {
                w.sent = true;
            }
        }
        let mut later = Vec::new();
        while let Some(s) = self.server.as_mut() {
            let binding = s.binding.clone();
            let ServerSide { frames, charged, activity, .. } = s;
            let grow = |to| ServerSide::settle(&binding, charged, to);
            let now = self.base + Duration::from_nanos(self.now);
            let arrived = self.endpoint.read_frame(frames, &binding, activity, now, grow);
            assert!(s.charged <= self.config.binding_memory, "a buffer past its binding's budget");
            match arrived {
                Arrived::Call { slot, seq, .. } => {
                    assert!(!self.draining, "a call taken while draining");
                    let args = &s.frames.frame()[HEADER_LEN..];
                    let id = u64::from_le_bytes(args[..8].try_into().unwrap());
                    for (i, &b) in args.iter().enumerate().skip(8) {
                        assert_eq!(b, (id as usize + i) as u8, "call {id}'s arguments arrived changed");
                    }
                    let runs = self.ran.entry(id).or_default();
                    *runs += 1;
                    assert_eq!(*runs, 1, "call {id} ran twice");
                    self.endpoint.run_started(&s.binding);
                    s.running.insert(id, (slot, seq, args.len()));
                    s.frames.consume();
                    let (incarnation, conn) = (self.endpoint.incarnation(), self.conn);
                    later.push((self.rng.random_range(1..2_000), Event::Finish { incarnation, conn, id }));
                }
                Arrived::Answer(h) => {
                    assert!(
                        h.kind == Kind::Result && matches!(h.status, Status::Busy | Status::TooLarge),
                        "an honest client's frame refused {:?}",
                        (h.kind, h.status)
                    );
                    self.to_client.extend(stream::prefix(HEADER_LEN));
                    self.to_client.extend(h.to_bytes());
                    later.push((self.rng.random_range(1..50), Event::ToClient));
                }
                Arrived::Cancel { .. } => unreachable!("the model client sends no cancel"),
                Arrived::Close => panic!("an honest client's bytes found malformed"),
                Arrived::More => {
                    // Some of what is in flight arrives, cut anywhere.
                    let spare = s.frames.spare();
                    let n = spare.len().min(self.to_server.len()).min(self.rng.random_range(1..=self.chunk));
                    if n == 0 {
                        break;
                    }
                    for (at, b) in spare.iter_mut().zip(self.to_server.drain(..n)) {
                        *at = b;
                    }
                    s.frames.filled(n);
                    if self.rng.random_bool(0.3) {
                        // The rest arrives later.
                        break;
                    }
                }
            }
        }
        for (after, e) in later {
            self.push(after, e);
        }
        if !self.to_server.is_empty() && self.server.is_some() {
            self.soon(1..50, Event::ToServer);
        }
    }

    fn finish(&mut self, incarnation: u64, conn: u64, id: u64) {
        if incarnation != self.endpoint.incarnation() || conn != self.conn {
            return;
        }
        let Some(s) = self.server.as_mut() else { return };
        let Some((slot, seq, len)) = s.running.remove(&id) else { return };
        self.endpoint.run_finished(&s.binding);
        // The result: the call's id and its length.
        let h = Header {
            binding: s.binding.id,
            slot,
            seq,
            procedure: 1,
            incarnation,
            payload_len: 16,
            message_len: 16,
            ..Header::new(Kind::Result)
        };
        self.to_client.extend(stream::prefix(HEADER_LEN + 16));
        self.to_client.extend(h.to_bytes());
        self.to_client.extend(id.to_le_bytes());
        self.to_client.extend((len as u64).to_le_bytes());
        self.soon(1..50, Event::ToClient);
    }

    fn client_reads(&mut self) {
        let spare = self.client_frames.spare();
        let n = spare.len().min(self.to_client.len()).min(self.rng.random_range(1..=self.chunk));
        for (at, b) in spare.iter_mut().zip(self.to_client.drain(..n)) {
            *at = b;
        }
        self.client_frames.filled(n);
        while let Ok(Next::Frame(_)) = self.client_frames.next() {
            let p = Packet::new_checked(self.client_frames.frame()).expect("the server sends whole packets");
            let slot = p.slot() as usize;
            let w = self.slots[slot].take().expect("an answer for a slot that waits");
            assert_eq!(p.seq(), w.seq, "an answer for another call of the slot");
            let outcome = match (p.kind(), p.status()) {
                (Kind::Result, Status::Ok) => {
                    let body = p.payload();
                    assert_eq!(u64::from_le_bytes(body[..8].try_into().unwrap()), w.id, "another call's result");
                    assert_eq!(
                        u64::from_le_bytes(body[8..16].try_into().unwrap()) as usize,
                        w.len,
                        "its arguments' length"
                    );
                    Outcome::Ran
                }
                (Kind::Result, Status::Busy) => Outcome::Refused,
                (Kind::Result, Status::TooLarge) => Outcome::TooLarge,
                other => panic!("answered {other:?}"),
            };
            assert!(self.outcomes.insert(w.id, outcome).is_none(), "call {} ended twice", w.id);
            self.client_frames.consume();
            self.soon(0..100, Event::Call);
        }
        if !self.to_client.is_empty() {
            self.soon(1..50, Event::ToClient);
        }
    }

    fn sweep(&mut self) {
        self.endpoint.expire(self.at());
        if self.server.as_ref().is_some_and(|s| s.binding.is_expired()) {
            // The server closes a binding it forgot: the client finds the connection closed.
            self.lose_connection();
            self.soon(0..100, Event::Call);
        }
        if self.calls_left > 0 || self.slots.iter().any(Option::is_some) {
            self.soon(100..3_000, Event::Sweep);
        }
    }
}

/// Totals over a scenario, for the summary.
#[derive(Default, Debug)]
struct Totals {
    ran: u64,
    refused: u64,
    not_sent: u64,
    may_have_run: u64,
    /// Calls larger than the server's first buffer that ran (the buffer grew as they arrived).
    grown: u64,
    /// Calls larger than their binding may ever hold, refused from their header.
    too_large: u64,
}

fn run(seed: u64) -> Totals {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let binding_memory = rng.random_range(4_096..96 * 1024);
    let config = EndpointConfig {
        incarnation: 1,
        max_bindings: 2,
        slots_per_binding: rng.random_range(1..=4),
        binding_memory,
        memory: 1 << 20,
        carrier_memory: 1 << 19,
        stalled_after: Duration::from_millis(300),
        binding_idle: Duration::from_micros(rng.random_range(1_000..50_000)),
        max_running: 1,
        timing: Timing::default(),
    };
    let base = Instant::now();
    let endpoint = ServerEndpoint::new(config.clone(), base, Box::new(tiercel_proto::bind::InsecureChallenges));
    let slots = config.slots_per_binding as usize;
    let mut s = Scenario {
        chunk: [7, 100, 1500, 70_000][rng.random_range(0..4)],
        largest: binding_memory * 2,
        rng,
        base,
        now: 0,
        order: 0,
        events: BinaryHeap::new(),
        config,
        endpoint,
        conn: 0,
        server: None,
        unwritten: VecDeque::new(),
        to_server: VecDeque::new(),
        to_client: VecDeque::new(),
        client_frames: Deframer::new(256, usize::MAX >> 8),
        slots: (0..slots).map(|_| None).collect(),
        seqs: vec![0; slots],
        bound: None,
        next_id: 0,
        calls_left: 40,
        ran: HashMap::new(),
        lens: HashMap::new(),
        outcomes: HashMap::new(),
        draining: false,
    };
    for _ in 0..slots {
        s.push(0, Event::Call);
    }
    s.push(1_000, Event::Sweep);
    if s.rng.random_bool(0.3) {
        let at = s.rng.random_range(100..20_000);
        s.push(at, Event::Reset);
    }
    if s.rng.random_bool(0.2) {
        let at = s.rng.random_range(100..20_000);
        s.push(at, Event::Crash);
    }
    if s.rng.random_bool(0.1) {
        let at = s.rng.random_range(1_000..30_000);
        s.push(at, Event::Drain);
    }
    let mut steps = 0;
    while let Some(Reverse((at, _, event))) = s.events.pop() {
        steps += 1;
        assert!(steps < 200_000, "seed {seed}: the scenario does not end");
        s.now = at;
        match event {
            Event::ToServer => s.server_reads(),
            Event::ToClient => s.client_reads(),
            Event::Finish { incarnation, conn, id } => s.finish(incarnation, conn, id),
            Event::Reset => {
                s.lose_connection();
                s.push(10, Event::Call);
            }
            Event::Crash => {
                // Whatever ran in the old process is gone with it.
                s.lose_connection();
                let incarnation = s.endpoint.incarnation() + 1;
                s.config.incarnation = incarnation;
                s.endpoint =
                    ServerEndpoint::new(s.config.clone(), s.at(), Box::new(tiercel_proto::bind::InsecureChallenges));
                // The new process is not shutting down.
                s.draining = false;
                s.push(10, Event::Call);
            }
            Event::Drain => {
                s.draining = true;
                s.endpoint.drain();
            }
            Event::Sweep => s.sweep(),
            Event::Call => {
                let free = s.slots.iter().filter(|w| w.is_none()).count();
                for _ in 0..free {
                    s.client_call();
                }
            }
        }
        // Nothing charged beyond the budgets, and nothing left charged without a connection.
        assert!(s.endpoint.memory() <= s.config.carrier_memory);
        if s.server.is_none() {
            assert_eq!(s.endpoint.memory(), 0, "seed {seed}: memory left charged");
        }
    }
    assert!(s.slots.iter().all(Option::is_none), "seed {seed}: a call never ended");
    s.lose_connection();
    assert_eq!((s.endpoint.memory(), s.endpoint.len(), s.endpoint.running()), (0, 0, 0), "seed {seed}");
    let mut totals = Totals::default();
    for (id, outcome) in &s.outcomes {
        let runs = s.ran.get(id).copied().unwrap_or(0);
        match outcome {
            Outcome::Ran => assert_eq!(runs, 1, "seed {seed}: call {id}"),
            Outcome::Refused | Outcome::TooLarge | Outcome::NotSent => {
                assert_eq!(runs, 0, "seed {seed}: call {id} said never ran")
            }
            Outcome::MayHaveRun => assert!(runs <= 1, "seed {seed}: call {id}"),
        }
        let len = s.lens[id];
        totals.grown += u64::from(*outcome == Outcome::Ran && len > 4096);
        let too_large = PREFIX_LEN + HEADER_LEN + len > s.config.binding_memory;
        // Refused `TooLarge` exactly when more than its binding may ever hold.
        assert_eq!(
            *outcome == Outcome::TooLarge,
            too_large && *outcome != Outcome::NotSent && *outcome != Outcome::MayHaveRun,
            "seed {seed}: call {id} of {len} bytes: {outcome:?}"
        );
        totals.too_large += u64::from(*outcome == Outcome::TooLarge);
        if too_large {
            assert_eq!(runs, 0, "seed {seed}: call {id} of {len} bytes ran past its binding's budget");
        }
        match outcome {
            Outcome::Ran => totals.ran += 1,
            Outcome::Refused | Outcome::TooLarge => totals.refused += 1,
            Outcome::NotSent => totals.not_sent += 1,
            Outcome::MayHaveRun => totals.may_have_run += 1,
        }
    }
    assert_eq!(s.outcomes.len() as u64, s.next_id, "seed {seed}: every call made ended");
    totals
}

#[test]
fn stream_scenarios_keep_every_promise() {
    let n: u64 = std::env::var("TIERCEL_SIM_SCENARIOS").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    let mut all = Totals::default();
    for seed in 0..n {
        let t = run(seed);
        all.ran += t.ran;
        all.refused += t.refused;
        all.not_sent += t.not_sent;
        all.may_have_run += t.may_have_run;
        all.grown += t.grown;
        all.too_large += t.too_large;
    }
    println!("{n} stream scenarios: {all:?}");
    // The scenarios reach every outcome.
    assert!(all.ran > 0 && all.refused > 0 && all.not_sent > 0 && all.may_have_run > 0, "{all:?}");
    assert!(all.grown > 0 && all.too_large > 0, "{all:?}");
}
