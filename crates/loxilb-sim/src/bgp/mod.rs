//! The BGP side of loxilb (`/config/bgp/...`): loxilb's handlers in front of the goBGP
//! daemon it runs, as docs/loxilb-api.md#bgp describes them.
//!
//! * BGP is a start option of loxilb (`-b`): off, every BGP call answers 403
//!   `loxilb BGP mode is disabled` once the request has been decoded and validated.
//! * goBGP's errors reach loxilb over gRPC and are answered with the wrapped text
//!   (`rpc error: code = Unknown desc = ...`); the status comes from the substring table like
//!   every other handler error ([`crate::status_for`]).
//! * Two requests crash loxilb's handler on a nil pointer (a neighbour DELETE without
//!   `remoteAs`, a policy statement without `conditions` or `actions`): the connection is
//!   closed without an answer ([`ApiError::Crash`]).
//! * The per-address advertisement reference count loxilb keeps for rules with `bgp` lives
//!   here too; the rule handlers feed it. All of it is wiped by a restart.
//!
//! Iteration orders of listings follow Go maps (unspecified): `HashMap` here, on purpose.

mod policy;

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::time::Instant;

use axum::response::Response;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::Shared;
use crate::decode::{GoInt, GoObj, body_object, parse_body};
use crate::errors::{ApiError, ok_json, success};
use crate::validate::parse_ip;
use policy::{apply, list_policies, policy_add, policy_delete, set_add, set_delete, set_get};

/// The handler error of every BGP call while BGP is off.
pub(crate) const DISABLED: &str = "loxilb BGP mode is disabled";
/// What loxilb answers (500) while its goBGP does not listen yet, for some seconds after
/// loxilb starts (docs/loxilb-api.md#bgp): the gRPC dial to goBGP is refused.
pub(crate) const GOBGP_STARTING: &str = "rpc error: code = Unavailable desc = connection error: \
     desc = \"transport: Error while dialing: dial tcp 127.0.0.1:50052: connect: connection refused\"";
/// What loxilb answers (500) to a global configuration identical to the one it holds.
pub(crate) const GLOBAL_ALREADY_SET: &str = "action 3 is already set";
/// goBGP's name for the global RIB, the only policy-assignment target loxilb's peers allow.
const GLOBAL: &str = "global";
/// The states goBGP reports for a session.
pub const SESSION_STATES: &[&str] = &[
    "UNKNOWN",
    "IDLE",
    "CONNECT",
    "ACTIVE",
    "OPENSENT",
    "OPENCONFIRM",
    "ESTABLISHED",
];

/// goBGP's errors as loxilb relays them (through gRPC).
fn rpc(msg: impl std::fmt::Display) -> ApiError {
    ApiError::handler(format!("rpc error: code = Unknown desc = {msg}"))
}

/// The BGP routes, one per spec operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BgpOp {
    Global,
    NeighList,
    NeighAdd,
    NeighDelete,
    SetAdd,
    SetGet,
    SetDelete,
    PolicyList,
    PolicyAdd,
    PolicyDelete,
    ApplyAdd,
    ApplyDelete,
}

// ---------------------------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------------------------

/// `POST /config/bgp/global` as goBGP holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimBgpGlobal {
    pub router_id: String,
    pub local_as: u32,
    pub set_next_hop_self: bool,
    /// Effective port (0 was sent as 179).
    pub listen_port: u16,
}

/// One configured peer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimBgpNeighbor {
    /// Canonical address text (the key goBGP uses).
    pub ip: String,
    pub remote_as: u32,
    /// Effective port (0 was sent as 179).
    pub remote_port: u16,
    pub multihop: bool,
    /// goBGP session state, e.g. `ACTIVE` or `ESTABLISHED`.
    pub state: String,
    /// As listed: `hh:mm:ss`, `Nd hh:mm:ss` or `never`.
    pub updowntime: String,
}

/// One defined set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimBgpDefinedSet {
    /// `prefix`, `neighbor`, `community`, `extcommunity`, `largecommunity` or `aspath`.
    pub kind: String,
    pub name: String,
    pub list: Vec<String>,
    /// `(prefix, "min..max")`, prefixes in canonical network form.
    pub prefixes: Vec<(String, String)>,
}

/// One policy definition and its statement names, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimBgpPolicy {
    pub name: String,
    pub statements: Vec<String>,
}

