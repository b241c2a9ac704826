//! Deterministic simulation of the packet-exchange protocol on virtual time.
//!
//! Each seed builds a scenario: several client slots making calls of random sizes (single- and
//! multi-packet, both ways) to a server whose procedures take random time, over a network that loses,
//! duplicates, delays, reorders and corrupts packets; some scenarios let only one call run at once
//! (the others are refused as busy and retried), some crash the server, and some restart it with a
//! new incarnation; some give calls deadlines, and some have clients give calls up mid-way (a
//! dropped future), telling the server with a `Cancel` and going on to their next call on the
//! same slot. The server is the shipped `ServerEndpoint` (routing, the binding and slot table,
//! admission, and the dispatch of each packet, `call_step` and `control_step`, which the UDP server
//! runs too), the clients the shipped `ClientCall`; the harness only moves bytes and runs
//! procedures. Every scenario asserts that each call completes with the right result or fails with
//! an error, that no call body runs twice, and that a restarted server runs nothing sent to its
//! previous incarnation. Some scenarios make the binding a secure one: every packet both ways goes
//! in the sealed envelope `tiercel` uses (`tiercel_proto::seal`: its outer header, the sender's
//! packet numbers, the receiver's replay window, and `route_opened` on the server), with a keyed
//! authenticator standing in for the AEAD (the AEAD itself is `tiercel`'s, tested there), so that
//! duplicates and replays are dropped before the protocol sees them and a restarted server, with
//! new keys, opens nothing of the binding before. `TIERCEL_SIM_SCENARIOS` sets the number of seeds
//! (default 10,000).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tiercel_proto::bind::wire::features;
use tiercel_proto::client::{ClientCall, Failure, Handled, Outcome, Transmit};
use tiercel_proto::endpoint::{Binding, Caller, EndpointConfig, Fragment, Refusal, Route, ServerEndpoint, Step, Terms};
use tiercel_proto::fragment::{fragment_range, NARROW_WINDOW};
use tiercel_proto::seal::{Outer, ReplayWindow, SealType, OUTER_LEN, TAG_LEN};
use tiercel_proto::server::CallAction;
use tiercel_proto::wire::{checksum, flags, Header, Kind, Packet, Status, HEADER_LEN};
use tiercel_proto::Timing;

#[path = "sim/client.rs"]
mod client;
#[path = "sim/server.rs"]
mod server;

const TOKEN: u128 = 0xfeed_f00d;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Dest {
    Server,
    Client(usize),
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Deliver(Dest, Vec<u8>),
    Complete {
        incarnation: u64,
        slot: usize,
        seq: u32,
    },
    /// The client of `slot` gives call `seq` up, if it is still waiting for it.
    Abandon {
        slot: usize,
        seq: u32,
    },
}

struct Scenario {
    rng: ChaCha8Rng,
    base: Instant,
    now: u64,
    order: u64,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    loss: f64,
    dup: f64,
    corrupt: f64,
    corrupted: u64,
    /// New calls the endpoint refused as busy.
    busy: u64,
    /// Packets answered with an address challenge (a slot's first, and after a restart).
    challenges: u64,
    delay: (u64, u64),
    timing: Timing,
    frag: usize,
    /// The largest message of a big call: 20 fragments, or in some scenarios more fragments than
    /// the widest window.
    largest: usize,
    server: Server,
    clients: Vec<Client>,
    crash_at: Option<u64>,
    /// When the server crashed, once it has.
    crashed_at: Option<u64>,
    restart_after: Option<u64>,
    packets: u64,
    /// Each call gets a deadline this far ahead (a random time within the range).
    deadlines: Option<(u64, u64)>,
    /// The chance that a client gives a call up at a random time before its result.
    abandon: f64,
    /// Result fragments received straight into their place (odd clients).
    landed: u64,
    /// Call fragments the server received straight into their place (odd slots' calls).
    server_landed: u64,
    /// Results of several fragments sent from behind other bytes in their buffer, as a procedure
    /// run in place of its arguments leaves them (odd slots' calls).
    in_place: u64,
    /// The clients' side of a secure binding's keys (none: a plain binding).
    client_seal: Option<Seal>,
    /// Sealed packets dropped unopened: corrupted, duplicated, or of another incarnation's keys.
    unopened: u64,
}

/// One side's keys of a secure binding, as the scenario models them: `key` stands for the AEAD's
/// keys (a restarted server has new ones), `counter` numbers the packets the side sends, and
/// `window` drops the numbers the side has received before.
struct Seal {
    key: u64,
    counter: u64,
    window: ReplayWindow,
}

