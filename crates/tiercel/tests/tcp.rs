//! End-to-end calls over the TCP transport on loopback, server and client in one process: the same
//! stubs, many calls in flight on one connection, large messages, deadlines, and a server that
//! meets bad frames and silent peers, and keeps a long call alive with its heartbeats.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use tiercel::{CallError, Client, ClientConfig, Execution, In, InOut, Out, Server, ServerConfig, Transport};
use tiercel_proto::bind::BindClient;
use tiercel_proto::wire::{Header, Kind, HEADER_LEN};
use tiercel_seeds::{self as seeds, SeedTest, TestClient, TestServer};

mod tcp_common;

use tcp_common::{bind_over, bind_raw, raw, raw_from, serve, tcp};

#[test]
fn every_seed_procedure_returns_correct_results_over_tcp() {
    let server = serve();
    let client = tcp(&server);
    for round in 0..200 {
        seeds::check_all(&client, round).unwrap();
    }
    assert_eq!(server.stats().calls, 200 * seeds::CHECK_CALLS);
    assert_eq!(server.bindings(), 1);
}

#[test]
fn threads_share_one_connection_with_calls_in_flight_at_once() {
    let server = serve();
    let client = tcp(&server);
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let client = client.clone();
            std::thread::spawn(move || {
                for i in 0..2000 {
                    assert_eq!(client.add(t * 100_000, i).unwrap(), t * 100_000 + i);
                    if i % 97 == 0 {
                        // A slower call now and then, so that results come back out of order.
                        client.work(200).unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(server.bindings(), 1, "one connection, one binding, for every thread");
    assert_eq!(server.stats().malformed, 0);
    assert_eq!(client.binding().stats().stale, 0);
}

#[test]
fn blocked_callers_on_one_connection_each_get_their_own_results_while_some_give_up() {
    // Never spinning, every waiting caller blocks: one in `poll` on the connection, the others
    // parked until it hands them their result or the reading. Calls given up at their deadlines
    // (the reader's, or the one woken to read next) pass the reading on; what this asserts is that
    // meanwhile every caller gets its own results, and every late result is dropped. A call whose
    // deadline passed before the server took it up is answered `DeadlineExceeded` by the server
    // (it never ran), and when that answer is in before its caller looks at its deadline, that is
    // what the caller gets: then no late result follows.
    let server = serve();
    let client: TestClient = Client::connect(format!("tcp://{}", server.addr()))
        .unwrap()
        .with_config(ClientConfig { spin: tiercel::Spin::Never, ..ClientConfig::default() })
        .import()
        .unwrap();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let client = client.clone();
            std::thread::spawn(move || {
                let (mut gave_up, mut refused) = (0, 0);
                for i in 0..400 {
                    assert_eq!(client.add(t * 100_000, i).unwrap(), t * 100_000 + i);
                    if i % 50 == t {
                        let err = client.with_deadline(Duration::from_millis(2)).work(20_000).unwrap_err();
                        match err {
                            CallError::DeadlineExceeded { may_have_run: true } => gave_up += 1,
                            CallError::DeadlineExceeded { may_have_run: false } => refused += 1,
                            _ => panic!("{err}"),
                        }
                    }
                }
                (gave_up, refused)
            })
        })
        .collect();
    let (gave_up, refused) = threads
        .into_iter()
        .map(|t| t.join().unwrap())
        .fold((0u64, 0u64), |(g, r), (gave_up, refused)| (g + gave_up, r + refused));
    assert_eq!(gave_up + refused, 8 * 8);
    assert!(gave_up > 0, "every call was refused by the server, none given up by its caller");
    assert!(server.stats().late >= refused, "{refused} refused as late, {} by the server's count", server.stats().late);
    assert_eq!(server.bindings(), 1);
    assert_eq!(server.stats().malformed, 0);
    // Every call given up still ran, and its late result was dropped, not taken for another's.
    let give_up = Instant::now() + Duration::from_secs(10);
    while client.binding().stats().stale < gave_up {
        assert!(Instant::now() < give_up, "{} of {gave_up} late results came", client.binding().stats().stale);
        assert_eq!(client.add(2, 3).unwrap(), 5);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(client.binding().stats().stale, gave_up);
}

#[test]
fn messages_of_many_megabytes_go_whole_both_ways() {
    let server = serve();
    let client = tcp(&server);
    let data: Vec<u8> = (0..16 << 20).map(seeds::pattern).collect();
    client.bulk_in(In(&data)).unwrap();
    let mut both: Vec<u8> = (0..5 << 20).map(seeds::pattern).collect();
    for _ in 0..3 {
        client.bulk_in_out(InOut(&mut both)).unwrap();
    }
    assert!(seeds::check(&both));
    let mut out = vec![0u8; 1440];
    client.max_result(Out(&mut out)).unwrap();
    assert!(seeds::check(&out));
    // What the connection grew for them is given back once large calls stop.
    let base = server.message_memory();
    std::thread::sleep(Duration::from_millis(1300));
    client.null().unwrap();
    let give_up = Instant::now() + Duration::from_secs(5);
    while server.message_memory() >= base && base > 256 << 10 {
        assert!(Instant::now() < give_up, "{} bytes still held", server.message_memory());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(server.message_memory() <= 256 << 10, "{} bytes held by an idle binding", server.message_memory());
}

#[test]
fn a_call_past_its_deadline_may_have_run_and_the_binding_goes_on() {
    let server = serve();
    let client = tcp(&server);
    let err = client.with_deadline(Duration::from_millis(100)).work(400_000).unwrap_err();
    assert!(matches!(err, CallError::DeadlineExceeded { may_have_run: true }), "{err}");
    // The next call on the same slot gets its own result, not the abandoned call's (which comes
    // first: the abandoned call ends meanwhile, and its result is dropped when it lands).
    let give_up = Instant::now() + Duration::from_secs(10);
    while client.binding().stats().stale == 0 {
        assert!(Instant::now() < give_up, "the abandoned call's result never came");
        assert_eq!(client.add(2, 3).unwrap(), 5);
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(client.add(2, 3).unwrap(), 5);
    assert_eq!(client.binding().stats().stale, 1, "the late result was dropped, once");
}

#[test]
fn too_large_a_call_is_refused_before_sending() {
    let server = serve();
    let client = tcp(&server);
    let data = vec![0u8; tiercel::config::MAX_MESSAGE + 1];
    let err = client.bulk_in(In(&data)).unwrap_err();
    assert!(matches!(err, CallError::TooLarge(_)), "{err:?}");
    assert_eq!(err.execution(), Execution::NeverRan);
    assert_eq!(client.add(1, 1).unwrap(), 2);
}

#[test]
fn a_call_larger_than_the_servers_budget_could_ever_hold_fails_at_once_and_the_connection_goes_on() {
    let config = ServerConfig { binding_memory: 1 << 20, ..ServerConfig::default() };
    let server =
        Server::bind("127.0.0.1:0").unwrap().with_config(config).export(TestServer::new(SeedTest)).start().unwrap();
    let client = tcp(&server);
    let data: Vec<u8> = (0..4 << 20).map(seeds::pattern).collect();
    let asked = Instant::now();
    let err = client.bulk_in(In(&data)).unwrap_err();
    // Refused `TooLarge`, not `Busy`: no backoff and no second try (`dead_after` is 5 s).
    assert!(matches!(&err, CallError::TooLarge(m) if m.contains("can ever hold")), "{err:?}");
    assert!(asked.elapsed() < Duration::from_secs(4), "tried again: {:?}", asked.elapsed());
    assert_eq!(err.execution(), Execution::NeverRan, "refused from its header, unread");
    assert_eq!(server.stats().busy, 0, "not counted as busy");
    assert_eq!(server.stats().calls, 0, "refused unread, never run");
    assert_eq!(client.add(20, 22).unwrap(), 42);
    assert!(server.message_memory() < 1 << 20);
}

/// Whether the server closed `s` (reading gives end of file or a reset).
fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 64];
    matches!(s.read(&mut b), Ok(0) | Err(_))
}

#[test]
fn bad_frames_and_slow_handshakes_are_dropped_and_counted() {
    let server = serve();
    // A length no frame may have: refused from the prefix alone.
    let mut s = raw(&server);
    s.write_all(&u32::MAX.to_le_bytes()).unwrap();
    assert!(closed(&mut s));
    // A frame of garbage.
    let mut s = raw(&server);
    s.write_all(&100u32.to_le_bytes()).unwrap();
    s.write_all(&[0xab; 100]).unwrap();
    assert!(closed(&mut s));
    // A well-formed bind request flagged for a checksum trailer, with a good one: streams carry no
    // trailers, so it is refused unanswered rather than answered with a trailer missing.
    let info = <TestClient as tiercel::Import>::INFO;
    let mut request = BindClient::new(&tiercel_seeds::bind_spec(info), 0, 7, true).packet();
    request.extend_from_slice(&tiercel_proto::wire::checksum([&request[..]]).to_le_bytes());
    tiercel_proto::wire::Packet::new_checked(&request[..]).expect("a valid checksummed request");
    let mut s = raw(&server);
    s.write_all(&tiercel_proto::stream::prefix(request.len())).unwrap();
    s.write_all(&request).unwrap();
    assert!(closed(&mut s));
    assert_eq!(server.stats().malformed, 3);
    // A connection that never completes the bind exchange is closed after the handshake time.
    let started = Instant::now();
    let mut silent = raw(&server);
    assert!(closed(&mut silent));
    assert!(started.elapsed() >= Duration::from_secs(1), "closed after {:?}", started.elapsed());
    // A bound connection that sends garbage loses its binding, and the others keep theirs.
    let client = tcp(&server);
    assert_eq!(client.add(1, 2).unwrap(), 3);
    assert_eq!(server.bindings(), 1);
    assert_eq!(server.stats().bindings, 1);
}

#[test]
fn connections_dribbling_bind_requests_keep_no_client_from_binding() {
    let server = serve();
    let addr = server.addr();
    // 320 connections from the clients' own address (more than the 256 the server holds in the
    // bind exchange, and than the 64 of one address), each sending one byte of a bind request
    // every 100 ms (it would take 10 s), each reopened the moment the server closes it.
    const SLOW: usize = 320;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let dribbler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            // A frame of 100 bytes announced, then its bytes one at a time.
            let open = || {
                let mut s = TcpStream::connect(addr).ok()?;
                s.set_nodelay(true).ok()?;
                s.write_all(&100u32.to_le_bytes()).ok()?;
                Some(s)
            };
            let mut slow: Vec<Option<TcpStream>> = (0..SLOW).map(|_| open()).collect();
            let mut reopened = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for s in &mut slow {
                    if s.as_mut().is_none_or(|s| s.write_all(&[0x40]).is_err()) {
                        *s = open();
                        reopened += 1;
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            reopened
        })
    };
    // The attack is on once the server has had to close some of them to make room.
    let give_up = Instant::now() + Duration::from_secs(10);
    while server.stats().rejected < (SLOW - 64) as u64 {
        assert!(Instant::now() < give_up, "the dribblers never filled the server: {}", server.stats());
        std::thread::sleep(Duration::from_millis(10));
    }
    for i in 0..30i32 {
        let client: TestClient = Client::connect(format!("tcp://{addr}"))
            .unwrap()
            .import()
            .unwrap_or_else(|e| panic!("bind {i} of 30 during the attack: {e} ({})", server.stats()));
        assert_eq!(client.add(i, 1).unwrap(), i + 1);
        let big: Vec<u8> = (0..1 << 20).map(seeds::pattern).collect();
        assert!(client.bulk_in(In(&big)).is_ok(), "a 1 MiB call during the attack");
        // Over three seconds: the dribblers' connections are closed (to make room, or at the end
        // of their two seconds) and reopened meanwhile.
        std::thread::sleep(Duration::from_millis(100));
    }
    seeds::every_transport_serves(server.addr()).expect("a client on every transport during the attack");
    let stats = server.stats();
    // The server goes first, so that it closes the connections and their TIME_WAIT stays on its
    // own port: thousands left on clients' ports would keep later servers of this machine from
    // listening there for a minute.
    drop(server);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reopened = dribbler.join().unwrap();
    eprintln!("dribblers reopened {reopened} connections; {stats}");
    assert!(reopened >= SLOW as u64, "the dribblers kept at it, reopening what the server closed");
}

#[test]
fn a_server_that_stops_fails_the_call_as_may_have_run_and_rebind_moves_on() {
    let server = serve();
    let addr = server.addr();
    let client: TestClient = Client::connect(format!("tcp://{addr}"))
        .unwrap()
        .with_config(ClientConfig { rebind: true, ..ClientConfig::default() })
        .import()
        .unwrap();
    assert_eq!(client.add(1, 2).unwrap(), 3);
    let caller = {
        let client = client.clone();
        std::thread::spawn(move || client.work(300_000))
    };
    std::thread::sleep(Duration::from_millis(100));
    server.stop();
    // The call under way finished before the server's threads stopped: its result either went out
    // or the connection closed first, which the caller reports as "may have run".
    match caller.join().unwrap() {
        Ok(()) => {}
        Err(e) => assert_eq!(e.execution(), Execution::MayHaveRun, "{e}"),
    }
    let err = client.add(1, 2).unwrap_err();
    assert!(
        matches!(err, CallError::ConnectionLost { sent: false, .. } | CallError::ConnectionLost { sent: true, .. }),
        "{err}"
    );
    // A new server on the same port: the binding binds again by itself, over TCP.
    let server = Server::bind(addr).unwrap().export(TestServer::new(SeedTest)).start().unwrap();
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        match client.add(2, 2) {
            Ok(v) => {
                assert_eq!(v, 4);
                break;
            }
            Err(e) => assert!(Instant::now() < give_up, "{e}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(client.binding().transport(), Transport::Tcp);
    assert!(client.binding().rebinds() >= 1);
    drop(server);
}

#[test]
fn a_listing_over_tcp_tells_what_the_server_exports() {
    let server = serve();
    let exports = Client::connect(format!("tcp://{}", server.addr())).unwrap().exports().unwrap();
    assert_eq!(exports.len(), 1);
    assert_eq!(exports[0].name, "Test");
    assert_eq!(exports[0].version, 1);
    assert!(exports[0].signature.lines().any(|l| l.starts_with("add(")), "{:?}", exports[0]);
    assert_eq!(server.bindings(), 0, "a listing binds nothing");
}

#[test]
fn a_server_without_tcp_is_not_reached_over_it() {
    let config = ServerConfig { tcp: false, ..ServerConfig::default() };
    let server =
        Server::bind("127.0.0.1:0").unwrap().with_config(config).export(TestServer::new(SeedTest)).start().unwrap();
    assert_eq!(server.tcp_addr(), None);
    let err = Client::connect(format!("tcp://{}", server.addr())).unwrap().import::<TestClient>().unwrap_err();
    assert!(matches!(err, tiercel::BindError::NoServer(_)), "{err}");
}

#[test]
fn an_idle_binding_expires_and_the_next_call_says_it_was_not_sent() {
    let timing = tiercel::Timing { dead_after: Duration::from_millis(100), ..tiercel::Timing::default() };
    let config = ServerConfig { binding_idle: Duration::from_millis(300), timing, ..ServerConfig::default() };
    let server =
        Server::bind("127.0.0.1:0").unwrap().with_config(config).export(TestServer::new(SeedTest)).start().unwrap();
    let client = tcp(&server);
    assert_eq!(client.add(1, 2).unwrap(), 3);
    // The endpoint is swept about once a second; the listener closes the connection after.
    let give_up = Instant::now() + Duration::from_secs(10);
    while server.bindings() > 0 {
        assert!(Instant::now() < give_up, "{}", server.stats());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(server.stats().expired, 1);
    let err = client.add(1, 2).unwrap_err();
    assert!(matches!(err, CallError::ConnectionLost { sent: false, .. }), "{err}");
    assert_eq!(err.execution(), Execution::NeverRan);
}

#[test]
fn connections_that_never_bind_do_not_keep_a_client_out() {
    let server = serve();
    let idle: Vec<TcpStream> = (0..40).map(|_| raw(&server)).collect();
    std::thread::sleep(Duration::from_millis(100));
    let client = tcp(&server);
    assert_eq!(client.add(40, 2).unwrap(), 42);
    drop(idle);
}

#[test]
fn frames_announced_and_never_sent_are_charged_only_what_arrived() {
    let server = serve();
    // 16 bound connections, each announcing a 16 MiB call and sending its header and 100 KiB of it.
    let stalled: Vec<TcpStream> = (0..16).map(|i| stall_16_mib_call(bind_raw(&server), i, 100 << 10)).collect();
    let settled = Instant::now() + Duration::from_secs(5);
    while server.bindings() < 16 {
        assert!(Instant::now() < settled, "{}", server.stats());
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(200));
    // What they hold: their buffers, grown by what arrived (at most twice it), not the 256 MiB
    // their prefixes claim.
    let held = server.message_memory();
    assert!(held <= 16 * (256 << 10) + (4 << 20), "{held} bytes charged for 1.6 MiB sent");
    // Large calls of other clients still fit.
    let client = tcp(&server);
    let big: Vec<u8> = (0..4 << 20).map(seeds::pattern).collect();
    client.bulk_in(In(&big)).expect("a 4 MiB call beside the stalled frames");
    // The server closes first (see `connections_dribbling_bind_requests_keep_no_client_from_binding`).
    drop(server);
    drop(stalled);
}

#[test]
fn a_client_that_never_reads_its_results_is_cut_off() {
    let timing = tiercel::Timing { dead_after: Duration::from_millis(500), ..tiercel::Timing::default() };
    let config = ServerConfig { timing, ..ServerConfig::default() };
    let server =
        Server::bind("127.0.0.1:0").unwrap().with_config(config).export(TestServer::new(SeedTest)).start().unwrap();
    let (mut s, granted) = bind_raw(&server);
    let bound = Instant::now() + Duration::from_secs(5);
    while server.bindings() == 0 {
        assert!(Instant::now() < bound, "the binding's thread never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Calls of MaxResult (1,440 bytes back each) sent and never read: the server's writes fill the
    // connection's buffers, and it gives the connection up rather than block its thread for ever.
    s.set_write_timeout(Some(Duration::from_millis(200))).unwrap();
    let args = 1440u32.to_le_bytes();
    let mut sent = 0u32;
    let give_up = Instant::now() + Duration::from_secs(20);
    while server.bindings() == 1 {
        assert!(Instant::now() < give_up, "still bound after {sent} calls never read");
        let frame = call_frame(&granted, sent % 4, sent / 4 + 1, 3, &args);
        if s.write_all(&frame).is_err() {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        sent += 1;
    }
    assert!(sent > 10, "{sent}");
    // The server serves others meanwhile and after.
    let client = tcp(&server);
    assert_eq!(client.add(1, 1).unwrap(), 2);
}

#[test]
fn a_slow_call_holds_up_only_its_own_caller_on_a_shared_connection() {
    // The connection's thread is running the slow call: another of its threads reads and runs
    // the quick ones, while the slow one goes on.
    let server = serve();
    // The client lives on past the count: dropped before it, its connection closed and the server
    // could let the binding go first (it did in a run of `.ci/run`).
    let client = tcp(&server);
    quick_calls_pass_a_slow_one(&client);
    assert_eq!(server.bindings(), 1);
}

/// Makes a call of 1 s on `client` from another thread, then quick calls while it runs: they must
/// not wait for it.
fn quick_calls_pass_a_slow_one(client: &TestClient) {
    let slow = {
        let client = client.clone();
        std::thread::spawn(move || client.work(1_000_000))
    };
    std::thread::sleep(Duration::from_millis(100));
    let mut done = 0;
    while !slow.is_finished() && done < 200 {
        assert_eq!(client.add(done, 1).unwrap(), done + 1);
        done += 1;
    }
    assert!(!slow.is_finished(), "the quick calls waited for the slow one ({done} done)");
    slow.join().unwrap().unwrap();
}

/// A client of `server` over TCP whose callers never spin: each waits for its result blocked.
fn blocking(server: &tiercel::RunningServer) -> TestClient {
    Client::connect(format!("tcp://{}", server.addr()))
        .unwrap()
        .with_config(ClientConfig { spin: tiercel::Spin::Never, ..ClientConfig::default() })
        .import()
        .unwrap()
}

#[test]
fn callers_that_block_at_once_wait_in_their_receives_and_get_every_result_whole() {
    // A lone reader that blocks waits in its receive, which takes at most 512 bytes; the rest of a
    // larger result is read after it as any read's. Every result must still come whole, to its own
    // caller, alone and with threads whose results come back together.
    let server = serve();
    let client = blocking(&server);
    for round in 0..100 {
        seeds::check_all(&client, round).unwrap();
    }
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let client = client.clone();
            std::thread::spawn(move || {
                for i in 0..300 {
                    assert_eq!(client.add(t * 100_000, i).unwrap(), t * 100_000 + i);
                    if i % 50 == 0 {
                        seeds::check_all(&client, i as u32).unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(server.stats().malformed, 0);
    assert_eq!(client.binding().stats().stale, 0);
    assert_eq!(server.bindings(), 1);
}

#[test]
fn a_blocking_caller_waiting_in_its_receive_for_a_slow_call_holds_up_no_other_caller() {
    // The slow call's caller reads the connection, waiting in its receive without the lock that
    // the other callers send and look for their results under: their calls go out and their
    // results reach them (the receive returns with them) while the slow one still runs.
    let server = serve();
    let client = blocking(&server);
    quick_calls_pass_a_slow_one(&client);
    assert_eq!(client.binding().stats().stale, 0);
}

#[cfg(feature = "async")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_callers_go_on_once_async_calls_share_their_connection() {
    // An async call that waits registers the connection with the reactor, which takes only a
    // socket that does not block: while async calls wait on it the blocking callers wait in
    // `poll`, not in their receives, and both kinds get their results.
    let server = serve();
    let client = blocking(&server);
    let sync = client.clone();
    tokio::task::spawn_blocking(move || seeds::check_all(&sync, 1)).await.unwrap().unwrap();
    let asynch = client.to_async();
    assert_eq!(asynch.add(2, 3).await.unwrap(), 5);
    let sync = client.clone();
    let blocked = tokio::task::spawn_blocking(move || {
        for i in 0..300 {
            assert_eq!(sync.add(i, 1).unwrap(), i + 1);
        }
        seeds::check_all(&sync, 2)
    });
    for i in 0..300 {
        assert_eq!(asynch.add(i, 2).await.unwrap(), i + 2);
    }
    blocked.await.unwrap().unwrap();
    assert_eq!(client.binding().stats().stale, 0);
}

#[cfg(feature = "async")]
#[test]
fn async_calls_of_a_runtime_made_after_the_first_was_shut_down_wait_on_its_own_reactor() {
    // The connection is registered with the reactor of the runtime whose async calls wait on it,
    // and let go once none has for a while (10 ms): the async calls of a later runtime register it
    // with theirs, and the blocking callers between them wait in their receives again.
    let server = serve();
    let client = blocking(&server);
    let asynch = client.to_async();
    for round in 0..3 {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async {
            // Four at once, each never spinning: every call waits on the reactor.
            let tasks: Vec<_> = (0..4)
                .map(|t| {
                    let asynch = asynch.clone();
                    tokio::spawn(async move {
                        for i in 0..100 {
                            assert_eq!(asynch.add(i, round * 10 + t).await.unwrap(), i + round * 10 + t);
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.unwrap();
            }
        });
        drop(rt);
        std::thread::sleep(Duration::from_millis(30));
        for i in 0..50 {
            assert_eq!(client.add(i, round).unwrap(), i + round);
        }
    }
    seeds::check_all(&client, 3).unwrap();
    assert_eq!(client.binding().stats().stale, 0);
}

/// Procedures whose one buffer is an `InOut` and their last argument: a large call runs on it
/// where its frame was read, and the result goes back from there and is read straight into the
/// caller's buffer.
#[tiercel::interface]
pub trait Flip {
    /// Xors every byte of `both` with `key`; returns the sum of its bytes before. Panics when `key`
    /// is 0.
    fn flip(&self, key: u8, both: InOut<&mut [u8]>) -> u64;
    /// Leaves `both` as it is and returns `extra` bytes of 7.
    fn pad(&self, extra: u32, both: InOut<&mut [u8]>) -> Vec<u8>;
}

struct Flipper;

impl Flip for Flipper {
    fn flip(&self, key: u8, both: InOut<&mut [u8]>) -> u64 {
        assert!(key != 0, "told to panic");
        let sum = both.0.iter().map(|&b| b as u64).sum();
        both.0.iter_mut().for_each(|b| *b ^= key);
        sum
    }
    fn pad(&self, extra: u32, _both: InOut<&mut [u8]>) -> Vec<u8> {
        vec![7; extra as usize]
    }
}

const FLIP_LIMIT: usize = 4 << 20;

fn serve_flip() -> tiercel::RunningServer {
    let mut config = ServerConfig::default();
    config.timing.max_message = FLIP_LIMIT;
    Server::bind("127.0.0.1:0").unwrap().with_config(config).export(FlipServer::new(Flipper)).start().unwrap()
}

fn sum(b: &[u8]) -> u64 {
    b.iter().map(|&x| x as u64).sum()
}

#[test]
fn a_large_in_out_buffer_goes_back_from_the_frame_its_call_came_in() {
    // With and without a deadline (a context block before the arguments). The client reads each
    // large result straight into the buffer it lent to the call.
    for deadline in [false, true] {
        let server = serve_flip();
        let mut client: FlipClient = Client::connect(format!("tcp://{}", server.addr())).unwrap().import().unwrap();
        if deadline {
            client = client.with_deadline(Duration::from_secs(60));
        }
        let in_place = || server.stats().in_place;
        let mut both: Vec<u8> = (0..(1 << 20) + 77).map(|i| (i % 249) as u8).collect();
        let mut expected = both.clone();
        for key in [0x5a, 0xa5, 0x0f] {
            assert_eq!(client.flip(key, InOut(&mut both)).unwrap(), sum(&expected), "deadline {deadline}");
            expected.iter_mut().for_each(|b| *b ^= key);
            assert!(both == expected, "deadline {deadline}: the buffer came back changed by the procedure");
        }
        assert_eq!(in_place(), 3, "deadline {deadline}");
        // A small call takes the usual path.
        let mut small = [1u8, 2, 3];
        assert_eq!(client.flip(1, InOut(&mut small)).unwrap(), 6);
        assert_eq!(small, [0, 3, 2]);
        assert_eq!(in_place(), 3, "deadline {deadline}: a small call is copied");
        // A procedure that panics on the buffer: the call fails, the next one runs.
        match client.flip(0, InOut(&mut both)) {
            Err(CallError::Panicked(m)) => assert!(m.contains("told to panic"), "{m}"),
            other => panic!("deadline {deadline}: {other:?}"),
        }
        // A result that the procedure made longer than the server's limit: refused after it ran.
        let mut near: Vec<u8> = vec![3; FLIP_LIMIT - 64];
        match client.pad(1000, InOut(&mut near)) {
            Err(e @ CallError::ResultTooLarge(_)) => assert_eq!(e.execution(), Execution::Ran),
            other => panic!("deadline {deadline}: {other:?}"),
        }
        // Within the limit, the buffer and the return value both come back.
        near.truncate(FLIP_LIMIT - 4096);
        assert_eq!(client.pad(1000, InOut(&mut near)).unwrap(), vec![7; 1000]);
        assert!(near.iter().all(|&b| b == 3));
        assert_eq!(client.flip(0x33, InOut(&mut both)).unwrap(), sum(&expected), "deadline {deadline}");
        expected.iter_mut().for_each(|b| *b ^= 0x33);
        assert!(both == expected, "deadline {deadline}: the call after the refusals came back whole");
        assert_eq!(in_place(), 5, "deadline {deadline}: the large calls that succeeded");
        assert_eq!(server.bindings(), 1, "one connection throughout");
        // The client: the five large results, each read into the buffer but for what came with
        // its frame's header (at most the connection's 64 KiB receive buffer); the small result,
        // the panic and the refusal the usual way.
        assert_eq!(client.binding().stats().in_place, 5, "deadline {deadline}");
        let straight = client.binding().stats().lent_bytes as usize;
        let least = 4 * (both.len() - (64 << 10)) + near.len() - (64 << 10);
        assert!(straight >= least, "deadline {deadline}: {straight} bytes straight into the buffers, not {least}");
    }
}

#[test]
fn large_results_of_threads_sharing_a_connection_reach_each_its_own_caller() {
    // Threads whose large and small calls and results arrive interleaved, read by whichever
    // caller reads the connection: each gets its own result, whole.
    let server = serve_flip();
    let client: FlipClient = Client::connect(format!("tcp://{}", server.addr())).unwrap().import().unwrap();
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let client = client.clone();
            std::thread::spawn(move || {
                for i in 0..30usize {
                    let len = if i % 3 == 2 { 3000 + i } else { (200 << 10) + 1000 * t as usize + i };
                    let mut both: Vec<u8> = (0..len).map(|j| (j as u8).wrapping_add(t)).collect();
                    let before = sum(&both);
                    let key = t + 1;
                    assert_eq!(client.flip(key, InOut(&mut both)).unwrap(), before, "thread {t}, call {i}");
                    assert!(
                        both.iter().enumerate().all(|(j, &b)| b == (j as u8).wrapping_add(t) ^ key),
                        "thread {t}, call {i}: another result, or not all of it"
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // A large call runs where it landed when its frame is all the connection's buffer holds;
    // with another call's bytes read behind it, it runs on a copy.
    let in_place = server.stats().in_place;
    assert!((1..=4 * 20).contains(&in_place), "{in_place} of the 80 large calls ran in place");
    assert_eq!(server.bindings(), 1);
    assert_eq!(client.binding().stats().stale, 0);
    let received = client.binding().stats().in_place;
    assert!((1..=4 * 20).contains(&received), "{received} of the 80 large results read into the lent buffers");
}

#[test]
fn frames_that_fill_an_addresss_part_of_memory_leave_every_transport_room() {
    // 48 MiB for messages, of which no transport may hold more than half, and no address more than
    // half of that.
    let config = ServerConfig { message_memory: 48 << 20, binding_memory: 17 << 20, ..ServerConfig::default() };
    let server =
        Server::bind("127.0.0.1:0").unwrap().with_config(config).export(TestServer::new(SeedTest)).start().unwrap();
    // From 127.0.0.2, 8 bound connections, each announcing a 16 MiB call and sending 6 MiB of it
    // for real: 48 MiB sent, as much as the whole server may hold.
    let from = std::net::IpAddr::from([127, 0, 0, 2]);
    let stalled: Vec<TcpStream> =
        (0..8).map(|i| stall_16_mib_call(bind_over(raw_from(&server, from)), i, 6 << 20)).collect();
    std::thread::sleep(Duration::from_millis(300));
    let held = server.message_memory();
    assert!(held <= (12 << 20) + (1 << 20), "one address holds {held} bytes, more than its part");
    // Large calls over every transport still fit, over TCP from another address too.
    let big: Vec<u8> = (0..4 << 20).map(seeds::pattern).collect();
    for scheme in ["udp://", "shm:", "tcp://"] {
        let client: TestClient = Client::connect(format!("{scheme}{}", server.addr())).unwrap().import().unwrap();
        client.bulk_in(In(&big)).unwrap_or_else(|e| panic!("{scheme}: a 4 MiB call beside the stalled frames: {e}"));
    }
    seeds::every_transport_serves(server.addr()).expect("a client on every transport beside the stalled frames");
    // The server closes first (see `connections_dribbling_bind_requests_keep_no_client_from_binding`).
    drop(server);
    drop(stalled);
}

#[test]
fn a_bind_answer_that_breaks_the_protocol_is_named_not_reported_as_io() {
    // A TCP "server" that answers every bind request with a well-framed packet that is none.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let impostor = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut len = [0u8; 4];
        s.read_exact(&mut len).unwrap();
        let mut request = vec![0u8; u32::from_le_bytes(len) as usize];
        s.read_exact(&mut request).unwrap();
        let garbage = [0x5au8; 80];
        s.write_all(&tiercel_proto::stream::prefix(garbage.len())).unwrap();
        s.write_all(&garbage).unwrap();
        // Held open until the client has read the answer and given up.
        let _ = s.read(&mut [0u8; 1]);
    });
    let err = Client::connect(format!("tcp://{addr}")).unwrap().import::<TestClient>().map(drop).unwrap_err();
    assert!(
        matches!(err, tiercel::BindError::Protocol(tiercel::Violation::BindAnswer("malformed bind answer"))),
        "{err:?}"
    );
    assert_eq!(err.execution(), Execution::NeverRan);
    assert!(err.to_string().contains("broke the bind protocol"), "{err}");
    impostor.join().unwrap();
}

/// Binds over a raw connection and sends the header of a call (procedure 14) announcing 16 MiB of
/// arguments, then only `sent` bytes of them (each `i`): a frame that stalls there.
fn stall_16_mib_call(bound: (TcpStream, tiercel_proto::bind::Granted), i: usize, sent: usize) -> TcpStream {
    let (mut s, granted) = bound;
    let len = 16 << 20;
    let h = Header {
        binding: granted.binding,
        slot: 0,
        seq: 1,
        procedure: 14,
        incarnation: granted.incarnation,
        payload_len: len,
        message_len: len,
        ..Header::new(Kind::Call)
    };
    let mut frame = tiercel_proto::stream::prefix(60 + len as usize).to_vec();
    frame.extend_from_slice(&h.to_bytes());
    frame.extend(std::iter::repeat_n(i as u8, sent));
    s.write_all(&frame).unwrap();
    s
}

#[tiercel::interface]
pub trait Napper {
    fn nap(&self, millis: u32) -> u32;
}

struct Nap;

impl Napper for Nap {
    fn nap(&self, millis: u32) -> u32 {
        std::thread::sleep(Duration::from_millis(millis.into()));
        millis
    }
}

#[test]
fn a_call_longer_than_the_silence_that_fails_calls_is_kept_alive_by_the_servers_heartbeats() {
    // The client gives up on a connection silent for two seconds (its least silence, with
    // `dead_after` at one); the procedure sleeps for three. Only the listener's heartbeat frames,
    // one a second while the call runs, are heard meanwhile; without them the call would fail
    // `Unreachable`. A second call after it finds the binding as it was.
    let server = Server::bind("127.0.0.1:0").unwrap().export(NapperServer::new(Nap)).start().unwrap();
    let timing = tiercel::Timing { dead_after: Duration::from_secs(1), ..tiercel::Timing::default() };
    let client: NapperClient = Client::connect(format!("tcp://{}", server.addr()))
        .unwrap()
        .with_config(ClientConfig { timing, ..ClientConfig::default() })
        .import()
        .unwrap();
    assert_eq!(client.binding().transport(), Transport::Tcp);
    let started = Instant::now();
    assert_eq!(client.nap(3000).unwrap(), 3000);
    assert!(started.elapsed() >= Duration::from_secs(3), "the procedure slept its three seconds");
    assert_eq!(client.nap(1).unwrap(), 1);
}

/// A call frame of procedure `procedure` of Test on the raw binding `granted`, slot `slot`.
fn call_frame(granted: &tiercel_proto::bind::Granted, slot: u32, seq: u32, procedure: u16, args: &[u8]) -> Vec<u8> {
    let h = Header {
        binding: granted.binding,
        slot,
        seq,
        procedure,
        incarnation: granted.incarnation,
        payload_len: args.len() as u32,
        message_len: args.len() as u32,
        ..Header::new(Kind::Call)
    };
    let mut frame = tiercel_proto::stream::prefix(HEADER_LEN + args.len()).to_vec();
    frame.extend_from_slice(&h.to_bytes());
    frame.extend_from_slice(args);
    frame
}

/// Reads the next result frame from `s`: its slot, status and results.
fn read_result(s: &mut TcpStream) -> (u32, tiercel_proto::wire::Status, Vec<u8>) {
    loop {
        let mut len = [0u8; 4];
        s.read_exact(&mut len).unwrap();
        let mut frame = vec![0u8; u32::from_le_bytes(len) as usize];
        s.read_exact(&mut frame).unwrap();
        let p = tiercel_proto::wire::Packet::new_checked(&frame[..]).unwrap();
        if p.kind() == Kind::Result {
            return (p.slot(), p.status(), p.payload().to_vec());
        }
    }
}

#[test]
fn calls_read_together_run_in_turn_and_their_results_go_out_together_but_never_wait_for_a_slow_one() {
    const ADD: u16 = 1;
    const WORK: u16 = 16;
    let server = serve();
    let (mut s, granted) = bind_raw(&server);
    let add = |a: i32, b: i32| [a.to_le_bytes(), b.to_le_bytes()].concat();
    for round in 1..=20u32 {
        // Three additions, a call of a procedure not yet seen to be quick (20 ms of work in the
        // first round), and one more addition, with one write: the server reads them together.
        let mut frames = Vec::new();
        for slot in 0..3 {
            frames.extend(call_frame(&granted, slot, round, ADD, &add(slot as i32, 100)));
        }
        let work = if round == 1 { 20_000u32 } else { 0 };
        frames.extend(call_frame(&granted, 3, round, WORK, &work.to_le_bytes()));
        frames.extend(call_frame(&granted, 4, round, ADD, &add(4, 100)));
        s.write_all(&frames).unwrap();
        // Every result comes, each its own call's; those of the calls before the slow one are
        // not held for it: they come before its result. (The last addition's may come before
        // it too: read by another thread of the connection while the slow one runs.)
        let order: Vec<u32> = (0..5)
            .map(|_| {
                let (slot, status, results) = read_result(&mut s);
                assert_eq!(status, tiercel_proto::wire::Status::Ok, "round {round}, slot {slot}");
                if slot != 3 {
                    assert_eq!(results, (slot as i32 + 100).to_le_bytes(), "round {round}, slot {slot}");
                }
                slot
            })
            .collect();
        assert_eq!(order[..3], [0, 1, 2], "round {round}: {order:?}");
        assert!(order[3..] == [3, 4] || order[3..] == [4, 3], "round {round}: {order:?}");
        // The first addition of the first round ran as a lone call does, and showed the procedure
        // quick: the next two ran where they landed, their results sent together.
        if server.stats().sent_together >= 2 {
            break;
        }
        assert!(round < 20, "no results went out together: {:?}", server.stats());
    }
    // Eight additions read together: run by the thread that read them, their results sent
    // together. (Tried again a few times: the thread that reads them may not be the one that
    // learned the procedure quick, and on a loaded machine an addition can take longer than a
    // quick procedure may.)
    for attempt in 1..=20u32 {
        let before = server.stats().sent_together;
        let mut frames = Vec::new();
        for slot in 0..8 {
            frames.extend(call_frame(&granted, slot, 100 + attempt, ADD, &add(slot as i32, 7)));
        }
        s.write_all(&frames).unwrap();
        let mut slots: Vec<u32> = (0..8)
            .map(|_| {
                let (slot, status, results) = read_result(&mut s);
                assert_eq!(status, tiercel_proto::wire::Status::Ok);
                assert_eq!(results, (slot as i32 + 7).to_le_bytes());
                slot
            })
            .collect();
        slots.sort();
        assert_eq!(slots, (0..8).collect::<Vec<_>>());
        if server.stats().sent_together > before {
            return;
        }
    }
    panic!("eight additions read together never had results sent together: {:?}", server.stats());
}
