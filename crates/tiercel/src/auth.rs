//! A server's optional shared secret, proven at bind time.
//!
//! Every binding already carries a 128-bit random token that the server checks on every packet, so
//! only a holder of the token can use the binding. A shared secret decides who may get a binding in
//! the first place: a server with a secret answers a bind request with a challenge; the client proves
//! the secret with a keyed BLAKE3 hash of its request and the challenge; the server grants the
//! binding only on a good proof and proves the secret back over the grant, so that the client knows
//! the token came from a holder of the secret. Challenges are stateless (a keyed hash of the client's
//! address, its nonce and a 30-second window), so unauthenticated requests cost the server no memory.
//! `docs/security.md` gives the threat model.

use std::path::Path;
use std::time::Instant;

use tiercel_proto::bind::wire::{CHALLENGE_LEN, PROOF_LEN};
use tiercel_proto::bind::{Challenges, Keyed};

use crate::SecretError;

/// A shared secret: 32 bytes derived from key material of at least 16 bytes. Its `Debug` output
/// does not show it, and comparing two takes the same time wherever they differ.
#[derive(Clone)]
pub struct Secret {
    key: [u8; 32],
}

/// Least key material a secret accepts.
pub const MIN_SECRET_LEN: usize = 16;

impl Secret {
    /// A secret derived from `material`, which must hold at least [`MIN_SECRET_LEN`] bytes (for
    /// example 32 random bytes, or their hex).
    pub fn new(material: &[u8]) -> Result<Secret, SecretError> {
        if material.len() < MIN_SECRET_LEN {
            return Err(SecretError(format!(
                "{} bytes of key material; at least {MIN_SECRET_LEN} needed",
                material.len()
            )));
        }
        Ok(Secret { key: blake3::derive_key("tiercel 2026-11 binding secret", material) })
    }

    /// A secret read from a file (trailing whitespace ignored, so that `echo` and editors may add a
    /// newline). Like ssh with its keys, refuses a file that users other than its owner may read.
    /// Make one with `(umask 077; head -c 32 /dev/urandom > tiercel.secret)`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Secret, SecretError> {
        let path = path.as_ref();
        let bytes = read_private(path).map_err(SecretError)?;
        Secret::new(&bytes).map_err(|SecretError(m)| SecretError(format!("{}: {m}", path.display())))
    }
}

impl Secret {
    /// The pre-shared key a secure binding's handshake mixes in: derived from the secret, never
    /// the secret's own key.
    pub(crate) fn psk(&self) -> [u8; 32] {
        blake3::derive_key("tiercel 2026-11 noise psk", &self.key)
    }
}

/// The pre-shared key of a handshake under `secret`: all zeros without one (as WireGuard's).
pub(crate) fn psk(secret: Option<&Secret>) -> [u8; 32] {
    secret.map_or([0; 32], Secret::psk)
}

/// The bytes of a file that holds a secret (a shared secret, a password), trailing whitespace
/// removed (so that `echo` and editors may add a newline). Like ssh with its keys, refuses a file
/// that users other than its owner may read. The error names the file.
pub(crate) fn read_private(path: &Path) -> Result<Vec<u8>, String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mode = meta.permissions().mode();
    if mode & 0o077 != 0 {
        return Err(format!(
            "{}: readable by others (mode {:o}); make it private with chmod 600",
            path.display(),
            mode & 0o777
        ));
    }
    let mut bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let end = bytes.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(0, |i| i + 1);
    bytes.truncate(end);
    Ok(bytes)
}

impl Keyed for Secret {
    /// The keyed BLAKE3 hash of `transcript`.
    fn prove(&self, transcript: &[u8]) -> [u8; PROOF_LEN] {
        *blake3::keyed_hash(&self.key, transcript).as_bytes()
    }

    /// Whether `proof` is the keyed hash of `transcript`, compared in constant time.
    fn verify(&self, transcript: &[u8], proof: &[u8; PROOF_LEN]) -> bool {
        blake3::keyed_hash(&self.key, transcript) == blake3::Hash::from_bytes(*proof)
    }
}

impl PartialEq for Secret {
    fn eq(&self, other: &Secret) -> bool {
        blake3::Hash::from_bytes(self.key) == blake3::Hash::from_bytes(other.key)
    }
}

impl Eq for Secret {}

