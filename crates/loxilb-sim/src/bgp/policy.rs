//! Defined sets, policies and their assignments to the global RIB (`/config/bgp/defined-sets`,
//! `/config/bgp/policy`, `/config/bgp/policy/apply`): decoding as loxilb does, goBGP's checks
//! and answers, and the listings in goBGP's form.

use std::collections::HashSet;

use axum::response::Response;
use serde_json::{Map, Value, json};

use super::{
    Assignment, BgpState, CommunityAction, DefinedSet, Direction, GLOBAL, MatchSet, SetKind,
    Statement, enabled, object, rpc, wrap_u32,
};
use crate::Shared;
use crate::decode::{GoInt, GoObj, parse_body};
use crate::errors::{ApiError, ok_json, success};
use crate::validate::{parse_cidr, parse_ip};

/// `masklengthRange` is split on `..` into exactly two parts; the numbers themselves are not
/// checked (a part that is not a number reads as 0).
pub(super) fn mask_range(s: &str) -> Result<(u32, u32), ApiError> {
    let parts: Vec<&str> = s.split("..").collect();
    if parts.len() != 2 {
        return Err(ApiError::handler("Mask format is wrong"));
    }
    let num = |p: &str| p.parse::<i64>().map_or(0, wrap_u32);
    Ok((num(parts[0]), num(parts[1])))
}

/// `POST /config/bgp/policy/definedsets/{type}`: creates the set or adds to it.
pub(super) fn set_add(
    shared: &Shared,
    kind_text: &str,
    bytes: &[u8],
) -> Result<Response, ApiError> {
    let body = parse_body(bytes)?;
    let mut map = Map::new();
    let o = object(&body, &mut map, "BGPPolicyDefinedSetsMod")?;
    let list = o.string_array("List")?.unwrap_or_default();
    let prefix_items = o.object_array("prefixList", "BGPPolicyPrefix")?;
    let name = o.string("name")?;
    let mut prefixes_in = Vec::new();
    for item in prefix_items.iter().flatten() {
        match item {
            Some(p) => prefixes_in.push((
                p.string("ipPrefix")?.unwrap_or_default(),
                p.string("masklengthRange")?.unwrap_or_default(),
            )),
            None => prefixes_in.push((String::new(), String::new())),
        }
    }
    let name = name.ok_or_else(|| ApiError::required("name", "body"))?;
    // loxilb's handler reads `prefixList` only for the type spelled `prefix`/`Prefix`, and
    // follows each item's pointer: a `null` item crashes it.
    let handler_prefix = matches!(kind_text, "prefix" | "Prefix");
    if handler_prefix
        && prefix_items
            .as_ref()
            .is_some_and(|items| items.iter().any(Option::is_none))
    {
        return Err(ApiError::Crash("null item in prefixList"));
    }
    enabled(shared)?;
    let mut set = DefinedSet::default();
    if handler_prefix {
        for (prefix, range) in &prefixes_in {
            let (min, max) = mask_range(range)?;
            set.prefixes.push((prefix.clone(), min, max));
        }
    } else {
        set.list = list;
    }
    // loxilb sends an unknown type as goBGP's type 0, which is the prefix type (and the
    // list it read is then ignored).
    let kind = SetKind::parse(kind_text).unwrap_or(SetKind::Prefix);
    if kind == SetKind::Prefix {
        set.list.clear();
    }
    let mut canonical = Vec::with_capacity(set.prefixes.len());
    for (prefix, min, max) in set.prefixes {
        let Some(p) = parse_cidr(&prefix) else {
            return Err(rpc(format!("invalid prefix: {prefix}")));
        };
        canonical.push((p, min, max));
    }
    set.prefixes = canonical;
    if kind == SetKind::Neighbor {
        for a in &set.list {
            if parse_cidr(a).is_none() && parse_ip(a).is_none() {
                return Err(rpc(format!("invalid address or prefix: {a}")));
            }
        }
    }
    let mut st = shared.state();
    let entry = st.bgp.sets.entry((kind, name)).or_default();
    for item in set.list {
        if !entry.list.contains(&item) {
            entry.list.push(item);
        }
    }
    for p in set.prefixes {
        if !entry.prefixes.contains(&p) {
            entry.prefixes.push(p);
        }
    }
    Ok(success())
}

