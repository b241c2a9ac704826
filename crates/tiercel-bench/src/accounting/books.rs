//! A call's time set out as steps that add up to the whole: each step measured on the running
//! system; the wire and the kernel from the raw ping-pong of the same run over UDP, and through
//! shared memory the two ways between client and server as measured across the two CPUs (the raw
//! ping-pong's one way beside them); and the difference from the measured call printed with where
//! it lies.

use super::*;

/// Builds the accounting of one procedure from its measured steps and its raw baseline. Without a
/// spin budget a side sleeps only when the other has not answered yet: each way, the share of calls
/// in which the receiving side slept is charged the blocking baseline's one-way time (a wake-up),
/// the rest the spinning baseline's (`spinning`, the raw ping-pong of the same sizes with both sides
/// spinning). With `sealed`, the calls were made on a secure UDP binding: their sealing and opening
/// are steps of their own, and the raw baseline is the plain datagrams' (32 bytes shorter each).
/// Through shared memory, where the server runs in the caller's process and both sides' marks were
/// recorded, each way is the mean time from one side's mark to the other's (the client's publish to
/// the server's mark that the call arrived; the server's mark that the result is ready to the
/// client's that it arrived), so the lines partition each call's time: the server's publish lies
/// inside the way back, and the raw ping-pong's one way is printed beside each way.
#[allow(clippy::too_many_arguments)]
pub fn account(
    medium: Medium,
    spin: bool,
    sealed: bool,
    p: Procedure,
    m: &Measured,
    raw: &Raw,
    spinning: &Raw,
) -> Account {
    let (client, server_points) = match (medium, sealed) {
        (Medium::Udp, true) => (CLIENT_SEALED, SERVER_SEALED),
        (Medium::Udp, false) => (CLIENT_UDP, SERVER),
        _ => (CLIENT_SHM, SERVER),
    };
    // Through shared memory the two ways as measured across the CPUs, when both sides' marks were
    // recorded (the server in this process).
    let across = match medium {
        Medium::Shm => steps::handoffs(&m.steps),
        _ => None,
    };
    let mut lines = Vec::new();
    let chain = |side: &'static str, points: &[Point], lines: &mut Vec<Line>| -> f64 {
        let mut sum = 0.0;
        for w in points.windows(2) {
            let (step, mean_us) = match step_us(&m.steps, w[0], w[1]) {
                Some(us) => (w[1].describe().to_string(), us),
                None => (format!("{} (not recorded)", w[1].describe()), 0.0),
            };
            // Measured across the CPUs, the way back starts at the server's mark that the result is
            // ready: its publish (and any wake-up) lies inside it, the client's before the way out.
            // From the raw baseline instead: spinning, a side's publishing fence overlaps the
            // cache-line transfer it starts; without a spin budget publishing also wakes a sleeping
            // peer, a system call that the raw baseline's one-way time leaves out (its sides wake
            // each other outside the timed wait): then it is added.
            let overlapped = match across {
                Some(_) => w[1] == Point::ResultSent,
                None => medium == Medium::Shm && spin && matches!(w[1], Point::Sent | Point::ResultSent),
            };
            if !overlapped {
                sum += mean_us;
            }
            lines.push(Line { side, step, mean_us, overlapped });
        }
        sum
    };
    let split = client.iter().position(|&x| x == Point::Sent).unwrap_or(0);
    let before = chain("client", &client[..=split], &mut lines);
    let (_, raw_wait, raw_turn) = raw.stamps.means_us();
    let one_way = |r: &Raw| {
        let (_, wait, turn) = r.stamps.means_us();
        (wait - turn).max(0.0) / 2.0
    };
    let calls = m.calls.max(1) as f64;
    let (client_slept, server_slept) =
        if spin { (0.0, 0.0) } else { ((m.sleeps.0 as f64 / calls).min(1.0), (m.sleeps.1 as f64 / calls).min(1.0)) };
    let (woken, spun) = (one_way(raw), one_way(spinning));
    let raw_to_server = if spin { spun } else { server_slept * woken + (1.0 - server_slept) * spun };
    let raw_to_client = if spin { spun } else { client_slept * woken + (1.0 - client_slept) * spun };
    let (to_server, to_client) = match &across {
        Some(h) => (h.to_server.mean_ns() / 1e3, h.to_client.mean_ns() / 1e3),
        None => (raw_to_server, raw_to_client),
    };
    // Through shared memory, each baseline is the faster of two ping-pongs (see `RawRun`): say which.
    let as_tiercel = |r: &Raw| if r.like_tiercel { ", reply in place" } else { "" };
    let (wake, transfer) = match medium {
        Medium::Udp | Medium::Tcp => {
            ("woken from poll (raw blocking UDP ping-pong)".to_string(), "busy-polled (raw UDP ping-pong)".to_string())
        }
        Medium::Shm => (
            format!("futex wake (raw futex ping-pong{})", as_tiercel(raw)),
            format!("cache-line transfer (raw shm ping-pong{})", as_tiercel(spinning)),
        ),
    };
    let way = |to: &str, slept: f64| {
        let path = if medium == Medium::Udp { "kernel and loopback" } else { "shared memory" };
        // Measured across the CPUs: the raw ping-pongs' one way beside it.
        let (raw_wake, raw_spin) =
            (format!("raw futex ping-pong{}", as_tiercel(raw)), format!("raw shm ping-pong{}", as_tiercel(spinning)));
        match (&across, spin) {
            (Some(_), true) => format!("{path} to the {to}, measured ({raw_spin}: {spun:.3})"),
            (Some(_), false) => format!(
                "{path} to the {to}, measured, the {to} asleep in {:.0}% of calls ({raw_wake}: {woken:.3}; \
                 {raw_spin}: {spun:.3})",
                100.0 * slept
            ),
            (None, true) => format!("{path} to the {to}, {transfer}"),
            (None, false) => format!("{path} to the {to}: {wake} in {:.0}% of calls, else {transfer}", 100.0 * slept),
        }
    };
    lines.push(Line { side: "wire", step: way("server", server_slept), mean_us: to_server, overlapped: false });
    let server = chain("server", server_points, &mut lines);
    // All the server's steps, the overlapped publish included: what the client's wait covers.
    let server_busy: f64 = server_points.windows(2).filter_map(|w| step_us(&m.steps, w[0], w[1])).sum();
    lines.push(Line { side: "wire", step: way("client", client_slept), mean_us: to_client, overlapped: false });
    let after = chain("client", &client[split + 1..], &mut lines);
    let sum = before + to_server + to_client + server + after;
    // The whole is the call as the client's own timestamps saw it, from its first mark to its last:
    // the caller's clock around the stub also holds the cost of taking those two timestamps, which
    // no step of the call contains.
    let measured =
        client.windows(2).map(|w| step_us(&m.steps, w[0], w[1])).sum::<Option<f64>>().unwrap_or(m.on_mean_us);
    let gap = measured - sum;
    let handoff = match (medium, across) {
        (Medium::Shm, Some(h)) => Some(Handoff {
            to_server_us: h.to_server.mean_ns() / 1e3,
            to_client_us: h.to_client.mean_ns() / 1e3,
            raw_to_server_us: raw_to_server,
            raw_to_client_us: raw_to_client,
            wait_us: h.wait.mean_ns() / 1e3,
            calls: h.wait.count,
        }),
        _ => None,
    };
    Account {
        transport: if sealed { "udp sealed" } else { name(medium) },
        waiting: if spin { "spin" } else { "block" },
        procedure: p.name(),
        calls: m.calls,
        lines,
        sum_us: sum,
        measured_us: measured,
        gap_us: gap,
        gap_percent: 100.0 * gap / measured,
        client_wait_us: step_us(&m.steps, Point::Sent, Point::Arrived).unwrap_or(0.0),
        server_busy_us: server_busy,
        raw_wait_us: raw_wait,
        raw_turnaround_us: raw_turn,
        raw_round_trip_us: raw.round_trip.mean_us(),
        raw_like_tiercel: medium == Medium::Shm && (raw.like_tiercel || spinning.like_tiercel),
        off_mean_us: m.off_mean_us,
        off_median_us: m.off.median_us(),
        off_p99_us: m.off.p99_us(),
        client_slept_percent: 100.0 * client_slept,
        server_slept_percent: 100.0 * server_slept,
        handoff,
    }
}

