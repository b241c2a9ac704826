//! [`Wire`] for the standard types.

use super::shape::Shape;
use super::{DecodeError, Reader, Wire, Writer};

macro_rules! number {
    ($($t:ty),*) => {$(
        impl<'de> Wire<'de> for $t {
            #[inline]
            fn encode<'a>(&'a self, w: &mut Writer<'_, 'a>) {
                w.put(&self.to_le_bytes());
            }
            #[inline]
            fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
                Ok(<$t>::from_le_bytes(r.array()?))
            }
            fn shape(s: &mut Shape<'_>) {
                s.write(stringify!($t));
            }
        }
    )*};
}
number!(i8, i16, i32, i64, i128, u16, u32, u64, u128, f32, f64);

impl<'de> Wire<'de> for u8 {
    #[inline]
    fn encode<'a>(&'a self, w: &mut Writer<'_, 'a>) {
        w.put(&[*self]);
    }
    #[inline]
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        Ok(r.array::<1>()?[0])
    }
    fn encode_slice<'a>(items: &'a [u8], w: &mut Writer<'_, 'a>) {
        w.put_borrowed(items);
    }
    fn decode_vec(r: &mut Reader<'de>, n: usize) -> Result<Vec<u8>, DecodeError> {
        Ok(tiercel_proto::copy::to_vec(r.take(n)?))
    }
    fn decode_array<const N: usize>(r: &mut Reader<'de>) -> Result<[u8; N], DecodeError> {
        r.array::<N>()
    }
    fn shape(s: &mut Shape<'_>) {
        s.write("u8");
    }
}

impl<'de> Wire<'de> for usize {
    fn encode<'a>(&'a self, w: &mut Writer<'_, 'a>) {
        w.put(&(*self as u64).to_le_bytes());
    }
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        usize::try_from(u64::from_le_bytes(r.array()?)).map_err(|_| DecodeError::Invalid("usize"))
    }
    fn shape(s: &mut Shape<'_>) {
        s.write("u64");
    }
}

impl<'de> Wire<'de> for isize {
    fn encode<'a>(&'a self, w: &mut Writer<'_, 'a>) {
        w.put(&(*self as i64).to_le_bytes());
    }
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        isize::try_from(i64::from_le_bytes(r.array()?)).map_err(|_| DecodeError::Invalid("isize"))
    }
    fn shape(s: &mut Shape<'_>) {
        s.write("i64");
    }
}

impl<'de> Wire<'de> for bool {
    #[inline]
    fn encode<'a>(&'a self, w: &mut Writer<'_, 'a>) {
        w.put(&[*self as u8]);
    }
    #[inline]
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        match r.array::<1>()?[0] {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError::Invalid("bool")),
        }
    }
    fn shape(s: &mut Shape<'_>) {
        s.write("bool");
    }
}

impl<'de> Wire<'de> for char {
    fn encode<'a>(&'a self, w: &mut Writer<'_, 'a>) {
        w.put(&u32::from(*self).to_le_bytes());
    }
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        char::from_u32(u32::from_le_bytes(r.array()?)).ok_or(DecodeError::Invalid("char"))
    }
    fn shape(s: &mut Shape<'_>) {
        s.write("char");
    }
}

impl<'de> Wire<'de> for () {
    #[inline]
    fn encode<'a>(&'a self, _: &mut Writer<'_, 'a>) {}
    #[inline]
    fn decode(_: &mut Reader<'de>) -> Result<Self, DecodeError> {
        Ok(())
    }
    fn shape(s: &mut Shape<'_>) {
        s.write("()");
    }
}

impl<'de: 'b, 'b> Wire<'de> for &'b [u8] {
    #[inline]
    fn encode<'a>(&'a self, w: &mut Writer<'_, 'a>) {
        w.put_len(self.len());
        w.put_borrowed(self);
    }
    #[inline]
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        let n = r.len_prefix(1)?;
        r.take(n)
    }
    fn shape(s: &mut Shape<'_>) {
        s.write("Vec<u8>");
    }
}

impl<'de: 'b, 'b> Wire<'de> for &'b str {
    fn encode<'a>(&'a self, w: &mut Writer<'_, 'a>) {
        w.put_len(self.len());
        w.put_borrowed(self.as_bytes());
    }
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        let n = r.len_prefix(1)?;
        core::str::from_utf8(r.take(n)?).map_err(|_| DecodeError::Utf8)
    }
    fn shape(s: &mut Shape<'_>) {
        s.write("String");
    }
}

