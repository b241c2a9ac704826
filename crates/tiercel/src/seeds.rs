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

/// Why [`check_all`] failed.
#[derive(Debug)]
pub enum CheckFailure {
    /// A procedure failed with an error.
    Call(&'static str, crate::Error),
    /// A procedure returned a wrong result.
    Wrong(String),
}

impl core::fmt::Display for CheckFailure {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CheckFailure::Call(p, e) => {
                let ran = match e.execution() {
                    crate::Execution::NeverRan => "never ran",
                    crate::Execution::MayHaveRun => "may have run",
                    crate::Execution::Ran => "ran and failed",
                };
                write!(f, "{p}: {e} (the procedure {ran})")
            }
            CheckFailure::Wrong(w) => f.write_str(w),
        }
    }
}

impl std::error::Error for CheckFailure {}

/// Calls every procedure of [`Test`] once with the seeds' buffer sizes and checks every result.
pub fn check_all(client: &TestClient, round: u32) -> Result<(), CheckFailure> {
    let e = |p: &'static str| move |err: crate::Error| CheckFailure::Call(p, err);
    let wrong = |w: &str| Err(CheckFailure::Wrong(w.to_string()));
    client.null().map_err(e("null"))?;
    let a = round as i32;
    let sum = client.add(a, 3).map_err(e("add"))?;
    if sum != a.wrapping_add(3) {
        return Err(CheckFailure::Wrong(format!("add({a}, 3) returned {sum}")));
    }
    let mut max = [0u8; MAX_BUFFER];
    fill(&mut max);
    client.max_arg(In(&max)).map_err(e("max_arg"))?;
    let mut out = [0u8; MAX_BUFFER];
    client.max_result(Out(&mut out)).map_err(e("max_result"))?;
    if !check(&out) {
        return wrong("max_result: wrong bytes");
    }
    client.big_in(In(&max[..BIG_BUFFER])).map_err(e("big_in"))?;
    let mut big = [0u8; BIG_BUFFER];
    client.big_out(Out(&mut big)).map_err(e("big_out"))?;
    if !check(&big) {
        return wrong("big_out: wrong bytes");
    }
    client.big_in_out(InOut(&mut big)).map_err(e("big_in_out"))?;
    if !big.iter().enumerate().all(|(i, &b)| b == pattern(i).wrapping_add(1)) {
        return wrong("big_in_out: wrong bytes");
    }
    Ok(())
}
