//! Configuration of clients and servers, with defaults suited to a low-latency LAN or loopback.

use std::time::Duration;

pub use tiercel_proto::Timing;

/// How a thread waits for a packet: spin on a non-blocking receive, then block.
///
/// A caller blocked for its result over UDP waits in the receive itself, one system call where
/// `poll` and a receive after it take two (on our VM a blocking Null call went from 1.10× the raw
/// blocking ping-pong to 1.05×, the medians of seven runs each). The
/// socket's read timeout wakes it at the latest after a tick of the kernel's clock (4 ms at 250 Hz)
/// to look at the call's timers, so a retransmission or a probe may go out up to that much later
/// than its timer says; a call whose deadline comes sooner waits in `poll` for it, and a call keeps
/// its deadline either way. A caller through AF_XDP, or receiving a result of several fragments,
/// waits in `poll`.
///
/// On a virtual machine a blocked thread can take ~90 µs to wake while a spinning one answers in a
/// fraction of a microsecond, so spinning for about the expected wait wins whenever the wait is short
/// (Thekkath & Levy §3.1.2). Spinning burns the core it runs on. While more than one calling thread
/// of the process spins, each yields the CPU (`sched_yield`) between its looks at the result, so
/// that callers sharing a CPU take turns sending their calls instead of spinning out their time slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spin {
    /// Block at once. Over UDP, while other callers of the process wait for their results, a
    /// caller first takes up to four turns among them, each a yield of the CPU (`sched_yield`)
    /// and a look, so that a result that comes while they run is taken without a wake-up; a
    /// caller alone blocks at once.
    Never,
    /// Spin this long, then block. Over UDP, also this long from each packet of a multi-packet
    /// exchange that arrives.
    Fixed(Duration),
    /// Spin twice the recent round-trip time (a moving average) plus 50 µs, about what a wake-up
    /// from blocking costs on a VM, at most `max`; block at once while round trips take longer than
    /// `max`. Over UDP, while a call's packets keep coming (the acknowledgements of a multi-packet
    /// call, the fragments of a multi-packet result), also spin 50 µs (at most `max`) from each.
    Adaptive {
        /// Longest spin.
        max: Duration,
    },
}

impl Default for Spin {
    fn default() -> Spin {
        Spin::Adaptive { max: Duration::from_micros(200) }
    }
}

