//! The loxilb instances: a cache of the rules each one holds, health, loxilb's limits, and
//! applying a diff.
//!
//! Per-Service reconciles read the cache instead of listing loxilb each time; a full listing
//! refreshes it at start-up, after an instance comes back, and at every drift check. All
//! writes to one instance go through its lock, so a drift check and a reconcile never race
//! on the same rules (loxilb serializes its config calls anyway, docs/loxilb-api.md#transport).
//!
//! Rule state is not replicated between loxilb instances (docs/loxilb-api.md#restarts): each
//! instance is programmed, probed and repaired on its own.
//!
//! ## Noticing a restart
//!
//! A loxilb that restarts between two probes answers as if nothing happened, but holds
//! nothing (docs/loxilb-api.md#detecting-a-restart). Listing every rule at every probe would
//! show it, at the price of a 6 MB listing every few seconds on a full instance. Instead,
//! before its first listing of an instance, the controller places a *restart marker*: a
//! cluster-instance entry named `loxi-ccm.<cluster id>` in state `NOT_DEFINED`
//! (`POST /config/cistate`). Creating an unknown instance in the state it is created in
//! changes nothing in loxilb (no VIP, no BGP preference: docs/loxilb-api.md#ha-roles), and a
//! restart drops it like every other state. A probe then reads the small
//! `GET /config/cistate/all`: marker gone means restarted, and every rule is replayed. A
//! loxilb that refuses the marker is probed by listing its rules instead. Rules deleted
//! behind our back without a restart are put back by the drift check.
//!
//! ## loxilb's limits (docs/loxilb-api.md#limits)
//!
//! loxilb refuses the rule after its table is full (403 `rule-hwm error`), and refuses
//! `allowedSources` on a rule whose internal index is above 28 (400 `rule-allowed-src
//! error`). Neither is worth retrying until something changes on that instance, so the cache
//! is used to see them coming and a new rule is not POSTed when it would hit one:
//!
//! - **Capacity**: the instance holds `held` rules (every rule it listed, whoever owns it,
//!   plus what we created since); a Service's new rules are created only if all of them fit
//!   under the capacity (2048 by default, [`Fleet::set_capacity`]). A Service is never left
//!   half-created by the limit: if loxilb still answers 403 (its table is smaller than
//!   configured, or someone else filled it since our last listing), the rules of that Service
//!   created in the same pass are deleted again, and the capacity learned from the refusal
//!   (the number of rules loxilb then lists) is used until the instance restarts.
//! - **Source ranges**: loxilb allocates indexes 1, 2, 3, ... and reuses freed ones last-in
//!   first-out, and never shows them. The index a new rule gets is *estimated* as `held + 1`
//!   (`held + k` for the k-th new rule of a Service, rules with source ranges first). That is
//!   exact while the index space has no holes (nothing was deleted since loxilb started, or
//!   every freed index was reused). With holes it can be wrong both ways: too pessimistic
//!   when a low index is free (loxilb would have reused it), too optimistic when the latest
//!   freed index is above 28. The second case is caught by loxilb's own 400, which is
//!   reported the same way.
//!
//! A rule refused for a limit (predicted or answered) is remembered with the exact rule sent
//! and not sent again unchanged until room frees on that instance (a rule deleted there, a
//! listing showing fewer rules, a restart). Services waiting for room register a requeue
//! sender and are woken then, so a full instance costs no calls and no retry storm.

pub mod bgp;
mod roles;

pub use roles::HaSettings;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use futures::StreamExt;
use loxi_domain::{Action, ClusterId, Rule, RuleKey, RuleName, diff_rules};
use loxilb_client::convert::{from_entry, to_entry};
use loxilb_client::{ClientError, LoxilbClient};
use tokio::sync::Mutex;
use tracing::{debug, info, warn};

use crate::metrics::Metrics;

/// loxilb's rule table: internal indexes 1..=2048, the next rule is refused with 403
/// `rule-hwm error` (docs/loxilb-api.md#limits).
pub const DEFAULT_CAPACITY: usize = 2048;

/// Services whose new rules a replay sends at once, unless set (`--concurrency`).
pub const DEFAULT_PARALLEL_CALLS: usize = 16;

/// loxilb installs `allowedSources` only on rules with an internal index up to this
/// (docs/loxilb-api.md#source-ranges).
pub const MAX_ALLOWED_SOURCES_INDEX: usize = 28;

/// Condition reason / Event reason for [`Blocked::Capacity`]; the same as
/// `ClientError::Capacity`'s category, so a raw 403 and a predicted one read alike.
pub const REASON_CAPACITY: &str = "CapacityExceeded";
/// Condition reason / Event reason for [`Blocked::SourceRanges`].
pub const REASON_SOURCE_RANGES: &str = "SourceRangesUnsupported";

/// The Service a rule belongs to (namespace and name, as rule names carry them): the opaque
/// key a Service waiting for room is re-queued by. This subsystem knows no Kubernetes types.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleOwner {
    pub namespace: String,
    pub name: String,
}

impl RuleOwner {
    pub fn new(namespace: &str, name: &str) -> RuleOwner {
        RuleOwner {
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }
}

/// Where Services waiting for room on an instance are sent when room frees.
#[derive(Clone)]
pub struct Requeue(Arc<dyn Fn(&RuleOwner) + Send + Sync>);

impl Requeue {
    pub fn new(send: impl Fn(&RuleOwner) + Send + Sync + 'static) -> Requeue {
        Requeue(Arc::new(send))
    }

    fn send(&self, owner: &RuleOwner) {
        (self.0)(owner)
    }
}

impl fmt::Debug for Requeue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Requeue")
    }
}

/// Why some of a Service's rules are not on an instance: one of loxilb's limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Blocked {
    /// The Service's new rules do not all fit in the instance's rule table.
    Capacity {
        /// Rules the instance holds (all owners).
        held: usize,
        /// Rules the Service still needs there.
        new: usize,
        capacity: usize,
        /// loxilb answered 403 (else: predicted, nothing was sent).
        refused: bool,
    },
    /// A rule with source ranges would not get one of the first 28 indexes.
    SourceRanges {
        key: RuleKey,
        /// The estimated index (see the module documentation); `None` when loxilb refused.
        index: Option<usize>,
    },
}

impl Blocked {
    pub fn reason(&self) -> &'static str {
        match self {
            Blocked::Capacity { .. } => REASON_CAPACITY,
            Blocked::SourceRanges { .. } => REASON_SOURCE_RANGES,
        }
    }
}

impl fmt::Display for Blocked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Blocked::Capacity {
                held,
                new,
                capacity,
                refused,
            } => {
                if *refused {
                    write!(
                        f,
                        "loxilb refused a new rule: its rule table is full ({held} rules, rule-hwm)"
                    )?;
                } else {
                    write!(
                        f,
                        "{new} new rule(s) do not fit: it holds {held} of {capacity} rules"
                    )?;
                }
                f.write_str("; programmed when rules are deleted there")
            }
            Blocked::SourceRanges { key, index } => {
                write!(
                    f,
                    "{key} has loadBalancerSourceRanges, which loxilb applies only to its first \
                     {MAX_ALLOWED_SOURCES_INDEX} rules"
                )?;
                match index {
                    Some(i) => write!(f, "; it would be about rule {i}")?,
                    None => f.write_str("; loxilb refused it (rule-allowed-src)")?,
                }
                f.write_str("; retried when rules are deleted there")
            }
        }
    }
}

/// The rules an instance holds, by key, with an index by owning Service so that applying
/// one Service's rules looks at that Service's rules only (not every rule held).
#[derive(Debug, Default)]
struct RuleTable {
    rules: HashMap<RuleKey, Rule>,
    /// (namespace, Service) named by a rule's name (any cluster) -> its keys.
    by_service: HashMap<(String, String), HashSet<RuleKey>>,
}

impl RuleTable {
    fn owner(rule: &Rule) -> Option<(String, String)> {
        RuleName::parse(&rule.name).map(|n| (n.namespace, n.service))
    }

    fn from_map(rules: HashMap<RuleKey, Rule>) -> RuleTable {
        let mut table = RuleTable {
            rules: HashMap::with_capacity(rules.len()),
            by_service: HashMap::default(),
        };
        for (_, rule) in rules {
            table.insert(rule);
        }
        table
    }

    fn insert(&mut self, rule: Rule) {
        self.remove(&rule.key);
        if let Some(owner) = Self::owner(&rule) {
            self.by_service.entry(owner).or_default().insert(rule.key);
        }
        self.rules.insert(rule.key, rule);
    }

    fn remove(&mut self, key: &RuleKey) -> Option<Rule> {
        let rule = self.rules.remove(key)?;
        if let Some(owner) = Self::owner(&rule)
            && let Some(keys) = self.by_service.get_mut(&owner)
        {
            keys.remove(key);
            if keys.is_empty() {
                self.by_service.remove(&owner);
            }
        }
        Some(rule)
    }

    fn len(&self) -> usize {
        self.rules.len()
    }

    fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    fn get(&self, key: &RuleKey) -> Option<&Rule> {
        self.rules.get(key)
    }

    /// Rules whose name names `namespace/service`.
    fn of_service<'a>(
        &'a self,
        namespace: &str,
        service: &str,
    ) -> impl Iterator<Item = &'a Rule> + 'a {
        self.by_service
            .get(&(namespace.to_string(), service.to_string()))
            .into_iter()
            .flatten()
            .filter_map(|k| self.rules.get(k))
    }
}

