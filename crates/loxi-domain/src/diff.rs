//! Desired vs observed rules -> the smallest set of loxilb calls (CONTRACT.md §2.5).

use std::collections::HashMap;

use crate::model::{Rule, RuleKey};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Not in loxilb: POST it.
    Create(Rule),
    /// In loxilb with other endpoints or selection: POST the whole rule, loxilb updates it in
    /// place and keeps the sessions of unchanged endpoints.
    Update(Rule),
    /// In loxilb with a field it never updates in place (name, monitor, managed, mode):
    /// DELETE, then POST.
    Recreate(Rule),
    /// Owned by us but no longer wanted: DELETE.
    Delete(Rule),
    /// A rule we do not own sits on a key we want: never touched, reported.
    Conflict { wanted: Rule, foreign_name: String },
}

/// Compares `desired` with `observed`. `observed` may hold rules of other Services and of
/// other owners: only rules for which `owned` is true are ever deleted or replaced.
pub fn diff_rules(
    desired: &[Rule],
    observed: &[Rule],
    owned: impl Fn(&Rule) -> bool,
) -> Vec<Action> {
    let by_key: HashMap<RuleKey, &Rule> = observed.iter().map(|r| (r.key, r)).collect();
    let mut actions = Vec::new();
    for want in desired {
        let want = want.clone().normalized();
        match by_key.get(&want.key) {
            None => actions.push(Action::Create(want)),
            Some(have) if !owned(have) => actions.push(Action::Conflict {
                foreign_name: have.name.clone(),
                wanted: want,
            }),
            Some(have) => {
                let have = (*have).clone().normalized();
                if have == want {
                    continue;
                }
                let fixed_at_create = have.name != want.name
                    || have.monitor != want.monitor
                    || have.managed != want.managed
                    || have.mode != want.mode;
                actions.push(if fixed_at_create {
                    Action::Recreate(want)
                } else {
                    Action::Update(want)
                });
            }
        }
    }
    let wanted: std::collections::HashSet<RuleKey> = desired.iter().map(|r| r.key).collect();
    for have in observed {
        if owned(have) && !wanted.contains(&have.key) {
            actions.push(Action::Delete(have.clone()));
        }
    }
    actions
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Endpoint, EndpointSelection, NatMode, Protocol};

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
            endpoints: eps
                .iter()
                .map(|ip| Endpoint {
                    ip: ip.parse().unwrap(),
                    target_port: 30000,
                    weight: 1,
                })
                .collect(),
            monitor: false,
            managed: true,
        }
    }

    fn ours(r: &Rule) -> bool {
        r.name.starts_with("ccm-")
    }

    #[test]
    fn converged_state_needs_nothing() {
        let d = vec![rule(80, "ccm-a", &["10.0.0.1", "10.0.0.2"])];
        let o = vec![rule(80, "ccm-a", &["10.0.0.2", "10.0.0.1"])];
        assert!(diff_rules(&d, &o, ours).is_empty());
    }

    #[test]
    fn create_update_recreate_delete() {
        let d = vec![
            rule(80, "ccm-a", &["10.0.0.1"]),
            rule(81, "ccm-a", &["10.0.0.3"]),
            rule(82, "ccm-b", &["10.0.0.1"]),
        ];
        let o = vec![
            rule(81, "ccm-a", &["10.0.0.1"]),
            rule(82, "ccm-old", &["10.0.0.1"]),
            rule(83, "ccm-a", &["10.0.0.1"]),
            rule(84, "someone-else", &["10.0.0.9"]),
        ];
        let a = diff_rules(&d, &o, ours);
        assert_eq!(
            a,
            vec![
                Action::Create(d[0].clone()),
                Action::Update(d[1].clone()),
                Action::Recreate(d[2].clone()),
                Action::Delete(o[2].clone()),
            ]
        );
    }

    #[test]
    fn foreign_rule_on_wanted_key_is_a_conflict() {
        let d = vec![rule(80, "ccm-a", &["10.0.0.1"])];
        let o = vec![rule(80, "kube-loxilb-rule", &["10.0.0.1"])];
        assert_eq!(
            diff_rules(&d, &o, ours),
            vec![Action::Conflict {
                wanted: d[0].clone(),
                foreign_name: "kube-loxilb-rule".into()
            }]
        );
    }
}
