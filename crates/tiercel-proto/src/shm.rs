//! The shared-memory transport's region layout and its call handshake, independent of how the
//! memory is mapped (so that it can be model-checked with loom, see `tests/loom_shm.rs`).
//!
//! A binding's region is a header followed by one slot per client thread (LRPC's argument stacks):
//!
//! ```text
//! header (first page): magic, version, slots, data capacity, doorbell (futex), server_sleeping,
//!                       slots_used, heartbeat, client doorbell (futex), server_barrier
//! slot i at PAGE + i * stride (a page of control words, then the data):
//!   state (futex)  IDLE 0 | CALL 1 | RESULT 2         who owns the slot: CALL the server, else the client
//!                  (IDLE: no call yet; a result read stays RESULT until the next CALL)
//!   client_waiting 1 while the client is blocked on `state`; 2 while an async call waits for the
//!                  client doorbell
//!   procedure      written by the client before CALL (bit 16: the data starts with a call context)
//!   len            argument bytes (client, before CALL) / result bytes (server, before RESULT)
//!   status         the result's status (server, before RESULT)
//!   deadline       two words: CLOCK_MONOTONIC nanoseconds (low, high) by which the call must have
//!                  started, 0 for none (client, before CALL)
//!   cancel         1 when the client gave the call up (its deadline passed, its future dropped):
//!                  a server that has not started it answers `Cancelled` without running it
//!   taken          (at slot + 128) 1 once the client has read the result, 0 from its next call on
//!   data           at slot + PAGE: arguments, then results in their place
//! ```
//!
//! Handshake (each side stores, then issues a sequentially consistent fence, then loads the other
//! side's flag: of two such sides at least one sees the other's store, so no wake-up is lost):
//!
//! * client calls: writes data, procedure and len; `state = CALL`; if `server_sleeping`, bumps the
//!   doorbell and wakes it. When the region's `server_barrier` word is 1 and the client's process
//!   receives system-wide barriers, the client orders its store and its look at `server_sleeping`
//!   with a compiler fence only ([`client_publish_light`]): the server's threads issue such a
//!   barrier (`membarrier`) between counting themselves asleep and looking at the slots, which puts
//!   the missing fence in the client's thread at that moment. The client's fence waited, on every
//!   call, for the slot's cache line to come back from the server's core; the server's barrier
//!   costs a system call before each sleep.
//! * server serves: finds `state == CALL`, copies what it needs out, runs the procedure, writes the
//!   result, len and status; `state = RESULT`; if `client_waiting` is 1, wakes `state`; if 2, bumps
//!   the client doorbell and wakes it.
//! * client waits: spins on `state`; once it is not `CALL`, reads the result, sets `taken`, and leaves
//!   `state` as it is: the next call's `CALL` replaces it (a store of `IDLE` there would take the
//!   slot's line back from the server's core, whose spinning look holds it, once more on every
//!   call). To block, `client_waiting = 1` then re-checks `state` and waits on
//!   it while it is still `CALL`. An async call instead sets `client_waiting = 2`, re-checks `state`,
//!   and leaves the waiting to one thread of the client's process that reads the client doorbell,
//!   looks at the slots of the calls waiting, wakes the tasks of those done, and waits on the
//!   doorbell while its value is unchanged (so a bump between its read and its wait is not lost).
//! * server sleeps: reads the doorbell, `server_sleeping = 1`, (with `server_barrier`) issues a
//!   system-wide barrier, re-checks every slot in use (clients raise `slots_used` before their first
//!   call on a new slot), and waits on the doorbell while its value is unchanged.
//!
//! Everything the other process wrote is read once into private memory and validated (no double
//! fetch): lengths against the capacity, procedure numbers by the dispatcher.

use core::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};

/// Magic of a region header: "tcsm".
pub const MAGIC: u32 = u32::from_le_bytes(*b"tcsm");
/// Layout version (2: the heartbeat word; 3: the client doorbell, the cancel and deadline words,
/// the context flag of the procedure word; 4: a slot stays `RESULT` after its result is read, which
/// the client marks in the slot's `taken` word; 5: the `server_barrier` word).
pub const VERSION: u32 = 5;
/// The region header, and each slot's control words, take a page, so that slot data is
/// page-aligned (and can be given back to the system page by page after a large transfer).
pub const PAGE: usize = 4096;

