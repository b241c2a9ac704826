//! A standalone client of `cargo run --example server`: `cargo run --example client [ADDR]`.
//! Prints each result, or the error and whether the procedure ran.

#[allow(dead_code)] // each example uses one side of the interface
mod arith;

use arith::ArithClient;
use tiercel::{CallError, Execution};

fn main() -> Result<(), tiercel::Error> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "udp://127.0.0.1:7878".into());
    let client: ArithClient = tiercel::Client::connect(addr.as_str())?.import()?;
    println!("bound over {:?} to {}", client.binding().transport(), client.binding().server());
    println!("add(2, 3) = {}", client.add(2, 3)?);
    let data: Vec<u8> = (0..=255).collect();
    println!("checksum(0..=255) = {}", client.checksum(tiercel::In(&data))?);
    // The outer result is the call's, the inner the procedure's own.
    match client.divide(7, 0) {
        Ok(Ok(q)) => println!("divide(7, 0) = {q}"),
        Ok(Err(why)) => println!("divide(7, 0) failed in the procedure: {why}"),
        Err(e) => report(&e),
    }
    // A deadline applies to the calls of this clone of the binding.
    let hurried = client.with_deadline(std::time::Duration::from_millis(100));
    println!("divide(7, 2) within 100 ms = {:?}", hurried.divide(7, 2)?);
    Ok(())
}

fn report(e: &CallError) {
    let ran = match e.execution() {
        Execution::NeverRan => "never ran: safe to retry",
        Execution::MayHaveRun => "may have run once: retry only if it is idempotent",
        Execution::Ran => "ran and failed",
    };
    eprintln!("call failed: {e} (the procedure {ran})");
}
