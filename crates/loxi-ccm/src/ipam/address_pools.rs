//! `AddressPool` resources: address pools an operator adds, edits and removes at run time,
//! next to the pools given by flags (`--external-cidr`, `--cidr-pools`, ...).
//!
//! Pools from both sources merge into one allocator (order and selection rules:
//! `loxi_domain::pools`). Every change rebuilds the allocator's index over the new pools with
//! every owner kept, so an edit never moves an address: an address outside a shrunk pool
//! stays with its Service until the Service lets go of it. A resource that does not validate
//! is left out (never a crash) and says why in its status, with a Warning Event.
//!
//! kube-loxilb's `LoxiURL` resources of `type: cidrpool` are pools too ([`cidrpool_spec`]):
//! the runtime hands them over ([`Pools::set_cidrpools`]) and they join the set like
//! resources, under the same rule (a change never moves an address). An `AddressPool` of the
//! same name wins.
//!
//! The leader writes each pool's status (address counts per family; conditions `Ready`,
//! `Overlapping`, `Exhausted`) with server-side apply, only when it differs from what the
//! pool shows.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{CustomResource, Resource, ResourceExt};
use loxi_domain::Pool;
use loxi_domain::ipam::{Allocator, Family};
use loxi_domain::pools::{
    PoolDef, PoolSet, PoolSpec, RawRequirement, RawSelector, merge_pools, validate_pool,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::Notify;
use tracing::warn;

use super::{Ipam, schema};
use crate::k8s::api::FIELD_MANAGER;
use crate::k8s::conditions::{StatusCondition, stamp_all};
use crate::k8s::events::EventRecorder;

pub const COND_READY: &str = "Ready";
pub const COND_OVERLAPPING: &str = "Overlapping";
pub const COND_EXHAUSTED: &str = "Exhausted";

/// One `matchExpressions` entry of a label selector.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = schema::label_requirement)]
pub struct LabelSelectorRequirement {
    /// The label key the requirement is about (`kubernetes.io/metadata.name`, `team`).
    #[schemars(transform = schema::label_key)]
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    #[schemars(transform = schema::label_operator)]
    pub operator: String,
    /// Label values: at least one for `In` and `NotIn`, none for `Exists` and
    /// `DoesNotExist`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = schema::label_values)]
    pub values: Vec<String>,
}

/// A label selector, as `metav1.LabelSelector`: every `matchLabels` pair and every
/// expression must hold; empty selects everything.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    /// Labels that must be present with exactly these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(transform = schema::match_labels)]
    pub match_labels: BTreeMap<String, String>,
    /// Requirements on labels, all of which must hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = schema::match_expressions)]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

fn yes() -> bool {
    true
}

// kube's printcolumn(...) syntax repeats `type_ = "integer"`, which this lint misreads.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "ipam.loxilb.io",
    version = "v1alpha1",
    kind = "AddressPool",
    plural = "addresspools",
    shortname = "lbpool",
    category = "loxilb",
    status = "AddressPoolStatus",
    doc = "A pool of external addresses for Services of type LoadBalancer, next to the pools given to loxi-ccm by flags. Editing or deleting a pool never changes an address a Service already has.",
    printcolumn(name = "Priority", type_ = "integer", json_path = ".spec.priority"),
    printcolumn(
        name = "Auto-Assign",
        type_ = "boolean",
        json_path = ".spec.autoAssign",
        priority = 1
    ),
    printcolumn(
        name = "Disabled",
        type_ = "boolean",
        json_path = ".spec.disabled",
        priority = 1
    ),
    printcolumn(
        name = "BGP",
        type_ = "boolean",
        json_path = ".spec.bgpAdvertise",
        priority = 1
    ),
    printcolumn(name = "V4-Total", type_ = "integer", json_path = ".status.ipv4.total"),
    printcolumn(name = "V4-Used", type_ = "integer", json_path = ".status.ipv4.used"),
    printcolumn(name = "V4-Free", type_ = "integer", json_path = ".status.ipv4.free"),
    printcolumn(name = "V6-Total", type_ = "integer", json_path = ".status.ipv6.total"),
    printcolumn(name = "V6-Used", type_ = "integer", json_path = ".status.ipv6.used"),
    printcolumn(name = "V6-Free", type_ = "integer", json_path = ".status.ipv6.free"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = schema::prose)]
