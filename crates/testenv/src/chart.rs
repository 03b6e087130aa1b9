//! The plain manifests of `deploy/` are rendered from the Helm chart `charts/loxi-ccm` with the
//! values of `charts/deploy-values.yaml`: one source. `cargo xtask manifests` writes them; the
//! chart tests render them again and fail when `deploy/` differs.
//!
//! Each template `templates/<file>` becomes `deploy/<file>` (so `templates/optional/...`
//! becomes `deploy/optional/...`, which `kubectl apply -f deploy/` does not descend into), each
//! CRD `crds/<file>` becomes `deploy/<file>`. `optional/` is rendered with the option it
//! belongs to turned on.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::tools::{helm_command, repo_root};

/// The chart's directory.
pub fn chart_dir() -> PathBuf {
    repo_root().join("charts/loxi-ccm")
}

/// The values `deploy/` is rendered with.
pub fn deploy_values() -> PathBuf {
    repo_root().join("charts/deploy-values.yaml")
}

/// Namespace and release name of the plain manifests.
pub const NAMESPACE: &str = "kube-system";
pub const RELEASE: &str = "loxi-ccm";

/// Options rendered into `deploy/optional/`, each with the `--set` that turns it on.
const OPTIONAL: &[(&str, &str)] = &[
    ("templates/optional/multus-rbac.yaml", "multus.enabled=true"),
    (
        "templates/optional/gateway-api-rbac.yaml",
        "gatewayApi.enabled=true",
    ),
    ("templates/optional/bgp-crds.yaml", "bgpCrds.enabled=true"),
    (
        "templates/optional/loxiurl-crd.yaml",
        "loxiurlCrd.enabled=true",
    ),
    ("templates/optional/egress.yaml", "egress.enabled=true"),
    (
        "templates/optional/k8s-metadata-rbac.yaml",
        "k8sMetadata.enabled=true",
    ),
];

/// `(path under deploy/, text)` for every plain manifest, in path order.
pub fn plain_manifests(helm: &Path) -> Result<Vec<(PathBuf, String)>> {
    let mut files = BTreeMap::new();
    let main = template(helm, &["--include-crds"])?;
    for (source, text) in split_by_source(&main)? {
        if source.starts_with("templates/optional/") {
            continue;
        }
        files.insert(deploy_path(&source)?, with_header(&source, &text));
    }
    for (template_path, set) in OPTIONAL {
        let out = template(helm, &["--set", set, "--show-only", template_path])?;
        for (source, text) in split_by_source(&out)? {
            files.insert(deploy_path(&source)?, with_header(&source, &text));
        }
    }
    Ok(files.into_iter().collect())
}

/// `helm template` of the chart with the deploy values and `extra` arguments.
fn template(helm: &Path, extra: &[&str]) -> Result<String> {
    let out = helm_command(helm)
        .args(["template", RELEASE])
        .arg(chart_dir())
        .args(["--namespace", NAMESPACE, "--values"])
        .arg(deploy_values())
        .args(extra)
        .output()
        .context("running helm template")?;
    if !out.status.success() {
        bail!(
            "helm template {}: {}",
            extra.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// Splits `helm template` output into `(source path inside the chart, documents joined by
/// ---)`, in the order helm printed the first document of each source.
pub fn split_by_source(output: &str) -> Result<Vec<(String, String)>> {
    const MARK: &str = "---\n# Source: ";
    let mut order: Vec<String> = Vec::new();
    let mut docs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let Some(rest) = output.strip_prefix(MARK) else {
        bail!("helm template output does not start with a source header");
    };
    for chunk in rest.split(&format!("\n{MARK}")) {
        let (source, body) = chunk
            .split_once('\n')
            .with_context(|| format!("empty document from {chunk}"))?;
        let source = source
            .split_once('/')
            .map(|(_, inside)| inside.to_string())
            .with_context(|| format!("source {source} is not <chart>/<path>"))?;
        if !docs.contains_key(&source) {
            order.push(source.clone());
        }
        docs.entry(source)
            .or_default()
            .push(body.trim_end().to_string());
    }
    Ok(order
        .into_iter()
        .map(|s| {
            let text = docs[&s].join("\n---\n") + "\n";
            (s, text)
        })
        .collect())
}

fn deploy_path(source: &str) -> Result<PathBuf> {
    if let Some(rest) = source.strip_prefix("templates/") {
        return Ok(PathBuf::from(rest));
    }
    if let Some(rest) = source.strip_prefix("crds/") {
        return Ok(PathBuf::from(rest));
    }
    bail!("unexpected source {source} in the chart's output")
}

fn with_header(source: &str, text: &str) -> String {
    format!(
        "# Rendered from the Helm chart (charts/loxi-ccm/{source}, values charts/deploy-values.yaml)\n# by `cargo xtask manifests`. To change what the repository ships, edit the chart and run it\n# again; to install, edit your copy of this file (deploy/README.md) or use the chart.\n{text}"
    )
}

/// Every `.yaml` file under `deploy/` (relative paths): what [`plain_manifests`] must produce,
/// no more and no less.
pub fn yaml_files_in(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for entry in std::fs::read_dir(dir.join(&rel))? {
            let entry = entry?;
            let path = rel.join(entry.file_name());
            if entry.file_type()?.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                found.push(path);
            }
        }
    }
    found.sort();
    Ok(found)
}
