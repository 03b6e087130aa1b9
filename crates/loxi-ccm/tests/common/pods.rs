//! Pods as the tests make them: no kubelet runs, so a pod's status (Running, its IP) is
//! written as a kubelet would write it.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ServiceAccount};
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
    let p = Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "c".into(),
                image: Some("example.invalid/none".into()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    pods.create(&PostParams::default(), &p).await.unwrap();
    let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
}
