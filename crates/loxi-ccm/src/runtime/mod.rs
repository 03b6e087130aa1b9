//! Wiring: starts the subsystems' tasks and connects them (watches and stores, the reconcile
//! loop, the fleet, the drift check, the admin server); no state of its own beyond the
//! readiness flags the admin server reads.

pub mod admin;
pub mod node_watch;
mod start_up;
mod watches;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use kube::runtime::controller::Controller;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use crate::bgp::{Bgp, Resources as BgpResources};
use crate::config::Config;
use crate::egress::{self, Egresses};
use crate::fleet::record::ConfigMapRecord;
use crate::fleet::roles::Roles;
use crate::fleet::{self, Fleet};
use crate::ipam::address_pools::Pools;
use crate::ipam::{self, Ipam};
use crate::k8s::events::EventRecorder;
use crate::k8s::view::Selection;
use crate::k8s_metadata::{self, K8sMetadata};
use crate::leader::{Gate, LeaderElector, WriteLease};
use crate::loxilb::Fleet as Instances;
use crate::metrics::Metrics;
use crate::node_init::NodeInitArgs;
use crate::service::backoff::Backoff;
use crate::service::departures::{self, Departures};
use crate::service::inputs::Inputs;
use crate::service::reconcile::{error_policy, reconcile};
use crate::service::reporter::Report;
use crate::service::rules_first::RulesFirst;
use crate::service::{self, Context};

/// What the runtime's own loops and the admin server read, beside the Service reconcile's
/// context.
pub struct Shared {
    pub service: Arc<Context>,
    /// Stores synced (standbys too: their caches are warm).
    pub synced: AtomicBool,
    /// The reconcile loop is running (for /healthz).
    pub running: AtomicBool,
    pub node_init: NodeInitArgs,
}

/// How long a shutdown waits for the reconciles under way before it cancels them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// A shutdown signal that many tasks can wait on.
#[derive(Clone)]
struct Stop(watch::Receiver<bool>);

impl Stop {
    async fn wait(mut self) {
        let _ = self.0.wait_for(|stopped| *stopped).await;
    }
}

