//! Generated server stubs unmarshaling arbitrary argument bytes, for every kind of parameter the
//! macro generates code for: scalars, strings and borrowed slices, vectors, options, results,
//! tuples, arrays, derived structs and enums (recursive ones too), and `In`/`Out`/`InOut`
//! buffers. Bad arguments are an error, never a panic or an unbounded allocation. A procedure whose
//! one buffer is its last argument, an `InOut`, run in place of its arguments gives the same results
//! (or the same error) as run the usual way. The same types are decoded as results, as a client stub
//! would.
#![no_main]

#[path = "common/mod.rs"]
mod common;

use common::seeds::TestServer;
use common::Quiet;
use libfuzzer_sys::fuzz_target;
use tiercel::interface::{Export, Results};
use tiercel::{In, InOut, Out, Wire};

#[derive(Wire, Debug, Clone, PartialEq)]
pub struct Point {
    x: f64,
    y: f64,
}

#[derive(Wire, Debug, Clone, PartialEq)]
pub enum Shape {
    Empty,
    Circle { center: Point, radius: f32 },
    Polygon(Vec<Point>),
    Group(Vec<Shape>),
    Boxed(Box<Shape>),
}

#[derive(Wire, Debug, PartialEq)]
pub struct Borrowing<'a> {
    name: &'a str,
    bytes: &'a [u8],
    tags: Vec<&'a str>,
}

#[tiercel::interface]
pub trait Everything {
    fn integers(&self, a: u8, b: i16, c: u32, d: i64, e: u128) -> u64;
    fn scalars(&self, f: f32, g: bool, h: char, i: usize, j: isize) -> u64;
    fn strings(&self, s: &str, owned: String, list: Vec<String>) -> String;
    fn containers(&self, o: Option<Vec<u16>>, r: Result<(u8, bool), String>, a: [i32; 5]) -> Option<u32>;
    fn shapes(&self, s: Shape, many: Vec<Shape>) -> usize;
    fn borrowed(&self, b: Borrowing<'_>) -> (String, usize);
    fn buffers(&self, data: In<&[u8]>, out: Out<&mut [u8]>, both: InOut<&mut [u8]>) -> u64;
    fn nothing(&self);
    fn stamped(&self, tag: String, key: u8, both: InOut<&mut [u8]>) -> (u64, String);
}

struct Impl;

impl Everything for Impl {
    fn integers(&self, a: u8, b: i16, c: u32, d: i64, e: u128) -> u64 {
        (a as u64) ^ (b as u64) ^ (c as u64) ^ (d as u64) ^ (e as u64)
    }
    fn scalars(&self, f: f32, g: bool, h: char, i: usize, j: isize) -> u64 {
        (f as u64) ^ (g as u64) ^ (h as u64) ^ (i as u64) ^ (j as u64)
    }
    fn strings(&self, s: &str, owned: String, list: Vec<String>) -> String {
        format!("{}{}{}", s.len(), owned.len(), list.len())
    }
    fn containers(&self, o: Option<Vec<u16>>, _: Result<(u8, bool), String>, a: [i32; 5]) -> Option<u32> {
        o.map(|v| v.len() as u32 ^ a[0] as u32)
    }
    fn shapes(&self, _: Shape, many: Vec<Shape>) -> usize {
        many.len()
    }
    fn borrowed(&self, b: Borrowing<'_>) -> (String, usize) {
        (b.name.to_owned(), b.bytes.len() + b.tags.len())
    }
    fn buffers(&self, data: In<&[u8]>, out: Out<&mut [u8]>, both: InOut<&mut [u8]>) -> u64 {
        out.0.fill(7);
        both.0.iter_mut().for_each(|b| *b = !*b);
        data.0.len() as u64
    }
    fn nothing(&self) {}
    fn stamped(&self, tag: String, key: u8, both: InOut<&mut [u8]>) -> (u64, String) {
        both.0.iter_mut().for_each(|b| *b ^= key);
        (both.0.len() as u64, tag)
    }
}

const RESULT_LIMIT: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let [which, p0, p1, args @ ..] = data else { return };
    let procedure = u16::from_le_bytes([*p0, *p1]) % 18;
    let export: Box<dyn Export> =
        if which & 1 == 0 { Box::new(EverythingServer::new(Impl)) } else { Box::new(TestServer::new(Quiet)) };
    let mut buf = Vec::new();
    let ran = export.dispatch(procedure, args, &mut Results::new(&mut buf, RESULT_LIMIT));
    assert!(buf.len() <= RESULT_LIMIT + 4096, "results beyond their limit: {}", buf.len());
    if export.in_place(procedure) {
        // Behind some other bytes, as after a call's context block.
        let start = usize::from(which >> 1) % 64;
        let mut message = [&vec![0xee; start][..], args].concat();
        match export.dispatch_in_place(procedure, &mut message, start) {
            Ok(body) => {
                assert_eq!(ran, Ok(()), "run in place, not the usual way");
                assert!(start <= body && body <= message.len());
                assert_eq!(&message[body..], &buf[..], "the same results in place");
            }
            Err(e) => assert_eq!(ran, Err(e), "the same error in place"),
        }
    } else {
        let mut message = args.to_vec();
        assert!(export.dispatch_in_place(procedure, &mut message, 0).is_err());
    }
    // What a client stub decodes from a result message.
    let _ = tiercel::wire::from_slice::<(String, usize)>(args);
    let _ = tiercel::wire::from_slice::<Option<u32>>(args);
    let _ = tiercel::wire::from_slice::<Shape>(args);
    let _ = tiercel::wire::from_slice::<Result<Vec<Shape>, String>>(args);
    let _ = tiercel::wire::from_slice::<Borrowing<'_>>(args);
});
