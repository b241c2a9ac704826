//! The server: exports interfaces and runs calls on its worker threads.

#[cfg(feature = "async")]
mod asynch;
mod charge;
mod dispatch;
mod handoff;
mod handshake;
mod intercept;
mod landing;
mod outbox;
mod running;
mod secure;

pub(crate) use dispatch::Current;
pub use dispatch::{caller, deadline};
pub use intercept::{CallInfo, Caller};
pub use running::{RunningServer, ShutdownHandle};
mod shm;
mod tcp;
mod udp;

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use tiercel_proto::endpoint::{EndpointConfig, ServerEndpoint};

use crate::address::ToAddress;
use crate::config::ServerConfig;
use crate::interface::Export;
use crate::names::{Exporter, NameError, Registration, Registry};
use crate::ServerError;

/// A server being set up: bound to an address, collecting exports.
pub struct Server {
    socket: UdpSocket,
    /// The TCP listener on the same port, or why there is none (an error only if the
    /// configuration asks for TCP).
    tcp: std::io::Result<std::net::TcpListener>,
    config: ServerConfig,
    exports: Vec<Arc<dyn Export>>,
    /// Names to register once started, each with the index of its export.
    names: Vec<(String, usize)>,
    /// Where to register them; `None`: [`Registry::default`].
    registry: Option<Registry>,
    /// The application's runtime for async procedures, if it gave one.
    #[cfg(feature = "async")]
    runtime: Option<tokio::runtime::Handle>,
    /// What every call is shown to before it runs, if anything.
    interceptor: Option<Arc<intercept::Interceptor>>,
}

impl core::fmt::Debug for Server {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Server").field("addr", &self.socket.local_addr().ok()).finish()
    }
}

impl Server {
    /// Binds the server's UDP socket to `addr`, and a TCP listener to the same address and port
    /// (`"127.0.0.1:0"` picks a port free for both).
    pub fn bind(addr: impl ToAddress) -> Result<Server, ServerError> {
        let (_, addr) = addr.to_address()?;
        let (socket, tcp) = Self::bind_both(addr)?;
        Ok(Server {
            socket,
            tcp,
            config: ServerConfig::default(),
            exports: Vec::new(),
            names: Vec::new(),
            registry: None,
            #[cfg(feature = "async")]
            runtime: None,
            interceptor: None,
        })
    }

    /// The UDP socket at `addr` and the TCP listener on its port; with port 0, a port free for
    /// both if one is found in a few tries.
    fn bind_both(addr: SocketAddr) -> Result<(UdpSocket, std::io::Result<std::net::TcpListener>), ServerError> {
        let mut tries = if addr.port() == 0 { 16 } else { 1 };
        loop {
            let socket = tiercel_sys::udp::bind(addr, false).map_err(|source| ServerError::Listen { addr, source })?;
            let tcp = socket.local_addr().and_then(tcp::open);
            tries -= 1;
            if tcp.is_ok() || tries == 0 {
                return Ok((socket, tcp));
            }
        }
    }

    /// Replaces the configuration.
    pub fn with_config(mut self, config: ServerConfig) -> Server {
        self.config = config;
        self
    }

    /// Runs the exports' async procedures on the application's tokio runtime (a multi-threaded
    /// one, so that procedures run while the application's own tasks do) rather than on one the
    /// server starts for them (`ServerConfig::async_threads` threads, only when an export has async
    /// procedures). Crate feature `async`.
    #[cfg(feature = "async")]
    pub fn with_runtime(mut self, runtime: tokio::runtime::Handle) -> Server {
        self.runtime = Some(runtime);
        self
    }