/// The addresses of the pool and which Services may use it.
pub struct AddressPoolSpec {
    /// CIDRs (`192.0.2.0/24`, `2001:db8::/120`) and inclusive ranges
    /// (`192.0.2.10-192.0.2.20`, both ends of one family), of either family: one pool may
    /// serve both. One address is `a/32`, `a/128` or `a-a`. The blocks of one pool may not
    /// overlap. At least one, at most 64.
    #[schemars(transform = schema::pool_addresses)]
    pub addresses: Vec<String>,
    /// Used for Services that name no pool. False: only for Services naming this pool with
    /// the `loxilb.io/poolSelect` annotation.
    #[serde(default = "yes")]
    pub auto_assign: bool,
    /// Skip the network address (and, for IPv4, the broadcast address) of each CIDR that
    /// has them: some clients and routers mishandle them. Ranges are used as written.
    #[serde(default = "yes", rename = "avoidBuggyIPs")]
    pub avoid_buggy_ips: bool,
    /// Pools with a higher priority are used first. Pools given by flags have priority 0;
    /// at equal priority, pools with a selector come first, then AddressPools (by name),
    /// then the flag pools.
    #[serde(default)]
    #[schemars(extend("minimum" = i32::MIN, "maximum" = i32::MAX))]
    pub priority: i32,
    /// Hands out no new address; the addresses Services already have from it stay.
    #[serde(default)]
    pub disabled: bool,
    /// Only Services in namespaces whose labels match may use this pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// Only Services whose labels match may use this pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_selector: Option<LabelSelector>,
    /// Keep a deleted Service's address reserved for its namespace/name this long (e.g.
    /// `24h`), so that re-creating the Service gets the same address. The Service's
    /// `loxilb.io/retain-address` annotation wins (`0` there: release at once). Absent or
    /// `0`: released at once. A number and an optional unit `ms`, `s`, `m` or `h`; a bare
    /// number is seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = schema::retain_duration)]
    pub retain_addresses: Option<String>,
    /// With BGP on (`--bgp-local-as`), loxilb announces the addresses of this pool to its
    /// peers. False: rules on its addresses are created without BGP, for addresses the
    /// network reaches another way (L2, static routes); an address that is also in another
    /// pool is not announced either. Changing it re-creates the rules on its addresses.
    #[serde(default = "yes", rename = "bgpAdvertise")]
    pub bgp_advertise: bool,
}

/// Address counts of one family (saturating at 2^63-1 for huge IPv6 pools).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct FamilyUsage {
    /// Addresses of this family the pool hands out (network and broadcast addresses left
    /// out by `avoidBuggyIPs` not counted).
    pub total: i64,
    /// Of those, addresses claimed by a Service or reserved.
    pub used: i64,
    /// Of those, addresses free to hand out.
    pub free: i64,
}

/// What the controller (its leader) last saw of the pool: address counts and conditions.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[schemars(transform = schema::prose)]
pub struct AddressPoolStatus {
    /// IPv4 address counts (saturating at 2^63-1).
    #[serde(default)]
    pub ipv4: FamilyUsage,
    /// IPv6 address counts (saturating at 2^63-1 for huge pools).
    #[serde(default)]
    pub ipv6: FamilyUsage,
    /// `Ready` (the pool is valid and hands out addresses), `Overlapping` (it shares
    /// addresses with another pool, named in the message), `Exhausted` (a family it serves
    /// has no free address).
    #[serde(default)]
    pub conditions: Vec<StatusCondition>,
}

/// What the pools are computed from: the `AddressPool` resources and namespace labels.
pub struct Pools {
    pub api: kube::Api<AddressPool>,
    /// `None` when the AddressPool CRD is not installed: the flag pools only.
    pub store: Option<Store<AddressPool>>,
    /// Namespace labels, for `namespaceSelector` (metadata only).
    pub namespaces: Store<PartialObjectMeta<Namespace>>,
    /// Something a pool status shows may have changed (allocation, release, pool edit).
    pub changed: Notify,
    /// The pools of kube-loxilb's `LoxiURL` resources of type `cidrpool` ([`cidrpool_spec`]).
    cidrpools: std::sync::Mutex<Vec<PoolSpec>>,
}

/// The pool of a kube-loxilb `LoxiURL` resource of type `cidrpool` named `name`, whose
/// `spec.loxiURL` is `cidrs` (comma-separated CIDRs or ranges, either family): as kube-loxilb,
/// a named pool for the Services that name it in `loxilb.io/poolSelect` only, never handed
/// out to the others (docs/migration.md#loxiurl-resources).
pub fn cidrpool_spec(name: &str, cidrs: &str) -> PoolSpec {
    PoolSpec {
        name: name.to_string(),
        addresses: cidrs
            .split(',')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(str::to_string)
            .collect(),
        auto_assign: false,
        avoid_buggy_ips: true,
        priority: 0,
        disabled: false,
        namespace_selector: None,
        service_selector: None,
        retain: None,
        advertise: true,
    }
}

