//! What the BGP CRD schemas say beyond kube-loxilb's: bounds, enums and CEL rules, so that
//! `kubectl apply` refuses bad input with the field and the reason (422), as the controller's
//! own checks (`loxi_domain::bgp`'s `validate`) do for objects written before. Put into the
//! schemas by `#[schemars(transform = ...)]` on the spec types (`crds.rs`).
//!
//! kube-loxilb's schemas leave most fields free; the rules here refuse only what loxilb
//! refuses or mishandles (AS 0, a mask length range not written `min..max`, a statement
//! without conditions or actions, which crashes loxilb's handler), so its example manifests
//! apply unchanged.

use kube::core::{Message, Reason, Rule};
use schemars::Schema;
use serde_json::Value;

use crate::k8s::schema::{Object, add, rule, set};

/// The object schema of an optional value: schemars may write `Option<T>` as
/// `anyOf: [T, null]` (kube folds that into `nullable` later).
fn unwrap_nullable(at: &mut Object) -> &mut Object {
    let found = ["anyOf", "oneOf"].into_iter().find_map(|key| {
        let list = at.get(key)?.as_array()?;
        let index = list
            .iter()
            .position(|v| v.is_object() && v.get("type").and_then(Value::as_str) != Some("null"))?;
        Some((key, index))
    });
    let Some((key, index)) = found else {
        return at;
    };
    match at.get_mut(key).and_then(|v| v.get_mut(index)) {
        Some(Value::Object(inner)) => inner,
        _ => unreachable!("checked above: an object at {key}[{index}]"),
    }
}

/// The schema at `path` below `root`: property names, `[]` for a list's items.
fn at<'a>(root: &'a mut Object, path: &[&str]) -> Option<&'a mut Object> {
    let mut here = unwrap_nullable(root);
    for step in path {
        let next = if *step == "[]" {
            here.get_mut("items")
        } else {
            here.get_mut("properties").and_then(|p| p.get_mut(*step))
        };
        here = unwrap_nullable(next?.as_object_mut()?);
    }
    Some(here)
}

fn with(root: &mut Object, path: &[&str], f: impl FnOnce(&mut Object)) {
    if let Some(o) = at(root, path) {
        f(o);
    }
}

/// Marks `fields` required, without the `default` schemars gives them (the domain types
/// default every field so that the controller reads any object; the API server would fill a
/// default in and never report the field missing).
fn required(at: &mut Object, fields: &[&str]) {
    set(at, "required", fields.to_vec());
    if let Some(Value::Object(properties)) = at.get_mut("properties") {
        for field in fields {
            if let Some(Value::Object(p)) = properties.get_mut(*field) {
                p.remove("default");
            }
        }
    }
}

fn one_of(at: &mut Object, values: &[&str]) {
    set(at, "enum", values.to_vec());
}

/// Drops every `default` below `at`: the domain types default their fields when the
/// controller reads an object, so the API server need not write them into stored objects
/// (kube-loxilb's schemas have none either).
fn without_defaults(at: &mut Object) {
    at.remove("default");
    for v in at.values_mut() {
        match v {
            Value::Object(o) => without_defaults(o),
            Value::Array(list) => list
                .iter_mut()
                .filter_map(Value::as_object_mut)
                .for_each(without_defaults),
            _ => {}
        }
    }
}

/// `BGPPeerService.spec`.
pub fn peer(schema: &mut Schema) {
    let root = schema.ensure_object();
    without_defaults(root);
    required(unwrap_nullable(root), &["ipAddress", "remoteAs"]);
    with(root, &["ipAddress"], |o| {
        set(o, "maxLength", 64);
        add(o, [rule("isIP(self)", "not an IP address (IPv4 or IPv6)")]);
    });
    with(root, &["remoteAs"], |o| {
        set(o, "minimum", 1);
        set(o, "maximum", u32::MAX);
        add(
            o,
            [rule(
                "self != 0",
                "AS 0 is reserved: an AS number goes from 1 to 4294967295",
            )],
        );
    });
    with(root, &["remotePort"], |o| {
        set(o, "minimum", 0);
        set(o, "maximum", 65535);
    });
}

/// At most this many members (`List`) or prefixes (`prefixList`) in one defined set: the
/// API server charges each rule on a prefix for as many prefixes as the list may hold.
pub const MAX_SET_MEMBERS: u32 = 128;

const DEFINED_TYPES: &str = "['prefix', 'neighbor', 'neigh', 'nei', 'community', 'extcommunity', 'largecommunity', 'aspath']";

