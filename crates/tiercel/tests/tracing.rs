//! Tracing spans (crate feature `tracing`): a call and the procedure it runs are linked by trace
//! and span ids, across a chain of two servers (an async procedure that calls another server), on
//! both transports.
#![cfg(all(feature = "tracing", feature = "async"))]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tiercel::{Client, Server};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

#[tiercel::interface]
pub trait Hop {
    fn add(&self, a: u64, b: u64) -> u64;
    /// Adds through the next server.
    async fn relay(&self, a: u64, b: u64) -> Result<u64, String>;
}

struct Back;

impl Hop for Back {
    fn add(&self, a: u64, b: u64) -> u64 {
        a + b
    }
    async fn relay(&self, a: u64, b: u64) -> Result<u64, String> {
        Ok(a + b)
    }
}

struct Front {
    next: HopAsyncClient,
}

impl Hop for Front {
    fn add(&self, a: u64, b: u64) -> u64 {
        a + b
    }
    async fn relay(&self, a: u64, b: u64) -> Result<u64, String> {
        self.next.add(a, b).await.map_err(|e| e.to_string())
    }
}

/// A closed span: its name and fields.
#[derive(Debug, Clone)]
struct Closed {
    name: &'static str,
    fields: HashMap<String, String>,
}

#[derive(Default)]
struct Fields(HashMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_string(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
}

/// Keeps every closed span with the fields it ended with.
struct Recorder(Arc<Mutex<Vec<Closed>>>);

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &tracing::span::Attributes<'_>, id: &tracing::span::Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }
    fn on_record(&self, id: &tracing::span::Id, values: &tracing::span::Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if let Some(fields) = span.extensions_mut().get_mut::<Fields>() {
                values.record(fields);
            }
        }
    }
    fn on_close(&self, id: tracing::span::Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(&id) {
            let fields = span.extensions().get::<Fields>().map(|f| f.0.clone()).unwrap_or_default();
            self.0.lock().unwrap().push(Closed { name: span.name(), fields });
        }
    }
}

#[test]
fn a_call_and_the_procedures_it_runs_share_one_trace_across_two_servers() {
    let spans = Arc::new(Mutex::new(Vec::new()));
    let subscriber = tracing_subscriber::registry().with(Recorder(spans.clone()));
    tracing::subscriber::set_global_default(subscriber).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let back = Server::bind("127.0.0.1:0").unwrap().export(HopServer::new(Back)).start().unwrap();
    let next: HopAsyncClient =
        runtime.block_on(Client::connect(format!("udp://{}", back.addr())).unwrap().import_async()).unwrap();
    let front = Server::bind("127.0.0.1:0").unwrap().export(HopServer::new(Front { next })).start().unwrap();
    for (scheme, transport) in [("udp://", "udp"), ("shm:", "shm")] {
        spans.lock().unwrap().clear();
        let client: HopClient = Client::connect(format!("{scheme}{}", front.addr())).unwrap().import().unwrap();
        assert_eq!(client.relay(40, 2).unwrap(), Ok(42));
        // The server spans close after the result is sent: give them a moment.
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while spans.lock().unwrap().len() < 4 {
            assert!(std::time::Instant::now() < give_up, "{:?}", spans.lock().unwrap());
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let all = spans.lock().unwrap().clone();
        let find = |name: &str, procedure: &str| {
            let found: Vec<&Closed> = all
                .iter()
                .filter(|s| s.name == name && s.fields.get("procedure").is_some_and(|p| p == procedure))
                .collect();
            assert_eq!(found.len(), 1, "one {name} {procedure} in {all:?}");
            found[0].fields.clone()
        };
        let call = find("tiercel.call", "relay");
        let served = find("tiercel.serve", "relay");
        let inner_call = find("tiercel.call", "add");
        let inner_served = find("tiercel.serve", "add");
        let trace = &call["trace_id"];
        assert_eq!(trace.len(), 32, "{call:?}");
        for s in [&served, &inner_call, &inner_served] {
            assert_eq!(&s["trace_id"], trace, "one trace: {all:?}");
        }
        assert_eq!(served["parent_id"], call["span_id"], "the server's span is the client's child");
        assert_eq!(inner_served["parent_id"], inner_call["span_id"]);
        assert_ne!(inner_call["span_id"], served["span_id"]);
        assert_eq!(call["transport"], transport);
        assert_eq!(served["transport"], transport);
        assert_eq!(inner_call["transport"], "udp");
        assert_eq!(call["outcome"], "ok");
        // Recorded as a count (over UDP a thread's first call is sent again after its address is
        // proven, and a loaded machine may resend the call while the relay waits on the next
        // server: the count is not fixed).
        assert!(call["retransmissions"].parse::<u64>().is_ok(), "{call:?}");
        assert_eq!(served["outcome"], "Ok");
        assert_eq!(call["interface"], "Hop");
    }
    drop(front);
    drop(back);
}