/// `resources` (validated `AddressPool`s, by name) with the `cidrpools` whose names no
/// resource takes.
pub fn with_cidrpools(
    mut resources: Vec<(String, Result<PoolDef, Vec<String>>)>,
    cidrpools: &[PoolSpec],
) -> Vec<(String, Result<PoolDef, Vec<String>>)> {
    for spec in cidrpools {
        if !resources.iter().any(|(name, _)| *name == spec.name) {
            resources.push((spec.name.clone(), validate_pool(spec)));
        }
    }
    resources
}

fn raw_selector(s: &LabelSelector) -> RawSelector {
    RawSelector {
        match_labels: s.match_labels.clone(),
        match_expressions: s
            .match_expressions
            .iter()
            .map(|r| RawRequirement {
                key: r.key.clone(),
                operator: r.operator.clone(),
                values: r.values.clone(),
            })
            .collect(),
    }
}

/// The domain's view of a resource.
pub fn to_spec(pool: &AddressPool) -> PoolSpec {
    PoolSpec {
        name: pool.name_any(),
        addresses: pool.spec.addresses.clone(),
        auto_assign: pool.spec.auto_assign,
        avoid_buggy_ips: pool.spec.avoid_buggy_ips,
        priority: pool.spec.priority,
        disabled: pool.spec.disabled,
        namespace_selector: pool.spec.namespace_selector.as_ref().map(raw_selector),
        service_selector: pool.spec.service_selector.as_ref().map(raw_selector),
        retain: pool.spec.retain_addresses.clone(),
        advertise: pool.spec.bgp_advertise,
    }
}

impl Pools {
    pub fn new(
        api: kube::Api<AddressPool>,
        store: Option<Store<AddressPool>>,
        namespaces: Store<PartialObjectMeta<Namespace>>,
    ) -> Pools {
        Pools {
            api,
            store,
            namespaces,
            changed: Notify::new(),
            cidrpools: std::sync::Mutex::default(),
        }
    }

    /// The `cidrpool` `LoxiURL` resources' pools are now `pools`; the caller refreshes the
    /// set (`Ipam::refresh_pools`).
    pub fn set_cidrpools(&self, pools: Vec<PoolSpec>) {
        *self
            .cidrpools
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = pools;
    }

    /// Why a `cidrpool` named `name` cannot be a pool: the name is taken by an `AddressPool`
    /// or a pool from the flags (`flags`).
    pub fn name_taken(&self, name: &str, flags: &[Pool]) -> Option<String> {
        if flags.iter().any(|p| p.name == name) {
            return Some(format!(
                "the pool name {name:?} is taken by a pool from the command line (--external-cidr, --cidr-pools, ...)"
            ));
        }
        let resource = self
            .store
            .as_ref()
            .is_some_and(|s| s.get(&ObjectRef::new(name)).is_some());
        resource.then(|| format!("the pool name {name:?} is taken by the AddressPool {name:?}"))
    }

    /// Labels of namespace `ns` (none when it is not in the store).
    pub fn namespace_labels(&self, ns: &str) -> BTreeMap<String, String> {
        self.namespaces
            .get(&ObjectRef::new(ns))
            .and_then(|n| n.metadata.labels.clone())
            .unwrap_or_default()
    }

    /// The pool set from the flags and the resources in the store now. A pool being deleted
    /// is gone already: it hands out nothing more, and what it handed out stays.
    pub fn compute(&self, flags: &[Pool], secondary: &[Pool]) -> PoolSet {
        let resources = self
            .store
            .as_ref()
            .map(|s| s.state())
            .unwrap_or_default()
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(|p| (p.name_any(), validate_pool(&to_spec(p))))
            .collect();
        let cidrpools = self
            .cidrpools
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        merge_pools(flags, secondary, with_cidrpools(resources, &cidrpools))
    }

    /// Logs the invalid pools of `set` that `before` did not already have as they are.
    pub fn log_invalid(&self, set: &PoolSet, before: Option<&PoolSet>) {
        for (name, problems) in &set.invalid {
            if before.and_then(|b| b.invalid.get(name)) != Some(problems) {
                warn!(pool = %name, problems = %problems.join("; "), "address pool ignored: invalid");
            }
        }
    }
}

fn clamp(v: u128) -> i64 {
    v.min(i64::MAX as u128) as i64
}

