//! `--appendEPs`: rules shared with other controllers (`loxi_domain::shared_rules`). A
//! Service's pass attaches its endpoints (`oper` 1) and detaches the ones it no longer
//! wants (`oper` 2); a deleted Service detaches what it attached, so loxilb deletes a rule
//! only once nobody's endpoints are left on it. The drift check and the replay only attach
//! what of ours is missing: nothing is ever deleted outright, and endpoints we did not attach
//! are never compared.
//!
//! What was attached is remembered per Service while the process runs, and learned back by
//! a restarted one: every pass, drift check and replay recognises the endpoints a Service
//! wants that loxilb holds as ours (`shared_rules::recognised`), and a Service deleted while
//! loxi-ccm was down is recognised from the rules it would have (`Instance::recall_shared`)
//! before they are detached. Endpoints a Service stopped wanting while loxi-ccm was down are
//! not recognised and stay on the rule (docs/configuration.md#shared-rules).
//!
//! An attach that would create a rule obeys the limits our own rules do (`limits`): it
//! counts against the rule table, is held back (`CapacityExceeded`) when it does not fit,
//! and waits for room like a Service's new rules.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use loxi_domain::shared_rules::{SharedAction, after, diff_shared, join, recognised};
use loxi_domain::write_window::{Urgency, WriteKind};
use loxi_domain::{Endpoint, Rule, RuleKey, RuleName};
use loxilb_client::ClientError;
use loxilb_client::convert::to_entry;

use super::limits::limit_of;
use super::rules::Holdings;
use super::{ApplyReport, Blocked, Instance, Requeue, RuleOwner, ServiceRules, is_transport};
use crate::metrics::Metrics;

/// The endpoints of ours on each shared key, per Service (`namespace/name`).
type Attached = BTreeMap<RuleKey, Vec<Endpoint>>;

/// Whether rules are shared, and what this controller attached to them.
#[derive(Default)]
pub struct SharedRules {
    on: AtomicBool,
    attached: std::sync::Mutex<BTreeMap<String, Attached>>,
}

impl SharedRules {
    fn of(&self, owner: &str) -> Attached {
        self.attached
            .lock()
            .ok()
            .and_then(|m| m.get(owner).cloned())
            .unwrap_or_default()
    }

    /// Adds endpoints of `owner`'s found on loxilb to what it attached.
    fn adopt(&self, owner: &str, found: Attached) {
        if found.is_empty() {
            return;
        }
        if let Ok(mut all) = self.attached.lock() {
            join(all.entry(owner.to_string()).or_default(), found);
        }
    }

    /// Remembers what a write of `owner`'s did.
    fn note(&self, owner: &str, action: &SharedAction) {
        let Ok(mut all) = self.attached.lock() else {
            return;
        };
        let mine = all.entry(owner.to_string()).or_default();
        match action {
            SharedAction::Attach(rule) => {
                mine.insert(rule.key, rule.endpoints.clone());
            }
            SharedAction::Detach(rule) => {
                if let Some(eps) = mine.get_mut(&rule.key) {
                    eps.retain(|e| {
                        !rule
                            .endpoints
                            .iter()
                            .any(|g| g.ip == e.ip && g.target_port == e.target_port)
                    });
                    if eps.is_empty() {
                        mine.remove(&rule.key);
                    }
                }
            }
        }
        if mine.is_empty() {
            all.remove(owner);
        }
    }
}

/// The Service a rule of ours belongs to, from its name.
fn owner_of(rule: &Rule) -> Option<String> {
    RuleName::parse(&rule.name).map(|n| super::window::owner_key(&n.namespace, &n.service))
}

/// A write and how it ended (`None`: superseded, never sent).
type Outcome = (String, SharedAction, Option<Result<(), ClientError>>);

impl Instance {
    /// `--appendEPs`: rules are shared (attach and detach, never delete).
    pub fn set_append_endpoints(&self, on: bool) {
        self.shared.on.store(on, Ordering::Relaxed);
    }

    pub(super) fn appends_endpoints(&self) -> bool {
        self.shared.on.load(Ordering::Relaxed)
    }

