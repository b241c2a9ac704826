//! The async client (feature `async`): the calls of a binding as futures, for tokio tasks.
//!
//! A call takes an endpoint (client slot, socket or shared-memory slot, buffers) from the binding's
//! pool, sends from the task that awaits it, and waits without holding a thread: over UDP on the
//! endpoint's own socket, registered with tokio's reactor from a call's wait until a lone call
//! (which spins) lets it go ([`crate::waiting`]), so the result is read by the task it is for, from
//! the socket into the endpoint's buffer, with no handoff; through AF_XDP on the station, one
//! waiting reader at a time polling its sockets through the reactor and leaving the others'
//! datagrams in their mailboxes, which wakes their tasks; through shared memory on the slot, whose
//! result one thread of the client's process watches for every async call of the binding (the
//! client doorbell), waking the task, which copies the result out itself. A call that is the only
//! one of its binding in flight first spins for about the expected round trip, as a synchronous
//! call does (waking a parked runtime thread costs more than a round trip on a small machine); with
//! several in flight, each yields at once (over UDP, a call not alone waits for its socket to be
//! readable before its first look, so it makes no receive that cannot yet succeed: one system call
//! fewer per call, a send and a receive left).
//!
//! When every slot of the binding is in use, a call waits for one to come back: calls queue, in
//! the order they asked, rather than fail. Dropping a call's future before it completes cancels it:
//! the slot goes back to the pool at once (a shared-memory slot becomes usable again when the server
//! has answered the abandoned call), and the call may or may not have run.

use std::future::poll_fn;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use tokio::io::Interest;
use tokio::sync::Notify;

use super::shm::{Link, ShmEndpoint};
use super::tcp::TcpEndpoint;
use super::udp::{Step, UdpEndpoint};
use super::{current_runtime, BindingInner};
use crate::wire::Segments;
use crate::{Binding, CallError};

/// A binding's async side: its pool of endpoints and the calls in flight.
#[derive(Default)]
pub(crate) struct AsyncState {
    pool: Mutex<Pool>,
    /// Signalled when an endpoint comes back to the pool while calls are queued for one.
    returned: Notify,
    /// Calls queued for an endpoint.
    queued: AtomicUsize,
    /// Async calls of the binding sent and not yet answered.
    in_flight: AtomicUsize,
    /// How many async shared-memory calls of the binding found their result by looking (the count
    /// may miss some, never a change): while results keep coming, the server is answering and no
    /// call needs the waiting thread (see [`ShmEndpoint::poll_for_result`]).
    results: AtomicU64,
    /// The thread that watches the shared-memory slots of async calls (started by the first).
    waiter: Waiter,
    /// The readiness of the binding's AF_XDP station, registered with the reactor of the runtime
    /// whose async call last waited at it, until a lone call (which spins) lets it go.
    #[cfg(feature = "xdp")]
    station_ready: Mutex<StationReady>,
    /// Whether `station_ready` holds a registration: a lone call that finds none (every lone call
    /// after the first) lets nothing go without taking the lock.
    #[cfg(feature = "xdp")]
    station_registered: std::sync::atomic::AtomicBool,
}

/// The readiness of a binding's AF_XDP station ([`crate::xdp::Station::readiness`]) and its
/// registration with a runtime's reactor.
#[cfg(feature = "xdp")]
#[derive(Default)]
struct StationReady {
    /// The registration, and the runtime whose reactor has it.
    registered: Option<(tokio::runtime::Id, Arc<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>>)>,
    /// The descriptor of a registration let go, kept for the next one (made anew, it takes a
    /// system call for each socket of the station).
    spare: Option<std::os::fd::OwnedFd>,
}

#[derive(Default)]
struct Pool {
    // Boxed so that taking one out for a call and giving it back moves a pointer.
    #[allow(clippy::vec_box)]
    idle: Vec<Box<AsyncEndpoint>>,
    /// Endpoints made for async calls, idle or not.
    created: usize,
}

/// An endpoint of async calls (always boxed, so its size is that of a pointer wherever it goes).
#[allow(clippy::large_enum_variant)]
pub(crate) enum AsyncEndpoint {
    /// A UDP endpoint, and how its task learns that a datagram may be there.
    Udp {
        /// Readiness of the socket, or of the station the endpoint's datagrams come through.
        ready: Ready,
        /// The endpoint.
        ep: UdpEndpoint,
    },
    /// A shared-memory slot.
    Shm(ShmEndpoint),
    /// A client slot on a TCP binding's connection.
    Tcp(TcpEndpoint),
}

