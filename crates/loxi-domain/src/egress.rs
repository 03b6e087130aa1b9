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
//! The controller (`crates/loxi-ccm/src/egress/`) gathers every Egress with the addresses
//! of the pods it selects now, asks [`decide`] for the rules of all of them together and
//! what to say on each, and brings every loxilb to those rules.

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

/// Whether a pod with `labels` is selected by `selector` (every pair equal); an empty
/// selector selects no pod (kube-loxilb reads pods only for a non-empty one).
pub fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// One pod of an Egress's namespace, as far as egress needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodSource {
    pub labels: BTreeMap<String, String>,
    /// `status.podIPs`.
    pub ips: Vec<IpAddr>,
    /// Multus: its addresses per attached network, keyed as its
    /// `k8s.v1.cni.cncf.io/network-status` annotation spells the network (`namespace/name`).
    pub networks: BTreeMap<String, Vec<IpAddr>>,
    /// Neither being deleted nor finished: its address is its own (a finished pod's address
    /// may already be another pod's).
    pub live: bool,
}

/// The addresses of the live pods of `namespace` that `selector` selects: their pod IPs, or
/// with `multus_nets` (the Egress's `loxilb.io/multus-nets`, a network `name` meaning
/// `namespace/name`) their addresses on those networks instead. Sorted, unique.
pub fn pod_addresses(
    namespace: &str,
    selector: &BTreeMap<String, String>,
    multus_nets: &[String],
    pods: &[PodSource],
) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for pod in pods
        .iter()
        .filter(|p| p.live && selects(selector, &p.labels))
    {
        if multus_nets.is_empty() {
            out.extend(pod.ips.iter().copied());
            continue;
        }
        for net in multus_nets {
            let qualified = if net.contains('/') {
                net.clone()
            } else {
                format!("{namespace}/{net}")
            };
            let addrs = pod
                .networks
                .get(&qualified)
                .or_else(|| pod.networks.get(net));
            out.extend(addrs.into_iter().flatten().copied());
        }
    }
    out.sort();
    out.dedup();
    out
}

/// One Egress as the controller sees it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressInput {
    /// `namespace/name`.
    pub key: String,
    /// RFC 3339 creation time: the older of two Egresses naming one source keeps it.
    pub created: String,
    pub spec: EgressSpec,
    /// The addresses of the pods its selector selects now.
    pub pod_addresses: Vec<IpAddr>,
    /// Being deleted: its rules go.
    pub deleting: bool,
}

/// What is decided for one Egress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressVerdict {
    /// Its rules (those it holds; a source another Egress took is not among them), or why
    /// its spec cannot be programmed.
    pub rules: Result<Vec<SnatRule>, EgressError>,
    /// Sources it names that an older Egress holds: (source, that Egress's key).
    pub conflicts: Vec<(IpNet, String)>,
}

/// Every Egress's rules together: what each loxilb must hold of ours, and per live Egress
/// what it got.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    pub rules: Vec<SnatRule>,
    pub verdicts: BTreeMap<String, EgressVerdict>,
}

/// The rules of every live Egress (an Egress being deleted has none) at `preference`, one
/// per source: the oldest Egress naming a source holds it (then the first by key), the
/// others report the conflict. An invalid spec holds nothing and keeps nothing.
pub fn decide(inputs: &[EgressInput], preference: u16) -> Decision {
    let mut order: Vec<&EgressInput> = inputs.iter().filter(|e| !e.deleting).collect();
    order.sort_by(|a, b| (&a.created, &a.key).cmp(&(&b.created, &b.key)));
    let mut taken: BTreeMap<IpNet, &str> = BTreeMap::new();
    let mut decision = Decision::default();
    for e in order {
        let verdict = match plan(&e.spec, &e.pod_addresses, preference) {
            Err(err) => EgressVerdict {
                rules: Err(err),
                conflicts: Vec::new(),
            },
            Ok(rules) => {
                let mut held = Vec::new();
                let mut conflicts = Vec::new();
                for r in rules {
                    match taken.get(&r.source) {
                        Some(owner) => conflicts.push((r.source, owner.to_string())),
                        None => {
                            taken.insert(r.source, &e.key);
                            held.push(r);
                        }
                    }
                }
                decision.rules.extend(held.iter().copied());
                EgressVerdict {
                    rules: Ok(held),
                    conflicts,
                }
            }
        };
        decision.verdicts.insert(e.key.clone(), verdict);
    }
    decision.rules.sort();
    decision
}

