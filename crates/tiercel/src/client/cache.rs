//! Each thread's endpoints on the bindings it calls through, one cache per transport: taken out for
//! a call and put back after it, so that a thread's second call on a binding finds its slot, socket
//! and buffers ready, and nothing is allocated.

use std::cell::RefCell;

use super::shm::ShmEndpoint;
use super::tcp::TcpEndpoint;
use super::udp::UdpEndpoint;
use super::BindingInner;
use crate::CallError;

thread_local! {
    // Boxed so that taking an endpoint out for a call and putting it back moves a pointer, not the
    // endpoint.
    #[allow(clippy::vec_box)]
    static UDP: RefCell<Vec<Box<UdpEndpoint>>> = const { RefCell::new(Vec::new()) };
    #[allow(clippy::vec_box)]
    static SHM: RefCell<Vec<Box<ShmEndpoint>>> = const { RefCell::new(Vec::new()) };
    #[allow(clippy::vec_box)]
    static TCP: RefCell<Vec<Box<TcpEndpoint>>> = const { RefCell::new(Vec::new()) };
}

/// A thread's endpoint on a binding, kept in a thread-local cache between calls.
pub(super) trait Cached {
    /// The binding's unique id.
    fn uid(&self) -> u64;
    /// Whether the binding still exists.
    fn is_live(&self) -> bool;
}

impl Cached for UdpEndpoint {
    fn uid(&self) -> u64 {
        UdpEndpoint::uid(self)
    }
    fn is_live(&self) -> bool {
        UdpEndpoint::is_live(self)
    }
}

impl Cached for ShmEndpoint {
    fn uid(&self) -> u64 {
        ShmEndpoint::uid(self)
    }
    fn is_live(&self) -> bool {
        ShmEndpoint::is_live(self)
    }
}

impl Cached for TcpEndpoint {
    fn uid(&self) -> u64 {
        TcpEndpoint::uid(self)
    }
    fn is_live(&self) -> bool {
        TcpEndpoint::is_live(self)
    }
}

/// Takes this thread's cached endpoint for binding `uid` out of `cache`, if there is one.
#[allow(clippy::vec_box)]
fn take_cached<E: Cached + 'static>(
    cache: &'static std::thread::LocalKey<RefCell<Vec<Box<E>>>>,
    uid: u64,
) -> Option<Box<E>> {
    cache
        .try_with(|c| {
            let mut c = c.borrow_mut();
            c.iter().position(|e| e.uid() == uid).map(|i| c.swap_remove(i))
        })
        .ok()
        .flatten()
}

/// Puts an endpoint back into `cache`, dropping those of bindings that no longer exist.
#[allow(clippy::vec_box)]
fn give_back_cached<E: Cached + 'static>(cache: &'static std::thread::LocalKey<RefCell<Vec<Box<E>>>>, ep: Box<E>) {
    let _ = cache.try_with(move |c| {
        let mut c = c.borrow_mut();
        if c.len() >= 8 {
            c.retain(|e| e.is_live());
        }
        c.push(ep);
    });
}

/// This thread's UDP endpoint on the binding, created on its first call (or, when every slot is
/// taken, one that async calls no longer use).
pub(super) fn take_udp(inner: &std::sync::Arc<BindingInner>) -> Result<Box<UdpEndpoint>, CallError> {
    match take_cached(&UDP, inner.uid) {
        Some(ep) => Ok(ep),
        None => match UdpEndpoint::new(inner) {
            #[cfg(feature = "async")]
            Err(CallError::NoFreeSlot(n)) => inner.asynch.lend_udp().ok_or(CallError::NoFreeSlot(n)),
            made => made.map(Box::new),
        },
    }
}

/// Returns a UDP endpoint to this thread's cache.
pub(super) fn give_back_udp(ep: Box<UdpEndpoint>) {
    give_back_cached(&UDP, ep);
}

/// This thread's shared-memory endpoint on the binding, created on its first call (or taken from
/// the async calls, as [`take_udp`] does).
pub(super) fn take_shm(
    inner: &std::sync::Arc<BindingInner>,
    link: &super::shm::Link,
) -> Result<Box<ShmEndpoint>, CallError> {
    match take_cached(&SHM, inner.uid) {
        Some(ep) => Ok(ep),
        None => match ShmEndpoint::new(inner, link) {
            #[cfg(feature = "async")]
            Err(CallError::NoFreeSlot(n)) => inner.asynch.lend_shm().ok_or(CallError::NoFreeSlot(n)),
            made => made.map(Box::new),
        },
    }
}

/// Returns a shared-memory endpoint to this thread's cache.
pub(super) fn give_back_shm(ep: Box<ShmEndpoint>) {
    give_back_cached(&SHM, ep);
}

/// This thread's endpoint on a TCP binding, created on its first call (or taken from the async
/// calls, as [`take_udp`] does).
pub(super) fn take_tcp(
    inner: &std::sync::Arc<BindingInner>,
    link: &super::tcp::Link,
) -> Result<Box<TcpEndpoint>, CallError> {
    match take_cached(&TCP, inner.uid) {
        Some(ep) => Ok(ep),
        None => match TcpEndpoint::new(inner, link) {
            #[cfg(feature = "async")]
            Err(CallError::NoFreeSlot(n)) => inner.asynch.lend_tcp().ok_or(CallError::NoFreeSlot(n)),
            made => made.map(Box::new),
        },
    }
}

/// Returns a TCP endpoint to this thread's cache.
pub(super) fn give_back_tcp(ep: Box<TcpEndpoint>) {
    give_back_cached(&TCP, ep);
}
