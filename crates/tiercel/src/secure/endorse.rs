//! Endorsements: an authority's signature that a server's key may export a name, so that a client
//! can trust the key a registry entry carries even where others may write the registry (etcd
//! without authentication, a registry it does not trust for keys).
//!
//! An authority is an Ed25519 key pair ([`Authority`]) kept offline by whoever runs the services;
//! its public half ([`AuthorityKey`]) is given to clients (`ClientConfig::authorities`). It
//! endorses a server's public key for a name until a time ([`Authority::endorse`]); the server
//! carries the endorsement in its registry entry (`ServerConfig::endorsements`), and a client that
//! trusts the authority binds with the entry's key only when the endorsement verifies for that
//! name and that key, before its time is up. Whoever can write the registry can copy an
//! endorsement into a forged entry, but not the server's private key: the handshake then fails,
//! and the client passes over that exporter. The signature is Ed25519, through `aws-lc-rs`.

use std::fmt;
use std::path::Path;

use aws_lc_rs::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};

use super::{hex32, parse_file, write_hex, write_new, KeyError, PublicKey, KEY_LEN};

/// Length of an Ed25519 signature.
const SIGNATURE_LEN: usize = 64;

/// First line of an authority's private key file: it is not a server's or client's key.
const AUTHORITY_MAGIC: &str = "tiercel authority";

/// What an endorsement's signature covers begins with this, so that it signs nothing else.
const CONTEXT: &[u8] = b"tiercel endorsement 1\n";

/// An authority's Ed25519 public key: what a client trusts to vouch for servers' keys. Written and
/// read as 64 hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct AuthorityKey(pub [u8; KEY_LEN]);

impl AuthorityKey {
    /// The key in a file written by [`Authority::write`] (`NAME.pub`), or any file whose first line
    /// is the key's hex.
    pub fn from_file(path: impl AsRef<Path>) -> Result<AuthorityKey, KeyError> {
        parse_file(path.as_ref())
    }
}

impl fmt::Display for AuthorityKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

impl fmt::Debug for AuthorityKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AuthorityKey({self})")
    }
}

impl std::str::FromStr for AuthorityKey {
    type Err = KeyError;

    /// 64 hex digits.
    fn from_str(s: &str) -> Result<AuthorityKey, KeyError> {
        hex32(s.trim())
            .map(AuthorityKey)
            .ok_or_else(|| KeyError(format!("`{s}` is not an authority's key (64 hex digits)")))
    }
}

/// An authority's Ed25519 key pair, which endorses servers' keys for names. Its `Debug` output
/// shows only the public half.
pub struct Authority {
    seed: [u8; KEY_LEN],
    pair: Ed25519KeyPair,
}

impl Authority {
    /// A new key pair, from the operating system's random source.
    pub fn generate() -> Result<Authority, KeyError> {
        let seed = crate::random::bytes32().map_err(|e| KeyError(format!("no random bytes for a key: {e}")))?;
        Authority::from_seed(seed)
    }

    fn from_seed(seed: [u8; KEY_LEN]) -> Result<Authority, KeyError> {
        let pair = Ed25519KeyPair::from_seed_unchecked(&seed)
            .map_err(|e| KeyError(format!("not an Ed25519 private key: {e}")))?;
        Ok(Authority { seed, pair })
    }

    /// The public half: what clients are given to trust.
    pub fn public(&self) -> AuthorityKey {
        let mut key = [0; KEY_LEN];
        key.copy_from_slice(self.pair.public_key().as_ref());
        AuthorityKey(key)
    }

    /// The key pair in `path`, a file [`Authority::write`] made. Refuses a file that users other
    /// than its owner may read.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Authority, KeyError> {
        let path = path.as_ref();
        let bytes = crate::auth::read_private(path).map_err(KeyError)?;
        let seed = std::str::from_utf8(&bytes)
            .ok()
            .and_then(|s| s.strip_prefix(AUTHORITY_MAGIC))
            .and_then(|s| hex32(s.trim()))
            .ok_or_else(|| {
                KeyError(format!(
                    "{}: not an authority's private key (`tiercel keygen --authority` writes one)",
                    path.display()
                ))
            })?;
        Authority::from_seed(seed)
    }

    /// Writes the private key to `path` (mode 0600) and the public key to `path` + `.pub`. Refuses
    /// to replace either file.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<(), KeyError> {
        let path = path.as_ref();
        let hex: String = self.seed.iter().map(|b| format!("{b:02x}")).collect();
        write_new(path, &format!("{AUTHORITY_MAGIC}\n{hex}\n"), &format!("{}\n", self.public()))
    }

    /// Endorses `server` for `name` until `not_after` (seconds since the Unix epoch).
    pub fn endorse(&self, name: &str, server: PublicKey, not_after: u64) -> Result<Endorsement, KeyError> {
        if !crate::names::valid_name(name) {
            return Err(KeyError(format!("{name:?} is not a name (see tiercel::names::valid_name)")));
        }
        let signature = self.pair.sign(&signed(name, &server, not_after));
        let mut sig = [0; SIGNATURE_LEN];
        sig.copy_from_slice(signature.as_ref());
        Ok(Endorsement { name: name.to_owned(), server, not_after, authority: self.public(), signature: sig })
    }
}