impl AsyncEndpoint {
    fn new(inner: &Arc<BindingInner>) -> Result<AsyncEndpoint, CallError> {
        current_runtime()?;
        match (&inner.shm, &inner.tcp) {
            (None, None) => {
                let mut ep = UdpEndpoint::new(inner, false)?;
                #[cfg(feature = "xdp")]
                if let Some(port) = ep.xdp_port() {
                    let ready = Ready::Station { station: port.station.clone(), port: port.port };
                    return Ok(AsyncEndpoint::Udp { ready, ep });
                }
                ep.set_nonblocking()?;
                Ok(AsyncEndpoint::Udp { ready: Ready::Socket(None), ep })
            }
            (Some(link), _) => ShmEndpoint::new(inner, link).map(AsyncEndpoint::Shm),
            (None, Some(link)) => TcpEndpoint::new(inner, link).map(AsyncEndpoint::Tcp),
        }
    }

    pub(super) fn begin(&mut self, context: &tiercel_proto::context::Context) {
        match self {
            AsyncEndpoint::Udp { ep, .. } => ep.begin(context),
            AsyncEndpoint::Shm(ep) => ep.begin(context),
            AsyncEndpoint::Tcp(ep) => ep.begin(context),
        }
    }

    /// Packets the last call retransmitted.
    pub(super) fn call_retransmissions(&self) -> u64 {
        match self {
            AsyncEndpoint::Udp { ep, .. } => ep.call_retransmissions(),
            AsyncEndpoint::Shm(_) | AsyncEndpoint::Tcp(_) => 0,
        }
    }

    /// Gives the endpoint of an async call that ended (done, failed, never sent, or its future
    /// dropped) back to `inner`'s pool, first giving up its call if it is still `in_flight`.
    pub(super) fn give_back(mut ep: Box<AsyncEndpoint>, inner: &BindingInner, in_flight: bool) {
        if in_flight {
            ep.cancel(inner);
        }
        inner.asynch.release(ep);
    }

    /// Gives up the call in flight (its future was dropped): tells the server, best effort.
    pub(super) fn cancel(&mut self, inner: &BindingInner) {
        match self {
            // A server that does not take cancels saves the result for a retransmission that never
            // comes, until the slot's next call acknowledges it. Either way the endpoint's next
            // call leaves the slot to it (`super::slots`).
            AsyncEndpoint::Udp { ep, .. } => {
                if inner.cancels() {
                    ep.cancel();
                }
                ep.abandon();
            }
            AsyncEndpoint::Shm(ep) => {
                if let Some(link) = &inner.shm {
                    ep.abandon(inner, link);
                }
            }
            // Its mailbox is cleared (and the reading handed over): the result is dropped when it
            // comes, and the endpoint's next call goes out on another slot.
            AsyncEndpoint::Tcp(ep) => {
                if let Some(link) = &inner.tcp {
                    ep.cancel(inner, link);
                }
            }
        }
    }

    pub(super) fn scratch_mut(&mut self) -> &mut Vec<u8> {
        match self {
            AsyncEndpoint::Udp { ep, .. } => ep.scratch_mut(),
            AsyncEndpoint::Shm(ep) => ep.scratch_mut(),
            AsyncEndpoint::Tcp(ep) => ep.scratch_mut(),
        }
    }

    pub(super) fn result(&self) -> &[u8] {
        match self {
            AsyncEndpoint::Udp { ep, .. } => ep.result(),
            AsyncEndpoint::Shm(ep) => ep.result(),
            AsyncEndpoint::Tcp(ep) => ep.result(),
        }
    }

    /// Makes the call and leaves its result where [`AsyncEndpoint::result`] finds it. `alone`: no
    /// other async call of the binding is in flight, so spinning first costs no other call.
    /// `tail`: a buffer lent to the call, as to [`UdpEndpoint::run_in_out`] (the message is `segs`
    /// followed by it, and the result is received into it); true when it was.
    pub(super) async fn run(
        &mut self,
        binding: &Binding,
        procedure: u16,
        segs: &Segments<'_>,
        tail: Option<&mut [u8]>,
        alone: bool,
    ) -> Result<bool, CallError> {
        match self {
            AsyncEndpoint::Udp { ready, ep } => run_udp(binding, ready, ep, procedure, segs, tail, alone).await,
            AsyncEndpoint::Tcp(ep) => match &binding.inner.tcp {
                Some(link) => ep.run_async(&binding.inner, link, binding.deadline, procedure, segs, tail, alone).await,
                None => unreachable!("a TCP endpoint belongs to a TCP binding"),
            },
            AsyncEndpoint::Shm(ep) => match &binding.inner.shm {
                Some(link) => ep.run_async(&binding.inner, link, binding.deadline, procedure, segs, tail, alone).await,
                None => unreachable!("a shared-memory endpoint belongs to a shared-memory binding"),
            },
        }
    }
}

