//! Interfaces that evolve without lockstep deploys. A client whose copy of an interface differs from
//! the server's binds by procedure names and shapes, on every transport: procedures added, removed,
//! reordered or renamed on either side bind, a procedure the server lacks fails without being sent,
//! and a procedure of the same name whose arguments, result or any type they reach differ is
//! refused at bind, naming the procedure and the type.

use std::sync::atomic::{AtomicU64, Ordering};

use tiercel::{BindError, CallError, Client, ClientConfig, Error, Execution, Import, RunningServer, Server};

#[derive(tiercel::Wire, Debug, Clone, PartialEq)]
pub struct Memo {
    pub text: String,
    pub cents: u64,
}

#[derive(tiercel::Wire, Debug, Clone, PartialEq)]
pub enum Kind {
    Cash,
    Card { last4: u16 },
}

#[tiercel::interface]
pub trait Bank {
    fn deposit(&self, amount: u64);
    fn withdraw(&self, amount: u64) -> bool;
    fn note(&self, memo: Memo, kind: Kind) -> Option<Memo>;
}

struct Vault(AtomicU64);

/// Takes `amount` from `balance` if it holds that much. (A loop of its own: `fetch_update` is
/// deprecated from Rust 1.99, and its new name is not in older releases.)
fn take(balance: &AtomicU64, amount: u64) -> bool {
    let mut b = balance.load(Ordering::SeqCst);
    while let Some(left) = b.checked_sub(amount) {
        match balance.compare_exchange_weak(b, left, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => return true,
            Err(now) => b = now,
        }
    }
    false
}

impl Bank for Vault {
    fn deposit(&self, amount: u64) {
        self.0.fetch_add(amount, Ordering::SeqCst);
    }
    fn withdraw(&self, amount: u64) -> bool {
        take(&self.0, amount)
    }
    fn note(&self, memo: Memo, kind: Kind) -> Option<Memo> {
        (kind != Kind::Cash).then_some(memo)
    }
}

/// Copies of `Bank` as clients built from other versions of the source might have them.
mod drifted {
    #![allow(dead_code)]
    pub use super::{Kind, Memo};

    /// The same procedures in another order.
    pub mod reordered {
        use super::*;
        #[tiercel::interface]
        pub trait Bank {
            fn note(&self, memo: Memo, kind: Kind) -> Option<Memo>;
            fn withdraw(&self, amount: u64) -> bool;
            fn deposit(&self, amount: u64);
        }
    }
    /// A newer client: a procedure the server does not have yet, inserted first.
    pub mod added {
        use super::*;
        #[tiercel::interface]
        pub trait Bank {
            fn audit(&self) -> u64;
            fn deposit(&self, amount: u64);
            fn withdraw(&self, amount: u64) -> bool;
            fn note(&self, memo: Memo, kind: Kind) -> Option<Memo>;
        }
    }
    /// An older client: fewer procedures.
    pub mod removed {
        #[tiercel::interface]
        pub trait Bank {
            fn withdraw(&self, amount: u64) -> bool;
        }
    }
    /// Argument names do not travel.
    pub mod argument_renamed {
        use super::*;
        #[tiercel::interface]
        pub trait Bank {
            fn deposit(&self, cents: u64);
            fn withdraw(&self, cents: u64) -> bool;
            fn note(&self, m: Memo, k: Kind) -> Option<Memo>;
        }
    }
    pub mod argument_type {
        #[tiercel::interface]
        pub trait Bank {
            fn deposit(&self, amount: u32);
        }
    }
    pub mod result_type {
        #[tiercel::interface]
        pub trait Bank {
            fn withdraw(&self, amount: u64) -> u8;
        }
    }
    pub mod argument_added {
        #[tiercel::interface]
        pub trait Bank {
            fn deposit(&self, amount: u64, memo: String);
        }
    }
    /// `Memo`'s fields in another order.
    pub mod fields_reordered {
        #[derive(tiercel::Wire, Debug, Clone, PartialEq)]
        pub struct Memo {
            pub cents: u64,
            pub text: String,
        }
        #[tiercel::interface]
        pub trait Bank {
            fn note(&self, memo: Memo, kind: super::Kind) -> Option<Memo>;
        }
    }
    /// `Memo` with a field more.
    pub mod field_added {
        #[derive(tiercel::Wire, Debug, Clone, PartialEq)]
        pub struct Memo {
            pub text: String,
            pub cents: u64,
            pub urgent: bool,
        }
        #[tiercel::interface]
        pub trait Bank {
            fn note(&self, memo: Memo, kind: super::Kind) -> Option<Memo>;
        }
    }
    /// `Memo`'s field of another type.
    pub mod field_type {
        #[derive(tiercel::Wire, Debug, Clone, PartialEq)]
        pub struct Memo {
            pub text: String,
            pub cents: i64,
        }
        #[tiercel::interface]
        pub trait Bank {
            fn note(&self, memo: Memo, kind: super::Kind) -> Option<Memo>;
        }
    }
    /// `Kind` with a variant more, and one whose field changed.
    pub mod variants_changed {
        #[derive(tiercel::Wire, Debug, Clone, PartialEq)]
        pub enum Kind {
            Cash,
            Card { last4: u32 },
        }
        #[tiercel::interface]
        pub trait Bank {
            fn note(&self, memo: super::Memo, kind: Kind) -> Option<super::Memo>;
        }
    }
    pub mod variant_added {
        #[derive(tiercel::Wire, Debug, Clone, PartialEq)]
        pub enum Kind {
            Cash,
            Card { last4: u16 },
            Cheque(u32),
        }
        #[tiercel::interface]
        pub trait Bank {
            fn note(&self, memo: super::Memo, kind: Kind) -> Option<super::Memo>;
        }
    }
}

