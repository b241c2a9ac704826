#[tiercel::interface(onc(program = 0x2000_0001))]
pub trait Numbered {
    fn unnumbered(&self);
    #[onc(procedure = 0)]
    fn null(&self);
    #[onc(procedure = 1)]
    fn first(&self);
    #[onc(procedure = 1)]
    fn again(&self);
    #[onc(procedure = 2)]
    fn fill(&self, out: tiercel::Out<&mut [u8]>);
    #[onc(procedure = 3)]
    async fn later(&self);
}

#[tiercel::interface]
pub trait Plain {
    #[onc(procedure = 1)]
    fn numbered(&self);
}

#[derive(tiercel::Xdr)]
pub struct Empty {}

#[derive(tiercel::Xdr)]
pub struct Generic<T> {
    value: T,
}

fn main() {}
