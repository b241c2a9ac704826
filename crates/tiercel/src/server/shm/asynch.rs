//! A binding's async calls (crate feature `async`): started on the server's runtime from the slot
//! that holds them, their results published to the slot when they end, and cancelled when their
//! client gives up.

use std::sync::atomic::Ordering;

use tiercel_proto::shm::{self as proto, header, slot};
use tiercel_proto::wire::Status;
use tiercel_sys::shm::futex_wake;

use super::super::dispatch::Arrival;
use super::team::*;
use super::*;

impl Worker<'_> {
    /// Starts the call in slot `i` (claimed: `b`; its arguments in `self.args`) on the async
    /// runtime. Refused at once: the status to answer with, its message in `self.out`.
    #[cfg(feature = "async")]
    pub(super) fn start_async(
        &mut self,
        i: u32,
        b: &mut Books,
        call: proto::SlotCall,
        deadline: Option<u64>,
    ) -> Result<(), Status> {
        let team = self.team;
        let (done, region) = (team.done.clone(), team.region.clone());
        let finish = move |status: Status, results: Vec<u8>| {
            // The binding's first thread writes the result; wake it if it sleeps. A binding gone
            // since drops the result.
            if done.send((i, status, results)).is_ok() {
                let bell = word(&region, header::DOORBELL);
                bell.fetch_add(1, Ordering::SeqCst);
                futex_wake(bell, i32::MAX as u32);
            }
        };
        let deadline = deadline.map(tiercel_sys::clock::instant_of_monotonic);
        let arrival = Arrival::of(&team.place, "shm", call.context, None, deadline);
        let key = (team.id, i, 0);
        let started = super::super::dispatch::start_async(
            &team.shared,
            team.place.budget(),
            &team.binding,
            call.procedure,
            &self.args,
            arrival,
            &mut self.out,
            team.layout.data,
            key,
            finish,
        );
        match started {
            Some(Ok(())) => {
                b.pending = true;
                team.running.fetch_add(1, Ordering::AcqRel);
                Ok(())
            }
            Some(Err(status)) => Err(status),
            None => unreachable!("the procedure is async"),
        }
    }

    /// Writes the results of async calls that ended into their slots; true if there were any.
    /// (The first thread's: it holds the receiver.)
    #[cfg(feature = "async")]
    pub(super) fn finish_async(&mut self) -> bool {
        let mut any = false;
        while let Some(Ok((i, mut status, results))) = self.results.as_ref().map(|r| r.try_recv()) {
            let team = self.team;
            let at = i as usize;
            // Another thread holds the claim only while it looks and sees the call pending.
            let mut b = team.books(at);
            b.pending = false;
            b.aborted = false;
            team.running.fetch_sub(1, Ordering::AcqRel);
            any = true;
            self.out.clear();
            let limit = team.layout.data;
            if results.len() > limit {
                super::super::dispatch::error_message(
                    &mut self.out,
                    &format!("result of {} bytes exceeds the slot's {limit}", results.len()),
                );
                status = Status::ResultTooLarge;
            } else {
                tiercel_proto::copy::extend(&mut self.out, &results);
            }
            if self.out.len() > b.held || self.buffers() > self.charge.charged {
                status = self.charge_result(&mut b, status);
            }
            self.publish(i, &mut b, status, 0);
        }
        any
    }

    /// Aborts the async calls whose clients have given them up (the slot's cancel word).
    #[cfg(feature = "async")]
    pub(super) fn cancel_async(&mut self) {
        let team = self.team;
        let Some(runner) = &team.shared.asynch else { return };
        for i in 0..team.books.len() {
            let Some(mut b) = team.claim(i) else { continue };
            if !b.pending || b.aborted {
                continue;
            }
            let cancel = self.word(team.layout.slot(i as u32) + slot::CANCEL);
            if cancel.load(Ordering::Relaxed) != 0 && runner.cancel((team.id, i as u32, 0)) {
                b.aborted = true;
                team.shared.stats.cancelled.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
