//! Wire types of loxilb's BGP routes (`/config/bgp/...`, docs/loxilb-api.md#bgp).
//!
//! Requests use the spec's exact key spellings (a contract test checks them against
//! swagger.yml), including its irregular ones: `SetNextHopSelf` (capital S) in the global
//! configuration and `List` (capital L) in a defined set, which loxilb lists back as `list`.
//! Responses default every field, read `null` as empty and ignore unknown fields.

use std::net::{IpAddr, Ipv4Addr};

use serde::{Deserialize, Deserializer, Serialize};

fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

/// `POST /config/bgp/global` (`BGPGlobalConfig`): starts loxilb's goBGP. A second POST does
/// not change a running configuration (docs/loxilb-api.md#bgp).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BgpGlobal {
    /// goBGP takes only an IPv4 router id.
    #[serde(rename = "routerId")]
    pub router_id: Ipv4Addr,
    /// 4-byte AS numbers are fine here.
    #[serde(rename = "localAs")]
    pub local_as: u32,
    /// Makes loxilb apply its next-hop-self export policy.
    #[serde(rename = "SetNextHopSelf")]
    pub set_next_hop_self: bool,
    /// 0 means 179.
    #[serde(rename = "listenPort")]
    pub listen_port: u16,
}

/// `POST /config/bgp/neigh` (`BGPNeigh`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BgpNeighbor {
    /// IPv4 or IPv6.
    #[serde(rename = "ipAddress")]
    pub ip_address: IpAddr,
    #[serde(rename = "remoteAs")]
    pub remote_as: u32,
    /// 0 means 179.
    #[serde(rename = "remotePort")]
    pub remote_port: u16,
    /// eBGP multihop (TTL 8).
    #[serde(rename = "setMultiHop")]
    pub set_multi_hop: bool,
}

impl BgpNeighbor {
    /// A peer on port 179 without multihop.
    pub fn new(ip_address: IpAddr, remote_as: u32) -> BgpNeighbor {
        BgpNeighbor {
            ip_address,
            remote_as,
            remote_port: 0,
            set_multi_hop: false,
        }
    }
}

/// One entry of `GET /config/bgp/neigh/all` (`BGPNeighGetEntry`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct BgpNeighborStatus {
    #[serde(rename = "ipAddress")]
    pub ip_address: String,
    #[serde(rename = "remoteAs")]
    pub remote_as: u32,
    /// goBGP's session state: `IDLE`, `CONNECT`, `ACTIVE`, `OPENSENT`, `OPENCONFIRM`,
    /// `ESTABLISHED` or `UNKNOWN`.
    pub state: String,
    /// Time in the current state (`hh:mm:ss`, `Nd hh:mm:ss`) or `never`.
    pub updowntime: String,
}

impl BgpNeighborStatus {
    pub fn is_established(&self) -> bool {
        self.state == "ESTABLISHED"
    }
}

/// The `{defineset_type}` of the defined-set routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DefinedSetKind {
    /// Uses [`BgpDefinedSet::prefix_list`].
    Prefix,
    /// The others use [`BgpDefinedSet::list`].
    Neighbor,
    Community,
    ExtCommunity,
    LargeCommunity,
    AsPath,
}

impl DefinedSetKind {
    /// The path segment loxilb expects (it knows a few spellings; these are the plain ones).
    pub fn as_path_segment(self) -> &'static str {
        match self {
            DefinedSetKind::Prefix => "prefix",
            DefinedSetKind::Neighbor => "neighbor",
            DefinedSetKind::Community => "community",
            DefinedSetKind::ExtCommunity => "extcommunity",
            DefinedSetKind::LargeCommunity => "largecommunity",
            DefinedSetKind::AsPath => "aspath",
        }
    }
}

/// A defined set: `POST /config/bgp/policy/definedsets/{type}` (`BGPPolicyDefinedSetsMod`)
/// and its listing (`BGPPolicyDefinedSetGetEntry`). A POST to an existing name adds to it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BgpDefinedSet {
    pub name: String,
    /// Members of a non-prefix set (addresses or prefixes, communities, AS path regexps).
    /// Sent as `List`, listed as `list`.
    #[serde(
        rename(serialize = "List", deserialize = "list"),
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub list: Vec<String>,
    /// Members of a prefix set.
    #[serde(
        rename = "prefixList",
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub prefix_list: Vec<BgpPrefix>,
}

/// One prefix of a prefix set (`BGPPolicyPrefix`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BgpPrefix {
    /// A CIDR; loxilb lists it in network form.
    #[serde(rename = "ipPrefix")]
    pub ip_prefix: String,
    /// `min..max` (anything else is refused with 400 `Mask format is wrong`).
    #[serde(rename = "masklengthRange")]
    pub masklength_range: String,
}

