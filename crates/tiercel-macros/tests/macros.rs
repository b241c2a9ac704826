//! Misuse of `#[tiercel::interface]` and `#[derive(Wire)]` is a compile error at the offending span.

#[test]
fn misuse_is_a_compile_error() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
