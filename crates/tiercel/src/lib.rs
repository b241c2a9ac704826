//! tiercel: remote procedure calls that cost little more than the packets that carry them.
//!
//! Write a trait, put `#[tiercel::interface]` on it, export an implementation from a [`Server`] and
//! import it from a [`Client`]:
//!
//! ```
//! #[tiercel::interface]
//! pub trait Arith {
//!     fn add(&self, a: i32, b: i32) -> i32;
//! }
//!
//! struct Impl;
//! impl Arith for Impl {
//!     fn add(&self, a: i32, b: i32) -> i32 { a + b }
//! }
//!
//! # fn main() -> Result<(), tiercel::Error> {
//! let server = tiercel::Server::bind("udp://127.0.0.1:0")?.export(ArithServer::new(Impl)).start()?;
//! let client: ArithClient = tiercel::Client::connect(server.addr())?.import()?;
//! assert_eq!(client.add(2, 3)?, 5);
//! # Ok(()) }
//! ```
//!
//! # The path of a call
//!
//! ```text
//! client thread                                      server worker thread
//!   generated stub: marshal args into the slot's       recvmsg into the worker's buffer
//!     scratch buffer, large slices by reference        check the header once, find binding and
//!   UdpEndpoint::run: write seq and procedure into the   slot by index, suppress duplicates
//!     prebuilt header, one send (header + args)        generated stub: borrow args from the packet,
//!   wait on the thread's own socket: spin, then poll     run the procedure, marshal results behind
//!   unmarshal from the received packet                   the slot's prebuilt header, one send
//! ```
//!
//! When calls queue at the server, one `recvmmsg` takes up to 16 of them, and the results of the
//! quick ones go out together with one `sendmmsg`.
//!
//! Anything else (retransmission, multi-packet messages, probes of long calls, a dead server) is the
//! protocol's slow path, in `tiercel-proto`.
//!
//! # Features
//!
//! * `async`: `{Trait}AsyncClient` stubs for tokio tasks (waiting without holding a thread, queueing
//!   for a slot, cancelled when dropped), `Client::import_async`, and `async fn` procedures run on a
//!   tokio runtime rather than a worker. Adds tokio; the synchronous path does not use it. An
//!   awaited Null call took 0.19 µs more than a blocking one through shared memory, 0.36 µs more
//!   over UDP and 0.44 µs more over TCP in the cost ledger's fifth run. Through shared memory both
//!   have short paths on a plain binding (`Binding::call_plain`, `Binding::call_plain_async`);
//!   measured in one sitting against the build before the async short path, an awaited call took
//!   0.39 µs more than a blocking one, against 0.54 µs there (medians of 6 alternating pairs, in a
//!   slower phase of the VM than the fifth run's; `docs/ledger.md`). In the ledger's tenth run, on
//!   an Intel VM, 0.30 µs more through shared memory, 0.27 µs over UDP and 0.26 µs over TCP.
//! * `tracing`: `tiercel.call` and `tiercel.serve` spans linked across processes by the trace ids a
//!   call carries. One load of tracing's global level per call when no subscriber listens (a
//!   subscriber at `info` costs nothing more); a subscriber that records the spans (at `debug`,
//!   formatting them) took 1.5–2.1 µs more a Null call in the cost ledger.
//! * `metrics`: per-procedure call counts and latency histograms through the `metrics` facade
//!   (what they cost a call when on: `ClientConfig::metrics`).
//! * `serde`: `wire::Serde<T>`, serde types as arguments and results.
//! * `etcd`: `names::Registry::Etcd`, names in an etcd cluster (through etcd's JSON gateway; a
//!   thread keeps each registration's lease alive).
//! * `explain`: the timestamps `tiercel explain` reads; off, they compile to nothing. Compiled in,
//!   each costs a load of a flag until `steps::enable` turns recording on; recording, a Null call
//!   took 88 ns more through shared memory (the cost ledger's fifth run) and 0.12 µs more over UDP,
//!   and 0.3–0.5 µs more through shared memory on the Intel VM of 2026-12-01 (`docs/ledger.md`).
//!
//! Each feature alone, compiled in and unused, cost a call nothing measurable in the cost ledger's
//! first run (`docs/ledger.md`, which `./ledger` measures); all four of `async`, `tracing`, `metrics`
//! and `explain` together cost a shared-memory Null call about 64 ns (of 235) there, and 21 ns (of
//! 179) in its sixth run, after the short path (`Binding::call_plain`); nothing visible over UDP and
//! TCP in the first run. In its tenth run, on an Intel VM, every build (each feature alone, `xdp`
//! among them, and the four together) was within the spread of the build with none, on every
//! transport.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

// Lets the unit tests' own `#[derive(Wire)]` types use the generated `::tiercel::` paths.
#[cfg(test)]
extern crate self as tiercel;

// The README's example runs with the doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeExample;

// Every block of the guide runs with the doctests (it uses every feature but `etcd`).
#[cfg(all(doctest, feature = "async", feature = "tracing", feature = "metrics"))]
#[doc = include_str!("../../../docs/guide.md")]
struct Guide;

pub mod address;
mod auth;
mod buffers;
mod client;
pub mod config;
mod counters;
mod error;
mod framed;
pub mod interface;
mod metrics;
pub mod names;
pub mod onc;
mod random;
mod rendezvous;
mod retention;
pub mod secure;
mod server;
mod trace;
mod waiting;
mod xdp;
// The step timestamps `tiercel explain` reads: public only to the build that reads them.
#[cfg(feature = "explain")]
#[doc(hidden)]
pub mod steps;
#[cfg(not(feature = "explain"))]
mod steps;
mod transmit;
pub mod wire;
pub mod xdr;

pub use address::{Target, ToAddress, Transport};
pub use auth::{Secret, MIN_SECRET_LEN};
pub use buffers::{In, InOut, Out};
pub use client::{Binding, Client, ClientInterceptor, ClientStats, OutgoingCall};
pub use secure::{
    Authority, AuthorityKey, Cipher, Endorsement, Identity, KeyError, KnownError, KnownServers, PublicKey,
};
// What generated client stubs drive; not called by users.
#[cfg(feature = "async")]
#[doc(hidden)]
pub use client::AsyncCall;
#[doc(hidden)]
pub use client::{Call, Reply};
pub use config::{ClientConfig, ServerConfig, Spin, Timing};
pub use error::{
    AddressError, BindError, CallError, Error, Execution, Invariant, KeyChange, OncError, SecretError, ServerError,
    Violation,
};
pub use interface::{
    AsyncDispatch, DispatchError, Export, ExportInfo, Import, InterfaceInfo, Region, Results, SignatureSource,
};
pub use server::{caller, deadline, CallInfo, Caller, RunningServer, Server, ServerStats, ShutdownHandle, StatsHandle};
pub use tiercel_macros::{interface, Wire, Xdr};
pub use wire::{DecodeError, Reader, Wire, Writer};

/// Expands to the async client stub a generated interface carries with the crate feature `async`.
#[doc(hidden)]
#[cfg(feature = "async")]
#[macro_export]
macro_rules! __async_client {
    ($($stub:tt)*) => { $($stub)* };
}

/// Without the crate feature `async`, the generated interface has no async client stub.
#[doc(hidden)]
#[cfg(not(feature = "async"))]
#[macro_export]
macro_rules! __async_client {
    ($($stub:tt)*) => {};
}

/// Re-exports for generated code; not part of the public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::interface::{fingerprint, interface_id, out_len};
    pub use crate::steps::{mark, Point};
}
