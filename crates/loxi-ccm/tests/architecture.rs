//! The subsystem table of `docs/architecture.md` is the law of the controller crate: every
//! `crate::<subsystem>` path in a subsystem's code must be an arrow the table allows, and the
//! arrows between subsystems form no cycle. The document and this test read the same table.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Subsystem -> the subsystems it may use, from the table between the markers.
fn allowed_arrows() -> BTreeMap<String, BTreeSet<String>> {
    let doc = crate_dir().join("../../docs/architecture.md");
    let text = std::fs::read_to_string(&doc).expect("docs/architecture.md");
    let begin = text
        .find("<!-- subsystems:begin -->")
        .expect("the subsystem table's begin marker");
    let end = text
        .find("<!-- subsystems:end -->")
        .expect("the subsystem table's end marker");
    let mut table = BTreeMap::new();
    for line in text[begin..end].lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // | `name` | owns | `a`, `b` |
        if cells.len() < 4 || !cells[1].starts_with('`') {
            continue;
        }
        let name = cells[1].trim_matches('`').to_string();
        let uses: BTreeSet<String> = cells[cells.len() - 2]
            .split(',')
            .map(|s| s.trim().trim_matches('`').to_string())
            .filter(|s| !s.is_empty() && s != "–" && s != "-")
            .collect();
        table.insert(name, uses);
    }
    assert!(!table.is_empty(), "no rows read from the subsystem table");
    table
}

/// Every `.rs` file under `path` (a file or a folder).
fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        for entry in std::fs::read_dir(path).expect("readable source folder") {
            rust_files(&entry.expect("entry").path(), out);
        }
    } else if path.extension().is_some_and(|e| e == "rs") {
        out.push(path.to_path_buf());
    }
}

/// The subsystems a piece of code names through `crate::<name>` (comments skipped).
fn named_subsystems(code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in code.lines() {
        let line = line.trim_start();
        if line.starts_with("//") {
            continue;
        }
        let line = line.split(" //").next().unwrap_or(line);
        let mut rest = line;
        while let Some(at) = rest.find("crate::") {
            let tail = &rest[at + "crate::".len()..];
            let name: String = tail
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                names.insert(name);
            }
            rest = tail;
        }
    }
    names
}

/// Subsystem -> the subsystems its code really uses.
fn actual_arrows() -> BTreeMap<String, BTreeSet<String>> {
    let src = crate_dir().join("src");
    let mut arrows = BTreeMap::new();
    for entry in std::fs::read_dir(&src).expect("src") {
        let path = entry.expect("entry").path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if stem == "lib" || stem == "main" {
            continue;
        }
        let mut files = Vec::new();
        rust_files(&path, &mut files);
        let mut uses = BTreeSet::new();
        for file in files {
            let code = std::fs::read_to_string(&file).expect("readable source");
            uses.extend(named_subsystems(&code));
        }
        uses.remove(stem);
        arrows.insert(stem.to_string(), uses);
    }
    arrows
}

fn cycle(arrows: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        arrows: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut found = path[at..].to_vec();
            found.push(node.to_string());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in arrows.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, arrows, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for node in arrows.keys() {
        if let Some(c) = visit(node, arrows, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

#[test]
fn every_subsystem_is_in_the_table() {
    let table = allowed_arrows();
    let actual = actual_arrows();
    let missing: Vec<&String> = actual.keys().filter(|s| !table.contains_key(*s)).collect();
    assert!(
        missing.is_empty(),
        "subsystems without a row in docs/architecture.md: {missing:?}"
    );
    let stale: Vec<&String> = table.keys().filter(|s| !actual.contains_key(*s)).collect();
    assert!(
        stale.is_empty(),
        "rows in docs/architecture.md without a subsystem: {stale:?}"
    );
}

#[test]
fn the_code_uses_only_the_arrows_the_table_allows() {
    let table = allowed_arrows();
    let mut wrong = Vec::new();
    for (from, uses) in actual_arrows() {
        let allowed = table.get(&from).cloned().unwrap_or_default();
        for to in uses.difference(&allowed) {
            wrong.push(format!("{from} -> {to}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "arrows not allowed by docs/architecture.md: {wrong:?}"
    );
}

#[test]
fn the_table_has_no_cycle() {
    let table = allowed_arrows();
    assert_eq!(cycle(&table), None, "a cycle between subsystems");
}

#[test]
fn a_cycle_and_a_wrong_arrow_are_seen() {
    let mut arrows = BTreeMap::new();
    arrows.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    arrows.insert("b".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(
        cycle(&arrows),
        Some(vec!["a".to_string(), "b".to_string(), "a".to_string()])
    );
    let code = "use crate::ipam::Ipam;\n// crate::runtime in a comment\nlet x = crate::k8s::api::client();";
    assert_eq!(
        named_subsystems(code),
        BTreeSet::from(["ipam".to_string(), "k8s".to_string()])
    );
}
