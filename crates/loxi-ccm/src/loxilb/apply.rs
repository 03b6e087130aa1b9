//! Applying a diff: one Service's pass (`apply_service`, decided under the instance's lock,
//! called without it), the whole-instance pass of drift checks and replays
//! (`converge_all`), and the single calls.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Instant;

use futures::StreamExt;
use loxi_domain::write_window::{Urgency, WriteKind};
use loxi_domain::{Action, ClusterId, Rule, RuleKey, RuleName, diff_rules};
use loxilb_client::ClientError;
use loxilb_client::convert::to_entry;
use tracing::{debug, warn};

use super::limits::{Limit, limit_of, rules_needed, without_refused};
use super::rules::{FRESH_LISTING, Holdings};
use super::{ApplyReport, Blocked, Instance, Requeue, RuleOwner, ServiceRules, is_transport};
use crate::metrics::Metrics;

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

/// The calls one Service's pass makes, decided under the lock and made without it.
struct Work {
    deletes: Vec<Rule>,
    /// With the `bgp` flag the rule on loxilb was created with: a re-creation's DELETE must
    /// carry it (docs/loxilb-api.md#bgp).
    changes: Vec<(Action, bool)>,
    creates: Vec<Rule>,
    /// Whose writes these are, for their place in the write window.
    sender: Sender,
}

/// Who sends a pass's writes: their urgency in the write window (`window.rs`).
#[derive(Debug, Clone)]
enum Sender {
    /// A Service's own pass (`namespace/name`); `restoring`: the keys whose writes restore
    /// service (an endpoint taken out, the Service's first rules).
    Service {
        owner: String,
        restoring: HashSet<RuleKey>,
    },
    /// A drift check or a replay, its writes for one Service (`namespace/name`, from the
    /// rules' names): that Service's own pass may take them over (`Window::take_over`).
    Whole { owner: String },
}

impl Sender {
    /// The urgency of a write of `key` (`delete`: a DELETE that is not half of a
    /// re-creation).
    fn urgency(&self, key: &RuleKey, delete: bool) -> Urgency {
        match self {
            Sender::Service { restoring, .. } if delete || restoring.contains(key) => {
                Urgency::Restore
            }
            Sender::Service { .. } => Urgency::Change,
            Sender::Whole { .. } if delete => Urgency::Cleanup,
            Sender::Whole { .. } => Urgency::Replay,
        }
    }

    fn owner(&self) -> &str {
        match self {
            Sender::Service { owner, .. } | Sender::Whole { owner } => owner,
        }
    }
}

/// The Service a rule belongs to, as the write window names it (`namespace/name`); a rule
/// whose name is not ours is its own owner.
fn owner_of(rule: &Rule) -> String {
    RuleName::parse(&rule.name).map_or_else(
        || rule.name.clone(),
        |n| super::window::owner_key(&n.namespace, &n.service),
    )
}

/// The keys of a Service's pass whose writes restore service: a change that takes an
/// endpoint out (its Node or Pod is gone or not ready), and every new rule of a Service that
/// holds none on this instance yet.
fn restoring(
    h: &Holdings,
    owner: (&str, &str),
    changes: &[Action],
    creates: &[Rule],
) -> HashSet<RuleKey> {
    let mut keys: HashSet<RuleKey> = changes
        .iter()
        .filter_map(|a| match a {
            Action::Update(want) | Action::Recreate(want) => Some(want),
            _ => None,
        })
        .filter(|want| {
            h.rules.get(&want.key).is_some_and(|have| {
                have.endpoints.iter().any(|e| {
                    !want
                        .endpoints
                        .iter()
                        .any(|w| w.ip == e.ip && w.target_port == e.target_port)
                })
            })
        })
        .map(|r| r.key)
        .collect();
    if h.rules.of_service(owner.0, owner.1).next().is_none() {
        keys.extend(creates.iter().map(|r| r.key));
    }
    keys
}

/// How a write ended: sent (with loxilb's answer), or dropped unsent because a newer write of
/// the same rule came while it waited.
enum Sent {
    Answered(Result<(), ClientError>),
    Superseded,
}

