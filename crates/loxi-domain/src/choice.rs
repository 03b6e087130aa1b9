//! Which address fills one address slot of a Service: the decision behind every claim.
//!
//! The candidates, in order: the address asked for by name (`loxilb.io/staticIP`,
//! `spec.loadBalancerIP`); an address already indexed for the Service; an address it shows in
//! its status (adoption from kube-loxilb or the Go loxi-ccm, or a restart before its claim
//! was written); a free address from its pools. An address a Service already has is kept
//! even when its pool was shrunk, disabled, or no longer admits it (no reshuffle), and even
//! in unique mode when it shares it (switching modes moves nobody).
//!
//! The choice is recorded in the allocator index (so that concurrent choices see it); the
//! caller backs it with a durable claim before using it, and takes it out of the index again
//! when the claim cannot be written.

use std::net::IpAddr;

use crate::addressing::AddressSlot;
use crate::ipam::{AllocError, Allocator, Family, Sharing};
use crate::pools::{PoolSet, Requester};

/// What an address is for: decides its owner key, its claim entry, whether the status shows
/// it, and whether it may be shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A virtual IP of the Service, one per IP family, shown in its status.
    Vip,
    /// An SCTP multi-homing address: never shared, never shown, so never adopted.
    Secondary,
}

/// Where the chosen address comes from; decides what happens when its claim is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Already indexed for this Service (claimed before, or shown in its status at start-up).
    Indexed,
    /// Shown in the Service's status.
    Published,
    /// `loxilb.io/staticIP` or `spec.loadBalancerIP`.
    Requested,
    /// From a pool: a free address, or (shared mode) one the Service fits on next to others.
    Allocated,
}

impl Source {
    /// A lost claim race on an address from this source is reported (the Service asked for
    /// that address, or shows it); on other sources another address is chosen.
    pub fn is_specific(self) -> bool {
        matches!(self, Source::Published | Source::Requested)
    }
}

/// One address slot of a Service and what may fill it: plain inputs, no I/O.
#[derive(Debug, Clone, Copy)]
pub struct Choice<'a, 'l> {
    pub slot: &'a AddressSlot,
    pub pools: &'a PoolSet,
    pub who: &'a Requester<'l>,
    /// The index key of the Service for this role.
    pub owner: &'a str,
    /// What the Service occupies (its ports and key) on a VIP.
    pub sharing: &'a Sharing,
    /// `--set-unique-ip`: join nobody.
    pub unique: bool,
    pub role: Role,
    /// Addresses of the same role already filled by earlier slots of this pass.
    pub taken: &'a [IpAddr],
    /// The addresses the Service shows in its status.
    pub published: &'a [IpAddr],
}

