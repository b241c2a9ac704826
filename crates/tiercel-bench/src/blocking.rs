//! Calls whose procedure blocks: it sleeps 1 ms, standing for one that waits on a disk or on another
//! service. Calls per second of 1, 2, 4 and 8 caller threads on one binding of a server with the
//! default settings, over each transport, against 1 caller's rate times the callers: the share of
//! the calls that ran at once. A server that ran one binding's calls one at a time would stay at 1
//! caller's rate whatever the callers.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::harness::Medium;
use crate::progress::outln;

/// What each call's procedure does.
#[tiercel::interface]
pub trait Pause {
    /// Sleeps `micros` microseconds (at most a second).
    fn pause(&self, micros: u32);
}

/// Sleeps as asked.
struct Sleeper;

impl Pause for Sleeper {
    fn pause(&self, micros: u32) {
        std::thread::sleep(Duration::from_micros(micros.min(1_000_000) as u64));
    }
}

/// How long each call's procedure sleeps, µs.
pub const PAUSE_US: u32 = 1000;
/// Caller threads per row.
pub const CALLERS: [u32; 4] = [1, 2, 4, 8];

/// A row, for `--json`.
#[derive(serde::Serialize)]
pub struct Row {
    pub transport: &'static str,
    pub callers: u32,
    pub calls_per_second: f64,
    /// `calls_per_second` over 1 caller's rate times the callers.
    pub scaling: f64,
}

/// Measures every transport of `media`, each caller count for `time` after `time` of warm-up (the
/// server's threads for a binding are added while its calls wait).
pub fn table(media: &[Medium], client_cpu: usize, time: Duration) -> crate::Result<Vec<Row>> {
    // Started from a thread that may run on every CPU, so that the server's threads may too: the
    // bench's own thread is pinned to the callers' CPU, and threads inherit their starter's
    // affinity (with every thread on one CPU, 8 callers' calls ran 2.2 to 2.6 at once, not 6 to 8).
    let server = std::thread::scope(|s| {
        s.spawn(|| -> crate::Result<tiercel::RunningServer> {
            tiercel_sys::cpu::unpin_current_thread()?;
            Ok(tiercel::Server::bind("udp://127.0.0.1:0")?.export(PauseServer::new(Sleeper)).start()?)
        })
        .join()
        .map_err(|_| crate::Error::from("the blocking table's server thread panicked"))?
    })?;
    let mut rows = Vec::new();
    for &medium in media {
        let client: PauseClient =
            tiercel::Client::connect(format!("{}{}", medium.scheme(), server.addr()))?.import()?;
        let mut one = f64::NAN;
        for callers in CALLERS {
            let rate = crate::asynch::callers_of(
                &client,
                callers,
                client_cpu,
                |c| c.pause(PAUSE_US),
                |done| {
                    std::thread::sleep(time);
                    let (start, before) = (Instant::now(), done.load(Ordering::Relaxed));
                    std::thread::sleep(time);
                    (done.load(Ordering::Relaxed) - before) as f64 / start.elapsed().as_secs_f64()
                },
            )?;
            if callers == 1 {
                one = rate;
            }
            rows.push(Row {
                transport: medium.name(),
                callers,
                calls_per_second: rate,
                scaling: rate / (one * callers as f64),
            });
        }
    }
    Ok(rows)
}

/// Prints the table.
pub fn print(rows: &[Row], time: Duration) {
    outln!(
        "\nBlocking procedures: calls whose procedure sleeps {} ms, by 1, 2, 4 and 8 caller threads on one binding of a \
         server with the default settings",
        PAUSE_US / 1000
    );
    outln!(
        "(in this process, not pinned; callers on the caller's CPU; {:.1} s each after as long a warm-up), against 1 \
         caller's rate times the callers",
        time.as_secs_f64()
    );
    outln!("{:>9} {:>8} | {:>9} | {:>8}", "transport", "callers", "calls/s", "scaling");
    for r in rows {
        outln!("{:>9} {:>8} | {:>9.0} | {:>7.2}×", r.transport, r.callers, r.calls_per_second, r.scaling);
    }
}
