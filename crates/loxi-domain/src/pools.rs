//! Address pools as the operator describes them (command-line flags and `AddressPool`
//! resources) and which of them a Service may use, in which order. Pure: the controller
//! hands in specs and labels and gets pool names back.
//!
//! **Order.** A Service without `loxilb.io/poolSelect` takes its address from the first pool
//! with room among those it may use, ordered by
//! 1. `priority`, higher first (pools from flags have priority 0);
//! 2. at equal priority, pools restricted by a selector before unrestricted ones: a pool an
//!    operator dedicated to some namespaces or Services is meant for them, and the shared
//!    catch-all pool is the fallback (MetalLB orders pools with a service allocation first
//!    too);
//! 3. then `AddressPool` resources before flag pools: a resource is the newer, explicit
//!    statement, while the flags are the default an installation started with;
//! 4. then resources by name, and flag pools in the order given on the command line.
//!
//! `poolSelect` names exactly one pool, whatever its `autoAssign` and priority.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::ipam::{AddressBlock, AllocError, Family, Pool};

/// Operator of one label selector requirement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

/// One `matchExpressions` entry, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub operator: Operator,
    pub values: BTreeSet<String>,
}

/// A `matchExpressions` entry as written (operator not yet checked).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RawRequirement {
    pub key: String,
    pub operator: String,
    pub values: Vec<String>,
}

/// A Kubernetes label selector (`metav1.LabelSelector`) as written.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RawSelector {
    pub match_labels: BTreeMap<String, String>,
    pub match_expressions: Vec<RawRequirement>,
}

/// A validated label selector with the Kubernetes semantics: every `matchLabels` pair and
/// every requirement must hold; an empty selector matches everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector {
    pub match_labels: BTreeMap<String, String>,
    pub requirements: Vec<Requirement>,
}

/// `[prefix/]name` with a DNS-subdomain prefix and a 1-63 character name (the Kubernetes
/// rule for label keys).
fn valid_label_key(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            })
    });
    prefix_ok && !name.is_empty() && valid_label_value(name)
}

/// At most 63 characters, alphanumeric at both ends, `-`, `_`, `.` inside (may be empty).
fn valid_label_value(v: &str) -> bool {
    let edge = |c: char| c.is_ascii_alphanumeric();
    v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && v.chars().next().is_none_or(edge)
        && v.chars().last().is_none_or(edge)
}

impl LabelSelector {
    /// Validates a selector as the API server would for a built-in resource.
    pub fn parse(raw: &RawSelector) -> Result<LabelSelector, Vec<String>> {
        let mut problems = Vec::new();
        for (k, v) in &raw.match_labels {
            if !valid_label_key(k) {
                problems.push(format!("matchLabels: {k:?} is not a valid label key"));
            }
            if !valid_label_value(v) {
                problems.push(format!(
                    "matchLabels: {v:?} (for {k:?}) is not a valid label value"
                ));
            }
        }
        let mut requirements = Vec::new();
        for (i, r) in raw.match_expressions.iter().enumerate() {
            let at = format!("matchExpressions[{i}]");
            if !valid_label_key(&r.key) {
                problems.push(format!("{at}: {:?} is not a valid label key", r.key));
            }
            let operator = match r.operator.as_str() {
                "In" => Operator::In,
                "NotIn" => Operator::NotIn,
                "Exists" => Operator::Exists,
                "DoesNotExist" => Operator::DoesNotExist,
                other => {
                    problems.push(format!(
                        "{at}: operator {other:?} is not one of In, NotIn, Exists, DoesNotExist"
                    ));
                    continue;
                }
            };
            match operator {
                Operator::In | Operator::NotIn if r.values.is_empty() => {
                    problems.push(format!("{at}: {} needs at least one value", r.operator));
                }
                Operator::Exists | Operator::DoesNotExist if !r.values.is_empty() => {
                    problems.push(format!("{at}: {} takes no values", r.operator));
                }
                _ => {}
            }
            for v in &r.values {
                if !valid_label_value(v) {
                    problems.push(format!("{at}: {v:?} is not a valid label value"));
                }
            }
            requirements.push(Requirement {
                key: r.key.clone(),
                operator,
                values: r.values.iter().cloned().collect(),
            });
        }
        if problems.is_empty() {
            Ok(LabelSelector {
                match_labels: raw.match_labels.clone(),
                requirements,
            })
        } else {
            Err(problems)
        }
    }

    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.requirements.is_empty()
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.requirements.iter().all(|r| {
                let value = labels.get(&r.key);
                match r.operator {
                    Operator::In => value.is_some_and(|v| r.values.contains(v)),
                    Operator::NotIn => value.is_none_or(|v| !r.values.contains(v)),
                    Operator::Exists => value.is_some(),
                    Operator::DoesNotExist => value.is_none(),
                }
            })
    }
}

