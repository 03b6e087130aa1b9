//! Address management against the real API server: durable claims, races between two
//! controllers, restart mid-burst, retain, reservations, adoption, static addresses,
//! AddressPool resources (selectors, priority, autoAssign, disabled, edits, status) and
//! Services sharing one address by port.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{CLASS, Options, WAIT, World, annotated, store_in_etcd, wait_for};
use futures::future::join_all;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use loxi_ccm::ipam::address_pools::{
    AddressPool, AddressPoolSpec, AddressPoolStatus, FamilyUsage, LabelSelector,
    LabelSelectorRequirement,
};
use loxi_ccm::ipam::claims::{AddressClaim, AddressClaimSpec, ClaimedBy};
use loxilb_client::{ClientConfig, LoxilbClient};
use serde_json::json;

const LONG: Duration = Duration::from_secs(120);

async fn create_many(w: &World, names: &[String]) {
    join_all(names.iter().map(|n| async move {
        w.create(&World::lb_service(n, Some(CLASS), &[(80, "TCP")]))
            .await;
    }))
    .await;
}

fn assert_unique(published: &BTreeMap<String, String>) {
    let ips: BTreeSet<&String> = published.values().collect();
    assert_eq!(
        ips.len(),
        published.len(),
        "duplicate addresses: {published:?}"
    );
}

#[tokio::test]
async fn two_controllers_allocating_at_once_never_duplicate() {
    let mut w = World::with(
        "race",
        Options {
            leader_elect: false,
            ..Options::default()
        },
    )
    .await;
    // A second controller, also without leader election: both allocate at the same time.
    let second = w.spawn_controller(&Options {
        leader_elect: false,
        ..Options::default()
    });
    w.add_node("node-a", "10.1.0.1").await;
    let names: Vec<String> = (0..40).map(|i| format!("s{i}")).collect();
    create_many(&w, &names).await;
    let published = wait_for("40 addresses", LONG, || async {
        let p = w.published().await;
        (p.len() == 40).then_some(p)
    })
    .await;
    assert_unique(&published);
    // Exactly one claim per Service, naming the address it shows.
    let claims = wait_for("one claim per Service", LONG, || async {
        let c = w.claims().await;
        (c.len() == 40).then_some(c)
    })
    .await;
    for c in &claims {
        assert_eq!(
            published.get(&c.spec.service.name),
            Some(&c.spec.address),
            "{c:?}"
        );
    }
    wait_for("40 rules", LONG, || async {
        (w.sim.rules().len() == 40).then_some(())
    })
    .await;
    let _ = second.0.send(());
    let _ = second.1.await;
    w.stop_controller().await;
    w.finish().await;
}

#[tokio::test]
async fn controller_restart_mid_burst_changes_no_address() {
    let mut w = World::new("midburst").await;
    w.add_node("node-a", "10.1.1.1").await;
    let names: Vec<String> = (0..200).map(|i| format!("b{i:03}")).collect();
    let creating = {
        let names = names.clone();
        let services = w.services.clone();
        tokio::spawn(async move {
            join_all(names.iter().map(|n| {
                let services = services.clone();
                async move {
                    services
                        .create(
                            &PostParams::default(),
                            &World::lb_service(n, Some(CLASS), &[(80, "TCP")]),
                        )
                        .await
                        .unwrap();
                }
            }))
            .await;
        })
    };
    // Stop the controller in the middle of the burst.
    wait_for("some addresses", LONG, || async {
        (w.published().await.len() >= 30).then_some(())
    })
    .await;
    w.stop_controller().await;
    let before = w.published().await;
    creating.await.unwrap();
    w.start_controller(&Options::default()).await;
    let after = wait_for("200 addresses", LONG, || async {
        let p = w.published().await;
        (p.len() == 200).then_some(p)
    })
    .await;
    let changed: Vec<_> = before
        .iter()
        .filter(|(name, ip)| after.get(*name) != Some(ip))
        .collect();
    assert!(
        changed.is_empty(),
        "addresses changed on restart: {changed:?}"
    );
    assert!(before.len() >= 30 && before.len() < 200 || before.len() == 200);
    assert_unique(&after);
    wait_for("200 claims and rules", LONG, || async {
        (w.claims().await.len() == 200 && w.sim.rules().len() == 200).then_some(())
    })
    .await;
    w.finish().await;
}

#[tokio::test]
async fn retained_address_comes_back_to_the_recreated_service() {
    let w = World::new("retain").await;
    w.add_node("node-a", "10.1.2.1").await;
    let mut svc = World::lb_service("keep", Some(CLASS), &[(80, "TCP")]);
    svc.metadata.annotations = Some(BTreeMap::from([(
        "loxilb.io/retain-address".to_string(),
        "1h".to_string(),
    )]));
    w.create(&svc).await;
    let ip = w.wait_for_ip("keep").await;
    w.services
        .delete("keep", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("deleted", WAIT, || async {
        w.get("keep").await.is_none().then_some(())
    })
    .await;
    let claim = w
        .claims()
        .await
        .into_iter()
        .find(|c| c.spec.address == ip)
        .expect("claim kept");
    assert!(claim.spec.retain_until.is_some(), "{claim:?}");
    assert!(claim.spec.service.uid.is_empty());
    assert!(
        w.sim.rules().is_empty(),
        "rules of a deleted Service must go even when retained"
    );
    // Another Service does not get the retained address.
    w.create(&World::lb_service("other", Some(CLASS), &[(80, "TCP")]))
        .await;
    assert_ne!(w.wait_for_ip("other").await, ip);
    // Re-created: same address, the claim taken over by the new Service.
    w.create(&svc).await;
    assert_eq!(w.wait_for_ip("keep").await, ip);
    let svc_uid = w.get("keep").await.unwrap().metadata.uid.unwrap();
    wait_for("claim taken over", WAIT, || async {
        w.claims()
            .await
            .into_iter()
            .find(|c| c.spec.address == ip)
            .filter(|c| c.spec.service.uid == svc_uid && c.spec.retain_until.is_none())
            .map(|_| ())
    })
    .await;
    w.finish().await;
}

#[tokio::test]
async fn reservation_static_conflict_and_adoption() {
    let mut w = World::new("reserve").await;
    w.add_node("node-a", "10.1.3.1").await;
    let claims: Api<AddressClaim> = Api::all(w.client.clone());
    // An operator reserves 192.0.2.200 for a Service that does not exist yet.
    claims
        .create(
            &PostParams::default(),
            &AddressClaim::new(
                "192.0.2.200",
                AddressClaimSpec {
                    address: "192.0.2.200".into(),
                    pool: "default".into(),
                    service: ClaimedBy {
                        namespace: w.ns.clone(),
                        name: "vip".into(),
                        ..ClaimedBy::default()
                    },
                    shared_with: Vec::new(),
                    retain_until: None,
                    controller: None,
                },
            ),
        )
        .await
        .unwrap();
    w.create(&World::lb_service("vip", Some(CLASS), &[(80, "TCP")]))
        .await;
    assert_eq!(w.wait_for_ip("vip").await, "192.0.2.200");

    // A static address another Service owns is never stolen.
    let mut thief = World::lb_service("thief", Some(CLASS), &[(81, "TCP")]);
    thief.spec.as_mut().unwrap().load_balancer_ip = Some("192.0.2.200".into());
    w.create(&thief).await;
    let (_, reason, message) = wait_for("AddressInUse", WAIT, || async {
        let s = w.get("thief").await?;
        let c = World::condition(&s, "loxilb.io/AddressAllocated")?;
        (c.1 == "AddressInUse").then_some(c)
    })
    .await;
    assert_eq!(reason, "AddressInUse");
    assert!(message.contains("192.0.2.200"), "{message}");
    assert_eq!(w.wait_for_ip("vip").await, "192.0.2.200");

    // Adoption: a Service already showing an address (kube-loxilb's llb- hostname form)
    // when loxi-ccm first sees it keeps that address.
    w.stop_controller().await;
    w.create(&World::lb_service("legacy", Some(CLASS), &[(82, "TCP")]))
        .await;
    w.services
        .patch_status(
            "legacy",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"loadBalancer": {"ingress": [{"hostname": "llb-192.0.2.77"}]}}})),
        )
        .await
        .unwrap();
    w.start_controller(&Options::default()).await;
    wait_for("legacy adopted with its address", WAIT, || async {
        w.claims()
            .await
            .into_iter()
            .find(|c| c.spec.service.name == "legacy")
            .filter(|c| c.spec.address == "192.0.2.77")
            .map(|_| ())
    })
    .await;
    assert_eq!(w.wait_for_ip("legacy").await, "192.0.2.77");
    w.finish().await;
}

