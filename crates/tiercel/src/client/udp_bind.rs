//! Binding over UDP: the bind machine of `tiercel-proto` driven over a connected socket, with
//! retransmission; and what a refusal means to the caller, for every transport.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use tiercel_proto::bind::{BindClient, BindEvent, Granted, Keyed, Refusal, Rendezvous};
use tiercel_proto::wire::{Packet, CHECKSUM_LEN, HEADER_LEN};
use tiercel_sys::udp;

use crate::config::ClientConfig;
use crate::interface::{fingerprint, ExportInfo, InterfaceInfo, ListingPage};
use crate::secure::{Hello, Identity, Keys, PublicKey, Session};
use crate::wire::shape::procedure_shapes;
use crate::BindError;

/// IPv4 and UDP headers: what a datagram adds to its payload on the path.
const IPV4_UDP_OVERHEAD: usize = 20 + 8;
/// IPv6 and UDP headers.
const IPV6_UDP_OVERHEAD: usize = 40 + 8;
/// Payload of a 1500-byte Ethernet frame's IPv4 datagram: the datagram size when the path MTU is
/// not known.
const ETHERNET_PAYLOAD: usize = 1500 - IPV4_UDP_OVERHEAD;
/// How long a secure bind goes on after the first answer that did not open (an impostor's, a
/// server without the key's, or one saying it cannot read the handshake) before it fails.
const RETRY_UNPROVEN: std::time::Duration = std::time::Duration::from_millis(500);
/// Smallest datagram a binding uses.
const MIN_DATAGRAM: usize = HEADER_LEN + 64;

/// What a UDP bind produced: the grant and the binding's datagram size, and its keys when it is a
/// secure binding.
pub(super) struct UdpGrant {
    pub(super) granted: Granted,
    pub(super) max_datagram: usize,
    pub(super) seal: Option<Arc<Session>>,
}

/// A secure bind in progress: who this client is, whom it expects, and the handshake under way.
pub(super) struct SecureBind {
    me: Identity,
    pub(super) server: PublicKey,
    psk: [u8; 32],
    cipher: crate::Cipher,
    pub(super) hello: Option<Hello>,
    /// The keys of the last answer that opened.
    pub(super) keys: Option<Keys>,
    /// When a datagram that did not open first came back (none: nobody answered; some:
    /// somebody there that cannot prove the key, or says it cannot read the handshake).
    heard: Option<Instant>,
}

impl SecureBind {
    pub(super) fn new(config: &ClientConfig) -> Result<Option<SecureBind>, BindError> {
        let Some(server) = config.server_key else { return Ok(None) };
        let me = match &config.key {
            Some(me) => me.clone(),
            None => process_identity()?,
        };
        let psk = crate::auth::psk(config.secret.as_ref());
        Ok(Some(SecureBind { me, server, psk, cipher: config.cipher, hello: None, keys: None, heard: None }))
    }

    /// The datagram that carries `request`: the handshake under way, or a new one if the request
    /// changed.
    pub(super) fn datagram(&mut self, request: &[u8]) -> Result<&[u8], BindError> {
        if self.hello.as_ref().is_none_or(|h| h.request != request) {
            let hello = Hello::new(&self.me, &self.server, &self.psk, self.cipher, request)
                .map_err(|e| BindError::Io(std::io::Error::other(e.0)))?;
            self.hello = Some(hello);
        }
        Ok(self.hello.as_ref().map_or(&[][..], |h| &h.datagram[..]))
    }
}

/// The key pair of this process's secure bindings when the configuration gives none: made once.
fn process_identity() -> Result<Identity, BindError> {
    static KEY: std::sync::OnceLock<Identity> = std::sync::OnceLock::new();
    if let Some(k) = KEY.get() {
        return Ok(k.clone());
    }
    let made = Identity::generate().map_err(|e| BindError::Io(std::io::Error::other(e.0)))?;
    Ok(KEY.get_or_init(|| made).clone())
}

