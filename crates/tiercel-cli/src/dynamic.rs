//! Calls of any interface a server exports, from its signature (as `tiercel list` shows it, in the
//! shape language of `tiercel::wire::shape`): arguments from the command line as JSON, results
//! printed as JSON. Follows tiercel's encoding: little-endian numbers, `bool` as a byte, `char` as a
//! `u32`, lengths as `u32`, `Option` and `Result` as a tag byte then the value, a struct as its fields
//! in order, an enum as a `u32` variant index then the variant's fields.
//!
//! As JSON: a struct is an object of its fields (a tuple struct an array, a unit struct `null`); an
//! enum's unit variant is its name as a string, any other `{"Variant": fields}` (a one-field tuple
//! variant's field alone); `Option` is the value or `null`; `Result` is `{"Ok": …}` or `{"Err": …}`;
//! a map is an object when its keys are strings or numbers, else an array of `[key, value]` pairs; a
//! set, a `Vec` and a tuple are arrays. Bytes (`Vec<u8>`, `[u8; N]`, buffers) are given as a string
//! (its UTF-8), an array of numbers, or `{"hex": "…"}`, and shown as a string when they are printable
//! UTF-8, else as `{"hex": "…"}`.

use std::collections::HashMap;

use serde_json::{json, Map, Value};
use tiercel::wire::Reader;

/// A shape, as far as the command line can give or show it.
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
    /// `String`.
    Str,
    /// `Vec<u8>`.
    Bytes,
    Vec(Box<Ty>),
    Option(Box<Ty>),
    Result(Box<Ty>, Box<Ty>),
    Tuple(Vec<Ty>),
    Map(Box<Ty>, Box<Ty>),
    Set(Box<Ty>),
    /// `In<T>`: sent as `T`.
    In(Box<Ty>),
    /// `Out<Vec<u8>>`: its length is sent, its bytes come back.
    Out,
    /// `InOut<Vec<u8>>`: sent, and comes back.
    InOut,
    /// `[T; N]`.
    Array(Box<Ty>, usize),
    /// A type of the user's, defined by a `type Name = …` line of the signature.
    Named(String),
}

/// The fields of a struct or of an enum's variant.
#[derive(Debug, Clone, PartialEq)]
pub enum Fields {
    Named(Vec<(String, Ty)>),
    Tuple(Vec<Ty>),
    Unit,
}

/// A type of the user's.
#[derive(Debug, Clone, PartialEq)]
pub enum Def {
    Struct(Fields),
    Enum(Vec<(String, Fields)>),
}

/// The definitions of a signature's `type` lines, by name.
#[derive(Debug, Default, Clone)]
pub struct Types(HashMap<String, Def>);

/// Deepest nesting of values encoded or decoded (a recursive type's data is bounded by it).
const MAX_DEPTH: usize = 64;

impl core::fmt::Display for Ty {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Ty::Unit => write!(f, "()"),
            Ty::Bool => write!(f, "bool"),
            Ty::Char => write!(f, "char"),
            Ty::Int { bytes, signed } => write!(f, "{}{}", if *signed { 'i' } else { 'u' }, bytes * 8),
            Ty::Float(bytes) => write!(f, "f{}", bytes * 8),
            Ty::Str => write!(f, "String"),
            Ty::Bytes => write!(f, "Vec<u8>"),
            Ty::Vec(t) => write!(f, "Vec<{t}>"),
            Ty::Option(t) => write!(f, "Option<{t}>"),
            Ty::Result(t, e) => write!(f, "Result<{t}, {e}>"),
            Ty::Map(k, v) => write!(f, "Map<{k}, {v}>"),
            Ty::Set(t) => write!(f, "Set<{t}>"),
            Ty::Tuple(items) => {
                let items: Vec<String> = items.iter().map(|t| t.to_string()).collect();
                write!(f, "({})", items.join(", "))
            }
            Ty::In(t) => write!(f, "In<{t}>"),
            Ty::Out => write!(f, "Out buffer length"),
            Ty::InOut => write!(f, "InOut bytes"),
            Ty::Array(t, n) => write!(f, "[{t}; {n}]"),
            Ty::Named(n) => write!(f, "{n}"),
        }
    }
}

