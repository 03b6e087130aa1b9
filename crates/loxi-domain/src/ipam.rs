//! IP pools and the address allocator.
//!
//! The allocator is an in-memory *index* of who owns which address; the durable record lives
//! in the API server and the index is rebuilt from it at start-up
//! (docs/architecture.md#invariants). Free space is kept as a set of disjoint intervals, so
//! taking the lowest free address, claiming a given one and releasing one are all O(log n)
//! whatever the pool size (a /15 or a /64 costs the same as a /30): no scan of the pool, ever.
//!
//! An address may have several owners (kube-loxilb's shared mode): each owner records its
//! [`Sharing`], and an owner joins an address only when it is compatible with every owner
//! already there, so no two owners ever hold the same address, port and protocol. The address
//! goes back to the free space when its last owner releases it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use ipnet::IpNet;
use thiserror::Error;

use crate::model::Protocol;

/// Address family of a pool or a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(ip: &IpAddr) -> Family {
        if ip.is_ipv4() { Family::V4 } else { Family::V6 }
    }

    fn index(self) -> usize {
        match self {
            Family::V4 => 0,
            Family::V6 => 1,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u32::from(v4) as u128,
        IpAddr::V6(v6) => u128::from(v6),
    }
}

fn from_u128(family: Family, v: u128) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(v as u32)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(v)),
    }
}

/// A block of addresses: a CIDR (network and broadcast skipped for IPv4 prefixes shorter
/// than /31, as every bare-metal LB does) or an inclusive `start-end` range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressBlock {
    family: Family,
    first: u128,
    last: u128,
    /// The whole CIDR, edges included (equal to `first..=last` for a range).
    outer: (u128, u128),
    text: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid address block {text:?}: {reason}")]
pub struct BlockError {
    pub text: String,
    pub reason: String,
}

impl FromStr for AddressBlock {
    type Err = BlockError;

    fn from_str(text: &str) -> Result<Self, BlockError> {
        AddressBlock::parse(text, true)
    }
}

impl AddressBlock {
    /// Parses a CIDR or an `a-b` range. `skip_edges` drops the network address of a CIDR
    /// (and its broadcast address for IPv4) when the prefix leaves at least two host bits:
    /// some clients and routers mishandle them (MetalLB's `avoidBuggyIPs`). Ranges are taken
    /// as written: whoever wrote a range chose its ends.
    pub fn parse(text: &str, skip_edges: bool) -> Result<AddressBlock, BlockError> {
        let err = |reason: &str| BlockError {
            text: text.to_string(),
            reason: reason.to_string(),
        };
        let t = text.trim();
        if let Some((a, b)) = t.split_once('-') {
            let a: IpAddr = a.trim().parse().map_err(|_| err("start is not an IP"))?;
            let b: IpAddr = b.trim().parse().map_err(|_| err("end is not an IP"))?;
            if Family::of(&a) != Family::of(&b) {
                return Err(err("start and end are of different families"));
            }
            let (first, last) = (to_u128(a), to_u128(b));
            if first > last {
                return Err(err("start is after end"));
            }
            return Ok(AddressBlock {
                family: Family::of(&a),
                first,
                last,
                outer: (first, last),
                text: t.to_string(),
            });
        }
        let net: IpNet = t
            .parse()
            .map_err(|_| err("expected a CIDR such as 192.0.2.0/24 or a range a-b"))?;
        let family = Family::of(&net.addr());
        let mut first = to_u128(net.network());
        let mut last = to_u128(net.broadcast());
        let outer = (first, last);
        let host_bits = net.max_prefix_len() - net.prefix_len();
        if skip_edges && host_bits >= 2 {
            // Skip the network address (and the broadcast address for IPv4, the
            // subnet-router anycast for IPv6 being the same first address).
            first += 1;
            if family == Family::V4 {
                last -= 1;
            }
        }
        Ok(AddressBlock {
            family,
            first,
            last,
            outer,
            text: t.to_string(),
        })
    }

    /// Whether `ip` is an edge of the block's CIDR that the block leaves out (its network
    /// or broadcast address, `avoidBuggyIPs`).
    pub fn skips(&self, ip: &IpAddr) -> bool {
        let v = to_u128(*ip);
        Family::of(ip) == self.family
            && (self.outer.0..=self.outer.1).contains(&v)
            && !(self.first..=self.last).contains(&v)
    }

    pub fn family(&self) -> Family {
        self.family
    }

    pub fn contains(&self, ip: &IpAddr) -> bool {
        Family::of(ip) == self.family && (self.first..=self.last).contains(&to_u128(*ip))
    }

    /// Whether the two blocks share at least one address.
    pub fn overlaps(&self, other: &AddressBlock) -> bool {
        self.family == other.family && self.first <= other.last && other.first <= self.last
    }

    /// The first and last usable address, as numbers (for ordering and overlap checks).
    pub fn bounds(&self) -> (u128, u128) {
        (self.first, self.last)
    }

    /// Number of usable addresses (saturating for huge IPv6 blocks).
    pub fn size(&self) -> u128 {
        (self.last - self.first).saturating_add(1)
    }
}

impl fmt::Display for AddressBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A named pool of one or more address blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    pub name: String,
    pub blocks: Vec<AddressBlock>,
}

