use super::*;

fn exporter(name: &str) -> Exporter {
    Exporter {
        name: name.into(),
        interface: "Ledger".into(),
        version: 2,
        fingerprint: 0xfeed_beef,
        addr: "127.0.0.1:7000".parse().unwrap(),
        incarnation: 42,
        pid: std::process::id(),
        key: None,
        endorsement: None,
    }
}

#[test]
fn names() {
    for good in ["accounts", "a", "billing.v2", "east-1_a", &"x".repeat(MAX_NAME_LEN)] {
        assert!(valid_name(good), "{good}");
    }
    for bad in ["", ".hidden", "a/b", "..", "with space", "é", &"x".repeat(MAX_NAME_LEN + 1)] {
        assert!(!valid_name(bad), "{bad}");
    }
}

#[test]
fn entries_round_trip_and_garbage_is_no_entry() {
    let e = exporter("accounts");
    assert_eq!(Exporter::decode(&e.encode()), Some(e.clone()));
    let keyed = Exporter { key: Some(crate::PublicKey([7; 32])), ..exporter("accounts") };
    assert_eq!(Exporter::decode(&keyed.encode()), Some(keyed.clone()));
    assert!(keyed.encode().ends_with(&format!("key {}\n", "07".repeat(32))));
    assert_eq!(Exporter::decode(&keyed.encode().replace("key 07", "key zz")), None);
    assert_eq!(Exporter::decode(&format!("{}junk\n", keyed.encode())), None);
    let authority = crate::Authority::generate().unwrap();
    let endorsed = Exporter {
        endorsement: Some(authority.endorse("accounts", crate::PublicKey([7; 32]), 99).unwrap()),
        ..keyed.clone()
    };
    assert_eq!(Exporter::decode(&endorsed.encode()), Some(endorsed.clone()));
    assert_eq!(Exporter::decode(&format!("{}junk\n", endorsed.encode())), None);
    assert_eq!(Exporter::decode(&endorsed.encode().replace("endorsement accounts", "endorsement")), None);
    for garbage in ["", "tiercel-name 2\n", &e.encode().replace("version 2", "version two"), "\u{0}\u{1}"] {
        assert_eq!(Exporter::decode(garbage), None, "{garbage:?}");
    }
    let swapped = e.encode().replace("name accounts\ninterface Ledger", "interface Ledger\nname accounts");
    assert_eq!(Exporter::decode(&swapped), None);
}

#[test]
fn registries_parse() {
    assert_eq!(Registry::parse("dir:/srv/names").unwrap(), Registry::dir("/srv/names"));
    assert_eq!(Registry::parse("local").unwrap(), Registry::local());
    for bad in ["dir:relative", "etcd", "/srv/names"] {
        assert!(matches!(Registry::parse(bad), Err(NameError::InvalidRegistry { .. })), "{bad}");
    }
}

