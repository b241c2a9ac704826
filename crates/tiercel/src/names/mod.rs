//! Export and import by name (Birrell & Nelson's name service): a server registers each interface
//! it exports under a name as long as it runs, and a client imports by that name instead of an
//! address.
//!
//! The registry that needs no setup is a directory on this host ([`Registry::local`]): one file
//! per exporter under `<dir>/<name>/`, written whole and renamed into place, and locked (`flock`)
//! by the server's process for as long as it lives. The kernel drops the lock when the process
//! dies, however it dies, so an importer tells a live exporter from a stale file without asking
//! anyone: a file it can lock is stale, and it removes it.
//!
//! The default directory is the user's: `$XDG_RUNTIME_DIR/tiercel/names`, else
//! `/tmp/tiercel-<uid>/names`, made with mode 0700 and refused if another user owns it or may
//! write to it, or if it (or its parent) is a symbolic link (a user who could write there, or
//! point it elsewhere, could put any address under any name). Servers of several users on one
//! host share names through a directory given to all of them (`TIERCEL_REGISTRY=dir:/path`).
//!
//! A name is only as trustworthy as whoever may write it, so a directory registry trusts the user
//! running the process, root, and the users it is told to trust ([`Dir::trust`],
//! `dir:/path?trust=UID,…`), and no one else. Every directory from `/` down to a name's directory
//! must be owned by a trusted user and writable by no one else (a sticky directory, as `/tmp`,
//! excepted: there others may add entries but not remove or replace ones they do not own), and so
//! must every symbolic link on the way; an entry is read only if it is a regular file owned by a
//! trusted user, opened without following a link. Another user can therefore squat a name in a
//! shared sticky directory (made first, its directory is theirs, and registering under it then
//! fails, naming them) but cannot point a client anywhere.
//!
//! An entry says which interface is exported (name, version and fingerprint), so an import of a
//! name exported with another interface fails before anything is sent, naming both. The bind that
//! follows checks the interface again, as every bind does.

use std::fs::File;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::interface::InterfaceInfo;

#[cfg(feature = "etcd")]
mod etcd;
#[cfg(feature = "etcd")]
pub use etcd::{Etcd, EtcdUser, DEFAULT_TTL};

/// Environment variable naming the registry servers register in and clients look names up in
/// (see [`Registry::parse`]); without it, [`Registry::local`].
pub const REGISTRY_ENV: &str = "TIERCEL_REGISTRY";

/// Longest name, in bytes.
pub const MAX_NAME_LEN: usize = 128;

/// Largest entry file read: a larger one is not an entry (and is not read into memory).
const MAX_ENTRY_LEN: u64 = 4096;

/// First line of every entry file: the format and its version.
const ENTRY_MAGIC: &str = "tiercel-name 1";

/// Where names are registered and looked up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registry {
    /// A directory on this host (see the [module documentation](self)).
    Local(Dir),
    /// An etcd cluster, for servers and clients on many hosts (feature `etcd`): a registration
    /// lives while its server's process keeps its lease alive, and a killed server's entry is gone
    /// within the lease's time to live.
    #[cfg(feature = "etcd")]
    Etcd(Etcd),
}

/// A directory registry: where it is, and whose entries it trusts besides this user's and root's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dir {
    /// The directory.
    pub path: PathBuf,
    /// Users (ids) whose directories and entries are trusted, besides the user running the
    /// process and root: the users whose servers a client of a shared registry is to reach.
    pub trust: Vec<u32>,
}

impl Dir {
    /// The directory at `path`, trusting this user and root.
    pub fn new(path: impl Into<PathBuf>) -> Dir {
        Dir { path: path.into(), trust: Vec::new() }
    }

    /// Trusts user `uid` too.
    pub fn trust(mut self, uid: u32) -> Dir {
        if !self.trust.contains(&uid) {
            self.trust.push(uid);
        }
        self
    }

    /// Whether files and directories of user `uid` are trusted.
    fn trusts(&self, uid: u32) -> bool {
        uid == 0 || uid == tiercel_sys::process::euid() || self.trust.contains(&uid)
    }
}