fn bank() -> RunningServer {
    Server::bind("udp://127.0.0.1:0").unwrap().export(BankServer::new(Vault(AtomicU64::new(0)))).start().unwrap()
}

/// The server's address through `transport`.
fn at(server: &RunningServer, transport: &str) -> String {
    match transport {
        "udp" => format!("udp://{}", server.addr()),
        "tcp" => format!("tcp://{}", server.addr()),
        _ => format!("shm:{}", server.addr()),
    }
}

const TRANSPORTS: [&str; 3] = ["udp", "shm", "tcp"];

/// The error importing `T` ends with: the procedure that differs, and how.
fn refused<T: Import>(server: &RunningServer, transport: &str) -> (&'static str, String) {
    let err = Client::connect(at(server, transport).as_str()).unwrap().import::<T>().map(drop).unwrap_err();
    let BindError::ProcedureMismatch { name: "Bank", procedure, difference } = &err else {
        panic!("{transport}: {err:?}")
    };
    assert!(err.to_string().starts_with(&format!("interface Bank: procedure `{procedure}` differs")), "{err}");
    let (procedure, difference) = (*procedure, difference.clone());
    assert_eq!(Error::from(err).execution(), Execution::NeverRan, "an import runs no procedure");
    (procedure, difference)
}

#[test]
fn procedures_added_removed_reordered_or_renamed_bind_by_name_on_every_transport() {
    let server = bank();
    let memo = Memo { text: "rent".into(), cents: 5 };
    for transport in TRANSPORTS {
        let addr = at(&server, transport);
        // The bug this guards against: numbered by position, this client's `withdraw` would run the
        // server's `withdraw`'s neighbour and come back `Ok`.
        let c: drifted::reordered::BankClient = Client::connect(addr.as_str()).unwrap().import().unwrap();
        c.deposit(5).unwrap();
        assert!(c.withdraw(5).unwrap(), "{transport}");
        assert!(!c.withdraw(1).unwrap(), "{transport}");
        assert_eq!(c.note(memo.clone(), Kind::Card { last4: 7 }).unwrap(), Some(memo.clone()), "{transport}");

        let c: drifted::added::BankClient = Client::connect(addr.as_str()).unwrap().import().unwrap();
        let calls = server.stats().calls;
        let err = c.audit().unwrap_err();
        assert!(matches!(err, CallError::NotExported { interface: "Bank", procedure: "audit" }), "{err:?}");
        assert_eq!(err.execution(), Execution::NeverRan);
        assert_eq!(server.stats().calls, calls, "{transport}: never sent");
        c.deposit(3).unwrap();
        assert!(c.withdraw(3).unwrap(), "{transport}");

        let c: drifted::removed::BankClient = Client::connect(addr.as_str()).unwrap().import().unwrap();
        assert!(!c.withdraw(1).unwrap(), "{transport}");

        let c: drifted::argument_renamed::BankClient = Client::connect(addr.as_str()).unwrap().import().unwrap();
        c.deposit(2).unwrap();
        assert!(c.withdraw(2).unwrap(), "{transport}");
    }
}

#[test]
fn a_procedure_whose_shape_changed_is_refused_naming_it_and_the_type() {
    let server = bank();
    for transport in TRANSPORTS {
        let (p, d) = refused::<drifted::argument_type::BankClient>(&server, transport);
        assert_eq!((p, d.as_str()), ("deposit", "client has `deposit(u32)`, server has `deposit(u64)`"));
        let (p, d) = refused::<drifted::result_type::BankClient>(&server, transport);
        assert_eq!(
            (p, d.as_str()),
            ("withdraw", "client has `withdraw(u64) -> u8`, server has `withdraw(u64) -> bool`")
        );
        let (p, d) = refused::<drifted::argument_added::BankClient>(&server, transport);
        assert_eq!((p, d.as_str()), ("deposit", "client has `deposit(u64, String)`, server has `deposit(u64)`"));
        let (p, d) = refused::<drifted::fields_reordered::BankClient>(&server, transport);
        assert_eq!(p, "note");
        assert_eq!(
            d,
            "type Memo: client has `struct { cents: u64, text: String }`, server has `struct { text: String, cents: u64 }`"
        );
        let (_, d) = refused::<drifted::field_added::BankClient>(&server, transport);
        assert!(d.starts_with("type Memo: client has `struct { text: String, cents: u64, urgent: bool }`"), "{d}");
        let (_, d) = refused::<drifted::field_type::BankClient>(&server, transport);
        assert!(d.starts_with("type Memo: client has `struct { text: String, cents: i64 }`"), "{d}");
        let (_, d) = refused::<drifted::variants_changed::BankClient>(&server, transport);
        assert_eq!(
            d,
            "type Kind: client has `enum { Cash, Card { last4: u32 } }`, server has `enum { Cash, Card { last4: u16 } }`"
        );
        let (_, d) = refused::<drifted::variant_added::BankClient>(&server, transport);
        assert!(d.contains("Cheque(u32)"), "{d}");
    }
    assert_eq!(server.stats().calls, 0, "nothing ran");
    assert_eq!(server.stats().bindings, 0, "nothing was bound");
}