/// The policies applied to one target (`global`) in one direction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimBgpAssignment {
    pub target: String,
    /// `import` or `export`.
    pub direction: String,
    pub policies: Vec<String>,
    /// `accept`, `reject` or `none`.
    pub default_action: String,
}

/// Everything the simulated goBGP holds, plus loxilb's advertisement counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimBgp {
    /// Whether loxilb runs with BGP (a start option, kept across restarts).
    pub enabled: bool,
    pub global: Option<SimBgpGlobal>,
    /// Sorted by address text.
    pub neighbors: Vec<SimBgpNeighbor>,
    /// Sorted by kind and name.
    pub defined_sets: Vec<SimBgpDefinedSet>,
    /// Sorted by name; includes the policies loxilb creates itself with the global config.
    pub policies: Vec<SimBgpPolicy>,
    /// Sorted by target and direction.
    pub assignments: Vec<SimBgpAssignment>,
    /// Advertisement references per address, keyed by the address text loxilb was given.
    pub advertisements: BTreeMap<String, u32>,
}

#[derive(Debug, Clone)]
enum UpDown {
    Never,
    Since(Instant),
    Fixed(String),
}

/// goBGP's `hh:mm:ss` / `Nd hh:mm:ss` (loxilb's `FormatTimedelta`).
fn format_timedelta(secs: u64) -> String {
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let hms = format!(
        "{:02}:{:02}:{:02}",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    );
    if days == 0 {
        hms
    } else {
        format!("{days}d {hms}")
    }
}

impl UpDown {
    fn show(&self, now: Instant) -> String {
        match self {
            UpDown::Never => "never".into(),
            UpDown::Since(t) => format_timedelta(now.saturating_duration_since(*t).as_secs()),
            UpDown::Fixed(s) => s.clone(),
        }
    }
}

#[derive(Debug, Clone)]
struct Neighbor {
    remote_as: u32,
    remote_port: u16,
    multihop: bool,
    state: String,
    updown: UpDown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum SetKind {
    Prefix,
    Neighbor,
    Community,
    ExtCommunity,
    LargeCommunity,
    AsPath,
}

impl SetKind {
    /// The spellings loxilb's switch knows (case-sensitive, so `PREFIX` is unknown).
    fn parse(s: &str) -> Option<SetKind> {
        Some(match s {
            "prefix" | "Prefix" => SetKind::Prefix,
            "neigh" | "neighbor" | "nei" | "Neighbor" | "Neigh" | "Nei" => SetKind::Neighbor,
            "Community" | "community" => SetKind::Community,
            "ExtCommunity" | "extCommunity" | "extcommunity" => SetKind::ExtCommunity,
            "LargeCommunity" | "largecommunity" | "largeCommunity" | "Largecommunity" => {
                SetKind::LargeCommunity
            }
            "AsPath" | "asPath" | "ASPath" | "aspath" => SetKind::AsPath,
            _ => return None,
        })
    }

    fn as_str(self) -> &'static str {
        match self {
            SetKind::Prefix => "prefix",
            SetKind::Neighbor => "neighbor",
            SetKind::Community => "community",
            SetKind::ExtCommunity => "extcommunity",
            SetKind::LargeCommunity => "largecommunity",
            SetKind::AsPath => "aspath",
        }
    }

    /// goBGP's wording in `not found <label> <name>`.
    fn label(self) -> &'static str {
        match self {
            SetKind::Prefix => "prefix set",
            SetKind::Neighbor => "neighbor set",
            SetKind::Community => "community set",
            SetKind::ExtCommunity => "ext-community set",
            SetKind::LargeCommunity => "large-community set",
            SetKind::AsPath => "as path set",
        }
    }
}

#[derive(Debug, Clone, Default)]
struct DefinedSet {
    list: Vec<String>,
    /// `(canonical prefix, min, max)`.
    prefixes: Vec<(String, u32, u32)>,
}

/// A set reference in a statement, match option normalized the way goBGP reads it.
#[derive(Debug, Clone)]
struct MatchSet {
    name: String,
    option: &'static str,
}

#[derive(Debug, Clone)]
struct CommunityAction {
    options: &'static str,
    methods: Vec<String>,
}

