//! What a test needs of the machine beyond Rust (root, a command from a Debian package), and what
//! happens where it is missing.
//!
//! A test starts with [`needs!`](crate::needs!), naming what it needs. Where all of it is there, the
//! test runs. Where something is missing:
//! - under `./test` (which sets [`SKIPPED_ENV`] to a file), the test's name and what it lacks are
//!   written to that file and the test returns: `./test` lists every such test when the suite ends,
//!   and fails unless told to accept them;
//! - otherwise (a bare `cargo test`) the test fails, saying what to install or how to run it, so that
//!   nothing is skipped without anyone being told.

use std::io::Write as _;

/// The environment variable naming the file where skipped tests are listed.
pub const SKIPPED_ENV: &str = "TIERCEL_SKIPPED";

/// Something a test needs of the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Root: network namespaces, nftables, processes of another user, `perf` counting system calls.
    Root,
    /// A command on the `PATH`, and the Debian package that has it.
    Command {
        /// The command.
        name: &'static str,
        /// The Debian package to install for it.
        package: &'static str,
    },
    /// A file (a C header), and the Debian package that has it.
    File {
        /// The file's path.
        path: &'static str,
        /// The Debian package to install for it.
        package: &'static str,
    },
}

/// Root.
pub const ROOT: Need = Need::Root;
/// `ip`, for network namespaces and veth pairs.
pub const IP: Need = Need::Command { name: "ip", package: "iproute2" };
/// `nft`, to drop packets inside a namespace.
pub const NFT: Need = Need::Command { name: "nft", package: "nftables" };
/// A real etcd server.
pub const ETCD: Need = Need::Command { name: "etcd", package: "etcd-server" };
/// `perf`, to count system calls.
pub const PERF: Need = Need::Command { name: "perf", package: "linux-perf" };
/// `rpcgen`, to make C stubs of an ONC interface.
pub const RPCGEN: Need = Need::Command { name: "rpcgen", package: "rpcsvc-proto" };
/// libtirpc's headers and library, to build C ONC clients and servers.
pub const TIRPC: Need = Need::File { path: "/usr/include/tirpc/rpc/rpc.h", package: "libtirpc-dev" };
/// A C compiler.
pub const CC: Need = Need::Command { name: "cc", package: "gcc" };
/// clang, which builds tiercel's XDP program (tiercel-sys's build script, feature `xdp`).
pub const CLANG: Need = Need::Command { name: "clang", package: "clang" };
/// libbpf's headers, which tiercel's XDP program includes.
pub const LIBBPF: Need = Need::File { path: "/usr/include/bpf/bpf_helpers.h", package: "libbpf-dev" };
/// `rpcbind` and `rpcinfo`.
pub const RPCBIND: Need = Need::Command { name: "rpcbind", package: "rpcbind" };

impl Need {
    /// Whether this machine has it.
    pub fn met(&self) -> bool {
        match self {
            Need::Root => crate::is_root(),
            Need::Command { name, .. } => on_path(name),
            Need::File { path, .. } => std::path::Path::new(path).is_file(),
        }
    }

    /// What to do to meet it.
    pub fn remedy(&self) -> String {
        match self {
            Need::Root => "needs root".to_owned(),
            Need::Command { name, package } => format!("needs `{name}` (apt-get install {package})"),
            Need::File { path, package } => format!("needs {path} (apt-get install {package})"),
        }
    }
}

/// Whether `command` is an executable file in a directory of `PATH`.
fn on_path(command: &str) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|dir| {
        std::fs::metadata(dir.join(command)).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// The running test's name (`binary::module::test`): libtest names each test's thread after it.
fn test_name() -> String {
    let binary = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|s| s.rsplit_once('-').map_or(s.clone(), |(name, _hash)| name.to_owned()))
        .unwrap_or_default();
    let thread = std::thread::current();
    format!("{binary}::{}", thread.name().unwrap_or("?"))
}

/// Whether the machine has everything in `needs`. Where it has not: under `./test`, the test is
/// listed as skipped and this returns `false`; otherwise it panics, saying what is missing.
pub fn met(needs: &[Need]) -> bool {
    let missing: Vec<String> = needs.iter().filter(|n| !n.met()).map(Need::remedy).collect();
    if missing.is_empty() {
        return true;
    }
    let why = missing.join(", ");
    let Some(file) = std::env::var_os(SKIPPED_ENV) else {
        panic!("this test {why}: run `./test` (as root it installs what the tests need; otherwise it lists what it skipped)");
    };
    let line = format!("{}\t{why}\n", test_name());
    // One write of one short line to a file opened for appending: lines of tests running at once
    // do not interleave.
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&file)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        panic!("this test {why}, and it cannot be listed as skipped in {}: {e}", file.to_string_lossy());
    }
    false
}

/// Returns from the test unless the machine has everything named, each a constant of
/// [`needs`](mod@crate::needs) (see [`met`]): `tiercel_seeds::needs!(ETCD)`,
/// `tiercel_seeds::needs!(ROOT, IP, NFT)`.
#[macro_export]
macro_rules! needs {
    ($($need:ident),+ $(,)?) => {
        if !$crate::needs::met(&[$($crate::needs::$need),+]) {
            return;
        }
    };
}
