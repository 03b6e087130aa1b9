//! The controller's background loops: start-up (stores synced, address index rebuilt), the
//! fleet's health tick (the loxilbs' own workers probe and replay: `crate::fleet::workers`),
//! and the drift check with the claim collection.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef};
use tracing::{info, warn};

use super::{Shared, Stop};
use crate::fleet::workers::Replay;
use crate::ipam::claims::ClaimedBy;
use crate::loxilb::bgp::BgpReport;
use crate::loxilb::{Fleet, Instance, ServiceRules};
use crate::service::context::recorded_group;
use crate::service::plan::{Desired, desired};
use loxilb_client::ClientError;

/// Waits for the stores, then (on the leader) rebuilds the address index from the claims and
/// what Services show, before anything is allocated (`docs/architecture.md#invariants`);
/// then starts node initialization, which writes too.
pub async fn start_up(shared: Arc<Shared>, stop: Stop) {
    let ctx = &shared.service;
    if wait_store(&ctx.inputs.services).await.is_err()
        || wait_store(&ctx.inputs.nodes).await.is_err()
    {
        warn!("store writer dropped before sync");
        return;
    }
    shared.synced.store(true, Ordering::Relaxed);
    // Standbys stop here with warm stores; the index is rebuilt by whoever leads, from the
    // cluster as it is at that moment.
    let mut leader = ctx.gate.leader();
    if leader.wait_for(|l| *l).await.is_err() {
        return;
    }
    let pools = ctx.ipam.pools();
    if wait_store(&ctx.inputs.endpoint_slices).await.is_err()
        || wait_store(ctx.ipam.claim_store()).await.is_err()
        || wait_store(&pools.namespaces).await.is_err()
    {
        warn!("a store writer dropped before sync");
        return;
    }
    if let Some(store) = &pools.store
        && wait_store(store).await.is_err()
    {
        warn!("address pool store writer dropped before sync");
        return;
    }
    let services = ctx.inputs.services.state();
    ctx.ipam.rebuild(
        services.iter().map(|s| s.as_ref()).filter(|svc| {
            ctx.selection.serves(svc) || !ctx.selection.our_finalizers(svc).is_empty()
        }),
    );
    ctx.gate.set_ready();
    let node_init = shared.node_init.clone();
    let client = ctx.kube.clone();
    tokio::spawn(async move {
        if let Err(e) = crate::node_init::run(client, node_init, stop.wait()).await {
            warn!(error = %e, "node initialization stopped");
        }
    });
}

/// Waits until a store has seen its first full listing. kube-runtime 5's readiness signal
/// keeps a single waker, and the controller's own applier waits on the service store too, so
/// a lone `wait_until_ready().await` can sleep forever; re-polling briefly sidesteps that.
pub async fn wait_store<K>(
    store: &reflector::Store<K>,
) -> Result<(), reflector::store::WriterDropped>
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

/// The fleet's health tick: a worker for every loxilb (`crate::fleet::workers`: probes,
/// replays, BGP, each loxilb in its own task), the BGP plan handed to them and what their
/// passes found published (`crate::bgp`), the groups' metrics and the fleet record; at every
/// `--health-interval` and at once when a loxilb changed state. Nothing here waits for a
/// loxilb's call.
pub async fn health_loop(shared: Arc<Shared>) {
    let ctx = &shared.service;
    ctx.gate.wait_ready().await;
    let workers = &shared.workers;
    let mut changes = workers.changes();
    let mut tick = tokio::time::interval(shared.health_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            changed = changes.changed() => if changed.is_err() { return },
        }
        let instances = ctx.fleet.instances();
        // The BGP-peer-only loxilbs get BGP settings only (runtime::discovery).
        let peers = match &shared.bgp {
            Some(_) => shared.members.peer_instances(),
            None => Default::default(),
        };
        workers.follow(&instances, &peers);
        publish_groups(&ctx.fleet, &ctx.report.metrics);
        // No plan while a BGP kind whose CRD was just installed is being listed: the workers
        // keep the last one.
        if let Some(bgp) = &shared.bgp
            && let Some(plan) = bgp.plan(shared.members.mesh())
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
        let masters = match &shared.roles {
            Some(roles) => roles.masters().await,
            None => Default::default(),
        };
        shared
            .fleet_status
            .publish(
                &ctx.fleet.groups(),
                &ctx.placement.placed_rules().await,
                &masters,
                &ctx.gate,
            )
            .await;
        // Programmed conditions name the unreachable instances and count the serving ones:
        // re-evaluate them.
        if workers.take_status_changed() {
            ctx.requeue_all_served();
        }
    }
}

/// The replay of one loxilb for its worker: every rule of its group's Services, from the
/// stores. Holds the runtime weakly (the workers are part of it).
pub fn replay(shared: std::sync::Weak<Shared>) -> Replay {
    Arc::new(move |inst: Arc<Instance>| {
        let shared = shared.clone();
        Box::pin(async move {
            match shared.upgrade() {
                Some(shared) => converge_instance(&shared, &inst).await,
                None => false,
            }
        })
    })
}

