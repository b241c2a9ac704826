//! tiercel's calls through AF_XDP across two network namespaces joined by a veth pair (as root):
//! every procedure of the seeds' interface both ways with the kernel's UDP stack left out (its
//! counters in both namespaces say so), the fallback to the kernel's UDP with the reason when
//! AF_XDP cannot be had, and the XDP program gone from both interfaces once the server and the
//! client are.
#![cfg(feature = "xdp")]

use std::net::SocketAddr;
use std::sync::mpsc;

use tiercel::{Client, InOut, Out, Server, ServerConfig, Transport};
use tiercel_seeds::{
    check, check_all, fill, pattern, SeedTest, TestAsyncClient, TestClient, TestServer, CHECK_CALLS, MAX_BUFFER,
};

mod xdp_common;

use xdp_common::*;

#[test]
fn every_procedure_goes_through_af_xdp_and_the_program_is_gone_once_client_and_server_are() {
    tiercel_seeds::needs!(ROOT, IP, CLANG, LIBBPF);
    let pair = Pair::new();
    let port = tiercel_seeds::free_port();
    let addr: SocketAddr = format!("{}:{port}", pair.server_ip()).parse().unwrap();
    let (status, stop, server) = serve(&pair.a, addr, &pair.va);
    let said = status.expect("the server was given an interface").expect("the server has AF_XDP");
    assert!(said.contains(&pair.va) && said.contains("driver"), "{said}");
    assert!(has_xdp(&pair.a, &pair.va));
    let before = (kernel_udp(&pair.a), kernel_udp(&pair.b));
    const ROUNDS: u32 = 20;
    let (transport, refused, stats) = in_namespace(&pair.b, move || {
        let client: TestClient = Client::connect(format!("xdp://{addr}")).unwrap().import().unwrap();
        let binding = client.binding().clone();
        for round in 0..ROUNDS {
            check_all(&client, round).unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        // After pauses longer than either side spins, both block (the client in `poll` on the
        // station's socket, the server's worker too): each next call wakes them.
        for _ in 0..3 {
            std::thread::sleep(std::time::Duration::from_millis(30));
            assert_eq!(client.add(40, 2).unwrap(), 42);
        }
        // A call and a result of many packets each (64 KiB in frames of one MTU).
        let mut big = vec![0u8; 64 << 10];
        fill(&mut big);
        client.bulk_in_out(tiercel::InOut(&mut big)).unwrap();
        assert!(big.iter().enumerate().all(|(i, &b)| b == pattern(i)), "64 KiB came back changed");
        (binding.transport(), binding.xdp_refused(), binding.stats())
    });
    assert_eq!((transport, refused), (Transport::Xdp, None));
    assert_eq!(stats.malformed, 0, "{stats:?}");
    let after = (kernel_udp(&pair.a), kernel_udp(&pair.b));
    // The bind exchange goes through the client's kernel (a few datagrams); the calls do not.
    let calls = u64::from(ROUNDS) * CHECK_CALLS + 4;
    for (side, (before, after)) in [("server", (before.0, after.0)), ("client", (before.1, after.1))] {
        let (received, sent) = (after.0 - before.0, after.1 - before.1);
        assert!(received <= 4 && sent <= 4, "{side}'s kernel: {received} in, {sent} out, for {calls} calls");
    }
    // The client's thread ended, and with it its endpoint and the binding: its station is gone.
    assert!(!has_xdp(&pair.b, &pair.vb), "the client's program stayed on {}", pair.vb);
    stop.send(()).unwrap();
    server.join().unwrap();
    assert!(!has_xdp(&pair.a, &pair.va), "the server's program stayed on {}", pair.va);
}

#[test]
fn calls_go_through_af_xdp_to_a_server_behind_a_router() {
    tiercel_seeds::needs!(ROOT, IP, CLANG, LIBBPF);
    let net = Routed::new();
    let port = tiercel_seeds::free_port();
    let addr: SocketAddr = format!("{}:{port}", net.server_ip()).parse().unwrap();
    let (status, stop, server) = serve(&net.s, addr, &net.vs);
    assert!(matches!(status, Some(Ok(_))), "{status:?}");
    let before = (kernel_udp(&net.s), kernel_udp(&net.c));
    const ROUNDS: u32 = 10;
    // The client's frames go to the router's hardware address (the gateway of a route that only a
    // rule of the client's finds), and the server's answers, to the address its frames came from
    // (the router's again, on its side).
    let (transport, refused) = in_namespace(&net.c, move || {
        let client: TestClient = Client::connect(format!("xdp://{addr}")).unwrap().import().unwrap();
        for round in 0..ROUNDS {
            check_all(&client, round).unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        let mut big = vec![0u8; 64 << 10];
        fill(&mut big);
        client.bulk_in_out(InOut(&mut big)).unwrap();
        assert!(big.iter().enumerate().all(|(i, &b)| b == pattern(i)), "64 KiB came back changed");
        (client.binding().transport(), client.binding().xdp_refused())
    });
    assert_eq!((transport, refused), (Transport::Xdp, None));
    let after = (kernel_udp(&net.s), kernel_udp(&net.c));
    let calls = u64::from(ROUNDS) * CHECK_CALLS + 1;
    for (side, (before, after)) in [("server", (before.0, after.0)), ("client", (before.1, after.1))] {
        let (received, sent) = (after.0 - before.0, after.1 - before.1);
        assert!(received <= 4 && sent <= 4, "{side}'s kernel: {received} in, {sent} out, for {calls} calls");
    }
    stop.send(()).unwrap();
    server.join().unwrap();
    assert!(!has_xdp(&net.s, &net.vs) && !has_xdp(&net.c, &net.vc));
}

/// Attaches another XDP program (tiercel's, steering nothing) to `dev` in namespace `ns` until the
/// sender returned is used or dropped.
fn hold(ns: &str, dev: &str) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (ns, dev) = (ns.to_owned(), dev.to_owned());
    let (release, released) = mpsc::channel::<()>();
    let (held_tx, held) = mpsc::channel();
    let holder = std::thread::spawn(move || {
        enter(&ns);
        let steering = tiercel_sys::xdp::Steering::attach(&dev).unwrap();
        held_tx.send(()).unwrap();
        let _ = released.recv();
        drop(steering);
    });
    held.recv().unwrap();
    (release, holder)
}

#[test]
fn without_af_xdp_a_binding_and_a_server_use_the_kernels_udp_and_say_why() {
    tiercel_seeds::needs!(ROOT, IP, CLANG, LIBBPF);
    let pair = Pair::new();
    // Another program holds each interface's hook: tiercel's cannot be attached there.
    let holders = [hold(&pair.a, &pair.va), hold(&pair.b, &pair.vb)];
    let port = tiercel_seeds::free_port();
    let addr: SocketAddr = format!("{}:{port}", pair.server_ip()).parse().unwrap();
    let (status, stop, server) = serve(&pair.a, addr, &pair.va);
    let why = status.expect("the server was given an interface").expect_err("the interface was taken");
    assert!(why.contains(&pair.va), "{why}");
    let (transport, refused) = in_namespace(&pair.b, move || {
        let client: TestClient = Client::connect(format!("xdp://{addr}")).unwrap().import().unwrap();
        check_all(&client, 0).unwrap();
        (client.binding().transport(), client.binding().xdp_refused())
    });
    assert_eq!(transport, Transport::Udp);
    let why = refused.expect("a reason");
    assert!(why.contains(&pair.vb), "{why}");
    for (release, holder) in holders {
        release.send(()).unwrap();
        holder.join().unwrap();
    }
    stop.send(()).unwrap();
    server.join().unwrap();
    assert!(!has_xdp(&pair.a, &pair.va) && !has_xdp(&pair.b, &pair.vb));

    // A server on loopback: no AF_XDP path to it, and the binding says so.
    let server = Server::bind("127.0.0.1:0").unwrap().export(TestServer::new(SeedTest)).start().unwrap();
    let client: TestClient = Client::connect(format!("xdp://{}", server.addr())).unwrap().import().unwrap();
    check_all(&client, 1).unwrap();
    assert_eq!(client.binding().transport(), Transport::Udp);
    let why = client.binding().xdp_refused().expect("a reason");
    assert!(why.contains("loopback"), "{why}");
}

#[test]
fn a_client_through_af_xdp_calls_a_server_without_it_and_back() {
    tiercel_seeds::needs!(ROOT, IP, CLANG, LIBBPF);
    let pair = Pair::new();
    let port = tiercel_seeds::free_port();
    let addr: SocketAddr = format!("{}:{port}", pair.server_ip()).parse().unwrap();
    // The server's kernel takes the client's frames, and sends the results the usual way; the
    // client's program steers them to its socket.
    let (status, stop, server) = serve_plain(&pair.a, addr);
    assert_eq!(status, None);
    let (transport, refused) = in_namespace(&pair.b, move || {
        let client: TestClient = Client::connect(format!("xdp://{addr}")).unwrap().import().unwrap();
        for round in 0..5 {
            check_all(&client, round).unwrap();
        }
        (client.binding().transport(), client.binding().xdp_refused())
    });
    assert_eq!((transport, refused), (Transport::Xdp, None));
    stop.send(()).unwrap();
    server.join().unwrap();
}

#[test]
fn eight_threads_on_one_secure_binding_call_through_af_xdp_at_once() {
    tiercel_seeds::needs!(ROOT, IP, CLANG, LIBBPF);
    let pair = Pair::new();
    let port = tiercel_seeds::free_port();
    let addr: SocketAddr = format!("{}:{port}", pair.server_ip()).parse().unwrap();
    let key = tiercel::Identity::generate().unwrap();
    let config = ServerConfig { xdp: Some(pair.va.clone()), key: Some(key.clone()), ..ServerConfig::default() };
    let (status, stop, server) = serve_with(&pair.a, addr, config);
    assert!(matches!(status, Some(Ok(_))), "{status:?}");
    let before = (kernel_udp(&pair.a), kernel_udp(&pair.b));
    const THREADS: u32 = 8;
    const ROUNDS: u32 = 10;
    let public = key.public();
    let (transport, proven) = in_namespace(&pair.b, move || {
        let config = tiercel::ClientConfig { server_key: Some(public), ..tiercel::ClientConfig::default() };
        let client: TestClient =
            Client::connect(format!("xdp://{addr}")).unwrap().with_config(config).import().unwrap();
        // Each thread has its own port on the station; their results come back in one socket and
        // reach each thread, whichever reads them.
        on_threads(&client, THREADS, ROUNDS);
        (client.binding().transport(), client.binding().server_key())
    });
    assert_eq!((transport, proven), (Transport::Xdp, Some(public)));
    let after = (kernel_udp(&pair.a), kernel_udp(&pair.b));
    let calls = u64::from(THREADS * ROUNDS) * CHECK_CALLS;
    for (side, (before, after)) in [("server", (before.0, after.0)), ("client", (before.1, after.1))] {
        let (received, sent) = (after.0 - before.0, after.1 - before.1);
        assert!(received <= 4 && sent <= 4, "{side}'s kernel: {received} in, {sent} out, for {calls} calls");
    }
    stop.send(()).unwrap();
    server.join().unwrap();
}

#[test]
fn a_long_procedure_through_af_xdp_holds_up_only_its_own_caller() {
    tiercel_seeds::needs!(ROOT, IP, CLANG, LIBBPF);
    let pair = Pair::new();
    let port = tiercel_seeds::free_port();
    let addr: SocketAddr = format!("{}:{port}", pair.server_ip()).parse().unwrap();
    let (status, stop, server) = serve(&pair.a, addr, &pair.va);
    assert!(matches!(status, Some(Ok(_))), "{status:?}");
    let (quick_calls, slow_done_first) = in_namespace(&pair.b, move || {
        let client: TestClient = Client::connect(format!("xdp://{addr}")).unwrap().import().unwrap();
        client.null().unwrap();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let slow = {
            let (client, done) = (client.clone(), done.clone());
            std::thread::spawn(move || {
                // Half a second of work on the server, through the worker reading the station.
                client.work(500_000).unwrap();
                done.store(true, std::sync::atomic::Ordering::SeqCst);
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        // Meanwhile another thread's calls are read and run by another worker.
        let mut calls = 0;
        for _ in 0..20 {
            assert_eq!(client.add(calls, 1).unwrap(), calls + 1);
            calls += 1;
        }
        let slow_done_first = done.load(std::sync::atomic::Ordering::SeqCst);
        slow.join().unwrap();
        (calls, slow_done_first)
    });
    assert_eq!(quick_calls, 20);
    assert!(!slow_done_first, "the quick calls waited for the long one");
    stop.send(()).unwrap();
    server.join().unwrap();
}

#[test]
fn async_tasks_call_through_af_xdp_and_read_their_results_from_every_queue() {
    tiercel_seeds::needs!(ROOT, IP, CLANG, LIBBPF);
    // A server without AF_XDP on a pair of four queues: each async call's results arrive on the
    // client's queue its port hashes to, and one task at a time polls the station's four sockets
    // through the runtime's reactor, leaving the others' results in their mailboxes.
    let pair = Pair::with_queues(4);
    let port = tiercel_seeds::free_port();
    let addr: SocketAddr = format!("{}:{port}", pair.server_ip()).parse().unwrap();
    let (status, stop, server) = serve_plain(&pair.a, addr);
    assert_eq!(status, None);
    let before = kernel_udp(&pair.b);
    const TASKS: i32 = 16;
    const ROUNDS: i32 = 20;
    let vb = pair.vb.clone();
    let (transport, refused, received) = in_namespace(&pair.b, move || {
        // One thread for every task: a task that held it while it waited would stall the rest.
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let client = runtime.block_on(async move {
            let client: TestAsyncClient =
                Client::connect(format!("xdp://{addr}")).unwrap().import_async().await.unwrap();
            let tasks: Vec<_> = (0..TASKS)
                .map(|t| {
                    let client = client.clone();
                    tokio::spawn(async move {
                        for round in 0..ROUNDS {
                            assert_eq!(client.add(t, round).await.unwrap(), t + round);
                            client.null().await.unwrap();
                            let mut out = [0u8; MAX_BUFFER];
                            client.max_result(Out(&mut out)).await.unwrap();
                            assert!(check(&out), "task {t}, round {round}: max_result's bytes");
                            if round % 5 == 4 {
                                // Longer than any spin: every task's next call waits at the station.
                                tokio::time::sleep(std::time::Duration::from_millis(3)).await;
                            }
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.unwrap();
            }
            // A call given up while it waits at the station (maybe with the turn to poll) leaves
            // the station to the calls that follow, each alone after a pause, so that it waits.
            let given_up = tokio::time::timeout(std::time::Duration::from_millis(50), client.work(300_000)).await;
            assert!(given_up.is_err(), "a 300 ms procedure answered within 50 ms");
            for i in 0..5 {
                tokio::time::sleep(std::time::Duration::from_millis(3)).await;
                assert_eq!(client.add(i, 1).await.unwrap(), i + 1);
            }
            // A call and a result of many frames each.
            let mut big = vec![0u8; 64 << 10];
            fill(&mut big);
            client.bulk_in_out(InOut(&mut big)).await.unwrap();
            assert!(big.iter().enumerate().all(|(i, &b)| b == pattern(i)), "64 KiB came back changed");
            client
        });
        drop(runtime);
        // The binding outlives its first runtime: the calls of the next wait at the station
        // through that one's reactor (four at once, so that they wait).
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let tasks: Vec<_> = (0..4)
                .map(|t| {
                    let client = client.clone();
                    tokio::spawn(async move {
                        for i in 0..10 {
                            assert_eq!(client.add(t, i).await.unwrap(), t + i, "the second runtime's calls");
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.unwrap();
            }
            let station = tiercel_sys::xdp::Station::on(&vb).unwrap();
            let binding = client.binding();
            (binding.transport(), binding.xdp_refused(), station.stats().received)
        })
    });
    assert_eq!((transport, refused), (Transport::Xdp, None));
    let calls = (TASKS * ROUNDS * 3 + 5 + 40) as u64;
    assert!(received >= calls, "{received} datagrams through the station for {calls} calls");
    // Only the bind's datagrams reached the client's kernel.
    let after = kernel_udp(&pair.b);
    assert!(after.0 - before.0 <= 4, "the client's kernel received {} datagrams", after.0 - before.0);
    stop.send(()).unwrap();
    server.join().unwrap();
}

#[test]
fn lone_async_calls_through_af_xdp_after_one_that_waited_leave_the_runtimes_thread_asleep() {
    tiercel_seeds::needs!(ROOT, IP, CLANG, LIBBPF);
    // A lone call spins for its result and reads the station's sockets itself. Once a call has
    // waited at the station (its procedure outlasted the spin), the station's readiness was
    // registered with the runtime's reactor; were it still, every frame of the lone calls after it
    // would wake the runtime's thread asleep in `epoll_wait` (a context switch each). The calls
    // spin for up to 50 ms, which only the slow call outlasts.
    let pair = Pair::new();
    let port = tiercel_seeds::free_port();
    let addr: SocketAddr = format!("{}:{port}", pair.server_ip()).parse().unwrap();
    let (status, stop, server) = serve_plain(&pair.a, addr);
    assert_eq!(status, None);
    const CALLS: i32 = 2_000;
    let (transport, woken) = in_namespace(&pair.b, move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("lone-xdp")
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let spin = tiercel::Spin::Fixed(std::time::Duration::from_millis(50));
            let config = tiercel::ClientConfig { spin, ..tiercel::ClientConfig::default() };
            let client: TestAsyncClient =
                Client::connect(format!("xdp://{addr}")).unwrap().with_config(config).import_async().await.unwrap();
            // 100 ms of work: the call waits at the station, through the reactor.
            client.work(100_000).await.unwrap();
            let before = tiercel_seeds::context_switches_of("lone-xdp");
            for i in 0..CALLS {
                assert_eq!(client.add(i, 2).await.unwrap(), i + 2);
            }
            (client.binding().transport(), tiercel_seeds::context_switches_of("lone-xdp") - before)
        })
    });
    assert_eq!(transport, Transport::Xdp);
    assert!(woken < CALLS as u64 / 20, "the runtime's thread woke {woken} times in {CALLS} lone calls");
    stop.send(()).unwrap();
    server.join().unwrap();
}

#[test]
fn threads_and_async_tasks_share_a_station_and_take_turns_to_poll_it() {
    tiercel_seeds::needs!(ROOT, IP, CLANG, LIBBPF);
    let pair = Pair::new();
    let port = tiercel_seeds::free_port();
    let addr: SocketAddr = format!("{}:{port}", pair.server_ip()).parse().unwrap();
    let (status, stop, server) = serve(&pair.a, addr, &pair.va);
    assert!(matches!(status, Some(Ok(_))), "{status:?}");
    let before = kernel_udp(&pair.b);
    const THREADS: i32 = 4;
    const TASKS: i32 = 8;
    const ROUNDS: i32 = 30;
    let transport = in_namespace(&pair.b, move || {
        let client: TestClient = Client::connect(format!("xdp://{addr}")).unwrap().import().unwrap();
        // Every few calls each caller pauses past any spin, so that threads block in `poll` and
        // tasks in the reactor, and the turn to poll passes between them.
        let pause = |round: i32| round % 3 == 2;
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let client = client.clone();
                std::thread::spawn(move || {
                    for round in 0..ROUNDS {
                        assert_eq!(client.add(t, round).unwrap(), t + round, "thread {t}");
                        if pause(round) {
                            std::thread::sleep(std::time::Duration::from_millis(2));
                        }
                    }
                })
            })
            .collect();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let tasks = client.to_async();
        runtime.block_on(async move {
            let tasks: Vec<_> = (0..TASKS)
                .map(|t| {
                    let client = tasks.clone();
                    tokio::spawn(async move {
                        for round in 0..ROUNDS {
                            assert_eq!(client.add(100 + t, round).await.unwrap(), 100 + t + round, "task {t}");
                            if pause(round) {
                                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                            }
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.unwrap();
            }
        });
        for t in threads {
            t.join().unwrap();
        }
        client.binding().transport()
    });
    assert_eq!(transport, Transport::Xdp);
    let after = kernel_udp(&pair.b);
    assert!(after.0 - before.0 <= 4, "the client's kernel received {} datagrams", after.0 - before.0);
    stop.send(()).unwrap();
    server.join().unwrap();
}

#[test]
fn a_thread_that_polls_wakes_when_another_reader_takes_its_datagram_from_the_ring() {
    tiercel_seeds::needs!(ROOT, IP, CLANG, LIBBPF);
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    let pair = Pair::new();
    let (ns, vb, to) = (pair.b.clone(), pair.vb.clone(), format!("10.{}.0.2", pair.subnet));
    let (port_tx, port) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        enter(&ns);
        let station = tiercel_sys::xdp::Station::on(&vb).unwrap();
        // Two ports, held by sockets of this namespace and steered to the station.
        let (a, b) = (std::net::UdpSocket::bind("0.0.0.0:0").unwrap(), std::net::UdpSocket::bind("0.0.0.0:0").unwrap());
        let (a, b) = (a.local_addr().unwrap().port(), b.local_addr().unwrap().port());
        station.open_port(a).unwrap();
        station.open_port(b).unwrap();
        port_tx.send(a).unwrap();
        let stop = AtomicBool::new(false);
        std::thread::scope(|scope| {
            // Port b's reader spins on the rings: it takes every frame as soon as it comes, and
            // leaves port a's datagram in a's mailbox.
            scope.spawn(|| {
                let mut buf = [0u8; 2048];
                while !stop.load(Relaxed) {
                    let _ = station.recv(b, &mut buf);
                }
            });
            // Port a's reader polls. Its datagram's frame wakes it, but the ring is empty again
            // by the time it looks: it must be woken for the datagram left in its mailbox. A wait
            // says a datagram *may* be there (the frame can wake it while b's reader is still
            // sorting it), so the reader waits and looks again, as the client does, until the
            // datagram or the 10 s timeout.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            let mut buf = [0u8; 64];
            let got = loop {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                let woke = station.wait(a, Some(left)).unwrap();
                if let Some((n, _)) = station.recv(a, &mut buf) {
                    break Some(buf[..n].to_vec());
                }
                if !woke {
                    break None;
                }
            };
            stop.store(true, Relaxed);
            (got.is_some(), got)
        })
    });
    let a = port.recv().unwrap();
    // Port a's reader polls by then; if it does not yet, it finds the datagram in its mailbox.
    std::thread::sleep(std::time::Duration::from_millis(200));
    in_namespace(&pair.a, move || {
        let socket = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        socket.send_to(b"for a", (to.as_str(), a)).unwrap();
    });
    let (woke, got) = reader.join().unwrap();
    assert!(woke, "the poller slept through its datagram, read by another reader, to its timeout");
    assert_eq!(got.as_deref(), Some(&b"for a"[..]));
}

/// Runs `CHECK_CALLS` calls `rounds` times on each of `threads` threads sharing `client`.
fn on_threads(client: &TestClient, threads: u32, rounds: u32) {
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let client = client.clone();
            std::thread::spawn(move || {
                for round in 0..rounds {
                    check_all(&client, round * threads + t).unwrap_or_else(|e| panic!("thread {t}: {e}"));
                }
            })
        })
        .collect();
    for t in handles {
        t.join().unwrap();
    }
}

#[test]
fn a_client_on_an_interface_of_four_queues_reads_the_results_from_every_queue() {
    results_from_every_queue(4);
}

#[test]
fn a_client_on_an_interface_of_forty_queues_reads_the_results_from_every_queue() {
    // More than 16 and 32 queues: each of the 39 receiving sockets has a smaller UMEM.
    results_from_every_queue(40);
}

fn results_from_every_queue(queues: u32) {
    tiercel_seeds::needs!(ROOT, IP, CLANG, LIBBPF);
    // A server without AF_XDP: its kernel sends each thread's results on the queue that thread's
    // port hashes to, and they arrive on the client's queue of that number. With a socket on
    // queue 0 only, the results that arrived on the others went to the kernel and were never read
    // (calls failed: "did not answer").
    let pair = Pair::with_queues(queues);
    let port = tiercel_seeds::free_port();
    let addr: SocketAddr = format!("{}:{port}", pair.server_ip()).parse().unwrap();
    let (status, stop, server) = serve_plain(&pair.a, addr);
    assert_eq!(status, None);
    let before = kernel_udp(&pair.b);
    let vb = pair.vb.clone();
    let (transport, read, received) = in_namespace(&pair.b, move || {
        let client: TestClient = Client::connect(format!("xdp://{addr}")).unwrap().import().unwrap();
        on_threads(&client, 8, 3);
        // The station the client's endpoints use (the process has one per interface).
        let station = tiercel_sys::xdp::Station::on(&vb).unwrap();
        (client.binding().transport(), station.queues(), station.stats().received)
    });
    assert_eq!((transport, read), (Transport::Xdp, queues as usize));
    let after = kernel_udp(&pair.b);
    let calls = 8 * 3 * CHECK_CALLS;
    assert!(received >= calls, "{received} datagrams through the station for {calls} calls");
    // Only the bind's datagrams reached the client's kernel.
    assert!(after.0 - before.0 <= 4, "the client's kernel received {} datagrams", after.0 - before.0);
    stop.send(()).unwrap();
    server.join().unwrap();
}

#[test]
fn a_server_on_an_interface_of_four_queues_reads_the_calls_from_every_queue() {
    tiercel_seeds::needs!(ROOT, IP, CLANG, LIBBPF);
    // Clients without AF_XDP: each thread's calls leave its kernel on the queue its port hashes
    // to, and arrive on the server's queue of that number, where the server's station has a socket.
    let pair = Pair::with_queues(4);
    let port = tiercel_seeds::free_port();
    let addr: SocketAddr = format!("{}:{port}", pair.server_ip()).parse().unwrap();
    let (status, stop, server) = serve(&pair.a, addr, &pair.va);
    assert!(matches!(status, Some(Ok(_))), "{status:?}");
    let before = kernel_udp(&pair.a);
    in_namespace(&pair.b, move || {
        let client: TestClient = Client::connect(format!("udp://{addr}")).unwrap().import().unwrap();
        on_threads(&client, 8, 3);
    });
    let after = kernel_udp(&pair.a);
    assert!(after.0 - before.0 <= 4, "the server's kernel received {} datagrams", after.0 - before.0);
    stop.send(()).unwrap();
    server.join().unwrap();
}
