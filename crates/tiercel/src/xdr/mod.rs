//! XDR (RFC 4506), the encoding of ONC RPC's arguments and results, for the types that travel in an
//! interface served over ONC ([`crate::onc`]).
//!
//! | Rust | XDR |
//! | --- | --- |
//! | `i32`, `u32` | `int`, `unsigned int` |
//! | `i64`, `u64` | `hyper`, `unsigned hyper` |
//! | `bool` | `bool` |
//! | `f32`, `f64` | `float`, `double` |
//! | `u8`, `i8`, `u16`, `i16` | `unsigned char`, `char`, `unsigned short`, `short` (rpcgen's: four bytes each) |
//! | `String`, `&str` | `string<>` |
//! | `Vec<u8>`, `&[u8]` | `opaque<>` (variable-length opaque data) |
//! | `[u8; N]` | `opaque[N]` (fixed-length opaque data) |
//! | `Vec<T>`, `[T; N]` | `T<>`, `T[N]` (variable and fixed arrays) |
//! | `Option<T>`, `Option<Box<T>>` | `T *` (optional data) |
//! | a struct with `#[derive(tiercel::Xdr)]` | `struct` |
//! | an enum of unit variants with `#[derive(tiercel::Xdr)]` | `enum` |
//! | an enum with data with `#[derive(tiercel::Xdr)]` | `union switch (int kind)`, one arm per variant |
//!
//! Decoding borrows strings and opaque data from the message where the type borrows (`&str`,
//! `&[u8]`), and bounds every length by the bytes that are there, so a message never makes the
//! decoder reserve more than it carries. [`XFile`] writes the `.x` file of the types an interface
//! uses, for `rpcgen`.

use std::collections::HashSet;
use std::fmt::Write as _;

/// Why bytes are not a value of the type expected: the call's arguments are garbage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XdrError(pub &'static str);

impl std::fmt::Display for XdrError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "not XDR of the type expected: {}", self.0)
    }
}

impl std::error::Error for XdrError {}

/// Reads XDR from a message, bounding every length by what is left of it, and the nesting of
/// boxes and arrays by [`crate::wire::MAX_DEPTH`] (so that a recursive type cannot take the stack).
#[derive(Debug)]
pub struct XdrReader<'de> {
    buf: &'de [u8],
    depth: u32,
}

impl<'de> XdrReader<'de> {
    /// A reader of `buf`.
    pub fn new(buf: &'de [u8]) -> XdrReader<'de> {
        XdrReader { buf, depth: 0 }
    }

    /// Decodes with `f` one level deeper; fails past [`crate::wire::MAX_DEPTH`]. Used by `Box` and
    /// `Vec`, the ways a type reaches itself.
    pub fn nested<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T, XdrError>) -> Result<T, XdrError> {
        if self.depth >= crate::wire::MAX_DEPTH {
            return Err(XdrError("values nested too deeply"));
        }
        self.depth += 1;
        let value = f(self);
        self.depth -= 1;
        value
    }

    /// A value of type `T`.
    pub fn decode<T: Xdr<'de>>(&mut self) -> Result<T, XdrError> {
        T::decode(self)
    }

    /// Fails unless every byte was read.
    pub fn finish(&self) -> Result<(), XdrError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(XdrError("bytes left after the last value"))
        }
    }

    /// Bytes not yet read.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    /// One 32-bit word.
    pub fn u32(&mut self) -> Result<u32, XdrError> {
        let (word, rest) = self.buf.split_first_chunk::<4>().ok_or(XdrError("a word cut short"))?;
        self.buf = rest;
        Ok(u32::from_be_bytes(*word))
    }

    /// `n` bytes and their padding to a multiple of four.
    pub fn fixed(&mut self, n: usize) -> Result<&'de [u8], XdrError> {
        let padded = n.checked_add(3).ok_or(XdrError("a length past the message"))? & !3;
        if padded > self.buf.len() {
            return Err(XdrError("opaque data cut short"));
        }
        let (bytes, rest) = self.buf.split_at(padded);
        if bytes[n..].iter().any(|&b| b != 0) {
            return Err(XdrError("padding that is not zero"));
        }
        self.buf = rest;
        Ok(&bytes[..n])
    }

    /// Variable-length opaque data: its length, then its bytes.
    pub fn opaque(&mut self) -> Result<&'de [u8], XdrError> {
        let len = self.u32()? as usize;
        self.fixed(len)
    }

    /// The count of a variable-length array, bounded by the bytes left (every XDR item takes four
    /// bytes or more, so an array of empty structs is refused past that bound).
    pub fn count(&mut self) -> Result<usize, XdrError> {
        let n = self.u32()? as usize;
        if n > self.buf.len() / 4 {
            return Err(XdrError("an array longer than the message"));
        }
        Ok(n)
    }
}

