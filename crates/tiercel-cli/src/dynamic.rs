//! Calls of any interface a server exports, from its signature (as `tiercel list` shows it):
//! arguments from the command line (JSON, or a bare string for a string or byte argument), results
//! printed as JSON. Follows tiercel's encoding: little-endian numbers, `bool` as a byte, `char` as
//! a `u32`, lengths as `u32`, `Option` and `Result` as a tag byte then the value.

use serde_json::{json, Value};
use tiercel::wire::Reader;

/// A type as written in a signature, as far as the command line can give or show it.
#[derive(Debug, Clone, PartialEq)]
pub enum Ty {
    Unit,
    Bool,
    Char,
    Int {
        bytes: usize,
        signed: bool,
    },
    Float(usize),
    /// `String`, `&str`.
    Str,
    /// `Vec<u8>`, `&[u8]`.
    Bytes,
    Vec(Box<Ty>),
    Option(Box<Ty>),
    Result(Box<Ty>, Box<Ty>),
    Tuple(Vec<Ty>),
    /// `In<T>`: sent as `T`.
    In(Box<Ty>),
    /// `Out<&mut [u8]>`: its length is sent, its bytes come back.
    Out,
    /// `InOut<&mut [u8]>`: sent, and comes back.
    InOut,
    /// `[T; N]`.
    Array(Box<Ty>, usize),
}

impl core::fmt::Display for Ty {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Ty::Unit => write!(f, "()"),
            Ty::Bool => write!(f, "bool"),
            Ty::Char => write!(f, "char"),
            Ty::Int { bytes, signed } => write!(f, "{}{}", if *signed { 'i' } else { 'u' }, bytes * 8),
            Ty::Float(bytes) => write!(f, "f{}", bytes * 8),
            Ty::Str => write!(f, "string"),
            Ty::Bytes => write!(f, "byte string"),
            Ty::Vec(t) => write!(f, "Vec<{t}>"),
            Ty::Option(t) => write!(f, "Option<{t}>"),
            Ty::Result(t, e) => write!(f, "Result<{t}, {e}>"),
            Ty::Tuple(items) => {
                let items: Vec<String> = items.iter().map(|t| t.to_string()).collect();
                write!(f, "({})", items.join(", "))
            }
            Ty::In(t) => write!(f, "In<{t}>"),
            Ty::Out => write!(f, "Out buffer length"),
            Ty::InOut => write!(f, "InOut byte string"),
            Ty::Array(t, n) => write!(f, "[{t}; {n}]"),
        }
    }
}

