//! Every IPv4 and IPv6 address has a valid object name that reads back to it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use loxi_domain::address_name::{address_from_object_name, address_object_name, is_object_name};
use proptest::prelude::*;

/// IPv6 addresses of every shape: random groups with runs of zeros at the start, in the
/// middle and at the end, and the v4-mapped and v4-compatible forms.
fn v6() -> impl Strategy<Value = Ipv6Addr> {
    (
        prop::array::uniform8(prop_oneof![Just(0u16), any::<u16>()]),
        0usize..9,
        0usize..9,
    )
        .prop_map(|(mut groups, a, b)| {
            let (from, to) = (a.min(b), a.max(b));
            for g in &mut groups[from..to] {
                *g = 0;
            }
            Ipv6Addr::from(groups)
        })
}

fn any_ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<u32>().prop_map(|n| IpAddr::V4(Ipv4Addr::from(n))),
        v6().prop_map(IpAddr::V6),
        any::<u32>().prop_map(|n| IpAddr::V6(Ipv4Addr::from(n).to_ipv6_mapped())),
        any::<u32>().prop_map(|n| IpAddr::V6(Ipv4Addr::from(n).to_ipv6_compatible())),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn every_address_has_a_valid_name_that_reads_back(ip in any_ip()) {
        let name = address_object_name(&ip);
        prop_assert!(is_object_name(&name), "{ip} -> {name:?}");
        prop_assert_eq!(address_from_object_name(&name), Some(ip));
    }

    #[test]
    fn two_addresses_never_share_a_name(a in any_ip(), b in any_ip()) {
        prop_assume!(a != b);
        prop_assert_ne!(address_object_name(&a), address_object_name(&b));
    }
}
