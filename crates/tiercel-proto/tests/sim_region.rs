//! Deterministic simulation of the shared-memory transport on virtual time.
//!
//! Each seed builds a scenario: one server process serving two regions (two bindings) with one to
//! three threads. An honest client makes calls of random sizes on a few slots of its region, some
//! with deadlines it gives up at; a hostile client writes any word and any byte of its own region
//! at any moment, including while the server reads or runs its calls. By seed, the budgets are
//! small enough to refuse calls, the server is stopped for longer than `dead_after` and resumes,
//! crashes, or begins to drain. The server's decisions are the shipped ones: a slot's words read
//! once (`CallWords::read`), the endpoint's `slot_call` (validation, room in the budgets first,
//! cancellation, admission), `write_result` and the slot handshake of `tiercel_proto::shm`; the
//! client's are `CallWords::write`, `client_publish`, `validate_result`, `client_cancel` and
//! `Liveness`, as tiercel's shared-memory client makes them. The harness only moves time, copies
//! bytes and runs procedures.
//!
//! Every scenario asserts that each honest call ends once, with its own result or an error that
//! says truly whether it may have run; that none runs twice, none runs after the server began to
//! drain, and none given up before the server read it runs; that the server never finds the honest
//! client's calls malformed and never reads or writes past a slot whatever the hostile client
//! writes; that a binding's memory never passes its budget; and that all memory comes back when the
//! bindings are released. `TIERCEL_SIM_SCENARIOS` sets the number of seeds (default 10,000).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tiercel_proto::endpoint::{Binding, Carrier, EndpointConfig, ServerEndpoint, SlotStep};
use tiercel_proto::shm::{self as proto, slot, CallWords, Liveness, PAGE};
use tiercel_proto::wire::Status;
use tiercel_proto::Timing;

type B = Binding<u8, ()>;

/// Bytes of data in each slot.
const CAPACITY: usize = 3 * PAGE;
/// Words of a slot's control page the simulation models.
const WORDS: usize = 8;
/// Procedures the server's interface has (a call of another is answered `UnknownProcedure`).
const PROCEDURES: u32 = 3;
/// Virtual microseconds between the server's heartbeats.
const BEAT: u64 = 100;
/// The client's `dead_after`, in virtual microseconds.
const DEAD_AFTER: u64 = 5_000;

/// One region: its slots' control words and data, as both processes see them.
struct Region {
    binding: Arc<B>,
    words: Vec<AtomicU32>,
    data: Vec<Vec<u8>>,
    /// Bytes of each slot the server holds charged (grown as calls need, as the server's books do).
    held: Vec<usize>,
}

impl Region {
    fn new(binding: Arc<B>, slots: usize) -> Region {
        Region {
            binding,
            words: (0..slots * WORDS).map(|_| AtomicU32::new(0)).collect(),
            data: vec![vec![0; CAPACITY]; slots],
            held: vec![0; slots],
        }
    }

    fn slots(&self) -> usize {
        self.data.len()
    }

    /// Slot `i`'s word at byte offset `at` of its control words.
    fn word(&self, i: usize, at: usize) -> &AtomicU32 {
        &self.words[i * WORDS + at / 4]
    }
}

/// What became of an honest call, as its caller is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Its result, checked.
    Ran,
    /// Answered `BadProcedure`: it never ran.
    NoProcedure,
    /// Refused `Busy`: it never ran.
    Refused,
    /// Given up: its deadline passed, the server's heartbeat stood still, or the server's process
    /// was gone. It may have run.
    GaveUp,
}

/// The honest client's call in a slot.
struct Pending {
    id: u64,
    procedure: u32,
    len: usize,
    deadline: Option<u64>,
    liveness: Liveness,
    /// Given up, and told so: the slot is taken back once the server answers.
    abandoned: bool,
}

#[derive(PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Event {
    /// The honest client makes a call on slot `0`.
    Call(usize),
    /// The honest client looks at slot `0` for its result.
    Look(usize),
    /// Server thread `0` looks for a call to serve.
    Serve(usize),
    /// Server thread `0` finishes the call it runs.
    Finish(usize),
    /// The hostile client writes something into its region.
    Scribble,
    /// The server's heartbeat.
    Beat,
    /// The server process stops (as with SIGSTOP) for this many microseconds.
    Stop(u64),
    /// It runs again.
    Resume,
    /// The server process dies.
    Crash,
    /// The server begins to shut down.
    Drain,
}

/// A call a server thread runs: region (0 honest, 1 hostile), slot, its arguments' private copy.
struct Running {
    region: usize,
    slot: usize,
    procedure: u16,
    args: Vec<u8>,
}

