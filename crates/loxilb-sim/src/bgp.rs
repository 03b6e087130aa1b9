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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::time::Instant;

use axum::response::Response;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::Shared;
use crate::decode::{GoInt, GoObj, body_object, parse_body};
use crate::errors::{ApiError, ok_json, success};
use crate::validate::{parse_cidr, parse_ip};

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

/// `masklengthRange` is split on `..` into exactly two parts; the numbers themselves are not
/// checked (a part that is not a number reads as 0).
fn mask_range(s: &str) -> Result<(u32, u32), ApiError> {
    let parts: Vec<&str> = s.split("..").collect();
    if parts.len() != 2 {
        return Err(ApiError::handler("Mask format is wrong"));
    }
    let num = |p: &str| p.parse::<i64>().map_or(0, wrap_u32);
    Ok((num(parts[0]), num(parts[1])))
}

/// `POST /config/bgp/policy/definedsets/{type}`: creates the set or adds to it.
fn set_add(shared: &Shared, kind_text: &str, bytes: &[u8]) -> Result<Response, ApiError> {
    let body = parse_body(bytes)?;
    let mut map = Map::new();
    let o = object(&body, &mut map, "BGPPolicyDefinedSetsMod")?;
    let list = o.string_array("List")?.unwrap_or_default();
    let prefix_items = o.object_array("prefixList", "BGPPolicyPrefix")?;
    let name = o.string("name")?;
    let mut prefixes_in = Vec::new();
    for item in prefix_items.iter().flatten() {
        match item {
            Some(p) => prefixes_in.push((
                p.string("ipPrefix")?.unwrap_or_default(),
                p.string("masklengthRange")?.unwrap_or_default(),
            )),
            None => prefixes_in.push((String::new(), String::new())),
        }
    }
    let name = name.ok_or_else(|| ApiError::required("name", "body"))?;
    // loxilb's handler reads `prefixList` only for the type spelled `prefix`/`Prefix`, and
    // follows each item's pointer: a `null` item crashes it.
    let handler_prefix = matches!(kind_text, "prefix" | "Prefix");
    if handler_prefix
        && prefix_items
            .as_ref()
            .is_some_and(|items| items.iter().any(Option::is_none))
    {
        return Err(ApiError::Crash("null item in prefixList"));
    }
    enabled(shared)?;
    let mut set = DefinedSet::default();
    if handler_prefix {
        for (prefix, range) in &prefixes_in {
            let (min, max) = mask_range(range)?;
            set.prefixes.push((prefix.clone(), min, max));
        }
    } else {
        set.list = list;
    }
    // loxilb sends an unknown type as goBGP's type 0, which is the prefix type (and the
    // list it read is then ignored).
    let kind = SetKind::parse(kind_text).unwrap_or(SetKind::Prefix);
    if kind == SetKind::Prefix {
        set.list.clear();
    }
    let mut canonical = Vec::with_capacity(set.prefixes.len());
    for (prefix, min, max) in set.prefixes {
        let Some(p) = parse_cidr(&prefix) else {
            return Err(rpc(format!("invalid prefix: {prefix}")));
        };
        canonical.push((p, min, max));
    }
    set.prefixes = canonical;
    if kind == SetKind::Neighbor {
        for a in &set.list {
            if parse_cidr(a).is_none() && parse_ip(a).is_none() {
                return Err(rpc(format!("invalid address or prefix: {a}")));
            }
        }
    }
    let mut st = shared.state();
    let entry = st.bgp.sets.entry((kind, name)).or_default();
    for item in set.list {
        if !entry.list.contains(&item) {
            entry.list.push(item);
        }
    }
    for p in set.prefixes {
        if !entry.prefixes.contains(&p) {
            entry.prefixes.push(p);
        }
    }
    Ok(success())
}

/// `GET /config/bgp/policy/definedsets/{type}/{name}` (`all`: every set of the type).
fn set_get(bgp: &BgpState, kind_text: &str, name: &str) -> Result<Response, ApiError> {
    let Some(kind) = SetKind::parse(kind_text) else {
        return Err(ApiError::handler("Unsupported type"));
    };
    let attrs: Vec<Value> = bgp
        .sets
        .iter()
        .filter(|((k, n), _)| *k == kind && (name == "all" || n == name))
        .map(|((_, n), s)| {
            let list = null_if_empty(&s.list);
            // loxilb fills `prefixList` only when the path says exactly `prefix`.
            let prefix_list = if kind_text == "prefix" {
                json!(
                    s.prefixes
                        .iter()
                        .map(|(p, min, max)| json!({"ipPrefix": p, "masklengthRange": format!("{min}..{max}")}))
                        .collect::<Vec<_>>()
                )
            } else {
                Value::Null
            };
            json!({"name": n, "prefixList": prefix_list, "list": list})
        })
        .collect();
    Ok(ok_json(json!({ "definedsetsAttr": attrs })))
}