    /// Shows every call, over every transport, to `interceptor` before its procedure runs (after
    /// its arguments arrived whole and its deadline was checked): `Ok(())` lets it run, `Err(why)`
    /// refuses it, and its caller gets [`CallError::Refused`](crate::CallError::Refused) with `why`
    /// (never ran; a client older than this answer gets `BadArguments`, never ran too). The
    /// interceptor sees the interface, the procedure, the caller ([`Caller`]) and the deadline,
    /// on the thread that would run the procedure: the place for authorization and for logging.
    /// A panic in it refuses the call. Refusals are counted in `ServerStats::refused`. Without an
    /// interceptor a call pays one branch (nothing measurable in the cost ledger, `docs/ledger.md`);
    /// with one on each side that lets the call through, a Null call took 10 ns more through
    /// shared memory (five runs: −13 to +22), and nothing visible more over UDP and TCP; in the
    /// ledger's tenth run, on an Intel VM, 111 ns more through shared memory, where the client's
    /// interceptor also takes the call off its short path (`ClientConfig::interceptor`).
    pub fn intercept(
        mut self,
        interceptor: impl Fn(&CallInfo) -> Result<(), String> + Send + Sync + 'static,
    ) -> Server {
        self.interceptor = Some(Arc::new(interceptor));
        self
    }

    /// Exports an interface: a generated `<Trait>Server` wrapping the implementation.
    pub fn export(mut self, export: impl Export) -> Server {
        self.exports.push(Arc::new(export));
        self
    }

    /// Exports an interface, as [`Server::export`], and registers it under `name` once the server
    /// has started, for as long as it runs (see [`crate::names`]): clients then import it by name
    /// (`Client::connect("accounts")`). Several servers may export one name; clients spread over
    /// them.
    pub fn export_as(mut self, name: &str, export: impl Export) -> Server {
        self.names.push((name.to_owned(), self.exports.len()));
        self.export(export)
    }

    /// Registers names in `registry` rather than in the default one (`TIERCEL_REGISTRY`, else this
    /// user's registry on this host).
    pub fn with_registry(mut self, registry: Registry) -> Server {
        self.registry = Some(registry);
        self
    }