#[test]
fn the_signature_covers_every_type_a_procedure_reaches() {
    let info = <BankClient as Import>::INFO;
    assert_eq!(
        info.signature(),
        "deposit(u64)\nwithdraw(u64) -> bool\nnote(Memo, Kind) -> Option<Memo>\n\
         type Memo = struct { text: String, cents: u64 }\ntype Kind = enum { Cash, Card { last4: u16 } }"
    );
    assert_eq!(info.fingerprint(), tiercel::__private::fingerprint("Bank", info.signature()));
    let ours = info.procedure_fingerprints();
    let reordered = <drifted::reordered::BankClient as Import>::INFO.procedure_fingerprints();
    assert_eq!((ours[0], ours[1], ours[2]), (reordered[2], reordered[1], reordered[0]));
    assert_ne!(info.fingerprint(), <drifted::reordered::BankClient as Import>::INFO.fingerprint());
    assert_eq!(info.fingerprint(), <drifted::argument_renamed::BankClient as Import>::INFO.fingerprint());
    let moved = <drifted::fields_reordered::BankClient as Import>::INFO.procedure_fingerprints();
    assert_ne!(ours[2], moved[0], "a type's fields are part of the procedure's shape");
}

/// A rolling upgrade: clients built against the old interface keep calling through a restart of
/// their server into the new version (which gained a procedure, in the middle), and clients built
/// against the new one call an old server, where only the new procedure fails, never sent.
#[test]
fn a_rolling_upgrade_needs_no_lockstep_on_any_transport() {
    #[allow(dead_code)]
    mod v2 {
        use super::{Kind, Memo};
        #[tiercel::interface]
        pub trait Bank {
            fn deposit(&self, amount: u64);
            fn balance(&self) -> u64;
            fn withdraw(&self, amount: u64) -> bool;
            fn note(&self, memo: Memo, kind: Kind) -> Option<Memo>;
        }
    }
    struct NewVault(AtomicU64);
    impl v2::Bank for NewVault {
        fn deposit(&self, amount: u64) {
            self.0.fetch_add(amount, Ordering::SeqCst);
        }
        fn balance(&self) -> u64 {
            self.0.load(Ordering::SeqCst)
        }
        fn withdraw(&self, amount: u64) -> bool {
            take(&self.0, amount)
        }
        fn note(&self, memo: Memo, _: Kind) -> Option<Memo> {
            Some(memo)
        }
    }
    for transport in TRANSPORTS {
        let old_server = bank();
        let addr = at(&old_server, transport);
        let rebind = ClientConfig { rebind: true, ..ClientConfig::default() };
        let old: BankClient = Client::connect(addr.as_str()).unwrap().with_config(rebind.clone()).import().unwrap();
        let new: v2::BankClient = Client::connect(addr.as_str()).unwrap().import().unwrap();
        old.deposit(10).unwrap();
        // A new client against the old server: the old procedures work, the new one never runs.
        new.deposit(1).unwrap();
        let err = new.balance().unwrap_err();
        assert!(matches!(err, CallError::NotExported { procedure: "balance", .. }), "{transport}: {err:?}");
        assert!(new.withdraw(11).unwrap(), "{transport}");

        // The server restarts into the new version at the same address.
        let port = old_server.addr();
        old_server.shutdown();
        let new_server = Server::bind(format!("udp://{port}").as_str())
            .unwrap()
            .export(v2::BankServer::new(NewVault(AtomicU64::new(100))))
            .start()
            .unwrap();
        // The old client's binding moves to it (the first call may find the old server gone, and
        // says whether it may have run), and its calls go on, by name.
        let first = old.deposit(1);
        if let Err(e) = &first {
            assert_ne!(e.execution(), Execution::Ran, "{transport}: {e:?}");
        }
        old.deposit(1).unwrap();
        assert!(old.withdraw(100).unwrap(), "{transport}");
        assert!(old.binding().rebinds() >= 1, "{transport}");
        // A new client binds to the new server with the whole interface.
        let new: v2::BankClient = Client::connect(at(&new_server, transport).as_str()).unwrap().import().unwrap();
        assert!(new.balance().unwrap() >= 1, "{transport}");
        new_server.shutdown();
    }
}
