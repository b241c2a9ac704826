//! Capability-checked bindings: the per-binding token on every packet and the optional shared
//! secret proven at bind time. Each test backs a claim of `docs/security.md`.

use std::net::UdpSocket;
use std::time::Duration;

use tiercel::{BindError, Client, ClientConfig, Execution, RunningServer, Secret, Server, ServerConfig};
use tiercel_proto::bind::wire::{BindChallenge, BindProof, BindRequest, CHALLENGE_LEN, CHALLENGE_MSG_LEN, PROOF_LEN};
use tiercel_proto::wire::{Header, Kind, Packet, Status};
use tiercel_seeds::{self as seeds, SeedTest, TestClient, TestServer};

fn secret(byte: u8) -> Secret {
    Secret::new(&[byte; 32]).unwrap()
}

fn server(secret: Option<Secret>) -> RunningServer {
    let config = ServerConfig { secret, ..ServerConfig::default() };
    Server::bind("udp://127.0.0.1:0").unwrap().with_config(config).export(TestServer::new(SeedTest)).start().unwrap()
}

/// Imports over UDP (`tests/shm.rs` checks the secret over shared memory).
fn import(server: &RunningServer, secret: Option<Secret>) -> Result<TestClient, BindError> {
    let config = ClientConfig { secret, ..ClientConfig::default() };
    Client::connect(format!("udp://{}", server.addr())).unwrap().with_config(config).import()
}

#[test]
fn a_client_that_proves_the_secret_binds_and_calls() {
    let s = server(Some(secret(1)));
    let client = import(&s, Some(secret(1))).unwrap();
    seeds::check_all(&client, 0).unwrap();
    assert_eq!(s.stats().challenged, 1);
    assert_eq!(s.stats().auth_failed, 0);
    assert_eq!(s.bindings(), 1);
}

#[test]
fn a_client_without_the_secret_gets_no_binding() {
    let s = server(Some(secret(1)));
    let err = import(&s, None).unwrap_err();
    assert!(matches!(err, BindError::AuthenticationRequired), "{err}");
    assert_eq!(err.execution(), Execution::NeverRan);
    assert_eq!(s.bindings(), 0);
}

#[test]
fn a_client_with_another_secret_is_refused() {
    let s = server(Some(secret(1)));
    let err = import(&s, Some(secret(2))).unwrap_err();
    assert!(matches!(err, BindError::AuthenticationFailed(_)), "{err}");
    assert!(err.to_string().contains("secrets differ"), "{err}");
    assert_eq!(s.stats().auth_failed, 1);
    assert_eq!(s.bindings(), 0);
}

#[test]
fn a_client_with_a_secret_will_not_bind_to_a_server_that_cannot_prove_it() {
    let s = server(None);
    let err = import(&s, Some(secret(1))).unwrap_err();
    assert!(matches!(err, BindError::AuthenticationFailed(_)), "{err}");
}

/// Sends a bind request from `socket` and returns the first answer.
fn exchange(socket: &UdpSocket, request: &BindRequest) -> (Header, Vec<u8>) {
    let payload = request.to_bytes(0);
    let header =
        Header { payload_len: payload.len() as u32, message_len: payload.len() as u32, ..Header::new(Kind::Bind) };
    let mut datagram = header.to_bytes().to_vec();
    datagram.extend_from_slice(&payload);
    socket.send(&datagram).unwrap();
    let mut buf = [0u8; 2048];
    let n = socket.recv(&mut buf).unwrap();
    let p = Packet::new_checked(&buf[..n]).unwrap();
    (p.header(), p.payload().to_vec())
}

fn raw_socket(server: &RunningServer) -> UdpSocket {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.connect(server.addr()).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    socket
}

