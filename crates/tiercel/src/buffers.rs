//! Buffer arguments with a direction (Peregrine's in, out and in-out buffers).

use core::ops::{Deref, DerefMut};

/// A buffer sent on the call only. On the client it is sent straight from the caller's memory; on
/// the server the procedure borrows it from the received packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct In<T>(pub T);

/// A buffer sent on the result only. The client sends just its length; on the server the procedure
/// writes straight into the result packet, and the client copies the bytes into the caller's buffer.
#[derive(Debug, PartialEq, Eq)]
pub struct Out<T>(pub T);

/// A buffer sent on the call and back on the result, changed in place by the procedure. When it is
/// the procedure's one buffer and its last argument, a large call runs on it where the server put
/// the call together (over TCP, where its frame landed), and the caller's buffer (synchronous or
/// async) receives the result's bytes as they arrive over UDP and TCP, or from the shared-memory
/// slot, without another copy; a call that fails (or whose future is dropped) may then leave part
/// of a result in it.
#[derive(Debug, PartialEq, Eq)]
pub struct InOut<T>(pub T);

macro_rules! deref {
    ($($w:ident),*) => {$(
        impl<T> Deref for $w<T> {
            type Target = T;
            fn deref(&self) -> &T {
                &self.0
            }
        }
    )*};
}
deref!(In, Out, InOut);

impl<T> DerefMut for Out<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

impl<T> DerefMut for InOut<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}