/// Each group's loxilbs by state and its capacity, as metrics.
fn publish_groups(fleet: &Fleet, metrics: &crate::metrics::Metrics) {
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

/// Periodic drift check of every reachable instance, then the claim collection (after it:
/// rules of deleted Services are gone before their claims go).
pub async fn drift_loop(shared: Arc<Shared>) {
    let ctx = &shared.service;
    ctx.gate.wait_ready().await;
    let mut tick = tokio::time::interval(shared.drift_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is immediate; the health loop handles start-up
    loop {
        tick.tick().await;
        for inst in ctx.fleet.instances().iter() {
            if inst.is_healthy() {
                wait_quiet(inst, shared.drift_interval).await;
                converge_instance(&shared, inst).await;
            }
        }
        collect_claims(&shared).await;
    }
}

/// Takes Services that no longer exist off their claims (`Ipam::collect`). With the watch
/// filtered by type, a Service missing from the store may have left LoadBalancer instead: its
/// cleanup (which honours retention) releases its address, and a sweep finds it if nothing
/// has yet.
async fn collect_claims(shared: &Shared) {
    let ctx = &shared.service;
    let missing = |o: &ClaimedBy| {
        ctx.inputs
            .services
            .get(&ObjectRef::new(&o.name).within(&o.namespace))
            .is_none_or(|s| s.metadata.uid.as_deref() != Some(o.uid.as_str()))
    };
    let confirm_gone = |o: ClaimedBy| async move {
        if !ctx.departures.filtered {
            return true;
        }
        let api: Api<Service> = Api::namespaced(ctx.kube.clone(), &o.namespace);
        match api.get_opt(&o.name).await {
            Ok(Some(svc)) if svc.metadata.uid.as_deref() == Some(o.uid.as_str()) => {
                ctx.departures.sweep_soon();
                false
            }
            Ok(_) => true,
            Err(e) => {
                warn!(owner = %o.key(), error = %e, "could not check a claim's owner");
                false
            }
        }
    };
    ctx.ipam.collect(missing, confirm_gone).await;
}

/// How long an instance must have seen no write from a Service's own pass before a drift
/// check lists it.
const DRIFT_QUIET: Duration = Duration::from_secs(1);

/// Waits (at most `limit`) until no Service's pass has written to `inst` for [`DRIFT_QUIET`].
/// A drift check exists for changes made behind the controller's back; while the controller
/// is itself busy (a wave of Node changes re-plans every Service) it would only list the
/// instance mid-change and take the queued Services' work into one large pass under the
/// instance lock (at 2,000 rules: ~1,200 changes at once, a few MB of memory).
async fn wait_quiet(inst: &Instance, limit: Duration) {
    let started = tokio::time::Instant::now();
    while inst.since_service_write().is_some_and(|d| d < DRIFT_QUIET) && started.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The rules of every served Service placed on `group`, from the stores, one Service at a
/// time; Services with a problem keep the rules they have. A Service of another group has
/// no rule here (an owned rule of it found here is removed: it was moved by hand).
fn desired_in<'a>(shared: &'a Shared, group: &'a str) -> impl Iterator<Item = ServiceRules> + 'a {
    let ctx = &shared.service;
    ctx.inputs
        .services
        .state()
        .into_iter()
        .filter_map(move |svc| {
            if !ctx.selection.serves(&svc) || svc.metadata.deletion_timestamp.is_some() {
                return None;
            }
            let keep = || {
                ServiceRules::Keep(
                    svc.metadata.namespace.clone().unwrap_or_default(),
                    svc.metadata.name.clone().unwrap_or_default(),
                )
            };
            match recorded_group(&svc) {
                Some(recorded) if recorded != group => return None,
                // Not placed yet, outside the default group: whatever it has here stays
                // until its reconcile records where it is.
                None if group != ctx.settings.zone => return Some(keep()),
                _ => {}
            }
            match desired(&svc, ctx) {
                Desired::Rules(plan) => Some(ServiceRules::Want(plan.rules)),
                Desired::Nothing => None,
                Desired::Keep => Some(ServiceRules::Keep(
                    svc.metadata.namespace.clone().unwrap_or_default(),
                    svc.metadata.name.clone().unwrap_or_default(),
                )),
            }
        })
}

/// Converges one instance to the rules of every served Service of its group, from the
/// stores; true when it now holds every rule it should (nothing failed, nothing held back).
async fn converge_instance(shared: &Shared, inst: &Instance) -> bool {
    let ctx = &shared.service;
    match inst
        .converge_all(
            &ctx.cluster,
            ctx.settings.namespace.as_deref(),
            || desired_in(shared, inst.group()),
            &ctx.report.metrics,
        )
        .await
    {
        Ok(report) => {
            if report.changes > 0 {
                info!(
                    instance = inst.url(),
                    changes = report.changes,
                    "drift repaired"
                );
            }
            report.failed.is_empty()
        }
        Err(e) => {
            warn!(instance = inst.url(), error = %e, "drift check failed");
            false
        }
    }
}