fn usage(ipam: &Allocator, pool: &str, family: Family) -> FamilyUsage {
    FamilyUsage {
        total: clamp(ipam.total_in(pool, family)),
        used: ipam.used_in_family(pool, family) as i64,
        free: clamp(ipam.free_in(pool, family)),
    }
}

fn cond(type_: &str, ok: Option<bool>, reason: &str, message: String) -> StatusCondition {
    let status = match ok {
        Some(true) => "True",
        Some(false) => "False",
        None => "Unknown",
    };
    StatusCondition::new(type_, status, reason, message)
}

/// What the pool's status should say (transition times left empty).
pub fn desired_status(pool: &AddressPool, set: &PoolSet, ipam: &Allocator) -> AddressPoolStatus {
    let name = pool.name_any();
    let mut conditions = match (set.get(&name), set.invalid.get(&name)) {
        (Some(def), _) => {
            let ready = if def.disabled {
                cond(
                    COND_READY,
                    Some(false),
                    "Disabled",
                    "disabled: hands out no new address; addresses in use stay".into(),
                )
            } else {
                cond(
                    COND_READY,
                    Some(true),
                    "Valid",
                    "hands out addresses".into(),
                )
            };
            let overlapping = match set.overlaps.get(&name) {
                Some(lines) => cond(COND_OVERLAPPING, Some(true), "Overlap", lines.join("; ")),
                None => cond(COND_OVERLAPPING, Some(false), "NoOverlap", String::new()),
            };
            let full: Vec<String> = [Family::V4, Family::V6]
                .into_iter()
                .filter(|f| ipam.total_in(&name, *f) > 0 && ipam.free_in(&name, *f) == 0)
                .map(|f| format!("no free {f} address"))
                .collect();
            let exhausted = if full.is_empty() {
                cond(COND_EXHAUSTED, Some(false), "HasFree", String::new())
            } else {
                cond(COND_EXHAUSTED, Some(true), "Exhausted", full.join("; "))
            };
            vec![ready, overlapping, exhausted]
        }
        (None, problems) => {
            let message = problems.map(|p| p.join("; ")).unwrap_or_default();
            vec![
                cond(COND_READY, Some(false), "InvalidSpec", message),
                cond(COND_OVERLAPPING, None, "InvalidSpec", String::new()),
                cond(COND_EXHAUSTED, None, "InvalidSpec", String::new()),
            ]
        }
    };
    for c in &mut conditions {
        c.observed_generation = pool.metadata.generation;
    }
    AddressPoolStatus {
        ipv4: usage(ipam, &name, Family::V4),
        ipv6: usage(ipam, &name, Family::V6),
        conditions,
    }
}

fn condition<'a>(
    status: Option<&'a AddressPoolStatus>,
    type_: &str,
) -> Option<&'a StatusCondition> {
    status?.conditions.iter().find(|c| c.type_ == type_)
}

/// Equal but for transition times.
fn same(have: Option<&AddressPoolStatus>, want: &AddressPoolStatus) -> bool {
    let Some(have) = have else {
        return false;
    };
    let strip = |s: &AddressPoolStatus| {
        let mut s = s.clone();
        for c in &mut s.conditions {
            c.last_transition_time.clear();
        }
        s
    };
    strip(have) == *want
}

