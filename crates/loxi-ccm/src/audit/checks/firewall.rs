//! The firewall rules this controller owns (`--source-ranges=firewall`,
//! docs/configuration.md#source-ranges), checked like its LB rules: on every loxilb whose
//! firewall could be listed, each served Service with source ranges has exactly its allow
//! and drop rules, and no rule of ours protects an address nobody wants. Which rules are
//! ours, and which a Service wants, is decided in `loxi_domain::firewall`.

use std::collections::{BTreeSet, HashMap, HashSet};

use loxi_domain::firewall::{FwRule, Preferences, split};
use loxi_domain::{Rule, RuleName};
use loxilb_client::firewall::owned_firewall_rule;

use super::{Desired, Findings, Kind, Snapshot, View, svc_name, unprogrammed_reason};

/// Per served Service, the firewall rules it should have.
pub(super) type DesiredFirewall<'a> = HashMap<(&'a str, &'a str), Vec<FwRule>>;

/// With `--source-ranges=firewall`, the LB rules without their source ranges and the
/// firewall rules that enforce them; otherwise the LB rules as planned and no firewall rule.
pub(super) fn split_desired<'a>(
    s: &Snapshot,
    desired: Desired<'a>,
) -> (Desired<'a>, DesiredFirewall<'a>) {
    let mut firewall = DesiredFirewall::new();
    if !s.settings.source_ranges_firewall {
        return (desired, firewall);
    }
    let prefs = Preferences::of(&s.cluster);
    let lb = desired
        .into_iter()
        .map(|(key, rules)| {
            let rules = rules.map(|rules| {
                let (lb, fw) = split(&rules, prefs);
                firewall.insert(key, fw);
                lb
            });
            (key, rules)
        })
        .collect();
    (lb, firewall)
}

type Dest = (std::net::IpAddr, u16, loxi_domain::Protocol);