    /// A Service's pass over shared rules: its endpoints attached, the ones it no longer
    /// wants (all of them once it is deleted: `desired` empty) detached. Attaches that would
    /// create a rule are held back when they do not fit (module docs); with `requeue`, the
    /// Service is sent there once room frees.
    pub(super) async fn apply_service_shared(
        &self,
        namespace: &str,
        name: &str,
        desired: &[Rule],
        metrics: &Metrics,
        requeue: Option<&Requeue>,
    ) -> Result<ApplyReport, ClientError> {
        let owner = super::window::owner_key(namespace, name);
        let me = RuleOwner::new(namespace, name);
        let mut report = ApplyReport::default();
        let (actions, reserved, freed_before) = {
            let mut h = self.holdings.lock().await;
            self.ensure_listed(&mut h, metrics).await?;
            self.shared
                .adopt(&owner, recognised(desired, |k| h.rules.get(k)));
            let attached = self.shared.of(&owner);
            let actions = diff_shared(desired, |k| h.rules.get(k), &attached);
            let free = self.effective_capacity(&h).saturating_sub(h.taken());
            let kept = h.waiters.kept_ahead(&me, free, Instant::now());
            let (actions, reserved) = self.admitted(&h, actions, kept, &mut report, metrics);
            h.reserved += reserved;
            h.in_flight.extend(actions.iter().map(|a| a.rule().key));
            (prepared(&h, actions), reserved, h.room_freed_count)
        };
        if !actions.is_empty() {
            self.note_service_write();
        }
        let outcomes = self
            .shared_calls(actions, |_| owner.clone(), Urgency::Change, metrics)
            .await;
        let mut h = self.holdings.lock().await;
        h.reserved -= reserved;
        for (_, action, _) in &outcomes {
            h.in_flight.remove(&action.rule().key);
        }
        let result = self.record_shared(&mut h, outcomes, report, metrics).await;
        // Registered under the same lock that frees room, so a wake-up is never missed.
        match (&result, requeue) {
            (Ok(report), Some(tx)) if !report.blocked.is_empty() => {
                let need = super::limits::rules_needed(report);
                h.wait_for_room(me, need, tx, freed_before);
            }
            _ => h.waiters.done(&me),
        }
        self.note_failure(&mut h, &result);
        result
    }

    /// Before a Service deleted while loxi-ccm was down is detached: the endpoints of
    /// `rules` (what it would have now) that loxilb holds are recognised as its own, so that
    /// its removal detaches them (module docs). Nothing when rules are not shared.
    pub async fn recall_shared(
        &self,
        namespace: &str,
        name: &str,
        rules: &[Rule],
        metrics: &Metrics,
    ) -> Result<(), ClientError> {
        if !self.appends_endpoints() || rules.is_empty() {
            return Ok(());
        }
        let mut h = self.holdings.lock().await;
        self.ensure_listed(&mut h, metrics).await?;
        let owner = super::window::owner_key(namespace, name);
        self.shared
            .adopt(&owner, recognised(rules, |k| h.rules.get(k)));
        Ok(())
    }

    /// The writes that may go now: an attach creating a rule (its key not held) only when
    /// the Service's new rules all fit, as [`Instance::check_limits`] decides for our own
    /// rules (`kept` rules of room are promised to Services that waited longer). Returns
    /// them and the number of rules they create (room reserved for the calls).
    fn admitted(
        &self,
        h: &Holdings,
        actions: Vec<SharedAction>,
        kept: usize,
        report: &mut ApplyReport,
        metrics: &Metrics,
    ) -> (Vec<SharedAction>, usize) {
        let creates = |a: &SharedAction| matches!(a, SharedAction::Attach(r) if h.rules.get(&r.key).is_none());
        let mut new: Vec<Rule> = actions
            .iter()
            .filter(|a| creates(a))
            .map(|a| a.rule().clone())
            .collect();
        if new.is_empty() {
            return (actions, 0);
        }
        // Rules with source ranges first: they need the low indexes.
        new.sort_by_key(|r| r.allowed_sources.is_empty());
        match self.check_limits(h, &new, kept) {
            None => (actions, new.len()),
            Some(b) => {
                metrics.limit_hit(self.url(), b.reason());
                report.blocked.push(b);
                (actions.into_iter().filter(|a| !creates(a)).collect(), 0)
            }
        }
    }

    /// The drift check's and the replay's pass over shared rules (the holdings locked):
    /// every Service's endpoints on loxilb recognised as ours, its missing ones attached;
    /// nothing detached or deleted. A Service's attaches that would create rules go only
    /// when they all fit (nothing is promised to waiters here, as for our own rules).
    pub(super) async fn converge_shared(
        &self,
        h: &mut Holdings,
        desired: impl Iterator<Item = ServiceRules>,
        metrics: &Metrics,
    ) -> Result<ApplyReport, ClientError> {
        let mut report = ApplyReport::default();
        let mut actions = Vec::new();
        let mut reserved = 0;
        for item in desired {
            let ServiceRules::Want(rules) = item else {
                continue;
            };
            if let Some(owner) = rules.first().and_then(owner_of) {
                self.shared
                    .adopt(&owner, recognised(&rules, |k| h.rules.get(k)));
            }
            let missing: Vec<SharedAction> =
                diff_shared(&rules, |k| h.rules.get(k), &Attached::new())
                    .into_iter()
                    .filter(|a| !h.in_flight.contains(&a.rule().key))
                    .collect();
            let (admitted, creates) = self.admitted(h, missing, 0, &mut report, metrics);
            h.reserved += creates;
            reserved += creates;
            actions.extend(admitted);
        }
        let actions = prepared(h, actions);
        let outcomes = self
            .shared_calls(
                actions,
                |rule| owner_of(rule).unwrap_or_default(),
                Urgency::Replay,
                metrics,
            )
            .await;
        h.reserved -= reserved;
        self.record_shared(h, outcomes, report, metrics).await
    }

