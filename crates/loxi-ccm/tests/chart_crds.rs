//! The chart's optional CRDs (kube-loxilb's resources) with the real tools: kube-loxilb's
//! own examples apply with the CRDs shipped in `deploy/optional/`, Helm keeps the optional
//! CRDs and the resources in them, and CRDs applied with kubectl are adopted by a release.

#[path = "common/chart.rs"]
mod chart_helpers;
mod common;

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::Value;
use testenv::chart::{NAMESPACE, RELEASE, chart_dir};
use testenv::tools::helm_command;

use chart_helpers::{deploy_dir, helm, kubectl, outcome};

/// kube-loxilb's LoxiURL examples (manifest/crds/loxilb-url.yaml, loxilb-cidr-pool.yaml and
/// loxilb-hostcidr.yaml, written out from their fields), unchanged.
const LOXIURL_EXAMPLES: &str = r#"apiVersion: "loxiurl.loxilb.io/v1"
kind: LoxiURL
metadata:
  name: llb
spec:
  loxiURL: http://10.10.10.1:11111
---
apiVersion: "loxiurl.loxilb.io/v1"
kind: LoxiURL
metadata:
  name: pool5
spec:
  loxiURL: 12.12.12.0/24
  zone: llb
  type: cidrpool
---
apiVersion: "loxiurl.loxilb.io/v1"
kind: LoxiURL
metadata:
  name: llb-10.10.10.1
spec:
  loxiURL: 10.10.10.1
  zone: llb
  type: hostcidr
"#;

/// A kube-loxilb BGP peer (its example's fields).
const BGP_PEER_EXAMPLE: &str = r#"{"apiVersion": "bgppeer.loxilb.io/v1", "kind": "BGPPeerService",
  "metadata": {"name": "bgp-peer-test"},
  "spec": {"ipAddress": "123.123.123.2", "remoteAs": 65123, "remotePort": 179}}
"#;

/// The CRDs of kube-loxilb's resources that the chart ships as options.
const OPTIONAL_CRDS: [&str; 5] = [
    "crd/bgppeerservices.bgppeer.loxilb.io",
    "crd/bgppolicydefinedsetsservices.bgppolicydefinedsets.loxilb.io",
    "crd/bgppolicydefinitionservices.bgppolicydefinition.loxilb.io",
    "crd/bgppolicyapplyservices.bgppolicyapply.loxilb.io",
    "crd/loxiurls.loxiurl.loxilb.io",
];

fn established(cp: &testenv::ControlPlane, crds: &[&str]) {
    let mut args = vec!["wait", "--for=condition=established", "--timeout=60s"];
    args.extend_from_slice(crds);
    let (ok, out) = kubectl(cp, &args, None);
    assert!(ok, "{out}");
}

/// `kubectl apply` of kube-loxilb's own LoxiURL examples fails without the CRD (`no matches
/// for kind "LoxiURL"`) and works with the one shipped in `deploy/optional/loxiurl-crd.yaml`:
/// every example, types loxi-ccm refuses included (the controller says so in an Event), with
/// strict validation, and the fields read back as written.
#[tokio::test]
async fn kube_loxilbs_loxiurl_examples_apply_with_the_shipped_crd() {
    let cp = testenv::ControlPlane::start().await.expect("control plane");
    let (ok, out) = kubectl(&cp, &["apply", "-f", "-"], Some(LOXIURL_EXAMPLES));
    assert!(
        !ok && out.contains(r#"no matches for kind "LoxiURL""#),
        "{out}"
    );
    let crd = deploy_dir().join("optional/loxiurl-crd.yaml");
    let (ok, out) = kubectl(
        &cp,
        &["apply", "--validate=strict", "-f", crd.to_str().unwrap()],
        None,
    );
    assert!(ok, "{out}");
    established(&cp, &["crd/loxiurls.loxiurl.loxilb.io"]);
    let (ok, out) = kubectl(
        &cp,
        &["apply", "--validate=strict", "-f", "-"],
        Some(LOXIURL_EXAMPLES),
    );
    assert!(ok, "{out}");
    let (ok, out) = kubectl(&cp, &["get", "loxiurls", "-o", "json"], None);
    assert!(ok, "{out}");
    let list: Value = serde_json::from_str(&out).unwrap();
    let specs: BTreeMap<String, Value> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (
                o["metadata"]["name"].as_str().unwrap().to_string(),
                o["spec"].clone(),
            )
        })
        .collect();
    assert_eq!(
        specs["pool5"],
        serde_json::json!({"loxiURL": "12.12.12.0/24", "zone": "llb", "type": "cidrpool"})
    );
    assert_eq!(specs["llb"]["loxiURL"], "http://10.10.10.1:11111");
    assert_eq!(specs["llb-10.10.10.1"]["type"], "hostcidr");
    // The printer columns show the fields.
    let (_, out) = kubectl(&cp, &["get", "loxiurls"], None);
    assert!(
        out.lines().next().unwrap_or_default().contains("URL"),
        "{out}"
    );
}

