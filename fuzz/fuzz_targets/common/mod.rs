//! Shared by the fuzz targets.

use tiercel::{In, InOut, Out};

/// The seeds' `Test` interface, from the small dev-only crate that holds it (not the bench, whose
/// peers and tools cost minutes under ASan).
pub use tiercel_seeds as seeds;

use seeds::Test;

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
    fn int1(&self, _: i32) {}
    fn int2(&self, _: i32, _: i32) {}
    fn int4(&self, _: i32, _: i32, _: i32, _: i32) {}
    fn fixed4(&self, _: [u8; 4]) {}
    fn fixed400(&self, _: [u8; 400]) {}
    fn var_array(&self, _: &[u8]) {}
    fn string(&self, _: &str) {}
    fn bulk_in(&self, _: In<&[u8]>) {}
    fn bulk_in_out(&self, _: InOut<&mut [u8]>) {}
    // No busy waiting under the fuzzer: the service time is irrelevant to decoding.
    fn work(&self, _: u32) {}
}
