//! Wiring: watches and stores, the reconcile loop, loxilb health and drift checks.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Controller;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, ObjectRef, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use loxi_domain::{Allocator, ClusterId};
use loxilb_client::LoxilbClient;
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use crate::claims::AddressClaim;
use crate::config::Config;
use crate::context::Context;
use crate::departures::{self, Departures, Injected};
use crate::events::EventRecorder;
use crate::fleet::{Fleet, ServiceRules};
use crate::kube_view::{Selection, owner_key, published_addresses};
use crate::leader::{LeaderElector, WriteLease};
use crate::metrics::Metrics;
use crate::reconcile::{Desired, desired_rules, error_policy, reconcile};

/// Reads the cluster identity: configured, or from the kube-system namespace UID.
async fn cluster_id(client: &kube::Client, cfg: &Config) -> anyhow::Result<ClusterId> {
    if let Some(id) = &cfg.cluster_id {
        return Ok(id.clone());
    }
    let ns: Namespace = Api::all(client.clone())
        .get("kube-system")
        .await
        .context("reading namespace kube-system for the cluster id (or pass --cluster-id)")?;
    Ok(ClusterId::from_uid(
        ns.metadata.uid.as_deref().unwrap_or_default(),
    ))
}

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
/// ever write at once).
pub async fn run(
    client: kube::Client,
    cfg: Config,
    admin_addr: Option<std::net::SocketAddr>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    let cluster = cluster_id(&client, &cfg).await?;
    info!(cluster = %cluster, "cluster identity");

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
        clients
            .push(LoxilbClient::new(c.clone())?.with_write_gate(Arc::new(move || lease.holds())));
    }
    let fleet = Fleet::with_capacity(clients, cfg.loxilb_max_rules, &cluster);
    fleet.set_parallel_calls(usize::from(cfg.concurrency));

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

    let lost_leadership = Arc::new(AtomicBool::new(false));

    let services: Api<Service> = match &cfg.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    // Our own reflector (rather than Controller::new's) so that the cache keeps trimmed
    // objects (crate::trim).
    let selection = Selection {
        class: cfg.class.clone(),
        ccm_mode: cfg.ccm_mode,
    };
    let (service_store, service_writer) = reflector::store::<Service>();
    // Only Services of type LoadBalancer where the API server can filter them (crate::
    // departures); the others would cost memory and CPU for nothing.
    let filtered = departures::type_selector_supported(&services).await;
    let (inject_tx, inject_rx) = mpsc::unbounded_channel::<Injected>();
    let relisted = Arc::new(tokio::sync::Notify::new());
    let service_events = {
        let selection = selection.clone();
        let list = if filtered {
            crate::trim::list_config().fields(departures::TYPE_SELECTOR)
        } else {
            crate::trim::list_config()
        };
        let watched = watcher(services.clone(), list)
            .default_backoff()
            .modify({
                let selection = selection.clone();
                move |svc| crate::trim::service(svc, &selection)
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
        reflector(service_writer, futures::stream::select(watched, injected))
            .inspect_ok(move |event| {
                if filtered && matches!(event, watcher::Event::InitDone) {
                    relisted.notify_one();
                }
            })
            .applied_objects()
    };
    let controller = Controller::for_stream(service_events, service_store.clone())
        .with_config(kube::runtime::controller::Config::default().concurrency(cfg.concurrency));

    let (node_store, node_writer) = reflector::store::<Node>();
    // Whole watch events, not touched objects: a deletion must be told from an update, and a
    // listing from single changes (crate::node_watch).
    let node_events = reflector(
        node_writer,
        watcher(Api::<Node>::all(client.clone()), crate::trim::list_config())
            .modify(crate::trim::node),
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
        watcher(slices_api, crate::trim::list_config()).modify(crate::trim::endpoint_slice),
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
        let events = reflector(writer, watcher(pods, crate::trim::list_config()))
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
        watcher(claims_api.clone(), crate::trim::list_config())
            .modify(crate::trim::meta::<AddressClaim>),
    )
    .default_backoff();

    // AddressPool resources are optional: without their CRD (an upgrade that did not apply
    // deploy/06-crd-addresspools.yaml) the pools from flags are used alone.
    let pools_api: Api<crate::pools::AddressPool> = Api::all(client.clone());
    let (pool_store, pool_events) = match pools_api
        .list_metadata(&kube::api::ListParams::default().limit(1))
        .await
    {
        Ok(_) => {
            let (store, writer) = reflector::store::<crate::pools::AddressPool>();
            let events = reflector(
                writer,
                watcher(pools_api.clone(), crate::trim::list_config()),
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
        watcher(namespaces_api, crate::trim::list_config())
            .modify(crate::trim::meta::<PartialObjectMeta<Namespace>>),
    )
    .default_backoff();

    let (requeue_tx, requeue_rx) = mpsc::unbounded_channel::<ObjectRef<Service>>();
    let (ready_tx, ready_rx) = watch::channel(false);
    let reporter = Reporter {
        controller: "loxi-ccm".into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let metrics = Metrics::new();
    let ctx = Arc::new(Context {
        recorder: EventRecorder::new(client.clone(), reporter, metrics.events_dropped()),
        selection,
        ipam: Mutex::new(Allocator::new(cfg.pools.clone())),
        pools: crate::pools::Pools::new(
            pools_api,
            pool_store,
            namespace_store,
            &cfg.pools,
            &cfg.secondary_pools,
        ),
        client,
        cluster,
        services: service_store,
        nodes: node_store,
        endpoint_slices: slice_store,
        pods: pod_store,
        claims: claim_store,
        claims_api,
        fleet,
        metrics,
        synced: false.into(),
        ready: false.into(),
        ready_rx,
        leader_rx: leader_rx.clone(),
        write_lease,
        running: true.into(),
        failures: Mutex::default(),
        waiting_for_address: Mutex::default(),
        superseded: Mutex::default(),
        node_views: Mutex::default(),
        node_generation: 0.into(),
        endpoints_dropped: Mutex::default(),
        requeue: requeue_tx,
        departures: Departures::new(filtered, inject_tx.clone(), relisted.clone()),
        cfg,
    });

    // Everything below ends with this function (dropping the set aborts its tasks): a
    // stopped controller must not keep probing, replaying or repairing from frozen stores.
    let mut tasks = tokio::task::JoinSet::new();
    if let Some(addr) = admin_addr {
        let c = ctx.clone();
        tasks.spawn(async move {
            if let Err(e) = crate::admin::serve(addr, c).await {
                warn!(error = %e, "admin server stopped");
            }
        });
    }
    if filtered {
        tasks.spawn(departures::sweep_loop(
            services,
            ctx.services.clone(),
            ctx.selection.clone(),
            inject_tx,
            relisted,
        ));
    }
    tasks.spawn(crate::node_watch::watch_nodes(ctx.clone(), node_events));
    tasks.spawn(watch_claims(ctx.clone(), claim_events));
    if let Some(events) = pool_events {
        tasks.spawn(crate::pools::watch_pools(ctx.clone(), events));
    }
    tasks.spawn(crate::pools::watch_namespaces(
        ctx.clone(),
        namespace_events,
    ));
    tasks.spawn(crate::pools::status_loop(ctx.clone()));
    tasks.spawn(watch_endpoint_slices(ctx.clone(), slice_events));
    if let Some(events) = pod_events {
        // Keeps the pod store current; a pod's network-status arrives after its EndpointSlice
        // entry, so re-plan Services when pods change (only served multus Services care).
        let c = ctx.clone();
        tasks.spawn(async move {
            let mut events = std::pin::pin!(events);
            while let Some(event) = events.next().await {
                if event.is_ok() && c.ready.load(Ordering::Relaxed) {
                    for svc in c.services.state() {
                        let multus = svc
                            .metadata
                            .annotations
                            .as_ref()
                            .is_some_and(|a| a.contains_key("loxilb.io/multus-nets"));
                        if multus && c.selection.serves(&svc) {
                            let _ = c.requeue.send(ObjectRef::from_obj(&*svc));
                        }
                    }
                }
            }
        });
    }
    tasks.spawn(start_up(ctx.clone(), ready_tx, Stop(stop_rx.clone())));
    let lost_notify = Arc::new(tokio::sync::Notify::new());
    tasks.spawn(watch_leadership(
        ctx.clone(),
        stop_tx.clone(),
        lost_leadership.clone(),
        lost_notify.clone(),
    ));
    tasks.spawn(health_loop(ctx.clone()));
    tasks.spawn(drift_loop(ctx.clone()));

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
    // A shutdown lets the reconciles under way finish; a lost Lease cancels them at once
    // (dropped at their next await), since another replica may already be writing. A
    // shutdown before the stores synced ends at once: kube-runtime's graceful shutdown
    // would wait for a store that nothing polls any more, and no reconcile has run yet.
    let stopped_before_sync = {
        let ctx = ctx.clone();
        async move {
            Stop(stop_rx).wait().await;
            if ctx.synced.load(Ordering::Relaxed) {
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = reconciling => {}
        () = lost_notify.notified() => {
            warn!("leadership lost: reconciles under way cancelled");
        }
        () = stopped_before_sync => {}
    }
    ctx.running.store(false, Ordering::Relaxed);
    // The last Events (a deletion's RulesDeleted) are still on their way.
    if !ctx.recorder.flush(Duration::from_secs(2)).await {
        warn!("stopping with Events not yet published");
    }
    // Release the Lease only once no reconcile runs any more, so the next leader never
    // overlaps with this one.
    let _ = elector_stop_tx.send(true);
    if let Some(task) = elector_task {
        let _ = tokio::time::timeout(Duration::from_secs(3), task).await;
    }
    info!("controller stopped");
    if lost_leadership.load(Ordering::Relaxed) {
        anyhow::bail!("lost leadership: exiting so that a restart comes back as a standby");
    }
    Ok(())
}

/// Publishes the leader state as a metric, and stops the controller when leadership is lost.
async fn watch_leadership(
    ctx: Arc<Context>,
    stop: Arc<watch::Sender<bool>>,
    lost: Arc<AtomicBool>,
    lost_notify: Arc<tokio::sync::Notify>,
) {
    let mut rx = ctx.leader_rx.clone();
    let mut led = false;
    loop {
        let leading = *rx.borrow_and_update();
        ctx.metrics.set_leader(leading);
        if leading && !led {
            info!("leading: this replica now writes");
        }
        if led && !leading {
            if *stop.borrow() {
                return; // released on our own shutdown
            }
            warn!("leadership lost: stopping");
            lost.store(true, Ordering::Relaxed);
            lost_notify.notify_one();
            let _ = stop.send(true);
            return;
        }
        led = leading;
        if rx.changed().await.is_err() {
            return;
        }
    }
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: mpsc::UnboundedReceiver<T>,
) -> impl futures::Stream<Item = T> + Send {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Waits for both stores, then rebuilds the address index from what Services show, before
/// anything is allocated (docs/architecture.md#invariants).
async fn start_up(ctx: Arc<Context>, ready_tx: watch::Sender<bool>, stop: Stop) {
    if wait_store(&ctx.services).await.is_err() || wait_store(&ctx.nodes).await.is_err() {
        warn!("store writer dropped before sync");
        return;
    }
    ctx.synced.store(true, Ordering::Relaxed);
    // Standbys stop here with warm stores; the index is rebuilt by whoever leads, from the
    // cluster as it is at that moment.
    let mut leader = ctx.leader_rx.clone();
    if leader.wait_for(|l| *l).await.is_err() {
        return;
    }
    if wait_store(&ctx.endpoint_slices).await.is_err() || wait_store(&ctx.claims).await.is_err() {
        warn!("claim store writer dropped before sync");
        return;
    }
    if wait_store(&ctx.pools.namespaces).await.is_err() {
        warn!("namespace store writer dropped before sync");
        return;
    }
    if let Some(pools) = &ctx.pools.store
        && wait_store(pools).await.is_err()
    {
        warn!("address pool store writer dropped before sync");
        return;
    }
    {
        let mut ipam = ctx.ipam.lock().expect("ipam lock");
        // The pools (flags and AddressPool resources), under the allocator lock so that a
        // pool event cannot slip in between (crate::pools::refresh takes the same lock).
        // Invalid pools are logged by `install` (once: the pool watch may have installed
        // the same set already).
        let set = ctx.pools.compute(&ctx.cfg.pools, &ctx.cfg.secondary_pools);
        *ipam = Allocator::new(set.pools());
        ctx.pools.install(set);
        // The durable record first: every claim and every owner it lists, whoever made it.
        for claim in ctx.claims.state() {
            let Some(ip) = claim.ip() else { continue };
            for owner in claim.owners() {
                if let Err(e) = ipam.assign_shared(ip, &owner.key(), owner.sharing()) {
                    warn!(error = %e, owner = %owner.key(), "two incompatible owners recorded for one address");
                }
            }
        }
        // Then addresses Services show without a claim yet (first start after kube-loxilb,
        // loxi-ccm or an older version): held here until their reconcile claims them. In
        // shared mode Services showing one address on different ports (kube-loxilb's
        // sharing) hold it together.
        for svc in ctx.services.state() {
            if !ctx.selection.serves(&svc) && ctx.selection.our_finalizers(&svc).is_empty() {
                continue;
            }
            let key = owner_key(&svc);
            let sharing = match crate::reconcile::service_sharing(&svc) {
                Ok(s) if !ctx.cfg.unique_ip => s,
                _ => loxi_domain::ipam::Sharing::Exclusive,
            };
            for ip in published_addresses(&svc) {
                if ipam.holds(&ip, &key) {
                    continue;
                }
                if let Err(e) = ipam.assign_shared(ip, &key, sharing.clone()) {
                    warn!(service = %key, error = %e, "address shown by a Service is claimed by another");
                }
            }
        }
        info!(
            addresses = ipam.used(),
            claims = ctx.claims.len(),
            "address index rebuilt"
        );
    }
    crate::reconcile::update_pool_metrics(&ctx);
    ctx.ready.store(true, Ordering::Relaxed);
    let _ = ready_tx.send(true);
    // The cloud node controller writes too: leader only.
    let node_init = ctx.cfg.node_init.clone();
    let client = ctx.client.clone();
    tokio::spawn(async move {
        if let Err(e) = crate::node_init::run(client, node_init, stop.wait()).await {
            warn!(error = %e, "node initialization stopped");
        }
    });
}

/// Re-plans the one Service an EndpointSlice belongs to (named by its
/// `kubernetes.io/service-name` label), and only if this controller serves it.
async fn watch_endpoint_slices(
    ctx: Arc<Context>,
    events: impl futures::Stream<Item = Result<EndpointSlice, watcher::Error>>,
) {
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        let slice = match event {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "endpointslice watch error");
                continue;
            }
        };
        let Some(service) = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(crate::kube_view::SERVICE_NAME_LABEL))
        else {
            continue;
        };
        let ns = slice.metadata.namespace.clone().unwrap_or_default();
        let svc_ref = ObjectRef::<Service>::new(service).within(&ns);
        if ctx.ready.load(Ordering::Relaxed)
            && ctx
                .services
                .get(&svc_ref)
                .is_some_and(|s| ctx.selection.serves(&s))
        {
            let _ = ctx.requeue.send(svc_ref);
        }
    }
}

/// Keeps the address index in step with claims made or removed elsewhere (another replica,
/// another process, an operator's reservation).
async fn watch_claims(
    ctx: Arc<Context>,
    events: impl futures::Stream<Item = Result<watcher::Event<AddressClaim>, watcher::Error>>,
) {
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        // Before start-up the index is rebuilt from the store as a whole.
        let ready = ctx.ready.load(Ordering::Relaxed);
        match event {
            Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c)) if ready => {
                // Owners recorded elsewhere enter the index (refused when they clash with a
                // pick of this replica whose claim write is in flight: that write settles
                // it). Owners the index has and the claim lacks are left alone for the same
                // reason; an owner leaving is taken out of the index by whoever removed it.
                if let (Some(ip), Ok(mut ipam)) = (c.ip(), ctx.ipam.lock()) {
                    for owner in c.owners() {
                        let _ = ipam.assign_shared(ip, &owner.key(), owner.sharing());
                    }
                }
            }
            Ok(watcher::Event::Delete(c)) if ready => {
                // Only the owners the deleted claim listed let go: a fresh pick of the same
                // address by another Service stays.
                let mut freed = false;
                if let (Some(ip), Ok(mut ipam)) = (c.ip(), ctx.ipam.lock()) {
                    for owner in c.owners() {
                        freed |= ipam.release_from(&ip, &owner.key());
                    }
                }
                if freed {
                    crate::reconcile::update_pool_metrics(&ctx);
                    ctx.wake_address_waiters();
                }
            }
            Ok(_) => {}
            Err(e) => warn!(error = %e, "address claim watch error"),
        }
    }
}

