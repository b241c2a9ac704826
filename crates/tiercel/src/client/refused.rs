//! A call refused as busy, on every transport: the client waits and sends it again
//! ([`Refusals`], the rule the UDP call machine follows too), and a call the server could never
//! take fails at once.

#[cfg(feature = "async")]
use std::sync::Arc;
use std::time::{Duration, Instant};

use tiercel_proto::timing::{Refusals, Timing};

use super::BindingInner;
use crate::wire::Segments;
use crate::CallError;

/// An endpoint whose calls a connection or a region carries (shared memory, TCP): one try of a
/// synchronous call, as its `run` documents it.
pub(super) trait Tries {
    /// The binding's connection or region.
    type Link;

    /// Makes the call once: `Overloaded` if the server refused it as busy.
    fn once(
        &mut self,
        inner: &BindingInner,
        link: &Self::Link,
        deadline: Option<Duration>,
        procedure: u16,
        segs: &Segments<'_>,
        tail: Option<&mut [u8]>,
    ) -> Result<bool, CallError>;
}

/// Makes a synchronous call through `ep`, sending it again while the server refuses it as busy
/// ([`Refused`]).
#[inline]
pub(super) fn run<E: Tries>(
    ep: &mut E,
    inner: &BindingInner,
    link: &E::Link,
    deadline: Option<Duration>,
    procedure: u16,
    segs: &Segments<'_>,
    mut tail: Option<&mut [u8]>,
) -> Result<bool, CallError> {
    match ep.once(inner, link, deadline, procedure, segs, tail.as_deref_mut()) {
        Err(CallError::Overloaded { .. }) => again(ep, inner, link, deadline, procedure, segs, tail),
        outcome => outcome,
    }
}

/// [`run`] once the server has refused the call as busy.
#[cold]
#[inline(never)]
fn again<E: Tries>(
    ep: &mut E,
    inner: &BindingInner,
    link: &E::Link,
    deadline: Option<Duration>,
    procedure: u16,
    segs: &Segments<'_>,
    mut tail: Option<&mut [u8]>,
) -> Result<bool, CallError> {
    let mut refused = Refused::new(&inner.config.timing, deadline);
    loop {
        let (wait, deadline) = refused.next()?;
        std::thread::sleep(wait);
        match ep.once(inner, link, deadline, procedure, segs, tail.as_deref_mut()) {
            Err(CallError::Overloaded { .. }) => continue,
            outcome => return outcome,
        }
    }
}

/// [`Tries`] for an async call.
#[cfg(feature = "async")]
pub(super) trait TriesAsync {
    /// The binding's connection or region.
    type Link;

    /// Makes the call once: `Overloaded` if the server refused it as busy. `alone`: no other
    /// async call of the binding is in flight.
    #[allow(clippy::too_many_arguments)]
    async fn once_async(
        &mut self,
        inner: &Arc<BindingInner>,
        link: &Self::Link,
        deadline: Option<Duration>,
        procedure: u16,
        segs: &Segments<'_>,
        tail: Option<&mut [u8]>,
        alone: bool,
    ) -> Result<bool, CallError>;
}

/// [`run`] for an async call: waits between tries without holding the thread, and does not spin
/// in them.
#[cfg(feature = "async")]
#[allow(clippy::too_many_arguments)]
pub(super) async fn run_async<E: TriesAsync>(
    ep: &mut E,
    inner: &Arc<BindingInner>,
    link: &E::Link,
    deadline: Option<Duration>,
    procedure: u16,
    segs: &Segments<'_>,
    mut tail: Option<&mut [u8]>,
    alone: bool,
) -> Result<bool, CallError> {
    match ep.once_async(inner, link, deadline, procedure, segs, tail.as_deref_mut(), alone).await {
        // Boxed: the future of a call that is not refused stays as small as it was.
        Err(CallError::Overloaded { .. }) => {
            Box::pin(again_async(ep, inner, link, deadline, procedure, segs, tail)).await
        }
        outcome => outcome,
    }
}

/// [`run_async`] once the server has refused the call as busy.
#[cfg(feature = "async")]
async fn again_async<E: TriesAsync>(
    ep: &mut E,
    inner: &Arc<BindingInner>,
    link: &E::Link,
    deadline: Option<Duration>,
    procedure: u16,
    segs: &Segments<'_>,
    mut tail: Option<&mut [u8]>,
) -> Result<bool, CallError> {
    let mut refused = Refused::new(&inner.config.timing, deadline);
    loop {
        let (wait, deadline) = refused.next()?;
        tokio::time::sleep(wait).await;
        match ep.once_async(inner, link, deadline, procedure, segs, tail.as_deref_mut(), false).await {
            Err(CallError::Overloaded { .. }) => continue,
            outcome => return outcome,
        }
    }
}

/// The refusals of one call carried by a connection or a region, and its deadline.
pub(super) struct Refused {
    refusals: Refusals,
    deadline: Option<Instant>,
    timing: Timing,
}

impl Refused {
    /// After a call's first refusal; `deadline`: the call's, counted from then (the try refused
    /// took little of it: the server answered without reading the call).
    pub(super) fn new(timing: &Timing, deadline: Option<Duration>) -> Refused {
        Refused { refusals: Refusals::default(), deadline: deadline.map(|d| Instant::now() + d), timing: *timing }
    }

    /// After a refusal: how long to wait before the call goes again, and what is left of its
    /// deadline once it does; or the error to fail it with, `Overloaded` (it never ran), once
    /// `dead_after` of refusals has passed or the next try would come after its deadline.
    pub(super) fn next(&mut self) -> Result<(Duration, Option<Duration>), CallError> {
        let now = Instant::now();
        // A connection or a region has no retransmission timeout: the backoff starts from the
        // least UDP's may be.
        let again = self.refusals.refused(now, self.timing.retransmit_min, &self.timing);
        match (again, self.deadline) {
            (Some(again), None) => Ok((again - now, None)),
            (Some(again), Some(deadline)) if again < deadline => Ok((again - now, Some(deadline - again))),
            _ => Err(CallError::Overloaded { may_have_run: false }),
        }
    }
}

/// The error of a call the server refused `TooLarge` without a message (through shared memory
/// and over TCP, where the refusal carries none).
pub(super) fn too_large() -> CallError {
    CallError::TooLarge("the call is more than the server's memory budget for a binding can ever hold".into())
}