/// Slot states.
pub mod state {
    /// The client owns the slot; no call has been made in it yet.
    pub const IDLE: u32 = 0;
    /// A call is published; the server owns the slot.
    pub const CALL: u32 = 1;
    /// A result is published (and perhaps read already); the client owns the slot.
    pub const RESULT: u32 = 2;
}

/// Offsets of the header's words.
pub mod header {
    /// `MAGIC`.
    pub const MAGIC: usize = 0;
    /// `VERSION`.
    pub const VERSION: usize = 4;
    /// Number of slots.
    pub const SLOTS: usize = 8;
    /// Data capacity of each slot, in pages.
    pub const DATA_PAGES: usize = 12;
    /// Futex the server sleeps on; clients bump it to wake the server.
    pub const DOORBELL: usize = 16;
    /// How many of the server's threads serving the binding are asleep on `DOORBELL` (or about
    /// to be): a client that publishes a call while it is nonzero wakes one.
    pub const SERVER_SLEEPING: usize = 20;
    /// One more than the highest slot a client has taken into use: the server scans the slots below.
    pub const SLOTS_USED: usize = 24;
    /// Bumped by the server's process about every 100 ms while it lives and runs (by a thread
    /// other than the one serving the binding): a client whose call sees it stand still for
    /// `dead_after` gives up, as over UDP when nothing is heard.
    pub const HEARTBEAT: usize = 28;
    /// Futex of the client's async calls: the server bumps it and wakes it when it publishes the
    /// result of a slot whose `client_waiting` is 2.
    pub const CLIENT_DOORBELL: usize = 32;
    /// 1 while the server's threads issue a system-wide barrier before they look at the slots one
    /// last time and sleep (see [`super::client_publish_light`]), else 0: a client may then publish
    /// without a fence of its own. On the cache line of `SERVER_SLEEPING`, which a client reads on
    /// every call anyway.
    pub const SERVER_BARRIER: usize = 36;
    /// The number of the header's words (those above, from the region's start).
    pub const WORDS: usize = SERVER_BARRIER / 4 + 1;
}

/// Offsets of a slot's words, from the slot's start.
pub mod slot {
    /// Slot state, see [`super::state`]; also the futex the client sleeps on.
    pub const STATE: usize = 0;
    /// 1 while the client's thread is asleep on `STATE` (or about to be), 2 while an async call
    /// waits for the client doorbell, else 0.
    pub const CLIENT_WAITING: usize = 4;
    /// Procedure number of the call.
    pub const PROCEDURE: usize = 8;
    /// Arguments' or result's length.
    pub const LEN: usize = 12;
    /// Result status.
    pub const STATUS: usize = 16;
    /// The call's deadline, low word (see [`super::deadline_words`]).
    pub const DEADLINE_LO: usize = 20;
    /// The call's deadline, high word.
    pub const DEADLINE_HI: usize = 24;
    /// Nonzero when the client has given the call up.
    pub const CANCEL: usize = 28;
    /// The number of a slot's control words (those above, from the slot's start).
    pub const WORDS: usize = CANCEL / 4 + 1;
    /// 1 once the client has read the slot's result, 0 from its next call on (client). Apart from
    /// the words above, on a pair of cache lines that only the client writes and that the server
    /// reads only when it looks for pages to stop mapping: the fast path's writes to it stay in the
    /// client's cache.
    pub const TAKEN: usize = 128;
}

/// Bit of the procedure word: the slot's data starts with a call context block
/// ([`crate::context`]).
pub const CONTEXT: u32 = 1 << 16;

/// A deadline as the two slot words that carry it: CLOCK_MONOTONIC nanoseconds, low then high.
pub fn deadline_words(monotonic_ns: u64) -> (u32, u32) {
    (monotonic_ns as u32, (monotonic_ns >> 32) as u32)
}

/// The deadline the two slot words carry, `None` for none (both zero).
pub fn deadline_from_words(lo: u32, hi: u32) -> Option<u64> {
    let ns = u64::from(hi) << 32 | u64::from(lo);
    (ns != 0).then_some(ns)
}

/// Most slots a shared-memory binding has: each is a calling thread of the client, and the server
/// scans them all, so more would be slower, not faster.
pub const MAX_SLOTS: u32 = 64;

/// The geometry of a region: how many slots of how much data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Number of slots.
    pub slots: u32,
    /// Data capacity of each slot, in bytes (a multiple of a page).
    pub data: usize,
}

impl Layout {
    /// A layout of `slots` slots of at least `data` bytes each; `None` when the region would not fit
    /// in the address space.
    pub fn new(slots: u32, data: usize) -> Option<Layout> {
        let data = data.max(1).checked_next_multiple_of(PAGE)?;
        let l = Layout { slots, data };
        l.region_len()?;
        Some(l)
    }

