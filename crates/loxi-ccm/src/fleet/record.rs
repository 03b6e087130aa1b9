//! The fleet's records in the cluster, and where they are kept.
//!
//! The fleet as an operator can `kubectl get` it (docs/fleet.md#seeing-the-fleet): a
//! ConfigMap, `<leader-elect-name>-fleet` in the leader-election namespace, one key per group
//! of loxilbs whose value says which of its loxilbs serve, join or are down, its HA masters,
//! and how full it is. Written by the leader from the health tick (`super::health`), only
//! when the text changes and at most every [`MIN_INTERVAL`], so a churn of Services costs few
//! writes.
//!
//! A ConfigMap rather than a resource of our own, like the HA role record (`super::roles`):
//! no CRD to install, `kubectl get` and `kubectl describe` show it as it is. Both records are
//! kept through [`Record`], so the fleet runs without an API server too (a [`MemoryRecord`]:
//! crates/loxi-ccm/tests/fleet_alone.rs).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use loxi_domain::roles::Masters;
use tokio::sync::Mutex;
use tracing::warn;

use crate::leader::Gate;
use crate::loxilb::Group;

/// Why a record was not read or written.
pub type RecordError = Box<dyn std::error::Error + Send + Sync>;

/// Where one of the fleet's records (key -> text) is kept.
pub trait Record: Send + Sync {
    /// What to call it in logs.
    fn name(&self) -> &str;
    /// What it holds (`None`: it does not exist yet).
    fn read(&self) -> BoxFuture<'_, Result<Option<BTreeMap<String, String>>, RecordError>>;
    /// Makes it hold exactly `data`.
    fn write<'a>(
        &'a self,
        data: &'a BTreeMap<String, String>,
    ) -> BoxFuture<'a, Result<(), RecordError>>;
}

/// A record kept in a ConfigMap, written by server-side apply under its own field manager.
pub struct ConfigMapRecord {
    api: Api<ConfigMap>,
    name: String,
    manager: &'static str,
}

impl ConfigMapRecord {
    /// The ConfigMap `namespace/name`, written under field manager `manager`.
    pub fn shared(
        client: kube::Client,
        namespace: &str,
        name: &str,
        manager: &'static str,
    ) -> Arc<dyn Record> {
        Arc::new(ConfigMapRecord {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            manager,
        })
    }
}

impl Record for ConfigMapRecord {
    fn name(&self) -> &str {
        &self.name
    }

    fn read(&self) -> BoxFuture<'_, Result<Option<BTreeMap<String, String>>, RecordError>> {
        Box::pin(async move {
            let cm = self.api.get_opt(&self.name).await?;
            Ok(cm.map(|cm| cm.data.unwrap_or_default()))
        })
    }

    fn write<'a>(
        &'a self,
        data: &'a BTreeMap<String, String>,
    ) -> BoxFuture<'a, Result<(), RecordError>> {
        Box::pin(async move {
            crate::k8s::api::apply_config_map(&self.api, &self.name, self.manager, data).await?;
            Ok(())
        })
    }
}

/// A record kept in memory: the fleet without an API server.
#[derive(Default)]
pub struct MemoryRecord {
    data: std::sync::Mutex<Option<BTreeMap<String, String>>>,
}

impl MemoryRecord {
    /// What it holds now.
    pub fn get(&self) -> Option<BTreeMap<String, String>> {
        self.data
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl Record for MemoryRecord {
    fn name(&self) -> &str {
        "in memory"
    }

    fn read(&self) -> BoxFuture<'_, Result<Option<BTreeMap<String, String>>, RecordError>> {
        Box::pin(async move { Ok(self.get()) })
    }

    fn write<'a>(
        &'a self,
        data: &'a BTreeMap<String, String>,
    ) -> BoxFuture<'a, Result<(), RecordError>> {
        *self
            .data
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(data.clone());
        Box::pin(async { Ok(()) })
    }
}

/// Field manager of the fleet record's server-side apply.
pub const MANAGER: &str = "loxi-ccm-fleet";

/// At most one write in this time.
pub const MIN_INTERVAL: Duration = Duration::from_secs(5);

/// The fleet record (module docs).
pub struct FleetRecord {
    record: Arc<dyn Record>,
    last: Mutex<Written>,
}

