//! A cheap clock for accounting: the CPU's time-stamp counter where there is one.
//!
//! `ticks()` costs a few nanoseconds (one `rdtsc` on x86-64; a vDSO `clock_gettime` elsewhere), so
//! timestamps can be taken on the fast path of a call without changing what they measure. Ticks are
//! only compared on one thread (the end and start of a step are taken by the same thread), so the
//! counters of different cores need not agree; [`ticks_per_second`] converts them to time.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The current tick count.
#[inline(always)]
pub fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `rdtsc` reads the time-stamp counter; it has no preconditions on x86-64 (every
        // x86-64 CPU has it) and touches no memory.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        static START: OnceLock<Instant> = OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// The tick count, read only once every instruction before it has finished, and before any after
/// it has started (`lfence; rdtsc; lfence` on x86-64; [`ticks`] elsewhere): a stamp for timing a
/// spin-wait. [`ticks`] alone is not ordered with the loads before it: at the end of a loop that
/// spins until a cache line brings the awaited value, the CPU, predicting the loop's exit, can read
/// the counter while the line is still on its way, and the time of the line's transfer falls
/// outside the span. On this project's development VM, a shared-memory ping-pong whose per-call
/// medians were 28-34 ns by [`ticks`] took 190-260 ns a round trip by the clock. The fences wait for
/// the instructions before them to finish and keep the timed code from overlapping the code around
/// it, so a stamp on every turn of a short loop slows the loop.
#[inline(always)]
pub fn stamp() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `lfence` and `rdtsc` have no preconditions on x86-64 (every x86-64 CPU has both,
        // SSE2 being part of the architecture) and touch no memory.
        unsafe {
            core::arch::x86_64::_mm_lfence();
            let t = core::arch::x86_64::_rdtsc();
            core::arch::x86_64::_mm_lfence();
            t
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        ticks()
    }
}

/// Ticks per second, measured once against the monotonic clock over 2 ms (the clock reads at
/// either end are off by tens of nanoseconds: a few parts in 100,000). Callers that time their fast
/// path measure it while setting up (tiercel does when it binds).
pub fn ticks_per_second() -> f64 {
    rates().per_second
}

/// The counter's rate three ways, measured once, so that each conversion on the fast path is one
/// multiplication (a division takes several times as long).
struct Rates {
    per_second: f64,
    ns_per_tick: f64,
    ticks_per_ns: f64,
}

fn rates() -> &'static Rates {
    static RATES: OnceLock<Rates> = OnceLock::new();
    RATES.get_or_init(|| {
        let (t0, i0) = (ticks(), Instant::now());
        while i0.elapsed() < Duration::from_millis(2) {
            std::hint::spin_loop();
        }
        let (t1, i1) = (ticks(), Instant::now());
        let per_second = (t1.wrapping_sub(t0)) as f64 / (i1 - i0).as_secs_f64();
        Rates { per_second, ns_per_tick: 1e9 / per_second, ticks_per_ns: per_second / 1e9 }
    })
}

/// Converts a number of ticks to nanoseconds.
#[inline]
pub fn ticks_to_ns(ticks: f64) -> f64 {
    ticks * rates().ns_per_tick
}

/// The time between two tick counts taken on one thread (zero if the counter went backwards, as it
/// can across cores whose counters disagree).
#[inline]
pub fn elapsed(from: u64, to: u64) -> Duration {
    Duration::from_nanos(ticks_to_ns(to.saturating_sub(from) as f64) as u64)
}

/// [`elapsed`] in nanoseconds.
#[inline]
pub fn elapsed_ns(from: u64, to: u64) -> u64 {
    // Through `i64`, whose conversions to and from `f64` are one instruction each on x86-64
    // (`u64`'s take several); a count of ticks never reaches 2^63.
    let ticks = to.saturating_sub(from).min(i64::MAX as u64) as i64;
    (ticks as f64 * rates().ns_per_tick) as i64 as u64
}

/// The number of ticks in `d`.
#[inline]
pub fn ticks_in(d: Duration) -> u64 {
    ((d.as_secs() as f64 * 1e9 + d.subsec_nanos() as f64) * rates().ticks_per_ns).min(u64::MAX as f64) as u64
}

/// `CLOCK_MONOTONIC` in nanoseconds: the same clock in every process of the host (of one time
/// namespace), so that one process can tell another when something is due (a shared-memory call's
/// deadline).
pub fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(t.tv_nsec as u64)
}