impl<'de> Wire<'de> for String {
    fn encode<'a>(&'a self, w: &mut Writer<'_, 'a>) {
        w.put_len(self.len());
        w.put_borrowed(self.as_bytes());
    }
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        <&str>::decode(r).map(str::to_owned)
    }
    fn shape(s: &mut Shape<'_>) {
        s.write("String");
    }
}

impl<'de, T: Wire<'de>> Wire<'de> for Vec<T> {
    fn encode<'a>(&'a self, w: &mut Writer<'_, 'a>) {
        w.put_len(self.len());
        T::encode_slice(self, w);
    }
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        let n = r.len_prefix(1)?;
        r.nested(|r| T::decode_vec(r, n))
    }
    fn shape(s: &mut Shape<'_>) {
        s.write("Vec<");
        s.of::<T>();
        s.write(">");
    }
}

/// Checks that `n` entries of `size` bytes each fit in `MAX_EXPANSION` times the bytes left (as
/// for a vector), and how many to reserve room for up front.
fn collection_len(r: &Reader<'_>, n: usize, size: usize) -> Result<usize, DecodeError> {
    if n.saturating_mul(size) > r.remaining().saturating_mul(super::MAX_EXPANSION).max(1 << 20) {
        return Err(DecodeError::BadLength(n as u64));
    }
    Ok(n.min(r.remaining().max(4096) / size.max(1)))
}

/// Maps travel as a length and then their entries, key then value, in the map's iteration order.
fn encode_map<'a, 'de, K: Wire<'de> + 'a, V: Wire<'de> + 'a>(
    w: &mut Writer<'_, 'a>,
    len: usize,
    entries: impl Iterator<Item = (&'a K, &'a V)>,
) {
    w.put_len(len);
    for (k, v) in entries {
        k.encode(w);
        v.encode(w);
    }
}

/// Decodes a map's entries into `new(reserve)` with `insert` (false when the key was there: a key
/// given twice is refused, as `what`).
fn decode_map<'de, K: Wire<'de>, V: Wire<'de>, M>(
    r: &mut Reader<'de>,
    what: &'static str,
    new: impl FnOnce(usize) -> M,
    mut insert: impl FnMut(&mut M, K, V) -> bool,
) -> Result<M, DecodeError> {
    let n = r.len_prefix(1)?;
    let reserve = collection_len(r, n, core::mem::size_of::<(K, V)>())?;
    r.nested(|r| {
        let mut m = new(reserve);
        for _ in 0..n {
            let k = K::decode(r)?;
            let v = V::decode(r)?;
            if !insert(&mut m, k, v) {
                return Err(DecodeError::Invalid(what));
            }
        }
        Ok(m)
    })
}

/// Sets travel as a length and then their elements, in the set's iteration order.
fn encode_set<'a, 'de, T: Wire<'de> + 'a>(w: &mut Writer<'_, 'a>, len: usize, items: impl Iterator<Item = &'a T>) {
    w.put_len(len);
    for v in items {
        v.encode(w);
    }
}

/// Decodes a set's elements into `new(reserve)` with `insert` (false for an element given twice,
/// refused as `what`).
fn decode_set<'de, T: Wire<'de>, S>(
    r: &mut Reader<'de>,
    what: &'static str,
    new: impl FnOnce(usize) -> S,
    mut insert: impl FnMut(&mut S, T) -> bool,
) -> Result<S, DecodeError> {
    decode_map(r, what, new, |s, t: T, ()| insert(s, t))
}

impl<'de, K: Wire<'de> + Eq + std::hash::Hash, V: Wire<'de>, S: std::hash::BuildHasher + Default> Wire<'de>
    for std::collections::HashMap<K, V, S>
{
    fn encode<'a>(&'a self, w: &mut Writer<'_, 'a>) {
        encode_map(w, self.len(), self.iter());
    }
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        let new = |n| Self::with_capacity_and_hasher(n, S::default());
        decode_map(r, "HashMap key given twice", new, |m, k, v| m.insert(k, v).is_none())
    }
    fn shape(s: &mut Shape<'_>) {
        map_shape::<K, V>(s);
    }
}

impl<'de, K: Wire<'de> + Ord, V: Wire<'de>> Wire<'de> for std::collections::BTreeMap<K, V> {
    fn encode<'a>(&'a self, w: &mut Writer<'_, 'a>) {
        encode_map(w, self.len(), self.iter());
    }
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        decode_map(r, "BTreeMap key given twice", |_| Self::new(), |m, k, v| m.insert(k, v).is_none())
    }
    fn shape(s: &mut Shape<'_>) {
        map_shape::<K, V>(s);
    }
}

