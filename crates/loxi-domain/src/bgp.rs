//! BGP on loxilb: the typed settings (local AS, router id, peers), kube-loxilb's BGP policy
//! resources as plain data with their checks, and the `bgp` flag of rule calls so that every
//! served address is advertised exactly once per rule (docs/loxilb-api.md#bgp).
//!
//! Every bad input is a [`BgpError`] naming the setting or field and the value.
//!
//! **Spellings.** The settings take kube-loxilb's flags (`setBGP`, `listenBGPPort`,
//! `eBGPMultiHop`, `extBGPPeers`); the router id is loxi-ccm's own ([`FIELD_ROUTER_ID`]),
//! kube-loxilb always uses the loxilb's address. A peer item is kube-loxilb's `IP:ASN`, plus
//! two forms kube-loxilb refuses (it splits the item at `:` and rejects more than two parts),
//! so no value it accepts changes meaning:
//! - `[IPv6]:ASN` for IPv6 peers (kube-loxilb cannot express them);
//! - an optional remote port, `IP:ASN:PORT` / `[IPv6]:ASN:PORT` (the `remotePort` of
//!   `POST /config/bgp/neigh`; absent: 179).
//!
//! AS numbers are 4-byte (1 to 4294967295), written plain (`65546`) or in asdot (`1.10`,
//! = 1 × 65536 + 10); 0 is refused. kube-loxilb's `setBGP` is a 16-bit number and it accepts
//! neither asdot nor values past 65535 there.

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::text::shown;

/// kube-loxilb's flag for the local AS number (unset, empty or `0`: BGP off).
pub const FIELD_LOCAL_ASN: &str = "setBGP";
/// The BGP router id (loxi-ccm's own setting; loxilb's API calls it `routerId`).
pub const FIELD_ROUTER_ID: &str = "bgpRouterId";
/// kube-loxilb's flag for the port goBGP listens on.
pub const FIELD_LISTEN_PORT: &str = "listenBGPPort";
/// kube-loxilb's flag for the external peers, `IP:ASN` separated by commas.
pub const FIELD_PEERS: &str = "extBGPPeers";

/// A bad BGP setting or policy field.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{field}{} is invalid: {reason}", .value.as_deref().map(|v| format!("={}", shown(v))).unwrap_or_default())]
pub struct BgpError {
    /// The setting (`extBGPPeers`) or the field's path in a resource
    /// (`spec.prefixList[0].masklengthRange`).
    pub field: String,
    /// The value as given; `None` when the field is missing or is an object.
    pub value: Option<String>,
    pub reason: String,
}

impl BgpError {
    /// Stable category for Events and metrics.
    pub fn reason(&self) -> &'static str {
        "InvalidBGPConfig"
    }
}

fn bad(field: impl Into<String>, value: &str, reason: impl Into<String>) -> BgpError {
    BgpError {
        field: field.into(),
        value: Some(value.to_string()),
        reason: reason.into(),
    }
}

fn missing(field: impl Into<String>, reason: impl Into<String>) -> BgpError {
    BgpError {
        field: field.into(),
        value: None,
        reason: reason.into(),
    }
}

// ---------------------------------------------------------------------------------------
// AS numbers

/// A 4-byte BGP AS number, 1 to 4294967295 (0 is reserved and refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Asn(u32);

impl Asn {
    pub const MAX: u32 = u32::MAX;

    /// `None` for 0.
    pub fn new(n: u32) -> Option<Asn> {
        (n != 0).then_some(Asn(n))
    }

    pub fn get(self) -> u32 {
        self.0
    }

    /// From a number of a resource (kube-loxilb's `remoteAs` is an int64).
    pub fn from_i64(n: i64) -> Option<Asn> {
        u32::try_from(n).ok().and_then(Asn::new)
    }

    /// Plain (`65001`, `4200000000`) or asdot (`1.10` = 65546; `0.100` = 100).
    pub fn parse(text: &str) -> Result<Asn, String> {
        let t = text.trim();
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let n: Option<u64> = match t.split_once('.') {
            None if digits(t) => Some(t.parse::<u64>().unwrap_or(u64::MAX)),
            Some((hi, lo)) if digits(hi) && digits(lo) => {
                match (hi.parse::<u16>(), lo.parse::<u16>()) {
                    (Ok(hi), Ok(lo)) => Some((u64::from(hi) << 16) | u64::from(lo)),
                    _ => {
                        return Err(format!(
                            "{} is not an AS number: in asdot form both halves are 0 to 65535",
                            shown(t)
                        ));
                    }
                }
            }
            _ => None,
        };
        match n {
            None => Err(format!(
                "{} is not an AS number (1 to 4294967295, or asdot such as 1.10)",
                shown(t)
            )),
            Some(0) => Err("AS 0 is reserved and cannot be used".to_string()),
            Some(n) => u32::try_from(n).map(Asn).map_err(|_| {
                format!(
                    "{} is out of range: AS numbers go from 1 to 4294967295",
                    shown(t)
                )
            }),
        }
    }
}

impl fmt::Display for Asn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// [`Asn::parse`] with the error naming `field`.
pub fn parse_asn(field: &str, text: &str) -> Result<Asn, BgpError> {
    Asn::parse(text).map_err(|reason| bad(field, text, reason))
}

// ---------------------------------------------------------------------------------------
// Peers

/// One BGP neighbour (`POST /config/bgp/neigh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Peer {
    pub address: IpAddr,
    pub asn: Asn,
    /// The remote port; `None`: 179 (sent as 0).
    pub port: Option<u16>,
}

impl fmt::Display for Peer {
    /// The item form [`Peer::parse`] reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.address {
            IpAddr::V4(a) => write!(f, "{a}:{}", self.asn)?,
            IpAddr::V6(a) => write!(f, "[{a}]:{}", self.asn)?,
        }
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        Ok(())
    }
}

impl Peer {
    /// One `extBGPPeers` item: `192.0.2.1:65001`, `[2001:db8::1]:65001`, optionally
    /// followed by `:PORT`.
    pub fn parse(item: &str) -> Result<Peer, BgpError> {
        parse_peer_item(item.trim()).map_err(|reason| bad(FIELD_PEERS, item, reason))
    }
}

const PEER_FORMS: &str = "IP:ASN (192.0.2.1:65001) or [IPv6]:ASN ([2001:db8::1]:65001)";

fn parse_peer_item(item: &str) -> Result<Peer, String> {
    let (address, rest) = if let Some(inner) = item.strip_prefix('[') {
        let Some((addr, rest)) = inner.split_once(']') else {
            return Err(format!("no closing ]: expected {PEER_FORMS}"));
        };
        let address: IpAddr = addr
            .parse()
            .map_err(|_| format!("{} is not an IP address", shown(addr)))?;
        let rest = match rest.strip_prefix(':') {
            Some(rest) => rest,
            None if rest.is_empty() => {
                return Err(format!("the AS number is missing: expected [{addr}]:ASN"));
            }
            None => return Err(format!("expected {PEER_FORMS}")),
        };
        (address, rest)
    } else if item.contains("::") || item.matches(':').count() > 2 {
        return Err(unbracketed_v6(item));
    } else {
        let Some((addr, rest)) = item.split_once(':') else {
            return Err(match item.parse::<IpAddr>() {
                Ok(_) => format!("the AS number is missing: expected {item}:ASN"),
                Err(_) => format!("expected {PEER_FORMS}"),
            });
        };
        let address: Ipv4Addr = addr
            .parse()
            .map_err(|_| format!("{} is not an IPv4 address", shown(addr)))?;
        (IpAddr::V4(address), rest)
    };
    if address.is_unspecified() || address.is_multicast() {
        return Err(format!("{address} cannot be a BGP peer"));
    }
    let (asn, port) = match rest.split_once(':') {
        None => (rest, None),
        Some((asn, port)) => (asn, Some(port)),
    };
    if asn.is_empty() {
        return Err("the AS number is missing".to_string());
    }
    let asn = Asn::parse(asn)?;
    let port = match port {
        None => None,
        Some(p) => match p.parse::<u16>() {
            Ok(0) | Err(_) => {
                return Err(format!(
                    "the port {} is not a port from 1 to 65535 (leave it out for 179)",
                    shown(p)
                ));
            }
            Ok(p) => Some(p),
        },
    };
    Ok(Peer { address, asn, port })
}

