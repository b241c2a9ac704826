use super::super::wire::PROOF_LEN;
use super::super::{Admission, BindDecision, BindServer, Challenges, Refused, ServerAuth};
use super::*;

/// A stand-in for a keyed hash: good enough to tell secrets and transcripts apart in tests.
struct Toy(u8);

impl Keyed for Toy {
    fn prove(&self, transcript: &[u8]) -> [u8; PROOF_LEN] {
        let mut out = [self.0; PROOF_LEN];
        for (i, b) in transcript.iter().enumerate() {
            out[i % PROOF_LEN] = out[i % PROOF_LEN].wrapping_mul(31).wrapping_add(*b);
        }
        out
    }
    fn verify(&self, transcript: &[u8], proof: &[u8; PROOF_LEN]) -> bool {
        self.prove(transcript) == *proof
    }
}

impl Challenges for Toy {
    fn challenge(&self, peer: &[u8], nonce: u64) -> [u8; CHALLENGE_LEN] {
        let mut t = peer.to_vec();
        t.extend_from_slice(&nonce.to_le_bytes());
        self.prove(&t)[..CHALLENGE_LEN].try_into().unwrap()
    }
    fn check(&self, peer: &[u8], nonce: u64, challenge: &[u8; CHALLENGE_LEN]) -> bool {
        self.challenge(peer, nonce) == *challenge
    }
}

const BANK: InterfaceSpec<'static> = InterfaceSpec {
    name: "Bank",
    id: 10,
    version: 1,
    fingerprint: 99,
    signature: "deposit(u64)\nwithdraw(u64) -> bool",
    procedures: &[ProcedureShape { name: 1, shape: 11 }, ProcedureShape { name: 2, shape: 22 }],
};

fn server<'a>(exports: &'a [InterfaceSpec<'a>], auth: Option<ServerAuth<'a>>) -> BindServer<'a> {
    BindServer { exports, auth, incarnation: 7, key_required: false, key: None, max_datagram: 1472, trailers: true }
}

/// The server's decision on the client's current request from peer "a".
fn decide(s: &BindServer<'_>, c: &BindClient) -> BindDecision {
    let bytes = c.packet();
    s.on_request(&Packet::new_checked(&bytes[..]).unwrap(), b"a", bytes.len())
}

fn admitted(d: BindDecision) -> Admission {
    match d {
        BindDecision::Admit(a) => a,
        other => panic!("not admitted: {other:?}"),
    }
}

#[test]
fn a_listing_is_never_longer_than_its_request() {
    let s = server(&[BANK], None);
    let c = BindClient::listing(0, 5, false);
    let padded = c.packet();
    let p = Packet::new_checked(&padded[..]).unwrap();
    let BindDecision::Answer { packet, .. } = s.on_request(&p, b"a", padded.len()) else { panic!("not listed") };
    assert!(packet.len() <= padded.len());
    // Cut short (the padding left off): too short to carry the name, dropped rather than answered.
    let short = &padded[..HEADER_LEN + super::super::wire::REQUEST_LEN];
    let mut short = short.to_vec();
    Packet::new_unchecked(&mut short[..])
        .set_lengths(super::super::wire::REQUEST_LEN as u32, super::super::wire::REQUEST_LEN as u32);
    let p = Packet::new_checked(&short[..]).unwrap();
    assert!(matches!(s.on_request(&p, b"a", 80), BindDecision::Malformed));
}

#[test]
fn a_matching_request_is_granted() {
    let s = server(&[BANK], None);
    let mut c = BindClient::new(&BANK, 65000, 5, false);
    assert_eq!(c.packet().len(), PADDED_REQUEST);
    let a = admitted(decide(&s, &c));
    assert_eq!((a.export, a.max_datagram), (0, 1472), "the smaller datagram of the two sides");
    let reply = a.grant(&s, 3, 0xabc, 16, 0);
    let event = c.handle(&Packet::new_checked(&reply[..]).unwrap(), None);
    let BindEvent::Granted(g) = event else { panic!("{event:?}") };
    assert_eq!((g.binding, g.token, g.incarnation, g.grant.slots, g.grant.max_datagram), (3, 0xabc, 7, 16, 1472));
}

