//! The shipped Deployment passes the `restricted` Pod Security Standard: `deploy/` applied
//! with kubectl to a real API server, kube-controller-manager running (Deployment and
//! ReplicaSet controllers), the namespace (kube-system) labelled
//! `pod-security.kubernetes.io/enforce: restricted`. The ReplicaSet must create its Pods:
//! the API server's PodSecurity admission refuses a Pod that breaks the standard, and the
//! ReplicaSet then reports `ReplicaFailure`. There is no kubelet, so the Pods never run;
//! admission is what is tested.
//!
//! A copy of the Deployment without its security settings, in the same namespace, shows that
//! the namespace really refuses such Pods (so the test can fail).

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const NS: &str = "kube-system";
const WAIT: Duration = Duration::from_secs(120);

fn deploy_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// The ReplicaSets of a Deployment (by owner).
async fn replica_sets_of(api: &Api<ReplicaSet>, deployment: &str) -> Vec<ReplicaSet> {
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|rs| {
            rs.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.kind == "Deployment" && o.name == deployment)
        })
        .collect()
}

/// `ReplicaFailure` messages of a ReplicaSet (what the controller says when the API server
/// refuses its Pods).
fn failures(rs: &ReplicaSet) -> Vec<String> {
    rs.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .filter(|c| {
            c.type_.as_deref() == Some("ReplicaFailure") && c.status.as_deref() == Some("True")
        })
        .map(|c| c.message.clone().unwrap_or_default())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn shipped_deployment_is_admitted_in_a_restricted_namespace() {
    let cp = testenv::ControlPlane::start()
        .await
        .expect("control plane starts");
    cp.start_controller_manager(&["deployment", "replicaset"])
        .expect("kube-controller-manager starts");
    let client = cp.admin_client().await.unwrap();

    // The namespace enforces the restricted standard before anything is applied.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .patch(
            NS,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
            }}})),
        )
        .await
        .unwrap();

    common::kubectl_apply_strict(&cp, &deploy_dir());

    // The control: the same Deployment stripped of its security settings is refused.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let mut open = deployments.get("loxi-ccm").await.unwrap();
    open.metadata = kube::api::ObjectMeta {
        name: Some("loxi-ccm-unrestricted".into()),
        namespace: Some(NS.into()),
        ..Default::default()
    };
    open.status = None;
    let spec = &mut open.spec;
    let labels = [(
        "app.kubernetes.io/name".to_string(),
        "loxi-ccm-unrestricted".to_string(),
    )];
    spec.selector.match_labels = Some(labels.clone().into());
    let template = &mut spec.template;
    template.metadata.as_mut().unwrap().labels = Some(labels.into());
    let pod = template.spec.as_mut().unwrap();
    pod.security_context = None;
    for c in &mut pod.containers {
        c.security_context = None;
    }
    deployments
        .create(&PostParams::default(), &open)
        .await
        .unwrap();

    let replica_sets: Api<ReplicaSet> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let deadline = Instant::now() + WAIT;
    let mut shipped_ok = false;
    let mut control_refused = false;
    while !(shipped_ok && control_refused) {
        if Instant::now() > deadline {
            let shipped: Vec<_> = replica_sets_of(&replica_sets, "loxi-ccm")
                .await
                .iter()
                .map(|rs| (rs.status.clone(), failures(rs)))
                .collect();
            panic!(
                "after {WAIT:?}: shipped Deployment's Pods created: {shipped_ok} \
                 (ReplicaSets: {shipped:?}); unrestricted copy refused: {control_refused}\n{}",
                cp.log_tails()
            );
        }
        let shipped = replica_sets_of(&replica_sets, "loxi-ccm").await;
        for rs in &shipped {
            let refused = failures(rs);
            assert!(
                refused.is_empty(),
                "the shipped Deployment's Pods were refused: {refused:?}"
            );
        }
        let created = pods
            .list(&ListParams::default().labels("app.kubernetes.io/name=loxi-ccm"))
            .await
            .unwrap()
            .items;
        let want = deployments
            .get("loxi-ccm")
            .await
            .unwrap()
            .spec
            .replicas
            .unwrap_or(1);
        shipped_ok = !shipped.is_empty() && created.len() == usize::try_from(want).unwrap();
        control_refused = replica_sets_of(&replica_sets, "loxi-ccm-unrestricted")
            .await
            .iter()
            .flat_map(failures)
            .any(|m| m.contains("PodSecurity") && m.contains("restricted"));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // What the admitted Pods run as: the Deployment's settings, as written.
    let created = pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=loxi-ccm"))
        .await
        .unwrap()
        .items;
    for pod in &created {
        let spec = pod.spec.as_ref().unwrap();
        let c = &spec.containers[0];
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop.as_deref(),
            Some(&["ALL".to_string()][..])
        );
        let pod_sc = spec.security_context.as_ref().unwrap();
        assert_eq!(pod_sc.run_as_non_root, Some(true));
        assert_eq!(
            pod_sc.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
            Some("RuntimeDefault")
        );
    }
}
