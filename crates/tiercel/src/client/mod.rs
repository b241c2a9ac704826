//! The client: importing an interface (binding), and the per-thread endpoints calls go through.

#[cfg(feature = "async")]
mod asynch;
mod binding;
mod cache;
mod call;
mod intercept;
mod pin;
mod rebind;
mod refused;
mod shm;
mod slots;
mod tcp;
mod udp;
mod udp_bind;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[cfg(feature = "async")]
pub use call::AsyncCall;
pub use call::{Call, Reply};
pub use intercept::{ClientInterceptor, OutgoingCall};
pub(crate) use rebind::{Rebinder, Through};

use crate::address::{Target, ToAddress, Transport};
use crate::config::ClientConfig;
use crate::interface::{Import, InterfaceInfo};
use crate::names::Registry;
use crate::{AddressError, BindError, CallError};
use tiercel_proto::bind::wire::features;

/// A client of one server, or of the servers exporting a name: imports interfaces from it.
#[derive(Debug, Clone)]
pub struct Client {
    target: Target,
    transport: Option<Transport>,
    config: ClientConfig,
    /// Where names are looked up; `None`: [`Registry::default`] at each import.
    registry: Option<Registry>,
    /// Exporters of a name passed over because they failed to prove themselves (shared by clones).
    refused: Arc<AtomicU64>,
}

/// The tokio runtime the calling task runs on: async calls wait on its reactor and timers, and
/// register their sockets with it. Outside a runtime they fail (rather than panic).
#[cfg(feature = "async")]
fn current_runtime() -> Result<tokio::runtime::Id, CallError> {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => Ok(handle.id()),
        Err(_) => Err(CallError::Internal(crate::error::Invariant::NoRuntime)),
    }
}

impl Client {
    /// A client of the server at `addr`: a `SocketAddr` or `"host:port"` (shared memory if the server
    /// is on this host, else UDP, else TCP when UDP gets no answer), `"udp://host:port"`,
    /// `"tcp://host:port"` or `"shm:host:port"`; or of the servers that
    /// export a name (`"accounts"`, `"udp://accounts"`: a string without a port), looked up at each
    /// import (see [`crate::names`]). Nothing is sent until [`Client::import`].
    pub fn connect(addr: impl ToAddress) -> Result<Client, AddressError> {
        let (transport, target) = addr.to_target()?;
        Ok(Client { target, transport, config: ClientConfig::default(), registry: None, refused: Arc::default() })
    }

    /// Replaces the configuration used by later imports.
    pub fn with_config(mut self, config: ClientConfig) -> Client {
        self.config = config;
        self
    }

    /// Shows every call of the bindings this client imports from now on to `interceptor` before it is
    /// sent, on every transport: `Ok(())` lets it go, `Err(why)` fails it with
    /// [`CallError::Intercepted`] (never sent). It sees the interface, the procedure, the server,
    /// the transport and the deadline: the place for a log of calls, or for rules on what this
    /// program may call. Kept in [`ClientConfig::interceptor`], so set it after
    /// [`Client::with_config`].
    pub fn intercept(
        mut self,
        interceptor: impl Fn(&OutgoingCall) -> Result<(), String> + Send + Sync + 'static,
    ) -> Client {
        self.config.interceptor = Some(ClientInterceptor::new(interceptor));
        self
    }

    /// Looks names up in `registry` rather than in the default one (`TIERCEL_REGISTRY`, else this
    /// user's registry on this host).
    pub fn with_registry(mut self, registry: Registry) -> Client {
        self.registry = Some(registry);
        self
    }

    /// How many exporters of a name imports of this client (and its clones, re-bindings included)
    /// passed over because they failed to prove themselves: a wrong or missing secret proof,
    /// another interface, a broken bind exchange.
    pub fn exporters_refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// The server's address, or the name to look up.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// Binds to interface `T` on the server: one round trip that checks the interface and its version
    /// and returns the generated client stub.
    ///
    /// Imported by name, the binding is to one of the live servers exporting the name with this
    /// interface, taken in random order so that clients spread over them; one that does not answer
    /// or has no room is passed over for the next, and so is one that fails to prove what the
    /// client requires of it (the shared secret, the interface) or breaks the bind protocol, counted
    /// in [`Client::exporters_refused`]: an entry forged by whoever can write the registry is
    /// never the end of an import. When every exporter fails, the error is that of the first one
    /// refused, else that of the last one tried.
    ///
    /// With `ClientConfig::rebind`, the binding binds again by itself when its server is found gone
    /// (see [`ClientConfig::rebind`](crate::ClientConfig::rebind)).
    pub fn import<T: Import>(&self) -> Result<T, BindError> {
        self.import_info(T::INFO).map(T::from_binding)
    }

