#[tiercel::interface]
pub trait Store {
    fn get<T>(&self, key: T) -> u32;
}

fn main() {}
