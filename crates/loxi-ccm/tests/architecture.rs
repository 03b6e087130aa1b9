//! The subsystem table of `docs/architecture.md` is the law of the controller crate: every
//! `crate::<subsystem>` path in a subsystem's code must be an arrow the table allows, and the
//! arrows between subsystems form no cycle. The document and this test read the same table.
//!
//! Inside a subsystem, its files use each other in no circle either (a type lives where its
//! methods live, or the code that holds it gets a plain handle).
//!
//! Two rules of shape go with it: no source file of the workspace holds more than 1,000
//! lines of code (one concern per file), and `runtime/` only wires subsystems, holding no
//! state of its own (no `Mutex`, `RwLock` or `Notify` outside its tests).

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

/// The first names of the paths after each `prefix` in `code` (`super::`, `crate::ipam::`):
/// `prefix a::b` and `prefix {a, b::{c}, d as e}` name `a` (and `b`, `d`). `self` and a
/// further `super` are not names of files.
fn names_after(code: &str, prefix: &str) -> BTreeSet<String> {
    fn ident(s: &str) -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    }
    let mut names = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().next_back();
        let tail = &rest[at + prefix.len()..];
        rest = tail;
        // `x::super::` or `my_super::` are other paths.
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        if let Some(group) = tail.strip_prefix('{') {
            // The group's top-level items, up to its closing brace.
            let mut depth = 0usize;
            let mut item_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if c.is_whitespace() => {}
                    _ if item_start && depth == 0 => {
                        names.insert(ident(&group[i..]));
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            names.insert(ident(tail));
        }
    }
    names.retain(|n| !n.is_empty() && n != "self" && n != "super");
    names
}

/// What the `mod.rs` of a subsystem re-exports from its files: item -> file
/// (`pub use context::{Context, Settings};`).
fn reexports(mod_rs: &str, files: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    let code = without_comments_and_tests(mod_rs);
    for statement in code.split(';') {
        let statement = statement.trim();
        let Some(path) = ["pub use ", "pub(crate) use "]
            .iter()
            .find_map(|p| statement.strip_prefix(p))
        else {
            continue;
        };
        let Some((file, items)) = path.split_once("::") else {
            continue;
        };
        if !files.contains(file.trim()) {
            continue;
        }
        let items = items.trim().trim_start_matches('{').trim_end_matches('}');
        for item in items.split(',') {
            // `a as b` is used as `b`.
            let used = item.split(" as ").last().unwrap_or(item).trim();
            let used: String = used.rsplit("::").next().unwrap_or(used).trim().to_string();
            if !used.is_empty() {
                map.insert(used, file.trim().to_string());
            }
        }
    }
    map
}

/// File -> the files of the same subsystem it uses, from each file's code: `super::<file>`
/// and `crate::<subsystem>::<file>` paths, and items `mod.rs` re-exports from a file
/// (`super::Context` is `context.rs`'s). Items `mod.rs` defines itself are the subsystem's
/// face, not a file of the circle. A folder `<name>/` belongs to the file `<name>`.
fn file_arrows(
    subsystem: &str,
    files: &BTreeMap<String, Vec<String>>,
    mod_rs: &str,
) -> BTreeMap<String, BTreeSet<String>> {
    let names: BTreeSet<String> = files.keys().cloned().collect();
    let exported = reexports(mod_rs, &names);
    let own_path = format!("crate::{subsystem}::");
    let mut arrows = BTreeMap::new();
    for (file, codes) in files {
        let mut uses = BTreeSet::new();
        for code in codes {
            let code = without_comments_and_tests(code);
            let named = names_after(&code, "super::")
                .into_iter()
                .chain(names_after(&code, &own_path));
            for name in named {
                if names.contains(&name) {
                    uses.insert(name);
                } else if let Some(to) = exported.get(&name) {
                    uses.insert(to.clone());
                }
            }
        }
        uses.remove(file);
        arrows.insert(file.clone(), uses);
    }
    arrows
}

