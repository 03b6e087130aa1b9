//! `cargo xtask conformance`: the upstream Gateway API conformance suite
//! (`sigs.k8s.io/gateway-api/conformance`, built by scripts/gateway-api-conformance.sh) against
//! loxi-ccm on the test control plane with the loxilb simulator (docs/gateway-api.md#conformance).
//!
//! No kubelet or scheduler runs: kube-controller-manager makes the suite's Deployments into
//! Pods, and a stand-in marks each Pod Running and Ready with an address of its own (the
//! suite waits for Ready Pods before any test). The simulator forwards no packets, so the
//! tests that send traffic through the Gateway are skipped (`NEEDS_TRAFFIC`).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::{Guard, cargo, control_plane_script, free_port, run, workspace_root};

/// The GatewayClass the suite is pointed at, served by loxi-ccm.
const CLASS: &str = "loxilb";
const CONTROLLER: &str = "loxilb.io/loxilb";
const PROFILES: &str = "GATEWAY-HTTP,GATEWAY-TCP";
const FEATURES: &str = "Gateway,HTTPRoute,ReferenceGrant,TCPRoute";

/// Tests of the selected features that send requests or connections through the Gateway
/// (the simulator forwards none); docs/gateway-api.md#conformance lists them.
pub const NEEDS_TRAFFIC: &[&str] = &[
    "HTTPRouteCrossNamespace",
    "HTTPRouteExactPathMatching",
    "HTTPRouteHeaderMatching",
    "HTTPRouteHostnameIntersection",
    "HTTPRouteHTTPSListener",
    "HTTPRouteInvalidBackendRefUnknownKind",
    "HTTPRouteInvalidCrossNamespaceBackendRef",
    "HTTPRouteInvalidNonExistentBackendRef",
    "HTTPRouteInvalidReferenceGrant",
    "HTTPRouteListenerHostnameMatching",
    "HTTPRouteMatchingAcrossRoutes",
    "HTTPRouteMatching",
    "HTTPRouteMultipleGateways",
    "HTTPRouteNoBackendRefs",
    "HTTPRoutePartiallyInvalidViaInvalidReferenceGrant",
    "HTTPRoutePathMatchOrder",
    "HTTPRouteRedirectHostAndStatus",
    "HTTPRouteReferenceGrant",
    "HTTPRouteRequestHeaderModifier",
    "HTTPRouteServiceTypes",
    "HTTPRouteSimpleSameNamespace",
    "HTTPRouteWeight",
    "TCPRouteMultipleRoutesAttachment",
    "TCPRouteParentRefAttachAll",
    "TCPRouteParentRefPortAndSectionName",
    "TCPRouteReferenceGrant",
    "TCPRouteWeightedRouting",
];

