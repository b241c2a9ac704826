//! The shape of what travels: each type's encoding described as text, so that client and server can
//! tell at bind time whether they agree on every byte, and a tool can read and write any value.
//!
//! A shape is written in a small language that follows the encoding, not the spelling: `&str` and
//! `String` are both `String`, `&[u8]` and `Vec<u8>` both `Vec<u8>`, `HashMap` and `BTreeMap` both
//! `Map<K, V>`, `HashSet` and `BTreeSet` both `Set<T>`, `Box<T>` is `T`, `usize` is `u64`:
//!
//! ```text
//! ()  bool  char  u8 … u128  i8 … i128  f32  f64  String
//! Vec<T>  [T; N]  (A, B, …)  Option<T>  Result<T, E>  Map<K, V>  Set<T>
//! Name                       a type of yours (#[derive(Wire)]), defined once:
//! type Name = struct { field: T, … }      struct (T, …)      struct
//! type Name = enum { Unit, Tuple(T, …), Named { field: T, … } }   (a u32 tag, then the fields)
//! opaque(path::Name)         a hand-written `Wire` or a `Serde<T>`, known only by its name
//! ```
//!
//! An interface's signature is one line per procedure, `name(shape, …) -> shape`, then one line per
//! type of yours that any procedure reaches, `type Name = …`. A procedure's own fingerprint covers its
//! line and the definitions it reaches, so that two sides agree on a procedure exactly when they agree
//! on every byte its calls and results carry.

use super::Wire;

/// The types of yours an interface reaches, each defined once.
#[derive(Debug, Default)]
pub struct Shapes {
    /// Each user type's name (as written in shapes), Rust name and definition, in the order met (a
    /// definition under way has an empty text: a recursive type names itself, it is not expanded).
    defs: Vec<Def>,
}

#[derive(Debug)]
struct Def {
    name: String,
    rust: &'static str,
    text: String,
}

/// Where a type writes its shape ([`Wire::shape`]).
#[derive(Debug)]
pub struct Shape<'s> {
    out: String,
    shapes: &'s mut Shapes,
}

impl Shape<'_> {
    /// Writes `text` as it is (a primitive's name, punctuation).
    pub fn write(&mut self, text: &str) {
        self.out.push_str(text);
    }

    /// Writes the shape of `T`.
    pub fn of<'de, T: Wire<'de>>(&mut self) {
        T::shape(self);
    }

    /// Writes the name of a type of yours, `T`, shown as `name`, defined by `define` the first time it
    /// is met (`#[derive(Wire)]` calls this). Two types shown with the same name are told apart by a
    /// suffix (`Item#2`).
    pub fn named<T: ?Sized>(&mut self, name: &str, define: impl FnOnce(&mut Shape<'_>)) {
        let rust = core::any::type_name::<T>();
        let index = match self.shapes.defs.iter().position(|d| d.rust == rust) {
            Some(i) => i,
            None => {
                let taken = self
                    .shapes
                    .defs
                    .iter()
                    .filter(|d| d.name == name || d.name.starts_with(&format!("{name}#")))
                    .count();
                let shown = if taken == 0 { name.to_owned() } else { format!("{name}#{}", taken + 1) };
                let index = self.shapes.defs.len();
                self.shapes.defs.push(Def { name: shown, rust, text: String::new() });
                let mut inner = Shape { out: String::new(), shapes: &mut *self.shapes };
                define(&mut inner);
                let text = inner.out;
                self.shapes.defs[index].text = text;
                index
            }
        };
        self.out.push_str(&self.shapes.defs[index].name);
    }

    /// Writes a type known only by its Rust name (the default of [`Wire::shape`]).
    pub fn opaque<T: ?Sized>(&mut self) {
        self.out.push_str("opaque(");
        self.out.push_str(core::any::type_name::<T>());
        self.out.push(')');
    }
}

