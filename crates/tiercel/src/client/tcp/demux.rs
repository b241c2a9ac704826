//! The receiving side of a connection: the frames read by whichever caller reads, each delivered
//! to the slot it answers.

use super::*;

/// One client slot's mailbox.
#[derive(Default)]
pub(super) struct Mail {
    /// The call awaited, if any.
    pub(super) awaiting: Option<u32>,
    /// When it was sent, in the connection's order of calls ([`Demux::sent`]).
    pub(super) order: u64,
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
    /// The reader waits in its receive, the demux let go ([`Link::pump_waiting`]): nobody else
    /// reads until it is back, so that the connection's bytes come into the frames in order.
    pub(super) away: bool,
    /// The slot of the caller woken to read it next, if one was: until it comes (or gives up), no
    /// other caller takes the reading.
    pub(super) heir: Option<u32>,
    pub(super) frames: Deframer,
    /// A secure binding's sealed records, opened on their way into `frames`.
    pub(super) records: Option<framed::Records>,
    pub(super) mail: Vec<Mail>,
    /// Calls sent (or being sent) and not answered.
    pub(super) expecting: usize,
    /// Calls sent on the connection so far: the order of the last.
    pub(super) sent: u64,
    /// When the server was last heard from (or, with no call waiting, the last call began).
    pub(super) heard: Instant,
    /// Why the connection is over.
    pub(super) broken: Option<String>,
    /// When the connection was last read.
    pub(super) pumped: Instant,
    /// Callers to wake once the lock is let go ([`Locked`]): woken under it, a caller that ran at
    /// once would find the lock held and sleep again on it.
    pub(super) wakes: [Option<Wake>; DEFERRED],
}

/// Wakes a demux holds for when its lock is let go; any more are done at once.
const DEFERRED: usize = 8;

/// The demux, locked; letting go of it wakes the callers it was told to ([`Demux::defer`]).
pub(super) struct Locked<'l>(Option<MutexGuard<'l, Demux>>);

impl<'l> Locked<'l> {
    pub(super) fn new(guard: MutexGuard<'l, Demux>) -> Self {
        Locked(Some(guard))
    }
}

impl std::ops::Deref for Locked<'_> {
    type Target = Demux;
    fn deref(&self) -> &Demux {
        match &self.0 {
            Some(guard) => guard,
            None => unreachable!("the demux is held until its lock is dropped"),
        }
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Demux {
        match &mut self.0 {
            Some(guard) => guard,
            None => unreachable!("the demux is held until its lock is dropped"),
        }
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // `defer` fills the room from the front: with the first empty, there is nothing to wake
        // (so it is after most looks), and the room is not copied out.
        let wakes =
            self.0.as_mut().filter(|demux| demux.wakes[0].is_some()).map(|demux| std::mem::take(&mut demux.wakes));
        drop(self.0.take());
        for w in wakes.into_iter().flatten().flatten() {
            w.wake();
        }
    }
}

impl Demux {
    /// Wakes `w` once the lock is let go.
    fn defer(&mut self, w: Wake) {
        match self.wakes.iter_mut().find(|d| d.is_none()) {
            Some(room) => *room = Some(w),
            None => w.wake(),
        }
    }

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

    /// Hands over the reading to another waiting caller, if one waits: the one whose call went out
    /// first, whose result the server (which answers a connection's calls in turn, unless some
    /// run long) most likely sends next. So the caller the kernel wakes when that result comes is
    /// more often the one it is for than one that must then wake it. The caller woken is the
    /// reading's heir: no other blocking caller takes the reading before it comes.
    pub(super) fn hand_over(&mut self) {
        self.reading = false;
        let next = self
            .mail
            .iter_mut()
            .enumerate()
            .filter(|(_, m)| m.awaiting.is_some() && m.arrived.is_none() && m.wake.is_some())
            .min_by_key(|(_, m)| m.order);
        self.heir = None;
        if let Some((slot, m)) = next {
            self.heir = Some(slot as u32);
            if let Some(w) = m.wake.take() {
                self.defer(w);
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
                            tiercel_proto::copy::extend(&mut result, &self.frames.frame()[HEADER_LEN..]);
                            (result, 0)
                        }
                    };
                    m.arrived = Some((kind, status));
                    if let Some(w) = m.wake.take() {
                        self.defer(w);
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
