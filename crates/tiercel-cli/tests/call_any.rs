//! `tiercel call` reads and prints every argument and result of a service whose types are its own
//! (structs, enums, maps, options, nested results, bytes) as JSON, from the shapes the server's
//! listing carries: every procedure of the service, called from the command line.

use std::collections::{BTreeSet, HashMap};
use std::process::Command;

use tiercel::Server;

const TIERCEL: &str = env!("CARGO_BIN_EXE_tiercel");

#[derive(tiercel::Wire, Debug, Clone, PartialEq)]
pub struct Line(pub String, pub u32);

#[derive(tiercel::Wire, Debug, Clone, PartialEq)]
pub struct Order {
    pub id: u64,
    pub lines: Vec<Line>,
    pub note: Option<String>,
    pub tags: HashMap<String, u8>,
}

#[derive(tiercel::Wire, Debug, Clone, PartialEq)]
pub enum Payment {
    Cash,
    Card { last4: u16 },
    Voucher(u32),
}

#[derive(tiercel::Wire, Debug, Clone, PartialEq)]
pub enum ShopError {
    OutOfStock(String),
    Closed,
}

#[tiercel::interface]
pub trait Shop {
    fn place(&self, order: Order, pay: Payment) -> Result<Result<u64, ShopError>, String>;
    fn stock(&self, items: BTreeSet<String>) -> HashMap<String, Option<u32>>;
    fn receipt(&self, id: u64) -> Option<Vec<u8>>;
    fn pairs(&self, p: Vec<(u8, Payment)>) -> u32;
    fn wide(&self, n: u128) -> i128;
}

struct Counter;

impl Shop for Counter {
    fn place(&self, order: Order, pay: Payment) -> Result<Result<u64, ShopError>, String> {
        if order.lines.is_empty() {
            return Err("an order of nothing".into());
        }
        match pay {
            Payment::Cash => Ok(Err(ShopError::Closed)),
            Payment::Card { last4 } => Ok(Ok(order.id * 10_000 + u64::from(last4))),
            Payment::Voucher(v) => Ok(Err(ShopError::OutOfStock(format!("voucher {v}")))),
        }
    }
    fn stock(&self, items: BTreeSet<String>) -> HashMap<String, Option<u32>> {
        items
            .into_iter()
            .map(|i| {
                let n = (i != "caviar").then_some(i.len() as u32);
                (i, n)
            })
            .collect()
    }
    fn receipt(&self, id: u64) -> Option<Vec<u8>> {
        (id > 0).then(|| vec![1, 2, 3])
    }
    fn pairs(&self, p: Vec<(u8, Payment)>) -> u32 {
        p.iter().map(|(n, pay)| u32::from(*n) * if matches!(pay, Payment::Cash) { 1 } else { 2 }).sum()
    }
    fn wide(&self, n: u128) -> i128 {
        -(n as i128)
    }
}

/// `tiercel call ADDR PROC ARGS…`: the result's JSON (the text after ` = ` on the first line).
fn call(addr: &str, args: &[&str]) -> serde_json::Value {
    let out = Command::new(TIERCEL).arg("call").arg(addr).args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "tiercel call {args:?}: {text}{}", String::from_utf8_lossy(&out.stderr));
    let first = text.lines().next().unwrap_or_default();
    let (_, result) = first.split_once(" = ").unwrap_or_else(|| panic!("no result in {text}"));
    serde_json::from_str(result).unwrap_or_else(|e| panic!("{result}: {e}"))
}

#[test]
fn every_procedure_of_a_service_of_its_own_types_is_called_from_the_command_line() {
    let server = Server::bind("udp://127.0.0.1:0").unwrap().export(ShopServer::new(Counter)).start().unwrap();
    let addr = format!("udp://{}", server.addr());
    let order = r#"{"id": 7, "lines": [["tea", 2]], "note": "by noon", "tags": {"gift": 1}}"#;
    assert_eq!(
        call(&addr, &["place", order, r#"{"Card": {"last4": 1234}}"#]),
        serde_json::json!({"Ok": {"Ok": 71234}})
    );
    assert_eq!(call(&addr, &["place", order, r#""Cash""#]), serde_json::json!({"Ok": {"Err": "Closed"}}));
    assert_eq!(
        call(&addr, &["Shop.place", order, r#"{"Voucher": 5}"#]),
        serde_json::json!({"Ok": {"Err": {"OutOfStock": "voucher 5"}}})
    );
    let empty = r#"{"id": 1, "lines": [], "note": null, "tags": {}}"#;
    assert_eq!(call(&addr, &["place", empty, r#""Cash""#]), serde_json::json!({"Err": "an order of nothing"}));
    assert_eq!(call(&addr, &["stock", r#"["tea", "caviar"]"#]), serde_json::json!({"tea": 3, "caviar": null}));
    assert_eq!(call(&addr, &["receipt", "1"]), serde_json::json!({"hex": "010203"}));
    assert_eq!(call(&addr, &["receipt", "0"]), serde_json::Value::Null);
    assert_eq!(call(&addr, &["pairs", r#"[[3, "Cash"], [4, {"Voucher": 1}]]"#]), serde_json::json!(11));
    assert_eq!(call(&addr, &["wide", r#""340282366920938463463374607431768211455""#]), serde_json::json!(1));

    // A value that does not fit the shape is a clear error, and nothing is sent.
    let out = Command::new(TIERCEL).args(["call", &addr, "place", order, r#""Cheque""#]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Payment has no variant \"Cheque\" (it has Cash, Card, Voucher)"), "{err}");
    assert_eq!(server.stats().calls, 9);
}
