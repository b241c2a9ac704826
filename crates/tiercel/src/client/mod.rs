//! The client: importing an interface (binding), and the per-thread endpoints calls go through.

mod call;
mod endpoint;
mod shm;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tiercel_proto::control::{parse_bind_challenge, parse_bind_reject, BindProof, BindReply, BindRequest};
use tiercel_proto::wire::{Header, Kind, Packet, Status, HEADER_LEN};
use tiercel_sys::udp;

pub use call::{Call, Reply};

use crate::address::{ToAddress, Transport};
use crate::config::ClientConfig;
use crate::interface::{Import, InterfaceInfo};
use crate::Error;

/// A client of one server: imports interfaces from it.
#[derive(Debug, Clone)]
pub struct Client {
    server: SocketAddr,
    transport: Option<Transport>,
    config: ClientConfig,
}

impl Client {
    /// A client of the server at `addr`: a `SocketAddr` or `"host:port"` (shared memory if the server
    /// is on this host, else UDP), `"udp://host:port"` or `"shm:host:port"`. Nothing is sent until
    /// [`Client::import`].
    pub fn connect(addr: impl ToAddress) -> Result<Client, Error> {
        let (transport, server) = addr.to_address()?;
        Ok(Client { server, transport, config: ClientConfig::default() })
    }

    /// Replaces the configuration used by later imports.
    pub fn with_config(mut self, config: ClientConfig) -> Client {
        self.config = config;
        self
    }

    /// The server's address.
    pub fn server(&self) -> SocketAddr {
        self.server
    }

    /// Binds to interface `T` on the server: one round trip that checks the interface and its version
    /// and returns the generated client stub.
    pub fn import<T: Import>(&self) -> Result<T, Error> {
        Binding::bind(self.server, self.transport, T::INFO, self.config.clone()).map(T::from_binding)
    }
}

/// Counters of a binding's slow path, summed over its threads.
#[derive(Debug, Default)]
pub struct ClientStats {
    /// Packets retransmitted: call fragments, probes, result requests.
    pub retransmissions: AtomicU64,
    /// Packets that failed header validation, or arrived truncated.
    pub malformed: AtomicU64,
    /// Valid packets not for the current call (late duplicates, old results).
    pub stale: AtomicU64,
}

static NEXT_UID: AtomicU64 = AtomicU64::new(1);

pub(crate) struct BindingInner {
    uid: u64,
    server: SocketAddr,
    id: u32,
    token: u128,
    incarnation: u64,
    max_datagram: usize,
    slots: u32,
    /// Returned client slots with the next sequence number each must use.
    free_slots: Mutex<(Vec<(u32, u32)>, u32)>,
    /// The shared region, when the binding is through shared memory.
    shm: Option<shm::Link>,
    config: ClientConfig,
    info: &'static InterfaceInfo,
    stats: ClientStats,
}

impl BindingInner {
    /// A client slot for a new thread endpoint, with the sequence number it must use next.
    pub(crate) fn take_slot(&self) -> Result<(u32, u32), Error> {
        let mut free = self.free_slots.lock().unwrap_or_else(|p| p.into_inner());
        match free.0.pop() {
            Some(s) => Ok(s),
            None if free.1 < self.slots => {
                free.1 += 1;
                Ok((free.1 - 1, 0))
            }
            None => Err(Error::NoFreeSlot(self.slots)),
        }
    }

    /// Returns a slot taken with [`BindingInner::take_slot`].
    pub(crate) fn give_slot(&self, slot: u32, seq: u32) {
        self.free_slots.lock().unwrap_or_else(|p| p.into_inner()).0.push((slot, seq));
    }
}

