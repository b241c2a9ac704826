use super::*;
use tiercel_proto::seal::EPOCH_PACKETS;

fn pair(cipher: Cipher) -> (Session, Session) {
    let server = Identity::generate().unwrap();
    let client = Identity::generate().unwrap();
    let psk = [7u8; KEY_LEN];
    let mut hello = Hello::new(&client, &server.public(), &psk, cipher, b"bind me").unwrap();
    let mut out = [0u8; 256];
    let (responder, n) = Responder::hello(&server, &psk, &hello.datagram, &mut out).unwrap();
    assert_eq!(&out[..n], b"bind me");
    assert_eq!(responder.client(), client.public());
    let (welcome, server_keys) = responder.welcome(b"granted").unwrap();
    let (n, client_keys) = hello.welcome(&welcome, &mut out).unwrap();
    assert_eq!(&out[..n], b"granted");
    assert_eq!(client_keys.peer(), server.public());
    (client_keys.session(5), server_keys.session(5))
}

fn sealed(s: &Session, packet: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let (a, b) = packet.split_at(packet.len().min(3));
    let n = s.seal_into(&[IoSlice::new(a), IoSlice::new(b)], &mut out).unwrap();
    out.truncate(n);
    out
}

#[test]
fn a_handshake_gives_both_sides_keys_that_open_what_the_other_seals_both_ways() {
    for cipher in [Cipher::Aes256Gcm, Cipher::ChaCha20Poly1305] {
        let (client, server) = pair(cipher);
        let mut d = sealed(&client, b"call with a marker");
        assert!(!d.windows(6).any(|w| w == b"marker"), "{cipher:?}: the packet travels encrypted");
        let n = server.open_in_place(&mut d).unwrap();
        assert_eq!(&d[OUTER_LEN..OUTER_LEN + n], b"call with a marker");
        let mut r = sealed(&server, b"result");
        let n = client.open_in_place(&mut r).unwrap();
        assert_eq!(&r[OUTER_LEN..OUTER_LEN + n], b"result");
        // A client's own packet does not open as the server's.
        let mut own = sealed(&client, b"echo");
        assert_eq!(client.open_in_place(&mut own), Err(Dropped::Forged));
    }
}

#[test]
fn every_flipped_bit_and_every_replay_is_dropped_and_counted() {
    let (client, server) = pair(Cipher::default());
    let d = sealed(&client, b"0123456789");
    for bit in 0..d.len() * 8 {
        let mut bad = d.clone();
        bad[bit / 8] ^= 1 << (bit % 8);
        assert!(server.open_in_place(&mut bad).is_err(), "bit {bit}");
    }
    let forged = server.forged.load(Ordering::Relaxed);
    // The outer header's magic, version, type and index fail before the AEAD: counted as theirs.
    assert!(forged >= (d.len() - 8) as u64 * 8, "{forged}");
    let mut good = d.clone();
    assert!(server.open_in_place(&mut good).is_ok());
    let mut again = d.clone();
    assert_eq!(server.open_in_place(&mut again), Err(Dropped::Replayed));
    assert_eq!(server.replayed.load(Ordering::Relaxed), 1);
}

#[test]
fn keys_move_on_each_epoch_and_packets_from_either_side_of_the_change_open() {
    let (client, server) = pair(Cipher::default());
    client.counter.store(EPOCH_PACKETS - 2, Ordering::Relaxed);
    let a = sealed(&client, b"a"); // epoch 0
    let b = sealed(&client, b"b"); // epoch 0
    let c = sealed(&client, b"c"); // epoch 1: a new key
    let d = sealed(&client, b"d");
    for mut p in [c, a, d, b] {
        assert!(server.open_in_place(&mut p).is_ok());
    }
    // The same number under the first key and under the next differ.
    let k0 = [1u8; KEY_LEN];
    assert_ne!(rekey(Cipher::Aes256Gcm, &k0), k0);
    assert_ne!(rekey(Cipher::Aes256Gcm, &k0), rekey(Cipher::ChaCha20Poly1305, &k0));
    // Far beyond the next epoch: not opened, and no key is derived for it.
    client.counter.store(10 * EPOCH_PACKETS, Ordering::Relaxed);
    let mut far = sealed(&client, b"far");
    assert_eq!(server.open_in_place(&mut far), Err(Dropped::Forged));
    // The last number is never passed.
    client.counter.store(LAST_COUNTER + 1, Ordering::Relaxed);
    assert_eq!(client.seal_into(&[IoSlice::new(b"x")], &mut Vec::new()), Err(SealError::Exhausted));
}

