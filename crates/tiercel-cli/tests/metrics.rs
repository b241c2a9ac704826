//! `tiercel serve --metrics ADDR`, scraped with a real HTTP client as Prometheus would: the
//! per-procedure counters and latency histograms match the calls made, over either transport.

use std::process::{Command, Stdio};

use tiercel::Client;
use tiercel_bench::seeds::TestClient;

mod common;

use common::TIERCEL;

/// The value of the sample `name{labels}` in a Prometheus text exposition.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let (n, rest) = series.split_once('{').unwrap_or((series, "}"));
        let ok = n == name && labels.iter().all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")));
        ok.then(|| value.parse().ok()).flatten()
    })
}

#[test]
fn a_scrape_shows_the_calls_made_per_procedure() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let metrics = format!("127.0.0.1:{port}");
    let child = Command::new(TIERCEL)
        .args(["serve", "--addr", "udp://127.0.0.1:0", "--metrics", &metrics])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let served = common::collect(child);
    let addr = served.addr.trim_start_matches("udp://").to_string();
    for scheme in ["udp://", ""] {
        let client: TestClient = Client::connect(format!("{scheme}{addr}")).unwrap().import().unwrap();
        for _ in 0..20 {
            client.null().unwrap();
        }
        for i in 0..3 {
            assert_eq!(client.add(i, 1).unwrap(), i + 1);
        }
    }
    let text = ureq::get(&format!("http://{metrics}/metrics")).call().unwrap().into_body().read_to_string().unwrap();
    let calls = |procedure| sample(&text, "tiercel_server_calls_total", &[("procedure", procedure), ("outcome", "ok")]);
    assert_eq!(calls("null"), Some(40.0), "{text}");
    assert_eq!(calls("add"), Some(6.0), "{text}");
    assert_eq!(
        sample(&text, "tiercel_server_call_seconds_count", &[("procedure", "null")]),
        Some(40.0),
        "every run of null is in its histogram: {text}"
    );
    assert_eq!(
        sample(&text, "tiercel_server_call_seconds_bucket", &[("procedure", "null"), ("le", "+Inf")]),
        Some(40.0),
        "{text}"
    );
}