/// `GET /config/bgp/policy/definedsets/{type}/{name}` (`all`: every set of the type).
pub(super) fn set_get(bgp: &BgpState, kind_text: &str, name: &str) -> Result<Response, ApiError> {
    let Some(kind) = SetKind::parse(kind_text) else {
        return Err(ApiError::handler("Unsupported type"));
    };
    let attrs: Vec<Value> = bgp
        .sets
        .iter()
        .filter(|((k, n), _)| *k == kind && (name == "all" || n == name))
        .map(|((_, n), s)| {
            let list = null_if_empty(&s.list);
            // loxilb fills `prefixList` only when the path says exactly `prefix`.
            let prefix_list = if kind_text == "prefix" {
                json!(
                    s.prefixes
                        .iter()
                        .map(|(p, min, max)| json!({"ipPrefix": p, "masklengthRange": format!("{min}..{max}")}))
                        .collect::<Vec<_>>()
                )
            } else {
                Value::Null
            };
            json!({"name": n, "prefixList": prefix_list, "list": list})
        })
        .collect();
    Ok(ok_json(json!({ "definedsetsAttr": attrs })))
}

/// `DELETE /config/bgp/policy/definedsets/{type}/{name}`.
pub(super) fn set_delete(bgp: &mut BgpState, kind_text: &str, name: &str) -> Result<(), ApiError> {
    // Unknown types go to goBGP as type 0: the prefix sets.
    let kind = SetKind::parse(kind_text).unwrap_or(SetKind::Prefix);
    let key = (kind, name.to_string());
    if !bgp.sets.contains_key(&key) {
        return Err(rpc(format!("not found defined-set: {name}")));
    }
    let in_use = bgp
        .policies
        .values()
        .flatten()
        .filter_map(|s| bgp.statements.get(s))
        .any(|s| s.references().any(|(_, n)| n == name));
    if in_use {
        return Err(rpc(format!("can't delete. defined-set {name} is in use")));
    }
    bgp.sets.remove(&key);
    Ok(())
}

pub(super) fn match_option(s: &str) -> &'static str {
    match s {
        "all" => "all",
        "invert" => "invert",
        _ => "any",
    }
}

pub(super) fn community_options(s: &str) -> &'static str {
    match s {
        "add" => "add",
        "remove" => "remove",
        _ => "replace",
    }
}

pub(super) fn decode_match(
    o: Option<GoObj<'_>>,
    name_key: &str,
    option_key: &str,
) -> Result<Option<MatchSet>, ApiError> {
    let Some(o) = o else { return Ok(None) };
    let name = o.string(name_key)?.unwrap_or_default();
    let option = o.string(option_key)?.unwrap_or_default();
    Ok((!name.is_empty()).then(|| MatchSet {
        name,
        option: match_option(&option),
    }))
}

pub(super) fn decode_community(o: Option<GoObj<'_>>) -> Result<Option<CommunityAction>, ApiError> {
    let Some(o) = o else { return Ok(None) };
    let options = o.string("options")?.unwrap_or_default();
    let methods = o.string_array("setCommunityMethod")?.unwrap_or_default();
    Ok((!methods.is_empty()).then(|| CommunityAction {
        options: community_options(&options),
        methods,
    }))
}