/// An `Instant` and the [`monotonic_ns`] reading of it, taken once. `Instant` is `CLOCK_MONOTONIC`
/// on Linux, so the two clocks differ by a constant, and each conversion below is arithmetic from
/// this pair rather than two more clock reads (a call with a deadline through shared memory read the
/// clock six times; now twice). The `Instant` is read between two readings of the clock, taken
/// again if the thread was held up between them (up to 16 times), and paired with their middle:
/// a conversion is off by at most half their distance, tens of nanoseconds.
fn base() -> (Instant, u64) {
    static BASE: OnceLock<(Instant, u64)> = OnceLock::new();
    *BASE.get_or_init(|| {
        let mut best: Option<(u64, Instant, u64)> = None;
        for _ in 0..16 {
            let before = monotonic_ns();
            let at = Instant::now();
            let after = monotonic_ns();
            let gap = after.saturating_sub(before);
            if best.is_none_or(|(g, ..)| gap < g) {
                best = Some((gap, at, before + gap / 2));
            }
            if gap < 1_000 {
                break;
            }
        }
        best.map_or_else(|| (Instant::now(), monotonic_ns()), |(_, at, ns)| (at, ns))
    })
}

/// The `Instant` of a [`monotonic_ns`] reading (one this process or another took). A reading
/// further ahead than an `Instant` can go (another process's nonsense) is a century ahead.
pub fn instant_of_monotonic(ns: u64) -> Instant {
    let (at, at_ns) = base();
    if ns >= at_ns {
        let far = Duration::from_secs(100 * 365 * 24 * 3600);
        at.checked_add(Duration::from_nanos(ns - at_ns)).or_else(|| at.checked_add(far)).unwrap_or(at)
    } else {
        at.checked_sub(Duration::from_nanos(at_ns - ns)).unwrap_or(at)
    }
}

/// The [`monotonic_ns`] reading of a future or past `Instant`.
pub fn monotonic_of_instant(instant: Instant) -> u64 {
    let (at, at_ns) = base();
    match instant.checked_duration_since(at) {
        Some(ahead) => at_ns.saturating_add(ahead.as_nanos() as u64),
        None => at_ns.saturating_sub(at.duration_since(instant).as_nanos() as u64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_advance_and_convert() {
        let a = ticks();
        std::thread::sleep(Duration::from_millis(5));
        let b = ticks();
        assert!(b > a);
        let ns = ticks_to_ns((b - a) as f64);
        // Slept at least 5 ms; the conversion must say so (no upper bound: the machine may be slow).
        assert!(ns >= 4.0e6, "{ns} ns");
        assert!(elapsed(a, b) >= Duration::from_millis(4));
        assert_eq!(elapsed(b, a), Duration::ZERO, "backwards is zero, not a wrap");
        let t = ticks_in(Duration::from_millis(3));
        assert!((2.9e6..3.1e6).contains(&ticks_to_ns(t as f64)), "{t} ticks");
    }

    #[test]
    fn stamps_read_the_counter_ticks_reads() {
        let a = stamp();
        let t = ticks();
        std::thread::sleep(Duration::from_millis(2));
        let b = stamp();
        assert!(a <= t && t < b, "{a} {t} {b}");
        assert!(elapsed(a, b) >= Duration::from_millis(1), "{:?}", elapsed(a, b));
    }

    #[test]
    fn monotonic_readings_and_instants_convert_both_ways() {
        let at = Instant::now() + Duration::from_millis(250);
        let back = instant_of_monotonic(monotonic_of_instant(at));
        let off = if back > at { back - at } else { at - back };
        assert!(off < Duration::from_millis(5), "{off:?} off");
        let before = monotonic_ns();
        std::thread::sleep(Duration::from_millis(2));
        assert!(monotonic_ns() >= before + 2_000_000);
        // Instants taken long after the first conversion, before and after it, and in the past,
        // convert to what the clock read beside them.
        for past in [Duration::ZERO, Duration::from_millis(1), Duration::from_secs(3)] {
            let (now, now_ns) = (Instant::now(), monotonic_ns());
            let Some(then) = now.checked_sub(past) else { continue };
            let ns = monotonic_of_instant(then);
            let expected = now_ns - past.as_nanos() as u64;
            // The test's own two reads may be far apart on a busy machine; a wrong sign or unit
            // would be seconds off.
            assert!(ns.abs_diff(expected) < 50_000_000, "{ns} against {expected}");
            let back = instant_of_monotonic(ns);
            let off = if back > then { back - then } else { then - back };
            assert!(off < Duration::from_micros(1), "{off:?} off");
        }
        // Readings from another process, however wild, convert without a panic, and the furthest
        // is far ahead (a deadline that never comes), not in the past.
        assert!(instant_of_monotonic(u64::MAX) > Instant::now() + Duration::from_secs(365 * 24 * 3600));
        assert!(instant_of_monotonic(0) <= Instant::now());
    }
}
