//! `--appendEPs`: rules shared with other controllers (`loxi_domain::shared_rules`). A
//! Service's pass attaches its endpoints (`oper` 1) and detaches the ones it no longer
//! wants (`oper` 2); a deleted Service detaches what it attached, so loxilb deletes a rule
//! only once nobody's endpoints are left on it. The drift check and the replay only attach
//! what of ours is missing: nothing is ever deleted outright, and endpoints we did not attach
//! are never compared.
//!
//! What was attached is remembered per Service while the process runs. After a restart that
//! memory is empty: the first pass attaches again (loxilb answers "exists") and from then on
//! detaches what changes; endpoints a Service dropped while loxi-ccm was not running stay on
//! the rule (docs/configuration.md#shared-rules).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use loxi_domain::shared_rules::{SharedAction, after, diff_shared};
use loxi_domain::write_window::{Urgency, WriteKind};
use loxi_domain::{Endpoint, Rule, RuleKey, RuleName};
use loxilb_client::ClientError;
use loxilb_client::convert::to_entry;

use super::rules::Holdings;
use super::{ApplyReport, Instance, ServiceRules, is_transport};
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
    /// wants (all of them once it is deleted: `desired` empty) detached.
    pub(super) async fn apply_service_shared(
        &self,
        namespace: &str,
        name: &str,
        desired: &[Rule],
        metrics: &Metrics,
    ) -> Result<ApplyReport, ClientError> {
        let owner = super::window::owner_key(namespace, name);
        let actions = {
            let mut h = self.holdings.lock().await;
            if !h.known
                && let Err(e) = self.refresh(&mut h, metrics).await
            {
                let result = Err(e);
                self.note_failure(&mut h, &result);
                return result;
            }
            let attached = self.shared.of(&owner);
            let actions = diff_shared(desired, |k| h.rules.get(k), &attached);
            h.in_flight.extend(actions.iter().map(|a| a.rule().key));
            prepared(&h, actions)
        };
        if !actions.is_empty() {
            self.note_service_write();
        }
        let outcomes = self
            .shared_calls(actions, |_| owner.clone(), Urgency::Change, metrics)
            .await;
        let mut h = self.holdings.lock().await;
        for (_, action, _) in &outcomes {
            h.in_flight.remove(&action.rule().key);
        }
        let result = self.record_shared(&mut h, outcomes);
        self.note_failure(&mut h, &result);
        result
    }

    /// The drift check's and the replay's pass over shared rules (the holdings locked):
    /// every Service's missing endpoints attached; nothing detached or deleted.
    pub(super) async fn converge_shared(
        &self,
        h: &mut Holdings,
        desired: impl Iterator<Item = ServiceRules>,
        metrics: &Metrics,
    ) -> Result<ApplyReport, ClientError> {
        let mut actions = Vec::new();
        for item in desired {
            if let ServiceRules::Want(rules) = item {
                let missing = diff_shared(&rules, |k| h.rules.get(k), &Attached::new());
                actions.extend(
                    missing
                        .into_iter()
                        .filter(|a| !h.in_flight.contains(&a.rule().key)),
                );
            }
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
        self.record_shared(h, outcomes)
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

    /// Records the writes in the table and in what was attached.
    fn record_shared(
        &self,
        h: &mut Holdings,
        outcomes: Vec<Outcome>,
    ) -> Result<ApplyReport, ClientError> {
        let mut report = ApplyReport::default();
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
                Some(Err(e)) => report.failed.push((key, e)),
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
