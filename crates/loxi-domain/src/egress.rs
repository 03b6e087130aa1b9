//! kube-loxilb's `Egress` resource (`egress.loxilb.io/v1`, namespaced): source addresses
//! whose traffic leaving the cluster through loxilb is source-NATed to one address, the
//! `vip`. Each source becomes one loxilb firewall rule with `doSnat`, `toIP` = the vip and
//! `onDefault` (only traffic no LB rule takes: docs/loxilb-api.md#firewall).
//!
//! The sources are the spec's `addresses` (IPs or CIDRs, either family) and the addresses of
//! the pods its `selector` selects now. kube-loxilb recomputes the pods at delete time and
//! never removes a pod that left the selector; here the rules are a function of the spec and
//! of the pods selected *now*, and the diff against what loxilb holds of ours removes exactly
//! what is no longer wanted.
//!
//! Not wired into the controller yet (no CRD served, no watch): see docs/migration.md.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::naming::ClusterId;

/// Lowest preference of the band of our SNAT rules (apart from the source-range band,
/// `crate::firewall::PREFERENCE_BASE`).
pub const SNAT_PREFERENCE_BASE: u16 = 50_000;

/// The spec, with kube-loxilb's spellings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct EgressSpec {
    /// IPs or CIDRs.
    pub addresses: Vec<String>,
    /// The address the sources are NATed to.
    pub vip: String,
    /// Pod labels; empty selects no pod.
    pub selector: BTreeMap<String, String>,
}

/// Why an Egress cannot be programmed (a condition and a Warning Event on it).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EgressError {
    #[error("spec.vip {value:?} is not an IP address")]
    InvalidVip { value: String },
    #[error("spec.addresses entry {value:?} is neither an IP address nor a CIDR")]
    InvalidAddress { value: String },
    #[error("spec.addresses entry {value} is not of the family of spec.vip {vip}")]
    FamilyMismatch { value: String, vip: IpAddr },
}

/// One SNAT rule of ours: traffic from `source` leaves as `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SnatRule {
    /// Canonical network form (a single address is a /32 or /128).
    pub source: IpNet,
    pub to: IpAddr,
    pub preference: u16,
}

/// The preference of one controller's SNAT rules, from the id in its rule names (as
/// `crate::firewall::Preferences::of`): a rule is ours when it has this preference, a
/// `doSnat` action, `onDefault`, any destination and no port.
pub fn snat_preference(owner: &ClusterId) -> u16 {
    let slot = crate::selection::fnv1a(&[b"snat", owner.as_str().as_bytes()])
        % u64::from(crate::firewall::PREFERENCE_SLOTS);
    SNAT_PREFERENCE_BASE + u16::try_from(slot).unwrap_or(0)
}

fn parse_source(value: &str) -> Option<IpNet> {
    let value = value.trim();
    value
        .parse::<IpNet>()
        .ok()
        .or_else(|| value.parse::<IpAddr>().ok().map(IpNet::from))
        .map(|n| n.trunc())
}

/// The SNAT rules of one Egress, from its spec and the addresses of the pods its selector
/// selects now (already filtered by the caller: ready or not, the pod's addresses as the API
/// shows them). Sources of the other family than the vip cannot be NATed to it: refused for
/// the spec's addresses (the user wrote them), skipped for pods (a dual-stack pod has both).
pub fn plan(
    spec: &EgressSpec,
    pod_addresses: &[IpAddr],
    preference: u16,
) -> Result<Vec<SnatRule>, EgressError> {
    let to: IpAddr = spec
        .vip
        .trim()
        .parse()
        .map_err(|_| EgressError::InvalidVip {
            value: spec.vip.clone(),
        })?;
    let mut rules = Vec::new();
    for value in &spec.addresses {
        let source = parse_source(value).ok_or_else(|| EgressError::InvalidAddress {
            value: value.clone(),
        })?;
        if source.addr().is_ipv4() != to.is_ipv4() {
            return Err(EgressError::FamilyMismatch {
                value: value.clone(),
                vip: to,
            });
        }
        rules.push(SnatRule {
            source,
            to,
            preference,
        });
    }
    rules.extend(
        pod_addresses
            .iter()
            .filter(|a| a.is_ipv4() == to.is_ipv4())
            .map(|a| SnatRule {
                source: IpNet::from(*a),
                to,
                preference,
            }),
    );
    rules.sort();
    rules.dedup();
    Ok(rules)
}

