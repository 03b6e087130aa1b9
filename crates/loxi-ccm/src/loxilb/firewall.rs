//! Source ranges in loxilb's firewall (`--source-ranges=firewall`,
//! docs/configuration.md#source-ranges): the firewall rules this controller owns on one
//! instance (`FwBook`), a Service's pass that programs them around its LB rules
//! ([`Instance::program_service`], [`Instance::remove_service_and_firewall`]), and the
//! whole-instance convergence a drift check and a replay run
//! ([`Instance::converge_firewall`]). What the rules are, and which are ours, is decided in
//! `loxi_domain::firewall`.
//!
//! Order, so that no allowed client is ever dropped and a restricted port is open to all
//! only as long as it must: a Service's new allow rules, then its new drop rules, go in
//! *before* its LB rules change; the rules it no longer wants (drop rules first) go
//! *after*. A new Service's address is therefore closed to other sources from its first
//! packet on.
//!
//! Firewall writes are few (a Service's ranges change rarely) and go straight to loxilb,
//! not through the rule-write window; the client's write gate (the leader's Lease) still
//! guards each of them.

use std::collections::{BTreeSet, HashSet};
use std::net::IpAddr;
use std::time::Instant;

use loxi_domain::firewall::{FwCall, FwChanges, FwRule, Preferences, diff, split};
use loxi_domain::{ClusterId, Protocol, Rule, RuleKey, RuleName};
use loxilb_client::ClientError;
use loxilb_client::firewall::{owned_firewall_rule, to_firewall_entry};
use tracing::{debug, warn};

use super::{ApplyReport, Instance, Requeue};
use crate::metrics::Metrics;

/// The firewall rules of ours an instance holds, as far as this process knows.
#[derive(Debug, Default)]
pub(super) struct FwBook {
    /// Listed since the last time we lost track (start, a failed call, a replay).
    known: bool,
    held: BTreeSet<FwRule>,
}

/// What an LB rule key a firewall rule protects.
type Dest = (IpAddr, u16, Protocol);

fn dest_of(rule: &FwRule) -> Dest {
    (rule.destination, rule.port, rule.protocol)
}

fn dest_of_key(key: &RuleKey) -> Dest {
    (key.ip, key.port, key.protocol)
}

impl Instance {
    /// A Service's pass with its source ranges in the firewall: `desired` as planned (rules
    /// with `allowed_sources`), its LB rules sent without them ([`Instance::apply_service`]),
    /// its firewall rules made to match around them (module docs). A firewall call that
    /// fails is reported as a failure of the rule it protects.
    pub async fn program_service(
        &self,
        cluster: &ClusterId,
        namespace: &str,
        name: &str,
        desired: &[Rule],
        metrics: &Metrics,
        requeue: Option<&Requeue>,
    ) -> Result<ApplyReport, ClientError> {
        let prefs = Preferences::of(cluster);
        let (lb, fw) = split(desired, prefs);
        let held_before: HashSet<Dest> = self.service_dests(cluster, namespace, name).await;
        let mut scope = held_before.clone();
        scope.extend(desired.iter().map(|r| dest_of_key(&r.key)));
        // A firewall that cannot be read or written: the Service's new rules with source
        // ranges are held back (never open to all), its other rules go on.
        let (changes, mut failed) = match self.firewall_changes(prefs, &scope, &fw, metrics).await {
            Ok(changes) => (changes, Vec::new()),
            Err(e) if e.is_transport() => return Err(e),
            Err(_) if fw.is_empty() => (FwChanges::default(), Vec::new()),
            Err(e) => {
                let keys: BTreeSet<RuleKey> = desired
                    .iter()
                    .filter(|r| !r.allowed_sources.is_empty())
                    .map(|r| r.key)
                    .collect();
                (
                    FwChanges::default(),
                    keys.into_iter().map(|k| (k, e.clone())).collect(),
                )
            }
        };
        let (before, after) = halves(&changes);
        failed.extend(self.firewall_calls(&before, metrics).await?);
        let unprotected: HashSet<Dest> = failed.iter().map(|(k, _)| dest_of_key(k)).collect();
        let lb: Vec<Rule> = lb
            .into_iter()
            .filter(|r| {
                let d = dest_of_key(&r.key);
                !unprotected.contains(&d) || held_before.contains(&d)
            })
            .collect();
        let mut report = self
            .apply_service(cluster, namespace, name, &lb, metrics, requeue)
            .await?;
        let failed_after = self.firewall_calls(&after, metrics).await?;
        let calls = changes.create.len() + changes.delete.len();
        report.changes += calls.saturating_sub(failed.len() + failed_after.len());
        report.failed.extend(failed);
        report.failed.extend(failed_after);
        Ok(report)
    }