/// `DELETE /config/bgp/policy/definedsets/{type}/{name}`.
fn set_delete(bgp: &mut BgpState, kind_text: &str, name: &str) -> Result<(), ApiError> {
    // Unknown types go to goBGP as type 0: the prefix sets.
    let kind = SetKind::parse(kind_text).unwrap_or(SetKind::Prefix);
    let key = (kind, name.to_string());
    if !bgp.sets.contains_key(&key) {
        return Err(rpc(format!("not found defined-set: {name}")));
    }
    let in_use = bgp
        .policies
        .values()
        .flatten()
        .filter_map(|s| bgp.statements.get(s))
        .any(|s| s.references().any(|(_, n)| n == name));
    if in_use {
        return Err(rpc(format!("can't delete. defined-set {name} is in use")));
    }
    bgp.sets.remove(&key);
    Ok(())
}

fn match_option(s: &str) -> &'static str {
    match s {
        "all" => "all",
        "invert" => "invert",
        _ => "any",
    }
}

fn community_options(s: &str) -> &'static str {
    match s {
        "add" => "add",
        "remove" => "remove",
        _ => "replace",
    }
}

fn decode_match(
    o: Option<GoObj<'_>>,
    name_key: &str,
    option_key: &str,
) -> Result<Option<MatchSet>, ApiError> {
    let Some(o) = o else { return Ok(None) };
    let name = o.string(name_key)?.unwrap_or_default();
    let option = o.string(option_key)?.unwrap_or_default();
    Ok((!name.is_empty()).then(|| MatchSet {
        name,
        option: match_option(&option),
    }))
}

fn decode_community(o: Option<GoObj<'_>>) -> Result<Option<CommunityAction>, ApiError> {
    let Some(o) = o else { return Ok(None) };
    let options = o.string("options")?.unwrap_or_default();
    let methods = o.string_array("setCommunityMethod")?.unwrap_or_default();
    Ok((!methods.is_empty()).then(|| CommunityAction {
        options: community_options(&options),
        methods,
    }))
}

