//! A shared-memory slot as an untrusted peer leaves it: arbitrary control words (procedure, length,
//! status) and data. The server's validation and the generated stub behind it, and the client's
//! validation of a result, must refuse what is out of range and never panic.
#![no_main]

#[path = "common/mod.rs"]
mod common;

use arbitrary::Arbitrary;
use common::seeds::TestServer;
use common::Quiet;
use libfuzzer_sys::fuzz_target;
use tiercel::interface::{Export, Results};
use tiercel_proto::shm::{validate_call, validate_result, Layout};

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
