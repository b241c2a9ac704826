//! One trace across two processes: `tiercel call --trace` and `tiercel serve --trace` print the
//! spans of the same call with the same trace id, the server's a child of the client's.

mod common;

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::TIERCEL;

/// The fields of the span line named `name` in `text` (`name{k=v k="v" ...}: close ...`).
fn span_fields(text: &str, name: &str) -> Vec<HashMap<String, String>> {
    text.lines()
        .filter_map(|l| l.split_once(&format!(" {name}{{"))?.1.split_once("}: close").map(|(f, _)| f.to_string()))
        .map(|fields| {
            fields
                .split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
                .collect()
        })
        .collect()
}

#[test]
fn a_traced_call_and_the_procedure_it_ran_share_a_trace_across_processes() {
    let dir = std::env::temp_dir().join(format!("tiercel-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("serve.err");
    let child = Command::new(TIERCEL)
        .args(["serve", "--addr", "udp://127.0.0.1:0", "--trace"])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let served = common::collect(child);
    let host_port = served.addr.strip_prefix("udp://").unwrap().to_string();
    for (addr, transport) in [(host_port.clone(), "shm"), (served.addr.clone(), "udp")] {
        let out = Command::new(TIERCEL).args(["call", &addr, "add", "40", "2", "--trace"]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).contains("add(40, 2) = 42"));
        let calls = span_fields(&String::from_utf8_lossy(&out.stderr), "tiercel.call");
        assert_eq!(calls.len(), 1, "{}", String::from_utf8_lossy(&out.stderr));
        let call = &calls[0];
        assert_eq!(
            (call["procedure"].as_str(), call["transport"].as_str(), call["outcome"].as_str()),
            ("add", transport, "ok")
        );
        // The server writes its span when the procedure has run: wait for the line of this trace.
        let give_up = Instant::now() + Duration::from_secs(10);
        let served_span = loop {
            let text = std::fs::read_to_string(&log).unwrap();
            if let Some(s) = span_fields(&text, "tiercel.serve").into_iter().find(|s| s["trace_id"] == call["trace_id"])
            {
                break s;
            }
            assert!(Instant::now() < give_up, "no server span of trace {} in:\n{text}", call["trace_id"]);
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(served_span["parent_id"], call["span_id"], "the server's span is the client's child");
        assert_eq!((served_span["procedure"].as_str(), served_span["transport"].as_str()), ("add", transport));
        assert_eq!(served_span["outcome"], "Ok");
        assert_eq!(call["trace_id"].len(), 32);
    }
    drop(served);
    let _ = std::fs::remove_dir_all(&dir);
}