#[derive(Debug, Clone, Default)]
struct Statement {
    name: String,
    prefix_set: Option<MatchSet>,
    neighbor_set: Option<MatchSet>,
    as_path_set: Option<MatchSet>,
    community_set: Option<MatchSet>,
    ext_community_set: Option<MatchSet>,
    large_community_set: Option<MatchSet>,
    afi_safi_in: Vec<String>,
    as_path_length: Option<(&'static str, u32)>,
    next_hop_in_list: Vec<String>,
    rpki: &'static str,
    route_type: &'static str,
    route_disposition: &'static str,
    med: Option<i64>,
    local_pref: u32,
    next_hop: String,
    community: Option<CommunityAction>,
    ext_community: Option<CommunityAction>,
    large_community: Option<CommunityAction>,
    as_prepend: Option<(u32, u32)>,
}

impl Statement {
    fn references(&self) -> impl Iterator<Item = (SetKind, &str)> {
        [
            (SetKind::Prefix, &self.prefix_set),
            (SetKind::Neighbor, &self.neighbor_set),
            (SetKind::AsPath, &self.as_path_set),
            (SetKind::Community, &self.community_set),
            (SetKind::ExtCommunity, &self.ext_community_set),
            (SetKind::LargeCommunity, &self.large_community_set),
        ]
        .into_iter()
        .filter_map(|(kind, m)| m.as_ref().map(|m| (kind, m.name.as_str())))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Direction {
    Import,
    Export,
}

impl Direction {
    fn as_str(self) -> &'static str {
        match self {
            Direction::Import => "import",
            Direction::Export => "export",
        }
    }
}

#[derive(Debug, Clone, Default)]
struct Assignment {
    policies: Vec<String>,
    /// `accept`, `reject` or `none`.
    default_action: &'static str,
}

/// goBGP's state plus loxilb's advertisement reference counts; a restart replaces it.
#[derive(Debug, Default)]
pub(crate) struct BgpState {
    global: Option<SimBgpGlobal>,
    neighbors: HashMap<String, Neighbor>,
    sets: HashMap<(SetKind, String), DefinedSet>,
    policies: HashMap<String, Vec<String>>,
    /// Every statement by name: names are unique across policies (goBGP's statement map).
    statements: HashMap<String, Statement>,
    assignments: HashMap<(String, Direction), Assignment>,
    /// Reference count per address text (loxilb's per-instance map, `llb-inst0`).
    adverts: BTreeMap<String, u32>,
}

impl BgpState {
    /// One more reference per address (a rule with `bgp` answered 200).
    pub(crate) fn advertise(&mut self, ips: impl IntoIterator<Item = String>) {
        for ip in ips {
            *self.adverts.entry(ip).or_insert(0) += 1;
        }
    }

    /// One reference less per address; the route is withdrawn at zero.
    pub(crate) fn withdraw(&mut self, ips: impl IntoIterator<Item = String>) {
        for ip in ips {
            if let Some(n) = self.adverts.get_mut(&ip) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.adverts.remove(&ip);
                }
            }
        }
    }

    pub(crate) fn advertisements(&self) -> BTreeMap<String, u32> {
        self.adverts.clone()
    }

    /// Sets a peer's session state; `None` when the peer is unknown. Without `updowntime`,
    /// the time counts from now (`never` for a state other than `ESTABLISHED` that never
    /// had one).
    pub(crate) fn set_peer_state(
        &mut self,
        ip: &str,
        state: &str,
        updowntime: Option<&str>,
    ) -> Option<()> {
        let key = parse_ip(ip).map_or_else(|| ip.to_string(), |ip| ip.to_string());
        let n = self.neighbors.get_mut(&key)?;
        n.state = state.to_string();
        n.updown = match updowntime {
            Some(text) => UpDown::Fixed(text.to_string()),
            None => UpDown::Since(Instant::now()),
        };
        Some(())
    }

