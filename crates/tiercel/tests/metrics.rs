//! Metrics through the `metrics` facade (feature `metrics`): with a recorder installed before the
//! server starts and the client binds, each procedure's calls are counted on both sides, by
//! outcome, and timed, over either transport; a client with `metrics: false` counts nothing.
#![cfg(feature = "metrics")]

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tiercel::{Client, ClientConfig, Server, ServerConfig};
use tiercel_seeds::{SeedTest, TestClient, TestServer};

/// A metric's name, labels and value.
type Sample = (String, Vec<(String, String)>, DebugValue);

/// The value of counter `name` with exactly these labels, if registered.
fn counter(snapshot: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<u64> {
    snapshot.iter().find_map(|(n, l, v)| {
        let same = labels.iter().all(|(k, want)| l.iter().any(|(lk, lv)| lk == k && lv == want));
        match v {
            DebugValue::Counter(c) if n == name && same && l.len() == labels.len() => Some(*c),
            _ => None,
        }
    })
}

/// Every metric registered, with its value now.
fn snapshot(s: &Snapshotter) -> Vec<Sample> {
    s.snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let labels = key.labels().map(|l| (l.key().to_string(), l.value().to_string())).collect();
            (key.name().to_string(), labels, value)
        })
        .collect()
}

#[test]
fn calls_are_counted_and_timed_per_procedure_on_both_sides() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();
    let server = Server::bind("udp://127.0.0.1:0")
        .unwrap()
        .with_config(ServerConfig { metrics: true, ..ServerConfig::default() })
        .export(TestServer::new(SeedTest))
        .start()
        .unwrap();
    let config = ClientConfig { metrics: true, ..ClientConfig::default() };
    // Five calls over UDP, seven through shared memory, and an add on each.
    for (addr, nulls) in [(format!("udp://{}", server.addr()), 5), (server.addr().to_string(), 7)] {
        let client: TestClient = Client::connect(addr.as_str()).unwrap().with_config(config.clone()).import().unwrap();
        for _ in 0..nulls {
            client.null().unwrap();
        }
        assert_eq!(client.add(2, 3).unwrap(), 5);
    }
    // A client without metrics counts nothing (the server still counts its call).
    let quiet: TestClient = Client::connect(server.addr()).unwrap().import().unwrap();
    quiet.null().unwrap();
    let snap = snapshot(&snapshotter);
    let server_label = server.addr().to_string();
    let on_client = |procedure, outcome| {
        counter(
            &snap,
            "tiercel_client_calls_total",
            &[("interface", "Test"), ("procedure", procedure), ("server", &server_label), ("outcome", outcome)],
        )
    };
    assert_eq!(on_client("null", "ok"), Some(5 + 7), "the clients with metrics counted their calls");
    assert_eq!(on_client("add", "ok"), Some(2));
    let on_server = |procedure, outcome| {
        counter(
            &snap,
            "tiercel_server_calls_total",
            &[("interface", "Test"), ("procedure", procedure), ("outcome", outcome)],
        )
    };
    assert_eq!(on_server("null", "ok"), Some(5 + 7 + 1), "the server counts every call it runs");
    assert_eq!(on_server("add", "ok"), Some(2));
    assert_eq!(on_server("null", "error"), Some(0));
    let timed = snap.iter().find_map(|(n, l, v)| match v {
        DebugValue::Histogram(h) if n == "tiercel_server_call_seconds" && l.iter().any(|(_, v)| v == "null") => {
            Some(h.len())
        }
        _ => None,
    });
    assert_eq!(timed, Some(13), "each run of null was timed");
}
