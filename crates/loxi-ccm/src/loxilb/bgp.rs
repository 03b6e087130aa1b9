//! BGP on each loxilb: brings its goBGP to a [`BgpConfig`] (decided by `crate::bgp` from the
//! flags and kube-loxilb's BGP resources) in loxilb's order (docs/bgp.md).
//!
//! loxilb keeps no BGP state across a restart (its goBGP is respawned empty) and answers a
//! second global POST with an error, so the global settings are sent once per loxilb start
//! (again after a restart or a come-back). A pass runs in loxilb's dependency order:
//!
//! 1. the global settings (peers need them);
//! 2. removals, dependents first: policy applications, policies, defined sets, neighbours
//!    (a policy in use cannot be deleted, nor a set a policy uses);
//! 3. additions, dependencies first: neighbours, defined sets, policies, applications.
//!
//! So after a restart (nothing held) the replay goes global → neighbours → sets →
//! definitions → applications, and the caller replays the rules after it.
//!
//! Neighbours are compared with what loxilb lists (this controller owns loxilb's neighbour
//! list: unknown ones are removed). Sets, policies and applications are compared with what
//! this process sent since loxilb started: loxilb's listings normalise what they show
//! (prefixes in network form, empty objects, its own policies), so they cannot be compared
//! field by field. The first pass after this process started, or after the loxilb came back,
//! reads the names loxilb holds, so that existing ones are not sent again (a policy POSTed
//! twice appends its statements, which loxilb refuses); after a restart it holds none. A
//! changed item is removed and added again.
//!
//! An item loxilb refuses (kube-loxilb's own example applies a policy to a peer address,
//! which loxilb never takes) is not sent again at every pass: each refusal is retried after a
//! delay that doubles, 0.5 s to 5 minutes ([`Refusals`]), and reported with its last error
//! meanwhile (the resource's `Programmed` condition keeps it). Any change of the
//! configuration (a resource edited, added or deleted, a loxilb joining the mesh) and a
//! loxilb that restarts or comes back retry every refused item at once.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use backon::BackoffBuilder;
use loxilb_client::bgp::{BgpGlobal, BgpNeighborStatus};
use loxilb_client::{ClientError, GobgpAnswer};
use tracing::info;

pub use super::bgp_plan::{BgpConfig, GlobalSettings, ItemId};
use super::bgp_plan::{Held, Step, steps};
use super::{Instance, is_transport};

/// The policy loxilb creates with the global configuration.
const LOXILB_OWN_POLICY: &str = "set-llb-export-gpolicy";

/// The outcome of one pass on one loxilb.
#[derive(Debug, Clone, Default)]
pub struct BgpReport {
    /// Items loxilb refused to add or to remove, with its error.
    pub refused: BTreeMap<ItemId, String>,
    /// The neighbours with their session state, as listed after the pass.
    pub sessions: Vec<BgpNeighborStatus>,
}

/// The items one loxilb refused, each with its error and when to try again.
#[derive(Debug, Default)]
pub(super) struct Refusals {
    /// The configuration the refusals were met under: another one retries them all at once.
    under: Option<BgpConfig>,
    items: BTreeMap<ItemId, Refusal>,
}

#[derive(Debug)]
struct Refusal {
    error: String,
    /// Refusals in a row.
    failures: u32,
    /// Not sent again before this.
    retry_at: tokio::time::Instant,
}

/// What one pass met: the report, and the refusals it keeps.
struct Outcomes<'a> {
    report: BgpReport,
    refusals: &'a mut Refusals,
}