#[tokio::test]
async fn pools_dual_stack_and_pool_selection() {
    let w = World::with(
        "pools",
        Options {
            extra_args: vec![
                "--external-cidr6=2001:db8:1::/120".into(),
                "--cidr-pools=blue=198.18.0.0/28".into(),
            ],
            ..Options::default()
        },
    )
    .await;
    w.add_node("node-a", "10.1.4.1").await;

    // RequireDualStack: one address per family, IPv4 and IPv6 rules to the same nodes.
    let mut dual = World::lb_service("dual", Some(CLASS), &[(80, "TCP")]);
    {
        let spec = dual.spec.as_mut().unwrap();
        spec.ip_family_policy = Some("RequireDualStack".into());
        spec.ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
    }
    w.create(&dual).await;
    let ips = wait_for("two addresses", WAIT, || async {
        let s = w.get("dual").await?;
        let ingress = s.status?.load_balancer?.ingress?;
        let ips: Vec<String> = ingress.into_iter().filter_map(|i| i.ip).collect();
        (ips.len() == 2).then_some(ips)
    })
    .await;
    assert!(ips[0].starts_with("192.0.2."), "{ips:?}");
    assert!(ips[1].starts_with("2001:db8:1::"), "{ips:?}");
    wait_for("rules on both VIPs", WAIT, || async {
        (w.rules_for(&ips[0]).len() == 1 && w.rules_for(&ips[1]).len() == 1).then_some(())
    })
    .await;

    // loxilb.io/poolSelect picks the pool; an unknown pool is reported naming the annotation.
    let mut blue = World::lb_service("blue", Some(CLASS), &[(80, "TCP")]);
    blue.metadata.annotations = Some(BTreeMap::from([(
        "loxilb.io/poolSelect".to_string(),
        "blue".to_string(),
    )]));
    w.create(&blue).await;
    assert!(w.wait_for_ip("blue").await.starts_with("198.18.0."));
    let mut nowhere = World::lb_service("nowhere", Some(CLASS), &[(80, "TCP")]);
    nowhere.metadata.annotations = Some(BTreeMap::from([(
        "loxilb.io/poolSelect".to_string(),
        "green".to_string(),
    )]));
    w.create(&nowhere).await;
    let (_, reason, message) = wait_for("unknown pool reported", WAIT, || async {
        let s = w.get("nowhere").await?;
        World::condition(&s, "loxilb.io/AddressAllocated")
    })
    .await;
    assert_eq!(reason, "InvalidAnnotation");
    assert!(
        message.contains("loxilb.io/poolSelect") && message.contains("green"),
        "{message}"
    );

    // loxilb.io/staticIP outside every pool is still claimed.
    let mut fixed = World::lb_service("fixed", Some(CLASS), &[(80, "TCP")]);
    fixed.metadata.annotations = Some(BTreeMap::from([(
        "loxilb.io/staticIP".to_string(),
        "203.0.113.9".to_string(),
    )]));
    w.create(&fixed).await;
    assert_eq!(w.wait_for_ip("fixed").await, "203.0.113.9");
    wait_for("claim for the static address", WAIT, || async {
        w.claims()
            .await
            .iter()
            .any(|c| c.spec.address == "203.0.113.9" && c.spec.service.name == "fixed")
            .then_some(())
    })
    .await;
    w.finish().await;
}

// ---------------------------------------------------------------------------------------
// AddressPool resources. Pools are cluster-scoped and outlive a test: each is named after
// the test's namespace and admits that namespace only, so a pool left behind by a failed
// test cannot capture another test's Services.

/// Admits the namespace `ns` only (the API server labels every namespace with its name).
fn only_ns(ns: &str) -> LabelSelector {
    LabelSelector {
        match_labels: BTreeMap::new(),
        match_expressions: vec![LabelSelectorRequirement {
            key: "kubernetes.io/metadata.name".into(),
            operator: "In".into(),
            values: vec![ns.to_string()],
        }],
    }
}

