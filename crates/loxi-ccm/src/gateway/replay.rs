//! The Gateways' rules in a loxilb's replay: what the last pass decided for each Gateway
//! ([`Decided`]), and the fleet worker's replay followed by those rules ([`with_replay`]),
//! so a restarted, wiped or joining loxilb of the group gets the Gateways' listeners back
//! in the same replay as the Services' rules, before it counts as serving, without waiting
//! for the Gateway controller's next pass.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use loxi_domain::{ClusterId, Rule};
use tokio::sync::Notify;
use tracing::{debug, warn};

use crate::loxilb::Instance;
use crate::metrics::Metrics;

/// The rules each Gateway of ours should have on every loxilb of `group`, as the last pass
/// decided them (kept while a Gateway's pass cannot decide, e.g. its address is pending;
/// dropped once its clean-up removed them).
pub struct Decided {
    owner: ClusterId,
    group: String,
    metrics: Metrics,
    rules: Mutex<BTreeMap<(String, String), Vec<Rule>>>,
    /// Rung after a replay: a Gateway pass then reaches the loxilb once it takes passes
    /// again (a pass that ran during the replay left it alone).
    replayed: Notify,
}

impl Decided {
    /// `owner`: the Gateways' rule-owner id (`super::rule_owner`).
    pub fn new(owner: ClusterId, group: String, metrics: Metrics) -> Arc<Decided> {
        Arc::new(Decided {
            owner,
            group,
            metrics,
            rules: Mutex::new(BTreeMap::new()),
            replayed: Notify::new(),
        })
    }

    /// The Gateway `ns/name` should have `rules` (none: it has no usable listener).
    pub fn set(&self, ns: &str, name: &str, rules: &[Rule]) {
        self.lock()
            .insert((ns.to_string(), name.to_string()), rules.to_vec());
    }

    /// The Gateway `ns/name` is gone and its rules removed.
    pub fn forget(&self, ns: &str, name: &str) {
        self.lock().remove(&(ns.to_string(), name.to_string()));
    }

    /// Every Gateway's decided rules, by namespace and name.
    pub fn all(&self) -> BTreeMap<(String, String), Vec<Rule>> {
        self.lock().clone()
    }

    /// Resolves once a replay ran since the last call.
    pub async fn replayed(&self) {
        self.replayed.notified().await;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, String), Vec<Rule>>> {
        // A panic while holding it cannot leave the map half-written (one insert or remove).
        self.rules.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Puts every Gateway's decided rules on `inst` when it is of the group; true when it
    /// holds them all.
    pub async fn replay(&self, inst: &Instance) -> bool {
        if inst.group() != self.group {
            return true;
        }
        let mut complete = true;
        for ((ns, name), rules) in self.all() {
            match inst
                .apply_service(&self.owner, &ns, &name, &rules, &self.metrics, None)
                .await
            {
                Ok(report) if report.complete() => {}
                Ok(_) => {
                    debug!(instance = inst.url(), gateway = %format!("{ns}/{name}"), "Gateway rules replayed in part");
                    complete = false;
                }
                Err(e) => {
                    warn!(instance = inst.url(), gateway = %format!("{ns}/{name}"), error = %e, "could not replay a Gateway's rules");
                    complete = false;
                }
            }
        }
        self.replayed.notify_one();
        complete
    }
}

/// The fleet worker's replay followed by the Gateways' rules (`crate::fleet::workers::Replay`):
/// complete when both are.
pub fn with_replay(
    decided: Arc<Decided>,
    rules: crate::fleet::workers::Replay,
) -> crate::fleet::workers::Replay {
    Arc::new(move |inst: Arc<Instance>| {
        let decided = decided.clone();
        let rules = rules.clone();
        Box::pin(async move {
            let complete = rules(inst.clone()).await;
            let gateways = decided.replay(&inst).await;
            complete && gateways
        })
    })
}