/// Why a name could not be registered or looked up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// The name is empty, too long, or has characters other than ASCII letters, digits, `.`,
    /// `_` and `-` (or starts with `.`).
    #[error("invalid name {0:?}: use 1 to 128 ASCII letters, digits, '.', '_' or '-', not starting with '.'")]
    InvalidName(String),
    /// The registry's description could not be parsed.
    #[error("invalid registry {registry:?}: {reason}")]
    InvalidRegistry {
        /// What was given.
        registry: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The registry's directory, one above it or a name's directory is not safe to trust: an
    /// untrusted user owns it or may write to it, or it is a symbolic link where none may be.
    #[error("registry directory {path} is not safe: {reason}")]
    Unsafe {
        /// The directory.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// No live server exports the name.
    #[error("no server exports the name {name:?} (registry {registry})")]
    NotFound {
        /// The name.
        name: String,
        /// The registry looked in.
        registry: String,
    },
    /// Servers export the name, but with another interface (or another version of it) than the
    /// client's.
    #[error("name {name:?} is exported as {exported}, not as {wanted}")]
    WrongInterface {
        /// The name.
        name: String,
        /// The client's interface: name and version.
        wanted: String,
        /// What the exporters export, each with its address.
        exported: String,
    },
    /// Reading or writing the registry failed.
    #[error("registry {registry}: {source}")]
    Io {
        /// The registry.
        registry: String,
        /// The error.
        source: std::io::Error,
    },
}

/// One server's export of an interface under a name, as the registry holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exporter {
    /// The name.
    pub name: String,
    /// The interface's name.
    pub interface: String,
    /// The interface's version.
    pub version: u32,
    /// The interface's fingerprint ([`InterfaceInfo::fingerprint`]).
    pub fingerprint: u64,
    /// Where the server listens.
    pub addr: SocketAddr,
    /// The server's incarnation (random at every start).
    pub incarnation: u64,
    /// The server's process id.
    pub pid: u32,
    /// The server's public key, when it takes secure bindings (`ServerConfig::key`). A client
    /// importing the name from a registry that vouches for its entries ([`Registry::vouches`])
    /// binds securely with it, when it was not given the server's key itself.
    pub key: Option<crate::PublicKey>,
    /// An authority's endorsement of `key` for `name` (`ServerConfig::endorsements`): what a client
    /// given that authority (`ClientConfig::authorities`) requires of an entry before it binds with
    /// the entry's key, whatever the registry.
    pub endorsement: Option<crate::Endorsement>,
}

impl Exporter {
    /// Whether this exporter exports `info`'s interface in its version. Its copy may differ from
    /// `info` (another fingerprint): a bind then goes by procedure names and shapes, and refuses a
    /// procedure both have with different shapes.
    pub fn exports(&self, info: &InterfaceInfo) -> bool {
        self.interface == info.name && self.version == info.version
    }

    fn encode(&self) -> String {
        let mut text = format!(
            "{ENTRY_MAGIC}\nname {}\ninterface {}\nversion {}\nfingerprint {:016x}\naddress {}\nincarnation {:016x}\npid {}\n",
            self.name, self.interface, self.version, self.fingerprint, self.addr, self.incarnation, self.pid
        );
        if let Some(key) = &self.key {
            text.push_str(&format!("key {key}\n"));
            if let Some(endorsement) = &self.endorsement {
                text.push_str(&format!("{endorsement}\n"));
            }
        }
        text
    }

    /// Parses an entry file's text; `None` when it is not one (whatever it holds).
    fn decode(text: &str) -> Option<Exporter> {
        let mut lines = text.lines();
        if lines.next()? != ENTRY_MAGIC {
            return None;
        }
        let mut field = |key: &str| -> Option<&str> {
            let line = lines.next()?;
            let (k, v) = line.split_once(' ')?;
            (k == key).then_some(v)
        };
        let name = field("name")?.to_owned();
        let interface = field("interface")?.to_owned();
        let version = field("version")?.parse().ok()?;
        let fingerprint = u64::from_str_radix(field("fingerprint")?, 16).ok()?;
        let addr = field("address")?.parse().ok()?;
        let incarnation = u64::from_str_radix(field("incarnation")?, 16).ok()?;
        let pid = field("pid")?.parse().ok()?;
        // Optional: a server without a key writes none, and one without an endorsement of it none.
        let key = match lines.next() {
            None => None,
            Some(line) => Some(line.strip_prefix("key ")?.parse().ok()?),
        };
        let endorsement = match lines.next() {
            None => None,
            Some(line) => Some(line.parse().ok()?),
        };
        if lines.next().is_some() {
            return None;
        }
        let exporter = Exporter { name, interface, version, fingerprint, addr, incarnation, pid, key, endorsement };
        valid_name(&exporter.name).then_some(exporter)
    }
}

