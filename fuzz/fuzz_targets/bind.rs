//! The shipped bind machines fed arbitrary packets: the server's, with and without a shared secret,
//! as every transport drives it; the client's, with and without one. Nothing panics, no answer is
//! longer than the budget the server was given, only a request carrying the right fingerprint and a
//! good proof is admitted, a client is bound only by a grant that echoes its nonce, and only a
//! client that asked for a rendezvous is ever sent to one, and a client asking for the server's
//! key is told it only by an answer to its own request.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercel_proto::bind::wire::{BindRequest, KeyAnswer, CHALLENGE_LEN, PROOF_LEN};
use tiercel_proto::bind::{
    BindClient, BindDecision, BindEvent, BindServer, Challenges, InterfaceSpec, Keyed, ProcedureShape, Rendezvous,
    ServerAuth,
};
use tiercel_proto::wire::{checksum, flags, Packet, CHECKSUM_LEN, HEADER_LEN};

/// A keyed hash good enough to tell secrets and transcripts apart (the fuzzer should not have to
/// break BLAKE3 to reach the code after a proof).
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
        let mut c = [0; CHALLENGE_LEN];
        c.copy_from_slice(&self.prove(&t)[..CHALLENGE_LEN]);
        c
    }
    fn check(&self, peer: &[u8], nonce: u64, challenge: &[u8; CHALLENGE_LEN]) -> bool {
        self.challenge(peer, nonce) == *challenge
    }
}

/// An answer as the transport sends it: with a checksum trailer when the request had one (the bind
/// machine marks the answer so, and leaves the trailer to the sender, as for every packet).
fn as_sent(request: &Packet<&[u8]>, mut answer: Vec<u8>) -> Vec<u8> {
    if request.flags() & flags::CHECKSUM != 0 {
        let sum = checksum([&answer[..]]).to_le_bytes();
        answer.extend_from_slice(&sum);
    }
    answer
}

const BANK: InterfaceSpec<'static> = InterfaceSpec {
    name: "Bank",
    id: 10,
    version: 1,
    fingerprint: 99,
    signature: "deposit(u64)\nwithdraw(u64) -> bool",
    procedures: &[ProcedureShape { name: 1, shape: 11 }, ProcedureShape { name: 2, shape: 22 }],
};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, packet)) = data.split_first() else { return };
    let (secret, challenges) = (Toy(1), Toy(2));
    let auth = (selector & 1 != 0).then_some(ServerAuth { secret: &secret, challenges: &challenges });
    let max_datagram = if selector & 2 != 0 { 1472 } else { 0 };
    // Every other input to a server that takes only secure bindings (the sealed handshake
    // carries its requests; plain ones are refused).
    let key_required = packet.len() % 2 == 1;
    let key = key_required.then_some(&[9; 32]);
    // A datagram server's transport adds checksum trailers; a stream's (no datagram size) does not.
    let trailers = max_datagram != 0;
    let server = BindServer { exports: &[BANK], auth, incarnation: 7, max_datagram, key_required, key, trailers };
    let budget = usize::from(selector >> 2) * 16;
    if let Ok(p) = Packet::new_checked(packet) {
        let decision = server.on_request(&p, b"peer", budget);
        if !trailers && p.flags() & flags::CHECKSUM != 0 {
            assert!(
                matches!(decision, BindDecision::Malformed),
                "a request flagged for a trailer the transport never adds"
            );
        }
        match decision {
            BindDecision::Answer { packet: answer, .. } => {
                let answer = as_sent(&p, answer);
                let most = budget.max(HEADER_LEN + 24 + CHECKSUM_LEN);
                assert!(answer.len() <= most, "{} for a budget of {budget}", answer.len());
                Packet::new_checked(&answer[..]).expect("answers are valid packets");
            }
            BindDecision::Admit(a) => {
                let req = BindRequest::parse(p.payload()).expect("admitted requests parse");
                assert_eq!((req.interface, req.version, req.fingerprint), (BANK.id, BANK.version, BANK.fingerprint));
                if auth.is_some() {
                    let proof = req.proof.expect("with a secret, admitted requests carry a proof");
                    assert!(secret.verify(&req.proof_transcript(&proof.challenge), &proof.mac));
                }
                let grant = as_sent(&p, a.grant(&server, 1, 2, 3, 0));
                Packet::new_checked(&grant[..]).expect("grants are valid packets");
                let place = as_sent(&p, a.rendezvous(&server, Rendezvous { name: [1; 16], pid: 2, uid: 3 }));
                Packet::new_checked(&place[..]).expect("rendezvous answers are valid packets");
            }
            BindDecision::Malformed => {}
        }
        // A client asking for the server's key reads only a key answer to its own request.
        match BindClient::asking_key(5, false).handle(&p, None) {
            BindEvent::ServerKey(_) => {
                let told = KeyAnswer::parse(p.payload()).expect("a key told is a key answer");
                assert_eq!(told.nonce, 5, "told only by an answer to this request");
            }
            BindEvent::Granted(_) | BindEvent::Rendezvous { .. } | BindEvent::Listed(_) => {
                panic!("a key request is answered only with a key or a refusal")
            }
            _ => {}
        }
        for keyed in [None, Some(&secret as &dyn Keyed)] {
            for asking in [false, true] {
                let mut client = BindClient::new(&BANK, 1472, 5, false);
                if asking {
                    client = client.asking_rendezvous();
                }
                match client.handle(&p, keyed) {
                    BindEvent::Granted(g) => {
                        assert_eq!(g.grant.nonce, 5, "bound only by a grant for this request");
                        assert!(g.grant.slots > 0 && g.grant.rendezvous.is_none());
                    }
                    BindEvent::Rendezvous { .. } => {
                        assert!(asking, "a rendezvous answers only a request that asked for one");
                        assert_eq!(p.binding(), 0, "and grants nothing");
                    }
                    _ => {}
                }
            }
        }
    }
});
