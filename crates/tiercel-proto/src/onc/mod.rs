//! ONC RPC (Sun RPC, RFC 5531): its call and reply messages, the record marking that carries them
//! over TCP, and the duplicate request cache of a server, without I/O.
//!
//! An ONC message is XDR (RFC 4506): big-endian 32-bit words, variable-length items behind their
//! length and padded to a multiple of four bytes. [`parse_call`] reads a call's header (checking
//! every length against the bytes there are, and the credential against the RFC's 400-byte bound)
//! and leaves its arguments where they lie; the reply writers append a reply's header to a buffer
//! the results then follow. Nothing here allocates on the way of a call but the duplicate cache,
//! which keeps replies within a budget of entries and bytes.

mod cache;
mod record;

pub use cache::{Cache, CacheKey, Seen};
pub use record::{record_mark, RecordError, RecordReader, LAST_FRAGMENT, MAX_FRAGMENT};

/// The RPC protocol version this module speaks (RFC 5531's `rpcvers`).
pub const RPC_VERSION: u32 = 2;
/// `msg_type` of a call.
pub const CALL: u32 = 0;
/// `msg_type` of a reply.
pub const REPLY: u32 = 1;
/// Most bytes of a credential's or verifier's body (RFC 5531's `MAX_AUTH_BYTES`).
pub const MAX_AUTH_BYTES: usize = 400;
/// Most bytes of an `AUTH_SYS` credential's machine name (RFC 5531, appendix A).
pub const MAX_MACHINE_NAME: usize = 255;
/// Most supplementary groups of an `AUTH_SYS` credential.
pub const MAX_GIDS: usize = 16;

/// Authentication flavors.
pub mod flavor {
    /// No credential.
    pub const AUTH_NONE: u32 = 0;
    /// The caller's claimed user and groups (`AUTH_UNIX`), believed, not proven.
    pub const AUTH_SYS: u32 = 1;
}

/// `accept_stat` of an accepted reply.
pub mod accept {
    /// The procedure ran; its results follow.
    pub const SUCCESS: u32 = 0;
    /// The program is not served here.
    pub const PROG_UNAVAIL: u32 = 1;
    /// The program is, but not this version: the lowest and highest served follow.
    pub const PROG_MISMATCH: u32 = 2;
    /// The program has no such procedure.
    pub const PROC_UNAVAIL: u32 = 3;
    /// The arguments could not be decoded.
    pub const GARBAGE_ARGS: u32 = 4;
    /// The server failed (here: the procedure panicked, or its result could not be sent).
    pub const SYSTEM_ERR: u32 = 5;
}

/// `auth_stat` of a reply denied for its credential.
pub mod auth {
    /// A credential the server could not read.
    pub const BADCRED: u32 = 1;
    /// A flavor the server does not take.
    pub const REJECTEDCRED: u32 = 2;
}

/// The caller's credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credential<'a> {
    /// `AUTH_NONE`.
    None,
    /// `AUTH_SYS`: what the caller says it is.
    Sys(AuthSys<'a>),
}

/// An `AUTH_SYS` credential: claims of the calling machine, not proofs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthSys<'a> {
    /// An arbitrary number the caller chose.
    pub stamp: u32,
    /// The calling machine's name (at most 255 bytes, not checked as text).
    pub machine: &'a [u8],
    /// The caller's user id.
    pub uid: u32,
    /// Its group id.
    pub gid: u32,
    gids: [u32; MAX_GIDS],
    gid_count: u8,
}

impl<'a> AuthSys<'a> {
    /// A credential of `uid` and `gid` with no supplementary groups.
    pub fn new(stamp: u32, machine: &'a [u8], uid: u32, gid: u32) -> AuthSys<'a> {
        AuthSys { stamp, machine, uid, gid, gids: [0; MAX_GIDS], gid_count: 0 }
    }

    /// The supplementary groups.
    pub fn gids(&self) -> &[u32] {
        &self.gids[..usize::from(self.gid_count)]
    }
}

/// A call's header, and its arguments where they lie in the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call<'a> {
    /// The caller's transaction id: its reply carries it back.
    pub xid: u32,
    /// The program called.
    pub program: u32,
    /// Its version.
    pub version: u32,
    /// The procedure.
    pub procedure: u32,
    /// Who the caller says it is.
    pub credential: Credential<'a>,
    /// The encoded arguments: the rest of the message.
    pub args: &'a [u8],
}