/// Deletes retained claims whose time is up, and takes Services that no longer exist off
/// their claims (deleting a claim whose owners are all gone). Only owners in the namespaces
/// this replica watches, and only once their rules are gone: the drift check that precedes
/// this removed them.
async fn collect_claims(ctx: &Context) {
    let now = k8s_openapi::jiff::Timestamp::now();
    let in_scope = |o: &crate::claims::ClaimedBy| {
        ctx.cfg
            .namespace
            .as_deref()
            .is_none_or(|ns| ns == o.namespace)
    };
    for claim in ctx.claims.state() {
        let owners = claim.owners();
        let orphans: Vec<&crate::claims::ClaimedBy> = owners
            .iter()
            .copied()
            .filter(|o| {
                in_scope(o)
                    && !o.uid.is_empty()
                    && ctx
                        .services
                        .get(&ObjectRef::new(&o.name).within(&o.namespace))
                        .is_none_or(|s| s.metadata.uid.as_deref() != Some(o.uid.as_str()))
            })
            .collect();
        let orphans = confirm_gone(ctx, orphans).await;
        let expired = claim.expired(now) && in_scope(&claim.spec.service);
        if expired || orphans.len() == owners.len() {
            info!(address = %claim.spec.address, owner = %claim.owner_key(), expired, "releasing claim");
            if let Err(e) = crate::claims::release(&ctx.claims_api, &claim).await {
                warn!(error = %e, "could not release claim");
            }
            continue;
        }
        for o in orphans {
            info!(address = %claim.spec.address, owner = %o.key(), "taking a deleted Service off a shared address");
            match crate::claims::leave(&ctx.claims_api, &claim, &o.namespace, &o.name).await {
                Ok(()) => {
                    if let (Some(ip), Ok(mut ipam)) = (claim.ip(), ctx.ipam.lock()) {
                        ipam.release_from(&ip, &o.key());
                    }
                }
                Err(e) => warn!(error = %e, "could not update claim"),
            }
        }
    }
}

