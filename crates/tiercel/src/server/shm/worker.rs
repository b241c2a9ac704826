//! One thread serving a binding: waiting for calls on the slots, running them, publishing their
//! results, and helping when the team is held up.

use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tiercel_proto::endpoint::SlotStep;
use tiercel_proto::shm::{self as proto, header, slot, PAGE};
use tiercel_proto::wire::Status;
use tiercel_sys::clock;
use tiercel_sys::shm::{futex_wait, futex_wake, Region};

use super::super::dispatch::Arrival;
use super::team::*;
use super::*;
use crate::retention::{self};
use crate::steps::{self, mark, Point};

impl Team {
    /// A thread to serve the binding beside those it has, when every one is held up: a new
    /// helper if there is room for one, or else a wake-up for a sleeping one.
    pub(super) fn add_thread(self: &Arc<Self>) {
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        if self.lanes.iter().skip(1).any(|l| l.state.load(Ordering::Relaxed) == lane::ASLEEP) {
            // A parked helper: wake it (or one asleep on the doorbell, a while after its last call).
            self.parked.fetch_add(1, Ordering::SeqCst);
            futex_wake(&self.parked, 1);
            self.ring();
            return;
        }
        let free = self.lanes.iter().position(|l| {
            l.state.compare_exchange(lane::FREE, lane::AWAKE, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        });
        let Some(at) = free else {
            self.ring();
            return;
        };
        let team = self.clone();
        // Joined when the server stops, so that nothing of it outlives `RunningServer::stop`.
        let spawned = crate::server::spawn_kept(&self.shared.binding_threads, || {
            std::thread::Builder::new().name("tiercel-shm-helper".into()).spawn(move || {
                team.shared.pin(binding_index(&team.shared) + at);
                Worker::new(&team, at).help();
                team.lanes[at].state.store(lane::FREE, Ordering::Release);
            })
        });
        if spawned.is_err() {
            self.lanes[at].state.store(lane::FREE, Ordering::Release);
        }
    }
}

/// Serves a binding on its first thread until its client goes away or the server stops.
#[cfg_attr(not(feature = "async"), allow(unused_variables))]
pub(super) fn serve_first(team: &Team, stream: UnixStream, results: AsyncResults) {
    let shared = &*team.shared;
    // Measure the tick counter's rate now, not on the first call.
    let _ = clock::ticks_per_second();
    shared.pin(binding_index(shared));
    shared.stats.bindings.fetch_add(1, Ordering::Relaxed);
    shared.shm_bindings.fetch_add(1, Ordering::Relaxed);
    let mut first = Worker::new(team, 0);
    #[cfg(feature = "async")]
    {
        first.results = Some(results);
    }
    first.run(&stream);
    drop(first);
    team.closed.store(true, Ordering::Release);
    // Parked helpers look at `closed` within their wait's period; wake them now.
    team.parked.fetch_add(1, Ordering::SeqCst);
    futex_wake(&team.parked, i32::MAX as u32);
    shared.shm_bindings.fetch_sub(1, Ordering::Relaxed);
    shared.endpoint.release(&team.place);
}

/// One thread serving a binding: its private copies of arguments and results, and their charge.
pub(super) struct Worker<'a> {
    pub(super) team: &'a Team,
    /// Which of the team's lanes is this thread's.
    pub(super) lane: usize,
    pub(super) args: Vec<u8>,
    pub(super) out: Vec<u8>,
    /// The capacity of `args` and `out`, charged.
    pub(super) charge: Charge,
    /// Leave to spin after a call; without it, this thread sleeps as soon as no call is there.
    pub(super) lease: crate::waiting::leases::SpinLease,
    /// Each slot's control words, found once: the spinning look at the slots and the serving of a
    /// call use them without a bounds check each.
    pub(super) slots: Vec<&'a [AtomicU32; slot::WORDS]>,
    /// The clients' high-water mark of slots in use ([`header::SLOTS_USED`]).
    pub(super) slots_used: &'a AtomicU32,
    /// The claim on the slot whose call this thread served last, kept for that slot's next call,
    /// which it then serves without taking the claim again (a caller calling in a loop has its calls
    /// served without a locked instruction between seeing each and publishing its result). Given up
    /// before the thread serves another slot and before it sleeps, so that it holds no slot it is not
    /// ready to serve: a thread held up by a slow call holds that call's slot only.
    pub(super) kept: Option<(usize, std::sync::MutexGuard<'a, Books>)>,
    /// This thread's count of the calls it runs (part of the server's `calls`).
    pub(super) calls: crate::counters::Shard,
    /// Results of the binding's async calls (the first thread's).
    #[cfg(feature = "async")]
    pub(super) results: Option<std::sync::mpsc::Receiver<(u32, Status, Vec<u8>)>>,
}

/// A control word of the region. Offsets come from the layout the region was created with, so they
/// are in bounds and aligned.
pub(super) fn word(region: &Region, at: usize) -> &AtomicU32 {
    region.u32_at(at).unwrap_or_else(|| unreachable!("layout offset {at} inside the region"))
}

/// The control words of the slot at `at` (see [`slot`]: word `i` is at offset `4 * i`), found with
/// one bounds check.
pub(super) fn slot_words(region: &Region, at: usize) -> &[AtomicU32; slot::WORDS] {
    region.words(at).unwrap_or_else(|| unreachable!("slot at {at} inside the region"))
}

impl<'a> Worker<'a> {
    pub(super) fn new(team: &'a Team, lane: usize) -> Worker<'a> {
        Worker {
            team,
            lane,
            args: Vec::new(),
            out: Vec::new(),
            charge: Charge::new(team.budget.clone()),
            lease: crate::waiting::leases::SpinLease::new(&team.shared.spin_leases),
            slots: (0..team.layout.slots).map(|i| slot_words(&team.region, team.layout.slot(i))).collect(),
            slots_used: word(&team.region, header::SLOTS_USED),
            kept: None,
            calls: team.shared.call_shards.take(),
            #[cfg(feature = "async")]
            results: None,
        }
    }

    pub(super) fn word(&self, at: usize) -> &'a AtomicU32 {
        word(&self.team.region, at)
    }

