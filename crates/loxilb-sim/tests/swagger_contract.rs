//! Contract test against loxilb's published swagger.yml (reference data,
//! read at test time, never copied). Enums, required fields and paths are
//! derived from the spec, not hard-coded, so a spec update is noticed.
//! Known SPEC≠CODE deviations (docs/loxilb-api.md#spec-deviations) are handled
//! explicitly.
//!
//! Skips (passes with a message) when the reference folder is absent, e.g.
//! in a user's clone.

mod common;

use std::path::PathBuf;

use common::*;
use loxilb_sim::{API_BASE, api_routes, unpublished_api_routes};
use serde_json::{Value, json};

fn spec_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/reference/loxilb-api/swagger.yml")
}

fn load_spec() -> Option<Value> {
    let path = spec_path();
    let Ok(text) = std::fs::read_to_string(&path) else {
        eprintln!(
            "skipping: reference folder not found ({} is not readable)",
            path.display()
        );
        return None;
    };
    let spec: Value = serde_saphyr::from_str(&text).expect("swagger.yml parses as YAML");
    Some(spec)
}

fn str_list(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn int_list(v: &Value) -> Vec<i64> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_i64).collect())
        .unwrap_or_default()
}

/// What the spec says about `LoadbalanceEntry`.
struct LbSpec {
    entry: Value,
    protocols: Vec<String>,
    sels: Vec<i64>,
    modes: Vec<i64>,
    probetypes: Vec<String>,
    top_required: Vec<String>,
    sa_required: Vec<String>,
    ep_required: Vec<String>,
}

impl LbSpec {
    fn from(spec: &Value) -> LbSpec {
        let entry = spec["definitions"]["LoadbalanceEntry"].clone();
        assert!(entry.is_object(), "LoadbalanceEntry definition present");
        let sa = &entry["properties"]["serviceArguments"];
        let props = &sa["properties"];
        let lb = LbSpec {
            protocols: str_list(&props["protocol"]["enum"]),
            sels: int_list(&props["sel"]["enum"]),
            modes: int_list(&props["mode"]["enum"]),
            probetypes: str_list(&props["probetype"]["enum"]),
            top_required: str_list(&entry["required"]),
            sa_required: str_list(&sa["required"]),
            ep_required: str_list(&entry["properties"]["endpoints"]["items"]["required"]),
            entry,
        };
        assert!(!lb.protocols.is_empty(), "protocol enum in spec");
        assert!(!lb.sels.is_empty(), "sel enum in spec");
        assert!(!lb.modes.is_empty(), "mode enum in spec");
        assert!(
            !lb.sa_required.is_empty(),
            "serviceArguments.required in spec"
        );
        lb
    }
}

/// A body loxilb accepts for the given enum combination. The constraints
/// come from docs/loxilb-api.md#rule-fields: icmp needs port/targetPort 0, sel 6 (N3)
/// needs udp, mode 3 (DSR) needs sel 1 and targetPort == port, mode 5
/// (host one-arm) needs the unspecified VIP.
fn valid_body(port: u16, protocol: &str, sel: i64, mode: i64) -> Value {
    let port = if protocol == "icmp" { 0 } else { port };
    let target_port = if protocol == "icmp" || mode == 3 {
        port
    } else {
        8080
    };
    // Distinct VIPs keep rule identities apart (icmp rules all have port 0).
    let vip = if mode == 5 {
        "0.0.0.0".to_string()
    } else {
        format!("192.168.{}.{}", port / 250, port % 250 + 1)
    };
    json!({
        "serviceArguments": {"externalIP": vip, "port": port, "protocol": protocol,
            "sel": sel, "mode": mode, "name": "contract:llb-inst0"},
        "endpoints": [{"endpointIP": "10.0.0.1", "targetPort": target_port, "weight": 1}],
    })
}

#[tokio::test]
async fn every_spec_enum_value_is_accepted() {
    let Some(spec) = load_spec() else { return };
    let lb = LbSpec::from(&spec);
    let env = start().await;
    let mut port = 1000u16;
    let mut next = || {
        port += 1;
        port
    };
    for protocol in &lb.protocols {
        let r = env.post_lb(&valid_body(next(), protocol, 0, 0)).await;
        assert_success(&r);
    }
    for &sel in &lb.sels {
        let protocol = if sel == 6 { "udp" } else { "tcp" };
        let r = env.post_lb(&valid_body(next(), protocol, sel, 0)).await;
        assert_success(&r);
    }
    for &mode in &lb.modes {
        let sel = if mode == 3 { 1 } else { 0 };
        let r = env.post_lb(&valid_body(next(), "tcp", sel, mode)).await;
        assert_success(&r);
    }
    for probetype in &lb.probetypes {
        let mut body = valid_body(next(), "tcp", 0, 0);
        let probeport = if matches!(probetype.as_str(), "tcp" | "udp" | "sctp") {
            9000
        } else {
            0
        };
        body["serviceArguments"]["probetype"] = json!(probetype);
        body["serviceArguments"]["probeport"] = json!(probeport);
        let r = env.post_lb(&body).await;
        if matches!(probetype.as_str(), "http" | "https") {
            // SPEC≠CODE: schema-valid, rejected by loxilb's core.
            assert_handler_error(&r, 400, "malformed-service-ptype error");
        } else {
            assert_success(&r);
        }
    }
    // Everything the simulator returns is declared by the spec.
    let sa_props = lb.entry["properties"]["serviceArguments"]["properties"]
        .as_object()
        .expect("serviceArguments properties");
    let ep_props = lb.entry["properties"]["endpoints"]["items"]["properties"]
        .as_object()
        .expect("endpoint properties");
    let top_props = lb.entry["properties"].as_object().expect("properties");
    let rules = env.list().await;
    assert!(!rules.is_empty());
    for r in &rules {
        for k in r.as_object().unwrap().keys() {
            assert!(top_props.contains_key(k), "undeclared top-level key {k}");
        }
        for k in r["serviceArguments"].as_object().unwrap().keys() {
            assert!(
                sa_props.contains_key(k),
                "undeclared serviceArguments key {k}"
            );
        }
        for ep in r["endpoints"].as_array().unwrap() {
            for k in ep.as_object().unwrap().keys() {
                assert!(ep_props.contains_key(k), "undeclared endpoint key {k}");
            }
        }
    }
}