/// Appends the XDR of values to a buffer.
pub fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_be_bytes());
}

/// Appends `bytes` as fixed-length opaque data: the bytes and their zero padding.
pub fn put_fixed(out: &mut Vec<u8>, bytes: &[u8]) {
    tiercel_proto::copy::extend(out, bytes);
    out.resize(out.len() + (4 - bytes.len() % 4) % 4, 0);
}

/// Appends `bytes` as variable-length opaque data.
pub fn put_opaque(out: &mut Vec<u8>, bytes: &[u8]) {
    put_u32(out, bytes.len() as u32);
    put_fixed(out, bytes);
}

/// How a declaration of a type reads in a `.x` file: `spec name`, `spec name[N]`, `spec name<>`
/// or `spec *name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XType {
    /// The type specifier: `int`, `opaque`, `string`, or a defined name.
    pub spec: String,
    /// How the name is declared with it.
    pub form: Form,
}

/// The declarator of an [`XType`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// `spec name`.
    Plain,
    /// `spec name[N]`.
    Fixed(usize),
    /// `spec name<>`.
    Variable,
    /// `spec *name`.
    Optional,
}

impl XType {
    /// A type named `spec`, declared plainly.
    pub fn plain(spec: impl Into<String>) -> XType {
        XType { spec: spec.into(), form: Form::Plain }
    }

    /// The declaration of `name` of this type (without the `;`).
    pub fn declare(&self, name: &str) -> String {
        match self.form {
            Form::Plain => format!("{} {name}", self.spec),
            Form::Fixed(n) => format!("{} {name}[{n}]", self.spec),
            Form::Variable => format!("{} {name}<>", self.spec),
            Form::Optional => format!("{} *{name}", self.spec),
        }
    }
}

/// The definitions of a `.x` file, in the order they must come (each after those it uses).
#[derive(Debug, Default)]
pub struct XFile {
    text: String,
    named: HashSet<String>,
}

impl XFile {
    /// An empty file.
    pub fn new() -> XFile {
        XFile::default()
    }

    /// Whether `name` is defined or being defined; marks it so either way (so that a type that
    /// reaches itself through `Option<Box<_>>` is defined once).
    pub fn claim(&mut self, name: &str) -> bool {
        !self.named.insert(name.to_string())
    }

    /// Appends a definition (`struct …;`, `enum …;`, `union …;`, `typedef …;`).
    pub fn define(&mut self, text: &str) {
        self.text.push_str(text);
        self.text.push('\n');
    }

    /// A type specifier standing for `t` where only a specifier may stand (an array's element, a
    /// procedure's argument or result): `t`'s own when it is plain, else a `typedef` made for it.
    pub fn specifier(&mut self, t: &XType) -> String {
        if t.form == Form::Plain {
            return t.spec.clone();
        }
        let base = t.spec.replace(' ', "_");
        let name = match t.form {
            Form::Plain => unreachable!("handled above"),
            Form::Fixed(n) => format!("{base}_{n}"),
            Form::Variable if t.spec == "opaque" => "octets".to_string(),
            Form::Variable if t.spec == "string" => "text".to_string(),
            Form::Variable => format!("{base}_list"),
            Form::Optional => format!("{base}_ptr"),
        };
        if !self.claim(&name) {
            let decl = t.declare(&name);
            self.define(&format!("typedef {decl};"));
        }
        name
    }

