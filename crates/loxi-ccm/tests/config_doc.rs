//! docs/configuration.md holds the table of every option of `loxi-ccm run`. This test builds
//! the table from the clap definition (long flag, aliases, environment variable, default,
//! help) and the config-file key mapping, and fails when the document differs, printing the
//! table to paste between the markers.

use clap::CommandFactory;
use loxi_ccm::config::cli::Cli;
use loxi_ccm::config::file_keys;

const START: &str = "<!-- options-table:start -->";
const END: &str = "<!-- options-table:end -->";

fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn code_list(items: &[String]) -> String {
    if items.is_empty() {
        return "—".to_string();
    }
    items
        .iter()
        .map(|i| format!("`{i}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn expected_table() -> String {
    let cmd = Cli::command();
    let run = cmd
        .find_subcommand("run")
        .expect("the run subcommand exists");
    let mut out = String::from(
        "| option | flag | env | file key | default | meaning |\n|---|---|---|---|---|---|\n",
    );
    for arg in run.get_arguments() {
        let id = arg.get_id().as_str();
        if matches!(id, "help" | "version") {
            continue;
        }
        let long = arg
            .get_long()
            .unwrap_or_else(|| panic!("option {id} has no long flag"));
        let mut flags = vec![format!("--{long}")];
        flags.extend(
            arg.get_all_aliases()
                .unwrap_or_default()
                .into_iter()
                .map(|a| format!("--{a}")),
        );
        let env: Vec<String> = arg
            .get_env()
            .map(|e| e.to_string_lossy().into_owned())
            .into_iter()
            .collect();
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|d| d.to_string_lossy().into_owned())
            .collect();
        let default = if defaults.is_empty() {
            "—".to_string()
        } else {
            format!("`{}`", defaults.join(","))
        };
        let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
        out.push_str(&format!(
            "| {long} | {} | {} | {} | {default} | {} |\n",
            code_list(&flags),
            code_list(&env),
            code_list(&file_keys(arg)),
            cell(&help),
        ));
    }
    out
}

#[test]
fn configuration_md_lists_every_option() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/configuration.md");
    let doc = std::fs::read_to_string(path).unwrap_or_default();
    let expected = expected_table();
    let actual = doc
        .split_once(START)
        .and_then(|(_, rest)| rest.split_once(END))
        .map(|(table, _)| table.trim().to_string());
    if actual.as_deref() != Some(expected.trim()) {
        panic!(
            "docs/configuration.md is out of date with the options of `loxi-ccm run`.\n\
             Put this table between the lines {START} and {END}:\n\n{expected}"
        );
    }
}

#[test]
fn every_option_has_an_environment_variable_and_a_file_key() {
    let cmd = Cli::command();
    let run = cmd.find_subcommand("run").unwrap();
    for arg in run.get_arguments() {
        let id = arg.get_id().as_str();
        if matches!(id, "help" | "version") {
            continue;
        }
        assert!(
            arg.get_env().is_some(),
            "--{id} has no environment variable"
        );
        if id != "config" {
            assert!(!file_keys(arg).is_empty(), "--{id} has no config-file key");
        }
    }
}

/// The refusal of a kube-loxilb setting loxi-ccm does not support yet names a section of the
/// documentation: that section exists and says something about every such setting.
#[test]
fn refused_kube_loxilb_settings_are_documented_where_the_refusal_points() {
    use loxi_ccm::config::{NOT_YET_SUPPORTED, NOT_YET_SUPPORTED_DOC};
    let (file, anchor) = NOT_YET_SUPPORTED_DOC
        .split_once('#')
        .expect("a file and an anchor");
    let path = format!("{}/../../{file}", env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(&path).unwrap();
    // GitHub's anchor of a heading: lower case, spaces to '-', punctuation dropped.
    let anchor_of = |heading: &str| -> String {
        heading
            .trim()
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect()
    };
    let mut sections = doc.split("\n## ").skip(1);
    let section = sections
        .find(|s| anchor_of(s.lines().next().unwrap_or_default()) == anchor)
        .unwrap_or_else(|| panic!("{file} has no section #{anchor}"));
    for name in NOT_YET_SUPPORTED {
        assert!(
            section.contains(&format!("`--{name}`")),
            "{file}#{anchor} says nothing about --{name}"
        );
    }
}
