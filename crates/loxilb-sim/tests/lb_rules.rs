//! LB rule behaviour over real HTTP: create, idempotency, updates, deletes,
//! limits and the documented loxilb quirks (docs/loxilb-api.md, from Rule fields to
//! Deleting rules, and Limits).

mod common;

use common::*;
use loxilb_sim::SimConfig;
use serde_json::{Value, json};

#[tokio::test]
async fn unchanged_repost_is_409_exists() {
    let env = start().await;
    let body = tcp_rule("192.168.10.100", 80, &["10.0.0.11", "10.0.0.12"]);
    assert_success(&env.post_lb(&body).await);
    let again = env.post_lb(&body).await;
    assert_handler_error(&again, 409, "lbrule-exists error");
    assert!(again.1["result"].as_str().unwrap().contains("exist"));
    assert_eq!(
        again.1["message"],
        "Resource conflict: Resource already exists OR dependency not found"
    );
    assert_eq!(env.sim.rules().len(), 1);
}

#[tokio::test]
async fn get_shows_effective_values_and_hides_input_only_fields() {
    let env = start().await;
    let body = json!({
        "serviceArguments": {"externalIP": "192.168.10.100", "port": 80, "protocol": "tcp",
            "mode": 2, "probetype": "tcp", "probeport": 30080, "probeTimeout": 10,
            "probeRetries": 3, "privateIP": "10.10.10.10", "probereq": "x", "managed": true,
            "name": "default_web:llb-inst0", "snat": true},
        "endpoints": endpoints(&["10.0.0.12", "10.0.0.11"], 30080),
    });
    assert_success(&env.post_lb(&body).await);
    let rules = env.list().await;
    assert_eq!(rules.len(), 1);
    let r = &rules[0];
    let sa = &r["serviceArguments"];
    assert_eq!(
        *sa,
        json!({"externalIP": "192.168.10.100", "port": 80, "protocol": "tcp", "mode": 2,
            "monitor": true, "managed": true, "inactiveTimeOut": 240, "probetype": "tcp",
            "probeport": 30080, "name": "default_web:llb-inst0"})
    );
    // New rule endpoints are sorted by IP; output-only fields are filled.
    assert_eq!(
        r["endpoints"],
        json!([
            {"endpointIP": "10.0.0.11", "targetPort": 30080, "weight": 1, "state": "active", "counter": "0:0"},
            {"endpointIP": "10.0.0.12", "targetPort": 30080, "weight": 1, "state": "active", "counter": "0:0"}
        ])
    );
    assert!(r["secondaryIPs"].is_null() && r.get("secondaryIPs").is_some());
    assert!(r["allowedSources"].is_null() && r.get("allowedSources").is_some());
}

#[tokio::test]
async fn udp_inactive_timeout_default_and_limit() {
    let env = start().await;
    let mut body = rule("192.168.10.1", 53, "udp", &["10.0.0.1"]);
    assert_success(&env.post_lb(&body).await);
    let r = env.find("192.168.10.1", 53).await.unwrap();
    assert_eq!(r["serviceArguments"]["inactiveTimeOut"], 20);
    body["serviceArguments"]["port"] = json!(54);
    body["serviceArguments"]["inactiveTimeOut"] = json!(86_401);
    assert_handler_error(&env.post_lb(&body).await, 400, "service-args error");
    body["serviceArguments"]["inactiveTimeOut"] = json!(-1);
    assert_handler_error(&env.post_lb(&body).await, 400, "service-args error");
}

