//! Starting the helper processes of the measurements: servers started as this same program with
//! [`HELPER_ENV`] set, so that they run in processes of their own (pinned, or in a network
//! namespace) without the command carrying hidden subcommands. What a helper runs is in
//! the `roles` module (which sits above everything, as it runs them).

use std::process::Command;

/// Set in the environment of a helper process.
pub const HELPER_ENV: &str = "TIERCEL_BENCH_HELPER";

/// A command running this program as a helper (`role` and its options follow as arguments).
pub fn command() -> crate::Result<Command> {
    let mut c = Command::new(std::env::current_exe()?);
    c.env(HELPER_ENV, "1");
    Ok(c)
}

/// A command running this program as a helper inside network namespace `ns` (through `ip netns
/// exec`, which passes the environment on).
pub fn command_in_namespace(ns: &str) -> crate::Result<Command> {
    let exe = std::env::current_exe()?;
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).arg(exe).env(HELPER_ENV, "1");
    Ok(c)
}