/// One loxilb's last pass: `None` not reached (down), `Some(Err)` its refusal.
pub type Outcome<'a> = (&'a str, Option<Result<(), &'a str>>);

/// A condition to write: (type, status, reason, message).
pub type ConditionText = (&'static str, &'static str, &'static str, String);

/// What an Egress's status says, from its verdict and every loxilb's last pass (a pass
/// that succeeded holds every rule of the decision, so this Egress's too): `programmed`
/// "n/m" and the conditions `Accepted` and `Programmed`.
pub fn status(verdict: &EgressVerdict, outcomes: &[Outcome<'_>]) -> (String, Vec<ConditionText>) {
    let total = outcomes.len();
    let rules = match &verdict.rules {
        Err(e) => {
            return (
                format!("0/{total}"),
                vec![
                    ("Accepted", "False", "InvalidSpec", e.to_string()),
                    (
                        "Programmed",
                        "False",
                        "NotAccepted",
                        "the spec is not valid (condition Accepted)".to_string(),
                    ),
                ],
            );
        }
        Ok(rules) => rules,
    };
    let good = outcomes
        .iter()
        .filter(|(_, o)| matches!(o, Some(Ok(()))))
        .count();
    let programmed = format!("{good}/{total}");
    let accepted = ("Accepted", "True", "Valid", String::new());
    let mut trouble: Vec<String> = outcomes
        .iter()
        .filter_map(|(url, o)| match o {
            None => Some(format!("{url}: not reachable")),
            Some(Err(e)) => Some(format!("{url}: {e}")),
            Some(Ok(())) => None,
        })
        .collect();
    let condition = if !verdict.conflicts.is_empty() {
        let taken: Vec<String> = verdict
            .conflicts
            .iter()
            .map(|(source, owner)| format!("{source} is held by Egress {owner}"))
            .collect();
        trouble.insert(0, taken.join(", "));
        ("Programmed", "False", "SourceConflict", trouble.join("; "))
    } else if total == 0 {
        (
            "Programmed",
            "False",
            "NoLoxilb",
            "no loxilb to program".to_string(),
        )
    } else if good < total {
        (
            "Programmed",
            "False",
            "LoxilbNotProgrammed",
            trouble.join("; "),
        )
    } else {
        (
            "Programmed",
            "True",
            "Programmed",
            format!(
                "{} source(s) NATed to the vip on {good} loxilb(s)",
                rules.len()
            ),
        )
    };
    (programmed, vec![accepted, condition])
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

    fn input(key: &str, created: &str, addresses: &[&str], pods: &[&str]) -> EgressInput {
        EgressInput {
            key: key.into(),
            created: created.into(),
            spec: spec(addresses, "192.0.2.50"),
            pod_addresses: pods.iter().map(|p| p.parse().unwrap()).collect(),
            deleting: false,
        }
    }

    #[test]
    fn selectors_need_every_label_and_empty_selects_nothing() {
        let labels = BTreeMap::from([("app".to_string(), "web".to_string())]);
        assert!(selects(&labels, &labels));
        assert!(!selects(&BTreeMap::new(), &labels));
        let more = BTreeMap::from([
            ("app".to_string(), "web".to_string()),
            ("tier".to_string(), "x".to_string()),
        ]);
        assert!(!selects(&more, &labels));
    }

    #[test]
    fn pod_addresses_follow_labels_liveness_and_multus_networks() {
        let ip = |a: &str| -> IpAddr { a.parse().unwrap() };
        let labels = BTreeMap::from([("app".to_string(), "web".to_string())]);
        let pod = |ips: &[&str], live: bool| PodSource {
            labels: labels.clone(),
            ips: ips.iter().map(|a| ip(a)).collect(),
            networks: BTreeMap::from([("ns/macvlan1".to_string(), vec![ip("192.168.5.9")])]),
            live,
        };
        let other = PodSource {
            labels: BTreeMap::new(),
            ips: vec![ip("10.244.9.9")],
            ..PodSource::default()
        };
        let pods = [
            pod(&["10.244.1.5", "fd00::5"], true),
            pod(&["10.244.1.6"], false),
            other,
        ];
        assert_eq!(
            pod_addresses("ns", &labels, &[], &pods),
            vec![ip("10.244.1.5"), ip("fd00::5")]
        );
        assert_eq!(
            pod_addresses("ns", &labels, &["macvlan1".into()], &pods),
            vec![ip("192.168.5.9")]
        );
        assert!(pod_addresses("ns", &BTreeMap::new(), &[], &pods).is_empty());
    }

    #[test]
    fn the_older_egress_keeps_a_shared_source_and_the_other_reports_it() {
        let young = input(
            "ns/a",
            "2026-01-02T00:00:00Z",
            &["10.0.0.5"],
            &["10.244.0.9"],
        );
        let old = input("ns/b", "2026-01-01T00:00:00Z", &["10.0.0.5"], &[]);
        let d = decide(&[young, old], 50_001);
        assert_eq!(d.rules.len(), 2);
        assert!(d.verdicts["ns/b"].conflicts.is_empty());
        assert_eq!(
            d.verdicts["ns/a"].conflicts,
            vec![("10.0.0.5/32".parse().unwrap(), "ns/b".to_string())]
        );
        let (programmed, conds) = status(&d.verdicts["ns/a"], &[("http://l1", Some(Ok(())))]);
        assert_eq!(programmed, "1/1");
        assert_eq!(conds[1].2, "SourceConflict");
        assert!(
            conds[1].3.contains("10.0.0.5/32 is held by Egress ns/b"),
            "{conds:?}"
        );
        let (_, conds) = status(&d.verdicts["ns/b"], &[("http://l1", Some(Ok(())))]);
        assert_eq!((conds[1].1, conds[1].2), ("True", "Programmed"));
    }

    #[test]
    fn a_deleted_or_invalid_egress_holds_nothing() {
        let mut gone = input("ns/a", "t", &["10.0.0.5"], &[]);
        gone.deleting = true;
        let mut bad = input("ns/b", "t", &["10.0.0.6"], &[]);
        bad.spec.vip = "no".into();
        let d = decide(&[gone, bad], 50_001);
        assert!(d.rules.is_empty());
        assert!(!d.verdicts.contains_key("ns/a"));
        let (programmed, conds) = status(&d.verdicts["ns/b"], &[("u", Some(Ok(())))]);
        assert_eq!(programmed, "0/1");
        assert_eq!((conds[0].1, conds[0].2), ("False", "InvalidSpec"));
        assert!(conds[0].3.contains("spec.vip"), "{conds:?}");
    }

    #[test]
    fn programmed_counts_the_loxilbs_that_hold_the_rules() {
        let d = decide(&[input("ns/a", "t", &["10.0.0.5"], &[])], 50_001);
        let v = &d.verdicts["ns/a"];
        let (programmed, conds) = status(
            v,
            &[
                ("http://l1", Some(Ok(()))),
                ("http://l2", None),
                ("http://l3", Some(Err("rule-snat error"))),
            ],
        );
        assert_eq!(programmed, "1/3");
        assert_eq!((conds[1].1, conds[1].2), ("False", "LoxilbNotProgrammed"));
        assert!(conds[1].3.contains("http://l2: not reachable"), "{conds:?}");
        assert!(
            conds[1].3.contains("http://l3: rule-snat error"),
            "{conds:?}"
        );
        let (_, conds) = status(v, &[]);
        assert_eq!(conds[1].2, "NoLoxilb");
    }
}
