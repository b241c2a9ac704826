//! The TCP transport's framing fed arbitrary bytes in arbitrary read sizes, growing for large frames
//! (all at once as a client does, or step by step as bytes arrive as the server does) and skipping some as a server without room does, working on frames where they landed, taking
//! them, and counting bytes read elsewhere as a client does. Nothing panics; the buffer never grows
//! beyond the limit; every frame taken is as long as its prefix said and no longer than the limit;
//! a frame [`check_frame`] accepts holds one whole packet.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercel_proto::stream::{check_frame, Deframer, Next, PREFIX_LEN};
use tiercel_proto::wire::HEADER_LEN;

const LIMIT: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, mut rest)) = data.split_first() else { return };
    let chunk = chunk as usize + 1;
    let mut d = Deframer::new(128, LIMIT);
    let mut skip_next = false;
    let mut spare = Vec::new();
    loop {
        loop {
            match d.next() {
                Err(_) => return,
                Ok(Next::Frame(len)) => {
                    let frame = d.frame();
                    assert_eq!(frame.len(), len);
                    assert!((HEADER_LEN..=LIMIT).contains(&len));
                    if let Ok(p) = check_frame(frame) {
                        assert_eq!(HEADER_LEN + p.payload_len() as usize, len);
                        assert_eq!(p.frag_count(), 1);
                    }
                    skip_next = frame.last().is_some_and(|b| b & 1 == 1);
                    // Frames are dropped, worked on where they landed, or taken, by their first byte.
                    match frame.first().map_or(0, |b| b % 3) {
                        0 => d.consume(),
                        1 => {
                            let worked = d.consume_in_place(|buf| {
                                assert_eq!(buf.len(), PREFIX_LEN + len);
                                buf.push(1);
                            });
                            match worked {
                                // The frame was all the buffer held: nothing is left.
                                Some(()) => assert_eq!(d.buffered(), 0),
                                None => d.consume(),
                            }
                        }
                        _ => match d.take_frame(std::mem::take(&mut spare)) {
                            Ok(frame) => {
                                assert_eq!(frame.len(), PREFIX_LEN + len);
                                assert_eq!(d.buffered(), 0);
                                spare = frame;
                            }
                            Err(back) => {
                                spare = back;
                                d.consume();
                            }
                        },
                    }
                }
                Ok(Next::Partial(len)) => {
                    if skip_next {
                        d.skip_frame();
                        skip_next = false;
                    } else if len % 2 == 1 {
                        // The server's way: room as the bytes arrive, twice what is here at most.
                        if d.needs_room(len) {
                            let before = d.buffered();
                            let to = d.next_size(len);
                            assert!(to <= (2 * before).max(PREFIX_LEN + len.min(LIMIT)).max(before));
                            d.grow_toward(len, to);
                            assert!(!d.needs_room(len), "grown, there is room for more of the frame");
                        }
                    } else if !d.fits(len) {
                        d.grow_for(len);
                    }
                    break;
                }
                Ok(Next::Nothing) => break,
            }
        }
        assert!(d.grown() <= PREFIX_LEN + LIMIT);
        if rest.is_empty() {
            return;
        }
        assert_eq!(d.front().len(), d.buffered());
        let partial = matches!(d.next(), Ok(Next::Partial(_)));
        let spare = d.spare();
        let n = spare.len().min(chunk).min(rest.len());
        if partial && rest[0] == 0xee {
            // Read elsewhere, as a client reads its result into the caller's buffer.
            d.filled_elsewhere(n);
        } else {
            spare[..n].copy_from_slice(&rest[..n]);
            d.filled(n);
        }
        rest = &rest[n..];
    }
});
