//! Layers that point one way: in every crate of the workspace, at every level of the module tree,
//! the modules side by side (each with everything under it) use each other without a circle, so
//! that each can be read knowing only those it uses. A module's own children are not its peers:
//! `server/mod.rs` and `server/udp.rs` may use each other, `server::tcp` and `server::udp` may not
//! both use the other, and neither may `client` and `server`. The server and the client of the
//! `tiercel` crate do not use each other at all: what both need lives where both can reach it.
//!
//! The check reads the sources: every path that starts with `crate::`, `super::` or `self::` (in
//! `use` declarations, braces and all, and in code), resolved to the module it names.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module's path from its crate's root: `["server", "tcp"]`.
type Module = Vec<String>;

/// The modules of a crate, each with the modules its file refers to.
fn modules_of(src: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut files = Vec::new();
    collect(src, &mut files);
    let mut modules: BTreeMap<Module, String> = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(src).unwrap();
        let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
        let last = parts.pop().unwrap();
        let stem = last.trim_end_matches(".rs");
        if !matches!(stem, "lib" | "main" | "mod") {
            parts.push(stem.to_owned());
        }
        // A binary's modules (`src/bin/x.rs`) are crates of their own; skip them.
        if parts.first().is_some_and(|p| p == "bin") {
            continue;
        }
        modules.insert(parts, strip_comments(&std::fs::read_to_string(&file).unwrap()));
    }
    let known: BTreeSet<Module> = modules.keys().cloned().collect();
    modules
        .iter()
        .map(|(module, text)| {
            let used = paths(text)
                .into_iter()
                .filter_map(|path| resolve(module, &path, &known))
                .filter(|target| target != module)
                .collect();
            (module.clone(), used)
        })
        .collect()
}