impl Ipam {
    /// Writes every pool's status that differs from what it shows (leader only).
    pub async fn sync_pool_statuses(&self, recorder: &EventRecorder) {
        let Some(store) = &self.pools.store else {
            return;
        };
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        for pool in store.state() {
            if pool.metadata.deletion_timestamp.is_some() {
                continue; // going away: nothing to report
            }
            let want = self.pool_status(&pool);
            let have = pool.status.as_ref();
            if same(have, &want) {
                continue;
            }
            let mut status = want;
            let shown = have.map_or(&[][..], |h| h.conditions.as_slice());
            stamp_all(
                &mut status.conditions,
                shown,
                pool.metadata.generation,
                &now,
            );
            warn_on_change(recorder, &pool, have, &status);
            let name = pool.name_any();
            let patch = json!({
                "apiVersion": "ipam.loxilb.io/v1alpha1",
                "kind": "AddressPool",
                "metadata": { "name": name },
                "status": status,
            });
            let params = PatchParams::apply(FIELD_MANAGER).force();
            match self
                .pools
                .api
                .patch_status(&name, &params, &Patch::Apply(&patch))
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {} // deleted meanwhile
                Err(e) => warn!(pool = %name, error = %e, "could not write pool status"),
            }
        }
    }

    /// The leader's pool status writer: at once when something changed (coalescing bursts),
    /// and once a minute in case a write was lost. Runs while `running` says so.
    pub async fn pool_status_loop(&self, recorder: &EventRecorder, running: impl Fn() -> bool) {
        if self.pools.store.is_none() {
            return;
        }
        while running() {
            self.sync_pool_statuses(recorder).await;
            tokio::select! {
                _ = self.pools.changed.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(60)) => {}
            }
            // A burst of allocations becomes one write per pool.
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// Warning Events for what an operator must fix: a spec that does not validate, and pools
/// overlapping. Once per change, not at every write.
fn warn_on_change(
    recorder: &EventRecorder,
    pool: &AddressPool,
    have: Option<&AddressPoolStatus>,
    want: &AddressPoolStatus,
) {
    let changed = |type_: &str| {
        let now = condition(Some(want), type_);
        let before = condition(have, type_);
        now.is_some_and(|n| {
            n.status == "True" && type_ == COND_OVERLAPPING
                || n.reason == "InvalidSpec" && type_ == COND_READY
        }) && now.map(|n| (&n.status, &n.reason, &n.message))
            != before.map(|b| (&b.status, &b.reason, &b.message))
    };
    for (type_, reason) in [
        (COND_READY, "InvalidPool"),
        (COND_OVERLAPPING, "PoolOverlap"),
    ] {
        if !changed(type_) {
            continue;
        }
        let note = condition(Some(want), type_)
            .map(|c| c.message.clone())
            .unwrap_or_default();
        let event = Event {
            type_: EventType::Warning,
            reason: reason.to_string(),
            note: Some(crate::k8s::events::note_text(&note)),
            action: "Validate".to_string(),
            secondary: None,
        };
        recorder.publish(event, pool.object_ref(&()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(name: &str, addresses: &[&str]) -> AddressPool {
        let mut p = AddressPool::new(
            name,
            AddressPoolSpec {
                addresses: addresses.iter().map(|a| a.to_string()).collect(),
                auto_assign: true,
                avoid_buggy_ips: true,
                priority: 0,
                disabled: false,
                namespace_selector: None,
                service_selector: None,
                retain_addresses: None,
                bgp_advertise: true,
            },
        );
        p.metadata.generation = Some(3);
        p
    }

    fn set_of(pools: &[&AddressPool]) -> PoolSet {
        merge_pools(
            &[],
            &[],
            pools
                .iter()
                .map(|p| (p.name_any(), validate_pool(&to_spec(p))))
                .collect(),
        )
    }

    #[test]
    fn spec_defaults_follow_the_crd() {
        let spec: AddressPoolSpec =
            serde_json::from_value(json!({ "addresses": ["192.0.2.0/24"] })).unwrap();
        assert!(spec.auto_assign && spec.avoid_buggy_ips && !spec.disabled);
        assert_eq!(spec.priority, 0);
        let back = serde_json::to_value(&spec).unwrap();
        assert_eq!(back["avoidBuggyIPs"], json!(true));
    }

    #[test]
    fn status_counts_and_conditions() {
        let a = pool("a", &["192.0.2.0/30", "2001:db8::/126"]);
        let b = pool("b", &["192.0.2.2-192.0.2.9"]);
        let set = set_of(&[&a, &b]);
        let mut ipam = Allocator::new(set.pools());
        ipam.allocate_new("x", Some("a"), Family::V4).unwrap();
        ipam.allocate_new("y", Some("a"), Family::V4).unwrap();
        let s = desired_status(&a, &set, &ipam);
        assert_eq!(
            s.ipv4,
            FamilyUsage {
                total: 2,
                used: 2,
                free: 0
            }
        );
        assert_eq!(s.ipv6.total, 3);
        let get = |t: &str| s.conditions.iter().find(|c| c.type_ == t).unwrap();
        assert_eq!(get(COND_READY).status, "True");
        assert_eq!(get(COND_OVERLAPPING).status, "True");
        assert!(get(COND_OVERLAPPING).message.contains("pool \"b\""));
        assert_eq!(get(COND_EXHAUSTED).message, "no free IPv4 address");
        assert!(
            s.conditions
                .iter()
                .all(|c| c.observed_generation == Some(3))
        );
        assert!(same(Some(&s), &s));
        let mut other = s.clone();
        other.ipv4.used = 1;
        assert!(!same(Some(&other), &s));
    }

    #[test]
    fn invalid_pools_say_why() {
        let bad = pool("bad", &["192.0.2.0/33"]);
        let set = set_of(&[&bad]);
        let s = desired_status(&bad, &set, &Allocator::new(set.pools()));
        let ready = &s.conditions[0];
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "InvalidSpec")
        );
        assert!(ready.message.contains("192.0.2.0/33"), "{}", ready.message);
    }
}
