//! Rules shared with other controllers (`--appendEPs`, kube-loxilb's spelling): several
//! clusters or controllers put their endpoints on one loxilb rule (same address, port and
//! protocol). Each adds its endpoints with `oper` 1 (attach) and takes them off with `oper` 2
//! (detach) (docs/loxilb-api.md#updates); loxilb deletes the rule when its last endpoint goes.
//!
//! So a controller never deletes a shared rule outright, never replaces its endpoint list,
//! and compares only its own endpoints with what loxilb holds: endpoints it did not attach
//! are someone else's and are never looked at. What it attached is what it remembers
//! (`ours`); only those are ever detached. A controller that restarted remembers nothing:
//! it recognises as its own the endpoints it wants that loxilb holds on the keys it wants
//! ([`recognised`]), so it can detach them later, and never anything else.

use std::collections::BTreeMap;

use crate::model::{Endpoint, Rule, RuleKey};

/// One write to a shared rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SharedAction {
    /// POST with `oper` 1: the rule with every endpoint of ours (loxilb adds the missing
    /// ones, re-weights the others and keeps everyone else's; a missing rule is created).
    Attach(Rule),
    /// POST with `oper` 2: the rule with the endpoints of ours to take off.
    Detach(Rule),
}

impl SharedAction {
    pub fn rule(&self) -> &Rule {
        match self {
            SharedAction::Attach(r) | SharedAction::Detach(r) => r,
        }
    }
}

fn same_target(a: &Endpoint, b: &Endpoint) -> bool {
    a.ip == b.ip && a.target_port == b.target_port
}

/// The writes that give loxilb our endpoints `desired` (one Service's rules), where
/// `observed` is what loxilb holds on a key and `ours` what this controller attached to the
/// Service's keys before. Attaches come first: taking our old endpoints off before the new
/// ones are on could empty the rule, which loxilb then deletes.
pub fn diff_shared<'a>(
    desired: &[Rule],
    observed: impl Fn(&RuleKey) -> Option<&'a Rule>,
    ours: &BTreeMap<RuleKey, Vec<Endpoint>>,
) -> Vec<SharedAction> {
    let mut attaches = Vec::new();
    let mut detaches = Vec::new();
    for want in desired {
        let want = want.clone().normalized();
        let have = observed(&want.key);
        let missing = match have {
            None => true,
            // A weight counts: attach re-weights an endpoint that is there.
            Some(have) => want.endpoints.iter().any(|e| !have.endpoints.contains(e)),
        };
        let stale: Vec<Endpoint> = ours
            .get(&want.key)
            .into_iter()
            .flatten()
            .filter(|old| !want.endpoints.iter().any(|e| same_target(e, old)))
            .filter(|old| have.is_some_and(|h| h.endpoints.iter().any(|e| same_target(e, old))))
            .copied()
            .collect();
        if !stale.is_empty() {
            detaches.push(SharedAction::Detach(Rule {
                endpoints: stale,
                ..want.clone()
            }));
        }
        if missing {
            attaches.push(SharedAction::Attach(want));
        }
    }
    // Keys of ours the Service no longer wants (a port removed, the Service deleted).
    for (key, endpoints) in ours {
        if desired.iter().any(|r| r.key == *key) {
            continue;
        }
        let Some(have) = observed(key) else {
            continue;
        };
        let stale: Vec<Endpoint> = endpoints
            .iter()
            .filter(|old| have.endpoints.iter().any(|e| same_target(e, old)))
            .copied()
            .collect();
        if !stale.is_empty() {
            detaches.push(SharedAction::Detach(Rule {
                endpoints: stale,
                ..have.clone()
            }));
        }
    }
    attaches.extend(detaches);
    attaches
}

/// The endpoints of `desired` (one Service's rules) that loxilb holds on their keys: ours,
/// whoever attached them, since loxilb keeps one entry per target (address and port). A
/// restarted controller learns back what it attached from these; an endpoint it wants no
/// longer is not among them (docs/configuration.md#shared-rules).
pub fn recognised<'a>(
    desired: &[Rule],
    observed: impl Fn(&RuleKey) -> Option<&'a Rule>,
) -> BTreeMap<RuleKey, Vec<Endpoint>> {
    let mut out = BTreeMap::new();
    for want in desired {
        let Some(have) = observed(&want.key) else {
            continue;
        };
        let held: Vec<Endpoint> = want
            .endpoints
            .iter()
            .filter(|e| have.endpoints.iter().any(|h| same_target(h, e)))
            .copied()
            .collect();
        if !held.is_empty() {
            out.insert(want.key, held);
        }
    }
    out
}