/// What was written last, and when a write was last tried.
#[derive(Default)]
struct Written {
    data: Option<BTreeMap<String, String>>,
    tried: Option<Instant>,
}

/// One group as the record shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupReport {
    pub name: String,
    /// (URL, state: `serving`, `joining` or `down`, rules it holds).
    pub loxilbs: Vec<(String, &'static str, usize)>,
    pub capacity: usize,
    /// Rules of the Services placed on it (`None`: one group, nothing placed by capacity).
    pub placed: Option<usize>,
}

/// The record's value for a group: one line an operator reads.
pub fn describe(group: &GroupReport, masters: &Masters) -> String {
    let count = |state: &str| group.loxilbs.iter().filter(|l| l.1 == state).count();
    let fullest = group.loxilbs.iter().map(|l| l.2).max().unwrap_or(0);
    let mut text = format!(
        "{} loxilb(s): {} serving, {} joining, {} down; fullest holds {fullest} of {} rules",
        group.loxilbs.len(),
        count("serving"),
        count("joining"),
        count("down"),
        group.capacity
    );
    if let Some(placed) = group.placed {
        text.push_str(&format!("; {placed} rule(s) placed"));
    }
    let prefix = format!("{}-inst", group.name);
    let held: Vec<String> = masters
        .iter()
        .filter(|(instance, _)| {
            instance
                .strip_prefix(&prefix)
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(|(instance, url)| format!("{instance} MASTER {url}"))
        .collect();
    if !held.is_empty() {
        text.push_str(&format!("; {}", held.join(", ")));
    }
    let each: Vec<String> = group
        .loxilbs
        .iter()
        .map(|(url, state, rules)| format!("{url} {state} {rules}"))
        .collect();
    text.push_str(&format!(" [{}]", each.join(", ")));
    text
}

impl FleetRecord {
    pub fn new(record: Arc<dyn Record>) -> FleetRecord {
        FleetRecord {
            record,
            last: Mutex::default(),
        }
    }

    /// Writes the record when it changed and the last write is [`MIN_INTERVAL`] old.
    pub async fn publish(
        &self,
        groups: &[Group],
        placed: &BTreeMap<String, usize>,
        masters: &Masters,
        gate: &Gate,
    ) {
        if !gate.holds_lease() {
            return;
        }
        let mut reports = Vec::with_capacity(groups.len());
        for g in groups {
            let mut loxilbs = Vec::with_capacity(g.instances.len());
            for inst in &g.instances {
                let state = if !inst.is_healthy() {
                    "down"
                } else if inst.is_serving() {
                    "serving"
                } else {
                    "joining"
                };
                loxilbs.push((inst.url().to_string(), state, inst.rule_count().await));
            }
            reports.push(GroupReport {
                name: g.name.clone(),
                loxilbs,
                capacity: g.capacity(),
                placed: (groups.len() > 1).then(|| placed.get(&g.name).copied().unwrap_or(0)),
            });
        }
        let data: BTreeMap<String, String> = reports
            .iter()
            .map(|r| (r.name.clone(), describe(r, masters)))
            .collect();
        let mut last = self.last.lock().await;
        if last.data.as_ref() == Some(&data)
            || last.tried.is_some_and(|t| t.elapsed() < MIN_INTERVAL)
        {
            return;
        }
        match self.record.write(&data).await {
            Ok(_) => {
                last.data = Some(data);
                last.tried = Some(Instant::now());
            }
            Err(e) => {
                warn!(record = self.record.name(), error = %e, "cannot write the fleet's status; trying again");
                last.tried = Some(Instant::now());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_group() {
        let g = GroupReport {
            name: "east".into(),
            loxilbs: vec![
                ("http://a".into(), "serving", 48),
                ("http://b".into(), "down", 0),
            ],
            capacity: 2048,
            placed: Some(48),
        };
        let masters = Masters::from([
            ("east-inst0".to_string(), "http://a".to_string()),
            ("east-1-inst0".to_string(), "http://x".to_string()),
            ("llb-inst0".to_string(), "http://c".to_string()),
        ]);
        assert_eq!(
            describe(&g, &masters),
            "2 loxilb(s): 1 serving, 0 joining, 1 down; fullest holds 48 of 2048 rules; 48 \
             rule(s) placed; east-inst0 MASTER http://a [http://a serving 48, http://b down 0]"
        );
    }
}
