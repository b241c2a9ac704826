//! Multi-packet messages: fragment arithmetic, the windowed blast sender, and reassembly with hard limits.
//!
//! A message larger than one packet is cut into fragments of the binding's fragment size (every fragment
//! but the last is full). The sender blasts a window of fragments; the receiver acknowledges with a
//! cumulative prefix plus a 64-bit mask of what it holds beyond the prefix, so the sender retransmits only
//! what is missing (selective retransmission). A window may reach past what the mask covers (up to
//! [`MAX_WINDOW`]): the mask shows the holes nearest the prefix, which are the ones to fill first.

use core::ops::Range;

/// Largest window of fragments in flight beyond the acknowledged prefix, and so how far past its
/// prefix a receiver accepts a fragment. An acknowledgement's mask describes the first
/// [`NARROW_WINDOW`] of them; those further on are acknowledged when the prefix reaches them.
pub const MAX_WINDOW: u16 = 256;
/// The fragments past the prefix an acknowledgement's mask covers, and the largest window a peer
/// accepts that does not speak [`crate::bind::wire::features::WIDE_WINDOW`].
pub const NARROW_WINDOW: u16 = 64;
/// Encoded size of an [`AckInfo`] payload.
pub const ACK_PAYLOAD_LEN: usize = 12;

/// Number of fragments a message of `message_len` bytes needs, or `None` if more than `u16::MAX`.
pub fn fragment_count(message_len: usize, frag_payload: usize) -> Option<u16> {
    let n = message_len.div_ceil(frag_payload.max(1)).max(1);
    u16::try_from(n).ok()
}

/// Byte range of fragment `index` within a message.
pub fn fragment_range(index: u16, message_len: usize, frag_payload: usize) -> Range<usize> {
    let start = (index as usize * frag_payload).min(message_len);
    start..(start + frag_payload).min(message_len)
}

/// What a receiver holds: fragments `0..prefix`, and fragment `prefix + 1 + i` for each bit `i` of `mask`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AckInfo {
    /// Every fragment below this index has arrived.
    pub prefix: u16,
    /// Bit `i` set: fragment `prefix + 1 + i` has arrived.
    pub mask: u64,
}

impl AckInfo {
    /// Encodes into an ack payload.
    pub fn to_bytes(self) -> [u8; ACK_PAYLOAD_LEN] {
        let mut b = [0u8; ACK_PAYLOAD_LEN];
        b[0..4].copy_from_slice(&u32::from(self.prefix).to_le_bytes());
        b[4..12].copy_from_slice(&self.mask.to_le_bytes());
        b
    }
    /// Decodes an ack payload.
    pub fn parse(b: &[u8]) -> Option<AckInfo> {
        if b.len() != ACK_PAYLOAD_LEN {
            return None;
        }
        let prefix = u32::from_le_bytes(b[0..4].try_into().ok()?);
        let mask = u64::from_le_bytes(b[4..12].try_into().ok()?);
        Some(AckInfo { prefix: u16::try_from(prefix).ok()?, mask })
    }
    /// Whether fragment `index` is covered.
    pub fn has(&self, index: u16) -> bool {
        if index < self.prefix {
            return true;
        }
        let off = index - self.prefix;
        (1..=64).contains(&off) && self.mask & (1u64 << (off - 1)) != 0
    }
}

/// The sending side of a multi-packet message: which fragments to send next.
#[derive(Debug, Clone)]
pub struct Blast {
    count: u16,
    window: u16,
    acked: AckInfo,
    sent_upto: u16,
    /// Fragments below this were already retransmitted as lost ([`Blast::take_lost`]).
    fast_upto: u16,
    /// The first fragment sent after the last such retransmission: once one at or past it has
    /// arrived, the retransmitted fragments still missing were lost again.
    fast_mark: Option<u16>,
}

