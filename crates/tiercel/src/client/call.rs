//! One call in progress, as a generated stub drives it: marshal, invoke, unmarshal.

use crate::steps::{mark, Point};
use crate::trace::CallSpan;
use crate::wire::{Reader, Segments, Writer};
use crate::{Binding, CallError};

#[cfg(feature = "async")]
use super::asynch::{AsyncEndpoint, AsyncState};
use super::shm::ShmEndpoint;
use super::tcp::TcpEndpoint;
use super::udp::UdpEndpoint;
use super::{cache, Through};

/// The calling thread's endpoint on the binding's transport, or an async call's from the binding's
/// pool.
pub(super) enum Engine {
    Udp(Box<UdpEndpoint>),
    Shm(Box<ShmEndpoint>),
    Tcp(Box<TcpEndpoint>),
    #[cfg(feature = "async")]
    Async(Box<AsyncEndpoint>),
}

impl Engine {
    /// The thread's endpoint on the binding: its own, else a new one on a free slot, else, when
    /// other threads hold every slot, one handed over by a thread whose call ended (waiting for it
    /// up to the call's deadline, or `dead_after`: `super::slots`).
    #[inline]
    fn take(binding: &Binding) -> Result<Engine, CallError> {
        match Engine::make(&binding.inner) {
            Err(CallError::NoFreeSlot(_)) => Engine::wait_turn(binding),
            made => made,
        }
    }

    /// The thread's endpoint on the binding, or a new one on a free slot.
    #[inline]
    fn make(inner: &std::sync::Arc<super::BindingInner>) -> Result<Engine, CallError> {
        match (&inner.shm, &inner.tcp) {
            (Some(link), _) => cache::take_shm(inner, link).map(Engine::Shm),
            (None, Some(link)) => cache::take_tcp(inner, link).map(Engine::Tcp),
            (None, None) => cache::take_udp(inner).map(Engine::Udp),
        }
    }

    /// Every slot is held by other threads: waits for one to be handed over.
    #[cold]
    #[inline(never)]
    fn wait_turn(binding: &Binding) -> Result<Engine, CallError> {
        let inner = &binding.inner;
        let deadline = binding.deadline.map(|d| std::time::Instant::now() + d);
        inner.free_slots.wait_turn(deadline, inner.config.timing.dead_after, || Engine::make(inner))
    }

    /// Returns the endpoint to the thread's cache (or, while other threads wait for a slot, to
    /// one of them), or an async call's to `inner`'s pool.
    #[inline]
    fn give_back(self, inner: &super::BindingInner) {
        let engine = match self {
            #[cfg(feature = "async")]
            Engine::Async(ep) => return inner.asynch.release(ep),
            engine if inner.free_slots.wanted() => match inner.free_slots.hand_over(engine) {
                Some(engine) => engine,
                None => return,
            },
            engine => engine,
        };
        match engine {
            Engine::Udp(ep) => cache::give_back_udp(ep),
            Engine::Shm(ep) => cache::give_back_shm(ep),
            Engine::Tcp(ep) => cache::give_back_tcp(ep),
            #[cfg(feature = "async")]
            Engine::Async(ep) => inner.asynch.release(ep),
        }
    }

    fn scratch_mut(&mut self) -> &mut Vec<u8> {
        match self {
            Engine::Udp(ep) => ep.scratch_mut(),
            Engine::Shm(ep) => ep.scratch_mut(),
            Engine::Tcp(ep) => ep.scratch_mut(),
            #[cfg(feature = "async")]
            Engine::Async(ep) => ep.scratch_mut(),
        }
    }

    /// Packets the last call retransmitted.
    fn retransmissions(&self) -> u64 {
        match self {
            Engine::Udp(ep) => ep.call_retransmissions(),
            Engine::Shm(_) | Engine::Tcp(_) => 0,
            #[cfg(feature = "async")]
            Engine::Async(ep) => ep.call_retransmissions(),
        }
    }

    #[inline]
    fn result(&self) -> &[u8] {
        match self {
            Engine::Udp(ep) => ep.result(),
            Engine::Shm(ep) => ep.result(),
            Engine::Tcp(ep) => ep.result(),
            #[cfg(feature = "async")]
            Engine::Async(ep) => ep.result(),
        }
    }
}

