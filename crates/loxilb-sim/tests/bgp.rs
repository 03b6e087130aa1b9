//! The BGP routes over real HTTP, as docs/loxilb-api.md#bgp describes them: off by default,
//! goBGP's global configuration, peers, defined sets, policies and their application, the
//! per-address advertisement reference count fed by the rule routes, and a restart losing it
//! all. The last tests check the routes against loxilb's published swagger.yml (skipped with
//! a message when the reference folder is absent).

#[path = "common/bgp_setup.rs"]
mod bgp_setup;
mod common;

use bgp_setup::*;
use common::*;
use loxilb_sim::{SimConfig, api_routes};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// On and off
// ---------------------------------------------------------------------------------------------

/// One valid call per BGP route (none needs earlier state to pass validation).
fn every_route() -> Vec<(reqwest::Method, &'static str, Option<Value>)> {
    use reqwest::Method;
    vec![
        (Method::POST, "/config/bgp/global", Some(global_body())),
        (
            Method::POST,
            "/config/bgp/neigh",
            Some(json!({"ipAddress": "192.168.10.1", "remoteAs": 65001})),
        ),
        (Method::GET, "/config/bgp/neigh/all", None),
        (
            Method::DELETE,
            "/config/bgp/neigh/192.168.10.1?remoteAs=65001",
            None,
        ),
        (
            Method::POST,
            "/config/bgp/policy/definedsets/prefix",
            Some(prefix_set("ps", "10.0.0.0/24", "24..32")),
        ),
        (
            Method::GET,
            "/config/bgp/policy/definedsets/prefix/all",
            None,
        ),
        (
            Method::DELETE,
            "/config/bgp/policy/definedsets/prefix/ps",
            None,
        ),
        (
            Method::POST,
            "/config/bgp/policy/definitions",
            Some(policy("p", "s", "ps")),
        ),
        (Method::GET, "/config/bgp/policy/definitions/all", None),
        (Method::DELETE, "/config/bgp/policy/definitions/p", None),
        (
            Method::POST,
            "/config/bgp/policy/apply",
            Some(apply_body(&[], "accept")),
        ),
        (
            Method::DELETE,
            "/config/bgp/policy/apply",
            Some(apply_body(&[], "accept")),
        ),
    ]
}

#[tokio::test]
async fn every_bgp_route_answers_403_while_bgp_is_off() {
    let env = start().await;
    assert!(!env.sim.bgp_enabled(), "off by default");
    let routes = every_route();
    assert_eq!(
        routes.len(),
        api_routes()
            .iter()
            .filter(|r| r.path.starts_with("/config/bgp"))
            .count(),
        "one call per served BGP route"
    );
    for (method, path, body) in &routes {
        let mut req = env.http.request(method.clone(), env.api(path));
        if let Some(body) = body {
            req = req.json(body);
        }
        let r = env.send(req).await;
        assert_handler_error(&r, 403, "loxilb BGP mode is disabled");
        assert_eq!(r.1["message"], "Capacity insufficient", "{method} {path}");
    }
    // Validation still comes first.
    let r = env
        .post("/config/bgp/neigh", &json!({"ipAddress": "192.168.10.1"}))
        .await;
    assert_framework_error(&r, 422, 602);
    assert!(env.sim.bgp().global.is_none());
}

/// A BGP-peer-only loxilb (docs/loxilb-api.md#bgp-peer-only-mode): BGP works, every rule,
/// endpoint and HA call answers 403 `running in bgp only mode`, `/version` answers.
#[tokio::test]
async fn a_bgp_only_loxilb_refuses_everything_but_bgp() {
    let env = start_with(SimConfig {
        bgp_only: true,
        ..SimConfig::default()
    })
    .await;
    assert!(env.sim.bgp_enabled(), "BGP-only implies BGP");
    assert_success(&env.post("/config/bgp/global", &global_body()).await);
    assert_success(
        &env.post(
            "/config/bgp/neigh",
            &json!({"ipAddress": "192.168.10.1", "remoteAs": 65001}),
        )
        .await,
    );
    assert_eq!(neighbors(&env).await.len(), 1);
    let (status, _) = env.get("/version").await;
    assert_eq!(status, 200);
    let rule = json!({"serviceArguments": {"externalIP": "192.0.2.1", "port": 80,
        "protocol": "tcp"}, "endpoints": [{"endpointIP": "10.0.0.1", "targetPort": 30080,
        "weight": 1}]});
    let refused = [
        env.post("/config/loadbalancer", &rule).await,
        env.get("/config/loadbalancer/all").await,
        env.get("/config/cistate/all").await,
        env.post(
            "/config/cistate",
            &json!({"instance": "llb-inst0", "state": "MASTER", "vip": "0.0.0.0"}),
        )
        .await,
        env.get("/config/endpoint/all").await,
    ];
    for r in &refused {
        assert_handler_error(r, 403, "running in bgp only mode");
    }
    assert!(env.sim.rules().is_empty());
}

