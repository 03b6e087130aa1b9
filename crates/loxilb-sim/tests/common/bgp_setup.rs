//! The helpers of the simulator's BGP tests (`bgp.rs`, `bgp_spec.rs`): a simulator with BGP
//! on, requests to its BGP routes, and the bodies they take. Included with `#[path]` by the
//! test files that use it only.

#![allow(dead_code)]

use crate::common::*;
use loxilb_sim::SimConfig;
use serde_json::{Value, json};

pub async fn start_bgp() -> Env {
    start_with(SimConfig {
        bgp: true,
        ..SimConfig::default()
    })
    .await
}

pub fn rpc(text: &str) -> String {
    format!("rpc error: code = Unknown desc = {text}")
}

pub fn global_body() -> Value {
    json!({"routerId": "192.168.10.5", "localAs": 64512, "SetNextHopSelf": true, "listenPort": 0})
}

pub async fn with_global() -> Env {
    let env = start_bgp().await;
    assert_success(&env.post("/config/bgp/global", &global_body()).await);
    env
}

pub async fn neighbors(env: &Env) -> Vec<Value> {
    let (status, v) = env.get("/config/bgp/neigh/all").await;
    assert_eq!(status, 200, "{v}");
    v["bgpNeiAttr"]
        .as_array()
        .cloned()
        .expect("bgpNeiAttr array")
}

pub async fn send_json(env: &Env, method: reqwest::Method, path: &str, body: &Value) -> Reply {
    env.send(env.http.request(method, env.api(path)).json(body))
        .await
}

pub fn apply_body(policies: &[&str], route_action: &str) -> Value {
    json!({"ipAddress": "global", "policyType": "export", "policies": policies,
        "routeAction": route_action})
}

pub fn prefix_set(name: &str, prefix: &str, range: &str) -> Value {
    json!({"name": name, "prefixList": [{"ipPrefix": prefix, "masklengthRange": range}]})
}

pub fn policy(name: &str, statement: &str, prefix_set: &str) -> Value {
    json!({"name": name, "statements": [{
        "name": statement,
        "conditions": {"matchPrefixSet": {"prefixSet": prefix_set, "matchSetOption": "any"}},
        "actions": {"routeDisposition": "accept-route", "bgpActions": {"setLocalPerf": 200}},
    }]})
}