    /// Binds to an interface known only at run time, as [`Client::import`] does to a generated
    /// stub's: for tools that call any interface (`tiercel call`), with calls made through
    /// [`Binding::call`] and their arguments marshaled by hand. `info` must describe the server's
    /// interface exactly (name, version, and a signature with its fingerprint), for example as
    /// [`Client::exports`] told it.
    pub fn import_info(&self, info: &'static InterfaceInfo) -> Result<Binding, BindError> {
        let mut binding = self.bind(info)?;
        if self.config.rebind {
            // Imported by name from a registry that tells of departures: watched, so that the
            // binding leaves an exporter that went before calling it.
            let watch = match &self.target {
                Target::Name(name) => self.registry().ok().and_then(|r| r.watch(name)),
                Target::Addr(_) => None,
            };
            binding.rebind = Some(Arc::new(Rebinder::new(self.clone(), &binding.inner, watch)));
        }
        Ok(binding)
    }

    /// Where names are looked up: the registry given, else the default one.
    fn registry(&self) -> Result<Registry, crate::names::NameError> {
        match &self.registry {
            Some(r) => Ok(r.clone()),
            None => Registry::from_env(),
        }
    }

    /// A new binding to `info` at the client's address, or to one of the name's exporters.
    fn bind(&self, info: &'static InterfaceInfo) -> Result<Binding, BindError> {
        let name = match &self.target {
            Target::Addr(server) => {
                let target = || pin::address_target(*server);
                return self
                    .keyed(*server, self.config.clone(), target, |c| Binding::bind(*server, self.transport, info, c));
            }
            Target::Name(name) => name,
        };
        let registry = self.registry()?;
        let mut exporters = registry.resolve(name, info)?;
        let first = crate::random::bytes().map(|b| b[0] as usize).unwrap_or(0) % exporters.len();
        exporters.rotate_left(first);
        let (mut gone, mut refused) = (None, None);
        let now = crate::secure::unix_now();
        for exporter in exporters {
            let Some(config) = self.for_exporter(name, &exporter, registry.vouches(), now, &mut refused) else {
                continue;
            };
            let bound = self.keyed(
                exporter.addr,
                config,
                || pin::name_target(name),
                |c| Binding::bind(exporter.addr, self.transport, info, c),
            );
            match bound {
                Ok(binding) => return Ok(binding),
                // Gone since it registered (its registration not yet removed), or full: the next.
                Err(e @ (BindError::NoServer(_) | BindError::Unreachable(_) | BindError::Busy)) => gone = Some(e),
                // This client's own trouble, which the next exporter would meet too.
                Err(
                    e @ (BindError::Io(_) | BindError::Internal(_) | BindError::Name(_) | BindError::KnownServers(_)),
                ) => return Err(e),
                // It could not prove what this client requires (a forged entry, another server
                // on a dead one's port): counted, and the next.
                Err(e) => {
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    refused.get_or_insert(e);
                }
            }
        }
        Err(refused.or(gone).unwrap_or_else(|| unreachable!("resolve returns at least one exporter")))
    }