impl Pool {
    pub fn new(name: &str, blocks: Vec<AddressBlock>) -> Pool {
        Pool {
            name: name.to_string(),
            blocks,
        }
    }

    pub fn contains(&self, ip: &IpAddr) -> bool {
        self.blocks.iter().any(|b| b.contains(ip))
    }

    /// Sum of the block sizes of `family` (blocks of one pool that overlap count twice; the
    /// allocator's [`Allocator::total_in`] counts each address once).
    pub fn size(&self, family: Family) -> u128 {
        self.blocks
            .iter()
            .filter(|b| b.family == family)
            .map(AddressBlock::size)
            .fold(0u128, u128::saturating_add)
    }
}

/// One (port, protocol) a Service serves on its address: the unit two sharers must not
/// both use (a loxilb rule is identified by address, port and protocol).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortProto {
    pub port: u16,
    pub protocol: Protocol,
}

impl PortProto {
    pub fn new(port: u16, protocol: Protocol) -> PortProto {
        PortProto { port, protocol }
    }
}

/// `80/TCP`: the Kubernetes spelling, as recorded in address claims.
impl fmt::Display for PortProto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let proto = match self.protocol {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        };
        write!(f, "{}/{proto}", self.port)
    }
}

impl FromStr for PortProto {
    type Err = String;

    fn from_str(s: &str) -> Result<PortProto, String> {
        let (port, proto) = s
            .trim()
            .split_once('/')
            .ok_or_else(|| format!("{s:?}: expected <port>/<protocol>, e.g. 80/TCP"))?;
        let port: u16 = port
            .parse()
            .map_err(|_| format!("{s:?}: {port:?} is not a port number"))?;
        let protocol =
            Protocol::parse(proto).ok_or_else(|| format!("{s:?}: unknown protocol {proto:?}"))?;
        Ok(PortProto { port, protocol })
    }
}

/// How one owner of an address lets others use it too.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Sharing {
    /// Nobody else: unique mode (`--set-unique-ip`), an operator's reservation, or an owner
    /// whose ports are not known (a claim written before sharing existed).
    Exclusive,
    /// Shared with owners of the same key (both absent counts as the same) and the same
    /// group of loxilbs (an address lives in one group: docs/fleet.md#groups-and-placement;
    /// absent is the default group) whose (port, protocol) sets are disjoint from `ports`.
    Ports {
        key: Option<String>,
        ports: BTreeSet<PortProto>,
        group: Option<String>,
    },
}

impl Sharing {
    /// Whether an owner with `self` and one with `other` may hold the same address.
    pub fn compatible(&self, other: &Sharing) -> bool {
        match (self, other) {
            (
                Sharing::Ports {
                    key: a,
                    ports: pa,
                    group: ga,
                },
                Sharing::Ports {
                    key: b,
                    ports: pb,
                    group: gb,
                },
            ) => a == b && ga == gb && pa.is_disjoint(pb),
            _ => false,
        }
    }

    pub fn key(&self) -> Option<&str> {
        match self {
            Sharing::Ports { key, .. } => key.as_deref(),
            Sharing::Exclusive => None,
        }
    }

    /// The group of loxilbs of an owner that shares (`None`: the default group).
    pub fn group(&self) -> Option<&str> {
        match self {
            Sharing::Ports { group, .. } => group.as_deref(),
            Sharing::Exclusive => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AllocError {
    /// `pool`: the pool, or the pools tried in order, comma-separated.
    #[error("{}", exhausted_message(pool, *family))]
    Exhausted { pool: String, family: Family },
    #[error("no pool named {0:?}")]
    UnknownPool(String),
    #[error("address {ip} is already owned by {owner}")]
    Taken { ip: IpAddr, owner: String },
    #[error("pool {pool:?} is disabled: it hands out no new address")]
    PoolDisabled { pool: String },
    #[error("pool {pool:?} does not admit this Service: {reason}")]
    NotAllowed { pool: String, reason: String },
    #[error("no address pool this Service may use has {family} addresses")]
    NoEligiblePool { family: Family },
    #[error(
        "address {ip} is the network or broadcast address of block {block} of pool {pool:?}, \
         which leaves it out (avoidBuggyIPs): request another address"
    )]
    EdgeAddress {
        ip: IpAddr,
        pool: String,
        block: String,
    },
}

fn exhausted_message(pool: &str, family: Family) -> String {
    if pool.contains(", ") {
        format!("pools {pool} have no free {family} address")
    } else {
        format!("pool {pool:?} has no free {family} address")
    }
}

impl AllocError {
    /// Stable, low-cardinality category (Event reason, metric label).
    pub fn reason(&self) -> &'static str {
        match self {
            AllocError::Exhausted { .. } => "PoolExhausted",
            AllocError::UnknownPool(_) => "UnknownPool",
            AllocError::Taken { .. } => "AddressInUse",
            AllocError::PoolDisabled { .. } => "PoolDisabled",
            AllocError::NotAllowed { .. } => "PoolNotAllowed",
            AllocError::NoEligiblePool { .. } => "NoEligiblePool",
            AllocError::EdgeAddress { .. } => "AddressNotUsable",
        }
    }
}

/// One pool's addresses of one family: all of them (merged) and the free ones, as disjoint
/// inclusive intervals keyed by their start.
#[derive(Debug, Clone)]
struct FreeSpace {
    family: Family,
    span: BTreeMap<u128, u128>,
    intervals: BTreeMap<u128, u128>,
    total: u128,
}

