//! What a Gateway, its listeners and its routes report: the spec's conditions and reasons
//! from the decisions of `attach` and the outcome of a pass. Pure: the controller stamps
//! generations and transition times (`crate::k8s::conditions`) and writes them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::{Value, json};

use super::attach::{ListenerVerdict, RouteKind};
use super::types::GROUP;

/// A condition before stamping (generation and transition time come from the writer).
pub fn condition(type_: &str, ok: bool, reason: &str, message: impl Into<String>) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: if ok { "True" } else { "False" }.to_string(),
        reason: reason.to_string(),
        message: message.into(),
        observed_generation: None,
        last_transition_time: Time(Default::default()),
    }
}

/// The four conditions of a listener. `programmed`: its rules are on every loxilb of the
/// group (false while its Gateway has no address or a loxilb refused).
pub fn listener_conditions(v: &ListenerVerdict, programmed: bool) -> Vec<Condition> {
    let accepted = match &v.unsupported {
        Some(why) => condition("Accepted", false, "UnsupportedProtocol", why.clone()),
        None => condition("Accepted", true, "Accepted", "listener accepted"),
    };
    let conflicted = match v.conflict {
        Some(reason) => condition(
            "Conflicted",
            true,
            reason,
            "another listener uses the same port for the same transport",
        ),
        None => condition("Conflicted", false, "NoConflicts", "no conflict"),
    };
    let resolved = if v.invalid_kinds.is_empty() {
        condition(
            "ResolvedRefs",
            true,
            "ResolvedRefs",
            "all references resolved",
        )
    } else {
        condition(
            "ResolvedRefs",
            false,
            "InvalidRouteKinds",
            format!(
                "route kinds not supported on this listener: {}",
                v.invalid_kinds.join(", ")
            ),
        )
    };
    let programmed = if !v.usable() {
        condition("Programmed", false, "Invalid", "the listener is not valid")
    } else if v.protocol_kind.is_some_and(|k| !k.programmed_on_loxilb()) {
        condition(
            "Programmed",
            false,
            "Pending",
            "loxi-ccm does not put HTTP traffic on loxilb yet (docs/gateway-api.md#http)",
        )
    } else if programmed {
        condition("Programmed", true, "Programmed", "rules are on loxilb")
    } else {
        condition(
            "Programmed",
            false,
            "Pending",
            "the Gateway is not programmed yet",
        )
    };
    vec![accepted, conflicted, resolved, programmed]
}

/// `supportedKinds` of a listener's status.
pub fn supported_kinds(kinds: &[RouteKind]) -> Value {
    Value::Array(
        kinds
            .iter()
            .map(|k| json!({"group": GROUP, "kind": k.kind()}))
            .collect(),
    )
}

/// The route parent entry loxi-ccm writes for one parentRef (as the route wrote it).
pub fn parent_entry(parent_ref: &Value, controller: &str, conditions: &[Condition]) -> Value {
    json!({
        "parentRef": parent_ref,
        "controllerName": controller,
        "conditions": conditions,
    })
}

/// The route's `status.parents` after our pass: other controllers' entries as they are,
/// ours replaced by `ours` (none left when the route no longer names a Gateway of ours).
pub fn merged_parents(existing: &[Value], controller: &str, ours: Vec<Value>) -> Vec<Value> {
    existing
        .iter()
        .filter(|p| p["controllerName"] != controller)
        .cloned()
        .chain(ours)
        .collect()
}

/// Whether two parent lists say the same, transition times aside (so an unchanged status
/// is not written again).
pub fn same_parents(a: &[Value], b: &[Value]) -> bool {
    let strip = |list: &[Value]| -> Vec<Value> {
        list.iter()
            .map(|p| {
                let mut p = p.clone();
                if let Some(conds) = p["conditions"].as_array_mut() {
                    for c in conds {
                        if let Some(o) = c.as_object_mut() {
                            o.remove("lastTransitionTime");
                        }
                    }
                }
                p
            })
            .collect()
    };
    strip(a) == strip(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_controllers_entries_are_kept() {
        let theirs = json!({"controllerName": "example.com/gw", "parentRef": {"name": "x"}});
        let old_ours = json!({"controllerName": "loxilb.io/loxilb", "parentRef": {"name": "a"}});
        let new_ours = json!({"controllerName": "loxilb.io/loxilb", "parentRef": {"name": "b"}});
        let merged = merged_parents(
            &[theirs.clone(), old_ours],
            "loxilb.io/loxilb",
            vec![new_ours.clone()],
        );
        assert_eq!(merged, vec![theirs, new_ours]);
    }

    #[test]
    fn transition_times_do_not_make_a_difference() {
        let a = json!({"conditions": [{"type": "Accepted", "lastTransitionTime": "2020-01-01T00:00:00Z"}]});
        let b = json!({"conditions": [{"type": "Accepted", "lastTransitionTime": "2021-01-01T00:00:00Z"}]});
        let c = json!({"conditions": [{"type": "Accepted", "status": "False"}]});
        assert!(same_parents(std::slice::from_ref(&a), &[b]));
        assert!(!same_parents(&[a], &[c]));
    }

    #[test]
    fn listener_conditions_follow_the_verdict() {
        let ok = ListenerVerdict {
            kinds: vec![RouteKind::Tcp],
            ..ListenerVerdict::default()
        };
        let c = listener_conditions(&ok, true);
        let show: Vec<(&str, &str, &str)> = c
            .iter()
            .map(|c| (c.type_.as_str(), c.status.as_str(), c.reason.as_str()))
            .collect();
        assert_eq!(
            show,
            vec![
                ("Accepted", "True", "Accepted"),
                ("Conflicted", "False", "NoConflicts"),
                ("ResolvedRefs", "True", "ResolvedRefs"),
                ("Programmed", "True", "Programmed"),
            ]
        );
        let bad = ListenerVerdict {
            conflict: Some("HostnameConflict"),
            invalid_kinds: vec!["HTTPRoute".into()],
            ..ListenerVerdict::default()
        };
        let http = ListenerVerdict {
            protocol_kind: Some(RouteKind::Http),
            kinds: vec![RouteKind::Http],
            ..ListenerVerdict::default()
        };
        // HTTP listeners are programmed (to loxilb-ingress, docs/gateway-api.md#http).
        let c = listener_conditions(&http, true);
        assert_eq!(
            (c[0].status.as_str(), c[3].status.as_str()),
            ("True", "True")
        );
        let c = listener_conditions(&http, false);
        assert_eq!(
            (c[3].status.as_str(), c[3].reason.as_str()),
            ("False", "Pending")
        );
        let c = listener_conditions(&bad, true);
        assert_eq!(
            (c[1].status.as_str(), c[1].reason.as_str()),
            ("True", "HostnameConflict")
        );
        assert_eq!(c[2].reason, "InvalidRouteKinds");
        assert_eq!(
            (c[3].status.as_str(), c[3].reason.as_str()),
            ("False", "Invalid")
        );
    }
}
