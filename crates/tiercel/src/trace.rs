//! Tracing spans of calls, on both sides (crate feature `tracing`): `tiercel.call` around a client's
//! call and `tiercel.serve` around the procedure on the server, at debug level, with the interface,
//! procedure, transport and outcome (and the client's retransmissions). Each carries W3C-style ids
//! as fields: a 128-bit `trace_id` shared by every span of one trace, its own 64-bit `span_id`, and
//! on the server the client span's id as `parent_id`; the client sends both ids in the call's
//! context, so one trace covers both processes. A call made while a procedure runs (on the
//! procedure's thread, or in its task for an async procedure) continues the procedure's trace;
//! any other call starts a new one.
//!
//! Without a subscriber interested in these spans, a call pays one load of tracing's global level
//! (and, once a subscriber has been made and dropped, a look at the thread's subscriber) and sends
//! no context; without the feature, nothing at all.

pub(crate) use imp::*;

#[cfg(feature = "async")]
tokio::task_local! {
    /// The deadline, trace and caller of the async call a task runs: the server sets it around an
    /// async procedure (`server::asynch`), and calls the procedure makes continue its trace.
    pub(crate) static TASK_CALL: (
        Option<std::time::Instant>,
        Option<tiercel_proto::context::Trace>,
        Option<tiercel_proto::endpoint::Caller>,
    );
}

/// The trace of the async procedure the current task runs, if any.
#[cfg(all(feature = "async", feature = "tracing"))]
fn task_trace() -> Option<tiercel_proto::context::Trace> {
    TASK_CALL.try_with(|c| c.1).ok().flatten()
}

#[cfg(feature = "tracing")]
mod imp {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    use tiercel_proto::context::Trace;
    use tiercel_proto::wire::Status;
    use tracing::field::{display, Empty};

    use crate::interface::InterfaceInfo;

    thread_local! {
        /// The trace of the procedure this thread runs, with its span as the parent of calls it makes.
        static CURRENT: Cell<Option<Trace>> = const { Cell::new(None) };
    }

    /// The span of a call, or of the procedure it runs (none when no subscriber wants it).
    pub(crate) struct CallSpan(Option<tracing::Span>);

    /// Whether any subscriber may want debug-level spans: one load of a global, the only cost of
    /// a call when no subscriber has ever been made.
    #[inline(always)]
    fn listening() -> bool {
        tracing::Level::DEBUG <= tracing::level_filters::STATIC_MAX_LEVEL
            && tracing::Level::DEBUG <= tracing::level_filters::LevelFilter::current()
    }

    /// Whether a call would have no span and carry no trace (nobody listens).
    #[inline(always)]
    pub(crate) fn quiet() -> bool {
        !listening()
    }

    /// Whether this thread's subscriber is tracing's no-op one: nobody listens, though the global
    /// level and the callsites' cached interest may say otherwise. They are raised when a
    /// subscriber is made and stay raised after it is dropped (a test's scoped subscriber, the
    /// bench's tracing table), and a span made then is not disabled. Without this check every call
    /// then made a span and ids and sent its context to no one: a shared-memory Null call took 0.10
    /// to 0.26 µs more than in a process that never made a subscriber (0.55 to 0.63 µs), a UDP one
    /// 0.20 to 0.27 µs more (5.4 to 5.6 µs); with it, within the spread of the two. Called only
    /// once [`listening`] has said yes.
    fn nobody_listens() -> bool {
        tracing::dispatcher::get_default(|d| d.is::<tracing::subscriber::NoSubscriber>())
    }