/// Splits `s` at top-level commas (outside `<>`, `()`, `[]` and `{}`).
fn split_top(s: &str) -> Vec<&str> {
    let (mut depth, mut start, mut parts) = (0i32, 0, Vec::new());
    for (i, c) in s.char_indices() {
        match c {
            '<' | '(' | '[' | '{' => depth += 1,
            '>' | ')' | ']' | '}' => depth -= 1,
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

/// Parses a shape as the signature writes it.
pub fn parse_ty(s: &str) -> Result<Ty, String> {
    let s = s.trim();
    let generic = |name: &str| s.strip_prefix(name).and_then(|r| r.strip_prefix('<')).and_then(|r| r.strip_suffix('>'));
    let two = |inner: &str| match split_top(inner)[..] {
        [a, b] => Ok((Box::new(parse_ty(a)?), Box::new(parse_ty(b)?))),
        _ => Err(format!("`{s}`: two types wanted")),
    };
    Ok(match s {
        "()" => Ty::Unit,
        "bool" => Ty::Bool,
        "char" => Ty::Char,
        "u8" | "u16" | "u32" | "u64" | "u128" | "i8" | "i16" | "i32" | "i64" | "i128" => {
            let bits: usize = s[1..].parse().map_err(|_| format!("`{s}`"))?;
            Ty::Int { bytes: bits / 8, signed: s.starts_with('i') }
        }
        "f32" => Ty::Float(4),
        "f64" => Ty::Float(8),
        "String" => Ty::Str,
        "Vec<u8>" => Ty::Bytes,
        "Out<Vec<u8>>" => Ty::Out,
        "InOut<Vec<u8>>" => Ty::InOut,
        _ if s.starts_with("opaque(") => {
            return Err(format!(
                "type `{s}` has no shape the command line can read (a hand-written Wire or a Serde<T>)"
            ))
        }
        _ => {
            if let Some(inner) = generic("In") {
                Ty::In(Box::new(parse_ty(inner)?))
            } else if let Some(inner) = generic("Vec") {
                Ty::Vec(Box::new(parse_ty(inner)?))
            } else if let Some(inner) = generic("Option") {
                Ty::Option(Box::new(parse_ty(inner)?))
            } else if let Some(inner) = generic("Set") {
                Ty::Set(Box::new(parse_ty(inner)?))
            } else if let Some(inner) = generic("Result") {
                let (t, e) = two(inner)?;
                Ty::Result(t, e)
            } else if let Some(inner) = generic("Map") {
                let (k, v) = two(inner)?;
                Ty::Map(k, v)
            } else if let Some((t, n)) =
                s.strip_prefix('[').and_then(|r| r.strip_suffix(']')).and_then(|r| r.rsplit_once(';'))
            {
                let n = n.trim().parse().map_err(|_| format!("`{s}`: the array's length"))?;
                Ty::Array(Box::new(parse_ty(t)?), n)
            } else if let Some(inner) = s.strip_prefix('(').and_then(|r| r.strip_suffix(')')) {
                Ty::Tuple(split_top(inner.trim_end_matches(',')).into_iter().map(parse_ty).collect::<Result<_, _>>()?)
            } else if s.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_') {
                Ty::Named(s.to_owned())
            } else {
                return Err(format!("type `{s}` cannot be given or shown on the command line"));
            }
        }
    })
}

/// Parses fields as a definition writes them: ` { name: T, … }`, `(T, …)`, or nothing.
fn parse_fields(s: &str) -> Result<Fields, String> {
    let s = s.trim();
    if s.is_empty() {
        Ok(Fields::Unit)
    } else if let Some(inner) = s.strip_prefix('{').and_then(|r| r.strip_suffix('}')) {
        let fields = split_top(inner)
            .into_iter()
            .map(|f| match f.split_once(':') {
                Some((name, ty)) => Ok((name.trim().to_owned(), parse_ty(ty)?)),
                None => Err(format!("field `{f}` has no type")),
            })
            .collect::<Result<_, String>>()?;
        Ok(Fields::Named(fields))
    } else if let Some(inner) = s.strip_prefix('(').and_then(|r| r.strip_suffix(')')) {
        Ok(Fields::Tuple(split_top(inner).into_iter().map(parse_ty).collect::<Result<_, _>>()?))
    } else {
        Err(format!("fields `{s}` do not parse"))
    }
}

impl Types {
    /// The definitions of `signature`'s `type Name = …` lines.
    pub fn parse(signature: &str) -> Result<Types, String> {
        let mut types = HashMap::new();
        for line in signature.lines().filter_map(|l| l.strip_prefix("type ")) {
            let (name, def) = line.split_once(" = ").ok_or_else(|| format!("`type {line}` does not parse"))?;
            let def = if let Some(rest) = def.strip_prefix("struct") {
                Def::Struct(parse_fields(rest)?)
            } else if let Some(body) =
                def.strip_prefix("enum").map(str::trim).and_then(|r| r.strip_prefix('{')?.strip_suffix('}'))
            {
                let variants = split_top(body)
                    .into_iter()
                    .map(|v| {
                        let at = v.find(['(', '{']).unwrap_or(v.len());
                        Ok((v[..at].trim().to_owned(), parse_fields(&v[at..])?))
                    })
                    .collect::<Result<_, String>>()?;
                Def::Enum(variants)
            } else {
                return Err(format!("`type {line}`: neither a struct nor an enum"));
            };
            types.insert(name.to_owned(), def);
        }
        Ok(Types(types))
    }

    fn get(&self, name: &str) -> Result<&Def, String> {
        self.0.get(name).ok_or_else(|| format!("type `{name}` is not defined in the signature (was it cut short?)"))
    }
}

/// A procedure as its signature line gives it: name, argument types, result type.
#[derive(Debug, Clone, PartialEq)]
pub struct Procedure {
    pub name: String,
    pub args: Vec<Ty>,
    pub ret: Ty,
}

/// Parses one line of a signature: `name(shape, …) -> shape`.
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

/// The bytes a value gives for a byte argument: a string's UTF-8, an array of numbers, or
/// `{"hex": "…"}`.
pub fn bytes_of(v: &Value) -> Result<Vec<u8>, String> {
    match v {
        Value::String(s) => Ok(s.as_bytes().to_vec()),
        Value::Array(items) => items
            .iter()
            .map(|i| i.as_u64().filter(|b| *b <= 255).map(|b| b as u8).ok_or_else(|| format!("{i} is not a byte")))
            .collect(),
        Value::Object(o) if o.len() == 1 && o.get("hex").is_some_and(Value::is_string) => {
            let hex = o["hex"].as_str().unwrap_or_default();
            if hex.len() % 2 != 0 {
                return Err(format!("{hex:?}: an odd number of hex digits"));
            }
            (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).map_err(|_| format!("{hex:?} is not hex")))
                .collect()
        }
        other => Err(format!("{other} is not bytes (a string, an array of numbers, or {{\"hex\": …}})")),
    }
}

fn put_len(n: usize, out: &mut Vec<u8>) -> Result<(), String> {
    let n = u32::try_from(n).map_err(|_| format!("{n} elements is more than a length can say"))?;
    out.extend_from_slice(&n.to_le_bytes());
    Ok(())
}

/// Appends the encoding of `v` as `ty` to `out`.
pub fn encode(ty: &Ty, v: &Value, types: &Types, out: &mut Vec<u8>) -> Result<(), String> {
    encode_at(ty, v, types, out, 0)
}

fn encode_at(ty: &Ty, v: &Value, types: &Types, out: &mut Vec<u8>, depth: usize) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err(format!("values nested deeper than {MAX_DEPTH}"));
    }
    let bad = || format!("{v} is not a {ty}");
    let each = |t: &Ty, v: &Value, out: &mut Vec<u8>| encode_at(t, v, types, out, depth + 1);
    match ty {
        Ty::Unit => {}
        Ty::Bool => out.push(v.as_bool().ok_or_else(bad)? as u8),
        Ty::Char => {
            let c = v.as_str().and_then(|s| s.chars().next()).ok_or_else(bad)?;
            out.extend_from_slice(&u32::from(c).to_le_bytes());
        }
        Ty::Int { bytes, signed: false } => {
            let n = match v {
                Value::String(s) => s.parse::<u128>().map_err(|_| bad())?,
                _ => u128::from(v.as_u64().ok_or_else(bad)?),
            };
            if *bytes < 16 && n >> (bytes * 8) != 0 {
                return Err(format!("{n} does not fit in {bytes} bytes"));
            }
            out.extend_from_slice(&n.to_le_bytes()[..*bytes]);
        }
        Ty::Int { bytes, signed: true } => {
            let n = match v {
                Value::String(s) => s.parse::<i128>().map_err(|_| bad())?,
                _ => i128::from(v.as_i64().ok_or_else(bad)?),
            };
            let bits = bytes * 8;
            if bits < 128 && (n < -(1i128 << (bits - 1)) || n >= 1i128 << (bits - 1)) {
                return Err(format!("{n} does not fit in {bytes} bytes"));
            }
            out.extend_from_slice(&n.to_le_bytes()[..*bytes]);
        }
        Ty::Float(4) => out.extend_from_slice(&(v.as_f64().ok_or_else(bad)? as f32).to_le_bytes()),
        Ty::Float(_) => out.extend_from_slice(&v.as_f64().ok_or_else(bad)?.to_le_bytes()),
        Ty::Str => {
            let s = v.as_str().ok_or_else(bad)?;
            put_len(s.len(), out)?;
            out.extend_from_slice(s.as_bytes());
        }
        Ty::Bytes | Ty::InOut => {
            let b = bytes_of(v)?;
            put_len(b.len(), out)?;
            out.extend_from_slice(&b);
        }
        Ty::Out => out.extend_from_slice(
            &(v.as_u64().ok_or_else(|| format!("{v}: give an Out buffer's length"))? as u32).to_le_bytes(),
        ),
        Ty::In(inner) => each(inner, v, out)?,
        Ty::Vec(inner) | Ty::Set(inner) => {
            let items = v.as_array().ok_or_else(bad)?;
            put_len(items.len(), out)?;
            for item in items {
                each(inner, item, out)?;
            }
        }
        Ty::Map(k, val) => match v {
            Value::Object(o) => {
                put_len(o.len(), out)?;
                for (key, value) in o {
                    // An object's keys are strings: a number key is given as its digits.
                    let key = match **k {
                        Ty::Str => Value::String(key.clone()),
                        _ => serde_json::from_str(key).unwrap_or_else(|_| Value::String(key.clone())),
                    };
                    each(k, &key, out)?;
                    each(val, value, out)?;
                }
            }
            Value::Array(pairs) => {
                put_len(pairs.len(), out)?;
                for pair in pairs {
                    let [key, value] = pair.as_array().map(Vec::as_slice).unwrap_or_default() else {
                        return Err(format!("{pair} is not a [key, value] pair"));
                    };
                    each(k, key, out)?;
                    each(val, value, out)?;
                }
            }
            _ => return Err(bad()),
        },
        Ty::Option(inner) => match v {
            Value::Null => out.push(0),
            v => {
                out.push(1);
                each(inner, v, out)?;
            }
        },
        Ty::Result(ok, err) => match (v.get("Ok"), v.get("Err")) {
            (Some(o), None) => {
                out.push(0);
                each(ok, o, out)?;
            }
            (None, Some(e)) => {
                out.push(1);
                each(err, e, out)?;
            }
            _ => return Err(format!("{v}: give {{\"Ok\": …}} or {{\"Err\": …}}")),
        },
        Ty::Tuple(items) => {
            let values = v.as_array().filter(|a| a.len() == items.len()).ok_or_else(bad)?;
            for (t, v) in items.iter().zip(values) {
                each(t, v, out)?;
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
                each(t, v, out)?;
            }
        }
        Ty::Named(name) => match types.get(name)? {
            Def::Struct(fields) => encode_fields(fields, v, name, types, out, depth)?,
            Def::Enum(variants) => {
                let (variant, inner) = match v {
                    Value::String(s) => (s.as_str(), &Value::Null),
                    Value::Object(o) if o.len() == 1 => {
                        o.iter().next().map(|(k, v)| (k.as_str(), v)).unwrap_or_default()
                    }
                    _ => return Err(format!("{v} is not a {name}: give \"Variant\" or {{\"Variant\": …}}")),
                };
                let Some(index) = variants.iter().position(|(n, _)| n == variant) else {
                    let known: Vec<&str> = variants.iter().map(|(n, _)| n.as_str()).collect();
                    return Err(format!("{name} has no variant {variant:?} (it has {})", known.join(", ")));
                };
                out.extend_from_slice(&(index as u32).to_le_bytes());
                encode_fields(&variants[index].1, inner, &format!("{name}::{variant}"), types, out, depth)?;
            }
        },
    }
    Ok(())
}