/// Chooses the address for `choice` and records it in `index` for `choice.owner`.
pub fn choose_address(
    choice: &Choice<'_, '_>,
    index: &mut Allocator,
) -> Result<(IpAddr, Source), AllocError> {
    let Choice {
        slot,
        pools,
        who,
        owner,
        unique,
        role,
        taken,
        published,
        ..
    } = *choice;
    // A secondary address is never shared.
    let exclusive = Sharing::Exclusive;
    let sharing = match role {
        Role::Vip => choice.sharing,
        Role::Secondary => &exclusive,
    };
    let mine = |ip: &IpAddr| Family::of(ip) == slot.family && !taken.contains(ip);
    if let Some(wanted) = slot.requested {
        if index.holds(&wanted, owner) {
            // Refreshed when the new sharing still fits; a clash is settled by the claim.
            let _ = index.assign_shared(wanted, owner, sharing.clone());
            return Ok((wanted, Source::Indexed));
        }
        pools.admits_address(&wanted, who)?;
        if let Some(holder) = index.owner_of(&wanted)
            && (role == Role::Secondary || !crate::sharing::may_join(unique, true, sharing))
        {
            return Err(AllocError::Taken {
                ip: wanted,
                owner: holder.to_string(),
            });
        }
        index.assign_shared(wanted, owner, sharing.clone())?;
        return Ok((wanted, Source::Requested));
    }
    // Indexed, but possibly from another pool than the one now selected: kept unless the
    // selection names a pool that does not contain it, or its ports now overlap another
    // owner's.
    let indexed = index.addresses_of(owner).iter().copied().find(|ip| {
        mine(ip)
            && slot.pool.as_deref().is_none_or(|p| {
                pools.get(p).is_some_and(|d| d.pool.contains(ip))
                    || index.pool_containing(ip).is_empty()
            })
            && index.conflict(ip, owner, sharing).is_none()
    });
    if let Some(ip) = indexed {
        index.assign_shared(ip, owner, sharing.clone())?;
        return Ok((ip, Source::Indexed));
    }
    // Adoption joins the address's other owners only in shared mode (kube-loxilb's shared
    // mode shows several Services on one address).
    if role == Role::Vip
        && let Some(ip) = published.iter().copied().find(|ip| mine(ip))
        && index.conflict(&ip, owner, sharing).is_none()
        && (!unique || index.owners_of(&ip).iter().all(|o| *o == owner))
    {
        index.assign_shared(ip, owner, sharing.clone())?;
        return Ok((ip, Source::Published));
    }
    let candidates = pools.candidates(slot.pool.as_deref(), who, slot.family)?;
    // Unique mode takes free addresses only (the claim then records the real ports).
    let take = if unique || role == Role::Secondary {
        Sharing::Exclusive
    } else {
        sharing.clone()
    };
    let grant = index.allocate_from(owner, &candidates, slot.family, &take)?;
    Ok((grant.ip, Source::Allocated))
}

/// The pool an address of `slot` is credited to (what its claim records as its `pool`, and
/// messages name): pools may overlap, and then the address lies in several. The pool the
/// Service selected (`loxilb.io/poolSelect`) when it holds the address; else the first
/// pool, in preference order, the Service may take addresses from automatically; else the
/// first pool holding it. `None` outside every pool.
pub fn credited_pool<'p>(
    slot: &AddressSlot,
    pools: &'p PoolSet,
    who: &Requester<'_>,
    ip: &IpAddr,
) -> Option<&'p str> {
    let holds = |name: &str| pools.get(name).is_some_and(|d| d.pool.contains(ip));
    if let Some(selected) = slot.pool.as_deref()
        && let Some(def) = pools.get(selected)
        && def.pool.contains(ip)
    {
        return Some(def.name());
    }
    let family = Family::of(ip);
    if let Ok(names) = pools.candidates(None, who, family)
        && let Some(name) = names.into_iter().find(|n| holds(n))
    {
        return pools.get(name).map(|d| d.name());
    }
    pools
        .defs
        .iter()
        .find(|d| d.pool.contains(ip))
        .map(|d| d.name())
}

