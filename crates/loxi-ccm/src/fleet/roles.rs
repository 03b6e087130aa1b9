//! HA roles across the fleet (docs/fleet.md#ha-roles): on their own tick, and at once when a
//! loxilb's worker finds it down or back, the masters are decided from the latest probes
//! (`loxi_domain::roles::decide_masters`), the states posted to every reachable loxilb that
//! lacks them (each post in its own task: no decision waits for a loxilb's answer), and
//! recorded. A loxilb that comes back or restarted is told its roles by its own worker first
//! of all ([`Roles::tell`]).
//!
//! The record is a ConfigMap (`<leader-elect-name>-ha-roles` in the leader-election
//! namespace), one key per HA instance whose value is its master's URL: a controller restart
//! or a new leader reads it before deciding anything, so the masters stay where they were.
//! A ConfigMap rather than a resource of our own: it needs no CRD, `kubectl get` shows it,
//! and its writes are rare (a role moves only when a master fails). It is kept through
//! `super::record::Record`, so the roles are decided without an API server too.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use loxi_domain::roles::{Candidate, HaSettings, Masters, Role, decide_masters, role_of};
use tokio::sync::Mutex;
use tracing::{info, warn};

use super::record::{Record, RecordError};
use crate::leader::Gate;
use crate::loxilb::{Fleet, Instance};
use crate::metrics::Metrics;

/// Field manager of the record's server-side apply.
pub const MANAGER: &str = "loxi-ccm-roles";

pub struct Roles {
    settings: HaSettings,
    /// With BGP: how long a MASTER cut off from the configured BGP peers keeps its role
    /// while another loxilb of its group reaches them (`--ha-bgp-hold`).
    bgp_hold: Duration,
    record: Arc<dyn Record>,
    book: Mutex<Book>,
}

#[derive(Default)]
struct Book {
    /// The record has been read (until then nothing is decided).
    loaded: bool,
    masters: Masters,
    /// What the record holds as last written or read.
    saved: Option<Masters>,
    /// Since when each loxilb has reached none of the configured BGP peers.
    cut_off: BTreeMap<String, std::time::Instant>,
}

impl Roles {
    /// Roles recorded in `record` (a `super::record::ConfigMapRecord` written as
    /// [`MANAGER`] in the controller).
    pub fn new(settings: HaSettings, bgp_hold: Duration, record: Arc<dyn Record>) -> Roles {
        Roles {
            settings,
            bgp_hold,
            record,
            book: Mutex::default(),
        }
    }

    /// The masters as decided last (HA instance -> loxilb URL).
    pub async fn masters(&self) -> Masters {
        self.book.lock().await.masters.clone()
    }

    /// A loxilb that left the fleet: told `BACKUP` for every HA instance it was told
    /// `MASTER` for (best effort: it may be gone already), and no role is posted to it from
    /// then on (`Instance::step_down`).
    pub async fn step_down(&self, inst: &Instance, metrics: &Metrics) {
        match inst.step_down(&self.settings.vip, metrics).await {
            Ok(0) => {}
            Ok(_) => info!(instance = inst.url(), "loxilb left the fleet: made BACKUP"),
            Err(e) => {
                info!(instance = inst.url(), error = %e, "loxilb left the fleet: not made BACKUP (gone?)")
            }
        }
    }

    async fn load(&self, book: &mut Book) -> Result<(), RecordError> {
        let masters: Masters = self.record.read().await?.unwrap_or_default();
        info!(record = self.record.name(), ?masters, "HA roles read");
        book.masters = masters.clone();
        book.saved = Some(masters);
        book.loaded = true;
        Ok(())
    }

    async fn save(&self, masters: &Masters) -> Result<(), RecordError> {
        self.record.write(masters).await
    }

    /// The states `inst` should hold under `decided` (HA instance -> role), for the HA
    /// instances of its group that have a master.
    fn wanted_for(&self, inst: &Instance, decided: &Masters) -> BTreeMap<String, Role> {
        self.settings
            .instances_of(inst.group())
            .into_iter()
            .filter(|i| decided.contains_key(i))
            .map(|i| {
                let role = role_of(decided, &i, inst.url());
                (i, role)
            })
            .collect()
    }

    /// Posts `inst` the roles of the current decision (its worker, right after the loxilb
    /// came back or restarted, before its BGP and rules: a MASTER whose role moved while it
    /// was away hears `BACKUP` first). Nothing before the record has been read.
    pub async fn tell(&self, inst: &Instance, metrics: &Metrics) {
        if self.settings.excludes(inst.url()) {
            return;
        }
        let decided = {
            let book = self.book.lock().await;
            if !book.loaded {
                return;
            }
            book.masters.clone()
        };
        let wanted = self.wanted_for(inst, &decided);
        if let Err(e) = inst
            .ensure_roles(&wanted, &self.settings.vip, metrics)
            .await
        {
            warn!(instance = inst.url(), error = %e, "HA roles not set; trying again");
        }
    }

