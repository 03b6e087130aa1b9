//! The client's request body against loxilb's published `swagger.yml` (reference data, read
//! at test time): every key the client sends must be a property of the matching definition
//! (exact, case-sensitive spelling; loxilb itself matches case-insensitively, so a typo would
//! otherwise go unnoticed against both loxilb and the simulator), and every property the spec
//! marks `required` must be sent.
//!
//! Passes with a message when the reference folder is absent (e.g. in a user's clone; see
//! docs/testing.md#the-reference-folder).

use loxi_domain::{Endpoint, EndpointSelection, NatMode, Protocol, Rule, RuleKey};
use loxilb_client::convert::to_entry;
use loxilb_client::{
    AllowedSource, EndpointEntry, LoadbalanceEntry, SecondaryIp, ServiceArguments,
};
use serde_json::Value;

const SPEC: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/reference/loxilb-api/swagger.yml"
);

fn load_spec() -> Option<Value> {
    let Ok(text) = std::fs::read_to_string(SPEC) else {
        println!("skipping: ../shared/reference/loxilb-api not found");
        return None;
    };
    Some(serde_saphyr::from_str::<Value>(&text).expect("swagger.yml parses"))
}

/// Follows `$ref: '#/...'` pointers (JSON pointer into the spec) until a concrete schema.
fn resolve<'a>(spec: &'a Value, mut schema: &'a Value) -> &'a Value {
    for _ in 0..32 {
        let Some(r) = schema.get("$ref").and_then(Value::as_str) else {
            return schema;
        };
        let pointer = r
            .strip_prefix('#')
            .unwrap_or_else(|| panic!("only local $refs are supported: {r}"));
        schema = spec
            .pointer(pointer)
            .unwrap_or_else(|| panic!("dangling $ref {r}"));
    }
    panic!("$ref cycle");
}

/// The body schema of `POST /config/loadbalancer`, i.e. the `LoadbalanceEntry` definition.
fn lb_entry_schema(spec: &Value) -> &Value {
    let params = spec
        .pointer("/paths/~1config~1loadbalancer/post/parameters")
        .and_then(Value::as_array)
        .expect("POST /config/loadbalancer has parameters");
    let body = params
        .iter()
        .map(|p| resolve(spec, p))
        .find(|p| p.get("in").and_then(Value::as_str) == Some("body"))
        .expect("POST /config/loadbalancer takes a body");
    let schema = resolve(spec, &body["schema"]);
    assert_eq!(
        schema,
        resolve(spec, &spec["definitions"]["LoadbalanceEntry"]),
        "the POST body is the LoadbalanceEntry definition"
    );
    schema
}

