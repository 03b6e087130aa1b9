//! The decisions of the BGP subsystem, pure: from the flags and kube-loxilb's resources to
//! the configuration every loxilb gets ([`desired`]), and from what the loxilb passes
//! reported to each resource's conditions ([`conditions`]) and session summary.
//!
//! - The neighbours are the flags' peers and the `BGPPeerService` peers; a peer address
//!   given twice is refused on the resource that comes second (flags first, then resources by
//!   name), as is a set or policy name given twice.
//! - A resource that does not validate (`loxi_domain::bgp`'s checks) keeps what its last
//!   valid spec configured: a bad edit loses nothing, and says why in `Accepted`.
//! - Resources being deleted are left out, so the pass removes them from loxilb.
//! - The loxilbs peer with each other as kube-loxilb configures them in its in-cluster
//!   mode ([`config_for`], docs/bgp.md#loxilbs-as-each-others-neighbours): each gets, besides
//!   the configured peers, a neighbour per other loxilb it meshes with; a loxilb that leaves
//!   the fleet is in nobody's configuration any more, so the passes remove it.

use std::collections::BTreeMap;
use std::net::IpAddr;

use loxi_domain::bgp::{
    BGPPeerServiceSpec, BGPPolicyApplyServiceSpec, BGPPolicyDefinedSetsServiceSpec,
    BGPPolicyDefinitionServiceSpec, BGPPolicyStatement, BgpError, BgpSettings, DefinedType,
    PolicyType, RouteAction as DomainRouteAction, parse_masklength_range,
};
use loxilb_client::bgp::{
    BgpActions, BgpAsPathLength, BgpAsPathPrepend, BgpConditions, BgpDefinedSet, BgpMatchAsPathSet,
    BgpMatchCommunitySet, BgpMatchConditions, BgpMatchNeighborSet, BgpMatchPrefixSet, BgpNeighbor,
    BgpPolicy, BgpPolicyApply, BgpPrefix, BgpSetActions, BgpSetCommunity, BgpStatement,
    DefinedSetKind, PolicyDirection, RouteAction,
};

use crate::k8s::conditions::StatusCondition;
use crate::loxilb::bgp::{BgpConfig, BgpReport, GlobalSettings, ItemId};

pub const COND_ACCEPTED: &str = "Accepted";
pub const COND_PROGRAMMED: &str = "Programmed";

/// The four kinds, in loxilb's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Peer,
    DefinedSets,
    Definition,
    Apply,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Peer => "BGPPeerService",
            Kind::DefinedSets => "BGPPolicyDefinedSetsService",
            Kind::Definition => "BGPPolicyDefinitionService",
            Kind::Apply => "BGPPolicyApplyService",
        }
    }
}

/// A resource by kind and name (they are cluster-scoped).
pub type ResourceId = (Kind, String);

/// One resource as the stores hold it.
#[derive(Debug, Clone, PartialEq)]
pub struct Resource<S> {
    pub name: String,
    pub deleting: bool,
    pub spec: S,
}

/// Every BGP resource, from the stores.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    pub peers: Vec<Resource<BGPPeerServiceSpec>>,
    pub sets: Vec<Resource<BGPPolicyDefinedSetsServiceSpec>>,
    pub definitions: Vec<Resource<BGPPolicyDefinitionServiceSpec>>,
    pub applies: Vec<Resource<BGPPolicyApplyServiceSpec>>,
}

/// What one resource configures on every loxilb.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    Peer(BgpNeighbor),
    Set(DefinedSetKind, BgpDefinedSet),
    Policy(BgpPolicy),
    Apply(BgpPolicyApply),
}

/// What was decided for one live resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The item it configures: from its spec, or from its last valid spec when the current
    /// one is refused (`None`: nothing, it never was valid).
    pub item: Option<ItemId>,
    /// Why its spec is refused.
    pub problem: Option<BgpError>,
}

/// Everything [`desired`] decides.
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    pub config: BgpConfig,
    pub verdicts: BTreeMap<ResourceId, Verdict>,
    /// Resources being deleted, with the item they configured (to know when it is gone).
    pub removing: BTreeMap<ResourceId, Option<ItemId>>,
    /// The last valid item of every live resource, for the next call.
    pub last_good: BTreeMap<ResourceId, (ItemId, Item)>,
}