/// The reason for an IPv6 peer written without brackets, with the bracketed form to use.
fn unbracketed_v6(item: &str) -> String {
    let hint = match item.rsplit_once(':') {
        Some((addr, asn))
            if addr.parse::<Ipv6Addr>().is_ok()
                && !asn.is_empty()
                && asn.bytes().all(|b| b.is_ascii_digit()) =>
        {
            format!("[{addr}]:{asn}")
        }
        _ if item.parse::<Ipv6Addr>().is_ok() => format!("[{item}]:ASN"),
        _ => "[2001:db8::1]:65001".to_string(),
    };
    format!("an IPv6 peer is written in brackets, [address]:ASN, for example {hint}")
}

/// The `extBGPPeers` value: items separated by commas, empty items ignored. A peer address
/// given twice is refused (loxilb keeps one peer per address).
pub fn parse_peers(list: &str) -> Result<Vec<Peer>, BgpError> {
    let mut peers: Vec<Peer> = Vec::new();
    let mut seen = BTreeSet::new();
    for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let peer = parse_peer_item(item).map_err(|reason| {
            let reason = if list.trim() == item {
                reason
            } else {
                format!("{}: {reason}", shown(item))
            };
            bad(FIELD_PEERS, list, reason)
        })?;
        if !seen.insert(peer.address) {
            return Err(bad(
                FIELD_PEERS,
                list,
                format!(
                    "the peer {} is given twice (loxilb keeps one peer per address)",
                    peer.address
                ),
            ));
        }
        peers.push(peer);
    }
    Ok(peers)
}

// ---------------------------------------------------------------------------------------
// Settings

/// The BGP settings as the operator gives them (flags or config keys), unparsed.
#[derive(Debug, Clone, Copy, Default)]
pub struct BgpInput<'a> {
    /// `setBGP`: the local AS. Unset, empty or `0` (kube-loxilb's "off"): no BGP.
    pub local_asn: Option<&'a str>,
    /// [`FIELD_ROUTER_ID`]: an IPv4 address; unset: the loxilb's own address.
    pub router_id: Option<&'a str>,
    /// `listenBGPPort`; unset or 0: 179.
    pub listen_port: Option<u16>,
    /// `eBGPMultiHop`: eBGP multihop (TTL 8) towards the peers.
    pub multihop: bool,
    /// `extBGPPeers`.
    pub peers: Option<&'a str>,
}

/// What loxi-ccm configures on each loxilb when BGP is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BgpSettings {
    pub local_asn: Asn,
    /// `None`: the loxilb's own address ([`BgpSettings::router_id_for`]).
    pub router_id: Option<Ipv4Addr>,
    /// `None`: 179.
    pub listen_port: Option<u16>,
    pub multihop: bool,
    pub peers: Vec<Peer>,
}

impl BgpSettings {
    /// `Ok(None)`: BGP is off. Settings that only make sense with BGP on (peers, router id)
    /// are refused without a local AS, as kube-loxilb refuses `extBGPPeers` without
    /// `setBGP`; `listenBGPPort` and `eBGPMultiHop` are then ignored, as there.
    pub fn from_input(input: &BgpInput<'_>) -> Result<Option<BgpSettings>, BgpError> {
        fn given(v: Option<&str>) -> Option<&str> {
            v.map(str::trim).filter(|v| !v.is_empty())
        }
        let local = given(input.local_asn).filter(|v| *v != "0");
        let router_id = given(input.router_id);
        let peers = given(input.peers);
        let Some(local) = local else {
            if let Some(p) = peers {
                return Err(bad(
                    FIELD_PEERS,
                    p,
                    format!("peers need the local AS number ({FIELD_LOCAL_ASN})"),
                ));
            }
            if let Some(r) = router_id {
                return Err(bad(
                    FIELD_ROUTER_ID,
                    r,
                    format!("a router id needs the local AS number ({FIELD_LOCAL_ASN})"),
                ));
            }
            return Ok(None);
        };
        let local_asn = parse_asn(FIELD_LOCAL_ASN, local)?;
        let router_id = router_id.map(parse_router_id).transpose()?;
        let peers = match peers {
            Some(p) => parse_peers(p)?,
            None => Vec::new(),
        };
        Ok(Some(BgpSettings {
            local_asn,
            router_id,
            listen_port: input.listen_port.filter(|p| *p != 0),
            multihop: input.multihop,
            peers,
        }))
    }

    /// The router id to give the loxilb reached at `loxilb` (its API host's address, `None`
    /// for a host name): the configured one, else that address when it is IPv4.
    pub fn router_id_for(&self, loxilb: Option<IpAddr>) -> Result<Ipv4Addr, BgpError> {
        if let Some(id) = self.router_id {
            return Ok(id);
        }
        match loxilb {
            Some(IpAddr::V4(a)) if !a.is_unspecified() => Ok(a),
            Some(a) => Err(missing(
                FIELD_ROUTER_ID,
                format!(
                    "not set, and the loxilb address {a} cannot be the router id (an IPv4 \
                     address is needed): set {FIELD_ROUTER_ID}"
                ),
            )),
            None => Err(missing(
                FIELD_ROUTER_ID,
                format!(
                    "not set, and this loxilb is reached by name, not by an IPv4 address: set \
                     {FIELD_ROUTER_ID}"
                ),
            )),
        }
    }
}

/// A router id: an IPv4 address other than 0.0.0.0 (a 32-bit identifier, IPv4 even on IPv6
/// networks; loxilb answers 400 `invalid router-id format` otherwise).
pub fn parse_router_id(text: &str) -> Result<Ipv4Addr, BgpError> {
    let t = text.trim();
    match t.parse::<IpAddr>() {
        Ok(IpAddr::V4(a)) if !a.is_unspecified() && !a.is_broadcast() && !a.is_multicast() => Ok(a),
        Ok(IpAddr::V4(_)) => Err(bad(FIELD_ROUTER_ID, text, "not a usable router id")),
        Ok(IpAddr::V6(_)) => Err(bad(
            FIELD_ROUTER_ID,
            text,
            "a BGP router id is an IPv4 address (a 32-bit number), also on IPv6 networks: \
             pick a unique IPv4 address",
        )),
        Err(_) => Err(bad(FIELD_ROUTER_ID, text, "not an IPv4 address")),
    }
}

// ---------------------------------------------------------------------------------------
// kube-loxilb's BGP resources
//
// The `spec` of kube-loxilb's four cluster-scoped BGP custom resources, with kube-loxilb's
// field names, so its manifests are read unchanged (unknown fields are ignored). Found in
// github.com/loxilb-io/kube-loxilb:
//
// - `BGPPeerService`, group `bgppeer.loxilb.io/v1` (manifest/crds/bgp-peer-service.yaml,
//   pkg/crds/bgppeer/v1/types.go `BGPNeigh`): `spec.ipAddress` (string, required),
//   `spec.remoteAs` (integer, required), `spec.remotePort` (integer), `spec.setMultiHop`
//   (boolean; in the CRD schema only: kube-loxilb's Go type drops it).
// - `BGPPolicyDefinedSetsService`, group `bgppolicydefinedsets.loxilb.io/v1`
//   (manifest/crds/bgp-policy-defined-sets-service.yaml, pkg/api/bgppolicydefinedsets.go):
//   `spec.name` (required), `spec.definedType`, `spec.List` (capital L), `spec.prefixList[]`
//   of `{ipPrefix, masklengthRange}`.
// - `BGPPolicyDefinitionService`, group `bgppolicydefinition.loxilb.io/v1`
//   (manifest/crds/bgp-policy-definition-service.yaml,
//   pkg/crds/bgppolicydefinition/v1/types.go): `spec.name`, `spec.statements[]` of
//   `{name, conditions: {matchPrefixSet: {matchSetOption, prefixSet}, matchNeighborSet:
//   {matchSetOption, neighborSet}, bgpConditions: {afiSafiIn, asPathLength: {operator,
//   value}, matchAsPathSet: {asPathSet, matchSetOptions}, matchCommunitySet,
//   matchExtCommunitySet, matchLargeCommunitySet: {communitySet, matchSetOptions},
//   nextHopInList, rpki, routeType}}, actions: {routeDisposition, bgpActions: {setMed,
//   setNextHop, setLocalPref, setCommunity, setExtCommunity, setLargeCommunity: {options,
//   setCommunityMethod}, setAsPathPrepend: {as, repeatN}}}}`. The CRD schema and the Go type
//   disagree on two names: `matchLargeCommunitySet` (schema; loxilb's API too) vs
//   `largeCommunitySet` (Go), and `setLocalPref` (schema) vs `setLocalPerf` (Go; loxilb's
//   API field is `SetLocalPerf`). The schema's names are read, the Go names as aliases.
// - `BGPPolicyApplyService`, group `bgppolicyapply.loxilb.io/v1`
//   (manifest/crds/bgp-policy-apply-service.yaml, pkg/api/bgppolicyapply.go):
//   `spec.ipAddress` (the neighbour), `spec.policyType`, `spec.policies` (list),
//   `spec.routeAction`.