fn pool_spec(ns: &str, addresses: &[&str]) -> AddressPoolSpec {
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

fn pools_api(w: &World) -> Api<AddressPool> {
    Api::all(w.client.clone())
}

/// Creates the pool `<namespace>-<suffix>` and returns its name.
async fn create_pool(w: &World, suffix: &str, spec: AddressPoolSpec) -> String {
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

/// As [`create_pool`], for a spec the CRD's validation rules refuse: the pool is stored
/// straight into etcd, as one written before the rules existed, for the controller's own
/// checks to catch.
async fn create_invalid_pool(w: &World, suffix: &str, spec: AddressPoolSpec) -> String {
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
    let mut object = serde_json::to_value(AddressPool::new(&name, spec)).unwrap();
    object["metadata"]["uid"] = json!(format!(
        "00000000-0000-4000-8000-{:012x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros()
            % (1 << 48)
    ));
    object["metadata"]["creationTimestamp"] = json!("2025-01-01T00:00:00Z");
    object["metadata"]["generation"] = json!(1);
    store_in_etcd(&format!("ipam.loxilb.io/addresspools/{name}"), &object).await;
    wait_for("stored pool served", WAIT, || async {
        pools_api(w).get_opt(&name).await.unwrap().map(|_| ())
    })
    .await;
    name
}

async fn patch_pool(w: &World, name: &str, spec: serde_json::Value) {
    pools_api(w)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": spec })),
        )
        .await
        .unwrap();
}

async fn delete_pools(w: &World, names: &[&String]) {
    for name in names {
        let _ = pools_api(w).delete(name, &DeleteParams::default()).await;
    }
}

/// Waits until the pool's status satisfies `check`, and returns it.
async fn wait_pool_status(
    w: &World,
    name: &str,
    what: &str,
    check: impl Fn(&AddressPoolStatus) -> bool,
) -> AddressPoolStatus {
    wait_for(&format!("{what} on pool {name}"), WAIT, || async {
        let status = pools_api(w).get(name).await.ok()?.status?;
        check(&status).then_some(status)
    })
    .await
}

fn pool_condition<'a>(s: &'a AddressPoolStatus, type_: &str) -> (&'a str, &'a str, &'a str) {
    s.conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.as_str(), c.reason.as_str(), c.message.as_str()))
        .unwrap_or_default()
}

fn v4(total: i64, used: i64) -> FamilyUsage {
    FamilyUsage {
        total,
        used,
        free: total - used,
    }
}

/// The condition reason loxi-ccm shows for a Service's address.
async fn address_reason(w: &World, name: &str) -> String {
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
async fn stop_when_serving(w: &mut World) {
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

#[tokio::test]
async fn address_pools_follow_namespace_and_service_labels_priority_and_auto_assign() {
    let mut w = World::new("apools").await;
    w.add_node("node-a", "10.1.5.1").await;
    // Pools and labels in place before the controller starts again.
    stop_when_serving(&mut w).await;
    Api::<Namespace>::all(w.client.clone())
        .patch(
            &w.ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"loxi-test/team": "blue"}}})),
        )
        .await
        .unwrap();
    let blue_only = |ns: &str, team: &str| {
        let mut s = only_ns(ns);
        s.match_labels.insert("loxi-test/team".into(), team.into());
        s
    };
    let team = create_pool(&w, "team", {
        let mut s = pool_spec(&w.ns, &["198.51.100.0/29"]);
        s.namespace_selector = Some(blue_only(&w.ns, "blue"));
        s
    })
    .await;
    let edge = create_pool(&w, "edge", {
        let mut s = pool_spec(&w.ns, &["198.51.100.64/29"]);
        s.priority = 5;
        s.service_selector = Some(LabelSelector {
            match_labels: BTreeMap::new(),
            match_expressions: vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "In".into(),
                values: vec!["edge".into()],
            }],
        });
        s
    })
    .await;
    let manual = create_pool(&w, "manual", {
        let mut s = pool_spec(&w.ns, &["198.51.100.128-198.51.100.130"]);
        s.auto_assign = false;
        s
    })
    .await;
    // Highest priority, but for another team.
    let red = create_pool(&w, "red", {
        let mut s = pool_spec(&w.ns, &["198.51.100.192/29"]);
        s.priority = 10;
        s.namespace_selector = Some(blue_only(&w.ns, "red"));
        s
    })
    .await;
    w.start_controller(&Options::default()).await;

    // A pool dedicated to the namespace comes before the flag pool of equal priority.
    w.create(&World::lb_service("plain", Some(CLASS), &[(80, "TCP")]))
        .await;
    assert_eq!(w.wait_for_ip("plain").await, "198.51.100.1");
    // Higher priority, admitted by the Service's labels.
    let mut front = World::lb_service("front", Some(CLASS), &[(80, "TCP")]);
    front.metadata.labels = Some(BTreeMap::from([("tier".into(), "edge".into())]));
    w.create(&front).await;
    assert_eq!(w.wait_for_ip("front").await, "198.51.100.65");
    // autoAssign: false: only when named.
    w.create(&annotated(
        World::lb_service("pinned", Some(CLASS), &[(80, "TCP")]),
        &[("loxilb.io/poolSelect", manual.as_str())],
    ))
    .await;
    assert_eq!(w.wait_for_ip("pinned").await, "198.51.100.128");
    // A pool whose namespaceSelector does not admit the Service, even when named.
    w.create(&annotated(
        World::lb_service("wrong", Some(CLASS), &[(80, "TCP")]),
        &[("loxilb.io/poolSelect", red.as_str())],
    ))
    .await;
    assert_eq!(address_reason(&w, "wrong").await, "PoolNotAllowed");

    // Claims name the pool; pool status counts what is used.
    wait_for("claim naming the pool", WAIT, || async {
        w.claims()
            .await
            .iter()
            .any(|c| c.spec.service.name == "plain" && c.spec.pool == team)
            .then_some(())
    })
    .await;
    let s = wait_pool_status(&w, &team, "1 used", |s| s.ipv4 == v4(6, 1)).await;
    assert_eq!(pool_condition(&s, "Ready").0, "True");
    assert_eq!(pool_condition(&s, "Exhausted").0, "False");
    assert_eq!(s.ipv6, FamilyUsage::default());
    wait_pool_status(&w, &manual, "1 used", |s| s.ipv4 == v4(3, 1)).await;
    wait_pool_status(&w, &red, "0 used", |s| s.ipv4 == v4(6, 0)).await;
    // Counts follow releases.
    w.services
        .delete("pinned", &DeleteParams::default())
        .await
        .unwrap();
    wait_pool_status(&w, &manual, "0 used", |s| s.ipv4 == v4(3, 0)).await;
    delete_pools(&w, &[&team, &edge, &manual, &red]).await;
    w.finish().await;
}

