//! The call context: what a call carries besides its arguments, at the start of its message when
//! the call packet has [`crate::wire::flags::CONTEXT`] (over UDP) or its procedure word has
//! [`crate::shm::CONTEXT`] (through shared memory).
//!
//! ```text
//!  0        1        2
//!  +--------+--------+----------------------------------------------+
//!  | length | fields | the fields present, in the order of their bits |
//!  +--------+--------+----------------------------------------------+
//!  bit 0  deadline: u32, microseconds left when the call was sent (over UDP; shared memory carries
//!         an absolute deadline in the slot's control words instead)
//!  bit 1  trace: 16-byte trace id, 8-byte id of the caller's span (W3C trace-context's ids)
//! ```
//!
//! `length` counts the whole block: a receiver skips fields it does not know by bits above those it
//! knows, so later fields can be added without breaking older servers.

use core::time::Duration;

/// Field bits.
pub mod field {
    /// A relative deadline.
    pub const DEADLINE: u8 = 0x01;
    /// A trace id and the caller's span id.
    pub const TRACE: u8 = 0x02;
}

/// Most bytes a context block takes.
pub const MAX_LEN: usize = 2 + 4 + 24;

/// The trace a call belongs to, and the caller's span in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trace {
    /// Identifies the whole trace (all processes).
    pub trace_id: u128,
    /// The caller's span, the parent of the server's.
    pub parent_id: u64,
}

/// A call's context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Context {
    /// Time left to the caller's deadline when the call was sent (whole microseconds, at most
    /// `u32::MAX`: about 71 minutes; longer deadlines are sent as that).
    pub deadline: Option<Duration>,
    /// The caller's trace.
    pub trace: Option<Trace>,
}

/// A context block that does not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed call context")]
pub struct Malformed;

impl Context {
    /// Whether there is anything to send.
    pub fn is_empty(&self) -> bool {
        self.deadline.is_none() && self.trace.is_none()
    }

    /// Encodes the block into `out`; returns its length.
    pub fn encode(&self, out: &mut [u8; MAX_LEN]) -> usize {
        let mut n = 2;
        let mut fields = 0;
        if let Some(d) = self.deadline {
            fields |= field::DEADLINE;
            out[n..n + 4].copy_from_slice(&micros(d).to_le_bytes());
            n += 4;
        }
        if let Some(t) = self.trace {
            fields |= field::TRACE;
            out[n..n + 16].copy_from_slice(&t.trace_id.to_le_bytes());
            out[n + 16..n + 24].copy_from_slice(&t.parent_id.to_le_bytes());
            n += 24;
        }
        out[0] = n as u8;
        out[1] = fields;
        n
    }

    /// Parses the block at the start of `message`; returns it and the arguments after it.
    pub fn parse(message: &[u8]) -> Result<(Context, &[u8]), Malformed> {
        let (&len, _) = message.split_first().ok_or(Malformed)?;
        let len = len as usize;
        if len < 2 || len > message.len() {
            return Err(Malformed);
        }
        let (block, args) = message.split_at(len);
        let fields = block[1];
        let mut rest = &block[2..];
        let mut take = |n: usize| -> Result<&[u8], Malformed> {
            if rest.len() < n {
                return Err(Malformed);
            }
            let (a, b) = rest.split_at(n);
            rest = b;
            Ok(a)
        };
        let mut context = Context::default();
        if fields & field::DEADLINE != 0 {
            let b = take(4)?;
            context.deadline = Some(Duration::from_micros(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u64));
        }
        if fields & field::TRACE != 0 {
            let b = take(24)?;
            let mut id = [0u8; 16];
            id.copy_from_slice(&b[..16]);
            let mut parent = [0u8; 8];
            parent.copy_from_slice(&b[16..]);
            context.trace = Some(Trace { trace_id: u128::from_le_bytes(id), parent_id: u64::from_le_bytes(parent) });
        }
        // Fields of later versions (higher bits) are skipped with the rest of the block.
        Ok((context, args))
    }
}

/// Where in an encoded block the deadline's four bytes are (after the length and field bytes),
/// so that a sender can refresh it before each retransmission.
pub const DEADLINE_AT: usize = 2;

/// `d` in whole microseconds, at most `u32::MAX`.
pub fn micros(d: Duration) -> u32 {
    d.as_micros().min(u32::MAX as u128) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_combination_and_leaves_the_arguments() {
        let trace = Trace { trace_id: 0x0123_4567_89ab_cdef_0011_2233_4455_6677, parent_id: 42 };
        for context in [
            Context { deadline: Some(Duration::from_millis(1500)), trace: None },
            Context { deadline: None, trace: Some(trace) },
            Context { deadline: Some(Duration::from_micros(7)), trace: Some(trace) },
            Context::default(),
        ] {
            let mut block = [0u8; MAX_LEN];
            let n = context.encode(&mut block);
            let mut message = block[..n].to_vec();
            message.extend_from_slice(b"args");
            assert_eq!(Context::parse(&message), Ok((context, &b"args"[..])));
        }
        let long = Context { deadline: Some(Duration::from_secs(1 << 40)), trace: None };
        let mut block = [0u8; MAX_LEN];
        let n = long.encode(&mut block);
        assert_eq!(Context::parse(&block[..n]).unwrap().0.deadline, Some(Duration::from_micros(u32::MAX as u64)));
    }

    #[test]
    fn unknown_fields_are_skipped_and_short_blocks_refused() {
        // A later sender's block: a deadline, then 3 bytes of a field this version does not know.
        let message = [9, field::DEADLINE | 0x80, 1, 0, 0, 0, 0xaa, 0xbb, 0xcc, b'x'];
        assert_eq!(
            Context::parse(&message),
            Ok((Context { deadline: Some(Duration::from_micros(1)), trace: None }, &b"x"[..]))
        );
        for bad in [&[][..], &[1], &[0, 0], &[3, 0], &[4, field::DEADLINE, 0, 0], &[6, field::TRACE, 0, 0, 0, 0]] {
            assert_eq!(Context::parse(bad), Err(Malformed), "{bad:?}");
        }
    }
}
