//! `tiercel check`: many calls of every procedure, every result verified.

use std::time::Instant;

use tiercel::seeds::{self, TestClient};
use tiercel::Client;

/// Options of `tiercel check`.
#[derive(clap::Args)]
pub struct Args {
    /// Server address, as printed by `tiercel serve`.
    addr: String,
    /// Rounds per thread; each round calls all seven procedures once.
    #[arg(long, default_value_t = 1000)]
    rounds: u32,
    /// Caller threads sharing one binding.
    #[arg(long, default_value_t = 1)]
    threads: u32,
}

pub fn run(args: Args) -> crate::Result<()> {
    let client: TestClient = Client::connect(args.addr.as_str()).and_then(|c| c.import()).map_err(|e| e.to_string())?;
    let start = Instant::now();
    let threads: Vec<_> = (0..args.threads.max(1))
        .map(|t| {
            let c = client.clone();
            let rounds = args.rounds;
            std::thread::spawn(move || -> crate::Result<()> {
                for round in 0..rounds {
                    seeds::check_all(&c, round.wrapping_mul(t + 1))
                        .map_err(|e| format!("thread {t} round {round}: {e}"))?;
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| "a caller thread panicked".to_string())??;
    }
    let calls = args.rounds as u64 * args.threads.max(1) as u64 * 7;
    let stats = client.binding().stats();
    println!(
        "ok: {calls} calls of 7 procedures verified in {:.2} s ({} retransmissions, {} stale packets)",
        start.elapsed().as_secs_f64(),
        stats.retransmissions.load(std::sync::atomic::Ordering::Relaxed),
        stats.stale.load(std::sync::atomic::Ordering::Relaxed),
    );
    Ok(())
}