fn script_output(script: &str) -> Result<PathBuf> {
    let out = Command::new("bash")
        .arg(workspace_root().join(script))
        .env(
            "GATEWAY_API_VERSION",
            testenv::gateway_api::GATEWAY_API_VERSION,
        )
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("starting {script}"))?;
    if !out.status.success() {
        bail!("{script} failed ({})", out.status);
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// `args`: extra flags for the suite (e.g. `-run-test=GatewayModifyListeners`).
pub fn conformance(args: &[String]) -> Result<()> {
    run(
        control_plane_script(),
        "building the Kubernetes control plane (cached)",
    )?;
    let crds = script_output("scripts/gateway-api-crds.sh")?;
    eprintln!("xtask: building the conformance suite (cached)");
    let suite = script_output("scripts/gateway-api-conformance.sh")?;
    let mut build = cargo();
    build.args(["build", "--quiet", "-p", "loxi-ccm", "-p", "loxilb-sim"]);
    run(build, "cargo build -p loxi-ccm -p loxilb-sim")?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(run_suite(crds, suite, args))
}

async fn run_suite(crds: PathBuf, suite: PathBuf, args: &[String]) -> Result<()> {
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| workspace_root().join("target"));
    let bin = target.join("debug");
    let out_dir = target.join("gateway-api-conformance");
    std::fs::create_dir_all(&out_dir)?;

    eprintln!("xtask: starting etcd + kube-apiserver (RBAC on) and kube-controller-manager");
    let cp = testenv::ControlPlane::start().await?;
    cp.start_controller_manager(&["deployment", "replicaset", "serviceaccount"])?;
    let kubeconfig = cp.kubeconfig_path();
    let client = cp.admin_client().await?;
    let kubectl = |args: &[&str]| -> Result<()> {
        let out = Command::new(cp.k8s_bin_dir().join("kubectl"))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(args)
            .output()?;
        if !out.status.success() {
            bail!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    };
    let deploy = workspace_root().join("deploy");
    let standard = crds.join("standard");
    for file in [
        deploy.join("05-crd-addressclaims.yaml"),
        deploy.join("06-crd-addresspools.yaml"),
        standard,
    ] {
        kubectl(&["apply", "--server-side", "-f", &file.to_string_lossy()])?;
    }
    kubectl(&[
        "wait",
        "--for=condition=established",
        "--timeout=60s",
        "crd",
        "--all",
    ])?;
    let class = cp.dir().join("gatewayclass.yaml");
    std::fs::write(
        &class,
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata:\n  name: {CLASS}\nspec:\n  controllerName: {CONTROLLER}\n"
        ),
    )?;
    kubectl(&["apply", "-f", &class.to_string_lossy()])?;

    let sim_port = free_port()?;
    let sim_url = format!("http://127.0.0.1:{sim_port}");
    let _sim = Guard(
        Command::new(bin.join("loxilb-sim"))
            .args(["--listen", &format!("127.0.0.1:{sim_port}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting loxilb-sim")?,
    );
    let ccm_log = out_dir.join("loxi-ccm.log");
    eprintln!(
        "xtask: starting loxi-ccm --gatewayAPI (log: {})",
        ccm_log.display()
    );
    let _ccm = Guard(
        Command::new(bin.join("loxi-ccm"))
            .args([
                "run",
                "--kubeconfig",
                &kubeconfig.to_string_lossy(),
                "--loxilb-url",
                &sim_url,
                "--external-cidr",
                "192.168.100.0/24",
                "--admin-addr",
                &format!("127.0.0.1:{}", free_port()?),
                "--gatewayAPI",
                &format!("--loxilbGatewayClass={CONTROLLER}"),
            ])
            .stdout(std::fs::File::create(&ccm_log)?)
            .stderr(std::fs::File::create(out_dir.join("loxi-ccm.err.log"))?)
            .spawn()
            .context("starting loxi-ccm")?,
    );
    let pods = tokio::spawn(ready_pods(client));

    let report = out_dir.join("report.yaml");
    let log = out_dir.join("suite.log");
    let mut cmd = Command::new(&suite);
    cmd.env("KUBECONFIG", &kubeconfig)
        .arg("-test.v")
        // Only the suite: the package's option tests read files beside its source.
        .arg("-test.run=^TestConformance$")
        .arg("-test.timeout=60m")
        .arg(format!("-gateway-class={CLASS}"))
        .arg(format!("-conformance-profiles={PROFILES}"))
        .arg(format!("-supported-features={FEATURES}"))
        .arg(format!("-skip-tests={}", NEEDS_TRAFFIC.join(",")))
        .arg(format!("-report-output={}", report.display()))
        .arg("-organization=loxilb-io")
        .arg("-project=loxi-ccm")
        .arg("-url=https://github.com/loxilb-io/loxi-ccm")
        .arg(format!("-version={}", env!("CARGO_PKG_VERSION")))
        .arg("-contact=loxi-ccm maintainers")
        .args(args)
        .stdout(std::fs::File::create(&log)?)
        .stderr(Stdio::inherit());
    eprintln!(
        "xtask: running the conformance suite (log: {}, report: {})",
        log.display(),
        report.display()
    );
    let status = tokio::task::spawn_blocking(move || cmd.status()).await??;
    pods.abort();
    summarize(&log)?;
    if !status.success() {
        bail!(
            "the conformance suite failed ({status}); see {}",
            log.display()
        );
    }
    Ok(())
}

/// Prints each test's PASS/FAIL/SKIP line of the suite's `-test.v` output.
fn summarize(log: &std::path::Path) -> Result<()> {
    let text = std::fs::read_to_string(log)?;
    for line in text.lines() {
        let l = line.trim_start();
        if l.starts_with("--- PASS") || l.starts_with("--- FAIL") || l.starts_with("--- SKIP") {
            println!("{l}");
        }
    }
    Ok(())
}

/// The kubelet's part, as far as the suite looks: every Pod not yet Ready becomes Running and
/// Ready with an address from 10.250.0.0/16 (no container runs).
async fn ready_pods(client: kube::Client) {
    let pods: Api<Pod> = Api::all(client.clone());
    let mut next: u32 = 1;
    loop {
        if let Ok(list) = pods.list(&ListParams::default()).await {
            for pod in list.items {
                let ready = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                if ready || pod.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                let (Some(ns), Some(name)) = (pod.metadata.namespace, pod.metadata.name) else {
                    continue;
                };
                let ip = format!("10.250.{}.{}", next / 250, next % 250 + 1);
                next += 1;
                let now = k8s_openapi::jiff::Timestamp::now().to_string();
                let status = json!({"status": {
                    "phase": "Running",
                    "podIP": ip,
                    "podIPs": [{"ip": ip}],
                    "conditions": [
                        {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                        {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                        {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                        {"type": "Ready", "status": "True", "lastTransitionTime": now},
                    ],
                }});
                let _ = Api::<Pod>::namespaced(client.clone(), &ns)
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                    .await;
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