#[test]
fn every_kind_of_drift_is_refused_with_what_the_server_exports() {
    let s = server(&[BANK], None);
    let cases = [
        (InterfaceSpec { id: 11, ..BANK }, Refused::UnknownInterface),
        (InterfaceSpec { version: 2, ..BANK }, Refused::VersionMismatch),
        // `deposit` of another shape.
        (
            InterfaceSpec { fingerprint: 98, procedures: &[ProcedureShape { name: 1, shape: 12 }], ..BANK },
            Refused::InterfaceMismatch,
        ),
    ];
    for (spec, want) in cases {
        let mut c = BindClient::new(&spec, 1472, 5, false);
        let BindDecision::Answer { packet, refused } = decide(&s, &c) else { panic!("{spec:?} was admitted") };
        assert_eq!(refused, want);
        assert!(packet.len() <= PADDED_REQUEST, "never more than the request");
        let event = c.handle(&Packet::new_checked(&packet[..]).unwrap(), None);
        match (want, event) {
            (Refused::UnknownInterface, BindEvent::Refused(Refusal::UnknownInterface)) => {}
            (Refused::VersionMismatch, BindEvent::Refused(Refusal::VersionMismatch(r)))
            | (
                Refused::InterfaceMismatch,
                BindEvent::Refused(Refusal::ProcedureMismatch { procedure: 0, exported: r }),
            ) => {
                assert_eq!((r.version, r.fingerprint), (1, 99));
                assert_eq!(r.signature, BANK.signature.as_bytes());
                assert_eq!(r.procedures.shapes().collect::<Vec<_>>(), BANK.procedures);
            }
            (want, event) => panic!("{want:?}: {event:?}"),
        }
    }
}

#[test]
fn a_client_whose_copy_differs_binds_by_procedure_names_where_every_shared_one_agrees() {
    // The server's copy gained `audit` first and `close` last; the client has `deposit`,
    // `withdraw` and `rename`, which the server lacks.
    let server_procedures = [
        ProcedureShape { name: 9, shape: 90 },
        ProcedureShape { name: 2, shape: 22 },
        ProcedureShape { name: 1, shape: 11 },
        ProcedureShape { name: 8, shape: 80 },
    ];
    let exported = InterfaceSpec { fingerprint: 1234, procedures: &server_procedures, ..BANK };
    let s = server(std::slice::from_ref(&exported), None);
    let ours = [
        ProcedureShape { name: 1, shape: 11 },
        ProcedureShape { name: 2, shape: 22 },
        ProcedureShape { name: 7, shape: 70 },
    ];
    let mut c = BindClient::new(&InterfaceSpec { procedures: &ours, ..BANK }, 1472, 5, false);
    let BindDecision::Answer { packet, refused: Refused::InterfaceMismatch } = decide(&s, &c) else {
        panic!("not refused")
    };
    assert_eq!(c.handle(&Packet::new_checked(&packet[..]).unwrap(), None), BindEvent::SendAgain);
    assert_eq!(c.procedure_map(), Some(&[2, 1, ABSENT][..]));
    let a = admitted(decide(&s, &c));
    let reply = a.grant(&s, 3, 0xabc, 16, 0);
    assert!(matches!(c.handle(&Packet::new_checked(&reply[..]).unwrap(), None), BindEvent::Granted(_)));
    // A second refusal after matching ends the bind instead of going round again.
    let BindDecision::Answer { packet, .. } = decide(&server(&[BANK], None), &c) else { panic!("admitted") };
    let event = c.handle(&Packet::new_checked(&packet[..]).unwrap(), None);
    assert!(matches!(event, BindEvent::Refused(Refusal::InterfaceMismatch(_))), "{event:?}");
}

#[test]
fn a_server_exporting_two_versions_binds_each_client_to_its_own() {
    let v2 = InterfaceSpec { version: 2, fingerprint: 200, ..BANK };
    let exports = [BANK, v2];
    let s = server(&exports, None);
    for (spec, export) in [(BANK, 0), (v2, 1)] {
        let c = BindClient::new(&spec, 1472, 5, false);
        assert_eq!(admitted(decide(&s, &c)).export, export);
    }
}