struct Scenario {
    rng: ChaCha8Rng,
    base: Instant,
    now: u64,
    order: u64,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    config: EndpointConfig,
    endpoint: ServerEndpoint<u8, ()>,
    regions: [Region; 2],
    heartbeat: AtomicU32,
    /// Slots a server thread has taken (and not yet answered).
    taken: HashSet<(usize, usize)>,
    threads: Vec<Option<Running>>,
    stopped: bool,
    /// When the server last ran again after being stopped.
    resumed_at: u64,
    crashed: bool,
    /// Virtual time the server began to drain.
    drained_at: Option<u64>,
    pending: Vec<Option<Pending>>,
    next_id: u64,
    calls_left: u32,
    /// Honest calls run, by id: how many times.
    ran: HashMap<u64, u32>,
    /// Honest calls given up before the server read them, by id.
    cancelled_unread: HashSet<u64>,
    outcomes: HashMap<u64, Outcome>,
    totals: Totals,
}

/// Totals over scenarios, for the summary.
#[derive(Default, Debug)]
struct Totals {
    ran: u64,
    refused: u64,
    gave_up: u64,
    /// Honest calls refused `TooLarge`: more than their binding's budgets could ever hold.
    too_large: u64,
    /// Honest calls answered `Cancelled`, unrun, after their client gave them up.
    cancelled: u64,
    /// Calls of the hostile client the server ran, refused as malformed, and refused for room.
    hostile_ran: u64,
    hostile_malformed: u64,
    hostile_busy: u64,
}

impl Scenario {
    fn push(&mut self, after: u64, event: Event) {
        self.order += 1;
        self.events.push(Reverse((self.now + after, self.order, event)));
    }

    fn at(&self) -> Instant {
        self.base + Duration::from_micros(self.now)
    }

    /// The bytes of honest call `id`'s arguments.
    fn args(id: u64, len: usize) -> Vec<u8> {
        let mut a: Vec<u8> = (0..len).map(|i| (id as usize * 31 + i) as u8).collect();
        a[..8].copy_from_slice(&id.to_le_bytes());
        a
    }

    /// What every procedure returns for `args`.
    fn result(args: &[u8]) -> Vec<u8> {
        args.iter().rev().map(|b| b ^ 0x5a).collect()
    }

    fn call(&mut self, i: usize) {
        if self.calls_left == 0 {
            return;
        }
        self.calls_left -= 1;
        let id = self.next_id;
        self.next_id += 1;
        let len =
            if self.rng.random_bool(0.2) { self.rng.random_range(8..=CAPACITY) } else { self.rng.random_range(8..200) };
        let procedure = self.rng.random_range(0..=PROCEDURES);
        let deadline = self.rng.random_bool(0.2).then(|| self.now + self.rng.random_range(1..3_000));
        let r = &mut self.regions[0];
        r.data[i][..len].copy_from_slice(&Self::args(id, len));
        let words = CallWords { procedure, len: len as u32, deadline, cancelled: false };
        words.write(|at| r.word(i, at));
        let (sleeping, doorbell) = (AtomicU32::new(0), AtomicU32::new(0));
        proto::client_publish(r.word(i, slot::STATE), &sleeping, &doorbell);
        let liveness = Liveness::new(self.heartbeat.load(Ordering::Acquire), self.at());
        self.pending[i] = Some(Pending { id, procedure, len, deadline, liveness, abandoned: false });
        let look = self.rng.random_range(1..50);
        self.push(look, Event::Look(i));
    }

    fn end(&mut self, id: u64, outcome: Outcome) {
        let seen = self.outcomes.insert(id, outcome);
        assert!(seen.is_none(), "call {id} ended twice: {seen:?} then {outcome:?}");
        match outcome {
            Outcome::Ran => self.totals.ran += 1,
            Outcome::Refused | Outcome::NoProcedure => self.totals.refused += 1,
            Outcome::GaveUp => self.totals.gave_up += 1,
        }
    }