/// Subsystem -> its files (by name, each with the code of the file and of its folder).
/// The files in a folder `<name>/` reach the subsystem's files by `super::super::`, read as
/// `super::` here; their own `super::` names their parent file, which is left out.
fn subsystem_files() -> BTreeMap<String, (BTreeMap<String, Vec<String>>, String)> {
    let src = crate_dir().join("src");
    let mut all = BTreeMap::new();
    for entry in std::fs::read_dir(&src).expect("src") {
        let dir = entry.expect("entry").path();
        if !dir.is_dir() {
            continue;
        }
        let subsystem = dir.file_name().unwrap().to_string_lossy().to_string();
        let mut files: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut mod_rs = String::new();
        for entry in std::fs::read_dir(&dir).expect("subsystem folder") {
            let path = entry.expect("entry").path();
            let stem = path.file_stem().unwrap().to_string_lossy().to_string();
            if path.is_dir() {
                let mut inner = Vec::new();
                rust_files(&path, &mut inner);
                for f in inner {
                    let code = std::fs::read_to_string(&f).expect("readable source");
                    let code = code
                        .replace("super::super::", "\u{1}")
                        .replace("super::", "self::")
                        .replace('\u{1}', "super::");
                    files.entry(stem.clone()).or_default().push(code);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                let code = std::fs::read_to_string(&path).expect("readable source");
                if stem == "mod" {
                    mod_rs = code;
                } else {
                    files.entry(stem).or_default().push(code);
                }
            }
        }
        all.insert(subsystem, (files, mod_rs));
    }
    assert!(
        all.len() > 5,
        "too few subsystem folders found: {}",
        all.len()
    );
    all
}

/// Arrows between files that still close a circle, each with the reason it is left: `(the
/// subsystem, from, to, why)`. Only the arrow is ignored, so a new circle in the same
/// subsystem is still seen.
const CIRCLE_ARROWS_LEFT: &[(&str, &str, &str, &str)] = &[];

#[test]
fn the_files_of_a_subsystem_use_each_other_in_no_circle() {
    let mut circles = Vec::new();
    let mut stale = Vec::new();
    for (subsystem, (files, mod_rs)) in subsystem_files() {
        let mut arrows = file_arrows(&subsystem, &files, &mod_rs);
        for (s, from, to, _) in CIRCLE_ARROWS_LEFT {
            if *s == subsystem {
                let removed = arrows.get_mut(*from).is_some_and(|uses| uses.remove(*to));
                if !removed {
                    stale.push(format!("{s}/: {from} -> {to}"));
                }
            }
        }
        if let Some(c) = cycle(&arrows) {
            circles.push(format!("{subsystem}/: {}", c.join(" -> ")));
        }
    }
    assert!(
        circles.is_empty(),
        "files of one subsystem using each other in a circle (move the type next to its \
         methods, or hand the code a plain handle): {circles:?}"
    );
    assert!(
        stale.is_empty(),
        "arrows left in CIRCLE_ARROWS_LEFT that the code no longer has (drop them): {stale:?}"
    );
}

#[test]
fn a_circle_of_files_is_seen() {
    let files = |list: &[(&str, &str)]| -> BTreeMap<String, Vec<String>> {
        list.iter()
            .map(|(f, code)| (f.to_string(), vec![code.to_string()]))
            .collect()
    };
    // context holds the handle report defines; report's functions take the context (through
    // mod.rs's re-export), and errors names report's type by the full path.
    let planted = files(&[
        (
            "context",
            "use super::report::Report;\npub struct Context { report: Report }",
        ),
        (
            "report",
            "use super::{Context, errors::{self, Error}};\npub struct Report;\n#[cfg(test)]\nmod tests { use super::super::plan; }",
        ),
        (
            "errors",
            "pub enum Error { A(crate::service::plan::Problem) }",
        ),
        (
            "plan",
            "// super::context in a comment\npub struct Problem;",
        ),
    ]);
    let mod_rs = "mod context;\npub use context::{Context, Settings as S};\n";
    let arrows = file_arrows("service", &planted, mod_rs);
    assert_eq!(
        arrows["report"],
        BTreeSet::from(["context".to_string(), "errors".to_string()])
    );
    assert_eq!(arrows["errors"], BTreeSet::from(["plan".to_string()]));
    assert!(arrows["plan"].is_empty());
    assert_eq!(
        cycle(&arrows),
        Some(vec![
            "context".to_string(),
            "report".to_string(),
            "context".to_string()
        ])
    );
    // The handle moved out of the file whose functions take the context: no circle.
    let cut = files(&[
        (
            "context",
            "use super::reporter::Report;\npub struct Context { report: Report }",
        ),
        ("reporter", "pub struct Report;"),
        ("report", "use super::{Context, reporter::Report};"),
    ]);
    assert_eq!(cycle(&file_arrows("service", &cut, mod_rs)), None);
}

/// `code` without its comments (line, doc and block comments; line breaks kept, so line
/// numbers stay) and without its `#[cfg(test)]` modules (attribute to closing brace). String
/// and character literals are read as such, so a `//` or a brace inside one is not taken
/// for a comment or a block.
fn without_comments_and_tests(code: &str) -> String {
    let chars: Vec<char> = code.chars().collect();
    let mut out = String::with_capacity(code.len());
    let mut i = 0;
    // Brace depth, and the depth at which the test module being skipped ends.
    let mut depth = 0usize;
    let mut skip_until: Option<usize> = None;
    let at = |i: usize, s: &str| {
        s.chars()
            .enumerate()
            .all(|(k, c)| chars.get(i + k) == Some(&c))
    };
    while i < chars.len() {
        let c = chars[i];
        let skipping = skip_until.is_some();
        let keep = |s: &str, out: &mut String| {
            if skipping {
                // Only the line breaks of what is skipped are kept.
                out.extend(s.chars().filter(|c| *c == '\n'));
            } else {
                out.push_str(s);
            }
        };
        if at(i, "//") {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
            continue;
        }
        if at(i, "/*") {
            // Rust's block comments nest.
            let mut nested = 0;
            while i < chars.len() {
                if at(i, "/*") {
                    nested += 1;
                    i += 2;
                } else if at(i, "*/") {
                    nested -= 1;
                    i += 2;
                    if nested == 0 {
                        break;
                    }
                } else {
                    if chars[i] == '\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
            continue;
        }
        if !skipping && at(i, "#[cfg(test)]") {
            // The attribute, any further attributes, then `mod name {`: skipped to its brace.
            let mut j = i + "#[cfg(test)]".len();
            loop {
                while j < chars.len() && chars[j].is_whitespace() {
                    j += 1;
                }
                if at(j, "#[") {
                    while j < chars.len() && chars[j] != ']' {
                        j += 1;
                    }
                    j += 1;
                } else {
                    break;
                }
            }
            let rest: String = chars[j..chars.len().min(j + 200)].iter().collect();
            let head = rest.split('{').next().unwrap_or("");
            let is_module = rest.starts_with("mod ")
                && rest.contains('{')
                && !head.contains(';')
                && head["mod ".len()..]
                    .trim()
                    .chars()
                    .all(|c| c.is_alphanumeric() || c == '_');
            if is_module {
                skip_until = Some(depth);
                out.extend(chars[i..j].iter().filter(|c| **c == '\n'));
                i = j;
                continue;
            }
        }
        // A raw string (r"..", r#".."#, br".."), a string, a byte string.
        let raw = if at(i, "br") {
            Some(i + 2)
        } else if at(i, "r") {
            Some(i + 1)
        } else {
            None
        };
        let prev_ident = i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
        if let Some(mut j) = raw.filter(|_| !prev_ident) {
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) == Some(&'"') {
                let close: String = std::iter::once('"')
                    .chain(std::iter::repeat_n('#', hashes))
                    .collect();
                let mut k = j + 1;
                while k < chars.len() && !at(k, &close) {
                    k += 1;
                }
                let end = (k + close.len()).min(chars.len());
                keep(&chars[i..end].iter().collect::<String>(), &mut out);
                i = end;
                continue;
            }
        }
        if c == '"' {
            let mut k = i + 1;
            while k < chars.len() && chars[k] != '"' {
                k += if chars[k] == '\\' { 2 } else { 1 };
            }
            let end = (k + 1).min(chars.len());
            keep(&chars[i..end].iter().collect::<String>(), &mut out);
            i = end;
            continue;
        }
        if c == '\'' {
            // A character literal ('x', '\n', '\u{1F600}'), not a lifetime ('a).
            let len = if chars.get(i + 1) == Some(&'\\') {
                chars[i + 2..]
                    .iter()
                    .position(|c| *c == '\'')
                    .map(|p| p + 3)
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(3)
            } else {
                None
            };
            if let Some(len) = len {
                let end = (i + len).min(chars.len());
                keep(&chars[i..end].iter().collect::<String>(), &mut out);
                i = end;
                continue;
            }
        }
        match c {
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                if skip_until == Some(depth) {
                    skip_until = None;
                    i += 1;
                    continue;
                }
            }
            _ => {}
        }
        keep(&c.to_string(), &mut out);
        i += 1;
    }
    out
}

/// Lines of code: not blank once comments and `#[cfg(test)]` modules are taken out.
fn code_lines(code: &str) -> usize {
    without_comments_and_tests(code)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count()
}

/// More lines of code than this in one source file is more than one concern: split it.
const MAX_CODE_LINES: usize = 1_000;

/// Files allowed over the limit until they are split, each with the issue that splits it.
const OVER_THE_LIMIT: &[&str] = &[];

/// The workspace's members, from its `Cargo.toml`.
fn workspace_members() -> Vec<PathBuf> {
    let root = crate_dir().join("../..");
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("workspace Cargo.toml");
    let start = manifest.find("members = [").expect("a members list");
    let list = &manifest[start..];
    let list = &list[..list.find(']').expect("the members list's end")];
    let members: Vec<PathBuf> = list
        .split('"')
        .skip(1)
        .step_by(2)
        .map(|m| root.join(m))
        .collect();
    assert!(!members.is_empty(), "no workspace members read");
    members
}

#[test]
fn no_source_file_is_over_a_thousand_lines_of_code() {
    let root = crate_dir()
        .join("../..")
        .canonicalize()
        .expect("workspace root");
    let mut files = Vec::new();
    for member in workspace_members() {
        rust_files(&member.join("src"), &mut files);
    }
    assert!(
        files.len() > 50,
        "too few source files found: {}",
        files.len()
    );
    let mut over = Vec::new();
    for file in files {
        let file = file.canonicalize().expect("source path");
        let name = file
            .strip_prefix(&root)
            .expect("inside the workspace")
            .to_string_lossy()
            .replace('\\', "/");
        if OVER_THE_LIMIT.contains(&name.as_str()) {
            continue;
        }
        let lines = code_lines(&std::fs::read_to_string(&file).expect("readable source"));
        if lines > MAX_CODE_LINES {
            over.push(format!("{name}: {lines}"));
        }
    }
    assert!(
        over.is_empty(),
        "source files over {MAX_CODE_LINES} lines of code (split them by concern): {over:?}"
    );
}

/// More lines of code than this in one test file is more than one concern: split it by
/// concern, with the shared set-up in the crate's `tests/common`.
const MAX_TEST_CODE_LINES: usize = 800;

/// Test files allowed over [`MAX_TEST_CODE_LINES`] until they are split, each with why.
const TEST_FILES_OVER_THE_LIMIT: &[(&str, &str)] = &[];

/// The test files of `members`, as paths from `root`, with their lines of code.
fn test_file_sizes(root: &Path, members: &[PathBuf]) -> Vec<(String, usize)> {
    let mut files = Vec::new();
    for member in members {
        rust_files(&member.join("tests"), &mut files);
    }
    files
        .into_iter()
        .map(|file| {
            let file = file.canonicalize().expect("test path");
            let name = file
                .strip_prefix(root)
                .expect("inside the workspace")
                .to_string_lossy()
                .replace('\\', "/");
            let lines = code_lines(&std::fs::read_to_string(&file).expect("readable test"));
            (name, lines)
        })
        .collect()
}

#[test]
fn no_test_file_is_over_eight_hundred_lines_of_code() {
    let root = crate_dir()
        .join("../..")
        .canonicalize()
        .expect("workspace root");
    let sizes = test_file_sizes(&root, &workspace_members());
    assert!(
        sizes.len() > 30,
        "too few test files found: {}",
        sizes.len()
    );
    let over: Vec<String> = sizes
        .iter()
        .filter(|(name, lines)| {
            *lines > MAX_TEST_CODE_LINES
                && !TEST_FILES_OVER_THE_LIMIT.iter().any(|(f, _)| f == name)
        })
        .map(|(name, lines)| format!("{name}: {lines}"))
        .collect();
    assert!(
        over.is_empty(),
        "test files over {MAX_TEST_CODE_LINES} lines of code (split them by concern, shared \
         set-up in tests/common): {over:?}"
    );
    let stale: Vec<&str> = TEST_FILES_OVER_THE_LIMIT
        .iter()
        .filter(|(f, _)| {
            sizes
                .iter()
                .all(|(name, lines)| name != f || *lines <= MAX_TEST_CODE_LINES)
        })
        .map(|(f, _)| *f)
        .collect();
    assert!(
        stale.is_empty(),
        "TEST_FILES_OVER_THE_LIMIT names files within the limit (drop them): {stale:?}"
    );
}

#[test]
fn code_lines_leave_out_comments_blanks_and_tests() {
    let code = r#"//! The module.

/// A function.
fn f() -> &'static str {
    // why
    let s = "// not a comment {";
    let c = '{';
    /* a block
       comment */
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn t() {
        assert_eq!(f(), "}");
    }
}

fn g() {}
"#;
    // fn f, let s, let c, s, }, fn g.
    assert_eq!(code_lines(code), 6);
    let kept = without_comments_and_tests(code);
    assert!(kept.contains("fn g() {}"));
    assert!(!kept.contains("mod tests"));
    assert_eq!(kept.lines().count(), code.lines().count());
    // A test module declared in its own file is not a block to skip.
    assert_eq!(code_lines("#[cfg(test)]\nmod tests;\nfn a() {}\n"), 3);
}