/// What to create and delete so that our SNAT rules held become `desired` (every Egress's
/// rules together: two Egresses may name one source, and loxilb keys a rule by its source
/// and preference, so one source has one rule; the first Egress by name wins and the others
/// report a conflict).
pub fn diff(desired: &[SnatRule], held: &[SnatRule]) -> (Vec<SnatRule>, Vec<SnatRule>) {
    let want: std::collections::BTreeSet<&SnatRule> = desired.iter().collect();
    let have: std::collections::BTreeSet<&SnatRule> = held.iter().collect();
    (
        want.difference(&have).map(|r| **r).collect(),
        have.difference(&want).map(|r| **r).collect(),
    )
}

/// Merges the rules of several Egresses (by name order) into what loxilb can hold: one rule
/// per source. Returns the merged rules and, per Egress, the sources another Egress took.
pub fn merge(
    egresses: &BTreeMap<String, Vec<SnatRule>>,
) -> (Vec<SnatRule>, BTreeMap<String, Vec<IpNet>>) {
    let mut taken: BTreeMap<IpNet, &str> = BTreeMap::new();
    let mut merged = Vec::new();
    let mut conflicts: BTreeMap<String, Vec<IpNet>> = BTreeMap::new();
    for (name, rules) in egresses {
        for r in rules {
            match taken.get(&r.source) {
                Some(owner) if *owner != name.as_str() => {
                    conflicts.entry(name.clone()).or_default().push(r.source);
                }
                Some(_) => {}
                None => {
                    taken.insert(r.source, name);
                    merged.push(*r);
                }
            }
        }
    }
    merged.sort();
    (merged, conflicts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(addresses: &[&str], vip: &str) -> EgressSpec {
        EgressSpec {
            addresses: addresses.iter().map(|a| a.to_string()).collect(),
            vip: vip.into(),
            selector: BTreeMap::new(),
        }
    }

    #[test]
    fn kube_loxilbs_spec_reads_unchanged() {
        let s: EgressSpec = serde_json::from_value(serde_json::json!({
            "addresses": ["10.0.0.5", "10.1.0.0/16"],
            "vip": "192.0.2.50",
            "selector": {"app": "web"}
        }))
        .unwrap();
        assert_eq!(s.selector["app"], "web");
        let rules = plan(&s, &[], 50_001).unwrap();
        let sources: Vec<String> = rules.iter().map(|r| r.source.to_string()).collect();
        assert_eq!(sources, ["10.0.0.5/32", "10.1.0.0/16"]);
    }

    #[test]
    fn pods_in_and_out_of_the_selector_change_exactly_their_rules() {
        let s = spec(&["10.9.0.0/24"], "192.0.2.50");
        let p = |a: &str| -> IpAddr { a.parse().unwrap() };
        let before = plan(
            &s,
            &[p("10.244.1.5"), p("10.244.2.6"), p("fd00::5")],
            50_001,
        )
        .unwrap();
        assert_eq!(
            before.len(),
            3,
            "the IPv6 pod address cannot go to an IPv4 vip"
        );
        let after = plan(&s, &[p("10.244.2.6"), p("10.244.3.7")], 50_001).unwrap();
        let (create, delete) = diff(&after, &before);
        assert_eq!(create.len(), 1);
        assert_eq!(create[0].source.to_string(), "10.244.3.7/32");
        assert_eq!(delete.len(), 1);
        assert_eq!(delete[0].source.to_string(), "10.244.1.5/32");
        // Deleted: everything it added goes, nothing else.
        let (_, gone) = diff(&[], &after);
        assert_eq!(gone, after);
    }

    #[test]
    fn bad_specs_name_the_field() {
        assert!(matches!(
            plan(&spec(&[], "nope"), &[], 1),
            Err(EgressError::InvalidVip { .. })
        ));
        let e = plan(&spec(&["10.0.0.300"], "192.0.2.1"), &[], 1).unwrap_err();
        assert!(e.to_string().contains("10.0.0.300"), "{e}");
        assert!(matches!(
            plan(&spec(&["2001:db8::1"], "192.0.2.1"), &[], 1),
            Err(EgressError::FamilyMismatch { .. })
        ));
    }

    #[test]
    fn one_source_one_rule_across_egresses() {
        let a = plan(&spec(&["10.0.0.5"], "192.0.2.50"), &[], 1).unwrap();
        let b = plan(&spec(&["10.0.0.5", "10.0.0.6"], "192.0.2.51"), &[], 1).unwrap();
        let (merged, conflicts) = merge(&BTreeMap::from([("a".into(), a), ("b".into(), b)]));
        assert_eq!(merged.len(), 2);
        assert_eq!(
            conflicts["b"],
            vec!["10.0.0.5/32".parse::<IpNet>().unwrap()]
        );
        let owner = ClusterId::new("c1").unwrap();
        let p = snat_preference(&owner);
        assert!((SNAT_PREFERENCE_BASE..SNAT_PREFERENCE_BASE + 4096).contains(&p));
    }
}
