//! The declaration table in src/config/table.rs is the one place a variable is written:
//! `docs/configuration.md` is generated from it and checked in (this test fails when they
//! differ; `FERROCE_BLESS=1 cargo test --release --test config_table` rewrites it), and no other
//! code in src/ or doctor/src/ spells a declared name as a string literal (tests excepted).

use nccl_net_ferroce::config::{doc, tunables};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn checked_in_docs_match_the_declaration() {
    let path = root().join("docs/configuration.md");
    let generated = doc::markdown();
    if std::env::var_os("FERROCE_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().expect("docs/")).expect("mkdir docs");
        std::fs::write(&path, &generated).expect("write docs/configuration.md");
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "{} differs from src/config/table.rs: run FERROCE_BLESS=1 cargo test --release --test config_table \
         and commit it",
        path.display()
    );
}

#[test]
fn the_docs_list_every_declared_variable_with_its_default() {
    let generated = doc::markdown();
    for t in tunables() {
        let row = format!("| `{}` | {} | {}", t.name, t.ty, t.default);
        assert!(generated.contains(&row), "no row starting {row}");
    }
}

/// The text of a Rust file without its `#[cfg(test)]` items: an item that opens a block is
/// skipped up to the `}` at its own indentation (rustfmt's layout), any other up to its line.
fn without_tests(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "#[cfg(test)]" {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let Some(item) = lines.next() else { break };
        if item.trim_end().ends_with('{') {
            let indent = &item[..item.len() - item.trim_start().len()];
            let close = format!("{indent}}}");
            for inner in lines.by_ref() {
                if inner.trim_end() == close {
                    break;
                }
            }
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") && path.file_name().is_some_and(|n| n != "tests.rs") {
            out.push(path);
        }
    }
}

/// How often each file spells `"name"`, tests left out.
fn literal_count(files: &[(PathBuf, String)], name: &str) -> Vec<(String, usize)> {
    let literal = format!("\"{name}\"");
    files
        .iter()
        .map(|(path, text)| (path.display().to_string(), text.matches(&literal).count()))
        .filter(|(_, n)| *n > 0)
        .collect()
}

#[test]
fn each_declared_name_is_written_once() {
    let mut paths = Vec::new();
    rust_files(&root().join("src"), &mut paths);
    rust_files(&root().join("doctor/src"), &mut paths);
    let files: Vec<(PathBuf, String)> = paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, without_tests(&text))
        })
        .collect();
    let table = root().join("src/config/table.rs").display().to_string();
    let declared = tunables();
    assert!(declared.len() > 40, "the table declares {} variables", declared.len());
    for t in declared {
        let found = literal_count(&files, t.name);
        assert_eq!(
            found,
            vec![(table.clone(), 1)],
            "{} must be written once, in the table (elsewhere: config::var::{})",
            t.name,
            t.field
        );
    }
}

#[test]
fn test_items_are_left_out_and_the_rest_kept() {
    let text = "a\n#[cfg(test)]\nmod tests {\n    b\n    fn c() {\n    }\n}\nd\n    #[cfg(test)]\n    e;\n    f\n";
    assert_eq!(without_tests(text), "a\nd\n    f\n");
}