#[test]
fn answers_never_exceed_the_budget() {
    let long = "p(u8)\n".repeat(1000);
    let exports = [InterfaceSpec { signature: &long, ..BANK }];
    let s = server(&exports, None);
    let c = BindClient::new(&InterfaceSpec { fingerprint: 1, ..BANK }, 1472, 5, false);
    let bytes = c.packet();
    for budget in [0, 80, 200, PADDED_REQUEST] {
        let d = s.on_request(&Packet::new_checked(&bytes[..]).unwrap(), b"a", budget);
        let BindDecision::Answer { packet, .. } = d else { panic!("admitted") };
        // The fixed part of a refusal always goes; the signature only as far as the budget allows.
        assert!(
            packet.len() <= budget.max(HEADER_LEN + super::super::wire::REFUSAL_LEN),
            "{} for a budget of {budget}",
            packet.len()
        );
    }
    assert!(long.len() > PADDED_REQUEST, "the signature had to be cut");
}

#[test]
fn stale_and_foreign_answers_are_ignored() {
    let s = server(&[BANK], None);
    let mut c = BindClient::new(&BANK, 1472, 5, false);
    let other = BindClient::new(&BANK, 1472, 6, false);
    let reply = admitted(decide(&s, &other)).grant(&s, 1, 1, 1, 0);
    assert_eq!(c.handle(&Packet::new_checked(&reply[..]).unwrap(), None), BindEvent::Ignored, "another nonce");
    let odd = Header { status: Status::TooLarge, ..Header::new(Kind::Reject) };
    let mut b = odd.to_bytes().to_vec();
    b.extend_from_slice(&BindRefusal::nothing(5, 1).to_bytes(100));
    b[24..28].copy_from_slice(&(super::super::wire::REFUSAL_LEN as u32).to_le_bytes());
    assert_eq!(c.handle(&Packet::new_checked(&b[..]).unwrap(), None), BindEvent::Ignored, "no bind answer");
    let zero_slots = admitted(decide(&s, &c)).grant(&s, 1, 1, 0, 0);
    assert_eq!(c.handle(&Packet::new_checked(&zero_slots[..]).unwrap(), None), BindEvent::Ignored);
}

#[test]
fn a_shared_secret_is_proven_both_ways() {
    let (secret, challenges) = (Toy(1), Toy(2));
    let auth = ServerAuth { secret: &secret, challenges: &challenges };
    let s = server(&[BANK], Some(auth));
    let mut c = BindClient::new(&BANK, 1472, 5, false);
    let BindDecision::Answer { packet, refused: Refused::Challenged } = decide(&s, &c) else { panic!() };
    // Without a secret the client gives up; with the wrong one the server refuses the proof.
    assert_eq!(
        c.clone().handle(&Packet::new_checked(&packet[..]).unwrap(), None),
        BindEvent::Refused(Refusal::AuthRequired)
    );
    let mut wrong = c.clone();
    assert_eq!(wrong.handle(&Packet::new_checked(&packet[..]).unwrap(), Some(&Toy(9))), BindEvent::SendAgain);
    let BindDecision::Answer { refused: Refused::AuthFailed, packet: nothing } = decide(&s, &wrong) else { panic!() };
    assert!(!String::from_utf8_lossy(&nothing).contains("deposit"), "nothing told before proof");
    assert_eq!(c.handle(&Packet::new_checked(&packet[..]).unwrap(), Some(&secret)), BindEvent::SendAgain);
    let a = admitted(decide(&s, &c));
    // The same proof from another peer fails: challenges are bound to who asked.
    let bytes = c.packet();
    let elsewhere = s.on_request(&Packet::new_checked(&bytes[..]).unwrap(), b"b", bytes.len());
    assert!(matches!(elsewhere, BindDecision::Answer { refused: Refused::AuthFailed, .. }));
    let reply = a.grant(&s, 4, 44, 8, 0);
    assert!(matches!(
        c.clone().handle(&Packet::new_checked(&reply[..]).unwrap(), Some(&secret)),
        BindEvent::Granted(Granted { binding: 4, token: 44, .. })
    ));
    // A grant proven with another secret, or not proven at all, is refused.
    let impostor = server(&[BANK], Some(ServerAuth { secret: &Toy(9), challenges: &challenges }));
    let forged = a.grant(&impostor, 4, 44, 8, 0);
    assert!(matches!(
        c.clone().handle(&Packet::new_checked(&forged[..]).unwrap(), Some(&secret)),
        BindEvent::Refused(Refusal::AuthFailed(_))
    ));
    let unproven = a.grant(&server(&[BANK], None), 4, 44, 8, 0);
    assert!(matches!(
        c.handle(&Packet::new_checked(&unproven[..]).unwrap(), Some(&secret)),
        BindEvent::Refused(Refusal::AuthFailed(_))
    ));
}