impl core::fmt::Display for Exporter {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{} v{} (fingerprint {:016x}) at {}", self.interface, self.version, self.fingerprint, self.addr)
    }
}

/// A name registered by a running server; dropping it takes the name back.
#[derive(Debug)]
pub struct Registration(Held);

#[derive(Debug)]
enum Held {
    File {
        path: PathBuf,
        /// Open and locked for as long as the registration lives (and no longer than the process).
        _lock: File,
    },
    /// Revoked when dropped.
    #[cfg(feature = "etcd")]
    Etcd(#[allow(dead_code)] etcd::Lease),
}

impl Drop for Registration {
    fn drop(&mut self) {
        match &self.0 {
            Held::File { path, .. } => {
                let _ = std::fs::remove_file(path);
            }
            // The lease revokes itself when dropped.
            #[cfg(feature = "etcd")]
            Held::Etcd(_) => {}
        }
    }
}

/// Exporters of a name seen to go (their entries revoked or expired), as a watch of the name
/// reports them: what a binding made by name with `ClientConfig::rebind` looks at before each call,
/// so that it moves to a live exporter before calling a gone one.
#[derive(Debug, Default)]
pub(crate) struct Departures {
    /// Bumped at each departure (what a binding compares, one atomic load per call).
    generation: std::sync::atomic::AtomicU64,
    /// The last few departed: address and incarnation.
    gone: std::sync::Mutex<std::collections::VecDeque<(SocketAddr, u64)>>,
}

/// Departures remembered (a binding learns of its exporter's at its next call).
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
const DEPARTURES_KEPT: usize = 64;

impl Departures {
    /// How many departures have been seen.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether the exporter at `addr` with `incarnation` has gone.
    pub(crate) fn has_gone(&self, addr: SocketAddr, incarnation: u64) -> bool {
        self.gone.lock().unwrap_or_else(|p| p.into_inner()).contains(&(addr, incarnation))
    }

    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    fn depart(&self, exporter: &Exporter) {
        let mut gone = self.gone.lock().unwrap_or_else(|p| p.into_inner());
        if gone.len() == DEPARTURES_KEPT {
            gone.pop_front();
        }
        gone.push_back((exporter.addr, exporter.incarnation));
        self.generation.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// A watch of a name's exporters, kept while it lives.
#[derive(Debug)]
pub(crate) struct Watch {
    pub(crate) departures: std::sync::Arc<Departures>,
    /// Dropped with the watch: its thread ends.
    #[cfg(feature = "etcd")]
    _stop: etcd::WatchStop,
}

/// Whether `name` may be registered: see [`NameError::InvalidName`].
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn check_name(name: &str) -> Result<(), NameError> {
    match valid_name(name) {
        true => Ok(()),
        false => Err(NameError::InvalidName(name.to_owned())),
    }
}

impl Default for Registry {
    /// [`Registry::from_env`], or [`Registry::local`] if the variable does not parse.
    fn default() -> Registry {
        Registry::from_env().unwrap_or_else(|_| Registry::local())
    }
}

impl core::fmt::Display for Registry {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Registry::Local(dir) => {
                write!(f, "dir:{}", dir.path.display())?;
                for (i, uid) in dir.trust.iter().enumerate() {
                    write!(f, "{}{uid}", if i == 0 { "?trust=" } else { "," })?;
                }
                Ok(())
            }
            #[cfg(feature = "etcd")]
            Registry::Etcd(etcd) => etcd.fmt(f),
        }
    }
}

impl Registry {
    /// Whether the registry vouches for what its entries say, so that a server key an entry
    /// carries may be trusted: a directory, whose entries are read only when a trusted user wrote
    /// them; etcd with authentication (only users allowed to write names register them). Not etcd
    /// without it, which anyone who reaches it may write: there, give the client the server's key.
    pub fn vouches(&self) -> bool {
        match self {
            Registry::Local(_) => true,
            #[cfg(feature = "etcd")]
            Registry::Etcd(etcd) => etcd.authenticated(),
        }
    }

