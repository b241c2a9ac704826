//! Binding over TCP: the connection, the bind exchange (tried again when closed unanswered), and
//! the list of a server's exports.

use super::*;
use crate::client::udp_bind::SecureBind;
use crate::secure::Keys;

/// Connects to `server` and binds over the connection, decided by the client's bind machine.
pub(crate) fn bind(
    server: SocketAddr,
    info: &'static InterfaceInfo,
    config: &ClientConfig,
) -> Result<Granted, BindError> {
    // A server with too many connections binding at once closes one before answering it: a new
    // connection, with a new request, is likely to be answered (its request lands whole as it
    // connects, where the ones closed dribble theirs).
    let mut attempts = 0;
    let (granted, stream, keys) = loop {
        attempts += 1;
        let nonce = u64::from_le_bytes(crate::random::bytes()?[..8].try_into().unwrap_or_default());
        let machine = BindClient::new(&info.spec(), 0, nonce, false);
        let exchanged = exchange(server, config, machine, |event| match event {
            BindEvent::Refused(r) => Some(Err(super::super::udp_bind::refusal_error(info, r))),
            BindEvent::Granted(g) => Some(Ok(g)),
            _ => None,
        });
        match exchanged {
            Err(Unanswered) if attempts < BIND_ATTEMPTS => std::thread::sleep(Duration::from_millis(attempts)),
            Err(Unanswered) => return Err(BindError::Busy),
            Ok(bound) => break bound?,
        }
    };
    let dead_after = config.timing.dead_after;
    let proven = keys.as_ref().map(|k| k.peer());
    let seal = keys.map(|k| Arc::new(k.session(granted.binding)));
    let records = seal.as_ref().map(|_| framed::Records::new());
    // A plain connection's reader waits in its receive: its receives block, each for at most a tick
    // of the kernel's clock (every other read and write of it still returns at once).
    let receive_wait = match seal {
        None => tiercel_sys::tcp::set_receive_wait(&stream, crate::waiting::RECEIVE_WAIT),
        Some(_) => None,
    };
    let link = Link {
        stream,
        seal,
        server,
        writing: Mutex::new(()),
        demux: Mutex::new(Demux {
            reading: false,
            away: false,
            heir: None,
            frames: Deframer::new(BUFFER, stream::max_frame(config.timing.max_message)),
            records,
            mail: Vec::new(),
            expecting: 0,
            sent: 0,
            heard: Instant::now(),
            broken: None,
            pumped: Instant::now(),
            wakes: Default::default(),
        }),
        silence: dead_after.max(MIN_SILENCE),
        send_timeout: dead_after,
        reads_block: std::sync::atomic::AtomicBool::new(receive_wait.is_some()),
        receive_wait: receive_wait.unwrap_or_default(),
        #[cfg(feature = "async")]
        reactor: Default::default(),
    };
    Ok(Granted {
        link,
        id: granted.binding,
        incarnation: granted.incarnation,
        slots: granted.grant.slots.clamp(1, 1 << 16),
        features: granted.grant.features,
        procedures: granted.procedures,
        proven,
    })
}

/// What the server exports, asked over TCP: one connection per interface (the server answers a
/// listing and closes).
pub(crate) fn list(server: SocketAddr, config: &ClientConfig) -> Result<Vec<crate::ExportInfo>, BindError> {
    super::super::udp_bind::list_each(server, |index, offset| {
        let nonce = u64::from_le_bytes(crate::random::bytes()?[..8].try_into().unwrap_or_default());
        let machine = BindClient::listing_from(index, offset, nonce, false);
        match exchange(server, config, machine, super::super::udp_bind::listed) {
            Ok(listed) => listed.map(|(listed, _, _)| listed),
            Err(Unanswered) => Err(BindError::Busy),
        }
    })
}

/// The static public key the server at `server` tells over TCP (`None`: it has none), plain.
pub(crate) fn ask_key(server: SocketAddr, config: &ClientConfig) -> Result<Option<crate::PublicKey>, BindError> {
    let nonce = u64::from_le_bytes(crate::random::bytes()?[..8].try_into().unwrap_or_default());
    let machine = BindClient::asking_key(nonce, false);
    let plain = ClientConfig { server_key: None, ..config.clone() };
    match exchange(server, &plain, machine, super::super::udp_bind::told_key) {
        Ok(told) => told.map(|(key, _, _)| key),
        Err(Unanswered) => Err(BindError::Busy),
    }
}

