//! Names in etcd (feature `etcd`): each export is a key under `tiercel/names/<name>/`, attached to
//! a lease the server's process keeps alive (every third of its time to live); when the process
//! dies, etcd drops the key once the lease runs out. The value is the same text as a local entry.
//!
//! The etcd client is async: one thread per process (`tiercel-etcd`) runs it on a current-thread
//! tokio runtime, with the keep-alive of every registration, and the synchronous calls of
//! [`Registry`](super::Registry) wait for their answer from it, up to [`ANSWER_WITHIN`].

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, EventType, GetOptions, PutOptions, WatchOptions};

use super::{Exporter, NameError};

/// Where keys of names live.
const PREFIX: &str = "tiercel/names/";
/// How long a synchronous registry call waits for etcd.
pub(super) const ANSWER_WITHIN: Duration = Duration::from_secs(5);
/// How long connecting to an endpoint may take.
const CONNECT_WITHIN: Duration = Duration::from_secs(2);
/// The time to live of a registration's lease when the registry does not say.
pub const DEFAULT_TTL: Duration = Duration::from_secs(5);

/// An etcd cluster holding names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Etcd {
    /// `host:port` of each member to try.
    pub endpoints: Vec<String>,
    /// How long a registration outlives its server's process (the lease's time to live; whole
    /// seconds, at least 1).
    pub ttl: Duration,
}

impl core::fmt::Display for Etcd {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "etcd://{}?ttl={}", self.endpoints.join(","), self.ttl.as_secs())
    }
}

/// The thread running the etcd client, started by the first use.
fn agent() -> Result<&'static tokio::runtime::Handle, std::io::Error> {
    static AGENT: OnceLock<Result<tokio::runtime::Handle, String>> = OnceLock::new();
    let started = AGENT.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        let handle = runtime.handle().clone();
        std::thread::Builder::new()
            .name("tiercel-etcd".into())
            .spawn(move || runtime.block_on(std::future::pending::<()>()))
            .map_err(|e| e.to_string())?;
        Ok(handle)
    });
    started.as_ref().map_err(|e| std::io::Error::other(format!("cannot start the etcd client's thread: {e}")))
}

/// Runs `job` on the agent's thread and waits for its result.
fn run<T: Send + 'static>(
    job: impl core::future::Future<Output = Result<T, etcd_client::Error>> + Send + 'static,
) -> Result<T, std::io::Error> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    agent()?.spawn(async move {
        let _ = tx.send(tokio::time::timeout(ANSWER_WITHIN, job).await);
    });
    match rx.recv_timeout(ANSWER_WITHIN + Duration::from_secs(1)) {
        Ok(Ok(Ok(v))) => Ok(v),
        Ok(Ok(Err(e))) => Err(std::io::Error::other(e.to_string())),
        Ok(Err(_)) | Err(_) => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "etcd did not answer in time")),
    }
}

/// A client of the cluster, connected once per set of endpoints and shared (it reconnects by
/// itself).
async fn client(endpoints: &[String]) -> Result<Client, etcd_client::Error> {
    static CLIENTS: OnceLock<Mutex<HashMap<Vec<String>, Client>>> = OnceLock::new();
    let clients = CLIENTS.get_or_init(Default::default);
    if let Some(c) = clients.lock().unwrap_or_else(|p| p.into_inner()).get(endpoints) {
        return Ok(c.clone());
    }
    let options = ConnectOptions::new().with_connect_timeout(CONNECT_WITHIN).with_timeout(ANSWER_WITHIN);
    let c = Client::connect(endpoints, Some(options)).await?;
    clients.lock().unwrap_or_else(|p| p.into_inner()).insert(endpoints.to_vec(), c.clone());
    Ok(c)
}

/// A registration's lease, kept alive by a task on the agent's thread until dropped (then revoked:
/// the key goes at once).
#[derive(Debug)]
pub(super) struct Lease {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    revoked: std::sync::mpsc::Receiver<()>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            if stop.send(()).is_ok() {
                // Bounded: an unreachable etcd drops the key when the lease runs out instead.
                let _ = self.revoked.recv_timeout(ANSWER_WITHIN);
            }
        }
    }
}

async fn grant_and_put(c: &mut Client, ttl: Duration, key: &str, value: &str) -> Result<i64, etcd_client::Error> {
    let lease = c.lease_grant(ttl.as_secs().max(1) as i64, None).await?.id();
    c.put(key, value, Some(PutOptions::new().with_lease(lease))).await?;
    Ok(lease)
}

/// Registers `exporter`: its key under a new lease, kept alive until the returned lease drops.
pub(super) fn register(etcd: &Etcd, exporter: &Exporter) -> Result<Lease, std::io::Error> {
    let key = format!("{PREFIX}{}/{:016x}-{}", exporter.name, exporter.incarnation, super::unique());
    let value = exporter.encode();
    let (endpoints, ttl) = (etcd.endpoints.clone(), etcd.ttl);
    let (k, v) = (key.clone(), value.clone());
    let (c, lease) = run(async move {
        let mut c = client(&endpoints).await?;
        let lease = grant_and_put(&mut c, ttl, &k, &v).await?;
        Ok((c, lease))
    })?;
    let (stop, mut stopped) = tokio::sync::oneshot::channel();
    let (revoked_tx, revoked) = std::sync::mpsc::sync_channel(1);
    agent()?.spawn(async move {
        let mut c = c;
        let mut lease = lease;
        let mut keeper = None;
        let period = ttl / 3;
        loop {
            if tokio::time::timeout(period, &mut stopped).await.is_ok() {
                let _ = tokio::time::timeout(ANSWER_WITHIN, c.lease_revoke(lease)).await;
                let _ = revoked_tx.send(());
                return;
            }
            let renewed = tokio::time::timeout(period, async {
                if keeper.is_none() {
                    keeper = Some(c.lease_keep_alive(lease).await?);
                }
                let Some((k, s)) = keeper.as_mut() else { return Ok(false) };
                k.keep_alive().await?;
                // A time to live of 0: the lease ran out (etcd was out of reach too long).
                Ok::<_, etcd_client::Error>(s.message().await?.is_some_and(|r| r.ttl() > 0))
            })
            .await;
            if !matches!(renewed, Ok(Ok(true))) {
                // Lost: the entry again under a new lease (once etcd answers again).
                keeper = None;
                if let Ok(Ok(fresh)) = tokio::time::timeout(period, grant_and_put(&mut c, ttl, &key, &value)).await {
                    lease = fresh;
                }
            }
        }
    });
    Ok(Lease { stop: Some(stop), revoked })
}

