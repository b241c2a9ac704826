//! What `#[tiercel::interface]` generates code against: interface descriptions, the server-side
//! dispatch trait and the client-side import trait.

use crate::wire::{DecodeError, Wire, Writer};

/// Describes an interface: its name, stable id, version and procedures (numbered in declaration order).
#[derive(Debug)]
pub struct InterfaceInfo {
    /// The trait's name.
    pub name: &'static str,
    /// A stable id computed from the name ([`interface_id`]).
    pub id: u64,
    /// The interface version (`#[tiercel::interface(version = N)]`, 1 by default).
    pub version: u32,
    /// Procedure names; a procedure's number is its index.
    pub procedures: &'static [&'static str],
    /// One procedure a line, in order: `name(argument types) -> result type`, types as written.
    pub signature: &'static str,
    /// A hash of the name and the signature ([`fingerprint`]): two copies of an interface with the
    /// same fingerprint agree on every procedure's number, arguments and results.
    pub fingerprint: u64,
}

/// An interface a server exports, as it says when asked ([`crate::Client::exports`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    /// The server's address.
    pub server: std::net::SocketAddr,
    /// The interface's name.
    pub name: String,
    /// Its version.
    pub version: u32,
    /// Its fingerprint ([`InterfaceInfo::fingerprint`]).
    pub fingerprint: u64,
    /// Its procedures, one a line, in order (a procedure's number is its line's index):
    /// `name(argument types) -> result type`.
    pub signature: String,
    /// Whether `signature` is whole: a long one comes cut (each answer is no longer than the
    /// request), and then hashes to another fingerprint.
    pub complete: bool,
}

impl ExportInfo {
    pub(crate) fn from_listing(
        server: std::net::SocketAddr,
        l: &tiercel_proto::bind::wire::ExportListing<'_>,
    ) -> ExportInfo {
        let name = String::from_utf8_lossy(l.name).into_owned();
        let signature = String::from_utf8_lossy(l.signature).into_owned();
        let complete = fingerprint(&name, &signature) == l.fingerprint;
        ExportInfo { server, name, version: l.version, fingerprint: l.fingerprint, signature, complete }
    }
}

impl InterfaceInfo {
    /// The interface as the bind exchange of `tiercel-proto` sees it.
    pub fn spec(&self) -> tiercel_proto::bind::InterfaceSpec<'static> {
        tiercel_proto::bind::InterfaceSpec {
            name: self.name,
            id: self.id,
            version: self.version,
            fingerprint: self.fingerprint,
            signature: self.signature,
        }
    }
}

/// The stable id of an interface named `name`: 64-bit FNV-1a of the name.
pub const fn interface_id(name: &str) -> u64 {
    fnv1a(0xcbf2_9ce4_8422_2325, name.as_bytes())
}

/// The fingerprint of interface `name` with `signature`: 64-bit FNV-1a of both, a newline between.
/// It catches accidents (a procedure inserted, renamed, reordered, retyped), not an adversary.
pub const fn fingerprint(name: &str, signature: &str) -> u64 {
    fnv1a(fnv1a(interface_id(name), b"\n"), signature.as_bytes())
}

const fn fnv1a(mut hash: u64, bytes: &[u8]) -> u64 {
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    hash
}

/// Why a server stub could not run a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DispatchError {
    /// No procedure has this number.
    UnknownProcedure,
    /// The arguments did not decode.
    BadArguments(DecodeError),
}

impl From<DecodeError> for DispatchError {
    fn from(e: DecodeError) -> Self {
        DispatchError::BadArguments(e)
    }
}

/// Where a server stub marshals results: straight into the buffer the result packet is sent from.
#[derive(Debug)]
pub struct Results<'r> {
    buf: &'r mut Vec<u8>,
    limit: usize,
}

