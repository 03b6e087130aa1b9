//! Source ranges enforced with loxilb's firewall (`--source-ranges=firewall`,
//! docs/configuration.md#source-ranges) instead of the rules' `allowedSources`, which stop
//! every load-balanced flow of a loxilb while any rule carries them (loxilb issue #1036,
//! docs/loxilb-api.md#source-ranges).
//!
//! For a rule `VIP:port/proto` with source ranges `R1..Rn`, the firewall gets one *allow*
//! rule per range (source `Ri`, destination `VIP/32` or `/128`, that port and protocol) and
//! one *drop* rule for every other source to the same destination, port and protocol, at a
//! lower preference: loxilb matches the highest preference first
//! (docs/loxilb-api.md#firewall). Nothing else is matched, so every other address, port and
//! protocol of the loxilb is untouched.
//!
//! Firewall rules have no name. Ours are told apart by their *preference*: a pair (drop,
//! allow = drop + 1) derived from the controller's identity (the id in its rule names), in a
//! band hand-written rules rarely use. A rule is ours when it has one of our two
//! preferences, a single-address destination, any source port, no incoming-port match, one
//! protocol of ours, and our action for that preference; any other rule is never touched.
//! Allow rules carry no mark: loxilb uses a firewall mark as the `block` of the LB rule it
//! looks up, so a marked packet would miss the Service's rule.

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::model::{Protocol, Rule};
use crate::naming::ClusterId;

/// Lowest preference of the band our firewall rules use.
pub const PREFERENCE_BASE: u16 = 40_000;
/// Controllers' preference pairs in the band: `PREFERENCE_BASE + 2 * slot`, slot < this.
pub const PREFERENCE_SLOTS: u16 = 4_096;

/// What a firewall rule of ours does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum FwAction {
    Allow,
    Drop,
}

/// One loxilb firewall rule as loxi-ccm writes it: a source prefix to one address, port and
/// protocol, at a preference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FwRule {
    /// Canonical (network) form.
    pub source: IpNet,
    /// The Service's address.
    pub destination: IpAddr,
    pub port: u16,
    pub protocol: Protocol,
    pub preference: u16,
    pub action: FwAction,
}

impl FwRule {
    /// The destination as loxilb keys it: a host prefix.
    pub fn destination_prefix(&self) -> IpNet {
        IpNet::from(self.destination)
    }
}

/// The IP protocol number loxilb's firewall matches on.
pub fn protocol_number(p: Protocol) -> u8 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

/// The protocol of a firewall protocol number, if it is one of ours.
pub fn protocol_of(number: u8) -> Option<Protocol> {
    match number {
        6 => Some(Protocol::Tcp),
        17 => Some(Protocol::Udp),
        132 => Some(Protocol::Sctp),
        _ => None,
    }
}

/// The two preferences of one controller's firewall rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preferences {
    pub drop: u16,
    pub allow: u16,
}

impl Preferences {
    /// From the id this controller writes in its rule names
    /// (`ClusterId::for_controller`): stable across restarts and replicas. Two controllers
    /// sharing a loxilb get the same pair with a chance of 1 in [`PREFERENCE_SLOTS`]
    /// (docs/configuration.md#source-ranges).
    pub fn of(owner: &ClusterId) -> Preferences {
        let slot = crate::selection::fnv1a(&[b"fw", owner.as_str().as_bytes()])
            % u64::from(PREFERENCE_SLOTS);
        let drop = PREFERENCE_BASE + 2 * u16::try_from(slot).unwrap_or(0);
        Preferences {
            drop,
            allow: drop + 1,
        }
    }

    /// Whether a rule with these fields is one of ours (module docs). `destination_host`:
    /// the destination is a single address; `plain`: any source port, no incoming port, no
    /// mark, no other action than allow or drop.
    pub fn owns(
        &self,
        preference: u16,
        action: FwAction,
        destination_host: bool,
        plain: bool,
    ) -> bool {
        destination_host
            && plain
            && ((preference == self.allow && action == FwAction::Allow)
                || (preference == self.drop && action == FwAction::Drop))
    }
}