fn scratch(tag: &str) -> (PathBuf, Registry) {
    let dir = std::env::temp_dir().join(format!("tiercel-names-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    (dir.clone(), Registry::dir(dir))
}

#[test]
fn a_registration_lives_until_dropped_and_a_stale_file_is_removed() {
    let (dir, registry) = scratch("life");
    assert!(registry.lookup("accounts").unwrap().is_empty());
    let a = registry.register(&exporter("accounts")).unwrap();
    let mut b_entry = exporter("accounts");
    b_entry.addr = "127.0.0.1:7001".parse().unwrap();
    let b = registry.register(&b_entry).unwrap();
    let mut found = registry.lookup("accounts").unwrap();
    found.sort_by_key(|e| e.addr);
    assert_eq!(found, vec![exporter("accounts"), b_entry.clone()]);
    assert_eq!(registry.names().unwrap(), vec!["accounts".to_string()]);
    drop(a);
    assert_eq!(registry.lookup("accounts").unwrap(), vec![b_entry.clone()]);
    // A file nobody holds locked is what a killed server leaves: not live, and removed.
    let stale = dir.join("accounts").join("00000000000000ff-1");
    std::fs::write(&stale, exporter("accounts").encode()).unwrap();
    assert_eq!(registry.lookup("accounts").unwrap(), vec![b_entry]);
    assert!(!stale.exists());
    drop(b);
    assert!(registry.lookup("accounts").unwrap().is_empty());
    assert!(registry.names().unwrap().is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn resolving_checks_the_interface_and_names_both() {
    let (dir, registry) = scratch("resolve");
    let _r = registry.register(&exporter("accounts")).unwrap();
    let info =
        InterfaceInfo { name: "Ledger", id: 1, version: 2, procedures: &[], source: crate::SignatureSource::Given("") };
    assert_eq!(registry.resolve("accounts", &info).unwrap().len(), 1);
    // Another copy of the same interface and version: the bind decides, by procedure names.
    let copy = InterfaceInfo { source: crate::SignatureSource::Given("audit()"), ..info };
    assert_eq!(registry.resolve("accounts", &copy).unwrap().len(), 1);
    let other = InterfaceInfo { name: "Test", version: 1, ..info };
    let err = registry.resolve("accounts", &other).unwrap_err().to_string();
    assert!(err.contains("Ledger v2") && err.contains("Test v1") && err.contains("127.0.0.1:7000"), "{err}");
    assert!(matches!(registry.resolve("nobody", &info), Err(NameError::NotFound { .. })));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_directory_others_may_write_to_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let (dir, registry) = scratch("unsafe");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert!(matches!(registry.lookup("accounts"), Err(NameError::Unsafe { .. })));
    assert!(matches!(registry.register(&exporter("accounts")), Err(NameError::Unsafe { .. })));
    // With the sticky bit (as /tmp), others may add entries but not remove or replace ours.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    assert!(registry.lookup("accounts").unwrap().is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_registry_trusts_the_users_it_is_told_to_and_says_so() {
    let registry = Registry::parse("dir:/srv/names?trust=1000,1001").unwrap();
    assert_eq!(registry, Registry::Local(Dir::new("/srv/names").trust(1000).trust(1001)));
    assert_eq!(registry.to_string(), "dir:/srv/names?trust=1000,1001");
    assert_eq!(Registry::parse(&registry.to_string()).unwrap(), registry);
    for bad in ["dir:/srv/names?trust=alice", "dir:/srv/names?owner=1000", "dir:/srv/names?trust="] {
        assert!(matches!(Registry::parse(bad), Err(NameError::InvalidRegistry { .. })), "{bad}");
    }
}

#[test]
fn links_where_the_registry_expects_directories_or_entries_are_not_followed() {
    let (dir, registry) = scratch("links");
    let _r = registry.register(&exporter("accounts")).unwrap();
    // A name whose directory is a link to another name's: refused, however trusted its owner.
    std::os::unix::fs::symlink(dir.join("accounts"), dir.join("billing")).unwrap();
    assert!(matches!(registry.lookup("billing"), Err(NameError::Unsafe { .. })));
    assert!(matches!(registry.register(&exporter("billing")), Err(NameError::Unsafe { .. })));
    // An entry that links to a live entry is no entry.
    let live = std::fs::read_dir(dir.join("accounts")).unwrap().next().unwrap().unwrap().path();
    std::fs::create_dir(dir.join("audit")).unwrap();
    std::os::unix::fs::symlink(&live, dir.join("audit").join("0000000000000001-1")).unwrap();
    assert!(registry.lookup("audit").unwrap().is_empty());
    // This user's own link to the registry leads to it, checked all the way.
    let link = dir.with_extension("link");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&dir, &link).unwrap();
    assert_eq!(Registry::dir(&link).lookup("accounts").unwrap(), vec![exporter("accounts")]);
    let _ = std::fs::remove_file(&link);
    let _ = std::fs::remove_dir_all(&dir);
}
