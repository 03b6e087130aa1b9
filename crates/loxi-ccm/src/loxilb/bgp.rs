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
use std::net::{IpAddr, Ipv4Addr};

use loxilb_client::ClientError;
use loxilb_client::bgp::{
    BgpDefinedSet, BgpGlobal, BgpNeighbor, BgpNeighborStatus, BgpPolicy, BgpPolicyApply,
    DefinedSetKind,
};
use tracing::info;

use super::{Instance, is_transport};

/// The policy loxilb creates with the global configuration.
const LOXILB_OWN_POLICY: &str = "set-llb-export-gpolicy";

/// Names an item of the configuration in reports: `peer 192.0.2.1`, `set prefix/ps1`,
/// `policy p1`, `apply <resource name>`.
pub type ItemId = String;

/// The id of the neighbour at `ip`.
pub fn peer_item(ip: IpAddr) -> ItemId {
    format!("peer {ip}")
}

/// goBGP's global settings; the router id per loxilb.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobalSettings {
    /// `None`: each loxilb's own IPv4 address from its URL.
    pub router_id: Option<Ipv4Addr>,
    pub local_as: u32,
    /// 0: 179.
    pub listen_port: u16,
}

/// Everything this controller wants on every loxilb's goBGP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BgpConfig {
    pub global: GlobalSettings,
    pub peers: Vec<BgpNeighbor>,
    pub sets: Vec<(ItemId, DefinedSetKind, BgpDefinedSet)>,
    pub policies: Vec<(ItemId, BgpPolicy)>,
    pub applies: Vec<(ItemId, BgpPolicyApply)>,
}

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
    fn held_back(&mut self, id: &str) -> bool {
        match self.refusals.waiting(id) {
            Some(error) => {
                self.report
                    .refused
                    .insert(id.to_string(), error.to_string());
                true
            }
            None => false,
        }
    }

    /// loxilb took `id`.
    fn taken(&mut self, id: &str) {
        self.refusals.taken(id);
    }

    /// loxilb answered `e` for `id`. A transport failure ends the pass, and so does a goBGP
    /// without its global configuration (`ensure_bgp` starts over); anything else is that
    /// item's refusal, not sent again before its back-off ends.
    fn refused(&mut self, id: &str, e: ClientError) -> Result<(), ClientError> {
        if is_transport(&e) || gobgp_not_started(&e) {
            return Err(e);
        }
        self.report.refused.insert(id.to_string(), e.to_string());
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
    fn waiting(&self, id: &str) -> Option<&str> {
        self.items
            .get(id)
            .filter(|r| tokio::time::Instant::now() < r.retry_at)
            .map(|r| r.error.as_str())
    }

    fn refused(&mut self, id: &str, error: String) {
        let failures = self
            .items
            .get(id)
            .map_or(1, |r| r.failures.saturating_add(1));
        let retry_at = tokio::time::Instant::now() + loxi_domain::duration::retry_delay(failures);
        self.items.insert(
            id.to_string(),
            Refusal {
                error,
                failures,
                retry_at,
            },
        );
    }

    fn taken(&mut self, id: &str) {
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
    sets: BTreeMap<ItemId, (DefinedSetKind, BgpDefinedSet)>,
    policies: BTreeMap<ItemId, BgpPolicy>,
    applies: BTreeMap<ItemId, BgpPolicyApply>,
    /// What loxilb refused, retried with back-off (module docs).
    refusals: Refusals,
}

/// goBGP's answer to calls before its global configuration (docs/loxilb-api.md#bgp).
fn gobgp_not_started(e: &ClientError) -> bool {
    e.to_string().contains("hasn't started yet")
}

/// loxilb's answer (500 `action 3 is already set`) to a global configuration identical to
/// the one it holds (docs/loxilb-api.md#the-global-configuration).
fn global_already_set(e: &ClientError) -> bool {
    e.to_string().contains("is already set")
}

/// loxilb's answer (500 `... connect: connection refused`) while its goBGP does not listen
/// yet, for some seconds after loxilb starts (docs/loxilb-api.md#bgp): try again later.
pub fn gobgp_starting(e: &ClientError) -> bool {
    matches!(e, ClientError::Server { .. }) && e.to_string().contains("connection refused")
}

fn listed_ip(n: &BgpNeighborStatus) -> Option<IpAddr> {
    n.ip_address.parse::<IpAddr>().ok()
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
            Err(e) if gobgp_not_started(&e) && state.global.is_some() => {
                info!(
                    instance = self.url(),
                    "goBGP has no global configuration any more: configuring it again"
                );
                *state = BgpState::default();
                // Right after a restart goBGP answers errors for a moment: back-off.
                let mut delay = std::time::Duration::from_millis(100);
                let mut result = self.pass(&mut state, config).await;
                for _ in 1..5 {
                    let transient = match &result {
                        Ok(report) => !report.refused.is_empty(),
                        Err(e) => !is_transport(e),
                    };
                    if !transient {
                        break;
                    }
                    tokio::time::sleep(delay).await;
                    delay *= 2;
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
                Err(e) if global_already_set(&e) => {
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
        let mut out = Outcomes {
            report: BgpReport::default(),
            refusals: &mut state.refusals,
        };

        // Removals, dependents first.
        let gone: Vec<ItemId> = state
            .applies
            .iter()
            .filter(|(id, held)| !config.applies.iter().any(|(i, a)| i == *id && a == *held))
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            let Some(held) = state.applies.get(&id).cloned() else {
                continue;
            };
            if out.held_back(&id) {
                continue;
            }
            match self.client.unapply_bgp_policy(&held).await {
                Ok(()) => {
                    info!(instance = self.url(), item = %id, "BGP policy application removed");
                    state.applies.remove(&id);
                    out.taken(&id);
                }
                Err(e) => out.refused(&id, e)?,
            }
        }
        // A policy still applied stays until its application is gone (its resource may be
        // deleted a moment after the policy's): goBGP lets an import policy go while applied,
        // and the application could then never be removed.
        let gone: Vec<ItemId> = state
            .policies
            .iter()
            .filter(|(id, held)| !config.policies.iter().any(|(i, p)| i == *id && p == *held))
            .filter(|(_, held)| {
                !state
                    .applies
                    .values()
                    .any(|a| a.policies.contains(&held.name))
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            let Some(held) = state.policies.get(&id).cloned() else {
                continue;
            };
            if out.held_back(&id) {
                continue;
            }
            match self.client.delete_bgp_policy(&held.name).await {
                Ok(_) => {
                    info!(instance = self.url(), item = %id, "BGP policy removed");
                    state.policies.remove(&id);
                    out.taken(&id);
                }
                Err(e) => out.refused(&id, e)?,
            }
        }
        let gone: Vec<ItemId> = state
            .sets
            .iter()
            .filter(|(id, held)| {
                !config
                    .sets
                    .iter()
                    .any(|(i, k, s)| i == *id && (*k, s) == (held.0, &held.1))
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            let Some((kind, held)) = state.sets.get(&id).cloned() else {
                continue;
            };
            if out.held_back(&id) {
                continue;
            }
            match self.client.delete_bgp_defined_set(kind, &held.name).await {
                Ok(_) => {
                    info!(instance = self.url(), item = %id, "BGP defined set removed");
                    state.sets.remove(&id);
                    out.taken(&id);
                }
                Err(e) => out.refused(&id, e)?,
            }
        }
        let listed = self.client.list_bgp_neighbors().await?;
        let mut peers_changed = false;
        for n in &listed {
            let Some(ip) = listed_ip(n) else { continue };
            let wanted = config
                .peers
                .iter()
                .any(|p| p.ip_address == ip && p.remote_as == n.remote_as);
            let id = peer_item(ip);
            if !wanted && !out.held_back(&id) {
                peers_changed = true;
                match self.client.delete_bgp_neighbor(ip, n.remote_as).await {
                    Ok(_) => {
                        info!(instance = self.url(), peer = %ip, "BGP neighbour removed");
                        out.taken(&id);
                    }
                    Err(e) => out.refused(&id, e)?,
                }
            }
        }

        // Additions, dependencies first.
        for peer in &config.peers {
            let present = listed
                .iter()
                .any(|n| listed_ip(n) == Some(peer.ip_address) && n.remote_as == peer.remote_as);
            let id = peer_item(peer.ip_address);
            if !present && !out.held_back(&id) {
                peers_changed = true;
                match self.client.add_bgp_neighbor(peer).await {
                    Ok(_) => {
                        info!(instance = self.url(), peer = %peer.ip_address, remote_as = peer.remote_as, "BGP neighbour added");
                        out.taken(&id);
                    }
                    Err(e) => out.refused(&id, e)?,
                }
            }
        }
        for (id, kind, set) in &config.sets {
            if state.sets.contains_key(id) || out.held_back(id) {
                continue;
            }
            match self.client.add_bgp_defined_set(*kind, set).await {
                Ok(()) => {
                    info!(instance = self.url(), item = %id, "BGP defined set added");
                    state.sets.insert(id.clone(), (*kind, set.clone()));
                    out.taken(id);
                }
                Err(e) => out.refused(id, e)?,
            }
        }
        for (id, policy) in &config.policies {
            if state.policies.contains_key(id) || out.held_back(id) {
                continue;
            }
            match self.client.add_bgp_policy(policy).await {
                Ok(()) => {
                    info!(instance = self.url(), item = %id, "BGP policy added");
                    state.policies.insert(id.clone(), policy.clone());
                    out.taken(id);
                }
                Err(e) => out.refused(id, e)?,
            }
        }
        for (id, apply) in &config.applies {
            if state.applies.contains_key(id) || out.held_back(id) {
                continue;
            }
            match self.client.apply_bgp_policy(apply).await {
                Ok(_) => {
                    info!(instance = self.url(), item = %id, "BGP policies applied");
                    state.applies.insert(id.clone(), apply.clone());
                    out.taken(id);
                }
                Err(e) => out.refused(id, e)?,
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
                    state.policies.insert(id.clone(), policy.clone());
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
                    state.sets.insert(id.clone(), (*k2, set.clone()));
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
        r.under(&config(65000));
        assert_eq!(r.waiting("apply a"), None);
        let mut waited = Vec::new();
        for _ in 0..4 {
            r.refused("apply a", "not found peer".into());
            let mut ms = 0;
            while r.waiting("apply a") == Some("not found peer") {
                tokio::time::advance(Duration::from_millis(100)).await;
                ms += 100;
            }
            waited.push(ms);
        }
        assert_eq!(waited, [500, 1000, 2000, 4000]);
        r.refused("apply a", "not found peer".into());
        r.under(&config(65000));
        assert!(r.waiting("apply a").is_some(), "the same configuration");
        r.under(&config(65001));
        assert_eq!(r.waiting("apply a"), None, "another configuration");
        r.refused("apply a", "refused".into());
        r.taken("apply a");
        assert_eq!(r.waiting("apply a"), None);
    }
}
