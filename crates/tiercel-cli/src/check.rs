//! `tiercel check`: many calls of every procedure, every result verified.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tiercel::{CallError, Client, ClientConfig, Error};
use tiercel_bench::seeds::{self, CheckFailure, TestClient};

/// Options of `tiercel check`.
#[derive(clap::Args)]
pub struct Args {
    /// Server address, as printed by `tiercel serve` (`udp://` forces UDP, `shm:` shared memory; a
    /// plain `host:port` takes shared memory when the server is on this host), or the name it
    /// exports Test under (`tiercel serve --name`).
    addr: String,
    /// Rounds per thread; each round calls all seven procedures once.
    #[arg(long, default_value_t = 1000)]
    rounds: u32,
    /// Caller threads sharing one binding.
    #[arg(long, default_value_t = 1)]
    threads: u32,
    /// When the server restarts or goes away, import again (for up to 30 s) and go on, instead of
    /// failing. Calls caught by the restart are reported and not counted.
    #[arg(long)]
    reimport: bool,
    #[command(flatten)]
    secret: tiercel_bench::SecretArgs,
    #[command(flatten)]
    registry: tiercel_bench::RegistryArgs,
}

/// Imports the Test interface from `addr` (an address, or a name looked up in `registry`),
/// with `config` (its secret and keys).
pub(crate) fn import(
    addr: &str,
    config: ClientConfig,
    registry: &tiercel_bench::RegistryArgs,
) -> Result<TestClient, Error> {
    let registry = registry.load().map_err(tiercel::BindError::from)?;
    Ok(Client::connect(addr)?.with_config(config).with_registry(registry).import()?)
}

/// Whether an error means the binding is gone (the server restarted, or is down for now).
fn binding_lost(e: &CallError) -> bool {
    matches!(
        e,
        CallError::ServerRestarted
            | CallError::UnknownBinding
            | CallError::Unreachable { .. }
            | CallError::ServerGone { .. }
            | CallError::ConnectionLost { .. }
    )
}

pub fn run(args: Args) -> crate::Result<()> {
    let secret = args.secret.client_config()?;
    let client = import(&args.addr, secret.clone(), &args.registry)?;
    let transport = match client.binding().transport() {
        tiercel::Transport::Udp => "UDP",
        tiercel::Transport::SharedMemory => "shared memory",
        tiercel::Transport::Tcp => "TCP",
        tiercel::Transport::Xdp => "UDP over AF_XDP",
    };
    println!("bound to {} through {transport}", args.addr);
    if let Some(why) = client.binding().xdp_refused() {
        println!("no AF_XDP: {why}");
    }
    let start = Instant::now();
    let reimports = Arc::new(AtomicU64::new(0));
    let retransmissions = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..args.threads.max(1))
        .map(|t| {
            let mut c = client.clone();
            let (rounds, reimport, addr, secret) = (args.rounds, args.reimport, args.addr.clone(), secret.clone());
            let registry = args.registry.clone();
            let (reimports, retransmissions) = (reimports.clone(), retransmissions.clone());
            std::thread::spawn(move || -> crate::Result<()> {
                let mut round = 0;
                while round < rounds {
                    match seeds::check_all(&c, round.wrapping_mul(t + 1)) {
                        Ok(()) => round += 1,
                        Err(CheckFailure::Call(p, e)) if reimport && binding_lost(&e) => {
                            eprintln!("thread {t} round {round}: {p}: {e}; importing again");
                            let give_up = Instant::now() + Duration::from_secs(30);
                            let fresh = loop {
                                match import(&addr, secret.clone(), &registry) {
                                    Ok(fresh) => break fresh,
                                    Err(_) if Instant::now() < give_up => std::thread::sleep(Duration::from_millis(50)),
                                    Err(e) => {
                                        return Err(crate::Error::Check(format!("thread {t}: import again: {e}")))
                                    }
                                }
                            };
                            let old = c.binding().stats().retransmissions;
                            retransmissions.fetch_add(old, Ordering::Relaxed);
                            c = fresh;
                            reimports.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(f) => return Err(crate::Error::Check(format!("thread {t} round {round}: {f}"))),
                    }
                }
                retransmissions.fetch_add(c.binding().stats().retransmissions, Ordering::Relaxed);
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| crate::Error::Check("a caller thread panicked".into()))??;
    }
    let calls = args.rounds as u64 * args.threads.max(1) as u64 * seeds::CHECK_CALLS;
    println!(
        "ok: {calls} calls of {} procedures verified in {:.2} s ({} retransmissions, {} imports again)",
        seeds::CHECK_CALLS,
        start.elapsed().as_secs_f64(),
        retransmissions.load(Ordering::Relaxed),
        reimports.load(Ordering::Relaxed),
    );
    Ok(())
}