#[test]
fn a_rendezvous_answers_only_a_request_that_asked_and_is_proven_like_a_grant() {
    let place = Rendezvous { name: [9; 16], pid: 4242, uid: 1000 };
    let s = server(&[BANK], None);
    let mut asked = BindClient::new(&BANK, 1472, 5, false).asking_rendezvous();
    let reply = admitted(decide(&s, &asked)).rendezvous(&s, place);
    assert_eq!(
        asked.handle(&Packet::new_checked(&reply[..]).unwrap(), None),
        BindEvent::Rendezvous { rendezvous: place, incarnation: 7 }
    );
    // A client that did not ask (or whose request an attacker answers with a rendezvous) ignores it.
    let mut plain = BindClient::new(&BANK, 1472, 5, false);
    assert!(!admitted(decide(&s, &plain)).request.rendezvous);
    assert_eq!(plain.handle(&Packet::new_checked(&reply[..]).unwrap(), None), BindEvent::Ignored);
    // With a secret, the rendezvous is proven: a holder of another secret cannot redirect.
    let (secret, challenges) = (Toy(1), Toy(2));
    let s = server(&[BANK], Some(ServerAuth { secret: &secret, challenges: &challenges }));
    let mut c = BindClient::new(&BANK, 1472, 5, false).asking_rendezvous();
    let BindDecision::Answer { packet, .. } = decide(&s, &c) else { panic!("no challenge") };
    assert_eq!(c.handle(&Packet::new_checked(&packet[..]).unwrap(), Some(&secret)), BindEvent::SendAgain);
    let a = admitted(decide(&s, &c));
    let proven = a.rendezvous(&s, place);
    assert!(matches!(
        c.clone().handle(&Packet::new_checked(&proven[..]).unwrap(), Some(&secret)),
        BindEvent::Rendezvous { rendezvous, .. } if rendezvous == place
    ));
    let impostor = server(&[BANK], Some(ServerAuth { secret: &Toy(9), challenges: &challenges }));
    let forged = a.rendezvous(&impostor, Rendezvous { pid: 1, ..place });
    assert!(matches!(
        c.handle(&Packet::new_checked(&forged[..]).unwrap(), Some(&secret)),
        BindEvent::Refused(Refusal::AuthFailed(_))
    ));
}

#[test]
fn the_grant_carries_the_features_both_sides_speak() {
    let s = server(&[BANK], None);
    let mut c = BindClient::new(&BANK, 1472, 5, false);
    let reply = admitted(decide(&s, &c)).grant(&s, 3, 1, 16, 0);
    let BindEvent::Granted(g) = c.handle(&Packet::new_checked(&reply[..]).unwrap(), None) else { panic!() };
    assert_eq!(g.grant.features, features::ALL);
    // A client of a later day speaks a feature this server does not: it is not granted.
    c.request.features = features::CONTEXT | 0x4000;
    let reply = admitted(decide(&s, &c)).grant(&s, 4, 1, 16, 0);
    let BindEvent::Granted(g) = c.handle(&Packet::new_checked(&reply[..]).unwrap(), None) else { panic!() };
    assert_eq!(g.grant.features, features::CONTEXT);
}

#[test]
fn a_request_in_another_protocol_version_gets_the_versions_spoken() {
    let s = server(&[BANK], None);
    let mut c = BindClient::new(&BANK, 1472, 5, false);
    // A newer client's request (its header and the request's first bytes are laid out alike).
    let mut newer = c.packet();
    newer[2] = crate::wire::VERSION + 1;
    let p = Packet::new_checked(&newer[..]).expect("a bind request of a newer version is read");
    let BindDecision::Answer { packet, refused } = s.on_request(&p, b"a", newer.len()) else { panic!() };
    assert_eq!(refused, Refused::ProtocolVersion);
    assert!(packet.len() < newer.len());
    let answer = Packet::new_checked(&packet[..]).unwrap();
    let expected = Refusal::ProtocolVersion { min: crate::wire::MIN_VERSION, max: crate::wire::VERSION };
    assert_eq!(c.handle(&answer, None), BindEvent::Refused(expected));
    // A newer server's refusal of this client's version, written in its own version, is read.
    let mut from_newer = packet.clone();
    from_newer[2] = crate::wire::VERSION + 1;
    from_newer[HEADER_LEN + 8..HEADER_LEN + 10].copy_from_slice(&[crate::wire::VERSION + 1, crate::wire::VERSION + 2]);
    let answer = Packet::new_checked(&from_newer[..]).unwrap();
    let expected = Refusal::ProtocolVersion { min: crate::wire::VERSION + 1, max: crate::wire::VERSION + 2 };
    assert_eq!(c.handle(&answer, None), BindEvent::Refused(expected));
    // Anything else in a version this client does not speak is not for it.
    let reply = admitted(decide(&s, &c)).grant(&s, 3, 1, 16, 0);
    let mut newer_grant = reply.clone();
    newer_grant[2] = crate::wire::VERSION + 1;
    assert!(Packet::new_checked(&newer_grant[..]).is_err(), "a grant is read only in a version spoken");
}

