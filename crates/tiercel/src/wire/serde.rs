//! [`Serde`]: a type that implements serde's `Serialize` and `Deserialize` as an argument or a
//! result, in postcard's compact encoding.

use ::serde::{Deserialize, Serialize};

use super::{DecodeError, Reader, Wire, Writer};

/// A value of a serde type (`#[derive(Serialize, Deserialize)]`), passed as an argument or returned
/// as a result without an implementation of [`Wire`] of its own (feature `serde`).
///
/// It travels as a length and then the value in [postcard](https://docs.rs/postcard)'s encoding
/// (varint integers, no field names), serialized straight into the message and deserialized from
/// it, borrowing `&str` and `&[u8]` fields where the type borrows. What it costs against a native
/// [`Wire`] type: serde's generic path instead of the fixed layout (see `benches/serde.rs` and the
/// README), and no gathering of large byte slices: every byte is copied into the message.
///
/// A value serde cannot serialize (a `Serialize` implementation that fails, or a sequence of
/// unknown length) goes out as a length the receiver refuses: the call fails with
/// `CallError::BadArguments` and never runs (or, for a result, with `CallError::BadResult`).
///
/// ```
/// # #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
/// # struct Order { id: u64, items: Vec<String> }
/// use tiercel::wire::{from_slice, to_vec, Serde};
///
/// let order = Serde(Order { id: 7, items: vec!["tea".into()] });
/// let back: Serde<Order> = from_slice(&to_vec(&order)).unwrap();
/// assert_eq!(back.0, order.0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Serde<T>(pub T);

impl<'de, T: Serialize + Deserialize<'de>> Wire<'de> for Serde<T> {
    fn encode<'a>(&'a self, w: &mut Writer<'_, 'a>) {
        let mut failed = false;
        w.put_with_len(|buf| {
            let start = buf.len();
            if postcard::to_io(&self.0, &mut *buf).is_err() {
                buf.truncate(start);
                failed = true;
            }
        });
        if failed {
            // A length no message can hold: the receiver refuses the value, and the call with it.
            w.put_len(u32::MAX as usize);
        }
    }

    fn decode(r: &mut Reader<'de>) -> Result<Self, DecodeError> {
        let n = r.len_prefix(1)?;
        let bytes = r.take(n)?;
        match postcard::take_from_bytes::<T>(bytes) {
            Ok((value, [])) => Ok(Serde(value)),
            Ok(_) => Err(DecodeError::Invalid("serde value shorter than its length")),
            Err(_) => Err(DecodeError::Invalid("serde value does not decode")),
        }
    }
}

impl<T> From<T> for Serde<T> {
    fn from(value: T) -> Serde<T> {
        Serde(value)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{from_slice, to_vec, DecodeError};
    use super::Serde;
    use std::collections::BTreeMap;

    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq, Clone)]
    enum Shape {
        Circle { r: f64 },
        Poly(Vec<(i32, i32)>),
    }

    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Borrowing<'a> {
        name: &'a str,
        #[serde(with = "serde_bytes_like")]
        bytes: &'a [u8],
    }

    /// `&[u8]` as serde bytes (what `serde_bytes` does), so that it borrows.
    mod serde_bytes_like {
        pub fn serialize<S: serde::Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(b)
        }
        pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<&'de [u8], D::Error> {
            <&[u8] as serde::Deserialize>::deserialize(d)
        }
    }

    #[test]
    fn serde_values_round_trip_and_borrow_where_the_type_borrows() {
        let shapes = vec![Shape::Circle { r: 1.5 }, Shape::Poly(vec![(0, 0), (3, -4)])];
        let back: Serde<Vec<Shape>> = from_slice(&to_vec(&Serde(shapes.clone()))).unwrap();
        assert_eq!(back.0, shapes);
        let map: BTreeMap<String, u64> = [("a".into(), 1), ("b".into(), u64::MAX)].into();
        let back: Serde<BTreeMap<String, u64>> = from_slice(&to_vec(&Serde(map.clone()))).unwrap();
        assert_eq!(back.0, map);
        let msg = to_vec(&Serde(Borrowing { name: "n", bytes: &[1, 2, 3] }));
        let back: Serde<Borrowing<'_>> = from_slice(&msg).unwrap();
        assert_eq!((back.0.name, back.0.bytes), ("n", &[1u8, 2, 3][..]));
        assert!(msg.as_ptr_range().contains(&back.0.bytes.as_ptr()), "borrowed from the message");
        // Beside other arguments, in a tuple as a stub sends them.
        let (a, s, b): (u8, Serde<Shape>, u16) = from_slice(&to_vec(&(1u8, Serde(shapes[0].clone()), 2u16))).unwrap();
        assert_eq!((a, s.0, b), (1, shapes[0].clone(), 2));
    }

    #[test]
    fn bad_bytes_are_refused_and_a_value_that_cannot_serialize_is_refused_by_the_receiver() {
        // Garbage inside a well-formed length, and a value shorter than its length.
        let mut msg = 3u32.to_le_bytes().to_vec();
        msg.extend_from_slice(&[0xff, 0xff, 0xff]);
        assert!(matches!(from_slice::<Serde<Vec<String>>>(&msg), Err(DecodeError::Invalid(_))));
        let mut msg = to_vec(&Serde(5u8));
        msg[0] += 1;
        msg.push(0);
        assert!(matches!(from_slice::<Serde<u8>>(&msg), Err(DecodeError::Invalid(_))));
        // A Serialize that fails.
        struct Fails;
        impl serde::Serialize for Fails {
            fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
                Err(serde::ser::Error::custom("no"))
            }
        }
        impl<'de> serde::Deserialize<'de> for Fails {
            fn deserialize<D: serde::Deserializer<'de>>(_: D) -> Result<Fails, D::Error> {
                Ok(Fails)
            }
        }
        assert!(from_slice::<Serde<Fails>>(&to_vec(&Serde(Fails))).is_err());
    }
}