/// Where a pool comes from. The derived order is the tie-break of the preference order:
/// resources first, then flag pools in the order given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PoolOrigin {
    /// An `AddressPool` resource.
    Resource,
    /// `--external-cidr`, `--cidr-pools`, ...: position in the configuration's pool list.
    Flag(usize),
}

/// A pool and the rules for using it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolDef {
    pub pool: Pool,
    pub origin: PoolOrigin,
    /// Higher first.
    pub priority: i32,
    /// False: only used when named by `loxilb.io/poolSelect`.
    pub auto_assign: bool,
    /// Hands out no new address; addresses already taken from it stay.
    pub disabled: bool,
    /// Only Services in namespaces whose labels match may use the pool.
    pub namespace_selector: Option<LabelSelector>,
    /// Only Services whose labels match may use the pool.
    pub service_selector: Option<LabelSelector>,
    /// How long a deleted Service's address from this pool stays reserved for its
    /// namespace/name (`loxilb.io/retain-address` on the Service wins). `None`: released.
    pub retain: Option<std::time::Duration>,
    /// Rules on its addresses are announced by BGP when BGP is on (`bgpAdvertise`; flag
    /// pools: always, they follow the global setting).
    pub advertise: bool,
}

/// Labels of the Service asking for an address, and of its namespace.
#[derive(Debug, Clone, Copy)]
pub struct Requester<'a> {
    pub namespace_labels: &'a BTreeMap<String, String>,
    pub service_labels: &'a BTreeMap<String, String>,
}

impl PoolDef {
    /// A pool from the command line: priority 0, used automatically, open to every Service.
    pub fn from_flags(pool: Pool, position: usize) -> PoolDef {
        PoolDef {
            pool,
            origin: PoolOrigin::Flag(position),
            priority: 0,
            auto_assign: true,
            disabled: false,
            namespace_selector: None,
            service_selector: None,
            retain: None,
            advertise: true,
        }
    }

    pub fn name(&self) -> &str {
        &self.pool.name
    }

    /// Restricted to some Services by a non-empty selector.
    pub fn selective(&self) -> bool {
        [&self.namespace_selector, &self.service_selector]
            .iter()
            .any(|s| s.as_ref().is_some_and(|s| !s.is_empty()))
    }

    /// Whether the selectors let `who` use this pool (`Err`: why not).
    pub fn admits(&self, who: &Requester<'_>) -> Result<(), String> {
        if let Some(s) = &self.namespace_selector
            && !s.matches(who.namespace_labels)
        {
            return Err("the namespace's labels do not match its namespaceSelector".into());
        }
        if let Some(s) = &self.service_selector
            && !s.matches(who.service_labels)
        {
            return Err("the Service's labels do not match its serviceSelector".into());
        }
        Ok(())
    }

    fn order_key(&self) -> (Reverse<i32>, Reverse<bool>, PoolOrigin, &str) {
        (
            Reverse(self.priority),
            Reverse(self.selective()),
            self.origin,
            self.name(),
        )
    }
}

/// What an `AddressPool` resource asks for, before validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSpec {
    pub name: String,
    /// CIDRs and `a-b` ranges, either family.
    pub addresses: Vec<String>,
    pub auto_assign: bool,
    pub avoid_buggy_ips: bool,
    pub priority: i32,
    pub disabled: bool,
    pub namespace_selector: Option<RawSelector>,
    pub service_selector: Option<RawSelector>,
    /// `retainAddresses`: how long a deleted Service's address stays reserved for it.
    pub retain: Option<String>,
    /// `bgpAdvertise`: announce its addresses by BGP (when BGP is on).
    pub advertise: bool,
}