#[tokio::test]
async fn in_place_endpoint_update_shows_request_set() {
    let env = start().await;
    let mut body = tcp_rule("192.168.10.100", 80, &["10.0.0.11", "10.0.0.12"]);
    assert_success(&env.post_lb(&body).await);
    body["endpoints"] = endpoints(&["10.0.0.13", "10.0.0.12"], 8080);
    assert_success(&env.post_lb(&body).await);
    let r = env.find("192.168.10.100", 80).await.unwrap();
    // Kept endpoints first (stored order), new ones appended.
    assert_eq!(ep_ips(&r), ["10.0.0.12", "10.0.0.13"]);
    let rules = env.sim.rules();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].endpoints.len(), 2);
    // Same set again: the hidden 10.0.0.11 makes loxilb see a change every time (seen on a
    // live loxilb): 200, and nothing changes.
    for _ in 0..2 {
        assert_success(&env.post_lb(&body).await);
        assert_eq!(env.sim.rules(), rules);
    }
    // Re-adding the hidden endpoint re-activates it; from then on the same set is 409.
    body["endpoints"] = endpoints(&["10.0.0.11", "10.0.0.12", "10.0.0.13"], 8080);
    assert_success(&env.post_lb(&body).await);
    let r = env.find("192.168.10.100", 80).await.unwrap();
    assert_eq!(ep_ips(&r), ["10.0.0.11", "10.0.0.12", "10.0.0.13"]);
    assert_handler_error(&env.post_lb(&body).await, 409, "lbrule-exists error");
    // Weight change is a change.
    body["endpoints"][0]["weight"] = json!(300); // stored as uint8: 44
    assert_success(&env.post_lb(&body).await);
    let r = env.find("192.168.10.100", 80).await.unwrap();
    assert_eq!(r["endpoints"][0]["weight"], 44);
}

#[tokio::test]
async fn fields_outside_change_set_alone_are_409_and_not_applied() {
    let env = start().await;
    let mut body = tcp_rule("192.168.10.100", 80, &["10.0.0.11"]);
    assert_success(&env.post_lb(&body).await);
    body["serviceArguments"]["name"] = json!("other:llb-inst0");
    body["serviceArguments"]["bgp"] = json!(true);
    body["serviceArguments"]["inactiveTimeOut"] = json!(100);
    assert_handler_error(&env.post_lb(&body).await, 409, "lbrule-exists error");
    let rules = env.sim.rules();
    assert_eq!(rules[0].name, "ns_svc80:llb-inst0");
    assert!(!rules[0].bgp);
    assert_eq!(rules[0].inactive_timeout, 240);
    // Together with a real change: applied, but name/bgp still never updated.
    body["serviceArguments"]["sel"] = json!(1);
    assert_success(&env.post_lb(&body).await);
    let rules = env.sim.rules();
    assert_eq!(rules[0].sel, 1);
    assert_eq!(rules[0].inactive_timeout, 100);
    assert_eq!(rules[0].name, "ns_svc80:llb-inst0");
    assert!(!rules[0].bgp);
}

#[tokio::test]
async fn security_egress_fullproxy_changes_conflict() {
    let env = start().await;
    let mut body = tcp_rule("192.168.10.100", 80, &["10.0.0.11"]);
    assert_success(&env.post_lb(&body).await);
    body["endpoints"] = endpoints(&["10.0.0.12"], 8080);
    body["serviceArguments"]["security"] = json!(1);
    assert_handler_error(
        &env.post_lb(&body).await,
        409,
        "lbrule-exist error: cant modify rule security mode",
    );
    body["serviceArguments"]["security"] = json!(0);
    body["serviceArguments"]["egress"] = json!(true);
    assert_handler_error(
        &env.post_lb(&body).await,
        409,
        "lbrule-exist error: cant modify rule egress mode",
    );
    body["serviceArguments"]["egress"] = json!(false);
    body["serviceArguments"]["mode"] = json!(4);
    assert_handler_error(
        &env.post_lb(&body).await,
        409,
        "lbrule-exist error: cant modify fullproxy rule mode",
    );
    // Nothing was applied.
    assert_eq!(env.sim.rules()[0].endpoints[0].ip, "10.0.0.11");
}

#[tokio::test]
async fn attach_and_detach() {
    let env = start().await;
    let mut body = tcp_rule("192.168.10.100", 80, &["10.0.0.11"]);
    body["serviceArguments"]["oper"] = json!(2);
    assert_handler_error(&env.post_lb(&body).await, 404, "lbrule not-exists error");
    // Attach creates a missing rule.
    body["serviceArguments"]["oper"] = json!(1);
    assert_success(&env.post_lb(&body).await);
    body["endpoints"] = endpoints(&["10.0.0.12"], 8080);
    assert_success(&env.post_lb(&body).await);
    let r = env.find("192.168.10.100", 80).await.unwrap();
    assert_eq!(ep_ips(&r), ["10.0.0.11", "10.0.0.12"]);
    // Detach one; detaching an absent one is an unchanged re-POST.
    body["serviceArguments"]["oper"] = json!(2);
    body["endpoints"] = endpoints(&["10.0.0.11"], 8080);
    assert_success(&env.post_lb(&body).await);
    assert_handler_error(&env.post_lb(&body).await, 409, "lbrule-exists error");
    // Detaching the last endpoint deletes the rule.
    body["endpoints"] = endpoints(&["10.0.0.12"], 8080);
    assert_success(&env.post_lb(&body).await);
    assert!(env.list().await.is_empty());
}