impl FreeSpace {
    fn lowest(&self) -> Option<u128> {
        self.intervals.first_key_value().map(|(s, _)| *s)
    }

    /// Removes `v` from the free space; false if it was not free.
    fn take(&mut self, v: u128) -> bool {
        let Some((&start, &end)) = self.intervals.range(..=v).next_back() else {
            return false;
        };
        if v > end {
            return false;
        }
        self.intervals.remove(&start);
        if start < v {
            self.intervals.insert(start, v - 1);
        }
        if v < end {
            self.intervals.insert(v + 1, end);
        }
        true
    }

    /// Gives `v` back, merging with neighbouring intervals.
    fn give_back(&mut self, v: u128) {
        let mut start = v;
        let mut end = v;
        if let Some((&ps, &pe)) = self.intervals.range(..v).next_back() {
            if pe >= v {
                return; // already free
            }
            if pe + 1 == v {
                self.intervals.remove(&ps);
                start = ps;
            }
        }
        if let Some(next) = v.checked_add(1)
            && let Some(ne) = self.intervals.remove(&next)
        {
            end = ne;
        }
        self.intervals.insert(start, end);
    }
}

#[derive(Debug, Clone)]
struct PoolState {
    pool: Pool,
    free: Vec<FreeSpace>,
}

impl PoolState {
    fn new(pool: Pool) -> PoolState {
        let mut free: Vec<FreeSpace> = Vec::new();
        for block in &pool.blocks {
            let space = match free.iter_mut().find(|f| f.family == block.family) {
                Some(s) => s,
                None => {
                    free.push(FreeSpace {
                        family: block.family,
                        span: BTreeMap::new(),
                        intervals: BTreeMap::new(),
                        total: 0,
                    });
                    free.last_mut().expect("just pushed")
                }
            };
            // Blocks of one pool may overlap; merging keeps the intervals disjoint.
            insert_interval(&mut space.span, block.first, block.last);
        }
        for space in &mut free {
            space.intervals = space.span.clone();
            space.total = space
                .span
                .iter()
                .map(|(s, e)| (e - s).saturating_add(1))
                .fold(0u128, u128::saturating_add);
        }
        PoolState { pool, free }
    }

    fn space(&mut self, family: Family) -> Option<&mut FreeSpace> {
        self.free.iter_mut().find(|f| f.family == family)
    }

    fn space_ref(&self, family: Family) -> Option<&FreeSpace> {
        self.free.iter().find(|f| f.family == family)
    }
}

/// Inserts [s, e] into a set of disjoint intervals, merging overlaps.
fn insert_interval(map: &mut BTreeMap<u128, u128>, mut s: u128, mut e: u128) {
    loop {
        let overlapping = map
            .range(..=e.saturating_add(1))
            .next_back()
            .filter(|&(_, &pe)| pe.saturating_add(1) >= s)
            .map(|(&ps, &pe)| (ps, pe));
        match overlapping {
            Some((ps, pe)) => {
                map.remove(&ps);
                s = s.min(ps);
                e = e.max(pe);
            }
            None => break,
        }
    }
    map.insert(s, e);
}

/// Result of [`Allocator::allocate_from`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub ip: IpAddr,
    /// The address already had owners: this owner joined them.
    pub joined: bool,
}

/// Who owns which address, and what is still free in each pool.
#[derive(Debug, Clone, Default)]
pub struct Allocator {
    pools: Vec<PoolState>,
    /// Owners of each address in the order they came (the first is shown as "the" owner).
    owners_by_ip: HashMap<IpAddr, Vec<(String, Sharing)>>,
    ips_by_owner: HashMap<String, Vec<IpAddr>>,
    /// Owned addresses per family, ordered: shared mode looks for the lowest owned address a
    /// newcomer fits on, scanning only owned addresses (never the pool).
    owned: [BTreeSet<u128>; 2],
    /// Owned addresses per pool and family (for metrics and pool status, without a scan).
    used_by_pool: HashMap<(String, Family), usize>,
}

impl Allocator {
    pub fn new(pools: Vec<Pool>) -> Allocator {
        Allocator {
            pools: pools.into_iter().map(PoolState::new).collect(),
            ..Allocator::default()
        }
    }

    /// The same ownership over other pools (a pool was added, edited or removed). Nothing
    /// changes hands: an address outside every new pool stays owned, and one inside a pool
    /// is taken out of its free space.
    pub fn with_pools(&self, pools: Vec<Pool>) -> Allocator {
        let mut next = Allocator::new(pools);
        let mut ips: Vec<&IpAddr> = self.owners_by_ip.keys().collect();
        ips.sort();
        for ip in ips {
            for (owner, sharing) in &self.owners_by_ip[ip] {
                next.insert_owner(*ip, owner, sharing.clone());
            }
        }
        next
    }

    pub fn pools(&self) -> impl Iterator<Item = &Pool> {
        self.pools.iter().map(|p| &p.pool)
    }

    /// The first owner of `ip` (the only one unless the address is shared).
    pub fn owner_of(&self, ip: &IpAddr) -> Option<&str> {
        self.owners_by_ip
            .get(ip)
            .and_then(|l| l.first())
            .map(|(o, _)| o.as_str())
    }