impl Blast {
    /// A blast of `count` fragments with at most `window` beyond the acknowledged prefix in flight.
    pub fn new(count: u16, window: u16) -> Blast {
        Blast {
            count,
            window: window.clamp(1, MAX_WINDOW),
            acked: AckInfo::default(),
            sent_upto: 0,
            fast_upto: 0,
            fast_mark: None,
        }
    }
    /// Number of fragments.
    pub fn count(&self) -> u16 {
        self.count
    }
    /// Whether the receiver has acknowledged every fragment.
    pub fn is_acked(&self) -> bool {
        self.acked.prefix >= self.count
    }
    /// Lets up to `window` fragments be in flight from now on (never fewer than now).
    pub fn widen(&mut self, window: u16) {
        self.window = self.window.max(window.clamp(1, MAX_WINDOW));
    }
    /// Fragments never sent that the window now allows; marks them sent.
    pub fn take_new(&mut self) -> Range<u16> {
        let limit = self.count.min(self.acked.prefix.saturating_add(self.window));
        let r = self.sent_upto..limit.max(self.sent_upto);
        self.sent_upto = r.end;
        r
    }
    /// One fragment to send again when the receiver asks without saying what it holds (a duplicate
    /// request, a probe): the first unacknowledged one sent, else the next new one the window allows.
    /// Its acknowledgement then says what else is missing.
    pub fn take_one(&mut self) -> Option<u16> {
        if let Some(i) = self.unacked().next() {
            return Some(i);
        }
        let limit = self.count.min(self.acked.prefix.saturating_add(self.window));
        (self.sent_upto < limit).then(|| {
            self.sent_upto += 1;
            self.sent_upto - 1
        })
    }
    /// Records an acknowledgement; stale ones (smaller prefix) are ignored. Returns whether it advanced.
    pub fn on_ack(&mut self, ack: AckInfo) -> bool {
        let prefix = ack.prefix.min(self.count);
        if prefix < self.acked.prefix {
            return false;
        }
        let advanced = prefix > self.acked.prefix || ack.mask & !self.acked.mask != 0;
        self.acked = AckInfo { prefix, mask: ack.mask };
        self.sent_upto = self.sent_upto.max(prefix);
        advanced
    }
    /// Fragments already sent but not acknowledged, in order: what a retransmission resends.
    pub fn unacked(&self) -> impl Iterator<Item = u16> + '_ {
        (self.acked.prefix..self.sent_upto).filter(move |&i| !self.acked.has(i))
    }

    /// Fragments the last acknowledgement shows lost, to send again now rather than at the
    /// retransmission timeout (selective fast retransmission): missing, yet a later fragment has
    /// arrived, so they are not merely still on their way. Each is returned once; if it is lost
    /// again, the timeout resends it.
    pub fn take_lost(&mut self) -> impl Iterator<Item = u16> {
        let acked = self.acked;
        // The highest fragment held beyond the prefix: bit `b` of the mask is fragment prefix + 1 + b.
        let beyond = match acked.mask {
            0 => acked.prefix,
            m => acked.prefix.saturating_add(64 - m.leading_zeros() as u16),
        };
        if self.fast_mark.is_some_and(|mark| beyond >= mark) {
            // A fragment sent after the last retransmission has arrived, and one retransmitted is
            // still missing: lost again, so it may go again.
            self.fast_upto = acked.prefix;
            self.fast_mark = None;
        }
        let from = self.fast_upto.max(acked.prefix);
        let to = beyond.min(self.sent_upto);
        self.fast_upto = self.fast_upto.max(to);
        if (from..to).any(|i| !acked.has(i)) {
            self.fast_mark = Some(self.sent_upto);
        }
        (from..to.max(from)).filter(move |&i| !acked.has(i))
    }
}

/// Why a fragment was refused by [`Reassembly::insert`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReassemblyError {
    /// The message is larger than the configured limit.
    #[error("message of {len} bytes exceeds the limit of {limit}")]
    TooLarge {
        /// Claimed message length.
        len: u32,
        /// The limit.
        limit: usize,
    },
    /// Fragment count, message length or fragment length disagree with each other or with earlier fragments.
    #[error("fragment does not fit the message")]
    Inconsistent,
    /// A fragment further past the received prefix than any sender's window reaches.
    #[error("fragment beyond the window")]
    OutOfWindow,
    /// The buffer for the message could not be reserved.
    #[error("no memory for the message")]
    NoMemory,
}