#[tokio::test]
async fn delete_by_tuple_then_no_rule() {
    let env = start().await;
    assert_success(
        &env.post_lb(&tcp_rule("192.168.10.100", 80, &["10.0.0.11"]))
            .await,
    );
    let path = "/config/loadbalancer/externalipaddress/192.168.10.100/port/80/protocol/tcp?bgp=false&block=0";
    assert_success(&env.delete(path).await);
    let again = env.delete(path).await;
    assert_handler_error(&again, 404, "no-rule error");
    assert_eq!(again.1["message"], "Resource not found");
}

#[tokio::test]
async fn delete_routes_rebuild_identity() {
    let env = start().await;
    // Port range rule with a block number.
    let mut range = tcp_rule("192.168.10.100", 8000, &["10.0.0.11"]);
    range["serviceArguments"]["portMax"] = json!(8010);
    range["serviceArguments"]["block"] = json!(7);
    assert_success(&env.post_lb(&range).await);
    let base = "/config/loadbalancer/externalipaddress/192.168.10.100/port/8000";
    // Single-port route and wrong block do not match.
    assert_handler_error(
        &env.delete(&format!("{base}/protocol/tcp?block=7")).await,
        404,
        "no-rule error",
    );
    assert_handler_error(
        &env.delete(&format!("{base}/portmax/8010/protocol/tcp"))
            .await,
        404,
        "no-rule error",
    );
    assert_success(
        &env.delete(&format!(
            "{base}/portmax/8010/protocol/tcp?block=7&bgp=true"
        ))
        .await,
    );

    // Host rule; `any` means the empty host.
    let mut host = tcp_rule("192.168.10.100", 443, &["10.0.0.11"]);
    host["serviceArguments"]["host"] = json!("example.com");
    assert_success(&env.post_lb(&host).await);
    assert_success(
        &env.post_lb(&tcp_rule("192.168.10.100", 443, &["10.0.0.12"]))
            .await,
    );
    assert_eq!(env.sim.rules().len(), 2, "host is part of the identity");
    let hpath = "/config/loadbalancer/hosturl/example.com/externalipaddress/192.168.10.100/port/443/protocol/tcp";
    assert_success(&env.delete(hpath).await);
    let apath = "/config/loadbalancer/hosturl/any/externalipaddress/192.168.10.100/port/443/portmax/443/protocol/tcp";
    assert_success(&env.delete(apath).await);
    assert!(env.sim.rules().is_empty());

    // Argument errors.
    assert_handler_error(
        &env.delete("/config/loadbalancer/externalipaddress/1.1.1.1/port/80/protocol/TCP")
            .await,
        400,
        "malformed-proto error",
    );
    assert_handler_error(
        &env.delete(
            "/config/loadbalancer/externalipaddress/1.1.1.1/port/80/portmax/70/protocol/tcp",
        )
        .await,
        400,
        "serv-port-args range error",
    );
    assert_framework_error(
        &env.delete("/config/loadbalancer/externalipaddress/1.1.1.1/port/abc/protocol/tcp")
            .await,
        422,
        601,
    );
    assert_framework_error(
        &env.delete("/config/loadbalancer/externalipaddress/1.1.1.1/port/80/protocol/tcp?block=x")
            .await,
        422,
        601,
    );
}

#[tokio::test]
async fn delete_by_name_and_all() {
    let env = start().await;
    let mut a = tcp_rule("192.168.10.1", 80, &["10.0.0.1"]);
    a["serviceArguments"]["name"] = json!("core_amf:llb-inst0");
    let mut b = tcp_rule("192.168.10.1", 81, &["10.0.0.1"]);
    b["serviceArguments"]["name"] = json!("core_amf:llb-inst0");
    let c = tcp_rule("192.168.10.1", 82, &["10.0.0.1"]);
    for body in [&a, &b, &c] {
        assert_success(&env.post_lb(body).await);
    }
    assert_success(
        &env.delete("/config/loadbalancer/name/core_amf:llb-inst0")
            .await,
    );
    let left = env.sim.rules();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].port, 82);
    // Unknown name: still 200.
    assert_success(&env.delete("/config/loadbalancer/name/nothing").await);
    assert_success(&env.delete("/config/loadbalancer/all").await);
    assert!(env.list().await.is_empty());
    assert_success(&env.delete("/config/loadbalancer/all").await);
}