    fn look(&mut self, i: usize) {
        let Some(mut call) = self.pending[i].take() else { return };
        let r = &self.regions[0];
        let state = r.word(i, slot::STATE);
        if proto::client_done(state) {
            let len = r.word(i, slot::LEN).load(Ordering::Relaxed);
            let status = r.word(i, slot::STATUS).load(Ordering::Relaxed);
            let (len, status) = proto::validate_result(len, status, CAPACITY).expect("the server's result words");
            let result = r.data[i][..len].to_vec();
            if call.abandoned {
                // Its caller was told already; the slot is the client's again.
                if status == Status::Cancelled {
                    self.totals.cancelled += 1;
                    assert!(!self.ran.contains_key(&call.id), "call {} answered Cancelled ran", call.id);
                }
            } else {
                let outcome = match status {
                    Status::Ok => {
                        assert_eq!(result, Self::result(&Self::args(call.id, call.len)), "call {}'s result", call.id);
                        assert_eq!(self.ran.get(&call.id), Some(&1), "call {} answered, not run once", call.id);
                        Outcome::Ran
                    }
                    Status::UnknownProcedure => {
                        assert_eq!(call.procedure, PROCEDURES, "procedure {} is served", call.procedure);
                        Outcome::NoProcedure
                    }
                    Status::Busy => Outcome::Refused,
                    Status::TooLarge => {
                        // Refused so only when its pages are more than the budgets could ever hold.
                        let pages = call.len.max(1).next_multiple_of(PAGE);
                        assert!(
                            pages > r.binding.memory_most(),
                            "call {} of {} bytes refused TooLarge",
                            call.id,
                            call.len
                        );
                        self.totals.too_large += 1;
                        Outcome::Refused
                    }
                    s => panic!("an honest call ({} bytes, procedure {}) answered {s:?}", call.len, call.procedure),
                };
                if outcome != Outcome::Ran {
                    assert!(!self.ran.contains_key(&call.id), "call {} ran but was told {outcome:?}", call.id);
                }
                self.end(call.id, outcome);
            }
            let next = self.rng.random_range(1..100);
            self.push(next, Event::Call(i));
            return;
        }
        if call.abandoned && self.crashed {
            // Nobody will answer: the slot goes with the region.
            return;
        }
        if !call.abandoned {
            // Still waiting: the client's checks, as `check_alive` makes them.
            let beat = self.heartbeat.load(Ordering::Acquire);
            let dead_after = Duration::from_micros(DEAD_AFTER);
            let late = call.deadline.is_some_and(|d| self.now >= d);
            if late || self.crashed || !call.liveness.alive(beat, self.at(), dead_after) {
                if !late && !self.crashed {
                    // The heartbeat moves again within a beat of the server's resuming.
                    let stopped = self.stopped || self.now <= self.resumed_at + BEAT;
                    assert!(stopped, "the heartbeat stood still for dead_after while the server ran");
                }
                proto::client_cancel(|at| self.regions[0].word(i, at));
                call.abandoned = true;
                // Unread by the server so far: from now on it must not run.
                if !self.taken.contains(&(0, i)) && !self.ran.contains_key(&call.id) {
                    self.cancelled_unread.insert(call.id);
                }
                self.end(call.id, Outcome::GaveUp);
                if self.crashed {
                    // Nobody will answer: the slot goes with the region.
                    return;
                }
            }
        }
        self.pending[i] = Some(call);
        let next = self.rng.random_range(1..200);
        self.push(next, Event::Look(i));
    }

    /// Server thread `t` looks for a call in the slots, as a worker scans them.
    fn serve(&mut self, t: usize) {
        if self.crashed {
            return;
        }
        if self.stopped || self.threads[t].is_some() {
            return self.push(50, Event::Serve(t));
        }
        let region = self.rng.random_range(0..2);
        let start = self.rng.random_range(0..self.regions[region].slots());
        let n = self.regions[region].slots();
        let found = (0..n).map(|k| (start + k) % n).find(|&i| {
            !self.taken.contains(&(region, i)) && proto::server_has_call(self.regions[region].word(i, slot::STATE))
        });
        if let Some(i) = found {
            self.take(t, region, i);
        }
        let next = self.rng.random_range(1..100);
        self.push(next, Event::Serve(t));
    }