/// Tells the window how long loxilb took. A write that never reached it (refused
/// connection, TLS) says nothing about loxilb's speed: its room just goes back.
pub(super) fn answered<T>(
    turn: super::window::Turn<'_>,
    kind: WriteKind,
    result: &Result<T, ClientError>,
) {
    match result {
        Err(ClientError::Unreachable { .. } | ClientError::Tls { .. }) => drop(turn),
        _ => turn.answered(kind),
    }
}

/// What a DELETE did; `Err`: loxilb could not be reached (the pass stops there). A write
/// that timed out is no such failure: its outcome is unknown (`CallResult::Unknown`).
fn deleted(key: RuleKey, sent: Sent) -> Result<CallResult, ClientError> {
    match sent {
        Sent::Superseded => Ok(CallResult::Superseded),
        Sent::Answered(Ok(())) => Ok(CallResult::Deleted(key)),
        Sent::Answered(Err(e @ ClientError::Timeout { .. })) => Ok(CallResult::Unknown(key, e)),
        Sent::Answered(Err(e)) if is_transport(&e) => Err(e),
        Sent::Answered(Err(e)) => Ok(CallResult::Failed(key, e)),
    }
}

/// What a POST did, a refusal for one of loxilb's limits named as such; `Err` as for
/// [`deleted`].
fn posted(rule: Rule, update: bool, sent: Sent) -> Result<CallResult, ClientError> {
    match sent {
        Sent::Superseded => Ok(CallResult::Superseded),
        Sent::Answered(Ok(())) => Ok(CallResult::Posted { rule, update }),
        Sent::Answered(Err(e @ ClientError::Timeout { .. })) => {
            Ok(CallResult::Unknown(rule.key, e))
        }
        Sent::Answered(Err(e)) if is_transport(&e) => Err(e),
        Sent::Answered(Err(e)) => Ok(match limit_of(&e) {
            Some(limit) => CallResult::Refused { rule, limit },
            None => CallResult::Failed(rule.key, e),
        }),
    }
}

/// Ends the window's whole-pass mode however the pass ends (`Window::whole_pass`).
struct WholePassEnds<'a>(&'a Instance);

impl Drop for WholePassEnds<'_> {
    fn drop(&mut self) {
        self.0.window.whole_pass(false);
    }
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
    /// Not sent: a newer write of the same rule superseded it.
    Superseded,
    /// Sent, no answer in time: loxilb may still apply it (it queues writes). The rule is
    /// read back once loxilb has no write of ours left (`Instance::check_unsure`).
    Unknown(RuleKey, ClientError),
}

/// Whether recording these outcomes lists loxilb's rules ([`Instance::record`] learns the
/// real capacity after a capacity refusal).
fn needs_listing(outcomes: &[CallResult]) -> bool {
    outcomes.iter().any(|o| {
        matches!(
            o,
            CallResult::Refused {
                limit: Limit::Capacity,
                ..
            }
        )
    })
}

/// Rules grouped by the Service they belong to ([`owner_of`]), in first-seen order.
fn group_by_owner<T>(items: Vec<T>, rule: impl Fn(&T) -> &Rule) -> Vec<(String, Vec<T>)> {
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut groups: Vec<(String, Vec<T>)> = Vec::new();
    for item in items {
        let owner = owner_of(rule(&item));
        match index.get(&owner) {
            Some(&i) => groups[i].1.push(item),
            None => {
                index.insert(owner.clone(), groups.len());
                groups.push((owner, vec![item]));
            }
        }
    }
    groups
}

/// A whole-instance pass's deletes and changes as one [`Work`] per Service (its deletes
/// first, each in the order given).
fn works_by_owner(deletes: Vec<Rule>, changes: Vec<(Action, bool)>) -> Vec<Work> {
    enum Part {
        Delete(Rule),
        Change(Action, bool),
    }
    let parts = deletes.into_iter().map(Part::Delete).chain(
        changes
            .into_iter()
            .filter(|(a, _)| matches!(a, Action::Update(_) | Action::Recreate(_)))
            .map(|(a, bgp)| Part::Change(a, bgp)),
    );
    group_by_owner(parts.collect(), |part| match part {
        Part::Delete(r)
        | Part::Change(
            Action::Create(r)
            | Action::Update(r)
            | Action::Recreate(r)
            | Action::Delete(r)
            | Action::Conflict { wanted: r, .. },
            _,
        ) => r,
    })
    .into_iter()
    .map(|(owner, parts)| {
        let mut work = Work {
            deletes: Vec::new(),
            changes: Vec::new(),
            creates: Vec::new(),
            sender: Sender::Whole { owner },
        };
        for part in parts {
            match part {
                Part::Delete(r) => work.deletes.push(r),
                Part::Change(a, bgp) => work.changes.push((a, bgp)),
            }
        }
        work
    })
    .collect()
}