/// The answer to a UDP bind request.
pub(super) enum UdpBound {
    /// A binding over UDP.
    Granted(UdpGrant),
    /// Where to bind through shared memory (only when asked for).
    Rendezvous(Rendezvous, Option<PublicKey>),
}

/// Binds to `info` at `server` over UDP: sends the request, retransmitted with backoff until an
/// answer or `dead_after`, and answers a challenge at once. With `ask_rendezvous`, a server on
/// this host answers with its shared-memory rendezvous instead of a binding.
pub(super) fn bind_udp(
    server: SocketAddr,
    info: &'static InterfaceInfo,
    config: &ClientConfig,
    ask_rendezvous: bool,
) -> Result<UdpBound, BindError> {
    let socket = udp::connect(server)?;
    let overhead = if server.is_ipv4() { IPV4_UDP_OVERHEAD } else { IPV6_UDP_OVERHEAD };
    let mtu_payload = udp::path_mtu(&socket).map(|m| m as usize - overhead);
    let mut secure = SecureBind::new(config)?;
    // A checksum trailer, or a sealed packet's envelope, rides beyond the negotiated datagram
    // size, so leave room for it.
    let trailer = match (&secure, config.checksum) {
        (Some(_), _) => tiercel_proto::seal::SEAL_OVERHEAD,
        (None, true) => CHECKSUM_LEN,
        (None, false) => 0,
    };
    let checksum = config.checksum && secure.is_none();
    let max_datagram = config.max_datagram.min(mtu_payload.unwrap_or(ETHERNET_PAYLOAD)).max(MIN_DATAGRAM) - trailer;
    let nonce = u64::from_le_bytes(crate::random::bytes()?[..8].try_into().unwrap_or_default());
    let mut machine = BindClient::new(&info.spec(), max_datagram as u32, nonce, checksum);
    if ask_rendezvous {
        machine = machine.asking_rendezvous();
    }
    let rx_len = max_datagram.max(tiercel_proto::bind::PADDED_REQUEST) + trailer + crate::secure::HANDSHAKE_ROOM;
    let bound = exchange(&socket, server, config, &mut machine, secure.as_mut(), rx_len, |event| match event {
        BindEvent::Granted(granted) => {
            let max_datagram = (granted.grant.max_datagram as usize).min(max_datagram);
            if max_datagram <= HEADER_LEN {
                return None;
            }
            Some(Ok(UdpBound::Granted(UdpGrant { granted, max_datagram, seal: None })))
        }
        BindEvent::Rendezvous { rendezvous, .. } => Some(Ok(UdpBound::Rendezvous(rendezvous, None))),
        BindEvent::Refused(refusal) => Some(Err(refusal_error(info, refusal))),
        // Never the answer to a bind request (the machine ignores listings and keys then).
        BindEvent::Listed(_) | BindEvent::ServerKey(_) | BindEvent::Ignored | BindEvent::SendAgain => None,
    })?;
    match (bound, secure.and_then(|s| s.keys)) {
        // The keys of the answer that granted the binding.
        (UdpBound::Granted(grant), Some(keys)) => {
            let seal = Some(Arc::new(keys.session(grant.granted.binding)));
            Ok(UdpBound::Granted(UdpGrant { seal, ..grant }))
        }
        // Told in an answer that opened: the rendezvous is the proven server's.
        (UdpBound::Rendezvous(place, _), Some(keys)) => Ok(UdpBound::Rendezvous(place, Some(keys.peer()))),
        (bound, _) => Ok(bound),
    }
}