impl fmt::Debug for Authority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Authority({})", self.public())
    }
}

/// What an endorsement signs.
fn signed(name: &str, server: &PublicKey, not_after: u64) -> Vec<u8> {
    let mut message = Vec::with_capacity(CONTEXT.len() + name.len() + 1 + KEY_LEN + 8);
    message.extend_from_slice(CONTEXT);
    message.extend_from_slice(name.as_bytes());
    message.push(b'\n');
    message.extend_from_slice(&server.0);
    message.extend_from_slice(&not_after.to_be_bytes());
    message
}

/// An authority's signature that `server` may export `name` until `not_after`. Written and read
/// as one line: `endorsement NAME SERVER-KEY NOT-AFTER AUTHORITY-KEY SIGNATURE`, keys and signature
/// in hex, the time in seconds since the Unix epoch.
#[derive(Clone, PartialEq, Eq)]
pub struct Endorsement {
    /// The name endorsed.
    pub name: String,
    /// The server's key endorsed for it.
    pub server: PublicKey,
    /// Until when (seconds since the Unix epoch).
    pub not_after: u64,
    /// The authority that signed.
    pub authority: AuthorityKey,
    signature: [u8; SIGNATURE_LEN],
}

/// Why an endorsement did not vouch for a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NotEndorsed {
    /// The entry carries no endorsement.
    #[error("no endorsement")]
    Missing,
    /// Signed by an authority the client does not trust.
    #[error("endorsed by {0}, an authority this client does not trust")]
    Untrusted(AuthorityKey),
    /// Made for another name or another key than the entry's.
    #[error("the endorsement is of {0}, not of this entry")]
    Elsewhere(String),
    /// Its time is up.
    #[error("the endorsement ran out at {0} (seconds since the Unix epoch)")]
    Expired(u64),
    /// The signature does not verify: made by no one holding the authority's key, or changed.
    #[error("the endorsement's signature does not verify")]
    BadSignature,
}

impl Endorsement {
    /// Whether the endorsement vouches for `server` as an exporter of `name` at `now` (seconds
    /// since the Unix epoch), signed by one of `trusted`.
    pub fn vouches(
        &self,
        trusted: &[AuthorityKey],
        name: &str,
        server: &PublicKey,
        now: u64,
    ) -> Result<(), NotEndorsed> {
        if !trusted.contains(&self.authority) {
            return Err(NotEndorsed::Untrusted(self.authority));
        }
        if self.name != name || self.server != *server {
            return Err(NotEndorsed::Elsewhere(format!("name {:?} with key {}", self.name, self.server)));
        }
        if now > self.not_after {
            return Err(NotEndorsed::Expired(self.not_after));
        }
        UnparsedPublicKey::new(&ED25519, &self.authority.0)
            .verify(&signed(&self.name, &self.server, self.not_after), &self.signature)
            .map_err(|_| NotEndorsed::BadSignature)
    }

    /// The endorsement in a file written by [`Endorsement::write`].
    pub fn from_file(path: impl AsRef<Path>) -> Result<Endorsement, KeyError> {
        parse_file(path.as_ref())
    }

    /// Writes the endorsement to `path` (mode 0644: it is no secret). Refuses to replace a file.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<(), KeyError> {
        super::create_new(path.as_ref(), 0o644, &format!("{self}\n"))
    }
}

impl fmt::Display for Endorsement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "endorsement {} {} {} {} ", self.name, self.server, self.not_after, self.authority)?;
        write_hex(f, &self.signature)
    }
}

impl fmt::Debug for Endorsement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Endorsement({} for {} until {} by {})", self.server, self.name, self.not_after, self.authority)
    }
}

impl std::str::FromStr for Endorsement {
    type Err = KeyError;

