//! loxilb's firewall in the simulator (docs/loxilb-api.md#firewall): identity, order,
//! actions, SNAT's own LB rule, restart, and the traffic model with loxilb issue #1036.

mod common;

use std::net::IpAddr;

use common::*;
use loxilb_sim::{FwAction, Traffic};
use serde_json::{Value, json};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn fw(src: &str, dst: &str, port: u16, pref: u32, action: &str) -> Value {
    json!({
        "ruleArguments": {"sourceIP": src, "destinationIP": dst, "protocol": 6,
            "minDestinationPort": port, "maxDestinationPort": port, "preference": pref},
        "opts": {action: true},
    })
}

#[tokio::test]
async fn rules_are_keyed_by_their_match_and_preference() {
    let env = start().await;
    let allow = fw("198.51.100.0/24", "192.0.2.10/32", 80, 200, "allow");
    assert_success(&env.post("/config/firewall", &allow).await);
    // Same identity, other action: 409 as loxilb says it.
    let same = fw("198.51.100.7/24", "192.0.2.10/32", 80, 200, "drop");
    assert_handler_error(
        &env.post("/config/firewall", &same).await,
        409,
        "fwrule-exists error",
    );
    // Another preference is another rule.
    assert_success(
        &env.post(
            "/config/firewall",
            &fw("198.51.100.0/24", "192.0.2.10/32", 80, 100, "drop"),
        )
        .await,
    );
    // A prefix that is not a CIDR.
    assert_handler_error(
        &env.post(
            "/config/firewall",
            &fw("198.51.100.7", "192.0.2.10/32", 80, 1, "drop"),
        )
        .await,
        400,
        "malformed-rule error",
    );
    let (status, list) = env.get("/config/firewall/all").await;
    assert_eq!(status, 200);
    let attrs = list["fwAttr"].as_array().unwrap();
    assert_eq!(attrs.len(), 2);
    let first = &attrs[0];
    assert_eq!(first["ruleArguments"]["sourceIP"], "198.51.100.0/24");
    assert_eq!(first["ruleArguments"]["preference"], 200);
    assert_eq!(first["opts"]["allow"], true);
    assert!(
        first["opts"].get("drop").is_none(),
        "false is omitted: {first}"
    );
    // Delete by the same identity; a second time 404.
    let q = [
        ("sourceIP", "198.51.100.0/24"),
        ("destinationIP", "192.0.2.10/32"),
        ("protocol", "6"),
        ("minDestinationPort", "80"),
        ("maxDestinationPort", "80"),
        ("preference", "200"),
    ];
    let del = || env.http.delete(env.api("/config/firewall")).query(&q);
    assert_success(&env.send(del()).await);
    assert_handler_error(&env.send(del()).await, 404, "no-rule error");
    assert_eq!(env.sim.firewall_rules().len(), 1);
    env.sim.restart();
    assert!(
        env.sim.firewall_rules().is_empty(),
        "a restart wipes the firewall"
    );
}

#[tokio::test]
async fn snat_rules_make_their_own_lb_rule() {
    let env = start().await;
    let snat = json!({
        "ruleArguments": {"sourceIP": "10.1.0.5/32"},
        "opts": {"doSnat": true, "toIP": "192.0.2.50", "onDefault": true},
    });
    assert_success(&env.post("/config/firewall", &snat).await);
    let rules = env.sim.firewall_rules();
    assert_eq!(rules.len(), 1);
    assert_eq!(
        rules[0].action,
        FwAction::Snat {
            to_ip: "192.0.2.50".into(),
            to_port: 0
        }
    );
    assert_eq!(
        rules[0].destination, "0.0.0.0/0",
        "an empty prefix is any of the family"
    );
    let lb = env.sim.rules();
    assert_eq!(lb.len(), 1);
    assert_eq!(lb[0].name, "snat:192.0.2.50:0");
    assert_eq!(lb[0].block, 0x1001);
    assert_eq!(lb[0].protocol, "none");
    let listed = env.list().await;
    assert_eq!(listed[0]["serviceArguments"]["snat"], true);
    // A mark with SNAT, or no address to SNAT to: refused.
    let mut bad = snat.clone();
    bad["opts"]["fwMark"] = json!(7);
    bad["ruleArguments"]["sourceIP"] = json!("10.1.0.6/32");
    assert_eq!(env.post("/config/firewall", &bad).await.0, 400);
    let q = [("sourceIP", "10.1.0.5/32")];
    assert_success(
        &env.send(env.http.delete(env.api("/config/firewall")).query(&q))
            .await,
    );
    assert!(
        env.sim.rules().is_empty(),
        "the SNAT rule's LB rule goes with it"
    );
}

