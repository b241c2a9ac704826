//! Export and import by name through a real etcd (started by the test from Debian's
//! `etcd-server`): servers register under leases, clients spread over them, a shutdown revokes the
//! name at once, and a registry that cannot be reached is a clear error.
#![cfg(feature = "etcd")]

use std::collections::HashSet;

use tiercel::names::{NameError, Registry};
use tiercel::{BindError, Client, Server, ServerError};
use tiercel_seeds::etcd::EtcdServer;

#[tiercel::interface]
pub trait Accounts {
    fn balance(&self, account: u32) -> i64;
}

struct Bank(i64);

impl Accounts for Bank {
    fn balance(&self, account: u32) -> i64 {
        self.0 + i64::from(account)
    }
}

fn bank(registry: &Registry, name: &str, base: i64) -> Result<tiercel::RunningServer, ServerError> {
    Server::bind("127.0.0.1:0")?
        .with_registry(registry.clone())
        .export_as(name, AccountsServer::new(Bank(base)))
        .start()
}

#[test]
fn servers_register_in_etcd_and_clients_spread_over_them() {
    tiercel_seeds::needs!(ETCD);
    let etcd = EtcdServer::start().unwrap();
    let registry = Registry::parse(&etcd.registry(2)).unwrap();
    let servers: Vec<_> = (0..3).map(|i| bank(&registry, "accounts", i * 1000).unwrap()).collect();
    assert_eq!(registry.lookup("accounts").unwrap().len(), 3);
    assert_eq!(registry.names().unwrap(), vec!["accounts".to_string()]);
    let mut seen = HashSet::new();
    for _ in 0..60 {
        let client: AccountsClient =
            Client::connect("accounts").unwrap().with_registry(registry.clone()).import().unwrap();
        let server = client.binding().server();
        let base = servers.iter().position(|s| s.addr() == server).unwrap() as i64 * 1000;
        assert_eq!(client.balance(5).unwrap(), base + 5);
        seen.insert(server);
    }
    assert_eq!(seen.len(), 3, "bindings spread over every exporter");

    // A shutdown revokes the lease: the name is gone at once, not after its time to live.
    let mut servers = servers.into_iter();
    servers.next().unwrap().shutdown();
    assert_eq!(registry.lookup("accounts").unwrap().len(), 2);
    drop(servers);
    assert!(registry.lookup("accounts").unwrap().is_empty());
    let err =
        Client::connect("accounts").unwrap().with_registry(registry.clone()).import::<AccountsClient>().unwrap_err();
    assert!(matches!(err, BindError::Name(NameError::NotFound { .. })), "{err:?}");
}

#[test]
fn an_unreachable_etcd_is_a_clear_error() {
    tiercel_seeds::needs!(ETCD);
    // Nothing listens there (etcd started and stopped).
    let gone = {
        let etcd = EtcdServer::start().unwrap();
        etcd.registry(2)
    };
    let registry = Registry::parse(&gone).unwrap();
    let err = bank(&registry, "accounts", 0).map(|_| ()).unwrap_err();
    assert!(matches!(err, ServerError::Name(NameError::Io { .. })), "{err:?}");
    let err = Client::connect("accounts").unwrap().with_registry(registry).import::<AccountsClient>().unwrap_err();
    assert!(err.to_string().contains("etcd://"), "{err}");
}

#[test]
fn a_binding_by_name_leaves_an_exporter_that_goes_before_calling_it() {
    tiercel_seeds::needs!(ETCD);
    let etcd = EtcdServer::start().unwrap();
    let registry = Registry::parse(&etcd.registry(2)).unwrap();
    let mut servers: Vec<_> = (0..2).map(|i| Some(bank(&registry, "accounts", i * 1000).unwrap())).collect();
    let config = tiercel::ClientConfig { rebind: true, ..tiercel::ClientConfig::default() };
    let client: AccountsClient =
        Client::connect("accounts").unwrap().with_registry(registry.clone()).with_config(config).import().unwrap();
    let first = client.binding().server();
    let at = servers.iter().position(|s| s.as_ref().unwrap().addr() == first).unwrap();
    assert_eq!(client.balance(1).unwrap(), at as i64 * 1000 + 1);
    // Its exporter shuts down: the watch of the name sees the lease revoked, and the next call
    // binds to the other exporter first, instead of being refused by the one shutting down.
    let handle = servers[at].as_ref().unwrap().shutdown_handle();
    handle.shutdown();
    let other = 1 - at;
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while client.binding().rebinds() == 0 {
        std::thread::sleep(std::time::Duration::from_millis(20));
        // No call yet: the binding moves at the next one. Wait for the watch to have seen it.
        if registry.lookup("accounts").unwrap().len() == 1 {
            std::thread::sleep(std::time::Duration::from_millis(200));
            break;
        }
        assert!(std::time::Instant::now() < give_up, "the name was not revoked");
    }
    assert_eq!(client.balance(2).unwrap(), other as i64 * 1000 + 2, "the call went to the exporter left");
    assert_eq!(client.binding().server(), servers[other].as_ref().unwrap().addr());
    assert_eq!(client.binding().rebinds(), 1);
    servers[at].take().unwrap().wait();
}

