//! Protocol versions and features negotiated at bind time, against a live server and against a
//! stand-in for a server of a later protocol version (a UDP socket this test answers from).

use std::net::UdpSocket;
use std::time::Duration;

use tiercel::{BindError, Client, ClientConfig, Server, ServerConfig};
use tiercel_proto::bind::wire::{features, VersionRefusal, VERSIONS_LEN};
use tiercel_proto::bind::{BindDecision, BindServer};
use tiercel_proto::wire::{flags, Header, Kind, Packet, Status, HEADER_LEN, MIN_VERSION, VERSION};

#[tiercel::interface]
pub trait Echo {
    fn echo(&self, x: u64) -> u64;
}

struct Same;

impl Echo for Same {
    fn echo(&self, x: u64) -> u64 {
        x
    }
}

fn udp_only() -> ClientConfig {
    ClientConfig { shared_memory: false, ..ClientConfig::default() }
}

/// A bind request for `Echo` as this client would send it.
fn request() -> Vec<u8> {
    let info = <EchoClient as tiercel::Import>::INFO;
    let spec = tiercel_seeds::bind_spec(info);
    tiercel_proto::bind::BindClient::new(&spec, 1472, 42, false).packet()
}

#[test]
fn a_server_answers_a_newer_clients_bind_with_the_versions_it_speaks() {
    let server = Server::bind("127.0.0.1:0")
        .unwrap()
        .with_config(ServerConfig { shared_memory: false, ..ServerConfig::default() })
        .export(EchoServer::new(Same))
        .start()
        .unwrap();
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut newer = request();
    newer[2] = VERSION + 1;
    socket.send_to(&newer, server.addr()).unwrap();
    let mut buf = [0u8; 2048];
    let n = socket.recv(&mut buf).unwrap();
    let p = Packet::new_checked(&buf[..n]).unwrap();
    assert_eq!((p.kind(), p.status(), p.version()), (Kind::Reject, Status::UnsupportedVersion, VERSION));
    assert_eq!(n, HEADER_LEN + VERSIONS_LEN, "nothing but the versions");
    let versions = VersionRefusal::parse(p.payload()).unwrap();
    assert_eq!(versions, VersionRefusal { nonce: 42, min: MIN_VERSION, max: VERSION });
    assert_eq!(server.bindings(), 0);
    // This version's client binds as ever.
    let client: EchoClient = Client::connect(server.addr()).unwrap().with_config(udp_only()).import().unwrap();
    assert_eq!(client.echo(7).unwrap(), 7);
}

#[test]
fn a_client_told_its_version_is_not_spoken_says_so() {
    let fake = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = fake.local_addr().unwrap();
    let answer = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        let (n, from) = fake.recv_from(&mut buf).unwrap();
        let p = Packet::new_checked(&buf[..n]).unwrap();
        let nonce = VersionRefusal::nonce_of(p.payload()).unwrap();
        // A server of two versions later, which no longer speaks this one: its header is in its
        // own version, and the client reads it all the same.
        let mut reject = buf[..HEADER_LEN].to_vec();
        let mut h = Packet::new_unchecked(&mut reject[..]);
        h.set_kind(Kind::Reject);
        h.set_status(Status::UnsupportedVersion);
        h.set_lengths(VERSIONS_LEN as u32, VERSIONS_LEN as u32);
        reject[2] = VERSION + 2;
        reject.extend_from_slice(&VersionRefusal { nonce, min: VERSION + 1, max: VERSION + 2 }.to_bytes());
        fake.send_to(&reject, from).unwrap();
    });
    let err = Client::connect(addr).unwrap().with_config(udp_only()).import::<EchoClient>().map(|_| ()).unwrap_err();
    answer.join().unwrap();
    match err {
        BindError::ProtocolVersion { client, server_min, server_max } => {
            assert_eq!((client, server_min, server_max), (VERSION, VERSION + 1, VERSION + 2))
        }
        other => panic!("{other:?}"),
    }
}

/// Answers the first bind request `fake` receives, for `info`'s interface, as a server of this
/// version that grants only the features `granted`: it binds with the protocol machine, which grants
/// every feature the client asked for, then rewrites the grant's.
fn grant_only(fake: &UdpSocket, info: &tiercel::InterfaceInfo, granted: u16) {
    let spec = tiercel_seeds::bind_spec(info);
    let exports = [spec];
    let machine = BindServer {
        exports: &exports,
        auth: None,
        incarnation: 9,
        key_required: false,
        key: None,
        max_datagram: 1472,
        trailers: true,
    };
    let mut buf = [0u8; 2048];
    let (n, from) = fake.recv_from(&mut buf).unwrap();
    let p = Packet::new_checked(&buf[..n]).unwrap();
    let BindDecision::Admit(admission) = machine.on_request(&p, b"x", n) else { panic!("not admitted") };
    let mut grant = admission.grant(&machine, 1, 77, 4, 0);
    assert_eq!(u16::from_le_bytes([grant[HEADER_LEN + 29], grant[HEADER_LEN + 30]]), features::ALL);
    grant[HEADER_LEN + 29..HEADER_LEN + 31].copy_from_slice(&granted.to_le_bytes());
    fake.send_to(&grant, from).unwrap();
}

