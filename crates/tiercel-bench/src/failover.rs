//! Failover by name: the helper roles of the test that kills one of several exporters of a name
//! while clients call it (`crates/tiercel-cli/tests/failover.rs`).
//!
//! The servers export [`Journal`]: each call appends its id to the server's journal file (one
//! 8-byte `write` to a file opened for appending, done before the result is sent, so a server
//! killed at any moment leaves every id it ran in its file). The client runs threads that each
//! import the name with `ClientConfig::rebind` on and call with ids no other call uses, and writes
//! every call's outcome, so that the test can check that no id ran twice, that every call that
//! succeeded ran exactly once where its result says, and that every failure said truly whether the
//! call may have run.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tiercel::names::Registry;
use tiercel::{Client, ClientConfig, Execution, Server, Timing};

/// The interface the failover test calls.
#[tiercel::interface]
pub trait Journal {
    /// Records `id` as run on this server; returns the server's tag.
    fn run(&self, id: u64) -> u32;
}

struct JournalImpl {
    tag: u32,
    file: Mutex<std::fs::File>,
}

impl Journal for JournalImpl {
    fn run(&self, id: u64) -> u32 {
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        // Recorded before the result goes out; a failed write must not look like a run.
        if let Err(e) = file.write_all(&id.to_le_bytes()) {
            panic!("journal write failed: {e}");
        }
        self.tag
    }
}

/// Options of the journal server role.
#[derive(clap::Args)]
pub struct ServerArgs {
    /// Address to listen on.
    #[arg(long)]
    addr: String,
    /// Name to export under.
    #[arg(long)]
    name: String,
    /// Registry of the name.
    #[arg(long)]
    registry: String,
    /// The server's tag, returned by every call.
    #[arg(long)]
    tag: u32,
    /// The journal file.
    #[arg(long)]
    journal: std::path::PathBuf,
}

/// Serves [`Journal`] under a name until killed. Retries registering (for up to 30 s) while the
/// registry does not answer yet; prints `listening …` once registered.
pub fn server(args: ServerArgs) -> crate::Result<()> {
    let registry = Registry::parse(&args.registry).map_err(tiercel::ServerError::from)?;
    let file = std::fs::OpenOptions::new().create(true).append(true).open(&args.journal)?;
    let give_up = Instant::now() + Duration::from_secs(30);
    let server = loop {
        let journal = JournalImpl { tag: args.tag, file: Mutex::new(file.try_clone()?) };
        let started = Server::bind(args.addr.as_str())
            .map_err(crate::Error::from)?
            .with_registry(registry.clone())
            .export_as(&args.name, JournalServer::new(journal))
            .start();
        match started {
            Ok(server) => break server,
            Err(tiercel::ServerError::Name(_)) if Instant::now() < give_up => {
                std::thread::sleep(Duration::from_millis(200))
            }
            Err(e) => return Err(e.into()),
        }
    };
    let _ = writeln!(std::io::stdout(), "listening udp://{}", server.addr());
    let _ = std::io::stdout().flush();
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// Options of the journal client role.
#[derive(clap::Args)]
pub struct ClientArgs {
    /// Name to import.
    #[arg(long)]
    name: String,
    /// Registry of the name.
    #[arg(long)]
    registry: String,
    /// Caller threads, each with a binding of its own.
    #[arg(long, default_value_t = 4)]
    threads: u64,
    /// How long to call.
    #[arg(long)]
    seconds: f64,
    /// `dead_after` of the bindings, milliseconds.
    #[arg(long, default_value_t = 1000)]
    dead_after_ms: u64,
}

/// One call's outcome, a JSON line on stdout.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone)]
pub struct Outcome {
    /// The call's id (unique over all threads).
    pub id: u64,
    /// The caller thread.
    pub thread: u64,
    /// When the call ended, milliseconds since the client started calling.
    pub at_ms: f64,
    /// The tag of the server that answered, if the call succeeded.
    pub tag: Option<u32>,
    /// For a failed call: `"never ran"`, `"may have run"` or `"ran"`.
    pub failure: Option<String>,
}

/// Calls `name` from several threads for a while, printing every outcome as a JSON line, then
/// `done`. Waits (up to 30 s) for the name to have exporters before starting.
pub fn client(args: ClientArgs) -> crate::Result<()> {
    let registry = Registry::parse(&args.registry).map_err(tiercel::BindError::from)?;
    let timing = Timing { dead_after: Duration::from_millis(args.dead_after_ms), ..Timing::default() };
    let config = ClientConfig { rebind: true, timing, ..ClientConfig::default() };
    let give_up = Instant::now() + Duration::from_secs(30);
    let client = Client::connect(args.name.as_str()).map_err(tiercel::Error::from)?;
    let import =
        || client.clone().with_config(config.clone()).with_registry(registry.clone()).import::<JournalClient>();
    let clients: Vec<JournalClient> = (0..args.threads)
        .map(|_| loop {
            match import() {
                Ok(c) => break Ok(c),
                Err(_) if Instant::now() < give_up => std::thread::sleep(Duration::from_millis(100)),
                Err(e) => break Err(crate::Error::from(e)),
            }
        })
        .collect::<crate::Result<_>>()?;
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let handles: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(t, client)| {
            let (out, stop, threads) = (out.clone(), stop.clone(), args.threads);
            std::thread::spawn(move || {
                let mut id = t as u64;
                while !stop.load(Ordering::Relaxed) {
                    let outcome = client.run(id);
                    let line = Outcome {
                        id,
                        thread: t as u64,
                        at_ms: start.elapsed().as_secs_f64() * 1e3,
                        tag: outcome.as_ref().ok().copied(),
                        failure: outcome.as_ref().err().map(|e| {
                            match e.execution() {
                                Execution::NeverRan => "never ran",
                                Execution::MayHaveRun => "may have run",
                                Execution::Ran => "ran",
                            }
                            .to_string()
                        }),
                    };
                    let text = serde_json::to_string(&line).unwrap_or_default();
                    let _ = writeln!(out.lock().unwrap_or_else(|p| p.into_inner()), "{text}");
                    if outcome.is_err() {
                        // While no server can be bound, failures come at once.
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    id += threads;
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(args.seconds));
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().map_err(|_| "a caller thread panicked".to_string())?;
    }
    let mut out = out.lock().unwrap_or_else(|p| p.into_inner());
    let _ = writeln!(out, "done");
    let _ = out.flush();
    Ok(())
}