/// Splits `s` at top-level commas (outside `<>`, `()` and `[]`).
fn split_top(s: &str) -> Vec<&str> {
    let (mut depth, mut start, mut parts) = (0i32, 0, Vec::new());
    for (i, c) in s.char_indices() {
        match c {
            '<' | '(' | '[' => depth += 1,
            '>' | ')' | ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    let last = s[start..].trim();
    if !last.is_empty() {
        parts.push(last);
    }
    parts
}

/// Parses a type as the signature writes it.
pub fn parse_ty(s: &str) -> Result<Ty, String> {
    let s = s.trim();
    let compact: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    let generic =
        |name: &str| compact.strip_prefix(name).and_then(|r| r.strip_prefix('<')).and_then(|r| r.strip_suffix('>'));
    Ok(match compact.as_str() {
        "()" => Ty::Unit,
        "bool" => Ty::Bool,
        "char" => Ty::Char,
        "u8" => Ty::Int { bytes: 1, signed: false },
        "u16" => Ty::Int { bytes: 2, signed: false },
        "u32" => Ty::Int { bytes: 4, signed: false },
        "u64" => Ty::Int { bytes: 8, signed: false },
        "i8" => Ty::Int { bytes: 1, signed: true },
        "i16" => Ty::Int { bytes: 2, signed: true },
        "i32" => Ty::Int { bytes: 4, signed: true },
        "i64" => Ty::Int { bytes: 8, signed: true },
        "f32" => Ty::Float(4),
        "f64" => Ty::Float(8),
        "String" | "&str" | "&'staticstr" => Ty::Str,
        "Vec<u8>" | "&[u8]" => Ty::Bytes,
        "Out<&mut[u8]>" => Ty::Out,
        "InOut<&mut[u8]>" => Ty::InOut,
        _ => {
            if let Some(inner) = generic("In") {
                Ty::In(Box::new(parse_ty(inner)?))
            } else if let Some(inner) = generic("Vec") {
                Ty::Vec(Box::new(parse_ty(inner)?))
            } else if let Some(inner) = generic("Option") {
                Ty::Option(Box::new(parse_ty(inner)?))
            } else if let Some(inner) = generic("Result") {
                match split_top(inner)[..] {
                    [t, e] => Ty::Result(Box::new(parse_ty(t)?), Box::new(parse_ty(e)?)),
                    _ => return Err(format!("`{s}`: a Result has two types")),
                }
            } else if let Some((t, n)) =
                compact.strip_prefix('[').and_then(|r| r.strip_suffix(']')).and_then(|r| r.rsplit_once(';'))
            {
                let n = n.parse().map_err(|_| format!("`{s}`: the array's length"))?;
                Ty::Array(Box::new(parse_ty(t)?), n)
            } else if let Some(inner) = compact.strip_prefix('(').and_then(|r| r.strip_suffix(')')) {
                Ty::Tuple(split_top(inner).into_iter().map(parse_ty).collect::<Result<_, _>>()?)
            } else {
                return Err(format!("type `{s}` cannot be given or shown on the command line"));
            }
        }
    })
}

/// A procedure as its signature line gives it: name, argument types, result type.
#[derive(Debug, Clone, PartialEq)]
pub struct Procedure {
    pub name: String,
    pub args: Vec<Ty>,
    pub ret: Ty,
}

/// Parses one line of a signature: `name(argument types) -> result type`.
pub fn parse_procedure(line: &str) -> Result<Procedure, String> {
    let open = line.find('(').ok_or_else(|| format!("no `(` in {line:?}"))?;
    let name = line[..open].trim().to_string();
    let mut depth = 0;
    let mut close = None;
    for (i, c) in line[open..].char_indices() {
        match c {
            '(' | '<' | '[' => depth += 1,
            ')' | '>' | ']' => {
                depth -= 1;
                if depth == 0 {
                    close = Some(open + i);
                    break;
                }
            }
            _ => {}
        }
    }
    let close = close.ok_or_else(|| format!("unbalanced {line:?}"))?;
    let args = split_top(&line[open + 1..close]).into_iter().map(parse_ty).collect::<Result<_, _>>()?;
    let ret = match line[close + 1..].trim().strip_prefix("->") {
        Some(t) => parse_ty(t)?,
        None => Ty::Unit,
    };
    Ok(Procedure { name, args, ret })
}

/// A command-line argument as a JSON value: JSON if it parses as such, else the string itself.
pub fn arg_value(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.to_string()))
}

/// The bytes a value gives for a byte argument: a string's UTF-8, or an array of numbers.
pub fn bytes_of(v: &Value) -> Result<Vec<u8>, String> {
    match v {
        Value::String(s) => Ok(s.as_bytes().to_vec()),
        Value::Array(items) => items
            .iter()
            .map(|i| i.as_u64().filter(|b| *b <= 255).map(|b| b as u8).ok_or_else(|| format!("{i} is not a byte")))
            .collect(),
        other => Err(format!("{other} is not bytes (a string, or an array of numbers)")),
    }
}