/// The configuration for every loxilb from the flags' `settings` and the resources; `last_good`
/// is what the previous call returned.
pub fn desired(
    settings: &BgpSettings,
    snap: &Snapshot,
    last_good: &BTreeMap<ResourceId, (ItemId, Item)>,
) -> Desired {
    let mut config = BgpConfig {
        global: GlobalSettings {
            router_id: settings.router_id,
            local_as: settings.local_asn.get(),
            listen_port: settings.listen_port.unwrap_or(0),
        },
        peers: Vec::new(),
        sets: Vec::new(),
        policies: Vec::new(),
        applies: Vec::new(),
    };
    // Who configures each item, for duplicates.
    let mut owners: BTreeMap<ItemId, String> = BTreeMap::new();
    for p in &settings.peers {
        let item = ItemId::Peer(p.address);
        if owners
            .insert(item, "the flags (--bgp-peers)".into())
            .is_none()
        {
            config.peers.push(BgpNeighbor {
                ip_address: p.address,
                remote_as: p.asn.get(),
                remote_port: p.port.unwrap_or(0),
                set_multi_hop: settings.multihop,
            });
        }
    }
    let mut out = Desired {
        config,
        verdicts: BTreeMap::new(),
        removing: BTreeMap::new(),
        last_good: BTreeMap::new(),
    };
    let multihop = settings.multihop;
    let mut each = |kind: Kind,
                    name: &str,
                    deleting: bool,
                    built: Result<(ItemId, Item), BgpError>,
                    out: &mut Desired| {
        let id: ResourceId = (kind, name.to_string());
        let previous = last_good.get(&id);
        if deleting {
            let item = built
                .as_ref()
                .ok()
                .map(|(i, _)| i.clone())
                .or_else(|| previous.map(|(i, _)| i.clone()));
            out.removing.insert(id, item);
            return;
        }
        let (chosen, problem) = match built {
            Ok(pair) => match owners.get(&pair.0) {
                Some(other) => (
                    previous.cloned().filter(|(i, _)| i != &pair.0),
                    Some(duplicate(kind, &pair.0, other)),
                ),
                None => (Some(pair), None),
            },
            Err(e) => (previous.cloned(), Some(e)),
        };
        // The last valid item is used only while nobody else configures it.
        let chosen = chosen.filter(|(i, _)| !owners.contains_key(i));
        if let Some((item_id, item)) = &chosen {
            owners.insert(item_id.clone(), format!("{} {name}", kind.name()));
            match item.clone() {
                Item::Peer(n) => out.config.peers.push(n),
                Item::Set(k, s) => out.config.sets.push((item_id.clone(), k, s)),
                Item::Policy(p) => out.config.policies.push((item_id.clone(), p)),
                Item::Apply(a) => out.config.applies.push((item_id.clone(), a)),
            }
            out.last_good
                .insert(id.clone(), (item_id.clone(), item.clone()));
        }
        out.verdicts.insert(
            id,
            Verdict {
                item: chosen.map(|(i, _)| i),
                problem,
            },
        );
    };
    for r in sorted(&snap.peers) {
        let built = peer(&r.spec, multihop).map(|n| (ItemId::Peer(n.ip_address), Item::Peer(n)));
        each(Kind::Peer, &r.name, r.deleting, built, &mut out);
    }
    for r in sorted(&snap.sets) {
        let built =
            defined_set(&r.spec).map(|(k, s)| (ItemId::Set(k, s.name.clone()), Item::Set(k, s)));
        each(Kind::DefinedSets, &r.name, r.deleting, built, &mut out);
    }
    for r in sorted(&snap.definitions) {
        let built = policy(&r.spec).map(|p| (ItemId::Policy(p.name.clone()), Item::Policy(p)));
        each(Kind::Definition, &r.name, r.deleting, built, &mut out);
    }
    for r in sorted(&snap.applies) {
        let built = apply(&r.spec).map(|a| (ItemId::Apply(r.name.clone()), Item::Apply(a)));
        each(Kind::Apply, &r.name, r.deleting, built, &mut out);
    }
    out
}

fn sorted<S>(list: &[Resource<S>]) -> Vec<&Resource<S>> {
    let mut v: Vec<&Resource<S>> = list.iter().collect();
    v.sort_by(|a, b| a.name.cmp(&b.name));
    v
}

fn duplicate(kind: Kind, item: &ItemId, other: &str) -> BgpError {
    let field = match kind {
        Kind::Peer => "spec.ipAddress",
        _ => "spec.name",
    };
    BgpError {
        field: field.to_string(),
        value: None,
        reason: format!("{item} is already configured by {other}"),
    }
}

fn number<T: TryFrom<i64>>(field: String, n: i64, what: &str) -> Result<T, BgpError> {
    T::try_from(n).map_err(|_| BgpError {
        field,
        value: Some(n.to_string()),
        reason: format!("expected {what}"),
    })
}

/// The neighbour of a `BGPPeerService`; multihop when the resource says so, else as the
/// flags say (`--bgp-multihop`).
pub fn peer(spec: &BGPPeerServiceSpec, multihop: bool) -> Result<BgpNeighbor, BgpError> {
    let p = spec.peer()?;
    Ok(BgpNeighbor {
        ip_address: p.address,
        remote_as: p.asn.get(),
        remote_port: p.port.unwrap_or(0),
        set_multi_hop: spec.set_multi_hop.unwrap_or(multihop),
    })
}

