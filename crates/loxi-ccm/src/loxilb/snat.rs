//! Egress source NAT in loxilb's firewall (kube-loxilb's `Egress` resource,
//! `crate::egress`): makes the SNAT rules of ours an instance holds exactly the desired ones.
//! Which rules are ours (one preference per controller, the SNAT shape) and what they are is
//! decided in `loxi_domain::egress`; the wire form is `loxilb_client::firewall`.
//!
//! Every pass lists the firewall first: SNAT rules are few and change only with Egresses and
//! their pods, so the listing costs little, and a pass after a loxilb restart (which wipes
//! the firewall) finds what is missing by itself. loxilb keys a firewall rule by what it
//! matches, not by its action: a source whose vip changed is deleted before it is created
//! again, so deletions go first.

use std::time::Instant;

use loxi_domain::egress::{SnatRule, diff};
use loxilb_client::ClientError;
use loxilb_client::firewall::{owned_snat_rule, to_snat_entry};
use tracing::debug;

use super::Instance;
use crate::metrics::Metrics;

/// What one pass on one instance did.
#[derive(Debug, Default)]
pub struct SnatReport {
    /// Rules created and deleted.
    pub changes: usize,
    /// Calls loxilb refused (the rule's source, the error).
    pub refused: Vec<(String, ClientError)>,
}

impl Instance {
    /// Our SNAT rules (at `preference`) on this instance as listed now.
    pub async fn snat_rules(
        &self,
        preference: u16,
        metrics: &Metrics,
    ) -> Result<Vec<SnatRule>, ClientError> {
        let started = Instant::now();
        let listed = self.client.list_firewall().await;
        metrics.loxilb_call(
            self.url(),
            "firewall_list",
            started.elapsed(),
            listed.as_ref().err(),
        );
        Ok(listed?
            .iter()
            .filter_map(|e| owned_snat_rule(e, preference))
            .collect())
    }

    /// Makes our SNAT rules at `preference` exactly `desired`: lists, deletes what is not
    /// wanted, creates what is missing. A transport error stops the pass (the instance is
    /// down); a refusal is reported and the pass goes on.
    pub async fn converge_snat(
        &self,
        preference: u16,
        desired: &[SnatRule],
        metrics: &Metrics,
    ) -> Result<SnatReport, ClientError> {
        let held = self.snat_rules(preference, metrics).await?;
        // Before the writes: a restart while they go is noticed by the probe.
        self.holds_snat
            .store(!desired.is_empty(), std::sync::atomic::Ordering::Relaxed);
        let (create, delete) = diff(desired, &held);
        let mut report = SnatReport::default();
        if !create.is_empty() || !delete.is_empty() {
            debug!(instance = self.url(), ?create, ?delete, "egress SNAT rules");
        }
        for rule in &delete {
            let entry = to_snat_entry(rule);
            let started = Instant::now();
            let result = self
                .client
                .delete_firewall_rule(&entry.rule_arguments)
                .await;
            self.tally(
                &mut report,
                rule,
                "firewall_delete",
                started,
                result,
                metrics,
            )?;
        }
        for rule in &create {
            let started = Instant::now();
            let result = self.client.add_firewall_rule(&to_snat_entry(rule)).await;
            self.tally(&mut report, rule, "firewall_add", started, result, metrics)?;
        }
        Ok(report)
    }

    /// Counts one SNAT call in the metrics and the report: a transport error is returned
    /// (it stops the pass), a refusal is noted for `rule` and the pass goes on.
    fn tally<T>(
        &self,
        report: &mut SnatReport,
        rule: &SnatRule,
        call: &'static str,
        started: Instant,
        result: Result<T, ClientError>,
        metrics: &Metrics,
    ) -> Result<(), ClientError> {
        metrics.loxilb_call(self.url(), call, started.elapsed(), result.as_ref().err());
        match result {
            Ok(_) => report.changes += 1,
            Err(e) if e.is_transport() => return Err(e),
            Err(e) => report.refused.push((rule.source.to_string(), e)),
        }
        Ok(())
    }
}
