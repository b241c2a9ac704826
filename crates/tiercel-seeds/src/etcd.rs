//! A real etcd server for tests of the etcd registry: Debian's `etcd` (package `etcd-server`) on
//! loopback ports of its own, with a data directory of its own, stopped and removed when dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running etcd.
pub struct EtcdServer {
    child: Child,
    dir: PathBuf,
    /// `IP:PORT` of its client endpoint.
    pub client_addr: String,
}

/// A free TCP port on loopback (free when asked: the caller binds it soon after).
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl EtcdServer {
    /// Starts one on loopback and waits until it answers (at most 20 s). Its ports are free when
    /// chosen, but another process may take one before etcd binds it: an etcd that exits before
    /// it answers is started again on other ports (up to 5 times).
    pub fn start() -> std::io::Result<EtcdServer> {
        EtcdServer::start_with(&[])
    }

    /// [`EtcdServer::start`] with more of etcd's options (for example `--auth-token-ttl 1`).
    pub fn start_with(options: &[&str]) -> std::io::Result<EtcdServer> {
        let mut why = String::new();
        for _ in 0..5 {
            let (client, peer) = (free_port()?, free_port()?);
            let mut server = EtcdServer::spawn(None, "127.0.0.1", client, peer, options)?;
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                match server.healthy() {
                    Ok(()) => return Ok(server),
                    Err(e) => why = e.to_string(),
                }
                if let Ok(Some(status)) = server.child.try_wait() {
                    why = format!("etcd exited ({status}): {why}");
                    break;
                }
                if Instant::now() > deadline {
                    return Err(std::io::Error::other(format!("etcd did not come up: {why}")));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Err(std::io::Error::other(format!("etcd did not come up: {why}")))
    }

    /// Whether etcd says it is healthy (`GET /health` on its client port: it has a leader and
    /// answers requests).
    fn healthy(&self) -> std::io::Result<()> {
        use std::io::{Read as _, Write as _};
        let mut c = std::net::TcpStream::connect(&self.client_addr)?;
        c.set_read_timeout(Some(Duration::from_secs(2)))?;
        c.write_all(b"GET /health HTTP/1.0\r\n\r\n")?;
        let mut answer = String::new();
        c.read_to_string(&mut answer)?;
        match answer.contains("\"health\":\"true\"") {
            true => Ok(()),
            false => Err(std::io::Error::other(format!("not healthy yet: {}", answer.lines().last().unwrap_or("")))),
        }
    }

    /// Starts one in network namespace `ns` at `ip` (ports 2379 and 2380, free in a namespace of
    /// the test's own), without waiting for it: its clients there retry until it answers.
    pub fn start_in(ns: &str, ip: &str) -> std::io::Result<EtcdServer> {
        EtcdServer::spawn(Some(ns), ip, 2379, 2380, &[])
    }

    fn spawn(ns: Option<&str>, ip: &str, client: u16, peer: u16, options: &[&str]) -> std::io::Result<EtcdServer> {
        let dir = std::env::temp_dir().join(format!("tiercel-etcd-{}-{client}-{ip}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (client_url, peer_url) = (format!("http://{ip}:{client}"), format!("http://{ip}:{peer}"));
        let mut command = match ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "etcd"]);
                c
            }
            None => Command::new("etcd"),
        };
        let child = command
            .args(["--name", "tiercel-test", "--data-dir"])
            .arg(&dir)
            .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("tiercel-test={peer_url}")])
            .args(["--logger", "zap", "--log-level", "error"])
            .args(options)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                std::io::Error::new(e.kind(), format!("cannot start etcd (Debian package etcd-server): {e}"))
            })?;
        Ok(EtcdServer { child, dir, client_addr: format!("{ip}:{client}") })
    }

    /// POSTs `body` (JSON) to `path` of its JSON gateway, with `token` if given (a user's, once
    /// authentication is on): the answer's body, or its status and body when it is not a success.
    pub fn post(&self, path: &str, body: &str, token: Option<&str>) -> Result<String, String> {
        use std::io::{Read as _, Write as _};
        let mut c = std::net::TcpStream::connect(&self.client_addr).map_err(|e| e.to_string())?;
        c.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
        let auth = token.map(|t| format!("Authorization: {t}\r\n")).unwrap_or_default();
        let request = format!(
            "POST {path} HTTP/1.0\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        c.write_all(request.as_bytes()).map_err(|e| e.to_string())?;
        let mut answer = String::new();
        c.read_to_string(&mut answer).map_err(|e| e.to_string())?;
        let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
        match head.split_whitespace().nth(1) {
            Some("200") => Ok(body.to_owned()),
            status => Err(format!("{path}: {} {body}", status.unwrap_or("?"))),
        }
    }

    /// The registry spec of this etcd, with leases of `ttl_secs`.
    pub fn registry(&self, ttl_secs: u64) -> String {
        format!("etcd://{}?ttl={ttl_secs}", self.client_addr)
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
