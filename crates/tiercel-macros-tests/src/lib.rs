//! Nothing: this crate holds the compile-fail tests of `#[tiercel::interface]` and
//! `#[derive(Wire)]` (`tests/macros.rs`), apart from `tiercel-macros` so that they build against the
//! same tiercel as every other test.
