//! The loxilb instances: a cache of the rules each one holds, health, and applying a diff.
//!
//! Per-Service reconciles read the cache instead of listing loxilb each time; a full listing
//! refreshes it at start-up, after an instance comes back, and at every drift check. All
//! writes to one instance go through its lock, so a drift check and a reconcile never race
//! on the same rules (loxilb serializes its config calls anyway, CONTRACT.md §1.1).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use loxi_domain::{Action, ClusterId, Rule, RuleKey, RuleName, diff_rules};
use loxilb_client::convert::{from_entry, to_entry};
use loxilb_client::{ClientError, LoxilbClient};
use tokio::sync::Mutex;

use crate::metrics::Metrics;

/// What the controller knows an instance holds.
#[derive(Debug, Default)]
struct Holdings {
    /// False until the first successful listing, and again after a transport failure.
    known: bool,
    rules: HashMap<RuleKey, Rule>,
}

pub struct Instance {
    pub client: LoxilbClient,
    healthy: AtomicBool,
    holdings: Mutex<Holdings>,
}

/// The outcome of applying one Service's rules to one instance.
#[derive(Debug, Default)]
pub struct ApplyReport {
    /// Calls made (0 when the instance already held exactly the desired rules).
    pub changes: usize,
    /// Keys held by rules this cluster does not own.
    pub conflicts: Vec<(RuleKey, String)>,
}

impl Instance {
    pub fn new(client: LoxilbClient) -> Instance {
        Instance {
            client,
            healthy: AtomicBool::new(false),
            holdings: Mutex::new(Holdings::default()),
        }
    }

    pub fn url(&self) -> &str {
        self.client.url()
    }

    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Records a liveness result; returns true on a down -> up transition.
    pub fn set_healthy(&self, up: bool) -> bool {
        let was = self.healthy.swap(up, Ordering::Relaxed);
        up && !was
    }

    /// Number of rules the instance is known to hold.
    pub async fn rule_count(&self) -> usize {
        self.holdings.lock().await.rules.len()
    }

    async fn refresh(&self, h: &mut Holdings) -> Result<(), ClientError> {
        let entries = self.client.list_rules().await?;
        h.rules = entries
            .iter()
            .filter_map(from_entry)
            .map(|r| (r.key, r))
            .collect();
        h.known = true;
        Ok(())
    }

    /// Makes the instance hold exactly `desired` for the Service `namespace/name`: rules of
    /// that Service not in `desired` are deleted, others are never touched.
    pub async fn apply_service(
        &self,
        cluster: &ClusterId,
        namespace: &str,
        name: &str,
        desired: &[Rule],
        metrics: &Metrics,
    ) -> Result<ApplyReport, ClientError> {
        let mut h = self.holdings.lock().await;
        let result = self
            .apply_locked(&mut h, cluster, desired, metrics, |rule| {
                RuleName::parse(&rule.name).is_some_and(|n| {
                    n.cluster == cluster.as_str() && n.namespace == namespace && n.service == name
                })
            })
            .await;
        self.note_failure(&mut h, &result);
        result
    }

    /// Drift check: lists what the instance holds and converges it to `desired` (all
    /// Services). Owned rules of Services in `keep` are left alone even when not desired
    /// (their Service has an error and keeps its existing rules until fixed).
    pub async fn converge_all(
        &self,
        cluster: &ClusterId,
        desired: &[Rule],
        keep: &HashSet<(String, String)>,
        metrics: &Metrics,
    ) -> Result<ApplyReport, ClientError> {
        let mut h = self.holdings.lock().await;
        let refreshed = self.refresh(&mut h).await;
        let result = match refreshed {
            Ok(()) => {
                self.apply_locked(&mut h, cluster, desired, metrics, |rule| {
                    RuleName::parse(&rule.name).is_some_and(|n| {
                        n.cluster == cluster.as_str()
                            && !keep.contains(&(n.namespace.clone(), n.service.clone()))
                    })
                })
                .await
            }
            Err(e) => Err(e),
        };
        self.note_failure(&mut h, &result);
        result
    }

