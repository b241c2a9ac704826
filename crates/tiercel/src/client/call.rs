//! One call in progress, as a generated stub drives it: marshal, invoke, unmarshal.

use crate::steps::{mark, Point};
use crate::wire::{Reader, Segments, Writer};
use crate::{Binding, CallError};

use super::cache;
use super::shm::ShmEndpoint;
use super::udp::UdpEndpoint;

/// The calling thread's endpoint on the binding's transport.
enum Engine {
    Udp(Box<UdpEndpoint>),
    Shm(Box<ShmEndpoint>),
}

impl Engine {
    fn take(binding: &Binding) -> Result<Engine, CallError> {
        match &binding.inner.shm {
            None => cache::take_udp(&binding.inner).map(Engine::Udp),
            Some(link) => cache::take_shm(&binding.inner, link).map(Engine::Shm),
        }
    }

    fn give_back(self) {
        match self {
            Engine::Udp(ep) => cache::give_back_udp(ep),
            Engine::Shm(ep) => cache::give_back_shm(ep),
        }
    }

    fn scratch_mut(&mut self) -> &mut Vec<u8> {
        match self {
            Engine::Udp(ep) => ep.scratch_mut(),
            Engine::Shm(ep) => ep.scratch_mut(),
        }
    }

    fn result(&self) -> &[u8] {
        match self {
            Engine::Udp(ep) => ep.result(),
            Engine::Shm(ep) => ep.result(),
        }
    }
}

/// A call being marshaled. Arguments borrowed by the writer stay borrowed until [`Call::invoke`].
pub struct Call<'a> {
    binding: &'a Binding,
    engine: Option<Engine>,
    segments: Segments<'a>,
    procedure: u16,
}

impl<'a> Call<'a> {
    pub(super) fn new(binding: &'a Binding, procedure: u16) -> Result<Call<'a>, CallError> {
        mark(Point::CallStart);
        let mut engine = Engine::take(binding)?;
        match &mut engine {
            Engine::Udp(ep) => ep.begin(),
            Engine::Shm(ep) => ep.begin(),
        }
        mark(Point::EndpointReady);
        Ok(Call { binding, engine: Some(engine), segments: Segments::new(0), procedure })
    }

    /// Where the arguments are marshaled.
    pub fn writer(&mut self) -> Writer<'_, 'a> {
        match &mut self.engine {
            Some(engine) => Writer::gathering(engine.scratch_mut(), &mut self.segments),
            // The endpoint is only absent after invoke, which consumes the call.
            None => unreachable!("a call has its endpoint until invoked"),
        }
    }

    /// Sends the call and waits for its result.
    pub fn invoke(mut self) -> Result<Reply, CallError> {
        mark(Point::Marshaled);
        let Some(mut engine) = self.engine.take() else { unreachable!("a call has its endpoint until invoked") };
        let b = self.binding;
        let timed = b.inner.metrics.get(self.procedure as usize).map(|m| (m, m.start()));
        let outcome = match (&mut engine, &b.inner.shm) {
            (Engine::Udp(ep), _) => ep.run(b, self.procedure, &self.segments),
            (Engine::Shm(ep), Some(link)) => ep.run(&b.inner, link, b.deadline, self.procedure, &self.segments),
            (Engine::Shm(_), None) => unreachable!("a shared-memory endpoint belongs to a shared-memory binding"),
        };
        if let Some((m, started)) = timed {
            m.finish(started, outcome.is_ok());
        }
        match outcome {
            Ok(()) => {
                mark(Point::Finished);
                Ok(Reply { engine: Some(engine) })
            }
            Err(e) => {
                engine.give_back();
                Err(e)
            }
        }
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        if let Some(engine) = self.engine.take() {
            engine.give_back();
        }
    }
}

/// A result that arrived; the stub unmarshals it with [`Reply::reader`].
pub struct Reply {
    engine: Option<Engine>,
}

impl Reply {
    /// Reads the marshaled results, borrowing from the received packet (or from the private copy of a
    /// shared-memory result).
    pub fn reader(&self) -> Reader<'_> {
        Reader::new(self.engine.as_ref().map(|e| e.result()).unwrap_or(&[]))
    }

    /// Maps a result decoding error.
    pub fn bad_result(e: crate::wire::DecodeError) -> CallError {
        CallError::BadResult(e)
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        mark(Point::Unmarshaled);
        if let Some(engine) = self.engine.take() {
            engine.give_back();
        }
    }
}