fn collect(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

/// The text without comments (doc comments name modules they do not use).
fn strip_comments(text: &str) -> String {
    text.lines().map(|line| line.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// Every path in `text` that starts at `crate`, `super` or `self`, braces of `use` expanded.
fn paths(text: &str) -> Vec<Vec<String>> {
    let bytes: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let starts_word = i == 0 || !(bytes[i - 1].is_alphanumeric() || bytes[i - 1] == '_' || bytes[i - 1] == ':');
        if starts_word {
            for root in ["crate::", "super::", "self::"] {
                let r: Vec<char> = root.chars().collect();
                if bytes[i..].starts_with(&r) {
                    let prefix = vec![root.trim_end_matches("::").to_owned()];
                    let (found, end) = path_tree(&bytes, i + r.len(), prefix);
                    out.extend(found);
                    i = end;
                    break;
                }
            }
        }
        i += 1;
    }
    out
}

/// Reads a path (or a `{…}` group of them) at `at`, after `prefix`: the full paths and where it ends.
fn path_tree(c: &[char], mut at: usize, prefix: Vec<String>) -> (Vec<Vec<String>>, usize) {
    let skip_space = |at: &mut usize| {
        while *at < c.len() && c[*at].is_whitespace() {
            *at += 1;
        }
    };
    skip_space(&mut at);
    if at < c.len() && c[at] == '{' {
        let mut all = Vec::new();
        at += 1;
        loop {
            skip_space(&mut at);
            if at >= c.len() {
                return (all, at);
            }
            if c[at] == '}' {
                return (all, at + 1);
            }
            if c[at] == ',' {
                at += 1;
                continue;
            }
            let (found, end) = path_tree(c, at, prefix.clone());
            all.extend(found);
            // Skip `as name` and anything else up to the next `,` or `}` of this group.
            at = end;
            while at < c.len() && c[at] != ',' && c[at] != '}' {
                at += 1;
            }
        }
    }
    let mut path = prefix;
    loop {
        let start = at;
        while at < c.len() && (c[at].is_alphanumeric() || c[at] == '_') {
            at += 1;
        }
        if at == start {
            return (vec![path], at);
        }
        path.push(c[start..at].iter().collect());
        if c[at..].starts_with(&[':', ':']) {
            at += 2;
            if at < c.len() && c[at] == '{' {
                return path_tree(c, at, path);
            }
        } else {
            return (vec![path], at);
        }
    }
}

/// The module `path` (written in `module`) names: its longest prefix that is a module.
fn resolve(module: &Module, path: &[String], known: &BTreeSet<Module>) -> Option<Module> {
    let mut base: Module = match path[0].as_str() {
        "crate" => Vec::new(),
        "self" => module.clone(),
        _ => module.clone(),
    };
    let mut rest = &path[1..];
    if path[0] == "super" {
        base.pop();
        while rest.first().is_some_and(|p| p == "super") {
            base.pop();
            rest = &rest[1..];
        }
    }
    let mut best = known.contains(&base).then(|| base.clone());
    for part in rest {
        base.push(part.clone());
        if known.contains(&base) {
            best = Some(base.clone());
        } else {
            break;
        }
    }
    best
}

/// The circles among siblings: for each parent, its children (each with what is under it) as
/// nodes, an edge where one's files refer to the other's. Each circle as the children in it.
fn circles(uses: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<(Module, Vec<String>)> {
    let parents: BTreeSet<Module> = uses.keys().filter(|m| !m.is_empty()).map(|m| m[..m.len() - 1].to_vec()).collect();
    let mut found = Vec::new();
    for parent in parents {
        let child_of = |m: &Module| -> Option<String> {
            (m.len() > parent.len() && m[..parent.len()] == parent[..]).then(|| m[parent.len()].clone())
        };
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, targets) in uses {
            let Some(a) = child_of(from) else { continue };
            for to in targets {
                if let Some(b) = child_of(to).filter(|b| *b != a) {
                    edges.entry(a.clone()).or_default().insert(b);
                }
            }
        }
        for scc in strongly_connected(&edges) {
            if scc.len() > 1 {
                found.push((parent.clone(), scc));
            }
        }
    }
    found
}

/// Tarjan's strongly connected components of `edges`.
fn strongly_connected(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        if let Some(next) = s.edges.get(v) {
            for w in next {
                if !s.index.contains_key(w.as_str()) {
                    visit(s, w);
                    let lw = s.low[w.as_str()];
                    let lv = s.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if s.on_stack.contains(w.as_str()) {
                    let iw = s.index[w.as_str()];
                    let lv = s.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
        }
        if s.low[v] == s.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                scc.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            scc.sort();
            s.out.push(scc);
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    let nodes: BTreeSet<&str> =
        edges.iter().flat_map(|(a, bs)| std::iter::once(a.as_str()).chain(bs.iter().map(String::as_str))).collect();
    for v in nodes {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

#[test]
fn no_crate_has_an_import_circle() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut report = Vec::new();
    let mut checked = 0;
    for entry in std::fs::read_dir(crates).unwrap().flatten() {
        let src = entry.path().join("src");
        if !src.is_dir() {
            continue;
        }
        checked += 1;
        let name = entry.file_name().to_string_lossy().into_owned();
        for (parent, circle) in circles(&modules_of(&src)) {
            let at = if parent.is_empty() { name.clone() } else { format!("{name}::{}", parent.join("::")) };
            report.push(format!("{at}: {}", circle.join(" ⇄ ")));
        }
    }
    assert!(checked >= 7, "found only {checked} crates under {}", crates.display());
    assert!(report.is_empty(), "modules that use each other in a circle:\n  {}", report.join("\n  "));
}

#[test]
fn the_server_and_the_client_never_use_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().join("tiercel/src");
    let uses = modules_of(&src);
    let under = |m: &Module, top: &str| m.first().is_some_and(|t| t == top);
    for (from, to) in [("server", "client"), ("client", "server")] {
        let crossing: Vec<String> = uses
            .iter()
            .filter(|(m, _)| under(m, from))
            .flat_map(|(m, targets)| targets.iter().filter(|t| under(t, to)).map(move |t| (m, t)))
            .map(|(m, t)| format!("{} uses {}", m.join("::"), t.join("::")))
            .collect();
        assert!(crossing.is_empty(), "the {from} uses the {to}: {crossing:?}");
    }
}

#[test]
fn the_check_finds_a_circle_and_reads_braces() {
    let text = "use crate::{a::{b, c as d}, e};\nfn f() { super::g::h(); } // crate::z";
    let got = paths(text);
    let want: Vec<Vec<String>> =
        [vec!["crate", "a", "b"], vec!["crate", "a", "c"], vec!["crate", "e"], vec!["super", "g", "h"]]
            .iter()
            .map(|p| p.iter().map(|s| s.to_string()).collect())
            .collect();
    assert_eq!(paths(&strip_comments(text)), want);
    assert_eq!(got.len(), 5, "comments are stripped before, not by `paths`");
    let m = |s: &str| -> Module { s.split("::").filter(|p| !p.is_empty()).map(str::to_owned).collect() };
    let uses: BTreeMap<Module, BTreeSet<Module>> =
        [(m("a"), [m("b")].into()), (m("b::x"), [m("a")].into()), (m("b"), BTreeSet::new()), (m("c"), [m("a")].into())]
            .into();
    assert_eq!(circles(&uses), vec![(Vec::new(), vec!["a".to_owned(), "b".to_owned()])]);
}