/// One statement as loxilb hands it to goBGP and goBGP keeps it. `None` for the nil pointers
/// loxilb's handler follows (the statement itself, `conditions`, `actions`).
pub(super) fn decode_statement(o: &GoObj<'_>) -> Result<Option<Statement>, ApiError> {
    let name = o.string("name")?.unwrap_or_default();
    let conditions = o.object("conditions", "Conditions")?;
    let actions = o.object("actions", "Actions")?;
    let mut s = Statement {
        name,
        ..Statement::default()
    };
    if let Some(c) = &conditions {
        s.prefix_set = decode_match(
            c.object("matchPrefixSet", "MatchPrefixSet")?,
            "prefixSet",
            "matchSetOption",
        )?;
        s.neighbor_set = decode_match(
            c.object("matchNeighborSet", "MatchNeighborSet")?,
            "neighborSet",
            "matchSetOption",
        )?;
        if let Some(b) = c.object("bgpConditions", "BgpConditions")? {
            s.afi_safi_in = b.string_array("afiSafiIn")?.unwrap_or_default();
            if let Some(l) = b.object("asPathLength", "AsPathLength")? {
                let operator = l.string("operator")?.unwrap_or_default();
                let value = l.int("value", GoInt::I64)?.unwrap_or(0);
                if !operator.is_empty() {
                    let op = match operator.to_ascii_lowercase().as_str() {
                        "ge" => "ge",
                        "le" => "le",
                        _ => "eq",
                    };
                    s.as_path_length = Some((op, wrap_u32(value)));
                }
            }
            s.as_path_set = decode_match(
                b.object("matchAsPathSet", "MatchAsPathSet")?,
                "asPathSet",
                "matchSetOptions",
            )?;
            s.community_set = decode_match(
                b.object("matchCommunitySet", "MatchCommunitySet")?,
                "communitySet",
                "matchSetOptions",
            )?;
            s.ext_community_set = decode_match(
                b.object("matchExtCommunitySet", "MatchExtCommunitySet")?,
                "communitySet",
                "matchSetOptions",
            )?;
            s.large_community_set = decode_match(
                b.object("matchLargeCommunitySet", "MatchLargeCommunitySet")?,
                "communitySet",
                "matchSetOptions",
            )?;
            s.next_hop_in_list = b.string_array("nextHopInList")?.unwrap_or_default();
            s.rpki = match b
                .string("rpki")?
                .unwrap_or_default()
                .to_ascii_lowercase()
                .as_str()
            {
                "valid" => "valid",
                "invalid" => "invalid",
                "not-found" => "not-found",
                _ => "",
            };
            s.route_type = match b
                .string("routeType")?
                .unwrap_or_default()
                .to_ascii_lowercase()
                .as_str()
            {
                "internal" => "internal",
                "external" => "external",
                "local" => "local",
                _ => "",
            };
        }
    }
    if let Some(a) = &actions {
        s.route_disposition = match a.string("routeDisposition")?.as_deref() {
            Some("accept-route") => "accept-route",
            Some("reject-route") => "reject-route",
            _ => "",
        };
        if let Some(b) = a.object("bgpActions", "BgpActions")? {
            if let Some(p) = b.object("setAsPathPrepend", "SetAsPathPrepend")? {
                let asn = p.string("as")?.unwrap_or_default();
                let repeat = p.int("repeatN", GoInt::I64)?.unwrap_or(0);
                if !asn.is_empty() {
                    s.as_prepend = Some((asn.parse::<i64>().map_or(0, wrap_u32), wrap_u32(repeat)));
                }
            }
            s.community = decode_community(b.object("setCommunity", "SetCommunity")?)?;
            s.ext_community = decode_community(b.object("setExtCommunity", "SetCommunity")?)?;
            s.large_community = decode_community(b.object("setLargeCommunity", "SetCommunity")?)?;
            let med = b.string("setMed")?.unwrap_or_default();
            if !med.is_empty() {
                // Parsed before anything reaches goBGP (strconv.ParseInt(s, 10, 32)).
                match med.parse::<i32>() {
                    Ok(v) => s.med = Some(i64::from(v)),
                    Err(_)
                        if med
                            .trim_start_matches(['-', '+'])
                            .bytes()
                            .all(|c| c.is_ascii_digit()) =>
                    {
                        return Err(ApiError::handler(format!(
                            "strconv.ParseInt: parsing {med:?}: value out of range"
                        )));
                    }
                    Err(_) => {
                        return Err(ApiError::handler(format!(
                            "strconv.ParseInt: parsing {med:?}: invalid syntax"
                        )));
                    }
                }
            }
            s.local_pref = wrap_u32(b.int("setLocalPerf", GoInt::I64)?.unwrap_or(0));
            s.next_hop = b.string("setNextHop")?.unwrap_or_default();
        }
    }
    if conditions.is_none() || actions.is_none() {
        return Ok(None);
    }
    Ok(Some(s))
}

/// `POST /config/bgp/policy/definitions`: a new policy, or more statements for an existing
/// one. Statement names are unique across all policies.
pub(super) fn policy_add(shared: &Shared, bytes: &[u8]) -> Result<Response, ApiError> {
    let body = parse_body(bytes)?;
    let mut map = Map::new();
    let o = object(&body, &mut map, "BGPPolicyDefinitionsMod")?;
    let name = o.string("name")?.unwrap_or_default();
    let mut statements = Vec::new();
    let mut crashed = false;
    for item in o
        .object_array("statements", "BGPPolicyDefinitionsStatement")?
        .unwrap_or_default()
    {
        match item.map(|s| decode_statement(&s)).transpose()?.flatten() {
            Some(s) => statements.push(s),
            None => crashed = true,
        }
    }
    if crashed {
        return Err(ApiError::Crash(
            "policy statement without conditions or actions",
        ));
    }
    enabled(shared)?;
    let mut st = shared.state();
    let bgp = &mut st.bgp;
    for s in &statements {
        for (kind, set) in s.references() {
            if !bgp.sets.contains_key(&(kind, set.to_string())) {
                return Err(rpc(format!("not found {} {set}", kind.label())));
            }
        }
    }
    let mut names = Vec::with_capacity(statements.len());
    for s in statements {
        // goBGP registers the names one by one: those before a clash stay registered.
        if bgp.statements.contains_key(&s.name) {
            return Err(rpc(format!("statement {} already defined", s.name)));
        }
        names.push(s.name.clone());
        bgp.statements.insert(s.name.clone(), s);
    }
    bgp.policies.entry(name).or_default().extend(names);
    Ok(success())
}

