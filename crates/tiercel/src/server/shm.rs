//! The server side of the shared-memory transport: the rendezvous listener, and one thread per
//! binding that serves its slots, spinning for `ServerConfig::spin` after each call and then sleeping
//! on the region's doorbell futex.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tiercel_proto::bind::{BindDecision, Refused};
use tiercel_proto::shm::{self as proto, header, slot, Layout};
use tiercel_proto::wire::{Packet, Status};
use tiercel_sys::clock;
use tiercel_sys::shm::{futex_wait, futex_wake, Region};

use super::Shared;
use crate::rendezvous;
use crate::retention::{self, Retention};
use crate::steps::{self, mark, Point};

/// How long a blocked server thread sleeps before looking whether its client is still there.
const LIVENESS: Duration = Duration::from_millis(100);
/// How long a client has to complete the bind exchange.
const BIND_TIMEOUT: Duration = Duration::from_secs(5);

/// Listens for shared-memory bind requests until the server stops. Returns `None` when the name is
/// taken (another server of this address in this network namespace): clients then use UDP.
pub(super) fn listen(shared: &Arc<Shared>, addr: std::net::SocketAddr) -> Option<std::thread::JoinHandle<()>> {
    let name = rendezvous::rendezvous_name(addr);
    let listener = UnixAddr::from_abstract_name(name.as_bytes()).and_then(|a| UnixListener::bind_addr(&a)).ok()?;
    listener.set_nonblocking(true).ok()?;
    let shared = shared.clone();
    std::thread::Builder::new().name("tiercel-shm-rendezvous".into()).spawn(move || accept_loop(shared, listener)).ok()
}

