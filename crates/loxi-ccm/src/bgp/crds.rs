//! kube-loxilb's four BGP custom resources, served unchanged: same groups, kinds, scope
//! (cluster), version `v1` and field names (the specs are `loxi_domain::bgp`'s types, which
//! carry kube-loxilb's spellings, capital `List` included), so its manifests apply as they
//! are. What loxi-ccm adds: OpenAPI bounds and CEL rules that refuse bad input at apply time
//! (`schema`), a status subresource (conditions `Accepted` and `Programmed`; for peers the
//! session state on each loxilb), and printer columns.
//!
//! The CRDs in `deploy/` are rendered from these types ([`rendered`]); a test keeps them
//! equal.

use kube::{CustomResource, CustomResourceExt};
use loxi_domain::bgp::{
    BGPPeerServiceSpec, BGPPolicyApplyServiceSpec, BGPPolicyDefinedSetsServiceSpec,
    BGPPolicyDefinitionServiceSpec,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::schema;
use crate::k8s::conditions::StatusCondition;

// kube's printcolumn(...) syntax repeats `type_ = "string"`, which clippy's
// duplicated_attributes lint misreads (as on AddressPool).

/// `bgppeer.loxilb.io/v1` `BGPPeerService`: one BGP neighbour of every loxilb.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "bgppeer.loxilb.io",
    version = "v1",
    kind = "BGPPeerService",
    plural = "bgppeerservices",
    category = "loxilb",
    status = "BgpStatus",
    doc = "A BGP neighbour of every loxilb (kube-loxilb's BGPPeerService, served by loxi-ccm with --bgp-crds).",
    printcolumn(name = "Peer", type_ = "string", json_path = ".spec.ipAddress"),
    printcolumn(name = "AS", type_ = "integer", json_path = ".spec.remoteAs"),
    printcolumn(name = "State", type_ = "string", json_path = ".status.state"),
    printcolumn(
        name = "Programmed",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Programmed\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[schemars(transform = schema::peer)]
pub struct PeerSpec {
    #[serde(flatten)]
    pub spec: BGPPeerServiceSpec,
}

/// `bgppolicydefinedsets.loxilb.io/v1` `BGPPolicyDefinedSetsService`: a goBGP defined set.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "bgppolicydefinedsets.loxilb.io",
    version = "v1",
    kind = "BGPPolicyDefinedSetsService",
    plural = "bgppolicydefinedsetsservices",
    category = "loxilb",
    status = "BgpStatus",
    doc = "A BGP policy defined set (prefixes, neighbours, communities, AS paths) on every loxilb (kube-loxilb's BGPPolicyDefinedSetsService, served by loxi-ccm with --bgp-crds).",
    printcolumn(name = "Name", type_ = "string", json_path = ".spec.name"),
    printcolumn(name = "Type", type_ = "string", json_path = ".spec.definedType"),
    printcolumn(
        name = "Programmed",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Programmed\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[schemars(transform = schema::defined_sets)]
pub struct DefinedSetsSpec {
    #[serde(flatten)]
    pub spec: BGPPolicyDefinedSetsServiceSpec,
}

/// `bgppolicydefinition.loxilb.io/v1` `BGPPolicyDefinitionService`: a goBGP policy.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "bgppolicydefinition.loxilb.io",
    version = "v1",
    kind = "BGPPolicyDefinitionService",
    plural = "bgppolicydefinitionservices",
    category = "loxilb",
    status = "BgpStatus",
    doc = "A BGP policy (statements of conditions and actions) on every loxilb (kube-loxilb's BGPPolicyDefinitionService, served by loxi-ccm with --bgp-crds).",
    printcolumn(name = "Name", type_ = "string", json_path = ".spec.name"),
    printcolumn(
        name = "Programmed",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Programmed\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[schemars(transform = schema::definition)]
pub struct DefinitionSpec {
    #[serde(flatten)]
    pub spec: BGPPolicyDefinitionServiceSpec,
}

/// `bgppolicyapply.loxilb.io/v1` `BGPPolicyApplyService`: policies applied to a direction.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "bgppolicyapply.loxilb.io",
    version = "v1",
    kind = "BGPPolicyApplyService",
    plural = "bgppolicyapplyservices",
    category = "loxilb",
    status = "BgpStatus",
    doc = "BGP policies applied for import or export on every loxilb (kube-loxilb's BGPPolicyApplyService, served by loxi-ccm with --bgp-crds).",
    printcolumn(name = "Target", type_ = "string", json_path = ".spec.ipAddress"),
    printcolumn(name = "Type", type_ = "string", json_path = ".spec.policyType"),
    printcolumn(
        name = "Programmed",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Programmed\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[schemars(transform = schema::apply)]
pub struct ApplySpec {
    #[serde(flatten)]
    pub spec: BGPPolicyApplyServiceSpec,
}

/// What the controller (its leader) last saw of the resource.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BgpStatus {
    /// `Accepted`: the spec is valid (otherwise the reason and the field). `Programmed`: every
    /// reachable loxilb holds it (otherwise each loxilb's error).
    #[serde(default)]
    pub conditions: Vec<StatusCondition>,
    /// Peers: the session state, the same on every loxilb (`ESTABLISHED`, `ACTIVE`, ...), or
    /// each loxilb's `state` separated by commas when they differ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Peers: the session on each loxilb, as its `GET /config/bgp/neigh/all` lists it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sessions: Vec<PeerSession>,
}

/// The session of one loxilb with the peer.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PeerSession {
    /// The loxilb's API URL.
    pub loxilb: String,
    /// goBGP's session state: IDLE, CONNECT, ACTIVE, OPENSENT, OPENCONFIRM, ESTABLISHED.
    pub state: String,
    /// RFC 3339 time since which the controller sees this state.
    pub since: String,
}

/// `(file name, YAML)`: the four CRDs in one file, `charts/loxi-ccm/files/bgp-crds.yaml`, which
/// the chart renders with `bgpCrds.enabled` and `deploy/optional/` holds (only needed with
/// `--bgp-crds`; `kubectl apply -f deploy/` does not descend there). Marked for Helm to keep
/// (`helm.sh/resource-policy: keep`): neither an upgrade without the value nor an uninstall
/// deletes them, and with them every BGP resource (docs/bgp.md).
pub fn rendered() -> Vec<(&'static str, String)> {
    let header = "# Generated from the Rust types by loxi-ccm (crates/loxi-ccm/src/bgp/crds.rs).\n# Do not edit: change the code and run `UPDATE_CRDS=1 cargo test -p loxi-ccm --test crds`.\n# kube-loxilb's BGP resources, served with --bgp-crds (kube-loxilb: --enableBGPCRDs): docs/bgp.md.\n";
    let docs: Vec<String> = [
        BGPPeerService::crd(),
        BGPPolicyDefinedSetsService::crd(),
        BGPPolicyDefinitionService::crd(),
        BGPPolicyApplyService::crd(),
    ]
    .into_iter()
    .map(|mut crd| {
        crate::k8s::served::kept_by_helm(&mut crd.metadata);
        serde_saphyr::to_string(&crd).unwrap_or_default()
    })
    .collect();
    vec![(
        "bgp-crds.yaml",
        format!("{header}---\n{}", docs.join("---\n")),
    )]
}