impl Outcomes<'_> {
    /// `id` was refused and its back-off has not ended: it is reported with its last
    /// error and not sent.
    fn held_back(&mut self, id: &ItemId) -> bool {
        match self.refusals.waiting(id) {
            Some(error) => {
                self.report.refused.insert(id.clone(), error.to_string());
                true
            }
            None => false,
        }
    }

    /// loxilb took `id`.
    fn taken(&mut self, id: &ItemId) {
        self.refusals.taken(id);
    }

    /// loxilb answered `e` for `id`. A transport failure ends the pass, and so does a goBGP
    /// without its global configuration (`ensure_bgp` starts over); anything else is that
    /// item's refusal, not sent again before its back-off ends.
    fn refused(&mut self, id: &ItemId, e: ClientError) -> Result<(), ClientError> {
        if is_transport(&e) || e.gobgp() == Some(GobgpAnswer::Unconfigured) {
            return Err(e);
        }
        self.report.refused.insert(id.clone(), e.to_string());
        self.refusals.refused(id, e.to_string());
        Ok(())
    }
}

impl Refusals {
    /// A pass under `config`: refusals met under another configuration are tried again.
    fn under(&mut self, config: &BgpConfig) {
        if self.under.as_ref() != Some(config) {
            self.items.clear();
            self.under = Some(config.clone());
        }
    }

    /// The last refusal of `id` while its retry time has not come: it is not sent again.
    fn waiting(&self, id: &ItemId) -> Option<&str> {
        self.items
            .get(id)
            .filter(|r| tokio::time::Instant::now() < r.retry_at)
            .map(|r| r.error.as_str())
    }

    fn refused(&mut self, id: &ItemId, error: String) {
        let failures = self
            .items
            .get(id)
            .map_or(1, |r| r.failures.saturating_add(1));
        let retry_at = tokio::time::Instant::now() + loxi_domain::duration::retry_delay(failures);
        self.items.insert(
            id.clone(),
            Refusal {
                error,
                failures,
                retry_at,
            },
        );
    }

    fn taken(&mut self, id: &ItemId) {
        self.items.remove(id);
    }
}

/// What this controller knows of one loxilb's BGP.
#[derive(Debug, Default)]
pub(super) struct BgpState {
    /// The global settings sent since loxilb last (re)started.
    global: Option<BgpGlobal>,
    /// What is held is known: false until the first pass after this process started or the
    /// loxilb came back (it may hold sets and policies sent before).
    known: bool,
    /// The sets, policies and applications sent since loxilb last (re)started.
    held: Held,
    /// What loxilb refused, retried with back-off (module docs).
    refusals: Refusals,
}

/// The waits between the passes that follow a goBGP found without its configuration: right
/// after a restart goBGP answers errors for a moment (100 ms, doubling, 4 more passes).
fn after_restart() -> impl Iterator<Item = std::time::Duration> {
    backon::ExponentialBuilder::default()
        .with_min_delay(std::time::Duration::from_millis(100))
        .with_factor(2.0)
        .with_max_times(4)
        .build()
}

impl Instance {
    /// loxilb restarted or came back (also at this process's start): what it holds is read
    /// again at the next pass.
    pub async fn forget_bgp(&self) {
        *self.bgp.lock().await = BgpState::default();
    }

    /// Whether goBGP already runs with a global configuration: loxilb's own export policy,
    /// created with it, is listed (docs/loxilb-api.md#the-global-configuration).
    async fn gobgp_configured(&self) -> bool {
        self.client
            .list_bgp_policies()
            .await
            .is_ok_and(|list| list.iter().any(|p| p.name == LOXILB_OWN_POLICY))
    }

    /// The router id for this loxilb: the configured one, else its own IPv4 address.
    fn router_id(&self, configured: Option<Ipv4Addr>) -> Option<Ipv4Addr> {
        configured.or_else(|| {
            let url = url::Url::parse(self.url()).ok()?;
            match url.host()? {
                url::Host::Ipv4(ip) => Some(ip),
                _ => None,
            }
        })
    }

