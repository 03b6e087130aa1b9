//! The tasks that run beside the reconcile loop, started into the set that `super::run`
//! holds (dropping it aborts them): the admin server, the watches' consumers, the optional senders, the
//! fleet's sources, the Gateway API controller and the drift check.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use k8s_openapi::api::core::v1::Service;
use kube::runtime::controller::Controller;
use tokio::task::JoinSet;
use tracing::warn;

use super::assemble::{EgressWiring, MetadataWiring, Watches};
use super::{Shared, admin, node_watch, watches};
use crate::config::Config;
use crate::fleet::{self, Fleet};
use crate::service::{self, Context, departures};

/// The admin server, when `--admin-addr` gave it a listener.
pub(super) fn admin_server(
    tasks: &mut JoinSet<()>,
    listener: Option<tokio::net::TcpListener>,
    shared: &Arc<Shared>,
) {
    let Some(listener) = listener else {
        return;
    };
    let shared = shared.clone();
    tasks.spawn(async move {
        if let Err(e) = admin::serve(listener, shared).await {
            warn!(error = %e, "admin server stopped");
        }
    });
}

/// Starts the consumers of every watch but the Service watch's events, which drive the
/// reconcile loop: the controller over them is handed back.
pub(super) fn watch_consumers(
    tasks: &mut JoinSet<()>,
    ctx: &Arc<Context>,
    w: Watches,
) -> Controller<Service> {
    if w.filtered {
        tasks.spawn(departures::sweep_loop(
            w.services,
            ctx.inputs.services.clone(),
            ctx.selection.clone(),
            w.inject,
            w.relisted,
        ));
    }
    tasks.spawn(node_watch::watch_nodes(ctx.clone(), w.inputs.node_events));
    tasks.spawn(service::watch::deletions(ctx.clone(), w.deletions));
    tasks.spawn(watches::claims(ctx.clone(), w.ipam.claim_events));
    if let Some(events) = w.ipam.pool_events {
        tasks.spawn(watches::pools(ctx.clone(), events));
    }
    tasks.spawn(watches::namespaces(ctx.clone(), w.ipam.namespace_events));
    for watch in w.bgp {
        tasks.spawn(watch);
    }
    tasks.spawn(watches::endpoint_slices(ctx.clone(), w.inputs.slice_events));
    if let Some(events) = w.inputs.pod_events {
        tasks.spawn(watches::pods(ctx.clone(), events));
    }
    w.controller
}

/// Starts the optional senders (Egresses, Kubernetes metadata) with their watches; they
/// write nothing before this replica is ready to (it leads, its stores synced).
pub(super) fn senders(
    tasks: &mut JoinSet<()>,
    ctx: &Arc<Context>,
    cfg: &Config,
    egresses: Option<EgressWiring>,
    metadata: Option<MetadataWiring>,
) {
    let ready = || {
        let ctx = ctx.clone();
        async move { ctx.gate.wait_ready().await }
    };
    if let Some((egresses, watches)) = egresses {
        for watch in watches {
            tasks.spawn(watch);
        }
        let instances = ctx.fleet.clone();
        tasks.spawn(egresses.run(
            ready(),
            move || instances.instances().to_vec(),
            cfg.drift_interval,
        ));
    }
    if let Some((metadata, pod_watch)) = metadata {
        tasks.spawn(pod_watch);
        let instances = ctx.fleet.clone();
        tasks.spawn(metadata.run(ready(), move || instances.instances().to_vec()));
    }
}

/// AddressPool status is the default controller's to write: every controller reads the
/// pools, but the status also describes them against the writer's flag pools (overlaps),
/// and two writers would keep correcting each other.
pub(super) fn pool_status(tasks: &mut JoinSet<()>, shared: &Arc<Shared>, cfg: &Config) {
    if !cfg.controller.is_default() {
        return;
    }
    let shared = shared.clone();
    tasks.spawn(async move {
        let ctx = &shared.service;
        ctx.gate.wait_ready().await;
        ctx.ipam
            .pool_status_loop(&ctx.report.recorder, || {
                shared.running.load(Ordering::Relaxed)
            })
            .await;
    });
}

/// The fleet's sources besides `--loxilb-url` (discovery, BGP-peer-only discovery, LoxiURL
/// resources), and the Services re-planned when its members change.
pub(super) fn fleet_sources(
    tasks: &mut JoinSet<()>,
    ctx: &Arc<Context>,
    cfg: &Config,
    fleet: &Fleet,
) {
    let kube = &ctx.kube;
    if let Some(d) = &cfg.discovery {
        tasks.spawn(fleet::discovery::follow(
            fleet.clone(),
            kube.clone(),
            d.clone(),
            cfg.zone.clone(),
        ));
    }
    if let Some(d) = &cfg.peer_discovery {
        tasks.spawn(fleet::discovery::follow_peers(
            fleet.clone(),
            kube.clone(),
            d.clone(),
        ));
    }
    tasks.spawn(fleet::loxiurl::follow(
        fleet.clone(),
        kube.clone(),
        ctx.ipam.clone(),
        ctx.report.recorder.clone(),
        cfg.zone.clone(),
    ));
    tasks.spawn(watches::replans(ctx.clone(), fleet.replans()));
}

/// The Gateway API controller (`--gatewayAPI`), when it is on.
pub(super) fn gateway(
    tasks: &mut JoinSet<()>,
    ctx: &Arc<Context>,
    cfg: &Config,
    decided: Option<Arc<crate::gateway::Decided>>,
) {
    let (Some(class), Some(decided)) = (&cfg.gateway_class, decided) else {
        return;
    };
    tasks.spawn(crate::gateway::run(
        crate::gateway::Settings {
            controller_name: class.clone(),
            resync: cfg.drift_interval,
            group: cfg.zone.clone(),
            style: crate::gateway::rules::RuleStyle {
                mode: ctx.settings.defaults.mode,
                advertise: ctx.settings.advertise,
            },
        },
        crate::gateway::Handles {
            kube: ctx.kube.clone(),
            ipam: ctx.ipam.clone(),
            instances: ctx.fleet.clone(),
            gate: ctx.gate.clone(),
            cluster: ctx.cluster.clone(),
            metrics: ctx.report.metrics.clone(),
            recorder: ctx.report.recorder.clone(),
            decided,
        },
    ));
}