async fn run_udp(
    binding: &Binding,
    ready: &mut Ready,
    ep: &mut UdpEndpoint,
    procedure: u16,
    segs: &Segments<'_>,
    mut tail: Option<&mut [u8]>,
    alone: bool,
) -> Result<bool, CallError> {
    let inner = &*binding.inner;
    if !alone {
        // Cleared before the call goes, the socket's readiness is set again by the first datagram
        // after it (the result, or an acknowledgement): the call waits for that before its first
        // look, rather than make a receive that cannot yet succeed.
        ready.clear();
    }
    let (len, start) = match tail.as_deref() {
        Some(tail) => ep.send_lent(binding, procedure, segs, tail)?,
        None => ep.send_call(binding, procedure, segs)?,
    };
    if alone && ep.spins() {
        // A lone call that spins reads its datagrams itself, and a registration (left by a call
        // that waited) would have each wake the reactor: let go now, while the call is on its way.
        // (One whose budget is spent waits at once, and keeps it.)
        ready.leave(inner);
    }
    if !alone {
        ready.wait(inner, ep).await?;
    }
    // The clock's last reading before each look: when what the look finds was received, to the
    // call's timers (see `UdpEndpoint::step`).
    let mut seen = Instant::now();
    // A lone call spins (for its budget, and for each next packet while they keep coming).
    let mut deadline = alone.then(|| ep.spin_deadline(start));
    loop {
        // Clear the socket's readiness, then look: a datagram that arrives after the clear sets
        // it again, so the wait below cannot miss it.
        ready.clear();
        let now = match ep.step(inner, segs, tail.as_deref_mut(), len, seen)? {
            Step::Done => break,
            Step::Progress => {
                seen = Instant::now();
                if let Some(d) = &mut deadline {
                    d.progress(seen);
                }
                continue;
            }
            Step::Idle(now) => now,
        };
        seen = now;
        if deadline.is_some_and(|d| d.spinning(now)) {
            core::hint::spin_loop();
            continue;
        }
        ready.wait(inner, ep).await?;
        seen = Instant::now();
    }
    ep.observe(seen.saturating_duration_since(start));
    ep.finish(inner, procedure)?;
    Ok(tail.is_some_and(|tail| ep.settle_lent(inner, tail)))
}

/// How an async UDP call learns that a datagram may be there for it.
pub(crate) enum Ready {
    /// Its socket, registered with the reactor of the runtime whose call last waited on it, from
    /// a call's wait until a lone call lets it go (`None` when not registered).
    Socket(Option<Registered>),
    /// Its port's mailbox at an AF_XDP station, and the station's sockets (through the binding's
    /// registration of their readiness with the reactor) while the call's task has the turn to
    /// poll them.
    #[cfg(feature = "xdp")]
    Station { station: Arc<crate::xdp::Station>, port: u16 },
}

/// An async UDP endpoint's socket registered with a runtime's reactor (a duplicate of the
/// endpoint's descriptor, non-blocking: same socket, so readiness of one is readiness of the other).
pub(crate) struct Registered {
    socket: tokio::net::UdpSocket,
    /// The runtime whose reactor it is registered with.
    runtime: tokio::runtime::Id,
}

impl Ready {
    /// Lets the socket's registration go, if it has one, or the station's (a lone call's, which
    /// spins: no other async call of the binding waits on it).
    #[inline]
    fn leave(
        &mut self,
        // (The binding's station's registration, through AF_XDP.)
        #[cfg_attr(not(feature = "xdp"), allow(unused_variables))] inner: &BindingInner,
    ) {
        match self {
            Ready::Socket(registered) => *registered = None,
            #[cfg(feature = "xdp")]
            Ready::Station { .. } => inner.asynch.leave_station(),
        }
    }

    /// Forgets that a datagram came (see [`clear_readiness`]); a socket not registered has nothing
    /// to forget (its registration, when a wait makes it, starts from what the socket holds).
    #[inline]
    fn clear(&self) {
        match self {
            Ready::Socket(Some(registered)) => clear_readiness(&registered.socket),
            Ready::Socket(None) => {}
            // A station's readiness is cleared by the task that polls, when it wakes.
            #[cfg(feature = "xdp")]
            Ready::Station { .. } => {}
        }
    }