/// A binding to an interface exported by a server: what a generated client stub holds.
///
/// Cloning is cheap and clones share the binding. Each thread that calls through a binding gets its
/// own client slot, socket and buffers on its first call, and keeps them for later calls.
#[derive(Clone)]
pub struct Binding {
    inner: Arc<BindingInner>,
    deadline: Option<Duration>,
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
    fn bind(
        server: SocketAddr,
        transport: Option<Transport>,
        info: &'static InterfaceInfo,
        config: ClientConfig,
    ) -> Result<Binding, Error> {
        let try_shm = match transport {
            Some(Transport::SharedMemory) => true,
            Some(Transport::Udp) => false,
            None => config.shared_memory,
        };
        if try_shm {
            match shm::connect(server) {
                Some(stream) => {
                    let granted = shm::bind(stream, info, &config)?;
                    let deadline = config.deadline;
                    return Ok(Binding {
                        inner: Arc::new(BindingInner {
                            uid: NEXT_UID.fetch_add(1, Ordering::Relaxed),
                            server,
                            id: granted.id,
                            token: 0,
                            incarnation: granted.incarnation,
                            max_datagram: 0,
                            slots: granted.slots,
                            free_slots: Mutex::new((Vec::new(), 0)),
                            shm: Some(granted.link),
                            config,
                            info,
                            stats: ClientStats::default(),
                        }),
                        deadline,
                    });
                }
                None if transport == Some(Transport::SharedMemory) => return Err(Error::NoSharedMemory(server)),
                None => {}
            }
        }
        Self::bind_udp(server, info, config)
    }

