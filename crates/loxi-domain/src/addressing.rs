//! What addresses a Service asks for: how many (one per IP family), from which pool, and
//! whether a specific address is requested. kube-loxilb's annotations plus the standard
//! `spec.ipFamilies` / `spec.ipFamilyPolicy` and `spec.loadBalancerIP`.

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::intent::AnnotationError;
use crate::ipam::Family;

pub const ANN_POOL_SELECT: &str = "loxilb.io/poolSelect";
pub const ANN_IPAM: &str = "loxilb.io/ipam";
pub const ANN_STATIC_IP: &str = "loxilb.io/staticIP";
/// SCTP multi-homing: the secondary addresses themselves (comma-separated). Wins over the two
/// below, as in kube-loxilb.
pub const ANN_SECONDARY_IPS: &str = "loxilb.io/secondaryIPs";
/// SCTP multi-homing: how many secondary addresses to allocate, the i-th from the i-th
/// secondary pool (`--external-secondary-cidrs`, named `secondary0`, `secondary1`, ...).
pub const ANN_NUM_SECONDARY: &str = "loxilb.io/num-secondary-networks";
/// SCTP multi-homing: the pools to take the secondary addresses from, one address each.
pub const ANN_POOL_SELECT_SECONDARY: &str = "loxilb.io/poolSelectSecondary";
/// Name prefix of the secondary pools from the command line.
pub const SECONDARY_POOL_PREFIX: &str = "secondary";
/// loxilb's limit of secondary addresses per rule (docs/loxilb-api.md#limits).
pub const MAX_SECONDARY: usize = 3;

/// Keep a deleted Service's address for a while (e.g. `24h`), so that re-creating the
/// Service gets the same address.
pub const ANN_RETAIN: &str = "loxilb.io/retain-address";

/// What a `loxilb.io/retain-address` that does not parse means (`docs/annotations.md`).
pub const RETAIN_IGNORED: &str =
    "at deletion the address is retained as its pool's retainAddresses says (default: released)";

/// How long a deleted Service's addresses are kept for it (`loxilb.io/retain-address`):
/// `Ok(None)` when absent or empty (kube-loxilb's rule: the pool's setting applies), zero to
/// release at once. A value that is not a duration is an error to report; it never stops the
/// Service from being served, and at deletion it counts as absent.
pub fn retention(
    annotations: Option<&BTreeMap<String, String>>,
) -> Result<Option<std::time::Duration>, AnnotationError> {
    let Some(raw) = annotations
        .and_then(|a| a.get(ANN_RETAIN))
        .filter(|v| !v.trim().is_empty())
    else {
        return Ok(None);
    };
    crate::duration::parse_duration(raw).map(Some).map_err(|_| {
        crate::intent::invalid(
            ANN_RETAIN,
            raw,
            "expected a duration such as 30m, 24h or 3600",
        )
    })
}

/// The pool a Service names (`loxilb.io/poolSelect`), if any: the one place it is read.
pub fn selected_pool(annotations: Option<&BTreeMap<String, String>>) -> Option<&str> {
    annotations
        .and_then(|a| a.get(ANN_POOL_SELECT))
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
}

/// The name of the `i`-th secondary pool from the command line.
pub fn secondary_pool_name(i: usize) -> String {
    format!("{SECONDARY_POOL_PREFIX}{i}")
}

/// One address the Service needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressSlot {
    pub family: Family,
    /// `loxilb.io/poolSelect`; `None`: the first pool (by priority) with room.
    pub pool: Option<String>,
    /// `loxilb.io/staticIP` or `spec.loadBalancerIP` of this family (may lie outside every
    /// pool: it is still claimed, so nobody else gets it).
    pub requested: Option<IpAddr>,
}

/// The address-related parts of a Service.
#[derive(Debug, Clone, Default)]
pub struct AddressInput<'a> {
    pub annotations: Option<&'a BTreeMap<String, String>>,
    /// `spec.ipFamilies` (`IPv4`, `IPv6`), in order.
    pub ip_families: &'a [String],
    /// `spec.ipFamilyPolicy`: `SingleStack`, `PreferDualStack`, `RequireDualStack`.
    pub ip_family_policy: Option<&'a str>,
    /// `spec.loadBalancerIP` (deprecated upstream, still honoured).
    pub load_balancer_ip: Option<&'a str>,
}