#[test]
fn challenges_are_bound_to_the_asking_address_and_nonce_and_proofs_cannot_be_forged() {
    let s = server(Some(secret(1)));
    let info = <TestClient as tiercel::Import>::INFO;
    let request = BindRequest {
        interface: info.id,
        version: info.version,
        max_datagram: 1400,
        nonce: 77,
        fingerprint: info.fingerprint(),
        proof: None,
        rendezvous: false,
        features: tiercel_proto::bind::wire::features::ALL,
        list: false,
        ask_key: false,
    };
    let a = raw_socket(&s);
    let (h, payload) = exchange(&a, &request);
    assert_eq!((h.kind, h.status), (Kind::Reject, Status::AuthRequired));
    let BindChallenge { nonce, challenge } = BindChallenge::parse(&payload).unwrap();
    assert_eq!(nonce, 77);
    // The challenge answers only what was asked: the unauthenticated client learns nothing else,
    // and the answer is no larger than the request (no amplification).
    assert_eq!(payload.len(), CHALLENGE_MSG_LEN);
    assert!(payload.len() <= request.to_bytes(0).len());

    // A proof made with the right challenge but the wrong key is refused.
    let wrong = BindProof { challenge, mac: [0x42; PROOF_LEN] };
    let (h, _) = exchange(&a, &BindRequest { proof: Some(wrong), ..request });
    assert_eq!((h.kind, h.status), (Kind::Reject, Status::AuthFailed));

    // A challenge made up by the client is refused even with a matching keyed hash: only the
    // server's own challenges count (here the attacker does not have the secret anyway, but a
    // replayed proof is no better: see below).
    let made_up = [9u8; CHALLENGE_LEN];
    let (h, _) =
        exchange(&a, &BindRequest { proof: Some(BindProof { challenge: made_up, mac: [0; PROOF_LEN] }), ..request });
    assert_eq!(h.status, Status::AuthFailed);

    // A real client's proof, replayed from another address, is refused: the challenge belongs to
    // the address and nonce it was made for.
    let client = import(&s, Some(secret(1))).unwrap();
    drop(client);
    let proof_holder = raw_socket(&s);
    let (h, payload) = exchange(&proof_holder, &BindRequest { nonce: 5, ..request });
    assert_eq!(h.status, Status::AuthRequired);
    let their_challenge = BindChallenge::parse(&payload).unwrap().challenge;
    let transcript = BindRequest { nonce: 5, ..request }.proof_transcript(&their_challenge);
    let mac =
        *blake3::keyed_hash(&blake3::derive_key("tiercel 2026-11 binding secret", &[1; 32]), &transcript).as_bytes();
    let replayed = BindRequest { nonce: 5, proof: Some(BindProof { challenge: their_challenge, mac }), ..request };
    let (h, _) = exchange(&a, &replayed);
    assert_eq!(h.status, Status::AuthFailed, "a proof is good only from the address it was made for");
    let (h, _) = exchange(&proof_holder, &replayed);
    assert_eq!(h.kind, Kind::BindReply, "the same proof from its own address binds");
    assert_eq!(s.stats().auth_failed, 3);
}

#[test]
fn packets_without_the_binding_token_never_run_a_procedure() {
    let s = server(None);
    let client = import(&s, None).unwrap();
    client.null().unwrap();
    let binding = client.binding();
    let calls_before = s.stats().calls;
    let attacker = raw_socket(&s);
    let mut buf = [0u8; 2048];
    // The attacker knows the binding id, slot and sequence numbers (they are small and guessable)
    // but not the 128-bit token.
    for seq in 0..200u32 {
        let h = Header {
            binding: binding_id(binding),
            slot: seq % 4,
            seq: 1000 + seq,
            incarnation: s.incarnation(),
            token: u128::from(seq) * 0x9e37_79b9_7f4a_7c15,
            ..Header::new(Kind::Call)
        };
        attacker.send(&h.to_bytes()).unwrap();
        let n = attacker.recv(&mut buf).unwrap();
        let p = Packet::new_checked(&buf[..n]).unwrap();
        assert_eq!((p.kind(), p.status()), (Kind::Reject, Status::UnknownBinding));
    }
    assert_eq!(s.stats().calls, calls_before, "no forged call ran");
    // The real client's binding is undisturbed.
    seeds::check_all(&client, 1).unwrap();
}

fn binding_id(binding: &tiercel::Binding) -> u32 {
    binding.id()
}