/// Retain as a pool setting: a deleted Service's address from a pool with
/// `retainAddresses` stays reserved for its namespace/name and comes back when the Service
/// is re-created; `loxilb.io/retain-address: "0"` on a Service opts out.
#[tokio::test]
async fn pool_retain_setting_keeps_a_deleted_services_address() {
    let mut w = World::new("pretain").await;
    w.add_node("node-a", "10.1.6.1").await;
    stop_when_serving(&mut w).await;
    let kept = create_pool(&w, "kept", {
        let mut s = pool_spec(&w.ns, &["198.51.100.192/29"]);
        s.priority = 10;
        s.retain_addresses = Some("1h".into());
        s
    })
    .await;
    w.start_controller(&Options::default()).await;
    let svc = World::lb_service("db", Some(CLASS), &[(5432, "TCP")]);
    w.create(&svc).await;
    let ip = w.wait_for_ip("db").await;
    assert!(
        ip.starts_with("198.51.100.19"),
        "{ip} from the retaining pool"
    );
    let opted_out = annotated(
        // Same port: not shared with db (a shared address is never retained).
        World::lb_service("scratch", Some(CLASS), &[(5432, "TCP")]),
        &[("loxilb.io/retain-address", "0")],
    );
    w.create(&opted_out).await;
    let scratch_ip = w.wait_for_ip("scratch").await;
    for name in ["db", "scratch"] {
        w.services
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    wait_for("both deleted", WAIT, || async {
        (w.get("db").await.is_none() && w.get("scratch").await.is_none()).then_some(())
    })
    .await;
    let claims = wait_for("db's claim retained, scratch's released", WAIT, || async {
        let claims = w.claims().await;
        let scratch_gone = !claims.iter().any(|c| c.spec.address == scratch_ip);
        let db = claims.into_iter().find(|c| c.spec.address == ip)?;
        (scratch_gone && db.spec.retain_until.is_some()).then_some(db)
    })
    .await;
    assert_eq!(claims.spec.service.name, "db");
    assert!(claims.spec.service.uid.is_empty(), "held for the name only");
    // Someone else does not get it; the re-created Service does.
    w.create(&World::lb_service("other", Some(CLASS), &[(5432, "TCP")]))
        .await;
    assert_ne!(w.wait_for_ip("other").await, ip);
    w.create(&svc).await;
    assert_eq!(w.wait_for_ip("db").await, ip);
    delete_pools(&w, &[&kept]).await;
    w.finish().await;
}

#[tokio::test]
async fn pool_edits_shrink_and_disable_change_no_address() {
    let mut w = World::new("apooledit").await;
    w.add_node("node-a", "10.1.6.1").await;
    stop_when_serving(&mut w).await;
    let pool = create_pool(&w, "p", pool_spec(&w.ns, &["10.250.0.1-10.250.0.4"])).await;
    w.start_controller(&Options::default()).await;
    for name in ["s1", "s2"] {
        w.create(&World::lb_service(name, Some(CLASS), &[(80, "TCP")]))
            .await;
    }
    let (s1, s2) = (w.wait_for_ip("s1").await, w.wait_for_ip("s2").await);
    let mut first: Vec<String> = vec![s1.clone(), s2.clone()];
    first.sort();
    assert_eq!(first, ["10.250.0.1", "10.250.0.2"]);
    wait_pool_status(&w, &pool, "2 used", |s| s.ipv4 == v4(4, 2)).await;

    // Shrink below both addresses: nobody moves; they stay claimed outside every pool.
    patch_pool(&w, &pool, json!({"addresses": ["10.250.0.3-10.250.0.4"]})).await;
    wait_pool_status(&w, &pool, "the shrunk pool", |s| s.ipv4 == v4(2, 0)).await;
    w.create(&World::lb_service("s3", Some(CLASS), &[(80, "TCP")]))
        .await;
    assert_eq!(w.wait_for_ip("s3").await, "10.250.0.3");
    assert_eq!(w.wait_for_ip("s1").await, s1);
    assert_eq!(w.wait_for_ip("s2").await, s2);
    assert_eq!(w.rules_for(&s1).len(), 1);
    let claimed: BTreeSet<String> = w
        .claims()
        .await
        .into_iter()
        .map(|c| c.spec.address)
        .collect();
    assert!(
        claimed.contains(&s1) && claimed.contains(&s2),
        "{claimed:?}"
    );

    // Disabled: what it handed out stays, nothing new comes from it.
    patch_pool(&w, &pool, json!({"disabled": true})).await;
    let s = wait_pool_status(&w, &pool, "Ready=False Disabled", |s| {
        pool_condition(s, "Ready").1 == "Disabled"
    })
    .await;
    assert_eq!(s.ipv4, v4(2, 1));
    w.create(&World::lb_service("s4", Some(CLASS), &[(80, "TCP")]))
        .await;
    assert!(w.wait_for_ip("s4").await.starts_with("192.0.2."));
    w.create(&annotated(
        World::lb_service("s5", Some(CLASS), &[(80, "TCP")]),
        &[("loxilb.io/poolSelect", pool.as_str())],
    ))
    .await;
    assert_eq!(address_reason(&w, "s5").await, "PoolDisabled");
    assert_eq!(w.wait_for_ip("s3").await, "10.250.0.3");

    // A restart rebuilds the index over the edited pool: still nobody moves, and the
    // addresses outside it are not handed out again.
    w.stop_controller().await;
    w.start_controller(&Options::default()).await;
    w.create(&World::lb_service("s6", Some(CLASS), &[(80, "TCP")]))
        .await;
    let s6 = w.wait_for_ip("s6").await;
    assert!(s6.starts_with("192.0.2.") && s6 != w.wait_for_ip("s4").await);
    for (name, ip) in [("s1", &s1), ("s2", &s2), ("s3", &"10.250.0.3".to_string())] {
        assert_eq!(&w.wait_for_ip(name).await, ip, "{name} moved");
    }
    delete_pools(&w, &[&pool]).await;
    w.finish().await;
}

#[tokio::test]
async fn overlapping_and_invalid_pools_are_reported() {
    let w = World::new("apoolbad").await;
    w.add_node("node-a", "10.1.7.1").await;
    let a = create_pool(&w, "a", {
        let mut s = pool_spec(&w.ns, &["10.251.0.0/30"]);
        s.auto_assign = false;
        s
    })
    .await;
    let b = create_pool(&w, "b", {
        let mut s = pool_spec(&w.ns, &["10.251.0.2-10.251.0.5"]);
        s.auto_assign = false;
        s
    })
    .await;
    // The API server refuses this spec now (tests/crd_validation.rs); one written before its
    // rules existed is still caught by the controller.
    let bad = create_invalid_pool(&w, "bad", pool_spec(&w.ns, &["10.251.1.0/33", "nope"])).await;
    let s = wait_pool_status(&w, &a, "Overlapping=True", |s| {
        pool_condition(s, "Overlapping").0 == "True"
    })
    .await;
    assert!(
        pool_condition(&s, "Overlapping").2.contains(&b),
        "{:?}",
        s.conditions
    );
    wait_pool_status(&w, &b, "Overlapping=True", |s| {
        pool_condition(s, "Overlapping").2.contains(&a)
    })
    .await;
    let s = wait_pool_status(&w, &bad, "Ready=False InvalidSpec", |s| {
        pool_condition(s, "Ready").1 == "InvalidSpec"
    })
    .await;
    let message = pool_condition(&s, "Ready").2;
    assert!(
        message.contains("10.251.1.0/33") && message.contains("nope"),
        "{message}"
    );
    // Warning Events on the pools (cluster-scoped: in the default namespace).
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(w.client.clone(), "default");
    wait_for("pool Warning events", WAIT, || async {
        let list = events.list(&Default::default()).await.ok()?.items;
        let has = |pool: &str, reason: &str| {
            list.iter().any(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pool)
                    && e.reason.as_deref() == Some(reason)
            })
        };
        (has(&bad, "InvalidPool") && has(&a, "PoolOverlap")).then_some(())
    })
    .await;

    // Overlapping pools still work: an address in both counts in both.
    for name in ["x", "y"] {
        w.create(&annotated(
            World::lb_service(name, Some(CLASS), &[(80, "TCP")]),
            &[("loxilb.io/poolSelect", a.as_str())],
        ))
        .await;
        w.wait_for_ip(name).await;
    }
    wait_pool_status(&w, &a, "2 used", |s| s.ipv4 == v4(2, 2)).await;
    let s = wait_pool_status(&w, &b, "1 used", |s| s.ipv4 == v4(4, 1)).await;
    assert_eq!(pool_condition(&s, "Exhausted").0, "False");
    let s = wait_pool_status(&w, &a, "Exhausted", |s| {
        pool_condition(s, "Exhausted").0 == "True"
    })
    .await;
    assert_eq!(pool_condition(&s, "Exhausted").2, "no free IPv4 address");

    // Fixing the spec makes the pool usable.
    patch_pool(&w, &bad, json!({"addresses": ["10.251.1.0/30"]})).await;
    wait_pool_status(&w, &bad, "Ready=True", |s| {
        pool_condition(s, "Ready").0 == "True" && s.ipv4 == v4(2, 0)
    })
    .await;
    delete_pools(&w, &[&a, &b, &bad]).await;
    w.finish().await;
}