#[test]
fn a_hello_for_another_server_key_or_another_secret_is_not_read() {
    let server = Identity::generate().unwrap();
    let other = Identity::generate().unwrap();
    let client = Identity::generate().unwrap();
    let mut out = [0u8; 256];
    let hello = Hello::new(&client, &other.public(), &[0; KEY_LEN], Cipher::default(), b"x").unwrap();
    assert!(Responder::hello(&server, &[0; KEY_LEN], &hello.datagram, &mut out).is_none());
    let hello = Hello::new(&client, &server.public(), &[1; KEY_LEN], Cipher::default(), b"x").unwrap();
    assert!(Responder::hello(&server, &[0; KEY_LEN], &hello.datagram, &mut out).is_none());
    // A welcome from an impostor (a server with another key) does not open at the client.
    let mut hello = Hello::new(&client, &server.public(), &[0; KEY_LEN], Cipher::default(), b"x").unwrap();
    let forged = Hello::new(&other, &server.public(), &[0; KEY_LEN], Cipher::default(), b"x").unwrap();
    let (responder, _) = Responder::hello(&server, &[0; KEY_LEN], &forged.datagram, &mut out).unwrap();
    let (wrong, _) = responder.welcome(b"granted").unwrap();
    assert!(hello.welcome(&wrong, &mut out).is_none(), "the answer to another hello");
    let (responder, _) = Responder::hello(&server, &[0; KEY_LEN], &hello.datagram, &mut out).unwrap();
    let (right, _) = responder.welcome(b"granted").unwrap();
    assert!(
        hello.welcome(&right, &mut out).is_some(),
        "a failed answer leaves the handshake able to read the right one"
    );
}

#[test]
fn keys_round_trip_through_their_files_and_a_readable_private_key_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("tiercel-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("server.key");
    let id = Identity::generate().unwrap();
    id.write(&path).unwrap();
    assert!(id.write(&path).is_err(), "an existing key is never replaced");
    assert_eq!(Identity::from_file(&path).unwrap().public(), id.public());
    assert_eq!(PublicKey::from_file(public_path(&path)).unwrap(), id.public());
    assert_eq!(id.public().to_string().parse::<PublicKey>().unwrap(), id.public());
    assert!(format!("{id:?}").contains(&id.public().to_string()));
    assert!("12".parse::<PublicKey>().is_err());
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(Identity::from_file(&path).unwrap_err().0.contains("chmod 600"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_large_last_part_encrypted_where_it_lies_seals_as_the_copied_packet_would_and_opens() {
    for cipher in [Cipher::Aes256Gcm, Cipher::ChaCha20Poly1305] {
        for len in [SCATTER_FROM - 1, SCATTER_FROM, 65_000] {
            let (client, server) = pair(cipher);
            let head = b"inner header";
            let body: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let mut scattered = Vec::new();
            let n = client.seal_into(&[IoSlice::new(head), IoSlice::new(&body)], &mut scattered).unwrap();
            scattered.truncate(n);
            // The same number (here only, for the comparison) sealed from one part: copied, then
            // sealed in place.
            let whole = [&head[..], &body[..]].concat();
            let mut copied = Vec::new();
            client.counter.store(0, Ordering::Relaxed);
            let n = client.seal_into(&[IoSlice::new(&whole)], &mut copied).unwrap();
            copied.truncate(n);
            assert_eq!(scattered, copied, "{cipher:?}, {len} bytes");
            let n = server.open_in_place(&mut scattered).unwrap();
            assert_eq!(&scattered[OUTER_LEN..OUTER_LEN + n], &whole[..], "{cipher:?}, {len} bytes");
        }
    }
}
