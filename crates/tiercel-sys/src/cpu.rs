//! CPU placement and CPU time.

use std::io;
use std::time::Duration;

use rustix::thread::{sched_setaffinity, CpuSet};

/// Number of CPUs this process may run on.
pub fn available() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// Pins the calling thread to CPU `cpu` (modulo the CPU count).
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    let mut set = CpuSet::new();
    set.set(cpu % available().max(1));
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

#[cfg(test)]
mod tests {
    #[test]
    fn pinning_to_cpu_zero_works() {
        super::pin_current_thread(0).unwrap();
        let (user, _sys) = super::process_times();
        assert!(user < std::time::Duration::from_secs(3600));
    }
}
