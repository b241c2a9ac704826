#[tiercel::interface]
pub trait Counter {
    fn bump(&mut self) -> u64;
}

fn main() {}