impl Seal {
    fn new(key: u64) -> Seal {
        Seal { key, counter: 0, window: ReplayWindow::new() }
    }

    /// The stand-in for the AEAD's tag: an authenticator keyed by `key`, which a changed byte never
    /// passes (CRC-32C catches every burst of up to 32 bits).
    fn tag(&self, bytes: &[u8]) -> [u8; TAG_LEN] {
        let sum = checksum([&self.key.to_le_bytes()[..], bytes]).to_le_bytes();
        [sum, sum, sum, sum].concat().try_into().expect("16 bytes")
    }

    /// `bytes` in the envelope of binding `index`, numbered.
    fn seal(&mut self, index: u32, bytes: &[u8]) -> Vec<u8> {
        let outer = Outer { kind: SealType::Data, index, counter: self.counter }.to_bytes();
        self.counter += 1;
        let mut v = [&outer[..], bytes].concat();
        let tag = self.tag(&v);
        v.extend_from_slice(&tag);
        v
    }

    /// The packet in `bytes`, if they are binding `index`'s envelope, authentic, and a number the
    /// window has not seen.
    fn open(&mut self, index: u32, bytes: &[u8]) -> Option<Vec<u8>> {
        let outer = Outer::parse(bytes).ok()?;
        let (body, tag) = bytes.split_at(bytes.len() - TAG_LEN);
        let ours = outer.kind == SealType::Data && outer.index == index && self.tag(body)[..] == tag[..];
        if !ours || !self.window.take(outer.counter) {
            return None;
        }
        Some(body[OUTER_LEN..].to_vec())
    }
}

struct Server {
    alive: bool,
    endpoint: ServerEndpoint<usize, ()>,
    /// The one binding, with a slot for each client.
    binding: Arc<Binding<usize, ()>>,
    /// Per slot, the call running: the packet that started it and its arguments.
    running: Vec<Option<(Vec<u8>, Vec<u8>)>>,
    service: (u64, u64),
    /// The call (slot, seq) whose next fragment the server receives into place, as a UDP worker
    /// does after taking a fragment of it: set for odd slots only, so that even slots' calls are
    /// reassembled the usual way.
    expected: Option<(u32, u32)>,
    /// The server's side of a secure binding's keys (none: a plain binding).
    seal: Option<Seal>,
}

impl Server {
    /// A server of incarnation `incarnation` that admits `max_running` calls at once, with one
    /// binding of `slots` slots granted with `features`. Its token is the same in every incarnation, so that the
    /// incarnation check alone must refuse packets from before a restart. `secure`: a secure
    /// binding, its packets sealed with this incarnation's keys.
    #[allow(clippy::too_many_arguments)]
    fn new(
        incarnation: u64,
        slots: usize,
        frag: usize,
        features: u16,
        timing: Timing,
        max_running: usize,
        base: Instant,
        secure: bool,
    ) -> Server {
        let config = EndpointConfig {
            incarnation,
            max_bindings: 1,
            slots_per_binding: slots as u32,
            binding_memory: 1 << 20,
            memory: 1 << 20,
            carrier_memory: 1 << 20,
            stalled_after: Duration::from_secs(3600),
            binding_idle: Duration::from_secs(3600),
            max_running,
            timing,
        };
        let endpoint = ServerEndpoint::new(config, base, Box::new(tiercel_proto::bind::InsecureChallenges));
        let terms = Terms { max_datagram: HEADER_LEN + frag, features };
        let (binding, _) = if secure {
            let caller = Caller::Key { address: "127.0.0.1:1".parse().expect("an address"), key: [7; 32] };
            endpoint.grant_from(0, caller, 0, (), TOKEN, terms, base)
        } else {
            endpoint.grant(0, 0, (), TOKEN, terms, base)
        }
        .expect("an empty table has room");
        // Each incarnation's handshake made other keys.
        let seal = secure.then(|| Seal::new(incarnation));
        Server { alive: true, endpoint, binding, running: vec![None; slots], service: (0, 0), expected: None, seal }
    }
}

/// A packet with its checksum trailer.
fn sealed(mut bytes: Vec<u8>) -> Vec<u8> {
    let sum = checksum([&bytes[..]]);
    bytes.extend_from_slice(&sum.to_le_bytes());
    bytes
}

struct Client {
    call: ClientCall,
    seq: u32,
    remaining: u32,
    message: Vec<u8>,
    expected: Vec<u8>,
    done: bool,
    /// Each call's outcome, with the virtual time it ended.
    outcomes: Vec<(u64, Result<(), Failure>)>,
    /// Calls given up before their result (cancelled).
    abandoned: u32,
}