    /// Waits without holding the thread until a datagram may be there or the endpoint's timer is
    /// due.
    async fn wait(
        &mut self,
        // (The binding's station, through AF_XDP.)
        #[cfg_attr(not(feature = "xdp"), allow(unused_variables))] inner: &BindingInner,
        ep: &UdpEndpoint,
    ) -> Result<(), CallError> {
        match self {
            Ready::Socket(registered) => {
                let r = register(registered, ep)?;
                wait_readable(&r.socket, ep).await
            }
            #[cfg(feature = "xdp")]
            Ready::Station { station, port } => {
                let fd = inner.asynch.station_ready(station)?;
                wait_station(&fd, station, *port, ep).await
            }
        }
    }
}

/// Waits until `port`'s mailbox at `station` holds a datagram, or a frame may be in the station's
/// sockets while this task has the turn to poll them (see [`crate::xdp::Station::turn`]), or the
/// endpoint's timer is due.
#[cfg(feature = "xdp")]
async fn wait_station(
    fd: &tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
    station: &crate::xdp::Station,
    port: u16,
    ep: &UdpEndpoint,
) -> Result<(), CallError> {
    use tiercel_sys::xdp::Turn;
    crate::steps::slept(crate::steps::Side::Client);
    /// Ends the task's wait at the station, however it ends (its future may be dropped).
    struct Waiting<'s> {
        station: &'s crate::xdp::Station,
        port: u16,
        polled: bool,
    }
    impl Drop for Waiting<'_> {
        fn drop(&mut self) {
            self.station.done_waiting(self.port, self.polled);
        }
    }
    let mut waiting = Waiting { station, port, polled: false };
    let woken = poll_fn(|cx| {
        match waiting.station.turn(waiting.port, cx.waker(), waiting.polled) {
            Turn::Letter => return Poll::Ready(Ok(())),
            Turn::Wait => return Poll::Pending,
            Turn::Poll => waiting.polled = true,
        }
        match fd.poll_read_ready(cx) {
            // Cleared before the call's next look: a frame that comes after marks it again.
            Poll::Ready(Ok(mut ready)) => {
                ready.clear_ready();
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    });
    match ep.next_timeout() {
        // When it ends at the timer, the next step handles what is due.
        Some(t) => {
            if let Ok(woken) = tokio::time::timeout_at(t.into(), woken).await {
                woken?;
            }
        }
        None => woken.await?,
    }
    Ok(())
}

/// The endpoint's socket registered with the reactor of the runtime this task runs on, made now
/// if it is not (or is registered with another runtime's, which may be gone).
fn register<'r>(registered: &'r mut Option<Registered>, ep: &UdpEndpoint) -> Result<&'r mut Registered, CallError> {
    let runtime = current_runtime()?;
    if registered.as_ref().is_some_and(|r| r.runtime != runtime) {
        // Off the other runtime's reactor first.
        *registered = None;
    }
    match registered {
        Some(r) => Ok(r),
        None => {
            let socket = tokio::net::UdpSocket::from_std(ep.socket().try_clone()?)?;
            Ok(registered.insert(Registered { socket, runtime }))
        }
    }
}

/// Forgets that the socket was readable (no system call): the next datagram to arrive marks it so
/// again.
fn clear_readiness(ready: &tokio::net::UdpSocket) {
    let _ = ready.try_io(Interest::READABLE, || Err::<(), _>(std::io::ErrorKind::WouldBlock.into()));
}

/// Waits without holding the thread until the socket is readable or the endpoint's timer is due.
async fn wait_readable(ready: &tokio::net::UdpSocket, ep: &UdpEndpoint) -> Result<(), CallError> {
    crate::steps::slept(crate::steps::Side::Client);
    match ep.next_timeout() {
        // When it ends at the timer, the next step handles what is due.
        Some(t) => {
            if let Ok(readable) = tokio::time::timeout_at(t.into(), ready.readable()).await {
                readable?;
            }
        }
        None => ready.readable().await?,
    }
    Ok(())
}