/// The pool `loxilb.io/poolSelect` names when the address the Service keeps for `slot` lies
/// outside it (the selection was added or changed after the address was taken): a Service
/// keeps the address it has, and the selected pool applies only once that address is
/// released. `None` when nothing is selected, or the selected pool holds the address.
pub fn kept_outside_selection<'a>(
    slot: &'a AddressSlot,
    pools: &PoolSet,
    ip: &IpAddr,
) -> Option<&'a str> {
    let selected = slot.pool.as_deref()?;
    if slot.requested.is_some() {
        return None; // an address asked for by name: the selection does not apply to it
    }
    let inside = pools.get(selected).is_some_and(|d| d.pool.contains(ip));
    (!inside).then_some(selected)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::ipam::{AddressBlock, Pool, PortProto};
    use crate::model::Protocol;
    use crate::pools::merge_pools;

    fn pools(cidr: &str) -> PoolSet {
        let block = AddressBlock::parse(cidr, true).unwrap();
        merge_pools(&[Pool::new("default", vec![block])], &[], Vec::new())
    }

    fn ports(list: &[u16]) -> Sharing {
        Sharing::Ports {
            ports: list
                .iter()
                .map(|p| PortProto::new(*p, Protocol::Tcp))
                .collect(),
            key: None,
            group: None,
        }
    }

    fn slot(requested: Option<&str>) -> AddressSlot {
        AddressSlot {
            family: Family::V4,
            pool: None,
            requested: requested.map(|r| r.parse().unwrap()),
        }
    }

    struct Case<'a> {
        slot: AddressSlot,
        sharing: Sharing,
        unique: bool,
        role: Role,
        published: Vec<IpAddr>,
        owner: &'a str,
    }

    impl Case<'_> {
        fn new(owner: &str) -> Case<'_> {
            Case {
                slot: slot(None),
                sharing: ports(&[80]),
                unique: false,
                role: Role::Vip,
                published: Vec::new(),
                owner,
            }
        }

        fn choose(
            &self,
            set: &PoolSet,
            index: &mut Allocator,
        ) -> Result<(IpAddr, Source), AllocError> {
            let labels = BTreeMap::new();
            let who = Requester {
                namespace_labels: &labels,
                service_labels: &labels,
            };
            choose_address(
                &Choice {
                    slot: &self.slot,
                    pools: set,
                    who: &who,
                    owner: self.owner,
                    sharing: &self.sharing,
                    unique: self.unique,
                    role: self.role,
                    taken: &[],
                    published: &self.published,
                },
                index,
            )
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_free_address_is_allocated_and_recorded() {
        let set = pools("10.0.0.0/30");
        let mut index = Allocator::new(set.pools());
        let (got, source) = Case::new("ns/a").choose(&set, &mut index).unwrap();
        assert_eq!((got, source), (ip("10.0.0.1"), Source::Allocated));
        assert!(index.holds(&got, "ns/a"));
    }

    #[test]
    fn an_indexed_address_wins_over_a_published_one() {
        let set = pools("10.0.0.0/29");
        let mut index = Allocator::new(set.pools());
        index.assign(ip("10.0.0.3"), "ns/a").unwrap();
        let mut case = Case::new("ns/a");
        case.published = vec![ip("10.0.0.5")];
        assert_eq!(
            case.choose(&set, &mut index).unwrap(),
            (ip("10.0.0.3"), Source::Indexed)
        );
    }

    #[test]
    fn a_published_address_is_adopted_before_a_free_one() {
        let set = pools("10.0.0.0/29");
        let mut index = Allocator::new(set.pools());
        let mut case = Case::new("ns/a");
        case.published = vec![ip("10.0.0.5")];
        assert_eq!(
            case.choose(&set, &mut index).unwrap(),
            (ip("10.0.0.5"), Source::Published)
        );
    }

    #[test]
    fn unique_mode_adopts_no_address_someone_else_holds() {
        let set = pools("10.0.0.0/29");
        let mut index = Allocator::new(set.pools());
        index
            .assign_shared(ip("10.0.0.5"), "ns/other", ports(&[443]))
            .unwrap();
        let mut case = Case::new("ns/a");
        case.published = vec![ip("10.0.0.5")];
        case.unique = true;
        let (got, source) = case.choose(&set, &mut index).unwrap();
        assert_ne!(got, ip("10.0.0.5"));
        assert_eq!(source, Source::Allocated);
    }

    #[test]
    fn a_requested_address_held_by_another_is_taken_for_a_secondary() {
        let set = pools("10.0.0.0/29");
        let mut index = Allocator::new(set.pools());
        index.assign(ip("10.0.0.2"), "ns/other").unwrap();
        let mut case = Case::new("ns/a#secondary");
        case.slot = slot(Some("10.0.0.2"));
        case.role = Role::Secondary;
        assert!(matches!(
            case.choose(&set, &mut index),
            Err(AllocError::Taken { owner, .. }) if owner == "ns/other"
        ));
    }

    #[test]
    fn a_requested_address_is_recorded_with_its_source() {
        let set = pools("10.0.0.0/29");
        let mut index = Allocator::new(set.pools());
        let mut case = Case::new("ns/a");
        case.slot = slot(Some("10.0.0.4"));
        assert_eq!(
            case.choose(&set, &mut index).unwrap(),
            (ip("10.0.0.4"), Source::Requested)
        );
        // Chosen again: it is now the Service's own.
        assert_eq!(
            case.choose(&set, &mut index).unwrap(),
            (ip("10.0.0.4"), Source::Indexed)
        );
    }

    fn two_pools(outer: &str, inner: &str) -> PoolSet {
        let p = |name: &str, cidr: &str| {
            Pool::new(name, vec![AddressBlock::parse(cidr, true).unwrap()])
        };
        merge_pools(&[p("outer", outer), p("inner", inner)], &[], Vec::new())
    }

    /// Overlapping pools: an address in both is credited to the pool the Service selected,
    /// not merely to the first one holding it.
    #[test]
    fn an_address_in_two_pools_is_credited_to_the_selected_one() {
        let set = two_pools("10.0.0.0/24", "10.0.0.128/25");
        let labels = BTreeMap::new();
        let who = Requester {
            namespace_labels: &labels,
            service_labels: &labels,
        };
        let mut index = Allocator::new(set.pools());
        let mut case = Case::new("ns/a");
        case.slot.pool = Some("inner".into());
        let (got, _) = case.choose(&set, &mut index).unwrap();
        assert_eq!(got, ip("10.0.0.129"));
        assert_eq!(
            index.pool_containing(&got),
            "outer",
            "the first pool holding it"
        );
        assert_eq!(credited_pool(&case.slot, &set, &who, &got), Some("inner"));
        // Without a selection: the first pool it may take addresses from.
        let plain = slot(None);
        assert_eq!(credited_pool(&plain, &set, &who, &got), Some("outer"));
        assert_eq!(
            credited_pool(&plain, &set, &who, &ip("10.0.0.5")),
            Some("outer")
        );
        // A selected pool that does not hold the address is not credited.
        assert_eq!(
            credited_pool(&case.slot, &set, &who, &ip("10.0.0.5")),
            Some("outer")
        );
        assert_eq!(credited_pool(&plain, &set, &who, &ip("192.0.2.1")), None);
    }

    /// `poolSelect` added to a Service that keeps an address from another pool.
    #[test]
    fn a_kept_address_outside_the_selected_pool_is_told() {
        let set = two_pools("10.0.0.0/25", "10.0.1.0/24");
        let mut selected = slot(None);
        selected.pool = Some("inner".into());
        assert_eq!(
            kept_outside_selection(&selected, &set, &ip("10.0.0.5")),
            Some("inner")
        );
        assert_eq!(
            kept_outside_selection(&selected, &set, &ip("10.0.1.5")),
            None
        );
        assert_eq!(
            kept_outside_selection(&slot(None), &set, &ip("10.0.0.5")),
            None
        );
        // A pool that does not exist (any more) holds nothing.
        selected.pool = Some("gone".into());
        assert_eq!(
            kept_outside_selection(&selected, &set, &ip("10.0.0.5")),
            Some("gone")
        );
    }

    #[test]
    fn an_exhausted_pool_is_an_error_naming_it() {
        let set = pools("10.0.0.0/30");
        let mut index = Allocator::new(set.pools());
        index.assign(ip("10.0.0.1"), "ns/x").unwrap();
        index.assign(ip("10.0.0.2"), "ns/y").unwrap();
        let mut case = Case::new("ns/a");
        case.unique = true;
        assert!(matches!(
            case.choose(&set, &mut index),
            Err(AllocError::Exhausted { .. })
        ));
        assert!(Source::Requested.is_specific() && !Source::Allocated.is_specific());
    }
}