/// A call being marshaled. Arguments borrowed by the writer stay borrowed until [`Call::invoke`].
pub struct Call<'b, 'a> {
    binding: Through<'b>,
    engine: Option<Engine>,
    segments: Segments<'a>,
    /// The client's number of the procedure (its metrics, its errors).
    procedure: u16,
    /// The server's number of it (the same unless the server's copy of the interface differs).
    wire: u16,
    span: CallSpan,
}

impl<'b, 'a> Call<'b, 'a> {
    /// A call of `procedure` with no endpoint yet: [`Call::start`] takes one. (Two steps, so that
    /// the call is built where the stub keeps it, not moved there out of a `Result`.)
    #[inline]
    pub(super) fn empty(binding: &'b Binding, procedure: u16) -> Call<'b, 'a> {
        Call {
            binding: Through::Stub(binding),
            engine: None,
            segments: Segments::new(0),
            procedure,
            wire: procedure,
            span: CallSpan::none(),
        }
    }

    /// Takes the thread's endpoint on the binding (binding again first, with
    /// `ClientConfig::rebind`, if the last binding was found gone). Called once, before
    /// [`Call::writer`].
    pub fn start(&mut self) -> Result<(), CallError> {
        mark(Point::CallStart);
        if let Through::Stub(b) = self.binding {
            if b.rebind.is_some() {
                self.binding = b.through()?;
            }
        }
        let binding = &self.binding;
        self.wire = binding.inner.wire_procedure(self.procedure)?;
        binding.intercept(&binding.inner, self.procedure)?;
        let mut engine = Engine::take(binding)?;
        let (span, context) = binding.context(self.procedure);
        match &mut engine {
            Engine::Udp(ep) => ep.begin(&context),
            Engine::Shm(ep) => ep.begin(&context),
            Engine::Tcp(ep) => ep.begin(&context),
            #[cfg(feature = "async")]
            Engine::Async(..) => unreachable!("a synchronous call takes the thread's endpoint"),
        }
        mark(Point::EndpointReady);
        (self.engine, self.span) = (Some(engine), span);
        Ok(())
    }

    /// Where the arguments are marshaled.
    pub fn writer(&mut self) -> Writer<'_, 'a> {
        match &mut self.engine {
            Some(engine) => Writer::gathering(engine.scratch_mut(), &mut self.segments),
            // The endpoint is only absent before start and after invoke.
            None => unreachable!("a call is started before it is marshaled"),
        }
    }

    /// Sends the call and waits for its result. Called once, after [`Call::start`].
    pub fn invoke(&mut self) -> Result<Reply<'b>, CallError> {
        self.invoke_with(None)
    }

    /// Sends the call, whose message is what was marshaled followed by `buffer`'s bytes, and
    /// waits for its result, which begins with the bytes that go back into `buffer` (an `InOut`
    /// that is the procedure's one buffer and its last argument: the stub marshals its length, not
    /// its bytes). A large result's bytes are received straight into `buffer` (through shared
    /// memory, any result's: [`Reply::in_place`]); otherwise the stub copies them there from the
    /// reply. Called once, after [`Call::start`].
    pub fn invoke_in_out(&mut self, buffer: &'a mut [u8]) -> Result<Reply<'b>, CallError> {
        match &self.engine {
            Some(_) if self.segments.takes_tail() => self.invoke_with(Some(buffer)),
            _ => {
                let buffer: &'a [u8] = buffer;
                self.writer().put_borrowed(buffer);
                self.invoke_with(None)
            }
        }
    }

    fn invoke_with(&mut self, tail: Option<&mut [u8]>) -> Result<Reply<'b>, CallError> {
        mark(Point::Marshaled);
        let Some(mut engine) = self.engine.take() else { unreachable!("a call is started before it is invoked") };
        let b = &*self.binding;
        let timed = b.inner.metrics.get(self.procedure as usize).map(|m| (m, m.start()));
        let entered = self.span.enter();
        let mut in_place = false;
        let outcome = match (&mut engine, &b.inner.shm) {
            (Engine::Udp(ep), _) => match tail {
                Some(tail) => ep.run_in_out(b, self.wire, &self.segments, tail).map(|landed| in_place = landed),
                None => ep.run(b, self.wire, &self.segments),
            },
            (Engine::Shm(ep), Some(link)) => {
                ep.run(&b.inner, link, b.deadline, self.wire, &self.segments, tail).map(|landed| in_place = landed)
            }
            (Engine::Shm(_), None) => unreachable!("a shared-memory endpoint belongs to a shared-memory binding"),
            (Engine::Tcp(ep), _) => match &b.inner.tcp {
                Some(link) => {
                    ep.run(&b.inner, link, b.deadline, self.wire, &self.segments, tail).map(|landed| in_place = landed)
                }
                None => unreachable!("a TCP endpoint belongs to a TCP binding"),
            },
            #[cfg(feature = "async")]
            (Engine::Async(..), _) => unreachable!("a synchronous call takes the thread's endpoint"),
        };
        #[allow(clippy::drop_non_drop)]
        drop(entered);
        self.span.finish(&outcome, engine.retransmissions());
        if let Some((m, started)) = timed {
            m.finish(started, outcome.is_ok());
        }
        match outcome {
            Ok(()) => {
                mark(Point::Finished);
                Ok(Reply { engine: Some(engine), binding: self.binding.again(), in_place })
            }
            Err(e) => {
                engine.give_back(&b.inner);
                b.failed(&e);
                Err(e)
            }
        }
    }
}

