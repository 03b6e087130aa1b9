//! Wiring: starts the subsystems' tasks and connects them (watches and stores, the reconcile
//! loop, the fleet, the drift check, the admin server); no state of its own beyond the
//! readiness flags the admin server reads.

pub mod admin;
mod loops;
pub mod node_watch;
mod watches;

/// kube-loxilb's `LoxiURL` resource, where crates/loxi-ccm/tests/fleet.rs imports it from;
/// the follower is the fleet's (`crate::fleet::loxiurl`).
pub mod loxiurl {
    pub use crate::config::sources::{LoxiURL, LoxiURLSpec};
}

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Controller;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, ObjectRef, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use loxilb_client::LoxilbClient;
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use crate::bgp::{Bgp, Resources as BgpResources};
use crate::config::{Config, TokenSource};
use crate::fleet::record::ConfigMapRecord;
use crate::fleet::roles::Roles;
use crate::fleet::{self, Fleet};
use crate::ipam::address_pools::{AddressPool, Pools};
use crate::ipam::claims::AddressClaim;
use crate::ipam::{self, Ipam};
use crate::k8s::events::EventRecorder;
use crate::k8s::view::Selection;
use crate::leader::{Gate, LeaderElector, WriteLease};
use crate::loxilb::Fleet as Instances;
use crate::metrics::Metrics;
use crate::node_init::NodeInitArgs;
use crate::service::departures::{self, Departures, Injected, Relisted};
use crate::service::inputs::Inputs;
use crate::service::reconcile::{Backoff, error_policy, reconcile};
use crate::service::report::Report;
use crate::service::teardown::RulesFirst;
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
        let lease = write_lease.clone();
        clients.push((
            c.group.clone(),
            LoxilbClient::new(c.client.clone())?.with_write_gate(Arc::new(move || lease.holds())),
        ));
    }
    let instances = Instances::with_capacity(clients, cfg.loxilb_max_rules, &cluster);
    instances.set_parallel_calls(usize::from(cfg.concurrency));

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

    if cfg.loxilb_insecure_skip_tls_verify {
        for c in cfg
            .loxilb
            .iter()
            .filter(|c| c.client.url.starts_with("https://"))
        {
            warn!(
                url = %c.client.url,
                "--loxilb-insecure-skip-tls-verify: loxilb's certificate is NOT checked; anybody \
                 in the path can impersonate loxilb and read the token. Use --loxilb-ca-file"
            );
        }
        if cfg
            .discovery
            .iter()
            .chain(&cfg.peer_discovery)
            .any(|d| d.https)
        {
            warn!(
                "--loxilb-insecure-skip-tls-verify: the certificates of the loxilbs found in the \
                 cluster are NOT checked; anybody in the path can impersonate loxilb and read the \
                 token. Use --loxilb-ca-file"
            );
        }
    }
    // The token: re-read or watched for the life of the process (crate::config::token).
    match &cfg.loxilb_token_source {
        TokenSource::Fixed => {}
        TokenSource::File(path) => {
            tokio::spawn(crate::config::token::reread_file(
                path.clone(),
                cfg.loxilb_token.clone(),
                Stop(stop_tx.subscribe()).wait(),
            ));
        }
        TokenSource::Secret(secret) => {
            match crate::config::token::read_secret(&client, secret).await {
                Ok(value) => {
                    cfg.loxilb_token.set(value.as_deref());
                }
                Err(e) => warn!(error = %e, "loxilb token not read yet; watching for it"),
            }
            tokio::spawn(crate::config::token::watch_secret(
                client.clone(),
                secret.clone(),
                cfg.loxilb_token.clone(),
                Stop(stop_tx.subscribe()).wait(),
            ));
        }
    }

    let services: Api<Service> = match &cfg.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    // Our own reflector (rather than Controller::new's) so that the cache keeps trimmed
    // objects (crate::k8s::trim).
    let selection = Selection::new(&cfg.class, cfg.ccm_mode, cfg.controller.clone());
    let (service_store, service_writer) = reflector::store::<Service>();
    // Only Services of type LoadBalancer where the API server can filter them (crate::
    // departures); the others would cost memory and CPU for nothing.
    let filtered = departures::type_selector_supported(&services).await;
    let (inject_tx, inject_rx) = mpsc::unbounded_channel::<Injected>();
    let (deletions_tx, deletions_rx) = mpsc::unbounded_channel::<Deletion>();
    let relisted = Relisted::default();
    let service_events = {
        let selection = selection.clone();
        let list = if filtered {
            crate::k8s::trim::list_config().fields(departures::TYPE_SELECTOR)
        } else {
            crate::k8s::trim::list_config()
        };
        let watched = watcher(services.clone(), list)
            .default_backoff()
            .modify({
                let selection = selection.clone();
                move |svc| crate::k8s::trim::service(svc, &selection)
            })
            .map_ok(move |event| {
                if filtered {
                    departures::on_watch_event(event, &selection)
                } else {
                    event
                }
            });
        // Placeholders enter and leave through the stream, checked against the store right
        // before it applies them.
        let reader = service_store.clone();
        let injected = tokio_stream_from(inject_rx).filter_map(move |event| {
            let current = reader.get(&event.key());
            let admitted = departures::admit(&event, current.as_deref());
            futures::future::ready(admitted.then(|| Ok(departures::into_event(event))))
        });
        let relisted = relisted.clone();
        let deletion_tx = deletions_tx;
        let events = reflector(service_writer, futures::stream::select(watched, injected))
            .inspect_ok(move |event| {
                if filtered && matches!(event, watcher::Event::InitDone) {
                    relisted.notify();
                }
                // Deletions go to the early rule removal (crate::service::teardown), which
                // must not wait for this Service's turn in the reconcile queue.
                match event {
                    watcher::Event::Apply(svc) | watcher::Event::InitApply(svc)
                        if svc.metadata.deletion_timestamp.is_some() =>
                    {
                        let _ = deletion_tx.send(Deletion::Deleting(ObjectRef::from_obj(svc)));
                    }
                    watcher::Event::Delete(svc) => {
                        if let Some(uid) = &svc.metadata.uid {
                            let _ = deletion_tx.send(Deletion::Gone(uid.clone()));
                        }
                    }
                    _ => {}
                }
            });
        crate::k8s::triggers::applied_objects(events)
    };
    let controller = Controller::for_stream(service_events, service_store.clone())
        .with_config(kube::runtime::controller::Config::default().concurrency(cfg.concurrency));

    let (node_store, node_writer) = reflector::store::<Node>();
    // Whole watch events, not touched objects: a deletion must be told from an update, and a
    // listing from single changes (crate::runtime::node_watch).
    let node_events = reflector(
        node_writer,
        watcher(
            Api::<Node>::all(client.clone()),
            crate::k8s::trim::list_config(),
        )
        .modify(crate::k8s::trim::node),
    )
    .default_backoff();

    // EndpointSlices: backends for externalTrafficPolicy Local and pod-network mode.
    let slices_api: Api<EndpointSlice> = match &cfg.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let (slice_store, slice_writer) = reflector::store::<EndpointSlice>();
    let slice_events = reflector(
        slice_writer,
        watcher(slices_api, crate::k8s::trim::list_config())
            .modify(crate::k8s::trim::endpoint_slice),
    )
    .default_backoff()
    .touched_objects();

    // Pod metadata only (annotations), and only when Multus addresses are wanted.
    let (pod_store, pod_events) = if cfg.multus {
        // An Api over PartialObjectMeta makes metadata-only requests.
        let pods: Api<PartialObjectMeta<Pod>> = match &cfg.namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let (store, writer) = reflector::store::<PartialObjectMeta<Pod>>();
        let events = reflector(writer, watcher(pods, crate::k8s::trim::list_config()))
            .default_backoff()
            .touched_objects();
        (Some(store), Some(events))
    } else {
        (None, None)
    };

    let claims_api: Api<AddressClaim> = Api::all(client.clone());
    // Without the CRD nothing can be allocated safely: say so at once instead of waiting.
    if let Err(e) = claims_api
        .list_metadata(&kube::api::ListParams::default().limit(1))
        .await
    {
        anyhow::bail!(
            "cannot list AddressClaims ({e}); install the CRD (kubectl apply -f deploy/05-crd-addressclaims.yaml) and grant the RBAC in deploy/"
        );
    }
    let (claim_store, claim_writer) = reflector::store::<AddressClaim>();
    let claim_events = reflector(
        claim_writer,
        watcher(claims_api.clone(), crate::k8s::trim::list_config())
            .modify(crate::k8s::trim::meta::<AddressClaim>),
    )
    .default_backoff();

    // AddressPool resources are optional: without their CRD (an upgrade that did not apply
    // deploy/06-crd-addresspools.yaml) the pools from flags are used alone.
    let pools_api: Api<AddressPool> = Api::all(client.clone());
    let (pool_store, pool_events) = match pools_api
        .list_metadata(&kube::api::ListParams::default().limit(1))
        .await
    {
        Ok(_) => {
            let (store, writer) = reflector::store::<AddressPool>();
            let events = reflector(
                writer,
                watcher(pools_api.clone(), crate::k8s::trim::list_config()),
            )
            .default_backoff();
            (Some(store), Some(events))
        }
        Err(e) => {
            warn!(error = %e, "AddressPool resources unavailable: using the pools from flags only (kubectl apply -f deploy/06-crd-addresspools.yaml and the RBAC in deploy/)");
            (None, None)
        }
    };
    // Namespace labels (metadata only) decide which Services a pool's namespaceSelector
    // admits.
    let namespaces_api: Api<PartialObjectMeta<Namespace>> = Api::all(client.clone());
    let (namespace_store, namespace_writer) = reflector::store::<PartialObjectMeta<Namespace>>();
    let namespace_events = reflector(
        namespace_writer,
        watcher(namespaces_api, crate::k8s::trim::list_config())
            .modify(crate::k8s::trim::meta::<PartialObjectMeta<Namespace>>),
    )
    .default_backoff();

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
        Pools::new(pools_api, pool_store, namespace_store),
        claim_store,
        claims_api,
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
            namespace: cfg.namespace.clone(),
            advertise: cfg.bgp.is_some(),
            zone: cfg.zone.clone(),
            zone_instances: cfg.zone_instances,
        },
        selection,
        kube: client,
        cluster,
        inputs: Inputs::new(service_store, node_store, slice_store, pod_store),
        ipam,
        fleet: fleet.instances(),
        gate,
        backoff: Backoff::default(),
        room_requeue: service::context::room_requeue(requeue_tx.clone()),
        requeue: requeue_tx,
        departures: Departures::new(filtered, inject_tx.clone(), relisted.clone()),
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
    let _fleet = fleet.start(service::drift::replay(ctx.clone()));

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
            inject_tx,
            relisted,
        ));
    }
    tasks.spawn(node_watch::watch_nodes(ctx.clone(), node_events));
    tasks.spawn(deletions(ctx.clone(), deletions_rx));
    tasks.spawn(watches::claims(ctx.clone(), claim_events));
    if let Some(events) = pool_events {
        tasks.spawn(watches::pools(ctx.clone(), events));
    }
    tasks.spawn(watches::namespaces(ctx.clone(), namespace_events));
    for watch in bgp_watches {
        tasks.spawn(watch);
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
    tasks.spawn(watches::endpoint_slices(ctx.clone(), slice_events));
    if let Some(events) = pod_events {
        tasks.spawn(watches::pods(ctx.clone(), events));
    }
    tasks.spawn(loops::start_up(shared.clone(), Stop(stop_rx.clone())));
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
    tasks.spawn(service::drift::drift_loop(ctx.clone(), cfg.drift_interval));
    let requeues = tokio_stream_from(requeue_rx);
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

/// What the Service watch tells the early rule removal.
enum Deletion {
    /// The Service (in the store) shows a deletionTimestamp.
    Deleting(ObjectRef<Service>),
    /// The Service with this uid is gone.
    Gone(String),
}

/// Hands the Service watch's deletions to `crate::service::teardown`.
async fn deletions(ctx: Arc<Context>, mut rx: mpsc::UnboundedReceiver<Deletion>) {
    while let Some(deletion) = rx.recv().await {
        match deletion {
            Deletion::Deleting(svc_ref) => {
                if let Some(svc) = ctx.inputs.services.get(&svc_ref) {
                    ctx.teardown.deleting(&ctx, &svc);
                }
            }
            Deletion::Gone(uid) => ctx.teardown.gone(&uid),
        }
    }
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: mpsc::UnboundedReceiver<T>,
) -> impl futures::Stream<Item = T> + Send {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