#[tokio::test]
async fn the_admin_toggle_turns_bgp_on_and_off() {
    let env = start().await;
    let put = |on: bool| {
        env.http
            .put(env.admin("/bgp"))
            .json(&json!({"enabled": on}))
    };
    assert_eq!(env.send(put(true)).await.0, 200);
    assert!(env.sim.bgp_enabled());
    assert_success(&env.post("/config/bgp/global", &global_body()).await);
    let (status, v) = env.send(env.http.get(env.admin("/bgp"))).await;
    assert_eq!(status, 200);
    assert_eq!(v["enabled"], true);
    assert_eq!(v["global"]["routerId"], "192.168.10.5");
    assert_eq!(env.send(put(false)).await.0, 200);
    let r = env.get("/config/bgp/neigh/all").await;
    assert_handler_error(&r, 403, "loxilb BGP mode is disabled");
    // Off hides the state, it does not drop it.
    env.sim.set_bgp_enabled(true);
    assert_eq!(env.sim.bgp().global.unwrap().local_as, 64512);
    let (status, _) = env
        .send(env.http.put(env.admin("/bgp")).json(&json!({"on": 1})))
        .await;
    assert_eq!(status, 400, "a body without `enabled` is refused");
}

// ---------------------------------------------------------------------------------------------
// Global configuration
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn global_needs_an_ipv4_router_id_and_a_local_as() {
    let env = start_bgp().await;
    let r = env
        .post("/config/bgp/global", &json!({"routerId": "192.168.10.5"}))
        .await;
    assert_framework_error(&r, 422, 602);
    let r = env
        .post("/config/bgp/global", &json!({"localAs": 64512}))
        .await;
    assert_framework_error(&r, 422, 602);
    for bad in ["router-1", "2001:db8::5", "192.168.10.256"] {
        let r = env
            .post(
                "/config/bgp/global",
                &json!({"routerId": bad, "localAs": 64512}),
            )
            .await;
        assert_handler_error(&r, 400, &rpc(&format!("invalid router-id format: {bad}")));
    }
    assert!(env.sim.bgp().global.is_none());

    assert_success(&env.post("/config/bgp/global", &global_body()).await);
    let g = env.sim.bgp().global.expect("global stored");
    assert_eq!(
        (
            g.router_id.as_str(),
            g.local_as,
            g.set_next_hop_self,
            g.listen_port
        ),
        ("192.168.10.5", 64512, true, 179),
        "listenPort 0 means 179"
    );
    // A repeat changes nothing: identical, loxilb answers 500 `action 3 is already set`
    // (seen on loxilb 0.9.8); a different one is refused by goBGP.
    let r = env.post("/config/bgp/global", &global_body()).await;
    assert_handler_error(&r, 500, "action 3 is already set");
    let mut other = global_body();
    other["localAs"] = json!(64513);
    let r = env.post("/config/bgp/global", &other).await;
    assert_handler_error(&r, 500, &rpc("gobgp is already started"));
    assert_eq!(env.sim.bgp().global.unwrap().local_as, 64512);
}

#[tokio::test]
async fn global_creates_loxilbs_own_policies() {
    let env = with_global().await;
    let names: Vec<String> = env.sim.bgp().policies.into_iter().map(|p| p.name).collect();
    assert_eq!(
        names,
        ["set-llb-export-gpolicy", "set-next-hop-self-gpolicy"],
        "SetNextHopSelf adds the next-hop-self policy"
    );
    let a = &env.sim.bgp().assignments;
    assert_eq!(a.len(), 1);
    assert_eq!(
        (a[0].target.as_str(), a[0].direction.as_str()),
        ("global", "export")
    );
    assert_eq!(a[0].policies, ["set-next-hop-self-gpolicy"]);
    let (_, v) = env.get("/config/bgp/policy/definitions/all").await;
    let llb = v["bgpPolicyAttr"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "set-llb-export-gpolicy")
        .cloned()
        .expect("listed");
    assert_eq!(llb["statements"][0]["name"], "set-med-export-gstmt");
    assert_eq!(
        llb["statements"][0]["actions"]["bgpActions"]["setMed"],
        "50"
    );
    assert_eq!(
        llb["statements"][1]["actions"]["bgpActions"]["setLocalPerf"],
        10
    );
}