// ---------------------------------------------------------------------------------------
// Sharing one address between Services (kube-loxilb's shared mode, the default).

/// Owners (Service names) listed by the claim of `ip`.
async fn claim_owners(w: &World, ip: &str) -> Option<BTreeSet<String>> {
    let api: Api<AddressClaim> = Api::all(w.client.clone());
    let name = ip.replace(':', "-");
    let c = api.get_opt(&name).await.unwrap()?;
    Some(c.owners().iter().map(|o| o.name.clone()).collect())
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn shared_mode_shares_an_address_by_port_and_sharing_key() {
    let w = World::new("share").await;
    w.add_node("node-a", "10.1.8.1").await;
    // Services on different ports share the first address; the same port takes another.
    w.create(&World::lb_service("http", Some(CLASS), &[(80, "TCP")]))
        .await;
    let x = w.wait_for_ip("http").await;
    w.create(&World::lb_service("https", Some(CLASS), &[(443, "TCP")]))
        .await;
    assert_eq!(w.wait_for_ip("https").await, x);
    w.create(&World::lb_service(
        "dns",
        Some(CLASS),
        &[(53, "UDP"), (53, "TCP")],
    ))
    .await;
    assert_eq!(w.wait_for_ip("dns").await, x);
    w.create(&World::lb_service("http2", Some(CLASS), &[(80, "TCP")]))
        .await;
    let y = w.wait_for_ip("http2").await;
    assert_ne!(y, x, "same port: another address");
    // One claim lists every owner; each Service has its own rules on the address.
    wait_for("claim with three owners", WAIT, || async {
        (claim_owners(&w, &x).await? == names(&["http", "https", "dns"])).then_some(())
    })
    .await;
    wait_for("rules of every sharer", WAIT, || async {
        let ports: Vec<(u16, String)> = w
            .rules_for(&x)
            .into_iter()
            .map(|(p, proto, _)| (p, proto))
            .collect();
        (ports
            == [
                (53, "tcp".to_string()),
                (53, "udp".to_string()),
                (80, "tcp".to_string()),
                (443, "tcp".to_string()),
            ])
        .then_some(())
    })
    .await;
    assert_eq!(w.rules_for(&y).len(), 1);

    // A sharing key: only with the same key, never with key-less Services.
    let keyed = |name: &str, port: i32, key: &str| {
        annotated(
            World::lb_service(name, Some(CLASS), &[(port, "TCP")]),
            &[("loxilb.io/sharing-key", key)],
        )
    };
    w.create(&keyed("k1", 8080, "team-a")).await;
    let z = w.wait_for_ip("k1").await;
    assert!(z != x && z != y, "{z}");
    w.create(&keyed("k2", 8081, "team-a")).await;
    assert_eq!(w.wait_for_ip("k2").await, z);
    w.create(&keyed("k3", 8082, "team-b")).await;
    let k3 = w.wait_for_ip("k3").await;
    assert!(![&x, &y, &z].contains(&&k3), "{k3}");
    // A requested address: joined with the same key, in use without one.
    let mut static_keyed = keyed("s1", 9090, "team-a");
    static_keyed.spec.as_mut().unwrap().load_balancer_ip = Some(z.clone());
    w.create(&static_keyed).await;
    assert_eq!(w.wait_for_ip("s1").await, z);
    let mut static_plain = World::lb_service("s2", Some(CLASS), &[(9091, "TCP")]);
    static_plain.spec.as_mut().unwrap().load_balancer_ip = Some(x.clone());
    w.create(&static_plain).await;
    assert_eq!(address_reason(&w, "s2").await, "AddressInUse");

    // One sharer leaves: the address and the others' rules stay, its rules go.
    w.services
        .delete("https", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("https off the claim", WAIT, || async {
        (claim_owners(&w, &x).await? == names(&["http", "dns"])).then_some(())
    })
    .await;
    wait_for("443 rule gone, others kept", WAIT, || async {
        let ports: Vec<u16> = w.rules_for(&x).into_iter().map(|(p, _, _)| p).collect();
        (ports == [53, 53, 80]).then_some(())
    })
    .await;
    assert_eq!(w.wait_for_ip("http").await, x);
    // The port it freed is free for a newcomer on that address.
    w.create(&World::lb_service("tls", Some(CLASS), &[(443, "TCP")]))
        .await;
    assert_eq!(w.wait_for_ip("tls").await, x);
    // The last owners leave: the address is free, and s2, which asked for it by name, gets
    // it at last (a fresh claim, its rule alone on the address).
    for name in ["http", "dns", "tls"] {
        w.services
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    wait_for("the freed address claimed by s2 alone", WAIT, || async {
        (claim_owners(&w, &x).await? == names(&["s2"])).then_some(())
    })
    .await;
    assert_eq!(w.wait_for_ip("s2").await, x);
    wait_for("only s2's rule on the address", WAIT, || async {
        let ports: Vec<u16> = w.rules_for(&x).into_iter().map(|(p, _, _)| p).collect();
        (ports == [9091]).then_some(())
    })
    .await;
    w.finish().await;
}

#[tokio::test]
async fn ports_edited_onto_a_sharer_move_the_service() {
    let w = World::new("sharemove").await;
    w.add_node("node-a", "10.1.9.1").await;
    w.create(&World::lb_service("a", Some(CLASS), &[(80, "TCP")]))
        .await;
    let x = w.wait_for_ip("a").await;
    w.create(&World::lb_service("b", Some(CLASS), &[(443, "TCP")]))
        .await;
    assert_eq!(w.wait_for_ip("b").await, x);
    // b now also wants 80, which a holds on x: b moves, a stays.
    w.services
        .patch(
            "b",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"ports": [
                {"name": "tcp-443", "port": 443, "protocol": "TCP"},
                {"name": "tcp-80", "port": 80, "protocol": "TCP"}
            ]}})),
        )
        .await
        .unwrap();
    let moved = wait_for("b on another address", WAIT, || async {
        let ip = w.wait_for_ip("b").await;
        (ip != x).then_some(ip)
    })
    .await;
    wait_for("b off x, rules in place", WAIT, || async {
        (claim_owners(&w, &x).await? == names(&["a"])
            && w.rules_for(&moved).len() == 2
            && w.rules_for(&x).len() == 1)
            .then_some(())
    })
    .await;
    assert_eq!(w.wait_for_ip("a").await, x);
    w.finish().await;
}

