//! The Helm chart (`charts/loxi-ccm`) with the real tools: helm (built by
//! `scripts/go-tool.sh`), the real kube-apiserver (RBAC on) and kube-controller-manager.
//!
//! - `deploy/` is the chart rendered with `charts/deploy-values.yaml`, byte for byte (one
//!   source: `cargo xtask manifests` writes it);
//! - `helm lint --strict` is clean with the default values and each documented scenario
//!   (`charts/loxi-ccm/ci/*-values.yaml`), and a misspelled value is refused (values schema);
//! - every scenario's rendering applies with `kubectl apply --dry-run=server --validate=strict`;
//! - every setting a scenario renders (ConfigMap variables, container arguments) is one
//!   `loxi-ccm run` accepts, with a valid value;
//! - `helm install` creates the Deployment, whose ReplicaSet creates the Pods;
//! - with `loxilb.watchTokenSecret` the ServiceAccount reads the token Secret (get, and the
//!   controller's own list/watch by name) and no other Secret, and the controller's watch,
//!   run with that ServiceAccount's token, sees a rotated token.

#[path = "common/chart.rs"]
mod chart_helpers;
mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::Value;
use testenv::chart::{NAMESPACE, RELEASE, chart_dir};
use testenv::tools::helm_command;

use chart_helpers::{documents, helm, kubectl, render, scenarios};

#[test]
fn deploy_is_the_chart_rendered() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy");
    let rendered = testenv::chart::plain_manifests(&helm()).unwrap();
    let on_disk = testenv::chart::yaml_files_in(&deploy).unwrap();
    let names: Vec<&PathBuf> = rendered.iter().map(|(p, _)| p).collect();
    assert_eq!(
        on_disk.iter().collect::<Vec<_>>(),
        names,
        "deploy/ holds other files than the chart renders; run cargo xtask manifests"
    );
    for (path, text) in &rendered {
        let file = std::fs::read_to_string(deploy.join(path)).unwrap();
        assert!(
            file == *text,
            "deploy/{} differs from the chart's rendering; edit charts/loxi-ccm and run cargo xtask manifests",
            path.display()
        );
    }
    // What the README and deploy/README.md promise about deploy/.
    for expected in [
        "05-crd-addressclaims.yaml",
        "06-crd-addresspools.yaml",
        "40-deployment.yaml",
        "optional/multus-rbac.yaml",
        "optional/bgp-crds.yaml",
        "optional/loxiurl-crd.yaml",
        "optional/egress.yaml",
        "optional/k8s-metadata-rbac.yaml",
    ] {
        assert!(
            names.contains(&&PathBuf::from(expected)),
            "{expected} not rendered"
        );
    }
}

#[test]
fn chart_version_is_the_workspace_version() {
    let chart = std::fs::read_to_string(chart_dir().join("Chart.yaml")).unwrap();
    let chart: Value = serde_saphyr::from_str(&chart).unwrap();
    assert_eq!(chart["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(chart["appVersion"], env!("CARGO_PKG_VERSION"));
}

#[test]
fn helm_lint_is_clean_for_every_scenario() {
    let helm = helm();
    for (name, values) in scenarios() {
        let mut cmd = helm_command(&helm);
        cmd.args(["lint", "--strict", "--namespace", NAMESPACE])
            .arg(chart_dir());
        if let Some(v) = &values {
            cmd.arg("--values").arg(v);
        }
        let out = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "helm lint ({name}):\n{text}");
        assert!(
            !text.contains("[WARNING]") && !text.contains("[ERROR]"),
            "helm lint ({name}):\n{text}"
        );
    }
}

/// values.schema.json refuses a misspelled or mistyped value, naming it, instead of the chart
/// ignoring it.
#[test]
fn a_misspelled_or_mistyped_value_is_refused() {
    let helm = helm();
    for (set, named) in [
        ("loxilb.url=http://192.0.2.1:11111", "'url' not allowed"),
        ("replica=3", "'replica' not allowed"),
        ("env.LB_MODE=fullnat", "LB_MODE"),
        ("loxilb.urls[0]=192.0.2.1:11111", "/loxilb/urls/0"),
        ("extraArgs[0]=setLBMode=2", "/extraArgs/0"),
        ("loxilb.discovery.servce=x", "'servce' not allowed"),
        ("haRoles.setRoles=not-an-ip", "/haRoles/setRoles"),
        ("haRoles.numZoneInstances=0", "/haRoles/numZoneInstances"),
        ("privateCIDR=10.10.0.1 /24", "/privateCIDR"),
        // The documentation's placeholder, copied as it is.
        ("image.repository=<registry>/loxi-ccm", "/image/repository"),
        ("image.tag=0.1.0 ", "/image/tag"),
        // Discovery is off whenever a URL is given: the default URL must be removed.
        ("loxilb.discovery.enabled=true", "set loxilb.urls to []"),
    ] {
        let out = helm_command(&helm)
            .args(["template", RELEASE])
            .arg(chart_dir())
            .args(["--set", set])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(named),
            "--set {set}: {err}"
        );
    }
}