/// Lock and wake-up types named in a piece of code (comments and test modules excluded):
/// state held in `runtime/`, which belongs in the subsystem that owns it.
fn shared_state_types(code: &str) -> BTreeSet<String> {
    let code = without_comments_and_tests(code);
    let mut found = BTreeSet::new();
    let words = code.split(|c: char| !(c.is_alphanumeric() || c == '_'));
    for word in words {
        // MutexGuard, RwLockReadGuard... name the same state.
        if ["Mutex", "RwLock", "Notify"]
            .iter()
            .any(|t| word.starts_with(t))
        {
            found.insert(word.to_string());
        }
    }
    found
}

#[test]
fn runtime_holds_no_locks_or_notifications() {
    let mut files = Vec::new();
    rust_files(&crate_dir().join("src/runtime"), &mut files);
    files.sort();
    let mut holding = Vec::new();
    for file in files {
        let code = std::fs::read_to_string(&file).expect("readable source");
        let types = shared_state_types(&code);
        if !types.is_empty() {
            let name = file
                .strip_prefix(crate_dir())
                .unwrap_or(&file)
                .display()
                .to_string();
            holding.push(format!("{name}: {types:?}"));
        }
    }
    assert!(
        holding.is_empty(),
        "runtime/ wires subsystems and holds no state of its own (no Mutex, RwLock or \
         Notify outside tests): {holding:?}"
    );
}

#[test]
fn locks_and_notifications_are_seen_outside_comments_and_tests() {
    let code = "use std::sync::Mutex;\n\
                // a Notify in a comment\n\
                /// a RwLock in a doc comment\n\
                struct S { m: tokio::sync::RwLock<u8>, g: Option<MutexGuard<'static, u8>> }\n\
                #[cfg(test)]\n\
                mod tests {\n    use tokio::sync::Notify;\n}\n";
    assert_eq!(
        shared_state_types(code),
        BTreeSet::from([
            "Mutex".to_string(),
            "MutexGuard".to_string(),
            "RwLock".to_string()
        ])
    );
    assert!(shared_state_types("let n = notify(); // Mutex\n/* RwLock */").is_empty());
}