/// What the controller knows an instance holds.
#[derive(Debug, Default)]
struct Holdings {
    /// False until the first successful listing, and again after a transport failure.
    known: bool,
    rules: RuleTable,
    /// Listed rules not in `rules` (host or port-range rules, several rules on one key): they
    /// take room in loxilb's table too.
    uncounted: usize,
    /// The capacity loxilb showed by refusing a rule (403 `rule-hwm`), until it restarts.
    learned_capacity: Option<usize>,
    /// Rules refused for a limit, exactly as sent: not sent again unchanged until room frees.
    refused: HashMap<RuleKey, (Rule, Blocked)>,
    /// Services waiting for room here, in the order they started waiting.
    waiters: Waiters,
    /// New rules being created right now (their room is taken before the calls are made).
    reserved: usize,
    /// Keys with a call under way (`Instance::apply_service` makes its calls without the
    /// lock): a listing may or may not show them yet, so they never count as lost.
    in_flight: HashSet<RuleKey>,
    /// The restart marker on this instance (module docs).
    marker: Marker,
    /// Counts marker placements, so that a probe's view older than the last one is ignored.
    marker_epoch: u64,
    /// Counts the times room freed, so that a Service whose pass decided without room can
    /// tell whether room freed before it started waiting (`Holdings::wait_for_room`).
    room_freed_count: u64,
    /// When the table was last listed (`Instance::refresh`).
    listed_at: Option<Instant>,
}

/// A listing younger than this is current enough for a whole-instance pass (`converge_all`):
/// a new leader's first Service pass lists every loxilb, and its replay follows at once.
const FRESH_LISTING: std::time::Duration = std::time::Duration::from_secs(2);

/// The restart marker's state on one instance.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Marker {
    /// To be placed before the next listing (probes list every rule meanwhile).
    #[default]
    NotPlaced,
    Placed,
    /// loxilb refused it (a 4xx): probes list every rule instead, for good.
    Refused,
}

impl Holdings {
    fn held(&self) -> usize {
        self.rules.len() + self.uncounted
    }

    /// Held plus being created: what a capacity check must count.
    fn taken(&self) -> usize {
        self.held() + self.reserved
    }

    /// Room freed (a rule deleted, a restart): limits hit before may pass now.
    fn room_freed(&mut self) {
        self.refused.clear();
        self.room_freed_count += 1;
        self.waiters.wake_all(Instant::now());
    }

    /// `svc` was held back by a limit in a pass that decided when room had freed
    /// `freed_before` times: it waits for room, and is re-queued at once when room freed
    /// since that decision. A pass lets go of the lock for its calls, and room freed
    /// meanwhile woke the waiters of that moment, which did not include `svc` yet: without
    /// this it would wait for a wake-up that already went (found by the fault matrix, a
    /// full loxilb: docs/RELIABILITY.md).
    fn wait_for_room(&mut self, svc: RuleOwner, need: usize, requeue: &Requeue, freed_before: u64) {
        self.waiters.wait(svc.clone(), need, requeue.clone());
        if self.room_freed_count != freed_before {
            requeue.send(&svc);
        }
    }
}

/// How long room that frees is kept for the Services that waited for it, in their order,
/// after they were woken: long enough for their passes to come round, short enough that a
/// waiter whose Service went away unnoticed holds nobody back for long.
const TURN_HOLD: std::time::Duration = std::time::Duration::from_secs(10);

/// Services waiting for room on one instance, first come, first served: when room frees,
/// every waiter is woken (in the order it started waiting), and for a while the room goes to
/// the waiters in that order (each one whose rules fit in what is left), before any Service
/// behind them or new.
#[derive(Debug, Default)]
struct Waiters {
    next: u64,
    order: BTreeMap<u64, RuleOwner>,
    by_service: HashMap<RuleOwner, Waiter>,
    /// Until then, room is kept for the waiters woken last.
    turns_until: Option<Instant>,
}

#[derive(Debug)]
struct Waiter {
    /// Its place in the queue, kept while it waits (also across wake-ups).
    seq: u64,
    /// New rules it needs here.
    need: usize,
    requeue: Requeue,
}

impl Waiters {
    /// `svc` waits for room for `need` rules (keeping its place if it already waits).
    fn wait(&mut self, svc: RuleOwner, need: usize, requeue: Requeue) {
        if let Some(w) = self.by_service.get_mut(&svc) {
            w.need = need;
            w.requeue = requeue;
            return;
        }
        let seq = self.next;
        self.next += 1;
        self.order.insert(seq, svc.clone());
        self.by_service.insert(svc, Waiter { seq, need, requeue });
    }

    /// `svc` no longer waits (served, gone, or wants nothing new).
    fn done(&mut self, svc: &RuleOwner) {
        if let Some(w) = self.by_service.remove(svc) {
            self.order.remove(&w.seq);
        }
    }

    fn wake_all(&mut self, now: Instant) {
        for svc in self.order.values() {
            if let Some(w) = self.by_service.get(svc) {
                w.requeue.send(svc);
            }
        }
        if !self.order.is_empty() {
            self.turns_until = Some(now + TURN_HOLD);
        }
    }

    /// Of `free` rules of room, how many are kept for waiters ahead of `svc` (all waiters,
    /// for a Service that does not wait): each one in order whose need fits in what is left,
    /// while their turn lasts.
    fn kept_ahead(&self, svc: &RuleOwner, free: usize, now: Instant) -> usize {
        if self.turns_until.is_none_or(|until| now >= until) {
            return 0;
        }
        let mine = self.by_service.get(svc).map(|w| w.seq);
        let mut kept = 0;
        for (seq, other) in &self.order {
            if Some(*seq) == mine {
                break;
            }
            let need = self.by_service.get(other).map_or(0, |w| w.need);
            if kept + need <= free {
                kept += need;
            }
        }
        kept
    }
}

/// New rules a held-back Service needs (0 when no capacity limit held it back).
fn rules_needed(report: &ApplyReport) -> usize {
    report
        .blocked
        .iter()
        .map(|b| match b {
            Blocked::Capacity { new, .. } => *new,
            Blocked::SourceRanges { .. } => 0,
        })
        .max()
        .unwrap_or(0)
}

/// What one liveness probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// Up, as before, holding what we believe.
    Up,
    /// Down, as before.
    Down,
    /// Up before, down now.
    WentDown,
    /// Down before (or never probed), up now: it may have restarted empty.
    CameBack,
    /// Up, but rules of ours we know it held are gone (restarted between two probes, or
    /// deleted behind our back).
    LostRules { missing: usize },
}

impl Probe {
    /// The instance needs every rule replayed.
    pub fn needs_replay(self) -> bool {
        matches!(self, Probe::CameBack | Probe::LostRules { .. })
    }

    /// Services' Programmed conditions (which name unreachable instances) are stale.
    pub fn changes_status(self) -> bool {
        matches!(
            self,
            Probe::WentDown | Probe::CameBack | Probe::LostRules { .. }
        )
    }
}

/// One Service's part of a whole-instance pass (drift check, replay).
#[derive(Debug)]
pub enum ServiceRules {
    /// The rules the Service wants.
    Want(Vec<Rule>),
    /// A Service with a problem (namespace, name): it keeps the rules it has.
    Keep(String, String),
}

/// A diff's actions as (deletes, changes, creates); conflicts go to `report`.
fn split_actions(
    actions: Vec<Action>,
    report: &mut ApplyReport,
) -> (Vec<Rule>, Vec<Action>, Vec<Rule>) {
    let (mut deletes, mut changes, mut creates) = (Vec::new(), Vec::new(), Vec::new());
    for action in actions {
        match action {
            Action::Delete(rule) => deletes.push(rule),
            Action::Create(rule) => creates.push(rule),
            a @ (Action::Update(_) | Action::Recreate(_)) => changes.push(a),
            Action::Conflict {
                wanted,
                foreign_name,
            } => report.conflicts.push((wanted.key, foreign_name)),
        }
    }
    (deletes, changes, creates)
}

/// The whole-instance diff, one Service at a time: creates and changes as each Service's
/// rules are compared with what sits on their keys, then deletes for the owned rules in
/// scope (this cluster, `namespace` if set, not kept) that no Service wanted. The same
/// decisions as diffing everything at once, holding one Service's rules at a time.
fn decide_all(
    h: &Holdings,
    cluster: &ClusterId,
    namespace: Option<&str>,
    desired: impl Iterator<Item = ServiceRules>,
    report: &mut ApplyReport,
) -> (Vec<Rule>, Vec<Action>, Vec<Rule>) {
    let owned = |r: &Rule| RuleName::is_owned_by(&r.name, cluster);
    let mut wanted: HashSet<RuleKey> = HashSet::new();
    let mut keep: HashSet<(String, String)> = HashSet::new();
    let (mut changes, mut creates) = (Vec::new(), Vec::new());
    for item in desired {
        let rules = match item {
            ServiceRules::Keep(ns, name) => {
                keep.insert((ns, name));
                continue;
            }
            ServiceRules::Want(rules) => rules,
        };
        wanted.extend(rules.iter().map(|r| r.key));
        let observed = rules.iter().filter_map(|r| h.rules.get(&r.key));
        // Only rules on keys this Service wants were compared: no deletes come out here.
        let (_, c, n) = split_actions(diff_rules(&rules, observed, owned), report);
        changes.extend(c);
        creates.extend(n);
    }
    let in_scope = |r: &Rule| {
        RuleName::parse(&r.name).is_some_and(|n| {
            n.cluster == cluster.as_str()
                && namespace.is_none_or(|ns| n.namespace == ns)
                && !keep.contains(&(n.namespace.clone(), n.service.clone()))
        })
    };
    let deletes = h
        .rules
        .rules
        .values()
        .filter(|r| owned(r) && in_scope(r) && !wanted.contains(&r.key))
        .cloned()
        .collect();
    (deletes, changes, creates)
}

pub struct Instance {
    pub client: LoxilbClient,
    /// The group of loxilbs it belongs to (kube-loxilb's zone): it holds the rules of the
    /// Services placed on that group only (docs/fleet.md#groups-and-placement).
    group: String,
    /// The restart marker's cluster-instance entry (module docs).
    marker: loxilb_client::CiState,
    healthy: AtomicBool,
    /// Whether its state is known (a probe ran, or a call failed): until then it is used as
    /// if healthy, so that neither programming nor a finalizer skips it at start-up.
    probed: AtomicBool,
    /// A failed call (not the probe) marked the instance down: the next probe still reports
    /// the transition, so Services get re-evaluated.
    down_unannounced: AtomicBool,
    /// While it is down because its certificate was refused (`ClientError::Tls`): that
    /// error's text. Services then say so (`LoxilbTLSError`) instead of "unavailable": a
    /// certificate or CA to fix, not an outage to wait out.
    tls_refusal: std::sync::Mutex<Option<String>>,
    capacity: AtomicUsize,
    /// How many Services' new rules a replay or drift repair sends at once.
    parallel_calls: AtomicUsize,
    holdings: Mutex<Holdings>,
    /// When a Service's own pass last wrote here: drift checks wait for a quiet moment.
    last_service_write: std::sync::Mutex<Option<Instant>>,
    /// Its BGP as this controller configured it (`bgp.rs`).
    bgp: Mutex<bgp::BgpState>,
    /// The HA states this controller posted since it last (re)started (`roles.rs`).
    roles: Mutex<roles::PostedRoles>,
    /// Services' passes program it. A discovered instance joins without (`Fleet::set_members`)
    /// and serves once its first replay programmed it completely.
    serving: AtomicBool,
}

