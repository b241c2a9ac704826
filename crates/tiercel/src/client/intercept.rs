//! A client's look at each call before it is sent ([`Client::intercept`](super::Client::intercept)).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::address::Transport;

/// What a client's interceptor is shown of a call, before it is sent.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct OutgoingCall {
    /// The interface's name.
    pub interface: &'static str,
    /// Its version.
    pub version: u32,
    /// The procedure's name.
    pub procedure: &'static str,
    /// The procedure's number in the client's copy of the interface.
    pub number: u16,
    /// The server the call goes to.
    pub server: SocketAddr,
    /// The transport it goes by.
    pub transport: Transport,
    /// The time the call has, if its binding gives it a deadline.
    pub deadline: Option<Duration>,
}

/// A client's interceptor, kept in [`ClientConfig::interceptor`](crate::ClientConfig::interceptor):
/// `Ok(())` lets a call go, `Err(why)` stops it before it is sent. Two are equal when they are the
/// same one (clones of one another).
#[derive(Clone)]
pub struct ClientInterceptor(Arc<Verdict>);

/// What a client's interceptor is made of.
type Verdict = dyn Fn(&OutgoingCall) -> Result<(), String> + Send + Sync;

impl ClientInterceptor {
    /// An interceptor that asks `f` about each call.
    pub fn new(f: impl Fn(&OutgoingCall) -> Result<(), String> + Send + Sync + 'static) -> ClientInterceptor {
        ClientInterceptor(Arc::new(f))
    }

    /// `f`'s verdict on `call`.
    pub(crate) fn check(&self, call: &OutgoingCall) -> Result<(), String> {
        (self.0)(call)
    }
}

impl PartialEq for ClientInterceptor {
    fn eq(&self, other: &ClientInterceptor) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for ClientInterceptor {}

impl core::fmt::Debug for ClientInterceptor {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("ClientInterceptor(..)")
    }
}