fn accept_loop(shared: Arc<Shared>, listener: UnixListener) {
    let live = Arc::new(AtomicUsize::new(0));
    while !shared.stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                let _ = stream.set_nonblocking(false);
                if live.load(Ordering::Relaxed) >= shared.config.max_bindings || shared.refusing_bindings() {
                    // No room: closing the connection unread tells the client (it reads end of file).
                    shared.stats.rejected.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                live.fetch_add(1, Ordering::Relaxed);
                let (shared_, live_) = (shared.clone(), live.clone());
                let spawned = std::thread::Builder::new().name("tiercel-shm-binding".into()).spawn(move || {
                    serve_connection(&shared_, stream);
                    live_.fetch_sub(1, Ordering::Relaxed);
                });
                if spawned.is_err() {
                    live.fetch_sub(1, Ordering::Relaxed);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let _ = tiercel_sys::udp::wait_readable_fd(&listener, Some(LIVENESS));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Which of the server's CPUs a new binding thread takes (round robin).
fn binding_index(shared: &Shared) -> usize {
    shared.shm_bindings.load(Ordering::Relaxed)
}

/// One binding: the bind exchange, then serving its slots until the client goes away.
fn serve_connection(shared: &Arc<Shared>, stream: UnixStream) {
    // Measure the tick counter's rate now, not on the first call.
    let _ = clock::ticks_per_second();
    let _ = stream.set_read_timeout(Some(BIND_TIMEOUT));
    let Some((binding, region, layout)) = bind(shared, &stream) else { return };
    let _ = stream.set_read_timeout(None);
    let cpus = &shared.config.cpus;
    if !cpus.is_empty() {
        let _ = tiercel_sys::cpu::pin_current_thread(cpus[binding_index(shared) % cpus.len()]);
    }
    shared.stats.bindings.fetch_add(1, Ordering::Relaxed);
    shared.shm_bindings.fetch_add(1, Ordering::Relaxed);
    let retention = vec![Retention::default(); layout.slots as usize];
    SlotServer {
        shared,
        stream: &stream,
        region: &region,
        layout,
        binding,
        args: Vec::new(),
        out: Vec::new(),
        retention,
    }
    .run();
    shared.shm_bindings.fetch_sub(1, Ordering::Relaxed);
}

/// The bind exchange, decided by the server's bind machine. Returns the binding's export, its
/// region and layout, or `None` after telling the client why not.
fn bind(shared: &Shared, stream: &UnixStream) -> Option<(Arc<dyn crate::interface::Export>, Region, Layout)> {
    let machine = shared.bind_machine(0);
    // Challenges are bound to this connection: a random id stands for the peer's address.
    let peer: [u8; 16] = crate::client::random_bytes().ok()?;
    // At most two requests: the first, and the one with the proof a challenge asked for.
    for _ in 0..2 {
        let (msg, _) = rendezvous::recv(stream).ok()?;
        let Ok(p) = Packet::new_checked(&msg[..]) else {
            shared.stats.malformed.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let admission = match machine.on_request(&p, &peer, rendezvous::MAX_MESSAGE) {
            BindDecision::Malformed => {
                shared.stats.malformed.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            BindDecision::Answer { packet, refused } => {
                shared.count_refusal(refused);
                rendezvous::send(stream, &packet, None).ok()?;
                if refused == Refused::Challenged {
                    continue;
                }
                return None;
            }
            BindDecision::Admit(a) => a,
        };
        let slots = shared.config.slots_per_binding.clamp(1, proto::MAX_SLOTS);
        let made = Layout::new(slots, shared.config.timing.max_message).and_then(|layout| {
            let region = Region::create("tiercel-binding", layout.region_len()?).ok()?;
            for (at, v) in layout.header_words() {
                region.u32_at(at)?.store(v, Ordering::Relaxed);
            }
            Some((region, layout))
        });
        let Some((region, layout)) = made else {
            shared.stats.rejected.fetch_add(1, Ordering::Relaxed);
            let _ = rendezvous::send(stream, &admission.busy(&machine), None);
            return None;
        };
        let id = shared.next_shm_binding.fetch_add(1, Ordering::Relaxed);
        let reply = admission.grant(&machine, id, 0, slots, layout.data as u64);
        rendezvous::send(stream, &reply, Some(region.fd())).ok()?;
        return Some((shared.exports[admission.export].clone(), region, layout));
    }
    None
}

struct SlotServer<'a> {
    shared: &'a Shared,
    stream: &'a UnixStream,
    region: &'a Region,
    layout: Layout,
    binding: Arc<dyn crate::interface::Export>,
    args: Vec<u8>,
    out: Vec<u8>,
    /// When each slot last moved a large call and gave pages back.
    retention: Vec<Retention>,
}

/// A control word of the region. Offsets come from the layout the region was created with, so they
/// are in bounds and aligned.
fn word(region: &Region, at: usize) -> &AtomicU32 {
    region.u32_at(at).unwrap_or_else(|| unreachable!("layout offset {at} inside the region"))
}

impl<'a> SlotServer<'a> {
    fn word(&self, at: usize) -> &'a AtomicU32 {
        word(self.region, at)
    }

    fn run(&mut self) {
        let shared = self.shared;
        let slots = self.layout.slots;
        let (doorbell, sleeping) = (self.word(header::DOORBELL), self.word(header::SERVER_SLEEPING));
        let states: Vec<&AtomicU32> = (0..slots).map(|i| self.word(self.layout.slot(i) + slot::STATE)).collect();
        let used_word = self.word(header::SLOTS_USED);
        // Slots below the clients' high-water mark (a malicious client's value is capped).
        let used = || (used_word.load(Ordering::Acquire) as usize).min(slots as usize);
        // Spin after each call for about twice the recent gap between a result and the next call
        // (at most `spin`), or always `spin` when adaptation is off; then sleep on the doorbell.
        let policy = if shared.config.adaptive_spin {
            crate::Spin::Adaptive { max: shared.config.spin }
        } else {
            crate::Spin::Fixed(shared.config.spin)
        };
        let mut budget = crate::spin::SpinBudget::new(policy);
        // Times in ticks of the tick counter: read after every call, it costs a third of the clock.
        let mut last_result = clock::ticks();
        let mut spin_until = last_result + clock::ticks_in(budget.budget());
        let mut rounds = 0u32;
        let mut idle = 0u32;
        loop {
            let mut served = false;
            for (i, state) in states[..used()].iter().enumerate() {
                if proto::server_has_call(*state) {
                    mark(Point::ServerArrived);
                    self.serve(i as u32);
                    steps::close();
                    served = true;
                }
            }
            if served {
                // Off the critical path: the result is already published. The gap between results
                // stands for how soon the client calls again.
                let now = clock::ticks();
                budget.observe(clock::elapsed(last_result, now));
                last_result = now;
                spin_until = now + clock::ticks_in(budget.budget());
                rounds = rounds.wrapping_add(1);
                idle = 0;
                // A client calling without pause never lets this thread sleep: look at the stop flag
                // now and then all the same.
                if rounds.is_multiple_of(1024) && self.shared.stop.load(Ordering::Relaxed) {
                    return;
                }
                continue;
            }
            // Read the clock only every 64 idle rounds, so that a spinning server notices a call
            // within a few loads, not a clock read.
            idle = idle.wrapping_add(1);
            if !idle.is_multiple_of(64) || clock::ticks() < spin_until {
                core::hint::spin_loop();
                continue;
            }
            let any_call = || states[..used()].iter().any(|s| proto::server_has_call(*s));
            if let Some(bell) = proto::server_prepare_sleep(doorbell, sleeping, any_call) {
                if futex_wait(doorbell, bell, Some(LIVENESS)) {
                    steps::slept(steps::Side::Server);
                }
            }
            proto::server_woke(sleeping);
            if clock::elapsed(last_result, clock::ticks()) >= LIVENESS {
                // Idle a while: give back the private copies of large arguments and results (kept
                // while calls come, so that a stream of large calls does not fault them in anew).
                if self.args.capacity() > retention::LARGE {
                    self.args = Vec::new();
                }
                if self.out.capacity() > retention::LARGE {
                    self.out = Vec::new();
                }
            }
            if self.shared.stop.load(Ordering::Relaxed) || tiercel_sys::shm::peer_closed(self.stream) {
                // The client died or dropped the binding: its region goes with this thread.
                self.shared.stats.expired.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }

    /// Runs the call in slot `i`: reads what the client wrote once into private memory, validates it,
    /// runs the procedure, writes the result in place and publishes it.
    fn serve(&mut self, i: u32) {
        let base = self.layout.slot(i);
        let data = self.layout.data(i);
        // Each control word is read once; the call is validated before anything uses it.
        let procedure = self.word(base + slot::PROCEDURE).load(Ordering::Relaxed);
        let len = self.word(base + slot::LEN).load(Ordering::Relaxed);
        self.out.clear();
        let call = proto::validate_call(procedure, len, self.layout.data);
        mark(Point::ServerValidated);
        let len = call.map_or(0, |c| c.len);
        let status = match call {
            None => {
                super::dispatch::error_message(
                    &mut self.out,
                    "malformed shared-memory call: length or procedure out of range",
                );
                Status::BadArguments
            }
            Some(call) => {
                self.args.resize(call.len, 0);
                self.region.read(data, &mut self.args);
                mark(Point::ServerAccepted);
                self.shared.stats.calls.fetch_add(1, Ordering::Relaxed);
                let limit = self.layout.data;
                let mut status = super::dispatch::run_procedure(
                    &*self.binding,
                    call.procedure,
                    &self.args,
                    &mut self.out,
                    0,
                    limit,
                    &self.shared.stats,
                );
                if self.out.len() > limit {
                    let n = self.out.len();
                    self.out.clear();
                    super::dispatch::error_message(
                        &mut self.out,
                        &format!("result of {n} bytes exceeds the slot's {limit}"),
                    );
                    status = Status::ResultTooLarge;
                }
                status
            }
        };
        self.region.write(data, &self.out);
        self.word(base + slot::LEN).store(self.out.len() as u32, Ordering::Relaxed);
        self.word(base + slot::STATUS).store(status as u32, Ordering::Relaxed);
        if len > retention::LARGE && len > self.out.len() {
            // The arguments were large: give back the part of the slot the result does not cover,
            // but not on every call (a stream of large calls would fault the pages in anew).
            if self.retention.get_mut(i as usize).is_some_and(|r| r.large(Instant::now())) {
                self.region.discard(data + self.out.len(), len - self.out.len());
            }
        }
        let (state, waiting) = (self.word(base + slot::STATE), self.word(base + slot::CLIENT_WAITING));
        mark(Point::ResultReady);
        if proto::server_publish(state, waiting) {
            futex_wake(state, 1);
        }
        mark(Point::ResultSent);
    }
}