    pub(crate) fn snapshot(&self, enabled: bool) -> SimBgp {
        let now = Instant::now();
        let mut neighbors: Vec<SimBgpNeighbor> = self
            .neighbors
            .iter()
            .map(|(ip, n)| SimBgpNeighbor {
                ip: ip.clone(),
                remote_as: n.remote_as,
                remote_port: n.remote_port,
                multihop: n.multihop,
                state: n.state.clone(),
                updowntime: n.updown.show(now),
            })
            .collect();
        neighbors.sort_by(|a, b| a.ip.cmp(&b.ip));
        let mut defined_sets: Vec<SimBgpDefinedSet> = self
            .sets
            .iter()
            .map(|((kind, name), s)| SimBgpDefinedSet {
                kind: kind.as_str().into(),
                name: name.clone(),
                list: s.list.clone(),
                prefixes: s
                    .prefixes
                    .iter()
                    .map(|(p, min, max)| (p.clone(), format!("{min}..{max}")))
                    .collect(),
            })
            .collect();
        defined_sets.sort_by(|a, b| (&a.kind, &a.name).cmp(&(&b.kind, &b.name)));
        let mut policies: Vec<SimBgpPolicy> = self
            .policies
            .iter()
            .map(|(name, st)| SimBgpPolicy {
                name: name.clone(),
                statements: st.clone(),
            })
            .collect();
        policies.sort_by(|a, b| a.name.cmp(&b.name));
        let mut assignments: Vec<SimBgpAssignment> = self
            .assignments
            .iter()
            .filter(|(_, a)| !a.policies.is_empty() || a.default_action != "none")
            .map(|((target, dir), a)| SimBgpAssignment {
                target: target.clone(),
                direction: dir.as_str().into(),
                policies: a.policies.clone(),
                default_action: a.default_action.into(),
            })
            .collect();
        assignments.sort_by(|a, b| (&a.target, &a.direction).cmp(&(&b.target, &b.direction)));
        SimBgp {
            enabled,
            global: self.global.clone(),
            neighbors,
            defined_sets,
            policies,
            assignments,
            advertisements: self.adverts.clone(),
        }
    }

    /// goBGP's check that a peer operation has a global configuration to work with.
    fn active(&self) -> Result<(), ApiError> {
        match self.global {
            Some(_) => Ok(()),
            None => Err(rpc("bgp server hasn't started yet")),
        }
    }

    /// loxilb's own statements and policies, created with the global configuration (and the
    /// next-hop-self one applied to the global export when asked for).
    fn add_loxilb_policies(&mut self, next_hop_self: bool) {
        let mut own = |policy: &str, stmt: Statement| {
            self.policies
                .entry(policy.to_string())
                .or_default()
                .push(stmt.name.clone());
            self.statements.insert(stmt.name.clone(), stmt);
        };
        if next_hop_self {
            own(
                "set-next-hop-self-gpolicy",
                Statement {
                    name: "set-next-hop-self-gstmt".into(),
                    next_hop: "self".into(),
                    ..Statement::default()
                },
            );
        }
        own(
            "set-llb-export-gpolicy",
            Statement {
                name: "set-med-export-gstmt".into(),
                med: Some(50),
                ..Statement::default()
            },
        );
        own(
            "set-llb-export-gpolicy",
            Statement {
                name: "set-localpref-export-gstmt".into(),
                local_pref: 10,
                ..Statement::default()
            },
        );
        if next_hop_self {
            let a = self
                .assignments
                .entry((GLOBAL.to_string(), Direction::Export))
                .or_insert_with(|| Assignment {
                    policies: Vec::new(),
                    default_action: "none",
                });
            a.policies.push("set-next-hop-self-gpolicy".into());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------------------------

fn object<'a>(
    v: &'a Option<Value>,
    map: &'a mut Map<String, Value>,
    ty: &'static str,
) -> Result<GoObj<'a>, ApiError> {
    let Some(v) = v else {
        return Err(ApiError::required("attr", "body"));
    };
    *map = body_object(v, ty)?;
    Ok(GoObj::new(map, ty))
}

/// Go's integer conversions wrap; `as` does the same.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn wrap_u32(v: i64) -> u32 {
    v as u32
}

#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn wrap_u16(v: i64) -> u16 {
    v as u16
}

/// BGP is on and its goBGP answers (after the handler's own checks, before goBGP's).
fn enabled(shared: &Shared) -> Result<(), ApiError> {
    if !shared.bgp_enabled() {
        Err(ApiError::handler(DISABLED))
    } else if shared.gobgp_starting() {
        Err(ApiError::handler(GOBGP_STARTING))
    } else {
        Ok(())
    }
}