/// Result of inserting a fragment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inserted {
    /// A fragment not seen before; the message is still incomplete.
    New,
    /// A fragment already held.
    Duplicate,
    /// The last missing fragment: the message is whole.
    Complete,
}

/// Reassembles one message into a single contiguous buffer.
///
/// The buffer's room for the whole message is reserved at the start (address space, which the
/// kernel backs with memory only when written), but the buffer is written, and grows, only up to the
/// last fragment received: a sender that declares a large message holds memory for the bytes it has
/// sent, not for the bytes it claims. A fragment is accepted only within [`MAX_WINDOW`] fragments of
/// the received prefix (no sender's window reaches further), so the buffer holds at most that many
/// fragments beyond what has arrived.
#[derive(Debug)]
pub struct Reassembly {
    /// The message's bytes. A reused buffer keeps the bytes of the message before (within this one's
    /// length), so that they need not be zeroed again: they are overwritten fragment by fragment and
    /// the buffer is handed out only once every fragment has come.
    buf: Vec<u8>,
    /// One past the furthest byte made ready for a fragment: what the reassembly holds for the peer.
    written: usize,
    len: usize,
    have: Vec<u64>,
    count: u16,
    received: u16,
    /// Every fragment below this index has arrived.
    prefix: u16,
    /// One past the highest fragment index that has arrived: the fragment a sender sends next.
    frontier: u16,
    frag_payload: usize,
    since_ack: u16,
    /// The prefix at which a hole was last reported: one is reported at once, then left to the
    /// acknowledgements' usual pace until the prefix moves.
    hole_reported_at: Option<u16>,
    /// Something the sender should hear now: a hole appeared, or a retransmission filled one.
    urgent: bool,
}

impl Reassembly {
    /// Starts reassembling a message described by a fragment header. Checks the length against `limit`
    /// and against the fragment count before allocating anything.
    pub fn new(message_len: u32, count: u16, frag_payload: usize, limit: usize) -> Result<Reassembly, ReassemblyError> {
        Reassembly::reusing(Vec::new(), message_len, count, frag_payload, limit)
    }

    /// As [`Reassembly::new`], in `buf` (a buffer of an earlier message, so that a stream of large
    /// messages does not allocate, fault in and zero a fresh one each time).
    pub fn reusing(
        mut buf: Vec<u8>,
        message_len: u32,
        count: u16,
        frag_payload: usize,
        limit: usize,
    ) -> Result<Reassembly, ReassemblyError> {
        let len = message_len as usize;
        if len > limit {
            return Err(ReassemblyError::TooLarge { len: message_len, limit });
        }
        if frag_payload == 0 || fragment_count(len, frag_payload) != Some(count) {
            return Err(ReassemblyError::Inconsistent);
        }
        if buf.capacity() < len {
            // Growing: nothing of the old bytes is worth copying.
            buf.clear();
        }
        buf.truncate(len);
        buf.try_reserve_exact(len - buf.len()).map_err(|_| ReassemblyError::NoMemory)?;
        Ok(Reassembly {
            buf,
            written: 0,
            len,
            have: vec![0; (count as usize).div_ceil(64)],
            count,
            received: 0,
            prefix: 0,
            frontier: 0,
            frag_payload,
            since_ack: 0,
            hole_reported_at: None,
            urgent: false,
        })
    }

    /// Bytes of the message.
    pub fn message_len(&self) -> usize {
        self.len
    }

    /// Bytes the reassembly holds for its peer now (up to the furthest fragment received, or made
    /// ready to receive in place): what it is charged in memory.
    pub fn held(&self) -> usize {
        self.written
    }

    /// Makes the buffer reach `end` (zeroing only bytes never written before) and counts them held.
    fn reach(&mut self, end: usize) {
        if end > self.buf.len() {
            self.buf.resize(end, 0);
        }
        self.written = self.written.max(end);
    }