impl<'de, T: Wire<'de> + Eq + std::hash::Hash, S: std::hash::BuildHasher + Default> Wire<'de>
    for std::collections::HashSet<T, S>
{
    fn encode<'a>(&'a self, w: &mut Writer<'_, 'a>) {
        encode_set(w, self.len(), self.iter());
    }
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        let new = |n| Self::with_capacity_and_hasher(n, S::default());
        decode_set(r, "HashSet element given twice", new, |s, t| s.insert(t))
    }
    fn shape(s: &mut Shape<'_>) {
        set_shape::<T>(s);
    }
}

impl<'de, T: Wire<'de> + Ord> Wire<'de> for std::collections::BTreeSet<T> {
    fn encode<'a>(&'a self, w: &mut Writer<'_, 'a>) {
        encode_set(w, self.len(), self.iter());
    }
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        decode_set(r, "BTreeSet element given twice", |_| Self::new(), |s, t| s.insert(t))
    }
    fn shape(s: &mut Shape<'_>) {
        set_shape::<T>(s);
    }
}

impl<'de, T: Wire<'de>> Wire<'de> for Box<T> {
    fn encode<'a>(&'a self, w: &mut Writer<'_, 'a>) {
        (**self).encode(w);
    }
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        r.nested(|r| T::decode(r).map(Box::new))
    }
    fn shape(s: &mut Shape<'_>) {
        s.of::<T>();
    }
}

impl<'de, T: Wire<'de>> Wire<'de> for Option<T> {
    fn encode<'a>(&'a self, w: &mut Writer<'_, 'a>) {
        match self {
            None => w.put(&[0]),
            Some(v) => {
                w.put(&[1]);
                v.encode(w);
            }
        }
    }
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        match r.array::<1>()?[0] {
            0 => Ok(None),
            1 => T::decode(r).map(Some),
            _ => Err(DecodeError::Invalid("Option")),
        }
    }
    fn shape(s: &mut Shape<'_>) {
        s.write("Option<");
        s.of::<T>();
        s.write(">");
    }
}

impl<'de, T: Wire<'de>, E: Wire<'de>> Wire<'de> for Result<T, E> {
    fn encode<'a>(&'a self, w: &mut Writer<'_, 'a>) {
        match self {
            Ok(v) => {
                w.put(&[0]);
                v.encode(w);
            }
            Err(e) => {
                w.put(&[1]);
                e.encode(w);
            }
        }
    }
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        match r.array::<1>()?[0] {
            0 => T::decode(r).map(Ok),
            1 => E::decode(r).map(Err),
            _ => Err(DecodeError::Invalid("Result")),
        }
    }
    fn shape(s: &mut Shape<'_>) {
        s.write("Result<");
        s.of::<T>();
        s.write(", ");
        s.of::<E>();
        s.write(">");
    }
}

impl<'de, T: Wire<'de>, const N: usize> Wire<'de> for [T; N] {
    fn encode<'a>(&'a self, w: &mut Writer<'_, 'a>) {
        T::encode_slice(self, w);
    }
    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        T::decode_array::<N>(r)
    }
    fn shape(s: &mut Shape<'_>) {
        s.write("[");
        s.of::<T>();
        s.write(&format!("; {N}]"));
    }
}

macro_rules! tuple {
    ($($name:ident),+) => {
        impl<'de, $($name: Wire<'de>),+> Wire<'de> for ($($name,)+) {
            #[allow(non_snake_case)]
            fn encode<'a>(&'a self, w: &mut Writer<'_, 'a>) {
                let ($($name,)+) = self;
                $($name.encode(w);)+
            }
            fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
                Ok(($($name::decode(r)?,)+))
            }
            fn shape(s: &mut Shape<'_>) {
                let mut items = 0;
                s.write("(");
                $(
                    if items > 0 {
                        s.write(", ");
                    }
                    s.of::<$name>();
                    items += 1;
                )+
                s.write(if items == 1 { ",)" } else { ")" });
            }
        }
    };
}
tuple!(A);
tuple!(A, B);
tuple!(A, B, C);
tuple!(A, B, C, D);
tuple!(A, B, C, D, E);
tuple!(A, B, C, D, E, F);
tuple!(A, B, C, D, E, F, G);
tuple!(A, B, C, D, E, F, G, H);