    /// What the server exports (every interface, with its procedures), asked over UDP (TCP with a
    /// `tcp://` address, or when UDP gets no answer); for a name,
    /// what each of its live exporters does. A server with a shared secret answers only a client
    /// that proves it. With the server's key (given, or pinned: `ClientConfig::known_servers`,
    /// which pins it here as a bind would, or a name's entry's where its registry vouches for it),
    /// the listing is asked in a secure handshake that proves it; with `ClientConfig::authorities`,
    /// only a name's endorsed exporters are asked ([`BindError::NotEndorsed`] when none is). What a
    /// server says of its interfaces is not proven back: binding checks the interface again.
    pub fn exports(&self) -> Result<Vec<crate::ExportInfo>, BindError> {
        match &self.target {
            Target::Addr(server) => self.keyed(
                *server,
                self.config.clone(),
                || pin::address_target(*server),
                |c| self.list_with(*server, &c),
            ),
            Target::Name(name) => {
                let registry = self.registry()?;
                let now = crate::secure::unix_now();
                let (mut all, mut listed, mut refused) = (Vec::new(), false, None);
                for exporter in registry.lookup(name)? {
                    // As a bind would have it: an exporter an authority did not endorse is passed over.
                    let Some(config) = self.for_exporter(name, &exporter, registry.vouches(), now, &mut refused) else {
                        continue;
                    };
                    let target = || pin::name_target(name);
                    all.extend(self.keyed(exporter.addr, config, target, |c| self.list_with(exporter.addr, &c))?);
                    listed = true;
                }
                match refused {
                    Some(e) if !listed => Err(e),
                    _ => Ok(all),
                }
            }
        }
    }

    /// The configuration to reach `exporter` of `name` with: the key its entry carries where an
    /// authority this client trusts endorsed it for the name, else the entry's key where the
    /// registry vouches for its entries, else the client's own. `None` when no authority endorsed
    /// it: nothing is to be sent to it; it is counted as refused, and the first such refusal kept in
    /// `refused`.
    fn for_exporter(
        &self,
        name: &str,
        exporter: &crate::names::Exporter,
        vouched: bool,
        now: u64,
        refused: &mut Option<BindError>,
    ) -> Option<ClientConfig> {
        let mut config = self.config.clone();
        if config.server_key.is_none() && !config.authorities.is_empty() {
            let endorsed = match (&exporter.key, &exporter.endorsement) {
                (Some(key), Some(e)) => e.vouches(&config.authorities, name, key, now).map(|()| *key),
                _ => Err(crate::secure::NotEndorsed::Missing),
            };
            match endorsed {
                Ok(key) => config.server_key = Some(key),
                Err(why) => {
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    refused.get_or_insert(BindError::NotEndorsed { name: name.into(), exporter: exporter.addr, why });
                    return None;
                }
            }
        } else if config.server_key.is_none() && vouched {
            // The key the entry carries: the exporter must prove it.
            config.server_key = exporter.key;
        }
        Some(config)
    }

    /// Does `act` (a bind, a listing) with the server at `server`, an exporter of `target`, under
    /// `config`; when this client pins keys and was given none (nor, for a name, authorities), under
    /// the key pinned for `target`, or the first time under `config`'s (a registry's) or the one the
    /// server tells, pinned once proven.
    fn keyed<T>(
        &self,
        server: SocketAddr,
        mut config: ClientConfig,
        target: impl FnOnce() -> String,
        act: impl FnOnce(ClientConfig) -> Result<T, BindError>,
    ) -> Result<T, BindError> {
        let endorsed = matches!(self.target, Target::Name(_)) && !self.config.authorities.is_empty();
        match &self.config.known_servers {
            Some(known) if self.config.server_key.is_none() && !endorsed => {
                let first = config.server_key.take();
                self.pinned(known, &target(), server, first, config, act)
            }
            _ => act(config),
        }
    }

    /// What the server at `server` exports: over UDP, or TCP when the address says so or UDP gets
    /// no answer (as a bind would).
    fn list_with(&self, server: SocketAddr, config: &ClientConfig) -> Result<Vec<crate::ExportInfo>, BindError> {
        self.udp_else_tcp(server, config, udp_bind::list_udp, tcp::list)
    }

