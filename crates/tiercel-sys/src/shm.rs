//! Shared memory between processes: sealed memfd regions, futexes on words inside them, and passing
//! a region's descriptor over a UNIX socket (`SCM_RIGHTS`), so that holding the descriptor is the
//! capability.
//!
//! The other process is not trusted. Everything a [`Region`] hands out is bounds-checked; control
//! words are only reached as atomics; bytes are only copied in or out (never borrowed), so a peer
//! writing while we copy can give us garbage, which the caller validates, but never an access outside
//! the mapping. Regions are sealed against shrinking and growing before they are shared, and a region
//! received from a peer is refused unless it is sealed so: a peer cannot make our accesses fault by
//! truncating the file under us.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
};

/// Bytes of a page: the granularity in which memory is mapped and given back.
const PAGE: usize = 4096;

/// A shared mapping of a sealed memfd.
pub struct Region {
    ptr: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
}

// SAFETY: `Region` owns its mapping, which stays valid until `drop`. Every access through it goes
// through atomics (`u32_at`) or bounds-checked byte copies (`read`, `write`), which are sound to make
// from any thread at once (concurrent copies of the same bytes may yield mixed bytes, never memory
// unsafety outside the mapping, and callers validate what they copy out).
unsafe impl Send for Region {}
// SAFETY: as for `Send`: shared references only allow atomic access and copies.
unsafe impl Sync for Region {}

const SEALS: SealFlags = SealFlags::SHRINK.union(SealFlags::GROW).union(SealFlags::SEAL);

/// The most bytes [`Region::demote`] pushes out: past a few kilobytes, the peer's reads of the
/// data stream, and one hint per cache line would cost more than it saves.
pub const DEMOTE_MAX: usize = 4096;

/// Bytes of a cache line (x86-64's).
const CACHE_LINE: usize = 64;

