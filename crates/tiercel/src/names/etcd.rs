//! Names in etcd (feature `etcd`): each export is a key under `tiercel/names/<name>/`, attached to
//! a lease the server's process keeps alive (every third of its time to live); when the process
//! dies, etcd drops the key once the lease runs out. The value is the same text as a local entry.
//!
//! The client speaks etcd's JSON gateway (the v3 API as JSON over HTTP/1.1 on the client port,
//! served by every etcd since 3.4; keys and values in base64, 64-bit integers as strings), so that
//! building it needs no code generation and no `protoc`, and it runs on plain threads: the
//! synchronous calls of [`Registry`](super::Registry) make one HTTP request each, a registration's
//! lease is kept alive by a thread of its own, and a watch is a thread reading etcd's stream of
//! events. Each request tries the endpoints in turn, starting from the last that answered.
//!
//! A cluster with authentication on (`etcdctl auth enable`) is reached as one of its users
//! (`?user=NAME&password-file=PATH`): the client authenticates once per connection to the cluster
//! (`/v3/auth/authenticate`), sends the token with each request, and authenticates again when etcd
//! says the token is no longer valid (it expired, or etcd restarted). Who may then register a name
//! is whoever etcd lets write under `tiercel/names/`, and who may look one up whoever it lets read
//! there: give servers a role with write permission on that prefix and clients one with read.
//! The gateway is plain HTTP: the password and token cross the network in the clear, as every
//! request does.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde_json::{json, Value};

use super::{Exporter, NameError};

/// Where keys of names live.
const PREFIX: &str = "tiercel/names/";
/// How long a synchronous registry call waits for etcd.
pub(super) const ANSWER_WITHIN: Duration = Duration::from_secs(5);
/// How long connecting to an endpoint may take.
const CONNECT_WITHIN: Duration = Duration::from_secs(2);
/// The time to live of a registration's lease when the registry does not say.
pub const DEFAULT_TTL: Duration = Duration::from_secs(5);
/// How long a watch's read waits for an event before it looks whether it is still wanted (and then
/// watches again from the revision it had reached, so that no event is missed between the two).
const WATCH_LOOK: Duration = Duration::from_secs(2);
/// The largest answer read from etcd (a range of every name's entries stays far below it).
const MAX_ANSWER: u64 = 16 << 20;

/// An etcd cluster holding names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Etcd {
    /// `host:port` of each member to try.
    pub endpoints: Vec<String>,
    /// How long a registration outlives its server's process (the lease's time to live; whole
    /// seconds, at least 1).
    pub ttl: Duration,
    /// The user to be, on a cluster with authentication on.
    pub user: Option<EtcdUser>,
}

/// A user of an etcd cluster with authentication on: its name, and the file holding its password
/// (read when the client authenticates; refused if others may read it, as secret files are).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdUser {
    /// The user's name.
    pub name: String,
    /// The file holding its password (trailing whitespace ignored).
    pub password_file: std::path::PathBuf,
}

impl Etcd {
    /// Whether the client authenticates: on a cluster with authentication on, only users allowed
    /// to write names register them.
    pub(crate) fn authenticated(&self) -> bool {
        self.user.is_some()
    }
}

impl core::fmt::Display for Etcd {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "etcd://{}?ttl={}", self.endpoints.join(","), self.ttl.as_secs())?;
        if let Some(user) = &self.user {
            write!(f, "&user={}&password-file={}", user.name, user.password_file.display())?;
        }
        Ok(())
    }
}

/// A connection to the cluster: an HTTP agent (which keeps connections open between requests) and
/// the endpoint that answered last.
#[derive(Clone)]
struct Gateway {
    endpoints: Arc<[String]>,
    agent: ureq::Agent,
    preferred: Arc<AtomicUsize>,
    /// The user requests are made as, with its token once authenticated.
    user: Option<Arc<(EtcdUser, std::sync::Mutex<Option<String>>)>>,
}

