//! The release workflow (`.github/workflows/release.yml`), which cannot run here: actionlint
//! (built by `scripts/go-tool.sh`, with shellcheck's checks when shellcheck is installed)
//! finds nothing in it, and the image it publishes is the chart's default image.

use std::process::Command;

fn repo_file(rel: &str) -> std::path::PathBuf {
    testenv::tools::repo_root().join(rel)
}

#[test]
fn actionlint_finds_nothing_in_the_release_workflow() {
    let actionlint =
        testenv::tools::actionlint().expect("actionlint is built by scripts/go-tool.sh");
    let out = Command::new(actionlint)
        .arg("-no-color")
        .arg(".github/workflows/release.yml")
        .current_dir(testenv::tools::repo_root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "actionlint:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The workflow reads the image name from the chart's values (one source), builds the
/// Dockerfile on the context `cargo xtask image --context-only` writes, for both
/// architectures, signs, attaches an SBOM, and pushes the chart as an OCI artifact.
#[test]
fn the_workflow_publishes_the_charts_default_image() {
    let workflow = std::fs::read_to_string(repo_file(".github/workflows/release.yml")).unwrap();
    for needed in [
        "charts/loxi-ccm/values.yaml",
        "cargo xtask image --context-only",
        "file: deploy/Dockerfile",
        "platforms: linux/amd64,linux/arm64",
        "sbom: true",
        "cosign sign",
        "helm push",
    ] {
        assert!(workflow.contains(needed), "release.yml lacks `{needed}`");
    }
    let values = std::fs::read_to_string(repo_file("charts/loxi-ccm/values.yaml")).unwrap();
    let repositories: Vec<&str> = values
        .lines()
        .filter_map(|l| l.strip_prefix("  repository: "))
        .collect();
    assert_eq!(
        repositories,
        ["ghcr.io/loxi-ccm/loxi-ccm"],
        "the workflow reads the first `  repository:` line of values.yaml as the image"
    );
}