/// Client settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConfig {
    /// How a calling thread waits for its result. Default: adaptive, at most 200 µs, then block.
    pub spin: Spin,
    /// Protocol timers and limits; `timing.dead_after` bounds how long a call to a dead server waits.
    /// Default: [`Timing::default`] (retransmission after 20 ms, doubling up to 500 ms; probes every
    /// 500 ms; dead after 5 s of silence; 32 fragments in flight; messages up to 16 MiB + 4 KiB).
    pub timing: Timing,
    /// Largest datagram to send or accept; the path MTU found at bind time may lower it. Default:
    /// 65,507 bytes (the most a UDP datagram over IPv4 carries).
    pub max_datagram: usize,
    /// Deadline applied to every call, unless a binding sets its own. Default: none.
    pub deadline: Option<Duration>,
    /// Over UDP, end every packet of the binding, both ways, with a CRC32C checksum, and drop packets
    /// that fail it. UDP's own checksum already catches corruption on the wire (loopback skips it);
    /// this one also catches corruption below or beside the network stack, for about 50 ns per 1,500
    /// bytes: a Null call took 0.17 µs more in the cost ledger's first run and 54 ns more in its
    /// tenth, on an Intel VM (`docs/ledger.md`). Bindings over TCP and through shared memory carry
    /// no such checksum, and cost nothing more. Default: off.
    pub checksum: bool,
    /// The shared secret to prove when a server asks for one at bind time. With a secret the client
    /// also requires the server to prove it back, so it binds only to a holder of the secret. It is
    /// proven once, at bind time: calls cost nothing more (`docs/ledger.md`). Default: none.
    pub secret: Option<crate::Secret>,
    /// Over UDP, the calling threads of a binding beyond its first share one socket, so that their
    /// calls go out together and their results come back together: a call made while others of
    /// the socket wait for theirs joins the batch the first of them to look for its result sends
    /// (one segmented send, UDP GSO), the server sends the batch's results back the same way, and
    /// whichever thread looks at the socket takes them all (UDP GRO) and hands each to its thread.
    /// On our VM, eight threads on one binding made about 1.5 times the Null calls a second of
    /// eight threads with a socket each, and two threads a few percent fewer (`docs/ledger.md`).
    /// The binding's first thread keeps a socket of its own, and a lone caller's path is
    /// unchanged. Bindings that do not spin ([`Spin::Never`]), secure bindings, bindings with
    /// checksums and those through AF_XDP send each thread's calls from its own socket. `false`:
    /// every thread its own socket. Default: on.
    pub batch_threads: bool,
    /// When the address lets the binder choose, bind through shared memory if the server is on this
    /// host and offers it (else UDP). `false` always chooses UDP. Default: on.
    pub shared_memory: bool,
    /// When the address lets the binder choose and the server does not answer the bind request
    /// over UDP (a firewall or NAT drops datagrams; it takes `timing.dead_after`), bind over TCP
    /// to the same address and port instead. `tcp://host:port` binds over TCP at once. Default: on.
    pub tcp_fallback: bool,
    /// Record each call's outcome and time through the `metrics` facade, labelled with the
    /// interface, procedure and server (`tiercel_client_calls_total`, `tiercel_client_call_seconds`),
    /// in the recorder installed when the binding is made. Only with the crate feature `metrics`;
    /// costs two clock reads and a histogram record per call, and takes calls through shared memory
    /// off their short path (`Binding::call_plain`): with the server's metrics on too, a Null call
    /// into a Prometheus recorder took 0.26 µs more through shared memory, 0.38 µs over UDP and
    /// 0.26 µs over TCP in the cost ledger's fifth run, and 0.38, 0.21 and 0.30 µs more in its
    /// tenth, on an Intel VM (`docs/ledger.md`). Default: off.
    pub metrics: bool,
    /// Bind again by itself when a call finds the server gone (`ServerRestarted`, `UnknownBinding`,
    /// `Unreachable`, `ServerGone`): that call fails as it would anyway, saying whether it may have
    /// run (it is never sent again), and the binding's next call first binds again, to the same
    /// address or, imported by name, to one of the name's live exporters, choosing the transport
    /// as the first bind did (shared memory when the server is on this host). Imported by name from
    /// etcd, the binding also watches the name, and its next call binds to a live exporter first
    /// once its exporter's entry is gone (revoked at shutdown, or its lease ran out). A binding over UDP
    /// to a server on this host that refused shared memory tries it again at most once a second
    /// ([`Binding::shared_memory_refused`](crate::Binding::shared_memory_refused) says why not
    /// yet). Costs each call a lock and a few reference counts, and through shared memory the short
    /// path (`Binding::call_plain`): 73 ns a Null call through shared memory in the cost ledger's
    /// fifth run, lost in the noise over UDP and TCP there; 166 ns through shared memory, 117 over
    /// UDP and 83 over TCP in its tenth, on an Intel VM (`docs/ledger.md`). Default: off (a binding
    /// whose server went away fails every call until the application imports again), because the
    /// binding then goes to whoever answers at the address or name. Made to an address of this
    /// host, the binding notes whose process serves the port (the kernel's socket tables, read at
    /// the bind) and binds again only to a process of the same user: another user's process that
    /// took the dead server's port gets no call, and the call fails with
    /// [`BindError::AnotherOwner`] (never ran). A name's exporters are those its registry trusts
    /// (see [`crate::names`]). To a server of another host, only a shared secret, which the server
    /// must prove it holds, keeps the calls from a process that took the dead server's port.
    ///
    /// [`BindError::AnotherOwner`]: crate::BindError::AnotherOwner
    pub rebind: bool,
    /// Shown every call of the binding before it is sent (see [`crate::Client::intercept`]);
    /// a refusal fails the call with [`crate::CallError::Intercepted`], never sent. Costs a call one
    /// branch when absent; present, it is the interceptor's own time and, through shared memory, the
    /// short path (`Binding::call_plain`): the cost ledger's `intercept` line, both sides'
    /// interceptors, +62 ns a shared-memory Null in its fifth run and +111 ns in its tenth, on an
    /// Intel VM (`docs/ledger.md`). Default: none.
    pub interceptor: Option<crate::ClientInterceptor>,
    /// The public key of the server: with one, the client binds only to a server that proves it
    /// holds the matching private key. Over UDP and TCP the bind is then a Noise handshake and
    /// everything the binding sends, both ways, is sealed (encrypted and authenticated, `cipher`):
    /// every packet over UDP, the byte stream in records over TCP; a server that cannot prove the
    /// key is never bound (`BindError::KeyNotProven`). Through shared memory it binds only when the
    /// server's own sealed answer named the rendezvous. See `docs/security.md`. Costs a Null call
    /// 536 ns more over UDP (1.06 times) and 1,034 ns more over TCP (1.10 times) in the cost
    /// ledger's seventh run, 584 ns (1.15 times) and 793 ns (1.12 times) in its tenth, on an Intel
    /// VM whose calls are quicker (`docs/ledger.md`), nothing measurable through shared memory, and
    /// each bind a handshake (four X25519 operations a side). Default: none (plain).
    pub server_key: Option<crate::PublicKey>,
    /// This client's own static key pair, which a secure binding's server learns (and a procedure
    /// sees through [`crate::caller`]). Without one, the process makes one key pair the first time
    /// it binds securely and uses it for every secure binding. Default: none.
    pub key: Option<crate::Identity>,
    /// The AEAD that seals a secure binding's packets (see [`crate::Cipher`]). Default: AES-256-GCM.
    pub cipher: crate::Cipher,
    /// Authorities whose endorsements this client trusts (see [`crate::Endorsement`]). With any, an
    /// import by name without `server_key` binds to an exporter only with the key its registry
    /// entry carries, and only when an authority given here endorsed that key for the name and the
    /// endorsement has not run out, whatever the registry (etcd without authentication included);
    /// an exporter whose entry fails that is passed over and counted
    /// ([`crate::Client::exporters_refused`]; [`crate::BindError::NotEndorsed`] if none is left).
    /// Checked once a bind, never a call. Default: none (the key of an entry is used only from a
    /// registry that vouches for its entries, [`crate::names::Registry::vouches`]).
    pub authorities: Vec<crate::AuthorityKey>,
    /// Servers' keys pinned on first use (see [`crate::KnownServers`]), for binds with no key
    /// from elsewhere (`server_key`, `authorities`). The first bind to an address or name asks
    /// the server for its key (plain: the key of a name's entry instead, where its registry
    /// vouches for it), binds securely with it, and once the server has proven it, writes it to
    /// the file; every later bind there, re-binds included, binds only to a server that proves
    /// that key ([`crate::BindError::KeyChanged`] otherwise). First use trusts whoever answers:
    /// an attacker on the path then can pin its own key. Costs the first bind a round trip more;
    /// later binds read the file; calls, nothing. Default: none.
    pub known_servers: Option<crate::KnownServers>,
}

