//! XDR as an ONC server's stubs read it: arbitrary bytes as the arguments of a procedure of every
//! XDR type (integers, hypers, booleans, floats, strings, fixed and variable opaque data, arrays,
//! optional data, a recursive list, structs, an enum and a union), through the generated
//! `Program::dispatch`. Bad bytes are `Failure::Garbage`, never a panic or an allocation beyond what
//! the bytes hold; bytes that decode encode back to themselves (XDR has one encoding per value).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercel::onc::{Failure, Program};
use tiercel::xdr::{Xdr, XdrReader};

#[derive(tiercel::Wire, tiercel::Xdr, Debug, Clone, PartialEq)]
pub enum Color {
    Red,
    Green,
}

#[derive(tiercel::Wire, tiercel::Xdr, Debug, Clone, PartialEq)]
pub struct Node {
    value: i32,
    next: Option<Box<Node>>,
}

#[derive(tiercel::Wire, tiercel::Xdr, Debug, Clone, PartialEq)]
pub enum Shape {
    Empty,
    Circle(u32),
    Rect { w: u16, h: i8 },
}

#[derive(tiercel::Wire, tiercel::Xdr, Debug, Clone, PartialEq)]
pub struct Everything {
    i: i32,
    u: u32,
    h: i64,
    uh: u64,
    b: bool,
    f: f32,
    d: f64,
    c: u8,
    name: String,
    data: Vec<u8>,
    key: [u8; 5],
    list: Vec<Color>,
    pair: [Shape; 2],
    maybe: Option<Node>,
}

#[tiercel::interface(onc(program = 0x2000_7401))]
pub trait Fuzzed {
    #[onc(procedure = 1)]
    fn everything(&self, e: Everything, s: &str, b: &[u8]) -> Everything;
}

struct Same;

impl Fuzzed for Same {
    fn everything(&self, e: Everything, _s: &str, _b: &[u8]) -> Everything {
        e
    }
}

fuzz_target!(|data: &[u8]| {
    let program = FuzzedServer::new(Same);
    let mut out = Vec::new();
    match program.dispatch(1, data, &mut out) {
        Ok(()) => {
            // The result is the first argument: its encoding is where the arguments began.
            assert!(data.starts_with(&out), "an argument that decoded encodes back to its bytes");
        }
        Err(Failure::Garbage(_)) => assert!(out.is_empty()),
        Err(Failure::NoProcedure) => unreachable!("procedure 1 exists"),
    }
    assert_eq!(program.dispatch(2, data, &mut Vec::new()), Err(Failure::NoProcedure));
    let mut r = XdrReader::new(data);
    if let Ok(node) = Node::decode(&mut r) {
        let mut again = Vec::new();
        node.encode(&mut again);
        assert_eq!(again, &data[..data.len() - r.remaining()]);
    }
});
