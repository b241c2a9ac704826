//! Receiving the fragments of a large call straight into their place in its message.

use super::*;
use crate::server::landing::Expected;

impl UdpWorker {
    /// Receives the next datagram into the place of the fragments expected next of the large call
    /// this worker is receiving (`landing`), if it is receiving one, and handles it: the fragments
    /// that landed as expected without a copy, the rest put back together and handled whole.
    pub(super) fn receive_in_place(&mut self) -> std::io::Result<Landed> {
        let Some(expected) = self.landing.expected() else { return Ok(Landed::NotExpected) };
        if let Some(session) = expected.seal.clone() {
            return self.receive_sealed_in_place(&expected, &session);
        }
        let binding = &expected.binding;
        let (frag_payload, trailer) = (binding.frag_payload(), expected.trailer);
        let max = if self.lane().coalescing {
            (udp::GRO_BUFFER / (HEADER_LEN + frag_payload + trailer)).clamp(1, MAX_LANDED)
        } else {
            1
        };
        let Some(mut cell) = binding.slot(expected.slot) else { return Ok(self.nothing_expected()) };
        let Some(call) = cell.call_at(expected.slot).filter(|c| c.seq == expected.seq) else {
            return Ok(self.nothing_expected());
        };
        self.landing.ready(self.batch.size());
        let Landing { heads, tail, rebuilt, .. } = &mut self.landing;
        let Some((first, span)) = cell.landing(binding, expected.seq, max as u16, 0) else {
            drop(cell);
            return Ok(self.nothing_expected());
        };
        // Each fragment's header, payload and trailer, then the tail.
        let mut parts: [IoSliceMut<'_>; MAX_PARTS] = std::array::from_fn(|_| IoSliceMut::new(&mut []));
        let stride = if trailer > 0 { 3 } else { 2 };
        let mut n = 0;
        for (payload, head) in span.chunks_mut(frag_payload).zip(heads.chunks_mut(HEADER_LEN + CHECKSUM_LEN)) {
            let (header, rest) = head.split_at_mut(HEADER_LEN);
            parts[n] = IoSliceMut::new(header);
            parts[n + 1] = IoSliceMut::new(payload);
            if trailer > 0 {
                parts[n + 2] = IoSliceMut::new(&mut rest[..trailer]);
            }
            n += stride;
        }
        let fragments = n / stride;
        parts[n] = IoSliceMut::new(tail);
        let got = mmsg::recv_scattered_from_nowait(&self.shared.lanes[self.lane].socket, &mut parts[..=n])?;
        let stats = &self.shared.stats;
        let (len, from) = match (got.received, got.from) {
            (Received::Datagram(len), Some(from)) => (len, from),
            (Received::Nothing | Received::Refused, _) => return Ok(Landed::Nothing),
            // Too large for the buffers, or from no IP address: nothing tiercel sent.
            _ => {
                stats.malformed.fetch_add(1, Ordering::Relaxed);
                return Ok(Landed::Received(0));
            }
        };
        mark(Point::ServerArrived);
        if got.segment.is_some() {
            stats.coalesced.fetch_add(1, Ordering::Relaxed);
        }
        // The fragments that landed: each datagram of the run just where a fragment's header,
        // payload and trailer went, and the next fragment of the call from its peer.
        let now = Instant::now();
        let step = got.segment.unwrap_or(len);
        let (mut landed, mut at) = (0, 0);
        while landed < fragments && at < len {
            let pieces = &parts[landed * stride..landed * stride + stride];
            let end = (at + step).min(len);
            if end - at != HEADER_LEN + pieces[1].len() + trailer {
                break;
            }
            let p = Packet::new_unchecked(&pieces[0][..]);
            let fits = p.check_split(&pieces[1], pieces.get(2).map_or(&[][..], |t| &t[..])).is_ok()
                && usize::from(p.frag_index()) == usize::from(first) + landed
                && self.shared.endpoint.continues(binding, call, &p, from, now);
            if !fits {
                break;
            }
            (landed, at) = (landed + 1, end);
        }
        // What did not land, put back together.
        let rest = gather(&parts[..=n], at..len, rebuilt);
        if rest < len - at {
            stats.malformed.fetch_add(1, Ordering::Relaxed);
        }
        stats.landed.fetch_add(landed as u64, Ordering::Relaxed);
        let mut held = Some(cell);
        for j in 0..landed {
            let Some(mut cell) = held.take() else { break };
            let mut header = [0u8; HEADER_LEN];
            header.copy_from_slice(&self.landing.heads[j * (HEADER_LEN + CHECKSUM_LEN)..][..HEADER_LEN]);
            let p = Packet::new_unchecked(&header[..]);
            match cell.on_landed(binding, &p, now) {
                // At once, as for a fragment received whole: an acknowledgement held to the end of
                // the run made 1 MiB calls with 10% loss resend 40% more fragments.
                action @ (CallAction::Ack(_) | CallAction::Drop(_)) => {
                    let step = self.shared.endpoint.call_step(binding, &mut cell, &p, action);
                    self.answer_now(&cell, step, None);
                    held = Some(cell);
                }
                // Not of a fragment that continues a call.
                CallAction::Execute => {
                    stats.malformed.fetch_add(1, Ordering::Relaxed);
                    held = Some(cell);
                }
                // The call is whole (or given up): it runs, or is answered, as any.
                action => {
                    self.landing.forget();
                    self.act(binding, cell, &p, action, now);
                }
            }
        }
        // The slot is let go before the rest of the datagram, which may be for it, is handled.
        drop(held);
        if rest == len - at && rest > 0 {
            let rebuilt = std::mem::take(&mut self.landing.rebuilt);
            for piece in udp::segments(rest, got.segment) {
                self.handle_packet(&rebuilt[piece], from);
            }
            self.landing.rebuilt = rebuilt;
        }
        steps::close();
        Ok(Landed::Received(len))
    }

    /// [`UdpWorker::receive_in_place`] for a secure binding's call: the next datagram's sealed
    /// packet (header, then payload) is received where the payload goes, its header's place lent by
    /// the reassembly from the end of the fragment before, its outer header and tag apart; it is
    /// opened there (the AEAD needs the packet whole), and the lent bytes put back. One fragment a
    /// receive (a secure binding's fragments go one datagram at a time). A datagram that is not a
    /// sealed packet of the binding of that size is put back together and handled whole; one of
    /// the binding that opens as another fragment or packet is handled as opened.
    fn receive_sealed_in_place(&mut self, expected: &Expected, session: &Session) -> std::io::Result<Landed> {
        use tiercel_proto::seal::{Outer, SealType, OUTER_LEN, TAG_LEN};
        let binding = &expected.binding;
        let Some(mut cell) = binding.slot(expected.slot) else { return Ok(self.nothing_expected()) };
        let Some(call) = cell.call_at(expected.slot).filter(|c| c.seq == expected.seq) else {
            return Ok(self.nothing_expected());
        };
        self.landing.ready(self.batch.size());
        let Landing { heads, tail, rebuilt, .. } = &mut self.landing;
        let Some((first, region)) = cell.landing(binding, expected.seq, 1, HEADER_LEN) else {
            drop(cell);
            return Ok(self.nothing_expected());
        };
        let mut behind = [0u8; HEADER_LEN];
        behind.copy_from_slice(&region[..HEADER_LEN]);
        let (outer, rest) = heads.split_at_mut(OUTER_LEN);
        let whole = OUTER_LEN + region.len() + TAG_LEN;
        let mut parts = [
            IoSliceMut::new(outer),
            IoSliceMut::new(region),
            IoSliceMut::new(&mut rest[..TAG_LEN]),
            IoSliceMut::new(tail),
        ];
        let received = mmsg::recv_scattered_from_nowait(&self.shared.lanes[self.lane].socket, &mut parts);
        let stats = &self.shared.stats;
        let (len, from, segment) = match received {
            Ok(got) => match (got.received, got.from) {
                (Received::Datagram(len), Some(from)) => (len, from, got.segment),
                (Received::Nothing | Received::Refused, _) => {
                    parts[1][..HEADER_LEN].copy_from_slice(&behind);
                    return Ok(Landed::Nothing);
                }
                _ => {
                    parts[1][..HEADER_LEN].copy_from_slice(&behind);
                    stats.malformed.fetch_add(1, Ordering::Relaxed);
                    return Ok(Landed::Received(0));
                }
            },
            Err(e) => {
                parts[1][..HEADER_LEN].copy_from_slice(&behind);
                return Err(e);
            }
        };
        mark(Point::ServerArrived);
        let now = Instant::now();
        let mut head = [0u8; OUTER_LEN];
        head.copy_from_slice(&parts[0]);
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&parts[2]);
        let outer = Outer::from_header(&head).ok();
        let ours = len == whole
            && segment.is_none()
            && outer.is_some_and(|o| o.kind == SealType::Data && o.index == binding.id);
        if !ours {
            // Something else: put back together (before the lent bytes go back) and handled whole.
            let n = gather(&parts, 0..len, rebuilt);
            parts[1][..HEADER_LEN].copy_from_slice(&behind);
            drop(cell);
            if n < len {
                stats.malformed.fetch_add(1, Ordering::Relaxed);
                return Ok(Landed::Received(len));
            }
            let rebuilt = std::mem::take(&mut self.landing.rebuilt);
            for piece in udp::segments(n, segment) {
                self.handle_packet(&rebuilt[piece], from);
            }
            self.landing.rebuilt = rebuilt;
            steps::close();
            return Ok(Landed::Received(len));
        }
        let packet = &mut parts[1];
        if session.open_parts(&head, packet, &tag).is_err() {
            packet[..HEADER_LEN].copy_from_slice(&behind);
            stats.unopened.fetch_add(1, Ordering::Relaxed);
            return Ok(Landed::Received(len));
        }
        mark(Point::Opened);
        let mut header = [0u8; HEADER_LEN];
        header.copy_from_slice(&packet[..HEADER_LEN]);
        let p = Packet::new_unchecked(&header[..]);
        let fits = p.check_split(&packet[HEADER_LEN..], &[]).is_ok()
            && p.frag_index() == first
            && self.shared.endpoint.continues(binding, call, &p, from, now);
        if !fits {
            // Opened, and not the fragment expected here: handled as any packet opened.
            let n = packet.len();
            tiercel_proto::copy::copy(&mut rebuilt[..n], packet);
            packet[..HEADER_LEN].copy_from_slice(&behind);
            drop(cell);
            let rebuilt = std::mem::take(&mut self.landing.rebuilt);
            self.handle_opened(&rebuilt[..n], from, Some(session));
            self.landing.rebuilt = rebuilt;
            steps::close();
            return Ok(Landed::Received(len));
        }
        packet[..HEADER_LEN].copy_from_slice(&behind);
        stats.landed.fetch_add(1, Ordering::Relaxed);
        match cell.on_landed(binding, &p, now) {
            action @ (CallAction::Ack(_) | CallAction::Drop(_)) => {
                let step = self.shared.endpoint.call_step(binding, &mut cell, &p, action);
                self.answer_now(&cell, step, Some(session));
            }
            CallAction::Execute => {
                stats.malformed.fetch_add(1, Ordering::Relaxed);
            }
            action => {
                self.landing.forget();
                self.act(binding, cell, &p, action, now);
            }
        }
        steps::close();
        Ok(Landed::Received(len))
    }

    /// Forgets the call expected: the next receive takes datagrams whole.
    pub(super) fn nothing_expected(&self) -> Landed {
        self.landing.forget();
        Landed::NotExpected
    }
}
