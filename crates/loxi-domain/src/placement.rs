//! Which group of loxilbs a Service's rules go to (docs/fleet.md#groups-and-placement).
//!
//! A *group* (kube-loxilb's zone) is a set of loxilbs that hold the same rules. A Service
//! lives in exactly one group: the one its `loxilb.io/zoneselect` names, or, when it names
//! none, the group chosen here **by capacity** and then recorded on the Service, so that it
//! never moves (not after a restart, a failover, or when a group is added).
//!
//! The rules:
//!
//! 1. **Whole Services.** A Service is placed only on a group with room for all of its
//!    rules: it is never split, and never half-programmed.
//! 2. **Most room first.** Among the groups with room, the one with the most free rules,
//!    the first by name on a tie: groups fill evenly, and the choice is deterministic.
//! 3. **Wait, never force.** No group with room (or no group at all): the Service waits,
//!    and is placed when room frees ([`PlacementError::NoRoom`] says how full each group is).

use serde::{Deserialize, Serialize};

/// The Service annotation naming (and, once placed, recording) its group (kube-loxilb's
/// name).
pub const ZONE_SELECT_ANNOTATION: &str = "loxilb.io/zoneselect";

/// One group as placement sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupRoom {
    pub name: String,
    /// Rules each of its loxilbs holds at most (the smallest table among them).
    pub capacity: usize,
    /// Rules of the Services placed on it so far.
    pub used: usize,
}

impl GroupRoom {
    pub fn free(&self) -> usize {
        self.capacity.saturating_sub(self.used)
    }
}

/// Why a Service cannot be placed now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// No group has room for all of the Service's rules.
    #[error("{}", no_room_text(*needed, groups))]
    NoRoom {
        needed: usize,
        groups: Vec<GroupRoom>,
    },
    /// `loxilb.io/zoneselect` names a group no loxilb belongs to.
    #[error(
        "annotation loxilb.io/zoneselect={} names no group of loxilbs (groups: {known}); the Service waits until a loxilb of that group joins",
        crate::text::shown(.value)
    )]
    UnknownGroup { value: String, known: String },
    /// `loxilb.io/zoneselect` is not a group name.
    #[error(
        "annotation loxilb.io/zoneselect={} is invalid: expected a group name (lower-case letters, digits and '-', at most 50 characters)",
        crate::text::shown(.value)
    )]
    InvalidName { value: String },
}

impl PlacementError {
    /// Stable category, for the condition reason, the Event reason and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            PlacementError::NoRoom { .. } => "CapacityExceeded",
            PlacementError::UnknownGroup { .. } => "UnknownZone",
            PlacementError::InvalidName { .. } => "InvalidAnnotation",
        }
    }
}

fn no_room_text(needed: usize, groups: &[GroupRoom]) -> String {
    if groups.is_empty() {
        return format!("no group of loxilbs to place its {needed} rule(s) on");
    }
    let each: Vec<String> = groups
        .iter()
        .map(|g| format!("{} {} of {} rules used", g.name, g.used, g.capacity))
        .collect();
    format!(
        "no group of loxilbs has room for its {needed} rule(s) ({}); it waits for room",
        each.join(", ")
    )
}

/// Whether `name` can name a group: it becomes part of HA instance names
/// (`<group>-inst<N>`), rule names and a ConfigMap key, so a DNS label of at most 50
/// characters (room for `-inst<N>`).
pub fn is_group_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 50
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// Reads a `loxilb.io/zoneselect` value: a group among `groups`.
pub fn parse_group(value: &str, groups: &[GroupRoom]) -> Result<String, PlacementError> {
    let value = value.trim();
    if !is_group_name(value) {
        return Err(PlacementError::InvalidName {
            value: value.to_string(),
        });
    }
    if groups.iter().any(|g| g.name == value) {
        return Ok(value.to_string());
    }
    Err(PlacementError::UnknownGroup {
        value: value.to_string(),
        known: names(groups),
    })
}

