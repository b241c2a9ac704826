//! A bound connection's threads: how they start and end, park the binding when it is idle, run
//! the calls they read, and send the results.

use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::server::EndpointBinding;
use tiercel_proto::stream::{self, Deframer, PREFIX_LEN};
use tiercel_proto::wire::{Header, Kind, Status, HEADER_LEN};

use super::super::charge::Charge;
use super::super::dispatch::{self, Arrival};
use super::super::outbox::QuickProcedures;
use super::super::Shared;
use super::*;
use crate::retention::Retention;

/// One connection's binding: its threads take turns reading the connection, and run the calls
/// they read.
pub(crate) struct StreamBinding {
    pub(super) shared: Arc<Shared>,
    pub(super) conn: Arc<Conn>,
    pub(super) export: Arc<dyn crate::interface::Export>,
    pub(super) id: u32,
    /// Its place in the server's endpoint: its memory budget (shared by its threads' charges),
    /// its calls running, its expiry.
    pub(super) binding: Arc<EndpointBinding>,
    /// The reading side, taken out by the thread reading the connection and put back when it has a
    /// call to run (`None` meanwhile).
    pub(super) reader: Mutex<Option<Reader>>,
    /// Signalled when the reading side is put back and a thread waits for it.
    pub(super) turn: std::sync::Condvar,
    /// Threads waiting for their turn to read.
    pub(super) waiting: AtomicUsize,
    /// Threads serving the binding.
    pub(super) threads: AtomicUsize,
    /// Those of them not running a call (reading, or waiting to read).
    pub(super) idle: AtomicUsize,
    /// Nanoseconds after `created` when the last idle thread took a call.
    pub(super) all_busy_since: AtomicU64,
    /// Calls taken by the binding's threads.
    pub(super) taken: AtomicU64,
    pub(super) created: Instant,
    /// The connection is over: the threads end.
    pub(super) closed: AtomicBool,
    /// Where the binding waits without a thread.
    pub(super) parking: Arc<Parking>,
    /// Its last thread found it idle and gives it up to the parking when it ends.
    pub(super) parked: AtomicBool,
}

/// The reading side of a connection.
pub(super) struct Reader {
    pub(super) frames: Deframer,
    /// A secure binding's sealed records, opened on their way into `frames` (none while parked).
    pub(super) records: Option<crate::framed::Records>,
    /// The receive buffer, charged to the binding's budget and the server's.
    pub(super) charge: Charge,
    pub(super) retention: Retention,
    /// When the last frame was read.
    pub(super) last_frame: Instant,
    /// Reading spins until then (`ServerConfig::spin` after the last frame, while it holds the
    /// lease to).
    pub(super) spin_until: Instant,
    pub(super) lease: crate::waiting::leases::SpinLease,
    /// The last read took less than there was room for: the connection was empty then. Done
    /// spinning, the reader then waits for it to be readable before it reads again (a read would
    /// most likely find nothing, a system call spent).
    pub(super) drained: bool,
    /// When the connection's frames next write its binding's last activity.
    pub(super) activity: tiercel_proto::endpoint::Activity,
}

/// A call read from the connection, its arguments copied into the reading thread's buffer.
pub(super) struct Taken {
    pub(super) slot: u32,
    pub(super) seq: u32,
    pub(super) procedure: u16,
    pub(super) arrival: Arrival,
    /// Whole frames were behind it when it was read: how long it runs is learned
    /// ([`Own::quick`]).
    pub(super) timed: bool,
}

/// A thread's own buffers and their charge.
pub(super) struct Own {
    pub(super) args: Vec<u8>,
    /// Prefix, header and results of the frame going back.
    pub(super) out: Vec<u8>,
    pub(super) charge: Charge,
    /// When large results last passed (their buffer is kept a while).
    pub(super) retention: Retention,
    /// This thread's count of the calls it ran (the server's `calls`, summed with the others'):
    /// no locked add on a line every connection's threads write.
    pub(super) calls: crate::counters::Shard,
    /// The procedures this thread has seen run quickly when calls queued: those it runs where they
    /// landed, their results held for the others' ([`StreamBinding::run_held`]).
    pub(super) quick: QuickProcedures,
}

impl Own {
    /// Charges what the buffers hold now; without room, gives back what large calls grew.
    pub(super) fn settle(&mut self) {
        if self.out.capacity() > OUT {
            self.retention.large(Instant::now());
        }
        if !self.charge.settle(self.args.capacity() + self.out.capacity()) {
            self.shrink();
        }
    }

