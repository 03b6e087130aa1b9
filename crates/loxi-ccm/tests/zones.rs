//! Groups of loxilbs (kube-loxilb's zones) and placement by capacity
//! (docs/fleet.md#groups-and-placement), against the real API server and several
//! simulators: a Service with `loxilb.io/zoneselect` lands only on that group's loxilbs; a
//! Service that names none is placed on the group with the most room, recorded on it, and
//! never moved (not by a restart, a leader change or a new group); two groups full to the
//! last rule make the next Service wait with a condition, and it is programmed as soon as
//! one Service is deleted; Services are never split between groups, and two groups never
//! share an address.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::{Api, DeleteParams, ListParams};
use loxilb_sim::{SimConfig, Simulator};

const ZONE: &str = "loxilb.io/zoneselect";

async fn sim() -> Simulator {
    Simulator::start("127.0.0.1:0".parse().unwrap(), SimConfig::default())
        .await
        .unwrap()
}

/// Addresses (as text) that have at least one rule on `s`.
fn addresses_on(s: &Simulator) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for r in s.rules() {
        *out.entry(r.external_ip).or_default() += 1;
    }
    out
}

fn zone_of(svc: &Service) -> Option<String> {
    svc.metadata.annotations.as_ref()?.get(ZONE).cloned()
}

fn ingress_ip(svc: &Service) -> Option<String> {
    svc.status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?
        .first()?
        .ip
        .clone()
}

/// Every Service of the namespace placed on a group (annotation) with an address: name ->
/// (group, address).
async fn placements(w: &World) -> BTreeMap<String, (String, String)> {
    w.services
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter_map(|s| Some((s.metadata.name.clone()?, (zone_of(s)?, ingress_ip(s)?))))
        .collect()
}