/// One statement as loxilb hands it to goBGP and goBGP keeps it. `None` for the nil pointers
/// loxilb's handler follows (the statement itself, `conditions`, `actions`).
fn decode_statement(o: &GoObj<'_>) -> Result<Option<Statement>, ApiError> {
    let name = o.string("name")?.unwrap_or_default();
    let conditions = o.object("conditions", "Conditions")?;
    let actions = o.object("actions", "Actions")?;
    let mut s = Statement {
        name,
        ..Statement::default()
    };
    if let Some(c) = &conditions {
        s.prefix_set = decode_match(
            c.object("matchPrefixSet", "MatchPrefixSet")?,
            "prefixSet",
            "matchSetOption",
        )?;
        s.neighbor_set = decode_match(
            c.object("matchNeighborSet", "MatchNeighborSet")?,
            "neighborSet",
            "matchSetOption",
        )?;
        if let Some(b) = c.object("bgpConditions", "BgpConditions")? {
            s.afi_safi_in = b.string_array("afiSafiIn")?.unwrap_or_default();
            if let Some(l) = b.object("asPathLength", "AsPathLength")? {
                let operator = l.string("operator")?.unwrap_or_default();
                let value = l.int("value", GoInt::I64)?.unwrap_or(0);
                if !operator.is_empty() {
                    let op = match operator.to_ascii_lowercase().as_str() {
                        "ge" => "ge",
                        "le" => "le",
                        _ => "eq",
                    };
                    s.as_path_length = Some((op, wrap_u32(value)));
                }
            }
            s.as_path_set = decode_match(
                b.object("matchAsPathSet", "MatchAsPathSet")?,
                "asPathSet",
                "matchSetOptions",
            )?;
            s.community_set = decode_match(
                b.object("matchCommunitySet", "MatchCommunitySet")?,
                "communitySet",
                "matchSetOptions",
            )?;
            s.ext_community_set = decode_match(
                b.object("matchExtCommunitySet", "MatchExtCommunitySet")?,
                "communitySet",
                "matchSetOptions",
            )?;
            s.large_community_set = decode_match(
                b.object("matchLargeCommunitySet", "MatchLargeCommunitySet")?,
                "communitySet",
                "matchSetOptions",
            )?;
            s.next_hop_in_list = b.string_array("nextHopInList")?.unwrap_or_default();
            s.rpki = match b
                .string("rpki")?
                .unwrap_or_default()
                .to_ascii_lowercase()
                .as_str()
            {
                "valid" => "valid",
                "invalid" => "invalid",
                "not-found" => "not-found",
                _ => "",
            };
            s.route_type = match b
                .string("routeType")?
                .unwrap_or_default()
                .to_ascii_lowercase()
                .as_str()
            {
                "internal" => "internal",
                "external" => "external",
                "local" => "local",
                _ => "",
            };
        }
    }
    if let Some(a) = &actions {
        s.route_disposition = match a.string("routeDisposition")?.as_deref() {
            Some("accept-route") => "accept-route",
            Some("reject-route") => "reject-route",
            _ => "",
        };
        if let Some(b) = a.object("bgpActions", "BgpActions")? {
            if let Some(p) = b.object("setAsPathPrepend", "SetAsPathPrepend")? {
                let asn = p.string("as")?.unwrap_or_default();
                let repeat = p.int("repeatN", GoInt::I64)?.unwrap_or(0);
                if !asn.is_empty() {
                    s.as_prepend = Some((asn.parse::<i64>().map_or(0, wrap_u32), wrap_u32(repeat)));
                }
            }
            s.community = decode_community(b.object("setCommunity", "SetCommunity")?)?;
            s.ext_community = decode_community(b.object("setExtCommunity", "SetCommunity")?)?;
            s.large_community = decode_community(b.object("setLargeCommunity", "SetCommunity")?)?;
            let med = b.string("setMed")?.unwrap_or_default();
            if !med.is_empty() {
                // Parsed before anything reaches goBGP (strconv.ParseInt(s, 10, 32)).
                match med.parse::<i32>() {
                    Ok(v) => s.med = Some(i64::from(v)),
                    Err(_)
                        if med
                            .trim_start_matches(['-', '+'])
                            .bytes()
                            .all(|c| c.is_ascii_digit()) =>
                    {
                        return Err(ApiError::handler(format!(
                            "strconv.ParseInt: parsing {med:?}: value out of range"
                        )));
                    }
                    Err(_) => {
                        return Err(ApiError::handler(format!(
                            "strconv.ParseInt: parsing {med:?}: invalid syntax"
                        )));
                    }
                }
            }
            s.local_pref = wrap_u32(b.int("setLocalPerf", GoInt::I64)?.unwrap_or(0));
            s.next_hop = b.string("setNextHop")?.unwrap_or_default();
        }
    }
    if conditions.is_none() || actions.is_none() {
        return Ok(None);
    }
    Ok(Some(s))
}

/// `POST /config/bgp/policy/definitions`: a new policy, or more statements for an existing
/// one. Statement names are unique across all policies.
fn policy_add(shared: &Shared, bytes: &[u8]) -> Result<Response, ApiError> {
    let body = parse_body(bytes)?;
    let mut map = Map::new();
    let o = object(&body, &mut map, "BGPPolicyDefinitionsMod")?;
    let name = o.string("name")?.unwrap_or_default();
    let mut statements = Vec::new();
    let mut crashed = false;
    for item in o
        .object_array("statements", "BGPPolicyDefinitionsStatement")?
        .unwrap_or_default()
    {
        match item.map(|s| decode_statement(&s)).transpose()?.flatten() {
            Some(s) => statements.push(s),
            None => crashed = true,
        }
    }
    if crashed {
        return Err(ApiError::Crash(
            "policy statement without conditions or actions",
        ));
    }
    enabled(shared)?;
    let mut st = shared.state();
    let bgp = &mut st.bgp;
    for s in &statements {
        for (kind, set) in s.references() {
            if !bgp.sets.contains_key(&(kind, set.to_string())) {
                return Err(rpc(format!("not found {} {set}", kind.label())));
            }
        }
    }
    let mut names = Vec::with_capacity(statements.len());
    for s in statements {
        // goBGP registers the names one by one: those before a clash stay registered.
        if bgp.statements.contains_key(&s.name) {
            return Err(rpc(format!("statement {} already defined", s.name)));
        }
        names.push(s.name.clone());
        bgp.statements.insert(s.name.clone(), s);
    }
    bgp.policies.entry(name).or_default().extend(names);
    Ok(success())
}

