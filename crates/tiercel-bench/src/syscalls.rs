//! System calls and heap allocations made by a process during a measurement window, counted by
//! `perf stat`: system calls on the `raw_syscalls:sys_enter` tracepoint, allocations on uprobes at the
//! entries of the C library's `malloc`, `calloc`, `realloc` and `posix_memalign` (where Rust's global
//! allocator, the system one, and the peers' code get their memory). perf starts with its counters
//! disabled and is switched on and off through a control pipe (`--control fd:CTL,ACK`), each switch
//! acknowledged, so the counts cover the window and nothing else. Needs `perf` and root (or a low
//! `kernel.perf_event_paranoid`, and uprobes for the allocations); without them there is no count,
//! and the tables say so. The uprobes this module adds it removes again ([`Probes`]).

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::io::{fcntl_setfd, FdFlags};
use rustix::pipe::{pipe_with, PipeFlags};

/// The tracepoint of system call entries.
const SYSCALLS: &str = "raw_syscalls:sys_enter";
/// The allocator entries probed.
const ALLOCATORS: [&str; 4] = ["malloc", "calloc", "realloc", "posix_memalign"];

/// The events a [`Counter`] counts: system calls always, allocations when the uprobes exist.
pub struct Probes {
    events: Vec<String>,
    /// Uprobes this run added (removed on drop).
    added: Vec<String>,
}

impl Probes {
    /// Adds the allocator uprobes on the C library this process runs with, where they are missing.
    /// Without perf, root or uprobes, only system calls are counted.
    pub fn add() -> Probes {
        let mut probes = Probes { events: vec![SYSCALLS.to_string()], added: Vec::new() };
        let Some(libc) = c_library() else { return probes };
        let listed = perf(&["probe", "--list"]).unwrap_or_default();
        for f in ALLOCATORS {
            let event = format!("probe_libc:{f}");
            let exists = listed.lines().any(|l| l.split_whitespace().next() == Some(event.as_str()));
            if !exists {
                if perf(&["probe", "-q", "-x", &libc, "--add", f]).is_none() {
                    continue;
                }
                probes.added.push(event.clone());
            }
            probes.events.push(event);
        }
        probes
    }

    /// System calls only: nothing to add.
    pub fn system_calls() -> Probes {
        Probes { events: vec![SYSCALLS.to_string()], added: Vec::new() }
    }

    /// Whether allocations are counted (every allocator entry probed).
    pub fn counts_allocations(&self) -> bool {
        self.events.len() == 1 + ALLOCATORS.len()
    }
}

impl Drop for Probes {
    fn drop(&mut self) {
        for event in &self.added {
            let _ = perf(&["probe", "-q", "--del", event]);
        }
    }
}

/// Runs `perf ARGS`; its standard output if it succeeded.
fn perf(args: &[&str]) -> Option<String> {
    let out = Command::new("perf").args(args).stdin(Stdio::null()).stderr(Stdio::null()).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The C library mapped into this process (the helpers are this same program, so theirs too).
fn c_library() -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|path| path.rsplit('/').next().is_some_and(|name| name.starts_with("libc.so")))
        .map(str::to_string)
}

/// What a window counted in one process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Counts {
    pub syscalls: u64,
    /// Allocator calls, when they were counted.
    pub allocations: Option<u64>,
}

/// A `perf stat` attached to one process, its counters off until [`Counter::enable`].
pub struct Counter {
    perf: Child,
    ctl: std::fs::File,
    ack: std::fs::File,
    allocations: bool,
}

impl Counter {
    /// Attaches perf to `pid` with its counters disabled; `None` if perf cannot (not installed, not
    /// allowed, no such tracepoint).
    pub fn attach(pid: u32, probes: &Probes) -> Option<Counter> {
        // The ends perf uses are inherited (no close-on-exec); ours are not.
        let (ctl_read, ctl_write) = pipe_with(PipeFlags::empty()).ok()?;
        let (ack_read, ack_write) = pipe_with(PipeFlags::empty()).ok()?;
        for ours in [&ctl_write, &ack_read] {
            fcntl_setfd(ours, FdFlags::CLOEXEC).ok()?;
        }
        let control = format!("fd:{},{}", ctl_read.as_raw_fd(), ack_write.as_raw_fd());
        let events = probes.events.join(",");
        let perf = Command::new("perf")
            .args(["stat", "-x", ",", "-e", &events, "-D", "-1", "--control", &control, "-p"])
            .arg(pid.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .ok()?;
        // perf holds its ends now.
        drop((ctl_read, ack_write));
        let mut counter =
            Counter { perf, ctl: file(ctl_write), ack: file(ack_read), allocations: probes.counts_allocations() };
        // A first switch proves perf is attached and listening.
        counter.switch("disable").then_some(counter)
    }

    /// Starts counting; false if perf did not acknowledge.
    pub fn enable(&mut self) -> bool {
        self.switch("enable")
    }

    /// Stops counting and returns what was counted while enabled.
    pub fn finish(mut self) -> Option<Counts> {
        if !self.switch("disable") {
            return None;
        }
        let pid = rustix::process::Pid::from_raw(i32::try_from(self.perf.id()).ok()?)?;
        rustix::process::kill_process(pid, rustix::process::Signal::INT).ok()?;
        let mut text = String::new();
        self.perf.stderr.take()?.read_to_string(&mut text).ok()?;
        let _ = self.perf.wait();
        // CSV lines: count,unit,event,...
        let count = |event: &str| -> Option<u64> {
            text.lines()
                .find(|l| l.split(',').nth(2) == Some(event))
                .and_then(|l| l.split(',').next())
                .and_then(|n| n.trim().parse().ok())
        };
        let allocations = if self.allocations {
            ALLOCATORS.iter().map(|f| count(&format!("probe_libc:{f}"))).sum::<Option<u64>>()
        } else {
            None
        };
        Some(Counts { syscalls: count(SYSCALLS)?, allocations })
    }

    /// Sends a control command and waits (boundedly) for perf's acknowledgement: up to 5 s in all,
    /// since a perf attaching to a busy process (every CPU taken by the calls being counted) has
    /// been seen to take more than a second to answer its first command.
    fn switch(&mut self, command: &str) -> bool {
        if writeln!(self.ctl, "{command}").is_err() {
            return false;
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut got = Vec::new();
        let mut byte = [0u8; 1];
        while !got.ends_with(b"ack\n") {
            let left = deadline.saturating_duration_since(Instant::now());
            let readable = tiercel_sys::udp::wait_readable_fd(&self.ack, Some(left));
            if left.is_zero() || !readable.unwrap_or(false) {
                return false;
            }
            match self.ack.read(&mut byte) {
                Ok(1) => got.push(byte[0]),
                _ => return false,
            }
        }
        true
    }
}

impl Drop for Counter {
    fn drop(&mut self) {
        let _ = self.perf.kill();
        let _ = self.perf.wait();
    }
}

fn file(fd: OwnedFd) -> std::fs::File {
    std::fs::File::from(fd)
}