/// The defined set of a `BGPPolicyDefinedSetsService`.
pub fn defined_set(
    spec: &BGPPolicyDefinedSetsServiceSpec,
) -> Result<(DefinedSetKind, BgpDefinedSet), BgpError> {
    let kind = match spec.validate()? {
        DefinedType::Prefix => DefinedSetKind::Prefix,
        DefinedType::Neighbor => DefinedSetKind::Neighbor,
        DefinedType::Community => DefinedSetKind::Community,
        DefinedType::ExtCommunity => DefinedSetKind::ExtCommunity,
        DefinedType::LargeCommunity => DefinedSetKind::LargeCommunity,
        DefinedType::AsPath => DefinedSetKind::AsPath,
    };
    let mut prefix_list = Vec::new();
    for (i, p) in spec.prefix_list.iter().enumerate() {
        let (min, max) = parse_masklength_range(
            &format!("spec.prefixList[{i}].masklengthRange"),
            &p.masklength_range,
        )?;
        prefix_list.push(BgpPrefix::new(p.ip_prefix.trim(), min, max));
    }
    Ok((
        kind,
        BgpDefinedSet {
            name: spec.name.trim().to_string(),
            list: spec.list.iter().map(|m| m.trim().to_string()).collect(),
            prefix_list,
        },
    ))
}

/// The policy of a `BGPPolicyDefinitionService`.
pub fn policy(spec: &BGPPolicyDefinitionServiceSpec) -> Result<BgpPolicy, BgpError> {
    spec.validate()?;
    let statements = spec
        .statements
        .iter()
        .enumerate()
        .map(|(i, st)| statement(i, st))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(BgpPolicy {
        name: spec.name.trim().to_string(),
        statements,
    })
}

fn statement(i: usize, st: &BGPPolicyStatement) -> Result<BgpStatement, BgpError> {
    let at = format!("spec.statements[{i}]");
    let community = |s: &loxi_domain::bgp::BGPCommunitySet| BgpMatchCommunitySet {
        community_set: s.community_set.clone(),
        match_set_options: s.match_set_options.clone(),
    };
    let set_community = |s: &loxi_domain::bgp::SetCommunity| BgpSetCommunity {
        options: s.options.clone(),
        set_community_method: s.set_community_method.clone(),
    };
    let mut conditions = BgpConditions::default();
    if let Some(c) = &st.conditions {
        conditions.match_prefix_set = c.match_prefix_set.as_ref().map(|m| BgpMatchPrefixSet {
            prefix_set: m.prefix_set.clone(),
            match_set_option: m.match_set_option.clone(),
        });
        conditions.match_neighbor_set =
            c.match_neighbor_set.as_ref().map(|m| BgpMatchNeighborSet {
                neighbor_set: m.neighbor_set.clone(),
                match_set_option: m.match_set_option.clone(),
            });
        if let Some(b) = &c.bgp_conditions {
            let as_path_length = match &b.as_path_length {
                Some(l) => Some(BgpAsPathLength {
                    operator: l.operator.clone(),
                    value: number(
                        format!("{at}.conditions.bgpConditions.asPathLength.value"),
                        l.value,
                        "a length from 0 to 4294967295",
                    )?,
                }),
                None => None,
            };
            conditions.bgp_conditions = Some(BgpMatchConditions {
                afi_safi_in: b.afi_safi_in.clone(),
                as_path_length,
                match_as_path_set: b.match_as_path_set.as_ref().map(|s| BgpMatchAsPathSet {
                    as_path_set: s.as_path_set.clone(),
                    match_set_options: s.match_set_options.clone(),
                }),
                match_community_set: b.match_community_set.as_ref().map(community),
                match_ext_community_set: b.match_ext_community_set.as_ref().map(community),
                match_large_community_set: b.match_large_community_set.as_ref().map(community),
                next_hop_in_list: b.next_hop_in_list.clone(),
                rpki: b.rpki.clone(),
                route_type: b.route_type.clone(),
            });
        }
    }
    let mut actions = BgpActions::default();
    if let Some(a) = &st.actions {
        actions.route_disposition = a.route_disposition.clone();
        if let Some(b) = &a.bgp_actions {
            let set_local_pref = match b.set_local_pref {
                Some(n) => number(
                    format!("{at}.actions.bgpActions.setLocalPref"),
                    n,
                    "a local preference from 0 to 4294967295",
                )?,
                None => 0,
            };
            let set_as_path_prepend = match &b.set_as_path_prepend {
                Some(p) => Some(BgpAsPathPrepend {
                    asn: p.asn.clone(),
                    repeat_n: number(
                        format!("{at}.actions.bgpActions.setAsPathPrepend.repeatN"),
                        p.repeat_n,
                        "a count from 0 to 4294967295",
                    )?,
                }),
                None => None,
            };
            actions.bgp_actions = Some(BgpSetActions {
                set_med: b.set_med.clone(),
                set_next_hop: b.set_next_hop.clone(),
                set_local_pref,
                set_community: b.set_community.as_ref().map(set_community),
                set_ext_community: b.set_ext_community.as_ref().map(set_community),
                set_large_community: b.set_large_community.as_ref().map(set_community),
                set_as_path_prepend,
            });
        }
    }
    Ok(BgpStatement {
        name: st.name.trim().to_string(),
        conditions,
        actions,
    })
}