/// Drives `machine` over `socket` (connected to `server`): sends the request, retransmitted with
/// backoff until `dead_after`, answers a challenge at once, and hands every other answer to
/// `answered`, which ends the exchange with `Some`.
/// With `secure`, each request travels in a handshake's first message, and only an answer that
/// opens (the server proved its key) is read; the handshake's keys are left in `secure`.
fn exchange<T>(
    socket: &std::net::UdpSocket,
    server: SocketAddr,
    config: &ClientConfig,
    machine: &mut BindClient,
    mut secure: Option<&mut SecureBind>,
    rx_len: usize,
    mut answered: impl FnMut(BindEvent<'_>) -> Option<Result<T, BindError>>,
) -> Result<T, BindError> {
    // With a secure handshake the secret is its pre-shared key, proven by the handshake itself.
    let secret = config.secret.as_ref().filter(|_| secure.is_none()).map(|s| s as &dyn Keyed);
    let checksum = config.checksum && secure.is_none();
    let mut rx = vec![0u8; rx_len];
    let mut opened = vec![0u8; if secure.is_some() { rx_len } else { 0 }];
    let start = Instant::now();
    let mut rto = config.timing.retransmit_initial;
    'send: loop {
        // A server that answers only with what does not open is given a round of retransmissions
        // more (the real answer may be on its way), not the whole wait for a dead server.
        let unproven = secure.as_ref().and_then(|s| s.heard).is_some_and(|at| at.elapsed() >= RETRY_UNPROVEN);
        if unproven || start.elapsed() >= config.timing.dead_after {
            return Err(match secure {
                Some(s) if s.heard.is_some() => BindError::KeyNotProven(server, s.server),
                _ => BindError::Unreachable(server),
            });
        }
        let plain = machine.packet();
        let packet = match secure.as_deref_mut() {
            Some(s) => s.datagram(&plain)?,
            None => &plain[..],
        };
        match crate::transmit::send(socket, None, &[std::io::IoSlice::new(packet)], checksum) {
            Ok(_) => {}
            // An ICMP port-unreachable for an earlier request: nobody listens there.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Err(BindError::NoServer(server)),
            // Lost (a full buffer, a firewall's drop): retransmitted like a request lost on the way.
            Err(e) if crate::transmit::is_loss(&e) => {}
            Err(e) => return Err(e.into()),
        }
        let until = Instant::now() + rto;
        while let Some(left) = until.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) {
            if !udp::wait_readable(socket, Some(left))? {
                break;
            }
            let n = match udp::recv_nowait(socket, &mut rx) {
                Ok(udp::Received::Datagram(n)) => n,
                Ok(udp::Received::Refused) => return Err(BindError::NoServer(server)),
                Ok(udp::Received::Truncated(_) | udp::Received::Nothing) => continue,
                Err(e) => return Err(e.into()),
            };
            let answer = match secure.as_deref_mut() {
                Some(s) => {
                    let Some(hello) = s.hello.as_mut() else { continue };
                    // Anything that is not the server's answer, opened with its key, is ignored.
                    let Some((len, keys)) = hello.welcome(&rx[..n], &mut opened) else {
                        s.heard.get_or_insert_with(Instant::now);
                        continue;
                    };
                    s.keys = Some(keys);
                    &opened[..len]
                }
                None => &rx[..n],
            };
            let Ok(p) = Packet::new_checked(answer) else { continue };
            match machine.handle(&p, secret) {
                BindEvent::SendAgain => {
                    // Answer the challenge at once, with a fresh retransmission timer.
                    rto = config.timing.retransmit_initial;
                    continue 'send;
                }
                event => {
                    if let Some(done) = answered(event) {
                        return done;
                    }
                }
            }
        }
        rto = (rto * 2).min(config.timing.retransmit_max);
    }
}

/// What a server at `server` exports, asked over UDP one export at a time (each answer is no
/// longer than its request: a signature longer than about 1,100 bytes comes in pages).
pub(super) fn list_udp(server: SocketAddr, config: &ClientConfig) -> Result<Vec<ExportInfo>, BindError> {
    let socket = udp::connect(server)?;
    list_each(server, |index, offset| {
        let nonce = u64::from_le_bytes(crate::random::bytes()?[..8].try_into().unwrap_or_default());
        let mut secure = SecureBind::new(config)?;
        let mut machine = BindClient::listing_from(index, offset, nonce, config.checksum && secure.is_none());
        let rx_len = tiercel_proto::bind::PADDED_REQUEST + CHECKSUM_LEN + crate::secure::HANDSHAKE_ROOM;
        exchange(&socket, server, config, &mut machine, secure.as_mut(), rx_len, listed)
    })
}

