//! HA roles on each loxilb: the `MASTER`/`BACKUP` state of every HA instance, as the fleet's
//! role decision wants it (`loxi_domain::roles`, docs/fleet.md#ha-roles).
//!
//! Each state is posted once and remembered; a loxilb that restarted or came back has lost
//! them all (docs/loxilb-api.md#ha-roles: after a start it knows only `llb-inst0` in
//! `NOT_DEFINED`), so the health loop forgets what it posted there and posts them again
//! *first*, before BGP and the rules (docs/loxilb-api.md#replay-order). Every post carries
//! the VIP: a state change without one stores a nil address.

use std::collections::BTreeMap;
use std::time::Instant;

pub use loxi_domain::roles::HaSettings;
use loxi_domain::roles::Role;
use loxilb_client::{CiState, ClientError};
use tracing::info;

use super::Instance;
use crate::metrics::Metrics;

/// The states posted to one loxilb since it last (re)started, and whether it left the fleet.
#[derive(Default)]
pub(super) struct PostedRoles {
    /// HA instance -> role.
    posted: BTreeMap<String, Role>,
    /// It left the fleet and was told `BACKUP` ([`Instance::step_down`]): nothing is posted
    /// to it any more, so a decision made before it left (its post may be spawned and
    /// waiting for this lock) cannot make it `MASTER` again.
    pub(super) left: bool,
    /// The `MASTER` state of this HA instance was being posted when its post was cut short
    /// (its worker stopped mid-call as the loxilb left): loxilb may hold it.
    cut_short: Option<String>,
}

impl Instance {
    /// loxilb restarted or came back: the states it held are gone.
    pub async fn forget_roles(&self) {
        self.roles.lock().await.posted.clear();
    }

    /// A post of HA states to it is under way (the fleet's role decisions then leave it to
    /// that post and the next decision).
    pub fn posting_roles(&self) -> bool {
        self.roles.try_lock().is_err()
    }

    /// Posts every state in `wanted` that differs from what was posted here; the first
    /// failure stops (the next health tick tries again). Returns how many were posted;
    /// none once it left the fleet.
    pub async fn ensure_roles(
        &self,
        wanted: &BTreeMap<String, Role>,
        vip: &str,
        metrics: &Metrics,
    ) -> Result<usize, ClientError> {
        let mut roles = self.roles.lock().await;
        if roles.left {
            return Ok(0);
        }
        self.post_roles(&mut roles, wanted, vip, metrics).await
    }

    /// It left the fleet: told `BACKUP` for every HA instance it was told `MASTER` for
    /// (best effort: it may be gone already; `Ok(0)` when it held none), and posted nothing
    /// more from then on, whatever the result.
    pub async fn step_down(&self, vip: &str, metrics: &Metrics) -> Result<usize, ClientError> {
        let mut roles = self.roles.lock().await;
        roles.left = true;
        let wanted: BTreeMap<String, Role> = roles
            .posted
            .iter()
            .filter(|(_, role)| **role == Role::Master)
            .map(|(instance, _)| instance)
            .chain(&roles.cut_short)
            .map(|instance| (instance.clone(), Role::Backup))
            .collect();
        self.post_roles(&mut roles, &wanted, vip, metrics).await
    }

    async fn post_roles(
        &self,
        roles: &mut PostedRoles,
        wanted: &BTreeMap<String, Role>,
        vip: &str,
        metrics: &Metrics,
    ) -> Result<usize, ClientError> {
        let mut sent = 0;
        for (instance, role) in wanted {
            if roles.posted.get(instance) == Some(role) {
                continue;
            }
            let state = CiState {
                instance: instance.clone(),
                state: role.as_loxilb().to_string(),
                vip: vip.to_string(),
            };
            let started = Instant::now();
            roles.cut_short = (*role == Role::Master).then(|| instance.clone());
            let result = self.client.set_cluster_state(&state).await;
            roles.cut_short = None;
            metrics.loxilb_call(
                self.url(),
                "cistate",
                started.elapsed(),
                result.as_ref().err(),
            );
            result?;
            info!(
                instance = self.url(),
                ha_instance = %instance,
                role = role.as_loxilb(),
                "HA role set"
            );
            metrics.set_ha_role(instance, self.url(), role.as_loxilb());
            roles.posted.insert(instance.clone(), *role);
            sent += 1;
        }
        Ok(sent)
    }
}
