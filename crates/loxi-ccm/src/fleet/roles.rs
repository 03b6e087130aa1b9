//! HA roles across the fleet (docs/fleet.md#ha-roles): at every health tick the masters are
//! decided from the probes (`loxi_domain::roles::decide_masters`), recorded, and the states
//! posted to every reachable loxilb that lacks them.
//!
//! The record is a ConfigMap (`<leader-elect-name>-ha-roles` in the leader-election
//! namespace), one key per HA instance whose value is its master's URL: a controller restart
//! or a new leader reads it before deciding anything, so the masters stay where they were.
//! A ConfigMap rather than a resource of our own: it needs no CRD, `kubectl get` shows it,
//! and its writes are rare (a role moves only when a master fails).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use loxi_domain::roles::{Candidate, HaSettings, Masters, Role, decide_masters, role_of};
use tokio::sync::Mutex;
use tracing::{info, warn};

use crate::leader::Gate;
use crate::loxilb::Instance;
use crate::metrics::Metrics;

/// Field manager of the record's server-side apply.
const MANAGER: &str = "loxi-ccm-roles";

pub struct Roles {
    settings: HaSettings,
    api: Api<ConfigMap>,
    name: String,
    book: Mutex<Book>,
}

#[derive(Default)]
struct Book {
    /// The record has been read (until then nothing is decided).
    loaded: bool,
    masters: Masters,
    /// What the record holds as last written or read.
    saved: Option<Masters>,
}

impl Roles {
    pub fn new(client: kube::Client, settings: HaSettings, namespace: &str, name: &str) -> Roles {
        Roles {
            settings,
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            book: Mutex::default(),
        }
    }

    /// The masters as decided last (HA instance -> loxilb URL).
    pub async fn masters(&self) -> Masters {
        self.book.lock().await.masters.clone()
    }

    /// A loxilb that left the fleet: told `BACKUP` for every HA instance it was told
    /// `MASTER` for (best effort: it may be gone already).
    pub async fn step_down(&self, inst: &Instance, metrics: &Metrics) {
        let wanted: BTreeMap<String, Role> = inst
            .posted_roles()
            .await
            .into_iter()
            .filter(|(_, role)| *role == Role::Master)
            .map(|(instance, _)| (instance, Role::Backup))
            .collect();
        if wanted.is_empty() {
            return;
        }
        match inst
            .ensure_roles(&wanted, &self.settings.vip, metrics)
            .await
        {
            Ok(_) => info!(instance = inst.url(), "loxilb left the fleet: made BACKUP"),
            Err(e) => {
                info!(instance = inst.url(), error = %e, "loxilb left the fleet: not made BACKUP (gone?)")
            }
        }
    }

    async fn load(&self, book: &mut Book) -> Result<(), kube::Error> {
        let masters: Masters = self
            .api
            .get_opt(&self.name)
            .await?
            .and_then(|cm| cm.data)
            .unwrap_or_default()
            .into_iter()
            .collect();
        info!(record = %self.name, ?masters, "HA roles read");
        book.masters = masters.clone();
        book.saved = Some(masters);
        book.loaded = true;
        Ok(())
    }

    async fn save(&self, masters: &Masters) -> Result<(), kube::Error> {
        crate::k8s::api::apply_config_map(&self.api, &self.name, MANAGER, masters).await
    }

    /// One health tick, after the probes: decide, post the states each reachable loxilb
    /// lacks, record. A loxilb that needs a replay has lost its states (the health loop
    /// forgets them first): they are posted again here, before its BGP and rules.
    pub async fn tick(&self, instances: &[Arc<Instance>], gate: &Gate, metrics: &Metrics) {
        let mut book = self.book.lock().await;
        if !book.loaded
            && let Err(e) = self.load(&mut book).await
        {
            warn!(record = %self.name, error = %e, "cannot read the HA role record: no roles are decided until it can be read");
            return;
        }
        // Per group: its HA instances (`<group>-inst0`, ...) among its own loxilbs.
        let mut groups: BTreeMap<&str, Vec<Candidate>> = BTreeMap::new();
        for inst in instances {
            groups.entry(inst.group()).or_default().push(Candidate {
                id: inst.url().to_string(),
                reachable: inst.is_healthy(),
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
                    warn!(ha_instance = %instance, from = %old, to = %master, "HA master moved: the master stopped answering");
                    metrics.ha_failover(instance);
                }
                None => info!(ha_instance = %instance, master = %master, "HA master chosen"),
                _ => {}
            }
        }
        book.masters = decided.clone();
        // Every loxilb at once: one that times out must not delay the new master.
        let posts = instances.iter().map(|inst| {
            let decided = &decided;
            async move {
                if !inst.is_healthy() || self.settings.excludes(inst.url()) {
                    return;
                }
                let wanted: BTreeMap<String, _> = self
                    .settings
                    .instances_of(inst.group())
                    .into_iter()
                    .filter(|i| decided.contains_key(i))
                    .map(|i| {
                        let role = role_of(decided, &i, inst.url());
                        (i, role)
                    })
                    .collect();
                if let Err(e) = inst
                    .ensure_roles(&wanted, &self.settings.vip, metrics)
                    .await
                {
                    warn!(instance = inst.url(), error = %e, "HA roles not set; trying again");
                }
            }
        });
        futures::future::join_all(posts).await;
        // Recorded after the posts: a slow API server must not delay a failover, and a
        // record one tick late is decided the same way again after a restart.
        if book.saved.as_ref() != Some(&decided) && gate.holds_lease() {
            match self.save(&decided).await {
                Ok(()) => book.saved = Some(decided),
                Err(e) => {
                    warn!(record = %self.name, error = %e, "cannot record the HA roles; trying again")
                }
            }
        }
    }
}