    /// Brings loxilb's BGP to `config` (module docs). `Err`: the global settings were not
    /// taken, or loxilb is unreachable; refusals of single items are in the report.
    pub async fn ensure_bgp(&self, config: &BgpConfig) -> Result<BgpReport, ClientError> {
        let mut state = self.bgp.lock().await;
        match self.pass(&mut state, config).await {
            // goBGP lost its configuration behind this process's back (loxilb restarted
            // between two probes, unnoticed): start over, in loxilb's order.
            Err(e) if e.gobgp() == Some(GobgpAnswer::Unconfigured) && state.global.is_some() => {
                info!(
                    instance = self.url(),
                    "goBGP has no global configuration any more: configuring it again"
                );
                *state = BgpState::default();
                let mut result = self.pass(&mut state, config).await;
                for delay in after_restart() {
                    let transient = match &result {
                        Ok(report) => !report.refused.is_empty(),
                        Err(e) => !is_transport(e),
                    };
                    if !transient {
                        break;
                    }
                    tokio::time::sleep(delay).await;
                    state.refusals = Refusals::default();
                    result = self.pass(&mut state, config).await;
                }
                result
            }
            other => other,
        }
    }

    async fn pass(
        &self,
        state: &mut BgpState,
        config: &BgpConfig,
    ) -> Result<BgpReport, ClientError> {
        let Some(router_id) = self.router_id(config.global.router_id) else {
            return Err(ClientError::Config(format!(
                "no BGP router id for {}: its address is not IPv4; set --bgp-router-id",
                self.url()
            )));
        };
        let global = BgpGlobal {
            router_id,
            local_as: config.global.local_as,
            set_next_hop_self: false,
            listen_port: config.global.listen_port,
        };
        if state.global.as_ref() != Some(&global) {
            match self.client.set_bgp_global(&global).await {
                Ok(()) => {
                    info!(instance = self.url(), %router_id, local_as = global.local_as, "BGP global settings sent");
                }
                // An identical repeat (this process restarted, or an earlier answer was
                // lost): loxilb holds these settings already.
                Err(e) if e.gobgp() == Some(GobgpAnswer::AlreadyConfigured) => {
                    info!(
                        instance = self.url(),
                        "BGP global settings already in place"
                    );
                }
                // loxilb answers an error to a repeat of the global configuration (this
                // process restarted, loxilb did not): harmless when goBGP already runs.
                Err(e) if !is_transport(&e) && !state.known && self.gobgp_configured().await => {
                    info!(instance = self.url(), error = %e, "BGP global settings already in place");
                }
                Err(e) => return Err(e),
            }
            state.global = Some(global);
        }
        if !state.known {
            self.learn_held(state, config).await?;
            state.known = true;
        }
        state.refusals.under(config);
        let listed = self.client.list_bgp_neighbors().await?;
        let mut out = Outcomes {
            report: BgpReport::default(),
            refusals: &mut state.refusals,
        };
        let mut peers_changed = false;
        for step in steps(&state.held, &listed, config) {
            let id = step.item();
            if out.held_back(&id) {
                continue;
            }
            if let Step::DeletePolicy(_, name) = &step
                && state.held.policy_applied(name)
            {
                // Its application's removal was refused or held back in this pass.
                continue;
            }
            peers_changed |= step.changes_peers();
            match self.execute(&step, &mut state.held).await {
                Ok(()) => {
                    info!(instance = self.url(), item = %id, "BGP {}", step.done());
                    out.taken(&id);
                }
                Err(e) => out.refused(&id, e)?,
            }
        }
        let mut report = out.report;
        report.sessions = if peers_changed {
            self.client.list_bgp_neighbors().await?
        } else {
            listed
        };
        Ok(report)
    }

