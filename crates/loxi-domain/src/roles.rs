//! HA roles: which loxilb is `MASTER` for each HA instance (docs/fleet.md#ha-roles).
//!
//! loxilb keeps, per *HA instance* (`llb-inst0`, `llb-inst1`, ...), a state: the loxilb that
//! is `MASTER` for an instance answers for the addresses of the rules named after it, the
//! others stand by as `BACKUP` (docs/loxilb-api.md#ha-roles). The controller decides the
//! masters here and posts the states; this module only decides.
//!
//! The rules, in order of importance:
//!
//! 1. **Stable.** A master that is still eligible (reachable, not excluded) keeps its
//!    instances. Nothing is rebalanced when a loxilb joins or comes back, so a role moves
//!    only when its master fails: no flapping.
//! 2. **Exactly one.** Every instance for which some loxilb is eligible gets exactly one
//!    master among the eligible ones. When none is eligible the recorded master stays
//!    recorded (nobody else can take it, and it keeps the role if it comes back first).
//! 3. **Spread.** A new master is the eligible loxilb with the fewest instances so far, the
//!    first by id on a tie, so instances spread over loxilbs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The Service annotation naming (and, once given, pinning) its HA instance.
pub const ZONE_INSTANCE_ANNOTATION: &str = "loxilb.io/zoneinstance";

/// The zone name kube-loxilb uses when none is given: instances are `llb-inst0`, ...
pub const DEFAULT_ZONE: &str = "llb";

/// The state of a loxilb for one HA instance, spelled as loxilb wants it
/// (docs/loxilb-api.md#ha-roles).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Role {
    Master,
    Backup,
}

impl Role {
    /// The `state` of `POST /config/cistate`.
    pub fn as_loxilb(self) -> &'static str {
        match self {
            Role::Master => "MASTER",
            Role::Backup => "BACKUP",
        }
    }
}

/// The HA instance names of a zone: `<zone>-inst0` .. `<zone>-inst<count-1>` (kube-loxilb's
/// form; the default zone gives `llb-inst0`, the instance every rule name used so far).
pub fn instance_names(zone: &str, count: u16) -> Vec<String> {
    (0..count.max(1))
        .map(|i| format!("{zone}-inst{i}"))
        .collect()
}

/// The group (zone) an HA instance belongs to: `east` for `east-inst3`; `None` for a name
/// not of that form.
pub fn group_of_instance(instance: &str) -> Option<&str> {
    let (group, number) = instance.rsplit_once("-inst")?;
    (!group.is_empty() && !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit()))
        .then_some(group)
}

/// The operator's HA role settings (`--set-roles`, docs/fleet.md#ha-roles).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaSettings {
    /// The VIP sent with every state (`0.0.0.0` when none).
    pub vip: String,
    /// HA instances per group (`--num-zone-instances`): `<group>-inst0`, ...
    pub instance_count: u16,
    /// loxilbs never given a role (`--exclude-role-list`): URLs or hosts.
    pub excluded: Vec<String>,
}

impl HaSettings {
    /// The HA instances of `group`.
    pub fn instances_of(&self, group: &str) -> Vec<String> {
        instance_names(group, self.instance_count)
    }

    /// Whether the loxilb at `url` is excluded from roles: listed by its URL or its host.
    pub fn excludes(&self, url: &str) -> bool {
        let url = url.trim().trim_end_matches('/');
        let host = host_of(url);
        self.excluded.iter().any(|e| {
            let e = e.trim().trim_end_matches('/');
            e == url || e.trim_matches(['[', ']']) == host
        })
    }
}

/// The host of `scheme://host:port/...` (IPv6 without its brackets).
fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or(rest);
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    if let Some(v6) = authority.strip_prefix('[') {
        return v6.split(']').next().unwrap_or(v6);
    }
    authority.split(':').next().unwrap_or(authority)
}

/// One loxilb as role decisions see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// A stable identity (its URL).
    pub id: String,
    /// Answered its last probe.
    pub reachable: bool,
    /// Never given a role (`--excludeRoleList`).
    pub excluded: bool,
}

impl Candidate {
    fn eligible(&self) -> bool {
        self.reachable && !self.excluded
    }
}

/// HA instance name -> id of its master.
pub type Masters = BTreeMap<String, String>;

