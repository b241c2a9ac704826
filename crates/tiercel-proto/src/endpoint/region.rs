//! Bindings whose calls come through a shared-memory region: the decision on each call a server
//! thread finds published in a slot.
//!
//! ```text
//! slot state CALL ─► CallWords::read (once) ─► slot_call ─┬─ Run(call)  copy the arguments out, run,
//!                                                         │             write the result
//!                                                         ├─ Busy       no room in the budgets, or
//!                                                         │             draining: refused unread
//!                                                         ├─ TooLarge   more than the budgets could
//!                                                         │             ever hold: refused unread
//!                                                         ├─ Malformed  length or procedure out of range
//!                                                         └─ Cancelled  given up by its client before
//!                                                                       the server read it
//! write_result, server_publish ─► the slot is the client's again
//! ```
//!
//! The shared-memory server decides every slot's call here, and the region simulation
//! (`tests/sim_region.rs`) drives the same function with a client that writes the slot's words
//! at any moment.

use std::hash::Hash;
use std::time::Instant;

use super::{Binding, ServerEndpoint};
use crate::shm::{validate_call, CallWords, SlotCall};

/// What becomes of a call found published in a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotStep {
    /// Admitted: run it (its arguments are the first `len` bytes of the slot's data).
    Run(SlotCall),
    /// Refused unread, answered `Busy`: the budgets have no room for its arguments now, or the
    /// endpoint is draining. The client tries again later ([`crate::timing::Refusals`]).
    Busy,
    /// Refused unread, answered `TooLarge`: its arguments need more than the binding's memory
    /// could ever hold ([`Binding::memory_most`]), however much the others give back.
    TooLarge,
    /// Its length or procedure word is out of range: answered `BadArguments`.
    Malformed,
    /// Its client gave it up before it started: answered `Cancelled`, not run.
    Cancelled,
}

impl<A: Copy + Eq + Hash, E> ServerEndpoint<A, E> {
    /// Decides on the call whose words `words` a server thread read from a slot of `binding`'s
    /// region, whose slots hold `capacity` bytes of data. `room(len)` makes room in the budgets for
    /// `len` bytes of arguments (0 for a malformed call, whose answer still takes a page), or says
    /// how many bytes it asked them for in vain; it is asked first, so that nothing is read without
    /// room. A call is admitted as every transport's is ([`ServerEndpoint::admit_call`]).
    #[inline]
    pub fn slot_call(
        &self,
        binding: &Binding<A, E>,
        words: &CallWords,
        capacity: usize,
        room: impl FnOnce(usize) -> Result<(), usize>,
        now: impl FnOnce() -> Instant,
    ) -> SlotStep {
        let call = validate_call(words.procedure, words.len, capacity);
        if let Err(needed) = room(call.map_or(0, |c| c.len)) {
            return match needed > binding.memory_most() {
                true => SlotStep::TooLarge,
                false => SlotStep::Busy,
            };
        }
        match call {
            None => SlotStep::Malformed,
            Some(_) if words.cancelled => SlotStep::Cancelled,
            Some(_) if !self.admit_call(binding, now) => SlotStep::Busy,
            Some(call) => SlotStep::Run(call),
        }
    }
}