/// The outcome of applying rules to one instance. Only transport failures (the instance is
/// gone) abort an apply; everything else is reported here and the other rules still go in.
#[derive(Debug, Default)]
pub struct ApplyReport {
    /// Rules created, changed or deleted (0 when the instance already held exactly the
    /// desired rules; a rule created and taken back in the same pass does not count).
    pub changes: usize,
    /// Of `changes`, rules updated in place (endpoints and the other fields loxilb can change
    /// on a live rule): routine, e.g. after a Node change.
    pub updated: usize,
    /// Keys held by rules this cluster does not own.
    pub conflicts: Vec<(RuleKey, String)>,
    /// Rules held back by one of loxilb's limits (one entry per Service and limit).
    pub blocked: Vec<Blocked>,
    /// Calls loxilb refused or failed for any other reason.
    pub failed: Vec<(RuleKey, ClientError)>,
}

impl ApplyReport {
    /// The instance holds everything asked for.
    pub fn complete(&self) -> bool {
        self.conflicts.is_empty() && self.blocked.is_empty() && self.failed.is_empty()
    }
}

fn is_transport(e: &ClientError) -> bool {
    e.is_transport()
}

/// The calls one Service's pass makes, decided under the lock and made without it.
struct Work {
    deletes: Vec<Rule>,
    /// With the `bgp` flag the rule on loxilb was created with: a re-creation's DELETE must
    /// carry it (docs/loxilb-api.md#bgp).
    changes: Vec<(Action, bool)>,
    creates: Vec<Rule>,
}

impl Work {
    /// Every key a call of this work touches.
    fn keys(&self) -> Vec<RuleKey> {
        let changed = self.changes.iter().filter_map(|(a, _)| match a {
            Action::Update(r) | Action::Recreate(r) => Some(r.key),
            _ => None,
        });
        self.deletes
            .iter()
            .chain(&self.creates)
            .map(|r| r.key)
            .chain(changed)
            .collect()
    }
}

/// The in-place updates and re-creations, minus those loxilb refused exactly so for a limit
/// since room last freed (reported in `report` instead of being sent again).
fn without_refused(
    h: &Holdings,
    changes: Vec<Action>,
    report: &mut ApplyReport,
) -> Vec<(Action, bool)> {
    changes
        .into_iter()
        .filter(|a| match a {
            Action::Update(r) | Action::Recreate(r) => match h.refused.get(&r.key) {
                Some((sent, why)) if sent == r => {
                    report.blocked.push(why.clone());
                    false
                }
                _ => true,
            },
            _ => false,
        })
        .map(|a| {
            let stored_bgp = match &a {
                Action::Update(r) | Action::Recreate(r) => {
                    h.rules.get(&r.key).is_some_and(|held| held.bgp)
                }
                _ => false,
            };
            (a, stored_bgp)
        })
        .collect()
}

/// What one call did.
enum CallResult {
    Deleted(RuleKey),
    Posted {
        rule: Rule,
        update: bool,
    },
    /// Created in this pass, then deleted because a limit refused a sibling rule.
    RolledBack(RuleKey),
    Refused {
        rule: Rule,
        limit: Limit,
    },
    Failed(RuleKey, ClientError),
}

/// New rules grouped by the Service they belong to (by name), in first-seen order.
fn group_by_service(rules: Vec<Rule>) -> Vec<Vec<Rule>> {
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut groups: Vec<Vec<Rule>> = Vec::new();
    for rule in rules {
        let owner = RuleName::parse(&rule.name).map_or_else(
            || rule.name.clone(),
            |n| format!("{}/{}", n.namespace, n.service),
        );
        match index.get(&owner) {
            Some(&i) => groups[i].push(rule),
            None => {
                index.insert(owner, groups.len());
                groups.push(vec![rule]);
            }
        }
    }
    groups
}

/// Which limit a loxilb refusal is, if any, read from loxilb's raw error text
/// (docs/loxilb-api.md#handler-errors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Limit {
    Capacity,
    SourceRanges,
}

fn limit_of(e: &ClientError) -> Option<Limit> {
    match e {
        // 403 also means "BGP disabled" or "BGP only mode": only the rule table counts here.
        ClientError::Capacity { message, .. } if message.to_ascii_lowercase().contains("hwm") => {
            Some(Limit::Capacity)
        }
        // Our source ranges are always valid CIDRs (the planner parses them), so this is the
        // index limit, not a malformed prefix.
        ClientError::Rejected { message, .. }
            if message.to_ascii_lowercase().contains("rule-allowed-src") =>
        {
            Some(Limit::SourceRanges)
        }
        _ => None,
    }
}

impl Instance {
    pub fn new(client: LoxilbClient, cluster: &ClusterId) -> Instance {
        Instance {
            client,
            group: loxi_domain::roles::DEFAULT_ZONE.to_string(),
            marker: loxilb_client::CiState {
                instance: format!("loxi-ccm.{cluster}"),
                state: "NOT_DEFINED".into(),
                vip: "0.0.0.0".into(),
            },
            healthy: AtomicBool::new(false),
            probed: AtomicBool::new(false),
            down_unannounced: AtomicBool::new(false),
            tls_refusal: std::sync::Mutex::new(None),
            capacity: AtomicUsize::new(DEFAULT_CAPACITY),
            parallel_calls: AtomicUsize::new(DEFAULT_PARALLEL_CALLS),
            holdings: Mutex::new(Holdings::default()),
            last_service_write: std::sync::Mutex::new(None),
            bgp: Mutex::default(),
            roles: Mutex::default(),
            serving: AtomicBool::new(true),
        }
    }

    pub fn url(&self) -> &str {
        self.client.url()
    }

    /// The instance as a member of `group`.
    pub fn in_group(mut self, group: &str) -> Instance {
        self.group = group.to_string();
        self
    }

    /// The group it belongs to.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// How long ago a Service's own pass last wrote here (`None`: never).
    pub fn since_service_write(&self) -> Option<std::time::Duration> {
        self.last_service_write
            .lock()
            .ok()
            .and_then(|t| t.map(|t| t.elapsed()))
    }

    fn note_service_write(&self) {
        if let Ok(mut t) = self.last_service_write.lock() {
            *t = Some(Instant::now());
        }
    }

    /// Services' passes program it (every configured instance; a discovered one once its
    /// first replay is done).
    pub fn is_serving(&self) -> bool {
        self.serving.load(Ordering::SeqCst)
    }

    /// Its first replay programmed it completely: Services' passes program it from now on.
    pub fn start_serving(&self) -> bool {
        !self.serving.swap(true, Ordering::SeqCst)
    }