    /// Decides the roles at every `interval` and at once when a loxilb's worker finds it
    /// down or back (`changes`: the workers' `Workers::changes`), from the latest probes;
    /// `bgp_reach` is the workers' `Workers::bgp_reach`.
    pub async fn run(
        self: Arc<Self>,
        fleet: Fleet,
        mut changes: tokio::sync::watch::Receiver<u64>,
        bgp_reach: impl Fn() -> HashMap<String, bool> + Send + 'static,
        gate: Arc<Gate>,
        metrics: Metrics,
        interval: Duration,
    ) {
        gate.wait_ready().await;
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                changed = changes.changed() => if changed.is_err() { return },
            }
            self.tick(&fleet.instances(), &bgp_reach(), &gate, &metrics)
                .await;
        }
    }

    /// One decision from the latest probes: decide, post the states each reachable loxilb
    /// lacks (each in its own task, not waited for), record. `bgp_reach` says which loxilbs
    /// reach the configured BGP peers (`Workers::bgp_reach`): a loxilb cut off from them for
    /// the hold time, while another of its group reaches them, counts as unreachable (the
    /// roles follow reachability, docs/fleet.md#roles-follow-bgp-reachability).
    pub async fn tick(
        &self,
        instances: &[Arc<Instance>],
        bgp_reach: &std::collections::HashMap<String, bool>,
        gate: &Gate,
        metrics: &Metrics,
    ) {
        let mut book = self.book.lock().await;
        if !book.loaded
            && let Err(e) = self.load(&mut book).await
        {
            warn!(record = self.record.name(), error = %e, "cannot read the HA role record: no roles are decided until it can be read");
            return;
        }
        let now = std::time::Instant::now();
        book.cut_off
            .retain(|url, _| bgp_reach.get(url) == Some(&false));
        for (url, up) in bgp_reach {
            if !*up {
                book.cut_off.entry(url.clone()).or_insert(now);
            }
        }
        // Per group: its HA instances (`<group>-inst0`, ...) among its own loxilbs.
        let mut groups: BTreeMap<&str, Vec<Candidate>> = BTreeMap::new();
        for inst in instances {
            let reaching = |i: &Arc<Instance>| {
                i.url() != inst.url()
                    && i.group() == inst.group()
                    && i.is_healthy()
                    && !self.settings.excludes(i.url())
                    && bgp_reach.get(i.url()) == Some(&true)
            };
            // Cut off for the hold time while another loxilb of its group reaches the peers.
            let cut_off = book
                .cut_off
                .get(inst.url())
                .is_some_and(|since| now.duration_since(*since) >= self.bgp_hold)
                && instances.iter().any(reaching);
            groups.entry(inst.group()).or_default().push(Candidate {
                id: inst.url().to_string(),
                reachable: inst.is_healthy() && !cut_off,
                excluded: self.settings.excludes(inst.url()),
            });
        }
        let mut decided = Masters::new();
        for (group, candidates) in &groups {
            decided.extend(decide_masters(
                &self.settings.instances_of(group),
                candidates,
                &book.masters,
            ));
        }
        // A group with no loxilb now keeps its record (its loxilbs may come back).
        for (instance, master) in &book.masters {
            let group = loxi_domain::roles::group_of_instance(instance).unwrap_or_default();
            if !groups.contains_key(group) {
                decided
                    .entry(instance.clone())
                    .or_insert_with(|| master.clone());
            }
        }
        for (instance, master) in &decided {
            match book.masters.get(instance) {
                Some(old) if old != master => {
                    let why = if instances.iter().any(|i| i.url() == old && i.is_healthy()) {
                        "its BGP sessions with the configured peers are down"
                    } else {
                        "the master stopped answering"
                    };
                    warn!(ha_instance = %instance, from = %old, to = %master, "HA master moved: {why}");
                    metrics.ha_failover(instance);
                }
                None => info!(ha_instance = %instance, master = %master, "HA master chosen"),
                _ => {}
            }
        }
        book.masters = decided.clone();
        let saved = book.saved.clone();
        drop(book);
        // Every loxilb on its own: one that times out must not delay the new master, nor the
        // next decision. A loxilb with a post under way gets the rest at the next tick.
        for inst in instances {
            if !inst.is_healthy() || self.settings.excludes(inst.url()) || inst.posting_roles() {
                continue;
            }
            let wanted = self.wanted_for(inst, &decided);
            let (inst, vip, metrics) = (inst.clone(), self.settings.vip.clone(), metrics.clone());
            tokio::spawn(async move {
                if let Err(e) = inst.ensure_roles(&wanted, &vip, &metrics).await {
                    warn!(instance = inst.url(), error = %e, "HA roles not set; trying again");
                }
            });
        }
        // Recorded after the posts: a slow API server must not delay a failover, and a
        // record one tick late is decided the same way again after a restart.
        if saved.as_ref() != Some(&decided) && gate.holds_lease() {
            match self.save(&decided).await {
                Ok(()) => self.book.lock().await.saved = Some(decided),
                Err(e) => {
                    warn!(record = self.record.name(), error = %e, "cannot record the HA roles; trying again")
                }
            }
        }
    }
}