/// The environment variables and arguments the container of a rendering gets.
fn container_settings(docs: &[Value]) -> (BTreeMap<String, String>, Vec<String>) {
    let config_map = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "loxi-ccm-config")
        .expect("the settings ConfigMap");
    let env: BTreeMap<String, String> = config_map["data"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
        .collect();
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("the Deployment");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["envFrom"][0]["configMapRef"]["name"], "loxi-ccm-config",
        "the container reads the ConfigMap"
    );
    let args = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    (env, args)
}

#[test]
fn every_rendered_setting_is_one_loxi_ccm_accepts() {
    use clap::CommandFactory;
    let helm = helm();
    let cli = loxi_ccm::config::cli::Cli::command();
    let run = cli.find_subcommand("run").unwrap();
    // Each LOXI_CCM_* variable of `run`, with its argument's id and flag.
    let arg_of_env: BTreeMap<String, (String, String)> = run
        .get_arguments()
        .filter_map(|a| {
            Some((
                a.get_env()?.to_string_lossy().to_string(),
                (a.get_id().to_string(), a.get_long()?.to_string()),
            ))
        })
        .collect();
    for (name, values) in scenarios() {
        let docs = documents(&render(&helm, values.as_deref(), &[]));
        let (env, args) = container_settings(&docs);
        assert_eq!(args.first().map(String::as_str), Some("run"), "{name}");
        // The container's arguments alone first: what they set wins over the variables, as
        // clap gives a flag precedence over its environment variable.
        let extra = &args[1..];
        let from_args = cli
            .clone()
            .try_get_matches_from(
                ["loxi-ccm", "run"]
                    .into_iter()
                    .map(String::from)
                    .chain(extra.iter().cloned()),
            )
            .unwrap_or_else(|e| panic!("{name}: {extra:?}: {e}"));
        let (_, run_matches) = from_args.subcommand().unwrap();
        // Then every variable as the flag it stands for, unless an argument sets it.
        let mut argv = vec!["loxi-ccm".to_string(), "run".into()];
        for (key, value) in &env {
            if key == "LOXI_CCM_LOXILB_CA_FILE" {
                // A path inside the container: it must be the mounted CA, which the parse
                // below would try to read on this machine.
                let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
                let pod = &deployment["spec"]["template"]["spec"];
                let mount = &pod["containers"][0]["volumeMounts"][0];
                assert_eq!(
                    format!("{}/ca.crt", mount["mountPath"].as_str().unwrap()),
                    *value,
                    "{name}"
                );
                assert_eq!(pod["volumes"][0]["name"], mount["name"], "{name}");
                assert!(pod["volumes"][0]["configMap"]["name"].is_string(), "{name}");
                continue;
            }
            let (id, flag) = arg_of_env
                .get(key)
                .unwrap_or_else(|| panic!("{name}: {key} is no setting of loxi-ccm run"));
            if run_matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine) {
                continue;
            }
            argv.push(format!("--{flag}={value}"));
        }
        argv.extend(extra.iter().cloned());
        let parsed = <loxi_ccm::config::cli::Cli as clap::Parser>::try_parse_from(&argv)
            .unwrap_or_else(|e| panic!("{name}: {argv:?}: {e}"));
        let loxi_ccm::config::cli::Command::Run(run_args) = parsed.command;
        if let Err(e) = loxi_ccm::config::Config::from_args(&run_args) {
            panic!("{name}: {argv:?}: {e}");
        }
    }
}

