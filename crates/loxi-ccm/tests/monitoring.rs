//! The alert rules and the Grafana dashboard of the chart (`charts/loxi-ccm/files`):
//!
//! - `promtool check rules` accepts the rules, `promtool test rules` runs their unit tests
//!   (`charts/loxi-ccm/files/alerts-test.yaml`), promtool being built by `scripts/go-tool.sh`;
//! - every `loxi_ccm_*` name the rules and the dashboard query is exported on `/metrics` by a
//!   running controller (in-process, real API server, simulator);
//! - every alert has its runbook paragraph in docs/operations.md;
//! - `loxi_ccm_services_not_programmed`, which one alert is based on, counts a Service that is
//!   not programmed (no room on loxilb), by its condition's reason, and forgets it once it is
//!   gone.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{CLASS, Options, WAIT, World, wait_for};
use kube::api::DeleteParams;
use loxilb_sim::SimConfig;

fn chart_file(rel: &str) -> PathBuf {
    testenv::chart::chart_dir().join(rel)
}

fn promtool(args: &[&str], file: &Path) -> String {
    let promtool = testenv::tools::promtool().expect("promtool is built by scripts/go-tool.sh");
    let out = Command::new(promtool)
        .args(args)
        .arg(file)
        .current_dir(file.parent().unwrap())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

/// The alert names of the rule file.
fn alert_names() -> Vec<String> {
    let rules = std::fs::read_to_string(chart_file("files/alerts.yaml")).unwrap();
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(|a| a.trim().to_string())
        .collect()
}

#[test]
fn promtool_checks_the_alert_rules() {
    let text = promtool(&["check", "rules"], &chart_file("files/alerts.yaml"));
    let alerts = alert_names();
    assert!(
        text.contains(&format!("SUCCESS: {} rules found", alerts.len())),
        "{text}"
    );
}

#[test]
fn promtool_unit_tests_of_the_alert_rules_pass() {
    let text = promtool(&["test", "rules"], &chart_file("files/alerts-test.yaml"));
    assert!(text.contains("SUCCESS"), "{text}");
    // Each alert is tested firing at least once.
    let tests = std::fs::read_to_string(chart_file("files/alerts-test.yaml")).unwrap();
    for alert in alert_names() {
        assert!(
            tests.contains(&format!("alertname: {alert}")),
            "{alert} has no promtool test"
        );
    }
}

#[test]
fn every_alert_has_a_runbook_paragraph() {
    let ops = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/operations.md"),
    )
    .unwrap();
    let rules = std::fs::read_to_string(chart_file("files/alerts.yaml")).unwrap();
    for alert in alert_names() {
        assert!(
            ops.contains(&format!("### {alert}\n")),
            "docs/operations.md has no section ### {alert}"
        );
        let anchor = format!("runbook: docs/operations.md#{}", alert.to_lowercase());
        assert!(rules.contains(&anchor), "{alert}: no {anchor}");
    }
}

/// Every `loxi_ccm_...` name in `text`.
fn metric_names_in(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("loxi_ccm_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

/// The sample names an OpenMetrics exposition offers: each family's samples by its type.
fn exported_sample_names(exposition: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in exposition.lines() {
        if let Some(typed) = line.strip_prefix("# TYPE ") {
            let (family, kind) = typed.split_once(' ').unwrap();
            let suffixes: &[&str] = match kind.trim() {
                "counter" => &["_total", "_created"],
                "histogram" => &["_bucket", "_sum", "_count", "_created"],
                "summary" => &["", "_sum", "_count", "_created"],
                _ => &[""],
            };
            for s in suffixes {
                names.insert(format!("{family}{s}"));
            }
        } else if !line.starts_with('#') {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_string());
        }
    }
    names
}

#[tokio::test]
async fn the_rules_and_the_dashboard_use_only_exported_metrics() {
    // A family without samples is not exposed at all: the world below gives every metric a
    // sample. BGP on (session states), and room for one rule only (limit hits, a Service not
    // programmed).
    let admin_port = testenv::free_port().unwrap();
    let world = World::with_sim(
        "monitoring",
        Options {
            admin_port: Some(admin_port),
            extra_args: vec![
                "--loxilb-max-rules=1".into(),
                "--bgp-local-as=65001".into(),
                "--bgp-peers=192.0.2.254:65002".into(),
            ],
            ..Options::default()
        },
        SimConfig {
            bgp: true,
            ..SimConfig::default()
        },
    )
    .await;
    world.add_node("mon-a", "10.70.0.1").await;
    world.serve_one_port("web", 80).await;
    assert!(
        world
            .sim
            .set_bgp_peer_state("192.0.2.254", "ESTABLISHED", Some("00:00:05"))
    );
    // Its rule does not fit next to web's.
    world
        .create(&World::lb_service("second", Some(CLASS), &[(81, "TCP")]))
        .await;
    let reason = wait_for("second's Programmed=False", WAIT, || async {
        let svc = world.get("second").await?;
        let (status, reason, _) = World::condition(&svc, "loxilb.io/Programmed")?;
        (status == "False").then_some(reason)
    })
    .await;
    assert_eq!(reason, "CapacityExceeded");
    let series = format!("reason=\"{reason}\"");
    wait_for("services_not_programmed counts it", WAIT, || async {
        (World::metric_sum(admin_port, "loxi_ccm_services_not_programmed", &[&series]).await?
            == 1.0)
            .then_some(())
    })
    .await;
    wait_for("a BGP session state", WAIT, || async {
        (World::metric_sum(admin_port, "loxi_ccm_bgp_sessions", &[]).await? >= 1.0).then_some(())
    })
    .await;

    let exposition = reqwest::get(format!("http://127.0.0.1:{admin_port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let exported = exported_sample_names(&exposition);
    for (file, text) in [
        (
            "files/alerts.yaml",
            std::fs::read_to_string(chart_file("files/alerts.yaml")).unwrap(),
        ),
        (
            "files/dashboard.json",
            std::fs::read_to_string(chart_file("files/dashboard.json")).unwrap(),
        ),
    ] {
        let used = metric_names_in(&text);
        assert!(used.len() >= 5, "{file} uses {used:?}");
        let missing: Vec<&String> = used.difference(&exported).collect();
        assert!(
            missing.is_empty(),
            "{file} uses metrics loxi-ccm does not export: {missing:?}\nexported: {exported:?}"
        );
    }
    // The dashboard is valid JSON with a query in every panel but the rows.
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(chart_file("files/dashboard.json")).unwrap())
            .unwrap();
    for panel in dashboard["panels"].as_array().unwrap() {
        if panel["type"] != "row" {
            assert!(
                panel["targets"][0]["expr"]
                    .as_str()
                    .is_some_and(|e| e.contains("loxi_ccm_")),
                "{panel}"
            );
        }
    }

    // Once the Service is gone, it is no longer counted.
    world
        .services
        .delete("second", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("services_not_programmed forgets it", WAIT, || async {
        (World::metric_sum(admin_port, "loxi_ccm_services_not_programmed", &[&series]).await?
            == 0.0)
            .then_some(())
    })
    .await;
    world.finish().await;
}