// ---------------------------------------------------------------------------------------------
// Neighbours
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn neighbors_need_the_global_configuration_first() {
    let env = start_bgp().await;
    assert!(neighbors(&env).await.is_empty(), "listing works without it");
    let r = env
        .post(
            "/config/bgp/neigh",
            &json!({"ipAddress": "192.168.10.1", "remoteAs": 65001}),
        )
        .await;
    assert_handler_error(&r, 500, &rpc("bgp server hasn't started yet"));
    let r = env
        .delete("/config/bgp/neigh/192.168.10.1?remoteAs=65001")
        .await;
    assert_handler_error(&r, 500, &rpc("bgp server hasn't started yet"));
}

#[tokio::test]
async fn neighbors_round_trip_ipv4_ipv6_and_four_byte_as() {
    let env = with_global().await;
    let r = env
        .post(
            "/config/bgp/neigh",
            &json!({"ipAddress": "192.168.10.1", "remoteAs": 65001, "remotePort": 0,
                "setMultiHop": true}),
        )
        .await;
    assert_success(&r);
    let r = env
        .post(
            "/config/bgp/neigh",
            &json!({"ipAddress": "2001:DB8::1", "remoteAs": 4_200_000_001_u32}),
        )
        .await;
    assert_success(&r);
    let mut listed = neighbors(&env).await;
    listed.sort_by_key(|n| n["ipAddress"].as_str().unwrap_or_default().to_string());
    assert_eq!(
        listed,
        vec![
            json!({"ipAddress": "192.168.10.1", "remoteAs": 65001, "state": "ACTIVE",
                "updowntime": "never"}),
            json!({"ipAddress": "2001:db8::1", "remoteAs": 4_200_000_001_u32, "state": "ACTIVE",
                "updowntime": "never"}),
        ]
    );
    let n = &env.sim.bgp().neighbors[0];
    assert_eq!(
        (n.remote_port, n.multihop),
        (179, true),
        "remotePort 0 means 179"
    );

    // A duplicate, in any spelling of the address.
    for ip in ["192.168.10.1", "2001:db8:0::1"] {
        let r = env
            .post(
                "/config/bgp/neigh",
                &json!({"ipAddress": ip, "remoteAs": 1}),
            )
            .await;
        let canonical = if ip.contains(':') { "2001:db8::1" } else { ip };
        assert_handler_error(
            &r,
            409,
            &rpc(&format!("can't overwrite the existing peer: {canonical}")),
        );
    }
    // remoteAs is an int32 on the DELETE route: a 4-byte AS above 2^31-1 is refused as such
    // and goes as its two's complement (loxilb converts it back; goBGP deletes by address).
    let r = env
        .delete("/config/bgp/neigh/2001:db8::1?remoteAs=4200000001")
        .await;
    assert_framework_error(&r, 422, 601);
    let as_i32 = 4_200_000_001_u32.cast_signed();
    let r = env
        .delete(&format!("/config/bgp/neigh/2001:db8::1?remoteAs={as_i32}"))
        .await;
    assert_success(&r);
    let r = env
        .delete("/config/bgp/neigh/192.168.10.1?remoteAs=65001")
        .await;
    assert_success(&r);
    assert!(neighbors(&env).await.is_empty());
    let r = env
        .delete("/config/bgp/neigh/192.168.10.1?remoteAs=65001")
        .await;
    assert_handler_error(
        &r,
        500,
        &rpc("can't delete a peer configuration for 192.168.10.1"),
    );
}

