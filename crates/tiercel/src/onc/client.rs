//! The ONC client: the generated client stub of an interface with `onc(...)`, bound to an ONC
//! server (a C program built with `rpcgen`, or a tiercel [`OncServer`](super::OncServer)) instead
//! of a tiercel one. Its calls carry XDR in ONC messages over UDP (retransmitted with the same xid
//! until the reply comes, as libtirpc does: the server's duplicate request cache, if it has one,
//! keeps a call from running twice) or TCP (record marking).

use std::io::{self, Read};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs, UdpSocket};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tiercel_proto::onc::{self, Accepted, AuthSys, Credential, RecordReader, ReplyStatus};
use tiercel_sys::udp::{self, Received};

use crate::error::OncError;
use crate::xdr::{XdrError, XdrReader};
use crate::{BindError, CallError};

/// The transport of an ONC binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OncTransport {
    /// Datagrams, retransmitted until answered.
    Udp,
    /// A connection, messages in records.
    Tcp,
}

/// The numbers of an interface with `onc(...)`: what [`OncClient::import`] binds to. Generated.
pub trait OncImport: crate::Import {
    /// Its ONC program number.
    const PROGRAM: u32;
    /// Its version.
    const VERSION: u32;
}

/// Most sockets or connections a binding keeps between calls (more are made for calls at once
/// beyond them, and closed after).
const POOL: usize = 16;
/// Largest reply read over UDP.
const MAX_DATAGRAM: usize = 65_507;
/// Largest reply read over TCP.
const MAX_RECORD: usize = 64 << 20;

/// Binds generated client stubs to an ONC server.
///
/// ```no_run
/// # #[tiercel::interface(onc(program = 0x2000_0001))]
/// # pub trait Calc { #[onc(procedure = 1)] fn add(&self, a: i32, b: i32) -> i32; }
/// use tiercel::onc::{OncClient, OncTransport};
/// // By address, or found through the server host's rpcbind:
/// let calc: CalcClient = OncClient::new("127.0.0.1:7000", OncTransport::Udp)?.import()?;
/// let calc: CalcClient = OncClient::rpcbind("127.0.0.1", OncTransport::Tcp)?.import()?;
/// assert_eq!(calc.add(2, 3)?, 5);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct OncClient {
    server: Option<SocketAddr>,
    host: String,
    transport: OncTransport,
    timeout: Duration,
    retry: Duration,
    spin: Duration,
    credential: Option<(String, u32, u32)>,
}

impl OncClient {
    /// A client of the ONC server at `addr` over `transport`.
    pub fn new(addr: impl ToSocketAddrs, transport: OncTransport) -> Result<OncClient, BindError> {
        let server = addr.to_socket_addrs().map_err(BindError::Io)?.next().ok_or_else(|| {
            BindError::Io(io::Error::new(io::ErrorKind::InvalidInput, "no address for the ONC server"))
        })?;
        Ok(OncClient { server: Some(server), host: server.ip().to_string(), ..OncClient::base(transport) })
    }

    /// A client of the ONC server on `host` that its `rpcbind` names for the program imported (asked
    /// at [`OncClient::import`], with portmapper's `PMAPPROC_GETPORT`).
    pub fn rpcbind(host: &str, transport: OncTransport) -> Result<OncClient, BindError> {
        Ok(OncClient { host: host.to_string(), ..OncClient::base(transport) })
    }

    fn base(transport: OncTransport) -> OncClient {
        OncClient {
            server: None,
            host: String::new(),
            transport,
            timeout: Duration::from_secs(10),
            retry: Duration::from_millis(100),
            spin: Duration::from_micros(200),
            credential: None,
        }
    }

    /// How long a call spins for its reply before it blocks (200 µs by default, the longest a
    /// tiercel binding's adaptive spin takes; zero blocks at once).
    pub fn spin(mut self, spin: Duration) -> OncClient {
        self.spin = spin;
        self
    }

    /// How long a call waits for its reply in all (10 s by default; a binding's deadline, if
    /// shorter, wins): then it fails with [`CallError::Unreachable`].
    pub fn timeout(mut self, timeout: Duration) -> OncClient {
        self.timeout = timeout;
        self
    }

    /// Over UDP, how long a call waits before sending again (100 ms by default), doubling each
    /// time up to a second.
    pub fn retry(mut self, retry: Duration) -> OncClient {
        self.retry = retry;
        self
    }

    /// Calls carry an `AUTH_SYS` credential: `machine`, `uid` and `gid` (the default is
    /// `AUTH_NONE`).
    pub fn auth_sys(mut self, machine: &str, uid: u32, gid: u32) -> OncClient {
        self.credential = Some((machine.chars().take(onc::MAX_MACHINE_NAME).collect(), uid, gid));
        self
    }