/// `BGPPolicyDefinedSetsService.spec`.
pub fn defined_sets(schema: &mut Schema) {
    let root = schema.ensure_object();
    without_defaults(root);
    let top = unwrap_nullable(root);
    required(top, &["name", "definedType"]);
    add(
        top,
        [
            Rule::new(
                "self.definedType.lowerAscii() != 'prefix' || (has(self.prefixList) && size(self.prefixList) > 0)",
            )
            .message(Message::Message(
                "a prefix set lists its prefixes in prefixList".into(),
            ))
            .field_path(".prefixList")
            .reason(Reason::FieldValueRequired),
            Rule::new(
                "self.definedType.lowerAscii() == 'prefix' || (has(self.List) && size(self.List) > 0)",
            )
            .message(Message::Message(
                "a set other than prefix lists its members in List".into(),
            ))
            .field_path(".List")
            .reason(Reason::FieldValueRequired),
        ],
    );
    with(root, &["name"], |o| {
        set(o, "minLength", 1);
        set(o, "maxLength", 253);
    });
    with(root, &["definedType"], |o| {
        set(o, "maxLength", 16);
        add(
            o,
            [rule(
                format!("self.lowerAscii() in {DEFINED_TYPES}"),
                "expected prefix, neighbor, community, extcommunity, largecommunity or aspath",
            )],
        );
    });
    // Bounds for the cost estimate of the rules below (per item, times the largest list).
    with(root, &["prefixList"], |o| {
        set(o, "maxItems", MAX_SET_MEMBERS)
    });
    with(root, &["List"], |o| set(o, "maxItems", MAX_SET_MEMBERS));
    with(root, &["List", "[]"], |o| set(o, "maxLength", 256));
    with(root, &["prefixList", "[]"], |o| {
        required(o, &["ipPrefix", "masklengthRange"]);
    });
    with(root, &["prefixList", "[]", "ipPrefix"], |o| {
        set(o, "maxLength", 64);
        add(o, [rule("isCIDR(self)", "not a prefix such as 10.0.0.0/8")]);
    });
    with(root, &["prefixList", "[]", "masklengthRange"], |o| {
        set(o, "maxLength", 8);
        set(o, "pattern", "^[0-9]{1,3}[.][.][0-9]{1,3}$");
        add(
            o,
            [rule(
                "!self.matches('^[0-9]{1,3}[.][.][0-9]{1,3}$') || (int(self.split('..')[0]) <= int(self.split('..')[1]) && int(self.split('..')[1]) <= 128)",
                "expected min..max with 0 <= min <= max <= 128, for example 24..32",
            )],
        );
    });
}

/// `BGPPolicyDefinitionService.spec`.
pub fn definition(schema: &mut Schema) {
    let root = schema.ensure_object();
    without_defaults(root);
    required(unwrap_nullable(root), &["name"]);
    with(root, &["name"], |o| {
        set(o, "minLength", 1);
    });
    with(root, &["statements", "[]"], |o| {
        required(o, &["conditions", "actions"]);
    });
    let statement = ["statements", "[]"];
    for (path, values) in [
        (
            &["conditions", "matchPrefixSet", "matchSetOption"][..],
            &["", "any", "invert"][..],
        ),
        (
            &["conditions", "matchNeighborSet", "matchSetOption"],
            &["", "any", "invert"],
        ),
        (
            &[
                "conditions",
                "bgpConditions",
                "matchAsPathSet",
                "matchSetOptions",
            ],
            &["", "any", "all", "invert"],
        ),
        (
            &[
                "conditions",
                "bgpConditions",
                "matchCommunitySet",
                "matchSetOptions",
            ],
            &["", "any", "all", "invert"],
        ),
        (
            &[
                "conditions",
                "bgpConditions",
                "matchExtCommunitySet",
                "matchSetOptions",
            ],
            &["", "any", "all", "invert"],
        ),
        (
            &[
                "conditions",
                "bgpConditions",
                "matchLargeCommunitySet",
                "matchSetOptions",
            ],
            &["", "any", "all", "invert"],
        ),
        (
            &["actions", "routeDisposition"],
            &["", "accept-route", "reject-route"],
        ),
    ] {
        let full: Vec<&str> = statement.iter().chain(path).copied().collect();
        with(root, &full, |o| one_of(o, values));
    }
}

/// `BGPPolicyApplyService.spec`.
pub fn apply(schema: &mut Schema) {
    let root = schema.ensure_object();
    without_defaults(root);
    required(
        unwrap_nullable(root),
        &["ipAddress", "policyType", "policies", "routeAction"],
    );
    with(root, &["ipAddress"], |o| {
        set(o, "maxLength", 64);
        add(
            o,
            [rule(
                "self == 'global' || isIP(self)",
                "expected global or a neighbour's IP address",
            )],
        );
    });
    with(root, &["policyType"], |o| one_of(o, &["import", "export"]));
    with(root, &["routeAction"], |o| one_of(o, &["accept", "reject"]));
    with(root, &["policies"], |o| {
        set(o, "minItems", 1);
    });
    with(root, &["policies", "[]"], |o| {
        set(o, "minLength", 1);
    });
}
