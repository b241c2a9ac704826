//! Calls from async tasks: the connection registered with the runtime's reactor, and a call that
//! awaits its result instead of blocking.

use super::*;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::waiting::REACTOR_IDLE;

/// The connection's registration with the reactor of async calls: made by the first async call
/// that waits on it, let go by a lone async call that spins when none waits on it, and by a
/// synchronous call once none has for [`REACTOR_IDLE`] (see [`Link::leave_reactor`]), and made
/// again with the reactor of another runtime when a call of that one waits.
#[derive(Default)]
pub(crate) struct Reactor {
    registration: Mutex<Registration>,
    /// Whether it is registered now (read by every synchronous call and every lone async one).
    registered: AtomicBool,
    /// Async calls waiting on it now.
    waiting: AtomicUsize,
    /// When the last of them stopped waiting (`tiercel_sys::clock::ticks`).
    last: AtomicU64,
}

#[derive(Default)]
struct Registration {
    /// A duplicate of the connection's descriptor, registered (same socket, so readiness of one is
    /// readiness of the other; it is never read through).
    stream: Option<Arc<tokio::net::TcpStream>>,
    /// The runtime whose reactor it is registered with.
    runtime: Option<tokio::runtime::Id>,
}

/// An async call's wait on the connection's registration ([`Link::on_reactor`]); its end counts
/// as the registration's last use.
struct OnReactor<'l> {
    reactor: &'l Reactor,
    stream: Arc<tokio::net::TcpStream>,
}

impl Drop for OnReactor<'_> {
    fn drop(&mut self) {
        self.reactor.last.store(tiercel_sys::clock::ticks(), Ordering::Relaxed);
        self.reactor.waiting.fetch_sub(1, Ordering::Release);
    }
}

impl Link {
    /// The connection registered with the reactor of the runtime this task runs on, for an async
    /// call to wait on, made now if it is not (or is registered with another runtime's, which may be
    /// gone: the calls waiting on that one go on waiting there). The reactor takes only a stream that
    /// does not block: while it is registered, its readers wait in `poll`, not in their receives.
    fn on_reactor(&self) -> Result<OnReactor<'_>, CallError> {
        // (Outside a runtime, `from_std` would panic.)
        let runtime = crate::client::current_runtime()?;
        let reactor = &self.reactor;
        let mut registration = reactor.registration.lock().unwrap_or_else(|p| p.into_inner());
        let stream = match &registration.stream {
            Some(stream) if registration.runtime == Some(runtime) => stream.clone(),
            _ => {
                self.reads_block.store(false, Ordering::Relaxed);
                let registered = self.stream.try_clone().ok().and_then(|stream| {
                    stream.set_nonblocking(true).ok()?;
                    tokio::net::TcpStream::from_std(stream).ok()
                });
                let Some(stream) = registered.map(Arc::new) else {
                    if registration.stream.is_none() {
                        self.blocking_again();
                    }
                    return Err(CallError::Internal(crate::error::Invariant::NotRegistered));
                };
                *registration = Registration { stream: Some(stream.clone()), runtime: Some(runtime) };
                reactor.registered.store(true, Ordering::Release);
                stream
            }
        };
        // Counted while the lock is held: a call letting the registration go counts again under it.
        reactor.waiting.fetch_add(1, Ordering::AcqRel);
        Ok(OnReactor { reactor, stream })
    }

    /// Lets the connection's registration with the reactor go when no async call has waited on it
    /// for [`REACTOR_IDLE`] (a synchronous call's test: async calls may wait on it between its
    /// calls), and its readers wait in their receives again.
    pub(super) fn leave_reactor_if_idle(&self) {
        self.leave_reactor(REACTOR_IDLE);
    }

    /// Lets the connection's registration with the reactor go when no async call has waited on it
    /// for `idle` (none waits on it now), and its readers wait in their receives again. A call that
    /// finds it not registered (every call, unless async calls wait on it) reads one flag; one that
    /// finds calls waiting on it, two.
    #[inline]
    pub(super) fn leave_reactor(&self, idle: Duration) {
        let reactor = &self.reactor;
        if !reactor.registered.load(Ordering::Acquire) || reactor.waiting.load(Ordering::Acquire) > 0 {
            return;
        }
        let since = tiercel_sys::clock::ticks().saturating_sub(reactor.last.load(Ordering::Relaxed));
        if since < tiercel_sys::clock::ticks_in(idle) {
            return;
        }
        let mut registration = reactor.registration.lock().unwrap_or_else(|p| p.into_inner());
        if reactor.waiting.load(Ordering::Acquire) > 0 || registration.stream.is_none() {
            return;
        }
        // Nobody waits on it: the last count on the registration, which its drop takes off the
        // reactor (with the lock held, so that no call registers meanwhile).
        *registration = Registration::default();
        reactor.registered.store(false, Ordering::Release);
        self.blocking_again();
    }

    /// The connection's mode before it was registered: a plain connection whose receives block
    /// (for at most its receive wait) has them block again.
    fn blocking_again(&self) {
        if !self.receive_wait.is_zero() && self.stream.set_nonblocking(false).is_ok() {
            self.reads_block.store(true, Ordering::Relaxed);
        }
    }
}

