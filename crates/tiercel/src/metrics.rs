//! Call counts and latency histograms through the `metrics` facade (feature `metrics`), per
//! procedure on both sides and, on the client, per binding's server:
//!
//! ```text
//! tiercel_server_calls_total{interface, procedure, outcome="ok"|"error"}   counter
//! tiercel_server_call_seconds{interface, procedure}                        histogram (procedure's run)
//! tiercel_client_calls_total{interface, procedure, server, outcome}        counter
//! tiercel_client_call_seconds{interface, procedure, server}                histogram (the whole call)
//! ```
//!
//! On when `ServerConfig::metrics` or `ClientConfig::metrics` says so. The handles are registered
//! once, when a server starts or a client binds, with the recorder installed then (install yours
//! first); a call only bumps them, allocating nothing. Without the feature, every type here is empty
//! and every method compiles to nothing.

use crate::interface::InterfaceInfo;

/// The handles of one procedure.
#[derive(Clone)]
#[cfg_attr(not(feature = "metrics"), derive(Default))]
pub(crate) struct Procedure {
    #[cfg(feature = "metrics")]
    ok: metrics::Counter,
    #[cfg(feature = "metrics")]
    error: metrics::Counter,
    #[cfg(feature = "metrics")]
    seconds: metrics::Histogram,
}

/// When a timed section began (nothing without the feature).
pub(crate) struct Started {
    #[cfg(feature = "metrics")]
    at: std::time::Instant,
}

impl Procedure {
    /// The start of a call.
    #[inline]
    pub(crate) fn start(&self) -> Started {
        Started {
            #[cfg(feature = "metrics")]
            at: std::time::Instant::now(),
        }
    }

    /// The end of a call started at `started`, `ok` or not.
    #[inline]
    pub(crate) fn finish(&self, started: Started, ok: bool) {
        #[cfg(feature = "metrics")]
        {
            self.seconds.record(started.at.elapsed().as_secs_f64());
            if ok { &self.ok } else { &self.error }.increment(1);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (started, ok);
    }
}

/// The handles of every procedure of an interface, by procedure number, on one side (`"server"`
/// or `"client"`), with `server` as a label on the client; none when not `on` (then a call does not
/// even read the clock).
pub(crate) fn procedures(info: &InterfaceInfo, side: &'static str, server: Option<String>, on: bool) -> Vec<Procedure> {
    if !on {
        return Vec::new();
    }
    #[cfg(feature = "metrics")]
    {
        let calls: &'static str =
            if side == "server" { "tiercel_server_calls_total" } else { "tiercel_client_calls_total" };
        let seconds: &'static str =
            if side == "server" { "tiercel_server_call_seconds" } else { "tiercel_client_call_seconds" };
        info.procedures
            .iter()
            .map(|&procedure| {
                let mut labels =
                    vec![metrics::Label::new("interface", info.name), metrics::Label::new("procedure", procedure)];
                if let Some(server) = &server {
                    labels.push(metrics::Label::new("server", server.clone()));
                }
                let with = |outcome: &'static str| {
                    let mut l = labels.clone();
                    l.push(metrics::Label::new("outcome", outcome));
                    l
                };
                Procedure {
                    ok: metrics::counter!(calls, with("ok")),
                    error: metrics::counter!(calls, with("error")),
                    seconds: metrics::histogram!(seconds, labels.clone()),
                }
            })
            .collect()
    }
    #[cfg(not(feature = "metrics"))]
    {
        let _ = (side, server);
        vec![Procedure::default(); info.procedures.len()]
    }
}
