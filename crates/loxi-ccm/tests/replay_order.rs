//! A loxilb that comes back empty after being away (docs/loxilb-api.md#replay-order): its
//! worker tells it its HA role, then its BGP settings, then every rule, and no Service's pass
//! writes a rule there before the role and BGP, although every Service is re-planned when
//! it comes back and loxilb answers each write slowly (the passes would have the time to
//! overtake the worker).

mod common;

use std::time::Duration;

use common::*;

#[tokio::test]
async fn a_loxilb_back_empty_gets_its_role_and_bgp_before_any_rule() {
    let opts = Options {
        extra_args: roles_and_bgp_args(),
        ..Options::default()
    };
    let w = World::with_sim("comebackorder", opts, bgp_sim()).await;
    w.add_node("node-a", "10.7.0.1").await;
    let mut ips = Vec::new();
    for name in ["web-a", "web-b", "web-c"] {
        ips.push(w.serve_one_port(name, 80).await);
    }
    wait_for("the start-up role and BGP", WAIT, || async {
        let bgp = w.sim.bgp();
        (w.sim.cluster_state("llb-inst0").as_deref() == Some("MASTER")
            && bgp.global.is_some()
            && !bgp.neighbors.is_empty())
        .then_some(())
    })
    .await;

    w.sim.go_down().await;
    // A change while it is away: the Services' passes find it unreachable.
    w.add_node("node-b", "10.7.0.2").await;
    wait_for("the Services see it unreachable", WAIT, || async {
        let svc = w.get("web-a").await?;
        let (status, reason, _) = World::condition(&svc, "loxilb.io/Programmed")?;
        (status == "False" && reason == "LoxilbUnavailable").then_some(())
    })
    .await;
    // It lost everything while away, and now answers every write slowly.
    w.sim.restart();
    w.sim.set_write_latency(Duration::from_millis(300));
    w.sim.come_up().await.expect("the simulator listens again");

    let complete = || {
        let bgp = w.sim.bgp();
        w.sim.cluster_state("llb-inst0").as_deref() == Some("MASTER")
            && bgp.global.is_some()
            && !bgp.neighbors.is_empty()
            && ips.iter().all(|ip| {
                let rules = w.rules_for(ip);
                rules.len() == 1 && rules[0].2.len() == 2
            })
    };
    wait_for("role, BGP and every rule back", WAIT, || async {
        complete().then_some(())
    })
    .await;
    let log = w.sim.writes_since_restart();
    let first = |what: &str, path: &str| {
        log.iter()
            .position(|l| l.starts_with(&format!("POST {path}")))
            .unwrap_or_else(|| panic!("no {what} in {log:#?}"))
    };
    let order = [
        first("role", "/config/cistate"),
        first("BGP global", "/config/bgp/global"),
        first("BGP neighbour", "/config/bgp/neigh"),
        first("rule", "/config/loadbalancer"),
    ];
    assert!(
        order.windows(2).all(|p| p[0] < p[1]),
        "order after coming back {order:?} in {log:#?}"
    );
    w.finish().await;
}