/// The soak's first bug (docs/RELIABILITY.md): a Service's ports edited onto a sharer's
/// while no other address is free. It keeps its address on its old record (the claim lists
/// its old ports) and says why; the drift check must not program its new ports there from
/// that record, which put its rule on the sharer's address and port, and the next check the
/// sharer's again (a flap every drift interval).
#[tokio::test]
async fn ports_edited_onto_a_sharer_with_no_address_free_never_take_the_sharers_rule() {
    let opts = Options {
        // Two usable addresses (network and broadcast addresses are skipped).
        cidr: "192.0.2.8/30".into(),
        drift: "2s",
        ..Options::default()
    };
    let w = World::with("sharefull", opts).await;
    w.add_node("node-a", "10.1.9.2").await;
    w.create(&World::lb_service("a", Some(CLASS), &[(80, "TCP")]))
        .await;
    let x = w.wait_for_ip("a").await;
    w.create(&World::lb_service("b", Some(CLASS), &[(443, "TCP")]))
        .await;
    assert_eq!(w.wait_for_ip("b").await, x);
    w.create(&World::lb_service("c", Some(CLASS), &[(80, "TCP")]))
        .await;
    let y = w.wait_for_ip("c").await;
    assert_ne!(y, x);
    let rule_at = |ip: &str, port: u16| {
        w.sim
            .rules()
            .into_iter()
            .find(|r| r.external_ip == ip && r.port == port)
            .map(|r| r.name)
    };
    let a_rule = wait_for("a's rule on x", WAIT, || async { rule_at(&x, 80) }).await;
    wait_for("b's and c's rules", WAIT, || async {
        (rule_at(&x, 443).is_some() && rule_at(&y, 80).is_some()).then_some(())
    })
    .await;
    // b now also wants 80: a holds it on x, c on y, no address is free.
    w.services
        .patch(
            "b",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"ports": [
                {"name": "tcp-443", "port": 443, "protocol": "TCP"},
                {"name": "tcp-80", "port": 80, "protocol": "TCP"}
            ]}})),
        )
        .await
        .unwrap();
    wait_for("b reports that it has no new address", WAIT, || async {
        let b = w.get("b").await?;
        World::condition(&b, "loxilb.io/AddressAllocated")
            .is_some_and(|c| c.0 == "False")
            .then_some(())
    })
    .await;
    // Three drift checks, each seen repairing c's rule deleted by hand: none of them may
    // have put b's rule on a's address and port.
    let loxilb = LoxilbClient::new(ClientConfig::new(&w.sim.url())).unwrap();
    for round in 0..3 {
        loxilb.delete_rule(&y, 80, "tcp", false).await.unwrap();
        wait_for("a drift check puts c's rule back", WAIT, || async {
            rule_at(&y, 80).map(|_| ())
        })
        .await;
        assert_eq!(
            rule_at(&x, 80).as_ref(),
            Some(&a_rule),
            "after drift check {round}, {x}:80 is not a's rule any more"
        );
    }
    // b keeps what it had, and says why.
    assert_eq!(w.wait_for_ip("b").await, x);
    assert!(rule_at(&x, 443).is_some());
    w.finish().await;
}

/// The soak's second bug (docs/RELIABILITY.md): a sharer taken off its address's claim
/// behind its back (here by hand; in the soak, around an API server restart) while it keeps
/// showing the address. The claim event that drops it gives it a pass, which claims the
/// address again; before, nothing re-queued it and it showed an address no claim backed.
#[tokio::test]
async fn a_sharer_taken_off_its_claim_claims_its_address_again() {
    let w = World::new("sharedrop").await;
    w.add_node("node-a", "10.1.9.3").await;
    w.create(&World::lb_service("a", Some(CLASS), &[(80, "TCP")]))
        .await;
    let x = w.wait_for_ip("a").await;
    w.create(&World::lb_service("b", Some(CLASS), &[(443, "TCP")]))
        .await;
    assert_eq!(w.wait_for_ip("b").await, x);
    wait_for("both on the claim", WAIT, || async {
        (claim_owners(&w, &x).await? == names(&["a", "b"])).then_some(())
    })
    .await;
    // Take b off the claim (a full update, as the controller's own leave does).
    let api: Api<AddressClaim> = Api::all(w.client.clone());
    let name = x.replace(':', "-");
    let mut c = api.get(&name).await.unwrap();
    c.spec.shared_with.retain(|o| o.name != "b");
    c.spec.service = if c.spec.service.name == "b" {
        c.spec.shared_with.remove(0)
    } else {
        c.spec.service
    };
    api.replace(&name, &PostParams::default(), &c)
        .await
        .unwrap();
    wait_for(
        "b back on the claim of the address it shows",
        WAIT,
        || async { (claim_owners(&w, &x).await? == names(&["a", "b"])).then_some(()) },
    )
    .await;
    assert_eq!(w.wait_for_ip("b").await, x);
    w.finish().await;
}

