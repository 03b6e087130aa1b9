//! The Egresses' SNAT firewall rules (`--egress`, `crate::egress`), checked like the LB
//! rules: on every loxilb whose firewall could be listed, our SNAT rules are exactly those
//! `loxi_domain::egress::decide` wants for the Egresses and the pods they select now; a
//! missing one is a `rules` violation, one of ours nobody wants an `owned-orphan`. A rule of
//! another preference or shape is not ours and never looked at.

use std::collections::BTreeSet;

use loxi_domain::egress::{SnatRule, decide, snat_preference};
use loxilb_client::firewall::owned_snat_rule;

use super::{Findings, Kind, Snapshot};

/// Checks every listed firewall against the Egresses' rules (module docs).
pub(super) fn check(s: &Snapshot, f: &mut Findings) {
    let Some(egresses) = &s.egresses else {
        return;
    };
    let preference = snat_preference(&s.cluster);
    let decision = decide(egresses, preference);
    let wanted: BTreeSet<SnatRule> = decision.rules.iter().copied().collect();
    let owner = |r: &SnatRule| {
        decision
            .verdicts
            .iter()
            .find(|(_, v)| v.rules.as_ref().is_ok_and(|rules| rules.contains(r)))
            .map(|(key, _)| key.clone())
            .unwrap_or_default()
    };
    for inst in &s.instances {
        let Some(Ok(entries)) = &inst.firewall else {
            // Not listed: the source-range check notes it.
            continue;
        };
        let held: BTreeSet<SnatRule> = entries
            .iter()
            .filter_map(|e| owned_snat_rule(e, preference))
            .collect();
        for r in wanted.difference(&held) {
            let key = owner(r);
            f.violation(
                Kind::Rules,
                format!(
                    "Egress {key} lacks its SNAT rule from {} to {} on {}",
                    r.source, r.to, inst.url
                ),
                vec![format!("Egress {key}"), format!("loxilb {}", inst.url)],
            );
        }
        for r in held.difference(&wanted) {
            f.violation(
                Kind::OwnedOrphan,
                format!(
                    "SNAT rule of ours (from {} to {}, preference {}) on {} that no Egress wants",
                    r.source, r.to, r.preference, inst.url
                ),
                vec![format!("loxilb {}", inst.url)],
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{claim, kinds, owner, service, snapshot};
    use super::super::{Kind, audit};
    use loxi_domain::egress::{EgressInput, EgressSpec, SnatRule, decide, snat_preference};
    use loxilb_client::firewall::to_snat_entry;

    fn input(key: &str, addresses: &[&str], pods: &[&str], deleting: bool) -> EgressInput {
        EgressInput {
            key: key.into(),
            created: "2026-01-01T00:00:00Z".into(),
            spec: EgressSpec {
                addresses: addresses.iter().map(|a| a.to_string()).collect(),
                vip: "172.18.0.254".into(),
                selector: Default::default(),
            },
            pod_addresses: pods.iter().map(|p| p.parse().unwrap()).collect(),
            deleting,
        }
    }

    /// A converged cluster with one Egress whose rules the loxilb holds, plus a SNAT rule
    /// of another controller (another preference): clean.
    fn with_egress() -> (super::Snapshot, Vec<SnatRule>) {
        let mut s = snapshot(
            vec![service("web", "u1", 80, Some("192.0.2.1"))],
            vec![claim("192.0.2.1", vec![owner("web", "u1", 80)])],
        );
        let egresses = vec![input("team/eg", &["10.42.0.0/24"], &["10.244.1.5"], false)];
        let rules = decide(&egresses, snat_preference(&s.cluster)).rules;
        let foreign = SnatRule {
            source: "10.99.0.1/32".parse().unwrap(),
            to: "172.18.0.99".parse().unwrap(),
            preference: 7,
        };
        let mut listed: Vec<_> = rules.iter().map(to_snat_entry).collect();
        listed.push(to_snat_entry(&foreign));
        s.instances[0].firewall = Some(Ok(listed));
        s.egresses = Some(egresses);
        (s, rules)
    }

    #[test]
    fn held_as_decided_is_clean_and_foreign_rules_are_not_ours() {
        let (s, rules) = with_egress();
        assert_eq!(rules.len(), 2);
        let f = audit(&s);
        assert!(f.clean(), "{f}");
    }

    #[test]
    fn a_missing_snat_rule_names_the_egress() {
        let (mut s, _) = with_egress();
        if let Some(Ok(listed)) = &mut s.instances[0].firewall {
            listed.retain(|e| e.rule_arguments.source_ip != "10.244.1.5/32");
        }
        let f = audit(&s);
        assert_eq!(kinds(&f), vec![Kind::Rules], "{f}");
        assert!(f.violations[0].detail.contains("team/eg"), "{f}");
        assert!(f.violations[0].detail.contains("10.244.1.5/32"), "{f}");
    }

    #[test]
    fn a_rule_of_a_pod_that_left_or_a_deleted_egress_is_an_orphan() {
        // The pod left the selector: its rule is still held.
        let (mut s, _) = with_egress();
        s.egresses = Some(vec![input("team/eg", &["10.42.0.0/24"], &[], false)]);
        let f = audit(&s);
        assert_eq!(kinds(&f), vec![Kind::OwnedOrphan], "{f}");
        assert!(f.violations[0].detail.contains("10.244.1.5/32"), "{f}");
        // The Egress is being deleted: both of its rules are orphans.
        s.egresses = Some(vec![input("team/eg", &["10.42.0.0/24"], &[], true)]);
        let f = audit(&s);
        assert_eq!(kinds(&f), vec![Kind::OwnedOrphan, Kind::OwnedOrphan], "{f}");
        // Egress off (or its kind not served): nothing checked.
        s.egresses = None;
        assert!(audit(&s).clean());
    }
}