/// Why a message is not a call this module can answer with results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Too short, a length past its end, or not a call: dropped without a reply (there may be no
    /// caller to tell).
    Dropped,
    /// A call of another RPC version: answered `RPC_MISMATCH` (with 2 as the lowest and highest).
    RpcVersion {
        /// The call's xid.
        xid: u32,
    },
    /// A credential that is malformed (`AUTH_BADCRED`) or of a flavor not taken
    /// (`AUTH_REJECTEDCRED`).
    Credential {
        /// The call's xid.
        xid: u32,
        /// The `auth_stat` to answer.
        stat: u32,
    },
}

/// Reads XDR words from a message, checking every length against what is there.
struct Words<'a> {
    buf: &'a [u8],
}

impl<'a> Words<'a> {
    fn u32(&mut self) -> Option<u32> {
        let (word, rest) = self.buf.split_first_chunk::<4>()?;
        self.buf = rest;
        Some(u32::from_be_bytes(*word))
    }

    /// Variable-length opaque data of at most `most` bytes, padded to four.
    fn opaque(&mut self, most: usize) -> Option<&'a [u8]> {
        let len = usize::try_from(self.u32()?).ok()?;
        if len > most {
            return None;
        }
        let padded = len.checked_add(3)? & !3;
        if padded > self.buf.len() {
            return None;
        }
        let (bytes, rest) = self.buf.split_at(padded);
        self.buf = rest;
        Some(&bytes[..len])
    }
}

/// Reads a call's header. `Err` says what to answer, if anything.
pub fn parse_call(msg: &[u8]) -> Result<Call<'_>, Refused> {
    let mut w = Words { buf: msg };
    let xid = w.u32().ok_or(Refused::Dropped)?;
    if w.u32() != Some(CALL) {
        return Err(Refused::Dropped);
    }
    let rpc_version = w.u32().ok_or(Refused::Dropped)?;
    let (program, version, procedure) = match (w.u32(), w.u32(), w.u32()) {
        (Some(p), Some(v), Some(n)) => (p, v, n),
        _ => return Err(Refused::Dropped),
    };
    if rpc_version != RPC_VERSION {
        return Err(Refused::RpcVersion { xid });
    }
    let bad = Refused::Credential { xid, stat: auth::BADCRED };
    let flavor = w.u32().ok_or(Refused::Dropped)?;
    let body = w.opaque(MAX_AUTH_BYTES).ok_or(bad)?;
    let credential = match flavor {
        flavor::AUTH_NONE => Credential::None,
        flavor::AUTH_SYS => Credential::Sys(parse_auth_sys(body).ok_or(bad)?),
        _ => return Err(Refused::Credential { xid, stat: auth::REJECTEDCRED }),
    };
    // The verifier: any flavor's is read and ignored (AUTH_NONE and AUTH_SYS have none worth
    // checking), but its length is bounded as the credential's is.
    let _verifier_flavor = w.u32().ok_or(bad)?;
    w.opaque(MAX_AUTH_BYTES).ok_or(bad)?;
    Ok(Call { xid, program, version, procedure, credential, args: w.buf })
}

fn parse_auth_sys(body: &[u8]) -> Option<AuthSys<'_>> {
    let mut w = Words { buf: body };
    let stamp = w.u32()?;
    let machine = w.opaque(MAX_MACHINE_NAME)?;
    let uid = w.u32()?;
    let gid = w.u32()?;
    let count = usize::try_from(w.u32()?).ok()?;
    if count > MAX_GIDS {
        return None;
    }
    let mut gids = [0; MAX_GIDS];
    for g in &mut gids[..count] {
        *g = w.u32()?;
    }
    if !w.buf.is_empty() {
        return None;
    }
    Some(AuthSys { stamp, machine, uid, gid, gids, gid_count: count as u8 })
}

fn put(out: &mut Vec<u8>, words: &[u32]) {
    for w in words {
        out.extend_from_slice(&w.to_be_bytes());
    }
}

fn put_opaque(out: &mut Vec<u8>, bytes: &[u8]) {
    put(out, &[bytes.len() as u32]);
    crate::copy::extend(out, bytes);
    out.resize(out.len() + (4 - bytes.len() % 4) % 4, 0);
}

