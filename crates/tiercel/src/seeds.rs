//! The `Test` interface of the seed papers (Firefly, Peregrine, Mach), exported by `tiercel serve`.
//!
//! Procedures and buffer sizes follow the seeds: Null; Add; MaxArg and MaxResult with 1440-byte
//! buffers (one Ethernet packet of data); BigIn, BigOut and BigInOut with 200-byte buffers. The
//! implementation checks what it receives and fills what it returns with [`pattern`], so that a
//! client can verify every byte.

use crate::{In, InOut, Out};

/// Buffer size of MaxArg and MaxResult.
pub const MAX_BUFFER: usize = 1440;
/// Buffer size of BigIn, BigOut and BigInOut.
pub const BIG_BUFFER: usize = 200;

/// The byte expected at offset `i` of every buffer sent to or returned by [`SeedTest`].
pub fn pattern(i: usize) -> u8 {
    (i as u8).wrapping_mul(31).wrapping_add(7)
}

/// Fills `buf` with [`pattern`].
pub fn fill(buf: &mut [u8]) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = pattern(i);
    }
}

/// Whether `buf` holds [`pattern`].
pub fn check(buf: &[u8]) -> bool {
    buf.iter().enumerate().all(|(i, &b)| b == pattern(i))
}

/// The seeds' test interface.
#[crate::interface]
pub trait Test {
    /// Does nothing: the cost of the call itself.
    fn null(&self);
    /// Adds two integers.
    fn add(&self, a: i32, b: i32) -> i32;
    /// Takes a buffer (1440 bytes in the seeds) on the call.
    fn max_arg(&self, buf: In<&[u8]>);
    /// Returns a buffer (1440 bytes in the seeds) on the result, written in place.
    fn max_result(&self, buf: Out<&mut [u8]>);
    /// Takes a 200-byte buffer on the call.
    fn big_in(&self, buf: In<&[u8]>);
    /// Returns a 200-byte buffer on the result.
    fn big_out(&self, buf: Out<&mut [u8]>);
    /// Takes a 200-byte buffer and returns it changed (every byte plus one).
    fn big_in_out(&self, buf: InOut<&mut [u8]>);
}

/// The reference implementation of [`Test`]: checks the pattern of incoming buffers (panicking, so
/// that the caller sees an error, if a byte is wrong) and writes the pattern into outgoing ones.
#[derive(Debug, Default, Clone, Copy)]
pub struct SeedTest;

impl Test for SeedTest {
    fn null(&self) {}

    fn add(&self, a: i32, b: i32) -> i32 {
        a.wrapping_add(b)
    }

    fn max_arg(&self, buf: In<&[u8]>) {
        assert!(check(buf.0), "max_arg: buffer does not hold the test pattern");
    }

    fn max_result(&self, buf: Out<&mut [u8]>) {
        fill(buf.0);
    }

    fn big_in(&self, buf: In<&[u8]>) {
        assert!(check(buf.0), "big_in: buffer does not hold the test pattern");
    }

    fn big_out(&self, buf: Out<&mut [u8]>) {
        fill(buf.0);
    }

    fn big_in_out(&self, buf: InOut<&mut [u8]>) {
        for b in buf.0.iter_mut() {
            *b = b.wrapping_add(1);
        }
    }
}

/// Calls every procedure of [`Test`] once with the seeds' buffer sizes and checks every result.
/// Returns a description of the first wrong result.
pub fn check_all(client: &TestClient, round: u32) -> Result<(), String> {
    let e = |p: &str, err: crate::Error| format!("{p}: {err}");
    client.null().map_err(|x| e("null", x))?;
    let a = round as i32;
    let sum = client.add(a, 3).map_err(|x| e("add", x))?;
    if sum != a.wrapping_add(3) {
        return Err(format!("add({a}, 3) returned {sum}"));
    }
    let mut max = [0u8; MAX_BUFFER];
    fill(&mut max);
    client.max_arg(In(&max)).map_err(|x| e("max_arg", x))?;
    let mut out = [0u8; MAX_BUFFER];
    client.max_result(Out(&mut out)).map_err(|x| e("max_result", x))?;
    if !check(&out) {
        return Err("max_result: wrong bytes".into());
    }
    client.big_in(In(&max[..BIG_BUFFER])).map_err(|x| e("big_in", x))?;
    let mut big = [0u8; BIG_BUFFER];
    client.big_out(Out(&mut big)).map_err(|x| e("big_out", x))?;
    if !check(&big) {
        return Err("big_out: wrong bytes".into());
    }
    client.big_in_out(InOut(&mut big)).map_err(|x| e("big_in_out", x))?;
    if !big.iter().enumerate().all(|(i, &b)| b == pattern(i).wrapping_add(1)) {
        return Err("big_in_out: wrong bytes".into());
    }
    Ok(())
}