impl BgpPrefix {
    /// `prefix` with mask lengths `min..=max`.
    pub fn new(prefix: &str, min: u8, max: u8) -> BgpPrefix {
        BgpPrefix {
            ip_prefix: prefix.to_string(),
            masklength_range: format!("{min}..{max}"),
        }
    }
}

/// A policy definition: `POST /config/bgp/policy/definitions` (`BGPPolicyDefinitionsMod`)
/// and `GET /config/bgp/policy/definitions/all`. A POST to an existing name appends its
/// statements; statement names are unique across all policies. The listing includes the
/// policies loxilb creates itself with the global configuration (`set-llb-export-gpolicy`,
/// `set-next-hop-self-gpolicy`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BgpPolicy {
    pub name: String,
    #[serde(deserialize_with = "null_as_default")]
    pub statements: Vec<BgpStatement>,
}

/// One statement. `conditions` and `actions` are always sent, even empty: loxilb's handler
/// crashes on a statement without either (the connection closes unanswered).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BgpStatement {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    pub conditions: BgpConditions,
    pub actions: BgpActions,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BgpConditions {
    #[serde(rename = "matchPrefixSet", skip_serializing_if = "Option::is_none")]
    pub match_prefix_set: Option<BgpMatchPrefixSet>,
    #[serde(rename = "matchNeighborSet", skip_serializing_if = "Option::is_none")]
    pub match_neighbor_set: Option<BgpMatchNeighborSet>,
    #[serde(rename = "bgpConditions", skip_serializing_if = "Option::is_none")]
    pub bgp_conditions: Option<BgpMatchConditions>,
}

/// `matchSetOption`: `any` (default), `all` or `invert`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BgpMatchPrefixSet {
    #[serde(rename = "prefixSet")]
    pub prefix_set: String,
    #[serde(rename = "matchSetOption", skip_serializing_if = "String::is_empty")]
    pub match_set_option: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BgpMatchNeighborSet {
    #[serde(rename = "neighborSet")]
    pub neighbor_set: String,
    #[serde(rename = "matchSetOption", skip_serializing_if = "String::is_empty")]
    pub match_set_option: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BgpMatchConditions {
    #[serde(
        rename = "afiSafiIn",
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub afi_safi_in: Vec<String>,
    #[serde(rename = "asPathLength", skip_serializing_if = "Option::is_none")]
    pub as_path_length: Option<BgpAsPathLength>,
    #[serde(rename = "matchAsPathSet", skip_serializing_if = "Option::is_none")]
    pub match_as_path_set: Option<BgpMatchAsPathSet>,
    #[serde(rename = "matchCommunitySet", skip_serializing_if = "Option::is_none")]
    pub match_community_set: Option<BgpMatchCommunitySet>,
    /// loxilb lists the community match here (and in the large one) whatever was sent.
    #[serde(
        rename = "matchExtCommunitySet",
        skip_serializing_if = "Option::is_none"
    )]
    pub match_ext_community_set: Option<BgpMatchCommunitySet>,
    #[serde(
        rename = "matchLargeCommunitySet",
        skip_serializing_if = "Option::is_none"
    )]
    pub match_large_community_set: Option<BgpMatchCommunitySet>,
    #[serde(
        rename = "nextHopInList",
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub next_hop_in_list: Vec<String>,
    /// `valid`, `invalid` or `not-found`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub rpki: String,
    /// `internal`, `external` or `local`.
    #[serde(rename = "routeType", skip_serializing_if = "String::is_empty")]
    pub route_type: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BgpAsPathLength {
    /// `eq`, `ge` or `le`.
    pub operator: String,
    pub value: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BgpMatchAsPathSet {
    #[serde(rename = "asPathSet")]
    pub as_path_set: String,
    #[serde(rename = "matchSetOptions", skip_serializing_if = "String::is_empty")]
    pub match_set_options: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BgpMatchCommunitySet {
    #[serde(rename = "communitySet")]
    pub community_set: String,
    #[serde(rename = "matchSetOptions", skip_serializing_if = "String::is_empty")]
    pub match_set_options: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BgpActions {
    /// `accept-route` or `reject-route` (anything else: no disposition).
    #[serde(rename = "routeDisposition", skip_serializing_if = "String::is_empty")]
    pub route_disposition: String,
    #[serde(rename = "bgpActions", skip_serializing_if = "Option::is_none")]
    pub bgp_actions: Option<BgpSetActions>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BgpSetActions {
    /// A number as text (an int32; anything else is refused).
    #[serde(rename = "setMed", skip_serializing_if = "String::is_empty")]
    pub set_med: String,
    #[serde(rename = "setNextHop", skip_serializing_if = "String::is_empty")]
    pub set_next_hop: String,
    /// The spec's spelling (`Perf`).
    #[serde(rename = "setLocalPerf", skip_serializing_if = "is_zero_u32")]
    pub set_local_pref: u32,
    #[serde(rename = "setCommunity", skip_serializing_if = "Option::is_none")]
    pub set_community: Option<BgpSetCommunity>,
    #[serde(rename = "setExtCommunity", skip_serializing_if = "Option::is_none")]
    pub set_ext_community: Option<BgpSetCommunity>,
    #[serde(rename = "setLargeCommunity", skip_serializing_if = "Option::is_none")]
    pub set_large_community: Option<BgpSetCommunity>,
    #[serde(rename = "setAsPathPrepend", skip_serializing_if = "Option::is_none")]
    pub set_as_path_prepend: Option<BgpAsPathPrepend>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BgpSetCommunity {
    /// `add`, `remove` or `replace`.
    pub options: String,
    #[serde(
        rename = "setCommunityMethod",
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub set_community_method: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BgpAsPathPrepend {
    /// The AS number as text.
    #[serde(rename = "as")]
    pub asn: String,
    #[serde(rename = "repeatN", skip_serializing_if = "is_zero_u32")]
    pub repeat_n: u32,
}

/// `policyType` of a policy application.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyDirection {
    Import,
    Export,
}

/// `routeAction`: the default for routes no applied policy decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RouteAction {
    Accept,
    Reject,
}

/// `POST` and `DELETE /config/bgp/policy/apply` (`BGPApplyPolicyToNeighborMod`). loxilb's
/// peers are not route-server clients, so goBGP takes policies only for the global RIB
/// ([`BgpPolicyApply::global`]); a peer address is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BgpPolicyApply {
    /// `global`, or a peer address.
    #[serde(rename = "ipAddress")]
    pub ip_address: String,
    #[serde(rename = "policyType")]
    pub policy_type: PolicyDirection,
    /// On a DELETE, empty means every policy of the direction.
    pub policies: Vec<String>,
    /// Required on the DELETE too (and ignored there).
    #[serde(rename = "routeAction")]
    pub route_action: RouteAction,
}

impl BgpPolicyApply {
    /// Policies for goBGP's global RIB.
    pub fn global(
        direction: PolicyDirection,
        policies: Vec<String>,
        route_action: RouteAction,
    ) -> BgpPolicyApply {
        BgpPolicyApply {
            ip_address: "global".into(),
            policy_type: direction,
            policies,
            route_action,
        }
    }
}

/// `GET /config/bgp/neigh/all`.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct NeighborList {
    #[serde(rename = "bgpNeiAttr", default, deserialize_with = "null_as_default")]
    pub neighbors: Vec<BgpNeighborStatus>,
}

/// `GET /config/bgp/policy/definedsets/{type}/{name}`.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct DefinedSetList {
    #[serde(
        rename = "definedsetsAttr",
        default,
        deserialize_with = "null_as_default"
    )]
    pub sets: Vec<BgpDefinedSet>,
}