    /// [`Instance::remove_service`] and the Service's firewall rules after its LB rules.
    pub async fn remove_service_and_firewall(
        &self,
        cluster: &ClusterId,
        namespace: &str,
        name: &str,
        metrics: &Metrics,
    ) -> Result<ApplyReport, ClientError> {
        let scope = self.service_dests(cluster, namespace, name).await;
        let mut report = self
            .remove_service(cluster, namespace, name, metrics)
            .await?;
        let holds_any = {
            let book = self.firewall.lock().await;
            !book.known || book.held.iter().any(|r| scope.contains(&dest_of(r)))
        };
        if scope.is_empty() || !holds_any {
            return Ok(report);
        }
        let prefs = Preferences::of(cluster);
        let changes = match self.firewall_changes(prefs, &scope, &[], metrics).await {
            Ok(changes) => changes,
            Err(e) if e.is_transport() => return Err(e),
            Err(e) => {
                // Its LB rules are gone, so nothing is open: what is left of its firewall is
                // removed by the drift check, and the Service's deletion is not held up.
                warn!(instance = self.url(), error = %e, "firewall not readable at cleanup");
                return Ok(report);
            }
        };
        let failed = self.firewall_calls(&changes.ordered(), metrics).await?;
        report.changes += changes.delete.len().saturating_sub(failed.len());
        match failed.into_iter().next() {
            Some((_, e)) => Err(e),
            None => Ok(report),
        }
    }

    /// Whole-instance convergence (drift check, replay): lists the firewall and makes our
    /// rules exactly `desired`, except those protecting the LB rules of the Services in
    /// `keep` (they keep what they have). With `namespace` (`--namespace`), only rules
    /// protecting an address of that namespace's Services are looked at. Returns the
    /// number of calls made and whether all succeeded.
    pub async fn converge_firewall(
        &self,
        cluster: &ClusterId,
        namespace: Option<&str>,
        desired: &[FwRule],
        keep: &[(String, String)],
        metrics: &Metrics,
    ) -> Result<usize, ClientError> {
        let prefs = Preferences::of(cluster);
        let (kept, in_namespace) = {
            let h = self.holdings.lock().await;
            let owned = |r: &&Rule| RuleName::is_owned_by(&r.name, cluster);
            let kept: HashSet<Dest> = keep
                .iter()
                .flat_map(|(ns, svc)| h.rules.of_service(ns, svc).filter(owned))
                .map(|r| dest_of_key(&r.key))
                .collect();
            let in_namespace: Option<HashSet<Dest>> = namespace.map(|ns| {
                h.rules
                    .rules
                    .values()
                    .filter(owned)
                    .filter(|r| RuleName::parse(&r.name).is_some_and(|n| n.namespace == ns))
                    .map(|r| dest_of_key(&r.key))
                    .collect()
            });
            (kept, in_namespace)
        };
        let mut book = self.firewall.lock().await;
        self.list_firewall(&mut book, prefs, metrics).await?;
        let held: Vec<FwRule> = book
            .held
            .iter()
            .filter(|r| !kept.contains(&dest_of(r)))
            .filter(|r| {
                in_namespace
                    .as_ref()
                    .is_none_or(|d| d.contains(&dest_of(r)))
                    || desired.contains(r)
            })
            .copied()
            .collect();
        let want: Vec<FwRule> = desired
            .iter()
            .filter(|r| !kept.contains(&dest_of(r)))
            .copied()
            .collect();
        let changes = diff(&want, &held);
        if changes.is_empty() {
            return Ok(0);
        }
        debug!(instance = self.url(), ?changes, "firewall repair");
        let calls = changes.ordered();
        let failed = self.send_firewall(&mut book, &calls, metrics).await?;
        for (key, e) in &failed {
            warn!(instance = self.url(), %key, error = %e, "firewall repair refused");
        }
        match failed.into_iter().next() {
            Some((_, e)) => Err(e),
            None => Ok(calls.len()),
        }
    }

    /// The creates of a whole-instance pass, sent before its LB rules (a replay): lists the
    /// firewall and adds the rules of `desired` it lacks; nothing is deleted here
    /// ([`Instance::converge_firewall`] does, after the LB rules).
    pub async fn add_firewall_rules(
        &self,
        cluster: &ClusterId,
        desired: &[FwRule],
        metrics: &Metrics,
    ) -> Result<usize, ClientError> {
        let prefs = Preferences::of(cluster);
        let mut book = self.firewall.lock().await;
        self.list_firewall(&mut book, prefs, metrics).await?;
        let missing: Vec<FwCall> = diff(desired, &book.held)
            .ordered()
            .into_iter()
            .filter(|c| matches!(c, FwCall::Create(_)))
            .collect();
        let failed = self.send_firewall(&mut book, &missing, metrics).await?;
        match failed.into_iter().next() {
            Some((_, e)) => Err(e),
            None => Ok(missing.len()),
        }
    }