    /// An exchange with the server at `server` that binds nothing: over TCP when the address says
    /// so, else over UDP, and over TCP when UDP gets no answer and the client may fall back.
    fn udp_else_tcp<T>(
        &self,
        server: SocketAddr,
        config: &ClientConfig,
        udp: impl FnOnce(SocketAddr, &ClientConfig) -> Result<T, BindError>,
        tcp: impl FnOnce(SocketAddr, &ClientConfig) -> Result<T, BindError>,
    ) -> Result<T, BindError> {
        if self.transport == Some(Transport::Tcp) {
            return tcp(server, config);
        }
        match udp(server, config) {
            Err(BindError::Unreachable(_)) if self.transport.is_none() && config.tcp_fallback => tcp(server, config)
                .map_err(|e| match e {
                    BindError::NoServer(_) | BindError::Unreachable(_) => BindError::Unreachable(server),
                    e => e,
                }),
            done => done,
        }
    }

    /// [`Client::import`] from async code: the bind exchange (a round trip, more when packets are
    /// lost) runs on tokio's blocking pool, not on the task's thread. Import an async stub
    /// (`FooAsyncClient`) to call with `.await`. Crate feature `async`.
    #[cfg(feature = "async")]
    pub async fn import_async<T: Import + Send + 'static>(&self) -> Result<T, BindError> {
        let client = self.clone();
        match tokio::task::spawn_blocking(move || client.import::<T>()).await {
            Ok(bound) => bound,
            Err(_) => Err(BindError::Internal(crate::error::Invariant::ImportTaskFailed)),
        }
    }
}

crate::counters::counters! {
    /// The counters of a binding's slow path, bumped as it goes (read through [`ClientStats`]).
    ClientCounters,
    /// Counters of a binding's slow path, summed over its threads, as they stood when read
    /// ([`Binding::stats`]).
    ClientStats {
        /// Packets retransmitted: call fragments, probes, result requests.
        retransmissions,
        /// Packets that failed header validation, or arrived truncated.
        malformed,
        /// Datagrams of a secure binding dropped unread: they did not open with its keys (changed
        /// on the way, forged, plain), or their number was seen before (a replay, a duplicate).
        unopened,
        /// Valid packets not for the current call (late duplicates, old results).
        stale,
        /// Result fragments received straight into their place in the result's reassembly (the
        /// kernel's copy of their bytes the only one): on loopback one a receive, on paths of small
        /// datagrams the fragments of a coalesced run.
        landed,
        /// Calls that went out together with others of their binding's threads, in one segmented
        /// send of the socket they share ([`crate::config::ClientConfig::batch_threads`]).
        sent_together,
        /// Datagrams one of those threads received for another and put in its mailbox.
        handed_over,
        /// Results received into the buffer the caller lent (a call, synchronous or async, of a
        /// procedure whose one buffer is an `InOut` and its last argument, with a result of several
        /// datagrams over UDP, larger than the connection's 64 KiB receive buffer over TCP, or any `Ok`
        /// result through shared memory), not copied there out of the result's reassembly, frame or
        /// private copy.
        in_place,
        /// Of the fragments of those results over UDP, the ones received straight into the lent
        /// buffer (the others, a few, are copied there once the result is whole).
        lent_fragments,
        /// Of the bytes of those results over TCP, the ones read from the connection straight into the
        /// lent buffer (the others, those read before the result's header was seen, or by another
        /// caller reading the connection meanwhile, are copied there).
        lent_bytes,
    }
}

static NEXT_UID: AtomicU64 = AtomicU64::new(1);