/// A password file of the test's own, private to its owner.
fn password_file(dir: &std::path::Path, user: &str, password: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(format!("{user}-{password}.password"));
    std::fs::write(&path, format!("{password}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// Turns authentication on in `etcd`, as its administrator would with `etcdctl`: `root`, a user
/// `server` whose role may read and write `tiercel/names/`, and a user `client` whose role may
/// only read it.
fn enable_authentication(etcd: &EtcdServer) {
    // `tiercel/names/` and the end of its range, in base64.
    let range = r#""key":"dGllcmNlbC9uYW1lcy8=","range_end":"dGllcmNlbC9uYW1lczA=""#;
    let steps = [
        ("/v3/auth/role/add", r#"{"name":"root"}"#.to_owned()),
        ("/v3/auth/user/add", r#"{"name":"root","password":"root-pw"}"#.to_owned()),
        ("/v3/auth/user/grant", r#"{"user":"root","role":"root"}"#.to_owned()),
        ("/v3/auth/role/add", r#"{"name":"names-rw"}"#.to_owned()),
        ("/v3/auth/role/grant", format!(r#"{{"name":"names-rw","perm":{{"permType":"READWRITE",{range}}}}}"#)),
        ("/v3/auth/role/add", r#"{"name":"names-r"}"#.to_owned()),
        ("/v3/auth/role/grant", format!(r#"{{"name":"names-r","perm":{{"permType":"READ",{range}}}}}"#)),
        ("/v3/auth/user/add", r#"{"name":"server","password":"server-pw"}"#.to_owned()),
        ("/v3/auth/user/grant", r#"{"user":"server","role":"names-rw"}"#.to_owned()),
        ("/v3/auth/user/add", r#"{"name":"client","password":"client-pw"}"#.to_owned()),
        ("/v3/auth/user/grant", r#"{"user":"client","role":"names-r"}"#.to_owned()),
        ("/v3/auth/enable", "{}".to_owned()),
    ];
    for (path, body) in steps {
        etcd.post(path, &body, None).unwrap();
    }
    let refused = etcd.post("/v3/kv/range", r#"{"key":"dGllcmNlbC9uYW1lcy8="}"#, None);
    assert!(refused.is_err(), "authentication is on: {refused:?}");
}

/// With authentication on: a server registers as a user allowed to write names, a client looks
/// them up and binds as one allowed to read them; no user, a reader registering and a wrong
/// password are refused, saying so; and a registration outlives its token (etcd's last a second
/// here): its shutdown, seconds later, authenticates again and revokes the name at once.
#[test]
fn with_authentication_on_only_users_allowed_to_write_names_register_them() {
    tiercel_seeds::needs!(ETCD);
    let etcd = EtcdServer::start_with(&["--auth-token-ttl", "1"]).unwrap();
    enable_authentication(&etcd);
    let dir = std::env::temp_dir().join(format!("tiercel-etcd-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let as_user = |user: &str, password: &str| {
        let file = password_file(&dir, user, password);
        Registry::parse(&format!("{}&user={user}&password-file={}", etcd.registry(9), file.display())).unwrap()
    };
    let (server_registry, client_registry) = (as_user("server", "server-pw"), as_user("client", "client-pw"));

    let anonymous = Registry::parse(&etcd.registry(9)).unwrap();
    let err = bank(&anonymous, "accounts", 0).map(|_| ()).unwrap_err();
    assert!(err.to_string().contains("user name is empty"), "{err}");
    let err = bank(&client_registry, "accounts", 0).map(|_| ()).unwrap_err();
    assert!(err.to_string().contains("permission denied"), "{err}");
    let err = bank(&as_user("server", "wrong"), "accounts", 0).map(|_| ()).unwrap_err();
    assert!(err.to_string().contains("authentication failed"), "{err}");

    let server = bank(&server_registry, "accounts", 100).unwrap();
    let import = || -> AccountsClient {
        Client::connect("accounts").unwrap().with_registry(client_registry.clone()).import().unwrap()
    };
    assert_eq!(import().balance(1).unwrap(), 101);
    // Three times a token's life: the registration's token has expired.
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert_eq!(client_registry.lookup("accounts").unwrap().len(), 1);
    assert_eq!(import().binding().server(), server.addr());
    // A file of the password that others may read is refused, as secret files are.
    let open = dir.join("open.password");
    std::fs::write(&open, "client-pw").unwrap();
    let spec = format!("{}&user=client&password-file={}", etcd.registry(9), open.display());
    let err = Registry::parse(&spec).unwrap().lookup("accounts").unwrap_err();
    assert!(err.to_string().contains("readable by others"), "{err}");
    // Revoking the lease takes a valid token (unlike keeping it alive): without authenticating
    // again, the name would stay until the lease ran out.
    drop(server);
    assert!(client_registry.lookup("accounts").unwrap().is_empty(), "a shutdown revokes the name at once");
    let _ = std::fs::remove_dir_all(&dir);
}

fn keyed_bank(
    registry: &Registry,
    base: i64,
    key: &tiercel::Identity,
    endorsements: Vec<tiercel::Endorsement>,
) -> Result<tiercel::RunningServer, ServerError> {
    let config = tiercel::ServerConfig {
        key: Some(key.clone()),
        endorsements,
        shared_memory: false,
        ..tiercel::ServerConfig::default()
    };
    Server::bind("127.0.0.1:0")?
        .with_config(config)
        .with_registry(registry.clone())
        .export_as("accounts", AccountsServer::new(Bank(base)))
        .start()
}

/// etcd without authentication: anyone who reaches it may write any entry. A client that trusts an
/// authority binds only with keys it endorsed for the name, and every import reaches the real
/// server past impostors' entries of every kind.
#[test]
fn over_an_etcd_anyone_may_write_a_client_trusting_an_authority_reaches_only_the_server_it_endorsed() {
    tiercel_seeds::needs!(ETCD);
    let etcd = EtcdServer::start().unwrap();
    let registry = Registry::parse(&etcd.registry(5)).unwrap();
    assert!(!registry.vouches());
    let (authority, stranger) = (tiercel::Authority::generate().unwrap(), tiercel::Authority::generate().unwrap());
    let later = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 3600;
    let key = tiercel::Identity::generate().unwrap();
    let endorsed = authority.endorse("accounts", key.public(), later).unwrap();

    // A server does not start with another key's endorsement, or one that ran out.
    let other = tiercel::Identity::generate().unwrap();
    let err = keyed_bank(&registry, 0, &other, vec![endorsed.clone()]).unwrap_err();
    assert!(matches!(err, ServerError::Endorsement { .. }), "{err:?}");
    let spent = authority.endorse("accounts", other.public(), 1).unwrap();
    let err = keyed_bank(&registry, 0, &other, vec![spent.clone()]).unwrap_err();
    assert!(err.to_string().contains("ran out"), "{err}");

    let real = keyed_bank(&registry, 1000, &key, vec![endorsed.clone()]).unwrap();
    let entry = registry.lookup("accounts").unwrap().pop().unwrap();
    assert_eq!(entry.endorsement, Some(endorsed.clone()), "the entry carries the endorsement");

    // Impostors, each with a key of its own: one not endorsed; one endorsed by an authority the
    // client does not trust; and entries written by hand pointing at one of them: a copy of the
    // real entry (its key and endorsement), the real key endorsed for another name, and the
    // impostor's key endorsed in the past.
    let impostor_key = tiercel::Identity::generate().unwrap();
    let unendorsed = keyed_bank(&registry, 0, &impostor_key, Vec::new()).unwrap();
    let strangers_key = tiercel::Identity::generate().unwrap();
    let strangers = stranger.endorse("accounts", strangers_key.public(), later).unwrap();
    let _strangers = keyed_bank(&registry, 0, &strangers_key, vec![strangers]).unwrap();
    let forge = |key, endorsement| tiercel::names::Exporter {
        addr: unendorsed.addr(),
        pid: 1,
        key: Some(key),
        endorsement: Some(endorsement),
        ..entry.clone()
    };
    let elsewhere = authority.endorse("payroll", key.public(), later).unwrap();
    let ran_out = authority.endorse("accounts", impostor_key.public(), 1).unwrap();
    let _forged = [
        registry.register(&forge(key.public(), endorsed.clone())).unwrap(),
        registry.register(&forge(key.public(), elsewhere)).unwrap(),
        registry.register(&forge(impostor_key.public(), ran_out)).unwrap(),
    ];
    assert_eq!(registry.lookup("accounts").unwrap().len(), 6);

    let config = tiercel::ClientConfig { authorities: vec![authority.public()], ..tiercel::ClientConfig::default() };
    let client = Client::connect("accounts").unwrap().with_registry(registry.clone()).with_config(config);
    for _ in 0..24 {
        let bound: AccountsClient = client.import().unwrap();
        assert_eq!(bound.binding().server(), real.addr());
        assert_eq!(bound.binding().server_key(), Some(key.public()), "secure with the endorsed key");
        assert_eq!(bound.balance(5).unwrap(), 1005);
    }
    // Each import starts at an entry taken at random: the chance that none of the 24 met an
    // impostor first is 6^-24.
    assert!(client.exporters_refused() > 0, "impostors met and passed over");

    // A client that trusts none of the authorities binds to no one, and says why.
    let config = tiercel::ClientConfig {
        authorities: vec![tiercel::Authority::generate().unwrap().public()],
        ..tiercel::ClientConfig::default()
    };
    let err = Client::connect("accounts")
        .unwrap()
        .with_registry(registry.clone())
        .with_config(config)
        .import::<AccountsClient>()
        .unwrap_err();
    assert!(matches!(err, BindError::NotEndorsed { .. }), "{err:?}");
}
