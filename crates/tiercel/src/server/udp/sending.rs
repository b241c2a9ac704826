//! Sending: results (held for a batch, or in segmented runs), answers to control packets, rejects
//! and bind replies.

use super::*;

impl UdpWorker {
    /// Sends the result fragments the slot has queued, counting those sent before as resent; in a
    /// batch, small ones are held to go out with the batch's other results.
    pub(super) fn flush(&self, binding: &EndpointBinding, cell: &mut UdpSlot) {
        flush(&self.shared, self.lane, binding, cell, Some(&mut self.outbox.borrow_mut()));
    }

    /// Sends the endpoint's reply (an `Ack`, a `ProbeReply`) to the slot's peer.
    pub(super) fn send_reply(&self, reply: &tiercel_proto::endpoint::Reply, to: SocketAddr, seal: Option<&Session>) {
        let h = reply.header;
        let _ = transmit::send_via(
            self.shared.via(&to),
            &self.lane().socket,
            Some(&to),
            &[IoSlice::new(&h.to_bytes()), IoSlice::new(reply.payload())],
            h.flags & flags::CHECKSUM != 0,
            seal,
        );
    }

    /// Sends a `Reject` header `h` and its payload (empty, or an address challenge) to `to`,
    /// sealed with `seal` when it answers a sealed packet.
    pub(super) fn send_reject(&self, h: Header, payload: &[u8], to: SocketAddr, seal: Option<&Session>) {
        self.shared.stats.rejected.fetch_add(1, Ordering::Relaxed);
        let checksum = h.flags & flags::CHECKSUM != 0;
        let header = h.to_bytes();
        let io = [IoSlice::new(&header), IoSlice::new(payload)];
        let _ = transmit::send_via(self.shared.via(&to), &self.lane().socket, Some(&to), &io, checksum, seal);
    }

    /// Answers a bind request through the server's bind machine: a binding from the table, or the
    /// machine's answer (a challenge or a refusal, never longer than the request).
    pub(super) fn on_bind(&self, p: &Packet<&[u8]>, from: SocketAddr) {
        let stats = &self.shared.stats;
        let machine = self.shared.bind_machine(super::super::Door::Udp);
        let received = HEADER_LEN + p.payload_len() as usize;
        let admission = match machine.on_request(p, &crate::auth::peer_bytes(from), received) {
            BindDecision::Malformed => {
                stats.malformed.fetch_add(1, Ordering::Relaxed);
                return;
            }
            BindDecision::Answer { packet, refused } => {
                self.shared.count_refusal(refused);
                return self.send_packet(from, &packet, checksummed(p));
            }
            BindDecision::Admit(a) if self.shared.refusing_bindings() => {
                stats.rejected.fetch_add(1, Ordering::Relaxed);
                return self.send_packet(from, &a.busy(&machine), checksummed(p));
            }
            BindDecision::Admit(a) => a,
        };
        if let Some((rendezvous, _)) = self.shared.rendezvous.as_ref().filter(|_| admission.request.rendezvous) {
            // A client on this host asks where to bind through shared memory. Only a source on this
            // host is told: loopback, or the very address the server is bound to.
            if self.on_this_host(from) {
                return self.send_packet(from, &admission.rendezvous(&machine, *rendezvous), checksummed(p));
            }
        }
        if machine.key_required {
            // Asked for a rendezvous it is not told: no plain binding instead.
            self.shared.count_refusal(tiercel_proto::bind::Refused::KeyRequired);
            return self.send_packet(from, &admission.key_required(&machine), checksummed(p));
        }
        let config = &self.shared.config;
        let granted = crate::random::bytes().ok().map(u128::from_le_bytes).and_then(|token| {
            let export = self.shared.exports[admission.export].clone();
            // Its memory lies within its address's part of UDP's share. The grant, with the token
            // that calls must carry, goes to that address: a spoofed request charges nobody.
            self.shared.endpoint.grant_from(
                from,
                tiercel_proto::endpoint::Caller::Address(from),
                admission.request.nonce,
                export,
                token,
                Terms { max_datagram: admission.max_datagram as usize, features: admission.features() },
                Instant::now(),
            )
        });
        let Some((binding, new)) = granted else {
            stats.rejected.fetch_add(1, Ordering::Relaxed);
            return self.send_packet(from, &admission.busy(&machine), checksummed(p));
        };
        if new {
            stats.bindings.fetch_add(1, Ordering::Relaxed);
        }
        let reply = admission.grant(&machine, binding.id, binding.token, config.slots_per_binding, 0);
        self.send_packet(from, &reply, checksummed(p));
    }

    /// Whether `from` is on this host: loopback, or the very address the server is bound to
    /// (who may be told the shared-memory rendezvous).
    pub(super) fn on_this_host(&self, from: SocketAddr) -> bool {
        let ip = from.ip().to_canonical();
        ip.is_loopback() || self.lane().socket.local_addr().is_ok_and(|a| a.ip().to_canonical() == ip)
    }

    pub(super) fn send_packet(&self, to: SocketAddr, packet: &[u8], checksum: bool) {
        // A failed send is a lost packet: the client retransmits its request.
        let io = [IoSlice::new(packet)];
        let _ = transmit::send_via(self.shared.via(&to), &self.lane().socket, Some(&to), &io, checksum, None);
    }
}

