//! Servers' keys pinned on first use ([`KnownServers`]), as ssh keeps `known_hosts`.
//!
//! A client given a known-servers file and no key for a server asks the server for its public key
//! the first time (plain, unproven), binds securely with it, and once the server has proven it in
//! that handshake, writes it to the file under what the client was told to bind to: the server's
//! address, or the name it imported. From then on it binds there only with that key: a server
//! that cannot prove it (an impostor on the address, the real server with a new key) is never
//! bound, and the error says which key was pinned, which one the server now tells, and which line
//! to remove if the change is expected.
//!
//! The file holds one line a server, `TARGET KEY` (`127.0.0.1:7392 5f3a…`, `name:calc 5f3a…`),
//! and `#` comments; the first line of a target is the one that counts. It is trusted only if this
//! user (or root) owns it and its directory and no other user may write either, as ssh's
//! `StrictModes` asks of `known_hosts`: another user who could write it would choose whom the
//! client trusts.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::PublicKey;

/// A file of servers' keys pinned on first use (see the module's documentation):
/// `ClientConfig::known_servers`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownServers {
    path: PathBuf,
}

/// Why a known-servers file could not be read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("known servers: {0}")]
pub struct KnownError(pub String);

impl KnownServers {
    /// The file at `path` (made, with its directory, when the first key is pinned).
    pub fn new(path: impl Into<PathBuf>) -> KnownServers {
        KnownServers { path: path.into() }
    }

    /// This user's file: `$XDG_CONFIG_HOME/tiercel/known_servers`, else
    /// `$HOME/.config/tiercel/known_servers`. `None` when neither variable is set.
    pub fn user() -> Option<KnownServers> {
        let config = std::env::var_os("XDG_CONFIG_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| PathBuf::from(h).join(".config")))?;
        Some(KnownServers::new(config.join("tiercel").join("known_servers")))
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The key pinned for `target` (an address as `127.0.0.1:7392`, a name as `name:calc`), and
    /// the line it is on; `None` when the file has none for it, or is not there.
    pub fn lookup(&self, target: &str) -> Result<Option<(PublicKey, usize)>, KnownError> {
        let Some(text) = self.read()? else { return Ok(None) };
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut fields = line.split_whitespace();
            let (Some(who), Some(key), None) = (fields.next(), fields.next(), fields.next()) else {
                return Err(self.error(format_args!("line {}: not `TARGET KEY`", n + 1)));
            };
            if who == target {
                let key =
                    key.parse().map_err(|e: super::KeyError| self.error(format_args!("line {}: {}", n + 1, e.0)))?;
                return Ok(Some((key, n + 1)));
            }
        }
        Ok(None)
    }

    /// Pins `key` for `target`: appends its line, unless the file has one for it already. Returns
    /// the key the file holds for `target` afterwards, with its line: `key`, or the key another
    /// client pinned first (the first line of a target counts).
    pub fn pin(&self, target: &str, key: &PublicKey) -> Result<(PublicKey, usize), KnownError> {
        if target.is_empty() || target.contains(char::is_whitespace) {
            return Err(self.error(format_args!("`{target}` cannot be a target")));
        }
        if let Some(pinned) = self.lookup(target)? {
            return Ok(pinned);
        }
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| self.error(format_args!("{}: {e}", dir.display())))?;
        }
        self.check_dir()?;
        let mut file = tiercel_sys::process::append_nofollow(&self.path).map_err(|e| self.error(e))?;
        self.check(&file.metadata().map_err(|e| self.error(e))?)?;
        // One write of one line, appended: lines of clients pinning at once are never interleaved.
        file.write_all(format!("{target} {key}\n").as_bytes()).map_err(|e| self.error(e))?;
        self.lookup(target)?.ok_or_else(|| self.error("the line written is not there"))
    }

    /// The file's text, checked to be this user's own; `None` when it is not there.
    fn read(&self) -> Result<Option<String>, KnownError> {
        use std::io::Read;
        let mut file = match tiercel_sys::process::open_nofollow(&self.path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(_) if std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.file_type().is_symlink()) => {
                return Err(self.error("a symbolic link, which is not followed"))
            }
            Err(e) => return Err(self.error(e)),
        };
        self.check_dir()?;
        self.check(&file.metadata().map_err(|e| self.error(e))?)?;
        let mut text = String::new();
        // A bound on what is read: a file of a million servers' lines is still far below it.
        (&mut file).take(MAX_FILE).read_to_string(&mut text).map_err(|e| self.error(e))?;
        Ok(Some(text))
    }

    /// Refuses a file that is no regular file, or that another user owns or may write.
    fn check(&self, meta: &std::fs::Metadata) -> Result<(), KnownError> {
        if !meta.is_file() {
            return Err(self.error("not a regular file"));
        }
        self.owned(meta, "the file")
    }

    /// Refuses a directory (of the file) that another user owns or may write.
    fn check_dir(&self) -> Result<(), KnownError> {
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let meta = std::fs::metadata(dir).map_err(|e| self.error(format_args!("{}: {e}", dir.display())))?;
        self.owned(&meta, "its directory")
    }

    fn owned(&self, meta: &std::fs::Metadata, what: &str) -> Result<(), KnownError> {
        let (uid, mode) = (meta.uid(), meta.mode() & 0o7777);
        let me = tiercel_sys::process::euid();
        if uid != me && uid != 0 {
            return Err(self.error(format_args!("{what} is owned by uid {uid}, not by this user ({me}) or root")));
        }
        if mode & 0o022 != 0 {
            return Err(self.error(format_args!(
                "{what} may be written by other users (mode {mode:o}): another user could choose whom \
                 this client trusts; chmod go-w it"
            )));
        }
        Ok(())
    }

    fn error(&self, e: impl std::fmt::Display) -> KnownError {
        KnownError(format!("{}: {e}", self.path.display()))
    }
}

