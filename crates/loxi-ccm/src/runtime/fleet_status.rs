//! The fleet as an operator can `kubectl get` it (docs/fleet.md#seeing-the-fleet): a
//! ConfigMap, `<leader-elect-name>-fleet` in the leader-election namespace, one key per group
//! of loxilbs whose value says which of its loxilbs serve, join or are down, its HA masters,
//! and how full it is. Written by the leader from the health loop, only when the text
//! changes and at most every [`MIN_INTERVAL`], so a churn of Services costs few writes.
//!
//! A ConfigMap rather than a resource of our own, like the HA role record (`roles`): no CRD
//! to install, `kubectl get` and `kubectl describe` show it as it is.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use loxi_domain::roles::Masters;
use tokio::sync::Mutex;
use tracing::warn;

use crate::leader::Gate;
use crate::loxilb::Group;

/// Field manager of the ConfigMap's server-side apply.
const MANAGER: &str = "loxi-ccm-fleet";

/// At most one write in this time.
pub const MIN_INTERVAL: Duration = Duration::from_secs(5);

pub struct FleetStatus {
    api: Api<ConfigMap>,
    name: String,
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

impl FleetStatus {
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> FleetStatus {
        FleetStatus {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
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
        match crate::k8s::api::apply_config_map(&self.api, &self.name, MANAGER, &data).await {
            Ok(_) => {
                last.data = Some(data);
                last.tried = Some(Instant::now());
            }
            Err(e) => {
                warn!(record = %self.name, error = %e, "cannot write the fleet's status; trying again");
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