impl Drop for Call<'_, '_> {
    fn drop(&mut self) {
        if let Some(engine) = self.engine.take() {
            engine.give_back(&self.binding.inner);
        }
    }
}

/// An async call being marshaled: [`AsyncCall::writer`], then [`AsyncCall::invoke`]. Dropping it
/// (or the future of `invoke`) before the result is in cancels the call.
#[cfg(feature = "async")]
pub struct AsyncCall<'b, 'a> {
    binding: Through<'b>,
    engine: Option<Box<AsyncEndpoint>>,
    segments: Segments<'a>,
    /// The client's number of the procedure (its metrics, its errors).
    procedure: u16,
    /// The server's number of it, found when the call starts.
    wire: u16,
    /// Sent and not yet answered: dropped now, the call is cancelled.
    in_flight: bool,
    span: CallSpan,
}

#[cfg(feature = "async")]
impl<'b, 'a> AsyncCall<'b, 'a> {
    /// A call of `procedure` with no endpoint yet: [`AsyncCall::start`] takes one. (Two steps, so
    /// that the call is built where the stub's future keeps it, not moved there out of another
    /// future's result.)
    pub(super) fn new(binding: &'b Binding, procedure: u16) -> AsyncCall<'b, 'a> {
        AsyncCall {
            binding: Through::Stub(binding),
            engine: None,
            segments: Segments::new(0),
            procedure,
            wire: procedure,
            in_flight: false,
            span: CallSpan::none(),
        }
    }

    /// Takes an endpoint from the binding's pool, waiting for one when every slot is in use.
    pub async fn start(&mut self) -> Result<(), CallError> {
        if self.binding.rebind.is_some() {
            self.binding = self.latest().await?;
        }
        self.wire = self.binding.inner.wire_procedure(self.procedure)?;
        self.binding.intercept(&self.binding.inner, self.procedure)?;
        let mut ep = AsyncState::acquire(&self.binding.inner).await?;
        let (span, context) = self.binding.context(self.procedure);
        ep.begin(&context);
        (self.engine, self.span) = (Some(ep), span);
        Ok(())
    }

