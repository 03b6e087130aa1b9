//! What one BGP pass on a loxilb sends, decided without I/O: the steps that bring what the
//! loxilb holds to a [`BgpConfig`], in loxilb's dependency order (the module docs of
//! `loxilb::bgp`). The pass in `loxilb::bgp` executes them one by one.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

use loxilb_client::bgp::{
    BgpDefinedSet, BgpNeighbor, BgpNeighborStatus, BgpPolicy, BgpPolicyApply, DefinedSetKind,
};

/// goBGP's global settings; the router id per loxilb.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobalSettings {
    /// `None`: each loxilb's own IPv4 address from its URL.
    pub router_id: Option<Ipv4Addr>,
    pub local_as: u32,
    /// 0: 179.
    pub listen_port: u16,
}

/// Everything this controller wants on every loxilb's goBGP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BgpConfig {
    pub global: GlobalSettings,
    pub peers: Vec<BgpNeighbor>,
    pub sets: Vec<(ItemId, DefinedSetKind, BgpDefinedSet)>,
    pub policies: Vec<(ItemId, BgpPolicy)>,
    pub applies: Vec<(ItemId, BgpPolicyApply)>,
}

/// An item of the BGP configuration: what refusals and reports are keyed by, and what a BGP
/// resource's verdict names. Shown as `peer 192.0.2.1`, `set prefix/ps1`, `policy p1`,
/// `apply <resource name>`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ItemId {
    /// The neighbour at this address.
    Peer(IpAddr),
    /// A defined set, by kind and name.
    Set(DefinedSetKind, String),
    /// A policy definition, by name.
    Policy(String),
    /// A policy application, by the name of the resource that asks for it (loxilb does not
    /// name applications).
    Apply(String),
}

impl fmt::Display for ItemId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ItemId::Peer(ip) => write!(f, "peer {ip}"),
            ItemId::Set(kind, name) => write!(f, "set {}/{name}", kind.as_path_segment()),
            ItemId::Policy(name) => write!(f, "policy {name}"),
            ItemId::Apply(resource) => write!(f, "apply {resource}"),
        }
    }
}

/// What this process knows a loxilb holds of the sets, policies and applications it sent
/// (neighbours are read from loxilb's own listing instead).
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct Held {
    pub sets: BTreeMap<ItemId, (DefinedSetKind, BgpDefinedSet)>,
    pub policies: BTreeMap<ItemId, BgpPolicy>,
    pub applies: BTreeMap<ItemId, BgpPolicyApply>,
}

impl Held {
    /// Whether an application still held uses the policy `name`.
    pub fn policy_applied(&self, name: &str) -> bool {
        self.applies
            .values()
            .any(|a| a.policies.iter().any(|p| p == name))
    }
}

/// One call of a pass.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Step {
    Unapply(ItemId, BgpPolicyApply),
    /// Removed only once no held application uses it (an application's removal may be
    /// refused in the same pass): goBGP lets an import policy go while applied, and the
    /// application could then never be removed.
    DeletePolicy(ItemId, String),
    DeleteSet(ItemId, DefinedSetKind, String),
    DeletePeer(IpAddr, u32),
    AddPeer(BgpNeighbor),
    AddSet(ItemId, DefinedSetKind, BgpDefinedSet),
    AddPolicy(ItemId, BgpPolicy),
    Apply(ItemId, BgpPolicyApply),
}

impl Step {
    /// The item the step is about.
    pub fn item(&self) -> ItemId {
        match self {
            Step::Unapply(id, _)
            | Step::DeletePolicy(id, _)
            | Step::DeleteSet(id, _, _)
            | Step::AddSet(id, _, _)
            | Step::AddPolicy(id, _)
            | Step::Apply(id, _) => id.clone(),
            Step::DeletePeer(ip, _) => ItemId::Peer(*ip),
            Step::AddPeer(n) => ItemId::Peer(n.ip_address),
        }
    }

