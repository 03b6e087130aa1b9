//! Framework-level behaviour (go-openapi): decoding, schema validation,
//! routing, content type, auth; plus the small non-LB routes.

mod common;

use common::*;
use loxilb_sim::SimConfig;
use serde_json::{Value, json};

#[tokio::test]
async fn enum_violations_are_422_606() {
    let env = start().await;
    for (field, value) in [
        ("protocol", json!("TCP")),
        ("sel", json!(7)),
        ("mode", json!(9)),
        ("mode", json!(-1)),
        ("security", json!(3)),
        ("oper", json!(3)),
        ("probetype", json!("HTTP")),
    ] {
        let mut body = tcp_rule("192.168.10.1", 80, &["10.0.0.1"]);
        body["serviceArguments"][field] = value;
        assert_framework_error(&env.post_lb(&body).await, 422, 606);
    }
    assert!(env.sim.rules().is_empty());
}

#[tokio::test]
async fn missing_required_fields_are_422_602() {
    let env = start().await;
    let mut body = tcp_rule("192.168.10.1", 80, &["10.0.0.1"]);
    body["serviceArguments"]
        .as_object_mut()
        .unwrap()
        .remove("externalIP");
    assert_framework_error(&env.post_lb(&body).await, 422, 602);
    // The contract's own example: missing externalIP wins over `[]` endpoints.
    let example = json!({"serviceArguments": {"port": 80, "protocol": "tcp"}, "endpoints": []});
    assert_framework_error(&env.post_lb(&example).await, 422, 602);

    let mut body = tcp_rule("192.168.10.1", 80, &["10.0.0.1"]);
    body["serviceArguments"]["externalIP"] = Value::Null;
    assert_framework_error(&env.post_lb(&body).await, 422, 602);

    let mut body = tcp_rule("192.168.10.1", 80, &["10.0.0.1"]);
    body.as_object_mut().unwrap().remove("endpoints");
    assert_framework_error(&env.post_lb(&body).await, 422, 602);
    body["endpoints"] = Value::Null;
    assert_framework_error(&env.post_lb(&body).await, 422, 602);

    for field in ["endpointIP", "targetPort", "weight"] {
        let mut body = tcp_rule("192.168.10.1", 80, &["10.0.0.1"]);
        body["endpoints"][0].as_object_mut().unwrap().remove(field);
        assert_framework_error(&env.post_lb(&body).await, 422, 602);
    }
    let body = json!({"endpoints": endpoints(&["10.0.0.1"], 80)});
    assert_framework_error(&env.post_lb(&body).await, 422, 602);

    // No body at all.
    let r = env
        .send(
            env.http
                .post(env.api("/config/loadbalancer"))
                .header("Content-Type", "application/json"),
        )
        .await;
    assert_framework_error(&r, 422, 602);
}

#[tokio::test]
async fn decoding_errors_are_400() {
    let env = start().await;
    let bad_types = [
        ("port", json!("80")),
        ("port", json!(80.5)),
        ("bgp", json!("true")),
        ("probeport", json!(70000)),
        ("probeTimeout", json!(-1)),
        ("block", json!(-1)),
        ("name", json!(5)),
    ];
    for (field, value) in bad_types {
        let mut body = tcp_rule("192.168.10.1", 80, &["10.0.0.1"]);
        body["serviceArguments"][field] = value;
        assert_framework_error(&env.post_lb(&body).await, 400, 400);
    }
    // Type errors win over missing required fields (decode before validate).
    let body = json!({"serviceArguments": {"port": "x"}});
    assert_framework_error(&env.post_lb(&body).await, 400, 400);
    let body = json!({"serviceArguments": [], "endpoints": []});
    assert_framework_error(&env.post_lb(&body).await, 400, 400);
    let r = env
        .send(
            env.http
                .post(env.api("/config/loadbalancer"))
                .header("Content-Type", "application/json")
                .body("{not json"),
        )
        .await;
    assert_framework_error(&r, 400, 400);
}

#[tokio::test]
async fn keys_match_case_insensitively_and_unknown_keys_are_ignored() {
    let env = start().await;
    let body = json!({
        "ServiceArguments": {"ExternalIP": "192.168.10.1", "PORT": 80, "Protocol": "tcp",
            "BGP": true, "Monitor": true, "someFutureField": {"x": 1}},
        "Endpoints": [{"EndpointIP": "10.0.0.1", "targetport": 8080, "Weight": 1, "extra": 1}],
        "unknown": [1, 2, 3],
    });
    assert_success(&env.post_lb(&body).await);
    let rules = env.sim.rules();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].external_ip, "192.168.10.1");
    assert!(rules[0].bgp && rules[0].monitor);
    assert_eq!(rules[0].endpoints[0].target_port, 8080);
}

#[tokio::test]
async fn body_without_json_content_type_is_415() {
    let env = start().await;
    let body = tcp_rule("192.168.10.1", 80, &["10.0.0.1"]).to_string();
    let r = env
        .send(
            env.http
                .post(env.api("/config/loadbalancer"))
                .body(body.clone()),
        )
        .await;
    assert_framework_error(&r, 415, 415);
    let r = env
        .send(
            env.http
                .post(env.api("/config/loadbalancer"))
                .header("Content-Type", "text/plain")
                .body(body.clone()),
        )
        .await;
    assert_framework_error(&r, 415, 415);
    let r = env
        .send(
            env.http
                .post(env.api("/config/loadbalancer"))
                .header("Content-Type", "application/json; charset=utf-8")
                .body(body),
        )
        .await;
    assert_success(&r);
    // kube-loxilb sends a JSON body with DELETE; it is ignored.
    let r = env
        .send(
            env.http
                .delete(env.api("/config/loadbalancer/all"))
                .json(&json!({"ignored": true})),
        )
        .await;
    assert_success(&r);
}