/// `nodeInventory` values become the ConfigMap loxi-ccm is told to watch, holding an inventory
/// its own parser accepts with every entry; without them, neither the ConfigMap nor the
/// setting is rendered (Nodes are initialized without topology labels).
#[test]
fn the_inventory_values_render_an_inventory_loxi_ccm_accepts() {
    let helm = helm();
    let mut with_inventory = 0;
    for (name, values) in scenarios() {
        let docs = documents(&render(&helm, values.as_deref(), &[]));
        let (env, _) = container_settings(&docs);
        let inventory = docs
            .iter()
            .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "loxi-ccm-inventory");
        let Some(inventory) = inventory else {
            assert!(!env.contains_key("LOXI_CCM_INVENTORY_CONFIGMAP"), "{name}");
            continue;
        };
        with_inventory += 1;
        assert_eq!(
            env.get("LOXI_CCM_INVENTORY_CONFIGMAP").map(String::as_str),
            Some(format!("{NAMESPACE}/loxi-ccm-inventory").as_str()),
            "{name}"
        );
        let text = inventory["data"]["inventory.yaml"].as_str().unwrap();
        let parsed = loxi_ccm::node_init::parse_inventory(text, &name)
            .unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
        let given = values.as_deref().map(|v| {
            let v: Value = serde_saphyr::from_str(&std::fs::read_to_string(v).unwrap()).unwrap();
            v["nodeInventory"]["nodes"].as_array().map_or(0, Vec::len)
        });
        assert_eq!(Some(parsed.entries.len()), given, "{name}");
    }
    assert!(with_inventory > 0, "no scenario sets nodeInventory");
}

/// The Prometheus Operator's own ServiceMonitor and PrometheusRule CRDs (from its Go module,
/// pinned in testenv): with `--validate=strict` a field of ours the operator's API does not
/// know, or puts elsewhere, is refused.
fn monitoring_crds() -> Vec<PathBuf> {
    ["servicemonitors", "prometheusrules"]
        .into_iter()
        .map(|plural| {
            testenv::tools::prometheus_operator_crd(plural)
                .expect("the Prometheus Operator's CRDs come from its Go module")
        })
        .collect()
}