    /// The writes one by one, in order (attaches before detaches). Stops at the first
    /// transport failure.
    async fn shared_calls(
        &self,
        actions: Vec<SharedAction>,
        owner: impl Fn(&Rule) -> String,
        urgency: Urgency,
        metrics: &Metrics,
    ) -> Vec<Outcome> {
        let mut out = Vec::new();
        for action in actions {
            let who = owner(action.rule());
            let sent = self
                .shared_call(&action, Some(&who), urgency, metrics)
                .await;
            let stop = matches!(&sent, Some(Err(e)) if is_transport(e));
            out.push((who, action, sent));
            if stop {
                break;
            }
        }
        out
    }

    async fn shared_call(
        &self,
        action: &SharedAction,
        owner: Option<&str>,
        urgency: Urgency,
        metrics: &Metrics,
    ) -> Option<Result<(), ClientError>> {
        let key = action.rule().key;
        let Some(turn) = self.window.turn(Some(key), owner, urgency).await else {
            metrics.write_superseded(self.url());
            return None;
        };
        let mut entry = to_entry(action.rule());
        entry.service_arguments.oper = match action {
            SharedAction::Attach(_) => 1,
            SharedAction::Detach(_) => 2,
        };
        let started = Instant::now();
        let result = self.client.apply_rule(&entry).await.map(|_| ());
        super::apply::answered(turn, WriteKind::Post, &result);
        metrics.loxilb_call(
            self.url(),
            "apply",
            started.elapsed(),
            result.as_ref().err(),
        );
        // A detach from a rule that is gone already did what it was for.
        Some(match (action, result) {
            (SharedAction::Detach(_), Err(ClientError::Rejected { status: 404, .. })) => Ok(()),
            (_, result) => result,
        })
    }

    /// Records the writes in the table and in what was attached, and in `report`. An
    /// attach loxilb refused for a limit is held back like our own rules
    /// (`Blocked`): not sent again unchanged until room frees. Fails only when a listing
    /// needed to learn loxilb's real capacity fails.
    async fn record_shared(
        &self,
        h: &mut Holdings,
        outcomes: Vec<Outcome>,
        mut report: ApplyReport,
        metrics: &Metrics,
    ) -> Result<ApplyReport, ClientError> {
        let mut transport = None;
        for (owner, action, sent) in outcomes {
            let key = action.rule().key;
            match sent {
                None => report.superseded += 1,
                Some(Ok(())) => {
                    // Endpoints changed on a rule that was there: an in-place update.
                    report.updated += usize::from(h.rules.get(&key).is_some());
                    match after(h.rules.get(&key), &action) {
                        Some(rule) => h.rules.insert(rule),
                        None => {
                            h.rules.remove(&key);
                            h.room_freed();
                        }
                    }
                    self.shared.note(&owner, &action);
                    report.changes += 1;
                }
                Some(Err(e)) if is_transport(&e) => transport = Some(e),
                Some(Err(e)) => match (limit_of(&e), &action) {
                    (Some(limit), SharedAction::Attach(rule)) => {
                        let why = match limit {
                            super::limits::Limit::Capacity => {
                                // Our count was off (rules added by someone else): learn the
                                // real size from what loxilb holds, as for our own rules.
                                self.refresh(h, metrics).await?;
                                let size = h.held();
                                h.learned_capacity = Some(size);
                                Blocked::Capacity {
                                    held: size,
                                    new: 1,
                                    capacity: size,
                                    refused: true,
                                }
                            }
                            super::limits::Limit::SourceRanges => {
                                Blocked::SourceRanges { key, index: None }
                            }
                        };
                        metrics.limit_hit(self.url(), why.reason());
                        h.refused.insert(key, (rule.clone(), why.clone()));
                        report.blocked.push(why);
                    }
                    _ => report.failed.push((key, e)),
                },
            }
        }
        match transport {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }
}

/// The writes as sent: an attach to a rule loxilb holds says `bgp: false` (loxilb counts an
/// advertisement for every 200 carrying `bgp: true`: docs/loxilb-api.md#bgp), and a detach
/// never asks for one.
fn prepared(h: &Holdings, actions: Vec<SharedAction>) -> Vec<SharedAction> {
    actions
        .into_iter()
        .map(|a| match a {
            SharedAction::Attach(mut rule) => {
                if h.rules.get(&rule.key).is_some() {
                    rule.bgp = false;
                }
                SharedAction::Attach(rule)
            }
            SharedAction::Detach(mut rule) => {
                rule.bgp = false;
                SharedAction::Detach(rule)
            }
        })
        .collect()
}