impl Region {
    /// Creates a region of `len` bytes (zero-filled; pages are allocated only when touched), sealed
    /// against resizing.
    pub fn create(name: &str, len: usize) -> io::Result<Region> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty shared region"));
        }
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        rustix::fs::ftruncate(&fd, len as u64)?;
        rustix::fs::fcntl_add_seals(&fd, SEALS)?;
        Region::map(fd, len)
    }

    /// Maps a region received from a peer, which must be exactly `len` bytes and sealed against
    /// shrinking.
    pub fn from_fd(fd: OwnedFd, len: usize) -> io::Result<Region> {
        let bad = |why: String| io::Error::new(io::ErrorKind::InvalidData, why);
        let size = rustix::fs::fstat(&fd)?.st_size;
        if size < 0 || size as u64 != len as u64 {
            return Err(bad(format!("shared region is {size} bytes, {len} announced")));
        }
        let seals = rustix::fs::fcntl_get_seals(&fd)?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err(bad("shared region is not sealed against shrinking".into()));
        }
        Region::map(fd, len)
    }

    fn map(fd: OwnedFd, len: usize) -> io::Result<Region> {
        // SAFETY: a new shared mapping of `len` bytes of `fd` at an address the kernel chooses; it
        // aliases no Rust object. The file is sealed at `len` bytes or more, so every page of the
        // mapping stays backed.
        let ptr = unsafe {
            rustix::mm::mmap(core::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, &fd, 0)?
        };
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Region { ptr, len, fd })
    }

    /// The descriptor, to hand to a peer.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty (never: creation refuses it).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The 32-bit word at `offset`, if it is 4-byte aligned and inside the region.
    pub fn u32_at(&self, offset: usize) -> Option<&AtomicU32> {
        if !offset.is_multiple_of(4) || offset.checked_add(4)? > self.len {
            return None;
        }
        // SAFETY: `offset..offset + 4` is inside the mapping, which is page-aligned, so the address is
        // 4-byte aligned; the mapping lives as long as `&self`; and every access to control words of
        // the region, in this process and the peer's, is atomic.
        Some(unsafe { AtomicU32::from_ptr(self.ptr.as_ptr().add(offset).cast::<u32>()) })
    }

    /// The `N` consecutive control words at `offset` (4-byte aligned), or `None` if they are not all
    /// inside the mapping: one bounds check for a slot's words, not one per word.
    pub fn words<const N: usize>(&self, offset: usize) -> Option<&[AtomicU32; N]> {
        if !offset.is_multiple_of(4) || offset.checked_add(4 * N)? > self.len {
            return None;
        }
        // SAFETY: as in `u32_at`, for each of the `N` words: `offset..offset + 4 * N` is inside the
        // mapping (checked above) and 4-byte aligned (the mapping is page-aligned), `AtomicU32` has
        // the size and alignment of `u32` and arrays of it have no padding, the mapping lives as long
        // as `&self`, and every access to control words of the region, in this process and the
        // peer's, is atomic.
        Some(unsafe { &*self.ptr.as_ptr().add(offset).cast::<[AtomicU32; N]>() })
    }

    /// Copies `out.len()` bytes at `offset` into `out`; false (copying nothing) when out of bounds.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> bool {
        if offset.checked_add(out.len()).is_none_or(|end| end > self.len) {
            return false;
        }
        // SAFETY: the source range is inside the mapping (checked above) and cannot overlap `out`,
        // which is private memory. The peer process may write the same bytes while we copy them: a
        // race that the Rust memory model does not define, accepted here on purpose, as for memory
        // written by a device. What makes it harmless: (1) the bytes are `u8`, for which every bit
        // pattern is a valid value, so a torn copy yields other bytes, never an invalid value;
        // (2) the copy is made by calls into the platform's `memcpy` (`copy_in_pieces`) through a
        // pointer that came from `mmap`, which the compiler cannot reason about or assume
        // unchanging, and nothing reads the source twice; (3) callers decode and validate the
        // private copy only, never the shared bytes (the protocol's control words, which order the
        // copies, are atomics: `u32_at`).
        // An element-wise atomic copy would make the race defined at the cost of the vectorized
        // copy that 16 MiB transfers depend on.
        unsafe { copy_in_pieces(self.ptr.as_ptr().add(offset), out.as_mut_ptr(), out.len()) };
        true
    }

    /// Pushes the cache lines that hold `offset..offset + len` (at most the first [`DEMOTE_MAX`]
    /// bytes of it) out of this core's private caches into the cache the cores share (`cldemote`),
    /// once they have been written for the peer: its core, which reads them next, then finds them
    /// there rather than fetching them from this core's. A hint: it changes no byte, and what
    /// lies outside the region is left alone. On an x86-64 CPU without `cldemote` the instruction
    /// is a no-op (it is encoded as one of the hinting NOPs), and on other CPUs nothing is issued.
    #[inline]
    pub fn demote(&self, offset: usize, len: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            let end = offset.saturating_add(len.min(DEMOTE_MAX)).min(self.len);
            let mut line = offset & !(CACHE_LINE - 1);
            while line < end {
                // SAFETY: `cldemote` is a hint: it changes no memory, flag or register (only where
                // a line is cached); the address is inside the live mapping (`line < end <=
                // self.len`), so it names no memory but the region's.
                unsafe {
                    core::arch::asm!(
                        "cldemote [{}]",
                        in(reg) self.ptr.as_ptr().add(line),
                        options(nostack, preserves_flags, readonly)
                    );
                }
                line += CACHE_LINE;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (offset, len);
    }

    /// Copies `data` into the region at `offset`; false (copying nothing) when out of bounds.
    pub fn write(&self, offset: usize, data: &[u8]) -> bool {
        if offset.checked_add(data.len()).is_none_or(|end| end > self.len) {
            return false;
        }
        // SAFETY: the destination range is inside the mapping (checked above), which no Rust
        // reference points into, and does not overlap `data`, which is private memory. The peer may
        // read (or, misbehaving, write) these bytes meanwhile; as in `read`, that race is accepted:
        // the peer validates what it copies out, and nothing here reads the bytes back.
        unsafe { copy_in_pieces(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len()) };
        true
    }

    /// Copies the concatenation of `parts` into the region at `offset`; false when out of bounds.
    pub fn write_vectored(&self, mut offset: usize, parts: &[IoSlice<'_>]) -> bool {
        let total = parts.iter().map(|p| p.len()).sum::<usize>();
        if offset.checked_add(total).is_none_or(|end| end > self.len) {
            return false;
        }
        for p in parts {
            self.write(offset, p);
            offset += p.len();
        }
        true
    }

    /// Gives the memory behind `offset..offset + len` back to the system (the range reads as zeros
    /// afterwards); used after a large transfer so that an idle slot does not keep megabytes.
    pub fn discard(&self, offset: usize, len: usize) {
        let start = offset.div_ceil(PAGE) * PAGE;
        let end = offset.saturating_add(len).min(self.len) / PAGE * PAGE;
        if end > start {
            let _ = rustix::fs::fallocate(
                &self.fd,
                rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
                start as u64,
                (end - start) as u64,
            );
        }
    }

    /// Drops this process's mapping of the pages behind `offset..offset + len` without changing
    /// what they hold (the peer still sees the bytes; a later access here maps them again): they no
    /// longer count as this process's memory.
    pub fn forget(&self, offset: usize, len: usize) {
        let start = offset.div_ceil(PAGE) * PAGE;
        let end = offset.saturating_add(len).min(self.len) / PAGE * PAGE;
        if end > start {
            // SAFETY: the range is whole pages inside our mapping. For a shared mapping of a file
            // (the memfd), `MADV_DONTNEED` only removes the page-table entries: the file keeps the
            // bytes, and the next access faults them back in unchanged, so no Rust-visible value
            // (the atomics handed out by `u32_at` included) changes.
            let _ = unsafe {
                rustix::mm::madvise(self.ptr.as_ptr().add(start).cast(), end - start, rustix::mm::Advice::LinuxDontNeed)
            };
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping was made in `map` with this address and length and is unmapped once;
        // every reference handed out borrows `self`, so none outlives it.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Waits while `word` holds `expected`, for at most `timeout`. Returns when woken, when the word
/// changed, on a signal, or at the timeout (callers re-check the word either way); false when it
/// returned at once because the word no longer held `expected` (the thread did not sleep).
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) -> bool {
    let ts = timeout.map(|d| rustix::thread::futex::Timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as i64,
        tv_nsec: d.subsec_nanos() as _,
    });
    // Shared (not process-private) futex: the word lives in memory mapped by two processes.
    let waited = rustix::thread::futex::wait(word, rustix::thread::futex::Flags::empty(), expected, ts.as_ref());
    // EAGAIN: the word no longer held `expected`, so the thread never slept.
    waited != Err(rustix::io::Errno::AGAIN)
}

/// Wakes up to `n` waiters on `word`.
pub fn futex_wake(word: &AtomicU32, n: u32) {
    let _ = rustix::thread::futex::wake(word, rustix::thread::futex::Flags::empty(), n);
}

/// System-wide memory barriers (`membarrier`'s `GLOBAL_EXPEDITED`), for a handshake where one side
/// stores and then loads with only a compiler fence between, and the other, rarely, pays for both: a
/// thread that is about to sleep issues [`barrier`], which makes every running thread of every
/// process that called [`receive_barriers`] pass through a full memory barrier before it returns (a
/// thread not running has passed through one when it was switched out). So a store of such a thread
/// made before that point is visible after the call, and a load it makes after it sees what the
/// sleeper stored before the call.
///
/// This process takes part: its threads receive the barriers other threads issue (registered once,
/// at the first call). False when the kernel refuses (no `membarrier`, or a seccomp filter): the
/// process's threads must then fence themselves.
pub fn receive_barriers() -> bool {
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *REGISTERED.get_or_init(|| {
        use rustix::thread::{membarrier, membarrier_query, MembarrierCommand as Cmd};
        let query = membarrier_query();
        query.contains_command(Cmd::GlobalExpedited)
            && query.contains_command(Cmd::RegisterGlobalExpedited)
            && membarrier(Cmd::RegisterGlobalExpedited).is_ok()
    })
}

/// Whether this kernel issues system-wide barriers ([`barrier`]); asked once.
pub fn barriers_available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        use rustix::thread::{membarrier_query, MembarrierCommand as Cmd};
        membarrier_query().contains_command(Cmd::GlobalExpedited)
    })
}

