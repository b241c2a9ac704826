//! Loss recovery: 1 MiB calls across two network namespaces joined by a veth pair (1500-byte MTU),
//! with nftables dropping 0%, 1% and 10% of the UDP packets each way at random, each loss rate
//! against the clean one in the same run. Needs root (it creates the namespaces); skipped otherwise.

use std::time::{Duration, Instant};

use tiercel::{In, InOut};

use crate::progress::outln;
use crate::seeds::{fill, TestClient};

/// The port of the server inside its namespace.
const PORT: u16 = 7576;
/// Bytes of each call's buffer.
pub const BYTES: usize = 1 << 20;
/// Loss rates measured, percent of packets dropped each way.
pub const LOSS: [f64; 3] = [0.0, 1.0, 10.0];

/// One row: a procedure at a loss rate.
#[derive(serde::Serialize, Clone, Debug)]
pub struct Row {
    /// Percent of packets nftables dropped each way.
    pub loss_percent: f64,
    /// `In` (1 MiB to the server) or `InOut` (1 MiB each way).
    pub procedure: &'static str,
    /// Calls timed.
    pub calls: usize,
    /// Median and 99th percentile of a call, ms.
    pub median_ms: f64,
    pub p99_ms: f64,
    /// The median against the same procedure's median without loss.
    pub ratio: f64,
}

/// Options of the `loss-remote` helper role.
#[derive(clap::Args)]
pub struct RemoteArgs {
    /// The server, `host:port`.
    addr: String,
    /// Calls per procedure.
    #[arg(long)]
    calls: usize,
}

/// Times `calls` 1 MiB In and InOut calls (alternating) from inside the client's namespace and
/// prints the times in ms as JSON: `[[In...], [InOut...]]`.
pub fn remote(args: RemoteArgs) -> crate::Result<()> {
    let _ = tiercel_sys::cpu::pin_current_thread(0);
    let client: TestClient = crate::harness::import(format!("udp://{}", args.addr), tiercel::ClientConfig::default())?;
    let mut data = vec![0u8; BYTES];
    fill(&mut data);
    let mut both = data.clone();
    // Warm up: the binding, the path, the buffers on both sides.
    for _ in 0..2 {
        client.bulk_in(In(&data)).map_err(crate::Error::from)?;
        client.bulk_in_out(InOut(&mut both)).map_err(crate::Error::from)?;
    }
    let (mut ins, mut in_outs) = (Vec::with_capacity(args.calls), Vec::with_capacity(args.calls));
    for _ in 0..args.calls {
        let t = Instant::now();
        client.bulk_in(In(&data)).map_err(crate::Error::from)?;
        ins.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        client.bulk_in_out(InOut(&mut both)).map_err(crate::Error::from)?;
        in_outs.push(t.elapsed().as_secs_f64() * 1e3);
    }
    println!("{}", serde_json::to_string(&[ins, in_outs]).map_err(crate::Error::from)?);
    Ok(())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// Measures and prints the loss table: `calls` calls of each procedure per loss rate, the server
/// pinned to `server_cpu`. Stops early (with the rows so far) after `budget`.
pub fn table(server_cpu: usize, calls: usize, budget: Duration) -> crate::Result<Vec<Row>> {
    outln!(
        "\nLoss recovery: {calls} calls of 1 MiB In and 1 MiB InOut per row, UDP across two network namespaces \
         (veth,\n1500-byte MTU), nftables dropping the given share of packets each way at random; tiercel's \
         default settings"
    );
    if let Some(why) = crate::namespaces_unavailable() {
        outln!("(skipped: {why})");
        return Ok(Vec::new());
    }
    outln!(
        "{:<13} {:<8} {:>6} | {:>10} {:>10} | {:>9}",
        "loss each way",
        "call",
        "calls",
        "median ms",
        "p99 ms",
        "× clean"
    );
    let start = Instant::now();
    let mut rows: Vec<Row> = Vec::new();
    for loss in LOSS {
        if start.elapsed() > budget {
            outln!("(stopped: the time budget of {budget:?} is spent)");
            break;
        }
        let out = crate::harness::across_namespaces(PORT, loss, server_cpu, "loss-remote", |_, addr| {
            vec![addr.to_string(), "--calls".into(), calls.to_string()]
        })?;
        let times: [Vec<f64>; 2] = serde_json::from_slice(&out)?;
        for (procedure, mut t) in ["In", "InOut"].into_iter().zip(times) {
            t.sort_by(f64::total_cmp);
            let (median, p99) = (percentile(&t, 0.5), percentile(&t, 0.99));
            let clean = rows.iter().find(|r| r.loss_percent == 0.0 && r.procedure == procedure);
            let ratio = clean.map_or(1.0, |c| median / c.median_ms);
            outln!(
                "{:<13} {:<8} {:>6} | {:>10.2} {:>10.2} | {:>8.2}×",
                format!("{loss}%"),
                procedure,
                t.len(),
                median,
                p99,
                ratio
            );
            rows.push(Row { loss_percent: loss, procedure, calls: t.len(), median_ms: median, p99_ms: p99, ratio });
        }
    }
    Ok(rows)
}