    /// Sends one step of a pass and records in `held` what loxilb then holds.
    async fn execute(&self, step: &Step, held: &mut Held) -> Result<(), ClientError> {
        match step {
            Step::Unapply(id, apply) => {
                self.client.unapply_bgp_policy(apply).await?;
                held.applies.remove(id);
            }
            Step::DeletePolicy(id, name) => {
                self.client.delete_bgp_policy(name).await?;
                held.policies.remove(id);
            }
            Step::DeleteSet(id, kind, name) => {
                self.client.delete_bgp_defined_set(*kind, name).await?;
                held.sets.remove(id);
            }
            Step::DeletePeer(ip, remote_as) => {
                self.client.delete_bgp_neighbor(*ip, *remote_as).await?;
            }
            Step::AddPeer(peer) => {
                self.client.add_bgp_neighbor(peer).await?;
            }
            Step::AddSet(id, kind, set) => {
                self.client.add_bgp_defined_set(*kind, set).await?;
                held.sets.insert(id.clone(), (*kind, set.clone()));
            }
            Step::AddPolicy(id, policy) => {
                self.client.add_bgp_policy(policy).await?;
                held.policies.insert(id.clone(), policy.clone());
            }
            Step::Apply(id, apply) => {
                self.client.apply_bgp_policy(apply).await?;
                held.applies.insert(id.clone(), apply.clone());
            }
        }
        Ok(())
    }

    /// The first pass after this process started: the sets and policies of `config` that
    /// loxilb already holds (by name) are taken as held, so they are not sent again.
    /// Applications are not listed by loxilb; sending one again is harmless (it answers
    /// "duplicated policy", read as already present).
    async fn learn_held(
        &self,
        state: &mut BgpState,
        config: &BgpConfig,
    ) -> Result<(), ClientError> {
        if !config.policies.is_empty() {
            let held: BTreeSet<String> = self
                .client
                .list_bgp_policies()
                .await?
                .into_iter()
                .map(|p| p.name)
                .collect();
            for (id, policy) in &config.policies {
                if held.contains(&policy.name) {
                    state.held.policies.insert(id.clone(), policy.clone());
                }
            }
        }
        let kinds: BTreeSet<&str> = config
            .sets
            .iter()
            .map(|(_, k, _)| k.as_path_segment())
            .collect();
        for kind in kinds {
            let Some((_, k, _)) = config
                .sets
                .iter()
                .find(|(_, k, _)| k.as_path_segment() == kind)
            else {
                continue;
            };
            let held: BTreeSet<String> = self
                .client
                .list_bgp_defined_sets(*k)
                .await?
                .into_iter()
                .map(|s| s.name)
                .collect();
            for (id, k2, set) in &config.sets {
                if k2 == k && held.contains(&set.name) {
                    state.held.sets.insert(id.clone(), (*k2, set.clone()));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn config(local_as: u32) -> BgpConfig {
        BgpConfig {
            global: GlobalSettings {
                router_id: None,
                local_as,
                listen_port: 0,
            },
            peers: Vec::new(),
            sets: Vec::new(),
            policies: Vec::new(),
            applies: Vec::new(),
        }
    }

    /// A refused item waits 0.5 s, then twice as long after each new refusal; another
    /// configuration retries it at once; being taken forgets it.
    #[tokio::test(start_paused = true)]
    async fn a_refusal_waits_longer_each_time_until_the_configuration_changes() {
        let mut r = Refusals::default();
        let a = ItemId::Apply("a".into());
        r.under(&config(65000));
        assert_eq!(r.waiting(&a), None);
        let mut waited = Vec::new();
        for _ in 0..4 {
            r.refused(&a, "not found peer".into());
            let mut ms = 0;
            while r.waiting(&a) == Some("not found peer") {
                tokio::time::advance(Duration::from_millis(100)).await;
                ms += 100;
            }
            waited.push(ms);
        }
        assert_eq!(waited, [500, 1000, 2000, 4000]);
        r.refused(&a, "not found peer".into());
        r.under(&config(65000));
        assert!(r.waiting(&a).is_some(), "the same configuration");
        r.under(&config(65001));
        assert_eq!(r.waiting(&a), None, "another configuration");
        r.refused(&a, "refused".into());
        r.taken(&a);
        assert_eq!(r.waiting(&a), None);
    }
}