/// Issues a system-wide barrier (see [`receive_barriers`]): when it returns, every running thread of
/// every process that receives them has passed through a full memory barrier. False if it failed.
pub fn barrier() -> bool {
    rustix::thread::membarrier(rustix::thread::MembarrierCommand::GlobalExpedited).is_ok()
}

/// Asks the CPU to bring the cache line of `word` into its cache for writing (`prefetchw`, on an
/// x86-64 CPU that has it; nothing elsewhere): stores that follow soon then find the line this
/// core's, rather than wait for the other core to give it up, and hold up the stores after them.
#[inline(always)]
pub fn prefetch_for_write(word: &AtomicU32) {
    #[cfg(target_arch = "x86_64")]
    if prefetchw_available() {
        // SAFETY: `prefetchw` is a hint: it reads and writes no memory (the address is that of a
        // live reference anyway), cannot fault, and leaves flags and registers as they were; the CPU
        // has it (checked above).
        unsafe {
            core::arch::asm!("prefetchw [{}]", in(reg) word.as_ptr(), options(nostack, preserves_flags, readonly));
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = word;
}

/// Whether this CPU has `prefetchw` (CPUID leaf 0x8000_0001, ECX bit 8), asked once.
#[cfg(target_arch = "x86_64")]
#[inline]
fn prefetchw_available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(ask_prefetchw)
}

#[cfg(target_arch = "x86_64")]
#[cold]
fn ask_prefetchw() -> bool {
    use core::arch::x86_64::__cpuid;
    // `__cpuid` is a safe function in newer Rust, an unsafe one in the oldest this builds with.
    #[allow(unused_unsafe)]
    // SAFETY: `cpuid` is present on every x86-64 CPU and only writes the four registers it returns;
    // the extended leaf is asked only if the CPU reports it.
    unsafe {
        __cpuid(0x8000_0000).eax >= 0x8000_0001 && __cpuid(0x8000_0001).ecx & (1 << 8) != 0
    }
}

/// Sends `bytes` and, if given, one descriptor over a UNIX stream socket.
pub fn send_with_fd(socket: &UnixStream, bytes: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds;
    if let Some(fd) = fd {
        fds = [fd];
        if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(io::Error::other("ancillary buffer too small"));
        }
    }
    let mut sent = rustix::net::sendmsg(socket, &[IoSlice::new(bytes)], &mut control, SendFlags::NOSIGNAL)?;
    // Only the first chunk carries the descriptor; the rest (if the socket buffer split it) follows.
    while sent < bytes.len() {
        sent += rustix::net::send(socket, &bytes[sent..], SendFlags::NOSIGNAL)?;
    }
    Ok(())
}