/// Appends a call's header to `out`; its arguments follow.
pub fn write_call(
    out: &mut Vec<u8>,
    xid: u32,
    program: u32,
    version: u32,
    procedure: u32,
    credential: &Credential<'_>,
) {
    put(out, &[xid, CALL, RPC_VERSION, program, version, procedure]);
    match credential {
        Credential::None => put(out, &[flavor::AUTH_NONE, 0]),
        Credential::Sys(sys) => {
            let at = out.len();
            put(out, &[flavor::AUTH_SYS, 0, sys.stamp]);
            put_opaque(out, &sys.machine[..sys.machine.len().min(MAX_MACHINE_NAME)]);
            put(out, &[sys.uid, sys.gid, sys.gids().len() as u32]);
            put(out, sys.gids());
            let len = (out.len() - at - 8) as u32;
            out[at + 4..at + 8].copy_from_slice(&len.to_be_bytes());
        }
    }
    put(out, &[flavor::AUTH_NONE, 0]);
}

/// An accepted reply's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepted {
    /// The procedure ran; its results follow the header.
    Success,
    /// `PROG_UNAVAIL`.
    ProgUnavail,
    /// `PROG_MISMATCH`, with the lowest and highest versions served.
    ProgMismatch {
        /// The lowest version of the program served here.
        low: u32,
        /// The highest.
        high: u32,
    },
    /// `PROC_UNAVAIL`.
    ProcUnavail,
    /// `GARBAGE_ARGS`.
    GarbageArgs,
    /// `SYSTEM_ERR`.
    SystemErr,
}

/// Appends an accepted reply's header (with an `AUTH_NONE` verifier) to `out`; on
/// [`Accepted::Success`] the results follow.
pub fn write_accepted(out: &mut Vec<u8>, xid: u32, status: Accepted) {
    put(out, &[xid, REPLY, 0, flavor::AUTH_NONE, 0]);
    match status {
        Accepted::Success => put(out, &[accept::SUCCESS]),
        Accepted::ProgUnavail => put(out, &[accept::PROG_UNAVAIL]),
        Accepted::ProgMismatch { low, high } => put(out, &[accept::PROG_MISMATCH, low, high]),
        Accepted::ProcUnavail => put(out, &[accept::PROC_UNAVAIL]),
        Accepted::GarbageArgs => put(out, &[accept::GARBAGE_ARGS]),
        Accepted::SystemErr => put(out, &[accept::SYSTEM_ERR]),
    }
}

/// Appends the reply a [`Refused`] call gets, if any: `false` when it gets none.
pub fn write_refusal(out: &mut Vec<u8>, refused: Refused) -> bool {
    match refused {
        Refused::Dropped => return false,
        // MSG_DENIED, RPC_MISMATCH, the versions spoken.
        Refused::RpcVersion { xid } => put(out, &[xid, REPLY, 1, 0, RPC_VERSION, RPC_VERSION]),
        // MSG_DENIED, AUTH_ERROR, why.
        Refused::Credential { xid, stat } => put(out, &[xid, REPLY, 1, 1, stat]),
    }
    true
}

/// A reply, as a client reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply<'a> {
    /// The xid of the call it answers.
    pub xid: u32,
    /// What happened to the call.
    pub status: ReplyStatus,
    /// The results, on [`ReplyStatus::Accepted`] with [`Accepted::Success`].
    pub results: &'a [u8],
}

/// What a reply says of its call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyStatus {
    /// Accepted, with this status.
    Accepted(Accepted),
    /// Denied: the server speaks only RPC versions `low` to `high`.
    RpcMismatch {
        /// Lowest RPC version spoken.
        low: u32,
        /// Highest.
        high: u32,
    },
    /// Denied for its credential, with this `auth_stat`.
    AuthError(u32),
}