/// `found` added to `ours` (an endpoint known already keeps one entry).
pub fn join(ours: &mut BTreeMap<RuleKey, Vec<Endpoint>>, found: BTreeMap<RuleKey, Vec<Endpoint>>) {
    for (key, endpoints) in found {
        let mine = ours.entry(key).or_default();
        for e in endpoints {
            mine.retain(|m| !same_target(m, &e));
            mine.push(e);
        }
        mine.sort();
    }
}

/// Our endpoints of `want` that loxilb's rule `have` lacks or holds with another weight: what
/// an attach would send, and what the audit reports. Endpoints of others are not looked at.
pub fn lacking(want: &Rule, have: Option<&Rule>) -> Vec<Endpoint> {
    want.endpoints
        .iter()
        .filter(|e| have.is_none_or(|h| !h.endpoints.contains(e)))
        .copied()
        .collect()
}

/// What loxilb holds on the key after `action` was applied to `have` (`None`: the rule is
/// gone, its last endpoint detached).
pub fn after(have: Option<&Rule>, action: &SharedAction) -> Option<Rule> {
    match (action, have) {
        (SharedAction::Attach(want), None) => Some(want.clone()),
        (SharedAction::Attach(want), Some(have)) => {
            let mut rule = have.clone();
            for e in &want.endpoints {
                rule.endpoints.retain(|h| !same_target(h, e));
                rule.endpoints.push(*e);
            }
            Some(rule.normalized())
        }
        (SharedAction::Detach(_), None) => None,
        (SharedAction::Detach(gone), Some(have)) => {
            let mut rule = have.clone();
            rule.endpoints
                .retain(|h| !gone.endpoints.iter().any(|e| same_target(h, e)));
            (!rule.endpoints.is_empty()).then_some(rule)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{EndpointSelection, NatMode, Probe, Protocol};

    fn ep(ip: &str) -> Endpoint {
        Endpoint {
            ip: ip.parse().unwrap(),
            target_port: 30080,
            weight: 1,
        }
    }

    fn rule(port: u16, name: &str, eps: &[&str]) -> Rule {
        Rule {
            key: RuleKey {
                ip: "192.0.2.1".parse().unwrap(),
                port,
                protocol: Protocol::Tcp,
            },
            name: name.into(),
            mode: NatMode::Default,
            selection: EndpointSelection::RoundRobin,
            endpoints: eps.iter().map(|i| ep(i)).collect(),
            monitor: false,
            managed: true,
            probe: Probe::default(),
            inactive_timeout: 0,
            proxy_protocol_v2: false,
            allowed_sources: vec![],
            secondary_ips: vec![],
            bgp: false,
            private_ip: None,
            egress: false,
        }
        .normalized()
    }

    fn ours(entries: &[(u16, &[&str])]) -> BTreeMap<RuleKey, Vec<Endpoint>> {
        entries
            .iter()
            .map(|(port, eps)| {
                (
                    rule(*port, "x", &[]).key,
                    eps.iter().map(|i| ep(i)).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn someone_elses_endpoints_are_never_compared_nor_touched() {
        let want = vec![rule(80, "ccm-a", &["10.0.0.1"])];
        // The rule is someone else's, with our endpoint on it and theirs.
        let have = rule(80, "other-cluster", &["10.0.0.1", "10.9.9.9"]);
        let none = BTreeMap::new();
        assert!(diff_shared(&want, |_| Some(&have), &none).is_empty());
        assert!(diff_shared(&want, |_| Some(&have), &ours(&[(80, &["10.0.0.1"])])).is_empty());
    }

    #[test]
    fn missing_endpoints_are_attached_stale_ones_detached_after() {
        let want = vec![rule(80, "ccm-a", &["10.0.0.2"])];
        let have = rule(80, "other", &["10.0.0.1", "10.9.9.9"]);
        let mine = ours(&[(80, &["10.0.0.1"])]);
        let actions = diff_shared(&want, |_| Some(&have), &mine);
        assert_eq!(
            actions,
            vec![
                SharedAction::Attach(want[0].clone()),
                SharedAction::Detach(rule(80, "ccm-a", &["10.0.0.1"])),
            ]
        );
        // A missing rule is created by the attach.
        let created = diff_shared(&want, |_| None, &BTreeMap::new());
        assert_eq!(created, vec![SharedAction::Attach(want[0].clone())]);
        // A weight change is attached again.
        let mut heavier = want.clone();
        heavier[0].endpoints[0].weight = 5;
        let have = rule(80, "other", &["10.0.0.2"]);
        assert_eq!(
            diff_shared(&heavier, |_| Some(&have), &BTreeMap::new()).len(),
            1
        );
    }

    #[test]
    fn keys_no_longer_wanted_lose_only_our_endpoints() {
        let have = rule(81, "other", &["10.0.0.1", "10.9.9.9"]);
        let mine = ours(&[(81, &["10.0.0.1", "10.0.0.3"])]);
        let actions = diff_shared(&[], |_| Some(&have), &mine);
        assert_eq!(actions.len(), 1);
        let SharedAction::Detach(gone) = &actions[0] else {
            panic!("{actions:?}")
        };
        assert_eq!(gone.endpoints, vec![ep("10.0.0.1")]);
        assert_eq!(gone.name, "other", "the rule as loxilb holds it");
        // The rule is gone already: nothing to do.
        assert!(diff_shared(&[], |_| None, &mine).is_empty());
    }

    #[test]
    fn a_restarted_controller_recognises_only_what_it_wants() {
        let want = vec![
            rule(80, "ccm-a", &["10.0.0.1", "10.0.0.2"]),
            rule(81, "ccm-a", &["10.0.0.1"]),
        ];
        // loxilb holds one of ours and someone else's on port 80, nothing on 81.
        let have = rule(80, "other", &["10.0.0.1", "10.9.9.9"]);
        let found = recognised(&want, |k| (k.port == 80).then_some(&have));
        assert_eq!(found, ours(&[(80, &["10.0.0.1"])]));
        // Joined with what is remembered: one entry per target.
        let mut mine = ours(&[(80, &["10.0.0.1", "10.0.0.3"])]);
        join(&mut mine, found);
        assert_eq!(mine, ours(&[(80, &["10.0.0.1", "10.0.0.3"])]));
        // Once recognised, a target the Service drops is detached, the other's never.
        let now = vec![rule(80, "ccm-a", &["10.0.0.2"])];
        let actions = diff_shared(&now, |_| Some(&have), &mine);
        assert_eq!(
            actions,
            vec![
                SharedAction::Attach(now[0].clone()),
                SharedAction::Detach(rule(80, "ccm-a", &["10.0.0.1"])),
            ]
        );
    }

    #[test]
    fn lacking_counts_weights_and_ignores_others() {
        let want = rule(80, "ccm-a", &["10.0.0.1", "10.0.0.2"]);
        let have = rule(80, "other", &["10.0.0.1", "10.9.9.9"]);
        assert_eq!(lacking(&want, Some(&have)), vec![ep("10.0.0.2")]);
        assert_eq!(lacking(&want, None).len(), 2);
        let mut heavier = have.clone();
        heavier.endpoints[0].weight = 3;
        assert_eq!(lacking(&want, Some(&heavier)).len(), 2);
    }

    #[test]
    fn the_table_after_each_write() {
        let have = rule(80, "other", &["10.9.9.9"]);
        let attach = SharedAction::Attach(rule(80, "ccm-a", &["10.0.0.1"]));
        let both = after(Some(&have), &attach).unwrap();
        assert_eq!(both.endpoints, vec![ep("10.0.0.1"), ep("10.9.9.9")]);
        assert_eq!(both.name, "other");
        let detach = SharedAction::Detach(rule(80, "ccm-a", &["10.0.0.1"]));
        assert_eq!(after(Some(&both), &detach), Some(have.clone()));
        let last = SharedAction::Detach(rule(80, "ccm-a", &["10.9.9.9"]));
        assert_eq!(
            after(Some(&have), &last),
            None,
            "the last endpoint takes the rule"
        );
        assert_eq!(after(None, &attach).unwrap().name, "ccm-a");
    }
}