/// Connects to `server` and runs a bind exchange (a bind or a listing) over the connection: the
/// request, a challenge answered if the server asks for the shared secret, and the answer, which
/// `on` turns into the outcome (`None`: not an answer to this request). Everything within
/// `Timing::dead_after`. With the server's key in `config`, the request travels in a secure
/// handshake's first message and only an answer that opens with the server's key is read: the
/// handshake's keys come with the outcome.
fn exchange<T>(
    server: SocketAddr,
    config: &ClientConfig,
    machine: BindClient,
    on: impl FnMut(BindEvent<'_>) -> Option<Result<T, BindError>>,
) -> Result<Result<Exchanged<T>, BindError>, Unanswered> {
    let mut answered = false;
    match exchange_answered(server, config, machine, on, &mut answered) {
        Err(BindError::Busy) if !answered => Err(Unanswered),
        outcome => Ok(outcome),
    }
}

/// What an exchange came to: its outcome, the connection, and a secure handshake's keys.
type Exchanged<T> = (T, TcpStream, Option<Keys>);

/// The server closed the connection before it answered anything.
struct Unanswered;

/// Binds at most this many times over as many connections when the server closes each before
/// answering.
const BIND_ATTEMPTS: u64 = 3;

/// [`exchange`], setting `answered` once an answer has come (a closed connection is
/// `BindError::Busy` either way).
fn exchange_answered<T>(
    server: SocketAddr,
    config: &ClientConfig,
    mut machine: BindClient,
    mut on: impl FnMut(BindEvent<'_>) -> Option<Result<T, BindError>>,
    answered: &mut bool,
) -> Result<Exchanged<T>, BindError> {
    // Measure the tick counter's rate (2 ms) now, not on the first call.
    let _ = tiercel_sys::clock::ticks_per_second();
    let dead_after = config.timing.dead_after;
    let stream = tiercel_sys::tcp::connect(server, dead_after).map_err(|e| match e.kind() {
        std::io::ErrorKind::ConnectionRefused => BindError::NoServer(server),
        std::io::ErrorKind::TimedOut => BindError::Unreachable(server),
        _ => BindError::Io(e),
    })?;
    tiercel_sys::tcp::prepare(&stream, dead_after)?;
    let bad = |why: &'static str| BindError::Protocol(Violation::BindAnswer(why));
    let until = Instant::now() + dead_after;
    let mut secure = SecureBind::new(config)?;
    // With a secure handshake the secret is its pre-shared key, proven by the handshake itself.
    let secret = config.secret.as_ref().filter(|_| secure.is_none()).map(|s| s as &dyn Keyed);
    let mut opened = Vec::new();
    let mut frames = Deframer::new(PREFIX_LEN + 4 * crate::rendezvous::MAX_MESSAGE, 4 * crate::rendezvous::MAX_MESSAGE);
    let send = |packet: &[u8]| {
        let prefix = stream::prefix(packet.len());
        framed::send(&stream, &mut [IoSlice::new(&prefix), IoSlice::new(packet)], dead_after)
    };
    // A server with no room closes the connection at once: writing to it may fail already.
    let closed = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::UnexpectedEof => {
            BindError::Busy
        }
        _ => BindError::Io(e),
    };
    let request = |machine: &BindClient, secure: &mut Option<SecureBind>| -> Result<Vec<u8>, BindError> {
        let plain = machine.packet();
        Ok(match secure {
            Some(s) => s.datagram(&plain)?.to_vec(),
            None => plain,
        })
    };
    send(&request(&machine, &mut secure)?).map_err(closed)?;
    // At most three answers: a challenge, a refusal by an interface's other copy (then the bind
    // by procedure names), then the answer.
    for _ in 0..tiercel_proto::bind::MAX_REQUESTS {
        loop {
            match frames.next() {
                Ok(Next::Frame(_)) => break,
                Ok(_) => {}
                Err(_) => return Err(bad("malformed bind answer")),
            }
            if !framed::receive(&stream, &mut frames).map_err(closed)? {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() || !tiercel_sys::udp::wait_readable_fd(&stream, Some(left))? {
                    return Err(BindError::Unreachable(server));
                }
            }
        }
        *answered = true;
        let answer = match secure.as_mut() {
            Some(s) => {
                // Only the server's answer, opened with its key, is read: anything else is a
                // server that cannot prove the key (or says it cannot read the handshake).
                let frame = frames.frame();
                opened.resize(frame.len(), 0);
                let hello = s.hello.as_mut().ok_or(bad("an answer before the handshake"))?;
                let Some((len, keys)) = hello.welcome(frame, &mut opened) else {
                    return Err(BindError::KeyNotProven(server, s.server));
                };
                s.keys = Some(keys);
                &opened[..len]
            }
            None => frames.frame(),
        };
        let p = Packet::new_checked(answer).map_err(|_| bad("malformed bind answer"))?;
        match machine.handle(&p, secret) {
            BindEvent::SendAgain => {
                let again = request(&machine, &mut secure)?;
                frames.consume();
                send(&again).map_err(closed)?;
            }
            event => {
                let keys = secure.and_then(|s| s.keys);
                return match on(event) {
                    Some(outcome) => outcome.map(|t| (t, stream, keys)),
                    None => Err(bad("bind answer for another request")),
                };
            }
        }
    }
    Err(bad("a second challenge"))
}
