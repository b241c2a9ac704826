//! CPU placement and CPU time.

use std::io;
use std::time::Duration;

use rustix::thread::{sched_setaffinity, CpuSet};

/// Number of CPUs online, whatever this thread's affinity.
pub fn available() -> usize {
    // SAFETY: sysconf only reads a system constant; _SC_NPROCESSORS_ONLN is a valid name.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n > 0 {
        n as usize
    } else {
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    }
}

/// Pins the calling thread to CPU `cpu`.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    if cpu >= available() || cpu >= CpuSet::MAX_CPU {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("no CPU {cpu} (CPUs online: {})", available()),
        ));
    }
    let mut set = CpuSet::new();
    set.set(cpu);
    Ok(sched_setaffinity(None, &set)?)
}

/// Lets the calling thread run on every CPU online again (after [`pin_current_thread`]); threads it
/// starts from then on inherit that. The kernel still keeps it within the process's cpuset.
pub fn unpin_current_thread() -> io::Result<()> {
    let mut set = CpuSet::new();
    for cpu in 0..available().min(CpuSet::MAX_CPU) {
        set.set(cpu);
    }
    Ok(sched_setaffinity(None, &set)?)
}

/// User and system CPU time consumed so far by this whole process.
pub fn process_times() -> (Duration, Duration) {
    let mut usage = core::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `usage` is a valid, writable `rusage`; RUSAGE_SELF is a valid `who`. getrusage only
    // writes the struct, and zeroed memory is a valid `rusage` should it fail.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec.max(0) as u64, (t.tv_usec.max(0) as u32) * 1000);
    (tv(usage.ru_utime), tv(usage.ru_stime))
}

/// User and system CPU time consumed so far by another process of this user (from
/// `/proc/PID/stat`, in clock ticks of 10 ms: measure over long enough intervals).
pub fn other_process_times(pid: u32) -> Option<(Duration, Duration)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name, in parentheses, may hold spaces: fields are counted after its closing one.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3 of the file, utime 14 and stime 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    let hz = rustix::param::clock_ticks_per_second();
    let d = |t: u64| Duration::from_nanos(t.saturating_mul(1_000_000_000) / hz.max(1));
    Some((d(utime), d(stime)))
}

/// CPU time (user and system together) consumed so far by another process, all its threads
/// counted (those that have ended too), to the nanosecond: the process's CPU-time clock
/// (`clock_getcpuclockid`). `/proc/PID/stat` counts in ticks of 10 ms, so that a process serving
/// a few hundred calls in a short window could show no time at all. `None` if there is no such
/// process.
pub fn other_process_cpu(pid: u32) -> Option<Duration> {
    let pid = libc::pid_t::try_from(pid).ok()?;
    let mut clock: libc::clockid_t = 0;
    // SAFETY: `clock` is a valid, writable `clockid_t`; clock_getcpuclockid only writes it, and
    // fails (leaving it unused here) when there is no process `pid`.
    if unsafe { libc::clock_getcpuclockid(pid, &mut clock) } != 0 {
        return None;
    }
    let mut time = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `time` is a valid, writable `timespec`; clock_gettime only writes it, and fails when
    // the process has gone since.
    if unsafe { libc::clock_gettime(clock, &mut time) } != 0 {
        return None;
    }
    Some(Duration::new(time.tv_sec.max(0) as u64, time.tv_nsec.clamp(0, 999_999_999) as u32))
}

#[cfg(test)]
mod tests {
    #[test]
    fn pinning_to_cpu_zero_works() {
        super::pin_current_thread(0).unwrap();
        assert!(super::pin_current_thread(super::available()).is_err());
        let (user, _sys) = super::process_times();
        assert!(user < std::time::Duration::from_secs(3600));
        let (u, s) = super::other_process_times(std::process::id()).unwrap();
        assert!(u + s < std::time::Duration::from_secs(3600));
        assert!(super::other_process_times(u32::MAX).is_none());
    }

    #[test]
    fn a_process_cpu_time_is_counted_finer_than_ticks() {
        // This process's CPU-time clock read as another's would be, around 2 ms of this thread's
        // computing (as getrusage counts it, to the nanosecond): /proc's ticks of 10 ms would
        // often show none of it.
        let busy = || {
            let (u, s) = super::process_times();
            u + s
        };
        let before = super::other_process_cpu(std::process::id()).unwrap();
        let start = busy();
        while busy() - start < std::time::Duration::from_millis(2) {
            std::hint::black_box(0u64);
        }
        let after = super::other_process_cpu(std::process::id()).unwrap();
        assert!(after - before >= std::time::Duration::from_millis(2), "{before:?} then {after:?}");
        assert!(super::other_process_cpu(u32::MAX).is_none());
    }
}