#[tokio::test]
async fn unique_mode_never_shares() {
    let w = World::with(
        "unique",
        Options {
            extra_args: vec!["--set-unique-ip".into()],
            ..Options::default()
        },
    )
    .await;
    w.add_node("node-a", "10.1.10.1").await;
    w.create(&World::lb_service("http", Some(CLASS), &[(80, "TCP")]))
        .await;
    let x = w.wait_for_ip("http").await;
    w.create(&annotated(
        World::lb_service("https", Some(CLASS), &[(443, "TCP")]),
        &[("loxilb.io/sharing-key", "k")],
    ))
    .await;
    assert_ne!(w.wait_for_ip("https").await, x);
    // Claims still record the ports (switching back to shared mode moves nobody), and list
    // one owner each.
    let claims = w.claims().await;
    assert_eq!(claims.len(), 2);
    assert!(
        claims
            .iter()
            .all(|c| c.spec.service.ports.is_some() && c.spec.shared_with.is_empty()),
        "{claims:?}"
    );
    // Asked for by name with a key: still in use in unique mode.
    let mut wants_x = annotated(
        World::lb_service("dns", Some(CLASS), &[(53, "UDP")]),
        &[("loxilb.io/sharing-key", "k")],
    );
    wants_x.spec.as_mut().unwrap().load_balancer_ip = Some(x.clone());
    w.create(&wants_x).await;
    assert_eq!(address_reason(&w, "dns").await, "AddressInUse");
    w.finish().await;
}

#[tokio::test]
async fn switching_to_unique_mode_moves_nobody() {
    let mut w = World::new("sharemode").await;
    w.add_node("node-a", "10.1.11.1").await;
    w.create(&World::lb_service("a", Some(CLASS), &[(80, "TCP")]))
        .await;
    let x = w.wait_for_ip("a").await;
    w.create(&World::lb_service("b", Some(CLASS), &[(443, "TCP")]))
        .await;
    assert_eq!(w.wait_for_ip("b").await, x);
    wait_for("both on the claim", WAIT, || async {
        (claim_owners(&w, &x).await? == names(&["a", "b"])).then_some(())
    })
    .await;
    w.stop_controller().await;
    w.start_controller(&Options {
        extra_args: vec!["--set-unique-ip".into()],
        ..Options::default()
    })
    .await;
    // A newcomer that would fit on x gets its own address; the sharers stay.
    w.create(&World::lb_service("c", Some(CLASS), &[(8080, "TCP")]))
        .await;
    assert_ne!(w.wait_for_ip("c").await, x);
    for name in ["a", "b"] {
        assert_eq!(w.wait_for_ip(name).await, x, "{name} moved");
    }
    assert_eq!(claim_owners(&w, &x).await.unwrap(), names(&["a", "b"]));
    assert_eq!(w.rules_for(&x).len(), 2);
    w.finish().await;
}

#[tokio::test]
async fn kube_loxilb_shared_addresses_are_adopted_together() {
    let mut w = World::new("shareadopt").await;
    w.add_node("node-a", "10.1.12.1").await;
    stop_when_serving(&mut w).await;
    // kube-loxilb in shared mode left two Services on one address (by port), and a third on
    // the same port as one of them (it would not have: one of the two must move).
    for (name, port) in [("web", 80), ("tls", 443), ("clash", 80)] {
        w.create(&World::lb_service(name, Some(CLASS), &[(port, "TCP")]))
            .await;
        w.services
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"hostname": "llb-192.0.2.50"}]}}})),
            )
            .await
            .unwrap();
    }
    w.start_controller(&Options::default()).await;
    let shared = "192.0.2.50".to_string();
    // tls shares with whichever port-80 Service the index met first; the other moves.
    let (stayed, moved) = wait_for("sharers adopted, the clash moved", WAIT, || async {
        let owners = claim_owners(&w, &shared).await?;
        let stayed = ["web", "clash"].into_iter().find(|n| owners.contains(*n))?;
        let other = if stayed == "web" { "clash" } else { "web" };
        (owners == names(&[stayed, "tls"])).then_some((stayed, other))
    })
    .await;
    assert_eq!(w.wait_for_ip("tls").await, shared);
    assert_eq!(w.wait_for_ip(stayed).await, shared);
    let moved_ip = wait_for("the clashing one on another address", WAIT, || async {
        let ip = w.wait_for_ip(moved).await;
        (ip != shared).then_some(ip)
    })
    .await;
    wait_for("rules", WAIT, || async {
        (w.rules_for(&shared).len() == 2 && w.rules_for(&moved_ip).len() == 1).then_some(())
    })
    .await;
    w.finish().await;
}

/// IPv6 addresses whose text starts or ends with `::` (the first address of `::/126`, a
/// static `2001:db8:9::`) are claimed under valid object names, shown and programmed.
#[tokio::test]
async fn ipv6_addresses_at_the_edges_are_claimed_and_served() {
    let w = World::new("edge6").await;
    w.add_node("node-a", "10.1.9.1").await;
    let pool = create_pool(&w, "edge", pool_spec(&w.ns, &["::/126"])).await;
    let from_pool = annotated(
        World::lb_service("from-pool", Some(CLASS), &[(80, "TCP")]),
        &[("loxilb.io/ipam", "ipv6"), ("loxilb.io/poolSelect", &pool)],
    );
    let fixed = annotated(
        World::lb_service("fixed", Some(CLASS), &[(80, "TCP")]),
        &[
            ("loxilb.io/ipam", "ipv6"),
            ("loxilb.io/staticIP", "2001:db8:9::"),
        ],
    );
    w.create(&from_pool).await;
    w.create(&fixed).await;
    assert_eq!(w.wait_for_ip("from-pool").await, "::1");
    assert_eq!(w.wait_for_ip("fixed").await, "2001:db8:9::");
    for ip in ["::1", "2001:db8:9::"] {
        wait_for("the rule", WAIT, || async {
            (w.rules_for(ip).len() == 1).then_some(())
        })
        .await;
    }
    let names: BTreeSet<String> = w
        .claims()
        .await
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    assert_eq!(
        names,
        [
            "0000-0000-0000-0000-0000-0000-0000-0001",
            "2001-0db8-0009-0000-0000-0000-0000-0000"
        ]
        .into_iter()
        .map(String::from)
        .collect()
    );
    delete_pools(&w, &[&pool]).await;
    w.finish().await;
}

