//! What every measurement shares: the media measured and their raw baselines, helper processes
//! started as this program, and a pinned Test server.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use crate::raw::PingPong;
use crate::raw_shm::ShmPingPong;
use crate::raw_tcp::TcpPingPong;

/// Header bytes of every tiercel packet.
pub const HEADER: usize = 56;

/// A transport and the raw mechanism beneath it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Medium {
    /// UDP over loopback.
    Udp,
    /// Shared memory.
    Shm,
    /// TCP over loopback.
    Tcp,
}

impl Medium {
    /// Its short name, as `--transports` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Medium::Udp => "udp",
            Medium::Shm => "shm",
            Medium::Tcp => "tcp",
        }
    }

    /// The address prefix that forces it.
    pub fn scheme(self) -> &'static str {
        match self {
            Medium::Udp => "udp://",
            Medium::Shm => "shm:",
            Medium::Tcp => "tcp://",
        }
    }

    /// Bytes each message of a call carries besides the data over it (header, frame length).
    pub const fn overhead(self) -> usize {
        match self {
            Medium::Udp => HEADER,
            Medium::Shm => 0,
            Medium::Tcp => HEADER + 4,
        }
    }
}

/// The raw baseline of a medium.
pub enum Baseline {
    /// A raw UDP ping-pong.
    Udp(PingPong),
    /// A raw shared-memory ping-pong.
    Shm(ShmPingPong),
    /// A raw TCP ping-pong.
    Tcp(TcpPingPong),
}

impl Baseline {
    /// One round trip; false if it was lost.
    pub fn round_trip(&mut self) -> crate::Result<bool> {
        match self {
            Baseline::Udp(p) => p.round_trip(),
            Baseline::Shm(p) => p.round_trip(),
            Baseline::Tcp(p) => p.round_trip(),
        }
    }

    /// Where the round trips' steps are summed, if they are.
    pub fn stamps_mut(&mut self) -> &mut Option<crate::raw::Stamps> {
        match self {
            Baseline::Udp(p) => &mut p.stamps,
            Baseline::Shm(p) => &mut p.stamps,
            Baseline::Tcp(p) => &mut p.stamps,
        }
    }
}

/// Imports `T` from the server at `addr` with `config`.
pub fn import<T: tiercel::Import>(addr: impl tiercel::ToAddress, config: tiercel::ClientConfig) -> crate::Result<T> {
    Ok(tiercel::Client::connect(addr)?.with_config(config).import()?)
}

/// A child process killed when dropped; its stdout stays open so that it can go on printing.
pub struct Spawned(pub std::process::Child, #[allow(dead_code)] BufReader<std::process::ChildStdout>);

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts this program as a helper (`args`: its role and options) and reads the address (or name)
/// it listens on.
pub fn spawn(args: &[String]) -> crate::Result<(Spawned, String)> {
    start(crate::helpers::command()?.args(args))
}

/// Starts this program as a helper inside network namespace `ns`, and reads its address.
pub fn spawn_in_namespace(ns: &str, args: &[String]) -> crate::Result<(Spawned, String)> {
    start(crate::helpers::command_in_namespace(ns)?.args(args))
}

/// Starts `command` and reads the first line it prints, `listening ADDRESS`.
pub fn start(command: &mut Command) -> crate::Result<(Spawned, String)> {
    let what = format!("{:?}", command.get_args().collect::<Vec<_>>());
    let helper = |why: String| crate::Error::Helper { what: what.clone(), why };
    let mut child =
        command.stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().map_err(|e| helper(e.to_string()))?;
    let stdout = child.stdout.take().ok_or_else(|| helper("no stdout".into()))?;
    let mut reader = BufReader::new(stdout);
    let mut line = String::new();
    let read = reader.read_line(&mut line);
    let child = Spawned(child, reader);
    read?;
    let addr = line
        .trim()
        .strip_prefix("listening ")
        .map(str::to_string)
        .ok_or_else(|| helper(format!("printed {line:?} instead of its address")))?;
    Ok((child, addr))
}

/// Starts a `tiercel serve` with its default workers on `cpu`, spinning 2 ms past each call (`spin`)
/// or blocking at once, and returns it with its `host:port`.
pub fn serve_pinned(cpu: usize, spin: bool) -> crate::Result<(Spawned, String)> {
    serve_pinned_with(cpu, spin, &[])
}

/// [`serve_pinned`] with more `tiercel serve` options.
pub fn serve_pinned_with(cpu: usize, spin: bool, more: &[&str]) -> crate::Result<(Spawned, String)> {
    // Spinning servers spin 2 ms past their last call, then block: the raw and tiercel servers share
    // the server CPU, and each must leave it to the other while the other is being measured.
    let spin_us = if spin { "2000" } else { "0" };
    let cpu = cpu.to_string();
    let args: Vec<String> =
        ["serve", "--addr", "udp://127.0.0.1:0", "--spin-us", spin_us, "--spin-fixed", "--cpus", &cpu]
            .iter()
            .chain(more)
            .map(|s| s.to_string())
            .collect();
    let (server, addr) = spawn(&args)?;
    let addr = addr.strip_prefix("udp://").unwrap_or(&addr).to_string();
    Ok((server, addr))
}

/// Starts a `tiercel serve` pinned to `server_cpu` in the server namespace of a new pair of network
/// namespaces (nftables dropping `loss_percent` of the server's UDP packets each way), then the
/// helper role `role` in the client namespace with `args(server's pid, server's host:port)`, and
/// returns what the helper printed. Both processes and the namespaces are gone when it returns.
pub fn across_namespaces(
    port: u16,
    loss_percent: f64,
    server_cpu: usize,
    role: &str,
    args: impl FnOnce(u32, &str) -> Vec<String>,
) -> crate::Result<Vec<u8>> {
    let pair = crate::netns::Pair::new(port, loss_percent)?;
    let addr = format!("{}:{port}", crate::netns::SERVER_IP);
    let cpu = server_cpu.to_string();
    let serve: Vec<String> =
        ["serve", "--addr", &format!("udp://{addr}"), "--cpus", &cpu].iter().map(|s| s.to_string()).collect();
    let (server, _) = spawn_in_namespace(&pair.b, &serve)?;
    let out = crate::helpers::command_in_namespace(&pair.a)?.arg(role).args(args(server.0.id(), &addr)).output()?;
    drop(server);
    drop(pair);
    if !out.status.success() {
        return Err(crate::Error::Helper {
            what: role.to_string(),
            why: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(out.stdout)
}

/// The socket address of an echo helper's `udp://` or `tcp://` address.
pub(crate) fn udp_addr(addr: &str) -> crate::Result<std::net::SocketAddr> {
    addr.strip_prefix("udp://")
        .or_else(|| addr.strip_prefix("tcp://"))
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| crate::Error::from(format!("echo address {addr:?}")))
}

/// Starts a `raw-echo --spin` helper pinned to `cpu` on loopback; the helper and its address.
pub(crate) fn spinning_echo(cpu: usize) -> crate::Result<(Spawned, std::net::SocketAddr)> {
    let cpu = cpu.to_string();
    let args: Vec<String> = ["raw-echo", "--cpu", &cpu, "--spin"].iter().map(|s| s.to_string()).collect();
    let (echo, addr) = spawn(&args)?;
    Ok((echo, udp_addr(&addr)?))
}