    /// Gives back what large calls grew.
    pub(super) fn shrink(&mut self) {
        self.args = Vec::new();
        self.out = Vec::with_capacity(OUT);
        self.charge.settle(OUT);
    }
}

impl StreamBinding {
    /// Most threads serving one binding: a slow call then holds up only its own caller while
    /// fewer than this many run at once.
    pub(super) fn max_threads(&self) -> usize {
        (self.binding.slots() as usize).min(self.shared.config.workers.max(2))
    }

    /// Whether the listener should give the binding another thread: there is room for one more,
    /// and every thread has been running a call for [`HELP_AFTER`], or every thread was running a
    /// slow one (see `crate::waiting::crew::slow_calls`) while more of the client's bytes waited to be read at
    /// [`WAITED_LOOKS`] looks in a row, so that calls whose procedures block run side by side
    /// instead of queueing behind one another.
    pub(super) fn wants_helper(&self, now: Instant, watch: &mut Watch) -> bool {
        let taken = self.taken.load(Ordering::Acquire);
        let since_taken = taken.wrapping_sub(std::mem::replace(&mut watch.taken, taken));
        let waited = &mut watch.waited;
        let threads = self.threads.load(Ordering::Acquire);
        if self.idle.load(Ordering::Acquire) != 0
            || threads == 0
            || threads >= self.max_threads()
            || self.closed.load(Ordering::Acquire)
            || self.parking.pool.pressed()
        {
            *waited = 0;
            return false;
        }
        let since = Duration::from_nanos(self.all_busy_since.load(Ordering::Acquire));
        let slow = crate::waiting::crew::slow_calls(since_taken, threads, HELP_AFTER);
        *waited = if slow && self.bytes_waiting() { waited.saturating_add(1) } else { 0 };
        let help = now.saturating_duration_since(self.created + since) >= HELP_AFTER || *waited >= WAITED_LOOKS;
        if help {
            *waited = 0;
        }
        help
    }

    /// Whether bytes of the client wait to be read: in the socket, or read into the reading side's
    /// buffer while no thread reads (every thread runs a call).
    pub(super) fn bytes_waiting(&self) -> bool {
        let buffered = match self.reader.try_lock() {
            Ok(r) => r.as_ref().is_some_and(|r| {
                r.frames.buffered() > 0 || r.records.as_ref().is_some_and(crate::framed::Records::holds)
            }),
            Err(_) => false,
        };
        buffered || tiercel_sys::udp::wait_readable_fd(&self.conn.stream, Some(Duration::ZERO)).unwrap_or(false)
    }

