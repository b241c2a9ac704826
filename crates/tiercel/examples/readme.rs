//! The README's example, kept compiling and running by `cargo test`.

#[tiercel::interface]
pub trait Arith {
    fn add(&self, a: i32, b: i32) -> i32;
    fn checksum(&self, data: tiercel::In<&[u8]>) -> u64; // bytes sent straight from your buffer
}

struct Impl;
impl Arith for Impl {
    fn add(&self, a: i32, b: i32) -> i32 {
        a + b
    }
    fn checksum(&self, data: tiercel::In<&[u8]>) -> u64 {
        data.iter().map(|&b| b as u64).sum()
    }
}

fn main() -> Result<(), tiercel::Error> {
    let server = tiercel::Server::bind("udp://127.0.0.1:0")?.export(ArithServer::new(Impl)).start()?;
    let client: ArithClient = tiercel::Client::connect(server.addr())?.import()?;
    assert_eq!(client.add(2, 3)?, 5);
    assert_eq!(client.checksum(tiercel::In(&[1, 2, 3]))?, 6);
    Ok(())
}
