//! Who is calling, and a server's say over each call before it runs: [`caller`] for a procedure,
//! [`Server::intercept`](super::Server::intercept) for the server as a whole (authorization,
//! logging), the same for every transport.

use std::cell::Cell;
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

thread_local! {
    /// The caller of the call this thread is running.
    static CALLER: Cell<Option<Caller>> = const { Cell::new(None) };
}

/// Who is calling the procedure the current thread (or, in an async procedure, task) runs: the
/// address of a client over UDP (the address its bind request came from) or TCP (the connection's
/// peer), or the user and process ids of a client through shared memory, as the kernel told at the
/// bind (`SO_PEERCRED`). An address is what the packets said: over UDP it is proven only in that
/// the client received the grant and its token there. `None` outside a procedure. Costs a
/// thread-local read.
pub fn caller() -> Option<Caller> {
    let inline = CALLER.with(Cell::get);
    #[cfg(feature = "async")]
    if inline.is_none() {
        return crate::trace::TASK_CALL.try_with(|c| c.2).ok().flatten();
    }
    inline
}

/// The running call's caller, set for the time a procedure runs.
pub(crate) struct Current;

impl Current {
    pub(crate) fn set(caller: Option<Caller>) -> Current {
        CALLER.with(|c| c.set(caller));
        Current
    }
}

impl Drop for Current {
    fn drop(&mut self) {
        CALLER.with(|c| c.set(None));
    }
}