    /// Not known to be down: reachable at the last probe, or not probed yet.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::SeqCst) || !self.probed.load(Ordering::SeqCst)
    }

    /// The refused certificate that keeps it down, if that is why (see `tls_refusal`).
    pub fn tls_refusal(&self) -> Option<String> {
        self.tls_refusal
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Remembers why the last call that reached (or failed to reach) it ended as it did.
    fn note_reach(&self, result: Result<(), &ClientError>) {
        let refusal = match result {
            Err(e @ ClientError::Tls { .. }) => Some(e.to_string()),
            // Any other answer or failure: the certificate was not the problem this time.
            _ => None,
        };
        *self.tls_refusal.lock().unwrap_or_else(|e| e.into_inner()) = refusal;
    }

    /// Records a liveness result; returns true on a down -> up transition.
    pub fn set_healthy(&self, up: bool) -> bool {
        self.probed.store(true, Ordering::SeqCst);
        let was = self.healthy.swap(up, Ordering::SeqCst);
        up && !was
    }

    /// The configured rule-table size.
    pub fn capacity(&self) -> usize {
        self.capacity.load(Ordering::Relaxed)
    }

    pub fn set_capacity(&self, capacity: usize) {
        self.capacity.store(capacity.max(1), Ordering::Relaxed);
    }

    /// Number of rules the instance is known to hold (all owners).
    pub async fn rule_count(&self) -> usize {
        self.holdings.lock().await.held()
    }

    /// Liveness probe (`GET /version`, docs/loxilb-api.md#liveness) and, while up, a check that the
    /// instance still holds what we believe: a loxilb that restarted between two probes
    /// answers as if nothing happened, but comes back empty
    /// (docs/loxilb-api.md#detecting-a-restart).
    pub async fn probe(&self, cluster: &ClusterId, metrics: &Metrics) -> Probe {
        // One attempt while it cannot be reached: a loxilb that hangs is seen down after one
        // timeout. One that answers with an error is alive: asked again as any call is.
        let answer = match self.client.probe_version().await {
            Err(e) if !e.is_transport() => self.client.version().await,
            answer => answer,
        };
        self.note_reach(answer.as_ref().map(|_| ()));
        let up = answer.is_ok();
        metrics.set_up(self.url(), up);
        let first = !self.probed.swap(true, Ordering::SeqCst);
        let was = self.healthy.swap(up, Ordering::SeqCst);
        let unannounced = self.down_unannounced.swap(false, Ordering::SeqCst);
        if let Err(error) = answer {
            if was || unannounced {
                // The reason matters: a refused certificate needs the operator, an outage not.
                warn!(
                    instance = self.url(),
                    %error,
                    "loxilb unreachable: Services are partially programmed until it is back"
                );
                return Probe::WentDown;
            }
            return Probe::Down;
        }
        if !was {
            let mut h = self.holdings.lock().await;
            // A first probe after a Service's pass of this process listed it and placed the
            // marker (a new leader's reconciles start at once): that listing is what a
            // replay needs, nothing is listed or placed twice.
            let fresh = first && h.known && h.marker != Marker::NotPlaced;
            if !fresh {
                // Whatever it held may be gone, and it may run with another configuration:
                // list before trusting anything, and let waiting Services try again.
                h.known = false;
                h.learned_capacity = None;
                // A loxilb that was away may have restarted and lost the marker with
                // everything else: placed again before the replay's listing, or the first
                // probe after the replay would find it missing and replay a second time. (A
                // refusal stands.)
                if h.marker == Marker::Placed {
                    h.marker = Marker::NotPlaced;
                }
            }
            h.room_freed();
            info!(instance = self.url(), "loxilb reachable: replaying rules");
            metrics.replayed(self.url(), "came_back");
            return Probe::CameBack;
        }
        // A pass holds the table (a replay of thousands of rules may take minutes on a real
        // loxilb): its calls notice a restart themselves, and the probe stays on time.
        let Ok(mut h) = self.holdings.try_lock() else {
            return Probe::Up;
        };
        if !h.known || h.rules.is_empty() {
            return Probe::Up;
        }
        let missing = if h.marker == Marker::Placed {
            // The cheap check: read without the lock, so no worker waits for it.
            let epoch = h.marker_epoch;
            drop(h);
            let started = Instant::now();
            let states = self.client.cluster_states().await;
            metrics.loxilb_call(
                self.url(),
                "cistate",
                started.elapsed(),
                states.as_ref().err(),
            );
            h = self.holdings.lock().await;
            let Ok(states) = states else {
                // The next probe (or the next apply) decides whether it is down.
                return Probe::Up;
            };
            if h.marker_epoch != epoch
                || !h.known
                || states.iter().any(|s| s.instance == self.marker.instance)
            {
                return Probe::Up;
            }
            // Restarted: everything of ours is gone, whatever the cache says.
            h.known = false;
            h.marker = Marker::NotPlaced;
            h.rules
                .rules
                .iter()
                .filter(|(k, r)| {
                    !h.in_flight.contains(k) && RuleName::is_owned_by(&r.name, cluster)
                })
                .count()
        } else {
            let Ok((listed, uncounted)) = self.list(metrics).await else {
                // The next probe (or the next apply) decides whether it is down.
                return Probe::Up;
            };
            let before = h.held();
            // Only our rules count: other owners delete theirs as they please.
            let missing = h
                .rules
                .rules
                .iter()
                .filter(|(k, r)| {
                    !listed.contains_key(k)
                        && !h.in_flight.contains(k)
                        && RuleName::is_owned_by(&r.name, cluster)
                })
                .count();
            h.rules = RuleTable::from_map(listed);
            h.uncounted = uncounted;
            metrics.set_rules(self.url(), h.held());
            if missing == 0 {
                if h.held() < before {
                    h.room_freed();
                }
                return Probe::Up;
            }
            missing
        };
        warn!(
            instance = self.url(),
            missing, "loxilb lost rules (restart?): replaying"
        );
        h.learned_capacity = None;
        h.room_freed();
        metrics.replayed(self.url(), "lost_rules");
        Probe::LostRules { missing }
    }

    async fn list(
        &self,
        metrics: &Metrics,
    ) -> Result<(HashMap<RuleKey, Rule>, usize), ClientError> {
        let started = Instant::now();
        let result = self.client.list_rules_map(|e| from_entry(&e)).await;
        metrics.loxilb_call(self.url(), "list", started.elapsed(), result.as_ref().err());
        let listing = result?;
        let listed = listing.items.len() + listing.skipped;
        let rules: HashMap<RuleKey, Rule> = listing.items.into_iter().map(|r| (r.key, r)).collect();
        let uncounted = listed.saturating_sub(rules.len());
        Ok((rules, uncounted))
    }

    /// Places the restart marker (module docs) if it is not there yet. Only a transport
    /// failure is an error; a refusal switches this instance to listing probes.
    async fn place_marker(&self, h: &mut Holdings, metrics: &Metrics) -> Result<(), ClientError> {
        if h.marker != Marker::NotPlaced {
            return Ok(());
        }
        let started = Instant::now();
        let result = self.client.set_cluster_state(&self.marker).await;
        metrics.loxilb_call(
            self.url(),
            "cistate",
            started.elapsed(),
            result.as_ref().err(),
        );
        match result {
            Ok(()) => {
                h.marker = Marker::Placed;
                h.marker_epoch += 1;
                Ok(())
            }
            Err(e) if is_transport(&e) => Err(e),
            Err(e) if e.is_retryable() => {
                // A passing server error: tried again before the next listing, and probes
                // list every rule until then.
                debug!(instance = self.url(), error = %e, "restart marker not placed yet");
                Ok(())
            }
            Err(e) => {
                warn!(
                    instance = self.url(),
                    error = %e,
                    "loxilb refused the restart marker (POST /config/cistate): \
                     each probe lists every rule instead"
                );
                h.marker = Marker::Refused;
                Ok(())
            }
        }
    }

    async fn refresh(&self, h: &mut Holdings, metrics: &Metrics) -> Result<(), ClientError> {
        // Before the listing: a restart after it then always shows as a missing marker.
        self.place_marker(h, metrics).await?;
        let before = h.known.then(|| h.held());
        // The old table goes before the listing arrives (with 2,000 rules, both at once were
        // a few MB of the drift check's memory peak); until the listing is in, nothing is
        // known.
        h.known = false;
        h.rules = RuleTable::default();
        let (rules, uncounted) = self.list(metrics).await?;
        h.rules = RuleTable::from_map(rules);
        h.uncounted = uncounted;
        h.known = true;
        h.listed_at = Some(Instant::now());
        if before.is_some_and(|b| h.held() < b) {
            // Deleted by someone else, or a restart: room for those waiting.
            h.room_freed();
        }
        metrics.set_rules(self.url(), h.held());
        Ok(())
    }

    /// Makes the instance hold exactly `desired` for the Service `namespace/name`: rules of
    /// that Service not in `desired` are deleted, others are never touched. When a limit
    /// holds some rules back and `requeue` is given, the Service is sent there once room
    /// frees on this instance.
    pub async fn apply_service(
        &self,
        cluster: &ClusterId,
        namespace: &str,
        name: &str,
        desired: &[Rule],
        metrics: &Metrics,
        requeue: Option<&Requeue>,
    ) -> Result<ApplyReport, ClientError> {
        let in_scope = |rule: &Rule| {
            RuleName::parse(&rule.name).is_some_and(|n| {
                n.cluster == cluster.as_str() && n.namespace == namespace && n.service == name
            })
        };
        // 1. Decide under the lock (and reserve room for the new rules).
        let mut report = ApplyReport::default();
        let (work, freed_before) = {
            let mut h = self.holdings.lock().await;
            if !h.known
                && let Err(e) = self.refresh(&mut h, metrics).await
            {
                let result = Err(e);
                self.note_failure(&mut h, &result);
                return result;
            }
            let (deletes, changes, creates) = self.decide(
                &h,
                cluster,
                desired,
                (namespace, name),
                &in_scope,
                &mut report,
            );
            let mut creates = creates;
            creates.sort_by_key(|r| r.allowed_sources.is_empty());
            let me = RuleOwner::new(namespace, name);
            let free = self.effective_capacity(&h).saturating_sub(h.taken());
            let kept = h.waiters.kept_ahead(&me, free, Instant::now());
            let held_back = (!creates.is_empty())
                .then(|| self.check_limits(&h, &creates, kept))
                .flatten();
            if let Some(b) = held_back {
                metrics.limit_hit(self.url(), b.reason());
                report.blocked.push(b);
                creates.clear();
            }
            let work = Work {
                deletes,
                changes: without_refused(&h, changes, &mut report),
                creates,
            };
            h.reserved += work.creates.len();
            h.in_flight.extend(work.keys());
            (work, h.room_freed_count)
        };
        // 2. The calls, without the lock: Services on one instance are programmed in
        //    parallel (each Service is reconciled by one task at a time, and the decision
        //    above only touched this Service's rules and the keys it wants).
        let reserved = work.creates.len();
        let touched = work.keys();
        if !touched.is_empty() {
            self.note_service_write();
        }
        let (outcomes, transport) = self.call(work, metrics).await;
        if !touched.is_empty() {
            self.note_service_write();
        }
        // 3. Record what happened, under the lock.
        let mut h = self.holdings.lock().await;
        h.reserved -= reserved;
        for key in &touched {
            h.in_flight.remove(key);
        }
        if let Err(e) = self.record(&mut h, outcomes, &mut report, metrics).await {
            let result = Err(e);
            self.note_failure(&mut h, &result);
            return result;
        }
        let result = match transport {
            Some(e) => Err(e),
            None => Ok(report),
        };
        // Registered under the same lock that frees room, so a wake-up is never missed.
        let svc = RuleOwner::new(namespace, name);
        match (&result, requeue) {
            (Ok(report), Some(tx)) if !report.blocked.is_empty() => {
                h.wait_for_room(svc, rules_needed(report), tx, freed_before);
            }
            _ => {
                h.waiters.done(&svc);
            }
        }
        self.note_failure(&mut h, &result);
        result
    }

    /// Records what the calls did in what the instance is known to hold, and in `report`.
    /// Fails only when a listing needed to learn loxilb's real capacity fails.
    async fn record(
        &self,
        h: &mut Holdings,
        outcomes: Vec<CallResult>,
        report: &mut ApplyReport,
        metrics: &Metrics,
    ) -> Result<(), ClientError> {
        let mut freed = false;
        // Rules of this pass rolled back after a refusal were in loxilb at the refusal.
        let rolled_back = outcomes
            .iter()
            .filter(|o| matches!(o, CallResult::RolledBack(_)))
            .count();
        for outcome in outcomes {
            match outcome {
                CallResult::Deleted(key) => {
                    h.rules.remove(&key);
                    report.changes += 1;
                    freed = true;
                }
                CallResult::Posted { rule, update } => {
                    h.rules.insert(rule);
                    report.changes += 1;
                    if update {
                        report.updated += 1;
                    }
                }
                CallResult::RolledBack(key) => {
                    h.rules.remove(&key);
                    report.changes = report.changes.saturating_sub(1);
                }
                CallResult::Refused { rule, limit } => {
                    let why = match limit {
                        Limit::Capacity => {
                            // Our count was off (a smaller table, or rules added by someone
                            // else): learn the real size from what loxilb holds (plus what
                            // this pass rolled back since the refusal).
                            self.refresh(h, metrics).await?;
                            let size = h.held() + rolled_back;
                            h.learned_capacity = Some(size);
                            Blocked::Capacity {
                                held: size,
                                new: 1,
                                capacity: size,
                                refused: true,
                            }
                        }
                        Limit::SourceRanges => Blocked::SourceRanges {
                            key: rule.key,
                            index: None,
                        },
                    };
                    warn!(instance = self.url(), key = %rule.key, "{why}");
                    metrics.limit_hit(self.url(), why.reason());
                    h.refused.insert(rule.key, (rule, why.clone()));
                    report.blocked.push(why);
                }
                CallResult::Failed(key, e) => report.failed.push((key, e)),
            }
        }
        if freed {
            h.room_freed();
        }
        metrics.set_rules(self.url(), h.held());
        metrics.set_capacity(self.url(), self.effective_capacity(h));
        Ok(())
    }

    /// Debug log of what a whole-instance pass (drift check, replay) is about to change, rule by
    /// rule, with the endpoints gained and lost against what the table holds.
    fn log_repairs(
        url: &str,
        h: &Holdings,
        deletes: &[Rule],
        changes: &[Action],
        creates: &[Rule],
    ) {
        for rule in deletes {
            debug!(instance = url, key = %rule.key, name = %rule.name, "repair: delete");
        }
        for rule in creates {
            debug!(instance = url, key = %rule.key, name = %rule.name, "repair: create");
        }
        for action in changes {
            let (Action::Update(want) | Action::Recreate(want)) = action else {
                continue;
            };
            let have = h.rules.get(&want.key);
            let ips = |r: &Rule| r.endpoints.iter().map(|e| e.ip).collect::<HashSet<_>>();
            let (gained, lost) = match have {
                Some(have) => {
                    let (w, o) = (ips(want), ips(have));
                    (
                        w.difference(&o).copied().collect::<Vec<_>>(),
                        o.difference(&w).copied().collect::<Vec<_>>(),
                    )
                }
                None => (Vec::new(), Vec::new()),
            };
            debug!(instance = url, key = %want.key, name = %want.name, ?gained, ?lost, recreate = matches!(action, Action::Recreate(_)), "repair: change");
        }
    }

    /// The calls of one Service's pass, in order: deletes (they make room; side by side),
    /// in-place updates (side by side) and re-creations, then the new rules, all or none (a
    /// limit refusing one rolls the others back). Stops after the first group with a
    /// transport failure, returned beside what was done.
    async fn call(&self, work: Work, metrics: &Metrics) -> (Vec<CallResult>, Option<ClientError>) {
        let mut out = Vec::new();
        // The deletes side by side (at most `parallel_calls` at once): they are independent
        // (a Service's ports, a drift check's orphans), and a deleted Service's rules should
        // all be gone at once.
        let parallel = self.parallel_calls.load(Ordering::Relaxed).max(1);
        // (The calls are gathered first: a stream over a borrowing closure would not be
        // `Send` for every lifetime, as the spawned reconcile needs.)
        let calls: Vec<_> = work
            .deletes
            .iter()
            .map(|rule| self.delete(&rule.key, rule.bgp, metrics))
            .collect();
        let deleted: Vec<Result<(), ClientError>> = futures::stream::iter(calls)
            .buffered(parallel)
            .collect()
            .await;
        let mut transport = None;
        for (rule, result) in work.deletes.iter().zip(deleted) {
            match result {
                Ok(()) => out.push(CallResult::Deleted(rule.key)),
                Err(e) if is_transport(&e) => {
                    transport.get_or_insert(e);
                }
                Err(e) => out.push(CallResult::Failed(rule.key, e)),
            }
        }
        if transport.is_some() {
            return (out, transport);
        }
        // In-place updates side by side too (a Node change updates every rule of a
        // Service); re-creations one by one below, each DELETE right before its POST.
        let (updates, recreates): (Vec<_>, Vec<_>) = work
            .changes
            .into_iter()
            .partition(|(a, _)| matches!(a, Action::Update(_)));
        let updates: Vec<Rule> = updates
            .into_iter()
            .filter_map(|(a, _)| match a {
                Action::Update(rule) => Some(rule),
                _ => None,
            })
            .collect();
        let calls: Vec<_> = updates
            .iter()
            .map(|rule| self.post(rule, true, metrics))
            .collect();
        let posted: Vec<Result<(), ClientError>> = futures::stream::iter(calls)
            .buffered(parallel)
            .collect()
            .await;
        for (rule, result) in updates.into_iter().zip(posted) {
            match result {
                Ok(()) => out.push(CallResult::Posted { rule, update: true }),
                Err(e) if is_transport(&e) => {
                    transport.get_or_insert(e);
                }
                Err(e) => match limit_of(&e) {
                    Some(limit) => out.push(CallResult::Refused { rule, limit }),
                    None => out.push(CallResult::Failed(rule.key, e)),
                },
            }
        }
        if transport.is_some() {
            return (out, transport);
        }
        for (action, stored_bgp) in recreates {
            let Action::Recreate(rule) = action else {
                continue;
            };
            // loxilb reuses the index just freed (LIFO), so this needs no new room.
            match self.delete(&rule.key, stored_bgp, metrics).await {
                Ok(()) => out.push(CallResult::Deleted(rule.key)),
                Err(e) if is_transport(&e) => return (out, Some(e)),
                Err(e) => {
                    out.push(CallResult::Failed(rule.key, e));
                    continue;
                }
            }
            match self.post(&rule, false, metrics).await {
                Ok(()) => out.push(CallResult::Posted {
                    rule,
                    update: false,
                }),
                Err(e) if is_transport(&e) => return (out, Some(e)),
                Err(e) => match limit_of(&e) {
                    Some(limit) => out.push(CallResult::Refused { rule, limit }),
                    None => out.push(CallResult::Failed(rule.key, e)),
                },
            }
        }
        let mut created = Vec::new();
        let mut refused = false;
        for rule in work.creates {
            let key = rule.key;
            match self.post(&rule, false, metrics).await {
                Ok(()) => {
                    created.push((key, rule.bgp));
                    out.push(CallResult::Posted {
                        rule,
                        update: false,
                    });
                }
                Err(e) if is_transport(&e) => return (out, Some(e)),
                Err(e) => match limit_of(&e) {
                    Some(limit) => {
                        out.push(CallResult::Refused { rule, limit });
                        refused = true;
                        break;
                    }
                    None => out.push(CallResult::Failed(key, e)),
                },
            }
        }
        if refused {
            // A Service is never half-programmed by a limit, and takes no room it cannot use.
            for (key, bgp) in created {
                match self.delete(&key, bgp, metrics).await {
                    Ok(()) => out.push(CallResult::RolledBack(key)),
                    Err(e) if is_transport(&e) => return (out, Some(e)),
                    Err(e) => {
                        warn!(instance = self.url(), %key, error = %e, "could not roll back a rule");
                        out.push(CallResult::Failed(key, e));
                    }
                }
            }
        }
        (out, None)
    }

    /// Drift check: lists what the instance holds and converges it to `desired` (all
    /// Services). Only rules this cluster owns, of Services in `namespace` (all when `None`:
    /// a replica watching one namespace must not take other namespaces' rules for orphans)
    /// are deleted. Owned rules of Services in `keep` are left alone even when not desired
    /// (their Service has an error and keeps its existing rules until fixed).
    ///
    /// `desired` is asked for only once this instance is locked: computed earlier, it could
    /// re-create the rules of a Service whose cleanup ran in between. It yields one Service
    /// at a time and each is compared with the table as it comes, so the rules of every
    /// Service are never held at once (2,000 rules with 32 endpoints each are ~2.6 MB).
    pub async fn converge_all<I>(
        &self,
        cluster: &ClusterId,
        namespace: Option<&str>,
        desired: impl FnOnce() -> I,
        metrics: &Metrics,
    ) -> Result<ApplyReport, ClientError>
    where
        I: Iterator<Item = ServiceRules>,
    {
        let mut h = self.holdings.lock().await;
        // A listing made moments ago (a Service's first pass after a take-over) is current:
        // every write since went through this cache.
        let refreshed = if h.known && h.listed_at.is_some_and(|t| t.elapsed() < FRESH_LISTING) {
            Ok(())
        } else {
            self.refresh(&mut h, metrics).await
        };
        let result = match refreshed {
            Ok(()) => {
                self.apply_locked(&mut h, cluster, namespace, desired(), metrics)
                    .await
            }
            Err(e) => Err(e),
        };
        if let Ok(report) = &result {
            for (key, e) in &report.failed {
                warn!(instance = self.url(), %key, error = %e, "drift repair refused");
            }
            for b in &report.blocked {
                // Reported on the Service by its own reconcile.
                debug!(instance = self.url(), "drift repair held back: {b}");
            }
            // The repair may have created the rules of a Service waiting for room (its own
            // pass was held back, the whole-instance pass found room): woken, its reconcile
            // reports it programmed, instead of showing CapacityExceeded until some other
            // room frees (found by the fault matrix, a full loxilb: docs/RELIABILITY.md).
            if report.changes > 0 {
                h.waiters.wake_all(Instant::now());
            }
        }
        self.note_failure(&mut h, &result);
        result
    }

    /// Deletes every rule this cluster owns for `namespace/name`. Fails if any could not be
    /// deleted (the caller keeps its finalizer and retries with backoff).
    pub async fn remove_service(
        &self,
        cluster: &ClusterId,
        namespace: &str,
        name: &str,
        metrics: &Metrics,
    ) -> Result<ApplyReport, ClientError> {
        let mut report = self
            .apply_service(cluster, namespace, name, &[], metrics, None)
            .await?;
        match report.failed.pop() {
            Some((_, e)) => Err(e),
            None => Ok(report),
        }
    }

    fn note_failure<T>(&self, h: &mut Holdings, result: &Result<T, ClientError>) {
        if let Err(e) = result
            && is_transport(e)
        {
            self.note_reach(Err(e));
            // We no longer know what it holds (it may come back empty): list before next use.
            h.known = false;
            self.probed.store(true, Ordering::SeqCst);
            if self.healthy.swap(false, Ordering::SeqCst) {
                self.down_unannounced.store(true, Ordering::SeqCst);
            }
        }
    }

    /// The capacity in force: configured, or lower when loxilb showed it.
    fn effective_capacity(&self, h: &Holdings) -> usize {
        h.learned_capacity
            .map_or(self.capacity(), |l| l.min(self.capacity()))
    }

    async fn apply_locked(
        &self,
        h: &mut Holdings,
        cluster: &ClusterId,
        namespace: Option<&str>,
        desired: impl Iterator<Item = ServiceRules>,
        metrics: &Metrics,
    ) -> Result<ApplyReport, ClientError> {
        if !h.known {
            self.refresh(h, metrics).await?;
        }
        let mut report = ApplyReport::default();
        let (mut deletes, mut changes, mut creates) =
            decide_all(h, cluster, namespace, desired, &mut report);
        // Keys a Service's own pass is changing right now are left to it: the listing may
        // show them before or after its calls, and sending the same change again only
        // doubles the writes. Its pass records what it did; anything it leaves wrong is
        // there at the next check.
        let busy = |key: &RuleKey| h.in_flight.contains(key);
        deletes.retain(|r| !busy(&r.key));
        creates.retain(|r| !busy(&r.key));
        changes.retain(|a| match a {
            Action::Update(r) | Action::Recreate(r) => !busy(&r.key),
            _ => true,
        });
        if tracing::enabled!(tracing::Level::DEBUG) {
            Self::log_repairs(self.url(), h, &deletes, &changes, &creates);
        }
        // Deletes and changes first: they make room for what is created below.
        let first = Work {
            deletes,
            changes: without_refused(h, changes, &mut report),
            creates: Vec::new(),
        };
        let (outcomes, transport) = self.call(first, metrics).await;
        self.record(h, outcomes, &mut report, metrics).await?;
        if let Some(e) = transport {
            return Err(e);
        }
        // New rules, one group per Service: each Service gets all its new rules or none.
        // Room is taken for a group before its calls, so the limits see the groups admitted
        // before it; the groups' calls then run side by side (a replay of a full loxilb is
        // thousands of POSTs).
        let mut admitted = Vec::new();
        let mut taken = 0;
        for mut group in group_by_service(creates) {
            if let Some(b) = self.check_limits(h, &group, 0) {
                metrics.limit_hit(self.url(), b.reason());
                report.blocked.push(b);
                continue;
            }
            // Rules with source ranges first: they need the low indexes.
            group.sort_by_key(|r| r.allowed_sources.is_empty());
            h.reserved += group.len();
            taken += group.len();
            admitted.push(Work {
                deletes: Vec::new(),
                changes: Vec::new(),
                creates: group,
            });
        }
        // Groups with source ranges start first, for the same reason.
        admitted.sort_by_key(|w| w.creates.iter().all(|r| r.allowed_sources.is_empty()));
        let parallel = self.parallel_calls.load(Ordering::Relaxed).max(1);
        let mut calls = futures::stream::iter(admitted.into_iter().map(|w| self.call(w, metrics)))
            .buffer_unordered(parallel);
        let mut failure = None;
        while let Some((outcomes, transport)) = calls.next().await {
            // Everything that was called is recorded, even after a failure.
            if let Err(e) = self.record(h, outcomes, &mut report, metrics).await {
                failure.get_or_insert(e);
            }
            if let Some(e) = transport {
                failure.get_or_insert(e);
            }
        }
        h.reserved -= taken;
        match failure {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }

    /// What to do to make the instance hold `desired` within the scope: deletes, in-place
    /// updates and re-creations, creates (conflicts with foreign rules go in `report`).
    /// `service` narrows the rules looked at to that Service's (through the index).
    fn decide(
        &self,
        h: &Holdings,
        cluster: &ClusterId,
        desired: &[Rule],
        (namespace, name): (&str, &str),
        in_scope: &impl Fn(&Rule) -> bool,
        report: &mut ApplyReport,
    ) -> (Vec<Rule>, Vec<Action>, Vec<Rule>) {
        let wanted: HashSet<RuleKey> = desired.iter().map(|r| r.key).collect();
        // The diff sees this Service's rules (from the index, then the scope) plus whatever
        // sits on the keys it wants.
        let mut seen: HashSet<RuleKey> = HashSet::new();
        let observed: Vec<&Rule> = h
            .rules
            .of_service(namespace, name)
            .filter(|r| in_scope(r))
            .chain(wanted.iter().filter_map(|k| h.rules.get(k)))
            .filter(|r| seen.insert(r.key))
            .collect();
        let owned = |r: &Rule| RuleName::is_owned_by(&r.name, cluster);
        let actions = diff_rules(desired, observed, |r| {
            owned(r) && (in_scope(r) || wanted.contains(&r.key))
        });
        split_actions(actions, report)
    }

    /// Whether a Service's new rules would hit a limit; nothing is sent then.
    /// Whether `group` (one Service's new rules) may be created now; `kept` rules of room
    /// are promised to Services that waited longer (`Waiters`).
    fn check_limits(&self, h: &Holdings, group: &[Rule], kept: usize) -> Option<Blocked> {
        // Rules other Services are creating right now, or are promised, count as held.
        let held = h.taken() + kept;
        let capacity = self.effective_capacity(h);
        if held + group.len() > capacity {
            return Some(Blocked::Capacity {
                held,
                new: group.len(),
                capacity,
                refused: false,
            });
        }
        for (i, rule) in group.iter().enumerate() {
            if let Some((sent, why)) = h.refused.get(&rule.key)
                && sent == rule
            {
                return Some(why.clone());
            }
            let index = held + i + 1;
            if !rule.allowed_sources.is_empty() && index > MAX_ALLOWED_SOURCES_INDEX {
                return Some(Blocked::SourceRanges {
                    key: rule.key,
                    index: Some(index),
                });
            }
        }
        None
    }

    /// POSTs the rule. An in-place `update` says `bgp: false`: loxilb never re-reads the flag
    /// on an update but would count one more advertisement for a 200 carrying `bgp: true`
    /// (docs/loxilb-api.md#bgp), so the address stays advertised exactly once per rule.
    async fn post(&self, rule: &Rule, update: bool, metrics: &Metrics) -> Result<(), ClientError> {
        let started = Instant::now();
        let mut entry = to_entry(rule);
        if update {
            entry.service_arguments.bgp = false;
        }
        let result = self.client.apply_rule(&entry).await;
        metrics.loxilb_call(
            self.url(),
            "apply",
            started.elapsed(),
            result.as_ref().err(),
        );
        if result.is_ok() && entry.service_arguments.bgp {
            metrics.bgp_advertisement_changed(self.url(), "announce");
        }
        result.map(|_| ())
    }

    /// DELETEs the rule by its tuple; `bgp`: the rule was created advertising its address,
    /// and the DELETE withdraws that advertisement (`?bgp=true`).
    async fn delete(&self, key: &RuleKey, bgp: bool, metrics: &Metrics) -> Result<(), ClientError> {
        let started = Instant::now();
        let result = self
            .client
            .delete_rule(&key.ip.to_string(), key.port, key.protocol.as_loxilb(), bgp)
            .await;
        metrics.loxilb_call(
            self.url(),
            "delete",
            started.elapsed(),
            result.as_ref().err(),
        );
        // loxilb drops the reference on every DELETE with ?bgp=true, even a 404.
        if bgp && !result.as_ref().is_err_and(is_transport) {
            metrics.bgp_advertisement_changed(self.url(), "withdraw");
        }
        result.map(|_| ())
    }
}

/// The loxilb instances: the configured ones, or those discovery follows
/// (docs/fleet.md#discovery). A cheap handle: clones share the same members.
#[derive(Clone)]
pub struct Fleet {
    inner: Arc<FleetInner>,
}

struct FleetInner {
    /// Replaced as a whole when members join or leave; readers work on a snapshot.
    members: std::sync::RwLock<Arc<Vec<Arc<Instance>>>>,
    cluster: ClusterId,
    capacity: AtomicUsize,
    parallel_calls: AtomicUsize,
}

/// One loxilb of the fleet as its sources name it: its group and its API URL.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Member {
    pub group: String,
    pub url: String,
}