    /// The layout a grant describes (`slots` slots of `data` bytes each), if it is one a server makes:
    /// 1 to [`MAX_SLOTS`] slots, whole pages of data, a region that fits in the address space.
    pub fn granted(slots: u32, data: u64) -> Option<Layout> {
        let data = usize::try_from(data).ok()?;
        let l = Layout::new(slots, data)?;
        ((1..=MAX_SLOTS).contains(&slots) && l.data == data).then_some(l)
    }

    /// The region header's words that describe the layout, as `(offset, value)`: the server writes
    /// them, the client checks them against the grant.
    pub fn header_words(&self) -> [(usize, u32); 4] {
        [
            (header::MAGIC, MAGIC),
            (header::VERSION, VERSION),
            (header::SLOTS, self.slots),
            (header::DATA_PAGES, (self.data / PAGE) as u32),
        ]
    }

    /// Distance between slots (page-aligned, so that a slot's data starts on a page).
    pub fn stride(&self) -> usize {
        PAGE + self.data
    }

    /// Offset of slot `i`.
    pub fn slot(&self, i: u32) -> usize {
        PAGE + i as usize * self.stride()
    }

    /// Offset of slot `i`'s data.
    pub fn data(&self, i: u32) -> usize {
        self.slot(i) + PAGE
    }

    /// Total bytes of the region.
    pub fn region_len(&self) -> Option<usize> {
        (self.slots as usize).checked_mul(self.stride())?.checked_add(PAGE)
    }
}

/// A call as read, once, from a slot's control words written by an untrusted client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotCall {
    /// Procedure number.
    pub procedure: u16,
    /// Argument bytes at the start of the slot's data.
    pub len: usize,
    /// The data starts with a call context block.
    pub context: bool,
}

/// Validates a call's control words against the slot's data capacity: the procedure word (a
/// procedure number and the [`CONTEXT`] bit, no other bit) and the length.
pub fn validate_call(procedure: u32, len: u32, capacity: usize) -> Option<SlotCall> {
    if procedure & !(CONTEXT | 0xffff) != 0 {
        return None;
    }
    let context = procedure & CONTEXT != 0;
    let procedure = (procedure & 0xffff) as u16;
    let len = len as usize;
    (len <= capacity).then_some(SlotCall { procedure, len, context })
}

/// A call's control words as the server reads them from a slot, once: the client may change them
/// at any moment after, and nothing is read twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallWords {
    /// The procedure word (the procedure number, and the [`CONTEXT`] bit).
    pub procedure: u32,
    /// Argument bytes.
    pub len: u32,
    /// CLOCK_MONOTONIC nanoseconds by which the call must have started, if any.
    pub deadline: Option<u64>,
    /// The client gave the call up before the server read it.
    pub cancelled: bool,
}

impl CallWords {
    /// Server: reads a slot's call words once (`word(offset)`: the slot's word at `offset` from the
    /// slot's start, see [`slot`]).
    pub fn read<'a, W: Word + 'a>(word: impl Fn(usize) -> &'a W) -> CallWords {
        CallWords {
            procedure: word(slot::PROCEDURE).load(Relaxed),
            len: word(slot::LEN).load(Relaxed),
            deadline: deadline_from_words(word(slot::DEADLINE_LO).load(Relaxed), word(slot::DEADLINE_HI).load(Relaxed)),
            cancelled: word(slot::CANCEL).load(Relaxed) != 0,
        }
    }

    /// Client: writes a call's words into its slot, before [`client_publish`] (the cancel word
    /// cleared, whatever `cancelled` says).
    pub fn write<'a, W: Word + 'a>(&self, word: impl Fn(usize) -> &'a W) {
        word(slot::PROCEDURE).store(self.procedure, Relaxed);
        word(slot::LEN).store(self.len, Relaxed);
        let (lo, hi) = deadline_words(self.deadline.unwrap_or(0));
        word(slot::DEADLINE_LO).store(lo, Relaxed);
        word(slot::DEADLINE_HI).store(hi, Relaxed);
        word(slot::CANCEL).store(0, Relaxed);
    }
}

/// Client: gives up the call in its slot (its deadline passed, its future was dropped, the server
/// seems gone). The slot stays the server's until it answers; a server that has not read the call
/// yet answers `Cancelled` without running it.
pub fn client_cancel<'a, W: Word + 'a>(word: impl Fn(usize) -> &'a W) {
    word(slot::CANCEL).store(1, Relaxed);
}

