//! A secure binding's sealed packets and handshake messages from arbitrary bytes: nothing forged
//! opens, nothing panics; a packet sealed and opened comes back whole, and any bit flipped in it
//! makes it dropped.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercel::secure::fuzzing;

fuzz_target!(|input: (u8, Option<u32>, Vec<u8>)| {
    let (which, flip, bytes) = input;
    match which % 4 {
        0 => assert!(!fuzzing::open(&bytes), "arbitrary bytes opened as a sealed packet"),
        1 => {
            if let Err(e) = fuzzing::seal_and_open(&bytes, flip.map(|b| b as usize)) {
                panic!("{e}");
            }
        }
        2 => assert!(!fuzzing::read_hello(&bytes), "arbitrary bytes read as a handshake"),
        _ => assert!(!fuzzing::read_welcome(&bytes), "arbitrary bytes read as a handshake's answer"),
    }
});