#[tokio::test]
async fn rule_limit_with_small_max_and_lifo_indexes() {
    let env = start_with(SimConfig {
        max_rules: 3,
        ..SimConfig::default()
    })
    .await;
    for port in 1..=3 {
        assert_success(
            &env.post_lb(&tcp_rule("192.168.10.1", port, &["10.0.0.1"]))
                .await,
        );
    }
    let full = env
        .post_lb(&tcp_rule("192.168.10.1", 4, &["10.0.0.1"]))
        .await;
    assert_handler_error(&full, 403, "rule-hwm error");
    assert_eq!(full.1["message"], "Capacity insufficient");
    // Free indexes 1 then 3: the next rule reuses 3 (LIFO), then 1.
    assert_success(
        &env.delete("/config/loadbalancer/externalipaddress/192.168.10.1/port/1/protocol/tcp")
            .await,
    );
    assert_success(
        &env.delete("/config/loadbalancer/externalipaddress/192.168.10.1/port/3/protocol/tcp")
            .await,
    );
    assert_success(
        &env.post_lb(&tcp_rule("192.168.10.1", 5, &["10.0.0.1"]))
            .await,
    );
    assert_success(
        &env.post_lb(&tcp_rule("192.168.10.1", 6, &["10.0.0.1"]))
            .await,
    );
    let idx: Vec<(u16, u32)> = env.sim.rules().iter().map(|r| (r.port, r.index)).collect();
    assert_eq!(idx, [(6, 1), (2, 2), (5, 3)]);
}

#[tokio::test]
async fn default_limit_is_2048_rules() {
    assert_eq!(SimConfig::default().max_rules, 2048);
    let env = start().await;
    for i in 0..2048u32 {
        let vip = format!("10.{}.{}.1", i / 256, i % 256);
        let r = env.post_lb(&tcp_rule(&vip, 80, &["172.16.0.1"])).await;
        assert_eq!(r.0, 200, "rule {i}: {r:?}");
    }
    let r = env
        .post_lb(&tcp_rule("10.200.0.1", 80, &["172.16.0.1"]))
        .await;
    assert_handler_error(&r, 403, "rule-hwm error");
    assert_eq!(env.list().await.len(), 2048);
}

#[tokio::test]
async fn allowed_sources_only_on_low_indexes() {
    let env = start().await;
    let mut first = tcp_rule("192.168.10.1", 1, &["10.0.0.1"]);
    first["allowedSources"] = json!([{"prefix": "10.1.2.3/16"}]);
    assert_success(&env.post_lb(&first).await);
    let r = env.find("192.168.10.1", 1).await.unwrap();
    assert_eq!(r["allowedSources"], json!([{"prefix": "10.1.0.0/16"}]));
    // Quirk: an identical re-POST with allowedSources is seen as changed.
    assert_success(&env.post_lb(&first).await);
    // Bad CIDR.
    let mut bad = tcp_rule("192.168.10.1", 2, &["10.0.0.1"]);
    bad["allowedSources"] = json!([{"prefix": "10.0.0.1"}]);
    assert_handler_error(&env.post_lb(&bad).await, 400, "rule-allowed-src error");
    // Fill indexes 2..=28, then index 29 cannot carry allowedSources.
    for port in 2..=28 {
        assert_success(
            &env.post_lb(&tcp_rule("192.168.10.1", port, &["10.0.0.1"]))
                .await,
        );
    }
    let mut high = tcp_rule("192.168.10.1", 29, &["10.0.0.1"]);
    high["allowedSources"] = json!([{"prefix": "10.0.0.0/8"}]);
    assert_handler_error(&env.post_lb(&high).await, 400, "rule-allowed-src error");
    // The failed create did not consume the index: without sources it gets 29.
    high["allowedSources"] = Value::Null;
    assert_success(&env.post_lb(&high).await);
    let rules = env.sim.rules();
    assert_eq!(rules.last().map(|r| (r.port, r.index)), Some((29, 29)));
    // Adding sources to index 29 later fails as well.
    high["allowedSources"] = json!([{"prefix": "10.0.0.0/8"}]);
    assert_handler_error(&env.post_lb(&high).await, 400, "rule-allowed-src error");
}

