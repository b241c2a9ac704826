//! The receiving side of a connection: the frames read by whichever caller reads, each delivered
//! to the slot it answers.

use super::*;

/// One client slot's mailbox.
#[derive(Default)]
pub(super) struct Mail {
    /// The call awaited, if any.
    pub(super) awaiting: Option<u32>,
    /// How to wake its caller when it is not the one reading.
    pub(super) wake: Option<Wake>,
    /// What arrived for it: kind and status; the payload is in `result`, from `result_at` on.
    pub(super) arrived: Option<(Kind, Status)>,
    pub(super) result: Vec<u8>,
    /// Where the payload starts in `result`: 0, or [`FRAME_HEAD`] when `result` is the buffer the
    /// frame was read into.
    pub(super) result_at: usize,
}

/// The receiving side of the connection.
pub(super) struct Demux {
    /// A caller is reading the connection.
    pub(super) reading: bool,
    pub(super) frames: Deframer,
    /// A secure binding's sealed records, opened on their way into `frames`.
    pub(super) records: Option<framed::Records>,
    pub(super) mail: Vec<Mail>,
    /// Calls sent (or being sent) and not answered.
    pub(super) expecting: usize,
    /// When the server was last heard from (or, with no call waiting, the last call began).
    pub(super) heard: Instant,
    /// Why the connection is over.
    pub(super) broken: Option<String>,
    /// When the connection was last read.
    pub(super) pumped: Instant,
}

impl Demux {
    /// Ends the connection for every call: each waiting caller is woken to find out.
    pub(super) fn break_off(&mut self, why: String) {
        if self.broken.is_none() {
            self.broken = Some(why);
        }
        for m in &mut self.mail {
            if let Some(w) = m.wake.take() {
                w.wake();
            }
        }
    }

    /// Hands over the reading to another waiting caller, if one waits.
    pub(super) fn hand_over(&mut self) {
        self.reading = false;
        if let Some(w) = self.mail.iter_mut().find(|m| m.awaiting.is_some() && m.arrived.is_none() && m.wake.is_some())
        {
            if let Some(w) = w.wake.take() {
                w.wake();
            }
        }
    }

    /// Delivers every whole frame buffered to its slot. Err: the server broke the protocol.
    pub(super) fn deliver(&mut self, binding: u32, stale: &std::sync::atomic::AtomicU64) -> Result<(), String> {
        loop {
            match self.frames.next() {
                Err(e) => return Err(format!("the server sent a bad frame: {e}")),
                Ok(Next::Frame(_)) => {}
                Ok(Next::Partial(len)) => {
                    if !self.frames.fits(len) {
                        self.frames.grow_for(len);
                    }
                    return Ok(());
                }
                Ok(Next::Nothing) => return Ok(()),
            }
            let frame = self.frames.frame();
            let p = stream::check_frame(frame).map_err(|e| format!("the server sent a bad frame: {e}"))?;
            let (kind, slot, seq, status) = (p.kind(), p.slot() as usize, p.seq(), p.status());
            let ours = p.binding() == binding || kind == Kind::Reject;
            let large = p.payload().len() > BUFFER;
            let mail = self.mail.get_mut(slot).filter(|m| m.awaiting == Some(seq) && m.arrived.is_none());
            match (kind, mail) {
                // A heartbeat, or a probe's answer: the server lives.
                (Kind::ProbeReply, _) => {}
                (Kind::Result | Kind::Reject, Some(m)) if ours => {
                    // A large result is not copied: the buffer it was read into goes to its caller,
                    // and the connection is read on into the one the caller had (they take turns).
                    let spare = std::mem::take(&mut m.result);
                    let taken = if large { self.frames.take_frame(spare) } else { Err(spare) };
                    (m.result, m.result_at) = match taken {
                        Ok(frame) => (frame, FRAME_HEAD),
                        Err(mut result) => {
                            result.clear();
                            result.extend_from_slice(&self.frames.frame()[HEADER_LEN..]);
                            (result, 0)
                        }
                    };
                    m.arrived = Some((kind, status));
                    if let Some(w) = m.wake.take() {
                        w.wake();
                    }
                }
                (Kind::Result | Kind::Reject, _) => {
                    // The result of a call given up at its deadline.
                    stale.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                _ => return Err(format!("the server sent a {kind:?} frame")),
            }
            self.frames.consume();
        }
    }
}
