//! Nodes as the tests make them: a name, an InternalIP and a Ready condition.

use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition, NodeStatus};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};

/// The status of a Node with InternalIP `ip`, Ready or not.
pub fn node_status(ip: &str, ready: bool) -> NodeStatus {
    NodeStatus {
        addresses: Some(vec![NodeAddress {
            type_: "InternalIP".into(),
            address: ip.into(),
        }]),
        conditions: Some(vec![NodeCondition {
            type_: "Ready".into(),
            status: if ready { "True" } else { "False" }.into(),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

/// A Ready Node object with InternalIP `ip` (for code that takes objects, not the API).
pub fn ready_node(name: &str, ip: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        status: Some(node_status(ip, true)),
        ..Default::default()
    }
}

/// Creates the Node `name` through the API, then gives it a Ready status with InternalIP `ip`
/// (the API server ignores the status of a create).
pub async fn add_node(nodes: &Api<Node>, name: &str, ip: &str) {
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    nodes.create(&PostParams::default(), &node).await.unwrap();
    set_node_status(nodes, name, ip, true).await;
}

/// Replaces the status of the Node `name`: InternalIP `ip`, Ready or not.
pub async fn set_node_status(nodes: &Api<Node>, name: &str, ip: &str, ready: bool) {
    let status = node_status(ip, ready);
    nodes
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "status": status })),
        )
        .await
        .unwrap();
}
