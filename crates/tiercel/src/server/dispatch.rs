//! Running a procedure on the server, for every transport: the generated stub called with the
//! arguments, its results marshaled, a panic caught and turned into an error result.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;

use tiercel_proto::wire::Status;

use crate::interface::{DispatchError, Export, Results};
use crate::steps::{mark, Point};

/// Longest error message sent back in a result.
const MAX_ERROR_MESSAGE: usize = 1024;

/// Runs `procedure` of `export` with marshaled `args`, appending its marshaled results (or, on
/// failure, an error message) to `out` after its first `start` bytes. Catches a panic.
pub(crate) fn run_procedure(
    shared: &super::Shared,
    export: &std::sync::Arc<dyn Export>,
    procedure: u16,
    args: &[u8],
    out: &mut Vec<u8>,
    start: usize,
    limit: usize,
) -> Status {
    let stats = &shared.stats;
    let metrics = shared.procedure_metrics(export);
    let timed = metrics.get(procedure as usize).map(|m| (m, m.start()));
    let outcome = catch_unwind(AssertUnwindSafe(|| export.dispatch(procedure, args, &mut Results::new(out, limit))));
    mark(Point::ResultsEncoded);
    if let Some((m, started)) = timed {
        m.finish(started, matches!(outcome, Ok(Ok(()))));
    }
    match outcome {
        Ok(Ok(())) => Status::Ok,
        Ok(Err(DispatchError::UnknownProcedure)) => {
            out.truncate(start);
            Status::UnknownProcedure
        }
        Ok(Err(DispatchError::BadArguments(e))) => {
            out.truncate(start);
            error_message(out, &e.to_string());
            Status::BadArguments
        }
        Err(panic) => {
            stats.panics.fetch_add(1, Ordering::Relaxed);
            out.truncate(start);
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic with a non-string payload".into());
            error_message(out, &msg);
            Status::Panicked
        }
    }
}

pub(crate) fn error_message(out: &mut Vec<u8>, message: &str) {
    let mut end = message.len().min(MAX_ERROR_MESSAGE);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&message.as_bytes()[..end]);
}
