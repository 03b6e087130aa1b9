//! `--appendEPs` (`crate::loxilb` module `shared`): rules shared with other controllers.
//! A rule on a key of ours may carry anyone's name and anyone's endpoints, so only our
//! endpoints are compared: each served Service's endpoints are on the rule of each key it
//! wants (a missing or re-weighted one is a `rules` violation), and endpoints of others are
//! neither drift nor orphans.
//!
//! Which endpoints on a rule are ours, beyond those a Service wants: those whose address is
//! one of this cluster's Nodes or EndpointSlices (two controllers never put the same target on
//! one rule: loxilb keeps one entry per address and port). Such an endpoint that no Service
//! wants on its key is left behind by us: a `rules` violation on a key a Service wants, an
//! `owned-orphan` on a rule named as ours no Service wants; on someone else's rule of a key we
//! do not want it is noted only (another controller of this cluster may serve its Nodes). A
//! rule named as ours that holds only others' endpoints is theirs now, and noted.

use std::collections::BTreeSet;
use std::net::IpAddr;

use loxi_domain::shared_rules::lacking;
use loxi_domain::{RuleKey, RuleName};

use super::{
    Desired, Findings, Kind, REPORTED_REASONS, Snapshot, View, rule_name, svc_name,
    unprogrammed_reason,
};

/// The addresses of this cluster's endpoints: its Nodes' and its EndpointSlices'.
fn our_addresses(s: &Snapshot) -> BTreeSet<IpAddr> {
    let slices = s
        .endpoint_slices
        .iter()
        .flat_map(|sl| sl.endpoints.iter().flatten())
        .flat_map(|e| e.addresses.iter())
        .filter_map(|a| a.parse::<IpAddr>().ok());
    s.nodes
        .iter()
        .filter_map(|n| n.internal_ip)
        .chain(slices)
        .collect()
}

/// Checks every listed loxilb's shared rules (module docs).
pub(super) fn check(s: &Snapshot, v: &View<'_>, desired: &Desired<'_>, f: &mut Findings) {
    let ours = our_addresses(s);
    for inst in &s.instances {
        let Ok(rules) = &inst.rules else { continue };
        let held = |key: &RuleKey| rules.iter().find(|r| r.key == *key);
        // Every endpoint some Service of ours wants on this loxilb, by key.
        let mut wanted: BTreeSet<(RuleKey, IpAddr, u16)> = BTreeSet::new();
        for (&(ns, name), want) in desired {
            let Some(want) = want else { continue };
            let svc = v.services[&(ns, name)];
            if s.settings.group_of(svc) != inst.group {
                continue;
            }
            let reported = unprogrammed_reason(svc).filter(|r| REPORTED_REASONS.contains(r));
            for w in want {
                wanted.extend(w.endpoints.iter().map(|e| (w.key, e.ip, e.target_port)));
                let missing = lacking(w, held(&w.key));
                if missing.is_empty() {
                    continue;
                }
                if let Some(reason) = reported {
                    f.notes.push(format!(
                        "{} lacks endpoints on {} on {}: reported by the Service ({reason})",
                        svc_name(ns, name),
                        w.key,
                        inst.url
                    ));
                    continue;
                }
                f.violation(
                    Kind::Rules,
                    format!(
                        "{ns}/{name} lacks its endpoints [{}] on the shared rule for {} on {}",
                        endpoints(&missing),
                        w.key,
                        inst.url
                    ),
                    vec![svc_name(ns, name), format!("loxilb {}", inst.url)],
                );
            }
        }
        let wanted_keys: BTreeSet<RuleKey> = wanted.iter().map(|(k, _, _)| *k).collect();
        for r in rules {
            let left: Vec<_> = r
                .endpoints
                .iter()
                .filter(|e| ours.contains(&e.ip) && !wanted.contains(&(r.key, e.ip, e.target_port)))
                .copied()
                .collect();
            let named_ours = RuleName::parse(&r.name)
                .filter(|n| n.cluster == s.cluster.as_str() && v.in_scope(&n.namespace));
            if left.is_empty() {
                if named_ours.is_some() && !wanted_keys.contains(&r.key) {
                    f.notes.push(format!(
                        "{} holds only other controllers' endpoints: theirs now",
                        rule_name(r, &inst.url)
                    ));
                }
                continue;
            }
            if !wanted_keys.contains(&r.key) && named_ours.is_none() {
                // Someone else's rule on a key we do not want, at an address of this
                // cluster (another controller of it may serve its Nodes too): noted.
                f.notes.push(format!(
                    "{} holds endpoints [{}] at this cluster's addresses",
                    rule_name(r, &inst.url),
                    endpoints(&left)
                ));
                continue;
            }
            let kind = if wanted_keys.contains(&r.key) {
                Kind::Rules
            } else {
                Kind::OwnedOrphan
            };
            f.violation(
                kind,
                format!(
                    "endpoints [{}] of this cluster on the shared rule for {} on {} are wanted by no Service",
                    endpoints(&left),
                    r.key,
                    inst.url
                ),
                vec![rule_name(r, &inst.url)],
            );
        }
    }
}

fn endpoints(eps: &[loxi_domain::Endpoint]) -> String {
    eps.iter()
        .map(|e| format!("{}:{}", e.ip, e.target_port))
        .collect::<Vec<_>>()
        .join(",")
}
