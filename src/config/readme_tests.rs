//! README's configuration table against `FLAGS`: every flag has a row with
//! its default, and no row names a flag that does not exist (`--help` and
//! `--version` are `COMMANDS`).

use super::flags::{find, COMMANDS, FLAGS};

/// README's configuration table: the first table whose rows start with a
/// backticked flag, as (flags named in the first column, default) per row.
fn readme_rows() -> Vec<(Vec<String>, String)> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let rows: Vec<&str> =
        readme.lines().skip_while(|l| !l.starts_with("| `--")).take_while(|l| l.starts_with('|')).collect();
    assert!(!rows.is_empty(), "README.md has no configuration table (rows starting \"| `--\")");
    rows.iter()
        .map(|row| {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            assert!(cells.len() >= 4, "a configuration row has a flag, a default and a meaning: {row}");
            let flags = cells[1]
                .split('`')
                .skip(1)
                .step_by(2)
                .map(|w| w.split_whitespace().next().unwrap_or_default().to_string())
                .collect();
            (flags, cells[2].to_string())
        })
        .collect()
}

#[test]
fn every_flag_has_a_readme_row_with_its_default() {
    let rows = readme_rows();
    for f in FLAGS {
        let spellings: Vec<&str> = std::iter::once(f.name).chain(f.aliases.iter().copied()).collect();
        let row = rows.iter().find(|(flags, _)| flags.iter().any(|n| spellings.contains(&n.as_str())));
        let Some((_, default)) = row else { panic!("README's configuration table has no row for {}", f.name) };
        assert_eq!(default, f.default, "README's default of {} differs from the flag table's", f.name);
    }
}

#[test]
fn every_readme_row_names_a_flag_that_exists() {
    for (flags, _) in readme_rows() {
        assert!(!flags.is_empty(), "a configuration row names no flag");
        for n in flags {
            let command = COMMANDS.iter().any(|&(_, long, _)| long == n);
            assert!(find(&n).is_some() || command, "README's configuration table names {n}, which is no flag");
        }
    }
}