/// Checks every listed firewall against `want` (module docs).
pub(super) fn check(
    s: &Snapshot,
    v: &View<'_>,
    desired: &Desired<'_>,
    want: &DesiredFirewall<'_>,
    f: &mut Findings,
) {
    let prefs = Preferences::of(&s.cluster);
    for inst in &s.instances {
        let Some(listing) = &inst.firewall else {
            continue;
        };
        let entries = match listing {
            Ok(entries) => entries,
            Err(e) => {
                f.notes.push(format!(
                    "loxilb {}: firewall not checked: it could not be listed: {e}",
                    inst.url
                ));
                continue;
            }
        };
        let held: BTreeSet<FwRule> = entries
            .iter()
            .filter_map(|e| owned_firewall_rule(e, prefs))
            .collect();
        // Services the planner refuses keep what they have: the addresses of their rules.
        let kept: HashSet<Dest> = match &inst.rules {
            Ok(rules) => rules
                .iter()
                .filter(|r| {
                    RuleName::parse(&r.name).is_some_and(|n| {
                        n.cluster == s.cluster.as_str()
                            && desired
                                .get(&(n.namespace.as_str(), n.service.as_str()))
                                .is_some_and(Option::is_none)
                    })
                })
                .map(|r: &Rule| (r.key.ip, r.key.port, r.key.protocol))
                .collect(),
            Err(_) => HashSet::new(),
        };
        let mut wanted: BTreeSet<FwRule> = BTreeSet::new();
        for (&(ns, name), rules) in want {
            let svc = v.services[&(ns, name)];
            let recorded = crate::service::context::recorded_group(svc);
            if recorded.is_none() && inst.group != s.settings.zone {
                continue;
            }
            if s.settings.group_of(svc) != inst.group {
                continue;
            }
            wanted.extend(rules.iter().copied());
            let reported = unprogrammed_reason(svc);
            for r in rules.iter().filter(|r| !held.contains(r)) {
                if let Some(reason) = reported {
                    f.notes.push(format!(
                        "{} lacks firewall rule {:?} on {}: reported by the Service ({reason})",
                        svc_name(ns, name),
                        r,
                        inst.url
                    ));
                    continue;
                }
                f.violation(
                    Kind::Rules,
                    format!(
                        "{ns}/{name} lacks its {:?} firewall rule from {} to {}:{}/{} on {}",
                        r.action, r.source, r.destination, r.port, r.protocol, inst.url
                    ),
                    vec![svc_name(ns, name), format!("loxilb {}", inst.url)],
                );
            }
        }
        for r in held.difference(&wanted) {
            if kept.contains(&(r.destination, r.port, r.protocol)) {
                continue;
            }
            f.violation(
                Kind::OwnedOrphan,
                format!(
                    "firewall rule of ours ({:?} from {} to {}:{}/{}, preference {}) on {} that no \
                     Service wants",
                    r.action, r.source, r.destination, r.port, r.protocol, r.preference, inst.url
                ),
                vec![format!("loxilb {}", inst.url)],
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{claim, kinds, owner, planned, service, snapshot};
    use super::super::{Kind, Snapshot, audit};
    use loxi_domain::firewall::{FwAction, FwRule, Preferences, split};
    use loxilb_client::firewall::to_firewall_entry;

    /// `--source-ranges=firewall`, one Service with a source range, and a loxilb holding
    /// its LB rule (without the range) and its allow and drop rules: clean.
    fn with_ranges() -> (Snapshot, Vec<FwRule>) {
        let mut web = service("web", "u1", 80, Some("192.0.2.1"));
        if let Some(spec) = web.spec.as_mut() {
            spec.load_balancer_source_ranges = Some(vec!["198.51.100.0/24".into()]);
        }
        let mut s = snapshot(
            vec![web],
            vec![claim("192.0.2.1", vec![owner("web", "u1", 80)])],
        );
        s.settings.enforce_source_ranges = true;
        s.settings.source_ranges_firewall = true;
        let (lb, fw) = split(&planned(&s), Preferences::of(&s.cluster));
        s.instances[0].rules = Ok(lb);
        s.instances[0].firewall = Some(Ok(fw.iter().map(to_firewall_entry).collect()));
        (s, fw)
    }

    #[test]
    fn a_service_holding_its_allow_and_drop_rules_is_clean() {
        let (s, fw) = with_ranges();
        assert_eq!(fw.len(), 2, "one allow rule and one drop rule: {fw:?}");
        let f = audit(&s);
        assert!(f.clean(), "{f}");
    }

    #[test]
    fn a_missing_drop_rule_is_a_violation_naming_the_service() {
        let (mut s, _) = with_ranges();
        if let Some(Ok(listed)) = &mut s.instances[0].firewall {
            listed.retain(|e| !e.opts.drop);
        }
        let f = audit(&s);
        assert_eq!(kinds(&f), vec![Kind::Rules], "{f}");
        assert!(f.violations[0].detail.contains("team/web"), "{f}");
        assert!(f.violations[0].detail.contains("Drop"), "{f}");
    }

    #[test]
    fn a_rule_of_ours_nobody_wants_is_an_orphan_and_others_rules_are_not_looked_at() {
        let (mut s, fw) = with_ranges();
        let prefs = Preferences::of(&s.cluster);
        let stale = FwRule {
            destination: "192.0.2.9".parse().unwrap(),
            port: 81,
            ..fw[0]
        };
        let foreign = FwRule {
            preference: prefs.drop.wrapping_add(100),
            action: FwAction::Drop,
            ..stale
        };
        if let Some(Ok(listed)) = &mut s.instances[0].firewall {
            listed.push(to_firewall_entry(&stale));
            listed.push(to_firewall_entry(&foreign));
        }
        let f = audit(&s);
        assert_eq!(kinds(&f), vec![Kind::OwnedOrphan], "{f}");
        assert!(f.violations[0].detail.contains("192.0.2.9:81"), "{f}");
        // A firewall that cannot be listed is noted, not checked.
        s.instances[0].firewall = Some(Err("refused".into()));
        let f = audit(&s);
        assert!(f.clean(), "{f}");
        assert!(
            f.notes.iter().any(|n| n.contains("firewall not checked")),
            "{f}"
        );
    }
}