    /// Whether a call of the binding started within the last second, or it was made within the
    /// last second: the listener then looks every [`HELP_AFTER`] whether it needs another thread.
    pub(super) fn active(&self, now: Instant) -> bool {
        let since = Duration::from_nanos(self.all_busy_since.load(Ordering::Acquire));
        !self.closed.load(Ordering::Acquire) && now.saturating_duration_since(self.created + since) < HEARTBEAT
    }

    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let _ = self.conn.stream.shutdown(std::net::Shutdown::Both);
    }

    /// A thread ends (from idle); the last one parks the binding, if it found it idle, or ends it.
    pub(super) fn thread_ends(self: &Arc<Self>) {
        self.idle.fetch_sub(1, Ordering::AcqRel);
        if self.threads.fetch_sub(1, Ordering::AcqRel) == 1 {
            let over = self.closed.load(Ordering::Acquire) || self.shared.stop.load(Ordering::Relaxed);
            if !(self.parked.load(Ordering::Acquire) && !over && self.park()) {
                self.ended();
            }
        }
    }

    /// Leaves the binding, with no thread, to the listener until its client sends again. False if
    /// it could not be parked.
    pub(super) fn park(self: &Arc<Self>) -> bool {
        let token = u64::from(self.id);
        self.parking.bindings().insert(token, self.clone());
        let parked = self.parking.set.park(std::os::fd::AsFd::as_fd(&self.conn.stream), token).is_ok();
        if !parked {
            self.parking.bindings().remove(&token);
        }
        parked
    }

    /// The binding is over: its connection closes, and the endpoint forgets it.
    pub(super) fn ended(&self) {
        self.close();
        self.shared.stream_bindings.fetch_sub(1, Ordering::Relaxed);
        self.shared.endpoint.release(&self.binding);
    }

    /// One thread's life: take a call from the connection, run it, answer, again.
    pub(super) fn serve(&self, first: bool) {
        let mut own = Own {
            args: Vec::new(),
            out: Vec::new(),
            charge: Charge::new(self.binding.budget()),
            retention: Retention::default(),
            calls: self.shared.call_shards.take(),
            quick: QuickProcedures::new(),
        };
        if !own.charge.reserve(OUT) {
            if first {
                self.close();
            }
            return;
        }
        own.out.reserve(OUT);
        while let Some(call) = self.take(&mut own, first) {
            let started = self.busy();
            let status = self.run(&mut own, &call);
            if call.timed {
                own.quick.observe(self.export_key(), call.procedure, started.elapsed());
            }
            // Idle again before the result goes: the caller's next call, which may arrive as soon
            // as it has gone, must not look like a call waiting while every thread is busy.
            self.idle.fetch_add(1, Ordering::AcqRel);
            let sent = self.send_result(&mut own.out, call.slot, call.seq, call.procedure, status);
            own.settle();
            if !sent {
                self.close();
                return;
            }
        }
    }

    /// This thread takes a call: one fewer idle. The instant is stored first, so that the listener,
    /// seeing no thread idle, reads when the last one went busy (or later), never an older one.
    /// Returns that instant.
    pub(super) fn busy(&self) -> Instant {
        let now = Instant::now();
        let since = now.saturating_duration_since(self.created).as_nanos().min(u64::MAX as u128) as u64;
        self.all_busy_since.store(since, Ordering::Release);
        self.taken.fetch_add(1, Ordering::Relaxed);
        self.idle.fetch_sub(1, Ordering::AcqRel);
        now
    }

    /// The export's key in [`Own::quick`].
    pub(super) fn export_key(&self) -> usize {
        Arc::as_ptr(&self.export) as *const () as usize
    }

    /// Runs `call`, whose frame is whole at the front of `frames`, where it landed, and appends its
    /// result frame to `own.out`, held to go out with the others of its run
    /// ([`StreamBinding::send_held`]). When it finished.
    pub(super) fn run_held(&self, frames: &Deframer, own: &mut Own, call: &Taken) -> Instant {
        let started = self.busy();
        let args = frames.frame().get(HEADER_LEN..).unwrap_or_default();
        let base = own.out.len();
        let status = self.run_appended(args, &mut own.out, &own.calls, call);
        self.idle.fetch_add(1, Ordering::AcqRel);
        let len = own.out.len() - base - FRAME_HEAD;
        let head: &mut [u8; FRAME_HEAD] = match (&mut own.out[base..base + FRAME_HEAD]).try_into() {
            Ok(h) => h,
            Err(_) => unreachable!("a held result starts with a frame head"),
        };
        fill_head(head, self.id, self.shared.incarnation, call.slot, call.seq, call.procedure, status, len);
        let done = Instant::now();
        own.quick.observe(self.export_key(), call.procedure, done.saturating_duration_since(started));
        done
    }

    /// Sends the `held` result frames in `own.out` with one write. False: the connection is over.
    pub(super) fn send_held(&self, own: &mut Own, held: &mut usize) -> bool {
        let sent = self.conn.send(&mut [IoSlice::new(&own.out)]).is_ok();
        if *held > 1 {
            self.shared.stats.sent_together.fetch_add(*held as u64, Ordering::Relaxed);
        }
        *held = 0;
        own.out.clear();
        own.settle();
        sent
    }

    /// Runs a plain procedure with the arguments in `own.args`, its results into `own.out`.
    pub(super) fn run(&self, own: &mut Own, call: &Taken) -> Status {
        self.run_with(&own.args, &mut own.out, &own.calls, call)
    }

    /// Runs a plain procedure with `args`, its results into `out`, counted on `calls` (the
    /// thread's own).
    pub(super) fn run_with(
        &self,
        args: &[u8],
        out: &mut Vec<u8>,
        calls: &crate::counters::Shard,
        call: &Taken,
    ) -> Status {
        out.clear();
        self.run_appended(args, out, calls, call)
    }

    /// As [`StreamBinding::run_with`], the result frame (its head left for the caller to fill in)
    /// appended to what `out` holds.
    #[inline]
    fn run_appended(&self, args: &[u8], out: &mut Vec<u8>, calls: &crate::counters::Shard, call: &Taken) -> Status {
        let shared = &*self.shared;
        let start = out.len() + FRAME_HEAD;
        out.resize(start, 0);
        shared.endpoint.run_started(&self.binding);
        calls.add_one();
        let limit = shared.config.timing.max_message;
        let status =
            dispatch::run_procedure(shared, &self.export, call.procedure, args, call.arrival, out, start, limit);
        shared.endpoint.run_finished(&self.binding);
        status
    }

    /// Runs an in-place procedure ([`crate::Export::in_place`]) on `frame`, its call's whole frame
    /// (prefix, header, message) where it landed, and sends the result from there: the buffer as
    /// the procedure left it, then what it returned, appended. An error goes back from `own.out`.
    /// False: the connection is over.
    pub(super) fn run_in_place(&self, frame: &mut Vec<u8>, own: &mut Own, call: &Taken) -> bool {
        let shared = &*self.shared;
        let (slot, seq, procedure) = (call.slot, call.seq, call.procedure);
        let out = &mut own.out;
        out.clear();
        out.resize(FRAME_HEAD, 0);
        shared.endpoint.run_started(&self.binding);
        own.calls.add_one();
        let ran =
            dispatch::run_in_place(shared, &self.export, procedure, frame, FRAME_HEAD, call.arrival, out, FRAME_HEAD);
        shared.endpoint.run_finished(&self.binding);
        let limit = shared.config.timing.max_message;
        match ran {
            Ok(body) if frame.len() - body <= limit => {
                shared.stats.in_place.fetch_add(1, Ordering::Relaxed);
                let mut head = [0u8; FRAME_HEAD];
                fill_head(&mut head, self.id, shared.incarnation, slot, seq, procedure, Status::Ok, frame.len() - body);
                self.conn.send(&mut [IoSlice::new(&head), IoSlice::new(&frame[body..])]).is_ok()
            }
            Ok(body) => {
                let message = format!("result of {} bytes exceeds the limit of {limit} bytes", frame.len() - body);
                out.extend_from_slice(message.as_bytes());
                self.send_result(out, slot, seq, procedure, Status::ResultTooLarge)
            }
            Err(status) => self.send_result(out, slot, seq, procedure, status),
        }
    }
}

