//! What a live loxilb (v0.9.8-dev, eBPF datapath) showed and the simulator now does
//! (docs/loxilb-api.md#observed-on-a-live-loxilb): the inverted source-list comparison, the
//! order of a new rule's endpoints, the endpoint probe objects and endpoint health states.
//! Each test pins one of these behaviours, so the simulator keeps answering as loxilb does.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

fn sources(rule: &Value) -> Vec<String> {
    let mut v: Vec<String> = rule["allowedSources"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|p| p["prefix"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn with_sources(mut body: Value, prefixes: &[&str]) -> Value {
    body["allowedSources"] = Value::Array(prefixes.iter().map(|p| json!({"prefix": p})).collect());
    body
}

#[tokio::test]
async fn source_lists_are_compared_inverted() {
    let env = start().await;
    let one = with_sources(
        tcp_rule("192.168.20.1", 80, &["10.0.0.1"]),
        &["10.1.0.0/16"],
    );
    assert_success(&env.post_lb(&one).await);
    // The same single prefix again: seen as a change.
    assert_success(&env.post_lb(&one).await);
    // Another single prefix: 409 and not applied.
    let other = with_sources(
        tcp_rule("192.168.20.1", 80, &["10.0.0.1"]),
        &["10.2.0.0/16"],
    );
    assert_handler_error(&env.post_lb(&other).await, 409, "lbrule-exists error");
    let r = env.find("192.168.20.1", 80).await.unwrap();
    assert_eq!(sources(&r), ["10.1.0.0/16"]);
    // A change of length is applied.
    let two = with_sources(
        tcp_rule("192.168.20.1", 80, &["10.0.0.1"]),
        &["10.1.0.0/16", "10.3.0.0/16"],
    );
    assert_success(&env.post_lb(&two).await);
    let r = env.find("192.168.20.1", 80).await.unwrap();
    assert_eq!(sources(&r), ["10.1.0.0/16", "10.3.0.0/16"]);
    // The same two again: 409.
    assert_handler_error(&env.post_lb(&two).await, 409, "lbrule-exists error");
    // Two others: 409, not applied; not even together with an endpoint change, which is.
    let two_others = with_sources(
        tcp_rule("192.168.20.1", 80, &["10.0.0.1"]),
        &["10.4.0.0/16", "10.5.0.0/16"],
    );
    assert_handler_error(&env.post_lb(&two_others).await, 409, "lbrule-exists error");
    let moved = with_sources(
        tcp_rule("192.168.20.1", 80, &["10.0.0.2"]),
        &["10.4.0.0/16", "10.5.0.0/16"],
    );
    assert_success(&env.post_lb(&moved).await);
    let r = env.find("192.168.20.1", 80).await.unwrap();
    assert_eq!(ep_ips(&r), ["10.0.0.2"]);
    assert_eq!(sources(&r), ["10.1.0.0/16", "10.3.0.0/16"]);
}

#[tokio::test]
async fn a_new_rule_stores_endpoints_last_octet_first() {
    let env = start().await;
    let body = tcp_rule("192.168.20.2", 80, &["10.0.0.2", "10.0.1.1", "9.255.255.3"]);
    assert_success(&env.post_lb(&body).await);
    let r = env.find("192.168.20.2", 80).await.unwrap();
    assert_eq!(ep_ips(&r), ["10.0.1.1", "10.0.0.2", "9.255.255.3"]);
}

fn endpoint_objects(v: &Value) -> Vec<Value> {
    v["Attr"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn rules_create_endpoint_probe_objects_and_more_can_be_posted() {
    let env = start().await;
    let mut body = tcp_rule("192.168.20.3", 80, &["10.0.0.5"]);
    body["endpoints"][0]["targetPort"] = json!(30080);
    assert_success(&env.post_lb(&body).await);
    let (status, v) = env.get("/config/endpoint/all").await;
    assert_eq!(status, 200, "{v}");
    let objs = endpoint_objects(&v);
    assert_eq!(objs.len(), 1, "{v}");
    assert_eq!(objs[0]["name"], "10.0.0.5_tcp_30080");
    assert_eq!(objs[0]["hostName"], "10.0.0.5");
    assert_eq!(objs[0]["probeType"], "none", "monitor is off");
    assert_eq!(objs[0]["currState"], "ok");

    let post = |b: Value| {
        let env = &env;
        async move { env.post("/config/endpoint", &b).await }
    };
    assert_success(
        &post(
            json!({"hostName": "10.0.0.9", "probeType": "tcp", "probePort": 8080,
                     "probeDuration": 10, "inactiveReTries": 3}),
        )
        .await,
    );
    let (_, v) = env.get("/config/endpoint/all").await;
    let posted = endpoint_objects(&v)
        .into_iter()
        .find(|o| o["name"] == "10.0.0.9_tcp_8080")
        .expect("posted object listed");
    assert_eq!(posted["probeDuration"], 10);
    assert_eq!(posted["inactiveReTries"], 3);
    assert_eq!(posted["currState"], "ok");
    // loxilb's checks.
    assert_handler_error(
        &post(json!({"hostName": "10.0.0.0/24", "probeType": "ping"})).await,
        400,
        "host-parse error",
    );
    assert_eq!(
        post(json!({"hostName": "10.0.0.9", "probeType": "tcp"}))
            .await
            .0,
        400
    );
    assert_eq!(
        post(json!({"hostName": "10.0.0.9", "probeType": "ping", "inactiveReTries": 101}))
            .await
            .0,
        400
    );
    assert_eq!(post(json!({"probeType": "ping"})).await.0, 422);
    // Deletion: a posted one goes, one a rule uses cannot, an unknown one is 404.
    assert_success(
        &env.delete("/config/endpoint/epipaddress/10.0.0.9?probe_type=tcp&probe_port=8080")
            .await,
    );
    let (status, _) = env
        .delete("/config/endpoint/epipaddress/10.0.0.5?probe_type=tcp&probe_port=30080")
        .await;
    assert_eq!(status, 409);
    let (status, _) = env
        .delete("/config/endpoint/epipaddress/10.0.0.7?name=nothing")
        .await;
    assert_eq!(status, 404);
}

async fn set_reachable(env: &Env, ip: &str, reachable: bool) {
    let resp = env
        .http
        .post(env.admin("/endpoint-health"))
        .json(&json!({"ip": ip, "reachable": reachable}))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success());
}

fn state_of(rule: &Value, ip: &str) -> String {
    rule["endpoints"]
        .as_array()
        .and_then(|a| a.iter().find(|e| e["endpointIP"] == ip))
        .and_then(|e| e["state"].as_str())
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn monitored_endpoints_turn_inactive_once_their_probes_give_up() {
    let env = start().await;
    let mut monitored = tcp_rule("192.168.20.4", 80, &["10.0.0.1", "10.0.0.2"]);
    monitored["serviceArguments"]["monitor"] = json!(true);
    monitored["serviceArguments"]["probeTimeout"] = json!(1);
    monitored["serviceArguments"]["probeRetries"] = json!(1);
    assert_success(&env.post_lb(&monitored).await);
    let unmonitored = tcp_rule("192.168.20.4", 81, &["10.0.0.1"]);
    assert_success(&env.post_lb(&unmonitored).await);

    set_reachable(&env, "10.0.0.1", false).await;
    let marked = Instant::now();
    loop {
        let r = env.find("192.168.20.4", 80).await.unwrap();
        if state_of(&r, "10.0.0.1") == "inactive" {
            assert_eq!(state_of(&r, "10.0.0.2"), "active");
            break;
        }
        assert_eq!(state_of(&r, "10.0.0.1"), "active");
        assert!(marked.elapsed() < Duration::from_secs(30), "never inactive");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        marked.elapsed() >= Duration::from_secs(1),
        "inactive before its probe timeout x retries"
    );
    let r = env.find("192.168.20.4", 81).await.unwrap();
    assert_eq!(
        state_of(&r, "10.0.0.1"),
        "active",
        "monitor off: never probed"
    );
    let (_, v) = env.get("/config/endpoint/all").await;
    let obj = endpoint_objects(&v)
        .into_iter()
        .find(|o| o["name"] == "10.0.0.1_tcp_8080")
        .expect("probe object");
    assert_eq!(obj["currState"], "nok", "{obj}");

    set_reachable(&env, "10.0.0.1", true).await;
    let r = env.find("192.168.20.4", 80).await.unwrap();
    assert_eq!(state_of(&r, "10.0.0.1"), "active");
}