    /// The file's text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Appends text as it is (a program definition).
    pub fn push(&mut self, text: &str) {
        let _ = write!(self.text, "{text}");
    }
}

/// A type with an XDR encoding. `#[derive(tiercel::Xdr)]` writes it for structs and enums.
pub trait Xdr<'de>: Sized {
    /// Appends the encoding of `self`.
    fn encode(&self, out: &mut Vec<u8>);

    /// Decodes a value, borrowing from the message where the type borrows.
    fn decode(r: &mut XdrReader<'de>) -> Result<Self, XdrError>;

    /// How the type is declared in a `.x` file, defining in `file` what it needs first.
    fn xdr_type(file: &mut XFile) -> XType;

    /// Encodes a variable-length array of values; `u8` overrides this as opaque data.
    #[doc(hidden)]
    fn encode_list(items: &[Self], out: &mut Vec<u8>) {
        put_u32(out, items.len() as u32);
        for item in items {
            item.encode(out);
        }
    }

    /// Decodes a variable-length array; `u8` overrides this as opaque data.
    #[doc(hidden)]
    fn decode_list(r: &mut XdrReader<'de>) -> Result<Vec<Self>, XdrError> {
        let n = r.count()?;
        r.nested(|r| {
            let mut items = Vec::with_capacity(n);
            for _ in 0..n {
                items.push(Self::decode(r)?);
            }
            Ok(items)
        })
    }

    /// Encodes a fixed array's values; `u8` overrides this as fixed opaque data.
    #[doc(hidden)]
    fn encode_array(items: &[Self], out: &mut Vec<u8>) {
        for item in items {
            item.encode(out);
        }
    }

    /// Decodes a fixed array; `u8` overrides this as fixed opaque data.
    #[doc(hidden)]
    fn decode_array<const N: usize>(r: &mut XdrReader<'de>) -> Result<[Self; N], XdrError> {
        let mut items = Vec::with_capacity(N.min(r.remaining() / 4));
        for _ in 0..N {
            items.push(Self::decode(r)?);
        }
        items.try_into().map_err(|_| XdrError("a fixed array cut short"))
    }

    /// The declaration of an array of the type: `T<>`, or `opaque<>` for `u8`.
    #[doc(hidden)]
    fn list_type(file: &mut XFile, fixed: Option<usize>) -> XType {
        let element = Self::xdr_type(file);
        let spec = file.specifier(&element);
        XType { spec, form: fixed.map_or(Form::Variable, Form::Fixed) }
    }
}

macro_rules! word {
    ($t:ty, $x:literal, $to:ident, $from:expr) => {
        impl<'de> Xdr<'de> for $t {
            fn encode(&self, out: &mut Vec<u8>) {
                #[allow(clippy::unnecessary_cast)]
                put_u32(out, *self as $to as u32);
            }
            fn decode(r: &mut XdrReader<'de>) -> Result<Self, XdrError> {
                let w = r.u32()?;
                #[allow(clippy::redundant_closure_call)]
                ($from)(w).ok_or(XdrError(concat!("a value out of range of ", stringify!($t))))
            }
            fn xdr_type(_: &mut XFile) -> XType {
                XType::plain($x)
            }
        }
    };
}

word!(u32, "unsigned int", u32, Some);
word!(i32, "int", i32, |w: u32| Some(w as i32));
word!(u16, "unsigned short", u32, |w: u32| u16::try_from(w).ok());
word!(i16, "short", i32, |w: u32| i16::try_from(w as i32).ok());
word!(i8, "char", i32, |w: u32| i8::try_from(w as i32).ok());

