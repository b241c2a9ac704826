//! Running a procedure on the server, for every transport: the generated stub called with the
//! arguments, its results marshaled, a panic caught and turned into an error result.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::time::Instant;

use tiercel_proto::context::{Context, Trace};

use tiercel_proto::wire::Status;

use crate::interface::{DispatchError, Export, Results};
use crate::steps::{mark, Point};

/// Longest error message sent back in a result.
const MAX_ERROR_MESSAGE: usize = 1024;

/// How a call arrived: what the transport knows of it besides its arguments.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Arrival {
    /// When the call's last packet was received: the base of a relative deadline in the call's
    /// context (none where the transport carries the deadline's instant itself).
    pub(crate) at: Option<Instant>,
    /// The arguments start with a call context block.
    pub(crate) context: bool,
    /// A deadline the transport carried itself (shared memory's slot words).
    pub(crate) deadline: Option<Instant>,
    /// The transport, for the procedure's span: `"udp"`, `"tcp"` or `"shm"`.
    pub(crate) transport: &'static str,
    /// Who holds the binding (the endpoint's record of it).
    pub(crate) caller: Option<super::intercept::Caller>,
    /// The binding's client understands `Status::Refused` (granted `features::REFUSED`).
    pub(crate) refusals: bool,
}

impl Arrival {
    /// How a call of `binding` arrives through `transport`, with whether it starts with a context
    /// block, when it arrived, and the deadline the transport carried.
    pub(crate) fn of<A, E>(
        binding: &tiercel_proto::endpoint::Binding<A, E>,
        transport: &'static str,
        context: bool,
        at: Option<Instant>,
        deadline: Option<Instant>,
    ) -> Arrival {
        let refusals = binding.features & tiercel_proto::bind::wire::features::REFUSED != 0;
        Arrival { at, context, deadline, transport, caller: binding.caller, refusals }
    }
}

thread_local! {
    /// The deadline of the call this thread is running, if its caller set one.
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
    /// The caller of the call this thread is running.
    static CALLER: Cell<Option<super::intercept::Caller>> = const { Cell::new(None) };
}

/// The deadline of the call the current thread (or, in an async procedure, task) is running, when
/// its caller gave it one (with
/// [`crate::Binding::with_deadline`] or `ClientConfig::deadline`): a procedure that would work past
/// it can stop early, since its caller has given up by then. `None` outside a procedure, and for
/// calls without a deadline. Over UDP the server counts the time its caller had left when it sent
/// the call from when the call arrived (the time in flight is not known); through shared memory the
/// deadline is the caller's own instant. Costs a thread-local read.
pub fn deadline() -> Option<Instant> {
    let inline = DEADLINE.with(Cell::get);
    #[cfg(feature = "async")]
    if inline.is_none() {
        return crate::trace::TASK_CALL.try_with(|c| c.0).ok().flatten();
    }
    inline
}

/// Who is calling the procedure the current thread (or, in an async procedure, task) runs: the
/// address of a client over UDP (the address its bind request came from) or TCP (the connection's
/// peer), or the user and process ids of a client through shared memory, as the kernel told at the
/// bind (`SO_PEERCRED`). An address is what the packets said: over UDP it is proven only in that
/// the client received the grant and its token there. `None` outside a procedure. Costs a
/// thread-local read.
pub fn caller() -> Option<super::intercept::Caller> {
    let inline = CALLER.with(Cell::get);
    #[cfg(feature = "async")]
    if inline.is_none() {
        return crate::trace::TASK_CALL.try_with(|c| c.2).ok().flatten();
    }
    inline
}

/// Runs `procedure` of `export` with marshaled `args`, appending its marshaled results (or, on
/// failure, an error message) to `out` after its first `start` bytes. Catches a panic. A call whose
/// deadline has passed is answered `DeadlineExceeded` without running.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_procedure(
    shared: &super::Shared,
    export: &std::sync::Arc<dyn Export>,
    procedure: u16,
    args: &[u8],
    arrival: Arrival,
    out: &mut Vec<u8>,
    start: usize,
    limit: usize,
) -> Status {
    let (args, deadline, trace) = match call_context(shared, export, procedure, args, arrival, out) {
        Ok(c) => c,
        Err(status) => return status,
    };
    let run = |out: &mut Vec<u8>| export.dispatch(procedure, args, &mut Results::new(out, limit));
    invoke(shared, export, procedure, arrival, (deadline, trace), out, start, run).0
}

