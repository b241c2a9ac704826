#[tiercel::interface]
pub trait Store<T> {
    fn get(&self, key: u32) -> u32;
}

fn main() {}