#[tokio::test]
async fn neighbor_delete_without_remote_as_gets_no_answer() {
    let env = with_global().await;
    let body = json!({"ipAddress": "192.168.10.1", "remoteAs": 65001});
    assert_success(&env.post("/config/bgp/neigh", &body).await);
    for query in ["", "?remoteAs=", "?remote_as=65001"] {
        // A fresh client: the failure must be this request's, not a pooled connection's.
        let http = client();
        let url = env.api(&format!("/config/bgp/neigh/192.168.10.1{query}"));
        let err = http
            .delete(url)
            .send()
            .await
            .expect_err("the connection closes without an answer");
        assert!(!err.is_timeout() && !err.is_connect(), "{query}: {err:?}");
    }
    assert_eq!(neighbors(&env).await.len(), 1, "nothing was deleted");
    // The crash happens before loxilb looks at the BGP mode.
    env.sim.set_bgp_enabled(false);
    let err = client()
        .delete(env.api("/config/bgp/neigh/192.168.10.1"))
        .send()
        .await;
    assert!(err.is_err(), "{err:?}");
}

#[tokio::test]
async fn peer_session_state_is_a_knob() {
    let env = with_global().await;
    let body = json!({"ipAddress": "192.168.10.1", "remoteAs": 65001});
    assert_success(&env.post("/config/bgp/neigh", &body).await);
    let (status, _) = env
        .send(env.http.put(env.admin("/bgp/peer-state")).json(&json!({
            "ip": "192.168.10.1", "state": "ESTABLISHED", "updowntime": "1d 02:03:04"
        })))
        .await;
    assert_eq!(status, 200);
    let n = &neighbors(&env).await[0];
    assert_eq!(
        (&n["state"], &n["updowntime"]),
        (&json!("ESTABLISHED"), &json!("1d 02:03:04"))
    );
    assert!(env.sim.set_bgp_peer_state("192.168.10.1", "IDLE", None));
    let n = &neighbors(&env).await[0];
    assert_eq!(n["state"], "IDLE");
    let t = n["updowntime"].as_str().unwrap();
    assert!(t.starts_with("00:00:0"), "counts from the change: {t}");
    assert!(!env.sim.set_bgp_peer_state("192.168.10.9", "IDLE", None));
    let (status, _) = env
        .send(
            env.http
                .put(env.admin("/bgp/peer-state"))
                .json(&json!({"ip": "192.168.10.9", "state": "IDLE"})),
        )
        .await;
    assert_eq!(status, 404);
}

// ---------------------------------------------------------------------------------------------
// Defined sets
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn defined_sets_round_trip() {
    let env = start_bgp().await;
    let path = "/config/bgp/policy/definedsets";
    assert_success(
        &env.post(
            &format!("{path}/prefix"),
            &prefix_set("ps1", "10.1.2.3/24", "24..32"),
        )
        .await,
    );
    // A second POST of the same name adds to the set.
    assert_success(
        &env.post(
            &format!("{path}/prefix"),
            &prefix_set("ps1", "10.9.0.0/16", "16..24"),
        )
        .await,
    );
    let (status, v) = env.get(&format!("{path}/prefix/all")).await;
    assert_eq!(status, 200);
    assert_eq!(
        v,
        json!({"definedsetsAttr": [{"name": "ps1", "list": null, "prefixList": [
            {"ipPrefix": "10.1.2.0/24", "masklengthRange": "24..32"},
            {"ipPrefix": "10.9.0.0/16", "masklengthRange": "16..24"},
        ]}]})
    );
    // `List` (capital, the spec's spelling) for the other types; keys match case-insensitively.
    assert_success(
        &env.post(
            &format!("{path}/neighbor"),
            &json!({"name": "peers", "List": ["192.168.10.1/32"]}),
        )
        .await,
    );
    assert_success(
        &env.post(
            &format!("{path}/community"),
            &json!({"name": "c1", "list": ["65000:100"]}),
        )
        .await,
    );
    let (_, v) = env.get(&format!("{path}/neighbor/peers")).await;
    assert_eq!(
        v,
        json!({"definedsetsAttr": [{"name": "peers", "list": ["192.168.10.1/32"],
            "prefixList": null}]})
    );
    let (_, v) = env.get(&format!("{path}/community/other")).await;
    assert_eq!(
        v,
        json!({"definedsetsAttr": []}),
        "an unknown name lists nothing"
    );
    let r = env.get(&format!("{path}/bogus/all")).await;
    assert_handler_error(&r, 500, "Unsupported type");

    assert_success(&env.delete(&format!("{path}/neighbor/peers")).await);
    let r = env.delete(&format!("{path}/neighbor/peers")).await;
    assert_handler_error(&r, 404, &rpc("not found defined-set: peers"));
    assert_eq!(env.sim.bgp().defined_sets.len(), 2);
}