impl Member {
    pub fn new(group: &str, url: &str) -> Member {
        Member {
            group: group.to_string(),
            url: url.to_string(),
        }
    }
}

/// One group of the fleet now: its name and its instances.
#[derive(Clone)]
pub struct Group {
    pub name: String,
    pub instances: Vec<Arc<Instance>>,
}

impl Group {
    /// Rules each of its loxilbs holds at most: the smallest table among them.
    pub fn capacity(&self) -> usize {
        self.instances
            .iter()
            .map(|i| i.capacity())
            .min()
            .unwrap_or(0)
    }
}

/// What [`Fleet::set_members`] changed: URLs that joined, and the instances that left.
#[derive(Default)]
pub struct MembersChanged {
    pub joined: Vec<String>,
    pub left: Vec<Arc<Instance>>,
}

impl Fleet {
    /// One group (the default one) of instances.
    pub fn new(clients: Vec<LoxilbClient>, cluster: &ClusterId) -> Fleet {
        let grouped = clients
            .into_iter()
            .map(|c| (loxi_domain::roles::DEFAULT_ZONE.to_string(), c))
            .collect();
        Fleet::with_capacity(grouped, DEFAULT_CAPACITY, cluster)
    }

    /// Instances (each with its group) whose rule tables hold `capacity` rules (loxilb's is
    /// 2048 unless built otherwise).
    pub fn with_capacity(
        clients: Vec<(String, LoxilbClient)>,
        capacity: usize,
        cluster: &ClusterId,
    ) -> Fleet {
        let fleet = Fleet {
            inner: Arc::new(FleetInner {
                members: std::sync::RwLock::new(Arc::new(
                    clients
                        .into_iter()
                        .map(|(group, c)| Arc::new(Instance::new(c, cluster).in_group(&group)))
                        .collect(),
                )),
                cluster: cluster.clone(),
                capacity: AtomicUsize::new(capacity.max(1)),
                parallel_calls: AtomicUsize::new(DEFAULT_PARALLEL_CALLS),
            }),
        };
        fleet.set_capacity(capacity);
        fleet
    }

