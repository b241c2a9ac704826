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
    /// Readiness of the connection on the runtime of async calls (made by the first).
    #[cfg(feature = "async")]
    pub(super) ready: std::sync::OnceLock<Option<tokio::net::TcpStream>>,
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
        let got = match landed.unwrap_or_else(read) {
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
            lend.tail[lend.lent.filled..at].copy_from_slice(&front[lend.lent.filled..at]);
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
