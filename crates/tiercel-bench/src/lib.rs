//! tiercel's measurements: the seed papers' tables, each against the raw mechanism beneath it
//! measured in the same run, the per-step accounting of a call, and the lossy-network soak; and the
//! seeds' `Test` interface they all call.
//!
//! The layers point one way:
//!
//! ```text
//! roles                             what a helper process runs (dispatch, first thing in `main`)
//! bench, explain, soak              the commands: options, the run, printing, JSON, plots
//!   tables, latency, load, loss,    one table each (Mach list, Firefly I-V; latency per transport;
//!   wide, peregrine, baselines,       Lampson's load; loss recovery; large calls across namespaces;
//!   plot                              Peregrine 1/3/5; raw baselines; SVG charts)
//!     accounting                    per-step timestamps of running calls, added up
//!       harness                     the media measured and their baselines, helpers started
//!         helpers, serve,           starting this program as a helper; the Test server;
//!         raw, raw_shm, raw_tcp       raw ping-pongs and their echo servers
//!           seeds, summary,         the Test interface; medians and percentiles; progress output;
//!           progress, netns           network namespaces joined by a veth pair
//! ```
//!
//! Every server the measurements talk to runs in a process of its own: this program started again
//! as a helper ([`helpers`], [`roles`]), so that client and server can be pinned to CPUs of their own.

#![forbid(unsafe_code)]

pub mod accounting;
pub mod asynch;
pub mod baselines;
pub mod bench;
pub mod blocking;
pub use tiercel_seeds::etcd;
pub mod explain;
pub mod failover;
pub mod harness;
pub mod helpers;
pub mod latency;
pub mod load;
pub mod loss;
pub mod netns;
pub mod onc;
pub mod peers;
pub mod peregrine;
pub mod plot;
pub mod progress;
pub mod raw;
pub mod raw_shm;
pub mod raw_tcp;
pub mod relay;
pub mod report;
pub mod roles;
pub mod secure;
pub use tiercel_seeds as seeds;
pub mod serve;
#[cfg(feature = "fault-injection")]
pub mod soak;
pub mod summary;
pub mod syscalls;
pub mod tables;
pub mod traced;
pub mod wide;
pub mod workers;
#[cfg(feature = "xdp")]
pub mod xdp;

/// Why a measurement could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A call of the measured system failed.
    #[error("{0}")]
    Rpc(#[from] tiercel::Error),
    /// A local socket, file or process error.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A helper process did not start or did not answer as it should.
    #[error("helper {what}: {why}")]
    Helper {
        /// Which helper.
        what: String,
        /// What went wrong.
        why: String,
    },
    /// JSON output could not be written or a helper's JSON read.
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// A measurement went wrong in a way described by the message (a lost packet in a raw
    /// ping-pong, a result that did not verify, a plot that could not be drawn, a bad option).
    #[error("{0}")]
    Measure(String),
}

macro_rules! from_tiercel {
    ($($t:ty),*) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Error {
                Error::Rpc(e.into())
            }
        }
    )*};
}

from_tiercel!(
    tiercel::CallError,
    tiercel::BindError,
    tiercel::ServerError,
    tiercel::AddressError,
    tiercel::SecretError
);

impl From<String> for Error {
    fn from(message: String) -> Error {
        Error::Measure(message)
    }
}

impl From<&str> for Error {
    fn from(message: &str) -> Error {
        Error::Measure(message.to_string())
    }
}

/// The result of a measurement.
pub type Result<T> = std::result::Result<T, Error>;

pub use tiercel_seeds::is_root;

/// Why the tables across two network namespaces cannot run on this machine, if they cannot: they
/// need root, `ip` (iproute2) and `nft` (nftables), which a fresh machine may lack.
pub fn namespaces_unavailable() -> Option<String> {
    use tiercel_seeds::needs::{Need, IP, NFT, ROOT};
    let missing: Vec<String> = [ROOT, IP, NFT].iter().filter(|n| !n.met()).map(Need::remedy).collect();
    (!missing.is_empty()).then(|| missing.join(", "))
}