/// Every BGP route: decoding and validation (framework), loxilb's handler, then goBGP.
pub(crate) fn handle(
    shared: &Shared,
    op: BgpOp,
    params: &HashMap<&'static str, String>,
    query: &HashMap<String, String>,
    bytes: &[u8],
) -> Result<Response, ApiError> {
    let param = |k: &str| params.get(k).map_or("", String::as_str);
    match op {
        BgpOp::Global => global(shared, bytes),
        BgpOp::NeighList => {
            enabled(shared)?;
            Ok(ok_json(list_neighbors(&shared.state().bgp)))
        }
        BgpOp::NeighAdd => neigh_add(shared, bytes),
        BgpOp::NeighDelete => neigh_delete(shared, param("ip_address"), query),
        BgpOp::SetAdd => set_add(shared, param("defineset_type"), bytes),
        BgpOp::SetGet => {
            enabled(shared)?;
            set_get(
                &shared.state().bgp,
                param("defineset_type"),
                param("type_name"),
            )
        }
        BgpOp::SetDelete => {
            enabled(shared)?;
            set_delete(
                &mut shared.state().bgp,
                param("defineset_type"),
                param("type_name"),
            )?;
            Ok(success())
        }
        BgpOp::PolicyList => {
            enabled(shared)?;
            Ok(ok_json(list_policies(&shared.state().bgp)))
        }
        BgpOp::PolicyAdd => policy_add(shared, bytes),
        BgpOp::PolicyDelete => {
            enabled(shared)?;
            policy_delete(&mut shared.state().bgp, param("policy_name"))?;
            Ok(success())
        }
        BgpOp::ApplyAdd => apply(shared, bytes, true),
        BgpOp::ApplyDelete => apply(shared, bytes, false),
    }
}

/// `POST /config/bgp/global`: starts goBGP.
fn global(shared: &Shared, bytes: &[u8]) -> Result<Response, ApiError> {
    let body = parse_body(bytes)?;
    let mut map = Map::new();
    let o = object(&body, &mut map, "BGPGlobalConfig")?;
    let set_next_hop_self = o.boolean("SetNextHopSelf")?.unwrap_or(false);
    let listen_port = o.int("listenPort", GoInt::I64)?.unwrap_or(0);
    let local_as = o.int("localAs", GoInt::I64)?;
    let router_id = o.string("routerId")?;
    // Schema validation, properties in the generated (alphabetical) order.
    let local_as = local_as.ok_or_else(|| ApiError::required("localAs", "body"))?;
    let router_id = router_id.ok_or_else(|| ApiError::required("routerId", "body"))?;
    enabled(shared)?;
    // goBGP accepts only an IPv4 router id here (docs/loxilb-api.md#bgp).
    if !matches!(router_id.parse::<IpAddr>(), Ok(IpAddr::V4(_))) {
        return Err(rpc(format!("invalid router-id format: {router_id}")));
    }
    let port = match wrap_u16(listen_port) {
        0 => 179,
        p => p,
    };
    let wanted = SimBgpGlobal {
        router_id,
        local_as: wrap_u32(local_as),
        set_next_hop_self,
        listen_port: port,
    };
    let mut st = shared.state();
    let bgp = &mut st.bgp;
    match &bgp.global {
        None => {
            bgp.global = Some(wanted.clone());
            bgp.add_loxilb_policies(wanted.set_next_hop_self);
            Ok(success())
        }
        // A repeat: the first configuration stays. Identical, loxilb answers 500 `action 3
        // is already set` (a controller takes it as harmless, docs/loxilb-api.md#bgp); a
        // different one is refused by goBGP.
        Some(current) if *current == wanted => Err(ApiError::handler(GLOBAL_ALREADY_SET)),
        Some(_) => Err(rpc("gobgp is already started")),
    }
}

fn list_neighbors(bgp: &BgpState) -> Value {
    let now = Instant::now();
    let attrs: Vec<Value> = bgp
        .neighbors
        .iter()
        .map(|(ip, n)| {
            let mut m = Map::new();
            m.insert("ipAddress".into(), json!(ip));
            if n.remote_as != 0 {
                m.insert("remoteAs".into(), json!(n.remote_as));
            }
            if !n.state.is_empty() {
                m.insert("state".into(), json!(n.state));
            }
            m.insert("updowntime".into(), json!(n.updown.show(now)));
            Value::Object(m)
        })
        .collect();
    json!({ "bgpNeiAttr": attrs })
}

