//! A binding's connection, shared by its callers: reading it (spinning, then blocking), handing
//! each result to its caller's slot, and landing the bytes of a lent buffer's result in place.

use super::*;

/// A binding's connection, shared by its callers.
pub(crate) struct Link {
    pub(super) stream: TcpStream,
    /// A secure binding's keys: every frame both ways is sealed with them.
    pub(super) seal: Option<Arc<crate::secure::Session>>,
    pub(super) server: SocketAddr,
    /// Held while a frame is written.
    pub(super) writing: Mutex<()>,
    pub(super) demux: Mutex<Demux>,
    /// Silence after which the connection is given up while calls wait.
    pub(super) silence: Duration,
    /// How long a write may wait for the server to make room.
    pub(super) send_timeout: Duration,
    /// Whether a waiting reader blocks in its receive ([`Link::reads_block`]).
    pub(super) reads_block: std::sync::atomic::AtomicBool,
    /// How long such a receive blocks at most, as the kernel took it.
    pub(super) receive_wait: Duration,
    /// The connection's registration with the reactor of async calls, while they wait on it.
    #[cfg(feature = "async")]
    pub(super) reactor: Reactor,
}

/// Who waits for a slot's result.
pub(super) enum Wake {
    Thread(std::thread::Thread),
    #[cfg(feature = "async")]
    Task(Waker),
}

impl Wake {
    pub(super) fn wake(self) {
        match self {
            Wake::Thread(t) => t.unpark(),
            #[cfg(feature = "async")]
            Wake::Task(w) => w.wake(),
        }
    }
}