    /// Ids: a random start, then each id is a distinct 64-bit mix of the next counter value.
    fn next_id() -> u64 {
        static NEXT: OnceLock<AtomicU64> = OnceLock::new();
        let counter = NEXT.get_or_init(|| {
            let seed = crate::random::bytes()
                .map_or(0x9e37_79b9_7f4a_7c15, |b| u64::from_le_bytes(b[..8].try_into().unwrap_or_default()));
            AtomicU64::new(seed)
        });
        // SplitMix64: a bijection, so distinct counter values give distinct ids.
        let mut z = counter.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)).max(1)
    }

    /// Gives `span` the trace id of `parent` (a new one without) and an id of its own, records both,
    /// and returns the trace that calls made inside the span continue.
    fn ids(span: &tracing::Span, parent: Option<Trace>) -> Trace {
        let trace_id = parent.map_or_else(|| u128::from(next_id()) << 64 | u128::from(next_id()), |t| t.trace_id);
        let span_id = next_id();
        span.record("trace_id", display(format_args!("{trace_id:032x}")));
        span.record("span_id", display(format_args!("{span_id:016x}")));
        Trace { trace_id, parent_id: span_id }
    }

    /// The trace the current procedure belongs to, if one runs here.
    fn current() -> Option<Trace> {
        let here = CURRENT.with(Cell::get);
        #[cfg(feature = "async")]
        if here.is_none() {
            return super::task_trace();
        }
        here
    }

    fn procedure_name(info: &InterfaceInfo, procedure: u16) -> &'static str {
        info.procedures.get(procedure as usize).copied().unwrap_or("?")
    }

    /// A client call's span, and the trace context to send with the call (none when no subscriber
    /// listens).
    #[inline(always)]
    pub(crate) fn client_span(
        info: &'static InterfaceInfo,
        procedure: u16,
        transport: &str,
    ) -> (CallSpan, Option<Trace>) {
        if !listening() {
            return (CallSpan(None), None);
        }
        new_client_span(info, procedure, transport)
    }

    #[cold]
    #[inline(never)]
    fn new_client_span(info: &'static InterfaceInfo, procedure: u16, transport: &str) -> (CallSpan, Option<Trace>) {
        if nobody_listens() {
            return (CallSpan(None), None);
        }
        let span = tracing::debug_span!(
            "tiercel.call",
            interface = info.name,
            procedure = procedure_name(info, procedure),
            transport,
            trace_id = Empty,
            span_id = Empty,
            outcome = Empty,
            retransmissions = Empty,
        );
        if span.is_disabled() {
            return (CallSpan(None), None);
        }
        let trace = ids(&span, current());
        (CallSpan(Some(span)), Some(trace))
    }

    impl CallSpan {
        /// No span (yet).
        #[inline(always)]
        #[cfg_attr(not(feature = "async"), allow(dead_code))]
        pub(crate) fn none() -> CallSpan {
            CallSpan(None)
        }

        /// Enters the span for the time a call or procedure runs on this thread.
        #[inline(always)]
        pub(crate) fn enter(&self) -> Option<tracing::span::Entered<'_>> {
            self.0.as_ref().map(|s| s.enter())
        }

        /// Runs `f` (an async call or procedure) inside the span.
        #[cfg_attr(not(feature = "async"), allow(dead_code))]
        pub(crate) fn instrument<F: core::future::Future>(
            &self,
            f: F,
        ) -> impl core::future::Future<Output = F::Output> {
            tracing::Instrument::instrument(f, self.0.clone().unwrap_or_else(tracing::Span::none))
        }

        /// Records how a client's call ended.
        #[inline(always)]
        pub(crate) fn finish<T>(&self, outcome: &Result<T, crate::CallError>, retransmissions: u64) {
            if let Some(span) = &self.0 {
                match outcome {
                    Ok(_) => span.record("outcome", "ok"),
                    Err(e) => span.record("outcome", display(e)),
                };
                span.record("retransmissions", retransmissions);
            }
        }

        /// Records the status a procedure's call ended with.
        #[inline(always)]
        pub(crate) fn finish_status(&self, status: Status) {
            if let Some(span) = &self.0 {
                span.record("outcome", display(format_args!("{status:?}")));
            }
        }
    }

    /// The span of a procedure run for a call that carried `trace` (or none), and the trace the
    /// procedure's own calls continue.
    #[inline(always)]
    pub(crate) fn server_span(
        info: impl FnOnce() -> &'static InterfaceInfo,
        procedure: u16,
        transport: &'static str,
        trace: Option<Trace>,
    ) -> (CallSpan, Option<Trace>) {
        if !listening() {
            return (CallSpan(None), None);
        }
        new_server_span(info(), procedure, transport, trace)
    }

    #[cold]
    #[inline(never)]
    fn new_server_span(
        info: &'static InterfaceInfo,
        procedure: u16,
        transport: &'static str,
        trace: Option<Trace>,
    ) -> (CallSpan, Option<Trace>) {
        if nobody_listens() {
            return (CallSpan(None), None);
        }
        let span = tracing::debug_span!(
            "tiercel.serve",
            interface = info.name,
            procedure = procedure_name(info, procedure),
            transport,
            trace_id = Empty,
            span_id = Empty,
            parent_id = Empty,
            outcome = Empty,
        );
        if span.is_disabled() {
            return (CallSpan(None), None);
        }
        if let Some(t) = trace {
            span.record("parent_id", display(format_args!("{:016x}", t.parent_id)));
        }
        let current = ids(&span, trace);
        (CallSpan(Some(span)), Some(current))
    }

    /// Makes `trace` the current thread's while the guard lives (a procedure running inline);
    /// nothing when there is none.
    #[inline(always)]
    pub(crate) fn enter_current(trace: Option<Trace>) -> Option<Current> {
        trace.map(|t| Current(CURRENT.with(|c| c.replace(Some(t)))))
    }

    /// Restores the thread's trace when dropped.
    pub(crate) struct Current(Option<Trace>);

    impl Drop for Current {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        static INFO: InterfaceInfo = InterfaceInfo {
            name: "Probe",
            id: 1,
            version: 1,
            procedures: &["ping"],
            source: crate::SignatureSource::Given("ping() -> ()"),
        };

        /// Whether each side made a span and a trace context.
        fn both_sides() -> [(bool, bool); 2] {
            let (call, sent) = client_span(&INFO, 0, "udp");
            let (serve, continued) = server_span(|| &INFO, 0, "udp", sent);
            [(call.0.is_some(), sent.is_some()), (serve.0.is_some(), continued.is_some())]
        }

        #[test]
        fn once_its_subscriber_is_dropped_a_call_makes_no_span_and_sends_no_context() {
            let subscriber = tracing::Dispatch::new(tracing_subscriber::registry());
            let heard = tracing::dispatcher::with_default(&subscriber, both_sides);
            assert_eq!(heard, [(true, true); 2], "a subscriber listens: spans, and the context between them");
            drop(subscriber);
            assert!(listening(), "the global level stays raised after the subscriber is gone");
            assert_eq!(both_sides(), [(false, false); 2], "nobody listens: no span, no context");
        }
    }
}

