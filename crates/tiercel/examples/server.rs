//! A standalone server: `cargo run --example server [ADDR]` (default `udp://127.0.0.1:7878`), then
//! `cargo run --example client [ADDR]` in another terminal. Ctrl-C shuts it down gracefully: new
//! bindings and calls are refused, calls under way finish.

#[allow(dead_code)] // each example uses one side of the interface
mod arith;

use arith::{Arith, ArithServer};

struct Calculator;

impl Arith for Calculator {
    fn add(&self, a: i32, b: i32) -> i32 {
        a.wrapping_add(b)
    }
    fn checksum(&self, data: tiercel::In<&[u8]>) -> u64 {
        data.iter().map(|&b| u64::from(b)).sum()
    }
    fn divide(&self, a: i64, b: i64) -> Result<i64, String> {
        a.checked_div(b).ok_or_else(|| format!("cannot divide {a} by {b}"))
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "udp://127.0.0.1:7878".into());
    let server = tiercel::Server::bind(addr.as_str())?.export(ArithServer::new(Calculator)).start()?;
    println!("listening {}", server.addr());
    let stats = server.stats_handle();
    // Serves until SIGTERM or Ctrl-C, then shuts down gracefully.
    server.run_until_signal()?;
    println!("shutting down after {} calls", stats.get().calls);
    Ok(())
}