    /// Starts the worker threads, then registers the exports' names.
    pub fn start(self) -> Result<RunningServer, ServerError> {
        let addr = self.socket.local_addr()?;
        for (i, (name, _)) in self.names.iter().enumerate() {
            if !crate::names::valid_name(name) {
                return Err(NameError::InvalidName(name.clone()).into());
            }
            if self.names[..i].iter().any(|(n, _)| n == name) {
                return Err(ServerError::DuplicateName(name.clone()));
            }
        }
        let own_key = self.config.key.as_ref().map(crate::Identity::public);
        for e in &self.config.endorsements {
            let reason = match own_key {
                _ if crate::secure::unix_now() > e.not_after => {
                    format!("ran out at {} (seconds since the Unix epoch)", e.not_after)
                }
                Some(own) if own == e.server => continue,
                Some(own) => format!("it endorses the key {}, not this server's {own}", e.server),
                None => "this server has no key (ServerConfig::key)".to_owned(),
            };
            return Err(ServerError::Endorsement { name: e.name.clone(), reason });
        }
        let registry = match (&self.registry, self.names.is_empty()) {
            (_, true) => None,
            (Some(r), false) => Some(r.clone()),
            (None, false) => Some(Registry::from_env()?),
        };
        let incarnation = u64::from_le_bytes(crate::random::bytes()?[..8].try_into().unwrap_or_default());
        let workers = self.config.workers.max(1);
        // Each socket has a worker to spare.
        let sockets = self.config.sockets.clamp(1, (workers / 2).max(1));
        let mut config = self.config;
        config.binding_idle = config.binding_idle.max(2 * config.timing.dead_after);
        let challenger = match config.secret {
            Some(_) => Some(crate::auth::Challenger::new()?),
            None => None,
        };
        let tcp_listener = match (config.tcp, self.tcp) {
            (true, Ok(l)) => Some(l),
            (true, Err(source)) => return Err(ServerError::ListenTcp { addr, source }),
            (false, _) => None,
        };
        let specs = self.exports.iter().map(|e| e.info().spec()).collect();
        let asynchronous = self.exports.iter().find(|e| e.has_async());
        #[cfg(not(feature = "async"))]
        if let Some(e) = asynchronous {
            return Err(ServerError::AsyncProcedures(e.info().name));
        }
        #[cfg(feature = "async")]
        let asynch = match asynchronous {
            Some(_) => Some(asynch::Runner::new(self.runtime, config.async_threads, config.max_async_calls)?),
            None => None,
        };
        let metrics =
            self.exports.iter().map(|e| crate::metrics::procedures(e.info(), "server", None, config.metrics)).collect();
        // A server that is to offer shared memory and cannot says so now, not by silence later.
        let listener = match config.shared_memory {
            true => Some(shm::open().map_err(ServerError::SharedMemory)?),
            false => None,
        };
        let endpoint = ServerEndpoint::new(
            EndpointConfig {
                incarnation,
                max_bindings: config.max_bindings,
                slots_per_binding: config.slots_per_binding,
                binding_memory: config.binding_memory,
                memory: config.message_memory,
                // No transport may take more than half: one transport's abuse leaves the others room.
                carrier_memory: config.message_memory / 2,
                stalled_after: config.stalled_call,
                binding_idle: config.binding_idle,
                // One worker for each socket is kept free to receive (probes, duplicates, and the
                // quick "busy" answer to new calls) when there are three or more.
                max_running: if workers >= 3 { workers - sockets } else { usize::MAX },
                timing: config.timing,
            },
            std::time::Instant::now(),
            Box::new(crate::auth::Challenger::new()?),
        );
        let spin_leases = crate::waiting::leases::SpinLeases::new(config.spinners.max(1));
        let more = tiercel_sys::udp::share_port(&self.socket, sockets - 1)
            .map_err(|source| ServerError::Listen { addr, source })?;
        let datagram = config.max_datagram;
        // The AF_XDP station asked for, steering the server's port, or why there is none.
        let xdp = config.xdp.as_deref().map(|ifname| {
            let station = crate::xdp::station_on(ifname)?;
            let port = crate::xdp::Port::open(&station, addr.port(), std::net::SocketAddrV4::new(0.into(), 0))
                .map_err(|e| format!("steering port {} to AF_XDP on {ifname}: {e}", addr.port()))?;
            Ok::<_, String>((station, port))
        });
        let (xdp, xdp_port, xdp_status) = match xdp {
            None => (None, None, None),
            Some(Ok((station, port))) => {
                let said = crate::xdp::describe(&station);
                (Some(station), Some(port), Some(Ok(said)))
            }
            Some(Err(why)) => (None, None, Some(Err(why))),
        };
        let lanes = std::iter::once(self.socket).chain(more).map(|s| udp::Lane::new(s, datagram)).collect();
        let shared = Arc::new(Shared {
            memory: endpoint.budget(),
            rendezvous: listener.as_ref().map(|l| (l.rendezvous, l.name.clone())),
            challenger,
            metrics,
            specs,
            endpoint,
            segmenting: AtomicBool::new(true),
            lanes,
            udp_running: (0..workers + udp::MAX_XDP_WORKERS).map(|_| udp::Running::default()).collect(),
            sessions: secure::Sessions::default(),
            handshakes: secure::HandshakeBudget::new(config.handshakes_per_second),
            config,
            exports: self.exports,
            incarnation,
            stop: AtomicBool::new(false),
            stopping: tiercel_sys::udp::Nudge::new()?,
            shutdown_by: std::sync::Mutex::new(None),
            spin_leases,
            crew: crate::waiting::crew::Crew::new(workers, sockets),
            stats: Arc::new(ServerCounters::default()),
            call_shards: Arc::default(),
            registrations: std::sync::Mutex::new(Vec::new()),
            binding_threads: std::sync::Mutex::new(Vec::new()),
            shm_bindings: AtomicUsize::new(0),
            shm_teams: std::sync::Mutex::new(Vec::new()),
            stream_bindings: AtomicUsize::new(0),
            #[cfg(feature = "async")]
            asynch,
            interceptor: self.interceptor,
            xdp,
            xdp_status,
            port: addr.port(),
        });
        let mut handles = Vec::with_capacity(workers);
        for i in 0..workers {
            let shared = shared.clone();
            let handle = std::thread::Builder::new()
                .name(format!("tiercel-worker-{i}"))
                .spawn(move || udp::UdpWorker::new(shared, i).run())?;
            handles.push(handle);
        }
        if let Some(port) = xdp_port {
            // Up to four AF_XDP workers: one reads, the others take over from a long call.
            let port = Arc::new(port);
            let n = workers.min(udp::MAX_XDP_WORKERS);
            let crew = Arc::new(udp::XdpCrew::new(n));
            for k in 0..n {
                let worker = udp::UdpWorker::new(shared.clone(), workers + k);
                let (port, crew) = (port.clone(), crew.clone());
                let handle = std::thread::Builder::new()
                    .name(format!("tiercel-xdp-{k}"))
                    .spawn(move || worker.run_xdp(port, crew, k))?;
                handles.push(handle);
            }
        }
        if let Some(listener) = listener {
            handles.push(shm::listen(&shared, listener)?);
        }
        let tcp = tcp_listener.as_ref().and_then(|l| l.local_addr().ok());
        if let Some(listener) = tcp_listener {
            handles.push(tcp::listen(&shared, listener)?);
        }
        let running = RunningServer { shared, handles, addr, tcp };
        if let Some(registry) = registry {
            // Clients on this host reach a server listening on every address through loopback.
            let reachable = match addr.ip() {
                std::net::IpAddr::V4(ip) if ip.is_unspecified() => (std::net::Ipv4Addr::LOCALHOST, addr.port()).into(),
                std::net::IpAddr::V6(ip) if ip.is_unspecified() => (std::net::Ipv6Addr::LOCALHOST, addr.port()).into(),
                _ => addr,
            };
            for (name, export) in &self.names {
                let info = running.shared.exports[*export].info();
                let exporter = Exporter {
                    name: name.clone(),
                    interface: info.name.to_owned(),
                    version: info.version,
                    fingerprint: info.fingerprint(),
                    addr: reachable,
                    incarnation,
                    pid: std::process::id(),
                    key: running.shared.config.key.as_ref().map(crate::Identity::public),
                    endorsement: running.shared.config.endorsements.iter().find(|e| e.name == *name).cloned(),
                };
                // On failure the running server is dropped: it stops, and the names it registered
                // go with it.
                let registration = registry.register(&exporter)?;
                running.shared.registrations.lock().unwrap_or_else(|p| p.into_inner()).push(registration);
            }
        }
        Ok(running)
    }
}

