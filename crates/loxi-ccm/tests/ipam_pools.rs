//! Address pools against the real API server: the flags' pools (dual stack, selection) and
//! AddressPool resources (namespace and Service selectors, priority, autoAssign, retain,
//! edits, shrinking and disabling, overlapping and invalid pools, their status and logs).

mod common;

use common::addresses::{
    address_reason, create_pool, delete_pools, only_ns, pool_spec, pools_api, stop_when_serving,
};
use common::{CLASS, Options, WAIT, World, annotated, store_in_etcd, wait_for};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use loxi_ccm::ipam::address_pools::{
    AddressPool, AddressPoolSpec, AddressPoolStatus, FamilyUsage, LabelSelector,
    LabelSelectorRequirement,
};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

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