    fn from_str(s: &str) -> Result<Endorsement, KeyError> {
        let bad = || KeyError(format!("`{s}` is not an endorsement (`tiercel endorse` writes one)"));
        let mut words = s.split(' ');
        let mut word = || words.next().ok_or_else(bad);
        if word()? != "endorsement" {
            return Err(bad());
        }
        let name = word()?.to_owned();
        let server = word()?.parse().map_err(|_| bad())?;
        let not_after = word()?.parse().map_err(|_| bad())?;
        let authority = word()?.parse().map_err(|_| bad())?;
        let sig = word()?.as_bytes();
        if words.next().is_some() || sig.len() != 2 * SIGNATURE_LEN || !crate::names::valid_name(&name) {
            return Err(bad());
        }
        let mut signature = [0; SIGNATURE_LEN];
        for (half, out) in sig.chunks(2 * KEY_LEN).zip(signature.chunks_mut(KEY_LEN)) {
            out.copy_from_slice(&hex32(std::str::from_utf8(half).map_err(|_| bad())?).ok_or_else(bad)?);
        }
        Ok(Endorsement { name, server, not_after, authority, signature })
    }
}

/// Seconds since the Unix epoch, now.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn authority() -> Authority {
        Authority::generate().unwrap()
    }

    #[test]
    fn an_endorsement_vouches_only_for_its_name_and_key_until_its_time_by_a_trusted_authority() {
        let (a, other) = (authority(), authority());
        let server = PublicKey([7; KEY_LEN]);
        let e = a.endorse("vault", server, 1_000).unwrap();
        let trusted = [a.public()];
        assert_eq!(e.vouches(&trusted, "vault", &server, 1_000), Ok(()));
        assert_eq!(e.vouches(&[other.public()], "vault", &server, 0), Err(NotEndorsed::Untrusted(a.public())));
        assert!(matches!(e.vouches(&trusted, "vault2", &server, 0), Err(NotEndorsed::Elsewhere(_))));
        assert!(matches!(e.vouches(&trusted, "vault", &PublicKey([8; KEY_LEN]), 0), Err(NotEndorsed::Elsewhere(_))));
        assert_eq!(e.vouches(&trusted, "vault", &server, 1_001), Err(NotEndorsed::Expired(1_000)));

        // Anything changed after signing, each field and each bit of the signature, fails.
        let changed = |f: &dyn Fn(&mut Endorsement)| {
            let mut c = e.clone();
            f(&mut c);
            c.vouches(&trusted, &c.name.clone(), &c.server.clone(), 0)
        };
        assert_eq!(changed(&|c| c.name = "other".into()), Err(NotEndorsed::BadSignature));
        assert_eq!(changed(&|c| c.server = PublicKey([9; KEY_LEN])), Err(NotEndorsed::BadSignature));
        assert_eq!(changed(&|c| c.not_after = u64::MAX), Err(NotEndorsed::BadSignature));
        for bit in 0..SIGNATURE_LEN * 8 {
            assert_eq!(changed(&|c| c.signature[bit / 8] ^= 1 << (bit % 8)), Err(NotEndorsed::BadSignature));
        }
        // Another authority's signature under this one's name.
        let forged = Endorsement { authority: a.public(), ..other.endorse("vault", server, 1_000).unwrap() };
        assert_eq!(forged.vouches(&trusted, "vault", &server, 0), Err(NotEndorsed::BadSignature));
    }

    #[test]
    fn endorsements_and_keys_round_trip_through_text_and_files_and_garbage_is_refused() {
        let a = authority();
        let e = a.endorse("billing.v2", PublicKey([1; KEY_LEN]), u64::MAX).unwrap();
        assert_eq!(e.to_string().parse::<Endorsement>(), Ok(e.clone()));
        let text = e.to_string();
        for garbage in [
            "",
            "endorsement",
            &text.replacen("endorsement", "endorsed", 1),
            &format!("{text} extra"),
            &text[..text.len() - 2],
            &text.replace("billing.v2", "a/b"),
        ] {
            assert!(garbage.parse::<Endorsement>().is_err(), "{garbage:?}");
        }
        assert!(a.endorse("not a name", PublicKey([1; KEY_LEN]), 0).is_err());

        let dir = std::env::temp_dir().join(format!("tiercel-endorse-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("authority");
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(dir.join("authority.pub"));
        a.write(&path).unwrap();
        assert_eq!(Authority::from_file(&path).unwrap().public(), a.public());
        assert_eq!(AuthorityKey::from_file(dir.join("authority.pub")).unwrap(), a.public());
        assert!(a.write(&path).is_err(), "replaced a key");
        // An authority's file is not a server's key, nor the other way round.
        assert!(crate::Identity::from_file(&path).is_err());
        let server = dir.join("server");
        let _ = std::fs::remove_file(&server);
        let _ = std::fs::remove_file(dir.join("server.pub"));
        crate::Identity::generate().unwrap().write(&server).unwrap();
        assert!(Authority::from_file(&server).is_err());
        let file = dir.join("endorsement");
        let _ = std::fs::remove_file(&file);
        e.write(&file).unwrap();
        assert_eq!(Endorsement::from_file(&file).unwrap(), e);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