impl Instance {
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
        if self.appends_endpoints() {
            return self
                .apply_service_shared(namespace, name, desired, metrics, requeue)
                .await;
        }
        let in_scope = |rule: &Rule| {
            RuleName::parse(&rule.name).is_some_and(|n| {
                n.cluster == cluster.as_str() && n.namespace == namespace && n.service == name
            })
        };
        // 0. What a replay or drift repair running here still had to send for this Service
        //    is this pass's now (it decides from what the Service wants now).
        self.take_over_from_whole(&super::window::owner_key(namespace, name))
            .await;
        // 1. Decide under the lock (and reserve room for the new rules).
        let mut report = ApplyReport::default();
        let (work, freed_before) = {
            let mut h = self.holdings.lock().await;
            self.ensure_listed(&mut h, metrics).await?;
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
            let changes = without_refused(&h, changes, &mut report);
            let actions: Vec<Action> = changes.iter().map(|(a, _)| a.clone()).collect();
            // Rules we sent and never heard back about: left alone until read back
            // (`Instance::check_unsure`), so that no write is sent twice.
            let unsure = |k: &RuleKey| h.unsure.contains(k);
            let waiting_check: Vec<RuleKey> = deletes
                .iter()
                .chain(&creates)
                .map(|r| r.key)
                .chain(actions.iter().filter_map(|a| match a {
                    Action::Update(r) | Action::Recreate(r) => Some(r.key),
                    _ => None,
                }))
                .filter(|k| unsure(k))
                .collect();
            let work = Work {
                sender: Sender::Service {
                    owner: super::window::owner_key(namespace, name),
                    restoring: restoring(&h, (namespace, name), &actions, &creates),
                },
                deletes: deletes.into_iter().filter(|r| !unsure(&r.key)).collect(),
                changes: changes
                    .into_iter()
                    .filter(|(a, _)| match a {
                        Action::Update(r) | Action::Recreate(r) => !unsure(&r.key),
                        _ => true,
                    })
                    .collect(),
                creates: creates.into_iter().filter(|r| !unsure(&r.key)).collect(),
            };
            for key in waiting_check {
                report.failed.push((key, self.unanswered()));
            }
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
                // The newer write that superseded it carries the newer state, and its pass
                // records what it did.
                CallResult::Superseded => report.superseded += 1,
                CallResult::Unknown(key, e) => {
                    h.unsure.insert(key);
                    metrics.write_unanswered(self.url());
                    report.failed.push((key, e));
                }
            }
        }
        if freed {
            h.room_freed();
        }
        self.report_table(h, metrics);
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
        let sender = &work.sender;
        let owner = Some(sender.owner());
        // The deletes side by side (at most `parallel_calls` at once, and what the write
        // window allows): they are independent (a Service's ports, a drift check's orphans),
        // and a deleted Service's rules should all be gone at once.
        let parallel = self.parallel_calls.load(Ordering::Relaxed).max(1);
        // (The calls are gathered first: a stream over a borrowing closure would not be
        // `Send` for every lifetime, as the spawned reconcile needs.)
        let calls: Vec<_> = work
            .deletes
            .iter()
            .map(|rule| {
                self.delete(
                    &rule.key,
                    rule.bgp,
                    sender.urgency(&rule.key, true),
                    owner,
                    metrics,
                )
            })
            .collect();
        let sent_deletes: Vec<Sent> = futures::stream::iter(calls)
            .buffered(parallel)
            .collect()
            .await;
        let mut transport = None;
        for (rule, sent) in work.deletes.iter().zip(sent_deletes) {
            match deleted(rule.key, sent) {
                Ok(r) => out.push(r),
                Err(e) => {
                    transport.get_or_insert(e);
                }
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
            .map(|rule| self.post(rule, true, sender.urgency(&rule.key, false), owner, metrics))
            .collect();
        let sent_posts: Vec<Sent> = futures::stream::iter(calls)
            .buffered(parallel)
            .collect()
            .await;
        for (rule, sent) in updates.into_iter().zip(sent_posts) {
            match posted(rule, true, sent) {
                Ok(r) => out.push(r),
                Err(e) => {
                    transport.get_or_insert(e);
                }
            }
        }
        if transport.is_some() {
            return (out, transport);
        }
        for (action, stored_bgp) in recreates {
            let Action::Recreate(rule) = action else {
                continue;
            };
            let urgency = sender.urgency(&rule.key, false);
            // loxilb reuses the index just freed (LIFO), so this needs no new room.
            let sent = self
                .delete(&rule.key, stored_bgp, urgency, owner, metrics)
                .await;
            match deleted(rule.key, sent) {
                Err(e) => return (out, Some(e)),
                Ok(r @ CallResult::Deleted(_)) => out.push(r),
                Ok(r) => {
                    out.push(r);
                    continue;
                }
            }
            let sent = self.post(&rule, false, urgency, owner, metrics).await;
            match posted(rule, false, sent) {
                Err(e) => return (out, Some(e)),
                Ok(r) => out.push(r),
            }
        }
        let mut created = Vec::new();
        let mut refused = false;
        for rule in work.creates {
            let (key, bgp) = (rule.key, rule.bgp);
            let sent = self
                .post(&rule, false, sender.urgency(&key, false), owner, metrics)
                .await;
            match posted(rule, false, sent) {
                Err(e) => return (out, Some(e)),
                Ok(r @ CallResult::Posted { .. }) => {
                    created.push((key, bgp));
                    out.push(r);
                }
                Ok(r @ CallResult::Refused { .. }) => {
                    out.push(r);
                    refused = true;
                    break;
                }
                Ok(r) => out.push(r),
            }
        }
        if refused {
            // A Service is never half-programmed by a limit, and takes no room it cannot use.
            for (key, bgp) in created {
                let sent = self
                    .delete(&key, bgp, Urgency::Restore, owner, metrics)
                    .await;
                match deleted(key, sent) {
                    Err(e) => return (out, Some(e)),
                    Ok(CallResult::Deleted(key)) => out.push(CallResult::RolledBack(key)),
                    Ok(CallResult::Failed(key, e)) => {
                        warn!(instance = self.url(), %key, error = %e, "could not roll back a rule");
                        out.push(CallResult::Failed(key, e));
                    }
                    Ok(r) => out.push(r),
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
        // One whole-instance pass at a time: a replay and a drift check never interleave.
        let _one = self.whole_pass.lock().await;
        let mut h = self.holdings.lock().await;
        // A listing made moments ago (a Service's first pass after a take-over) is current:
        // every write since went through this cache.
        let refreshed = if h.known && h.listed_at.is_some_and(|t| t.elapsed() < FRESH_LISTING) {
            Ok(())
        } else {
            self.refresh(&mut h, metrics).await
        };
        let result = match refreshed {
            Ok(()) if self.appends_endpoints() => {
                self.converge_shared(&mut h, desired(), metrics).await
            }
            Ok(()) => {
                drop(h);
                let result = self
                    .converge_unlocked(cluster, namespace, desired, metrics)
                    .await;
                h = self.holdings.lock().await;
                result
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

    /// The whole-instance pass, decided under the instance's lock and sent without it
    /// (docs/architecture.md#writing-to-a-slow-loxilb): a replay of thousands of rules on a
    /// loxilb that takes a second per write lasts long, and meanwhile a Service's own pass
    /// writes there too, its urgent writes ahead of the replay's in the write window. A
    /// Service's pass takes its part of this one over (`Instance::take_over_from_whole`):
    /// what this pass still had to send for it is dropped, so no rule is written twice.
    async fn converge_unlocked<I>(
        &self,
        cluster: &ClusterId,
        namespace: Option<&str>,
        desired: impl FnOnce() -> I,
        metrics: &Metrics,
    ) -> Result<ApplyReport, ClientError>
    where
        I: Iterator<Item = ServiceRules>,
    {
        let mut report = ApplyReport::default();
        self.window.whole_pass(true);
        let _ended = WholePassEnds(self);
        // 1. Decide under the lock (the desired rules are asked for only now: computed
        //    earlier, they could re-create the rules of a Service whose cleanup ran since).
        let (deletes, changes, creates) = {
            let mut h = self.holdings.lock().await;
            if !h.known {
                self.refresh(&mut h, metrics).await?;
            }
            let (mut deletes, mut changes, mut creates) =
                decide_all(&h, cluster, namespace, desired(), &mut report);
            // Keys a Service's own pass is changing right now are left to it: the listing
            // may show them before or after its calls, and sending the same change again
            // only doubles the writes. Its pass records what it did; anything it leaves
            // wrong is there at the next check.
            let busy = |key: &RuleKey| h.in_flight.contains(key);
            deletes.retain(|r| !busy(&r.key));
            creates.retain(|r| !busy(&r.key));
            changes.retain(|a| match a {
                Action::Update(r) | Action::Recreate(r) => !busy(&r.key),
                _ => true,
            });
            if tracing::enabled!(tracing::Level::DEBUG) {
                Self::log_repairs(self.url(), &h, &deletes, &changes, &creates);
            }
            let changes = without_refused(&h, changes, &mut report);
            (deletes, changes, creates)
        };
        // 2. Deletes and changes first: they make room for what is created below.
        self.send_whole(works_by_owner(deletes, changes), &mut report, metrics)
            .await?;
        // 3. New rules, one group per Service: each Service gets all its new rules or none.
        //    Room is taken for a group before its calls, so the limits see the groups
        //    admitted before it.
        let (admitted, taken) = {
            let mut h = self.holdings.lock().await;
            let mut admitted = Vec::new();
            let mut taken = 0;
            for (owner, mut group) in group_by_owner(creates, |r| r) {
                if let Some(b) = self.check_limits(&h, &group, 0) {
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
                    sender: Sender::Whole { owner },
                });
            }
            // Groups with source ranges start first, for the same reason.
            admitted.sort_by_key(|w| w.creates.iter().all(|r| r.allowed_sources.is_empty()));
            (admitted, taken)
        };
        let sent = self.send_whole(admitted, &mut report, metrics).await;
        self.holdings.lock().await.reserved -= taken;
        sent.map(|()| report)
    }

    /// Sends a whole-instance pass's works side by side (as many at once as
    /// `parallel_calls`; the write window orders their writes among everyone's), recording
    /// each as it ends. A Service's work is marked under way while its calls run, so that
    /// the Service's own pass waits for them before deciding. Stops starting works after a
    /// transport failure.
    async fn send_whole(
        &self,
        works: Vec<Work>,
        report: &mut ApplyReport,
        metrics: &Metrics,
    ) -> Result<(), ClientError> {
        let failed = std::sync::atomic::AtomicBool::new(false);
        let parallel = self.parallel_calls.load(Ordering::Relaxed).max(1);
        let start = |work: Work| {
            let failed = &failed;
            async move {
                let owner = work.sender.owner().to_string();
                if failed.load(Ordering::SeqCst) {
                    return (owner, Vec::new(), None);
                }
                // Not the instance's lock: a future of this stream waiting for it would hold
                // it unpolled while this pass waits for it below.
                self.whole_running().insert(owner.clone());
                let (outcomes, transport) = self.call(work, metrics).await;
                if transport.is_some() {
                    failed.store(true, Ordering::SeqCst);
                }
                (owner, outcomes, transport)
            }
        };
        let mut calls =
            futures::stream::iter(works.into_iter().map(start)).buffer_unordered(parallel);
        let mut failure = None;
        let mut ended = Vec::new();
        // Parts whose recording lists loxilb's rules (a capacity refusal): a listing waits for
        // every write in flight, this pass's own too, which are not polled while it records.
        // Recorded once no call of this pass is left.
        let mut listing_parts = Vec::new();
        let mut more = true;
        while more || !ended.is_empty() {
            // The calls go on while this pass waits for the lock to record what ended:
            // one of them may hold a write a listing under that lock waits for.
            tokio::select! {
                next = calls.next(), if more => match next {
                    Some(one) => ended.push(one),
                    None => more = false,
                },
                mut h = self.holdings.lock(), if !ended.is_empty() => {
                    for part in ended.drain(..) {
                        if more && needs_listing(&part.1) {
                            listing_parts.push(part);
                            continue;
                        }
                        self.record_part(&mut h, part, report, metrics, &mut failure).await;
                    }
                    drop(h);
                    self.whole_progress.notify_waiters();
                }
            }
        }
        if !listing_parts.is_empty() {
            let mut h = self.holdings.lock().await;
            for part in listing_parts {
                self.record_part(&mut h, part, report, metrics, &mut failure)
                    .await;
            }
            drop(h);
            self.whole_progress.notify_waiters();
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Records one Service's part of a whole-instance pass and marks it no longer under way.
    /// Everything that was called is recorded, even after a failure (the first is kept).
    async fn record_part(
        &self,
        h: &mut Holdings,
        (owner, outcomes, transport): (String, Vec<CallResult>, Option<ClientError>),
        report: &mut ApplyReport,
        metrics: &Metrics,
        failure: &mut Option<ClientError>,
    ) {
        if let Err(e) = self.record(h, outcomes, report, metrics).await {
            failure.get_or_insert(e);
        }
        self.whole_running().remove(&owner);
        if let Some(e) = transport {
            failure.get_or_insert(e);
        }
    }

    /// Services whose part of the running whole-instance pass has calls under way: their
    /// own pass waits for these to be recorded (`take_over_from_whole`).
    fn whole_running(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.whole_running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A Service's own pass takes its part of a running whole-instance pass over (see
    /// `converge_unlocked`): that pass's waiting writes for it are dropped, and the ones it
    /// has under way end and are recorded before this pass decides.
    async fn take_over_from_whole(&self, owner: &str) {
        if !self.window.take_over(owner) {
            return;
        }
        loop {
            let progressed = self.whole_progress.notified();
            let mut progressed = std::pin::pin!(progressed);
            progressed.as_mut().enable();
            if !self.whole_running().contains(owner) {
                return;
            }
            progressed.await;
        }
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

    /// POSTs the rule. An in-place `update` says `bgp: false`: loxilb never re-reads the flag
    /// on an update but would count one more advertisement for a 200 carrying `bgp: true`
    /// (docs/loxilb-api.md#bgp), so the address stays advertised exactly once per rule.
    async fn post(
        &self,
        rule: &Rule,
        update: bool,
        urgency: Urgency,
        owner: Option<&str>,
        metrics: &Metrics,
    ) -> Sent {
        let Some(turn) = self.window.turn(Some(rule.key), owner, urgency).await else {
            metrics.write_superseded(self.url());
            return Sent::Superseded;
        };
        let started = Instant::now();
        let mut entry = to_entry(rule);
        if update {
            entry.service_arguments.bgp = false;
        }
        let result = self.client.apply_rule(&entry).await;
        answered(turn, WriteKind::Post, &result);
        metrics.loxilb_call(
            self.url(),
            "apply",
            started.elapsed(),
            result.as_ref().err(),
        );
        if result.is_ok() && entry.service_arguments.bgp {
            metrics.bgp_advertisement_changed(self.url(), "announce");
        }
        Sent::Answered(result.map(|_| ()))
    }

    /// DELETEs the rule by its tuple; `bgp`: the rule was created advertising its address,
    /// and the DELETE withdraws that advertisement (`?bgp=true`).
    async fn delete(
        &self,
        key: &RuleKey,
        bgp: bool,
        urgency: Urgency,
        owner: Option<&str>,
        metrics: &Metrics,
    ) -> Sent {
        let Some(turn) = self.window.turn(Some(*key), owner, urgency).await else {
            metrics.write_superseded(self.url());
            return Sent::Superseded;
        };
        let started = Instant::now();
        let result = self
            .client
            .delete_rule(&key.ip.to_string(), key.port, key.protocol.as_loxilb(), bgp)
            .await;
        answered(turn, WriteKind::Delete, &result);
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
        Sent::Answered(result.map(|_| ()))
    }
}