    fn take(&mut self, t: usize, region: usize, i: usize) {
        let at = self.at();
        let r = &mut self.regions[region];
        let words = CallWords::read(|at| r.word(i, at));
        let (held, binding) = (&mut r.held[i], &r.binding);
        let room = |n: usize| {
            let pages = n.max(1).next_multiple_of(PAGE);
            if pages <= *held || binding.reserve(pages - *held) {
                *held = (*held).max(pages);
                Ok(())
            } else {
                Err(pages)
            }
        };
        let step = self.endpoint.slot_call(binding, &words, CAPACITY, room, || at);
        assert!(r.binding.memory() <= r.binding.memory_limit());
        let status = match step {
            SlotStep::Run(call) => {
                assert!(self.drained_at.is_none(), "a call admitted after the server began to drain");
                // The arguments' private copy: what the client wrote after this is not read.
                let args = r.data[i][..call.len].to_vec();
                if region == 0 {
                    let id = u64::from_le_bytes(args[..8].try_into().unwrap());
                    assert!(!self.cancelled_unread.contains(&id), "call {id}, given up unread, ran");
                } else {
                    self.totals.hostile_ran += 1;
                }
                self.taken.insert((region, i));
                self.threads[t] = Some(Running { region, slot: i, procedure: call.procedure, args });
                let runs = self.rng.random_range(1..2_000);
                return self.push(runs, Event::Finish(t));
            }
            SlotStep::Malformed => {
                assert!(region == 1, "the honest client's call found malformed: {words:?}");
                self.totals.hostile_malformed += 1;
                Status::BadArguments
            }
            SlotStep::Busy => {
                if region == 1 {
                    self.totals.hostile_busy += 1;
                }
                Status::Busy
            }
            SlotStep::TooLarge => {
                if region == 1 {
                    self.totals.hostile_busy += 1;
                }
                Status::TooLarge
            }
            SlotStep::Cancelled => Status::Cancelled,
        };
        proto::write_result(|at| r.word(i, at), 0, status);
        proto::server_publish(r.word(i, slot::STATE), r.word(i, slot::CLIENT_WAITING));
    }

    fn finish(&mut self, t: usize) {
        if self.crashed {
            return;
        }
        if self.stopped {
            return self.push(50, Event::Finish(t));
        }
        let Running { region, slot: i, procedure, args } = self.threads[t].take().expect("a call running");
        if region == 0 && u32::from(procedure) < PROCEDURES {
            let id = u64::from_le_bytes(args[..8].try_into().unwrap());
            *self.ran.entry(id).or_default() += 1;
            assert_eq!(self.ran[&id], 1, "call {id} ran twice");
        }
        let (status, result) = if u32::from(procedure) < PROCEDURES {
            (Status::Ok, Self::result(&args))
        } else {
            (Status::UnknownProcedure, Vec::new())
        };
        let r = &mut self.regions[region];
        r.data[i][..result.len()].copy_from_slice(&result);
        proto::write_result(|at| r.word(i, at), result.len(), status);
        proto::server_publish(r.word(i, slot::STATE), r.word(i, slot::CLIENT_WAITING));
        self.taken.remove(&(region, i));
    }

    /// The hostile client writes a word or bytes of its region, or makes a well-formed call.
    fn scribble(&mut self) {
        let r = &mut self.regions[1];
        let i = self.rng.random_range(0..r.data.len());
        match self.rng.random_range(0..4) {
            0 => {
                let at = 4 * self.rng.random_range(0..WORDS);
                let value = match self.rng.random_range(0..3) {
                    0 => self.rng.random_range(0..4),
                    1 => self.rng.random_range(0..=CAPACITY as u32 + 1),
                    _ => self.rng.random(),
                };
                r.word(i, at).store(value, Ordering::Relaxed);
            }
            1 => {
                let from = self.rng.random_range(0..CAPACITY);
                let to = self.rng.random_range(from..=CAPACITY);
                self.rng.fill(&mut r.data[i][from..to]);
            }
            _ => {
                let len = self.rng.random_range(0..=CAPACITY as u32);
                let words = CallWords {
                    procedure: self.rng.random_range(0..=PROCEDURES),
                    len,
                    deadline: None,
                    cancelled: false,
                };
                words.write(|at| r.word(i, at));
                r.word(i, slot::STATE).store(proto::state::CALL, Ordering::Release);
            }
        }
        if !self.crashed {
            let next = self.rng.random_range(1..300);
            self.push(next, Event::Scribble);
        }
    }
}