impl AsyncState {
    /// An endpoint for a call: an idle one, a new one while the binding has free slots, else the
    /// next one another call gives back.
    pub(super) async fn acquire(inner: &Arc<BindingInner>) -> Result<Box<AsyncEndpoint>, CallError> {
        let state = &inner.asynch;
        loop {
            if let Some(ep) = state.try_take(inner)? {
                return Ok(ep);
            }
            // Every slot is taken: wait for one of the async calls to give its back, looking once
            // more after registering, so that one given back meanwhile is not missed.
            let returned = state.returned.notified();
            let mut returned = std::pin::pin!(returned);
            returned.as_mut().enable();
            state.queued.fetch_add(1, Ordering::SeqCst);
            let taken = state.try_take(inner);
            if !matches!(taken, Ok(None)) {
                state.queued.fetch_sub(1, Ordering::SeqCst);
                return taken.map(|ep| ep.unwrap_or_else(|| unreachable!("matched None above")));
            }
            returned.await;
            state.queued.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// An idle endpoint, or a new one while the binding has free slots; `None` when every slot is
    /// taken by async calls (when none has one, they are all held by threads making synchronous
    /// calls, and the call fails with `NoFreeSlot`).
    pub(super) fn try_take(&self, inner: &Arc<BindingInner>) -> Result<Option<Box<AsyncEndpoint>>, CallError> {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(ep) = take_idle(&mut pool.idle) {
            return Ok(Some(ep));
        }
        match AsyncEndpoint::new(inner) {
            Ok(ep) => {
                pool.created += 1;
                Ok(Some(Box::new(ep)))
            }
            Err(CallError::NoFreeSlot(_)) if pool.created > 0 => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// An idle async endpoint's UDP endpoint, for good: the way a synchronous call gets a slot when
    /// async calls, done now, took every one.
    pub(super) fn lend_udp(&self) -> Option<Box<UdpEndpoint>> {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        let i = pool.idle.iter().position(|ep| matches!(&**ep, AsyncEndpoint::Udp { .. }))?;
        pool.created -= 1;
        match *pool.idle.swap_remove(i) {
            // The reactor's duplicate of the socket is dropped; the endpoint keeps its own.
            AsyncEndpoint::Udp { ep, .. } => Some(Box::new(ep)),
            _ => unreachable!("found a UDP endpoint above"),
        }
    }

    /// [`AsyncState::lend_udp`] for a shared-memory endpoint (one whose slot the server has given
    /// back: not one still held by a cancelled call).
    pub(super) fn lend_shm(&self) -> Option<Box<ShmEndpoint>> {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        let i = pool.idle.iter().position(|ep| matches!(&**ep, AsyncEndpoint::Shm(s) if !s.is_abandoned()))?;
        pool.created -= 1;
        match *pool.idle.swap_remove(i) {
            AsyncEndpoint::Shm(ep) => Some(Box::new(ep)),
            _ => unreachable!("found a shared-memory endpoint above"),
        }
    }

    /// [`AsyncState::lend_udp`] for a TCP endpoint.
    pub(super) fn lend_tcp(&self) -> Option<Box<TcpEndpoint>> {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        let i = pool.idle.iter().position(|ep| matches!(&**ep, AsyncEndpoint::Tcp(_)))?;
        pool.created -= 1;
        match *pool.idle.swap_remove(i) {
            AsyncEndpoint::Tcp(ep) => Some(Box::new(ep)),
            _ => unreachable!("found a TCP endpoint above"),
        }
    }

    /// Gives an endpoint back to the pool, and to the first call queued for one.
    pub(super) fn release(&self, ep: Box<AsyncEndpoint>) {
        self.pool.lock().unwrap_or_else(|p| p.into_inner()).idle.push(ep);
        if self.queued.load(Ordering::SeqCst) > 0 {
            self.returned.notify_one();
        }
    }

    /// The readiness of `station`, the binding's, registered with the reactor of the runtime this
    /// task runs on: made now if no call of this runtime registered it before (a call of another,
    /// which may be gone, registered it with that one's; its calls still waiting there go on).
    #[cfg(feature = "xdp")]
    fn station_ready(
        &self,
        station: &crate::xdp::Station,
    ) -> Result<Arc<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>>, CallError> {
        let runtime = current_runtime()?;
        let mut ready = self.station_ready.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((of, fd)) = &ready.registered {
            if *of == runtime {
                return Ok(fd.clone());
            }
        }
        let readiness = match ready.spare.take() {
            Some(fd) => fd,
            None => station.readiness()?,
        };
        let fd = Arc::new(tiercel_sys::xdp::register(readiness)?);
        ready.registered = Some((runtime, fd.clone()));
        self.station_registered.store(true, Ordering::Relaxed);
        Ok(fd)
    }

    /// Lets the station's registration go, if it has one (see [`Ready::leave`]), keeping its
    /// descriptor for the next if no task waiting on it holds it (else it leaves the reactor when
    /// the last such task lets it go).
    #[cfg(feature = "xdp")]
    fn leave_station(&self) {
        // (Set under the lock with the registration; a stale `false` only leaves a registration
        // made meanwhile by a call of another task, which waits on it, to the next lone call.)
        if !self.station_registered.load(Ordering::Relaxed) {
            return;
        }
        let mut ready = self.station_ready.lock().unwrap_or_else(|p| p.into_inner());
        self.station_registered.store(false, Ordering::Relaxed);
        if let Some((_, fd)) = ready.registered.take() {
            if let Ok(fd) = Arc::try_unwrap(fd) {
                ready.spare = Some(fd.into_inner());
            }
        }
    }

    /// Counts a call in flight until the returned guard drops; true when it is the only one.
    pub(super) fn fly(&self) -> (InFlight<'_>, bool) {
        let alone = self.in_flight.fetch_add(1, Ordering::AcqRel) == 0;
        (InFlight(&self.in_flight), alone)
    }
}

/// Prefers an endpoint whose slot is free now over one still held by an abandoned call.
#[allow(clippy::vec_box)]
fn take_idle(idle: &mut Vec<Box<AsyncEndpoint>>) -> Option<Box<AsyncEndpoint>> {
    let free = idle.iter().rposition(|ep| !matches!(&**ep, AsyncEndpoint::Shm(s) if s.is_abandoned()));
    match free {
        Some(i) => Some(idle.swap_remove(i)),
        None => idle.pop(),
    }
}

/// A call in flight, counted until dropped.
pub(super) struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How long the shared-memory waiter sleeps between looks when no doorbell rings, and how long an
/// idle one parks before looking whether its binding still exists.
const WAITER_TICK: Duration = Duration::from_millis(50);
const WAITER_IDLE: Duration = Duration::from_secs(1);

/// The most of its policy's longest spins an async shared-memory call looks at its slot for while
/// other calls of its binding find their results (see [`ShmEndpoint::poll_for_result`]): a long
/// procedure among a stream of quick ones does not keep its task looking for its whole run.
const LONGEST_LOOKS: u64 = 16;

/// The tasks waiting for results in a shared-memory binding's slots, and the thread that wakes them.
#[derive(Default)]
pub(crate) struct Waiter {
    inner: Mutex<WaiterInner>,
}

#[derive(Default)]
struct WaiterInner {
    wakers: Vec<(u32, Waker)>,
    thread: Option<std::thread::Thread>,
}

impl Waiter {
    /// Registers the task waiting for slot `slot`'s result, starting the waiting thread if need be.
    pub(super) fn register(&self, binding: &Arc<BindingInner>, slot: u32, waker: &Waker) -> Result<(), CallError> {
        let mut w = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        match w.wakers.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, known)) => known.clone_from(waker),
            None => w.wakers.push((slot, waker.clone())),
        }
        match &w.thread {
            Some(t) => t.unpark(),
            None => {
                let weak = Arc::downgrade(binding);
                let t = std::thread::Builder::new().name("tiercel-shm-wake".into()).spawn(move || watch(weak))?;
                w.thread = Some(t.thread().clone());
            }
        }
        Ok(())
    }

    /// Wakes the tasks whose slot holds its result; returns how many still wait.
    fn wake_done(&self, link: &Link) -> usize {
        let mut w = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        w.wakers.retain(|(slot, waker)| {
            let done = link.slot_done(*slot);
            if done {
                waker.wake_by_ref();
            }
            !done
        });
        w.wakers.len()
    }
}

/// What an async call among others knows of its looks that found nothing (tick counter readings):
/// see [`ShmEndpoint::poll_for_result`].
#[derive(Default)]
struct Looking {
    /// The first reading (`None` before it), and the window in ticks.
    start: Option<(u64, u64)>,
    /// The binding's count of results found, as last read, and when it was first read so.
    results: u64,
    since: u64,
}

impl Looking {
    /// After a look at `now` that found nothing, the binding's count of results found being
    /// `results`: whether to look again. Yes while some result came within `window` (read once, at
    /// the first reading), for at most [`LONGEST_LOOKS`] windows from the first reading.
    fn again(&mut self, now: u64, results: u64, window: impl FnOnce() -> u64) -> bool {
        let (start, window) = match self.start {
            Some(known) => known,
            None => {
                let known = (now, window());
                (self.start, self.results, self.since) = (Some(known), results, now);
                known
            }
        };
        if results != self.results {
            (self.results, self.since) = (results, now);
        }
        let stalled = now.saturating_sub(self.since) >= window;
        !stalled && now.saturating_sub(start) < window.saturating_mul(LONGEST_LOOKS)
    }
}

/// The waiting thread: reads the client doorbell, wakes the tasks whose results are in, and sleeps
/// on the doorbell while it holds the value read (a bump meanwhile ends the sleep at once).
fn watch(binding: Weak<BindingInner>) {
    loop {
        let Some(inner) = binding.upgrade() else { return };
        let Some(link) = &inner.shm else { return };
        let seen = link.client_doorbell();
        if inner.asynch.waiter.wake_done(link) > 0 {
            link.wait_client_doorbell(seen, WAITER_TICK);
        } else {
            drop(inner);
            std::thread::park_timeout(WAITER_IDLE);
        }
    }
}

impl ShmEndpoint {
    /// [`ShmEndpoint::run`] for an async call. `tail`: a buffer lent to the call, as to
    /// [`ShmEndpoint::run`]; true when the result's first bytes were copied there.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn run_async(
        &mut self,
        inner: &Arc<BindingInner>,
        link: &Link,
        deadline: Option<Duration>,
        procedure: u16,
        segs: &Segments<'_>,
        tail: Option<&mut [u8]>,
        alone: bool,
    ) -> Result<bool, CallError> {
        super::refused::run_async(self, inner, link, deadline, procedure, segs, tail, alone).await
    }
}