/// The firewall rules that enforce the source ranges of `rules` (each rule's
/// `allowed_sources`), and the rules without them for loxilb's LB table.
pub fn split(rules: &[Rule], prefs: Preferences) -> (Vec<Rule>, Vec<FwRule>) {
    let mut firewall = Vec::new();
    let lb = rules
        .iter()
        .map(|r| {
            let mut r = r.clone();
            firewall.extend(for_rule(&r, prefs));
            r.allowed_sources.clear();
            r
        })
        .collect();
    (lb, firewall)
}

/// The firewall rules of one LB rule (none without source ranges).
pub fn for_rule(rule: &Rule, prefs: Preferences) -> Vec<FwRule> {
    if rule.allowed_sources.is_empty() {
        return Vec::new();
    }
    let base = |source: IpNet, preference: u16, action: FwAction| FwRule {
        source: source.trunc(),
        destination: rule.key.ip,
        port: rule.key.port,
        protocol: rule.key.protocol,
        preference,
        action,
    };
    // Only the ranges of the VIP's family can match: loxilb keys prefixes by family.
    let mut v: Vec<FwRule> = rule
        .allowed_sources
        .iter()
        .filter(|s| s.addr().is_ipv4() == rule.key.ip.is_ipv4())
        .map(|s| base(*s, prefs.allow, FwAction::Allow))
        .collect();
    let any = if rule.key.ip.is_ipv4() {
        IpNet::V4(ipnet::Ipv4Net::default())
    } else {
        IpNet::V6(ipnet::Ipv6Net::default())
    };
    v.push(base(any, prefs.drop, FwAction::Drop));
    v.sort();
    v.dedup();
    v
}

/// The calls that take a loxilb from `held` (ours) to `desired`, in an order that never
/// drops an allowed client and never leaves a restricted port open longer than needed:
/// new allow rules, drop rules no longer wanted, new drop rules, then allow rules no longer
/// wanted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FwChanges {
    pub create: Vec<FwRule>,
    pub delete: Vec<FwRule>,
}

/// One call of a [`FwChanges`] in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FwCall {
    Create(FwRule),
    Delete(FwRule),
}

impl FwChanges {
    pub fn is_empty(&self) -> bool {
        self.create.is_empty() && self.delete.is_empty()
    }

    /// The calls in the safe order (see [`diff`]).
    pub fn ordered(&self) -> Vec<FwCall> {
        let of = |v: &[FwRule], a: FwAction| -> Vec<FwRule> {
            v.iter().filter(|r| r.action == a).copied().collect()
        };
        let mut calls: Vec<FwCall> = Vec::new();
        calls.extend(
            of(&self.create, FwAction::Allow)
                .into_iter()
                .map(FwCall::Create),
        );
        calls.extend(
            of(&self.delete, FwAction::Drop)
                .into_iter()
                .map(FwCall::Delete),
        );
        calls.extend(
            of(&self.create, FwAction::Drop)
                .into_iter()
                .map(FwCall::Create),
        );
        calls.extend(
            of(&self.delete, FwAction::Allow)
                .into_iter()
                .map(FwCall::Delete),
        );
        calls
    }
}

