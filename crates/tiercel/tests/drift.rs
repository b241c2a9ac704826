//! A client whose copy of an interface has drifted from the server's is refused at import, over
//! both transports, with an error that names both sides; an interface that differs only in what
//! does not travel (argument names) binds.

use std::sync::atomic::{AtomicU64, Ordering};

use tiercel::{BindError, Client, Error, Execution, Import, RunningServer, Server};

#[tiercel::interface]
pub trait Bank {
    fn deposit(&self, amount: u64);
    fn withdraw(&self, amount: u64) -> bool;
}

struct Vault(AtomicU64);

impl Bank for Vault {
    fn deposit(&self, amount: u64) {
        self.0.fetch_add(amount, Ordering::SeqCst);
    }
    fn withdraw(&self, amount: u64) -> bool {
        self.0.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| b.checked_sub(amount)).is_ok()
    }
}

/// Copies of `Bank` as clients built from other versions of the source might have them.
mod drifted {
    #![allow(dead_code)]
    pub mod inserted {
        #[tiercel::interface]
        pub trait Bank {
            fn withdraw(&self, amount: u64) -> bool;
            fn deposit(&self, amount: u64);
        }
    }
    pub mod appended {
        #[tiercel::interface]
        pub trait Bank {
            fn deposit(&self, amount: u64);
            fn withdraw(&self, amount: u64) -> bool;
            fn audit(&self) -> u64;
        }
    }
    pub mod removed {
        #[tiercel::interface]
        pub trait Bank {
            fn deposit(&self, amount: u64);
        }
    }
    pub mod renamed {
        #[tiercel::interface]
        pub trait Bank {
            fn deposit(&self, amount: u64);
            fn take_out(&self, amount: u64) -> bool;
        }
    }
    pub mod argument_type {
        #[tiercel::interface]
        pub trait Bank {
            fn deposit(&self, amount: u32);
            fn withdraw(&self, amount: u64) -> bool;
        }
    }
    pub mod result_type {
        #[tiercel::interface]
        pub trait Bank {
            fn deposit(&self, amount: u64);
            fn withdraw(&self, amount: u64) -> u8;
        }
    }
    pub mod argument_added {
        #[tiercel::interface]
        pub trait Bank {
            fn deposit(&self, amount: u64, memo: String);
            fn withdraw(&self, amount: u64) -> bool;
        }
    }
    pub mod argument_renamed {
        #[tiercel::interface]
        pub trait Bank {
            fn deposit(&self, cents: u64);
            fn withdraw(&self, cents: u64) -> bool;
        }
    }
}

fn bank() -> RunningServer {
    Server::bind("udp://127.0.0.1:0").unwrap().export(BankServer::new(Vault(AtomicU64::new(0)))).start().unwrap()
}

/// The error importing `T` ends with, through `transport` ("udp" or "shm").
/// Returns where the two sides differ, and the error's message.
fn refused<T: Import>(server: &RunningServer, transport: &str) -> (String, String) {
    let addr = match transport {
        "udp" => format!("udp://{}", server.addr()),
        _ => format!("shm:{}", server.addr()),
    };
    let err = Client::connect(addr.as_str()).unwrap().import::<T>().map(drop).unwrap_err();
    let BindError::InterfaceMismatch { name: "Bank", difference } = &err else { panic!("{transport}: {err:?}") };
    let (difference, message) = (difference.clone(), err.to_string());
    assert_eq!(Error::from(err).execution(), Execution::NeverRan, "an import runs no procedure");
    (difference, message)
}

#[test]
fn every_way_an_interface_drifts_is_refused_naming_both_sides() {
    let server = bank();
    for transport in ["udp", "shm"] {
        // The bug this guards against: procedures are numbered by position, so this client's
        // `withdraw` would have run the server's `deposit` and come back `Ok`.
        let (d, err) = refused::<drifted::inserted::BankClient>(&server, transport);
        assert_eq!(
            d,
            "procedure 0: client has `withdraw(u64) -> bool`, server has `deposit(u64)` \
             (client has 2 procedures, server 2)",
            "{transport}"
        );
        assert!(err.to_string().starts_with("interface Bank differs between client and server"), "{err}");
        let (d, _) = refused::<drifted::appended::BankClient>(&server, transport);
        assert!(d.starts_with("procedure 2: client has `audit() -> u64`, server has none"), "{transport}: {d}");
        let (d, _) = refused::<drifted::removed::BankClient>(&server, transport);
        assert!(d.starts_with("procedure 1: client has none, server has `withdraw(u64) -> bool`"), "{transport}: {d}");
        let (d, _) = refused::<drifted::renamed::BankClient>(&server, transport);
        assert!(d.contains("client has `take_out(u64) -> bool`, server has `withdraw(u64) -> bool`"), "{d}");
        let (d, _) = refused::<drifted::argument_type::BankClient>(&server, transport);
        assert!(d.contains("client has `deposit(u32)`, server has `deposit(u64)`"), "{d}");
        let (d, _) = refused::<drifted::result_type::BankClient>(&server, transport);
        assert!(d.contains("client has `withdraw(u64) -> u8`, server has `withdraw(u64) -> bool`"), "{d}");
        let (d, _) = refused::<drifted::argument_added::BankClient>(&server, transport);
        assert!(d.contains("client has `deposit(u64, String)`, server has `deposit(u64)`"), "{d}");
    }
    assert_eq!(server.stats().calls.load(Ordering::Relaxed), 0, "nothing ran");
    assert_eq!(server.stats().bindings.load(Ordering::Relaxed), 0, "nothing was bound");
}

#[test]
fn argument_names_do_not_travel_so_renaming_one_still_binds() {
    let server = bank();
    for addr in [format!("udp://{}", server.addr()), format!("shm:{}", server.addr())] {
        let c: drifted::argument_renamed::BankClient = Client::connect(addr.as_str()).unwrap().import().unwrap();
        c.deposit(5).unwrap();
        assert!(c.withdraw(5).unwrap());
        assert!(!c.withdraw(1).unwrap());
    }
}

#[test]
fn the_signature_and_fingerprint_cover_the_whole_interface() {
    let info = <BankClient as Import>::INFO;
    assert_eq!(info.signature, "deposit(u64)\nwithdraw(u64) -> bool");
    assert_eq!(info.fingerprint, tiercel::__private::fingerprint("Bank", info.signature));
    assert_ne!(info.fingerprint, <drifted::inserted::BankClient as Import>::INFO.fingerprint);
    assert_eq!(info.fingerprint, <drifted::argument_renamed::BankClient as Import>::INFO.fingerprint);
}
