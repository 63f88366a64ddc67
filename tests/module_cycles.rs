//! No module imports one that imports it back (ARCHITECTURE.md: imports
//! flow one way). Reads every file under `src/`, resolves the `crate::`,
//! `super::` and `self::` paths of its non-test code to the modules they
//! name, and fails on any cycle, between top-level modules or between
//! siblings of one directory. A module's own parent and children do not
//! count: a parent re-exports its children, and children use their
//! parent's items.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every module file's module path (`src/http/codec/mod.rs` is
/// `["http", "codec"]`) and its code without comments and test modules.
fn modules() -> BTreeMap<Module, String> {
    fn walk(dir: &Path, out: &mut BTreeMap<Module, String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
                continue;
            }
            let rel = path.strip_prefix(root()).unwrap().with_extension("");
            let mut module: Module = rel.iter().map(|p| p.to_str().unwrap().to_string()).collect();
            let last = module.last().unwrap().clone();
            if path.extension().is_none_or(|e| e != "rs") || last.ends_with("tests") {
                continue;
            }
            if last == "mod" {
                module.pop();
            }
            if module == ["lib"] || module == ["main"] {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap();
            let code: String = code.lines().map(|l| l.split("//").next().unwrap()).collect::<Vec<_>>().join("\n");
            out.insert(module, code);
        }
    }
    let mut out = BTreeMap::new();
    walk(&root(), &mut out);
    out
}

/// The paths a file names: `crate::a::b`, and each item of a group
/// `crate::a::{b, c::d}` as `crate::a::b` and `crate::a::c::d`.
fn paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for start in ["crate::", "super::", "self::"] {
        for (at, _) in code.match_indices(start) {
            if code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let rest = &code[at..];
            let head_len = rest.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).unwrap_or(rest.len());
            let head = rest[..head_len].trim_end_matches(':');
            out.push(head.to_string());
            if rest[head_len..].starts_with('{') {
                let group = &rest[head_len + 1..rest.find('}').unwrap_or(rest.len())];
                for item in group.split([',', '{']) {
                    let item = item.trim().split(" as ").next().unwrap().trim_end_matches(':');
                    if !item.is_empty() {
                        out.push(format!("{head}::{item}"));
                    }
                }
            }
        }
    }
    out
}

/// The module `path`, seen from `from`, names: its longest prefix that is a module.
fn resolve(from: &Module, path: &str, known: &BTreeSet<Module>) -> Option<Module> {
    let mut segs = path.split("::").peekable();
    let mut abs: Module = match segs.next()? {
        "crate" => Vec::new(),
        "self" => from.clone(),
        "super" => from[..from.len().saturating_sub(1)].to_vec(),
        _ => return None,
    };
    while segs.peek() == Some(&"super") {
        segs.next();
        abs.pop();
    }
    abs.extend(segs.map(str::to_string));
    (1..=abs.len()).rev().map(|n| abs[..n].to_vec()).find(|m| known.contains(m))
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let mods = modules();
    let known: BTreeSet<Module> = mods.keys().cloned().collect();
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (m, code) in &mods {
        for p in paths(code) {
            let Some(to) = resolve(m, &p, &known) else { continue };
            if to.starts_with(m) || m.starts_with(&to) {
                continue;
            }
            // `a::x` using `b::y` is `a` using `b`: both sides are cut to
            // the first segment below their common parent, so a cycle
            // between two directories counts even when no single file
            // pair closes it.
            let common = m.iter().zip(&to).take_while(|(a, b)| a == b).count();
            edges.entry(m[..=common].to_vec()).or_default().insert(to[..=common].to_vec());
        }
    }
    assert!(
        edges.get(&vec!["http".to_string()]).is_some_and(|e| e.contains(&vec!["registry".to_string()])),
        "the reader sees imports"
    );
    let reaches = |from: &Module, target: &Module| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(m) = stack.pop() {
            if &m == target {
                return true;
            }
            if seen.insert(m.clone()) {
                stack.extend(edges.get(&m).into_iter().flatten().cloned());
            }
        }
        false
    };
    let cycles: Vec<String> = edges
        .iter()
        .flat_map(|(a, tos)| {
            tos.iter().filter(|b| reaches(b, a)).map(move |b| format!("{} -> {}", a.join("::"), b.join("::")))
        })
        .collect();
    assert!(cycles.is_empty(), "modules that reach back to themselves: {cycles:#?}");
}