#[tokio::test]
async fn the_traffic_model_follows_preference_and_issue_1036() {
    let env = start().await;
    assert_success(
        &env.post_lb(&tcp_rule("192.0.2.10", 80, &["10.0.0.1"]))
            .await,
    );
    assert_success(
        &env.post_lb(&tcp_rule("192.0.2.11", 80, &["10.0.0.2"]))
            .await,
    );
    let (vip, other) = (ip("192.0.2.10"), ip("192.0.2.11"));
    let (inside, outside) = (ip("198.51.100.7"), ip("203.0.113.9"));
    assert!(env.sim.traffic(outside, vip, 80, "tcp").is_balanced());
    assert_eq!(env.sim.traffic(outside, vip, 81, "tcp"), Traffic::NoRule);
    // Allow the range at 200, drop the rest at 100: first match by preference.
    assert_success(
        &env.post(
            "/config/firewall",
            &fw("0.0.0.0/0", "192.0.2.10/32", 80, 100, "drop"),
        )
        .await,
    );
    assert_eq!(
        env.sim.traffic(inside, vip, 80, "tcp"),
        Traffic::DroppedByFirewall { preference: 100 },
        "before the allow rule exists"
    );
    assert_success(
        &env.post(
            "/config/firewall",
            &fw("198.51.100.0/24", "192.0.2.10/32", 80, 200, "allow"),
        )
        .await,
    );
    assert!(env.sim.traffic(inside, vip, 80, "tcp").is_balanced());
    assert_eq!(
        env.sim.traffic(outside, vip, 80, "tcp"),
        Traffic::DroppedByFirewall { preference: 100 }
    );
    assert!(
        env.sim.traffic(outside, other, 80, "tcp").is_balanced(),
        "other VIPs untouched"
    );
    assert!(env.sim.traffic(outside, vip, 80, "udp") == Traffic::NoRule);
    // An allow rule that sets a mark sends the packet to the rules of that block.
    let mut marked = fw("203.0.113.0/24", "192.0.2.11/32", 80, 300, "allow");
    marked["opts"]["fwMark"] = json!(5);
    assert_success(&env.post("/config/firewall", &marked).await);
    assert_eq!(env.sim.traffic(outside, other, 80, "tcp"), Traffic::NoRule);
    // allowedSources on any rule: nothing is balanced any more (loxilb issue #1036).
    let mut restricted = tcp_rule("192.0.2.12", 80, &["10.0.0.3"]);
    restricted["allowedSources"] = json!([{"prefix": "198.51.100.0/24"}]);
    assert_success(&env.post_lb(&restricted).await);
    assert_eq!(env.sim.traffic(inside, vip, 80, "tcp"), Traffic::Issue1036);
    assert_eq!(
        env.sim.traffic(inside, ip("192.0.2.12"), 80, "tcp"),
        Traffic::Issue1036
    );
    env.sim.set_issue_1036(false);
    assert!(
        env.sim
            .traffic(inside, ip("192.0.2.12"), 80, "tcp")
            .is_balanced()
    );
    assert_eq!(
        env.sim.traffic(outside, ip("192.0.2.12"), 80, "tcp"),
        Traffic::NotAnAllowedSource
    );
}
