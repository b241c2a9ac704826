//! The lossy-network soak at CI size: 100,000 calls from 8 threads across two network namespaces,
//! nftables dropping 10% of UDP each way, the fault layer duplicating 5%, reordering 5% and
//! corrupting 1% of packets on both sides; the server reads its port through two sockets, so the
//! callers' datagrams are spread over two sets of workers. Needs root, `ip` and `nft`
//! (`tiercel soak` without `--netns` runs on loopback, the fault layer dropping packets instead).
#![cfg(feature = "fault-injection")]

use std::process::Command;

#[test]
fn lossy_network_soak_runs_every_call_at_most_once() {
    tiercel_seeds::needs!(ROOT, IP, NFT);
    let args = [
        "soak",
        "--calls",
        "100000",
        "--threads",
        "8",
        "--loss",
        "10",
        "--dup",
        "5",
        "--reorder",
        "5",
        "--sockets",
        "2",
        "--netns",
    ];
    let out = Command::new(env!("CARGO_BIN_EXE_tiercel")).args(args).output().expect("run tiercel soak");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The figures, for the CI log.
    println!("{stdout}");
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("soak passed"), "{stdout}");
    assert!(stdout.contains("2 UDP sockets"), "{stdout}");
    assert!(stdout.contains("ran twice: 0"), "{stdout}");
    assert!(stdout.contains("returned wrong:        0"), "{stdout}");
    assert!(stdout.contains("failed with an error:  0 "), "no call may fail on a network that only loses: {stdout}");
}
