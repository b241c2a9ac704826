//! Deterministic simulation of the packet-exchange protocol on virtual time.
//!
//! Each seed builds a scenario: several client slots making calls of random sizes (single- and
//! multi-packet, both ways) to a server whose procedures take random time, over a network that loses,
//! duplicates, delays and reorders packets; some scenarios crash the server, and some restart it
//! with a new incarnation. Every scenario asserts that each call completes with the right result or
//! fails with an error, that no call body runs twice, and that a restarted server runs nothing sent
//! to its previous incarnation. `TIERCEL_SIM_SCENARIOS` sets the number of seeds (default 10,000).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tiercel_proto::client::{ClientCall, Failure, Handled, Outcome, Transmit};
use tiercel_proto::fragment::fragment_range;
use tiercel_proto::server::{CallAction, ProbeAction, Slot};
use tiercel_proto::wire::{flags, Header, Kind, Packet, Status};
use tiercel_proto::Timing;

const BINDING: u32 = 7;
const TOKEN: u128 = 0xfeed_f00d;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Dest {
    Server,
    Client(usize),
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Deliver(Dest, Vec<u8>),
    Complete { incarnation: u64, slot: usize, seq: u32 },
}

struct Scenario {
    rng: ChaCha8Rng,
    base: Instant,
    now: u64,
    order: u64,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    loss: f64,
    dup: f64,
    delay: (u64, u64),
    timing: Timing,
    frag: usize,
    server: Server,
    clients: Vec<Client>,
    crash_at: Option<u64>,
    restart_after: Option<u64>,
    packets: u64,
}

struct Server {
    alive: bool,
    incarnation: u64,
    slots: Vec<Slot>,
    saved: Vec<(Status, Vec<u8>)>,
    running: Vec<Option<(u32, Vec<u8>)>>,
    service: (u64, u64),
    /// Probability that a new call is refused as busy (an overloaded server).
    busy: f64,
}

struct Client {
    call: ClientCall,
    seq: u32,
    remaining: u32,
    message: Vec<u8>,
    expected: Vec<u8>,
    done: bool,
    outcomes: Vec<Result<(), Failure>>,
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

    fn send(&mut self, dest: Dest, bytes: Vec<u8>) {
        self.packets += 1;
        if self.rng.random_bool(self.loss) {
            return;
        }
        let copies = if self.rng.random_bool(self.dup) { 2 } else { 1 };
        for _ in 0..copies {
            let d = self.delay.0 + self.rng.random_range(0..=self.delay.1);
            self.push(self.now + d, Event::Deliver(dest, bytes.clone()));
        }
    }

    fn packet(h: Header, payload: &[u8]) -> Vec<u8> {
        let mut h = h;
        h.payload_len = payload.len() as u32;
        let mut v = h.to_bytes().to_vec();
        v.extend_from_slice(payload);
        v
    }

    fn server_header(&self, kind: Kind, slot: usize, seq: u32) -> Header {
        Header {
            binding: BINDING,
            token: TOKEN,
            incarnation: self.server.incarnation,
            slot: slot as u32,
            seq,
            ..Header::new(kind)
        }
    }

    fn send_result_fragment(&mut self, slot: usize, seq: u32, i: u16, retransmit: bool) {
        let (status, bytes) = &self.server.saved[slot];
        let count = tiercel_proto::fragment::fragment_count(bytes.len(), self.frag).unwrap();
        let r = fragment_range(i, bytes.len(), self.frag);
        let mut h = self.server_header(Kind::Result, slot, seq);
        h.status = *status;
        h.frag_index = i;
        h.frag_count = count;
        h.message_len = bytes.len() as u32;
        h.flags = if retransmit { flags::RETRANSMIT } else { 0 };
        let p = Self::packet(h, &bytes[r]);
        self.send(Dest::Client(slot), p);
    }

