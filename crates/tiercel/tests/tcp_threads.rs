//! A TCP binding's threads: one while its calls are quick, more while slow ones run (so that they
//! hold up only their own callers), and back to one when the extra ones have had nothing to do for
//! a while. Alone in its test binary: it counts this process's threads.

use std::time::{Duration, Instant};

use tiercel::{Client, Server};
use tiercel_seeds::{SeedTest, TestClient, TestServer};

/// Threads of this process serving TCP bindings (thread names are cut to 15 bytes).
fn binding_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == "tiercel-tcp-bin")
        .count()
}

#[test]
fn extra_threads_come_for_slow_calls_and_go_when_idle() {
    let server = Server::bind("127.0.0.1:0").unwrap().export(TestServer::new(SeedTest)).start().unwrap();
    let client: TestClient = Client::connect(format!("tcp://{}", server.addr())).unwrap().import().unwrap();
    for i in 0..1000 {
        assert_eq!(client.add(i, 1).unwrap(), i + 1);
    }
    assert_eq!(binding_threads(), 1, "quick calls, one thread");
    let slow: Vec<_> = (0..3)
        .map(|_| {
            let client = client.clone();
            std::thread::spawn(move || client.work(500_000))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(client.add(1, 1).unwrap(), 2);
    let during = binding_threads();
    for s in slow {
        s.join().unwrap().unwrap();
    }
    assert!(during >= 3, "{during} threads while three slow calls ran and a quick one was answered");
    assert!(during <= tiercel::ServerConfig::default().workers, "{during} threads: more than `workers`");
    let give_up = Instant::now() + Duration::from_secs(15);
    while binding_threads() > 1 {
        assert!(Instant::now() < give_up, "{} threads still, idle", binding_threads());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(client.add(2, 2).unwrap(), 4);
    drop(server);
}