#[tokio::test]
async fn dsr_quirk_and_dsr_rules() {
    let env = start().await;
    let mut body = tcp_rule("192.168.10.1", 80, &["10.0.0.1"]);
    body["serviceArguments"]["mode"] = json!(3);
    let r = env.post_lb(&body).await;
    assert_eq!(r.0, 200);
    assert_eq!(
        r.1,
        json!({"result": "Error: Only Hash Selection criteria allowed for DSR mode"})
    );
    assert!(env.sim.rules().is_empty(), "nothing created");
    body["serviceArguments"]["sel"] = json!(1);
    assert_handler_error(
        &env.post_lb(&body).await,
        400,
        "malformed-lbep dsr-port error",
    );
    body["endpoints"] = endpoints(&["10.0.0.1"], 80);
    assert_success(&env.post_lb(&body).await);
}

#[tokio::test]
async fn secondary_ips_sctp_only_sorted_and_immutable() {
    let env = start().await;
    let sec = json!([{"secondaryIP": "192.168.30.200"}, {"secondaryIP": "192.168.20.200"}]);
    let mut tcp = tcp_rule("192.168.10.200", 80, &["10.0.1.21"]);
    tcp["secondaryIPs"] = sec.clone();
    assert_success(&env.post_lb(&tcp).await);
    let r = env.find("192.168.10.200", 80).await.unwrap();
    assert!(r["secondaryIPs"].is_null(), "dropped for tcp: {r}");

    let mut sctp = rule("192.168.10.200", 38412, "sctp", &["10.0.1.21", "10.0.1.22"]);
    sctp["secondaryIPs"] = sec;
    assert_success(&env.post_lb(&sctp).await);
    let r = env.find("192.168.10.200", 38412).await.unwrap();
    assert_eq!(
        r["secondaryIPs"],
        json!([{"secondaryIP": "192.168.20.200"}, {"secondaryIP": "192.168.30.200"}])
    );
    // Same set in another order is not a modification.
    sctp["secondaryIPs"] =
        json!([{"secondaryIP": "192.168.20.200"}, {"secondaryIP": "192.168.30.200"}]);
    assert_handler_error(&env.post_lb(&sctp).await, 409, "lbrule-exists error");
    sctp["secondaryIPs"] = json!([{"secondaryIP": "192.168.40.200"}]);
    let r = env.post_lb(&sctp).await;
    assert_handler_error(&r, 500, "secIP modify error");
    assert_eq!(r.1["message"], "secIP modify error");

    let mut many = rule("192.168.10.201", 38412, "sctp", &["10.0.1.21"]);
    many["secondaryIPs"] = json!([{"secondaryIP": "1.1.1.1"}, {"secondaryIP": "1.1.1.2"},
        {"secondaryIP": "1.1.1.3"}, {"secondaryIP": "1.1.1.4"}]);
    assert_handler_error(&env.post_lb(&many).await, 400, "secondaryIP-args len error");
    many["secondaryIPs"] = json!([{"secondaryIP": "nope"}]);
    assert_handler_error(&env.post_lb(&many).await, 400, "malformed-secIP error");
}

#[tokio::test]
async fn endpoint_count_range() {
    let env = start().await;
    let mut body = tcp_rule("192.168.10.1", 80, &[]);
    assert_handler_error(&env.post_lb(&body).await, 400, "endpoints-range error");
    let ips: Vec<String> = (1..=33).map(|i| format!("10.0.0.{i}")).collect();
    let refs: Vec<&str> = ips.iter().map(String::as_str).collect();
    body["endpoints"] = endpoints(&refs, 8080);
    assert_handler_error(&env.post_lb(&body).await, 400, "endpoints-range error");
    body["endpoints"] = endpoints(&refs[..32], 8080);
    assert_success(&env.post_lb(&body).await);
}