fn result_for(args: &[u8]) -> Vec<u8> {
    let len = u32::from_le_bytes(args[..4].try_into().unwrap()) as usize;
    let sum = args.iter().fold(0u8, |a, &b| a.wrapping_mul(31).wrapping_add(b));
    (0..len).map(|i| sum.wrapping_add(i as u8)).collect()
}

struct Log {
    executions: HashMap<(usize, u32), u32>,
    by_incarnation: HashMap<u64, u32>,
}

impl Scenario {
    fn at(&self, t: u64) -> Instant {
        self.base + Duration::from_nanos(t)
    }

    fn push(&mut self, t: u64, e: Event) {
        self.order += 1;
        self.events.push(Reverse((t, self.order, e)));
    }

    /// Sends a packet (header and payload, checksummed; sealed, on a secure binding) through the
    /// network.
    fn send(&mut self, dest: Dest, bytes: Vec<u8>) {
        self.packets += 1;
        let index = self.server.binding.id;
        let mut wire = sealed(bytes);
        let side = match dest {
            Dest::Server => self.client_seal.as_mut(),
            Dest::Client(_) => self.server.seal.as_mut(),
        };
        if let Some(side) = side {
            wire = side.seal(index, &wire);
        }
        if self.rng.random_bool(self.loss) {
            return;
        }
        let copies = if self.rng.random_bool(self.dup) { 2 } else { 1 };
        for _ in 0..copies {
            let mut bytes = wire.clone();
            if self.rng.random_bool(self.corrupt) {
                let i = self.rng.random_range(0..bytes.len());
                bytes[i] ^= self.rng.random_range(1..=255u8);
                self.corrupted += 1;
            }
            let d = self.delay.0 + self.rng.random_range(0..=self.delay.1);
            self.push(self.now + d, Event::Deliver(dest, bytes));
        }
    }

    fn packet(h: Header, payload: &[u8]) -> Vec<u8> {
        let mut h = h;
        h.flags |= flags::CHECKSUM;
        h.payload_len = payload.len() as u32;
        let mut v = h.to_bytes().to_vec();
        v.extend_from_slice(payload);
        v
    }

    fn nanos(&self, i: Instant) -> u64 {
        i.saturating_duration_since(self.base).as_nanos() as u64
    }
}

/// Totals of a run of scenarios.
#[derive(Default)]
struct Totals {
    ok: usize,
    failed: usize,
    late: usize,
    abandoned: usize,
    packets: u64,
    corrupted: u64,
    busy: u64,
    challenges: u64,
    landed: u64,
    server_landed: u64,
    in_place: u64,
    /// Scenarios whose binding's window reached past what an acknowledgement's mask covers, with
    /// messages longer than that.
    wide: u64,
    /// Scenarios of a secure binding, and the sealed packets they dropped unopened.
    secure: u64,
    unopened: u64,
}