    /// A watch of `name`'s exporters, where the registry tells of departures as they happen (etcd:
    /// a revoked or expired lease deletes the entry). `None` for a directory, whose entries of
    /// killed servers are found stale only when looked up.
    pub(crate) fn watch(&self, name: &str) -> Option<Watch> {
        match self {
            Registry::Local(_) => {
                let _ = name;
                None
            }
            #[cfg(feature = "etcd")]
            Registry::Etcd(e) => {
                let departures = std::sync::Arc::new(Departures::default());
                let stop = etcd::watch(e, name, departures.clone()).ok()?;
                Some(Watch { departures, _stop: stop })
            }
        }
    }

    /// This user's registry on this host: `$XDG_RUNTIME_DIR/tiercel/names`, else
    /// `/tmp/tiercel-<uid>/names`.
    pub fn local() -> Registry {
        let base = match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(run) if !run.is_empty() => PathBuf::from(run).join("tiercel"),
            _ => PathBuf::from(format!("/tmp/tiercel-{}", tiercel_sys::process::euid())),
        };
        Registry::Local(Dir::new(base.join("names")))
    }

    /// The directory registry at `path` ([`Dir::new`]).
    pub fn dir(path: impl Into<PathBuf>) -> Registry {
        Registry::Local(Dir::new(path))
    }

    /// The registry named by `TIERCEL_REGISTRY` ([`Registry::parse`]), or [`Registry::local`]
    /// when it is unset or empty.
    pub fn from_env() -> Result<Registry, NameError> {
        match std::env::var(REGISTRY_ENV) {
            Ok(s) if !s.is_empty() => Registry::parse(&s),
            _ => Ok(Registry::local()),
        }
    }

    /// `local` ([`Registry::local`]), `dir:/absolute/path[?trust=UID,…]` (a directory of the same
    /// layout, trusting the users listed besides this one and root), or
    /// `etcd://HOST:PORT[,HOST:PORT…][?ttl=SECONDS][&user=NAME&password-file=PATH]` (feature `etcd`;
    /// the lease's time to live is 5 s unless given; a user for a cluster with authentication on).
    pub fn parse(s: &str) -> Result<Registry, NameError> {
        let bad = |reason: &str| NameError::InvalidRegistry { registry: s.to_owned(), reason: reason.to_owned() };
        if s == "local" {
            return Ok(Registry::local());
        }
        if let Some(rest) = s.strip_prefix("etcd://") {
            #[cfg(feature = "etcd")]
            return etcd::parse(s, rest).map(Registry::Etcd);
            #[cfg(not(feature = "etcd"))]
            return {
                let _ = rest;
                Err(bad("this program was built without tiercel's `etcd` feature"))
            };
        }
        let Some(rest) = s.strip_prefix("dir:") else {
            return Err(bad("expected `local`, `dir:/absolute/path` or `etcd://HOST:PORT`"));
        };
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        if !Path::new(path).is_absolute() {
            return Err(bad("the directory must be an absolute path"));
        }
        let mut dir = Dir::new(path);
        if !query.is_empty() {
            let uids = query.strip_prefix("trust=").ok_or_else(|| bad("the only option is `?trust=UID,…`"))?;
            for uid in uids.split(',') {
                dir =
                    dir.trust(uid.parse().map_err(|_| bad("`trust=` takes user ids (numbers), separated by commas"))?);
            }
        }
        Ok(Registry::Local(dir))
    }

    fn io(&self, source: std::io::Error) -> NameError {
        NameError::Io { registry: self.to_string(), source }
    }

    /// Registers `exporter` under its name until the returned registration is dropped (or the
    /// process exits).
    pub fn register(&self, exporter: &Exporter) -> Result<Registration, NameError> {
        check_name(&exporter.name)?;
        match self {
            Registry::Local(local) => {
                let dir = self.name_dir(local, &exporter.name, true)?.expect("made");
                // Written and locked under a temporary name, then renamed into place: an importer
                // never sees an entry that is incomplete or not yet locked.
                let file_name = format!("{:016x}-{}", exporter.incarnation, unique());
                let (tmp, path) = (dir.join(format!(".{file_name}")), dir.join(&file_name));
                let write = || -> std::io::Result<File> {
                    let mut file = File::create_new(&tmp)?;
                    file.try_lock().map_err(std::io::Error::from)?;
                    file.write_all(exporter.encode().as_bytes())?;
                    file.sync_data()?;
                    std::fs::rename(&tmp, &path)?;
                    Ok(file)
                };
                match write() {
                    Ok(lock) => Ok(Registration(Held::File { path, _lock: lock })),
                    Err(e) => {
                        let _ = std::fs::remove_file(&tmp);
                        Err(self.io(e))
                    }
                }
            }
            #[cfg(feature = "etcd")]
            Registry::Etcd(cluster) => {
                etcd::register(cluster, exporter).map(|lease| Registration(Held::Etcd(lease))).map_err(|e| self.io(e))
            }
        }
    }

