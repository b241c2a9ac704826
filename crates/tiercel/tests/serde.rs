//! `tiercel::Serde<T>` end to end: an interface whose arguments and results are serde types, called
//! over UDP and through shared memory.
#![cfg(feature = "serde")]

use std::collections::HashMap;

use tiercel::wire::Serde;
use tiercel::{Client, Server};

#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq)]
pub struct Order {
    id: u64,
    items: HashMap<String, u32>,
    note: Option<String>,
}

#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq)]
pub enum Receipt {
    Accepted { id: u64, total: u32 },
    Refused(String),
}

#[tiercel::interface]
pub trait Shop {
    fn place(&self, order: Serde<Order>, rush: bool) -> Serde<Receipt>;
}

struct Counter;

impl Shop for Counter {
    fn place(&self, order: Serde<Order>, rush: bool) -> Serde<Receipt> {
        let Serde(order) = order;
        Serde(match order.items.values().sum::<u32>() {
            0 => Receipt::Refused(format!("order {} is empty", order.id)),
            total => Receipt::Accepted { id: order.id, total: total + u32::from(rush) },
        })
    }
}

#[test]
fn serde_arguments_and_results_travel_over_either_transport() {
    let server = Server::bind("udp://127.0.0.1:0").unwrap().export(ShopServer::new(Counter)).start().unwrap();
    for addr in [format!("udp://{}", server.addr()), server.addr().to_string()] {
        let shop: ShopClient = Client::connect(addr.as_str()).unwrap().import().unwrap();
        let order = Order { id: 9, items: [("tea".into(), 2), ("cake".into(), 3)].into(), note: None };
        assert_eq!(shop.place(Serde(order), true).unwrap().0, Receipt::Accepted { id: 9, total: 6 });
        let empty = Order { id: 10, items: HashMap::new(), note: Some("nothing".into()) };
        assert_eq!(shop.place(Serde(empty), false).unwrap().0, Receipt::Refused("order 10 is empty".into()));
    }
}
