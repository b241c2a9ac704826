//! The errors a call, an import or a server start can end with.

use std::io;
use std::net::SocketAddr;

use crate::wire::DecodeError;

/// Whether the remote procedure ran, as far as the caller can know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Execution {
    /// The procedure certainly did not run: retrying is safe.
    NeverRan,
    /// The procedure may have run once (never twice): retry only if it is idempotent.
    MayHaveRun,
    /// The procedure ran and failed.
    Ran,
}

/// Why a call, an import or a server start failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Nothing was heard from the server for the configured `dead_after` time: it is dead, restarting
    /// or unreachable. `acknowledged` says whether it had confirmed receiving the call.
    #[error("server {server} did not answer (call acknowledged: {acknowledged}); it may be dead or unreachable")]
    Unreachable {
        /// The server's address.
        server: SocketAddr,
        /// Whether the server had acknowledged the call (it then certainly started it).
        acknowledged: bool,
    },
    /// The server's process went away during the call (its shared-memory binding's connection closed).
    #[error("server {server} went away during the call (its process exited or dropped the binding)")]
    ServerGone {
        /// The server's address.
        server: SocketAddr,
    },
    /// Nothing listens at the server's address: the kernel answered the bind request with a port
    /// unreachable (ICMP), so there is no server there now.
    #[error("no server at {0}: connection refused")]
    NoServer(SocketAddr),
    /// The address asks for shared memory, and no server of that address on this host offers it.
    #[error("no server offering shared memory at {0} on this host")]
    NoSharedMemory(SocketAddr),
    /// The call's deadline passed before its result arrived.
    #[error("deadline exceeded")]
    DeadlineExceeded,
    /// The server restarted (a new incarnation) since the binding was made; calls from before the
    /// restart are never run by the new incarnation. Import again to go on.
    #[error("server restarted since the binding was made; import again")]
    ServerRestarted,
    /// The server does not know this binding (it expired or was never granted). Import again.
    #[error("server does not know this binding; import again")]
    UnknownBinding,
    /// The server does not export this interface.
    #[error("server does not export interface {name}")]
    UnknownInterface {
        /// Interface name.
        name: &'static str,
    },
    /// The server exports the interface in another version.
    #[error("interface {name}: client has version {client}, server exports version {server}")]
    VersionMismatch {
        /// Interface name.
        name: &'static str,
        /// Version the client was generated from.
        client: u32,
        /// Version the server exports.
        server: u32,
    },
    /// The server exports the interface in the same version, but its procedures differ from the
    /// client's copy (one inserted, removed, renamed, reordered, or with other argument or result
    /// types). Rebuild one side from the same definition, or give the changed one a new version.
    #[error("interface {name} differs between client and server: {difference}")]
    InterfaceMismatch {
        /// Interface name.
        name: &'static str,
        /// Where the two copies first differ, naming both.
        difference: String,
    },
    /// The server's interface has no such procedure.
    #[error("server has no procedure {0}")]
    UnknownProcedure(u16),
    /// The server could not decode the arguments.
    #[error("server could not decode the arguments: {0}")]
    BadArguments(String),
    /// The procedure panicked; the server caught it and goes on serving.
    #[error("remote procedure panicked: {0}")]
    Panicked(String),
    /// The call exceeds the size limit (by default 16 MiB) or the server's memory budget; it was
    /// not sent, or the server refused it before running it.
    #[error("call too large: {0}")]
    TooLarge(String),
    /// The procedure ran, and its result exceeds the server's size limit (by default 16 MiB) or its
    /// memory budget, so the server sent this error instead. Any effect of the procedure stands.
    #[error("the procedure ran, but its result is too large: {0}")]
    ResultTooLarge(String),
    /// The server broke the protocol: it answered with something no tiercel server sends there.
    /// Whether the procedure ran cannot be told.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// The result did not decode: client and server disagree about the interface.
    #[error("could not decode the result: {0}")]
    BadResult(DecodeError),
    /// Every client slot of the binding is in use by another thread.
    #[error("all {0} client slots of the binding are busy")]
    NoFreeSlot(u32),
    /// The server has no room for another binding.
    #[error("server is busy: no room for another binding")]
    Busy,
    /// The server refused the call as busy (every worker running a call) for the whole `dead_after`
    /// time, while the client backed off and retried. Each refusal means the server did not take the
    /// call; an earlier copy still queued could have been taken, hence "may have run".
    #[error("server overloaded: the call was refused as busy until the client gave up")]
    Overloaded,
    /// The server requires proof of a shared secret and this client has none
    /// (`ClientConfig::secret`).
    #[error("server requires a shared secret to bind; configure the client with one")]
    AuthenticationRequired,
    /// The shared secret did not match: the server refused the client's proof, or the server could
    /// not prove the client's secret back.
    #[error("authentication failed: {0}")]
    AuthenticationFailed(&'static str),
    /// A shared secret that could not be read or has too little key material.
    #[error("bad shared secret: {0}")]
    BadSecret(String),
    /// The server could not take its address: another process has it (`Address in use`), it is not
    /// one of this host's, or the port needs privileges.
    #[error("cannot serve at {addr}: {source}")]
    Listen {
        /// The address asked for.
        addr: SocketAddr,
        /// What the system said.
        source: io::Error,
    },
    /// An address that does not parse or resolve.
    #[error("bad address {0:?}: {1}")]
    Address(String, String),
    /// A local socket or thread error.
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
}

impl Error {
    /// Whether the procedure ran: never, maybe (at most once), or it ran and failed.
    pub fn execution(&self) -> Execution {
        match self {
            Error::Unreachable { .. }
            | Error::DeadlineExceeded
            | Error::ServerRestarted
            | Error::UnknownBinding
            | Error::Overloaded
            | Error::ServerGone { .. }
            | Error::Protocol(_)
            | Error::Io(_) => Execution::MayHaveRun,
            Error::UnknownInterface { .. }
            | Error::VersionMismatch { .. }
            | Error::InterfaceMismatch { .. }
            | Error::NoServer(_)
            | Error::UnknownProcedure(_)
            | Error::BadArguments(_)
            | Error::TooLarge(_)
            | Error::NoFreeSlot(_)
            | Error::Busy
            | Error::AuthenticationRequired
            | Error::AuthenticationFailed(_)
            | Error::BadSecret(_)
            | Error::NoSharedMemory(_)
            | Error::Address(..)
            | Error::Listen { .. } => Execution::NeverRan,
            Error::Panicked(_) | Error::BadResult(_) | Error::ResultTooLarge(_) => Execution::Ran,
        }
    }
}