    /// Binds the client stub `C`: finds the port through `rpcbind` if need be, and over TCP
    /// connects. The server is not asked whether it serves the program: the first call says.
    pub fn import<C: OncImport>(self) -> Result<C, BindError> {
        let server = match self.server {
            Some(server) => server,
            None => super::rpcbind::port_of(&self.host, C::PROGRAM, C::VERSION, self.transport)?,
        };
        let link = Link {
            server,
            program: C::PROGRAM,
            version: C::VERSION,
            transport: self.transport,
            timeout: self.timeout,
            retry: self.retry,
            spin: self.spin,
            credential: self.credential,
            xid: AtomicU32::new(u32::from_be_bytes(
                crate::random::bytes().map_err(BindError::Io)?[..4].try_into().unwrap_or_default(),
            )),
            pool: Mutex::new(Vec::new()),
        };
        if self.transport == OncTransport::Tcp {
            let conn = link.connect().map_err(BindError::Io)?;
            link.pool.lock().unwrap_or_else(|p| p.into_inner()).push(conn);
        }
        Ok(C::from_binding(crate::Binding::to_onc(Arc::new(link), C::INFO)))
    }
}

/// A socket or connection with its buffers.
#[derive(Debug)]
enum Conn {
    Udp { socket: UdpSocket, buf: Vec<u8>, msg: Vec<u8> },
    Tcp { stream: TcpStream, reader: RecordReader, buf: Vec<u8>, msg: Vec<u8> },
}

/// An ONC binding: where calls go, and the sockets they go by.
#[derive(Debug)]
pub struct Link {
    server: SocketAddr,
    program: u32,
    version: u32,
    transport: OncTransport,
    timeout: Duration,
    retry: Duration,
    spin: Duration,
    credential: Option<(String, u32, u32)>,
    xid: AtomicU32,
    pool: Mutex<Vec<Conn>>,
}

impl Link {
    /// The server's address.
    pub(crate) fn server(&self) -> SocketAddr {
        self.server
    }

    /// The transport.
    pub(crate) fn transport(&self) -> OncTransport {
        self.transport
    }

    fn connect(&self) -> io::Result<Conn> {
        Ok(match self.transport {
            OncTransport::Udp => {
                let any: SocketAddr = if self.server.is_ipv4() {
                    ([0, 0, 0, 0], 0).into()
                } else {
                    (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
                };
                let socket = UdpSocket::bind(any)?;
                socket.connect(self.server)?;
                Conn::Udp { socket, buf: vec![0; MAX_DATAGRAM], msg: Vec::new() }
            }
            OncTransport::Tcp => {
                let stream = TcpStream::connect_timeout(&self.server, self.timeout)?;
                let _ = stream.set_nodelay(true);
                stream.set_nonblocking(true)?;
                Conn::Tcp { stream, reader: RecordReader::new(MAX_RECORD), buf: vec![0; 64 << 10], msg: Vec::new() }
            }
        })
    }

    /// Calls `procedure` with the arguments `encode` writes, decoding its result with `decode`,
    /// within `deadline` (the binding's) or the client's timeout.
    #[doc(hidden)]
    pub fn call<R>(
        &self,
        procedure: u32,
        deadline: Option<Duration>,
        encode: impl FnOnce(&mut Vec<u8>),
        decode: impl for<'a> FnOnce(&mut XdrReader<'a>) -> Result<R, XdrError>,
    ) -> Result<R, CallError> {
        let (limit, by_deadline) = match deadline {
            Some(d) if d < self.timeout => (d, true),
            _ => (self.timeout, false),
        };
        let until = Instant::now() + limit;
        let taken = self.pool.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut conn = match taken {
            Some(conn) => conn,
            None => self.connect().map_err(|e| self.lost(false, &e))?,
        };
        let xid = self.xid.fetch_add(1, Ordering::Relaxed);
        let (machine, uid, gid) = self.credential.as_ref().map_or(("", 0, 0), |(m, u, g)| (m.as_str(), *u, *g));
        let credential = match self.credential {
            Some(_) => Credential::Sys(AuthSys::new(0, machine.as_bytes(), uid, gid)),
            None => Credential::None,
        };
        let outcome = match &mut conn {
            Conn::Udp { socket, buf, msg } => {
                msg.clear();
                onc::write_call(msg, xid, self.program, self.version, procedure, &credential);
                encode(msg);
                self.exchange_udp(socket, msg, buf, xid, until).and_then(|n| self.read_reply(&buf[..n], xid, decode))
            }
            Conn::Tcp { stream, reader, buf, msg } => {
                msg.clear();
                msg.extend_from_slice(&[0; 4]);
                onc::write_call(msg, xid, self.program, self.version, procedure, &credential);
                encode(msg);
                let len = msg.len() - 4;
                msg[..4].copy_from_slice(&onc::record_mark(len, true));
                self.exchange_tcp(stream, reader, msg, buf, until)
                    .and_then(|()| self.read_reply(reader.record(), xid, decode))
            }
        };
        let healthy = match &outcome {
            Ok(_) => true,
            Err(CallError::Onc(_)) => true,
            Err(_) => matches!(conn, Conn::Udp { .. }),
        };
        if healthy {
            let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
            if pool.len() < POOL {
                pool.push(conn);
            }
        }
        match outcome {
            Err(CallError::Unreachable { .. }) if by_deadline => {
                Err(CallError::DeadlineExceeded { may_have_run: true })
            }
            other => other,
        }
    }