/// Runs the controller until `shutdown` resolves. Returns an error when this replica lost
/// its leadership (the process then exits and restarts as a standby, so no two replicas
/// ever write at once), and, before anything else, when `admin_addr` cannot be listened on.
pub async fn run(
    client: kube::Client,
    cfg: Config,
    admin_addr: Option<std::net::SocketAddr>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    // First of all: without its admin address the controller does not start (no Lease is
    // taken, nothing is written).
    let admin = match admin_addr {
        Some(addr) => Some(admin::bind(addr).await?),
        None => None,
    };
    // Rule names and the restart marker carry this controller's name too, so that several
    // controllers in one cluster never take each other's rules for their own orphans.
    let cluster = crate::k8s::api::cluster_id(&client, cfg.cluster_id.as_ref())
        .await?
        .for_controller(&cfg.controller);
    info!(cluster = %cluster, controller = %cfg.controller, class = %cfg.class, "cluster identity");

    // Leader election; without it this replica always leads.
    let (elector_stop_tx, elector_stop_rx) = watch::channel(false);
    let (leader_rx, write_lease, elector) = match &cfg.leader {
        Some(lease) => {
            let elector = LeaderElector::new(client.clone(), lease.clone());
            (elector.subscribe(), elector.write_lease(), Some(elector))
        }
        None => (watch::channel(true).1, WriteLease::always(), None),
    };
    let elector_task = elector.map(|elector| {
        let stop = Stop(elector_stop_rx);
        tokio::spawn(elector.run(stop.wait()))
    });

    // Every loxilb write asks the Lease first, at the moment it is sent.
    let mut clients = Vec::new();
    for c in &cfg.loxilb {
        let client = fleet::members::gated_client(c.client.clone(), &write_lease)?;
        clients.push((c.group.clone(), client));
    }
    let instances = Instances::with_capacity(clients, cfg.loxilb_max_rules, &cluster);
    instances.set_parallel_calls(usize::from(cfg.concurrency));
    instances.set_write_window(cfg.loxilb_write_window);
    instances.set_gone_after(cfg.loxilb_gone_after);
    instances.set_append_endpoints(cfg.append_endpoints);

    // One stop signal for the reconcile loop: the caller's shutdown or a lost leadership.
    let (stop_tx, stop_rx) = watch::channel(false);
    let stop_tx = Arc::new(stop_tx);
    {
        let stop_tx = stop_tx.clone();
        tokio::spawn(async move {
            shutdown.await;
            let _ = stop_tx.send(true);
        });
    }

    crate::config::sources::warn_insecure_tls(&cfg);
    // The token: re-read or watched for the life of the process.
    crate::config::token::follow(
        &client,
        &cfg.loxilb_token_source,
        &cfg.loxilb_token,
        Stop(stop_tx.subscribe()).wait(),
    )
    .await;

    let services: Api<Service> = match &cfg.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let selection = Selection::new(&cfg.class, cfg.ccm_mode, cfg.controller.clone());
    let watched = service::watch::watch(&services, &selection).await;
    let service_store = watched.store.clone();
    let filtered = watched.filtered;
    let controller = Controller::for_stream(watched.events, service_store.clone())
        .with_config(kube::runtime::controller::Config::default().concurrency(cfg.concurrency));

    let inputs = service::inputs::watch(&client, cfg.namespace.as_deref(), cfg.multus);
    let ipam_watches = ipam::watch::watch(&client)
        .await
        .map_err(anyhow::Error::msg)?;

    // kube-loxilb's BGP resources (--bgp-crds): CRDs not installed yet are waited for.
    let (bgp_resources, bgp_watches) = if cfg.bgp.is_some() && cfg.bgp_crds {
        let (resources, watches) = BgpResources::watch(&client).await;
        (Some(resources), watches)
    } else {
        (None, Vec::new())
    };

    let (requeue_tx, requeue_rx) = mpsc::unbounded_channel::<ObjectRef<Service>>();
    let reporter = Reporter {
        controller: cfg.controller.suffixed("loxi-ccm"),
        instance: std::env::var("POD_NAME").ok(),
    };
    let metrics = Metrics::new();
    let recorder = EventRecorder::new(client.clone(), reporter, metrics.events_dropped());
    let gate = Arc::new(Gate::new(leader_rx.clone(), write_lease));
    let ipam = Arc::new(Ipam::new(
        ipam::Settings {
            pools: cfg.pools.clone(),
            secondary_pools: cfg.secondary_pools.clone(),
            unique_ip: cfg.unique_ip,
            namespace: cfg.namespace.clone(),
            zone: cfg.zone.clone(),
            controller: cfg.controller.clone(),
        },
        Pools::new(
            ipam_watches.pools_api,
            ipam_watches.pool_store,
            ipam_watches.namespace_store,
        ),
        ipam_watches.claim_store,
        ipam_watches.claims_api,
        requeue_tx.clone(),
        metrics.clone(),
    ));
    let bgp = cfg.bgp.clone().map(|settings| {
        Arc::new(Bgp::new(
            settings,
            bgp_resources,
            recorder.clone(),
            metrics.clone(),
        ))
    });
    let roles = cfg.roles.clone().map(|settings| {
        let (namespace, name) = &cfg.roles_record;
        let record =
            ConfigMapRecord::shared(client.clone(), namespace, name, fleet::roles::MANAGER);
        Arc::new(Roles::new(settings, cfg.ha_bgp_hold, record))
    });
    let fleet = Fleet::new(
        fleet::Settings {
            cluster: cluster.clone(),
            metrics: metrics.clone(),
            interval: cfg.health_interval,
            zone: cfg.zone.clone(),
            zone_instances: cfg.zone_instances,
            template: cfg.loxilb_template.clone(),
            bgp,
            roles,
            record: ConfigMapRecord::shared(
                client.clone(),
                &cfg.fleet_record.0,
                &cfg.fleet_record.1,
                fleet::record::MANAGER,
            ),
        },
        instances,
        gate.clone(),
    );
    let ctx = Arc::new(Context {
        report: Report::new(
            recorder,
            metrics,
            cfg.controller.suffixed(crate::k8s::api::FIELD_MANAGER),
        ),
        settings: service::Settings {
            defaults: cfg.defaults,
            enforce_source_ranges: cfg.enforce_source_ranges,
            source_ranges_firewall: cfg.source_ranges_firewall,
            namespace: cfg.namespace.clone(),
            advertise: cfg.bgp.is_some(),
            zone: cfg.zone.clone(),
            zone_instances: cfg.zone_instances,
            private_ip: cfg.private_ip,
        },
        selection,
        kube: client,
        cluster,
        inputs: Inputs::new(
            service_store,
            inputs.node_store,
            inputs.slice_store,
            inputs.pod_store,
        ),
        ipam,
        fleet: fleet.instances(),
        gate,
        backoff: Backoff::default(),
        room_requeue: service::context::room_requeue(requeue_tx.clone()),
        requeue: requeue_tx,
        departures: Departures::new(filtered, watched.inject.clone(), watched.relisted.clone()),
        teardown: RulesFirst::new(usize::from(cfg.concurrency)),
        placement: fleet.placement(),
    });
    let shared = Arc::new(Shared {
        service: ctx.clone(),
        synced: false.into(),
        running: true.into(),
        node_init: cfg.node_init.clone(),
    });
    // The loxilbs' workers, the health tick and the role decisions: they stop with this
    // function.
    // kube-loxilb's Egress resource (--egress): watched, and replayed with every loxilb's
    // rules after it restarted.
    let egresses = if cfg.egress {
        Some(
            Egresses::watch(
                &ctx.kube,
                cfg.namespace.as_deref(),
                &ctx.cluster,
                ctx.report.recorder.clone(),
                ctx.report.metrics.clone(),
            )
            .await,
        )
    } else {
        None
    };
    // kube-loxilb's --enableK8sMetadata: off, not even its Pod watch exists.
    let metadata = cfg.k8s_metadata.then(|| {
        K8sMetadata::watch(
            &ctx.kube,
            cfg.namespace.as_deref(),
            ctx.inputs.services.clone(),
            ctx.inputs.nodes.clone(),
            ctx.selection.clone(),
            ctx.report.metrics.clone(),
        )
    });
    let replay = service::drift::replay(ctx.clone());
    let replay: fleet::workers::Replay = match &egresses {
        Some((egresses, _)) => egress::with_replay(egresses.clone(), replay),
        None => replay,
    };
    let replay: fleet::workers::Replay = match &metadata {
        Some((metadata, _)) => k8s_metadata::with_replay(metadata.clone(), replay),
        None => replay,
    };
    // The Gateways' rules go with every loxilb's replay too (--gatewayAPI).
    let gateway_decided = cfg.gateway_class.as_ref().map(|_| {
        crate::gateway::Decided::new(
            crate::gateway::rule_owner(&ctx.cluster),
            cfg.zone.clone(),
            ctx.report.metrics.clone(),
        )
    });
    let replay: fleet::workers::Replay = match &gateway_decided {
        Some(decided) => crate::gateway::with_replay(decided.clone(), replay),
        None => replay,
    };
    let _fleet = fleet.start(replay);

    // Everything below ends with this function (dropping the set aborts its tasks): a
    // stopped controller must not keep probing, replaying or repairing from frozen stores.
    let mut tasks = tokio::task::JoinSet::new();
    if let Some(listener) = admin {
        let shared = shared.clone();
        tasks.spawn(async move {
            if let Err(e) = admin::serve(listener, shared).await {
                warn!(error = %e, "admin server stopped");
            }
        });
    }
    if filtered {
        tasks.spawn(departures::sweep_loop(
            services,
            ctx.inputs.services.clone(),
            ctx.selection.clone(),
            watched.inject,
            watched.relisted,
        ));
    }
    tasks.spawn(node_watch::watch_nodes(ctx.clone(), inputs.node_events));
    tasks.spawn(service::watch::deletions(ctx.clone(), watched.deletions));
    tasks.spawn(watches::claims(ctx.clone(), ipam_watches.claim_events));
    if let Some(events) = ipam_watches.pool_events {
        tasks.spawn(watches::pools(ctx.clone(), events));
    }
    tasks.spawn(watches::namespaces(
        ctx.clone(),
        ipam_watches.namespace_events,
    ));
    for watch in bgp_watches {
        tasks.spawn(watch);
    }
    if let Some((egresses, watches)) = egresses {
        for watch in watches {
            tasks.spawn(watch);
        }
        let ready = {
            let ctx = ctx.clone();
            async move { ctx.gate.wait_ready().await }
        };
        let instances = ctx.fleet.clone();
        tasks.spawn(egresses.run(
            ready,
            move || instances.instances().to_vec(),
            cfg.drift_interval,
        ));
    }
    if let Some((metadata, pod_watch)) = metadata {
        tasks.spawn(pod_watch);
        let ready = {
            let ctx = ctx.clone();
            async move { ctx.gate.wait_ready().await }
        };
        let instances = ctx.fleet.clone();
        tasks.spawn(metadata.run(ready, move || instances.instances().to_vec()));
    }
    // AddressPool status is the default controller's to write: every controller reads the
    // pools, but the status also describes them against the writer's flag pools (overlaps),
    // and two writers would keep correcting each other.
    if cfg.controller.is_default() {
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
    tasks.spawn(watches::endpoint_slices(ctx.clone(), inputs.slice_events));
    if let Some(events) = inputs.pod_events {
        tasks.spawn(watches::pods(ctx.clone(), events));
    }
    tasks.spawn(start_up::start_up(shared.clone(), Stop(stop_rx.clone())));
    // Set once leadership is lost.
    let (lost_tx, mut lost) = watch::channel(false);
    tasks.spawn(watches::leadership(ctx.clone(), stop_tx.clone(), lost_tx));
    // The fleet's sources besides --loxilb-url.
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
    if let (Some(class), Some(decided)) = (&cfg.gateway_class, gateway_decided) {
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
    tasks.spawn(service::drift::drift_loop(ctx.clone(), cfg.drift_interval));
    let requeues = service::watch::channel_stream(requeue_rx);
    let reconciling = controller
        .reconcile_on(requeues)
        .graceful_shutdown_on(Stop(stop_rx.clone()).wait())
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "controller event");
            }
        });
    // A shutdown lets the reconciles under way finish, for SHUTDOWN_GRACE at most: a
    // reconcile can wait far longer (a loxilb that does not answer, an API server that
    // throttles or conflicts), and a process that ignores SIGTERM is killed by the kubelet
    // anyway. Cancelling one is safe: every pass is written to survive a kill -9. A lost
    // Lease cancels them at once (dropped at their next await), since another replica may
    // already be writing. A shutdown before the stores synced ends at once: kube-runtime's
    // graceful shutdown would wait for a store that nothing polls any more, and no reconcile
    // has run yet.
    let shutdown_bounded = {
        let shared = shared.clone();
        async move {
            Stop(stop_rx).wait().await;
            if shared.synced.load(Ordering::Relaxed) {
                tokio::time::sleep(SHUTDOWN_GRACE).await;
                warn!(
                    grace = ?SHUTDOWN_GRACE,
                    "reconciles still under way at shutdown: cancelled"
                );
            }
        }
    };
    tokio::select! {
        () = reconciling => {}
        Ok(_) = lost.wait_for(|lost| *lost) => {
            warn!("leadership lost: reconciles under way cancelled");
        }
        () = shutdown_bounded => {}
    }
    shared.running.store(false, Ordering::Relaxed);
    // The last Events (e.g. a RulesDeleted of a Service that left our class) are still on
    // their way.
    if !ctx.report.recorder.flush(Duration::from_secs(2)).await {
        warn!("stopping with Events not yet published");
    }
    // Release the Lease only once no reconcile runs any more, so the next leader never
    // overlaps with this one.
    let _ = elector_stop_tx.send(true);
    if let Some(task) = elector_task {
        let _ = tokio::time::timeout(Duration::from_secs(3), task).await;
    }
    info!("controller stopped");
    if *lost.borrow() {
        anyhow::bail!("lost leadership: exiting so that a restart comes back as a standby");
    }
    Ok(())
}
