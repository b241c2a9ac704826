//! The adaptive spin budget of a waiting caller.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::config::Spin;

/// Callers of this process spinning for a result now, on any binding: synchronous calls, and an async
/// call through shared memory that spins because it is its binding's only one in flight.
pub(crate) static SPINNERS: Spinners = Spinners { n: AtomicUsize::new(0), waiting: AtomicUsize::new(0) };

/// A count of callers spinning for their results.
///
/// Callers that spin side by side on fewer CPUs than they are take the CPU from one another: a
/// caller spinning through its time slice keeps the others from sending their calls, and eight
/// callers pinned to one CPU made no more calls over UDP than one. So while another caller of the
/// process spins too, a spinning caller yields the CPU (`sched_yield`) between its looks at the
/// result instead of only hinting it: the callers take turns, and each sends its call while the
/// others wait. With more CPUs than spinners the yield finds nothing else to run and returns at
/// once; a caller spinning alone does not yield.
#[derive(Debug)]
pub(crate) struct Spinners {
    n: AtomicUsize,
    /// UDP and TCP callers that block at once waiting for their results ([`Spinners::waiting`]).
    waiting: AtomicUsize,
}

impl Spinners {
    /// Counts a UDP or TCP caller that blocks at once, waiting for its result, until dropped. (Callers
    /// that spin are counted as spinners, on their path, and not here.)
    #[inline]
    pub(crate) fn waiting(&self) -> Waiting<'_> {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        Waiting { spinners: self }
    }

    /// Counts a caller that starts spinning, until it stops or is dropped.
    #[inline]
    pub(crate) fn start(&self) -> Spinner<'_> {
        self.n.fetch_add(1, Ordering::Relaxed);
        Spinner { spinners: self, counted: true }
    }
}

/// The most turns a UDP or TCP caller that blocks at once takes among the others before it blocks: each
/// a yield of the CPU while another caller waits too ([`Waiting::yield_among_others`]), then a look
/// at its socket. With one turn, a caller that found nothing slept, and its result, come a moment
/// later, woke it (tens of µs on our VM, of both CPUs' time); the others' turns are the time the
/// server takes to answer. A caller alone takes none (nothing else would run: the yield would be a
/// spin), and a turn costs a caller whose result is slow a yield and a receive that does not block
/// (about a µs on our VM). Blocking UDP callers on CPU 0, the server with spinning off on CPU 1 (a
/// scratch client, builds with 1, 2, 3, 4, 6 and 8 turns in turn, 1 s each, two rounds), calls a
/// second at two callers 34,645/32,740, 45,765/39,216, 46,968/46,210, 55,835/53,335,
/// 93,598/112,361 and 240,604/208,948; at four 129,802/122,931, 265,841/266,613,
/// 315,733/317,514, 324,293/331,381, 315,548/308,581 and 328,312/316,499; at eight 324,981 to
/// 349,595 with any; alone 13,552 to 14,747 with any. Four: they take all of the gain at four
/// callers, while two callers still block at times; with eight turns two callers never did (the
/// CPU then never rests: a spin by turns, which a caller that blocks at once is not to make).
pub(crate) const WAIT_TURNS: u32 = 4;

/// One UDP or TCP caller's place among those that block at once.
#[derive(Debug)]
pub(crate) struct Waiting<'a> {
    spinners: &'a Spinners,
}

