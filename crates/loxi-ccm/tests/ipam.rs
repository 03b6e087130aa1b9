//! Address management against the real API server: durable claims, races between two
//! controllers, restart mid-burst, retain, reservations, adoption, static addresses.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{CLASS, Options, WAIT, World, wait_for};
use futures::future::join_all;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use loxi_ccm::claims::{AddressClaim, AddressClaimSpec, ClaimedBy};

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
                        uid: String::new(),
                    },
                    retain_until: None,
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
