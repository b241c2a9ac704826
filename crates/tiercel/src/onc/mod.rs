//! ONC RPC (Sun RPC, RFC 5531): tiercel interfaces served to C programs built with `rpcgen`.
//!
//! An interface declared with `#[tiercel::interface(onc(program = P, version = V))]`, each
//! procedure numbered with `#[onc(procedure = N)]`, is also an ONC [`Program`]: its server stub
//! decodes XDR arguments ([`crate::xdr`]) and encodes the XDR result, and `{Trait}Onc::x_file()`
//! writes the `.x` file a C user runs `rpcgen -N` on. An [`OncServer`] serves such programs over UDP
//! and TCP (record marking) on a port of its own: an ONC call begins with the caller's xid, any 32
//! bits, so its datagrams could not be told from tiercel's own with certainty on one port, and ONC
//! clients find the port through `rpcbind` anyway ([`OncServer::register`]).
//!
//! What the server does, as RFC 5531 asks: procedure 0 of every program served is the null
//! procedure; a call of a program not served gets `PROG_UNAVAIL`, of a version not served
//! `PROG_MISMATCH` with the versions served, of a procedure the program lacks `PROC_UNAVAIL`, with
//! arguments that do not decode `GARBAGE_ARGS`; a procedure that panics gets `SYSTEM_ERR`; another
//! RPC version gets `RPC_MISMATCH`, and a credential that is malformed or neither `AUTH_NONE` nor
//! `AUTH_SYS` an `AUTH_ERROR`. A call the server's interceptor refuses is denied with
//! `AUTH_TOOWEAK` and never runs. The caller ([`crate::caller`]) is the call's address, with the
//! user and group of an `AUTH_SYS` credential ([`crate::Caller::System`]: claims, not proofs).
//! A retransmitted call runs once: a duplicate request cache, keyed as Linux's NFS server keys its
//! own, drops copies of a call while it runs and answers them from the reply it kept after.

mod client;
mod rpcbind;
mod server;

pub use client::{Link, OncClient, OncImport, OncTransport};
pub use server::{OncConfig, OncServer, OncStats, RunningOnc};

/// Why a program did not run a procedure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// It has no procedure of that number.
    NoProcedure,
    /// The arguments did not decode.
    Garbage(crate::xdr::XdrError),
}

/// An interface served over ONC: what `#[tiercel::interface(onc(...))]` implements for its server
/// stub.
pub trait Program: Send + Sync + 'static {
    /// The ONC program number.
    fn program(&self) -> u32;
    /// The version.
    fn version(&self) -> u32;
    /// The interface's name.
    fn interface(&self) -> &'static str;
    /// The name of procedure `procedure`, if the program has it.
    fn procedure_name(&self, procedure: u32) -> Option<&'static str>;
    /// Runs `procedure` on XDR arguments `args`, appending its XDR result to `out`.
    fn dispatch(&self, procedure: u32, args: &[u8], out: &mut Vec<u8>) -> Result<(), Failure>;
    /// The program's `.x` file.
    fn x_file(&self) -> String;
}