pub(super) fn match_json(m: Option<&MatchSet>, name_key: &str, option_key: &str) -> Value {
    let mut o = Map::new();
    if let Some(m) = m {
        o.insert(option_key.into(), json!(m.option));
        o.insert(name_key.into(), json!(m.name));
    }
    Value::Object(o)
}

pub(super) fn community_json(c: Option<&CommunityAction>) -> Value {
    match c {
        Some(c) => json!({"options": c.options, "setCommunityMethod": c.methods}),
        None => json!({"setCommunityMethod": null}),
    }
}

pub(super) fn null_if_empty(v: &[String]) -> Value {
    if v.is_empty() { Value::Null } else { json!(v) }
}

/// A statement as loxilb lists it: every sub-object present, zero values left out, and the
/// extended and large community matches showing the community match (loxilb copies that
/// one into all three).
pub(super) fn statement_json(s: &Statement) -> Value {
    let community = match_json(s.community_set.as_ref(), "communitySet", "matchSetOptions");
    let mut bgp_conditions = Map::new();
    bgp_conditions.insert("afiSafiIn".into(), null_if_empty(&s.afi_safi_in));
    bgp_conditions.insert(
        "asPathLength".into(),
        match s.as_path_length {
            Some((op, 0)) => json!({"operator": op}),
            Some((op, v)) => json!({"operator": op, "value": v}),
            None => json!({}),
        },
    );
    bgp_conditions.insert(
        "matchAsPathSet".into(),
        match_json(s.as_path_set.as_ref(), "asPathSet", "matchSetOptions"),
    );
    bgp_conditions.insert("matchCommunitySet".into(), community.clone());
    bgp_conditions.insert("matchExtCommunitySet".into(), community.clone());
    bgp_conditions.insert("matchLargeCommunitySet".into(), community);
    bgp_conditions.insert("nextHopInList".into(), null_if_empty(&s.next_hop_in_list));
    if !s.rpki.is_empty() {
        bgp_conditions.insert("rpki".into(), json!(s.rpki));
    }
    if !s.route_type.is_empty() {
        bgp_conditions.insert("routeType".into(), json!(s.route_type));
    }
    let mut actions = Map::new();
    let mut prepend = Map::new();
    if let Some((asn, repeat)) = s.as_prepend {
        prepend.insert("as".into(), json!(asn.to_string()));
        if repeat != 0 {
            prepend.insert("repeatN".into(), json!(repeat));
        }
    }
    actions.insert("setAsPathPrepend".into(), Value::Object(prepend));
    actions.insert("setCommunity".into(), community_json(s.community.as_ref()));
    actions.insert(
        "setExtCommunity".into(),
        community_json(s.ext_community.as_ref()),
    );
    actions.insert(
        "setLargeCommunity".into(),
        community_json(s.large_community.as_ref()),
    );
    if s.local_pref != 0 {
        actions.insert("setLocalPerf".into(), json!(s.local_pref));
    }
    if let Some(med) = s.med {
        actions.insert("setMed".into(), json!(med.to_string()));
    }
    // goBGP keeps `self` and `unchanged` as flags, which loxilb does not list.
    if !matches!(s.next_hop.as_str(), "" | "self" | "unchanged") {
        actions.insert("setNextHop".into(), json!(s.next_hop));
    }
    let mut action = Map::new();
    action.insert("bgpActions".into(), Value::Object(actions));
    if !s.route_disposition.is_empty() {
        action.insert("routeDisposition".into(), json!(s.route_disposition));
    }
    let mut out = Map::new();
    if !s.name.is_empty() {
        out.insert("name".into(), json!(s.name));
    }
    out.insert(
        "conditions".into(),
        json!({
            "bgpConditions": bgp_conditions,
            "matchNeighborSet": match_json(s.neighbor_set.as_ref(), "neighborSet", "matchSetOption"),
            "matchPrefixSet": match_json(s.prefix_set.as_ref(), "prefixSet", "matchSetOption"),
        }),
    );
    out.insert("actions".into(), Value::Object(action));
    Value::Object(out)
}