    fn bind_udp(server: SocketAddr, info: &'static InterfaceInfo, config: ClientConfig) -> Result<Binding, Error> {
        let socket = udp::connect(server)?;
        let mtu_payload = udp::path_mtu(&socket).map(|m| m as usize - if server.is_ipv4() { 28 } else { 48 });
        // A checksum trailer rides beyond the negotiated datagram size, so leave room for it.
        let trailer = if config.checksum { tiercel_proto::wire::CHECKSUM_LEN } else { 0 };
        let max_datagram = config.max_datagram.min(mtu_payload.unwrap_or(1472)).max(HEADER_LEN + 64) - trailer;
        let nonce = u64::from_le_bytes(random_bytes()?[..8].try_into().unwrap_or_default());
        let mut request = BindRequest {
            interface: info.id,
            version: info.version,
            max_datagram: max_datagram as u32,
            nonce,
            proof: None,
        };
        // The challenge this client answered, once a server with a shared secret sent one.
        let mut challenge = None;
        let mut header = Header::new(Kind::Bind);
        if config.checksum {
            header.flags = tiercel_proto::wire::flags::CHECKSUM;
        }
        let mut rx = vec![0u8; max_datagram + trailer];
        let start = Instant::now();
        let mut rto = config.timing.retransmit_initial;
        'send: loop {
            if start.elapsed() >= config.timing.dead_after {
                return Err(Error::Unreachable { server, acknowledged: false });
            }
            let payload = request.to_bytes();
            header.payload_len = payload.len() as u32;
            header.message_len = header.payload_len;
            let header_bytes = header.to_bytes();
            let parts = [std::io::IoSlice::new(&header_bytes), std::io::IoSlice::new(&payload)];
            match crate::transmit::send(&socket, None, &parts, config.checksum) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(111) => {} // ECONNREFUSED from an earlier ICMP error
                Err(e) => return Err(e.into()),
            }
            let until = Instant::now() + rto;
            while let Some(left) = until.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) {
                if !udp::wait_readable(&socket, Some(left))? {
                    break;
                }
                let udp::Received::Datagram(n) = udp::recv_nowait(&socket, &mut rx)? else { continue };
                let Ok(p) = Packet::new_checked(&rx[..n]) else { continue };
                match p.kind() {
                    Kind::BindReply => {
                        let Some(reply) = BindReply::parse(p.payload()) else { continue };
                        if reply.nonce != nonce {
                            continue;
                        }
                        if let Some(secret) = &config.secret {
                            let (Some(proof), Some(challenge)) = (reply.proof, challenge) else {
                                return Err(Error::AuthenticationFailed(
                                    "the server did not ask for the shared secret, so it cannot prove it holds it",
                                ));
                            };
                            let transcript = BindReply { proof: None, ..reply }.proof_transcript(
                                p.binding(),
                                p.token(),
                                p.incarnation(),
                                &challenge,
                            );
                            if !secret.verify(&transcript, &proof) {
                                return Err(Error::AuthenticationFailed(
                                    "the server's proof does not match this client's secret",
                                ));
                            }
                        }
                        let max_datagram = (reply.max_datagram as usize).min(max_datagram);
                        if max_datagram <= HEADER_LEN || reply.slots == 0 {
                            continue;
                        }
                        return Ok(Binding {
                            inner: Arc::new(BindingInner {
                                uid: NEXT_UID.fetch_add(1, Ordering::Relaxed),
                                server,
                                id: p.binding(),
                                token: p.token(),
                                incarnation: p.incarnation(),
                                max_datagram,
                                slots: reply.slots,
                                free_slots: Mutex::new((Vec::new(), 0)),
                                shm: None,
                                config: config.clone(),
                                info,
                                stats: ClientStats::default(),
                            }),
                            deadline: config.deadline,
                        });
                    }
                    Kind::Reject if p.status() == Status::AuthRequired => {
                        let Some((echo, fresh)) = parse_bind_challenge(p.payload()) else { continue };
                        if echo != nonce {
                            continue;
                        }
                        let Some(secret) = &config.secret else { return Err(Error::AuthenticationRequired) };
                        let mac = secret.prove(&request.proof_transcript(&fresh));
                        request.proof = Some(BindProof { challenge: fresh, mac });
                        challenge = Some(fresh);
                        // Answer at once, with a fresh retransmission timer.
                        rto = config.timing.retransmit_initial;
                        continue 'send;
                    }
                    Kind::Reject => {
                        let Some((echo, exported)) = parse_bind_reject(p.payload()) else { continue };
                        if echo != nonce {
                            continue;
                        }
                        return Err(match p.status() {
                            Status::UnknownInterface => Error::UnknownInterface { name: info.name },
                            Status::VersionMismatch => {
                                Error::VersionMismatch { name: info.name, client: info.version, server: exported }
                            }
                            Status::AuthFailed => Error::AuthenticationFailed(
                                "the server refused this client's proof: the secrets differ",
                            ),
                            _ => Error::Busy,
                        });
                    }
                    _ => continue,
                }
            }
            rto = (rto * 2).min(config.timing.retransmit_max);
        }
    }

    /// A clone of this binding whose calls fail with [`Error::DeadlineExceeded`] after `deadline`.
    pub fn with_deadline(&self, deadline: Duration) -> Binding {
        Binding { inner: self.inner.clone(), deadline: Some(deadline) }
    }

    /// The server's address.
    pub fn server(&self) -> SocketAddr {
        self.inner.server
    }

    /// The transport chosen at bind time.
    pub fn transport(&self) -> Transport {
        if self.inner.shm.is_some() {
            Transport::SharedMemory
        } else {
            Transport::Udp
        }
    }

    /// The binding's id on the server (not a secret: the token that goes with it is).
    pub fn id(&self) -> u32 {
        self.inner.id
    }

    /// The server incarnation (boot id) the binding was made with.
    pub fn incarnation(&self) -> u64 {
        self.inner.incarnation
    }

    /// The interface bound to.
    pub fn interface(&self) -> &'static InterfaceInfo {
        self.inner.info
    }

    /// Largest datagram sent on this binding; larger messages go as several packets.
    pub fn max_datagram(&self) -> usize {
        self.inner.max_datagram
    }

    /// Slow-path counters.
    pub fn stats(&self) -> &ClientStats {
        &self.inner.stats
    }

    /// Starts a call of procedure `procedure`: marshal the arguments into [`Call::writer`], then
    /// [`Call::invoke`]. Used by generated stubs.
    #[doc(hidden)]
    pub fn call(&self, procedure: u16) -> Result<Call<'_>, Error> {
        Call::new(self, procedure)
    }
}

pub(crate) fn random_bytes() -> Result<[u8; 16], Error> {
    random_array()
}

/// 32 bytes from the OS random source (a key).
pub(crate) fn random_bytes32() -> Result<[u8; 32], Error> {
    random_array()
}

fn random_array<const N: usize>() -> Result<[u8; N], Error> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| Error::Io(std::io::Error::other(e.to_string())))?;
    Ok(b)
}
