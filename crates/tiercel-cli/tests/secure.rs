//! Secure calls from the command line, with real processes: `tiercel keygen` writes a key pair,
//! `tiercel serve --key` takes only secure bindings over UDP and TCP, and `call`, `check` and `list`
//! with `--server-key` reach it while plain clients and clients expecting another key do not.

use std::process::{Command, Stdio};

mod common;
use common::{collect, TIERCEL};

fn tiercel(args: &[&str]) -> std::process::Output {
    Command::new(TIERCEL).args(args).output().unwrap()
}

#[test]
fn keygen_serve_with_a_key_and_call_with_the_servers_key() {
    let dir = std::env::temp_dir().join(format!("tiercel-cli-secure-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("server.key");
    let key_s = key.to_str().unwrap();
    let out = tiercel(&["keygen", key_s]);
    assert!(out.status.success(), "{out:?}");
    let public = std::fs::read_to_string(dir.join("server.key.pub")).unwrap().trim().to_string();
    assert!(String::from_utf8_lossy(&out.stdout).contains(&public));
    let again = tiercel(&["keygen", key_s]);
    assert!(!again.status.success(), "an existing key is never replaced");
    let served = collect(
        Command::new(TIERCEL)
            .args(["serve", "--addr", "udp://127.0.0.1:0", "--key", key_s])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let addr = served.addr.clone();
    let port = addr.rsplit(':').next().unwrap();
    let pub_file = format!("{key_s}.pub");
    // With the server's key (its file or its hex): every call of the Test interface verifies.
    let check = tiercel(&["check", &addr, "--server-key", &pub_file, "--rounds", "20"]);
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    let call = tiercel(&["call", &addr, "add", "2", "3", "--server-key", &public]);
    assert!(String::from_utf8_lossy(&call.stdout).contains("= 5"), "{call:?}");
    let list = tiercel(&["list", &addr, "--server-key", &public]);
    assert!(String::from_utf8_lossy(&list.stdout).contains("Test v1"), "{list:?}");
    // Plain, over UDP and TCP: refused, and told why.
    for target in [addr.clone(), format!("tcp://127.0.0.1:{port}")] {
        let plain = tiercel(&["call", &target, "null"]);
        assert!(!plain.status.success());
        let said = String::from_utf8_lossy(&plain.stderr);
        assert!(said.contains("only secure bindings") && said.contains("never ran"), "{target}: {said}");
    }
    // With the key, over TCP too: the bind is the same handshake, and every frame is sealed.
    let tcp = format!("tcp://127.0.0.1:{port}");
    let call = tiercel(&["call", &tcp, "add", "2", "3", "--server-key", &public]);
    assert!(String::from_utf8_lossy(&call.stdout).contains("= 5"), "{call:?}");
    let check = tiercel(&["check", &tcp, "--server-key", &pub_file, "--rounds", "5"]);
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    // Expecting another server's key: nothing binds.
    let other = dir.join("other.key");
    assert!(tiercel(&["keygen", other.to_str().unwrap()]).status.success());
    let wrong = tiercel(&["call", &addr, "null", "--server-key", &format!("{}.pub", other.display())]);
    assert!(!wrong.status.success(), "{wrong:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