/// The static public key the server at `server` tells over UDP (`None`: it has none), plain: not
/// proven until a secure bind with it succeeds.
pub(super) fn ask_key_udp(server: SocketAddr, config: &ClientConfig) -> Result<Option<PublicKey>, BindError> {
    let socket = udp::connect(server)?;
    let nonce = u64::from_le_bytes(crate::random::bytes()?[..8].try_into().unwrap_or_default());
    let mut machine = BindClient::asking_key(nonce, config.checksum);
    let rx_len = tiercel_proto::bind::PADDED_REQUEST + CHECKSUM_LEN;
    exchange(&socket, server, config, &mut machine, None, rx_len, told_key)
}

/// What a key request's answer says: the key, or the refusal; `None` for an answer to another
/// request.
pub(super) fn told_key(event: BindEvent<'_>) -> Option<Result<Option<PublicKey>, BindError>> {
    match event {
        BindEvent::ServerKey(key) => Some(Ok(key.map(PublicKey))),
        BindEvent::Refused(refusal) => Some(Err(refused(refusal))),
        _ => None,
    }
}

/// What a listing's answer says: the count of exports and a page of the one at the index asked for
/// (none past the count), or the refusal; `None` for an answer to another request.
pub(super) fn listed(event: BindEvent<'_>) -> Option<Result<(u32, Option<ListingPage>), BindError>> {
    match event {
        BindEvent::Listed(l) => Some(Ok((l.count, (l.index < l.count).then(|| ListingPage::from_listing(&l))))),
        BindEvent::Refused(refusal) => Some(Err(refused(refusal))),
        _ => None,
    }
}

/// Most pages asked for one export's signature (64 KiB and more: far beyond any interface).
const MAX_PAGES: usize = 64;

/// Every export, asking with `ask(index, offset)` for index 0, 1, … until the count the answers
/// give, and for the further pages of each signature until it is whole (its fingerprint matches),
/// a page brings nothing new, or [`MAX_PAGES`].
pub(super) fn list_each(
    server: SocketAddr,
    mut ask: impl FnMut(u32, u32) -> Result<(u32, Option<ListingPage>), BindError>,
) -> Result<Vec<ExportInfo>, BindError> {
    let mut exports = Vec::new();
    let mut index = 0u32;
    loop {
        let (count, Some(first)) = ask(index, 0)? else { return Ok(exports) };
        let mut signature = first.signature.clone();
        let mut export = ExportInfo::from_pages(server, &first, &signature);
        for _ in 1..MAX_PAGES {
            if export.complete {
                break;
            }
            let offset = u32::try_from(signature.len()).unwrap_or(u32::MAX);
            match ask(index, offset)? {
                (_, Some(page)) if !page.signature.is_empty() && page.fingerprint == first.fingerprint => {
                    signature.extend_from_slice(&page.signature);
                    export = ExportInfo::from_pages(server, &first, &signature);
                }
                _ => break,
            }
        }
        exports.push(export);
        index += 1;
        if index >= count {
            return Ok(exports);
        }
    }
}

/// The error a refused bind ends with.
pub(super) fn refusal_error(info: &'static InterfaceInfo, refusal: Refusal<'_>) -> BindError {
    match refusal {
        Refusal::UnknownInterface => BindError::UnknownInterface { name: info.name },
        Refusal::VersionMismatch(r) => {
            BindError::VersionMismatch { name: info.name, client: info.version, server: r.version }
        }
        Refusal::InterfaceMismatch(r) => {
            BindError::InterfaceMismatch { name: info.name, difference: difference(info, r.fingerprint, r.signature) }
        }
        Refusal::ProcedureMismatch { procedure, exported } => BindError::ProcedureMismatch {
            name: info.name,
            procedure: info.procedures.get(procedure).copied().unwrap_or("?"),
            difference: procedure_difference(
                info.signature(),
                procedure,
                exported.signature,
                fingerprint(info.name, &String::from_utf8_lossy(exported.signature)) == exported.fingerprint,
            ),
        },
        other => refused(other),
    }
}