/// Appends the encoding of `v` as `ty` to `out`.
pub fn encode(ty: &Ty, v: &Value, out: &mut Vec<u8>) -> Result<(), String> {
    let bad = || format!("{v} is not a {ty}");
    match ty {
        Ty::Unit => {}
        Ty::Bool => out.push(v.as_bool().ok_or_else(bad)? as u8),
        Ty::Char => {
            let c = v.as_str().and_then(|s| s.chars().next()).ok_or_else(bad)?;
            out.extend_from_slice(&u32::from(c).to_le_bytes());
        }
        Ty::Int { bytes, signed: false } => {
            let n = v.as_u64().ok_or_else(bad)?;
            if *bytes < 8 && n >> (bytes * 8) != 0 {
                return Err(format!("{n} does not fit in {bytes} bytes"));
            }
            out.extend_from_slice(&n.to_le_bytes()[..*bytes]);
        }
        Ty::Int { bytes, signed: true } => {
            let n = v.as_i64().ok_or_else(bad)?;
            let bits = bytes * 8;
            if bits < 64 && (n < -(1i64 << (bits - 1)) || n >= 1i64 << (bits - 1)) {
                return Err(format!("{n} does not fit in {bytes} bytes"));
            }
            out.extend_from_slice(&n.to_le_bytes()[..*bytes]);
        }
        Ty::Float(4) => out.extend_from_slice(&(v.as_f64().ok_or_else(bad)? as f32).to_le_bytes()),
        Ty::Float(_) => out.extend_from_slice(&v.as_f64().ok_or_else(bad)?.to_le_bytes()),
        Ty::Str => {
            let s = v.as_str().ok_or_else(bad)?;
            out.extend_from_slice(&(s.len() as u32).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        }
        Ty::Bytes | Ty::InOut => {
            let b = bytes_of(v)?;
            out.extend_from_slice(&(b.len() as u32).to_le_bytes());
            out.extend_from_slice(&b);
        }
        Ty::Out => out.extend_from_slice(
            &(v.as_u64().ok_or_else(|| format!("{v}: give an Out buffer's length"))? as u32).to_le_bytes(),
        ),
        Ty::In(inner) => encode(inner, v, out)?,
        Ty::Vec(inner) => {
            let items = v.as_array().ok_or_else(bad)?;
            out.extend_from_slice(&(items.len() as u32).to_le_bytes());
            for item in items {
                encode(inner, item, out)?;
            }
        }
        Ty::Option(inner) => match v {
            Value::Null => out.push(0),
            v => {
                out.push(1);
                encode(inner, v, out)?;
            }
        },
        Ty::Result(ok, err) => match (v.get("Ok"), v.get("Err")) {
            (Some(o), None) => {
                out.push(0);
                encode(ok, o, out)?;
            }
            (None, Some(e)) => {
                out.push(1);
                encode(err, e, out)?;
            }
            _ => return Err(format!("{v}: give {{\"Ok\": …}} or {{\"Err\": …}}")),
        },
        Ty::Tuple(items) => {
            let values = v.as_array().filter(|a| a.len() == items.len()).ok_or_else(bad)?;
            for (t, v) in items.iter().zip(values) {
                encode(t, v, out)?;
            }
        }
        Ty::Array(t, n) if **t == (Ty::Int { bytes: 1, signed: false }) => {
            let b = bytes_of(v)?;
            if b.len() != *n {
                return Err(format!("{v}: {n} bytes wanted, {} given", b.len()));
            }
            out.extend_from_slice(&b);
        }
        Ty::Array(t, n) => {
            let values = v.as_array().filter(|a| a.len() == *n).ok_or_else(bad)?;
            for v in values {
                encode(t, v, out)?;
            }
        }
    }
    Ok(())
}

fn show_bytes(b: &[u8]) -> Value {
    match std::str::from_utf8(b) {
        Ok(s) if !b.is_empty() && b.len() <= 4096 && !s.contains('\0') => Value::String(s.to_string()),
        _ if b.len() <= 64 => json!(b),
        _ => json!({ "bytes": b.len(), "first": &b[..16] }),
    }
}

/// Decodes a value of `ty` from `r`.
pub fn decode(ty: &Ty, r: &mut Reader<'_>) -> Result<Value, String> {
    let e = |e: tiercel::DecodeError| e.to_string();
    Ok(match ty {
        Ty::Unit => Value::Null,
        Ty::Bool => json!(r.array::<1>().map_err(e)?[0] != 0),
        Ty::Char => {
            let c = u32::from_le_bytes(r.array().map_err(e)?);
            json!(char::from_u32(c).map(String::from).ok_or("not a char")?)
        }
        Ty::Int { bytes, signed } => {
            let mut b = [0u8; 8];
            b[..*bytes].copy_from_slice(r.take(*bytes).map_err(e)?);
            if *signed {
                let shift = 64 - bytes * 8;
                json!((i64::from_le_bytes(b) << shift) >> shift)
            } else {
                json!(u64::from_le_bytes(b))
            }
        }
        Ty::Float(4) => json!(f32::from_le_bytes(r.array().map_err(e)?)),
        Ty::Float(_) => json!(f64::from_le_bytes(r.array().map_err(e)?)),
        Ty::Str => {
            let n = r.len_prefix(1).map_err(e)?;
            json!(std::str::from_utf8(r.take(n).map_err(e)?).map_err(|_| "a string that is not UTF-8")?)
        }
        Ty::Bytes => {
            let n = r.len_prefix(1).map_err(e)?;
            show_bytes(r.take(n).map_err(e)?)
        }
        Ty::Vec(inner) => {
            let n = r.len_prefix(1).map_err(e)?;
            Value::Array((0..n).map(|_| decode(inner, r)).collect::<Result<_, _>>()?)
        }
        Ty::Option(inner) => match r.array::<1>().map_err(e)?[0] {
            0 => Value::Null,
            1 => decode(inner, r)?,
            _ => return Err("invalid Option tag".into()),
        },
        Ty::Result(ok, err) => match r.array::<1>().map_err(e)?[0] {
            0 => json!({ "Ok": decode(ok, r)? }),
            1 => json!({ "Err": decode(err, r)? }),
            _ => return Err("invalid Result tag".into()),
        },
        Ty::Tuple(items) => Value::Array(items.iter().map(|t| decode(t, r)).collect::<Result<_, _>>()?),
        Ty::In(inner) => decode(inner, r)?,
        Ty::Array(t, n) if **t == (Ty::Int { bytes: 1, signed: false }) => show_bytes(r.take(*n).map_err(e)?),
        Ty::Array(t, n) => Value::Array((0..*n).map(|_| decode(t, r)).collect::<Result<_, _>>()?),
        Ty::Out | Ty::InOut => return Err("a buffer is not a result".into()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_parse() {
        let p = parse_procedure("transfer(u64, Option<String>, In<&[u8]>) -> Result<(u32, i8), String>").unwrap();
        assert_eq!(p.name, "transfer");
        assert_eq!(
            p.args,
            [Ty::Int { bytes: 8, signed: false }, Ty::Option(Box::new(Ty::Str)), Ty::In(Box::new(Ty::Bytes))]
        );
        let tuple = Ty::Tuple(vec![Ty::Int { bytes: 4, signed: false }, Ty::Int { bytes: 1, signed: true }]);
        assert_eq!(p.ret, Ty::Result(Box::new(tuple), Box::new(Ty::Str)));
        assert_eq!(parse_procedure("null()").unwrap().args, []);
        assert_eq!(parse_procedure("max_result(Out<&mut[u8]>)").unwrap().args, [Ty::Out]);
        assert!(parse_procedure("open(Account) -> u64").is_err(), "a user's struct is not known here");
    }

    #[test]
    fn values_round_trip_through_the_encoding() {
        let cases = [
            ("i32", json!(-5)),
            ("u16", json!(65535)),
            ("bool", json!(true)),
            ("String", json!("héllo")),
            ("Vec<u8>", json!("bytes")),
            ("Option<u64>", json!(null)),
            ("Option<u64>", json!(7)),
            ("Result<u64, String>", json!({"Err": "no"})),
            ("Vec<(u8, char)>", json!([[1, "a"], [2, "b"]])),
            ("f64", json!(1.5)),
            ("[u8; 4]", json!("abcd")),
            ("[i16; 2]", json!([-1, 2])),
        ];
        for (ty, v) in cases {
            let ty = parse_ty(ty).unwrap();
            let mut b = Vec::new();
            encode(&ty, &v, &mut b).unwrap();
            let mut r = Reader::new(&b);
            assert_eq!(decode(&ty, &mut r).unwrap(), v, "{ty:?}");
            r.finish().unwrap();
        }
        let mut b = Vec::new();
        assert!(encode(&parse_ty("u8").unwrap(), &json!(256), &mut b).is_err());
        assert!(encode(&parse_ty("i8").unwrap(), &json!(-129), &mut b).is_err());
        assert!(encode(&parse_ty("[u8;4]").unwrap(), &json!("abc"), &mut b).is_err());
    }
}
