//! ONC RPC as a tiercel server reads it: arbitrary bytes as a call (never read past their end, a
//! credential never longer than the RFC's bound, the refusal written for what is refused), as a
//! reply, and as a stream of marked records fed in arbitrary pieces (a record never longer than
//! the bound, never grown past the bytes that arrived); each call read enters the duplicate cache,
//! which stays within its budgets.
#![no_main]

use std::net::SocketAddr;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use tiercel_proto::onc::{self, Cache, CacheKey, Credential, RecordReader, Seen};

const LIMIT: usize = 2048;

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, rest)) = data.split_first() else { return };
    let mut cache = Cache::new(8, 64, 256, Duration::from_secs(1));
    let mut out = Vec::new();
    let mut now = Duration::ZERO;
    let mut read = |msg: &[u8], cache: &mut Cache, out: &mut Vec<u8>| {
        match onc::parse_call(msg) {
            Ok(call) => {
                assert!(call.args.len() <= msg.len());
                if let Credential::Sys(sys) = call.credential {
                    assert!(sys.machine.len() <= onc::MAX_MACHINE_NAME && sys.gids().len() <= onc::MAX_GIDS);
                }
                now += Duration::from_millis(100);
                let key = CacheKey::of(&call, SocketAddr::from(([127, 0, 0, 1], 9)), false);
                if cache.check(key, now) == Seen::New {
                    cache.complete(key, call.args);
                }
                assert!(cache.len() <= 8);
            }
            Err(refused) => {
                out.clear();
                if onc::write_refusal(out, refused) {
                    assert!(onc::parse_reply(out).is_some(), "a refusal reads back as a reply");
                }
            }
        }
        let _ = onc::parse_reply(msg);
    };
    read(rest, &mut cache, &mut out);
    let mut reader = RecordReader::new(LIMIT);
    for piece in rest.chunks(usize::from(chunk) + 1) {
        let mut left = piece;
        while !left.is_empty() {
            match reader.feed(left) {
                Err(_) => return,
                Ok((used, whole)) => {
                    assert!(used <= left.len() && (used > 0 || whole));
                    left = &left[used..];
                    assert!(reader.record().len() <= LIMIT);
                    if whole {
                        let record = reader.record().to_vec();
                        read(&record, &mut cache, &mut out);
                    }
                }
            }
        }
    }
});
