//! The allocator reports a pool exhausted only when it has no address the Service may use:
//! none free, and none whose owners all accept the Service's sharing. Reservations (owners
//! that are `Exclusive`, as every reservation is) are never offered for sharing.

use std::collections::BTreeSet;
use std::net::IpAddr;

use loxi_domain::ipam::{Family, PortProto, Sharing};
use loxi_domain::model::Protocol;
use loxi_domain::{AllocError, Allocator, Pool};
use proptest::prelude::*;

/// An owner's way of holding an address: exclusive (a reservation, unique mode), or ports
/// 80..=83 under sharing key "a" or "b".
fn sharing() -> impl Strategy<Value = Sharing> {
    prop_oneof![
        Just(Sharing::Exclusive),
        (
            prop::bool::ANY,
            prop::collection::btree_set(80u16..84, 1..3)
        )
            .prop_map(|(b, ports)| {
                Sharing::Ports {
                    key: b.then(|| "b".to_string()),
                    ports: ports
                        .into_iter()
                        .map(|p| PortProto::new(p, Protocol::Tcp))
                        .collect::<BTreeSet<_>>(),
                    group: None,
                }
            }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn exhausted_only_when_nothing_is_usable(
        // A /29: six usable addresses, each held by up to two owners or free.
        holders in prop::collection::vec(prop::collection::vec(sharing(), 0..3), 6),
        wanted in sharing(),
    ) {
        let pool = Pool::new("p", vec!["192.0.2.0/29".parse().unwrap()]);
        let mut index = Allocator::new(vec![pool]);
        let mut held: Vec<(IpAddr, Vec<Sharing>)> = Vec::new();
        for (i, owners) in holders.iter().enumerate() {
            let ip: IpAddr = format!("192.0.2.{}", i + 1).parse().unwrap();
            let mut kept = Vec::new();
            for (j, s) in owners.iter().enumerate() {
                if index.assign_shared(ip, &format!("o{i}-{j}"), s.clone()).is_ok() {
                    kept.push(s.clone());
                }
            }
            held.push((ip, kept));
        }
        let usable = held
            .iter()
            .any(|(_, owners)| owners.iter().all(|o| o.compatible(&wanted)));
        match index.allocate_from("newcomer", &["p"], Family::V4, &wanted) {
            Ok(grant) => {
                let (_, owners) = held.iter().find(|(ip, _)| *ip == grant.ip).unwrap();
                prop_assert!(owners.iter().all(|o| o.compatible(&wanted)));
                prop_assert!(owners.iter().all(|o| *o != Sharing::Exclusive));
            }
            Err(AllocError::Exhausted { .. }) => {
                prop_assert!(!usable, "exhausted with a usable address: {held:?}");
            }
            Err(e) => prop_assert!(false, "unexpected {e}"),
        }
    }
}
