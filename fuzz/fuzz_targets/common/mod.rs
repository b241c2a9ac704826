//! Shared by the fuzz targets.

use tiercel::seeds::Test;
use tiercel::{In, InOut, Out};

/// The seeds' `Test` interface, implemented without the reference version's pattern assertions
/// (which panic on purpose, to report corrupted buffers).
pub struct Quiet;

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
