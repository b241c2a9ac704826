//! The tiercel packet-exchange protocol, without I/O.
//!
//! This crate holds the whole protocol of tiercel's network transport and nothing else: no sockets,
//! no threads, no clock (time comes in as an argument), no `unsafe`. The transport in the `tiercel`
//! crate drives it over UDP; the tests drive it over a simulated network on virtual time.
//!
//! ```text
//!  client slot                                    server slot
//!  ClientCall::start ── Call fragments ─────────► Slot::on_call ─► Execute / ExecuteMessage
//!       │  (retransmit with PLEASE_ACK)  ◄─ Ack ── (duplicate of a running call)
//!       │  Probe ──────────────────────────────► Slot::on_probe ─► ProbeReply / Ack / result
//!  handle_packet ◄─────────── Result fragments ── Slot::complete (saved until acknowledged)
//!       └─ Ack (multi-packet results only) ────► Slot::on_result_ack
//!  next call on the slot ────────────────────────► implicitly acknowledges the previous result
//! ```
//!
//! * [`wire`]: the fixed header, as a zero-copy view and as a value.
//! * [`copy`]: copies of a call's bytes that stay clear of a slow case of `memcpy` on some CPUs.
//! * [`fragment`]: fragment arithmetic, the windowed blast sender, reassembly with hard limits.
//! * [`client`]: the state machine of one call on a client slot.
//! * [`context`]: the call context a call may carry (its deadline, its trace).
//! * [`server`]: duplicate suppression and the saved result of one server slot.
//! * [`endpoint`]: the server endpoint: routing, the binding and slot table with saved results,
//!   admission of new calls, memory accounting and expiry.
//! * [`bind`]: the bind exchange (client and server machines, the bind messages), the same for
//!   every transport.
//! * [`onc`]: ONC RPC (Sun RPC) messages, record marking and the duplicate request cache, for
//!   tiercel's ONC server and client.
//! * [`stream`]: framing for byte-stream transports (TCP): length-prefixed whole packets.
//! * [`seal`]: the envelope of a secure binding's packets (its outer header) and the replay window;
//!   the cryptography is the `tiercel` crate's.
//! * [`shm`]: the shared-memory transport's region layout and call handshake (its memory comes from
//!   `tiercel-sys`; the handshake is model-checked with loom).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod bind;
pub mod client;
pub mod context;
pub mod copy;
pub mod endpoint;
pub mod fragment;
pub mod onc;
pub mod seal;
pub mod server;
pub mod shm;
pub mod stream;
pub mod timing;
pub mod wire;

pub use timing::Timing;