impl Waiting<'_> {
    /// Before a look of a caller that does not spin, the first and each of its turns after it
    /// ([`Waiting::take_turn`]) (and is counted among the spinners
    /// until it blocks): yields the CPU while another caller of the process waits for its result
    /// too, blocking at once or spinning (one that blocked after its spin is not seen). The result of a call just sent
    /// is not back yet, and the others may be ready to run: one woken by its result, one about to
    /// send. A caller that blocked at once, its result came while the others ran, and it was woken
    /// for it: a wake-up (tens of µs on our VM) where a look after the others' turn finds the
    /// result. Two blocking callers on one CPU (a scratch client, the server with spinning off on
    /// the other CPU, 1 s each, builds in turn) made 72,479, 81,910 and 79,290 calls a second where
    /// they made 44,010, 48,592 and 48,499 yielding only while another caller spun (which a caller
    /// that blocks at once never does); four, 193,136, 163,657 and 175,300 against 167,869, 143,047
    /// and 147,240. With no other caller to run, the yield returns at once. Returns whether it
    /// yielded.
    #[inline]
    pub(crate) fn yield_among_others(&self) -> bool {
        let others = self.spinners.waiting.load(Ordering::Relaxed) > 1 || self.spinners.n.load(Ordering::Relaxed) > 1;
        if others {
            std::thread::yield_now();
        }
        others
    }

    /// A turn before the next look, when the caller has taken fewer than [`WAIT_TURNS`] (counted
    /// in `turns`) and another caller waits too: yields the CPU and counts the turn. False when the
    /// caller should block.
    #[inline]
    pub(crate) fn take_turn(&self, turns: &mut u32) -> bool {
        let turn = *turns < WAIT_TURNS && self.yield_among_others();
        *turns += u32::from(turn);
        turn
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.spinners.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One caller's place among the spinners.
#[derive(Debug)]
pub(crate) struct Spinner<'a> {
    spinners: &'a Spinners,
    counted: bool,
}