/// Runs `procedure` of `export`, one that is [`Export::in_place`], on the marshaled arguments in
/// `message` from `at` on (the whole call: a multi-packet call's reassembly, or a stream's frame
/// after its prefix and header), leaving its results in `message`: where they start. On failure,
/// the status, with an error message (if any) appended to `out` after its first `start` bytes. As
/// [`run_procedure`] otherwise.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_in_place(
    shared: &super::Shared,
    export: &std::sync::Arc<dyn Export>,
    procedure: u16,
    message: &mut Vec<u8>,
    at: usize,
    arrival: Arrival,
    out: &mut Vec<u8>,
    start: usize,
) -> Result<usize, Status> {
    let (args, deadline, trace) =
        call_context(shared, export, procedure, message.get(at..).unwrap_or_default(), arrival, out)?;
    // The context block read, the arguments follow it.
    let from = message.len() - args.len();
    let run = |_: &mut Vec<u8>| export.dispatch_in_place(procedure, message, from);
    match invoke(shared, export, procedure, arrival, (deadline, trace), out, start, run) {
        (_, Some(body)) => Ok(body),
        (status, None) => Err(status),
    }
}

/// Runs a procedure through `run` (which marshals its results, wherever it puts them, or refuses
/// it), in its span, its metrics and its deadline, catching a panic: the status, and what `run`
/// returned if it succeeded. On failure, an error message for the caller goes into `out` after its
/// first `start` bytes.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn invoke<R>(
    shared: &super::Shared,
    export: &std::sync::Arc<dyn Export>,
    procedure: u16,
    arrival: Arrival,
    (deadline, trace): (Option<Instant>, Option<Trace>),
    out: &mut Vec<u8>,
    start: usize,
    run: impl FnOnce(&mut Vec<u8>) -> Result<R, DispatchError>,
) -> (Status, Option<R>) {
    // Nobody listens for spans (always so without the `tracing` feature): no span, and no trace
    // for the procedure's own calls to continue. Through the span's path, a Null call's server
    // took 63 more instructions with the feature compiled in and unused.
    if crate::trace::quiet() {
        return measured(shared, export, procedure, arrival, deadline, out, start, run);
    }
    spanned(shared, export, procedure, arrival, (deadline, trace), out, start, run)
}

/// [`invoke`] when a subscriber may want the procedure's span.
#[allow(clippy::too_many_arguments)]
#[inline(never)]
fn spanned<R>(
    shared: &super::Shared,
    export: &std::sync::Arc<dyn Export>,
    procedure: u16,
    arrival: Arrival,
    (deadline, trace): (Option<Instant>, Option<Trace>),
    out: &mut Vec<u8>,
    start: usize,
    run: impl FnOnce(&mut Vec<u8>) -> Result<R, DispatchError>,
) -> (Status, Option<R>) {
    let (span, current) = crate::trace::server_span(|| export.info(), procedure, arrival.transport, trace);
    let entered = span.enter();
    let _current = crate::trace::enter_current(current);
    let (status, done) = measured(shared, export, procedure, arrival, deadline, out, start, run);
    #[allow(clippy::drop_non_drop)]
    drop(entered);
    span.finish_status(status);
    (status, done)
}