pub(crate) struct Shared {
    /// The AF_XDP station of `ServerConfig::xdp`, steering the server's port, when it could be
    /// opened: what arrives there is read by a worker of its own, and every datagram to a peer
    /// heard through it goes back through it.
    xdp: Option<Arc<crate::xdp::Station>>,
    /// What became of `ServerConfig::xdp`: the station (described), or why there is none.
    xdp_status: Option<Result<String, String>>,
    /// The server's port (of its UDP sockets, and TCP's).
    port: u16,
    /// The UDP sockets (`ServerConfig::sockets`), all on the server's port, and what the workers
    /// reading each share; the first is the one the server was bound with.
    lanes: Vec<udp::Lane>,
    /// What each UDP worker (socket readers first, then AF_XDP readers) is running: a call read
    /// from socket `i` as `i + 1`, nothing as 0 ([`udp::Running`]).
    udp_running: Box<[udp::Running]>,
    /// Whether result fragments may go out in runs of one segmented send (UDP GSO): until the
    /// kernel refuses one.
    segmenting: AtomicBool,
    config: ServerConfig,
    /// Makes and checks bind challenges when the server has a shared secret.
    challenger: Option<crate::auth::Challenger>,
    /// Shared-memory bindings being served.
    shm_bindings: AtomicUsize,
    /// Their teams, for a draining server to see whether any runs a call (`shm::calls_running`).
    shm_teams: std::sync::Mutex<Vec<std::sync::Weak<shm::Team>>>,
    /// TCP bindings (connections) being served.
    stream_bindings: AtomicUsize,
    /// Where clients on this host bind through shared memory, and the socket's name.
    rendezvous: Option<(tiercel_proto::bind::Rendezvous, String)>,
    /// The server-wide budget for messages (`ServerConfig::message_memory`), which every
    /// transport's share lies within (`ServerEndpoint::carrier_budget`).
    memory: Arc<tiercel_proto::endpoint::Budget>,
    exports: Vec<Arc<dyn Export>>,
    /// Each export's procedures' metrics handles, in the same order (feature `metrics`).
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    metrics: Vec<Vec<crate::metrics::Procedure>>,
    /// The exports as the bind machine sees them, in the same order.
    specs: Vec<tiercel_proto::bind::InterfaceSpec<'static>>,
    /// Routing, bindings and their slots, admission and expiry of the UDP transport.
    endpoint: ServerEndpoint<SocketAddr, Arc<dyn Export>>,
    incarnation: u64,
    stop: AtomicBool,
    /// Rung when the workers stop and never taken, so that it stays readable: the listeners of
    /// shared memory and TCP, and the UDP workers, wait on it beside their sockets, and stop at once.
    stopping: tiercel_sys::udp::Nudge,
    /// When a graceful shutdown must stop the workers even if calls are still running.
    shutdown_by: std::sync::Mutex<Option<std::time::Instant>>,
    /// Leave to spin (`ServerConfig::spinners`), for every transport's threads.
    spin_leases: Arc<crate::waiting::leases::SpinLeases>,
    /// Which workers read each socket.
    crew: crate::waiting::crew::Crew,
    stats: Arc<ServerCounters>,
    /// Calls counted by the threads that run them (shared-memory threads, UDP workers, TCP
    /// connections' threads), each on a counter of its own: part of `calls`.
    call_shards: Arc<crate::counters::Shards>,
    /// What every call is shown to before it runs ([`Server::intercept`]).
    interceptor: Option<Arc<intercept::Interceptor>>,
    /// The threads serving shared-memory and TCP bindings (finished ones are pruned as new ones
    /// start).
    binding_threads: std::sync::Mutex<Vec<JoinHandle<()>>>,
    /// The names registered for the exports: taken back when a shutdown begins.
    registrations: std::sync::Mutex<Vec<Registration>>,
    /// The runtime of async procedures, when an export has some.
    #[cfg(feature = "async")]
    asynch: Option<asynch::Runner>,
    /// The keys of the secure bindings (none without `ServerConfig::key`).
    sessions: secure::Sessions,
    /// Secure handshakes answered a second (`ServerConfig::handshakes_per_second`).
    handshakes: secure::HandshakeBudget,
}