fn match_json(m: Option<&MatchSet>, name_key: &str, option_key: &str) -> Value {
    let mut o = Map::new();
    if let Some(m) = m {
        o.insert(option_key.into(), json!(m.option));
        o.insert(name_key.into(), json!(m.name));
    }
    Value::Object(o)
}

fn community_json(c: Option<&CommunityAction>) -> Value {
    match c {
        Some(c) => json!({"options": c.options, "setCommunityMethod": c.methods}),
        None => json!({"setCommunityMethod": null}),
    }
}

fn null_if_empty(v: &[String]) -> Value {
    if v.is_empty() { Value::Null } else { json!(v) }
}

/// A statement as loxilb lists it: every sub-object present, zero values left out, and the
/// extended and large community matches showing the community match (loxilb copies that
/// one into all three).
fn statement_json(s: &Statement) -> Value {
    let community = match_json(s.community_set.as_ref(), "communitySet", "matchSetOptions");
    let mut bgp_conditions = Map::new();
    bgp_conditions.insert("afiSafiIn".into(), null_if_empty(&s.afi_safi_in));
    bgp_conditions.insert(
        "asPathLength".into(),
        match s.as_path_length {
            Some((op, 0)) => json!({"operator": op}),
            Some((op, v)) => json!({"operator": op, "value": v}),
            None => json!({}),
        },
    );
    bgp_conditions.insert(
        "matchAsPathSet".into(),
        match_json(s.as_path_set.as_ref(), "asPathSet", "matchSetOptions"),
    );
    bgp_conditions.insert("matchCommunitySet".into(), community.clone());
    bgp_conditions.insert("matchExtCommunitySet".into(), community.clone());
    bgp_conditions.insert("matchLargeCommunitySet".into(), community);
    bgp_conditions.insert("nextHopInList".into(), null_if_empty(&s.next_hop_in_list));
    if !s.rpki.is_empty() {
        bgp_conditions.insert("rpki".into(), json!(s.rpki));
    }
    if !s.route_type.is_empty() {
        bgp_conditions.insert("routeType".into(), json!(s.route_type));
    }
    let mut actions = Map::new();
    let mut prepend = Map::new();
    if let Some((asn, repeat)) = s.as_prepend {
        prepend.insert("as".into(), json!(asn.to_string()));
        if repeat != 0 {
            prepend.insert("repeatN".into(), json!(repeat));
        }
    }
    actions.insert("setAsPathPrepend".into(), Value::Object(prepend));
    actions.insert("setCommunity".into(), community_json(s.community.as_ref()));
    actions.insert(
        "setExtCommunity".into(),
        community_json(s.ext_community.as_ref()),
    );
    actions.insert(
        "setLargeCommunity".into(),
        community_json(s.large_community.as_ref()),
    );
    if s.local_pref != 0 {
        actions.insert("setLocalPerf".into(), json!(s.local_pref));
    }
    if let Some(med) = s.med {
        actions.insert("setMed".into(), json!(med.to_string()));
    }
    // goBGP keeps `self` and `unchanged` as flags, which loxilb does not list.
    if !matches!(s.next_hop.as_str(), "" | "self" | "unchanged") {
        actions.insert("setNextHop".into(), json!(s.next_hop));
    }
    let mut action = Map::new();
    action.insert("bgpActions".into(), Value::Object(actions));
    if !s.route_disposition.is_empty() {
        action.insert("routeDisposition".into(), json!(s.route_disposition));
    }
    let mut out = Map::new();
    if !s.name.is_empty() {
        out.insert("name".into(), json!(s.name));
    }
    out.insert(
        "conditions".into(),
        json!({
            "bgpConditions": bgp_conditions,
            "matchNeighborSet": match_json(s.neighbor_set.as_ref(), "neighborSet", "matchSetOption"),
            "matchPrefixSet": match_json(s.prefix_set.as_ref(), "prefixSet", "matchSetOption"),
        }),
    );
    out.insert("actions".into(), Value::Object(action));
    Value::Object(out)
}