impl Default for ClientConfig {
    fn default() -> ClientConfig {
        ClientConfig {
            spin: Spin::default(),
            timing: Timing::default(),
            max_datagram: MAX_UDP_PAYLOAD,
            deadline: None,
            checksum: false,
            secret: None,
            batch_threads: true,
            shared_memory: true,
            tcp_fallback: true,
            metrics: false,
            rebind: false,
            interceptor: None,
            server_key: None,
            key: None,
            cipher: crate::Cipher::default(),
            authorities: Vec::new(),
            known_servers: None,
        }
    }
}

pub use tiercel_proto::wire::MAX_UDP_PAYLOAD;

/// The default largest call or result message (`Timing::max_message`): 16 MiB of data, and 4 KiB
/// more for the marshaling around it, so that a 16 MiB buffer goes whole.
pub const MAX_MESSAGE: usize = tiercel_proto::timing::MAX_MESSAGE;

/// Server settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Most worker threads receiving and running UDP calls. One reads each socket (see `sockets`;
    /// spinning, then blocking) and runs each call it reads inline; the others stand by, parked,
    /// and cost nothing per call. While every worker reading a socket has been running one call for
    /// about a millisecond, or running calls while more datagrams wait there, another takes over
    /// reading it, so that a long procedure holds up only its own caller and calls whose procedures
    /// block run side by side; a reading worker that has found nothing to read for 8 ms while
    /// another of its socket is free stands by again. With three or more, one for each socket is
    /// always kept free to receive: a new call arriving while all the others run procedures is
    /// refused at once as busy, and its client backs off and retries. Also the most threads one
    /// TCP connection gets while its calls are slow (at least two), and the most threads
    /// serving one shared-memory binding while its calls are slow (no more than its slots). Default: 16.
    pub workers: usize,
    /// Most threads serving TCP connections at once, all connections together. A bound connection
    /// has no thread while idle (parked); when its client sends, it gets one of these, and a
    /// connection whose calls are slow gets more (up to `workers`). When all are taken, the
    /// connections that sent wait in line, and a thread whose connection has nothing to do gives
    /// its thread to the next. Default: 64.
    pub connection_threads: usize,
    /// How long an idle worker spins for the next packet before blocking. A shared-memory binding's
    /// thread spins at most this long after each call (see `adaptive_spin`), then sleeps on a
    /// futex (zero: it sleeps after every call, and its clients publish each call with a full
    /// fence, where a server that spins issues a system-wide barrier before each sleep); a TCP
    /// connection's reader spins this long after each frame. Only while it holds one of
    /// `spinners` leases: otherwise it blocks at once. A UDP worker done with the datagrams it
    /// found, spinning or not, looks at its socket ten times before it blocks, so that calls
    /// streaming in from several callers find it awake (nine system calls a call more for a lone
    /// caller, after its result went out); it blocks first in a receive of the socket, for up to
    /// a tick of the kernel's clock, then in `epoll`. Default: 1 ms.
    pub spin: Duration,
    /// Most threads of the server spinning at once, UDP workers, shared-memory binding threads
    /// and TCP connection readers together, so that waiting threads never take every core from
    /// the callers and from each other. Default: one less than the CPUs this process may run on,
    /// at least 1.
    pub spinners: usize,
    /// UDP sockets the server reads, all bound to its port (`SO_REUSEPORT`). The kernel gives the
    /// datagrams of each client socket (each thread of a client has its own) to one of them, by a
    /// hash of the addresses, and each socket has a worker of its own reading it, so the calls of
    /// many clients can be received and run on as many cores, without one shared queue (not
    /// measured on more than two CPUs). The workers
    /// standing by take over on whichever socket has calls held up (see `workers`), and the
    /// admission keeps one worker free to receive for each socket. At most half of `workers`, so
    /// that each socket has a worker to spare; at least 1. While there are several, another
    /// process of the same user may bind the port too and take a share of its datagrams (the
    /// kernel refuses other users, and with one socket refuses everyone). Default: one less than
    /// the CPUs this process may run on, at least 1 (as `spinners`).
    pub sockets: usize,
    /// CPUs the threads that run calls are pinned to: UDP worker `i` (and AF_XDP's) to
    /// `cpus[i % cpus.len()]`, the threads of TCP connections and of shared-memory bindings (their
    /// helpers too) round robin by binding; empty leaves placement to the kernel. Default: empty.
    pub cpus: Vec<usize>,
    /// Client slots per binding: the most threads of one client that can call at once. Default: 64
    /// (also the most a shared-memory binding has).
    pub slots_per_binding: u32,
    /// Most bindings held at once, of every transport together (UDP, TCP and shared memory share
    /// one table of bindings). Default: 4,096.
    pub max_bindings: usize,
    /// Largest datagram to send or accept. Default: 65,507 bytes.
    pub max_datagram: usize,
    /// Protocol limits (message size, window). Default: [`Timing::default`] (messages up to 16 MiB).
    pub timing: Timing,
    /// Bytes one binding may hold in multi-packet calls being reassembled and results being sent.
    /// Default: 64 MiB.
    pub binding_memory: usize,
    /// Bytes all bindings together may hold in such messages, whatever their number (through
    /// shared memory: slot pages and private copies), with the arguments of the async procedures
    /// running: a call that would take more is refused as busy, unread (its client backs off and
    /// tries again, and fails with `CallError::Overloaded` after `dead_after` of refusals), or,
    /// when no budget could ever hold it (more than `binding_memory`, or than its binding's part
    /// of this budget), `CallError::TooLarge` at once; a result that would is replaced by
    /// `CallError::ResultTooLarge`. A call being reassembled is charged for the fragments that
    /// have arrived, not for the size its header claims. The bindings of one transport (UDP, TCP,
    /// shared memory) may hold at most half of it together, so that one transport's abuse leaves
    /// the others room for their calls.
    /// Default: 256 MiB.
    pub message_memory: usize,
    /// A multi-packet call whose client has sent nothing more for this long is given up and its
    /// memory reclaimed (checked about once a second); the client's next fragment is refused as
    /// busy, and it sends the call again from the start. Default: 1 s.
    pub stalled_call: Duration,
    /// A binding from which nothing has been heard for this long is forgotten, with its slots and
    /// saved results (a client that died, or stopped calling). Its client's next call fails with
    /// `CallError::UnknownBinding` and imports again (over TCP, the connection is closed: the
    /// next call fails with `CallError::ConnectionLost`, not sent). Never less than twice
    /// `timing.dead_after`, so that a client still retrying a call has given up before its binding
    /// can go. Default: 10 minutes.
    pub binding_idle: Duration,
    /// A shared secret every client must prove before it gets a binding (see `docs/security.md`).
    /// Without one, any client that can reach the server may bind. Default: none.
    pub secret: Option<crate::Secret>,
    /// Whether a shared-memory binding's thread adapts its spin to the gaps between calls (twice the
    /// recent gap plus 50 µs, at most `spin`; no spin at all while gaps are longer than `spin`), or spins
    /// `spin` after every call. Default: adaptive.
    pub adaptive_spin: bool,
    /// Also offer shared-memory bindings to clients on this host (through an abstract UNIX socket
    /// whose name is random for each start and told to clients on this host over UDP, in the
    /// server's network namespace). A server that cannot offer them fails to start. Default: on.
    pub shared_memory: bool,
    /// Also serve over TCP, on the port number of the UDP socket, for clients that UDP does not
    /// reach (`tcp://host:port`, or a UDP bind that got no answer): one connection per binding,
    /// served by one thread, and by up to `workers` while its calls are slow (see
    /// `docs/protocol.md`, TCP). A server that cannot listen there fails to start. Default: on.
    pub tcp: bool,
    /// Record each procedure's outcome and run time through the `metrics` facade, labelled with
    /// the interface and procedure (`tiercel_server_calls_total`, `tiercel_server_call_seconds`), in
    /// the recorder installed when the server starts. Only with the crate feature `metrics`; costs
    /// two clock reads and a histogram record per call (for both sides' figures together, see
    /// `ClientConfig::metrics`). Default: off.
    pub metrics: bool,
    /// How long a graceful shutdown ([`crate::ShutdownHandle::shutdown`]) waits for the calls under
    /// way to finish before the workers stop anyway. Default: 5 s.
    pub shutdown_grace: Duration,
    /// Threads of the tokio runtime the server starts for async procedures (crate feature
    /// `async`; only when an export has some, and no runtime was given with
    /// `Server::with_runtime`). Default: 2.
    pub async_threads: usize,
    /// Most async procedures running at once; a call beyond is refused as busy (its client backs
    /// off and tries again). Each holds a task and its arguments. Default: 4,096.
    pub max_async_calls: usize,
    /// The server's static key pair: with one, it takes secure bindings over UDP and TCP (a Noise
    /// handshake at bind time, then every packet or frame sealed: `docs/security.md`), and, unless
    /// `allow_plain`,
    /// refuses plain bindings over UDP and TCP (`BindError::KeyRequired`). Shared-memory bindings,
    /// which the kernel keeps private to the two processes, are still granted to processes on this
    /// host. Default: none.
    pub key: Option<crate::Identity>,
    /// With a `key`, grant plain bindings too. Default: off.
    pub allow_plain: bool,
    /// Authorities' endorsements of this server's `key` for the names it exports
    /// (`Server::export_as`): each name's registry entry carries the endorsement made for it, so
    /// that clients trusting the authority (`ClientConfig::authorities`) bind to this server by
    /// name. The server does not start with an endorsement of another key than its own, or one
    /// that has run out. Default: none.
    pub endorsements: Vec<crate::Endorsement>,
    /// Most secure handshakes answered a second (each costs the server two X25519 operations
    /// before the client has proven anything, and two more and a key pair to answer: about a third
    /// of a millisecond of CPU on this project's machines); beyond, they are dropped and counted,
    /// and their clients retransmit (over TCP, the connection closes unanswered and the client
    /// tries again on a new one). One sender's address gets at most a quarter of them, so that a
    /// flood from one address leaves the rest to clients at others (clients behind one address, a
    /// NAT's, share its quarter). Default: 1,000.
    pub handshakes_per_second: u32,
    /// An interface (of the server's network namespace) whose UDP datagrams to the server's port
    /// are read and answered through an AF_XDP socket instead of the kernel's UDP stack (crate
    /// feature `xdp`; root, or `CAP_NET_ADMIN`, `CAP_NET_RAW` and `CAP_BPF`). tiercel's XDP program
    /// is attached to it, in the driver's hook where the driver has one, and workers of their own
    /// (up to four) serve its sockets, one on each receive queue (64 at most): one reads, spinning
    /// for `spin` after each datagram, then blocking; another reads in its stead while it runs a
    /// long call (within about 17 ms of its start). Clients reach it with `xdp://` addresses, or
    /// through the kernel on their side; datagrams that arrive on another interface (loopback) go
    /// to the server's socket as ever. A server that cannot open it (no privilege, another program
    /// attached, a build without the feature) serves through the kernel and says why
    /// ([`RunningServer::xdp`](crate::RunningServer::xdp)). Costs nothing per call when `None`,
    /// the default (one branch); with it, every datagram the server sends goes to the station
    /// first, which looks the peer up (a hash lookup under a lock) and leaves a peer it never heard
    /// to the server's socket.
    pub xdp: Option<String>,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            workers: 16,
            connection_threads: 64,
            spin: Duration::from_millis(1),
            spinners: default_spinners(),
            sockets: default_spinners(),
            cpus: Vec::new(),
            slots_per_binding: 64,
            max_bindings: 4096,
            max_datagram: MAX_UDP_PAYLOAD,
            timing: Timing::default(),
            binding_memory: 64 << 20,
            message_memory: 256 << 20,
            stalled_call: Duration::from_secs(1),
            binding_idle: Duration::from_secs(600),
            secret: None,
            adaptive_spin: true,
            shared_memory: true,
            tcp: true,
            metrics: false,
            shutdown_grace: Duration::from_secs(5),
            async_threads: 2,
            max_async_calls: 4096,
            key: None,
            allow_plain: false,
            endorsements: Vec::new(),
            handshakes_per_second: 1000,
            xdp: None,
        }
    }
}

/// The default number of spinners (and of sockets): one less than the CPUs this process may run
/// on, at least one.
pub(crate) fn default_spinners() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().saturating_sub(1)).max(1)
}