impl super::refused::TriesAsync for ShmEndpoint {
    type Link = Link;

    /// One try of [`ShmEndpoint::run_async`].
    async fn once_async(
        &mut self,
        inner: &Arc<BindingInner>,
        link: &Link,
        deadline: Option<Duration>,
        procedure: u16,
        segs: &Segments<'_>,
        tail: Option<&mut [u8]>,
        alone: bool,
    ) -> Result<bool, CallError> {
        let deadline = deadline.map(|d| Instant::now() + d);
        if self.is_abandoned() {
            if !self.poll_for_result(link, &inner.asynch.results).await {
                self.wait_async(inner, link, deadline, false).await?;
            }
            self.reclaim();
        }
        // A lone call's round trip goes into the spin budget its next lone call spins for. A call
        // among others queues behind them: its round trip says nothing of that budget, and its
        // clock is not read for it (on a VM, `perf` put a fifth of the async stub's samples on the
        // two readings of the tick counter this took).
        let started = if alone { tiercel_sys::clock::ticks() } else { 0 };
        let len = self.publish_lent(link, procedure, segs, tail.as_deref(), deadline, alone)?;
        // Until the result is read, the slot is the server's: if this future is dropped meanwhile,
        // the endpoint goes back to the pool as abandoned (see `AsyncEndpoint::cancel`).
        self.set_abandoned(true);
        // Spun for (alone), else looked for between other tasks' turns; the wait that registers
        // with the binding's waiting thread is a future of its own, which the calls whose results
        // come while they look never enter.
        let found = if alone {
            self.spin_for_result(link, &mut tiercel_sys::clock::ticks())
        } else {
            self.poll_for_result(link, &inner.asynch.results).await
        };
        if !found {
            self.wait_async(inner, link, deadline, true).await?;
        }
        self.set_abandoned(false);
        if alone {
            self.observe(tiercel_sys::clock::elapsed(started, tiercel_sys::clock::ticks()));
        }
        self.collect(inner, link, procedure, len, tail)
    }
}