/// Runs `helm <args>` against `cp` in the release's namespace.
fn helm_run(cp: &testenv::ControlPlane, args: &[&str]) -> (bool, String) {
    let mut helm = helm_command(&helm());
    helm.args(args)
        .args(["--namespace", NAMESPACE, "--kubeconfig"])
        .arg(cp.kubeconfig_path());
    outcome(helm.output().unwrap())
}

/// The optional CRDs and one resource of each kube-loxilb kind are all there, none being
/// deleted (a deleted CRD stays listed while the API server deletes its resources).
fn users_resources_are_there(cp: &testenv::ControlPlane, after: &str) {
    let mut all: Vec<&str> = OPTIONAL_CRDS.to_vec();
    all.extend([
        "bgppeerservice/bgp-peer-test",
        "loxiurl/llb",
        "loxiurl/pool5",
    ]);
    for what in all {
        let (ok, out) = kubectl(
            cp,
            &["get", what, "-o", "jsonpath={.metadata.deletionTimestamp}"],
            None,
        );
        assert!(ok, "after {after}: {what} is gone: {out}");
        assert!(
            out.trim().is_empty(),
            "after {after}: {what} is being deleted ({out})"
        );
    }
}

/// Helm never deletes users' resources (docs/bgp.md#installing-the-crds): the optional CRDs
/// (kube-loxilb's BGP and LoxiURL kinds) are kept, with every resource in them, by an upgrade
/// without their values, by an upgrade with them again, and by `helm uninstall`; a new
/// install adopts them again.
#[tokio::test]
async fn helm_keeps_the_optional_crds_and_the_resources_in_them() {
    let cp = testenv::ControlPlane::start().await.expect("control plane");
    let chart = chart_dir();
    let chart = chart.to_str().unwrap();
    let on = [
        "--set",
        "bgpCrds.enabled=true",
        "--set",
        "loxiurlCrd.enabled=true",
    ];
    let mut install = vec!["install", RELEASE, chart];
    install.extend_from_slice(&on);
    let (ok, out) = helm_run(&cp, &install);
    assert!(ok, "helm install: {out}");
    established(&cp, &OPTIONAL_CRDS);
    let examples = format!("{BGP_PEER_EXAMPLE}---\n{LOXIURL_EXAMPLES}");
    let (ok, out) = kubectl(&cp, &["apply", "-f", "-"], Some(&examples));
    assert!(ok, "{out}");
    users_resources_are_there(&cp, "install");

    // Without the values: the chart's defaults (an upgrade with no value at all would reuse
    // the release's; a values file that lacks them is the same as this).
    let (ok, out) = helm_run(&cp, &["upgrade", RELEASE, chart, "--reset-values"]);
    assert!(ok, "helm upgrade without the values: {out}");
    users_resources_are_there(&cp, "an upgrade without bgpCrds and loxiurlCrd");

    let mut upgrade = vec!["upgrade", RELEASE, chart];
    upgrade.extend_from_slice(&on);
    let (ok, out) = helm_run(&cp, &upgrade);
    assert!(ok, "helm upgrade with the values again: {out}");
    users_resources_are_there(&cp, "an upgrade with the values again");

    let (ok, out) = helm_run(&cp, &["uninstall", RELEASE, "--wait"]);
    assert!(ok, "helm uninstall: {out}");
    users_resources_are_there(&cp, "helm uninstall");

    let (ok, out) = helm_run(&cp, &install);
    assert!(ok, "helm install again over the kept CRDs: {out}");
    users_resources_are_there(&cp, "a new install");
}