/// Server: writes a result's length and status into its slot, before [`server_publish`].
pub fn write_result<'a, W: Word + 'a>(word: impl Fn(usize) -> &'a W, len: usize, status: crate::wire::Status) {
    word(slot::LEN).store(len as u32, Relaxed);
    word(slot::STATUS).store(status as u32, Relaxed);
}

/// What a waiting client last saw of the server's heartbeat word ([`header::HEARTBEAT`]), and
/// when it last moved: a server whose heartbeat stands still for `dead_after` is stopped or hung,
/// and the call fails as one over UDP to a server that answers nothing.
#[derive(Debug, Clone, Copy)]
pub struct Liveness {
    beat: u32,
    seen: std::time::Instant,
}

impl Liveness {
    /// The heartbeat `beat`, read at `now`.
    pub fn new(beat: u32, now: std::time::Instant) -> Liveness {
        Liveness { beat, seen: now }
    }

    /// Whether the server may still be alive, its heartbeat reading `beat` at `now`: it moved
    /// since the last look (noted), or has stood still for less than `dead_after`.
    pub fn alive(&mut self, beat: u32, now: std::time::Instant, dead_after: std::time::Duration) -> bool {
        if beat != self.beat {
            *self = Liveness::new(beat, now);
            return true;
        }
        now.saturating_duration_since(self.seen) < dead_after
    }
}

/// Validates a result's control words, written by an untrusted server, against the slot's data
/// capacity: the result's length and status.
pub fn validate_result(len: u32, status: u32, capacity: usize) -> Option<(usize, crate::wire::Status)> {
    let len = len as usize;
    let status = crate::wire::Status::from_u8(u8::try_from(status).ok()?)?;
    (len <= capacity).then_some((len, status))
}

/// An atomic 32-bit word: `AtomicU32` in a mapping, or loom's in a model.
pub trait Word {
    /// Atomic load.
    fn load(&self, order: core::sync::atomic::Ordering) -> u32;
    /// Atomic store.
    fn store(&self, v: u32, order: core::sync::atomic::Ordering);
    /// Atomic add, returning the previous value.
    fn fetch_add(&self, v: u32, order: core::sync::atomic::Ordering) -> u32;
    /// A sequentially consistent fence of the same memory model.
    fn fence_seq_cst();
    /// The fence of the side of a handshake whose peer issues a system-wide barrier
    /// ([`client_publish_light`]): in memory, a compiler fence (the barrier makes it a full one at
    /// the moment it is issued); a model checker, which has no such barrier, makes it a full one.
    fn fence_light();
}

impl Word for core::sync::atomic::AtomicU32 {
    fn load(&self, order: core::sync::atomic::Ordering) -> u32 {
        core::sync::atomic::AtomicU32::load(self, order)
    }
    fn store(&self, v: u32, order: core::sync::atomic::Ordering) {
        core::sync::atomic::AtomicU32::store(self, v, order)
    }
    fn fetch_add(&self, v: u32, order: core::sync::atomic::Ordering) -> u32 {
        core::sync::atomic::AtomicU32::fetch_add(self, v, order)
    }
    fn fence_seq_cst() {
        core::sync::atomic::fence(SeqCst)
    }
    fn fence_light() {
        core::sync::atomic::compiler_fence(SeqCst)
    }
}

/// Client: publishes the call written into the slot. Returns true when the server may be asleep
/// and must be woken on the doorbell (which this has already bumped).
pub fn client_publish<W: Word>(state: &W, server_sleeping: &W, doorbell: &W) -> bool {
    publish_fenced(state, server_sleeping, doorbell, W::fence_seq_cst)
}

/// The client's publication, its store and its look at `server_sleeping` ordered by `fence`.
#[inline(always)]
fn publish_fenced<W: Word>(state: &W, server_sleeping: &W, doorbell: &W, fence: fn()) -> bool {
    state.store(state::CALL, Release);
    fence();
    if server_sleeping.load(Relaxed) != 0 {
        doorbell.fetch_add(1, SeqCst);
        return true;
    }
    false
}

