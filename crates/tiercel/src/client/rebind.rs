//! Binding again (`ClientConfig::rebind`): the binding a call goes through, and the rebinder that
//! replaces a binding whose server is gone or moved.

use super::*;

/// The binding a call goes through: the stub's own, or with `ClientConfig::rebind` the one made
/// last.
pub(crate) enum Through<'b> {
    Stub(&'b Binding),
    Latest(Binding),
}

impl core::ops::Deref for Through<'_> {
    type Target = Binding;
    fn deref(&self) -> &Binding {
        match self {
            Through::Stub(b) => b,
            Through::Latest(b) => b,
        }
    }
}

impl<'b> Through<'b> {
    /// Another handle on the same binding.
    pub(crate) fn again(&self) -> Through<'b> {
        match self {
            Through::Stub(b) => Through::Stub(b),
            Through::Latest(b) => Through::Latest(b.clone()),
        }
    }
}

impl Binding {
    /// The binding a call should go through, binding again first if the last one was found gone
    /// (on this thread: the call waits for the bind exchange).
    pub(crate) fn through(&self) -> Result<Through<'_>, CallError> {
        match &self.rebind {
            None => Ok(Through::Stub(self)),
            Some(r) => r
                .current()
                .map(|inner| Through::Latest(Binding { inner, deadline: self.deadline, rebind: self.rebind.clone() })),
        }
    }

    /// Whether [`Binding::through`] would bind again (so that an async call does it off the
    /// runtime's threads).
    #[cfg(feature = "async")]
    pub(crate) fn must_bind_again(&self) -> bool {
        self.rebind.as_ref().is_some_and(|r| r.due())
    }

    /// A call through this binding failed with `error`: if it says the server is gone (or no
    /// longer knows the binding), the next call binds again.
    pub(crate) fn failed(&self, error: &CallError) {
        if let Some(r) = &self.rebind {
            if matches!(
                error,
                CallError::ServerRestarted
                    | CallError::UnknownBinding
                    | CallError::Unreachable { .. }
                    | CallError::ServerGone { .. }
                    | CallError::ConnectionLost { .. }
            ) {
                r.lost(&self.inner);
            }
        }
    }
}

/// How often a binding over UDP to a server on this host tries shared memory again.
const SHM_RETRY: Duration = Duration::from_secs(1);

/// What a binding made with `ClientConfig::rebind` needs to bind again, and the binding it made
/// last.
pub(crate) struct Rebinder {
    pub(super) client: Client,
    pub(super) info: &'static InterfaceInfo,
    latest: Mutex<Latest>,
    pub(super) rebinds: AtomicU64,
    /// The watch of the name imported, when its registry tells of departures.
    pub(super) watch: Option<crate::names::Watch>,
    /// The user whose process served the address when the binding was made, where the server is on
    /// this host and the binding was made to an address: a binding made again must find the
    /// same user's process there.
    owner: Option<u32>,
}

/// The user whose socket serves `inner`'s server (its TCP listener for a binding over TCP, its UDP
/// socket otherwise, shared memory's included), when it is on this host.
fn owner_of(inner: &BindingInner) -> Option<u32> {
    tiercel_sys::process::socket_owner(inner.tcp.is_some(), inner.server)
}

struct Latest {
    inner: Arc<BindingInner>,
    /// Its server was found gone: the next call binds again.
    lost: bool,
    /// When to try shared memory again (a binding over UDP that could have had it).
    shm_again: Option<std::time::Instant>,
    /// The watch's departures already looked at.
    departures_seen: u64,
}

impl Rebinder {
    pub(super) fn new(client: Client, inner: &Arc<BindingInner>, watch: Option<crate::names::Watch>) -> Rebinder {
        let owner = match client.target {
            Target::Addr(_) => owner_of(inner),
            Target::Name(_) => None,
        };
        Rebinder {
            client,
            info: inner.info,
            latest: Mutex::new(Latest {
                inner: inner.clone(),
                lost: false,
                shm_again: inner.shm_refused.as_ref().map(|_| std::time::Instant::now() + SHM_RETRY),
                departures_seen: watch.as_ref().map_or(0, |w| w.departures.generation()),
            }),
            rebinds: AtomicU64::new(0),
            watch,
            owner,
        }
    }

    /// The binding made last, marked lost if the watch has seen its exporter go.
    fn lock(&self) -> std::sync::MutexGuard<'_, Latest> {
        let mut latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(w) = &self.watch {
            let seen = w.departures.generation();
            if seen != latest.departures_seen {
                latest.departures_seen = seen;
                if w.departures.has_gone(latest.inner.server, latest.inner.incarnation) {
                    latest.lost = true;
                }
            }
        }
        latest
    }

    pub(super) fn latest(&self) -> Arc<BindingInner> {
        self.lock().inner.clone()
    }

    #[cfg(feature = "async")]
    pub(super) fn due(&self) -> bool {
        let latest = self.lock();
        latest.lost || latest.shm_again.is_some_and(|t| std::time::Instant::now() >= t)
    }

    pub(super) fn lost(&self, inner: &Arc<BindingInner>) {
        let mut latest = self.lock();
        if Arc::ptr_eq(&latest.inner, inner) {
            latest.lost = true;
        }
    }

    /// The binding to call through, made anew first if the last one's server was found gone, or if
    /// it is time to try shared memory again. Other calls wait meanwhile (they would fail too).
    pub(super) fn current(&self) -> Result<Arc<BindingInner>, CallError> {
        let mut latest = self.lock();
        let now = std::time::Instant::now();
        if latest.lost {
            let mut fresh = self.client.bind(self.info).map_err(CallError::BindAgain)?;
            if let Some(expected) = self.owner {
                let found = owner_of(&fresh.inner);
                if found != Some(expected) {
                    // Dropped unused: the binding stays lost, and the next call looks again.
                    let server = fresh.inner.server;
                    return Err(CallError::BindAgain(BindError::AnotherOwner { server, expected, found }));
                }
            }
            self.adopt(&mut latest, &mut fresh, now);
        } else if latest.shm_again.is_some_and(|t| now >= t) {
            // The same server, through shared memory only: nothing is granted over UDP meanwhile.
            // Held to the key it proved (given, a registry's, or pinned), as any bind to it is.
            let server = latest.inner.server;
            let mut config = self.client.config.clone();
            config.server_key = config.server_key.or(latest.inner.proven);
            match Binding::bind(server, Some(Transport::SharedMemory), self.info, config) {
                Ok(mut fresh) => self.adopt(&mut latest, &mut fresh, now),
                Err(_) => latest.shm_again = Some(now + SHM_RETRY),
            }
        }
        Ok(latest.inner.clone())
    }

    fn adopt(&self, latest: &mut Latest, fresh: &mut Binding, now: std::time::Instant) {
        if let Some(inner) = Arc::get_mut(&mut fresh.inner) {
            inner.stats = latest.inner.stats.clone();
        }
        latest.shm_again = fresh.inner.shm_refused.as_ref().map(|_| now + SHM_RETRY);
        latest.inner = fresh.inner.clone();
        latest.lost = false;
        self.rebinds.fetch_add(1, Ordering::Relaxed);
    }
}