#[tokio::test]
async fn every_scenario_applies_to_the_real_api_server() {
    let helm = helm();
    let cp = testenv::ControlPlane::start().await.expect("control plane");
    // The CRDs first, for real (a dry run of a custom resource needs its CRD served).
    let crds = chart_dir().join("crds");
    let mut args = vec![
        "apply".to_string(),
        "--validate=strict".into(),
        "-f".into(),
        crds.to_string_lossy().into(),
    ];
    for crd in monitoring_crds() {
        args.extend(["-f".into(), crd.to_string_lossy().into()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, out) = kubectl(&cp, &args, None);
    assert!(ok, "kubectl {args:?}: {out}");
    let (ok, out) = kubectl(
        &cp,
        &[
            "wait",
            "--for=condition=established",
            "--timeout=60s",
            "crd/addressclaims.ipam.loxilb.io",
            "crd/addresspools.ipam.loxilb.io",
            "crd/servicemonitors.monitoring.coreos.com",
            "crd/prometheusrules.monitoring.coreos.com",
        ],
        None,
    );
    assert!(ok, "{out}");
    // The CRDs document themselves (tests/crds.rs checks every field has a description).
    // The API server publishes a new CRD's OpenAPI schema a moment after the CRD is
    // Established, so `kubectl explain` is asked again until it knows the resource.
    for resource in ["addresspool.spec", "addressclaim.spec"] {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let (ok, out) = loop {
            let (ok, out) = kubectl(&cp, &["explain", resource], None);
            if ok || std::time::Instant::now() > deadline {
                break (ok, out);
            }
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        };
        assert!(
            ok && out.contains("DESCRIPTION:") && out.contains("FIELDS:"),
            "kubectl explain {resource}:\n{out}"
        );
    }
    let mut kinds_seen = std::collections::BTreeSet::new();
    for (name, values) in scenarios() {
        let rendered = render(&helm, values.as_deref(), &[]);
        for doc in documents(&rendered) {
            kinds_seen.insert(doc["kind"].as_str().unwrap().to_string());
        }
        let (ok, out) = kubectl(
            &cp,
            &["apply", "--dry-run=server", "--validate=strict", "-f", "-"],
            Some(&rendered),
        );
        assert!(ok, "{name}: kubectl apply --dry-run=server:\n{out}");
        assert!(out.contains("(server dry run)"), "{name}: {out}");
    }
    // The scenarios together exercise every object the chart can render.
    for kind in [
        "AddressPool",
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "Deployment",
        "PodDisruptionBudget",
        "PrometheusRule",
        "Role",
        "RoleBinding",
        "Secret",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    ] {
        assert!(
            kinds_seen.contains(kind),
            "no scenario renders a {kind}: {kinds_seen:?}"
        );
    }
}

/// [`common::poll_for`] with the chart's timeout (helm installs and Pods take time), failing
/// with the control plane's log tails.
async fn wait_for<T, Fut: std::future::Future<Output = Option<T>>>(
    what: &str,
    cp: &testenv::ControlPlane,
    f: impl FnMut() -> Fut,
) -> T {
    let (timeout, every) = (Duration::from_secs(90), Duration::from_millis(200));
    common::poll_for(what, timeout, every, || format!("\n{}", cp.log_tails()), f).await
}

#[tokio::test]
async fn helm_install_creates_the_deployment_and_its_pods() {
    let helm = helm();
    let cp = testenv::ControlPlane::start().await.expect("control plane");
    cp.start_controller_manager(&["deployment", "replicaset"])
        .expect("kube-controller-manager");
    let out = helm_command(&helm)
        .args(["install", RELEASE])
        .arg(chart_dir())
        .args(["--namespace", NAMESPACE, "--kubeconfig"])
        .arg(cp.kubeconfig_path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "helm install: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let notes = String::from_utf8_lossy(&out.stdout);
    assert!(notes.contains("loxi-ccm check"), "NOTES: {notes}");

    let client = cp.admin_client().await.unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    let deployment = deployments.get("loxi-ccm").await.expect("the Deployment");
    assert_eq!(deployment.spec.replicas, Some(2));
    let selector = "app.kubernetes.io/name=loxi-ccm";
    let replica_sets: Api<ReplicaSet> = Api::namespaced(client.clone(), NAMESPACE);
    wait_for("the ReplicaSet of the Deployment", &cp, || async {
        let sets = replica_sets
            .list(&ListParams::default().labels(selector))
            .await
            .ok()?
            .items;
        sets.iter()
            .any(|rs| {
                rs.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.kind == "Deployment" && o.name == "loxi-ccm")
            })
            .then_some(())
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let created = wait_for("2 Pods created by the ReplicaSet", &cp, || async {
        let pods = pods
            .list(&ListParams::default().labels(selector))
            .await
            .ok()?
            .items;
        (pods.len() == 2).then_some(pods)
    })
    .await;
    for pod in &created {
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.service_account_name.as_deref(), Some("loxi-ccm"));
        assert_eq!(
            spec.containers[0].image.as_deref(),
            Some(format!("ghcr.io/loxi-ccm/loxi-ccm:{}", env!("CARGO_PKG_VERSION")).as_str())
        );
        // No kubelet or scheduler here: the Pods exist and wait for a node.
        assert_eq!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Pending")
        );
    }
    // The release is what helm reports.
    let out = helm_command(&helm)
        .args(["status", RELEASE, "--namespace", NAMESPACE, "--kubeconfig"])
        .arg(cp.kubeconfig_path())
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("STATUS: deployed"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// `loxilb.watchTokenSecret` (ci/token-secret-watch-values.yaml), applied for real: the
/// ServiceAccount may read exactly the token Secret, the way the controller reads it
/// (crates/loxi-ccm/src/config/token.rs: a get, then a list and watch with the field selector
/// metadata.name), and no other Secret; the controller's watch, authenticated as that
/// ServiceAccount, follows a token rotation.
#[tokio::test]
async fn the_watched_token_secret_is_the_only_secret_the_service_account_reads() {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
    use kube::api::{Patch, PatchParams, PostParams};
    use loxi_ccm::config::token::{SecretRef, read_secret, watch_secret};

    let helm = helm();
    let values = chart_dir().join("ci/token-secret-watch-values.yaml");
    let rendered = render(&helm, Some(&values), &[]);
    let docs = documents(&rendered);
    let (env, _) = container_settings(&docs);
    let secret_ref = env
        .get("LOXI_CCM_LOXILB_TOKEN_SECRET")
        .expect("the Secret is named in the settings");
    let secret_ref = SecretRef::parse(secret_ref).unwrap();
    assert_eq!(secret_ref.namespace, NAMESPACE);
    assert_eq!(secret_ref.name, "loxi-ccm-loxilb-auth");
    // The token is not also passed as a variable (only one token option is accepted).
    assert!(
        !rendered.contains("name: LOXI_CCM_LOXILB_TOKEN\n"),
        "{rendered}"
    );

    let cp = testenv::ControlPlane::start().await.expect("control plane");
    let (ok, out) = kubectl(
        &cp,
        &["apply", "--validate=strict", "-f", "-"],
        Some(&rendered),
    );
    assert!(ok, "kubectl apply: {out}");
    let admin = cp.admin_client().await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), NAMESPACE);
    let other = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("another-secret".into()),
            ..Default::default()
        },
        string_data: Some([("token".to_string(), "not-for-loxi-ccm".to_string())].into()),
        ..Default::default()
    };
    secrets
        .create(&PostParams::default(), &other)
        .await
        .unwrap();

    // What the authorizer answers for the ServiceAccount.
    let sa = format!("--as=system:serviceaccount:{NAMESPACE}:loxi-ccm");
    for (verb, what, expected) in [
        ("get", "secret/loxi-ccm-loxilb-auth", "yes"),
        ("list", "secret/loxi-ccm-loxilb-auth", "yes"),
        ("watch", "secret/loxi-ccm-loxilb-auth", "yes"),
        ("get", "secret/another-secret", "no"),
        ("list", "secrets", "no"),
        ("watch", "secrets", "no"),
        ("update", "secret/loxi-ccm-loxilb-auth", "no"),
    ] {
        let (_, out) = kubectl(
            &cp,
            &["auth", "can-i", verb, what, "-n", NAMESPACE, &sa],
            None,
        );
        assert_eq!(
            out.lines().next().unwrap_or_default().trim(),
            expected,
            "can-i {verb} {what}: {out}"
        );
    }

    // The same with the ServiceAccount's own token, the way the controller calls.
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), NAMESPACE);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let token = sas
        .create_token_request("loxi-ccm", &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .and_then(|s| s.token)
        .expect("a ServiceAccount token");
    let kubeconfig = cp.dir().join("loxi-ccm-sa.kubeconfig");
    cp.write_kubeconfig(&kubeconfig, &token).unwrap();
    let as_sa = cp.client_for_kubeconfig(&kubeconfig).await.unwrap();
    let sa_secrets: Api<Secret> = Api::namespaced(as_sa.clone(), NAMESPACE);
    let forbidden =
        |r: Result<_, kube::Error>| matches!(r, Err(kube::Error::Api(e)) if e.code == 403);
    assert!(forbidden(
        sa_secrets.get("another-secret").await.map(|_| ())
    ));
    assert!(forbidden(
        sa_secrets.list(&ListParams::default()).await.map(|_| ())
    ));
    let by_name = ListParams::default().fields("metadata.name=loxi-ccm-loxilb-auth");
    assert_eq!(sa_secrets.list(&by_name).await.unwrap().items.len(), 1);
    assert_eq!(
        read_secret(&as_sa, &secret_ref).await.unwrap().as_deref(),
        Some("example-loxilb-token")
    );

    // The controller's watch, as the ServiceAccount: the chart's token, then a rotation.
    let cell = loxilb_client::Token::new(None);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let watch = tokio::spawn(watch_secret(
        as_sa.clone(),
        secret_ref.clone(),
        cell.clone(),
        async move {
            let _ = stop_rx.await;
        },
    ));
    let holds = |value: &'static str| {
        let cell = cell.clone();
        move || {
            let cell = cell.clone();
            async move { (cell.get().as_deref() == Some(value)).then_some(()) }
        }
    };
    wait_for(
        "the chart's token through the watch",
        &cp,
        holds("example-loxilb-token"),
    )
    .await;
    secrets
        .patch(
            "loxi-ccm-loxilb-auth",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"stringData": {"token": "rotated-token"}})),
        )
        .await
        .unwrap();
    wait_for(
        "the rotated token through the watch",
        &cp,
        holds("rotated-token"),
    )
    .await;
    stop_tx.send(()).unwrap();
    watch.await.unwrap();

    // `loxi-ccm check` as the ServiceAccount, with the scenario's settings: it reads the token
    // from the Secret and finds every permission `run` needs granted by the chart. (No loxilb
    // runs here: the URL is a closed port.)
    let out = check_as(
        &kubeconfig,
        &env,
        &[("LOXI_CCM_LOXILB_URL", "http://127.0.0.1:1")],
    )
    .await;
    assert!(
        out.lines()
            .any(|l| l.starts_with("OK   loxilb token") && l.contains("holds a token")),
        "{out}"
    );
    assert!(
        out.lines().any(|l| l.starts_with("OK   permissions")),
        "{out}"
    );
    assert!(
        !out.contains("rotated-token"),
        "the token is never printed: {out}"
    );

    // The same for the discovery scenario: the chart's RBAC covers the EndpointSlice watch
    // of the loxilb Service and the HA role record.
    let values = chart_dir().join("ci/in-cluster-discovery-values.yaml");
    let rendered = render(&helm, Some(&values), &[]);
    let (env, _) = container_settings(&documents(&rendered));
    assert!(
        env.contains_key("LOXI_CCM_LOXILB_SERVICE") && !env.contains_key("LOXI_CCM_LOXILB_URL")
    );
    let (ok, out) = kubectl(
        &cp,
        &["apply", "--validate=strict", "-f", "-"],
        Some(&rendered),
    );
    assert!(ok, "kubectl apply: {out}");
    let out = check_as(&kubeconfig, &env, &[]).await;
    assert!(
        out.lines().any(|l| l.starts_with("OK   permissions")),
        "{out}"
    );
}

/// The output of `loxi-ccm check` run with `kubeconfig` and the settings `env` (then
/// `overrides`), and nothing else from this process' environment.
async fn check_as(
    kubeconfig: &Path,
    env: &BTreeMap<String, String>,
    overrides: &[(&str, &str)],
) -> String {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_loxi-ccm"));
    cmd.arg("check")
        .env_clear()
        .env("KUBECONFIG", kubeconfig)
        .envs(env)
        .envs(overrides.iter().copied())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("loxi-ccm check stops within 60 s")
        .expect("the loxi-ccm binary runs");
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}