/// What to create and delete so that the rules of ours in `held` become `desired`
/// (both within one scope: a Service's addresses, or a whole loxilb).
pub fn diff<'a>(
    desired: impl IntoIterator<Item = &'a FwRule>,
    held: impl IntoIterator<Item = &'a FwRule>,
) -> FwChanges {
    let desired: BTreeSet<FwRule> = desired.into_iter().copied().collect();
    let held: BTreeSet<FwRule> = held.into_iter().copied().collect();
    FwChanges {
        create: desired.difference(&held).copied().collect(),
        delete: held.difference(&desired).copied().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::RuleKey;

    fn rule(ip: &str, port: u16, sources: &[&str]) -> Rule {
        Rule {
            key: RuleKey {
                ip: ip.parse().unwrap(),
                port,
                protocol: Protocol::Tcp,
            },
            name: "x".into(),
            mode: crate::model::NatMode::Default,
            selection: crate::model::EndpointSelection::RoundRobin,
            endpoints: vec![],
            monitor: false,
            managed: true,
            probe: crate::model::Probe::default(),
            inactive_timeout: 0,
            proxy_protocol_v2: false,
            egress: false,
            allowed_sources: sources.iter().map(|s| s.parse().unwrap()).collect(),
            secondary_ips: vec![],
            bgp: false,
            private_ip: None,
        }
    }

    #[test]
    fn preferences_are_stable_per_owner_and_in_the_band() {
        let a = Preferences::of(&ClusterId::new("3f2504e0").unwrap());
        assert_eq!(a, Preferences::of(&ClusterId::new("3f2504e0").unwrap()));
        assert_eq!(a.allow, a.drop + 1);
        assert!(a.drop >= PREFERENCE_BASE && a.allow < PREFERENCE_BASE + 2 * PREFERENCE_SLOTS);
        let b = Preferences::of(&ClusterId::new("3f2504e1").unwrap());
        assert_ne!(a, b);
        assert!(a.owns(a.allow, FwAction::Allow, true, true));
        assert!(!a.owns(a.allow, FwAction::Drop, true, true));
        assert!(
            !a.owns(a.drop, FwAction::Drop, false, true),
            "a network destination"
        );
        assert!(
            !a.owns(a.drop, FwAction::Drop, true, false),
            "a mark or a port name"
        );
    }

    #[test]
    fn a_rule_with_ranges_gets_allows_above_one_drop() {
        let prefs = Preferences {
            drop: 40_000,
            allow: 40_001,
        };
        let rules = [
            rule(
                "192.0.2.10",
                80,
                &["198.51.100.7/24", "2001:db8::/32", "10.0.0.0/8"],
            ),
            rule("192.0.2.11", 80, &[]),
        ];
        let (lb, fw) = split(&rules, prefs);
        assert!(lb.iter().all(|r| r.allowed_sources.is_empty()));
        let shown: Vec<(String, FwAction, u16)> = fw
            .iter()
            .map(|r| (r.source.to_string(), r.action, r.preference))
            .collect();
        assert_eq!(
            shown,
            [
                ("0.0.0.0/0".to_string(), FwAction::Drop, 40_000),
                ("10.0.0.0/8".to_string(), FwAction::Allow, 40_001),
                ("198.51.100.0/24".to_string(), FwAction::Allow, 40_001),
            ],
            "the IPv6 range cannot match an IPv4 address"
        );
        assert!(
            fw.iter()
                .all(|r| r.destination.to_string() == "192.0.2.10" && r.port == 80)
        );
    }

    #[test]
    fn changes_never_drop_allowed_clients() {
        let prefs = Preferences {
            drop: 40_000,
            allow: 40_001,
        };
        let before = for_rule(&rule("192.0.2.10", 80, &["198.51.100.0/24"]), prefs);
        let after = for_rule(&rule("192.0.2.10", 80, &["203.0.113.0/24"]), prefs);
        let calls = diff(&after, &before).ordered();
        assert_eq!(calls.len(), 2);
        assert!(matches!(calls[0], FwCall::Create(r) if r.action == FwAction::Allow));
        assert!(matches!(calls[1], FwCall::Delete(r) if r.action == FwAction::Allow));
        // Ranges added: allows before the drop. Ranges removed: the drop goes first.
        let added = diff(&before, &[]).ordered();
        assert!(matches!(added.last(), Some(FwCall::Create(r)) if r.action == FwAction::Drop));
        let removed = diff(&[], &before).ordered();
        assert!(matches!(removed.first(), Some(FwCall::Delete(r)) if r.action == FwAction::Drop));
        assert!(diff(&before, &before).is_empty());
    }
}