/// The adoption commands of the chart's README (the `sh` block after
/// `<!-- adopt-optional-crds -->`).
fn adoption_script() -> String {
    let readme = std::fs::read_to_string(chart_dir().join("README.md")).unwrap();
    let (_, rest) = readme
        .split_once("<!-- adopt-optional-crds -->")
        .expect("the README's adoption block");
    let (_, rest) = rest.split_once("```sh\n").expect("an sh block");
    let (script, _) = rest.split_once("```").expect("the end of the block");
    script.to_string()
}

/// The kubectl → Helm path: CRDs first applied with kubectl from `deploy/optional/` (as
/// docs/bgp.md and docs/fleet.md show) with resources in them, then a release that enables
/// them. Helm refuses objects it does not own; the README's adoption commands, run as
/// written, hand them to the release, whose upgrade then keeps every resource.
#[tokio::test]
async fn crds_applied_with_kubectl_are_adopted_by_a_release() {
    let cp = testenv::ControlPlane::start().await.expect("control plane");
    for file in ["optional/bgp-crds.yaml", "optional/loxiurl-crd.yaml"] {
        let path = deploy_dir().join(file);
        let (ok, out) = kubectl(&cp, &["apply", "-f", path.to_str().unwrap()], None);
        assert!(ok, "{out}");
    }
    established(&cp, &OPTIONAL_CRDS);
    let examples = format!("{BGP_PEER_EXAMPLE}---\n{LOXIURL_EXAMPLES}");
    let (ok, out) = kubectl(&cp, &["apply", "-f", "-"], Some(&examples));
    assert!(ok, "{out}");

    let chart = chart_dir();
    let chart = chart.to_str().unwrap();
    let (ok, out) = helm_run(&cp, &["install", RELEASE, chart]);
    assert!(ok, "helm install without the values: {out}");
    let upgrade = [
        "upgrade",
        RELEASE,
        chart,
        "--set",
        "bgpCrds.enabled=true",
        "--set",
        "loxiurlCrd.enabled=true",
    ];
    let (ok, out) = helm_run(&cp, &upgrade);
    assert!(
        !ok && out.contains("invalid ownership metadata"),
        "Helm takes over objects it does not own only when told: {out}"
    );

    // The README's commands, as written, with this cluster's kubectl.
    let path = format!(
        "{}:{}",
        cp.k8s_bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut sh = Command::new("sh");
    sh.args(["-e", "-c", &adoption_script()])
        .env("PATH", path)
        .env("KUBECONFIG", cp.kubeconfig_path());
    let (ok, out) = outcome(sh.output().unwrap());
    assert!(ok, "the README's adoption commands: {out}");
    let (ok, out) = helm_run(&cp, &upgrade);
    assert!(ok, "helm upgrade after adoption: {out}");
    users_resources_are_there(&cp, "the adoption");
    let (ok, out) = kubectl(
        &cp,
        &[
            "get",
            "crd/loxiurls.loxiurl.loxilb.io",
            "-o",
            "jsonpath={.metadata.annotations}",
        ],
        None,
    );
    assert!(
        ok && out.contains("helm.sh/resource-policy") && out.contains(RELEASE),
        "{out}"
    );
}
