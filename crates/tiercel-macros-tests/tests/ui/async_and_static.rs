#[tiercel::interface]
pub trait Weird {
    async fn later(&self, name: &str);
    async fn fill(&self, out: tiercel::Out<&mut [u8]>);
    async fn defaulted(&self) {}
    fn no_receiver(x: u8);
    const LIMIT: u32;
}

fn main() {}
