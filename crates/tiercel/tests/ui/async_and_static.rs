#[tiercel::interface]
pub trait Weird {
    async fn later(&self);
    fn no_receiver(x: u8);
    const LIMIT: u32;
}

fn main() {}