    /// Our firewall rules on this instance as last listed or written (`None`: not known, its
    /// firewall could not be listed): a whole-instance pass creates no LB rule whose
    /// firewall rules are not there (`crate::service::drift`).
    pub async fn firewall_held(&self) -> Option<BTreeSet<FwRule>> {
        let book = self.firewall.lock().await;
        book.known.then(|| book.held.clone())
    }

    /// The addresses, ports and protocols of the LB rules this cluster holds here for the
    /// Service.
    async fn service_dests(
        &self,
        cluster: &ClusterId,
        namespace: &str,
        name: &str,
    ) -> HashSet<Dest> {
        let h = self.holdings.lock().await;
        h.rules
            .of_service(namespace, name)
            .filter(|r| RuleName::is_owned_by(&r.name, cluster))
            .map(|r| dest_of_key(&r.key))
            .collect()
    }

    /// What to change so that our rules protecting `scope` are exactly `desired`, from the
    /// book (listed first when not known).
    async fn firewall_changes(
        &self,
        prefs: Preferences,
        scope: &HashSet<Dest>,
        desired: &[FwRule],
        metrics: &Metrics,
    ) -> Result<FwChanges, ClientError> {
        let mut book = self.firewall.lock().await;
        if !book.known && (!desired.is_empty() || !scope.is_empty()) {
            self.list_firewall(&mut book, prefs, metrics).await?;
        }
        let held: Vec<&FwRule> = book
            .held
            .iter()
            .filter(|r| scope.contains(&dest_of(r)))
            .collect();
        Ok(diff(desired, held))
    }

    /// Sends `calls` in order under the book's lock; the failures by the rule they protect.
    async fn firewall_calls(
        &self,
        calls: &[FwCall],
        metrics: &Metrics,
    ) -> Result<Vec<(RuleKey, ClientError)>, ClientError> {
        if calls.is_empty() {
            return Ok(Vec::new());
        }
        let mut book = self.firewall.lock().await;
        self.send_firewall(&mut book, calls, metrics).await
    }

    async fn send_firewall(
        &self,
        book: &mut FwBook,
        calls: &[FwCall],
        metrics: &Metrics,
    ) -> Result<Vec<(RuleKey, ClientError)>, ClientError> {
        let mut failed = Vec::new();
        for call in calls {
            let started = Instant::now();
            let (rule, result, op) = match call {
                FwCall::Create(r) => {
                    let result = self.client.add_firewall_rule(&to_firewall_entry(r)).await;
                    (r, result.map(|_| ()), "firewall_add")
                }
                FwCall::Delete(r) => {
                    let entry = to_firewall_entry(r);
                    let result = self
                        .client
                        .delete_firewall_rule(&entry.rule_arguments)
                        .await;
                    (r, result.map(|_| ()), "firewall_delete")
                }
            };
            metrics.loxilb_call(self.url(), op, started.elapsed(), result.as_ref().err());
            match result {
                Ok(()) => {
                    match call {
                        FwCall::Create(r) => book.held.insert(*r),
                        FwCall::Delete(r) => book.held.remove(r),
                    };
                }
                Err(e) if e.is_transport() => {
                    book.known = false;
                    return Err(e);
                }
                Err(e) => {
                    let key = RuleKey {
                        ip: rule.destination,
                        port: rule.port,
                        protocol: rule.protocol,
                    };
                    failed.push((key, e));
                }
            }
        }
        Ok(failed)
    }

    async fn list_firewall(
        &self,
        book: &mut FwBook,
        prefs: Preferences,
        metrics: &Metrics,
    ) -> Result<(), ClientError> {
        let started = Instant::now();
        let result = self.client.list_firewall().await;
        metrics.loxilb_call(
            self.url(),
            "firewall_list",
            started.elapsed(),
            result.as_ref().err(),
        );
        let listed = result.inspect_err(|_| book.known = false)?;
        book.held = listed
            .iter()
            .filter_map(|e| owned_firewall_rule(e, prefs))
            .collect();
        book.known = true;
        Ok(())
    }
}

/// The calls before a Service's LB rules change (new rules) and after (rules it no longer
/// wants), each in the safe order of `FwChanges::ordered`.
fn halves(changes: &FwChanges) -> (Vec<FwCall>, Vec<FwCall>) {
    changes
        .ordered()
        .into_iter()
        .partition(|c| matches!(c, FwCall::Create(_)))
}