fn map_shape<'de, K: Wire<'de>, V: Wire<'de>>(s: &mut Shape<'_>) {
    s.write("Map<");
    s.of::<K>();
    s.write(", ");
    s.of::<V>();
    s.write(">");
}

fn set_shape<'de, T: Wire<'de>>(s: &mut Shape<'_>) {
    s.write("Set<");
    s.of::<T>();
    s.write(">");
}

#[cfg(test)]
mod tests {
    use super::super::{from_slice, to_vec, DecodeError, Reader, Segments, Writer};
    use proptest::prelude::*;
    use std::io::IoSlice;

    #[test]
    fn layout_is_fixed_little_endian() {
        assert_eq!(to_vec(&0x0102_0304i32), vec![4, 3, 2, 1]);
        assert_eq!(to_vec(&(true, 7u8)), vec![1, 7]);
        assert_eq!(to_vec(&"hi"), vec![2, 0, 0, 0, b'h', b'i']);
        assert_eq!(to_vec(&Some(1u16)), vec![1, 1, 0]);
        assert_eq!(to_vec(&[1u8, 2, 3]), vec![1, 2, 3]);
    }

    #[test]
    fn borrowed_slices_point_into_the_message() {
        let msg = to_vec(&(&b"abc"[..], "xyz"));
        let (a, s): (&[u8], &str) = from_slice(&msg).unwrap();
        assert_eq!((a, s), (&b"abc"[..], "xyz"));
        assert!(msg.as_ptr_range().contains(&a.as_ptr()));
    }

