//! Running a call and sending its result, on this worker or on the async runtime.

use super::*;

impl UdpWorker {
    /// Runs a call with `args` and sends its result. A large call (a message of several packets)
    /// whose procedure runs in place ([`crate::Export::in_place`]) has its result left in the
    /// message's buffer, which the slot then keeps; another has its result marshaled into this
    /// worker's spare result buffer, if it has one: large calls tend to have large results. Returns
    /// a large buffer this worker may keep for the next large call. The slot's lock is not held
    /// while the procedure runs.
    pub(super) fn execute(
        &self,
        binding: &Arc<EndpointBinding>,
        mut cell: MutexGuard<'_, UdpSlot>,
        p: &Packet<&[u8]>,
        args: Args<'_>,
        arrived: Instant,
    ) -> Option<Vec<u8>> {
        #[cfg(feature = "async")]
        // A server without async procedures has no runner: no virtual call on its fast path.
        if self.shared.asynch.is_some() && binding.export.is_async(p.procedure()) {
            drop(cell);
            return match args {
                Args::Packet(bytes) => {
                    self.execute_async(binding, p, bytes, arrived);
                    None
                }
                Args::Message(message) => {
                    self.execute_async(binding, p, &message, arrived);
                    Some(message)
                }
            };
        }
        let large = matches!(args, Args::Message(_));
        let in_place = large && binding.export.in_place(p.procedure());
        let mut out = cell.take_result(binding);
        if large && !in_place {
            let mut spares = self.spares.borrow_mut();
            if spares.result.capacity() > out.capacity() {
                std::mem::swap(&mut out, &mut spares.result);
            }
        }
        drop(cell);
        // Neither results held for the rest of a batch nor the calls behind this one in it wait
        // for a procedure that may be slow.
        let export = Arc::as_ptr(&binding.export) as *const () as usize;
        let batching = self.outbox.borrow().is_open();
        if batching {
            let quick = self.quick.borrow().is_quick(export, p.procedure());
            if !quick {
                self.hand_off_rest();
            }
            if self.outbox.borrow().due_before(quick, arrived) {
                self.send_held();
            }
        }
        out.resize(HEADER_LEN, 0);
        let endpoint = &self.shared.endpoint;
        self.calls.add_one();
        endpoint.run_started(binding);
        let started = &self.lane().started;
        started.store(started.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
        let running = &self.shared.udp_running[self.index].0;
        running.store(self.lane + 1, Ordering::Release);
        let arrival = Arrival::of(binding, "udp", p.flags() & flags::CONTEXT != 0, Some(arrived), None);
        let limit = self.shared.config.timing.max_message;
        let procedure = p.procedure();
        // The result's buffer, where its bytes start in it, and the large buffer left over.
        let (status, mut result, body, spare) = match args {
            Args::Packet(bytes) => {
                let status = run_procedure(
                    &self.shared,
                    &binding.export,
                    procedure,
                    bytes,
                    arrival,
                    &mut out,
                    HEADER_LEN,
                    limit,
                );
                (status, out, HEADER_LEN, None)
            }
            Args::Message(mut message) if in_place => {
                match run_in_place(
                    &self.shared,
                    &binding.export,
                    procedure,
                    &mut message,
                    0,
                    arrival,
                    &mut out,
                    HEADER_LEN,
                ) {
                    Ok(body) if message.len().saturating_sub(body) > binding.frag_payload() => {
                        self.shared.stats.in_place.fetch_add(1, Ordering::Relaxed);
                        (Status::Ok, message, body, None)
                    }
                    Ok(body) => {
                        // A small result: sent from the slot's own buffer, behind its header.
                        tiercel_proto::copy::extend(&mut out, message.get(body..).unwrap_or_default());
                        (Status::Ok, out, HEADER_LEN, Some(message))
                    }
                    Err(status) => (status, out, HEADER_LEN, Some(message)),
                }
            }
            Args::Message(message) => {
                let status = run_procedure(
                    &self.shared,
                    &binding.export,
                    procedure,
                    &message,
                    arrival,
                    &mut out,
                    HEADER_LEN,
                    limit,
                );
                (status, out, HEADER_LEN, Some(message))
            }
        };
        endpoint.run_finished(binding);
        running.store(0, Ordering::Release);
        if batching {
            self.quick.borrow_mut().observe(export, p.procedure(), arrived.elapsed());
        }
        if large
            && body == HEADER_LEN
            && result.len() <= binding.max_datagram
            && result.capacity() > binding.max_datagram
        {
            // A small result in the large spare: the slot keeps it in a small buffer instead.
            let mut spares = self.spares.borrow_mut();
            let mut small = std::mem::take(&mut spares.result);
            small.clear();
            tiercel_proto::copy::extend(&mut small, &result);
            spares.result = std::mem::replace(&mut result, small);
        }
        let Some(mut cell) = binding.slot(p.slot()) else { return spare };
        mark(Point::ResultReady);
        cell.complete_in_place(binding, p, status, result, body, &self.shared.config.timing);
        self.flush(binding, &mut cell);
        mark(Point::ResultSent);
        spare
    }

    /// Keeps a large buffer for the next large call's arguments, or failing that its result: the
    /// larger of the two places that the buffer is larger than.
    pub(super) fn keep_spare(&self, buf: Vec<u8>) {
        let mut spares = self.spares.borrow_mut();
        if buf.capacity() > spares.message.capacity() {
            let displaced = std::mem::replace(&mut spares.message, buf);
            if displaced.capacity() > spares.result.capacity() {
                spares.result = displaced;
            }
        } else if buf.capacity() > spares.result.capacity() {
            spares.result = buf;
        }
    }

    /// Starts a call of an async procedure on the server's runtime; its result is sent from there
    /// when it ends. Meanwhile the slot runs it, as any long call (probes are answered, duplicates
    /// dropped). A call refused at once (its deadline passed, too many in flight, a bad context)
    /// is answered now.
    #[cfg(feature = "async")]
    pub(super) fn execute_async(
        &self,
        binding: &Arc<EndpointBinding>,
        p: &Packet<&[u8]>,
        args: &[u8],
        arrived: Instant,
    ) {
        // The call's header alone, to answer it later.
        let header = Header { payload_len: 0, message_len: 0, frag_index: 0, frag_count: 1, ..p.header() }.to_bytes();
        let (shared, b, lane) = (self.shared.clone(), binding.clone(), self.lane);
        let finish = move |status: Status, results: Vec<u8>| {
            let p = Packet::new_unchecked(&header[..]);
            let Some(mut cell) = b.slot(p.slot()) else { return };
            let mut out = cell.take_result(&b);
            out.resize(HEADER_LEN, 0);
            tiercel_proto::copy::extend(&mut out, &results);
            cell.complete(&b, &p, status, out, &shared.config.timing);
            super::sending::flush(&shared, lane, &b, &mut cell, None);
        };
        let arrival = Arrival::of(binding, "udp", p.flags() & flags::CONTEXT != 0, Some(arrived), None);
        let mut message = Vec::new();
        let key = (binding.id, p.slot(), p.seq());
        let limit = self.shared.config.timing.max_message;
        let started = super::super::dispatch::start_async(
            &self.shared,
            binding.budget(),
            &binding.export,
            p.procedure(),
            args,
            arrival,
            &mut message,
            limit,
            key,
            finish,
        );
        if let Some(Err(status)) = started {
            let Some(mut cell) = binding.slot(p.slot()) else { return };
            if status == Status::Busy {
                // No room for it now: refused as any busy call, nothing recorded, so that the
                // client's retry after backing off is a new call.
                cell.proto.withdraw(p.seq());
                let peer = cell.peer;
                drop(cell);
                if let Some(peer) = peer {
                    let seal = self.shared.session_of(binding);
                    self.send_reject(self.shared.endpoint.reject(p, Status::Busy), &[], peer, seal.as_deref());
                }
                return;
            }
            let mut out = cell.take_result(binding);
            out.resize(HEADER_LEN, 0);
            tiercel_proto::copy::extend(&mut out, &message);
            cell.complete(binding, p, status, out, &self.shared.config.timing);
            self.flush(binding, &mut cell);
        }
    }
}
