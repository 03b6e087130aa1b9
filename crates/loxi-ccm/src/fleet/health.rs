//! The fleet's health tick: a worker for every loxilb (`super::workers`: probes, replays,
//! BGP, each loxilb in its own task), the BGP plan handed to them and what their passes
//! found published (`crate::bgp`), the groups' metrics and the fleet record
//! (`super::record`); at every `--health-interval` and at once when a loxilb changed state.
//! Nothing here waits for a loxilb's call.

use std::sync::Arc;

use loxilb_client::ClientError;

use super::Fleet;
use super::workers::Workers;
use crate::loxilb::bgp::BgpReport;
use crate::loxilb::{Fleet as Instances, Instance};
use crate::metrics::Metrics;

pub(super) async fn run(fleet: Fleet, workers: Arc<Workers>) {
    let inner = &fleet.inner;
    let settings = &inner.settings;
    inner.gate.wait_ready().await;
    let mut changes = workers.changes();
    let mut tick = tokio::time::interval(settings.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            changed = changes.changed() => if changed.is_err() { return },
        }
        let fleet_instances = fleet.instances();
        let (instances, peers) = workers.follow(|| {
            // The BGP-peer-only loxilbs get BGP settings only (`super::members`).
            let peers: Arc<Vec<Arc<Instance>>> = match &settings.bgp {
                Some(_) => fleet.peer_instances(),
                None => Default::default(),
            };
            (fleet_instances.instances(), peers)
        });
        publish_groups(&fleet_instances, &settings.metrics);
        // No plan while a BGP kind whose CRD was just installed is being listed: the workers
        // keep the last one.
        if let Some(bgp) = &settings.bgp
            && let Some(plan) = bgp.plan(inner.members.mesh())
        {
            let plan = Arc::new(plan);
            workers.set_plan(plan.clone());
            let urls: Vec<String> = instances
                .iter()
                .chain(peers.iter())
                .map(|i| i.url().to_string())
                .collect();
            let (passes, current) = workers.bgp_passes(&plan, &urls);
            let view: Vec<(String, Option<&Result<BgpReport, ClientError>>)> = passes
                .iter()
                .map(|(url, pass)| (url.clone(), pass.as_deref()))
                .collect();
            bgp.publish(&plan, &view, current).await;
        }
        let masters = match &settings.roles {
            Some(roles) => roles.masters().await,
            None => Default::default(),
        };
        inner
            .record
            .publish(
                &fleet_instances.groups(),
                &inner.placement.placed_rules().await,
                &masters,
                &inner.gate,
            )
            .await;
        // Programmed conditions name the unreachable instances and count the serving ones:
        // re-evaluate them.
        if workers.take_status_changed() {
            fleet.replan();
        }
    }
}

/// Each group's loxilbs by state and its capacity, as metrics.
fn publish_groups(fleet: &Instances, metrics: &Metrics) {
    for group in fleet.groups() {
        let (mut serving, mut joining, mut down) = (0, 0, 0);
        for inst in &group.instances {
            if !inst.is_healthy() {
                down += 1;
            } else if inst.is_serving() {
                serving += 1;
            } else {
                joining += 1;
            }
        }
        metrics.set_group(&group.name, serving, joining, down, group.capacity());
    }
}