    /// Every owner of `ip`, first owner first.
    pub fn owners_of(&self, ip: &IpAddr) -> Vec<&str> {
        self.owners_by_ip
            .get(ip)
            .map(|l| l.iter().map(|(o, _)| o.as_str()).collect())
            .unwrap_or_default()
    }

    /// How `owner` shares `ip`, if it holds it.
    pub fn sharing_of(&self, ip: &IpAddr, owner: &str) -> Option<&Sharing> {
        self.owners_by_ip
            .get(ip)?
            .iter()
            .find(|(o, _)| o == owner)
            .map(|(_, s)| s)
    }

    pub fn holds(&self, ip: &IpAddr, owner: &str) -> bool {
        self.sharing_of(ip, owner).is_some()
    }

    /// The first owner of `ip` other than `owner` that `sharing` cannot share with.
    pub fn conflict(&self, ip: &IpAddr, owner: &str, sharing: &Sharing) -> Option<&str> {
        self.owners_by_ip
            .get(ip)?
            .iter()
            .find(|(o, s)| o != owner && !s.compatible(sharing))
            .map(|(o, _)| o.as_str())
    }

    /// Every (address, owner, sharing), in no particular order.
    pub fn entries(&self) -> impl Iterator<Item = (IpAddr, &str, &Sharing)> {
        self.owners_by_ip
            .iter()
            .flat_map(|(ip, l)| l.iter().map(move |(o, s)| (*ip, o.as_str(), s)))
    }

