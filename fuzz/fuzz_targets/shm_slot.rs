//! A shared-memory slot as an untrusted peer leaves it: arbitrary control words (procedure, length,
//! status) and data. The server's validation and the generated stub behind it, and the client's
//! validation of a result, must refuse what is out of range and never panic.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tiercel::interface::{Export, Results};
use tiercel::seeds::{Test, TestServer};
use tiercel::{In, InOut, Out};
use tiercel_proto::shm::{validate_call, validate_result, Layout};

struct Quiet;

impl Test for Quiet {
    fn null(&self) {}
    fn add(&self, a: i32, b: i32) -> i32 {
        a.wrapping_add(b)
    }
    fn max_arg(&self, _: In<&[u8]>) {}
    fn max_result(&self, buf: Out<&mut [u8]>) {
        buf.0.fill(1);
    }
    fn big_in(&self, _: In<&[u8]>) {}
    fn big_out(&self, buf: Out<&mut [u8]>) {
        buf.0.fill(2);
    }
    fn big_in_out(&self, buf: InOut<&mut [u8]>) {
        buf.0.iter_mut().for_each(|b| *b = b.wrapping_add(1));
    }
}

#[derive(Arbitrary, Debug)]
struct Slot {
    slots: u8,
    capacity: u16,
    procedure: u32,
    len: u32,
    status: u32,
    data: Vec<u8>,
}

fuzz_target!(|s: Slot| {
    let Some(layout) = Layout::new(u32::from(s.slots).max(1), usize::from(s.capacity)) else { return };
    assert!(layout.data(layout.slots - 1) + layout.data <= layout.region_len().unwrap());
    if let Some(call) = validate_call(s.procedure, s.len, layout.data) {
        assert!(call.len <= layout.data);
        // The slot's data as the server copies it out (what the peer wrote, zero beyond).
        let mut args = vec![0u8; call.len];
        let n = call.len.min(s.data.len());
        args[..n].copy_from_slice(&s.data[..n]);
        let mut out = Vec::new();
        let _ = TestServer::new(Quiet).dispatch(call.procedure, &args, &mut Results::new(&mut out, layout.data));
        assert!(out.len() <= layout.data + 4096);
    }
    if let Some((len, _)) = validate_result(s.len, s.status, layout.data) {
        assert!(len <= layout.data);
    }
});
