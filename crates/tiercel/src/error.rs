//! The errors of each operation: an address, a secret, an import (binding), a call, a server start;
//! and [`Error`], any of them, for code that lets `?` carry them all.
//!
//! Whether a remote procedure ran is a property of a call's failure ([`CallError::execution`]): an
//! import, an address, a secret or a server start runs no procedure at all.

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

/// An address that does not parse or resolve (`Client::connect`, `Server::bind`).
#[derive(Debug, thiserror::Error)]
#[error("bad address {address:?}: {reason}")]
pub struct AddressError {
    /// The address as given.
    pub address: String,
    /// What is wrong with it.
    pub reason: String,
}

/// A shared secret that could not be read, or has too little key material (`Secret::new`,
/// `Secret::from_file`).
#[derive(Debug, thiserror::Error)]
#[error("bad shared secret: {0}")]
pub struct SecretError(pub String);

/// Why an import failed. No procedure ran: an import only binds, so it may always be retried.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BindError {
    /// Nothing listens at the server's address: the kernel answered the bind request with a port
    /// unreachable (ICMP). Start the server, or check the address.
    #[error("no server at {0}: connection refused")]
    NoServer(SocketAddr),
    /// No answer to the bind request within `dead_after`: the server is down, restarting, or
    /// unreachable (a firewall, a wrong address on a network that drops silently).
    #[error("server {0} did not answer the bind request; it may be down or unreachable")]
    Unreachable(SocketAddr),
    /// The address asks for shared memory, and the server at that address does not offer it to
    /// this client: it has shared memory off, or is on another host (or network namespace), or
    /// sees this client's requests come from an address other than loopback or its own.
    #[error("no server offering shared memory at {0} on this host")]
    NoSharedMemory(SocketAddr),
    /// The address asks for shared memory, the server told where to bind, and binding there
    /// failed: the process holding the rendezvous is not the server that answered (another
    /// process, possibly of another user, took its name), or the server had no room.
    #[error("shared memory of server {server} unavailable: {reason}")]
    SharedMemoryUnavailable {
        /// The server's address.
        server: SocketAddr,
        /// What went wrong.
        reason: String,
    },
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
    /// A procedure this client has is exported under the same name with another shape: its
    /// arguments or result, or a type they reach (a field added, removed, reordered or retyped, a
    /// variant changed), differ, so the two sides would read each other's bytes as something else.
    /// Procedures added or removed on either side do not refuse a bind; this does. Rebuild one side
    /// from the same definition, or give the changed procedure a new name.
    #[error("interface {name}: procedure `{procedure}` differs between client and server: {difference}")]
    ProcedureMismatch {
        /// Interface name.
        name: &'static str,
        /// The procedure.
        procedure: &'static str,
        /// How the two copies differ: the procedure's lines, or the first type that differs.
        difference: String,
    },
    /// The server takes only secure bindings (it has a key pair, `ServerConfig::key`) and this
    /// client bound plain: give it the server's public key (`ClientConfig::server_key`).
    #[error("server takes only secure bindings; give the client the server's public key")]
    KeyRequired,
    /// The server did not prove the key the client expects of it: no answer to the secure
    /// handshake opened (another server, an impostor, or a server without a key) before the
    /// bind gave up.
    #[error("no server at {0} proved the key {1}")]
    KeyNotProven(std::net::SocketAddr, crate::PublicKey),
    /// The server did not prove the key pinned for it in the client's known-servers file
    /// (`ClientConfig::known_servers`), and tells another key, or none: another server (an
    /// impostor) answers at its address, or its key was changed. Nothing was bound. If the change
    /// is expected, remove the line named, and the next bind pins the key the server tells then.
    #[error("{0}")]
    KeyChanged(Box<KeyChange>),
    /// Asked to pin the server's key on first use (`ClientConfig::known_servers`), the client
    /// found the server has no key pair: it serves only plain bindings, and this client does not
    /// bind plain. Give the server a key (`ServerConfig::key`), or the client no known-servers file.
    #[error("the server at {0} has no key to pin (it takes only plain bindings)")]
    NoServerKey(std::net::SocketAddr),
    /// The known-servers file (`ClientConfig::known_servers`) could not be read or written, or is
    /// not trusted (another user owns it or may write it, or it is a symbolic link).
    #[error(transparent)]
    KnownServers(#[from] crate::KnownError),
    /// An exporter of the name was not endorsed as the client requires (`ClientConfig::authorities`):
    /// its registry entry carries no key, no endorsement, or one that does not vouch for its key.
    /// Nothing was sent to it.
    #[error("the exporter of {name:?} at {exporter} is not endorsed by an authority this client trusts: {why}")]
    NotEndorsed {
        /// The name imported.
        name: String,
        /// Where the entry said the exporter is.
        exporter: std::net::SocketAddr,
        /// What was wrong with its endorsement.
        why: crate::secure::NotEndorsed,
    },
    /// The server requires proof of a shared secret and this client has none
    /// (`ClientConfig::secret`).
    #[error("server requires a shared secret to bind; configure the client with one")]
    AuthenticationRequired,
    /// The shared secret did not match: the server refused the client's proof, or the server could
    /// not prove the client's secret back.
    #[error("authentication failed: {0}")]
    AuthenticationFailed(&'static str),
    /// A binding made with `ClientConfig::rebind` to an address on this host, binding again, found
    /// the address served by another user's process than when it was made (or by no process the
    /// kernel's socket tables name): another user may have taken a dead server's port, so the
    /// binding does not go there. Only a shared secret tells a server of another host from an
    /// impostor.
    #[error("the server at {server} is now run by {}, not by user {expected} as when the binding was made: not binding again to it", match found { Some(uid) => format!("user {uid}"), None => "an unknown user".to_owned() })]
    AnotherOwner {
        /// The server's address.
        server: SocketAddr,
        /// The user whose process served it when the binding was made.
        expected: u32,
        /// The user whose process serves it now, where the kernel says.
        found: Option<u32>,
    },
    /// The server does not speak this client's protocol version (it answered with the range it
    /// does): one side is too old for the other. Upgrade the older one.
    #[error("the server speaks protocol versions {server_min} to {server_max}, this client version {client}")]
    ProtocolVersion {
        /// The version this client speaks.
        client: u8,
        /// The oldest the server speaks.
        server_min: u8,
        /// The newest the server speaks.
        server_max: u8,
    },
    /// The server has no room for another binding (its `max_bindings`, or the memory or threads a
    /// shared-memory binding needs), or, over TCP, closed the connection before answering, three
    /// times: too many connections were in the bind exchange at once, or it is stopping. Existing
    /// bindings are not affected; try again later.
    #[error("server is busy: no room for another binding, or too many connections binding at once")]
    Busy,
    /// The name could not be resolved to a server exporting the interface: nobody exports it, or
    /// only with another interface (the error names both), or the registry could not be read.
    #[error(transparent)]
    Name(#[from] crate::names::NameError),
    /// The server's answer broke the bind protocol (what it sent is named).
    #[error("the server broke the bind protocol: {0}")]
    Protocol(Violation),
    /// What could not happen and did (the task binding an async client failed).
    #[error("{0}")]
    Internal(Invariant),
    /// A local socket error (the operating system's).
    #[error("I/O error while binding: {0}")]
    Io(#[from] io::Error),
}

impl BindError {
    /// Always [`Execution::NeverRan`]: an import binds, it runs no procedure. (Here so that every
    /// error of an operation that may be retried answers the same question.)
    pub fn execution(&self) -> Execution {
        Execution::NeverRan
    }
}

/// Why a call failed, and from that, whether its procedure ran ([`CallError::execution`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// Nothing was heard from the server for the configured `dead_after` time: it is dead,
    /// restarting, stopped or unreachable. `acknowledged` says whether it had confirmed receiving
    /// the call (over TCP it is always false).
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
    /// The TCP connection of the binding broke (closed or reset; a server silent for
    /// `Timing::dead_after` is `Unreachable`, and the connection stays). `sent` says whether the
    /// call had gone out: then it may have run.
    #[error("the connection to server {server} broke{}: {reason}", if *sent { " during the call" } else { " before the call went out" })]
    ConnectionLost {
        /// The server's address.
        server: SocketAddr,
        /// Whether the call had been sent (wholly or in part).
        sent: bool,
        /// What happened.
        reason: String,
    },
    /// The call's deadline passed before its result arrived. `may_have_run` is false when the call
    /// had not gone out yet (through shared memory, the thread's slot was still held by an earlier
    /// call abandoned at its deadline).
    #[error("deadline exceeded{}", if *may_have_run { "" } else { " before the call went out" })]
    DeadlineExceeded {
        /// Whether the call had gone out to the server.
        may_have_run: bool,
    },
    /// The server restarted (a new incarnation) since the binding was made; calls from before the
    /// restart are never run by the new incarnation. Import again to go on.
    #[error("server restarted since the binding was made; import again")]
    ServerRestarted,
    /// The server does not know this binding (it expired or was never granted). Import again.
    #[error("server does not know this binding; import again")]
    UnknownBinding,
    /// The server's interface has no such procedure (only a hand-built call can name one: a bound
    /// client agrees with the server on every procedure).
    #[error("server has no procedure {0}")]
    UnknownProcedure(u16),
    /// The server's copy of the interface has no procedure of this name: it was bound by procedure
    /// names (the server's copy is older, or dropped it), and the call was never sent (gRPC's
    /// UNIMPLEMENTED). Call it on a server whose copy has it.
    #[error("the server's copy of interface {interface} has no procedure `{procedure}`: never sent")]
    NotExported {
        /// The interface.
        interface: &'static str,
        /// The procedure's name.
        procedure: &'static str,
    },
    /// This client's interceptor ([`crate::Client::intercept`]) refused the call, saying why: it
    /// was never sent.
    #[error("this client's interceptor refused the call: {0}")]
    Intercepted(String),
    /// The server could not decode the arguments.
    #[error("server could not decode the arguments: {0}")]
    BadArguments(String),
    /// The server's interceptor refused the call before it ran ([`crate::Server::intercept`]),
    /// saying why: an authorization decision. It never ran.
    #[error("the server refused the call: {0}")]
    Refused(String),
    /// The procedure panicked; the server caught it and goes on serving.
    #[error("remote procedure panicked: {0}")]
    Panicked(String),
    /// The call exceeds the size limit (by default 16 MiB) or what the server's memory budgets
    /// could ever hold for it (`ServerConfig::binding_memory`, `message_memory`); it was not sent,
    /// or the server refused it before running it.
    #[error("call too large: {0}")]
    TooLarge(String),
    /// The procedure ran, and its result exceeds the server's size limit (by default 16 MiB) or its
    /// memory budget, so the server sent this error instead. Any effect of the procedure stands.
    #[error("the procedure ran, but its result is too large: {0}")]
    ResultTooLarge(String),
    /// The result did not decode: client and server disagree about a type's encoding.
    #[error("could not decode the result: {0}")]
    BadResult(DecodeError),
    /// Every client slot of the binding is held by other threads: a synchronous call without a
    /// deadline waited `Timing::dead_after` for one to be handed over (threads holding slots hand
    /// them over as their calls end), or an async call found every slot held by threads. The call
    /// never went out.
    #[error("all {0} client slots of the binding are busy")]
    NoFreeSlot(u32),
    /// The server refused the call as busy: no room in its memory budgets now
    /// (`ServerConfig::message_memory`, `binding_memory`), or it is shutting down, or over UDP
    /// every worker was running a call. On every transport the client backs off and sends the call
    /// again (first after twice `Timing::retransmit_min`, 4 ms by default, over UDP after twice
    /// its retransmission timeout, then doubling, at most `Timing::retransmit_max`), and fails so
    /// only once `dead_after` of refusals has passed, or, through shared memory and over TCP, when
    /// its deadline would pass before the next try (over UDP a deadline that passes meanwhile
    /// fails the call as `DeadlineExceeded`). Each refusal means the server did not take the call; over UDP an earlier copy still queued could have been taken
    /// (`may_have_run`), through shared memory and over TCP the server answered every try without
    /// reading it, and it never ran. A call the budgets could never hold fails at once as
    /// [`CallError::TooLarge`].
    #[error("server overloaded: the call was refused as busy")]
    Overloaded {
        /// Over UDP: an earlier copy of the call could have been taken.
        may_have_run: bool,
    },
    /// The server broke the protocol: it answered with something no tiercel server sends there.
    /// Whether the procedure ran cannot be told.
    #[error("protocol violation: {0}")]
    Protocol(Violation),
    /// Something that cannot happen did: a bug of tiercel, or of the program around it (an async
    /// call outside a tokio runtime). What it was says whether the call went out.
    #[error("{0}")]
    Internal(Invariant),
    /// The binding's server was found gone by an earlier call, and binding again
    /// (`ClientConfig::rebind`) failed: no server (or none exporting the name) could be bound.
    /// This call was not sent; the next one tries again.
    #[error("the server was gone and binding again failed: {0}")]
    BindAgain(BindError),
    /// A local socket error during the call.
    #[error("I/O error during the call: {0}")]
    Io(#[from] io::Error),
    /// An ONC RPC server answered the call with a refusal or a failure ([`crate::onc`]).
    #[error("the ONC server answered: {0}")]
    Onc(OncError),
}

/// What an ONC RPC server answered instead of a result (RFC 5531's reply statuses), or what was
/// wrong with its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OncError {
    /// `PROG_UNAVAIL`: it does not serve the program.
    #[error("program unavailable")]
    ProgUnavail,
    /// `PROG_MISMATCH`: it serves the program, in versions `low` to `high` only.
    #[error("program version mismatch (versions {low} to {high} served)")]
    ProgMismatch {
        /// Lowest version served.
        low: u32,
        /// Highest.
        high: u32,
    },
    /// `PROC_UNAVAIL`: the program has no such procedure.
    #[error("procedure unavailable")]
    ProcUnavail,
    /// `GARBAGE_ARGS`: it could not decode the arguments.
    #[error("garbage arguments")]
    GarbageArgs,
    /// `SYSTEM_ERR`: the server failed; the procedure may have run.
    #[error("system error")]
    SystemErr,
    /// `RPC_MISMATCH`: it speaks only RPC versions `low` to `high`.
    #[error("RPC version mismatch (versions {low} to {high})")]
    RpcMismatch {
        /// Lowest RPC version spoken.
        low: u32,
        /// Highest.
        high: u32,
    },
    /// `AUTH_ERROR` with this `auth_stat` (5, `AUTH_TOOWEAK`, from a tiercel server whose
    /// interceptor refused the call).
    #[error("authentication error {0}")]
    AuthError(u32),
    /// The result did not decode as the type expected: the procedure ran.
    #[error("the result did not decode: {0}")]
    BadResult(crate::xdr::XdrError),
    /// An async stub was called on an ONC binding, whose calls are synchronous: nothing was sent.
    #[error("calls on an ONC binding are synchronous; use the synchronous client stub")]
    Synchronous,
}

impl OncError {
    /// Whether the procedure ran.
    pub fn execution(&self) -> Execution {
        match self {
            OncError::SystemErr => Execution::MayHaveRun,
            OncError::BadResult(_) => Execution::Ran,
            _ => Execution::NeverRan,
        }
    }
}

impl CallError {
    /// Whether the procedure ran: never, maybe (at most once), or it ran and failed.
    pub fn execution(&self) -> Execution {
        match self {
            CallError::Unreachable { .. }
            | CallError::DeadlineExceeded { may_have_run: true }
            | CallError::ServerRestarted
            | CallError::UnknownBinding
            | CallError::Overloaded { may_have_run: true }
            | CallError::ServerGone { .. }
            | CallError::ConnectionLost { sent: true, .. }
            | CallError::Protocol(_)
            | CallError::Internal(Invariant::NoOutcome)
            | CallError::Io(_) => Execution::MayHaveRun,
            CallError::Internal(_) => Execution::NeverRan,
            CallError::UnknownProcedure(_)
            | CallError::NotExported { .. }
            | CallError::BadArguments(_)
            | CallError::Refused(_)
            | CallError::Intercepted(_)
            | CallError::TooLarge(_)
            | CallError::DeadlineExceeded { may_have_run: false }
            | CallError::Overloaded { may_have_run: false }
            | CallError::NoFreeSlot(_)
            | CallError::ConnectionLost { sent: false, .. }
            | CallError::BindAgain(_) => Execution::NeverRan,
            CallError::Panicked(_) | CallError::BadResult(_) | CallError::ResultTooLarge(_) => Execution::Ran,
            CallError::Onc(e) => e.execution(),
        }
    }
}

/// How a server broke the protocol (`CallError::Protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Violation {
    /// It answered a call with a status that answers no call's result: one that answers a bind
    /// request, refuses a packet, or says success without a result (its name as in the protocol's
    /// table of statuses).
    #[error("the server answered a call with status {0}")]
    CallStatus(&'static str),
    /// Through shared memory, it published a result whose length or status is impossible.
    #[error("the server wrote an impossible result (length {len}, status {status})")]
    ImpossibleResult {
        /// The length it wrote.
        len: u32,
        /// The status it wrote.
        status: u32,
    },
    /// Its answer to a bind request is not one (named here): malformed, for another request, a
    /// second challenge, a grant whose shared-memory region is impossible or missing.
    #[error("{0}")]
    BindAnswer(&'static str),
}

/// What could not happen and did (`CallError::Internal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Invariant {
    /// The exchange of a call that had gone out ended with neither a result nor a failure.
    #[error("the call ended without an outcome after it went out")]
    NoOutcome,
    /// The stub lent a buffer to a call whose arguments have no place for it; not sent.
    #[error("the call's arguments have no place for the buffer lent to it; it was not sent")]
    LentBufferMisplaced,
    /// The connection could not be registered with tokio's reactor; not sent.
    #[error("the connection cannot be registered with tokio's reactor; the call was not sent")]
    NotRegistered,
    /// An async call was made outside a tokio runtime; not sent.
    #[error("tiercel's async calls run inside a tokio runtime (with its I/O and time drivers); the call was not sent")]
    NoRuntime,
    /// The task that binds again (on tokio's blocking pool) panicked or was cancelled; not sent.
    #[error("the task binding again failed; the call was not sent")]
    BindTaskFailed,
    /// The task that binds an async client (on tokio's blocking pool) panicked or was cancelled.
    #[error("the task binding the client failed")]
    ImportTaskFailed,
}

/// Why a server could not be set up or started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The address does not parse or resolve.
    #[error(transparent)]
    Address(#[from] AddressError),
    /// The server could not take its address: another process has it (`Address in use`), it is not
    /// one of this host's, or the port needs privileges.
    #[error("cannot serve at {addr}: {source}")]
    Listen {
        /// The address asked for.
        addr: SocketAddr,
        /// What the system said.
        source: io::Error,
    },
    /// The TCP listener could not be bound on the UDP socket's port (another process holds it).
    #[error("cannot serve over TCP at {addr} (set ServerConfig::tcp to false to serve without TCP): {source}")]
    ListenTcp {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The server was configured to offer shared memory (`ServerConfig::shared_memory`, the
    /// default) and cannot: its rendezvous socket could not be bound. Fix the cause, or turn shared
    /// memory off to serve without it.
    #[error("cannot offer shared memory (set ServerConfig::shared_memory to false to serve without it): {0}")]
    SharedMemory(io::Error),
    /// An exported interface has `async fn` procedures, which run on a tokio runtime: build
    /// tiercel with its `async` feature.
    #[error("interface {0} has async procedures: enable tiercel's `async` feature to serve them")]
    AsyncProcedures(&'static str),
    /// A name could not be registered (`Server::export_as`): an invalid name, one given to two
    /// exports, or a registry that could not be written.
    #[error("cannot export by name: {0}")]
    Name(#[from] crate::names::NameError),
    /// An endorsement given to the server (`ServerConfig::endorsements`) is of another key than its
    /// own, or has run out.
    #[error("endorsement of {name:?}: {reason}")]
    Endorsement {
        /// The name it endorses.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Two exports of one server were given the same name.
    #[error("two exports are named {0:?}")]
    DuplicateName(String),
    /// A thread or a random number could not be had.
    #[error("I/O error starting the server: {0}")]
    Io(#[from] io::Error),
}

/// What [`BindError::KeyChanged`] tells: the key pinned for a server, and what the server tells now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyChange {
    /// What the key was pinned for: the address, or `name:` and the name.
    pub target: String,
    /// Where the server that failed to prove it is.
    pub server: std::net::SocketAddr,
    /// The key pinned.
    pub pinned: crate::PublicKey,
    /// The key the server tells now, unproven (`None`: none, or no answer).
    pub told: Option<crate::PublicKey>,
    /// The known-servers file.
    pub file: std::path::PathBuf,
    /// The line of the pinned key.
    pub line: usize,
}

impl std::fmt::Display for KeyChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let KeyChange { target, server, pinned, told, file, line } = self;
        let whom = if *target == server.to_string() { "it" } else { target };
        write!(
            f,
            "the server at {server} did not prove the key pinned for {whom} ({pinned}, {} line {line}); ",
            file.display()
        )?;
        match told {
            Some(key) => write!(f, "it tells the key {key}")?,
            None => write!(f, "it tells no key")?,
        }
        write!(f, ": another server answers there, or its key changed. If the change is expected, remove that line")
    }
}

/// Any error of tiercel, for code that handles them together (`?` converts each into it).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An address did not parse or resolve.
    #[error(transparent)]
    Address(#[from] AddressError),
    /// A secret could not be read.
    #[error(transparent)]
    Secret(#[from] SecretError),
    /// A key could not be made, read or written.
    #[error(transparent)]
    Key(#[from] crate::KeyError),
    /// An import failed.
    #[error(transparent)]
    Bind(#[from] BindError),
    /// A call failed.
    #[error(transparent)]
    Call(#[from] CallError),
    /// A server could not start.
    #[error(transparent)]
    Server(#[from] ServerError),
}

impl From<crate::KnownError> for Error {
    /// A known-servers file that could not be read or written: what a bind fails with then.
    fn from(e: crate::KnownError) -> Error {
        Error::Bind(BindError::KnownServers(e))
    }
}

impl Error {
    /// Whether a remote procedure ran: for a call's failure, as [`CallError::execution`] says; every
    /// other operation runs none.
    pub fn execution(&self) -> Execution {
        match self {
            Error::Call(e) => e.execution(),
            Error::Address(_) | Error::Secret(_) | Error::Key(_) | Error::Bind(_) | Error::Server(_) => {
                Execution::NeverRan
            }
        }
    }
}