    pub fn addresses_of(&self, owner: &str) -> &[IpAddr] {
        self.ips_by_owner
            .get(owner)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// Name of the first pool whose blocks contain `ip` ("" outside every pool).
    pub fn pool_containing(&self, ip: &IpAddr) -> &str {
        self.pools
            .iter()
            .find(|p| p.pool.contains(ip))
            .map(|p| p.pool.name.as_str())
            .unwrap_or_default()
    }

    /// Owned addresses inside the pool named `pool` (both families).
    pub fn used_in(&self, pool: &str) -> usize {
        self.used_in_family(pool, Family::V4) + self.used_in_family(pool, Family::V6)
    }

    /// Owned addresses of `family` inside the pool named `pool`.
    pub fn used_in_family(&self, pool: &str, family: Family) -> usize {
        self.used_by_pool
            .get(&(pool.to_string(), family))
            .copied()
            .unwrap_or(0)
    }

    /// Addresses of `family` in the pool named `pool`, each counted once (saturating).
    pub fn total_in(&self, pool: &str, family: Family) -> u128 {
        self.pools
            .iter()
            .find(|p| p.pool.name == pool)
            .and_then(|p| p.space_ref(family))
            .map(|s| s.total)
            .unwrap_or(0)
    }

    /// Addresses of `family` in the pool named `pool` that nobody owns.
    pub fn free_in(&self, pool: &str, family: Family) -> u128 {
        self.total_in(pool, family)
            .saturating_sub(self.used_in_family(pool, family) as u128)
    }

    /// Number of addresses owned (inside pools or not), shared ones counted once.
    pub fn used(&self) -> usize {
        self.owners_by_ip.len()
    }

    /// Records that `owner` holds `ip` alone (adoption, static addresses, rebuild after
    /// restart). The address may lie outside every pool. Idempotent for the same owner.
    pub fn assign(&mut self, ip: IpAddr, owner: &str) -> Result<(), AllocError> {
        if self.holds(&ip, owner) {
            return Ok(());
        }
        self.assign_shared(ip, owner, Sharing::Exclusive)
    }

    /// Records that `owner` holds `ip` with `sharing`: a free address is taken; an owned one
    /// is joined when `sharing` is compatible with every other owner; an owner already there
    /// gets its sharing updated under the same condition. The address may lie outside every
    /// pool.
    pub fn assign_shared(
        &mut self,
        ip: IpAddr,
        owner: &str,
        sharing: Sharing,
    ) -> Result<(), AllocError> {
        if let Some(other) = self.conflict(&ip, owner, &sharing) {
            return Err(AllocError::Taken {
                ip,
                owner: other.to_string(),
            });
        }
        self.insert_owner(ip, owner, sharing);
        Ok(())
    }

    /// Makes `owners` exactly the owners of `ip`, as the durable record says (an empty list
    /// frees the address). No compatibility check: the record is the truth, the index
    /// follows it.
    pub fn set_owners(&mut self, ip: IpAddr, owners: Vec<(String, Sharing)>) {
        let previous = self.owners_by_ip.remove(&ip);
        let was_owned = previous.is_some();
        for (owner, _) in previous.unwrap_or_default() {
            self.forget_ip_of(&owner, &ip);
        }
        if owners.is_empty() {
            if was_owned {
                self.free(&ip);
            }
            return;
        }
        if was_owned {
            // Still owned: free space and counters stay as they are.
            self.owners_by_ip.insert(ip, Vec::new());
        }
        for (owner, sharing) in owners {
            self.insert_owner(ip, &owner, sharing);
        }
    }

    /// Adds (or updates) an owner without checking compatibility: the caller knows.
    fn insert_owner(&mut self, ip: IpAddr, owner: &str, sharing: Sharing) {
        if let Some(list) = self.owners_by_ip.get_mut(&ip) {
            match list.iter_mut().find(|(o, _)| o == owner) {
                Some(entry) => entry.1 = sharing,
                None => {
                    list.push((owner.to_string(), sharing));
                    self.ips_by_owner
                        .entry(owner.to_string())
                        .or_default()
                        .push(ip);
                }
            }
            return;
        }
        let family = Family::of(&ip);
        for state in &mut self.pools {
            if let Some(space) = state.space(family) {
                space.take(to_u128(ip));
            }
        }
        self.record(ip, owner, sharing);
    }

    /// Returns the owner's address of `family`, allocating the lowest free one from `pool`
    /// (or from the first pool with room when `pool` is `None`) if it has none.
    pub fn allocate(
        &mut self,
        owner: &str,
        pool: Option<&str>,
        family: Family,
    ) -> Result<IpAddr, AllocError> {
        if let Some(ip) = self
            .addresses_of(owner)
            .iter()
            .find(|ip| Family::of(ip) == family)
        {
            return Ok(*ip);
        }
        self.allocate_new(owner, pool, family)
    }

    /// Allocates the lowest free address of `family` from `pool` (or the first pool with
    /// room) for `owner` alone, even when it already holds one of that family.
    pub fn allocate_new(
        &mut self,
        owner: &str,
        pool: Option<&str>,
        family: Family,
    ) -> Result<IpAddr, AllocError> {
        let names: Vec<String> = match pool {
            Some(name) => vec![name.to_string()],
            None => self.pools.iter().map(|p| p.pool.name.clone()).collect(),
        };
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        self.allocate_from(owner, &names, family, &Sharing::Exclusive)
            .map(|g| g.ip)
    }

    /// Gives `owner` an address of `family` from the first of `pools` (in that order) with
    /// room. In each pool the lowest address that fits wins: a free one, or (for
    /// [`Sharing::Ports`]) an owned one whose owners are all compatible, whichever is lower,
    /// as kube-loxilb's shared mode reuses the first address a Service fits on. Addresses
    /// `owner` already holds are not considered.
    pub fn allocate_from(
        &mut self,
        owner: &str,
        pools: &[&str],
        family: Family,
        sharing: &Sharing,
    ) -> Result<Grant, AllocError> {
        for name in pools {
            let i = self
                .pools
                .iter()
                .position(|p| p.pool.name == *name)
                .ok_or_else(|| AllocError::UnknownPool(name.to_string()))?;
            let Some(space) = self.pools[i].space_ref(family) else {
                continue;
            };
            let lowest_free = space.lowest();
            let shared = match sharing {
                Sharing::Ports { .. } => self.first_shareable(space, owner, sharing, lowest_free),
                Sharing::Exclusive => None,
            };
            if let Some(v) = shared {
                let ip = from_u128(family, v);
                self.insert_owner(ip, owner, sharing.clone());
                return Ok(Grant { ip, joined: true });
            }
            if let Some(v) = lowest_free {
                let ip = from_u128(family, v);
                // Blocks of different pools may overlap: the address is taken everywhere.
                self.insert_owner(ip, owner, sharing.clone());
                return Ok(Grant { ip, joined: false });
            }
        }
        // Name the pools that serve the family (all of them when none does).
        let serving: Vec<&str> = pools
            .iter()
            .copied()
            .filter(|n| {
                self.pools
                    .iter()
                    .any(|p| p.pool.name == *n && p.space_ref(family).is_some())
            })
            .collect();
        let named = if serving.is_empty() {
            pools.to_vec()
        } else {
            serving
        };
        Err(AllocError::Exhausted {
            pool: named.join(", "),
            family,
        })
    }

    /// The lowest owned address of the pool's `space`, below `below` when given, that
    /// `owner` does not hold and whose owners all accept `sharing`.
    fn first_shareable(
        &self,
        space: &FreeSpace,
        owner: &str,
        sharing: &Sharing,
        below: Option<u128>,
    ) -> Option<u128> {
        let owned = &self.owned[space.family.index()];
        for (&start, &end) in &space.span {
            if below.is_some_and(|b| start > b) {
                return None;
            }
            for &v in owned.range(start..=end) {
                if below.is_some_and(|b| v > b) {
                    return None;
                }
                let ip = from_u128(space.family, v);
                let Some(list) = self.owners_by_ip.get(&ip) else {
                    continue;
                };
                if list
                    .iter()
                    .all(|(o, s)| o != owner && s.compatible(sharing))
                {
                    return Some(v);
                }
            }
        }
        None
    }

    /// Frees `ip` whoever holds it; a no-op for an address nobody owns.
    pub fn release(&mut self, ip: &IpAddr) {
        let Some(list) = self.owners_by_ip.remove(ip) else {
            return;
        };
        for (owner, _) in list {
            self.forget_ip_of(&owner, ip);
        }
        self.free(ip);
    }

    /// `owner` lets go of `ip`; the address is freed when nobody else holds it. Returns true
    /// when it was freed.
    pub fn release_from(&mut self, ip: &IpAddr, owner: &str) -> bool {
        let Some(list) = self.owners_by_ip.get_mut(ip) else {
            return false;
        };
        let before = list.len();
        list.retain(|(o, _)| o != owner);
        if list.len() == before {
            return false;
        }
        let empty = list.is_empty();
        self.forget_ip_of(owner, ip);
        if empty {
            self.owners_by_ip.remove(ip);
            self.free(ip);
        }
        empty
    }

    /// `owner` lets go of every address it holds (shared ones stay with their other owners).
    pub fn release_owner(&mut self, owner: &str) -> Vec<IpAddr> {
        let ips = self.addresses_of(owner).to_vec();
        for ip in &ips {
            self.release_from(ip, owner);
        }
        ips
    }

    fn forget_ip_of(&mut self, owner: &str, ip: &IpAddr) {
        if let Some(list) = self.ips_by_owner.get_mut(owner) {
            list.retain(|a| a != ip);
            if list.is_empty() {
                self.ips_by_owner.remove(owner);
            }
        }
    }

    /// Returns an address nobody owns any more to the free space of every pool holding it.
    fn free(&mut self, ip: &IpAddr) {
        let family = Family::of(ip);
        let v = to_u128(*ip);
        self.owned[family.index()].remove(&v);
        for state in &mut self.pools {
            if state.pool.contains(ip) {
                if let Some(n) = self
                    .used_by_pool
                    .get_mut(&(state.pool.name.clone(), family))
                {
                    *n = n.saturating_sub(1);
                }
                if let Some(space) = state.space(family) {
                    space.give_back(v);
                }
            }
        }
    }

    fn record(&mut self, ip: IpAddr, owner: &str, sharing: Sharing) {
        let family = Family::of(&ip);
        for state in &self.pools {
            if state.pool.contains(&ip) {
                *self
                    .used_by_pool
                    .entry((state.pool.name.clone(), family))
                    .or_default() += 1;
            }
        }
        self.owned[family.index()].insert(to_u128(ip));
        self.owners_by_ip
            .insert(ip, vec![(owner.to_string(), sharing)]);
        self.ips_by_owner
            .entry(owner.to_string())
            .or_default()
            .push(ip);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(name: &str, blocks: &[&str]) -> Pool {
        Pool::new(name, blocks.iter().map(|b| b.parse().unwrap()).collect())
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn cidr_skips_network_and_broadcast() {
        let mut a = Allocator::new(vec![pool("default", &["192.0.2.0/30"])]);
        assert_eq!(a.allocate("a", None, Family::V4), Ok(ip("192.0.2.1")));
        assert_eq!(a.allocate("b", None, Family::V4), Ok(ip("192.0.2.2")));
        assert!(matches!(
            a.allocate("c", None, Family::V4),
            Err(AllocError::Exhausted { .. })
        ));
    }

    #[test]
    fn allocation_is_idempotent_per_owner_and_release_reuses() {
        let mut a = Allocator::new(vec![pool("default", &["10.0.0.10-10.0.0.12"])]);
        let x = a.allocate("a", None, Family::V4).unwrap();
        assert_eq!(a.allocate("a", None, Family::V4).unwrap(), x);
        let y = a.allocate("b", None, Family::V4).unwrap();
        a.release(&x);
        assert_eq!(a.allocate("c", None, Family::V4).unwrap(), x);
        assert_ne!(x, y);
    }

    #[test]
    fn assign_marks_taken_and_refuses_other_owner() {
        let mut a = Allocator::new(vec![pool("default", &["10.0.0.0/24"])]);
        a.assign(ip("10.0.0.1"), "a").unwrap();
        assert_eq!(a.allocate("b", None, Family::V4).unwrap(), ip("10.0.0.2"));
        assert!(matches!(
            a.assign(ip("10.0.0.1"), "c"),
            Err(AllocError::Taken { .. })
        ));
        // Outside every pool: still owned.
        a.assign(ip("203.0.113.9"), "d").unwrap();
        assert_eq!(a.owner_of(&ip("203.0.113.9")), Some("d"));
        a.release(&ip("203.0.113.9"));
        assert_eq!(a.owner_of(&ip("203.0.113.9")), None);
    }

    #[test]
    fn beyond_254_addresses_maps_correctly() {
        // kube-loxilb's allocator goes wrong past 254 addresses; ours must not.
        let mut a = Allocator::new(vec![pool("default", &["10.1.0.0/22"])]);
        let mut last = ip("0.0.0.0");
        for i in 0..1022 {
            last = a.allocate(&format!("s{i}"), None, Family::V4).unwrap();
        }
        assert_eq!(last, ip("10.1.3.254"));
    }

    #[test]
    fn unknown_pool_and_ipv6() {
        let mut a = Allocator::new(vec![pool("v6", &["2001:db8::/120"])]);
        assert_eq!(
            a.allocate("a", Some("nope"), Family::V6),
            Err(AllocError::UnknownPool("nope".into()))
        );
        assert_eq!(
            a.allocate("a", Some("v6"), Family::V6).unwrap(),
            ip("2001:db8::1")
        );
        assert!(matches!(
            a.allocate("b", Some("v6"), Family::V4),
            Err(AllocError::Exhausted { .. })
        ));
    }

    #[test]
    fn bad_blocks_are_rejected() {
        for bad in [
            "",
            "10.0.0.0/33",
            "10.0.0.5-10.0.0.1",
            "10.0.0.1-2001:db8::1",
            "x",
        ] {
            assert!(bad.parse::<AddressBlock>().is_err(), "{bad}");
        }
    }

    fn ports(key: Option<&str>, list: &[u16]) -> Sharing {
        Sharing::Ports {
            key: key.map(str::to_string),
            ports: list
                .iter()
                .map(|p| PortProto::new(*p, Protocol::Tcp))
                .collect(),
            group: None,
        }
    }

    #[test]
    fn port_proto_text_round_trips() {
        let p: PortProto = "53/udp".parse().unwrap();
        assert_eq!(p, PortProto::new(53, Protocol::Udp));
        assert_eq!(p.to_string(), "53/UDP");
        for bad in ["53", "x/TCP", "70000/TCP", "80/ICMP"] {
            assert!(bad.parse::<PortProto>().is_err(), "{bad}");
        }
    }

    #[test]
    fn sharing_compatibility() {
        assert!(ports(None, &[80]).compatible(&ports(None, &[443])));
        assert!(!ports(None, &[80]).compatible(&ports(None, &[80, 443])));
        assert!(ports(Some("k"), &[80]).compatible(&ports(Some("k"), &[443])));
        assert!(!ports(Some("k"), &[80]).compatible(&ports(Some("j"), &[443])));
        assert!(!ports(Some("k"), &[80]).compatible(&ports(None, &[443])));
        assert!(!Sharing::Exclusive.compatible(&ports(None, &[443])));
        assert!(!ports(None, &[443]).compatible(&Sharing::Exclusive));
        // Same port, other protocol: no overlap (rule identity is address+port+protocol).
        let udp = Sharing::Ports {
            key: None,
            ports: [PortProto::new(80, Protocol::Udp)].into(),
            group: None,
        };
        let other_group = Sharing::Ports {
            key: None,
            ports: [PortProto::new(81, Protocol::Tcp)].into(),
            group: Some("east".into()),
        };
        assert!(
            !other_group.compatible(&ports(None, &[80])),
            "an address lives in one group"
        );
        assert!(udp.compatible(&ports(None, &[80])));
    }

    #[test]
    fn shared_mode_reuses_the_first_address_that_fits() {
        let mut a = Allocator::new(vec![pool("p", &["10.0.0.1-10.0.0.10"])]);
        let web = a
            .allocate_from("web", &["p"], Family::V4, &ports(None, &[80]))
            .unwrap();
        assert_eq!(
            web,
            Grant {
                ip: ip("10.0.0.1"),
                joined: false
            }
        );
        let web2 = a
            .allocate_from("web2", &["p"], Family::V4, &ports(None, &[80]))
            .unwrap();
        assert_eq!(web2.ip, ip("10.0.0.2"), "same port: another address");
        let tls = a
            .allocate_from("tls", &["p"], Family::V4, &ports(None, &[443]))
            .unwrap();
        assert_eq!(
            tls,
            Grant {
                ip: ip("10.0.0.1"),
                joined: true
            }
        );
        assert_eq!(a.owners_of(&ip("10.0.0.1")), ["web", "tls"]);
        assert_eq!(a.used(), 2);
        assert_eq!(a.used_in("p"), 2);
        // A keyed Service shares only with its key; an exclusive one never.
        let keyed = a
            .allocate_from("k", &["p"], Family::V4, &ports(Some("x"), &[22]))
            .unwrap();
        assert_eq!(
            keyed,
            Grant {
                ip: ip("10.0.0.3"),
                joined: false
            }
        );
        let keyed2 = a
            .allocate_from("k2", &["p"], Family::V4, &ports(Some("x"), &[23]))
            .unwrap();
        assert_eq!(
            keyed2,
            Grant {
                ip: ip("10.0.0.3"),
                joined: true
            }
        );
        let alone = a
            .allocate_from("alone", &["p"], Family::V4, &Sharing::Exclusive)
            .unwrap();
        assert_eq!(alone.ip, ip("10.0.0.4"));
        let dns = a
            .allocate_from("dns", &["p"], Family::V4, &ports(None, &[53]))
            .unwrap();
        assert_eq!(dns.ip, ip("10.0.0.1"), "the lowest address that fits wins");
        // A free address below every shareable one wins over sharing.
        a.release_owner("web2");
        let ssh = a
            .allocate_from("ssh", &["p"], Family::V4, &ports(None, &[80]))
            .unwrap();
        assert_eq!(
            ssh,
            Grant {
                ip: ip("10.0.0.2"),
                joined: false
            }
        );
    }

    #[test]
    fn releasing_one_sharer_keeps_the_address() {
        let mut a = Allocator::new(vec![pool("p", &["10.0.0.1-10.0.0.2"])]);
        let x = a
            .allocate_from("a", &["p"], Family::V4, &ports(None, &[80]))
            .unwrap()
            .ip;
        a.allocate_from("b", &["p"], Family::V4, &ports(None, &[81]))
            .unwrap();
        assert!(!a.release_from(&x, "a"), "b still holds it");
        assert_eq!(a.owners_of(&x), ["b"]);
        assert_eq!(a.owner_of(&x), Some("b"));
        assert!(a.addresses_of("a").is_empty());
        // Not free: a fresh exclusive owner gets the other address.
        assert_eq!(
            a.allocate_from("c", &["p"], Family::V4, &Sharing::Exclusive)
                .unwrap()
                .ip,
            ip("10.0.0.2")
        );
        assert!(a.release_from(&x, "b"));
        assert_eq!(a.owner_of(&x), None);
        assert_eq!(a.used_in("p"), 1);
        assert_eq!(a.free_in("p", Family::V4), 1);
    }

    #[test]
    fn assign_shared_checks_every_owner_and_updates_in_place() {
        let mut a = Allocator::new(vec![pool("p", &["10.0.0.0/24"])]);
        let x = ip("10.0.0.9");
        a.assign_shared(x, "a", ports(None, &[80])).unwrap();
        a.assign_shared(x, "b", ports(None, &[443])).unwrap();
        assert_eq!(
            a.assign_shared(x, "c", ports(None, &[443, 8443])),
            Err(AllocError::Taken {
                ip: x,
                owner: "b".into()
            })
        );
        // a widens its ports onto b's: refused, a keeps its old sharing.
        assert!(a.assign_shared(x, "a", ports(None, &[80, 443])).is_err());
        assert_eq!(a.sharing_of(&x, "a"), Some(&ports(None, &[80])));
        a.assign_shared(x, "a", ports(None, &[80, 8080])).unwrap();
        assert_eq!(a.sharing_of(&x, "a"), Some(&ports(None, &[80, 8080])));
        assert_eq!(a.conflict(&x, "c", &Sharing::Exclusive), Some("a"));
        // The old exclusive API refuses an address with owners, whatever their sharing.
        assert!(a.assign(x, "d").is_err());
        assert!(a.assign(x, "a").is_ok(), "idempotent for an owner");
    }

    #[test]
    fn new_pools_keep_every_owner_and_address() {
        let mut a = Allocator::new(vec![pool("p", &["10.0.0.1-10.0.0.10"])]);
        for (o, p) in [("a", 80), ("b", 81), ("c", 80), ("d", 80)] {
            a.allocate_from(o, &["p"], Family::V4, &ports(None, &[p]))
                .unwrap();
        }
        a.assign(ip("203.0.113.1"), "static").unwrap();
        // Shrink to 10.0.0.2-10.0.0.5 and add a pool: nobody moves, 10.0.0.1 stays owned
        // (outside every pool now), the new pools' free space excludes owned addresses.
        let b = a.with_pools(vec![
            pool("p", &["10.0.0.2-10.0.0.5"]),
            pool("q", &["10.0.0.1-10.0.0.3"]),
        ]);
        let mut before: Vec<_> = a
            .entries()
            .map(|(i, o, s)| (i, o.to_string(), s.clone()))
            .collect();
        let mut after: Vec<_> = b
            .entries()
            .map(|(i, o, s)| (i, o.to_string(), s.clone()))
            .collect();
        before.sort_by(|x, y| (x.0, &x.1).cmp(&(y.0, &y.1)));
        after.sort_by(|x, y| (x.0, &x.1).cmp(&(y.0, &y.1)));
        assert_eq!(before, after);
        assert_eq!(b.owners_of(&ip("10.0.0.1")), ["a", "b"]);
        assert_eq!(b.used_in("p"), 2);
        assert_eq!(b.used_in("q"), 3);
        assert_eq!(b.total_in("p", Family::V4), 4);
        assert_eq!(b.free_in("q", Family::V4), 0);
        let mut b = b;
        assert_eq!(
            b.allocate_new("e", Some("p"), Family::V4).unwrap(),
            ip("10.0.0.4")
        );
    }

    #[test]
    fn exhausted_names_the_pools_tried() {
        let mut a = Allocator::new(vec![
            pool("a", &["10.0.0.1/32"]),
            pool("b", &["10.0.1.1/32"]),
        ]);
        a.allocate_new("x", None, Family::V4).unwrap();
        a.allocate_new("y", None, Family::V4).unwrap();
        let e = a.allocate_new("z", None, Family::V4).unwrap_err();
        assert_eq!(e.to_string(), "pools a, b have no free IPv4 address");
        let e = a.allocate_new("z", Some("a"), Family::V4).unwrap_err();
        assert_eq!(e.to_string(), "pool \"a\" has no free IPv4 address");
    }

    #[test]
    fn overlapping_blocks_of_one_pool_count_once() {
        let a = Allocator::new(vec![pool("p", &["10.0.0.0/30", "10.0.0.1-10.0.0.5"])]);
        assert_eq!(a.total_in("p", Family::V4), 5);
        assert_eq!(a.total_in("p", Family::V6), 0);
        assert_eq!(a.total_in("nope", Family::V4), 0);
    }

    #[test]
    fn set_owners_follows_the_record() {
        let mut a = Allocator::new(vec![pool("p", &["10.0.0.1-10.0.0.3"])]);
        let x = ip("10.0.0.1");
        a.set_owners(
            x,
            vec![
                ("a".into(), ports(None, &[80])),
                ("b".into(), ports(None, &[80])),
            ],
        );
        assert_eq!(
            a.owners_of(&x),
            ["a", "b"],
            "the record wins, even when odd"
        );
        assert_eq!((a.used_in("p"), a.addresses_of("b")), (1, &[x][..]));
        a.set_owners(x, vec![("c".into(), Sharing::Exclusive)]);
        assert_eq!(a.owners_of(&x), ["c"]);
        assert!(a.addresses_of("a").is_empty() && a.addresses_of("b").is_empty());
        assert_eq!(a.used_in("p"), 1);
        a.set_owners(x, Vec::new());
        assert_eq!(a.used(), 0);
        assert_eq!(a.allocate_new("d", None, Family::V4).unwrap(), x, "freed");
    }
}
