//! Choosing at most `limit` backends out of many, stably.
//!
//! loxilb keeps at most 32 endpoints per rule. With more candidates, every Service picks its
//! subset by rendezvous (highest-random-weight) hashing on (service identity, endpoint): each
//! Service gets its own spread across nodes, and when one candidate joins or leaves, at most
//! one member of any subset changes.

use std::net::IpAddr;

/// FNV-1a, 64 bit: tiny, stable across Rust versions and platforms (unlike `DefaultHasher`),
/// which matters because every replica and every restart must pick the same subset.
pub(crate) fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in *part {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // Separator so ("ab","c") and ("a","bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // Final avalanche (from splitmix64) so nearby inputs spread over the whole range.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

fn ip_octets(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

/// Rendezvous selection over any candidates, scored by `fnv1a(key, bytes(candidate))`.
fn rendezvous<T: Ord + Copy>(
    key: &str,
    candidates: &[T],
    limit: usize,
    bytes: impl Fn(&T) -> Vec<u8>,
) -> Vec<T> {
    let mut scored: Vec<(u64, T)> = candidates
        .iter()
        .map(|c| (fnv1a(&[key.as_bytes(), &bytes(c)]), *c))
        .collect();
    scored.sort_unstable_by(|a, b| b.cmp(a));
    let mut chosen: Vec<T> = scored.into_iter().take(limit).map(|(_, c)| c).collect();
    chosen.sort();
    chosen
}

/// Returns at most `limit` of `candidates`, chosen by rendezvous hashing on `key`, sorted.
pub fn stable_subset(key: &str, candidates: &[IpAddr], limit: usize) -> Vec<IpAddr> {
    rendezvous(key, candidates, limit, ip_octets)
}

/// Like [`stable_subset`] for (address, target port) candidates, as pod endpoints are: the
/// same pod address can serve on different ports, and different pods may resolve a named
/// target port differently.
pub fn stable_subset_endpoints(
    key: &str,
    candidates: &[(IpAddr, u16)],
    limit: usize,
) -> Vec<(IpAddr, u16)> {
    rendezvous(key, candidates, limit, |(ip, port)| {
        let mut b = ip_octets(ip);
        b.extend_from_slice(&port.to_be_bytes());
        b
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::net::Ipv4Addr;

    fn nodes(n: u32) -> Vec<IpAddr> {
        (0..n)
            .map(|i| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)))
            .collect()
    }

    #[test]
    fn small_sets_are_kept_whole() {
        let c = nodes(5);
        assert_eq!(stable_subset("ns/a", &c, 32), c);
    }

    #[test]
    fn one_node_leaving_moves_at_most_one_member() {
        let all = nodes(100);
        let before: BTreeSet<_> = stable_subset("ns/a", &all, 32).into_iter().collect();
        let removed = *before.iter().next().unwrap();
        let rest: Vec<_> = all.iter().copied().filter(|ip| *ip != removed).collect();
        let after: BTreeSet<_> = stable_subset("ns/a", &rest, 32).into_iter().collect();
        assert_eq!(after.len(), 32);
        assert_eq!(before.difference(&after).count(), 1);
    }

    #[test]
    fn endpoint_subsets_are_stable_and_bounded() {
        let all: Vec<(IpAddr, u16)> = nodes(80).into_iter().map(|ip| (ip, 8080)).collect();
        let a = stable_subset_endpoints("ns/a", &all, 32);
        assert_eq!(a.len(), 32);
        assert!(a.windows(2).all(|w| w[0] < w[1]));
        let mut shuffled = all.clone();
        shuffled.reverse();
        assert_eq!(stable_subset_endpoints("ns/a", &shuffled, 32), a);
        assert_ne!(stable_subset_endpoints("ns/b", &all, 32), a);
        assert_eq!(
            stable_subset_endpoints("ns/a", &all[..5], 32),
            all[..5].to_vec()
        );
    }

    #[test]
    fn services_spread_over_nodes() {
        let all = nodes(64);
        let mut hits = vec![0u32; 64];
        for s in 0..200 {
            for ip in stable_subset(&format!("ns/svc{s}"), &all, 32) {
                let IpAddr::V4(v4) = ip else { unreachable!() };
                hits[(u32::from(v4) - 0x0a00_0000) as usize] += 1;
            }
        }
        // Expected 100 per node; a fair spread stays well within 50%..150%.
        assert!(hits.iter().all(|h| (50..=150).contains(h)), "{hits:?}");
    }
}