    fn server_receive(&mut self, bytes: Vec<u8>, log: &mut Log) {
        if !self.server.alive {
            return;
        }
        let Ok(p) = Packet::new_checked(&bytes[..]) else { panic!("sim sends only valid packets") };
        let slot = p.slot() as usize;
        let seq = p.seq();
        if p.incarnation() != self.server.incarnation || p.token() != TOKEN {
            let mut h = self.server_header(Kind::Reject, slot, seq);
            h.status = Status::WrongIncarnation;
            let r = Self::packet(h, &[]);
            self.send(Dest::Client(slot), r);
            return;
        }
        let now = self.at(self.now);
        let mut to_send = Vec::new();
        match p.kind() {
            Kind::Call if self.server.slots[slot].is_new(seq) && self.rng.random_bool(self.server.busy) => {
                let mut h = self.server_header(Kind::Reject, slot, seq);
                h.status = Status::Busy;
                let r = Self::packet(h, &[]);
                self.send(Dest::Client(slot), r);
            }
            Kind::Call => {
                let action = self.server.slots[slot].on_call(&p, now, self.frag, &self.timing, |_| true);
                match action {
                    CallAction::Execute => self.execute(slot, seq, p.payload().to_vec(), log),
                    CallAction::ExecuteMessage(m) => self.execute(slot, seq, m, log),
                    CallAction::Ack(a) => {
                        let h = self.server_header(Kind::Ack, slot, seq);
                        let r = Self::packet(h, &a.to_bytes());
                        self.send(Dest::Client(slot), r);
                    }
                    CallAction::ResendResult => self.server.slots[slot].resend_result(|i| to_send.push(i)),
                    CallAction::Refuse(status) => {
                        self.server.saved[slot] = (status, Vec::new());
                        let (frag, timing) = (self.frag, self.timing);
                        self.server.slots[slot].complete(seq, 0, frag, &timing, |i| to_send.push(i));
                    }
                    CallAction::Drop(_) => {}
                }
            }
            Kind::Ack => {
                self.server.slots[slot].on_result_ack(&p, now, |i| to_send.push(i));
            }
            Kind::Probe => match self.server.slots[slot].on_probe(seq, now) {
                ProbeAction::Alive => {
                    let r = Self::packet(self.server_header(Kind::ProbeReply, slot, seq), &[]);
                    self.send(Dest::Client(slot), r);
                }
                ProbeAction::Ack(a) => {
                    let r = Self::packet(self.server_header(Kind::Ack, slot, seq), &a.to_bytes());
                    self.send(Dest::Client(slot), r);
                }
                ProbeAction::ResendResult => self.server.slots[slot].resend_result(|i| to_send.push(i)),
                ProbeAction::Drop => {}
            },
            other => panic!("server got {other:?}"),
        }
        for i in to_send {
            self.send_result_fragment(slot, seq, i, true);
        }
    }

    fn execute(&mut self, slot: usize, seq: u32, args: Vec<u8>, log: &mut Log) {
        let n = log.executions.entry((slot, seq)).or_default();
        *n += 1;
        assert_eq!(*n, 1, "call {seq} of slot {slot} ran twice");
        *log.by_incarnation.entry(self.server.incarnation).or_default() += 1;
        self.server.running[slot] = Some((seq, args));
        let (lo, hi) = self.server.service;
        let d = self.rng.random_range(lo..=hi);
        let incarnation = self.server.incarnation;
        self.push(self.now + d, Event::Complete { incarnation, slot, seq });
    }

    fn complete(&mut self, incarnation: u64, slot: usize, seq: u32) {
        if !self.server.alive || incarnation != self.server.incarnation {
            return;
        }
        let Some((s, args)) = self.server.running[slot].take() else { return };
        assert_eq!(s, seq);
        let result = result_for(&args);
        let len = result.len();
        self.server.saved[slot] = (Status::Ok, result);
        let mut to_send = Vec::new();
        let (frag, timing) = (self.frag, self.timing);
        self.server.slots[slot].complete(seq, len, frag, &timing, |i| to_send.push(i));
        for i in to_send {
            self.send_result_fragment(slot, seq, i, false);
        }
    }

    fn client_flush(&mut self, k: usize) {
        while let Some(t) = self.clients[k].call.poll_transmit() {
            let c = &self.clients[k];
            let mut h = Header {
                binding: BINDING,
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
            };
            self.send(Dest::Server, bytes);
        }
    }

    fn client_start(&mut self, k: usize) {
        let big = self.rng.random_bool(0.3);
        let max = if big { self.frag * 20 } else { self.frag };
        let arg_len = self.rng.random_range(4..=max.max(4));
        let res_len = self.rng.random_range(0..=max) as u32;
        let mut m = vec![0u8; arg_len];
        self.rng.fill(&mut m[..]);
        m[..4].copy_from_slice(&res_len.to_le_bytes());
        let now = self.at(self.now);
        let c = &mut self.clients[k];
        c.seq += 1;
        c.remaining -= 1;
        c.expected = result_for(&m);
        c.message = m;
        let (seq, len) = (c.seq, c.message.len());
        c.call.start(seq, len, now, None);
        self.client_flush(k);
    }

    fn client_receive(&mut self, k: usize, bytes: Vec<u8>) {
        if self.clients[k].done {
            return;
        }
        let p = Packet::new_checked(&bytes[..]).expect("valid");
        let now = self.at(self.now);
        let handled = self.clients[k].call.handle_packet(&p, now);
        if handled == Handled::Complete {
            let c = &mut self.clients[k];
            let outcome = c.call.outcome().expect("complete has an outcome");
            let r = match outcome {
                Outcome::Result { status: Status::Ok, reassembled } => {
                    let got =
                        if reassembled { c.call.take_message().expect("reassembled") } else { p.payload().to_vec() };
                    assert_eq!(got, c.expected, "wrong result for call {} of slot {k}", c.seq);
                    Ok(())
                }
                Outcome::Result { status, .. } => panic!("unexpected status {status:?}"),
                Outcome::Failed(f) => Err(f),
            };
            self.finish_call(k, r);
        }
        self.client_flush(k);
    }

