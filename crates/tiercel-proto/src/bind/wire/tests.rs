use super::*;
use crate::bind::ProcedureShape;

#[test]
fn requests_round_trip_with_and_without_proof_and_padding() {
    let mut r = BindRequest {
        interface: 1 << 40,
        version: 3,
        max_datagram: 1472,
        nonce: 9,
        fingerprint: 77,
        proof: None,
        rendezvous: false,
        features: features::ALL,
        list: false,
        ask_key: false,
    };
    assert_eq!(r.to_bytes(0).len(), REQUEST_LEN);
    assert_eq!(BindRequest::parse(&r.to_bytes(0)), Some(r));
    assert_eq!(BindRequest::parse(&r.to_bytes(1000)), Some(r), "padding is ignored");
    r.proof = Some(BindProof { challenge: [7; CHALLENGE_LEN], mac: [8; PROOF_LEN] });
    assert_eq!(BindRequest::parse(&r.to_bytes(200)), Some(r));
    assert_eq!(BindRequest::parse(&r.to_bytes(0)[..REQUEST_LEN - 1]), None, "truncated");
    let asking = BindRequest { rendezvous: true, ..r };
    assert_eq!(BindRequest::parse(&asking.to_bytes(0)), Some(asking));
    let listing = BindRequest { list: true, ..r };
    assert_eq!(BindRequest::parse(&listing.to_bytes(0)), Some(listing));
    let asking_key = BindRequest { ask_key: true, ..r };
    assert_eq!(BindRequest::parse(&asking_key.to_bytes(0)), Some(asking_key));
    let mut bad = r.to_bytes(0);
    bad[32] = 16;
    assert_eq!(BindRequest::parse(&bad), None, "unknown flag");
    let mut bad = r.to_bytes(0);
    bad[35] = 1;
    assert_eq!(BindRequest::parse(&bad), None, "reserved byte set");
    let unknown = BindRequest { features: 0x8000 | features::CONTEXT, ..r };
    assert_eq!(BindRequest::parse(&unknown.to_bytes(0)), Some(unknown), "features this side lacks are read");
    let mut bad = BindRequest { proof: None, ..r }.to_bytes(0);
    bad[60] = 1;
    assert_eq!(BindRequest::parse(&bad), None, "proof bytes without the flag");
}

#[test]
fn grants_challenges_and_refusals_round_trip() {
    let mut g = BindGrant {
        slots: 64,
        max_datagram: 65000,
        version: 3,
        nonce: 5,
        region: 1 << 20,
        proof: None,
        rendezvous: None,
        features: features::CANCEL,
    };
    assert_eq!(g.to_bytes().len(), GRANT_LEN);
    assert_eq!(BindGrant::parse(&g.to_bytes()), Some(g));
    let there = BindGrant { rendezvous: Some(Rendezvous { name: [4; 16], pid: 77, uid: 1000 }), ..g };
    assert_eq!(there.to_bytes().len(), RENDEZVOUS_GRANT_LEN);
    assert_eq!(BindGrant::parse(&there.to_bytes()), Some(there));
    assert_eq!(BindGrant::parse(&there.to_bytes()[..GRANT_LEN]), None, "the flag without the rendezvous");
    let mut longer = g.to_bytes();
    longer.extend_from_slice(&[0; 24]);
    assert_eq!(BindGrant::parse(&longer), None, "a rendezvous without the flag");
    g.proof = Some([1; PROOF_LEN]);
    assert_eq!(BindGrant::parse(&g.to_bytes()), Some(g));
    assert_eq!(BindGrant::parse(&g.to_bytes()[1..]), None);
    let mut bad = BindGrant { proof: None, ..g }.to_bytes();
    bad[40] = 1;
    assert_eq!(BindGrant::parse(&bad), None, "proof bytes without the flag");
    let c = BindChallenge { nonce: 5, challenge: [3; CHALLENGE_LEN] };
    assert_eq!(BindChallenge::parse(&c.to_bytes()), Some(c));
    assert_eq!(BindChallenge::parse(&[0; 23]), None);
    let shapes = [ProcedureShape { name: 1, shape: 2 }, ProcedureShape { name: 3, shape: 4 }];
    let table = ProcedureTable::encode(&shapes);
    let r = BindRefusal {
        nonce: 1,
        version: 2,
        fingerprint: 3,
        procedures: ProcedureTable { total: 2, entries: &table },
        signature: b"null()\nadd(i32, i32) -> i32",
    };
    let bytes = r.to_bytes(1200);
    let whole = BindRefusal::parse(&bytes).unwrap();
    assert_eq!(whole, r.clone());
    assert!(whole.procedures.is_whole());
    assert_eq!(whole.procedures.shapes().collect::<Vec<_>>(), shapes);
    let cut = r.to_bytes(REFUSAL_LEN + 2 * PROCEDURE_LEN + 4);
    assert_eq!(cut.len(), REFUSAL_LEN + 2 * PROCEDURE_LEN + 4, "the signature is cut to the limit");
    assert_eq!(BindRefusal::parse(&cut).unwrap().signature, b"null");
    let bytes = r.to_bytes(REFUSAL_LEN + PROCEDURE_LEN + 3);
    let short = BindRefusal::parse(&bytes).unwrap();
    assert_eq!((short.procedures.total, short.procedures.shapes().count()), (2, 1), "whole entries only");
    assert!(!short.procedures.is_whole() && short.signature == b"nul");
    assert_eq!(r.to_bytes(3).len(), REFUSAL_LEN, "never shorter than the fixed fields");
    assert_eq!(BindRefusal::parse(&[0; REFUSAL_LEN - 1]), None);
    let mut lying = r.to_bytes(1200);
    lying[22] = 9;
    assert_eq!(BindRefusal::parse(&lying), None, "more entries than procedures");
    let l = ExportListing {
        nonce: 1,
        count: 2,
        index: 1,
        version: 3,
        fingerprint: 4,
        name: b"Bank",
        signature: b"deposit(u64)\nwithdraw(u64) -> bool",
    };
    assert_eq!(ExportListing::parse(&l.to_bytes(1200)), Some(l.clone()));
    let cut = l.to_bytes(LISTING_LEN + 4 + 7);
    assert_eq!(ExportListing::parse(&cut).unwrap().signature, b"deposit", "the signature is cut to the budget");
    assert_eq!(ExportListing::parse(&cut[..LISTING_LEN + 3]), None, "the name cut");
    assert_eq!(BindGrant::parse(&l.to_bytes(1200)), None, "never read as a grant");
    let v = VersionRefusal { nonce: 7, min: 6, max: 9 };
    assert_eq!(VersionRefusal::parse(&v.to_bytes()), Some(v));
    assert_eq!(VersionRefusal::parse(&VersionRefusal { min: 9, max: 6, ..v }.to_bytes()), None, "empty range");
    assert_eq!(VersionRefusal::parse(&v.to_bytes()[..9]), None);
}