    /// The binding made last, bound again first (on tokio's blocking pool) if need be.
    async fn latest(&self) -> Result<Through<'b>, CallError> {
        if !self.binding.must_bind_again() {
            return self.binding.through().map(|t| Through::Latest(t.clone()));
        }
        let binding = (*self.binding).clone();
        match tokio::task::spawn_blocking(move || binding.through().map(|t| t.clone())).await {
            Ok(latest) => latest.map(Through::Latest),
            Err(_) => Err(CallError::Internal(crate::error::Invariant::BindTaskFailed)),
        }
    }

    /// Where the arguments are marshaled.
    pub fn writer(&mut self) -> Writer<'_, 'a> {
        match &mut self.engine {
            Some(engine) => Writer::gathering(engine.scratch_mut(), &mut self.segments),
            None => unreachable!("an async call is started before it is marshaled"),
        }
    }

    /// Sends the call and waits for its result without blocking the thread. Called once, after
    /// [`AsyncCall::start`].
    pub async fn invoke(&mut self) -> Result<Reply<'b>, CallError> {
        self.invoke_with(None).await
    }

    /// [`Call::invoke_in_out`] without blocking the thread: the call's message is what was
    /// marshaled followed by `buffer`'s bytes, and a large result's bytes are received straight into
    /// `buffer` ([`Reply::in_place`]). Called once, after [`AsyncCall::start`].
    pub async fn invoke_in_out(&mut self, buffer: &'a mut [u8]) -> Result<Reply<'b>, CallError> {
        match &self.engine {
            Some(_) if self.segments.takes_tail() => self.invoke_with(Some(buffer)).await,
            _ => {
                let buffer: &'a [u8] = buffer;
                self.writer().put_borrowed(buffer);
                self.invoke_with(None).await
            }
        }
    }

    async fn invoke_with(&mut self, tail: Option<&mut [u8]>) -> Result<Reply<'b>, CallError> {
        let b = &*self.binding;
        let timed = b.inner.metrics.get(self.procedure as usize).map(|m| (m, m.start()));
        let (flight, alone) = b.inner.asynch.fly();
        self.in_flight = true;
        let outcome = match &mut self.engine {
            Some(ep) => self.span.instrument(ep.run(b, self.wire, &self.segments, tail, alone)).await,
            None => unreachable!("a call has its endpoint until invoked"),
        };
        self.in_flight = false;
        drop(flight);
        self.span.finish(&outcome, self.engine.as_ref().map_or(0, |ep| ep.call_retransmissions()));
        if let Some((m, started)) = timed {
            m.finish(started, outcome.is_ok());
        }
        if let Err(e) = &outcome {
            b.failed(e);
        }
        let in_place = outcome?;
        match self.engine.take() {
            Some(ep) => Ok(Reply { engine: Some(Engine::Async(ep)), binding: self.binding.again(), in_place }),
            None => unreachable!("a call has its endpoint until invoked"),
        }
    }
}

#[cfg(feature = "async")]
impl Drop for AsyncCall<'_, '_> {
    fn drop(&mut self) {
        // Done, failed, never sent, or dropped mid-call (a shared-memory slot is then marked as
        // abandoned until the server answers): the endpoint goes back to the pool either way.
        if let Some(ep) = self.engine.take() {
            AsyncEndpoint::give_back(ep, &self.binding.inner, self.in_flight);
        }
    }
}

/// A result that arrived; the stub unmarshals it with [`Reply::reader`].
pub struct Reply<'a> {
    engine: Option<Engine>,
    /// The binding the endpoint goes back to (an async call's, to its pool).
    binding: Through<'a>,
    /// Whether the result's first bytes were received into the buffer lent to
    /// [`Call::invoke_in_out`], not to be read from [`Reply::reader`].
    in_place: bool,
}

impl Reply<'_> {
    /// Reads the marshaled results, borrowing from the received packet (or from the private copy of a
    /// shared-memory result).
    #[inline]
    pub fn reader(&self) -> Reader<'_> {
        Reader::new(self.engine.as_ref().map(|e| e.result()).unwrap_or(&[]))
    }

    /// Whether the bytes that go back into the buffer lent to [`Call::invoke_in_out`] are there
    /// already: the stub then skips them in the [`Reply::reader`] rather than copying them.
    pub fn in_place(&self) -> bool {
        self.in_place
    }

    /// Maps a result decoding error.
    pub fn bad_result(e: crate::wire::DecodeError) -> CallError {
        CallError::BadResult(e)
    }
}

impl Drop for Reply<'_> {
    fn drop(&mut self) {
        mark(Point::Unmarshaled);
        if let Some(engine) = self.engine.take() {
            engine.give_back(&self.binding.inner);
        }
    }
}