/// Decides the master of each of `instances` given the loxilbs and the masters recorded so
/// far (module documentation). Recorded masters of instances not in `instances` are dropped.
pub fn decide_masters(
    instances: &[String],
    candidates: &[Candidate],
    current: &Masters,
) -> Masters {
    let mut eligible: Vec<&Candidate> = candidates.iter().filter(|c| c.eligible()).collect();
    eligible.sort_by(|a, b| a.id.cmp(&b.id));
    eligible.dedup_by(|a, b| a.id == b.id);
    let is_eligible = |id: &str| eligible.iter().any(|c| c.id == id);
    let mut decided = Masters::new();
    let mut load: BTreeMap<&str, usize> = eligible.iter().map(|c| (c.id.as_str(), 0)).collect();
    // 1. Eligible masters keep their instances.
    for inst in instances {
        if let Some(master) = current.get(inst)
            && is_eligible(master)
        {
            decided.insert(inst.clone(), master.clone());
            *load.entry(master.as_str()).or_default() += 1;
        }
    }
    // 2. The others: the least loaded eligible loxilb, or the record as it was.
    for inst in instances {
        if decided.contains_key(inst) {
            continue;
        }
        let least = eligible
            .iter()
            .map(|c| c.id.as_str())
            .min_by_key(|id| (load.get(id).copied().unwrap_or(0), *id));
        match least {
            Some(id) => {
                decided.insert(inst.clone(), id.to_string());
                *load.entry(id).or_default() += 1;
            }
            None => {
                if let Some(master) = current.get(inst) {
                    decided.insert(inst.clone(), master.clone());
                }
            }
        }
    }
    decided
}

/// The role of loxilb `id` for `instance` under `masters`.
pub fn role_of(masters: &Masters, instance: &str, id: &str) -> Role {
    if masters.get(instance).is_some_and(|m| m == id) {
        Role::Master
    } else {
        Role::Backup
    }
}

/// Why an HA instance given by a Service (`loxilb.io/zoneinstance`) is not usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "annotation loxilb.io/zoneinstance={} is invalid: not an HA instance of this controller (one of {known})",
    crate::text::shown(.value)
)]
pub struct UnknownInstance {
    pub value: String,
    pub known: String,
}

/// Reads a Service's `loxilb.io/zoneinstance`: an instance name (`llb-inst1`) or its number
/// (`1`), which must be one of `instances`.
pub fn parse_instance(value: &str, instances: &[String]) -> Result<String, UnknownInstance> {
    let value = value.trim();
    let by_number = value.parse::<usize>().ok().and_then(|n| instances.get(n));
    let found = by_number.or_else(|| instances.iter().find(|i| i.as_str() == value));
    found.cloned().ok_or_else(|| UnknownInstance {
        value: value.to_string(),
        known: instances.join(", "),
    })
}

