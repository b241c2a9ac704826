#[tiercel::interface]
pub trait Bad {
    fn closure(&self, f: fn(u8) -> u8);
    fn object(&self, o: Box<dyn std::any::Any>) -> impl Sized;
    fn mut_ref(&self, v: &mut Vec<u8>);
    fn out_of_vec(&self, v: tiercel::Out<Vec<u8>>);
    fn borrowed_vec(&self, v: &Vec<u8>);
    fn returns_borrow(&self) -> &'static str;
}

fn main() {}
