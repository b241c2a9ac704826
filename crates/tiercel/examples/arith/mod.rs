//! The interface both examples are built from: the same trait on both sides, so that binding
//! succeeds (a server or client built from another version of it is refused at import).

/// Arithmetic on the server.
#[tiercel::interface]
pub trait Arith {
    /// The sum of two integers.
    fn add(&self, a: i32, b: i32) -> i32;
    /// The sum of the bytes, sent straight from the caller's buffer.
    fn checksum(&self, data: tiercel::In<&[u8]>) -> u64;
    /// The quotient, or an error of the procedure's own (not of the call) for a zero divisor.
    fn divide(&self, a: i64, b: i64) -> Result<i64, String>;
}