impl TcpEndpoint {
    /// [`TcpEndpoint::run`] for an async call: the caller that reads the connection waits for it
    /// on tokio's reactor, the others are woken by it. Spins first when `alone` (the only async
    /// call of the binding in flight), as a synchronous call does. The frame is written on the
    /// task's thread: it waits there only if the socket's buffer is full. `tail`: a buffer lent to
    /// the call, as to [`TcpEndpoint::run`]; true when its result was read into it.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::client) async fn run_async(
        &mut self,
        inner: &Arc<BindingInner>,
        link: &Link,
        deadline: Option<Duration>,
        procedure: u16,
        segs: &Segments<'_>,
        tail: Option<&mut [u8]>,
        alone: bool,
    ) -> Result<bool, CallError> {
        super::super::refused::run_async(self, inner, link, deadline, procedure, segs, tail, alone).await
    }
}

impl super::super::refused::TriesAsync for TcpEndpoint {
    type Link = Link;

    /// One try of [`TcpEndpoint::run_async`].
    async fn once_async(
        &mut self,
        inner: &Arc<BindingInner>,
        link: &Link,
        deadline: Option<Duration>,
        procedure: u16,
        segs: &Segments<'_>,
        mut tail: Option<&mut [u8]>,
        alone: bool,
    ) -> Result<bool, CallError> {
        let start = Instant::now();
        let spin_until = if alone { start + self.spin.budget() } else { start };
        if spin_until > start {
            // A lone call that spins reads its segments itself: a registration nobody waits on now
            // would have each wake the reactor. (A call among others, or one whose spin budget is
            // spent, waits on the reactor at once, and keeps it.)
            link.leave_reactor(Duration::ZERO);
        }
        let deadline = deadline.map(|d| start + d);
        self.send_lent(inner, link, procedure, segs, tail.as_deref())?;
        loop {
            let now = Instant::now();
            if now >= spin_until {
                break;
            }
            if let Waited::Arrived = self.look(inner, link, deadline, now, None, tail.as_deref_mut(), true)? {
                self.spin.observe(start.elapsed());
                self.finish(procedure)?;
                return Ok(tail.is_some_and(|tail| self.settle_lent(inner, tail)));
            }
            core::hint::spin_loop();
        }
        // Registered with the reactor only now: a lone call that found its result spinning never was.
        let on_reactor = link.on_reactor()?;
        let ready = &*on_reactor.stream;
        loop {
            let now = Instant::now();
            let tick = deadline.map_or(TICK, |d| d.saturating_duration_since(now).min(TICK));
            let waited = std::future::poll_fn(|cx| loop {
                // Readiness cleared, then a look: bytes arriving after the clear set it again, so
                // the wait below cannot miss them.
                let _ =
                    ready.try_io(tokio::io::Interest::READABLE, || Err::<(), _>(std::io::ErrorKind::WouldBlock.into()));
                let wake = Some(Wake::Task(cx.waker().clone()));
                match self.look(inner, link, deadline, Instant::now(), wake, tail.as_deref_mut(), true) {
                    Err(e) => return std::task::Poll::Ready(Err(e)),
                    Ok(Waited::Arrived) => return std::task::Poll::Ready(Ok(())),
                    Ok(Waited::Not(false)) => return std::task::Poll::Pending,
                    Ok(Waited::Not(true)) => match ready.poll_read_ready(cx) {
                        std::task::Poll::Ready(Ok(())) => continue,
                        std::task::Poll::Ready(Err(e)) => return std::task::Poll::Ready(Err(e.into())),
                        std::task::Poll::Pending => return std::task::Poll::Pending,
                    },
                }
            });
            match tokio::time::timeout(tick, waited).await {
                Ok(Ok(())) => break,
                Ok(Err(e)) => return Err(e),
                // A tick: the next look checks the deadline and the connection's silence.
                Err(_) => {}
            }
        }
        drop(on_reactor);
        self.spin.observe(start.elapsed());
        self.finish(procedure)?;
        Ok(tail.is_some_and(|tail| self.settle_lent(inner, tail)))
    }
}