fn run(seed: u64) -> Totals {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n_clients = rng.random_range(1..=4usize);
    let frag = rng.random_range(16..=256usize);
    let timing = Timing {
        retransmit_initial: Duration::from_millis(rng.random_range(5..=30)),
        retransmit_min: Duration::from_millis(rng.random_range(1..=5)),
        retransmit_max: Duration::from_millis(500),
        probe_interval: Duration::from_millis(200),
        dead_after: Duration::from_secs(5),
        window: rng.random_range(1..=64),
        max_message: 64 << 10,
    };
    let lossy = rng.random_bool(0.8);
    let loss = if lossy { rng.random_range(0.0..0.15) } else { 0.0 };
    let dup = if lossy { rng.random_range(0.0..0.1) } else { 0.0 };
    let corrupt = if lossy { rng.random_range(0.0..0.05) } else { 0.0 };
    let delay = (rng.random_range(10_000..2_000_000u64), rng.random_range(0..5_000_000u64));
    let long_calls = rng.random_bool(0.2);
    let service = if long_calls { (0, 3_000_000_000) } else { (0, 2_000_000) };
    // An overloaded server: one call runs at a time, and new calls on other slots are refused as
    // busy until it finishes. Its calls are short, so that every caller gets its turn well within
    // `dead_after` (with calls of seconds, a caller can be refused for longer and fail as overloaded,
    // which is what the client is meant to report then, but not what this scenario tests).
    let max_running = if !long_calls && rng.random_bool(0.25) { 1 } else { usize::MAX };
    let crash = rng.random_bool(0.1);
    let crash_at = crash.then(|| rng.random_range(0..200_000_000u64));
    let restart_after = (crash && rng.random_bool(0.5)).then(|| rng.random_range(0..2_000_000_000u64));
    let deadlines = rng.random_bool(0.2).then(|| (1_000_000, rng.random_range(2_000_000..4_000_000_000u64)));
    let abandon = if rng.random_bool(0.2) { rng.random_range(0.1..0.5) } else { 0.0 };
    // A client and server that both speak wide windows, or a binding limited to narrow ones.
    let granted = if rng.random_bool(0.5) { features::ALL } else { features::ALL & !features::WIDE_WINDOW };
    let largest = if rng.random_bool(0.2) { (frag * 300).min(60 << 10) } else { frag * 20 };
    let secure = rng.random_bool(0.3);
    let base = Instant::now();
    let clients = (0..n_clients)
        .map(|_| Client {
            call: ClientCall::new(timing, frag, features::max_window(granted), base),
            seq: rng.random_range(0..u32::MAX),
            remaining: rng.random_range(1..=6),
            message: Vec::new(),
            expected: Vec::new(),
            done: false,
            outcomes: Vec::new(),
            abandoned: 0,
        })
        .collect();
    let mut s = Scenario {
        rng,
        base,
        now: 0,
        order: 0,
        events: BinaryHeap::new(),
        loss,
        dup,
        corrupt,
        corrupted: 0,
        busy: 0,
        challenges: 0,
        delay,
        timing,
        frag,
        largest,
        server: Server { service, ..Server::new(1, n_clients, frag, granted, timing, max_running, base, secure) },
        clients,
        crash_at,
        crashed_at: None,
        restart_after,
        packets: 0,
        deadlines,
        abandon,
        landed: 0,
        server_landed: 0,
        in_place: 0,
        client_seal: secure.then(|| Seal::new(1)),
        unopened: 0,
    };
    let mut log = Log { executions: HashMap::new(), by_incarnation: HashMap::new() };
    for k in 0..n_clients {
        s.client_start(k);
    }
    let limit = 3_600_000_000_000u64;
    loop {
        if s.clients.iter().all(|c| c.done) {
            break;
        }
        let next_event = s.events.peek().map(|Reverse((t, _, _))| *t);
        let next_timer = (0..n_clients)
            .filter(|&k| !s.clients[k].done)
            .filter_map(|k| s.clients[k].call.poll_timeout().map(|t| (s.nanos(t), k)))
            .min();
        let next_crash = s.crash_at.filter(|_| s.server.alive && s.server.endpoint.incarnation() == 1);
        let candidates = [next_event, next_timer.map(|t| t.0), next_crash];
        let t = candidates.iter().flatten().copied().min().expect("a live scenario always has a next step");
        assert!(t < limit, "seed {seed}: scenario did not finish");
        s.now = s.now.max(t);
        if next_crash == Some(t) {
            s.server.alive = false;
            s.crashed_at = Some(t);
            if let Some(after) = s.restart_after {
                // Restart later with a new incarnation and empty state.
                s.crash_at = None;
                let at = s.now + after;
                s.push(at, Event::Complete { incarnation: u64::MAX, slot: 0, seq: 0 });
            } else {
                s.crash_at = None;
            }
            continue;
        }
        if next_timer.map(|x| x.0) == Some(t) && next_event != Some(t) {
            s.client_timeout(next_timer.unwrap().1);
            continue;
        }
        let Reverse((_, _, e)) = s.events.pop().unwrap();
        match e {
            Event::Complete { incarnation: u64::MAX, .. } => {
                let now = s.at(s.now);
                s.server =
                    Server { service, ..Server::new(2, n_clients, frag, granted, timing, max_running, now, secure) };
            }
            Event::Complete { incarnation, slot, seq } => s.complete(incarnation, slot, seq),
            Event::Abandon { slot, seq } => s.client_abandon(slot, seq),
            Event::Deliver(Dest::Server, b) => s.server_receive(b, &mut log),
            Event::Deliver(Dest::Client(k), b) => s.client_receive(k, b),
        }
    }
    assert_eq!(log.by_incarnation.get(&2).copied().unwrap_or(0), 0, "seed {seed}: new incarnation ran an old call");
    let mut ok = 0;
    let mut failed = 0;
    let mut late = 0;
    let mut abandoned = 0;
    for c in &s.clients {
        abandoned += c.abandoned as usize;
        for (ended, o) in &c.outcomes {
            match o {
                Ok(()) => ok += 1,
                // A call with a deadline may miss it (long procedures, a lossy network).
                Err(Failure::DeadlineExceeded) if deadlines.is_some() => late += 1,
                Err(f) => {
                    // Only a crash explains a failure, and only of a call that ended after it.
                    assert!(
                        s.crashed_at.is_some_and(|at| *ended >= at),
                        "seed {seed}: call failed with {f:?} at {ended} ns, crash at {:?} (loss {loss:.2})",
                        s.crashed_at
                    );
                    assert!(
                        matches!(f, Failure::Unreachable { .. } | Failure::Rejected(Status::WrongIncarnation)),
                        "seed {seed}: unexpected failure {f:?}"
                    );
                    failed += 1;
                }
            }
        }
    }
    if s.crashed_at.is_none() && s.clients.iter().all(|c| c.done) {
        // Every result was acknowledged, by the next call on its slot or by its client's ack, or
        // dropped on a cancel; what remains charged is at most the results saved for the last call
        // of each slot, and the partial message of a call its client gave up (deadline or
        // abandoned) whose cancel was lost, and that no later call replaced (reclaimed only once
        // stalled).
        let mut partial = 0;
        for k in 0..n_clients {
            let cell = s.server.binding.slot(k as u32).expect("one slot per client");
            if cell.proto.is_receiving() {
                assert!(cell.proto.reassembly_bytes() <= largest, "seed {seed}: more than the largest message");
                partial += cell.proto.reassembly_bytes();
            }
        }
        let held = s.server.binding.memory();
        let bound = n_clients * (HEADER_LEN + largest) + partial;
        assert!(held <= bound, "seed {seed}: {held} bytes still charged");
    }
    // A window past the mask's 64 fragments, and messages longer than it.
    let wide = u64::from(s.server.binding.window() > NARROW_WINDOW && largest > frag * usize::from(NARROW_WINDOW));
    Totals {
        ok,
        failed,
        late,
        abandoned,
        packets: s.packets,
        corrupted: s.corrupted,
        busy: s.busy,
        challenges: s.challenges,
        landed: s.landed,
        server_landed: s.server_landed,
        in_place: s.in_place,
        wide,
        secure: u64::from(secure),
        unopened: s.unopened,
    }
}

