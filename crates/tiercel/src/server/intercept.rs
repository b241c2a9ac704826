//! A server's say over each call before it runs ([`Server::intercept`](super::Server::intercept):
//! authorization, logging), the same for every transport; a procedure asks
//! [`caller`](super::dispatch::caller) itself.

use std::time::Instant;

pub use tiercel_proto::endpoint::Caller;

/// What a server's interceptor is shown of a call, before the procedure runs.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct CallInfo {
    /// The interface's name.
    pub interface: &'static str,
    /// Its version.
    pub version: u32,
    /// The procedure's name (empty for a number the interface does not have: the call is refused
    /// as an unknown procedure after the interceptor lets it through).
    pub procedure: &'static str,
    /// The procedure's number in the interface.
    pub number: u16,
    /// Who holds the binding the call came on (see [`Caller`]); `None` where the transport could
    /// not tell (a TCP connection whose peer address could not be read).
    pub caller: Option<Caller>,
    /// The call's deadline, if its caller gave one.
    pub deadline: Option<Instant>,
    /// The transport: `"udp"`, `"tcp"` or `"shm"`.
    pub transport: &'static str,
}

/// A server's interceptor: `Ok(())` lets a call run, `Err(why)` refuses it.
pub(crate) type Interceptor = dyn Fn(&CallInfo) -> Result<(), String> + Send + Sync;