/// Reads a reply; `None` for bytes that are not one.
pub fn parse_reply(msg: &[u8]) -> Option<Reply<'_>> {
    let mut w = Words { buf: msg };
    let xid = w.u32()?;
    if w.u32()? != REPLY {
        return None;
    }
    let status = match w.u32()? {
        0 => {
            let _flavor = w.u32()?;
            w.opaque(MAX_AUTH_BYTES)?;
            ReplyStatus::Accepted(match w.u32()? {
                accept::SUCCESS => Accepted::Success,
                accept::PROG_UNAVAIL => Accepted::ProgUnavail,
                accept::PROG_MISMATCH => Accepted::ProgMismatch { low: w.u32()?, high: w.u32()? },
                accept::PROC_UNAVAIL => Accepted::ProcUnavail,
                accept::GARBAGE_ARGS => Accepted::GarbageArgs,
                accept::SYSTEM_ERR => Accepted::SystemErr,
                _ => return None,
            })
        }
        1 => match w.u32()? {
            0 => ReplyStatus::RpcMismatch { low: w.u32()?, high: w.u32()? },
            1 => ReplyStatus::AuthError(w.u32()?),
            _ => return None,
        },
        _ => return None,
    };
    let results = if status == ReplyStatus::Accepted(Accepted::Success) { w.buf } else { &[] };
    Some(Reply { xid, status, results })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call_bytes(credential: &Credential<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        write_call(&mut out, 7, 0x2000_0001, 3, 4, credential);
        out.extend_from_slice(&[0, 0, 0, 9]);
        out
    }

    #[test]
    fn a_call_reads_back_as_written_with_either_credential() {
        let mut sys = AuthSys::new(5, b"host", 1000, 100);
        sys.gids[..2].copy_from_slice(&[4, 24]);
        sys.gid_count = 2;
        for credential in [Credential::None, Credential::Sys(sys)] {
            let bytes = call_bytes(&credential);
            let call = parse_call(&bytes).unwrap();
            assert_eq!((call.xid, call.program, call.version, call.procedure), (7, 0x2000_0001, 3, 4));
            assert_eq!(call.credential, credential);
            assert_eq!(call.args, &[0, 0, 0, 9]);
        }
        assert_eq!(sys.gids(), &[4, 24]);
    }

    #[test]
    fn every_cut_of_a_call_is_dropped_or_refused_never_read_past_its_end() {
        let bytes = call_bytes(&Credential::Sys(AuthSys::new(5, b"a-machine", 0, 0)));
        let header = bytes.len() - 4;
        for cut in 0..header {
            let got = parse_call(&bytes[..cut]);
            assert!(got.is_err(), "a call cut at {cut} of {header} bytes was read: {got:?}");
        }
    }

    #[test]
    fn another_rpc_version_an_unknown_flavor_and_a_long_credential_are_answered_as_the_rfc_says() {
        let mut bytes = call_bytes(&Credential::None);
        bytes[8..12].copy_from_slice(&3u32.to_be_bytes());
        assert_eq!(parse_call(&bytes), Err(Refused::RpcVersion { xid: 7 }));
        let mut out = Vec::new();
        assert!(write_refusal(&mut out, Refused::RpcVersion { xid: 7 }));
        assert_eq!(parse_reply(&out).unwrap().status, ReplyStatus::RpcMismatch { low: 2, high: 2 });

        let mut bytes = call_bytes(&Credential::None);
        bytes[24..28].copy_from_slice(&6u32.to_be_bytes());
        assert_eq!(parse_call(&bytes), Err(Refused::Credential { xid: 7, stat: auth::REJECTEDCRED }));

        let mut bytes = call_bytes(&Credential::None);
        bytes[28..32].copy_from_slice(&401u32.to_be_bytes());
        assert_eq!(parse_call(&bytes), Err(Refused::Credential { xid: 7, stat: auth::BADCRED }));
        let mut out = Vec::new();
        write_refusal(&mut out, Refused::Credential { xid: 7, stat: auth::BADCRED });
        assert_eq!(parse_reply(&out).unwrap().status, ReplyStatus::AuthError(auth::BADCRED));

        assert_eq!(parse_call(&[0, 0, 0, 7, 0, 0, 0, 1]), Err(Refused::Dropped), "a reply is not a call");
    }

    #[test]
    fn an_auth_sys_credential_with_too_many_groups_or_bytes_left_over_is_bad() {
        let sys = AuthSys::new(5, b"m", 1, 2);
        let mut bytes = call_bytes(&Credential::Sys(sys));
        // flavor at 24, length at 28, stamp at 32, machine length 36, "m" + pad 40, uid 44,
        // gid 48, count 52.
        bytes[52..56].copy_from_slice(&17u32.to_be_bytes());
        assert_eq!(parse_call(&bytes), Err(Refused::Credential { xid: 7, stat: auth::BADCRED }));
    }

    #[test]
    fn each_accepted_status_reads_back_from_its_reply() {
        for status in [
            Accepted::Success,
            Accepted::ProgUnavail,
            Accepted::ProgMismatch { low: 1, high: 3 },
            Accepted::ProcUnavail,
            Accepted::GarbageArgs,
            Accepted::SystemErr,
        ] {
            let mut out = Vec::new();
            write_accepted(&mut out, 99, status);
            out.extend_from_slice(&[1, 2, 3, 4]);
            let reply = parse_reply(&out).unwrap();
            assert_eq!((reply.xid, reply.status), (99, ReplyStatus::Accepted(status)));
            let results: &[u8] = if status == Accepted::Success { &[1, 2, 3, 4] } else { &[] };
            assert_eq!(reply.results, results);
        }
    }
}