impl Spinner<'_> {
    /// Whether another caller spins too (so this one should let it run between looks).
    #[inline]
    pub(crate) fn crowded(&self) -> bool {
        self.spinners.n.load(Ordering::Relaxed) > 1
    }

    /// One turn of the spin: yields the CPU while another caller spins too, else a spin-loop hint.
    /// True when it yielded (the thread may have been off its CPU for a while).
    #[inline]
    pub(crate) fn pause(&self) -> bool {
        let crowded = self.crowded();
        if crowded {
            std::thread::yield_now();
        } else {
            core::hint::spin_loop();
        }
        crowded
    }

    /// Before a caller's first look at the result of the UDP call it has just sent: yields the CPU
    /// while another caller spins too. The result cannot be back within the microsecond since the
    /// call went out, so the first look would be a failed receive, a system call for nothing; the
    /// callers it lets run send their calls or take their results meanwhile. With eight callers on
    /// one CPU, a Null call took 4.1 to 4.3 system calls of its caller (send, a failed receive, the
    /// yield, the receive of the result), and 3.0 to 3.4 with the yield first. (Over TCP a caller
    /// mostly looks at a result another thread read, a load from memory: yielding first there made
    /// eight callers slower.) Returns whether it yielded: whether another caller spins.
    #[inline]
    pub(crate) fn before_first_look(&self) -> bool {
        let crowded = self.crowded();
        if crowded {
            std::thread::yield_now();
        }
        crowded
    }

    /// Spins again after a block: counted again.
    #[inline]
    pub(crate) fn resume(&mut self) {
        if !std::mem::replace(&mut self.counted, true) {
            self.spinners.n.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Stops spinning (about to block): no longer counted.
    #[inline]
    pub(crate) fn stop(&mut self) {
        if std::mem::take(&mut self.counted) {
            self.spinners.n.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for Spinner<'_> {
    fn drop(&mut self) {
        self.stop();
    }
}

/// How much longer than twice the usual round trip an adaptive waiter spins: about what blocking
/// costs. A thread that blocks and is woken pays a wake-up (~90 µs on the VMs we measure on, a
/// few µs on bare metal), so a result only a little late should not be waited for asleep: spinning
/// for as long as a block would cost loses at most that much (the classic spin-then-block bound).
/// With 5 µs here a one-caller Null call over UDP blocked at each hiccup of the machine past
/// ~20 µs, and its p99 was 1.6× to 2.0× the raw ping-pong's; a client spinning longer (a fixed
/// 1 ms, or four round trips plus 50 µs) had 1.25× to 1.44× in the same runs.
pub(crate) const SLACK_NS: u64 = 50_000;

/// Until when a waiting caller spins: its call's budget from the call's start, pushed on by each
/// packet of the call that arrives for [`SpinBudget::between_packets`] from then.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SpinDeadline {
    until: Instant,
    between: Duration,
}

impl SpinDeadline {
    /// A call that started at `start`, spun for as `budget` says.
    pub(crate) fn new(start: Instant, budget: &SpinBudget) -> SpinDeadline {
        SpinDeadline { until: start + budget.budget(), between: budget.between_packets() }
    }

    /// A packet of the call arrived at `now`. Returns whether the caller spins for the next one.
    pub(crate) fn progress(&mut self, now: Instant) -> bool {
        if self.between.is_zero() {
            return false;
        }
        self.until = self.until.max(now + self.between);
        true
    }

    /// Whether the caller still spins at `now`.
    pub(crate) fn spinning(&self, now: Instant) -> bool {
        now < self.until
    }
}

/// Tracks recent round trips and says how long to spin before blocking.
#[derive(Debug, Clone)]
pub(crate) struct SpinBudget {
    policy: Spin,
    average_ns: u64,
    /// The shortest round trip seen lately (see [`SpinBudget::first_look`]).
    floor_ns: u64,
}

impl SpinBudget {
    pub(crate) fn new(policy: Spin) -> SpinBudget {
        SpinBudget { policy, average_ns: 0, floor_ns: 0 }
    }

    /// When a lone caller that sent a one-packet call at `start` first looks for its result:
    /// three quarters of the shortest round trip seen lately after `start`, spinning on its CPU
    /// without a system call until then. Its result is not back sooner, and each look before it
    /// is a receive that finds nothing: a lone caller made 15.7 system calls a Null call over UDP,
    /// most of them such receives. A result that does come sooner (the path got faster) is found
    /// at the first look, and the round trip it gives lowers the floor at once; a slower path
    /// raises it by 1/256 of the difference each call. Never past the spin's budget: a caller that
    /// does not spin looks at once.
    pub(crate) fn first_look(&self, start: Instant) -> Instant {
        start + Duration::from_nanos(self.floor_ns / 4 * 3).min(self.budget())
    }

    /// How long to spin for the next result.
    pub(crate) fn budget(&self) -> Duration {
        match self.policy {
            Spin::Never => Duration::ZERO,
            Spin::Fixed(d) => d,
            Spin::Adaptive { max } => {
                let max_ns = max.as_nanos() as u64;
                if self.average_ns == 0 {
                    max
                } else if self.average_ns > max_ns {
                    Duration::ZERO
                } else {
                    Duration::from_nanos((2 * self.average_ns + SLACK_NS).min(max_ns))
                }
            }
        }
    }

    /// The longest the policy spins: no time for `Never`, the fixed time, or the adaptive spin's most.
    /// An async call waiting among others of its binding looks at its result this long after the
    /// binding's last result came in (see the async client's `poll_for_result`): its round trip,
    /// queueing behind the others included, says nothing of whether its server is still answering.
    #[cfg(feature = "async")]
    pub(crate) fn longest(&self) -> Duration {
        match self.policy {
            Spin::Never => Duration::ZERO,
            Spin::Fixed(d) | Spin::Adaptive { max: d } => d,
        }
    }

    /// How long to spin for the next packet of a call whose packets are coming (the acknowledgements
    /// of a multi-packet call, the fragments of a multi-packet result), counted from the last one:
    /// about what a wake-up from blocking costs, as in [`SpinBudget::budget`]. The round trips of
    /// whole calls say nothing of it: a 16 MiB call takes milliseconds, its packets come microseconds
    /// apart, and a caller that blocked once its call's spin had run out paid a wake-up for each
    /// acknowledgement.
    pub(crate) fn between_packets(&self) -> Duration {
        match self.policy {
            Spin::Never => Duration::ZERO,
            Spin::Fixed(d) => d,
            Spin::Adaptive { max } => Duration::from_nanos(SLACK_NS).min(max),
        }
    }

    /// Records a completed round trip (exponential moving average, weight 1/8; and the floor of
    /// [`SpinBudget::first_look`]).
    pub(crate) fn observe(&mut self, rtt: Duration) {
        self.observe_ns(rtt.as_nanos().min(u64::MAX as u128) as u64);
    }

    /// [`SpinBudget::observe`] of a round trip in nanoseconds (from [`tiercel_sys::clock::elapsed_ns`],
    /// without a `Duration` on the way: the shared-memory fast path calls it on every call).
    #[inline]
    pub(crate) fn observe_ns(&mut self, ns: u64) {
        self.average_ns = if self.average_ns == 0 { ns } else { self.average_ns - self.average_ns / 8 + ns / 8 };
        self.floor_ns =
            if self.floor_ns == 0 || ns < self.floor_ns { ns } else { self.floor_ns + (ns - self.floor_ns) / 256 };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spinner_yields_only_beside_another_and_is_counted_once() {
        let spinners = Spinners { n: AtomicUsize::new(0), waiting: AtomicUsize::new(0) };
        let mut a = spinners.start();
        assert!(!a.crowded(), "alone");
        let b = spinners.start();
        assert!(a.crowded() && b.crowded());
        a.stop();
        a.stop();
        assert!(!b.crowded(), "the other stopped (once)");
        drop(a);
        drop(b);
        assert_eq!(spinners.n.load(Ordering::Relaxed), 0, "dropped spinners are not counted");
        let c = spinners.start();
        assert!(!c.crowded());
    }

    #[test]
    fn adaptive_budget_follows_round_trips() {
        let mut s = SpinBudget::new(Spin::Adaptive { max: Duration::from_micros(200) });
        assert_eq!(s.budget(), Duration::from_micros(200), "spins the maximum before any observation");
        for _ in 0..100 {
            s.observe(Duration::from_micros(10));
        }
        assert_eq!(s.budget(), Duration::from_micros(70));
        for _ in 0..100 {
            s.observe(Duration::from_millis(5));
        }
        assert_eq!(s.budget(), Duration::ZERO, "long calls block at once");
        assert_eq!(SpinBudget::new(Spin::Never).budget(), Duration::ZERO);
        assert_eq!(SpinBudget::new(Spin::Fixed(Duration::from_micros(7))).budget(), Duration::from_micros(7));
    }

    #[test]
    fn packets_of_a_moving_call_are_spun_for_whatever_its_round_trips() {
        let mut s = SpinBudget::new(Spin::Adaptive { max: Duration::from_micros(200) });
        for _ in 0..100 {
            s.observe(Duration::from_millis(5));
        }
        assert_eq!(s.budget(), Duration::ZERO);
        assert_eq!(s.between_packets(), Duration::from_micros(50), "a wake-up's cost, however long the calls");
        let short = SpinBudget::new(Spin::Adaptive { max: Duration::from_micros(20) });
        assert_eq!(short.between_packets(), Duration::from_micros(20), "never past the maximum");
        assert_eq!(SpinBudget::new(Spin::Never).between_packets(), Duration::ZERO);
        assert_eq!(SpinBudget::new(Spin::Fixed(Duration::from_micros(7))).between_packets(), Duration::from_micros(7));
    }

    #[test]
    fn a_caller_spins_on_from_each_packet_of_its_call() {
        let t0 = Instant::now();
        let mut long_calls = SpinBudget::new(Spin::Adaptive { max: Duration::from_micros(200) });
        long_calls.observe(Duration::from_millis(16));
        let mut d = SpinDeadline::new(t0, &long_calls);
        assert!(!d.spinning(t0), "calls this long block at once");
        let ack = t0 + Duration::from_millis(3);
        assert!(d.progress(ack));
        assert!(d.spinning(ack + Duration::from_micros(49)));
        assert!(!d.spinning(ack + Duration::from_micros(50)), "no longer than a wake-up costs");
        // An early packet does not cut the call's own budget short.
        let mut fresh = SpinDeadline::new(t0, &SpinBudget::new(Spin::Adaptive { max: Duration::from_micros(200) }));
        assert!(fresh.progress(t0 + Duration::from_micros(1)));
        assert!(fresh.spinning(t0 + Duration::from_micros(199)));
        // A caller that never spins does not start because packets come.
        let mut never = SpinDeadline::new(t0, &SpinBudget::new(Spin::Never));
        assert!(!never.progress(t0));
        assert!(!never.spinning(t0));
    }

    #[test]
    fn the_first_look_comes_at_three_quarters_of_the_shortest_recent_round_trip() {
        let t0 = Instant::now();
        let us = Duration::from_micros;
        let mut s = SpinBudget::new(Spin::Adaptive { max: us(200) });
        assert_eq!(s.first_look(t0), t0, "no round trip seen: look at once");
        for _ in 0..10 {
            s.observe(us(8));
        }
        assert_eq!(s.first_look(t0), t0 + us(6));
        s.observe(us(4));
        assert_eq!(s.first_look(t0), t0 + us(3), "a shorter round trip lowers the floor at once");
        s.observe(Duration::from_nanos(4_000 + 256 * 8));
        assert_eq!(
            s.first_look(t0),
            t0 + Duration::from_nanos(4_008 / 4 * 3),
            "a longer one, by 1/256 of the difference"
        );
        // Never past the spin's budget.
        let mut fixed = SpinBudget::new(Spin::Fixed(us(2)));
        fixed.observe(us(8));
        assert_eq!(fixed.first_look(t0), t0 + us(2));
        let mut never = SpinBudget::new(Spin::Never);
        never.observe(us(8));
        assert_eq!(never.first_look(t0), t0);
        // Calls longer than the most an adaptive caller spins block at once, and look at once.
        let mut long = SpinBudget::new(Spin::Adaptive { max: us(200) });
        long.observe(Duration::from_millis(5));
        assert_eq!(long.first_look(t0), t0);
    }

    #[test]
    fn a_spinner_resumed_after_a_block_is_counted_again_once() {
        let spinners = Spinners { n: AtomicUsize::new(0), waiting: AtomicUsize::new(0) };
        let mut a = spinners.start();
        a.stop();
        assert_eq!(spinners.n.load(Ordering::Relaxed), 0);
        a.resume();
        a.resume();
        assert_eq!(spinners.n.load(Ordering::Relaxed), 1);
        drop(a);
        assert_eq!(spinners.n.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_caller_that_blocks_yields_first_only_while_another_waits() {
        let spinners = Spinners { n: AtomicUsize::new(0), waiting: AtomicUsize::new(0) };
        // A blocking caller is counted among the spinners until it blocks, as in the UDP wait.
        let (_sa, a) = (spinners.start(), spinners.waiting());
        assert!(!a.yield_among_others(), "alone");
        let (sb, b) = (spinners.start(), spinners.waiting());
        assert!(a.yield_among_others());
        // The other blocked (no longer a spinner) but still waits: both still yield.
        let mut sb = sb;
        sb.stop();
        assert!(a.yield_among_others());
        assert!(b.yield_among_others());
        drop(b);
        assert!(!a.yield_among_others(), "the other's wait ended");
        // A caller that spins is seen through the spinners' count.
        let spinning = spinners.start();
        assert!(a.yield_among_others());
        drop(spinning);
        drop(a);
        assert_eq!(spinners.waiting.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_caller_that_blocks_takes_its_turns_only_beside_another_and_then_blocks() {
        let spinners = Spinners { n: AtomicUsize::new(0), waiting: AtomicUsize::new(0) };
        let a = spinners.waiting();
        let mut turns = 0;
        assert!(!a.take_turn(&mut turns), "alone: it blocks at once");
        assert_eq!(turns, 0);
        let b = spinners.waiting();
        for taken in 1..=WAIT_TURNS {
            assert!(a.take_turn(&mut turns));
            assert_eq!(turns, taken);
        }
        assert!(!a.take_turn(&mut turns), "its turns are over");
        assert_eq!(turns, WAIT_TURNS);
        // The other's wait ended after two turns of a new call: this one blocks.
        let mut turns = 0;
        assert!(a.take_turn(&mut turns) && a.take_turn(&mut turns));
        drop(b);
        assert!(!a.take_turn(&mut turns));
        assert_eq!(turns, 2);
    }
}