/// In shared mode, an address retained for a deleted Service is skipped by the sharing
/// search: a new Service with other ports gets a free address at once, and the pool is not
/// reported exhausted while it has free addresses.
#[tokio::test]
async fn a_retained_address_does_not_block_new_services_in_shared_mode() {
    let w = World::with(
        "retainshare",
        Options {
            cidr: "192.0.2.64/28".into(),
            ..Options::default()
        },
    )
    .await;
    w.add_node("node-a", "10.1.10.1").await;
    let kept = annotated(
        World::lb_service("kept", Some(CLASS), &[(80, "TCP")]),
        &[("loxilb.io/retain-address", "1h")],
    );
    w.create(&kept).await;
    let retained = w.wait_for_ip("kept").await;
    w.services
        .delete("kept", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("retained for the deleted Service", WAIT, || async {
        w.claims()
            .await
            .into_iter()
            .find(|c| c.spec.address == retained)
            .filter(|c| c.spec.service.uid.is_empty() && c.spec.retain_until.is_some())
            .map(|_| ())
    })
    .await;
    // Other ports: it could share an owned address, but not a reservation.
    w.create(&World::lb_service("fresh", Some(CLASS), &[(443, "TCP")]))
        .await;
    let ip = w.wait_for_ip("fresh").await;
    assert_ne!(ip, retained);
    let s = w.get("fresh").await.unwrap();
    let (status, reason, _) = World::condition(&s, "loxilb.io/AddressAllocated").unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Allocated"));
    assert!(
        !w.event_reasons("fresh")
            .await
            .contains(&"PoolExhausted".to_string())
    );
    w.finish().await;
}

/// An AddressPool whose own blocks overlap is refused like the same overlap in the flags; a
/// static address that is the network address of a pool's block is named as such.
#[tokio::test]
async fn a_pool_overlapping_itself_and_a_pools_network_address_are_reported() {
    let w = World::new("apoolself").await;
    w.add_node("node-a", "10.1.11.1").await;
    let twice = create_pool(
        &w,
        "twice",
        pool_spec(&w.ns, &["10.252.0.0/24", "10.252.0.10-10.252.0.20"]),
    )
    .await;
    let s = wait_pool_status(&w, &twice, "Ready=False InvalidSpec", |s| {
        pool_condition(s, "Ready").1 == "InvalidSpec"
    })
    .await;
    let message = pool_condition(&s, "Ready").2;
    assert!(
        message.contains("overlaps") && message.contains("same pool"),
        "{message}"
    );

    // 192.0.2.0 is the network address of the default pool's 192.0.2.0/24.
    w.create(&annotated(
        World::lb_service("edge", Some(CLASS), &[(80, "TCP")]),
        &[("loxilb.io/staticIP", "192.0.2.0")],
    ))
    .await;
    let (_, reason, message) = wait_for("AddressAllocated=False", WAIT, || async {
        let s = w.get("edge").await?;
        World::condition(&s, "loxilb.io/AddressAllocated").filter(|c| c.0 == "False")
    })
    .await;
    assert_eq!(reason, "AddressNotUsable", "{message}");
    assert!(
        message.contains("network or broadcast address"),
        "{message}"
    );
    assert!(w.claims().await.is_empty());
    delete_pools(&w, &[&twice]).await;
    w.finish().await;
}

/// A `loxilb.io/retain-address` that does not parse is reported (a Warning Event, the
/// address condition's message) and otherwise ignored, as if absent: the Service gets its
/// address and rules, and at deletion the pool's setting applies (here none: released).
#[tokio::test]
async fn an_unparseable_retain_address_is_reported_and_ignored() {
    let w = World::new("retainbad").await;
    w.add_node("node-a", "10.1.11.1").await;
    w.create(&annotated(
        World::lb_service("soon", Some(CLASS), &[(80, "TCP")]),
        &[("loxilb.io/retain-address", "soon")],
    ))
    .await;
    let ip = w.wait_for_ip("soon").await;
    wait_for("its rule", WAIT, || async {
        (w.rules_for(&ip).len() == 1).then_some(())
    })
    .await;
    let condition = |value: &'static str| {
        let w = &w;
        async move {
            wait_for(
                &format!("the address condition naming {value:?}"),
                WAIT,
                || async {
                    let s = w.get("soon").await?;
                    let (status, reason, message) =
                        World::condition(&s, "loxilb.io/AddressAllocated")?;
                    message
                        .contains(&format!("{value:?}"))
                        .then_some((status, reason, message))
                },
            )
            .await
        }
    };
    let (status, reason, message) = condition("soon").await;
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Allocated"));
    assert!(
        message.starts_with(&ip)
            && message.contains("annotation loxilb.io/retain-address=\"soon\" is invalid")
            && message.contains("ignored"),
        "{message}"
    );
    let s = w.get("soon").await.unwrap();
    let (programmed, _, _) = World::condition(&s, "loxilb.io/Programmed").unwrap();
    assert_eq!(programmed, "True");
    let warnings = || async {
        w.event_reasons("soon")
            .await
            .into_iter()
            .filter(|r| r == "InvalidAnnotation")
            .count()
    };
    wait_for("a Warning InvalidAnnotation", WAIT, || async {
        (warnings().await == 1).then_some(())
    })
    .await;

    // Fixed: the warning goes. Broken again (another value): reported again.
    for value in ["1h", "forever"] {
        w.services
            .patch(
                "soon",
                &PatchParams::default(),
                &Patch::Merge(json!({
                    "metadata": { "annotations": { "loxilb.io/retain-address": value } }
                })),
            )
            .await
            .unwrap();
    }
    let (status, _, _) = condition("forever").await;
    assert_eq!(status, "True");
    wait_for("a second Warning", WAIT, || async {
        (warnings().await == 2).then_some(())
    })
    .await;
    assert_eq!(w.wait_for_ip("soon").await, ip, "the address never moved");

    // Deleted with the bad value: as if absent, so released (the default pool retains none).
    w.services
        .delete("soon", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("deleted and its address released", WAIT, || async {
        let gone = w.get("soon").await.is_none();
        let released = !w.claims().await.iter().any(|c| c.spec.address == ip);
        (gone && released).then_some(())
    })
    .await;
    assert!(w.sim.rules().is_empty());
    w.finish().await;
}

/// Log lines written by the code running on the test's thread (a `#[tokio::test]` runs the
/// in-process controller's tasks on it).
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn lines_with(&self, needles: &[&str]) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .filter(|l| needles.iter().all(|n| l.contains(n)))
            .map(str::to_string)
            .collect()
    }
    fn clear(&self) {
        self.0.lock().unwrap().clear();
    }
}

/// An AddressPool that does not validate is logged once per start (the pool watch installs
/// the pools before start-up installs them again).
#[tokio::test]
async fn an_invalid_pool_is_logged_once_per_start() {
    let log = Captured::default();
    let writer = log.clone();
    let _log = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .finish(),
    );
    let mut w = World::new("apoollog").await;
    w.add_node("node-a", "10.1.12.1").await;
    stop_when_serving(&mut w).await;
    let bad = create_invalid_pool(&w, "bad", pool_spec(&w.ns, &["10.252.0.0/33"])).await;
    log.clear();
    w.start_controller(&Options::default()).await;
    // Serving: start-up is over. The pool status says why the pool is left out.
    w.serve_one_port("after", 80).await;
    wait_pool_status(&w, &bad, "Ready=False InvalidSpec", |s| {
        pool_condition(s, "Ready").1 == "InvalidSpec"
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let lines = log.lines_with(&["address pool ignored: invalid", &bad]);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    delete_pools(&w, &[&bad]).await;
    w.finish().await;
}
