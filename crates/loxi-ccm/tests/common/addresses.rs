//! Helpers of the address tests (`ipam_claims.rs`, `ipam_pools.rs`, `ipam_sharing.rs`):
//! AddressPools made, edited and deleted through the API, and what a Service's status says.

use std::collections::{BTreeMap, BTreeSet};

use kube::api::{Api, DeleteParams, PostParams};
use loxi_ccm::ipam::address_pools::{
    AddressPool, AddressPoolSpec, LabelSelector, LabelSelectorRequirement,
};

use super::{CLASS, WAIT, World, wait_for};

// ---------------------------------------------------------------------------------------
// AddressPool resources. Pools are cluster-scoped and outlive a test: each is named after
// the test's namespace and admits that namespace only, so a pool left behind by a failed
// test cannot capture another test's Services.

/// Admits the namespace `ns` only (the API server labels every namespace with its name).
pub fn only_ns(ns: &str) -> LabelSelector {
    LabelSelector {
        match_labels: BTreeMap::new(),
        match_expressions: vec![LabelSelectorRequirement {
            key: "kubernetes.io/metadata.name".into(),
            operator: "In".into(),
            values: vec![ns.to_string()],
        }],
    }
}

pub fn pool_spec(ns: &str, addresses: &[&str]) -> AddressPoolSpec {
    AddressPoolSpec {
        addresses: addresses.iter().map(|a| a.to_string()).collect(),
        auto_assign: true,
        avoid_buggy_ips: true,
        priority: 0,
        disabled: false,
        namespace_selector: Some(only_ns(ns)),
        service_selector: None,
        retain_addresses: None,
        bgp_advertise: true,
    }
}

pub fn pools_api(w: &World) -> Api<AddressPool> {
    Api::all(w.client.clone())
}

/// Creates the pool `<namespace>-<suffix>` and returns its name.
pub async fn create_pool(w: &World, suffix: &str, spec: AddressPoolSpec) -> String {
    let name = format!("{}-{suffix}", w.ns);
    let _ = pools_api(w).delete(&name, &DeleteParams::default()).await;
    wait_for("stale pool gone", WAIT, || async {
        pools_api(w)
            .get_opt(&name)
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    pools_api(w)
        .create(&PostParams::default(), &AddressPool::new(&name, spec))
        .await
        .unwrap();
    name
}

pub async fn delete_pools(w: &World, names: &[&String]) {
    for name in names {
        let _ = pools_api(w).delete(name, &DeleteParams::default()).await;
    }
}

/// The condition reason loxi-ccm shows for a Service's address.
pub async fn address_reason(w: &World, name: &str) -> String {
    wait_for(&format!("an address condition on {name}"), WAIT, || async {
        let s = w.get(name).await?;
        World::condition(&s, "loxilb.io/AddressAllocated").map(|c| c.1)
    })
    .await
}

/// Stops the controller once it is serving (a controller stopped before its stores synced
/// cannot shut down cleanly and keeps its Lease), so that the test can set pools up before
/// the next start: start-up waits for the pool and namespace stores, so the first
/// allocation after it already sees them.
pub async fn stop_when_serving(w: &mut World) {
    w.create(&World::lb_service("probe", Some(CLASS), &[(1, "TCP")]))
        .await;
    w.wait_for_ip("probe").await;
    w.services
        .delete("probe", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("probe gone", WAIT, || async {
        w.get("probe").await.is_none().then_some(())
    })
    .await;
    w.stop_controller().await;
}

pub fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}
