//! One call in progress, as a generated stub drives it: marshal, invoke, unmarshal.

use crate::wire::{Reader, Segments, Writer};
use crate::{Binding, Error};

use super::endpoint::{self, Endpoint};

/// A call being marshaled. Arguments borrowed by the writer stay borrowed until [`Call::invoke`].
pub struct Call<'a> {
    binding: &'a Binding,
    endpoint: Option<Box<Endpoint>>,
    segments: Segments<'a>,
    procedure: u16,
}

impl<'a> Call<'a> {
    pub(super) fn new(binding: &'a Binding, procedure: u16) -> Result<Call<'a>, Error> {
        let mut ep = endpoint::take(binding)?;
        ep.begin();
        let segments = Segments::new(0);
        Ok(Call { binding, endpoint: Some(ep), segments, procedure })
    }

    /// Where the arguments are marshaled.
    pub fn writer(&mut self) -> Writer<'_, 'a> {
        match &mut self.endpoint {
            Some(ep) => Writer::gathering(ep.scratch_mut(), &mut self.segments),
            // The endpoint is only absent after invoke, which consumes the call.
            None => unreachable!("a call has its endpoint until invoked"),
        }
    }

    /// Sends the call and waits for its result.
    pub fn invoke(mut self) -> Result<Reply, Error> {
        let Some(mut ep) = self.endpoint.take() else { unreachable!("a call has its endpoint until invoked") };
        match ep.run(self.binding, self.procedure, &self.segments) {
            Ok(()) => Ok(Reply { endpoint: Some(ep) }),
            Err(e) => {
                endpoint::give_back(ep);
                Err(e)
            }
        }
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        if let Some(ep) = self.endpoint.take() {
            endpoint::give_back(ep);
        }
    }
}

/// A result that arrived; the stub unmarshals it with [`Reply::reader`].
pub struct Reply {
    endpoint: Option<Box<Endpoint>>,
}

impl Reply {
    /// Reads the marshaled results, borrowing from the received packet.
    pub fn reader(&self) -> Reader<'_> {
        Reader::new(self.endpoint.as_ref().map(|e| e.result()).unwrap_or(&[]))
    }

    /// Maps a result decoding error.
    pub fn bad_result(e: crate::wire::DecodeError) -> Error {
        Error::BadResult(e)
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if let Some(ep) = self.endpoint.take() {
            endpoint::give_back(ep);
        }
    }
}
