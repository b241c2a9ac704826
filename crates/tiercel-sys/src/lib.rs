//! tiercel's OS layer: every system call the transports make goes through here.
//!
//! * [`udp`]: UDP sockets for the packet-exchange transport: gather sends (`sendmsg`) straight from
//!   user memory, non-blocking receives for spinning, `poll` for blocking, path MTU, `SO_REUSEPORT`.
//! * [`cpu`]: pinning threads to cores, and CPU time used (for the benchmarks).
//!
//! The system calls go through `rustix`, whose safe wrappers need no `unsafe` here; shared memory,
//! when it lands, brings the module tree where this crate's `unsafe` blocks live, each with a
//! `// SAFETY:` note.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod cpu;
#[cfg(feature = "fault-injection")]
pub mod faults;
pub mod udp;
