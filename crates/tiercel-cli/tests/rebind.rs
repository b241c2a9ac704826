//! A local `tiercel serve` killed with SIGKILL and started again at the same address: a binding
//! with `ClientConfig::rebind` carries on by itself, back on shared memory, with every failed call
//! reported as "may have run" (the one the kill caught) or "never ran" (while nobody listened).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tiercel::{CallError, Client, ClientConfig, Execution, Timing, Transport};
use tiercel_bench::seeds::TestClient;

mod common;

use common::{collect, Served, TIERCEL};

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
