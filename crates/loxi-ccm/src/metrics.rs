//! Prometheus metrics. Labels are low-cardinality by construction: results and error
//! categories are fixed strings, instances are the configured loxilb URLs.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::time::Duration;

use loxilb_client::ClientError;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    pub result: String,
    /// What failed, for `result="error"` (`crate::service::error::ReconcileError::category`:
    /// loxilb's errors by the client's classification); `none` otherwise.
    pub category: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InstanceLabels {
    pub instance: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    pub instance: String,
    pub op: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InstanceReasonLabels {
    pub instance: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BgpSessionLabels {
    pub loxilb: String,
    pub peer: String,
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HaRoleLabels {
    /// The HA instance (`llb-inst0`, ...).
    pub ha_instance: String,
    pub loxilb: String,
    pub role: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HaInstanceLabels {
    pub ha_instance: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdvertisementLabels {
    pub loxilb: String,
    /// `announce` (a rule created with `bgp: true`) or `withdraw` (deleted with `?bgp=true`).
    pub change: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupLabels {
    /// The group of loxilbs (kube-loxilb's zone).
    pub group: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupStateLabels {
    pub group: String,
    /// `serving`, `joining` (programmed before it serves) or `down`.
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MetadataLabels {
    pub instance: String,
    /// `full` (everything: a loxilb new to us or restarted, or after a removal) or `changes`.
    pub body: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub pool: String,
    pub state: String,
}

fn latency_histogram() -> Histogram {
    // 0.5 ms .. ~16 s
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// A handle on the metrics: clones share the same registry and values.
#[derive(Clone)]
pub struct Metrics {
    registry: std::sync::Arc<Registry>,
    reconciles: Family<ReconcileLabels, Counter>,
    reconcile_seconds: Histogram,
    loxilb_calls: Family<CallLabels, Counter>,
    loxilb_call_seconds: Family<InstanceLabels, Histogram, fn() -> Histogram>,
    loxilb_up: Family<InstanceLabels, Gauge>,
    loxilb_rules: Family<InstanceLabels, Gauge>,
    loxilb_capacity: Family<InstanceLabels, Gauge>,
    loxilb_limit_hits: Family<InstanceReasonLabels, Counter>,
    loxilb_replays: Family<InstanceReasonLabels, Counter>,
    write_queue: Family<InstanceLabels, Gauge>,
    write_queue_oldest: Family<InstanceLabels, Gauge<f64, AtomicU64>>,
    write_window: Family<InstanceLabels, Gauge>,
    writes_superseded: Family<InstanceLabels, Counter>,
    writes_unanswered: Family<InstanceLabels, Counter>,
    k8s_metadata_objects: Family<MetadataLabels, Counter>,
    bgp_sessions: Family<BgpSessionLabels, Gauge>,
    ha_roles: Family<HaRoleLabels, Gauge>,
    ha_failovers: Family<HaInstanceLabels, Counter>,
    bgp_session_drops: Family<BgpSessionLabels, Counter>,
    bgp_advertisement_changes: Family<AdvertisementLabels, Counter>,
    pool_addresses: Family<PoolLabels, Gauge<i64, AtomicI64>>,
    group_loxilbs: Family<GroupStateLabels, Gauge>,
    group_capacity: Family<GroupLabels, Gauge>,
    group_placed_rules: Family<GroupLabels, Gauge>,
    endpoints_dropped: Gauge,
    services_not_programmed: Family<ReasonLabels, Gauge>,
    egresses_programmed: Gauge,
    egresses_not_programmed: Family<ReasonLabels, Gauge>,
    events_dropped: Counter,
    leader: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("loxi_ccm");
        let reconciles = Family::<ReconcileLabels, Counter>::default();
        registry.register(
            "reconciles",
            "Service reconciles by result (success, error, invalid) and, for errors, category",
            reconciles.clone(),
        );
        let reconcile_seconds = latency_histogram();
        registry.register(
            "reconcile_duration_seconds",
            "Time spent in one Service reconcile",
            reconcile_seconds.clone(),
        );
        let loxilb_calls = Family::<CallLabels, Counter>::default();
        registry.register(
            "loxilb_calls",
            "loxilb API calls by instance, operation and result (ok or error category)",
            loxilb_calls.clone(),
        );
        let loxilb_call_seconds: Family<InstanceLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(latency_histogram);
        registry.register(
            "loxilb_call_duration_seconds",
            "Latency of loxilb API calls",
            loxilb_call_seconds.clone(),
        );
        let loxilb_up = Family::<InstanceLabels, Gauge>::default();
        registry.register(
            "loxilb_up",
            "1 when the loxilb instance answers its liveness probe",
            loxilb_up.clone(),
        );
        let loxilb_rules = Family::<InstanceLabels, Gauge>::default();
        registry.register(
            "loxilb_rules",
            "Load-balancer rules the instance is known to hold",
            loxilb_rules.clone(),
        );
        let loxilb_capacity = Family::<InstanceLabels, Gauge>::default();
        registry.register(
            "loxilb_rule_capacity",
            "Rules the instance can hold: the configured size, or less when loxilb refused \
             a rule earlier (rule-hwm)",
            loxilb_capacity.clone(),
        );
        let loxilb_limit_hits = Family::<InstanceReasonLabels, Counter>::default();
        registry.register(
            "loxilb_limit_hits",
            "Services' new rules held back by a loxilb limit, predicted or refused by loxilb \
             (reason CapacityExceeded or SourceRangesUnsupported)",
            loxilb_limit_hits.clone(),
        );
        let loxilb_replays = Family::<InstanceReasonLabels, Counter>::default();
        registry.register(
            "loxilb_replays",
            "Full replays of every rule to an instance, by cause (came_back: reachable again; \
             lost_rules: it no longer held rules it had)",
            loxilb_replays.clone(),
        );
        let write_queue = Family::<InstanceLabels, Gauge>::default();
        registry.register(
            "loxilb_write_queue",
            "Rule writes waiting for their turn in the instance's write window",
            write_queue.clone(),
        );
        let write_queue_oldest = Family::<InstanceLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "loxilb_write_queue_oldest_seconds",
            "How long the oldest waiting rule write of the instance has waited",
            write_queue_oldest.clone(),
        );
        let write_window = Family::<InstanceLabels, Gauge>::default();
        registry.register(
            "loxilb_write_window",
            "Rule writes allowed in flight to the instance at once (learnt from how fast it \
             answers, at most --loxilb-write-window)",
            write_window.clone(),
        );
        let writes_superseded = Family::<InstanceLabels, Counter>::default();
        registry.register(
            "loxilb_writes_superseded",
            "Waiting rule writes dropped unsent because a newer write of the same rule came",
            writes_superseded.clone(),
        );
        let k8s_metadata_objects = Family::<MetadataLabels, Counter>::default();
        registry.register(
            "k8s_metadata_objects_sent",
            "Services, pods and Nodes sent to a loxilb as Kubernetes metadata (--enableK8sMetadata), by body: full or changes",
            k8s_metadata_objects.clone(),
        );
        let writes_unanswered = Family::<InstanceLabels, Counter>::default();
        registry.register(
            "loxilb_writes_unanswered",
            "Rule writes that got no answer within --loxilb-timeout (their outcome is read back \
             from a listing; the instance is not taken for down)",
            writes_unanswered.clone(),
        );
        let bgp_sessions = Family::<BgpSessionLabels, Gauge>::default();
        registry.register(
            "bgp_sessions",
            "BGP sessions of each loxilb with each configured peer: 1 for the session's current \
             state (ESTABLISHED, ACTIVE, ...)",
            bgp_sessions.clone(),
        );
        let ha_roles = Family::<HaRoleLabels, Gauge>::default();
        registry.register(
            "ha_roles",
            "HA roles (--set-roles): 1 for the role (MASTER or BACKUP) each loxilb was given \
             for each HA instance",
            ha_roles.clone(),
        );
        let ha_failovers = Family::<HaInstanceLabels, Counter>::default();
        registry.register(
            "ha_failovers",
            "Times an HA instance's MASTER role moved to another loxilb because its master \
             stopped answering",
            ha_failovers.clone(),
        );
        let bgp_session_drops = Family::<BgpSessionLabels, Counter>::default();
        registry.register(
            "bgp_session_drops",
            "BGP sessions that left ESTABLISHED, by loxilb, peer and the state they went to",
            bgp_session_drops.clone(),
        );
        let bgp_advertisement_changes = Family::<AdvertisementLabels, Counter>::default();
        registry.register(
            "bgp_advertisement_changes",
            "Changes of loxilb's per-address advertisement count made by rule calls: announce \
             (a rule created with bgp) or withdraw (a rule deleted with ?bgp=true)",
            bgp_advertisement_changes.clone(),
        );
        let pool_addresses = Family::<PoolLabels, Gauge<i64, AtomicI64>>::default();
        registry.register(
            "pool_addresses",
            "Addresses per pool and state (total, used)",
            pool_addresses.clone(),
        );
        let endpoints_dropped = Gauge::default();
        registry.register(
            "endpoints_dropped",
            "Candidate endpoints left out by loxilb's 32-endpoint limit, summed over Services",
            endpoints_dropped.clone(),
        );
        let services_not_programmed = Family::<ReasonLabels, Gauge>::default();
        registry.register(
            "services_not_programmed",
            "Services served by this replica whose loxilb.io/Programmed condition is False, by \
             the condition's reason (CapacityExceeded, LoxilbUnavailable, PoolExhausted, ...)",
            services_not_programmed.clone(),
        );
        let egresses_programmed = Gauge::default();
        registry.register(
            "egresses_programmed",
            "kube-loxilb Egresses (--egress) whose Programmed condition is True: every source \
             NATed on every reachable loxilb",
            egresses_programmed.clone(),
        );
        let egresses_not_programmed = Family::<ReasonLabels, Gauge>::default();
        registry.register(
            "egresses_not_programmed",
            "kube-loxilb Egresses (--egress) whose Programmed condition is not True, by the \
             condition's reason",
            egresses_not_programmed.clone(),
        );
        let events_dropped = Counter::default();
        registry.register(
            "events_dropped",
            "Kubernetes Events not published because the event queue was full",
            events_dropped.clone(),
        );
        let group_loxilbs = Family::<GroupStateLabels, Gauge>::default();
        registry.register(
            "group_loxilbs",
            "loxilbs of each group (kube-loxilb's zone) by state: serving, joining (programmed \
             before it serves) or down",
            group_loxilbs.clone(),
        );
        let group_capacity = Family::<GroupLabels, Gauge>::default();
        registry.register(
            "group_rule_capacity",
            "Rules each loxilb of the group holds at most (the smallest table among them): \
             what placement by capacity fills",
            group_capacity.clone(),
        );
        let group_placed_rules = Family::<GroupLabels, Gauge>::default();
        registry.register(
            "group_placed_rules",
            "Rules of the Services placed on the group, as placement counted them at its last \
             decision",
            group_placed_rules.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease and writes",
            leader.clone(),
        );
        Metrics {
            leader,
            registry: std::sync::Arc::new(registry),
            reconciles,
            reconcile_seconds,
            loxilb_calls,
            loxilb_call_seconds,
            loxilb_up,
            loxilb_rules,
            loxilb_capacity,
            loxilb_limit_hits,
            loxilb_replays,
            write_queue,
            write_queue_oldest,
            write_window,
            writes_superseded,
            writes_unanswered,
            k8s_metadata_objects,
            bgp_sessions,
            ha_roles,
            ha_failovers,
            bgp_session_drops,
            bgp_advertisement_changes,
            pool_addresses,
            group_loxilbs,
            group_capacity,
            group_placed_rules,
            endpoints_dropped,
            services_not_programmed,
            egresses_programmed,
            egresses_not_programmed,
            events_dropped,
        }
    }

    /// One Service reconcile ended with `result`; `category` names what failed (empty: none).
    pub fn reconciled(&self, result: &str, category: &str, took: Duration) {
        self.reconciles
            .get_or_create(&ReconcileLabels {
                result: result.to_string(),
                category: if category.is_empty() {
                    "none"
                } else {
                    category
                }
                .to_string(),
            })
            .inc();
        self.reconcile_seconds.observe(took.as_secs_f64());
    }

    pub fn loxilb_call(&self, instance: &str, op: &str, took: Duration, err: Option<&ClientError>) {
        self.loxilb_calls
            .get_or_create(&CallLabels {
                instance: instance.to_string(),
                op: op.to_string(),
                result: err.map_or("ok", ClientError::category).to_string(),
            })
            .inc();
        self.loxilb_call_seconds
            .get_or_create(&InstanceLabels {
                instance: instance.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    pub fn set_up(&self, instance: &str, up: bool) {
        self.loxilb_up
            .get_or_create(&InstanceLabels {
                instance: instance.to_string(),
            })
            .set(i64::from(up));
    }

    pub fn set_rules(&self, instance: &str, n: usize) {
        self.loxilb_rules
            .get_or_create(&InstanceLabels {
                instance: instance.to_string(),
            })
            .set(n as i64);
    }

    pub fn set_capacity(&self, instance: &str, n: usize) {
        self.loxilb_capacity
            .get_or_create(&InstanceLabels {
                instance: instance.to_string(),
            })
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// A group's loxilbs by state, and its capacity.
    pub fn set_group(
        &self,
        group: &str,
        serving: usize,
        joining: usize,
        down: usize,
        capacity: usize,
    ) {
        for (state, n) in [("serving", serving), ("joining", joining), ("down", down)] {
            self.group_loxilbs
                .get_or_create(&GroupStateLabels {
                    group: group.to_string(),
                    state: state.to_string(),
                })
                .set(n as i64);
        }
        self.group_capacity
            .get_or_create(&GroupLabels {
                group: group.to_string(),
            })
            .set(i64::try_from(capacity).unwrap_or(i64::MAX));
    }

    pub fn set_group_placed_rules(&self, group: &str, n: usize) {
        self.group_placed_rules
            .get_or_create(&GroupLabels {
                group: group.to_string(),
            })
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub fn limit_hit(&self, instance: &str, reason: &str) {
        self.loxilb_limit_hits
            .get_or_create(&InstanceReasonLabels {
                instance: instance.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }

    /// The write window of `instance` as it stands: writes waiting, how long the oldest has
    /// waited, and the writes allowed in flight.
    pub fn set_write_queue(
        &self,
        instance: &str,
        depth: usize,
        oldest: Option<Duration>,
        limit: usize,
    ) {
        let labels = InstanceLabels {
            instance: instance.to_string(),
        };
        self.write_queue
            .get_or_create(&labels)
            .set(i64::try_from(depth).unwrap_or(i64::MAX));
        self.write_queue_oldest
            .get_or_create(&labels)
            .set(oldest.map_or(0.0, |d| d.as_secs_f64()));
        self.write_window
            .get_or_create(&labels)
            .set(i64::try_from(limit).unwrap_or(i64::MAX));
    }

    pub fn write_superseded(&self, instance: &str) {
        self.writes_superseded
            .get_or_create(&InstanceLabels {
                instance: instance.to_string(),
            })
            .inc();
    }

    pub fn write_unanswered(&self, instance: &str) {
        self.writes_unanswered
            .get_or_create(&InstanceLabels {
                instance: instance.to_string(),
            })
            .inc();
    }

    pub fn k8s_metadata_sent(&self, instance: &str, body: &str, objects: usize) {
        self.k8s_metadata_objects
            .get_or_create(&MetadataLabels {
                instance: instance.to_string(),
                body: body.to_string(),
            })
            .inc_by(objects as u64);
    }

    pub fn replayed(&self, instance: &str, reason: &str) {
        self.loxilb_replays
            .get_or_create(&InstanceReasonLabels {
                instance: instance.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }

    pub fn set_pool(&self, pool: &str, total: u128, used: usize) {
        for (state, v) in [
            ("total", total.min(i64::MAX as u128) as i64),
            ("used", used as i64),
        ] {
            self.pool_addresses
                .get_or_create(&PoolLabels {
                    pool: pool.to_string(),
                    state: state.to_string(),
                })
                .set(v);
        }
    }

    /// The session of `loxilb` with `peer` is (`now` true) or is no longer in `state`.
    pub fn set_bgp_session(&self, loxilb: &str, peer: &str, state: &str, now: bool) {
        let labels = BgpSessionLabels {
            loxilb: loxilb.to_string(),
            peer: peer.to_string(),
            state: state.to_string(),
        };
        if now {
            self.bgp_sessions.get_or_create(&labels).set(1);
        } else {
            self.bgp_sessions.remove(&labels);
        }
    }

    /// A loxilb left the fleet: its gauges go (a series left behind would keep saying it is
    /// up, or holds rules). Its counters stay: they are history, and Prometheus expects
    /// counters not to vanish while the process runs. Called once nothing of it runs any
    /// more (`crate::fleet::Fleet::set_source`), so nothing sets them again.
    pub fn forget_loxilb(&self, instance: &str) {
        let labels = InstanceLabels {
            instance: instance.to_string(),
        };
        self.loxilb_up.remove(&labels);
        self.loxilb_rules.remove(&labels);
        self.loxilb_capacity.remove(&labels);
        self.write_queue.remove(&labels);
        self.write_queue_oldest.remove(&labels);
        self.write_window.remove(&labels);
    }

    /// A loxilb that left a group: its role series for that group's HA instances go.
    pub fn forget_ha_roles(&self, loxilb: &str, ha_instances: &[String]) {
        for ha in ha_instances {
            for role in ["MASTER", "BACKUP"] {
                self.ha_roles.remove(&HaRoleLabels {
                    ha_instance: ha.clone(),
                    loxilb: loxilb.to_string(),
                    role: role.to_string(),
                });
            }
        }
    }

    /// `loxilb` now holds `role` for `ha_instance` (its other role's series is removed).
    pub fn set_ha_role(&self, ha_instance: &str, loxilb: &str, role: &str) {
        for r in ["MASTER", "BACKUP"] {
            let labels = HaRoleLabels {
                ha_instance: ha_instance.to_string(),
                loxilb: loxilb.to_string(),
                role: r.to_string(),
            };
            if r == role {
                self.ha_roles.get_or_create(&labels).set(1);
            } else {
                self.ha_roles.remove(&labels);
            }
        }
    }

    pub fn ha_failover(&self, ha_instance: &str) {
        self.ha_failovers
            .get_or_create(&HaInstanceLabels {
                ha_instance: ha_instance.to_string(),
            })
            .inc();
    }

    /// The session of `loxilb` with `peer` left ESTABLISHED for `state`.
    pub fn bgp_session_dropped(&self, loxilb: &str, peer: &str, state: &str) {
        self.bgp_session_drops
            .get_or_create(&BgpSessionLabels {
                loxilb: loxilb.to_string(),
                peer: peer.to_string(),
                state: state.to_string(),
            })
            .inc();
    }

    /// A rule call changed loxilb's advertisement count of its address (`announce` or
    /// `withdraw`).
    pub fn bgp_advertisement_changed(&self, loxilb: &str, change: &str) {
        self.bgp_advertisement_changes
            .get_or_create(&AdvertisementLabels {
                loxilb: loxilb.to_string(),
                change: change.to_string(),
            })
            .inc();
    }

    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    pub fn set_endpoints_dropped(&self, n: usize) {
        self.endpoints_dropped.set(n as i64);
    }

    /// After an Egress pass: how many Egresses are programmed, and how many are not, by
    /// reason (a reason seen before and not now is kept at 0).
    pub fn set_egresses(&self, programmed: usize, not_programmed: &BTreeMap<String, usize>) {
        self.egresses_programmed.set(programmed as i64);
        // The reasons of loxi_domain::egress::status, so each series exists from the start.
        let known = [
            "NotAccepted",
            "SourceConflict",
            "NoLoxilb",
            "LoxilbNotProgrammed",
        ];
        let reasons = known
            .iter()
            .map(|r| r.to_string())
            .chain(not_programmed.keys().cloned())
            .collect::<std::collections::BTreeSet<String>>();
        for reason in &reasons {
            let n = not_programmed.get(reason).copied().unwrap_or(0);
            self.egresses_not_programmed
                .get_or_create(&ReasonLabels {
                    reason: reason.clone(),
                })
                .set(n as i64);
        }
    }

    /// `n` Services are not programmed for `reason` (0 keeps the series, at 0).
    pub fn set_services_not_programmed(&self, reason: &str, n: usize) {
        self.services_not_programmed
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// The counter the Service controller's `EventRecorder` increments.
    pub fn events_dropped(&self) -> Counter {
        self.events_dropped.clone()
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