fn names(groups: &[GroupRoom]) -> String {
    if groups.is_empty() {
        return "none".to_string();
    }
    groups
        .iter()
        .map(|g| g.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The group for a Service that needs `needed` rules and names none (module documentation).
pub fn place(groups: &[GroupRoom], needed: usize) -> Result<String, PlacementError> {
    groups
        .iter()
        .filter(|g| g.free() >= needed.max(1))
        .min_by(|a, b| b.free().cmp(&a.free()).then_with(|| a.name.cmp(&b.name)))
        .map(|g| g.name.clone())
        .ok_or_else(|| PlacementError::NoRoom {
            needed,
            groups: groups.to_vec(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn g(name: &str, capacity: usize, used: usize) -> GroupRoom {
        GroupRoom {
            name: name.into(),
            capacity,
            used,
        }
    }

    #[test]
    fn the_group_with_most_room_first_by_name_on_a_tie() {
        let groups = [g("b", 100, 10), g("a", 100, 10), g("c", 100, 50)];
        assert_eq!(place(&groups, 2).unwrap(), "a");
        let groups = [g("b", 100, 10), g("a", 100, 11)];
        assert_eq!(place(&groups, 2).unwrap(), "b");
        // Room is counted in rules: a larger table wins even when fuller.
        let groups = [g("small", 10, 0), g("large", 2048, 100)];
        assert_eq!(place(&groups, 4).unwrap(), "large");
    }

    #[test]
    fn a_service_is_never_split_and_waits_when_nothing_fits() {
        let groups = [g("a", 100, 99), g("b", 100, 99)];
        let err = place(&groups, 2).unwrap_err();
        assert_eq!(err.reason(), "CapacityExceeded");
        let text = err.to_string();
        assert!(
            text.contains("2 rule(s)") && text.contains("a 99 of 100") && text.contains("b 99"),
            "{text}"
        );
        assert_eq!(place(&groups, 1).unwrap(), "a");
        assert!(matches!(
            place(&[], 1),
            Err(PlacementError::NoRoom { needed: 1, .. })
        ));
    }

    #[test]
    fn zoneselect_names_a_known_group() {
        let groups = [g("east", 10, 0), g("west", 10, 0)];
        assert_eq!(parse_group(" west ", &groups).unwrap(), "west");
        let err = parse_group("north", &groups).unwrap_err();
        assert_eq!(err.reason(), "UnknownZone");
        assert!(err.to_string().contains("east, west"), "{err}");
        for bad in ["", "East", "a_b", "-a", &"x".repeat(51)] {
            assert_eq!(
                parse_group(bad, &groups).unwrap_err().reason(),
                "InvalidAnnotation",
                "{bad:?}"
            );
        }
    }

    /// A 5,000-character value is shown cut (its start and its size); the reason stays
    /// whole, so an Event note (1,024 bytes) still says what is wrong.
    #[test]
    fn a_long_value_is_cut_and_the_reason_kept() {
        let long = "z".repeat(5000);
        let groups = [g("east", 10, 0)];
        let invalid = parse_group(&long, &groups).unwrap_err().to_string();
        assert!(
            invalid.ends_with(
                "is invalid: expected a group name (lower-case letters, digits and '-', at most \
                 50 characters)"
            ),
            "{invalid}"
        );
        let unknown = PlacementError::UnknownGroup {
            value: long.clone(),
            known: "east".into(),
        }
        .to_string();
        assert!(
            unknown.ends_with(
                "names no group of loxilbs (groups: east); the Service waits until a loxilb of \
                 that group joins"
            ),
            "{unknown}"
        );
        for text in [invalid, unknown] {
            assert!(text.contains("…\" (5000 bytes)"), "{text}");
            assert!(text.len() < 300, "{} bytes: {text}", text.len());
        }
    }

    proptest! {
        /// Placing Services one after the other never puts more rules on a group than it
        /// holds, and a Service waits only when no group could take it.
        #[test]
        fn placement_never_overfills(
            capacities in proptest::collection::vec(0usize..50, 1..5),
            needs in proptest::collection::vec(1usize..6, 0..60),
        ) {
            let mut groups: Vec<GroupRoom> = capacities
                .iter()
                .enumerate()
                .map(|(i, c)| g(&format!("g{i}"), *c, 0))
                .collect();
            for need in needs {
                match place(&groups, need) {
                    Ok(name) => {
                        let group = groups.iter_mut().find(|g| g.name == name).unwrap();
                        prop_assert!(group.free() >= need);
                        group.used += need;
                    }
                    Err(_) => prop_assert!(groups.iter().all(|g| g.free() < need)),
                }
            }
            prop_assert!(groups.iter().all(|g| g.used <= g.capacity));
        }
    }
}