/// The application of a `BGPPolicyApplyService`.
pub fn apply(spec: &BGPPolicyApplyServiceSpec) -> Result<BgpPolicyApply, BgpError> {
    let a = spec.validate()?;
    Ok(BgpPolicyApply {
        ip_address: a
            .neighbor
            .map_or_else(|| "global".to_string(), |ip| ip.to_string()),
        policy_type: match a.policy_type {
            PolicyType::Import => PolicyDirection::Import,
            PolicyType::Export => PolicyDirection::Export,
        },
        policies: a.policies.iter().map(|p| p.trim().to_string()).collect(),
        route_action: match a.route_action {
            DomainRouteAction::Accept => RouteAction::Accept,
            DomainRouteAction::Reject => RouteAction::Reject,
        },
    })
}

// ---------------------------------------------------------------------------------------
// Status

/// What one loxilb's pass says about one item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Not reached (down, or not probed yet).
    Unreachable,
    /// The pass failed before the item (loxilb's global settings refused, a dropped
    /// connection).
    Failed(String),
    /// loxilb refused the item.
    Refused(String),
    Held,
}

/// One loxilb's pass: `None` when it was not reached.
pub type Pass<'a> = (&'a str, Option<Result<&'a BgpReport, &'a str>>);

/// What `passes` say about `item`.
pub fn outcomes(item: &ItemId, passes: &[Pass<'_>]) -> Vec<(String, Outcome)> {
    passes
        .iter()
        .map(|(url, pass)| {
            let o = match pass {
                None => Outcome::Unreachable,
                Some(Err(e)) => Outcome::Failed((*e).to_string()),
                Some(Ok(r)) => match r.refused.get(item) {
                    Some(e) => Outcome::Refused(e.clone()),
                    None => Outcome::Held,
                },
            };
            (url.to_string(), o)
        })
        .collect()
}

/// Whether the item of a resource being deleted is gone from every reached loxilb.
pub fn removed_everywhere(item: Option<&ItemId>, passes: &[Pass<'_>]) -> bool {
    passes.iter().all(|(_, pass)| match pass {
        None => true,
        Some(Err(_)) => false,
        Some(Ok(r)) => item.is_none_or(|i| !r.refused.contains_key(i)),
    })
}

/// The conditions of a live resource: `Accepted` from its verdict, `Programmed` from the
/// loxilb passes. `previous` keeps the transition times of unchanged statuses; `now` is
/// RFC 3339.
pub fn conditions(
    verdict: &Verdict,
    outcomes: &[(String, Outcome)],
    generation: Option<i64>,
    previous: &[StatusCondition],
    now: &str,
) -> Vec<StatusCondition> {
    let accepted = match &verdict.problem {
        None => StatusCondition::new(COND_ACCEPTED, "True", "Valid", String::new()),
        Some(e) => StatusCondition::new(COND_ACCEPTED, "False", e.reason(), e.to_string()),
    };
    let problems: Vec<String> = outcomes
        .iter()
        .filter_map(|(url, o)| match o {
            Outcome::Refused(e) | Outcome::Failed(e) => Some(format!("{url}: {e}")),
            _ => None,
        })
        .collect();
    let unreachable: Vec<&str> = outcomes
        .iter()
        .filter(|(_, o)| *o == Outcome::Unreachable)
        .map(|(u, _)| u.as_str())
        .collect();
    let kept = if verdict.problem.is_some() {
        " (the last valid spec stays configured)"
    } else {
        ""
    };
    let programmed = if verdict.item.is_none() {
        StatusCondition::new(
            COND_PROGRAMMED,
            "False",
            "NotAccepted",
            "nothing configured: the spec is not valid".into(),
        )
    } else if !problems.is_empty() {
        StatusCondition::new(
            COND_PROGRAMMED,
            "False",
            "LoxilbRefused",
            problems.join("; "),
        )
    } else if unreachable.len() == outcomes.len() {
        StatusCondition::new(
            COND_PROGRAMMED,
            "Unknown",
            "LoxilbUnreachable",
            "no loxilb reached yet".into(),
        )
    } else if !unreachable.is_empty() {
        StatusCondition::new(
            COND_PROGRAMMED,
            "False",
            "LoxilbUnreachable",
            format!("not reached: {}{kept}", unreachable.join(", ")),
        )
    } else {
        StatusCondition::new(
            COND_PROGRAMMED,
            "True",
            "Programmed",
            format!("on {} loxilb{kept}", outcomes.len()),
        )
    };
    let mut both = vec![accepted, programmed];
    crate::k8s::conditions::stamp_all(&mut both, previous, generation, &now.to_string());
    both
}

/// The session state of the peer at `ip` on each reached loxilb (`None`: not listed there).
pub fn sessions(ip: IpAddr, passes: &[Pass<'_>]) -> Vec<(String, Option<String>)> {
    passes
        .iter()
        .filter_map(|(url, pass)| match pass {
            Some(Ok(r)) => Some((
                url.to_string(),
                r.sessions
                    .iter()
                    .find(|n| n.ip_address.parse::<IpAddr>().ok() == Some(ip))
                    .map(|n| n.state.clone()),
            )),
            _ => None,
        })
        .collect()
}

/// The `state` column: the state every loxilb agrees on, else each loxilb's, in order.
pub fn summary(states: &[&str]) -> Option<String> {
    let first = states.first()?;
    if states.iter().all(|s| s == first) {
        Some(first.to_string())
    } else {
        Some(states.join(","))
    }
}

/// How a loxilb takes part in the BGP mesh between loxilbs (kube-loxilb's rules).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum MeshRole {
    /// Holds rules and was found in the cluster (`--loxilb-service`): peers with the other
    /// such loxilbs of its group and with every peer-only one. (kube-loxilb runs one
    /// controller per zone, which meshes only its own zone's loxilbs.)
    InCluster,
    /// Holds rules and was named by the operator (`--loxilb-url`, `LoxiURL`): peers with the
    /// peer-only loxilbs only (how external loxilbs peer with each other is the network's
    /// business, as in kube-loxilb).
    Configured,
    /// Runs in BGP-peer-only mode (`--loxilb-peer-service`): peers with every rule-holding
    /// loxilb, not with the other peer-only ones.
    PeerOnly,
}

/// One loxilb of the mesh: its API URL (its identity), its role and, for one holding rules,
/// its group (docs/fleet.md#groups-and-placement).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshMember {
    pub url: String,
    pub role: MeshRole,
    pub group: Option<String>,
}

impl MeshMember {
    pub fn new(url: &str, role: MeshRole) -> MeshMember {
        MeshMember {
            url: url.to_string(),
            role,
            group: None,
        }
    }

    /// The member as one of `group`.
    pub fn in_group(mut self, group: &str) -> MeshMember {
        self.group = Some(group.to_string());
        self
    }

    fn meshes_with(&self, other: &MeshMember) -> bool {
        use MeshRole::{Configured, InCluster, PeerOnly};
        match (self.role, other.role) {
            (InCluster, InCluster) => self.group == other.group,
            (InCluster | Configured, PeerOnly) | (PeerOnly, InCluster | Configured) => true,
            _ => false,
        }
    }

    /// The address BGP knows it by: the host of its URL, when that is an address (a name is
    /// not resolved: such a loxilb takes no part in the mesh).
    pub fn address(&self) -> Option<IpAddr> {
        match url::Url::parse(&self.url).ok()?.host()? {
            url::Host::Ipv4(a) => Some(IpAddr::V4(a)),
            url::Host::Ipv6(a) => Some(IpAddr::V6(a)),
            url::Host::Domain(_) => None,
        }
    }
}

/// The neighbours the loxilb `me` gets from the mesh, by address: iBGP (remote AS = the local
/// AS), on goBGP's listen port, without multihop, as kube-loxilb sets them. Never its own
/// address; an address listed twice (two roles) once.
pub fn mesh_neighbours(
    global: &GlobalSettings,
    mesh: &[MeshMember],
    me: &MeshMember,
) -> Vec<BgpNeighbor> {
    let own = me.address();
    let mut addresses: Vec<IpAddr> = mesh
        .iter()
        .filter(|m| m.url != me.url && me.meshes_with(m))
        .filter_map(MeshMember::address)
        .filter(|a| Some(*a) != own)
        .collect();
    addresses.sort();
    addresses.dedup();
    addresses
        .into_iter()
        .map(|ip_address| BgpNeighbor {
            ip_address,
            remote_as: global.local_as,
            remote_port: global.listen_port,
            set_multi_hop: false,
        })
        .collect()
}

/// The configuration of the loxilb at `url`: `config` (every loxilb's) plus its mesh
/// neighbours ([`mesh_neighbours`]). A mesh neighbour at an address a configured peer (the
/// flags, a `BGPPeerService`) already names is left out: the operator's settings win. A
/// loxilb the mesh does not list gets `config` as it is.
pub fn config_for(config: &BgpConfig, mesh: &[MeshMember], url: &str) -> BgpConfig {
    let mut out = config.clone();
    let Some(me) = mesh.iter().find(|m| m.url == url) else {
        return out;
    };
    for n in mesh_neighbours(&config.global, mesh, me) {
        if !out.peers.iter().any(|p| p.ip_address == n.ip_address) {
            out.peers.push(n);
        }
    }
    out
}

/// Every address a loxilb may hold a session with: the configured peers and every member of
/// the mesh (for the session metrics).
pub fn session_addresses(config: &BgpConfig, mesh: &[MeshMember]) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = config
        .peers
        .iter()
        .map(|p| p.ip_address)
        .chain(mesh.iter().filter_map(MeshMember::address))
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use loxi_domain::bgp::{
        BGPPolicyActions, BGPPolicyConditions, BGPPolicyPrefix, BgpInput, MatchPrefixSet,
    };

    fn settings(peers: &str) -> BgpSettings {
        BgpSettings::from_input(&BgpInput {
            local_asn: Some("65100"),
            peers: Some(peers),
            ..BgpInput::default()
        })
        .unwrap()
        .unwrap()
    }

    fn live<S>(name: &str, spec: S) -> Resource<S> {
        Resource {
            name: name.into(),
            deleting: false,
            spec,
        }
    }

    fn peer_spec(ip: &str, asn: i64) -> BGPPeerServiceSpec {
        BGPPeerServiceSpec {
            ip_address: ip.into(),
            remote_as: asn,
            remote_port: Some(179),
            set_multi_hop: None,
        }
    }

    fn prefix_set(name: &str, range: &str) -> BGPPolicyDefinedSetsServiceSpec {
        BGPPolicyDefinedSetsServiceSpec {
            name: name.into(),
            defined_type: "prefix".into(),
            list: vec![],
            prefix_list: vec![BGPPolicyPrefix {
                ip_prefix: "192.168.0.0/16".into(),
                masklength_range: range.into(),
            }],
        }
    }

    fn definition(name: &str, with_actions: bool) -> BGPPolicyDefinitionServiceSpec {
        BGPPolicyDefinitionServiceSpec {
            name: name.into(),
            statements: vec![BGPPolicyStatement {
                name: format!("{name}-st"),
                conditions: Some(BGPPolicyConditions {
                    match_prefix_set: Some(MatchPrefixSet {
                        match_set_option: "any".into(),
                        prefix_set: "ps1".into(),
                    }),
                    ..Default::default()
                }),
                actions: with_actions.then(|| BGPPolicyActions {
                    route_disposition: "accept-route".into(),
                    bgp_actions: None,
                }),
            }],
        }
    }

    #[test]
    fn flags_and_resources_make_one_configuration_in_order() {
        let snap = Snapshot {
            peers: vec![
                live("b", peer_spec("192.0.2.2", 4_200_000_001)),
                live("a", peer_spec("192.0.2.9", 65009)),
            ],
            sets: vec![live("s", prefix_set("ps1", "16..24"))],
            definitions: vec![live("d", definition("p1", true))],
            applies: vec![live(
                "ap",
                BGPPolicyApplyServiceSpec {
                    ip_address: "global".into(),
                    policy_type: "export".into(),
                    policies: vec!["p1".into()],
                    route_action: "accept".into(),
                },
            )],
        };
        let d = desired(&settings("192.0.2.1:65001"), &snap, &BTreeMap::new());
        let peers: Vec<String> = d
            .config
            .peers
            .iter()
            .map(|p| format!("{}/{}", p.ip_address, p.remote_as))
            .collect();
        assert_eq!(
            peers,
            ["192.0.2.1/65001", "192.0.2.9/65009", "192.0.2.2/4200000001"],
            "flags first, then resources by name"
        );
        assert_eq!(d.config.sets[0].0.to_string(), "set prefix/ps1");
        assert_eq!(d.config.sets[0].2.prefix_list[0].masklength_range, "16..24");
        assert_eq!(
            d.config.policies[0].1.statements[0]
                .actions
                .route_disposition,
            "accept-route"
        );
        assert_eq!(d.config.applies[0].1.ip_address, "global");
        assert!(
            d.verdicts
                .values()
                .all(|v| v.problem.is_none() && v.item.is_some())
        );
        assert_eq!(d.last_good.len(), 5);
    }

    #[test]
    fn a_bad_edit_keeps_the_last_valid_item_and_names_the_field() {
        let good = Snapshot {
            peers: vec![live("p", peer_spec("192.0.2.5", 65005))],
            sets: vec![live("s", prefix_set("ps1", "24..32"))],
            definitions: vec![live("d", definition("p1", true))],
            ..Snapshot::default()
        };
        let flags = settings("192.0.2.1:65001");
        let first = desired(&flags, &good, &BTreeMap::new());
        let bad = Snapshot {
            peers: vec![live("p", peer_spec("192.0.2.5", 0))],
            sets: vec![live("s", prefix_set("ps1", "24-32"))],
            definitions: vec![live("d", definition("p1", false))],
            ..Snapshot::default()
        };
        let second = desired(&flags, &bad, &first.last_good);
        assert_eq!(second.config, first.config, "nothing configured is lost");
        let field = |k: Kind, n: &str| {
            let v = &second.verdicts[&(k, n.to_string())];
            assert!(v.item.is_some());
            v.problem.clone().unwrap().field
        };
        assert_eq!(field(Kind::Peer, "p"), "spec.remoteAs");
        assert_eq!(
            field(Kind::DefinedSets, "s"),
            "spec.prefixList[0].masklengthRange"
        );
        assert_eq!(field(Kind::Definition, "d"), "spec.statements[0]");
        // Never valid: nothing configured, and it says why.
        let fresh = desired(&flags, &bad, &BTreeMap::new());
        assert_eq!(fresh.config.peers.len(), 1);
        assert!(fresh.config.sets.is_empty() && fresh.config.policies.is_empty());
        assert!(fresh.verdicts.values().all(|v| v.item.is_none()));
    }

    #[test]
    fn a_peer_given_twice_is_refused_on_the_second_and_deletions_are_left_out() {
        let snap = Snapshot {
            peers: vec![
                live("dup-of-flag", peer_spec("192.0.2.1", 65001)),
                Resource {
                    name: "going".into(),
                    deleting: true,
                    spec: peer_spec("192.0.2.7", 65007),
                },
            ],
            ..Snapshot::default()
        };
        let d = desired(&settings("192.0.2.1:65001"), &snap, &BTreeMap::new());
        assert_eq!(d.config.peers.len(), 1);
        let v = &d.verdicts[&(Kind::Peer, "dup-of-flag".to_string())];
        assert!(v.item.is_none());
        let e = v.problem.clone().unwrap();
        assert_eq!(e.field, "spec.ipAddress");
        assert!(e.to_string().contains("--bgp-peers"), "{e}");
        assert_eq!(
            d.removing[&(Kind::Peer, "going".to_string())],
            Some(ItemId::Peer("192.0.2.7".parse().unwrap()))
        );
    }

    #[test]
    fn conditions_from_the_passes() {
        let ok = BgpReport::default();
        let p1 = ItemId::Policy("p1".into());
        let mut refused = BgpReport::default();
        refused
            .refused
            .insert(p1.clone(), "statement already defined".into());
        let verdict = Verdict {
            item: Some(p1.clone()),
            problem: None,
        };
        let passes: Vec<Pass<'_>> = vec![
            ("http://a", Some(Ok(&ok))),
            ("http://b", Some(Ok(&refused))),
        ];
        let c = conditions(&verdict, &outcomes(&p1, &passes), Some(2), &[], "T1");
        assert_eq!(
            (c[0].type_.as_str(), c[0].status.as_str()),
            ("Accepted", "True")
        );
        assert_eq!(
            (c[1].status.as_str(), c[1].reason.as_str()),
            ("False", "LoxilbRefused")
        );
        assert!(c[1].message.contains("http://b: statement already defined"));
        assert_eq!(c[1].observed_generation, Some(2));
        let passes: Vec<Pass<'_>> = vec![("http://a", Some(Ok(&ok))), ("http://b", Some(Ok(&ok)))];
        let again = conditions(&verdict, &outcomes(&p1, &passes), Some(2), &c, "T2");
        assert_eq!(again[1].status, "True");
        assert_eq!(again[1].last_transition_time, "T2", "status changed");
        assert_eq!(again[0].last_transition_time, "T1", "status kept");
        let passes: Vec<Pass<'_>> = vec![("http://a", None)];
        let c = conditions(&verdict, &outcomes(&p1, &passes), None, &[], "T");
        assert_eq!(c[1].status, "Unknown");
        assert!(removed_everywhere(
            Some(&p1),
            &[("http://a", Some(Ok(&ok)))]
        ));
        assert!(!removed_everywhere(
            Some(&p1),
            &[("http://b", Some(Ok(&refused)))]
        ));
        assert!(!removed_everywhere(
            None,
            &[("http://b", Some(Err("down")))]
        ));
    }

    #[test]
    fn session_summary() {
        assert_eq!(summary(&[]), None);
        assert_eq!(
            summary(&["ESTABLISHED", "ESTABLISHED"]).as_deref(),
            Some("ESTABLISHED")
        );
        assert_eq!(
            summary(&["ESTABLISHED", "ACTIVE"]).as_deref(),
            Some("ESTABLISHED,ACTIVE")
        );
    }

    fn global() -> GlobalSettings {
        GlobalSettings {
            router_id: None,
            local_as: 64512,
            listen_port: 0,
        }
    }

    fn mesh() -> Vec<MeshMember> {
        vec![
            MeshMember::new("http://10.0.0.1:11111", MeshRole::InCluster),
            MeshMember::new("http://10.0.0.2:11111", MeshRole::InCluster),
            MeshMember::new("https://[fd00::3]:11111", MeshRole::InCluster),
            MeshMember::new("http://10.0.1.1:11111", MeshRole::PeerOnly),
            MeshMember::new("http://10.0.1.2:11111", MeshRole::PeerOnly),
            MeshMember::new("http://10.0.2.1:11111", MeshRole::Configured),
            MeshMember::new("http://loxilb.example:11111", MeshRole::Configured),
        ]
    }

    fn addresses(n: &[BgpNeighbor]) -> Vec<String> {
        n.iter().map(|n| n.ip_address.to_string()).collect()
    }

    #[test]
    fn who_peers_with_whom() {
        let mesh = mesh();
        let of = |url: &str| {
            let me = mesh.iter().find(|m| m.url == url).unwrap();
            addresses(&mesh_neighbours(&global(), &mesh, me))
        };
        // In-cluster rule holders: every other in-cluster one and every peer-only one.
        assert_eq!(
            of("http://10.0.0.1:11111"),
            ["10.0.0.2", "10.0.1.1", "10.0.1.2", "fd00::3"]
        );
        // Peer-only: every rule holder (a host name takes no part), not each other.
        assert_eq!(
            of("http://10.0.1.1:11111"),
            ["10.0.0.1", "10.0.0.2", "10.0.2.1", "fd00::3"]
        );
        // Configured rule holders: the peer-only ones.
        assert_eq!(of("http://10.0.2.1:11111"), ["10.0.1.1", "10.0.1.2"]);
        assert_eq!(of("http://loxilb.example:11111"), ["10.0.1.1", "10.0.1.2"]);
        let me = &mesh[0];
        let n = mesh_neighbours(&global(), &mesh, me);
        assert!(
            n.iter()
                .all(|n| n.remote_as == 64512 && n.remote_port == 0 && !n.set_multi_hop),
            "iBGP on goBGP's port: {n:?}"
        );
    }

    #[test]
    fn never_its_own_address_and_each_address_once() {
        // Two loxilbs on one address (host network, other ports), one of them twice.
        let mesh = vec![
            MeshMember::new("http://10.0.0.1:11111", MeshRole::InCluster),
            MeshMember::new("http://10.0.0.1:22222", MeshRole::InCluster),
            MeshMember::new("http://10.0.0.2:11111", MeshRole::InCluster),
            MeshMember::new("http://10.0.0.2:11111", MeshRole::PeerOnly),
        ];
        assert_eq!(
            addresses(&mesh_neighbours(&global(), &mesh, &mesh[0])),
            ["10.0.0.2"]
        );
    }

    #[test]
    fn a_loxilb_that_leaves_is_nobodys_neighbour_any_more() {
        let config = desired(&settings(""), &Snapshot::default(), &BTreeMap::new()).config;
        let mut mesh = mesh();
        let before = config_for(&config, &mesh, "http://10.0.0.1:11111");
        assert!(addresses(&before.peers).contains(&"10.0.1.2".to_string()));
        mesh.retain(|m| m.url != "http://10.0.1.2:11111");
        let after = config_for(&config, &mesh, "http://10.0.0.1:11111");
        assert_eq!(addresses(&after.peers), ["10.0.0.2", "10.0.1.1", "fd00::3"]);
        // Not in the mesh: the common configuration as it is.
        assert_eq!(config_for(&config, &mesh, "http://192.0.2.9:1"), config);
    }

    #[test]
    fn a_configured_peer_at_a_loxilbs_address_wins() {
        let config = desired(
            &settings("10.0.0.2:65001"),
            &Snapshot::default(),
            &BTreeMap::new(),
        )
        .config;
        let mine = config_for(&config, &mesh(), "http://10.0.0.1:11111");
        let at = |ip: &str| {
            mine.peers
                .iter()
                .filter(|p| p.ip_address.to_string() == ip)
                .map(|p| p.remote_as)
                .collect::<Vec<_>>()
        };
        assert_eq!(at("10.0.0.2"), [65001], "the flag's peer, once");
        assert_eq!(at("10.0.1.1"), [65100], "iBGP: the local AS");
        assert_eq!(
            session_addresses(&config, &mesh()).len(),
            7 - 1,
            "every address once, the host name left out"
        );
    }

    #[test]
    fn in_cluster_loxilbs_mesh_within_their_group_peer_only_ones_with_all() {
        let mesh = vec![
            MeshMember::new("http://10.0.0.1:11111", MeshRole::InCluster).in_group("east"),
            MeshMember::new("http://10.0.0.2:11111", MeshRole::InCluster).in_group("east"),
            MeshMember::new("http://10.0.0.3:11111", MeshRole::InCluster).in_group("west"),
            MeshMember::new("http://10.0.1.1:11111", MeshRole::PeerOnly),
        ];
        let of = |i: usize| addresses(&mesh_neighbours(&global(), &mesh, &mesh[i]));
        assert_eq!(of(0), ["10.0.0.2", "10.0.1.1"]);
        assert_eq!(of(2), ["10.0.1.1"]);
        assert_eq!(of(3), ["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
    }
}
