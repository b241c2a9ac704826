#[derive(tiercel::Wire)]
pub union Both {
    a: u32,
    b: f32,
}

fn main() {}