    /// The instances now (a snapshot: members that join or leave later are not in it).
    pub fn instances(&self) -> Arc<Vec<Arc<Instance>>> {
        self.inner
            .members
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The groups now, by name, each with its instances (a snapshot).
    pub fn groups(&self) -> Vec<Group> {
        let mut groups: BTreeMap<String, Vec<Arc<Instance>>> = BTreeMap::new();
        for inst in self.instances().iter() {
            groups
                .entry(inst.group().to_string())
                .or_default()
                .push(inst.clone());
        }
        groups
            .into_iter()
            .map(|(name, instances)| Group { name, instances })
            .collect()
    }

    /// Makes the members the loxilbs `members` names (discovery, `LoxiURL`): an instance
    /// already known (same URL, same group) is kept with everything it holds; a new one
    /// joins *not serving* (Services' passes skip it) until its first replay has programmed
    /// it completely; one no longer listed is dropped. A URL listed twice counts once (its
    /// first group). `client` makes the client of a new URL (`None`: skipped, it said why).
    pub fn set_members(
        &self,
        wanted: &[Member],
        client: impl Fn(&str) -> Option<LoxilbClient>,
    ) -> MembersChanged {
        let mut members = self
            .inner
            .members
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut changed = MembersChanged::default();
        let mut next: Vec<Arc<Instance>> = Vec::with_capacity(wanted.len());
        for Member { group, url } in wanted {
            if next.iter().any(|i| i.url() == url) {
                continue;
            }
            if let Some(known) = members
                .iter()
                .find(|i| i.url() == url && i.group() == group)
            {
                next.push(known.clone());
                continue;
            }
            let Some(c) = client(url) else { continue };
            let inst = Instance::new(c, &self.inner.cluster).in_group(group);
            inst.serving.store(false, Ordering::SeqCst);
            inst.set_capacity(self.inner.capacity.load(Ordering::Relaxed));
            inst.parallel_calls.store(
                self.inner.parallel_calls.load(Ordering::Relaxed),
                Ordering::Relaxed,
            );
            changed.joined.push(url.clone());
            next.push(Arc::new(inst));
        }
        for old in members.iter() {
            if !next.iter().any(|i| Arc::ptr_eq(i, old)) {
                changed.left.push(old.clone());
            }
        }
        if !changed.joined.is_empty() || !changed.left.is_empty() {
            *members = Arc::new(next);
        }
        changed
    }

    /// Sets how many Services' new rules a replay or drift repair sends at once to one
    /// instance (the controller uses its `--concurrency`).
    pub fn set_parallel_calls(&self, parallel: usize) {
        self.inner
            .parallel_calls
            .store(parallel.max(1), Ordering::Relaxed);
        for inst in self.instances().iter() {
            inst.parallel_calls
                .store(parallel.max(1), Ordering::Relaxed);
        }
    }

    /// Sets every instance's rule-table size.
    pub fn set_capacity(&self, capacity: usize) {
        self.inner
            .capacity
            .store(capacity.max(1), Ordering::Relaxed);
        for inst in self.instances().iter() {
            inst.set_capacity(capacity);
        }
    }

    /// `svc` is gone: it waits for room nowhere.
    pub async fn forget_waiter(&self, svc: &RuleOwner) {
        for inst in self.instances().iter() {
            inst.holdings.lock().await.waiters.done(svc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loxi_domain::model::Probe as RuleProbe;
    use loxi_domain::{Endpoint, EndpointSelection, NatMode, Protocol};
    use loxilb_client::ClientConfig;
    use loxilb_sim::{SimConfig, Simulator};

    /// A requeue that forwards to a channel, for tests to read what was woken.
    fn requeue_channel() -> (Requeue, tokio::sync::mpsc::UnboundedReceiver<RuleOwner>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (
            Requeue::new(move |owner| {
                let _ = tx.send(owner.clone());
            }),
            rx,
        )
    }

    fn cluster() -> ClusterId {
        ClusterId::new("unit").unwrap()
    }

    fn rule(svc: &str, ip: &str, port: u16, sources: &[&str]) -> Rule {
        Rule {
            key: RuleKey {
                ip: ip.parse().unwrap(),
                port,
                protocol: Protocol::Tcp,
            },
            name: RuleName::new(&cluster(), "ns", svc, port, Protocol::Tcp).to_string(),
            mode: NatMode::Default,
            selection: EndpointSelection::RoundRobin,
            endpoints: vec![Endpoint {
                ip: "10.0.0.1".parse().unwrap(),
                target_port: 30000,
                weight: 1,
            }],
            monitor: false,
            managed: true,
            probe: RuleProbe::default(),
            inactive_timeout: 0,
            proxy_protocol_v2: false,
            allowed_sources: sources.iter().map(|s| s.parse().unwrap()).collect(),
            secondary_ips: vec![],
            bgp: false,
        }
    }

    async fn sim(max_rules: usize) -> (Simulator, Instance) {
        let sim = Simulator::start(
            "127.0.0.1:0".parse().unwrap(),
            SimConfig {
                max_rules,
                ..SimConfig::default()
            },
        )
        .await
        .unwrap();
        let client = LoxilbClient::new(ClientConfig::new(&sim.url())).unwrap();
        let inst = Instance::new(client, &cluster());
        (sim, inst)
    }

    #[tokio::test]
    async fn configured_capacity_holds_rules_back_without_calls() {
        let (sim, inst) = sim(2048).await;
        inst.set_capacity(3);
        let m = Metrics::new();
        let c = cluster();
        let a = [
            rule("a", "192.0.2.1", 80, &[]),
            rule("a", "192.0.2.1", 81, &[]),
        ];
        let b = [
            rule("b", "192.0.2.2", 80, &[]),
            rule("b", "192.0.2.2", 81, &[]),
        ];
        let r = inst
            .apply_service(&c, "ns", "a", &a, &m, None)
            .await
            .unwrap();
        assert!(r.complete() && r.changes == 2, "{r:?}");
        let (tx, mut rx) = requeue_channel();
        let calls = sim.request_count();
        let r = inst
            .apply_service(&c, "ns", "b", &b, &m, Some(&tx))
            .await
            .unwrap();
        assert_eq!(r.changes, 0);
        assert!(
            matches!(
                r.blocked[..],
                [Blocked::Capacity {
                    held: 2,
                    new: 2,
                    capacity: 3,
                    refused: false
                }]
            ),
            "{r:?}"
        );
        assert_eq!(
            sim.request_count(),
            calls,
            "nothing sent to a full instance"
        );
        assert_eq!(sim.rules().len(), 2);
        assert!(rx.try_recv().is_err());
        // Room frees: b is woken, and then fits.
        inst.remove_service(&c, "ns", "a", &m).await.unwrap();
        assert_eq!(rx.try_recv().unwrap().name, "b");
        let r = inst
            .apply_service(&c, "ns", "b", &b, &m, Some(&tx))
            .await
            .unwrap();
        assert!(r.complete() && r.changes == 2, "{r:?}");
    }

    #[test]
    fn room_freed_between_decision_and_waiting_requeues_at_once() {
        let (tx, mut rx) = requeue_channel();
        let mut h = Holdings::default();
        let b = RuleOwner::new("ns", "b");
        // Decided with no room, and nothing freed until it waits: it waits for a wake-up.
        let decided = h.room_freed_count;
        h.wait_for_room(b.clone(), 1, &tx, decided);
        assert!(rx.try_recv().is_err());
        // Room frees: woken.
        h.room_freed();
        assert_eq!(rx.try_recv().unwrap(), b);
        // Decided with no room, room freed while its calls ran (the waiters woken then did
        // not include it), then it waits: re-queued at once, and it keeps waiting.
        h.waiters.done(&b);
        let decided = h.room_freed_count;
        h.room_freed();
        assert!(rx.try_recv().is_err(), "not a waiter yet");
        h.wait_for_room(b.clone(), 1, &tx, decided);
        assert_eq!(rx.try_recv().unwrap(), b);
        h.room_freed();
        assert_eq!(rx.try_recv().unwrap(), b);
    }

    #[tokio::test]
    async fn a_drift_repair_that_creates_a_waiters_rules_wakes_it() {
        let (_sim, inst) = sim(2048).await;
        inst.set_capacity(1);
        let m = Metrics::new();
        let c = cluster();
        let a = [rule("a", "192.0.2.1", 80, &[])];
        let b = [rule("b", "192.0.2.2", 80, &[])];
        inst.apply_service(&c, "ns", "a", &a, &m, None)
            .await
            .unwrap();
        let (tx, mut rx) = requeue_channel();
        let r = inst
            .apply_service(&c, "ns", "b", &b, &m, Some(&tx))
            .await
            .unwrap();
        assert!(!r.blocked.is_empty(), "{r:?}");
        // Room appears without anything being deleted (here: a larger table), and the drift
        // check programs b: b is woken, so that its condition stops saying it waits.
        inst.set_capacity(2);
        let r = inst
            .converge_all(
                &c,
                None,
                || {
                    vec![
                        ServiceRules::Want(a.to_vec()),
                        ServiceRules::Want(b.to_vec()),
                    ]
                    .into_iter()
                },
                &m,
            )
            .await
            .unwrap();
        assert_eq!(r.changes, 1, "{r:?}");
        assert_eq!(rx.try_recv().unwrap().name, "b");
    }

    #[tokio::test]
    async fn refused_capacity_rolls_back_and_is_learned() {
        let (sim, inst) = sim(3).await;
        let m = Metrics::new();
        let c = cluster();
        let a = [
            rule("a", "192.0.2.1", 80, &[]),
            rule("a", "192.0.2.1", 81, &[]),
        ];
        let b = [
            rule("b", "192.0.2.2", 80, &[]),
            rule("b", "192.0.2.2", 81, &[]),
        ];
        inst.apply_service(&c, "ns", "a", &a, &m, None)
            .await
            .unwrap();
        let r = inst
            .apply_service(&c, "ns", "b", &b, &m, None)
            .await
            .unwrap();
        assert!(
            matches!(r.blocked[..], [Blocked::Capacity { refused: true, .. }]),
            "{r:?}"
        );
        // b's first rule went in and came out again: a half Service takes no room.
        assert_eq!(sim.rules().len(), 2);
        let calls = sim.request_count();
        let r = inst
            .apply_service(&c, "ns", "b", &b, &m, None)
            .await
            .unwrap();
        assert!(
            matches!(
                r.blocked[..],
                [Blocked::Capacity {
                    capacity: 3,
                    refused: false,
                    ..
                }]
            ),
            "{r:?}"
        );
        assert_eq!(sim.request_count(), calls, "the learned capacity is used");
        // A one-rule Service still fits.
        let d = [rule("d", "192.0.2.4", 80, &[])];
        let r = inst
            .apply_service(&c, "ns", "d", &d, &m, None)
            .await
            .unwrap();
        assert!(r.complete(), "{r:?}");
        assert_eq!(sim.rules().len(), 3);
    }

    #[tokio::test]
    async fn source_ranges_past_index_28_are_predicted_and_refusals_remembered() {
        let (sim, inst) = sim(2048).await;
        let m = Metrics::new();
        let c = cluster();
        let big: Vec<Rule> = (0..28)
            .map(|i| rule("big", "192.0.2.1", 1000 + i, &[]))
            .collect();
        inst.apply_service(&c, "ns", "big", &big, &m, None)
            .await
            .unwrap();
        let calls = sim.request_count();
        let src = [rule("src", "192.0.2.2", 80, &["198.51.100.0/24"])];
        let r = inst
            .apply_service(&c, "ns", "src", &src, &m, None)
            .await
            .unwrap();
        assert!(
            matches!(
                r.blocked[..],
                [Blocked::SourceRanges {
                    index: Some(29),
                    ..
                }]
            ),
            "{r:?}"
        );
        assert_eq!(sim.request_count(), calls);
        // A rule without source ranges is not affected.
        let plain = [rule("plain", "192.0.2.3", 80, &[])];
        let r = inst
            .apply_service(&c, "ns", "plain", &plain, &m, None)
            .await
            .unwrap();
        assert!(r.complete());

        // Holes above 28 fool the estimate: loxilb's 400 is reported the same way, once.
        inst.remove_service(&c, "ns", "big", &m).await.unwrap();
        let filler: Vec<Rule> = (0..27)
            .map(|i| rule("filler", "192.0.2.5", 2000 + i, &[]))
            .collect();
        // plain holds index 29 and 1..=28 are free: filler takes 27 of them, then plain's 29
        // is the latest freed, so loxilb hands it out next although the count says 28.
        inst.apply_service(&c, "ns", "filler", &filler, &m, None)
            .await
            .unwrap();
        inst.remove_service(&c, "ns", "plain", &m).await.unwrap();
        let r = inst
            .apply_service(&c, "ns", "src", &src, &m, None)
            .await
            .unwrap();
        assert!(
            matches!(r.blocked[..], [Blocked::SourceRanges { index: None, .. }]),
            "{r:?}"
        );
        let calls = sim.request_count();
        let r = inst
            .apply_service(&c, "ns", "src", &src, &m, None)
            .await
            .unwrap();
        assert!(!r.blocked.is_empty());
        assert_eq!(sim.request_count(), calls, "a refusal is not repeated");
    }

    #[tokio::test]
    async fn probe_sees_a_restart_between_two_probes() {
        let (sim, inst) = sim(2048).await;
        let m = Metrics::new();
        let c = cluster();
        assert_eq!(inst.probe(&c, &m).await, Probe::CameBack);
        inst.apply_service(&c, "ns", "a", &[rule("a", "192.0.2.1", 80, &[])], &m, None)
            .await
            .unwrap();
        // The first listing placed the marker; probes read it instead of listing rules.
        let states = inst.client.cluster_states().await.unwrap();
        assert!(states.iter().any(|s| s.instance == format!("loxi-ccm.{c}")));
        let before = listings(&m);
        assert!(before >= 1);
        assert_eq!(inst.probe(&c, &m).await, Probe::Up);
        assert_eq!(inst.probe(&c, &m).await, Probe::Up);
        assert_eq!(listings(&m), before);
        sim.restart();
        assert_eq!(inst.probe(&c, &m).await, Probe::LostRules { missing: 1 });
        // Until the replay lists it again, nothing is believed.
        assert_eq!(inst.probe(&c, &m).await, Probe::Up);
        inst.apply_service(&c, "ns", "a", &[rule("a", "192.0.2.1", 80, &[])], &m, None)
            .await
            .unwrap();
        assert_eq!(sim.rules().len(), 1);
        assert_eq!(inst.probe(&c, &m).await, Probe::Up);
        sim.go_down().await;
        assert_eq!(inst.probe(&c, &m).await, Probe::WentDown);
        assert_eq!(inst.probe(&c, &m).await, Probe::Down);
        sim.come_up().await.unwrap();
        assert_eq!(inst.probe(&c, &m).await, Probe::CameBack);
    }

    #[test]
    fn room_goes_to_waiters_in_the_order_they_started_waiting() {
        let (tx, mut rx) = requeue_channel();
        let svc = |n: &str| RuleOwner::new("ns", n);
        let mut w = Waiters::default();
        w.wait(svc("first"), 3, tx.clone());
        w.wait(svc("second"), 1, tx.clone());
        w.wait(svc("third"), 2, tx.clone());
        w.wait(svc("first"), 3, tx.clone()); // waits again: keeps its place
        let now = Instant::now();
        assert_eq!(w.kept_ahead(&svc("new"), 4, now), 0, "nobody woken yet");
        w.wake_all(now);
        let woken: Vec<String> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|r| r.name)
            .collect();
        assert_eq!(woken, ["first", "second", "third"]);
        // 4 free: first (3) and second (1) fit in order; third (2) does not any more.
        assert_eq!(w.kept_ahead(&svc("first"), 4, now), 0);
        assert_eq!(w.kept_ahead(&svc("second"), 4, now), 3);
        assert_eq!(w.kept_ahead(&svc("third"), 4, now), 4);
        assert_eq!(
            w.kept_ahead(&svc("new"), 4, now),
            4,
            "newcomers queue behind"
        );
        // 2 free: first (3) does not fit and holds nobody back.
        assert_eq!(w.kept_ahead(&svc("second"), 2, now), 0);
        assert_eq!(w.kept_ahead(&svc("third"), 2, now), 1);
        w.done(&svc("first"));
        assert_eq!(w.kept_ahead(&svc("third"), 4, now), 1);
        // The turn is over: no room is kept any more.
        assert_eq!(w.kept_ahead(&svc("third"), 4, now + TURN_HOLD), 0);
    }

    #[tokio::test]
    async fn a_restart_while_down_is_replayed_once() {
        let (sim, inst) = sim(2048).await;
        let m = Metrics::new();
        let c = cluster();
        let a = [rule("a", "192.0.2.1", 80, &[])];
        assert_eq!(inst.probe(&c, &m).await, Probe::CameBack);
        inst.apply_service(&c, "ns", "a", &a, &m, None)
            .await
            .unwrap();
        assert_eq!(inst.probe(&c, &m).await, Probe::Up);
        sim.go_down().await;
        assert_eq!(inst.probe(&c, &m).await, Probe::WentDown);
        sim.restart();
        sim.come_up().await.unwrap();
        assert_eq!(inst.probe(&c, &m).await, Probe::CameBack);
        // The replay (as the health loop runs it after CameBack).
        inst.apply_service(&c, "ns", "a", &a, &m, None)
            .await
            .unwrap();
        assert_eq!(sim.rules().len(), 1);
        for _ in 0..3 {
            assert_eq!(
                inst.probe(&c, &m).await,
                Probe::Up,
                "replayed a second time"
            );
        }
    }

    /// Successful rule listings so far, from the call counter.
    fn listings(m: &Metrics) -> usize {
        m.encode()
            .lines()
            .filter(|l| l.contains("op=\"list\"") && l.contains("result=\"ok\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as usize
    }

    #[tokio::test]
    async fn without_the_marker_probes_list_and_see_a_restart() {
        let (sim, inst) = sim(2048).await;
        let m = Metrics::new();
        let c = cluster();
        inst.holdings.lock().await.marker = Marker::Refused;
        assert_eq!(inst.probe(&c, &m).await, Probe::CameBack);
        inst.apply_service(&c, "ns", "a", &[rule("a", "192.0.2.1", 80, &[])], &m, None)
            .await
            .unwrap();
        assert_eq!(inst.probe(&c, &m).await, Probe::Up);
        // Another owner's rule comes and goes: counted, but no reason to replay.
        let mut foreign = rule("x", "192.0.2.9", 80, &[]);
        foreign.name = "default_x:llb-inst0".into();
        inst.client.apply_rule(&to_entry(&foreign)).await.unwrap();
        assert_eq!(inst.probe(&c, &m).await, Probe::Up);
        assert_eq!(inst.rule_count().await, 2);
        inst.client
            .delete_rule("192.0.2.9", 80, "tcp", false)
            .await
            .unwrap();
        assert_eq!(inst.probe(&c, &m).await, Probe::Up);
        assert_eq!(inst.rule_count().await, 1);
        sim.restart();
        assert_eq!(inst.probe(&c, &m).await, Probe::LostRules { missing: 1 });
    }
}
