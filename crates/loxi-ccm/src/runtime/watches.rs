//! What each watch (beyond the Service watch that drives the reconcile loop) hands to the
//! subsystem that owns what it changes.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use loxi_domain::intent::ANN_MULTUS_NETS;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::ipam::address_pools::AddressPool;
use crate::ipam::claims::AddressClaim;
use crate::k8s::view::SERVICE_NAME_LABEL;
use crate::service::Context;

/// Re-plans the one Service an EndpointSlice belongs to (named by its
/// `kubernetes.io/service-name` label), and only if this controller serves it.
pub async fn endpoint_slices(
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
            .and_then(|l| l.get(SERVICE_NAME_LABEL))
        else {
            continue;
        };
        let ns = slice.metadata.namespace.clone().unwrap_or_default();
        let svc_ref = ObjectRef::<Service>::new(service).within(&ns);
        if ctx.gate.is_ready()
            && ctx
                .inputs
                .services
                .get(&svc_ref)
                .is_some_and(|s| ctx.selection.serves(&s))
        {
            let _ = ctx.requeue.send(svc_ref);
        }
    }
}

/// Keeps the pod store current; a pod's network-status arrives after its EndpointSlice
/// entry, so served Services with Multus networks are re-planned when pods change.
pub async fn pods(
    ctx: Arc<Context>,
    events: impl futures::Stream<Item = Result<PartialObjectMeta<Pod>, watcher::Error>>,
) {
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        if event.is_err() || !ctx.gate.is_ready() {
            continue;
        }
        for svc in ctx.inputs.services.state() {
            let multus = svc
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(ANN_MULTUS_NETS));
            if multus && ctx.selection.serves(&svc) {
                let _ = ctx.requeue.send(ObjectRef::from_obj(&*svc));
            }
        }
    }
}

/// Claims made or removed elsewhere (another replica, another process, an operator's
/// reservation) reach the address index.
pub async fn claims(
    ctx: Arc<Context>,
    events: impl futures::Stream<Item = Result<watcher::Event<AddressClaim>, watcher::Error>>,
) {
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => ctx.ipam.on_claim_event(&event, ctx.gate.is_ready()),
            Err(e) => warn!(error = %e, "address claim watch error"),
        }
    }
}

/// Keeps the pool set current with the AddressPool resources.
pub async fn pools(
    ctx: Arc<Context>,
    events: impl futures::Stream<Item = Result<watcher::Event<AddressPool>, watcher::Error>>,
) {
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        match event {
            // Before start-up this only prepares the set; start-up computes it again under
            // the index lock before anything is allocated.
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone) => {
                // With BGP on, a pool's `bgpAdvertise` decides its rules' `bgp` flag: plan
                // the served Services again (pool edits are rare).
                if ctx.ipam.refresh_pools() && ctx.settings.advertise {
                    ctx.requeue_all_served();
                }
                // Even without a change of the set (a no-op edit) the pool's
                // observedGeneration moved.
                ctx.ipam.pools().changed.notify_one();
            }
            Ok(_) => {}
            Err(e) => warn!(error = %e, "address pool watch error"),
        }
    }
}

/// Namespace labels decide `namespaceSelector`: a relabelled namespace may now use a pool.
pub async fn namespaces(
    ctx: Arc<Context>,
    events: impl futures::Stream<
        Item = Result<watcher::Event<PartialObjectMeta<Namespace>>, watcher::Error>,
    >,
) {
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) if ctx.gate.is_ready() => {
                ctx.ipam.on_namespace_change();
            }
            Ok(_) => {}
            Err(e) => warn!(error = %e, "namespace watch error"),
        }
    }
}

/// Every served Service planned again after the fleet's changes (`crate::fleet::Fleet::
/// replans`: a loxilb left or changed state, the `LoxiURL` pools changed).
pub async fn replans(ctx: Arc<Context>, mut replans: watch::Receiver<u64>) {
    while replans.changed().await.is_ok() {
        ctx.requeue_all_served();
    }
}

/// Publishes the leader state as a metric, and stops the controller when leadership is lost
/// (`lost` set first).
pub async fn leadership(
    ctx: Arc<Context>,
    stop: Arc<watch::Sender<bool>>,
    lost: watch::Sender<bool>,
) {
    let mut rx = ctx.gate.leader();
    let mut led = false;
    loop {
        let leading = *rx.borrow_and_update();
        ctx.report.metrics.set_leader(leading);
        if leading && !led {
            info!("leading: this replica now writes");
        }
        if led && !leading {
            if *stop.borrow() {
                return; // released on our own shutdown
            }
            warn!("leadership lost: stopping");
            lost.send_replace(true);
            let _ = stop.send(true);
            return;
        }
        led = leading;
        if rx.changed().await.is_err() {
            return;
        }
    }
}
