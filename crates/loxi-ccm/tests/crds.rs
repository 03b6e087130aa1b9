//! The CRD manifests in deploy/ are exactly what the code generates.

use std::path::Path;

#[test]
fn checked_in_crds_match_the_code() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy");
    let update = std::env::var("UPDATE_CRDS").is_ok_and(|v| v == "1");
    for (file, yaml) in loxi_ccm::ipam::crds::rendered()
        .into_iter()
        .chain(loxi_ccm::bgp::crds::rendered())
    {
        let path = deploy.join(file);
        if update {
            std::fs::write(&path, &yaml).unwrap();
            continue;
        }
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            on_disk == yaml,
            "{} differs from the generated CRD; run UPDATE_CRDS=1 cargo test -p loxi-ccm --test crds",
            path.display()
        );
    }
}
