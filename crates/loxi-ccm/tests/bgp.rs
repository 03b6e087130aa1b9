//! BGP from the controller's settings (docs/bgp.md), against the real API server and
//! simulators running with BGP on: global settings and peers on every loxilb, peers removed
//! when the settings drop them, each address advertised once whatever the endpoint changes,
//! withdrawn on delete, everything back after a loxilb restart, session states as a metric.

mod common;

use common::*;
use kube::api::DeleteParams;
use loxilb_sim::{SimConfig, Simulator};

fn bgp_sim() -> SimConfig {
    SimConfig {
        bgp: true,
        ..SimConfig::default()
    }
}

fn peers_of(sim: &Simulator) -> Vec<(String, u32)> {
    sim.bgp()
        .neighbors
        .into_iter()
        .map(|n| (n.ip, n.remote_as))
        .collect()
}

/// Global settings (4-byte AS, router id from the loxilb's address) and an IPv4 and an IPv6
/// peer on every loxilb; a session state set in a simulator shows in the metric.
#[tokio::test]
async fn global_and_peers_on_every_loxilb_and_session_states_as_a_metric() {
    let other = Simulator::start("127.0.0.1:0".parse().unwrap(), bgp_sim())
        .await
        .unwrap();
    let admin_port = testenv::free_port().unwrap();
    let opts = Options {
        admin_port: Some(admin_port),
        extra_args: vec![
            format!("--loxilb-url={}", other.url()),
            "--bgp-local-as=4200000001".into(),
            "--bgp-peers=192.0.2.254:65001,[2001:db8::1]:65002".into(),
        ],
        ..Options::default()
    };
    let w = World::with_sim("bgpglobal", opts, bgp_sim()).await;
    let want = vec![
        ("192.0.2.254".to_string(), 65001),
        ("2001:db8::1".to_string(), 65002),
    ];
    for sim in [&w.sim, &other] {
        wait_for("BGP global and peers", WAIT, || async {
            let bgp = sim.bgp();
            let global = bgp.global?;
            let mut peers = peers_of(sim);
            peers.sort();
            (global.local_as == 4_200_000_001 && global.router_id == "127.0.0.1" && peers == want)
                .then_some(())
        })
        .await;
    }
    assert!(other.set_bgp_peer_state("192.0.2.254", "ESTABLISHED", Some("00:00:05")));
    wait_for("the session state in the metric", WAIT, || async {
        let established = World::metric_sum(
            admin_port,
            "loxi_ccm_bgp_sessions",
            &["peer=\"192.0.2.254\"", "state=\"ESTABLISHED\""],
        )
        .await?;
        (established == 1.0).then_some(())
    })
    .await;
    w.finish().await;
}

/// A peer the settings no longer name is removed from loxilb (the controller restarted with
/// other flags), the other kept.
#[tokio::test]
async fn a_peer_dropped_from_the_settings_is_removed_from_loxilb() {
    let two = Options {
        extra_args: vec![
            "--bgp-local-as=65100".into(),
            "--bgp-peers=192.0.2.251:65001,192.0.2.252:65002".into(),
        ],
        ..Options::default()
    };
    let mut w = World::with_sim("bgppeers", two, bgp_sim()).await;
    wait_for("two peers", WAIT, || async {
        (peers_of(&w.sim).len() == 2).then_some(())
    })
    .await;
    w.stop_controller().await;
    let one = Options {
        extra_args: vec![
            "--bgp-local-as=65100".into(),
            "--bgp-peers=192.0.2.252:65002".into(),
        ],
        ..Options::default()
    };
    w.start_controller(&one).await;
    wait_for("the dropped peer removed", WAIT, || async {
        (peers_of(&w.sim) == [("192.0.2.252".to_string(), 65002)]).then_some(())
    })
    .await;
    w.finish().await;
}

/// Each address is advertised once: a hundred endpoint changes (in-place updates) add no
/// advertisement, the Service's deletion withdraws it; a loxilb restart brings back the BGP
/// settings and the rule, advertised once again.
#[tokio::test]
async fn an_address_is_advertised_once_and_withdrawn_on_delete() {
    let opts = Options {
        extra_args: vec![
            "--bgp-local-as=65100".into(),
            "--bgp-peers=192.0.2.250:65001".into(),
        ],
        ..Options::default()
    };
    let w = World::with_sim("bgpadvert", opts, bgp_sim()).await;
    w.add_node("node-a", "10.7.0.1").await;
    w.create(&World::lb_service("web", Some(CLASS), &[(80, "TCP")]))
        .await;
    let ip = w.wait_for_ip("web").await;
    let count = || w.sim.bgp_advertisement_count(&ip);
    wait_for("the address advertised", WAIT, || async {
        (count() == 1).then_some(())
    })
    .await;
    // 100 endpoint changes: node-b comes and goes 50 times.
    for round in 0..50 {
        w.add_node("node-b", "10.7.0.2").await;
        wait_for("node-b in the rule", WAIT, || async {
            let r = w.rules_for(&ip);
            (r.len() == 1 && r[0].2.len() == 2).then_some(())
        })
        .await;
        w.nodes
            .delete("node-b", &DeleteParams::default())
            .await
            .unwrap();
        wait_for("node-b out of the rule", WAIT, || async {
            let r = w.rules_for(&ip);
            (r.len() == 1 && r[0].2.len() == 1).then_some(())
        })
        .await;
        assert_eq!(
            count(),
            1,
            "round {round}: an update added an advertisement"
        );
    }

    w.sim.restart();
    wait_for("BGP and the rule back after the restart", WAIT, || async {
        let bgp = w.sim.bgp();
        (bgp.global.is_some()
            && peers_of(&w.sim).len() == 1
            && w.rules_for(&ip).len() == 1
            && count() == 1)
            .then_some(())
    })
    .await;

    w.services
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the rule gone and the address withdrawn", WAIT, || async {
        (w.rules_for(&ip).is_empty() && count() == 0).then_some(())
    })
    .await;
    w.finish().await;
}