impl Shapes {
    /// Describes one procedure, `name(shape, …) -> shape`: `args` write its arguments' shapes, each
    /// through the [`Shape`] it is given, `result` its result's (`None`: it returns `()`).
    pub fn procedure(
        &mut self,
        name: &str,
        args: &[&dyn Fn(&mut Shape<'_>)],
        result: Option<&dyn Fn(&mut Shape<'_>)>,
    ) -> String {
        let mut s = Shape { out: format!("{name}("), shapes: self };
        for (i, arg) in args.iter().enumerate() {
            if i > 0 {
                s.write(", ");
            }
            arg(&mut s);
        }
        s.write(")");
        if let Some(result) = result {
            s.write(" -> ");
            result(&mut s);
        }
        s.out
    }

    /// Every definition met so far, one `type Name = …` line each, in the order met.
    pub fn definitions(&self) -> impl Iterator<Item = String> + '_ {
        self.defs.iter().map(|d| format!("type {} = {}", d.name, d.text))
    }
}

/// Where `name` stands in `text` as a whole name (not part of a longer one such as `Item#2` or
/// `Pair<u32>` for `Pair`).
fn names(text: &str, name: &str) -> bool {
    let boundary_before = |i: usize| text[..i].chars().next_back().is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
    let boundary_after =
        |j: usize| text[j..].chars().next().is_none_or(|c| !(c.is_alphanumeric() || matches!(c, '_' | '#' | '<')));
    text.match_indices(name).any(|(i, m)| boundary_before(i) && boundary_after(i + m.len()))
}

/// Each procedure of a signature (its lines before the `type` lines), with its own shape: its line
/// and every definition it reaches, directly or through other definitions, in the signature's order.
/// Both sides of a bind and `tiercel list` compute it from the same text, so they agree exactly when
/// the procedure's calls and results carry the same bytes.
pub fn procedure_shapes(signature: &str) -> Vec<(&str, String)> {
    let (lines, types): (Vec<&str>, Vec<&str>) =
        signature.lines().filter(|l| !l.is_empty()).partition(|l| !l.starts_with("type "));
    let defined: Vec<(&str, &str)> =
        types.iter().filter_map(|t| t.strip_prefix("type ")?.split_once(" = ").map(|(n, _)| (n, *t))).collect();
    lines
        .iter()
        .map(|line| {
            let name = line.split('(').next().unwrap_or(line);
            let mut reached = vec![false; defined.len()];
            let mut next = vec![*line];
            while let Some(text) = next.pop() {
                for (i, (n, def)) in defined.iter().enumerate() {
                    if !reached[i] && names(text, n) {
                        reached[i] = true;
                        next.push(def);
                    }
                }
            }
            let mut shape = (*line).to_owned();
            for (i, (_, def)) in defined.iter().enumerate() {
                if reached[i] {
                    shape.push('\n');
                    shape.push_str(def);
                }
            }
            (name, shape)
        })
        .collect()
}

/// The name a type of yours is shown by: its Rust name without module paths
/// (`app::model::Pair<u32>` is `Pair<u32>`).
pub fn short_name(rust: &str) -> String {
    let mut out = String::with_capacity(rust.len());
    let mut word = String::new();
    let mut chars = rust.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_alphanumeric() || c == '_' {
            word.push(c);
        } else if c == ':' && chars.peek() == Some(&':') {
            chars.next();
            word.clear();
        } else {
            out.push_str(&word);
            word.clear();
            out.push(c);
        }
    }
    out.push_str(&word);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_lose_their_module_paths() {
        assert_eq!(short_name("app::model::Pair<alloc::string::String, u32>"), "Pair<String, u32>");
        assert_eq!(short_name("Order"), "Order");
    }

    #[test]
    fn standard_types_are_described_by_their_encoding() {
        let mut shapes = Shapes::default();
        let d = shapes.procedure(
            "f",
            &[
                &|s| s.of::<&str>(),
                &|s| s.of::<Vec<u8>>(),
                &|s| s.of::<std::collections::HashMap<u32, Option<String>>>(),
                &|s| s.of::<(bool, [u16; 4], Box<i64>, usize)>(),
            ],
            Some(&|s| s.of::<Result<std::collections::BTreeSet<char>, ()>>()),
        );
        assert_eq!(
            d,
            "f(String, Vec<u8>, Map<u32, Option<String>>, (bool, [u16; 4], i64, u64)) -> Result<Set<char>, ()>"
        );
        assert_eq!(shapes.definitions().count(), 0);
    }

    #[test]
    fn a_procedure_reaches_the_definitions_it_names_and_theirs() {
        let signature = "a(Order) -> u8\nb(Item#2)\nc(Pair<u32>)\ntype Order = struct { items: Vec<Item> }\n\
                         type Item = struct { n: u8 }\ntype Item#2 = enum { X }\ntype Pair<u32> = struct(u32, u32)\n\
                         type Pair = struct";
        let shapes = procedure_shapes(signature);
        assert_eq!(shapes.len(), 3);
        assert_eq!(
            shapes[0],
            ("a", "a(Order) -> u8\ntype Order = struct { items: Vec<Item> }\ntype Item = struct { n: u8 }".to_owned())
        );
        assert_eq!(shapes[1], ("b", "b(Item#2)\ntype Item#2 = enum { X }".to_owned()));
        assert_eq!(shapes[2], ("c", "c(Pair<u32>)\ntype Pair<u32> = struct(u32, u32)".to_owned()));
    }
}