    /// What the step did, for the log.
    pub fn done(&self) -> &'static str {
        match self {
            Step::Unapply(..) => "policy application removed",
            Step::DeletePolicy(..) => "policy removed",
            Step::DeleteSet(..) => "defined set removed",
            Step::DeletePeer(..) => "neighbour removed",
            Step::AddPeer(_) => "neighbour added",
            Step::AddSet(..) => "defined set added",
            Step::AddPolicy(..) => "policy added",
            Step::Apply(..) => "policies applied",
        }
    }

    /// Whether the step changes loxilb's neighbours (their sessions are then listed again).
    pub fn changes_peers(&self) -> bool {
        matches!(self, Step::DeletePeer(..) | Step::AddPeer(_))
    }
}

fn listed_ip(n: &BgpNeighborStatus) -> Option<IpAddr> {
    n.ip_address.parse::<IpAddr>().ok()
}

/// The steps from `held` and the `listed` neighbours to `config`: removals dependents first
/// (applications, policies still applied by none of the applications kept, sets,
/// neighbours), then additions dependencies first (neighbours, sets, policies,
/// applications). A changed item is removed and added again; neighbours are compared by
/// address and AS, and a listed neighbour nobody wants is removed (this controller owns
/// loxilb's neighbour list).
pub(super) fn steps(held: &Held, listed: &[BgpNeighborStatus], config: &BgpConfig) -> Vec<Step> {
    let mut out = Vec::new();
    let mut kept = held.clone();
    for (id, apply) in &held.applies {
        if !config.applies.iter().any(|(i, a)| i == id && a == apply) {
            out.push(Step::Unapply(id.clone(), apply.clone()));
            kept.applies.remove(id);
        }
    }
    for (id, policy) in &held.policies {
        let wanted = config.policies.iter().any(|(i, p)| i == id && p == policy);
        if !wanted && !kept.policy_applied(&policy.name) {
            out.push(Step::DeletePolicy(id.clone(), policy.name.clone()));
            kept.policies.remove(id);
        }
    }
    for (id, (kind, set)) in &held.sets {
        let wanted = config
            .sets
            .iter()
            .any(|(i, k, s)| i == id && k == kind && s == set);
        if !wanted {
            out.push(Step::DeleteSet(id.clone(), *kind, set.name.clone()));
            kept.sets.remove(id);
        }
    }
    for n in listed {
        let Some(ip) = listed_ip(n) else { continue };
        let wanted = config
            .peers
            .iter()
            .any(|p| p.ip_address == ip && p.remote_as == n.remote_as);
        if !wanted {
            out.push(Step::DeletePeer(ip, n.remote_as));
        }
    }
    for peer in &config.peers {
        let present = listed
            .iter()
            .any(|n| listed_ip(n) == Some(peer.ip_address) && n.remote_as == peer.remote_as);
        if !present {
            out.push(Step::AddPeer(peer.clone()));
        }
    }
    for (id, kind, set) in &config.sets {
        if !kept.sets.contains_key(id) {
            out.push(Step::AddSet(id.clone(), *kind, set.clone()));
        }
    }
    for (id, policy) in &config.policies {
        if !kept.policies.contains_key(id) {
            out.push(Step::AddPolicy(id.clone(), policy.clone()));
        }
    }
    for (id, apply) in &config.applies {
        if !kept.applies.contains_key(id) {
            out.push(Step::Apply(id.clone(), apply.clone()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loxilb::bgp::GlobalSettings;

    fn config() -> BgpConfig {
        BgpConfig {
            global: GlobalSettings {
                router_id: None,
                local_as: 65000,
                listen_port: 0,
            },
            peers: Vec::new(),
            sets: Vec::new(),
            policies: Vec::new(),
            applies: Vec::new(),
        }
    }

    fn listed(ip: &str, remote_as: u32) -> BgpNeighborStatus {
        BgpNeighborStatus {
            ip_address: ip.into(),
            remote_as,
            ..Default::default()
        }
    }

    fn policy(name: &str) -> BgpPolicy {
        BgpPolicy {
            name: name.into(),
            ..Default::default()
        }
    }

    fn apply(policies: &[&str]) -> BgpPolicyApply {
        BgpPolicyApply::global(
            loxilb_client::bgp::PolicyDirection::Export,
            policies.iter().map(|p| p.to_string()).collect(),
            loxilb_client::bgp::RouteAction::Accept,
        )
    }

    fn set(name: &str) -> BgpDefinedSet {
        BgpDefinedSet {
            name: name.into(),
            ..Default::default()
        }
    }

    #[test]
    fn item_ids_read_as_before() {
        assert_eq!(
            ItemId::Peer("192.0.2.1".parse().unwrap()).to_string(),
            "peer 192.0.2.1"
        );
        assert_eq!(
            ItemId::Set(DefinedSetKind::Prefix, "ps1".into()).to_string(),
            "set prefix/ps1"
        );
        assert_eq!(ItemId::Policy("p1".into()).to_string(), "policy p1");
        assert_eq!(ItemId::Apply("r".into()).to_string(), "apply r");
    }

    #[test]
    fn after_a_restart_everything_is_added_dependencies_first() {
        let mut c = config();
        c.peers
            .push(BgpNeighbor::new("192.0.2.1".parse().unwrap(), 65001));
        let set_id = ItemId::Set(DefinedSetKind::Prefix, "ps".into());
        c.sets
            .push((set_id.clone(), DefinedSetKind::Prefix, set("ps")));
        c.policies.push((ItemId::Policy("p".into()), policy("p")));
        c.applies.push((ItemId::Apply("a".into()), apply(&["p"])));
        let kinds: Vec<String> = steps(&Held::default(), &[], &c)
            .iter()
            .map(|s| s.item().to_string())
            .collect();
        assert_eq!(
            kinds,
            ["peer 192.0.2.1", "set prefix/ps", "policy p", "apply a"]
        );
    }

    #[test]
    fn removals_come_dependents_first_and_an_applied_policy_stays() {
        let mut held = Held::default();
        held.applies
            .insert(ItemId::Apply("a".into()), apply(&["p"]));
        held.applies
            .insert(ItemId::Apply("b".into()), apply(&["q"]));
        held.policies
            .insert(ItemId::Policy("p".into()), policy("p"));
        held.policies
            .insert(ItemId::Policy("q".into()), policy("q"));
        let set_id = ItemId::Set(DefinedSetKind::Prefix, "ps".into());
        held.sets
            .insert(set_id.clone(), (DefinedSetKind::Prefix, set("ps")));
        // Everything goes but application b (which keeps policy q in use).
        let mut c = config();
        c.applies.push((ItemId::Apply("b".into()), apply(&["q"])));
        let s = steps(&held, &[listed("192.0.2.9", 65009)], &c);
        assert_eq!(
            s,
            [
                Step::Unapply(ItemId::Apply("a".into()), apply(&["p"])),
                Step::DeletePolicy(ItemId::Policy("p".into()), "p".into()),
                Step::DeleteSet(set_id, DefinedSetKind::Prefix, "ps".into()),
                Step::DeletePeer("192.0.2.9".parse().unwrap(), 65009),
            ]
        );
    }

    #[test]
    fn a_changed_item_is_removed_and_added_again_and_a_held_one_is_left() {
        let mut held = Held::default();
        let mut old = policy("p");
        old.statements.push(Default::default());
        held.policies.insert(ItemId::Policy("p".into()), old);
        held.policies
            .insert(ItemId::Policy("same".into()), policy("same"));
        let mut c = config();
        c.policies.push((ItemId::Policy("p".into()), policy("p")));
        c.policies
            .push((ItemId::Policy("same".into()), policy("same")));
        c.peers
            .push(BgpNeighbor::new("192.0.2.1".parse().unwrap(), 65001));
        let s = steps(&held, &[listed("192.0.2.1", 65001)], &c);
        assert_eq!(
            s,
            [
                Step::DeletePolicy(ItemId::Policy("p".into()), "p".into()),
                Step::AddPolicy(ItemId::Policy("p".into()), policy("p")),
            ]
        );
    }

    #[test]
    fn a_neighbour_with_another_as_is_replaced() {
        let mut c = config();
        c.peers
            .push(BgpNeighbor::new("192.0.2.1".parse().unwrap(), 65002));
        let s = steps(&Held::default(), &[listed("192.0.2.1", 65001)], &c);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0], Step::DeletePeer("192.0.2.1".parse().unwrap(), 65001));
        assert!(matches!(&s[1], Step::AddPeer(n) if n.remote_as == 65002));
        assert!(s.iter().all(Step::changes_peers));
    }
}