/// Client: [`client_publish`] in a region whose server issues a system-wide barrier before it
/// looks at the slots one last time and sleeps ([`header::SERVER_BARRIER`]), from a process that
/// receives those barriers. The store of `CALL` and the look at `server_sleeping` are ordered by a
/// compiler fence only: a server thread that counted itself asleep after the look then issues its
/// barrier, which either finds the store still to come (so the look came after its count and saw
/// it) or makes it visible before its last look at the slots. The full fence waited for the slot's
/// cache line to come back from the server's core, which reads it while it spins.
pub fn client_publish_light<W: Word>(state: &W, server_sleeping: &W, doorbell: &W) -> bool {
    publish_fenced(state, server_sleeping, doorbell, W::fence_light)
}

/// Client: whether the result is in (an acquire load, so the result's bytes are visible after it).
pub fn client_done(state: &impl Word) -> bool {
    state.load(Acquire) != state::CALL
}

/// Client: about to block. Returns true when the result is still not in, in which case the caller
/// waits on `state` while it equals [`state::CALL`], then calls this again (or [`client_woke`]).
pub fn client_prepare_block<W: Word>(state: &W, client_waiting: &W) -> bool {
    client_waiting.store(1, Relaxed);
    W::fence_seq_cst();
    state.load(Acquire) == state::CALL
}

/// Client: an async call is about to wait for the client doorbell. Returns true when the result is
/// still not in; the server will then bump the client doorbell when it publishes it.
pub fn client_prepare_wait_async<W: Word>(state: &W, client_waiting: &W) -> bool {
    client_waiting.store(2, Relaxed);
    W::fence_seq_cst();
    state.load(Acquire) == state::CALL
}

/// Client: a call is about to be written into the slot (before [`CallWords::write`]): its result
/// is not taken until [`client_took`].
pub fn client_calls(taken: &impl Word) {
    taken.store(0, Relaxed);
}

/// Client: the slot's result is read (into private memory); the server may stop mapping its pages.
pub fn client_took(taken: &impl Word) {
    taken.store(1, Release);
}

/// Server: whether the slot's data pages hold nothing the server still needs or owes: no call yet,
/// or a result its client has read. The server may then stop mapping them (the client keeps the
/// bytes). A result not read stays the server's charge, so a client that never reads its results
/// is refused, not served without bound. (A hostile client can set `taken` without reading, as it
/// can write any word of its slot.)
pub fn server_may_forget<W: Word>(state: &W, taken: &W) -> bool {
    match state.load(Acquire) {
        state::IDLE => true,
        state::RESULT => taken.load(Acquire) == 1,
        _ => false,
    }
}

/// Client: done blocking.
pub fn client_woke(client_waiting: &impl Word) {
    client_waiting.store(0, SeqCst);
}

/// Server: whether the slot holds a published call (an acquire load, so the call's bytes are
/// visible after it).
pub fn server_has_call(state: &impl Word) -> bool {
    state.load(Acquire) == state::CALL
}

/// Whom a published result must wake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// Nobody: the client is spinning (or gone).
    Nobody,
    /// The client's thread asleep on the slot's `state`.
    Slot,
    /// The client's async waiter: bump the client doorbell and wake it.
    Doorbell,
}

/// Server: publishes the result written into the slot, and says whom to wake.
pub fn server_publish<W: Word>(state: &W, client_waiting: &W) -> Wake {
    state.store(state::RESULT, Release);
    W::fence_seq_cst();
    match client_waiting.load(Relaxed) {
        0 => Wake::Nobody,
        2 => Wake::Doorbell,
        _ => Wake::Slot,
    }
}

/// Server: one of the binding's server threads is about to sleep. `any_call` looks at the slots
/// (after the fence, so that it also sees slots taken into use meanwhile) and says whether one holds
/// a call no other server thread has taken; in a region with [`header::SERVER_BARRIER`] set, it
/// issues the system-wide barrier first. Returns the doorbell value to wait on (the caller waits
/// while the doorbell still holds it, then calls [`server_woke`]), or `None` when a call arrived
/// meanwhile and the thread must not sleep. Several threads may sleep at once: `server_sleeping`
/// counts them, and a client wakes one.
pub fn server_prepare_sleep<W: Word>(
    doorbell: &W,
    server_sleeping: &W,
    any_call: impl FnOnce() -> bool,
) -> Option<u32> {
    let bell = doorbell.load(SeqCst);
    server_sleeping.fetch_add(1, SeqCst);
    W::fence_seq_cst();
    if any_call() {
        server_woke(server_sleeping);
        return None;
    }
    Some(bell)
}

