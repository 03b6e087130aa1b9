//! The command-line tools the chart and monitoring tests need besides the control plane:
//! `helm` and `promtool`, built from their Go modules by `scripts/go-tool.sh` (pinned versions,
//! cached under `~/.cache/loxi-ccm/<tool>-<version>/bin`). A tool that cannot be built is an
//! error naming the script's output, never a skipped test.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};

use anyhow::{Context, Result, bail};

/// `helm` (helm.sh/helm/v3): `$LOXI_HELM` if set, else built by `scripts/go-tool.sh`.
pub fn helm() -> Result<PathBuf> {
    go_tool("helm", "LOXI_HELM")
}

/// `promtool` (github.com/prometheus/prometheus/cmd/promtool): `$LOXI_PROMTOOL` if set, else
/// built by `scripts/go-tool.sh`.
pub fn promtool() -> Result<PathBuf> {
    go_tool("promtool", "LOXI_PROMTOOL")
}

/// The repository's root (this crate lives in `crates/testenv`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `actionlint` (github.com/rhysd/actionlint): `$LOXI_ACTIONLINT` if set, else built by
/// `scripts/go-tool.sh`.
pub fn actionlint() -> Result<PathBuf> {
    go_tool("actionlint", "LOXI_ACTIONLINT")
}

fn go_tool(name: &str, override_var: &str) -> Result<PathBuf> {
    if let Ok(path) = std::env::var(override_var) {
        return Ok(PathBuf::from(path));
    }
    // Tests of one binary ask from several threads: one build, the others wait for it.
    static BUILDING: OnceLock<Mutex<()>> = OnceLock::new();
    let _one_at_a_time = BUILDING
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let script = repo_root().join("scripts/go-tool.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg(name)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "{} {name} failed ({}): {name} could not be built from its Go module, see the output above",
            script.display(),
            out.status
        );
    }
    let path = PathBuf::from(String::from_utf8(out.stdout)?.trim());
    if !path.is_file() {
        bail!(
            "{} {name} printed {}, which is no file",
            script.display(),
            path.display()
        );
    }
    Ok(path)
}

/// A `helm` command with its own cache, config and data directories (under the system's
/// temporary directory), so that tests and xtask never read or write the user's Helm setup.
pub fn helm_command(helm: &Path) -> Command {
    let home = std::env::temp_dir().join("loxi-ccm-helm-home");
    let mut cmd = Command::new(helm);
    cmd.env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"));
    cmd
}

/// The Prometheus Operator release whose CRDs (ServiceMonitor, PrometheusRule) the chart's
/// monitoring objects are checked against.
pub const PROMETHEUS_OPERATOR_VERSION: &str = "v0.85.0";

/// The Prometheus Operator's own CRD of `plural` (`servicemonitors`, `prometheusrules`), as
/// its Go module `github.com/prometheus-operator/prometheus-operator` ships it
/// (`example/prometheus-operator-crd/`), downloaded once by `go mod download` into Go's module
/// cache (pinned: [`PROMETHEUS_OPERATOR_VERSION`]).
pub fn prometheus_operator_crd(plural: &str) -> Result<PathBuf> {
    let module =
        format!("github.com/prometheus-operator/prometheus-operator@{PROMETHEUS_OPERATOR_VERSION}");
    let out = Command::new("go")
        .args(["mod", "download", "-json", &module])
        // Outside any module of ours, with the module cache's default settings.
        .current_dir(std::env::temp_dir())
        .env("GOFLAGS", "")
        .stderr(Stdio::inherit())
        .output()
        .context("running go mod download (the go toolchain is needed)")?;
    if !out.status.success() {
        bail!(
            "go mod download {module} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let info: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let dir = info["Dir"]
        .as_str()
        .with_context(|| format!("go mod download {module}: no Dir in its answer"))?;
    let crd = Path::new(dir)
        .join("example/prometheus-operator-crd")
        .join(format!("monitoring.coreos.com_{plural}.yaml"));
    if !crd.is_file() {
        bail!("{module} has no CRD file {}", crd.display());
    }
    Ok(crd)
}