#[test]
fn busy_is_a_refusal() {
    let s = server(&[BANK], None);
    let mut c = BindClient::new(&BANK, 1472, 5, false);
    let busy = admitted(decide(&s, &c)).busy(&s);
    assert_eq!(c.handle(&Packet::new_checked(&busy[..]).unwrap(), None), BindEvent::Refused(Refusal::Busy));
}

#[test]
fn a_server_that_takes_only_secure_bindings_refuses_a_plain_request_and_tells_nothing() {
    let s = BindServer { key_required: true, ..server(&[BANK], None) };
    let mut c = BindClient::new(&BANK, 65000, 5, false);
    let bytes = c.packet();
    let BindDecision::Answer { packet, refused } = decide(&s, &c) else { panic!("not refused") };
    assert_eq!(refused, Refused::KeyRequired);
    assert!(packet.len() <= bytes.len());
    let p = Packet::new_checked(&packet[..]).unwrap();
    assert_eq!(c.handle(&p, None), BindEvent::Refused(Refusal::KeyRequired));
    // A listing is refused too.
    let l = BindClient::listing(0, 6, false);
    assert!(matches!(decide(&s, &l), BindDecision::Answer { refused: Refused::KeyRequired, .. }));
    // A request for the shared-memory rendezvous is admitted (the transport decides), and the
    // refusal it gets when it is not to be told reads as the same refusal.
    let mut r = BindClient::new(&BANK, 65000, 7, false).asking_rendezvous();
    let a = admitted(decide(&s, &r));
    let p = a.key_required(&s);
    assert_eq!(r.handle(&Packet::new_checked(&p[..]).unwrap(), None), BindEvent::Refused(Refusal::KeyRequired));
}

#[test]
fn a_server_tells_its_key_to_whoever_asks_in_fewer_bytes_than_asked_and_binds_nothing() {
    let (secret, challenges) = (Toy(1), Toy(2));
    let auth = ServerAuth { secret: &secret, challenges: &challenges };
    // Told before the secret is proven and though plain bindings are refused: the key is public.
    let keyed = BindServer { key_required: true, key: Some(&[5; 32]), ..server(&[BANK], Some(auth)) };
    for (s, told) in [(keyed, Some([5u8; 32])), (server(&[BANK], None), None)] {
        let mut c = BindClient::asking_key(11, false);
        let bytes = c.packet();
        let BindDecision::Answer { packet, refused } = decide(&s, &c) else { panic!("not answered") };
        assert_eq!(refused, Refused::KeyTold);
        assert!(packet.len() <= bytes.len());
        let p = Packet::new_checked(&packet[..]).unwrap();
        assert_eq!(c.handle(&p, None), BindEvent::ServerKey(told));
        // Not an answer to another request: not read as one.
        assert_eq!(BindClient::asking_key(12, false).handle(&p, None), BindEvent::Ignored);
        assert_eq!(BindClient::new(&BANK, 1472, 11, false).handle(&p, None), BindEvent::Ignored);
        assert_eq!(BindClient::listing(0, 11, false).handle(&p, None), BindEvent::Ignored);
    }
    // A request that allows too few bytes back for the answer gets none.
    let s = BindServer { key: Some(&[5; 32]), ..server(&[BANK], None) };
    let bytes = BindClient::asking_key(13, false).packet();
    let p = Packet::new_checked(&bytes[..]).unwrap();
    let budget = HEADER_LEN + crate::bind::wire::KEY_ANSWER_LEN - 1;
    assert!(matches!(s.on_request(&p, b"a", budget), BindDecision::Malformed));
}