/// Where a bind request came in, which decides what the bind machine asks of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Door {
    /// A plain UDP datagram.
    Udp,
    /// The first message of a secure handshake, over UDP.
    Sealed,
    /// The first message of a secure handshake, over a TCP connection.
    SealedTcp,
    /// A TCP connection.
    Tcp,
    /// The shared-memory rendezvous socket (this host's processes only).
    Shm,
}

/// A binding of the server's endpoint (of any transport), and one of a UDP binding's client slots.
pub(crate) type EndpointBinding = tiercel_proto::endpoint::Binding<SocketAddr, Arc<dyn Export>>;
pub(crate) type UdpSlot = tiercel_proto::endpoint::SlotCell<SocketAddr>;

impl Shared {
    /// Pins the calling thread, the server's `i`-th of its kind, to `ServerConfig::cpus[i % len]`
    /// (nothing when `cpus` is empty). Every thread that runs calls goes through here: the UDP
    /// and AF_XDP workers, TCP's pool threads, and each thread of a shared-memory binding, its
    /// helpers included (they were left unpinned, and ran 50 µs procedures on the clients' CPU).
    pub(crate) fn pin(&self, i: usize) {
        let cpus = &self.config.cpus;
        if !cpus.is_empty() {
            let _ = tiercel_sys::cpu::pin_current_thread(cpus[i % cpus.len()]);
        }
    }