/// The error of a refusal that is not about the interface (those of a listing, too).
pub(super) fn refused(refusal: Refusal<'_>) -> BindError {
    match refusal {
        Refusal::AuthRequired => BindError::AuthenticationRequired,
        Refusal::AuthFailed(why) => BindError::AuthenticationFailed(why),
        Refusal::Busy => BindError::Busy,
        Refusal::KeyRequired => BindError::KeyRequired,
        Refusal::ProtocolVersion { min, max } => {
            BindError::ProtocolVersion { client: tiercel_proto::wire::VERSION, server_min: min, server_max: max }
        }
        // Only a request for a binding is refused for its interface.
        Refusal::UnknownInterface
        | Refusal::VersionMismatch(_)
        | Refusal::InterfaceMismatch(_)
        | Refusal::ProcedureMismatch { .. } => {
            BindError::Protocol(crate::error::Violation::BindAnswer("a listing refused as a bind is refused"))
        }
    }
}

/// How this client's procedure `procedure` (of `ours`, a signature) differs from the server's of the
/// same name (in `theirs`, its signature, `whole` or cut short): their lines, or the first type of
/// those they reach that is defined otherwise or on one side only.
fn procedure_difference(ours: &str, procedure: usize, theirs: &[u8], whole: bool) -> String {
    let theirs = String::from_utf8_lossy(theirs);
    let ours = procedure_shapes(ours);
    let Some((name, our_shape)) = ours.get(procedure) else { return "no such procedure here".into() };
    // A signature cut short ends in a partial line, which is not read.
    let lines = match theirs.rfind('\n') {
        Some(end) if !whole => &theirs[..end],
        None if !whole => "",
        _ => &theirs[..],
    };
    let Some((_, their_shape)) = procedure_shapes(lines).into_iter().find(|(n, _)| n == name) else {
        return "the server's signature came cut short before it".into();
    };
    let (our_line, our_types) = our_shape.split_once('\n').unwrap_or((our_shape, ""));
    let (their_line, their_types) = their_shape.split_once('\n').unwrap_or((&their_shape, ""));
    if our_line != their_line {
        return format!("client has `{our_line}`, server has `{their_line}`");
    }
    let defined = |types: &str| -> Vec<(String, String)> {
        types
            .lines()
            .filter_map(|t| t.strip_prefix("type ")?.split_once(" = ").map(|(n, d)| (n.to_owned(), d.to_owned())))
            .collect()
    };
    let (ours, theirs) = (defined(our_types), defined(their_types));
    for (n, d) in &ours {
        match theirs.iter().find(|(m, _)| m == n) {
            Some((_, e)) if e == d => {}
            Some((_, e)) => return format!("type {n}: client has `{d}`, server has `{e}`"),
            None => return format!("type {n}: client has `{d}`, server has none"),
        }
    }
    match theirs.iter().find(|(m, _)| !ours.iter().any(|(n, _)| n == m)) {
        Some((m, e)) => format!("type {m}: client has none, server has `{e}`"),
        None => "the same lines and types, yet different shapes (the server's signature may be cut short)".into(),
    }
}