/// Checks a resource's spec; every problem is reported, not only the first.
pub fn validate_pool(spec: &PoolSpec) -> Result<PoolDef, Vec<String>> {
    let mut problems = Vec::new();
    if spec.addresses.is_empty() {
        problems.push("addresses: at least one CIDR or range is needed".to_string());
    }
    let mut blocks: Vec<AddressBlock> = Vec::new();
    for text in &spec.addresses {
        match AddressBlock::parse(text, spec.avoid_buggy_ips) {
            Ok(b) => {
                // As for pools from the command line: two blocks of one pool may not share
                // an address (the pool's size and its status would count it twice).
                if let Some(other) = blocks.iter().find(|o| o.overlaps(&b)) {
                    problems.push(format!("addresses: {b} overlaps {other} of the same pool"));
                }
                blocks.push(b);
            }
            Err(e) => problems.push(format!("addresses: {e}")),
        }
    }
    let mut selector = |what: &str, raw: &Option<RawSelector>| match raw {
        None => None,
        Some(raw) => match LabelSelector::parse(raw) {
            Ok(s) => Some(s),
            Err(list) => {
                problems.extend(list.into_iter().map(|p| format!("{what}: {p}")));
                None
            }
        },
    };
    let namespace_selector = selector("namespaceSelector", &spec.namespace_selector);
    let service_selector = selector("serviceSelector", &spec.service_selector);
    let retain = match spec
        .retain
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        None => None,
        Some(text) => match crate::duration::parse_duration(text) {
            Ok(d) if d.is_zero() => None,
            Ok(d) => Some(d),
            Err(e) => {
                problems.push(format!("retainAddresses: {e}"));
                None
            }
        },
    };
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(PoolDef {
        pool: Pool::new(&spec.name, blocks),
        origin: PoolOrigin::Resource,
        priority: spec.priority,
        auto_assign: spec.auto_assign,
        disabled: spec.disabled,
        namespace_selector,
        service_selector,
        retain,
        advertise: spec.advertise,
    })
}

/// Every pool in effect, in preference order, and what is wrong with the others.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolSet {
    pub defs: Vec<PoolDef>,
    /// Resources that are not used, with their problems (name -> problems).
    pub invalid: BTreeMap<String, Vec<String>>,
    /// Pools sharing addresses with another pool (name -> one line per overlap, naming the
    /// other pool). Overlapping pools still work: an address is taken in both at once.
    pub overlaps: BTreeMap<String, Vec<String>>,
}

/// Merges the flag pools and the resources' (validated) pools. A resource named like a flag
/// pool is refused: `poolSelect` and claims name pools, so a name must mean one pool.
///
/// `secondary` are the secondary pools from the command line (SCTP multi-homing): they hand
/// out addresses only when named (`loxilb.io/poolSelectSecondary`, `num-secondary-networks`,
/// or `poolSelect`), never automatically.
pub fn merge_pools(
    flags: &[Pool],
    secondary: &[Pool],
    resources: Vec<(String, Result<PoolDef, Vec<String>>)>,
) -> PoolSet {
    let mut set = PoolSet::default();
    for (i, pool) in flags.iter().enumerate() {
        set.defs.push(PoolDef::from_flags(pool.clone(), i));
    }
    for (i, pool) in secondary.iter().enumerate() {
        let mut def = PoolDef::from_flags(pool.clone(), flags.len() + i);
        def.auto_assign = false;
        set.defs.push(def);
    }
    for (name, result) in resources {
        match result {
            Ok(_) if flags.iter().chain(secondary).any(|p| p.name == name) => {
                set.invalid.insert(
                    name.clone(),
                    vec![format!(
                        "the name {name:?} is taken by a pool from the command line \
                         (--external-cidr, --cidr-pools, ...): rename the resource"
                    )],
                );
            }
            Ok(def) => set.defs.push(def),
            Err(problems) => {
                set.invalid.insert(name, problems);
            }
        }
    }
    set.defs.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
    for (i, a) in set.defs.iter().enumerate() {
        for b in set.defs.iter().skip(i + 1) {
            for x in &a.pool.blocks {
                for y in b.pool.blocks.iter().filter(|y| x.overlaps(y)) {
                    set.overlaps
                        .entry(a.name().to_string())
                        .or_default()
                        .push(format!("{x} overlaps {y} of pool {:?}", b.name()));
                    set.overlaps
                        .entry(b.name().to_string())
                        .or_default()
                        .push(format!("{y} overlaps {x} of pool {:?}", a.name()));
                }
            }
        }
    }
    set
}