    /// The live exporters of `name`, in no particular order (stale entries of servers that died
    /// are removed on the way). Empty when nobody exports it.
    pub fn lookup(&self, name: &str) -> Result<Vec<Exporter>, NameError> {
        check_name(name)?;
        match self {
            Registry::Local(local) => {
                let Some(dir) = self.name_dir(local, name, false)? else {
                    return Ok(Vec::new());
                };
                let entries = match std::fs::read_dir(&dir) {
                    Ok(entries) => entries,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
                    Err(e) => return Err(self.io(e)),
                };
                let mut live = Vec::new();
                for entry in entries {
                    let entry = entry.map_err(|e| self.io(e))?;
                    if entry.file_name().as_encoded_bytes().starts_with(b".") {
                        continue;
                    }
                    if let Some(exporter) = read_live(&entry.path(), local) {
                        if exporter.name == name {
                            live.push(exporter);
                        }
                    }
                }
                Ok(live)
            }
            #[cfg(feature = "etcd")]
            Registry::Etcd(cluster) => Ok(etcd::lookup(cluster, name)
                .map_err(|e| self.io(e))?
                .into_iter()
                .filter(|e| e.name == name)
                .collect()),
        }
    }

    /// The names with at least one live exporter, sorted.
    pub fn names(&self) -> Result<Vec<String>, NameError> {
        match self {
            Registry::Local(local) => {
                if !self.walk(local, false)? {
                    return Ok(Vec::new());
                }
                let mut names = Vec::new();
                for entry in std::fs::read_dir(&local.path).map_err(|e| self.io(e))? {
                    let name = entry.map_err(|e| self.io(e))?.file_name();
                    if let Some(name) = name.to_str().filter(|n| valid_name(n)) {
                        if !self.lookup(name)?.is_empty() {
                            names.push(name.to_owned());
                        }
                    }
                }
                names.sort();
                Ok(names)
            }
            #[cfg(feature = "etcd")]
            Registry::Etcd(cluster) => etcd::names(cluster).map_err(|e| self.io(e)),
        }
    }

    /// The live exporters of `name` that export `info`; fails, naming both, when the name is
    /// exported only with other interfaces, and when nobody exports it.
    pub fn resolve(&self, name: &str, info: &InterfaceInfo) -> Result<Vec<Exporter>, NameError> {
        let all = self.lookup(name)?;
        if all.is_empty() {
            return Err(NameError::NotFound { name: name.to_owned(), registry: self.to_string() });
        }
        let (fit, other): (Vec<_>, Vec<_>) = all.into_iter().partition(|e| e.exports(info));
        if fit.is_empty() {
            let exported: Vec<String> = other.iter().map(|e| e.to_string()).collect();
            return Err(NameError::WrongInterface {
                name: name.to_owned(),
                wanted: format!("{} v{}", info.name, info.version),
                exported: exported.join("; "),
            });
        }
        Ok(fit)
    }

    fn is_default(&self) -> bool {
        *self == Registry::local()
    }

    /// How many of the directory's last components must be private to this user: the default
    /// directory and its parent (`/tmp/tiercel-<uid>` could have been made, or linked elsewhere,
    /// by another user before this one's first server); none of a directory given.
    fn private_depth(&self) -> usize {
        if self.is_default() {
            2
        } else {
            0
        }
    }

    /// Checks every directory from `/` down to the registry's ([`check_entry`]), making the missing
    /// ones when `make` is set, and then every directory of its real path (links resolved). False
    /// when the directory does not exist and was not to be made.
    fn walk(&self, local: &Dir, make: bool) -> Result<bool, NameError> {
        let private = self.private_depth();
        let depth = local.path.components().count();
        let mut at = PathBuf::new();
        for (i, part) in local.path.components().enumerate() {
            at.push(part);
            let private = depth - i <= private;
            let meta = match std::fs::symlink_metadata(&at) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && make => {
                    make_dir(&at, if private { 0o700 } else { 0o755 }).map_err(|e| self.io(e))?;
                    std::fs::symlink_metadata(&at)
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
                found => found,
            };
            let meta = meta.map_err(|e| NameError::Unsafe { path: at.clone(), reason: e.to_string() })?;
            check_entry(&at, &meta, local, private)?;
        }
        let real = std::fs::canonicalize(&local.path).map_err(|e| self.io(e))?;
        let mut at = PathBuf::new();
        for part in real.components() {
            at.push(part);
            let meta = std::fs::symlink_metadata(&at).map_err(|e| self.io(e))?;
            check_entry(&at, &meta, local, false)?;
        }
        Ok(true)
    }