impl<'de> Xdr<'de> for u8 {
    fn encode(&self, out: &mut Vec<u8>) {
        put_u32(out, u32::from(*self));
    }
    fn decode(r: &mut XdrReader<'de>) -> Result<Self, XdrError> {
        u8::try_from(r.u32()?).map_err(|_| XdrError("a value out of range of u8"))
    }
    fn xdr_type(_: &mut XFile) -> XType {
        XType::plain("unsigned char")
    }
    fn encode_list(items: &[Self], out: &mut Vec<u8>) {
        put_opaque(out, items);
    }
    fn decode_list(r: &mut XdrReader<'de>) -> Result<Vec<Self>, XdrError> {
        Ok(r.opaque()?.to_vec())
    }
    fn encode_array(items: &[Self], out: &mut Vec<u8>) {
        put_fixed(out, items);
    }
    fn decode_array<const N: usize>(r: &mut XdrReader<'de>) -> Result<[Self; N], XdrError> {
        let bytes = r.fixed(N)?;
        bytes.try_into().map_err(|_| XdrError("fixed opaque data cut short"))
    }
    fn list_type(_: &mut XFile, fixed: Option<usize>) -> XType {
        XType { spec: "opaque".into(), form: fixed.map_or(Form::Variable, Form::Fixed) }
    }
}

impl<'de> Xdr<'de> for bool {
    fn encode(&self, out: &mut Vec<u8>) {
        put_u32(out, u32::from(*self));
    }
    fn decode(r: &mut XdrReader<'de>) -> Result<Self, XdrError> {
        match r.u32()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(XdrError("a bool neither 0 nor 1")),
        }
    }
    fn xdr_type(_: &mut XFile) -> XType {
        XType::plain("bool")
    }
}

macro_rules! hyper {
    ($t:ty, $x:literal) => {
        impl<'de> Xdr<'de> for $t {
            fn encode(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_be_bytes());
            }
            fn decode(r: &mut XdrReader<'de>) -> Result<Self, XdrError> {
                let high = u64::from(r.u32()?);
                let low = u64::from(r.u32()?);
                Ok(<$t>::from_be_bytes(((high << 32) | low).to_be_bytes()))
            }
            fn xdr_type(_: &mut XFile) -> XType {
                XType::plain($x)
            }
        }
    };
}

hyper!(u64, "unsigned hyper");
hyper!(i64, "hyper");
hyper!(f64, "double");

impl<'de> Xdr<'de> for f32 {
    fn encode(&self, out: &mut Vec<u8>) {
        put_u32(out, self.to_bits());
    }
    fn decode(r: &mut XdrReader<'de>) -> Result<Self, XdrError> {
        Ok(f32::from_bits(r.u32()?))
    }
    fn xdr_type(_: &mut XFile) -> XType {
        XType::plain("float")
    }
}

impl<'de> Xdr<'de> for String {
    fn encode(&self, out: &mut Vec<u8>) {
        put_opaque(out, self.as_bytes());
    }
    fn decode(r: &mut XdrReader<'de>) -> Result<Self, XdrError> {
        <&str>::decode(r).map(str::to_string)
    }
    fn xdr_type(_: &mut XFile) -> XType {
        XType { spec: "string".into(), form: Form::Variable }
    }
}

impl<'de> Xdr<'de> for &'de str {
    fn encode(&self, out: &mut Vec<u8>) {
        put_opaque(out, self.as_bytes());
    }
    fn decode(r: &mut XdrReader<'de>) -> Result<Self, XdrError> {
        std::str::from_utf8(r.opaque()?).map_err(|_| XdrError("a string that is not UTF-8"))
    }
    fn xdr_type(_: &mut XFile) -> XType {
        XType { spec: "string".into(), form: Form::Variable }
    }
}

impl<'de> Xdr<'de> for &'de [u8] {
    fn encode(&self, out: &mut Vec<u8>) {
        put_opaque(out, self);
    }
    fn decode(r: &mut XdrReader<'de>) -> Result<Self, XdrError> {
        r.opaque()
    }
    fn xdr_type(_: &mut XFile) -> XType {
        XType { spec: "opaque".into(), form: Form::Variable }
    }
}