fn bad(annotation: &'static str, value: &str, reason: &str) -> AnnotationError {
    AnnotationError {
        annotation,
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

fn family_named(s: &str) -> Option<Family> {
    match s {
        "IPv4" => Some(Family::V4),
        "IPv6" => Some(Family::V6),
        _ => None,
    }
}

/// The addresses to hold, one per family, in the order they are shown in the status.
/// `has_pool(family)` says whether any pool serves that family (PreferDualStack only asks for
/// the second family when one does).
pub fn address_slots(
    input: &AddressInput<'_>,
    has_pool: impl Fn(Family) -> bool,
) -> Result<Vec<AddressSlot>, AnnotationError> {
    let get = |k: &str| {
        input
            .annotations
            .and_then(|a| a.get(k))
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    };
    // Each family once: the API server refuses a repeated family, but a Service read from
    // elsewhere (a test, a future API) must not make two slots of one family.
    let mut spec_families: Vec<Family> = Vec::new();
    for f in input.ip_families.iter().filter_map(|f| family_named(f)) {
        if !spec_families.contains(&f) {
            spec_families.push(f);
        }
    }
    let families: Vec<Family> = match get(ANN_IPAM) {
        Some("ipv4") => vec![Family::V4],
        // ipv6to4: an IPv6 VIP in front of IPv4 endpoints (loxilb allows that direction).
        Some("ipv6") | Some("ipv6to4") => vec![Family::V6],
        Some(other) => return Err(bad(ANN_IPAM, other, "expected ipv4, ipv6 or ipv6to4")),
        None => {
            let mut both = spec_families.clone();
            for f in [Family::V4, Family::V6] {
                if !both.contains(&f) {
                    both.push(f);
                }
            }
            match input.ip_family_policy {
                Some("RequireDualStack") => both,
                Some("PreferDualStack") => {
                    let mut fams: Vec<Family> =
                        both.iter().copied().filter(|f| has_pool(*f)).collect();
                    if fams.is_empty() {
                        fams.push(both[0]);
                    }
                    fams
                }
                _ => vec![spec_families.first().copied().unwrap_or(Family::V4)],
            }
        }
    };
    let pool = selected_pool(input.annotations).map(str::to_string);

    let mut requested: Vec<(IpAddr, &'static str, String)> = Vec::new();
    if let Some(list) = get(ANN_STATIC_IP) {
        for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let ip: IpAddr = part.parse().map_err(|_| {
                bad(
                    ANN_STATIC_IP,
                    list,
                    &format!("{} is not an IP address", crate::text::entry_of(list, part)),
                )
            })?;
            requested.push((ip, ANN_STATIC_IP, list.to_string()));
        }
    } else if let Some(lb_ip) = input
        .load_balancer_ip
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let ip: IpAddr = lb_ip
            .parse()
            .map_err(|_| bad("spec.loadBalancerIP", lb_ip, "not an IP address"))?;
        requested.push((ip, "spec.loadBalancerIP", lb_ip.to_string()));
    }
    let mut slots: Vec<AddressSlot> = families
        .iter()
        .map(|f| AddressSlot {
            family: *f,
            pool: pool.clone(),
            requested: None,
        })
        .collect();
    for (ip, source, text) in requested {
        let family = Family::of(&ip);
        match slots.iter_mut().find(|s| s.family == family) {
            Some(slot) if slot.requested.is_none() => slot.requested = Some(ip),
            Some(_) => return Err(bad(source, &text, "two addresses of one family")),
            None => {
                return Err(bad(
                    source,
                    &text,
                    &format!(
                        "{family} address, but the Service asks for {}",
                        families
                            .iter()
                            .map(Family::to_string)
                            .collect::<Vec<_>>()
                            .join(" and ")
                    ),
                ));
            }
        }
    }
    Ok(slots)
}

/// The secondary addresses (SCTP multi-homing) a Service asks for, all of `family` (the
/// family of its first VIP), in order: `loxilb.io/secondaryIPs` (specific addresses; the
/// other two annotations are then ignored, as in kube-loxilb), else one address from each
/// pool of `loxilb.io/poolSelectSecondary`, else `loxilb.io/num-secondary-networks`
/// addresses, the i-th from secondary pool i. At most [`MAX_SECONDARY`].
pub fn secondary_slots(
    annotations: Option<&BTreeMap<String, String>>,
    family: Family,
) -> Result<Vec<AddressSlot>, AnnotationError> {
    let get = |k: &str| {
        annotations
            .and_then(|a| a.get(k))
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    };
    let too_many = |annotation: &'static str, value: &str| {
        bad(
            annotation,
            value,
            &format!("at most {MAX_SECONDARY} secondary addresses (loxilb's limit per rule)"),
        )
    };
    if let Some(text) = get(ANN_SECONDARY_IPS) {
        let mut slots: Vec<AddressSlot> = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let ip: IpAddr = part.parse().map_err(|_| {
                bad(
                    ANN_SECONDARY_IPS,
                    text,
                    &format!("{} is not an IP address", crate::text::entry_of(text, part)),
                )
            })?;
            if Family::of(&ip) != family {
                return Err(bad(
                    ANN_SECONDARY_IPS,
                    text,
                    &format!("{ip} is not an {family} address like the Service's VIP"),
                ));
            }
            if slots.iter().any(|s| s.requested == Some(ip)) {
                return Err(bad(
                    ANN_SECONDARY_IPS,
                    text,
                    &format!("{ip} is listed twice"),
                ));
            }
            slots.push(AddressSlot {
                family,
                pool: None,
                requested: Some(ip),
            });
        }
        if slots.len() > MAX_SECONDARY {
            return Err(too_many(ANN_SECONDARY_IPS, text));
        }
        return Ok(slots);
    }
    let count = match get(ANN_NUM_SECONDARY) {
        None => None,
        Some(v) => match v.parse::<usize>() {
            Ok(n) if n <= MAX_SECONDARY => Some(n),
            _ => {
                return Err(bad(
                    ANN_NUM_SECONDARY,
                    v,
                    &format!("expected a whole number from 0 to {MAX_SECONDARY}"),
                ));
            }
        },
    };
    if let Some(text) = get(ANN_POOL_SELECT_SECONDARY) {
        let names: Vec<&str> = text.split(',').map(str::trim).collect();
        if names.iter().any(|n| n.is_empty()) {
            return Err(bad(ANN_POOL_SELECT_SECONDARY, text, "empty pool name"));
        }
        if names.len() > MAX_SECONDARY {
            return Err(too_many(ANN_POOL_SELECT_SECONDARY, text));
        }
        if let Some(n) = count
            && n != names.len()
        {
            return Err(bad(
                ANN_NUM_SECONDARY,
                &n.to_string(),
                &format!(
                    "{ANN_POOL_SELECT_SECONDARY} names {} pool(s): one address is taken from each",
                    names.len()
                ),
            ));
        }
        return Ok(names
            .into_iter()
            .map(|n| AddressSlot {
                family,
                pool: Some(n.to_string()),
                requested: None,
            })
            .collect());
    }
    Ok((0..count.unwrap_or(0))
        .map(|i| AddressSlot {
            family,
            pool: Some(secondary_pool_name(i)),
            requested: None,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn fams(slots: &[AddressSlot]) -> Vec<Family> {
        slots.iter().map(|s| s.family).collect()
    }

    #[test]
    fn single_stack_by_default() {
        let s = address_slots(&AddressInput::default(), |_| true).unwrap();
        assert_eq!(fams(&s), [Family::V4]);
        let v6 = ["IPv6".to_string()];
        let s = address_slots(
            &AddressInput {
                ip_families: &v6,
                ..Default::default()
            },
            |_| true,
        )
        .unwrap();
        assert_eq!(fams(&s), [Family::V6]);
    }

    #[test]
    fn a_static_address_of_another_family_names_the_families() {
        let a = ann(&[(ANN_STATIC_IP, "2001:db8::10")]);
        let e = address_slots(
            &AddressInput {
                annotations: Some(&a),
                ..Default::default()
            },
            |_| true,
        )
        .unwrap_err();
        assert_eq!(
            e.reason, "IPv6 address, but the Service asks for IPv4",
            "{e}"
        );
    }

    #[test]
    fn dual_stack_policies() {
        let fam = ["IPv6".to_string(), "IPv4".to_string()];
        let input = |p| AddressInput {
            ip_families: &fam,
            ip_family_policy: Some(p),
            ..Default::default()
        };
        assert_eq!(
            fams(&address_slots(&input("RequireDualStack"), |_| false).unwrap()),
            [Family::V6, Family::V4]
        );
        assert_eq!(
            fams(&address_slots(&input("PreferDualStack"), |f| f == Family::V4).unwrap()),
            [Family::V4]
        );
        assert_eq!(
            fams(&address_slots(&input("PreferDualStack"), |_| true).unwrap()),
            [Family::V6, Family::V4]
        );
    }

    /// Found by fuzzing (tests/fuzz_parsers.rs): a family listed twice made two slots of it
    /// (the API server refuses such a Service, this code must not depend on it).
    #[test]
    fn a_repeated_family_is_one_slot() {
        let fam = ["IPv6".to_string(), "IPv6".to_string()];
        for policy in ["PreferDualStack", "RequireDualStack"] {
            let input = AddressInput {
                ip_families: &fam,
                ip_family_policy: Some(policy),
                ..Default::default()
            };
            assert_eq!(
                fams(&address_slots(&input, |_| true).unwrap()),
                [Family::V6, Family::V4],
                "{policy}"
            );
        }
    }

    #[test]
    fn ipam_annotation_pool_and_static() {
        let a = ann(&[
            (ANN_IPAM, "ipv6"),
            (ANN_POOL_SELECT, "blue"),
            (ANN_STATIC_IP, "2001:db8::7"),
        ]);
        let s = address_slots(
            &AddressInput {
                annotations: Some(&a),
                ..Default::default()
            },
            |_| true,
        )
        .unwrap();
        assert_eq!(
            s,
            [AddressSlot {
                family: Family::V6,
                pool: Some("blue".into()),
                requested: Some("2001:db8::7".parse().unwrap())
            }]
        );
    }

    #[test]
    fn secondary_addresses() {
        let slots = |pairs: &[(&str, &str)]| {
            let a = ann(pairs);
            secondary_slots(Some(&a), Family::V4)
        };
        assert!(slots(&[]).unwrap().is_empty());
        let s = slots(&[(ANN_NUM_SECONDARY, "2")]).unwrap();
        let pools: Vec<_> = s.iter().map(|s| s.pool.clone().unwrap()).collect();
        assert_eq!(pools, ["secondary0", "secondary1"]);
        let s = slots(&[(ANN_POOL_SELECT_SECONDARY, "blue, green")]).unwrap();
        let pools: Vec<_> = s.iter().map(|s| s.pool.clone().unwrap()).collect();
        assert_eq!(pools, ["blue", "green"]);
        // Specific addresses win over the other two, as in kube-loxilb.
        let s = slots(&[
            (ANN_SECONDARY_IPS, "192.0.2.7,192.0.2.8"),
            (ANN_NUM_SECONDARY, "1"),
        ])
        .unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[1].requested, Some("192.0.2.8".parse().unwrap()));
        for (pairs, annotation) in [
            (vec![(ANN_NUM_SECONDARY, "4")], ANN_NUM_SECONDARY),
            (vec![(ANN_NUM_SECONDARY, "two")], ANN_NUM_SECONDARY),
            (
                vec![(ANN_SECONDARY_IPS, "192.0.2.1,192.0.2.2,192.0.2.3,192.0.2.4")],
                ANN_SECONDARY_IPS,
            ),
            (vec![(ANN_SECONDARY_IPS, "2001:db8::1")], ANN_SECONDARY_IPS),
            (
                vec![(ANN_SECONDARY_IPS, "192.0.2.1,192.0.2.1")],
                ANN_SECONDARY_IPS,
            ),
            (vec![(ANN_SECONDARY_IPS, "nope")], ANN_SECONDARY_IPS),
            (
                vec![(ANN_POOL_SELECT_SECONDARY, "a,,b")],
                ANN_POOL_SELECT_SECONDARY,
            ),
            (
                vec![(ANN_POOL_SELECT_SECONDARY, "a,b"), (ANN_NUM_SECONDARY, "1")],
                ANN_NUM_SECONDARY,
            ),
        ] {
            let e = slots(&pairs).unwrap_err();
            assert_eq!(e.annotation, annotation, "{pairs:?}: {e}");
        }
    }

    #[test]
    fn bad_values_name_the_annotation() {
        let a = ann(&[(ANN_IPAM, "ipv5")]);
        let e = address_slots(
            &AddressInput {
                annotations: Some(&a),
                ..Default::default()
            },
            |_| true,
        )
        .unwrap_err();
        assert_eq!(e.annotation, ANN_IPAM);
        let a = ann(&[(ANN_STATIC_IP, "10.0.0.1,nope")]);
        let e = address_slots(
            &AddressInput {
                annotations: Some(&a),
                ..Default::default()
            },
            |_| true,
        )
        .unwrap_err();
        assert_eq!(e.annotation, ANN_STATIC_IP);
        assert!(e.reason.contains("nope"));
        // An IPv6 static address on a single-stack IPv4 Service.
        let a = ann(&[(ANN_STATIC_IP, "2001:db8::1")]);
        let e = address_slots(
            &AddressInput {
                annotations: Some(&a),
                ..Default::default()
            },
            |_| true,
        )
        .unwrap_err();
        assert_eq!(e.annotation, ANN_STATIC_IP);
        let e = address_slots(
            &AddressInput {
                load_balancer_ip: Some("x"),
                ..Default::default()
            },
            |_| true,
        )
        .unwrap_err();
        assert_eq!(e.annotation, "spec.loadBalancerIP");
    }

    #[test]
    fn retention_is_read_or_refused() {
        let with = |v: &str| BTreeMap::from([(ANN_RETAIN.to_string(), v.to_string())]);
        assert_eq!(retention(None).unwrap(), None);
        assert_eq!(
            retention(Some(&with("2m"))).unwrap(),
            Some(std::time::Duration::from_secs(120))
        );
        let err = retention(Some(&with("soon"))).unwrap_err();
        assert_eq!(err.annotation, ANN_RETAIN);
    }
}
