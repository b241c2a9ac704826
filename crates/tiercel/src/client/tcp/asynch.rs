//! Calls from async tasks: the connection registered with the runtime's reactor, and a call that
//! awaits its result instead of blocking.

use super::*;

#[cfg(feature = "async")]
impl Link {
    /// The connection registered with the runtime's reactor (by the binding's first async call).
    /// (A duplicate of the descriptor: same socket, so readiness of one is readiness of the other;
    /// it is never read through.)
    fn ready(&self) -> Result<&tokio::net::TcpStream, CallError> {
        let ready = self.ready.get_or_init(|| {
            // The reactor takes only a stream that does not block: the duplicate's mode is the
            // socket's, so its readers wait in `poll` from now on, not in their receives.
            self.reads_block.store(false, std::sync::atomic::Ordering::Relaxed);
            let stream = self.stream.try_clone().ok()?;
            stream.set_nonblocking(true).ok()?;
            tokio::net::TcpStream::from_std(stream).ok()
        });
        ready.as_ref().ok_or(CallError::Internal(crate::error::Invariant::NotRegistered))
    }
}

#[cfg(feature = "async")]
impl TcpEndpoint {
    /// [`TcpEndpoint::run`] for an async call: the caller that reads the connection waits for it
    /// on tokio's reactor, the others are woken by it. Spins first when `alone` (the only async
    /// call of the binding in flight), as a synchronous call does. The frame is written on the
    /// task's thread: it waits there only if the socket's buffer is full. `tail`: a buffer lent to
    /// the call, as to [`TcpEndpoint::run`]; true when its result was read into it.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::client) async fn run_async(
        &mut self,
        inner: &BindingInner,
        link: &Link,
        deadline: Option<Duration>,
        procedure: u16,
        segs: &Segments<'_>,
        mut tail: Option<&mut [u8]>,
        alone: bool,
    ) -> Result<bool, CallError> {
        let ready = link.ready()?;
        let start = Instant::now();
        let deadline = deadline.map(|d| start + d);
        self.send_lent(inner, link, procedure, segs, tail.as_deref())?;
        let spin_until = if alone { start + self.spin.budget() } else { start };
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
        self.spin.observe(start.elapsed());
        self.finish(procedure)?;
        Ok(tail.is_some_and(|tail| self.settle_lent(inner, tail)))
    }
}