fn list_policies(bgp: &BgpState) -> Value {
    let attrs: Vec<Value> = bgp
        .policies
        .iter()
        .map(|(name, stmts)| {
            let statements: Vec<Value> = stmts
                .iter()
                .filter_map(|s| bgp.statements.get(s))
                .map(statement_json)
                .collect();
            let mut m = Map::new();
            if !name.is_empty() {
                m.insert("name".into(), json!(name));
            }
            m.insert(
                "statements".into(),
                if statements.is_empty() {
                    Value::Null
                } else {
                    Value::Array(statements)
                },
            );
            Value::Object(m)
        })
        .collect();
    json!({ "bgpPolicyAttr": attrs })
}

/// `DELETE /config/bgp/policy/definitions/{name}`: the policy and its statements.
fn policy_delete(bgp: &mut BgpState, name: &str) -> Result<(), ApiError> {
    let Some(stmts) = bgp.policies.get(name).cloned() else {
        return Err(rpc(format!("not found policy: {name}")));
    };
    // goBGP's in-use check looks at the export assignments only (it lists the export
    // direction twice and never the import one).
    let in_use = bgp
        .assignments
        .iter()
        .any(|((_, dir), a)| *dir == Direction::Export && a.policies.iter().any(|p| p == name));
    if in_use {
        return Err(rpc(format!("can't delete. policy {name} is in use")));
    }
    bgp.policies.remove(name);
    for s in stmts {
        if !bgp.policies.values().flatten().any(|other| *other == s) {
            bgp.statements.remove(&s);
        }
    }
    Ok(())
}

/// `POST` (`add`) and `DELETE /config/bgp/policy/apply`.
fn apply(shared: &Shared, bytes: &[u8], add: bool) -> Result<Response, ApiError> {
    let body = parse_body(bytes)?;
    let mut map = Map::new();
    let o = object(&body, &mut map, "BGPApplyPolicyToNeighborMod")?;
    let target = o.string("ipAddress")?;
    let policies = o.string_array("policies")?.unwrap_or_default();
    let policy_type = o.string("policyType")?;
    let route_action = o.string("routeAction")?;
    // Schema validation (required and enums), in property order; loxilb's DELETE route
    // shares the schema, so it needs `routeAction` as well.
    let target = target.ok_or_else(|| ApiError::required("ipAddress", "body"))?;
    let check = |key: &str, v: Option<String>, allowed: &[&str]| -> Result<String, ApiError> {
        let v = v.ok_or_else(|| ApiError::required(key, "body"))?;
        if allowed.contains(&v.as_str()) {
            Ok(v)
        } else {
            Err(ApiError::enumeration(
                key,
                &Value::from(v.as_str()),
                &allowed.join(" "),
            ))
        }
    };
    let policy_type = check("policyType", policy_type, &["import", "export"])?;
    let route_action = check("routeAction", route_action, &["accept", "reject"])?;
    enabled(shared)?;
    let mut st = shared.state();
    let bgp = &mut st.bgp;
    // Per-peer policies exist only for route-server clients, which loxilb never makes: only
    // the global RIB takes them.
    if target.is_empty() {
        return Err(rpc("empty table name"));
    }
    if target != GLOBAL {
        let key = parse_ip(&target).map_or_else(|| target.clone(), |a| a.to_string());
        if bgp.neighbors.contains_key(&key) {
            return Err(rpc(format!(
                "non-rs-client peer {target} doesn't have per peer policy"
            )));
        }
        return Err(rpc(format!("not found peer {target}")));
    }
    let dir = if policy_type == "import" {
        Direction::Import
    } else {
        Direction::Export
    };
    let mut seen = HashSet::new();
    for p in &policies {
        if !bgp.policies.contains_key(p) {
            return Err(rpc(format!("not found policy {p}")));
        }
        if !seen.insert(p.clone()) {
            return Err(rpc(format!("duplicated policy {p}")));
        }
    }
    let a = bgp
        .assignments
        .entry((GLOBAL.to_string(), dir))
        .or_insert_with(|| Assignment {
            policies: Vec::new(),
            default_action: "none",
        });
    if add {
        if let Some(dup) = policies.iter().find(|p| a.policies.contains(p)) {
            return Err(rpc(format!("duplicated policy {dup}")));
        }
        a.policies.extend(policies);
        a.default_action = if route_action == "accept" {
            "accept"
        } else {
            "reject"
        };
    } else if policies.is_empty() {
        // loxilb asks for "all" when no policy is named.
        a.policies.clear();
        a.default_action = "none";
    } else {
        a.policies.retain(|p| !policies.contains(p));
    }
    Ok(success())
}

#[cfg(test)]
mod tests {
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
