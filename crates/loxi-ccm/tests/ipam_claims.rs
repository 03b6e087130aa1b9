//! Durable address claims against the real API server: two controllers allocating at once,
//! a restart mid-burst, retained addresses, reservations, static addresses and adoption, IPv6
//! addresses at the edges of a block, and a `loxilb.io/retain-address` that does not parse.
//! (Pools are in `ipam_pools.rs`, sharing in `ipam_sharing.rs`.)

mod common;

use common::addresses::{create_pool, delete_pools, pool_spec};
use common::{CLASS, Options, WAIT, World, annotated, wait_for};
use futures::future::join_all;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use loxi_ccm::ipam::claims::{AddressClaim, AddressClaimSpec, ClaimedBy};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

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