pub(crate) struct BindingInner {
    uid: u64,
    server: SocketAddr,
    id: u32,
    token: u128,
    incarnation: u64,
    max_datagram: usize,
    /// The client slots not held by an endpoint, and the turns of threads beyond them.
    free_slots: slots::Slots,
    /// How many client slots the binding has.
    slot_count: u32,
    /// Over UDP, the socket the binding's calling threads beyond its first share (opened by the
    /// second; `None` inside when this kernel cannot batch): see `udp::shared`.
    udp_port: std::sync::OnceLock<Option<Arc<udp::SharedPort>>>,
    /// The calling threads' UDP endpoints of the binding alive now.
    udp_threads: std::sync::atomic::AtomicUsize,
    /// The shared region, when the binding is through shared memory.
    shm: Option<shm::Link>,
    /// The connection, when the binding is over TCP.
    tcp: Option<tcp::Link>,
    config: ClientConfig,
    info: &'static InterfaceInfo,
    /// Shared by the bindings a [`Rebinder`] makes in turn.
    stats: Arc<ClientCounters>,
    /// Why a binding that could have used shared memory (a server on this host, the binder
    /// choosing) went over UDP instead.
    shm_refused: Option<String>,
    /// The AF_XDP station of the interface on the way to the server, when the address asked for
    /// AF_XDP (`xdp://`) and there is one: each thread's calls go through it.
    xdp: Option<Arc<crate::xdp::Station>>,
    /// Why a binding that asked for AF_XDP has none (its calls go over the kernel's UDP).
    xdp_refused: Option<String>,
    /// The protocol features the server granted (`tiercel_proto::bind::wire::features`): calls
    /// carry context blocks, and cancels go out, only when granted.
    features: u16,
    /// Each procedure's metrics handles (feature `metrics`; empty types without it).
    metrics: Vec<crate::metrics::Procedure>,
    /// Where the server's copy of the interface differs from this client's: the server's number for
    /// each of the client's procedures (`tiercel_proto::bind::ABSENT` for one it lacks). `None`
    /// (the copies are the same) costs a call one branch.
    procedures: Option<Box<[u16]>>,
    /// The pool of endpoints of async calls.
    #[cfg(feature = "async")]
    asynch: asynch::AsyncState,
    /// The keys of a secure binding: every packet is sealed with them, and only packets that open
    /// with them are read.
    seal: Option<Arc<crate::secure::Session>>,
    /// The key the server proved at the bind (see [`Binding::server_key`]).
    proven: Option<crate::PublicKey>,
    /// The ONC server's link, when the binding is to one ([`crate::onc::OncClient`]): the stub's
    /// calls go through it instead.
    onc: Option<Arc<crate::onc::Link>>,
    /// Through shared memory, with none of the pieces a call may have to look at (an interceptor,
    /// metrics, the server's own procedure numbers): a thread's calls take the short path of
    /// [`Binding::call_plain`].
    plain: bool,
}

impl BindingInner {
    /// A client slot for a new endpoint, with the sequence number of its last call.
    fn take_slot(&self) -> Result<slots::Free, CallError> {
        self.free_slots.take()
    }

    /// Whether the server takes `Cancel` packets (and cancel words).
    #[cfg(feature = "async")]
    pub(crate) fn cancels(&self) -> bool {
        self.features & features::CANCEL != 0
    }

    /// The server's number for this client's procedure `procedure`; an error, before anything is
    /// sent, for a procedure the server's copy of the interface lacks.
    #[inline]
    pub(crate) fn wire_procedure(&self, procedure: u16) -> Result<u16, CallError> {
        match &self.procedures {
            None => Ok(procedure),
            Some(map) => match map.get(usize::from(procedure)) {
                Some(&n) if n != tiercel_proto::bind::ABSENT => Ok(n),
                _ => Err(CallError::NotExported {
                    interface: self.info.name,
                    procedure: self.info.procedures.get(usize::from(procedure)).copied().unwrap_or("?"),
                }),
            },
        }
    }

    /// Returns a slot taken with [`BindingInner::take_slot`] (`abandoned`: a call given up in it
    /// may still run on the server).
    fn give_slot(&self, slot: u32, seq: u32, abandoned: bool) {
        self.free_slots.give(slots::Free { slot, seq, abandoned });
    }
}

/// What a bind exchange granted, on any transport.
struct Granted {
    /// The binding's keys, when it is a secure one (over UDP).
    seal: Option<Arc<crate::secure::Session>>,
    /// The key the server proved: a secure binding's, or the one that sealed the answer naming a
    /// shared-memory rendezvous.
    proven: Option<crate::PublicKey>,
    id: u32,
    token: u128,
    incarnation: u64,
    max_datagram: usize,
    slots: u32,
    features: u16,
    shm: Option<shm::Link>,
    tcp: Option<tcp::Link>,
    procedures: Option<Vec<u16>>,
}

/// A binding to an interface exported by a server: what a generated client stub holds.
///
/// Cloning is cheap and clones share the binding. Each thread that calls through a binding gets its
/// own client slot, socket and buffers on its first call, and keeps them for later calls.
#[derive(Clone)]
pub struct Binding {
    inner: Arc<BindingInner>,
    deadline: Option<Duration>,
    /// With `ClientConfig::rebind`: the binding calls go through now, and how to make another.
    rebind: Option<Arc<Rebinder>>,
}