    /// The directory of `name`'s entries, checked as the registry's own (made with the registry's
    /// when `make` is set); `None` when it does not exist and was not to be made.
    fn name_dir(&self, local: &Dir, name: &str, make: bool) -> Result<Option<PathBuf>, NameError> {
        if !self.walk(local, make)? {
            return Ok(None);
        }
        let dir = local.path.join(name);
        let meta = match std::fs::symlink_metadata(&dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && make => {
                make_dir(&dir, if self.is_default() { 0o700 } else { 0o755 }).map_err(|e| self.io(e))?;
                std::fs::symlink_metadata(&dir)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            found => found,
        };
        let meta = meta.map_err(|e| self.io(e))?;
        // A name's directory is never a link: one would let whoever made it point the name anywhere.
        if meta.file_type().is_symlink() {
            return Err(NameError::Unsafe { path: dir, reason: "a symbolic link, where a directory must be".into() });
        }
        check_entry(&dir, &meta, local, false)?;
        Ok(Some(dir))
    }
}

/// A number no other registration of this process has used.
fn unique() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    (u64::from(std::process::id()) << 32) | NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The entry at `path` if it is a regular file of a trusted user and its exporter still holds its
/// lock; a stale one (lockable: its process is gone) is removed. Links, files of other users, and
/// unreadable or malformed files are skipped, not trusted.
fn read_live(path: &Path, local: &Dir) -> Option<Exporter> {
    use std::os::unix::fs::MetadataExt;
    let file = tiercel_sys::process::open_nofollow(path).ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || !local.trusts(meta.uid()) {
        return None;
    }
    match file.try_lock_shared() {
        // Nobody holds it: the exporter died without taking its name back.
        Ok(()) => {
            let _ = std::fs::remove_file(path);
            None
        }
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut text = String::new();
            file.take(MAX_ENTRY_LEN).read_to_string(&mut text).ok()?;
            Exporter::decode(&text)
        }
        Err(std::fs::TryLockError::Error(_)) => None,
    }
}

/// Makes one directory with `mode` (less the umask); one made meanwhile by someone else is checked
/// like any other.
fn make_dir(dir: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(mode).create(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

/// Refuses a directory (or a link on the way to one) that could let an untrusted user write names:
/// one owned by a user `local` does not trust, or writable by others without the sticky bit. A
/// `private` one (the default registry and its parent) must be this user's own directory, not a
/// link, and writable by no one else, sticky or not.
fn check_entry(path: &Path, meta: &std::fs::Metadata, local: &Dir, private: bool) -> Result<(), NameError> {
    use std::os::unix::fs::MetadataExt;
    let unsafe_dir = |reason: String| Err(NameError::Unsafe { path: path.to_owned(), reason });
    let me = tiercel_sys::process::euid();
    let (uid, mode) = (meta.uid(), meta.mode() & 0o7777);
    if private {
        if meta.file_type().is_symlink() {
            return unsafe_dir(format!(
                "a symbolic link (owned by uid {uid}), where this user's own directory must be"
            ));
        }
        if uid != me {
            return unsafe_dir(format!("owned by uid {uid}, not by this user ({me})"));
        }
    }
    if !local.trusts(uid) {
        let also = if local.trust.is_empty() { String::new() } else { format!(" or a trusted user {:?}", local.trust) };
        return unsafe_dir(format!("owned by uid {uid}, not by this user ({me}), root{also}"));
    }
    if meta.file_type().is_symlink() {
        // A trusted user's link: where it leads is checked as the real path.
        return Ok(());
    }
    if !meta.is_dir() {
        return unsafe_dir("not a directory".into());
    }
    const STICKY: u32 = 0o1000;
    if mode & 0o022 != 0 && (private || mode & STICKY == 0) {
        return unsafe_dir(format!(
            "writable by others (mode {mode:o}){}",
            if private { "" } else { " without the sticky bit" }
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
