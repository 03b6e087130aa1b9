//! Property tests of the allocator and of the claim protocol built on it: random sequences of
//! create, delete, restart (rebuild from the durable record), pool edits and two replicas
//! racing never give one address to two owners, and a rebuild reproduces ownership exactly.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use loxi_domain::ipam::{AddressBlock, Family};
use loxi_domain::{AllocError, Allocator, Pool};
use proptest::prelude::*;

/// The API server's view: claims keyed by address; create fails when the name exists.
#[derive(Default, Debug)]
struct ClaimStore {
    claims: BTreeMap<IpAddr, String>,
}

impl ClaimStore {
    fn create(&mut self, ip: IpAddr, owner: &str) -> Result<(), String> {
        match self.claims.get(&ip) {
            Some(other) if other != owner => Err(other.clone()),
            _ => {
                self.claims.insert(ip, owner.to_string());
                Ok(())
            }
        }
    }
}

/// One controller replica: a local index, synced from the store only when it restarts or
/// when it loses a race (like the watch, but arbitrarily late).
struct Replica {
    index: Allocator,
    pools: Vec<Pool>,
}

impl Replica {
    fn new(pools: Vec<Pool>, store: &ClaimStore) -> Replica {
        let mut r = Replica {
            index: Allocator::new(pools.clone()),
            pools,
        };
        r.rebuild(store);
        r
    }

    fn rebuild(&mut self, store: &ClaimStore) {
        self.index = Allocator::new(self.pools.clone());
        for (ip, owner) in &store.claims {
            self.index
                .assign(*ip, owner)
                .expect("store has one owner per address");
        }
    }

    /// The controller's claim loop: pick locally, create the claim, on conflict mark the
    /// address as the other owner's and try again.
    fn claim(&mut self, owner: &str, store: &mut ClaimStore) -> Result<IpAddr, AllocError> {
        loop {
            let ip = self.index.allocate(owner, None, Family::V4)?;
            match store.create(ip, owner) {
                Ok(()) => return Ok(ip),
                Err(other) => {
                    self.index.release(&ip);
                    self.index.assign(ip, &other).unwrap();
                }
            }
        }
    }

    fn delete(&mut self, owner: &str, store: &mut ClaimStore) {
        for ip in self.index.release_owner(owner) {
            if store.claims.get(&ip).map(String::as_str) == Some(owner) {
                store.claims.remove(&ip);
            }
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Create { replica: usize, svc: u8 },
    Delete { replica: usize, svc: u8 },
    Restart { replica: usize },
    GrowPool,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..2usize, 0..40u8).prop_map(|(replica, svc)| Op::Create { replica, svc }),
        2 => (0..2usize, 0..40u8).prop_map(|(replica, svc)| Op::Delete { replica, svc }),
        1 => (0..2usize).prop_map(|replica| Op::Restart { replica }),
        1 => Just(Op::GrowPool),
    ]
}

fn pools(grown: bool) -> Vec<Pool> {
    // A pool far larger than a /24 plus a small one that runs out; growing adds a range.
    let mut blocks: Vec<AddressBlock> = vec!["10.0.0.0/30".parse().unwrap()];
    if grown {
        blocks.push("10.0.1.0-10.0.1.9".parse().unwrap());
    }
    vec![
        Pool::new("small", blocks),
        Pool::new("big", vec!["172.16.0.0/14".parse().unwrap()]),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn no_address_ever_has_two_owners(ops in prop::collection::vec(op(), 1..120)) {
        let mut store = ClaimStore::default();
        let mut grown = false;
        let mut replicas = [Replica::new(pools(grown), &store), Replica::new(pools(grown), &store)];
        let mut holds: HashMap<String, IpAddr> = HashMap::new();
        for op in ops {
            match op {
                Op::Create { replica, svc } => {
                    let owner = format!("ns/svc{svc}");
                    if let Some(ip) = store.claims.iter().find(|(_, o)| **o == owner).map(|(ip, _)| *ip) {
                        // Already holds one: the other replica's index may just not know yet.
                        holds.insert(owner, ip);
                        continue;
                    }
                    if let Ok(ip) = replicas[replica].claim(&owner, &mut store) {
                        holds.insert(owner, ip);
                    }
                }
                Op::Delete { replica, svc } => {
                    let owner = format!("ns/svc{svc}");
                    replicas[replica].rebuild(&store); // the deleting replica sees the claim
                    replicas[replica].delete(&owner, &mut store);
                    holds.remove(&owner);
                }
                Op::Restart { replica } => {
                    let before: BTreeMap<IpAddr, String> = store.claims.clone();
                    replicas[replica] = Replica::new(pools(grown), &store);
                    // The rebuilt index reproduces ownership exactly.
                    for (ip, owner) in &before {
                        prop_assert_eq!(replicas[replica].index.owner_of(ip), Some(owner.as_str()));
                    }
                    prop_assert_eq!(replicas[replica].index.used(), before.len());
                }
                Op::GrowPool => {
                    grown = true;
                    for r in replicas.iter_mut() {
                        r.pools = pools(true);
                        r.rebuild(&store);
                    }
                }
            }
            // Invariants after every step.
            let mut seen: HashMap<&String, usize> = HashMap::new();
            for owner in store.claims.values() {
                *seen.entry(owner).or_default() += 1;
            }
            prop_assert!(seen.values().all(|n| *n == 1), "an owner holds two addresses: {:?}", store.claims);
            for (owner, ip) in &holds {
                prop_assert_eq!(store.claims.get(ip), Some(owner), "held address lost or changed owner");
            }
        }
    }

    #[test]
    fn free_space_accounting_is_exact(takes in prop::collection::vec(any::<bool>(), 1..300)) {
        // Allocate/release randomly in a /23: used() always equals the live set, and every
        // allocation returns an address inside the pool not currently owned.
        let mut a = Allocator::new(vec![Pool::new("p", vec!["192.168.0.0/23".parse().unwrap()])]);
        let mut live: Vec<IpAddr> = Vec::new();
        for (i, take) in takes.into_iter().enumerate() {
            if take || live.is_empty() {
                match a.allocate(&format!("o{i}"), None, Family::V4) {
                    Ok(ip) => {
                        prop_assert!(!live.contains(&ip));
                        prop_assert!(a.pools().next().unwrap().contains(&ip));
                        live.push(ip);
                    }
                    Err(AllocError::Exhausted { .. }) => prop_assert_eq!(live.len(), 510),
                    Err(e) => prop_assert!(false, "{e}"),
                }
            } else {
                let ip = live.swap_remove(i % live.len());
                a.release(&ip);
            }
            prop_assert_eq!(a.used(), live.len());
        }
    }
}