#[tokio::test]
async fn values_outside_spec_enums_are_422_606() {
    let Some(spec) = load_spec() else { return };
    let lb = LbSpec::from(&spec);
    let env = start().await;
    let mut bad: Vec<(&str, Value)> = Vec::new();
    for p in &lb.protocols {
        let upper = p.to_uppercase();
        if !lb.protocols.contains(&upper) {
            bad.push(("protocol", json!(upper)));
        }
    }
    bad.push(("protocol", json!("bogus")));
    for (field, values) in [("sel", &lb.sels), ("mode", &lb.modes)] {
        let max = values.iter().max().copied().unwrap_or(0);
        let min = values.iter().min().copied().unwrap_or(0);
        bad.push((field, json!(max + 1)));
        bad.push((field, json!(min - 1)));
    }
    for p in &lb.probetypes {
        let upper = p.to_uppercase();
        if !lb.probetypes.contains(&upper) {
            bad.push(("probetype", json!(upper)));
        }
    }
    for (field, value) in bad {
        let mut body = valid_body(80, "tcp", 0, 0);
        body["serviceArguments"][field] = value.clone();
        let r = env.post_lb(&body).await;
        assert_eq!(
            (r.0, &r.1["code"]),
            (422, &json!(606)),
            "{field}={value}: {r:?}"
        );
    }
    assert!(env.sim.rules().is_empty());
}

#[tokio::test]
async fn bodies_missing_spec_required_fields_are_rejected() {
    let Some(spec) = load_spec() else { return };
    let lb = LbSpec::from(&spec);
    let env = start().await;
    let mut cases: Vec<(String, Value)> = Vec::new();
    for f in &lb.top_required {
        let mut body = valid_body(80, "tcp", 0, 0);
        body.as_object_mut().unwrap().remove(f);
        cases.push((f.clone(), body));
    }
    for f in &lb.sa_required {
        let mut body = valid_body(80, "tcp", 0, 0);
        body["serviceArguments"].as_object_mut().unwrap().remove(f);
        cases.push((format!("serviceArguments.{f}"), body));
    }
    for f in &lb.ep_required {
        let mut body = valid_body(80, "tcp", 0, 0);
        body["endpoints"][0].as_object_mut().unwrap().remove(f);
        cases.push((format!("endpoints.{f}"), body));
    }
    assert!(cases.len() >= 3);
    for (what, body) in cases {
        let r = env.post_lb(&body).await;
        assert!(
            r.0 == 422 || r.0 == 400,
            "missing {what} must be rejected, got {r:?}"
        );
        // Schema-required fields are reported by the framework (602).
        assert_eq!(
            (r.0, &r.1["code"]),
            (422, &json!(602)),
            "missing {what}: {r:?}"
        );
    }
    assert!(env.sim.rules().is_empty());
}

#[test]
fn served_paths_exist_in_spec() {
    let Some(spec) = load_spec() else { return };
    assert_eq!(spec["basePath"], API_BASE);
    let paths = spec["paths"].as_object().expect("paths object");
    let routes = api_routes();
    assert!(!routes.is_empty());
    for r in routes {
        let item = paths
            .get(r.path)
            .unwrap_or_else(|| panic!("{} not in spec paths", r.path));
        let method = r.method.to_lowercase();
        assert!(
            item.get(&method).is_some(),
            "{} {} not declared in spec",
            r.method,
            r.path
        );
    }
}

/// The routes served beyond the spec (kube-loxilb's `/config/k8smeta`) are really absent
/// from it: once loxilb publishes one, it moves to the spec's table and its body is checked
/// against the spec like the others.
#[test]
fn unpublished_paths_are_not_in_spec() {
    let Some(spec) = load_spec() else { return };
    let paths = spec["paths"].as_object().expect("paths object");
    let routes = unpublished_api_routes();
    assert!(!routes.is_empty());
    for r in routes {
        let declared = paths
            .get(r.path)
            .and_then(|item| item.get(r.method.to_lowercase()));
        assert!(
            declared.is_none(),
            "{} {} is in the spec now: check its body against it",
            r.method,
            r.path
        );
    }
}