impl StreamBinding {
    /// Starts the call on the runtime if its procedure is async (`None`: it is not).
    #[cfg(feature = "async")]
    pub(super) fn start_async(&self, args: &[u8], call: &Taken, out: &mut Vec<u8>) -> Option<Result<(), Status>> {
        let (id, incarnation, conn) = (self.id, self.shared.incarnation, self.conn.clone());
        let binding = self.binding.clone();
        let (slot, seq, procedure) = (call.slot, call.seq, call.procedure);
        let finish = move |status: Status, results: Vec<u8>| {
            let mut head = [0u8; FRAME_HEAD];
            fill_head(&mut head, id, incarnation, slot, seq, procedure, status, results.len());
            let _ = conn.send(&mut [IoSlice::new(&head), IoSlice::new(&results)]);
            binding.call_ended();
        };
        // Counted by the binding (not forgotten meanwhile), not as a worker taken.
        self.binding.call_began();
        let key = (id | 1 << 31, slot, seq);
        let limit = self.shared.config.timing.max_message;
        let started = dispatch::start_async(
            &self.shared,
            self.binding.budget(),
            &self.export,
            procedure,
            args,
            call.arrival,
            out,
            limit,
            key,
            finish,
        );
        if !matches!(started, Some(Ok(()))) {
            self.binding.call_ended();
        }
        started
    }

    /// Sends the result frame in `out` (prefix and header filled in here). False: the connection
    /// is over.
    pub(super) fn send_result(&self, out: &mut [u8], slot: u32, seq: u32, procedure: u16, status: Status) -> bool {
        let len = out.len() - FRAME_HEAD;
        let (head, _) = out.split_at_mut(FRAME_HEAD);
        let head: &mut [u8; FRAME_HEAD] = match head.try_into() {
            Ok(h) => h,
            Err(_) => unreachable!("the result buffer starts with a frame head"),
        };
        fill_head(head, self.id, self.shared.incarnation, slot, seq, procedure, status, len);
        self.conn.send(&mut [IoSlice::new(out)]).is_ok()
    }
}

/// Writes the prefix and header of a result frame of `len` bytes of results.
#[allow(clippy::too_many_arguments)]
pub(super) fn fill_head(
    head: &mut [u8; FRAME_HEAD],
    binding: u32,
    incarnation: u64,
    slot: u32,
    seq: u32,
    procedure: u16,
    status: Status,
    len: usize,
) {
    head[..PREFIX_LEN].copy_from_slice(&stream::prefix(HEADER_LEN + len));
    let h = Header {
        status,
        procedure,
        binding,
        slot,
        seq,
        incarnation,
        payload_len: len as u32,
        message_len: len as u32,
        ..Header::new(Kind::Result)
    };
    head[PREFIX_LEN..].copy_from_slice(&h.to_bytes());
}