/// Receives up to `buf.len()` bytes and any descriptor sent with them. Returns the byte count (0 when
/// the peer closed) and the first descriptor received; any further ones are closed.
pub fn recv_with_fd(socket: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = rustix::net::recvmsg(socket, &mut [IoSliceMut::new(buf)], &mut control, RecvFlags::CMSG_CLOEXEC)?;
    let mut received = None;
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = m {
            for fd in fds {
                if received.is_none() {
                    received = Some(fd);
                }
            }
        }
    }
    Ok((msg.bytes, received))
}

/// The process id and user id of the process at the other end of a connected UNIX socket, as the
/// kernel recorded them when the connection was made (`SO_PEERCRED`): a peer cannot lie about them.
pub fn peer_credentials(socket: &UnixStream) -> io::Result<(u32, u32)> {
    let cred = rustix::net::sockopt::socket_peercred(socket)?;
    Ok((cred.pid.as_raw_nonzero().get() as u32, cred.uid.as_raw()))
}

/// This process's id and effective user id: what a peer's [`peer_credentials`] must show.
pub fn own_credentials() -> (u32, u32) {
    (rustix::process::getpid().as_raw_nonzero().get() as u32, rustix::process::geteuid().as_raw())
}

/// Whether the peer of a connected stream socket has closed it (it died, or dropped the binding),
/// without blocking and without consuming data.
pub fn peer_closed(socket: &UnixStream) -> bool {
    let mut b = [0u8; 1];
    match rustix::net::recv(socket, &mut b[..], RecvFlags::PEEK | RecvFlags::DONTWAIT) {
        Ok((0, _)) => true,
        Ok(_) => false,
        Err(e) => e != rustix::io::Errno::AGAIN && e != rustix::io::Errno::INTR,
    }
}

