//! The lines of the cost ledger: a Null call through one binding on each transport, with each
//! optional piece of tiercel switched on in turn, every server in this process on CPU 1 with its
//! default settings. Shared by the ledger's table (`examples/ledger.rs`) and its criterion group
//! (`benches/ledger.rs`); which lines a build has depends on the crate features it was built with.

use std::time::Duration;

use tiercel::{
    Binding, CallInfo, Client, ClientConfig, ClientInterceptor, OutgoingCall, RunningServer, Secret, Server,
    ServerConfig,
};
use tiercel_seeds::{SeedTest, TestClient, TestServer};

/// The transports a line goes over, by the scheme of its address.
pub const TRANSPORTS: [(&str, &str); 3] = [("udp", "udp://"), ("shm", "shm:"), ("tcp", "tcp://")];

/// An optional piece of tiercel, switched on for a line (or `Plain`: nothing on).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Piece {
    /// The call as a user gets it with default settings.
    Plain,
    /// `Binding::with_deadline`: the call carries a deadline in a context block.
    Deadline,
    /// `ClientConfig::checksum`: every packet ends with a CRC32C.
    Checksum,
    /// `ClientConfig::secret` and `ServerConfig::secret`: both sides hold a shared secret.
    Secret,
    /// `ClientConfig::rebind`: the binding binds again by itself when the server goes.
    Rebind,
    /// `Server::intercept` and `Client::intercept`: each side's interceptor looks at every call
    /// (the server's at its caller too) and lets it through.
    Intercept,
    /// `ServerConfig::key` and `ClientConfig::server_key`: a secure binding, every packet sealed
    /// over UDP and every frame over TCP (through shared memory, a binding whose rendezvous came
    /// sealed).
    Secure,
    /// `ClientConfig::metrics` and `ServerConfig::metrics`, with a Prometheus recorder installed
    /// (feature `metrics`).
    Metrics,
    /// `tiercel::steps::enable(true)`: the step timestamps `tiercel explain` reads (feature `explain`).
    Explain,
    /// The same call through the async stub, from a current-thread tokio runtime (feature `async`).
    Async,
}

impl Piece {
    /// Every piece this build can switch on, `Plain` first.
    pub fn available() -> Vec<Piece> {
        let mut pieces = vec![
            Piece::Plain,
            Piece::Deadline,
            Piece::Checksum,
            Piece::Secret,
            Piece::Rebind,
            Piece::Intercept,
            Piece::Secure,
        ];
        if cfg!(feature = "metrics") {
            pieces.push(Piece::Metrics);
        }
        if cfg!(feature = "explain") {
            pieces.push(Piece::Explain);
        }
        if cfg!(feature = "async") {
            pieces.push(Piece::Async);
        }
        pieces
    }

    /// The line's name in the ledger.
    pub fn name(self) -> &'static str {
        match self {
            Piece::Plain => "plain",
            Piece::Deadline => "deadline",
            Piece::Checksum => "checksum",
            Piece::Secret => "secret",
            Piece::Rebind => "rebind",
            Piece::Intercept => "intercept",
            Piece::Secure => "secure",
            Piece::Metrics => "metrics",
            Piece::Explain => "explain",
            Piece::Async => "async",
        }
    }
}

/// One line: a binding to its server, and how to make its call.
pub struct Line {
    pub piece: Piece,
    pub transport: &'static str,
    client: TestClient,
    #[cfg(feature = "async")]
    asynch: Option<(tokio::runtime::Runtime, tiercel_seeds::TestAsyncClient)>,
}

impl Line {
    /// Switches on what the line needs for the time of its calls (the explain recording).
    pub fn begin(&self) {
        #[cfg(feature = "explain")]
        if self.piece == Piece::Explain {
            tiercel::steps::enable(true);
        }
    }

    /// Switches off what [`Line::begin`] switched on.
    pub fn end(&self) {
        #[cfg(feature = "explain")]
        if self.piece == Piece::Explain {
            tiercel::steps::enable(false);
            tiercel::steps::reset();
        }
    }

    /// One Null call of the line.
    #[inline]
    pub fn call(&self) {
        #[cfg(feature = "async")]
        if let Some((runtime, client)) = &self.asynch {
            runtime.block_on(client.null()).expect("async Null");
            return;
        }
        self.client.null().expect("Null");
    }
}

