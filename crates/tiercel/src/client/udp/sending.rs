//! Sending a call: its fragments, in runs the window allows, each a segmented send where it can be.

use super::*;

impl UdpEndpoint {
    /// [`UdpEndpoint::flush`] of the message `segs` followed by `tail`, if any.
    pub(super) fn flush_with(
        &mut self,
        inner: &BindingInner,
        segs: &Segments<'_>,
        tail: Option<&[u8]>,
        len: usize,
    ) -> Result<(), CallError> {
        match tail {
            Some(tail) => self.flush(inner, &with_lent(segs, self.scratch.len(), tail)?, len),
            None => self.flush(inner, segs, len),
        }
    }

    /// Starts the call: numbers it, and sends its first packets. Returns the message's length and
    /// when the call started.
    pub(in crate::client) fn send_call(
        &mut self,
        binding: &Binding,
        procedure: u16,
        segs: &Segments<'_>,
    ) -> Result<(usize, Instant), CallError> {
        let inner = &*binding.inner;
        if self.leaving {
            self.leave_slot(inner);
        }
        let len = segs.message_len(&self.scratch);
        self.seq = self.seq.wrapping_add(1);
        let start = Instant::now();
        let deadline = binding.deadline.map(|d| start + d);
        self.retransmissions_at_start = self.call.retransmissions();
        self.call.start(self.seq, len, start, deadline);
        if self.context_flag != 0 {
            self.context_deadline = deadline;
        }
        if let Some(Outcome::Failed(Failure::TooLarge)) = self.call.outcome() {
            return Err(CallError::TooLarge(format!(
                "call of {len} bytes exceeds the limit of {} bytes",
                inner.config.timing.max_message
            )));
        }
        let mut p = Packet::new_unchecked(&mut self.template[..]);
        p.set_seq(self.seq);
        p.set_procedure(procedure);
        if len > self.frag_payload {
            self.retention.large(start);
            self.set_gro(true);
        }
        mark(Point::HeaderReady);
        self.starting = true;
        self.flush(inner, segs, len)?;
        mark(Point::Sent);
        Ok((len, start))
    }

    /// Sends every packet the protocol asks for.
    pub(super) fn flush(&mut self, inner: &BindingInner, segs: &Segments<'_>, len: usize) -> Result<(), CallError> {
        // Every packet the machine queued as a retransmission: each fragment of a window sent again,
        // each probe, each request for missing result fragments.
        let retransmissions = self.call.retransmissions();
        if !self.call.has_transmit() && retransmissions == self.counted_retransmissions {
            // Nothing to send (a call's single-datagram result came): nothing to count either.
            return Ok(());
        }
        if retransmissions != self.counted_retransmissions {
            let new = retransmissions - self.counted_retransmissions;
            inner.stats.retransmissions.fetch_add(new, Ordering::Relaxed);
            self.counted_retransmissions = retransmissions;
        }
        if let Some(deadline) = self.context_deadline {
            let left = context::micros(deadline.saturating_duration_since(Instant::now()));
            let at = context::DEADLINE_AT;
            if let Some(field) = self.scratch.get_mut(at..at + 4) {
                field.copy_from_slice(&left.to_le_bytes());
            }
        }
        // Fragments of a multi-packet call wait here to go out together (one segmented send), until
        // the run is full, its last fragment is the message's short one, or another packet is due.
        let mut run = transmit::RunQueue::new();
        let run_length = if len > self.frag_payload { self.run_length } else { 0 };
        // Through AF_XDP, the fragments of a message go to the kernel together.
        let station = self.xdp.as_ref().filter(|_| len > self.frag_payload).map(|x| x.station.clone());
        let _batch = station.as_deref().map(crate::xdp::Station::batch);
        let first = std::mem::take(&mut self.starting);
        while let Some(t) = self.call.poll_transmit() {
            if let Transmit::CallFragment { index, please_ack } = t {
                if run_length >= 2 {
                    let queued = run.push((index, please_ack));
                    let short = fragment_range(index, len, self.frag_payload).len() < self.frag_payload;
                    if queued == run_length || short {
                        self.send_fragments(run.take(), segs, len)?;
                    }
                    continue;
                }
            }
            if !run.is_empty() {
                self.send_fragments(run.take(), segs, len)?;
            }
            let sent = match t {
                Transmit::CallFragment { index: _, please_ack } if len <= self.frag_payload => {
                    let flag = self.call_flags(please_ack);
                    let mut p = Packet::new_unchecked(&mut self.template[..]);
                    p.set_fragment(0, 1);
                    p.set_lengths(len as u32, len as u32);
                    p.set_flags(flag);
                    let mut io = [IoSlice::new(&[]); MAX_SEGMENTS + 2];
                    io[0] = IoSlice::new(&self.template);
                    let n = segs.io_slices(&self.scratch, &mut io[1..]);
                    // A call's first send, while other threads of the shared port are in calls:
                    // it waits in the batch for theirs, and goes out at its first look.
                    let batch = match &self.port {
                        Some(port) if first && port.anyone_calling() => port.queue(&io[..n + 1]),
                        _ => None,
                    };
                    if batch.is_some() {
                        self.queued = batch;
                        Ok(0)
                    } else {
                        self.send_datagram(&io[..n + 1])
                    }
                }
                Transmit::CallFragment { index, please_ack } => {
                    let hdr = self.fragment_header(index, please_ack, len);
                    // The fragment goes out straight from the caller's buffers, like a
                    // single-packet call: no copy of the whole message first.
                    let mut io = [IoSlice::new(&[]); MAX_SEGMENTS + 2];
                    io[0] = IoSlice::new(&hdr);
                    let range = fragment_range(index, len, self.frag_payload);
                    let n = segs.range_slices(&self.scratch, range, &mut io[1..]);
                    self.send_datagram(&io[..n + 1])
                }
                Transmit::Probe => self.send_control(Kind::Probe, 0, &[]),
                Transmit::Ack { ack, resend } => {
                    let flag = if resend { flags::RESEND } else { 0 };
                    self.send_control(Kind::Ack, flag, &ack.to_bytes())
                }
                Transmit::AddressProof { challenge } => {
                    self.send_control(Kind::Probe, flags::ADDRESS_PROOF, &challenge)
                }
            };
            sent_or_lost(sent)?;
        }
        if !run.is_empty() {
            self.send_fragments(run.take(), segs, len)?;
        }
        Ok(())
    }