/// Peak resident set size of this process (VmHWM), KiB.
pub fn peak_rss_kib() -> u64 {
    rss_kib("VmHWM:")
}

/// A `/proc/self/status` figure in KiB (`VmRSS:` resident now, `VmHWM:` its peak), 0 if unknown.
pub fn rss_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).map(|l| l.to_string()))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

/// Parses a comma-separated CPU list such as `0,1`.
/// Where `--trace` sends each call's span.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TraceTo {
    /// A line per span on stderr, when it closes.
    Stderr,
    /// Formatted as for stderr, then thrown away: what tracing costs, without the terminal's.
    Nowhere,
}

/// Installs a subscriber that formats tiercel's call spans (debug level) as they close, with their
/// fields (interface, procedure, transport, trace and span ids, outcome), to `to`.
pub fn trace(to: TraceTo) {
    use tracing_subscriber::fmt::format::FmtSpan;
    let builder = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_span_events(FmtSpan::CLOSE)
        .with_ansi(false)
        .with_target(false);
    let _ = match to {
        TraceTo::Stderr => builder.with_writer(std::io::stderr).try_init(),
        TraceTo::Nowhere => builder.with_writer(std::io::sink).try_init(),
    };
}

pub fn parse_cpus(s: &str) -> Result<Vec<usize>> {
    if s.is_empty() {
        return Ok(Vec::new());
    }
    s.split(',').map(|c| c.trim().parse::<usize>().map_err(|e| Error::Measure(format!("bad CPU {c:?}: {e}")))).collect()
}

/// The `--secret-file` option of the commands that serve or bind.
#[derive(clap::Args, Clone)]
pub struct SecretArgs {
    /// File holding a shared secret: at least 16 bytes, readable by its owner only (make one with
    /// `(umask 077; head -c 32 /dev/urandom > tiercel.secret)`). A server with one binds only clients
    /// that prove it; a client with one binds only to a server that proves it back.
    #[arg(long, value_name = "FILE")]
    pub secret_file: Option<std::path::PathBuf>,
    /// This side's private key (a file `tiercel keygen` wrote). `serve`: the server takes secure
    /// bindings, and refuses plain ones over UDP and TCP unless `--allow-plain`. A client: the key
    /// the server learns (without one, a client with `--server-key` makes one for the run).
    #[arg(long = "key", value_name = "FILE")]
    pub key_file: Option<std::path::PathBuf>,
    /// A client's only: the server's public key (64 hex digits, or a `.pub` file `tiercel keygen`
    /// wrote). The client then binds only to a server that proves it, and every packet of the
    /// binding is sealed.
    #[arg(long, value_name = "KEY|FILE")]
    pub server_key: Option<String>,
    /// `serve` only: with `--key`, grant plain bindings too.
    #[arg(long)]
    pub allow_plain: bool,
    /// `serve` only: an authority's endorsement of the server's key for its name (a file `tiercel
    /// endorse` wrote), carried in the name's registry entry. Repeat for several.
    #[arg(long = "endorsement", value_name = "FILE")]
    pub endorsements: Vec<std::path::PathBuf>,
    /// A client's only: an authority whose endorsements this client trusts (64 hex digits, or the
    /// `.pub` file `tiercel keygen --authority` wrote). Importing by name, the client then binds
    /// only with a key the entry carries and an authority given here endorsed for the name,
    /// whatever the registry. Repeat for several.
    #[arg(long = "authority", value_name = "KEY|FILE")]
    pub authorities: Vec<String>,
    /// A client's only: without `--server-key` or `--authority`, bind securely with the key the
    /// server tells the first time, and pin it once the server has proven it (in this user's
    /// known-servers file, `~/.config/tiercel/known_servers`); later, bind only to a server that
    /// proves the key pinned for its address or name.
    #[arg(long)]
    pub pin: bool,
    /// A client's only: `--pin`, with the keys pinned in FILE.
    #[arg(long, value_name = "FILE")]
    pub known_servers: Option<std::path::PathBuf>,
}