/// `spec` of kube-loxilb's `BGPPeerService` (`bgppeer.loxilb.io/v1`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct BGPPeerServiceSpec {
    #[serde(default)]
    pub ip_address: String,
    #[serde(default)]
    pub remote_as: i64,
    /// 0 or absent: 179.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_port: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_multi_hop: Option<bool>,
}

impl BGPPeerServiceSpec {
    /// The peer; multihop is [`BGPPeerServiceSpec::set_multi_hop`] (absent: off, as
    /// kube-loxilb, which never sends it for these peers).
    pub fn peer(&self) -> Result<Peer, BgpError> {
        let ip = self.ip_address.trim();
        if ip.is_empty() {
            return Err(missing("spec.ipAddress", "required"));
        }
        let address: IpAddr = ip
            .parse()
            .map_err(|_| bad("spec.ipAddress", ip, "not an IP address"))?;
        if address.is_unspecified() || address.is_multicast() {
            return Err(bad("spec.ipAddress", ip, "cannot be a BGP peer"));
        }
        let asn = Asn::from_i64(self.remote_as).ok_or_else(|| {
            bad(
                "spec.remoteAs",
                &self.remote_as.to_string(),
                "expected an AS number from 1 to 4294967295",
            )
        })?;
        let port = match self.remote_port.unwrap_or(0) {
            0 => None,
            p => Some(u16::try_from(p).map_err(|_| {
                bad(
                    "spec.remotePort",
                    &p.to_string(),
                    "expected a port from 1 to 65535 (0 or absent: 179)",
                )
            })?),
        };
        Ok(Peer { address, asn, port })
    }
}

/// `spec` of kube-loxilb's `BGPPolicyDefinedSetsService`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct BGPPolicyDefinedSetsServiceSpec {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub defined_type: String,
    /// `List` (capital L): the members of every type but `prefix`.
    #[serde(default, rename = "List", skip_serializing_if = "Vec::is_empty")]
    pub list: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefix_list: Vec<BGPPolicyPrefix>,
}

/// One `prefixList` entry.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct BGPPolicyPrefix {
    #[serde(default)]
    pub ip_prefix: String,
    /// `min..max`.
    #[serde(default)]
    pub masklength_range: String,
}

/// The type of a defined set: the `{type}` of `POST /config/bgp/policy/definedsets/{type}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DefinedType {
    Prefix,
    Neighbor,
    Community,
    ExtCommunity,
    LargeCommunity,
    AsPath,
}

impl DefinedType {
    /// loxilb's spellings, any case; `neigh` and `nei` are `neighbor`.
    pub fn parse(s: &str) -> Option<DefinedType> {
        Some(match s.trim().to_ascii_lowercase().as_str() {
            "prefix" => DefinedType::Prefix,
            "neighbor" | "neigh" | "nei" => DefinedType::Neighbor,
            "community" => DefinedType::Community,
            "extcommunity" => DefinedType::ExtCommunity,
            "largecommunity" => DefinedType::LargeCommunity,
            "aspath" => DefinedType::AsPath,
            _ => return None,
        })
    }

    /// The path segment to send.
    pub fn as_loxilb(self) -> &'static str {
        match self {
            DefinedType::Prefix => "prefix",
            DefinedType::Neighbor => "neighbor",
            DefinedType::Community => "community",
            DefinedType::ExtCommunity => "extcommunity",
            DefinedType::LargeCommunity => "largecommunity",
            DefinedType::AsPath => "aspath",
        }
    }
}

/// A prefix set entry's `masklengthRange`: `min..max` with 0 <= min <= max <= 128.
pub fn parse_masklength_range(field: &str, text: &str) -> Result<(u8, u8), BgpError> {
    let refuse = || {
        bad(
            field,
            text,
            "expected min..max with 0 <= min <= max <= 128, for example 24..32",
        )
    };
    let (min, max) = text.trim().split_once("..").ok_or_else(refuse)?;
    let number = |s: &str| {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<u8>().ok())
            .flatten()
    };
    match (number(min), number(max)) {
        (Some(min), Some(max)) if min <= max && max <= 128 => Ok((min, max)),
        _ => Err(refuse()),
    }
}

impl BGPPolicyDefinedSetsServiceSpec {
    /// Checks the set; answers its type (the path segment of the call).
    pub fn validate(&self) -> Result<DefinedType, BgpError> {
        if self.name.trim().is_empty() {
            return Err(missing("spec.name", "required"));
        }
        if self.defined_type.trim().is_empty() {
            return Err(missing(
                "spec.definedType",
                "required: prefix, neighbor, community, extcommunity, largecommunity or aspath",
            ));
        }
        let kind = DefinedType::parse(&self.defined_type).ok_or_else(|| {
            bad(
                "spec.definedType",
                &self.defined_type,
                "expected prefix, neighbor, community, extcommunity, largecommunity or aspath",
            )
        })?;
        if kind == DefinedType::Prefix {
            if !self.list.is_empty() {
                return Err(missing(
                    "spec.List",
                    "a prefix set takes its prefixes from prefixList; List is ignored by \
                     loxilb for this type",
                ));
            }
            if self.prefix_list.is_empty() {
                return Err(missing("spec.prefixList", "a prefix set needs prefixes"));
            }
            for (i, p) in self.prefix_list.iter().enumerate() {
                let field = format!("spec.prefixList[{i}].ipPrefix");
                if p.ip_prefix.trim().is_empty() {
                    return Err(missing(field, "required"));
                }
                p.ip_prefix
                    .trim()
                    .parse::<IpNet>()
                    .map_err(|_| bad(field, &p.ip_prefix, "not a prefix such as 10.0.0.0/8"))?;
                parse_masklength_range(
                    &format!("spec.prefixList[{i}].masklengthRange"),
                    &p.masklength_range,
                )?;
            }
        } else {
            if !self.prefix_list.is_empty() {
                return Err(missing(
                    "spec.prefixList",
                    format!(
                        "only prefix sets use prefixList; a {} set lists its members in List",
                        kind.as_loxilb()
                    ),
                ));
            }
            if self.list.is_empty() {
                return Err(missing("spec.List", "the set has no members"));
            }
            for (i, member) in self.list.iter().enumerate() {
                let field = format!("spec.List[{i}]");
                let m = member.trim();
                if m.is_empty() {
                    return Err(bad(field, member, "empty member"));
                }
                if kind == DefinedType::Neighbor
                    && m.parse::<IpAddr>().is_err()
                    && m.parse::<IpNet>().is_err()
                {
                    return Err(bad(field, member, "not an IP address or prefix"));
                }
            }
        }
        Ok(kind)
    }
}

/// `spec` of kube-loxilb's `BGPPolicyDefinitionService`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct BGPPolicyDefinitionServiceSpec {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub statements: Vec<BGPPolicyStatement>,
}