impl core::fmt::Debug for Binding {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Binding")
            .field("interface", &self.inner.info.name)
            .field("server", &self.inner.server)
            .field("id", &self.inner.id)
            .field("incarnation", &self.inner.incarnation)
            .finish()
    }
}

impl Binding {
    /// A clone of this binding whose calls fail with [`CallError::DeadlineExceeded`] after `deadline`.
    /// The deadline travels with each call: a server that would start a call after it answers
    /// `DeadlineExceeded { may_have_run: false }` without running it, and a procedure sees it
    /// ([`crate::deadline`]). Cheap (a reference count): make one per call to give each its own.
    /// Each call then reads the clock on both sides and carries the deadline in a context block: a
    /// Null call took 0.11 µs more over UDP in the cost ledger (`docs/ledger.md`), nothing visible
    /// more over TCP, and 58 ns more through shared memory (its fifth run, runs 53–77 ns); in its
    /// tenth, on an Intel VM where a clock read takes 19 ns, 0.10 µs more over UDP, 36 ns over TCP
    /// and 139 ns through shared memory.
    pub fn with_deadline(&self, deadline: Duration) -> Binding {
        Binding { inner: self.inner.clone(), deadline: Some(deadline), rebind: self.rebind.clone() }
    }

    /// The client's interceptor's verdict on a call of `procedure` through `inner`, if it has one.
    fn intercept(&self, inner: &BindingInner, procedure: u16) -> Result<(), CallError> {
        let Some(interceptor) = &inner.config.interceptor else { return Ok(()) };
        let call = OutgoingCall {
            interface: inner.info.name,
            version: inner.info.version,
            procedure: inner.info.procedures.get(usize::from(procedure)).copied().unwrap_or("?"),
            number: procedure,
            server: inner.server,
            transport: self.transport_now(inner),
            deadline: self.deadline,
        };
        interceptor.check(&call).map_err(CallError::Intercepted)
    }

    /// A call's span (feature `tracing`), and what the call carries besides its arguments.
    fn context(&self, procedure: u16) -> (crate::trace::CallSpan, tiercel_proto::context::Context) {
        let transport = match self.transport_now(&self.inner) {
            Transport::SharedMemory => "shm",
            Transport::Tcp => "tcp",
            Transport::Udp => "udp",
            Transport::Xdp => "xdp",
        };
        let (span, trace) = crate::trace::client_span(self.inner.info, procedure, transport);
        if self.inner.features & features::CONTEXT == 0 {
            // A server that reads no context blocks: the deadline stays with the client.
            return (span, tiercel_proto::context::Context::default());
        }
        (span, tiercel_proto::context::Context { deadline: self.deadline, trace })
    }

    /// The binding calls go through now: this one, or with `ClientConfig::rebind` the one made
    /// last.
    fn now(&self) -> Arc<BindingInner> {
        match &self.rebind {
            None => self.inner.clone(),
            Some(r) => r.latest(),
        }
    }

    /// The server's address (of the binding calls go through now).
    pub fn server(&self) -> SocketAddr {
        self.now().server
    }

    /// The transport chosen at bind time (of the binding calls go through now).
    pub fn transport(&self) -> Transport {
        self.transport_now(&self.now())
    }

    fn transport_now(&self, inner: &BindingInner) -> Transport {
        if let Some(onc) = &inner.onc {
            return match onc.transport() {
                crate::onc::OncTransport::Udp => Transport::Udp,
                crate::onc::OncTransport::Tcp => Transport::Tcp,
            };
        }
        match (&inner.shm, &inner.tcp) {
            (Some(_), _) => Transport::SharedMemory,
            (None, Some(_)) => Transport::Tcp,
            (None, None) if inner.xdp.is_some() => Transport::Xdp,
            (None, None) => Transport::Udp,
        }
    }