impl PoolSet {
    /// The pools in preference order, for the allocator.
    pub fn pools(&self) -> Vec<Pool> {
        self.defs.iter().map(|d| d.pool.clone()).collect()
    }

    pub fn get(&self, name: &str) -> Option<&PoolDef> {
        self.defs.iter().find(|d| d.name() == name)
    }

    /// Whether rules on `ip` may be announced by BGP: not when a pool holding it has
    /// advertisement off (`bgpAdvertise: false`: the operator reaches those addresses another
    /// way, L2 or static routes), even if an overlapping pool would. Addresses outside every
    /// pool (static ones) and flag pools follow the global setting.
    pub fn advertises(&self, ip: &IpAddr) -> bool {
        self.defs
            .iter()
            .filter(|d| d.pool.contains(ip))
            .all(|d| d.advertise)
    }

    /// The pools `who` may take a new `family` address from, in order. `selected` is
    /// `loxilb.io/poolSelect`: that pool only, even with `autoAssign: false`, and an error
    /// naming why when it may not be used.
    pub fn candidates(
        &self,
        selected: Option<&str>,
        who: &Requester<'_>,
        family: Family,
    ) -> Result<Vec<&str>, AllocError> {
        if let Some(name) = selected {
            let def = self
                .get(name)
                .ok_or_else(|| AllocError::UnknownPool(name.to_string()))?;
            if def.disabled {
                return Err(AllocError::PoolDisabled {
                    pool: name.to_string(),
                });
            }
            def.admits(who).map_err(|reason| AllocError::NotAllowed {
                pool: name.to_string(),
                reason,
            })?;
            // A named pool without this family is reported by the allocator as exhausted.
            return Ok(vec![def.name()]);
        }
        let names: Vec<&str> = self
            .defs
            .iter()
            .filter(|d| d.auto_assign && !d.disabled && d.pool.size(family) > 0)
            .filter(|d| d.admits(who).is_ok())
            .map(PoolDef::name)
            .collect();
        if names.is_empty() {
            return Err(AllocError::NoEligiblePool { family });
        }
        Ok(names)
    }

    /// Whether `who` could get a `family` address at all (PreferDualStack asks for a second
    /// family only then).
    pub fn serves(&self, selected: Option<&str>, who: &Requester<'_>, family: Family) -> bool {
        self.candidates(selected, who, family).is_ok_and(|names| {
            names
                .iter()
                .any(|n| self.get(n).is_some_and(|d| d.pool.size(family) > 0))
        })
    }