impl<'de, T: Xdr<'de>> Xdr<'de> for Vec<T> {
    fn encode(&self, out: &mut Vec<u8>) {
        T::encode_list(self, out);
    }
    fn decode(r: &mut XdrReader<'de>) -> Result<Self, XdrError> {
        T::decode_list(r)
    }
    fn xdr_type(file: &mut XFile) -> XType {
        T::list_type(file, None)
    }
}

impl<'de, T: Xdr<'de>, const N: usize> Xdr<'de> for [T; N] {
    fn encode(&self, out: &mut Vec<u8>) {
        T::encode_array(self, out);
    }
    fn decode(r: &mut XdrReader<'de>) -> Result<Self, XdrError> {
        T::decode_array::<N>(r)
    }
    fn xdr_type(file: &mut XFile) -> XType {
        T::list_type(file, Some(N))
    }
}

impl<'de, T: Xdr<'de>> Xdr<'de> for Option<T> {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            None => put_u32(out, 0),
            Some(v) => {
                put_u32(out, 1);
                v.encode(out);
            }
        }
    }
    fn decode(r: &mut XdrReader<'de>) -> Result<Self, XdrError> {
        match r.u32()? {
            0 => Ok(None),
            1 => T::decode(r).map(Some),
            _ => Err(XdrError("optional data neither 0 nor 1")),
        }
    }
    fn xdr_type(file: &mut XFile) -> XType {
        let inner = T::xdr_type(file);
        XType { spec: file.specifier(&inner), form: Form::Optional }
    }
}

impl<'de, T: Xdr<'de>> Xdr<'de> for Box<T> {
    fn encode(&self, out: &mut Vec<u8>) {
        (**self).encode(out);
    }
    fn decode(r: &mut XdrReader<'de>) -> Result<Self, XdrError> {
        r.nested(|r| T::decode(r).map(Box::new))
    }
    fn xdr_type(file: &mut XFile) -> XType {
        T::xdr_type(file)
    }
}

