//! System calls made by a process during a measurement window, counted by `perf stat` on the
//! `raw_syscalls:sys_enter` tracepoint. perf starts with its counter disabled and is switched on and
//! off through a control pipe (`--control fd:CTL,ACK`), each switch acknowledged, so the count covers
//! the window and nothing else. Needs `perf` and the right to trace the process (root, or a low
//! `kernel.perf_event_paranoid`); without them there is no count, and the tables say so.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::io::{fcntl_setfd, FdFlags};
use rustix::pipe::{pipe_with, PipeFlags};

/// A `perf stat` attached to one process, its counter off until [`Counter::enable`].
pub struct Counter {
    perf: Child,
    ctl: std::fs::File,
    ack: std::fs::File,
}

impl Counter {
    /// Attaches perf to `pid` with its counter disabled; `None` if perf cannot (not installed, not
    /// allowed, no such tracepoint).
    pub fn attach(pid: u32) -> Option<Counter> {
        // The ends perf uses are inherited (no close-on-exec); ours are not.
        let (ctl_read, ctl_write) = pipe_with(PipeFlags::empty()).ok()?;
        let (ack_read, ack_write) = pipe_with(PipeFlags::empty()).ok()?;
        for ours in [&ctl_write, &ack_read] {
            fcntl_setfd(ours, FdFlags::CLOEXEC).ok()?;
        }
        let control = format!("fd:{},{}", ctl_read.as_raw_fd(), ack_write.as_raw_fd());
        let perf = Command::new("perf")
            .args(["stat", "-x", ",", "-e", "raw_syscalls:sys_enter", "-D", "-1", "--control", &control, "-p"])
            .arg(pid.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .ok()?;
        // perf holds its ends now.
        drop((ctl_read, ack_write));
        let mut counter = Counter { perf, ctl: file(ctl_write), ack: file(ack_read) };
        // A first switch proves perf is attached and listening.
        counter.switch("disable").then_some(counter)
    }

    /// Starts counting; false if perf did not acknowledge.
    pub fn enable(&mut self) -> bool {
        self.switch("enable")
    }

    /// Stops counting and returns the system calls counted while enabled.
    pub fn finish(mut self) -> Option<u64> {
        if !self.switch("disable") {
            return None;
        }
        let pid = rustix::process::Pid::from_raw(i32::try_from(self.perf.id()).ok()?)?;
        rustix::process::kill_process(pid, rustix::process::Signal::INT).ok()?;
        let mut text = String::new();
        self.perf.stderr.take()?.read_to_string(&mut text).ok()?;
        let _ = self.perf.wait();
        // CSV: count,unit,event,...
        text.lines()
            .find(|l| l.contains("raw_syscalls:sys_enter"))
            .and_then(|l| l.split(',').next())
            .and_then(|n| n.trim().parse().ok())
    }

    /// Sends a control command and waits (boundedly) for perf's acknowledgement.
    fn switch(&mut self, command: &str) -> bool {
        if writeln!(self.ctl, "{command}").is_err() {
            return false;
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut got = Vec::new();
        let mut byte = [0u8; 1];
        while !got.ends_with(b"ack\n") {
            if Instant::now() > deadline
                || !tiercel_sys::udp::wait_readable_fd(&self.ack, Some(Duration::from_secs(1))).unwrap_or(false)
            {
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