/// `POST /config/bgp/neigh`.
fn neigh_add(shared: &Shared, bytes: &[u8]) -> Result<Response, ApiError> {
    let body = parse_body(bytes)?;
    let mut map = Map::new();
    let o = object(&body, &mut map, "BGPNeigh")?;
    let ip = o.string("ipAddress")?;
    let remote_as = o.int("remoteAs", GoInt::I64)?;
    let remote_port = o.int("remotePort", GoInt::I64)?.unwrap_or(0);
    let multihop = o.boolean("setMultiHop")?.unwrap_or(false);
    let ip = ip.ok_or_else(|| ApiError::required("ipAddress", "body"))?;
    let remote_as = remote_as.ok_or_else(|| ApiError::required("remoteAs", "body"))?;
    enabled(shared)?;
    let mut st = shared.state();
    let bgp = &mut st.bgp;
    bgp.active()?;
    // loxilb hands goBGP `net.ParseIP(ip).String()`: "<nil>" for no address. goBGP's
    // wording for that case is not known; the simulator refuses it as an invalid argument.
    let Some(addr) = parse_ip(&ip) else {
        return Err(rpc("invalid neighbor address: <nil>"));
    };
    let key = addr.to_string();
    if bgp.neighbors.contains_key(&key) {
        return Err(rpc(format!("can't overwrite the existing peer: {key}")));
    }
    let remote_port = match wrap_u16(remote_port) {
        0 => 179,
        p => p,
    };
    bgp.neighbors.insert(
        key,
        Neighbor {
            remote_as: wrap_u32(remote_as),
            remote_port,
            multihop,
            // No real peer to talk to: goBGP keeps trying to connect.
            state: "ACTIVE".into(),
            updown: UpDown::Never,
        },
    );
    Ok(success())
}

/// `DELETE /config/bgp/neigh/{ip}?remoteAs=N`. The parameter is an int32 (so a 4-byte AS
/// above 2147483647 must be sent as its two's complement) that loxilb dereferences without
/// checking it was given: without it the handler crashes. goBGP deletes by address only.
fn neigh_delete(
    shared: &Shared,
    ip: &str,
    query: &HashMap<String, String>,
) -> Result<Response, ApiError> {
    let Some(raw) = query.get("remoteAs").filter(|v| !v.is_empty()) else {
        return Err(ApiError::Crash("DELETE /config/bgp/neigh without remoteAs"));
    };
    if raw.parse::<i32>().is_err() {
        return Err(ApiError::framework(
            422,
            crate::errors::CODE_INVALID_TYPE,
            format!("remoteAs in query must be of type int32: {raw:?}"),
        ));
    }
    enabled(shared)?;
    let mut st = shared.state();
    let bgp = &mut st.bgp;
    bgp.active()?;
    let key = parse_ip(ip).map_or_else(|| "<nil>".to_string(), |a| a.to_string());
    if bgp.neighbors.remove(&key).is_none() {
        return Err(rpc(format!("can't delete a peer configuration for {key}")));
    }
    Ok(success())
}

#[cfg(test)]
mod tests {
    use super::policy::mask_range;
    use super::*;

    #[test]
    fn timedelta_like_gobgp() {
        assert_eq!(format_timedelta(0), "00:00:00");
        assert_eq!(format_timedelta(3_723), "01:02:03");
        assert_eq!(format_timedelta(90_061), "1d 01:01:01");
    }

    #[test]
    fn mask_ranges() {
        assert_eq!(mask_range("24..32").unwrap(), (24, 32));
        assert_eq!(mask_range("a..b").unwrap(), (0, 0));
        assert!(mask_range("24").is_err());
        assert!(mask_range("24-32").is_err());
        assert!(mask_range("1..2..3").is_err());
        assert_eq!(crate::status_for("Mask format is wrong").0, 400);
    }

    #[test]
    fn reference_counts_go_to_zero_and_away() {
        let mut b = BgpState::default();
        b.advertise(["10.0.0.1".to_string(), "10.0.0.1".to_string()]);
        b.withdraw(["10.0.0.1".to_string()]);
        assert_eq!(b.advertisements()["10.0.0.1"], 1);
        b.withdraw(["10.0.0.1".to_string(), "10.0.0.9".to_string()]);
        assert!(b.advertisements().is_empty());
    }

    #[test]
    fn gobgp_texts_get_loxilbs_statuses() {
        let status = |e: ApiError| match e {
            ApiError::Handler(raw) => crate::status_for(&raw).0,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            status(rpc("can't overwrite the existing peer: 10.0.0.1")),
            409
        );
        assert_eq!(
            status(rpc("can't delete a peer configuration for 10.0.0.1")),
            500
        );
        assert_eq!(status(rpc("invalid router-id format: x")), 400);
        assert_eq!(status(rpc("not found policy: p")), 404);
        assert_eq!(status(rpc("not found prefix set p")), 404);
        assert_eq!(status(rpc("statement s already defined")), 500);
        assert_eq!(status(rpc("bgp server hasn't started yet")), 500);
        assert_eq!(status(ApiError::handler(DISABLED)), 403);
        assert_eq!(status(ApiError::handler(GOBGP_STARTING)), 500);
        assert_eq!(status(ApiError::handler(GLOBAL_ALREADY_SET)), 500);
    }
}
