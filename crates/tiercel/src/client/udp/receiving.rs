//! Receiving a result: fragments put straight into their place in its reassembly (or the caller's
//! lent buffer), the rest handled whole.

use super::*;

impl UdpEndpoint {
    /// Receives a datagram (or a coalesced run) without blocking. While a multi-packet result is
    /// arriving, the payloads go straight into the places of the fragments expected next in its
    /// reassembly (as many as the receive buffer holds datagrams of the binding's size: one, or a
    /// run's worth), and each header and trailer, and anything after the last payload, where it
    /// would lie in the receive buffer. Each datagram that was the fragment expected there is
    /// handled in place: one copy of its bytes, the kernel's. The rest are put back together in
    /// the receive buffer and handled whole. With `lent` (the caller's buffer, whose bytes begin the
    /// result: [`UdpEndpoint::run_in_out`]), the fragments that hold nothing else go there instead.
    pub(super) fn receive_in_place(
        &mut self,
        inner: &BindingInner,
        lent: Option<&mut [u8]>,
    ) -> std::io::Result<InPlace> {
        if let Some(x) = &self.xdp {
            return Ok(InPlace::Whole(receive_xdp(x, inner, &mut self.rx), None));
        }
        if let Some(port) = &self.port {
            return Ok(InPlace::Whole(port.receive(self.slot, &mut self.rx)?, None));
        }
        let trailer = if self.flag_base != 0 { CHECKSUM_LEN } else { 0 };
        let full = HEADER_LEN + self.frag_payload + trailer;
        let result_len = self.call.result_len();
        // A result at least as long as the lent buffer begins with its bytes (anything shorter is
        // no result of the call, and is read the usual way).
        let lent = match (lent, result_len) {
            (Some(lent), Some(n)) if n >= lent.len() => lent,
            _ => &mut [][..],
        };
        // Fragments land in place only once a result's first has come (`ClientCall::landing`):
        // before that (every look of a one-datagram call), nor is how many a run may hold worked
        // out (a division).
        let landing = match result_len {
            Some(_) if self.seal.is_none() => self.call.landing((self.rx.len() / full).clamp(1, MAX_LANDED) as u16),
            _ => None,
        };
        if landing.is_some() && self.coalescing && !self.gro {
            // A result of several fragments is coming: its next runs are taken whole.
            self.gro = udp::set_gro(&self.socket, true);
        }
        let Some((first, span)) = landing else {
            // Only a socket that takes runs whole now needs to be told where a run's datagrams
            // end (a `recvmsg` with room for that); with GRO off, each datagram comes alone, and a
            // plain `recv` takes it: 0.05 µs less a look that finds nothing and 0.08 µs less one
            // that brings a datagram, on our VM (each look of a spinning caller, and the one that
            // ends every call).
            if self.gro {
                let s = udp::recv_segments_nowait(&self.socket, &mut self.rx)?;
                return Ok(InPlace::Whole(s.received, s.segment));
            }
            return Ok(InPlace::Whole(udp::recv_nowait(&self.socket, &mut self.rx)?, None));
        };
        // The receive buffer, cut where the datagrams of a run of fragments would lie: headers and
        // trailers (and what follows the last payload) are received there, payloads into their
        // places; `holes` are where the payloads would lie, for those put back.
        let stride = if trailer > 0 { 3 } else { 2 };
        let mut parts: [IoSliceMut<'_>; 3 * MAX_LANDED + 1] = std::array::from_fn(|_| IoSliceMut::new(&mut []));
        let mut holes: [&mut [u8]; MAX_LANDED] = std::array::from_fn(|_| &mut [][..]);
        let mut rest = &mut self.rx[..];
        let mut fragments = 0;
        // The lent buffer from the run's first fragment on: the run's fragments that end within it
        // (its first ones) are received there, the rest into the reassembly.
        let from = usize::from(first) * self.frag_payload;
        let mut lent_rest = lent.get_mut(from..).unwrap_or_default();
        let mut in_lent = 0;
        let mut places = span.chunks_mut(self.frag_payload).peekable();
        while let Some(place) = places.next() {
            let place = if place.len() <= lent_rest.len() {
                let (there, after) = std::mem::take(&mut lent_rest).split_at_mut(place.len());
                lent_rest = after;
                in_lent += 1;
                there
            } else {
                lent_rest = &mut [];
                place
            };
            let (header, after) = std::mem::take(&mut rest).split_at_mut(HEADER_LEN);
            let (hole, after) = after.split_at_mut(place.len());
            parts[fragments * stride] = IoSliceMut::new(header);
            parts[fragments * stride + 1] = IoSliceMut::new(place);
            holes[fragments] = hole;
            rest = after;
            if places.peek().is_some() && trailer > 0 {
                let (t, after) = std::mem::take(&mut rest).split_at_mut(trailer);
                parts[fragments * stride + 2] = IoSliceMut::new(t);
                rest = after;
            }
            fragments += 1;
        }
        let n = (fragments - 1) * stride + 2;
        parts[n] = IoSliceMut::new(rest);
        let got = mmsg::recv_scattered_from_nowait(&self.socket, &mut parts[..=n])?;
        let Received::Datagram(len) = got.received else { return Ok(InPlace::Whole(got.received, None)) };
        // The fragments that landed: each datagram of the run just where a fragment's header,
        // payload and trailer went, and the next fragment of this call's result.
        let step = got.segment.unwrap_or(len);
        let mut landed = 0;
        while landed < fragments {
            let (at, k) = (landed * full, landed * stride);
            if at >= len
                || (landed > 0 && step != full)
                || (at + step).min(len) - at != HEADER_LEN + parts[k + 1].len() + trailer
            {
                break;
            }
            let t = if landed + 1 < fragments { &parts[k + 2][..] } else { &parts[n][..trailer] };
            let p = Packet::new_unchecked(&parts[k][..]);
            let expected = p.kind() == Kind::Result
                && usize::from(p.frag_index()) == usize::from(first) + landed
                && p.check_split(&parts[k + 1], &t[..trailer]).is_ok()
                && ours(inner, self.slot, &p);
            if !expected {
                break;
            }
            landed += 1;
        }
        // The payloads received that did not land, back where they lie in the datagram.
        for (j, hole) in holes.iter_mut().enumerate().take(fragments).skip(landed) {
            let k = hole.len().min(len.saturating_sub(j * full + HEADER_LEN));
            tiercel_proto::copy::copy(&mut hole[..k], &parts[j * stride + 1][..k]);
        }
        inner.stats.landed.fetch_add(landed as u64, Ordering::Relaxed);
        let now = Instant::now();
        for j in 0..landed {
            let p = Packet::new_unchecked(&self.rx[j * full..j * full + HEADER_LEN]);
            let handled = self.call.handle_landed(&p, now);
            if handled != Handled::Ignored && j < in_lent {
                // Taken as this call's: its bytes are in the lent buffer, not the reassembly.
                let i = usize::from(first) + j;
                if self.in_tail.len() <= i / 64 {
                    self.in_tail.resize(i / 64 + 1, 0);
                }
                self.in_tail[i / 64] |= 1 << (i % 64);
            }
            match handled {
                Handled::Complete => return Ok(InPlace::Handled(true)),
                Handled::Progress => {}
                Handled::Ignored => {
                    inner.stats.stale.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let at = landed * full;
        let done = at < len
            && udp::segments(len - at, got.segment)
                .any(|piece| self.on_datagram(inner, at + piece.start..at + piece.end, now));
        Ok(InPlace::Handled(done))
    }

    /// Handles the received datagram at `at` in the receive buffer, received at `now`; true when the
    /// call is over.
    pub(super) fn on_datagram(&mut self, inner: &BindingInner, at: std::ops::Range<usize>, now: Instant) -> bool {
        let start = at.start;
        let at = match &self.seal {
            None => at,
            // Sealed: opened where it lies, then moved to where the packet would have been.
            Some(seal) => match seal.open_in_place(&mut self.rx[at]) {
                Ok(len) => {
                    self.rx.copy_within(start + OUTER_LEN..start + OUTER_LEN + len, start);
                    mark(Point::Opened);
                    start..start + len
                }
                Err(_) => {
                    inner.stats.unopened.fetch_add(1, Ordering::Relaxed);
                    return false;
                }
            },
        };
        let Ok(p) = Packet::new_checked(&self.rx[at]) else {
            inner.stats.malformed.fetch_add(1, Ordering::Relaxed);
            return false;
        };
        if !ours(inner, self.slot, &p) {
            inner.stats.stale.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        match self.call.handle_packet(&p, now) {
            Handled::Complete => {
                self.result_len = HEADER_LEN + p.payload_len() as usize;
                if start > 0 {
                    // A single-packet result read from within a coalesced run: where the next
                    // call's stub looks for it.
                    self.rx.copy_within(start..start + self.result_len, 0);
                }
                true
            }
            Handled::Progress => false,
            Handled::Ignored => {
                inner.stats.stale.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }
}

/// A datagram from the server read from the endpoint's AF_XDP port into `rx`, if one is there
/// (others, from anyone else, counted stale and dropped: a connected socket would not take them).
#[inline(never)]
fn receive_xdp(x: &crate::xdp::Port, inner: &BindingInner, rx: &mut [u8]) -> Received {
    while let Some((n, from)) = x.station.recv(x.port, rx) {
        if from == x.peer {
            return Received::Datagram(n);
        }
        inner.stats.stale.fetch_add(1, Ordering::Relaxed);
    }
    Received::Nothing
}

/// What [`UdpEndpoint::receive_in_place`] did.
pub(super) enum InPlace {
    /// A datagram (or run) was received and handled, its result fragments expected in place: true
    /// when the call is over.
    Handled(bool),
    /// A datagram, run (each datagram this long but the last) or nothing, to handle whole from the
    /// receive buffer.
    Whole(Received, Option<usize>),
}

/// Whether a checked packet is addressed to this binding's client slot `slot`.
pub(super) fn ours(inner: &BindingInner, slot: u32, p: &Packet<&[u8]>) -> bool {
    p.binding() == inner.id
        && p.slot() == slot
        && p.token() == inner.token
        && (p.kind() == Kind::Reject || p.incarnation() == inner.incarnation)
}