    /// The flags of a call packet.
    pub(super) fn call_flags(&self, please_ack: bool) -> u8 {
        self.flag_base | self.context_flag | if please_ack { flags::PLEASE_ACK } else { 0 }
    }

    /// The header of fragment `index` of a call of `len` bytes.
    pub(super) fn fragment_header(&self, index: u16, please_ack: bool, len: usize) -> [u8; HEADER_LEN] {
        let count = fragment_count(len, self.frag_payload).unwrap_or(u16::MAX);
        let range = fragment_range(index, len, self.frag_payload);
        let mut hdr = self.template;
        let mut p = Packet::new_unchecked(&mut hdr[..]);
        p.set_fragment(index, count);
        p.set_lengths(range.len() as u32, len as u32);
        p.set_flags(self.call_flags(please_ack));
        hdr
    }

    /// Sends a run of call fragments (every one full but perhaps the last) with one segmented send,
    /// each gathered straight from the caller's buffers. A kernel or route that refuses segmentation
    /// gets them one by one, now and for the rest of the endpoint's life.
    pub(super) fn send_fragments(
        &mut self,
        run: &[(u16, bool)],
        segs: &Segments<'_>,
        len: usize,
    ) -> Result<(), CallError> {
        let mut headers = [[0u8; HEADER_LEN]; transmit::MAX_RUN];
        for (h, &(index, please_ack)) in headers.iter_mut().zip(run) {
            *h = self.fragment_header(index, please_ack, len);
        }
        let mut parts = [IoSlice::new(&[]); transmit::MAX_RUN * (MAX_SEGMENTS + 1)];
        let mut ends = [0usize; transmit::MAX_RUN];
        let mut k = 0;
        for (i, (h, &(index, _))) in headers.iter().zip(run).enumerate() {
            parts[k] = IoSlice::new(h);
            let range = fragment_range(index, len, self.frag_payload);
            k += 1 + segs.range_slices(&self.scratch, range, &mut parts[k + 1..k + 1 + MAX_SEGMENTS]);
            ends[i] = k;
        }
        let checksum = self.flag_base != 0;
        let segment = HEADER_LEN + self.frag_payload + if checksum { CHECKSUM_LEN } else { 0 };
        match transmit::send_run(&self.socket, None, &parts[..k], &ends[..run.len()], checksum, segment) {
            Err(e) if udp::is_segmentation_refused(&e) => {
                self.run_length = 0;
                let mut start = 0;
                for &end in &ends[..run.len()] {
                    sent_or_lost(transmit::send(&self.socket, None, &parts[start..end], checksum))?;
                    start = end;
                }
                Ok(())
            }
            sent => sent_or_lost(sent),
        }
    }
}
