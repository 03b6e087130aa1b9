//! The part of a Pod this controller reads (Egress sources, the metadata sent to loxilb).
//!
//! Pods are watched and listed as [`PodView`], not as `k8s_openapi`'s `Pod`: the API server
//! sends the whole object, and serde skips every field not named here. The full Pod schema
//! (containers, volumes, affinities: over a hundred types) is then never parsed, and never
//! compiled into the binary: with it, `.text` was 2.8 MB larger, and since nearly every page
//! of the binary ends up resident, that was 1.9 MiB of the controller's RSS even with no Pod
//! watched (docs/BENCHMARKS.md).

use k8s_openapi::api::core::v1::Pod;
use kube::core::ObjectMeta;
use serde::Deserialize;

/// A Pod as read here: its metadata, its Node, its phase and its addresses.
#[derive(kube::Resource, Deserialize, Clone, Debug, Default, PartialEq)]
#[resource(inherit = Pod)]
pub struct PodView {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: PodViewSpec,
    #[serde(default)]
    pub status: PodViewStatus,
}

/// `spec`: where the Pod runs.
#[derive(Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodViewSpec {
    pub node_name: Option<String>,
}

/// `status`: the phase and the addresses.
#[derive(Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodViewStatus {
    pub phase: Option<String>,
    #[serde(rename = "podIP")]
    pub pod_ip: Option<String>,
    #[serde(default, rename = "podIPs")]
    pub pod_ips: Vec<PodAddress>,
}

/// One entry of `status.podIPs`.
#[derive(Deserialize, Clone, Debug, Default, PartialEq)]
pub struct PodAddress {
    pub ip: String,
}

impl PodView {
    /// Whether the Pod has ended (`Succeeded` or `Failed`): it no longer sends traffic.
    pub fn finished(&self) -> bool {
        matches!(self.status.phase.as_deref(), Some("Succeeded" | "Failed"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_pod_reads_as_its_view_and_the_rest_is_skipped() {
        let pod = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web-0", "namespace": "shop", "labels": {"app": "web"}},
            "spec": {
                "nodeName": "node-1",
                "containers": [{"name": "web", "image": "nginx", "ports": [{"containerPort": 80}]}],
                "volumes": [{"name": "data", "emptyDir": {}}]
            },
            "status": {
                "phase": "Running",
                "podIP": "10.244.1.7",
                "podIPs": [{"ip": "10.244.1.7"}, {"ip": "fd00::7"}],
                "conditions": [{"type": "Ready", "status": "True"}]
            }
        });
        let view: PodView = serde_json::from_value(pod).unwrap();
        assert_eq!(view.metadata.name.as_deref(), Some("web-0"));
        assert_eq!(view.spec.node_name.as_deref(), Some("node-1"));
        assert_eq!(view.status.pod_ip.as_deref(), Some("10.244.1.7"));
        let ips: Vec<&str> = view.status.pod_ips.iter().map(|a| a.ip.as_str()).collect();
        assert_eq!(ips, ["10.244.1.7", "fd00::7"]);
        assert!(!view.finished());
    }

    #[test]
    fn a_pending_pod_without_spec_or_status_reads_as_empty() {
        let view: PodView = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"}
        }))
        .unwrap();
        assert_eq!(view.spec, PodViewSpec::default());
        assert_eq!(view.status, PodViewStatus::default());
    }

    #[test]
    fn the_view_is_served_where_pods_are() {
        use kube::Resource as _;
        assert_eq!(PodView::kind(&()), "Pod");
        assert_eq!(PodView::api_version(&()), "v1");
        assert_eq!(PodView::plural(&()), "pods");
    }
}