    #[inline]
    pub(super) fn mark(&self, what: u32) {
        self.team.lanes[self.lane].state.store(what, Ordering::Relaxed);
    }

    /// The control words of the slots below the clients' high-water mark (a malicious client's
    /// value is capped), as [`Team::used`] counts them.
    #[inline]
    pub(super) fn used_slots(&self) -> &[&'a [AtomicU32; slot::WORDS]] {
        let used = (self.slots_used.load(Ordering::Acquire) as usize).min(self.slots.len());
        &self.slots[..used]
    }

    /// Whether a slot holds a published call (taken or not): the spinning look, in line.
    #[inline]
    pub(super) fn any_published(&self) -> bool {
        self.used_slots().iter().any(|w| proto::server_has_call(&w[slot::STATE / 4]))
    }

    /// Serves every call in the slots that no other thread has taken; true if there were any.
    #[inline]
    pub(super) fn serve_all(&mut self) -> bool {
        let team = self.team;
        let mut served = false;
        for i in 0..self.used_slots().len() {
            let state = &self.slots[i][slot::STATE / 4];
            if !proto::server_has_call(state) {
                continue;
            }
            let mut b = match self.kept.take() {
                // This slot's claim, kept since its last call: no other thread can have served this one.
                Some((k, b)) if k == i => b,
                kept => {
                    drop(kept);
                    let Some(b) = team.claim(i) else { continue };
                    // Looked at again under the claim: another thread may have served it meanwhile.
                    if Team::runs_async(&b) || !proto::server_has_call(state) {
                        continue;
                    }
                    b
                }
            };
            mark(Point::ServerArrived);
            self.mark(lane::RUNNING);
            self.serve(i as u32, &mut b);
            // Kept for the slot's next call, unless this one runs on the async runtime (its result
            // is published under the claim by the thread that receives it).
            if !Team::runs_async(&b) {
                self.kept = Some((i, b));
            }
            self.mark(lane::AWAKE);
            let count = &self.team.lanes[self.lane].served;
            count.store(count.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
            steps::close();
            served = true;
        }
        served
    }

    /// The first thread's life: serves the binding's calls until its client goes away or the
    /// server stops, spinning after each call, then sleeping on the region's doorbell.
    pub(super) fn run(&mut self, stream: &UnixStream) {
        let team = self.team;
        let shared = &*team.shared;
        let (doorbell, sleeping) = (self.word(header::DOORBELL), self.word(header::SERVER_SLEEPING));
        // Spin after each call for twice the recent gap between a result and the next call plus
        // 50 µs (at most `spin`), or always `spin` when adaptation is off; then sleep on the doorbell.
        let policy = if shared.config.adaptive_spin {
            crate::Spin::Adaptive { max: shared.config.spin }
        } else {
            crate::Spin::Fixed(shared.config.spin)
        };
        let mut budget = crate::waiting::spin::SpinBudget::new(policy);
        // Times in ticks of the tick counter: read after every call, it costs a third of the clock.
        let mut last_result = clock::ticks();
        let mut budget_ticks = clock::ticks_in(budget.budget());
        let mut spin_until = last_result + budget_ticks;
        let mut rounds = 0u32;
        let mut idle = 0u32;
        loop {
            let mut served = false;
            #[cfg(feature = "async")]
            if team.running.load(Ordering::Relaxed) > 0 {
                served |= self.finish_async();
            }
            // A look at the slots in line, and the call to serve only when one holds a call: the
            // sooner a spinning thread looks again, the sooner it sees the next call.
            if self.any_published() {
                served |= self.serve_all();
            }
            if served {
                // Off the critical path: the result is already published. The gap between results
                // stands for how soon the client calls again: measured after every eighth call (the
                // others only note the time), as the client samples its own.
                let now = clock::ticks();
                rounds = rounds.wrapping_add(1);
                if rounds.is_multiple_of(8) {
                    budget.observe_ns(clock::elapsed_ns(last_result, now));
                    budget_ticks = clock::ticks_in(budget.budget());
                }
                last_result = now;
                team.last_result.store(now, Ordering::Relaxed);
                spin_until = if self.lease.take() { now + budget_ticks } else { now };
                idle = 0;
                // A client calling without pause never lets this thread sleep: look at the stop flag
                // now and then all the same.
                if rounds.is_multiple_of(1024) && shared.stop.load(Ordering::Relaxed) {
                    return;
                }
                continue;
            }
            // Read the clock only every 64 idle rounds, so that a spinning server notices a call
            // within a few loads, not a clock read. Without a spin (no lease, or `spin` zero) it
            // goes to sleep at once: 63 rounds of looking caught a client's next call as a spin
            // would, and a server configured not to spin answered Nulls in 0.4 µs.
            idle = idle.wrapping_add(1);
            let spinning = spin_until > last_result;
            if spinning && (!idle.is_multiple_of(64) || clock::ticks() < spin_until) {
                core::hint::spin_loop();
                continue;
            }
            self.kept = None;
            #[cfg(feature = "async")]
            if team.running.load(Ordering::Relaxed) > 0 {
                self.cancel_async();
            }
            self.lease.give_back();
            self.sleep(doorbell, sleeping, LIVENESS);
            if clock::elapsed(last_result, clock::ticks()) >= LIVENESS {
                // Idle a while: give back the private copies of large arguments and results (kept
                // while calls come, so that a stream of large calls does not fault them in anew),
                // and stop mapping the slot pages whose results the client has taken.
                self.shrink();
                team.forget_taken();
            }
            // Whether the client is still there is asked (a system call) only of a wake that found
            // no call: one that found a call serves it first, a system call sooner. A client gone
            // is seen at once when the rendezvous thread saw its connection hang up and rang
            // (`Team::hung_up`), else within a sleep's period (`LIVENESS`). The mark is taken
            // before the look, so that a hang-up after it marks the team again.
            let gone = || {
                team.hung_up.store(false, Ordering::SeqCst);
                tiercel_sys::shm::peer_closed(stream)
            };
            if shared.stop.load(Ordering::Relaxed) || (!self.any_published() && gone()) {
                // The client died or dropped the binding: its region goes with this thread.
                shared.stats.expired.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }

    /// A helper's life: serves calls no other thread has taken, spinning after each while it holds
    /// a lease; otherwise asleep on the doorbell while it served a slow call in the last
    /// [`MAX_LOOK`](crate::waiting::crew::MAX_LOOK), parked after that until the rendezvous thread
    /// finds the binding held up again; ends after [`HELPER_IDLE`] without a call, or with the
    /// binding.
    pub(super) fn help(&mut self) {
        let team = self.team;
        let shared = &*team.shared;
        let spin = clock::ticks_in(shared.config.spin);
        let mut last_call = Instant::now();
        // Whether the calls it served last took a while (`crate::waiting::crew::SLOW_CALL`).
        let mut slow = false;
        let mut spin_until = clock::ticks();
        let mut idle = 0u32;
        while !team.closed.load(Ordering::Acquire) && !shared.stop.load(Ordering::Relaxed) {
            let began = clock::ticks();
            if self.serve_all() {
                let now = clock::ticks();
                slow = clock::elapsed(began, now) >= crate::waiting::crew::SLOW_CALL;
                team.last_result.store(now, Ordering::Relaxed);
                spin_until = if self.lease.take() { now + spin } else { now };
                last_call = Instant::now();
                idle = 0;
                continue;
            }
            idle = idle.wrapping_add(1);
            if !idle.is_multiple_of(64) || clock::ticks() < spin_until {
                core::hint::spin_loop();
                continue;
            }
            self.kept = None;
            if last_call.elapsed() >= HELPER_IDLE {
                break;
            }
            self.lease.give_back();
            if slow && last_call.elapsed() < crate::waiting::crew::MAX_LOOK {
                // Calls of slow procedures keep it running: the next of its caller comes after the
                // result, and a helper parked at once waited for the rendezvous thread's looks (two,
                // a millisecond apart) to serve it. On the doorbell, the call wakes it (while it
                // sleeps there, each call rings: a system call of the client's). Not after quick
                // calls, which one thread serves as they come: a helper that took some of them
                // would stay on the doorbell and have every call ring it.
                let (doorbell, sleeping) = (self.word(header::DOORBELL), self.word(header::SERVER_SLEEPING));
                self.sleep(doorbell, sleeping, crate::waiting::crew::MAX_LOOK);
                continue;
            }
            let bell = team.parked.load(Ordering::SeqCst);
            self.mark(lane::ASLEEP);
            if !team.any_call() {
                futex_wait(&team.parked, bell, Some(LIVENESS));
            }
            self.mark(lane::AWAKE);
            if last_call.elapsed() >= LIVENESS {
                self.shrink();
            }
        }
    }

    /// Sleeps on the doorbell (at most `period`) unless a call no other thread holds is there (the
    /// first thread: helpers park on their own futex).
    pub(super) fn sleep(&self, doorbell: &AtomicU32, sleeping: &AtomicU32, period: Duration) {
        self.mark(lane::ASLEEP);
        let last_look = || {
            // The region tells clients that this barrier comes (`header::SERVER_BARRIER`), so they
            // publish without a fence: it puts theirs here. (Should it ever fail, clients are told
            // to fence again; a call published meanwhile without one waits out this sleep's period
            // at most.) A server that never spins does not issue it (`issues_barriers`).
            if super::issues_barriers(&self.team.shared.config) && !tiercel_sys::shm::barrier() {
                self.word(header::SERVER_BARRIER).store(0, Ordering::SeqCst);
            }
            // The first thread does not sleep once the client's connection has hung up (set
            // before the rendezvous thread rings, so a ring before this sleep is not missed).
            self.team.any_call() || self.lane == 0 && self.team.hung_up.load(Ordering::SeqCst)
        };
        if let Some(bell) = proto::server_prepare_sleep(doorbell, sleeping, last_look) {
            if futex_wait(doorbell, bell, Some(period)) {
                steps::slept(steps::Side::Server);
            }
            proto::server_woke(sleeping);
        }
        self.mark(lane::AWAKE);
    }

    /// Gives back the private copies of large arguments and results.
    pub(super) fn shrink(&mut self) {
        if self.args.capacity() > retention::LARGE {
            self.args = Vec::new();
        }
        if self.out.capacity() > retention::LARGE {
            self.out = Vec::new();
        }
        self.charge.settle(self.buffers());
    }

    /// Gives back this thread's large private buffers that the call just served (with `len` bytes
    /// of arguments; its result in the arguments' copy if `result_in_args`) did not use.
    #[cold]
    #[inline(never)]
    pub(super) fn give_back_unused(&mut self, len: usize, result_in_args: bool) {
        if len <= retention::LARGE && self.args.capacity() > retention::LARGE {
            self.args = Vec::new();
        }
        if (result_in_args || self.out.len() <= retention::LARGE) && self.out.capacity() > retention::LARGE {
            self.out = Vec::new();
        }
        self.charge.settle(self.buffers());
    }

    /// Bytes of this thread's private buffers.
    pub(super) fn buffers(&self) -> usize {
        self.args.capacity() + self.out.capacity()
    }

    /// Charges slot `b` holding `held` bytes and this thread's buffers with room for `args` bytes of
    /// arguments; true if both fit. Without room, the slot's charge is left as it was.
    pub(super) fn settle(&mut self, b: &mut Books, held: usize, args: usize) -> bool {
        let buffers = self.buffers() + args.saturating_sub(self.args.capacity());
        if !b.charge.settle(held) {
            return false;
        }
        if self.charge.settle(buffers) {
            b.held = held;
            return true;
        }
        b.charge.settle(b.held);
        false
    }

    /// Charges slot `b` with `held` bytes mapped and the argument buffer with `args` bytes; if the
    /// budgets have no room, first gives back what can be given back.
    #[cold]
    #[inline(never)]
    pub(super) fn make_room(&mut self, b: &mut Books, held: usize, args: usize) -> bool {
        let held = held.max(b.held);
        self.settle(b, held, args) || {
            self.team.forget_taken();
            if self.args.capacity() > args {
                self.args = Vec::new();
            }
            self.out = Vec::new();
            self.settle(b, held, args)
        }
    }

    /// Runs the call in slot `i` (claimed: `b`): reads what the client wrote once into private
    /// memory, validates it, runs the procedure, writes the result in place and publishes it.
    pub(super) fn serve(&mut self, i: u32, b: &mut Books) {
        let team = self.team;
        let data = team.layout.data(i);
        // Each control word is read once; the call is validated before anything uses it.
        let w = self.slots[i as usize];
        let words = proto::CallWords::read(|at| &w[at / 4]);
        let deadline = words.deadline;
        self.out.clear();
        // The pages the call's arguments (and at least an error message) take, charged before they
        // are touched; the fast path finds them charged already. A grown argument buffer has a
        // page of room past the arguments, for the return value an in-place procedure appends
        // there (`serve_in_place`): without it that would grow the buffer to twice the arguments.
        let mut len = 0;
        let room = |n: usize| {
            len = n;
            let pages = n.max(1).next_multiple_of(PAGE);
            match b.held >= pages && self.args.capacity() >= n || self.make_room(b, pages, n + PAGE) {
                true => Ok(()),
                false => Err(pages + n + PAGE),
            }
        };
        let step = team.shared.endpoint.slot_call(&team.place, &words, team.layout.data, room, Instant::now);
        mark(Point::ServerValidated);
        let status = match step {
            SlotStep::Busy => {
                // No room in the budgets, or draining: refused unread, nothing written to the
                // slot's data.
                team.shared.stats.busy.fetch_add(1, Ordering::Relaxed);
                Status::Busy
            }
            // More than the budgets could ever hold: refused unread, nothing written to the
            // slot's data (whose pages were not charged); the client knows the call's size.
            SlotStep::TooLarge => {
                team.shared.stats.too_large.fetch_add(1, Ordering::Relaxed);
                Status::TooLarge
            }
            SlotStep::Malformed => {
                super::super::dispatch::error_message(
                    &mut self.out,
                    "malformed shared-memory call: length or procedure out of range",
                );
                Status::BadArguments
            }
            // Given up by its client (its deadline passed, its future dropped) before it started.
            SlotStep::Cancelled => {
                team.shared.stats.cancelled.fetch_add(1, Ordering::Relaxed);
                Status::Cancelled
            }
            SlotStep::Run(call) => {
                if self.args.capacity() < call.len {
                    self.args.reserve_exact(call.len + PAGE - self.args.len());
                }
                self.args.resize(call.len, 0);
                if call.len > 0 {
                    team.region.read(data, &mut self.args);
                }
                mark(Point::ServerAccepted);
                #[cfg(feature = "async")]
                if team.shared.asynch.is_some() && team.binding.is_async(call.procedure) {
                    match self.start_async(i, b, call, deadline) {
                        // The result comes later, through `finish_async`.
                        Ok(()) => return,
                        Err(status) => return self.publish(i, b, status, 0),
                    }
                }
                self.calls.add_one();
                let limit = team.layout.data;
                // A relative deadline is the network's: this transport carries the instant.
                let deadline = deadline.map(tiercel_sys::clock::instant_of_monotonic);
                let arrival = Arrival::of(&team.place, "shm", call.context, None, deadline);
                if call.len > IN_PLACE && team.binding.in_place(call.procedure) {
                    return self.serve_in_place(i, b, call.procedure, arrival, len);
                }
                let mut status = super::super::dispatch::run_procedure(
                    &team.shared,
                    &team.binding,
                    call.procedure,
                    &self.args,
                    arrival,
                    &mut self.out,
                    0,
                    limit,
                );
                if self.out.len() > limit {
                    let n = self.out.len();
                    self.out.clear();
                    super::super::dispatch::error_message(
                        &mut self.out,
                        &format!("result of {n} bytes exceeds the slot's {limit}"),
                    );
                    status = Status::ResultTooLarge;
                }
                if self.out.len() > b.held || self.buffers() > self.charge.charged {
                    status = self.charge_result(b, status);
                }
                status
            }
        };
        self.publish(i, b, status, len);
    }

    /// Runs a call of an in-place procedure ([`crate::Export::in_place`]) on its arguments' private
    /// copy, where its `InOut` buffer is changed and its return value appended, and publishes the
    /// result from there: no result buffer grows to the buffer's size, and it is not copied once
    /// more. An error goes back from `self.out`.
    #[cold]
    #[inline(never)]
    pub(super) fn serve_in_place(&mut self, i: u32, b: &mut Books, procedure: u16, arrival: Arrival, len: usize) {
        let team = self.team;
        let ran = super::super::dispatch::run_in_place(
            &team.shared,
            &team.binding,
            procedure,
            &mut self.args,
            0,
            arrival,
            &mut self.out,
            0,
        );
        let limit = team.layout.data;
        match ran {
            Ok(body) if self.args.len() - body <= limit => {
                // The return value may have grown the arguments' copy, and the result may reach
                // past the pages the call took: charged first, as any result.
                let n = self.args.len() - body;
                let held = b.held.max(n.next_multiple_of(PAGE));
                let fits = (held == b.held && self.buffers() <= self.charge.charged) || self.settle(b, held, 0) || {
                    self.team.forget_taken();
                    self.settle(b, held, 0)
                };
                if fits {
                    team.shared.stats.in_place.fetch_add(1, Ordering::Relaxed);
                    return self.publish_from(i, b, Status::Ok, len, Some(body));
                }
                self.args = Vec::new();
                let message = format!("result of {n} bytes exceeds the server's shared-memory budget");
                super::super::dispatch::error_message(&mut self.out, &message);
                self.charge.settle(self.buffers());
                self.publish(i, b, Status::ResultTooLarge, len)
            }
            Ok(body) => {
                let n = self.args.len() - body;
                super::super::dispatch::error_message(
                    &mut self.out,
                    &format!("result of {n} bytes exceeds the slot's {limit}"),
                );
                self.publish(i, b, Status::ResultTooLarge, len)
            }
            Err(status) => self.publish(i, b, status, len),
        }
    }

    /// Writes the result in `self.out` with `status` into slot `i` (claimed: `b`), whose call had
    /// `len` bytes of arguments, and publishes it.
    pub(super) fn publish(&mut self, i: u32, b: &mut Books, status: Status, len: usize) {
        self.publish_from(i, b, status, len, None)
    }

    /// [`Self::publish`] of the result in `self.out`, or with `in_args`, in `self.args` from there on
    /// (an in-place procedure's).
    pub(super) fn publish_from(&mut self, i: u32, b: &mut Books, status: Status, len: usize, in_args: Option<usize>) {
        let team = self.team;
        let data = team.layout.data(i);
        let out = match in_args {
            Some(body) => &self.args[body..],
            None => &self.out[..],
        };
        if !out.is_empty() {
            team.region.write(data, out);
        }
        let out_len = out.len();
        let w = self.slots[i as usize];
        // The binding holds more than three quarters of its budget. (Not half: a maximum-size
        // call's slot pages and private copy take half the default budget by themselves, and giving
        // them back after every such call made a stream of them 13 times slower.)
        let pressed = || team.budget.used() > team.budget.limit() / 4 * 3;
        if (len > retention::LARGE || out_len > retention::LARGE) && pressed() {
            // First the private buffer a large call of another shape grew and this one left
            // unused: only this process pays to grow it again, while the slot's pages given back
            // are faulted in anew by both (large Out results alternating with large In arguments
            // had the slot's pages given back after every In call, which took twice as long).
            self.give_back_unused(len, in_args.is_some());
        }
        let extent = b.held;
        let result = out_len.next_multiple_of(PAGE);
        if len > retention::LARGE && extent > result {
            // The arguments were large: give back the part of the slot the result does not cover,
            // but not on every call (a stream of large calls would fault the pages in anew) unless
            // the binding is still pressed.
            if b.retention.large(Instant::now()) || pressed() {
                team.region.discard(data + result, extent - result);
                team.shared.stats.given_back.fetch_add((extent - result) as u64, Ordering::Relaxed);
                b.held = result;
                b.charge.settle(result);
            }
        }
        let (state, waiting) = (&w[slot::STATE / 4], &w[slot::CLIENT_WAITING / 4]);
        mark(Point::ResultReady);
        // The result's words go in just before its state, with no work between their stores.
        proto::write_result(|at| &w[at / 4], out_len, status);
        let wake = proto::server_publish(state, waiting);
        // Out to the cache the cores share, where the client's core reads them next: the slot's
        // words, the result, and the arguments' lines this thread read (still held: not given back
        // above), which the client's next call writes over. A line the server's core read stays in
        // its cache, and the client's write to it waited for that copy to be taken away: tiercel's
        // BigIn (204 bytes) took 0.54 and 0.57 µs before, 0.46 and 0.48 after (`bench --quick
        // --latency-only --transports shm`, two runs of each build, alternating; the CHANGELOG's
        // forty-fourth entry has the raw ping-pongs that showed it).
        team.region.demote(team.layout.slot(i), slot::WORDS * 4);
        team.region.demote(data, out_len.max(len.min(b.held)));
        match wake {
            proto::Wake::Nobody => {}
            proto::Wake::Slot => futex_wake(state, 1),
            proto::Wake::Doorbell => {
                let bell = self.word(header::CLIENT_DOORBELL);
                bell.fetch_add(1, Ordering::SeqCst);
                futex_wake(bell, i32::MAX as u32);
            }
        }
        mark(Point::ResultSent);
    }

    /// Charges the pages a result written to slot `b` takes, and the buffers the procedure grew.
    /// A result the budgets have no room for is replaced by an error that says so (the procedure
    /// ran), as over UDP.
    #[cold]
    #[inline(never)]
    pub(super) fn charge_result(&mut self, b: &mut Books, status: Status) -> Status {
        let held = b.held.max(self.out.len().next_multiple_of(PAGE));
        if self.settle(b, held, 0) {
            return status;
        }
        // The arguments are no longer needed.
        self.args = Vec::new();
        self.team.forget_taken();
        if self.settle(b, held, 0) {
            return status;
        }
        let n = self.out.len();
        self.out = Vec::new();
        super::super::dispatch::error_message(
            &mut self.out,
            &format!("result of {n} bytes exceeds the server's shared-memory budget"),
        );
        // At most a page of message, in a page charged before the call ran.
        self.charge.settle(self.buffers());
        Status::ResultTooLarge
    }
}
