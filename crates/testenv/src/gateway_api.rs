//! The upstream Gateway API CRDs for tests: fetched from the Go module
//! `sigs.k8s.io/gateway-api` by `scripts/gateway-api-crds.sh` (pinned version, cached under
//! `~/.cache/loxi-ccm/gateway-api-<version>/`), the way the control plane is built from
//! `k8s.io/kubernetes`. A fetch that fails is an error naming the script, never a skipped
//! test.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// The Gateway API release whose CRDs the tests install.
pub const GATEWAY_API_VERSION: &str = "v1.6.3";

/// A release channel of the Gateway API CRDs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    Standard,
    Experimental,
}

impl Channel {
    fn dir_name(self) -> &'static str {
        match self {
            Channel::Standard => "standard",
            Channel::Experimental => "experimental",
        }
    }
}

/// The cache directory with `standard/` and `experimental/` (fetched when missing).
pub fn crds_dir() -> Result<PathBuf> {
    let script = crate::tools::repo_root().join("scripts/gateway-api-crds.sh");
    let out = Command::new("bash")
        .arg(&script)
        .env("GATEWAY_API_VERSION", GATEWAY_API_VERSION)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "{} failed ({}): the Gateway API CRDs could not be fetched, see the output above",
            script.display(),
            out.status
        );
    }
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
}

/// Every CustomResourceDefinition of `channel`, as JSON (the channel's other objects, a
/// ValidatingAdmissionPolicy guarding upgrades, are left out), sorted by file name.
pub fn crds(channel: Channel) -> Result<Vec<serde_json::Value>> {
    let dir = crds_dir()?.join(channel.dir_name());
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)?;
        for doc in text.split("\n---\n") {
            let value: serde_json::Value = serde_saphyr::from_str(doc)
                .with_context(|| format!("parsing {}", file.display()))?;
            if value["kind"] == "CustomResourceDefinition" {
                out.push(value);
            }
        }
    }
    if out.is_empty() {
        bail!("no CRDs in {}", dir.display());
    }
    Ok(out)
}