#[tokio::test]
async fn unknown_path_404_and_wrong_method_405() {
    let env = start().await;
    for path in ["", "/", "/config/nothing", "/config/loadbalancer/all/"] {
        let r = env.get(path).await;
        assert_framework_error(&r, 404, 404);
    }
    let resp = env
        .http
        .put(env.api("/config/loadbalancer/all"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 405);
    assert_eq!(resp.headers()["allow"], "DELETE, GET");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["code"], 405);
    let r = env.get("/config/loadbalancer").await;
    assert_framework_error(&r, 405, 405);
    // Outside the API base too.
    let r = env
        .send(env.http.get(format!("{}/other", env.sim.url())))
        .await;
    assert_framework_error(&r, 404, 404);
}

#[tokio::test]
async fn auth_token() {
    let env = start_with(SimConfig {
        auth_token: Some("s3cr3t".into()),
        ..SimConfig::default()
    })
    .await;
    let (status, v) = env.get("/version").await;
    assert_eq!((status, &v["version"]), (200, &json!("0.9.8-sim")));
    let r = env.get("/config/loadbalancer/all").await;
    assert_framework_error(&r, 401, 401);
    let r = env
        .send(
            env.http
                .get(env.api("/config/loadbalancer/all"))
                .header("Authorization", "Bearer s3cr3t"),
        )
        .await;
    assert_eq!(r, (500, json!({"code": 500, "message": "invalid token"})));
    // Auth is checked before body validation.
    let r = env
        .send(
            env.http
                .post(env.api("/config/loadbalancer"))
                .json(&json!({})),
        )
        .await;
    assert_framework_error(&r, 401, 401);
    let r = env
        .send(
            env.http
                .post(env.api("/config/loadbalancer"))
                .header("Authorization", "s3cr3t")
                .json(&tcp_rule("192.168.10.1", 80, &["10.0.0.1"])),
        )
        .await;
    assert_success(&r);
    let r = env
        .send(
            env.http
                .get(env.api("/config/loadbalancer/all"))
                .header("Authorization", "s3cr3t"),
        )
        .await;
    assert_eq!(r.0, 200);
    assert_eq!(r.1["lbAttr"].as_array().map(Vec::len), Some(1));
}

#[tokio::test]
async fn version_and_empty_list() {
    let env = start().await;
    let (status, v) = env.get("/version").await;
    assert_eq!(status, 200);
    assert_eq!(v["version"], "0.9.8-sim");
    let (status, v) = env.get("/config/loadbalancer/all").await;
    assert_eq!((status, v), (200, json!({"lbAttr": []})));
}

#[tokio::test]
async fn cistate_roundtrip() {
    let env = start().await;
    let boot = json!({"Attr": [{"instance": "llb-inst0", "state": "NOT_DEFINED", "vip": "0.0.0.0", "sync": null}]});
    assert_eq!(env.get("/config/cistate/all").await, (200, boot));
    let set = json!({"instance": "llb-inst0", "state": "MASTER", "vip": "0.0.0.0"});
    assert_success(&env.post("/config/cistate", &set).await);
    let (_, v) = env.get("/config/cistate/all").await;
    assert_eq!(v["Attr"][0]["state"], "MASTER");
    // Same state: no-op, vip not updated.
    let same = json!({"instance": "llb-inst0", "state": "MASTER", "vip": "1.2.3.4"});
    assert_success(&env.post("/config/cistate", &same).await);
    let (_, v) = env.get("/config/cistate/all").await;
    assert_eq!(v["Attr"][0]["vip"], "0.0.0.0");
    // Invalid (case-sensitive) state.
    let bad = json!({"instance": "llb-inst1", "state": "master", "vip": "0.0.0.0"});
    assert_handler_error(
        &env.post("/config/cistate", &bad).await,
        400,
        "invalid cluster-state",
    );
    // ...but the unknown instance was created anyway.
    let (_, v) = env.get("/config/cistate/all").await;
    assert_eq!(v["Attr"].as_array().map(Vec::len), Some(2));
    // State change without a vip stores a nil VIP.
    let novip = json!({"instance": "llb-inst0", "state": "BACKUP"});
    assert_success(&env.post("/config/cistate", &novip).await);
    let (_, v) = env.get("/config/cistate/all").await;
    let inst0 = v["Attr"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["instance"] == "llb-inst0")
        .cloned()
        .unwrap();
    assert_eq!(inst0["vip"], "<nil>");
}

#[tokio::test]
async fn bgp_is_disabled() {
    let env = start().await;
    let r = env
        .post(
            "/config/bgp/neigh",
            &json!({"ipAddress": "192.168.10.1", "remoteAs": 65001}),
        )
        .await;
    assert_handler_error(&r, 403, "loxilb BGP mode is disabled");
    assert_eq!(r.1["message"], "Capacity insufficient");
    let r = env.get("/config/bgp/neigh/all").await;
    assert_handler_error(&r, 403, "loxilb BGP mode is disabled");
    let r = env
        .delete("/config/bgp/neigh/192.168.10.1?remoteAs=65001")
        .await;
    assert_handler_error(&r, 403, "loxilb BGP mode is disabled");
}
