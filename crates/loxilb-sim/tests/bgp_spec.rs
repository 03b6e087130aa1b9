//! The simulator's BGP routes against loxilb's published API (swagger.yml): every route is
//! in the spec, bodies missing required fields are refused as loxilb refuses them, enums and
//! listing keys are the spec's, and goBGP answers only after its start delay. (Split from
//! `bgp.rs`, which keeps the routes' behaviour.)

#[path = "common/bgp_setup.rs"]
mod bgp_setup;
mod common;

use std::path::PathBuf;

use bgp_setup::*;
use common::*;
use loxilb_sim::{API_BASE, SimConfig, api_routes};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// Against swagger.yml
// ---------------------------------------------------------------------------------------------

fn load_spec() -> Option<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/reference/loxilb-api/swagger.yml");
    let Ok(text) = std::fs::read_to_string(&path) else {
        eprintln!(
            "skipping: reference folder not found ({} is not readable)",
            path.display()
        );
        return None;
    };
    Some(serde_saphyr::from_str(&text).expect("swagger.yml parses as YAML"))
}

fn resolve<'a>(spec: &'a Value, mut schema: &'a Value) -> &'a Value {
    while let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        schema = spec
            .pointer(r.strip_prefix('#').expect("local $ref"))
            .unwrap_or_else(|| panic!("dangling $ref {r}"));
    }
    schema
}

fn operation<'a>(spec: &'a Value, method: &str, path: &str) -> &'a Value {
    let op = &spec["paths"][path][method.to_lowercase()];
    assert!(op.is_object(), "{method} {path} in the spec");
    op
}

fn body_schema<'a>(spec: &'a Value, method: &str, path: &str) -> &'a Value {
    let params = operation(spec, method, path)["parameters"]
        .as_array()
        .expect("parameters");
    let body = params
        .iter()
        .find(|p| p["in"] == "body")
        .unwrap_or_else(|| panic!("{method} {path} takes a body"));
    resolve(spec, &body["schema"])
}