/// `loxilb.io/zoneselect` puts a Service on that group's loxilbs only; a Service without it
/// is placed on the group with the most room and the choice is recorded; Services of two
/// groups never share an address; an unknown group is reported; a restart, a leader change
/// and a new group move nothing.
#[tokio::test]
async fn zoneselect_lands_on_its_group_and_placements_never_move() {
    let (east1, east2, west) = (sim().await, sim().await, sim().await);
    let port = testenv::free_port().unwrap();
    let opts = |port: u16, extra: &[&Simulator]| Options {
        admin_port: Some(port),
        extra_args: [&east1, &east2]
            .iter()
            .map(|s| format!("--loxilb-url=east={}", s.url()))
            .chain(
                extra
                    .iter()
                    .map(|s| format!("--loxilb-url=west={}", s.url())),
            )
            .chain(["--set-roles=0.0.0.0".to_string()])
            .collect(),
        ..Options::default()
    };
    // Groups: llb (the default: the world's simulator) and east (two loxilbs).
    let mut w = World::with("zones", opts(port, &[])).await;
    w.add_node("node-a", "10.7.0.1").await;

    w.create(&annotated(
        World::lb_service("in-east", Some(CLASS), &[(80, "TCP")]),
        &[(ZONE, "east")],
    ))
    .await;
    let east_ip = w.wait_for_ip("in-east").await;
    wait_for("in-east on both east loxilbs", WAIT, || async {
        (addresses_on(&east1).get(&east_ip) == Some(&1)
            && addresses_on(&east2).get(&east_ip) == Some(&1))
        .then_some(())
    })
    .await;
    assert!(
        !addresses_on(&w.sim).contains_key(&east_ip),
        "a Service of east has no rule on the llb loxilb"
    );
    // HA roles per group: east's instance among east's loxilbs, llb's on llb's.
    wait_for("one MASTER of east-inst0 in east", WAIT, || async {
        let states = [
            east1.cluster_state("east-inst0"),
            east2.cluster_state("east-inst0"),
        ];
        let masters = states
            .iter()
            .filter(|s| s.as_deref() == Some("MASTER"))
            .count();
        let backups = states
            .iter()
            .filter(|s| s.as_deref() == Some("BACKUP"))
            .count();
        (masters == 1 && backups == 1).then_some(())
    })
    .await;
    wait_for("llb-inst0 MASTER on llb", WAIT, || async {
        (w.sim.cluster_state("llb-inst0").as_deref() == Some("MASTER")).then_some(())
    })
    .await;
    assert_eq!(
        east1.cluster_state("llb-inst0").as_deref(),
        Some("NOT_DEFINED")
    );
    assert_eq!(
        w.sim.cluster_state("east-inst0"),
        None,
        "no role outside its group"
    );
    let rule = east1
        .rules()
        .into_iter()
        .find(|r| r.external_ip == east_ip)
        .unwrap();
    assert!(
        rule.name.ends_with(":east-inst0"),
        "its rule names its group's HA instance: {}",
        rule.name
    );

    // Placed by capacity: llb has no rule yet, east has one, so llb. Port 81 would share
    // in-east's address within one group; across groups it must not.
    w.create(&World::lb_service("placed", Some(CLASS), &[(81, "TCP")]))
        .await;
    let placed_ip = w.wait_for_ip("placed").await;
    let placed = wait_for("placed programmed", WAIT, || async {
        let svc = w.get("placed").await?;
        World::condition(&svc, "loxilb.io/Programmed")
            .filter(|c| c.0 == "True")
            .map(|c| (svc, c))
    })
    .await;
    assert_eq!(
        placed.1.2, "1 rule(s) on 1/1 loxilb instance(s) of group llb",
        "shown on the Service"
    );
    let placed = placed.0;
    assert_eq!(zone_of(&placed).as_deref(), Some("llb"), "recorded");
    assert_ne!(placed_ip, east_ip, "two groups never share an address");
    wait_for("placed on the llb loxilb", WAIT, || async {
        (addresses_on(&w.sim).get(&placed_ip) == Some(&1)).then_some(())
    })
    .await;
    assert!(!addresses_on(&east1).contains_key(&placed_ip));
    assert!(!addresses_on(&east2).contains_key(&placed_ip));

    // Another Service for east on port 82 shares in-east's address (same group).
    w.create(&annotated(
        World::lb_service("east-too", Some(CLASS), &[(82, "TCP")]),
        &[(ZONE, "east")],
    ))
    .await;
    assert_eq!(
        w.wait_for_ip("east-too").await,
        east_ip,
        "shared within east"
    );

    // A group that has no loxilb: reported, nothing claimed.
    w.create(&annotated(
        World::lb_service("nowhere", Some(CLASS), &[(80, "TCP")]),
        &[(ZONE, "north")],
    ))
    .await;
    let cond = wait_for("nowhere reported", WAIT, || async {
        let svc = w.get("nowhere").await?;
        World::condition(&svc, "loxilb.io/Programmed").filter(|c| c.1 == "UnknownZone")
    })
    .await;
    assert!(cond.2.contains("north"), "{cond:?}");
    assert!(
        w.event_reasons("nowhere")
            .await
            .contains(&"UnknownZone".to_string())
    );
    w.services
        .delete("nowhere", &DeleteParams::default())
        .await
        .unwrap();
    let settled = w.settle_programmed(&opts(port, &[]), WAIT).await;
    eprintln!("zones: settled and audited clean in {settled:?}");

    // The fleet as `kubectl get configmap loxi-ccm-fleet` shows it: a line per group.
    let records: Api<ConfigMap> = Api::namespaced(w.client.clone(), &w.ns);
    let shown = wait_for("the fleet's status record", WAIT, || async {
        let data = records.get_opt("loxi-ccm-fleet").await.ok()??.data?;
        let (east, llb) = (data.get("east")?, data.get("llb")?);
        (east.starts_with("2 loxilb(s): 2 serving")
            && east.contains("east-inst0 MASTER")
            && east.contains("2 rule(s) placed")
            && llb.contains("1 rule(s) placed"))
        .then(|| data.clone())
    })
    .await;
    eprintln!("zones: fleet record {shown:?}");

    // A restart with a new, empty group: nothing moves (a fresh decision would now pick
    // west for a Service without a record).
    let before = placements(&w).await;
    assert_eq!(before.len(), 3, "{before:?}");
    w.stop_controller().await;
    let port2 = testenv::free_port().unwrap();
    w.start_controller(&opts(port2, &[&west])).await;
    w.create(&World::lb_service("newcomer", Some(CLASS), &[(80, "TCP")]))
        .await;
    let newcomer_ip = w.wait_for_ip("newcomer").await;
    let newcomer = w.get("newcomer").await.unwrap();
    assert_eq!(
        zone_of(&newcomer).as_deref(),
        Some("west"),
        "the empty group has the most room"
    );
    wait_for("newcomer on west", WAIT, || async {
        (addresses_on(&west).get(&newcomer_ip) == Some(&1)).then_some(())
    })
    .await;
    let settled = w.settle_programmed(&opts(port2, &[&west]), WAIT).await;
    eprintln!("zones: after the restart, settled in {settled:?}");
    let mut after = placements(&w).await;
    after.remove("newcomer");
    assert_eq!(after, before, "a restart and a new group move nothing");
    assert_eq!(addresses_on(&west).len(), 1, "only the newcomer on west");

    // A leader change keeps them too.
    let port3 = testenv::free_port().unwrap();
    let standby = w.spawn_controller(&opts(port3, &[&west]));
    w.stop_controller().await;
    w.controller = Some(standby);
    wait_for("the standby leads", Duration::from_secs(60), || async {
        World::metric(port3, "loxi_ccm_leader")
            .await
            .filter(|v| *v == 1.0)
    })
    .await;
    let settled = w
        .settle_programmed(&opts(port3, &[&west]), Duration::from_secs(60))
        .await;
    eprintln!("zones: after the leader change, settled in {settled:?}");
    let mut after = placements(&w).await;
    after.remove("newcomer");
    assert_eq!(after, before, "a leader change moves nothing");
    let groups = World::metric_sum(port3, "loxi_ccm_group_loxilbs", &["state=\"serving\""])
        .await
        .unwrap();
    assert_eq!(groups, 4.0, "llb 1 + east 2 + west 1 serving");

    // A controller that does not know east's loxilbs (yet: a LoxiURL or discovery not listed
    // at start-up, or gone): east's Services keep their address and placement, and say
    // their loxilbs are unavailable, rather than that their group is unknown.
    w.stop_controller().await;
    let port4 = testenv::free_port().unwrap();
    let mut without_east = opts(port4, &[&west]);
    without_east
        .extra_args
        .retain(|a| !a.starts_with("--loxilb-url=east="));
    w.start_controller(&without_east).await;
    let cond = wait_for("in-east without its loxilbs", WAIT, || async {
        let svc = w.get("in-east").await?;
        World::condition(&svc, "loxilb.io/Programmed").filter(|c| c.1 == "LoxilbUnavailable")
    })
    .await;
    assert_eq!(cond.2, "no loxilb of group east serves (yet)");
    let in_east = w.get("in-east").await.unwrap();
    assert_eq!(ingress_ip(&in_east), Some(east_ip.clone()));
    assert_eq!(zone_of(&in_east).as_deref(), Some("east"));
    assert!(
        !w.event_reasons("in-east")
            .await
            .contains(&"UnknownZone".to_string())
    );
    w.finish().await;
}