/// `copy_nonoverlapping` of `len` bytes, in pieces of [`tiercel_proto::copy::PIECE`] bytes where
/// [`tiercel_proto::copy::in_pieces`] says one `memcpy` of them could be many times slower (the
/// destination a few bytes past the source in its page, on some AMD CPUs).
///
/// # Safety
/// As for `copy_nonoverlapping`: `src` readable and `dst` writable for `len` bytes, the two ranges
/// apart.
#[inline]
unsafe fn copy_in_pieces(src: *const u8, dst: *mut u8, len: usize) {
    let piece =
        if tiercel_proto::copy::in_pieces(dst as usize, src as usize, len) { tiercel_proto::copy::PIECE } else { len };
    let mut done = 0;
    while done < len {
        let n = piece.min(len - done);
        // SAFETY: `done + n <= len`, so both pieces lie inside the ranges the caller vouched for,
        // which do not overlap.
        unsafe { core::ptr::copy_nonoverlapping(src.add(done), dst.add(done), n) };
        done += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn prefetchw_is_used_where_the_kernel_says_the_cpu_has_it_and_changes_nothing() {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
        let flags = cpuinfo.lines().find(|l| l.starts_with("flags")).unwrap();
        let has = flags.split_whitespace().any(|f| f == "3dnowprefetch");
        assert_eq!(prefetchw_available(), has, "CPUID and /proc/cpuinfo disagree");
        assert_eq!(prefetchw_available(), has, "the cached answer");
        let word = AtomicU32::new(7);
        prefetch_for_write(&word);
        assert_eq!(word.load(Ordering::Relaxed), 7);
    }

    #[test]
    fn demoting_cache_lines_changes_no_byte_and_stays_inside_the_region() {
        let region = Region::create("demote", 2 * 4096).unwrap();
        let bytes: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
        assert!(region.write(100, &bytes));
        // Within the region, past DEMOTE_MAX, empty (nothing), reaching past the end, and wholly
        // outside.
        region.demote(100, bytes.len());
        region.demote(0, 2 * 4096);
        region.demote(64, 0);
        region.demote(2 * 4096 - 10, 1000);
        region.demote(usize::MAX - 5, 100);
        let mut back = vec![0u8; bytes.len()];
        assert!(region.read(100, &mut back));
        assert_eq!(back, bytes);
    }

    #[test]
    fn this_kernel_issues_system_wide_barriers_and_this_process_receives_them() {
        // The machines tiercel is tested on have `membarrier` (Linux 4.16 and later): where a test
        // runs without it, the shared-memory transport fences on both sides, and this says so.
        assert!(barriers_available(), "membarrier GLOBAL_EXPEDITED is not available on this kernel");
        assert!(receive_barriers(), "this process could not register for system-wide barriers");
        assert!(receive_barriers(), "registered once, and the answer kept");
        assert!(barrier(), "a system-wide barrier failed");
    }

    #[test]
    fn regions_are_bounds_checked_and_shared_through_a_descriptor() {
        let a = Region::create("tiercel-test", 8192).unwrap();
        assert!(a.write(8190, b"hi"));
        assert!(!a.write(8191, b"hi"), "a write past the end is refused");
        assert!(a.u32_at(8192).is_none() && a.u32_at(2).is_none());
        assert!(a.words::<8>(8192 - 28).is_none() && a.words::<2>(2).is_none(), "word runs are bounds-checked");
        a.u32_at(4).unwrap().store(7, Ordering::SeqCst);
        let run = a.words::<8>(4096).unwrap();
        run[7].store(9, Ordering::SeqCst);
        assert_eq!(a.u32_at(4096 + 28).unwrap().load(Ordering::SeqCst), 9, "a run's words are in order");
        assert_eq!(a.words::<2>(0).unwrap()[1].load(Ordering::SeqCst), 7, "a run's words are the region's");
        let (x, y) = UnixStream::pair().unwrap();
        send_with_fd(&x, b"region", Some(a.fd())).unwrap();
        let mut buf = [0u8; 16];
        let (n, fd) = recv_with_fd(&y, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"region");
        let b = Region::from_fd(fd.unwrap(), 8192).unwrap();
        assert_eq!(b.u32_at(4).unwrap().load(Ordering::SeqCst), 7, "both mappings see the same memory");
        let mut out = [0u8; 2];
        assert!(b.read(8190, &mut out));
        assert_eq!(&out, b"hi");
        assert!(!b.read(8191, &mut out));
    }

    #[test]
    fn copies_a_few_bytes_ahead_in_the_page_go_in_pieces_and_carry_every_byte() {
        let r = Region::create("tiercel-test", 8 * PAGE).unwrap();
        let bytes: Vec<u8> = (0..20_000u32).map(|i| (i ^ (i >> 8)) as u8).collect();
        let mut back = vec![0u8; bytes.len() + PAGE];
        for len in [100, 2048, 3004, 20_000] {
            for ahead in [0, 12, 16, 40, 200] {
                // Written `ahead` bytes past the source's offset in its page, and read back into a
                // buffer `ahead` bytes past the region's: the first in pieces where 1 to 63.
                let at = (bytes.as_ptr() as usize + ahead) % PAGE + PAGE;
                assert_eq!(
                    tiercel_proto::copy::in_pieces(r.ptr.as_ptr() as usize + at, bytes.as_ptr() as usize, len),
                    len > 2048 && (1..64).contains(&ahead),
                );
                assert!(r.write(at, &bytes[..len]));
                let into = (r.ptr.as_ptr() as usize + at + ahead).wrapping_sub(back.as_ptr() as usize) % PAGE;
                assert!(r.read(at, &mut back[into..into + len]));
                assert_eq!(&back[into..into + len], &bytes[..len], "len {len} ahead {ahead}");
                back.fill(0);
                let parts = [IoSlice::new(&bytes[..len / 3]), IoSlice::new(&bytes[len / 3..len])];
                assert!(r.write_vectored(at, &parts));
                assert!(r.read(at, &mut back[into..into + len]));
                assert_eq!(&back[into..into + len], &bytes[..len], "vectored: len {len} ahead {ahead}");
                // Zeroed between the cases: nothing of one case's bytes can pass for the next's.
                assert!(r.write(PAGE, &[0; 6 * PAGE]));
                back.fill(0);
            }
        }
    }

    #[test]
    fn forgotten_pages_keep_their_bytes() {
        let r = Region::create("tiercel-test", 4 * PAGE).unwrap();
        assert!(r.write(PAGE, &[7; PAGE]));
        r.forget(PAGE, 2 * PAGE);
        let mut out = [0u8; PAGE];
        assert!(r.read(PAGE, &mut out));
        assert_eq!(out, [7; PAGE], "forgetting a shared mapping's pages keeps the file's bytes");
        r.discard(PAGE, PAGE);
        assert!(r.read(PAGE, &mut out));
        assert_eq!(out, [0; PAGE], "discarding gives them back to the system");
    }

    #[test]
    fn regions_of_the_wrong_size_or_unsealed_are_refused() {
        let a = Region::create("tiercel-test", 4096).unwrap();
        let dup = a.fd().try_clone_to_owned().unwrap();
        assert!(Region::from_fd(dup, 8192).is_err(), "size must match");
        assert!(rustix::fs::ftruncate(a.fd(), 0).is_err(), "sealed against shrinking");
        let unsealed = rustix::fs::memfd_create("x", MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&unsealed, 4096).unwrap();
        assert!(Region::from_fd(unsealed, 4096).is_err(), "an unsealed region could shrink under us");
    }

    #[test]
    fn futex_wakes_across_threads_and_peer_close_is_seen() {
        let r = std::sync::Arc::new(Region::create("tiercel-test", 4096).unwrap());
        let r2 = r.clone();
        let t = std::thread::spawn(move || {
            let w = r2.u32_at(0).unwrap();
            while w.load(Ordering::SeqCst) == 0 {
                futex_wait(w, 0, Some(Duration::from_secs(5)));
            }
        });
        std::thread::sleep(Duration::from_millis(20));
        r.u32_at(0).unwrap().store(1, Ordering::SeqCst);
        futex_wake(r.u32_at(0).unwrap(), 1);
        t.join().unwrap();
        let (x, y) = UnixStream::pair().unwrap();
        assert_eq!(peer_credentials(&x).unwrap(), own_credentials(), "a pair's peer is this process");
        assert!(!peer_closed(&x));
        drop(y);
        assert!(peer_closed(&x));
    }
}