/// The owners among `candidates` (missing from the Service store) that are really gone.
/// With the watch filtered by type, a Service missing from the store may have left
/// LoadBalancer instead: its cleanup (which honours retention) releases its address, and a
/// sweep finds it if nothing has yet.
async fn confirm_gone<'a>(
    ctx: &Context,
    candidates: Vec<&'a crate::claims::ClaimedBy>,
) -> Vec<&'a crate::claims::ClaimedBy> {
    if !ctx.departures.filtered {
        return candidates;
    }
    let mut gone = Vec::new();
    for owner in candidates {
        let api: Api<Service> = Api::namespaced(ctx.client.clone(), &owner.namespace);
        match api.get_opt(&owner.name).await {
            Ok(Some(svc)) if svc.metadata.uid.as_deref() == Some(owner.uid.as_str()) => {
                ctx.departures.sweep_soon();
            }
            Ok(_) => gone.push(owner),
            Err(e) => warn!(owner = %owner.key(), error = %e, "could not check a claim's owner"),
        }
    }
    gone
}

/// Waits until a store has seen its first full listing. kube-runtime 5's readiness signal
/// keeps a single waker, and the controller's own applier waits on the service store too, so
/// a lone `wait_until_ready().await` can sleep forever; re-polling briefly sidesteps that.
async fn wait_store<K>(store: &reflector::Store<K>) -> Result<(), reflector::store::WriterDropped>
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    loop {
        match tokio::time::timeout(Duration::from_millis(100), store.wait_until_ready()).await {
            Ok(result) => return result,
            Err(_elapsed) => continue,
        }
    }
}