    /// Deletes every rule this cluster owns for `namespace/name`.
    pub async fn remove_service(
        &self,
        cluster: &ClusterId,
        namespace: &str,
        name: &str,
        metrics: &Metrics,
    ) -> Result<ApplyReport, ClientError> {
        self.apply_service(cluster, namespace, name, &[], metrics)
            .await
    }

    fn note_failure<T>(&self, h: &mut Holdings, result: &Result<T, ClientError>) {
        if let Err(e) = result
            && matches!(
                e,
                ClientError::Unreachable { .. } | ClientError::Timeout { .. }
            )
        {
            // We no longer know what it holds (it may come back empty): list before next use.
            h.known = false;
            self.healthy.store(false, Ordering::Relaxed);
        }
    }

    async fn apply_locked(
        &self,
        h: &mut Holdings,
        cluster: &ClusterId,
        desired: &[Rule],
        metrics: &Metrics,
        in_scope: impl Fn(&Rule) -> bool,
    ) -> Result<ApplyReport, ClientError> {
        if !h.known {
            self.refresh(h).await?;
        }
        let wanted: HashSet<RuleKey> = desired.iter().map(|r| r.key).collect();
        // The diff sees this scope's rules plus whatever sits on the keys we want.
        let observed: Vec<Rule> = h
            .rules
            .values()
            .filter(|r| in_scope(r) || wanted.contains(&r.key))
            .cloned()
            .collect();
        let owned = |r: &Rule| RuleName::is_owned_by(&r.name, cluster);
        let actions = diff_rules(desired, &observed, |r| {
            owned(r) && (in_scope(r) || wanted.contains(&r.key))
        });
        let mut report = ApplyReport::default();
        for action in actions {
            match action {
                Action::Create(rule) | Action::Update(rule) => {
                    self.post(&rule, metrics).await?;
                    h.rules.insert(rule.key, rule);
                    report.changes += 1;
                }
                Action::Recreate(rule) => {
                    self.delete(&rule.key, metrics).await?;
                    h.rules.remove(&rule.key);
                    self.post(&rule, metrics).await?;
                    h.rules.insert(rule.key, rule);
                    report.changes += 1;
                }
                Action::Delete(rule) => {
                    self.delete(&rule.key, metrics).await?;
                    h.rules.remove(&rule.key);
                    report.changes += 1;
                }
                Action::Conflict {
                    wanted,
                    foreign_name,
                } => report.conflicts.push((wanted.key, foreign_name)),
            }
        }
        metrics.set_rules(self.url(), h.rules.len());
        Ok(report)
    }

    async fn post(&self, rule: &Rule, metrics: &Metrics) -> Result<(), ClientError> {
        let started = std::time::Instant::now();
        let result = self.client.apply_rule(&to_entry(rule)).await;
        metrics.loxilb_call(
            self.url(),
            "apply",
            started.elapsed(),
            result.as_ref().err(),
        );
        result.map(|_| ())
    }

    async fn delete(&self, key: &RuleKey, metrics: &Metrics) -> Result<(), ClientError> {
        let started = std::time::Instant::now();
        let result = self
            .client
            .delete_rule(
                &key.ip.to_string(),
                key.port,
                key.protocol.as_loxilb(),
                false,
            )
            .await;
        metrics.loxilb_call(
            self.url(),
            "delete",
            started.elapsed(),
            result.as_ref().err(),
        );
        result.map(|_| ())
    }
}

/// All configured instances.
#[derive(Clone)]
pub struct Fleet {
    pub instances: Arc<Vec<Instance>>,
}

impl Fleet {
    pub fn new(clients: Vec<LoxilbClient>) -> Fleet {
        Fleet {
            instances: Arc::new(clients.into_iter().map(Instance::new).collect()),
        }
    }
}
