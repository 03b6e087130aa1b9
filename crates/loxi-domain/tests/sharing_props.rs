//! Property tests of shared addresses: random sequences of Services joining and leaving
//! addresses (two replicas with lagging indexes, restarts, pool edits) never put two owners
//! on the same address, port and protocol, never move an owner, and a rebuild from the
//! durable record reproduces ownership exactly.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use loxi_domain::ipam::{Family, PortProto, Sharing};
use loxi_domain::model::Protocol;
use loxi_domain::{AllocError, Allocator, Pool};
use proptest::prelude::*;

/// The API server's view: one claim per address listing its owners. Joining is a
/// compare-and-swap on the claim (the controller's update with the observed resourceVersion),
/// modelled by re-checking compatibility against what is stored now.
#[derive(Default, Debug)]
struct ClaimStore {
    claims: BTreeMap<IpAddr, Vec<(String, Sharing)>>,
}

impl ClaimStore {
    fn claim(
        &mut self,
        ip: IpAddr,
        owner: &str,
        sharing: &Sharing,
    ) -> Result<(), Vec<(String, Sharing)>> {
        let Some(list) = self.claims.get_mut(&ip) else {
            self.claims
                .insert(ip, vec![(owner.to_string(), sharing.clone())]);
            return Ok(());
        };
        if list
            .iter()
            .any(|(o, s)| o != owner && !s.compatible(sharing))
        {
            return Err(list.clone());
        }
        match list.iter_mut().find(|(o, _)| o == owner) {
            Some(entry) => entry.1 = sharing.clone(),
            None => list.push((owner.to_string(), sharing.clone())),
        }
        Ok(())
    }

    fn leave(&mut self, ip: &IpAddr, owner: &str) {
        if let Some(list) = self.claims.get_mut(ip) {
            list.retain(|(o, _)| o != owner);
            if list.is_empty() {
                self.claims.remove(ip);
            }
        }
    }

    fn address_of(&self, owner: &str) -> Option<IpAddr> {
        self.claims
            .iter()
            .find(|(_, l)| l.iter().any(|(o, _)| o == owner))
            .map(|(ip, _)| *ip)
    }
}

struct Replica {
    index: Allocator,
}

impl Replica {
    fn new(pools: Vec<Pool>, store: &ClaimStore) -> Replica {
        let mut index = Allocator::new(pools);
        for (ip, list) in &store.claims {
            for (owner, sharing) in list {
                index
                    .assign_shared(*ip, owner, sharing.clone())
                    .expect("the store never holds two incompatible owners");
            }
        }
        Replica { index }
    }

    /// The controller's claim loop: pick locally (first fit), claim in the store; when the
    /// store disagrees, learn the address's real owners and try again.
    fn claim(
        &mut self,
        owner: &str,
        sharing: &Sharing,
        store: &mut ClaimStore,
    ) -> Result<IpAddr, AllocError> {
        for _ in 0..64 {
            let grant = self
                .index
                .allocate_from(owner, &["p"], Family::V4, sharing)?;
            match store.claim(grant.ip, owner, sharing) {
                Ok(()) => return Ok(grant.ip),
                Err(owners) => {
                    self.index.release(&grant.ip);
                    for (o, s) in owners {
                        self.index.assign_shared(grant.ip, &o, s).unwrap();
                    }
                }
            }
        }
        panic!("claim loop did not settle");
    }