impl<'de> Xdr<'de> for () {
    fn encode(&self, _: &mut Vec<u8>) {}
    fn decode(_: &mut XdrReader<'de>) -> Result<Self, XdrError> {
        Ok(())
    }
    fn xdr_type(_: &mut XFile) -> XType {
        XType::plain("void")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<T: for<'a> Xdr<'a> + PartialEq + std::fmt::Debug>(v: T, bytes: &[u8]) {
        let mut out = Vec::new();
        v.encode(&mut out);
        assert_eq!(out, bytes, "{v:?}");
        let mut r = XdrReader::new(&out);
        assert_eq!(T::decode(&mut r).unwrap(), v);
        r.finish().unwrap();
        for cut in 0..out.len() {
            assert!(T::decode(&mut XdrReader::new(&out[..cut])).is_err(), "{v:?} cut at {cut} decoded");
        }
    }

    #[test]
    fn values_encode_as_rfc_4506_says_and_decode_back() {
        round_trip(-2i32, &[0xff, 0xff, 0xff, 0xfe]);
        round_trip(7u32, &[0, 0, 0, 7]);
        round_trip(true, &[0, 0, 0, 1]);
        round_trip(0x0102_0304_0506_0708u64, &[1, 2, 3, 4, 5, 6, 7, 8]);
        round_trip(-1i64, &[0xff; 8]);
        round_trip(1.5f64, &1.5f64.to_be_bytes());
        round_trip(1.5f32, &1.5f32.to_be_bytes());
        round_trip(200u8, &[0, 0, 0, 200]);
        round_trip(-3i16, &[0xff, 0xff, 0xff, 0xfd]);
        round_trip(String::from("hello"), &[0, 0, 0, 5, b'h', b'e', b'l', b'l', b'o', 0, 0, 0]);
        round_trip(vec![1u8, 2, 3], &[0, 0, 0, 3, 1, 2, 3, 0]);
        round_trip([9u8; 5], &[9, 9, 9, 9, 9, 0, 0, 0]);
        round_trip(vec![1u32, 2], &[0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 2]);
        round_trip([3i32; 2], &[0, 0, 0, 3, 0, 0, 0, 3]);
        round_trip(Some(5u32), &[0, 0, 0, 1, 0, 0, 0, 5]);
        round_trip(None::<u32>, &[0, 0, 0, 0]);
        round_trip(vec![String::from("a")], &[0, 0, 0, 1, 0, 0, 0, 1, b'a', 0, 0, 0]);
    }

    #[test]
    fn lengths_past_the_message_bad_padding_and_out_of_range_words_are_garbage() {
        let huge = [0x7f, 0xff, 0xff, 0xff, 1, 2, 3, 4];
        assert!(Vec::<u8>::decode(&mut XdrReader::new(&huge)).is_err());
        assert!(Vec::<u64>::decode(&mut XdrReader::new(&huge)).is_err());
        assert!(String::decode(&mut XdrReader::new(&[0, 0, 0, 1, b'a', 1, 0, 0])).is_err(), "padding not zero");
        assert!(String::decode(&mut XdrReader::new(&[0, 0, 0, 1, 0xff, 0, 0, 0])).is_err(), "not UTF-8");
        assert!(bool::decode(&mut XdrReader::new(&[0, 0, 0, 2])).is_err());
        assert!(u8::decode(&mut XdrReader::new(&[0, 0, 1, 0])).is_err());
        assert!(Option::<u32>::decode(&mut XdrReader::new(&[0, 0, 0, 2, 0, 0, 0, 0])).is_err());
    }

    #[derive(Debug, PartialEq)]
    struct Node(u32, Option<Box<Node>>);

    impl<'de> Xdr<'de> for Node {
        fn encode(&self, out: &mut Vec<u8>) {
            self.0.encode(out);
            self.1.encode(out);
        }
        fn decode(r: &mut XdrReader<'de>) -> Result<Self, XdrError> {
            Ok(Node(r.decode()?, r.decode()?))
        }
        fn xdr_type(_: &mut XFile) -> XType {
            XType::plain("Node")
        }
    }

    #[test]
    fn recursion_is_bounded_by_depth_not_by_the_stack() {
        // A million nodes each followed by another: refused, not a stack overflow.
        let deep: Vec<u8> = [0u8, 0, 0, 7, 0, 0, 0, 1].repeat(1_000_000);
        assert_eq!(Node::decode(&mut XdrReader::new(&deep)), Err(XdrError("values nested too deeply")));
        let shallow: Vec<u8> = [[0u8, 0, 0, 7, 0, 0, 0, 1].repeat(100), vec![0, 0, 0, 7, 0, 0, 0, 0]].concat();
        assert!(Node::decode(&mut XdrReader::new(&shallow)).is_ok());
    }

    #[test]
    fn borrowed_strings_and_bytes_are_read_where_they_lie() {
        let msg = [0, 0, 0, 2, b'h', b'i', 0, 0];
        let s: &str = XdrReader::new(&msg).decode().unwrap();
        assert_eq!(s.as_ptr(), msg[4..].as_ptr());
        let b: &[u8] = XdrReader::new(&msg).decode().unwrap();
        assert_eq!(b, b"hi");
    }

    #[test]
    fn types_that_cannot_stand_alone_in_a_declaration_get_a_typedef() {
        let mut file = XFile::new();
        let t = <Vec<Vec<u32>>>::xdr_type(&mut file);
        assert_eq!(t.declare("x"), "unsigned_int_list x<>");
        assert_eq!(file.text(), "typedef unsigned int unsigned_int_list<>;\n");
        let t = <Option<Vec<u8>>>::xdr_type(&mut file);
        assert_eq!(t.declare("y"), "octets *y");
        assert_eq!(<[u8; 16]>::xdr_type(&mut file).declare("z"), "opaque z[16]");
        assert!(file.text().contains("typedef opaque octets<>;"));
    }
}
