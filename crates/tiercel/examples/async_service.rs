//! A service written with the async API only (crate feature `async`), in three processes:
//!
//! ```text
//! cargo run --features async --example async_service -- stock udp://127.0.0.1:7001
//! cargo run --features async --example async_service -- shop udp://127.0.0.1:7002 127.0.0.1:7001
//! cargo run --features async --example async_service -- client 127.0.0.1:7002
//! ```
//!
//! `stock` serves plain procedures; `shop` serves async procedures that await the stock server
//! through its async client; `client` places orders from many tokio tasks through the shop's async
//! client, some with deadlines that expire and some dropped mid-call, checks every result, and
//! checks with the stock server that no order was reserved twice, nor one the shop was told of
//! only after its caller gave up. It exits with an error if anything is wrong.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tiercel::{CallError, Client, Server};

#[tiercel::interface]
pub trait Stock {
    /// Reserves `count` of `item` for order `order`; returns the count reserved.
    fn reserve(&self, order: u64, item: String, count: u32) -> Result<u32, String>;
    /// Orders reserved, and reservations of an order already reserved (never, at most once).
    fn tally(&self) -> (u64, u64);
}

#[tiercel::interface]
pub trait Shop {
    /// Places order `order`: `think_ms` of awaited work, then a reservation through the stock
    /// service, unless the caller's deadline has passed by then.
    async fn order(&self, order: u64, item: String, count: u32, think_ms: u64) -> Result<u32, String>;
    /// The stock service's tally.
    async fn tally(&self) -> Result<(u64, u64), String>;
}

#[derive(Default)]
struct Warehouse {
    orders: Mutex<HashSet<u64>>,
    twice: AtomicU64,
}

impl Stock for Warehouse {
    fn reserve(&self, order: u64, item: String, count: u32) -> Result<u32, String> {
        if item.is_empty() {
            return Err("no such item".into());
        }
        if !self.orders.lock().unwrap_or_else(|p| p.into_inner()).insert(order) {
            self.twice.fetch_add(1, Ordering::Relaxed);
        }
        Ok(count)
    }
    fn tally(&self) -> (u64, u64) {
        (self.orders.lock().unwrap_or_else(|p| p.into_inner()).len() as u64, self.twice.load(Ordering::Relaxed))
    }
}

struct Counter {
    stock: StockAsyncClient,
}

impl Shop for Counter {
    async fn order(&self, order: u64, item: String, count: u32, think_ms: u64) -> Result<u32, String> {
        tokio::time::sleep(Duration::from_millis(think_ms)).await;
        // The caller's deadline came with the call: past it, the caller has given up.
        if tiercel::deadline().is_some_and(|d| Instant::now() >= d) {
            return Err(format!("order {order}: deadline passed before the reservation"));
        }
        self.stock.reserve(order, item, count).await.map_err(|e| e.to_string())?
    }
    async fn tally(&self) -> Result<(u64, u64), String> {
        self.stock.tally().await.map_err(|e| e.to_string())
    }
}

/// Serves until killed, after printing `listening ADDR`.
fn serve(server: tiercel::RunningServer) -> ! {
    println!("listening {}", server.addr());
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

const TASKS: u64 = 64;
const ORDERS_PER_TASK: u64 = 40;

/// How each order of the client ended.
#[derive(Default)]
struct Outcomes {
    ok: AtomicU64,
    late_never_ran: AtomicU64,
    late_may_have_run: AtomicU64,
    dropped: AtomicU64,
}

async fn client(addr: String) -> Result<(), Box<dyn std::error::Error>> {
    let shop: ShopAsyncClient = Client::connect(addr.as_str())?.import_async().await?;
    println!("bound over {:?}", shop.binding().transport());
    // Order numbers of this run (the stock server may have served other clients before).
    let base = u64::from(std::process::id()) << 32;
    let (reserved_before, twice_before) = shop.tally().await??;
    let outcomes = Arc::new(Outcomes::default());
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..TASKS {
        let (shop, outcomes) = (shop.clone(), outcomes.clone());
        tasks.spawn(async move {
            for i in 0..ORDERS_PER_TASK {
                let order = base + t * 1_000 + i;
                let count = (order % 7) as u32 + 1;
                match i % 10 {
                    // A deadline shorter than the work: the call fails, and says whether it may
                    // have run.
                    3 => {
                        match shop.with_deadline(Duration::from_millis(20)).order(order, "tea".into(), count, 60).await
                        {
                            Err(CallError::DeadlineExceeded { may_have_run }) => {
                                let n =
                                    if may_have_run { &outcomes.late_may_have_run } else { &outcomes.late_never_ran };
                                n.fetch_add(1, Ordering::Relaxed);
                            }
                            other => return Err(format!("order {order} with a 20 ms deadline: {other:?}")),
                        }
                    }
                    // Dropped mid-call: the server is told and stops the procedure.
                    7 => {
                        let call = shop.order(order, "tea".into(), count, 200);
                        if tokio::time::timeout(Duration::from_millis(10), call).await.is_ok() {
                            return Err(format!("order {order} of 200 ms finished within 10 ms"));
                        }
                        outcomes.dropped.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => match shop.order(order, "tea".into(), count, i % 3).await {
                        Ok(Ok(n)) if n == count => {
                            outcomes.ok.fetch_add(1, Ordering::Relaxed);
                        }
                        other => return Err(format!("order {order}: {other:?}")),
                    },
                }
            }
            Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    // An unknown item: the procedure ran and failed, and says so.
    let refused = shop.order(u64::MAX, String::new(), 1, 0).await?;
    // Calls dropped or past their deadline that the shop may still be finishing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (reserved, twice) = shop.tally().await??;
    let (reserved, twice) = (reserved - reserved_before, twice - twice_before);
    let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let (ok, late_ran, late_not, dropped) =
        (l(&outcomes.ok), l(&outcomes.late_may_have_run), l(&outcomes.late_never_ran), l(&outcomes.dropped));
    println!(
        "orders: {ok} ok, {} past their deadline ({late_ran} may have run), {dropped} dropped",
        late_ran + late_not
    );
    println!("stock: {reserved} orders reserved, {twice} reserved twice");
    if twice != 0 {
        return Err(format!("{twice} orders were reserved twice").into());
    }
    // Every order that returned was reserved; no late or dropped one was (the shop checks the
    // deadline before reserving, and a dropped call's procedure is stopped at its await).
    if reserved != ok {
        return Err(format!("{reserved} orders reserved, {ok} placed").into());
    }
    if late_ran + late_not == 0 || dropped == 0 {
        return Err("no deadline expired, or no call was dropped".into());
    }
    if refused != Err("no such item".to_string()) {
        return Err(format!("an order of no item: {refused:?}").into());
    }
    println!("at-most-once: ok");
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["stock", addr] => serve(Server::bind(addr)?.export(StockServer::new(Warehouse::default())).start()?),
        ["shop", addr, stock] => {
            let stock: StockAsyncClient = runtime.block_on(Client::connect(stock)?.import_async())?;
            let server = Server::bind(addr)?
                .with_runtime(runtime.handle().clone())
                .export(ShopServer::new(Counter { stock }))
                .start()?;
            serve(server)
        }
        ["client", addr] => runtime.block_on(client(addr.to_string())),
        _ => Err("usage: async_service stock ADDR | shop ADDR STOCK_ADDR | client SHOP_ADDR".into()),
    }
}