#[tokio::test]
async fn core_argument_errors() {
    let env = start().await;
    let cases: Vec<(Value, u16, &str)> = vec![
        (
            tcp_rule("not-an-ip", 80, &["10.0.0.1"]),
            400,
            "malformed-service error",
        ),
        (
            tcp_rule("", 80, &["10.0.0.1"]),
            400,
            "malformed-service error",
        ),
        (
            tcp_rule("1.1.1.1", 80, &["bad"]),
            400,
            "malformed-lbep error",
        ),
        (
            tcp_rule("1.1.1.1", 80, &["2001:db8::1"]),
            400,
            "malformed-lbep nat46 error",
        ),
        (
            rule("1.1.1.1", 80, "", &["10.0.0.1"]),
            400,
            "malformed-proto error",
        ),
        (
            rule("1.1.1.1", 80, "icmp", &["10.0.0.1"]),
            400,
            "malformed-service icmp-port error",
        ),
    ];
    for (body, status, result) in cases {
        assert_handler_error(&env.post_lb(&body).await, status, result);
    }
    let mut b = tcp_rule("1.1.1.1", 80, &["10.0.0.1"]);
    b["serviceArguments"]["portMax"] = json!(70);
    assert_handler_error(&env.post_lb(&b).await, 400, "serv-port-args range error");
    let mut b = tcp_rule("1.1.1.1", 80, &["10.0.0.1"]);
    b["serviceArguments"]["probetype"] = json!("http");
    b["serviceArguments"]["probeport"] = json!(80);
    assert_handler_error(&env.post_lb(&b).await, 400, "malformed-service-ptype error");
    b["serviceArguments"]["probetype"] = json!("tcp");
    b["serviceArguments"]["probeport"] = json!(0);
    assert_handler_error(&env.post_lb(&b).await, 400, "malformed-service-pport error");
    b["serviceArguments"]["probetype"] = json!("ping");
    b["serviceArguments"]["probeport"] = json!(80);
    assert_handler_error(&env.post_lb(&b).await, 400, "malformed-service-pport error");
    let mut b = rule("1.1.1.1", 80, "udp", &["10.0.0.1"]);
    b["serviceArguments"]["proxyprotocolv2"] = json!(true);
    assert_handler_error(
        &env.post_lb(&b).await,
        500,
        "proxy-proto-v2 not tcp service error",
    );
    let mut b = tcp_rule("1.1.1.1", 80, &["10.0.0.1"]);
    b["serviceArguments"]["sel"] = json!(6);
    assert_handler_error(&env.post_lb(&b).await, 400, "non-udp-n3-args error");
    let mut b = tcp_rule("1.1.1.1", 80, &["10.0.0.1"]);
    b["serviceArguments"]["mode"] = json!(5);
    assert_handler_error(&env.post_lb(&b).await, 400, "hostarm-args error");
    assert!(env.sim.rules().is_empty());
    // IPv6 VIP with IPv4 endpoints is allowed; canonical form in GET.
    assert_success(
        &env.post_lb(&tcp_rule("2001:DB8:0:0::10", 80, &["10.0.0.1"]))
            .await,
    );
    assert!(env.find("2001:db8::10", 80).await.is_some());
}

/// `privateIP` (`--privateCIDR`): parsed, stored at creation, never updated (a change alone
/// is 409 and not applied) and never listed (docs/loxilb-api.md#rule-fields).
#[tokio::test]
async fn private_ip_is_set_at_creation_only_and_never_listed() {
    let env = start().await;
    let mut body = tcp_rule("192.168.10.100", 80, &["10.0.0.11"]);
    body["serviceArguments"]["privateIP"] = json!("10.10.0.1");
    assert_success(&env.post_lb(&body).await);
    let stored = |env: &Env| env.sim.rules()[0].private_ip.clone();
    assert_eq!(stored(&env).as_deref(), Some("10.10.0.1"));
    let listed = env.find("192.168.10.100", 80).await.unwrap();
    assert!(listed["serviceArguments"].get("privateIP").is_none());
    body["serviceArguments"]["privateIP"] = json!("10.10.0.2");
    assert_handler_error(&env.post_lb(&body).await, 409, "lbrule-exists error");
    assert_eq!(stored(&env).as_deref(), Some("10.10.0.1"));
    // With an endpoint change the endpoints are updated, the private address is not.
    body["endpoints"] = endpoints(&["10.0.0.12"], 8080);
    assert_success(&env.post_lb(&body).await);
    assert_eq!(stored(&env).as_deref(), Some("10.10.0.1"));
    let mut bad = tcp_rule("192.168.10.101", 80, &["10.0.0.11"]);
    bad["serviceArguments"]["privateIP"] = json!("10.10.0");
    assert_handler_error(
        &env.post_lb(&bad).await,
        400,
        "malformed-service privateIP error",
    );
    assert_eq!(env.sim.rules().len(), 1);
}