/// Two groups whose loxilbs hold at most 100 rules: 100 two-port Services fill them exactly,
/// none split between groups; the 101st waits with a condition saying why, and is programmed
/// as soon as one Service is deleted.
#[tokio::test]
async fn capacity_placement_fills_two_groups_and_the_next_waits() {
    let (east1, east2) = (sim().await, sim().await);
    let opts = Options {
        extra_args: vec![
            "--loxilb-max-rules=100".into(),
            format!("--loxilb-url=east={}", east1.url()),
            format!("--loxilb-url=east={}", east2.url()),
            "--concurrency=8".into(),
        ],
        ..Options::default()
    };
    let w = World::with("zonecap", opts.clone()).await;
    w.add_node("node-a", "10.7.0.1").await;
    let two_ports = [(80, "TCP"), (443, "TCP")];
    for i in 0..100 {
        w.create(&World::lb_service(
            &format!("s{i}"),
            Some(CLASS),
            &two_ports,
        ))
        .await;
    }
    let took = w.settle_programmed(&opts, Duration::from_secs(180)).await;
    eprintln!("zonecap: 100 two-port Services placed, programmed and audited clean in {took:?}");

    let placed = placements(&w).await;
    assert_eq!(placed.len(), 100);
    let in_group = |g: &str| placed.values().filter(|(z, _)| z == g).count();
    assert_eq!(in_group("llb"), 50, "{placed:?}");
    assert_eq!(in_group("east"), 50);
    assert_eq!(w.sim.rules().len(), 100);
    assert_eq!(east1.rules().len(), 100);
    assert_eq!(east2.rules().len(), 100);
    for (name, (group, ip)) in &placed {
        let (here, elsewhere) = if group == "llb" {
            (vec![&w.sim], vec![&east1, &east2])
        } else {
            (vec![&east1, &east2], vec![&w.sim])
        };
        for s in here {
            assert_eq!(
                addresses_on(s).get(ip),
                Some(&2),
                "{name}: both rules on every loxilb of {group}"
            );
        }
        for s in elsewhere {
            assert!(!addresses_on(s).contains_key(ip), "{name} split");
        }
    }

    // The 101st: no group has room for its two rules.
    w.create(&World::lb_service("s100", Some(CLASS), &two_ports))
        .await;
    let cond = wait_for("s100 waits", WAIT, || async {
        let svc = w.get("s100").await?;
        World::condition(&svc, "loxilb.io/Programmed").filter(|c| c.1 == "CapacityExceeded")
    })
    .await;
    assert!(
        cond.2
            .contains("no group of loxilbs has room for its 2 rule(s)"),
        "{cond:?}"
    );
    let s100 = w.get("s100").await.unwrap();
    assert_eq!(zone_of(&s100), None, "not placed");
    assert_eq!(ingress_ip(&s100), None, "no address while it waits");
    assert_eq!(
        w.sim.rules().len() + east1.rules().len(),
        200,
        "nothing half-programmed"
    );

    // One Service goes: s100 takes its room.
    let (gone_group, _) = placed["s7"].clone();
    w.services
        .delete("s7", &DeleteParams::default())
        .await
        .unwrap();
    let ip = w.wait_for_ip("s100").await;
    let s100 = w.get("s100").await.unwrap();
    assert_eq!(zone_of(&s100), Some(gone_group.clone()));
    let on = if gone_group == "llb" { &w.sim } else { &east1 };
    wait_for("s100 programmed", WAIT, || async {
        (addresses_on(on).get(&ip) == Some(&2)).then_some(())
    })
    .await;
    let took = w.settle_programmed(&opts, Duration::from_secs(60)).await;
    eprintln!("zonecap: the 101st programmed and the audit clean {took:?} after a deletion");
    w.finish().await;
}

