//! The helpers of the fleet's tests (`fleet.rs`, `fleet_discovery.rs`): simulators, the
//! masters they were told of, the role record, the waits on roles. Included with `#[path]`
//! by the test files that use it only.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use crate::common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use loxilb_sim::{SimConfig, Simulator};

pub async fn sim() -> Simulator {
    Simulator::start("127.0.0.1:0".parse().unwrap(), SimConfig::default())
        .await
        .unwrap()
}

/// Among the simulators that are up: the index of the only one that is MASTER for
/// `instance` while every other one is BACKUP, else `None`.
pub async fn sole_master(sims: &[Simulator], instance: &str) -> Option<usize> {
    sole_master_without(sims, instance, usize::MAX).await
}

pub async fn wait_sole_master(sims: &[Simulator], instance: &str) -> usize {
    wait_for(&format!("one MASTER for {instance}"), WAIT, || async {
        sole_master(sims, instance).await
    })
    .await
}

/// The HA role record (HA instance -> master URL).
pub async fn record(w: &World) -> std::collections::BTreeMap<String, String> {
    let api: Api<ConfigMap> = Api::namespaced(w.client.clone(), &w.ns);
    api.get_opt("loxi-ccm-ha-roles")
        .await
        .unwrap()
        .and_then(|cm| cm.data)
        .unwrap_or_default()
}

pub fn url_label(s: &Simulator) -> String {
    format!("loxilb=\"{}\"", s.url())
}

/// Waits until the controller serving metrics on `port` has posted `role` for `instance`
/// to `s`.
pub async fn wait_posted(port: u16, s: &Simulator, instance: &str, role: &str) {
    let inst = format!("ha_instance=\"{instance}\"");
    let role_label = format!("role=\"{role}\"");
    wait_for(&format!("{role} posted to {}", s.url()), WAIT, || async {
        let v = World::metric_sum(
            port,
            "loxi_ccm_ha_roles",
            &[&inst, &url_label(s), &role_label],
        )
        .await?;
        (v == 1.0).then_some(())
    })
    .await;
}

/// Among the simulators that are up, `skip` left out: the index of the only MASTER for
/// `instance` while the others are BACKUP.
pub async fn sole_master_without(sims: &[Simulator], instance: &str, skip: usize) -> Option<usize> {
    let mut master = None;
    for (i, s) in sims.iter().enumerate() {
        if i == skip || !s.is_up().await {
            continue;
        }
        match s.cluster_state(instance).as_deref() {
            Some("MASTER") if master.is_none() => master = Some(i),
            Some("BACKUP") => {}
            _ => return None,
        }
    }
    master
}

/// A world with a second loxilb, `--set-roles` and `extra` flags: the world, its two
/// simulators, and which of them is MASTER of `llb-inst0`.
pub async fn two_with_roles(name: &str, extra: &[&str]) -> (World, Vec<Simulator>, usize) {
    let other = sim().await;
    let mut extra_args = vec![
        format!("--loxilb-url={}", other.url()),
        "--set-roles=0.0.0.0".to_string(),
    ];
    extra_args.extend(extra.iter().map(|s| s.to_string()));
    let opts = Options {
        extra_args,
        ..Options::default()
    };
    let w = World::with(name, opts).await;
    let sims = vec![w.sim.clone(), other];
    let master = wait_sole_master(&sims, "llb-inst0").await;
    (w, sims, master)
}

/// How long a failover test waits for the new MASTER (`FAILOVER_WAIT_SECS`, default 30):
/// longer to measure how late an older build is.
pub fn failover_wait() -> Duration {
    std::env::var("FAILOVER_WAIT_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(WAIT, Duration::from_secs)
}

/// Waits until the controller on `port` reports `s` down (`loxi_ccm_loxilb_up` 0): the health
/// check that sees it gone.
pub async fn wait_seen_down(port: u16, s: &Simulator, within: Duration) -> Instant {
    let label = format!("instance=\"{}\"", s.url());
    wait_for("the loxilb seen down", within, || async {
        let up = World::metric_sum(port, "loxi_ccm_loxilb_up", &[&label]).await?;
        (up == 0.0).then_some(())
    })
    .await;
    Instant::now()
}
