//! Three exporters of one name in network namespaces of their own, registered in a real etcd, and a
//! client of four threads (a binding each, `ClientConfig::rebind` on) in a fourth namespace; one
//! exporter is killed with SIGKILL mid-run. Every call's id is journaled by the server that runs
//! it, so the test checks at-most-once across servers: no id ran twice, every call that succeeded
//! ran exactly once and on the server its result names, no call reported "never ran" ran, and the
//! bindings on the killed server moved to the others, each losing at most the one call the kill
//! caught. Prints the re-bind time of each moved binding and the calls lost.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use tiercel_bench::etcd::EtcdServer;
use tiercel_bench::failover::Outcome;
use tiercel_bench::helpers::HELPER_ENV;
use tiercel_bench::netns::{Hub, HUB_CLIENT_IP};

const TIERCEL: &str = env!("CARGO_BIN_EXE_tiercel");

/// The leases' time to live, seconds.
const TTL: u64 = 2;
/// The client bindings' `dead_after`, milliseconds.
const DEAD_AFTER_MS: u64 = 1000;

/// This program's `tiercel` binary as a helper in namespace `ns`.
fn helper(ns: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, TIERCEL]).env(HELPER_ENV, "1");
    c
}

/// A server process, killed with SIGKILL when dropped.
struct Killed(Option<Child>);

impl Drop for Killed {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[test]
fn calls_move_to_the_live_exporters_when_one_is_killed_and_none_runs_twice() {
    tiercel_seeds::needs!(ROOT, IP, ETCD);
    let hub = Hub::new(3).unwrap();
    let dir = std::env::temp_dir().join(format!("tiercel-failover-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let etcd = EtcdServer::start_in(&hub.client, HUB_CLIENT_IP).unwrap();
    let registry = etcd.registry(TTL);

    let mut servers: Vec<Killed> = Vec::new();
    for (i, ns) in hub.servers.iter().enumerate() {
        let mut child = helper(ns)
            .args(["journal-server", "--name", "ledger", "--registry", &registry, "--tag", &i.to_string()])
            .args(["--addr", &format!("udp://{}:7000", Hub::server_ip(i))])
            .arg("--journal")
            .arg(dir.join(format!("journal-{i}")))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
        assert!(first.starts_with("listening"), "server {i}: {first:?}");
        servers.push(Killed(Some(child)));
    }

    let seconds = 6.0;
    let mut client = helper(&hub.client)
        .args(["journal-client", "--name", "ledger", "--registry", &registry, "--threads", "4"])
        .args(["--seconds", &seconds.to_string(), "--dead-after-ms", &DEAD_AFTER_MS.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(client.stdout.take().unwrap()).lines().map_while(Result::ok);
    // Once the calls are well under way, kill the server that thread 0's binding is on.
    let mut lines = Vec::new();
    let victim = loop {
        let line = out.next().expect("the client prints an outcome per call");
        let o: Outcome = serde_json::from_str(&line).unwrap();
        lines.push(line);
        if o.thread == 0 && o.at_ms > 2000.0 {
            break o.tag.expect("no failure before the kill") as usize;
        }
    };
    let killed_at = Instant::now();
    drop(std::mem::replace(&mut servers[victim], Killed(None)));
    lines.extend(out);
    assert!(client.wait().unwrap().success());
    assert_eq!(lines.last().map(String::as_str), Some("done"), "the client finished");
    let outcomes: Vec<Outcome> = lines[..lines.len() - 1].iter().map(|l| serde_json::from_str(l).unwrap()).collect();
    drop(servers);

    // What each server ran, from its journal.
    let mut ran: HashMap<u64, Vec<u32>> = HashMap::new();
    for i in 0..hub.servers.len() as u32 {
        let bytes = std::fs::read(dir.join(format!("journal-{i}"))).unwrap();
        for id in bytes.chunks_exact(8) {
            ran.entry(u64::from_le_bytes(id.try_into().unwrap())).or_default().push(i);
        }
    }
    let mut by_thread: HashMap<u64, Vec<&Outcome>> = HashMap::new();
    for o in &outcomes {
        by_thread.entry(o.thread).or_default().push(o);
        let runs = ran.get(&o.id).map_or(&[][..], Vec::as_slice);
        match (&o.tag, o.failure.as_deref()) {
            (Some(tag), None) => assert_eq!(runs, &[*tag][..], "call {} succeeded: ran once, on server {tag}", o.id),
            (None, Some("may have run")) => assert!(runs.len() <= 1, "call {} ran {} times", o.id, runs.len()),
            (None, Some("never ran")) => assert!(runs.is_empty(), "call {} said never ran, and ran", o.id),
            other => panic!("call {}: unexpected outcome {other:?}", o.id),
        }
    }
    assert!(ran.values().all(|servers| servers.len() == 1), "no id ran twice");
    let ids: std::collections::HashSet<u64> = outcomes.iter().map(|o| o.id).collect();
    assert!(ran.keys().all(|id| ids.contains(id)), "every id run was called");

    // The bindings on the killed server: failures, then calls on the others.
    let mut moved = 0;
    let total_failed = outcomes.iter().filter(|o| o.failure.is_some()).count();
    let killed_tag = Some(victim as u32);
    for (thread, calls) in &by_thread {
        let Some(first_failure) = calls.iter().position(|o| o.failure.is_some()) else { continue };
        moved += 1;
        assert!(
            first_failure > 0 && calls[first_failure - 1].tag == killed_tag,
            "thread {thread} failed on the killed server"
        );
        let resumed =
            calls[first_failure..].iter().position(|o| o.tag.is_some()).expect("thread resumed") + first_failure;
        let may_have_run =
            calls[first_failure..resumed].iter().filter(|o| o.failure.as_deref() == Some("may have run")).count();
        assert!(may_have_run <= 1, "thread {thread}: {may_have_run} calls may have run");
        assert!(
            calls[resumed..].iter().all(|o| o.tag.is_some() && o.tag != killed_tag),
            "thread {thread} stays on live servers"
        );
        let rebind_ms = calls[resumed].at_ms - calls[first_failure - 1].at_ms;
        eprintln!(
            "thread {thread}: last call on the killed server to the first on server {}: {rebind_ms:.0} ms, {} calls failed ({may_have_run} may have run)",
            calls[resumed].tag.unwrap_or_default(),
            resumed - first_failure
        );
    }
    assert!(moved >= 1, "thread 0's binding was on the killed server");
    eprintln!(
        "{} calls in {seconds} s, {total_failed} failed; killed {:?} before the client ended",
        outcomes.len(),
        killed_at.elapsed()
    );
    drop(etcd);
    let _ = std::fs::remove_dir_all(&dir);
}