impl ShmEndpoint {
    /// While other calls of the binding are in flight, the runtime has their tasks to run: this one
    /// looks at its slot each time it is polled again, yielding in between. True when the result
    /// came in; false once no async call of the binding has found its result (`results`) for the
    /// spin policy's longest spin (200 µs by default), or [`LONGEST_LOOKS`] of them have passed
    /// since the call's first reading of the clock.
    ///
    /// While results come, the server is answering, and this call's will come in turn. The budget
    /// of a lone call, which adapts to the round trips seen, does not serve here: with 64 calls in
    /// flight, a round trip is mostly queueing behind the other 63, and once their average passed
    /// the policy's longest spin, the budget was none. Every call then registered with the waiting
    /// thread at once, that thread took the runtime's CPU at every result (each rang the client
    /// doorbell), and the round trips stayed long: 64 tasks on one shared-memory binding made from
    /// 1.5 to 4.3 M calls a second from run to run.
    ///
    /// The clock is read from the second look that finds nothing on: the first is made as the call
    /// goes out, before the server can have answered, and a call among others usually finds its
    /// result at its second look, one round of the runtime's tasks later. Such a call reads no
    /// clock, and counts its result in `results` (a load and a store: two threads that race lose a
    /// count, not the change the looking calls watch for).
    async fn poll_for_result(&self, link: &Link, results: &AtomicU64) -> bool {
        let (mut looking, mut first) = (Looking::default(), true);
        poll_fn(|cx| {
            if link.slot_done(self.slot()) {
                results.store(results.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
                return Poll::Ready(true);
            }
            if !std::mem::take(&mut first) {
                let (now, seen) = (tiercel_sys::clock::ticks(), results.load(Ordering::Relaxed));
                if !looking.again(now, seen, || tiercel_sys::clock::ticks_in(self.spin_longest())) {
                    return Poll::Ready(false);
                }
            }
            // Back of the run queue at once (`tokio::task::yield_now` would wait for the runtime's
            // next look at its I/O driver, a system call per round of the tasks); the runtime still
            // polls its driver every few dozen tasks.
            cx.waker().wake_by_ref();
            Poll::Pending
        })
        .await
    }

    /// Waits for the slot's result without holding the thread, once the call has spun or looked
    /// for it ([`ShmEndpoint::spin_for_result`], [`ShmEndpoint::poll_for_result`]): registers with
    /// the binding's waiting thread. Fails as the synchronous wait does.
    async fn wait_async(
        &mut self,
        inner: &Arc<BindingInner>,
        link: &Link,
        deadline: Option<Instant>,
        ours: bool,
    ) -> Result<(), CallError> {
        current_runtime()?;
        let mut liveness = self.liveness(link);
        loop {
            let now = Instant::now();
            let timeout = deadline.map_or(WAITER_TICK, |d| d.saturating_duration_since(now).min(WAITER_TICK));
            let mut registered = Ok(());
            let woken = poll_fn(|cx| {
                if link.slot_done(self.slot()) {
                    return Poll::Ready(());
                }
                registered = inner.asynch.waiter.register(inner, self.slot(), cx.waker());
                if registered.is_err() || !self.prepare_wait_async(link) {
                    return Poll::Ready(());
                }
                Poll::Pending
            });
            let _ = tokio::time::timeout(timeout, woken).await;
            self.woke(link);
            registered?;
            if link.slot_done(self.slot()) {
                return Ok(());
            }
            self.check_alive(inner, link, &mut liveness, deadline, ours)?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_among_others_looks_while_the_binding_gets_results_and_not_past_its_longest() {
        let window = 200;
        // No result for a window since its first reading: the server is not answering.
        let mut looking = Looking::default();
        assert!(looking.again(1_000, 7, || window));
        assert!(looking.again(1_000 + 199, 7, || unreachable!("the window is read once")));
        assert!(!looking.again(1_000 + 200, 7, || window), "stalled from its first reading");
        // Its own result is long in coming, but others' keep coming: it looks on.
        let mut looking = Looking::default();
        assert!(looking.again(1_000, 7, || window));
        assert!(looking.again(1_000 + 150, 8, || window));
        assert!(looking.again(1_000 + 300, 9, || window));
        assert!(looking.again(1_000 + 499, 9, || window));
        assert!(!looking.again(1_000 + 500, 9, || window), "stalled since the count last changed");
        // A long procedure among quick ones: it stops after LONGEST_LOOKS windows even so.
        let mut looking = Looking::default();
        assert!(looking.again(1_000, 0, || window));
        let last = 1_000 + window * LONGEST_LOOKS;
        for (i, now) in (1_000..last).step_by(100).enumerate() {
            assert!(looking.again(now, i as u64 + 1, || window), "at {now}");
        }
        assert!(!looking.again(last, LONGEST_LOOKS * 2 + 1, || window), "looked for its longest");
        // A policy that never spins does not look again.
        assert!(!Looking::default().again(1_000, 0, || 0));
        // A count that wrapped is a change like any other.
        let mut looking = Looking::default();
        assert!(looking.again(1_000, u64::MAX, || window));
        assert!(looking.again(1_000 + 150, 0, || window));
        assert!(looking.again(1_000 + 300, 0, || window), "the change at 150 counts");
    }
}