/// Where the client's copy of an interface and the server's (`signature`, possibly cut short,
/// whose whole has fingerprint `exported`) first differ, in words.
fn difference(info: &InterfaceInfo, exported: u64, signature: &[u8]) -> String {
    let text = String::from_utf8_lossy(signature);
    let whole = fingerprint(info.name, &text) == exported;
    let ours: Vec<&str> = info.signature().split('\n').filter(|l| !l.is_empty()).collect();
    let theirs: Vec<&str> = text.split('\n').filter(|l| !l.is_empty()).collect();
    // A line cut short by the server's answer limit is not compared.
    let comparable = if whole { theirs.len() } else { theirs.len().saturating_sub(1) };
    let counts = format!(
        "client has {} procedures, server {}",
        ours.len(),
        if whole { theirs.len().to_string() } else { "more".into() }
    );
    for i in 0..ours.len().max(comparable) {
        match (ours.get(i), theirs.get(i).filter(|_| i < comparable)) {
            (Some(a), Some(b)) if a == b => continue,
            (Some(a), Some(b)) => return format!("procedure {i}: client has `{a}`, server has `{b}` ({counts})"),
            (Some(a), None) if whole => return format!("procedure {i}: client has `{a}`, server has none ({counts})"),
            (None, Some(b)) => return format!("procedure {i}: client has none, server has `{b}` ({counts})"),
            _ => break,
        }
    }
    if whole {
        // Same procedures as written: the difference is in the name the fingerprint covers.
        format!("the procedures read the same but the fingerprints differ ({counts})")
    } else {
        format!("the first {comparable} procedures agree; the server's signature was cut short after that ({counts})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(signature: &'static str) -> InterfaceInfo {
        InterfaceInfo {
            name: "Bank",
            id: crate::interface::interface_id("Bank"),
            version: 1,
            procedures: &[],
            source: crate::SignatureSource::Given(signature),
        }
    }

    #[test]
    fn a_procedure_difference_names_its_line_or_the_first_type_that_differs() {
        let ours = "pay(Order) -> u8\ntype Order = struct { id: u64, lines: Vec<Line> }\ntype Line = struct { n: u32 }";
        let moved =
            b"pay(Order) -> u8\ntype Order = struct { lines: Vec<Line>, id: u64 }\ntype Line = struct { n: u32 }";
        assert_eq!(
            procedure_difference(ours, 0, moved, true),
            "type Order: client has `struct { id: u64, lines: Vec<Line> }`, server has `struct { lines: Vec<Line>, id: u64 }`"
        );
        let deeper =
            b"pay(Order) -> u8\ntype Order = struct { id: u64, lines: Vec<Line> }\ntype Line = struct { n: u64 }";
        assert_eq!(
            procedure_difference(ours, 0, deeper, true),
            "type Line: client has `struct { n: u32 }`, server has `struct { n: u64 }`"
        );
        assert_eq!(
            procedure_difference(ours, 0, b"pay(Order) -> u16\ntype Order = struct", false),
            "client has `pay(Order) -> u8`, server has `pay(Order) -> u16`"
        );
        assert_eq!(
            procedure_difference(ours, 0, b"other()\npay(Ord", false),
            "the server's signature came cut short before it"
        );
    }

    #[test]
    fn differences_name_both_sides() {
        let client = info("withdraw(u64) -> bool\ndeposit(u64)");
        let server = "deposit(u64)\nwithdraw(u64) -> bool";
        let d = difference(&client, fingerprint("Bank", server), server.as_bytes());
        assert_eq!(d, "procedure 0: client has `withdraw(u64) -> bool`, server has `deposit(u64)` (client has 2 procedures, server 2)");
        let server = "deposit(u64)";
        let d = difference(&info("deposit(u64)\naudit()"), fingerprint("Bank", server), server.as_bytes());
        assert!(d.starts_with("procedure 1: client has `audit()`, server has none"), "{d}");
        let server = "deposit(u64)\naudit()";
        let d = difference(&info("deposit(u64)"), fingerprint("Bank", server), server.as_bytes());
        assert!(d.starts_with("procedure 1: client has none, server has `audit()`"), "{d}");
        // Cut short: the last, partial line is not compared.
        let d = difference(&info("deposit(u64)\naudit()"), 1, b"deposit(u64)\nau");
        assert!(d.contains("first 1 procedures agree") && d.contains("cut short"), "{d}");
    }
}