fn encode_fields(
    fields: &Fields,
    v: &Value,
    what: &str,
    types: &Types,
    out: &mut Vec<u8>,
    depth: usize,
) -> Result<(), String> {
    match fields {
        Fields::Unit => Ok(()),
        // A one-field tuple is given as the field alone.
        Fields::Tuple(items) if items.len() == 1 && !v.is_array() => encode_at(&items[0], v, types, out, depth + 1),
        Fields::Tuple(items) => {
            let values = v
                .as_array()
                .filter(|a| a.len() == items.len())
                .ok_or_else(|| format!("{v}: {what} takes {} fields", items.len()))?;
            items.iter().zip(values).try_for_each(|(t, v)| encode_at(t, v, types, out, depth + 1))
        }
        Fields::Named(named) => {
            let o = v.as_object().ok_or_else(|| format!("{v}: {what} is an object of its fields"))?;
            if let Some(extra) = o.keys().find(|k| !named.iter().any(|(n, _)| n == *k)) {
                return Err(format!("{what} has no field {extra:?}"));
            }
            named.iter().try_for_each(|(n, t)| {
                let field = o.get(n).ok_or_else(|| format!("{what}: field {n:?} missing"))?;
                encode_at(t, field, types, out, depth + 1)
            })
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn show_bytes(b: &[u8]) -> Value {
    match std::str::from_utf8(b) {
        Ok(s) if !s.chars().any(|c| c.is_control() && !matches!(c, '\n' | '\t' | '\r')) => Value::String(s.to_string()),
        _ => json!({ "hex": hex(b) }),
    }
}

/// Decodes a value of `ty` from `r`.
pub fn decode(ty: &Ty, types: &Types, r: &mut Reader<'_>) -> Result<Value, String> {
    decode_at(ty, types, r, 0)
}

fn decode_at(ty: &Ty, types: &Types, r: &mut Reader<'_>, depth: usize) -> Result<Value, String> {
    if depth > MAX_DEPTH {
        return Err(format!("values nested deeper than {MAX_DEPTH}"));
    }
    let e = |e: tiercel::DecodeError| e.to_string();
    let each = |t: &Ty, r: &mut Reader<'_>| decode_at(t, types, r, depth + 1);
    Ok(match ty {
        Ty::Unit => Value::Null,
        Ty::Bool => match r.array::<1>().map_err(e)?[0] {
            0 => json!(false),
            1 => json!(true),
            _ => return Err("invalid bool".into()),
        },
        Ty::Char => {
            let c = u32::from_le_bytes(r.array().map_err(e)?);
            json!(char::from_u32(c).map(String::from).ok_or("not a char")?)
        }
        Ty::Int { bytes, signed } => {
            let mut b = [0u8; 16];
            b[..*bytes].copy_from_slice(r.take(*bytes).map_err(e)?);
            let shift = 128 - bytes * 8;
            let (wide, fits) = if *signed {
                let n = (i128::from_le_bytes(b) << shift) >> shift;
                (n.to_string(), i64::try_from(n).ok().map(|n| json!(n)))
            } else {
                let n = u128::from_le_bytes(b);
                (n.to_string(), u64::try_from(n).ok().map(|n| json!(n)))
            };
            // Beyond 64 bits, the digits as a string (JSON numbers do not hold them).
            fits.unwrap_or(Value::String(wide))
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
        Ty::Vec(inner) | Ty::Set(inner) => {
            let n = r.len_prefix(1).map_err(e)?;
            Value::Array((0..n).map(|_| each(inner, r)).collect::<Result<_, _>>()?)
        }
        Ty::Map(k, v) => {
            let n = r.len_prefix(2).map_err(e)?;
            let pairs: Vec<(Value, Value)> =
                (0..n).map(|_| Ok((each(k, r)?, each(v, r)?))).collect::<Result<_, String>>()?;
            if pairs.iter().all(|(k, _)| k.is_string() || k.is_number()) {
                let mut o = Map::new();
                for (k, v) in pairs {
                    o.insert(k.as_str().map_or_else(|| k.to_string(), str::to_owned), v);
                }
                Value::Object(o)
            } else {
                Value::Array(pairs.into_iter().map(|(k, v)| json!([k, v])).collect())
            }
        }
        Ty::Option(inner) => match r.array::<1>().map_err(e)?[0] {
            0 => Value::Null,
            1 => each(inner, r)?,
            _ => return Err("invalid Option tag".into()),
        },
        Ty::Result(ok, err) => match r.array::<1>().map_err(e)?[0] {
            0 => json!({ "Ok": each(ok, r)? }),
            1 => json!({ "Err": each(err, r)? }),
            _ => return Err("invalid Result tag".into()),
        },
        Ty::Tuple(items) => Value::Array(items.iter().map(|t| each(t, r)).collect::<Result<_, _>>()?),
        Ty::In(inner) => each(inner, r)?,
        Ty::Array(t, n) if **t == (Ty::Int { bytes: 1, signed: false }) => show_bytes(r.take(*n).map_err(e)?),
        Ty::Array(t, n) => Value::Array((0..*n).map(|_| each(t, r)).collect::<Result<_, _>>()?),
        Ty::Out | Ty::InOut => return Err("a buffer is not a result".into()),
        Ty::Named(name) => match types.get(name)? {
            Def::Struct(fields) => decode_fields(fields, types, r, depth)?,
            Def::Enum(variants) => {
                let index = u32::from_le_bytes(r.array().map_err(e)?) as usize;
                let (variant, fields) = variants.get(index).ok_or_else(|| format!("{name} has no variant {index}"))?;
                match fields {
                    Fields::Unit => Value::String(variant.clone()),
                    fields => json!({ variant.as_str(): decode_fields(fields, types, r, depth)? }),
                }
            }
        },
    })
}

fn decode_fields(fields: &Fields, types: &Types, r: &mut Reader<'_>, depth: usize) -> Result<Value, String> {
    Ok(match fields {
        Fields::Unit => Value::Null,
        Fields::Tuple(items) if items.len() == 1 => decode_at(&items[0], types, r, depth + 1)?,
        Fields::Tuple(items) => {
            Value::Array(items.iter().map(|t| decode_at(t, types, r, depth + 1)).collect::<Result<_, _>>()?)
        }
        Fields::Named(named) => {
            let mut o = Map::new();
            for (n, t) in named {
                o.insert(n.clone(), decode_at(t, types, r, depth + 1)?);
            }
            Value::Object(o)
        }
    })
}

#[cfg(test)]
mod tests;