/// [`invoke`] inside the span (if any): the procedure in its metrics and deadline, a panic caught.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn measured<R>(
    shared: &super::Shared,
    export: &std::sync::Arc<dyn Export>,
    procedure: u16,
    arrival: Arrival,
    deadline: Option<Instant>,
    out: &mut Vec<u8>,
    start: usize,
    run: impl FnOnce(&mut Vec<u8>) -> Result<R, DispatchError>,
) -> (Status, Option<R>) {
    let stats = &shared.stats;
    let _current = Current::set(deadline, arrival.caller);
    let metrics = shared.procedure_metrics(export);
    let timed = metrics.get(procedure as usize).map(|m| (m, m.start()));
    let outcome = catch_unwind(AssertUnwindSafe(|| run(out)));
    mark(Point::ResultsEncoded);
    if let Some((m, started)) = timed {
        m.finish(started, matches!(outcome, Ok(Ok(_))));
    }
    match outcome {
        Ok(Ok(done)) => (Status::Ok, Some(done)),
        Ok(Err(DispatchError::UnknownProcedure)) => {
            out.truncate(start);
            (Status::UnknownProcedure, None)
        }
        Ok(Err(DispatchError::BadArguments(e))) => {
            out.truncate(start);
            error_message(out, &e.to_string());
            (Status::BadArguments, None)
        }
        Err(panic) => {
            stats.panics.fetch_add(1, Ordering::Relaxed);
            out.truncate(start);
            error_message(out, &panic_message(&*panic));
            (Status::Panicked, None)
        }
    }
}

/// Which call a running async procedure belongs to: the transport's binding id, the slot, and the
/// call's sequence number (0 through shared memory, where a slot has one call at a time).
#[cfg(feature = "async")]
pub(crate) type CallKey = (u32, u32, u32);

/// The message of a caught panic.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic with a non-string payload".into())
}

/// Starts the call of async procedure `procedure` of `export` on the server's runtime, when it is
/// one (`None`: it is not; run it inline). The call context is read and the deadline checked as for
/// any call; the arguments are copied out. `finish` gets the status and the marshaled results (or
/// error message) when the procedure ends. `Some(Err(status))`: refused at once, with this answer
/// (an error message, if any, in `out` after `start`), the procedure never started.
#[cfg(feature = "async")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn start_async(
    shared: &super::Shared,
    budget: std::sync::Arc<tiercel_proto::endpoint::Budget>,
    export: &std::sync::Arc<dyn Export>,
    procedure: u16,
    args: &[u8],
    arrival: Arrival,
    out: &mut Vec<u8>,
    limit: usize,
    key: CallKey,
    finish: impl FnOnce(Status, Vec<u8>) + Send + 'static,
) -> Option<Result<(), Status>> {
    if !export.is_async(procedure) {
        return None;
    }
    let (args, deadline, trace) = match call_context(shared, export, procedure, args, arrival, out) {
        Ok(c) => c,
        Err(status) => return Some(Err(status)),
    };
    let Some(runner) = &shared.asynch else {
        return Some(Err(Status::UnknownProcedure));
    };
    // The copy of the arguments lives as long as the procedure: charged to `budget`, the binding's
    // (and so to its transport's share and the server's `message_memory`) until it ends, so that no
    // number of bindings holding slow async calls can take more, nor one transport's from another's.
    let charged = args.len();
    if !budget.reserve(charged) {
        shared.stats.busy.fetch_add(1, Ordering::Relaxed);
        return Some(Err(Status::Busy));
    }
    let Some(future) = export.clone().dispatch_async(procedure, tiercel_proto::copy::to_vec(args), limit) else {
        budget.release(charged);
        return Some(Err(Status::UnknownProcedure));
    };
    let memory = budget.clone();
    let (span, current) = crate::trace::server_span(|| export.info(), procedure, arrival.transport, trace);
    let future = span.instrument(future);
    let metrics = shared.procedure_metrics(export).get(procedure as usize).cloned();
    let started = metrics.as_ref().map(|m| m.start());
    let stats = shared.stats.clone();
    let finish = move |status: Status, results: Vec<u8>| {
        memory.release(charged);
        span.finish_status(status);
        if let (Some(m), Some(started)) = (metrics, started) {
            m.finish(started, status == Status::Ok);
        }
        if status == Status::Panicked {
            stats.panics.fetch_add(1, Ordering::Relaxed);
        }
        finish(status, results)
    };
    shared.stats.calls.fetch_add(1, Ordering::Relaxed);
    if runner.spawn(future, deadline, current, arrival.caller, key, finish) {
        Some(Ok(()))
    } else {
        budget.release(charged);
        shared.stats.calls.fetch_sub(1, Ordering::Relaxed);
        shared.stats.busy.fetch_add(1, Ordering::Relaxed);
        Some(Err(Status::Busy))
    }
}