    fn has(&self, i: u16) -> bool {
        self.have[i as usize / 64] & (1 << (i % 64)) != 0
    }

    /// Copies one fragment into place, growing the buffer to reach it (the bytes of fragments not yet
    /// arrived in between are zeroed, and overwritten when they come; a fragment arriving in order is
    /// written once).
    pub fn insert(
        &mut self,
        index: u16,
        count: u16,
        message_len: u32,
        payload: &[u8],
    ) -> Result<Inserted, ReassemblyError> {
        self.insert_within(index, count, message_len, payload, |_| true)
    }

    /// As [`Reassembly::insert`], asking `reserve` for the bytes the buffer must grow by before it
    /// grows ([`ReassemblyError::NoMemory`] if refused; nothing changes then). `reserve` is asked
    /// only for a fragment that is consistent, within the window and new, so what it granted is
    /// always held ([`Reassembly::held`]).
    pub fn insert_within(
        &mut self,
        index: u16,
        count: u16,
        message_len: u32,
        payload: &[u8],
        reserve: impl FnOnce(usize) -> bool,
    ) -> Result<Inserted, ReassemblyError> {
        let range = self.accept(index, count, message_len, payload.len())?;
        if self.has(index) {
            return Ok(Inserted::Duplicate);
        }
        if range.end > self.written && !reserve(range.end - self.written) {
            return Err(ReassemblyError::NoMemory);
        }
        if self.buf.len() < range.end {
            // Within the capacity reserved at the start: no reallocation, no copy. Only bytes never
            // written before (of fragments not yet arrived in between) are zeroed, and a fragment
            // arriving in order is written once.
            self.buf.truncate(range.start);
            self.buf.resize(range.start, 0);
            crate::copy::extend(&mut self.buf, payload);
        } else {
            crate::copy::copy(&mut self.buf[range.clone()], payload);
        }
        self.written = self.written.max(range.end);
        Ok(self.mark(index))
    }

    /// Where the fragments a sender sends next (from the one after the highest that has arrived,
    /// up to `max` in a row, as many as the message and the window hold) go in the buffer, grown
    /// to hold them (zeroed only where never written), for a receiver that reads their payloads
    /// straight into place: the first's index and the bytes of them all, in order (each
    /// [`Reassembly::frag_payload`] long but the message's last). Then
    /// [`Reassembly::insert_landed`] for each datagram that was the fragment expected there.
    /// `reserve` is asked for the bytes the buffer grows by, which are then held
    /// ([`Reassembly::held`]). `None` when every fragment up to the last has come (only resent
    /// ones are awaited), the next is beyond the window, or `reserve` refuses.
    pub fn landing_run(&mut self, max: u16, reserve: impl FnOnce(usize) -> bool) -> Option<(u16, &mut [u8])> {
        self.landing_run_behind(max, 0, reserve)
    }

    /// [`Reassembly::landing_run`], the place given with the `behind` bytes before it: the end of
    /// the fragments already in, lent to a receiver that reads something there first (a sealed
    /// packet's header, opened in place before its payload) and puts them back as they were before
    /// it says anything landed. `None` also when fewer than `behind` bytes lie before the place.
    pub fn landing_run_behind(
        &mut self,
        max: u16,
        behind: usize,
        reserve: impl FnOnce(usize) -> bool,
    ) -> Option<(u16, &mut [u8])> {
        let index = self.frontier;
        let window_end = u32::from(self.prefix) + u32::from(MAX_WINDOW) + 1;
        let end = (u32::from(index) + u32::from(max.max(1))).min(u32::from(self.count)).min(window_end);
        if u32::from(index) >= end {
            return None;
        }
        let start = fragment_range(index, self.len, self.frag_payload).start;
        let stop = fragment_range((end - 1) as u16, self.len, self.frag_payload).end;
        if stop > self.written && !reserve(stop - self.written) {
            return None;
        }
        if start < behind {
            return None;
        }
        self.reach(stop);
        Some((index, &mut self.buf[start - behind..stop]))
    }