/// Most bytes of a known-servers file read.
const MAX_FILE: u64 = 64 << 20;

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tiercel-known-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        d
    }

    #[test]
    fn the_first_key_pinned_for_a_target_is_the_one_that_counts() {
        let d = dir("first");
        let known = KnownServers::new(d.join("sub/known_servers"));
        assert_eq!(known.lookup("127.0.0.1:7").unwrap(), None, "no file yet");
        let (a, b) = (PublicKey([1; 32]), PublicKey([2; 32]));
        assert_eq!(known.pin("127.0.0.1:7", &a).unwrap(), (a, 1));
        assert_eq!(known.pin("name:calc", &b).unwrap(), (b, 2));
        // Another key for the same target does not replace the first.
        assert_eq!(known.pin("127.0.0.1:7", &b).unwrap(), (a, 1));
        assert_eq!(known.lookup("127.0.0.1:7").unwrap(), Some((a, 1)));
        assert_eq!(known.lookup("name:calc").unwrap(), Some((b, 2)));
        assert_eq!(known.lookup("name:other").unwrap(), None);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(known.path()), 0o600);
        assert_eq!(mode(&d.join("sub")), 0o700);
        let text = std::fs::read_to_string(known.path()).unwrap();
        assert_eq!(text, format!("127.0.0.1:7 {a}\nname:calc {b}\n"));
        assert!(known.pin("two words", &a).is_err());
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn comments_are_skipped_and_a_bad_line_is_an_error_naming_it() {
        let d = dir("lines");
        let path = d.join("known");
        let key = PublicKey([3; 32]);
        std::fs::write(&path, format!("# mine\n\n  [::1]:9 {key}  \n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let known = KnownServers::new(&path);
        assert_eq!(known.lookup("[::1]:9").unwrap(), Some((key, 3)));
        std::fs::write(&path, "[::1]:9 nothex\n").unwrap();
        let e = known.lookup("[::1]:9").unwrap_err();
        assert!(e.0.contains("line 1"), "{e}");
        std::fs::write(&path, "[::1]:9\n").unwrap();
        assert!(known.lookup("x").unwrap_err().0.contains("TARGET KEY"));
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_file_others_may_write_or_a_symbolic_link_is_never_trusted() {
        let d = dir("unsafe");
        let path = d.join("known");
        let key = PublicKey([4; 32]);
        std::fs::write(&path, format!("h:1 {key}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o622)).unwrap();
        let known = KnownServers::new(&path);
        assert!(known.lookup("h:1").unwrap_err().0.contains("written by other users"));
        assert!(known.pin("h:2", &key).is_err(), "nothing is appended to it either");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(known.lookup("h:1").unwrap(), Some((key, 1)));
        // A directory others may write.
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(known.lookup("h:1").unwrap_err().0.contains("its directory"));
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        // A symbolic link, to a good file.
        let link = d.join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let linked = KnownServers::new(&link);
        assert!(linked.lookup("h:1").unwrap_err().0.contains("symbolic link"));
        assert!(linked.pin("h:3", &key).is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), format!("h:1 {key}\n"));
        std::fs::remove_dir_all(d).unwrap();
    }
}
