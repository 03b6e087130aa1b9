//! The CustomResourceDefinitions loxi-ccm owns, rendered as the YAML shipped in the Helm
//! chart's `crds/` (`charts/loxi-ccm/crds`), from which `cargo xtask manifests` copies them into
//! `deploy/`. Tests keep both equal to what the code generates.

use kube::CustomResourceExt;

use crate::ipam::address_pools::AddressPool;
use crate::ipam::claims::AddressClaim;

/// `(file name under charts/loxi-ccm/crds/ and deploy/, YAML)` for every CRD.
pub fn rendered() -> Vec<(&'static str, String)> {
    let header = "# Generated from the Rust types by loxi-ccm (crates/loxi-ccm/src/ipam/crds.rs).\n# Do not edit: change the code and run `UPDATE_CRDS=1 cargo test -p loxi-ccm --test crds`,\n# then `cargo xtask manifests` (deploy/ is rendered from the chart).\n";
    vec![
        (
            "05-crd-addressclaims.yaml",
            format!(
                "{header}{}",
                serde_saphyr::to_string(&AddressClaim::crd()).unwrap_or_default()
            ),
        ),
        (
            "06-crd-addresspools.yaml",
            format!(
                "{header}{}",
                serde_saphyr::to_string(&AddressPool::crd()).unwrap_or_default()
            ),
        ),
    ]
}