    /// The way out through the AF_XDP station to `to`, when the server has one: the station sends
    /// only to a peer it heard, and leaves any other to the socket (`transmit::send_via`). `None`
    /// (one branch, for a server without one) sends through a socket.
    #[inline]
    pub(crate) fn via(&self, to: &SocketAddr) -> Option<crate::xdp::Via<'_>> {
        let station = self.xdp.as_deref()?;
        crate::xdp::via_heard(station, self.port, to)
    }

    /// The bind machine of this server, for requests that came through `door`.
    pub(crate) fn bind_machine(&self, door: Door) -> tiercel_proto::bind::BindServer<'_> {
        let auth = match (&self.config.secret, &self.challenger, door) {
            // The secret was the handshake's pre-shared key: proven already.
            (_, _, Door::Sealed | Door::SealedTcp) => None,
            (Some(secret), Some(challenges), _) => Some(tiercel_proto::bind::ServerAuth { secret, challenges }),
            _ => None,
        };
        let max_datagram = match door {
            Door::Udp => self.config.max_datagram,
            // Room for the envelope within the datagrams the workers receive.
            Door::Sealed => self.config.max_datagram - tiercel_proto::seal::SEAL_OVERHEAD,
            Door::Tcp | Door::SealedTcp | Door::Shm => 0,
        };
        let plain_refused = self.config.key.is_some() && !self.config.allow_plain;
        let key_required = plain_refused && matches!(door, Door::Udp | Door::Tcp);
        tiercel_proto::bind::BindServer {
            exports: &self.specs,
            auth,
            incarnation: self.incarnation,
            max_datagram,
            key_required,
            key: self.config.key.as_ref().map(crate::Identity::public_bytes),
            // Only UDP's plain packets carry a checksum trailer.
            trailers: door == Door::Udp,
        }
    }

    /// The metrics handles of `export`'s procedures (none without feature `metrics`).
    pub(crate) fn procedure_metrics(&self, export: &Arc<dyn Export>) -> &[crate::metrics::Procedure] {
        #[cfg(feature = "metrics")]
        {
            if !self.config.metrics {
                return &[];
            }
            let at = Arc::as_ptr(export) as *const ();
            let found = self.exports.iter().position(|e| Arc::as_ptr(e) as *const () == at);
            found.map_or(&[], |i| &self.metrics[i])
        }
        #[cfg(not(feature = "metrics"))]
        {
            let _ = export;
            &[]
        }
    }

    /// The keys of `binding`, when it is a secure one (one branch for a plain binding).
    pub(crate) fn session_of(&self, binding: &EndpointBinding) -> Option<Arc<crate::secure::Session>> {
        if !binding.caller.is_some_and(|c| c.is_sealed()) {
            return None;
        }
        self.sessions.get(binding.id)
    }

    /// Counts a bind request answered without a binding.
    pub(crate) fn count_refusal(&self, refused: tiercel_proto::bind::Refused) {
        use tiercel_proto::bind::Refused;
        let counter = match refused {
            Refused::Challenged => &self.stats.challenged,
            Refused::AuthFailed => &self.stats.auth_failed,
            Refused::UnknownInterface
            | Refused::VersionMismatch
            | Refused::InterfaceMismatch
            | Refused::ProtocolVersion => &self.stats.rejected,
            // Not a bind: nothing refused.
            Refused::Listed | Refused::KeyTold => return,
            Refused::KeyRequired => &self.stats.key_required,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Reads a server's counters from anywhere, for as long as it is kept ([`RunningServer::stats_handle`]).
#[derive(Debug, Clone)]
pub struct StatsHandle(Arc<ServerCounters>, Arc<crate::counters::Shards>);

impl StatsHandle {
    /// The counters as they stand now.
    pub fn get(&self) -> ServerStats {
        stats(&self.0, &self.1)
    }
}

/// The counters as they stand now, with the calls counted apart (`Shared::call_shards`).
fn stats(counters: &ServerCounters, shards: &crate::counters::Shards) -> ServerStats {
    let mut stats = counters.snapshot();
    stats.calls = stats.calls.wrapping_add(shards.sum());
    stats
}

crate::counters::counters! {
    /// The counters of a running server, bumped as it goes (read through [`ServerStats`]).
    ServerCounters,
    /// Counters of a running server, as they stood when read ([`RunningServer::stats`]).
    ServerStats {
        /// Calls run (procedure bodies entered).
        calls,
        /// Call packets received again (a fragment already held, a call already running or finished),
        /// dropped or answered from saved state, never run again. A fragment received for the first
        /// time is not counted.
        duplicates,
        /// Result fragments sent again (for duplicates, probes, acknowledgements asking for them); a
        /// fragment sent for the first time, when an acknowledgement opens the window, is not counted.
        resent,
        /// Packets dropped because they failed validation (bad header, truncated, inconsistent fragment).
        malformed,
        /// Packets refused with a `Reject` (unknown binding, old incarnation, bad slot).
        rejected,
        /// Procedures that panicked.
        panics,
        /// New calls refused as busy: every worker that may run calls was running one, or the
        /// memory budgets (`binding_memory`, `message_memory`) had no room for the call's fragments.
        busy,
        /// New calls refused `TooLarge` without running: longer than the message limit
        /// (`Timing::max_message`), or than their binding's memory could ever hold (the least of
        /// `binding_memory` and the parts of `message_memory` it lies within). Not tried again.
        too_large,
        /// Bindings granted.
        bindings,
        /// Bindings forgotten after `binding_idle` without a packet.
        expired,
        /// Multi-packet calls given up after `stalled_call` without a fragment, their memory reclaimed.
        reclaimed,
        /// Packets from an address that had not proven it receives for their client slot, answered
        /// with a challenge (each thread of a client pays one on its first call; a spoofed source gets
        /// nothing more).
        challenged_addresses,
        /// Bind requests answered with a challenge for the shared secret.
        challenged,
        /// Bind requests whose proof of the shared secret was wrong or stale.
        auth_failed,
        /// Bind requests that came plain to a server that takes only secure bindings
        /// (`ServerConfig::key` without `allow_plain`), refused with `KeyRequired`.
        key_required,
        /// Secure bindings made (handshakes answered with a grant).
        handshakes,
        /// Handshakes dropped unanswered: they did not open with this server's key and secret
        /// (another server's key, another secret, changed on the way), or came faster than
        /// `ServerConfig::handshakes_per_second`.
        handshakes_dropped,
        /// Sealed packets dropped before anything ran: they did not open with their binding's keys
        /// (a bit changed on the way, forged, another binding's), their number was seen before (a
        /// replay, a duplicate) or left behind by the replay window, or they named no secure
        /// binding; and plain packets naming a secure binding.
        unopened,
        /// Calls answered `DeadlineExceeded` without running: their deadline had passed when they
        /// were about to start.
        late,
        /// Calls the server's interceptor ([`Server::intercept`]) refused before they ran.
        refused,
        /// Calls their clients gave up: through shared memory, those answered `Cancelled` without
        /// running, and async procedures aborted; over UDP, the `Cancel` packets received (each drops
        /// the call's partial message or saved result, if the server holds one, and aborts an async
        /// procedure running it; a plain procedure running runs to its end).
        cancelled,
        /// Receives that brought a run of several datagrams at once (UDP generic receive offload: the
        /// fragments a client sent with one segmented send, on paths of small datagrams, or the calls
        /// of a client's threads sent together).
        coalesced,
        /// Receives that brought several datagrams at once (`recvmmsg`): calls had queued while the
        /// worker was busy.
        batched,
        /// Results sent together with others at the end of a batch: by one `sendmmsg`, or, those
        /// for one address, by one segmented send; over TCP, with one `write`, the results of
        /// calls read together and run in turn by the thread that read them.
        sent_together,
        /// Datagrams of a batch left to other workers, because the worker that received them was about
        /// to run a procedure that may be slow.
        handed_off,
        /// Call fragments received straight into their place in the call's reassembly (the next
        /// fragments of a large call, expected by the worker that took the one before): the kernel's
        /// copy of their bytes is the only one.
        landed,
        /// Large calls whose procedure ran on its `InOut` buffer where the call's fragments were put
        /// together (over TCP: where its frame was read; through shared memory: in the private copy of
        /// its arguments), the result sent back from there: the buffer went back without a copy.
        in_place,
        /// Bytes of shared-memory slot pages given back to the kernel after calls with large arguments
        /// and small results: at most once a second for a slot, and after every such call while the
        /// binding holds more than three quarters of its `binding_memory` (its calls are then faulted
        /// in anew, and zeroed: a count that grows with every large call says the budget is too small
        /// for the calls).
        given_back,
    }
}

/// Starts a thread with `spawn` and keeps its handle in `threads`, to be joined when the server
/// stops (handles of threads that have ended are dropped first). The list's room is made before the
/// thread starts: on a machine too busy to run this thread again soon, a push made after it started
/// could come among that thread's first calls, which are to allocate nothing (the no-allocation
/// test once failed on one allocation of 96 bytes, the size of a list's first room for four handles).
pub(crate) fn spawn_kept(
    threads: &std::sync::Mutex<Vec<JoinHandle<()>>>,
    spawn: impl FnOnce() -> std::io::Result<JoinHandle<()>>,
) -> std::io::Result<()> {
    let mut kept = threads.lock().unwrap_or_else(|p| p.into_inner());
    kept.retain(|t| !t.is_finished());
    kept.reserve(1);
    kept.push(spawn()?);
    Ok(())
}
