//! Receiving the fragments of a large call straight into its reassembly.
//!
//! While a worker receives a multi-packet call, the next datagram is most likely that call's next
//! fragment (or, with GRO, a run of the next ones). So its next receive scatters the datagram: each
//! fragment's header (and checksum trailer) into a small buffer, its payload straight into the
//! place the reassembly keeps for it, anything after into a tail. The fragments that turn out to be
//! the ones expected (well formed, of the same call, from its peer) are counted as arrived without
//! a copy; the rest of the datagram is put back together and handled as any other. A secure
//! binding's fragment lands sealed, its packet header in the place of the last bytes of the
//! fragment before (lent, and put back), and is opened where it landed
//! (`UdpWorker::receive_sealed_in_place`).

use std::cell::RefCell;
use std::io::IoSliceMut;
use std::sync::Arc;

use tiercel_proto::wire::{Packet, CHECKSUM_LEN, HEADER_LEN};

use super::EndpointBinding;

/// Most fragments one receive lands in place (a coalesced run of 1,472-byte datagrams has 44).
pub(super) const MAX_LANDED: usize = crate::transmit::MAX_RUN;

/// Most parts a landing receive scatters a datagram over: header, payload and trailer of each
/// fragment, and the tail.
pub(super) const MAX_PARTS: usize = 3 * MAX_LANDED + 1;

/// The call a worker expects the next fragments of.
#[derive(Clone)]
pub(super) struct Expected {
    pub binding: Arc<EndpointBinding>,
    pub slot: u32,
    pub seq: u32,
    /// Bytes of checksum trailer after each fragment's payload (0 or [`CHECKSUM_LEN`]).
    pub trailer: usize,
    /// The keys of a secure binding, whose fragments land sealed and are opened where they land.
    pub seal: Option<Arc<crate::secure::Session>>,
}

/// A worker's state for receiving fragments in place: the call expected, and the buffers a
/// landing receive scatters into (allocated at the first, freed when the worker idles).
#[derive(Default)]
pub(super) struct Landing {
    expected: RefCell<Option<Expected>>,
    /// Each landed fragment's header and trailer, `HEADER_LEN + CHECKSUM_LEN` bytes apiece.
    pub heads: Vec<u8>,
    /// What comes after the fragments expected.
    pub tail: Vec<u8>,
    /// The part of a datagram that did not land, put back together.
    pub rebuilt: Vec<u8>,
}

impl Landing {
    /// Expects the next fragments of call `p` (a fragment of a multi-packet call, just taken by
    /// slot `p.slot()` of `binding`); `seal` gives a secure binding's keys.
    pub fn expect(
        &self,
        binding: &Arc<EndpointBinding>,
        p: &Packet<&[u8]>,
        seal: impl FnOnce() -> Option<Arc<crate::secure::Session>>,
    ) {
        let mut expected = self.expected.borrow_mut();
        if let Some(e) = expected.as_ref() {
            if Arc::ptr_eq(&e.binding, binding) && e.slot == p.slot() && e.seq == p.seq() {
                return;
            }
        }
        let trailer = if p.flags() & tiercel_proto::wire::flags::CHECKSUM != 0 { CHECKSUM_LEN } else { 0 };
        let seal = seal();
        *expected = Some(Expected { binding: binding.clone(), slot: p.slot(), seq: p.seq(), trailer, seal });
    }

    /// The call expected, if any.
    pub fn expected(&self) -> Option<Expected> {
        self.expected.borrow().clone()
    }

    /// Expects nothing.
    pub fn forget(&self) {
        self.expected.borrow_mut().take();
    }

    /// Makes the buffers ready for datagrams (or runs) of up to `size` bytes.
    pub fn ready(&mut self, size: usize) {
        if self.tail.len() != size {
            self.heads = vec![0; MAX_LANDED * (HEADER_LEN + CHECKSUM_LEN)];
            self.tail = vec![0; size];
            self.rebuilt = vec![0; size];
        }
    }

    /// Frees the buffers and forgets the call expected.
    pub fn free(&mut self) {
        self.forget();
        (self.heads, self.tail, self.rebuilt) = Default::default();
    }
}

/// Copies bytes `range` of what `parts` hold in order (their concatenation) to the start of `out`;
/// returns how many (none when `out` is too small).
pub(super) fn gather(parts: &[IoSliceMut<'_>], range: std::ops::Range<usize>, out: &mut [u8]) -> usize {
    let want = range.len();
    if want > out.len() {
        return 0;
    }
    let (mut at, mut written) = (0, 0);
    for part in parts {
        let (start, end) = (at, at + part.len());
        at = end;
        let (from, to) = (range.start.max(start), range.end.min(end));
        if from < to {
            tiercel_proto::copy::copy(&mut out[written..written + to - from], &part[from - start..to - start]);
            written += to - from;
        }
        if at >= range.end {
            break;
        }
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_copies_a_range_across_parts() {
        let (mut a, mut b, mut c) = ([1u8, 2, 3], [4u8, 5], [6u8, 7, 8, 9]);
        let parts = [IoSliceMut::new(&mut a), IoSliceMut::new(&mut b), IoSliceMut::new(&mut c)];
        let mut out = [0u8; 9];
        assert_eq!(gather(&parts, 2..7, &mut out), 5);
        assert_eq!(&out[..5], &[3, 4, 5, 6, 7]);
        assert_eq!(gather(&parts, 0..9, &mut out), 9);
        assert_eq!(out, [1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(gather(&parts, 3..5, &mut out), 2);
        assert_eq!(&out[..2], &[4, 5]);
        assert_eq!(gather(&parts, 9..9, &mut out), 0);
        let mut small = [0u8; 2];
        assert_eq!(gather(&parts, 0..3, &mut small), 0, "no room: nothing copied");
    }
}
