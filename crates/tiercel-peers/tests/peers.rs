//! Every peer serves and answers both procedures, and is named both ways. An integration test, not
//! the library's unit tests: those would build the whole crate (tonic's generated code among it) a
//! second time, in test mode, for two tests that need only its public items.

use tiercel_peers::{serve, Client, Peer};

#[test]
fn every_peer_answers_null_and_max_result_over_loopback() {
    for peer in Peer::ALL {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || serve(peer, listener));
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let client = Client::connect(peer, addr).await.unwrap();
            let mut callers = Vec::new();
            for _ in 0..4 {
                callers.push(client.caller().await.unwrap());
            }
            for caller in &mut callers {
                caller.null().await.unwrap();
                assert_eq!(caller.max_result(1440).await.unwrap(), 1440, "{}", peer.name());
                assert_eq!(caller.max_result(0).await.unwrap(), 0, "{}", peer.name());
            }
        });
    }
}

#[test]
fn peers_are_named_both_ways() {
    for peer in Peer::ALL {
        assert_eq!(Peer::from_name(peer.name()), Some(peer));
        assert_eq!(Peer::from_name(peer.key()), Some(peer));
    }
    assert_eq!(Peer::from_name("grpc"), None);
}
