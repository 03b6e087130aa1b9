//! The helpers of the chart's tests (`chart.rs`, `chart_crds.rs`): helm, the chart's
//! renderings and scenarios, kubectl against a test control plane. Included with `#[path]`
//! by the test files that use it only.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;
use testenv::chart::{NAMESPACE, RELEASE, chart_dir};
use testenv::tools::helm_command;

pub fn helm() -> PathBuf {
    testenv::tools::helm().expect("helm is built by scripts/go-tool.sh helm")
}

/// The documented scenarios: the default values (`None`) and each values file of the chart's
/// `ci/` folder, each described in docs/getting-started.md.
pub fn scenarios() -> Vec<(String, Option<PathBuf>)> {
    let mut found: Vec<(String, Option<PathBuf>)> = std::fs::read_dir(chart_dir().join("ci"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with("-values.yaml"))
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().to_string(),
                Some(p),
            )
        })
        .collect();
    found.sort();
    // Nothing else sits among the values files: `helm template -f ci/<file>` works for each.
    let others: Vec<PathBuf> = std::fs::read_dir(chart_dir().join("ci"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| !p.to_string_lossy().ends_with("-values.yaml"))
        .collect();
    assert!(
        others.is_empty(),
        "charts/loxi-ccm/ci holds files that are not values files: {others:?}"
    );
    assert!(
        found.len() >= 4,
        "the documented scenarios are missing: {found:?}"
    );
    found.insert(0, ("default values".into(), None));
    found
}

/// `helm template` of the chart in kube-system with `values` (and `extra` arguments).
pub fn render(helm: &Path, values: Option<&Path>, extra: &[&str]) -> String {
    let mut cmd = helm_command(helm);
    cmd.args(["template", RELEASE])
        .arg(chart_dir())
        .args(["--namespace", NAMESPACE]);
    if let Some(v) = values {
        cmd.arg("--values").arg(v);
    }
    let out = cmd.args(extra).output().unwrap();
    assert!(
        out.status.success(),
        "helm template {values:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Every document of a rendering, parsed.
pub fn documents(rendered: &str) -> Vec<Value> {
    rendered
        .trim_start_matches("---\n")
        .split("\n---\n")
        .map(|doc| serde_saphyr::from_str::<Value>(doc).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

pub fn kubectl(cp: &testenv::ControlPlane, args: &[&str], stdin: Option<&str>) -> (bool, String) {
    use std::io::Write;
    let mut child = Command::new(cp.k8s_bin_dir().join("kubectl"))
        .arg("--kubeconfig")
        .arg(cp.kubeconfig_path())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input
        .write_all(stdin.unwrap_or_default().as_bytes())
        .unwrap();
    drop(input);
    outcome(child.wait_with_output().unwrap())
}

/// Whether a command succeeded, and its standard output then its standard error.
pub fn outcome(out: std::process::Output) -> (bool, String) {
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// The plain manifests' directory.
pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}