#[tokio::test]
async fn defined_set_inputs_are_checked() {
    let env = start_bgp().await;
    let path = "/config/bgp/policy/definedsets/prefix";
    for bad in ["24", "24-32", "", "1..2..3"] {
        let r = env.post(path, &prefix_set("ps", "10.0.0.0/24", bad)).await;
        assert_handler_error(&r, 400, "Mask format is wrong");
    }
    let r = env
        .post(path, &prefix_set("ps", "10.0.0.0", "24..32"))
        .await;
    assert_handler_error(&r, 400, &rpc("invalid prefix: 10.0.0.0"));
    let r = env
        .post(path, &json!({"prefixList": [{"ipPrefix": "10.0.0.0/24"}]}))
        .await;
    assert_framework_error(&r, 422, 602);
    let r = env.post(path, &json!({"name": 7})).await;
    assert_framework_error(&r, 400, 400);
    assert!(env.sim.bgp().defined_sets.is_empty());
}

// ---------------------------------------------------------------------------------------------
// Policies
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_statement_without_conditions_or_actions_gets_no_answer() {
    let env = start_bgp().await;
    for statement in [
        json!({"name": "s", "actions": {}}),
        json!({"name": "s", "conditions": {}}),
        Value::Null,
    ] {
        let body = json!({"name": "p", "statements": [statement]});
        let err = client()
            .post(env.api("/config/bgp/policy/definitions"))
            .json(&body)
            .send()
            .await;
        assert!(err.is_err(), "{body}: {err:?}");
    }
    // Both present, even empty: accepted.
    let body = json!({"name": "p", "statements": [{"name": "s", "conditions": {}, "actions": {}}]});
    assert_success(&env.post("/config/bgp/policy/definitions", &body).await);
    assert_eq!(env.sim.bgp().policies[0].statements, ["s"]);
}

#[tokio::test]
async fn policies_round_trip_and_refer_to_defined_sets() {
    let env = start_bgp().await;
    let defs = "/config/bgp/policy/definitions";
    let r = env.post(defs, &policy("p1", "s1", "ps1")).await;
    assert_handler_error(&r, 404, &rpc("not found prefix set ps1"));
    assert_success(
        &env.post(
            "/config/bgp/policy/definedsets/prefix",
            &prefix_set("ps1", "10.0.0.0/24", "24..32"),
        )
        .await,
    );
    assert_success(&env.post(defs, &policy("p1", "s1", "ps1")).await);
    // Statement names are unique across policies.
    let r = env.post(defs, &policy("p2", "s1", "ps1")).await;
    assert_handler_error(&r, 500, &rpc("statement s1 already defined"));
    let (status, v) = env.get(&format!("{defs}/all")).await;
    assert_eq!(status, 200);
    let listed = &v["bgpPolicyAttr"];
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(listed[0]["name"], "p1");
    let s = &listed[0]["statements"][0];
    assert_eq!(s["name"], "s1");
    assert_eq!(
        s["conditions"]["matchPrefixSet"],
        json!({"prefixSet": "ps1", "matchSetOption": "any"})
    );
    assert_eq!(s["actions"]["routeDisposition"], "accept-route");
    assert_eq!(s["actions"]["bgpActions"]["setLocalPerf"], 200);
    // A set a policy uses cannot go.
    let r = env
        .delete("/config/bgp/policy/definedsets/prefix/ps1")
        .await;
    assert_handler_error(&r, 500, &rpc("can't delete. defined-set ps1 is in use"));

    assert_success(&env.delete(&format!("{defs}/p1")).await);
    let r = env.delete(&format!("{defs}/p1")).await;
    assert_handler_error(&r, 404, &rpc("not found policy: p1"));
    // Its statements went with it.
    assert_success(&env.post(defs, &policy("p2", "s1", "ps1")).await);
}