#[test]
fn a_client_sends_no_context_to_a_server_that_did_not_grant_it() {
    // A server of this version that grants no features.
    let fake = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = fake.local_addr().unwrap();
    let seen = std::thread::spawn(move || {
        grant_only(&fake, <EchoClient as tiercel::Import>::INFO, 0);
        let mut buf = [0u8; 2048];
        // The call that follows: a deadline was set, and no context block comes with it.
        let (n, _) = fake.recv_from(&mut buf).unwrap();
        let call = Packet::new_checked(&buf[..n]).unwrap();
        (call.kind(), call.flags() & flags::CONTEXT)
    });
    let config = ClientConfig { deadline: Some(Duration::from_millis(300)), ..udp_only() };
    let client: EchoClient = Client::connect(addr).unwrap().with_config(config).import().unwrap();
    // Nobody answers the call: it ends at its deadline, which the client kept to itself.
    let err = client.echo(1).unwrap_err();
    assert!(matches!(err, tiercel::CallError::DeadlineExceeded { .. }), "{err:?}");
    assert_eq!(seen.join().unwrap(), (Kind::Call, 0));
}

#[tiercel::interface]
pub trait Sink {
    fn take(&self, buf: tiercel::In<&[u8]>);
}

/// What a client sends of a 300-fragment call to a stand-in server that grants `granted` features,
/// challenges the slot's address when its first fragment comes, and acknowledges nothing: the
/// fragments that came before the challenge, and the furthest that came at all.
fn fragments_before_and_after_a_challenge(granted: u16) -> (Vec<(u16, bool)>, u16) {
    // With the large receive buffer tiercel's own sockets ask for: the client's 256 fragments come at
    // once, and a default buffer may drop the last of them before this thread reads them.
    let fake = tiercel_sys::udp::bind("127.0.0.1:0".parse().unwrap(), false).unwrap();
    fake.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let addr = fake.local_addr().unwrap();
    let seen = std::thread::spawn(move || {
        grant_only(&fake, <SinkClient as tiercel::Import>::INFO, granted);
        let mut buf = [0u8; 2048];
        // The call's fragments, first sent and then resent at the retransmission timeout, until
        // the client gives up at its deadline.
        let (mut before, mut furthest, mut challenged) = (Vec::new(), 0, false);
        while let Ok((n, from)) = fake.recv_from(&mut buf) {
            let p = Packet::new_checked(&buf[..n]).unwrap();
            if p.kind() != Kind::Call {
                continue;
            }
            assert_eq!(p.frag_count(), 300);
            furthest = furthest.max(p.frag_index());
            if !challenged {
                before.push((p.frag_index(), p.flags() & flags::PLEASE_ACK != 0));
                challenged = true;
                let h = Header {
                    status: Status::AddressUnproven,
                    binding: p.binding(),
                    token: p.token(),
                    slot: p.slot(),
                    seq: p.seq(),
                    payload_len: 16,
                    message_len: 16,
                    ..Header::new(Kind::Reject)
                };
                let mut reject = h.to_bytes().to_vec();
                reject.extend_from_slice(&[5; 16]);
                fake.send_to(&reject, from).unwrap();
            }
        }
        (before, furthest)
    });
    let config = ClientConfig { deadline: Some(Duration::from_millis(300)), max_datagram: 1472, ..udp_only() };
    let client: SinkClient = Client::connect(addr).unwrap().with_config(config).import().unwrap();
    let data = vec![7u8; 300 * (1472 - HEADER_LEN) - 64];
    let err = client.take(tiercel::In(&data)).unwrap_err();
    assert!(matches!(err, tiercel::CallError::DeadlineExceeded { .. }), "{err:?}");
    seen.join().unwrap()
}

#[test]
fn a_client_keeps_to_the_window_its_server_granted() {
    // Before the server has answered the slot, its first fragment goes alone and asks for an
    // acknowledgement; once challenged, the window. Both speak wide windows: 256 fragments of a
    // 1,472-byte datagram go before an acknowledgement.
    let (before, furthest) = fragments_before_and_after_a_challenge(features::ALL);
    assert_eq!(before, [(0, true)]);
    assert_eq!(furthest, tiercel_proto::fragment::MAX_WINDOW - 1);
    // A server that does not: 64, what an acknowledgement's mask covers.
    let narrow = features::ALL & !features::WIDE_WINDOW;
    let (before, furthest) = fragments_before_and_after_a_challenge(narrow);
    assert_eq!(before, [(0, true)]);
    assert_eq!(furthest, tiercel_proto::fragment::NARROW_WINDOW - 1);
}