/// Probes every loxilb; one that comes back, or that no longer holds rules we know it had
/// (it restarted between two probes), gets a full replay at once (`Instance::probe`).
async fn health_loop(ctx: Arc<Context>) {
    ctx.wait_ready().await;
    let mut tick = tokio::time::interval(ctx.cfg.health_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let probes = ctx.fleet.probe_all(&ctx.cluster, &ctx.metrics).await;
        for (i, probe) in probes.iter().enumerate() {
            if probe.needs_replay() {
                converge_instance(&ctx, i).await;
            }
        }
        // Programmed conditions name the unreachable instances: re-evaluate them.
        if probes.iter().any(|p| p.changes_status()) {
            ctx.requeue_all_served();
        }
    }
}

/// Periodic drift check of every reachable instance.
async fn drift_loop(ctx: Arc<Context>) {
    ctx.wait_ready().await;
    let mut tick = tokio::time::interval(ctx.cfg.drift_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is immediate; the health loop handles start-up
    loop {
        tick.tick().await;
        for i in 0..ctx.fleet.instances.len() {
            if ctx.fleet.instances[i].is_healthy() {
                wait_quiet(&ctx.fleet.instances[i], ctx.cfg.drift_interval).await;
                converge_instance(&ctx, i).await;
            }
        }
        collect_claims(&ctx).await;
    }
}

/// How long an instance must have seen no write from a Service's own pass before a drift
/// check lists it.
const DRIFT_QUIET: Duration = Duration::from_secs(1);

/// Waits (at most `limit`) until no Service's pass has written to `inst` for [`DRIFT_QUIET`].
/// A drift check exists for changes made behind the controller's back; while the controller
/// is itself busy (a wave of Node changes re-plans every Service) it would only list the
/// instance mid-change and take the queued Services' work into one large pass under the
/// instance lock (at 2,000 rules: ~1,200 changes at once, a few MB of memory).
async fn wait_quiet(inst: &crate::fleet::Instance, limit: Duration) {
    let started = tokio::time::Instant::now();
    while inst.since_service_write().is_some_and(|d| d < DRIFT_QUIET) && started.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The rules of every served Service, from the stores, one Service at a time; Services with
/// a problem keep the rules they have.
fn desired_everywhere(ctx: &Context) -> impl Iterator<Item = ServiceRules> + '_ {
    ctx.services.state().into_iter().filter_map(move |svc| {
        if !ctx.selection.serves(&svc) || svc.metadata.deletion_timestamp.is_some() {
            return None;
        }
        match desired_rules(&svc, ctx) {
            Desired::Rules(plan) => Some(ServiceRules::Want(plan.rules)),
            Desired::Nothing => None,
            Desired::Keep => Some(ServiceRules::Keep(
                svc.metadata.namespace.clone().unwrap_or_default(),
                svc.metadata.name.clone().unwrap_or_default(),
            )),
        }
    })
}

/// Converges one instance to the rules of every served Service, from the stores. Services
/// with a problem keep the rules they have.
async fn converge_instance(ctx: &Context, index: usize) {
    let inst = &ctx.fleet.instances[index];
    match inst
        .converge_all(
            &ctx.cluster,
            ctx.cfg.namespace.as_deref(),
            || desired_everywhere(ctx),
            &ctx.metrics,
        )
        .await
    {
        Ok(report) if report.changes > 0 => {
            info!(
                instance = inst.url(),
                changes = report.changes,
                "drift repaired"
            );
        }
        Ok(_) => {}
        Err(e) => warn!(instance = inst.url(), error = %e, "drift check failed"),
    }
}
