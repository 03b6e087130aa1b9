//! When Services may share one external address.
//!
//! - **Unique mode** (`--set-unique-ip`): never; every Service gets its own address.
//! - **Shared mode** (the default, as in kube-loxilb): two Services may hold one address when
//!   their (port, protocol) sets do not overlap, so no two loxilb rules ever have the same
//!   address, port and protocol (the rule identity). `loxilb.io/sharing-key` narrows that
//!   down, like MetalLB's `allow-shared-ip`: a Service with a key shares only with Services
//!   carrying the same key; Services without a key share with each other.
//!
//! Sharing without a key follows kube-loxilb rather than MetalLB (which shares only with a
//! key) because loxi-ccm replaces kube-loxilb: clusters it adopts already have Services on
//! one address by port, and a new Service must be placed the way kube-loxilb would have
//! placed it. An address picked from a pool is the lowest one the Service fits on, free or
//! shared, as kube-loxilb's first fit does (see `Allocator::allocate_from`).
//!
//! One exception keeps an explicit request from silently landing next to a stranger: a
//! Service asking for a specific address (`loxilb.io/staticIP`, `spec.loadBalancerIP`) that
//! another Service already holds joins it only when both carry the same sharing key; without
//! a key the address is reported in use.
//!
//! A claim records every owner's ports in both modes. The mode only decides whether a
//! Service may *join* an address someone else holds: switching from shared to unique mode
//! moves nobody (Services already on one address stay there), it only stops new joins.

use std::collections::{BTreeMap, BTreeSet};

use crate::intent::AnnotationError;
use crate::ipam::{PortProto, Sharing};

pub const ANN_SHARING_KEY: &str = "loxilb.io/sharing-key";

/// What a Service occupies on its address, whatever the mode: its ports (those with a
/// protocol loxilb cannot balance are left out; the planner refuses the Service anyway), its
/// `loxilb.io/sharing-key`, and its group of loxilbs (`loxilb.io/zoneselect`, where the
/// controller records it; `default_group` and no value both count as the default group).
pub fn service_sharing(
    annotations: Option<&BTreeMap<String, String>>,
    ports: &[PortProto],
    default_group: &str,
) -> Result<Sharing, AnnotationError> {
    let group = annotations
        .and_then(|a| a.get(crate::placement::ZONE_SELECT_ANNOTATION))
        .map(|v| v.trim())
        .filter(|v| !v.is_empty() && *v != default_group);
    let key = annotations
        .and_then(|a| a.get(ANN_SHARING_KEY))
        .map(|v| v.trim())
        .filter(|v| !v.is_empty());
    if let Some(k) = key
        && (k.len() > 253 || k.chars().any(|c| c.is_control()))
    {
        return Err(AnnotationError {
            annotation: ANN_SHARING_KEY,
            value: k.to_string(),
            reason: "expected at most 253 printable characters".into(),
        });
    }
    Ok(Sharing::Ports {
        key: key.map(str::to_string),
        ports: ports.iter().copied().collect::<BTreeSet<_>>(),
        group: group.map(str::to_string),
    })
}

/// Whether a Service with `sharing` may join an address other Services hold: never in unique
/// mode; for an address asked for by name only with a sharing key (see the module docs).
pub fn may_join(unique: bool, requested: bool, sharing: &Sharing) -> bool {
    !unique && (!requested || sharing.key().is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Protocol;

    #[test]
    fn keys_and_joining() {
        let ports = [PortProto::new(80, Protocol::Tcp)];
        let plain = service_sharing(None, &ports, "llb").unwrap();
        assert_eq!(plain.key(), None);
        assert!(matches!(&plain, Sharing::Ports { ports, .. } if ports.len() == 1));
        assert!(may_join(false, false, &plain));
        assert!(
            !may_join(false, true, &plain),
            "a requested address needs a key"
        );
        assert!(!may_join(true, false, &plain), "unique mode never joins");
        let ann = BTreeMap::from([(ANN_SHARING_KEY.to_string(), " team-a ".to_string())]);
        let keyed = service_sharing(Some(&ann), &ports, "llb").unwrap();
        assert_eq!(keyed.key(), Some("team-a"));
        assert!(may_join(false, true, &keyed));
        assert!(!may_join(true, true, &keyed));
        let bad = BTreeMap::from([(ANN_SHARING_KEY.to_string(), "x".repeat(300))]);
        assert_eq!(
            service_sharing(Some(&bad), &ports, "llb")
                .unwrap_err()
                .annotation,
            ANN_SHARING_KEY
        );
    }

    #[test]
    fn the_group_is_part_of_sharing_and_the_default_group_is_no_group() {
        let ports = [PortProto::new(80, Protocol::Tcp)];
        let other = [PortProto::new(81, Protocol::Tcp)];
        let zone = |z: &str| {
            BTreeMap::from([(
                crate::placement::ZONE_SELECT_ANNOTATION.to_string(),
                z.to_string(),
            )])
        };
        let east = service_sharing(Some(&zone("east")), &ports, "llb").unwrap();
        assert_eq!(east.group(), Some("east"));
        let default = service_sharing(Some(&zone(" llb ")), &other, "llb").unwrap();
        assert_eq!(default.group(), None);
        let none = service_sharing(None, &other, "llb").unwrap();
        assert!(default.compatible(&service_sharing(None, &ports, "llb").unwrap()));
        assert!(!east.compatible(&none), "two groups never share an address");
        let east81 = service_sharing(Some(&zone("east")), &other, "llb").unwrap();
        assert!(east.compatible(&east81));
    }
}
