//! kube-loxilb's `Egress` resource, served unchanged: group `egress.loxilb.io`, version
//! `v1`, namespaced, kind `Egress`, spec `addresses`, `vip` and `selector` with kube-loxilb's
//! spellings, so its manifests apply as they are. What loxi-ccm adds: a status (how many
//! loxilbs hold its rules, its sources, conflicts, conditions `Accepted` and `Programmed`) and
//! printer columns.
//!
//! The CRD the chart ships (`charts/loxi-ccm/files/egress-crd.yaml`, `deploy/optional/`) is
//! rendered from these types ([`rendered`]); a test keeps them equal.

use std::collections::BTreeMap;

use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::k8s::conditions::StatusCondition;

/// `egress.loxilb.io/v1` `Egress`: traffic of the listed sources and of the selected pods
/// leaves through loxilb with the `vip` as its source address.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "egress.loxilb.io",
    version = "v1",
    kind = "Egress",
    plural = "egresses",
    namespaced,
    category = "loxilb",
    status = "EgressStatus",
    doc = "Source NAT of pods' and addresses' outgoing traffic to one address on every loxilb (kube-loxilb's Egress, served by loxi-ccm with --egress).",
    printcolumn(name = "VIP", type_ = "string", json_path = ".spec.vip"),
    printcolumn(name = "Loxilbs", type_ = "string", json_path = ".status.programmed"),
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
#[serde(default)]
pub struct EgressSpec {
    /// Source addresses whose traffic is NATed to the vip: IP addresses or CIDRs, of the
    /// vip's family.
    pub addresses: Vec<String>,
    /// The address outgoing traffic of the sources leaves with (an IP address).
    pub vip: String,
    /// Pod labels: the addresses of the pods of this namespace carrying all of them are
    /// sources too, followed as pods come and go (with the annotation loxilb.io/multus-nets,
    /// their addresses on those Multus networks). Empty selects no pod.
    pub selector: BTreeMap<String, String>,
}

/// What the controller (its leader) last did with the resource.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EgressStatus {
    /// `Accepted`: the spec is valid (otherwise the field and the reason). `Programmed`:
    /// every loxilb holds its rules (otherwise each loxilb's error, or the sources another
    /// Egress holds).
    #[serde(default)]
    pub conditions: Vec<StatusCondition>,
    /// How many loxilbs hold its rules, of how many: `n/m`.
    #[serde(default)]
    pub programmed: String,
    /// The sources NATed for it now (addresses and selected pods), as CIDRs.
    #[serde(default)]
    pub sources: Vec<String>,
    /// Sources it names that an older Egress holds (loxilb keeps one rule per source).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflicts: Vec<String>,
}

impl EgressSpec {
    /// The domain's view of the spec.
    pub fn to_domain(&self) -> loxi_domain::egress::EgressSpec {
        loxi_domain::egress::EgressSpec {
            addresses: self.addresses.clone(),
            vip: self.vip.clone(),
            selector: self.selector.clone(),
        }
    }
}

/// `(file name, YAML)`: the CRD, `charts/loxi-ccm/files/egress-crd.yaml`, which the chart
/// renders with `egress.enabled` and `deploy/optional/` holds (only needed with `--egress`).
/// Kept by Helm (`helm.sh/resource-policy: keep`), like the BGP CRDs.
pub fn rendered() -> Vec<(&'static str, String)> {
    let header = "# Generated from the Rust types by loxi-ccm (crates/loxi-ccm/src/egress/crds.rs).\n# Do not edit: change the code and run `UPDATE_CRDS=1 cargo test -p loxi-ccm --test crds`.\n# kube-loxilb's Egress resource, served with --egress: docs/egress.md.\n";
    let mut crd = Egress::crd();
    crate::k8s::served::kept_by_helm(&mut crd.metadata);
    vec![(
        "egress-crd.yaml",
        format!(
            "{header}---\n{}",
            serde_saphyr::to_string(&crd).unwrap_or_default()
        ),
    )]
}