/// A socket at `ip` that has bound to the Test interface over UDP, with the binding it was granted
/// and its address proved for slot 0 (as a client thread does on its first call).
fn bind_from(server: &RunningServer, ip: [u8; 4], nonce: u64) -> (UdpSocket, tiercel_proto::bind::Granted) {
    use tiercel_proto::bind::{BindClient, BindEvent};
    let socket = UdpSocket::bind((std::net::Ipv4Addr::from(ip), 0)).unwrap();
    socket.connect(server.addr()).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let spec = seeds::bind_spec(<TestClient as tiercel::Import>::INFO);
    let mut bind = BindClient::new(&spec, tiercel::config::MAX_UDP_PAYLOAD as u32, nonce, false);
    socket.send(&bind.packet()).unwrap();
    let mut buf = vec![0u8; 65_536];
    let g = loop {
        let n = socket.recv(&mut buf).expect("a bind reply");
        let Ok(p) = Packet::new_checked(&buf[..n]) else { continue };
        if let BindEvent::Granted(g) = bind.handle(&p, None) {
            break g;
        }
    };
    let probe = Header { binding: g.binding, token: g.token, incarnation: g.incarnation, ..Header::new(Kind::Probe) };
    socket.send(&probe.to_bytes()).unwrap();
    loop {
        let n = socket.recv(&mut buf).expect("a challenge");
        let Ok(p) = Packet::new_checked(&buf[..n]) else { continue };
        if p.kind() == Kind::Reject && p.status() == Status::AddressUnproven {
            let proof =
                Header { flags: tiercel_proto::wire::flags::ADDRESS_PROOF, payload_len: p.payload_len(), ..probe };
            socket.send(&[&proof.to_bytes()[..], p.payload()].concat()).unwrap();
            return (socket, g);
        }
    }
}

#[test]
fn partial_calls_from_one_address_hold_no_more_than_its_part_and_leave_others_room() {
    // 48 MiB for messages, of which UDP may hold half, and one address half of that; stalled calls
    // are held for a minute (not reclaimed while the test runs).
    let config = ServerConfig {
        message_memory: 48 << 20,
        binding_memory: 17 << 20,
        stalled_call: Duration::from_secs(60),
        ..ServerConfig::default()
    };
    let server = Server::bind("udp://127.0.0.1:0")
        .unwrap()
        .with_config(config)
        .export(TestServer::new(SeedTest))
        .start()
        .unwrap();
    // From 127.0.0.2, four bindings, each sending 6 MiB of a call that claims 8 MiB and never
    // sending the rest: 24 MiB sent, as much as UDP's whole share. (A call claiming more than the
    // address's part, 12 MiB, could never be put together, and is refused `TooLarge` at once.)
    let frag = tiercel::config::MAX_UDP_PAYLOAD - tiercel_proto::wire::HEADER_LEN;
    let len: u32 = 8 << 20;
    let count = (len as usize).div_ceil(frag) as u16;
    let payload = vec![0xa5u8; frag];
    let stalled: Vec<UdpSocket> = (0..4)
        .map(|b| {
            let (socket, g) = bind_from(&server, [127, 0, 0, 2], 500 + b);
            for index in 0..((6usize << 20) / frag) as u16 {
                let h = Header {
                    binding: g.binding,
                    token: g.token,
                    incarnation: g.incarnation,
                    seq: 1,
                    frag_index: index,
                    frag_count: count,
                    payload_len: frag as u32,
                    message_len: len,
                    ..Header::new(Kind::Call)
                };
                socket.send(&[&h.to_bytes()[..], &payload].concat()).unwrap();
                if index % 64 == 63 {
                    // Within what the receive buffer and the server's window hold.
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
            socket
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let held = server.message_memory();
    assert!(held > 4 << 20, "the partial calls were not held ({held} bytes): the test tests nothing");
    assert!(held <= (12 << 20) + (1 << 20), "one address holds {held} bytes, more than its part");
    // A client at another address still makes large calls over UDP, and every transport serves.
    let big: Vec<u8> = (0..4 << 20).map(seeds::pattern).collect();
    let client = import(&server, None).unwrap();
    client.bulk_in(tiercel::In(&big)).expect("a 4 MiB call beside the partial calls");
    seeds::every_transport_serves(server.addr()).expect("a client on every transport beside the partial calls");
    drop(stalled);
}
