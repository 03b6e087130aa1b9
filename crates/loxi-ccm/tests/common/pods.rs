//! Pods as the tests make them: no kubelet runs, so a pod's status (Running, its IP) is
//! written as a kubelet would write it.

use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

use super::World;

/// The world's namespace's `default` ServiceAccount, which pods need (no controller-manager
/// runs here to make it); left as it is when it exists.
pub async fn default_service_account(w: &World) {
    let sas: Api<ServiceAccount> = Api::namespaced(w.client.clone(), &w.ns);
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("default".into()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    let _ = sas.create(&PostParams::default(), &sa).await;
}

/// A pod of the world's namespace with `labels` whose status shows `ip`, as a kubelet would
/// write it.
pub async fn running_pod(w: &World, name: &str, labels: &[(&str, &str)], ip: &str) {
    let pods: Api<Pod> = Api::namespaced(w.client.clone(), &w.ns);
    let labels: std::collections::BTreeMap<&str, &str> = labels.iter().copied().collect();
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "example.invalid/none"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &p).await.unwrap();
    let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
}