/// A value of the spec's type for a firewall field (strings that parse where loxilb parses).
fn fw_value(field: &str, ty: &str) -> Value {
    match (field, ty) {
        ("sourceIP", _) => json!("198.51.100.0/24"),
        ("destinationIP", _) => json!("192.0.2.10/32"),
        ("toIP", _) => json!("192.0.2.99"),
        ("portName" | "redirectPortName" | "counter", _) => json!(""),
        (_, "integer") => json!(0),
        (_, "boolean") => json!(false),
        (_, "string") => json!(""),
        (f, t) => panic!("firewall field {f} of type {t} not expected"),
    }
}

/// Every property of `FirewallRuleEntry` and `FirewallOptionEntry` is decoded with its spec
/// type, the spec's required objects are enforced (422 602), the DELETE takes exactly the
/// spec's query parameters, and the listing carries the spec's `fwAttr`.
#[tokio::test]
async fn firewall_entry_follows_the_spec() {
    let Some(spec) = load_spec() else { return };
    let defs = &spec["definitions"];
    let entry = &defs["FirewallEntry"];
    let required = str_list(&entry["required"]);
    assert!(
        required.contains(&"ruleArguments".to_string()) && required.contains(&"opts".to_string())
    );
    let mut args = serde_json::Map::new();
    for (k, v) in defs["FirewallRuleEntry"]["properties"].as_object().unwrap() {
        args.insert(k.clone(), fw_value(k, v["type"].as_str().unwrap()));
    }
    let mut opts = serde_json::Map::new();
    for (k, v) in defs["FirewallOptionEntry"]["properties"]
        .as_object()
        .unwrap()
    {
        opts.insert(k.clone(), fw_value(k, v["type"].as_str().unwrap()));
    }
    args.insert("preference".into(), json!(100));
    args.insert("protocol".into(), json!(6));
    args.insert("minDestinationPort".into(), json!(443));
    args.insert("maxDestinationPort".into(), json!(443));
    opts.insert("allow".into(), json!(true));
    let env = start().await;
    let body = json!({"ruleArguments": args, "opts": opts});
    assert_success(&env.post("/config/firewall", &body).await);
    // Every field with a wrong JSON type is a decoding error (400).
    for (k, v) in body["ruleArguments"].as_object().unwrap() {
        let mut bad = body.clone();
        bad["ruleArguments"][k] = if v.is_string() { json!(1) } else { json!("x") };
        assert_eq!(env.post("/config/firewall", &bad).await.0, 400, "{k}");
    }
    for f in &required {
        let mut bad = body.clone();
        bad.as_object_mut().unwrap().remove(f);
        assert_framework_error(&env.post("/config/firewall", &bad).await, 422, 602);
    }
    // The listing: `fwAttr` of FirewallEntry.
    let list_schema = &spec["paths"]["/config/firewall/all"]["get"]["responses"]["200"]["schema"];
    assert!(list_schema["properties"]["fwAttr"].is_object());
    let (status, list) = env.get("/config/firewall/all").await;
    assert_eq!(status, 200);
    let attrs = list["fwAttr"].as_array().unwrap();
    assert_eq!(attrs.len(), 1);
    let rule_props = defs["FirewallRuleEntry"]["properties"].as_object().unwrap();
    let opt_props = defs["FirewallOptionEntry"]["properties"]
        .as_object()
        .unwrap();
    for k in attrs[0]["ruleArguments"].as_object().unwrap().keys() {
        assert!(rule_props.contains_key(k), "listed {k} not in the spec");
    }
    for k in attrs[0]["opts"].as_object().unwrap().keys() {
        assert!(opt_props.contains_key(k), "listed {k} not in the spec");
    }
    // DELETE by the spec's query parameters.
    let params = spec["paths"]["/config/firewall"]["delete"]["parameters"]
        .as_array()
        .unwrap();
    let mut query: Vec<(String, String)> = Vec::new();
    for p in params {
        assert_eq!(p["in"], "query");
        let name = p["name"].as_str().unwrap().to_string();
        let value = match name.as_str() {
            "sourceIP" => "198.51.100.0/24".to_string(),
            "destinationIP" => "192.0.2.10/32".to_string(),
            "minDestinationPort" | "maxDestinationPort" => "443".to_string(),
            "protocol" => "6".to_string(),
            "preference" => "100".to_string(),
            "portName" => String::new(),
            _ => "0".to_string(),
        };
        query.push((name, value));
    }
    let not_a_number = env
        .send(
            env.http
                .delete(env.api("/config/firewall"))
                .query(&[("protocol", "tcp")]),
        )
        .await;
    assert_framework_error(&not_a_number, 422, 601);
    let r = env
        .send(env.http.delete(env.api("/config/firewall")).query(&query))
        .await;
    assert_success(&r);
    assert!(env.sim.firewall_rules().is_empty());
}