#[tokio::test]
async fn policies_apply_to_the_global_rib_only() {
    let env = with_global().await;
    let apply = "/config/bgp/policy/apply";
    assert_success(
        &env.post(
            "/config/bgp/policy/definedsets/prefix",
            &prefix_set("ps1", "10.0.0.0/24", "24..32"),
        )
        .await,
    );
    assert_success(
        &env.post("/config/bgp/policy/definitions", &policy("p1", "s1", "ps1"))
            .await,
    );
    assert_success(
        &env.post(
            "/config/bgp/neigh",
            &json!({"ipAddress": "192.168.10.1", "remoteAs": 65001}),
        )
        .await,
    );
    let mut body = apply_body(&["p1"], "accept");
    body["ipAddress"] = json!("192.168.10.1");
    let r = env.post(apply, &body).await;
    assert_handler_error(
        &r,
        500,
        &rpc("non-rs-client peer 192.168.10.1 doesn't have per peer policy"),
    );
    body["ipAddress"] = json!("192.168.10.2");
    let r = env.post(apply, &body).await;
    assert_handler_error(&r, 404, &rpc("not found peer 192.168.10.2"));
    let r = env.post(apply, &apply_body(&["nope"], "accept")).await;
    assert_handler_error(&r, 404, &rpc("not found policy nope"));

    assert_success(&env.post(apply, &apply_body(&["p1"], "reject")).await);
    let export = |env: &Env| {
        env.sim
            .bgp()
            .assignments
            .into_iter()
            .find(|a| a.target == "global" && a.direction == "export")
            .expect("global export assignment")
    };
    let a = export(&env);
    assert_eq!(a.policies, ["set-next-hop-self-gpolicy", "p1"]);
    assert_eq!(a.default_action, "reject");
    let r = env.post(apply, &apply_body(&["p1"], "reject")).await;
    assert_handler_error(&r, 500, &rpc("duplicated policy p1"));
    // An applied (export) policy cannot be deleted.
    let r = env.delete("/config/bgp/policy/definitions/p1").await;
    assert_handler_error(&r, 500, &rpc("can't delete. policy p1 is in use"));

    // DELETE needs the body, `routeAction` included.
    let r = send_json(
        &env,
        reqwest::Method::DELETE,
        apply,
        &json!({"ipAddress": "global", "policyType": "export", "policies": ["p1"]}),
    )
    .await;
    assert_framework_error(&r, 422, 602);
    let r = env.delete(apply).await;
    assert_framework_error(&r, 422, 602);
    let r = send_json(
        &env,
        reqwest::Method::DELETE,
        apply,
        &apply_body(&["p1"], "accept"),
    )
    .await;
    assert_success(&r);
    assert_eq!(export(&env).policies, ["set-next-hop-self-gpolicy"]);
    // No policies named: all of them go, and the default action.
    let r = send_json(
        &env,
        reqwest::Method::DELETE,
        apply,
        &apply_body(&[], "accept"),
    )
    .await;
    assert_success(&r);
    assert!(env.sim.bgp().assignments.is_empty());
    let mut bad = apply_body(&[], "accept");
    bad["policyType"] = json!("EXPORT");
    assert_framework_error(&env.post(apply, &bad).await, 422, 606);
}

// ---------------------------------------------------------------------------------------------
// Advertisement reference counts
// ---------------------------------------------------------------------------------------------

fn bgp_rule(vip: &str, eps: &[&str]) -> Value {
    let mut body = tcp_rule(vip, 80, eps);
    body["serviceArguments"]["bgp"] = json!(true);
    body
}

#[tokio::test]
async fn every_200_with_bgp_adds_a_reference_and_every_bgp_delete_drops_one() {
    let env = start_bgp().await;
    let vip = "192.0.2.10";
    let tuple = format!("/config/loadbalancer/externalipaddress/{vip}/port/80/protocol/tcp");
    assert_success(&env.post_lb(&bgp_rule(vip, &["10.0.0.1"])).await);
    assert_eq!(env.sim.bgp_advertisement_count(vip), 1, "creation");
    // Unchanged: 409, nothing added.
    let r = env.post_lb(&bgp_rule(vip, &["10.0.0.1"])).await;
    assert_handler_error(&r, 409, "lbrule-exists error");
    assert_eq!(env.sim.bgp_advertisement_count(vip), 1);
    // An in-place update answered 200 with bgp: true adds one more.
    assert_success(&env.post_lb(&bgp_rule(vip, &["10.0.0.2"])).await);
    assert_eq!(env.sim.bgp_advertisement_count(vip), 2, "update");
    // The same update sent with bgp: false adds nothing (and bgp stays on the rule).
    assert_success(&env.post_lb(&tcp_rule(vip, 80, &["10.0.0.3"])).await);
    assert_eq!(env.sim.bgp_advertisement_count(vip), 2);
    assert_eq!(
        env.find(vip, 80).await.unwrap()["serviceArguments"]["bgp"],
        true
    );
    // A delete without ?bgp=true leaves the references alone.
    assert_success(&env.delete(&format!("{tuple}?bgp=false&block=0")).await);
    assert_eq!(env.sim.bgp_advertisement_count(vip), 2);
    // With it, one goes per call, even when no rule matched (404).
    let r = env.delete(&format!("{tuple}?bgp=true&block=0")).await;
    assert_handler_error(&r, 404, "no-rule error");
    assert_eq!(env.sim.bgp_advertisement_count(vip), 1);
    let r = env.delete(&format!("{tuple}?bgp=true&block=0")).await;
    assert_handler_error(&r, 404, "no-rule error");
    assert_eq!(env.sim.bgp_advertisement_count(vip), 0, "withdrawn at zero");
    assert!(env.sim.bgp_advertisements().is_empty());
}

