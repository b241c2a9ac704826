//! Secure calls from the command line, with real processes: `tiercel keygen` writes a key pair,
//! `tiercel serve --key` takes only secure bindings over UDP and TCP, and `call`, `check` and `list`
//! with `--server-key` reach it while plain clients and clients expecting another key do not;
//! with `--pin` they learn the key the first time and hold the server to it after.

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

/// `--pin`: the first call learns the server's key and pins it in this user's known-servers file
/// once proven; later calls, `check` and `list` bind only to a server that proves it, and another
/// server at the address is refused, told which line to remove.
#[test]
fn a_client_pins_the_servers_key_on_first_use_and_refuses_another_key_after() {
    let dir = std::env::temp_dir().join(format!("tiercel-cli-pin-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("home")).unwrap();
    let path = |f: &str| dir.join(f).to_str().unwrap().to_owned();
    let as_user = |args: &[&str]| {
        Command::new(TIERCEL).args(args).env("HOME", dir.join("home")).env_remove("XDG_CONFIG_HOME").output().unwrap()
    };
    for key in ["server.key", "other.key"] {
        assert!(tiercel(&["keygen", &path(key)]).status.success());
    }
    let public = |key: &str| std::fs::read_to_string(path(&format!("{key}.pub"))).unwrap().trim().to_string();
    let addr = format!("udp://127.0.0.1:{}", tiercel_seeds::free_port());
    let serve = |key: Option<&str>| {
        let mut serve = Command::new(TIERCEL);
        serve.args(["serve", "--addr", &addr]).stdout(Stdio::piped());
        if let Some(key) = key {
            serve.args(["--key", &path(key)]);
        }
        collect(serve.spawn().unwrap())
    };
    let served = serve(Some("server.key"));
    let call = as_user(&["call", &addr, "add", "2", "3", "--pin"]);
    assert!(String::from_utf8_lossy(&call.stdout).contains("= 5"), "{call:?}");
    let known = dir.join("home/.config/tiercel/known_servers");
    let port = addr.rsplit(':').next().unwrap();
    let line = format!("127.0.0.1:{port} {}\n", public("server.key"));
    assert_eq!(std::fs::read_to_string(&known).unwrap(), line);
    let check = as_user(&["check", &addr, "--pin", "--rounds", "5"]);
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    let list = as_user(&["list", &addr, "--known-servers", known.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&list.stdout).contains("Test v1"), "{list:?}");
    assert_eq!(std::fs::read_to_string(&known).unwrap(), line, "nothing more pinned");
    // Another server, with another key, at the address: refused, and told why.
    drop(served);
    let impostor = serve(Some("other.key"));
    for args in [&["call", &addr, "null", "--pin"][..], &["check", &addr, "--pin", "--rounds", "1"]] {
        let refused = as_user(args);
        assert!(!refused.status.success(), "{args:?}");
        let said = String::from_utf8_lossy(&refused.stderr);
        assert!(said.contains(&public("other.key")) && said.contains("remove that line"), "{args:?}: {said}");
    }
    drop(impostor);
    // A client that pins, with a file of its own, never binds plain.
    let _plain = serve(None);
    let refused = as_user(&["call", &addr, "null", "--known-servers", &path("mine")]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("no key to pin") && said.contains("never ran"), "{said}");
    assert!(!dir.join("mine").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An authority endorses the server's key for its name; a client given the authority (and not the
/// server's key) binds by name securely, and one trusting another authority binds to nothing.
#[test]
fn an_authority_endorses_a_servers_key_and_clients_trusting_it_import_by_name() {
    let dir = std::env::temp_dir().join(format!("tiercel-cli-endorse-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = |f: &str| dir.join(f).to_str().unwrap().to_owned();
    for (file, kind) in [("authority", "--authority"), ("stranger", "--authority"), ("server.key", "")] {
        let out = Command::new(TIERCEL)
            .arg("keygen")
            .args((!kind.is_empty()).then_some(kind))
            .arg(path(file))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    let endorse = |name: &str, file: &str| {
        tiercel(&[
            "endorse",
            "--authority",
            &path("authority"),
            "--name",
            name,
            "--server-key",
            &path("server.key.pub"),
            "--days",
            "2",
            &path(file),
        ])
    };
    assert!(endorse("vault", "vault.endorsement").status.success());
    assert!(endorse("not a name", "bad.endorsement").status.code() == Some(2), "an invalid name is refused");
    // A server's key is not an authority's.
    let out = tiercel(&[
        "endorse",
        "--authority",
        &path("server.key"),
        "--name",
        "vault",
        "--server-key",
        &path("server.key.pub"),
        &path("x"),
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an authority's private key"), "{out:?}");

    let registry = format!("dir:{}", path("names"));
    let served = collect(
        Command::new(TIERCEL)
            .args(["serve", "--addr", "udp://127.0.0.1:0", "--name", "vault", "--registry", &registry])
            .args(["--key", &path("server.key"), "--endorsement", &path("vault.endorsement")])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let call =
        tiercel(&["call", "vault", "add", "2", "3", "--registry", &registry, "--authority", &path("authority.pub")]);
    assert!(String::from_utf8_lossy(&call.stdout).contains("= 5"), "{call:?}");
    let check =
        tiercel(&["check", "vault", "--registry", &registry, "--authority", &path("authority.pub"), "--rounds", "5"]);
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    let stranger = tiercel(&["call", "vault", "null", "--registry", &registry, "--authority", &path("stranger.pub")]);
    let said = String::from_utf8_lossy(&stranger.stderr);
    assert!(!stranger.status.success() && said.contains("not endorsed") && said.contains("never ran"), "{said}");
    // Listing the name: with the authority, securely from the endorsed exporter; with another
    // authority, nothing, and told why.
    let list = tiercel(&["list", "vault", "--registry", &registry, "--authority", &path("authority.pub")]);
    assert!(String::from_utf8_lossy(&list.stdout).contains("Test v1"), "{list:?}");
    let list = tiercel(&["list", "vault", "--registry", &registry, "--authority", &path("stranger.pub")]);
    assert!(!list.status.success() && String::from_utf8_lossy(&list.stderr).contains("not endorsed"), "{list:?}");
    drop(served);
    std::fs::remove_dir_all(&dir).unwrap();
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip (iproute2)");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// Three network namespaces in a row, client, relay and server, joined by two veth pairs: the
/// client reaches the relay at 192.0.2.2, the relay the server at 198.51.100.2 (TEST-NET-1 and -2,
/// which exist only inside these namespaces). Removed on drop.
struct Path {
    names: [String; 3],
}

impl Path {
    fn new() -> Path {
        let id = std::process::id();
        let names = [format!("tsC{id}"), format!("tsR{id}"), format!("tsS{id}")];
        let path = Path { names };
        let [c, r, s] = &path.names;
        for ns in [c, r, s] {
            ip(&["netns", "add", ns]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        let links = [(c, r, "192.0.2.1/24", "192.0.2.2/24", "a"), (r, s, "198.51.100.1/24", "198.51.100.2/24", "b")];
        for (left, right, left_addr, right_addr, tag) in links {
            let (l, rr) = (format!("ts{tag}l{id}"), format!("ts{tag}r{id}"));
            ip(&["link", "add", &l, "type", "veth", "peer", "name", &rr]);
            ip(&["link", "set", &l, "netns", left]);
            ip(&["link", "set", &rr, "netns", right]);
            for (ns, dev, addr) in [(left, &l, left_addr), (right, &rr, right_addr)] {
                ip(&["-n", ns, "addr", "add", addr, "dev", dev]);
                ip(&["-n", ns, "link", "set", dev, "up"]);
            }
        }
        path
    }

    /// `tiercel ARGS` in namespace `i` (0 client, 1 relay, 2 server).
    fn tiercel(&self, i: usize, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.names[i], TIERCEL]).args(args);
        c
    }
}

impl Drop for Path {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth ends inside it, and with them the pairs.
        for ns in &self.names {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// The counters of the relay's summary line.
fn relayed(out: &std::process::Output) -> std::collections::HashMap<String, u64> {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("relayed ")).unwrap_or_else(|| panic!("relay said {text:?}"));
    line.split_whitespace()
        .skip(1)
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.into(), v.parse().unwrap()))
        .collect()
}

#[test]
fn across_namespaces_an_on_path_relay_reads_nothing_and_what_it_changes_or_replays_runs_nothing() {
    tiercel_seeds::needs!(ROOT, IP);
    let path = Path::new();
    let dir = std::env::temp_dir().join(format!("tiercel-cli-relay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("server.key");
    let key_s = key.to_str().unwrap();
    assert!(tiercel(&["keygen", key_s]).status.success());
    let public = std::fs::read_to_string(dir.join("server.key.pub")).unwrap().trim().to_string();
    // Plain bindings too, so that the relay can show what it reads of one.
    let args = ["serve", "--addr", "udp://198.51.100.2:7373", "--key", key_s, "--allow-plain", "--stats-every", "1"];
    let served = collect(path.tiercel(2, &args).stdout(Stdio::piped()).spawn().unwrap());
    // Each relay ends once the test closes its standard input, its calls done (however long a
    // loaded machine made them take), or after a minute.
    let relay = |flip: &str, replay: &str| {
        let args =
            ["relay", "--listen", "192.0.2.2:7400", "--to", "198.51.100.2:7373", "--marker", "MARKER-of-the-call"];
        let extra = ["--flip-every", flip, "--replay-every", replay, "--seconds", "60", "--until-stdin-closes"];
        let mut c = path.tiercel(1, &[&args[..], &extra[..]].concat());
        c.env(tiercel_bench::helpers::HELPER_ENV, "1").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap()
    };
    let target = "udp://192.0.2.2:7400";
    let call = |extra: &[&str]| {
        let args = [&["call", target, "string", "MARKER-of-the-call"][..], extra].concat();
        path.tiercel(0, &args).output().unwrap()
    };
    // A plain binding through the relay: the relay reads the marker.
    let plain = relay("0", "0");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let out = call(&[]);
    assert!(out.status.success(), "{out:?}");
    let seen = relayed(&plain.wait_with_output().unwrap());
    assert!(seen["marker"] > 0, "the relay reads a plain binding's arguments: {seen:?}");
    // A secure one, with a bit flipped in every fifth datagram each way and every third one from
    // the client sent twice: the relay reads nothing, every call returns its right result, and
    // what it changed or replayed is dropped unopened.
    let before = served.wait_stats_since(0);
    let secure = relay("5", "3");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let out = call(&["--server-key", &public]);
    assert!(out.status.success(), "{out:?}");
    let check = path.tiercel(0, &["check", target, "--server-key", &public, "--rounds", "20"]).output().unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    let seen = relayed(&secure.wait_with_output().unwrap());
    assert_eq!(seen["marker"], 0, "the relay read a secure binding's arguments: {seen:?}");
    assert!(seen["flipped"] > 0 && seen["replayed"] > 0, "{seen:?}");
    let printed = served.lines.lock().unwrap().len();
    let after = served.wait_stats_since(printed);
    let unopened = after["unopened"] - before["unopened"];
    assert!(unopened > 0, "what the relay changed or replayed was dropped unopened: {seen:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