/// A pool with `bgpAdvertise: false` announces nothing: its Service's rule is created
/// without BGP (advertisement count 0) while a Service from another pool is announced; turning
/// the switch on re-creates the rule advertising.
#[tokio::test]
async fn a_pool_with_advertisement_off_announces_nothing() {
    use kube::api::{Api, Patch, PatchParams, PostParams};
    use loxi_ccm::ipam::address_pools::{AddressPool, AddressPoolSpec};
    let admin_port = testenv::free_port().unwrap();
    let opts = Options {
        admin_port: Some(admin_port),
        extra_args: vec![
            "--bgp-local-as=65100".into(),
            "--bgp-peers=192.0.2.250:65001".into(),
        ],
        ..Options::default()
    };
    let w = World::with_sim("bgppool", opts, bgp_sim()).await;
    let pools: Api<AddressPool> = Api::all(w.client.clone());
    let name = format!("{}-quiet", w.ns);
    let _ = pools.delete(&name, &DeleteParams::default()).await;
    wait_for("no stale pool", WAIT, || async {
        pools.get_opt(&name).await.unwrap().is_none().then_some(())
    })
    .await;
    pools
        .create(
            &PostParams::default(),
            &AddressPool::new(
                &name,
                AddressPoolSpec {
                    addresses: vec!["198.51.100.0/28".into()],
                    auto_assign: false,
                    avoid_buggy_ips: true,
                    priority: 0,
                    disabled: false,
                    namespace_selector: None,
                    service_selector: None,
                    retain_addresses: None,
                    bgp_advertise: false,
                },
            ),
        )
        .await
        .unwrap();
    w.add_node("node-a", "10.7.0.1").await;
    let quiet = annotated(
        World::lb_service("quiet", Some(CLASS), &[(80, "TCP")]),
        &[("loxilb.io/poolSelect", name.as_str())],
    );
    w.create(&quiet).await;
    w.create(&World::lb_service("loud", Some(CLASS), &[(80, "TCP")]))
        .await;
    let quiet_ip = w.wait_for_ip("quiet").await;
    let loud_ip = w.wait_for_ip("loud").await;
    assert!(quiet_ip.starts_with("198.51.100."), "{quiet_ip}");
    wait_for(
        "both rules, only the loud address announced",
        WAIT,
        || async {
            (w.rules_for(&quiet_ip).len() == 1
                && w.rules_for(&loud_ip).len() == 1
                && w.sim.bgp_advertisement_count(&loud_ip) == 1)
                .then_some(())
        },
    )
    .await;
    assert_eq!(w.sim.bgp_advertisement_count(&quiet_ip), 0);
    assert_eq!(
        w.sim.bgp_advertisements().keys().collect::<Vec<_>>(),
        [&loud_ip]
    );

    // Switched on: the rule is re-created advertising.
    pools
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"bgpAdvertise": true}})),
        )
        .await
        .unwrap();
    wait_for("the quiet address announced once", WAIT, || async {
        (w.sim.bgp_advertisement_count(&quiet_ip) == 1 && w.rules_for(&quiet_ip).len() == 1)
            .then_some(())
    })
    .await;
    for svc in ["quiet", "loud"] {
        w.services
            .delete(svc, &DeleteParams::default())
            .await
            .unwrap();
    }
    wait_for("both withdrawn", WAIT, || async {
        w.sim.bgp_advertisements().is_empty().then_some(())
    })
    .await;
    // The counter of advertisement changes: the loud rule and the re-created quiet one
    // announced, both deletions withdrew (the quiet rule's DELETE before its re-creation
    // carried ?bgp=false and changed nothing).
    let changes = |change: &'static str| async move {
        World::metric_sum(
            admin_port,
            "loxi_ccm_bgp_advertisement_changes_total",
            &[&format!("change=\"{change}\"")],
        )
        .await
    };
    wait_for(
        "two announcements and two withdrawals counted",
        WAIT,
        || async {
            (changes("announce").await? == 2.0 && changes("withdraw").await? == 2.0).then_some(())
        },
    )
    .await;
    let _ = pools.delete(&name, &DeleteParams::default()).await;
    w.finish().await;
}
