//! The client's request body against loxilb's published `swagger.yml` (reference data, read
//! at test time): every key the client sends must be a property of the matching definition
//! (exact, case-sensitive spelling; loxilb itself matches case-insensitively, so a typo would
//! otherwise go unnoticed against both loxilb and the simulator), and every property the spec
//! marks `required` must be sent. A value the spec restricts to an enum must be one of it.
//! This covers the rule body and every BGP body (docs/loxilb-api.md#bgp).
//!
//! Passes with a message when the reference folder is absent (e.g. in a user's clone; see
//! docs/testing.md#the-reference-folder).

use loxi_domain::{Endpoint, EndpointSelection, NatMode, Protocol, Rule, RuleKey};
use loxilb_client::bgp::{
    BgpActions, BgpAsPathLength, BgpAsPathPrepend, BgpConditions, BgpMatchAsPathSet,
    BgpMatchCommunitySet, BgpMatchConditions, BgpMatchNeighborSet, BgpMatchPrefixSet,
    BgpSetActions, BgpSetCommunity,
};
use loxilb_client::convert::to_entry;
use loxilb_client::{
    AllowedSource, BgpDefinedSet, BgpGlobal, BgpNeighbor, BgpPolicy, BgpPolicyApply, BgpPrefix,
    BgpStatement, EndpointEntry, LoadbalanceEntry, PolicyDirection, RouteAction, SecondaryIp,
    ServiceArguments,
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

/// The schema of the body `method path` takes.
fn body_schema<'a>(spec: &'a Value, method: &str, path: &str) -> &'a Value {
    let params = spec["paths"][path][method]["parameters"]
        .as_array()
        .unwrap_or_else(|| panic!("{method} {path} has parameters"));
    let body = params
        .iter()
        .map(|p| resolve(spec, p))
        .find(|p| p.get("in").and_then(Value::as_str) == Some("body"))
        .unwrap_or_else(|| panic!("{method} {path} takes a body"));
    resolve(spec, &body["schema"])
}