/// `GET /config/bgp/policy/definitions/all`.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct PolicyList {
    #[serde(
        rename = "bgpPolicyAttr",
        default,
        deserialize_with = "null_as_default"
    )]
    pub policies: Vec<BgpPolicy>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn requests_use_the_spec_spellings() {
        let g = BgpGlobal {
            router_id: Ipv4Addr::new(192, 168, 10, 5),
            local_as: 4_200_000_001,
            set_next_hop_self: true,
            listen_port: 0,
        };
        assert_eq!(
            serde_json::to_value(&g).unwrap(),
            json!({"routerId": "192.168.10.5", "localAs": 4_200_000_001_u32,
                "SetNextHopSelf": true, "listenPort": 0})
        );
        let set = BgpDefinedSet {
            name: "peers".into(),
            list: vec!["10.0.0.1/32".into()],
            prefix_list: vec![],
        };
        assert_eq!(
            serde_json::to_value(&set).unwrap(),
            json!({"name": "peers", "List": ["10.0.0.1/32"]})
        );
        let st = BgpStatement {
            name: "s".into(),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&st).unwrap(),
            json!({"name": "s", "conditions": {}, "actions": {}}),
            "conditions and actions are always sent"
        );
    }

    #[test]
    fn listings_read_nulls_and_the_lower_case_list() {
        let sets: DefinedSetList = serde_json::from_str(
            r#"{"definedsetsAttr":[{"name":"n","list":["a"],"prefixList":null}]}"#,
        )
        .unwrap();
        assert_eq!(sets.sets[0].list, ["a"]);
        assert!(sets.sets[0].prefix_list.is_empty());
        let p: PolicyList = serde_json::from_str(
            r#"{"bgpPolicyAttr":[{"name":"p","statements":null},{"statements":[{"conditions":
            {"bgpConditions":{"afiSafiIn":null,"asPathLength":{}}},"actions":{"bgpActions":
            {"setCommunity":{"setCommunityMethod":null}}}}]}]}"#,
        )
        .unwrap();
        assert!(p.policies[0].statements.is_empty());
        assert_eq!(p.policies[1].statements.len(), 1);
    }
}