/// One statement: loxilb needs both objects (without one the request crashes it).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct BGPPolicyStatement {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<BGPPolicyConditions>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actions: Option<BGPPolicyActions>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct BGPPolicyConditions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_prefix_set: Option<MatchPrefixSet>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_neighbor_set: Option<MatchNeighborSet>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bgp_conditions: Option<BGPConditions>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct MatchPrefixSet {
    #[serde(default)]
    pub match_set_option: String,
    #[serde(default)]
    pub prefix_set: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct MatchNeighborSet {
    #[serde(default)]
    pub match_set_option: String,
    #[serde(default)]
    pub neighbor_set: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct BGPConditions {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub afi_safi_in: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub as_path_length: Option<AsPathLength>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_as_path_set: Option<BGPAsPathSet>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_community_set: Option<BGPCommunitySet>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_ext_community_set: Option<BGPCommunitySet>,
    /// `matchLargeCommunitySet` (kube-loxilb's Go type: `largeCommunitySet`).
    #[serde(
        default,
        alias = "largeCommunitySet",
        skip_serializing_if = "Option::is_none"
    )]
    pub match_large_community_set: Option<BGPCommunitySet>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub next_hop_in_list: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub rpki: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub route_type: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct AsPathLength {
    #[serde(default)]
    pub operator: String,
    #[serde(default)]
    pub value: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct BGPAsPathSet {
    #[serde(default)]
    pub as_path_set: String,
    #[serde(default)]
    pub match_set_options: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct BGPCommunitySet {
    #[serde(default)]
    pub community_set: String,
    #[serde(default)]
    pub match_set_options: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct BGPPolicyActions {
    /// `accept-route`, `reject-route`, or empty (none: the next statement decides).
    #[serde(default)]
    pub route_disposition: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bgp_actions: Option<BGPActions>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct BGPActions {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub set_med: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub set_next_hop: String,
    /// `setLocalPref` (kube-loxilb's Go type and loxilb: `setLocalPerf`).
    #[serde(
        default,
        alias = "setLocalPerf",
        skip_serializing_if = "Option::is_none"
    )]
    pub set_local_pref: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_community: Option<SetCommunity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_ext_community: Option<SetCommunity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_large_community: Option<SetCommunity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_as_path_prepend: Option<SetAsPathPrepend>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SetCommunity {
    #[serde(default)]
    pub options: String,
    #[serde(default)]
    pub set_community_method: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SetAsPathPrepend {
    /// `as`.
    #[serde(default, rename = "as")]
    pub asn: String,
    #[serde(default)]
    pub repeat_n: i64,
}

/// goBGP's match options for as-path and community sets (empty: any).
const MATCH_OPTIONS: [&str; 3] = ["any", "all", "invert"];
/// goBGP's match options for prefix and neighbour sets: `all` has no meaning there.
const MATCH_OPTIONS_RESTRICTED: [&str; 2] = ["any", "invert"];

fn match_option(field: String, value: &str, allowed: &[&str]) -> Result<(), BgpError> {
    if value.is_empty() || allowed.contains(&value) {
        Ok(())
    } else {
        Err(bad(
            field,
            value,
            format!("expected {} (empty: any)", allowed.join(", ")),
        ))
    }
}

impl BGPPolicyDefinitionServiceSpec {
    pub fn validate(&self) -> Result<(), BgpError> {
        if self.name.trim().is_empty() {
            return Err(missing("spec.name", "required"));
        }
        for (i, st) in self.statements.iter().enumerate() {
            let at = format!("spec.statements[{i}]");
            let which = if st.name.trim().is_empty() {
                format!("statement {i} (unnamed)")
            } else {
                format!("statement {}", shown(&st.name))
            };
            let needs = |what: &str| {
                missing(
                    at.clone(),
                    format!(
                        "{which} has no {what}: loxilb needs both conditions and actions in \
                         every statement (without one the request crashes its API)"
                    ),
                )
            };
            let conditions = st.conditions.as_ref().ok_or_else(|| needs("conditions"))?;
            let actions = st.actions.as_ref().ok_or_else(|| needs("actions"))?;
            if let Some(m) = &conditions.match_prefix_set {
                match_option(
                    format!("{at}.conditions.matchPrefixSet.matchSetOption"),
                    &m.match_set_option,
                    &MATCH_OPTIONS_RESTRICTED,
                )?;
            }
            if let Some(m) = &conditions.match_neighbor_set {
                match_option(
                    format!("{at}.conditions.matchNeighborSet.matchSetOption"),
                    &m.match_set_option,
                    &MATCH_OPTIONS_RESTRICTED,
                )?;
            }
            if let Some(b) = &conditions.bgp_conditions {
                let cond = format!("{at}.conditions.bgpConditions");
                if let Some(s) = &b.match_as_path_set {
                    match_option(
                        format!("{cond}.matchAsPathSet.matchSetOptions"),
                        &s.match_set_options,
                        &MATCH_OPTIONS,
                    )?;
                }
                for (name, set) in [
                    ("matchCommunitySet", &b.match_community_set),
                    ("matchExtCommunitySet", &b.match_ext_community_set),
                    ("matchLargeCommunitySet", &b.match_large_community_set),
                ] {
                    if let Some(s) = set {
                        match_option(
                            format!("{cond}.{name}.matchSetOptions"),
                            &s.match_set_options,
                            &MATCH_OPTIONS,
                        )?;
                    }
                }
            }
            match actions.route_disposition.as_str() {
                "" | "accept-route" | "reject-route" => {}
                other => {
                    return Err(bad(
                        format!("{at}.actions.routeDisposition"),
                        other,
                        "expected accept-route or reject-route (empty: the next statement \
                         decides)",
                    ));
                }
            }
        }
        Ok(())
    }
}

/// `spec` of kube-loxilb's `BGPPolicyApplyService`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct BGPPolicyApplyServiceSpec {
    /// Where the policies apply: `global` (goBGP's global RIB, the only target loxilb's
    /// peers support) or a neighbour's address (kube-loxilb's examples; loxilb refuses it
    /// for peers that are not route-server clients, which it never makes them).
    #[serde(default)]
    pub ip_address: String,
    #[serde(default)]
    pub policy_type: String,
    #[serde(default)]
    pub policies: Vec<String>,
    #[serde(default)]
    pub route_action: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyType {
    Import,
    Export,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RouteAction {
    Accept,
    Reject,
}

/// A checked `BGPPolicyApplyService`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyApply {
    /// `None`: `global`.
    pub neighbor: Option<IpAddr>,
    pub policy_type: PolicyType,
    pub policies: Vec<String>,
    pub route_action: RouteAction,
}

impl BGPPolicyApplyServiceSpec {
    pub fn validate(&self) -> Result<PolicyApply, BgpError> {
        let ip = self.ip_address.trim();
        if ip.is_empty() {
            return Err(missing(
                "spec.ipAddress",
                "required: global or the neighbour's address",
            ));
        }
        let neighbor: Option<IpAddr> = if ip == "global" {
            None
        } else {
            Some(
                ip.parse()
                    .map_err(|_| bad("spec.ipAddress", ip, "not an IP address or global"))?,
            )
        };
        let policy_type = match self.policy_type.as_str() {
            "import" => PolicyType::Import,
            "export" => PolicyType::Export,
            "" => return Err(missing("spec.policyType", "required: import or export")),
            other => return Err(bad("spec.policyType", other, "expected import or export")),
        };
        if self.policies.is_empty() {
            return Err(missing("spec.policies", "names no policy"));
        }
        for (i, p) in self.policies.iter().enumerate() {
            if p.trim().is_empty() {
                return Err(bad(format!("spec.policies[{i}]"), p, "empty policy name"));
            }
        }
        let route_action = match self.route_action.as_str() {
            "accept" => RouteAction::Accept,
            "reject" => RouteAction::Reject,
            "" => return Err(missing("spec.routeAction", "required: accept or reject")),
            other => return Err(bad("spec.routeAction", other, "expected accept or reject")),
        };
        Ok(PolicyApply {
            neighbor,
            policy_type,
            policies: self.policies.clone(),
            route_action,
        })
    }
}

// ---------------------------------------------------------------------------------------
// Advertisement accounting

/// What the controller is about to do with the rule of one key on one loxilb.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RuleChange {
    Create,
    /// POST over the existing rule (changed in place).
    Update,
    Delete,
    /// DELETE then POST.
    Recreate,
}

/// The rule of that key on that loxilb as the controller knows it (from its own calls, or
/// a listing, which shows the `bgp` the rule was created with).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoredRule {
    Absent,
    Present {
        /// The `bgp` the rule was created with (loxilb never changes it afterwards).
        bgp: bool,
    },
}

/// The `bgp` values to send for one [`RuleChange`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BgpFlags {
    /// `Some(b)`: first `DELETE ...?bgp=b`.
    pub delete: Option<bool>,
    /// `Some(b)`: then POST the rule with `"bgp": b`.
    pub post: Option<bool>,
    /// The rule afterwards, when the calls succeed.
    pub after: StoredRule,
}

/// The `bgp` flags for `change` so that loxilb's advertisement count of the rule's address
/// stays the number of live rules created with `bgp` there (docs/loxilb-api.md#bgp): every
/// 200 POST with `bgp: true` adds one reference, every DELETE with `?bgp=true` drops one
/// (even a 404), the route goes at zero.
///
/// - a POST that creates the rule carries `advertise`;
/// - a POST over an existing rule carries `false`: loxilb never changes a rule's `bgp`, and
///   a 200 with `true` would add a reference no delete removes. To change whether a live
///   rule is advertised, recreate it ([`bgp_needs_recreate`]);
/// - a DELETE carries the `bgp` the rule was created with, and `false` for a rule the
///   controller believes absent (a `true` would drop another rule's reference).
///
/// A change that does not fit what is stored is read as what loxilb will do: a create over
/// an existing rule is an update, an update of an absent rule creates it.
pub fn bgp_flags(change: RuleChange, stored: StoredRule, advertise: bool) -> BgpFlags {
    let delete_flag = match stored {
        StoredRule::Absent => false,
        StoredRule::Present { bgp } => bgp,
    };
    let created = StoredRule::Present { bgp: advertise };
    match (change, stored) {
        (RuleChange::Create | RuleChange::Update, StoredRule::Absent) => BgpFlags {
            delete: None,
            post: Some(advertise),
            after: created,
        },
        (RuleChange::Create | RuleChange::Update, StoredRule::Present { .. }) => BgpFlags {
            delete: None,
            post: Some(false),
            after: stored,
        },
        (RuleChange::Delete, _) => BgpFlags {
            delete: Some(delete_flag),
            post: None,
            after: StoredRule::Absent,
        },
        (RuleChange::Recreate, _) => BgpFlags {
            delete: Some(delete_flag),
            post: Some(advertise),
            after: created,
        },
    }
}

/// Whether a live rule must be recreated (not updated) for its advertisement to become
/// `advertise`: loxilb never updates `bgp`.
pub fn bgp_needs_recreate(stored: StoredRule, advertise: bool) -> bool {
    matches!(stored, StoredRule::Present { bgp } if bgp != advertise)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err_field(r: Result<impl fmt::Debug, BgpError>) -> (String, Option<String>, String) {
        let e = r.expect_err("should be refused");
        let msg = e.to_string();
        assert!(msg.contains(&e.field), "{msg}");
        if let Some(v) = &e.value {
            assert!(msg.contains(&shown(v)), "{msg}");
        }
        (e.field, e.value, msg)
    }

    #[test]
    fn asn_plain_asdot_and_range() {
        assert_eq!(Asn::parse("65001").unwrap().get(), 65001);
        assert_eq!(Asn::parse(" 4294967295 ").unwrap().get(), u32::MAX);
        assert_eq!(Asn::parse("1.10").unwrap().get(), 65546);
        assert_eq!(Asn::parse("0.100").unwrap().get(), 100);
        assert_eq!(Asn::parse("65535.65535").unwrap().get(), u32::MAX);
        for bad_asn in [
            "0",
            "0.0",
            "4294967296",
            "99999999999999999999999",
            "-1",
            "+5",
            "abc",
            "",
            "1.",
            ".1",
            "1.65536",
            "1.2.3",
            "65 001",
        ] {
            assert!(Asn::parse(bad_asn).is_err(), "{bad_asn:?}");
        }
        let (field, value, msg) = err_field(parse_asn(FIELD_LOCAL_ASN, "0"));
        assert_eq!(field, "setBGP");
        assert_eq!(value.as_deref(), Some("0"));
        assert!(msg.contains("AS 0"), "{msg}");
        assert_eq!(Asn::new(0), None);
        assert_eq!(Asn::from_i64(-1), None);
        assert_eq!(Asn::from_i64(1 << 32), None);
        assert_eq!(Asn::from_i64(65001).map(Asn::get), Some(65001));
    }

    #[test]
    fn peer_items() {
        let p = Peer::parse("192.0.2.1:65001").unwrap();
        assert_eq!(p.address, "192.0.2.1".parse::<IpAddr>().unwrap());
        assert_eq!(p.asn.get(), 65001);
        assert_eq!(p.port, None);
        let p = Peer::parse("[2001:db8::1]:65001").unwrap();
        assert_eq!(p.address, "2001:db8::1".parse::<IpAddr>().unwrap());
        assert_eq!(p.to_string(), "[2001:db8::1]:65001");
        let p = Peer::parse("192.0.2.1:1.10:1790").unwrap();
        assert_eq!((p.asn.get(), p.port), (65546, Some(1790)));
        assert_eq!(p.to_string(), "192.0.2.1:65546:1790");
        let p = Peer::parse("[2001:db8::1]:65001:1790").unwrap();
        assert_eq!(p.port, Some(1790));
        // Bracketed IPv4 is harmless and accepted.
        assert!(Peer::parse("[192.0.2.1]:65001").is_ok());

        let cases: &[(&str, &str)] = &[
            ("1.2.3.4:abc", "\"abc\" is not an AS number"),
            ("1.2.3.4", "the AS number is missing: expected 1.2.3.4:ASN"),
            ("1.2.3.4:", "the AS number is missing"),
            ("1.2.3.4:0", "AS 0"),
            ("1.2.3.4:65001:0", "not a port"),
            ("1.2.3.4:65001:99999", "not a port"),
            ("1.2.3.400:65001", "\"1.2.3.400\" is not an IPv4 address"),
            ("0.0.0.0:65001", "cannot be a BGP peer"),
            ("2001:db8::1:65001", "for example [2001:db8::1]:65001"),
            ("2001:db8::1", "for example [2001:db8::1]:ASN"),
            ("fe80::1%eth0:65001", "in brackets"),
            (
                "[2001:db8::1]",
                "the AS number is missing: expected [2001:db8::1]:ASN",
            ),
            ("[2001:db8::1:65001", "no closing ]"),
            ("[2001:db8::x]:65001", "is not an IP address"),
            ("[2001:db8::1]65001", "expected IP:ASN"),
            ("peer.example:65001", "is not an IPv4 address"),
            ("nonsense", "expected IP:ASN"),
        ];
        for (item, want) in cases {
            let (field, value, msg) = err_field(Peer::parse(item));
            assert_eq!(field, FIELD_PEERS);
            assert_eq!(value.as_deref(), Some(*item));
            assert!(msg.contains(want), "{item}: {msg}");
        }
    }

    #[test]
    fn peer_lists() {
        let peers = parse_peers("192.0.2.1:65001, ,[2001:db8::1]:65002,").unwrap();
        assert_eq!(peers.len(), 2);
        assert_eq!(peers[1].asn.get(), 65002);
        assert_eq!(parse_peers("").unwrap(), vec![]);
        assert_eq!(parse_peers(" , ").unwrap(), vec![]);

        let (field, value, msg) = err_field(parse_peers("192.0.2.1:65001,192.0.2.1:65009"));
        assert_eq!(field, FIELD_PEERS);
        assert_eq!(value.as_deref(), Some("192.0.2.1:65001,192.0.2.1:65009"));
        assert!(msg.contains("the peer 192.0.2.1 is given twice"), "{msg}");
        // The same IPv6 address written two ways is the same peer.
        let (_, _, msg) = err_field(parse_peers("[2001:db8::1]:1,[2001:DB8:0::1]:2"));
        assert!(msg.contains("2001:db8::1 is given twice"), "{msg}");
        // A bad item in a list is named.
        let (_, _, msg) = err_field(parse_peers("192.0.2.1:65001,1.2.3.4:abc"));
        assert!(
            msg.contains("\"1.2.3.4:abc\": \"abc\" is not an AS number"),
            "{msg}"
        );
        // Alone, the message does not repeat it.
        let (_, _, msg) = err_field(parse_peers("1.2.3.4"));
        assert!(
            msg.starts_with("extBGPPeers=\"1.2.3.4\" is invalid: the AS"),
            "{msg}"
        );
    }

    #[test]
    fn settings() {
        assert_eq!(BgpSettings::from_input(&BgpInput::default()), Ok(None));
        // kube-loxilb's "off": 0 or empty; listen port and multihop are then ignored.
        let off = BgpInput {
            local_asn: Some("0"),
            listen_port: Some(179),
            multihop: true,
            ..BgpInput::default()
        };
        assert_eq!(BgpSettings::from_input(&off), Ok(None));

        let s = BgpSettings::from_input(&BgpInput {
            local_asn: Some("65100"),
            router_id: Some("10.0.0.1"),
            listen_port: Some(0),
            multihop: true,
            peers: Some("50.50.50.1:65101,51.51.51.1:65102"),
        })
        .unwrap()
        .unwrap();
        assert_eq!(s.local_asn.get(), 65100);
        assert_eq!(s.router_id, Some(Ipv4Addr::new(10, 0, 0, 1)));
        assert_eq!(s.listen_port, None);
        assert!(s.multihop);
        assert_eq!(s.peers.len(), 2);

        let with = |local: Option<&'static str>,
                    router: Option<&'static str>,
                    peers: Option<&'static str>| {
            BgpSettings::from_input(&BgpInput {
                local_asn: local,
                router_id: router,
                peers,
                ..BgpInput::default()
            })
        };
        let (field, value, msg) = err_field(with(Some("65100"), Some("2001:db8::1"), None));
        assert_eq!(
            (field.as_str(), value.as_deref()),
            (FIELD_ROUTER_ID, Some("2001:db8::1"))
        );
        assert!(msg.contains("IPv4"), "{msg}");
        let (field, _, _) = err_field(with(Some("65100"), Some("0.0.0.0"), None));
        assert_eq!(field, FIELD_ROUTER_ID);
        let (field, _, _) = err_field(with(Some("65100"), Some("router-1"), None));
        assert_eq!(field, FIELD_ROUTER_ID);
        let (field, value, _) = err_field(with(Some("AS65100"), None, None));
        assert_eq!(
            (field.as_str(), value.as_deref()),
            (FIELD_LOCAL_ASN, Some("AS65100"))
        );
        let (field, _, msg) = err_field(with(None, None, Some("1.2.3.4:65001")));
        assert_eq!(field, FIELD_PEERS);
        assert!(msg.contains("setBGP"), "{msg}");
        let (field, _, _) = err_field(with(Some("0"), Some("10.0.0.1"), None));
        assert_eq!(field, FIELD_ROUTER_ID);
        let (field, _, _) = err_field(with(Some("65100"), None, Some("1.2.3.4:0")));
        assert_eq!(field, FIELD_PEERS);

        // Router id: configured, else the loxilb's IPv4 address.
        let mut s = s;
        let v4: IpAddr = "192.0.2.9".parse().unwrap();
        let v6: IpAddr = "2001:db8::9".parse().unwrap();
        assert_eq!(s.router_id_for(Some(v6)), Ok(Ipv4Addr::new(10, 0, 0, 1)));
        s.router_id = None;
        assert_eq!(s.router_id_for(Some(v4)), Ok(Ipv4Addr::new(192, 0, 2, 9)));
        let (field, value, msg) = err_field(s.router_id_for(Some(v6)));
        assert_eq!((field.as_str(), value), (FIELD_ROUTER_ID, None));
        assert!(msg.contains("2001:db8::9"), "{msg}");
        let (field, _, _) = err_field(s.router_id_for(None));
        assert_eq!(field, FIELD_ROUTER_ID);
    }

    #[test]
    fn peer_resources() {
        let spec = |ip: &str, asn: i64, port: Option<i64>| BGPPeerServiceSpec {
            ip_address: ip.to_string(),
            remote_as: asn,
            remote_port: port,
            set_multi_hop: None,
        };
        let p = spec("10.0.0.2", 65002, Some(0)).peer().unwrap();
        assert_eq!((p.asn.get(), p.port), (65002, None));
        let p = spec("2001:db8::2", 4_200_000_000, Some(1790))
            .peer()
            .unwrap();
        assert_eq!((p.asn.get(), p.port), (4_200_000_000, Some(1790)));
        for (s, field, value) in [
            (spec("", 1, None), "spec.ipAddress", None),
            (spec("10.0.0", 1, None), "spec.ipAddress", Some("10.0.0")),
            (spec("10.0.0.2", 0, None), "spec.remoteAs", Some("0")),
            (spec("10.0.0.2", -5, None), "spec.remoteAs", Some("-5")),
            (
                spec("10.0.0.2", 4_294_967_296, None),
                "spec.remoteAs",
                Some("4294967296"),
            ),
            (
                spec("10.0.0.2", 1, Some(70000)),
                "spec.remotePort",
                Some("70000"),
            ),
            (spec("10.0.0.2", 1, Some(-1)), "spec.remotePort", Some("-1")),
        ] {
            let (f, v, _) = err_field(s.peer());
            assert_eq!((f.as_str(), v.as_deref()), (field, value));
        }
    }

    #[test]
    fn masklength_ranges() {
        let f = "spec.prefixList[0].masklengthRange";
        assert_eq!(parse_masklength_range(f, "24..32"), Ok((24, 32)));
        assert_eq!(parse_masklength_range(f, "0..0"), Ok((0, 0)));
        assert_eq!(parse_masklength_range(f, "64..128"), Ok((64, 128)));
        for bad_range in [
            "24-32", "32..24", "0..129", "24..", "..32", "", "24", "a..b", "-1..3", "1..2..3",
            "24..999", "24 .. 32",
        ] {
            let (field, value, msg) = err_field(parse_masklength_range(f, bad_range));
            assert_eq!(field, f);
            assert_eq!(value.as_deref(), Some(bad_range));
            assert!(msg.contains("min..max"), "{msg}");
        }
    }

    fn prefix(p: &str, r: &str) -> BGPPolicyPrefix {
        BGPPolicyPrefix {
            ip_prefix: p.to_string(),
            masklength_range: r.to_string(),
        }
    }

    #[test]
    fn defined_sets() {
        let set = |t: &str, list: &[&str], prefixes: Vec<BGPPolicyPrefix>| {
            BGPPolicyDefinedSetsServiceSpec {
                name: "ps1".to_string(),
                defined_type: t.to_string(),
                list: list.iter().map(|s| s.to_string()).collect(),
                prefix_list: prefixes,
            }
        };
        assert_eq!(
            set("prefix", &[], vec![prefix("10.0.0.0/8", "16..24")]).validate(),
            Ok(DefinedType::Prefix)
        );
        assert_eq!(
            set("Neigh", &["10.0.0.2", "10.1.0.0/16"], vec![]).validate(),
            Ok(DefinedType::Neighbor)
        );
        assert_eq!(
            set("community", &["65100:10"], vec![]).validate(),
            Ok(DefinedType::Community)
        );
        let mut unnamed = set("aspath", &["^65100_"], vec![]);
        unnamed.name = " ".into();
        let cases: Vec<(BGPPolicyDefinedSetsServiceSpec, &str, Option<&str>)> = vec![
            (unnamed, "spec.name", None),
            (set("", &["x"], vec![]), "spec.definedType", None),
            (
                set("route", &["x"], vec![]),
                "spec.definedType",
                Some("route"),
            ),
            (set("prefix", &[], vec![]), "spec.prefixList", None),
            (
                set(
                    "prefix",
                    &["10.0.0.0/8"],
                    vec![prefix("10.0.0.0/8", "8..8")],
                ),
                "spec.List",
                None,
            ),
            (
                set(
                    "prefix",
                    &[],
                    vec![prefix("10.0.0.0/8", "8..8"), prefix("10.0.0.0/8", "24-32")],
                ),
                "spec.prefixList[1].masklengthRange",
                Some("24-32"),
            ),
            (
                set("prefix", &[], vec![prefix("10.0.0.0", "8..8")]),
                "spec.prefixList[0].ipPrefix",
                Some("10.0.0.0"),
            ),
            (
                set("prefix", &[], vec![prefix("", "8..8")]),
                "spec.prefixList[0].ipPrefix",
                None,
            ),
            (set("neighbor", &[], vec![]), "spec.List", None),
            (
                set("neighbor", &["10.0.0.2", "router-a"], vec![]),
                "spec.List[1]",
                Some("router-a"),
            ),
            (set("community", &[""], vec![]), "spec.List[0]", Some("")),
            (
                set("community", &["1:1"], vec![prefix("10.0.0.0/8", "8..8")]),
                "spec.prefixList",
                None,
            ),
        ];
        for (s, field, value) in cases {
            let (f, v, _) = err_field(s.validate());
            assert_eq!((f.as_str(), v.as_deref()), (field, value), "{s:?}");
        }
    }

    fn statement(name: &str) -> BGPPolicyStatement {
        BGPPolicyStatement {
            name: name.to_string(),
            conditions: Some(BGPPolicyConditions {
                match_prefix_set: Some(MatchPrefixSet {
                    match_set_option: "any".into(),
                    prefix_set: "ps1".into(),
                }),
                ..Default::default()
            }),
            actions: Some(BGPPolicyActions {
                route_disposition: "accept-route".into(),
                bgp_actions: None,
            }),
        }
    }

    #[test]
    fn definitions() {
        let def = |statements: Vec<BGPPolicyStatement>| BGPPolicyDefinitionServiceSpec {
            name: "pol1".into(),
            statements,
        };
        assert_eq!(def(vec![statement("s1"), statement("")]).validate(), Ok(()));

        let mut no_conditions = statement("s2");
        no_conditions.conditions = None;
        let (field, value, msg) = err_field(def(vec![statement("s1"), no_conditions]).validate());
        assert_eq!((field.as_str(), value), ("spec.statements[1]", None));
        assert!(msg.contains("statement \"s2\" has no conditions"), "{msg}");

        let mut no_actions = statement("");
        no_actions.actions = None;
        let (field, _, msg) = err_field(def(vec![no_actions]).validate());
        assert_eq!(field, "spec.statements[0]");
        assert!(
            msg.contains("statement 0 (unnamed) has no actions"),
            "{msg}"
        );

        let mut all_on_prefix = statement("s");
        all_on_prefix
            .conditions
            .as_mut()
            .unwrap()
            .match_prefix_set
            .as_mut()
            .unwrap()
            .match_set_option = "all".into();
        let (field, value, _) = err_field(def(vec![all_on_prefix]).validate());
        assert_eq!(
            (field.as_str(), value.as_deref()),
            (
                "spec.statements[0].conditions.matchPrefixSet.matchSetOption",
                Some("all")
            )
        );

        let mut neighbor_opt = statement("s");
        neighbor_opt.conditions.as_mut().unwrap().match_neighbor_set = Some(MatchNeighborSet {
            match_set_option: "some".into(),
            neighbor_set: "n".into(),
        });
        let (field, value, _) = err_field(def(vec![neighbor_opt]).validate());
        assert_eq!(
            (field.as_str(), value.as_deref()),
            (
                "spec.statements[0].conditions.matchNeighborSet.matchSetOption",
                Some("some")
            )
        );

        let mut community = statement("s");
        community.conditions.as_mut().unwrap().bgp_conditions = Some(BGPConditions {
            match_as_path_set: Some(BGPAsPathSet {
                as_path_set: "a".into(),
                match_set_options: "all".into(),
            }),
            match_large_community_set: Some(BGPCommunitySet {
                community_set: "c".into(),
                match_set_options: "ANY".into(),
            }),
            ..Default::default()
        });
        let (field, value, _) = err_field(def(vec![community]).validate());
        assert_eq!(
            (field.as_str(), value.as_deref()),
            (
                "spec.statements[0].conditions.bgpConditions.matchLargeCommunitySet.matchSetOptions",
                Some("ANY")
            )
        );

        let mut disposition = statement("s");
        disposition.actions.as_mut().unwrap().route_disposition = "accept".into();
        let (field, value, _) = err_field(def(vec![disposition]).validate());
        assert_eq!(
            (field.as_str(), value.as_deref()),
            (
                "spec.statements[0].actions.routeDisposition",
                Some("accept")
            )
        );
        let mut none = statement("s");
        none.actions.as_mut().unwrap().route_disposition = String::new();
        assert_eq!(def(vec![none]).validate(), Ok(()));

        let (field, _, _) = err_field(
            BGPPolicyDefinitionServiceSpec {
                name: String::new(),
                statements: vec![],
            }
            .validate(),
        );
        assert_eq!(field, "spec.name");
    }

    #[test]
    fn applies() {
        let apply = |ip: &str, t: &str, p: &[&str], a: &str| BGPPolicyApplyServiceSpec {
            ip_address: ip.into(),
            policy_type: t.into(),
            policies: p.iter().map(|s| s.to_string()).collect(),
            route_action: a.into(),
        };
        let ok = apply("10.0.0.2", "export", &["pol1"], "accept")
            .validate()
            .unwrap();
        assert_eq!(ok.policy_type, PolicyType::Export);
        assert_eq!(ok.route_action, RouteAction::Accept);
        assert_eq!(ok.neighbor, Some("10.0.0.2".parse().unwrap()));
        let global = apply("global", "import", &["p"], "accept")
            .validate()
            .unwrap();
        assert_eq!(global.neighbor, None);
        assert_eq!(
            apply("10.0.0.2", "import", &["p"], "reject")
                .validate()
                .unwrap()
                .policy_type,
            PolicyType::Import
        );
        for (s, field, value) in [
            (
                apply("", "export", &["p"], "accept"),
                "spec.ipAddress",
                None,
            ),
            (
                apply("x", "export", &["p"], "accept"),
                "spec.ipAddress",
                Some("x"),
            ),
            (
                apply("10.0.0.2", "", &["p"], "accept"),
                "spec.policyType",
                None,
            ),
            (
                apply("10.0.0.2", "Export", &["p"], "accept"),
                "spec.policyType",
                Some("Export"),
            ),
            (
                apply("10.0.0.2", "export", &[], "accept"),
                "spec.policies",
                None,
            ),
            (
                apply("10.0.0.2", "export", &["p", " "], "accept"),
                "spec.policies[1]",
                Some(" "),
            ),
            (
                apply("10.0.0.2", "export", &["p"], ""),
                "spec.routeAction",
                None,
            ),
            (
                apply("10.0.0.2", "export", &["p"], "accept-route"),
                "spec.routeAction",
                Some("accept-route"),
            ),
        ] {
            let (f, v, _) = err_field(s.validate());
            assert_eq!((f.as_str(), v.as_deref()), (field, value), "{s:?}");
        }
    }

    /// kube-loxilb's manifests, as written for its CRDs, are read unchanged.
    #[test]
    fn kube_loxilb_manifests_deserialize() {
        let peer: BGPPeerServiceSpec = serde_json::from_str(
            r#"{"ipAddress":"123.123.123.254","remoteAs":65123,"remotePort":179,
                "setMultiHop":true,"unknown":1}"#,
        )
        .unwrap();
        assert_eq!(peer.peer().unwrap().asn.get(), 65123);
        assert_eq!(peer.set_multi_hop, Some(true));

        let sets: BGPPolicyDefinedSetsServiceSpec = serde_json::from_str(
            r#"{"name":"ps1","definedType":"prefix",
                "prefixList":[{"ipPrefix":"10.10.10.0/24","masklengthRange":"24..32"}]}"#,
        )
        .unwrap();
        assert_eq!(sets.validate(), Ok(DefinedType::Prefix));
        let neigh: BGPPolicyDefinedSetsServiceSpec = serde_json::from_str(
            r#"{"name":"ns1","definedType":"neighbor","List":["10.0.0.2/32"]}"#,
        )
        .unwrap();
        assert_eq!(neigh.list, vec!["10.0.0.2/32".to_string()]);

        let def: BGPPolicyDefinitionServiceSpec = serde_json::from_str(
            r#"{"name":"pol1","statements":[{"name":"s1",
                "conditions":{"matchPrefixSet":{"matchSetOption":"any","prefixSet":"ps1"},
                  "bgpConditions":{"largeCommunitySet":{"communitySet":"c","matchSetOptions":"all"}}},
                "actions":{"routeDisposition":"accept-route",
                  "bgpActions":{"setLocalPref":200,"setAsPathPrepend":{"as":"65100","repeatN":2}}}}]}"#,
        )
        .unwrap();
        assert_eq!(def.validate(), Ok(()));
        let st = &def.statements[0];
        let actions = st.actions.as_ref().unwrap().bgp_actions.as_ref().unwrap();
        assert_eq!(actions.set_local_pref, Some(200));
        assert_eq!(actions.set_as_path_prepend.as_ref().unwrap().repeat_n, 2);
        let conds = st
            .conditions
            .as_ref()
            .unwrap()
            .bgp_conditions
            .as_ref()
            .unwrap();
        assert!(conds.match_large_community_set.is_some());
        // The Go type's spelling is read too.
        let go: BGPActions = serde_json::from_str(r#"{"setLocalPerf":7}"#).unwrap();
        assert_eq!(go.set_local_pref, Some(7));

        let apply: BGPPolicyApplyServiceSpec = serde_json::from_str(
            r#"{"ipAddress":"10.0.0.2","policyType":"export","policies":["pol1"],
                "routeAction":"accept"}"#,
        )
        .unwrap();
        assert_eq!(apply.validate().unwrap().policies, vec!["pol1".to_string()]);
    }

    #[test]
    fn flags_per_change() {
        use RuleChange::*;
        use StoredRule::*;
        let on = Present { bgp: true };
        let off = Present { bgp: false };
        let f = |delete, post, after| BgpFlags {
            delete,
            post,
            after,
        };
        assert_eq!(bgp_flags(Create, Absent, true), f(None, Some(true), on));
        assert_eq!(bgp_flags(Create, Absent, false), f(None, Some(false), off));
        // In-place updates never carry bgp: true, and keep what the rule was created with.
        assert_eq!(bgp_flags(Update, on, true), f(None, Some(false), on));
        assert_eq!(bgp_flags(Update, off, true), f(None, Some(false), off));
        assert_eq!(bgp_flags(Create, on, true), f(None, Some(false), on));
        assert_eq!(bgp_flags(Update, Absent, true), f(None, Some(true), on));
        assert_eq!(bgp_flags(Delete, on, false), f(Some(true), None, Absent));
        assert_eq!(bgp_flags(Delete, off, true), f(Some(false), None, Absent));
        assert_eq!(
            bgp_flags(Delete, Absent, true),
            f(Some(false), None, Absent)
        );
        assert_eq!(
            bgp_flags(Recreate, on, false),
            f(Some(true), Some(false), off)
        );
        assert_eq!(
            bgp_flags(Recreate, off, true),
            f(Some(false), Some(true), on)
        );
        assert!(bgp_needs_recreate(off, true));
        assert!(bgp_needs_recreate(on, false));
        assert!(!bgp_needs_recreate(on, true));
        assert!(!bgp_needs_recreate(Absent, true));
    }

    mod properties {
        use std::collections::BTreeMap;

        use proptest::collection::vec as vec_of;
        use proptest::prelude::{
            Just, ProptestConfig, Strategy, any, prop_assert, prop_assert_eq, prop_assume,
        };
        use proptest::prop_oneof;
        use proptest::proptest;

        use super::super::*;

        const KEYS: usize = 6;
        /// Keys share addresses (several ports on one VIP), so a reference dropped by the
        /// wrong rule shows.
        fn address_of(key: usize) -> usize {
            key % 3
        }

        /// loxilb's advertisement counter (docs/loxilb-api.md#bgp).
        #[derive(Default)]
        struct Loxilb {
            /// Live rules and the `bgp` they were created with.
            rules: BTreeMap<usize, bool>,
            refs: BTreeMap<usize, i64>,
        }

        impl Loxilb {
            /// `changed`: whether an update differs (200) or not (409, nothing happens).
            fn post(&mut self, key: usize, bgp: bool, changed: bool) {
                let answered_200 = match self.rules.get(&key) {
                    None => {
                        self.rules.insert(key, bgp);
                        true
                    }
                    Some(_) => changed,
                };
                if answered_200 && bgp {
                    *self.refs.entry(address_of(key)).or_default() += 1;
                }
            }

            /// A DELETE with `?bgp=true` drops a reference even when it answers 404.
            fn delete(&mut self, key: usize, bgp: bool) {
                self.rules.remove(&key);
                if bgp {
                    *self.refs.entry(address_of(key)).or_default() -= 1;
                }
            }

            fn live_with_bgp(&self, address: usize) -> i64 {
                self.rules
                    .iter()
                    .filter(|(k, bgp)| address_of(**k) == address && **bgp)
                    .count() as i64
            }
        }

        #[derive(Debug, Clone)]
        enum Step {
            Change {
                key: usize,
                change: RuleChange,
                advertise: bool,
                changed: bool,
            },
            /// loxilb restarts: it keeps nothing, and the controller relearns that.
            Restart,
        }

        fn step() -> impl Strategy<Value = Step> {
            let change = prop_oneof![
                Just(RuleChange::Create),
                Just(RuleChange::Update),
                Just(RuleChange::Delete),
                Just(RuleChange::Recreate),
            ];
            prop_oneof![
                20 => (0..KEYS, change, any::<bool>(), any::<bool>()).prop_map(
                    |(key, change, advertise, changed)| Step::Change {
                        key,
                        change,
                        advertise,
                        changed,
                    }
                ),
                1 => Just(Step::Restart),
            ]
        }

        fn apply(
            lb: &mut Loxilb,
            known: &mut [StoredRule; KEYS],
            key: usize,
            change: RuleChange,
            advertise: bool,
            changed: bool,
        ) -> BgpFlags {
            let flags = bgp_flags(change, known[key], advertise);
            if let Some(bgp) = flags.delete {
                lb.delete(key, bgp);
            }
            if let Some(bgp) = flags.post {
                lb.post(key, bgp, changed);
            }
            known[key] = flags.after;
            flags
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            #[test]
            fn each_address_is_counted_once_per_live_advertised_rule(
                steps in vec_of(step(), 0..60)
            ) {
                let mut lb = Loxilb::default();
                let mut known = [StoredRule::Absent; KEYS];
                for s in &steps {
                    match *s {
                        Step::Restart => {
                            lb = Loxilb::default();
                            known = [StoredRule::Absent; KEYS];
                        }
                        Step::Change { key, change, advertise, changed } => {
                            let before = known[key];
                            apply(&mut lb, &mut known, key, change, advertise, changed);
                            // A rule created now is advertised as asked.
                            if change == RuleChange::Recreate
                                || (before == StoredRule::Absent && change != RuleChange::Delete)
                            {
                                prop_assert_eq!(lb.rules.get(&key), Some(&advertise));
                            }
                        }
                    }
                    for (key, k) in known.iter().enumerate() {
                        let stored = match lb.rules.get(&key) {
                            None => StoredRule::Absent,
                            Some(&bgp) => StoredRule::Present { bgp },
                        };
                        prop_assert_eq!(*k, stored, "the controller's view of key {}", key);
                    }
                    for address in 0..3 {
                        prop_assert_eq!(
                            lb.refs.get(&address).copied().unwrap_or(0),
                            lb.live_with_bgp(address),
                            "references of address {} after {:?}", address, s
                        );
                    }
                }
                // Deleting everything (twice: a repeated delete is harmless) withdraws all.
                for _ in 0..2 {
                    for key in 0..KEYS {
                        apply(&mut lb, &mut known, key, RuleChange::Delete, true, true);
                    }
                }
                prop_assert!(lb.rules.is_empty());
                for address in 0..3 {
                    prop_assert_eq!(lb.refs.get(&address).copied().unwrap_or(0), 0);
                }
            }

            #[test]
            fn peers_read_back_what_they_show(
                v4 in any::<u32>(),
                v6 in any::<u128>(),
                six in any::<bool>(),
                asn in 1..=u32::MAX,
                port in proptest::option::of(1..=u16::MAX),
            ) {
                let address = if six {
                    IpAddr::V6(Ipv6Addr::from(v6))
                } else {
                    IpAddr::V4(Ipv4Addr::from(v4))
                };
                prop_assume!(!address.is_unspecified() && !address.is_multicast());
                let peer = Peer { address, asn: Asn::new(asn).unwrap(), port };
                prop_assert_eq!(Peer::parse(&peer.to_string()), Ok(peer));
            }
        }
    }
}