/// The body schema of `POST /config/loadbalancer`, i.e. the `LoadbalanceEntry` definition.
fn lb_entry_schema(spec: &Value) -> &Value {
    let schema = body_schema(spec, "post", "/config/loadbalancer");
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
        scalar => {
            if let Some(allowed) = schema.get("enum").and_then(Value::as_array) {
                let same = |a: &Value| match (a.as_f64(), scalar.as_f64()) {
                    (Some(x), Some(y)) => x == y,
                    _ => a == scalar,
                };
                if !allowed.iter().any(same) {
                    problems.push(format!("{path}: {scalar} is not in the spec's enum"));
                }
            }
        }
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
        egress: false,
        allowed_sources: vec![],
        secondary_ips: vec![],
        bgp: false,
        private_ip: None,
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

// ---------------------------------------------------------------------------------------------
// BGP bodies
// ---------------------------------------------------------------------------------------------

/// Checks a serialized BGP body against the body schema of `method path`.
fn assert_bgp_body_matches(method: &str, path: &str, body: &impl serde::Serialize) {
    let Some(spec) = load_spec() else {
        return;
    };
    let schema = body_schema(&spec, method, path);
    let body = serde_json::to_value(body).unwrap();
    let mut problems = Vec::new();
    check(
        &spec,
        schema,
        &body,
        &format!("{method} {path}"),
        &mut problems,
    );
    assert!(
        problems.is_empty(),
        "request body does not match swagger.yml:\n  {}\nbody: {body:#}",
        problems.join("\n  ")
    );
}

fn full_statement() -> BgpStatement {
    let community = |s: &str| BgpMatchCommunitySet {
        community_set: s.into(),
        match_set_options: "any".into(),
    };
    let set = |m: &str| BgpSetCommunity {
        options: "add".into(),
        set_community_method: vec![m.into()],
    };
    BgpStatement {
        name: "s1".into(),
        conditions: BgpConditions {
            match_prefix_set: Some(BgpMatchPrefixSet {
                prefix_set: "ps1".into(),
                match_set_option: "any".into(),
            }),
            match_neighbor_set: Some(BgpMatchNeighborSet {
                neighbor_set: "ns1".into(),
                match_set_option: "invert".into(),
            }),
            bgp_conditions: Some(BgpMatchConditions {
                afi_safi_in: vec!["ipv4-unicast".into()],
                as_path_length: Some(BgpAsPathLength {
                    operator: "ge".into(),
                    value: 2,
                }),
                match_as_path_set: Some(BgpMatchAsPathSet {
                    as_path_set: "as1".into(),
                    match_set_options: "all".into(),
                }),
                match_community_set: Some(community("c1")),
                match_ext_community_set: Some(community("e1")),
                match_large_community_set: Some(community("l1")),
                next_hop_in_list: vec!["10.0.0.1".into()],
                rpki: "valid".into(),
                route_type: "external".into(),
            }),
        },
        actions: BgpActions {
            route_disposition: "accept-route".into(),
            bgp_actions: Some(BgpSetActions {
                set_med: "10".into(),
                set_next_hop: "10.0.0.254".into(),
                set_local_pref: 200,
                set_community: Some(set("65000:1")),
                set_ext_community: Some(set("rt:65000:2")),
                set_large_community: Some(set("65000:3:4")),
                set_as_path_prepend: Some(BgpAsPathPrepend {
                    asn: "65000".into(),
                    repeat_n: 2,
                }),
            }),
        },
    }
}

#[test]
fn bgp_global_and_neighbor_bodies_match_the_spec() {
    let global = BgpGlobal {
        router_id: "192.168.10.5".parse().unwrap(),
        local_as: 4_200_000_001,
        set_next_hop_self: true,
        listen_port: 1179,
    };
    let body = serde_json::to_value(&global).unwrap();
    assert!(body.get("SetNextHopSelf").is_some(), "the spec's capital S");
    assert_bgp_body_matches("post", "/config/bgp/global", &global);
    let neighbor = BgpNeighbor {
        ip_address: "2001:db8::1".parse().unwrap(),
        remote_as: 65001,
        remote_port: 1179,
        set_multi_hop: true,
    };
    assert_bgp_body_matches("post", "/config/bgp/neigh", &neighbor);
    assert_bgp_body_matches(
        "post",
        "/config/bgp/neigh",
        &BgpNeighbor::new("10.0.0.1".parse().unwrap(), 65001),
    );
}

#[test]
fn bgp_defined_set_bodies_match_the_spec() {
    let path = "/config/bgp/policy/definedsets/{defineset_type}";
    let prefixes = BgpDefinedSet {
        name: "ps1".into(),
        list: vec![],
        prefix_list: vec![BgpPrefix::new("10.0.0.0/24", 24, 32)],
    };
    assert_bgp_body_matches("post", path, &prefixes);
    let list = BgpDefinedSet {
        name: "ns1".into(),
        list: vec!["10.0.0.1/32".into()],
        prefix_list: vec![],
    };
    let body = serde_json::to_value(&list).unwrap();
    assert!(body.get("List").is_some(), "the spec's capital L");
    assert_bgp_body_matches("post", path, &list);
    assert_bgp_body_matches(
        "post",
        path,
        &BgpDefinedSet {
            name: "empty".into(),
            ..Default::default()
        },
    );
}

#[test]
fn bgp_policy_bodies_match_the_spec() {
    let policy = BgpPolicy {
        name: "p1".into(),
        statements: vec![full_statement(), BgpStatement::default()],
    };
    let body = serde_json::to_value(&policy).unwrap();
    // The walk must reach every nested object the client can send.
    for pointer in [
        "/statements/0/conditions/bgpConditions/matchLargeCommunitySet/communitySet",
        "/statements/0/actions/bgpActions/setAsPathPrepend/repeatN",
        "/statements/1/conditions",
        "/statements/1/actions",
    ] {
        assert!(body.pointer(pointer).is_some(), "{pointer} serialized");
    }
    assert_bgp_body_matches("post", "/config/bgp/policy/definitions", &policy);
}

#[test]
fn bgp_policy_apply_bodies_match_the_spec() {
    for (direction, action) in [
        (PolicyDirection::Import, RouteAction::Accept),
        (PolicyDirection::Export, RouteAction::Reject),
    ] {
        let apply = BgpPolicyApply::global(direction, vec!["p1".into()], action);
        assert_bgp_body_matches("post", "/config/bgp/policy/apply", &apply);
        assert_bgp_body_matches("delete", "/config/bgp/policy/apply", &apply);
        let all = BgpPolicyApply::global(direction, vec![], action);
        assert_bgp_body_matches("delete", "/config/bgp/policy/apply", &all);
    }
}

#[test]
fn the_neighbor_delete_takes_an_int32_remote_as_query() {
    // The client always sends `remoteAs` and wraps a 4-byte AS to fit the declared int32
    // (crates/loxilb-client/src/client.rs, `delete_bgp_neighbor`).
    let Some(spec) = load_spec() else {
        return;
    };
    let params = spec["paths"]["/config/bgp/neigh/{ip_address}"]["delete"]["parameters"]
        .as_array()
        .expect("parameters");
    let query: Vec<&Value> = params.iter().filter(|p| p["in"] == "query").collect();
    assert_eq!(query.len(), 1);
    assert_eq!(query[0]["name"], "remoteAs");
    assert_eq!(query[0]["type"], "integer");
    assert_eq!(query[0]["format"], "int32");
}

#[test]
fn checker_catches_a_value_outside_an_enum() {
    let Some(spec) = load_spec() else {
        return;
    };
    let schema = body_schema(&spec, "post", "/config/bgp/policy/apply");
    let mut body = serde_json::to_value(BgpPolicyApply::global(
        PolicyDirection::Export,
        vec![],
        RouteAction::Accept,
    ))
    .unwrap();
    body["policyType"] = "EXPORT".into();
    let mut problems = Vec::new();
    check(&spec, schema, &body, "apply", &mut problems);
    assert_eq!(
        problems,
        ["apply.policyType: \"EXPORT\" is not in the spec's enum"]
    );
}

#[test]
fn firewall_bodies_match_the_spec() {
    use loxilb_client::{FirewallEntry, FirewallMatch, FirewallOptions};
    let full = FirewallEntry {
        rule_arguments: FirewallMatch {
            source_ip: "198.51.100.0/24".into(),
            destination_ip: "192.0.2.10/32".into(),
            min_source_port: 1,
            max_source_port: 2,
            min_destination_port: 80,
            max_destination_port: 80,
            protocol: 6,
            port_name: "eth0".into(),
            preference: 40_001,
        },
        opts: FirewallOptions {
            allow: true,
            drop: true,
            trap: true,
            redirect: true,
            redirect_port_name: "eth1".into(),
            record: true,
            fw_mark: 1,
            do_snat: true,
            to_ip: "192.0.2.99".into(),
            to_port: 1,
            on_default: true,
            counter: "1:1".into(),
        },
    };
    assert_bgp_body_matches("post", "/config/firewall", &full);
    assert_bgp_body_matches("post", "/config/firewall", &FirewallEntry::default());
    let Some(spec) = load_spec() else { return };
    // The delete query names only the spec's parameters.
    let params: Vec<&str> = spec["paths"]["/config/firewall"]["delete"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    for (name, _) in full.rule_arguments.delete_query() {
        assert!(params.contains(&name), "{name} is not a DELETE parameter");
    }
}
