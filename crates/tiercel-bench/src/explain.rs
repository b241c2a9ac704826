//! `tiercel explain`: the accounting of Null, BigIn and MaxResult on each transport, spinning and
//! blocking (`crate::accounting`), and Firefly §4.2-style estimates of what a call would cost with a
//! step changed, beside the same change measured where it is a setting.

use tiercel::steps::{self, Point};

use crate::accounting::{accounts, measure, name, tiercel_pair, time_us, Estimate, Procedure, Report, Variant};
use crate::harness::{Medium, HEADER};
use crate::progress::outln;

/// Options of `tiercel explain`.
#[derive(clap::Args)]
pub struct Args {
    /// Timed calls per measurement (each call is measured with timestamps off, then on).
    #[arg(long, default_value_t = 20_000)]
    calls: u32,
    /// CPU of the calling thread.
    #[arg(long, default_value_t = 0)]
    client_cpu: usize,
    /// CPU of the server's thread and of the raw echo servers.
    #[arg(long, default_value_t = 1)]
    server_cpu: usize,
    /// The accounting only over this transport: `udp` or `shm` (default both).
    #[arg(long)]
    transport: Option<String>,
    /// Also write the accounting as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<std::path::PathBuf>,
    /// Also draw the accounting as stacked bars in DIR/breakdown.svg.
    #[arg(long, value_name = "DIR")]
    plot: Option<std::path::PathBuf>,
}

/// Runs `tiercel explain`.
pub fn run(args: Args) -> crate::Result<()> {
    if !steps::enable(false) {
        return Err("this tiercel was built without the `explain` feature".into());
    }
    tiercel_sys::cpu::pin_current_thread(args.client_cpu).map_err(crate::Error::from)?;
    let media: Vec<Medium> = match args.transport.as_deref() {
        None => vec![Medium::Udp, Medium::Shm],
        Some("udp") => vec![Medium::Udp],
        Some("shm") => vec![Medium::Shm],
        Some(t) => return Err(format!("unknown transport {t:?} (udp, shm)").into()),
    };
    let calls = args.calls.max(100);
    outln!(
        "tiercel explain: tick counter at {:.3} GHz; caller pinned to CPU {}, server thread (in this process) and raw \
         echo servers (processes) pinned to CPU {}",
        tiercel_sys::clock::ticks_per_second() / 1e9,
        args.client_cpu,
        args.server_cpu
    );
    let mut report = Report { client_cpu: args.client_cpu, server_cpu: args.server_cpu, ..Report::default() };
    // A step per medium and waiting, one for the secure binding, and the estimates.
    crate::progress::start(3 * media.len() as u64 + u64::from(media.contains(&Medium::Udp)));
    let (accounts, base) = accounts(&media, &[true, false], true, calls, args.client_cpu, args.server_cpu)?;
    report.accounts = accounts;
    outln!("\nWhat a call would cost with a step changed (Firefly §4.2), mean µs; estimates from the steps and");
    outln!("raw baselines above and from timing the added work alone; measured where the change is a setting");
    let mean = |medium: Medium, spin: bool, p: &str| {
        report
            .accounts
            .iter()
            .find(|a| {
                a.transport == name(medium) && a.waiting == if spin { "spin" } else { "block" } && a.procedure == p
            })
            .map(|a| a.off_mean_us)
    };
    let mut estimates = Vec::new();
    for &medium in &media {
        let raw_of = |spin: bool| base.iter().find(|(m, s, _)| *m == medium && *s == spin).map(|(_, _, r)| r);
        let (Some(raw_spin), Some(raw_block)) = (raw_of(true), raw_of(false)) else { continue };
        crate::progress::doing(&format!("estimates {}", name(medium)));
        let checksummed = if medium == Medium::Udp {
            let (_server, client) = tiercel_pair(medium, true, Variant::Checksum, args.server_cpu)?;
            Some(
                Procedure::ALL
                    .into_iter()
                    .map(|p| measure(&client, p, calls, false))
                    .collect::<crate::Result<Vec<_>>>()?,
            )
        } else {
            None
        };
        for (i, p) in Procedure::ALL.into_iter().enumerate() {
            let (Some(spinning), Some(blocking)) = (mean(medium, true, p.name()), mean(medium, false, p.name())) else {
                continue;
            };
            let wake = raw_block[i].round_trip.mean_us() - raw_spin[i].round_trip.mean_us();
            let what = if medium == Medium::Udp { "UDP: block in the kernel" } else { "shm: sleep on futexes" };
            estimates.push(Estimate {
                change: format!("{what} instead of spinning (raw blocking − raw spinning round trip)"),
                procedure: p.name(),
                base_us: spinning,
                estimate_us: spinning + wake,
                measured_us: Some(blocking),
            });
            let (call, result) = p.sizes();
            let header = if medium == Medium::Udp { HEADER } else { 0 };
            let (call, result) = (header + call, header + result);
            let src = vec![0x5au8; call.max(result)];
            let mut dst = vec![0u8; call.max(result)];
            let copy = time_us(|| {
                dst[..call].copy_from_slice(std::hint::black_box(&src[..call]));
                dst[..result].copy_from_slice(std::hint::black_box(&src[..result]));
                std::hint::black_box(&dst);
            });
            estimates.push(Estimate {
                change: format!("{}: one copy more of the call and of the result", name(medium)),
                procedure: p.name(),
                base_us: spinning,
                estimate_us: spinning + copy,
                measured_us: None,
            });
            if let Some(measured) = &checksummed {
                // Each packet is summed by its sender and checked by its receiver.
                let sum = time_us(|| {
                    std::hint::black_box(tiercel_proto::wire::checksum([std::hint::black_box(&src[..call])]));
                    std::hint::black_box(tiercel_proto::wire::checksum([std::hint::black_box(&src[..result])]));
                });
                estimates.push(Estimate {
                    change: "udp: CRC32C checksum on every packet, computed and checked".into(),
                    procedure: p.name(),
                    base_us: spinning,
                    estimate_us: spinning + 2.0 * sum,
                    measured_us: Some(measured[i].off_mean_us),
                });
            }
            if medium == Medium::Shm {
                let staged = report
                    .accounts
                    .iter()
                    .find(|a| a.transport == "shm" && a.waiting == "spin" && a.procedure == p.name())
                    .and_then(|a| a.lines.iter().find(|l| l.step.starts_with(Point::ResultCopied.describe())))
                    .map_or(0.0, |l| l.mean_us);
                estimates.push(Estimate {
                    change: "shm: without the client's staging copy of the result out of the slot".into(),
                    procedure: p.name(),
                    base_us: spinning,
                    estimate_us: spinning - staged,
                    measured_us: None,
                });
            }
        }
        crate::progress::step();
    }
    crate::progress::finish();
    outln!("{:<86} {:<10} {:>8} {:>9} {:>9}", "change", "procedure", "as is", "estimate", "measured");
    for e in &estimates {
        let measured = e.measured_us.map_or("—".to_string(), |m| format!("{m:.3}"));
        outln!("{:<86} {:<10} {:>8.3} {:>9.3} {:>9}", e.change, e.procedure, e.base_us, e.estimate_us, measured);
    }
    report.estimates = estimates;
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report).map_err(crate::Error::from)?;
        std::fs::write(path, json).map_err(|e| format!("{}: {e}", path.display()))?;
        outln!("\nwrote {}", path.display());
    }
    if let Some(dir) = &args.plot {
        let path = crate::plot::breakdown(dir, &report.accounts)?;
        outln!("wrote {}", path.display());
    }
    Ok(())
}