impl Link {
    pub(super) fn demux(&self) -> Locked<'_> {
        Locked::new(self.demux.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Writes one frame, given whole in `parts` (its prefix first), sealed on a secure binding.
    pub(super) fn send(&self, parts: &mut [IoSlice<'_>]) -> std::io::Result<()> {
        let _writing = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        match &self.seal {
            Some(session) => framed::send_sealed(&self.stream, session, parts, self.send_timeout),
            None => framed::send(&self.stream, parts, self.send_timeout),
        }
    }

    pub(super) fn lost(&self, why: &str, sent: bool) -> CallError {
        CallError::ConnectionLost { server: self.server, sent, reason: why.to_owned() }
    }

    /// Reads what the connection has and delivers it; the caller holds the reading. The bytes of
    /// `lend`'s result that go into its buffer are read straight there ([`Link::land`]). Returns
    /// what the read got: [`Got::Filled`] when another read may find more. Err: the connection is
    /// over (the demux broken off).
    pub(super) fn pump(
        &self,
        demux: &mut Demux,
        binding: &BindingInner,
        lend: Option<&mut Lend<'_>>,
    ) -> Result<Got, ()> {
        // A caller lending its buffer reads no more than the connection's starting buffer the
        // usual way before its result's header is seen, so that little of its result is copied.
        let (most, landed) = match lend {
            Some(lend) => (BUFFER, self.land(demux, binding.id, lend)),
            None => (usize::MAX, None),
        };
        let read =
            || match (&self.seal, &mut demux.records) {
                // (Records are read on until nothing comes.)
                (Some(session), Some(records)) => records
                    .receive(&self.stream, session, &mut demux.frames)
                    .map(|moved| if moved { Got::Filled } else { Got::Nothing }),
                _ => framed::receive_up_to(&self.stream, &mut demux.frames, most),
            };
        let got = landed.unwrap_or_else(read);
        self.settle(demux, binding, got)
    }

    /// A reader's wait on a plain connection whose receives may block ([`Link::reads_block`]): one
    /// receive that blocks until bytes come (at most the stream's receive wait), where `poll` and
    /// a read after it take two system calls. The demux is not held meanwhile, so that the other
    /// callers send and look at their mailboxes; it is marked [`Demux::away`] instead, and nobody
    /// else reads until the receive returns. At most [`WAIT_READ`] bytes come in the receive, into
    /// this thread's stack, and are then copied into the frames (a larger result's rest is read
    /// there as any read's). Returns what the receive got, [`Got::Nothing`] when the wait passed or
    /// the stream did not block; Err when the connection is over (the demux broken off).
    pub(super) fn pump_waiting(&self, binding: &BindingInner) -> Result<Got, ()> {
        let room = {
            let mut demux = self.demux();
            if demux.away || demux.broken.is_some() {
                return Ok(Got::Nothing);
            }
            let room = demux.frames.spare().len().min(WAIT_READ);
            if room == 0 {
                return Ok(Got::Nothing);
            }
            demux.away = true;
            room
        };
        let mut buf = [0u8; WAIT_READ];
        let read = tiercel_sys::tcp::read_wait(&self.stream, &mut buf[..room]);
        let mut demux = self.demux();
        demux.away = false;
        let got = match read {
            Ok(None) => Ok(Got::Nothing),
            Ok(Some(0)) => Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(Some(n)) => {
                // Nobody touched the frames meanwhile: their spare room is still at least `room`.
                let spare = demux.frames.spare();
                let n = n.min(spare.len());
                tiercel_proto::copy::copy(&mut spare[..n], &buf[..n]);
                demux.frames.filled(n);
                Ok(if n < room { Got::Drained } else { Got::Filled })
            }
            Err(e) => Err(e),
        };
        self.settle(&mut demux, binding, got)
    }

    /// Whether a reader may wait in its receive ([`Link::pump_waiting`]): the connection is plain,
    /// the kernel took its receive wait, and no async call has registered it with the reactor
    /// (which takes only a stream that does not block).
    pub(super) fn reads_block(&self) -> bool {
        self.reads_block.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// What a read of the connection brought, delivered: the demux broken off (Err) when the read
    /// failed or the server broke the protocol.
    fn settle(&self, demux: &mut Demux, binding: &BindingInner, got: std::io::Result<Got>) -> Result<Got, ()> {
        let got = match got {
            Ok(got) => got,
            Err(e) => {
                let why = match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => "the server closed the connection".to_owned(),
                    std::io::ErrorKind::InvalidData => {
                        binding.stats.unopened.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        format!("what the server sent did not open with the binding's keys: {e}")
                    }
                    _ => format!("the connection failed: {e}"),
                };
                demux.break_off(why);
                return Err(());
            }
        };
        if got != Got::Nothing {
            demux.heard = Instant::now();
            if let Err(why) = demux.deliver(binding.id, &binding.stats.stale) {
                binding.stats.malformed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let _ = self.stream.shutdown(std::net::Shutdown::Both);
                demux.break_off(why);
                return Err(());
            }
        }
        Ok(got)
    }

    /// Reads the next bytes of `lend`'s result straight into its buffer, when its frame is the one
    /// being received and those bytes go there: the frame is the call's `Ok` result, larger than
    /// the receive buffer (which has grown for it), and its results start with the buffer's bytes
    /// (its payload is at least as long). What was read of them into the receive buffer before is
    /// copied over first. The receive buffer counts the bytes without holding them, so that the
    /// frame is delivered whole as any (its copy of those bytes is stale, and never read). `None`:
    /// read the usual way.
    pub(super) fn land(&self, demux: &mut Demux, binding: u32, lend: &mut Lend<'_>) -> Option<std::io::Result<Got>> {
        let Ok(Next::Partial(len)) = demux.frames.next() else { return None };
        let p = Packet::new_unchecked(demux.frames.header()?);
        let payload = len - HEADER_LEN;
        let ours = p.kind() == Kind::Result
            && p.status() == Status::Ok
            && p.binding() == binding
            && (p.slot(), p.seq()) == (lend.slot, lend.seq)
            && p.payload_len() as usize == payload;
        let at = demux.frames.buffered() - FRAME_HEAD;
        if !ours || payload < lend.tail.len() || len <= BUFFER || !demux.frames.fits(len) || at >= lend.tail.len() {
            return None;
        }
        // Bytes read the usual way (by this caller before its frame's header came, or by another
        // caller reading meanwhile) go to the buffer first.
        if lend.lent.filled < at {
            let front = &demux.frames.front()[FRAME_HEAD..];
            tiercel_proto::copy::copy(&mut lend.tail[lend.lent.filled..at], &front[lend.lent.filled..at]);
            lend.lent.filled = at;
        }
        let room = demux.frames.spare().len().min(lend.tail.len() - at);
        if room == 0 {
            // (Not with a frame that fits and is not whole; a read of nothing would look like the
            // end of the connection.)
            return None;
        }
        match tiercel_sys::tcp::read(&self.stream, &mut lend.tail[at..at + room]) {
            Ok(0) => Some(Err(std::io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => {
                demux.frames.filled_elsewhere(n);
                lend.lent.filled += n;
                lend.lent.read += n;
                Some(Ok(if n < room { Got::Drained } else { Got::Filled }))
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted) => {
                Some(Ok(Got::Nothing))
            }
            Err(e) => Some(Err(e)),
        }
    }

    /// Whether the server has been silent too long while calls wait: each waiting call then fails
    /// as over UDP (`Unreachable`), and the connection stays. A server stopped for a while (a
    /// pause, a debugger, a host under load) answers the binding's next calls once it runs again,
    /// and the late results of the calls given up are dropped as stale; a server that went away
    /// closes or resets the connection (its kernel, or keepalive's probes, tell), which ends it.
    pub(super) fn silent(&self, demux: &Demux, now: Instant) -> bool {
        demux.expecting > 0 && now.saturating_duration_since(demux.heard) >= self.silence
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}
