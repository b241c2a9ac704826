//! Each thread's endpoints on the bindings it calls through, one cache per transport: taken out for
//! a call and put back after it, so that a thread's second call on a binding finds its slot, socket
//! and buffers ready, and nothing is allocated.

use std::cell::{Cell, RefCell};
use std::thread::LocalKey;

use super::shm::ShmEndpoint;
use super::tcp::TcpEndpoint;
use super::udp::UdpEndpoint;
use super::BindingInner;
use crate::CallError;

thread_local! {
    // Boxed so that taking an endpoint out for a call and putting it back moves a pointer, not the
    // endpoint. The endpoint given back last waits in a cell of its own: a thread calling one
    // binding takes it from there and puts it back with a load and a store, not through the
    // vector and its `RefCell`.
    static UDP_LAST: Cell<Option<Box<UdpEndpoint>>> = const { Cell::new(None) };
    static SHM_LAST: Cell<Option<Box<ShmEndpoint>>> = const { Cell::new(None) };
    static TCP_LAST: Cell<Option<Box<TcpEndpoint>>> = const { Cell::new(None) };
    #[allow(clippy::vec_box)]
    static UDP: RefCell<Vec<Box<UdpEndpoint>>> = const { RefCell::new(Vec::new()) };
    #[allow(clippy::vec_box)]
    static SHM: RefCell<Vec<Box<ShmEndpoint>>> = const { RefCell::new(Vec::new()) };
    #[allow(clippy::vec_box)]
    static TCP: RefCell<Vec<Box<TcpEndpoint>>> = const { RefCell::new(Vec::new()) };
}

/// One transport's cache on this thread: the endpoint given back last, and the others.
#[allow(clippy::vec_box)]
type Cache<E> = (&'static LocalKey<Cell<Option<Box<E>>>>, &'static LocalKey<RefCell<Vec<Box<E>>>>);

const UDP_CACHE: Cache<UdpEndpoint> = (&UDP_LAST, &UDP);
const SHM_CACHE: Cache<ShmEndpoint> = (&SHM_LAST, &SHM);
const TCP_CACHE: Cache<TcpEndpoint> = (&TCP_LAST, &TCP);

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
#[inline]
fn take_cached<E: Cached + 'static>((last, cache): Cache<E>, uid: u64) -> Option<Box<E>> {
    if let Ok(Some(ep)) = last.try_with(Cell::take) {
        if ep.uid() == uid {
            return Some(ep);
        }
        keep(cache, ep);
    }
    cache
        .try_with(|c| {
            let mut c = c.borrow_mut();
            c.iter().position(|e| e.uid() == uid).map(|i| c.swap_remove(i))
        })
        .ok()
        .flatten()
}

/// Puts an endpoint back into `cache`, where the next call on its binding looks first.
#[inline]
fn give_back_cached<E: Cached + 'static>((last, cache): Cache<E>, ep: Box<E>) {
    if let Ok(Some(before)) = last.try_with(|l| l.replace(Some(ep))) {
        keep(cache, before);
    }
}

/// Keeps an endpoint among the others of its transport, dropping those of bindings that no longer
/// exist.
#[allow(clippy::vec_box)]
fn keep<E: Cached + 'static>(cache: &'static LocalKey<RefCell<Vec<Box<E>>>>, ep: Box<E>) {
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
#[inline]
pub(super) fn take_udp(inner: &std::sync::Arc<BindingInner>) -> Result<Box<UdpEndpoint>, CallError> {
    match take_cached(UDP_CACHE, inner.uid) {
        Some(ep) => Ok(ep),
        None => match UdpEndpoint::new(inner, true) {
            #[cfg(feature = "async")]
            Err(CallError::NoFreeSlot(n)) => inner.asynch.lend_udp().ok_or(CallError::NoFreeSlot(n)),
            made => made.map(Box::new),
        },
    }
}

/// Returns a UDP endpoint to this thread's cache.
#[inline]
pub(super) fn give_back_udp(ep: Box<UdpEndpoint>) {
    give_back_cached(UDP_CACHE, ep);
}

/// This thread's shared-memory endpoint on the binding, created on its first call (or taken from
/// the async calls, as [`take_udp`] does).
#[inline]
pub(super) fn take_shm(
    inner: &std::sync::Arc<BindingInner>,
    link: &super::shm::Link,
) -> Result<Box<ShmEndpoint>, CallError> {
    match take_cached(SHM_CACHE, inner.uid) {
        Some(ep) => Ok(ep),
        None => match ShmEndpoint::new(inner, link) {
            #[cfg(feature = "async")]
            Err(CallError::NoFreeSlot(n)) => inner.asynch.lend_shm().ok_or(CallError::NoFreeSlot(n)),
            made => made.map(Box::new),
        },
    }
}

/// Returns a shared-memory endpoint to this thread's cache.
#[inline]
pub(super) fn give_back_shm(ep: Box<ShmEndpoint>) {
    give_back_cached(SHM_CACHE, ep);
}

/// This thread's endpoint on a TCP binding, created on its first call (or taken from the async
/// calls, as [`take_udp`] does).
#[inline]
pub(super) fn take_tcp(
    inner: &std::sync::Arc<BindingInner>,
    link: &super::tcp::Link,
) -> Result<Box<TcpEndpoint>, CallError> {
    match take_cached(TCP_CACHE, inner.uid) {
        Some(ep) => Ok(ep),
        None => match TcpEndpoint::new(inner, link) {
            #[cfg(feature = "async")]
            Err(CallError::NoFreeSlot(n)) => inner.asynch.lend_tcp().ok_or(CallError::NoFreeSlot(n)),
            made => made.map(Box::new),
        },
    }
}

/// Returns a TCP endpoint to this thread's cache.
#[inline]
pub(super) fn give_back_tcp(ep: Box<TcpEndpoint>) {
    give_back_cached(TCP_CACHE, ep);
}