#[test]
fn seeded_scenarios_complete_or_fail_and_run_at_most_once() {
    let n: u64 = std::env::var("TIERCEL_SIM_SCENARIOS").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    let mut t = Totals::default();
    for seed in 0..n {
        let r = run(seed);
        t.ok += r.ok;
        t.failed += r.failed;
        t.late += r.late;
        t.abandoned += r.abandoned;
        t.packets += r.packets;
        t.corrupted += r.corrupted;
        t.busy += r.busy;
        t.challenges += r.challenges;
        t.landed += r.landed;
        t.server_landed += r.server_landed;
        t.in_place += r.in_place;
        t.wide += r.wide;
        t.secure += r.secure;
        t.unopened += r.unopened;
    }
    println!(
        "{n} scenarios: {} calls returned, {} failed after a crash, {} missed their deadline, {} given up \
         by their clients, {} packets sent, {} corrupted, {} calls refused as busy, {} address challenges, \
         {} result fragments and {} call fragments received in place, {} results sent from behind other bytes, \
         {} scenarios of windows wider than an acknowledgement's mask, {} of secure bindings ({} sealed \
         packets dropped unopened)",
        t.ok,
        t.failed,
        t.late,
        t.abandoned,
        t.packets,
        t.corrupted,
        t.busy,
        t.challenges,
        t.landed,
        t.server_landed,
        t.in_place,
        t.wide,
        t.secure,
        t.unopened
    );
    assert!(t.ok > 0);
    assert!(t.challenges > 0, "every slot proves its address");
    if n >= 100 {
        assert!(t.corrupted > 0 && t.busy > 0, "the scenarios exercise corruption and admission");
        assert!(t.late > 0 && t.abandoned > 0, "the scenarios exercise deadlines and cancellation");
        assert!(t.landed > 0, "the scenarios exercise results received in place");
        assert!(t.server_landed > 0, "the scenarios exercise calls received in place");
        assert!(t.in_place > 0, "the scenarios exercise results sent from where a procedure left them");
        assert!(t.wide > 0 && t.wide < n, "the scenarios exercise wide and narrow windows");
        assert!(t.secure > 0 && t.secure < n, "the scenarios exercise secure and plain bindings");
        assert!(t.unopened > 0, "duplicates and corruption are dropped before the protocol sees them");
    }
}