impl<'r> Results<'r> {
    /// Results appended to `buf`, which may grow by at most `limit` bytes of buffers.
    pub fn new(buf: &'r mut Vec<u8>, limit: usize) -> Results<'r> {
        Results { buf, limit }
    }

    /// Most bytes the `Out` buffers of one call may ask for.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Reserves `N` regions for `Out` and `InOut` buffers, which the procedure fills in place: an
    /// `Out` buffer's zeroed, an `InOut` buffer's holding the bytes the call brought (written once,
    /// not zeroed first). Refuses (before allocating) regions larger than the limit.
    pub fn regions<const N: usize>(&mut self, regions: [Region<'_>; N]) -> Result<[&mut [u8]; N], DispatchError> {
        let lens = regions.map(|r| r.len());
        let total = lens.iter().try_fold(0usize, |a, &l| a.checked_add(l)).filter(|&t| t <= self.limit);
        let Some(total) = total else {
            return Err(DispatchError::BadArguments(DecodeError::BadLength(lens.iter().map(|&l| l as u64).sum())));
        };
        let start = self.buf.len();
        self.buf.reserve(total);
        for region in regions {
            match region {
                Region::Zeroed(len) => self.buf.resize(self.buf.len() + len, 0),
                Region::Filled(bytes) => self.buf.extend_from_slice(bytes),
            }
        }
        let mut rest = &mut self.buf[start..];
        Ok(lens.map(|len| {
            let (head, tail) = core::mem::take(&mut rest).split_at_mut(len);
            rest = tail;
            head
        }))
    }

    /// Appends a result value.
    pub fn encode<'de, T: Wire<'de>>(&mut self, value: &T) {
        value.encode(&mut Writer::copying(self.buf));
    }
}

/// A region of the results asked for by [`Results::regions`].
#[derive(Debug, Clone, Copy)]
pub enum Region<'a> {
    /// An `Out` buffer of this many bytes, zeroed.
    Zeroed(usize),
    /// An `InOut` buffer holding these bytes.
    Filled(&'a [u8]),
}

impl Region<'_> {
    fn len(&self) -> usize {
        match self {
            Region::Zeroed(len) => *len,
            Region::Filled(bytes) => bytes.len(),
        }
    }
}

/// An async procedure started: resolves to its marshaled results, or why it could not run.
pub type AsyncDispatch =
    core::pin::Pin<Box<dyn core::future::Future<Output = Result<Vec<u8>, DispatchError>> + Send + 'static>>;

/// The server side of an interface: generated as `<Trait>Server<T>` by `#[tiercel::interface]`.
pub trait Export: Send + Sync + 'static {
    /// The interface this exports.
    fn info(&self) -> &'static InterfaceInfo;

    /// Runs procedure `procedure` with marshaled `args`, marshaling its results into `results`.
    fn dispatch(&self, procedure: u16, args: &[u8], results: &mut Results<'_>) -> Result<(), DispatchError>;

    /// Whether procedure `procedure` can run where its arguments arrived
    /// ([`Export::dispatch_in_place`]): its one buffer is an `InOut`, and its last argument.
    fn in_place(&self, procedure: u16) -> bool {
        let _ = procedure;
        false
    }

    /// Runs procedure `procedure` (one that is [`Export::in_place`]) on the marshaled arguments in
    /// `message` from `start` on, whose last bytes are its `InOut` buffer: the procedure gets that
    /// buffer where it lies, and its return value is marshaled after it. Returns where the results
    /// (the buffer, then the return value) start in `message`, so that a server sends a large
    /// buffer back without copying it; the bytes before are left as they were.
    fn dispatch_in_place(&self, procedure: u16, message: &mut Vec<u8>, start: usize) -> Result<usize, DispatchError> {
        let _ = (procedure, message, start);
        Err(DispatchError::UnknownProcedure)
    }

    /// Whether procedure `procedure` is an `async fn`: the server runs it on its tokio runtime
    /// (crate feature `async`) through [`Export::dispatch_async`], not inline on a worker.
    fn is_async(&self, procedure: u16) -> bool {
        let _ = procedure;
        false
    }

    /// Starts async procedure `procedure` with marshaled `args` (owned: the procedure outlives the
    /// packet they came in), its results at most `limit` bytes of buffers. `None` when the procedure
    /// is not async. The future decodes the arguments, awaits the procedure and marshals its results.
    fn dispatch_async(
        self: std::sync::Arc<Self>,
        procedure: u16,
        args: Vec<u8>,
        limit: usize,
    ) -> Option<AsyncDispatch> {
        let _ = (procedure, args, limit);
        None
    }

    /// Whether any procedure is async (the server then needs a tokio runtime).
    fn has_async(&self) -> bool {
        (0..self.info().procedures.len()).any(|p| self.is_async(p as u16))
    }
}

/// The client side of an interface: generated as `<Trait>Client` by `#[tiercel::interface]`.
pub trait Import: Sized {
    /// The interface this imports.
    const INFO: &'static InterfaceInfo;

    /// Wraps a binding made for this interface.
    fn from_binding(binding: crate::Binding) -> Self;
}

/// Decoded form of an `Out`/`InOut` length sent by the client: bounded by what a result may carry.
pub fn out_len(r: &mut crate::wire::Reader<'_>, max: usize) -> Result<usize, DecodeError> {
    let n = u32::from_le_bytes(r.array()?) as usize;
    if n > max {
        return Err(DecodeError::BadLength(n as u64));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_and_distinct() {
        assert_eq!(interface_id(""), 0xcbf2_9ce4_8422_2325);
        assert_ne!(interface_id("Test"), interface_id("Tesu"));
        assert_eq!(interface_id("Test"), interface_id("Test"));
    }

    #[test]
    fn regions_split_the_result_buffer() {
        let mut buf = vec![1u8];
        let mut r = Results::new(&mut buf, 10);
        assert!(r.regions([Region::Zeroed(8), Region::Filled(&[1, 2, 3])]).is_err());
        let [a, b, c] = r.regions([Region::Zeroed(2), Region::Filled(&[4, 5]), Region::Zeroed(3)]).unwrap();
        a.copy_from_slice(&[7, 7]);
        b[0] += 1;
        c[2] = 9;
        r.encode(&5u16);
        assert_eq!(buf, vec![1, 7, 7, 5, 5, 0, 0, 9, 5, 0]);
    }
}
