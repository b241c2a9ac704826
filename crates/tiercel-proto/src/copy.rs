//! Copies of bytes that stay clear of one slow case of the platform's `memcpy`.
//!
//! On CPUs that announce fast short `rep movsb` (FSRM), glibc 2.36 (Debian 12's) copies from 2,113
//! bytes up to about the size of the core's L2 cache with one `rep movsb`. On AMD's Zen 3 (the AMD
//! EPYC of family 25, model 1, of our benchmark VM) that instruction runs many times slower when
//! the destination's offset in its page lies a few bytes past the source's (glibc's bug 30994): in
//! a scratch C program on that VM, a `memcpy` of 3,004 bytes took 1.06 µs instead of 0.045 µs with
//! the destination 1 to 31 bytes past, and one of 256 KiB 93 µs instead of 6. The placement is a
//! common one: a buffer of 128 KiB or more from glibc's `malloc` starts 16 bytes into a page, and a
//! shared-memory slot's data at a page's start, so that a result read from the slot straight into
//! such an `Out` or `InOut` buffer lands 16 bytes past its source. (Copies of 512 KiB or more took
//! as long in either placement.)
//!
//! Every copy of a call's bytes that may be that long goes through [`copy`], [`extend`] or
//! [`to_vec`] (and the shared-memory region's copies, in `tiercel-sys`, through [`in_pieces`]):
//! where the placement is the slow one, they copy in pieces of [`PIECE`] bytes, each short enough
//! for `memcpy`'s vector loop; elsewhere they are one `copy_from_slice`, as before.
//!
//! What the rule costs a copy that stays whole, as every copy of a Null or small call does: one
//! comparison of its length more. In a scratch loop on an Intel Xeon VM (one CPU, 20 million copies
//! a timing, medians of seven), [`copy`] of 56 bytes took 3.51 ns against `copy_from_slice`'s 3.36,
//! of 2,048 bytes 18.73 ns against 18.47.

/// The longest piece one `memcpy` copies when a copy goes in pieces: under the 2,112 bytes past
/// which glibc's `memcpy` turns to `rep movsb` on FSRM CPUs.
pub const PIECE: usize = 2048;

/// How far past the source's offset in its page (1 to this many bytes) the destination's may lie
/// for a copy to go in pieces: 1 to 31 were slow on our EPYC VM, 32 and more were not. The margin
/// costs the pieces' calls where one `memcpy` would have been quick (3,004 bytes at the source's
/// offset: 0.066 µs whole, 0.079 in pieces, in a scratch C program on that VM).
const AHEAD: usize = 63;

/// Copies this long or longer stay whole: glibc's `memcpy` copies them without `rep movsb` (on our
/// Zen 3 VM from 512 KiB, the size of a core's L2 cache there; 1 MiB leaves room for cores with a
/// larger one), and in pieces they would lose its non-temporal stores. A scratch C program on our VM copied 16 MiB, 16 bytes ahead, in
/// 1.48 ms whole and 3.0 ms in pieces of 2 KiB.
const WHOLE_FROM: usize = 1 << 20;

/// Whether a copy of `len` bytes from address `src` to address `dst` goes in pieces of [`PIECE`]
/// bytes: when it is longer than one piece and shorter than 1 MiB, and the destination lies 1 to
/// 63 bytes past the source modulo the 4 KiB page.
#[inline]
pub fn in_pieces(dst: usize, src: usize, len: usize) -> bool {
    len > PIECE && len < WHOLE_FROM && (dst.wrapping_sub(src) % 4096).wrapping_sub(1) < AHEAD
}

/// Copies `src` into `dst`, which must be as long (as `copy_from_slice`, which panics otherwise),
/// in pieces where [`in_pieces`] says so.
#[inline]
pub fn copy(dst: &mut [u8], src: &[u8]) {
    if in_pieces(dst.as_ptr() as usize, src.as_ptr() as usize, src.len()) {
        assert_eq!(dst.len(), src.len(), "copy between slices of different lengths");
        for (d, s) in dst.chunks_mut(PIECE).zip(src.chunks(PIECE)) {
            d.copy_from_slice(s);
        }
    } else {
        dst.copy_from_slice(src);
    }
}

