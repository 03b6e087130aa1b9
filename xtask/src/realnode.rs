//! `cargo xtask realnode`: the opt-in real-node tier (docs/testing.md). Not part of
//! `cargo xtask test` (CI): it needs root, changes the machine's network (a bridge,
//! kube-proxy's nftables tables) and takes minutes when cold.
//!
//! 1. the Debian packages the node needs (containerd, runc, the CNI plugins, buildah,
//!    musl-tools, busybox-static for a web server image, nftables and iptables);
//! 2. kubelet, kube-proxy and kube-scheduler v1.37.2, built from `k8s.io/kubernetes` once per
//!    version by `scripts/control-plane.sh` like the rest of the control plane;
//! 3. the image (`cargo xtask image`), loaded by the test into the node's containerd;
//! 4. `cargo test -p loxi-ccm --test real_node -- --ignored`.

use std::time::Instant;

use anyhow::Result;

use crate::{cargo, control_plane_script, run};

/// What the node needs from Debian (testenv::node explains each part).
const PACKAGES: &[&str] = &[
    "containerd",
    "runc",
    "containernetworking-plugins",
    "buildah",
    "musl-tools",
    "busybox-static",
    "nftables",
    "iptables",
];

pub fn realnode() -> Result<()> {
    let started = Instant::now();
    crate::packages::ensure(PACKAGES)?;
    let mut node_binaries = control_plane_script();
    node_binaries.args(["kubelet", "kube-proxy", "kube-scheduler"]);
    run(
        node_binaries,
        "building kubelet, kube-proxy and kube-scheduler (cached by version)",
    )?;
    let archive = crate::image::build(&[])?.expect("an archive unless --context-only");
    eprintln!(
        "xtask: packages, node binaries and image ready in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let mut test = cargo();
    test.args([
        "test",
        "-p",
        "loxi-ccm",
        "--test",
        "real_node",
        "--",
        "--ignored",
        "--nocapture",
    ])
    .env("LOXI_IMAGE_ARCHIVE", &archive);
    let tested = run(test, "cargo test -p loxi-ccm --test real_node -- --ignored");
    eprintln!(
        "xtask: real-node tier done in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    tested
}