/// In-cluster loxilbs grouped by topology zone (`--loxilb-discovery-zones`): each
/// discovered loxilb joins the group named after its EndpointSlice zone; a Service naming a
/// group lands there only, one naming none is placed by capacity, and the fleet record shows
/// the groups.
#[tokio::test]
async fn discovered_loxilbs_are_grouped_by_topology_zone() {
    let host = host_address();
    let start = || async {
        Simulator::start((host, 0).into(), SimConfig::default())
            .await
            .unwrap()
    };
    let (a1, a2, b) = (start().await, start().await, start().await);
    let opts = Options {
        discovery: true,
        extra_args: vec!["--loxilb-discovery-zones".into()],
        ..Options::default()
    };
    let w = World::with("zonediscovery", opts.clone()).await;
    w.add_node("node-a", "10.7.0.1").await;
    let svc = "loxilb-lb-service";
    let h = host.to_string();
    for (slice, s, zone) in [
        ("loxilb-a1", &a1, "rack-a"),
        ("loxilb-a2", &a2, "rack-a"),
        ("loxilb-b", &b, "Rack_B"),
    ] {
        w.set_loxilb_slice_in_zone(svc, slice, &h, s.addr().port(), true, Some(zone))
            .await;
    }
    // The record lists both groups once every loxilb serves.
    let records: Api<ConfigMap> = Api::namespaced(w.client.clone(), &w.ns);
    wait_for("both groups serving", WAIT, || async {
        let data = records.get_opt("loxi-ccm-fleet").await.ok()??.data?;
        (data.get("rack-a")?.starts_with("2 loxilb(s): 2 serving")
            && data.get("rack-b")?.starts_with("1 loxilb(s): 1 serving"))
        .then_some(())
    })
    .await;

    w.create(&annotated(
        World::lb_service("on-b", Some(CLASS), &[(80, "TCP")]),
        &[(ZONE, "rack-b")],
    ))
    .await;
    let b_ip = w.wait_for_ip("on-b").await;
    wait_for("on-b on rack-b's loxilb", WAIT, || async {
        (addresses_on(&b).get(&b_ip) == Some(&1)).then_some(())
    })
    .await;
    // Placed by capacity: rack-b holds a rule, rack-a none, so rack-a, on both loxilbs.
    w.create(&World::lb_service("placed", Some(CLASS), &[(80, "TCP")]))
        .await;
    let placed_ip = w.wait_for_ip("placed").await;
    wait_for("placed on both rack-a loxilbs", WAIT, || async {
        (addresses_on(&a1).get(&placed_ip) == Some(&1)
            && addresses_on(&a2).get(&placed_ip) == Some(&1))
        .then_some(())
    })
    .await;
    assert_eq!(
        zone_of(&w.get("placed").await.unwrap()).as_deref(),
        Some("rack-a")
    );
    assert!(!addresses_on(&a1).contains_key(&b_ip));
    assert!(!addresses_on(&b).contains_key(&placed_ip));
    w.finish().await;
}