pub(super) fn list_policies(bgp: &BgpState) -> Value {
    let attrs: Vec<Value> = bgp
        .policies
        .iter()
        .map(|(name, stmts)| {
            let statements: Vec<Value> = stmts
                .iter()
                .filter_map(|s| bgp.statements.get(s))
                .map(statement_json)
                .collect();
            let mut m = Map::new();
            if !name.is_empty() {
                m.insert("name".into(), json!(name));
            }
            m.insert(
                "statements".into(),
                if statements.is_empty() {
                    Value::Null
                } else {
                    Value::Array(statements)
                },
            );
            Value::Object(m)
        })
        .collect();
    json!({ "bgpPolicyAttr": attrs })
}

/// `DELETE /config/bgp/policy/definitions/{name}`: the policy and its statements.
pub(super) fn policy_delete(bgp: &mut BgpState, name: &str) -> Result<(), ApiError> {
    let Some(stmts) = bgp.policies.get(name).cloned() else {
        return Err(rpc(format!("not found policy: {name}")));
    };
    // goBGP's in-use check looks at the export assignments only (it lists the export
    // direction twice and never the import one).
    let in_use = bgp
        .assignments
        .iter()
        .any(|((_, dir), a)| *dir == Direction::Export && a.policies.iter().any(|p| p == name));
    if in_use {
        return Err(rpc(format!("can't delete. policy {name} is in use")));
    }
    bgp.policies.remove(name);
    for s in stmts {
        if !bgp.policies.values().flatten().any(|other| *other == s) {
            bgp.statements.remove(&s);
        }
    }
    Ok(())
}

/// `POST` (`add`) and `DELETE /config/bgp/policy/apply`.
pub(super) fn apply(shared: &Shared, bytes: &[u8], add: bool) -> Result<Response, ApiError> {
    let body = parse_body(bytes)?;
    let mut map = Map::new();
    let o = object(&body, &mut map, "BGPApplyPolicyToNeighborMod")?;
    let target = o.string("ipAddress")?;
    let policies = o.string_array("policies")?.unwrap_or_default();
    let policy_type = o.string("policyType")?;
    let route_action = o.string("routeAction")?;
    // Schema validation (required and enums), in property order; loxilb's DELETE route
    // shares the schema, so it needs `routeAction` as well.
    let target = target.ok_or_else(|| ApiError::required("ipAddress", "body"))?;
    let check = |key: &str, v: Option<String>, allowed: &[&str]| -> Result<String, ApiError> {
        let v = v.ok_or_else(|| ApiError::required(key, "body"))?;
        if allowed.contains(&v.as_str()) {
            Ok(v)
        } else {
            Err(ApiError::enumeration(
                key,
                &Value::from(v.as_str()),
                &allowed.join(" "),
            ))
        }
    };
    let policy_type = check("policyType", policy_type, &["import", "export"])?;
    let route_action = check("routeAction", route_action, &["accept", "reject"])?;
    enabled(shared)?;
    let mut st = shared.state();
    let bgp = &mut st.bgp;
    // Per-peer policies exist only for route-server clients, which loxilb never makes: only
    // the global RIB takes them.
    if target.is_empty() {
        return Err(rpc("empty table name"));
    }
    if target != GLOBAL {
        let key = parse_ip(&target).map_or_else(|| target.clone(), |a| a.to_string());
        if bgp.neighbors.contains_key(&key) {
            return Err(rpc(format!(
                "non-rs-client peer {target} doesn't have per peer policy"
            )));
        }
        return Err(rpc(format!("not found peer {target}")));
    }
    let dir = if policy_type == "import" {
        Direction::Import
    } else {
        Direction::Export
    };
    let mut seen = HashSet::new();
    for p in &policies {
        if !bgp.policies.contains_key(p) {
            return Err(rpc(format!("not found policy {p}")));
        }
        if !seen.insert(p.clone()) {
            return Err(rpc(format!("duplicated policy {p}")));
        }
    }
    let a = bgp
        .assignments
        .entry((GLOBAL.to_string(), dir))
        .or_insert_with(|| Assignment {
            policies: Vec::new(),
            default_action: "none",
        });
    if add {
        if let Some(dup) = policies.iter().find(|p| a.policies.contains(p)) {
            return Err(rpc(format!("duplicated policy {dup}")));
        }
        a.policies.extend(policies);
        a.default_action = if route_action == "accept" {
            "accept"
        } else {
            "reject"
        };
    } else if policies.is_empty() {
        // loxilb asks for "all" when no policy is named.
        a.policies.clear();
        a.default_action = "none";
    } else {
        a.policies.retain(|p| !policies.contains(p));
    }
    Ok(success())
}