    /// Why this binding, whose address asked for AF_XDP (`xdp://`), is over the kernel's UDP
    /// instead: no station could be opened on the interface toward the server (no privilege, no
    /// driver support, another program attached, no hardware address known for the server or the
    /// router toward it, a build without the feature `xdp`). `None` when it is through AF_XDP, or AF_XDP was not asked for.
    pub fn xdp_refused(&self) -> Option<String> {
        self.now().xdp_refused.clone()
    }

    /// Why this binding is over UDP although the server is on this host and the address let the
    /// binder choose: what went wrong binding through shared memory. `None` when it is through
    /// shared memory, or UDP was asked for or the only way. With `ClientConfig::rebind`, such a
    /// binding tries shared memory again, at most once a second, and moves to it when it can.
    pub fn shared_memory_refused(&self) -> Option<String> {
        self.now().shm_refused.clone()
    }

    /// Times this binding has bound again by itself (`ClientConfig::rebind`): to a server found
    /// gone, or from UDP back to shared memory.
    pub fn rebinds(&self) -> u64 {
        self.rebind.as_ref().map_or(0, |r| r.rebinds.load(Ordering::Relaxed))
    }

    /// The key the server proved at the bind (`ClientConfig::server_key`, or a name's entry):
    /// over UDP, the key of a secure binding, whose packets are all sealed; through shared memory,
    /// the key that sealed the answer naming the server's rendezvous (the region itself is private
    /// to the two processes, not encrypted). `None` for a plain binding.
    pub fn server_key(&self) -> Option<crate::PublicKey> {
        self.now().proven
    }

    /// The binding's id on the server (not a secret: the token that goes with it is).
    pub fn id(&self) -> u32 {
        self.now().id
    }

    /// The server incarnation (boot id) the binding was made with.
    pub fn incarnation(&self) -> u64 {
        self.now().incarnation
    }

    /// The interface bound to.
    pub fn interface(&self) -> &'static InterfaceInfo {
        self.inner.info
    }

    /// Largest datagram sent on this binding; larger messages go as several packets (0 through
    /// shared memory and over TCP, which need no fragments).
    pub fn max_datagram(&self) -> usize {
        self.now().max_datagram
    }

    /// Slow-path counters as they stand now (of every binding made in turn, with
    /// `ClientConfig::rebind`).
    pub fn stats(&self) -> ClientStats {
        self.inner.stats.snapshot()
    }

    /// Starts a call of procedure `procedure`: marshal the arguments into [`Call::writer`], then
    /// [`Call::invoke`].
    #[doc(hidden)]
    pub fn call<'a>(&self, procedure: u16) -> Result<Call<'_, 'a>, CallError> {
        let mut call = Call::empty(self, procedure);
        call.start()?;
        Ok(call)
    }

    /// A call of procedure `procedure` not started yet: [`Call::start`], marshal the arguments into
    /// [`Call::writer`], then [`Call::invoke`]. Used by generated stubs, which keep the call where
    /// it is built.
    #[doc(hidden)]
    #[inline]
    pub fn begin_call<'a>(&self, procedure: u16) -> Call<'_, 'a> {
        Call::empty(self, procedure)
    }

    /// The ONC server's link, when the binding is to one ([`crate::onc::OncClient`]): generated
    /// stubs of interfaces with `onc(...)` call through it. `None` costs such a stub's call one
    /// branch.
    #[doc(hidden)]
    #[inline]
    pub fn onc(&self) -> Option<&crate::onc::Link> {
        self.inner.onc.as_deref()
    }

    /// Whether the binding is to an ONC server ([`crate::onc::OncClient`]).
    pub fn is_onc(&self) -> bool {
        self.inner.onc.is_some()
    }

    /// The binding's deadline ([`Binding::with_deadline`]).
    #[doc(hidden)]
    pub fn deadline(&self) -> Option<Duration> {
        self.deadline
    }

    /// An async call of procedure `procedure`: [`AsyncCall::start`] (which waits for a free slot if
    /// every one is in use), marshal into [`AsyncCall::writer`], then [`AsyncCall::invoke`]. Used by
    /// generated async stubs.
    #[doc(hidden)]
    #[cfg(feature = "async")]
    pub fn call_async<'a>(&self, procedure: u16) -> AsyncCall<'_, 'a> {
        AsyncCall::new(self, procedure)
    }
}