#[cfg(not(feature = "tracing"))]
mod imp {
    use tiercel_proto::context::Trace;
    use tiercel_proto::wire::Status;

    use crate::interface::InterfaceInfo;

    /// Without the feature: nothing.
    pub(crate) struct CallSpan;
    /// Without the feature: nothing.
    pub(crate) struct Current;
    /// Without the feature: nothing entered.
    pub(crate) struct Entered;

    #[inline(always)]
    pub(crate) fn client_span(_: &'static InterfaceInfo, _: u16, _: &str) -> (CallSpan, Option<Trace>) {
        (CallSpan, None)
    }

    /// Without the feature, a call never has a span.
    #[inline(always)]
    pub(crate) fn quiet() -> bool {
        true
    }

    impl CallSpan {
        #[inline(always)]
        #[allow(dead_code)]
        pub(crate) fn none() -> CallSpan {
            CallSpan
        }
        #[inline(always)]
        pub(crate) fn enter(&self) -> Entered {
            Entered
        }
        #[inline(always)]
        #[allow(dead_code)]
        pub(crate) fn instrument<F: core::future::Future>(&self, f: F) -> F {
            f
        }
        #[inline(always)]
        pub(crate) fn finish<T>(&self, _: &Result<T, crate::CallError>, _: u64) {}
        #[inline(always)]
        pub(crate) fn finish_status(&self, _: Status) {}
    }

    #[inline(always)]
    pub(crate) fn server_span(
        _: impl FnOnce() -> &'static InterfaceInfo,
        _: u16,
        _: &'static str,
        _: Option<Trace>,
    ) -> (CallSpan, Option<Trace>) {
        (CallSpan, None)
    }

    #[inline(always)]
    pub(crate) fn enter_current(_: Option<Trace>) -> Current {
        Current
    }
}
