pub struct NotWire;

#[tiercel::interface]
pub trait Uses {
    fn take(&self, x: NotWire);
}

fn main() {}