/// What a call carried besides its arguments: its deadline and its caller's trace.
type CallContext<'a> = (&'a [u8], Option<Instant>, Option<Trace>);

/// Reads the call context at the start of `args` (when the transport says there is one), checks
/// the deadline, and asks the server's interceptor, if it has one: the arguments after it, the
/// deadline and the trace, or the status to answer with (an error message appended to `out`).
#[inline(always)]
fn call_context<'a>(
    shared: &super::Shared,
    export: &std::sync::Arc<dyn Export>,
    procedure: u16,
    args: &'a [u8],
    arrival: Arrival,
    out: &mut Vec<u8>,
) -> Result<CallContext<'a>, Status> {
    if !arrival.context && arrival.deadline.is_none() && shared.interceptor.is_none() {
        // Nothing to read before the arguments, no deadline to check, nobody to ask.
        return Ok((args, None, None));
    }
    read_call_context(shared, export, procedure, args, arrival, out)
}

/// [`call_context`] of a call that has something to read, check or ask (out of line: a plain call
/// takes only the test above).
#[inline(never)]
fn read_call_context<'a>(
    shared: &super::Shared,
    export: &std::sync::Arc<dyn Export>,
    procedure: u16,
    args: &'a [u8],
    arrival: Arrival,
    out: &mut Vec<u8>,
) -> Result<CallContext<'a>, Status> {
    let (args, deadline, trace) = if arrival.context {
        match Context::parse(args) {
            Ok((context, rest)) => {
                let relative = arrival.at.zip(context.deadline).map(|(at, d)| at + d);
                (rest, arrival.deadline.or(relative), context.trace)
            }
            Err(e) => {
                error_message(out, &e.to_string());
                return Err(Status::BadArguments);
            }
        }
    } else {
        (args, arrival.deadline, None)
    };
    if deadline.is_some_and(|d| Instant::now() >= d) {
        shared.stats.late.fetch_add(1, Ordering::Relaxed);
        return Err(Status::DeadlineExceeded);
    }
    if let Some(interceptor) = &shared.interceptor {
        if let Err(why) = intercept(&**interceptor, export, procedure, deadline, arrival) {
            shared.stats.refused.fetch_add(1, Ordering::Relaxed);
            error_message(out, &why);
            // A client that predates `Refused` reads another status that never ran.
            return Err(if arrival.refusals { Status::Refused } else { Status::BadArguments });
        }
    }
    Ok((args, deadline, trace))
}

/// Shows the call to the server's interceptor: its refusal, if it refuses (a panic in it is one).
fn intercept(
    interceptor: &super::intercept::Interceptor,
    export: &std::sync::Arc<dyn Export>,
    number: u16,
    deadline: Option<Instant>,
    arrival: Arrival,
) -> Result<(), String> {
    let info = export.info();
    let call = super::intercept::CallInfo {
        interface: info.name,
        version: info.version,
        procedure: info.procedures.get(number as usize).copied().unwrap_or(""),
        number,
        caller: arrival.caller,
        deadline,
        transport: arrival.transport,
    };
    match catch_unwind(AssertUnwindSafe(|| interceptor(&call))) {
        Ok(verdict) => verdict,
        Err(panic) => Err(format!("the server's interceptor panicked: {}", panic_message(&*panic))),
    }
}

/// The running call's caller and deadline (the deadline's thread-local written only for a call
/// that has one), set for the time a procedure runs.
pub(crate) struct Current {
    deadline: bool,
}

impl Current {
    pub(crate) fn set(deadline: Option<Instant>, caller: Option<super::intercept::Caller>) -> Current {
        if deadline.is_some() {
            DEADLINE.with(|d| d.set(deadline));
        }
        CALLER.with(|c| c.set(caller));
        Current { deadline: deadline.is_some() }
    }
}

impl Drop for Current {
    fn drop(&mut self) {
        if self.deadline {
            DEADLINE.with(|d| d.set(None));
        }
        CALLER.with(|c| c.set(None));
    }
}

pub(crate) fn error_message(out: &mut Vec<u8>, message: &str) {
    let mut end = message.len().min(MAX_ERROR_MESSAGE);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&message.as_bytes()[..end]);
}