    fn finish_call(&mut self, k: usize, r: Result<(), Failure>) {
        let failed = r.is_err();
        self.clients[k].outcomes.push(r);
        if self.clients[k].remaining == 0 || (failed && self.crash_at.is_some()) {
            self.clients[k].done = true;
        } else {
            self.client_start(k);
        }
    }

    fn client_timeout(&mut self, k: usize) {
        let now = self.at(self.now);
        self.clients[k].call.handle_timeout(now);
        if let Some(Outcome::Failed(f)) = self.clients[k].call.outcome() {
            self.finish_call(k, Err(f));
        }
        self.client_flush(k);
    }

    fn nanos(&self, i: Instant) -> u64 {
        i.saturating_duration_since(self.base).as_nanos() as u64
    }
}

fn run(seed: u64) -> (usize, usize, u64) {
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
    let delay = (rng.random_range(10_000..2_000_000u64), rng.random_range(0..5_000_000u64));
    let long_calls = rng.random_bool(0.2);
    let service = if long_calls { (0, 3_000_000_000) } else { (0, 2_000_000) };
    let busy = if rng.random_bool(0.2) { rng.random_range(0.0..0.5) } else { 0.0 };
    let crash = rng.random_bool(0.1);
    let crash_at = crash.then(|| rng.random_range(0..200_000_000u64));
    let restart_after = (crash && rng.random_bool(0.5)).then(|| rng.random_range(0..2_000_000_000u64));
    let base = Instant::now();
    let clients = (0..n_clients)
        .map(|_| Client {
            call: ClientCall::new(timing, frag, base),
            seq: rng.random_range(0..u32::MAX),
            remaining: rng.random_range(1..=6),
            message: Vec::new(),
            expected: Vec::new(),
            done: false,
            outcomes: Vec::new(),
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
        delay,
        timing,
        frag,
        server: Server {
            alive: true,
            incarnation: 1,
            slots: (0..n_clients).map(|_| Slot::new()).collect(),
            saved: vec![(Status::Ok, Vec::new()); n_clients],
            running: vec![None; n_clients],
            service,
            busy,
        },
        clients,
        crash_at,
        restart_after,
        packets: 0,
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
        let next_crash = s.crash_at.filter(|_| s.server.alive && s.server.incarnation == 1);
        let candidates = [next_event, next_timer.map(|t| t.0), next_crash];
        let t = candidates.iter().flatten().copied().min().expect("a live scenario always has a next step");
        assert!(t < limit, "seed {seed}: scenario did not finish");
        s.now = s.now.max(t);
        if next_crash == Some(t) {
            s.server.alive = false;
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
                s.server = Server {
                    alive: true,
                    incarnation: 2,
                    slots: (0..n_clients).map(|_| Slot::new()).collect(),
                    saved: vec![(Status::Ok, Vec::new()); n_clients],
                    running: vec![None; n_clients],
                    service,
                    busy,
                };
            }
            Event::Complete { incarnation, slot, seq } => s.complete(incarnation, slot, seq),
            Event::Deliver(Dest::Server, b) => s.server_receive(b, &mut log),
            Event::Deliver(Dest::Client(k), b) => s.client_receive(k, b),
        }
    }
    assert_eq!(log.by_incarnation.get(&2).copied().unwrap_or(0), 0, "seed {seed}: new incarnation ran an old call");
    let mut ok = 0;
    let mut failed = 0;
    for c in &s.clients {
        for o in &c.outcomes {
            match o {
                Ok(()) => ok += 1,
                Err(f) => {
                    assert!(
                        s.crash_at.is_some() || restart_or_crash(&s),
                        "seed {seed}: call failed with {f:?} without a crash (loss {loss:.2})"
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
    (ok, failed, s.packets)
}

fn restart_or_crash(s: &Scenario) -> bool {
    !s.server.alive || s.server.incarnation != 1
}

#[test]
fn seeded_scenarios_complete_or_fail_and_run_at_most_once() {
    let n: u64 = std::env::var("TIERCEL_SIM_SCENARIOS").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    let (mut ok, mut failed, mut packets) = (0, 0, 0);
    for seed in 0..n {
        let (o, f, p) = run(seed);
        ok += o;
        failed += f;
        packets += p;
    }
    println!("{n} scenarios: {ok} calls returned, {failed} failed after a crash, {packets} packets sent");
    assert!(ok > 0);
}
