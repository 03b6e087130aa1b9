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

/// The states posted to one loxilb since it last (re)started: HA instance -> role.
pub(super) type PostedRoles = BTreeMap<String, Role>;

impl Instance {
    /// loxilb restarted or came back: the states it held are gone.
    pub async fn forget_roles(&self) {
        self.roles.lock().await.clear();
    }

    /// A post of HA states to it is under way (the fleet's role decisions then leave it to
    /// that post and the next decision).
    pub fn posting_roles(&self) -> bool {
        self.roles.try_lock().is_err()
    }

    /// The roles this controller last posted here.
    pub async fn posted_roles(&self) -> BTreeMap<String, Role> {
        self.roles.lock().await.clone()
    }

    /// Posts every state in `wanted` that differs from what was posted here; the first
    /// failure stops (the next health tick tries again). Returns how many were posted.
    pub async fn ensure_roles(
        &self,
        wanted: &BTreeMap<String, Role>,
        vip: &str,
        metrics: &Metrics,
    ) -> Result<usize, ClientError> {
        let mut posted = self.roles.lock().await;
        let mut sent = 0;
        for (instance, role) in wanted {
            if posted.get(instance) == Some(role) {
                continue;
            }
            let state = CiState {
                instance: instance.clone(),
                state: role.as_loxilb().to_string(),
                vip: vip.to_string(),
            };
            let started = Instant::now();
            let result = self.client.set_cluster_state(&state).await;
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
            posted.insert(instance.clone(), *role);
            sent += 1;
        }
        Ok(sent)
    }
}