fn str_list(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// Checks `value` against `schema` recursively; problems are collected with their JSON path.
fn check(spec: &Value, schema: &Value, value: &Value, path: &str, problems: &mut Vec<String>) {
    let schema = resolve(spec, schema);
    match value {
        Value::Object(obj) => {
            let Some(props) = schema.get("properties").and_then(Value::as_object) else {
                problems.push(format!("{path}: the spec has no properties for an object"));
                return;
            };
            for (key, v) in obj {
                match props.get(key) {
                    Some(sub) => check(spec, sub, v, &format!("{path}.{key}"), problems),
                    None => {
                        let near = props
                            .keys()
                            .find(|k| k.eq_ignore_ascii_case(key))
                            .map(|k| format!(" (spec spells it {k:?})"))
                            .unwrap_or_default();
                        problems.push(format!("{path}.{key}: not a property in the spec{near}"));
                    }
                }
            }
            for req in str_list(schema.get("required")) {
                if !obj.contains_key(req) {
                    problems.push(format!("{path}.{req}: required by the spec but not sent"));
                }
            }
        }
        Value::Array(items) => {
            let Some(item_schema) = schema.get("items") else {
                problems.push(format!("{path}: the spec has no items schema for an array"));
                return;
            };
            for (i, item) in items.iter().enumerate() {
                check(spec, item_schema, item, &format!("{path}[{i}]"), problems);
            }
        }
        _ => {}
    }
}

/// Every field of the request body set to a non-default value, so that fields skipped when
/// empty/false are serialized too.
fn fully_populated() -> LoadbalanceEntry {
    LoadbalanceEntry {
        service_arguments: ServiceArguments {
            external_ip: "192.0.2.1".into(),
            port: 80,
            port_max: 90,
            protocol: "tcp".into(),
            sel: 1,
            mode: 2,
            security: 1,
            bgp: true,
            monitor: true,
            probetype: "tcp".into(),
            probeport: 8080,
            probereq: "ping".into(),
            proberesp: "pong".into(),
            probe_timeout: 10,
            probe_retries: 3,
            inactive_timeout: 300,
            block: 7,
            managed: true,
            name: "ns_svc:llb-inst0".into(),
            host: "example.com".into(),
            private_ip: "10.1.1.1".into(),
            oper: 1,
            proxyprotocolv2: true,
            egress: true,
            snat: true,
        },
        endpoints: vec![EndpointEntry {
            endpoint_ip: "10.0.0.1".into(),
            target_port: 30080,
            weight: 1,
            state: "active".into(),
            counter: "0:0".into(),
        }],
        secondary_ips: vec![SecondaryIp {
            secondary_ip: "192.0.2.2".into(),
        }],
        allowed_sources: vec![AllowedSource {
            prefix: "0.0.0.0/0".into(),
        }],
    }
}

/// What loxi-ccm really sends: a rule from the domain model, with only defaults elsewhere.
fn minimal() -> LoadbalanceEntry {
    to_entry(&Rule {
        key: RuleKey {
            ip: "192.0.2.1".parse().unwrap(),
            port: 0,
            protocol: Protocol::Tcp,
        },
        name: String::new(),
        mode: NatMode::Default,
        selection: EndpointSelection::RoundRobin,
        endpoints: vec![Endpoint {
            ip: "10.0.0.1".parse().unwrap(),
            target_port: 0,
            weight: 0,
        }],
        monitor: false,
        managed: false,
        probe: Default::default(),
        inactive_timeout: 0,
        proxy_protocol_v2: false,
        allowed_sources: vec![],
        secondary_ips: vec![],
    })
}

fn assert_matches_spec(entry: &LoadbalanceEntry) {
    let Some(spec) = load_spec() else {
        return;
    };
    let schema = lb_entry_schema(&spec);
    let body = serde_json::to_value(entry).unwrap();
    let mut problems = Vec::new();
    check(&spec, schema, &body, "LoadbalanceEntry", &mut problems);
    assert!(
        problems.is_empty(),
        "request body does not match swagger.yml:\n  {}\nbody: {body:#}",
        problems.join("\n  ")
    );
}

#[test]
fn fully_populated_entry_uses_only_spec_keys_and_has_all_required() {
    let body = serde_json::to_value(fully_populated()).unwrap();
    // Make sure the walk really covers every nested object the client can send.
    for key in [
        "serviceArguments",
        "endpoints",
        "secondaryIPs",
        "allowedSources",
    ] {
        assert!(body.get(key).is_some(), "{key} serialized");
    }
    assert_matches_spec(&fully_populated());
}

#[test]
fn minimal_entry_still_has_all_required_fields() {
    // Zero values (port 0, weight 0, targetPort 0) must not be skipped when the spec requires
    // the field.
    assert_matches_spec(&minimal());
}

#[test]
fn checker_catches_misspelled_and_missing_keys() {
    // The checker itself must be able to fail, or the tests above prove nothing.
    let Some(spec) = load_spec() else {
        return;
    };
    let schema = lb_entry_schema(&spec);
    let mut body = serde_json::to_value(minimal()).unwrap();
    let sa = body["serviceArguments"].as_object_mut().unwrap();
    let ip = sa.remove("externalIP").unwrap();
    sa.insert("externalIp".into(), ip);
    body["endpoints"][0]
        .as_object_mut()
        .unwrap()
        .remove("weight");
    let mut problems = Vec::new();
    check(&spec, schema, &body, "LoadbalanceEntry", &mut problems);
    problems.sort();
    assert_eq!(
        problems,
        vec![
            "LoadbalanceEntry.endpoints[0].weight: required by the spec but not sent".to_string(),
            "LoadbalanceEntry.serviceArguments.externalIP: required by the spec but not sent"
                .to_string(),
            "LoadbalanceEntry.serviceArguments.externalIp: not a property in the spec (spec spells it \"externalIP\")"
                .to_string(),
        ]
    );
}