/// Every key of `value` is a property of `schema`, recursively.
fn undeclared(spec: &Value, schema: &Value, value: &Value, path: &str, out: &mut Vec<String>) {
    let schema = resolve(spec, schema);
    match value {
        Value::Object(obj) => {
            let props = schema["properties"].as_object();
            for (k, v) in obj {
                match props.and_then(|p| p.get(k)) {
                    Some(sub) => undeclared(spec, sub, v, &format!("{path}.{k}"), out),
                    None => out.push(format!("{path}.{k}")),
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                undeclared(spec, &schema["items"], item, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

#[test]
fn every_bgp_route_is_in_the_spec_and_delete_neigh_takes_an_int32_remote_as() {
    let Some(spec) = load_spec() else { return };
    assert_eq!(spec["basePath"], API_BASE);
    let bgp: Vec<_> = api_routes()
        .into_iter()
        .filter(|r| r.path.starts_with("/config/bgp"))
        .collect();
    assert_eq!(bgp.len(), 12);
    for r in &bgp {
        operation(&spec, r.method, r.path);
    }
    // Every BGP operation of the spec is served.
    let paths = spec["paths"].as_object().unwrap();
    for (path, item) in paths.iter().filter(|(p, _)| p.starts_with("/config/bgp")) {
        for method in item.as_object().unwrap().keys() {
            assert!(
                bgp.iter()
                    .any(|r| r.path == path && r.method.eq_ignore_ascii_case(method)),
                "{method} {path} not served"
            );
        }
    }
    let params = operation(&spec, "DELETE", "/config/bgp/neigh/{ip_address}")["parameters"]
        .as_array()
        .unwrap();
    let remote_as = params
        .iter()
        .find(|p| p["in"] == "query")
        .expect("a query parameter");
    assert_eq!(remote_as["name"], "remoteAs");
    assert_eq!(
        remote_as["format"], "int32",
        "why the simulator refuses > 2^31-1"
    );
}

#[tokio::test]
async fn bodies_missing_spec_required_fields_are_422_602() {
    let Some(spec) = load_spec() else { return };
    let env = with_global().await;
    let cases: Vec<(reqwest::Method, &str, Value)> = vec![
        (
            reqwest::Method::POST,
            "/config/bgp/global",
            json!({"routerId": "192.168.10.5", "localAs": 64512}),
        ),
        (
            reqwest::Method::POST,
            "/config/bgp/neigh",
            json!({"ipAddress": "192.168.10.1", "remoteAs": 65001}),
        ),
        (
            reqwest::Method::POST,
            "/config/bgp/policy/definedsets/{defineset_type}",
            json!({"name": "ps1"}),
        ),
        (
            reqwest::Method::POST,
            "/config/bgp/policy/apply",
            apply_body(&[], "accept"),
        ),
        (
            reqwest::Method::DELETE,
            "/config/bgp/policy/apply",
            apply_body(&[], "accept"),
        ),
    ];
    let mut checked = 0;
    for (method, spec_path, body) in cases {
        let schema = body_schema(&spec, method.as_str(), spec_path);
        let required: Vec<&str> = schema["required"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        assert!(!required.is_empty(), "{spec_path} has required fields");
        let path = spec_path.replace("{defineset_type}", "prefix");
        for field in required {
            let mut b = body.clone();
            assert!(
                b.as_object_mut().unwrap().remove(field).is_some(),
                "{field} sent"
            );
            let r = send_json(&env, method.clone(), &path, &b).await;
            assert_framework_error(&r, 422, 602);
            checked += 1;
        }
    }
    assert!(checked >= 9, "{checked}");
}

#[tokio::test]
async fn apply_enums_come_from_the_spec() {
    let Some(spec) = load_spec() else { return };
    let env = with_global().await;
    let schema = body_schema(&spec, "POST", "/config/bgp/policy/apply");
    for field in ["policyType", "routeAction"] {
        let values: Vec<&str> = schema["properties"][field]["enum"]
            .as_array()
            .unwrap_or_else(|| panic!("{field} enum"))
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(values.len(), 2, "{field}");
        for v in values {
            let mut body = apply_body(&[], "accept");
            body[field] = json!(v);
            assert_success(&env.post("/config/bgp/policy/apply", &body).await);
            body[field] = json!(v.to_uppercase());
            let r = env.post("/config/bgp/policy/apply", &body).await;
            assert_framework_error(&r, 422, 606);
        }
    }
}

#[tokio::test]
async fn listings_use_only_keys_the_spec_declares() {
    let Some(spec) = load_spec() else { return };
    let env = with_global().await;
    assert_success(
        &env.post(
            "/config/bgp/neigh",
            &json!({"ipAddress": "192.168.10.1", "remoteAs": 65001}),
        )
        .await,
    );
    for (kind, body) in [
        ("prefix", prefix_set("ps1", "10.0.0.0/24", "24..32")),
        (
            "neighbor",
            json!({"name": "ns1", "List": ["192.168.10.1/32"]}),
        ),
        ("community", json!({"name": "cs1", "List": ["65000:1"]})),
    ] {
        let path = format!("/config/bgp/policy/definedsets/{kind}");
        assert_success(&env.post(&path, &body).await);
    }
    // A statement using every condition and action the spec lists.
    let full = json!({"name": "full", "statements": [{
        "name": "full-1",
        "conditions": {
            "matchPrefixSet": {"prefixSet": "ps1", "matchSetOption": "invert"},
            "matchNeighborSet": {"neighborSet": "ns1", "matchSetOption": "all"},
            "bgpConditions": {
                "afiSafiIn": ["ipv4-unicast"],
                "asPathLength": {"operator": "ge", "value": 2},
                "matchCommunitySet": {"communitySet": "cs1", "matchSetOptions": "any"},
                "nextHopInList": ["10.0.0.1"],
                "rpki": "valid",
                "routeType": "external",
            },
        },
        "actions": {
            "routeDisposition": "reject-route",
            "bgpActions": {
                "setMed": "20", "setNextHop": "10.0.0.254", "setLocalPerf": 300,
                "setCommunity": {"options": "add", "setCommunityMethod": ["65000:2"]},
                "setExtCommunity": {"options": "remove", "setCommunityMethod": ["rt:65000:3"]},
                "setLargeCommunity": {"options": "replace", "setCommunityMethod": ["65000:4:5"]},
                "setAsPathPrepend": {"as": "65000", "repeatN": 2},
            },
        },
    }]});
    assert_success(&env.post("/config/bgp/policy/definitions", &full).await);

    let listings = [
        (
            "/config/bgp/neigh/all",
            "bgpNeiAttr",
            "/config/bgp/neigh/all",
        ),
        (
            "/config/bgp/policy/definedsets/prefix/all",
            "definedsetsAttr",
            "/config/bgp/policy/definedsets/{defineset_type}/{type_name}",
        ),
        (
            "/config/bgp/policy/definedsets/neighbor/all",
            "definedsetsAttr",
            "/config/bgp/policy/definedsets/{defineset_type}/{type_name}",
        ),
        (
            "/config/bgp/policy/definitions/all",
            "bgpPolicyAttr",
            "/config/bgp/policy/definitions/all",
        ),
    ];
    for (path, key, spec_path) in listings {
        let (status, v) = env.get(path).await;
        assert_eq!(status, 200, "{path}");
        let schema = &operation(&spec, "GET", spec_path)["responses"]["200"]["schema"];
        let items = v[key].as_array().unwrap_or_else(|| panic!("{path}: {v}"));
        assert!(!items.is_empty(), "{path}");
        let mut out = Vec::new();
        undeclared(&spec, schema, &v, key, &mut out);
        assert!(out.is_empty(), "{path}: undeclared keys {out:?} in {v}");
    }
    // The statement reads back with what goBGP keeps.
    let (_, v) = env.get("/config/bgp/policy/definitions/all").await;
    let full = v["bgpPolicyAttr"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "full")
        .unwrap()
        .clone();
    let s = &full["statements"][0];
    assert_eq!(
        s["conditions"]["matchPrefixSet"]["matchSetOption"],
        "invert"
    );
    assert_eq!(
        s["conditions"]["bgpConditions"]["asPathLength"],
        json!({"operator": "ge", "value": 2})
    );
    assert_eq!(
        s["conditions"]["bgpConditions"]["matchLargeCommunitySet"],
        json!({"communitySet": "cs1", "matchSetOptions": "any"}),
        "loxilb lists the community match in all three community slots"
    );
    assert_eq!(s["actions"]["bgpActions"]["setMed"], "20");
    assert_eq!(
        s["actions"]["bgpActions"]["setAsPathPrepend"],
        json!({"as": "65000", "repeatN": 2})
    );
}

/// goBGP answers some seconds after loxilb starts (about 9 s on loxilb 0.9.8): until then
/// every BGP call that reaches it answers 500 `... connect: connection refused` and changes
/// nothing; a restart starts the delay again; the rule routes are not held up.
#[tokio::test]
async fn gobgp_answers_only_after_its_start_delay() {
    let env = start_with(SimConfig {
        bgp: true,
        gobgp_delay: std::time::Duration::from_millis(600),
        ..SimConfig::default()
    })
    .await;
    let refused = |r: &Reply| {
        assert_eq!(r.0, 500, "{}", r.1);
        let text = r.1["result"].as_str().unwrap_or_default().to_string();
        assert!(text.contains("connect: connection refused"), "{text}");
    };
    refused(&env.post("/config/bgp/global", &global_body()).await);
    refused(&env.get("/config/bgp/neigh/all").await);
    assert!(env.sim.bgp().global.is_none(), "nothing stored");
    // Rules work meanwhile.
    assert_success(&env.post_lb(&tcp_rule("10.0.0.1", 80, &["10.1.0.1"])).await);
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    assert_success(&env.post("/config/bgp/global", &global_body()).await);
    assert_eq!(neighbors(&env).await, Vec::<Value>::new());
    // A restart: goBGP is late again, and it lost its configuration.
    env.sim.restart();
    refused(&env.post("/config/bgp/global", &global_body()).await);
    env.sim.set_gobgp_delay(std::time::Duration::ZERO);
    assert_success(&env.post("/config/bgp/global", &global_body()).await);
}