/// The exporters of `name` registered now (entries that do not parse are skipped).
pub(super) fn lookup(etcd: &Etcd, name: &str) -> Result<Vec<Exporter>, std::io::Error> {
    let prefix = format!("{PREFIX}{name}/");
    let endpoints = etcd.endpoints.clone();
    let values = run(async move {
        let mut c = client(&endpoints).await?;
        let found = c.get(prefix, Some(GetOptions::new().with_prefix())).await?;
        Ok(found.kvs().iter().map(|kv| kv.value().to_vec()).collect::<Vec<_>>())
    })?;
    Ok(values.iter().filter_map(|v| std::str::from_utf8(v).ok().and_then(Exporter::decode)).collect())
}

/// Watches `name`'s keys on the agent's thread until the returned sender drops, telling
/// `departures` of each exporter whose key is deleted (its lease revoked or expired). A broken
/// watch is made again after a second.
pub(super) fn watch(
    etcd: &Etcd,
    name: &str,
    departures: std::sync::Arc<super::Departures>,
) -> Result<tokio::sync::oneshot::Sender<()>, std::io::Error> {
    let prefix = format!("{PREFIX}{name}/");
    let endpoints = etcd.endpoints.clone();
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    agent()?.spawn(async move {
        let watching = async {
            loop {
                let watched = async {
                    let mut c = client(&endpoints).await?;
                    let options = WatchOptions::new().with_prefix().with_prev_key();
                    let mut stream = c.watch(prefix.as_bytes(), Some(options)).await?;
                    while let Some(response) = stream.message().await? {
                        for event in response.events() {
                            let gone = (event.event_type() == EventType::Delete)
                                .then(|| event.prev_kv())
                                .flatten()
                                .and_then(|kv| std::str::from_utf8(kv.value()).ok())
                                .and_then(Exporter::decode);
                            if let Some(exporter) = gone {
                                departures.depart(&exporter);
                            }
                        }
                    }
                    Ok::<_, etcd_client::Error>(())
                };
                let _ = watched.await;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        };
        tokio::select! {
            _ = &mut stopped => {}
            _ = watching => {}
        }
    });
    Ok(stop)
}

/// The names with at least one key, sorted.
pub(super) fn names(etcd: &Etcd) -> Result<Vec<String>, std::io::Error> {
    let endpoints = etcd.endpoints.clone();
    let keys = run(async move {
        let mut c = client(&endpoints).await?;
        let found = c.get(PREFIX, Some(GetOptions::new().with_prefix().with_keys_only())).await?;
        Ok(found.kvs().iter().map(|kv| kv.key().to_vec()).collect::<Vec<_>>())
    })?;
    let mut names: Vec<String> = keys
        .iter()
        .filter_map(|k| std::str::from_utf8(k).ok()?.strip_prefix(PREFIX)?.split_once('/').map(|(n, _)| n.to_owned()))
        .filter(|n| super::valid_name(n))
        .collect();
    names.sort();
    names.dedup();
    Ok(names)
}

/// Parses `host:port[,host:port…][?ttl=SECONDS]` (after `etcd://`).
pub(super) fn parse(spec: &str, rest: &str) -> Result<Etcd, NameError> {
    let bad = |reason: String| NameError::InvalidRegistry { registry: spec.to_owned(), reason };
    let (hosts, query) = rest.split_once('?').unwrap_or((rest, ""));
    let endpoints: Vec<String> = hosts.split(',').filter(|h| !h.is_empty()).map(str::to_owned).collect();
    if endpoints.is_empty() || endpoints.iter().any(|h| !h.contains(':')) {
        return Err(bad("expected etcd://HOST:PORT[,HOST:PORT…][?ttl=SECONDS]".into()));
    }
    let mut ttl = DEFAULT_TTL;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("ttl", s)) => match s.parse::<u64>() {
                Ok(n) if (1..=3600).contains(&n) => ttl = Duration::from_secs(n),
                _ => return Err(bad(format!("ttl must be whole seconds from 1 to 3600, not {s:?}"))),
            },
            _ => return Err(bad(format!("unknown option {pair:?} (known: ttl)"))),
        }
    }
    Ok(Etcd { endpoints, ttl })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        let e = parse("x", "127.0.0.1:2379,10.0.0.2:2379?ttl=3").unwrap();
        assert_eq!(e.endpoints, vec!["127.0.0.1:2379", "10.0.0.2:2379"]);
        assert_eq!(e.ttl, Duration::from_secs(3));
        assert_eq!(parse("x", "h:1").unwrap().ttl, DEFAULT_TTL);
        assert_eq!(parse("x", "h:1?ttl=7").unwrap().to_string(), "etcd://h:1?ttl=7");
        for bad in ["", "?ttl=3", "host", "h:1?ttl=0", "h:1?ttl=x", "h:1?lease=3"] {
            assert!(parse("x", bad).is_err(), "{bad}");
        }
    }
}
