//! IP pools and the address allocator.
//!
//! The allocator is an in-memory *index* of who owns which address; the durable record lives
//! in the API server and the index is rebuilt from it at start-up (DESIGN.md §4). Free space
//! is kept as a set of disjoint intervals, so taking the lowest free address, claiming a given
//! one and releasing one are all O(log n) whatever the pool size (a /15 or a /64 costs the
//! same as a /30): no scan of the pool, ever.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use ipnet::IpNet;
use thiserror::Error;

/// Address family of a pool or a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(ip: &IpAddr) -> Family {
        if ip.is_ipv4() { Family::V4 } else { Family::V6 }
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
                text: t.to_string(),
            });
        }
        let net: IpNet = t
            .parse()
            .map_err(|_| err("expected a CIDR such as 192.0.2.0/24 or a range a-b"))?;
        let family = Family::of(&net.addr());
        let mut first = to_u128(net.network());
        let mut last = to_u128(net.broadcast());
        let host_bits = net.max_prefix_len() - net.prefix_len();
        if host_bits >= 2 {
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
            text: t.to_string(),
        })
    }
}

impl AddressBlock {
    pub fn family(&self) -> Family {
        self.family
    }

    pub fn contains(&self, ip: &IpAddr) -> bool {
        Family::of(ip) == self.family && (self.first..=self.last).contains(&to_u128(*ip))
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

    pub fn size(&self, family: Family) -> u128 {
        self.blocks
            .iter()
            .filter(|b| b.family == family)
            .map(AddressBlock::size)
            .fold(0u128, u128::saturating_add)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AllocError {
    #[error("pool {pool:?} has no free {family} address")]
    Exhausted { pool: String, family: Family },
    #[error("no pool named {0:?}")]
    UnknownPool(String),
    #[error("address {ip} is already owned by {owner}")]
    Taken { ip: IpAddr, owner: String },
}

impl AllocError {
    /// Stable, low-cardinality category (Event reason, metric label).
    pub fn reason(&self) -> &'static str {
        match self {
            AllocError::Exhausted { .. } => "PoolExhausted",
            AllocError::UnknownPool(_) => "UnknownPool",
            AllocError::Taken { .. } => "AddressInUse",
        }
    }
}

/// Free space of one pool: disjoint inclusive intervals keyed by their start, per family.
#[derive(Debug, Clone)]
struct FreeSpace {
    family: Family,
    intervals: BTreeMap<u128, u128>,
}

impl FreeSpace {
    fn take_lowest(&mut self) -> Option<u128> {
        let (start, end) = self.intervals.pop_first()?;
        if start < end {
            self.intervals.insert(start + 1, end);
        }
        Some(start)
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
                        intervals: BTreeMap::new(),
                    });
                    free.last_mut().expect("just pushed")
                }
            };
            // Blocks of one pool may overlap; merging keeps the intervals disjoint.
            insert_interval(&mut space.intervals, block.first, block.last);
        }
        PoolState { pool, free }
    }

    fn space(&mut self, family: Family) -> Option<&mut FreeSpace> {
        self.free.iter_mut().find(|f| f.family == family)
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

/// Who owns which address, and what is still free in each pool.
#[derive(Debug, Clone, Default)]
pub struct Allocator {
    pools: Vec<PoolState>,
    owner_by_ip: HashMap<IpAddr, String>,
    ips_by_owner: HashMap<String, Vec<IpAddr>>,
    /// Owned addresses per pool name (for metrics and pool status, without a scan).
    used_by_pool: HashMap<String, usize>,
}

impl Allocator {
    pub fn new(pools: Vec<Pool>) -> Allocator {
        Allocator {
            pools: pools.into_iter().map(PoolState::new).collect(),
            ..Allocator::default()
        }
    }

    pub fn pools(&self) -> impl Iterator<Item = &Pool> {
        self.pools.iter().map(|p| &p.pool)
    }

    pub fn owner_of(&self, ip: &IpAddr) -> Option<&str> {
        self.owner_by_ip.get(ip).map(String::as_str)
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

    /// Owned addresses inside the pool named `pool`.
    pub fn used_in(&self, pool: &str) -> usize {
        self.used_by_pool.get(pool).copied().unwrap_or(0)
    }

    /// Number of addresses owned (inside pools or not).
    pub fn used(&self) -> usize {
        self.owner_by_ip.len()
    }

    /// Records that `owner` holds `ip` (adoption, static addresses, rebuild after restart).
    /// The address may lie outside every pool. Idempotent for the same owner.
    pub fn assign(&mut self, ip: IpAddr, owner: &str) -> Result<(), AllocError> {
        match self.owner_by_ip.get(&ip) {
            Some(current) if current == owner => return Ok(()),
            Some(current) => {
                return Err(AllocError::Taken {
                    ip,
                    owner: current.clone(),
                });
            }
            None => {}
        }
        let family = Family::of(&ip);
        for state in &mut self.pools {
            if let Some(space) = state.space(family) {
                space.take(to_u128(ip));
            }
        }
        self.record(ip, owner);
        Ok(())
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
    /// room) for `owner`, even when it already holds one of that family.
    pub fn allocate_new(
        &mut self,
        owner: &str,
        pool: Option<&str>,
        family: Family,
    ) -> Result<IpAddr, AllocError> {
        let candidates: Vec<usize> = match pool {
            Some(name) => {
                let i = self
                    .pools
                    .iter()
                    .position(|p| p.pool.name == name)
                    .ok_or_else(|| AllocError::UnknownPool(name.to_string()))?;
                vec![i]
            }
            None => (0..self.pools.len()).collect(),
        };
        for i in &candidates {
            if let Some(v) = self.pools[*i]
                .space(family)
                .and_then(FreeSpace::take_lowest)
            {
                let ip = from_u128(family, v);
                // Blocks of different pools may overlap: the address is taken everywhere.
                for (j, other) in self.pools.iter_mut().enumerate() {
                    if j != *i
                        && let Some(space) = other.space(family)
                    {
                        space.take(v);
                    }
                }
                self.record(ip, owner);
                return Ok(ip);
            }
        }
        Err(AllocError::Exhausted {
            pool: pool.map(str::to_string).unwrap_or_else(|| {
                self.pools
                    .first()
                    .map(|p| p.pool.name.clone())
                    .unwrap_or_default()
            }),
            family,
        })
    }

    /// Frees `ip`; a no-op for an address nobody owns.
    pub fn release(&mut self, ip: &IpAddr) {
        let Some(owner) = self.owner_by_ip.remove(ip) else {
            return;
        };
        if let Some(list) = self.ips_by_owner.get_mut(&owner) {
            list.retain(|a| a != ip);
            if list.is_empty() {
                self.ips_by_owner.remove(&owner);
            }
        }
        let family = Family::of(ip);
        let v = to_u128(*ip);
        for state in &mut self.pools {
            let inside = state.pool.contains(ip);
            if inside {
                if let Some(n) = self.used_by_pool.get_mut(&state.pool.name) {
                    *n = n.saturating_sub(1);
                }
                if let Some(space) = state.space(family) {
                    space.give_back(v);
                }
            }
        }
    }

    /// Frees every address of `owner`.
    pub fn release_owner(&mut self, owner: &str) -> Vec<IpAddr> {
        let ips = self.addresses_of(owner).to_vec();
        for ip in &ips {
            self.release(ip);
        }
        ips
    }

    fn record(&mut self, ip: IpAddr, owner: &str) {
        for state in &self.pools {
            if state.pool.contains(&ip) {
                *self
                    .used_by_pool
                    .entry(state.pool.name.clone())
                    .or_default() += 1;
            }
        }
        self.owner_by_ip.insert(ip, owner.to_string());
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
}
