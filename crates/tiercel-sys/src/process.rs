//! Who this process is.

/// This process's effective user id.
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}