#[test]
fn transcripts_bind_every_field() {
    let r = BindRequest {
        interface: 1,
        version: 2,
        max_datagram: 3,
        nonce: 4,
        fingerprint: 5,
        proof: None,
        rendezvous: false,
        features: 0,
        list: false,
        ask_key: false,
    };
    let base = r.proof_transcript(&[0; CHALLENGE_LEN]);
    assert_ne!(base, r.proof_transcript(&[1; CHALLENGE_LEN]));
    for other in [
        BindRequest { interface: 9, ..r },
        BindRequest { version: 9, ..r },
        BindRequest { max_datagram: 9, ..r },
        BindRequest { nonce: 9, ..r },
        BindRequest { fingerprint: 9, ..r },
        BindRequest { rendezvous: true, ..r },
        BindRequest { features: 1, ..r },
        BindRequest { features: 0x100, ..r },
        BindRequest { list: true, ..r },
        BindRequest { ask_key: true, ..r },
    ] {
        assert_ne!(base, other.proof_transcript(&[0; CHALLENGE_LEN]), "{other:?}");
    }
    let g = BindGrant {
        slots: 1,
        max_datagram: 2,
        version: 3,
        nonce: 4,
        region: 5,
        proof: None,
        rendezvous: None,
        features: 0,
    };
    let base = g.proof_transcript(1, 2, 3, &[0; CHALLENGE_LEN]);
    assert_ne!(base, g.proof_transcript(1, 3, 3, &[0; CHALLENGE_LEN]));
    assert_ne!(base, g.proof_transcript(1, 2, 4, &[0; CHALLENGE_LEN]));
    assert_ne!(base, g.proof_transcript(2, 2, 3, &[0; CHALLENGE_LEN]));
    for other in [
        BindGrant { slots: 9, ..g },
        BindGrant { max_datagram: 9, ..g },
        BindGrant { version: 9, ..g },
        BindGrant { nonce: 9, ..g },
        BindGrant { region: 9, ..g },
        BindGrant { features: 2, ..g },
        BindGrant { features: 0x100, ..g },
        BindGrant { rendezvous: Some(Rendezvous { name: [0; 16], pid: 0, uid: 0 }), ..g },
        BindGrant { rendezvous: Some(Rendezvous { name: [1; 16], pid: 0, uid: 0 }), ..g },
        BindGrant { rendezvous: Some(Rendezvous { name: [0; 16], pid: 1, uid: 0 }), ..g },
        BindGrant { rendezvous: Some(Rendezvous { name: [0; 16], pid: 0, uid: 1 }), ..g },
    ] {
        assert_ne!(base, other.proof_transcript(1, 2, 3, &[0; CHALLENGE_LEN]), "{other:?}");
    }
}

#[test]
fn key_answers_round_trip_and_are_never_read_as_grants_or_listings() {
    for key in [Some([7u8; 32]), None] {
        let a = KeyAnswer { nonce: 42, key };
        let b = a.to_bytes();
        assert_eq!(KeyAnswer::parse(&b), Some(a));
        assert_eq!(BindGrant::parse(&b), None, "{key:?}");
        assert_eq!(ExportListing::parse(&b), None, "{key:?}");
        assert_eq!(KeyAnswer::parse(&b[..KEY_ANSWER_LEN - 1]), None, "truncated");
    }
    let good = KeyAnswer { nonce: 1, key: None }.to_bytes();
    for (at, value) in [(28, LIST), (29, 2), (10, 1), (30, 1), (40, 1)] {
        let mut bad = good;
        bad[at] = value;
        assert_eq!(KeyAnswer::parse(&bad), None, "byte {at} set to {value}");
    }
}