fn run(seed: u64) -> Totals {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let config = EndpointConfig {
        incarnation: 1,
        max_bindings: 2,
        slots_per_binding: rng.random_range(1..=4),
        binding_memory: [PAGE, 2 * PAGE, 4 * PAGE, 1 << 20][rng.random_range(0..4)],
        memory: 1 << 20,
        carrier_memory: [3 * PAGE, 6 * PAGE, 1 << 19][rng.random_range(0..3)],
        stalled_after: Duration::from_millis(300),
        binding_idle: Duration::from_secs(600),
        max_running: 1,
        timing: Timing::default(),
    };
    let base = Instant::now();
    let endpoint = ServerEndpoint::new(config.clone(), base, Box::new(tiercel_proto::bind::InsecureChallenges));
    let slots = config.slots_per_binding as usize;
    let honest = endpoint.connect(Carrier::Region, (), base).expect("room for the honest binding");
    let hostile = endpoint.connect(Carrier::Region, (), base).expect("room for the hostile binding");
    let threads = rng.random_range(1..=3);
    let mut s = Scenario {
        rng,
        base,
        now: 0,
        order: 0,
        events: BinaryHeap::new(),
        config,
        endpoint,
        regions: [Region::new(honest, slots), Region::new(hostile, slots)],
        heartbeat: AtomicU32::new(0),
        taken: HashSet::new(),
        threads: (0..threads).map(|_| None).collect(),
        stopped: false,
        resumed_at: 0,
        crashed: false,
        drained_at: None,
        pending: (0..slots).map(|_| None).collect(),
        next_id: 0,
        calls_left: 40,
        ran: HashMap::new(),
        cancelled_unread: HashSet::new(),
        outcomes: HashMap::new(),
        totals: Totals::default(),
    };
    for i in 0..slots {
        s.push(0, Event::Call(i));
    }
    for t in 0..threads {
        s.push(0, Event::Serve(t));
    }
    s.push(0, Event::Scribble);
    s.push(BEAT, Event::Beat);
    if s.rng.random_bool(0.15) {
        let (at, long) = (s.rng.random_range(100..20_000), s.rng.random_range(1_000..3 * DEAD_AFTER));
        s.push(at, Event::Stop(long));
    }
    if s.rng.random_bool(0.1) {
        let at = s.rng.random_range(100..30_000);
        s.push(at, Event::Crash);
    }
    if s.rng.random_bool(0.1) {
        let at = s.rng.random_range(1_000..30_000);
        s.push(at, Event::Drain);
    }
    let mut steps = 0;
    while let Some(Reverse((at, _, event))) = s.events.pop() {
        steps += 1;
        assert!(steps < 1_000_000, "seed {seed}: the scenario does not end");
        s.now = at;
        match event {
            Event::Call(i) => s.call(i),
            Event::Look(i) => s.look(i),
            Event::Serve(t) => s.serve(t),
            Event::Finish(t) => s.finish(t),
            Event::Scribble => s.scribble(),
            Event::Beat => {
                if !s.crashed {
                    if !s.stopped {
                        s.heartbeat.fetch_add(1, Ordering::Release);
                    }
                    s.push(BEAT, Event::Beat);
                }
            }
            Event::Stop(long) => {
                s.stopped = true;
                s.push(long, Event::Resume);
            }
            Event::Resume => {
                s.stopped = false;
                s.resumed_at = s.now;
            }
            Event::Crash => s.crashed = true,
            Event::Drain => {
                s.endpoint.drain();
                s.drained_at = Some(s.now);
            }
        }
        let waiting = s.pending.iter().any(|p| p.as_ref().is_some_and(|p| !p.abandoned));
        // Done when the honest client has made its calls and heard every one (the hostile client,
        // the heartbeat and the idle server threads would go on for ever).
        if s.calls_left == 0 && !waiting && s.outcomes.len() as u64 == s.next_id {
            break;
        }
        assert!(s.endpoint.memory() <= s.config.carrier_memory, "seed {seed}: past the carrier's share");
    }
    assert_eq!(s.outcomes.len() as u64, s.next_id, "seed {seed}: a call never ended");
    assert!(s.ran.values().all(|&n| n == 1), "seed {seed}: a call ran twice");
    // The bindings go (their clients leave, or the process died): their memory comes back.
    for r in &s.regions {
        r.binding.release(r.held.iter().sum());
        s.endpoint.release(&r.binding);
    }
    assert_eq!(s.endpoint.memory(), 0, "seed {seed}: memory left charged");
    s.totals
}

#[test]
fn region_scenarios_keep_every_promise() {
    let n: u64 = std::env::var("TIERCEL_SIM_SCENARIOS").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    let mut all = Totals::default();
    for seed in 0..n {
        let t = run(seed);
        all.ran += t.ran;
        all.refused += t.refused;
        all.too_large += t.too_large;
        all.gave_up += t.gave_up;
        all.cancelled += t.cancelled;
        all.hostile_ran += t.hostile_ran;
        all.hostile_malformed += t.hostile_malformed;
        all.hostile_busy += t.hostile_busy;
    }
    println!("{n} region scenarios: {all:?}");
    // The scenarios reach every outcome.
    assert!(all.ran > 0 && all.refused > 0 && all.gave_up > 0 && all.cancelled > 0, "{all:?}");
    assert!(all.too_large > 0 && all.too_large < all.refused, "both refusals: {all:?}");
    assert!(all.hostile_ran > 0 && all.hostile_malformed > 0 && all.hostile_busy > 0, "{all:?}");
}
