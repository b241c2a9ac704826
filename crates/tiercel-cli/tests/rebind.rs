//! A local `tiercel serve` killed with SIGKILL and started again at the same address: a binding
//! with `ClientConfig::rebind` carries on by itself, back on shared memory, with every failed call
//! reported as "may have run" (the one the kill caught) or "never ran" (while nobody listened).
//! And a process of another user that takes the killed server's port gets none of those calls.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tiercel::{BindError, CallError, Client, ClientConfig, Execution, Timing, Transport};
use tiercel_bench::seeds::TestClient;

mod common;

use common::{as_nobody, collect, Served, Sticky, NOBODY, TIERCEL};

fn serve(addr: &str) -> Served {
    let child = Command::new(TIERCEL)
        .args(["serve", "--addr", addr, "--workers", "1", "--spin-us", "0"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    collect(child)
}

#[test]
fn a_killed_and_restarted_server_is_bound_again_without_the_applications_help() {
    let mut first = serve("udp://127.0.0.1:0");
    let addr = first.addr.clone();
    let timing = Timing { dead_after: Duration::from_secs(1), ..Timing::default() };
    let config = ClientConfig { rebind: true, timing, ..ClientConfig::default() };
    let client: TestClient =
        Client::connect(addr.trim_start_matches("udp://")).unwrap().with_config(config).import().unwrap();
    assert_eq!(client.binding().transport(), Transport::SharedMemory);
    let before = client.binding().incarnation();
    for i in 0..100 {
        assert_eq!(client.add(i, 1).unwrap(), i + 1);
    }

    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let killed = Instant::now();
    let mut restarted: Option<Served> = None;
    let (mut may_have_run, mut never_ran, mut after) = (0, 0, 0);
    let mut first_success = None;
    while after < 100 {
        match client.add(after, 2) {
            Ok(sum) => {
                assert_eq!(sum, after + 2);
                first_success.get_or_insert_with(|| killed.elapsed());
                after += 1;
            }
            Err(e) => {
                assert!(first_success.is_none(), "a call failed after the binding was made again: {e}");
                match e.execution() {
                    Execution::MayHaveRun => may_have_run += 1,
                    Execution::NeverRan => {
                        assert!(matches!(e, CallError::BindAgain(_)), "{e:?}");
                        never_ran += 1
                    }
                    Execution::Ran => panic!("{e}"),
                }
                // Start the server again once the client has seen it gone.
                if restarted.is_none() && killed.elapsed() > Duration::from_millis(200) {
                    restarted = Some(serve(&addr));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        assert!(killed.elapsed() < Duration::from_secs(30), "never bound again");
    }
    let restarted = restarted.expect("the server was started again");
    assert_eq!(restarted.addr, addr, "same address");
    assert_eq!(client.binding().transport(), Transport::SharedMemory, "back on shared memory");
    assert_ne!(client.binding().incarnation(), before);
    assert_eq!(client.binding().rebinds(), 1);
    assert_eq!(may_have_run, 1, "only the call the kill caught may have run");
    eprintln!(
        "bound again {:?} after SIGKILL; {may_have_run} call may have run, {never_ran} never ran while nobody listened",
        first_success.unwrap()
    );
}

/// Bindings made with `rebind` to a server of this host, over UDP, TCP and a plain address (shared
/// memory), whose server is killed and whose port a process of another user then takes with a
/// `tiercel serve` of its own: no call reaches it, each says it never ran and names the user found;
/// once the impostor goes and the server is back on its port, every binding carries on there.
#[test]
fn a_rebinding_client_never_binds_to_another_users_process_on_its_servers_port() {
    tiercel_seeds::needs!(ROOT);
    let area = Sticky::new("rebind-impostor");
    let mut real = serve("udp://127.0.0.1:0");
    let addr = real.addr.trim_start_matches("udp://").to_string();
    let timing = Timing { dead_after: Duration::from_secs(1), ..Timing::default() };
    let config = ClientConfig { rebind: true, timing, ..ClientConfig::default() };
    let clients: Vec<(String, TestClient)> = [format!("udp://{addr}"), format!("tcp://{addr}"), addr.clone()]
        .into_iter()
        .map(|target| {
            let client = Client::connect(target.as_str()).unwrap().with_config(config.clone()).import().unwrap();
            (target, client)
        })
        .collect();
    assert_eq!(clients[2].1.binding().transport(), Transport::SharedMemory);
    for (_, client) in &clients {
        assert_eq!(client.add(1, 2).unwrap(), 3);
    }

    real.child.kill().unwrap();
    real.child.wait().unwrap();
    let impostor = collect(
        as_nobody(&area.tiercel(), &area.0)
            .args(["serve", "--addr", &format!("udp://{addr}"), "--workers", "1", "--spin-us", "0"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    assert_eq!(impostor.addr, format!("udp://{addr}"), "the impostor took the port");
    for (target, client) in &clients {
        let mut refused = 0;
        let deadline = Instant::now() + Duration::from_secs(20);
        while refused < 3 {
            assert!(Instant::now() < deadline, "{target}: never refused the impostor");
            match client.add(1, 2) {
                Ok(_) => panic!("{target}: a call went to the impostor"),
                Err(CallError::BindAgain(BindError::AnotherOwner { expected, found, .. })) => {
                    assert_eq!((expected, found), (tiercel_sys::process::euid(), Some(NOBODY)), "{target}");
                    refused += 1;
                }
                // The call the kill caught, and those before the binding saw its server gone.
                Err(e) => assert!(!matches!(e.execution(), Execution::Ran), "{target}: {e}"),
            }
        }
        let err = client.add(1, 2).unwrap_err();
        assert_eq!(err.execution(), Execution::NeverRan, "{target}: {err}");
        assert!(err.to_string().contains(&format!("now run by user {NOBODY}")), "{target}: {err}");
    }
    drop(impostor);

    let _back = serve(&format!("udp://{addr}"));
    for (target, client) in &clients {
        let deadline = Instant::now() + Duration::from_secs(20);
        while client.add(1, 2).is_err() {
            assert!(Instant::now() < deadline, "{target}: never bound again to the real server");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(client.add(40, 2).unwrap(), 42, "{target}");
    }
}