fn io_error(e: impl core::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

impl Gateway {
    fn new(etcd: &Etcd, read_within: Duration) -> Gateway {
        let agent = ureq::Agent::config_builder()
            .timeout_connect(Some(CONNECT_WITHIN))
            .timeout_per_read(Some(read_within))
            .timeout_per_write(Some(ANSWER_WITHIN))
            .http_status_as_error(false)
            .build()
            .into();
        let user = etcd.user.clone().map(|u| Arc::new((u, std::sync::Mutex::new(None))));
        Gateway { endpoints: etcd.endpoints.clone().into(), agent, preferred: Arc::default(), user }
    }

    /// The token requests carry: the one held, or a new one from authenticating.
    fn token(&self, user: &(EtcdUser, std::sync::Mutex<Option<String>>)) -> Result<String, std::io::Error> {
        let (who, held) = user;
        let mut held = held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(token) = &*held {
            return Ok(token.clone());
        }
        let password = read_password(&who.password_file)?;
        let answer = self.send("/v3/auth/authenticate", &json!({ "name": who.name, "password": password }), None)?;
        let text = answer.into_body().with_config().limit(MAX_ANSWER).read_to_string().map_err(io_error)?;
        let token = serde_json::from_str::<Value>(&text).ok().and_then(|v| v["token"].as_str().map(str::to_owned));
        let token = token.ok_or_else(|| io_error(format!("etcd gave user {} no token: {text}", who.name)))?;
        *held = Some(token.clone());
        Ok(token)
    }

    /// Sends `body` to `path` of the first endpoint that answers, and returns the response whole.
    fn request(&self, path: &str, body: &Value) -> Result<Value, std::io::Error> {
        let mut response = self.open(path, body)?;
        let text = response.body_mut().with_config().limit(MAX_ANSWER).read_to_string().map_err(io_error)?;
        serde_json::from_str(&text).map_err(|e| io_error(format!("etcd answered {path} with bad JSON: {e}")))
    }

    /// Sends `body` to `path` as the gateway's user, if it has one (authenticating again once when
    /// etcd no longer takes its token), and returns the response (its body unread) of the first
    /// endpoint that answers with success.
    fn open(&self, path: &str, body: &Value) -> Result<ureq::http::Response<ureq::Body>, std::io::Error> {
        let Some(user) = &self.user else { return self.send(path, body, None) };
        let token = self.token(user)?;
        match self.send(path, body, Some(&token)) {
            Err(e) if e.to_string().contains("auth token") => {
                let mut held = user.1.lock().unwrap_or_else(|p| p.into_inner());
                if held.as_deref() == Some(token.as_str()) {
                    *held = None;
                }
                drop(held);
                self.send(path, body, Some(&self.token(user)?))
            }
            sent => sent,
        }
    }

    /// Sends `body` to `path` with `token`, trying each endpoint from the preferred one, and
    /// returns the response (its body unread) of the first that answers with success.
    fn send(
        &self,
        path: &str,
        body: &Value,
        token: Option<&str>,
    ) -> Result<ureq::http::Response<ureq::Body>, std::io::Error> {
        let body = body.to_string();
        let first = self.preferred.load(Ordering::Relaxed);
        let mut why = String::new();
        for i in 0..self.endpoints.len() {
            let at = (first + i) % self.endpoints.len();
            let url = format!("http://{}{path}", self.endpoints[at]);
            let mut request = self.agent.post(&url).header("content-type", "application/json");
            if let Some(token) = token {
                request = request.header("authorization", token);
            }
            match request.send(body.as_str()) {
                Ok(r) if r.status().is_success() => {
                    self.preferred.store(at, Ordering::Relaxed);
                    return Ok(r);
                }
                Ok(mut r) => {
                    let said = r.body_mut().with_config().limit(4096).read_to_string().unwrap_or_default();
                    return Err(io_error(format!(
                        "etcd at {} refused {path} ({}): {}",
                        self.endpoints[at],
                        r.status(),
                        said.trim()
                    )));
                }
                Err(e) => why = format!("etcd at {} did not answer {path}: {e}", self.endpoints[at]),
            }
        }
        Err(std::io::Error::new(std::io::ErrorKind::TimedOut, why))
    }
}

/// The password in `path`, which only its owner may read.
fn read_password(path: &std::path::Path) -> Result<String, std::io::Error> {
    let bytes = crate::auth::read_private(path).map_err(io_error)?;
    String::from_utf8(bytes).map_err(|_| io_error(format!("{}: the password is not UTF-8", path.display())))
}

/// A 64-bit integer of the gateway's JSON (written as a string, or absent when zero).
fn int(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

/// The bytes of a base64 field (empty when absent or not base64).
fn bytes(v: &Value) -> Vec<u8> {
    v.as_str().and_then(|s| BASE64.decode(s).ok()).unwrap_or_default()
}

/// The end of the range of keys starting with `prefix` (its last byte below 0xff, plus one).
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// A key and its value, as etcd holds them.
type Entry = (Vec<u8>, Vec<u8>);

/// The keys and values of every key starting with `prefix`.
fn range(gateway: &Gateway, prefix: &str, keys_only: bool) -> Result<Vec<Entry>, std::io::Error> {
    let found = gateway.request(
        "/v3/kv/range",
        &json!({ "key": BASE64.encode(prefix), "range_end": BASE64.encode(prefix_end(prefix)), "keys_only": keys_only }),
    )?;
    let kvs = found["kvs"].as_array().map(Vec::as_slice).unwrap_or_default();
    Ok(kvs.iter().map(|kv| (bytes(&kv["key"]), bytes(&kv["value"]))).collect())
}

/// A new lease of `ttl`, with `key` put under it.
fn grant_and_put(gateway: &Gateway, ttl: Duration, key: &str, value: &str) -> Result<i64, std::io::Error> {
    let granted = gateway.request("/v3/lease/grant", &json!({ "TTL": ttl.as_secs().max(1).to_string() }))?;
    let lease = int(&granted["ID"]);
    if lease == 0 {
        return Err(io_error(format!("etcd granted no lease: {granted}")));
    }
    let put = json!({ "key": BASE64.encode(key), "value": BASE64.encode(value), "lease": lease.to_string() });
    gateway.request("/v3/kv/put", &put)?;
    Ok(lease)
}

/// Whether `lease` is still alive after one keep-alive.
fn keep_alive(gateway: &Gateway, lease: i64) -> Result<bool, std::io::Error> {
    let kept = gateway.request("/v3/lease/keepalive", &json!({ "ID": lease.to_string() }))?;
    // A time to live of 0 (absent): the lease ran out while etcd was out of reach.
    Ok(int(&kept["result"]["TTL"]) > 0)
}

/// A registration's lease, kept alive by a thread of its own until dropped (then revoked: the key
/// goes at once).
#[derive(Debug)]
pub(super) struct Lease {
    stop: Option<mpsc::Sender<()>>,
    revoked: mpsc::Receiver<()>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            if stop.send(()).is_ok() {
                // Bounded: an unreachable etcd drops the key when the lease runs out instead.
                let _ = self.revoked.recv_timeout(ANSWER_WITHIN + Duration::from_secs(1));
            }
        }
    }
}