    /// Whether `who` may newly take the specific address `ip` (`loxilb.io/staticIP`,
    /// `spec.loadBalancerIP`): outside every pool yes (the operator's business: selectors
    /// govern only a pool's own addresses); inside, only when one pool holding it is enabled
    /// and admits `who`, so a selector cannot be bypassed by asking for an address by name.
    pub fn admits_address(&self, ip: &IpAddr, who: &Requester<'_>) -> Result<(), AllocError> {
        let holding: Vec<&PoolDef> = self.defs.iter().filter(|d| d.pool.contains(ip)).collect();
        let Some(first) = holding.first() else {
            // Not in any pool; but an edge a pool's CIDR leaves out is no address "outside
            // every pool" the operator meant to hand out.
            if let Some((def, block)) = self.defs.iter().find_map(|d| {
                d.pool
                    .blocks
                    .iter()
                    .find(|b| b.skips(ip))
                    .map(|b| (d, b.to_string()))
            }) {
                return Err(AllocError::EdgeAddress {
                    ip: *ip,
                    pool: def.name().to_string(),
                    block,
                });
            }
            return Ok(());
        };
        if holding.iter().any(|d| !d.disabled && d.admits(who).is_ok()) {
            return Ok(());
        }
        if first.disabled {
            return Err(AllocError::PoolDisabled {
                pool: first.name().to_string(),
            });
        }
        Err(AllocError::NotAllowed {
            pool: first.name().to_string(),
            reason: first.admits(who).err().unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn raw(match_labels: &[(&str, &str)], exprs: &[(&str, &str, &[&str])]) -> RawSelector {
        RawSelector {
            match_labels: labels(match_labels),
            match_expressions: exprs
                .iter()
                .map(|(k, op, vs)| RawRequirement {
                    key: k.to_string(),
                    operator: op.to_string(),
                    values: vs.iter().map(|v| v.to_string()).collect(),
                })
                .collect(),
        }
    }

    fn spec(name: &str, addresses: &[&str]) -> PoolSpec {
        PoolSpec {
            name: name.into(),
            addresses: addresses.iter().map(|a| a.to_string()).collect(),
            auto_assign: true,
            avoid_buggy_ips: true,
            priority: 0,
            disabled: false,
            namespace_selector: None,
            service_selector: None,
            retain: None,
            advertise: true,
        }
    }

    fn flag(name: &str, block: &str) -> Pool {
        Pool::new(name, vec![block.parse().unwrap()])
    }

    #[test]
    fn selector_semantics() {
        let s = LabelSelector::parse(&raw(
            &[("team", "a")],
            &[
                ("tier", "In", &["web", "api"]),
                ("env", "NotIn", &["prod"]),
                ("owner", "Exists", &[]),
                ("legacy", "DoesNotExist", &[]),
            ],
        ))
        .unwrap();
        let ok = labels(&[("team", "a"), ("tier", "web"), ("owner", "x")]);
        assert!(s.matches(&ok));
        // NotIn matches an absent key, fails on a listed value.
        let mut l = ok.clone();
        l.insert("env".into(), "prod".into());
        assert!(!s.matches(&l));
        let mut l = ok.clone();
        l.insert("legacy".into(), "".into());
        assert!(!s.matches(&l), "DoesNotExist fails on a present key");
        let mut l = ok.clone();
        l.remove("owner");
        assert!(!s.matches(&l));
        let mut l = ok.clone();
        l.insert("tier".into(), "db".into());
        assert!(!s.matches(&l));
        let mut l = ok;
        l.insert("team".into(), "b".into());
        assert!(!s.matches(&l));
        // Empty selector: everything.
        let empty = LabelSelector::parse(&RawSelector::default()).unwrap();
        assert!(empty.is_empty() && empty.matches(&BTreeMap::new()));
    }

    #[test]
    fn selector_validation_reports_every_problem() {
        let e = LabelSelector::parse(&raw(
            &[("bad key!", "v")],
            &[
                ("k", "Equals", &["x"]),
                ("k", "In", &[]),
                ("k", "Exists", &["x"]),
                ("example.com/k", "In", &["-bad"]),
            ],
        ))
        .unwrap_err();
        assert_eq!(e.len(), 5, "{e:?}");
        assert!(e[1].contains("Equals"), "{e:?}");
        assert!(
            LabelSelector::parse(&raw(&[("example.com/team", "a_b.c-d")], &[])).is_ok(),
            "prefixed keys and full value charset"
        );
    }

    #[test]
    fn pool_spec_validation() {
        let def = validate_pool(&spec("p", &["10.0.0.0/30", "2001:db8::1-2001:db8::9"])).unwrap();
        assert_eq!(def.pool.size(Family::V4), 2);
        assert_eq!(def.pool.size(Family::V6), 9);
        let mut keep = spec("p", &["10.0.0.0/30"]);
        keep.avoid_buggy_ips = false;
        assert_eq!(validate_pool(&keep).unwrap().pool.size(Family::V4), 4);
        let mut bad = spec("p", &["10.0.0.0/33", "nope"]);
        bad.namespace_selector = Some(raw(&[], &[("k", "Maybe", &[])]));
        let e = validate_pool(&bad).unwrap_err();
        assert_eq!(e.len(), 3, "{e:?}");
        assert!(e[2].starts_with("namespaceSelector"), "{e:?}");
        assert!(validate_pool(&spec("p", &[])).is_err());
    }

    #[test]
    fn order_priority_then_selective_then_resources_then_flags() {
        let mut hi = spec("hi", &["10.1.0.0/24"]);
        hi.priority = 10;
        let mut team = spec("team", &["10.2.0.0/24"]);
        team.namespace_selector = Some(raw(&[("team", "a")], &[]));
        let plain = spec("plain", &["10.3.0.0/24"]);
        let mut low = spec("low", &["10.4.0.0/24"]);
        low.priority = -1;
        let resources = [hi, team, plain, low]
            .into_iter()
            .map(|s| (s.name.clone(), validate_pool(&s)))
            .collect();
        let set = merge_pools(
            &[
                flag("default", "10.9.0.0/24"),
                flag("second", "10.8.0.0/24"),
            ],
            &[],
            resources,
        );
        let names: Vec<&str> = set.defs.iter().map(PoolDef::name).collect();
        assert_eq!(
            names,
            ["hi", "team", "plain", "default", "second", "low"],
            "priority, then selective, then resources before flags"
        );
        let ns_a = labels(&[("team", "a")]);
        let none = BTreeMap::new();
        let a = Requester {
            namespace_labels: &ns_a,
            service_labels: &none,
        };
        let b = Requester {
            namespace_labels: &none,
            service_labels: &none,
        };
        assert_eq!(
            set.candidates(None, &a, Family::V4).unwrap(),
            ["hi", "team", "plain", "default", "second", "low"]
        );
        assert_eq!(
            set.candidates(None, &b, Family::V4).unwrap(),
            ["hi", "plain", "default", "second", "low"]
        );
        assert_eq!(
            set.candidates(None, &b, Family::V6),
            Err(AllocError::NoEligiblePool { family: Family::V6 })
        );
        assert!(!set.serves(None, &b, Family::V6));
        assert_eq!(
            set.candidates(Some("team"), &b, Family::V4),
            Err(AllocError::NotAllowed {
                pool: "team".into(),
                reason: "the namespace's labels do not match its namespaceSelector".into()
            })
        );
        assert_eq!(
            set.candidates(Some("nope"), &a, Family::V4),
            Err(AllocError::UnknownPool("nope".into()))
        );
    }

    #[test]
    fn auto_assign_disabled_and_service_selector() {
        let mut manual = spec("manual", &["10.1.0.0/24"]);
        manual.auto_assign = false;
        let mut off = spec("off", &["10.2.0.0/24"]);
        off.disabled = true;
        let mut web = spec("web", &["10.3.0.0/24"]);
        web.service_selector = Some(raw(&[], &[("app", "In", &["web"])]));
        let resources = [manual, off, web]
            .into_iter()
            .map(|s| (s.name.clone(), validate_pool(&s)))
            .collect();
        let set = merge_pools(&[], &[], resources);
        let none = BTreeMap::new();
        let web_labels = labels(&[("app", "web")]);
        let plain = Requester {
            namespace_labels: &none,
            service_labels: &none,
        };
        let webby = Requester {
            namespace_labels: &none,
            service_labels: &web_labels,
        };
        assert_eq!(
            set.candidates(None, &plain, Family::V4),
            Err(AllocError::NoEligiblePool { family: Family::V4 })
        );
        assert_eq!(set.candidates(None, &webby, Family::V4).unwrap(), ["web"]);
        assert_eq!(
            set.candidates(Some("manual"), &plain, Family::V4).unwrap(),
            ["manual"]
        );
        assert_eq!(
            set.candidates(Some("off"), &plain, Family::V4),
            Err(AllocError::PoolDisabled { pool: "off".into() })
        );
        // Specific addresses: outside every pool fine; inside, only through an admitting,
        // enabled pool.
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(set.admits_address(&ip("192.0.2.1"), &plain).is_ok());
        assert!(set.admits_address(&ip("10.1.0.5"), &plain).is_ok());
        assert_eq!(
            set.admits_address(&ip("10.2.0.5"), &plain),
            Err(AllocError::PoolDisabled { pool: "off".into() })
        );
        assert!(matches!(
            set.admits_address(&ip("10.3.0.5"), &plain),
            Err(AllocError::NotAllowed { .. })
        ));
        assert!(set.admits_address(&ip("10.3.0.5"), &webby).is_ok());
    }

    #[test]
    fn an_edge_a_pool_leaves_out_is_not_outside_every_pool() {
        let set = merge_pools(&[flag("default", "10.9.0.0/24")], &[], Vec::new());
        let none = BTreeMap::new();
        let who = Requester {
            namespace_labels: &none,
            service_labels: &none,
        };
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        for edge in ["10.9.0.0", "10.9.0.255"] {
            let e = set.admits_address(&ip(edge), &who).unwrap_err();
            assert!(matches!(e, AllocError::EdgeAddress { .. }), "{e}");
            assert!(e.to_string().contains("pool \"default\""), "{e}");
        }
        assert!(set.admits_address(&ip("10.9.0.1"), &who).is_ok());
        assert!(set.admits_address(&ip("10.8.0.0"), &who).is_ok());
    }

    #[test]
    fn a_pool_whose_own_blocks_overlap_is_invalid() {
        let problems =
            validate_pool(&spec("twice", &["10.0.0.0/24", "10.0.0.10-10.0.0.20"])).unwrap_err();
        assert_eq!(
            problems,
            ["addresses: 10.0.0.10-10.0.0.20 overlaps 10.0.0.0/24 of the same pool"]
        );
        assert!(validate_pool(&spec("apart", &["10.0.0.0/24", "10.0.1.0/24"])).is_ok());
    }

    #[test]
    fn overlaps_and_name_clashes_are_reported() {
        let resources = [
            spec("a", &["10.0.0.0/24"]),
            spec("b", &["10.0.0.128-10.0.0.130", "10.5.0.0/24"]),
            spec("default", &["10.7.0.0/24"]),
            spec("bad", &["x"]),
        ]
        .into_iter()
        .map(|s| (s.name.clone(), validate_pool(&s)))
        .collect();
        let set = merge_pools(&[flag("default", "10.9.0.0/24")], &[], resources);
        assert_eq!(
            set.overlaps["a"],
            ["10.0.0.0/24 overlaps 10.0.0.128-10.0.0.130 of pool \"b\""]
        );
        assert_eq!(
            set.overlaps["b"],
            ["10.0.0.128-10.0.0.130 overlaps 10.0.0.0/24 of pool \"a\""]
        );
        assert!(!set.overlaps.contains_key("default"));
        assert!(set.invalid["default"][0].contains("command line"));
        assert!(set.invalid["bad"][0].contains("\"x\""));
        let names: Vec<&str> = set.defs.iter().map(PoolDef::name).collect();
        assert_eq!(names, ["a", "b", "default"]);
        // The flag pool kept its name; the clashing resource was dropped.
        assert_eq!(set.get("default").unwrap().origin, PoolOrigin::Flag(0));
    }

    #[test]
    fn advertisement_follows_every_pool_holding_the_address() {
        let mut quiet = spec("quiet", &["192.0.2.0/28"]);
        quiet.advertise = false;
        let loud = spec("loud", &["192.0.2.8/29", "198.51.100.0/24"]);
        let set = merge_pools(
            &[flag("default", "203.0.113.0/24")],
            &[],
            vec![
                ("quiet".into(), validate_pool(&quiet)),
                ("loud".into(), validate_pool(&loud)),
            ],
        );
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(!set.advertises(&ip("192.0.2.3")), "in the quiet pool only");
        assert!(
            !set.advertises(&ip("192.0.2.9")),
            "in both: the pool with advertisement off wins"
        );
        assert!(set.advertises(&ip("198.51.100.7")), "in the loud pool");
        assert!(set.advertises(&ip("203.0.113.7")), "a flag pool");
        assert!(set.advertises(&ip("10.9.9.9")), "outside every pool");
    }
}