/// Appends `src` to `v` (as `extend_from_slice`), in pieces where [`in_pieces`] says so.
#[inline]
pub fn extend(v: &mut Vec<u8>, src: &[u8]) {
    if src.len() > PIECE {
        v.reserve(src.len());
        let end = v.as_ptr() as usize + v.len();
        if in_pieces(end, src.as_ptr() as usize, src.len()) {
            for s in src.chunks(PIECE) {
                v.extend_from_slice(s);
            }
            return;
        }
    }
    v.extend_from_slice(src);
}

/// A new vector of the bytes of `src` (as `to_vec`), copied in pieces where [`in_pieces`] says so.
#[inline]
pub fn to_vec(src: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(src.len());
    extend(&mut v, src);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_long_copies_a_few_bytes_ahead_in_the_page_go_in_pieces() {
        let page = 1 << 20;
        for ahead in 1..=63 {
            assert!(in_pieces(page + ahead, page, 3004), "{ahead}");
            // The offset in the page is what counts, not the distance.
            assert!(in_pieces(page + 5 * 4096 + ahead, page, 3004), "{ahead}");
            assert!(in_pieces(page + ahead - 4096, page, 3004), "{ahead}");
        }
        for ahead in [0, 64, 100, 2048, 4095] {
            assert!(!in_pieces(page + ahead, page, 3004), "{ahead}");
        }
        // Short copies never use `rep movsb`, nor those from the L2 cache's size on.
        assert!(!in_pieces(page + 16, page, PIECE));
        assert!(in_pieces(page + 16, page, PIECE + 1));
        assert!(in_pieces(page + 16, page, (1 << 20) - 1));
        assert!(!in_pieces(page + 16, page, 1 << 20));
        assert!(!in_pieces(page + 16, page, 16 << 20));
        // Addresses that wrap around.
        assert!(in_pieces(15, usize::MAX, 3004));
    }

    #[test]
    fn copies_in_pieces_or_not_carry_every_byte() {
        let src: Vec<u8> = (0..40_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut store = vec![0u8; 50_000];
        for len in [0, 1, PIECE - 1, PIECE, PIECE + 1, 3004, 2 * PIECE, 2 * PIECE + 5, 40_000] {
            for ahead in [0, 1, 12, 16, 31, 63, 64, 200] {
                // A destination `ahead` bytes past the source's offset in its page.
                let src_off = src.as_ptr() as usize % 4096;
                let base = store.as_ptr() as usize % 4096;
                let at = (src_off + ahead + 4096 - base) % 4096;
                store.fill(0);
                copy(&mut store[at..at + len], &src[..len]);
                assert_eq!(&store[at..at + len], &src[..len], "len {len} ahead {ahead}");
                assert!(store[..at].iter().all(|&b| b == 0) && store[at + len..].iter().all(|&b| b == 0));
                let mut v = vec![9u8; at];
                extend(&mut v, &src[..len]);
                assert_eq!(&v[..at], &vec![9u8; at][..]);
                assert_eq!(&v[at..], &src[..len], "extend: len {len} ahead {ahead}");
                assert_eq!(to_vec(&src[..len]), &src[..len]);
            }
        }
    }

    #[test]
    #[should_panic(expected = "different lengths")]
    fn a_copy_between_slices_of_different_lengths_panics_as_copy_from_slice_does() {
        let src = vec![1u8; 3004];
        let mut dst = vec![0u8; 4096 * 3];
        let at = (src.as_ptr() as usize % 4096 + 16 + 4096 - dst.as_ptr() as usize % 4096) % 4096;
        copy(&mut dst[at..at + 3003], &src);
    }
}