pub fn print_account(a: &Account, placement: &str) {
    outln!(
        "\n{} over {}, {} on both sides\n({placement}); mean of {} calls, µs",
        a.procedure,
        match a.transport {
            "udp" => "UDP loopback",
            "udp sealed" => "UDP loopback, a secure binding (AES-256-GCM; raw baseline: the plain datagrams)",
            _ => "shared memory",
        },
        if a.waiting == "spin" {
            "spinning"
        } else {
            "no spin budget (a side sleeps unless the other has already answered)"
        },
        a.calls
    );
    for l in &a.lines {
        if l.overlapped {
            outln!("  {:<7} {:<84} {:>8.3}  (overlaps the transfer, not added)", l.side, l.step, l.mean_us);
        } else {
            outln!("  {:<7} {:<84} {:>8.3} {:>5.1}%", l.side, l.step, l.mean_us, 100.0 * l.mean_us / a.measured_us);
        }
    }
    outln!("  {:<92} {:>8.3}", "sum of the steps", a.sum_us);
    outln!("  {:<92} {:>8.3}", "measured: the client's first to last timestamp, around the stub", a.measured_us);
    let verdict = if a.gap_percent.abs() <= 10.0 { "within 10%" } else { "NOT within 10%" };
    outln!("  {:<92} {:>8.3} {:>5.1}%  ({verdict})", "difference (measured − sum)", a.gap_us, a.gap_percent);
    let net = a.client_wait_us - a.server_busy_us;
    outln!(
        "  where it lies: the client waited {:.3} (send returned → result seen), the server was busy {:.3}, so",
        a.client_wait_us,
        a.server_busy_us
    );
    outln!(
        "  the wire, kernel and wakeups took {:.3}; in the raw ping-pong they took {:.3} (its wait {:.3} less its",
        net,
        a.raw_wait_us - a.raw_turnaround_us,
        a.raw_wait_us
    );
    outln!("  echo's turnaround {:.3}; raw round trip {:.3}).", a.raw_turnaround_us, a.raw_round_trip_us);
    if a.raw_like_tiercel {
        outln!(
            "  (\"reply in place\": the raw ping-pong that moves its data as tiercel does, the reply written where the \
             request\n  was and the lines each side wrote pushed out to the shared cache; in this run the faster of the \
             two ping-pongs.)"
        );
    }
    if let Some(h) = &a.handoff {
        outln!(
            "  across the two threads (both CPUs' tick counters, {} of the {} calls, which waited {:.3}): the server marked\n  \
             the call arrived {:.3} after the client published it (its look at the slot, the claim and the check\n  \
             included), and the client saw the result {:.3} after the server marked it ready (the publish included);\n  \
             the raw one way {:.3}.",
            h.calls,
            a.calls,
            h.wait_us,
            h.to_server_us,
            h.to_client_us,
            (a.raw_wait_us - a.raw_turnaround_us).max(0.0) / 2.0
        );
    }
    if a.waiting == "block" && a.handoff.is_some() {
        outln!(
            "  without a spin budget the client slept in {:.0}% of the calls and the server in {:.0}%: the wire lines \
             are the ways\n  measured, wake-ups included, beside the one way of the blocking and the spinning raw \
             ping-pongs.",
            a.client_slept_percent,
            a.server_slept_percent
        );
    } else if a.waiting == "block" {
        outln!(
            "  without a spin budget the client slept in {:.0}% of the calls and the server in {:.0}%: the wire lines \
             charge\n  those the blocking baseline, the others the spinning one.",
            a.client_slept_percent,
            a.server_slept_percent
        );
    }
    if a.gap_percent.abs() > 10.0 {
        let why = match (a.transport, a.waiting) {
            ("shm", _) if a.handoff.is_some() => {
                "  Through shared memory the two ways were measured across the CPUs, so that the lines cover each call's \
                 time: the\n  difference comes from calls some of whose marks were not recorded."
            }
            ("shm", "spin") => {
                "  Through shared memory a side's publishing store and fence overlap the cache-line transfer they \
                 start, and the raw\n  ping-pong has no fence: the split between steps and transfer is approximate."
            }
            (_, "block") => {
                "  Calls mix sleeps and none; each way is charged the blocking baseline's one-way time in the share \
                 of calls\n  whose receiving side slept, but what a wake-up costs depends on how long the thread \
                 slept and on what its\n  CPU did meanwhile, which the raw blocking ping-pong (every wait a sleep) \
                 does not reproduce."
            }
            _ => "  The steps were measured with timestamps on; a slow moment of the machine weighs on the means.",
        };
        outln!("{why}");
    }
    outln!(
        "  the same calls with timestamps off: mean {:.3}, median {:.3}, p99 {:.3} (the difference from {:.3} is \
         the cost of",
        a.off_mean_us,
        a.off_median_us,
        a.off_p99_us,
        a.measured_us
    );
    outln!("  the timestamps where the machine is steady, and noise where it is not)");
}