    fn delete(&mut self, owner: &str, store: &mut ClaimStore) {
        for ip in self.index.release_owner(owner) {
            store.leave(&ip, owner);
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Create {
        replica: usize,
        svc: u8,
        ports: BTreeSet<(u16, bool)>,
        key: Option<u8>,
    },
    Delete {
        replica: usize,
        svc: u8,
    },
    Restart {
        replica: usize,
    },
    EditPool {
        grown: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let ports = prop::collection::btree_set(
        (prop::sample::select(vec![53u16, 80, 443]), any::<bool>()),
        0..3,
    );
    prop_oneof![
        5 => (0..2usize, 0..24u8, ports, prop::option::weighted(0.3, 0..4u8))
            .prop_map(|(replica, svc, ports, key)| Op::Create { replica, svc, ports, key }),
        3 => (0..2usize, 0..24u8).prop_map(|(replica, svc)| Op::Delete { replica, svc }),
        1 => (0..2usize).prop_map(|replica| Op::Restart { replica }),
        1 => any::<bool>().prop_map(|grown| Op::EditPool { grown }),
    ]
}

fn pools(grown: bool) -> Vec<Pool> {
    // Small, so that Services pile up on shared addresses and the pool runs out; an edit
    // shrinks it below addresses in use.
    let block = if grown {
        "10.0.0.1-10.0.0.8"
    } else {
        "10.0.0.3-10.0.0.5"
    };
    vec![Pool::new("p", vec![block.parse().unwrap()])]
}

/// Keys 2 and above also put the Service in another group of loxilbs (g0 or g1), so that
/// groups and keys mix.
fn sharing(ports: &BTreeSet<(u16, bool)>, key: Option<u8>) -> Sharing {
    Sharing::Ports {
        key: key.map(|k| format!("key{k}")),
        group: key.filter(|k| *k >= 2).map(|k| format!("g{}", k % 2)),
        ports: ports
            .iter()
            .map(|(p, udp)| PortProto::new(*p, if *udp { Protocol::Udp } else { Protocol::Tcp }))
            .collect(),
    }
}

fn ownership(a: &Allocator) -> BTreeSet<(IpAddr, String, String)> {
    a.entries()
        .map(|(ip, o, s)| (ip, o.to_string(), format!("{s:?}")))
        .collect()
}

fn store_ownership(store: &ClaimStore) -> BTreeSet<(IpAddr, String, String)> {
    store
        .claims
        .iter()
        .flat_map(|(ip, l)| {
            l.iter()
                .map(move |(o, s)| (*ip, o.clone(), format!("{s:?}")))
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn sharers_never_collide_and_rebuild_reproduces_ownership(ops in prop::collection::vec(op(), 1..150)) {
        let mut store = ClaimStore::default();
        let mut grown = true;
        let mut replicas = [Replica::new(pools(grown), &store), Replica::new(pools(grown), &store)];
        let mut holds: HashMap<String, IpAddr> = HashMap::new();
        for op in ops {
            match op {
                Op::Create { replica, svc, ports, key } => {
                    let owner = format!("ns/svc{svc}");
                    if let Some(ip) = store.address_of(&owner) {
                        holds.insert(owner, ip);
                        continue;
                    }
                    match replicas[replica].claim(&owner, &sharing(&ports, key), &mut store) {
                        Ok(ip) => {
                            holds.insert(owner, ip);
                        }
                        Err(AllocError::Exhausted { .. }) => {}
                        Err(e) => prop_assert!(false, "{e}"),
                    }
                }
                Op::Delete { replica, svc } => {
                    let owner = format!("ns/svc{svc}");
                    replicas[replica] = Replica::new(pools(grown), &store);
                    replicas[replica].delete(&owner, &mut store);
                    holds.remove(&owner);
                }
                Op::Restart { replica } => {
                    replicas[replica] = Replica::new(pools(grown), &store);
                    prop_assert_eq!(ownership(&replicas[replica].index), store_ownership(&store));
                    prop_assert_eq!(replicas[replica].index.used(), store.claims.len());
                }
                Op::EditPool { grown: g } => {
                    grown = g;
                    for r in replicas.iter_mut() {
                        let before = ownership(&r.index);
                        r.index = r.index.with_pools(pools(grown));
                        prop_assert_eq!(ownership(&r.index), before, "a pool edit moved an owner");
                    }
                }
            }
            // No two owners of one address on the same port and protocol, and no keyed
            // Service next to a Service with another key.
            for (ip, list) in &store.claims {
                let mut seen: BTreeSet<PortProto> = BTreeSet::new();
                for (i, (o, s)) in list.iter().enumerate() {
                    match s {
                        Sharing::Ports { key, ports, group } => {
                            for p in ports {
                                prop_assert!(seen.insert(*p), "{p} twice on {ip}: {list:?}");
                            }
                            let (_, first) = &list[0];
                            prop_assert_eq!(first.key(), key.as_deref(), "keys differ on {}", ip);
                            prop_assert_eq!(first.group(), group.as_deref(), "groups differ on {}", ip);
                        }
                        Sharing::Exclusive => prop_assert!(list.len() == 1 && i == 0, "{o} not alone"),
                    }
                }
            }
            // Nobody moved; the index of each replica agrees with itself.
            for (owner, ip) in &holds {
                prop_assert_eq!(store.address_of(owner), Some(*ip), "{} moved", owner);
            }
            for r in &replicas {
                for (ip, owner, _) in r.index.entries() {
                    prop_assert!(r.index.addresses_of(owner).contains(&ip));
                }
                let pool = "p";
                prop_assert_eq!(
                    r.index.free_in(pool, Family::V4) + r.index.used_in(pool) as u128,
                    r.index.total_in(pool, Family::V4)
                );
            }
        }
    }
}
