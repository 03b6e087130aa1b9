//! The CRD manifests of the Helm chart (charts/loxi-ccm/crds, files/bgp-crds.yaml and
//! files/loxiurl-crd.yaml) are exactly what the code generates; deploy/ is rendered from the
//! chart (tests/chart.rs keeps it so).

use std::path::Path;

#[test]
fn checked_in_crds_match_the_code() {
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/loxi-ccm");
    let update = std::env::var("UPDATE_CRDS").is_ok_and(|v| v == "1");
    // The project's own CRDs are always installed (crds/); kube-loxilb's BGP and LoxiURL ones
    // only when asked (files/, rendered by templates/optional/bgp-crds.yaml and
    // loxiurl-crd.yaml).
    let ours = loxi_ccm::ipam::crds::rendered()
        .into_iter()
        .map(|(file, yaml)| (chart.join("crds").join(file), yaml));
    let optional = loxi_ccm::bgp::crds::rendered()
        .into_iter()
        .chain(loxi_ccm::config::sources::rendered())
        .chain(loxi_ccm::egress::crds::rendered())
        .map(|(file, yaml)| (chart.join("files").join(file), yaml));
    for (path, yaml) in ours.chain(optional) {
        if update {
            std::fs::write(&path, &yaml).unwrap();
            continue;
        }
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            on_disk == yaml,
            "{} differs from the generated CRD; run UPDATE_CRDS=1 cargo test -p loxi-ccm --test crds, then cargo xtask manifests",
            path.display()
        );
    }
}

/// Every named field of every CRD (spec and status, at any depth) has a description, so
/// `kubectl explain addresspool.spec` (and any field below it) reads as documentation. The
/// items of a list and the values of a map are described by their field.
#[test]
fn every_field_of_every_crd_has_a_description() {
    use kube::CustomResourceExt;
    fn walk(node: &serde_json::Value, path: &str, missing: &mut Vec<String>) {
        if let Some(properties) = node.get("properties").and_then(|p| p.as_object()) {
            for (name, field) in properties {
                let here = format!("{path}.{name}");
                let described = field
                    .get("description")
                    .and_then(|d| d.as_str())
                    .is_some_and(|d| d.trim().len() > 10);
                if !described {
                    missing.push(here.clone());
                }
                walk(field, &here, missing);
            }
        }
        if let Some(items) = node.get("items") {
            walk(items, &format!("{path}[]"), missing);
        }
        if let Some(values) = node.get("additionalProperties") {
            walk(values, &format!("{path}{{}}"), missing);
        }
    }
    let mut missing = Vec::new();
    for crd in [
        loxi_ccm::ipam::claims::AddressClaim::crd(),
        loxi_ccm::ipam::address_pools::AddressPool::crd(),
        loxi_ccm::config::sources::LoxiURL::crd(),
        loxi_ccm::egress::crds::Egress::crd(),
    ] {
        let name = crd.metadata.name.clone().unwrap_or_default();
        for version in &crd.spec.versions {
            let schema = serde_json::to_value(
                version
                    .schema
                    .as_ref()
                    .and_then(|s| s.open_api_v3_schema.as_ref())
                    .expect("a schema"),
            )
            .unwrap();
            let top = schema["properties"].clone();
            for part in ["spec", "status"] {
                if top.get(part).is_some() {
                    walk(
                        &top[part],
                        &format!("{name}/{}.{part}", version.name),
                        &mut missing,
                    );
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "fields without a description: {missing:?}"
    );
}
