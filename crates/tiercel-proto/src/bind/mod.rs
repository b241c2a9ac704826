//! Binding: the exchange that gives a client a binding to an interface a server exports, the same
//! for every transport.
//!
//! ```text
//! client (BindClient)                                  server (BindServer)
//!   Bind {interface, version, fingerprint, nonce} ──►  on_request: is the interface exported, in this
//!                                                        version, with this fingerprint? with a shared
//!                                                        secret, has the client proven it?
//!          ◄── Reject AuthRequired {nonce, challenge}    (a secret and no proof yet: nothing else told)
//!   Bind {…, proof over the challenge} ──────────────►
//!          ◄── BindReply {grant (+ proof)}               Admission::grant, once the transport has a
//!                                                        binding id, token and slots (or a region)
//!   or     ◄── Reject {status, what is exported}         refusal: the client names both sides
//!
//!   a client whose copy of the interface differs from the exported one (same name and version,
//!   another fingerprint) reads the refusal's procedure table: where every procedure it has that
//!   the server has too (by name) has the same shape, it binds again with the server's fingerprint
//!   and calls each procedure by the server's number for it (procedures the server lacks fail
//!   without being sent); a procedure of the same name and another shape ends the bind, named.
//! ```
//!
//! Over UDP the messages are datagrams; through shared memory the same packets go over the
//! rendezvous socket, framed by length, and the grant carries the region's descriptor. The machines
//! decide; the transports move the bytes, keep the time and retransmit. This crate has no
//! cryptography: the keyed hashes come in through [`Keyed`] and [`Challenges`].

mod client;
mod server;
pub mod wire;

pub use client::{BindClient, BindEvent, Granted, Refusal, ABSENT, PADDED_REQUEST};
pub use server::{Admission, BindDecision, BindServer, Refused, ServerAuth, MAX_REQUESTS};
pub use wire::{ProcedureTable, Rendezvous};

use wire::{CHALLENGE_LEN, PROOF_LEN};

/// What a bind exchange knows of an interface: its id, version and fingerprint, and its signature
/// (shown to a client whose copy of the interface differs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InterfaceSpec<'a> {
    /// The interface's name (shown when a client lists a server's exports).
    pub name: &'a str,
    /// A hash of the interface's name.
    pub id: u64,
    /// The version its author gave it.
    pub version: u32,
    /// A hash of the whole interface: procedure names, argument and result types, in order.
    pub fingerprint: u64,
    /// One procedure a line, `name(shape, …) -> shape`, then the types they reach, `type Name = …`.
    pub signature: &'a str,
    /// Each procedure's name and shape, in the order of their numbers.
    pub procedures: &'a [ProcedureShape],
}

/// A procedure as two sides of a binding compare it: hashes of its name, and of its shape (its
/// arguments' and result's encodings and the definitions of every type they reach). Equal shapes
/// mean the same bytes on the wire; like the fingerprint, these catch accidents, not an adversary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcedureShape {
    /// 32-bit FNV-1a of the procedure's name.
    pub name: u32,
    /// The low 32 bits of the 64-bit FNV-1a of its shape.
    pub shape: u32,
}

/// A shared secret's keyed hash, supplied by the transport (the `tiercel` crate uses keyed BLAKE3).
pub trait Keyed {
    /// The keyed hash of `transcript`.
    fn prove(&self, transcript: &[u8]) -> [u8; PROOF_LEN];
    /// Whether `proof` is the keyed hash of `transcript`, compared in constant time.
    fn verify(&self, transcript: &[u8], proof: &[u8; PROOF_LEN]) -> bool;
}

/// A server's stateless challenges: a keyed hash of who asks (`peer`: an address, or a
/// connection's id), the request's nonce and the time, so that an unproven request costs no memory.
pub trait Challenges {
    /// The challenge for a request from `peer` with `nonce`, now.
    fn challenge(&self, peer: &[u8], nonce: u64) -> [u8; CHALLENGE_LEN];
    /// Whether `challenge` was made for `peer` and `nonce` recently enough.
    fn check(&self, peer: &[u8], nonce: u64, challenge: &[u8; CHALLENGE_LEN]) -> bool;
}

/// Challenges for tests and simulations: a fixed-key hash, unpredictable to no one. Never use it
/// where an attacker could read this source.
#[doc(hidden)]
#[derive(Debug, Default, Clone, Copy)]
pub struct InsecureChallenges;

impl Challenges for InsecureChallenges {
    fn challenge(&self, peer: &[u8], nonce: u64) -> [u8; CHALLENGE_LEN] {
        let mut h = 0xcbf2_9ce4_8422_2325u64 ^ nonce;
        let mut out = [0u8; CHALLENGE_LEN];
        for (i, b) in peer.iter().chain(&nonce.to_le_bytes()).enumerate() {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
            out[i % CHALLENGE_LEN] ^= (h >> 32) as u8;
        }
        out
    }

    fn check(&self, peer: &[u8], nonce: u64, challenge: &[u8; CHALLENGE_LEN]) -> bool {
        self.challenge(peer, nonce) == *challenge
    }
}