/// Sends the result fragments the slot has queued, counting those sent before as resent. Fragments
/// of a multi-packet result go out in runs, one segmented send each (UDP GSO), when the kernel
/// allows it: every fragment but the message's last is full, so a run is cut where it ends. A small
/// fragment is held in `outbox` instead, when it will take it (a batch is being handled).
/// They go out on socket `lane`: any of the server's sockets sends from its address.
pub(super) fn flush(
    shared: &Shared,
    lane: usize,
    binding: &EndpointBinding,
    cell: &mut UdpSlot,
    mut outbox: Option<&mut Outbox>,
) {
    let socket = &shared.lanes[lane].socket;
    let Some(peer) = cell.peer else { return };
    let again = cell.proto.take_resent();
    if again > 0 {
        shared.stats.resent.fetch_add(u64::from(again), Ordering::Relaxed);
    }
    let checksum = cell.checksummed();
    let full = binding.frag_payload();
    let segment = HEADER_LEN + full + if checksum { CHECKSUM_LEN } else { 0 };
    // A secure binding's fragments are sealed one by one, each sent alone; so are those that go
    // through AF_XDP.
    let seal = shared.session_of(binding);
    let via = shared.via(&peer);
    if seal.is_some() || via.is_some() || outbox.as_deref().is_some_and(|o| !o.is_open()) {
        // (Nor is a result offered to an outbox that holds none: no batch is being handled.)
        outbox = None;
    }
    // (A result of one datagram has no run to cut: nor is the run's length worked out, a division.)
    let segmenting = !cell.is_whole() && seal.is_none() && via.is_none() && shared.segmenting.load(Ordering::Relaxed);
    let run_length = if segmenting { transmit::run_length(segment) } else { 0 };
    let mut run = transmit::RunQueue::new();
    // Through AF_XDP, the fragments of a result of several go to the kernel together (a result of
    // one goes at once, without a batch's second look at the station).
    let mut batch = None;
    while let Some(index) = cell.poll_fragment() {
        if run_length >= 2 {
            if let Fragment::Parts(_, body) = cell.fragment(binding, index) {
                let short = body.len() < full;
                if run.push(index) == run_length || short {
                    send_run(shared, socket, binding, cell, peer, run.take(), segment);
                }
                continue;
            }
        }
        let fragment = cell.fragment(binding, index);
        if batch.is_none() && matches!(fragment, Fragment::Parts(..)) {
            batch = via.map(|v| v.station.batch());
        }
        if let Some(outbox) = outbox.as_deref_mut() {
            let held = match &fragment {
                Fragment::Whole(datagram) => outbox.hold(peer, &[datagram], checksum),
                Fragment::Parts(header, body) => outbox.hold(peer, &[header, body], checksum),
            };
            if held {
                continue;
            }
        }
        // A failed send is a lost packet: the client's timers ask again.
        let _ = send_fragment(via, socket, fragment, peer, checksum, seal.as_deref());
    }
    if !run.is_empty() {
        send_run(shared, socket, binding, cell, peer, run.take(), segment);
    }
}

pub(super) fn send_fragment(
    via: Option<crate::xdp::Via<'_>>,
    socket: &UdpSocket,
    fragment: Fragment<'_>,
    peer: SocketAddr,
    checksum: bool,
    seal: Option<&Session>,
) -> std::io::Result<usize> {
    match fragment {
        Fragment::Whole(datagram) => {
            transmit::send_via(via, socket, Some(&peer), &[IoSlice::new(datagram)], checksum, seal)
        }
        Fragment::Parts(header, body) => {
            transmit::send_via(via, socket, Some(&peer), &[IoSlice::new(&header), IoSlice::new(body)], checksum, seal)
        }
    }
}

/// Sends result fragments `run` with one segmented send, or one by one (from now on, server-wide)
/// if the kernel refuses segmentation.
pub(super) fn send_run(
    shared: &Shared,
    socket: &UdpSocket,
    binding: &EndpointBinding,
    cell: &UdpSlot,
    peer: SocketAddr,
    run: &[u16],
    segment: usize,
) {
    let checksum = cell.checksummed();
    let mut headers = [[0u8; HEADER_LEN]; transmit::MAX_RUN];
    let mut bodies: [&[u8]; transmit::MAX_RUN] = [&[]; transmit::MAX_RUN];
    for ((h, b), &index) in headers.iter_mut().zip(bodies.iter_mut()).zip(run) {
        if let Fragment::Parts(header, body) = cell.fragment(binding, index) {
            (*h, *b) = (header, body);
        }
    }
    let mut parts = [IoSlice::new(&[]); 2 * transmit::MAX_RUN];
    let mut ends = [0usize; transmit::MAX_RUN];
    for (i, (h, b)) in headers.iter().zip(&bodies).take(run.len()).enumerate() {
        parts[2 * i] = IoSlice::new(h);
        parts[2 * i + 1] = IoSlice::new(b);
        ends[i] = 2 * i + 2;
    }
    let k = 2 * run.len();
    if let Err(e) = transmit::send_run(socket, Some(&peer), &parts[..k], &ends[..run.len()], checksum, segment) {
        if tiercel_sys::udp::is_segmentation_refused(&e) {
            shared.segmenting.store(false, Ordering::Relaxed);
            for pair in parts[..k].chunks(2) {
                let _ = transmit::send(socket, Some(&peer), pair, checksum);
            }
        }
    }
}
