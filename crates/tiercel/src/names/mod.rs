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
//! write to it (a user who could write there could put any address under any name). Servers of
//! several users on one host share names through a directory given to all of them
//! (`TIERCEL_REGISTRY=dir:/path`), which then decides who may register.
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
pub use etcd::{Etcd, DEFAULT_TTL};

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
    Local(PathBuf),
    /// An etcd cluster, for servers and clients on many hosts (feature `etcd`): a registration
    /// lives while its server's process keeps its lease alive, and a killed server's entry is gone
    /// within the lease's time to live.
    #[cfg(feature = "etcd")]
    Etcd(Etcd),
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
    /// The registry's directory is not safe to trust: another user owns it or may write to it.
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
}

impl Exporter {
    /// Whether this exporter exports `info`'s interface in its version. Its copy may differ from
    /// `info` (another fingerprint): a bind then goes by procedure names and shapes, and refuses a
    /// procedure both have with different shapes.
    pub fn exports(&self, info: &InterfaceInfo) -> bool {
        self.interface == info.name && self.version == info.version
    }

    fn encode(&self) -> String {
        format!(
            "{ENTRY_MAGIC}\nname {}\ninterface {}\nversion {}\nfingerprint {:016x}\naddress {}\nincarnation {:016x}\npid {}\n",
            self.name, self.interface, self.version, self.fingerprint, self.addr, self.incarnation, self.pid
        )
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
        valid_name(&name).then_some(Exporter { name, interface, version, fingerprint, addr, incarnation, pid })
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
            Registry::Local(dir) => write!(f, "dir:{}", dir.display()),
            #[cfg(feature = "etcd")]
            Registry::Etcd(etcd) => etcd.fmt(f),
        }
    }
}

impl Registry {
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
        Registry::Local(base.join("names"))
    }

    /// The registry named by `TIERCEL_REGISTRY` ([`Registry::parse`]), or [`Registry::local`]
    /// when it is unset or empty.
    pub fn from_env() -> Result<Registry, NameError> {
        match std::env::var(REGISTRY_ENV) {
            Ok(s) if !s.is_empty() => Registry::parse(&s),
            _ => Ok(Registry::local()),
        }
    }

    /// `local` ([`Registry::local`]), `dir:/absolute/path` (a directory of the same layout), or
    /// `etcd://HOST:PORT[,HOST:PORT…][?ttl=SECONDS]` (feature `etcd`; the lease's time to live is
    /// 5 s unless given).
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
        match s.strip_prefix("dir:") {
            Some(path) if Path::new(path).is_absolute() => Ok(Registry::Local(PathBuf::from(path))),
            Some(_) => Err(bad("the directory must be an absolute path")),
            None => Err(bad("expected `local`, `dir:/absolute/path` or `etcd://HOST:PORT`")),
        }
    }

    fn io(&self, source: std::io::Error) -> NameError {
        NameError::Io { registry: self.to_string(), source }
    }

    /// Registers `exporter` under its name until the returned registration is dropped (or the
    /// process exits).
    pub fn register(&self, exporter: &Exporter) -> Result<Registration, NameError> {
        check_name(&exporter.name)?;
        match self {
            Registry::Local(root) => {
                let dir = root.join(&exporter.name);
                make_private_dir(root, self.is_default()).and_then(|()| make_dir(&dir)).map_err(|e| self.io(e))?;
                self.check(root)?;
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
            Registry::Local(root) => {
                if !root.exists() {
                    return Ok(Vec::new());
                }
                self.check(root)?;
                let entries = match std::fs::read_dir(root.join(name)) {
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
                    if let Some(exporter) = read_live(&entry.path()) {
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
            Registry::Local(root) => {
                if !root.exists() {
                    return Ok(Vec::new());
                }
                self.check(root)?;
                let mut names = Vec::new();
                for entry in std::fs::read_dir(root).map_err(|e| self.io(e))? {
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

    /// [`check_dir`] of the directory, and of its parent for the default one (`/tmp/tiercel-<uid>`
    /// could have been made by another user before this one's first server).
    fn check(&self, root: &Path) -> Result<(), NameError> {
        check_dir(root)?;
        match root.parent() {
            Some(parent) if self.is_default() => check_dir(parent),
            _ => Ok(()),
        }
    }
}

/// A number no other registration of this process has used.
fn unique() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    (u64::from(std::process::id()) << 32) | NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The entry at `path` if its exporter still holds its lock; a stale one (lockable: its process is
/// gone) is removed. Unreadable or malformed files are skipped, not trusted.
fn read_live(path: &Path) -> Option<Exporter> {
    let file = File::open(path).ok()?;
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

/// Makes the registry's directory; the default one (and its parent) private to this user.
fn make_private_dir(root: &Path, private: bool) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    if private {
        builder.mode(0o700);
    }
    builder.create(root)
}

fn make_dir(dir: &Path) -> std::io::Result<()> {
    match std::fs::create_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

/// Refuses a registry directory that another user could write names into: one owned by someone
/// other than this user or root, or writable by others without the sticky bit.
fn check_dir(root: &Path) -> Result<(), NameError> {
    use std::os::unix::fs::MetadataExt;
    let unsafe_dir = |reason: String| NameError::Unsafe { path: root.to_owned(), reason };
    let meta = std::fs::metadata(root).map_err(|e| unsafe_dir(e.to_string()))?;
    let me = tiercel_sys::process::euid();
    if meta.uid() != me && meta.uid() != 0 {
        return Err(unsafe_dir(format!("owned by uid {}, not by this user ({me}) or root", meta.uid())));
    }
    const STICKY: u32 = 0o1000;
    if meta.mode() & 0o022 != 0 && meta.mode() & STICKY == 0 {
        return Err(unsafe_dir(format!("writable by others (mode {:o}) without the sticky bit", meta.mode() & 0o7777)));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