/// Registers `exporter`: its key under a new lease, kept alive until the returned lease drops.
pub(super) fn register(etcd: &Etcd, exporter: &Exporter) -> Result<Lease, std::io::Error> {
    let key = format!("{PREFIX}{}/{:016x}-{}", exporter.name, exporter.incarnation, super::unique());
    let value = exporter.encode();
    let gateway = Gateway::new(etcd, ANSWER_WITHIN);
    let ttl = etcd.ttl;
    let mut lease = grant_and_put(&gateway, ttl, &key, &value)?;
    let (stop, stopped) = mpsc::channel();
    let (revoked_tx, revoked) = mpsc::sync_channel(1);
    std::thread::Builder::new().name("tiercel-etcd-lease".into()).spawn(move || {
        let period = ttl / 3;
        loop {
            if stopped.recv_timeout(period) != Err(mpsc::RecvTimeoutError::Timeout) {
                let _ = gateway.request("/v3/lease/revoke", &json!({ "ID": lease.to_string() }));
                let _ = revoked_tx.send(());
                return;
            }
            if !matches!(keep_alive(&gateway, lease), Ok(true)) {
                // Lost: the entry again under a new lease (once etcd answers again).
                if let Ok(fresh) = grant_and_put(&gateway, ttl, &key, &value) {
                    lease = fresh;
                }
            }
        }
    })?;
    Ok(Lease { stop: Some(stop), revoked })
}