    fn lost(&self, sent: bool, e: &io::Error) -> CallError {
        CallError::ConnectionLost { server: self.server, sent, reason: e.to_string() }
    }

    /// Sends `msg` until a reply to `xid` comes or `until` passes: the reply's length in `buf`.
    fn exchange_udp(
        &self,
        socket: &UdpSocket,
        msg: &[u8],
        buf: &mut [u8],
        xid: u32,
        until: Instant,
    ) -> Result<usize, CallError> {
        let mut wait = self.retry;
        loop {
            socket.send(msg)?;
            let sent = Instant::now();
            let (resend, spin_until) = (sent + wait, sent + self.spin);
            loop {
                match udp::recv_nowait(socket, buf)? {
                    // A reply to an earlier call (answered after it gave up) is not this one's.
                    Received::Datagram(n) if buf[..n].get(..4) == Some(&xid.to_be_bytes()[..]) => return Ok(n),
                    // Another call's reply, one too large, or an ICMP "port unreachable" from an
                    // earlier send (nobody listened then): wait on.
                    Received::Datagram(_) | Received::Truncated(_) | Received::Refused => continue,
                    Received::Nothing => {}
                }
                let now = Instant::now();
                let stop = resend.min(until);
                if now >= stop {
                    break;
                }
                if now < spin_until {
                    std::hint::spin_loop();
                } else {
                    udp::wait_readable(socket, Some(stop - now))?;
                }
            }
            if Instant::now() >= until {
                return Err(CallError::Unreachable { server: self.server, acknowledged: false });
            }
            wait = (wait * 2).min(Duration::from_secs(1));
        }
    }

    /// Sends the record `msg` and reads records until a whole one is in `reader`.
    fn exchange_tcp(
        &self,
        stream: &mut TcpStream,
        reader: &mut RecordReader,
        msg: &[u8],
        buf: &mut [u8],
        until: Instant,
    ) -> Result<(), CallError> {
        let left = until.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        super::server::write_within(stream, msg, left).map_err(|e| self.lost(false, &e))?;
        let spin_until = Instant::now() + self.spin;
        loop {
            let n = match stream.read(buf) {
                Ok(0) => return Err(self.lost(true, &io::Error::from(io::ErrorKind::UnexpectedEof))),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let now = Instant::now();
                    if now >= until {
                        return Err(CallError::Unreachable { server: self.server, acknowledged: false });
                    }
                    if now < spin_until {
                        std::hint::spin_loop();
                    } else {
                        udp::wait_readable_fd(&*stream, Some(until - now)).map_err(|e| self.lost(true, &e))?;
                    }
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.lost(true, &e)),
            };
            // A server answers one call at a time on a connection this binding lends to one call:
            // the record is this call's reply (its xid is checked next).
            match reader.feed(&buf[..n]) {
                Ok((used, true)) if used == n => return Ok(()),
                Ok((_, true)) => return Err(self.lost(true, &io::Error::other("bytes after the reply"))),
                Ok((_, false)) => continue,
                Err(_) => return Err(self.lost(true, &io::Error::other("a reply larger than 64 MiB"))),
            }
        }
    }

    /// The result in `reply` to the call `xid`, or the error it says.
    fn read_reply<R>(
        &self,
        reply: &[u8],
        xid: u32,
        decode: impl for<'a> FnOnce(&mut XdrReader<'a>) -> Result<R, XdrError>,
    ) -> Result<R, CallError> {
        let bad = || CallError::Protocol(crate::Violation::CallStatus("not an ONC reply to the call"));
        let reply = onc::parse_reply(reply).ok_or_else(bad)?;
        if reply.xid != xid {
            return Err(bad());
        }
        let error = match reply.status {
            ReplyStatus::Accepted(Accepted::Success) => {
                let mut r = XdrReader::new(reply.results);
                let value = decode(&mut r).and_then(|v| r.finish().map(|()| v));
                return value.map_err(|e| CallError::Onc(OncError::BadResult(e)));
            }
            ReplyStatus::Accepted(Accepted::ProgUnavail) => OncError::ProgUnavail,
            ReplyStatus::Accepted(Accepted::ProgMismatch { low, high }) => OncError::ProgMismatch { low, high },
            ReplyStatus::Accepted(Accepted::ProcUnavail) => OncError::ProcUnavail,
            ReplyStatus::Accepted(Accepted::GarbageArgs) => OncError::GarbageArgs,
            ReplyStatus::Accepted(Accepted::SystemErr) => OncError::SystemErr,
            ReplyStatus::RpcMismatch { low, high } => OncError::RpcMismatch { low, high },
            ReplyStatus::AuthError(stat) => OncError::AuthError(stat),
        };
        Err(CallError::Onc(error))
    }
}
