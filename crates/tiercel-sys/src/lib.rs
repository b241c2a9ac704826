//! tiercel's OS layer: every system call the transports make goes through here.
//!
//! * [`udp`]: UDP sockets for the packet-exchange transport: gather sends (`sendmsg`) straight from
//!   user memory, non-blocking receives for spinning, `poll` for blocking, path MTU, `SO_REUSEPORT`.
//! * [`mmsg`]: several datagrams per system call (`recvmmsg` into a batch, `sendmmsg`), for a server
//!   whose calls queue.
//! * [`shm`]: shared memory between processes: sealed memfd regions, futexes, descriptor passing.
//! * [`cpu`]: pinning threads to cores, and CPU time used (for the benchmarks).
//! * [`clock`]: a cheap tick counter for accounting where the time of a call goes.
//! * `xdp` (feature `xdp`): AF_XDP sockets and tiercel's XDP program, datagrams through an
//!   interface's queues without the kernel's UDP stack.
//!
//! The system calls go through `rustix` where its safe wrappers do the job; the `unsafe` blocks of
//! the whole project live in this crate (mapping and accessing shared memory, `getrusage`), each with
//! a `// SAFETY:` note.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

pub mod clock;
pub mod cpu;
#[cfg(feature = "fault-injection")]
pub mod faults;
pub mod mmsg;
pub mod process;
pub mod shm;
pub mod tcp;
pub mod udp;
#[cfg(feature = "xdp")]
pub mod xdp;