/// The exporters of `name` registered now (entries that do not parse are skipped).
pub(super) fn lookup(etcd: &Etcd, name: &str) -> Result<Vec<Exporter>, std::io::Error> {
    let found = range(&Gateway::new(etcd, ANSWER_WITHIN), &format!("{PREFIX}{name}/"), false)?;
    Ok(found.iter().filter_map(|(_, v)| std::str::from_utf8(v).ok().and_then(Exporter::decode)).collect())
}

/// A watch's thread is asked to end when this drops.
#[derive(Debug)]
pub(super) struct WatchStop(Arc<AtomicBool>);

impl Drop for WatchStop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Watches `name`'s keys on a thread of its own until the returned stop drops (the thread ends at
/// its next look, within [`WATCH_LOOK`]), telling `departures` of each exporter whose key is deleted
/// (its lease revoked or expired). The first watch starts from etcd's revision when this is called
/// and each later one from the revision the last one reached, so no deletion is missed between
/// them; one that cannot be made is tried again after a second.
pub(super) fn watch(etcd: &Etcd, name: &str, departures: Arc<super::Departures>) -> Result<WatchStop, std::io::Error> {
    let prefix = format!("{PREFIX}{name}/");
    let gateway = Gateway::new(etcd, WATCH_LOOK);
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    // The watch starts from the revision etcd is at now: no deletion after this call is missed,
    // however late the thread's first watch is made.
    let range =
        json!({ "key": BASE64.encode(&prefix), "range_end": BASE64.encode(prefix_end(&prefix)), "count_only": true });
    let mut next_revision = int(&gateway.request("/v3/kv/range", &range)?["header"]["revision"]) + 1;
    std::thread::Builder::new().name("tiercel-etcd-watch".into()).spawn(move || {
        while !stopped.load(Ordering::Relaxed) {
            let mut create = json!({
                "key": BASE64.encode(&prefix),
                "range_end": BASE64.encode(prefix_end(&prefix)),
                "prev_kv": true,
            });
            if next_revision > 0 {
                create["start_revision"] = next_revision.to_string().into();
            }
            // A watch that could not be made is tried again after a second; one that ended (etcd
            // closed it, or its read waited WATCH_LOOK with nothing to say) is made again at once,
            // from the revision it reached.
            if follow(&gateway, &json!({ "create_request": create }), &departures, &stopped, &mut next_revision)
                .is_err()
            {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    })?;
    Ok(WatchStop(stop))
}

/// Reads one watch's stream of events until it breaks, times out or is no longer wanted, moving
/// `next_revision` past every revision it has seen. Err: the watch could not be made.
fn follow(
    gateway: &Gateway,
    request: &Value,
    departures: &super::Departures,
    stopped: &AtomicBool,
    next_revision: &mut i64,
) -> Result<(), std::io::Error> {
    use std::io::BufRead as _;
    let response = gateway.open("/v3/watch", request)?;
    let mut lines = std::io::BufReader::new(response.into_body().into_reader());
    let mut line = String::new();
    while !stopped.load(Ordering::Relaxed) {
        line.clear();
        // The end of the stream, a read that waited WATCH_LOOK, a broken connection: this watch
        // is over (the caller makes the next one).
        if !matches!(lines.read_line(&mut line), Ok(n) if n > 0) {
            return Ok(());
        }
        let Ok(message) = serde_json::from_str::<Value>(&line) else { continue };
        let result = &message["result"];
        if int(&result["compact_revision"]) > 0 {
            // The revision to start from was compacted away: watch again from now.
            *next_revision = 0;
            return Ok(());
        }
        for event in result["events"].as_array().map(Vec::as_slice).unwrap_or_default() {
            *next_revision = (*next_revision).max(int(&event["kv"]["mod_revision"]) + 1);
            if event["type"].as_str() != Some("DELETE") {
                continue;
            }
            let gone = std::str::from_utf8(&bytes(&event["prev_kv"]["value"])).ok().and_then(Exporter::decode);
            if let Some(exporter) = gone {
                departures.depart(&exporter);
            }
        }
        // A watch created from revision 0 starts after the header's revision.
        if *next_revision == 0 {
            *next_revision = int(&result["header"]["revision"]) + 1;
        }
    }
    Ok(())
}

/// The names with at least one key, sorted.
pub(super) fn names(etcd: &Etcd) -> Result<Vec<String>, std::io::Error> {
    let keys = range(&Gateway::new(etcd, ANSWER_WITHIN), PREFIX, true)?;
    let mut names: Vec<String> = keys
        .iter()
        .filter_map(|(k, _)| {
            std::str::from_utf8(k).ok()?.strip_prefix(PREFIX)?.split_once('/').map(|(n, _)| n.to_owned())
        })
        .filter(|n| super::valid_name(n))
        .collect();
    names.sort();
    names.dedup();
    Ok(names)
}

/// Parses `host:port[,host:port…][?ttl=SECONDS][&user=NAME&password-file=PATH]` (after `etcd://`).
pub(super) fn parse(spec: &str, rest: &str) -> Result<Etcd, NameError> {
    let bad = |reason: String| NameError::InvalidRegistry { registry: spec.to_owned(), reason };
    let (hosts, query) = rest.split_once('?').unwrap_or((rest, ""));
    let endpoints: Vec<String> = hosts.split(',').filter(|h| !h.is_empty()).map(str::to_owned).collect();
    if endpoints.is_empty() || endpoints.iter().any(|h| !h.contains(':')) {
        return Err(bad("expected etcd://HOST:PORT[,HOST:PORT…][?ttl=SECONDS]".into()));
    }
    let mut ttl = DEFAULT_TTL;
    let (mut name, mut password_file) = (None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("ttl", s)) => match s.parse::<u64>() {
                Ok(n) if (1..=3600).contains(&n) => ttl = Duration::from_secs(n),
                _ => return Err(bad(format!("ttl must be whole seconds from 1 to 3600, not {s:?}"))),
            },
            Some(("user", s)) if !s.is_empty() => name = Some(s.to_owned()),
            Some(("password-file", s)) if std::path::Path::new(s).is_absolute() => password_file = Some(s.into()),
            _ => {
                return Err(bad(format!(
                    "bad option {pair:?} (known: ttl=SECONDS, user=NAME, password-file=/absolute/path)"
                )))
            }
        }
    }
    let user = match (name, password_file) {
        (Some(name), Some(password_file)) => Some(EtcdUser { name, password_file }),
        (None, None) => None,
        _ => return Err(bad("user= and password-file= go together".into())),
    };
    Ok(Etcd { endpoints, ttl, user })
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
        let authed = parse("x", "h:1?ttl=2&user=svc&password-file=/etc/svc.pw").unwrap();
        let user = EtcdUser { name: "svc".into(), password_file: "/etc/svc.pw".into() };
        assert_eq!(authed.user, Some(user));
        assert_eq!(parse("x", "h:1?ttl=2&user=svc&password-file=/etc/svc.pw").unwrap().to_string(), authed.to_string());
        assert_eq!(parse("x", &authed.to_string()["etcd://".len()..]).unwrap(), authed);
        for bad in
            ["h:1?user=svc", "h:1?password-file=/p", "h:1?user=svc&password-file=rel", "h:1?user=&password-file=/p"]
        {
            assert!(parse("x", bad).is_err(), "{bad}");
        }
        for bad in ["", "?ttl=3", "host", "h:1?ttl=0", "h:1?ttl=x", "h:1?lease=3"] {
            assert!(parse("x", bad).is_err(), "{bad}");
        }
    }
}
