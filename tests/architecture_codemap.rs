//! ARCHITECTURE.md's codemap names every module file under `src/`, and
//! names none that does not exist, so the map cannot drift from the tree.
//!
//! A file is named either by its path (`src/hash.rs`) or, inside the bullet
//! of its directory (the bullet that names `src/dir/` first), by its path
//! below that directory (`server.rs`, `codec/scan.rs`). A directory's
//! `mod.rs` is named by the directory itself. Files ending in `tests.rs`
//! hold the unit tests of the module beside them and need no entry.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `src/`, as `src/...` paths.
fn module_files() -> BTreeSet<String> {
    fn walk(dir: &Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(root()).unwrap().to_str().unwrap().to_string();
                out.insert(rel);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(&root().join("src"), &mut out);
    out
}

/// The codemap's bullets, each joined into one line.
fn codemap_bullets() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let start = text.find("\n## Codemap\n").expect("ARCHITECTURE.md has a `## Codemap` section");
    let rest = &text[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 3);
    let mut bullets: Vec<String> = Vec::new();
    for line in rest[..end].lines().skip(1) {
        if let Some(item) = line.strip_prefix("- ") {
            bullets.push(item.to_string());
        } else if let Some(last) = bullets.last_mut() {
            last.push(' ');
            last.push_str(line.trim());
        }
    }
    assert!(!bullets.is_empty(), "the codemap has no bullets");
    bullets
}

/// Backticked words of a bullet.
fn quoted(bullet: &str) -> Vec<&str> {
    bullet.split('`').skip(1).step_by(2).collect()
}

/// The `src/` file paths a bullet names: full paths, and paths relative to
/// the first `src/.../` directory the bullet names.
fn named_files(bullet: &str) -> BTreeSet<String> {
    let words = quoted(bullet);
    let dir = words.iter().find(|w| w.starts_with("src/") && w.ends_with('/'));
    let mut out = BTreeSet::new();
    for w in &words {
        if w.starts_with("src/") {
            if w.ends_with('/') {
                out.insert(format!("{w}mod.rs"));
            } else if w.ends_with(".rs") {
                out.insert(w.to_string());
            }
        } else if let Some(dir) = dir {
            if w.ends_with(".rs") && !w.contains(' ') && !w.starts_with("tests/") && !w.starts_with("benches/") {
                out.insert(format!("{dir}{w}"));
            } else if w.ends_with('/') && !w.contains(' ') && !w.contains("tests/") && !w.contains("benches/") {
                out.insert(format!("{dir}{w}mod.rs"));
            }
        }
    }
    out
}

#[test]
fn every_module_file_is_in_the_codemap() {
    let named: BTreeSet<String> = codemap_bullets().iter().flat_map(|b| named_files(b)).collect();
    let missing: Vec<String> =
        module_files().into_iter().filter(|f| !f.ends_with("tests.rs") && !named.contains(f)).collect();
    assert!(missing.is_empty(), "ARCHITECTURE.md's codemap does not name {missing:?}: add a line on what each is for");
}

#[test]
fn the_codemap_names_only_files_that_exist() {
    let files = module_files();
    let stale: Vec<String> =
        codemap_bullets().iter().flat_map(|b| named_files(b)).filter(|f| !files.contains(f)).collect();
    assert!(stale.is_empty(), "ARCHITECTURE.md's codemap names {stale:?}, which do not exist under src/");
}

#[test]
fn the_codemap_names_only_tests_and_benches_that_exist() {
    let stale: Vec<String> = codemap_bullets()
        .iter()
        .flat_map(|b| quoted(b).into_iter().map(str::to_string).collect::<Vec<_>>())
        .filter(|w| (w.starts_with("tests/") || w.starts_with("benches/")) && !w.contains(' '))
        .filter(|w| !root().join(w).exists())
        .collect();
    assert!(stale.is_empty(), "ARCHITECTURE.md's codemap names {stale:?}, which do not exist");
}
