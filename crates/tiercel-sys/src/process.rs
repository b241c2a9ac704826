//! Who this process is.

/// This process's effective user id.
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Opens `path` for reading without following a symbolic link in its last component: a link there
/// is an error (`ELOOP`), not the file it points to. For files whose owner decides whether they
/// are trusted, checked on the open descriptor (`File::metadata`) rather than by path.
pub fn open_nofollow(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let flags = rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::CLOEXEC;
    std::fs::OpenOptions::new().read(true).custom_flags(flags.bits() as i32).open(path)
}

#[cfg(test)]
mod tests {
    #[test]
    fn open_nofollow_refuses_a_link_and_opens_the_file() {
        let dir = std::env::temp_dir().join(format!("tiercel-nofollow-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("file"), b"x").unwrap();
        std::os::unix::fs::symlink(dir.join("file"), dir.join("link")).unwrap();
        assert!(super::open_nofollow(&dir.join("file")).is_ok());
        let err = super::open_nofollow(&dir.join("link")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(rustix::io::Errno::LOOP.raw_os_error()), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