    /// Records that fragment `index`, of `payload_len` bytes, was received into the place
    /// [`Reassembly::landing_run`] gave, checking it as [`Reassembly::insert`] does.
    pub fn insert_landed(
        &mut self,
        index: u16,
        count: u16,
        message_len: u32,
        payload_len: usize,
    ) -> Result<Inserted, ReassemblyError> {
        let range = self.accept(index, count, message_len, payload_len)?;
        if index != self.frontier || range.end > self.buf.len() {
            return Err(ReassemblyError::Inconsistent);
        }
        Ok(self.mark(index))
    }

    /// Checks a fragment against the message and the window: its place in the buffer.
    fn accept(
        &self,
        index: u16,
        count: u16,
        message_len: u32,
        payload_len: usize,
    ) -> Result<Range<usize>, ReassemblyError> {
        if count != self.count || message_len as usize != self.len || index >= count {
            return Err(ReassemblyError::Inconsistent);
        }
        let range = fragment_range(index, self.len, self.frag_payload);
        if payload_len != range.len() {
            return Err(ReassemblyError::Inconsistent);
        }
        if u32::from(index) > u32::from(self.prefix) + u32::from(MAX_WINDOW) {
            return Err(ReassemblyError::OutOfWindow);
        }
        Ok(range)
    }

    /// Counts fragment `index` (new, and written in place) as arrived.
    fn mark(&mut self, index: u16) -> Inserted {
        self.have[index as usize / 64] |= 1 << (index % 64);
        self.received += 1;
        self.since_ack += 1;
        self.frontier = self.frontier.max(index + 1);
        let before = self.prefix;
        while self.prefix < self.count && self.has(self.prefix) {
            self.prefix += 1;
        }
        if index > before && self.hole_reported_at != Some(before) {
            // Arrived past a missing fragment: tell the sender now, so that it resends the hole.
            self.hole_reported_at = Some(before);
            self.urgent = true;
        } else if self.prefix > before + 1 {
            // A resent fragment filled a hole: the sender's window may move on.
            self.urgent = true;
        }
        if self.received == self.count {
            Inserted::Complete
        } else {
            Inserted::New
        }
    }

    /// Whether every fragment has arrived.
    pub fn is_complete(&self) -> bool {
        self.received == self.count
    }

    /// Payload bytes of each fragment but the last.
    pub fn frag_payload(&self) -> usize {
        self.frag_payload
    }

    /// Fragments received since the last call to [`Reassembly::take_ack`].
    pub fn since_ack(&self) -> u16 {
        self.since_ack
    }

    /// Whether to acknowledge now, for a sender with `window` fragments in flight: every half
    /// window, and at once when a fragment arrives past a hole (so that the sender resends it
    /// without waiting for its timer) or a resent one fills a hole.
    pub fn wants_ack(&self, window: u16) -> bool {
        self.urgent || self.since_ack >= (window / 2).max(1)
    }

    /// What has arrived, as an acknowledgement; resets the count behind [`Reassembly::since_ack`].
    pub fn take_ack(&mut self) -> AckInfo {
        self.since_ack = 0;
        self.urgent = false;
        self.ack()
    }

    /// What has arrived, as an acknowledgement.
    pub fn ack(&self) -> AckInfo {
        let prefix = self.prefix;
        let mut mask = 0u64;
        for i in 0..64u16 {
            let idx = prefix as u32 + 1 + i as u32;
            if idx >= self.count as u32 {
                break;
            }
            if self.has(idx as u16) {
                mask |= 1 << i;
            }
        }
        AckInfo { prefix, mask }
    }

    /// The bytes received so far, up to the furthest fragment (the whole message once complete;
    /// before, the places of fragments not yet arrived may hold anything).
    pub fn message(&self) -> &[u8] {
        &self.buf[..self.written]
    }

    /// Gives up the buffer.
    pub fn into_message(self) -> Vec<u8> {
        self.buf
    }
}

#[cfg(test)]
mod tests;