/// Server: the thread that slept (after [`server_prepare_sleep`] returned `Some`) is awake again.
pub fn server_woke(server_sleeping: &impl Word) {
    // Minus one (the word wraps).
    server_sleeping.fetch_add(u32::MAX, SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::sync::atomic::AtomicU32;

    #[test]
    fn layout_is_page_aligned_and_bounded() {
        let l = Layout::new(4, 10_000).unwrap();
        assert_eq!(l.data, 12_288);
        assert_eq!(l.data(0) % 4096, 0);
        assert_eq!(l.slot(1) - l.slot(0), l.stride());
        assert_eq!(l.region_len(), Some(4096 + 4 * l.stride()));
        assert!(l.data(3) + l.data <= l.region_len().unwrap());
        assert!(Layout::new(u32::MAX, usize::MAX / 2).is_none());
    }

    #[test]
    fn control_words_are_validated() {
        assert_eq!(validate_call(3, 10, 10), Some(SlotCall { procedure: 3, len: 10, context: false }));
        assert_eq!(validate_call(3 | CONTEXT, 10, 10), Some(SlotCall { procedure: 3, len: 10, context: true }));
        assert_eq!(validate_call(3, 11, 10), None);
        assert_eq!(validate_call(1 << 17, 0, 10), None);
        assert_eq!(deadline_from_words(0, 0), None);
        let (lo, hi) = deadline_words(0x1234_5678_9abc_def0);
        assert_eq!(deadline_from_words(lo, hi), Some(0x1234_5678_9abc_def0));
        assert_eq!(validate_result(4, 0, 4), Some((4, crate::wire::Status::Ok)));
        assert_eq!(validate_result(5, 0, 4), None);
        assert_eq!(validate_result(0, 200, 4), None);
        assert_eq!(validate_result(0, 256, 4), None);
    }

    #[test]
    fn one_call_through_the_handshake() {
        let (st, waiting, sleeping, bell) =
            (AtomicU32::new(0), AtomicU32::new(0), AtomicU32::new(0), AtomicU32::new(0));
        assert_eq!(server_prepare_sleep(&bell, &sleeping, || server_has_call(&st)), Some(0));
        assert!(client_publish(&st, &sleeping, &bell), "a sleeping server is woken");
        assert_eq!(bell.load(SeqCst), 1, "and its doorbell moved, so its wait returns at once");
        server_woke(&sleeping);
        assert!(server_has_call(&st) && !client_done(&st));
        assert!(client_prepare_block(&st, &waiting));
        assert_eq!(server_publish(&st, &waiting), Wake::Slot, "a blocked client is woken");
        assert!(client_done(&st));
        client_woke(&waiting);
        assert!(!client_publish(&st, &sleeping, &bell), "an awake server needs no wake-up");
        assert_eq!(
            server_prepare_sleep(&bell, &sleeping, || server_has_call(&st)),
            None,
            "a pending call keeps it awake"
        );
        assert_eq!(sleeping.load(SeqCst), 0, "and it does not count as asleep");
    }

    #[test]
    fn a_slot_s_pages_may_be_forgotten_only_once_its_result_is_read() {
        let (st, taken) = (AtomicU32::new(state::IDLE), AtomicU32::new(0));
        assert!(server_may_forget(&st, &taken), "a slot never called in holds nothing");
        client_calls(&taken);
        st.store(state::CALL, SeqCst);
        assert!(!server_may_forget(&st, &taken), "a call is the server's");
        st.store(state::RESULT, SeqCst);
        assert!(!server_may_forget(&st, &taken), "a result not read yet stays charged");
        client_took(&taken);
        assert!(server_may_forget(&st, &taken), "a result read is the client's");
        client_calls(&taken);
        assert!(!server_may_forget(&st, &taken), "the next call's result is not read yet");
    }

    #[test]
    fn a_client_wakes_the_server_while_any_of_its_threads_sleeps() {
        let (st, sleeping, bell) = (AtomicU32::new(0), AtomicU32::new(0), AtomicU32::new(0));
        // Two server threads go to sleep; one wakes (for another reason) and the other sleeps on.
        assert_eq!(server_prepare_sleep(&bell, &sleeping, || server_has_call(&st)), Some(0));
        assert_eq!(server_prepare_sleep(&bell, &sleeping, || server_has_call(&st)), Some(0));
        server_woke(&sleeping);
        assert!(client_publish(&st, &sleeping, &bell), "a thread still sleeps: the client rings");
        server_woke(&sleeping);
        assert!(!client_publish(&st, &sleeping, &bell), "none sleeps: no ring");
    }
}