impl SecretArgs {
    /// The secret in the file, if one was named.
    pub fn load(&self) -> std::result::Result<Option<tiercel::Secret>, tiercel::SecretError> {
        self.secret_file.as_ref().map(tiercel::Secret::from_file).transpose()
    }

    /// The key pair in `--key`, if one was named.
    pub fn identity(&self) -> std::result::Result<Option<tiercel::Identity>, tiercel::KeyError> {
        self.key_file.as_ref().map(tiercel::Identity::from_file).transpose()
    }

    /// The server's public key given with `--server-key`: its hex, or a file holding it.
    pub fn server_key(&self) -> std::result::Result<Option<tiercel::PublicKey>, tiercel::KeyError> {
        let Some(given) = &self.server_key else { return Ok(None) };
        match given.parse() {
            Ok(key) => Ok(Some(key)),
            Err(_) => tiercel::PublicKey::from_file(given).map(Some),
        }
    }

    /// The endorsements in the `--endorsement` files.
    pub fn endorsements(&self) -> std::result::Result<Vec<tiercel::Endorsement>, tiercel::KeyError> {
        self.endorsements.iter().map(tiercel::Endorsement::from_file).collect()
    }

    /// The authorities given with `--authority`: each its hex, or a file holding it.
    pub fn authorities(&self) -> std::result::Result<Vec<tiercel::AuthorityKey>, tiercel::KeyError> {
        let one = |given: &String| given.parse().or_else(|_| tiercel::AuthorityKey::from_file(given));
        self.authorities.iter().map(one).collect()
    }

    /// A client's configuration with the secret and keys given.
    pub fn client_config(&self) -> std::result::Result<tiercel::ClientConfig, tiercel::Error> {
        if !self.endorsements.is_empty() {
            return Err(
                tiercel::KeyError("--endorsement is a server's option; a client trusts --authority".into()).into()
            );
        }
        Ok(tiercel::ClientConfig {
            secret: self.load()?,
            key: self.identity()?,
            server_key: self.server_key()?,
            authorities: self.authorities()?,
            known_servers: self.known_servers()?,
            ..tiercel::ClientConfig::default()
        })
    }

    /// The known-servers file of `--known-servers`, or this user's with `--pin`.
    pub fn known_servers(&self) -> std::result::Result<Option<tiercel::KnownServers>, tiercel::KeyError> {
        match (&self.known_servers, self.pin) {
            (Some(file), _) => Ok(Some(tiercel::KnownServers::new(file))),
            (None, true) => tiercel::KnownServers::user()
                .map(Some)
                .ok_or_else(|| tiercel::KeyError("--pin: neither XDG_CONFIG_HOME nor HOME is set".into())),
            (None, false) => Ok(None),
        }
    }
}

/// The `--registry` option of the commands that export or import by name.
#[derive(clap::Args, Clone)]
pub struct RegistryArgs {
    /// Where names are registered and looked up: `local` (this user's registry on this host, the
    /// default unless `TIERCEL_REGISTRY` says otherwise) or `dir:/absolute/path[?trust=UID,…]` (a
    /// directory shared by the servers and clients that use it; entries of users other than this
    /// one, root and those listed are not trusted), or, in a build with the `etcd` feature,
    /// `etcd://HOST:PORT[?ttl=SECONDS][&user=NAME&password-file=PATH]`.
    #[arg(long, value_name = "REGISTRY")]
    pub registry: Option<String>,
}

impl RegistryArgs {
    /// The registry named, else the default one.
    pub fn load(&self) -> std::result::Result<tiercel::names::Registry, tiercel::names::NameError> {
        match &self.registry {
            Some(r) => tiercel::names::Registry::parse(r),
            None => tiercel::names::Registry::from_env(),
        }
    }
}