/// The servers of the ledger's lines and the lines themselves, for every transport and every piece
/// this build has.
pub struct Lines {
    pub lines: Vec<Line>,
    _servers: Vec<RunningServer>,
}

/// The secret of the `secret` lines.
fn secret() -> Secret {
    Secret::new(b"the ledger's secret, 32 bytes..").expect("a 32-byte secret")
}

/// The server key of the `secure` lines.
fn key() -> tiercel::Identity {
    tiercel::Identity::from_private(&[7; 32]).expect("a 32-byte private key")
}

/// Starts a server on CPU 1 with its default settings (and the secret, key or metrics a piece asks
/// for).
fn serve(piece: Piece) -> RunningServer {
    let config = ServerConfig {
        cpus: vec![1],
        secret: (piece == Piece::Secret).then(secret),
        key: (piece == Piece::Secure).then(key),
        metrics: piece == Piece::Metrics,
        ..ServerConfig::default()
    };
    let server = Server::bind("udp://127.0.0.1:0").expect("bind a server").with_config(config);
    let server = match piece {
        Piece::Intercept => server.intercept(|call: &CallInfo| match call.caller {
            Some(_) => Ok(()),
            None => Err("who is this?".to_owned()),
        }),
        _ => server,
    };
    server.export(TestServer::new(SeedTest)).start().expect("start a server")
}

impl Lines {
    /// Starts the servers and makes every line's binding (or only `plain`'s) over each of
    /// `transports` (names of [`TRANSPORTS`]). With the `metrics` line, a Prometheus recorder is
    /// installed for the whole process first (it records only for the bindings and servers that ask
    /// for metrics).
    pub fn new(transports: &[&str], plain_only: bool) -> Lines {
        let mut pieces = Piece::available();
        if plain_only {
            pieces.truncate(1);
        }
        #[cfg(feature = "metrics")]
        if pieces.contains(&Piece::Metrics) {
            metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder().expect("install a recorder");
        }
        let servers: Vec<(Piece, RunningServer)> = pieces
            .iter()
            .filter(|p| matches!(p, Piece::Plain | Piece::Secret | Piece::Metrics | Piece::Intercept | Piece::Secure))
            .map(|&p| (p, serve(p)))
            .collect();
        let server_of = |piece: Piece| {
            let own = matches!(piece, Piece::Secret | Piece::Metrics | Piece::Intercept | Piece::Secure);
            let wanted = if own { piece } else { Piece::Plain };
            servers.iter().find(|(p, _)| *p == wanted).map(|(_, s)| s.addr()).expect("a server for every piece")
        };
        let mut lines = Vec::new();
        for (transport, scheme) in TRANSPORTS.into_iter().filter(|(t, _)| transports.contains(t)) {
            for &piece in &pieces {
                let config = ClientConfig {
                    server_key: (piece == Piece::Secure).then(|| key().public()),
                    checksum: piece == Piece::Checksum,
                    secret: (piece == Piece::Secret).then(secret),
                    rebind: piece == Piece::Rebind,
                    metrics: piece == Piece::Metrics,
                    interceptor: (piece == Piece::Intercept).then(|| {
                        ClientInterceptor::new(|call: &OutgoingCall| match call.procedure {
                            "" => Err("no procedure".to_owned()),
                            _ => Ok(()),
                        })
                    }),
                    ..ClientConfig::default()
                };
                let binding: Binding = Client::connect(format!("{scheme}{}", server_of(piece)))
                    .expect("an address")
                    .with_config(config)
                    .import_info(<TestClient as tiercel::Import>::INFO)
                    .expect("bind");
                let binding =
                    if piece == Piece::Deadline { binding.with_deadline(Duration::from_secs(10)) } else { binding };
                let client = <TestClient as tiercel::Import>::from_binding(binding);
                #[cfg(feature = "async")]
                let asynch = (piece == Piece::Async).then(|| {
                    let runtime =
                        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
                    let asynch = client.to_async();
                    (runtime, asynch)
                });
                lines.push(Line {
                    piece,
                    transport,
                    client,
                    #[cfg(feature = "async")]
                    asynch,
                });
            }
        }
        Lines { lines, _servers: servers.into_iter().map(|(_, s)| s).collect() }
    }
}