impl core::fmt::Debug for Secret {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Length of a challenge window: a challenge stays good for one to two windows.
const WINDOW_SECS: u64 = 30;

/// Makes and checks a server's stateless challenges.
pub(crate) struct Challenger {
    key: [u8; 32],
    epoch: Instant,
}

impl Challenger {
    /// A challenger with a fresh random key.
    pub(crate) fn new() -> std::io::Result<Challenger> {
        Ok(Challenger { key: crate::random::bytes32()?, epoch: Instant::now() })
    }

    fn window(&self) -> u64 {
        self.epoch.elapsed().as_secs() / WINDOW_SECS
    }

    fn make(&self, peer: &[u8], nonce: u64, window: u64) -> [u8; CHALLENGE_LEN] {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(&(peer.len() as u64).to_le_bytes()).update(peer);
        h.update(&nonce.to_le_bytes()).update(&window.to_le_bytes());
        let mut c = [0u8; CHALLENGE_LEN];
        c.copy_from_slice(&h.finalize().as_bytes()[..CHALLENGE_LEN]);
        c
    }
}

impl Challenges for Challenger {
    /// The challenge for a bind request from `peer` with `nonce`, now.
    fn challenge(&self, peer: &[u8], nonce: u64) -> [u8; CHALLENGE_LEN] {
        self.make(peer, nonce, self.window())
    }

    /// Whether `challenge` was made for `peer` and `nonce` in this window or the one before.
    fn check(&self, peer: &[u8], nonce: u64, challenge: &[u8; CHALLENGE_LEN]) -> bool {
        let w = self.window();
        let good =
            |w| blake3::Hash::from_bytes(pad(&self.make(peer, nonce, w))) == blake3::Hash::from_bytes(pad(challenge));
        good(w) | (w > 0 && good(w - 1))
    }
}

/// Who sent a UDP bind request, as challenges are bound to it: the source address and port.
pub(crate) fn peer_bytes(peer: std::net::SocketAddr) -> Vec<u8> {
    let mut b = match peer.ip() {
        std::net::IpAddr::V4(a) => a.octets().to_vec(),
        std::net::IpAddr::V6(a) => a.octets().to_vec(),
    };
    b.extend_from_slice(&peer.port().to_le_bytes());
    b
}

/// A challenge widened to 32 bytes, for the constant-time comparison of `blake3::Hash`.
fn pad(c: &[u8; CHALLENGE_LEN]) -> [u8; 32] {
    let mut b = [0u8; 32];
    b[..CHALLENGE_LEN].copy_from_slice(c);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_need_enough_material_and_hide_themselves() {
        assert!(matches!(Secret::new(b"short"), Err(SecretError(_))));
        let a = Secret::new(b"0123456789abcdef").unwrap();
        assert_eq!(a, Secret::new(b"0123456789abcdef").unwrap());
        assert_ne!(a, Secret::new(b"0123456789abcdeF").unwrap());
        assert_eq!(format!("{a:?}"), "Secret(..)");
    }

    #[test]
    fn secret_files_must_be_private() {
        use std::os::unix::fs::PermissionsExt;
        let path = std::env::temp_dir().join(format!("tiercel-secret-test-{}", std::process::id()));
        std::fs::write(&path, "0123456789abcdef0123456789abcdef\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = Secret::from_file(&path).unwrap_err();
        assert!(err.to_string().contains("chmod 600"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(Secret::from_file(&path).unwrap(), Secret::new(b"0123456789abcdef0123456789abcdef").unwrap());
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn proofs_verify_only_under_the_same_secret_and_transcript() {
        let a = Secret::new(&[1; 32]).unwrap();
        let b = Secret::new(&[2; 32]).unwrap();
        let p = a.prove(b"transcript");
        assert!(a.verify(b"transcript", &p));
        assert!(!a.verify(b"transcripT", &p));
        assert!(!b.verify(b"transcript", &p));
    }

    #[test]
    fn challenges_are_bound_to_peer_and_nonce() {
        let c = Challenger::new().unwrap();
        let peer = peer_bytes("127.0.0.1:4000".parse().unwrap());
        let x = c.challenge(&peer, 7);
        assert!(c.check(&peer, 7, &x));
        assert!(!c.check(&peer, 8, &x));
        assert!(!c.check(&peer_bytes("127.0.0.1:4001".parse().unwrap()), 7, &x));
        assert!(!Challenger::new().unwrap().check(&peer, 7, &x), "another server's challenge");
    }
}