    #[test]
    fn maps_and_sets_round_trip_and_refuse_repeated_keys() {
        use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
        let h: HashMap<String, u32> = [("a".to_string(), 1), ("b".to_string(), 2)].into();
        assert_eq!(from_slice::<HashMap<String, u32>>(&to_vec(&h)).unwrap(), h);
        let b: BTreeMap<u8, Vec<u16>> = [(1, vec![1, 2]), (9, vec![])].into();
        assert_eq!(from_slice::<BTreeMap<u8, Vec<u16>>>(&to_vec(&b)).unwrap(), b);
        let hs: HashSet<i64> = [-1, 5, 7].into();
        assert_eq!(from_slice::<HashSet<i64>>(&to_vec(&hs)).unwrap(), hs);
        let bs: BTreeSet<char> = ['x', 'y'].into();
        assert_eq!(from_slice::<BTreeSet<char>>(&to_vec(&bs)).unwrap(), bs);
        // Two entries with the same key: a peer's lie, not a map.
        let twice = to_vec(&vec![(1u8, 2u8), (1, 3)]);
        assert!(matches!(from_slice::<BTreeMap<u8, u8>>(&twice), Err(DecodeError::Invalid(_))));
        assert!(matches!(from_slice::<HashMap<u8, u8>>(&twice), Err(DecodeError::Invalid(_))));
        let twice = to_vec(&vec![4u32, 4]);
        assert!(matches!(from_slice::<HashSet<u32>>(&twice), Err(DecodeError::Invalid(_))));
        assert!(matches!(from_slice::<BTreeSet<u32>>(&twice), Err(DecodeError::Invalid(_))));
        // A length beyond what the message holds is refused before anything is reserved.
        assert!(from_slice::<HashMap<u8, u8>>(&u32::MAX.to_le_bytes()).is_err());
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic_or_allocation() {
        assert_eq!(from_slice::<bool>(&[2]), Err(DecodeError::Invalid("bool")));
        assert_eq!(from_slice::<Vec<u64>>(&[0xff, 0xff, 0xff, 0xff]), Err(DecodeError::BadLength(u32::MAX as u64)));
        assert_eq!(from_slice::<&str>(&[1, 0, 0, 0, 0xff]), Err(DecodeError::Utf8));
        assert_eq!(from_slice::<u32>(&[1, 2]), Err(DecodeError::Truncated { needed: 4, available: 2 }));
        assert_eq!(from_slice::<u8>(&[1, 2]), Err(DecodeError::TrailingBytes(1)));
        assert!(from_slice::<[u16; 3]>(&[1, 0, 2]).is_err());
        assert_eq!(from_slice::<char>(&0xd800u32.to_le_bytes()), Err(DecodeError::Invalid("char")));
    }

    #[test]
    fn large_slices_are_gathered_by_reference() {
        let big = vec![9u8; 1000];
        let small = 5u32;
        let mut scratch = Vec::new();
        let big_ref = &big[..];
        let mut segs = Segments::new(0);
        {
            let mut w = Writer::gathering(&mut scratch, &mut segs);
            w.encode(&small);
            w.encode(&big_ref);
            w.encode(&small);
        }
        let mut io = [IoSlice::new(&[]); 9];
        let n = segs.io_slices(&scratch, &mut io);
        assert_eq!(n, 3);
        assert_eq!(io[1].as_ptr(), big.as_ptr(), "the big slice is sent from the caller's memory");
        let flat: Vec<u8> = io[..n].iter().flat_map(|s| s.iter().copied()).collect();
        assert_eq!(segs.message_len(&scratch), flat.len());
        let (a, b, c): (u32, &[u8], u32) = from_slice(&flat).unwrap();
        assert_eq!((a, b, c), (5, &big[..], 5));
        let _ = Reader::new(&flat);
    }

    #[derive(crate::Wire, Debug, PartialEq)]
    struct Tree {
        kids: Vec<Tree>,
    }

    #[derive(crate::Wire, Debug, PartialEq)]
    enum List {
        Nil,
        Cons(Box<List>),
    }

    #[derive(crate::Wire, Debug)]
    #[allow(dead_code, clippy::large_enum_variant)] // large on purpose: memory far beyond its encoding
    enum Big {
        Small,
        Large([u64; 512]),
    }

    #[test]
    fn recursion_is_bounded_by_depth_not_by_the_stack() {
        let mut list = List::Nil;
        for _ in 0..100 {
            list = List::Cons(Box::new(list));
        }
        assert_eq!(from_slice::<List>(&to_vec(&list)).unwrap(), list);
        // A million nested vectors, each announcing one child: refused, not a stack overflow.
        let mut hostile = [1u8, 0, 0, 0].repeat(1_000_000);
        hostile.extend_from_slice(&[0, 0, 0, 0]);
        assert_eq!(from_slice::<Tree>(&hostile), Err(DecodeError::TooDeep));
        let cons = to_vec(&List::Cons(Box::new(List::Nil)));
        let tag = &cons[..cons.len() - to_vec(&List::Nil).len()];
        let mut hostile = tag.repeat(1_000_000);
        hostile.extend_from_slice(&to_vec(&List::Nil));
        assert_eq!(from_slice::<List>(&hostile), Err(DecodeError::TooDeep));
    }

    #[test]
    fn vectors_cannot_expand_a_message_without_bound() {
        // Four million one-byte `Small`s would be 16 GiB of `Big`s in memory.
        let n = 4u32 << 20;
        let mut hostile = n.to_le_bytes().to_vec();
        hostile.extend(std::iter::repeat_n(to_vec(&Big::Small)[0], n as usize));
        assert_eq!(from_slice::<Vec<Big>>(&hostile).unwrap_err(), DecodeError::BadLength(n as u64));
        // Small elements expand within the bound and decode.
        let nones = vec![None::<String>; 10_000];
        assert_eq!(from_slice::<Vec<Option<String>>>(&to_vec(&nones)).unwrap(), nones);
    }

    type Mixed = (i64, Option<String>, Vec<u16>, (bool, char, f64), [u8; 7], Result<u32, String>);

    proptest! {
        #[test]
        fn round_trips(a: i64, b: Option<String>, c: Vec<u16>, d: (bool, char, f64), e: [u8; 7], f: Result<u32, String>) {
            let v = (a, b, c, d, e, f);
            let bytes = to_vec(&v);
            let back: Mixed = from_slice(&bytes).unwrap();
            prop_assert_eq!(back.0, v.0);
            prop_assert_eq!(&back.1, &v.1);
            prop_assert_eq!(&back.2, &v.2);
            prop_assert_eq!(back.3 .0, v.3 .0);
            prop_assert_eq!(back.3 .1, v.3 .1);
            prop_assert_eq!(back.3 .2.to_bits(), v.3 .2.to_bits());
            prop_assert_eq!(back.4, v.4);
            prop_assert_eq!(&back.5, &v.5);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes: Vec<u8>) {
            let _ = from_slice::<(u8, Vec<String>, Option<&[u8]>, [char; 2], Result<i32, &str>)>(&bytes);
            let _ = from_slice::<(std::collections::HashMap<u16, String>, std::collections::BTreeSet<i8>)>(&bytes);
        }
    }
}