impl Binding {
    /// A synchronous call of procedure `procedure` whose arguments `encode` marshals, and whose
    /// result the stub then reads from the [`Reply`]. A thread's calls on a plain shared-memory
    /// binding (see `BindingInner::plain`; no re-binding, nobody tracing) take their endpoint
    /// straight from the thread's cache and go out without a [`Call`]: what a Null call costs a
    /// client beyond its copies and its wait. Everything else is [`Call`]'s. Used by generated stubs.
    #[doc(hidden)]
    #[inline]
    pub fn call_plain<'a>(&self, procedure: u16, encode: impl FnOnce(Writer<'_, 'a>)) -> Result<Reply<'_>, CallError> {
        let inner = &self.inner;
        if let (true, None, Some(link)) = (inner.plain, &self.rebind, &inner.shm) {
            if crate::trace::quiet() {
                mark(Point::CallStart);
                if let Ok(mut ep) = super::cache::take_shm(inner, link) {
                    ep.begin_plain();
                    mark(Point::EndpointReady);
                    let mut segments = Segments::new(0);
                    encode(Writer::gathering(ep.scratch_mut(), &mut segments));
                    mark(Point::Marshaled);
                    return match ep.run(inner, link, self.deadline, procedure, &segments, None) {
                        Ok(_) => {
                            mark(Point::Finished);
                            Ok(Reply { engine: Some(Engine::Shm(ep)), binding: Through::Stub(self), in_place: false })
                        }
                        Err(e) => {
                            Engine::Shm(ep).give_back(inner);
                            Err(e)
                        }
                    };
                }
            }
        }
        let mut call = Call::empty(self, procedure);
        call.start()?;
        encode(call.writer());
        call.invoke()
    }
}

#[cfg(feature = "async")]
impl Binding {
    /// An async call of procedure `procedure` whose arguments `encode` marshals, as
    /// [`Binding::call_plain`] is for synchronous calls: on a plain shared-memory binding with
    /// nobody tracing, a call that finds an endpoint in the binding's pool (or a free slot for a new
    /// one) goes out without an [`AsyncCall`], its span and two levels of nested futures. Everything
    /// else, a call that must queue for an endpoint among them, is [`AsyncCall`]'s. Used by
    /// generated stubs.
    #[doc(hidden)]
    pub async fn call_plain_async<'a>(
        &self,
        procedure: u16,
        encode: impl FnOnce(Writer<'_, 'a>),
    ) -> Result<Reply<'_>, CallError> {
        let inner = &self.inner;
        if let (true, None, Some(link)) = (inner.plain, &self.rebind, &inner.shm) {
            if crate::trace::quiet() {
                if let Some(ep) = inner.asynch.try_take(inner)? {
                    let mut flight = PlainFlight { inner, ep: Some(ep), in_flight: false };
                    let PlainFlight { ep: Some(ep), in_flight, .. } = &mut flight else {
                        unreachable!("the endpoint was put there above")
                    };
                    let AsyncEndpoint::Shm(ep) = &mut **ep else {
                        unreachable!("a shared-memory binding's endpoints are shared-memory slots")
                    };
                    ep.prefetch(link);
                    ep.begin_plain();
                    let mut segments = Segments::new(0);
                    encode(Writer::gathering(ep.scratch_mut(), &mut segments));
                    let (counted, alone) = inner.asynch.fly();
                    *in_flight = true;
                    let outcome = ep.run_async(inner, link, self.deadline, procedure, &segments, None, alone).await;
                    *in_flight = false;
                    drop(counted);
                    outcome?;
                    let engine = flight.ep.take().map(Engine::Async);
                    return Ok(Reply { engine, binding: Through::Stub(self), in_place: false });
                }
            }
        }
        let mut call = AsyncCall::new(self, procedure);
        call.start().await?;
        encode(call.writer());
        call.invoke().await
    }
}

/// The endpoint of a call on [`Binding::call_plain_async`]'s short path until its [`Reply`] holds
/// it. Dropped before that (the call failed, or its future was dropped, which cancels the call if it
/// was in flight), it goes back to the binding's pool, as an [`AsyncCall`]'s does.
#[cfg(feature = "async")]
struct PlainFlight<'b> {
    inner: &'b super::BindingInner,
    ep: Option<Box<AsyncEndpoint>>,
    in_flight: bool,
}

#[cfg(feature = "async")]
impl Drop for PlainFlight<'_> {
    fn drop(&mut self) {
        if let Some(ep) = self.ep.take() {
            AsyncEndpoint::give_back(ep, self.inner, self.in_flight);
        }
    }
}