/// The HA instance a new Service is given: the one with the fewest Services so far
/// (`counts`, by instance), the first on a tie. Given once, then pinned on the Service.
pub fn pick_instance(instances: &[String], counts: &BTreeMap<String, usize>) -> String {
    instances
        .iter()
        .enumerate()
        .min_by_key(|(i, name)| (counts.get(*name).copied().unwrap_or(0), *i))
        .map(|(_, name)| name.clone())
        .unwrap_or_else(|| format!("{DEFAULT_ZONE}-inst0"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cand(id: &str, reachable: bool) -> Candidate {
        Candidate {
            id: id.into(),
            reachable,
            excluded: false,
        }
    }

    fn names(n: u16) -> Vec<String> {
        instance_names(DEFAULT_ZONE, n)
    }

    #[test]
    fn an_instance_names_its_group() {
        assert_eq!(group_of_instance("llb-inst0"), Some("llb"));
        assert_eq!(group_of_instance("east-1-inst12"), Some("east-1"));
        assert_eq!(group_of_instance("east-inst"), None);
        assert_eq!(group_of_instance("-inst1"), None);
        assert_eq!(group_of_instance("inst1"), None);
    }

    #[test]
    fn instance_names_follow_kube_loxilb() {
        assert_eq!(names(1), ["llb-inst0"]);
        assert_eq!(instance_names("az1", 2), ["az1-inst0", "az1-inst1"]);
        assert_eq!(names(0), ["llb-inst0"]);
    }

    #[test]
    fn first_decision_spreads_instances() {
        let c = [cand("b", true), cand("a", true)];
        let m = decide_masters(&names(3), &c, &Masters::new());
        assert_eq!(m["llb-inst0"], "a");
        assert_eq!(m["llb-inst1"], "b");
        assert_eq!(m["llb-inst2"], "a");
        assert_eq!(role_of(&m, "llb-inst1", "b"), Role::Master);
        assert_eq!(role_of(&m, "llb-inst1", "a"), Role::Backup);
    }

    #[test]
    fn a_failed_master_is_replaced_and_does_not_take_the_role_back() {
        let inst = names(1);
        let up = [cand("a", true), cand("b", true)];
        let m = decide_masters(&inst, &up, &Masters::new());
        assert_eq!(m["llb-inst0"], "a");
        let a_down = [cand("a", false), cand("b", true)];
        let m = decide_masters(&inst, &a_down, &m);
        assert_eq!(m["llb-inst0"], "b");
        let m = decide_masters(&inst, &up, &m);
        assert_eq!(m["llb-inst0"], "b", "a came back: no flapping");
    }

    #[test]
    fn excluded_loxilbs_never_become_master() {
        let c = [
            Candidate {
                id: "a".into(),
                reachable: true,
                excluded: true,
            },
            cand("b", true),
        ];
        let m = decide_masters(&names(2), &c, &Masters::new());
        assert!(m.values().all(|id| id == "b"));
    }

    #[test]
    fn nobody_eligible_keeps_the_record() {
        let mut current = Masters::new();
        current.insert("llb-inst0".into(), "a".into());
        let m = decide_masters(&names(2), &[cand("a", false)], &current);
        assert_eq!(m.get("llb-inst0").map(String::as_str), Some("a"));
        assert_eq!(m.get("llb-inst1"), None);
    }

    #[test]
    fn excluded_by_url_or_host() {
        let s = HaSettings {
            vip: "0.0.0.0".into(),
            instance_count: 1,
            excluded: vec![
                "10.0.0.2".into(),
                "http://lb3:11111/".into(),
                "[fd00::1]".into(),
            ],
        };
        assert!(s.excludes("http://10.0.0.2:11111"));
        assert!(s.excludes("http://lb3:11111"));
        assert!(s.excludes("https://[fd00::1]:11111/"));
        assert!(!s.excludes("http://10.0.0.1:11111"));
        assert!(!s.excludes("http://lb3:22222"));
    }

    #[test]
    fn zoneinstance_by_name_or_number() {
        let inst = names(2);
        assert_eq!(parse_instance("llb-inst1", &inst).unwrap(), "llb-inst1");
        assert_eq!(parse_instance(" 1 ", &inst).unwrap(), "llb-inst1");
        let e = parse_instance("llb-inst2", &inst).unwrap_err();
        assert_eq!(
            e.to_string(),
            "annotation loxilb.io/zoneinstance=\"llb-inst2\" is invalid: not an HA instance of \
             this controller (one of llb-inst0, llb-inst1)"
        );
        assert!(parse_instance("7", &inst).is_err());
        // A 5,000-character value is cut, the reason kept whole.
        let text = parse_instance(&"i".repeat(5000), &inst)
            .unwrap_err()
            .to_string();
        assert!(
            text.ends_with(
                "\" (5000 bytes) is invalid: not an HA instance of this controller (one of \
                 llb-inst0, llb-inst1)"
            ),
            "{text}"
        );
        assert!(text.len() < 250, "{} bytes: {text}", text.len());
    }

    #[test]
    fn new_services_go_to_the_least_used_instance() {
        let inst = names(3);
        let mut counts = BTreeMap::new();
        assert_eq!(pick_instance(&inst, &counts), "llb-inst0");
        counts.insert("llb-inst0".to_string(), 2);
        counts.insert("llb-inst1".to_string(), 1);
        assert_eq!(pick_instance(&inst, &counts), "llb-inst2");
    }

    fn candidates() -> impl Strategy<Value = Vec<Candidate>> {
        proptest::collection::vec((0u8..6, any::<bool>(), proptest::bool::weighted(0.2)), 0..6)
            .prop_map(|v| {
                v.into_iter()
                    .map(|(id, reachable, excluded)| Candidate {
                        id: format!("lb{id}"),
                        reachable,
                        excluded,
                    })
                    .collect()
            })
    }

    fn masters() -> impl Strategy<Value = Masters> {
        proptest::collection::btree_map(0u16..4, 0u8..6, 0..4).prop_map(|m| {
            m.into_iter()
                .map(|(i, id)| (format!("llb-inst{i}"), format!("lb{id}")))
                .collect()
        })
    }

    proptest! {
        /// Exactly one eligible master per instance whenever a loxilb is eligible; an
        /// eligible master is never replaced; deciding again changes nothing.
        #[test]
        fn one_master_each_and_no_flapping(
            n in 1u16..4,
            cands in candidates(),
            current in masters(),
        ) {
            let inst = names(n);
            let eligible = |id: &str| cands.iter().any(|c| c.id == id && c.eligible());
            let any_eligible = cands.iter().any(Candidate::eligible);
            let m = decide_masters(&inst, &cands, &current);
            for i in &inst {
                if any_eligible {
                    let master = m.get(i).expect("a master");
                    prop_assert!(eligible(master));
                } else {
                    prop_assert_eq!(m.get(i), current.get(i));
                }
                if let Some(old) = current.get(i).filter(|id| eligible(id)) {
                    prop_assert_eq!(m.get(i), Some(old));
                }
            }
            prop_assert!(m.keys().all(|k| inst.contains(k)));
            prop_assert_eq!(decide_masters(&inst, &cands, &m), m.clone());
        }

        /// A loxilb that comes back (or joins) takes no role from an eligible master.
        #[test]
        fn coming_back_takes_nothing(
            n in 1u16..4,
            cands in candidates(),
            current in masters(),
            back in 0u8..6,
        ) {
            let inst = names(n);
            let before = decide_masters(&inst, &cands, &current);
            let mut more = cands.clone();
            more.push(cand(&format!("lb{back}"), true));
            let after = decide_masters(&inst, &more, &before);
            let eligible = |id: &str| cands.iter().any(|c| c.id == id && c.eligible());
            for (i, m) in &before {
                if eligible(m) {
                    prop_assert_eq!(after.get(i), Some(m));
                }
            }
        }
    }
}