#[tokio::test]
async fn secondary_addresses_and_deletes_by_name_count_too() {
    let env = start_bgp().await;
    let mut sctp = rule("192.0.2.20", 38412, "sctp", &["10.0.1.21"]);
    sctp["serviceArguments"]["bgp"] = json!(true);
    sctp["serviceArguments"]["name"] = json!("core_amf:llb-inst0");
    sctp["secondaryIPs"] = json!([{"secondaryIP": "192.0.2.21"}]);
    assert_success(&env.post_lb(&sctp).await);
    let mut web = bgp_rule("192.0.2.30", &["10.0.0.1"]);
    web["serviceArguments"]["name"] = json!("web:llb-inst0");
    assert_success(&env.post_lb(&web).await);
    assert_eq!(
        env.sim.bgp_advertisements().into_iter().collect::<Vec<_>>(),
        [
            ("192.0.2.20".to_string(), 1),
            ("192.0.2.21".to_string(), 1),
            ("192.0.2.30".to_string(), 1),
        ]
    );
    // A tuple delete withdraws the stored secondary addresses with the VIP.
    let r = env
        .delete(
            "/config/loadbalancer/externalipaddress/192.0.2.20/port/38412/protocol/sctp?bgp=true",
        )
        .await;
    assert_success(&r);
    // Delete by name uses the rule's own bgp.
    assert_success(&env.delete("/config/loadbalancer/name/web:llb-inst0").await);
    assert!(
        env.sim.bgp_advertisements().is_empty(),
        "{:?}",
        env.sim.bgp_advertisements()
    );
}

#[tokio::test]
async fn nothing_is_counted_while_bgp_is_off() {
    let env = start().await;
    assert_success(&env.post_lb(&bgp_rule("192.0.2.10", &["10.0.0.1"])).await);
    assert!(env.sim.bgp_advertisements().is_empty());
    env.sim.set_bgp_enabled(true);
    let r = env
        .delete("/config/loadbalancer/externalipaddress/192.0.2.10/port/80/protocol/tcp?bgp=true")
        .await;
    assert_success(&r);
    assert!(env.sim.bgp_advertisements().is_empty());
}

#[tokio::test]
async fn a_restart_loses_all_bgp_state() {
    let env = with_global().await;
    assert_success(
        &env.post(
            "/config/bgp/neigh",
            &json!({"ipAddress": "192.168.10.1", "remoteAs": 65001}),
        )
        .await,
    );
    assert_success(
        &env.post(
            "/config/bgp/policy/definedsets/prefix",
            &prefix_set("ps1", "10.0.0.0/24", "24..32"),
        )
        .await,
    );
    assert_success(
        &env.post("/config/bgp/policy/definitions", &policy("p1", "s1", "ps1"))
            .await,
    );
    assert_success(&env.post_lb(&bgp_rule("192.0.2.10", &["10.0.0.1"])).await);
    assert_eq!(env.sim.bgp_advertisement_count("192.0.2.10"), 1);

    let (status, _) = env.send(env.http.post(env.admin("/restart"))).await;
    assert_eq!(status, 200);
    let b = env.sim.bgp();
    assert!(b.enabled, "BGP mode is a start option: kept");
    assert!(b.global.is_none() && b.neighbors.is_empty() && b.defined_sets.is_empty());
    assert!(b.policies.is_empty() && b.assignments.is_empty() && b.advertisements.is_empty());
    assert!(neighbors(&env).await.is_empty());
    let r = env
        .post(
            "/config/bgp/neigh",
            &json!({"ipAddress": "192.168.10.1", "remoteAs": 65001}),
        )
        .await;
    assert_handler_error(&r, 500, &rpc("bgp server hasn't started yet"));
}
